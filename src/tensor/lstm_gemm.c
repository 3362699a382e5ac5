/* GEMM on a packed B operand (cf_sgemm_packed in corefit/tensor.h): the LSTM's recurrent
 * products, whose weight is fixed over the timesteps of a batch, packed once a forward (and once
 * a backward for the transposed product) instead of by BLAS at every step. The vector tables run
 * tensor/lstm_gemm_loops.h; a table without the entry (or the reference mode of
 * cf_kernels_set_reference) runs the portable tile below, on panels of PG_NR columns, in the
 * same loops (tensor/packed_gemm_run.h). */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <string.h>

#define PG_MR 4
#define PG_NR 8
#define PG_KC 512
#define PG_KCB 1024

static const cf_packed_gemm_kernels *packed_kernels(void) {
    return cf_kernels_reference() ? NULL : cf_active_kernels->packed_gemm;
}

int cf_sgemm_packed_nr(void) {
    const cf_packed_gemm_kernels *pk = packed_kernels();
    return pk ? pk->nr : PG_NR;
}

size_t cf_sgemm_packed_floats(int n, int k) {
    const size_t nr = (size_t)cf_sgemm_packed_nr();
    if (n <= 0 || k <= 0) return 0;
    return ((size_t)n + nr - 1) / nr * nr * (size_t)k;
}

void cf_sgemm_pack_b(bool trans_b, int n, int k, const float *b, int ldb, float *packed) {
    const int nr = cf_sgemm_packed_nr();
    if (trans_b) { /* op(B)(p, j) = B[j][p]: a block of 64 values of p at a time */
        for (int j0 = 0; j0 < n; j0 += nr) {
            const int nc = n - j0 < nr ? n - j0 : nr;
            float *panel = packed + (size_t)(j0 / nr) * k * nr;
            for (int p0 = 0; p0 < k; p0 += 64) {
                const int p1 = p0 + 64 < k ? p0 + 64 : k;
                for (int j = 0; j < nr; j++) {
                    if (j < nc) {
                        const float *bj = b + (size_t)(j0 + j) * ldb;
                        for (int p = p0; p < p1; p++) panel[(size_t)p * nr + j] = bj[p];
                    } else
                        for (int p = p0; p < p1; p++) panel[(size_t)p * nr + j] = 0.0f;
                }
            }
        }
        return;
    }
    /* op(B) = B: a block of 64 rows at a time (in cache) copied into every panel, so that the
     * rows are read in order rather than one panel's strip of each row at a time */
    for (int p0 = 0; p0 < k; p0 += 64) {
        const int p1 = p0 + 64 < k ? p0 + 64 : k;
        for (int j0 = 0; j0 < n; j0 += nr) {
            const int nc = n - j0 < nr ? n - j0 : nr;
            float *panel = packed + (size_t)(j0 / nr) * k * nr;
            for (int p = p0; p < p1; p++) {
                float *dst = panel + (size_t)p * nr;
                memcpy(dst, b + (size_t)p * ldb + j0, (size_t)nc * sizeof(float));
                for (int j = nc; j < nr; j++) dst[j] = 0.0f;
            }
        }
    }
}

/* The portable tile: mr rows x PG_NR columns over kc values (the same order as the vector
 * tables' loops: one block's sum from zero, then added to C). */
static inline __attribute__((always_inline)) void pg_tile(int mr, int kc, const float *a, int lda,
                                                          const float *bp, float *c, int ldc,
                                                          int nc, bool accumulate) {
    float acc[PG_MR][PG_NR] = {{0}};
    for (int p = 0; p < kc; p++) {
        const float *b = bp + (size_t)p * PG_NR;
        for (int i = 0; i < mr; i++) {
            const float av = a[(size_t)i * lda + p];
            for (int j = 0; j < PG_NR; j++) acc[i][j] += av * b[j];
        }
    }
    for (int i = 0; i < mr; i++) {
        float *cp = c + (size_t)i * ldc;
        for (int j = 0; j < nc; j++) cp[j] = accumulate ? cp[j] + acc[i][j] : acc[i][j];
    }
}

#include "tensor/packed_gemm_run.h"

void cf_sgemm_packed(int m, int n, int k, const float *a, int lda, const float *packed, float *c,
                     int ldc, bool accumulate) {
    const cf_packed_gemm_kernels *pk = packed_kernels();
    (pk ? pk->run : pg_run)(m, n, k, a, lda, packed, c, ldc, accumulate);
}
