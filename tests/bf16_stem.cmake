# The bf16 stride-2 stem (test_bf16_stem): at avx512_bf16 (where the CPU has AMX the plain run
# takes the amx level), capped at avx512, avx2 and generic (no bf16 kernels: skipped), and at the
# amx level over the tile emulation (its table has no gemm_rows: skipped; without AVX512_BF16 the
# whole test is skipped).
foreach(isa avx512_bf16 avx512 avx2 generic)
  add_test(NAME test_bf16_stem_${isa} COMMAND test_bf16_stem)
  set_tests_properties(test_bf16_stem_${isa} PROPERTIES LABELS "unit;isa" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=${isa}")
endforeach()
add_executable(test_bf16_stem_amx_emul ${CMAKE_CURRENT_SOURCE_DIR}/test_bf16_stem.c
  ${CMAKE_CURRENT_SOURCE_DIR}/amx_emul_main.c)
target_link_libraries(test_bf16_stem_amx_emul PRIVATE cf_testlib)
target_compile_definitions(test_bf16_stem_amx_emul PRIVATE main=cf_amx_emul_wrapped_main)
add_test(NAME test_bf16_stem_amx_emul COMMAND test_bf16_stem_amx_emul)
set_tests_properties(test_bf16_stem_amx_emul PROPERTIES LABELS "unit;isa"
  TIMEOUT ${CF_UNIT_TIMEOUT} SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
