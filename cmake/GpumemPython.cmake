# The Python package's install rules (bindings/python/pyproject.toml builds with
# -DGPUMEM_PYTHON_PACKAGE=ON through scikit-build-core, which installs into the
# wheel's platlib: DESTINATION gpumem is the package folder).
#  - libgpumem.so.0: the shared library under its SONAME, one file (wheels hold no
#    symlinks); gpumem.capi loads it from beside the package, and the PyTorch shim
#    that gpumem.torch builds links it (NEEDED libgpumem.so.0, rpath its folder);
#  - include/gpumem.h: for that shim;
#  - _version.py: the version of this build (VERSION), as gpumem.__version__;
#  - _build_info.py: the backends compiled in, for error messages.
option(GPUMEM_PYTHON_PACKAGE "Install the Python package's files (for bindings/python)" OFF)
if(NOT GPUMEM_PYTHON_PACKAGE)
  return()
endif()
set(_py_backends "sim")
if(GPUMEM_HAVE_CUDA)
  list(APPEND _py_backends "cuda")
endif()
if(GPUMEM_HAVE_HIP)
  list(APPEND _py_backends "hip")
endif()
string(REPLACE ";" "\", \"" _py_backends "${_py_backends}")
file(WRITE ${PROJECT_BINARY_DIR}/python/_version.py
  "# Written by CMake (cmake/GpumemPython.cmake) from the repository's VERSION file.\n"
  "__version__ = \"${PROJECT_VERSION}\"\n")
file(WRITE ${PROJECT_BINARY_DIR}/python/_build_info.py
  "# Written by CMake (cmake/GpumemPython.cmake): how the bundled libgpumem was built.\n"
  "backends = (\"${_py_backends}\",)\n"
  "cuda_version = \"${CUDAToolkit_VERSION}\"\n")
install(FILES $<TARGET_FILE:gpumem> DESTINATION gpumem RENAME libgpumem.so.${PROJECT_VERSION_MAJOR} COMPONENT python)
install(FILES ${PROJECT_SOURCE_DIR}/include/gpumem.h DESTINATION gpumem/include COMPONENT python)
install(FILES ${PROJECT_BINARY_DIR}/python/_version.py ${PROJECT_BINARY_DIR}/python/_build_info.py
        DESTINATION gpumem COMPONENT python)
