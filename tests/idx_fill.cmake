# test_idx_fill again with CF_MAP_MIN_BYTES=0: every cf_calloc and every data set read from an
# IDX file is mapped (data sets 2 MiB-aligned with huge pages asked for), as a full-size data set
# is by default; under AddressSanitizer this is the only run of the mapped path.
add_test(NAME test_idx_fill_mapped COMMAND test_idx_fill)
set_tests_properties(test_idx_fill_mapped PROPERTIES LABELS "unit" TIMEOUT ${CF_UNIT_TIMEOUT}
  ENVIRONMENT "OPENBLAS_NUM_THREADS=1;CF_MAP_MIN_BYTES=0")
