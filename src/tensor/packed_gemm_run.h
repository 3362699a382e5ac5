/* The loops of C (+)= A op(B) on a packed B (cf_sgemm_packed in corefit/tensor.h), written once
 * for the portable run (lstm_gemm.c) and the vector tables' (lstm_gemm_loops.h). The including
 * file defines, before including this:
 *
 *   PG_MR    rows of the tile (4 to 8)          PG_NR   columns of a panel (and of the tile)
 *   PG_KC    a block of the reduction           PG_KCB  a super-block (a multiple of PG_KC)
 *   pg_tile  CF_INLINE-style (always inlined) tile of mr <= PG_MR rows over kc values:
 *            void pg_tile(int mr, int kc, const float *a, int lda, const float *bp, float *c,
 *                         int ldc, int nc, bool accumulate)
 *            c (+)= a . bp on nc <= PG_NR columns (the block's sum from zero, then added to C)
 *
 * and gets `static void pg_run(m, n, k, a, lda, packed, c, ldc, accumulate)`. The reduction runs
 * in blocks of PG_KC (the tile's B panel stays in L1 across the row tiles), grouped in
 * super-blocks of PG_KCB for which every panel is run (A's rows of one super-block stay in L2).
 * Each block starts from zero accumulators and adds to C, so a row's sum is taken in the same
 * order whatever m and the row's place in its tile. The last m % PG_MR rows call pg_tile with a
 * constant height each, so that every height is its own instance. Included once per file. */
#ifndef COREFIT_PACKED_GEMM_RUN_H
#define COREFIT_PACKED_GEMM_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#if !defined(PG_MR) || !defined(PG_NR) || !defined(PG_KC) || !defined(PG_KCB)
#error "define PG_MR, PG_NR, PG_KC and PG_KCB before including tensor/packed_gemm_run.h"
#endif
_Static_assert(PG_MR >= 2 && PG_MR <= 8, "the last rows' instances cover tiles of 2 to 8 rows");
_Static_assert(PG_KCB % PG_KC == 0, "the super-block holds whole blocks");

/* The tile of the last h rows (h < PG_MR), a constant height. */
#define PG_LAST_ROWS(h)                                                                            \
    case h:                                                                                        \
        pg_tile(h, kc, at, lda, bp, ct, ldc, nc, acc);                                             \
        break;

static void pg_run(int m, int n, int k, const float *a, int lda, const float *packed, float *c,
                   int ldc, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate)
            for (int i = 0; i < m; i++) memset(c + (size_t)i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    for (int pb = 0; pb < k; pb += PG_KCB) {
        const int pb_end = pb + PG_KCB < k ? pb + PG_KCB : k;
        for (int j0 = 0; j0 < n; j0 += PG_NR) {
            const int nc = n - j0 < PG_NR ? n - j0 : PG_NR;
            const float *panel = packed + (size_t)(j0 / PG_NR) * k * PG_NR;
            for (int p0 = pb; p0 < pb_end; p0 += PG_KC) {
                const int kc = pb_end - p0 < PG_KC ? pb_end - p0 : PG_KC;
                const bool acc = accumulate || p0 > 0;
                const float *bp = panel + (size_t)p0 * PG_NR;
                int i0 = 0;
                for (; i0 + PG_MR <= m; i0 += PG_MR)
                    pg_tile(PG_MR, kc, a + (size_t)i0 * lda + p0, lda, bp,
                            c + (size_t)i0 * ldc + j0, ldc, nc, acc);
                const float *at = a + (size_t)i0 * lda + p0;
                float *ct = c + (size_t)i0 * ldc + j0;
                switch (m - i0) { /* the last rows: one instance per height */
                    PG_LAST_ROWS(1)
#if PG_MR > 2
                    PG_LAST_ROWS(2)
#endif
#if PG_MR > 3
                    PG_LAST_ROWS(3)
#endif
#if PG_MR > 4
                    PG_LAST_ROWS(4)
#endif
#if PG_MR > 5
                    PG_LAST_ROWS(5)
#endif
#if PG_MR > 6
                    PG_LAST_ROWS(6)
#endif
#if PG_MR > 7
                    PG_LAST_ROWS(7)
#endif
                default:
                    break;
                }
            }
        }
    }
}

#undef PG_LAST_ROWS

#endif
