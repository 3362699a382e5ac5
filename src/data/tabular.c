/* fastai's tabular processing, once: Categorify, FillMissing and Normalize fitted on a training
 * set (cf_tabular_fit), the state they learn (cf_tabular_state), and the one encoder of table
 * rows (cf_tabular_apply) that training sets, validation sets and an exported model's inputs
 * all go through, so that training and inference cannot encode a row differently. */
#include "data_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Vocabularies travel in a saved model's header, which readers accept up to 100 MiB of JSON
 * (escaped twice, as a JSON string holding JSON: up to 7 bytes a byte). A category longer than
 * CF_TAB_MAX_CATEGORY bytes, or vocabularies of more than CF_TAB_MAX_VOCAB_BYTES in all, are
 * refused before training, so that every model trained can be saved and read back. */
#define CF_TAB_MAX_CATEGORY 4096
#define CF_TAB_MAX_VOCAB_BYTES ((int64_t)8 << 20)

/* ---- cells --------------------------------------------------------------------------------- */

/* A cell without its leading and trailing blanks (spaces and tabs): s[0..n). */
typedef struct cell_view {
    const char *s;
    size_t n;
} cell_view;

static cell_view trimmed(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    return (cell_view){s, n};
}

/* pandas' default missing-value strings. */
static bool is_missing_view(cell_view v) {
    static const char *const na[] = {"",         "#N/A", "#N/A N/A", "#NA",    "-1.#IND",
                                     "-1.#QNAN", "-NaN", "-nan",     "1.#IND", "1.#QNAN",
                                     "<NA>",     "N/A",  "NA",       "NULL",   "NaN",
                                     "None",     "n/a",  "nan",      "null"};
    for (size_t i = 0; i < sizeof na / sizeof *na; i++)
        if (strlen(na[i]) == v.n && memcmp(v.s, na[i], v.n) == 0) return true;
    return false;
}

bool cf_csv_is_missing(const char *s) {
    return is_missing_view((cell_view){s, strlen(s)});
}

/* A finite number filling the whole (trimmed) view. Only blanks follow the view in the cell, so
 * strtod stops at its end or before. */
static bool view_number(cell_view v, double *out) {
    if (v.n == 0) return false;
    char *end;
    double d = strtod(v.s, &end);
    if (end != v.s + v.n || !isfinite(d)) return false;
    *out = d;
    return true;
}

/* ---- vocabularies -------------------------------------------------------------------------- */

/* One category: its name, its value when the vocabulary is numeric, its code. */
typedef struct catkey {
    const char *s;
    double v;
    int64_t code;
} catkey;

/* Categorify's order: by value when every category is a number, then by name. */
static int cmp_numeric_key(const void *pa, const void *pb) {
    const catkey *a = pa, *b = pb;
    if (a->v != b->v) return a->v < b->v ? -1 : 1;
    return strcmp(a->s, b->s);
}

static int cmp_name_key(const void *pa, const void *pb) {
    return strcmp(((const catkey *)pa)->s, ((const catkey *)pb)->s);
}

/* Sorted categories, for lookups and for building a vocabulary. */
typedef struct vocab {
    catkey *keys;
    int64_t n;
    bool numeric;
} vocab;

static int (*vocab_cmp(const vocab *v))(const void *, const void *) {
    return v->numeric ? cmp_numeric_key : cmp_name_key;
}

/* Sorts keys[0..n) (v set where numeric), drops repeats, and keeps them in out (taking keys). */
static void vocab_sort(catkey *keys, int64_t n, bool numeric, vocab *out) {
    out->keys = keys;
    out->numeric = numeric;
    qsort(keys, (size_t)n, sizeof *keys, vocab_cmp(out));
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (u == 0 || vocab_cmp(out)(&keys[u - 1], &keys[i]) != 0) keys[u++] = keys[i];
    out->n = u;
}

/* The vocabulary of the non-missing values of column c over rows[0..n). */
static cf_status vocab_of_column(const cf_csv_table *t, int c, const int64_t *rows, int64_t n,
                                 vocab *out) {
    memset(out, 0, sizeof *out);
    catkey *k = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof *k);
    if (!k) return CF_ERR_NOMEM;
    int64_t m = 0;
    bool numeric = true;
    for (int64_t i = 0; i < n; i++) {
        const char *raw = t->cells[rows[i] * t->n_cols + c];
        if (cf_csv_is_missing(raw)) continue;
        double v = 0;
        if (!view_number(trimmed(raw), &v)) numeric = false;
        k[m++] = (catkey){.s = raw, .v = v};
    }
    vocab_sort(k, m, numeric, out);
    for (int64_t i = 0; i < out->n; i++) out->keys[i].code = i;
    return CF_OK;
}

/* A lookup table over names[0..n), names[i] taking code first_code + i. */
static cf_status vocab_of_names(char *const *names, int64_t n, int64_t first_code, vocab *out) {
    memset(out, 0, sizeof *out);
    catkey *k = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof *k);
    if (!k) return CF_ERR_NOMEM;
    bool numeric = true;
    for (int64_t i = 0; i < n; i++) {
        k[i] = (catkey){.s = names[i], .v = 0, .code = first_code + i};
        if (!view_number(trimmed(names[i]), &k[i].v)) numeric = false;
    }
    vocab_sort(k, n, numeric, out);
    return CF_OK;
}

/* The code of s, or -1 when the vocabulary does not hold it (a numeric vocabulary holds only
 * numbers). */
static int64_t vocab_find(const vocab *voc, const char *s) {
    catkey key = {.s = s};
    if (voc->numeric && !view_number(trimmed(s), &key.v)) return -1;
    const catkey *hit = bsearch(&key, voc->keys, (size_t)voc->n, sizeof key, vocab_cmp(voc));
    return hit ? hit->code : -1;
}

/* ---- the state ----------------------------------------------------------------------------- */

void cf_tabular_state_free(cf_tabular_state *s) {
    if (!s) return;
    if (s->cat_vocab)
        for (int i = 0; i < s->n_cat; i++)
            cf__strv_free(s->cat_vocab[i], s->cat_cardinality ? s->cat_cardinality[i] : 0);
    cf_free(s->cat_vocab);
    cf_free(s->cat_cardinality);
    if (s->flag_of)
        for (int i = 0; i < s->n_cat; i++) cf_free(s->flag_of[i]);
    cf_free(s->flag_of);
    cf__strv_free(s->feature_names, s->n_cat + s->n_cont);
    cf_free(s->cont_mean);
    cf_free(s->cont_std);
    cf_free(s->cont_fill);
    cf_free(s->y_name);
    cf__strv_free(s->y_vocab, s->n_classes);
    memset(s, 0, sizeof *s);
}

cf_status cf_tabular_state_alloc(cf_tabular_state *s, int n_cat, int n_cont) {
    memset(s, 0, sizeof *s);
    if (n_cat < 0 || n_cont < 0 || n_cat > (1 << 20) || n_cont > (1 << 20))
        return cf_fail(CF_ERR_INVALID, "tabular state of %d categorical and %d continuous columns",
                       n_cat, n_cont);
    s->n_cat = n_cat;
    s->n_cont = n_cont;
    s->feature_names = cf_calloc((size_t)(n_cat + n_cont + 1), sizeof(char *));
    s->cat_vocab = cf_calloc((size_t)(n_cat + 1), sizeof(char **));
    s->cat_cardinality = cf_calloc((size_t)(n_cat + 1), sizeof(int));
    s->flag_of = cf_calloc((size_t)(n_cat + 1), sizeof(char *));
    s->cont_mean = cf_calloc((size_t)(n_cont + 1), sizeof(double));
    s->cont_std = cf_calloc((size_t)(n_cont + 1), sizeof(double));
    s->cont_fill = cf_calloc((size_t)(n_cont + 1), sizeof(double));
    if (!s->feature_names || !s->cat_vocab || !s->cat_cardinality || !s->flag_of || !s->cont_mean ||
        !s->cont_std || !s->cont_fill) {
        cf_tabular_state_free(s);
        return cf_fail(CF_ERR_NOMEM, "out of memory for a tabular state");
    }
    return CF_OK;
}

static float *floats_of(const double *v, int n) {
    float *out = cf_calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    for (int i = 0; out && i < n; i++) out[i] = (float)v[i];
    return out;
}

cf_status cf_tabular_state_save(const cf_tabular_state *s, cf_dataset *ds) {
    int nf = s->n_cat + s->n_cont;
    ds->n_cat = s->n_cat;
    ds->n_cont = s->n_cont;
    ds->cat_cardinality = cf_calloc((size_t)(s->n_cat + 1), sizeof(int));
    ds->cat_vocab = cf_calloc((size_t)(s->n_cat + 1), sizeof(char **));
    ds->feature_names = cf__strv_dup((const char *const *)s->feature_names, nf);
    ds->cont_mean = floats_of(s->cont_mean, s->n_cont);
    ds->cont_std = floats_of(s->cont_std, s->n_cont);
    ds->cont_fill = floats_of(s->cont_fill, s->n_cont);
    ds->y_name = cf_strdup(s->y_name ? s->y_name : "");
    bool ok = ds->cat_cardinality && ds->cat_vocab && ds->feature_names && ds->cont_mean &&
              ds->cont_std && ds->cont_fill && ds->y_name;
    for (int i = 0; ok && i < s->n_cat; i++) {
        ds->cat_cardinality[i] = s->cat_cardinality[i];
        ok = (ds->cat_vocab[i] = cf__strv_dup((const char *const *)s->cat_vocab[i],
                                              s->cat_cardinality[i])) != NULL;
    }
    if (ok && !s->regression) {
        ds->n_classes = s->n_classes;
        ok = (ds->vocab = cf__strv_dup((const char *const *)s->y_vocab, s->n_classes)) != NULL;
    }
    return ok ? CF_OK : cf_fail(CF_ERR_NOMEM, "out of memory saving a tabular state");
}

cf_status cf_tabular_state_load(const cf_dataset *ds, cf_tabular_state *s) {
    if (!ds || ds->sample_shape.ndim != 1 || !ds->feature_names || !ds->cat_cardinality ||
        (ds->n_cat && !ds->cat_vocab) ||
        (ds->n_cont && (!ds->cont_mean || !ds->cont_std || !ds->cont_fill)))
        return cf_fail(CF_ERR_INVALID, "%s: not a tabular data set (no processing state)",
                       ds && ds->source ? ds->source : "data set");
    cf_status st = cf_tabular_state_alloc(s, ds->n_cat, ds->n_cont);
    if (st) return st;
    bool ok = (s->y_name = cf_strdup(ds->y_name ? ds->y_name : "")) != NULL;
    for (int i = 0; ok && i < s->n_cat + s->n_cont; i++)
        ok = (s->feature_names[i] = cf_strdup(ds->feature_names[i] ? ds->feature_names[i] : ""));
    for (int i = 0; ok && i < s->n_cat; i++) {
        s->cat_cardinality[i] = ds->cat_cardinality[i];
        ok = (s->cat_vocab[i] =
                  cf__strv_dup((const char *const *)ds->cat_vocab[i], ds->cat_cardinality[i]));
        /* FillMissing's flags are named "<cont>_na" after a continuous column */
        const char *nm = s->feature_names[i];
        size_t len = ok ? strlen(nm) : 0;
        for (int j = 0; ok && j < s->n_cont && len > 3 && !strcmp(nm + len - 3, "_na"); j++) {
            const char *cn = s->feature_names[s->n_cat + j];
            if (strlen(cn) == len - 3 && !strncmp(cn, nm, len - 3))
                ok = (s->flag_of[i] = cf_strdup(cn)) != NULL;
        }
    }
    for (int j = 0; j < s->n_cont; j++) {
        s->cont_mean[j] = ds->cont_mean[j];
        s->cont_std[j] = ds->cont_std[j];
        s->cont_fill[j] = ds->cont_fill[j];
    }
    s->regression = ds->n_classes == 0;
    if (ok && !s->regression) {
        s->n_classes = ds->n_classes;
        if (ds->vocab) {
            ok = (s->y_vocab = cf__strv_dup((const char *const *)ds->vocab, ds->n_classes));
        } else { /* classes without names: "0", "1", ... */
            ok = (s->y_vocab = cf_calloc((size_t)ds->n_classes, sizeof(char *))) != NULL;
            for (int i = 0; ok && i < ds->n_classes; i++) {
                char b[16];
                snprintf(b, sizeof b, "%d", i);
                ok = (s->y_vocab[i] = cf_strdup(b)) != NULL;
            }
        }
    }
    if (!ok) {
        cf_tabular_state_free(s);
        return cf_fail(CF_ERR_NOMEM, "out of memory reading a tabular state");
    }
    return CF_OK;
}

/* ---- fit ----------------------------------------------------------------------------------- */

static int cmp_double(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* Copies the vocabulary's names into names[0..voc->n). */
static bool vocab_names(const vocab *voc, char **names) {
    for (int64_t i = 0; i < voc->n; i++)
        if (!(names[i] = cf_strdup(voc->keys[i].s))) return false;
    return true;
}

/* Refuses categories a saved model could not carry; names the first training row of one. */
static cf_status check_vocab_sizes(const cf_csv_table *t, const char *src, const vocab *voc,
                                   int n_voc, const int *cols, const int64_t *rows, int64_t n) {
    int64_t bytes = 0;
    for (int j = 0; j < n_voc; j++) {
        for (int64_t i = 0; i < voc[j].n; i++) {
            size_t len = strlen(voc[j].keys[i].s);
            bytes += (int64_t)len + 1;
            if (len <= CF_TAB_MAX_CATEGORY) continue;
            int64_t line = 0;
            for (int64_t r = 0; r < n && !line; r++)
                if (t->cells[rows[r] * t->n_cols + cols[j]] == voc[j].keys[i].s)
                    line = t->row_line[rows[r]];
            return cf_fail(CF_ERR_FORMAT,
                           "%s: line %lld, column '%s': a category of %zu bytes (at most %d: a "
                           "saved model carries its categories)",
                           src, (long long)line, t->header[cols[j]], len, CF_TAB_MAX_CATEGORY);
        }
    }
    if (bytes > CF_TAB_MAX_VOCAB_BYTES)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: the categorical vocabularies hold %lld bytes in all (at most %lld: a "
                       "saved model carries them)",
                       src, (long long)bytes, (long long)CF_TAB_MAX_VOCAB_BYTES);
    return CF_OK;
}

/* Checks every continuous cell of the table, then fills in the training statistics of
 * continuous column j (column c): FillMissing's median and flag, Normalize's mean and std (ddof
 * 0 over the filled values, + 1e-7). */
static cf_status fit_continuous(const cf_csv_table *t, const char *src, int c, const int64_t *rows,
                                int64_t n, double *vals, double *median, double *mean, double *stdv,
                                bool *has_na) {
    for (int64_t r = 0; r < t->n_rows; r++) {
        cell_view v = trimmed(t->cells[r * t->n_cols + c]);
        double d;
        if (!is_missing_view(v) && !view_number(v, &d))
            return cf_fail(CF_ERR_FORMAT,
                           "%s: line %lld, continuous column '%s': '%.*s' is not a number", src,
                           (long long)t->row_line[r], t->header[c], (int)v.n, v.s);
    }
    int64_t m = 0;
    *has_na = false;
    for (int64_t i = 0; i < n; i++) {
        cell_view v = trimmed(t->cells[rows[i] * t->n_cols + c]);
        if (is_missing_view(v))
            *has_na = true;
        else
            view_number(v, &vals[m++]);
    }
    if (m == 0)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: continuous column '%s' has no values in the training set", src,
                       t->header[c]);
    qsort(vals, (size_t)m, sizeof *vals, cmp_double);
    *median = m % 2 ? vals[m / 2] : 0.5 * (vals[m / 2 - 1] + vals[m / 2]);
    double sum = 0;
    for (int64_t i = 0; i < m; i++) sum += vals[i];
    sum += (double)(n - m) * *median;
    *mean = sum / (double)n;
    double ss = 0;
    for (int64_t i = 0; i < m; i++) ss += (vals[i] - *mean) * (vals[i] - *mean);
    ss += (double)(n - m) * (*median - *mean) * (*median - *mean);
    *stdv = sqrt(ss / (double)n) + 1e-7;
    return CF_OK;
}

cf_status cf_tabular_fit(const cf_csv_table *t, const cf_tabular_options *opt, const int64_t *rows,
                         int64_t n, cf_tabular_state *out) {
    if (!t || !opt || !out || (n > 0 && !rows))
        return cf_fail(CF_ERR_INVALID, "cf_tabular_fit: NULL argument");
    memset(out, 0, sizeof *out);
    const char *src = t->source ? t->source : "CSV";
    if (opt->n_cat < 0 || opt->n_cont < 0 || (opt->n_cat && !opt->cat_names) ||
        (opt->n_cont && !opt->cont_names) || !opt->y_name)
        return cf_fail(CF_ERR_INVALID, "%s: tabular options need column names and a target", src);
    if (opt->n_cat + opt->n_cont == 0)
        return cf_fail(CF_ERR_INVALID, "%s: no categorical or continuous columns given", src);
    int ncat = opt->n_cat, ncont = opt->n_cont;
    cf_status st = CF_OK;
    /* the target's column follows the categorical ones in cat_col (for messages) */
    int *cat_col = cf_malloc((size_t)(ncat + 1) * sizeof(int));
    int *cont_col = cf_malloc((size_t)(ncont + 1) * sizeof(int));
    vocab *cvoc = cf_calloc((size_t)(ncat + 1), sizeof(vocab));
    double *median = cf_calloc((size_t)(ncont + 1), sizeof(double));
    double *mean = cf_calloc((size_t)(ncont + 1), sizeof(double));
    double *stdv = cf_calloc((size_t)(ncont + 1), sizeof(double));
    bool *has_na = cf_calloc((size_t)(ncont + 1), sizeof(bool));
    double *vals = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!cat_col || !cont_col || !cvoc || !median || !mean || !stdv || !has_na || !vals) {
        st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
        goto done;
    }
    for (int i = 0; i < ncat + ncont + 1; i++) {
        const char *nm = i < ncat           ? opt->cat_names[i]
                         : i < ncat + ncont ? opt->cont_names[i - ncat]
                                            : opt->y_name;
        int c = nm ? cf_csv_column(t, nm) : -1;
        if (c < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header (%d columns, first '%s')",
                         src, nm ? nm : "(null)", t->n_cols, t->header[0]);
            goto done;
        }
        if (i < ncat)
            cat_col[i] = c;
        else if (i < ncat + ncont)
            cont_col[i - ncat] = c;
        else
            cat_col[ncat] = c;
    }
    if (n == 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no rows in the training set (%lld rows in all)", src,
                     (long long)t->n_rows);
        goto done;
    }
    for (int j = 0; j < ncont; j++)
        if ((st = fit_continuous(t, src, cont_col[j], rows, n, vals, &median[j], &mean[j], &stdv[j],
                                 &has_na[j])))
            goto done;
    for (int j = 0; j <= ncat; j++) {
        if (j == ncat && opt->y_regression) break;
        if ((st = vocab_of_column(t, cat_col[j], rows, n, &cvoc[j]))) goto done;
    }
    if (!opt->y_regression && cvoc[ncat].n > (1 << 24)) {
        st = cf_fail(CF_ERR_FORMAT, "%s: target '%s' has %lld classes", src, opt->y_name,
                     (long long)cvoc[ncat].n);
        goto done;
    }
    if ((st = check_vocab_sizes(t, src, cvoc, ncat + !opt->y_regression, cat_col, rows, n)))
        goto done;
    for (int j = 0; j < ncat; j++)
        if (cvoc[j].n + 1 > (1 << 24)) {
            st = cf_fail(CF_ERR_FORMAT, "%s: column '%s' has %lld categories", src,
                         t->header[cat_col[j]], (long long)cvoc[j].n);
            goto done;
        }
    int n_flags = 0;
    for (int j = 0; j < ncont; j++) n_flags += has_na[j];
    int n_cat_all = ncat + n_flags;
    if ((st = cf_tabular_state_alloc(out, n_cat_all, ncont))) goto done;
    bool ok = (out->y_name = cf_strdup(opt->y_name)) != NULL;
    out->regression = opt->y_regression;
    /* Categorify: "#na#" at code 0, then the sorted training values */
    for (int j = 0; ok && j < ncat; j++) {
        out->cat_cardinality[j] = (int)cvoc[j].n + 1;
        ok = (out->cat_vocab[j] = cf_calloc((size_t)cvoc[j].n + 1, sizeof(char *))) &&
             (out->cat_vocab[j][0] = cf_strdup("#na#")) &&
             vocab_names(&cvoc[j], out->cat_vocab[j] + 1) &&
             (out->feature_names[j] = cf_strdup(t->header[cat_col[j]]));
    }
    /* FillMissing's flags after the caller's categorical columns, Normalize's statistics */
    for (int j = 0, k = ncat; ok && j < ncont; j++) {
        const char *name = t->header[cont_col[j]];
        out->cont_mean[j] = mean[j];
        out->cont_std[j] = stdv[j];
        out->cont_fill[j] = median[j];
        ok = (out->feature_names[n_cat_all + j] = cf_strdup(name)) != NULL;
        if (!ok || !has_na[j]) continue;
        char flag[512];
        snprintf(flag, sizeof flag, "%s_na", name);
        out->cat_cardinality[k] = 3;
        ok = (out->cat_vocab[k] = cf_calloc(3, sizeof(char *))) &&
             (out->cat_vocab[k][0] = cf_strdup("#na#")) &&
             (out->cat_vocab[k][1] = cf_strdup("False")) &&
             (out->cat_vocab[k][2] = cf_strdup("True")) &&
             (out->feature_names[k] = cf_strdup(flag)) && (out->flag_of[k] = cf_strdup(name));
        k++;
    }
    if (ok && !opt->y_regression) {
        out->n_classes = (int)cvoc[ncat].n;
        ok = (out->y_vocab = cf_calloc((size_t)cvoc[ncat].n + 1, sizeof(char *))) &&
             vocab_names(&cvoc[ncat], out->y_vocab);
    }
    if (!ok) st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
done:
    if (st) cf_tabular_state_free(out);
    if (cvoc)
        for (int j = 0; j <= ncat; j++) cf_free(cvoc[j].keys);
    cf_free(cvoc);
    cf_free(cat_col);
    cf_free(cont_col);
    cf_free(median);
    cf_free(mean);
    cf_free(stdv);
    cf_free(has_na);
    cf_free(vals);
    return st;
}

/* ---- apply --------------------------------------------------------------------------------- */

cf_status cf_tabular_apply(const cf_tabular_state *s, const cf_csv_table *t, const int64_t *rows,
                           int64_t n, bool need_target, float *x, float *y, int64_t *n_unseen) {
    if (!s || !t || !x || (need_target && !y))
        return cf_fail(CF_ERR_INVALID, "cf_tabular_apply: NULL argument");
    if (n_unseen) *n_unseen = 0;
    const char *src = t->source ? t->source : "CSV";
    int nf = s->n_cat + s->n_cont;
    int *col = cf_calloc((size_t)nf + 1, sizeof(int));
    vocab *voc = cf_calloc((size_t)s->n_cat + 1, sizeof(vocab)); /* [n_cat]: the target's */
    cf_status st = CF_OK;
    int64_t unseen = 0;
    if (!col || !voc) {
        st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
        goto done;
    }
    for (int i = 0; i < nf; i++) {
        const char *name = i < s->n_cat && s->flag_of[i] ? s->flag_of[i] : s->feature_names[i];
        if ((col[i] = cf_csv_column(t, name)) < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header (the model needs it)",
                         src, name);
            goto done;
        }
    }
    int ycol = s->y_name ? cf_csv_column(t, s->y_name) : -1;
    if (need_target && ycol < 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no target column '%s' in the header", src,
                     s->y_name ? s->y_name : "");
        goto done;
    }
    for (int i = 0; i < s->n_cat; i++)
        if (s->cat_cardinality[i] < 1 ||
            (st = vocab_of_names(s->cat_vocab[i] + 1, s->cat_cardinality[i] - 1, 1, &voc[i]))) {
            if (!st) st = cf_fail(CF_ERR_INVALID, "%s: column %d has no vocabulary", src, i);
            goto done;
        }
    if (need_target && !s->regression &&
        (st = vocab_of_names(s->y_vocab, s->n_classes, 0, &voc[s->n_cat])))
        goto done;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows ? rows[i] : i;
        char *const *cell = t->cells + r * t->n_cols;
        float *row = x + (size_t)i * (size_t)nf;
        for (int j = 0; j < s->n_cat; j++) {
            const char *v = cell[col[j]];
            if (s->flag_of[j]) { /* FillMissing's flag: False (1) or True (2) */
                int64_t code = vocab_find(&voc[j], is_missing_view(trimmed(v)) ? "True" : "False");
                row[j] = (float)(code < 0 ? 0 : code);
                continue;
            }
            bool missing = cf_csv_is_missing(v);
            int64_t code = missing ? -1 : vocab_find(&voc[j], v);
            row[j] = (float)(code < 0 ? 0 : code); /* missing or unseen: 0 (#na#) */
            unseen += !missing && code < 0;
        }
        for (int j = 0; j < s->n_cont; j++) {
            cell_view v = trimmed(cell[col[s->n_cat + j]]);
            double d;
            if (is_missing_view(v)) {
                d = s->cont_fill[j];
            } else if (!view_number(v, &d)) {
                st = cf_fail(
                    CF_ERR_FORMAT, "%s: line %lld, continuous column '%s': '%.*s' is not a number",
                    src, (long long)t->row_line[r], s->feature_names[s->n_cat + j], (int)v.n, v.s);
                goto done;
            }
            row[s->n_cat + j] = (float)((d - s->cont_mean[j]) / s->cont_std[j]);
        }
        if (!need_target) continue;
        const char *ys = cell[ycol];
        if (cf_csv_is_missing(ys)) {
            st = cf_fail(CF_ERR_FORMAT, "%s: line %lld: the target '%s' is missing", src,
                         (long long)t->row_line[r], s->y_name);
            goto done;
        }
        if (s->regression) {
            double d;
            if (!view_number(trimmed(ys), &d)) {
                st = cf_fail(CF_ERR_FORMAT, "%s: line %lld, target '%s': '%s' is not a number", src,
                             (long long)t->row_line[r], s->y_name, ys);
                goto done;
            }
            y[i] = (float)d;
        } else {
            int64_t code = vocab_find(&voc[s->n_cat], ys);
            if (code < 0) {
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: line %lld, target '%s': class '%s' does not appear in the "
                             "training set",
                             src, (long long)t->row_line[r], s->y_name, ys);
                goto done;
            }
            y[i] = (float)code;
        }
    }
    if (n_unseen) *n_unseen = unseen;
done:
    if (voc)
        for (int i = 0; i <= s->n_cat; i++) cf_free(voc[i].keys);
    cf_free(voc);
    cf_free(col);
    return st;
}

cf_status cf_tabular_dataset(const cf_tabular_state *s, const cf_csv_table *t, const int64_t *rows,
                             int64_t n, bool need_target, cf_dataset **out) {
    if (!out || !s || !t) return cf_fail(CF_ERR_INVALID, "cf_tabular_dataset: NULL argument");
    *out = NULL;
    const char *src = t->source ? t->source : "CSV";
    cf_dataset *ds = cf__dataset_alloc(n, cf_shape1(s->n_cat + s->n_cont), 1);
    if (!ds) return cf_fail_context(CF_ERR_NOMEM, "%s", src);
    cf_status st = cf_tabular_state_save(s, ds);
    if (st == CF_OK && !cf__dataset_set_source(ds, src))
        st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
    if (st == CF_OK) st = cf_tabular_apply(s, t, rows, n, need_target, ds->x, ds->y, &ds->n_unseen);
    if (st) {
        cf_dataset_free(ds);
        return st;
    }
    *out = ds;
    return CF_OK;
}

/* ---- TabularPandas ------------------------------------------------------------------------- */

/* The training and validation rows: valid_idx, else RandomSplitter(valid_pct, seed). */
static cf_status split_rows(const cf_csv_table *t, const cf_tabular_options *opt, const char *src,
                            int64_t **tr, int64_t *ntr, int64_t **va, int64_t *nva) {
    int64_t n = t->n_rows;
    if (!opt->valid_idx) return cf_random_split(n, opt->valid_pct, opt->seed, tr, ntr, va, nva);
    bool *in_valid = cf_calloc((size_t)(n > 0 ? n : 1), sizeof(bool));
    if (!in_valid) return CF_ERR_NOMEM;
    for (int64_t i = 0; i < opt->n_valid_idx; i++) {
        int64_t v = opt->valid_idx[i];
        if (v < 0 || v >= n || in_valid[v]) {
            cf_free(in_valid);
            return cf_fail(CF_ERR_INVALID,
                           "%s: valid_idx[%lld] = %lld is out of range [0, %lld) or repeated", src,
                           (long long)i, (long long)v, (long long)n);
        }
        in_valid[v] = true;
    }
    *nva = opt->n_valid_idx;
    *ntr = n - *nva;
    *tr = cf_malloc((size_t)(*ntr > 0 ? *ntr : 1) * sizeof(int64_t));
    *va = cf_malloc((size_t)(*nva > 0 ? *nva : 1) * sizeof(int64_t));
    if (!*tr || !*va) {
        cf_free(in_valid);
        return CF_ERR_NOMEM;
    }
    memcpy(*va, opt->valid_idx, (size_t)*nva * sizeof(int64_t));
    for (int64_t i = 0, k = 0; i < n; i++)
        if (!in_valid[i]) (*tr)[k++] = i;
    cf_free(in_valid);
    return CF_OK;
}

cf_status cf_tabular_from_table(const cf_csv_table *t, const cf_tabular_options *opt,
                                cf_dataset **train, cf_dataset **valid) {
    if (!train || !valid || !t || !opt)
        return cf_fail(CF_ERR_INVALID, "cf_tabular_from_table: NULL argument");
    *train = *valid = NULL;
    const char *src = t->source ? t->source : "CSV";
    int64_t *tr = NULL, *va = NULL, ntr = 0, nva = 0;
    cf_tabular_state state = {0};
    cf_status st = split_rows(t, opt, src, &tr, &ntr, &va, &nva);
    if (st == CF_OK) st = cf_tabular_fit(t, opt, tr, ntr, &state);
    if (st == CF_OK) st = cf_tabular_dataset(&state, t, tr, ntr, true, train);
    if (st == CF_OK) st = cf_tabular_dataset(&state, t, va, nva, true, valid);
    if (st) {
        cf_dataset_free(*train);
        *train = NULL;
    }
    cf_tabular_state_free(&state);
    cf_free(tr);
    cf_free(va);
    return st;
}

cf_status cf_tabular_from_csv_buffer(const char *text, size_t size, const char *name,
                                     const cf_tabular_options *opt, cf_dataset **train,
                                     cf_dataset **valid) {
    if (train) *train = NULL;
    if (valid) *valid = NULL;
    cf_csv_table *t;
    cf_status st = cf_csv_parse_buffer(text, size, name, opt ? opt->delimiter : ',', &t);
    if (st) return st;
    st = cf_tabular_from_table(t, opt, train, valid);
    cf_csv_table_free(t);
    return st;
}

cf_status cf_tabular_from_csv(const char *path, const cf_tabular_options *opt, cf_dataset **train,
                              cf_dataset **valid) {
    if (train) *train = NULL;
    if (valid) *valid = NULL;
    cf_csv_table *t;
    cf_status st = cf_csv_read(path, opt ? opt->delimiter : ',', &t);
    if (st) return st;
    st = cf_tabular_from_table(t, opt, train, valid);
    cf_csv_table_free(t);
    return st;
}
