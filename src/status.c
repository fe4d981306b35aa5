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
