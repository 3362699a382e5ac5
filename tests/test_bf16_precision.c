/* Which Conv2d layers compute in bf16 under mixed precision (cf_conv_bf16_precision, tensor.h):
 *
 * - the rule on shapes: W1's and W3's layers and the edges of the rule (7 and 8 input channels,
 *   63 and 64 weights per output, a stem shape at stride 1), the same answer on every level;
 * - Conv2d layers switched to bf16 (cf_conv_set_bf16): a layer the rule keeps in fp32 (W1's gray
 *   3x3 stem, an RGB 3x3 layer) gives the fp32 layer's output and gradients bit for bit; a bf16
 *   one (W1's first block conv and its 1x1 stride-2 shortcut, W3's RGB 7x7 stem) differs from
 *   fp32 where the level computes in bf16 (cf_bf16_compute()) and equals it where it does not.
 * Run at the best level, capped at avx512_bf16, avx512, avx2 and generic, and over the amx
 * emulation. */
#include "oracle.h"

#include "corefit/nn.h"
#include "corefit/tensor.h"

#include <stdio.h>
#include <string.h>

static cf_conv_geom geom(int c, int hw, int k, int stride, int pad) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, hw, hw, k, k, stride, stride, pad, pad));
    return g;
}

static void test_rule(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int c, out, hw, k, stride, pad;
        cf_conv_precision want;
    } cases[] = {
        {"W1 stem 1->16 3x3 28x28", 1, 16, 28, 3, 1, 1, CF_CONV_FP32},
        {"W1 b1 16->32 3x3 s2 28x28", 16, 32, 28, 3, 2, 1, CF_CONV_BF16},
        {"W1 b1 32->32 3x3 14x14", 32, 32, 14, 3, 1, 1, CF_CONV_BF16},
        {"W1 b1 shortcut 16->32 1x1 s2", 16, 32, 28, 1, 2, 0, CF_CONV_BF16},
        {"W1 b2 32->64 3x3 s2 14x14", 32, 64, 14, 3, 2, 1, CF_CONV_BF16},
        {"W1 b2 64->64 3x3 7x7", 64, 64, 7, 3, 1, 1, CF_CONV_BF16},
        {"W1 b2 shortcut 32->64 1x1 s2", 32, 64, 14, 1, 2, 0, CF_CONV_BF16},
        {"W3 stem 3->64 7x7 s2 128x128", 3, 64, 128, 7, 2, 3, CF_CONV_BF16_STEM},
        {"W3 l3 down 128->256 1x1 s2", 128, 256, 8, 1, 2, 0, CF_CONV_BF16},
        {"W3 l4 256->512 3x3 s2 4x4", 256, 512, 4, 3, 2, 1, CF_CONV_BF16},
        {"RGB 3x3 stem 3->32 32x32 (K = 27)", 3, 32, 32, 3, 1, 1, CF_CONV_FP32},
        {"RGB 3x3 s2 stem 3->32 (K = 27)", 3, 32, 32, 3, 2, 1, CF_CONV_FP32},
        {"7 channels 3x3 s2 (K = 63)", 7, 16, 16, 3, 2, 1, CF_CONV_FP32},
        {"8 channels 3x3 (K = 72)", 8, 16, 16, 3, 1, 1, CF_CONV_BF16},
        {"8 channels 1x1 (K = 8)", 8, 16, 16, 1, 1, 0, CF_CONV_BF16},
        {"4 channels 5x5 s2 (K = 100)", 4, 16, 32, 5, 2, 2, CF_CONV_BF16_STEM},
        {"RGB 7x7 at stride 1 (K = 147, no stem shape)", 3, 64, 32, 7, 1, 3, CF_CONV_FP32},
        {"RGB 7x7 s2 on an odd image (no stem shape)", 3, 64, 31, 7, 2, 3, CF_CONV_FP32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const cf_conv_geom g =
            geom(cases[i].c, cases[i].hw, cases[i].k, cases[i].stride, cases[i].pad);
        const cf_conv_precision got = cf_conv_bf16_precision(&g, cases[i].out);
        if (got != cases[i].want)
            fail_msg("%s: precision %d, want %d", cases[i].name, (int)got, (int)cases[i].want);
    }
}

/* One Conv2d (no bias) on n images of c x hw x hw, in bf16 or not: y, dW and (need_dx) dx. */
static void run_layer(int n, int c, int o, int hw, int k, int stride, int pad, bool bf16,
                      bool need_dx, const float *x, const float *dy, float *y, float *dw,
                      float *dx) {
    cf_model *model;
    assert_int_equal(cf_model_new(&model, cf_conv2d(c, o, k, stride, pad, false), 5), CF_OK);
    assert_int_equal(cf_conv_set_bf16(model->root, bf16), 1);
    cf_model_train(model, true);
    cf_model_zero_grad(model);
    const cf_tensor tx = cf_tensor_view((float *)x, cf_shape4(n, c, hw, hw));
    const cf_tensor *ty;
    assert_int_equal(cf_model_forward(model, &tx, &ty), CF_OK);
    memcpy(y, ty->data, cf_tensor_numel(ty) * 4);
    const cf_tensor tdy = cf_tensor_view((float *)dy, ty->shape);
    const cf_tensor *tdx = model->root->ops->backward(model->root, &tdy, need_dx);
    if (need_dx) {
        assert_non_null(tdx);
        memcpy(dx, tdx->data, cf_tensor_numel(&tx) * 4);
    }
    memcpy(dw, cf_model_param(model, "weight")->grad, (size_t)o * c * k * k * 4);
    cf_model_free(model);
}

/* Whether a and b hold the same bits. */
static bool same(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_layers(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int n, c, o, hw, k, stride, pad;
        bool need_dx;
    } cases[] = {
        {"W1 stem 1->16 3x3", 5, 1, 16, 28, 3, 1, 1, false},
        {"RGB 3x3 3->32", 3, 3, 32, 16, 3, 1, 1, true},
        {"W1 b1 16->32 3x3 s2", 3, 16, 32, 28, 3, 2, 1, true},
        {"W1 b1 shortcut 16->32 1x1 s2", 3, 16, 32, 28, 1, 2, 0, true},
        {"W3 stem 3->64 7x7 s2", 2, 3, 64, 64, 7, 2, 3, false},
    };
    const bool bf16_level = cf_bf16_compute();
    printf("level %s: %s\n", cf_isa_name(cf_isa_active()),
           bf16_level ? "computes in bf16" : "fp32 only");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i].n, c = cases[i].c, o = cases[i].o, hw = cases[i].hw, k = cases[i].k;
        const cf_conv_geom g = geom(c, hw, k, cases[i].stride, cases[i].pad);
        const size_t nx = (size_t)n * c * hw * hw, ny = (size_t)n * o * g.oh * g.ow,
                     nw = (size_t)o * c * k * k;
        float *x = malloc(nx * 4), *dy = malloc(ny * 4), *y[2], *dw[2], *dx[2];
        for (int v = 0; v < 2; v++) {
            y[v] = malloc(ny * 4);
            dw[v] = malloc(nw * 4);
            dx[v] = calloc(nx, 4);
        }
        fill_uniform(x, nx, 40 + i, -2, 2);
        fill_uniform(dy, ny, 50 + i, -1, 1);
        run_layer(n, c, o, hw, k, cases[i].stride, cases[i].pad, false, cases[i].need_dx, x, dy,
                  y[0], dw[0], dx[0]);
        run_layer(n, c, o, hw, k, cases[i].stride, cases[i].pad, true, cases[i].need_dx, x, dy,
                  y[1], dw[1], dx[1]);
        const bool in_bf16 = cf_conv_bf16_precision(&g, o) != CF_CONV_FP32;
        /* the RGB stem in bf16 only where the level has the bf16 stem's kernels */
        const bool computes = bf16_level && in_bf16 &&
                              (cf_conv_bf16_precision(&g, o) != CF_CONV_BF16_STEM ||
                               cf_conv_stem_bf16_supported(&g, o));
        const bool same_y = same(y[0], y[1], ny), same_dw = same(dw[0], dw[1], nw),
                   same_dx = same(dx[0], dx[1], nx);
        printf("%s: %s (y %s, dW %s, dx %s)\n", cases[i].name, computes ? "bf16" : "fp32",
               same_y ? "same" : "differs", same_dw ? "same" : "differs",
               same_dx ? "same" : "differs");
        if (computes) {
            if (same_y) fail_msg("%s: the bf16 layer's y is fp32's", cases[i].name);
            if (same_dw) fail_msg("%s: the bf16 layer's dW is fp32's", cases[i].name);
            if (cases[i].need_dx && same_dx)
                fail_msg("%s: the bf16 layer's dx is fp32's", cases[i].name);
        } else if (!same_y || !same_dw || !same_dx)
            fail_msg("%s: a layer in fp32 under to_bf16 is not bitwise the fp32 layer",
                     cases[i].name);
        free(x), free(dy);
        for (int v = 0; v < 2; v++) free(y[v]), free(dw[v]), free(dx[v]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
