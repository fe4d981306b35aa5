// Helpers of the standalone driver probes (vm_cost.cu, vm_overlap.cu, vm_gpu_cost.cu): measurement
// programs, not library code. CK(x): a CUDA driver call that must succeed (else the call and the
// driver's error are printed and the program exits with status 2); now_us(): a steady clock;
// median(); probe_open(): device 0's primary context made current (the runtime, where a probe uses
// it, takes the same one) and the allocation properties and access descriptor of plain device
// memory; map_chunks() / unmap_chunks(): chunks created, mapped side by side and made accessible,
// and unmapped and released, one call of each per chunk as the pool makes them.
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

struct Probe {
  CUdevice dev;
  CUcontext ctx;
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
};

/* false (and "NAME: no CUDA device" on stderr) where the driver finds no device */
static inline bool probe_open(const char *name, Probe *p) {
  int n = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", name);
    return false;
  }
  CK(cuDeviceGet(&p->dev, 0));
  CK(cuDevicePrimaryCtxRetain(&p->ctx, p->dev));
  CK(cuCtxSetCurrent(p->ctx));
  p->prop = CUmemAllocationProp{};
  p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->prop.location.id = (int)p->dev;
  p->acc = CUmemAccessDesc{};
  p->acc.location = p->prop.location;
  p->acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return true;
}

/* h.size() chunks of CHUNK bytes created and mapped at base, base + chunk, ..., each made accessible */
static inline void map_chunks(const Probe &p, CUdeviceptr base, size_t chunk, std::vector<CUmemGenericAllocationHandle> &h) {
  for (size_t i = 0; i < h.size(); i++) {
    CK(cuMemCreate(&h[i], chunk, &p.prop, 0));
    CK(cuMemMap(base + i * chunk, chunk, 0, h[i], 0));
    CK(cuMemSetAccess(base + i * chunk, chunk, &p.acc, 1));
  }
}

static inline void unmap_chunks(CUdeviceptr base, size_t chunk, std::vector<CUmemGenericAllocationHandle> &h) {
  for (size_t i = 0; i < h.size(); i++) {
    CK(cuMemUnmap(base + i * chunk, chunk));
    CK(cuMemRelease(h[i]));
  }
}

#endif
