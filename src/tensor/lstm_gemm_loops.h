/* C (+)= A op(B) on a packed B (cf_sgemm_packed in corefit/tensor.h), written once over the
 * vector vocabulary of simd_kernels.h (VL, vf, V_ZERO, V_SET1, V_LOADU, V_FMA, V_ADD, V_LOADZ,
 * V_MASKV, simd_store, simd_first_lanes) and included by the vector tables (isa_avx2.c,
 * isa_avx512.c) after simd_kernels.h.
 *
 * The tile is PG_MR rows x 2 vectors (8 x 32 with AVX-512: 16 of 32 zmm accumulators; 6 x 16
 * with AVX2: 12 of 16 ymm); a block of PG_KC values of the reduction makes the tile's B panel
 * 16 KB. The loops over tiles and blocks (pg_run) are tensor/packed_gemm_run.h's, shared with
 * the portable run. */
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

#include "tensor/packed_gemm_run.h"

static const cf_packed_gemm_kernels simd_packed_gemm = {.nr = PG_NR, .run = pg_run};

#endif
