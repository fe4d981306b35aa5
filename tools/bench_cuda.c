/* bench_cuda.c: the CUDA runtime's own allocators for gpumem-bench (only with GPUMEM_HAVE_CUDA). */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

static int g_device;
static cudaMemPool_t g_pool;
static int g_have_pool;

static void set_dev(void *self) {
  (void)self;
  cudaSetDevice(g_device);
}

static int cm_alloc(void *self, size_t size, gpumem_stream s, void **p) {
  (void)self;
  (void)s;
  return cudaMalloc(p, size) != cudaSuccess;
}

static int cm_free(void *self, void *p, size_t size, gpumem_stream s) {
  (void)self;
  (void)size;
  (void)s;
  return cudaFree(p) != cudaSuccess;
}

static int ca_alloc(void *self, size_t size, gpumem_stream s, void **p) {
  (void)self;
  return cudaMallocFromPoolAsync(p, size, g_pool, (cudaStream_t)s) != cudaSuccess;
}

static int ca_free(void *self, void *p, size_t size, gpumem_stream s) {
  (void)self;
  (void)size;
  return cudaFreeAsync(p, (cudaStream_t)s) != cudaSuccess;
}

static void dev_sync(void *self) {
  (void)self;
  cudaSetDevice(g_device);
  cudaDeviceSynchronize();
}

static void ca_trim(void *self) {
  dev_sync(self);
  cudaMemPoolTrimTo(g_pool, 0);
}

int bench_cuda_setup(int device, bench_allocator *cm, bench_allocator *ca, char *err, size_t errlen) {
  g_device = device;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(NULL); /* create the context before timing */
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  if (e == cudaSuccess) e = cudaMemPoolCreate(&g_pool, &props);
  if (e == cudaSuccess) {
    g_have_pool = 1;
    uint64_t keep = UINT64_MAX;
    e = cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  if (e != cudaSuccess) {
    snprintf(err, errlen, "CUDA setup: %s", cudaGetErrorString(e));
    return -1;
  }
  *cm = (bench_allocator){"cudaMalloc", NULL, cm_alloc, cm_free, dev_sync, dev_sync, set_dev, NULL};
  *ca = (bench_allocator){"cudaMallocAsync", NULL, ca_alloc, ca_free, dev_sync, ca_trim, set_dev, NULL};
  return 0;
}

void bench_cuda_teardown(void) {
  if (g_have_pool) {
    cudaSetDevice(g_device);
    cudaDeviceSynchronize();
    cudaMemPoolDestroy(g_pool);
    g_have_pool = 0;
  }
}
