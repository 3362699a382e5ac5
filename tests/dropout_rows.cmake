# Keyed Dropout rows through the tensor layer's kernel (test_dropout_rows): under every CF_ISA cap
# and at the amx level over the tile emulation.
cf_isa_tests(test_dropout_rows avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_dropout_rows)
