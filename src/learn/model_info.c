/* An exported model's metadata (cf_model_info, documented in corefit/learn.h): what a learner
 * would export (cf_learner_info), reading it back from a file (cf_model_info_read), and the
 * tabular state it carries, which encodes new rows through the data layer's one tabular
 * processor (cf_tabular_encode). */
#include "internal.h"

#include "corefit/io.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest input an image model may declare (channels x height x width): 2^26 values, 256 MB
 * as float32 per image (a 4096x4096 RGB image is 50M). */
#define CF_MODEL_MAX_IMAGE_VALUES ((int64_t)1 << 26)

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

void cf_model_info_free(cf_model_info *m) {
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
    strv_free(m->text_vocab, m->n_text_vocab);
    memset(m, 0, sizeof *m);
}

/* The per-column arrays of m's tabular state for m->n_cat and m->n_cont columns, zeroed (one
 * spare entry each); false when out of memory (cf_model_info_free releases what was made). */
static bool alloc_tabular_arrays(cf_model_info *m) {
    m->cat_vocab = cf_calloc((size_t)m->n_cat + 1, sizeof(char **));
    m->cat_cardinality = cf_calloc((size_t)m->n_cat + 1, sizeof(int));
    m->flag_of = cf_calloc((size_t)m->n_cat + 1, sizeof(char *));
    m->cont_mean = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
    m->cont_std = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
    m->cont_fill = cf_calloc((size_t)m->n_cont + 1, sizeof(float));
    return m->cat_vocab && m->cat_cardinality && m->flag_of && m->cont_mean && m->cont_std &&
           m->cont_fill;
}

/* The model info's copy of a tabular state (statistics as float, as the file stores them). */
static cf_status info_from_tabular_state(const cf_tabular_state *s, cf_model_info *m) {
    m->n_cat = s->n_cat;
    m->n_cont = s->n_cont;
    m->regression = s->regression;
    m->feature_names = strv_dup(s->feature_names, s->n_cat + s->n_cont);
    if (!alloc_tabular_arrays(m) || !m->feature_names) return CF_ERR_NOMEM;
    for (int i = 0; i < m->n_cat; i++) {
        m->cat_cardinality[i] = s->cat_cardinality[i];
        if (!(m->cat_vocab[i] = strv_dup(s->cat_vocab[i], s->cat_cardinality[i])) ||
            (s->flag_of[i] && !(m->flag_of[i] = cf_strdup(s->flag_of[i]))))
            return CF_ERR_NOMEM;
    }
    for (int j = 0; j < m->n_cont; j++) {
        m->cont_mean[j] = (float)s->cont_mean[j];
        m->cont_std[j] = (float)s->cont_std[j];
        m->cont_fill[j] = (float)s->cont_fill[j];
    }
    return CF_OK;
}

/* "idx" for a data set read from IDX files (its source names them), else "images". */
static const char *image_input(const cf_dataset *ds) {
    return ds->source && strstr(ds->source, "-idx") ? "idx" : "images";
}

static cf_status learner_info(const cf_learner *learn, cf_model_info *m) {
    memset(m, 0, sizeof *m);
    const cf_dataset *ds = learn && learn->dls ? learn->dls->train_ds : NULL;
    if (!ds) return cf_fail(CF_ERR_STATE, "export: the learner has no training set");
    m->recipe = learn->recipe;
    const bool text = cf_text_loader_corpus(learn->dls->train) != NULL;
    if (text) { /* the class names below, the rest from the text part */
        cf_status st = cf__text_learner_info(learn, m);
        if (st) return st;
    }
    if (!m->recipe.n_out) m->recipe.n_out = ds->n_classes > 0 ? ds->n_classes : ds->target_dim;
    bool tabular = ds->sample_shape.ndim == 1 && ds->feature_names;
    if (!text) snprintf(m->input, sizeof m->input, "%s", tabular ? "csv" : image_input(ds));
    if (text) {
        /* n_in is the vocabulary's size */
    } else if (ds->sample_shape.ndim == 3) {
        m->n_in = ds->sample_shape.dim[0];
        m->height = ds->sample_shape.dim[1];
        m->width = ds->sample_shape.dim[2];
    } else {
        m->n_in = ds->sample_shape.dim[0];
    }
    const cf_dl_options *lo = learn->dls->train ? cf_dataloader_options(learn->dls->train) : NULL;
    int n_norm = lo && ds->sample_shape.ndim == 3 ? lo->n_norm : 0;
    const float *mean = lo ? lo->mean : NULL, *std = lo ? lo->std : NULL;
    if (tabular && ds->y_name && !(m->target = cf_strdup(ds->y_name))) return CF_ERR_NOMEM;
    if (n_norm > CF_MODEL_MAX_NORM)
        return cf_fail(CF_ERR_INVALID, "%d normalisation channels", n_norm);
    m->n_norm = n_norm;
    for (int i = 0; i < n_norm; i++) {
        m->mean[i] = mean[i];
        m->std[i] = std[i];
    }
    if (ds->sample_shape.ndim == 3 && !text) {
        if (ds->item_tfm) m->item_tfm = *ds->item_tfm;
        m->has_batch_tfms = true;
        if (lo && lo->aug) {
            m->has_aug = true;
            m->aug = *lo->aug;
        }
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
    if (tabular) {
        cf_tabular_state tab;
        cf_status st = cf_tabular_state_load(ds, &tab);
        if (st == CF_OK) st = info_from_tabular_state(&tab, m);
        cf_tabular_state_free(&tab);
        if (st) return st;
    }
    return CF_OK;
}

cf_status cf_learner_info(const cf_learner *learn, cf_model_info *m) {
    cf_status st = learner_info(learn, m);
    if (st) cf_model_info_free(m);
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

static cf_status read_tabular(const char *path, const char *text, cf_model_info *m) {
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
    if (!alloc_tabular_arrays(m) || !m->target || !m->feature_names) {
        cJSON_Delete(j);
        return CF_ERR_NOMEM;
    }
    if (cJSON_IsArray(layers)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, layers) {
            if (m->recipe.n_layers < CF_TABULAR_MAX_LAYERS && cJSON_IsNumber(it) &&
                it->valuedouble >= 1 && it->valuedouble < 1e6)
                m->recipe.layers[m->recipe.n_layers++] = (int)it->valuedouble;
        }
    }
    const cJSON *yr = cJSON_GetObjectItemCaseSensitive(j, "y_range");
    if (yr) {
        const cJSON *lo = cJSON_GetArrayItem(yr, 0), *hi = cJSON_GetArrayItem(yr, 1);
        if (!cJSON_IsArray(yr) || cJSON_GetArraySize(yr) != 2 || !cJSON_IsNumber(lo) ||
            !cJSON_IsNumber(hi) || !(lo->valuedouble < hi->valuedouble)) {
            cJSON_Delete(j);
            return cf_fail(CF_ERR_FORMAT, "%s: %s: y_range is not [low, high]", path, key);
        }
        m->recipe.y_range = true;
        m->recipe.y_lo = (float)lo->valuedouble;
        m->recipe.y_hi = (float)hi->valuedouble;
    }
    json_num(j, "ps", &m->recipe.tab_ps);
    json_num(j, "embed_p", &m->recipe.embed_p);
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

/* The vision head (absent: the arch's default). */
static cf_status read_head(const char *path, const char *text, cf_learner_recipe *r) {
    if (!text) return CF_OK;
    cJSON *j = cJSON_Parse(text);
    const cJSON *lin = cJSON_GetObjectItemCaseSensitive(j, "lin_ftrs");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "ps");
    bool ok = cJSON_IsObject(j) &&
              (!lin || (cJSON_IsArray(lin) && cJSON_GetArraySize(lin) <= CF_HEAD_MAX_LAYERS)) &&
              (!ps || (cJSON_IsArray(ps) && cJSON_GetArraySize(ps) <= CF_HEAD_MAX_LAYERS + 1));
    const cJSON *it;
    if (ok && lin) cJSON_ArrayForEach(it, lin) {
            ok = ok && cJSON_IsNumber(it) && it->valuedouble >= 1 && it->valuedouble < 1e7;
            if (ok) r->lin_ftrs[r->n_lin_ftrs++] = (int)it->valuedouble;
        }
    if (ok && ps) cJSON_ArrayForEach(it, ps) {
            ok = ok && cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < 1;
            if (ok) r->ps[r->n_ps++] = (float)it->valuedouble;
        }
    if (ok) {
        r->no_concat_pool = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "concat_pool"));
        r->no_first_bn = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "first_bn"));
        r->bn_final = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "bn_final"));
        const cJSON *yr = cJSON_GetObjectItemCaseSensitive(j, "y_range");
        const cJSON *lo = cJSON_GetArrayItem(yr, 0), *hi = cJSON_GetArrayItem(yr, 1);
        if (yr) {
            ok = cJSON_IsArray(yr) && cJSON_GetArraySize(yr) == 2 && cJSON_IsNumber(lo) &&
                 cJSON_IsNumber(hi) && lo->valuedouble < hi->valuedouble;
            r->y_range = ok;
            r->y_lo = ok ? (float)lo->valuedouble : 0;
            r->y_hi = ok ? (float)hi->valuedouble : 0;
        }
        const cJSON *targets = cJSON_GetObjectItemCaseSensitive(j, "targets");
        if (targets) {
            ok = ok && cJSON_IsString(targets) && strcmp(targets->valuestring, "multi_label") == 0;
            r->multi_label = ok;
        }
        const cJSON *points = cJSON_GetObjectItemCaseSensitive(j, "points");
        if (points) {
            ok = ok && cJSON_IsNumber(points) && points->valuedouble >= 1 &&
                 points->valuedouble <= 1024 && points->valuedouble == (int)points->valuedouble;
            r->n_points = ok ? (int)points->valuedouble : 0;
        }
    }
    cJSON_Delete(j);
    if (!ok)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: metadata corefit.head is not {\"lin_ftrs\": [...], \"ps\": [...], ...}",
                       path);
    return CF_OK;
}

static bool json_int(const cJSON *o, const char *name, int lo, int hi, int *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(x) || x->valuedouble < lo || x->valuedouble > hi ||
        x->valuedouble != (int)x->valuedouble)
        return false;
    *out = (int)x->valuedouble;
    return true;
}

/* A text model's vocabulary, tokenizer and sizes. */
static cf_status read_text(const cf_st_file *f, const char *path, cf_model_info *m) {
    const char *vocab = cf_st_meta(f, "corefit.text_vocab");
    const char *tok = cf_st_meta(f, "corefit.tokenizer");
    const char *spec = cf_st_meta(f, "corefit.text");
    if (!vocab || !tok || !spec)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: a text model needs corefit.text_vocab, corefit.tokenizer and "
                       "corefit.text (missing: %s)",
                       path,
                       !vocab ? "corefit.text_vocab"
                       : !tok ? "corefit.tokenizer"
                              : "corefit.text");
    cJSON *j = cJSON_Parse(vocab);
    cf_status st = json_strings(path, "corefit.text_vocab", j, &m->text_vocab, &m->n_text_vocab);
    cJSON_Delete(j);
    if (st) return st;
    if (m->n_text_vocab != m->n_in)
        return cf_fail(CF_ERR_FORMAT, "%s: corefit.text_vocab has %d words but n_in is %d", path,
                       m->n_text_vocab, m->n_in);
    char src[512];
    snprintf(src, sizeof src, "%s: corefit.tokenizer", path);
    if ((st = cf_text_tok_options_from_json(tok, strlen(tok), src, &m->tok))) return st;
    j = cJSON_Parse(spec);
    const bool lm = strcmp(m->recipe.arch, "awd_lstm_lm") == 0;
    bool ok = cJSON_IsObject(j) && json_int(j, "emb_sz", 1, 1 << 16, &m->emb_sz) &&
              json_int(j, "n_hid", 1, 1 << 16, &m->n_hid) &&
              json_int(j, "n_layers", 1, 64, &m->n_layers);
    if (ok && !lm) {
        ok = json_int(j, "seq_len", 1, 1 << 20, &m->recipe.text_seq_len) &&
             json_int(j, "max_len", -1, 1 << 30, &m->recipe.text_max_len);
        const cJSON *lin = cJSON_GetObjectItemCaseSensitive(j, "lin_ftrs"), *it;
        ok = ok && (!lin || (cJSON_IsArray(lin) && cJSON_GetArraySize(lin) <= CF_HEAD_MAX_LAYERS));
        if (ok && lin) cJSON_ArrayForEach(it, lin) {
                ok = ok && cJSON_IsNumber(it) && it->valuedouble >= 1 && it->valuedouble < 1e7;
                if (ok) m->recipe.lin_ftrs[m->recipe.n_lin_ftrs++] = (int)it->valuedouble;
            }
    }
    cJSON_Delete(j);
    if (!ok)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: metadata corefit.text is not {\"emb_sz\", \"n_hid\", \"n_layers\", "
                       "\"seq_len\", \"max_len\", \"lin_ftrs\"} with sizes in range",
                       path);
    if (lm && m->recipe.n_out != m->n_text_vocab)
        return cf_fail(CF_ERR_FORMAT, "%s: a language model of %d outputs over %d words", path,
                       m->recipe.n_out, m->n_text_vocab);
    if (!lm && m->n_vocab != m->recipe.n_out)
        return cf_fail(CF_ERR_FORMAT, "%s: a text classifier of %d outputs with %d class names",
                       path, m->recipe.n_out, m->n_vocab);
    return CF_OK;
}

static int name_index(const cJSON *j, const char *key, const char *const *names, int n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    for (int i = 0; cJSON_IsString(v) && i < n; i++)
        if (strcmp(v->valuestring, names[i]) == 0) return i;
    return -1;
}

static bool number(const cJSON *j, const char *key, double lo, double hi, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) return false;
    *out = (float)v->valuedouble;
    return true;
}

static bool number_pair(const cJSON *j, const char *key, double lo, double hi, float *a, float *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    const cJSON *x = cJSON_GetArrayItem(v, 0), *y = cJSON_GetArrayItem(v, 1);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(x) ||
        !cJSON_IsNumber(y) || !(x->valuedouble >= lo && x->valuedouble <= hi) ||
        !(y->valuedouble >= lo && y->valuedouble <= hi))
        return false;
    *a = (float)x->valuedouble;
    *b = (float)y->valuedouble;
    return true;
}

static const char *const resize_names[] = {"crop", "pad", "squish"};
static const char *const pad_names[] = {"reflection", "zeros", "border"};

/* corefit.item_tfm: the item transform, of the model's image size */
static cf_status read_item_tfm(const char *path, const char *text, cf_model_info *m) {
    cJSON *j = cJSON_Parse(text);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    cf_item_tfm t = {0};
    float h = 0, w = 0;
    bool ok = cJSON_IsString(kind) && number_pair(j, "size", 1, 65536, &h, &w) &&
              (int)h == m->height && (int)w == m->width;
    if (ok && strcmp(kind->valuestring, "resize") == 0) {
        int method = name_index(j, "method", resize_names, 3);
        int pad = name_index(j, "pad_mode", pad_names, 3);
        ok = method >= 0 && pad >= 0;
        t = cf_resize_tfm(m->height, ok ? (cf_resize_method)method : CF_RESIZE_CROP);
        t.pad_mode = ok ? (cf_pad_mode)pad : CF_PAD_REFLECTION;
    } else if (ok && strcmp(kind->valuestring, "random_resized_crop") == 0) {
        t = cf_random_resized_crop_tfm(m->height, 0.08f);
        ok = number(j, "min_scale", 0, 1, &t.min_scale) &&
             number(j, "max_scale", t.min_scale, 1, &t.max_scale) &&
             number_pair(j, "ratio", 1e-3, 1e3, &t.ratio_lo, &t.ratio_hi) &&
             t.ratio_lo <= t.ratio_hi && number(j, "val_xtra", 0, 10, &t.val_xtra);
    } else {
        ok = false;
    }
    cJSON_Delete(j);
    if (!ok)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: metadata corefit.item_tfm is '%s' (expected a resize or "
                       "random_resized_crop of the image size %dx%d, as corefit/learn.h says)",
                       path, text, m->height, m->width);
    t.width = m->width;
    t.height = m->height;
    m->item_tfm = t;
    return CF_OK;
}

/* corefit.batch_tfms: aug_transforms' parameters, or false */
static cf_status read_batch_tfms(const char *path, const char *text, cf_model_info *m) {
    cJSON *j = cJSON_Parse(text);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "aug_transforms");
    bool ok = cJSON_IsFalse(a);
    cf_aug_opts o = cf_aug_transforms_defaults(1.0f);
    if (cJSON_IsObject(a)) {
        const cJSON *flip = cJSON_GetObjectItemCaseSensitive(a, "do_flip");
        const cJSON *vert = cJSON_GetObjectItemCaseSensitive(a, "flip_vert");
        int pad = name_index(a, "pad_mode", pad_names, 3);
        ok = cJSON_IsBool(flip) && cJSON_IsBool(vert) && pad >= 0 &&
             number(a, "max_rotate", 0, 360, &o.max_rotate) &&
             number(a, "min_zoom", 1e-3, 100, &o.min_zoom) &&
             number(a, "max_zoom", o.min_zoom, 100, &o.max_zoom) &&
             number(a, "max_lighting", 0, 1, &o.max_lighting) &&
             number(a, "max_warp", 0, 1, &o.max_warp) && number(a, "p_affine", 0, 1, &o.p_affine) &&
             number(a, "p_lighting", 0, 1, &o.p_lighting);
        if (ok) {
            o.do_flip = cJSON_IsTrue(flip);
            o.flip_vert = cJSON_IsTrue(vert);
            o.pad_mode = (cf_pad_mode)pad;
            m->has_aug = true;
            m->aug = o;
        }
    }
    cJSON_Delete(j);
    if (!ok)
        return cf_fail(CF_ERR_FORMAT,
                       "%s: metadata corefit.batch_tfms is '%s' (expected {\"aug_transforms\": "
                       "false} or aug_transforms' parameters, as corefit/learn.h says)",
                       path, text);
    m->has_batch_tfms = true;
    return CF_OK;
}

cf_status cf_model_info_from_file(const cf_st_file *f, const char *path, cf_model_info *m) {
    memset(m, 0, sizeof *m);
    const char *arch = cf_st_meta(f, "corefit.arch");
    if (!arch)
        return cf_fail(CF_ERR_FORMAT,
                       "%s holds no corefit.arch metadata, so the model cannot be rebuilt: "
                       "cf_learner_export writes it for learners made by cf_vision_learner or "
                       "cf_tabular_learner (and corefit train)",
                       path);
    /* "unet-<body>": cf_unet_learner's U-Net on that body */
    const bool unet = strncmp(arch, "unet-", 5) == 0 && cf_arch_from_name(arch + 5) >= 0;
    if (strcmp(arch, "tabular") != 0 && !cf__is_text_arch(arch) && !unet &&
        cf_arch_from_name(arch) < 0)
        return cf_fail(CF_ERR_FORMAT, "%s: unknown architecture '%s' in corefit.arch", path, arch);
    snprintf(m->recipe.arch, sizeof m->recipe.arch, "%s", arch);
    const char *input = cf_st_meta(f, "corefit.input");
    snprintf(m->input, sizeof m->input, "%s", input ? input : "");
    cf_status st;
    if ((st = parse_int(path, "corefit.n_in", cf_st_meta(f, "corefit.n_in"), 1, 1 << 20,
                        &m->n_in)) ||
        (st = parse_int(path, "corefit.n_out", cf_st_meta(f, "corefit.n_out"), 1, 1 << 24,
                        &m->recipe.n_out)))
        return st;
    const char *size = cf_st_meta(f, "corefit.image_size");
    if (size) {
        char tail;
        if (sscanf(size, "%dx%d%c", &m->height, &m->width, &tail) != 2 || m->height < 1 ||
            m->width < 1 || m->height > 65536 || m->width > 65536)
            return cf_fail(CF_ERR_FORMAT, "%s: metadata corefit.image_size is '%s' (expected HxW)",
                           path, size);
        /* Refused before anything is sized from it: a predict batch holds bs such images. */
        const int64_t values = (int64_t)m->n_in * m->height * m->width;
        if (values > CF_MODEL_MAX_IMAGE_VALUES)
            return cf_fail(CF_ERR_FORMAT,
                           "%s: metadata corefit.image_size is '%s': %lld values per image for %d "
                           "channel%s, over the %lld an image model may take",
                           path, size, (long long)values, m->n_in, m->n_in == 1 ? "" : "s",
                           (long long)CF_MODEL_MAX_IMAGE_VALUES);
    }
    const char *vocab = cf_st_meta(f, "corefit.vocab");
    if (vocab) {
        cJSON *j = cJSON_Parse(vocab);
        st = json_strings(path, "corefit.vocab", j, &m->vocab, &m->n_vocab);
        cJSON_Delete(j);
        if (st) return st;
        if (m->n_vocab != m->recipe.n_out)
            return cf_fail(CF_ERR_FORMAT, "%s: corefit.vocab has %d names for %d outputs", path,
                           m->n_vocab, m->recipe.n_out);
        /* two outputs of one name could not be told apart in a prediction */
        for (int i = 1; i < m->n_vocab; i++)
            for (int k = 0; k < i; k++)
                if (strcmp(m->vocab[i], m->vocab[k]) == 0)
                    return cf_fail(CF_ERR_FORMAT,
                                   "%s: corefit.vocab names class %d and class %d both '%s'; "
                                   "class names must differ",
                                   path, k, i, m->vocab[i]);
    }
    const char *norm = cf_st_meta(f, "corefit.normalize");
    if (norm) {
        cJSON *j = cJSON_Parse(norm);
        const cJSON *mean = cJSON_GetObjectItemCaseSensitive(j, "mean");
        const cJSON *sd = cJSON_GetObjectItemCaseSensitive(j, "std");
        int n = cJSON_GetArraySize(mean);
        bool ok = cJSON_IsArray(mean) && cJSON_IsArray(sd) && n >= 1 && n <= CF_MODEL_MAX_NORM &&
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
    } else if (cf__is_text_arch(arch)) {
        if ((st = read_text(f, path, m))) return st;
    } else if (!size) {
        return cf_fail(CF_ERR_FORMAT, "%s: an image model without corefit.image_size", path);
    } else if ((st = read_head(path, cf_st_meta(f, "corefit.head"), &m->recipe))) {
        return st;
    } else if (unet &&
               (st = cf__unet_opts_read(path, cf_st_meta(f, "corefit.unet"), &m->recipe.unet))) {
        return st;
    } else {
        const char *item = cf_st_meta(f, "corefit.item_tfm");
        const char *batch = cf_st_meta(f, "corefit.batch_tfms");
        if ((item && (st = read_item_tfm(path, item, m))) ||
            (batch && (st = read_batch_tfms(path, batch, m))))
            return st;
    }
    return CF_OK;
}

cf_status cf_model_info_read(const char *path, cf_model_info *m) {
    memset(m, 0, sizeof *m);
    cf_st_file *f = NULL;
    cf_status st = cf_st_read(path, &f);
    if (st) return st;
    st = cf_model_info_from_file(f, path, m);
    if (st) cf_model_info_free(m);
    cf_st_free(f);
    return st;
}

/* ---- tabular rows -------------------------------------------------------------------------- */

/* The tabular state an exported model's info carries. */
cf_status cf__tabular_state_of_info(const cf_model_info *m, cf_tabular_state *s) {
    cf_status st = cf_tabular_state_alloc(s, m->n_cat, m->n_cont);
    if (st) return st;
    s->regression = m->regression;
    bool ok = (s->y_name = cf_strdup(m->target ? m->target : "")) != NULL;
    for (int i = 0; ok && i < m->n_cat + m->n_cont; i++)
        ok = (s->feature_names[i] = cf_strdup(m->feature_names[i])) != NULL;
    for (int i = 0; ok && i < m->n_cat; i++) {
        s->cat_cardinality[i] = m->cat_cardinality[i];
        ok = (s->cat_vocab[i] = strv_dup(m->cat_vocab[i], m->cat_cardinality[i])) &&
             (!m->flag_of[i] || (s->flag_of[i] = cf_strdup(m->flag_of[i])));
    }
    for (int j = 0; j < m->n_cont; j++) {
        s->cont_mean[j] = m->cont_mean[j];
        s->cont_std[j] = m->cont_std[j];
        s->cont_fill[j] = m->cont_fill[j];
    }
    if (ok && !m->regression && m->n_vocab > 0) {
        s->n_classes = m->n_vocab;
        ok = (s->y_vocab = strv_dup(m->vocab, m->n_vocab)) != NULL;
    }
    if (!ok) {
        cf_tabular_state_free(s);
        return CF_ERR_NOMEM;
    }
    return CF_OK;
}

/* A classifier's file without class names still has n_out classes. */
static void info_classes(const cf_model_info *m, cf_dataset *ds) {
    if (!m->regression && ds->n_classes == 0) ds->n_classes = m->recipe.n_out;
}

cf_status cf_tabular_encode(const cf_model_info *m, const cf_csv_table *t, bool need_target,
                            cf_dataset **out, int64_t *n_unseen) {
    *out = NULL;
    if (n_unseen) *n_unseen = 0;
    if (t->n_rows == 0)
        return cf_fail(CF_ERR_FORMAT, "%s has no rows", t->source ? t->source : "CSV");
    cf_tabular_state s;
    cf_status st = cf__tabular_state_of_info(m, &s);
    if (st == CF_OK) st = cf_tabular_dataset(&s, t, NULL, t->n_rows, need_target, out);
    cf_tabular_state_free(&s);
    if (st) return st;
    info_classes(m, *out);
    if (n_unseen) *n_unseen = (*out)->n_unseen;
    return CF_OK;
}
