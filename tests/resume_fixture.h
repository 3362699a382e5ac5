/* The exact-resume fixture that test_resume_exact.c (one process and fork workers) and
 * mpi_resume.c (under mpirun, without cmocka) share: small random images, a learner with
 * BatchNorm, dropout and augmentation on, and a callback that asks for a stop after a given
 * batch. The makers return NULL on failure, with cf_last_error() saying why. */
#ifndef CF_TEST_RESUME_FIXTURE_H
#define CF_TEST_RESUME_FIXTURE_H

#include <stdlib.h>

#include "corefit/learn.h"

enum { RESUME_N_EPOCH = 2, RESUME_SIDE = 8 };

/* n random 1 x 8 x 8 images, 3 classes by the sign of two pixel sums. */
static inline cf_dataset *resume_images(int64_t n, uint64_t seed) {
    const size_t per = RESUME_SIDE * RESUME_SIDE;
    float *x = malloc((size_t)n * per * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    cf_dataset *ds = NULL;
    if (x && y) {
        cf_rng rng;
        cf_rng_seed(&rng, seed);
        for (size_t i = 0; i < (size_t)n * per; i++) x[i] = (float)cf_rng_uniform(&rng);
        for (int64_t i = 0; i < n; i++) {
            const float *r = x + i * per;
            float a = r[0] + r[9] - r[18] - r[27], b = r[36] - r[45];
            y[i] = a > 0 ? 0 : (b > 0 ? 1 : 2);
        }
        cf_shape shape = {3, {1, RESUME_SIDE, RESUME_SIDE}};
        if (cf_dataset_from_arrays(x, y, n, shape, 1, 3, &ds) != CF_OK) ds = NULL;
    }
    free(x);
    free(y);
    return ds;
}

/* 96 training and 24 validation images in batches of 8, with a random crop, flips and fastai's
 * batch transforms (aug: kept by the loaders, so it must outlive them). */
static inline cf_dls *resume_dls(cf_aug_opts *aug) {
    *aug = cf_aug_transforms_defaults(1.0f);
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = 8, .seed = 11, .crop_pad = 1, .flip = true, .aug = aug};
    cf_dataset *train = resume_images(96, 1), *valid = resume_images(24, 2);
    if (!train || !valid) {
        cf_dataset_free(train);
        cf_dataset_free(valid);
        return NULL;
    }
    return cf_dls_new(train, valid, &o, &dls) == CF_OK ? dls : NULL;
}

/* Conv -> BatchNorm2d -> ReLU -> Flatten -> Dropout(0.3) -> Linear, accuracy, wd 0.05. */
static inline cf_learner *resume_learner(cf_dls *dls, uint64_t seed, const char *path) {
    cf_module *layers[] = {cf_conv2d(1, 4, 3, 1, 1, false),
                           cf_batchnorm2d(4),
                           cf_relu(),
                           cf_flatten(),
                           cf_dropout(0.3f),
                           cf_linear(4 * RESUME_SIDE * RESUME_SIDE, 3, true)};
    cf_model *m = NULL;
    cf_learner *learn = NULL;
    cf_metric *metrics[] = {cf_accuracy()};
    if (cf_model_new(&m, cf_sequential(6, layers), seed) != CF_OK) return NULL;
    if (cf_learner_new(&learn, dls, m, .quiet = true, .path = path, .metrics = metrics,
                       .n_metrics = 1, .wd = 0.05) != CF_OK)
        return NULL;
    return learn;
}

static inline cf_status resume_request_at(cf_callback *cb, cf_learner *learn) {
    if (learn->training && learn->train_iter == *(int64_t *)cb->state) cf_checkpoint_request();
    return CF_OK;
}

/* Asks for a stop after training batch `at` of the fit (counted from 1; -1: never), as a
 * SIGTERM would. */
static inline cf_callback *resume_request_cb(int64_t at) {
    cf_callback *cb = cf_callback_new("RequestStop", 0, sizeof(int64_t));
    if (!cb) return NULL;
    *(int64_t *)cb->state = at;
    cb->on[CF_EV_AFTER_BATCH] = resume_request_at;
    return cb;
}

#endif
