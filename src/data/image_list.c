/* A list of labelled image files made a data set: decoded up front into one array, or kept as
 * file names for the loaders to decode (a streamed set, stream.c). Image folders and image CSV
 * lists both end here. */
#include "data_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* qsort order of C strings. */
int cf__cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

cf_status cf__sorted_vocab(const char **labels, int64_t n, const char *source, const char *why,
                           char ***vocab, int *n_vocab) {
    if (n > 1) qsort(labels, (size_t)n, sizeof *labels, cf__cmp_str);
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (u == 0 || strcmp(labels[u - 1], labels[i]) != 0) labels[u++] = labels[i];
    if (u == 0 || u > INT_MAX) return cf_fail(CF_ERR_FORMAT, "%s%s", source, why);
    if (!(*vocab = cf__strv_dup((const char *const *)labels, (int)u))) return CF_ERR_NOMEM;
    *n_vocab = (int)u;
    return CF_OK;
}

cf_status cf__image_options_check(cf_image_folder_options *o, const char *source,
                                  const char *what) {
    if (o->channels == 0) o->channels = 3;
    if ((o->channels != 1 && o->channels != 3) || o->size < 0 || o->size > 65536 ||
        !(o->valid_pct >= 0 && o->valid_pct < 1) || o->load < CF_IMAGE_LOAD_AUTO ||
        o->load > CF_IMAGE_LOAD_STREAM || o->decode_threads < 0 || o->decode_threads > 1024)
        return cf_fail(CF_ERR_INVALID,
                       "%s: %s: channels %d (1 or 3), size %d, valid_pct %g, load %d, "
                       "decode_threads %d",
                       source, what, o->channels, o->size, o->valid_pct, (int)o->load,
                       o->decode_threads);
    return CF_OK;
}

void cf__image_items_free(cf__image_items *it) {
    for (int64_t i = 0; i < it->n; i++) cf_free(it->v[i].path);
    cf_free(it->v);
    memset(it, 0, sizeof *it);
}

cf_status cf__image_items_push(cf__image_items *it, const char *path, int label) {
    if (it->n == it->cap) {
        int64_t cap = it->cap ? it->cap * 2 : 64;
        cf__image_item *v = cf_malloc((size_t)cap * sizeof *v);
        if (!v) return CF_ERR_NOMEM;
        if (it->n) memcpy(v, it->v, (size_t)it->n * sizeof *v);
        cf_free(it->v);
        it->v = v;
        it->cap = cap;
    }
    char *p = cf_strdup(path);
    if (!p) return CF_ERR_NOMEM;
    it->v[it->n].path = p;
    it->v[it->n].label = label;
    it->n++;
    return CF_OK;
}

cf_status cf__path_join(char *buf, size_t size, const char *a, const char *b) {
    int k = snprintf(buf, size, "%s/%s", a, b);
    if (k < 0 || (size_t)k >= size) return cf_fail(CF_ERR_INVALID, "path too long: %s/%s", a, b);
    return CF_OK;
}

/* Decodes the items into a new dataset. w and h carry the common size when opt size is 0. */
cf_status cf__image_items_build(const cf__image_items *it, int channels, int size, int *w, int *h,
                                char **vocab, int n_vocab, const char *source,
                                const cf_item_tfm *tfm, bool train,
                                const cf_image_folder_options *o, cf_dataset **out) {
    *out = NULL;
    uint64_t seed = o->seed;
    /* The size of the images: size, or the first image's. */
    if (!tfm && size == 0 && *w == 0 && it->n > 0) {
        void *data;
        size_t n;
        cf_status st = cf_read_file(it->v[0].path, CF_IMAGE_MAX_FILE, &data, &n);
        if (st) return st;
        st = cf__image_size(data, n, it->v[0].path, w, h);
        if (st) {
            cf_free(data);
            return st;
        }
        cf_free(data);
        if (*w <= 0) return cf_fail(CF_ERR_FORMAT, "%s: cannot read the image size", it->v[0].path);
    }
    int ow = size ? size : (*w > 0 ? *w : 1), oh = size ? size : (*h > 0 ? *h : 1);
    if (tfm) ow = tfm->width, oh = tfm->height;
    uint64_t bytes =
        (uint64_t)it->n * (uint64_t)channels * (uint64_t)oh * (uint64_t)ow * sizeof(float);
    bool stream = o->load == CF_IMAGE_LOAD_STREAM;
    if (o->load == CF_IMAGE_LOAD_AUTO) {
        /* Up front only when the set takes at most the budget and a quarter of what this
         * process may allocate, and no training region is drawn at random: a decoded set would
         * keep epoch 0's RandomResizedCrop for every epoch, where fastai draws one per epoch. */
        stream = bytes > CF_IMAGE_MEMORY_BUDGET || cf_memory_check(bytes * 4, source) != CF_OK ||
                 (train && tfm && tfm->kind == CF_ITEM_TFM_RANDOM_RESIZED_CROP);
        cf_clear_error();
    }
    if (stream) {
        const char **paths = cf_malloc((size_t)(it->n > 0 ? it->n : 1) * sizeof *paths);
        int *labels = cf_malloc((size_t)(it->n > 0 ? it->n : 1) * sizeof *labels);
        cf_status st = paths && labels ? CF_OK : CF_ERR_NOMEM;
        for (int64_t i = 0; i < it->n && !st; i++) {
            paths[i] = it->v[i].path;
            labels[i] = it->v[i].label;
        }
        struct cf_image_files proto = {.channels = channels,
                                       .size = size,
                                       .w = *w,
                                       .h = *h,
                                       .has_tfm = tfm != NULL,
                                       .tfm = tfm ? *tfm : (cf_item_tfm){0},
                                       .train = train,
                                       .seed = seed,
                                       .skip_bad = o->skip_bad,
                                       .decode_threads = o->decode_threads};
        cf_dataset *ds = st ? NULL
                            : cf__dataset_stream_new(it->n, paths, labels, &proto,
                                                     cf_shape_make(3, (int[]){channels, oh, ow}));
        cf_free(paths);
        cf_free(labels);
        if (!ds) return cf_fail_context(CF_ERR_NOMEM, "%s", source);
        ds->n_classes = n_vocab;
        if (!(ds->vocab = cf__strv_dup((const char *const *)vocab, n_vocab)) ||
            !cf__dataset_set_source(ds, source) || cf__dataset_set_item_tfm(ds, tfm)) {
            cf_dataset_free(ds);
            return CF_ERR_NOMEM;
        }
        *out = ds;
        return CF_OK;
    }
    cf_status check = cf_memory_check(bytes, source);
    if (check != CF_OK) return check;
    cf_dataset *ds = cf__dataset_alloc(it->n, cf_shape_make(3, (int[]){channels, oh, ow}), 1);
    if (!ds) return cf_fail_context(CF_ERR_NOMEM, "%s", source);
    size_t per = cf_shape_numel(&ds->sample_shape);
    cf_status st = CF_OK;
    for (int64_t i = 0; i < it->n && !st; i++) {
        void *data;
        size_t n;
        if ((st = cf_read_file(it->v[i].path, CF_IMAGE_MAX_FILE, &data, &n))) break;
        int iw = size ? 0 : *w, ih = size ? 0 : *h;
        st = tfm ? cf_image_decode_tfm(data, n, it->v[i].path, channels, tfm, train, seed, 0, i,
                                       ds->x + (size_t)i * per)
                 : cf_image_decode(data, n, it->v[i].path, channels, size, ds->x + (size_t)i * per,
                                   &iw, &ih);
        cf_free(data);
        ds->y[i] = (float)it->v[i].label;
    }
    if (!st) {
        ds->n_classes = n_vocab;
        if (!(ds->vocab = cf__strv_dup((const char *const *)vocab, n_vocab)) ||
            !cf__dataset_set_source(ds, source) || cf__dataset_set_item_tfm(ds, tfm))
            st = CF_ERR_NOMEM;
    }
    if (st) {
        cf_dataset_free(ds);
        return st;
    }
    *out = ds;
    return CF_OK;
}

cf_status cf__image_sets_build(const cf__image_items *tr, const cf__image_items *va, char **vocab,
                               int n_vocab, const char *train_source, const char *valid_source,
                               const cf_image_folder_options *o, cf_dataset **train,
                               cf_dataset **valid) {
    int w = 0, h = 0;
    *valid = NULL;
    cf_status st = cf__image_items_build(tr, o->channels, o->size, &w, &h, vocab, n_vocab,
                                         train_source, o->item_tfm, true, o, train);
    if (!st)
        st = cf__image_items_build(va, o->channels, o->size, &w, &h, vocab, n_vocab, valid_source,
                                   o->item_tfm, false, o, valid);
    if (st) {
        cf_dataset_free(*train);
        cf_dataset_free(*valid);
        *train = *valid = NULL;
    }
    return st;
}
