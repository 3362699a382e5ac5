/* The AMX level's kernels (amx_tiles.h) on the real tile instructions (AMX-TILE, AMX-BF16),
 * compiled with them and with AVX-512 whatever the build's baseline; used only when the CPU
 * reports AMX and the kernel has granted this process the tile state (isa.c). The rest of the
 * level is the AVX512_BF16 one (isa_avx512_bf16.c). */
#if defined(__x86_64__)
#include "tensor/amx.h"

#include <immintrin.h>

#define AMX_CONFIG(cfg) _tile_loadconfig(cfg)
#define AMX_ZERO(t) _tile_zero(t)
/* the span is the emulation's check (amx_tiles.h) */
#define AMX_LOAD(t, base, stride, span)                                                            \
    do {                                                                                           \
        (void)(span);                                                                              \
        _tile_loadd(t, base, (long)(stride));                                                      \
    } while (0)
#define AMX_STORE(t, base, stride, span)                                                           \
    do {                                                                                           \
        (void)(span);                                                                              \
        _tile_stored(t, base, (long)(stride));                                                     \
    } while (0)
#define AMX_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_RELEASE() _tile_release()
#define AMX_TO_BF16(x, y, n) cf_bf16_kernels_avx512.from_fp32(x, y, n)
#include "tensor/amx_tiles.h"

void cf_amx_kernels(cf_bf16_kernels *k) {
    /* every shape, thin ones too: a choice by shape would make an image's result depend on the
     * size of the batch it came in (test_bf16_batch) */
    k->gemm = amx_gemm;
    /* the tile GEMM packs its own A (the Winograd products call it per product) */
    k->gemm_a_words = NULL;
    k->gemm_pack_a = NULL;
    k->gemm_packed = NULL;
    k->gemm_paired = NULL;
    k->gemm_rows = NULL;
    k->gemm_pack_a_rows = NULL;
    k->gemm_unpack_a = NULL;
    k->wino_pack_a = NULL;
    k->conv_run = amx_conv_run;
    k->conv_wgrad = amx_conv_wgrad;
    k->conv_wgrad_runs = NULL; /* the tiles sum every pair in their own order */
    k->conv_order = amx_conv_order;
    k->conv_cols = NULL;   /* the tiles' conv_run is the forward's kernel */
    k->conv_spread = NULL; /* conv_run's sums are the tiles' */
    k->cols_spread = NULL; /* no conv_cols */
}
#endif
