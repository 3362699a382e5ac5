# The bf16 stride-2 stem (test_bf16_stem): at avx512_bf16 (where the CPU has AMX the plain run
# takes the amx level), capped at avx512, avx2 and generic (no bf16 kernels: skipped), and at the
# amx level over the tile emulation (its table has no gemm_rows: skipped; without AVX512_BF16 the
# whole test is skipped).
cf_isa_tests(test_bf16_stem avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_stem)
