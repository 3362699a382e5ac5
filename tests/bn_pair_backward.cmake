# A residual block's two last BatchNorms backward in one (test_bn_pair_backward): at the best
# level, capped at avx512_bf16, avx512, avx2 and generic, and at the amx level over the tile
# emulation.
cf_isa_tests(test_bn_pair_backward avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bn_pair_backward)
