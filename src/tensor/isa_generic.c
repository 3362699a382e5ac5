/* The portable table: every kernel takes the plain C paths of kernels.c and conv_implicit.c
 * (convolutions lower with im2col and multiply through OpenBLAS). Built with the compiler's
 * baseline for the target, so it runs on any CPU of the architecture. */
#include "tensor/kernel_table.h"

const cf_kernel_table cf_kernels_generic = {.isa = CF_ISA_GENERIC};
