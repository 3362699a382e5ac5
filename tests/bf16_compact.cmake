# The bf16 small-plane path on odd shapes (test_bf16_compact): plain at the best level, at
# avx512_bf16, and at the amx level over the tile emulation (tests/amx_emul_main.c; skipped
# without AVX512_BF16). Below avx512_bf16 it skips (no bf16 convolution).
add_test(NAME test_bf16_compact_avx512_bf16 COMMAND test_bf16_compact)
set_tests_properties(test_bf16_compact_avx512_bf16 PROPERTIES LABELS "unit;isa" TIMEOUT 300
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=avx512_bf16")
add_executable(test_bf16_compact_amx_emul ${CMAKE_CURRENT_SOURCE_DIR}/test_bf16_compact.c
  ${CMAKE_CURRENT_SOURCE_DIR}/amx_emul_main.c)
target_link_libraries(test_bf16_compact_amx_emul PRIVATE cf_testlib)
target_compile_definitions(test_bf16_compact_amx_emul PRIVATE main=cf_amx_emul_wrapped_main)
add_test(NAME test_bf16_compact_amx_emul COMMAND test_bf16_compact_amx_emul)
set_tests_properties(test_bf16_compact_amx_emul PROPERTIES LABELS "unit;isa"
  TIMEOUT ${CF_UNIT_TIMEOUT} SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
# bf16 layers on 3 threads (test_bf16_threads) at the emulated amx level too
add_executable(test_bf16_threads_amx_emul ${CMAKE_CURRENT_SOURCE_DIR}/test_bf16_threads.c
  ${CMAKE_CURRENT_SOURCE_DIR}/amx_emul_main.c)
target_link_libraries(test_bf16_threads_amx_emul PRIVATE cf_testlib)
target_compile_definitions(test_bf16_threads_amx_emul PRIVATE main=cf_amx_emul_wrapped_main)
add_test(NAME test_bf16_threads_amx_emul COMMAND test_bf16_threads_amx_emul)
set_tests_properties(test_bf16_threads_amx_emul PROPERTIES LABELS "unit;isa"
  TIMEOUT ${CF_UNIT_TIMEOUT} SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
# ... and capped below avx512_bf16, where the same layers run in fp32
foreach(isa generic avx512)
  add_test(NAME test_bf16_threads_${isa} COMMAND test_bf16_threads)
  set_tests_properties(test_bf16_threads_${isa} PROPERTIES LABELS "unit;isa" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=${isa}")
endforeach()
