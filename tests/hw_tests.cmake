# Included by tests/CMakeLists.txt after the sim suite is defined.
#
# 1. tests/test_backend_probe.c learns which GPU backends were built.
# 2. With -DGPUMEM_HW_TESTS=ON, every test of the suite is registered a second
#    time as hw_<name>, label "hw", with GPUMEM_TEST_BACKEND=cuda (or
#    GPUMEM_HW_BACKEND), so that `ctest -L hw` runs the suite against a real
#    device. Sim-only parts skip themselves (TU_REQUIRE_SIM). Off by default:
#    on a machine without a GPU these would fail with GPUMEM_ERR_NO_BACKEND.
#    scripts/gpu-suite.sh turns it on; docs/GPU-TESTING.md.

if(TARGET test_backend_probe)
  set(_probe_cuda 0)
  set(_probe_hip 0)
  if(GPUMEM_HAVE_CUDA)
    set(_probe_cuda 1)
  endif()
  if(GPUMEM_HAVE_HIP)
    set(_probe_hip 1)
  endif()
  target_compile_definitions(test_backend_probe PRIVATE
    GPUMEM_TEST_HAVE_CUDA=${_probe_cuda} GPUMEM_TEST_HAVE_HIP=${_probe_hip})
  set_tests_properties(test_backend_probe PROPERTIES LABELS "sim;backends")
endif()

option(GPUMEM_HW_TESTS "Register the suite again as hw_* tests against a real device (ctest -L hw)" OFF)
set(GPUMEM_HW_BACKEND "cuda" CACHE STRING "Backend the hw_* tests use (GPUMEM_TEST_BACKEND)")

if(GPUMEM_HW_TESTS)
  foreach(src IN LISTS GPUMEM_TEST_SOURCES)
    get_filename_component(name ${src} NAME_WE)
    if(NOT TARGET ${name})
      continue()
    endif()
    add_test(NAME hw_${name} COMMAND ${name})
    set_tests_properties(hw_${name} PROPERTIES LABELS "hw" TIMEOUT 600
      ENVIRONMENT "GPUMEM_LOG=off;GPUMEM_TEST_BACKEND=${GPUMEM_HW_BACKEND}"
      RUN_SERIAL TRUE)
  endforeach()
endif()
