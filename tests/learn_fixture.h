/* A tiny classification problem and model for learner tests. */
#ifndef CF_TEST_LEARN_FIXTURE_H
#define CF_TEST_LEARN_FIXTURE_H

#include "corefit/learn.h"
#include "oracle.h"

/* n samples of 4 features, 3 classes separable by a random linear map. */
static inline cf_dataset *fixture_dataset(int64_t n, uint64_t seed) {
    float *x = malloc((size_t)n * 4 * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    fill_uniform(x, (size_t)n * 4, seed, -1, 1);
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * 4;
        float s0 = r[0] + 0.5f * r[1], s1 = r[2] - r[3], s2 = 0.3f * r[1] + r[3];
        y[i] = s0 > s1 ? (s0 > s2 ? 0 : 2) : (s1 > s2 ? 1 : 2);
    }
    cf_dataset *ds = NULL;
    assert_int_equal(cf_dataset_from_arrays(x, y, n, cf_shape1(4), 1, 3, &ds), CF_OK);
    free(x);
    free(y);
    return ds;
}

static inline cf_dls *fixture_dls(int64_t n_train, int64_t n_valid, int bs) {
    cf_dls *dls = NULL;
    cf_dls_options o = {.bs = bs, .seed = 7};
    assert_int_equal(cf_dls_new(fixture_dataset(n_train, 1), fixture_dataset(n_valid, 2), &o, &dls),
                     CF_OK);
    return dls;
}

/* Linear(4,8) -> ReLU -> Linear(8,3); with two_groups the last layer is group 1. */
static inline cf_model *fixture_model(uint64_t seed, bool two_groups) {
    cf_module *layers[] = {cf_linear(4, 8, true), cf_relu(), cf_linear(8, 3, true)};
    cf_module *last = layers[2];
    cf_model *m = NULL;
    assert_int_equal(cf_model_new(&m, cf_sequential(3, layers), seed), CF_OK);
    if (two_groups) assert_int_equal(cf_model_set_group(m, last, 1), CF_OK);
    return m;
}

/* W1's model (mini-resnet) on 60 random 28x28 images of 10 classes (48 to train, 12 to
 * validate), batches of 12; its head's dropout off (masks are drawn per process, so with dropout
 * no two process counts agree, BatchNorm or not). *dls gets the loaders. */
static inline cf_learner *fixture_w1_learner(cf_dls **dls) {
    float *x = malloc(60 * 28 * 28 * sizeof(float)), y[60];
    fill_uniform(x, 60 * 28 * 28, 3, -1, 1);
    for (int i = 0; i < 60; i++) y[i] = (float)((i * 7) % 10);
    cf_dataset *tr = NULL, *va = NULL;
    int dims[3] = {1, 28, 28};
    assert_int_equal(cf_dataset_from_arrays(x, y, 48, cf_shape_make(3, dims), 1, 10, &tr), CF_OK);
    assert_int_equal(
        cf_dataset_from_arrays(x + 48 * 28 * 28, y + 48, 12, cf_shape_make(3, dims), 1, 10, &va),
        CF_OK);
    free(x);
    assert_int_equal(cf_dls_new(tr, va, &(cf_dls_options){.bs = 12, .seed = 9}, dls), CF_OK);
    cf_metric *metrics[] = {cf_accuracy()};
    cf_learner *learn = NULL;
    assert_int_equal(cf_vision_learner(&learn, *dls, CF_ARCH_MINI_RESNET, .quiet = true,
                                       .metrics = metrics, .n_metrics = 1, .seed = 5, .n_ps = 2,
                                       .ps = {0, 0}),
                     CF_OK);
    return learn;
}

#endif
