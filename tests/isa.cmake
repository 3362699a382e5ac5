# Instruction sets. ctest runs the kernel and layer tests once per instruction set below the
# best one this CPU supports (the plain runs above use the best), each capped with CF_ISA; on a
# CPU without a set the cap gives the best it has, and test_isa says which ran. test_isa itself
# runs without OPENBLAS_NUM_THREADS, to check the default thread configuration, and without
# OPENBLAS_CORETYPE, to check that OpenBLAS's kernels follow the cap (test_isa_user_blas: with it,
# that the user's choice stands).
# (test_models, minutes of whole-model oracles, runs at the best set only)
set(CF_ISA_TESTS test_kernels test_layers test_conv_pool test_fusion test_optim test_loss
  test_w1_model test_alloc test_lstm test_bn_split)
set_tests_properties(test_isa PROPERTIES ENVIRONMENT_MODIFICATION
  "OPENBLAS_NUM_THREADS=unset:;OPENBLAS_CORETYPE=unset:" ENVIRONMENT "")
add_test(NAME test_isa_user_blas COMMAND test_isa)
set_tests_properties(test_isa_user_blas PROPERTIES LABELS "unit;isa" TIMEOUT 120
  ENVIRONMENT "OPENBLAS_CORETYPE=Haswell" ENVIRONMENT_MODIFICATION "OPENBLAS_NUM_THREADS=unset:")
# bf16 compute exists at avx512_bf16 only; every level below runs test_bf16's fp32 fallback
cf_isa_tests(test_bf16 generic avx2 avx512)
cf_isa_tests(test_bf16_par avx512)
foreach(name ${CF_ISA_TESTS})
  cf_isa_tests(${name} generic avx2)
endforeach()
foreach(isa generic avx2)
  add_test(NAME test_isa_${isa} COMMAND test_isa)
  set_tests_properties(test_isa_${isa} PROPERTIES LABELS "unit;isa" TIMEOUT 120
    ENVIRONMENT "CF_ISA=${isa}"
    ENVIRONMENT_MODIFICATION "OPENBLAS_NUM_THREADS=unset:;OPENBLAS_CORETYPE=unset:")
endforeach()

# A portable build must run on any CPU of its architecture: outside the AVX2 and AVX-512
# tables, no object of the library may contain a vector instruction beyond the baseline, and
# the AVX2 table none of AVX-512's (checked by disassembly).
if(NOT CF_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  find_program(CF_OBJDUMP objdump)
  if(CF_OBJDUMP)
    add_test(NAME test_isa_objects
      COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/isa_objects.sh ${CF_OBJDUMP}
        "$<TARGET_OBJECTS:corefit_objects>"
      COMMAND_EXPAND_LISTS)
    set_tests_properties(test_isa_objects PROPERTIES LABELS "unit;isa" TIMEOUT 120)
  endif()
endif()
# the bf16 shortcut at every level (below avx512_bf16: unsupported, the block in fp32)
cf_isa_tests(test_bf16_shortcut generic avx2 avx512)
# BatchNorm's several-plane kernels against the one-plane ones, at every table
cf_isa_tests(test_bn_planes generic avx2 avx512)
# MaxPool2d(3, stride 2)'s kernels against the scalar loops (the test also walks the levels)
cf_isa_tests(test_pool_3x3 generic avx2 avx512)
# The amx level sits above avx512_bf16: where the CPU has AMX the plain runs use it, and these
# keep the avx512_bf16 kernels covered (elsewhere they repeat the plain runs, or the fallback).
# test_amx_cap_amx: CF_ISA=amx on a CPU without AMX picks the best level it has.
foreach(name test_bf16 test_bf16_batch test_bf16_par test_bf16_shortcut test_kernels test_amx)
  cf_isa_tests(${name} avx512_bf16)
endforeach()
add_test(NAME test_amx_cap_amx COMMAND test_amx)
set_tests_properties(test_amx_cap_amx PROPERTIES LABELS "unit;isa" TIMEOUT 300
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_ISA=amx")
# The small bf16 tests again at the amx level over the tile emulation (tests/amx_emul_main.c):
# the tile kernels from pool threads, on whole layers' shapes and batches, every tile row checked
# against its operand's span, on any CPU with AVX512_BF16 (skipped without). test_bf16_par's
# split-batch bound is wider at this level (its comment says why).
foreach(name test_bf16_batch test_bf16_shortcut test_bf16_par)
  cf_amx_emul_test(${name})
endforeach()
# What the bf16 paths do when a kernel fails, and the pack a bf16 Winograd layer does not plan:
# at every level (below avx512_bf16: nothing to fail, nothing said) and over the tile emulation.
cf_isa_tests(test_bf16_faults generic avx2 avx512 avx512_bf16)
cf_amx_emul_test(test_bf16_faults)
# The bf16 weight gradient's runs of position pairs against conv_wgrad over every pair: at the
# best level, capped to avx512_bf16 (where the CPU has AMX), over the amx emulation (which has
# no runs entry) and below (no bf16 convolution: nothing to compare)
cf_isa_tests(test_bf16_wgrad_runs generic avx2 avx512 avx512_bf16)
cf_amx_emul_test(test_bf16_wgrad_runs)
