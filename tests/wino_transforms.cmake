# The Winograd kernels against scalar references (test_wino_transforms) at every level: the
# plain run takes the best one; generic has no Winograd transforms and skips.
foreach(isa avx512_bf16 avx512 avx2 generic)
  add_test(NAME test_wino_transforms_${isa} COMMAND test_wino_transforms)
  set_tests_properties(test_wino_transforms_${isa} PROPERTIES LABELS "unit;isa" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=${isa}")
endforeach()
