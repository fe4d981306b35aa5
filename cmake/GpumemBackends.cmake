# Finds the toolkits of the optional backends.
# Sets GPUMEM_HAVE_CUDA / GPUMEM_HAVE_HIP and the imported targets they need.

set(GPUMEM_HAVE_CUDA OFF)
if(NOT GPUMEM_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(GPUMEM_HAVE_CUDA ON)
    message(STATUS "gpumem: CUDA backend ON (CUDA ${CUDAToolkit_VERSION})")
  elseif(GPUMEM_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GPUMEM_WITH_CUDA=ON but the CUDA Toolkit was not found")
  else()
    message(STATUS "gpumem: CUDA backend OFF (toolkit not found)")
  endif()
endif()

set(GPUMEM_HAVE_HIP OFF)
if(NOT GPUMEM_WITH_HIP STREQUAL "OFF")
  find_path(GPUMEM_HIP_INCLUDE_DIR hip/hip_runtime_api.h
            HINTS $ENV{ROCM_PATH}/include /opt/rocm/include)
  find_library(GPUMEM_HIP_LIBRARY amdhip64
               HINTS $ENV{ROCM_PATH}/lib /opt/rocm/lib)
  if(GPUMEM_HIP_INCLUDE_DIR AND GPUMEM_HIP_LIBRARY)
    set(GPUMEM_HAVE_HIP ON)
    message(STATUS "gpumem: HIP backend ON (${GPUMEM_HIP_LIBRARY})")
  elseif(GPUMEM_WITH_HIP STREQUAL "ON")
    message(FATAL_ERROR "GPUMEM_WITH_HIP=ON but HIP (hip/hip_runtime_api.h, libamdhip64) was not found; on Debian: apt-get install libamdhip64-dev")
  else()
    message(STATUS "gpumem: HIP backend OFF (HIP not found)")
  endif()
endif()

# FindCUDAToolkit creates Threads::Threads in this (top-level) directory; make
# it global here, where it was created, so that src/, tests/ and tools/ can
# all use it (IMPORTED_GLOBAL may only be set in the creating directory).
find_package(Threads REQUIRED)
get_target_property(_gpumem_thr_global Threads::Threads IMPORTED_GLOBAL)
if(NOT _gpumem_thr_global)
  set_target_properties(Threads::Threads PROPERTIES IMPORTED_GLOBAL TRUE)
endif()
