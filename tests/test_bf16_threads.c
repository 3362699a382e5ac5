/* bf16 Conv2d layers on 3 threads and batches that do not divide among them: the forward pass
 * and dx are bitwise the one-thread results (docs/api.md: they do not depend on how a batch is
 * split over threads), dW within fp32 summation error of them (per-thread partial sums are
 * added in another grouping; 1e-3 of sums of up to 5,000 terms of magnitude 2). The layers: a 3x3
 * stride-1 layer that takes the bf16 Winograd, one on small planes (the gathered taps), a stride-2
 * one and a 1x1 stride-2 shortcut (the implicit bf16 kernels), at the best level and, in the
 * _amx_emul build, at the emulated amx level. Below avx512_bf16 the same layers run in fp32 and are
 * checked the same way. */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/nn.h"

typedef struct lcase {
    int n, c, h, w, o, k, stride;
} lcase;

typedef struct out {
    float *y, *dx, *dw;
} out;

static out passes(const lcase *lc, int threads, const float *x, const float *dy) {
    cf_set_num_threads(threads);
    cf_model *model;
    const int pad = (lc->k - 1) / 2;
    assert_int_equal(
        cf_model_new(&model, cf_conv2d(lc->c, lc->o, lc->k, lc->stride, pad, false), 3), CF_OK);
    assert_int_equal(cf_conv_set_bf16(model->root, true), 1);
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    const cf_tensor tx = cf_tensor_view((float *)x, cf_shape4(lc->n, lc->c, lc->h, lc->w));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    const size_t ny = cf_tensor_numel(ty), nx = cf_tensor_numel(&tx),
                 nw = (size_t)lc->o * lc->c * lc->k * lc->k;
    out r = {malloc(ny * 4), malloc(nx * 4), malloc(nw * 4)};
    memcpy(r.y, ty->data, ny * 4);
    const cf_tensor tdy = cf_tensor_view((float *)dy, ty->shape);
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, true);
    assert_non_null(tdx);
    memcpy(r.dx, tdx->data, nx * 4);
    memcpy(r.dw, cf_model_param(model, "weight")->grad, nw * 4);
    cf_model_free(model);
    cf_set_num_threads(0);
    return r;
}

static void test_three_threads(void **state) {
    (void)state;
    static const lcase cases[] = {
        {7, 16, 28, 28, 24, 3, 1}, /* Winograd (bf16 products where the level has them) */
        {5, 19, 27, 29, 21, 3, 1}, /* Winograd, odd sizes and channels */
        {7, 128, 4, 4, 130, 3, 1}, /* small planes: the gathered taps */
        {5, 130, 6, 6, 128, 3, 2}, /* small planes, stride 2 */
        {4, 16, 14, 14, 32, 3, 2}, /* stride 2, implicit bf16 */
        {5, 32, 14, 14, 64, 1, 2}, /* a 1x1 stride-2 shortcut */
        {2, 24, 10, 10, 24, 3, 1}, /* fewer images than threads */
    };
    printf("kernels %s, bf16 compute %s\n", cf_isa_name(cf_isa_active()),
           cf_bf16_compute() ? "yes" : "no");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const lcase *lc = &cases[i];
        const int pad = (lc->k - 1) / 2, oh = (lc->h + 2 * pad - lc->k) / lc->stride + 1,
                  ow = (lc->w + 2 * pad - lc->k) / lc->stride + 1;
        const size_t nx = (size_t)lc->n * lc->c * lc->h * lc->w,
                     ny = (size_t)lc->n * lc->o * oh * ow,
                     nw = (size_t)lc->o * lc->c * lc->k * lc->k;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4);
        fill_uniform(x, nx, 70 + i, -2, 2);
        fill_uniform(dy, ny, 80 + i, -1, 1);
        out one = passes(lc, 1, x, dy), three = passes(lc, 3, x, dy);
        char what[128];
        snprintf(what, sizeof what, "case %zu (%d, %d -> %d, %dx%d, k %d, stride %d)", i, lc->n,
                 lc->c, lc->o, lc->h, lc->w, lc->k, lc->stride);
        if (memcmp(one.y, three.y, ny * 4)) fail_msg("%s: output differs on 3 threads", what);
        if (memcmp(one.dx, three.dx, nx * 4)) fail_msg("%s: dx differs on 3 threads", what);
        assert_close(what, three.dw, one.dw, nw, 1e-4, 1e-3); /* sums of ~5000 terms */
        free(one.y), free(one.dx), free(one.dw), free(three.y), free(three.dx), free(three.dw);
        free(x), free(dy);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
