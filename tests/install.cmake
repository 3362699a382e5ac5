# make install: the library, headers, corefit.pc and the CMake package, checked by building a
# small program against the installed copy with pkg-config and with find_package.
# (Not in sanitizer builds: the installed library would need the sanitizer runtime to link.)
if(CF_SANITIZE)
  return()
endif()
add_test(NAME test_install
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install_test.sh ${PROJECT_BINARY_DIR})
set_tests_properties(test_install PROPERTIES LABELS "unit" TIMEOUT 300)
