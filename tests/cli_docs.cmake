# Every option corefit train/lr-find/eval/predict --help prints is in docs/cli.md and the man
# page (tests/cli_docs.py); test_cli_docs_catches shows the check fails on a doc missing one.
if(TARGET corefit)
  find_program(CF_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
  add_test(NAME test_cli_docs
    COMMAND ${CF_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/cli_docs.py $<TARGET_FILE:corefit>
      ${PROJECT_SOURCE_DIR})
  add_test(NAME test_cli_docs_catches
    COMMAND ${CF_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/cli_docs.py --self-test
      $<TARGET_FILE:corefit> ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_cli_docs test_cli_docs_catches PROPERTIES LABELS "unit" TIMEOUT 60)
endif()
