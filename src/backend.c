/* backend.c: the built-in backend registry, backend selection, and the thin
 * wrappers that are the ONLY callers of the vtable. Each wrapper maps a
 * backend code to a gpumem_status (error_status; NULL -> GPUMEM_ERR_BACKEND),
 * records the raw code and message for gpumem_last_backend_error(), and logs. */
#include "internal.h"
#include "vmseg.h"

#include <string.h>

extern const gpumem_backend gpumem__sim_backend;
#ifdef GPUMEM_HAVE_CUDA
extern const gpumem_backend gpumem__cuda_backend;
#endif
#ifdef GPUMEM_HAVE_HIP
extern const gpumem_backend gpumem__hip_backend;
#endif

const gpumem_backend *gpumem_builtin_backend(const char *name) {
  if (name == NULL) return NULL;
  if (strcmp(name, "sim") == 0) return &gpumem__sim_backend;
#ifdef GPUMEM_HAVE_CUDA
  if (strcmp(name, "cuda") == 0) return &gpumem__cuda_backend;
#endif
#ifdef GPUMEM_HAVE_HIP
  if (strcmp(name, "hip") == 0) return &gpumem__hip_backend;
#endif
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Error mapping                                                           */

static gpumem_status map_code(const gpumem_backend *be, int code) {
  if (code == 0) return GPUMEM_OK;
  gpumem_status st = GPUMEM_ERR_BACKEND;
  if (be->error_status != NULL) st = be->error_status(be, code);
  if (st == GPUMEM_OK || (int)st < 0 || (int)st >= (int)GPUMEM_STATUS_COUNT_) st = GPUMEM_ERR_BACKEND;
  return st;
}

static const char *code_string(const gpumem_backend *be, int code) {
  const char *m = be->error_string != NULL ? be->error_string(be, code) : NULL;
  return m != NULL ? m : "(no message)";
}

/* ---------------------------------------------------------------------- */
/* Last backend error (gpumem_last_backend_error): one record per thread,  */
/* the last failed call's code and message and the context it happened on. */
static _Thread_local struct {
  const gpumem_context *ctx;
  int code;
  const char *msg;
} gpumem__last_error;

static void set_last_backend_error(const gpumem_context *ctx, int code, const char *msg) {
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

/* Record and log a failed call; returns the mapped status. */
static gpumem_status fail(gpumem_context *ctx, const char *what, int dev, int code) {
  gpumem_status st = map_code(&ctx->be, code);
  const char *msg = code_string(&ctx->be, code);
  set_last_backend_error(ctx, code, msg);
  /* Out-of-memory is handled by the pool (trim and retry): a debug line. No backend (the driver
   * gone or unloading) is what a process meets at exit when the CUDA runtime unloads before the
   * application's last calls (PyTorch frees its tensors at interpreter exit): the call returns
   * the status and nothing is lost, so it is an info line, not an error printed at every exit. */
  gpumem__log(&ctx->opt.log,
              st == GPUMEM_ERR_OUT_OF_MEMORY ? GPUMEM_LOG_DEBUG
              : st == GPUMEM_ERR_NO_BACKEND  ? GPUMEM_LOG_INFO
                                             : GPUMEM_LOG_ERROR,
              "backend %s: %s (device %d) failed: %s (code %d, %s)", ctx->be_name, what, dev, msg, code,
              gpumem_status_name(st));
  return st;
}

#define GPUMEM__CALL(ctx, what, dev, expr)             \
  do {                                                 \
    int code_ = (expr);                                \
    if (GPUMEM__UNLIKELY(code_ != 0)) return fail((ctx), (what), (dev), code_); \
    return GPUMEM_OK;                                  \
  } while (0)

/* ---------------------------------------------------------------------- */
/* Selection                                                               */

static int events_complete(const gpumem_backend *be) {
  return be->event_create != NULL && be->event_destroy != NULL && be->event_record != NULL &&
         be->event_query != NULL && be->event_synchronize != NULL;
}

static int events_partial(const gpumem_backend *be) {
  return be->event_create != NULL || be->event_destroy != NULL || be->event_record != NULL ||
         be->event_query != NULL || be->event_synchronize != NULL;
}

/* Minimum struct_size of a custom vtable: every version-1 method up to error_string. */
#define GPUMEM__BACKEND_MIN_SIZE (offsetof(gpumem_backend, error_string) + sizeof(gpumem_backend_error_string_fn))

static gpumem_status validate_custom(const gpumem__logger *lg, const gpumem_backend *be) {
  const char *why = NULL;
  if (be->version < 1) why = "version < 1";
  else if (be->struct_size < GPUMEM__BACKEND_MIN_SIZE) why = "struct_size too small (set it to sizeof(gpumem_backend))";
  else if (be->name == NULL || be->name[0] == '\0') why = "name is NULL or empty";
  else if (be->device_count == NULL || be->device_info == NULL || be->mem_get_info == NULL || be->malloc == NULL ||
           be->free == NULL || be->device_synchronize == NULL)
    why = "a required method (device_count, device_info, mem_get_info, malloc, free, device_synchronize) is NULL";
  else if (events_partial(be) && !events_complete(be))
    why = "event methods must be all set or all NULL";
  if (why != NULL) {
    gpumem__log(lg, GPUMEM_LOG_WARN, "custom backend rejected: %s", why);
    return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  return GPUMEM_OK;
}

/* Copy src into ctx->be, init it, and check it has a device. */
static gpumem_status try_open(gpumem_context *ctx, const gpumem_backend *src, int explicit_choice, int custom) {
  size_t n = sizeof(gpumem_backend);
  if (src->struct_size != 0 && src->struct_size < n) n = src->struct_size;
  memset(&ctx->be, 0, sizeof ctx->be);
  memcpy(&ctx->be, src, n);
  const char *name = src->name != NULL ? src->name : "custom";
  size_t len = strlen(name);
  if (len >= sizeof ctx->be_name) len = sizeof ctx->be_name - 1;
  memcpy(ctx->be_name, name, len);
  ctx->be_name[len] = '\0';
  ctx->has_events = (ctx->be.version >= 1 && events_complete(&ctx->be));
  ctx->cap_probe = ctx->opt.capture_probe && gpumem__be_has_capture(ctx);

  if (ctx->be.init != NULL) {
    int code = ctx->be.init(&ctx->be);
    if (code != 0) {
      gpumem_status st = map_code(&ctx->be, code);
      const char *msg = code_string(&ctx->be, code);
      set_last_backend_error(ctx, code, msg);
      if (st == GPUMEM_ERR_INVALID_ARGUMENT) {
        gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "backend %s: bad configuration: %s (code %d)", ctx->be_name, msg,
                    code);
        return GPUMEM_ERR_INVALID_ARGUMENT;
      }
      gpumem__log(&ctx->opt.log, explicit_choice ? GPUMEM_LOG_WARN : GPUMEM_LOG_DEBUG,
                  "backend %s: not usable: %s (code %d)", ctx->be_name, msg, code);
      /* a custom backend's own mapping is kept; a built-in one is simply not usable */
      return custom ? st : GPUMEM_ERR_NO_BACKEND;
    }
  }
  int count = 0;
  int code = ctx->be.device_count(&ctx->be, &count);
  if (code != 0 || count <= 0) {
    if (code != 0) {
      set_last_backend_error(ctx, code, code_string(&ctx->be, code));
    }
    gpumem__log(&ctx->opt.log, explicit_choice ? GPUMEM_LOG_WARN : GPUMEM_LOG_DEBUG,
                "backend %s: no device (%s)", ctx->be_name, code != 0 ? code_string(&ctx->be, code) : "count is 0");
    if (ctx->be.shutdown != NULL) ctx->be.shutdown(&ctx->be);
    return GPUMEM_ERR_NO_BACKEND;
  }
  ctx->ndev = count;
  ctx->be_open = 1;
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "backend %s: %d device(s)", ctx->be_name, count);
  return GPUMEM_OK;
}

gpumem_status gpumem__backend_open(gpumem_context *ctx) {
  if (ctx->opt.custom_backend != NULL) {
    gpumem_status st = validate_custom(&ctx->opt.log, ctx->opt.custom_backend);
    if (st != GPUMEM_OK) return st;
    return try_open(ctx, ctx->opt.custom_backend, 1, 1);
  }
  const char *want = ctx->opt.backend;
  if (strcmp(want, "auto") == 0) {
    static const char *const order[] = {"cuda", "hip", "sim"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
      const gpumem_backend *be = gpumem_builtin_backend(order[i]);
      if (be == NULL) continue;
      gpumem_status st = try_open(ctx, be, 0, 0);
      if (st == GPUMEM_OK || st == GPUMEM_ERR_INVALID_ARGUMENT) return st;
    }
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "no usable backend (tried cuda, hip, sim)");
    return GPUMEM_ERR_NO_BACKEND;
  }
  const gpumem_backend *be = gpumem_builtin_backend(want);
  if (be == NULL) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "backend \"%s\" is unknown or not built into this library", want);
    return GPUMEM_ERR_NO_BACKEND;
  }
  return try_open(ctx, be, 1, 0);
}

void gpumem__backend_close(gpumem_context *ctx) {
  if (ctx->be_open && ctx->be.shutdown != NULL) ctx->be.shutdown(&ctx->be);
  ctx->be_open = 0;
}

int gpumem__be_has_device_reset(const gpumem_context *ctx) {
  return ctx->be.version >= 1 && ctx->be.device_reset != NULL;
}

/* ---------------------------------------------------------------------- */
/* Wrappers                                                                */

gpumem_status gpumem__be_device_count(gpumem_context *ctx, int *count) {
  GPUMEM__CALL(ctx, "device_count", -1, ctx->be.device_count(&ctx->be, count));
}

gpumem_status gpumem__be_device_info(gpumem_context *ctx, int dev, gpumem_backend_device_info *info) {
  GPUMEM__CALL(ctx, "device_info", dev, ctx->be.device_info(&ctx->be, dev, info));
}

gpumem_status gpumem__be_mem_get_info(gpumem_context *ctx, int dev, uint64_t *free_b, uint64_t *total_b) {
  GPUMEM__CALL(ctx, "mem_get_info", dev, ctx->be.mem_get_info(&ctx->be, dev, free_b, total_b));
}

gpumem_status gpumem__be_malloc(gpumem_context *ctx, int dev, size_t size, void **p) {
  void *q = NULL;
  int code = ctx->be.malloc(&ctx->be, dev, size, &q);
  if (code != 0) return fail(ctx, "malloc", dev, code);
  if (q == NULL) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_ERROR, "backend %s: malloc (device %d, %zu bytes) returned NULL",
                ctx->be_name, dev, size);
    return GPUMEM_ERR_BACKEND;
  }
  if (((uintptr_t)q & 255u) != 0) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_ERROR, "backend %s: malloc returned %p, not 256-byte aligned",
                ctx->be_name, q);
    (void)ctx->be.free(&ctx->be, dev, q);
    return GPUMEM_ERR_BACKEND;
  }
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_DEBUG, "backend %s: malloc(device %d, %zu) = %p", ctx->be_name, dev, size, q);
  *p = q;
  return GPUMEM_OK;
}

gpumem_status gpumem__be_free(gpumem_context *ctx, int dev, void *p) {
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_DEBUG, "backend %s: free(device %d, %p)", ctx->be_name, dev, p);
  GPUMEM__CALL(ctx, "free", dev, ctx->be.free(&ctx->be, dev, p));
}

gpumem_status gpumem__be_event_create(gpumem_context *ctx, int dev, gpumem_event *ev) {
  if (!ctx->has_events) return GPUMEM_ERR_NOT_SUPPORTED;
  GPUMEM__CALL(ctx, "event_create", dev, ctx->be.event_create(&ctx->be, dev, ev));
}

gpumem_status gpumem__be_event_destroy(gpumem_context *ctx, int dev, gpumem_event ev) {
  if (!ctx->has_events) return GPUMEM_ERR_NOT_SUPPORTED;
  GPUMEM__CALL(ctx, "event_destroy", dev, ctx->be.event_destroy(&ctx->be, dev, ev));
}

gpumem_status gpumem__be_event_record(gpumem_context *ctx, int dev, gpumem_event ev, gpumem_stream s) {
  if (!ctx->has_events) return GPUMEM_ERR_NOT_SUPPORTED;
  /* while a capture is known, an event on the NULL (legacy) stream of a device where a stream is being
   * captured would invalidate that capture (CUDA: cudaErrorStreamCaptureImplicit): refused here, as an
   * event that could not be had (its frees then wait for a device synchronisation). The NULL stream's
   * answer covers the device's blocking streams, as for gpumem_reset. */
  if (s == NULL && gpumem__capturing(ctx)) {
    uint64_t id = 0;
    if (gpumem__be_capture_quiet(ctx, dev, NULL, &id) != GPUMEM_CAPTURE_NONE) return GPUMEM_ERR_BUSY;
  }
  GPUMEM__CALL(ctx, "event_record", dev, ctx->be.event_record(&ctx->be, dev, ev, s));
}

gpumem_status gpumem__be_event_query(gpumem_context *ctx, int dev, gpumem_event ev, int *complete) {
  if (!ctx->has_events) return GPUMEM_ERR_NOT_SUPPORTED;
  GPUMEM__CALL(ctx, "event_query", dev, ctx->be.event_query(&ctx->be, dev, ev, complete));
}

gpumem_status gpumem__be_event_synchronize(gpumem_context *ctx, int dev, gpumem_event ev) {
  if (!ctx->has_events) return GPUMEM_ERR_NOT_SUPPORTED;
  GPUMEM__CALL(ctx, "event_synchronize", dev, ctx->be.event_synchronize(&ctx->be, dev, ev));
}

gpumem_status gpumem__be_device_synchronize(gpumem_context *ctx, int dev) {
  GPUMEM__CALL(ctx, "device_synchronize", dev, ctx->be.device_synchronize(&ctx->be, dev));
}

gpumem_status gpumem__be_device_reset(gpumem_context *ctx, int dev) {
  if (!gpumem__be_has_device_reset(ctx)) return GPUMEM_ERR_NOT_SUPPORTED;
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "backend %s: resetting device %d (destroys every allocation of the process on it)",
              ctx->be_name, dev);
  GPUMEM__CALL(ctx, "device_reset", dev, ctx->be.device_reset(&ctx->be, dev));
}

int gpumem__be_has_annotations(const gpumem_context *ctx) {
  return ctx->be.version >= 2 && ctx->be.annotate_alloc != NULL && ctx->be.annotate_free != NULL;
}

void gpumem__be_annotate_alloc(gpumem_context *ctx, int dev, void *p, size_t size) {
  ctx->be.annotate_alloc(&ctx->be, dev, p, size);
}

void gpumem__be_annotate_free(gpumem_context *ctx, int dev, void *p, size_t size) {
  ctx->be.annotate_free(&ctx->be, dev, p, size);
}

/* ---------------------------------------------------------------------- */
/* Virtual memory (expandable segments, vmseg.c)                           */

int gpumem__be_has_vm(const gpumem_context *ctx) {
  const gpumem_backend *be = &ctx->be;
  return be->version >= 1 && be->vm_granularity != NULL && be->vm_reserve != NULL && be->vm_release != NULL &&
         be->vm_create != NULL && be->vm_destroy != NULL && be->vm_map != NULL && be->vm_unmap != NULL;
}

gpumem_status gpumem__be_vm_granularity(gpumem_context *ctx, int dev, size_t *gran) {
  GPUMEM__CALL(ctx, "vm_granularity", dev, ctx->be.vm_granularity(&ctx->be, dev, gran));
}

gpumem_status gpumem__be_vm_reserve(gpumem_context *ctx, int dev, size_t size, void **va) {
  GPUMEM__CALL(ctx, "vm_reserve", dev, ctx->be.vm_reserve(&ctx->be, dev, size, va));
}

gpumem_status gpumem__be_vm_release(gpumem_context *ctx, int dev, void *va, size_t size) {
  GPUMEM__CALL(ctx, "vm_release", dev, ctx->be.vm_release(&ctx->be, dev, va, size));
}

gpumem_status gpumem__be_vm_create(gpumem_context *ctx, int dev, size_t size, gpumem_phys_handle *h) {
  GPUMEM__CALL(ctx, "vm_create", dev, ctx->be.vm_create(&ctx->be, dev, size, h));
}

gpumem_status gpumem__be_vm_destroy(gpumem_context *ctx, int dev, gpumem_phys_handle h) {
  GPUMEM__CALL(ctx, "vm_destroy", dev, ctx->be.vm_destroy(&ctx->be, dev, h));
}

gpumem_status gpumem__be_vm_map(gpumem_context *ctx, int dev, void *va, size_t size, gpumem_phys_handle h) {
  GPUMEM__CALL(ctx, "vm_map", dev, ctx->be.vm_map(&ctx->be, dev, va, size, h));
}

gpumem_status gpumem__be_vm_unmap(gpumem_context *ctx, int dev, void *va, size_t size) {
  GPUMEM__CALL(ctx, "vm_unmap", dev, ctx->be.vm_unmap(&ctx->be, dev, va, size));
}

/* ---------------------------------------------------------------------- */
/* Stream capture (graphs)                                                 */

int gpumem__be_has_stream_wait(const gpumem_context *ctx) {
  return ctx->be.version >= 4 && ctx->has_events && ctx->be.stream_wait_event != NULL;
}

gpumem_status gpumem__be_stream_wait_event(gpumem_context *ctx, int dev, gpumem_stream s, gpumem_event ev) {
  if (!gpumem__be_has_stream_wait(ctx)) return GPUMEM_ERR_NOT_SUPPORTED;
  GPUMEM__CALL(ctx, "stream_wait_event", dev, ctx->be.stream_wait_event(&ctx->be, dev, s, ev));
}

int gpumem__be_has_capture(const gpumem_context *ctx) {
  return ctx->be.version >= 3 && ctx->be.stream_capture != NULL;
}

gpumem_status gpumem__be_stream_capture(gpumem_context *ctx, int dev, gpumem_stream s, int *status,
                                        uint64_t *capture_id) {
  int st = GPUMEM_CAPTURE_NONE;
  uint64_t id = 0;
  if (!gpumem__be_has_capture(ctx)) {
    *status = GPUMEM_CAPTURE_NONE;
    *capture_id = 0;
    return GPUMEM_OK;
  }
  int code = ctx->be.stream_capture(&ctx->be, dev, s, &st, &id);
  if (GPUMEM__UNLIKELY(code != 0)) return fail(ctx, "stream_capture", dev, code);
  if (st != GPUMEM_CAPTURE_NONE && st != GPUMEM_CAPTURE_ACTIVE && st != GPUMEM_CAPTURE_INVALIDATED) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_ERROR, "backend %s: stream_capture (device %d) gave status %d, not 0, 1 or 2",
                ctx->be_name, dev, st);
    return GPUMEM_ERR_BACKEND;
  }
  *status = st;
  *capture_id = st == GPUMEM_CAPTURE_NONE ? 0 : id;
  return GPUMEM_OK;
}
