# The statistics link (test_bn_stats_link): a bf16 convolution's epilogue taking the next
# BatchNorm's per-image sums, at the best level, capped at avx512_bf16 (where the CPU has AMX),
# avx512, avx2 and generic (no bf16 kernels: the link is not taken), and at the amx level over
# the tile emulation.
cf_isa_tests(test_bn_stats_link avx512_bf16 avx512 avx2 generic)
cf_amx_emul_test(test_bn_stats_link)
