/* The AMX level's kernels (amx_tiles.h): on the real tile instructions (isa_amx.c) and over a
 * scalar emulation of them (isa_amx_emul.c, for the tests on CPUs without AMX). Private to the
 * tensor layer and its tests. */
#ifndef COREFIT_AMX_H
#define COREFIT_AMX_H

#include "tensor/kernel_table.h"

#include <stdint.h>

#if defined(__x86_64__)
/* The 64-byte operand of ldtilecfg (palette 1): per tile t, rows[t] rows of colsb[t] bytes. */
typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Set k's gemm, conv_run, conv_wgrad and conv_order to the AMX kernels, real or emulated (the
 * rest of k is left as it is: the AVX512_BF16 level's). Run the real ones only where
 * cf_isa_best() is CF_ISA_AMX. */
void cf_amx_kernels(cf_bf16_kernels *k);
void cf_amx_emul_kernels(cf_bf16_kernels *k);
/* Tile operations the hardware would have refused (#UD) in the emulation, since the process
 * started. */
unsigned long cf_amx_emul_faults(void);
#endif

#endif
