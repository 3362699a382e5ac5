# Restarting an MPI job (scripts/corefit-mpirun, tests/mpi_restart.sh): a rank of a 2-rank
# `corefit train --start mpi` job SIGKILLed mid-fit; the wrapper reruns the job from its
# checkpoint and the model file has the bytes of an undisturbed job; without restarts it stops
# and prints the command that continues (which gives the same bytes); SIGTERM stops it without a
# restart. Only when corefit was built with MPI; skipped without the Fashion-MNIST data set.
if(CF_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  set(CF_MPIRUN_RESTART --allow-run-as-root --oversubscribe)
  if(CF_SANITIZE)
    list(APPEND CF_MPIRUN_RESTART -x ASAN_OPTIONS=detect_leaks=0)
  endif()
  add_test(NAME test_mpi_restart_np2
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_restart.sh
            ${PROJECT_SOURCE_DIR}/scripts/corefit-mpirun $<TARGET_FILE:corefit>
            ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/mpi_restart ${CF_MPIRUN_RESTART})
  set_tests_properties(test_mpi_restart_np2 PROPERTIES LABELS "unit;mpi" TIMEOUT 180
    SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
endif()
