# Exact resume under mpirun (tests/mpi_resume.c): a fit stopped mid-epoch on request and resumed
# from rank 0's checkpoint equals the uninterrupted fit bitwise on every rank, at 2 and 3 ranks.
if(CF_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  add_executable(mpi_resume ${CMAKE_CURRENT_SOURCE_DIR}/mpi_resume.c)
  target_link_libraries(mpi_resume PRIVATE corefit_static ${CF_PRIVATE_LIBS})
  set(CF_MPIRUN_RESUME ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
  if(CF_SANITIZE)
    list(APPEND CF_MPIRUN_RESUME -x ASAN_OPTIONS=detect_leaks=0)
  endif()
  foreach(np 2 3)
    add_test(NAME test_mpi_resume_np${np}
      COMMAND ${CF_MPIRUN_RESUME} -np ${np} $<TARGET_FILE:mpi_resume>
              ${CMAKE_CURRENT_BINARY_DIR}/mpi_resume_np${np})
    set_tests_properties(test_mpi_resume_np${np} PROPERTIES LABELS "unit;mpi" TIMEOUT 180
      ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()
