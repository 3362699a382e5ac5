# Which Conv2d layers compute in bf16 under mixed precision (test_bf16_precision): the shape rule
# and whole layers at the best level, capped at avx512_bf16 (where the CPU has AMX), avx512, avx2
# and generic (no bf16: every layer must be fp32's bit for bit), and over the amx emulation.
cf_isa_tests(test_bf16_precision avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bf16_precision)
