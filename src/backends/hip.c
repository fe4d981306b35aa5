/*
 * hip.c: the "hip" backend (AMD GPUs through HIP; Debian's libamdhip64-dev).
 *
 * The same methods as the CUDA backend (gpu_runtime.inc.c), on the HIP runtime.
 * Stream capture follows the rules written in cuda.c; HIP mirrors them
 * (hipThreadExchangeStreamCaptureMode, hipStreamGetCaptureInfo).
 * With no AMD GPU (no /dev/kfd), hipGetDeviceCount returns hipErrorNoDevice:
 * gpumem_create() then gives GPUMEM_ERR_NO_BACKEND. With Debian's
 * libamdhip64 5.2 this prints nothing, at load or at hipGetDeviceCount
 * (checked: stderr empty, see tests/test_backend_probe.c); should a ROCm
 * build log to stderr, AMD_LOG_LEVEL=0 silences it (docs/GPU-TESTING.md).
 *
 * Current device: hipGetDevice / hipSetDevice, restored before returning.
 * Unlike CUDA 12+, HIP on ROCm opens every visible device when the runtime
 * initialises and hipSetDevice creates nothing the process would not have
 * anyway, so no context-stack games are needed.
 *
 * physical_index is -1 (HIP has no portable way to see through
 * HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES).
 */
#include <stdint.h>
#include <string.h>

#include <hip/hip_runtime_api.h>

#include <gpumem/backend.h>

typedef struct gb_saved {
  int prev;    /* the caller's device */
  int changed; /* 1 when we switched away from it */
} gb_saved;

static int gb_driver_init(void) { return 0; }

static int gb_enter(int dev, gb_saved *s) {
  hipError_t e;
  s->prev = 0;
  s->changed = 0;
  e = hipGetDevice(&s->prev);
  if (e != hipSuccess) {
    (void)hipGetLastError();
    return (int)e;
  }
  if (s->prev == dev) return 0;
  e = hipSetDevice(dev);
  if (e != hipSuccess) {
    (void)hipGetLastError();
    return (int)e;
  }
  s->changed = 1;
  return 0;
}

static void gb_leave(const gb_saved *s) {
  if (s->changed) (void)hipSetDevice(s->prev);
}

static void gb_after_reset(int dev) { (void)dev; }

static int gb_uuid(int dev, const hipDeviceProp_t *p, unsigned char out[16]) {
  hipUUID u;
  hipError_t e;
  (void)p;
  memset(&u, 0, sizeof u);
  e = hipDeviceGetUuid(&u, dev);
  if (e != hipSuccess) {
    (void)hipGetLastError();
    return (int)e;
  }
  memcpy(out, u.bytes, 16);
  return 0;
}

static int gb_physical_index(int dev, const char *uuid, const char *pci) {
  (void)dev;
  (void)uuid;
  (void)pci;
  return -1;
}

static gpumem_status gb_error_status(int code) {
  switch (code) {
  case hipErrorOutOfMemory:
    return GPUMEM_ERR_OUT_OF_MEMORY;
  case hipErrorNoDevice:
  case hipErrorInsufficientDriver:
  case hipErrorNotInitialized:
  case hipErrorNoBinaryForGpu:
  case hipErrorDeinitialized: /* the runtime unloading: the process is exiting */
    return GPUMEM_ERR_NO_BACKEND;
  case hipErrorInvalidDevice:
    return GPUMEM_ERR_INVALID_DEVICE;
  case hipErrorNotSupported:
    return GPUMEM_ERR_NOT_SUPPORTED;
  default:
    return GPUMEM_ERR_BACKEND;
  }
}

static const char *gb_error_string(int code) {
  const char *s = hipGetErrorString((hipError_t)code);
  return s ? s : "unknown HIP error";
}

#define GB_(name) hip##name
typedef hipError_t GB_error_t;
typedef hipDeviceProp_t GB_prop_t;
typedef hipEvent_t GB_event_t;
typedef hipStream_t GB_stream_t;
typedef hipStreamCaptureMode GB_capture_mode_t;
typedef hipStreamCaptureStatus GB_capture_status_t;
#define GB_ERR_NOT_READY hipErrorNotReady
#define GB_ERR_NO_DEVICE hipErrorNoDevice
#define GB_ERR_INVALID_VALUE hipErrorInvalidValue
#define GB_ERR_NOT_SUPPORTED hipErrorNotSupported
#define GB_ERR_CAPTURE_IMPLICIT hipErrorStreamCaptureImplicit
#include "gpu_runtime.inc.c"

static int gb_rt_capture_info(hipStream_t s, hipStreamCaptureStatus *st, unsigned long long *id) {
  return gb_fail(hipStreamGetCaptureInfo(s, st, id));
}

/* ---- virtual memory: the runtime's step of the gb_vm_* methods ---------------- */

static void gb_vm_prop(int device, hipMemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = hipMemAllocationTypePinned;
  prop->location.type = hipMemLocationTypeDevice;
  prop->location.id = device;
}

static int gb_rt_vm_supported(void) { return 1; }

static int gb_rt_vm_granularity(int device, size_t *g) {
  hipMemAllocationProp prop;
  hipError_t e;
  gb_vm_prop(device, &prop);
  e = hipMemGetAllocationGranularity(g, &prop, hipMemAllocationGranularityMinimum);
  if (e != hipSuccess) return gb_fail(e);
  if (*g == 0) return (int)hipErrorNotSupported;
  return 0;
}

static int gb_rt_vm_reserve(size_t size, void **va) {
  return gb_fail(hipMemAddressReserve(va, size, 0, NULL, 0));
}

static int gb_rt_vm_release(void *va, size_t size) { return gb_fail(hipMemAddressFree(va, size)); }

static int gb_rt_vm_create(int device, size_t size, gpumem_phys_handle *h) {
  hipMemAllocationProp prop;
  hipMemGenericAllocationHandle_t handle = NULL;
  hipError_t e;
  gb_vm_prop(device, &prop);
  e = hipMemCreate(&handle, size, &prop, 0);
  if (e != hipSuccess) return gb_fail(e);
  *h = (gpumem_phys_handle)(uintptr_t)handle;
  return 0;
}

static int gb_rt_vm_destroy(gpumem_phys_handle h) {
  return gb_fail(hipMemRelease((hipMemGenericAllocationHandle_t)(uintptr_t)h));
}

static int gb_rt_vm_map(int device, void *va, size_t size, gpumem_phys_handle h) {
  hipMemAccessDesc access;
  hipError_t e = hipMemMap(va, size, 0, (hipMemGenericAllocationHandle_t)(uintptr_t)h, 0);
  if (e == hipSuccess) {
    memset(&access, 0, sizeof access);
    access.location.type = hipMemLocationTypeDevice;
    access.location.id = device;
    access.flags = hipMemAccessFlagsProtReadWrite;
    e = hipMemSetAccess(va, size, &access, 1);
    if (e != hipSuccess) (void)hipMemUnmap(va, size); /* nothing changes on failure */
  }
  return gb_fail(e);
}

static int gb_rt_vm_unmap(void *va, size_t size) { return gb_fail(hipMemUnmap(va, size)); }

const gpumem_backend gpumem__hip_backend = {
    .version = GPUMEM_BACKEND_VERSION,
    .struct_size = sizeof(gpumem_backend),
    .name = "hip",
    .user_data = NULL,
    .init = gb_init,
    .shutdown = gb_shutdown,
    .device_count = gb_device_count,
    .device_info = gb_device_info,
    .mem_get_info = gb_mem_get_info,
    .malloc = gb_malloc,
    .free = gb_free,
    .event_create = gb_event_create,
    .event_destroy = gb_event_destroy,
    .event_record = gb_event_record,
    .event_query = gb_event_query,
    .event_synchronize = gb_event_synchronize,
    .stream_synchronize = gb_stream_synchronize,
    .device_synchronize = gb_device_synchronize,
    .device_reset = gb_device_reset,
    .error_status = gb_be_error_status,
    .error_string = gb_be_error_string,
    .vm_granularity = gb_vm_granularity,
    .vm_reserve = gb_vm_reserve,
    .vm_release = gb_vm_release,
    .vm_create = gb_vm_create,
    .vm_destroy = gb_vm_destroy,
    .vm_map = gb_vm_map,
    .vm_unmap = gb_vm_unmap,
    .stream_capture = gb_stream_capture,
    .stream_wait_event = gb_stream_wait_event,
};
