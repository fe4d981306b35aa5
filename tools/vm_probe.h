// Helpers of the standalone driver probes (vm_cost.cu, vm_overlap.cu): measurement programs,
// not library code. CK(x): a CUDA driver call that must succeed (else the call and the driver's
// error are printed and the program exits with status 2); now_us(): a steady clock; median();
// device_chunk(): the allocation properties and access descriptor of plain device memory.
#ifndef GPUMEM_TOOLS_VM_PROBE_H
#define GPUMEM_TOOLS_VM_PROBE_H
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

static inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static inline void device_chunk(CUdevice dev, CUmemAllocationProp *prop, CUmemAccessDesc *acc) {
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = (int)dev;
  *acc = CUmemAccessDesc{};
  acc->location = prop->location;
  acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

#endif
