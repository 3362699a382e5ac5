/* The vectorised kernels under Conv2d against their plain reference paths (cf_kernels_set_
 * reference): cf_sgemm_strided on every tile shape and edge (rows 1..20, columns 1..100, both
 * ways of reading A, accumulate or not), cf_im2col (bitwise) and cf_col2im on strides 1-3,
 * kernels 1-5, paddings 0-2 and row widths that take each of the fast paths. The reference
 * paths are the ones the oracle tests check against PyTorch in builds without AVX-512 (and
 * the plain loops are the definitions in tensor.h), so agreement here carries those checks over
 * to the fast paths. Without AVX-512 both sides are the reference and the test is trivial. */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/tensor.h"

static void fill(cf_rng *rng, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * cf_rng_uniform(rng) - 1.0);
}

/* |fast - ref| <= 1e-5 * (sum over the products of |a||b|) + tiny, elementwise */
static void check_gemm(int m, int n, int k, bool trans_a, bool accumulate, cf_rng *rng) {
    const int ldb = n + 3, ldc = n + 5;
    const ptrdiff_t a_row = trans_a ? 1 : k + 2, a_col = trans_a ? m + 1 : 1;
    size_t na = trans_a ? (size_t)(m + 1) * k : (size_t)m * (k + 2);
    float *a = malloc(na * sizeof(float)), *b = malloc((size_t)k * ldb * sizeof(float));
    float *c1 = malloc((size_t)m * ldc * sizeof(float)),
          *c2 = malloc((size_t)m * ldc * sizeof(float));
    fill(rng, a, na);
    fill(rng, b, (size_t)k * ldb);
    fill(rng, c1, (size_t)m * ldc);
    memcpy(c2, c1, (size_t)m * ldc * sizeof(float));
    cf_kernels_set_reference(false);
    cf_sgemm_strided(m, n, k, a, a_row, a_col, b, ldb, c1, ldc, accumulate);
    cf_kernels_set_reference(true);
    cf_sgemm_strided(m, n, k, a, a_row, a_col, b, ldb, c2, ldc, accumulate);
    cf_kernels_set_reference(false);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            float x = c1[(size_t)i * ldc + j], y = c2[(size_t)i * ldc + j];
            if (j >= n) { /* columns past n are never written */
                if (memcmp(&x, &y, sizeof x) != 0)
                    fail_msg("gemm %dx%dx%d wrote column %d past n", m, n, k, j);
                continue;
            }
            double mag = accumulate ? fabs(y) : 0;
            for (int p = 0; p < k; p++)
                mag += fabs(a[i * a_row + p * a_col]) * fabs(b[(size_t)p * ldb + j]);
            if (fabs((double)x - y) > 1e-5 * mag + 1e-30)
                fail_msg("gemm m=%d n=%d k=%d trans_a=%d acc=%d: C[%d,%d] = %g, reference %g", m, n,
                         k, trans_a, accumulate, i, j, (double)x, (double)y);
        }
    free(a);
    free(b);
    free(c1);
    free(c2);
}

static void test_sgemm_strided_matches_reference(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 3);
    const int ns[] = {1, 5, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 80, 100, 196};
    const int ks[] = {1, 9, 32, 77};
    for (int m = 1; m <= 20; m++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                check_gemm(m, ns[ni], ks[ki], (m + ni + ki) % 2 == 1, (m + ni) % 3 == 0, &rng);
    check_gemm(64, 245, 576, false, false, &rng); /* W1 shapes */
    check_gemm(288, 196, 32, true, false, &rng);
    check_gemm(576, 64, 245, false, true, &rng);
}

typedef struct geom_case {
    int c, h, w, k, s, p;
} geom_case;

static const geom_case geoms[] = {
    {1, 28, 28, 3, 1, 1},  {16, 28, 28, 3, 2, 1}, {32, 14, 14, 3, 1, 1}, {16, 28, 28, 1, 2, 0},
    {32, 14, 14, 3, 2, 1}, {64, 7, 7, 3, 1, 1},   {32, 14, 14, 1, 2, 0}, {3, 9, 7, 3, 1, 1},
    {2, 10, 6, 5, 2, 2},   {3, 11, 8, 2, 3, 0},   {2, 5, 6, 3, 2, 2},    {2, 3, 3, 3, 1, 0},
    {2, 40, 37, 3, 1, 1},  {2, 33, 33, 3, 2, 1},  {2, 20, 70, 3, 1, 1},  {1, 12, 12, 5, 1, 2},
    {2, 9, 9, 3, 1, 2},    {1, 6, 40, 3, 2, 0},   {3, 17, 17, 4, 1, 1},  {2, 8, 8, 3, 3, 1},
};

static void test_im2col_col2im_match_reference(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 4);
    for (size_t t = 0; t < sizeof geoms / sizeof *geoms; t++) {
        const geom_case *gc = &geoms[t];
        cf_conv_geom g;
        assert_true(
            cf_conv_geom_init(&g, gc->c, gc->h, gc->w, gc->k, gc->k, gc->s, gc->s, gc->p, gc->p));
        const int P = g.oh * g.ow, ld = P + 7; /* a row stride past the image's columns */
        const size_t K = (size_t)gc->c * gc->k * gc->k, nx = (size_t)gc->c * gc->h * gc->w;
        /* the image sits between guard values that must never be read into the patches */
        float *xb = malloc((nx + 64) * sizeof(float)), *x = xb + 32;
        float *col1 = malloc(K * ld * sizeof(float)), *col2 = malloc(K * ld * sizeof(float));
        float *dx1 = malloc(nx * sizeof(float)), *dx2 = malloc(nx * sizeof(float));
        for (size_t i = 0; i < nx + 64; i++) xb[i] = NAN;
        fill(&rng, x, nx);
        for (size_t i = 0; i < K * ld; i++) col1[i] = col2[i] = -7.0f;
        cf_im2col(&g, x, col1, ld);
        cf_kernels_set_reference(true);
        cf_im2col(&g, x, col2, ld);
        cf_kernels_set_reference(false);
        if (memcmp(col1, col2, K * ld * sizeof(float)) != 0)
            fail_msg("im2col differs from the reference for c=%d h=%d w=%d k=%d s=%d p=%d", gc->c,
                     gc->h, gc->w, gc->k, gc->s, gc->p);
        fill(&rng, col1, K * ld);
        cf_col2im(&g, col1, ld, dx1);
        cf_kernels_set_reference(true);
        cf_col2im(&g, col1, ld, dx2);
        cf_kernels_set_reference(false);
        char what[128];
        snprintf(what, sizeof what, "col2im c=%d h=%d w=%d k=%d s=%d p=%d", gc->c, gc->h, gc->w,
                 gc->k, gc->s, gc->p);
        assert_close(what, dx1, dx2, nx, 1e-6, 1e-6);
        free(xb);
        free(col1);
        free(col2);
        free(dx1);
        free(dx2);
    }
}

/* cf_conv_same against im2col and the reference GEMM, image by image: several images in one
 * call (vectors that hold the end of one image and the start of the next), row counts that are
 * not multiples of the tile, image strides with gaps (guard values that must not be read), and
 * the output gaps left untouched. */
static int same_checked;

static void check_conv_same(int c, int h, int w, int k, int m, int n_images, cf_rng *rng) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, 1, 1, k / 2, k / 2));
    if (!cf_conv_same_supported(&g)) return; /* no AVX-512, or the plane is out of range */
    same_checked++;
    const int P = h * w, K = c * k * k;
    const size_t x_image = (size_t)c * P + 5, y_image = (size_t)m * P + 3;
    const size_t nx = x_image * n_images + 64, ny = y_image * n_images;
    float *xb = malloc(nx * sizeof(float)), *x = xb + 32;
    float *a = malloc((size_t)m * (K + 1) * sizeof(float));
    float *y = malloc(ny * sizeof(float)), *col = malloc((size_t)K * P * sizeof(float));
    float *ref = malloc((size_t)m * P * sizeof(float));
    for (size_t i = 0; i < nx; i++) xb[i] = NAN;
    for (int n = 0; n < n_images; n++) fill(rng, x + n * x_image, (size_t)c * P);
    fill(rng, a, (size_t)m * (K + 1));
    for (size_t i = 0; i < ny; i++) y[i] = -7.0f;
    float *packed = malloc(cf_conv_same_packed_size(&g, m) * sizeof(float));
    cf_conv_same_pack(&g, m, a, K + 1, k * k, 1, packed);
    cf_conv_same(&g, m, packed, x, x_image, n_images, y, y_image);
    free(packed);
    cf_kernels_set_reference(true);
    for (int n = 0; n < n_images; n++) {
        cf_im2col(&g, x + n * x_image, col, P);
        cf_sgemm_strided(m, P, K, a, K + 1, 1, col, P, ref, P, false);
        char what[160];
        snprintf(what, sizeof what, "conv_same c=%d h=%d w=%d k=%d m=%d image %d of %d", c, h, w, k,
                 m, n, n_images);
        assert_close(what, y + n * y_image, ref, (size_t)m * P, 1e-5, 1e-5);
        for (size_t i = (size_t)m * P; i < y_image; i++)
            if (y[n * y_image + i] != -7.0f) fail_msg("%s: wrote into the gap at %zu", what, i);
    }
    cf_kernels_set_reference(false);
    free(xb);
    free(a);
    free(y);
    free(col);
    free(ref);
}

/* cf_conv_same_wgrad (and cf_transpose, which lays out its input) against the patch matrix:
 * dW[r][c][t] = sum_p dy[r][p] * col[c*T + t][p]. */
static void check_wgrad(int c, int h, int w, int k, int m, cf_rng *rng) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, 1, 1, k / 2, k / 2));
    if (!cf_conv_same_supported(&g)) return;
    same_checked++;
    const int P = h * w, T = k * k, K = c * T, hp = h + k - 1, wp = w + k - 1;
    float *x = malloc((size_t)c * P * sizeof(float)), *dy = malloc((size_t)m * P * sizeof(float));
    float *xt = calloc((size_t)hp * wp * c, sizeof(float));
    float *dwt = malloc((size_t)T * m * c * sizeof(float));
    float *col = malloc((size_t)K * P * sizeof(float)), *ref = malloc((size_t)K * sizeof(float));
    fill(rng, x, (size_t)c * P);
    fill(rng, dy, (size_t)m * P);
    for (int y = 0; y < h; y++)
        cf_transpose(c, w, x + y * w, P, xt + ((size_t)(y + k / 2) * wp + k / 2) * c, c);
    for (int y = 0; y < h; y++) /* the transpose itself, exactly */
        for (int xx = 0; xx < w; xx++)
            for (int ch = 0; ch < c; ch++)
                assert_true(xt[((size_t)(y + k / 2) * wp + xx + k / 2) * c + ch] ==
                            x[(size_t)ch * P + y * w + xx]);
    fill(rng, dwt, (size_t)T * m * c);
    float *before = malloc((size_t)T * m * c * sizeof(float));
    memcpy(before, dwt, (size_t)T * m * c * sizeof(float));
    const bool accumulate = (c + m) % 2 == 1;
    cf_conv_same_wgrad(&g, m, dy, xt, dwt, accumulate);
    cf_kernels_set_reference(true);
    cf_im2col(&g, x, col, P);
    cf_kernels_set_reference(false);
    for (int r = 0; r < m; r++) {
        for (int kk = 0; kk < K; kk++) {
            double sum = 0;
            for (int p = 0; p < P; p++)
                sum += (double)dy[(size_t)r * P + p] * col[(size_t)kk * P + p];
            const int ch = kk / T, t = kk % T;
            ref[kk] = (float)(sum + (accumulate ? before[((size_t)t * m + r) * c + ch] : 0));
        }
        for (int kk = 0; kk < K; kk++) {
            const int ch = kk / T, t = kk % T;
            const float got = dwt[((size_t)t * m + r) * c + ch];
            if (fabsf(got - ref[kk]) > 1e-4f * (1.0f + fabsf(ref[kk])))
                fail_msg("wgrad c=%d h=%d w=%d k=%d m=%d: dW[%d][%d][%d] = %g, expected %g", c, h,
                         w, k, m, r, ch, t, (double)got, (double)ref[kk]);
        }
    }
    free(x);
    free(dy);
    free(xt);
    free(dwt);
    free(col);
    free(ref);
    free(before);
}

static void test_conv_same_matches_im2col(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    check_conv_same(1, 28, 28, 3, 16, 3, &rng); /* W1's stem */
    check_conv_same(32, 14, 14, 3, 32, 2, &rng);
    check_conv_same(64, 7, 7, 3, 64, 5, &rng); /* 49-value planes: vectors span two images */
    check_conv_same(3, 4, 4, 3, 5, 7, &rng);   /* 16-value planes */
    check_conv_same(2, 5, 7, 5, 13, 4, &rng);
    check_conv_same(4, 6, 9, 1, 9, 3, &rng);
    check_conv_same(2, 9, 11, 7, 3, 2, &rng);
    check_conv_same(2, 64, 64, 3, 8, 1, &rng); /* the largest plane */
    for (int m = 1; m <= 17; m += 4)
        for (int n = 1; n <= 4; n++) check_conv_same(3, 5, 5, 3, m, n, &rng);
    check_wgrad(32, 14, 14, 3, 32, &rng); /* W1's shapes */
    check_wgrad(64, 7, 7, 3, 64, &rng);
    check_wgrad(20, 5, 6, 3, 13, &rng); /* channel and row tails */
    check_wgrad(9, 4, 4, 5, 3, &rng);
    check_wgrad(40, 6, 3, 1, 17, &rng);
#if defined(__AVX512F__)
    assert_int_equal(same_checked, 33); /* every case above ran */
#endif
    cf_conv_geom g;
    cf_conv_geom_init(&g, 2, 14, 14, 3, 3, 2, 2, 1, 1);
    assert_false(cf_conv_same_supported(&g)); /* stride 2 */
    cf_conv_geom_init(&g, 2, 14, 14, 3, 3, 1, 1, 0, 0);
    assert_false(cf_conv_same_supported(&g)); /* not "same" */
    cf_conv_geom_init(&g, 2, 3, 3, 3, 3, 1, 1, 1, 1);
    assert_false(cf_conv_same_supported(&g)); /* plane under 16 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgemm_strided_matches_reference),
        cmocka_unit_test(test_im2col_col2im_match_reference),
        cmocka_unit_test(test_conv_same_matches_im2col),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
