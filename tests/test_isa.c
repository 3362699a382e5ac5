/* The instruction-set dispatch and the default thread configuration: CF_ISA caps the kernels
 * (ctest runs the kernel tests under each cap, tests/isa.cmake), names parse both ways, and a
 * program that never calls cf_set_num_threads has OpenBLAS held to one thread, inside corefit's
 * pool and outside it (a BLAS call inside a pool job must not start threads of its own). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corefit/core.h"
#include "corefit/tensor.h"

/* Read before anything else runs: the configuration a program gets by default. */
static int blas_threads_at_start;
static char blas_core_at_start[32];

#if defined(__x86_64__)
/* Exported by DYNAMIC_ARCH builds of OpenBLAS (Debian's), which corefit reselects through. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
#endif

static void test_default_blas_threads(void **state) {
    (void)state;
    /* this test runs without OPENBLAS_NUM_THREADS (tests/isa.cmake), so OpenBLAS would use
     * every core if corefit did not hold it */
    assert_null(getenv("OPENBLAS_NUM_THREADS"));
    assert_int_equal(blas_threads_at_start, 1);
}

static _Atomic int blas_threads_seen[64];

static void record_blas_threads(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)ctx;
    (void)begin;
    (void)end;
    if (thread < 64) atomic_store(&blas_threads_seen[thread], openblas_get_num_threads());
}

static void test_blas_threads_inside_pool(void **state) {
    (void)state;
    /* the pool at its default size (every core), never configured by this program */
    const int n = cf_get_num_threads();
    for (int i = 0; i < 64; i++) atomic_store(&blas_threads_seen[i], -1);
    cf_parallel_for(n, record_blas_threads, NULL);
    for (int i = 0; i < n && i < 64; i++) assert_int_equal(atomic_load(&blas_threads_seen[i]), 1);
}

static void test_names(void **state) {
    (void)state;
    const cf_isa all[] = {CF_ISA_GENERIC, CF_ISA_AVX2, CF_ISA_AVX512, CF_ISA_AVX512_BF16,
                          CF_ISA_AMX};
    for (int i = 0; i < 5; i++) {
        cf_isa back = (cf_isa)-1;
        assert_true(cf_isa_parse(cf_isa_name(all[i]), &back));
        assert_int_equal(back, all[i]);
    }
    cf_isa untouched = CF_ISA_AVX2;
    assert_false(cf_isa_parse("sse9", &untouched));
    assert_false(cf_isa_parse(NULL, &untouched));
    assert_int_equal(untouched, CF_ISA_AVX2);
}

/* The kernels in use are the best the CPU has, capped by CF_ISA when it is set. */
static void test_env_cap(void **state) {
    (void)state;
    const cf_isa best = cf_isa_best();
    cf_isa want = best;
    const char *env = getenv("CF_ISA");
    if (env && *env) {
        cf_isa cap;
        assert_true(cf_isa_parse(env, &cap));
        want = cap < best ? cap : best;
    }
    assert_int_equal(cf_isa_active(), want);
    print_message("kernels: %s (best on this CPU: %s)\n", cf_isa_name(cf_isa_active()),
                  cf_isa_name(best));
}

static void test_set_isa(void **state) {
    (void)state;
    const cf_isa before = cf_isa_active(), best = cf_isa_best();
    assert_int_equal(cf_set_isa(CF_ISA_GENERIC), CF_ISA_GENERIC);
    assert_int_equal(cf_isa_active(), CF_ISA_GENERIC);
    /* a cap above the CPU gives the best it has */
    assert_int_equal(cf_set_isa(CF_ISA_AMX), best);
    cf_set_isa(before);
    assert_int_equal(cf_isa_active(), before);
}

/* OpenBLAS's kernels follow corefit's instruction set (CF_ISA at load, cf_set_isa later), unless
 * the user chose them with OPENBLAS_CORETYPE, and still give the right product on one thread.
 * (ctest runs this without OPENBLAS_CORETYPE, and once with it, tests/isa.cmake.) */
static void test_blas_follows_isa(void **state) {
    (void)state;
#if defined(__x86_64__)
    if (!gotoblas_dynamic_init) skip();
    const cf_isa before = cf_isa_active(), best = cf_isa_best();
    if (getenv("OPENBLAS_CORETYPE")) { /* the user's choice stands under every cap */
        for (int isa = CF_ISA_GENERIC; isa <= (int)best; isa++) {
            cf_set_isa((cf_isa)isa);
            assert_string_equal(cf_blas_core(), blas_core_at_start);
        }
        cf_set_isa(before);
        return;
    }
    /* below the CPU's best, the capped set's kernels; at the best, OpenBLAS's own choice when it
     * is of that set (Cooperlake, say, on a CPU with AVX-512 BF16), else SkylakeX or Haswell */
    static const char *const expect[] = {"Nehalem",  "Haswell", "SkylakeX",
                                         "SkylakeX", NULL,      "SkylakeX"};
    static const char *const same_level[][3] = {{"Nehalem", NULL, NULL},
                                                {"Haswell", "Zen", NULL},
                                                {"SkylakeX", NULL, NULL},
                                                {"SkylakeX", "Cooperlake", "SapphireRapids"},
                                                {NULL, NULL, NULL}, /* neon */
                                                {"SkylakeX", "Cooperlake", "SapphireRapids"}};
    print_message("OpenBLAS kernels at load: %s\n", blas_core_at_start);
    enum { M = 45, N = 67, K = 39 };
    static float a[M * K], b[K * N], ref[M * N], got[M * N];
    for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7919) % 201 - 100) / 100.0f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((i * 104729) % 199 - 99) / 99.0f;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0;
            for (int k = 0; k < K; k++) sum += (double)a[i * K + k] * b[k * N + j];
            ref[i * N + j] = (float)sum;
        }
    for (int isa = CF_ISA_GENERIC; isa <= (int)best; isa++) {
        if (isa == CF_ISA_NEON) continue; /* not an x86-64 level (amx follows avx512_bf16) */
        cf_set_isa((cf_isa)isa);
        const char *core = cf_blas_core();
        bool ok = strcmp(core, expect[isa]) == 0;
        /* avx512_bf16 below amx keeps OpenBLAS's own choice too (the same kernels' level) */
        const bool own = isa == (int)best || (isa == CF_ISA_AVX512_BF16 && best == CF_ISA_AMX);
        for (int i = 0; i < 3 && own && !ok; i++)
            ok = same_level[isa][i] && strcmp(core, same_level[isa][i]) == 0;
        if (!ok) fail_msg("cap %s: OpenBLAS kernels %s", cf_isa_name((cf_isa)isa), core);
        if (isa == (int)before) assert_string_equal(core, blas_core_at_start);
        assert_int_equal(openblas_get_num_threads(), 1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, got, N);
        for (int i = 0; i < M * N; i++) assert_float_equal(got[i], ref[i], 1e-4);
    }
    cf_set_isa(before);
#else
    skip();
#endif
}

/* The same small product through every table the CPU supports agrees to rounding. */
static void test_tables_agree(void **state) {
    (void)state;
    enum { M = 13, N = 37, K = 29 };
    float a[M * K], b[K * N], ref[M * N], got[M * N];
    for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7919) % 201 - 100) / 100.0f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((i * 104729) % 199 - 99) / 99.0f;
    const cf_isa before = cf_isa_active();
    cf_kernels_set_reference(true);
    cf_sgemm_strided(M, N, K, a, K, 1, b, N, ref, N, false);
    cf_kernels_set_reference(false);
    for (int isa = CF_ISA_GENERIC; isa <= (int)cf_isa_best(); isa++) {
        cf_set_isa((cf_isa)isa);
        memset(got, 0, sizeof got);
        cf_sgemm_strided(M, N, K, a, K, 1, b, N, got, N, false);
        for (int i = 0; i < M * N; i++) assert_float_equal(got[i], ref[i], 1e-4);
    }
    cf_set_isa(before);
}

int main(void) {
    blas_threads_at_start = openblas_get_num_threads();
    snprintf(blas_core_at_start, sizeof blas_core_at_start, "%s", cf_blas_core());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_blas_threads),
        cmocka_unit_test(test_blas_threads_inside_pool),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_env_cap),
        cmocka_unit_test(test_set_isa),
        cmocka_unit_test(test_tables_agree),
        cmocka_unit_test(test_blas_follows_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
