/* The emulated amx level of the tests: the avx512_bf16 kernel table with the scalar emulation of
 * the tile kernels (src/tensor/isa_amx_emul.c), as tests/amx_emul_main.c runs whole programs. */
#ifndef CF_TESTS_AMX_EMUL_H
#define CF_TESTS_AMX_EMUL_H

#include "corefit/tensor.h"
#include "tensor/amx.h"
#include "tensor/kernel_table.h"

#include <stdbool.h>

/* Fills *table and *bf16 (which the table points to, so both must outlive its use) with the
 * emulated amx level, built from the avx512_bf16 table; leaves avx512_bf16 active and does not
 * make the emulated table active. False when the avx512_bf16 level cannot be set (a CPU without
 * AVX512_BF16). */
static inline bool cf_test_emulated_amx(cf_kernel_table *table, cf_bf16_kernels *bf16) {
    if (cf_set_isa(CF_ISA_AVX512_BF16) != CF_ISA_AVX512_BF16) return false;
    *table = *cf_active_kernels;
    *bf16 = *table->bf16;
    cf_amx_emul_kernels(bf16);
    table->bf16 = bf16;
    table->isa = CF_ISA_AMX;
    return true;
}

#endif
