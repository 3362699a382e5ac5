# A residual block's fold writing the next block's pair its bf16 input words (test_fold_words): at
# the best level, capped at avx512_bf16 (where the CPU has AMX), avx512, avx2 and generic (no bf16
# kernels: the link stays off), and at the amx level over the tile emulation.
cf_isa_tests(test_fold_words avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_fold_words)
