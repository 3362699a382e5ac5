/* A bf16 forward of W1 gives each image the same output whatever batch it comes in, whatever
 * batch size the model was planned for and however many threads run it: in eval mode (running
 * BatchNorm statistics) an image's output depends on that image alone, and the kernels' sums run
 * in the same order for every batch. A fit on split batches (test_bf16_par) relies on it. Where
 * the CPU has no bf16 kernels (or CF_ISA caps them) the tests skip: fp32's lowered products group
 * a batch's images side by side, and their sums may round differently per batch size. */
#include "learn_fixture.h"

#include <string.h>

enum { N = 12, HALF = 6, CLASSES = 10, PIXELS = 28 * 28 };

/* The outputs of images [0, n) in batches of bs, in training or eval mode, by a fresh bf16 W1
 * model run on threads threads and planned on its first batch (of plan_bs zero images first
 * when plan_bs > bs). */
static void outputs(int n, int bs, int threads, const float *images, float *out, bool train,
                    int plan_bs) {
    cf_set_num_threads(threads);
    cf_learner *learn = fixture_w1_learner(&(cf_dls *){NULL});
    cf_dls *dls = learn->dls;
    assert_int_equal(cf_learner_to_bf16(learn), CF_OK);
    cf_model_train(learn->model, train);
    if (plan_bs > bs) { /* planned for a larger batch first */
        float *big = calloc((size_t)plan_bs * PIXELS, sizeof(float));
        int dims[4] = {plan_bs, 1, 28, 28};
        const cf_tensor x = {.data = big, .shape = cf_shape_make(4, dims)};
        const cf_tensor *y = NULL;
        assert_int_equal(cf_model_forward(learn->model, &x, &y), CF_OK);
        free(big);
    }
    for (int b0 = 0; b0 < n; b0 += bs) {
        int dims[4] = {bs, 1, 28, 28};
        const cf_tensor x = {.data = (float *)images + (size_t)b0 * PIXELS,
                             .shape = cf_shape_make(4, dims)};
        const cf_tensor *y = NULL;
        if (cf_model_forward(learn->model, &x, &y) != CF_OK) fail_msg("%s", cf_last_error());
        assert_int_equal(cf_tensor_numel(y), bs * CLASSES);
        memcpy(out + (size_t)b0 * CLASSES, y->data, (size_t)bs * CLASSES * sizeof(float));
    }
    cf_learner_free(learn);
    cf_dls_free(dls);
    cf_set_num_threads(0);
}

static void expect_same(const char *what, const float *a, const float *b, int n) {
    for (int i = 0; i < n * CLASSES; i++)
        if (a[i] != b[i])
            fail_msg("%s: image %d, class %d: %.9g against %.9g", what, i / CLASSES, i % CLASSES,
                     a[i], b[i]);
}

static void test_forward_independent_of_batch_and_threads(void **state) {
    (void)state;
    if (!cf_bf16_compute()) skip();
    static float images[N * PIXELS], whole[N * CLASSES], halves[N * CLASSES],
        one_thread[N * CLASSES], halves_one[N * CLASSES];
    fill_uniform(images, N * PIXELS, 17, -1, 1);
    outputs(N, N, 2, images, whole, false, 0);
    outputs(N, HALF, 2, images, halves, false, 0);
    outputs(N, N, 1, images, one_thread, false, 0);
    outputs(N, HALF, 1, images, halves_one, false, 0);
    expect_same("batches of 6 against one of 12", halves, whole, N);
    expect_same("one thread against two", one_thread, whole, N);
    expect_same("batches of 6 on one thread against 12 on two", halves_one, whole, N);
}

/* Training mode (batch statistics): the same batch on one thread or two, and half a batch in a
 * model planned for a whole one or for the half. */
static void test_train_forward(void **state) {
    (void)state;
    if (!cf_bf16_compute()) skip();
    static float images[N * PIXELS], a[N * CLASSES], b[N * CLASSES];
    fill_uniform(images, N * PIXELS, 17, -1, 1);
    outputs(N, N, 2, images, a, true, 0);
    outputs(N, N, 1, images, b, true, 0);
    expect_same("train: one thread against two", b, a, N);
    outputs(HALF, HALF, 1, images, a, true, 0);
    outputs(HALF, HALF, 1, images, b, true, N);
    expect_same("train: planned at 12 against 6", b, a, HALF);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_independent_of_batch_and_threads),
        cmocka_unit_test(test_train_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
