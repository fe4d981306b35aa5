/*
 * gpu_backend.h: the methods shared by the CUDA and HIP backends.
 *
 * The CUDA runtime API and the HIP runtime API mirror each other name for
 * name (cudaMalloc / hipMalloc, ...). This file is compiled twice: once by
 * cuda.c and once by hip.c, each of which first defines
 *
 *   GB_(name)          token paste to the runtime's prefix: GB_(Malloc) -> cudaMalloc
 *   GB_error_t         cudaError_t / hipError_t
 *   GB_prop_t          cudaDeviceProp / hipDeviceProp_t
 *   GB_ERR_NOT_READY   cudaErrorNotReady / hipErrorNotReady
 *   GB_ERR_NO_DEVICE   cudaErrorNoDevice / hipErrorNoDevice
 *   GB_ERR_INVALID_VALUE
 *
 * and these static functions:
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
 * and the type gb_saved. It is not a public header and not a separate
 * translation unit: everything in it is static.
 *
 * Rules kept by every method here: nothing is printed; a runtime error that
 * a method returns is cleared from the runtime's per-thread "last error"
 * (cudaGetLastError), so that a caller who checks cudaGetLastError() after
 * its own kernel launches does not see an out-of-memory that libgpumem
 * already handled (PyTorch's caching allocator does the same).
 */
#ifndef GPUMEM_GPU_BACKEND_TEMPLATE_ONCE
#define GPUMEM_GPU_BACKEND_TEMPLATE_ONCE

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <gpumem/backend.h>

/* A failing runtime call: clear the runtime's sticky-until-read last error and return the code. */
static int gb_fail(GB_error_t e) {
  if (e != GB_(Success)) (void)GB_(GetLastError)();
  return (int)e;
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
  gb_saved s;
  size_t f = 0, t = 0;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(MemGetInfo)(&f, &t);
  gb_leave(&s);
  if (e != GB_(Success)) return gb_fail(e);
  if (free_bytes) *free_bytes = (uint64_t)f;
  if (total_bytes) *total_bytes = (uint64_t)t;
  return 0;
}

static int gb_malloc(gpumem_backend *be, int device, size_t size, void **ptr) {
  gb_saved s;
  void *p = NULL;
  GB_error_t e;
  int rc;
  (void)be;
  if (!ptr) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(Malloc)(&p, size);
  gb_leave(&s);
  if (e != GB_(Success)) return gb_fail(e);
  *ptr = p;
  return 0;
}

static int gb_free(gpumem_backend *be, int device, void *ptr) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(Free)(ptr);
  gb_leave(&s);
  return gb_fail(e);
}

static int gb_event_create(gpumem_backend *be, int device, gpumem_event *ev) {
  gb_saved s;
  GB_event_t h = NULL;
  GB_error_t e;
  int rc;
  (void)be;
  if (!ev) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(EventCreateWithFlags)(&h, GB_(EventDisableTiming));
  gb_leave(&s);
  if (e != GB_(Success)) return gb_fail(e);
  *ev = (gpumem_event)h;
  return 0;
}

static int gb_event_destroy(gpumem_backend *be, int device, gpumem_event ev) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(EventDestroy)((GB_event_t)ev);
  gb_leave(&s);
  return gb_fail(e);
}

static int gb_event_record(gpumem_backend *be, int device, gpumem_event ev, gpumem_stream stream) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(EventRecord)((GB_event_t)ev, (GB_stream_t)stream);
  gb_leave(&s);
  return gb_fail(e);
}

static int gb_event_query(gpumem_backend *be, int device, gpumem_event ev, int *complete) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  if (!complete) return (int)GB_ERR_INVALID_VALUE;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(EventQuery)((GB_event_t)ev);
  gb_leave(&s);
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
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(EventSynchronize)((GB_event_t)ev);
  gb_leave(&s);
  return gb_fail(e);
}

static int gb_stream_synchronize(gpumem_backend *be, int device, gpumem_stream stream) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(StreamSynchronize)((GB_stream_t)stream);
  gb_leave(&s);
  return gb_fail(e);
}

static int gb_device_synchronize(gpumem_backend *be, int device) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(DeviceSynchronize)();
  gb_leave(&s);
  return gb_fail(e);
}

static int gb_device_reset(gpumem_backend *be, int device) {
  gb_saved s;
  GB_error_t e;
  int rc;
  (void)be;
  rc = gb_enter(device, &s);
  if (rc != 0) return rc;
  e = GB_(DeviceReset)();
  gb_leave(&s);
  gb_after_reset(device);
  return gb_fail(e);
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

#endif /* GPUMEM_GPU_BACKEND_TEMPLATE_ONCE */
