/* The vectorised kernels under Conv2d against their plain reference paths (cf_kernels_set_
 * reference): cf_sgemm_strided on every tile shape and edge (rows 1..20, columns 1..100, both
 * ways of reading A, accumulate or not), cf_sgemm_nt on every tile edge and chunking of k,
 * cf_im2col (bitwise) and cf_col2im on strides 1-3, kernels 1-5, paddings 0-2 and row widths that
 * take each of the fast paths. The reference paths are the ones the oracle tests check against
 * PyTorch in builds without AVX-512 (and the plain loops are the definitions in tensor.h), so
 * agreement here carries those checks over to the fast paths. With the portable table both sides
 * are the reference and the test is trivial (cf_sgemm_nt has a fast path with AVX2 only). */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/tensor.h"

static void fill(cf_rng *rng, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * cf_rng_uniform(rng) - 1.0);
}

/* C from the fast path (c1) against the reference (c2), C[i][j] = sum over p of
 * a[i*a_row + p*a_col] * b[p*b_k + j*b_j] (+ C): |fast - ref| <= 1e-5 * (sum over the products
 * of |a||b|, + |C|) + tiny, elementwise, and the columns past n (to ldc) never written */
static void compare_products(const char *what, int m, int n, int k, const float *a, ptrdiff_t a_row,
                             ptrdiff_t a_col, const float *b, ptrdiff_t b_k, ptrdiff_t b_j,
                             const float *c1, const float *c2, int ldc, bool accumulate) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            float x = c1[(size_t)i * ldc + j], y = c2[(size_t)i * ldc + j];
            if (j >= n) {
                if (memcmp(&x, &y, sizeof x) != 0)
                    fail_msg("%s %dx%dx%d wrote column %d past n", what, m, n, k, j);
                continue;
            }
            double mag = accumulate ? fabs(y) : 0;
            for (int p = 0; p < k; p++)
                mag += fabs(a[i * a_row + p * a_col]) * fabs(b[p * b_k + j * b_j]);
            if (fabs((double)x - y) > 1e-5 * mag + 1e-30)
                fail_msg("%s m=%d n=%d k=%d acc=%d: C[%d,%d] = %g, reference %g", what, m, n, k,
                         accumulate, i, j, (double)x, (double)y);
        }
}

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
    char what[64];
    snprintf(what, sizeof what, "gemm trans_a=%d", trans_a);
    compare_products(what, m, n, k, a, a_row, a_col, b, ldb, 1, c1, c2, ldc, accumulate);
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

/* The vector tables' cf_sgemm_strided (AVX2's 6 x 2-vector tiles, the shared 8 x 3 and 4 x 3
 * ones) sum each element of C as one chain of FMAs in the order of k, then add C when
 * accumulating: bitwise the same as that scalar chain whatever the tile shape, edge, column chunk
 * (k x n past the AVX2 kernel's 128 KiB chunk of B), way of reading A or copy of B (AVX2 packs B
 * when its rows lie 256 floats apart or more, here n + 3, k > 8 and m >= 24), so a change of tiles
 * leaves every result as it was. (The portable table hands the products to the BLAS.) */
static void test_sgemm_strided_sums_in_order(void **state) {
    (void)state;
    if (cf_isa_active() == CF_ISA_GENERIC) skip();
    cf_rng rng;
    cf_rng_seed(&rng, 11);
    /* every shape takes the vector kernels (n > 16 or m >= 16: fewer go to the BLAS) */
    const int shapes[][3] = {
        {1, 17, 5},      {5, 17, 9},     {6, 18, 32},    {7, 33, 33},  {12, 40, 7},  {16, 8, 100},
        {99, 64, 99},    {99, 99, 64},   {96, 48, 192},  {23, 31, 1},  {16, 3, 3},   {17, 300, 130},
        {11, 161, 2100}, {40, 1030, 96}, {7, 260, 3000}, {6, 300, 20}, {24, 270, 9}, {30, 257, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 2; variant++) {
            const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            const bool trans_a = (s + variant) % 2 == 1, accumulate = variant == 1;
            const int ldb = n + 3, ldc = n + 5;
            const ptrdiff_t a_row = trans_a ? 1 : k + 2, a_col = trans_a ? m + 1 : 1;
            const size_t na = trans_a ? (size_t)(m + 1) * k : (size_t)m * (k + 2);
            float *a = malloc(na * sizeof(float)), *b = malloc((size_t)k * ldb * sizeof(float));
            float *c = malloc((size_t)m * ldc * sizeof(float)),
                  *c0 = malloc((size_t)m * ldc * sizeof(float));
            fill(&rng, a, na);
            fill(&rng, b, (size_t)k * ldb);
            fill(&rng, c0, (size_t)m * ldc);
            memcpy(c, c0, (size_t)m * ldc * sizeof(float));
            cf_sgemm_strided(m, n, k, a, a_row, a_col, b, ldb, c, ldc, accumulate);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < ldc; j++) {
                    float want = c0[(size_t)i * ldc + j];
                    if (j < n) {
                        float acc = 0.0f;
                        for (int p = 0; p < k; p++)
                            acc = fmaf(a[i * a_row + p * a_col], b[(size_t)p * ldb + j], acc);
                        want = accumulate ? acc + want : acc;
                    }
                    const float got = c[(size_t)i * ldc + j];
                    if (memcmp(&got, &want, sizeof got) != 0)
                        fail_msg("%s: m=%d n=%d k=%d trans_a=%d acc=%d: C[%d,%d] = %.9g, the "
                                 "in-order sum %.9g",
                                 cf_isa_name(cf_isa_active()), m, n, k, trans_a, accumulate, i, j,
                                 (double)got, (double)want);
                }
            free(a);
            free(b);
            free(c);
            free(c0);
        }
}

/* cf_sgemm_nt against its reference (cf_sgemm) */
static void check_gemm_nt(int m, int n, int k, bool accumulate, cf_rng *rng) {
    const int lda = k + 3, ldb = k + 1, ldc = n + 2;
    float *a = malloc((size_t)m * lda * sizeof(float)),
          *b = malloc((size_t)n * ldb * sizeof(float));
    float *c1 = malloc((size_t)m * ldc * sizeof(float)),
          *c2 = malloc((size_t)m * ldc * sizeof(float));
    fill(rng, a, (size_t)m * lda);
    fill(rng, b, (size_t)n * ldb);
    fill(rng, c1, (size_t)m * ldc);
    memcpy(c2, c1, (size_t)m * ldc * sizeof(float));
    cf_kernels_set_reference(false);
    cf_sgemm_nt(m, n, k, a, lda, b, ldb, c1, ldc, accumulate);
    cf_kernels_set_reference(true);
    cf_sgemm_nt(m, n, k, a, lda, b, ldb, c2, ldc, accumulate);
    cf_kernels_set_reference(false);
    compare_products("gemm_nt", m, n, k, a, lda, 1, b, 1, ldb, c1, c2, ldc, accumulate);
    free(a);
    free(b);
    free(c1);
    free(c2);
}

/* every tile edge (3 x 4 tiles), k below, at and past the vector sizes and the L1 chunks */
static void test_sgemm_nt_matches_reference(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    const int ks[] = {1, 15, 16, 33, 100, 257, 784, 3000};
    for (int m = 1; m <= 10; m++)
        for (int n = 1; n <= 17; n += (n < 5 ? 1 : 4))
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                check_gemm_nt(m, n, ks[ki], (m + n + (int)ki) % 2 == 1, &rng);
    check_gemm_nt(9, 16, 784 * 4, false, &rng); /* a stem's weight gradient */
    check_gemm_nt(12, 24, 300, true, &rng);     /* 4 x 6 tiles: as many as the kernel holds */
    check_gemm_nt(12, 25, 300, false, &rng);    /* 4 x 7: more, so cf_sgemm */
    check_gemm_nt(25, 32, 500, true, &rng);
    /* With AVX2 the stem's product must take the kernel, not quietly fall back: its sums in
     * lanes round differently from OpenBLAS's somewhere among 144 sums of 3136 products. */
    if (cf_isa_active() == CF_ISA_AVX2) {
        const int m = 9, n = 16, k = 3136;
        float *a = malloc((size_t)m * k * sizeof(float)),
              *b = malloc((size_t)n * k * sizeof(float));
        float c1[9 * 16], c2[9 * 16];
        fill(&rng, a, (size_t)m * k);
        fill(&rng, b, (size_t)n * k);
        cf_sgemm_nt(m, n, k, a, k, b, k, c1, n, false);
        cf_kernels_set_reference(true);
        cf_sgemm_nt(m, n, k, a, k, b, k, c2, n, false);
        cf_kernels_set_reference(false);
        assert_true(memcmp(c1, c2, sizeof c1) != 0);
        free(a);
        free(b);
    }
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
        /* cf_col2im_add: base + the gradient; exactly that sum for 1x1 kernels, whose pixels get
         * at most one entry (a residual block relies on it), on both paths */
        for (int ref = 0; ref < 2; ref++) {
            cf_kernels_set_reference(ref == 1);
            float *base = malloc(nx * sizeof(float));
            fill(&rng, base, nx);
            memcpy(dx2, base, nx * sizeof(float));
            cf_col2im_add(&g, col1, ld, dx2);
            cf_col2im(&g, col1, ld, dx1);
            cf_kernels_set_reference(false);
            for (size_t i = 0; i < nx; i++) dx1[i] += base[i];
            if (gc->k == 1) {
                if (memcmp(dx1, dx2, nx * sizeof(float)) != 0)
                    fail_msg("col2im_add (reference %d) is not base + col2im exactly: %s", ref,
                             what);
            } else {
                assert_close(what, dx2, dx1, nx, 1e-6, 1e-6);
            }
            free(base);
        }
        free(xb);
        free(col1);
        free(col2);
        free(dx1);
        free(dx2);
    }
}

/* cf_conv_implicit_* against the patch matrix (reference im2col, GEMM, col2im), on W1's
 * layers and on odd shapes: several images per call (vectors that hold the end of one image and
 * the start of the next), row and channel counts that are not multiples of the tiles, stride 2
 * with kernels 1, 3, 5 and 7. */
static int implicit_checked;

static void check_implicit(int c, int h, int w, int k, int s, int p, int o, int n_images,
                           cf_rng *rng) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, s, s, p, p));
    if (!cf_conv_implicit_supported(&g)) return; /* no AVX-512 */
    implicit_checked++;
    const int P = g.oh * g.ow, T = k * k, K = c * T;
    const size_t in_n = (size_t)c * h * w, out_n = (size_t)o * P, nx = in_n * n_images;
    char what[160];
    snprintf(what, sizeof what, "implicit c=%d h=%d w=%d k=%d s=%d p=%d o=%d n=%d", c, h, w, k, s,
             p, o, n_images);
    /* inputs between NaN guards that must never be read */
    float *xb = malloc((nx + 64) * sizeof(float)), *x = xb + 32;
    float *dyb = malloc((out_n * n_images + 64) * sizeof(float)), *dy = dyb + 32;
    float *wt = malloc((size_t)o * K * sizeof(float));
    float *scratch = malloc(cf_conv_implicit_scratch(&g, o) * sizeof(float));
    float *packed = malloc(cf_conv_implicit_packed_size(&g, o) * sizeof(float));
    float *y = malloc(out_n * n_images * sizeof(float)), *dx = malloc(nx * sizeof(float));
    float *dwt = malloc((size_t)o * K * sizeof(float));
    float *col = malloc((size_t)K * P * sizeof(float)),
          *ref = malloc((in_n > out_n ? in_n : out_n) * sizeof(float));
    float *dw_ref = calloc((size_t)o * K, sizeof(float));
    for (size_t i = 0; i < nx + 64; i++) xb[i] = NAN;
    for (size_t i = 0; i < out_n * n_images + 64; i++) dyb[i] = NAN;
    fill(rng, x, nx);
    fill(rng, dy, out_n * n_images);
    fill(rng, wt, (size_t)o * K);
    cf_conv_implicit_pack(&g, o, wt, packed);
    cf_conv_implicit_forward(&g, o, packed, x, n_images, y, scratch);
    cf_conv_implicit_pack_dx(&g, o, wt, packed);
    cf_conv_implicit_dx(&g, o, packed, dy, n_images, dx, scratch);
    cf_conv_implicit_wgrad(&g, o, dy, x, n_images, dwt, false, scratch);
    cf_kernels_set_reference(true);
    for (int n = 0; n < n_images; n++) {
        cf_im2col(&g, x + n * in_n, col, P);
        cf_sgemm_strided(o, P, K, wt, K, 1, col, P, ref, P, false);
        /* both sides round K-term float sums in different orders (and OpenBLAS's order
         * depends on the CPU): an absolute slack that grows as sqrt(K) */
        assert_close(what, y + n * out_n, ref, out_n, 1e-5, 4e-6 * sqrt((double)K));
        for (int r = 0; r < o; r++) /* dW += dy . col^T */
            for (int kk = 0; kk < K; kk++) {
                double sum = 0;
                for (int q = 0; q < P; q++)
                    sum += (double)dy[n * out_n + (size_t)r * P + q] * col[(size_t)kk * P + q];
                dw_ref[(size_t)r * K + kk] += (float)sum;
            }
        cf_sgemm_strided(K, P, o, wt, 1, K, dy + n * out_n, P, col, P, false); /* W^T . dy */
        cf_col2im(&g, col, P, ref);
        assert_close(what, dx + n * in_n, ref, in_n, 1e-5, 4e-6 * sqrt((double)o * T));
    }
    cf_kernels_set_reference(false);
    for (int r = 0; r < o; r++)
        for (int kk = 0; kk < K; kk++) {
            const float got = dwt[((size_t)(kk % T) * o + r) * c + kk / T];
            const float want = dw_ref[(size_t)r * K + kk];
            if (fabsf(got - want) > 1e-4f * (1.0f + fabsf(want)))
                fail_msg("%s: dW[%d][%d][%d] = %g, expected %g", what, r, kk / T, kk % T,
                         (double)got, (double)want);
        }
    free(xb);
    free(dyb);
    free(wt);
    free(scratch);
    free(packed);
    free(y);
    free(dx);
    free(dwt);
    free(col);
    free(ref);
    free(dw_ref);
}

static void test_conv_implicit_matches_patch_matrix(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 5);
    /* W1's layers */
    check_implicit(16, 28, 28, 3, 2, 1, 32, 3, &rng);
    check_implicit(32, 14, 14, 3, 1, 1, 32, 2, &rng);
    check_implicit(16, 28, 28, 1, 2, 0, 32, 2, &rng);
    check_implicit(32, 14, 14, 3, 2, 1, 64, 7, &rng);
    check_implicit(64, 7, 7, 3, 1, 1, 64, 5, &rng); /* 49-value planes */
    check_implicit(32, 14, 14, 1, 2, 0, 64, 3, &rng);
    /* odd shapes */
    check_implicit(1, 28, 28, 3, 1, 1, 16, 3, &rng);
    check_implicit(3, 4, 4, 3, 1, 1, 5, 7, &rng); /* 16-value planes */
    check_implicit(2, 5, 7, 5, 1, 2, 13, 4, &rng);
    check_implicit(20, 6, 3, 1, 1, 0, 17, 3, &rng);
    check_implicit(2, 9, 11, 7, 1, 3, 3, 2, &rng);
    check_implicit(20, 8, 10, 3, 2, 1, 9, 4, &rng);
    check_implicit(9, 12, 12, 5, 2, 2, 3, 3, &rng);
    check_implicit(4, 14, 14, 7, 2, 3, 8, 2, &rng);
    check_implicit(3, 64, 64, 3, 1, 1, 8, 1, &rng); /* the largest plane */
    check_implicit(8, 32, 48, 3, 2, 1, 8, 2, &rng); /* phase rows of 16 and 24 */
    for (int o = 1; o <= 17; o += 4)
        for (int n = 1; n <= 4; n++) check_implicit(3, 10, 10, 3, 2, 1, o, n, &rng);
    /* every case above ran wherever the kernels have implicit convolutions (AVX2, AVX-512) */
    if (cf_isa_active() != CF_ISA_GENERIC) assert_int_equal(implicit_checked, 36);
    cf_conv_geom g;
    cf_conv_geom_init(&g, 2, 14, 14, 3, 3, 3, 3, 1, 1);
    assert_false(cf_conv_implicit_supported(&g)); /* stride 3 */
    cf_conv_geom_init(&g, 2, 14, 14, 3, 3, 1, 1, 0, 0);
    assert_false(cf_conv_implicit_supported(&g)); /* stride 1, output smaller than the input */
    cf_conv_geom_init(&g, 2, 15, 15, 3, 3, 2, 2, 1, 1);
    assert_false(cf_conv_implicit_supported(&g)); /* stride 2 on an odd size */
    cf_conv_geom_init(&g, 2, 3, 3, 3, 3, 1, 1, 1, 1);
    assert_false(cf_conv_implicit_supported(&g)); /* plane under 16 */
}

/* |got - want| <= tol * (1 + the sum of |products| behind want), elementwise */
static void check_against(const char *what, const char *part, const float *got, const double *want,
                          const double *mag, size_t n, double tol) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1.0 + mag[i])))
            fail_msg("%s: %s[%zu] = %.9g, expected %.9g (magnitude %.3g)", what, part, i,
                     (double)got[i], want[i], mag[i]);
}

/* cf_conv_implicit_wgrad against the weight gradient summed in double, image by image and tap
 * by tap: batches of several blocks of images (the kernel sums a block in its registers) with a
 * last block cut short, in two calls (the first overwrites or adds to what dwt holds, the second
 * adds), tile heights and widths that divide the rows unevenly, channel counts off the vector
 * size (a masked last vector), strides 1 and 2. Inputs sit between NaN guards; dwt's neighbours
 * are never written. */
static int wgrad_checked;

static void check_implicit_wgrad(int c, int h, int w, int k, int s, int o, int n_images,
                                 bool overwrite, cf_rng *rng) {
    const int p = (k - 1) / 2, T = k * k;
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, k, k, s, s, p, p));
    if (!cf_conv_implicit_supported(&g)) return; /* the portable table */
    wgrad_checked++;
    const int oh = g.oh, ow = g.ow;
    const size_t in_n = (size_t)c * h * w, out_n = (size_t)o * oh * ow;
    const size_t nx = in_n * n_images, ny = out_n * n_images, nw = (size_t)o * c * T;
    char what[160];
    snprintf(what, sizeof what, "implicit wgrad c=%d h=%d w=%d k=%d s=%d o=%d n=%d overwrite=%d", c,
             h, w, k, s, o, n_images, overwrite);
    float *xb = malloc((nx + 64) * sizeof(float)), *x = xb + 32;
    float *dyb = malloc((ny + 64) * sizeof(float)), *dy = dyb + 32;
    float *dwb = malloc((nw + 64) * sizeof(float)), *dwt = dwb + 32;
    float *scratch = malloc(cf_conv_implicit_scratch(&g, o) * sizeof(float));
    double *want = calloc(nw, sizeof(double)), *mag = calloc(nw, sizeof(double));
    for (size_t i = 0; i < nx + 64; i++) xb[i] = NAN;
    for (size_t i = 0; i < ny + 64; i++) dyb[i] = NAN;
    for (size_t i = 0; i < nw + 64; i++) dwb[i] = -3.0f;
    fill(rng, x, nx);
    fill(rng, dy, ny);
    fill(rng, dwt, nw);
    if (overwrite) {
        for (size_t i = 0; i < nw; i++) dwt[i] = NAN; /* the first call must not read it */
    } else {
        for (size_t i = 0; i < nw; i++) want[i] = dwt[i];
    }
    const int first = n_images / 2 + 1;
    cf_conv_implicit_wgrad(&g, o, dy, x, first, dwt, !overwrite, scratch);
    cf_conv_implicit_wgrad(&g, o, dy + first * out_n, x + first * in_n, n_images - first, dwt, true,
                           scratch);
    for (int n = 0; n < n_images; n++)
        for (int r = 0; r < o; r++)
            for (int ch = 0; ch < c; ch++)
                for (int t = 0; t < T; t++) {
                    const int i = t / k, j = t % k;
                    const size_t wi = ((size_t)t * o + r) * c + ch; /* [tap][out][in] */
                    for (int oy = 0; oy < oh; oy++)
                        for (int ox = 0; ox < ow; ox++) {
                            const int iy = oy * s - p + i, ix = ox * s - p + j;
                            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                            const double v =
                                (double)dy[n * out_n + ((size_t)r * oh + oy) * ow + ox] *
                                x[n * in_n + ((size_t)ch * h + iy) * w + ix];
                            want[wi] += v;
                            mag[wi] += fabs(v);
                        }
                }
    check_against(what, "dwt", dwt, want, mag, nw, 1e-5);
    for (int i = 0; i < 32; i++)
        if (dwb[i] != -3.0f || dwt[nw + i] != -3.0f)
            fail_msg("%s: wrote outside dwt (%d before or after)", what, i);
    free(xb);
    free(dyb);
    free(dwb);
    free(scratch);
    free(want);
    free(mag);
}

static void test_conv_implicit_wgrad_blocks(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 9);
    check_implicit_wgrad(64, 7, 7, 3, 1, 64, 7, false, &rng); /* W1's: blocks of 3 7x7 images */
    check_implicit_wgrad(32, 14, 14, 3, 1, 32, 3, true, &rng);
    check_implicit_wgrad(16, 28, 28, 3, 2, 32, 3, false, &rng);
    check_implicit_wgrad(32, 14, 14, 3, 2, 64, 9, true, &rng);
    check_implicit_wgrad(20, 8, 8, 3, 1, 13, 4, false, &rng);  /* a masked last vector */
    check_implicit_wgrad(5, 6, 6, 3, 1, 30, 11, true, &rng);   /* one masked vector, tall tiles */
    check_implicit_wgrad(8, 10, 10, 5, 1, 25, 5, false, &rng); /* one vector, uneven rows */
    check_implicit_wgrad(12, 12, 16, 3, 2, 7, 4, true, &rng);
    /* 1x1 stride 2 (residual shortcuts): every other row and column of the image */
    check_implicit_wgrad(16, 28, 28, 1, 2, 32, 3, false, &rng);
    check_implicit_wgrad(32, 14, 14, 1, 2, 64, 7, true, &rng);
    check_implicit_wgrad(12, 12, 16, 1, 2, 7, 4, true, &rng);
    check_implicit_wgrad(40, 8, 6, 3, 1, 3, 3, false, &rng);  /* fewer rows than a tile */
    check_implicit_wgrad(3, 4, 4, 3, 1, 70, 17, false, &rng); /* 16-value planes, blocks of 8 */
    /* four vectors of channels, the last masked (AVX-512: one tile of 4 x 6 rows) */
    check_implicit_wgrad(57, 7, 7, 3, 1, 40, 5, true, &rng);
    if (cf_isa_active() != CF_ISA_GENERIC) assert_int_equal(wgrad_checked, 14);
}

/* cf_transpose, exactly, on both paths: row and column counts below, at and past the 16 x 16
 * blocks, with strides wider than the matrix (the gaps are never written). */
/* cf_conv_winograd_* against the direct convolution summed in double (forward, dx and the
 * weight gradient), on W1's and W2's 3x3 stride-1 layers and on odd shapes: odd and tiny
 * planes (tiles that hang over the edge), channel counts off the vector and tile sizes,
 * several images per call and blocks of images that end mid-batch, an image cut into bands, and a
 * batch split into calls (which must not change a bit of y or dx). Inputs sit between NaN guards.
 */
static int winograd_checked;

static void check_winograd(int c, int h, int w, int o, int n_images, cf_rng *rng) {
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, c, h, w, 3, 3, 1, 1, 1, 1));
    if (!cf_conv_winograd_supported(&g)) return; /* the portable table */
    winograd_checked++;
    const size_t plane = (size_t)h * w, in_n = (size_t)c * plane, out_n = (size_t)o * plane;
    const size_t nx = in_n * n_images, ny = out_n * n_images, nw = (size_t)o * c * 9;
    char what[160];
    snprintf(what, sizeof what, "winograd c=%d h=%d w=%d o=%d n=%d", c, h, w, o, n_images);
    float *xb = malloc((nx + 64) * sizeof(float)), *x = xb + 32;
    float *dyb = malloc((ny + 64) * sizeof(float)), *dy = dyb + 32;
    float *wt = malloc(nw * sizeof(float)), *dw = calloc(nw, sizeof(float));
    float *scratch = malloc(cf_conv_winograd_scratch(&g, o) * sizeof(float));
    float *u = malloc(cf_conv_winograd_packed_size(&g, o) * sizeof(float));
    float *du = malloc(cf_conv_winograd_packed_size(&g, o) * sizeof(float));
    float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
    float *y2 = malloc(ny * sizeof(float)), *dx2 = malloc(nx * sizeof(float));
    double *ry = calloc(ny, sizeof(double)), *my = calloc(ny, sizeof(double));
    double *rdx = calloc(nx, sizeof(double)), *mdx = calloc(nx, sizeof(double));
    double *rdw = calloc(nw, sizeof(double)), *mdw = calloc(nw, sizeof(double));
    for (size_t i = 0; i < nx + 64; i++) xb[i] = NAN;
    for (size_t i = 0; i < ny + 64; i++) dyb[i] = NAN;
    fill(rng, x, nx);
    fill(rng, dy, ny);
    fill(rng, wt, nw);
    cf_conv_winograd_pack(&g, o, wt, u);
    cf_conv_winograd_forward(&g, o, u, x, n_images, y, scratch);
    for (int n0 = 0; n0 < n_images; n0 += 2) /* the same batch in calls of two images */
        cf_conv_winograd_forward(&g, o, u, x + n0 * in_n, n_images - n0 < 2 ? 1 : 2,
                                 y2 + n0 * out_n, scratch);
    cf_conv_winograd_pack_dx(&g, o, wt, u);
    cf_conv_winograd_dx(&g, o, u, dy, n_images, dx, scratch);
    for (int n0 = 0; n0 < n_images; n0 += 2)
        cf_conv_winograd_dx(&g, o, u, dy + n0 * out_n, n_images - n0 < 2 ? 1 : 2, dx2 + n0 * in_n,
                            scratch);
    /* the weight gradient in two calls: the first overwrites du, the second accumulates */
    const int first = n_images / 2;
    cf_conv_winograd_wgrad(&g, o, dy, x, first, du, false, scratch);
    cf_conv_winograd_wgrad(&g, o, dy + first * out_n, x + first * in_n, n_images - first, du, true,
                           scratch);
    cf_conv_winograd_wgrad_add(&g, o, du, dw);
    for (int n = 0; n < n_images; n++)
        for (int r = 0; r < o; r++)
            for (int ch = 0; ch < c; ch++)
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        const double wv = wt[(((size_t)r * c + ch) * 3 + i) * 3 + j];
                        for (int py = 0; py < h; py++)
                            for (int px = 0; px < w; px++) {
                                const int iy = py + i - 1, ix = px + j - 1;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                                const size_t xi = n * in_n + ch * plane + (size_t)iy * w + ix;
                                const size_t yi = n * out_n + r * plane + (size_t)py * w + px;
                                const size_t wi = (((size_t)r * c + ch) * 3 + i) * 3 + j;
                                ry[yi] += wv * x[xi];
                                my[yi] += fabs(wv * x[xi]);
                                rdx[xi] += wv * dy[yi];
                                mdx[xi] += fabs(wv * dy[yi]);
                                rdw[wi] += (double)dy[yi] * x[xi];
                                mdw[wi] += fabs((double)dy[yi] * x[xi]);
                            }
                    }
    /* F(2x2, 3x3) rounds each product's transformed factors once more than the direct sum:
     * a few float epsilons of the magnitude */
    check_against(what, "y", y, ry, my, ny, 3e-6);
    check_against(what, "dx", dx, rdx, mdx, nx, 3e-6);
    check_against(what, "dW", dw, rdw, mdw, nw, 3e-6);
    if (memcmp(y, y2, ny * sizeof(float)) != 0) fail_msg("%s: y depends on the calls", what);
    if (memcmp(dx, dx2, nx * sizeof(float)) != 0) fail_msg("%s: dx depends on the calls", what);
    free(xb);
    free(dyb);
    free(wt);
    free(dw);
    free(scratch);
    free(u);
    free(du);
    free(y);
    free(dx);
    free(y2);
    free(dx2);
    free(ry);
    free(my);
    free(rdx);
    free(mdx);
    free(rdw);
    free(mdw);
}

static void test_conv_winograd_matches_direct(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 11);
    check_winograd(32, 28, 28, 32, 2, &rng); /* W2's layers */
    check_winograd(32, 14, 14, 64, 3, &rng);
    check_winograd(64, 7, 7, 128, 5, &rng);
    check_winograd(32, 14, 14, 32, 3, &rng); /* W1's */
    check_winograd(64, 7, 7, 64, 7, &rng);
    check_winograd(17, 7, 9, 19, 3, &rng); /* odd planes, channels off the vectors */
    check_winograd(16, 5, 5, 16, 9, &rng);
    check_winograd(20, 2, 2, 24, 4, &rng); /* one tile */
    check_winograd(16, 3, 2, 16, 3, &rng);
    check_winograd(16, 2, 37, 16, 2, &rng); /* a row longer than two vectors of tiles */
    check_winograd(16, 33, 35, 18, 1, &rng);
    check_winograd(16, 71, 46, 16, 2, &rng); /* bands of tile rows, the last one short */
    check_winograd(3, 6, 6, 5, 3, &rng);     /* few channels (Conv2d keeps these on im2col) */
    if (cf_isa_active() != CF_ISA_GENERIC) assert_int_equal(winograd_checked, 13);
    cf_conv_geom g;
    assert_true(cf_conv_geom_init(&g, 16, 8, 8, 3, 3, 2, 2, 1, 1));
    assert_false(cf_conv_winograd_supported(&g)); /* stride 2 */
    assert_true(cf_conv_geom_init(&g, 16, 8, 8, 3, 3, 1, 1, 0, 0));
    assert_false(cf_conv_winograd_supported(&g)); /* no padding */
    assert_true(cf_conv_geom_init(&g, 16, 8, 8, 5, 5, 1, 1, 2, 2));
    assert_false(cf_conv_winograd_supported(&g)); /* 5x5 */
}

/* cf_max_pool_2x2_plane of the active table against the portable loop, bitwise in values and
 * positions: odd and even sizes, rows of whole vectors and tails, ties, NaN (the last NaN of a
 * window wins, as PyTorch's), -inf and windows of -inf only. */
static void test_max_pool_2x2_matches_portable(void **state) {
    (void)state;
    const cf_isa active = cf_isa_active();
    cf_rng rng;
    cf_rng_seed(&rng, 13);
    const int sizes[][2] = {{2, 2}, {3, 5}, {8, 8}, {7, 33}, {36, 37}, {5, 66}, {64, 64}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int h = sizes[s][0], w = sizes[s][1], n = (h / 2) * (w / 2);
        float *x = malloc((size_t)h * w * sizeof(float));
        float *y1 = malloc((size_t)n * sizeof(float)), *y2 = malloc((size_t)n * sizeof(float));
        int32_t *i1 = malloc((size_t)n * sizeof(int32_t)),
                *i2 = malloc((size_t)n * sizeof(int32_t));
        for (int i = 0; i < h * w; i++) {
            const double u = cf_rng_uniform(&rng);
            x[i] = u < 0.05 ? NAN : u < 0.1 ? -INFINITY : (float)(0.5 * floor(8 * u - 4));
        }
        cf_max_pool_2x2_plane(x, h, w, y1, i1);
        cf_set_isa(CF_ISA_GENERIC);
        cf_max_pool_2x2_plane(x, h, w, y2, i2);
        cf_set_isa(active);
        if (memcmp(y1, y2, (size_t)n * sizeof(float)) != 0 ||
            memcmp(i1, i2, (size_t)n * sizeof(int32_t)) != 0)
            fail_msg("max pool 2x2 %dx%d differs from the portable loop", h, w);
        for (int o = 0; o < n; o++) { /* the position holds the value */
            const float at = x[i2[o]];
            if (memcmp(&at, &y2[o], sizeof at) != 0)
                fail_msg("max pool 2x2 %dx%d: output %d", h, w, o);
        }
        free(x);
        free(y1);
        free(y2);
        free(i1);
        free(i2);
    }
}

/* cf_max_sum_plane of the active table against the portable loop: the maximum and its first
 * position bitwise, the sum within rounding; sizes around each vector length, ties, and NaN
 * (the first NaN wins, from the portable loop the table leaves such planes to). */
static void test_max_sum_plane_matches_portable(void **state) {
    (void)state;
    const cf_isa active = cf_isa_active();
    cf_rng rng;
    cf_rng_seed(&rng, 17);
    const size_t sizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 49, 196, 784};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int variant = 0; variant < 4; variant++) {
            const size_t n = sizes[s];
            float *x = malloc(n * sizeof(float));
            double mag = 0;
            for (size_t i = 0; i < n; i++) {
                x[i] = (float)(0.25 * floor(16 * cf_rng_uniform(&rng) - 12)); /* mostly < 0 */
                mag += fabs(x[i]);
            }
            if (variant == 1) x[n / 2] = x[n - 1] = 9.0f; /* a tie: the first wins */
            if (variant == 2) x[n - 1] = 9.0f;            /* the maximum in the tail */
            if (variant == 3) x[(n * 2) / 3] = NAN;
            float b1, b2, s1, s2;
            int32_t a1, a2;
            cf_max_sum_plane(x, n, &b1, &a1, &s1);
            cf_set_isa(CF_ISA_GENERIC);
            cf_max_sum_plane(x, n, &b2, &a2, &s2);
            cf_set_isa(active);
            if (memcmp(&b1, &b2, sizeof b1) != 0 || a1 != a2)
                fail_msg("max_sum_plane n=%zu variant %d: max %g at %d, want %g at %d", n, variant,
                         (double)b1, a1, (double)b2, a2);
            if (variant != 3 && fabs((double)s1 - s2) > 1e-6 * mag + 1e-30)
                fail_msg("max_sum_plane n=%zu: sum %g, want %g", n, (double)s1, (double)s2);
            free(x);
        }
}

static void test_transpose(void **state) {
    (void)state;
    cf_rng rng;
    cf_rng_seed(&rng, 6);
    const int sizes[] = {1, 7, 16, 17, 33, 49};
    for (int ref = 0; ref < 2; ref++)
        for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
            for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
                const int rows = sizes[a], cols = sizes[b], lds = cols + 3, ldd = rows + 5;
                float *src = malloc((size_t)rows * lds * sizeof(float));
                float *dst = malloc((size_t)cols * ldd * sizeof(float));
                fill(&rng, src, (size_t)rows * lds);
                for (size_t i = 0; i < (size_t)cols * ldd; i++) dst[i] = -7.0f;
                cf_kernels_set_reference(ref == 1);
                cf_transpose(rows, cols, src, lds, dst, ldd);
                cf_kernels_set_reference(false);
                for (int j = 0; j < cols; j++)
                    for (int i = 0; i < ldd; i++) {
                        const float want = i < rows ? src[(size_t)i * lds + j] : -7.0f;
                        if (dst[(size_t)j * ldd + i] != want)
                            fail_msg("transpose %dx%d (reference %d): dst[%d][%d] = %g, want %g",
                                     rows, cols, ref, j, i, (double)dst[(size_t)j * ldd + i],
                                     (double)want);
                    }
                free(src);
                free(dst);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgemm_strided_matches_reference),
        cmocka_unit_test(test_sgemm_strided_sums_in_order),
        cmocka_unit_test(test_sgemm_nt_matches_reference),
        cmocka_unit_test(test_im2col_col2im_match_reference),
        cmocka_unit_test(test_conv_implicit_matches_patch_matrix),
        cmocka_unit_test(test_conv_implicit_wgrad_blocks),
        cmocka_unit_test(test_conv_winograd_matches_direct),
        cmocka_unit_test(test_max_pool_2x2_matches_portable),
        cmocka_unit_test(test_max_sum_plane_matches_portable),
        cmocka_unit_test(test_transpose),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
