# Installation: headers, libgpumem.so (versioned SONAME) and libgpumem.a, the
# CMake package (find_package(gpumem CONFIG) -> gpumem::gpumem,
# gpumem::gpumem_static), gpumem.pc for pkg-config, the Fortran module source.
# Included from the top-level CMakeLists.txt after add_subdirectory(src).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
  set(_gpumem_top ON)
else()
  set(_gpumem_top OFF)
endif()
option(GPUMEM_INSTALL "Generate the install rules" ${_gpumem_top})
if(NOT GPUMEM_INSTALL)
  return()
endif()

set(GPUMEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/gpumem
    CACHE STRING "Where gpumemConfig.cmake is installed, relative to the prefix")

install(FILES ${PROJECT_SOURCE_DIR}/include/gpumem.h ${PROJECT_SOURCE_DIR}/include/gpumem.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel)
install(FILES ${PROJECT_SOURCE_DIR}/include/gpumem/backend.h ${PROJECT_SOURCE_DIR}/include/gpumem/sim.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gpumem COMPONENT devel)

install(TARGETS gpumem gpumem_static EXPORT gpumemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT gpumemTargets NAMESPACE gpumem:: FILE gpumemTargets.cmake
        DESTINATION ${GPUMEM_INSTALL_CMAKEDIR} COMPONENT devel)

# The package config finds what the static library needs at link time.
set(GPUMEM_CONFIG_HAVE_CUDA ${GPUMEM_HAVE_CUDA})
set(GPUMEM_CONFIG_HAVE_HIP ${GPUMEM_HAVE_HIP})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gpumemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gpumemConfig.cmake
  INSTALL_DESTINATION ${GPUMEM_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_DATADIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gpumemConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gpumemConfig.cmake ${PROJECT_BINARY_DIR}/gpumemConfigVersion.cmake
        DESTINATION ${GPUMEM_INSTALL_CMAKEDIR} COMPONENT devel)

# pkg-config: Libs.private lists what a static link (pkg-config --static) needs.
set(GPUMEM_PC_LIBS_PRIVATE "-pthread")
if(CMAKE_DL_LIBS)
  string(APPEND GPUMEM_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
endif()
if(GPUMEM_HAVE_CUDA)
  string(APPEND GPUMEM_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lrt")
endif()
if(GPUMEM_HAVE_HIP)
  get_filename_component(_hip_dir "${GPUMEM_HIP_LIBRARY}" DIRECTORY)
  string(APPEND GPUMEM_PC_LIBS_PRIVATE " -L${_hip_dir} -lamdhip64")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(GPUMEM_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(GPUMEM_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(GPUMEM_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(GPUMEM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
set(GPUMEM_PC_PREFIX "@GPUMEM_PC_PREFIX@") # kept for the install step below
configure_file(${PROJECT_SOURCE_DIR}/cmake/gpumem.pc.in ${PROJECT_BINARY_DIR}/gpumem.pc.tmp @ONLY)
# The prefix is the one given at install time (cmake --install --prefix ...).
install(CODE "
  file(READ \"${PROJECT_BINARY_DIR}/gpumem.pc.tmp\" _pc)
  string(REPLACE \"@GPUMEM_PC_PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\" _pc \"\${_pc}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/gpumem.pc\" \"\${_pc}\")
" COMPONENT devel)
install(FILES ${PROJECT_BINARY_DIR}/gpumem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)

# Fortran: .mod files are compiler-specific, so the module is shipped as source.
install(FILES ${PROJECT_SOURCE_DIR}/bindings/fortran/gpumem.f90 ${PROJECT_SOURCE_DIR}/bindings/fortran/example.f90
        DESTINATION ${CMAKE_INSTALL_DATADIR}/gpumem/fortran COMPONENT devel)

# Documentation guides and license.
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime OPTIONAL)

# ---- ctest: install to a temporary prefix, build and run external consumers ----
if(GPUMEM_BUILD_TESTS AND NOT GPUMEM_SANITIZE AND UNIX)
  add_test(NAME install_consumers
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/test-install.sh --build-dir ${PROJECT_BINARY_DIR}
            --work-dir ${PROJECT_BINARY_DIR}/test-install)
  set_tests_properties(install_consumers PROPERTIES LABELS "install" TIMEOUT 600
    ENVIRONMENT "CMAKE_COMMAND=${CMAKE_COMMAND};CC=${CMAKE_C_COMPILER};CXX=${CMAKE_CXX_COMPILER}")
endif()
