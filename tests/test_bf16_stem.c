/* The bf16 stride-2 stem (cf_conv_stem_bf16_*, src/tensor/conv_stem_bf16.c): forward and weight
 * gradient against PyTorch's conv2d in float64 (tests/oracle/bf16_stem.py), on RGB 7x7 stems,
 * 1-, 3- and 7-channel images, kernels 3 to 11, several images, outputs past one band and one
 * chunk of positions, output channels off the blocks of 8.
 *
 * Two bounds per value. Against the float64 result of the rounded operands (x and w; x and dy
 * rounded to torch.bfloat16): the products of bf16 values are exact in fp32, so only fp32's sums
 * differ, by at most (terms + 4) 2^-24 of the sum of the absolute products. Against the float64
 * result of the unrounded operands: each product is off by at most 2u + u^2 (u = 2^-8) of its
 * magnitude, plus the same fp32 term. A wrong tap, channel or position is off by the size of the
 * value itself, far outside the first bound. Both are also compared bitwise with the first
 * layout of the stem (test_bf16_stem_ref.h), which summed the same products in the same order.
 * Where the level has no bf16 stem (below avx512_bf16, and amx, whose table has no gemm_rows) the
 * direct calls are skipped. */
#include "corefit/nn.h"
#include "oracle.h"
#include "tensor/kernel_table.h"
#include "test_bf16_stem_ref.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct scase {
    int n, c, h, w, k, o;
} scase;

/* the last: streamed rows with a partial block of 8 output channels */
static const scase cases[] = {
    {2, 3, 20, 16, 7, 19}, {1, 1, 12, 12, 3, 8},  {3, 3, 16, 20, 5, 24}, {2, 3, 36, 32, 7, 64},
    {1, 7, 8, 8, 11, 5},   {1, 3, 64, 64, 7, 64}, {2, 3, 32, 64, 7, 20},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void expect_within(const char *what, const float *got, const float *want,
                          const float *abs_sum, size_t n, double rel) {
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]), bound = rel * abs_sum[i] + 1e-30;
        if (!(err <= bound))
            fail_msg("%s: element %zu: %.9g against %.9g (error %.3g, bound %.3g)", what, i, got[i],
                     want[i], err, bound);
    }
}

static void expect_bitwise(const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu: %.9g against %.9g", what, i, got[i], want[i]);
}

static void test_matches_float64(void **state) {
    (void)state;
    cf_conv_geom g0;
    cf_conv_geom_init(&g0, 3, 16, 16, 7, 7, 2, 2, 3, 3);
    if (!cf_conv_stem_bf16_supported(&g0, 64)) {
        printf("kernels %s: no bf16 stem\n", cf_isa_name(cf_isa_active()));
        skip();
    }
    oracle o;
    oracle_init(&o);
    float *xs[N_CASES], *ws[N_CASES], *dys[N_CASES];
    char args[128] = "", name[16];
    for (int i = 0; i < N_CASES; i++) {
        const scase *s = &cases[i];
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, s->c, s->h, s->w, s->k, s->k, 2, 2, (s->k - 1) / 2,
                                      (s->k - 1) / 2));
        assert_true(cf_conv_stem_bf16_supported(&g, s->o));
        const size_t nx = (size_t)s->n * s->c * s->h * s->w, nw = (size_t)s->o * s->c * s->k * s->k,
                     ny = (size_t)s->n * s->o * g.oh * g.ow;
        xs[i] = malloc(nx * sizeof(float));
        ws[i] = malloc(nw * sizeof(float));
        dys[i] = malloc(ny * sizeof(float));
        fill_uniform(xs[i], nx, 10 + i, -2, 2);
        fill_uniform(ws[i], nw, 20 + i, -0.3f, 0.3f);
        fill_uniform(dys[i], ny, 30 + i, -1, 1);
        snprintf(name, sizeof name, "x%d", i);
        oracle_put(&o, name, xs[i], cf_shape4(s->n, s->c, s->h, s->w));
        snprintf(name, sizeof name, "w%d", i);
        oracle_put(&o, name, ws[i], cf_shape4(s->o, s->c, s->k, s->k));
        snprintf(name, sizeof name, "dy%d", i);
        oracle_put(&o, name, dys[i], cf_shape4(s->n, s->o, g.oh, g.ow));
        snprintf(args + strlen(args), sizeof args - strlen(args), "%s%d", i ? " " : "", s->k);
    }
    oracle_run(&o, "bf16_stem.py", args);
    for (int i = 0; i < N_CASES; i++) {
        const scase *s = &cases[i];
        cf_conv_geom g;
        cf_conv_geom_init(&g, s->c, s->h, s->w, s->k, s->k, 2, 2, (s->k - 1) / 2, (s->k - 1) / 2);
        const int K = s->c * s->k * s->k, P = g.oh * g.ow;
        const size_t ny = (size_t)s->n * s->o * P, nw = (size_t)s->o * K;
        float *scratch = malloc(cf_conv_stem_bf16_scratch(&g, s->o) * sizeof(float));
        /* y on whole lines: the rows of 16k outputs (cases 3, 5 and 6) are streamed, the others
         * stored under masks */
        float *y = cf_malloc((ny + 16) * sizeof(float)), *dwt = malloc(nw * sizeof(float));
        float *dw = malloc(nw * sizeof(float)), *acc = malloc(nw * sizeof(float));
        cf_conv_stem_bf16_forward(&g, s->o, ws[i], xs[i], s->n, y, scratch);
        cf_conv_stem_bf16_wgrad(&g, s->o, dys[i], xs[i], s->n, dwt, false, scratch);
        for (int oc = 0; oc < s->o; oc++) /* dwt is K x O */
            for (int kk = 0; kk < K; kk++) dw[(size_t)oc * K + kk] = dwt[(size_t)kk * s->o + oc];
        cf_tensor want[6];
        static const char *names[6] = {"y", "yr", "ya", "gw", "gwr", "gwa"};
        for (int j = 0; j < 6; j++) {
            snprintf(name, sizeof name, "%s%d", names[j], i);
            want[j] = oracle_get(&o, name);
        }
        const double u32 = ldexp(1.0, -24), prod = ldexp(1.0, -7) + ldexp(1.0, -16);
        char what[96];
        snprintf(what, sizeof what, "case %d y against the rounded operands", i);
        expect_within(what, y, want[1].data, want[2].data, ny, (K + 4) * u32 * 1.02);
        snprintf(what, sizeof what, "case %d y against float64", i);
        expect_within(what, y, want[0].data, want[2].data, ny, prod + (K + 4) * u32 * 1.02);
        const int terms = s->n * P;
        snprintf(what, sizeof what, "case %d dW against the rounded operands", i);
        expect_within(what, dw, want[4].data, want[5].data, nw, (terms + 4) * u32 * 1.02);
        snprintf(what, sizeof what, "case %d dW against float64", i);
        expect_within(what, dw, want[3].data, want[5].data, nw, prod + (terms + 4) * u32 * 1.02);
        /* bitwise the first layout's results (test_bf16_stem_ref.h), y and dW */
        float *ref_scratch = malloc(ref_stem_scratch(&g, s->o) * sizeof(float));
        float *ry = malloc(ny * sizeof(float)), *rdwt = malloc(nw * sizeof(float));
        ref_stem_forward(&g, s->o, ws[i], xs[i], s->n, ry, ref_scratch);
        ref_stem_wgrad(&g, s->o, dys[i], xs[i], s->n, rdwt, false, ref_scratch);
        snprintf(what, sizeof what, "case %d y against the first layout", i);
        expect_bitwise(what, y, ry, ny);
        snprintf(what, sizeof what, "case %d dW against the first layout", i);
        expect_bitwise(what, dwt, rdwt, nw);
        free(ref_scratch), free(ry), free(rdwt);
        /* accumulate: each value plus what the call overwrites with, bitwise */
        fill_uniform(acc, nw, 50 + i, -1, 1);
        for (size_t j = 0; j < nw; j++) dw[j] = acc[j] + dwt[j];
        cf_conv_stem_bf16_wgrad(&g, s->o, dys[i], xs[i], s->n, acc, true, scratch);
        snprintf(what, sizeof what, "case %d dW accumulated", i);
        for (size_t j = 0; j < nw; j++)
            if (memcmp(&acc[j], &dw[j], sizeof(float)) != 0)
                fail_msg("%s: element %zu: %.9g against %.9g", what, j, acc[j], dw[j]);
        for (int j = 0; j < 6; j++) free(want[j].data);
        free(scratch), cf_free(y), free(dwt), free(dw), free(acc);
        free(xs[i]), free(ws[i]), free(dys[i]);
    }
    oracle_cleanup(&o);
}

/* The forward pass into an output that is not on a 64-byte line: rows of whole lines (ow a
 * multiple of 16) are streamed only where y is aligned (a streaming store elsewhere faults), so
 * y one float off takes the masked stores, bitwise the same values. One image and one channel
 * (the fewest), and three channels with a partial block of 8 output channels; the weight
 * gradient of no images is zero (and leaves accumulated sums as they are). */
static void test_unaligned_and_empty(void **state) {
    (void)state;
    static const scase edge[] = {{1, 1, 32, 32, 3, 16}, {2, 3, 64, 64, 7, 13}};
    for (size_t e = 0; e < sizeof edge / sizeof edge[0]; e++) {
        const scase *s = &edge[e];
        cf_conv_geom g;
        assert_true(cf_conv_geom_init(&g, s->c, s->h, s->w, s->k, s->k, 2, 2, (s->k - 1) / 2,
                                      (s->k - 1) / 2));
        if (!cf_conv_stem_bf16_supported(&g, s->o)) skip();
        const size_t nx = (size_t)s->n * s->c * s->h * s->w, nw = (size_t)s->o * s->c * s->k * s->k,
                     ny = (size_t)s->n * s->o * g.oh * g.ow;
        float *x = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)),
              *scratch = malloc(cf_conv_stem_bf16_scratch(&g, s->o) * sizeof(float)),
              *y = cf_malloc(ny * sizeof(float)), *off = cf_malloc((ny + 16) * sizeof(float)),
              *dwt = malloc(nw * sizeof(float));
        assert_true((uintptr_t)y % 64 == 0 && (uintptr_t)off % 64 == 0);
        fill_uniform(x, nx, 91, -1.0f, 1.0f);
        fill_uniform(w, nw, 92, -0.3f, 0.3f);
        cf_conv_stem_bf16_forward(&g, s->o, w, x, s->n, y, scratch);
        cf_conv_stem_bf16_forward(&g, s->o, w, x, s->n, off + 1, scratch);
        size_t bad = ny;
        for (size_t i = 0; i < ny && bad == ny; i++)
            if (memcmp(&y[i], &off[1 + i], sizeof(float)) != 0) bad = i;
        for (size_t i = 0; i < nw; i++) dwt[i] = 1.0f;
        cf_conv_stem_bf16_wgrad(&g, s->o, y, x, 0, dwt, true, scratch);
        bool kept = true, zero = true;
        for (size_t i = 0; i < nw; i++) kept = kept && dwt[i] == 1.0f;
        cf_conv_stem_bf16_wgrad(&g, s->o, y, x, 0, dwt, false, scratch);
        for (size_t i = 0; i < nw; i++) zero = zero && dwt[i] == 0.0f;
        const double g0 = bad < ny ? off[1 + bad] : 0, w0 = bad < ny ? y[bad] : 0;
        free(x), free(w), free(scratch), cf_free(y), cf_free(off), free(dwt);
        if (bad < ny)
            fail_msg("case %zu: y one float off the line: value %zu is %.9g, aligned %.9g", e, bad,
                     g0, w0);
        if (!kept) fail_msg("case %zu: dW of no images changed the accumulated sums", e);
        if (!zero) fail_msg("case %zu: dW of no images is not zero", e);
    }
}

/* The stem through Conv2d (src/nn/conv.c, the layer in bf16 mode): each thread's images in one
 * call. The output is bitwise one cf_conv_stem_bf16_forward over the whole batch plus the bias, at
 * 1, 2 and 3 threads (5 images: ranges of unequal length), and not fp32's (the path is taken). */
static void test_conv2d_layer(void **state) {
    (void)state;
    enum { N = 5, C = 3, O = 64, K = 7, HW = 64 };
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, C, HW, HW, K, K, 2, 2, K / 2, K / 2));
    if (!cf_conv_stem_bf16_supported(&g, O)) skip();
    const size_t nx = (size_t)N * C * HW * HW, ny = (size_t)N * O * g.oh * g.ow;
    float *x = malloc(nx * sizeof(float)), *want = cf_malloc(ny * sizeof(float));
    float *scratch = malloc(cf_conv_stem_bf16_scratch(&g, O) * sizeof(float));
    fill_uniform(x, nx, 93, -1.0f, 1.0f);
    const cf_tensor xt = cf_tensor_view(x, cf_shape4(N, C, HW, HW));
    const int threads0 = cf_get_num_threads();
    for (int threads = 1; threads <= 3; threads++) {
        cf_set_num_threads(threads);
        cf_model *m16 = NULL, *m32 = NULL;
        assert_int_equal(cf_model_new(&m16, cf_conv2d(C, O, K, 2, K / 2, true), 7), CF_OK);
        assert_int_equal(cf_model_new(&m32, cf_conv2d(C, O, K, 2, K / 2, true), 7), CF_OK);
        float *bias = m16->root->params[1].data;
        for (int o = 0; o < O; o++)
            bias[o] = m32->root->params[1].data[o] = 0.01f * (float)(o - 30);
        assert_int_equal(cf_conv_set_bf16(m16->root, true), 1);
        const cf_tensor *y16 = NULL, *y32 = NULL;
        assert_int_equal(cf_model_forward(m16, &xt, &y16), CF_OK);
        assert_int_equal(cf_model_forward(m32, &xt, &y32), CF_OK);
        cf_conv_stem_bf16_forward(&g, O, m16->root->params[0].data, x, N, want, scratch);
        const size_t plane = (size_t)g.oh * g.ow;
        for (size_t r = 0; r < (size_t)N * O; r++)
            for (size_t p = 0; p < plane; p++) want[r * plane + p] += bias[r % O];
        const bool same = memcmp(y16->data, want, ny * sizeof(float)) == 0;
        const bool fp32 = memcmp(y16->data, y32->data, ny * sizeof(float)) == 0;
        cf_model_free(m16), cf_model_free(m32);
        if (!same || fp32) {
            cf_set_num_threads(threads0);
            free(x), cf_free(want), free(scratch);
            fail_msg("%d threads: Conv2d's stem output %s", threads,
                     !same ? "is not the stem's own forward pass" : "is fp32's (stem not taken)");
        }
    }
    cf_set_num_threads(threads0);
    free(x), cf_free(want), free(scratch);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_float64),
        cmocka_unit_test(test_unaligned_and_empty),
        cmocka_unit_test(test_conv2d_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
