/* global.c: the process-wide context, created on first use from the environment and kept for
 * the life of the process. The framework entry points (torch.c) and the Python binding's
 * process-wide context (PyTorch, CuPy) share it. */
#include "internal.h"

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

gpumem_context *gpumem__global_context_if_created(void) {
  return atomic_load_explicit(&gpumem__global, memory_order_acquire);
}
