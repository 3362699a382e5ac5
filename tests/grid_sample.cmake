# The batch augmentation's bilinear sampling (the kernel tables' grid_sample loops) against the
# per-pixel reference (test_aug_resize_exact), at every level: capped at avx512_bf16, avx512, avx2
# and generic, and at the amx level over the tile emulation.
cf_isa_tests(test_aug_resize_exact avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_aug_resize_exact)
