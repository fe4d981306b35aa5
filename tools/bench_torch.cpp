// bench_torch.cpp: PyTorch's CUDA caching allocator for gpumem-bench, through
// c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete.
// Built only when CMake found PyTorch's C++ headers and libc10_cuda
// (GPUMEM_BENCH_HAVE_TORCH). PYTORCH_CUDA_ALLOC_CONF applies as in PyTorch
// (e.g. expandable_segments:True).
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>

#include "bench.h"

namespace {
int g_device = 0;

int t_alloc(void *, size_t size, gpumem_stream s, void **p) {
  try {
    void *r = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, static_cast<cudaStream_t>(s));
    if (!r) return 1;
    *p = r;
    return 0;
  } catch (...) {
    return 1;
  }
}

int t_free(void *, void *p, size_t, gpumem_stream) {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
    return 0;
  } catch (...) {
    return 1;
  }
}

void t_sync(void *) {
  cudaSetDevice(g_device);
  cudaDeviceSynchronize();
}

void t_trim(void *self) {
  t_sync(self);
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (...) {
  }
}

void t_thread(void *) { cudaSetDevice(g_device); }
}  // namespace

extern "C" int bench_torch_setup(int device, bench_allocator *out, char *err, size_t errlen) {
  g_device = device;
  try {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
      std::snprintf(err, errlen, "PyTorch allocator: no CUDA device %d", device);
      return -1;
    }
    cudaSetDevice(device);
    auto *a = c10::cuda::CUDACachingAllocator::get();
    if (!a) {
      std::snprintf(err, errlen, "PyTorch allocator: none registered");
      return -1;
    }
    if (!a->initialized()) a->init(n);
  } catch (const std::exception &e) {
    std::snprintf(err, errlen, "PyTorch allocator: %s", e.what());
    return -1;
  }
  *out = bench_allocator{"torch", nullptr, t_alloc, t_free, t_sync, t_trim, t_thread, nullptr};
  return 0;
}
