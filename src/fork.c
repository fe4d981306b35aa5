/* fork.c: fork detection. A context (its locks, its device memory, its CUDA
 * context) belongs to the process that created it. In a forked child, locks
 * may be held by threads that do not exist there, and CUDA contexts do not
 * survive fork(); every call on an inherited context therefore returns
 * GPUMEM_ERR_NOT_SUPPORTED at once, without taking a lock. The child creates
 * a context of its own instead. */
#include "internal.h"

_Atomic unsigned gpumem__fork_gen;
static pthread_once_t gpumem__fork_once = PTHREAD_ONCE_INIT;

static void gpumem__fork_child(void) { atomic_fetch_add_explicit(&gpumem__fork_gen, 1u, memory_order_relaxed); }
static void gpumem__fork_register(void) { (void)pthread_atfork(NULL, NULL, gpumem__fork_child); }

unsigned gpumem__fork_init(void) {
  (void)pthread_once(&gpumem__fork_once, gpumem__fork_register);
  return atomic_load_explicit(&gpumem__fork_gen, memory_order_relaxed);
}

gpumem_status gpumem__forked_status(gpumem_context *ctx, const char *fn) {
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN,
              "%s: context %p was created before fork() and cannot be used in the child; create a new context",
              fn, (void *)ctx);
  return GPUMEM_ERR_NOT_SUPPORTED;
}
