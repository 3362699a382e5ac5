# The MPI example and `corefit train --start mpi`, run as real MPI jobs on small data:
# mpirun --allow-run-as-root --oversubscribe -np 2. Only when corefit was built with MPI.
if(CF_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  set(CF_EXAMPLES_MPI_DIR ${CMAKE_CURRENT_BINARY_DIR}/examples_mpi)
  file(MAKE_DIRECTORY ${CF_EXAMPLES_MPI_DIR})
  set(CF_EX_MPI_ENV "")
  if(CF_SANITIZE)
    set(CF_EX_MPI_ENV -x ASAN_OPTIONS=detect_leaks=0)
  endif()
  add_test(NAME test_example_mpi_np2
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${CF_EX_MPI_ENV}
            -x COREFIT_EXAMPLE_LIMIT=256 -np 2 $<TARGET_FILE:example_mpi> mpi_out 1
    WORKING_DIRECTORY ${CF_EXAMPLES_MPI_DIR})
  set_tests_properties(test_example_mpi_np2 PROPERTIES LABELS "unit;mpi" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1"
    PASS_REGULAR_EXPRESSION "2 MPI ranks.*rank 0: accuracy [0-9.]+ after 1 epoch.*wrote mpi_out/mpi_model.safetensors"
    FAIL_REGULAR_EXPRESSION "error:")
  # mpirun forwards each rank's stdout and stderr through separate pipes, so a stderr line
  # ("note: ...") can land between stdout lines under load: stderr is printed after stdout
  add_test(NAME test_cli_mpi_np2
    COMMAND sh -c "\"$0\" \"$@\" 2>cli_mpi.err; rc=$?; cat cli_mpi.err; exit $rc"
            ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${CF_EX_MPI_ENV}
            -np 2 $<TARGET_FILE:corefit> train --start mpi --limit 256 --bs 32
            --out cli_mpi.safetensors --csv-log cli_mpi.csv
    WORKING_DIRECTORY ${CF_EXAMPLES_MPI_DIR})
  # one table (rank 0 only), then the model and the log
  set_tests_properties(test_cli_mpi_np2 PROPERTIES LABELS "unit;mpi" TIMEOUT 300
    ENVIRONMENT "OPENBLAS_NUM_THREADS=1"
    PASS_REGULAR_EXPRESSION "epoch     train_loss  valid_loss  accuracy  time *\n0 [^\n]*\nresult: [^\n]*\ntime: [0-9.]+ s \\(1 epoch, MPI\\)\nmodel: cli_mpi.safetensors\nlog: cli_mpi.csv\n"
    FAIL_REGULAR_EXPRESSION "corefit train:")
endif()
