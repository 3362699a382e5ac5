# conv_bf16.c's pair planes and rows on the conversion instructions in every path
# (test_bf16_ne_paths): at the best level, capped at avx512_bf16 (where the CPU has AMX), avx512,
# avx2 and generic (no bf16 convolution: nothing to compare), and over the AMX tile emulation.
cf_isa_tests(test_bf16_ne_paths avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_ne_paths)
