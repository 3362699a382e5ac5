/* The AMX level's bf16 kernels (Intel AMX-TILE + AMX-BF16: TDPBF16PS on tiles of up to 16 rows
 * of 64 bytes, fp32 accumulators), written once against a thin layer of tile operations and
 * compiled twice: by isa_amx.c with the real instructions, and by isa_amx_emul.c with a scalar
 * emulation of each instruction (Intel's pseudocode), so that the tiling and indexing below are
 * tested on every x86-64 machine and not only where the CPU has AMX.
 *
 * The including file defines, before including this one:
 *   AMX_CONFIG(cfg)              ldtilecfg of an amx_cfg (zeroes every tile)
 *   AMX_ZERO(t)                  tilezero tmm t
 *   AMX_LOAD(t, base, stride, span)   tileloadd: rows[t] rows of colsb[t] bytes, stride in bytes
 *   AMX_STORE(t, base, stride, span)  tilestored
 *   AMX_DP(c, a, b)              tdpbf16ps: C[m][n] += sum over k pairs of A[m][k] . B[k][n]
 *   AMX_RELEASE()                tilerelease
 *   AMX_TO_BF16(x, y, n)         y = bf16(x) as cf_fp32_to_bf16 (round to nearest even)
 * Tile numbers are literal constants (the instructions encode them). `span` (amx_span) is the part
 * of the operand the kernel's contract (kernel_table.h) lets that load or store touch, computed
 * from the kernel's arguments: the real instructions ignore it; the emulation counts a fault for
 * any tile row outside it. A tile row reaching past its plane, row or pack would read another
 * operand's memory inside one scratch buffer (no sanitizer sees that), and on the hardware a
 * 64-byte row read past a buffer's last page faults where the emulated one need not.
 *
 * Tile configuration is per thread and is loaded by every kernel call on the calling thread (pool
 * threads and fork workers included); each call releases the tiles when it returns.
 *
 *   conv_run    C: 16 output rows x 16 positions (two C tiles: 32 positions per pass); A: the
 *               16 rows' weight pairs, 16 pairs (64 bytes) per row, in the level's own order of
 *               the packed weights (amx_conv_order); B: 16 channel-pair planes x 16 positions
 *               loaded straight from the pair planes with the plane stride at the tap's shift.
 *               A last block of 8 rows and a last pair block of fewer than 16 pairs take tiles
 *               of fewer rows or columns (no read past the planes or the pack).
 *   conv_wgrad  C: 16 rows of dy x 16 channels; A: dy rows as position pairs (16 pairs of one
 *               row are contiguous); B: 16 rows of X0 or X1 (the tap's parity) x 16 channels.
 *               Row, channel and position-pair edges take narrower tiles.
 *   gemm        A packed in 16-row tiles of 16 k-pairs, B in 32-column panels of 16 k-pairs x
 *               16 columns (zero past the edges), 2 x 2 C tiles per 32 x 32 block of C; edge
 *               blocks go through a small buffer, never past C's edges, with the same sums as
 *               inside C: an element's value does not depend on the shape around it (a batch's
 *               size), as the AVX512_BF16 kernel's does not. */
#ifndef COREFIT_AMX_TILES_H
#define COREFIT_AMX_TILES_H

#include "corefit/core.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

#include <stdint.h>
#include <string.h>

static inline void amx_cfg_init(amx_cfg *c) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
}

static inline void amx_cfg_tile(amx_cfg *c, int t, int rows, int colsb) {
    c->rows[t] = (uint8_t)rows;
    c->colsb[t] = (uint16_t)colsb;
}

static inline int amx_min(int a, int b) {
    return a < b ? a : b;
}

/* ---- the convolution's packed weights in tile order ------------------------------------------
 *
 * conv_bf16.c packs a block of weights (taps, pairs, m rows) in blocks of 8 rows, [tap][pair][8
 * rows]. The AMX order holds the same words in blocks of 16 rows (the last of 8 when the rows
 * round up to an odd number of 8s), each [tap][pair block of 16][16 rows][the block's pairs]:
 * a tile's row is 16 consecutive pairs of one output row. Same size, same block starts, so
 * the offsets conv_bf16.c computes stay valid. tmp: 16 * taps * pairs words. */
static void amx_conv_order(uint32_t *packed, int taps, int pairs, int m, uint32_t *tmp) {
    const int mb = (m + 7) / 8 * 8;
    const size_t tp = (size_t)taps * pairs;
    for (int r0 = 0; r0 < mb; r0 += 16) {
        const int rows = amx_min(16, mb - r0);
        uint32_t *blk = packed + (size_t)r0 * tp;
        memcpy(tmp, blk, (size_t)rows * tp * sizeof *tmp);
        for (int t = 0; t < taps; t++)
            for (int p0 = 0; p0 < pairs; p0 += 16) {
                const int kp = amx_min(16, pairs - p0);
                uint32_t *dst = blk + (size_t)t * rows * pairs + (size_t)rows * p0;
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < kp; j++)
                        dst[r * kp + j] = tmp[((size_t)(r / 8) * taps + t) * pairs * 8 +
                                              (size_t)(p0 + j) * 8 + r % 8];
            }
    }
}

/* As the table's conv_run (kernel_table.h), on weights in amx_conv_order's order. */
static void amx_conv_run(int taps, const int *off, int pairs, int m, const uint32_t *packed,
                         const uint32_t *x, size_t plane, int nq, float *out, size_t ldo) {
    const int mb = (m + 7) / 8 * 8, kr = pairs % 16, full = pairs - kr;
    const size_t bstride = plane * sizeof(uint32_t), cstride = ldo * sizeof(float);
    for (int r0 = 0; r0 < mb; r0 += 16) {
        const int rows = amx_min(16, mb - r0);
        amx_cfg cfg;
        amx_cfg_init(&cfg);
        amx_cfg_tile(&cfg, 0, rows, 64); /* C: rows x 16 positions, two of them */
        amx_cfg_tile(&cfg, 1, rows, 64);
        amx_cfg_tile(&cfg, 2, rows, 64); /* A: rows x 16 pairs */
        amx_cfg_tile(&cfg, 4, 16, 64);   /* B: 16 pair planes x 16 positions, two of them */
        amx_cfg_tile(&cfg, 5, 16, 64);
        if (kr) {
            amx_cfg_tile(&cfg, 3, rows, 4 * kr); /* the last pair block's A and Bs */
            amx_cfg_tile(&cfg, 6, kr, 64);
            amx_cfg_tile(&cfg, 7, kr, 64);
        }
        AMX_CONFIG(&cfg);
        const uint32_t *blk = packed + (size_t)r0 * taps * pairs;
        float *o = out + (size_t)r0 * ldo;
        /* the contract: this block's rows of C, q < nq */
        const amx_span cs = amx_span_of(o, (size_t)rows, (size_t)nq * sizeof(float), cstride);
        for (int q = 0; q < nq; q += 32) {
            const int two = q + 32 <= nq;
            AMX_ZERO(0);
            if (two) AMX_ZERO(1);
            for (int t = 0; t < taps; t++) {
                const uint32_t *at = blk + (size_t)t * rows * pairs, *xt = x + off[t] + q;
                /* the tap's weights in the block; planes p < pairs at off[t] + q, q < nq */
                const amx_span as = amx_span_of(at, 1, (size_t)rows * pairs * sizeof(uint32_t), 0),
                               bs = amx_span_of(x + off[t], (size_t)pairs,
                                                (size_t)nq * sizeof(uint32_t), bstride);
                for (int p0 = 0; p0 < full; p0 += 16) {
                    const uint32_t *xp = xt + (size_t)p0 * plane;
                    AMX_LOAD(2, at + (size_t)rows * p0, 64, as);
                    AMX_LOAD(4, xp, bstride, bs);
                    AMX_DP(0, 2, 4);
                    if (two) {
                        AMX_LOAD(5, xp + 16, bstride, bs);
                        AMX_DP(1, 2, 5);
                    }
                }
                if (kr) {
                    const uint32_t *xp = xt + (size_t)full * plane;
                    AMX_LOAD(3, at + (size_t)rows * full, 4 * kr, as);
                    AMX_LOAD(6, xp, bstride, bs);
                    AMX_DP(0, 3, 6);
                    if (two) {
                        AMX_LOAD(7, xp + 16, bstride, bs);
                        AMX_DP(1, 3, 7);
                    }
                }
            }
            AMX_STORE(0, o + q, cstride, cs);
            if (two) AMX_STORE(1, o + q + 16, cstride, cs);
        }
    }
    AMX_RELEASE();
}

/* As the table's conv_wgrad (kernel_table.h). */
static void amx_conv_wgrad(int taps, const int *half, const unsigned char *odd, int m, int ch,
                           int nq2, const uint32_t *a, size_t lda, const uint32_t *b0,
                           const uint32_t *b1, size_t ldb, float *out, size_t ldo, size_t tapo,
                           bool accumulate) {
    const int kr = nq2 % 16, full = nq2 - kr;
    const size_t astride = lda * sizeof(uint32_t), bstride = ldb * sizeof(uint32_t),
                 cstride = ldo * sizeof(float);
    int cur_rows = 0, cur_cols = 0; /* the loaded configuration's C shape */
    /* the contract: a's rows r < m, positions q < nq2 */
    const amx_span as = amx_span_of(a, (size_t)m, (size_t)nq2 * sizeof(uint32_t), astride);
    for (int t = 0; t < taps; t++) {
        const uint32_t *b = (odd[t] ? b1 : b0) + (size_t)half[t] * ldb;
        /* the tap's rows q < nq2 of X0 or X1 from half[t], channels c < ch; its block of out */
        const amx_span bs = amx_span_of(b, (size_t)nq2, (size_t)ch * sizeof(uint32_t), bstride),
                       cs = amx_span_of(out + (size_t)t * tapo, (size_t)m,
                                        (size_t)ch * sizeof(float), cstride);
        for (int r0 = 0; r0 < m; r0 += 16) {
            const int rows = amx_min(16, m - r0);
            const uint32_t *ar = a + (size_t)r0 * lda;
            for (int c0 = 0; c0 < ch; c0 += 16) {
                const int cols = amx_min(16, ch - c0);
                if (rows != cur_rows || cols != cur_cols) {
                    amx_cfg cfg;
                    amx_cfg_init(&cfg);
                    amx_cfg_tile(&cfg, 0, rows, 4 * cols); /* C: rows x cols channels */
                    amx_cfg_tile(&cfg, 1, rows, 64);       /* A: rows x 16 position pairs */
                    amx_cfg_tile(&cfg, 2, 16, 4 * cols);   /* B: 16 pairs x cols channels */
                    if (kr) {
                        amx_cfg_tile(&cfg, 3, rows, 4 * kr);
                        amx_cfg_tile(&cfg, 4, kr, 4 * cols);
                    }
                    AMX_CONFIG(&cfg);
                    cur_rows = rows;
                    cur_cols = cols;
                }
                float *o = out + (size_t)t * tapo + (size_t)r0 * ldo + c0;
                const uint32_t *bc = b + c0;
                if (accumulate)
                    AMX_LOAD(0, o, cstride, cs);
                else
                    AMX_ZERO(0);
                for (int q0 = 0; q0 < full; q0 += 16) {
                    AMX_LOAD(1, ar + q0, astride, as);
                    AMX_LOAD(2, bc + (size_t)q0 * ldb, bstride, bs);
                    AMX_DP(0, 1, 2);
                }
                if (kr) {
                    AMX_LOAD(3, ar + full, astride, as);
                    AMX_LOAD(4, bc + (size_t)full * ldb, bstride, bs);
                    AMX_DP(0, 3, 4);
                }
                AMX_STORE(0, o, cstride, cs);
            }
        }
    }
    AMX_RELEASE();
}

/* ---- the GEMM ---------------------------------------------------------------------------------
 *
 * The packing scratch is the calling thread's, shared with the avx512_bf16 GEMM
 * (cf__bf16_pack_scratch, bf16.c). */

/* Packs `lanes` lanes (rows of A, columns of B) from lane l0, width lanes in all (zero past
 * `lanes`), into tiles of 16 lanes x 16 k-pairs: the word of lane l and pair p at
 * out[((l / 16) * kb + p / 16) * 256 + (l % 16) * 16 + p % 16] when `lane_rows` (A: a tile row is
 * a lane), else at out[((l / 16) * kb + p / 16) * 256 + (p % 16) * 16 + l % 16] (B: a tile row is
 * a k-pair). Element (l, kk) at src[l * lane_step + kk * k_step], one of the steps 1; kb: pair
 * blocks of 16; row: scratch of max(2 * kb * 16, 2 * width) uint16. */
static void amx_pack(const float *src, ptrdiff_t lane_step, ptrdiff_t k_step, int l0, int lanes,
                     int width, int k, int kb, bool lane_rows, uint16_t *row, uint32_t *out) {
    const int kp = kb * 16;
    const size_t tile_stride_l = lane_rows ? 16 : 1, tile_stride_p = lane_rows ? 1 : 16;
#define AMX_AT(l, p)                                                                               \
    (out + ((size_t)((l) / 16) * kb + (p) / 16) * 256 + (size_t)((l) % 16) * tile_stride_l +       \
     (size_t)((p) % 16) * tile_stride_p)
    if (k_step == 1) { /* a lane's k values contiguous: its pairs are its bf16 row read in words */
        for (int l = 0; l < width; l++) {
            memset(row, 0, (size_t)2 * kp * sizeof *row);
            if (l < lanes) AMX_TO_BF16(src + (ptrdiff_t)(l0 + l) * lane_step, row, (size_t)k);
            for (int p = 0; p < kp; p++) {
                uint32_t w;
                memcpy(&w, row + 2 * p, sizeof w);
                *AMX_AT(l, p) = w;
            }
        }
        return;
    }
    /* lanes contiguous: two k rows give every lane's pair */
    uint16_t *lo = row, *hi = row + width;
    for (int p = 0; p < kp; p++) {
        memset(row, 0, (size_t)2 * width * sizeof *row);
        if (2 * p < k) AMX_TO_BF16(src + (ptrdiff_t)(2 * p) * k_step + l0, lo, (size_t)lanes);
        if (2 * p + 1 < k)
            AMX_TO_BF16(src + (ptrdiff_t)(2 * p + 1) * k_step + l0, hi, (size_t)lanes);
        for (int l = 0; l < width; l++) *AMX_AT(l, p) = (uint32_t)lo[l] | (uint32_t)hi[l] << 16;
    }
#undef AMX_AT
}

/* As cf_sgemm_bf16 (kernel_table.h's gemm); false when out of memory. Operands other than with
 * one unit step (never passed by cf_sgemm_bf16) are left to the caller. */
static bool amx_gemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float *c, int ldc, bool accumulate) {
    const int pairs = (k + 1) / 2, kb = (pairs + 15) / 16, mb = (m + 31) / 32 * 32;
    const size_t a_words = (size_t)mb * kb * 16, b_words = (size_t)32 * kb * 16;
    const size_t row_words = (size_t)(kb * 16 > mb ? kb * 16 : mb) + 32;
    uint32_t *ap = cf__bf16_pack_scratch(a_words + b_words + row_words);
    if (!ap) return false;
    uint32_t *bp = ap + a_words;
    uint16_t *row = (uint16_t *)(bp + b_words);
    const ptrdiff_t a_lane = trans_a ? 1 : lda, a_k = trans_a ? lda : 1;
    const ptrdiff_t b_lane = trans_b ? ldb : 1, b_k = trans_b ? 1 : ldb;
    amx_pack(a, a_lane, a_k, 0, m, mb, k, kb, true, row, ap);
    amx_cfg cfg;
    amx_cfg_init(&cfg);
    for (int t = 0; t < 8; t++) amx_cfg_tile(&cfg, t, 16, 64);
    AMX_CONFIG(&cfg);
    float edge[4][256];
    const size_t cstride = (size_t)ldc * sizeof(float);
    /* the packed tiles, C's m x n, the edge buffer */
    const amx_span as = amx_span_of(ap, 1, a_words * sizeof(uint32_t), 0),
                   bs = amx_span_of(bp, 1, b_words * sizeof(uint32_t), 0),
                   cs = amx_span_of(c, (size_t)m, (size_t)n * sizeof(float), cstride),
                   es = amx_span_of(edge, 1, sizeof edge, 0);
    for (int j0 = 0; j0 < n; j0 += 32) {
        amx_pack(b + (trans_b ? (ptrdiff_t)j0 * ldb : j0), b_lane, b_k, 0, amx_min(32, n - j0), 32,
                 k, kb, false, row, bp);
        for (int i0 = 0; i0 < m; i0 += 32) {
            const uint32_t *a0 = ap + (size_t)(i0 / 16) * kb * 256, *a1 = a0 + (size_t)kb * 256,
                           *bq0 = bp, *bq1 = bp + (size_t)kb * 256;
            float *cij = c + (size_t)i0 * ldc + j0;
            const bool inside = i0 + 32 <= m && j0 + 32 <= n;
            const int rows = amx_min(32, m - i0), cols = amx_min(32, n - j0);
            if (!inside && accumulate) { /* C's part of the block, zero around it */
                memset(edge, 0, sizeof edge);
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < cols; j++)
                        edge[(r / 16) * 2 + j / 16][(r % 16) * 16 + j % 16] =
                            cij[(size_t)r * ldc + j];
            }
            if (inside && accumulate) {
                AMX_LOAD(0, cij, cstride, cs);
                AMX_LOAD(1, cij + 16, cstride, cs);
                AMX_LOAD(2, cij + (size_t)16 * ldc, cstride, cs);
                AMX_LOAD(3, cij + (size_t)16 * ldc + 16, cstride, cs);
            } else if (accumulate) { /* the same sums as inside C, so no element depends on
                                        where the edges fall (a batch's size) */
                AMX_LOAD(0, edge[0], 64, es);
                AMX_LOAD(1, edge[1], 64, es);
                AMX_LOAD(2, edge[2], 64, es);
                AMX_LOAD(3, edge[3], 64, es);
            } else {
                AMX_ZERO(0);
                AMX_ZERO(1);
                AMX_ZERO(2);
                AMX_ZERO(3);
            }
            for (int q = 0; q < kb; q++) {
                AMX_LOAD(4, a0 + (size_t)q * 256, 64, as);
                AMX_LOAD(5, a1 + (size_t)q * 256, 64, as);
                AMX_LOAD(6, bq0 + (size_t)q * 256, 64, bs);
                AMX_LOAD(7, bq1 + (size_t)q * 256, 64, bs);
                AMX_DP(0, 4, 6);
                AMX_DP(1, 4, 7);
                AMX_DP(2, 5, 6);
                AMX_DP(3, 5, 7);
            }
            if (inside) {
                AMX_STORE(0, cij, cstride, cs);
                AMX_STORE(1, cij + 16, cstride, cs);
                AMX_STORE(2, cij + (size_t)16 * ldc, cstride, cs);
                AMX_STORE(3, cij + (size_t)16 * ldc + 16, cstride, cs);
                continue;
            }
            AMX_STORE(0, edge[0], 64, es);
            AMX_STORE(1, edge[1], 64, es);
            AMX_STORE(2, edge[2], 64, es);
            AMX_STORE(3, edge[3], 64, es);
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < cols; j++)
                    cij[(size_t)r * ldc + j] = edge[(r / 16) * 2 + j / 16][(r % 16) * 16 + j % 16];
        }
    }
    AMX_RELEASE();
    return true;
}

#endif
