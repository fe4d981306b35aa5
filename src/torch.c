/* torch.c: the framework entry points (PyTorch CUDAPluggableAllocator), on the
 * process-wide context (global.c). They never crash: NULL on failure. */
#include "internal.h"

#include <stddef.h>

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
  gpumem_context *ctx = gpumem__global_context_if_created();
  if (ctx == NULL) return; /* nothing was ever allocated through it */
  (void)gpumem_free(ctx, ptr, (gpumem_stream)stream);
}
