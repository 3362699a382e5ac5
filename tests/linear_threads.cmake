# Linear layers' backward on the pool's threads (test_linear_threads): under every CF_ISA cap and
# at the amx level over the tile emulation (skipped without AVX512_BF16).
cf_isa_tests(test_linear_threads avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_linear_threads)
