# The Winograd kernels against scalar references (test_wino_transforms) at every level: the
# plain run takes the best one; generic has no Winograd transforms and skips.
cf_isa_tests(test_wino_transforms avx512_bf16 avx512 avx2 generic)
# Over the AMX tile emulation too: the AMX level shares the AVX512_BF16 level's transforms (the
# direct input_pairs and input_bf16 included).
cf_amx_emul_test(test_wino_transforms)
