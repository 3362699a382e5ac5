/* In-memory datasets: allocation, copies, subsets, statistics, RandomSplitter. */
#include "data_internal.h"

#include "core/memory.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void cf__strv_free(char **v, int n) {
    if (!v) return;
    for (int i = 0; i < n; i++) cf_free(v[i]);
    cf_free(v);
}

char **cf__strv_dup(const char *const *v, int n) {
    char **out = cf_calloc((size_t)(n > 0 ? n : 1), sizeof *out);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        if (!v[i]) continue;
        out[i] = cf_strdup(v[i]);
        if (!out[i]) {
            cf__strv_free(out, n);
            return NULL;
        }
    }
    return out;
}

bool cf__dataset_set_source(cf_dataset *ds, const char *s) {
    char *copy = cf_strdup(s ? s : "");
    if (!copy) return false;
    cf_free(ds->source);
    ds->source = copy;
    return true;
}

static bool shape_valid(const cf_shape *s) {
    if (s->ndim < 1 || s->ndim > 3) return false; /* the batch dim makes it 4 at most */
    for (int i = 0; i < s->ndim; i++)
        if (s->dim[i] <= 0) return false;
    return true;
}

static cf_dataset *dataset_alloc(int64_t n, cf_shape shape, int target_dim, bool zero) {
    char buf[64];
    if (n < 0 || !shape_valid(&shape) || target_dim < 1) {
        cf_fail(CF_ERR_INVALID, "dataset of %lld samples of shape %s with %d targets is invalid",
                (long long)n, cf_shape_str(&shape, buf, sizeof buf), target_dim);
        return NULL;
    }
    size_t per = cf_shape_numel(&shape);
    if (per > ((size_t)1 << 40) / sizeof(float) || (uint64_t)n > ((uint64_t)1 << 40) / per ||
        (uint64_t)n > ((uint64_t)1 << 40) / (uint64_t)target_dim) {
        cf_fail(CF_ERR_NOMEM, "dataset of %lld samples of shape %s is too large", (long long)n,
                cf_shape_str(&shape, buf, sizeof buf));
        return NULL;
    }
    /* A shape from a file (a model's image size, an IDX header) can ask for more than there is:
     * say so before trying. */
    char what[128];
    snprintf(what, sizeof what, "a dataset of %lld samples of shape %s", (long long)n,
             cf_shape_str(&shape, buf, sizeof buf));
    if (cf_memory_check(((uint64_t)n * per + (uint64_t)n * (uint64_t)target_dim) * sizeof(float),
                        what) != CF_OK)
        return NULL;
    cf_dataset *ds = cf_calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->n = n;
    ds->sample_shape = shape;
    ds->target_dim = target_dim;
    if (zero) {
        ds->x = cf_calloc((size_t)n * per, sizeof(float));
        ds->y = cf_calloc((size_t)n * (size_t)target_dim, sizeof(float));
    } else { /* the caller writes every value: no clearing, and huge pages for the samples */
        ds->x = cf__malloc_huge((size_t)n * per * sizeof(float));
        ds->y = cf_malloc((size_t)n * (size_t)target_dim * sizeof(float));
    }
    if (!ds->x || !ds->y || !cf__dataset_set_source(ds, "")) {
        cf_dataset_free(ds);
        cf_fail(CF_ERR_NOMEM, "out of memory for a dataset of %lld samples of shape %s",
                (long long)n, cf_shape_str(&shape, buf, sizeof buf));
        return NULL;
    }
    return ds;
}

cf_dataset *cf__dataset_alloc(int64_t n, cf_shape shape, int target_dim) {
    return dataset_alloc(n, shape, target_dim, true);
}

cf_dataset *cf__dataset_alloc_unset(int64_t n, cf_shape shape, int target_dim) {
    return dataset_alloc(n, shape, target_dim, false);
}

void cf_dataset_free(cf_dataset *ds) {
    if (!ds) return;
    cf_free(ds->x);
    cf_free(ds->y);
    if (ds->samples) ds->samples->free(ds);
    cf__strv_free(ds->vocab, ds->n_classes);
    if (ds->cat_vocab) {
        for (int i = 0; i < ds->n_cat; i++)
            cf__strv_free(ds->cat_vocab[i], ds->cat_cardinality ? ds->cat_cardinality[i] : 0);
        cf_free(ds->cat_vocab);
    }
    cf__strv_free(ds->feature_names, ds->n_cat + ds->n_cont);
    cf_free(ds->cat_cardinality);
    cf_free(ds->cont_mean);
    cf_free(ds->cont_std);
    cf_free(ds->cont_fill);
    cf_free(ds->source);
    cf_free(ds->y_name);
    cf_free(ds->item_tfm);
    cf_free(ds);
}

cf_status cf_dataset_from_arrays(const float *x, const float *y, int64_t n, cf_shape sample_shape,
                                 int target_dim, int n_classes, cf_dataset **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dataset_from_arrays: out is NULL");
    *out = NULL;
    if ((n > 0 && (!x || !y)) || n_classes < 0)
        return cf_fail(CF_ERR_INVALID, "cf_dataset_from_arrays: NULL data or n_classes %d < 0",
                       n_classes);
    cf_dataset *ds = cf__dataset_alloc_unset(n, sample_shape, target_dim); /* copied whole below */
    if (!ds) return cf_fail_context(CF_ERR_NOMEM, "cf_dataset_from_arrays");
    size_t per = cf_shape_numel(&sample_shape);
    if (n > 0) {
        memcpy(ds->x, x, (size_t)n * per * sizeof(float));
        memcpy(ds->y, y, (size_t)n * (size_t)target_dim * sizeof(float));
    }
    if (n_classes > 0) {
        for (int64_t i = 0; i < n * target_dim; i++) {
            float v = y[i];
            if (!(v >= 0 && v < (float)n_classes) || v != floorf(v)) {
                cf_dataset_free(ds);
                return cf_fail(CF_ERR_INVALID,
                               "cf_dataset_from_arrays: target %lld is %g, not a class code in "
                               "[0, %d)",
                               (long long)i, (double)v, n_classes);
            }
        }
    }
    ds->n_classes = n_classes;
    if (!cf__dataset_set_source(ds, "arrays")) {
        cf_dataset_free(ds);
        return CF_ERR_NOMEM;
    }
    *out = ds;
    return CF_OK;
}

cf_status cf_dataset_set_vocab(cf_dataset *ds, const char *const *names, int n) {
    if (!ds || !names || n != ds->n_classes)
        return cf_fail(CF_ERR_INVALID, "cf_dataset_set_vocab: %d names for %d classes", n,
                       ds ? ds->n_classes : -1);
    for (int i = 0; i < n; i++)
        if (!names[i]) return cf_fail(CF_ERR_INVALID, "cf_dataset_set_vocab: name %d is NULL", i);
    char **v = cf__strv_dup(names, n);
    if (!v) return CF_ERR_NOMEM;
    cf__strv_free(ds->vocab, ds->n_classes);
    ds->vocab = v;
    return CF_OK;
}

static float *floats_dup(const float *v, int n) {
    if (!v) return NULL;
    float *out = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (out && n > 0) memcpy(out, v, (size_t)n * sizeof(float));
    return out;
}

cf_status cf__dataset_set_item_tfm(cf_dataset *ds, const cf_item_tfm *tfm) {
    cf_free(ds->item_tfm);
    ds->item_tfm = NULL;
    if (!tfm || tfm->kind == CF_ITEM_TFM_NONE) return CF_OK;
    if (!(ds->item_tfm = cf_malloc(sizeof *ds->item_tfm))) return CF_ERR_NOMEM;
    *ds->item_tfm = *tfm;
    return CF_OK;
}

cf_status cf__dataset_copy_meta(cf_dataset *dst, const cf_dataset *src) {
    dst->n_classes = src->n_classes;
    dst->n_points = src->n_points;
    dst->masks = src->masks;
    if (src->vocab && !(dst->vocab = cf__strv_dup((const char *const *)src->vocab, src->n_classes)))
        return CF_ERR_NOMEM;
    if (src->source && !cf__dataset_set_source(dst, src->source)) return CF_ERR_NOMEM;
    if (src->y_name && !(dst->y_name = cf_strdup(src->y_name))) return CF_ERR_NOMEM;
    if (src->item_tfm && cf__dataset_set_item_tfm(dst, src->item_tfm)) return CF_ERR_NOMEM;
    dst->n_cat = src->n_cat;
    dst->n_cont = src->n_cont;
    if (src->cat_cardinality) {
        dst->cat_cardinality = cf_malloc((size_t)(src->n_cat > 0 ? src->n_cat : 1) * sizeof(int));
        if (!dst->cat_cardinality) return CF_ERR_NOMEM;
        memcpy(dst->cat_cardinality, src->cat_cardinality, (size_t)src->n_cat * sizeof(int));
    }
    if (src->feature_names &&
        !(dst->feature_names =
              cf__strv_dup((const char *const *)src->feature_names, src->n_cat + src->n_cont)))
        return CF_ERR_NOMEM;
    if (src->cat_vocab) {
        dst->cat_vocab = cf_calloc((size_t)(src->n_cat > 0 ? src->n_cat : 1), sizeof(char **));
        if (!dst->cat_vocab) return CF_ERR_NOMEM;
        for (int i = 0; i < src->n_cat; i++)
            if (src->cat_vocab[i] &&
                !(dst->cat_vocab[i] = cf__strv_dup((const char *const *)src->cat_vocab[i],
                                                   src->cat_cardinality[i])))
                return CF_ERR_NOMEM;
    }
    if ((src->cont_mean && !(dst->cont_mean = floats_dup(src->cont_mean, src->n_cont))) ||
        (src->cont_std && !(dst->cont_std = floats_dup(src->cont_std, src->n_cont))) ||
        (src->cont_fill && !(dst->cont_fill = floats_dup(src->cont_fill, src->n_cont))))
        return CF_ERR_NOMEM;
    return CF_OK;
}

/* The samples idx[0..n) as a new set: from the set's source, or copied from x. */
static cf_status samples_subset(const cf_dataset *ds, const int64_t *idx, int64_t n,
                                cf_dataset **out) {
    if (ds->samples) return ds->samples->subset(ds, idx, n, out);
    cf_dataset *sub = cf__dataset_alloc(n, ds->sample_shape, ds->target_dim);
    if (!sub) return CF_ERR_NOMEM;
    size_t per = cf_shape_numel(&ds->sample_shape);
    for (int64_t i = 0; i < n; i++)
        memcpy(sub->x + (size_t)i * per, ds->x + (size_t)idx[i] * per, per * sizeof(float));
    *out = sub;
    return CF_OK;
}

cf_status cf_dataset_subset(const cf_dataset *ds, const int64_t *idx, int64_t n, cf_dataset **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dataset_subset: out is NULL");
    *out = NULL;
    if (!ds || n < 0 || (n > 0 && !idx))
        return cf_fail(CF_ERR_INVALID, "cf_dataset_subset: invalid arguments");
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= ds->n)
            return cf_fail(CF_ERR_INVALID,
                           "cf_dataset_subset: index %lld is %lld, outside [0, %lld)", (long long)i,
                           (long long)idx[i], (long long)ds->n);
    cf_dataset *sub = NULL;
    cf_status st = samples_subset(ds, idx, n, &sub);
    if (st) return st;
    if (cf__dataset_copy_meta(sub, ds) != CF_OK) {
        cf_dataset_free(sub);
        return cf_fail(CF_ERR_NOMEM, "cf_dataset_subset: out of memory");
    }
    size_t td = (size_t)ds->target_dim;
    for (int64_t i = 0; i < n; i++)
        memcpy(sub->y + (size_t)i * td, ds->y + (size_t)idx[i] * td, td * sizeof(float));
    *out = sub;
    return CF_OK;
}

cf_status cf_dataset_channel_stats(const cf_dataset *ds, float *mean, float *std) {
    if (!ds || !mean || !std || ds->sample_shape.ndim != 3 || ds->sample_shape.dim[0] > 4)
        return cf_fail(CF_ERR_INVALID,
                       "cf_dataset_channel_stats: needs an image dataset (C, H, W) with C <= 4");
    int c = ds->sample_shape.dim[0];
    size_t hw = (size_t)ds->sample_shape.dim[1] * (size_t)ds->sample_shape.dim[2];
    if (ds->samples && ds->n > 0) {
        /* Samples from a source (a streamed set): some of them decoded one at a time (memory for
         * one image); sums in double around 0.5 (pixels lie in [0, 1]), so nothing cancels badly.
         */
        int64_t k = ds->n < 256 ? ds->n : 256;
        float *x = cf_malloc((size_t)c * hw * sizeof(float));
        if (!x) return cf_fail_context(CF_ERR_NOMEM, "cf_dataset_channel_stats");
        double s1[4] = {0}, s2[4] = {0}, count = 0;
        cf_status st = CF_OK;
        for (int64_t i = 0; i < k && !st; i++) {
            int64_t j = i * ds->n / k;
            bool skipped = false;
            st = ds->samples->get(ds, j, 0, true, x, &skipped);
            if (skipped) continue;
            for (int ch = 0; ch < c && !st; ch++)
                for (size_t p = 0; p < hw; p++) {
                    double d = x[(size_t)ch * hw + p] - 0.5;
                    s1[ch] += d;
                    s2[ch] += d * d;
                }
            count += (double)hw;
        }
        cf_free(x);
        if (st) return st;
        if (count < 2)
            return cf_fail(CF_ERR_INVALID, "cf_dataset_channel_stats: %s has too few values",
                           ds->source ? ds->source : "dataset");
        for (int ch = 0; ch < c; ch++) {
            double var = (s2[ch] - s1[ch] * s1[ch] / count) / (count - 1);
            mean[ch] = (float)(0.5 + s1[ch] / count);
            std[ch] = (float)(sqrt(var > 0 ? var : 0) + 1e-7);
        }
        return CF_OK;
    }
    if (!ds->x)
        return cf_fail(CF_ERR_STATE, "cf_dataset_channel_stats: %s holds no samples",
                       ds->source ? ds->source : "dataset");
    if (ds->n * (int64_t)hw < 2)
        return cf_fail(CF_ERR_INVALID, "cf_dataset_channel_stats: %s has too few values",
                       ds->source ? ds->source : "dataset");
    /* One pass in double, around a shift (the channel's first value), in 8 independent lanes
     * the compiler can keep in vector registers (a single running sum is a serial chain of
     * additions: Fashion-MNIST's 47 million pixels took 80 ms in two such passes, all of it
     * before a fit starts, on one core). The shift keeps the sum of squares from cancelling. */
    enum { LANES = 8 };
    for (int ch = 0; ch < c; ch++) {
        const double shift = ds->x[(size_t)ch * hw];
        double s1[LANES] = {0}, s2[LANES] = {0};
        for (int64_t i = 0; i < ds->n; i++) {
            const float *p = ds->x + ((size_t)i * (size_t)c + (size_t)ch) * hw;
            size_t j = 0;
            for (; j + LANES <= hw; j += LANES)
                for (int l = 0; l < LANES; l++) {
                    double d = (double)p[j + (size_t)l] - shift;
                    s1[l] += d;
                    s2[l] += d * d;
                }
            for (; j < hw; j++) {
                double d = (double)p[j] - shift;
                s1[0] += d;
                s2[0] += d * d;
            }
        }
        double sum = 0, sq = 0, count = (double)ds->n * (double)hw;
        for (int l = 0; l < LANES; l++) {
            sum += s1[l];
            sq += s2[l];
        }
        double var = (sq - sum * sum / count) / (count - 1);
        mean[ch] = (float)(shift + sum / count);
        std[ch] = (float)(sqrt(var > 0 ? var : 0) + 1e-7);
    }
    return CF_OK;
}

cf_status cf_random_split(int64_t n, double valid_pct, uint64_t seed, int64_t **train_idx,
                          int64_t *n_train, int64_t **valid_idx, int64_t *n_valid) {
    if (!train_idx || !n_train || !valid_idx || !n_valid)
        return cf_fail(CF_ERR_INVALID, "cf_random_split: NULL output");
    *train_idx = *valid_idx = NULL;
    *n_train = *n_valid = 0;
    if (n < 0 || !(valid_pct >= 0 && valid_pct <= 1))
        return cf_fail(CF_ERR_INVALID, "cf_random_split: valid_pct %g outside [0, 1] (n %lld)",
                       valid_pct, (long long)n);
    int64_t *perm = cf_malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!perm) return CF_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    cf_rng rng;
    cf_rng_seed(&rng, seed);
    cf_rng_shuffle(&rng, perm, n);
    int64_t cut = (int64_t)(valid_pct * (double)n);
    int64_t *tr = cf_malloc((size_t)(n - cut > 0 ? n - cut : 1) * sizeof(int64_t));
    int64_t *va = cf_malloc((size_t)(cut > 0 ? cut : 1) * sizeof(int64_t));
    if (!tr || !va) {
        cf_free(perm);
        cf_free(tr);
        cf_free(va);
        return CF_ERR_NOMEM;
    }
    memcpy(va, perm, (size_t)cut * sizeof(int64_t));
    memcpy(tr, perm + cut, (size_t)(n - cut) * sizeof(int64_t));
    cf_free(perm);
    *train_idx = tr;
    *valid_idx = va;
    *n_train = n - cut;
    *n_valid = cut;
    return CF_OK;
}

cf_status cf_dataset_get(const cf_dataset *ds, int64_t i, int epoch, float *out) {
    if (!ds || !out || i < 0 || i >= ds->n)
        return cf_fail(CF_ERR_INVALID, "cf_dataset_get: sample %lld of %lld", (long long)i,
                       ds ? (long long)ds->n : 0LL);
    if (ds->samples) return ds->samples->get(ds, i, epoch, false, out, NULL);
    if (!ds->x) return cf_fail(CF_ERR_STATE, "cf_dataset_get: the dataset holds no samples");
    size_t per = cf_shape_numel(&ds->sample_shape);
    memcpy(out, ds->x + (size_t)i * per, per * sizeof(float));
    return CF_OK;
}
