/*
 * gpu_runtime.inc.c: the backend methods shared by CUDA and HIP, written once.
 *
 * A template source, not a translation unit of its own and not a header: it
 * is #included once by cuda.c and once by hip.c (and listed in no build), each
 * of which first names its runtime through these macros and types:
 *
 *   GB_(name)             token paste to the runtime's prefix: GB_(Malloc) -> cudaMalloc / hipMalloc
 *   GB_error_t            cudaError_t / hipError_t
 *   GB_prop_t             cudaDeviceProp / hipDeviceProp_t
 *   GB_event_t            cudaEvent_t / hipEvent_t
 *   GB_stream_t           cudaStream_t / hipStream_t
 *   GB_capture_mode_t     enum cudaStreamCaptureMode / hipStreamCaptureMode
 *   GB_capture_status_t   enum cudaStreamCaptureStatus / hipStreamCaptureStatus
 *   GB_ERR_NOT_READY      cudaErrorNotReady / hipErrorNotReady
 *   GB_ERR_NO_DEVICE      cudaErrorNoDevice / hipErrorNoDevice
 *   GB_ERR_INVALID_VALUE  cudaErrorInvalidValue / hipErrorInvalidValue
 *   GB_ERR_NOT_SUPPORTED  cudaErrorNotSupported / hipErrorNotSupported
 *   GB_ERR_CAPTURE_IMPLICIT  cudaErrorStreamCaptureImplicit / hipErrorStreamCaptureImplicit
 *
 * and the type gb_saved with these static functions (defined before the
 * #include):
 *
 *   int  gb_driver_init(void);                          after a successful device count
 *   int  gb_enter(int dev, gb_saved *s);                 make `dev` current, remember the caller's state
 *   void gb_leave(const gb_saved *s);                    give the caller its state back
 *   int  gb_uuid(int dev, const GB_prop_t *p, unsigned char out[16]);
 *   int  gb_physical_index(int dev, const char *uuid, const char *pci);
 *   gpumem_status gb_error_status(int code);
 *   const char   *gb_error_string(int code);
 *   void gb_after_reset(int dev);                        after a device reset
 *
 * and these, declared below and defined anywhere in the including file (the
 * runtime-specific step of a method; the device is already current, the
 * capture mode already relaxed where the method needs it):
 *
 *   int gb_rt_capture_info(GB_stream_t s, GB_capture_status_t *st, unsigned long long *id);
 *   int gb_rt_vm_supported(void);                        1 when the virtual-memory calls exist
 *   int gb_rt_vm_granularity(int dev, size_t *g);
 *   int gb_rt_vm_reserve(size_t size, void **va);
 *   int gb_rt_vm_release(void *va, size_t size);
 *   int gb_rt_vm_create(int dev, size_t size, gpumem_phys_handle *h);
 *   int gb_rt_vm_destroy(gpumem_phys_handle h);
 *   int gb_rt_vm_map(int dev, void *va, size_t size, gpumem_phys_handle h);
 *   int gb_rt_vm_unmap(void *va, size_t size);
 *
 * Everything in it is static.
 *
 * Rules kept by every method here: nothing is printed; a runtime error that
 * a method returns is cleared from the runtime's per-thread "last error"
 * (cudaGetLastError), so that a caller who checks cudaGetLastError() after
 * its own kernel launches does not see an out-of-memory that libgpumem
 * already handled (PyTorch's caching allocator does the same).
 *
 * Stream capture (the rules and their sources are in cuda.c): the methods
 * whose runtime calls are "potentially unsafe" during a capture (malloc,
 * mem_get_info, event create/destroy/query, the vm_* calls) make them with
 * the calling thread's capture interaction mode set to relaxed (gb_open with
 * GB_RELAXED, restored by gb_close), so that they neither fail nor
 * invalidate a capture under way on this or another thread. free, the
 * synchronisations and device_reset keep the caller's mode: relaxing cannot
 * make them legal, and the core does not make them while a capture may use
 * what they touch.
 */
#ifndef GPUMEM_GPU_RUNTIME_TEMPLATE_ONCE
#define GPUMEM_GPU_RUNTIME_TEMPLATE_ONCE

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <gpumem/backend.h>

/* A failing runtime call: clear the runtime's sticky-until-read last error and return the code. */
static int gb_fail(GB_error_t e) {
  if (e != GB_(Success)) (void)GB_(GetLastError)();
  return (int)e;
}

static int gb_rt_capture_info(GB_stream_t s, GB_capture_status_t *st, unsigned long long *id);
static int gb_rt_vm_supported(void);
static int gb_rt_vm_granularity(int dev, size_t *g);
static int gb_rt_vm_reserve(size_t size, void **va);
static int gb_rt_vm_release(void *va, size_t size);
static int gb_rt_vm_create(int dev, size_t size, gpumem_phys_handle *h);
static int gb_rt_vm_destroy(gpumem_phys_handle h);
static int gb_rt_vm_map(int dev, void *va, size_t size, gpumem_phys_handle h);
static int gb_rt_vm_unmap(void *va, size_t size);

/* The state a method changes around its runtime call, given back by gb_close. */
typedef struct gb_scope {
  gb_saved saved;         /* the caller's current device */
  GB_capture_mode_t mode; /* the caller's capture interaction mode, when relaxed is 1 */
  int relaxed;
} gb_scope;

enum { GB_CALLER_MODE = 0, GB_RELAXED = 1 };

/* Make `dev` current and, with GB_RELAXED, set this thread's capture
 * interaction mode to relaxed: the runtime then lets this thread make
 * potentially unsafe calls while a capture is under way (on this thread or,
 * in global mode, on any other) without refusing them or invalidating it. */
static int gb_open(int dev, gb_scope *sc, int relax) {
  int rc = gb_enter(dev, &sc->saved);
  sc->relaxed = 0;
  if (rc != 0) return rc;
  if (relax == GB_RELAXED) {
    sc->mode = GB_(StreamCaptureModeRelaxed);
    if (GB_(ThreadExchangeStreamCaptureMode)(&sc->mode) == GB_(Success)) sc->relaxed = 1;
    else (void)GB_(GetLastError)(); /* a runtime without capture: nothing to relax */
  }
  return 0;
}

static void gb_close(gb_scope *sc) {
  if (sc->relaxed) (void)GB_(ThreadExchangeStreamCaptureMode)(&sc->mode);
  gb_leave(&sc->saved);
}

static int gb_init(gpumem_backend *be) {
  int n = 0;
  GB_error_t e;
  (void)be;
  e = GB_(GetDeviceCount)(&n);
  if (e != GB_(Success)) return gb_fail(e);
  if (n <= 0) return (int)GB_ERR_NO_DEVICE;
  return gb_driver_init();
}

static void gb_shutdown(gpumem_backend *be) {
  /* The primary contexts the backend used stay, as the runtime's own do:
   * destroying one would destroy memory that others in the process hold. */
  (void)be;
}

static int gb_device_count(gpumem_backend *be, int *count) {
  int n = 0;
  GB_error_t e;
  (void)be;
  if (!count) return (int)GB_ERR_INVALID_VALUE;
  e = GB_(GetDeviceCount)(&n);
  if (e == GB_ERR_NO_DEVICE) { /* no device is a count of 0, not an error */
    (void)GB_(GetLastError)();
    *count = 0;
    return 0;
  }
  if (e != GB_(Success)) return gb_fail(e);
  *count = n;
  return 0;
}

/* Copy a NUL-terminated string into a fixed buffer, always terminating it. */
static void gb_copy(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/*
 * Needs no current device and creates no context: properties and the PCI
 * bus id are read from the driver's device table.
 */
static int gb_device_info(gpumem_backend *be, int device, gpumem_backend_device_info *info) {
  GB_prop_t prop;
  GB_error_t e;
  unsigned char u[16];
  char pci[64];
  int rc;
  size_t i;
  (void)be;
  if (!info) return (int)GB_ERR_INVALID_VALUE;
  memset(&prop, 0, sizeof prop);
  e = GB_(GetDeviceProperties)(&prop, device);
  if (e != GB_(Success)) return gb_fail(e);
  memset(pci, 0, sizeof pci);
  e = GB_(DeviceGetPCIBusId)(pci, (int)sizeof pci - 1, device);
  if (e != GB_(Success)) return gb_fail(e);
  rc = gb_uuid(device, &prop, u);
  if (rc != 0) return rc;

  memset(info, 0, sizeof *info);
  prop.name[sizeof prop.name - 1] = '\0';
  gb_copy(info->name, sizeof info->name, prop.name);
  /* nvidia-smi's form, lower-case hex: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
  snprintf(info->uuid, sizeof info->uuid,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
           u[14], u[15]);
  /* The runtime gives "0000:17:00.0" (or "00000000:17:00.0" on some
   * versions): keep the 4-digit-domain sysfs form, lower-case, as in
   * /sys/bus/pci/devices and the header's example. nvidia-smi prints the same
   * id with an 8-digit domain and upper-case hex ("00000000:17:00.0"). */
  {
    const char *p = pci;
    size_t len = strlen(pci);
    const char *colon = strchr(pci, ':');
    if (colon && (size_t)(colon - pci) > 4 && len > 4) p = colon - 4;
    gb_copy(info->pci_bus_id, sizeof info->pci_bus_id, p);
    for (i = 0; info->pci_bus_id[i]; i++)
      info->pci_bus_id[i] = (char)tolower((unsigned char)info->pci_bus_id[i]);
  }
  info->total_bytes = (uint64_t)prop.totalGlobalMem;
  info->physical_index = gb_physical_index(device, info->uuid, info->pci_bus_id);
  return 0;
}

static int gb_mem_get_info(gpumem_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  gb_scope s;
  size_t f = 0, t = 0;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  e = GB_(MemGetInfo)(&f, &t);
  gb_close(&s);
  if (e != GB_(Success)) return gb_fail(e);
  if (free_bytes) *free_bytes = (uint64_t)f;
  if (total_bytes) *total_bytes = (uint64_t)t;
  return 0;
}

static int gb_malloc(gpumem_backend *be, int device, size_t size, void **ptr) {
  gb_scope s;
  void *p = NULL;
  GB_error_t e;
  int rc;
  (void)be;
  if (!ptr) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  e = GB_(Malloc)(&p, size);
  gb_close(&s);
  if (e != GB_(Success)) return gb_fail(e);
  *ptr = p;
  return 0;
}

static int gb_free(gpumem_backend *be, int device, void *ptr) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(Free)(ptr);
  gb_close(&s);
  return gb_fail(e);
}

static int gb_event_create(gpumem_backend *be, int device, gpumem_event *ev) {
  gb_scope s;
  GB_event_t h = NULL;
  GB_error_t e;
  int rc;
  (void)be;
  if (!ev) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  e = GB_(EventCreateWithFlags)(&h, GB_(EventDisableTiming));
  gb_close(&s);
  if (e != GB_(Success)) return gb_fail(e);
  *ev = (gpumem_event)h;
  return 0;
}

static int gb_event_destroy(gpumem_backend *be, int device, gpumem_event ev) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  e = GB_(EventDestroy)((GB_event_t)ev);
  gb_close(&s);
  return gb_fail(e);
}

static int gb_event_record(gpumem_backend *be, int device, gpumem_event ev, gpumem_stream stream) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(EventRecord)((GB_event_t)ev, (GB_stream_t)stream);
  gb_close(&s);
  return gb_fail(e);
}

static int gb_event_query(gpumem_backend *be, int device, gpumem_event ev, int *complete) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  if (!complete) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  e = GB_(EventQuery)((GB_event_t)ev);
  gb_close(&s);
  if (e == GB_ERR_NOT_READY) {
    (void)GB_(GetLastError)();
    *complete = 0;
    return 0;
  }
  if (e != GB_(Success)) return gb_fail(e);
  *complete = 1;
  return 0;
}

static int gb_event_synchronize(gpumem_backend *be, int device, gpumem_event ev) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(EventSynchronize)((GB_event_t)ev);
  gb_close(&s);
  return gb_fail(e);
}

static int gb_stream_synchronize(gpumem_backend *be, int device, gpumem_stream stream) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(StreamSynchronize)((GB_stream_t)stream);
  gb_close(&s);
  return gb_fail(e);
}

static int gb_stream_wait_event(gpumem_backend *be, int device, gpumem_stream stream, gpumem_event ev) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(StreamWaitEvent)((GB_stream_t)stream, (GB_event_t)ev, 0);
  gb_close(&s);
  return gb_fail(e);
}

static int gb_device_synchronize(gpumem_backend *be, int device) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(DeviceSynchronize)();
  gb_close(&s);
  return gb_fail(e);
}

static int gb_device_reset(gpumem_backend *be, int device) {
  gb_scope s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_open(device, &s, GB_CALLER_MODE);
  if (rc != 0) return rc;
  e = GB_(DeviceReset)();
  gb_close(&s);
  gb_after_reset(device);
  return gb_fail(e);
}

/* ---- virtual memory: device current and relaxed, the runtime's step in gb_rt_vm_* ---- */

static int gb_vm_granularity(gpumem_backend *be, int device, size_t *granularity) {
  gb_scope s;
  size_t g = 0;
  int rc;
  (void)be;
  if (!granularity) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_granularity(device, &g);
  gb_close(&s);
  if (rc != 0) return rc;
  *granularity = g;
  return 0;
}

static int gb_vm_reserve(gpumem_backend *be, int device, size_t size, void **va) {
  gb_scope s;
  void *p = NULL;
  int rc;
  (void)be;
  if (!va) return (int)GB_ERR_INVALID_VALUE;
  if (!gb_rt_vm_supported()) return (int)GB_ERR_NOT_SUPPORTED;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_reserve(size, &p);
  gb_close(&s);
  if (rc != 0) return rc;
  *va = p;
  return 0;
}

static int gb_vm_release(gpumem_backend *be, int device, void *va, size_t size) {
  gb_scope s;
  int rc;
  (void)be;
  if (!gb_rt_vm_supported()) return (int)GB_ERR_NOT_SUPPORTED;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_release(va, size);
  gb_close(&s);
  return rc;
}

static int gb_vm_create(gpumem_backend *be, int device, size_t size, gpumem_phys_handle *h) {
  gpumem_phys_handle handle = 0;
  gb_scope s;
  int rc;
  (void)be;
  if (!h) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_create(device, size, &handle);
  gb_close(&s);
  if (rc != 0) return rc;
  *h = handle;
  return 0;
}

static int gb_vm_destroy(gpumem_backend *be, int device, gpumem_phys_handle h) {
  gb_scope s;
  int rc;
  (void)be;
  if (!gb_rt_vm_supported()) return (int)GB_ERR_NOT_SUPPORTED;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_destroy(h);
  gb_close(&s);
  return rc;
}

static int gb_vm_map(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h) {
  gb_scope s;
  int rc;
  (void)be;
  if (!gb_rt_vm_supported()) return (int)GB_ERR_NOT_SUPPORTED;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_map(device, va, size, h);
  gb_close(&s);
  return rc;
}

static int gb_vm_unmap(gpumem_backend *be, int device, void *va, size_t size) {
  gb_scope s;
  int rc;
  (void)be;
  if (!gb_rt_vm_supported()) return (int)GB_ERR_NOT_SUPPORTED;
  rc = gb_open(device, &s, GB_RELAXED);
  if (rc != 0) return rc;
  rc = gb_rt_vm_unmap(va, size);
  gb_close(&s);
  return rc;
}

/* ---- stream capture ---------------------------------------------------------- */

static int gb_capture_status(GB_capture_status_t cs) {
  if (cs == GB_(StreamCaptureStatusActive)) return GPUMEM_CAPTURE_ACTIVE;
  if (cs == GB_(StreamCaptureStatusInvalidated)) return GPUMEM_CAPTURE_INVALIDATED;
  return GPUMEM_CAPTURE_NONE;
}

/*
 * Only queries, which are legal during any capture. A stream names its own
 * context, so no device is made current for one. The NULL (legacy) stream is
 * the current context's: the device's primary context is pushed, and the
 * runtime answers cudaErrorStreamCaptureImplicit while a blocking stream of
 * that context captures, which is reported as ACTIVE with id 0.
 */
static int gb_stream_capture(gpumem_backend *be, int device, gpumem_stream stream, int *status,
                             uint64_t *capture_id) {
  GB_capture_status_t cs = GB_(StreamCaptureStatusNone);
  unsigned long long id = 0;
  int rc;
  (void)be;
  if (!status || !capture_id) return (int)GB_ERR_INVALID_VALUE;
  if (stream == NULL) {
    gb_scope s;
    GB_error_t e;
    rc = gb_open(device, &s, GB_CALLER_MODE);
    if (rc != 0) return rc;
    e = GB_(StreamIsCapturing)((GB_stream_t)NULL, &cs);
    gb_close(&s);
    if (e == GB_ERR_CAPTURE_IMPLICIT) {
      (void)GB_(GetLastError)();
      *status = GPUMEM_CAPTURE_ACTIVE;
      *capture_id = 0;
      return 0;
    }
    if (e != GB_(Success)) return gb_fail(e);
    *status = gb_capture_status(cs);
    *capture_id = 0;
    return 0;
  }
  rc = gb_rt_capture_info((GB_stream_t)stream, &cs, &id);
  if (rc != 0) return rc;
  *status = gb_capture_status(cs);
  *capture_id = *status == GPUMEM_CAPTURE_NONE ? 0 : (uint64_t)id;
  return 0;
}

static gpumem_status gb_be_error_status(const gpumem_backend *be, int code) {
  (void)be;
  if (code == 0) return GPUMEM_OK;
  return gb_error_status(code);
}

static const char *gb_be_error_string(const gpumem_backend *be, int code) {
  (void)be;
  return gb_error_string(code);
}

#endif /* GPUMEM_GPU_RUNTIME_TEMPLATE_ONCE */
