# A residual block's ReLU mask as bits (test_res_mask_bits): the fold writing them, the last
# BatchNorms' gradient passes applying them, at the best level, capped at avx512_bf16, avx512,
# avx2 (vector masks from the bits) and generic (scalar), and at the amx level over the tile
# emulation.
cf_isa_tests(test_res_mask_bits avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_res_mask_bits)
