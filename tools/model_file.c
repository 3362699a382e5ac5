/* Model files with the metadata that rebuilds the model: safetensors written with the same
 * tensors as cf_learner_export, plus "corefit.*" __metadata__ keys (documented in docs/cli.md):
 *
 *   corefit.version     "1"
 *   corefit.arch        mini-resnet | simple-cnn | xresnet18 | xresnet34 | xresnet50 | tabular
 *   corefit.input       idx | images | csv (what it was trained on)
 *   corefit.n_in        image channels, or tabular features (categorical + continuous)
 *   corefit.image_size  "HxW" (images)
 *   corefit.n_out       model outputs (classes, or regression targets)
 *   corefit.vocab       JSON array of class names (classifiers)
 *   corefit.normalize   JSON {"mean": [...], "std": [...]} per channel (images)
 *   corefit.tabular     JSON {"target", "regression", "layers": [...], "cat": [{"name", "vocab":
 *                       [...], "flag_of"?}], "cont": [{"name", "mean", "std", "fill"}]}
 */
#include "corefit.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const cli_fmnist_classes[10] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                            "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                            "Bag",         "Ankle boot"};

static void strv_free(char **v, int n) {
    if (!v) return;
    for (int i = 0; i < n; i++) cf_free(v[i]);
    cf_free(v);
}

static char **strv_dup(char *const *v, int n) {
    char **out = cf_calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    if (!out) return NULL;
    for (int i = 0; i < n; i++)
        if (!(out[i] = cf_strdup(v[i] ? v[i] : ""))) {
            strv_free(out, n);
            return NULL;
        }
    return out;
}

void cli_meta_free(cli_meta *m) {
    strv_free(m->vocab, m->n_vocab);
    cf_free(m->target);
    if (m->cat_vocab)
        for (int i = 0; i < m->n_cat; i++)
            strv_free(m->cat_vocab[i], m->cat_cardinality ? m->cat_cardinality[i] : 0);
    cf_free(m->cat_vocab);
    strv_free(m->feature_names, m->n_cat + m->n_cont);
    if (m->flag_of)
        for (int i = 0; i < m->n_cat; i++) cf_free(m->flag_of[i]);
    cf_free(m->flag_of);
    cf_free(m->cat_cardinality);
    cf_free(m->cont_mean);
    cf_free(m->cont_std);
    cf_free(m->cont_fill);
    memset(m, 0, sizeof *m);
}

cf_status cli_meta_from_dataset(cli_meta *m, const cf_dataset *ds, const char *arch,
                                const char *input, int n_out, int n_norm, const float *mean,
                                const float *std) {
    memset(m, 0, sizeof *m);
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    snprintf(m->input, sizeof m->input, "%s", input);
    m->n_out = n_out;
    if (ds->sample_shape.ndim == 3) {
        m->n_in = ds->sample_shape.dim[0];
        m->height = ds->sample_shape.dim[1];
        m->width = ds->sample_shape.dim[2];
    } else {
        m->n_in = ds->sample_shape.dim[0];
    }
    if (n_norm > CLI_MAX_NORM) return cf_fail(CF_ERR_INVALID, "%d normalisation channels", n_norm);
    m->n_norm = n_norm;
    for (int i = 0; i < n_norm; i++) {
        m->mean[i] = mean[i];
        m->std[i] = std[i];
    }
    if (ds->n_classes > 0) {
        m->n_vocab = ds->n_classes;
        if (ds->vocab) {
            m->vocab = strv_dup(ds->vocab, ds->n_classes);
        } else {
            m->vocab = cf_calloc((size_t)ds->n_classes, sizeof(char *));
            for (int i = 0; m->vocab && i < ds->n_classes; i++) {
                char b[16];
                snprintf(b, sizeof b, "%d", i);
                m->vocab[i] = cf_strdup(b);
            }
        }
        if (!m->vocab) return CF_ERR_NOMEM;
    }
    if (ds->sample_shape.ndim == 1 && ds->feature_names) {
        m->n_cat = ds->n_cat;
        m->n_cont = ds->n_cont;
        m->regression = ds->n_classes == 0;
        int nf = m->n_cat + m->n_cont;
        m->feature_names = strv_dup(ds->feature_names, nf);
        m->cat_vocab = cf_calloc((size_t)m->n_cat + 1, sizeof(char **));
        m->cat_cardinality = cf_calloc((size_t)m->n_cat + 1, sizeof(int));
        m->flag_of = cf_calloc((size_t)m->n_cat + 1, sizeof(char *));
        m->cont_mean = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
        m->cont_std = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
        m->cont_fill = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
        if (!m->feature_names || !m->cat_vocab || !m->cat_cardinality || !m->flag_of ||
            !m->cont_mean || !m->cont_std || !m->cont_fill)
            return CF_ERR_NOMEM;
        for (int i = 0; i < m->n_cat; i++) {
            m->cat_cardinality[i] = ds->cat_cardinality[i];
            if (!(m->cat_vocab[i] = strv_dup(ds->cat_vocab[i], ds->cat_cardinality[i])))
                return CF_ERR_NOMEM;
            /* FillMissing's flags are named "<cont>_na" after a continuous column */
            const char *nm = ds->feature_names[i];
            size_t len = strlen(nm);
            for (int j = 0; j < m->n_cont && len > 3 && !strcmp(nm + len - 3, "_na"); j++) {
                const char *cn = ds->feature_names[m->n_cat + j];
                if (strlen(cn) == len - 3 && !strncmp(cn, nm, len - 3) &&
                    !(m->flag_of[i] = cf_strdup(cn)))
                    return CF_ERR_NOMEM;
            }
        }
        for (int j = 0; j < m->n_cont; j++) {
            m->cont_mean[j] = ds->cont_mean[j];
            m->cont_std[j] = ds->cont_std[j];
            m->cont_fill[j] = ds->cont_fill[j];
        }
    }
    return CF_OK;
}

static cJSON *str_array(char *const *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

static char *print_json(cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    char *out = s ? cf_strdup(s) : NULL;
    if (s) cJSON_free(s);
    cJSON_Delete(j);
    return out;
}

cf_status cli_model_write(const cf_model *model, const cli_meta *m, const char *path) {
    cf_st_entry *entries = cf_calloc((size_t)model->n_params + 1, sizeof *entries);
    if (!entries) return cf_fail_context(CF_ERR_NOMEM, "saving %s", path);
    for (int i = 0; i < model->n_params; i++) {
        const cf_param *p = model->params[i];
        bool counter = p->kind == CF_PARAM_COUNTER;
        entries[i] = (cf_st_entry){
            .name = p->full_name,
            .dtype = counter ? CF_DTYPE_I64 : CF_DTYPE_F32,
            .shape = counter && p->numel == 1 ? (cf_shape){.ndim = 0} : p->shape,
            .numel = p->numel,
            .data = p->data,
        };
    }
    char n_in[32], size[64], n_out[32];
    snprintf(n_in, sizeof n_in, "%d", m->n_in);
    snprintf(size, sizeof size, "%dx%d", m->height, m->width);
    snprintf(n_out, sizeof n_out, "%d", m->n_out);
    char *vocab = m->n_vocab ? print_json(str_array(m->vocab, m->n_vocab)) : NULL;
    char *norm = NULL, *tab = NULL;
    if (m->n_norm > 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON *mean = cJSON_AddArrayToObject(j, "mean"), *std = cJSON_AddArrayToObject(j, "std");
        for (int i = 0; i < m->n_norm; i++) {
            cJSON_AddItemToArray(mean, cJSON_CreateNumber(m->mean[i]));
            cJSON_AddItemToArray(std, cJSON_CreateNumber(m->std[i]));
        }
        norm = print_json(j);
    }
    if (m->feature_names) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "target", m->target ? m->target : "");
        cJSON_AddBoolToObject(j, "regression", m->regression);
        cJSON *layers = cJSON_AddArrayToObject(j, "layers");
        for (int i = 0; i < m->n_layers; i++)
            cJSON_AddItemToArray(layers, cJSON_CreateNumber(m->layers[i]));
        cJSON *cat = cJSON_AddArrayToObject(j, "cat"), *cont = cJSON_AddArrayToObject(j, "cont");
        for (int i = 0; i < m->n_cat; i++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", m->feature_names[i]);
            cJSON_AddItemToObject(c, "vocab", str_array(m->cat_vocab[i], m->cat_cardinality[i]));
            if (m->flag_of[i]) cJSON_AddStringToObject(c, "flag_of", m->flag_of[i]);
            cJSON_AddItemToArray(cat, c);
        }
        for (int i = 0; i < m->n_cont; i++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", m->feature_names[m->n_cat + i]);
            cJSON_AddNumberToObject(c, "mean", m->cont_mean[i]);
            cJSON_AddNumberToObject(c, "std", m->cont_std[i]);
            cJSON_AddNumberToObject(c, "fill", m->cont_fill[i]);
            cJSON_AddItemToArray(cont, c);
        }
        tab = print_json(j);
    }
    const char *keys[10], *values[10];
    int n = 0;
#define META(k, v)                                                                                 \
    do {                                                                                           \
        keys[n] = (k);                                                                             \
        values[n++] = (v);                                                                         \
    } while (0)
    META("format", "pt");
    META("corefit.version", "1");
    META("corefit.arch", m->arch);
    META("corefit.input", m->input);
    META("corefit.n_in", n_in);
    if (m->height > 0) META("corefit.image_size", size);
    META("corefit.n_out", n_out);
    if (vocab) META("corefit.vocab", vocab);
    if (norm) META("corefit.normalize", norm);
    if (tab) META("corefit.tabular", tab);
#undef META
    cf_status st = CF_OK;
    if ((m->n_vocab && !vocab) || (m->n_norm && !norm) || (m->feature_names && !tab))
        st = cf_fail_context(CF_ERR_NOMEM, "saving %s", path);
    else
        st = cf_st_write(path, entries, model->n_params, keys, values, n);
    cf_free(vocab);
    cf_free(norm);
    cf_free(tab);
    cf_free(entries);
    return st;
}

/* ---- reading ---- */

static cf_status parse_int(const char *path, const char *key, const char *v, int lo, int hi,
                           int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < lo || x > hi)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: metadata %s is %s%s%s (expected a whole number in [%d, %d])", path, key,
                       v ? "'" : "missing", v ? v : "", v ? "'" : "", lo, hi);
    *out = (int)x;
    return CF_OK;
}

static cf_status json_strings(const char *path, const char *key, const cJSON *a, char ***out,
                              int *n) {
    if (!cJSON_IsArray(a))
        return cf_fail(CF_ERR_FORMAT, "%s: metadata %s: expected an array of strings", path, key);
    int k = cJSON_GetArraySize(a);
    char **v = cf_calloc((size_t)(k > 0 ? k : 1), sizeof(char *));
    if (!v) return CF_ERR_NOMEM;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsString(it) || !(v[i] = cf_strdup(it->valuestring))) {
            strv_free(v, k);
            return cf_fail(CF_ERR_FORMAT, "%s: metadata %s: item %d is not a string", path, key, i);
        }
        i++;
    }
    *out = v;
    *n = k;
    return CF_OK;
}

static bool json_num(const cJSON *o, const char *name, float *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return false;
    *out = (float)x->valuedouble;
    return true;
}

static cf_status read_tabular(const char *path, const char *text, cli_meta *m) {
    cJSON *j = cJSON_Parse(text);
    cf_status st = CF_OK;
    const char *key = "corefit.tabular";
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(j, "target");
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(j, "cat");
    const cJSON *cont = cJSON_GetObjectItemCaseSensitive(j, "cont");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(j, "layers");
    if (!cJSON_IsObject(j) || !cJSON_IsString(target) || !cJSON_IsArray(cat) ||
        !cJSON_IsArray(cont)) {
        cJSON_Delete(j);
        return cf_fail(CF_ERR_FORMAT, "%s: metadata %s is not a tabular spec", path, key);
    }
    m->target = cf_strdup(target->valuestring);
    m->regression = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "regression"));
    m->n_cat = cJSON_GetArraySize(cat);
    m->n_cont = cJSON_GetArraySize(cont);
    int nf = m->n_cat + m->n_cont;
    m->feature_names = cf_calloc((size_t)nf + 1, sizeof(char *));
    m->cat_vocab = cf_calloc((size_t)m->n_cat + 1, sizeof(char **));
    m->cat_cardinality = cf_calloc((size_t)m->n_cat + 1, sizeof(int));
    m->flag_of = cf_calloc((size_t)m->n_cat + 1, sizeof(char *));
    m->cont_mean = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
    m->cont_std = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
    m->cont_fill = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
    if (!m->target || !m->feature_names || !m->cat_vocab || !m->cat_cardinality || !m->flag_of ||
        !m->cont_mean || !m->cont_std || !m->cont_fill) {
        cJSON_Delete(j);
        return CF_ERR_NOMEM;
    }
    if (cJSON_IsArray(layers)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, layers) {
            if (m->n_layers < CF_TABULAR_MAX_LAYERS && cJSON_IsNumber(it) && it->valuedouble >= 1 &&
                it->valuedouble < 1e6)
                m->layers[m->n_layers++] = (int)it->valuedouble;
        }
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cat) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *flag = cJSON_GetObjectItemCaseSensitive(it, "flag_of");
        if (!cJSON_IsString(name)) {
            st = cf_fail(CF_ERR_FORMAT, "%s: %s: categorical column %d has no name", path, key, i);
            break;
        }
        m->feature_names[i] = cf_strdup(name->valuestring);
        if (cJSON_IsString(flag)) m->flag_of[i] = cf_strdup(flag->valuestring);
        if ((st = json_strings(path, key, cJSON_GetObjectItemCaseSensitive(it, "vocab"),
                               &m->cat_vocab[i], &m->cat_cardinality[i])))
            break;
        if (m->cat_cardinality[i] < 1) {
            st = cf_fail(CF_ERR_FORMAT, "%s: %s: column %s has an empty vocabulary", path, key,
                         name->valuestring);
            break;
        }
        i++;
    }
    i = 0;
    cJSON_ArrayForEach(it, cont) {
        if (st) break;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        if (!cJSON_IsString(name) || !json_num(it, "mean", &m->cont_mean[i]) ||
            !json_num(it, "std", &m->cont_std[i]) || !json_num(it, "fill", &m->cont_fill[i]) ||
            !(m->cont_std[i] > 0)) {
            st = cf_fail(CF_ERR_FORMAT,
                         "%s: %s: continuous column %d needs a name, mean, std > 0 and fill", path,
                         key, i);
            break;
        }
        m->feature_names[m->n_cat + i] = cf_strdup(name->valuestring);
        i++;
    }
    cJSON_Delete(j);
    return st;
}

cf_status cli_meta_from_file(const cf_st_file *f, const char *path, cli_meta *m) {
    memset(m, 0, sizeof *m);
    const char *arch = cf_st_meta(f, "corefit.arch");
    if (!arch)
        return cf_fail(CF_ERR_FORMAT,
                       "%s holds no corefit.arch metadata: it was not written by 'corefit train', "
                       "so the model cannot be rebuilt",
                       path);
    if (strcmp(arch, "tabular") != 0 && cf_arch_from_name(arch) < 0)
        return cf_fail(CF_ERR_FORMAT, "%s: unknown architecture '%s' in corefit.arch", path, arch);
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    const char *input = cf_st_meta(f, "corefit.input");
    snprintf(m->input, sizeof m->input, "%s", input ? input : "");
    cf_status st;
    if ((st = parse_int(path, "corefit.n_in", cf_st_meta(f, "corefit.n_in"), 1, 1 << 20,
                        &m->n_in)) ||
        (st = parse_int(path, "corefit.n_out", cf_st_meta(f, "corefit.n_out"), 1, 1 << 24,
                        &m->n_out)))
        return st;
    const char *size = cf_st_meta(f, "corefit.image_size");
    if (size) {
        char tail;
        if (sscanf(size, "%dx%d%c", &m->height, &m->width, &tail) != 2 || m->height < 1 ||
            m->width < 1 || m->height > 65536 || m->width > 65536)
            return cf_fail(CF_ERR_FORMAT, "%s: metadata corefit.image_size is '%s' (expected HxW)",
                           path, size);
    }
    const char *vocab = cf_st_meta(f, "corefit.vocab");
    if (vocab) {
        cJSON *j = cJSON_Parse(vocab);
        st = json_strings(path, "corefit.vocab", j, &m->vocab, &m->n_vocab);
        cJSON_Delete(j);
        if (st) return st;
        if (m->n_vocab != m->n_out)
            return cf_fail(CF_ERR_FORMAT, "%s: corefit.vocab has %d names for %d outputs", path,
                           m->n_vocab, m->n_out);
    }
    const char *norm = cf_st_meta(f, "corefit.normalize");
    if (norm) {
        cJSON *j = cJSON_Parse(norm);
        const cJSON *mean = cJSON_GetObjectItemCaseSensitive(j, "mean");
        const cJSON *sd = cJSON_GetObjectItemCaseSensitive(j, "std");
        int n = cJSON_GetArraySize(mean);
        bool ok = cJSON_IsArray(mean) && cJSON_IsArray(sd) && n >= 1 && n <= CLI_MAX_NORM &&
                  cJSON_GetArraySize(sd) == n;
        for (int i = 0; ok && i < n; i++) {
            const cJSON *a = cJSON_GetArrayItem(mean, i), *b = cJSON_GetArrayItem(sd, i);
            ok = cJSON_IsNumber(a) && cJSON_IsNumber(b) && b->valuedouble > 0;
            if (ok) {
                m->mean[i] = (float)a->valuedouble;
                m->std[i] = (float)b->valuedouble;
            }
        }
        cJSON_Delete(j);
        if (!ok)
            return cf_fail(
                CF_ERR_FORMAT,
                "%s: metadata corefit.normalize is not {\"mean\": [...], \"std\": [...]}", path);
        m->n_norm = n;
    }
    if (strcmp(arch, "tabular") == 0) {
        const char *tab = cf_st_meta(f, "corefit.tabular");
        if (!tab)
            return cf_fail(CF_ERR_FORMAT, "%s: a tabular model without corefit.tabular", path);
        if ((st = read_tabular(path, tab, m))) return st;
        if (m->n_cat + m->n_cont != m->n_in)
            return cf_fail(CF_ERR_FORMAT, "%s: corefit.tabular has %d columns but n_in is %d", path,
                           m->n_cat + m->n_cont, m->n_in);
    } else if (!size) {
        return cf_fail(CF_ERR_FORMAT, "%s: an image model without corefit.image_size", path);
    }
    return CF_OK;
}

cf_status cli_meta_read(const char *path, cli_meta *m) {
    memset(m, 0, sizeof *m);
    cf_st_file *f = NULL;
    cf_status st = cf_st_read(path, &f);
    if (st) return st;
    st = cli_meta_from_file(f, path, m);
    if (st) cli_meta_free(m);
    cf_st_free(f);
    return st;
}

/* ---- tabular rows -------------------------------------------------------------------------- */

static const char *trim(const char *s, char *buf, size_t size) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (n >= size) n = size - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return buf;
}

static bool parse_number(const char *s, double *v) {
    if (!*s) return false;
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d)) return false;
    *v = d;
    return true;
}

/* Code of s in a vocabulary ([0] = "#na#"): as Categorify, numeric vocabularies match by value. */
static int vocab_code(char *const *voc, int card, const char *raw) {
    if (cf_csv_is_missing(raw)) return 0;
    char tb[4096], vb[4096];
    double x, y;
    bool numeric = card > 1;
    for (int i = 1; i < card && numeric; i++)
        numeric = parse_number(trim(voc[i], vb, sizeof vb), &y);
    if (numeric) {
        if (!parse_number(trim(raw, tb, sizeof tb), &x)) return 0;
        for (int i = 1; i < card; i++)
            if (parse_number(trim(voc[i], vb, sizeof vb), &y) && x == y) return i;
        return 0;
    }
    for (int i = 1; i < card; i++)
        if (strcmp(voc[i], raw) == 0) return i;
    return 0;
}

static int find_col(const cf_csv_table *t, const char *name) {
    for (int c = 0; c < t->n_cols; c++)
        if (strcmp(t->header[c], name) == 0) return c;
    return -1;
}

cf_status cli_tabular_encode(const cli_meta *m, const cf_csv_table *t, bool need_target,
                             cf_dataset **out) {
    *out = NULL;
    const char *src = t->source ? t->source : "CSV";
    int nf = m->n_cat + m->n_cont;
    int *col = cf_calloc((size_t)nf + 1, sizeof(int));
    float *x = cf_calloc((size_t)(t->n_rows > 0 ? t->n_rows : 1) * (size_t)nf + 1, sizeof(float));
    float *y = cf_calloc((size_t)(t->n_rows > 0 ? t->n_rows : 1), sizeof(float));
    cf_status st = CF_OK;
    if (!col || !x || !y) {
        st = CF_ERR_NOMEM;
        goto done;
    }
    if (t->n_rows == 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s has no rows", src);
        goto done;
    }
    for (int i = 0; i < nf; i++) {
        const char *name = i < m->n_cat && m->flag_of[i] ? m->flag_of[i] : m->feature_names[i];
        if ((col[i] = find_col(t, name)) < 0) {
            st = cf_fail(CF_ERR_FORMAT, "%s: no column '%s' in the header (the model needs it)",
                         src, name);
            goto done;
        }
    }
    int ycol = m->target ? find_col(t, m->target) : -1;
    if (need_target && ycol < 0) {
        st = cf_fail(CF_ERR_FORMAT, "%s: no target column '%s' in the header", src,
                     m->target ? m->target : "");
        goto done;
    }
    char tb[4096];
    for (int64_t r = 0; r < t->n_rows; r++) {
        char *const *cell = t->cells + r * t->n_cols;
        float *row = x + r * nf;
        for (int i = 0; i < m->n_cat; i++) {
            const char *s = cell[col[i]];
            if (m->flag_of[i]) /* FillMissing's flag: codes 1 (False) and 2 (True) */
                row[i] =
                    (float)vocab_code(m->cat_vocab[i], m->cat_cardinality[i],
                                      cf_csv_is_missing(trim(s, tb, sizeof tb)) ? "True" : "False");
            else
                row[i] = (float)vocab_code(m->cat_vocab[i], m->cat_cardinality[i], s);
        }
        for (int j = 0; j < m->n_cont; j++) {
            const char *s = trim(cell[col[m->n_cat + j]], tb, sizeof tb);
            double v;
            if (cf_csv_is_missing(s)) {
                v = m->cont_fill[j];
            } else if (!parse_number(s, &v)) {
                st = cf_fail(CF_ERR_FORMAT,
                             "%s: line %lld, continuous column '%s': '%s' is not a number", src,
                             (long long)t->row_line[r], m->feature_names[m->n_cat + j], s);
                goto done;
            }
            row[m->n_cat + j] = (float)((v - m->cont_mean[j]) / m->cont_std[j]);
        }
        if (ycol >= 0 && need_target) {
            const char *s = cell[ycol];
            if (cf_csv_is_missing(s)) {
                st = cf_fail(CF_ERR_FORMAT, "%s: line %lld: the target '%s' is missing", src,
                             (long long)t->row_line[r], m->target);
                goto done;
            }
            if (m->regression) {
                double v;
                if (!parse_number(trim(s, tb, sizeof tb), &v)) {
                    st = cf_fail(CF_ERR_FORMAT, "%s: line %lld, target '%s': '%s' is not a number",
                                 src, (long long)t->row_line[r], m->target, s);
                    goto done;
                }
                y[r] = (float)v;
            } else {
                int code = -1;
                for (int k = 0; k < m->n_vocab && code < 0; k++)
                    if (strcmp(m->vocab[k], s) == 0) code = k;
                if (code < 0) { /* numeric class names match by value, as Categorify */
                    double a, b;
                    for (int k = 0; k < m->n_vocab && code < 0; k++)
                        if (parse_number(trim(s, tb, sizeof tb), &a) &&
                            parse_number(m->vocab[k], &b) && a == b)
                            code = k;
                }
                if (code < 0) {
                    st =
                        cf_fail(CF_ERR_FORMAT,
                                "%s: line %lld, target '%s': class '%s' is not one the model knows",
                                src, (long long)t->row_line[r], m->target, s);
                    goto done;
                }
                y[r] = (float)code;
            }
        }
    }
    cf_dataset *ds = NULL;
    if ((st = cf_dataset_from_arrays(x, y, t->n_rows, cf_shape1(nf), 1,
                                     m->regression ? 0 : m->n_out, &ds)))
        goto done;
    ds->n_cat = m->n_cat;
    ds->n_cont = m->n_cont;
    ds->cat_cardinality = cf_calloc((size_t)m->n_cat + 1, sizeof(int));
    if (!ds->cat_cardinality) {
        cf_dataset_free(ds);
        st = CF_ERR_NOMEM;
        goto done;
    }
    memcpy(ds->cat_cardinality, m->cat_cardinality, (size_t)m->n_cat * sizeof(int));
    if (m->vocab && !m->regression &&
        (st = cf_dataset_set_vocab(ds, (const char *const *)m->vocab, m->n_vocab))) {
        cf_dataset_free(ds);
        goto done;
    }
    *out = ds;
done:
    cf_free(col);
    cf_free(x);
    cf_free(y);
    return st;
}

/* ---- rebuilding a learner ------------------------------------------------------------------ */

cf_status cli_load_learner(const char *path, const cli_meta *m, cf_dataset *ds, int bs,
                           cf_learner **learn, cf_dls **dls) {
    *learn = NULL;
    *dls = NULL;
    cf_dataset *first = NULL;
    int64_t zero = 0;
    cf_status st = cf_dataset_subset(ds, &zero, 1, &first);
    if (st) {
        cf_dataset_free(ds);
        return st;
    }
    cf_dls_options o = {.bs = bs > 0 ? bs : 64, .prefetch = -1, .n_norm = m->n_norm};
    memcpy(o.mean, m->mean, sizeof o.mean);
    memcpy(o.std, m->std, sizeof o.std);
    if ((st = cf_dls_new(first, ds, &o, dls))) return st;
    cf_metric *metrics[1] = {NULL};
    int n_metrics = 0;
    if (!m->regression && m->n_out > 1) metrics[n_metrics++] = cf_accuracy();
    if (strcmp(m->arch, "tabular") == 0) {
        cf_tabular_learner_opts to = {.n_out = m->n_out,
                                      .n_layers = m->n_layers,
                                      .metrics = metrics,
                                      .n_metrics = n_metrics,
                                      .quiet = true};
        memcpy(to.layers, m->layers, sizeof to.layers);
        st = cf_tabular_learner_(learn, *dls, &to);
    } else {
        st = cf_vision_learner(learn, *dls, (cf_arch)cf_arch_from_name(m->arch), .n_out = m->n_out,
                               .metrics = metrics, .n_metrics = n_metrics, .quiet = true);
    }
    if (st == CF_OK) st = cf_model_load((*learn)->model, NULL, path);
    if (st) {
        cf_learner_free(*learn);
        cf_dls_free(*dls);
        *learn = NULL;
        *dls = NULL;
    }
    return st;
}

/* ---- corefit info -------------------------------------------------------------------------- */

static void info_usage(FILE *f, const cli_opt *opts) {
    fprintf(f, "Usage: corefit info [options] MODEL.safetensors\n\n"
               "Shows what a model file holds: architecture, inputs, classes, normalisation,\n"
               "tabular columns, tensors and parameter count.\n\nOptions:\n");
    cli_print_options(f, opts);
}

int cmd_info(int argc, char **argv) {
    bool json = false, tensors = false;
    cli_opt opts[] = {
        {"--json", OPT_FLAG, &json, NULL, "print the metadata and tensors as JSON", 0, 0, 0},
        {"--tensors", OPT_FLAG, &tensors, NULL, "list every tensor with its shape", 0, 0, 0},
        {0},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse("info", argc, argv, 2, opts, pos, 1, &n_pos);
    if (rc < 0) {
        info_usage(stdout, opts);
        return CLI_OK;
    }
    if (rc) return rc;
    if (n_pos != 1)
        return cli_error(CLI_USAGE, "info", "expects one model file (see corefit info --help)");
    cf_st_file *f = NULL;
    if (cf_st_read(pos[0], &f)) return cli_lib_error("info", "reading the model");
    size_t n_params = 0, n_floats = 0;
    for (int i = 0; i < f->n_entries; i++) {
        n_floats += f->entries[i].numel;
        if (!strstr(f->entries[i].name, "running_") && !strstr(f->entries[i].name, "num_batches") &&
            strncmp(f->entries[i].name, "opt.", 4) != 0)
            n_params += f->entries[i].numel;
    }
    cli_meta m;
    cf_status mst = cli_meta_from_file(f, pos[0], &m);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "file", pos[0]);
        cJSON_AddNumberToObject(j, "tensors", f->n_entries);
        cJSON_AddNumberToObject(j, "parameters", (double)n_params);
        cJSON *meta = cJSON_AddObjectToObject(j, "metadata");
        for (int i = 0; i < f->n_meta; i++)
            cJSON_AddStringToObject(meta, f->meta_keys[i], f->meta_values[i]);
        if (tensors) {
            cJSON *t = cJSON_AddObjectToObject(j, "shapes");
            for (int i = 0; i < f->n_entries; i++) {
                const cf_st_entry *e = &f->entries[i];
                cJSON *s = cJSON_CreateArray();
                for (int d = 0; d < e->shape.ndim; d++)
                    cJSON_AddItemToArray(s, cJSON_CreateNumber(e->shape.dim[d]));
                cJSON_AddItemToObject(t, e->name, s);
            }
        }
        char *s = cJSON_Print(j);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(j);
    } else {
        printf("file:        %s\n", pos[0]);
        if (mst == CF_OK) {
            printf("arch:        %s\n", m.arch);
            printf("trained on:  %s\n", m.input[0] ? m.input : "?");
            if (m.height > 0)
                printf("input:       %d x %d x %d (channels x height x width)\n", m.n_in, m.height,
                       m.width);
            else
                printf("input:       %d features (%d categorical, %d continuous)\n", m.n_in,
                       m.n_cat, m.n_cont);
            printf("outputs:     %d\n", m.n_out);
            if (m.n_vocab) {
                printf("classes:    ");
                for (int i = 0; i < m.n_vocab; i++)
                    printf(" %s%s", m.vocab[i], i + 1 < m.n_vocab ? "," : "");
                printf("\n");
            }
            if (m.n_norm) {
                printf("normalize:   mean");
                for (int i = 0; i < m.n_norm; i++) printf(" %.6g", m.mean[i]);
                printf(", std");
                for (int i = 0; i < m.n_norm; i++) printf(" %.6g", m.std[i]);
                printf("\n");
            }
            if (m.feature_names) {
                printf("target:      %s (%s)\n", m.target, m.regression ? "regression" : "classes");
                for (int i = 0; i < m.n_cat; i++)
                    printf("categorical: %s (%d categories%s%s)\n", m.feature_names[i],
                           m.cat_cardinality[i], m.flag_of[i] ? ", missing-value flag of " : "",
                           m.flag_of[i] ? m.flag_of[i] : "");
                for (int j = 0; j < m.n_cont; j++)
                    printf("continuous:  %s (mean %.6g, std %.6g, fill %.6g)\n",
                           m.feature_names[m.n_cat + j], m.cont_mean[j], m.cont_std[j],
                           m.cont_fill[j]);
            }
        } else {
            printf("metadata:    not a corefit train file (%s)\n", cf_last_error());
        }
        printf("tensors:     %d (%zu values)\n", f->n_entries, n_floats);
        printf("parameters:  %zu trainable\n", n_params);
        if (tensors)
            for (int i = 0; i < f->n_entries; i++) {
                char b[96];
                printf("  %-40s %s\n", f->entries[i].name,
                       f->entries[i].shape.ndim ? cf_shape_str(&f->entries[i].shape, b, sizeof b)
                                                : "()");
            }
    }
    if (mst == CF_OK) cli_meta_free(&m);
    cf_st_free(f);
    return CLI_OK;
}
