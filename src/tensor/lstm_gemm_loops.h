/* C (+)= A op(B) on a packed B (cf_sgemm_packed in corefit/tensor.h), written once over the
 * vector vocabulary of simd_kernels.h (VL, vf, V_ZERO, V_SET1, V_LOADU, V_FMA, V_ADD, V_LOADZ,
 * V_MASKV, simd_store, simd_first_lanes) and included by the vector tables (isa_avx2.c,
 * isa_avx512.c) after simd_kernels.h.
 *
 * The tile is PG_MR rows x 2 vectors (8 x 32 with AVX-512: 16 of 32 zmm accumulators; 6 x 16
 * with AVX2: 12 of 16 ymm). The reduction runs in blocks of PG_KC (the tile's B panel, 16 KB,
 * stays in L1 across the row tiles), grouped in super-blocks of PG_KCB for which every panel is
 * run (A's rows of one super-block stay in L2). Each block starts from zero accumulators and adds
 * to C, so a row's sum is taken in the same order whatever m and the row's place in its tile. */
#ifndef COREFIT_LSTM_GEMM_LOOPS_H
#define COREFIT_LSTM_GEMM_LOOPS_H

#include "tensor/kernel_table.h"

#if VL == 16
#define PG_MR 8
#else
#define PG_MR 6
#endif
#define PG_NR (2 * VL)
#define PG_KC (4096 / PG_NR)
#define PG_KCB 1024
_Static_assert(PG_KCB % PG_KC == 0, "the super-block holds whole blocks");

/* The tile of mr rows over kc values of the reduction: c (+)= a . bp, nc (<= PG_NR) columns. */
CF_INLINE void pg_tile(int mr, int kc, const float *a, int lda, const float *bp, float *c, int ldc,
                       int nc, bool accumulate) {
    vf acc[PG_MR][2];
    for (int i = 0; i < PG_MR; i++) acc[i][0] = acc[i][1] = V_ZERO();
    for (int p = 0; p < kc; p++) {
        const vf b0 = V_LOADU(bp + (size_t)p * PG_NR), b1 = V_LOADU(bp + (size_t)p * PG_NR + VL);
        for (int i = 0; i < mr; i++) {
            const vf av = V_SET1(a[(size_t)i * lda + p]);
            acc[i][0] = V_FMA(av, b0, acc[i][0]);
            acc[i][1] = V_FMA(av, b1, acc[i][1]);
        }
    }
    const unsigned m0 = simd_first_lanes(nc), m1 = simd_first_lanes(nc - VL);
    for (int i = 0; i < mr; i++) {
        float *cp = c + (size_t)i * ldc;
        vf r0 = acc[i][0], r1 = acc[i][1];
        if (accumulate) r0 = V_ADD(r0, V_LOADZ(V_MASKV(m0), cp));
        simd_store(cp, m0, r0);
        if (m1) {
            if (accumulate) r1 = V_ADD(r1, V_LOADZ(V_MASKV(m1), cp + VL));
            simd_store(cp + VL, m1, r1);
        }
    }
}

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
                case 1:
                    pg_tile(1, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
                case 2:
                    pg_tile(2, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
                case 3:
                    pg_tile(3, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
                case 4:
                    pg_tile(4, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
                case 5:
                    pg_tile(5, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
#if PG_MR > 6
                case 6:
                    pg_tile(6, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
                case 7:
                    pg_tile(7, kc, at, lda, bp, ct, ldc, nc, acc);
                    break;
#endif
                default:
                    break;
                }
            }
        }
    }
}

static const cf_packed_gemm_kernels simd_packed_gemm = {.nr = PG_NR, .run = pg_run};

#endif
