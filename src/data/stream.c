/* Streamed image sets: the file names and labels of an image folder or an image CSV, decoded one
 * sample at a time when a loader needs it (the loader's decoding threads are in loader.c). */
#include "data_internal.h"

#include <stdio.h>
#include <string.h>

void cf__image_files_free(struct cf_image_files *f) {
    if (!f) return;
    if (f->paths)
        for (int64_t i = 0; i < f->n; i++) cf_free(f->paths[i]);
    cf_free(f->paths);
    cf_free((void *)f->bad);
    cf_free(f);
}

/* A new set of n files with proto's decoding fields and no paths yet. */
static struct cf_image_files *files_alloc(int64_t n, const struct cf_image_files *proto) {
    struct cf_image_files *f = cf_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->n = n;
    f->channels = proto->channels;
    f->size = proto->size;
    f->w = proto->w;
    f->h = proto->h;
    f->has_tfm = proto->has_tfm;
    f->tfm = proto->tfm;
    f->train = proto->train;
    f->seed = proto->seed;
    f->skip_bad = proto->skip_bad;
    f->decode_threads = proto->decode_threads;
    atomic_init(&f->n_bad, 0);
    f->paths = cf_calloc((size_t)(n > 0 ? n : 1), sizeof *f->paths);
    f->bad = cf_calloc((size_t)(n > 0 ? n : 1), sizeof *f->bad);
    if (!f->paths || !f->bad) {
        cf__image_files_free(f);
        return NULL;
    }
    return f;
}

struct cf_image_files *cf__image_files_subset(const struct cf_image_files *f, const int64_t *idx,
                                              int64_t n) {
    struct cf_image_files *s = files_alloc(n, f);
    if (!s) return NULL;
    for (int64_t i = 0; i < n; i++)
        if (!(s->paths[i] = cf_strdup(f->paths[idx[i]]))) {
            cf__image_files_free(s);
            return NULL;
        }
    return s;
}

cf_dataset *cf__dataset_stream_new(int64_t n, const char *const *paths, const int *labels,
                                   const struct cf_image_files *proto, cf_shape shape) {
    char buf[64];
    if (n < 0 || shape.ndim != 3) {
        cf_fail(CF_ERR_INVALID, "streamed image set of %lld samples of shape %s", (long long)n,
                cf_shape_str(&shape, buf, sizeof buf));
        return NULL;
    }
    cf_dataset *ds = cf_calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->n = n;
    ds->sample_shape = shape;
    ds->target_dim = 1;
    ds->y = cf_calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    ds->files = files_alloc(n, proto);
    ds->samples = &cf__image_files_samples;
    bool ok = ds->y && ds->files && cf__dataset_set_source(ds, "");
    for (int64_t i = 0; ok && i < n; i++) {
        ok = (ds->files->paths[i] = cf_strdup(paths[i])) != NULL;
        ds->y[i] = (float)labels[i];
    }
    if (!ok) {
        cf_dataset_free(ds);
        cf_fail(CF_ERR_NOMEM, "out of memory for a streamed set of %lld images", (long long)n);
        return NULL;
    }
    return ds;
}

cf_status cf__image_files_decode(const struct cf_image_files *f, int64_t i, int epoch, float *out) {
    const char *path = f->paths[i];
    void *data = NULL;
    size_t n = 0;
    cf_status st = cf_read_file(path, CF_IMAGE_MAX_FILE, &data, &n);
    if (st != CF_OK) return st;
    if (f->has_tfm) {
        st = cf_image_decode_tfm(data, n, path, f->channels, &f->tfm, f->train, f->seed,
                                 f->train ? epoch : 0, i, out);
    } else {
        int w = f->size ? 0 : f->w, h = f->size ? 0 : f->h;
        st = cf_image_decode(data, n, path, f->channels, f->size, out, &w, &h);
    }
    cf_free(data);
    return st;
}

bool cf__image_files_mark_bad(struct cf_image_files *f, int64_t i) {
    if (atomic_exchange(&f->bad[i], 1)) return false;
    atomic_fetch_add(&f->n_bad, 1);
    return true;
}

bool cf_dataset_is_streamed(const cf_dataset *ds) {
    return ds && ds->files;
}

int64_t cf_dataset_skipped(const cf_dataset *ds) {
    return ds && ds->files ? (int64_t)atomic_load(&ds->files->n_bad) : 0;
}

const char *cf_dataset_file(const cf_dataset *ds, int64_t i) {
    if (!ds || !ds->files || i < 0 || i >= ds->files->n) return NULL;
    return ds->files->paths[i];
}

/* ---- the sample source ---------------------------------------------------------------------- */

static cf_status files_get(const cf_dataset *ds, int64_t i, int epoch, bool plain, float *out,
                           bool *skipped) {
    struct cf_image_files probe = *ds->files;
    if (plain) probe.train = false; /* validation's deterministic item transform */
    cf_status st = cf__image_files_decode(&probe, i, epoch, out);
    if (st && skipped &&
        ds->files->skip_bad) { /* bad files are passed over when the set skips them */
        cf__image_files_mark_bad(ds->files, i);
        *skipped = true;
        return CF_OK;
    }
    return st;
}

static cf_status files_subset(const cf_dataset *ds, const int64_t *idx, int64_t n,
                              cf_dataset **out) {
    cf_dataset *sub = cf_calloc(1, sizeof *sub);
    if (!sub) return cf_fail(CF_ERR_NOMEM, "cf_dataset_subset: out of memory");
    sub->n = n;
    sub->sample_shape = ds->sample_shape;
    sub->target_dim = ds->target_dim;
    sub->samples = ds->samples;
    sub->y = cf_calloc((size_t)(n > 0 ? n : 1) * (size_t)ds->target_dim, sizeof(float));
    sub->files = cf__image_files_subset(ds->files, idx, n);
    if (!sub->y || !sub->files) {
        cf_dataset_free(sub);
        return cf_fail(CF_ERR_NOMEM, "cf_dataset_subset: out of memory");
    }
    *out = sub;
    return CF_OK;
}

static void files_free(cf_dataset *ds) {
    cf__image_files_free(ds->files);
    ds->files = NULL;
}

const cf_sample_ops cf__image_files_samples = {files_get, files_subset, files_free};
