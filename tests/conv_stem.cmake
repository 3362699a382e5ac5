# The direct stem (test_conv_stem): at the best level, capped at avx512_bf16 (where the CPU has
# AMX), avx512 (the vector kernels the layers take), avx2 (vector kernels the layers leave to the
# lowered product: slower there) and generic (the portable loops, likewise), and at the amx level
# over the tile emulation.
cf_isa_tests(test_conv_stem avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_conv_stem)
