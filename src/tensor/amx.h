/* The AMX level's kernels (amx_tiles.h): on the real tile instructions (isa_amx.c) and over a
 * scalar emulation of them (isa_amx_emul.c, for the tests on CPUs without AMX). Private to the
 * tensor layer and its tests. */
#ifndef COREFIT_AMX_H
#define COREFIT_AMX_H

#include "tensor/kernel_table.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__)
/* The 64-byte operand of ldtilecfg (palette 1): per tile t, rows[t] rows of colsb[t] bytes. */
typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* The part of an operand a tile load or store may touch (amx_tiles.h): `rows` rows of `bytes`
 * bytes, `stride` bytes apart, from base (one row: stride unused). */
typedef struct amx_span {
    const void *base;
    size_t rows, bytes, stride;
} amx_span;

static inline amx_span amx_span_of(const void *base, size_t rows, size_t bytes, size_t stride) {
    return (amx_span){base, rows, bytes, stride};
}

/* Set k's gemm, conv_run, conv_wgrad and conv_order to the AMX kernels, real or emulated (the
 * rest of k is left as it is: the AVX512_BF16 level's). Run the real ones only where
 * cf_isa_best() is CF_ISA_AMX. */
void cf_amx_kernels(cf_bf16_kernels *k);
void cf_amx_emul_kernels(cf_bf16_kernels *k);
/* Tile operations in the emulation, since the process started, that the hardware would have
 * refused (#UD), or whose rows reach outside the span the kernel's contract allows. */
unsigned long cf_amx_emul_faults(void);
#endif

#endif
