# x's bf16 words kept by the forward for the weight gradient (test_bf16_kept): at the best level,
# capped at avx512_bf16 (where the CPU has AMX), avx512, avx2 and generic (no bf16 convolution:
# nothing to compare), and at the amx level over the tile emulation (which inherits the copies).
cf_isa_tests(test_bf16_kept avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_kept)
