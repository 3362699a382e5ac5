/* The transforms of the Winograd F(2x2, 3x3) convolutions (winograd.c), written once over the
 * vector vocabulary of simd_kernels.h (included first) and compiled into each vector kernel
 * table. The including file also defines
 *
 *   V_ZIP(a, b, lo, hi)     lo = a0 b0 a1 b1 ..., hi = the same from the upper halves
 *   V_UNZIP(a, b, ev, od)   ev = the even lanes of the 2*VL values a then b, od = the odd ones
 *
 *   WINO_SHORT_ROW_COST     (optional) cf_wino_kernels.short_row_cost, measured per set
 *   WINO_STORE_PAIRS, WINO_STORE_BF16   (optional) the bf16 stores of input_pairs and dy_pairs,
 *                           and of input_bf16 (see there)
 *
 * Tile (ty, tx) covers output rows 2ty, 2ty+1 and columns 2tx, 2tx+1; its 4x4 input patch
 * starts at row 2ty - 1, column 2tx - 1 (padding 1). A call covers the tile rows [ty0, ty0 +
 * th) of each of its images (all of them, or a band of a large image):
 *
 *   input   V  = B^T d B     B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
 *   output  Y  = A^T M A     A^T = [1 1 1 0; 0 1 -1 -1]
 *   dy      Mg = A dY A^T    (the adjoint of the output transform, for the weight gradient)
 *
 * The input transform first splits each plane into its tiles' four patch columns (see
 * wino_split_plane), then runs its vectors over all the plane's tiles; the output transform runs
 * them along each tile row (tail lanes masked) and interleaves the two output columns of a
 * tile; the dy transform reads dy pixel-major and runs them over the channels. Element (xi =
 * 4i + j, channel c, tile t) of V and M lies at base + xi * xi_stride + c * ld + t, with the
 * call's tiles numbered image by image, row by row; Mg is tile-major (see dy_nhwc). */
#ifndef COREFIT_WINOGRAD_LOOPS_H
#define COREFIT_WINOGRAD_LOOPS_H

#include "tensor/kernel_table.h"

#include <string.h>

/* n lanes from p, the others 0 (n may be <= 0 or >= VL) */
CF_INLINE vf wino_load(const float *p, int n) {
    return n >= VL ? V_LOADU(p) : n <= 0 ? V_ZERO() : V_LOADZ(V_MASKV(simd_first_lanes(n)), p);
}

/* The output transform's first pass (A^T over each row's columns): for the points' rows i = 0..3
 * of a tile's 4 x 4 products at p (point j of row i at p + (4i + j) m_xi), a[i] = m0 + m1 + m2
 * and b[i] = m1 - m2 - m3, n lanes. */
CF_INLINE void wino_out_columns(const float *p, size_t m_xi, int n, vf a[4], vf b[4]) {
    for (int i = 0; i < 4; i++) {
        const float *q = p + (size_t)(4 * i) * m_xi;
        const vf m0 = wino_load(q, n), m1 = wino_load(q + m_xi, n), m2 = wino_load(q + 2 * m_xi, n),
                 m3 = wino_load(q + 3 * m_xi, n);
        a[i] = V_ADD(V_ADD(m0, m1), m2);
        b[i] = V_SUB(V_SUB(m1, m2), m3);
    }
}

CF_INLINE void wino_store(float *p, int n, vf v) {
    if (n >= VL)
        V_STOREU(p, v);
    else if (n > 0)
        V_STOREM(p, V_MASKV(simd_first_lanes(n)), v);
}

/* P's row r set to 0 */
CF_INLINE void wino_split_zero_row(float *q, size_t part, int tw, int r) {
    float *row = q + (size_t)(r % 2) * 4 * part + (size_t)(r / 2) * tw;
    for (int u0 = 0; u0 < tw; u0 += VL)
        for (int k = 0; k < 4; k++) V_STOREU(row + k * part + u0, V_ZERO());
}

/* The tile rows [ty0, ty0 + th) of one plane x (h x w) split into the four patch columns of
 * every tile, E0[u] = x[2u - 1], O0[u] = x[2u], E1[u] = x[2u + 1], O1[u] = x[2u + 2] (0 outside
 * the image), for each of the split's 2 * th + 2 rows (row r is x's row 2 * ty0 - 1 + r), kept
 * apart for the even and the odd rows: eight arrays, array 4 * parity + column at q + (4 *
 * parity + column) * part, of th + 1 rows of tw floats back to back, so that patch row r of
 * tile t = ty * tw + tx is at index t + (r / 2) * tw of parity r % 2 (one walk over all the
 * tiles). The columns are the even and odd lanes of a row read from column 2u0 - 1 and from
 * 2u0 + 1. next: the plane after this one (prefetched), or NULL. */
/* wino_split_plane's image rows [lo, hi) where a row is shorter than a vector (w = 2 tw, tw
 * dividing VL / 2): VL / tw rows of one parity at a time, whose arrays' rows are adjacent. A
 * row's window (its 2 tw values from column -1, or from 1) fills lanes [g w, (g + 1) w) of the
 * 2 VL values a then b, so the even and odd lanes are G rows of the two column arrays, one store
 * each: the same values as a vector per row, with VL / w rows per load. */
CF_INLINE void wino_split_short(const float *x, int w, int xr0, int lo, int hi, int tw, float *q,
                                size_t part) {
    const int G = VL / tw;        /* rows per pair of vectors */
    for (int s = 0; s < 2; s++) { /* the window's first column: -1, then 1 */
        const int base = 2 * s - 1;
        const unsigned win = simd_first_lanes(w) & ~(s ? 1u << (w - 1) : 1u); /* columns 0..w-1 */
        for (int par = 0; par < 2; par++)
            for (int r = lo + ((lo + par) & 1); r < hi; r += 2 * G) {
                vf a = V_ZERO(), b = V_ZERO();
                for (int g = 0; g < G && r + 2 * g < hi; g++) {
                    const float *src = x + (size_t)(xr0 + r + 2 * g) * w + base;
                    const int lane0 = g * w;
                    if (lane0 < VL)
                        a = V_LOADM(a, V_MASKV((win << lane0) & VMASK_ALL), src - lane0);
                    else
                        b = V_LOADM(b, V_MASKV((win << (lane0 - VL)) & VMASK_ALL),
                                    src - (lane0 - VL));
                }
                vf ev, od;
                V_UNZIP(a, b, ev, od);
                float *row = q + (size_t)(r % 2) * 4 * part + (size_t)(r / 2) * tw;
                V_STOREU(row + (2 * s) * part, ev);
                V_STOREU(row + (2 * s + 1) * part, od);
            }
    }
}

static void wino_split_plane(const float *x, int h, int w, int ty0, int th, int tw, float *q,
                             const float *next) {
    const size_t part = (size_t)(th + 1) * tw + VL;
    /* the split's rows [lo, hi) are x's rows xr0 + r; the others are 0 */
    const int xr0 = 2 * ty0 - 1;
    const int lo = xr0 < 0 ? 1 : 0, hi = h - xr0 < 2 * th + 2 ? h - xr0 : 2 * th + 2;
    if (next)
        for (int r = lo; r < hi; r++)
            for (int c = 0; c < w; c += 16)
                __builtin_prefetch(next + (size_t)(xr0 + r) * w + c, 0, 3);
    if (w == 2 * tw && 2 * tw <= VL && VL % (2 * tw) == 0) {
        for (int r = 0; r < lo; r++) wino_split_zero_row(q, part, tw, r);
        wino_split_short(x, w, xr0, lo, hi, tw, q, part);
        for (int r = hi; r < 2 * th + 2; r++) wino_split_zero_row(q, part, tw, r);
        return;
    }
    /* A row's last vector runs into the row after it in its array (the split's row r + 2), so
     * the rows below are written after the rows above them: the zero rows above first, the
     * image's rows with the column chunks from the last (whose lane masks are the same on every
     * row), then the zero rows below. */
    for (int r = 0; r < lo; r++) wino_split_zero_row(q, part, tw, r);
    for (int u0 = (tw - 1) / VL * VL; u0 >= 0; u0 -= VL)
        for (int s = 0; s < 2; s++) { /* the column of lane 0: 2u0 - 1, then 2u0 + 1 */
            const int base = 2 * u0 + 2 * s - 1;
            const bool full = base >= 0 && base + 2 * VL <= w;
            const unsigned bits_a = simd_first_lanes(w - base) & ~simd_first_lanes(-base);
            const unsigned bits_b = simd_first_lanes(w - base - VL) & ~simd_first_lanes(-base - VL);
            const vmaskv ma = V_MASKV(bits_a), mb = V_MASKV(bits_b);
            for (int r = lo; r < hi; r++) {
                const int xr = xr0 + r;
                float *row = q + (size_t)(r % 2) * 4 * part + (size_t)(r / 2) * tw + u0;
                const float *src = x + (size_t)xr * w + base;
                vf a, b, ev, od;
                if (full) {
                    a = V_LOADU(src);
                    b = V_LOADU(src + VL);
                } else {
                    a = bits_a ? V_LOADZ(ma, src) : V_ZERO();
                    b = bits_b ? V_LOADZ(mb, src + VL) : V_ZERO();
                }
                V_UNZIP(a, b, ev, od);
                V_STOREU(row + (2 * s) * part, ev);
                V_STOREU(row + (2 * s + 1) * part, od);
            }
        }
    for (int r = hi; r < 2 * th + 2; r++) wino_split_zero_row(q, part, tw, r);
}

/* V for n_images images of `channels` planes (image n, channel c at x + n*x_image + c*h*w):
 * the rows of B^T d (d0 - d2, d1 + d2, d2 - d1, d1 - d3 over the patch rows) for each patch
 * column, then t B (t0 - t2, t1 + t2, t2 - t1, t1 - t3 over the columns), vectors over all the
 * tiles of a plane. */
CF_INLINE void wino_input_impl(const float *x, int channels, int h, int w, int n_images,
                               size_t x_image, int ty0, int th, void *v_out, size_t v_xi, int ldv,
                               float *pad, bool half) {
    const int tw = (w + 1) / 2, tiles = th * tw;
    const size_t part = (size_t)(th + 1) * tw + VL, plane = (size_t)h * w;
    const size_t split = 8 * part + VL; /* one split plane; pad holds two */
    const int planes = n_images * channels;
#define PLANE_AT(i) (x + (size_t)((i) / channels) * x_image + (size_t)((i) % channels) * plane)
    /* Plane i + 1 is split while plane i is transformed, so that the transform never reads what
     * the split has only just stored. */
    wino_split_plane(PLANE_AT(0), h, w, ty0, th, tw, pad, planes > 1 ? PLANE_AT(1) : NULL);
    for (int i = 0; i < planes; i++) {
        const float *even = pad + (size_t)(i % 2) * split, *odd = even + 4 * part;
        if (i + 1 < planes)
            wino_split_plane(PLANE_AT(i + 1), h, w, ty0, th, tw,
                             pad + (size_t)((i + 1) % 2) * split,
                             i + 2 < planes ? PLANE_AT(i + 2) : NULL);
        const int n = i / channels, c = i % channels;
        const size_t at = (size_t)c * ldv + (size_t)n * tiles;
        float *out = half ? NULL : (float *)v_out + at;
#ifdef WINO_STORE_BF16
        uint16_t *out16 = half ? (uint16_t *)v_out + at : NULL;
#endif
        for (int t0 = 0; t0 < tiles; t0 += VL) {
            const int left = tiles - t0;
            vf d1[4], d2[4]; /* patch rows 1 and 2, columns 0..3 */
            for (int k = 0; k < 4; k++) {
                d1[k] = V_LOADU(odd + k * part + t0);
                d2[k] = V_LOADU(even + k * part + tw + t0);
            }
#ifdef WINO_STORE_BF16
#define WINO_STORE_V(off, val)                                                                     \
    do {                                                                                           \
        if (half)                                                                                  \
            WINO_STORE_BF16(out16 + (off), left, val);                                             \
        else                                                                                       \
            wino_store(out + (off), left, val);                                                    \
    } while (0)
#else
#define WINO_STORE_V(off, val) wino_store(out + (off), left, val)
#endif
#define WINO_T_B(i, t)                                                                             \
    do {                                                                                           \
        const size_t o_ = (size_t)(4 * (i)) * v_xi + t0;                                           \
        WINO_STORE_V(o_, V_SUB((t)[0], (t)[2]));                                                   \
        WINO_STORE_V(o_ + v_xi, V_ADD((t)[1], (t)[2]));                                            \
        WINO_STORE_V(o_ + 2 * v_xi, V_SUB((t)[2], (t)[1]));                                        \
        WINO_STORE_V(o_ + 3 * v_xi, V_SUB((t)[1], (t)[3]));                                        \
    } while (0)
            vf t[4];
            for (int k = 0; k < 4; k++) t[k] = V_ADD(d1[k], d2[k]);
            WINO_T_B(1, t);
            for (int k = 0; k < 4; k++) t[k] = V_SUB(d2[k], d1[k]);
            WINO_T_B(2, t);
            for (int k = 0; k < 4; k++) t[k] = V_SUB(V_LOADU(even + k * part + t0), d2[k]);
            WINO_T_B(0, t);
            for (int k = 0; k < 4; k++) t[k] = V_SUB(d1[k], V_LOADU(odd + k * part + tw + t0));
            WINO_T_B(3, t);
#undef WINO_T_B
#undef WINO_STORE_V
        }
    }
#undef PLANE_AT
}

static void loops_wino_input(const float *x, int channels, int h, int w, int n_images,
                             size_t x_image, int ty0, int th, float *v, size_t v_xi, int ldv,
                             float *pad) {
    wino_input_impl(x, channels, h, w, n_images, x_image, ty0, th, v, v_xi, ldv, pad, false);
}

#ifdef WINO_STORE_BF16
/* cf_wino_kernels.input_bf16: V as loops_wino_input computes it, rounded as it is stored
 * (WINO_STORE_BF16(p, n, v), defined by the including file, stores the first n lanes of v as
 * bf16 at p), in the same layout at half the width. */
static void loops_wino_input_bf16(const float *x, int channels, int h, int w, int n_images,
                                  size_t x_image, int ty0, int th, uint16_t *v, size_t v_xi,
                                  int ldv, float *pad) {
    wino_input_impl(x, channels, h, w, n_images, x_image, ty0, th, v, v_xi, ldv, pad, true);
}
#define WINO_INPUT_BF16 loops_wino_input_bf16
#else
#define WINO_INPUT_BF16 NULL
#endif

/* loops_wino_output on planes whose rows of tiles are shorter than a vector (w = g = 2 tw, h
 * even, tw dividing VL): vectors over all the band's tiles of an image, VL / tw tile rows at a
 * time, instead of a vector per tile row. A tile row's two output rows (g floats each) are
 * adjacent in y, so a vector's outputs are one run of 4 VL floats (fewer at the band's end): the
 * zipped rows go through a buffer and out by blocks of g. The same sums of the same M. */
CF_INLINE void wino_output_short(int g, const float *m, size_t m_xi, int ldm, int channels, int h,
                                 int n_images, int ty0, int th, float *y, size_t y_image) {
    const int tw = g / 2, band = th * tw;
    for (int n = 0; n < n_images; n++)
        for (int k = 0; k < channels; k++) {
            const float *mk = m + (size_t)k * ldm + (size_t)n * band;
            float *yk = y + n * y_image + (size_t)k * h * g + (size_t)(2 * ty0) * g;
            for (int t0 = 0; t0 < band; t0 += VL) {
                const int n_t = band - t0;
                vf a[4], b[4];
                wino_out_columns(mk + t0, m_xi, n_t, a, b);
                float r0[2 * VL], r1[2 * VL]; /* the zipped first and second output rows */
                const vf y00 = V_ADD(V_ADD(a[0], a[1]), a[2]);
                const vf y01 = V_ADD(V_ADD(b[0], b[1]), b[2]);
                const vf y10 = V_SUB(V_SUB(a[1], a[2]), a[3]);
                const vf y11 = V_SUB(V_SUB(b[1], b[2]), b[3]);
                vf lo, hi;
                V_ZIP(y00, y01, lo, hi);
                V_STOREU(r0, lo);
                V_STOREU(r0 + VL, hi);
                V_ZIP(y10, y11, lo, hi);
                V_STOREU(r1, lo);
                V_STOREU(r1 + VL, hi);
                float *out = yk + (size_t)(t0 / tw) * 2 * g;
                const int tile_rows = (n_t < VL ? n_t : VL) / tw;
                for (int j = 0; j < tile_rows; j++) {
                    memcpy(out + (size_t)(2 * j) * g, r0 + j * g, (size_t)g * sizeof(float));
                    memcpy(out + (size_t)(2 * j + 1) * g, r1 + j * g, (size_t)g * sizeof(float));
                }
            }
        }
}

/* Y from M for n_images images of `channels` planes (image n, channel k at y + n*y_image +
 * k*h*w). */
static void loops_wino_output(const float *m, size_t m_xi, int ldm, int channels, int h, int w,
                              int n_images, int ty0, int th, float *y, size_t y_image) {
    const int tw = (w + 1) / 2;
    if (tw < VL && VL % tw == 0 && w == 2 * tw && h % 2 == 0) {
#define WINO_SHORT(g)                                                                              \
    case g:                                                                                        \
        wino_output_short(g, m, m_xi, ldm, channels, h, n_images, ty0, th, y, y_image);            \
        return
        switch (w) {
            WINO_SHORT(2);
            WINO_SHORT(4);
            WINO_SHORT(8);
            WINO_SHORT(16);
        default:
            break;
        }
#undef WINO_SHORT
    }
    for (int n = 0; n < n_images; n++)
        for (int k = 0; k < channels; k++) {
            float *yk = y + n * y_image + (size_t)k * h * w;
            for (int ty = ty0; ty < ty0 + th; ty++) {
                const float *mt = m + (size_t)k * ldm + (size_t)(n * th + ty - ty0) * tw;
                float *row0 = yk + (size_t)(2 * ty) * w, *row1 = row0 + w;
                const bool second = 2 * ty + 1 < h;
                for (int t0 = 0; t0 < tw; t0 += VL) {
                    const int n_t = tw - t0;
                    vf a[4], b[4]; /* A^T over the columns of each row i */
                    wino_out_columns(mt + t0, m_xi, n_t, a, b);
                    const vf y00 = V_ADD(V_ADD(a[0], a[1]), a[2]);
                    const vf y01 = V_ADD(V_ADD(b[0], b[1]), b[2]);
                    vf lo, hi;
                    const int rem = w - 2 * t0;
                    V_ZIP(y00, y01, lo, hi);
                    wino_store(row0 + 2 * t0, rem, lo);
                    wino_store(row0 + 2 * t0 + VL, rem - VL, hi);
                    if (second) {
                        const vf y10 = V_SUB(V_SUB(a[1], a[2]), a[3]);
                        const vf y11 = V_SUB(V_SUB(b[1], b[2]), b[3]);
                        V_ZIP(y10, y11, lo, hi);
                        wino_store(row1 + 2 * t0, rem, lo);
                        wino_store(row1 + 2 * t0 + VL, rem - VL, hi);
                    }
                }
            }
        }
}

/* Mg^T, tile-major (element (xi, t, k) at m + xi * m_xi + t * channels + k), from the output
 * gradient in pixel-major order (image n, pixel p, channel k at dyt + (n*h*w + p) * channels +
 * k): vectors over the channels, 0 for the pixels past the image's edge. */
static void loops_wino_dy_nhwc(const float *dyt, int channels, int h, int w, int n_images, int ty0,
                               int th, float *m, size_t m_xi) {
    const int tw = (w + 1) / 2, K = channels;
    for (int n = 0; n < n_images; n++)
        for (int ty = ty0; ty < ty0 + th; ty++)
            for (int tx = 0; tx < tw; tx++) {
                const float *p00 = dyt + ((size_t)(n * h + 2 * ty) * w + 2 * tx) * K;
                const bool right = 2 * tx + 1 < w, down = 2 * ty + 1 < h;
                float *out = m + ((size_t)(n * th + ty - ty0) * tw + tx) * K;
                for (int k0 = 0; k0 < K; k0 += VL) {
                    const int nk = K - k0;
                    const vf y00 = wino_load(p00 + k0, nk);
                    const vf y01 = right ? wino_load(p00 + K + k0, nk) : V_ZERO();
                    const vf y10 = down ? wino_load(p00 + (size_t)w * K + k0, nk) : V_ZERO();
                    const vf y11 =
                        right && down ? wino_load(p00 + (size_t)(w + 1) * K + k0, nk) : V_ZERO();
                    /* A dY: rows dY0, dY0 + dY1, dY0 - dY1, -dY1; then the same over columns */
                    const vf z[4][2] = {{y00, y01},
                                        {V_ADD(y00, y10), V_ADD(y01, y11)},
                                        {V_SUB(y00, y10), V_SUB(y01, y11)},
                                        {V_SUB(V_ZERO(), y10), V_SUB(V_ZERO(), y11)}};
                    for (int i = 0; i < 4; i++) {
                        float *q = out + (size_t)(4 * i) * m_xi + k0;
                        wino_store(q, nk, z[i][0]);
                        wino_store(q + m_xi, nk, V_ADD(z[i][0], z[i][1]));
                        wino_store(q + 2 * m_xi, nk, V_SUB(z[i][0], z[i][1]));
                        wino_store(q + 3 * m_xi, nk, V_SUB(V_ZERO(), z[i][1]));
                    }
                }
            }
}

#ifdef WINO_STORE_PAIRS
#define POINTS_OF_TILE 16
/* V as loops_wino_input computes it, two channels at a time, rounded and paired as the bf16 GEMM
 * reads it (cf_wino_kernels.input_pairs): WINO_STORE_PAIRS(p, n, lo, hi), defined by the
 * including file, stores the first n (1 to VL) words bf16(lo) | bf16(hi) << 16 at p. Both planes
 * of a pair are split first, then transformed together: the fp32 V is never written. */
static void loops_wino_input_pairs(const float *x, int channels, int h, int w, int n_images,
                                   size_t x_image, int ty0, int th, uint32_t *v, size_t v_xi,
                                   int ldv, float *pad) {
    const int tw = (w + 1) / 2, tiles = th * tw;
    const size_t part = (size_t)(th + 1) * tw + VL, plane = (size_t)h * w;
    const size_t split = 8 * part + VL; /* one split plane; pad holds two */
    const float *even0 = pad, *odd0 = pad + 4 * part;
    const float *even1 = pad + split, *odd1 = even1 + 4 * part;
    for (int n = 0; n < n_images; n++)
        for (int c = 0; c < channels; c += 2) {
            const float *xc = x + (size_t)n * x_image + (size_t)c * plane;
            const bool two = c + 1 < channels;
            const float *next = c + 2 < channels   ? xc + 2 * plane
                                : n + 1 < n_images ? x + (size_t)(n + 1) * x_image
                                                   : NULL;
            wino_split_plane(xc, h, w, ty0, th, tw, pad, two ? xc + plane : next);
            if (two) wino_split_plane(xc + plane, h, w, ty0, th, tw, pad + split, next);
            uint32_t *out = v + (size_t)(c / 2) * ldv + (size_t)n * tiles;
            for (int t0 = 0; t0 < tiles; t0 += VL) {
                const int left = tiles - t0 < VL ? tiles - t0 : VL;
                vf a1[4], a2[4], b1[4], b2[4]; /* patch rows 1 and 2 of channels c and c + 1 */
                for (int k = 0; k < 4; k++) {
                    a1[k] = V_LOADU(odd0 + k * part + t0);
                    a2[k] = V_LOADU(even0 + k * part + tw + t0);
                    b1[k] = two ? V_LOADU(odd1 + k * part + t0) : V_ZERO();
                    b2[k] = two ? V_LOADU(even1 + k * part + tw + t0) : V_ZERO();
                }
#define WINO_PAIRS_T_B(i, ta, tb)                                                                  \
    do {                                                                                           \
        uint32_t *o_ = out + (size_t)(4 * (i)) * v_xi + t0;                                        \
        WINO_STORE_PAIRS(o_, left, V_SUB((ta)[0], (ta)[2]), V_SUB((tb)[0], (tb)[2]));              \
        WINO_STORE_PAIRS(o_ + v_xi, left, V_ADD((ta)[1], (ta)[2]), V_ADD((tb)[1], (tb)[2]));       \
        WINO_STORE_PAIRS(o_ + 2 * v_xi, left, V_SUB((ta)[2], (ta)[1]), V_SUB((tb)[2], (tb)[1]));   \
        WINO_STORE_PAIRS(o_ + 3 * v_xi, left, V_SUB((ta)[1], (ta)[3]), V_SUB((tb)[1], (tb)[3]));   \
    } while (0)
                vf ta[4], tb[4];
                for (int k = 0; k < 4; k++) {
                    ta[k] = V_ADD(a1[k], a2[k]);
                    tb[k] = V_ADD(b1[k], b2[k]);
                }
                WINO_PAIRS_T_B(1, ta, tb);
                for (int k = 0; k < 4; k++) {
                    ta[k] = V_SUB(a2[k], a1[k]);
                    tb[k] = V_SUB(b2[k], b1[k]);
                }
                WINO_PAIRS_T_B(2, ta, tb);
                for (int k = 0; k < 4; k++) {
                    ta[k] = V_SUB(V_LOADU(even0 + k * part + t0), a2[k]);
                    tb[k] = two ? V_SUB(V_LOADU(even1 + k * part + t0), b2[k]) : V_ZERO();
                }
                WINO_PAIRS_T_B(0, ta, tb);
                for (int k = 0; k < 4; k++) {
                    ta[k] = V_SUB(a1[k], V_LOADU(odd0 + k * part + tw + t0));
                    tb[k] = two ? V_SUB(b1[k], V_LOADU(odd1 + k * part + tw + t0)) : V_ZERO();
                }
                WINO_PAIRS_T_B(3, ta, tb);
#undef WINO_PAIRS_T_B
            }
        }
}

/* The 16 vectors of Mg (xi = 4i + j) of call tile t (numbered image by image, row by row over the
 * tile rows [ty0, ty0 + th)) for the channels [k0, k0 + nk), as loops_wino_dy_nhwc computes
 * them; 0 for t past the call's tiles. */
CF_INLINE void wino_dy_tile(const float *dyt, int K, int h, int w, int ty0, int th, int t,
                            int tiles, int k0, int nk, vf z[POINTS_OF_TILE]) {
    if (t >= tiles) {
        for (int xi = 0; xi < POINTS_OF_TILE; xi++) z[xi] = V_ZERO();
        return;
    }
    const int tw = (w + 1) / 2, per_image = th * tw;
    const int n = t / per_image, ty = ty0 + t % per_image / tw, tx = t % tw;
    const float *p00 = dyt + ((size_t)(n * h + 2 * ty) * w + 2 * tx) * K;
    const bool right = 2 * tx + 1 < w, down = 2 * ty + 1 < h;
    const vf y00 = wino_load(p00 + k0, nk);
    const vf y01 = right ? wino_load(p00 + K + k0, nk) : V_ZERO();
    const vf y10 = down ? wino_load(p00 + (size_t)w * K + k0, nk) : V_ZERO();
    const vf y11 = right && down ? wino_load(p00 + (size_t)(w + 1) * K + k0, nk) : V_ZERO();
    const vf r[4][2] = {{y00, y01},
                        {V_ADD(y00, y10), V_ADD(y01, y11)},
                        {V_SUB(y00, y10), V_SUB(y01, y11)},
                        {V_SUB(V_ZERO(), y10), V_SUB(V_ZERO(), y11)}};
    for (int i = 0; i < 4; i++) {
        z[4 * i] = r[i][0];
        z[4 * i + 1] = V_ADD(r[i][0], r[i][1]);
        z[4 * i + 2] = V_SUB(r[i][0], r[i][1]);
        z[4 * i + 3] = V_SUB(V_ZERO(), r[i][1]);
    }
}

/* Mg^T as loops_wino_dy_nhwc computes it, rounded and paired over the tiles as the bf16 GEMM
 * reads it (cf_wino_kernels.dy_pairs): the word of point xi, tile pair q, channel k at m + xi *
 * m_xi + q * ldm + k is bf16(Mg(xi, 2q, k)) | bf16(Mg(xi, 2q + 1, k)) << 16, 0 in the high half
 * past the call's tiles. */
static void loops_wino_dy_pairs(const float *dyt, int channels, int h, int w, int n_images, int ty0,
                                int th, uint32_t *m, size_t m_xi, int ldm) {
    const int K = channels, tiles = n_images * th * ((w + 1) / 2);
    for (int t = 0; t < tiles; t += 2)
        for (int k0 = 0; k0 < K; k0 += VL) {
            const int nk = K - k0 < VL ? K - k0 : VL;
            vf a[POINTS_OF_TILE], b[POINTS_OF_TILE];
            wino_dy_tile(dyt, K, h, w, ty0, th, t, tiles, k0, nk, a);
            wino_dy_tile(dyt, K, h, w, ty0, th, t + 1, tiles, k0, nk, b);
            uint32_t *out = m + (size_t)(t / 2) * ldm + k0;
            for (int xi = 0; xi < POINTS_OF_TILE; xi++)
                WINO_STORE_PAIRS(out + xi * m_xi, nk, a[xi], b[xi]);
        }
}
#define WINO_INPUT_PAIRS loops_wino_input_pairs
#define WINO_DY_PAIRS loops_wino_dy_pairs
#else
#define WINO_INPUT_PAIRS NULL
#define WINO_DY_PAIRS NULL
#endif

#ifndef WINO_SHORT_ROW_COST /* not measured: 4-float vectors waste fewer lanes on short rows */
#define WINO_SHORT_ROW_COST 64
#endif
static const cf_wino_kernels loops_wino = {
    .short_row_cost = WINO_SHORT_ROW_COST,
    .input = loops_wino_input,
    .output = loops_wino_output,
    .dy_nhwc = loops_wino_dy_nhwc,
    .input_pairs = WINO_INPUT_PAIRS,
    .dy_pairs = WINO_DY_PAIRS,
    .input_bf16 = WINO_INPUT_BF16,
};

#endif
