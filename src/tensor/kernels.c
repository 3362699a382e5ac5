/* CPU kernels under the layers: GEMM through CBLAS (OpenBLAS) and im2col/col2im for NCHW
 * images. Each works on one image on the calling thread; the layers split a batch over threads
 * with cf_parallel_for. */
#include "corefit/tensor.h"

#include <cblas.h>
#include <string.h>

/* Note: with its SkylakeX kernels, OpenBLAS 0.3.21 allocates a packing buffer inside some
 * small untransposed products (its small-matrix path); tests/test_alloc.c reports those apart. */
void cf_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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

/* The output columns [lo, hi) whose input column ox*sw - pw + j lies inside [0, w). */
static void valid_cols(const cf_conv_geom *g, int j, int *lo, int *hi) {
    int first = g->pw - j; /* ox*sw >= first */
    int l = first > 0 ? (first + g->sw - 1) / g->sw : 0;
    int last = g->w - 1 + g->pw - j; /* ox*sw <= last */
    int h = last < 0 ? 0 : last / g->sw + 1;
    if (h > g->ow) h = g->ow;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

void cf_im2col(const cf_conv_geom *g, const float *x, float *col, int ldcol) {
    const int oh = g->oh, ow = g->ow, sw = g->sw;
    const size_t plane = (size_t)g->h * g->w, cols = (size_t)ldcol;
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            for (int j = 0; j < g->kw; j++) {
                float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                int lo, hi;
                valid_cols(g, j, &lo, &hi);
                for (int oy = 0; oy < oh; oy++) {
                    float *r = row + (size_t)oy * ow;
                    int iy = oy * g->sh - g->ph + i;
                    if (iy < 0 || iy >= g->h) {
                        memset(r, 0, (size_t)ow * sizeof(float));
                        continue;
                    }
                    const float *xr = xc + (size_t)iy * g->w;
                    const int off = j - g->pw; /* input column of ox is ox*sw + off */
                    for (int ox = 0; ox < lo; ox++) r[ox] = 0.0f;
                    if (sw == 1 && hi > lo)
                        memcpy(r + lo, xr + lo + off, (size_t)(hi - lo) * sizeof(float));
                    else
                        for (int ox = lo; ox < hi; ox++) r[ox] = xr[ox * sw + off];
                    for (int ox = hi; ox < ow; ox++) r[ox] = 0.0f;
                }
            }
        }
    }
}

void cf_col2im(const cf_conv_geom *g, const float *col, int ldcol, float *x) {
    const int oh = g->oh, ow = g->ow, sw = g->sw;
    const size_t plane = (size_t)g->h * g->w, cols = (size_t)ldcol;
    memset(x, 0, (size_t)g->c * plane * sizeof(float));
    for (int c = 0; c < g->c; c++) {
        float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            for (int j = 0; j < g->kw; j++) {
                const float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                int lo, hi;
                valid_cols(g, j, &lo, &hi);
                for (int oy = 0; oy < oh; oy++) {
                    int iy = oy * g->sh - g->ph + i;
                    if (iy < 0 || iy >= g->h) continue;
                    const float *r = row + (size_t)oy * ow;
                    float *xr = xc + (size_t)iy * g->w;
                    const int off = j - g->pw;
                    for (int ox = lo; ox < hi; ox++) xr[ox * sw + off] += r[ox];
                }
            }
        }
    }
}
