/* Choosing the kernel table: once, when the library is loaded, from what the CPU reports
 * (cpuid through the compiler's __builtin_cpu_supports on x86-64; NEON is part of every arm64
 * CPU), capped by the environment variable CF_ISA; and OpenBLAS's kernels to match (below).
 * (OpenBLAS's threads are set beside the thread pool, src/core/threads.c.)
 */
#include "corefit/tensor.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

const cf_kernel_table *cf_active_kernels = &cf_kernels_generic;

#if defined(__x86_64__)
/* The AVX512_BF16 level: the AVX-512 table with the bf16 kernels added, and its Winograd
 * transforms with the bf16 conversion instructions (isa_avx512_bf16_wino.c). */
static cf_kernel_table avx512_bf16_table;
/* The AMX level: the AVX512_BF16 one with the tile kernels (isa_amx.c) in its bf16 kernels
 * (only made active where cf_isa_best() is CF_ISA_AMX). */
static cf_kernel_table amx_table;
static cf_bf16_kernels amx_bf16;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* Filled once (by the constructor below, before any kernel runs) and never written again: a
 * later cf_set_isa only moves cf_active_kernels, so threads still running kernels from these
 * tables never see them change under them. */
static void tables_make(void) {
    avx512_bf16_table = cf_kernels_avx512;
    avx512_bf16_table.isa = CF_ISA_AVX512_BF16;
    avx512_bf16_table.bf16 = &cf_bf16_kernels_avx512;
    avx512_bf16_table.wino = cf_wino_avx512_bf16;
    amx_table = avx512_bf16_table;
    amx_table.isa = CF_ISA_AMX;
    amx_bf16 = cf_bf16_kernels_avx512;
    cf_amx_kernels(&amx_bf16);
    amx_table.bf16 = &amx_bf16;
}
#endif

static const cf_kernel_table *table_for(cf_isa isa) {
#if defined(__x86_64__)
    (void)pthread_once(&tables_once, tables_make);
    if (isa == CF_ISA_AMX) return &amx_table;
    if (isa == CF_ISA_AVX512_BF16) return &avx512_bf16_table;
    if (isa == CF_ISA_AVX512) return &cf_kernels_avx512;
    if (isa == CF_ISA_AVX2) return &cf_kernels_avx2;
#endif
#if defined(__aarch64__)
    if (isa == CF_ISA_NEON) return &cf_kernels_neon;
#endif
    (void)isa;
    return &cf_kernels_generic;
}

#if defined(__x86_64__)
/* AMX needs the CPU's AMX-TILE and AMX-BF16 (cpuid leaf 7: edx bits 24 and 22) and the
 * kernel's leave to use the tile data state (Linux 5.16 on: arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, once per process, inherited by forked workers; without it the first tile
 * instruction faults). When the CPU has AMX but the request fails, the reason is said once.
 * Asked once per process through pthread_once: cf_isa_best() may be called from any thread, and
 * the request and its message must not be made twice, nor the answer read half written. */
static bool amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_request(void) {
    amx_granted = false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return;
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    unsigned long perm = 0;
    errno = 0; /* so that the message below names this request's failure, not an earlier one */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0 ||
        syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0 ||
        !(perm & (1ul << XFEATURE_XTILEDATA))) {
        /* ENOSPC: some thread's alternate signal stack (sigaltstack) is smaller than a signal
         * frame holding the tile state, as in a host program that set one up before loading
         * the library: the kernel then refuses rather than fail a later signal delivery */
        const int e = errno;
        fprintf(stderr,
                "corefit: the CPU has AMX but the kernel did not grant the tile state "
                "(arch_prctl ARCH_REQ_XCOMP_PERM: %s%s); using avx512_bf16\n",
                e ? strerror(e) : "not in the permitted set",
                e == ENOSPC ? ": an alternate signal stack is too small for the tile state" : "");
        return;
    }
    amx_granted = true;
}

static bool amx_usable(void) {
    (void)pthread_once(&amx_once, amx_request);
    return amx_granted;
}
#endif

cf_isa cf_isa_best(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* every extension each table is compiled with (the compiler may use any of them) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("avx2"))
        return !__builtin_cpu_supports("avx512bf16") ? CF_ISA_AVX512
               : amx_usable()                        ? CF_ISA_AMX
                                                     : CF_ISA_AVX512_BF16;
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
    case CF_ISA_AVX512_BF16:
        return "avx512_bf16";
    case CF_ISA_AMX:
        return "amx";
    case CF_ISA_AVX2:
        return "avx2";
    case CF_ISA_GENERIC:
        return "generic";
    }
    return "unknown";
}

bool cf_isa_parse(const char *name, cf_isa *isa) {
    static const cf_isa all[] = {CF_ISA_GENERIC,     CF_ISA_AVX2, CF_ISA_AVX512,
                                 CF_ISA_AVX512_BF16, CF_ISA_NEON, CF_ISA_AMX};
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

/* ---- OpenBLAS's kernels follow corefit's ------------------------------------------------------
 * Debian's OpenBLAS (a DYNAMIC_ARCH build) picks its kernels from the CPU model when it loads,
 * whatever CF_ISA says, and knows no CPU newer than its release: it falls back to its generic
 * kernels on some Xeons (SGEMM at a fifth of the speed) and gives AMD CPUs with AVX-512 its AVX2
 * kernels. Unless the user chose a core with OPENBLAS_CORETYPE, corefit asks OpenBLAS, through
 * its own dynamic-arch entry points, for the kernels of the instruction set corefit's kernels
 * use: SkylakeX at avx512, Haswell at avx2, Nehalem (SSE only) at generic. A build of OpenBLAS
 * without those entry points keeps its own choice; cf_blas_core() names the one in use. */
#if defined(__x86_64__)
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

/* The level of an OpenBLAS x86-64 core's kernels: 4 AVX-512 with BF16, 3 AVX-512, 2 AVX2,
 * 1 AVX, 0 SSE. */
static int blas_core_level(const char *name) {
    static const char *const levels[][4] = {
        {"Cooperlake", "SapphireRapids", NULL, NULL},
        {"SkylakeX", NULL, NULL, NULL},
        {"Haswell", "Zen", "Excavator", NULL},
        {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"},
    };
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 4 && levels[l][i]; i++)
            if (name && strcmp(name, levels[l][i]) == 0) return 4 - l;
    return 0;
}

static void blas_follow_isa(cf_isa isa) {
    if (getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    static int own_level = -1; /* of OpenBLAS's own choice, seen at the first call (at load) */
    if (own_level < 0) own_level = blas_core_level(openblas_get_corename());
    /* at avx512_bf16, OpenBLAS's own choice when it is of that level (it never forces one) */
    const int want = isa == CF_ISA_AVX512_BF16 || isa == CF_ISA_AMX
                         ? (own_level > 3 ? own_level : 3)
                     : isa == CF_ISA_AVX512 ? 3
                     : isa == CF_ISA_AVX2   ? 2
                                            : 0;
    if (blas_core_level(openblas_get_corename()) == want) return;
    const char *core = want == 3 ? "SkylakeX" : want == 2 ? "Haswell" : "Nehalem";
    if (want != own_level) setenv("OPENBLAS_CORETYPE", core, 1); /* else OpenBLAS chooses again */
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE"); /* leave the environment as the user had it */
}
#else
static void blas_follow_isa(cf_isa isa) { /* OpenBLAS's own choice stands elsewhere */
    (void)isa;
}
#endif

/* The order of caps: the enum's, except for the two levels of the other architecture: on
 * x86-64 NEON ranks above AMX (a cap of neon caps nothing, as before AMX was appended after it),
 * and on arm64 AMX ranks as the x86-64 level it extends (below NEON: the portable kernels). */
static int isa_rank(cf_isa isa) {
#if defined(__aarch64__)
    if (isa == CF_ISA_AMX) return CF_ISA_AVX512_BF16;
#else
    if (isa == CF_ISA_NEON) return CF_ISA_AMX + 1;
#endif
    return (int)isa;
}

cf_isa cf_set_isa(cf_isa cap) {
    cf_isa best = cf_isa_best();
    cf_active_kernels = table_for(isa_rank(cap) < isa_rank(best) ? cap : best);
    blas_follow_isa(cf_active_kernels->isa);
    return cf_active_kernels->isa;
}

/* Runs before main (and before any constructor of a program linked against the library uses
 * it): a library cannot report an error here, so an unknown CF_ISA is named on stderr, once,
 * and ignored. */
__attribute__((constructor)) static void cf_isa_init(void) {
    const cf_isa no_cap = CF_ISA_NEON; /* the highest rank (isa_rank) */
    cf_isa cap = no_cap;
    const char *env = getenv("CF_ISA");
    if (env && *env && !cf_isa_parse(env, &cap)) {
        fprintf(stderr,
                "corefit: CF_ISA=%s is not one of generic, avx2, avx512, avx512_bf16, amx, neon; "
                "ignored\n",
                env);
        cap = no_cap;
    }
    cf_set_isa(cap);
}
