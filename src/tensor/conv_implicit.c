/* Convolutions without a patch matrix ("implicit GEMM"), for stride 1 with the output as large
 * as the input and for stride 2 on even-sized images (ResNets' 3x3 layers, their 1x1 and 3x3
 * downsampling layers).
 *
 * A stride-2 image is split into its four phase planes, x_ab[u][v] = x[2u + a][2v + b], each
 * as large as the output; a kernel tap then reads one phase plane shifted by a whole number of
 * rows and columns, exactly as a stride-1 tap reads the image. So every layer is a sum over
 * taps of shifted planes: tap t reads plane phase(t) at offset shift(t), masked where the
 * shifted position leaves the plane. The GEMM kernel keeps a tile of 8 output rows by up to 3
 * vectors of 16 output positions in registers and runs taps outside, channels inside: per tap
 * the load offsets and masks are fixed. Positions run over the images one after the other, so a
 * vector may hold the end of one image and the start of the next; its lanes then come from two
 * masked loads and go out in two masked stores.
 *
 *   forward   y[o] = sum over taps t, channels c of w[o][c][t] * shift_t(x_phase(t)[c])
 *   dx        phase ab of dx[c] = sum over the taps of phase ab, o of w[o][c][t] * shift_-t(dy[o])
 *   dW        dW[o][c][t] = sum over positions p of dy[o][p] * x_phase(t)[c][p + shift(t)],
 *             from the phases transposed (channels contiguous) and zero-padded, so that every
 *             tap is a plain walk with no masks. */
#include "corefit/tensor.h"

#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { PACK_ROWS = 8 }; /* rows per packed block: the kernel's tile height */

static size_t round_rows(int rows) { /* rows padded to whole packed blocks */
    return (size_t)((rows + PACK_ROWS - 1) / PACK_ROWS * PACK_ROWS);
}

typedef struct layout {
    int stride, phases; /* 1 and 1, or 2 and 4 */
    int oh, ow, plane;  /* output (= phase plane) size */
    int taps;
    int phase[CF_IMPLICIT_MAX_TAPS], di[CF_IMPLICIT_MAX_TAPS], dj[CF_IMPLICIT_MAX_TAPS];
    int pad_lo, pad_hi; /* zero border of the transposed phases (dW): -min(d), max(d) */
} layout;

static int floor_div2(int v) {
    return v >= 0 ? v / 2 : -((1 - v) / 2);
}

static void layout_make(layout *l, const cf_conv_geom *g) {
    l->stride = g->sh;
    l->phases = g->sh * g->sh;
    l->oh = g->oh;
    l->ow = g->ow;
    l->plane = g->oh * g->ow;
    l->taps = g->kh * g->kw;
    l->pad_lo = l->pad_hi = 0;
    for (int t = 0; t < l->taps; t++) {
        const int ri = t / g->kw - g->ph, rj = t % g->kw - g->pw; /* input offset from s*out */
        if (l->stride == 1) {
            l->phase[t] = 0;
            l->di[t] = ri;
            l->dj[t] = rj;
        } else {
            l->di[t] = floor_div2(ri);
            l->dj[t] = floor_div2(rj);
            l->phase[t] = (ri - 2 * l->di[t]) * 2 + (rj - 2 * l->dj[t]);
        }
        const int lo = l->di[t] < l->dj[t] ? l->di[t] : l->dj[t];
        const int hi = l->di[t] > l->dj[t] ? l->di[t] : l->dj[t];
        if (-lo > l->pad_lo) l->pad_lo = -lo;
        if (hi > l->pad_hi) l->pad_hi = hi;
    }
}

bool cf_conv_implicit_supported(const cf_conv_geom *g) {
#if defined(__AVX512F__)
    if (g->kh != g->kw || g->sh != g->sw || g->ph != g->pw) return false;
    if (g->kh * g->kw > CF_IMPLICIT_MAX_TAPS) return false;
    const int plane = g->oh * g->ow;
    if (plane < 16 || plane > CF_IMPLICIT_MAX_PLANE) return false;
    if (g->sh == 1) return g->oh == g->h && g->ow == g->w;
    if (g->sh == 2) return g->h % 2 == 0 && g->w % 2 == 0 && 2 * g->oh == g->h && 2 * g->ow == g->w;
    return false;
#else
    (void)g;
    return false;
#endif
}

#define ROW_BYTES ((CF_IMPLICIT_MAX_PLANE + 16) / 8 + 8)

/* The taps of one kernel call: per tap, the offset of its shifted plane from an image's start
 * and the validity bits (bit p set when output position p reads inside the plane; rows padded
 * with zero bytes so that 16 bits can be read at any p < plane). */
typedef struct taps {
    int n, plane;
    ptrdiff_t offset[CF_IMPLICIT_MAX_TAPS];
    unsigned char valid[CF_IMPLICIT_MAX_TAPS][ROW_BYTES];
} taps;

/* The scratch starts with room for four tap lists (dx has one per phase), in floats rounded up
 * to a cache line. */
#define TAPS_FLOATS ((sizeof(taps) + 63) / 64 * 16)
#define TAP_LISTS 4

/* Images per block of a stride-2 call: the phase split of a block sits in the scratch, and a
 * block has at least 1024 output positions (mostly full tiles of 3 vectors; measured: 256 left
 * a fifth of the tiles at 2 vectors and cost 10% on W1's stride-2 layers). */
static int block_images(const layout *l) {
    return l->stride == 1 ? 1 : (1024 + l->plane - 1) / l->plane;
}

size_t cf_conv_implicit_scratch(const cf_conv_geom *g) {
    layout l;
    layout_make(&l, g);
    const size_t image = (size_t)g->c * g->h * g->w; /* = phases * c * plane */
    const size_t hp = (size_t)(l.oh + l.pad_lo + l.pad_hi),
                 wp = (size_t)(l.ow + l.pad_lo + l.pad_hi);
    size_t wgrad = (size_t)l.phases * hp * wp * g->c + (l.stride == 1 ? 0 : image);
    size_t blocks = l.stride == 1 ? 0 : (size_t)block_images(&l) * image;
    return TAP_LISTS * TAPS_FLOATS + (wgrad > blocks ? wgrad : blocks);
}

size_t cf_conv_implicit_packed_size(const cf_conv_geom *g, int out_channels) {
    /* forward: blocks of output channels by input channels; dx: the other way round */
    const size_t fwd = round_rows(out_channels) * g->c, dx = round_rows(g->c) * out_channels;
    return (fwd > dx ? fwd : dx) * g->kh * g->kw;
}

/* packed = A in the kernel's order for the taps list[0..n): blocks of 8 rows; in a block,
 * tap-major then channel, the 8 rows' values side by side (rows past m are 0). A(r, c, t) =
 * a[r*a_row + c*a_c + t]. */
static float *pack(int m, int channels, const int *list, int n, const float *a, ptrdiff_t a_row,
                   ptrdiff_t a_c, float *packed) {
    for (int m0 = 0; m0 < m; m0 += PACK_ROWS)
        for (int s = 0; s < n; s++)
            for (int c = 0; c < channels; c++) {
                float *d = packed + (((size_t)m0 * n + (size_t)s * PACK_ROWS) * channels) +
                           (size_t)c * PACK_ROWS;
                for (int i = 0; i < PACK_ROWS; i++)
                    d[i] = m0 + i < m ? a[(m0 + i) * a_row + c * a_c + list[s]] : 0.0f;
            }
    return packed + round_rows(m) * n * channels;
}

void cf_conv_implicit_pack(const cf_conv_geom *g, int out_channels, const float *w, float *packed) {
    int list[CF_IMPLICIT_MAX_TAPS];
    const int T = g->kh * g->kw;
    for (int t = 0; t < T; t++) list[t] = t;
    pack(out_channels, g->c, list, T, w, (ptrdiff_t)g->c * T, T, packed);
}

void cf_conv_implicit_pack_dx(const cf_conv_geom *g, int out_channels, const float *w,
                              float *packed) {
    /* per phase of dx, its taps: A(r = input channel, c = output channel, t) = w[c][r][t] */
    layout l;
    layout_make(&l, g);
    const int T = l.taps;
    for (int ph = 0; ph < l.phases; ph++) {
        int list[CF_IMPLICIT_MAX_TAPS], n = 0;
        for (int t = 0; t < T; t++)
            if (l.phase[t] == ph) list[n++] = t;
        packed = pack(g->c, out_channels, list, n, w, T, (ptrdiff_t)g->c * T, packed);
    }
}

#if defined(__AVX512F__)
#define MR PACK_ROWS
#define NV_MAX 3

/* Adds a tap reading the plane at base, shifted by (di, dj) in an oh x ow plane. */
static void taps_add(taps *tp, const layout *l, ptrdiff_t base, int di, int dj) {
    const int t = tp->n++;
    tp->plane = l->plane;
    tp->offset[t] = base + (ptrdiff_t)di * l->ow + dj;
    unsigned char *row = tp->valid[t];
    memset(row, 0, ROW_BYTES);
    for (int y = 0, p = 0; y < l->oh; y++)
        for (int x = 0; x < l->ow; x++, p++)
            if (y + di >= 0 && y + di < l->oh && x + dj >= 0 && x + dj < l->ow)
                row[p >> 3] |= (unsigned char)(1u << (p & 7));
}

static inline unsigned valid_bits(const taps *tp, int t, int p) {
    uint32_t word;
    memcpy(&word, tp->valid[t] + (p >> 3), sizeof word);
    return (word >> (p & 7)) & 0xffffu;
}

/* One column tile's offsets and masks. */
typedef struct cols {
    ptrdiff_t x1[CF_IMPLICIT_MAX_TAPS][NV_MAX], x2[CF_IMPLICIT_MAX_TAPS][NV_MAX];
    __mmask16 m1[CF_IMPLICIT_MAX_TAPS][NV_MAX], m2[CF_IMPLICIT_MAX_TAPS][NV_MAX];
    ptrdiff_t y1[NV_MAX], y2[NV_MAX];
    __mmask16 s1[NV_MAX], s2[NV_MAX];
} cols;

static inline __attribute__((always_inline)) void tile(int mr, int nv, bool two, int channels,
                                                       int n_taps, const float *a, const float *x,
                                                       size_t x_plane, const cols *sc, float *y,
                                                       size_t y_row) {
    __m512 acc[MR][NV_MAX];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV_MAX; v++) acc[i][v] = _mm512_setzero_ps();
    for (int t = 0; t < n_taps; t++) {
        const float *p1[NV_MAX], *p2[NV_MAX];
        __mmask16 m1[NV_MAX], m2[NV_MAX];
        for (int v = 0; v < nv; v++) {
            p1[v] = x + sc->x1[t][v];
            m1[v] = sc->m1[t][v];
            if (two) {
                p2[v] = x + sc->x2[t][v];
                m2[v] = sc->m2[t][v];
            }
        }
        const float *at = a + (size_t)t * channels * MR;
        for (int c = 0; c < channels; c++, at += MR) {
            const size_t off = (size_t)c * x_plane;
            __m512 bv[NV_MAX];
            for (int v = 0; v < nv; v++) {
                bv[v] = _mm512_maskz_loadu_ps(m1[v], p1[v] + off);
                if (two) bv[v] = _mm512_mask_loadu_ps(bv[v], m2[v], p2[v] + off);
            }
            for (int i = 0; i < mr; i++) {
                const __m512 av = _mm512_set1_ps(at[i]);
                for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) {
            float *row = y + (size_t)i * y_row;
            _mm512_mask_storeu_ps(row + sc->y1[v], sc->s1[v], acc[i][v]);
            if (two) _mm512_mask_storeu_ps(row + sc->y2[v], sc->s2[v], acc[i][v]);
        }
}

#define TILE(mr_, nv_, two_) tile(mr_, nv_, two_, channels, tp->n, ap, x, x_plane, &sc, yp, y_row)
#define TILES(two_)                                                                                \
    do {                                                                                           \
        if (nv == 3)                                                                               \
            TILE(MR, 3, two_);                                                                     \
        else if (nv == 2)                                                                          \
            TILE(MR, 2, two_);                                                                     \
        else                                                                                       \
            TILE(MR, 1, two_);                                                                     \
    } while (0)

/* y[n][r][p] (row r at y + n*y_image + r*y_row + p) = sum over taps and channels of
 * A(r, c, t) * x[n][c][p + offset(t)] (channel c at c*x_plane), for n < n_images, r < m. */
static void run(const taps *tp, int channels, int m, const float *packed, const float *x,
                size_t x_plane, size_t x_image, int n_images, float *y, size_t y_row,
                size_t y_image) {
    const int plane = tp->plane;
    const int64_t n_cols = (int64_t)n_images * plane, vectors = (n_cols + 15) / 16;
    cols sc;
    ptrdiff_t lo_offset = tp->offset[0], hi_offset = tp->offset[0];
    for (int t = 1; t < tp->n; t++) {
        if (tp->offset[t] < lo_offset) lo_offset = tp->offset[t];
        if (tp->offset[t] > hi_offset) hi_offset = tp->offset[t];
    }
    const ptrdiff_t span = hi_offset - lo_offset + 16 * NV_MAX;
    for (int64_t v0 = 0, nv; v0 < vectors; v0 += nv) {
        const int64_t left = vectors - v0;
        nv = left == 4 ? 2 : left >= NV_MAX ? NV_MAX : left; /* no lone last vector */
        bool two = false;
        for (int v = 0; v < nv; v++) {
            const int64_t q = 16 * (v0 + v), img = q / plane;
            const int p1 = (int)(q - img * plane);
            int n1 = plane - p1 < 16 ? plane - p1 : 16;
            if (n_cols - q < n1) n1 = (int)(n_cols - q);
            const int n2 = n_cols - q - n1 < 16 - n1 ? (int)(n_cols - q - n1) : 16 - n1;
            const unsigned low1 = (1u << n1) - 1u, low2 = (1u << n2) - 1u;
            two |= n2 > 0;
            sc.y1[v] = (ptrdiff_t)(img * (int64_t)y_image + p1);
            sc.y2[v] = (ptrdiff_t)((img + 1) * (int64_t)y_image + p1 - plane);
            sc.s1[v] = (__mmask16)low1;
            sc.s2[v] = (__mmask16)(low2 << n1);
            for (int t = 0; t < tp->n; t++) {
                sc.x1[t][v] = (ptrdiff_t)(img * (int64_t)x_image + p1) + tp->offset[t];
                sc.m1[t][v] = (__mmask16)(valid_bits(tp, t, p1) & low1);
                sc.x2[t][v] =
                    (ptrdiff_t)((img + 1) * (int64_t)x_image + p1 - plane) + tp->offset[t];
                sc.m2[t][v] = (__mmask16)(n2 ? (valid_bits(tp, t, 0) & low2) << n1 : 0u);
            }
        }
        /* the next tile's columns of every channel plane (from the lowest to the highest tap
         * offset) are brought into cache while this tile computes: a layer's input was written
         * long before and the hardware prefetchers do not follow dozens of plane streams */
        if (v0 + nv < vectors && span <= 256) { /* not the phase split, just written */
            const int64_t q = 16 * (v0 + nv), img = q / plane;
            const float *base = x + img * (int64_t)x_image + (q - img * plane) + lo_offset;
            for (int c = 0; c < channels; c++)
                for (ptrdiff_t off = 0; off < span; off += 16)
                    __builtin_prefetch(base + (size_t)c * x_plane + off, 0, 3);
        }
        for (int m0 = 0; m0 < m; m0 += MR) {
            const float *ap = packed + (size_t)m0 * channels * tp->n;
            float *yp = y + (size_t)m0 * y_row;
            if (m - m0 >= MR) {
                if (two)
                    TILES(true);
                else
                    TILES(false);
            } else {
                tile(m - m0, (int)nv, two, channels, tp->n, ap, x, x_plane, &sc, yp, y_row);
            }
        }
    }
}
#undef TILES
#undef TILE

/* Lanes [0, n) of a vector, n clamped to 0..16. */
static inline __mmask16 first_lanes(int n) {
    return (__mmask16)(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1u);
}

/* Stride 2: the phase planes of one image, xs[c][a*2 + b][u][v] = x[c][2u + a][2v + b], for
 * the phases whose bit is set in `used`. */
static void split_phases(const cf_conv_geom *g, const float *x, float *xs, unsigned used) {
    const int oh = g->oh, ow = g->ow, w = g->w;
    const size_t plane = (size_t)oh * ow;
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + (size_t)c * g->h * w;
        float *sc = xs + (size_t)c * 4 * plane;
        for (int a = 0; a < 2; a++) {
            const bool want0 = used >> (2 * a) & 1u, want1 = used >> (2 * a + 1) & 1u;
            if (!want0 && !want1) continue;
            float *d0 = sc + (size_t)(2 * a) * plane, *d1 = d0 + plane;
            for (int u = 0; u < oh; u++) {
                const float *r = xc + (size_t)(2 * u + a) * w;
                for (int v0 = 0; v0 < ow; v0 += 16) {          /* 32 inputs give 16 of each phase */
                    const int n = ow - v0 < 16 ? ow - v0 : 16; /* from 2n <= 32 inputs */
                    const __mmask16 out = first_lanes(n);
                    const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(2 * n), r + 2 * v0);
                    const __m512 hi =
                        _mm512_maskz_loadu_ps(first_lanes(2 * n - 16), r + 2 * v0 + 16);
                    if (want0)
                        _mm512_mask_storeu_ps(d0 + (size_t)u * ow + v0, out,
                                              _mm512_permutex2var_ps(lo, even, hi));
                    if (want1)
                        _mm512_mask_storeu_ps(d1 + (size_t)u * ow + v0, out,
                                              _mm512_permutex2var_ps(lo, odd, hi));
                }
            }
        }
    }
}

/* The inverse: x[c][2u + a][2v + b] = xs[c][a*2 + b][u][v]. */
static void merge_phases(const cf_conv_geom *g, const float *xs, float *x) {
    const int oh = g->oh, ow = g->ow, w = g->w;
    const size_t plane = (size_t)oh * ow;
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int c = 0; c < g->c; c++) {
        float *xc = x + (size_t)c * g->h * w;
        const float *sc = xs + (size_t)c * 4 * plane;
        for (int a = 0; a < 2; a++) {
            const float *s0 = sc + (size_t)(2 * a) * plane, *s1 = s0 + plane;
            for (int u = 0; u < oh; u++) {
                float *r = xc + (size_t)(2 * u + a) * w;
                for (int v0 = 0; v0 < ow; v0 += 16) {
                    const int n = ow - v0 < 16 ? ow - v0 : 16; /* to 2n <= 32 outputs */
                    const __mmask16 in = first_lanes(n), out0 = first_lanes(2 * n),
                                    out1 = first_lanes(2 * n - 16);
                    const __m512 e = _mm512_maskz_loadu_ps(in, s0 + (size_t)u * ow + v0);
                    const __m512 o = _mm512_maskz_loadu_ps(in, s1 + (size_t)u * ow + v0);
                    _mm512_mask_storeu_ps(r + 2 * v0, out0, _mm512_permutex2var_ps(e, lo_idx, o));
                    _mm512_mask_storeu_ps(r + 2 * v0 + 16, out1,
                                          _mm512_permutex2var_ps(e, hi_idx, o));
                }
            }
        }
    }
}

static unsigned phases_used(const layout *l) {
    unsigned used = 0;
    for (int t = 0; t < l->taps; t++) used |= 1u << l->phase[t];
    return used;
}

void cf_conv_implicit_forward(const cf_conv_geom *g, int out_channels, const float *packed,
                              const float *x, int n_images, float *y, float *scratch) {
    layout l;
    layout_make(&l, g);
    taps *tp = (taps *)scratch;
    scratch += TAP_LISTS * TAPS_FLOATS;
    tp->n = 0;
    for (int t = 0; t < l.taps; t++)
        taps_add(tp, &l, (ptrdiff_t)l.phase[t] * l.plane, l.di[t], l.dj[t]);
    const size_t image = (size_t)g->c * g->h * g->w, y_image = (size_t)out_channels * l.plane;
    if (l.stride == 1) {
        run(tp, g->c, out_channels, packed, x, (size_t)l.plane, image, n_images, y, (size_t)l.plane,
            y_image);
        return;
    }
    const unsigned used = phases_used(&l);
    const int block = block_images(&l);
    for (int n0 = 0; n0 < n_images; n0 += block) {
        const int nb = n_images - n0 < block ? n_images - n0 : block;
        for (int n = 0; n < nb; n++)
            split_phases(g, x + (size_t)(n0 + n) * image, scratch + (size_t)n * image, used);
        run(tp, g->c, out_channels, packed, scratch, 4 * (size_t)l.plane, image, nb,
            y + (size_t)n0 * y_image, (size_t)l.plane, y_image);
    }
}

void cf_conv_implicit_dx(const cf_conv_geom *g, int out_channels, const float *packed_dx,
                         const float *dy, int n_images, float *dx, float *scratch) {
    layout l;
    layout_make(&l, g);
    const size_t image = (size_t)g->c * g->h * g->w, dy_image = (size_t)out_channels * l.plane;
    const size_t per_tap = round_rows(g->c) * out_channels; /* packed floats per tap */
    /* stride 1 writes dx itself, all images in one call; stride 2 writes a block's phases into
     * the scratch, then merges them into dx */
    const int block = l.stride == 1 ? n_images : block_images(&l);
    taps *phase_taps = (taps *)scratch;
    scratch += TAP_LISTS * TAPS_FLOATS;
    for (int ph = 0; ph < l.phases; ph++) {
        phase_taps[ph].n = 0;
        phase_taps[ph].plane = l.plane;
        for (int t = 0; t < l.taps; t++)
            if (l.phase[t] == ph) taps_add(&phase_taps[ph], &l, 0, -l.di[t], -l.dj[t]);
    }
    for (int n0 = 0; n0 < n_images; n0 += block) {
        const int nb = n_images - n0 < block ? n_images - n0 : block;
        float *out = l.stride == 1 ? dx + (size_t)n0 * image : scratch;
        const float *a = packed_dx;
        for (int ph = 0; ph < l.phases; ph++) {
            const taps *tp = &phase_taps[ph];
            float *yp = out + (size_t)ph * l.plane;
            const size_t y_row = (size_t)l.phases * l.plane;
            if (tp->n == 0) { /* no tap reads this phase: its gradient is zero */
                for (int n = 0; n < nb; n++)
                    for (int c = 0; c < g->c; c++)
                        memset(yp + n * image + c * y_row, 0, (size_t)l.plane * sizeof(float));
                continue;
            }
            run(tp, out_channels, g->c, a, dy + (size_t)n0 * dy_image, (size_t)l.plane, dy_image,
                nb, yp, y_row, image);
            a += per_tap * tp->n;
        }
        if (l.stride == 2)
            for (int n = 0; n < nb; n++)
                merge_phases(g, scratch + (size_t)n * image, dx + (size_t)(n0 + n) * image);
    }
}

/* The weight gradient over one image: a tile of MR output channels by nv vectors of input
 * channels, summed over the positions; b is the tap's start in the transposed, padded phase. */
static inline __attribute__((always_inline)) void
wgrad_tile(int mr, int nv, int oh, int ow, const float *dy, size_t plane, const float *b,
           ptrdiff_t row_step, int channels, float *out, int ldo, __mmask16 last, bool accumulate) {
    __m512 acc[MR][NV_MAX];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV_MAX; v++) acc[i][v] = _mm512_setzero_ps();
    for (int y = 0; y < oh; y++) {
        const float *by = b + y * row_step, *ay = dy + (size_t)y * ow;
        for (int x = 0; x < ow; x++) {
            const float *bp = by + (size_t)x * channels;
            __m512 bv[NV_MAX];
            for (int v = 0; v < nv; v++)
                bv[v] = v == nv - 1 ? _mm512_maskz_loadu_ps(last, bp + 16 * v)
                                    : _mm512_loadu_ps(bp + 16 * v);
            for (int i = 0; i < mr; i++) {
                const __m512 av = _mm512_set1_ps(ay[i * plane + x]);
                for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) {
            const __mmask16 mask = v == nv - 1 ? last : (__mmask16)0xffff;
            float *cp = out + (size_t)i * ldo + 16 * v;
            __m512 r = acc[i][v];
            if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, cp));
            _mm512_mask_storeu_ps(cp, mask, r);
        }
}

#define WGRAD_TILE(mr_, nv_)                                                                       \
    wgrad_tile(mr_, nv_, l.oh, l.ow, dyp, plane, bp, row_step, C, op, C, last, accumulate)

void cf_conv_implicit_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, float *dwt, bool accumulate, float *scratch) {
    layout l;
    layout_make(&l, g);
    const int C = g->c, m = out_channels;
    const int hp = l.oh + l.pad_lo + l.pad_hi, wp = l.ow + l.pad_lo + l.pad_hi;
    const size_t plane = (size_t)l.plane, tplane = (size_t)hp * wp * C;
    /* the phases, transposed into the scratch's zero-bordered planes */
    scratch += TAP_LISTS * TAPS_FLOATS;
    float *xt = scratch, *xs = scratch + (size_t)l.phases * tplane;
    const float *src = x;
    const unsigned used = phases_used(&l);
    if (l.stride == 2) {
        split_phases(g, x, xs, used);
        src = xs;
    }
    for (int ph = 0; ph < l.phases; ph++) {
        if (!(used >> ph & 1u)) continue;
        float *t = xt + (size_t)ph * tplane;
        const size_t row = (size_t)wp * C;
        for (int y = 0; y < hp; y++) { /* the border */
            if (y < l.pad_lo || y >= l.pad_lo + l.oh) {
                memset(t + y * row, 0, row * sizeof(float));
                continue;
            }
            memset(t + y * row, 0, (size_t)l.pad_lo * C * sizeof(float));
            memset(t + y * row + (size_t)(l.pad_lo + l.ow) * C, 0,
                   (size_t)l.pad_hi * C * sizeof(float));
        }
        const float *s = src + (size_t)ph * plane;
        const size_t s_plane = (size_t)l.phases * plane; /* channel stride of the phase */
        for (int y = 0; y < l.oh; y++)
            cf_transpose(C, l.ow, s + (size_t)y * l.ow, (ptrdiff_t)s_plane,
                         t + (size_t)(y + l.pad_lo) * row + (size_t)l.pad_lo * C, C);
    }
    const ptrdiff_t row_step = (ptrdiff_t)wp * C;
    const int vectors = (C + 15) / 16;
    for (int tap = 0; tap < l.taps; tap++) {
        const float *bt = xt + (size_t)l.phase[tap] * tplane +
                          ((size_t)(l.di[tap] + l.pad_lo) * wp + (l.dj[tap] + l.pad_lo)) * C;
        for (int v0 = 0, nv; v0 < vectors; v0 += nv) {
            const int left = vectors - v0;
            nv = left == 4 ? 2 : left >= NV_MAX ? NV_MAX : left;
            const int rem = C - 16 * v0,
                      tail = rem - 16 * (nv - 1) >= 16 ? 16 : rem - 16 * (nv - 1);
            const __mmask16 last = (__mmask16)((1u << tail) - 1u);
            const float *bp = bt + 16 * v0;
            for (int m0 = 0; m0 < m; m0 += MR) {
                const float *dyp = dy + (size_t)m0 * plane;
                float *op = dwt + ((size_t)tap * m + m0) * C + 16 * v0;
                if (m - m0 >= MR) {
                    if (nv == 3)
                        WGRAD_TILE(MR, 3);
                    else if (nv == 2)
                        WGRAD_TILE(MR, 2);
                    else
                        WGRAD_TILE(MR, 1);
                } else {
                    wgrad_tile(m - m0, nv, l.oh, l.ow, dyp, plane, bp, row_step, C, op, C, last,
                               accumulate);
                }
            }
        }
    }
}
#undef WGRAD_TILE
#else
/* Never called: cf_conv_implicit_supported is false without AVX-512. */
void cf_conv_implicit_forward(const cf_conv_geom *g, int out_channels, const float *packed,
                              const float *x, int n_images, float *y, float *scratch) {
    (void)g, (void)out_channels, (void)packed, (void)x, (void)n_images, (void)y, (void)scratch;
}
void cf_conv_implicit_dx(const cf_conv_geom *g, int out_channels, const float *packed_dx,
                         const float *dy, int n_images, float *dx, float *scratch) {
    (void)g, (void)out_channels, (void)packed_dx, (void)dy, (void)n_images, (void)dx, (void)scratch;
}
void cf_conv_implicit_wgrad(const cf_conv_geom *g, int out_channels, const float *dy,
                            const float *x, float *dwt, bool accumulate, float *scratch) {
    (void)g, (void)out_channels, (void)dy, (void)x, (void)dwt, (void)accumulate, (void)scratch;
}
#endif
