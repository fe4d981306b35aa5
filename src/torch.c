/* torch.c: the process-wide context and the framework entry points
 * (PyTorch CUDAPluggableAllocator, CuPy). They never crash: NULL on failure. */
#include "internal.h"

#include <stddef.h>

static _Atomic(gpumem_context *) gpumem__global;
static pthread_mutex_t gpumem__global_lock = PTHREAD_MUTEX_INITIALIZER;

gpumem_status gpumem_global_context(gpumem_context **out) {
  if (out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem_context *c = atomic_load_explicit(&gpumem__global, memory_order_acquire);
  if (c != NULL) {
    *out = c;
    return GPUMEM_OK;
  }
  gpumem_status st = GPUMEM_OK;
  pthread_mutex_lock(&gpumem__global_lock);
  c = atomic_load_explicit(&gpumem__global, memory_order_relaxed);
  if (c == NULL) {
    /* from the environment; a failure is not remembered, so a later call may succeed */
    st = gpumem_create(NULL, &c);
    if (st == GPUMEM_OK) atomic_store_explicit(&gpumem__global, c, memory_order_release);
  }
  pthread_mutex_unlock(&gpumem__global_lock);
  if (st == GPUMEM_OK) *out = c;
  return st;
}

void *gpumem_torch_alloc(size_t size, int device, void *stream) {
  gpumem_context *ctx = NULL;
  if (gpumem_global_context(&ctx) != GPUMEM_OK) return NULL;
  void *p = NULL;
  if (gpumem_alloc(ctx, device, size, (gpumem_stream)stream, &p) != GPUMEM_OK) return NULL;
  return p;
}

void gpumem_torch_free(void *ptr, size_t size, int device, void *stream) {
  (void)size;
  (void)device;
  if (ptr == NULL) return;
  gpumem_context *ctx = atomic_load_explicit(&gpumem__global, memory_order_acquire);
  if (ctx == NULL) return; /* nothing was ever allocated through it */
  (void)gpumem_free(ctx, ptr, (gpumem_stream)stream);
}
