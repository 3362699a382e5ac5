# BatchNorm writing the next bf16 convolution's input words (test_bf16_bn_words): at the best
# level, capped at avx512_bf16 (where the CPU has AMX), avx512, avx2 and generic (no bf16
# kernels: the link stays off), and at the amx level over the tile emulation.
cf_isa_tests(test_bf16_bn_words avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_bn_words)
