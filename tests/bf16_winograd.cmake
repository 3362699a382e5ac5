# The bf16 Winograd convolutions (test_bf16_winograd): plain at the best level, at avx512_bf16
# (where the CPU has AMX the plain run takes the tiles), at the amx level over the tile emulation
# (tests/amx_emul_main.c; skipped without AVX512_BF16), and capped at avx512 and avx2, where there
# are no bf16 kernels and the bf16 functions and layers must be bitwise the fp32 Winograd, and at
# generic, which has no Winograd transforms (the direct calls are skipped, the layers checked).
foreach(isa avx512_bf16 avx512 avx2 generic)
  add_test(NAME test_bf16_winograd_${isa} COMMAND test_bf16_winograd)
  set_tests_properties(test_bf16_winograd_${isa} PROPERTIES LABELS "unit;isa" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=${isa}")
endforeach()
add_executable(test_bf16_winograd_amx_emul ${CMAKE_CURRENT_SOURCE_DIR}/test_bf16_winograd.c
  ${CMAKE_CURRENT_SOURCE_DIR}/amx_emul_main.c)
target_link_libraries(test_bf16_winograd_amx_emul PRIVATE cf_testlib)
target_compile_definitions(test_bf16_winograd_amx_emul PRIVATE main=cf_amx_emul_wrapped_main)
add_test(NAME test_bf16_winograd_amx_emul COMMAND test_bf16_winograd_amx_emul)
set_tests_properties(test_bf16_winograd_amx_emul PROPERTIES LABELS "unit;isa"
  TIMEOUT ${CF_UNIT_TIMEOUT} SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
