/* The W1 model (the mini-resnet benchmark workload) assembled from corefit modules, against the
 * same model in PyTorch (tests/oracle/w1.py) with PyTorch's weights copied in by state_dict name:
 * logits, cross-entropy loss, the gradient of every parameter and the BatchNorm buffers after one
 * training step on a batch of 16 random images, then the same in eval mode.
 *
 * Dropout is built with p = 0 for the training comparison (its masks cannot match PyTorch's);
 * eval mode runs a second corefit model with W1's p = 0.25 / 0.5 and the first model's state,
 * since dropout is the identity in eval.
 *
 * Tolerance: rtol 1e-4 with an absolute floor of 1e-5 of each tensor's largest value, as the
 * single-layer tests (checked with the AVX-512 kernels, the portable path and Haswell OpenBLAS
 * kernels); it does not hold at 1e-5 / 1e-6: errors grow through 9 convolutions, 6 BatchNorms
 * and 2 Linear layers, and BatchNorm's backward through batch statistics cancels large terms. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"

#define SEED 1234
#define BATCH 16

static void check(const char *what, const float *a, const float *b, size_t n) {
    double mx = 1e-30;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    assert_close(what, a, b, n, 1e-4, 1e-5 * mx);
}

static cf_module *block(int ni, int nf) {
    cf_module *convpath[] = {cf_conv2d(ni, nf, 3, 2, 1, false), cf_batchnorm2d(nf), cf_relu(),
                             cf_conv2d(nf, nf, 3, 1, 1, false), cf_batchnorm2d(nf)};
    cf_module *idpath[] = {cf_conv2d(ni, nf, 1, 2, 0, false), cf_batchnorm2d(nf)};
    return cf_residual(cf_sequential(5, convpath), cf_sequential(2, idpath), true);
}

static cf_module *w1_model(float p1, float p2) {
    cf_module *layers[] = {cf_conv2d(1, 16, 3, 1, 1, false),
                           cf_batchnorm2d(16),
                           cf_relu(),
                           block(16, 32),
                           block(32, 64),
                           cf_adaptive_concat_pool2d(),
                           cf_flatten(),
                           cf_batchnorm1d(128),
                           cf_dropout(p1),
                           cf_linear(128, 256, false),
                           cf_relu(),
                           cf_batchnorm1d(256),
                           cf_dropout(p2),
                           cf_linear(256, 10, false)};
    return cf_sequential((int)(sizeof layers / sizeof layers[0]), layers);
}

/* Forward, mean cross-entropy and backward; returns the loss, copies the logits. */
static float step(cf_model *model, const cf_tensor *x, const cf_tensor *target, float *logits) {
    const cf_tensor *y;
    assert_int_equal(cf_model_forward(model, x, &y), CF_OK);
    assert_int_equal(y->shape.ndim, 2);
    assert_int_equal(y->shape.dim[0], BATCH);
    assert_int_equal(y->shape.dim[1], 10);
    memcpy(logits, y->data, BATCH * 10 * sizeof(float));
    cf_loss ce = {.kind = CF_LOSS_CROSS_ENTROPY, .label_smoothing = 0.0f};
    float loss, dlogits[BATCH * 10];
    assert_int_equal(cf_loss_forward(&ce, y, target, &loss, NULL), CF_OK);
    cf_tensor dy = cf_tensor_view(dlogits, y->shape);
    cf_loss_backward(&ce, y, target, &dy);
    cf_model_zero_grad(model);
    assert_int_equal(cf_model_backward(model, &dy), CF_OK);
    return loss;
}

static void compare_grads(oracle *o, cf_model *model, const char *prefix, const char *mode) {
    char name[256], what[300];
    for (int j = 0; j < model->n_params; j++) {
        cf_param *p = model->params[j];
        bool buffer = p->grad == NULL;
        if (buffer && strcmp(prefix, "g_") != 0) continue;
        snprintf(name, sizeof name, "%s%s", buffer ? "s_" : prefix, p->full_name);
        cf_tensor ref = oracle_get(o, name);
        assert_int_equal(cf_tensor_numel(&ref), p->numel);
        snprintf(what, sizeof what, "%s: %s %s", mode, buffer ? "buffer" : "gradient of",
                 p->full_name);
        check(what, buffer ? p->data : p->grad, ref.data, p->numel);
        free(ref.data);
    }
}

static void test_w1_matches_pytorch(void **state) {
    (void)state;
    oracle o;
    oracle_init(&o);
    cf_model *train, *eval;
    assert_int_equal(cf_model_new(&train, w1_model(0.0f, 0.0f), 1), CF_OK);
    assert_int_equal(cf_model_new(&eval, w1_model(0.25f, 0.5f), 2), CF_OK);
    cf_shape xs = cf_shape4(BATCH, 1, 28, 28);
    size_t nx = cf_shape_numel(&xs);
    float *x = malloc(nx * sizeof(float)), target[BATCH];
    fill_uniform(x, nx, 5, -0.8f, 2.0f); /* about the range of normalised Fashion-MNIST */
    fill_uniform(target, BATCH, 6, 0, 1);
    for (int i = 0; i < BATCH; i++) target[i] = floorf(target[i] * 9.999f);
    oracle_put(&o, "x", x, xs);
    oracle_put(&o, "target", target, cf_shape1(BATCH));
    char args[64];
    snprintf(args, sizeof args, "%d 0 0", SEED);
    oracle_run(&o, "w1.py", args);

    /* same parameter set and names: as many entries, each name found */
    cf_tensor n_state = oracle_get(&o, "n_state");
    assert_int_equal((int)n_state.data[0], train->n_params);
    free(n_state.data);
    char name[256];
    for (int j = 0; j < train->n_params; j++) {
        cf_param *p = train->params[j];
        snprintf(name, sizeof name, "p_%s", p->full_name);
        cf_tensor w = oracle_get(&o, name);
        assert_int_equal(cf_tensor_numel(&w), p->numel);
        memcpy(p->data, w.data, p->numel * sizeof(float));
        free(w.data);
    }
    assert_non_null(cf_model_param(train, "3.convpath.0.weight"));
    assert_non_null(cf_model_param(train, "4.idpath.1.num_batches_tracked"));
    assert_non_null(cf_model_param(train, "13.weight"));

    cf_tensor tx = cf_tensor_view(x, xs), tt = cf_tensor_view(target, cf_shape1(BATCH));
    float logits[BATCH * 10];
    cf_model_train(train, true);
    float loss = step(train, &tx, &tt, logits);
    cf_tensor ref = oracle_get(&o, "train_logits");
    check("train: logits", logits, ref.data, BATCH * 10);
    free(ref.data);
    ref = oracle_get(&o, "train_loss");
    check("train: loss", &loss, ref.data, 1);
    free(ref.data);
    compare_grads(&o, train, "g_", "train");
    /* the input gradients and the convolutions' per-call buffers share the arena's transient
     * pool: a few of the widest gradients (the stem's, 16 x 28 x 28 per image) and one layer's
     * buffers are live at once, not one of each per layer */
    const size_t widest = (size_t)BATCH * 16 * 28 * 28 * sizeof(float);
    print_message("transient pool: %.2f MB reserved, %.2f MB touched\n",
                  train->arena.pool_capacity / 1e6, train->arena.pool_high / 1e6);
    assert_true(train->arena.pool_capacity > 10 * widest);
    assert_true(train->arena.pool_high <= 5 * widest);

    /* eval on a model with W1's dropout, from the trained state (running statistics moved) */
    assert_int_equal(cf_model_copy_state(eval, train), CF_OK);
    cf_model_train(eval, false);
    loss = step(eval, &tx, &tt, logits);
    ref = oracle_get(&o, "eval_logits");
    check("eval: logits", logits, ref.data, BATCH * 10);
    free(ref.data);
    ref = oracle_get(&o, "eval_loss");
    check("eval: loss", &loss, ref.data, 1);
    free(ref.data);
    compare_grads(&o, eval, "eg_", "eval");

    cf_model_free(train);
    cf_model_free(eval);
    free(x);
    oracle_cleanup(&o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_w1_matches_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
