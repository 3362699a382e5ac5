# The bf16 small-plane path on odd shapes (test_bf16_compact): plain at the best level, at
# avx512_bf16, and at the amx level over the tile emulation (tests/amx_emul_main.c; skipped
# without AVX512_BF16). Below avx512_bf16 it skips (no bf16 convolution).
cf_isa_tests(test_bf16_compact avx512_bf16)
cf_amx_emul_test(test_bf16_compact)
# bf16 layers on 3 threads (test_bf16_threads) at the emulated amx level too
cf_amx_emul_test(test_bf16_threads)
# ... and capped below avx512_bf16, where the same layers run in fp32
cf_isa_tests(test_bf16_threads generic avx512)
