/* fork.c: fork detection, and every pthread_atfork registration of the core.
 *
 * A context (its locks, its device memory, its CUDA context) belongs to the
 * process that created it. In a forked child, locks may be held by threads
 * that do not exist there, and CUDA contexts do not survive fork(); every
 * call on an inherited context therefore returns GPUMEM_ERR_NOT_SUPPORTED at
 * once, without taking a lock. The child creates a context of its own instead.
 *
 * The handlers, in the order they are registered:
 *   1. a backend's own (sim.c: prepare takes its device lock g_lock, parent and
 *      child give it back), registered by the backend in its init, which
 *      gpumem_create runs before (2); backends cannot include the core, so
 *      theirs stay in the backend and this file only relies on the order.
 *   2. the generation (here, at the first gpumem_create): child only, it adds
 *      1 to gpumem__fork_gen so that GPUMEM__FORKED sees every inherited context.
 *   3. the thread caches (tcache.c's gpumem__tc_fork_*, here at the first
 *      thread cache, which needs a context: always after 2): prepare takes
 *      g_reg and every cache lock, parent gives them back, child forgets the
 *      parent's caches and gives g_reg back.
 * POSIX runs the prepare handlers in the reverse of that order and the parent
 * and child handlers in that order, so at fork the locks are taken in the
 * core's lock order: cache locks (3) before the pools' and the backend's
 * (1; a pool calls the backend under its lock, a cache flush takes a pool
 * lock under its cache lock), and given back in the child only after the
 * backend is usable again. A backend first opened after the first thread
 * cache (a later context on another backend) registers after 3, so its
 * prepare runs before the caches' there. No handler takes a pool lock: a pool is never used
 * in the child (its context is inherited), so its lock may stay taken there. */
#include "internal.h"

_Atomic unsigned gpumem__fork_gen;
static pthread_once_t gpumem__fork_once = PTHREAD_ONCE_INIT;

static void gpumem__fork_child(void) { atomic_fetch_add_explicit(&gpumem__fork_gen, 1u, memory_order_relaxed); }
static void gpumem__fork_register(void) { (void)pthread_atfork(NULL, NULL, gpumem__fork_child); }

unsigned gpumem__fork_init(void) {
  (void)pthread_once(&gpumem__fork_once, gpumem__fork_register);
  return atomic_load_explicit(&gpumem__fork_gen, memory_order_relaxed);
}

static pthread_once_t gpumem__fork_caches_once = PTHREAD_ONCE_INIT;
static int gpumem__fork_caches_rc = -1;
static void gpumem__fork_register_caches(void) {
  gpumem__fork_caches_rc = pthread_atfork(gpumem__tc_fork_prepare, gpumem__tc_fork_parent, gpumem__tc_fork_child);
}

int gpumem__fork_init_caches(void) {
  (void)pthread_once(&gpumem__fork_caches_once, gpumem__fork_register_caches);
  return gpumem__fork_caches_rc == 0 ? 0 : -1;
}

gpumem_status gpumem__forked_status(gpumem_context *ctx, const char *fn) {
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN,
              "%s: context %p was created before fork() and cannot be used in the child; create a new context",
              fn, (void *)ctx);
  return GPUMEM_ERR_NOT_SUPPORTED;
}
