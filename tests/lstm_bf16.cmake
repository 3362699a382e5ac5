# The recurrent layers' mixed precision (test_lstm_bf16) runs plain at the best level and capped
# at avx512 and avx2, where there are no bf16 kernels and to_bf16 must change nothing.
cf_isa_tests(test_lstm_bf16 avx512 avx2)
