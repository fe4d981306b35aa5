# API reference with Doxygen: the `docs` target (warnings are errors).
# Included from the top-level CMakeLists.txt. The target exists only when
# Doxygen is found; GPUMEM_BUILD_DOCS=OFF removes it.
option(GPUMEM_BUILD_DOCS "Add the 'docs' target (Doxygen API reference)" ON)
if(NOT GPUMEM_BUILD_DOCS)
  return()
endif()
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "gpumem: docs target OFF (Doxygen not found)")
  return()
endif()
find_program(GPUMEM_AWK NAMES awk gawk mawk)
if(NOT GPUMEM_AWK)
  message(STATUS "gpumem: docs target OFF (awk not found)")
  return()
endif()
message(STATUS "gpumem: docs target ON (Doxygen ${DOXYGEN_VERSION})")

set(GPUMEM_DOCS_OUTPUT ${PROJECT_BINARY_DIR}/docs)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)

file(GLOB GPUMEM_DOCS_DEPENDS CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/include/*.h ${PROJECT_SOURCE_DIR}/include/*.hpp ${PROJECT_SOURCE_DIR}/include/gpumem/*.h
  ${PROJECT_SOURCE_DIR}/docs/*.md ${PROJECT_SOURCE_DIR}/docs/*.awk)
add_custom_command(OUTPUT ${GPUMEM_DOCS_OUTPUT}/html/index.html
  COMMAND ${CMAKE_COMMAND} -E make_directory ${GPUMEM_DOCS_OUTPUT}
  COMMAND ${DOXYGEN_EXECUTABLE} ${PROJECT_BINARY_DIR}/Doxyfile
  DEPENDS ${PROJECT_BINARY_DIR}/Doxyfile ${GPUMEM_DOCS_DEPENDS}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  COMMENT "Doxygen: API reference in ${GPUMEM_DOCS_OUTPUT}/html (warnings are errors)"
  VERBATIM)
add_custom_target(docs DEPENDS ${GPUMEM_DOCS_OUTPUT}/html/index.html)

if(GPUMEM_INSTALL)
  install(DIRECTORY ${GPUMEM_DOCS_OUTPUT}/html DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc OPTIONAL)
endif()
