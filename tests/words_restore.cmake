# A paired shortcut summing its own weight gradient from its sibling's kept words
# (test_words_restore): at the best level, capped at avx512_bf16 (where the CPU has AMX), avx512,
# avx2 and generic (no bf16 kernels: the link stays off), and at the amx level over the tile
# emulation.
cf_isa_tests(test_words_restore avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_words_restore)
