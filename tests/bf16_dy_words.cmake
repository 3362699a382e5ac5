# A BatchNorm's input gradient written as the bf16 words of the convolution before it
# (test_bf16_dy_words): at the best level, capped at avx512_bf16 (where the CPU has AMX), avx512,
# avx2 and generic (no bf16 convolution: the link stays off), and over the amx emulation.
cf_isa_tests(test_bf16_dy_words avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_dy_words)
