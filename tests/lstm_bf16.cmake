# The recurrent layers' mixed precision (test_lstm_bf16) runs plain at the best level and capped
# at avx512 and avx2, where there are no bf16 kernels and to_bf16 must change nothing.
foreach(isa avx512 avx2)
  add_test(NAME test_lstm_bf16_${isa} COMMAND test_lstm_bf16)
  set_tests_properties(test_lstm_bf16_${isa} PROPERTIES LABELS "unit;isa" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=${isa}")
endforeach()
