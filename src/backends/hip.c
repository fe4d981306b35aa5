/*
 * hip.c: the "hip" backend (AMD GPUs through HIP; Debian's libamdhip64-dev).
 *
 * The same methods as the CUDA backend (gpu_backend.h), on the HIP runtime.
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
#define GB_ERR_NOT_READY hipErrorNotReady
#define GB_ERR_NO_DEVICE hipErrorNoDevice
#define GB_ERR_INVALID_VALUE hipErrorInvalidValue
#include "gpu_backend.h"

/* ---- virtual memory -------------------------------------------------------- */

static void gb_vm_prop(int device, hipMemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = hipMemAllocationTypePinned;
  prop->location.type = hipMemLocationTypeDevice;
  prop->location.id = device;
}

static int hip_vm_granularity(gpumem_backend *be, int device, size_t *granularity) {
  hipMemAllocationProp prop;
  gb_saved s;
  size_t g = 0;
  hipError_t e;
  int rc;
  (void)be;
  if (!granularity) return (int)hipErrorInvalidValue;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  gb_vm_prop(device, &prop);
  e = hipMemGetAllocationGranularity(&g, &prop, hipMemAllocationGranularityMinimum);
  gb_leave(&s);
  if (e != hipSuccess) return gb_fail(e);
  if (g == 0) return (int)hipErrorNotSupported;
  *granularity = g;
  return 0;
}

static int hip_vm_reserve(gpumem_backend *be, int device, size_t size, void **va) {
  gb_saved s;
  void *p = NULL;
  hipError_t e;
  int rc;
  (void)be;
  if (!va) return (int)hipErrorInvalidValue;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = hipMemAddressReserve(&p, size, 0, NULL, 0);
  gb_leave(&s);
  if (e != hipSuccess) return gb_fail(e);
  *va = p;
  return 0;
}

static int hip_vm_release(gpumem_backend *be, int device, void *va, size_t size) {
  gb_saved s;
  hipError_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = hipMemAddressFree(va, size);
  gb_leave(&s);
  return gb_fail(e);
}

static int hip_vm_create(gpumem_backend *be, int device, size_t size, gpumem_phys_handle *h) {
  hipMemAllocationProp prop;
  hipMemGenericAllocationHandle_t handle = NULL;
  gb_saved s;
  hipError_t e;
  int rc;
  (void)be;
  if (!h) return (int)hipErrorInvalidValue;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  gb_vm_prop(device, &prop);
  e = hipMemCreate(&handle, size, &prop, 0);
  gb_leave(&s);
  if (e != hipSuccess) return gb_fail(e);
  *h = (gpumem_phys_handle)(uintptr_t)handle;
  return 0;
}

static int hip_vm_destroy(gpumem_backend *be, int device, gpumem_phys_handle h) {
  gb_saved s;
  hipError_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = hipMemRelease((hipMemGenericAllocationHandle_t)(uintptr_t)h);
  gb_leave(&s);
  return gb_fail(e);
}

static int hip_vm_map(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h) {
  hipMemAccessDesc access;
  gb_saved s;
  hipError_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = hipMemMap(va, size, 0, (hipMemGenericAllocationHandle_t)(uintptr_t)h, 0);
  if (e == hipSuccess) {
    memset(&access, 0, sizeof access);
    access.location.type = hipMemLocationTypeDevice;
    access.location.id = device;
    access.flags = hipMemAccessFlagsProtReadWrite;
    e = hipMemSetAccess(va, size, &access, 1);
    if (e != hipSuccess) (void)hipMemUnmap(va, size); /* nothing changes on failure */
  }
  gb_leave(&s);
  return gb_fail(e);
}

static int hip_vm_unmap(gpumem_backend *be, int device, void *va, size_t size) {
  gb_saved s;
  hipError_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = hipMemUnmap(va, size);
  gb_leave(&s);
  return gb_fail(e);
}

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
    .vm_granularity = hip_vm_granularity,
    .vm_reserve = hip_vm_reserve,
    .vm_release = hip_vm_release,
    .vm_create = hip_vm_create,
    .vm_destroy = hip_vm_destroy,
    .vm_map = hip_vm_map,
    .vm_unmap = hip_vm_unmap,
};
