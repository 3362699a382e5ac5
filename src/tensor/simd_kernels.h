/* The register-blocked kernels shared by the vector instruction sets, written once over a small
 * vector vocabulary that the including file defines (isa_avx2.c, isa_avx512.c, isa_neon.c):
 *
 *   VL          floats per vector (4, 8 or 16)       MR, NV_MAX  tile: MR rows x NV_MAX vectors
 *   vf          a vector of VL floats                vmaskv      a lane mask, ready to use
 *   VMASK_ALL   the bits of all VL lanes             V_MASKV(b)  bits -> vmaskv
 *   V_ZERO() V_SET1(x) V_LOADU(p) V_STOREU(p, v) V_ADD(a, b) V_FMA(a, b, c) (a*b + c)
 *   V_LOADZ(mv, p)       lanes in mv from p, others 0 (masked-out lanes never touch memory)
 *   V_LOADM(src, mv, p)  lanes in mv from p, others from src (src is 0 in mv's lanes)
 *   V_STOREM(p, mv, v)   lanes in mv to p
 *   V_SUB(a, b) V_MAX(a, b) V_ZMASK(mv, v) (lanes outside mv zeroed) V_GT0(v) (mask of v > 0)
 *   V_MASK_AND(m1, m2) V_HSUM_D(v) (the lanes' sum, in double) V_MASK_BITS(mv) (mv -> bits)
 *   V_LOADZ_READABLE(mv, p)  V_LOADZ where all VL lanes at p may be read (optional: a set
 *                        without masked loads defines it as a plain load, then a lane select)
 *   V_STREAM(p, v) V_SFENCE()  a non-temporal store to p (aligned to a vector) and the fence
 *                        that orders such stores (optional: without them, plain stores)
 *   V_STORE_BF16(p, mv, v)  the lanes in mv of v as bf16 words at p, cf_fp32_to_bf16's
 *                        rounding (optional: without it, BatchNorm's dx in bf16 goes through fp32)
 *
 * The tile keeps MR x NV_MAX accumulators in registers: 8 x 3 zmm (24 of 32) with AVX-512,
 * 4 x 3 ymm (12 of 16) with AVX2, 8 x 3 q registers (24 of 32) with NEON. Each step of the
 * reduction loads the tile's B row (masked only where a lane must not be read) and broadcasts
 * MR values of A. Sums run in a fixed order whatever the thread, so results are reproducible
 * for a given instruction set. */
#ifndef COREFIT_SIMD_KERNELS_H
#define COREFIT_SIMD_KERNELS_H

#include "tensor/kernel_table.h"

#include <string.h>

_Static_assert(CF_PACK_ROWS % MR == 0, "the tile height must divide the packed block height");

#define CF_INLINE static inline __attribute__((always_inline))

#ifndef V_LOADZ_READABLE
#define V_LOADZ_READABLE(mv, p) V_LOADZ(mv, p)
#endif

/* The output rows [*first, *last] of MaxPool2d(3, stride 2, pad) (oh rows) whose windows hold
 * input row iy: the pooling backward gathers dx's row iy from them. */
static inline void simd_pool3_rows_of(int iy, int pad, int oh, int *first, int *last) {
    const int oy0 = (iy + pad - 1) >> 1, oy1 = (iy + pad) >> 1;
    *first = oy0 < 0 ? 0 : oy0;
    *last = oy1 > oh - 1 ? oh - 1 : oy1;
}

static inline unsigned simd_first_lanes(int n) { /* lanes [0, n) of a vector, n clamped */
    return n >= VL ? VMASK_ALL : n <= 0 ? 0u : (1u << n) - 1u;
}

/* Stores v to p, masked unless every lane is wanted. */
CF_INLINE void simd_store(float *p, unsigned mask, vf v) {
    if (mask == VMASK_ALL)
        V_STOREU(p, v);
    else
        V_STOREM(p, V_MASKV(mask), v);
}

/* ---- cf_sgemm_strided ---------------------------------------------------------------------- */

CF_INLINE void gemm_tile(int mr, int nv, bool masked, int k, const float *a, ptrdiff_t a_row,
                         ptrdiff_t a_col, const float *b, int ldb, float *c, int ldc, unsigned last,
                         bool accumulate) {
    vf acc[MR][NV_MAX];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV_MAX; v++) acc[i][v] = V_ZERO();
    const vmaskv lastv = V_MASKV(last);
    for (int p = 0; p < k; p++) {
        const float *bp = b + (size_t)p * ldb;
        vf bv[NV_MAX];
        for (int v = 0; v < nv; v++)
            bv[v] = masked && v == nv - 1 ? V_LOADZ(lastv, bp + VL * v) : V_LOADU(bp + VL * v);
        const float *ap = a + p * a_col;
        for (int i = 0; i < mr; i++) {
            const vf av = V_SET1(ap[i * a_row]);
            for (int v = 0; v < nv; v++) acc[i][v] = V_FMA(av, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) {
            const unsigned mask = v == nv - 1 ? last : VMASK_ALL;
            float *cp = c + (size_t)i * ldc + VL * v;
            vf r = acc[i][v];
            if (accumulate) r = V_ADD(r, V_LOADZ(V_MASKV(mask), cp));
            simd_store(cp, mask, r);
        }
}

/* Full-height tiles get their own instances (mr, nv and masking constant, loops unrolled). */
#define GEMM_TILE(nv_, masked_)                                                                    \
    gemm_tile(MR, nv_, masked_, k, ap, a_row, a_col, bp, ldb, cp, ldc, last, accumulate)
#define GEMM_TILES(masked_)                                                                        \
    do {                                                                                           \
        if (nv == 3)                                                                               \
            GEMM_TILE(3, masked_);                                                                 \
        else if (nv == 2)                                                                          \
            GEMM_TILE(2, masked_);                                                                 \
        else                                                                                       \
            GEMM_TILE(1, masked_);                                                                 \
    } while (0)

/* Tiles of NV_MAX (3) vectors; four vectors left make two tiles of two, since a last tile of
 * one would be bound by its broadcasts. */
static inline int simd_tile_vectors(int64_t left) {
    return left == 4 ? 2 : left >= NV_MAX ? NV_MAX : (int)left;
}

/* static inline: the AVX2 table has a kernel of its own (isa_avx2.c) */
static inline bool simd_sgemm_strided(int m, int n, int k, const float *a, ptrdiff_t a_row,
                                      ptrdiff_t a_col, const float *b, int ldb, float *c, int ldc,
                                      bool accumulate) {
    /* One vector of columns and few rows (a stem's weight gradient) leaves the kernel bound by
     * its broadcasts; OpenBLAS does better there. */
    if (!(n > VL || m >= 2 * MR)) return false;
    const int vectors = (n + VL - 1) / VL;
    for (int v0 = 0, nv; v0 < vectors; v0 += nv) {
        nv = simd_tile_vectors(vectors - v0);
        const int n0 = VL * v0, rem = n - n0;
        const unsigned last = simd_first_lanes(rem - VL * (nv - 1));
        const float *bp = b + n0;
        for (int m0 = 0; m0 < m; m0 += MR) {
            const float *ap = a + m0 * a_row;
            float *cp = c + (size_t)m0 * ldc + n0;
            if (m - m0 >= MR) {
                if (last == VMASK_ALL)
                    GEMM_TILES(false);
                else
                    GEMM_TILES(true);
            } else {
                gemm_tile(m - m0, nv, true, k, ap, a_row, a_col, bp, ldb, cp, ldc, last,
                          accumulate);
            }
        }
    }
    return true;
}
#undef GEMM_TILES
#undef GEMM_TILE

/* ---- cf_sgemm_nt: C (+)= A . B^T, both read along k ------------------------------------------ */

/* A tile of DOT_MR rows of A by DOT_NR rows of B: DOT_MR x DOT_NR accumulators of vectors along
 * k (12: with AVX2 they, the three vectors of A and one of B fill the 16 registers), the lanes
 * summed in double at the end. A stem's weight gradient (9
 * taps by 16 or fewer output channels, thousands of positions) is 3 x 4 tiles with no edge.
 * k runs in chunks whose rows of A and B stay in L1 while every tile reads them (a tile reads
 * each row of A once per tile of B and the other way round); between chunks a tile's
 * accumulators wait in `part`, so each lane still sums its positions in order. Used by the AVX2
 * table, where OpenBLAS's Haswell kernels pack such thin products at 29 GFLOP/s (this: 91,
 * 9 x 16 x 784 in cache); with AVX-512 OpenBLAS's small-matrix kernel is faster (142 against
 * 82: the lanes' sums cost more beside 16-lane FMAs). */
#define DOT_MR 3
#define DOT_NR 4
/* The tiles whose accumulators wait between chunks (on the stack: 9 KB with AVX2, 18 KB with
 * AVX-512); a stem's product is at most 5 x 4 of them. */
#define DOT_MAX_TILES 24
#define DOT_CHUNK_BYTES (24 * 1024) /* rows of A and B per chunk: half of a 48 KB L1 */

typedef struct simd_dots_part {
    vf acc[DOT_MR][DOT_NR];
} simd_dots_part;

/* Positions [p0, p1) of one tile (p1 - p0 a multiple of VL but for the last chunk); the first
 * chunk starts from zero, the last one sums the lanes into C. */
CF_INLINE void dots_tile(int mr, int nr, int p0, int p1, bool first, bool last, const float *a,
                         int lda, const float *b, int ldb, simd_dots_part *part, float *c, int ldc,
                         bool accumulate) {
    vf acc[DOT_MR][DOT_NR];
    _Pragma("GCC unroll 4") for (int i = 0; i < DOT_MR; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < DOT_NR; j++) acc[i][j] =
            first ? V_ZERO() : part->acc[i][j];
    const int full = p0 + (p1 - p0) / VL * VL;
    for (int p = p0; p < full; p += VL) {
        vf av[DOT_MR];
        _Pragma("GCC unroll 4") for (int i = 0; i < mr; i++) av[i] =
            V_LOADU(a + (size_t)i * lda + p);
        _Pragma("GCC unroll 4") for (int j = 0; j < nr; j++) {
            const vf bv = V_LOADU(b + (size_t)j * ldb + p);
            _Pragma("GCC unroll 4") for (int i = 0; i < mr; i++) acc[i][j] =
                V_FMA(av[i], bv, acc[i][j]);
        }
    }
    if (full < p1) {
        const vmaskv tail = V_MASKV(simd_first_lanes(p1 - full));
        vf av[DOT_MR];
        _Pragma("GCC unroll 4") for (int i = 0; i < mr; i++) av[i] =
            V_LOADZ(tail, a + (size_t)i * lda + full);
        _Pragma("GCC unroll 4") for (int j = 0; j < nr; j++) {
            const vf bv = V_LOADZ(tail, b + (size_t)j * ldb + full);
            _Pragma("GCC unroll 4") for (int i = 0; i < mr; i++) acc[i][j] =
                V_FMA(av[i], bv, acc[i][j]);
        }
    }
    if (!last) {
        _Pragma("GCC unroll 4") for (int i = 0; i < DOT_MR; i++)
            _Pragma("GCC unroll 4") for (int j = 0; j < DOT_NR; j++) part->acc[i][j] = acc[i][j];
        return;
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < mr; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < nr; j++) {
        const float s = (float)V_HSUM_D(acc[i][j]);
        float *cp = c + (size_t)i * ldc + j;
        *cp = accumulate ? *cp + s : s;
    }
}

static __attribute__((noinline)) void dots_tile_full(int p0, int p1, bool first, bool last,
                                                     const float *a, int lda, const float *b,
                                                     int ldb, simd_dots_part *part, float *c,
                                                     int ldc, bool accumulate) {
    dots_tile(DOT_MR, DOT_NR, p0, p1, first, last, a, lda, b, ldb, part, c, ldc, accumulate);
}

static __attribute__((noinline)) void dots_tile_edge(int mr, int nr, int p0, int p1, bool first,
                                                     bool last, const float *a, int lda,
                                                     const float *b, int ldb, simd_dots_part *part,
                                                     float *c, int ldc, bool accumulate) {
    dots_tile(mr, nr, p0, p1, first, last, a, lda, b, ldb, part, c, ldc, accumulate);
}

/* static inline: only some tables use it (an unused static function would be a warning) */
static inline bool simd_sgemm_nt(int m, int n, int k, const float *a, int lda, const float *b,
                                 int ldb, float *c, int ldc, bool accumulate) {
    const int tiles_m = (m + DOT_MR - 1) / DOT_MR, tiles_n = (n + DOT_NR - 1) / DOT_NR;
    /* sums of a vector or two (where the lanes' sums would cost as much as the FMAs), and
     * products of more tiles than `part` holds: cf_sgemm */
    if (k < 2 * VL || tiles_m > DOT_MAX_TILES || tiles_n > DOT_MAX_TILES ||
        tiles_m * tiles_n > DOT_MAX_TILES)
        return false;
    simd_dots_part part[DOT_MAX_TILES];
    int chunk = DOT_CHUNK_BYTES / ((m + n) * (int)sizeof(float)) / VL * VL;
    if (chunk < VL) chunk = VL;
    for (int p0 = 0; p0 < k; p0 += chunk) {
        const int p1 = k - p0 > chunk ? p0 + chunk : k;
        const bool first = p0 == 0, last = p1 == k;
        for (int ti = 0; ti < tiles_m; ti++) {
            const int i0 = ti * DOT_MR, mr = m - i0 < DOT_MR ? m - i0 : DOT_MR;
            for (int tj = 0; tj < tiles_n; tj++) {
                const int j0 = tj * DOT_NR, nr = n - j0 < DOT_NR ? n - j0 : DOT_NR;
                const float *ap = a + (size_t)i0 * lda, *bp = b + (size_t)j0 * ldb;
                float *cp = c + (size_t)i0 * ldc + j0;
                simd_dots_part *pt = &part[ti * tiles_n + tj];
                if (mr == DOT_MR && nr == DOT_NR)
                    dots_tile_full(p0, p1, first, last, ap, lda, bp, ldb, pt, cp, ldc, accumulate);
                else
                    dots_tile_edge(mr, nr, p0, p1, first, last, ap, lda, bp, ldb, pt, cp, ldc,
                                   accumulate);
            }
        }
    }
    return true;
}
#undef DOT_MR
#undef DOT_NR
#undef DOT_MAX_TILES
#undef DOT_CHUNK_BYTES

/* ---- the direct stem (cf_conv_stem_*, tensor.h) ------------------------------------------- */

/* A level that defines V_STEM_SUM(v) (its lanes' sum as the lowered weight gradient's kernel
 * takes it, to float) gets simd_stem_forward and simd_stem_wgrad. Positions run flat over the
 * plane (p = oy * w + ox) in vectors of VL, each tap's lanes loaded from x at p + (ky - 1) w +
 * kx - 1 under the tap's lane mask (cf_stem_masks: masked lanes read zero, and are never
 * touched), which is the patch matrix's row segment, zeros included: so the sums are the
 * lowered product's, term for term. */
#ifdef V_STEM_SUM
#define STEM_MAX_VECTORS ((CF_STEM_MAX_PLANE + VL - 1) / VL)
#define STEM_FWD_OB 8 /* output channels a forward vector of taps serves */
/* a weight-gradient block, output channels x taps: its accumulators, a vector of dy per output
 * channel and one of x within the registers (29 of 32 zmm, 13 of 16 ymm), a tap's x load serving
 * ob FMAs (most of them cross a cache line) */
#define STEM_DW_OB (VL == 16 ? 4 : 3)
#define STEM_DW_TB (VL == 16 ? 6 : 3)
#define STEM_DW_TAIL (9 % STEM_DW_TB ? 9 % STEM_DW_TB : STEM_DW_TB) /* the last block's taps */

static inline ptrdiff_t stem_tap_offset(int w, int t) {
    return (ptrdiff_t)(t / 3 - 1) * w + t % 3 - 1;
}

/* ob output channels' vector of positions at x (the first channel's plane, at the vector's
 * first position), each summed over the C x 9 taps in order from zero. */
CF_INLINE void stem_fwd_block(int ob, int C, int P, const float *x, const ptrdiff_t *off,
                              const unsigned *mk, const float *w, float *y, unsigned last) {
    const int K = 9 * C;
    vf acc[STEM_FWD_OB];
    _Pragma("GCC unroll 9") for (int j = 0; j < STEM_FWD_OB; j++) acc[j] = V_ZERO();
    for (int c = 0; c < C; c++) {
        const float *xc = x + (size_t)c * P;
        _Pragma("GCC unroll 9") for (int t = 0; t < 9; t++) {
            /* the pointer may lie outside the plane: only its masked lanes are read */
            const vf xv = V_LOADZ(V_MASKV(mk[t]), xc + off[t]);
            _Pragma("GCC unroll 9") for (int j = 0; j < ob; j++) acc[j] =
                V_FMA(V_SET1(w[(size_t)j * K + c * 9 + t]), xv, acc[j]);
        }
    }
    _Pragma("GCC unroll 9") for (int j = 0; j < ob; j++)
        simd_store(y + (size_t)j * P, last, acc[j]);
}

/* ob output channels' sums over one image's positions of dy times taps [t0, t0 + tb) of a
 * channel (x: its plane), lane l over the positions p = l (mod VL) in order, then the lanes'
 * sums into d[t * O + j] (dwt's rows of the taps; add: added to it). */
CF_INLINE void stem_dw_block(int ob, int tb, int t0, int O, int P, int nv, const float *dy,
                             const float *x, const ptrdiff_t *off, const unsigned *masks, float *d,
                             bool add) {
    vf acc[STEM_DW_OB][STEM_DW_TB];
    _Pragma("GCC unroll 9") for (int j = 0; j < STEM_DW_OB; j++)
        _Pragma("GCC unroll 9") for (int t = 0; t < STEM_DW_TB; t++) acc[j][t] = V_ZERO();
    for (int v = 0; v < nv; v++) {
        const int p0 = v * VL;
        const unsigned *mk = masks + (size_t)v * 9 + t0;
        const vmaskv lastv = V_MASKV(simd_first_lanes(P - p0));
        vf dv[STEM_DW_OB];
        _Pragma("GCC unroll 9") for (int j = 0; j < ob; j++) dv[j] =
            V_LOADZ(lastv, dy + (size_t)j * P + p0);
        _Pragma("GCC unroll 9") for (int t = 0; t < tb; t++) {
            const vf xv = V_LOADZ(V_MASKV(mk[t]), x + p0 + off[t0 + t]);
            _Pragma("GCC unroll 9") for (int j = 0; j < ob; j++) acc[j][t] =
                V_FMA(dv[j], xv, acc[j][t]);
        }
    }
    _Pragma("GCC unroll 9") for (int j = 0; j < ob; j++)
        _Pragma("GCC unroll 9") for (int t = 0; t < tb; t++) {
        const float s = V_STEM_SUM(acc[j][t]);
        float *dj = d + (size_t)t * O + j;
        *dj = add ? *dj + s : s;
    }
}

static void simd_stem_forward(const cf_conv_geom *g, int O, const float *w, const float *x,
                              int n_images, float *y, const cf_conv_epilogue *ep) {
    const int C = g->c, K = 9 * C, P = g->h * g->w, nv = (P + VL - 1) / VL;
    unsigned masks[STEM_MAX_VECTORS * 9];
    cf_stem_masks(g, VL, masks);
    ptrdiff_t off[9];
    for (int t = 0; t < 9; t++) off[t] = stem_tap_offset(g->w, t);
    for (int i = 0; i < n_images; i++) {
        const float *xi = x + (size_t)i * C * P;
        float *yi = y + (size_t)i * O * P;
        for (int v = 0; v < nv; v++) {
            const int p0 = v * VL;
            const unsigned *mk = masks + (size_t)v * 9, last = simd_first_lanes(P - p0);
            for (int o0 = 0; o0 < O; o0 += STEM_FWD_OB) {
                const float *wo = w + (size_t)o0 * K;
                float *yo = yi + (size_t)o0 * P + p0;
                if (O - o0 >= STEM_FWD_OB)
                    stem_fwd_block(STEM_FWD_OB, C, P, xi + p0, off, mk, wo, yo, last);
                else
                    stem_fwd_block(O - o0, C, P, xi + p0, off, mk, wo, yo, last);
            }
        }
        if (ep && ep->fn) ep->fn(ep->ctx, false, i, 1);
    }
}

static void simd_stem_wgrad(const cf_conv_geom *g, int O, const float *dy,
                            const cf_conv_prologue *pro, const float *x, int n_images, float *dwt,
                            bool accumulate) {
    const int C = g->c, P = g->h * g->w, nv = (P + VL - 1) / VL;
    unsigned masks[STEM_MAX_VECTORS * 9];
    cf_stem_masks(g, VL, masks);
    ptrdiff_t off[9];
    for (int t = 0; t < 9; t++) off[t] = stem_tap_offset(g->w, t);
    for (int i = 0; i < n_images; i++) {
        const bool add = accumulate || i > 0;
        const float *dyi = pro ? pro->fn(pro->ctx, i) : dy + (size_t)i * O * P;
        for (int c = 0; c < C; c++) {
            const float *xc = x + ((size_t)i * C + c) * P;
            for (int o0 = 0; o0 < O; o0 += STEM_DW_OB) {
                const int ob = O - o0 < STEM_DW_OB ? O - o0 : STEM_DW_OB;
                const float *dyo = dyi + (size_t)o0 * P;
                for (int t0 = 0; t0 < 9; t0 += STEM_DW_TB) {
                    const int tb = 9 - t0 < STEM_DW_TB ? 9 - t0 : STEM_DW_TB;
                    float *d = dwt + (size_t)(c * 9 + t0) * O + o0;
                    if (ob == STEM_DW_OB && tb == STEM_DW_TB)
                        stem_dw_block(STEM_DW_OB, STEM_DW_TB, t0, O, P, nv, dyo, xc, off, masks, d,
                                      add);
                    else if (ob == STEM_DW_OB && tb == STEM_DW_TAIL)
                        stem_dw_block(STEM_DW_OB, STEM_DW_TAIL, t0, O, P, nv, dyo, xc, off, masks,
                                      d, add);
                    else
                        stem_dw_block(ob, tb, t0, O, P, nv, dyo, xc, off, masks, d, add);
                }
            }
        }
    }
}
#undef STEM_MAX_VECTORS
#undef STEM_FWD_OB
#undef STEM_DW_OB
#undef STEM_DW_TB
#undef STEM_DW_TAIL
#endif

/* ---- implicit convolutions ----------------------------------------------------------------- */

static inline unsigned simd_valid_bits(const cf_implicit_taps *tp, int t, int p) {
    uint32_t word;
    memcpy(&word, tp->valid[t] + (p >> 3), sizeof word);
    return (word >> (p & 7)) & VMASK_ALL;
}

/* One column tile's offsets and masks: per vector, the first image's lanes (1) and, where the
 * vector runs into the next image, the second's (2). */
typedef struct simd_cols {
    ptrdiff_t x1[CF_IMPLICIT_MAX_TAPS][NV_MAX], x2[CF_IMPLICIT_MAX_TAPS][NV_MAX];
    unsigned m1[CF_IMPLICIT_MAX_TAPS][NV_MAX], m2[CF_IMPLICIT_MAX_TAPS][NV_MAX];
    bool full[CF_IMPLICIT_MAX_TAPS]; /* every lane of every vector reads inside one plane */
    ptrdiff_t y1[NV_MAX], y2[NV_MAX];
    unsigned s1[NV_MAX], s2[NV_MAX];
} simd_cols;

/* Where a column tile's vectors run into the next image: in none, in vector v only (the usual
 * case when a tile is narrower than an image: one pair of masks, so that AVX2's 16 registers
 * hold the accumulators without spilling), or in several. */
#define CROSS_NONE (-1)
#define CROSS_MANY (-2)

/* a: the tile's rows in its packed block (row i of channel c, tap t at a[(t*channels + c) *
 * CF_PACK_ROWS + i]). */
CF_INLINE void implicit_tile(int mr, int nv, int cross, int channels, int n_taps, const float *a,
                             const float *x, size_t x_plane, const simd_cols *sc, float *y,
                             size_t y_row) {
    vf acc[MR][NV_MAX];
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)
        _Pragma("GCC unroll 16") for (int v = 0; v < NV_MAX; v++) acc[i][v] = V_ZERO();
    for (int t = 0; t < n_taps; t++) {
        const float *p1[NV_MAX], *p2[NV_MAX];
        _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) {
            p1[v] = x + sc->x1[t][v];
            p2[v] = x + sc->x2[t][v];
        }
        const float *at = a + (size_t)t * channels * CF_PACK_ROWS;
        if (cross == CROSS_NONE && sc->full[t]) { /* the interior: plain loads */
            for (int c = 0; c < channels; c++, at += CF_PACK_ROWS) {
                const size_t off = (size_t)c * x_plane;
                vf bv[NV_MAX];
                _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) bv[v] = V_LOADU(p1[v] + off);
                _Pragma("GCC unroll 16") for (int i = 0; i < mr; i++) {
                    const vf av = V_SET1(at[i]);
                    _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) acc[i][v] =
                        V_FMA(av, bv[v], acc[i][v]);
                }
            }
            continue;
        }
        vmaskv m1[NV_MAX], m2[NV_MAX];
        _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) {
            m1[v] = V_MASKV(sc->m1[t][v]);
            m2[v] = V_MASKV(cross == CROSS_MANY || cross == v ? sc->m2[t][v] : 0u);
        }
        for (int c = 0; c < channels; c++, at += CF_PACK_ROWS) {
            const size_t off = (size_t)c * x_plane;
            vf bv[NV_MAX];
            _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) {
                bv[v] = V_LOADZ(m1[v], p1[v] + off);
                if (cross == CROSS_MANY || cross == v) bv[v] = V_LOADM(bv[v], m2[v], p2[v] + off);
            }
            _Pragma("GCC unroll 16") for (int i = 0; i < mr; i++) {
                const vf av = V_SET1(at[i]);
                _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) acc[i][v] =
                    V_FMA(av, bv[v], acc[i][v]);
            }
        }
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < mr; i++)
        _Pragma("GCC unroll 16") for (int v = 0; v < nv; v++) {
        float *row = y + (size_t)i * y_row;
        simd_store(row + sc->y1[v], sc->s1[v], acc[i][v]);
        if ((cross == CROSS_MANY || cross == v) && sc->s2[v])
            simd_store(row + sc->y2[v], sc->s2[v], acc[i][v]);
    }
}

/* Each full-height tile variant is a function of its own: inlined together into one large
 * function, GCC kept the accumulators of some variants on the stack (a store and a load of each
 * per step). */
typedef void (*implicit_tile_fn)(int channels, int n_taps, const float *a, const float *x,
                                 size_t x_plane, const simd_cols *sc, float *y, size_t y_row);
#define IMPLICIT_TILE_FN(nv_, name_, cross_)                                                       \
    static __attribute__((noinline)) void implicit_tile_##nv_##_##name_(                           \
        int channels, int n_taps, const float *a, const float *x, size_t x_plane,                  \
        const simd_cols *sc, float *y, size_t y_row) {                                             \
        implicit_tile(MR, nv_, cross_, channels, n_taps, a, x, x_plane, sc, y, y_row);             \
    }
#define IMPLICIT_TILE_FNS(nv_)                                                                     \
    IMPLICIT_TILE_FN(nv_, none, CROSS_NONE)                                                        \
    IMPLICIT_TILE_FN(nv_, many, CROSS_MANY)                                                        \
    IMPLICIT_TILE_FN(nv_, 0, 0)
IMPLICIT_TILE_FNS(1)
IMPLICIT_TILE_FNS(2)
IMPLICIT_TILE_FNS(3)
IMPLICIT_TILE_FN(2, 1, 1)
IMPLICIT_TILE_FN(3, 1, 1)
IMPLICIT_TILE_FN(3, 2, 2)
#undef IMPLICIT_TILE_FNS
#undef IMPLICIT_TILE_FN

/* [nv][cross + 2]: many, none, then the vector that runs into the next image */
static const implicit_tile_fn implicit_tiles[NV_MAX + 1][5] = {
    {NULL},
    {implicit_tile_1_many, implicit_tile_1_none, implicit_tile_1_0, NULL, NULL},
    {implicit_tile_2_many, implicit_tile_2_none, implicit_tile_2_0, implicit_tile_2_1, NULL},
    {implicit_tile_3_many, implicit_tile_3_none, implicit_tile_3_0, implicit_tile_3_1,
     implicit_tile_3_2},
};
_Static_assert(NV_MAX == 3, "implicit_tiles lists the variants of tiles of 1 to 3 vectors");

/* The last rows when MR does not divide them (the vector count constant, as in every variant). */
static __attribute__((noinline)) void
implicit_partial_tile(int mr, int nv, int cross, int channels, int n_taps, const float *a,
                      const float *x, size_t x_plane, const simd_cols *sc, float *y, size_t y_row) {
    if (nv == 3)
        implicit_tile(mr, 3, cross, channels, n_taps, a, x, x_plane, sc, y, y_row);
    else if (nv == 2)
        implicit_tile(mr, 2, cross, channels, n_taps, a, x, x_plane, sc, y, y_row);
    else
        implicit_tile(mr, 1, cross, channels, n_taps, a, x, x_plane, sc, y, y_row);
}

static void simd_implicit_run(const cf_implicit_taps *tp, int channels, int m, const float *packed,
                              const float *x, size_t x_plane, size_t x_image, int n_images,
                              float *y, size_t y_row, size_t y_image) {
    const int plane = tp->plane;
    const int64_t n_cols = (int64_t)n_images * plane, vectors = (n_cols + VL - 1) / VL;
    simd_cols sc;
    ptrdiff_t lo_offset = tp->offset[0], hi_offset = tp->offset[0];
    for (int t = 1; t < tp->n; t++) {
        if (tp->offset[t] < lo_offset) lo_offset = tp->offset[t];
        if (tp->offset[t] > hi_offset) hi_offset = tp->offset[t];
    }
    const ptrdiff_t span = hi_offset - lo_offset + VL * NV_MAX;
    for (int64_t v0 = 0, nv; v0 < vectors; v0 += nv) {
        nv = simd_tile_vectors(vectors - v0); /* no lone last vector */
        int cross = CROSS_NONE;
        for (int t = 0; t < tp->n; t++) sc.full[t] = true;
        for (int v = 0; v < nv; v++) {
            const int64_t q = VL * (v0 + v), img = q / plane;
            const int p1 = (int)(q - img * plane);
            int n1 = plane - p1 < VL ? plane - p1 : VL;
            if (n_cols - q < n1) n1 = (int)(n_cols - q);
            const int n2 = n_cols - q - n1 < VL - n1 ? (int)(n_cols - q - n1) : VL - n1;
            const unsigned low1 = simd_first_lanes(n1), low2 = simd_first_lanes(n2);
            if (n2 > 0) cross = cross == CROSS_NONE ? v : CROSS_MANY;
            sc.y1[v] = (ptrdiff_t)(img * (int64_t)y_image + p1);
            sc.y2[v] = (ptrdiff_t)((img + 1) * (int64_t)y_image + p1 - plane);
            sc.s1[v] = low1;
            sc.s2[v] = (low2 << n1) & VMASK_ALL;
            for (int t = 0; t < tp->n; t++) {
                sc.x1[t][v] = (ptrdiff_t)(img * (int64_t)x_image + p1) + tp->offset[t];
                sc.m1[t][v] = simd_valid_bits(tp, t, p1) & low1;
                sc.x2[t][v] =
                    (ptrdiff_t)((img + 1) * (int64_t)x_image + p1 - plane) + tp->offset[t];
                sc.m2[t][v] = n2 ? ((simd_valid_bits(tp, t, 0) & low2) << n1) & VMASK_ALL : 0u;
                if (sc.m1[t][v] != VMASK_ALL) sc.full[t] = false;
            }
        }
        /* the next tile's columns of every channel plane (from the lowest to the highest tap
         * offset) are brought into cache while this tile computes: a layer's input was written
         * long before and the hardware prefetchers do not follow dozens of plane streams */
        if (v0 + nv < vectors && span <= 256) { /* not the phase split, just written */
            const int64_t q = VL * (v0 + nv), img = q / plane;
            const float *base = x + img * (int64_t)x_image + (q - img * plane) + lo_offset;
            for (int c = 0; c < channels; c++)
                for (ptrdiff_t off = 0; off < span; off += 16)
                    __builtin_prefetch(base + (size_t)c * x_plane + off, 0, 3);
        }
        for (int m0 = 0; m0 < m; m0 += MR) {
            const int in_block = m0 % CF_PACK_ROWS;
            const float *ap = packed + (size_t)(m0 - in_block) * channels * tp->n + in_block;
            float *yp = y + (size_t)m0 * y_row;
            if (m - m0 < MR)
                implicit_partial_tile(m - m0, (int)nv, cross == CROSS_NONE ? cross : CROSS_MANY,
                                      channels, tp->n, ap, x, x_plane, &sc, yp, y_row);
            else
                implicit_tiles[nv][cross + 2](channels, tp->n, ap, x, x_plane, &sc, yp, y_row);
        }
    }
}
#undef CROSS_NONE
#undef CROSS_MANY

/* The weight gradient of one tap over a block of images: a tile of mr output channels by nv
 * vectors of input channels, summed over the positions of every image of the block in one
 * register tile; a is the output gradient (rows of positions), b the tap's start in the first
 * image's transposed, padded phase.
 *
 * The tile's height follows its width: WGRAD_ACC accumulators (those of the GEMM tile) of nv
 * vectors each, so that a tile of fewer vectors has more rows and still keeps enough independent
 * FMAs in flight. With AVX2, W1's 16- and 32-channel layers had tiles of 4 x 2 ymm: 8 chains of
 * 4-cycle FMAs on 2 ports, no slack; 6 x 2 took their weight gradient from 97 to 108 GFLOP/s
 * (14x14, 1 thread). */
#ifndef WGRAD_ACC
#define WGRAD_ACC (MR * NV_MAX)
#endif
/* The widest weight-gradient tile, in vectors (a set with registers to spare may allow NV_MAX +
 * 1: with AVX-512, 64 input channels as tiles of 6 rows x 4 vectors read 10 vectors per 24
 * FMAs, where tiles of 11 rows x 2 vectors read 13 per 22). */
#ifndef WGRAD_NV
#define WGRAD_NV NV_MAX
#endif
_Static_assert(WGRAD_NV == NV_MAX || WGRAD_NV == NV_MAX + 1, "WGRAD_NV: NV_MAX or one more");

/* Vectors of the next tile of input channels: as simd_tile_vectors, but a last run of WGRAD_NV
 * vectors is one tile. */
static inline int wgrad_tile_vectors(int left) {
    return left == WGRAD_NV ? WGRAD_NV : simd_tile_vectors(left);
}

typedef struct simd_wgrad_call {
    int oh, ow, n_images, channels;
    const float *a; /* a[n*a_image + o*a_row + y*ow + x] */
    ptrdiff_t a_row;
    size_t a_image;
    const float *b; /* b[n*b_image + y*row_step + x*pos_step + c] */
    ptrdiff_t row_step, pos_step;
    size_t b_image;
    float *out; /* out[o*channels + c] */
    bool accumulate;
} simd_wgrad_call;

CF_INLINE void wgrad_tile(int mr, int nv, bool masked, const simd_wgrad_call *w, int m0, int c0,
                          unsigned last) {
    vf acc[WGRAD_ACC][WGRAD_NV];
    _Pragma("GCC unroll 24") for (int i = 0; i < mr; i++)
        _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) acc[i][v] = V_ZERO();
    const vmaskv lastv = V_MASKV(last);
    const ptrdiff_t a_row = w->a_row, channels = w->channels, pos_step = w->pos_step;
    for (int n = 0; n < w->n_images; n++) {
        const float *bn = w->b + n * w->b_image + c0;
        const float *ap = w->a + n * w->a_image + m0 * a_row;
        for (int y = 0; y < w->oh; y++) {
            const float *bp = bn + y * w->row_step;
            for (int x = 0; x < w->ow; x++, bp += pos_step, ap++) {
                vf bv[WGRAD_NV];
                _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) bv[v] =
                    masked && v == nv - 1 ? V_LOADZ(lastv, bp + VL * v) : V_LOADU(bp + VL * v);
                _Pragma("GCC unroll 24") for (int i = 0; i < mr; i++) {
                    const vf av = V_SET1(ap[i * a_row]);
                    _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) acc[i][v] =
                        V_FMA(av, bv[v], acc[i][v]);
                }
            }
        }
    }
    _Pragma("GCC unroll 24") for (int i = 0; i < mr; i++)
        _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) {
        const unsigned mask = v == nv - 1 ? last : VMASK_ALL;
        float *cp = w->out + (size_t)(m0 + i) * channels + c0 + VL * v;
        vf r = acc[i][v];
        if (w->accumulate) r = V_ADD(r, V_LOADZ(V_MASKV(mask), cp));
        simd_store(cp, mask, r);
    }
}

/* One function per tile shape (rows, vectors, a masked last vector or not), as the implicit
 * tiles above: all of them inlined into one function, GCC would not keep every variant's
 * accumulators in registers. A call runs `tiles` tiles of the shape, one under the other (the
 * tiles of a 7x7 plane are short: a call per tile cost AVX-512 a tenth of the kernel). */
typedef void (*wgrad_tile_fn)(const simd_wgrad_call *w, int m0, int tiles, int c0, unsigned last);
#define WGRAD_TILE_FN(nv_, mr_)                                                                    \
    static __attribute__((noinline)) void wgrad_tile_##nv_##_##mr_(                                \
        const simd_wgrad_call *w, int m0, int tiles, int c0, unsigned last) {                      \
        for (int t = 0; t < tiles; t++) wgrad_tile(mr_, nv_, false, w, m0 + t * mr_, c0, last);    \
    }                                                                                              \
    static __attribute__((noinline)) void wgrad_tile_##nv_##_##mr_##_masked(                       \
        const simd_wgrad_call *w, int m0, int tiles, int c0, unsigned last) {                      \
        for (int t = 0; t < tiles; t++) wgrad_tile(mr_, nv_, true, w, m0 + t * mr_, c0, last);     \
    }
#define WGRAD_TILE_ENTRY(nv_, mr_)                                                                 \
    [0][nv_][mr_] = wgrad_tile_##nv_##_##mr_, [1][nv_][mr_] = wgrad_tile_##nv_##_##mr_##_masked,
#define WGRAD_ROWS_4(X, nv) X(nv, 1) X(nv, 2) X(nv, 3) X(nv, 4)
#define WGRAD_ROWS_6(X, nv) WGRAD_ROWS_4(X, nv) X(nv, 5) X(nv, 6)
#define WGRAD_ROWS_8(X, nv) WGRAD_ROWS_6(X, nv) X(nv, 7) X(nv, 8)
#define WGRAD_ROWS_12(X, nv) WGRAD_ROWS_8(X, nv) X(nv, 9) X(nv, 10) X(nv, 11) X(nv, 12)
#define WGRAD_ROWS_24(X, nv)                                                                       \
    WGRAD_ROWS_12(X, nv)                                                                           \
    X(nv, 13)                                                                                      \
    X(nv, 14)                                                                                      \
    X(nv, 15)                                                                                      \
    X(nv, 16) X(nv, 17) X(nv, 18) X(nv, 19) X(nv, 20) X(nv, 21) X(nv, 22) X(nv, 23) X(nv, 24)
#if WGRAD_ACC == 12 && WGRAD_NV == NV_MAX
#define WGRAD_SHAPES(X) WGRAD_ROWS_12(X, 1) WGRAD_ROWS_6(X, 2) WGRAD_ROWS_4(X, 3)
#elif WGRAD_ACC == 24 && WGRAD_NV == 4
#define WGRAD_SHAPES(X)                                                                            \
    WGRAD_ROWS_24(X, 1) WGRAD_ROWS_12(X, 2) WGRAD_ROWS_8(X, 3) WGRAD_ROWS_6(X, 4)
#elif WGRAD_ACC == 24
#define WGRAD_SHAPES(X) WGRAD_ROWS_24(X, 1) WGRAD_ROWS_12(X, 2) WGRAD_ROWS_8(X, 3)
#else
#error                                                                                             \
    "WGRAD_ACC, WGRAD_NV: tile shapes are listed for 12 accumulators of up to NV_MAX vectors, 24 of up to 4"
#endif
WGRAD_SHAPES(WGRAD_TILE_FN)
/* [masked][vectors][rows] */
static const wgrad_tile_fn wgrad_tiles[2][WGRAD_NV + 1][WGRAD_ACC + 1] = {
    WGRAD_SHAPES(WGRAD_TILE_ENTRY)};
#undef WGRAD_SHAPES
#undef WGRAD_ROWS_24
#undef WGRAD_ROWS_12
#undef WGRAD_ROWS_8
#undef WGRAD_ROWS_6
#undef WGRAD_ROWS_4
#undef WGRAD_TILE_ENTRY
#undef WGRAD_TILE_FN

static void simd_implicit_wgrad(int m, int channels, int oh, int ow, int n_images, const float *a,
                                ptrdiff_t a_row, size_t a_image, const float *b, ptrdiff_t row_step,
                                ptrdiff_t pos_step, size_t b_image, float *out, bool accumulate) {
    const simd_wgrad_call w = {.oh = oh,
                               .ow = ow,
                               .n_images = n_images,
                               .channels = channels,
                               .a = a,
                               .a_row = a_row,
                               .a_image = a_image,
                               .b = b,
                               .row_step = row_step,
                               .pos_step = pos_step,
                               .b_image = b_image,
                               .out = out,
                               .accumulate = accumulate};
    const int vectors = (channels + VL - 1) / VL;
    for (int v0 = 0, nv; v0 < vectors; v0 += nv) {
        nv = wgrad_tile_vectors(vectors - v0);
        const unsigned last = simd_first_lanes(channels - VL * v0 - VL * (nv - 1));
        const int masked = last != VMASK_ALL;
        /* the rows in tiles of at most WGRAD_ACC / nv, as even as they go (32 rows of 6 at
         * most: 6 6 5 5 5 5) */
        const int most = WGRAD_ACC / nv, tiles = (m + most - 1) / most;
        const int rows = m / tiles, taller = m % tiles;
        if (taller) wgrad_tiles[masked][nv][rows + 1](&w, 0, taller, VL * v0, last);
        wgrad_tiles[masked][nv][rows](&w, taller * (rows + 1), tiles - taller, VL * v0, last);
    }
}

/* ---- stride 2's phase planes (for the tables whose set defines V_ZIP and V_UNZIP) ---------- */

#ifdef V_UNZIP
/* The lanes in mask from p (a plain load when all are wanted). */
CF_INLINE vf simd_load(const float *p, unsigned mask) {
    return mask == VMASK_ALL ? V_LOADU(p) : V_LOADZ(V_MASKV(mask), p);
}

/* Stride 2: the phase planes of one image, xs[c][a*2 + b][u][v] = x[c][2u + a][2v + b], for
 * the phases whose bit is set in `used`: 2 VL inputs of a row give VL of each phase (V_UNZIP). */
static inline void simd_split_phases(const cf_conv_geom *g, const float *x, float *xs,
                                     unsigned used) {
    const int oh = g->oh, ow = g->ow, w = g->w;
    const size_t plane = (size_t)oh * ow;
    for (int c = 0; c < g->c; c++) {
        const float *xc = x + (size_t)c * g->h * w;
        float *sc = xs + (size_t)c * 4 * plane;
        for (int a = 0; a < 2; a++) {
            const bool want0 = used >> (2 * a) & 1u, want1 = used >> (2 * a + 1) & 1u;
            if (!want0 && !want1) continue;
            float *d0 = sc + (size_t)(2 * a) * plane, *d1 = d0 + plane;
            for (int u = 0; u < oh; u++) {
                const float *r = xc + (size_t)(2 * u + a) * w;
                for (int v0 = 0; v0 < ow; v0 += VL) {
                    const int n = ow - v0 < VL ? ow - v0 : VL; /* from 2n <= 2 VL inputs */
                    const unsigned out = simd_first_lanes(n);
                    vf ev, od;
                    V_UNZIP(simd_load(r + 2 * v0, simd_first_lanes(2 * n)),
                            simd_load(r + 2 * v0 + VL, simd_first_lanes(2 * n - VL)), ev, od);
                    if (want0) simd_store(d0 + (size_t)u * ow + v0, out, ev);
                    if (want1) simd_store(d1 + (size_t)u * ow + v0, out, od);
                }
            }
        }
    }
}

/* The inverse: x[c][2u + a][2v + b] = xs[c][a*2 + b][u][v] (V_ZIP). */
static inline void simd_merge_phases(const cf_conv_geom *g, const float *xs, float *x) {
    const int oh = g->oh, ow = g->ow, w = g->w;
    const size_t plane = (size_t)oh * ow;
    for (int c = 0; c < g->c; c++) {
        float *xc = x + (size_t)c * g->h * w;
        const float *sc = xs + (size_t)c * 4 * plane;
        for (int a = 0; a < 2; a++) {
            const float *s0 = sc + (size_t)(2 * a) * plane, *s1 = s0 + plane;
            for (int u = 0; u < oh; u++) {
                float *r = xc + (size_t)(2 * u + a) * w;
                for (int v0 = 0; v0 < ow; v0 += VL) {
                    const int n = ow - v0 < VL ? ow - v0 : VL; /* to 2n <= 2 VL outputs */
                    const unsigned in = simd_first_lanes(n);
                    vf lo, hi;
                    V_ZIP(simd_load(s0 + (size_t)u * ow + v0, in),
                          simd_load(s1 + (size_t)u * ow + v0, in), lo, hi);
                    simd_store(r + 2 * v0, simd_first_lanes(2 * n), lo);
                    simd_store(r + 2 * v0 + VL, simd_first_lanes(2 * n - VL), hi);
                }
            }
        }
    }
}
#endif

/* ---- BatchNorm over one channel plane (see cf_bn_kernels in kernel_table.h) ---------------- */

static inline unsigned simd_tail(int64_t s) {
    return (unsigned)((1u << (s & (VL - 1))) - 1u);
}

static void simd_bn_shifted_sums(const float *x, int64_t s, float k, double *s1, double *s2) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf kk = V_SET1(k);
    vf a1 = V_ZERO(), a2 = V_ZERO();
    for (int64_t i = 0; i < full; i += VL) {
        const vf d = V_SUB(V_LOADU(x + i), kk);
        a1 = V_ADD(a1, d);
        a2 = V_FMA(d, d, a2);
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf d = V_ZMASK(tm, V_SUB(V_LOADZ(tm, x + full), kk));
        a1 = V_ADD(a1, d);
        a2 = V_FMA(d, d, a2);
    }
    *s1 = V_HSUM_D(a1);
    *s2 = V_HSUM_D(a2);
}

/* y = x * scale + shift; relu: max(., 0); add: max(add + (x * scale + shift), 0). max(z, 0)
 * returns its second operand unless z > 0, as ReLU's z > 0 ? z : 0 (NaN and -0 give +0). */
static void simd_bn_affine(const float *x, const float *add, float *y, int64_t s, float scale,
                           float shift, bool relu) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf a = V_SET1(scale), b = V_SET1(shift), z = V_ZERO();
    if (add) {
        for (int64_t i = 0; i < full; i += VL)
            V_STOREU(y + i, V_MAX(V_ADD(V_LOADU(add + i), V_FMA(V_LOADU(x + i), a, b)), z));
        if (tail) {
            const vmaskv tm = V_MASKV(tail);
            const vf t = V_FMA(V_LOADZ(tm, x + full), a, b);
            V_STOREM(y + full, tm, V_MAX(V_ADD(V_LOADZ(tm, add + full), t), z));
        }
    } else if (relu) {
        for (int64_t i = 0; i < full; i += VL)
            V_STOREU(y + i, V_MAX(V_FMA(V_LOADU(x + i), a, b), z));
        if (tail) {
            const vmaskv tm = V_MASKV(tail);
            V_STOREM(y + full, tm, V_MAX(V_FMA(V_LOADZ(tm, x + full), a, b), z));
        }
    } else {
        for (int64_t i = 0; i < full; i += VL) V_STOREU(y + i, V_FMA(V_LOADU(x + i), a, b));
        if (tail) {
            const vmaskv tm = V_MASKV(tail);
            V_STOREM(y + full, tm, V_FMA(V_LOADZ(tm, x + full), a, b));
        }
    }
}

/* The lanes of m where the fused ReLU's output is positive: x * scale + shift > 0, computed as
 * the forward computed it (relu false: m itself). */
CF_INLINE vmaskv simd_relu_lanes(vmaskv m, bool relu, vf x, vf a, vf b) {
    if (!relu) return m;
    return V_MASK_AND(m, V_GT0(V_FMA(x, a, b)));
}

static void simd_bn_dy_sums(const float *dy, const float *x, int64_t s, float mean, bool relu,
                            float scale, float shift, double *sdy, double *sdyx) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf m = V_SET1(mean), sa = V_SET1(scale), sb = V_SET1(shift);
    const vmaskv all = V_MASKV(VMASK_ALL);
    vf a1 = V_ZERO(), a2 = V_ZERO();
    for (int64_t i = 0; i < full; i += VL) {
        const vf xv = V_LOADU(x + i);
        const vf g = relu ? V_LOADZ_READABLE(simd_relu_lanes(all, true, xv, sa, sb), dy + i)
                          : V_LOADU(dy + i);
        a1 = V_ADD(a1, g);
        a2 = V_FMA(g, V_SUB(xv, m), a2);
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf xv = V_LOADZ(tm, x + full);
        const vf g = V_LOADZ(simd_relu_lanes(tm, relu, xv, sa, sb), dy + full);
        a1 = V_ADD(a1, g);
        a2 = V_FMA(g, V_SUB(xv, m), a2);
    }
    *sdy += V_HSUM_D(a1);
    *sdyx += V_HSUM_D(a2);
}

static void simd_bn_dx(const float *dy, const float *x, float *dx, int64_t s, float mean, float k1,
                       float k2, float k3, bool relu, float scale, float shift) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf m = V_SET1(mean), a = V_SET1(k1), b = V_SET1(k2), c = V_SET1(k3), sa = V_SET1(scale),
             sb = V_SET1(shift);
    const vmaskv all = V_MASKV(VMASK_ALL);
    for (int64_t i = 0; i < full; i += VL) {
        const vf xv = V_LOADU(x + i);
        const vf g = relu ? V_LOADZ_READABLE(simd_relu_lanes(all, true, xv, sa, sb), dy + i)
                          : V_LOADU(dy + i);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STOREU(dx + i, V_FMA(a, g, t));
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf xv = V_LOADZ(tm, x + full);
        const vf g = V_LOADZ(simd_relu_lanes(tm, relu, xv, sa, sb), dy + full);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STOREM(dx + full, tm, V_FMA(a, g, t));
    }
}

/* np planes side by side: each plane's lanes take its values in the order of
 * simd_bn_shifted_sums / simd_bn_dy_sums, with the same operations, so each plane's sums are
 * bitwise the one-plane kernel's (s1[i] is the sum that kernel's caller gets in *s1; sdy[i] is
 * what the one-plane kernel adds to *sdy). Only the planes' independent chains interleave. */
CF_INLINE void bn_sums_planes(int np, const float *const *x, int64_t s, const float *k, double *s1,
                              double *s2) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    vf kk[CF_BN_PLANES], a1[CF_BN_PLANES], a2[CF_BN_PLANES];
    _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
        kk[i] = V_SET1(k[i]);
        a1[i] = a2[i] = V_ZERO();
    }
    for (int64_t j = 0; j < full; j += VL) _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
            const vf d = V_SUB(V_LOADU(x[i] + j), kk[i]);
            a1[i] = V_ADD(a1[i], d);
            a2[i] = V_FMA(d, d, a2[i]);
        }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
            const vf d = V_ZMASK(tm, V_SUB(V_LOADZ(tm, x[i] + full), kk[i]));
            a1[i] = V_ADD(a1[i], d);
            a2[i] = V_FMA(d, d, a2[i]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
        s1[i] = V_HSUM_D(a1[i]);
        s2[i] = V_HSUM_D(a2[i]);
    }
}

static void simd_bn_shifted_sums_n(int np, const float *const *x, int64_t s, const float *k,
                                   double *s1, double *s2) {
    if (np == CF_BN_PLANES)
        bn_sums_planes(CF_BN_PLANES, x, s, k, s1, s2);
    else
        for (int i = 0; i < np; i++) bn_sums_planes(1, x + i, s, k + i, s1 + i, s2 + i);
}

/* The lanes of the vector at value j (a multiple of VL) of a plane whose mask words are w
 * (CF_MASK_WORDS layout; VL divides 16). */
CF_INLINE unsigned simd_mask_bits(const uint16_t *w, int64_t j) {
    return VL == 16 ? (unsigned)w[j >> 4] : ((unsigned)w[j >> 4] >> (j & 15)) & VMASK_ALL;
}

/* mask (not NULL, relu then false): g = dy where plane i's bit in mask[i] is set, +0 elsewhere */
CF_INLINE void bn_dy_sums_planes(int np, const float *const *dy, const float *const *x, int64_t s,
                                 const float *mean, bool relu, const float *scale,
                                 const float *shift, const uint16_t *const *mask, double *sdy,
                                 double *sdyx) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vmaskv all = V_MASKV(VMASK_ALL);
    vf m[CF_BN_PLANES], sa[CF_BN_PLANES], sb[CF_BN_PLANES], a1[CF_BN_PLANES], a2[CF_BN_PLANES];
    _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
        m[i] = V_SET1(mean[i]);
        sa[i] = V_SET1(scale[i]);
        sb[i] = V_SET1(shift[i]);
        a1[i] = a2[i] = V_ZERO();
    }
    for (int64_t j = 0; j < full; j += VL) _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
            const vf xv = V_LOADU(x[i] + j);
            const vf g =
                mask   ? V_LOADZ_READABLE(V_MASKV(simd_mask_bits(mask[i], j)), dy[i] + j)
                : relu ? V_LOADZ_READABLE(simd_relu_lanes(all, true, xv, sa[i], sb[i]), dy[i] + j)
                       : V_LOADU(dy[i] + j);
            a1[i] = V_ADD(a1[i], g);
            a2[i] = V_FMA(g, V_SUB(xv, m[i]), a2[i]);
        }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
            const vf xv = V_LOADZ(tm, x[i] + full);
            const vf g = mask ? V_LOADZ(V_MASKV(simd_mask_bits(mask[i], full) & tail), dy[i] + full)
                              : V_LOADZ(simd_relu_lanes(tm, relu, xv, sa[i], sb[i]), dy[i] + full);
            a1[i] = V_ADD(a1[i], g);
            a2[i] = V_FMA(g, V_SUB(xv, m[i]), a2[i]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < np; i++) {
        sdy[i] = V_HSUM_D(a1[i]);
        sdyx[i] = V_HSUM_D(a2[i]);
    }
}

static void simd_bn_dy_sums_n(int np, const float *const *dy, const float *const *x, int64_t s,
                              const float *mean, bool relu, const float *scale, const float *shift,
                              double *sdy, double *sdyx) {
    if (np == CF_BN_PLANES)
        bn_dy_sums_planes(CF_BN_PLANES, dy, x, s, mean, relu, scale, shift, NULL, sdy, sdyx);
    else
        for (int i = 0; i < np; i++)
            bn_dy_sums_planes(1, dy + i, x + i, s, mean + i, relu, scale + i, shift + i, NULL,
                              sdy + i, sdyx + i);
}

static void simd_bn_dy_sums_mask_n(int np, const float *const *dy, const float *const *x, int64_t s,
                                   const float *mean, const uint16_t *const *mask, double *sdy,
                                   double *sdyx) {
    if (np == CF_BN_PLANES)
        bn_dy_sums_planes(CF_BN_PLANES, dy, x, s, mean, false, mean, mean, mask, sdy, sdyx);
    else
        for (int i = 0; i < np; i++)
            bn_dy_sums_planes(1, dy + i, x + i, s, mean + i, false, mean + i, mean + i, mask + i,
                              sdy + i, sdyx + i);
}

/* simd_bn_affine with y's aligned whole vectors written by non-temporal stores (V_STREAM, where
 * the set defines it): the values before the first aligned vector and after the last take
 * simd_bn_affine itself, the vectors between are its loop's expressions, so every value is
 * bitwise simd_bn_affine's. */
static void simd_bn_affine_stream(const float *x, const float *add, float *y, int64_t s,
                                  float scale, float shift, bool relu) {
#ifdef V_STREAM
    const uintptr_t vb = VL * sizeof(float);
    const int64_t head = (int64_t)((vb - (uintptr_t)y % vb) % vb / sizeof(float));
    if ((uintptr_t)y % sizeof(float) || head + VL > s) {
        simd_bn_affine(x, add, y, s, scale, shift, relu);
        return;
    }
    if (head) simd_bn_affine(x, add, y, head, scale, shift, relu);
    const int64_t end = head + ((s - head) & ~(int64_t)(VL - 1));
    const vf a = V_SET1(scale), b = V_SET1(shift), z = V_ZERO();
    if (add)
        for (int64_t i = head; i < end; i += VL)
            V_STREAM(y + i, V_MAX(V_ADD(V_LOADU(add + i), V_FMA(V_LOADU(x + i), a, b)), z));
    else if (relu)
        for (int64_t i = head; i < end; i += VL)
            V_STREAM(y + i, V_MAX(V_FMA(V_LOADU(x + i), a, b), z));
    else
        for (int64_t i = head; i < end; i += VL) V_STREAM(y + i, V_FMA(V_LOADU(x + i), a, b));
    if (end < s)
        simd_bn_affine(x + end, add ? add + end : NULL, y + end, s - end, scale, shift, relu);
#else
    simd_bn_affine(x, add, y, s, scale, shift, relu);
#endif
}

static void simd_bn_affine_n(const float *x, const float *add, float *y, int64_t s, int nc,
                             const float *scale, const float *shift, bool relu, ptrdiff_t ahead,
                             bool stream) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) { /* one plane at a time, beside the work (see batchnorm.c) */
            if (!stream) cf_prefetch(y + at + ahead, (size_t)s * sizeof(float), true, true);
            if (add) cf_prefetch(add + at + ahead, (size_t)s * sizeof(float), false, true);
        }
        if (stream)
            simd_bn_affine_stream(x + at, add ? add + at : NULL, y + at, s, scale[i], shift[i],
                                  relu);
        else
            simd_bn_affine(x + at, add ? add + at : NULL, y + at, s, scale[i], shift[i], relu);
    }
#ifdef V_STREAM
    if (stream) V_SFENCE(); /* the streamed lines ordered before whatever the caller does next */
#endif
}

/* y = max((x2 * scale2 + shift2) + (x * scale + shift), 0): the residual fold's output where
 * its other term is a BatchNorm's output it computes itself (batchnorm.c). Both terms are
 * simd_bn_affine's expressions (x2's without ReLU, then the add branch with it as add), so the
 * values are bitwise those two calls'. */
static void simd_bn_affine_add2(const float *x, const float *x2, float *y, int64_t s, float scale,
                                float shift, float scale2, float shift2) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf a = V_SET1(scale), b = V_SET1(shift), a2 = V_SET1(scale2), b2 = V_SET1(shift2),
             z = V_ZERO();
    for (int64_t i = 0; i < full; i += VL)
        V_STOREU(y + i,
                 V_MAX(V_ADD(V_FMA(V_LOADU(x2 + i), a2, b2), V_FMA(V_LOADU(x + i), a, b)), z));
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf t = V_FMA(V_LOADZ(tm, x + full), a, b);
        V_STOREM(y + full, tm, V_MAX(V_ADD(V_FMA(V_LOADZ(tm, x2 + full), a2, b2), t), z));
    }
}

static void simd_bn_affine_add2_n(const float *x, const float *x2, float *y, int64_t s, int nc,
                                  const float *scale, const float *shift, const float *scale2,
                                  const float *shift2, ptrdiff_t ahead) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) { /* as simd_bn_affine_n prefetches y and add */
            cf_prefetch(y + at + ahead, (size_t)s * sizeof(float), true, true);
            cf_prefetch(x2 + at + ahead, (size_t)s * sizeof(float), false, true);
        }
        simd_bn_affine_add2(x + at, x2 + at, y + at, s, scale[i], shift[i], scale2[i], shift2[i]);
    }
}

/* The fold's output (affine's add branch, or affine_add2 with x2) and its ReLU's mask: each
 * value's bit v > 0, which is y > 0 (y = max(v, 0) is v where v > 0 and +0 elsewhere). Stored
 * as fp32 at y or, where words, as bf16 words at yh: each caller passes words as a constant, so
 * the choice folds away when the body is inlined. */
CF_INLINE void bn_fold_mask_body(const float *x, const float *add, const float *x2, float *y,
                                 uint16_t *yh, bool words, int64_t s, float scale, float shift,
                                 float scale2, float shift2, uint16_t *mask) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf a = V_SET1(scale), b = V_SET1(shift), a2 = V_SET1(scale2), b2 = V_SET1(shift2),
             z = V_ZERO();
#ifndef V_STORE_BF16
    (void)yh, (void)words;
#endif
    unsigned word = 0;
    for (int64_t i = 0; i < full; i += VL) {
        const vf t2 = x2 ? V_FMA(V_LOADU(x2 + i), a2, b2) : V_LOADU(add + i);
        const vf v = V_ADD(t2, V_FMA(V_LOADU(x + i), a, b));
#ifdef V_STORE_BF16
        if (words)
            V_STORE_BF16(yh + i, V_MASKV(VMASK_ALL), V_MAX(v, z));
        else
#endif
            V_STOREU(y + i, V_MAX(v, z));
        word |= V_MASK_BITS(V_GT0(v)) << (i & 15);
        if (((i + VL) & 15) == 0) {
            mask[i >> 4] = (uint16_t)word;
            word = 0;
        }
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf t = V_FMA(V_LOADZ(tm, x + full), a, b);
        const vf t2 = x2 ? V_FMA(V_LOADZ(tm, x2 + full), a2, b2) : V_LOADZ(tm, add + full);
        const vf v = V_ADD(t2, t);
#ifdef V_STORE_BF16
        if (words)
            V_STORE_BF16(yh + full, tm, V_MAX(v, z));
        else
#endif
            V_STOREM(y + full, tm, V_MAX(v, z));
        word |= (V_MASK_BITS(V_GT0(v)) & tail) << (full & 15);
    }
    if (s & 15) mask[s >> 4] = (uint16_t)word; /* the last word, partly filled */
}

static void simd_bn_fold_mask(const float *x, const float *add, const float *x2, float *y,
                              int64_t s, float scale, float shift, float scale2, float shift2,
                              uint16_t *mask) {
    bn_fold_mask_body(x, add, x2, y, NULL, false, s, scale, shift, scale2, shift2, mask);
}

static void simd_bn_fold_mask_n(const float *x, const float *add, const float *x2, float *y,
                                int64_t s, int nc, const float *scale, const float *shift,
                                const float *scale2, const float *shift2, uint16_t *mask,
                                ptrdiff_t ahead) {
    const float *other = x2 ? x2 : add;
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) { /* as simd_bn_affine_n prefetches y and add */
            cf_prefetch(y + at + ahead, (size_t)s * sizeof(float), true, true);
            cf_prefetch(other + at + ahead, (size_t)s * sizeof(float), false, true);
        }
        simd_bn_fold_mask(x + at, x2 ? NULL : add + at, x2 ? x2 + at : NULL, y + at, s, scale[i],
                          shift[i], x2 ? scale2[i] : 0.0f, x2 ? shift2[i] : 0.0f,
                          mask + (size_t)i * CF_MASK_WORDS(s));
    }
}

/* simd_bn_dx without relu, g = dy masked by the plane's bits */
static void simd_bn_dx_mask(const float *dy, const float *x, float *dx, int64_t s, float mean,
                            float k1, float k2, float k3, const uint16_t *w) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf m = V_SET1(mean), a = V_SET1(k1), b = V_SET1(k2), c = V_SET1(k3);
    for (int64_t i = 0; i < full; i += VL) {
        const vf xv = V_LOADU(x + i);
        const vf g = V_LOADZ_READABLE(V_MASKV(simd_mask_bits(w, i)), dy + i);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STOREU(dx + i, V_FMA(a, g, t));
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf xv = V_LOADZ(tm, x + full);
        const vf g = V_LOADZ(V_MASKV(simd_mask_bits(w, full) & tail), dy + full);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STOREM(dx + full, tm, V_FMA(a, g, t));
    }
}

static void simd_bn_dx_mask_n(const float *dy, const float *x, float *dx, int64_t s, int nc,
                              const float *mean, const float *k1, const float *k2, const float *k3,
                              const uint16_t *mask, ptrdiff_t ahead) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dx + at + ahead, (size_t)s * sizeof(float), true, true);
        simd_bn_dx_mask(dy + at, x + at, dx + at, s, mean[i], k1[i], k2[i], k3[i],
                        mask + (size_t)i * CF_MASK_WORDS(s));
    }
}

static void simd_bn_dx_n(const float *dy, const float *x, float *dx, int64_t s, int nc,
                         const float *mean, const float *k1, const float *k2, const float *k3,
                         bool relu, const float *scale, const float *shift, ptrdiff_t ahead) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dx + at + ahead, (size_t)s * sizeof(float), true, true);
        simd_bn_dx(dy + at, x + at, dx + at, s, mean[i], k1[i], k2[i], k3[i], relu, scale[i],
                   shift[i]);
    }
}

#ifdef V_STORE_BF16
/* simd_bn_dx's values, each vector stored as its bf16 words (V_STORE_BF16: cf_fp32_to_bf16's
 * rounding), bitwise simd_bn_dx then the conversion. */
static void simd_bn_dx_bf16(const float *dy, const float *x, uint16_t *dxh, int64_t s, float mean,
                            float k1, float k2, float k3, bool relu, float scale, float shift) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf m = V_SET1(mean), a = V_SET1(k1), b = V_SET1(k2), c = V_SET1(k3), sa = V_SET1(scale),
             sb = V_SET1(shift);
    const vmaskv all = V_MASKV(VMASK_ALL);
    for (int64_t i = 0; i < full; i += VL) {
        const vf xv = V_LOADU(x + i);
        const vf g = relu ? V_LOADZ_READABLE(simd_relu_lanes(all, true, xv, sa, sb), dy + i)
                          : V_LOADU(dy + i);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STORE_BF16(dxh + i, all, V_FMA(a, g, t));
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf xv = V_LOADZ(tm, x + full);
        const vf g = V_LOADZ(simd_relu_lanes(tm, relu, xv, sa, sb), dy + full);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STORE_BF16(dxh + full, tm, V_FMA(a, g, t));
    }
}

/* simd_bn_affine's values without add (relu: max(., 0)), each vector stored as its bf16 words:
 * bitwise simd_bn_affine then cf_fp32_to_bf16, without the fp32 values' trip through memory. */
static void simd_bn_affine_bf16(const float *x, uint16_t *yh, int64_t s, float scale, float shift,
                                bool relu) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf a = V_SET1(scale), b = V_SET1(shift), z = V_ZERO();
    const vmaskv all = V_MASKV(VMASK_ALL);
    if (relu)
        for (int64_t i = 0; i < full; i += VL)
            V_STORE_BF16(yh + i, all, V_MAX(V_FMA(V_LOADU(x + i), a, b), z));
    else
        for (int64_t i = 0; i < full; i += VL)
            V_STORE_BF16(yh + i, all, V_FMA(V_LOADU(x + i), a, b));
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf t = V_FMA(V_LOADZ(tm, x + full), a, b);
        V_STORE_BF16(yh + full, tm, relu ? V_MAX(t, z) : t);
    }
}

static void simd_bn_affine_bf16_n(const float *x, uint16_t *yh, int64_t s, int nc,
                                  const float *scale, const float *shift, bool relu,
                                  ptrdiff_t ahead) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(yh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        simd_bn_affine_bf16(x + at, yh + at, s, scale[i], shift[i], relu);
    }
}

/* simd_bn_fold_mask's values stored as their bf16 words (the fold writing the next block's
 * convolution's input words, no fp32 written), and the same mask bits. */
static void simd_bn_fold_mask_bf16(const float *x, const float *add, const float *x2, uint16_t *yh,
                                   int64_t s, float scale, float shift, float scale2, float shift2,
                                   uint16_t *mask) {
    bn_fold_mask_body(x, add, x2, NULL, yh, true, s, scale, shift, scale2, shift2, mask);
}

static void simd_bn_fold_mask_bf16_n(const float *x, const float *add, const float *x2,
                                     uint16_t *yh, int64_t s, int nc, const float *scale,
                                     const float *shift, const float *scale2, const float *shift2,
                                     uint16_t *mask, ptrdiff_t ahead) {
    const float *other = x2 ? x2 : add;
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) {
            cf_prefetch(yh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
            cf_prefetch(other + at + ahead, (size_t)s * sizeof(float), false, true);
        }
        simd_bn_fold_mask_bf16(x + at, x2 ? NULL : add + at, x2 ? x2 + at : NULL, yh + at, s,
                               scale[i], shift[i], x2 ? scale2[i] : 0.0f, x2 ? shift2[i] : 0.0f,
                               mask + (size_t)i * CF_MASK_WORDS(s));
    }
}

static void simd_bn_dx_mask_bf16(const float *dy, const float *x, uint16_t *dxh, int64_t s,
                                 float mean, float k1, float k2, float k3, const uint16_t *w) {
    const int64_t full = s & ~(int64_t)(VL - 1);
    const unsigned tail = simd_tail(s);
    const vf m = V_SET1(mean), a = V_SET1(k1), b = V_SET1(k2), c = V_SET1(k3);
    const vmaskv all = V_MASKV(VMASK_ALL);
    for (int64_t i = 0; i < full; i += VL) {
        const vf xv = V_LOADU(x + i);
        const vf g = V_LOADZ_READABLE(V_MASKV(simd_mask_bits(w, i)), dy + i);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STORE_BF16(dxh + i, all, V_FMA(a, g, t));
    }
    if (tail) {
        const vmaskv tm = V_MASKV(tail);
        const vf xv = V_LOADZ(tm, x + full);
        const vf g = V_LOADZ(V_MASKV(simd_mask_bits(w, full) & tail), dy + full);
        const vf t = V_FMA(b, V_SUB(xv, m), c);
        V_STORE_BF16(dxh + full, tm, V_FMA(a, g, t));
    }
}

static void simd_bn_dx_mask_bf16_n(const float *dy, const float *x, uint16_t *dxh, int64_t s,
                                   int nc, const float *mean, const float *k1, const float *k2,
                                   const float *k3, const uint16_t *mask, ptrdiff_t ahead) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dxh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        simd_bn_dx_mask_bf16(dy + at, x + at, dxh + at, s, mean[i], k1[i], k2[i], k3[i],
                             mask + (size_t)i * CF_MASK_WORDS(s));
    }
}

static void simd_bn_dx_bf16_n(const float *dy, const float *x, uint16_t *dxh, int64_t s, int nc,
                              const float *mean, const float *k1, const float *k2, const float *k3,
                              bool relu, const float *scale, const float *shift, ptrdiff_t ahead) {
    for (int i = 0; i < nc; i++) {
        const size_t at = (size_t)i * (size_t)s;
        if (ahead) cf_prefetch(dxh + at + ahead, (size_t)s * sizeof(uint16_t), true, true);
        simd_bn_dx_bf16(dy + at, x + at, dxh + at, s, mean[i], k1[i], k2[i], k3[i], relu, scale[i],
                        shift[i]);
    }
}
#endif

static const cf_bn_kernels simd_bn_kernels = {
    .shifted_sums = simd_bn_shifted_sums,
    .affine = simd_bn_affine,
    .dy_sums = simd_bn_dy_sums,
    .dx = simd_bn_dx,
    .shifted_sums_n = simd_bn_shifted_sums_n,
    .dy_sums_n = simd_bn_dy_sums_n,
    .affine_n = simd_bn_affine_n,
    .dx_n = simd_bn_dx_n,
    .affine_add2_n = simd_bn_affine_add2_n,
    .fold_mask_n = simd_bn_fold_mask_n,
    .dy_sums_mask_n = simd_bn_dy_sums_mask_n,
    .dx_mask_n = simd_bn_dx_mask_n,
#ifdef V_STORE_BF16
    .dx_bf16_n = simd_bn_dx_bf16_n,
    .affine_bf16_n = simd_bn_affine_bf16_n,
    .dx_mask_bf16_n = simd_bn_dx_mask_bf16_n,
    .fold_mask_bf16_n = simd_bn_fold_mask_bf16_n,
#endif
};

#endif
