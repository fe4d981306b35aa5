/*
 * gpu_util.h: helpers for the GPU-only tests (tests/gpu/*.cu).
 *
 * Each test is a plain program: it prints what it measured, and exits 0 when
 * every CHECK held, 1 otherwise (77 = skipped, e.g. fewer GPUs than needed).
 * No cmocka, so they build and run on a GPU machine with nothing but the CUDA
 * toolkit.
 */
#ifndef GPUMEM_GPU_UTIL_H
#define GPUMEM_GPU_UTIL_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gpumem.h>

static int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stdout, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);               \
      fflush(stdout);                                                               \
      g_failures++;                                                                 \
    }                                                                               \
  } while (0)

#define CHECK_ST(expr, want)                                                         \
  do {                                                                               \
    gpumem_status st_ = (expr);                                                      \
    if (st_ != (want)) {                                                             \
      fprintf(stdout, "FAIL %s:%d: %s gave %s, expected %s\n", __FILE__, __LINE__, #expr, \
              gpumem_status_name(st_), gpumem_status_name(want));                    \
      fflush(stdout);                                                                \
      g_failures++;                                                                  \
    }                                                                                \
  } while (0)

/* A CUDA call of the test itself that must succeed; aborts the test if not. */
#define CUDA_OK(expr)                                                                \
  do {                                                                               \
    cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      fprintf(stdout, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

#define GIB ((uint64_t)1 << 30)
#define MIB ((uint64_t)1 << 20)

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double gib(uint64_t b) { return (double)b / (double)GIB; }

static inline int finish(const char *name) {
  if (g_failures) printf("%s: FAILED (%d check(s))\n", name, g_failures);
  else printf("%s: PASSED\n", name);
  fflush(stdout);
  return g_failures ? 1 : 0;
}

/*
 * Call first in main(): without a usable GPU the test exits 77 (skipped), so
 * that a plain `ctest` on a machine without one passes; with
 * GPUMEM_GPU_REQUIRED=1 (scripts/gpu-suite.sh sets it) it fails instead.
 * cudaGetDeviceCount creates no context.
 */
static inline void require_gpu(const char *name) {
  int n = 0;
  setvbuf(stdout, NULL, _IOLBF, 0); /* a crash must not lose what was printed */
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return;
  (void)cudaGetLastError();
  const char *req = getenv("GPUMEM_GPU_REQUIRED");
  if (req && strcmp(req, "1") == 0) {
    printf("FAIL %s: no usable GPU (%s) but GPUMEM_GPU_REQUIRED=1\n", name, cudaGetErrorString(e));
    exit(1);
  }
  printf("%s: SKIPPED, no usable GPU (%s)\n", name, cudaGetErrorString(e));
  exit(77);
}

/* 1 when [p, p+n) and [q, q+m) share a byte. */
static inline int overlaps(const void *p, uint64_t n, const void *q, uint64_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static inline gpumem_context *make_ctx(gpumem_config *cfg) {
  gpumem_context *ctx = NULL;
  gpumem_status st;
  cfg->backend = "cuda";
  st = gpumem_create(cfg, &ctx);
  if (st != GPUMEM_OK) {
    printf("FAIL gpumem_create(cuda): %s\n", gpumem_status_name(st));
    exit(1);
  }
  return ctx;
}

static inline gpumem_stats stats_of(gpumem_context *ctx, int dev) {
  gpumem_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (gpumem_get_stats(ctx, dev, &s) != GPUMEM_OK) g_failures++;
  return s;
}

static inline void mem_info(int dev, uint64_t *free_b, uint64_t *total_b) {
  size_t f = 0, t = 0;
  int prev = 0;
  CUDA_OK(cudaGetDevice(&prev));
  CUDA_OK(cudaSetDevice(dev));
  CUDA_OK(cudaMemGetInfo(&f, &t));
  CUDA_OK(cudaSetDevice(prev));
  if (free_b) *free_b = f;
  if (total_b) *total_b = t;
}

/* ---- kernels ---- */

__device__ __forceinline__ unsigned char pattern_byte(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  return (unsigned char)(x >> 56) ^ (unsigned char)(i >> 12) ^ (unsigned char)seed;
}

/* Every byte of [p, p+n) gets pattern_byte(i, seed). */
__global__ void k_fill(unsigned char *p, uint64_t n, uint32_t seed) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = pattern_byte(i, seed);
}

/* Count bytes of [p, p+n) that differ from pattern_byte(i, seed). */
__global__ void k_check(const unsigned char *p, uint64_t n, uint32_t seed, unsigned long long *bad) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  unsigned long long mine = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    if (p[i] != pattern_byte(i, seed)) mine++;
  if (mine) atomicAdd(bad, mine);
}

__device__ __forceinline__ uint64_t global_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Spin for `ns` nanoseconds (each block's thread 0), then fill like k_fill. */
__global__ void k_spin_then_fill(unsigned char *p, uint64_t n, uint32_t seed, uint64_t ns) {
  if (threadIdx.x == 0) {
    uint64_t t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
  }
  __syncthreads();
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = pattern_byte(i, seed);
}

static inline void fill(void *p, uint64_t n, uint32_t seed, cudaStream_t s) {
  k_fill<<<1024, 256, 0, s>>>((unsigned char *)p, n, seed);
  CUDA_OK(cudaGetLastError());
}

__device__ unsigned long long g_bad_bytes;

/* Returns the number of wrong bytes (synchronises the stream). Uses a
 * __device__ counter, so that it allocates no device memory itself. */
static inline unsigned long long check(const void *p, uint64_t n, uint32_t seed, cudaStream_t s) {
  unsigned long long h = 0, *d = NULL;
  CUDA_OK(cudaGetSymbolAddress((void **)&d, g_bad_bytes));
  CUDA_OK(cudaMemsetAsync(d, 0, sizeof *d, s));
  k_check<<<1024, 256, 0, s>>>((const unsigned char *)p, n, seed, d);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  return h;
}

#endif /* GPUMEM_GPU_UTIL_H */
