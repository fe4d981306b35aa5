// CK(x): a CUDA driver call that must succeed; on failure prints the call and the driver's error
// and exits with status 2. For the standalone driver probes (vm_cost.cu, vm_overlap.cu), which are
// measurement programs, not library code.
#ifndef GPUMEM_TOOLS_CU_CHECK_H
#define GPUMEM_TOOLS_CU_CHECK_H
#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                         \
  do {                                                                                \
    CUresult r_ = (x);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                         \
      const char *s_ = nullptr;                                                       \
      cuGetErrorString(r_, &s_);                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

#endif
