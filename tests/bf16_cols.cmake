# The bf16 forward over output positions (test_bf16_cols): at avx512_bf16 (where the CPU has AMX
# the plain run takes the amx level, which has no conv_cols), capped at avx512, avx2 and generic
# (no bf16 kernels: nothing to compare), and at the amx level over the tile emulation (no
# conv_cols; without AVX512_BF16 the whole test is skipped).
cf_isa_tests(test_bf16_cols avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_cols)
