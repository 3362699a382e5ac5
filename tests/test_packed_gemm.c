/* cf_sgemm_pack_b and cf_sgemm_packed (the LSTM's recurrent products) at every instruction set
 * up to the active one (each capped with cf_set_isa) and on the portable loops
 * (cf_kernels_set_reference): against the product in double on every tile edge (rows 1..17 and
 * 64, columns around each panel width, reductions across the blocks of 128-512 and the
 * super-blocks of 1024), B read both ways, accumulate or not, C's columns past n untouched; the
 * rows of one product equal bitwise those of the same product split in two at any row (what
 * keeps a split batch equal to one process); the pack writes exactly cf_sgemm_packed_floats. */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/tensor.h"

static void fill(cf_rng *rng, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * cf_rng_uniform(rng) - 1.0);
}

static void check_case(const char *isa, int m, int n, int k, bool trans_b, bool accumulate,
                       cf_rng *rng) {
    const int lda = k + 3, ldc = n + 4, ldb = trans_b ? k + 2 : n + 2;
    const size_t nb = trans_b ? (size_t)n * ldb : (size_t)k * ldb;
    const size_t np = cf_sgemm_packed_floats(n, k);
    const int nr = cf_sgemm_packed_nr();
    assert_true(np == (size_t)((n + nr - 1) / nr) * nr * k);
    float *a = malloc((size_t)m * lda * sizeof(float)), *b = malloc(nb * sizeof(float));
    float *packed = malloc((np + 1) * sizeof(float)); /* one guard float */
    float *c0 = malloc((size_t)m * ldc * sizeof(float)),
          *c1 = malloc((size_t)m * ldc * sizeof(float)),
          *c2 = malloc((size_t)m * ldc * sizeof(float));
    fill(rng, a, (size_t)m * lda);
    fill(rng, b, nb);
    fill(rng, c0, (size_t)m * ldc);
    memcpy(c1, c0, (size_t)m * ldc * sizeof(float));
    memcpy(c2, c0, (size_t)m * ldc * sizeof(float));
    packed[np] = 12345.0f;
    cf_sgemm_pack_b(trans_b, n, k, b, ldb, packed);
    if (packed[np] != 12345.0f) fail_msg("%s: the pack of %dx%d wrote past its size", isa, k, n);
    cf_sgemm_packed(m, n, k, a, lda, packed, c1, ldc, accumulate);
    const int split = m / 3 + 1; /* the same rows in two products */
    cf_sgemm_packed(split, n, k, a, lda, packed, c2, ldc, accumulate);
    if (split < m)
        cf_sgemm_packed(m - split, n, k, a + (size_t)split * lda, lda, packed,
                        c2 + (size_t)split * ldc, ldc, accumulate);
    if (memcmp(c1, c2, (size_t)m * ldc * sizeof(float)) != 0)
        fail_msg("%s m=%d n=%d k=%d: rows split at %d differ from one product", isa, m, n, k,
                 split);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            const float got = c1[(size_t)i * ldc + j], was = c0[(size_t)i * ldc + j];
            if (j >= n) {
                if (memcmp(&got, &was, sizeof got) != 0)
                    fail_msg("%s m=%d n=%d k=%d: column %d past n written", isa, m, n, k, j);
                continue;
            }
            double want = accumulate ? was : 0.0, mag = accumulate ? fabs(was) : 0.0;
            for (int p = 0; p < k; p++) {
                const double bv = trans_b ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
                want += (double)a[(size_t)i * lda + p] * bv;
                mag += fabs((double)a[(size_t)i * lda + p] * bv);
            }
            if (fabs(got - want) > 1e-5 * mag + 1e-30)
                fail_msg("%s m=%d n=%d k=%d trans_b=%d acc=%d: C[%d,%d] = %.9g, want %.9g", isa, m,
                         n, k, trans_b, accumulate, i, j, (double)got, want);
        }
    free(a);
    free(b);
    free(packed);
    free(c0);
    free(c1);
    free(c2);
}

static void check_all(const char *isa, cf_rng *rng) {
    static const int ms[] = {1, 2, 3, 5, 6, 7, 8, 9, 13, 17, 64};
    static const int ns[] = {1, 7, 8, 9, 16, 17, 31, 32, 33, 70};
    static const int ks[] = {1, 3, 130, 600, 1100};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int k = ks[ki];
                if (k > 600 && ms[mi] % 4 != 1 && ms[mi] != 64) continue; /* keep it short */
                check_case(isa, ms[mi], ns[ni], k, (mi + ni) % 2 == 0, (mi + ki) % 2 == 1, rng);
            }
}

static void test_packed_gemm_every_isa(void **state) {
    (void)state;
    const cf_isa active = cf_isa_active();
    static const cf_isa levels[] = {CF_ISA_GENERIC, CF_ISA_AVX2, CF_ISA_AVX512};
    cf_rng rng;
    cf_rng_seed(&rng, 29);
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        if (levels[i] > active) break;
        cf_set_isa(levels[i]);
        check_all(cf_isa_name(cf_isa_active()), &rng);
    }
    cf_set_isa(active);
    cf_kernels_set_reference(true);
    check_all("reference", &rng);
    cf_kernels_set_reference(false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_gemm_every_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
