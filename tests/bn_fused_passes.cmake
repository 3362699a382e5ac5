# BatchNorm's fused passes (test_bn_fused_passes): the residual fold computing the convpath's last
# BatchNorm's output, and the forward link's words rounded in registers, at the best level, capped
# at avx512_bf16 (where the CPU has AMX), avx512, avx2 (the buffered words) and generic (the
# tables' fallbacks), and at the amx level over the tile emulation.
cf_isa_tests(test_bn_fused_passes avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bn_fused_passes)
