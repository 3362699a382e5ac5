# The optimizer's step and zero_grad and keyed Dropouts over the pool's threads, bitwise
# (test_serial_pool): under every CF_ISA cap and at the amx level over the tile emulation.
cf_isa_tests(test_serial_pool avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_serial_pool)
