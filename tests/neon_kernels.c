/* The NEON kernel table (src/tensor/isa_neon.c) against the portable one, on arm64 (built by
 * tests/neon.cmake with a cross compiler and run under qemu-aarch64 where there is no arm64
 * machine). Built from the tensor layer's own sources without OpenBLAS: the one CBLAS call of
 * kernels.c is served by plain loops below. Each entry of the table is checked on random shapes
 * with ragged tails:
 *
 *   sgemm_strided   against the product in double (both ways of reading A, accumulate or not,
 *                   padded row strides left untouched)
 *   implicit_run    through cf_conv_implicit_forward and cf_conv_implicit_dx (stride 1 and 2,
 *                   kernels 1-5, vectors that span two images), against the convolution and its
 *                   adjoint in double
 *   implicit_wgrad  through cf_conv_implicit_wgrad (and with it transpose), against the weight
 *                   gradient in double
 *   wino            through cf_conv_winograd_* (forward, dx, wgrad, bands of large images),
 *                   against the convolution, its adjoint and its weight gradient in double
 *   transpose       bitwise, padding untouched
 *   bn              the four plane kernels against the portable table's, NaN and -0 under the
 *                   fused ReLU bitwise; a residual block's mask kernels (the bits) bitwise
 *                   against NEON's own affine, dy_sums and dx given the masked gradient
 *   max_sum_plane   against the scalar loop (NaN planes left to it)
 *   optim           SGD and Adam in every variant, bitwise equal to the portable table
 *
 * Every buffer a kernel reads or writes ends (or starts) at a page that may not be touched, so a
 * masked-out lane that reached memory past a tail would crash the test. The instruction-set
 * choice is checked too: NEON is the best on arm64 and CF_ISA-style caps behave as documented.
 * Usage: neon_kernels [seed], or neon_kernels dispatch (the instruction-set choice alone, e.g.
 * under CF_ISA). Exit status 0 when every check passes. */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static long checks, failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            if (++failures <= 25) {                                                                \
                fprintf(stderr, "%s:%d: failed: ", __FILE__, __LINE__);                            \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* ---- the CBLAS call of kernels.c, as plain loops (row-major only, as corefit calls it) ----- */

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a, enum CBLAS_TRANSPOSE trans_b,
                 int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc) {
    (void)order;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                const float av = trans_a == CblasTrans ? a[p * lda + i] : a[i * lda + p];
                const float bv = trans_b == CblasTrans ? b[j * ldb + p] : b[p * ldb + j];
                s += (double)av * bv;
            }
            float *cp = c + (size_t)i * ldc + j;
            *cp = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *cp));
        }
}

/* ---- core's error record, which conv_bf16.c's refusals of a stale pack call (this program links
 * src/tensor alone): the status, the message dropped ---------------------------------------- */

cf_status cf_fail(cf_status status, const char *fmt, ...) {
    (void)fmt;
    return status;
}

/* ---- random numbers (splitmix64) ----------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rnd(int n) { /* [0, n) */
    return (int)(rng_next() % (uint64_t)n);
}
static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * 0x1.0p-24);
}
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = uniform(-1.0f, 1.0f);
}

/* ---- buffers fenced by a page that may not be touched -------------------------------------- */

typedef struct fenced {
    float *p;
    void *map;
    size_t len;
} fenced;

/* n floats (n > 0) that end where a PROT_NONE page starts (at_end) or start where one ends. */
static fenced fenced_alloc(size_t n, bool at_end) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t bytes = (n * sizeof(float) + page - 1) / page * page;
    fenced f = {.len = bytes + page};
    f.map = mmap(NULL, f.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f.map == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    char *base = f.map;
    if (at_end) {
        mprotect(base + bytes, page, PROT_NONE);
        f.p = (float *)(base + bytes - n * sizeof(float));
    } else {
        mprotect(base, page, PROT_NONE);
        f.p = (float *)(base + page);
    }
    return f;
}
static void fenced_free(fenced *f) {
    munmap(f->map, f->len);
}

/* |got - want| within rel * scale + abs */
static bool close_to(double got, double want, double scale, double rel) {
    return fabs(got - want) <= rel * scale + 1e-6;
}

/* ---- the instruction-set choice ------------------------------------------------------------ */

static void test_dispatch(void) {
    CHECK(cf_isa_best() == CF_ISA_NEON, "best is %s", cf_isa_name(cf_isa_best()));
    /* at load: the best, or as CF_ISA caps it (x86 caps leave the portable kernels) */
    const char *env = getenv("CF_ISA");
    cf_isa want = CF_ISA_NEON;
    if (env && *env) {
        CHECK(cf_isa_parse(env, &want), "CF_ISA=%s", env);
        if (want != CF_ISA_NEON) want = CF_ISA_GENERIC;
    }
    CHECK(cf_isa_active() == want && cf_active_kernels->isa == want, "active is %s, want %s",
          cf_isa_name(cf_isa_active()), cf_isa_name(want));
    cf_isa parsed = CF_ISA_GENERIC;
    CHECK(cf_isa_parse("neon", &parsed) && parsed == CF_ISA_NEON, "parse neon");
    CHECK(strcmp(cf_isa_name(CF_ISA_NEON), "neon") == 0, "name %s", cf_isa_name(CF_ISA_NEON));
    CHECK(cf_set_isa(CF_ISA_GENERIC) == CF_ISA_GENERIC && cf_active_kernels == &cf_kernels_generic,
          "cap generic");
    /* x86 caps: no set at or below them but the portable one on arm64 */
    CHECK(cf_set_isa(CF_ISA_AVX512) == CF_ISA_GENERIC, "cap avx512");
    CHECK(cf_set_isa(CF_ISA_NEON) == CF_ISA_NEON && cf_active_kernels == &cf_kernels_neon,
          "cap neon");
    CHECK(cf_kernels_neon.bn && cf_kernels_neon.optim && cf_kernels_neon.sgemm_strided &&
              cf_kernels_neon.implicit_run && cf_kernels_neon.implicit_wgrad,
          "table entries");
}

/* ---- sgemm_strided ------------------------------------------------------------------------- */

static int gemm_declined;

static void check_gemm(int m, int n, int k, bool trans_a, bool accumulate) {
    const int ldb = n + rnd(3), ldc = n + rnd(3);
    const ptrdiff_t a_row = trans_a ? 1 : k + rnd(2), a_col = trans_a ? m + rnd(2) : 1;
    const size_t na = (size_t)((m - 1) * a_row + (k - 1) * a_col + 1);
    const size_t nb = (size_t)(k - 1) * ldb + n, nc = (size_t)(m - 1) * ldc + n;
    fenced fa = fenced_alloc(na, true), fb = fenced_alloc(nb, true), fc = fenced_alloc(nc, true);
    float *a = fa.p, *b = fb.p, *c = fc.p, *c0 = malloc(nc * sizeof(float));
    fill(a, na);
    fill(b, nb);
    fill(c, nc);
    memcpy(c0, c, nc * sizeof(float));
    if (!cf_kernels_neon.sgemm_strided(m, n, k, a, a_row, a_col, b, ldb, c, ldc, accumulate)) {
        /* declined: only one vector of columns with few rows is left to BLAS */
        CHECK(n <= 4 && m < 16, "declined %dx%dx%d", m, n, k);
        CHECK(memcmp(c, c0, nc * sizeof(float)) == 0, "declined but wrote C");
        gemm_declined++;
    } else {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < ldc && (size_t)i * ldc + j < nc; j++) {
                const size_t at = (size_t)i * ldc + j;
                if (j >= n) { /* the row stride's padding */
                    CHECK(memcmp(&c[at], &c0[at], sizeof(float)) == 0, "padding (%d, %d) written",
                          i, j);
                    continue;
                }
                double s = accumulate ? c0[at] : 0.0, mag = fabs(s);
                for (int p = 0; p < k; p++) {
                    const double t = (double)a[i * a_row + p * a_col] * b[(size_t)p * ldb + j];
                    s += t;
                    mag += fabs(t);
                }
                CHECK(close_to(c[at], s, mag, 1e-5), "gemm %dx%dx%d%s%s (%d, %d): %g, want %g", m,
                      n, k, trans_a ? " A^T" : "", accumulate ? " +=" : "", i, j, c[at], s);
            }
    }
    free(c0);
    fenced_free(&fa);
    fenced_free(&fb);
    fenced_free(&fc);
}

static void test_gemm(void) {
    for (int m = 1; m <= 17; m++) /* every tile height and edge, narrow and wide */
        for (int n = 1; n <= 14; n++) check_gemm(m, n, 1 + rnd(9), rnd(2), rnd(2));
    for (int t = 0; t < 200; t++) check_gemm(1 + rnd(40), 1 + rnd(70), 1 + rnd(40), rnd(2), rnd(2));
}

/* ---- transpose ----------------------------------------------------------------------------- */

static void test_transpose(void) {
    for (int t = 0; t < 150; t++) {
        const int rows = 1 + rnd(37), cols = 1 + rnd(37);
        const ptrdiff_t lds = cols + rnd(3), ldd = rows + rnd(3);
        const size_t ns = (size_t)(rows - 1) * lds + cols, nd = (size_t)(cols - 1) * ldd + rows;
        fenced fs = fenced_alloc(ns, true), fd = fenced_alloc(nd, true);
        fill(fs.p, ns);
        for (size_t i = 0; i < nd; i++) fd.p[i] = NAN;
        cf_kernels_neon.transpose(rows, cols, fs.p, lds, fd.p, ldd);
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < ldd && (size_t)j * ldd + i < nd; i++) {
                const float got = fd.p[j * ldd + i];
                if (i < rows)
                    CHECK(got == fs.p[i * lds + j], "transpose %dx%d (%d, %d)", rows, cols, i, j);
                else
                    CHECK(isnan(got), "transpose %dx%d wrote padding", rows, cols);
            }
        fenced_free(&fs);
        fenced_free(&fd);
    }
}

/* ---- implicit convolutions ----------------------------------------------------------------- */

static void check_conv(int stride, int k, int c, int o, int h, int w, int n, bool fence_end) {
    const int p = (k - 1) / 2, T = k * k;
    cf_conv_geom g;
    CHECK(cf_conv_geom_init(&g, c, h, w, k, k, stride, stride, p, p), "geometry");
    if (!cf_conv_implicit_supported(&g)) {
        CHECK(false, "implicit convolution not supported: k%d s%d %dx%d", k, stride, h, w);
        return;
    }
    const int oh = g.oh, ow = g.ow;
    const size_t image = (size_t)c * h * w, out_image = (size_t)o * oh * ow;
    const size_t nw = (size_t)o * c * T, nx = n * image, ny = n * out_image;
    float *wt = malloc(nw * sizeof(float));
    float *packed = malloc(cf_conv_implicit_packed_size(&g, o) * sizeof(float));
    float *scratch = malloc(cf_conv_implicit_scratch(&g, o) * sizeof(float));
    float *dwt = malloc(nw * sizeof(float));
    fenced fx = fenced_alloc(nx, fence_end), fy = fenced_alloc(ny, fence_end);
    fenced fdy = fenced_alloc(ny, fence_end), fdx = fenced_alloc(nx, fence_end);
    float *x = fx.p, *y = fy.p, *dy = fdy.p, *dx = fdx.p;
    fill(wt, nw);
    fill(x, nx);
    fill(dy, ny);
    for (size_t i = 0; i < ny; i++) y[i] = NAN;
    for (size_t i = 0; i < nx; i++) dx[i] = NAN;

    cf_conv_implicit_pack(&g, o, wt, packed);
    cf_conv_implicit_forward(&g, o, packed, x, n, y, scratch);
    cf_conv_implicit_pack_dx(&g, o, wt, packed);
    cf_conv_implicit_dx(&g, o, packed, dy, n, dx, scratch);
    cf_conv_implicit_wgrad(&g, o, dy, x, n, dwt, false, scratch);

    double *rdx = calloc(nx, sizeof(double)), *mdx = calloc(nx, sizeof(double));
    double *rdw = calloc(nw, sizeof(double)), *mdw = calloc(nw, sizeof(double));
    int bad = 0;
    for (int b = 0; b < n; b++)
        for (int oc = 0; oc < o; oc++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    const size_t yi = b * out_image + ((size_t)oc * oh + oy) * ow + ox;
                    double s = 0, mag = 0;
                    for (int ic = 0; ic < c; ic++)
                        for (int i = 0; i < k; i++)
                            for (int j = 0; j < k; j++) {
                                const int iy = oy * stride - p + i, ix = ox * stride - p + j;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                                const size_t xi = b * image + ((size_t)ic * h + iy) * w + ix;
                                const size_t wi = ((size_t)oc * c + ic) * T + i * k + j;
                                s += (double)wt[wi] * x[xi];
                                mag += fabs((double)wt[wi] * x[xi]);
                                rdx[xi] += (double)wt[wi] * dy[yi];
                                mdx[xi] += fabs((double)wt[wi] * dy[yi]);
                                rdw[wi] += (double)dy[yi] * x[xi];
                                mdw[wi] += fabs((double)dy[yi] * x[xi]);
                            }
                    if (!close_to(y[yi], s, mag, 1e-5) && bad++ < 3)
                        CHECK(false, "forward k%d s%d c%d o%d %dx%d n%d at %zu: %g, want %g", k,
                              stride, c, o, h, w, n, yi, y[yi], s);
                }
    for (size_t i = 0; i < nx; i++)
        if (!close_to(dx[i], rdx[i], mdx[i], 1e-5) && bad++ < 3)
            CHECK(false, "dx k%d s%d c%d o%d %dx%d n%d at %zu: %g, want %g", k, stride, c, o, h, w,
                  n, i, dx[i], rdx[i]);
    for (int oc = 0; oc < o; oc++)
        for (int ic = 0; ic < c; ic++)
            for (int t = 0; t < T; t++) {
                const size_t wi = ((size_t)oc * c + ic) * T + t;
                const float got = dwt[((size_t)t * o + oc) * c + ic];
                if (!close_to(got, rdw[wi], mdw[wi], 1e-5) && bad++ < 3)
                    CHECK(false, "wgrad k%d s%d c%d o%d %dx%d n%d (%d, %d, %d): %g, want %g", k,
                          stride, c, o, h, w, n, oc, ic, t, got, rdw[wi]);
            }
    CHECK(bad == 0, "convolution k%d s%d c%d o%d %dx%d n%d: %d values off", k, stride, c, o, h, w,
          n, bad);
    free(rdx);
    free(mdx);
    free(rdw);
    free(mdw);
    free(wt);
    free(packed);
    free(scratch);
    free(dwt);
    fenced_free(&fx);
    fenced_free(&fy);
    fenced_free(&fdy);
    fenced_free(&fdx);
}

static void test_conv(void) {
    static const int k1[] = {1, 3, 5}, k2[] = {1, 3};
    for (int t = 0; t < 120; t++) {
        const int c = 1 + rnd(13), o = 1 + rnd(19), n = 1 + rnd(3);
        if (t % 2 == 0) {
            int h, w;
            do {
                h = 2 + rnd(13);
                w = 2 + rnd(13);
            } while (h * w < 16);
            check_conv(1, k1[rnd(3)], c, o, h, w, n, t % 4 == 0);
        } else {
            const int h = 2 * (2 + rnd(6)), w = 2 * (2 + rnd(6));
            if ((h / 2) * (w / 2) < 16) continue;
            check_conv(2, k2[rnd(2)], c, o, h, w, n, t % 4 == 1);
        }
    }
}

/* Winograd F(2x2, 3x3) (the wino transforms, through cf_conv_winograd_*): forward, dx and the
 * weight gradient against the direct sums in double; inputs and outputs fenced. */
static void check_winograd(int c, int o, int h, int w, int n, bool fence_end) {
    cf_conv_geom g;
    CHECK(cf_conv_geom_init(&g, c, h, w, 3, 3, 1, 1, 1, 1), "geometry");
    if (!cf_conv_winograd_supported(&g)) {
        CHECK(false, "winograd not supported: %dx%d", h, w);
        return;
    }
    const size_t image = (size_t)c * h * w, out_image = (size_t)o * h * w;
    const size_t nw = (size_t)o * c * 9, nx = n * image, ny = n * out_image;
    float *wt = malloc(nw * sizeof(float)), *dw = calloc(nw, sizeof(float));
    float *u = malloc(cf_conv_winograd_packed_size(&g, o) * sizeof(float));
    float *du = malloc(cf_conv_winograd_packed_size(&g, o) * sizeof(float));
    float *scratch = malloc(cf_conv_winograd_scratch(&g, o) * sizeof(float));
    fenced fx = fenced_alloc(nx, fence_end), fy = fenced_alloc(ny, fence_end);
    fenced fdy = fenced_alloc(ny, fence_end), fdx = fenced_alloc(nx, fence_end);
    float *x = fx.p, *y = fy.p, *dy = fdy.p, *dx = fdx.p;
    fill(wt, nw);
    fill(x, nx);
    fill(dy, ny);
    cf_conv_winograd_pack(&g, o, wt, u);
    cf_conv_winograd_forward(&g, o, u, x, n, y, scratch);
    cf_conv_winograd_pack_dx(&g, o, wt, u);
    cf_conv_winograd_dx(&g, o, u, dy, n, dx, scratch);
    cf_conv_winograd_wgrad(&g, o, dy, x, n, du, false, scratch);
    cf_conv_winograd_wgrad_add(&g, o, du, dw);
    double *ry = calloc(ny, sizeof(double)), *my = calloc(ny, sizeof(double));
    double *rdx = calloc(nx, sizeof(double)), *mdx = calloc(nx, sizeof(double));
    double *rdw = calloc(nw, sizeof(double)), *mdw = calloc(nw, sizeof(double));
    for (int b = 0; b < n; b++)
        for (int oc = 0; oc < o; oc++)
            for (int ic = 0; ic < c; ic++)
                for (int t = 0; t < 9; t++) {
                    const size_t wi = ((size_t)oc * c + ic) * 9 + t;
                    for (int py = 0; py < h; py++)
                        for (int px = 0; px < w; px++) {
                            const int iy = py + t / 3 - 1, ix = px + t % 3 - 1;
                            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                            const size_t xi = b * image + ((size_t)ic * h + iy) * w + ix;
                            const size_t yi = b * out_image + ((size_t)oc * h + py) * w + px;
                            ry[yi] += (double)wt[wi] * x[xi];
                            my[yi] += fabs((double)wt[wi] * x[xi]);
                            rdx[xi] += (double)wt[wi] * dy[yi];
                            mdx[xi] += fabs((double)wt[wi] * dy[yi]);
                            rdw[wi] += (double)dy[yi] * x[xi];
                            mdw[wi] += fabs((double)dy[yi] * x[xi]);
                        }
                }
    int bad = 0;
    for (size_t i = 0; i < ny; i++)
        if (!close_to(y[i], ry[i], my[i], 3e-6) && bad++ < 3)
            CHECK(false, "winograd forward c%d o%d %dx%d n%d at %zu: %g, want %g", c, o, h, w, n, i,
                  y[i], ry[i]);
    for (size_t i = 0; i < nx; i++)
        if (!close_to(dx[i], rdx[i], mdx[i], 3e-6) && bad++ < 3)
            CHECK(false, "winograd dx c%d o%d %dx%d n%d at %zu: %g, want %g", c, o, h, w, n, i,
                  dx[i], rdx[i]);
    for (size_t i = 0; i < nw; i++)
        if (!close_to(dw[i], rdw[i], mdw[i], 3e-6) && bad++ < 3)
            CHECK(false, "winograd dW c%d o%d %dx%d n%d at %zu: %g, want %g", c, o, h, w, n, i,
                  dw[i], rdw[i]);
    CHECK(bad == 0, "winograd c%d o%d %dx%d n%d: %d values off", c, o, h, w, n, bad);
    free(ry);
    free(my);
    free(rdx);
    free(mdx);
    free(rdw);
    free(mdw);
    free(wt);
    free(dw);
    free(u);
    free(du);
    free(scratch);
    fenced_free(&fx);
    fenced_free(&fy);
    fenced_free(&fdy);
    fenced_free(&fdx);
}

static void test_winograd(void) {
    for (int t = 0; t < 24; t++)
        check_winograd(1 + rnd(20), 1 + rnd(20), 2 + rnd(13), 2 + rnd(13), 1 + rnd(3), t % 2 == 0);
    check_winograd(16, 16, 71, 46, 1, true); /* bands of tile rows */
}

/* ---- BatchNorm planes ---------------------------------------------------------------------- */

static void check_bn(int64_t s) {
    const cf_bn_kernels *nb = cf_kernels_neon.bn, *gb = cf_kernels_generic.bn;
    const float scale = uniform(-2.0f, 2.0f), shift = uniform(-1.0f, 1.0f);
    const float mean = uniform(-0.3f, 0.3f);
    const float k1 = uniform(-1, 1), k2 = uniform(-1, 1), k3 = uniform(-1, 1);
    fenced fx = fenced_alloc(s, true), fdy = fenced_alloc(s, true), fadd = fenced_alloc(s, true);
    fenced fy1 = fenced_alloc(s, true), fy2 = fenced_alloc(s, true);
    float *x = fx.p, *dy = fdy.p, *add = fadd.p, *y1 = fy1.p, *y2 = fy2.p;
    /* no value on the fused ReLU's edge, where a fused and an unfused multiply-add may round to
     * different sides of zero */
    for (int64_t i = 0; i < s; i++) do
            x[i] = uniform(-1.0f, 1.0f);
        while (fabsf(x[i] * scale + shift) < 1e-4f);
    fill(dy, s);
    fill(add, s);

    double n1, n2, g1, g2, mag = 0;
    nb->shifted_sums(x, s, x[0], &n1, &n2);
    gb->shifted_sums(x, s, x[0], &g1, &g2);
    for (int64_t i = 0; i < s; i++) mag += fabs(x[i] - x[0]) * (1 + fabs(x[i] - x[0]));
    CHECK(close_to(n1, g1, mag, 1e-5) && close_to(n2, g2, mag, 1e-5),
          "shifted_sums s=%lld: (%g, %g), want (%g, %g)", (long long)s, n1, n2, g1, g2);

    for (int mode = 0; mode < 3; mode++) { /* plain, ReLU, residual add + ReLU */
        const float *a = mode == 2 ? add : NULL;
        nb->affine(x, a, y1, s, scale, shift, mode > 0);
        gb->affine(x, a, y2, s, scale, shift, mode > 0);
        int bad = 0;
        for (int64_t i = 0; i < s; i++) bad += !close_to(y1[i], y2[i], fabs(y2[i]), 1e-6);
        CHECK(bad == 0, "affine mode %d s=%lld: %d values off", mode, (long long)s, bad);
    }

    for (int relu = 0; relu < 2; relu++) {
        double nsdy = 0.5, nsdyx = -0.25, gsdy = 0.5, gsdyx = -0.25, m2 = 1;
        nb->dy_sums(dy, x, s, mean, relu, scale, shift, &nsdy, &nsdyx);
        gb->dy_sums(dy, x, s, mean, relu, scale, shift, &gsdy, &gsdyx);
        for (int64_t i = 0; i < s; i++) m2 += fabs(dy[i]) * (1 + fabs(x[i] - mean));
        CHECK(close_to(nsdy, gsdy, m2, 1e-5) && close_to(nsdyx, gsdyx, m2, 1e-5),
              "dy_sums relu %d s=%lld: (%g, %g), want (%g, %g)", relu, (long long)s, nsdy, nsdyx,
              gsdy, gsdyx);
        nb->dx(dy, x, y1, s, mean, k1, k2, k3, relu, scale, shift);
        gb->dx(dy, x, y2, s, mean, k1, k2, k3, relu, scale, shift);
        int bad = 0;
        for (int64_t i = 0; i < s; i++) bad += !close_to(y1[i], y2[i], 1 + fabs(y2[i]), 1e-6);
        CHECK(bad == 0, "dx relu %d s=%lld: %d values off", relu, (long long)s, bad);
    }
    fenced_free(&fx);
    fenced_free(&fdy);
    fenced_free(&fadd);
    fenced_free(&fy1);
    fenced_free(&fy2);
}

/* ReLU's NaN -> +0 and -0 -> +0, bitwise as the portable loops give them, in full vectors and
 * in a tail. */
static void check_bn_special(void) {
    const float v[] = {NAN, -0.0f, 1.5f, -1.0f, INFINITY, -INFINITY, -0.0f, NAN, 2.0f};
    for (int64_t s = 1; s <= 9; s++)
        for (int with_add = 0; with_add < 2; with_add++) {
            float y1[9], y2[9], add[9];
            for (int i = 0; i < 9; i++) add[i] = -0.0f;
            cf_kernels_neon.bn->affine(v, with_add ? add : NULL, y1, s, 1.0f, -0.0f, true);
            cf_kernels_generic.bn->affine(v, with_add ? add : NULL, y2, s, 1.0f, -0.0f, true);
            CHECK(memcmp(y1, y2, (size_t)s * sizeof(float)) == 0,
                  "ReLU of NaN, -0 and infinities, s=%lld add=%d", (long long)s, with_add);
        }
}

/* The mask kernels: the fold's output and bits against affine's add branch and y > 0, the
 * masked gradient kernels against dy_sums and dx given dz = bit ? dy : 0, bitwise. */
static void check_bn_mask(int64_t s) {
    const cf_bn_kernels *nb = cf_kernels_neon.bn;
    const size_t mw = CF_MASK_WORDS((size_t)s);
    const float scale = uniform(-2.0f, 2.0f), shift = uniform(-1.0f, 1.0f);
    const float mean = uniform(-0.3f, 0.3f), k1 = uniform(-1, 1), k2 = uniform(-1, 1),
                k3 = uniform(-1, 1);
    fenced fx = fenced_alloc(s, true), fdy = fenced_alloc(s, true), fadd = fenced_alloc(s, true);
    fenced fy1 = fenced_alloc(s, true), fy2 = fenced_alloc(s, true);
    float *x = fx.p, *dy = fdy.p, *add = fadd.p, *y1 = fy1.p, *y2 = fy2.p;
    fill(x, s);
    fill(dy, s);
    fill(add, s);
    uint16_t mask[96];
    float dz[1300];
    nb->affine(x, add, y1, s, scale, shift, false);
    nb->fold_mask_n(x, add, NULL, y2, s, 1, &scale, &shift, NULL, NULL, mask, 0);
    int bad = 0;
    for (int64_t i = 0; i < s; i++) {
        bad += memcmp(&y1[i], &y2[i], sizeof(float)) != 0;
        bad += ((mask[i / 16] >> (i % 16)) & 1u) != (y1[i] > 0.0f);
        dz[i] = y1[i] > 0.0f ? dy[i] : 0.0f;
    }
    for (int64_t i = s; i < (int64_t)mw * 16; i++) bad += (mask[i / 16] >> (i % 16)) & 1u;
    CHECK(bad == 0, "fold_mask s=%lld: %d values or bits off", (long long)s, bad);
    double a1 = 0, a2 = 0, b1[1], b2[1];
    const float *dys[1] = {dy}, *xs[1] = {x};
    const uint16_t *ms[1] = {mask};
    nb->dy_sums(dz, x, s, mean, false, scale, shift, &a1, &a2);
    nb->dy_sums_mask_n(1, dys, xs, s, &mean, ms, b1, b2);
    CHECK(a1 == b1[0] && a2 == b2[0], "dy_sums_mask s=%lld: (%g, %g), want (%g, %g)", (long long)s,
          b1[0], b2[0], a1, a2);
    nb->dx(dz, x, y1, s, mean, k1, k2, k3, false, scale, shift);
    nb->dx_mask_n(dy, x, y2, s, 1, &mean, &k1, &k2, &k3, mask, 0);
    CHECK(memcmp(y1, y2, (size_t)s * sizeof(float)) == 0, "dx_mask s=%lld", (long long)s);
    fenced_free(&fx);
    fenced_free(&fdy);
    fenced_free(&fadd);
    fenced_free(&fy1);
    fenced_free(&fy2);
}

static void test_bn(void) {
    for (int64_t s = 1; s <= 40; s++) check_bn(s), check_bn_mask(s);
    for (int t = 0; t < 30; t++) check_bn_mask(41 + rnd(1200));
    for (int t = 0; t < 30; t++) check_bn(41 + rnd(1200));
    check_bn_special();
}

/* ---- pooling ------------------------------------------------------------------------------- */

static void test_max_sum(void) {
    for (int t = 0; t < 300; t++) {
        const size_t n = 1 + (size_t)rnd(t < 200 ? 40 : 3000);
        fenced f = fenced_alloc(n, t % 2 == 0);
        float *x = f.p;
        fill(x, n);
        if (t % 3 == 0) x[rnd((int)n)] = 2.0f; /* two maxima: the first wins */
        if (t % 3 == 0) x[rnd((int)n)] = 2.0f;
        const bool with_nan = t % 5 == 0;
        if (with_nan) x[rnd((int)n)] = NAN;
        float b1, b2, s1, s2, sb;
        int32_t a1, a2, ab;
        const bool took = cf_kernels_neon.max_sum_plane(x, n, &b1, &a1, &s1);
        CHECK(took != with_nan, "max_sum_plane n=%zu nan=%d returned %d", n, with_nan, took);
        cf_set_isa(CF_ISA_GENERIC);
        cf_max_sum_plane(x, n, &b2, &a2, &s2);
        cf_set_isa(CF_ISA_NEON);
        CHECK(!took || (b1 == b2 && a1 == a2), "table max n=%zu: %g at %d, want %g at %d", n, b1,
              a1, b2, a2);
        cf_max_sum_plane(x, n, &sb, &ab, &s1); /* through the table, or the loop for a NaN */
        double mag = 0;
        for (size_t i = 0; i < n; i++) mag += fabs(x[i]);
        CHECK((sb == b2 || (isnan(sb) && isnan(b2))) && ab == a2,
              "max n=%zu: %g at %d, want %g at %d", n, sb, ab, b2, a2);
        CHECK(with_nan || close_to(s1, s2, mag, 1e-6), "sum n=%zu: %g, want %g", n, s1, s2);
        fenced_free(&f);
    }
}

/* ---- optimizer steps ----------------------------------------------------------------------- */

static void test_optim(void) {
    for (int t = 0; t < 200; t++) {
        const size_t n = 1 + (size_t)rnd(t < 150 ? 40 : 2000);
        const int variant = t % 8;
        cf_opt_update u = {
            .decoupled = variant & 1,
            .l2 = (variant >> 1) & 1,
            .wd = uniform(0.0f, 0.1f),
            .lr = uniform(1e-4f, 0.1f),
            .mom = uniform(0.5f, 0.99f),
            .sqr_mom = uniform(0.9f, 0.999f),
            .step_size = uniform(1e-4f, 0.1f),
            .debias2_sqrt = uniform(0.1f, 1.0f),
            .eps = 1e-5f,
        };
        u.decay = 1.0f - u.lr * u.wd;
        u.mom_w = 1.0f - u.mom;
        u.sqr_w = 1.0f - u.sqr_mom;
        const bool momentum = (variant >> 2) & 1;
        float *buf[2][4];
        fenced f[2][4];
        for (int side = 0; side < 2; side++)
            for (int j = 0; j < 4; j++) {
                f[side][j] = fenced_alloc(n, true);
                buf[side][j] = f[side][j].p;
            }
        for (int j = 0; j < 4; j++) {
            fill(buf[0][j], n);
            if (j == 3)
                for (size_t i = 0; i < n; i++) buf[0][3][i] = fabsf(buf[0][3][i]); /* sqr_avg */
            memcpy(buf[1][j], buf[0][j], n * sizeof(float));
        }
        /* w, g, grad_avg, sqr_avg */
        cf_kernels_neon.optim->sgd(&u, buf[0][0], buf[0][1], momentum ? buf[0][2] : NULL, n);
        cf_kernels_generic.optim->sgd(&u, buf[1][0], buf[1][1], momentum ? buf[1][2] : NULL, n);
        bool same = true;
        for (int j = 0; j < 4; j++) same &= memcmp(buf[0][j], buf[1][j], n * sizeof(float)) == 0;
        CHECK(same, "sgd variant %d n=%zu differs from the portable table", variant, n);
        cf_kernels_neon.optim->adam(&u, buf[0][0], buf[0][1], buf[0][2], buf[0][3], n);
        cf_kernels_generic.optim->adam(&u, buf[1][0], buf[1][1], buf[1][2], buf[1][3], n);
        same = true;
        for (int j = 0; j < 4; j++) same &= memcmp(buf[0][j], buf[1][j], n * sizeof(float)) == 0;
        CHECK(same, "adam variant %d n=%zu differs from the portable table", variant, n);
        for (int side = 0; side < 2; side++)
            for (int j = 0; j < 4; j++) fenced_free(&f[side][j]);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "dispatch") == 0) {
        test_dispatch();
        printf("dispatch under CF_ISA=%s: %ld checks, %ld failed\n",
               getenv("CF_ISA") ? getenv("CF_ISA") : "", checks, failures);
        return failures == 0 ? 0 : 1;
    }
    const unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 20260601ull;
    rng_state = seed;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    test_dispatch();
    cf_set_isa(CF_ISA_NEON);
    static const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {{"sgemm_strided", test_gemm},
                 {"transpose", test_transpose},
                 {"implicit convolutions", test_conv},
                 {"winograd", test_winograd},
                 {"bn", test_bn},
                 {"max_sum_plane", test_max_sum},
                 {"optim", test_optim}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const long before = failures;
        parts[i].run();
        printf("%-22s %s\n", parts[i].name, failures == before ? "ok" : "FAILED");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("seed %llu: %ld checks, %ld failed (%d products left to BLAS by design), %.1f s\n", seed,
           checks, failures, gemm_declined,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return failures == 0 ? 0 : 1;
}
