/* The bf16 convolution's small-plane path (conv_bf16.c, layout.compact: every tap's inputs
 * gathered to the output positions) on the shapes its own cases leave out: 1x1 and 1 x n planes
 * (the largest calls, 192 positions), planes of different height and width, 5x5 and 7x7
 * kernels (25 and 49 taps) at stride 1 and 2, one image, and image counts that leave a partial
 * call and a partial weight-gradient block. The forward pass, dx, dW and the fused backward are
 * checked against float64 sums of the bf16-rounded operands (only the fp32 summation differs),
 * every call with exactly cf_conv_bf16_scratch floats of scratch (a heap block of that size, so
 * that AddressSanitizer sees a write past it). Skipped where the level has no bf16 convolution
 * (CF_ISA below avx512_bf16). */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    int n, c, h, w, o, k, stride;
} shape;

static float *rounded(const float *x, size_t n) {
    float *r = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) r[i] = cf_bf16_round(x[i]);
    return r;
}

/* y = conv(x, w) in float64 of rounded operands, and sum |terms| per output (for the bound). */
static void ref_forward(const shape *s, const cf_conv_geom *g, const float *x, const float *w,
                        double *y, double *mag) {
    const int p = g->ph;
    for (int n = 0; n < s->n; n++)
        for (int o = 0; o < s->o; o++)
            for (int i = 0; i < g->oh; i++)
                for (int j = 0; j < g->ow; j++) {
                    double acc = 0, m = 0;
                    for (int c = 0; c < s->c; c++)
                        for (int ki = 0; ki < s->k; ki++)
                            for (int kj = 0; kj < s->k; kj++) {
                                const int yi = i * s->stride + ki - p, xj = j * s->stride + kj - p;
                                if (yi < 0 || yi >= s->h || xj < 0 || xj >= s->w) continue;
                                const double t =
                                    (double)x[(((size_t)n * s->c + c) * s->h + yi) * s->w + xj] *
                                    w[(((size_t)o * s->c + c) * s->k + ki) * s->k + kj];
                                acc += t;
                                m += fabs(t);
                            }
                    const size_t at = (((size_t)n * s->o + o) * g->oh + i) * g->ow + j;
                    y[at] = acc;
                    mag[at] = m;
                }
}

/* dx and dw of dy in float64 (rounded operands), with sums of |terms|. */
static void ref_backward(const shape *s, const cf_conv_geom *g, const float *x, const float *w,
                         const float *dy, double *dx, double *dxm, double *dw, double *dwm) {
    const int p = g->ph;
    const size_t nx = (size_t)s->n * s->c * s->h * s->w, nw = (size_t)s->o * s->c * s->k * s->k;
    memset(dx, 0, nx * sizeof(double));
    memset(dxm, 0, nx * sizeof(double));
    memset(dw, 0, nw * sizeof(double));
    memset(dwm, 0, nw * sizeof(double));
    for (int n = 0; n < s->n; n++)
        for (int o = 0; o < s->o; o++)
            for (int i = 0; i < g->oh; i++)
                for (int j = 0; j < g->ow; j++) {
                    const double d = dy[(((size_t)n * s->o + o) * g->oh + i) * g->ow + j];
                    for (int c = 0; c < s->c; c++)
                        for (int ki = 0; ki < s->k; ki++)
                            for (int kj = 0; kj < s->k; kj++) {
                                const int yi = i * s->stride + ki - p, xj = j * s->stride + kj - p;
                                if (yi < 0 || yi >= s->h || xj < 0 || xj >= s->w) continue;
                                const size_t xa = (((size_t)n * s->c + c) * s->h + yi) * s->w + xj,
                                             wa = (((size_t)o * s->c + c) * s->k + ki) * s->k + kj;
                                dx[xa] += d * w[wa];
                                dxm[xa] += fabs(d * w[wa]);
                                dw[wa] += d * x[xa];
                                dwm[wa] += fabs(d * x[xa]);
                            }
                }
}

/* |got - want| within fp32 summation error of the terms (1e-6 of their magnitudes, a term per
 * tap and channel) for every value. */
static void expect_near(const char *what, const shape *s, const float *got, const double *want,
                        const double *mag, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double bound = 1e-5 * mag[i] + 1e-6;
        if (!(fabs(got[i] - want[i]) <= bound))
            fail_msg("%s (n %d, %d -> %d, %dx%d, k %d, stride %d): value %zu is %.9g, expected "
                     "%.9g (bound %.3g)",
                     what, s->n, s->c, s->o, s->h, s->w, s->k, s->stride, i, (double)got[i],
                     want[i], bound);
    }
}

static void check(const shape *s) {
    cf_conv_geom g;
    const int p = (s->k - 1) / 2;
    assert_true(cf_conv_geom_init(&g, s->c, s->h, s->w, s->k, s->k, s->stride, s->stride, p, p));
    assert_true(cf_conv_bf16_supported(&g, s->o));
    const size_t nx = (size_t)s->n * s->c * s->h * s->w, ny = (size_t)s->n * s->o * g.oh * g.ow,
                 nw = (size_t)s->o * s->c * s->k * s->k;
    float *x = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)),
          *dy = malloc(ny * sizeof(float));
    fill_uniform(x, nx, 11 + (uint64_t)s->h, -1.0f, 1.0f);
    fill_uniform(w, nw, 12 + (uint64_t)s->w, -0.5f, 0.5f);
    fill_uniform(dy, ny, 13 + (uint64_t)s->k, -1.0f, 1.0f);
    float *xr = rounded(x, nx), *wr = rounded(w, nw), *dyr = rounded(dy, ny);
    double *y64 = malloc(ny * sizeof(double)), *ym = malloc(ny * sizeof(double)),
           *dx64 = malloc(nx * sizeof(double)), *dxm = malloc(nx * sizeof(double)),
           *dw64 = malloc(nw * sizeof(double)), *dwm = malloc(nw * sizeof(double));
    ref_forward(s, &g, xr, wr, y64, ym);
    ref_backward(s, &g, xr, wr, dyr, dx64, dxm, dw64, dwm);

    float *packed = malloc(cf_conv_bf16_packed_floats(&g, s->o) * sizeof(float));
    const size_t scratch_n = cf_conv_bf16_scratch(&g, s->o);
    float *scratch = malloc(scratch_n * sizeof(float));
    float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float)),
          *dw = malloc(nw * sizeof(float)), *dwt = malloc(nw * sizeof(float));
    cf_conv_bf16_pack(&g, s->o, w, packed);
    assert_int_equal(cf_conv_bf16_forward(&g, s->o, packed, x, s->n, y, scratch), CF_OK);
    expect_near("forward", s, y, y64, ym, ny);
    assert_int_equal(cf_conv_bf16_dx(&g, s->o, packed, dy, s->n, dx, scratch), CF_OK);
    expect_near("dx", s, dx, dx64, dxm, nx);
    /* dw comes [tap][out][in] */
    cf_conv_bf16_wgrad(&g, s->o, dy, x, s->n, dwt, scratch);
    const int taps = s->k * s->k;
    for (int t = 0; t < taps; t++)
        for (int o = 0; o < s->o; o++)
            for (int c = 0; c < s->c; c++)
                dw[((size_t)o * s->c + c) * taps + t] = dwt[((size_t)t * s->o + o) * s->c + c];
    expect_near("dw", s, dw, dw64, dwm, nw);
    /* the fused backward: bitwise the separate calls */
    float *dx2 = malloc(nx * sizeof(float)), *dwt2 = malloc(nw * sizeof(float));
    assert_int_equal(
        cf_conv_bf16_backward(&g, s->o, packed, dy, x, s->n, dwt2, dx2, scratch, NULL, NULL),
        CF_OK);
    if (memcmp(dx2, dx, nx * sizeof(float)) || memcmp(dwt2, dwt, nw * sizeof(float)))
        fail_msg("backward (n %d, %d -> %d, %dx%d, k %d, stride %d): not the separate calls'", s->n,
                 s->c, s->o, s->h, s->w, s->k, s->stride);
    free(dx2), free(dwt2);
    free(x), free(w), free(dy), free(xr), free(wr), free(dyr);
    free(y64), free(ym), free(dx64), free(dxm), free(dw64), free(dwm);
    free(packed), free(scratch), free(y), free(dx), free(dw), free(dwt);
}

static void test_compact_odd_shapes(void **state) {
    (void)state;
    if (!cf_bf16_compute()) skip();
    static const shape shapes[] = {
        {5, 128, 1, 1, 128, 3, 1},   /* 1x1 planes: 192 positions a call */
        {1, 128, 1, 1, 130, 3, 1},   /* one image */
        {200, 128, 1, 1, 128, 3, 1}, /* more images than a call holds (a partial one) */
        {3, 129, 1, 5, 128, 3, 1},   /* a 1 x 5 row, a half channel pair */
        {4, 128, 3, 5, 131, 3, 1},   /* 3 x 5, odd output channels */
        {3, 128, 5, 5, 128, 5, 1},   /* 5x5 kernel: 25 taps */
        {2, 128, 3, 3, 128, 7, 1},   /* 7x7 kernel on 3x3 planes: 49 taps, mostly padding */
        {3, 128, 2, 2, 129, 3, 2},   /* stride 2 to 1x1 */
        {5, 131, 4, 6, 128, 5, 2},   /* stride 2, 5x5, 2 x 3 outputs */
        {1, 128, 2, 4, 128, 7, 2},   /* stride 2, 7x7 on 2 x 4, one image */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check(&shapes[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_odd_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
