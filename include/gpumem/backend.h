/**
 * \file gpumem/backend.h
 * \brief The backend vtable, for backend authors (CUDA, HIP, sim, or your own).
 *
 * The core of libgpumem calls the device only through this table. A backend
 * fills one ::gpumem_backend; the core copies the struct at gpumem_create().
 *
 * Rules (after SQLite's VFS and jemalloc's extent hooks):
 * - `version` comes first; methods are only ever appended, each group
 *   marked with the version that added it. The core checks
 *   `version >= N && method != NULL` before calling a later method.
 * - Every method takes the vtable itself first (the core's copy: use
 *   `user_data` for state) and returns 0 on success or a backend error code
 *   (for example a cudaError_t). `error_status` maps such a code to a
 *   ::gpumem_status and `error_string` gives its message.
 * - Optional methods may be NULL: the core then does without them
 *   (no virtual memory, no device reset, ...).
 * - Device numbers are the backend's visible ordinals. Methods that need a
 *   device current must set it themselves and restore the caller's current
 *   device before returning, so that no context is created on a device that
 *   was not named.
 * - No toolkit header is included here.
 *
 * Stream capture (CUDA/HIP graphs), for backend authors. While a stream is
 * captured, the runtime records work queued on it instead of running it, and
 * some calls break the capture: the runtime then invalidates it
 * (cudaErrorStreamCaptureInvalidated on later calls, and cudaStreamEndCapture
 * fails), which ruins the application's graph. The rules (CUDA runtime API,
 * cudaThreadExchangeStreamCaptureMode and cudaStreamBeginCapture; CUDA
 * Programming Guide, "Prohibited and Unhandled Operations"):
 * - "Potentially unsafe" calls (cudaMalloc, cudaMemGetInfo, cudaEventQuery,
 *   the cuMem* virtual-memory calls, ...) are refused, and invalidate the
 *   capture, when the calling thread's capture interaction mode is global (the
 *   default) and this thread has a non-relaxed capture under way or any other
 *   thread has a global-mode capture under way; or when the thread's mode is
 *   thread-local and this thread has a non-relaxed capture under way. A
 *   backend makes its own such calls in relaxed mode
 *   (cudaThreadExchangeStreamCaptureMode around them, as PyTorch's caching
 *   allocator does around cudaMalloc), so that an allocation never breaks a
 *   capture. The memory is not part of the graph: the core keeps it for the
 *   graph until the graph's pool is released.
 * - Some calls conflict with any capture, whatever the mode: synchronizing
 *   or querying a capturing stream, querying or synchronizing an event last
 *   recorded in a capture, synchronizing the device (or its context) while any
 *   of its streams captures, and using the legacy default stream (NULL) while a
 *   blocking stream of the device captures. The core does not make them while
 *   stream_capture() says a capture may be under way.
 * - Freeing device memory (cudaFree, cuMemRelease/cuMemUnmap of memory a graph
 *   may use) is never made legal by relaxing: cudaFree synchronizes the device,
 *   and the graph may still use the memory. A backend's free() stays in the
 *   caller's mode; the core defers frees while a capture is under way.
 * - stream_capture() itself must be legal during any capture, from any
 *   thread, and must never invalidate one.
 */
#ifndef GPUMEM_BACKEND_H
#define GPUMEM_BACKEND_H

#include "../gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

/** \brief The vtable version this header describes. */
#define GPUMEM_BACKEND_VERSION 4

/** \brief An event handle (cudaEvent_t, hipEvent_t, or the backend's own). */
typedef void *gpumem_event;

/** \brief A physical memory handle for the virtual-memory methods. */
typedef uint64_t gpumem_phys_handle;

/** \brief The backend vtable (see struct gpumem_backend). */
typedef struct gpumem_backend gpumem_backend;

/** \brief Device description filled by gpumem_backend::device_info. */
typedef struct gpumem_backend_device_info {
  char name[256];       /**< device name */
  char uuid[64];        /**< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
  char pci_bus_id[32];  /**< "0000:17:00.0" */
  uint64_t total_bytes; /**< total device memory */
  int physical_index;   /**< index before CUDA_VISIBLE_DEVICES remapping, -1 if unknown */
  /** 1: the device exists for this process only (the sim without `GPUMEM_SIM_SHARED`), so no other
   *  process shares it and the core looks for no peers; 0 (what a backend that does not know this member
   *  leaves: the core clears the struct first): processes that see the same `uuid` share one device. */
  int private_device;
} gpumem_backend_device_info;

/** \brief `int init(gpumem_backend *be)`: probe the driver; return non-zero (mapped by error_status, normally to ::GPUMEM_ERR_NO_BACKEND) if unusable. */
typedef int (*gpumem_backend_init_fn)(gpumem_backend *be);
/** \brief `void shutdown(gpumem_backend *be)`: release what init took. */
typedef void (*gpumem_backend_shutdown_fn)(gpumem_backend *be);
/** \brief `int device_count(gpumem_backend *be, int *count)`. */
typedef int (*gpumem_backend_device_count_fn)(gpumem_backend *be, int *count);
/** \brief `int device_info(gpumem_backend *be, int device, gpumem_backend_device_info *info)`. */
typedef int (*gpumem_backend_device_info_fn)(gpumem_backend *be, int device, gpumem_backend_device_info *info);
/** \brief `int mem_get_info(gpumem_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes)`. */
typedef int (*gpumem_backend_mem_get_info_fn)(gpumem_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes);
/** \brief `int malloc(gpumem_backend *be, int device, size_t size, void **ptr)`: plain device memory, aligned to at least 256 bytes. */
typedef int (*gpumem_backend_malloc_fn)(gpumem_backend *be, int device, size_t size, void **ptr);
/** \brief `int free(gpumem_backend *be, int device, void *ptr)`. */
typedef int (*gpumem_backend_free_fn)(gpumem_backend *be, int device, void *ptr);
/** \brief `int event_create(gpumem_backend *be, int device, gpumem_event *ev)`: an event for ordering only (no timing). */
typedef int (*gpumem_backend_event_create_fn)(gpumem_backend *be, int device, gpumem_event *ev);
/** \brief `int event_destroy(gpumem_backend *be, int device, gpumem_event ev)`. */
typedef int (*gpumem_backend_event_destroy_fn)(gpumem_backend *be, int device, gpumem_event ev);
/** \brief `int event_record(gpumem_backend *be, int device, gpumem_event ev, gpumem_stream stream)`. */
typedef int (*gpumem_backend_event_record_fn)(gpumem_backend *be, int device, gpumem_event ev, gpumem_stream stream);
/** \brief `int event_query(gpumem_backend *be, int device, gpumem_event ev, int *complete)`: *complete = 1 when the work before the record has finished. */
typedef int (*gpumem_backend_event_query_fn)(gpumem_backend *be, int device, gpumem_event ev, int *complete);
/** \brief `int event_synchronize(gpumem_backend *be, int device, gpumem_event ev)`: wait for the event. */
typedef int (*gpumem_backend_event_synchronize_fn)(gpumem_backend *be, int device, gpumem_event ev);
/** \brief `int stream_synchronize(gpumem_backend *be, int device, gpumem_stream stream)`. */
typedef int (*gpumem_backend_stream_synchronize_fn)(gpumem_backend *be, int device, gpumem_stream stream);
/** \brief `int device_synchronize(gpumem_backend *be, int device)`. */
typedef int (*gpumem_backend_device_synchronize_fn)(gpumem_backend *be, int device);
/** \brief `int device_reset(gpumem_backend *be, int device)`: optional (NULL = not supported); destroys every allocation of the process on the device. */
typedef int (*gpumem_backend_device_reset_fn)(gpumem_backend *be, int device);
/** \brief `gpumem_status error_status(const gpumem_backend *be, int code)`: map a backend code (non-zero) to ::GPUMEM_ERR_OUT_OF_MEMORY, ::GPUMEM_ERR_NO_BACKEND, ::GPUMEM_ERR_INVALID_DEVICE, ::GPUMEM_ERR_INVALID_ARGUMENT (bad configuration, e.g. environment) or ::GPUMEM_ERR_BACKEND. NULL = always ::GPUMEM_ERR_BACKEND. */
typedef gpumem_status (*gpumem_backend_error_status_fn)(const gpumem_backend *be, int code);
/** \brief `const char *error_string(const gpumem_backend *be, int code)`: static message for a code. */
typedef const char *(*gpumem_backend_error_string_fn)(const gpumem_backend *be, int code);

/** \brief `int vm_granularity(gpumem_backend *be, int device, size_t *granularity)`: physical chunk granularity (e.g. 2 MiB). */
typedef int (*gpumem_backend_vm_granularity_fn)(gpumem_backend *be, int device, size_t *granularity);
/** \brief `int vm_reserve(gpumem_backend *be, int device, size_t size, void **va)`: reserve an address range (no memory behind it). */
typedef int (*gpumem_backend_vm_reserve_fn)(gpumem_backend *be, int device, size_t size, void **va);
/** \brief `int vm_release(gpumem_backend *be, int device, void *va, size_t size)`: release a reserved range (everything unmapped first). */
typedef int (*gpumem_backend_vm_release_fn)(gpumem_backend *be, int device, void *va, size_t size);
/** \brief `int vm_create(gpumem_backend *be, int device, size_t size, gpumem_phys_handle *h)`: create a physical chunk (size a multiple of the granularity). */
typedef int (*gpumem_backend_vm_create_fn)(gpumem_backend *be, int device, size_t size, gpumem_phys_handle *h);
/** \brief `int vm_destroy(gpumem_backend *be, int device, gpumem_phys_handle h)`: release a physical chunk (memory returns to the device once also unmapped). */
typedef int (*gpumem_backend_vm_destroy_fn)(gpumem_backend *be, int device, gpumem_phys_handle h);
/** \brief `int vm_map(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h)`: map a chunk at va and make it readable and writable by the device. */
typedef int (*gpumem_backend_vm_map_fn)(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h);
/** \brief `int vm_unmap(gpumem_backend *be, int device, void *va, size_t size)`: unmap a range mapped by vm_map. */
typedef int (*gpumem_backend_vm_unmap_fn)(gpumem_backend *be, int device, void *va, size_t size);

/**
 * \brief `void annotate_alloc(gpumem_backend *be, int device, void *ptr, size_t size)`: optional (version 2).
 *
 * Called by the core after a block of `size` requested bytes at `ptr` was
 * handed out to the application, so that a checking tool (compute-sanitizer
 * through NVTX, valgrind's memcheck) treats exactly those bytes as one
 * allocation. Called from any thread, possibly concurrently; no lock of the
 * core is held. Returns nothing: an annotation never fails an allocation.
 */
typedef void (*gpumem_backend_annotate_alloc_fn)(gpumem_backend *be, int device, void *ptr, size_t size);
/**
 * \brief `void annotate_free(gpumem_backend *be, int device, void *ptr, size_t size)`: optional (version 2).
 *
 * Called by the core before the block at `ptr` (announced by annotate_alloc
 * with the same `size`) goes back to the pool: by gpumem_free(), and for
 * every live block of a device at gpumem_reset() and at gpumem_destroy()
 * with ::GPUMEM_DESTROY_FORCE. Called from any thread, possibly concurrently.
 */
typedef void (*gpumem_backend_annotate_free_fn)(gpumem_backend *be, int device, void *ptr, size_t size);

/** \brief stream_capture() status: the stream is not capturing. */
#define GPUMEM_CAPTURE_NONE 0
/** \brief stream_capture() status: the stream is capturing (for the NULL stream: a blocking stream of the device is, so work on the NULL stream would break that capture). */
#define GPUMEM_CAPTURE_ACTIVE 1
/** \brief stream_capture() status: the stream's capture was invalidated and not yet ended. */
#define GPUMEM_CAPTURE_INVALIDATED 2

/**
 * \brief `int stream_capture(gpumem_backend *be, int device, gpumem_stream stream, int *status, uint64_t *capture_id)`: optional (version 3).
 *
 * Reports whether `stream` (of visible device `device`) is being captured
 * into a graph: `*status` is ::GPUMEM_CAPTURE_NONE, ::GPUMEM_CAPTURE_ACTIVE
 * or ::GPUMEM_CAPTURE_INVALIDATED; `*capture_id` is the id of the capture
 * sequence (cudaStreamGetCaptureInfo's id: unique per capture sequence in the
 * process), 0 when there is none. For the NULL (legacy default) stream, which
 * cannot itself be captured, the answer is cudaStreamIsCapturing's:
 * ::GPUMEM_CAPTURE_ACTIVE with id 0 while a blocking stream of the device
 * captures (work queued on the NULL stream would then invalidate that
 * capture), else ::GPUMEM_CAPTURE_NONE.
 *
 * Must be legal during any capture in any mode, from any thread, and must not
 * invalidate one (see the rules in this file's description). Called from any
 * thread, possibly concurrently; no lock of the core is held. The core asks
 * only about the NULL stream and the streams the current call passes (and a
 * stream routed by gpumem_graph_pool_begin() until its route ends): a CUDA
 * query of a destroyed stream crashes. NULL: the backend has no capture (the
 * core treats every stream as not capturing).
 * Returns 0, or a backend code for a bad device or stream.
 */
typedef int (*gpumem_backend_stream_capture_fn)(gpumem_backend *be, int device, gpumem_stream stream, int *status,
                                                uint64_t *capture_id);

/**
 * \brief `int stream_wait_event(gpumem_backend *be, int device, gpumem_stream stream, gpumem_event ev)`:
 * make the work queued on `stream` after this call wait, on the device, for the work before `ev`'s
 * last record (cudaStreamWaitEvent / hipStreamWaitEvent); the host does not wait. Optional
 * (version 4; NULL = no stream dependencies): with it, a stream about to grow the pool past its peak
 * may take memory another stream freed and the device has not reached yet, ordered after that
 * stream's work instead of waited for. The core calls it only during a call that named `stream`,
 * never on a capturing stream, with an event it recorded. Returns 0 or a backend code.
 */
typedef int (*gpumem_backend_stream_wait_event_fn)(gpumem_backend *be, int device, gpumem_stream stream,
                                                   gpumem_event ev);

/**
 * \brief A backend: data members first, then methods (version 1, then versions 2, 3 and 4).
 */
struct gpumem_backend {
  uint32_t version;    /**< ::GPUMEM_BACKEND_VERSION the backend was written for (>= 1) */
  uint32_t struct_size;/**< sizeof(gpumem_backend) as the backend author compiled it */
  const char *name;    /**< "cuda", "hip", "sim", or the custom backend's name */
  void *user_data;     /**< backend state; the core never touches it */

  /* ---- version 1: required ---- */
  gpumem_backend_init_fn init;                             /**< optional: NULL = nothing to probe */
  gpumem_backend_shutdown_fn shutdown;                     /**< optional */
  gpumem_backend_device_count_fn device_count;             /**< required */
  gpumem_backend_device_info_fn device_info;               /**< required */
  gpumem_backend_mem_get_info_fn mem_get_info;             /**< required */
  gpumem_backend_malloc_fn malloc;                         /**< required */
  gpumem_backend_free_fn free;                             /**< required */
  gpumem_backend_event_create_fn event_create;             /**< optional: NULL = streams are treated as ordered by device_synchronize */
  gpumem_backend_event_destroy_fn event_destroy;           /**< optional with event_create */
  gpumem_backend_event_record_fn event_record;             /**< optional with event_create */
  gpumem_backend_event_query_fn event_query;               /**< optional with event_create */
  gpumem_backend_event_synchronize_fn event_synchronize;   /**< optional with event_create */
  gpumem_backend_stream_synchronize_fn stream_synchronize; /**< optional */
  gpumem_backend_device_synchronize_fn device_synchronize; /**< required */
  gpumem_backend_device_reset_fn device_reset;             /**< optional: NULL = GPUMEM_RESET_DEVICE not supported */
  gpumem_backend_error_status_fn error_status;             /**< optional */
  gpumem_backend_error_string_fn error_string;             /**< optional */

  /* ---- version 1: virtual memory, all optional (NULL = not supported) ---- */
  gpumem_backend_vm_granularity_fn vm_granularity; /**< optional */
  gpumem_backend_vm_reserve_fn vm_reserve;         /**< optional */
  gpumem_backend_vm_release_fn vm_release;         /**< optional */
  gpumem_backend_vm_create_fn vm_create;           /**< optional */
  gpumem_backend_vm_destroy_fn vm_destroy;         /**< optional */
  gpumem_backend_vm_map_fn vm_map;                 /**< optional */
  gpumem_backend_vm_unmap_fn vm_unmap;             /**< optional */

  /* ---- version 2: annotations for checking tools, optional (NULL = none) ----
   * The core calls them only when version >= 2 and both are non-NULL after
   * init: a backend's init may set them to NULL in the core's copy when no
   * checking tool is attached, so that they then cost nothing. */
  gpumem_backend_annotate_alloc_fn annotate_alloc; /**< optional (version 2) */
  gpumem_backend_annotate_free_fn annotate_free;   /**< optional (version 2) */

  /* ---- version 3: stream capture (graphs), optional (NULL = no capture) ---- */
  gpumem_backend_stream_capture_fn stream_capture; /**< optional (version 3) */

  /* ---- version 4: stream dependencies, optional (NULL = none) ---- */
  gpumem_backend_stream_wait_event_fn stream_wait_event; /**< optional (version 4) */
};

/**
 * \brief The built-in backends compiled into this library.
 * \param name "sim", "cuda" or "hip".
 * \return a pointer to the static vtable, or NULL if that backend is not built.
 * Thread-safe. Useful to wrap a built-in backend (tracing, fault injection).
 */
GPUMEM_API const gpumem_backend *gpumem_builtin_backend(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_BACKEND_H */
