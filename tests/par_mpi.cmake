# The MPI communicator, run as a real MPI job: mpirun -np 2 (and 3, oversubscribed) on
# tests/mpi_par_comm.c. Only when corefit was built with MPI.
if(CF_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  add_executable(mpi_par_comm ${CMAKE_CURRENT_SOURCE_DIR}/mpi_par_comm.c)
  target_link_libraries(mpi_par_comm PRIVATE corefit_static ${CF_PRIVATE_LIBS})
  set(CF_MPI_ENV "")
  if(CF_SANITIZE)
    # Open MPI's own allocations show up as leaks under LeakSanitizer.
    set(CF_MPI_ENV -x ASAN_OPTIONS=detect_leaks=0)
  endif()
  foreach(np 2 3)
    add_test(NAME test_par_mpi_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${CF_MPI_ENV}
              -np ${np} $<TARGET_FILE:mpi_par_comm>)
    set_tests_properties(test_par_mpi_np${np} PROPERTIES LABELS "unit;mpi" TIMEOUT 120
      ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  endforeach()
  # Without mpirun the same program is a world of one (MPI singleton).
  add_test(NAME test_par_mpi_singleton COMMAND mpi_par_comm)
  set_tests_properties(test_par_mpi_singleton PROPERTIES LABELS "unit;mpi" TIMEOUT 60
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0")
endif()
