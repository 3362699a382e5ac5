/* CPU kernels under the layers: GEMM through CBLAS (OpenBLAS) and im2col/col2im for NCHW
 * images. Each works on one image on the calling thread; the layers split a batch over threads
 * with cf_parallel_for. The portable code lives here; the vectorised kernels are in the active
 * kernel table (kernel_table.h), which these functions consult first. */
#include "corefit/tensor.h"
#include "tensor/dropout_loops.h"
#include "tensor/kernel_table.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Note: with its SkylakeX kernels, OpenBLAS 0.3.21 allocates a packing buffer inside some
 * small untransposed products (its small-matrix path); tests/test_alloc.c reports those apart. */
void cf_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static bool use_reference;

void cf_kernels_set_reference(bool reference) {
    use_reference = reference;
}
bool cf_kernels_reference(void) {
    return use_reference;
}

/* The reference product through CBLAS when A is row-major or transposed, else plain loops. */
static void sgemm_strided_ref(int m, int n, int k, const float *a, ptrdiff_t a_row, ptrdiff_t a_col,
                              const float *b, int ldb, float *c, int ldc, bool accumulate) {
    const float beta = accumulate ? 1.0f : 0.0f;
    if (a_col == 1 && a_row >= k && a_row <= INT32_MAX) {
        cf_sgemm(false, false, m, n, k, 1.0f, a, (int)a_row, b, ldb, beta, c, ldc);
        return;
    }
    if (a_row == 1 && a_col >= m && a_col <= INT32_MAX) {
        cf_sgemm(true, false, m, n, k, 1.0f, a, (int)a_col, b, ldb, beta, c, ldc);
        return;
    }
    for (int i = 0; i < m; i++) {
        float *ci = c + (size_t)i * ldc;
        if (!accumulate)
            for (int j = 0; j < n; j++) ci[j] = 0.0f;
        for (int p = 0; p < k; p++) {
            const float av = a[i * a_row + p * a_col];
            const float *bp = b + (size_t)p * ldb;
            for (int j = 0; j < n; j++) ci[j] += av * bp[j];
        }
    }
}

void cf_sgemm_strided(int m, int n, int k, const float *a, ptrdiff_t a_row, ptrdiff_t a_col,
                      const float *b, int ldb, float *c, int ldc, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate)
            for (int i = 0; i < m; i++) memset(c + (size_t)i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    const cf_kernel_table *kt = cf_active_kernels;
    if (!use_reference && kt->sgemm_strided &&
        kt->sgemm_strided(m, n, k, a, a_row, a_col, b, ldb, c, ldc, accumulate))
        return;
    sgemm_strided_ref(m, n, k, a, a_row, a_col, b, ldb, c, ldc, accumulate);
}

void cf_sgemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                 int ldc, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    const cf_kernel_table *kt = cf_active_kernels;
    if (!use_reference && kt->sgemm_nt && kt->sgemm_nt(m, n, k, a, lda, b, ldb, c, ldc, accumulate))
        return;
    cf_sgemm(false, true, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

void cf_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd) {
    if (!use_reference && cf_active_kernels->transpose) {
        cf_active_kernels->transpose(rows, cols, src, lds, dst, ldd);
        return;
    }
    for (int i0 = 0; i0 < rows; i0 += 16) { /* blocks of 16 rows keep both sides cached */
        const int i1 = i0 + 16 < rows ? i0 + 16 : rows;
        for (int j = 0; j < cols; j++)
            for (int i = i0; i < i1; i++) dst[j * ldd + i] = src[i * lds + j];
    }
}

bool cf_conv_geom_init(cf_conv_geom *g, int c, int h, int w, int kh, int kw, int sh, int sw, int ph,
                       int pw) {
    *g = (cf_conv_geom){
        .c = c, .h = h, .w = w, .kh = kh, .kw = kw, .sh = sh, .sw = sw, .ph = ph, .pw = pw};
    if (c < 1 || h < 1 || w < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0)
        return false;
    if (h + 2 * ph < kh || w + 2 * pw < kw) return false;
    g->oh = (h + 2 * ph - kh) / sh + 1;
    g->ow = (w + 2 * pw - kw) / sw + 1;
    return true;
}

/* One patch row segment: r[ox] = xr[ox*sw] for ox in [0, n). The stride-1 and stride-2 copies
 * are separate loops so that the compiler vectorises them. */
static inline void gather_row(float *restrict r, const float *restrict xr, int n, int sw) {
    if (sw == 1)
        for (int ox = 0; ox < n; ox++) r[ox] = xr[ox];
    else if (sw == 2)
        for (int ox = 0; ox < n; ox++) r[ox] = xr[2 * ox];
    else
        for (int ox = 0; ox < n; ox++) r[ox] = xr[(size_t)ox * sw];
}

/* The adjoint of gather_row: xr[ox*sw] += r[ox]. */
static inline void scatter_add_row(float *restrict xr, const float *restrict r, int n, int sw) {
    if (sw == 1)
        for (int ox = 0; ox < n; ox++) xr[ox] += r[ox];
    else if (sw == 2)
        for (int ox = 0; ox < n; ox++) xr[2 * ox] += r[ox];
    else
        for (int ox = 0; ox < n; ox++) xr[(size_t)ox * sw] += r[ox];
}

void cf_im2col(const cf_conv_geom *g, const float *x, float *col, int ldcol) {
    if (!use_reference && cf_active_kernels->im2col && cf_active_kernels->im2col(g, x, col, ldcol))
        return;
    const int oh = g->oh, ow = g->ow, sw = g->sw, sh = g->sh;
    const size_t plane = (size_t)g->h * g->w, cols = (size_t)ldcol;
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            int ylo, yhi;
            cf_conv_valid_rows(g, i, &ylo, &yhi);
            for (int j = 0; j < g->kw; j++) {
                float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                int lo, hi;
                cf_conv_valid_cols(g, j, &lo, &hi);
                const int off = j - g->pw; /* input column of ox is ox*sw + off */
                if (ylo > 0) memset(row, 0, (size_t)ylo * ow * sizeof(float));
                if (yhi < oh)
                    memset(row + (size_t)yhi * ow, 0, (size_t)(oh - yhi) * ow * sizeof(float));
                if (yhi <= ylo) continue;
                const float *x0 = xc + (size_t)(ylo * sh - g->ph + i) * g->w;
                for (int oy = ylo; oy < yhi; oy++) {
                    float *r = row + (size_t)oy * ow;
                    const float *xr = x0 + (size_t)(oy - ylo) * sh * g->w;
                    for (int ox = 0; ox < lo; ox++) r[ox] = 0.0f;
                    gather_row(r + lo, xr + lo * sw + off, hi - lo, sw);
                    for (int ox = hi; ox < ow; ox++) r[ox] = 0.0f;
                }
            }
        }
    }
}

static void col2im(const cf_conv_geom *g, const float *col, int ldcol, float *x, bool add) {
    if (!use_reference && cf_active_kernels->col2im &&
        cf_active_kernels->col2im(g, col, ldcol, x, add))
        return;
    const int ow = g->ow, sw = g->sw, sh = g->sh;
    const size_t plane = (size_t)g->h * g->w, cols = (size_t)ldcol;
    if (!add) memset(x, 0, (size_t)g->c * plane * sizeof(float));
    for (int c = 0; c < g->c; c++) {
        float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            int ylo, yhi;
            cf_conv_valid_rows(g, i, &ylo, &yhi);
            if (yhi <= ylo) continue;
            for (int j = 0; j < g->kw; j++) {
                const float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                int lo, hi;
                cf_conv_valid_cols(g, j, &lo, &hi);
                const int off = j - g->pw;
                float *x0 = xc + (size_t)(ylo * sh - g->ph + i) * g->w;
                for (int oy = ylo; oy < yhi; oy++) {
                    const float *r = row + (size_t)oy * ow;
                    float *xr = x0 + (size_t)(oy - ylo) * sh * g->w;
                    scatter_add_row(xr + lo * sw + off, r + lo, hi - lo, sw);
                }
            }
        }
    }
}

void cf_col2im(const cf_conv_geom *g, const float *col, int ldcol, float *x) {
    col2im(g, col, ldcol, x, false);
}

void cf_col2im_add(const cf_conv_geom *g, const float *col, int ldcol, float *x) {
    col2im(g, col, ldcol, x, true);
}

void cf_bn_plane_sums(const float *x, int64_t s, float k, double *s1, double *s2) {
    cf_active_kernels->bn->shifted_sums(x, s, k, s1, s2);
}

void cf_bn_plane_affine(const float *x, const float *add, float *y, int64_t s, float scale,
                        float shift, bool relu) {
    cf_active_kernels->bn->affine(x, add, y, s, scale, shift, relu);
}

void cf_bn_plane_dy_sums(const float *dy, const float *x, int64_t s, float mean, bool relu,
                         float scale, float shift, double *sdy, double *sdyx) {
    cf_active_kernels->bn->dy_sums(dy, x, s, mean, relu, scale, shift, sdy, sdyx);
}

void cf_bn_planes_sums(int np, const float *const *x, int64_t s, const float *k, double *s1,
                       double *s2) {
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    for (int i0 = 0; i0 < np; i0 += CF_BN_PLANES) {
        const int n = np - i0 < CF_BN_PLANES ? np - i0 : CF_BN_PLANES;
        if (bn->shifted_sums_n)
            bn->shifted_sums_n(n, x + i0, s, k + i0, s1 + i0, s2 + i0);
        else
            for (int i = i0; i < i0 + n; i++) bn->shifted_sums(x[i], s, k[i], &s1[i], &s2[i]);
    }
}

void cf_bn_image_sums(const float *x, int c, int64_t s, const float *k, double *s1, double *s2) {
    for (int c0 = 0; c0 < c; c0 += CF_BN_PLANES) {
        const int np = c - c0 < CF_BN_PLANES ? c - c0 : CF_BN_PLANES;
        const float *xs[CF_BN_PLANES];
        for (int i = 0; i < np; i++) xs[i] = x + (size_t)(c0 + i) * (size_t)s;
        cf_bn_planes_sums(np, xs, s, k + c0, s1 + c0, s2 + c0);
    }
}

void cf_bn_planes_dy_sums(int np, const float *const *dy, const float *const *x, int64_t s,
                          const float *mean, bool relu, const float *scale, const float *shift,
                          double *const *sdy, double *const *sdyx) {
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (!bn->dy_sums_n) {
        for (int i = 0; i < np; i++)
            bn->dy_sums(dy[i], x[i], s, mean[i], relu, scale[i], shift[i], sdy[i], sdyx[i]);
        return;
    }
    for (int i0 = 0; i0 < np; i0 += CF_BN_PLANES) {
        const int n = np - i0 < CF_BN_PLANES ? np - i0 : CF_BN_PLANES;
        double a[CF_BN_PLANES], b[CF_BN_PLANES];
        bn->dy_sums_n(n, dy + i0, x + i0, s, mean + i0, relu, scale + i0, shift + i0, a, b);
        for (int i = 0; i < n; i++) { /* in order: a channel's images add in image order */
            *sdy[i0 + i] += a[i];
            *sdyx[i0 + i] += b[i];
        }
    }
}

void cf_bn_plane_dx(const float *dy, const float *x, float *dx, int64_t s, float mean, float k1,
                    float k2, float k3, bool relu, float scale, float shift) {
    cf_active_kernels->bn->dx(dy, x, dx, s, mean, k1, k2, k3, relu, scale, shift);
}

static void bn_planes_affine(const float *x, const float *add, float *y, int64_t s, int nc,
                             const float *scale, const float *shift, bool relu, ptrdiff_t ahead,
                             bool stream) {
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->affine_n) {
        bn->affine_n(x, add, y, s, nc, scale, shift, relu, ahead, stream);
        return;
    }
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) {
            cf_prefetch(y + at + ahead, (size_t)s * sizeof(float), true, true);
            if (add) cf_prefetch(add + at + ahead, (size_t)s * sizeof(float), false, true);
        }
        bn->affine(x + at, add ? add + at : NULL, y + at, s, scale[i], shift[i], relu);
    }
}

void cf_bn_planes_affine(const float *x, const float *add, float *y, int64_t s, int nc,
                         const float *scale, const float *shift, bool relu, ptrdiff_t ahead) {
    bn_planes_affine(x, add, y, s, nc, scale, shift, relu, ahead, false);
}

void cf_bn_planes_affine_stream(const float *x, const float *add, float *y, int64_t s, int nc,
                                const float *scale, const float *shift, bool relu,
                                ptrdiff_t ahead) {
    bn_planes_affine(x, add, y, s, nc, scale, shift, relu, ahead, true);
}

void cf_bn_planes_affine_add2(const float *x, const float *x2, float *y, int64_t s, int nc,
                              const float *scale, const float *shift, const float *scale2,
                              const float *shift2, ptrdiff_t ahead) {
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->affine_add2_n) {
        bn->affine_add2_n(x, x2, y, s, nc, scale, shift, scale2, shift2, ahead);
        return;
    }
    /* x2's term a chunk at a time in L1, then the add: the one-plane kernel is element-wise, so
     * a chunk's values are the whole plane's (chunks of whole vectors) */
    enum { CHUNK = 512 };
    _Alignas(64) float buf[CHUNK];
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) {
            cf_prefetch(y + at + ahead, (size_t)s * sizeof(float), true, true);
            cf_prefetch(x2 + at + ahead, (size_t)s * sizeof(float), false, true);
        }
        for (int64_t j = 0; j < s; j += CHUNK) {
            const int64_t n = s - j < CHUNK ? s - j : CHUNK;
            bn->affine(x2 + at + j, NULL, buf, n, scale2[i], shift2[i], false);
            bn->affine(x + at + j, buf, y + at + j, n, scale[i], shift[i], false);
        }
    }
}

void cf_bn_planes_dx(const float *dy, const float *x, float *dx, int64_t s, int nc,
                     const float *mean, const float *k1, const float *k2, const float *k3,
                     bool relu, const float *scale, const float *shift, ptrdiff_t ahead) {
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    if (bn->dx_n) {
        bn->dx_n(dy, x, dx, s, nc, mean, k1, k2, k3, relu, scale, shift, ahead);
        return;
    }
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dx + at + ahead, (size_t)s * sizeof(float), true, true);
        bn->dx(dy + at, x + at, dx + at, s, mean[i], k1[i], k2[i], k3[i], relu, scale[i], shift[i]);
    }
}

void cf_bn_planes_fold_mask(const float *x, const float *add, const float *x2, float *y, int64_t s,
                            int nc, const float *scale, const float *shift, const float *scale2,
                            const float *shift2, uint16_t *mask, ptrdiff_t ahead) {
    cf_active_kernels->bn->fold_mask_n(x, add, x2, y, s, nc, scale, shift, scale2, shift2, mask,
                                       ahead);
}

void cf_bn_planes_dy_sums_mask(int np, const float *const *dy, const float *const *x, int64_t s,
                               const float *mean, const uint16_t *const *mask, double *const *sdy,
                               double *const *sdyx) {
    const cf_bn_kernels *bn = cf_active_kernels->bn;
    for (int i0 = 0; i0 < np; i0 += CF_BN_PLANES) {
        const int n = np - i0 < CF_BN_PLANES ? np - i0 : CF_BN_PLANES;
        double a[CF_BN_PLANES], b[CF_BN_PLANES];
        bn->dy_sums_mask_n(n, dy + i0, x + i0, s, mean + i0, mask + i0, a, b);
        for (int i = 0; i < n; i++) { /* in order, as cf_bn_planes_dy_sums */
            *sdy[i0 + i] += a[i];
            *sdyx[i0 + i] += b[i];
        }
    }
}

void cf_bn_planes_dx_mask(const float *dy, const float *x, float *dx, int64_t s, int nc,
                          const float *mean, const float *k1, const float *k2, const float *k3,
                          const uint16_t *mask, ptrdiff_t ahead) {
    cf_active_kernels->bn->dx_mask_n(dy, x, dx, s, nc, mean, k1, k2, k3, mask, ahead);
}

void cf_sgd_update(const cf_opt_update *u, float *w, const float *g, float *grad_avg, size_t n) {
    cf_active_kernels->optim->sgd(u, w, g, grad_avg, n);
}

void cf_adam_update(const cf_opt_update *u, float *w, const float *g, float *grad_avg,
                    float *sqr_avg, size_t n) {
    cf_active_kernels->optim->adam(u, w, g, grad_avg, sqr_avg, n);
}

void cf_dropout_keyed_row(uint64_t row, size_t per, uint64_t threshold, float scale, const float *x,
                          uint8_t *mask, float *y) {
    if (cf_active_kernels->dropout_keyed_row)
        cf_active_kernels->dropout_keyed_row(row, per, threshold, scale, x, mask, y);
    else
        loops_dropout_keyed_row(row, per, threshold, scale, x, mask, y);
}

void cf_max_sum_plane(const float *x, size_t n, float *best, int32_t *arg, float *sum) {
    if (cf_active_kernels->max_sum_plane && cf_active_kernels->max_sum_plane(x, n, best, arg, sum))
        return;
    float b = -INFINITY, s = 0.0f;
    int32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const float v = x[i];
        if (v > b || isnan(v)) {
            b = v;
            at = (int32_t)i;
            if (isnan(v)) break; /* the first NaN wins */
        }
    }
    for (size_t i = 0; i < n; i++) s += x[i];
    *best = b;
    *arg = at;
    *sum = s;
}

void cf_max_pool_2x2_plane(const float *x, int h, int w, float *y, int32_t *idx) {
    if (cf_active_kernels->max_pool_2x2) {
        cf_active_kernels->max_pool_2x2(x, h, w, y, idx);
        return;
    }
    const int oh = h / 2, ow = w / 2;
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        for (int ox = 0; ox < ow; ox++) {
            const int32_t at = 2 * oy * w + 2 * ox;
            const float v[4] = {r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1]};
            const int32_t pos[4] = {at, at + 1, at + w, at + w + 1};
            float best = v[0];
            int32_t arg = at;
            for (int i = 1; i < 4; i++)
                if (v[i] > best || isnan(v[i])) {
                    best = v[i];
                    arg = pos[i];
                }
            y[(size_t)oy * ow + ox] = best;
            idx[(size_t)oy * ow + ox] = arg;
        }
    }
}

void cf_max_pool_3x3_s2_row(const float *x, int w, int y0, int rows, int pad, int ox0, int ox1,
                            float *y, int32_t *idx) {
    if (cf_active_kernels->max_pool_3x3_s2_row) {
        cf_active_kernels->max_pool_3x3_s2_row(x, w, y0, rows, pad, ox0, ox1, y, idx);
        return;
    }
    for (int ox = ox0; ox < ox1; ox++) { /* branch-free, as pool.c's max_window */
        const int x0 = 2 * ox - pad;
        float best = -INFINITY;
        int32_t arg = y0 * w + x0;
        for (int iy = y0; iy < y0 + rows; iy++)
            for (int ix = x0; ix < x0 + 3; ix++) {
                const float v = x[(size_t)iy * w + ix];
                const bool take = v > best || v != v;
                best = take ? v : best;
                arg = take ? iy * w + ix : arg;
            }
        y[ox] = best;
        idx[ox] = arg;
    }
}

void cf_max_pool_3x3_s2_backward(const float *dy, const int32_t *idx, int h, int w, int pad,
                                 float *dx, bool stream) {
    if (cf_active_kernels->max_pool_3x3_s2_backward) {
        cf_active_kernels->max_pool_3x3_s2_backward(dy, idx, h, w, pad, dx, stream);
        return;
    }
    const size_t n = (size_t)((h + 2 * pad - 3) / 2 + 1) * (size_t)((w + 2 * pad - 3) / 2 + 1);
    memset(dx, 0, (size_t)h * (size_t)w * sizeof(float));
    for (size_t o = 0; o < n; o++) dx[idx[o]] += dy[o];
}
