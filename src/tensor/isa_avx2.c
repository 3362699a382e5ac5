/* The AVX2 kernels (AVX2 + FMA): the shared register-blocked kernels of simd_kernels.h over
 * 8-float ymm vectors, with tiles of 4 rows x 3 vectors (12 accumulators of the 16 registers).
 * Lane masks are vectors here: AVX2's masked loads and stores take one int32 per lane (a
 * masked-out lane never touches memory, as with AVX-512's masks). Compiled with these
 * instruction sets whatever the build's baseline; used only when the CPU reports them (isa.c). */
#if defined(__x86_64__)
#include "tensor/kernel_table.h"

#include <immintrin.h>
#include <math.h>

#define VL 8
#define VMASK_ALL 0xffu
#define MR 4
#define NV_MAX 3
typedef __m256 vf;
typedef __m256i vmaskv;

static inline __m256i avx2_lane_mask(unsigned bits) { /* bit i -> lane i all ones */
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), lane_bit), lane_bit);
}

#define V_MASKV(bits) avx2_lane_mask(bits)
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps((p), (v))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_LOADZ(mv, p) _mm256_maskload_ps((p), (mv))
/* src is 0 in mv's lanes: an OR, which needs no mask register beside the load's own (a blend's
 * mask operand would keep one more of the 16 registers busy and spill an accumulator) */
#define V_LOADM(src, mv, p) _mm256_or_ps((src), _mm256_maskload_ps((p), (mv)))
#define V_STOREM(p, mv, v) _mm256_maskstore_ps((p), (mv), (v))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_ZMASK(mv, v) _mm256_and_ps((v), _mm256_castsi256_ps(mv))
#define V_GT0(v) _mm256_castps_si256(_mm256_cmp_ps((v), _mm256_setzero_ps(), _CMP_GT_OQ))
#define V_MASK_AND(a, b) _mm256_and_si256((a), (b))
#define V_MASK_BITS(mv) ((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(mv)))

static inline double avx2_hsum_d(__m256 v) {
    const __m256d s = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                                    _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
#define V_HSUM_D(v) avx2_hsum_d(v)
#define V_STREAM(p, v) _mm256_stream_ps((p), (v)) /* p 32-byte aligned */
#define V_SFENCE() _mm_sfence()
/* lo = a0 b0 a1 b1 a2 b2 a3 b3, hi = a4 b4 ... a7 b7 */
#define V_ZIP(a, b, lo, hi)                                                                        \
    do {                                                                                           \
        const __m256 zip_l_ = _mm256_unpacklo_ps((a), (b)), zip_h_ = _mm256_unpackhi_ps((a), (b)); \
        (lo) = _mm256_permute2f128_ps(zip_l_, zip_h_, 0x20);                                       \
        (hi) = _mm256_permute2f128_ps(zip_l_, zip_h_, 0x31);                                       \
    } while (0)
/* ev = a0 a2 a4 a6 b0 b2 b4 b6, od = a1 a3 ... b7 */
#define V_UNZIP(a, b, ev, od)                                                                      \
    do {                                                                                           \
        const __m256 unzip_a_ = (a), unzip_b_ = (b);                                               \
        (ev) = _mm256_castpd_ps(_mm256_permute4x64_pd(                                             \
            _mm256_castps_pd(_mm256_shuffle_ps(unzip_a_, unzip_b_, 0x88)), 0xd8));                 \
        (od) = _mm256_castpd_ps(_mm256_permute4x64_pd(                                             \
            _mm256_castps_pd(_mm256_shuffle_ps(unzip_a_, unzip_b_, 0xdd)), 0xd8));                 \
    } while (0)
#include "tensor/optim_loops.h"
#include "tensor/dropout_loops.h"
#include "tensor/lstm_loops.h"
#include "tensor/grid_sample_loops.h"
#include "tensor/softmax_loops.h"
/* the lanes' sum as simd_sgemm_nt takes it (the stem's lowered weight gradient at this level) */
#define V_STEM_SUM(v) ((float)avx2_hsum_d(v))
#include "tensor/simd_kernels.h"
/* cf_conv_winograd_pays: bench_conv on W1 and W2 */
#define WINO_SHORT_ROW_COST 140
#include "tensor/winograd_loops.h"
#include "tensor/lstm_gemm_loops.h"

/* ---- transpose ------------------------------------------------------------------------------ */

/* t[j] lane i = r[i] lane j: one 8x8 block transposed in registers (r is clobbered). */
static inline void transpose8_regs(__m256 r[8], __m256 t[8]) {
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
}

/* dst[j * ldd + i] = src[i * lds + j] for one 8x8 block in registers. */
static inline void transpose8(const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    transpose8_regs(r, t);
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + i * ldd, t[i]);
}

static void avx2_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                           ptrdiff_t ldd) {
    int j0 = 0;
    for (; j0 + 8 <= cols; j0 += 8) {
        int i0 = 0;
        for (; i0 + 8 <= rows; i0 += 8)
            transpose8(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
        for (int j = j0; j < j0 + 8; j++) /* rows past the last block of 8 */
            for (int i = i0; i < rows; i++) dst[j * ldd + i] = src[i * lds + j];
    }
    if (j0 == cols) return;
    /* the last cols - j0 < 8 columns: blocks of 8 rows read with masked loads, the block's first
     * cols - j0 rows of the transpose stored (a 7x7 plane's rows are all such columns) */
    const int n = cols - j0;
    const __m256i m = avx2_lane_mask(simd_first_lanes(n));
    int i0 = 0;
    for (; i0 + 8 <= rows; i0 += 8) {
        __m256 r[8], t[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_maskload_ps(src + (i0 + i) * lds + j0, m);
        transpose8_regs(r, t);
        for (int j = 0; j < n; j++) _mm256_storeu_ps(dst + (j0 + j) * ldd + i0, t[j]);
    }
    for (int j = j0; j < cols; j++) /* and the rows past the last block of 8 */
        for (int i = i0; i < rows; i++) dst[j * ldd + i] = src[i * lds + j];
}

/* ---- cf_sgemm_strided ------------------------------------------------------------------------ */

/* AVX2 has 16 ymm registers, and a core with two 256-bit FMA pipes and two 256-bit loads a cycle
 * (Zen 4, recent Intel) keeps its FMAs busy only with at most one load per FMA. The shared 4 x 3
 * tile of simd_kernels.h would need all 16 registers (12 accumulators, 3 B vectors, the
 * broadcast), and GCC folds B's loads into the FMAs instead, up to 13 loads per 12 FMAs. Tiles
 * of 6 rows x 2 vectors use 15 (12 accumulators, 2 B vectors, the broadcast): 8 loads per 12
 * FMAs. Their 16 columns also fit the Winograd GEMMs' column counts
 * (multiples of 16), which the 24-column tiles cut into a full and a two-vector tile.
 *
 * Each element of C is the same chain of FMAs in the order of k (then + C when accumulating) as
 * with the shared tile, so results are bitwise those of simd_sgemm_strided: only the tile shape
 * and the loop order differ. The columns are taken in chunks whose block of B (k x chunk) stays
 * in L2; within a chunk the row tiles run outermost, so each tile's rows of A are read from L1
 * across the chunk's column tiles and A is read once per chunk. (The Winograd GEMMs' B, 16 KiB
 * at most a point, is one chunk: their weights stream through once.) */
enum {
    G_MR = 6,              /* rows of a tile */
    G_NV = 2,              /* vectors of a tile */
    G_CHUNK_FLOATS = 32768 /* of B per column chunk (128 KiB) */
};

/* One row of a tile into C: its nv vectors (the last one masked by last), + C when
 * accumulating. */
CF_INLINE void g_store_row(float *cp, int nv, __m256 r0, __m256 r1, unsigned last,
                           bool accumulate) {
    const unsigned m0 = nv == 1 ? last : VMASK_ALL;
    if (accumulate) r0 = _mm256_add_ps(r0, V_LOADZ(V_MASKV(m0), cp));
    simd_store(cp, m0, r0);
    if (nv == 2) {
        if (accumulate) r1 = _mm256_add_ps(r1, V_LOADZ(V_MASKV(last), cp + VL));
        simd_store(cp + VL, last, r1);
    }
}

/* The accumulators are named variables: held in an array, GCC stored them all to the stack on
 * every step of the loop. */
#define G_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
CF_INLINE void g_tile(int mr, int nv, bool masked, int k, const float *a, ptrdiff_t a_row,
                      ptrdiff_t a_col, const float *b, int ldb, float *c, int ldc, unsigned last,
                      bool accumulate) {
#define G_DECL(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps();
    G_ROWS(G_DECL)
#undef G_DECL
    const __m256i lastv = avx2_lane_mask(last);
    for (int p = 0; p < k; p++) {
        const float *bp = b + (size_t)p * ldb;
        __m256 b0, b1 = _mm256_setzero_ps();
        if (nv == 2) {
            b0 = _mm256_loadu_ps(bp);
            b1 = masked ? _mm256_maskload_ps(bp + VL, lastv) : _mm256_loadu_ps(bp + VL);
        } else {
            b0 = masked ? _mm256_maskload_ps(bp, lastv) : _mm256_loadu_ps(bp);
        }
        const float *ap = a + p * a_col;
#define G_FMA(i)                                                                                   \
    if (mr > i) {                                                                                  \
        const __m256 av = _mm256_broadcast_ss(ap + i * a_row);                                     \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                                                \
        if (nv == 2) c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);                                   \
    }
        G_ROWS(G_FMA)
#undef G_FMA
    }
#define G_STORE(i)                                                                                 \
    if (mr > i) g_store_row(c + (size_t)i * ldc, nv, c##i##0, c##i##1, last, accumulate);
    G_ROWS(G_STORE)
#undef G_STORE
}
#undef G_ROWS

typedef void (*g_tile_fn)(int k, const float *a, ptrdiff_t a_row, ptrdiff_t a_col, const float *b,
                          int ldb, float *c, int ldc, unsigned last, bool accumulate);

/* One function per tile shape (rows, vectors, a masked last vector or not), each with its loops
 * unrolled for its constants. */
#define G_TILE_FN(mr, nv, masked)                                                                  \
    static __attribute__((noinline)) void g_tile_##mr##_##nv##_##masked(                           \
        int k, const float *a, ptrdiff_t a_row, ptrdiff_t a_col, const float *b, int ldb,          \
        float *c, int ldc, unsigned last, bool accumulate) {                                       \
        g_tile(mr, nv, masked, k, a, a_row, a_col, b, ldb, c, ldc, last, accumulate);              \
    }
#define G_TILE_FNS(mr)                                                                             \
    G_TILE_FN(mr, 1, 0) G_TILE_FN(mr, 1, 1) G_TILE_FN(mr, 2, 0) G_TILE_FN(mr, 2, 1)
G_TILE_FNS(1)
G_TILE_FNS(2)
G_TILE_FNS(3)
G_TILE_FNS(4)
G_TILE_FNS(5)
G_TILE_FNS(6)
#undef G_TILE_FNS
#undef G_TILE_FN

/* [masked][vectors - 1][rows - 1] */
#define G_ROW(nv, masked)                                                                          \
    {                                                                                              \
        g_tile_1_##nv##_##masked, g_tile_2_##nv##_##masked, g_tile_3_##nv##_##masked,              \
            g_tile_4_##nv##_##masked, g_tile_5_##nv##_##masked, g_tile_6_##nv##_##masked           \
    }
static const g_tile_fn g_tiles[2][G_NV][G_MR] = {{G_ROW(1, 0), G_ROW(2, 0)},
                                                 {G_ROW(1, 1), G_ROW(2, 1)}};
#undef G_ROW

/* B's rows lie ldb floats apart; from G_PACK_LDB floats (1 KiB and more, e.g. a 1x1
 * convolution's image planes, 4 KiB for 32 x 32) a tile's rows fall into few L1 sets and evict
 * one another, so B's chunk is first copied into panels of G_NV vectors, each k rows of 16
 * floats back to back (zeros past n), which the tiles then read in order. */
enum { G_PACK_LDB = 256 };
static _Thread_local _Alignas(64) float g_pack[G_CHUNK_FLOATS];

/* The chunk of vectors [c0, c1) of B's k rows into g_pack's panels. */
static void g_pack_chunk(int n, int k, const float *b, int ldb, int c0, int c1) {
    for (int v = c0, j = 0; v < c1; v += G_NV, j++) {
        const int left = n - VL * v; /* columns of the panel: 16, or fewer in the last */
        const __m256i m0 = avx2_lane_mask(simd_first_lanes(left)),
                      m1 = avx2_lane_mask(simd_first_lanes(left - VL));
        const float *src = b + VL * v;
        float *dst = g_pack + (size_t)j * k * G_NV * VL;
        if (left >= G_NV * VL)
            for (int p = 0; p < k; p++) {
                _mm256_store_ps(dst + p * G_NV * VL, _mm256_loadu_ps(src + (size_t)p * ldb));
                _mm256_store_ps(dst + p * G_NV * VL + VL,
                                _mm256_loadu_ps(src + (size_t)p * ldb + VL));
            }
        else
            for (int p = 0; p < k; p++) {
                _mm256_store_ps(dst + p * G_NV * VL, _mm256_maskload_ps(src + (size_t)p * ldb, m0));
                _mm256_store_ps(dst + p * G_NV * VL + VL,
                                _mm256_maskload_ps(src + (size_t)p * ldb + VL, m1));
            }
    }
}

static bool avx2_sgemm_strided(int m, int n, int k, const float *a, ptrdiff_t a_row,
                               ptrdiff_t a_col, const float *b, int ldb, float *c, int ldc,
                               bool accumulate) {
    /* as simd_sgemm_strided: one vector of columns and few rows go to OpenBLAS */
    if (!(n > VL || m >= 2 * MR)) return false;
    const int vectors = (n + VL - 1) / VL;
    int chunk = (int)(G_CHUNK_FLOATS / ((long)k * VL)) / G_NV * G_NV; /* vectors, whole tiles */
    if (chunk < G_NV) chunk = G_NV;
    /* packing pays when more rows than an L1 set has ways (8) collide and at least 4 row tiles
     * read the copy (W1's stem, 16 x 784 x 9, ran 13% slower packed) */
    const bool pack =
        ldb >= G_PACK_LDB && k > 8 && m >= 4 * G_MR && (long)k * chunk * VL <= G_CHUNK_FLOATS;
    for (int c0 = 0; c0 < vectors; c0 += chunk) {
        const int c1 = vectors - c0 < chunk ? vectors : c0 + chunk;
        if (pack) g_pack_chunk(n, k, b, ldb, c0, c1);
        for (int m0 = 0; m0 < m; m0 += G_MR) {
            const int mr = m - m0 < G_MR ? m - m0 : G_MR;
            const float *ap = a + m0 * a_row;
            for (int v0 = c0, nv; v0 < c1; v0 += nv) {
                nv = c1 - v0 < G_NV ? c1 - v0 : G_NV;
                const unsigned last = simd_first_lanes(n - VL * (v0 + nv - 1));
                float *cp = c + (size_t)m0 * ldc + VL * v0;
                if (pack) /* the panel's zeros stand for the masked lanes: plain loads */
                    g_tiles[0][nv - 1][mr - 1](k, ap, a_row, a_col,
                                               g_pack + (size_t)(v0 - c0) / G_NV * k * G_NV * VL,
                                               G_NV * VL, cp, ldc, last, accumulate);
                else
                    g_tiles[last != VMASK_ALL][nv - 1][mr - 1](k, ap, a_row, a_col, b + VL * v0,
                                                               ldb, cp, ldc, last, accumulate);
            }
        }
    }
    return true;
}

/* ---- MaxPool2d(2) ---------------------------------------------------------------------------- */

/* Vectors of 8 outputs: the window's four values are the even and odd lanes of two input rows;
 * each later value replaces the best where it is greater or NaN, as the scalar loop. */
static void avx2_max_pool_2x2(const float *x, int h, int w, float *y, int32_t *idx) {
    const int oh = h / 2, ow = w / 2;
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        for (int ox0 = 0; ox0 < ow; ox0 += 8) {
            const int n_in = 2 * (ow - ox0), n_out = ow - ox0;
            const __m256i m_lo = avx2_lane_mask(simd_first_lanes(n_in)),
                          m_hi = avx2_lane_mask(simd_first_lanes(n_in - 8)),
                          m_out = avx2_lane_mask(simd_first_lanes(n_out));
            __m256 v[4];
            V_UNZIP(_mm256_maskload_ps(r0 + 2 * ox0, m_lo),
                    _mm256_maskload_ps(r0 + 2 * ox0 + 8, m_hi), v[0], v[1]);
            V_UNZIP(_mm256_maskload_ps(r1 + 2 * ox0, m_lo),
                    _mm256_maskload_ps(r1 + 2 * ox0 + 8, m_hi), v[2], v[3]);
            const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(2 * oy * w + 2 * ox0), lane2);
            const int off[4] = {0, 1, w, w + 1};
            __m256 best = v[0], arg = _mm256_castsi256_ps(at);
            for (int i = 1; i < 4; i++) {
                const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v[i], best, _CMP_GT_OQ),
                                                 _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
                best = _mm256_blendv_ps(best, v[i], take);
                arg = _mm256_blendv_ps(
                    arg, _mm256_castsi256_ps(_mm256_add_epi32(at, _mm256_set1_epi32(off[i]))),
                    take);
            }
            _mm256_maskstore_ps(y + (size_t)oy * ow + ox0, m_out, best);
            _mm256_maskstore_ps((float *)(idx + (size_t)oy * ow + ox0), m_out, arg);
        }
    }
}

/* ---- MaxPool2d(3, stride 2) ------------------------------------------------------------------ */

/* Vectors of 8 outputs, as the AVX-512 kernel: a window row's taps are the even and odd lanes of
 * the row from the first window's first column and the even lanes from two columns on. */
static void avx2_max_pool_3x3_s2_row(const float *x, int w, int y0, int rows, int pad, int ox0,
                                     int ox1, float *y, int32_t *idx) {
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int ox = ox0; ox < ox1; ox += 8) {
        const int n = ox1 - ox, c0 = 2 * ox - pad;
        /* columns c0 .. c0 + 2n (the last output's third), all inside the row */
        const __m256i m_lo = avx2_lane_mask(simd_first_lanes(2 * n)),
                      m_hi = avx2_lane_mask(simd_first_lanes(2 * n - 8)),
                      m2_lo = avx2_lane_mask(simd_first_lanes(2 * n - 1)),
                      m2_hi = avx2_lane_mask(simd_first_lanes(2 * n - 9)),
                      m_out = avx2_lane_mask(simd_first_lanes(n));
        const __m256i base = _mm256_add_epi32(_mm256_set1_epi32(y0 * w + c0), lane2);
        __m256 best = _mm256_setzero_ps(), arg = _mm256_castsi256_ps(base);
        /* the input rows 8 output rows on (the next plane's past the end; a prefetch does
         * not fault): the pass reads a batch's planes from memory, and a profile of W3's stem
         * pool put most samples on the loads */
        const uintptr_t ahead = (uintptr_t)(x + (size_t)(y0 + 16) * w + c0);
        for (int r = 0; r < 2; r++)
            for (int l = 0; l <= 2 * 8; l += 16)
                _mm_prefetch((const char *)(ahead + ((size_t)r * w + l) * sizeof(float)),
                             _MM_HINT_T0);
        for (int r = 0; r < rows; r++) {
            const float *row = x + (size_t)(y0 + r) * w + c0;
            __m256 v[3], unused;
            V_UNZIP(_mm256_maskload_ps(row, m_lo), _mm256_maskload_ps(row + 8, m_hi), v[0], v[1]);
            V_UNZIP(_mm256_maskload_ps(row + 2, m2_lo), _mm256_maskload_ps(row + 10, m2_hi), v[2],
                    unused);
            (void)unused;
            for (int c = 0; c < 3; c++) {
                if (r == 0 && c == 0) { /* the first tap is taken whatever it holds */
                    best = v[0];
                    continue;
                }
                const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v[c], best, _CMP_GT_OQ),
                                                 _mm256_cmp_ps(v[c], v[c], _CMP_UNORD_Q));
                best = _mm256_blendv_ps(best, v[c], take);
                arg = _mm256_blendv_ps(
                    arg, _mm256_castsi256_ps(_mm256_add_epi32(base, _mm256_set1_epi32(r * w + c))),
                    take);
            }
        }
        _mm256_maskstore_ps(y + ox, m_out, best);
        _mm256_maskstore_ps((float *)(idx + ox), m_out, arg);
    }
}

/* The backward as gathers, 16 columns of an input row at a time (see the AVX-512 kernel). */
static void avx2_max_pool_3x3_s2_backward(const float *dy, const int32_t *idx, int h, int w,
                                          int pad, float *dx, bool stream) {
    const int oh = (h + 2 * pad - 3) / 2 + 1, ow = (w + 2 * pad - 3) / 2 + 1;
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    bool streamed = false;
    for (int iy = 0; iy < h; iy++) {
        int oy0, oy1;
        simd_pool3_rows_of(iy, pad, oh, &oy0, &oy1);
        float *dr = dx + (size_t)iy * w;
        for (int ix0 = 0; ix0 < w; ix0 += 16) {
            const int b = ix0 / 2;
            /* lanes t: outputs b + t + k (k = -1, 0, 1) that exist */
            __m256i ok[3];
            for (int k = -1; k <= 1; k++)
                ok[k + 1] =
                    avx2_lane_mask(simd_first_lanes(ow - b - k) & ~simd_first_lanes(-b - k));
            /* column ix0 + 2t + pad is in two windows (E), ix0 + 2t + 1 - pad in one (O) */
            const __m256i col = _mm256_add_epi32(_mm256_set1_epi32(iy * w + ix0), lane2);
            const __m256i pos_e = _mm256_add_epi32(col, _mm256_set1_epi32(pad)),
                          pos_o = _mm256_add_epi32(col, _mm256_set1_epi32(1 - pad));
            __m256 e = _mm256_setzero_ps(), o = _mm256_setzero_ps();
            /* dy's and idx's rows 8 output rows on (see the forward) */
            const size_t far = (size_t)(oy1 + 8) * ow + b;
            _mm_prefetch((const char *)((uintptr_t)dy + far * sizeof(float)), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)idx + far * sizeof(int32_t)), _MM_HINT_T0);
            for (int oy = oy0; oy <= oy1; oy++) {
                const size_t at = (size_t)oy * ow + b;
                /* E's two windows, left first; O's is the one at k = 0 */
                for (int k = pad - 1; k <= pad; k++) {
                    const __m256i m = ok[k + 1];
                    const __m256i ik = _mm256_maskload_epi32(idx + at + k, m);
                    const __m256 dk = _mm256_maskload_ps(dy + at + k, m);
                    const __m256 te =
                        _mm256_castsi256_ps(_mm256_and_si256(m, _mm256_cmpeq_epi32(ik, pos_e)));
                    e = _mm256_blendv_ps(e, _mm256_add_ps(e, dk), te);
                    if (k == 0) {
                        const __m256 to =
                            _mm256_castsi256_ps(_mm256_and_si256(m, _mm256_cmpeq_epi32(ik, pos_o)));
                        o = _mm256_blendv_ps(o, _mm256_add_ps(o, dk), to);
                    }
                }
            }
            /* columns in order: pad 0 (E, O), pad 1 (O, E) */
            __m256 lo, hi;
            if (pad)
                V_ZIP(o, e, lo, hi);
            else
                V_ZIP(e, o, lo, hi);
            float *p = dr + ix0;
            if (stream && ix0 + 16 <= w && (uintptr_t)p % 32 == 0) {
                _mm256_stream_ps(p, lo);
                _mm256_stream_ps(p + 8, hi);
                streamed = true;
            } else {
                _mm256_maskstore_ps(p, avx2_lane_mask(simd_first_lanes(w - ix0)), lo);
                _mm256_maskstore_ps(p + 8, avx2_lane_mask(simd_first_lanes(w - ix0 - 8)), hi);
            }
        }
    }
    if (streamed) _mm_sfence();
}

/* ---- pooling -------------------------------------------------------------------------------- */

/* AdaptiveConcatPool2d on one plane: the maximum, its first index and the sum, 8 lanes at a
 * time and the last values one by one. Returns false, leaving the plane to the scalar loop,
 * when the plane holds a NaN (which must win the maximum at its first position). */
static bool avx2_max_sum_plane(const float *x, size_t n, float *best, int32_t *arg, float *sum) {
    __m256 mx = _mm256_set1_ps(-INFINITY), s = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) return false;
        mx = _mm256_max_ps(mx, v);
        s = _mm256_add_ps(s, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    float b = _mm_cvtss_f32(m4), t = _mm_cvtss_f32(s4);
    for (; i < n; i++) {
        if (isnan(x[i])) return false;
        if (x[i] > b) b = x[i];
        t += x[i];
    }
    const __m256 bv = _mm256_set1_ps(b);
    size_t k = 0; /* the first position of the maximum: the first vector holding it, then */
    while (k + 8 <= n && !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + k), bv, _CMP_EQ_OQ)))
        k += 8;
    while (x[k] != b) k++;
    *best = b;
    *arg = (int32_t)k;
    *sum = t;
    return true;
}

const cf_kernel_table cf_kernels_avx2 = {
    .isa = CF_ISA_AVX2,
    .sgemm_strided = avx2_sgemm_strided,
    .sgemm_nt = simd_sgemm_nt,
    .transpose = avx2_transpose,
    .implicit_run = simd_implicit_run,
    .implicit_wgrad = simd_implicit_wgrad,
    .split_phases = simd_split_phases,
    .merge_phases = simd_merge_phases,
    .stem_forward = simd_stem_forward,
    .stem_wgrad = simd_stem_wgrad,
    /* W1's stem, 64 images, CPU ms on the Zen 4 capped at AVX2: forward 0.35 against the lowered
     * product's 0.25, dW 0.31 against 0.26 (the masks and the weights' broadcasts cost more than
     * the patch matrix saves at 8 lanes) */
    .stem_pays = false,
    .bn = &simd_bn_kernels,
    .max_sum_plane = avx2_max_sum_plane,
    .dropout_keyed_row = loops_dropout_keyed_row,
    .optim = &loops_optim,
    .wino = &loops_wino,
    .max_pool_2x2 = avx2_max_pool_2x2,
    .max_pool_3x3_s2_row = avx2_max_pool_3x3_s2_row,
    .max_pool_3x3_s2_backward = avx2_max_pool_3x3_s2_backward,
    .lstm = &loops_lstm,
    .softmax = &loops_softmax,
    .grid_sample = &loops_grid_sample,
    .packed_gemm = &simd_packed_gemm,
};
#endif
