/* The AVX-512 kernels (AVX512F/BW/DQ/VL, FMA, BMI2). Compiled with those instruction sets
 * whatever the build's baseline; used only when the CPU reports all of them (isa.c). */
#if defined(__x86_64__)
#include "tensor/avx512_vectors.h"
#include "tensor/kernel_table.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MR 8
#define NV_MAX 3

static inline double avx512_hsum_d(__m512 v) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}
#define V_HSUM_D(v) avx512_hsum_d(v)
#define V_STREAM(p, v) _mm512_stream_ps((p), (v)) /* p 64-byte aligned */
#define V_SFENCE() _mm_sfence()
#include "tensor/optim_loops.h"
#include "tensor/dropout_loops.h"
#include "tensor/lstm_loops.h"
#include "tensor/grid_sample_loops.h"
#include "tensor/softmax_loops.h"
/* The 16 lanes' sum as OpenBLAS 0.3.21's SkylakeX small-matrix kernel (sgemm_small_kernel_tn,
 * the stem's lowered weight gradient) takes it: (l0 + l1) + (l2 + l3) within each 128-bit lane,
 * then (q0 + q1) + (q2 + q3) across them. */
static inline float avx512_stem_sum(__m512 v) {
    const __m512 a = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1)); /* l0 + l1, l2 + l3 */
    const __m512 b = _mm512_add_ps(a, _mm512_permute_ps(a, 0x4E)); /* (l0 + l1) + (l2 + l3) */
    const __m128 q0 = _mm512_castps512_ps128(b), q1 = _mm512_extractf32x4_ps(b, 1),
                 q2 = _mm512_extractf32x4_ps(b, 2), q3 = _mm512_extractf32x4_ps(b, 3);
    return _mm_cvtss_f32(_mm_add_ss(_mm_add_ss(q0, q1), _mm_add_ss(q2, q3)));
}
#define V_STEM_SUM(v) avx512_stem_sum(v)
#define WGRAD_NV 4 /* 6 rows x 4 vectors: 24 accumulators, 4 of B, a broadcast (29 of 32) */
#include "tensor/simd_kernels.h"
#include "tensor/bf16_lanes_avx512.h"
/* The bf16 Winograd's transformed values, rounded as they are computed (input_pairs, dy_pairs):
 * n lanes of (lo, hi) pairs, lo in the low 16 bits. */
static inline void wino_store_pairs(uint32_t *p, int n, __m512 lo, __m512 hi) {
    const __m512i w =
        _mm512_or_si512(cf__bf16_round_lanes(lo), _mm512_slli_epi32(cf__bf16_round_lanes(hi), 16));
    cf__store_words(p, n, w);
}
#define WINO_STORE_PAIRS(p, n, lo, hi) wino_store_pairs(p, n, lo, hi)
/* n lanes of v rounded to bf16 (input_bf16) */
static inline void wino_store_bf16(uint16_t *p, int n, __m512 v) {
    const __m512i w = cf__bf16_round_lanes(v);
    if (n >= 16)
        _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(w));
    else
        _mm512_mask_cvtepi32_storeu_epi16(p, (__mmask16)((1u << n) - 1u), w);
}
#define WINO_STORE_BF16(p, n, v) wino_store_bf16(p, n, v)
/* cf_conv_winograd_pays: bench_conv on W1 and W2 */
#define WINO_SHORT_ROW_COST 224
#include "tensor/winograd_loops.h"
#include "tensor/lstm_gemm_loops.h"

/* ---- transpose ------------------------------------------------------------------------------ */

/* dst[j * ldd + i] = src[i * lds + j] for i < 16, j < cols (cols <= 16; lanes outside m are
 * not read). */
static void transpose16(const float *src, int lds, __mmask16 m, float *dst, int ldd, int cols) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_ps(m, src + (size_t)i * lds);
    /* 2x2 blocks of 1, then of 2 (within 128-bit lanes), then 128-bit lanes across rows */
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4q + s] now holds, in 128-bit lane L, elements (rows 4q..4q+3, column 4L + s) */
    for (int q = 0; q < 4; q += 2)
        for (int s = 0; s < 4; s++) {
            __m512 a = r[4 * q + s], b = r[4 * q + 4 + s];
            t[4 * q + s] = _mm512_shuffle_f32x4(a, b, 0x88);     /* lanes 0, 2 of a then of b */
            t[4 * q + 4 + s] = _mm512_shuffle_f32x4(a, b, 0xdd); /* lanes 1, 3 */
        }
    for (int s = 0; s < 4; s++) {
        __m512 a0 = t[s], a1 = t[4 + s], b0 = t[8 + s], b1 = t[12 + s];
        r[s] = _mm512_shuffle_f32x4(a0, b0, 0x88);      /* column s      */
        r[8 + s] = _mm512_shuffle_f32x4(a0, b0, 0xdd);  /* column 8 + s  */
        r[4 + s] = _mm512_shuffle_f32x4(a1, b1, 0x88);  /* column 4 + s  */
        r[12 + s] = _mm512_shuffle_f32x4(a1, b1, 0xdd); /* column 12 + s */
    }
    for (int j = 0; j < cols; j++) _mm512_storeu_ps(dst + (size_t)j * ldd, r[j]);
}

static void avx512_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                             ptrdiff_t ldd) {
    for (int j0 = 0; j0 < cols; j0 += 16) {
        const int nj = cols - j0 < 16 ? cols - j0 : 16;
        const __mmask16 m = (__mmask16)((1u << nj) - 1u);
        int i0 = 0;
        for (; i0 + 16 <= rows; i0 += 16)
            transpose16(src + i0 * lds + j0, lds, m, dst + j0 * ldd + i0, ldd, nj);
        for (int j = j0; j < j0 + nj; j++) /* rows past the last block of 16 */
            for (int i = i0; i < rows; i++) dst[j * ldd + i] = src[i * lds + j];
    }
}

/* ---- im2col / col2im ------------------------------------------------------------------------ */

/* Image rows are short (7 to 28 values in W1), so a row costs its loop overhead more than its
 * copy: with AVX-512 a row of up to 16 outputs is one masked load (lanes outside the image
 * read nothing and give 0) and one masked store, the masks computed once per kernel tap.
 * Stride 2 loads 32 inputs and keeps the even ones. Rows of up to 64 outputs take this path. */
#define CF_VEC_CHUNKS 4
#define CF_MASK_TAPS 11 /* kernel widths with masks made once per call */

static inline __mmask16 lane_range(int lo, int hi) { /* lanes [lo, hi) of 16, clamped */
    if (lo < 0) lo = 0;
    if (hi > 16) hi = 16;
    if (hi <= lo) return 0;
    return (__mmask16)(((1u << (hi - lo)) - 1u) << lo);
}

typedef struct row_masks {
    int chunks;
    __mmask16 store[CF_VEC_CHUNKS]; /* output lanes of the chunk */
    __mmask16 valid[CF_VEC_CHUNKS]; /* output lanes whose input lies inside the row */
    __mmask16 in0[CF_VEC_CHUNKS];   /* stride 2: inputs 0-15 of the chunk inside the row */
    __mmask16 in1[CF_VEC_CHUNKS];   /* stride 2: inputs 16-31 */
    __mmask16 even0[CF_VEC_CHUNKS]; /* stride 2: even inputs 0-15 that receive a valid lane */
    __mmask16 even1[CF_VEC_CHUNKS];
} row_masks;

static bool vector_rows(const cf_conv_geom *g) {
    return g->sw <= 2 && g->ow <= 16 * CF_VEC_CHUNKS;
}

static void make_masks(row_masks *m, int ow, int off, int lo, int hi, int w) {
    m->chunks = (ow + 15) / 16;
    for (int k = 0; k < m->chunks; k++) {
        const int base = 16 * k;
        m->store[k] = lane_range(0, ow - base);
        m->valid[k] = lane_range(lo - base, hi - base);
        const int q = 2 * base + off; /* stride 2: input column of lane 0 */
        m->in0[k] = lane_range(-q, w - q);
        m->in1[k] = lane_range(-q - 16, w - q - 16);
        m->even0[k] = (__mmask16)_pdep_u32(m->valid[k] & 0xffu, 0x5555u);
        m->even1[k] = (__mmask16)_pdep_u32((m->valid[k] >> 8) & 0xffu, 0x5555u);
    }
}

/* Rows [0, rows) of one patch row: r[oy*ow + ox] = xr[oy*xstride + ox*sw + off] (masked). */
static void im2col_rows_v(float *r, const float *xr, size_t xstride, int rows, int ow, int sw,
                          int off, const row_masks *m) {
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    if (sw == 1 && m->chunks == 1) {
        const __mmask16 st = m->store[0], va = m->valid[0];
        for (int y = 0; y < rows; y++, r += ow, xr += xstride)
            _mm512_mask_storeu_ps(r, st, _mm512_maskz_loadu_ps(va, xr + off));
        return;
    }
    for (int y = 0; y < rows; y++, r += ow, xr += xstride)
        for (int k = 0; k < m->chunks; k++) {
            __m512 v;
            if (sw == 1) {
                v = _mm512_maskz_loadu_ps(m->valid[k], xr + 16 * k + off);
            } else {
                const float *src = xr + 32 * k + off;
                const __m512 a = _mm512_maskz_loadu_ps(m->in0[k], src);
                const __m512 b = _mm512_maskz_loadu_ps(m->in1[k], src + 16);
                v = _mm512_maskz_mov_ps(m->valid[k], _mm512_permutex2var_ps(a, even, b));
            }
            _mm512_mask_storeu_ps(r + 16 * k, m->store[k], v);
        }
}

/* The adjoint: xr[oy*xstride + ox*sw + off] += r[oy*ow + ox] for the valid lanes. */
static void col2im_rows_v(float *xr, const float *r, size_t xstride, int rows, int ow, int sw,
                          int off, const row_masks *m) {
    const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i hi_idx =
        _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    if (sw == 1 && m->chunks == 1) {
        const __mmask16 va = m->valid[0];
        for (int y = 0; y < rows; y++, r += ow, xr += xstride) {
            float *d = xr + off;
            const __m512 v = _mm512_maskz_loadu_ps(va, r);
            _mm512_mask_storeu_ps(d, va, _mm512_add_ps(_mm512_maskz_loadu_ps(va, d), v));
        }
        return;
    }
    for (int y = 0; y < rows; y++, r += ow, xr += xstride)
        for (int k = 0; k < m->chunks; k++) {
            const __mmask16 va = m->valid[k];
            const __m512 v = _mm512_maskz_loadu_ps(va, r + 16 * k);
            if (sw == 1) {
                float *d = xr + 16 * k + off;
                _mm512_mask_storeu_ps(d, va, _mm512_add_ps(_mm512_maskz_loadu_ps(va, d), v));
            } else {
                float *d = xr + 32 * k + off;
                const __mmask16 m0 = m->even0[k], m1 = m->even1[k];
                _mm512_mask_storeu_ps(
                    d, m0,
                    _mm512_add_ps(_mm512_maskz_loadu_ps(m0, d), _mm512_permutexvar_ps(lo_idx, v)));
                _mm512_mask_storeu_ps(d + 16, m1,
                                      _mm512_add_ps(_mm512_maskz_loadu_ps(m1, d + 16),
                                                    _mm512_permutexvar_ps(hi_idx, v)));
            }
        }
}

/* Stride 1 with input rows of at most 16 values: each input row gathers the contributions of
 * every kernel tap in a register and is stored once (no read-modify-write of the image). */
static bool col2im_by_rows(const cf_conv_geom *g) {
    return g->sw == 1 && g->sh == 1 && g->w <= 16 && g->kw <= 16;
}

static void col2im_rows_s1(const cf_conv_geom *g, const float *col, size_t cols, float *x,
                           bool add) {
    const int ow = g->ow, oh = g->oh, w = g->w;
    const size_t plane = (size_t)g->h * w;
    __mmask16 tap[16]; /* input lanes fed by kernel column j */
    for (int j = 0; j < g->kw; j++) {
        int lo, hi;
        cf_conv_valid_cols(g, j, &lo, &hi);
        const int off = j - g->pw;
        tap[j] = lane_range(lo + off, hi + off) & lane_range(0, w);
    }
    const __mmask16 store = lane_range(0, w);
    for (int c = 0; c < g->c; c++) {
        const float *colc = col + (size_t)c * g->kh * g->kw * cols;
        float *xc = x + (size_t)c * plane;
        for (int iy = 0; iy < g->h; iy++) {
            __m512 acc = _mm512_setzero_ps();
            for (int i = 0; i < g->kh; i++) {
                const int oy = iy + g->ph - i;
                if (oy < 0 || oy >= oh) continue;
                const float *r = colc + (size_t)i * g->kw * cols + (size_t)oy * ow;
                for (int j = 0; j < g->kw; j++, r += cols) /* x[t] += r[t - off] */
                    acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(tap[j], r - (j - g->pw)));
            }
            float *xr = xc + (size_t)iy * w;
            if (add) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(store, xr));
            _mm512_mask_storeu_ps(xr, store, acc);
        }
    }
}

/* Any stride, input rows of at most 32 values and output rows of at most 16: as above, each
 * input row is summed in registers; a patch row segment (one output row) is spread over the
 * input lanes it feeds by a permutation made once per kernel column. */
static bool col2im_by_rows_any(const cf_conv_geom *g) {
    return g->w <= 32 && g->ow <= 16 && g->kw <= CF_MASK_TAPS;
}

static void col2im_rows_any(const cf_conv_geom *g, const float *col, size_t cols, float *x,
                            bool add) {
    const int ow = g->ow, oh = g->oh, w = g->w, sw = g->sw, sh = g->sh;
    const int nvec = (w + 15) / 16;
    const size_t plane = (size_t)g->h * w;
    __m512i idx[CF_MASK_TAPS][2];
    __mmask16 feed[CF_MASK_TAPS][2]; /* input lanes fed by kernel column j */
    for (int j = 0; j < g->kw; j++) {
        const int off = j - g->pw; /* input column of ox is ox*sw + off */
        for (int h = 0; h < 2; h++) {
            int lanes[16];
            unsigned bits = 0;
            for (int l = 0; l < 16; l++) {
                const int t = 16 * h + l, d = t - off;
                lanes[l] = 0;
                if (t < w && d >= 0 && d % sw == 0 && d / sw < ow) {
                    lanes[l] = d / sw;
                    bits |= 1u << l;
                }
            }
            idx[j][h] = _mm512_loadu_si512(lanes);
            feed[j][h] = (__mmask16)bits;
        }
    }
    const __mmask16 row_in = lane_range(0, ow);
    for (int c = 0; c < g->c; c++) {
        const float *colc = col + (size_t)c * g->kh * g->kw * cols;
        float *xc = x + (size_t)c * plane;
        for (int iy = 0; iy < g->h; iy++) {
            __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
            for (int i = 0; i < g->kh; i++) {
                const int t = iy + g->ph - i;
                if (t < 0 || t % sh) continue;
                const int oy = t / sh;
                if (oy >= oh) continue;
                const float *r = colc + (size_t)i * g->kw * cols + (size_t)oy * ow;
                for (int j = 0; j < g->kw; j++, r += cols) {
                    const __m512 v = _mm512_maskz_loadu_ps(row_in, r);
                    acc0 = _mm512_mask_add_ps(acc0, feed[j][0], acc0,
                                              _mm512_permutexvar_ps(idx[j][0], v));
                    if (nvec > 1)
                        acc1 = _mm512_mask_add_ps(acc1, feed[j][1], acc1,
                                                  _mm512_permutexvar_ps(idx[j][1], v));
                }
            }
            float *xr = xc + (size_t)iy * w;
            if (add) {
                acc0 = _mm512_add_ps(acc0, _mm512_maskz_loadu_ps(lane_range(0, w), xr));
                if (nvec > 1)
                    acc1 =
                        _mm512_add_ps(acc1, _mm512_maskz_loadu_ps(lane_range(0, w - 16), xr + 16));
            }
            _mm512_mask_storeu_ps(xr, lane_range(0, w), acc0);
            if (nvec > 1) _mm512_mask_storeu_ps(xr + 16, lane_range(0, w - 16), acc1);
        }
    }
}

/* Stride 1 with the output as large as the input (same padding): the output rows of a patch
 * row follow each other as the input rows do, so the whole patch row is the channel plane
 * shifted by (i - ph) rows and (j - pw) columns: one masked load and store per 16 values, the
 * masks (input column inside the row) made once per kernel column. */
#define CF_PLANE_CHUNKS 64

static bool im2col_by_planes(const cf_conv_geom *g) {
    return g->sw == 1 && g->sh == 1 && g->oh == g->h && g->ow == g->w && g->kw <= CF_MASK_TAPS &&
           (size_t)g->h * g->w <= 16 * CF_PLANE_CHUNKS;
}

/* The column masks of a geometry, kept per thread: a layer lowers its images one by one, and
 * making the masks costs about as much as a small image's lowering. */
typedef struct plane_masks {
    int w, h, kw, pw;
    __mmask16 m[CF_MASK_TAPS][CF_PLANE_CHUNKS];
} plane_masks;

static const plane_masks *get_plane_masks(const cf_conv_geom *g) {
    enum { SLOTS = 4 };
    static _Thread_local plane_masks cache[SLOTS];
    static _Thread_local int filled, next;
    for (int s = 0; s < filled; s++)
        if (cache[s].w == g->w && cache[s].h == g->h && cache[s].kw == g->kw &&
            cache[s].pw == g->pw)
            return &cache[s];
    plane_masks *pm = &cache[next];
    next = (next + 1) % SLOTS;
    if (filled < SLOTS) filled++;
    *pm = (plane_masks){.w = g->w, .h = g->h, .kw = g->kw, .pw = g->pw};
    const int w = g->w, P = g->h * g->w, chunks = (P + 15) / 16;
    for (int j = 0; j < g->kw; j++) {
        const int off = j - g->pw; /* input column = ox + off */
        for (int k = 0, ox = 0; k < chunks; k++) {
            unsigned bits = 0;
            for (int l = 0; l < 16 && 16 * k + l < P; l++) {
                if (ox + off >= 0 && ox + off < w) bits |= 1u << l;
                if (++ox == w) ox = 0;
            }
            pm->m[j][k] = (__mmask16)bits;
        }
    }
    return pm;
}

static void im2col_planes(const cf_conv_geom *g, const float *x, float *col, size_t cols) {
    const int w = g->w, P = g->h * g->w, chunks = (P + 15) / 16;
    const plane_masks *pm = get_plane_masks(g);
    const __mmask16 last = (__mmask16)(P % 16 ? (1u << (P % 16)) - 1u : 0xffffu);
    const size_t plane = (size_t)P;
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            int ylo, yhi;
            cf_conv_valid_rows(g, i, &ylo, &yhi);
            const int qlo = ylo * w, qhi = yhi * w; /* outputs whose input row exists */
            for (int j = 0; j < g->kw; j++) {
                float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                const float *src = xc + (ptrdiff_t)(i - g->ph) * w + (j - g->pw);
                for (int k = 0; k < chunks; k++) {
                    const int q0 = 16 * k;
                    const __mmask16 m = pm->m[j][k] & lane_range(qlo - q0, qhi - q0);
                    _mm512_mask_storeu_ps(row + q0, k == chunks - 1 ? last : (__mmask16)0xffff,
                                          _mm512_maskz_loadu_ps(m, src + q0));
                }
            }
        }
    }
}

static bool avx512_im2col(const cf_conv_geom *g, const float *x, float *col, int ldcol) {
    const int oh = g->oh, ow = g->ow, sw = g->sw, sh = g->sh;
    const size_t plane = (size_t)g->h * g->w, cols = (size_t)ldcol;
    if (im2col_by_planes(g)) {
        im2col_planes(g, x, col, cols);
        return true;
    }
    if (!vector_rows(g) || g->kw > CF_MASK_TAPS) return false;
    row_masks masks[CF_MASK_TAPS];
    for (int j = 0; j < g->kw; j++) {
        int lo, hi;
        cf_conv_valid_cols(g, j, &lo, &hi);
        make_masks(&masks[j], ow, j - g->pw, lo, hi, g->w);
    }
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            int ylo, yhi;
            cf_conv_valid_rows(g, i, &ylo, &yhi);
            for (int j = 0; j < g->kw; j++) {
                float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                const int off = j - g->pw; /* input column of ox is ox*sw + off */
                if (ylo > 0) memset(row, 0, (size_t)ylo * ow * sizeof(float));
                if (yhi < oh)
                    memset(row + (size_t)yhi * ow, 0, (size_t)(oh - yhi) * ow * sizeof(float));
                if (yhi <= ylo) continue;
                const float *x0 = xc + (size_t)(ylo * sh - g->ph + i) * g->w;
                im2col_rows_v(row + (size_t)ylo * ow, x0, (size_t)sh * g->w, yhi - ylo, ow, sw, off,
                              &masks[j]);
            }
        }
    }
    return true;
}

static bool avx512_col2im(const cf_conv_geom *g, const float *col, int ldcol, float *x, bool add) {
    const int ow = g->ow, sw = g->sw, sh = g->sh;
    const size_t plane = (size_t)g->h * g->w, cols = (size_t)ldcol;
    if (col2im_by_rows(g)) {
        col2im_rows_s1(g, col, cols, x, add);
        return true;
    }
    if (col2im_by_rows_any(g)) {
        col2im_rows_any(g, col, cols, x, add);
        return true;
    }
    if (!vector_rows(g) || g->kw > CF_MASK_TAPS) return false;
    row_masks masks[CF_MASK_TAPS];
    for (int j = 0; j < g->kw; j++) {
        int lo, hi;
        cf_conv_valid_cols(g, j, &lo, &hi);
        make_masks(&masks[j], ow, j - g->pw, lo, hi, g->w);
    }
    if (!add) memset(x, 0, (size_t)g->c * plane * sizeof(float));
    for (int c = 0; c < g->c; c++) {
        float *xc = x + c * plane;
        for (int i = 0; i < g->kh; i++) {
            int ylo, yhi;
            cf_conv_valid_rows(g, i, &ylo, &yhi);
            if (yhi <= ylo) continue;
            for (int j = 0; j < g->kw; j++) {
                const float *row = col + ((size_t)(c * g->kh + i) * g->kw + j) * cols;
                float *x0 = xc + (size_t)(ylo * sh - g->ph + i) * g->w;
                col2im_rows_v(x0, row + (size_t)ylo * ow, (size_t)sh * g->w, yhi - ylo, ow, sw,
                              j - g->pw, &masks[j]);
            }
        }
    }
    return true;
}

/* ---- stride 2's phase planes ---------------------------------------------------------------- */

/* Lanes [0, n) of a vector, n clamped to 0..16. */
static inline __mmask16 first_lanes(int n) {
    return (__mmask16)(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1u);
}

/* ---- pooling -------------------------------------------------------------------------------- */

/* AdaptiveConcatPool2d on one plane: the maximum, its first index and the sum, 16 lanes at a
 * time. Returns false, leaving the plane to the scalar loop, when the plane holds a NaN (which
 * must win the maximum at its first position). */
static bool avx512_max_sum_plane(const float *x, size_t n, float *best, int32_t *arg, float *sum) {
    __m512 mx = _mm512_set1_ps(-INFINITY), s = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return false;
        mx = _mm512_max_ps(mx, v);
        s = _mm512_add_ps(s, v);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        if (_mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q)) return false;
        mx = _mm512_mask_max_ps(mx, m, mx, v);
        s = _mm512_add_ps(s, v);
    }
    const float b = _mm512_reduce_max_ps(mx);
    const __m512 bv = _mm512_set1_ps(b);
    size_t k = 0; /* the first position of the maximum: the first vector holding it, then */
    while (k + 16 <= n && !_mm512_cmp_ps_mask(_mm512_loadu_ps(x + k), bv, _CMP_EQ_OQ)) k += 16;
    while (x[k] != b) k++;
    *best = b;
    *arg = (int32_t)k;
    *sum = _mm512_reduce_add_ps(s);
    return true;
}

/* ---- MaxPool2d(2) ---------------------------------------------------------------------------- */

/* Vectors of 16 outputs, as the AVX2 kernel. */
static void avx512_max_pool_2x2(const float *x, int h, int w, float *y, int32_t *idx) {
    const int oh = h / 2, ow = w / 2;
    const __m512i lane2 =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        for (int ox0 = 0; ox0 < ow; ox0 += 16) {
            const int n_in = 2 * (ow - ox0), n_out = ow - ox0;
            const __mmask16 m_lo = (__mmask16)simd_first_lanes(n_in),
                            m_hi = (__mmask16)simd_first_lanes(n_in - 16),
                            m_out = (__mmask16)simd_first_lanes(n_out);
            __m512 v[4];
            V_UNZIP(_mm512_maskz_loadu_ps(m_lo, r0 + 2 * ox0),
                    _mm512_maskz_loadu_ps(m_hi, r0 + 2 * ox0 + 16), v[0], v[1]);
            V_UNZIP(_mm512_maskz_loadu_ps(m_lo, r1 + 2 * ox0),
                    _mm512_maskz_loadu_ps(m_hi, r1 + 2 * ox0 + 16), v[2], v[3]);
            const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(2 * oy * w + 2 * ox0), lane2);
            const int off[4] = {0, 1, w, w + 1};
            __m512 best = v[0];
            __m512i arg = at;
            for (int i = 1; i < 4; i++) {
                const __mmask16 take = _mm512_cmp_ps_mask(v[i], best, _CMP_GT_OQ) |
                                       _mm512_cmp_ps_mask(v[i], v[i], _CMP_UNORD_Q);
                best = _mm512_mask_mov_ps(best, take, v[i]);
                arg = _mm512_mask_add_epi32(arg, take, at, _mm512_set1_epi32(off[i]));
            }
            _mm512_mask_storeu_ps(y + (size_t)oy * ow + ox0, m_out, best);
            _mm512_mask_storeu_epi32(idx + (size_t)oy * ow + ox0, m_out, arg);
        }
    }
}

/* ---- MaxPool2d(3, stride 2) ------------------------------------------------------------------ */

/* Vectors of 16 outputs: a window row's three taps are the even and odd lanes of the row from the
 * first window's first column and the even lanes from two columns on; the taps are taken in
 * cf_max_pool_3x3_s2_row's order, each replacing the best where greater or NaN. */
static void avx512_max_pool_3x3_s2_row(const float *x, int w, int y0, int rows, int pad, int ox0,
                                       int ox1, float *y, int32_t *idx) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int ox = ox0; ox < ox1; ox += 16) {
        const int n = ox1 - ox, c0 = 2 * ox - pad;
        /* columns c0 .. c0 + 2n (the last output's third), all inside the row */
        const __mmask16 m_lo = (__mmask16)simd_first_lanes(2 * n),
                        m_hi = (__mmask16)simd_first_lanes(2 * n - 16),
                        m2_lo = (__mmask16)simd_first_lanes(2 * n - 1),
                        m2_hi = (__mmask16)simd_first_lanes(2 * n - 17),
                        m_out = (__mmask16)simd_first_lanes(n);
        const __m512i base = _mm512_add_epi32(_mm512_set1_epi32(y0 * w + c0), ev);
        __m512 best = _mm512_setzero_ps();
        __m512i arg = base;
        /* the input rows 8 output rows on (the next plane's past the end; a prefetch does
         * not fault): the pass reads a batch's planes from memory, and a profile of W3's stem
         * pool put most samples on the loads */
        const uintptr_t ahead = (uintptr_t)(x + (size_t)(y0 + 16) * w + c0);
        for (int r = 0; r < 2; r++)
            for (int l = 0; l <= 2 * 16; l += 16)
                _mm_prefetch((const char *)(ahead + ((size_t)r * w + l) * sizeof(float)),
                             _MM_HINT_T0);
        for (int r = 0; r < rows; r++) {
            const float *row = x + (size_t)(y0 + r) * w + c0;
            const __m512 a = _mm512_maskz_loadu_ps(m_lo, row),
                         b = _mm512_maskz_loadu_ps(m_hi, row + 16),
                         a2 = _mm512_maskz_loadu_ps(m2_lo, row + 2),
                         b2 = _mm512_maskz_loadu_ps(m2_hi, row + 18);
            const __m512 v[3] = {_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b),
                                 _mm512_permutex2var_ps(a2, ev, b2)};
            for (int c = 0; c < 3; c++) {
                if (r == 0 && c == 0) { /* the first tap is taken whatever it holds */
                    best = v[0];
                    continue;
                }
                const __mmask16 take = _mm512_cmp_ps_mask(v[c], best, _CMP_GT_OQ) |
                                       _mm512_cmp_ps_mask(v[c], v[c], _CMP_UNORD_Q);
                best = _mm512_mask_mov_ps(best, take, v[c]);
                arg = _mm512_mask_add_epi32(arg, take, base, _mm512_set1_epi32(r * w + c));
            }
        }
        _mm512_mask_storeu_ps(y + ox, m_out, best);
        _mm512_mask_storeu_epi32(idx + ox, m_out, arg);
    }
}

/* The backward as gathers: 32 columns of an input row at a time, the even and odd columns as two
 * vectors of 16. A column ix with ix + pad odd lies in one window of an output row (ox = (ix + pad
 * - 1) / 2), one with ix + pad even in two ((ix + pad) / 2 - 1 and (ix + pad) / 2), and a row in
 * those of at most two output rows; each column adds, from +0, the gradients of those outputs
 * whose index is its position, in output order: what the zeroing and the scatter in output order
 * add to it. */
static void avx512_max_pool_3x3_s2_backward(const float *dy, const int32_t *idx, int h, int w,
                                            int pad, float *dx, bool stream) {
    const int oh = (h + 2 * pad - 3) / 2 + 1, ow = (w + 2 * pad - 3) / 2 + 1;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lane2 = _mm512_add_epi32(lane, lane);
    const __m512i zip_lo =
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i zip_hi = _mm512_add_epi32(zip_lo, _mm512_set1_epi32(8));
    bool streamed = false;
    for (int iy = 0; iy < h; iy++) {
        int oy0, oy1;
        simd_pool3_rows_of(iy, pad, oh, &oy0, &oy1);
        float *dr = dx + (size_t)iy * w;
        for (int ix0 = 0; ix0 < w; ix0 += 32) {
            const int b = ix0 / 2;
            /* lanes t: outputs b + t + k (k = -1, 0, 1) that exist */
            __mmask16 ok[3];
            for (int k = -1; k <= 1; k++)
                ok[k + 1] = (__mmask16)(simd_first_lanes(ow - b - k) & ~simd_first_lanes(-b - k));
            /* column ix0 + 2t + pad is in two windows (E), ix0 + 2t + 1 - pad in one (O) */
            const __m512i col = _mm512_add_epi32(_mm512_set1_epi32(iy * w + ix0), lane2);
            const __m512i pos_e = _mm512_add_epi32(col, _mm512_set1_epi32(pad)),
                          pos_o = _mm512_add_epi32(col, _mm512_set1_epi32(1 - pad));
            __m512 e = _mm512_setzero_ps(), o = _mm512_setzero_ps();
            /* dy's and idx's rows 8 output rows on (see the forward) */
            const size_t far = (size_t)(oy1 + 8) * ow + b;
            _mm_prefetch((const char *)((uintptr_t)dy + far * sizeof(float)), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)idx + far * sizeof(int32_t)), _MM_HINT_T0);
            for (int oy = oy0; oy <= oy1; oy++) {
                const size_t at = (size_t)oy * ow + b;
                /* E's two windows, left first; O's is the one at k = 0 */
                for (int k = pad - 1; k <= pad; k++) {
                    const __mmask16 m = ok[k + 1];
                    const __m512i ik = _mm512_maskz_loadu_epi32(m, idx + at + k);
                    const __m512 dk = _mm512_maskz_loadu_ps(m, dy + at + k);
                    e = _mm512_mask_add_ps(e, _mm512_mask_cmpeq_epi32_mask(m, ik, pos_e), e, dk);
                    if (k == 0)
                        o = _mm512_mask_add_ps(o, _mm512_mask_cmpeq_epi32_mask(m, ik, pos_o), o,
                                               dk);
                }
            }
            /* columns in order: pad 0 (E, O), pad 1 (O, E) */
            const __m512 first = pad ? o : e, second = pad ? e : o;
            const __m512 lo = _mm512_permutex2var_ps(first, zip_lo, second),
                         hi = _mm512_permutex2var_ps(first, zip_hi, second);
            float *p = dr + ix0;
            if (stream && ix0 + 32 <= w && (uintptr_t)p % 64 == 0) {
                _mm512_stream_ps(p, lo);
                _mm512_stream_ps(p + 16, hi);
                streamed = true;
            } else {
                _mm512_mask_storeu_ps(p, (__mmask16)simd_first_lanes(w - ix0), lo);
                _mm512_mask_storeu_ps(p + 16, (__mmask16)simd_first_lanes(w - ix0 - 16), hi);
            }
        }
    }
    if (streamed) _mm_sfence();
}

const cf_kernel_table cf_kernels_avx512 = {
    .isa = CF_ISA_AVX512,
    .sgemm_strided = simd_sgemm_strided,
    .transpose = avx512_transpose,
    .im2col = avx512_im2col,
    .col2im = avx512_col2im,
    .implicit_run = simd_implicit_run,
    .implicit_wgrad = simd_implicit_wgrad,
    .split_phases = simd_split_phases,
    .merge_phases = simd_merge_phases,
    .stem_forward = simd_stem_forward,
    .stem_wgrad = simd_stem_wgrad,
    .stem_pays = true,
    .bn = &simd_bn_kernels,
    .max_sum_plane = avx512_max_sum_plane,
    .dropout_keyed_row = loops_dropout_keyed_row,
    .optim = &loops_optim,
    .wino = &loops_wino,
    .max_pool_2x2 = avx512_max_pool_2x2,
    .max_pool_3x3_s2_row = avx512_max_pool_3x3_s2_row,
    .max_pool_3x3_s2_backward = avx512_max_pool_3x3_s2_backward,
    .lstm = &loops_lstm,
    .softmax = &loops_softmax,
    .grid_sample = &loops_grid_sample,
    .packed_gemm = &simd_packed_gemm,
};
#endif
