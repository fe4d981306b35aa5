/**
 * \file gpumem.h
 * \brief libgpumem public C API: a caching, stream-ordered GPU device memory manager.
 *
 * libgpumem takes large pieces of memory from a backend (CUDA, HIP, or the
 * host simulator "sim"), hands out pieces of them quickly, keeps freed memory
 * cached for reuse and gives cached memory back when a threshold is crossed.
 *
 * Conventions used by every function in this header:
 * - Every function returning ::gpumem_status returns ::GPUMEM_OK (0) on success.
 * - On failure, output parameters are left untouched and no allocation is
 *   changed.
 * - The library never prints unless a log callback is installed or
 *   `GPUMEM_LOG` is set, and never exits or aborts the process.
 * - A context belongs to the process that created it: in a child made by
 *   fork(), every function given an inherited context (or a scope or graph
 *   pool of one) that would take a lock, call the backend or write a file
 *   returns ::GPUMEM_ERR_NOT_SUPPORTED at once instead (gpumem_device_count(),
 *   gpumem_backend_name() and gpumem_last_backend_error() still answer); the
 *   child creates a context of its own.
 * - No CUDA or HIP header is included here; streams are passed as `void *`.
 */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** \brief Symbol visibility for the shared library. */
#if defined(_WIN32)
#  define GPUMEM_API
#elif defined(__GNUC__)
#  define GPUMEM_API __attribute__((visibility("default")))
#else
#  define GPUMEM_API
#endif

/** \brief Major version of the library. */
#define GPUMEM_VERSION_MAJOR 0
/** \brief Minor version of the library. */
#define GPUMEM_VERSION_MINOR 1
/** \brief Patch version of the library. */
#define GPUMEM_VERSION_PATCH 0
/** \brief Version as one number: major*10000 + minor*100 + patch. */
#define GPUMEM_VERSION (GPUMEM_VERSION_MAJOR * 10000 + GPUMEM_VERSION_MINOR * 100 + GPUMEM_VERSION_PATCH)

/**
 * \brief The list of status codes: XX(name, value, message).
 *
 * The enum ::gpumem_status, gpumem_status_name() and gpumem_strerror() are
 * all generated from this one list.
 */
#define GPUMEM_STATUS_MAP(XX)                                                                         \
  XX(OK, 0, "success")                                                                                \
  XX(ERR_INVALID_ARGUMENT, 1, "an argument is invalid (NULL where a pointer is required, a bad value or flag)") \
  XX(ERR_INVALID_DEVICE, 2, "the device number is not a visible device of this context")             \
  XX(ERR_INVALID_POINTER, 3, "the pointer was not handed out by this context, was already freed, or is not the start of a block") \
  XX(ERR_OUT_OF_MEMORY, 4, "the device is out of memory, even after trimming cached memory and retrying") \
  XX(ERR_LIMIT_EXCEEDED, 5, "the request would pass the configured memory limit of the device")       \
  XX(ERR_BUSY, 6, "the object still has live allocations")                                            \
  XX(ERR_NO_BACKEND, 7, "no usable backend: the requested backend is not built or has no device or driver, or the driver is unloading (a call at process exit)") \
  XX(ERR_BACKEND, 8, "the backend (CUDA, HIP, ...) reported an error; see gpumem_last_backend_error()") \
  XX(ERR_NOT_SUPPORTED, 9, "the operation is not supported by this backend or build")                 \
  XX(ERR_INTERNAL, 10, "internal error: an invariant of the library was violated")

/** \brief Status returned by every fallible libgpumem function. */
typedef enum gpumem_status {
#define GPUMEM__STATUS_ENUM(name, value, msg) GPUMEM_##name = value,
  GPUMEM_STATUS_MAP(GPUMEM__STATUS_ENUM)
#undef GPUMEM__STATUS_ENUM
  GPUMEM_STATUS_COUNT_ /**< number of status codes (not a status) */
} gpumem_status;

/** \brief Opaque context: one backend, one lazily created pool per device. */
typedef struct gpumem_context gpumem_context;

/** \brief A stream handle: `cudaStream_t` or `hipStream_t`; NULL is the default stream. */
typedef void *gpumem_stream;

/** \brief Pass as a device number to mean every visible device. */
#define GPUMEM_ALL_DEVICES (-1)

/** \brief "No limit" value for byte thresholds such as gpumem_config::release_threshold. */
#define GPUMEM_UNLIMITED UINT64_MAX

/** \brief gpumem_destroy() flag: free every live allocation instead of returning ::GPUMEM_ERR_BUSY. */
#define GPUMEM_DESTROY_FORCE 0x1u

/**
 * \brief gpumem_reset() flag: also call the backend's device reset
 *        (cudaDeviceReset / hipDeviceReset).
 *
 * DANGEROUS: this destroys every allocation of the whole process on that
 * device, including memory of other libraries and frameworks. Opt-in only.
 */
#define GPUMEM_RESET_DEVICE 0x1u

/** \brief gpumem_config::flags bit: ignore `GPUMEM_*` environment variables. */
#define GPUMEM_CONFIG_NO_ENV 0x1u

/** \brief Log levels, from most to least verbose. */
typedef enum gpumem_log_level {
  GPUMEM_LOG_DEBUG = 0, /**< every pool growth, trim and retry */
  GPUMEM_LOG_INFO = 1,  /**< context creation, device pools, resets */
  GPUMEM_LOG_WARN = 2,  /**< leaks at destroy, out-of-memory, bad environment values */
  GPUMEM_LOG_ERROR = 3, /**< backend errors */
  GPUMEM_LOG_OFF = 4    /**< nothing is logged */
} gpumem_log_level;

/**
 * \brief Log callback.
 * \param user  gpumem_config::log_user.
 * \param level severity of the message.
 * \param msg   NUL-terminated message without trailing newline; valid only during the call.
 *
 * Called from whichever thread triggered the message, possibly concurrently.
 * It must not call back into libgpumem with the same context.
 */
typedef void (*gpumem_log_fn)(void *user, gpumem_log_level level, const char *msg);

/**
 * \brief Out-of-memory callback, called after trimming and retrying failed.
 * \param user      gpumem_config::oom_user.
 * \param device    the device that is out of memory.
 * \param requested bytes that were requested.
 * \return non-zero to ask for exactly one more retry (after the callback freed
 *         memory), 0 to let the allocation fail with ::GPUMEM_ERR_OUT_OF_MEMORY.
 *
 * Called without internal locks held: it may call gpumem_free() and
 * gpumem_trim() on the same context, but should not allocate from it.
 */
typedef int (*gpumem_oom_fn)(void *user, int device, size_t requested);

struct gpumem_backend; /* see gpumem/backend.h */

/**
 * \brief Context configuration. Initialise with gpumem_config_init().
 *
 * Versioned: `struct_size` comes first, new members are only appended, so a
 * newer library accepts a struct from an older caller. Environment variables
 * `GPUMEM_<FIELD>` override the matching fields at gpumem_create() unless
 * ::GPUMEM_CONFIG_NO_ENV is set in `flags`.
 */
typedef struct gpumem_config {
  uint32_t struct_size;        /**< sizeof(gpumem_config); set by gpumem_config_init() */
  uint32_t flags;              /**< GPUMEM_CONFIG_* bits; default 0 */
  const char *backend;         /**< "auto" (NULL), "cuda", "hip" or "sim"; env GPUMEM_BACKEND */
  const struct gpumem_backend *custom_backend; /**< a user vtable, used instead of `backend` when non-NULL; copied at create */
  uint64_t release_threshold;  /**< cached free bytes a device pool may keep; default ::GPUMEM_UNLIMITED; env GPUMEM_RELEASE_THRESHOLD */
  double trim_free_fraction;   /**< give cached memory back when device free memory < this fraction of total; default 0.10; 0 disables; env GPUMEM_TRIM_FREE_FRACTION */
  uint64_t limit_bytes;        /**< hard cap on bytes reserved per device (its graph pools' included); 0 = none; env GPUMEM_LIMIT_BYTES */
  double limit_fraction;       /**< hard cap as a fraction of device total; 0 = none; env GPUMEM_LIMIT_FRACTION */
  uint64_t initial_bytes;      /**< preallocated on a device's first use; 0 = none; env GPUMEM_INITIAL_BYTES */
  gpumem_oom_fn oom_callback;  /**< called when out of memory after trim-and-retry; may be NULL */
  void *oom_user;              /**< user data for `oom_callback` */
  gpumem_log_fn log_callback;  /**< receives log messages at or above `log_level`; may be NULL */
  void *log_user;              /**< user data for `log_callback` */
  gpumem_log_level log_level;  /**< minimum level logged; default ::GPUMEM_LOG_WARN; env GPUMEM_LOG (debug|info|warn|error|off, to stderr) */
  int expandable; /**< 1: expandable virtual-memory segments where the backend supports them (default), 0: plain segments; env GPUMEM_EXPANDABLE */
  const char *share;           /**< shared GPUs: "user" (NULL, the default: this user's processes on the same GPU cooperate), "off", or a group name (letters, digits, `.`, `_`, `-`; at most 48); env GPUMEM_SHARE */
  uint32_t share_wait_ms;      /**< how long an allocation that found no device memory waits for the other members of its group to give cached memory back; default 300; env GPUMEM_SHARE_WAIT_MS */
  uint32_t watch_interval_ms;  /**< at most this often the free-memory check (trim_free_fraction) runs on calls that do not grow a pool, and a watcher thread runs it while the process holds cached memory; 0 = neither; default 200; env GPUMEM_WATCH_MS */
  int stream_deps;             /**< 1: a stream about to grow an expandable pool past its peak may take blocks other streams freed whose work the device has not finished, its later work ordered after theirs on the device (cudaStreamWaitEvent) instead of new memory being made (and one about to move idle chunks for a request takes one such block the request fits in); 0 (default): a block freed on one stream serves another only once the work before the free has completed; env GPUMEM_STREAM_DEPS */
  double peak_headroom;        /**< expandable pools: new memory may be created up to this fraction past the peak of live bytes (allocated_peak) before idle chunks are moved to where a block needs them; trades memory for the driver calls of those moves (with shapes that change every step, 0.2 holds about what PyTorch's expandable_segments holds and moves nothing once warm); in [0, 1]; 0 (default): as little as possible; ignored while the device is short of memory; env GPUMEM_PEAK_HEADROOM */
  int capture_probe;           /**< 1 (default): every allocation and free on a stream other than NULL asks the backend whether that stream is being captured into a graph (cudaStreamGetCaptureInfo), so that a capture nobody routed to a graph pool gets a pool of its own, and no call of the library invalidates it (see ::gpumem_graph_pool); the question costs what the backend charges for it (CUDA: the driver's cuStreamGetCaptureInfo, about 18 ns per allocation on such a stream on an H100), only on streams other than NULL; 0: only captures routed with gpumem_graph_pool_begin() are known (PyTorch's integration routes every capture PyTorch makes, so a process whose only captures are PyTorch's may set 0); env GPUMEM_CAPTURE_PROBE */
} gpumem_config;

/**
 * \brief Per-device information, versioned by `struct_size`.
 */
typedef struct gpumem_device_info {
  uint32_t struct_size;  /**< set by the caller to sizeof(gpumem_device_info) (0 is taken as the current size) */
  int ordinal;           /**< visible ordinal (after CUDA_VISIBLE_DEVICES) */
  char name[256];        /**< device name, e.g. "NVIDIA H200" */
  char uuid[64];         /**< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it */
  char pci_bus_id[32];   /**< "0000:17:00.0" */
  uint64_t total_bytes;  /**< device memory in total */
  uint64_t free_bytes;   /**< device memory free now, as the backend reports it */
  int physical_index;    /**< index among all devices before CUDA_VISIBLE_DEVICES, -1 if unknown */
} gpumem_device_info;

/**
 * \brief Allocation statistics of one device pool, or of all (summed).
 *
 * Versioned by `struct_size`: set it to sizeof(gpumem_stats) (0 is taken as the current size).
 */
typedef struct gpumem_stats {
  uint32_t struct_size;        /**< set by the caller */
  uint32_t reserved_;          /**< padding, always 0 */
  uint64_t allocated_bytes;    /**< bytes in live blocks (block sizes, i.e. rounded request sizes) */
  uint64_t allocated_peak;     /**< peak of allocated_bytes since creation or last peak reset */
  uint64_t reserved_bytes;     /**< bytes held from the backend */
  uint64_t reserved_peak;      /**< peak of reserved_bytes */
  uint64_t cached_bytes;       /**< reserved bytes not in live blocks (reserved - allocated) */
  uint64_t num_allocs;         /**< successful allocations (size > 0) */
  uint64_t num_frees;          /**< successful frees of non-NULL pointers */
  uint64_t num_live;           /**< live allocations */
  uint64_t num_segments;       /**< segments currently held from the backend */
  uint64_t num_backend_allocs; /**< successful backend allocations */
  uint64_t num_backend_frees;  /**< backend frees */
  uint64_t num_trims;          /**< trim operations that released memory */
  uint64_t trimmed_bytes;      /**< bytes given back by trims */
  uint64_t num_oom_retries;    /**< retries after a backend out-of-memory */
  uint64_t num_ooms;           /**< allocations that failed with out-of-memory */
  uint64_t requested_bytes;    /**< bytes asked for by live allocations (unrounded) */
  uint64_t num_limit_exceeded; /**< allocations refused by limit_bytes / limit_fraction */
  uint64_t num_share_asks;     /**< allocations that asked the other members of the shared group for memory */
  uint64_t num_share_asked;    /**< requests of other members (or of `gpumem-info --trim`) this process answered */
  uint64_t share_given_bytes;  /**< bytes of cached memory this process gave back when asked */
} gpumem_stats;

/* ---------------------------------------------------------------------- */
/* Errors                                                                  */

/**
 * \brief Name of a status, e.g. "GPUMEM_ERR_OUT_OF_MEMORY".
 * \return a static string; "GPUMEM_UNKNOWN_STATUS" for values outside the enum.
 * Thread-safe.
 */
GPUMEM_API const char *gpumem_status_name(gpumem_status s);

/**
 * \brief A sentence describing a status.
 * \return a static string; a generic sentence for values outside the enum.
 * Thread-safe.
 */
GPUMEM_API const char *gpumem_strerror(gpumem_status s);

/**
 * \brief The raw code and message of the last backend error seen by the calling thread on this context.
 * \param ctx   context.
 * \param code  receives the backend's raw code (e.g. a cudaError_t), 0 if none; may be NULL.
 * \param msg   receives the backend's message (static or valid until the next error on this thread); may be NULL.
 * \return ::GPUMEM_OK, or ::GPUMEM_ERR_INVALID_ARGUMENT if ctx is NULL.
 * Thread-safe: the record is per thread.
 */
GPUMEM_API gpumem_status gpumem_last_backend_error(gpumem_context *ctx, int *code, const char **msg);

/* ---------------------------------------------------------------------- */
/* Context                                                                 */

/**
 * \brief Fill a config with defaults (backend "auto", no limits, release
 *        threshold unlimited, trim_free_fraction 0.10, log level warn).
 * Does nothing if cfg is NULL. Thread-safe.
 */
GPUMEM_API void gpumem_config_init(gpumem_config *cfg);

/**
 * \brief Create a context.
 * \param cfg configuration, or NULL for defaults (environment still applies).
 * \param out receives the context.
 * \return ::GPUMEM_OK;
 *         ::GPUMEM_ERR_INVALID_ARGUMENT (out NULL, bad struct_size, bad config value or bad `GPUMEM_*` environment value);
 *         ::GPUMEM_ERR_NO_BACKEND (unknown backend name, backend not built, or no device/driver);
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (host memory);
 *         ::GPUMEM_ERR_BACKEND.
 * Touches no device. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_create(const gpumem_config *cfg, gpumem_context **out);

/**
 * \brief Destroy a context, giving all its memory back.
 * \param ctx   context (NULL is ::GPUMEM_ERR_INVALID_ARGUMENT).
 * \param flags 0 or ::GPUMEM_DESTROY_FORCE.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_BUSY when live allocations remain and
 *         FORCE is not given (a leak report is logged and the context stays
 *         usable); ::GPUMEM_ERR_INVALID_ARGUMENT.
 * Not thread-safe with respect to other calls on the same context.
 */
GPUMEM_API gpumem_status gpumem_destroy(gpumem_context *ctx, unsigned flags);

/**
 * \brief Number of devices visible to the context's backend.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_device_count(gpumem_context *ctx, int *count);

/**
 * \brief Information about one visible device.
 * \param ctx    context.
 * \param device visible device ordinal.
 * \param info its `struct_size` must be set (or 0 for the current size).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_BACKEND;
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (the backend reported out of memory answering).
 * Thread-safe. Restores the caller's current device.
 */
GPUMEM_API gpumem_status gpumem_device_get_info(gpumem_context *ctx, int device, gpumem_device_info *info);

/**
 * \brief Name of the backend in use ("cuda", "hip", "sim" or a custom backend's name).
 * \return a string valid for the context's lifetime; "" if ctx is NULL. Thread-safe.
 */
GPUMEM_API const char *gpumem_backend_name(const gpumem_context *ctx);

/* ---------------------------------------------------------------------- */
/* Allocation                                                              */

/**
 * \brief Allocate device memory, ready for work queued on `stream`.
 * \param ctx     context.
 * \param device  visible device ordinal.
 * \param size    bytes; 0 gives ::GPUMEM_OK and *out_ptr = NULL.
 * \param stream  the stream the memory will be used on (NULL = default stream).
 * \param out_ptr receives a pointer aligned to at least 256 bytes.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE;
 *         ::GPUMEM_ERR_OUT_OF_MEMORY; ::GPUMEM_ERR_LIMIT_EXCEEDED; ::GPUMEM_ERR_BACKEND.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_alloc(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, void **out_ptr);

/**
 * \brief Free memory from gpumem_alloc(), in order on `stream`.
 *
 * The block may serve a later allocation on `stream` at once, and on another
 * stream only after the work queued on `stream` before this call completed.
 * `stream` must exist during the call (not destroyed yet): the library may
 * record an event on it or ask whether it is being captured, and CUDA does not
 * check stream handles (a call naming a destroyed stream may crash). The
 * library uses a stream handle only in a call that passes it, so a stream may
 * be destroyed once the calls naming it have returned, except a stream noted
 * with gpumem_record_stream(), which must exist until the block is freed.
 * \return ::GPUMEM_OK (also for NULL); ::GPUMEM_ERR_INVALID_ARGUMENT (ctx NULL);
 *         ::GPUMEM_ERR_INVALID_POINTER (not from this context, already freed, or interior); ::GPUMEM_ERR_BACKEND.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_free(gpumem_context *ctx, void *ptr, gpumem_stream stream);

/**
 * \brief Look up a live allocation.
 * \param ctx    context.
 * \param ptr    a pointer returned by gpumem_alloc() (start of the block).
 * \param size   receives the requested size; may be NULL.
 * \param device receives the device; may be NULL.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_POINTER.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_ptr_info(gpumem_context *ctx, const void *ptr, size_t *size, int *device);

/**
 * \brief Allocate like gpumem_alloc() and attach a tag, shown in leak reports.
 * \param ctx, device, size, stream, out_ptr as gpumem_alloc().
 * \param tag a NUL-terminated string that must stay valid while the block is
 *            live (a string literal is typical); NULL = no tag.
 * \return as gpumem_alloc(). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_alloc_tagged(gpumem_context *ctx, int device, size_t size, gpumem_stream stream,
                                             const char *tag, void **out_ptr);

/**
 * \brief Note that work queued on `stream` uses the live block at `ptr`
 *        (PyTorch's `Tensor.record_stream`).
 *
 * When the block is later freed, it serves no allocation, on any stream (the
 * freeing stream included), before the work queued on every noted stream up to
 * the free has completed: an event is recorded on each noted stream at the
 * free, and one on the freeing stream. Once the noted streams' events have
 * completed, the block serves the freeing stream; once the freeing stream's
 * has too, every stream. Noting the block's own allocation stream, or a stream
 * noted before, changes nothing. The noted streams must stay valid until the
 * block is freed.
 * \param ctx    context.
 * \param ptr    a live block of this context (the pointer gpumem_alloc() returned).
 * \param stream a stream of the block's device (NULL = default stream).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (ctx NULL);
 *         ::GPUMEM_ERR_INVALID_POINTER (ptr is not a live block of this context);
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (no host memory for the note).
 * Thread-safe; a block may be noted from several threads at once.
 */
GPUMEM_API gpumem_status gpumem_record_stream(gpumem_context *ctx, void *ptr, gpumem_stream stream);

/* ---------------------------------------------------------------------- */
/* Graph pools (stream capture)                                            */

/**
 * \brief A private pool for memory used by captured graphs (CUDA or HIP graphs).
 *
 * Memory allocated from a graph pool is never handed to work outside the pool
 * while the pool exists, frees of its blocks return them to the pool only, and
 * trimming never takes memory from it. Its memory returns to the device when the
 * pool is released and its blocks are freed.
 *
 * A capture nobody routed (cudaStreamBeginCapture with no gpumem_graph_pool_begin())
 * gets a pool of its own: with gpumem_config.capture_probe on (the default), the
 * library asks the backend at every allocation and free on a stream other than NULL
 * whether the stream is being captured (except for a free the calling thread's cache
 * takes, keyed to that stream before the capture began: such a free gives memory of
 * the main pool back to it, and the capture stays unknown until its next allocation), and
 * from the capture's first allocation or other free the capture is known as a routed one is: its allocations, and those of the
 * streams joined to it, go to that pool, no call synchronises the device or frees
 * to it (gpumem_reset() gives ::GPUMEM_ERR_BUSY), and its memory is never handed to
 * work outside it. The library learns that such a capture has ended at the next
 * allocation or free on its stream, or at gpumem_capture_ended(): it asks the backend
 * about a stream only in a call that passes that stream, since an application may
 * destroy the stream right after its capture and CUDA does not check the handles it
 * is given (a query of a destroyed stream crashes). Until then the context stays in
 * capture mode (no thread caches, trims give nothing back, gpumem_reset() is
 * refused). When the capture has ended the pool stays, with the memory of the
 * blocks freed during the capture (the graph writes them at every launch) and of those
 * freed later, and nothing else allocates from it: call gpumem_capture_pools_release()
 * once the graphs captured that way are destroyed.
 */
typedef struct gpumem_graph_pool gpumem_graph_pool;

/**
 * \brief Create a graph pool on `device`.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE;
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (host memory). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_create(gpumem_context *ctx, int device, gpumem_graph_pool **out);

/**
 * \brief Route allocations made on `stream` (and on every stream of the same
 *        capture, while `stream` is being captured) to `pool`, until
 *        gpumem_graph_pool_end(). Several streams may be routed to one pool.
 * `stream` must exist until gpumem_graph_pool_end(): while it is routed, calls on
 * other streams of its capture may ask the backend about it.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL pool, or `stream`
 *         already routed to another pool); ::GPUMEM_ERR_OUT_OF_MEMORY (host memory). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_begin(gpumem_graph_pool *pool, gpumem_stream stream);

/**
 * \brief Stop routing `stream`'s allocations to `pool`.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL pool, or `stream` not routed to it). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_end(gpumem_graph_pool *pool, gpumem_stream stream);

/**
 * \brief Allocate from `pool` explicitly, on `stream` (routing not needed).
 * \return as gpumem_alloc(), ::GPUMEM_ERR_INVALID_ARGUMENT for a NULL pool. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_alloc(gpumem_graph_pool *pool, size_t size, gpumem_stream stream,
                                                 void **out_ptr);

/**
 * \brief Allocate exactly the range [`ptr`, `ptr` + `size`) of `pool`'s free memory.
 *
 * Restores a pool to a state recorded earlier (PyTorch's setCheckpointPoolState:
 * CUDA graph trees re-recording after a replay): `ptr` is an address a block of
 * the pool had, freed since. The range must be free, in one piece; what was free
 * around it stays free. A block freed while noted on other streams
 * (gpumem_record_stream) is waited for first, except during a capture. The block
 * is freed as any other, with gpumem_free().
 * \param pool the graph pool.
 * \param ptr  the start of the range: 256-byte aligned, inside the pool's memory.
 * \param size the bytes (rounded up to 256, as gpumem_alloc() rounds).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL or released pool, `size` 0,
 *         `ptr` not 256-byte aligned); ::GPUMEM_ERR_INVALID_POINTER (the range is not
 *         inside one of the pool's segments); ::GPUMEM_ERR_BUSY (part of the range is
 *         live, or, during a capture, still waits for noted streams);
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (host memory). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_alloc_at(gpumem_graph_pool *pool, void *ptr, size_t size);

/**
 * \brief Release a graph pool: its cached memory returns to the device now,
 *        each block still live returns when it is freed; `pool` is invalid afterwards.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL, or streams still routed to it);
 *         ::GPUMEM_ERR_BACKEND. Thread-safe; not during a capture that uses the pool.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_release(gpumem_graph_pool *pool);

/**
 * \brief Release the pools made for captures nobody routed (see ::gpumem_graph_pool)
 *        whose capture the library knows has ended: their memory goes back to the device
 *        as their blocks are freed (what is free now, at once; the rest at the next
 *        gpumem_trim() after its free).
 *
 * Call it when the graphs captured that way are destroyed: until then a graph may be
 * launched and writes its pool's memory, the blocks freed during the capture included.
 * A capture the library still knows of (under way, or ended without a call on its
 * stream since: see gpumem_capture_ended()) keeps its pool.
 * \param ctx    context.
 * \param device a device or ::GPUMEM_ALL_DEVICES.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (ctx NULL); ::GPUMEM_ERR_INVALID_DEVICE.
 *         Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_capture_pools_release(gpumem_context *ctx, int device);

/**
 * \brief Tell the library that a capture nobody routed (see ::gpumem_graph_pool) has
 *        ended, so that the context leaves capture mode now rather than at the next
 *        allocation or free on the capture's stream.
 *
 * With a `stream`, the library asks the backend about that stream (it must be alive:
 * call this after cudaStreamEndCapture and before cudaStreamDestroy) and forgets its
 * capture if it has ended; a capture still under way is kept, and a stream the library
 * found no capture on is no error. With `stream` NULL (the NULL stream is never
 * captured), the caller states that no capture nobody routed is under way on `device`:
 * every one the library knows of there is forgotten without asking (for streams
 * destroyed after their capture). The pools of those captures stay until
 * gpumem_capture_pools_release().
 * \param ctx    context.
 * \param device the stream's device; with a NULL stream, a device or ::GPUMEM_ALL_DEVICES.
 * \param stream the stream whose capture ended, or NULL (see above).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (ctx NULL); ::GPUMEM_ERR_INVALID_DEVICE
 *         (also ::GPUMEM_ALL_DEVICES with a stream). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_capture_ended(gpumem_context *ctx, int device, gpumem_stream stream);

/**
 * \brief Statistics of one graph pool (the fields of ::gpumem_stats that apply).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_graph_pool_get_stats(gpumem_graph_pool *pool, gpumem_stats *out);

/* ---------------------------------------------------------------------- */
/* Scoped handles                                                          */

/** \brief An owned allocation, released by gpumem_buffer_release(). */
typedef struct gpumem_buffer {
  gpumem_context *ctx;  /**< owning context; NULL when empty */
  void *ptr;            /**< device pointer; NULL when empty */
  size_t size;          /**< requested size */
  int device;           /**< device ordinal */
  gpumem_stream stream; /**< stream used for allocation and release */
} gpumem_buffer;

/**
 * \brief Allocate into a buffer handle.
 * \param ctx, device, size, stream as gpumem_alloc().
 * \param out receives the buffer; untouched on failure.
 * \return as gpumem_alloc(). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_buffer_alloc(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, gpumem_buffer *out);

/**
 * \brief Free the buffer's memory on its stream and zero `*buf`. NULL, an
 *        empty or already released buffer are harmless.
 * Thread-safe for different buffers.
 */
GPUMEM_API void gpumem_buffer_release(gpumem_buffer *buf);

#if defined(__GNUC__) || defined(__clang__)
/** \brief Declare a ::gpumem_buffer released automatically at the end of its C scope (GCC, Clang). */
#  define GPUMEM_SCOPED __attribute__((cleanup(gpumem_buffer_release)))
#endif

/** \brief A region: everything allocated in it is freed at gpumem_scope_end(). */
typedef struct gpumem_scope gpumem_scope;

/**
 * \brief Begin a scope on one device and stream.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_OUT_OF_MEMORY (host).
 * Thread-safe; a scope itself must be used by one thread at a time.
 */
GPUMEM_API gpumem_status gpumem_scope_begin(gpumem_context *ctx, int device, gpumem_stream stream, gpumem_scope **out);

/**
 * \brief Allocate in a scope (freed at gpumem_scope_end()).
 * \return as gpumem_alloc(); ::GPUMEM_ERR_INVALID_ARGUMENT if scope or out_ptr is NULL.
 */
GPUMEM_API gpumem_status gpumem_scope_alloc(gpumem_scope *scope, size_t size, void **out_ptr);

/**
 * \brief Tag every later allocation of a scope (shown in leak reports).
 * \param scope the scope.
 * \param tag must stay valid until the scope ends; NULL clears it.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT if scope is NULL.
 */
GPUMEM_API gpumem_status gpumem_scope_set_tag(gpumem_scope *scope, const char *tag);

/**
 * \brief End a scope: free everything allocated in it, then the scope itself.
 *
 * Blocks the scope allocated before a gpumem_reset() of its device are not freed (the reset
 * invalidated them, and their addresses may belong to another allocation since); that is not an
 * error.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL); the first error of a
 *         free (the scope is still ended and every other block freed).
 */
GPUMEM_API gpumem_status gpumem_scope_end(gpumem_scope *scope);

/* ---------------------------------------------------------------------- */
/* Trimming, reset                                                         */

/**
 * \brief Give cached memory back to the backend, keeping at most `keep_bytes` cached per device.
 * \param ctx        context.
 * \param device   a device or ::GPUMEM_ALL_DEVICES.
 * \param keep_bytes cached bytes each device may keep (0 = give back everything possible).
 * \param released receives the bytes given back; may be NULL.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_BACKEND;
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (the backend reported out of memory from a free, unmap or
 *         synchronisation: what it could give back is given back, the rest stays cached).
 * Waits for pending cross-stream frees to complete first. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_trim(gpumem_context *ctx, int device, uint64_t keep_bytes, uint64_t *released);

/**
 * \brief Set the hard cap on bytes reserved on `device` (PyTorch's
 *        `set_per_process_memory_fraction`); 0 removes the cap.
 *
 * Takes effect for the next allocation; memory already reserved above the new
 * cap stays until it is freed and trimmed (cached memory above it is trimmed now).
 * The cap is the device's: it counts and caps the graph pools of the device too
 * (::gpumem_graph_pool, those there are and those made later), as `limit_bytes` does.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_BACKEND;
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (no host memory for the device's pool, or the backend reported out
 *         of memory while the cached memory above the cap was given back: the cap is set). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_set_limit(gpumem_context *ctx, int device, uint64_t limit_bytes);

/**
 * \brief The current cap on bytes reserved on `device` (0 = none), from the
 *        config's `limit_bytes`/`limit_fraction` or gpumem_set_limit().
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_BACKEND
 *         or ::GPUMEM_ERR_OUT_OF_MEMORY (asking the device's total for a `limit_fraction` failed). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_get_limit(gpumem_context *ctx, int device, uint64_t *limit_bytes);

/**
 * \brief The largest free block cached on `device`: what one allocation can get without growing
 *        (with expandable segments, every cached byte, since idle memory is remapped where it is needed).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_largest_free_block(gpumem_context *ctx, int device, uint64_t *bytes);

/**
 * \brief Synchronise a device, invalidate every live allocation on it and give all its memory back.
 *
 * Graph pools (::gpumem_graph_pool, and the pools of captures nobody routed) are not reset: a graph
 * may still be launched and use their memory, so their blocks stay live and their memory stays theirs
 * until they are released (gpumem_graph_pool_release(), gpumem_capture_pools_release()).
 * \param ctx    context.
 * \param device a device or ::GPUMEM_ALL_DEVICES.
 * \param flags  0 or ::GPUMEM_RESET_DEVICE (dangerous: also resets the device for the whole process).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE;
 *         ::GPUMEM_ERR_NOT_SUPPORTED (RESET_DEVICE on a backend without device reset); ::GPUMEM_ERR_BACKEND
 *         or ::GPUMEM_ERR_OUT_OF_MEMORY (the backend reported that error synchronising the device:
 *         then nothing is invalidated, or from the device reset); ::GPUMEM_ERR_OUT_OF_MEMORY also when
 *         the backend annotates allocations for a memory checker (valgrind, NVTX) and there is no host
 *         memory to list the live blocks whose annotations end: nothing is invalidated; ::GPUMEM_ERR_BUSY (a stream capture
 *         is under way: one routed to a graph pool, one the library found (gpumem_config.capture_probe),
 *         or one the backend reports on the device (CUDA: a blocking stream's); synchronising the device
 *         would invalidate it: nothing is changed).
 * Later frees of invalidated pointers return ::GPUMEM_ERR_INVALID_POINTER; a scope on the device
 * frees nothing it allocated before the reset. Thread-safe, also against allocations and frees on
 * the same device in other threads (their blocks are invalidated or not, as the order falls).
 */
GPUMEM_API gpumem_status gpumem_reset(gpumem_context *ctx, int device, unsigned flags);

/* ---------------------------------------------------------------------- */
/* Statistics                                                              */

/**
 * \brief Statistics of one device, or the sum over all with ::GPUMEM_ALL_DEVICES.
 * \param ctx    context.
 * \param device a device or ::GPUMEM_ALL_DEVICES.
 * \param out its `struct_size` must be set (or 0 for the current size).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_get_stats(gpumem_context *ctx, int device, gpumem_stats *out);

/**
 * \brief Reset allocated_peak and reserved_peak to the current values.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT; ::GPUMEM_ERR_INVALID_DEVICE. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_reset_peak_stats(gpumem_context *ctx, int device);

/** \brief Output formats of gpumem_stats_format(). */
typedef enum gpumem_stats_format_kind {
  GPUMEM_STATS_JSON = 0,      /**< one JSON object, keys = the ::gpumem_stats field names */
  GPUMEM_STATS_PROMETHEUS = 1 /**< Prometheus text exposition format 0.0.4 (`# HELP`, `# TYPE`, samples) */
} gpumem_stats_format_kind;

/**
 * \brief Format the statistics as text: JSON or the Prometheus exposition format.
 *
 * JSON, one device: `{"backend":"sim","device":0,"allocated_bytes":...}` with
 * every ::gpumem_stats field (but `struct_size` and `reserved_`) as a key.
 * JSON, ::GPUMEM_ALL_DEVICES: `{"backend":"sim","devices":[{"device":0,...},...],"total":{...}}`
 * with one entry per device that has a pool and the sum over all of them.
 *
 * Prometheus: one metric family per field, named `gpumem_<field>`, with
 * labels `backend` and `device`. Current values are gauges
 * (`gpumem_reserved_bytes`, `gpumem_num_live`, the peaks, ...); cumulative
 * counts are counters with the suffix `_total` (`gpumem_num_allocs_total`,
 * `gpumem_trimmed_bytes_total`, ...). ::GPUMEM_ALL_DEVICES gives one sample
 * per device that has a pool and no summed sample (sum them in PromQL), so
 * that `sum()` never counts a device twice. See docs/MONITORING.md.
 *
 * Size handling follows snprintf: at most `len` bytes are written, always
 * NUL-terminated when `len > 0`, and `*needed` receives the size the whole
 * text needs including the terminating NUL. Call with `buf` NULL and `len`
 * 0 to learn the size; numbers may grow between two calls, so allocate some
 * slack or retry.
 *
 * Thread-safe; each device's numbers are one consistent snapshot.
 * \param ctx    context.
 * \param device a device or ::GPUMEM_ALL_DEVICES.
 * \param format ::GPUMEM_STATS_JSON or ::GPUMEM_STATS_PROMETHEUS.
 * \param buf    receives the NUL-terminated text; may be NULL only when `len` is 0.
 * \param len    size of `buf` in bytes.
 * \param needed receives the bytes the whole text needs, NUL included; may be NULL.
 * \return ::GPUMEM_OK (the whole text fits, or `buf` is NULL and `len` 0: a size query);
 *         ::GPUMEM_ERR_INVALID_ARGUMENT (ctx NULL, unknown format, `buf` NULL with `len` > 0,
 *         or `len` too small: then the text is truncated, NUL-terminated, and `*needed` is set);
 *         ::GPUMEM_ERR_INVALID_DEVICE.
 */
GPUMEM_API gpumem_status gpumem_stats_format(gpumem_context *ctx, int device, gpumem_stats_format_kind format,
                                             char *buf, size_t len, size_t *needed);

/* ---------------------------------------------------------------------- */
/* Shared GPUs                                                             */

/**
 * \brief One member of a shared group on a GPU, as gpumem_share_members() reports it.
 *
 * Versioned by `struct_size`: set it to sizeof(gpumem_share_member) in the first element (0 is taken
 * as the current size). The figures are those the member last published: at its pool's growth, its
 * trims, when it answered a request, and at every tick of its watcher.
 */
typedef struct gpumem_share_member {
  uint32_t struct_size;    /**< set by the caller (in the first element of the array) */
  int pid;                 /**< the member's process id */
  char command[32];        /**< its command name (/proc/PID/comm), printable characters only */
  char group[64];          /**< the group: "user" or the name given by gpumem_config::share */
  uint64_t reserved_bytes; /**< bytes it holds from the device */
  uint64_t cached_bytes;   /**< of them, cached (not in live blocks): what it gives back when asked */
  uint64_t live_bytes;     /**< of them, in live blocks */
  uint64_t asked;          /**< its num_share_asks */
  uint64_t was_asked;      /**< its num_share_asked */
  uint64_t given_bytes;    /**< its share_given_bytes */
  int listening;           /**< 1 while its thread answers requests (it holds cached memory) */
  int self;                /**< 1 for a member of the calling context */
} gpumem_share_member;

/**
 * \brief The members of every shared group of the calling user on the GPU of `device`.
 *
 * Groups are found by the GPU's UUID: every context of the same user that uses this physical GPU
 * with sharing on (gpumem_config::share not "off") is a member while it has a pool there. Members
 * whose process died are cleaned away, never listed. Ledgers of another user, or with contents that
 * make no sense, are skipped (logged at WARN).
 * \param ctx     context (any backend; the GPU is the one its `device` is).
 * \param device  a device of ctx.
 * \param out     receives up to `max` members; may be NULL when `max` is 0.
 * \param max     capacity of `out`.
 * \param count   receives how many members there are (may be more than `max`).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (ctx or count NULL, out NULL with max > 0, bad
 *         struct_size); ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_NOT_SUPPORTED (the device is this
 *         process's alone, as a simulated device without `GPUMEM_SIM_SHARED`: it has no group);
 *         ::GPUMEM_ERR_BACKEND.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_share_members(gpumem_context *ctx, int device, gpumem_share_member *out, size_t max,
                                              size_t *count);

/**
 * \brief Ask every member of the calling user's groups on the GPU of `device` to give cached memory back now.
 *
 * Each member (but the calling context's own) gives back up to `bytes` of its cached memory (never a
 * live block, never memory of a graph pool) and answers; the call waits until every member has
 * answered or `wait_ms` has passed. This is `gpumem-info --trim`: it frees a GPU for another job
 * without stopping any process.
 * \param ctx     context.
 * \param device  a device of ctx.
 * \param bytes   bytes asked of each member; ::GPUMEM_UNLIMITED: all its cached memory.
 * \param wait_ms longest wait for the answers.
 * \param given   receives the bytes the members report they gave back; may be NULL.
 * \param answered receives how many members answered in time; may be NULL.
 * \return ::GPUMEM_OK (also when there is no member); ::GPUMEM_ERR_INVALID_ARGUMENT (ctx NULL);
 *         ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_NOT_SUPPORTED (the device is this process's alone);
 *         ::GPUMEM_ERR_BACKEND.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_share_reclaim(gpumem_context *ctx, int device, uint64_t bytes, uint32_t wait_ms,
                                              uint64_t *given, size_t *answered);

/* ---------------------------------------------------------------------- */
/* Allocation traces                                                       */

/**
 * \brief Start recording every allocation and free of the context into a trace file.
 *
 * The file is plain text in the format gpumem-replay reads (see
 * docs/MONITORING.md): `# libgpumem trace` header comments (backend,
 * devices, date), then one line per event: `a ID SIZE STREAM` for an
 * allocation (ID: unique decimal integers in allocation order; SIZE: the
 * requested size; STREAM: the stream handle as a decimal integer, 0 = the
 * default stream; a fifth field DEVICE when the device is not 0) and
 * `f ID` for a free (`f ID STREAM` when freed on a stream other than the
 * allocation's), and `n ID STREAM` when gpumem_record_stream() noted the block
 * on a stream. A gpumem_reset() writes `f ID` for every live block of
 * the device it reset. The file is truncated; `%p` in `path` is replaced by
 * the process id and `%c` by a per-process context counter. The environment
 * variable `GPUMEM_TRACE=path` does the same at gpumem_create() (unless
 * ::GPUMEM_CONFIG_NO_ENV is set).
 *
 * Thread-safe: events of concurrent threads are written under one lock, in
 * an order consistent with the allocator (a free is written before its
 * memory can be handed out again). When no trace is recorded the cost is one
 * predictable branch per allocation and free.
 * \param ctx  context.
 * \param path file to write; a path ending in ".gz" is refused (compress the file afterwards).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (ctx or path NULL or empty, or the file
 *         cannot be created: logged with the reason); ::GPUMEM_ERR_BUSY (a trace is already
 *         being recorded); ::GPUMEM_ERR_NOT_SUPPORTED (path ends in ".gz");
 *         ::GPUMEM_ERR_OUT_OF_MEMORY (host); ::GPUMEM_ERR_NOT_SUPPORTED (ctx was inherited through fork()).
 *
 * The file is written with write(2) from a buffer of the library's own, never a stdio FILE: a
 * forked child that exits without calling the library writes nothing into it. What is buffered
 * is written at gpumem_trace_stop(), gpumem_destroy(), or when the process exits.
 */
GPUMEM_API gpumem_status gpumem_trace_start(gpumem_context *ctx, const char *path);

/**
 * \brief Stop recording: write a closing comment, flush and close the trace file.
 *
 * Blocks still live stay unfreed in the trace. Thread-safe.
 * \param ctx context.
 * \return ::GPUMEM_OK (also when no trace was being recorded); ::GPUMEM_ERR_INVALID_ARGUMENT
 *         (ctx NULL, or writing or closing the file failed, e.g. disk full: the trace is
 *         incomplete, the reason is logged, and recording has stopped all the same);
 *         ::GPUMEM_ERR_NOT_SUPPORTED (ctx was inherited through fork(): the trace is the parent's,
 *         the child neither writes nor closes it).
 */
GPUMEM_API gpumem_status gpumem_trace_stop(gpumem_context *ctx);

/* ---------------------------------------------------------------------- */
/* Framework entry points (PyTorch CUDAPluggableAllocator)                 */

/**
 * \brief PyTorch pluggable-allocator malloc on one process-wide context
 *        created on first use from the environment.
 * \return the pointer, or NULL on failure. Thread-safe.
 */
GPUMEM_API void *gpumem_torch_alloc(size_t size, int device, void *stream);

/** \brief PyTorch pluggable-allocator free on the process-wide context. Thread-safe. */
GPUMEM_API void gpumem_torch_free(void *ptr, size_t size, int device, void *stream);

/* ---------------------------------------------------------------------- */
/* Framework entry points (CuPy CFunctionAllocator)                        */

/**
 * \brief The parameter block of gpumem_cupy_malloc() and gpumem_cupy_free(): CuPy's
 *        `cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner)` passes its
 *        address to both. The caller fills it and keeps it alive and unchanged while
 *        any memory allocated through it lives.
 *
 * The Python members let a failed allocation raise a Python exception in the caller
 * (CuPy calls the allocator holding the GIL and checks for a pending exception
 * after it returns): the library holds no Python header and reaches the
 * interpreter only through these addresses, taken from the running interpreter.
 */
typedef struct gpumem_cupy_allocator {
  uint32_t struct_size; /**< sizeof(gpumem_cupy_allocator). */
  uint32_t flags;       /**< 0. */
  gpumem_context *ctx;  /**< context to allocate from; NULL: the process-wide one (gpumem_global_context()). */
  /** The stream an allocation on `device` is for (CuPy's current stream of that device:
   *  `cupy_backends.cuda.stream.get_stream_ptr`); NULL: the default stream. A return of
   *  -1 means it failed and has raised: the allocation returns NULL. */
  intptr_t (*stream_of)(int device);
  /** `PyObject_CallFunction` of the interpreter, or NULL (a failure then only returns NULL). */
  void *(*py_call)(void *callable, const char *format, ...);
  /** `Py_DecRef` of the interpreter (needed with py_call). */
  void (*py_decref)(void *obj);
  /** A Python callable, called as `on_error(size, device, status)` when an allocation
   *  fails; it raises the exception the caller is to see. */
  void *on_error;
  /** A Python callable, or NULL: `on_stream(device, stream)` returns the object that owns
   *  `stream` (CuPy's Stream). At the first allocation on a stream other than the default
   *  ones (0, 1, 2), the library calls it and keeps the reference it returns while memory
   *  allocated on that stream lives: the stream is not destroyed before the memory
   *  allocated on it is freed on it (CUDA does not check a destroyed stream's handle: a
   *  free naming one may crash). After the last such free the reference is parked, not let
   *  go, so that the next allocation on that stream calls no Python code; at most 8 are
   *  parked (process-wide, the oldest let go first), and
   *  gpumem_cupy_release_streams() lets go of them. NULL (or a block
   *  whose struct_size ends before this member): nothing held, and the application keeps
   *  each stream alive while memory allocated on it lives. If it raises, the allocation
   *  returns NULL with that exception pending. */
  void *on_stream;
} gpumem_cupy_allocator;

/**
 * \brief CuPy CFunctionAllocator malloc: `size` bytes on `device`, for the stream
 *        `param->stream_of(device)` returns.
 *
 * The block is freed by gpumem_cupy_free() in order on that same stream (CuPy's
 * free names no stream), as CuPy's own memory pool does.
 * \param param  a ::gpumem_cupy_allocator.
 * \param size   bytes (0 gives NULL, no error).
 * \param device visible device ordinal (CuPy's current device).
 * \return the pointer; NULL on failure (param NULL or of a wrong struct_size, no
 *         context, a failed stream_of, or any status of gpumem_alloc(), for
 *         instance ::GPUMEM_ERR_OUT_OF_MEMORY or ::GPUMEM_ERR_LIMIT_EXCEEDED), after
 *         `on_error(size, device, status)` has raised where it is set; the status is
 *         ::GPUMEM_ERR_INVALID_ARGUMENT for a bad param, that of gpumem_global_context()
 *         when the process-wide context cannot be created, or gpumem_alloc()'s.
 * Thread-safe.
 */
GPUMEM_API void *gpumem_cupy_malloc(void *param, size_t size, int device);

/**
 * \brief CuPy CFunctionAllocator free: `ptr` from gpumem_cupy_malloc() with the same
 *        `param`, in order on the stream it was allocated for.
 *
 * NULL, or a pointer that is not live in the context, is ignored (gpumem_free() logs
 * the latter); nothing is raised. Thread-safe.
 */
GPUMEM_API void gpumem_cupy_free(void *param, void *ptr, int device);

/**
 * \brief Let go of the CuPy stream objects held with no memory allocated on them left
 *        (the parked holds of gpumem_cupy_allocator::on_stream), so that the streams of
 *        dropped Stream objects are destroyed now.
 *
 * Holds of streams with live memory stay. Call it holding the GIL, with `param` of the
 * allocator the streams were held through (its `py_decref` lets go of them); a Stream
 * whose last reference goes is destroyed during the call.
 * \param param    a ::gpumem_cupy_allocator with `py_call`, `py_decref` and `on_stream` set.
 * \param released if not NULL, set to the number of objects let go (0 on error).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT when `param` is NULL, of a wrong
 *         struct_size, or holds no streams (no `on_stream`, `py_call` or `py_decref`):
 *         nothing is let go then.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_cupy_release_streams(void *param, size_t *released);

/**
 * \brief The process-wide context used by gpumem_torch_alloc(), created on first use.
 * \return ::GPUMEM_OK; any status of gpumem_create(). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_global_context(gpumem_context **out);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_H */
