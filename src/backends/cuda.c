/*
 * cuda.c: the "cuda" backend.
 *
 * Plain memory, events and synchronisation go through the CUDA runtime
 * (linked statically: cudart_static opens libcuda.so.1 itself, so a machine
 * without a driver still loads libgpumem; cudaGetDeviceCount then fails with
 * cudaErrorInsufficientDriver and gpumem_create() returns
 * GPUMEM_ERR_NO_BACKEND, printing nothing).
 *
 * Current device. Every method that needs a device current pushes that
 * device's primary context on the calling thread's context stack
 * (cuCtxPushCurrent) and pops it before returning (cuCtxPopCurrent). It never
 * calls cudaSetDevice: since CUDA 12, cudaSetDevice(d) initialises d's
 * primary context, so "restoring" the caller's device 0 that way would create
 * a context on device 0 when the caller had only ever named device 1. Push
 * and pop leave both the driver's current context and the runtime's
 * per-thread device exactly as the caller had them, and only the named
 * device's primary context is ever created (cuDevicePrimaryCtxRetain, once
 * per device; kept until the process ends, as the runtime keeps its own).
 * The runtime uses the pushed primary context for cudaMalloc and friends, so
 * the memory is the same memory the runtime, PyTorch or CuPy use on that
 * device. After a cudaDeviceReset (ours or anyone's) the next call gets the
 * new primary context (see gb_primary).
 *
 * The driver API (contexts, virtual memory) is reached through
 * cudaGetDriverEntryPoint, so there is no link-time dependency on libcuda.
 *
 * physical_index comes from NVML (libnvidia-ml.so.1, opened with dlopen when
 * present): the NVML index of the device with the same UUID, which is the
 * index nvidia-smi shows. Without NVML it is -1.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <gpumem/backend.h>

/* ---- driver entry points ------------------------------------------------ */

typedef CUresult (*gb_cuCtxGetCurrent_t)(CUcontext *);
typedef CUresult (*gb_cuCtxPushCurrent_t)(CUcontext);
typedef CUresult (*gb_cuCtxPopCurrent_t)(CUcontext *);
typedef CUresult (*gb_cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*gb_cuDevicePrimaryCtxRetain_t)(CUcontext *, CUdevice);
typedef CUresult (*gb_cuDevicePrimaryCtxRelease_t)(CUdevice);
typedef CUresult (*gb_cuMemGetAllocationGranularity_t)(size_t *, const CUmemAllocationProp *,
                                                       CUmemAllocationGranularity_flags);
typedef CUresult (*gb_cuMemAddressReserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*gb_cuMemAddressFree_t)(CUdeviceptr, size_t);
typedef CUresult (*gb_cuMemCreate_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                     unsigned long long);
typedef CUresult (*gb_cuMemRelease_t)(CUmemGenericAllocationHandle);
typedef CUresult (*gb_cuMemMap_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*gb_cuMemSetAccess_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*gb_cuMemUnmap_t)(CUdeviceptr, size_t);
typedef CUresult (*gb_cuGetErrorString_t)(CUresult, const char **);
typedef CUresult (*gb_cuDeviceGetAttribute_t)(int *, CUdevice_attribute, CUdevice);
/* cuStreamGetCaptureInfo as of CUDA 12.0 (its _v2): the ABI gb_entry asks for by version */
typedef CUresult (*gb_cuStreamGetCaptureInfo_t)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                                const CUgraphNode **, size_t *);

static struct {
  int status; /* 0 = usable, else the cudaError_t / CUresult of the failure */
  int ndev;
  gb_cuCtxGetCurrent_t ctx_get_current;
  gb_cuCtxPushCurrent_t ctx_push_current;
  gb_cuCtxPopCurrent_t ctx_pop_current;
  gb_cuDeviceGet_t device_get;
  gb_cuDevicePrimaryCtxRetain_t primary_retain;
  gb_cuDevicePrimaryCtxRelease_t primary_release;
  gb_cuMemGetAllocationGranularity_t mem_granularity; /* the vm_* group: all or none */
  gb_cuMemAddressReserve_t mem_reserve;
  gb_cuMemAddressFree_t mem_address_free;
  gb_cuMemCreate_t mem_create;
  gb_cuMemRelease_t mem_release;
  gb_cuMemMap_t mem_map;
  gb_cuMemSetAccess_t mem_set_access;
  gb_cuMemUnmap_t mem_unmap;
  gb_cuGetErrorString_t get_error_string;
  gb_cuDeviceGetAttribute_t device_get_attribute;
  gb_cuStreamGetCaptureInfo_t stream_capture_info; /* NULL: the runtime's call answers */
} g_drv;
static pthread_once_t g_drv_once = PTHREAD_ONCE_INIT;

/* 1 once the backend holds its persistent retain of the device's primary context. */
#define GB_MAX_DEVICES 256
static atomic_int g_retained[GB_MAX_DEVICES];
static pthread_mutex_t g_primary_lock = PTHREAD_MUTEX_INITIALIZER;

static void *gb_entry(const char *symbol) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e;
#if CUDART_VERSION >= 12050
  /* the ABI of each symbol as of CUDA 12.0: every function used here has kept it since */
  e = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &q);
#elif CUDART_VERSION >= 12000
  e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &q);
#else
  e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault);
  q = cudaDriverEntryPointSuccess;
#endif
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  if (q != cudaDriverEntryPointSuccess) return NULL;
  return fn;
}

/* Function pointers and data pointers: converted through a union, which ISO C allows. */
#define GB_LOAD(field, sym)                         \
  do {                                              \
    union {                                         \
      void *p;                                      \
      __typeof__(g_drv.field) f;                    \
    } u_;                                           \
    u_.p = gb_entry(sym);                           \
    g_drv.field = u_.p ? u_.f : NULL;               \
  } while (0)

static void gb_drv_load(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    g_drv.status = (int)e;
    return;
  }
  g_drv.ndev = n;
  GB_LOAD(ctx_get_current, "cuCtxGetCurrent");
  GB_LOAD(ctx_push_current, "cuCtxPushCurrent");
  GB_LOAD(ctx_pop_current, "cuCtxPopCurrent");
  GB_LOAD(device_get, "cuDeviceGet");
  GB_LOAD(primary_retain, "cuDevicePrimaryCtxRetain");
  GB_LOAD(primary_release, "cuDevicePrimaryCtxRelease");
  GB_LOAD(get_error_string, "cuGetErrorString");
  GB_LOAD(device_get_attribute, "cuDeviceGetAttribute");
  if (!g_drv.ctx_get_current || !g_drv.ctx_push_current || !g_drv.ctx_pop_current || !g_drv.device_get ||
      !g_drv.primary_retain || !g_drv.primary_release || !g_drv.device_get_attribute) {
    g_drv.status = (int)cudaErrorCallRequiresNewerDriver;
    return;
  }
#if CUDART_VERSION >= 12050
  /* only where the ABI can be asked for by version: before 12.5 the entry point returned is the
   * runtime's own version, whose signature differs between 12.0-12.2 and 12.3 on */
  GB_LOAD(stream_capture_info, "cuStreamGetCaptureInfo");
#endif
  GB_LOAD(mem_granularity, "cuMemGetAllocationGranularity");
  GB_LOAD(mem_reserve, "cuMemAddressReserve");
  GB_LOAD(mem_address_free, "cuMemAddressFree");
  GB_LOAD(mem_create, "cuMemCreate");
  GB_LOAD(mem_release, "cuMemRelease");
  GB_LOAD(mem_map, "cuMemMap");
  GB_LOAD(mem_set_access, "cuMemSetAccess");
  GB_LOAD(mem_unmap, "cuMemUnmap");
  if (!g_drv.mem_granularity || !g_drv.mem_reserve || !g_drv.mem_address_free || !g_drv.mem_create ||
      !g_drv.mem_release || !g_drv.mem_map || !g_drv.mem_set_access || !g_drv.mem_unmap)
    g_drv.mem_granularity = NULL; /* no virtual memory */
  g_drv.status = 0;
}

static int gb_driver_init(void) {
  pthread_once(&g_drv_once, gb_drv_load);
  return g_drv.status;
}

/* ---- current device: push / pop of the named device's primary context ---- */

typedef struct gb_saved {
  int pushed;
} gb_saved;

/*
 * The primary context of visible device `dev`, active.
 *
 * The backend holds one retain per device for the life of the process
 * (taken on first use, never released: releasing the last retain would
 * destroy the context and every allocation in it). The handle itself is not
 * cached: cudaDeviceReset (ours, or the application's) destroys the primary
 * context and a later use makes a new one, so a cached handle could be stale.
 * Each call therefore asks the driver for the current handle with a
 * retain/release pair, which also re-activates a context that was reset; the
 * persistent retain keeps the pair from ever dropping the count to zero.
 */
static int gb_primary(int dev, CUcontext *out) {
  CUdevice d;
  CUcontext c = NULL;
  CUresult r;
  r = g_drv.device_get(&d, dev);
  if (r != CUDA_SUCCESS) return (int)r;
  if (!atomic_load_explicit(&g_retained[dev], memory_order_acquire)) {
    pthread_mutex_lock(&g_primary_lock);
    r = CUDA_SUCCESS;
    if (!atomic_load_explicit(&g_retained[dev], memory_order_relaxed)) {
      r = g_drv.primary_retain(&c, d);
      if (r == CUDA_SUCCESS) atomic_store_explicit(&g_retained[dev], 1, memory_order_release);
    }
    pthread_mutex_unlock(&g_primary_lock);
    if (r != CUDA_SUCCESS) return (int)r;
  }
  r = g_drv.primary_retain(&c, d);
  if (r != CUDA_SUCCESS) return (int)r;
  (void)g_drv.primary_release(d);
  *out = c;
  return 0;
}

static int gb_enter(int dev, gb_saved *s) {
  CUcontext want = NULL, cur = NULL;
  CUresult r;
  int rc;
  s->pushed = 0;
  rc = gb_driver_init();
  if (rc != 0) return rc;
  if (dev < 0 || dev >= g_drv.ndev || dev >= GB_MAX_DEVICES) return (int)cudaErrorInvalidDevice;
  rc = gb_primary(dev, &want);
  if (rc != 0) return rc;
  r = g_drv.ctx_get_current(&cur);
  if (r != CUDA_SUCCESS) return (int)r;
  if (cur == want) return 0;
  r = g_drv.ctx_push_current(want);
  if (r != CUDA_SUCCESS) return (int)r;
  s->pushed = 1;
  return 0;
}

static void gb_leave(const gb_saved *s) {
  CUcontext popped = NULL;
  if (s->pushed) (void)g_drv.ctx_pop_current(&popped);
}

static void gb_after_reset(int dev) {
  (void)dev; /* gb_primary asks for the (new) primary context on the next call */
}

/* ---- device identity ------------------------------------------------------ */

static int gb_uuid(int dev, const struct cudaDeviceProp *p, unsigned char out[16]) {
  (void)dev;
  memcpy(out, p->uuid.bytes, 16);
  return 0;
}

/* NVML, for the physical index (what nvidia-smi numbers the device). */
typedef int (*gb_nvmlInit_t)(void);
typedef int (*gb_nvmlShutdown_t)(void);
typedef int (*gb_nvmlDeviceGetHandleByUUID_t)(const char *, void **);
typedef int (*gb_nvmlDeviceGetIndex_t)(void *, unsigned int *);
static struct {
  gb_nvmlInit_t init;
  gb_nvmlShutdown_t shutdown;
  gb_nvmlDeviceGetHandleByUUID_t by_uuid;
  gb_nvmlDeviceGetIndex_t index;
} g_nvml;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

#define GB_DLSYM(field, lib, sym)     \
  do {                                \
    union {                           \
      void *p;                        \
      __typeof__(g_nvml.field) f;     \
    } u_;                             \
    u_.p = dlsym(lib, sym);           \
    g_nvml.field = u_.p ? u_.f : NULL; \
  } while (0)

static void gb_nvml_load(void) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return; /* kept open for the process's life once opened */
  GB_DLSYM(init, lib, "nvmlInit_v2");
  GB_DLSYM(shutdown, lib, "nvmlShutdown");
  GB_DLSYM(by_uuid, lib, "nvmlDeviceGetHandleByUUID");
  GB_DLSYM(index, lib, "nvmlDeviceGetIndex");
}

static int gb_physical_index(int dev, const char *uuid, const char *pci) {
  void *h = NULL;
  unsigned int idx = 0;
  int result = -1;
  (void)dev;
  (void)pci;
  pthread_once(&g_nvml_once, gb_nvml_load);
  if (!g_nvml.init || !g_nvml.shutdown || !g_nvml.by_uuid || !g_nvml.index) return -1;
  if (g_nvml.init() != 0) return -1;
  if (g_nvml.by_uuid(uuid, &h) == 0 && g_nvml.index(h, &idx) == 0) result = (int)idx;
  (void)g_nvml.shutdown();
  return result;
}

/* ---- errors ---------------------------------------------------------------- */

/* Since CUDA 10.1 runtime and driver codes share their numbers, so driver
 * results from the virtual-memory methods map the same way. */
static gpumem_status gb_error_status(int code) {
  switch (code) {
  case cudaErrorMemoryAllocation:
    return GPUMEM_ERR_OUT_OF_MEMORY;
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorInitializationError:
  case cudaErrorStubLibrary:
  case cudaErrorCallRequiresNewerDriver:
  case cudaErrorDevicesUnavailable:
  case cudaErrorDeviceNotLicensed:
  case cudaErrorSystemNotReady:
  case cudaErrorSystemDriverMismatch:
  case cudaErrorCompatNotSupportedOnDevice:
  case cudaErrorCudartUnloading: /* = CUDA_ERROR_DEINITIALIZED: the process is exiting */
    return GPUMEM_ERR_NO_BACKEND;
  case cudaErrorInvalidDevice:
    return GPUMEM_ERR_INVALID_DEVICE;
  case cudaErrorNotSupported:
    return GPUMEM_ERR_NOT_SUPPORTED;
  default:
    return GPUMEM_ERR_BACKEND;
  }
}

static const char *gb_error_string(int code) {
  const char *s = cudaGetErrorString((cudaError_t)code);
  /* a driver-only code the runtime does not know: ask the driver */
  if ((!s || strstr(s, "unrecognized")) && g_drv.get_error_string) {
    const char *d = NULL;
    if (g_drv.get_error_string((CUresult)code, &d) == CUDA_SUCCESS && d) return d;
  }
  return s ? s : "unknown CUDA error";
}

/* ---- stream capture: the rules --------------------------------------------
 *
 * What the CUDA runtime allows while a stream is captured into a graph, and
 * what this backend does about it:
 *
 * - A thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode)
 *   decides whether it may make "potentially unsafe" calls, such as
 *   cudaMalloc, which is not queued on a stream and so is not seen by the
 *   capture. Global (the default): refused while this thread has a capture
 *   under way that was not begun in relaxed mode, or while any other thread
 *   has one begun in global mode. Thread-local: refused while this thread has
 *   a non-relaxed capture under way. Relaxed: not refused. A refused call
 *   returns cudaErrorStreamCaptureUnsupported and invalidates the capture
 *   (later calls on it give cudaErrorStreamCaptureInvalidated and
 *   cudaStreamEndCapture fails): the application's graph is lost. Source: the
 *   runtime API reference of cudaThreadExchangeStreamCaptureMode and
 *   cudaStreamBeginCapture.
 *   So malloc, mem_get_info, the event create/destroy/query methods and every
 *   vm_* method (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess,
 *   ... are driver calls of the same kind) run in relaxed mode (gb_open with
 *   GB_RELAXED), as PyTorch's caching allocator runs cudaMalloc under
 *   CUDAStreamCaptureModeGuard(cudaStreamCaptureModeRelaxed) while a capture
 *   is under way (c10/cuda/CUDACachingAllocator.cpp, cudaMallocMaybeCapturing;
 *   the guard is in c10/cuda/CUDAGraphsC10Utils.h). The memory is not part
 *   of the graph; the core keeps it for the graph (its private pool).
 * - Relaxed mode does not permit calls that conflict with capture itself
 *   (the same reference: "still prohibited from API calls which necessarily
 *   conflict with stream capture, for example, attempting cudaEventQuery on
 *   an event that was last recorded inside a stream capture"). The CUDA
 *   Programming Guide, "Prohibited and Unhandled Operations": it is invalid to
 *   synchronize or query a stream that is being captured, or a captured
 *   event, because they stand for no scheduled work; it is invalid to
 *   synchronize or query a broader handle that contains a capture (the device
 *   or context while any of its streams captures: cudaDeviceSynchronize); and
 *   while a stream not created with cudaStreamNonBlocking captures, any use of
 *   the legacy NULL stream is invalid (synchronous calls such as cudaMemcpy
 *   use it too), since it would make the legacy stream depend on the capture.
 *   Such calls fail and invalidate the capture; stream_synchronize,
 *   device_synchronize, event_synchronize, device_reset and an event record
 *   or query involving a captured stream or event are therefore left in the
 *   caller's mode: the core must not make them while stream_capture() reports
 *   a capture that they touch. PyTorch likewise skips its event queries
 *   (process_events) while captures are under way and asserts that none is
 *   when it synchronizes and frees (synchronize_and_free_events).
 * - cudaFree is not made relaxed: it synchronizes the device, and memory freed
 *   while a graph may still replay would be handed to other work. PyTorch's
 *   comment on capture: "It's ok to capture cudaMallocs, as long as we never
 *   cudaFree those addresses before replay"; it frees cached blocks only when
 *   no capture is under way. The core defers its frees the same way.
 * - stream_capture() uses cuStreamGetCaptureInfo, or cudaStreamGetCaptureInfo
 *   where the driver's call fails (status and the capture sequence's id,
 *   unique per sequence in the process; the runtime's id is the driver's),
 *   and, for the NULL
 *   stream, cudaStreamIsCapturing, whose documented answer while a blocking
 *   stream of the device captures is cudaErrorStreamCaptureImplicit. Both are
 *   queries, legal during any capture.
 */

/* ---- the methods shared with HIP ------------------------------------------- */

#define GB_(name) cuda##name
typedef cudaError_t GB_error_t;
typedef struct cudaDeviceProp GB_prop_t;
typedef cudaEvent_t GB_event_t;
typedef cudaStream_t GB_stream_t;
typedef enum cudaStreamCaptureMode GB_capture_mode_t;
typedef enum cudaStreamCaptureStatus GB_capture_status_t;
#define GB_ERR_NOT_READY cudaErrorNotReady
#define GB_ERR_NO_DEVICE cudaErrorNoDevice
#define GB_ERR_INVALID_VALUE cudaErrorInvalidValue
#define GB_ERR_NOT_SUPPORTED cudaErrorNotSupported
#define GB_ERR_CAPTURE_IMPLICIT cudaErrorStreamCaptureImplicit
#include "gpu_runtime.inc.c"

/*
 * The capture question is asked at every allocation on a stream other than NULL (the
 * core's capture probe), so it goes to the driver when it can: cuStreamGetCaptureInfo costs about
 * 18 ns on an H100 against the runtime's cudaStreamGetCaptureInfo at 46 (tools/capture_cost.cu).
 * The two enums have the same values. Any driver error (no context current for a handle that
 * needs one, an implicit capture of the legacy stream) is asked again of the runtime, whose
 * answer and error codes are the backend's contract. A destroyed stream gives no error: both
 * calls read freed memory and crash (tools/dead_stream.cu), so the core asks only about the
 * streams its caller passes in the call.
 */
static int gb_rt_capture_info(cudaStream_t s, enum cudaStreamCaptureStatus *st, unsigned long long *id) {
  cudaError_t e;
  if (gb_driver_init() == 0 && g_drv.stream_capture_info) {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t cid = 0;
    if (g_drv.stream_capture_info((CUstream)s, &cs, &cid, NULL, NULL, NULL) == CUDA_SUCCESS) {
      *st = cs == CU_STREAM_CAPTURE_STATUS_ACTIVE        ? cudaStreamCaptureStatusActive
            : cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? cudaStreamCaptureStatusInvalidated
                                                         : cudaStreamCaptureStatusNone;
      *id = (unsigned long long)cid;
      return 0;
    }
  }
#if CUDART_VERSION >= 13000
  e = cudaStreamGetCaptureInfo(s, st, id, NULL, NULL, NULL, NULL);
#else
  e = cudaStreamGetCaptureInfo(s, st, id);
#endif
  return gb_fail(e);
}

/* ---- virtual memory (driver API): the runtime's step of the gb_vm_* methods ---- */

static int gb_vm_prop(int device, CUmemAllocationProp *prop) {
  CUdevice d;
  CUresult r;
  if (!g_drv.mem_granularity) return (int)cudaErrorNotSupported;
  r = g_drv.device_get(&d, device);
  if (r != CUDA_SUCCESS) return (int)r;
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = (int)d;
  return 0;
}

static int gb_rt_vm_supported(void) { return g_drv.mem_granularity != NULL; }

static int gb_rt_vm_granularity(int device, size_t *g) {
  CUmemAllocationProp prop;
  int supported = 0;
  int rc = gb_vm_prop(device, &prop);
  if (rc == 0)
    rc = (int)g_drv.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                         (CUdevice)prop.location.id);
  if (rc == 0 && !supported) rc = (int)cudaErrorNotSupported;
  if (rc == 0) rc = (int)g_drv.mem_granularity(g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  return rc;
}

static int gb_rt_vm_reserve(size_t size, void **va) {
  CUdeviceptr p = 0;
  int rc = (int)g_drv.mem_reserve(&p, size, 0, 0, 0);
  if (rc == 0) *va = (void *)(uintptr_t)p;
  return rc;
}

static int gb_rt_vm_release(void *va, size_t size) {
  return (int)g_drv.mem_address_free((CUdeviceptr)(uintptr_t)va, size);
}

static int gb_rt_vm_create(int device, size_t size, gpumem_phys_handle *h) {
  CUmemAllocationProp prop;
  CUmemGenericAllocationHandle handle = 0;
  int rc = gb_vm_prop(device, &prop);
  if (rc == 0) rc = (int)g_drv.mem_create(&handle, size, &prop, 0);
  if (rc == 0) *h = (gpumem_phys_handle)handle;
  return rc;
}

static int gb_rt_vm_destroy(gpumem_phys_handle h) { return (int)g_drv.mem_release((CUmemGenericAllocationHandle)h); }

static int gb_rt_vm_map(int device, void *va, size_t size, gpumem_phys_handle h) {
  CUmemAccessDesc access;
  CUdevice d;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)va;
  int rc = (int)g_drv.device_get(&d, device);
  if (rc == 0) rc = (int)g_drv.mem_map(p, size, 0, (CUmemGenericAllocationHandle)h, 0);
  if (rc == 0) {
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = (int)d;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = (int)g_drv.mem_set_access(p, size, &access, 1);
    if (rc != 0) (void)g_drv.mem_unmap(p, size); /* nothing changes on failure */
  }
  return rc;
}

static int gb_rt_vm_unmap(void *va, size_t size) { return (int)g_drv.mem_unmap((CUdeviceptr)(uintptr_t)va, size); }

/* ---- annotations for compute-sanitizer (NVTX memory API) -------------------
 *
 * Built with GPUMEM_WITH_NVTX (the header-only NVTX 3 of the CUDA toolkit).
 * Every cudaMalloc segment is registered as an NVTX heap used as a
 * sub-allocator (NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR over
 * NVTX_MEM_TYPE_VIRTUAL_ADDRESS, the one combination compute-sanitizer
 * supports), and every block handed out as a region of its requested size
 * (annotate_alloc, withdrawn by annotate_free). memcheck then treats the
 * bytes of a segment outside live blocks as inaccessible, so it reports a
 * write one byte past a block.
 *
 * What compute-sanitizer (2025.3, CUDA 13) does, as seen on an H200 with
 * scripts/gpu-nvtx.sh:
 *  - nvtxDomainCreateA returns NULL under it (its manual: domains have "no
 *    specific usage" yet), while the memory calls work with that NULL
 *    domain. So a NULL domain does NOT mean that no tool is attached;
 *  - nvtxMemHeapRegister fails ("not ready") on a thread with no current
 *    context, so every call here is made with the device's primary context
 *    pushed, as for any other call (the caller's thread often has none);
 *  - it refuses heaps on driver virtual memory (a reservation, or a mapped
 *    chunk: "parameters invalid"), and counts each refused call as an
 *    error. Expandable segments cannot be annotated; under compute-sanitizer
 *    init therefore hides the vm_* methods in the core's copy, and the pool
 *    uses plain segments, which it can check.
 *
 * Whether a tool is attached is decided at init the way the NVTX loader
 * itself finds one: NVTX_INJECTION64_PATH (compute-sanitizer sets it to
 * libsanitizer-collection.so, Nsight Systems to its own library) or a
 * statically linked injection. Without one, init clears the annotation
 * methods in the core's copy and nothing here runs. */
#ifdef GPUMEM_HAVE_NVTX
#include <stdlib.h>

/* NVTX's loader casts dlsym's object pointer to a function pointer (POSIX, not ISO C) */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
#include <nvtx3/nvToolsExtMem.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

typedef struct gb_nvtx_heap {
  uintptr_t base;
  size_t size;
  nvtxMemHeapHandle_t heap;
} gb_nvtx_heap;

static pthread_once_t g_nvtx_detect_once = PTHREAD_ONCE_INIT;
static int g_nvtx_tool;      /* 1: an NVTX tool is attached */
static int g_nvtx_sanitizer; /* 1: and it is compute-sanitizer */
static pthread_once_t g_nvtx_once = PTHREAD_ONCE_INIT;
static nvtxDomainHandle_t g_nvtx_domain; /* may well be NULL with a tool attached (see above); g_nvtx_lock */
static pthread_mutex_t g_nvtx_lock = PTHREAD_MUTEX_INITIALIZER;
static gb_nvtx_heap *g_nvtx_heaps; /* sorted by base; never overlapping */
static size_t g_nvtx_nheaps, g_nvtx_cap;
/* what was done, for tests/gpu/gpu_nvtx_oob (gpumem__cuda_nvtx_counters); under g_nvtx_lock */
enum { GB_NVTX_HEAPS, GB_NVTX_HEAPS_GONE, GB_NVTX_HEAPS_REFUSED, GB_NVTX_REGIONS, GB_NVTX_REGIONS_GONE, GB_NVTX_OUTSIDE,
       GB_NVTX_NCOUNT };
static long long g_nvtx_count[GB_NVTX_NCOUNT];

static void gb_nvtx_detect(void) {
  const char *p = getenv(sizeof(void *) == 4 ? "NVTX_INJECTION32_PATH" : "NVTX_INJECTION64_PATH");
  if (p != NULL && p[0] != '\0') {
    const char *base = strrchr(p, '/');
    g_nvtx_tool = 1;
    g_nvtx_sanitizer = strstr(base ? base + 1 : p, "sanitizer") != NULL;
  }
#if NVTX_SUPPORT_STATIC_INJECTION_LIBRARY && !defined(NVTX_STATIC_INJECTION_IMPL)
  if (InitializeInjectionNvtx2_fnptr != NULL) g_nvtx_tool = 1;
#endif
}

/* Run once with a context current (the sanitizer wants the runtime initialised first). */
static void gb_nvtx_init(void) {
  nvtxDomainHandle_t d = nvtxDomainCreateA("libgpumem");
  pthread_mutex_lock(&g_nvtx_lock);
  g_nvtx_domain = d;
  pthread_mutex_unlock(&g_nvtx_lock);
}

/* Index of the first heap that ends after addr. g_nvtx_lock held. */
static size_t gb_nvtx_lower(uintptr_t addr) {
  size_t lo = 0, hi = g_nvtx_nheaps;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (g_nvtx_heaps[mid].base + g_nvtx_heaps[mid].size <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The heap that holds [a, a+size) whole, or NULL. g_nvtx_lock held. */
static const gb_nvtx_heap *gb_nvtx_find(uintptr_t a, size_t size) {
  size_t i = gb_nvtx_lower(a);
  if (i == g_nvtx_nheaps) return NULL;
  const gb_nvtx_heap *h = &g_nvtx_heaps[i];
  return (a >= h->base && size <= h->size - (a - h->base)) ? h : NULL;
}

/* Register [ptr, ptr+size), just returned by cudaMalloc on `device`, as a heap. */
static void gb_nvtx_heap_add(int device, void *ptr, size_t size) {
  gb_saved s;
  pthread_once(&g_nvtx_detect_once, gb_nvtx_detect);
  if (!g_nvtx_tool || !ptr || !size) return;
  if (gb_enter(device, &s) != 0) return;
  pthread_once(&g_nvtx_once, gb_nvtx_init);
  nvtxMemVirtualRangeDesc_t range;
  nvtxMemHeapDesc_t desc;
  memset(&range, 0, sizeof range);
  range.size = size;
  range.ptr = ptr;
  memset(&desc, 0, sizeof desc);
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = (uint16_t)sizeof desc;
  desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize = sizeof range;
  desc.typeSpecificDesc = &range;
  desc.messageType = NVTX_MESSAGE_TYPE_ASCII;
  desc.message.ascii = "libgpumem segment";
  pthread_mutex_lock(&g_nvtx_lock);
  /* entries overlapping fresh memory are stale (their memory went with a
   * device reset, and the tool with it): forget them */
  size_t i = gb_nvtx_lower((uintptr_t)ptr), j = i;
  while (j < g_nvtx_nheaps && g_nvtx_heaps[j].base < (uintptr_t)ptr + size) j++;
  if (j > i) {
    memmove(&g_nvtx_heaps[i], &g_nvtx_heaps[j], (g_nvtx_nheaps - j) * sizeof *g_nvtx_heaps);
    g_nvtx_nheaps -= j - i;
  }
  int room = 1;
  if (g_nvtx_nheaps == g_nvtx_cap) {
    size_t ncap = g_nvtx_cap ? 2 * g_nvtx_cap : 64;
    gb_nvtx_heap *n = realloc(g_nvtx_heaps, ncap * sizeof *n);
    if (n) {
      g_nvtx_heaps = n;
      g_nvtx_cap = ncap;
    } else {
      room = 0; /* not annotated: the tool sees the segment as one plain allocation */
    }
  }
  if (room) {
    nvtxMemHeapHandle_t h = nvtxMemHeapRegister(g_nvtx_domain, &desc);
    if (h == NULL || h == NVTX_MEM_HEAP_HANDLE_NO_TOOL) {
      g_nvtx_count[GB_NVTX_HEAPS_REFUSED]++; /* its blocks get no regions (each would be refused too) */
    } else {
      memmove(&g_nvtx_heaps[i + 1], &g_nvtx_heaps[i], (g_nvtx_nheaps - i) * sizeof *g_nvtx_heaps);
      g_nvtx_heaps[i] = (gb_nvtx_heap){(uintptr_t)ptr, size, h};
      g_nvtx_nheaps++;
      g_nvtx_count[GB_NVTX_HEAPS]++;
    }
  }
  pthread_mutex_unlock(&g_nvtx_lock);
  gb_leave(&s);
}

/* Withdraw the heap at ptr, if any (and with it every region in it), before cudaFree. */
static void gb_nvtx_heap_remove(int device, void *ptr) {
  gb_saved s;
  if (!g_nvtx_tool || !ptr) return;
  if (gb_enter(device, &s) != 0) return;
  pthread_mutex_lock(&g_nvtx_lock);
  size_t i = gb_nvtx_lower((uintptr_t)ptr);
  if (i < g_nvtx_nheaps && g_nvtx_heaps[i].base == (uintptr_t)ptr) {
    nvtxMemHeapUnregister(g_nvtx_domain, g_nvtx_heaps[i].heap);
    memmove(&g_nvtx_heaps[i], &g_nvtx_heaps[i + 1], (g_nvtx_nheaps - i - 1) * sizeof *g_nvtx_heaps);
    g_nvtx_nheaps--;
    g_nvtx_count[GB_NVTX_HEAPS_GONE]++;
  }
  pthread_mutex_unlock(&g_nvtx_lock);
  gb_leave(&s);
}

static void cuda_annotate_alloc(gpumem_backend *be, int device, void *ptr, size_t size) {
  gb_saved s;
  (void)be;
  if (!ptr || !size) return;
  if (gb_enter(device, &s) != 0) return;
  pthread_mutex_lock(&g_nvtx_lock);
  const gb_nvtx_heap *h = gb_nvtx_find((uintptr_t)ptr, size);
  if (h) {
    nvtxMemVirtualRangeDesc_t range;
    nvtxMemRegionsRegisterBatch_t b;
    memset(&range, 0, sizeof range);
    range.size = size;
    range.ptr = ptr;
    memset(&b, 0, sizeof b);
    b.extCompatID = NVTX_EXT_COMPATID_MEM;
    b.structSize = (uint16_t)sizeof b;
    b.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    b.heap = h->heap;
    b.regionCount = 1;
    b.regionDescElementSize = sizeof range;
    b.regionDescElements = &range;
    nvtxMemRegionsRegister(g_nvtx_domain, &b);
    g_nvtx_count[GB_NVTX_REGIONS]++;
  } else {
    g_nvtx_count[GB_NVTX_OUTSIDE]++; /* a block of an expandable segment: not checked */
  }
  pthread_mutex_unlock(&g_nvtx_lock);
  gb_leave(&s);
}

static void cuda_annotate_free(gpumem_backend *be, int device, void *ptr, size_t size) {
  gb_saved s;
  (void)be;
  if (!ptr || !size) return;
  if (gb_enter(device, &s) != 0) return;
  /* ordered with the heaps' unregistration: when the segment went first,
   * its regions went with it and there is nothing to withdraw */
  pthread_mutex_lock(&g_nvtx_lock);
  if (gb_nvtx_find((uintptr_t)ptr, size)) {
    nvtxMemRegionRef_t ref;
    nvtxMemRegionsUnregisterBatch_t b;
    memset(&ref, 0, sizeof ref);
    ref.pointer = ptr;
    memset(&b, 0, sizeof b);
    b.extCompatID = NVTX_EXT_COMPATID_MEM;
    b.structSize = (uint16_t)sizeof b;
    b.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
    b.refCount = 1;
    b.refElementSize = sizeof ref;
    b.refElements = &ref;
    nvtxMemRegionsUnregister(g_nvtx_domain, &b);
    g_nvtx_count[GB_NVTX_REGIONS_GONE]++;
  }
  pthread_mutex_unlock(&g_nvtx_lock);
  gb_leave(&s);
}
#else
#define gb_nvtx_heap_add(device, ptr, size) ((void)0)
#define gb_nvtx_heap_remove(device, ptr) ((void)0)
#endif

/* For tests/gpu/gpu_nvtx_oob, not part of the API. out[0]: 1 if built with
 * NVTX (else every entry is -1); out[1]: 1 if a tool is attached; out[2]: 1
 * if it is compute-sanitizer (plain segments only); out[3]: 1 if the NVTX
 * domain is non-NULL; then heaps registered, heaps withdrawn, heaps the tool
 * refused, regions registered, regions withdrawn, blocks in no heap. */
void gpumem__cuda_nvtx_counters(long long out[10]);
void gpumem__cuda_nvtx_counters(long long out[10]) {
#ifdef GPUMEM_HAVE_NVTX
  pthread_once(&g_nvtx_detect_once, gb_nvtx_detect);
  pthread_mutex_lock(&g_nvtx_lock);
  out[0] = 1;
  out[1] = g_nvtx_tool;
  out[2] = g_nvtx_sanitizer;
  out[3] = g_nvtx_domain != NULL;
  for (int i = 0; i < GB_NVTX_NCOUNT; i++) out[4 + i] = g_nvtx_count[i];
  pthread_mutex_unlock(&g_nvtx_lock);
#else
  for (int i = 0; i < 10; i++) out[i] = -1;
#endif
}

static int cuda_init(gpumem_backend *be) {
  int rc = gb_init(be);
#ifdef GPUMEM_HAVE_NVTX
  if (rc == 0) pthread_once(&g_nvtx_detect_once, gb_nvtx_detect);
  if (rc == 0 && be != NULL) {
    if (!g_nvtx_tool) {
      /* no tool attached: the core skips the annotations entirely */
      be->annotate_alloc = NULL;
      be->annotate_free = NULL;
    } else if (g_nvtx_sanitizer) {
      /* compute-sanitizer can check plain segments only (see above): no expandable ones */
      be->vm_granularity = NULL;
      be->vm_reserve = NULL;
      be->vm_release = NULL;
      be->vm_create = NULL;
      be->vm_destroy = NULL;
      be->vm_map = NULL;
      be->vm_unmap = NULL;
    }
  }
#endif
  return rc;
}

static int cuda_malloc(gpumem_backend *be, int device, size_t size, void **ptr) {
  int rc = gb_malloc(be, device, size, ptr);
  if (rc == 0) gb_nvtx_heap_add(device, *ptr, size);
  return rc;
}

static int cuda_free(gpumem_backend *be, int device, void *ptr) {
  gb_nvtx_heap_remove(device, ptr);
  return gb_free(be, device, ptr);
}

const gpumem_backend gpumem__cuda_backend = {
    .version = GPUMEM_BACKEND_VERSION,
    .struct_size = sizeof(gpumem_backend),
    .name = "cuda",
    .user_data = NULL,
    .init = cuda_init,
    .shutdown = gb_shutdown,
    .device_count = gb_device_count,
    .device_info = gb_device_info,
    .mem_get_info = gb_mem_get_info,
    .malloc = cuda_malloc,
    .free = cuda_free,
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
#ifdef GPUMEM_HAVE_NVTX
    .annotate_alloc = cuda_annotate_alloc,
    .annotate_free = cuda_annotate_free,
#endif
    .stream_capture = gb_stream_capture,
    .stream_wait_event = gb_stream_wait_event,
};
