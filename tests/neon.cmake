# arm64. Where Debian's cross compiler and user-mode QEMU are installed (gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user: scripts/install-deps), ctest checks the NEON kernel table
# (src/tensor/isa_neon.c) against the portable one under QEMU (tests/neon_kernels.c), and that
# every other C file a build compiles compiles for arm64 without warnings (tests/neon_run.sh).
find_program(CF_AARCH64_CC aarch64-linux-gnu-gcc)
find_program(CF_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(CF_AARCH64_CC AND CF_QEMU_AARCH64)
  add_test(NAME test_neon_kernels
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/neon_run.sh kernels ${CF_AARCH64_CC}
      ${CF_QEMU_AARCH64} ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/neon)
  set_tests_properties(test_neon_kernels PROPERTIES LABELS "unit;isa" TIMEOUT 600)
endif()
if(CF_AARCH64_CC)
  # the build's options, and the host's headers of the dependencies (after the arm64 C library's)
  set(cf_neon_flags -DCF_HAVE_PLPLOT=${CF_HAVE_PLPLOT} -DCF_HAVE_STB=${CF_HAVE_STB}
    -DCF_HAVE_MPI=${CF_HAVE_MPI} -DCF_FASHION_MNIST_DEFAULT_DIR="/usr/share/datasets/fashion-mnist")
  foreach(dir ${OPENBLAS_INCLUDE_DIRS} ${CJSON_INCLUDE_DIRS} ${ZLIB_INCLUDE_DIRS}
      ${UTF8PROC_INCLUDE_DIRS} ${LIBXML2_INCLUDE_DIRS} ${PLPLOT_INCLUDE_DIRS} ${STB_INCLUDE_DIRS}
      ${MPI_C_INCLUDE_DIRS} /usr/include)
    list(APPEND cf_neon_flags -idirafter ${dir})
  endforeach()
  add_test(NAME test_neon_compile
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/neon_run.sh compile ${CF_AARCH64_CC}
      ${PROJECT_SOURCE_DIR} ${cf_neon_flags})
  set_tests_properties(test_neon_compile PROPERTIES LABELS "unit;isa" TIMEOUT 600)
endif()
