/*
 * bench.h: the allocator interface of gpumem-bench (tools only, not API).
 * Every allocator is called through the same function pointers, so the
 * indirection costs the same for all of them.
 */
#ifndef GPUMEM_TOOLS_BENCH_H
#define GPUMEM_TOOLS_BENCH_H

#include <stddef.h>

#include "gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_allocator {
  const char *name;
  void *self;
  /** 0 on success. size > 0 always. */
  int (*alloc)(void *self, size_t size, gpumem_stream stream, void **ptr);
  /** 0 on success; `stream` is the stream the block was allocated on. */
  int (*free)(void *self, void *ptr, size_t size, gpumem_stream stream);
  /** wait for all queued work (end of a timed loop); may be NULL */
  void (*sync)(void *self);
  /** give cached memory back (between patterns, untimed); may be NULL */
  void (*trim)(void *self);
  /** called once in each benchmark thread before timing; may be NULL */
  void (*thread_init)(void *self);
  /** a trace's 'n ID STREAM' line: the live block is noted on `stream` (gpumem_record_stream), 0 on
   * success; NULL: the allocator has no such call and reuses the block on its free's stream alone */
  int (*note)(void *self, void *ptr, gpumem_stream stream);
} bench_allocator;

#ifdef GPUMEM_HAVE_CUDA
/* bench_cuda.c: cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync on a
 * pool of its own with cudaMemPoolAttrReleaseThreshold = UINT64_MAX. */
int bench_cuda_setup(int device, bench_allocator *cuda_malloc, bench_allocator *cuda_malloc_async, char *err,
                     size_t errlen);
void bench_cuda_teardown(void);
#endif

#ifdef GPUMEM_BENCH_HAVE_TORCH
/* bench_torch.cpp: PyTorch's caching allocator (raw_alloc_with_stream / raw_delete). */
int bench_torch_setup(int device, bench_allocator *out, char *err, size_t errlen);
#endif

#ifdef __cplusplus
}
#endif

#endif
