/* fastai's DataLoaders: a training loader (shuffled, drop_last, augmented) and a validation
 * loader (in order, kept whole) over datasets the object owns. */
#include "data_internal.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

void cf_dls_free(cf_dls *dls) {
    if (!dls) return;
    cf_dataloader_free(dls->train);
    cf_dataloader_free(dls->valid);
    cf_dataset_free(dls->train_ds);
    cf_dataset_free(dls->valid_ds);
    if (dls->free_text_nz) dls->free_text_nz(dls->text_nz);
    cf_free(dls);
}

cf_status cf_dataset_keep_first(cf_dataset **ds, int64_t n) {
    if (n <= 0 || n >= (*ds)->n) return CF_OK;
    int64_t *idx = cf_malloc((size_t)n * sizeof *idx);
    if (!idx) return CF_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    cf_dataset *sub = NULL;
    cf_status st = cf_dataset_subset(*ds, idx, n, &sub);
    cf_free(idx);
    if (st) return st;
    cf_dataset_free(*ds);
    *ds = sub;
    return CF_OK;
}

cf_status cf_dls_new(cf_dataset *train, cf_dataset *valid, const cf_dls_options *opt,
                     cf_dls **out) {
    if (out) *out = NULL;
    cf_dls_options o = opt ? *opt : (cf_dls_options){0};
    cf_status st = CF_OK;
    char a[64], b[64];
    if (!out || !train || !valid) {
        st = cf_fail(CF_ERR_INVALID, "cf_dls_new: NULL dataset or out");
        goto fail;
    }
    if (!cf_shape_equal(&train->sample_shape, &valid->sample_shape) ||
        train->target_dim != valid->target_dim) {
        st = cf_fail(CF_ERR_INVALID,
                     "cf_dls_new: training samples %s (%d targets) and validation samples %s (%d "
                     "targets) differ",
                     cf_shape_str(&train->sample_shape, a, sizeof a), train->target_dim,
                     cf_shape_str(&valid->sample_shape, b, sizeof b), valid->target_dim);
        goto fail;
    }
    if (o.n_train < 0 || o.n_valid < 0) {
        st = cf_fail(CF_ERR_INVALID, "cf_dls_new: n_train %lld and n_valid %lld must be >= 0",
                     (long long)o.n_train, (long long)o.n_valid);
        goto fail;
    }
    if ((st = cf_dataset_keep_first(&train, o.n_train)) ||
        (st = cf_dataset_keep_first(&valid, o.n_valid)))
        goto fail;
    if (o.bs == 0) o.bs = 64;
    if (o.val_bs == 0) o.val_bs = o.bs;
    cf_dl_options to = {.bs = o.bs,
                        .shuffle = true,
                        .drop_last = true,
                        .seed = o.seed,
                        .crop_pad = o.crop_pad,
                        .flip = o.flip,
                        .prefetch = o.prefetch,
                        .aug = o.aug};
    if (o.n_norm > 0) {
        if (o.n_norm > 4) {
            st = cf_fail(CF_ERR_INVALID, "cf_dls_new: n_norm %d above 4", o.n_norm);
            goto fail;
        }
        to.n_norm = o.n_norm;
        memcpy(to.mean, o.mean, sizeof to.mean);
        memcpy(to.std, o.std, sizeof to.std);
    } else if (o.normalize) {
        if (train->sample_shape.ndim != 3) {
            st = cf_fail(CF_ERR_INVALID, "cf_dls_new: normalize needs image samples (C, H, W)");
            goto fail;
        }
        to.n_norm = train->sample_shape.dim[0];
        if ((st = cf_dataset_channel_stats(train, to.mean, to.std))) goto fail;
    }
    cf_dl_options vo = {
        .bs = o.val_bs, .seed = o.seed, .n_norm = to.n_norm, .prefetch = o.prefetch};
    memcpy(vo.mean, to.mean, sizeof vo.mean);
    memcpy(vo.std, to.std, sizeof vo.std);
    cf_dls *dls = cf_calloc(1, sizeof *dls);
    if (!dls) {
        st = CF_ERR_NOMEM;
        goto fail;
    }
    dls->train_ds = train;
    dls->valid_ds = valid;
    if ((st = cf_dataloader_new(train, &to, &dls->train)) ||
        (st = cf_dataloader_new(valid, &vo, &dls->valid))) {
        cf_dls_free(dls);
        return st;
    }
    *out = dls;
    return CF_OK;
fail:
    cf_dataset_free(train);
    cf_dataset_free(valid);
    return st;
}

/* dir/<prefix>-<kind>-idx<d>-ubyte.gz, or without .gz. */
static cf_status find_idx(const char *dir, const char *prefix, const char *kind, int d, char *path,
                          size_t size) {
    struct stat sb;
    snprintf(path, size, "%s/%s-%s-idx%d-ubyte.gz", dir, prefix, kind, d);
    if (stat(path, &sb) == 0) return CF_OK;
    snprintf(path, size, "%s/%s-%s-idx%d-ubyte", dir, prefix, kind, d);
    if (stat(path, &sb) == 0) return CF_OK;
    return cf_fail(CF_ERR_IO, "no %s-%s-idx%d-ubyte(.gz) in %s", prefix, kind, d, dir);
}

const char *const cf_fashion_mnist_classes[10] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                  "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                  "Bag",         "Ankle boot"};

/* Fashion-MNIST's class names for a 10-class data set from a folder named like it (the IDX
 * files hold only label numbers). */
static cf_status name_fashion_mnist(const char *dir, cf_dataset *ds) {
    bool fashion = false;
    for (const char *p = dir; *p && !fashion; p++) fashion = strncasecmp(p, "fashion", 7) == 0;
    if (!fashion || ds->n_classes != 10) return CF_OK;
    cf__strv_free(ds->vocab, ds->n_classes);
    ds->vocab = NULL;
    return cf_dataset_set_vocab(ds, cf_fashion_mnist_classes, 10);
}

cf_status cf_dls_from_idx_dir(const char *dir, const cf_dls_options *opt, cf_dls **out) {
    if (!out || !dir) return cf_fail(CF_ERR_INVALID, "cf_dls_from_idx_dir: NULL argument");
    *out = NULL;
    char ti[4096], tl[4096], vi[4096], vl[4096];
    cf_status st;
    if ((st = find_idx(dir, "train", "images", 3, ti, sizeof ti)) ||
        (st = find_idx(dir, "train", "labels", 1, tl, sizeof tl)) ||
        (st = find_idx(dir, "t10k", "images", 3, vi, sizeof vi)) ||
        (st = find_idx(dir, "t10k", "labels", 1, vl, sizeof vl)))
        return st;
    cf_dataset *train = NULL, *valid = NULL;
    if ((st = cf_dataset_from_idx(ti, tl, &train))) return st;
    if ((st = cf_dataset_from_idx(vi, vl, &valid))) {
        cf_dataset_free(train);
        return st;
    }
    if ((st = name_fashion_mnist(dir, train)) || (st = name_fashion_mnist(dir, valid))) {
        cf_dataset_free(train);
        cf_dataset_free(valid);
        return st;
    }
    if (valid->n_classes < train->n_classes) {
        /* The vocabulary comes from the training set. */
        cf__strv_free(valid->vocab, valid->n_classes);
        valid->vocab = NULL;
        valid->n_classes = train->n_classes;
        if (cf_dataset_set_vocab(valid, (const char *const *)train->vocab, train->n_classes)) {
            cf_dataset_free(train);
            cf_dataset_free(valid);
            return CF_ERR_NOMEM;
        }
    }
    return cf_dls_new(train, valid, opt, out);
}

cf_status cf_dls_from_image_folder(const char *root, const cf_image_folder_options *iopt,
                                   const cf_dls_options *opt, cf_dls **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dls_from_image_folder: out is NULL");
    *out = NULL;
    cf_dataset *train, *valid;
    cf_status st = cf_datasets_from_image_folder(root, iopt, &train, &valid);
    if (st) return st;
    return cf_dls_new(train, valid, opt, out);
}

cf_status cf_dls_from_csv(const char *path, const cf_tabular_options *topt,
                          const cf_dls_options *opt, cf_dls **out) {
    if (!out) return cf_fail(CF_ERR_INVALID, "cf_dls_from_csv: out is NULL");
    *out = NULL;
    cf_dataset *train, *valid;
    cf_status st = cf_tabular_from_csv(path, topt, &train, &valid);
    if (st) return st;
    cf_dls_options o = opt ? *opt : (cf_dls_options){0};
    o.crop_pad = 0;
    o.flip = false;
    o.aug = NULL;
    o.normalize = false;
    o.n_norm = 0;
    return cf_dls_new(train, valid, &o, out);
}
