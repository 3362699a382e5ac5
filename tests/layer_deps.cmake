# The layers hold (tests/layer_deps.py): no library file calls a layer above its own, and no
# circle between files appears beyond the known ones in tests/layer_circles.txt. Read with nm
# from the objects of corefit_objects. test_layer_deps_catches shows the check fails on an
# injected upward call and on an injected circle.
find_program(CF_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
set(CF_LAYER_DEPS ${CF_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/layer_deps.py --nm ${CMAKE_NM}
  --allow ${CMAKE_CURRENT_SOURCE_DIR}/layer_circles.txt)
add_test(NAME test_layer_deps
  COMMAND ${CF_LAYER_DEPS} $<TARGET_OBJECTS:corefit_objects>
  COMMAND_EXPAND_LISTS)
add_test(NAME test_layer_deps_catches
  COMMAND ${CF_LAYER_DEPS} --self-test ${CMAKE_C_COMPILER} $<TARGET_OBJECTS:corefit_objects>
  COMMAND_EXPAND_LISTS)
set_tests_properties(test_layer_deps test_layer_deps_catches PROPERTIES LABELS "unit" TIMEOUT 120)
