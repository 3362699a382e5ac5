/* Runs a bf16 test program (compiled with main renamed to cf_amx_emul_wrapped_main, isa.cmake)
 * at the amx level over the scalar emulation of the tile instructions: the avx512_bf16 table
 * with the emulated tile kernels (isa_amx_emul.c) made active before the program's tests start.
 * Where the CPU has AMX, every bf16 test runs on the tiles; here the emulation shows the same
 * uses of them: kernels called from the thread pool's threads (each with its own tile
 * configuration), from forked workers where the program forks, on the batches and shapes of whole
 * layers, and with every load and store checked against its operand's span. The program then fails
 * if a tile operation in this process was one the hardware refuses or reached outside its span
 * (cf_amx_emul_faults; a forked worker's count stays in the worker, where the skipped operation
 * shows as a wrong result). Exit 77 (skipped) on a CPU without AVX512_BF16, whose table the
 * emulated level extends. */
#include "amx_emul.h"

#include <stdio.h>

#undef main
int cf_amx_emul_wrapped_main(void);

#if defined(__x86_64__)
static cf_kernel_table table;
static cf_bf16_kernels bf16;

int main(void) {
    const cf_isa best = cf_isa_best();
    if (best != CF_ISA_AVX512_BF16 && best != CF_ISA_AMX) {
        printf("no AVX512_BF16 on this CPU (best level %s): the emulated amx level extends it\n",
               cf_isa_name(best));
        return 77;
    }
    if (!cf_test_emulated_amx(&table, &bf16)) return 1;
    cf_active_kernels = &table;
    printf("kernels: amx over the tile emulation\n");
    const int rc = cf_amx_emul_wrapped_main();
    if (cf_active_kernels != &table) {
        printf("the program left the emulated amx level: its results are not the level's\n");
        return 1;
    }
    const unsigned long faults = cf_amx_emul_faults();
    if (faults) {
        printf("%lu emulated tile operations refused by the hardware or outside their span\n",
               faults);
        return 1;
    }
    return rc;
}
#else
int main(void) {
    printf("the amx level is x86-64's\n");
    return 77;
}
#endif
