# The bf16 Winograd convolutions (test_bf16_winograd): plain at the best level, at avx512_bf16
# (where the CPU has AMX the plain run takes the tiles), at the amx level over the tile emulation
# (tests/amx_emul_main.c; skipped without AVX512_BF16), and capped at avx512 and avx2, where there
# are no bf16 kernels and the bf16 functions and layers must be bitwise the fp32 Winograd, and at
# generic, which has no Winograd transforms (the direct calls are skipped, the layers checked).
cf_isa_tests(test_bf16_winograd avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_winograd)
