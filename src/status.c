/* status.c: status names and messages (from GPUMEM_STATUS_MAP), last backend error. */
#include "internal.h"

#include <stdlib.h>

const char *gpumem_status_name(gpumem_status s) {
  switch (s) {
#define GPUMEM__STATUS_NAME(name, value, msg) \
  case GPUMEM_##name:                         \
    return "GPUMEM_" #name;
    GPUMEM_STATUS_MAP(GPUMEM__STATUS_NAME)
#undef GPUMEM__STATUS_NAME
    default:
      return "GPUMEM_UNKNOWN_STATUS";
  }
}

const char *gpumem_strerror(gpumem_status s) {
  switch (s) {
#define GPUMEM__STATUS_MSG(name, value, msg) \
  case GPUMEM_##name:                        \
    return msg;
    GPUMEM_STATUS_MAP(GPUMEM__STATUS_MSG)
#undef GPUMEM__STATUS_MSG
    default:
      return "unknown status code";
  }
}

/* One record per thread: the last backend error, and the context it happened on. */
static _Thread_local struct {
  const gpumem_context *ctx;
  int code;
  const char *msg;
} gpumem__last_error;

void gpumem__set_last_backend_error(const gpumem_context *ctx, int code, const char *msg) {
  gpumem__last_error.ctx = ctx;
  gpumem__last_error.code = code;
  gpumem__last_error.msg = msg;
}

gpumem_status gpumem_last_backend_error(gpumem_context *ctx, int *code, const char **msg) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  int c = 0;
  const char *m = "";
  if (gpumem__last_error.ctx == ctx) {
    c = gpumem__last_error.code;
    m = gpumem__last_error.msg != NULL ? gpumem__last_error.msg : "";
  }
  if (code != NULL) *code = c;
  if (msg != NULL) *msg = m;
  return GPUMEM_OK;
}

int gpumem__mutex_init(gpumem__mutex *m) { return pthread_mutex_init(m, NULL) == 0 ? 0 : -1; }
void gpumem__mutex_destroy(gpumem__mutex *m) { (void)pthread_mutex_destroy(m); }

/* ---------------------------------------------------------------------- */
/* fork detection: a context (its locks, its device memory, its CUDA
 * context) belongs to the process that created it. In a forked child,
 * locks may be held by threads that do not exist there, and CUDA contexts
 * do not survive fork(); every call on an inherited context therefore
 * returns GPUMEM_ERR_NOT_SUPPORTED at once, without taking a lock. The
 * child creates a context of its own instead. */

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
