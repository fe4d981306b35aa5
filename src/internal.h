/*
 * internal.h: declarations shared by the files of the libgpumem core.
 *
 * Layers (each file only calls down):
 *   context.c / scope.c / torch.c / cupy.c   public entry points
 *   global.c                        the process-wide context (torch.c, the Python binding)
 *   pool.c                          per-device pool: segments, blocks, free indexes, streams, trimming
 *   ptrmap.c                        context-wide pointer index (validates every free), pure look-ups (ptrmap.h)
 *   backend.c                       registry, selection, the ONLY caller of the vtable, last backend error
 *   options.c  log.c  status.c      configuration, logging, status strings
 *   fork.c  sync.c                  fork detection and the atfork handlers (fork.h), the mutex (sync.h)
 *   hostmem.c                       the core's host memory (every malloc of the core; faults for tests)
 *
 * Nothing here is public; every name starts with gpumem__.
 */
#ifndef GPUMEM_INTERNAL_H
#define GPUMEM_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "gpumem.h"
#include "gpumem/backend.h"

#if defined(__GNUC__) || defined(__clang__)
#  define GPUMEM__PRINTF(f, a) __attribute__((format(printf, f, a)))
#  define GPUMEM__LIKELY(x) __builtin_expect(!!(x), 1)
#  define GPUMEM__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define GPUMEM__PRINTF(f, a)
#  define GPUMEM__LIKELY(x) (x)
#  define GPUMEM__UNLIKELY(x) (x)
#endif
/* A function whose parameters the compiler must keep as declared (gcc's interprocedural passes
 * drop unused ones of static functions otherwise): context.c's out-of-line misses take their
 * arguments in the registers the entry points have them in. */
#if defined(__GNUC__) && !defined(__clang__)
#  define GPUMEM__NOIPA __attribute__((noipa))
#elif defined(__clang__)
#  define GPUMEM__NOIPA __attribute__((noinline))
#else
#  define GPUMEM__NOIPA
#endif

#include "fork.h" /* fork.c: fork detection (GPUMEM__FORKED) */
#include "sync.h" /* sync.c: the mutex */

/* ---------------------------------------------------------------------- */
/* log.c                                                                   */

typedef struct gpumem__logger {
  gpumem_log_fn fn;        /* callback, or NULL */
  void *user;              /* callback user data */
  gpumem_log_level level;  /* minimum level delivered */
  int to_stderr;           /* 1 when GPUMEM_LOG asked for stderr and there is no callback */
} gpumem__logger;

const char *gpumem__log_level_name(gpumem_log_level level);
void gpumem__log(const gpumem__logger *lg, gpumem_log_level level, const char *fmt, ...) GPUMEM__PRINTF(3, 4);
void gpumem__vlog(const gpumem__logger *lg, gpumem_log_level level, const char *fmt, va_list ap);
#define GPUMEM__LOG_ON(lg, lvl) ((lg) != NULL && (lvl) >= (lg)->level && (lg)->level < GPUMEM_LOG_OFF)
/* A line at lvl goes somewhere (a callback, or stderr): what a report costly to make checks first. */
#define GPUMEM__LOG_PRINTS(lg, lvl) (GPUMEM__LOG_ON(lg, lvl) && ((lg)->fn != NULL || (lg)->to_stderr))
/* Append to buf[*len..cap), truncating (*len stops at cap - 1): reports built from pieces. */
void gpumem__bappend(char *buf, size_t cap, size_t *len, const char *fmt, ...) GPUMEM__PRINTF(4, 5);

/* ---------------------------------------------------------------------- */
/* options.c                                                               */

/** Resolved, validated configuration of a context (copied from gpumem_config + environment). */
typedef struct gpumem__options {
  char backend[64];              /* "auto", "cuda", "hip", "sim" */
  const gpumem_backend *custom_backend;
  uint64_t release_threshold;
  double trim_free_fraction;
  uint64_t limit_bytes;
  double limit_fraction;
  uint64_t initial_bytes;
  gpumem_oom_fn oom_callback;
  void *oom_user;
  gpumem__logger log;
  uint32_t flags;
  int expandable;                /* 1: expandable virtual-memory segments where supported */
  char share[64];                /* "user", "off" or a group name (share.c) */
  uint32_t share_wait_ms;
  uint32_t watch_interval_ms;    /* 0: no watcher, no periodic free-memory check */
  int stream_deps;               /* 1: a growth may take other streams' pending frees (gpumem__adopt_pending) */
  double peak_headroom;          /* [0, 1]: new memory past the live peak before idle chunks move (vmseg.c, fill) */
  int capture_probe;             /* 1: allocations and frees on streams other than NULL ask about capture (graph.c) */
} gpumem__options;

/** Kinds of option value (how the environment string is parsed). */
typedef enum gpumem__opt_kind {
  GPUMEM__OPT_STRING,     /* backend name */
  GPUMEM__OPT_BYTES_INF,  /* bytes, or unlimited/inf = GPUMEM_UNLIMITED */
  GPUMEM__OPT_BYTES_NONE, /* bytes, or none/unlimited/inf = 0 (no limit) */
  GPUMEM__OPT_BYTES,      /* bytes only */
  GPUMEM__OPT_FRACTION,   /* a finite number in [0, 1] */
  GPUMEM__OPT_LOG_LEVEL,  /* debug|info|warn|error|off */
  GPUMEM__OPT_BOOL,       /* 1|0, on|off, true|false, yes|no (an int) */
  GPUMEM__OPT_SHARE,      /* user|off|a group name (char[64]; the config's member is a string, NULL = user) */
  GPUMEM__OPT_MS          /* milliseconds, 0 .. 86400000, an optional "ms" or "s" suffix (a uint32_t) */
} gpumem__opt_kind;

/** One row of the option table (the single place that names options, env vars and defaults). */
typedef struct gpumem__option_desc {
  const char *field;       /* gpumem_config member */
  const char *env;         /* environment variable */
  gpumem__opt_kind kind;
  const char *default_text;/* the default as documented */
  const char *doc;         /* one line */
  size_t cfg_offset;       /* offset of the member in gpumem_config */
  size_t opt_offset;       /* offset of the member in gpumem__options */
} gpumem__option_desc;

/** The option table and its length (for docs and tools). */
const gpumem__option_desc *gpumem__options_table(size_t *count);

/** Resolve cfg (may be NULL) + environment into opt. Logs bad values at WARN. */
gpumem_status gpumem__options_resolve(const gpumem_config *cfg, gpumem__options *opt);
/** The cap on bytes reserved on a device of `total` bytes (0 = none): limit_bytes, or limit_fraction of total if smaller. */
uint64_t gpumem__options_limit(const gpumem__options *opt, uint64_t total);

/** Parse a byte count ("64MiB", "1.5G", "4096"); allow_inf: accept unlimited/inf (-> UINT64_MAX). 0 on success. */
int gpumem__parse_bytes(const char *s, int allow_inf, uint64_t *out);
/** A group name for gpumem_config::share: 1..48 letters, digits, ".", "_" or "-". */
int gpumem__share_name_ok(const char *s);

/* ---------------------------------------------------------------------- */
/* backend.c: the only caller of the vtable                                */

/** Select and initialise the backend (auto/name/custom) into ctx->be. */
gpumem_status gpumem__backend_open(gpumem_context *ctx);
/** Shut the backend down (once). */
void gpumem__backend_close(gpumem_context *ctx);
int gpumem__be_has_device_reset(const gpumem_context *ctx);

gpumem_status gpumem__be_device_count(gpumem_context *ctx, int *count);
gpumem_status gpumem__be_device_info(gpumem_context *ctx, int dev, gpumem_backend_device_info *info);
gpumem_status gpumem__be_mem_get_info(gpumem_context *ctx, int dev, uint64_t *free_b, uint64_t *total_b);
gpumem_status gpumem__be_malloc(gpumem_context *ctx, int dev, size_t size, void **p);
gpumem_status gpumem__be_free(gpumem_context *ctx, int dev, void *p);
gpumem_status gpumem__be_event_create(gpumem_context *ctx, int dev, gpumem_event *ev);
gpumem_status gpumem__be_event_destroy(gpumem_context *ctx, int dev, gpumem_event ev);
gpumem_status gpumem__be_event_record(gpumem_context *ctx, int dev, gpumem_event ev, gpumem_stream s);
gpumem_status gpumem__be_event_query(gpumem_context *ctx, int dev, gpumem_event ev, int *complete);
gpumem_status gpumem__be_event_synchronize(gpumem_context *ctx, int dev, gpumem_event ev);
/* version-4 backends with events: the work queued on s after the call waits on the device for ev */
int gpumem__be_has_stream_wait(const gpumem_context *ctx);
gpumem_status gpumem__be_stream_wait_event(gpumem_context *ctx, int dev, gpumem_stream s, gpumem_event ev);
gpumem_status gpumem__be_device_synchronize(gpumem_context *ctx, int dev);
gpumem_status gpumem__be_device_reset(gpumem_context *ctx, int dev);
/** 1 when the backend has both version-2 annotation methods (after its init). */
int gpumem__be_has_annotations(const gpumem_context *ctx);
void gpumem__be_annotate_alloc(gpumem_context *ctx, int dev, void *p, size_t size);
void gpumem__be_annotate_free(gpumem_context *ctx, int dev, void *p, size_t size);

/* Stream capture (backend version 3). has_capture: the backend reports capture
 * at all. stream_capture: *status one of GPUMEM_CAPTURE_NONE/ACTIVE/INVALIDATED
 * and *capture_id (0 with NONE); NONE when the backend has no capture. Legal
 * during any capture, from any thread. */
int gpumem__be_has_capture(const gpumem_context *ctx);
/* gpumem__be_stream_capture without a log line or a recorded error: gpumem__be_capture_quiet (inline,
 * below the context): the status, or -1 when the backend cannot answer (no such method, or an error: a
 * stream destroyed after its capture is the common one). For the questions asked at every allocation on
 * a stream and at each capture's end (graph.c). */
gpumem_status gpumem__be_stream_capture(gpumem_context *ctx, int dev, gpumem_stream s, int *status,
                                        uint64_t *capture_id);

/* ---------------------------------------------------------------------- */
/* pool.c                                                                  */

typedef struct gpumem__pool gpumem__pool;
typedef struct gpumem__block gpumem__block;

/** A block of a segment (pool.c owns it; a live one may sit in a thread cache, tcache.c). */
/* (The last 32 bytes, addr .. state, are what a thread cache's hits touch; with the struct aligned
 * to 32 bytes they share one cache line, so a hit reads one line of the block, not two.) */
struct gpumem__block {
  _Alignas(32) size_t size;    /* multiple of 256 */
  struct gpumem__segment *seg;
  gpumem__block *prev, *next;  /* address order within the segment */
  gpumem__block *fprev, *fnext;/* bucket list of the fidx (free blocks) */
  struct gpumem__fidx *idx;    /* the fidx holding it, NULL = live (or in a thread cache) */
  union {
    uint64_t fseq;             /* free, in a STREAM fidx: its stream's free number (the latest, when merged) */
    struct gpumem__uses *uses; /* live: streams noted by gpumem_record_stream (NULL: none; set at every allocation) */
  };
  uintptr_t addr;
  size_t requested;            /* live: bytes asked for */
  const char *tag;             /* live: tag for leak reports */
  /* Ownership state. Odd: in a thread cache (still in the pointer index, but
   * not live). Even: live while in the index, else free in the pool. Every
   * change adds 1 or 2 and the value survives the block struct's reuse, so a
   * value seen once never comes back: a thread cache that remembers the value
   * a block had when it handed it out can claim the block later with one
   * compare-and-swap, without the index (tcache.h). */
  _Atomic uint64_t state;
};

_Static_assert(offsetof(gpumem__block, state) + sizeof(_Atomic uint64_t) == sizeof(gpumem__block),
               "state is the last field: block_new (pool.c) clears the others");
_Static_assert(offsetof(gpumem__block, addr) % 32 == 0 && offsetof(gpumem__block, state) - offsetof(gpumem__block, addr) == 24,
               "addr, requested, tag and state: one aligned 32-byte group");

/** The block is in a thread cache (not live). */
static inline int gpumem__block_cached(const gpumem__block *b) {
  return (atomic_load_explicit(&b->state, memory_order_acquire) & 1u) != 0;
}

/**
 * Accounting of one thread cache towards its pool (tcache.c). Blocks in a
 * thread cache are live for the pool (allocated_bytes counts them); the true
 * allocated bytes are the pool's minus every cache's cached bytes (gpumem__tc_acct_cached). They and
 * `headroom` change only under the pool lock, or by the owning thread under
 * its cache lock (the pool reads them under the pool lock during that
 * thread's own pool call). headroom <= cached: bytes the owner may take out
 * of its cache without raising the allocated peak (true + sum of headrooms
 * <= peak), so the peak is exact with one thread and an upper bound with several.
 */
typedef struct gpumem__tc_acct {
  uint64_t room;      /* budget - cached: the bytes the cache may still take in */
  uint64_t headroom;
  uint64_t budget;    /* cached bytes at most (gpumem__pool_tc_budget of the pool, set when keyed) */
  uint64_t lcached;   /* bytes of the block in the cache's large slot (0: empty; tcache.c) */
  int grow_blocked;  /* set by gpumem__pool_alloc: it would have grown while this or another thread cache of the pool
                      * could hold blocks (it returned GPUMEM_ERR_BUSY) */
  gpumem__block *last;  /* set by gpumem__pool_alloc on success: the block handed out ... */
  uint64_t last_state;  /* ... its state then (the cache remembers them, tcache.h) ... */
  size_t last_size;     /* ... and its size */
  int large_ok;         /* set by gpumem__pool_alloc on success: the pool has seen one stream only, this call's,
                         * and records no events at its frees (solo mode): the cache may keep the block, when it
                         * is large, at its free (tcache.c, the large slot) */
  int hopeless;         /* set by gpumem__pool_alloc: refused a request no flush can help (above the limit or the
                         * device), counted and logged once already */
} gpumem__tc_acct;

/** Bytes held in the cache of acct: its small blocks (kept as budget - room: the inlined free tests and updates
 *  room alone) and its large slot's block. */
static inline uint64_t gpumem__tc_acct_cached(const gpumem__tc_acct *a) { return a->budget - a->room + a->lcached; }

/** Create the pool of one device (and its initial segment if configured). */
gpumem_status gpumem__pool_create(gpumem_context *ctx, int device, gpumem__pool **out);
/** Give everything back (no live-block check) and free the pool. */
void gpumem__pool_destroy(gpumem__pool *pool);

/** gpumem_record_stream under the pool lock (stream_order.c): GPUMEM_ERR_INVALID_POINTER when ptr is not live in this pool. */
gpumem_status gpumem__pool_record_stream(gpumem__pool *pool, void *ptr, gpumem_stream stream);
/** acct: the calling thread's cache accounting when that cache belongs to this pool (exact peak), else NULL. */
gpumem_status gpumem__pool_alloc(gpumem__pool *pool, size_t size, gpumem_stream stream, const char *tag, void **out,
                                 gpumem__tc_acct *acct);
/** Free a block whose pointer was looked up in the pointer index (the pool validates it under its lock). */
gpumem_status gpumem__pool_free(gpumem__pool *pool, void *ptr, gpumem_stream stream);
/** Free a live block the caller already removed from the pointer index (it owns it). */
void gpumem__pool_free_block(gpumem__pool *pool, gpumem__block *b, gpumem_stream stream);
/**
 * Give n blocks of a thread cache back to the pool as frees on `stream`
 * (named: this call names the stream, so its event may be recorded now).
 * The cache's cached bytes drop by their bytes under the pool lock (lbytes of them: the block of
 * its large slot, acct->lcached); the cache's counters (req/allocs/frees/live deltas) are folded
 * into the pool's and zeroed.
 */
void gpumem__pool_put_cached(gpumem__pool *pool, gpumem__tc_acct *acct, gpumem__block **blocks, size_t n,
                             uint64_t lbytes, gpumem_stream stream, int named, int64_t *d_req, int64_t *d_live,
                             uint64_t *d_allocs, uint64_t *d_frees);
/** A thread cache was keyed to this pool (delta 1) or stopped being (-1), or (0) none changed; returns how many
 *  are keyed to it now. Thread-safe. */
int gpumem__pool_tc_keyed(gpumem__pool *pool, int delta);
/** Bytes a thread cache of this pool may hold (GPUMEM__TC_MAX_BYTES at most). Takes the pool lock (not held by the caller). */
uint64_t gpumem__pool_tc_budget(gpumem__pool *pool);
/** Bytes of blocks above GPUMEM__TC_MAX_SIZE a thread cache of this pool may hold (its large slots). Takes the pool lock. */
uint64_t gpumem__pool_tc_large_budget(gpumem__pool *pool);
/** Raise the allocated peak to the pool's allocated bytes minus acct->cached; renew acct->headroom. */
void gpumem__pool_tc_peak(gpumem__pool *pool, gpumem__tc_acct *acct);
/** The pool lock and statistics, for the thread caches' exact reads (tcache.c). */
gpumem__mutex *gpumem__pool_mutex(gpumem__pool *pool);
gpumem_stats *gpumem__pool_stats_locked(gpumem__pool *pool);
gpumem_status gpumem__pool_trim(gpumem__pool *pool, uint64_t keep_bytes, uint64_t *released);
/* [ptr, ptr + size) exactly, from free memory of a pool of plain segments (gpumem_graph_pool_alloc_at) */
gpumem_status gpumem__pool_alloc_at(gpumem__pool *pool, void *ptr, size_t size);
gpumem_status gpumem__pool_reset(gpumem__pool *pool);
void gpumem__pool_get_stats(gpumem__pool *pool, gpumem_stats *st);
void gpumem__pool_reset_peaks(gpumem__pool *pool);
int gpumem__pool_device(const gpumem__pool *pool);
/** Live blocks and bytes; fills up to max entries of a leak report. */
typedef struct gpumem__leak {
  uintptr_t ptr;
  size_t size;
  size_t requested;
  int device;
  const char *tag;
} gpumem__leak;
void gpumem__pool_live(gpumem__pool *pool, uint64_t *count, uint64_t *bytes, gpumem__leak *first, size_t max, size_t *nfirst);
/* The live blocks of pool after the first `skip` (in the pool's order, which only allocations and frees
 * change) into out, at most max; returns how many. For paging with no host memory. */
size_t gpumem__pool_live_at(gpumem__pool *pool, size_t skip, gpumem__leak *out, size_t max);
gpumem_status gpumem__pool_check(gpumem__pool *pool, uint64_t *live_count);

/* ---------------------------------------------------------------------- */
/* ptrmap.c: the pointer index (ptrmap.h)                                   */

#include "ptrmap.h"

/* ---------------------------------------------------------------------- */
/* context.c                                                               */

struct gpumem_context {
  gpumem_backend be;            /* our copy of the vtable: passed to every method */
  char be_name[64];             /* name of the backend in use */
  int be_open;                  /* init succeeded, shutdown pending */
  int has_events;               /* all five event methods present */
  gpumem__options opt;
  int ndev;
  _Atomic(gpumem__pool *) *pools; /* ndev entries, created lazily */
  gpumem_backend_device_info *devinfo; /* ndev entries: the static part of gpumem_device_get_info, cached */
  atomic_int *devinfo_ok;         /* ndev flags: devinfo[i] filled (set under lock, release) */
  _Atomic uint64_t *reset_gen;  /* ndev counters: gpumem_reset calls on the device so far (scope.c) */
  _Atomic uint64_t *dev_reserved; /* ndev counters: bytes every pool of the device holds (the main one and the graph
                                   * pools: limit_bytes is the device's), kept with each pool's reserved_bytes */
  gpumem__mutex lock;           /* pool creation */
  gpumem__ptrmap map;
  unsigned fork_gen;            /* gpumem__fork_gen at create: differs in a forked child */
  int tc_on;                    /* per-thread caches in use (tcache.c); set at create */
  atomic_int tc_said;           /* tcache.c: the caches' lock protocol was logged for this context */
  /* trace.c: monitoring (traces, checking-tool annotations) */
  _Atomic unsigned mon;         /* GPUMEM__MON_* bits; 0 = the entry points skip every hook (one branch) */
  gpumem__mutex trace_lock;     /* guards trace and the trace file */
  pthread_rwlock_t mon_rw;      /* monitored allocations (read) against monitored resets (write): trace.c */
  struct gpumem__trace *trace;  /* the trace being recorded, or NULL */
  /* graph.c: graph pools and the streams routed to them */
  atomic_int nroutes;           /* routed streams; while > 0 (a capture may be under way): no thread cache is
                                 * keyed to the context, no call synchronises the device or frees to it */
  struct gpumem_graph_pool *graphs; /* every graph pool of the context, under lock */
  struct gpumem__route *routes; /* nroutes entries, under lock */
  size_t route_cap;
  atomic_int nauto;             /* routes of captures nobody routed, found by asking the backend (graph.c) */
  int cap_probe;                /* the backend reports capture: an allocation or free on a stream other than
                                 * NULL asks whether that stream is captured (graph.c, gpumem__graph_probe) */
};

/** 1 while a stream is routed to a graph pool (graph.c): no device synchronisation or backend free now. */
/* A monotonic clock in nanoseconds, for the policies that weigh time (pressure, growth waits). */
static inline uint64_t gpumem__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* (backend.c's question, inlined: asked at every allocation on a stream other than NULL; see the
 * declaration's comment with the backend calls) */
static inline int gpumem__be_capture_quiet(gpumem_context *ctx, int dev, gpumem_stream s, uint64_t *capture_id) {
  int st = GPUMEM_CAPTURE_NONE;
  uint64_t id = 0;
  *capture_id = 0;
  if (ctx->be.version < 3 || ctx->be.stream_capture == NULL || ctx->be.stream_capture(&ctx->be, dev, s, &st, &id) != 0)
    return -1;
  if (st != GPUMEM_CAPTURE_NONE && st != GPUMEM_CAPTURE_ACTIVE && st != GPUMEM_CAPTURE_INVALIDATED) return -1;
  *capture_id = st == GPUMEM_CAPTURE_NONE ? 0 : id;
  return st;
}
/* The device's count of reserved bytes (ctx->dev_reserved) changed by delta: every place a pool's
 * reserved_bytes changes (pool.h gpumem__dev_reserved_add; vmseg.c for chunks). */
static inline void gpumem__dev_reserved_change(gpumem_context *ctx, int dev, int64_t delta) {
  if (delta >= 0) atomic_fetch_add_explicit(&ctx->dev_reserved[dev], (uint64_t)delta, memory_order_relaxed);
  else atomic_fetch_sub_explicit(&ctx->dev_reserved[dev], (uint64_t)-delta, memory_order_relaxed);
}
static inline int gpumem__capturing(const gpumem_context *ctx) {
  return atomic_load_explicit(&((gpumem_context *)ctx)->nroutes, memory_order_acquire) > 0;
}
/** graph.c: an allocation from a graph pool (gpumem_graph_pool_alloc, and allocations routed to it). */
gpumem_status gpumem__graph_alloc(struct gpumem_graph_pool *gp, size_t size, gpumem_stream stream, const char *tag,
                                  void **out_ptr);
/** graph.c: while routes exist, an allocation on a routed stream (or one of its capture) from its graph
 * pool: 1 and *st set; 0 when the allocation is not routed. Called where no thread cache is keyed
 * (none is while routes exist), so a keyed cache's path never pays for it. */
int gpumem__graph_alloc_routed(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, const char *tag,
                               void **out_ptr, gpumem_status *st);
/** graph.c: before an allocation or free on `stream` (not NULL) that no route covers: when the backend
 * says the stream is being captured, the capture gets a graph pool of its own and a route to it, so
 * that gpumem__capturing() holds from here on. Returns that pool, or NULL (no capture, or no host
 * memory for the pool: the allocation then fails with GPUMEM_ERR_OUT_OF_MEMORY in the caller). */
struct gpumem_graph_pool *gpumem__graph_probe(gpumem_context *ctx, int device, gpumem_stream stream, int *failed);
/** graph.c: 1 when allocations on `stream` may be served as if no capture existed: capture_probe is on, no
 * capture is known, and the backend says the stream is not captured (the thread caches' probed hit). */
int gpumem__graph_uncaptured(gpumem_context *ctx, int device, gpumem_stream stream);
/** graph.c: drops the routes of `stream` (the stream the current call names; NULL: nothing) on device
 * that gpumem__graph_probe found and whose capture has ended. Their pools stay until
 * gpumem_capture_pools_release, but one that never got memory, which goes now. */
void gpumem__graph_reap(gpumem_context *ctx, int device, gpumem_stream stream);
/** graph.c: calls fn for the pool of every graph pool of `device` (-1: all), under the context lock. */
void gpumem__graph_each(gpumem_context *ctx, int device, void (*fn)(gpumem__pool *p, void *arg), void *arg);
/* gpumem_set_limit: the device's cap on its main pool and every graph pool of the device, under the context lock
 * (a graph pool linked meanwhile takes it from the main pool). */
void gpumem__graph_set_limit(gpumem_context *ctx, gpumem__pool *main, int device, uint64_t limit);
/** graph.c: releases released graph pools whose blocks are all free (trim); destroy_all: every one (destroy). */
void gpumem__graph_collect(gpumem_context *ctx, int destroy_all, int device, uint64_t *released);
/** pool.c: a device pool for a graph pool: plain segments, no events, never trimmed by policy. */
gpumem_status gpumem__pool_create_graph(gpumem_context *ctx, int device, gpumem__pool **out);
/** pool.c: the limit (settable), and the largest free block (expandable: idle mapped bytes count). */
void gpumem__pool_set_limit(gpumem__pool *p, uint64_t limit);
int gpumem__pool_is_graph(const gpumem__pool *p);
uint64_t gpumem__pool_get_limit(gpumem__pool *p);
uint64_t gpumem__pool_largest_free(gpumem__pool *p);

/* ---------------------------------------------------------------------- */
/* global.c: the process-wide context (gpumem_global_context)              */

/** The process-wide context, or NULL when it was never created (creates nothing). Thread-safe. */
gpumem_context *gpumem__global_context_if_created(void);

/* ---------------------------------------------------------------------- */
/* context.c: gpumem_alloc past the inlined thread-cache hit (pool creation, the cache's full path, monitoring);
 * looked: the calling thread's cache was searched for this call already (see gpumem__tc_alloc) */
gpumem_status gpumem__alloc_slow(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, const char *tag,
                                 void **out_ptr, int looked);

/* tcache.c: per-thread caches (used when ctx->tc_on and no monitoring hook is on) */

/** Allocate through the calling thread's cache, else the pool (flushing every cache of p on out of memory).
 *  looked: the cache was searched for this call (gpumem__tc_near_hit) and nothing has changed it since. */
gpumem_status gpumem__tc_alloc(gpumem_context *ctx, gpumem__pool *p, size_t size, gpumem_stream stream,
                               const char *tag, void **out, int looked);
/** Free a non-NULL ptr into the calling thread's cache, else to its pool; validates like gpumem_free. */
gpumem_status gpumem__tc_free(gpumem_context *ctx, void *ptr, gpumem_stream stream);
/** Give back every cached block of ctx (of pool p; NULL = all pools); detach: forget ctx. Returns blocks flushed. */
size_t gpumem__tc_flush(gpumem_context *ctx, gpumem__pool *p, int detach);
/** Take / release every thread cache's lock (a reset holds them across the pool reset; statistics reads). */
void gpumem__tc_lock_all(void);
void gpumem__tc_unlock_all(void);
/** With every cache locked: flush the caches of pool p. */
void gpumem__tc_flush_locked(gpumem_context *ctx, gpumem__pool *p);
/** With every cache locked: the exact statistics of p (the pool's, adjusted by the caches). */
void gpumem__tc_pool_stats(gpumem_context *ctx, gpumem__pool *p, gpumem_stats *one);
/** With every cache locked: reset the peaks of p to the exact current values. */
void gpumem__tc_reset_peaks(gpumem_context *ctx, gpumem__pool *p);
/** The caches' atfork handlers (registered by fork.c): prepare takes g_reg and every cache lock, parent gives them
 *  back, child forgets the parent's caches (keeps the calling thread's, emptied) and gives g_reg back. */
void gpumem__tc_fork_prepare(void);
void gpumem__tc_fork_parent(void);
void gpumem__tc_fork_child(void);

/* ---------------------------------------------------------------------- */
/* trace.c: monitoring hooks, called by the entry points when ctx->mon != 0 */

#define GPUMEM__MON_TRACE 0x1u    /* a trace is being recorded */
#define GPUMEM__MON_ANNOTATE 0x2u /* the backend annotates blocks for checking tools */
/** 1 when a monitoring hook must run: one relaxed load and one predictable branch. */
#define GPUMEM__MON_ON(ctx) GPUMEM__UNLIKELY(atomic_load_explicit(&(ctx)->mon, memory_order_relaxed) != 0u)

/** At create, after the backend is open: the lock, annotations, GPUMEM_TRACE. Cleans up after itself on failure. */
gpumem_status gpumem__monitor_init(gpumem_context *ctx);
/** At destroy, after the pools are gone: close the trace, destroy the lock. */
void gpumem__monitor_fini(gpumem_context *ctx);
/** After a successful allocation of `size` requested bytes. */
void gpumem__monitor_alloc(gpumem_context *ctx, int device, void *ptr, size_t size, gpumem_stream stream);
/** Around a monitored allocation (the pool's and gpumem__monitor_alloc): no monitored reset runs between them. */
void gpumem__monitor_alloc_enter(gpumem_context *ctx);
void gpumem__monitor_alloc_exit(gpumem_context *ctx);
/** gpumem_free of a non-NULL ptr with monitoring: annotates, calls gpumem__free_unmonitored, records. */
gpumem_status gpumem__monitor_free(gpumem_context *ctx, void *ptr, gpumem_stream stream);
/** gpumem_record_stream with a trace recorded: the pool's record_stream, then an "n" line, under the
 * monitor lock. */
gpumem_status gpumem__monitor_record_stream(gpumem_context *ctx, gpumem__pool *pool, void *ptr,
                                            gpumem_stream stream);
/** gpumem__pool_reset with monitoring (annotations withdrawn, frees recorded; undone when the reset fails). */
gpumem_status gpumem__monitor_reset(gpumem_context *ctx, gpumem__pool *pool);
/** Before gpumem_destroy with FORCE destroys a pool with live blocks: withdraw their annotations. */
void gpumem__monitor_drop(gpumem_context *ctx, gpumem__pool *pool);
/** context.c: gpumem_free of a non-NULL ptr without the monitoring hook. */
gpumem_status gpumem__free_unmonitored(gpumem_context *ctx, void *ptr, gpumem_stream stream);

/**
 * \brief Check the internal invariants of every pool of ctx (block lists
 *        cover segments exactly, free indexes consistent, stats exact,
 *        pointer index matches the live blocks).
 * \return GPUMEM_OK, GPUMEM_ERR_INVALID_ARGUMENT (NULL) or GPUMEM_ERR_INTERNAL
 *         (the failing check is logged at ERROR).
 * Compiled in every build; tests may call it. Takes each pool lock in turn.
 */
gpumem_status gpumem__check_invariants(gpumem_context *ctx);

/* ---------------------------------------------------------------------- */
/* Host memory (hostmem.c)                                                 */
/* The core allocates host memory only through these (free() gives it back), so that a test can
 * make any one allocation fail. They behave as malloc, calloc, realloc and aligned_alloc. */
void *gpumem__malloc(size_t n);
void *gpumem__calloc(size_t n, size_t size);
void *gpumem__realloc(void *p, size_t n);
void *gpumem__aligned_alloc(size_t align, size_t n);
/** For tests (not API): after `after` more host allocations of the core succeed, the next fails, and
 *  every later one too when persist is set, until gpumem__host_fault_clear. Not for concurrent use
 *  with another arm or clear. */
void gpumem__host_fault_arm(uint64_t after, int persist);
void gpumem__host_fault_clear(void);
/** For tests: host allocations failed since the last arm. */
uint64_t gpumem__host_fault_count(void);
/**
 * For tests (not API): how many invariant checks have failed in this process (pool_check.c counts
 * every failure it logs). GPUMEM_DEBUG builds check after every call and only log, so the test
 * suite reads this count to turn a logged failure into a failed test. *last (when not NULL) gets the
 * last failed condition's text (NULL when none failed).
 */
uint64_t gpumem__invariant_failures(const char **last);
/** For tests (not API): the bytes the calling thread's cache holds (0 when it has none). */
uint64_t gpumem__tc_cached_bytes(void);
/** For tests (not API): the stream records the pool of a device holds (0 when it has no pool). */
size_t gpumem__stream_records(gpumem_context *ctx, int device);
/** The stream records of a pool (stream_order.c; takes its lock). */
size_t gpumem__pool_stream_records(gpumem__pool *pool);

#endif /* GPUMEM_INTERNAL_H */
