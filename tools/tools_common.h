/*
 * tools_common.h: helpers shared by the libgpumem tools (not installed, not API).
 *
 * Timing, medians, JSON escaping, the trace reader (format of
 * shared/traces/README.md) and stream creation per backend.
 */
#ifndef GPUMEM_TOOLS_COMMON_H
#define GPUMEM_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Monotonic clock in nanoseconds. */
uint64_t tools_now_ns(void);

/** Median of n doubles (sorts a copy); 0 for n == 0. */
double tools_median(const double *v, size_t n);

/** Print s as a JSON string literal (with quotes). */
void tools_json_string(FILE *f, const char *s);

/** Set GPUMEM_SIM_DEVICES to `value` unless it is already set; returns 1 if it was set here. */
int tools_default_sim_devices(const char *value);

/** A context on the sim backend (GPUMEM_SIM_DEVICES defaulting to 1x141GiB), for the counting tools
 *  (bench-pairs, bench-random); NULL, with a message naming `who` on stderr, when it cannot be made. */
gpumem_context *tools_sim_context(const char *who);

/* ---- the random live set (gpumem-bench's "random" pattern, bench-random) ---- */

/** At most this many blocks live. */
#define TOOLS_RANDOM_MAX_LIVE 1000

/** One operation: size > 0 allocates that many bytes (pushed at the end of the live array);
 *  size 0 frees live[index], and the last live block takes its place. */
typedef struct tools_rand_op {
  size_t size;
  size_t index;
} tools_rand_op;

/**
 * The fixed sequence of nops operations (splitmix64, seed 42): while fewer than
 * TOOLS_RANDOM_MAX_LIVE blocks are live, allocate or free with equal odds (allocate when none
 * is live); sizes log-uniform in 256 B .. 4 MiB. malloc()ed; NULL when out of host memory.
 */
tools_rand_op *tools_random_ops(size_t nops);

/* ---- traces ------------------------------------------------------------ */

/** One event of a trace, resolved at load time so that replay does no parsing or hashing. */
enum {
  TOOLS_EV_FREE = 0,  /**< 'f ID [STREAM]': free slot on stream (the allocation's unless the line names one) */
  TOOLS_EV_ALLOC = 1, /**< 'a ID SIZE STREAM [DEVICE]' */
  TOOLS_EV_NOTE = 2   /**< 'n ID STREAM': gpumem_record_stream of the live slot on stream */
};

typedef struct tools_event {
  uint64_t size;   /**< requested bytes (alloc); 0 otherwise */
  uint32_t slot;   /**< dense index of the allocation (0 .. allocs-1) */
  uint16_t stream; /**< dense stream index (0 = the trace's stream value 0 = default stream, if present) */
  uint8_t kind;    /**< TOOLS_EV_* */
} tools_event;

/** A loaded trace. */
typedef struct tools_trace {
  char *path;
  char workload[128];          /**< from "# workload NAME", else "" */
  tools_event *events;
  size_t num_events;
  size_t num_allocs;           /**< allocation events (= slots) */
  size_t num_frees;
  size_t num_unmatched_frees;  /**< frees of unknown IDs (skipped) */
  size_t num_notes;            /**< 'n' events (gpumem_record_stream of a live block) */
  size_t num_unmatched_notes;  /**< notes of unknown or freed IDs (skipped) */
  uint64_t peak_live;          /**< largest sum of live requested sizes */
  uint64_t *stream_values;     /**< STREAM value of each dense stream index */
  size_t num_streams;
  uint64_t pytorch_max_reserved;  /**< "# pytorch ... max_reserved N", 0 if absent */
  uint64_t pytorch_max_allocated; /**< "# pytorch max_allocated N", 0 if absent */
} tools_trace;

/** Which decompressor this build uses: "zlib" or "gzip -dc". */
const char *tools_trace_reader(void);

/**
 * Load a gzip (or plain text) trace. Returns 0, or -1 with a message in err.
 */
int tools_trace_load(const char *path, tools_trace *out, char *err, size_t errlen);

void tools_trace_free(tools_trace *t);

/* ---- streams ----------------------------------------------------------- */

/**
 * Create n streams for a backend: "sim" gets distinct non-NULL tokens, "cuda"
 * real streams (only when built with CUDA), anything else NULL for all
 * (reported through *all_null). Index 0 is the default stream (NULL) when
 * default0 is non-zero. Returns 0 or -1 with err.
 */
int tools_streams_create(const char *backend, int device, size_t n, int default0, gpumem_stream *out,
                         int *all_null, char *err, size_t errlen);
void tools_streams_destroy(const char *backend, int device, size_t n, gpumem_stream *s);
/** Wait for all work on the device (cuda); nothing for other backends. */
void tools_device_sync(const char *backend, int device);

#ifdef GPUMEM_HAVE_CUDA
/* tools/cuda_streams.c */
int tools_cuda_stream_create(int device, gpumem_stream *s, char *err, size_t errlen);
void tools_cuda_stream_destroy(int device, gpumem_stream s);
void tools_cuda_device_sync(int device);
#endif

#ifdef __cplusplus
}
#endif

#endif
