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

# The ULMFiT example on a slice of Debian's fortunes (40 quotations a topic, the 6 largest
# topics, a small AWD-LSTM, one epoch a stage), then `corefit predict` on its exported
# classifier: the model loaded by another program. Skipped (77) without the fortunes package.
set(CF_EXAMPLES_TEXT_DIR ${CMAKE_CURRENT_BINARY_DIR}/examples_ulmfit)
file(MAKE_DIRECTORY ${CF_EXAMPLES_TEXT_DIR})
# stderr (notes, progress) is printed after stdout so that it cannot land between the lines
add_test(NAME test_example_ulmfit
  COMMAND sh -c "test -d /usr/share/games/fortunes || exit 77
    { rm -rf fortunes fortunes_tok out &&
      /usr/bin/python3 \"$0\" fortunes --max-per-topic 40 --valid-pct 0.25 &&
      \"$1\" fortunes out --lm-epochs 1 --epochs 1 --emb-sz 16 --n-hid 24 --n-layers 2 --bs 8 \
        --seq-len 16 --min-per-topic 40 --max-topics 6 --cores 2 &&
      \"$2\" predict out/topics.safetensors --text 'The compiler crashed again.' --top 2
    } 2>ulmfit.err; rc=$?; cat ulmfit.err; exit $rc"
    ${CMAKE_CURRENT_SOURCE_DIR}/../scripts/fortunes-folder $<TARGET_FILE:example_ulmfit>
    $<TARGET_FILE:corefit>
  WORKING_DIRECTORY ${CF_EXAMPLES_TEXT_DIR})
# CMake's regular expressions have no {n}: the 6 topics and 6 predictions are written out
set(CF_ULMFIT_TOPIC " [a-z-]+ \\(40\\)")
set(CF_ULMFIT_PRED "[a-z-]+ +predicted [a-z-]+ +\\(0\\.[0-9]+\\): [^\n]+\n")
string(REPEAT "${CF_ULMFIT_TOPIC}" 6 CF_ULMFIT_TOPICS)
string(REPEAT "${CF_ULMFIT_PRED}" 6 CF_ULMFIT_PREDS)
set_tests_properties(test_example_ulmfit PROPERTIES LABELS "unit" TIMEOUT 300 SKIP_RETURN_CODE 77
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1"
  PASS_REGULAR_EXPRESSION "language model: valid_loss [0-9.]+, accuracy [0-9.]+, perplexity [0-9.]+\ngenerated: The computer [^\n]+\nwrote out/lm.safetensors and out/finetuned.safetensors\n.*6 topics with at least 40 quotations:${CF_ULMFIT_TOPICS}\n.*of 6 topics\n.*frozen but for the head.*freeze_to\\(-2\\).*freeze_to\\(-3\\).*unfreeze\\(\\).*classifier: valid_loss [0-9.]+, accuracy [0-9.]+\nwrote out/topics.safetensors\n${CF_ULMFIT_PREDS}\"The compiler[^\n]+: [a-z-]+ \\(0\\.[0-9]+\\), [0-9]+ unknown words\n--text: [a-z-]+ \\(0\\.[0-9]+\\), [a-z-]+ \\(0\\.[0-9]+\\)\n"
  FAIL_REGULAR_EXPRESSION "error:")

# The segmentation and multi-label examples on tiny data written by `corefit fmnist-tasks`
# (skipped, 77, where it cannot write them: no Fashion-MNIST or no stb_image_write).
set(CF_EXAMPLES_TASKS_DIR ${CMAKE_CURRENT_BINARY_DIR}/examples_tasks)
file(MAKE_DIRECTORY ${CF_EXAMPLES_TASKS_DIR})
add_test(NAME test_example_segmentation
  COMMAND sh -c "rm -rf seg seg_out
    \"$0\" fmnist-tasks segmentation seg --n 24 --size 32 --seed 3 >/dev/null || exit 77
    \"$1\" seg seg_out 1 2>seg.err; rc=$?; cat seg.err; exit $rc"
    $<TARGET_FILE:corefit> $<TARGET_FILE:example_segmentation>
  WORKING_DIRECTORY ${CF_EXAMPLES_TASKS_DIR})
set_tests_properties(test_example_segmentation PROPERTIES LABELS "unit" TIMEOUT 300
  SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1"
  PASS_REGULAR_EXPRESSION "20 training and 4 validation images, 11 codes\n.*valid_loss [0-9.]+, foreground_acc [0-9.]+, dice_multi [0-9.]+\n.*first validation image:( [a-z]+ [0-9.]+%)+\nwrote seg_out/unet.safetensors\n"
  FAIL_REGULAR_EXPRESSION "error:")
add_test(NAME test_example_multi_label
  COMMAND sh -c "rm -rf ml ml_out
    \"$0\" fmnist-tasks multi-label ml --n 48 --seed 1 >/dev/null || exit 77
    \"$1\" ml ml_out 2 2>ml.err; rc=$?; cat ml.err; exit $rc"
    $<TARGET_FILE:corefit> $<TARGET_FILE:example_multi_label>
  WORKING_DIRECTORY ${CF_EXAMPLES_TASKS_DIR})
set_tests_properties(test_example_multi_label PROPERTIES LABELS "unit" TIMEOUT 300
  SKIP_RETURN_CODE 77 ENVIRONMENT "OPENBLAS_NUM_THREADS=1"
  PASS_REGULAR_EXPRESSION "[0-9]+ training and [0-9]+ validation images, 10 labels\n.*valid_loss [0-9.]+, accuracy_multi [0-9.]+, f1_score [0-9.]+\nimage 0: labels [a-z;]+, predicted [a-z;-]+\n.*wrote ml_out/multi_label.safetensors\n"
  FAIL_REGULAR_EXPRESSION "error:")
