# The cf_par_ twins with start_method mpi, run as real MPI jobs (tests/mpi_fit.c): equivalence
# with fork at 2 and 3 ranks, failures on one rank, a hung rank, a killed rank, and a 2-rank job
# across two network namespaces (tests/netns_two_hosts.sh; skipped where namespaces cannot be
# made). Only when corefit was built with MPI. Runs as root too (--allow-run-as-root).
if(CF_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  add_executable(mpi_fit ${CMAKE_CURRENT_SOURCE_DIR}/mpi_fit.c)
  target_link_libraries(mpi_fit PRIVATE corefit_static ${CF_PRIVATE_LIBS})
  target_include_directories(mpi_fit PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set(CF_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
  if(CF_SANITIZE)
    # Open MPI's own allocations show up as leaks under LeakSanitizer.
    list(APPEND CF_MPIRUN -x ASAN_OPTIONS=detect_leaks=0)
  endif()
  function(cf_mpi_test name np timeout)
    add_test(NAME ${name} COMMAND ${CF_MPIRUN} -np ${np} $<TARGET_FILE:mpi_fit> ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS "unit;mpi" TIMEOUT ${timeout}
      ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  endfunction()
  cf_mpi_test(test_mpi_fit_equiv_np2 2 120 equiv)
  cf_mpi_test(test_mpi_fit_equiv_np3 3 180 equiv)
  cf_mpi_test(test_mpi_fit_fail_rank1_np2 2 60 fail 1)
  cf_mpi_test(test_mpi_fit_fail_rank0_np3 3 60 fail 0)
  cf_mpi_test(test_mpi_fit_fail_rank2_np3 3 60 fail 2)
  # A hung rank: the others' deadline (2 s) ends the job with a message (exit status ignored).
  cf_mpi_test(test_mpi_fit_hang_np2 2 60 hang)
  set_tests_properties(test_mpi_fit_hang_np2 PROPERTIES
    PASS_REGULAR_EXPRESSION "rank 0: no answer from the group for [0-9.]+ s")
  # A killed rank: mpirun ends the job and says which rank died of what.
  cf_mpi_test(test_mpi_fit_crash_np2 2 60 crash)
  set_tests_properties(test_mpi_fit_crash_np2 PROPERTIES
    PASS_REGULAR_EXPRESSION "rank 1 with PID [0-9]+ on node .* exited on signal 9"
    FAIL_REGULAR_EXPRESSION "instead of ending the job")
  # The text learners under MPI (tests/mpi_text.c): a language model and a classifier, every
  # twin, split batches equal to one process.
  add_executable(mpi_text ${CMAKE_CURRENT_SOURCE_DIR}/mpi_text.c)
  target_link_libraries(mpi_text PRIVATE corefit_static ${CF_PRIVATE_LIBS})
  foreach(np 2 3)
    add_test(NAME test_mpi_text_lm_np${np} COMMAND ${CF_MPIRUN} -np ${np} $<TARGET_FILE:mpi_text> lm)
    set_tests_properties(test_mpi_text_lm_np${np} PROPERTIES LABELS "unit;mpi" TIMEOUT 120
      ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  endforeach()
  add_test(NAME test_mpi_text_clas_np2 COMMAND ${CF_MPIRUN} -np 2 $<TARGET_FILE:mpi_text> clas)
  set_tests_properties(test_mpi_text_clas_np2 PROPERTIES LABELS "unit;mpi" TIMEOUT 120
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  # corefit train --skip-bad under mpirun: rank 0 alone says what it left out.
  add_test(NAME test_mpi_text_skipbad_np2
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_text_skipbad.sh $<TARGET_FILE:corefit>
            ${CF_MPIRUN})
  set_tests_properties(test_mpi_text_skipbad_np2 PROPERTIES LABELS "unit;mpi" TIMEOUT 120
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  # Two hosts: two network namespaces joined by a veth pair, Open MPI over TCP between them.
  add_test(NAME test_mpi_fit_two_hosts
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/netns_two_hosts.sh $<TARGET_FILE:mpi_fit>
            ${MPIEXEC_EXECUTABLE})
  set(CF_TWO_HOSTS_ENV "OPENBLAS_NUM_THREADS=1")
  if(CF_SANITIZE)
    string(APPEND CF_TWO_HOSTS_ENV ";ASAN_OPTIONS=detect_leaks=0") # passed on with mpirun -x
  endif()
  set_tests_properties(test_mpi_fit_two_hosts PROPERTIES LABELS "unit;mpi" TIMEOUT 180
    SKIP_RETURN_CODE 77 RUN_SERIAL TRUE ENVIRONMENT "${CF_TWO_HOSTS_ENV}")
endif()

# start_method mpi without mpirun (a world of one), auto, and the error of a build without MPI.
add_executable(mpi_start ${CMAKE_CURRENT_SOURCE_DIR}/mpi_start.c)
target_link_libraries(mpi_start PRIVATE cf_testlib)
add_test(NAME test_mpi_start COMMAND mpi_start)
set_tests_properties(test_mpi_start PROPERTIES LABELS "unit;mpi" TIMEOUT 60
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0")
