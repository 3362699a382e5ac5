/* CSV tables (RFC 4180 quoting) and fastai's tabular processing: Categorify, FillMissing,
 * Normalize. */
#include "data_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CF_CSV_MAX_BYTES ((int64_t)1 << 34)
/* Vocabularies travel in a saved model's header, which readers accept up to 100 MiB of JSON
 * (escaped twice, as a JSON string holding JSON: up to 7 bytes a byte). A category longer than
 * CF_TAB_MAX_CATEGORY bytes, or vocabularies of more than CF_TAB_MAX_VOCAB_BYTES in all, are
 * refused before training, so that every model trained can be saved and read back. */
#define CF_TAB_MAX_CATEGORY 4096
#define CF_TAB_MAX_VOCAB_BYTES ((int64_t)8 << 20)

void cf_csv_table_free(cf_csv_table *t) {
    if (!t) return;
    cf_free(t->header);
    cf_free(t->cells);
    cf_free(t->row_line);
    cf_free(t->source);
    cf_free(t->text);
    cf_free(t);
}

typedef struct ptrvec {
    char **v;
    int64_t n, cap;
} ptrvec;

static bool ptrvec_push(ptrvec *p, char *s) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 256;
        char **v = cf_malloc((size_t)cap * sizeof *v);
        if (!v) return false;
        if (p->n) memcpy(v, p->v, (size_t)p->n * sizeof *v);
        cf_free(p->v);
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = s;
    return true;
}

cf_status cf_csv_parse_buffer(const char *text, size_t size, const char *name, char delimiter,
                              cf_csv_table **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_csv_parse_buffer: out is NULL");
    *out = NULL;
    if (!name) name = "CSV";
    if (!delimiter) delimiter = ',';
    if (!text && size) return cf_fail(CF_ERR_INVALID, "%s: NULL text", name);
    if (delimiter == '"' || delimiter == '\n' || delimiter == '\r')
        return cf_fail(CF_ERR_INVALID, "%s: delimiter 0x%02x is not allowed", name,
                       (unsigned char)delimiter);
    cf_csv_table *t = cf_calloc(1, sizeof *t);
    if (!t) return CF_ERR_NOMEM;
    t->text = cf_malloc(size + 1);
    t->source = cf_strdup(name);
    ptrvec cells = {0};
    int64_t *lines = NULL, lines_cap = 0, n_rows = 0;
    cf_status st = CF_OK;
    if (!t->text || !t->source) {
        st = CF_ERR_NOMEM;
        goto fail;
    }
    if (size) memcpy(t->text, text, size);
    t->text[size] = '\0';
    char *buf = t->text;
    size_t r = 0, w = 0;
    const char *nul = size ? memchr(t->text, '\0', size) : NULL;
    if (nul) {
        /* A field would silently end there: binary data, or a text in UTF-16. */
        size_t at = (size_t)(nul - t->text);
        int64_t nul_line = 1;
        for (size_t i = 0; i < at; i++) nul_line += t->text[i] == '\n';
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: line %lld, byte offset %zu: a NUL byte (binary data or UTF-16, not a "
                     "CSV text)",
                     name, (long long)nul_line, at);
        goto fail;
    }
    if (size >= 3 && (unsigned char)buf[0] == 0xEF && (unsigned char)buf[1] == 0xBB &&
        (unsigned char)buf[2] == 0xBF)
        r = w = 3; /* UTF-8 byte order mark */
    int64_t line = 1;
    int n_cols = -1;
    while (r < size) {
        /* One row. Completely empty lines are skipped (as pandas does). */
        if (buf[r] == '\n' || (buf[r] == '\r' && r + 1 < size && buf[r + 1] == '\n')) {
            r += buf[r] == '\r' ? 2 : 1;
            line++;
            continue;
        }
        int64_t row_start_line = line, row_first_cell = cells.n;
        bool row_done = false;
        while (!row_done) {
            char *field = buf + w;
            if (r < size && buf[r] == '"') {
                int64_t quote_line = line;
                size_t r0 = r;
                r++;
                for (;;) {
                    if (r >= size) {
                        st = cf_fail(CF_ERR_FORMAT,
                                     "%s: line %lld: a quoted field opened at byte offset %zu is "
                                     "never closed",
                                     name, (long long)quote_line, r0);
                        goto fail;
                    }
                    if (buf[r] == '"') {
                        if (r + 1 < size && buf[r + 1] == '"') {
                            buf[w++] = '"';
                            r += 2;
                            continue;
                        }
                        r++;
                        break;
                    }
                    if (buf[r] == '\n') line++;
                    buf[w++] = buf[r++];
                }
                if (r < size && buf[r] != delimiter && buf[r] != '\n' &&
                    !(buf[r] == '\r' && r + 1 < size && buf[r + 1] == '\n') &&
                    !(buf[r] == '\r' && r + 1 == size)) {
                    st = cf_fail(CF_ERR_FORMAT,
                                 "%s: line %lld, byte offset %zu: unexpected character '%c' after "
                                 "a closing quote",
                                 name, (long long)line, r,
                                 isprint((unsigned char)buf[r]) ? buf[r] : '?');
                    goto fail;
                }
            } else {
                while (r < size && buf[r] != delimiter && buf[r] != '\n' &&
                       !(buf[r] == '\r' && (r + 1 == size || buf[r + 1] == '\n')))
                    buf[w++] = buf[r++];
            }
            /* End of field: delimiter, end of line or end of text. */
            if (r < size && buf[r] == delimiter) {
                r++;
            } else {
                if (r < size && buf[r] == '\r') r++;
                if (r < size && buf[r] == '\n') {
                    r++;
                    line++;
                }
                row_done = true;
            }
            buf[w++] = '\0'; /* w <= r here, except for a final field without newline */
            if (!ptrvec_push(&cells, field)) {
                st = CF_ERR_NOMEM;
                goto fail;
            }
        }
        int got = (int)(cells.n - row_first_cell);
        if (cells.n - row_first_cell > 1000000) {
            st = cf_fail(CF_ERR_FORMAT, "%s: line %lld has more than 10^6 fields", name,
                         (long long)row_start_line);
            goto fail;
        }
        if (n_cols < 0) {
            n_cols = got;
        } else if (got != n_cols) {
            st = cf_fail(CF_ERR_FORMAT, "%s: line %lld has %d fields, the header has %d", name,
                         (long long)row_start_line, got, n_cols);
            goto fail;
        } else {
            if (n_rows == lines_cap) {
                int64_t cap = lines_cap ? lines_cap * 2 : 256;
                int64_t *nl = cf_malloc((size_t)cap * sizeof *nl);
                if (!nl) {
                    st = CF_ERR_NOMEM;
                    goto fail;
                }
                if (n_rows) memcpy(nl, lines, (size_t)n_rows * sizeof *nl);
                cf_free(lines);
                lines = nl;
                lines_cap = cap;
            }
            lines[n_rows++] = row_start_line;
        }
    }
    if (n_cols < 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: empty, no header row", name);
        goto fail;
    }
    /* The last field may have been terminated one byte past the copy: it has room (size + 1). */
    t->n_cols = n_cols;
    t->n_rows = n_rows;
    t->header = cf_malloc((size_t)n_cols * sizeof(char *));
    t->cells = cf_malloc((size_t)(n_rows * n_cols > 0 ? n_rows * n_cols : 1) * sizeof(char *));
    t->row_line = lines ? lines : cf_malloc(sizeof(int64_t));
    lines = NULL;
    if (!t->header || !t->cells || !t->row_line) {
        st = CF_ERR_NOMEM;
        goto fail;
    }
    memcpy(t->header, cells.v, (size_t)n_cols * sizeof(char *));
    if (n_rows) memcpy(t->cells, cells.v + n_cols, (size_t)(n_rows * n_cols) * sizeof(char *));
    cf_free(cells.v);
    *out = t;
    return CF_OK;
fail:
    cf_free(cells.v);
    cf_free(lines);
    cf_csv_table_free(t);
    return st == CF_ERR_NOMEM ? cf_fail(CF_ERR_NOMEM, "%s: out of memory parsing CSV", name) : st;
}

cf_status cf_csv_read(const char *path, char delimiter, cf_csv_table **out) {
    if (!out || !path) return cf_fail(CF_ERR_INVALID, "cf_csv_read: NULL argument");
    *out = NULL;
    char *buf;
    size_t got;
    cf_status rd = cf_read_file(path, (size_t)CF_CSV_MAX_BYTES, (void **)&buf, &got);
    if (rd != CF_OK) return rd;
    cf_status st = cf_csv_parse_buffer(buf, got, path, delimiter, out);
    cf_free(buf);
    return st;
}

/* ---- tabular processing -------------------------------------------------------------------- */

static const char *trim(const char *s, char *buf, size_t size) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (s[n] == '\0') return s;
    if (n >= size) n = size - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return buf;
}

/* pandas' default missing-value strings. */
bool cf_csv_is_missing(const char *s) {
    static const char *const na[] = {"",         "#N/A", "#N/A N/A", "#NA",    "-1.#IND",
                                     "-1.#QNAN", "-NaN", "-nan",     "1.#IND", "1.#QNAN",
                                     "<NA>",     "N/A",  "NA",       "NULL",   "NaN",
                                     "None",     "n/a",  "nan",      "null"};
    for (size_t i = 0; i < sizeof na / sizeof *na; i++)
        if (strcmp(s, na[i]) == 0) return true;
    return false;
}

static bool parse_number(const char *s, double *v) {
    if (!*s) return false;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(d)) return false;
    *v = d;
    return true;
}

typedef struct catkey {
    const char *s;
    double v;
    bool numeric;
} catkey;

static int cmp_key(const void *pa, const void *pb) {
    const catkey *a = pa, *b = pb;
    if (a->numeric && b->numeric && a->v != b->v) return a->v < b->v ? -1 : 1;
    return strcmp(a->s, b->s);
}

static int cmp_double(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* A sorted vocabulary of the non-missing values of column c over rows[0..n). */
typedef struct vocab {
    catkey *keys;
    int64_t n;
    bool numeric;
} vocab;

#define TRIM_MAX 4096

static cf_status build_vocab(const cf_csv_table *t, int c, const int64_t *rows, int64_t n,
                             vocab *out) {
    memset(out, 0, sizeof *out);
    catkey *k = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof *k);
    if (!k) return CF_ERR_NOMEM;
    int64_t m = 0;
    bool numeric = true;
    char tb[TRIM_MAX];
    for (int64_t i = 0; i < n; i++) {
        const char *raw = t->cells[rows[i] * t->n_cols + c];
        if (cf_csv_is_missing(raw)) continue;
        double v = 0;
        if (!parse_number(trim(raw, tb, sizeof tb), &v)) numeric = false;
        k[m].s = raw;
        k[m].v = v;
        m++;
    }
    for (int64_t i = 0; i < m; i++) k[i].numeric = numeric;
    qsort(k, (size_t)m, sizeof *k, cmp_key);
    int64_t u = 0;
    for (int64_t i = 0; i < m; i++)
        if (u == 0 || cmp_key(&k[u - 1], &k[i]) != 0) k[u++] = k[i];
    out->keys = k;
    out->n = u;
    out->numeric = numeric;
    return CF_OK;
}

/* Index of s in the vocabulary, or -1. */
static int64_t vocab_find(const vocab *voc, const char *s) {
    catkey key = {.s = s, .v = 0, .numeric = voc->numeric};
    char tb[TRIM_MAX];
    if (voc->numeric && !parse_number(trim(s, tb, sizeof tb), &key.v)) return -1;
    const catkey *hit = bsearch(&key, voc->keys, (size_t)voc->n, sizeof key, cmp_key);
    return hit ? hit - voc->keys : -1;
}

static int find_col(const cf_csv_table *t, const char *name) {
    for (int c = 0; c < t->n_cols; c++)
        if (strcmp(t->header[c], name) == 0) return c;
    return -1;
}

/* Copies the vocabulary strings (trimmed) into names[first..]. */
static bool vocab_names(const vocab *voc, char **names) {
    for (int64_t i = 0; i < voc->n; i++)
        if (!(names[i] = cf_strdup(voc->keys[i].s))) return false;
    return true;
}

cf_status cf_tabular_from_table(const cf_csv_table *t, const cf_tabular_options *opt,
                                cf_dataset **train, cf_dataset **valid) {
    if (!train || !valid || !t || !opt)
        return cf_fail(CF_ERR_INVALID, "cf_tabular_from_table: NULL argument");
    *train = *valid = NULL;
    const char *src = t->source ? t->source : "CSV";
    if (opt->n_cat < 0 || opt->n_cont < 0 || (opt->n_cat && !opt->cat_names) ||
        (opt->n_cont && !opt->cont_names) || !opt->y_name)
        return cf_fail(CF_ERR_INVALID, "%s: tabular options need column names and a target", src);
    if (opt->n_cat + opt->n_cont == 0)
        return cf_fail(CF_ERR_INVALID, "%s: no categorical or continuous columns given", src);
    int ncat = opt->n_cat, ncont = opt->n_cont;
    int64_t n = t->n_rows;
    cf_status st = CF_OK;
    int *cat_col = cf_malloc((size_t)(ncat + 1) * sizeof(int));
    int *cont_col = cf_malloc((size_t)(ncont + 1) * sizeof(int));
    vocab *cvoc = cf_calloc((size_t)(ncat + 1), sizeof(vocab));
    vocab yvoc = {0};
    double *median = cf_calloc((size_t)(ncont + 1), sizeof(double));
    double *mean = cf_calloc((size_t)(ncont + 1), sizeof(double));
    double *stdv = cf_calloc((size_t)(ncont + 1), sizeof(double));
    bool *has_na = cf_calloc((size_t)(ncont + 1), sizeof(bool));
    double *vals = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    bool *in_valid = cf_calloc((size_t)(n > 0 ? n : 1), sizeof(bool));
    int64_t *tr = NULL, *va = NULL, ntr = 0, nva = 0;
    cf_dataset *sets[2] = {NULL, NULL};
    char tb[TRIM_MAX];
    if (!cat_col || !cont_col || !cvoc || !median || !mean || !stdv || !has_na || !vals ||
        !in_valid) {
        st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
        goto done;
    }
    /* Columns. */
    int ycol = find_col(t, opt->y_name);
    for (int i = 0; i < ncat + ncont + 1; i++) {
        const char *nm = i < ncat           ? opt->cat_names[i]
                         : i < ncat + ncont ? opt->cont_names[i - ncat]
                                            : opt->y_name;
        int c = nm ? find_col(t, nm) : -1;
        if (c < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header (%d columns, first '%s')",
                         src, nm ? nm : "(null)", t->n_cols, t->header[0]);
            goto done;
        }
        if (i < ncat)
            cat_col[i] = c;
        else if (i < ncat + ncont)
            cont_col[i - ncat] = c;
    }
    /* Split. */
    if (opt->valid_idx) {
        for (int64_t i = 0; i < opt->n_valid_idx; i++) {
            int64_t v = opt->valid_idx[i];
            if (v < 0 || v >= n || in_valid[v]) {
                st = cf_fail(CF_ERR_INVALID,
                             "%s: valid_idx[%lld] = %lld is out of range [0, %lld) "
                             "or repeated",
                             src, (long long)i, (long long)v, (long long)n);
                goto done;
            }
            in_valid[v] = true;
        }
        nva = opt->n_valid_idx;
        ntr = n - nva;
        tr = cf_malloc((size_t)(ntr > 0 ? ntr : 1) * sizeof(int64_t));
        va = cf_malloc((size_t)(nva > 0 ? nva : 1) * sizeof(int64_t));
        if (!tr || !va) {
            st = CF_ERR_NOMEM;
            goto done;
        }
        memcpy(va, opt->valid_idx, (size_t)nva * sizeof(int64_t));
        for (int64_t i = 0, k = 0; i < n; i++)
            if (!in_valid[i]) tr[k++] = i;
    } else if ((st = cf_random_split(n, opt->valid_pct, opt->seed, &tr, &ntr, &va, &nva))) {
        goto done;
    }
    if (ntr == 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no rows in the training set (%lld rows in all)", src,
                     (long long)n);
        goto done;
    }
    /* Continuous columns: check every value, then the training statistics. */
    for (int j = 0; j < ncont; j++) {
        int c = cont_col[j];
        for (int64_t r = 0; r < n; r++) {
            const char *s = trim(t->cells[r * t->n_cols + c], tb, sizeof tb);
            double v;
            if (!cf_csv_is_missing(s) && !parse_number(s, &v)) {
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: line %lld, continuous column '%s': '%s' is not a number", src,
                             (long long)t->row_line[r], t->header[c], s);
                goto done;
            }
        }
        int64_t m = 0;
        for (int64_t i = 0; i < ntr; i++) {
            const char *s = trim(t->cells[tr[i] * t->n_cols + c], tb, sizeof tb);
            if (cf_csv_is_missing(s))
                has_na[j] = true;
            else
                parse_number(s, &vals[m++]);
        }
        if (m == 0) {
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: continuous column '%s' has no values in the training "
                         "set",
                         src, t->header[c]);
            goto done;
        }
        qsort(vals, (size_t)m, sizeof *vals, cmp_double);
        median[j] = m % 2 ? vals[m / 2] : 0.5 * (vals[m / 2 - 1] + vals[m / 2]);
        double sum = 0;
        for (int64_t i = 0; i < m; i++) sum += vals[i];
        sum += (double)(ntr - m) * median[j];
        mean[j] = sum / (double)ntr;
        double ss = 0;
        for (int64_t i = 0; i < m; i++) ss += (vals[i] - mean[j]) * (vals[i] - mean[j]);
        ss += (double)(ntr - m) * (median[j] - mean[j]) * (median[j] - mean[j]);
        stdv[j] = sqrt(ss / (double)ntr) + 1e-7;
    }
    /* Categorical vocabularies and the target. */
    for (int j = 0; j < ncat; j++)
        if ((st = build_vocab(t, cat_col[j], tr, ntr, &cvoc[j]))) goto done;
    if (!opt->y_regression) {
        if ((st = build_vocab(t, ycol, tr, ntr, &yvoc))) goto done;
        if (yvoc.n > (1 << 24)) {
            st = cf_fail(CF_ERR_FORMAT, "%s: target '%s' has %lld classes", src, opt->y_name,
                         (long long)yvoc.n);
            goto done;
        }
    }
    int64_t vocab_bytes = 0;
    for (int j = 0; j <= ncat; j++) {
        const vocab *voc = j < ncat ? &cvoc[j] : &yvoc;
        const char *col = j < ncat ? t->header[cat_col[j]] : opt->y_name;
        for (int64_t i = 0; i < voc->n; i++) {
            size_t len = strlen(voc->keys[i].s);
            vocab_bytes += (int64_t)len + 1;
            if (len > CF_TAB_MAX_CATEGORY) {
                /* Name the first training row holding it. */
                int64_t line = 0;
                int c = j < ncat ? cat_col[j] : ycol;
                for (int64_t r = 0; r < ntr && !line; r++)
                    if (t->cells[tr[r] * t->n_cols + c] == voc->keys[i].s)
                        line = t->row_line[tr[r]];
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: line %lld, column '%s': a category of %zu bytes (at most %d: "
                             "a saved model carries its categories)",
                             src, (long long)line, col, len, CF_TAB_MAX_CATEGORY);
                goto done;
            }
        }
    }
    if (vocab_bytes > CF_TAB_MAX_VOCAB_BYTES) {
        st = cf_fail(CF_ERR_FORMAT,
                     "%s: the categorical vocabularies hold %lld bytes in all (at most %lld: a "
                     "saved model carries them)",
                     src, (long long)vocab_bytes, (long long)CF_TAB_MAX_VOCAB_BYTES);
        goto done;
    }
    for (int j = 0; j < ncat; j++)
        if (cvoc[j].n + 1 > (1 << 24)) {
            st = cf_fail(CF_ERR_FORMAT, "%s: column '%s' has %lld categories", src,
                         t->header[cat_col[j]], (long long)cvoc[j].n);
            goto done;
        }
    int n_flags = 0;
    for (int j = 0; j < ncont; j++) n_flags += has_na[j];
    int n_cat_all = ncat + n_flags, nf = n_cat_all + ncont;
    /* Build both datasets. */
    for (int part = 0; part < 2; part++) {
        const int64_t *rows = part ? va : tr;
        int64_t nr = part ? nva : ntr;
        cf_dataset *ds = cf__dataset_alloc(nr, cf_shape1(nf), 1);
        if (!ds) {
            st = cf_fail_context(CF_ERR_NOMEM, "%s", src);
            goto done;
        }
        sets[part] = ds;
        ds->n_cat = n_cat_all;
        ds->n_cont = ncont;
        ds->cat_cardinality = cf_calloc((size_t)(n_cat_all + 1), sizeof(int));
        ds->cat_vocab = cf_calloc((size_t)(n_cat_all + 1), sizeof(char **));
        ds->feature_names = cf_calloc((size_t)(nf + 1), sizeof(char *));
        ds->cont_mean = cf_calloc((size_t)(ncont + 1), sizeof(float));
        ds->cont_std = cf_calloc((size_t)(ncont + 1), sizeof(float));
        ds->cont_fill = cf_calloc((size_t)(ncont + 1), sizeof(float));
        if (!ds->cat_cardinality || !ds->cat_vocab || !ds->feature_names || !ds->cont_mean ||
            !ds->cont_std || !ds->cont_fill || !cf__dataset_set_source(ds, src) ||
            !(ds->y_name = cf_strdup(opt->y_name))) {
            st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
            goto done;
        }
        /* metadata */
        for (int j = 0; j < ncat; j++) {
            ds->cat_cardinality[j] = (int)cvoc[j].n + 1;
            ds->cat_vocab[j] = cf_calloc((size_t)cvoc[j].n + 1, sizeof(char *));
            if (!ds->cat_vocab[j] || !(ds->cat_vocab[j][0] = cf_strdup("#na#")) ||
                !vocab_names(&cvoc[j], ds->cat_vocab[j] + 1) ||
                !(ds->feature_names[j] = cf_strdup(t->header[cat_col[j]]))) {
                st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
                goto done;
            }
        }
        for (int j = 0, k = ncat; j < ncont; j++) {
            ds->cont_mean[j] = (float)mean[j];
            ds->cont_std[j] = (float)stdv[j];
            ds->cont_fill[j] = (float)median[j];
            if (!(ds->feature_names[n_cat_all + j] = cf_strdup(t->header[cont_col[j]]))) {
                st = CF_ERR_NOMEM;
                goto done;
            }
            if (!has_na[j]) continue;
            char nm[512];
            snprintf(nm, sizeof nm, "%s_na", t->header[cont_col[j]]);
            ds->cat_cardinality[k] = 3;
            ds->cat_vocab[k] = cf_calloc(3, sizeof(char *));
            if (!ds->cat_vocab[k] || !(ds->cat_vocab[k][0] = cf_strdup("#na#")) ||
                !(ds->cat_vocab[k][1] = cf_strdup("False")) ||
                !(ds->cat_vocab[k][2] = cf_strdup("True")) ||
                !(ds->feature_names[k] = cf_strdup(nm))) {
                st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
                goto done;
            }
            k++;
        }
        if (!opt->y_regression) {
            ds->n_classes = (int)yvoc.n;
            ds->vocab = cf_calloc((size_t)yvoc.n + 1, sizeof(char *));
            if (!ds->vocab || !vocab_names(&yvoc, ds->vocab)) {
                st = cf_fail(CF_ERR_NOMEM, "%s: out of memory", src);
                goto done;
            }
        }
        /* rows */
        for (int64_t i = 0; i < nr; i++) {
            int64_t r = rows[i];
            char *const *cell = t->cells + r * t->n_cols;
            float *x = ds->x + (size_t)i * (size_t)nf;
            for (int j = 0; j < ncat; j++) {
                const char *s = cell[cat_col[j]];
                bool missing = cf_csv_is_missing(s);
                int64_t code = missing ? -1 : vocab_find(&cvoc[j], s);
                x[j] = (float)(code + 1); /* missing or unseen: 0 (#na#) */
                ds->n_unseen += !missing && code < 0;
            }
            for (int j = 0, k = ncat; j < ncont; j++) {
                const char *s = trim(cell[cont_col[j]], tb, sizeof tb);
                double v;
                bool missing = cf_csv_is_missing(s);
                if (missing)
                    v = median[j];
                else
                    parse_number(s, &v);
                x[n_cat_all + j] = (float)((v - mean[j]) / stdv[j]);
                if (has_na[j]) x[k++] = missing ? 2.0f : 1.0f;
            }
            const char *ys = cell[ycol];
            if (cf_csv_is_missing(ys)) {
                st = cf_fail(CF_ERR_FORMAT, "%s: line %lld: the target '%s' is missing", src,
                             (long long)t->row_line[r], opt->y_name);
                goto done;
            }
            if (opt->y_regression) {
                double v;
                if (!parse_number(trim(ys, tb, sizeof tb), &v)) {
                    st = cf_fail(CF_ERR_FORMAT, "%s: line %lld, target '%s': '%s' is not a number",
                                 src, (long long)t->row_line[r], opt->y_name, ys);
                    goto done;
                }
                ds->y[i] = (float)v;
            } else {
                int64_t code = vocab_find(&yvoc, ys);
                if (code < 0) {
                    st = cf_fail(CF_ERR_FORMAT,
                                 "%s: line %lld, target '%s': class '%s' does not appear in the "
                                 "training set",
                                 src, (long long)t->row_line[r], opt->y_name, ys);
                    goto done;
                }
                ds->y[i] = (float)code;
            }
        }
    }
    *train = sets[0];
    *valid = sets[1];
    sets[0] = sets[1] = NULL;
done:
    cf_dataset_free(sets[0]);
    cf_dataset_free(sets[1]);
    if (cvoc)
        for (int j = 0; j < ncat; j++) cf_free(cvoc[j].keys);
    cf_free(cvoc);
    cf_free(yvoc.keys);
    cf_free(cat_col);
    cf_free(cont_col);
    cf_free(median);
    cf_free(mean);
    cf_free(stdv);
    cf_free(has_na);
    cf_free(vals);
    cf_free(in_valid);
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
