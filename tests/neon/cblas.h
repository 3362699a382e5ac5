/* The one CBLAS call of the tensor layer (src/tensor/kernels.c), declared for the arm64 kernel
 * test (tests/neon_kernels.c), which is built without an arm64 OpenBLAS and defines
 * cblas_sgemm itself as plain loops. */
#ifndef COREFIT_TEST_NEON_CBLAS_H
#define COREFIT_TEST_NEON_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a, enum CBLAS_TRANSPOSE trans_b,
                 int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc);

#endif
