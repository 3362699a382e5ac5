# The Winograd kernels against scalar references (test_wino_transforms) at every level: the
# plain run takes the best one; generic has no Winograd transforms and skips.
cf_isa_tests(test_wino_transforms avx512_bf16 avx512 avx2 generic)
