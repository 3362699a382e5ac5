/* Choosing the kernel table: once, when the library is loaded, from what the CPU reports
 * (cpuid through the compiler's __builtin_cpu_supports on x86-64; NEON is part of every arm64
 * CPU), capped by the environment variable CF_ISA. (OpenBLAS's own kernels and threads are set
 * beside the thread pool, src/core/threads.c.)
 */
#include "corefit/tensor.h"
#include "tensor/kernel_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const cf_kernel_table *cf_active_kernels = &cf_kernels_generic;

static const cf_kernel_table *table_for(cf_isa isa) {
#if defined(__x86_64__)
    if (isa == CF_ISA_AVX512) return &cf_kernels_avx512;
    if (isa == CF_ISA_AVX2) return &cf_kernels_avx2;
#endif
#if defined(__aarch64__)
    if (isa == CF_ISA_NEON) return &cf_kernels_neon;
#endif
    (void)isa;
    return &cf_kernels_generic;
}

cf_isa cf_isa_best(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* every extension each table is compiled with (the compiler may use any of them) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("avx2"))
        return CF_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CF_ISA_AVX2;
#endif
#if defined(__aarch64__)
    return CF_ISA_NEON;
#endif
    return CF_ISA_GENERIC;
}

const char *cf_isa_name(cf_isa isa) {
    switch (isa) {
    case CF_ISA_NEON:
        return "neon";
    case CF_ISA_AVX512:
        return "avx512";
    case CF_ISA_AVX2:
        return "avx2";
    case CF_ISA_GENERIC:
        return "generic";
    }
    return "unknown";
}

bool cf_isa_parse(const char *name, cf_isa *isa) {
    static const cf_isa all[] = {CF_ISA_GENERIC, CF_ISA_AVX2, CF_ISA_AVX512, CF_ISA_NEON};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, cf_isa_name(all[i])) == 0) {
            *isa = all[i];
            return true;
        }
    return false;
}

cf_isa cf_isa_active(void) {
    return cf_active_kernels->isa;
}

cf_isa cf_set_isa(cf_isa cap) {
    cf_isa best = cf_isa_best();
    cf_active_kernels = table_for(cap < best ? cap : best);
    return cf_active_kernels->isa;
}

/* Runs before main (and before any constructor of a program linked against the library uses
 * it): a library cannot report an error here, so an unknown CF_ISA is named on stderr, once,
 * and ignored. */
__attribute__((constructor)) static void cf_isa_init(void) {
    const cf_isa no_cap = CF_ISA_NEON; /* the last of cf_isa */
    cf_isa cap = no_cap;
    const char *env = getenv("CF_ISA");
    if (env && *env && !cf_isa_parse(env, &cap)) {
        fprintf(stderr, "corefit: CF_ISA=%s is not one of generic, avx2, avx512, neon; ignored\n",
                env);
        cap = no_cap;
    }
    cf_set_isa(cap);
}
