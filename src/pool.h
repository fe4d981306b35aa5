/* pool.h: the pool layer's private header: its types, constants, and the
 * functions its files call in each other. Only the pool's files include it
 * (block_index.c, stream_order.c, trim.c, expandable.c, pool.c, pool_check.c);
 * the rest of the library sees the pool through internal.h.
 *
 * Segments come from the backend (gpumem__be_malloc). Each segment is cut
 * into blocks kept in an address-ordered doubly linked list, so a block can
 * be split and coalesced with its neighbours in O(1). Block sizes are
 * multiples of 256 bytes, so every pointer is 256-aligned.
 *
 * Size classes (PyTorch's scheme): requests <= 1 MiB come from 2 MiB
 * segments, 1..10 MiB from 20 MiB segments, larger ones get their own
 * segment rounded up to 2 MiB. Small and large blocks live in separate free
 * lists so that small allocations do not fragment large segments. The
 * optional initial segment (initial_bytes) is "mixed": it serves both.
 *
 * Free indexes ("fidx"): each holds one TLSF (two-level segregated fit,
 * bitmaps, O(1) good fit) per size class. Every free block is in exactly one
 * fidx, and its state is the kind of that fidx:
 *   STREAM  freed on stream S, not yet covered by an event: S may reuse it at once;
 *   PENDING part of a batch harvested from S with one event recorded on S;
 *           S may still reuse it, others only once the event has completed;
 *   READY   usable by every stream.
 * Blocks coalesce only with neighbours in the same fidx (same state, same stream).
 *
 * Stream-ordered reuse: a free on S puts the block into S's own fidx and,
 * if S has no pending batch, "harvests" it (or, when S asks with batches
 * pending, see stream_touch; while the pool has seen only
 * one stream, a "mark" instead: the event is recorded, the blocks stay in
 * S's fidx; see mark_record): one event recorded on S now
 * (later than every free in it, hence safe) and the whole fidx moved into a
 * pending batch (O(1): the fidx object changes hands). The backend is only
 * ever called with the stream of the current call (see stream_touch): an
 * application may destroy a stream right after freeing on it. An alloc on
 * T takes the smallest fit among T's fidx, T's pending batches and READY; on
 * a miss it polls the pending batches (event_query) and, if other streams
 * hold free blocks, marks the pool "hungry" so that their next calls renew
 * their batches. Batches whose event completed move their blocks into
 * READY, coalescing. Only if still nothing fits does the pool grow.
 * Waiting (device_synchronize) happens only in the out-of-memory and limit
 * paths, in trim and in reset; it makes every free block of the device
 * READY, batched or not.
 *
 * Locking: one mutex per pool protects everything in it, statistics
 * included. Lock order: pool lock, then a pointer-index shard lock. The
 * out-of-memory callback is called with no lock held.
 */
#ifndef GPUMEM_POOL_H
#define GPUMEM_POOL_H

#include "internal.h"
#include "tcache.h"
#include "vmseg.h"

#include <stdlib.h>
#include <string.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

#define GPUMEM__ALIGN ((size_t)256)
#define GPUMEM__SMALL_MAX (1 * MiB)   /* requests up to this are "small" */
#define GPUMEM__SMALL_SEG (2 * MiB)   /* segment size for small requests */
#define GPUMEM__MEDIUM_MAX (10 * MiB) /* large requests up to this share 20 MiB segments */
#define GPUMEM__MEDIUM_SEG (20 * MiB)
#define GPUMEM__LARGE_ROUND (2 * MiB) /* bigger requests get their own segment, rounded to this */

enum { CLS_SMALL = 0, CLS_LARGE = 1, CLS_MIXED = 2, CLS_COUNT = 3 };
enum { IDX_STREAM = 0, IDX_PENDING = 1, IDX_READY = 2, IDX_DEFERRED = 3, IDX_ORPHAN = 4 };
/* Segment kinds: plain backend-malloc segments, and expandable ones: one
 * reserved address range whose granules are mapped on demand (vmseg.c;
 * the glue is in "Expandable segments" below). */
enum { SEG_PLAIN = 0, SEG_VM = 1 };

/* ---------------------------------------------------------------------- */
/* Types                                                                   */

#define TLSF_SL_LOG 3
#define TLSF_SL (1 << TLSF_SL_LOG)
#define TLSF_FL 40 /* units of 256 B up to 2^40 -> 256 TiB; larger sizes share the last bucket */

typedef struct gpumem__segment gpumem__segment;
typedef struct gpumem__fidx gpumem__fidx;
typedef struct gpumem__srec gpumem__srec;
typedef struct gpumem__batch gpumem__batch;
typedef struct gpumem__uses gpumem__uses;
typedef struct gpumem__deferred gpumem__deferred;

/* struct gpumem__block is in internal.h (the thread caches, tcache.c, read its size and set requested/tag) */

typedef struct gpumem__tlsf {
  uint64_t fl_bitmap;
  uint8_t sl_bitmap[TLSF_FL];
  gpumem__block *heads[TLSF_FL][TLSF_SL]; /* NULL when the list is empty */
} gpumem__tlsf;

struct gpumem__fidx {
  int kind;                    /* IDX_* */
  gpumem__srec *srec;          /* STREAM / PENDING: the stream the frees were on */
  gpumem__batch *batch;        /* PENDING */
  size_t nblocks;
  uint64_t bytes;
  gpumem__fidx *next_free;     /* recycling list */
  gpumem__tlsf t[CLS_COUNT];
};

struct gpumem__segment {
  gpumem__pool *pool;
  uintptr_t base;
  size_t size;
  int cls;                     /* CLS_* */
  int kind;                    /* SEG_* */
  gpumem__block *head;         /* first block (lowest address) */
  gpumem__segment *prev, *next;   /* all segments of the pool */
  gpumem__segment *eprev, *enext; /* wholly free READY segments */
  int empty;
  int solo_era;                /* opened before the pool saw a second stream: may hold dirty READY blocks */
  gpumem__vmspace *vm;         /* SEG_VM: its granule map */
};

struct gpumem__srec {
  gpumem_stream stream;
  gpumem__fidx *idx;           /* its STREAM free blocks */
  gpumem__batch *batches;      /* its pending batches, newest first (at most two, see stream_touch) */
  uint64_t blocked;            /* pool->polls of the last poll that found its older batch pending */
  uint64_t fed;                /* pool->hungry when this stream was last harvested (see stream_touch) */
  uint64_t seq;                /* frees on this stream so far (block fseq) */
  uint64_t unasked;            /* bytes freed on it since its pending batch was last asked (see stream_touch) */
  gpumem_event mev;            /* single-stream mark: event recorded on the stream ... */
  uint64_t mark_seq;           /* ... after its free number mark_seq */
  int has_mark;
  uint64_t sweep;              /* pool->sweeps when a call last named the stream (see gpumem__srec_reap) */
  gpumem__srec *onext;         /* the pool's records in the order they were made (pool->sfirst) */
};

struct gpumem__batch {
  gpumem_event ev;
  int has_ev;                  /* 0: completes only by device_synchronize */
  gpumem__srec *srec;
  gpumem__fidx *idx;
  gpumem__batch *prev, *next;   /* pool's pending list */
  gpumem__batch *sprev, *snext; /* srec's list */
};

#define SLAB_N 128
typedef struct gpumem__slab {
  struct gpumem__slab *next;
  gpumem__block blocks[SLAB_N];
} gpumem__slab;

struct gpumem__pool {
  gpumem_context *ctx;
  int device;
  gpumem__mutex lock;
  uint64_t total;              /* device total bytes */
  uint64_t limit;              /* 0 = none */
  uint64_t limit_held;         /* reserved bytes when a limit below them was set (0: none): growth
                                * never passes the limit, but memory reserved before it stays */
  gpumem__fidx *ready;
  gpumem__segment *segs;
  gpumem__segment *empty;
  uint64_t empty_bytes;
  gpumem__srec **stab;         /* open addressing, power-of-two capacity */
  size_t scap, scount;
  gpumem__srec *sfirst, *slast; /* every record, oldest first: what walks all streams walks this, so
                                 * the order blocks reach READY never depends on handle values */
  gpumem__batch *pending_head, *pending_tail;
  size_t npending;
  gpumem_event *evcache;
  size_t nev, evcap;
  gpumem__block *bfree;        /* block slab free list (through next) */
  gpumem__slab *slabs;
  gpumem__fidx *ffree;
  gpumem__batch *batch_free;
  uint64_t hungry;             /* misses that wanted other streams' free blocks (see stream_touch) */
  uint64_t gwait_win, gwait_ns; /* growth waits (expandable.c): this window's start and the host
                                * time they stalled in it */
  atomic_int tc_keyed;         /* thread caches keyed to this pool (gpumem__pool_tc_keyed) */
  int nogrow;                  /* thread caches of this pool may hold blocks: do not grow, let them flush first */
  int grow_blocked;            /* ... and the call would have grown */
  size_t nmarks;               /* streams with a pending mark */
  size_t reap_at;              /* scount at which the end of a free looks for idle records (stream_order.c) */
  uint64_t sweeps;             /* sweeps of the stream records so far */
  uint64_t polls;              /* gpumem__poll_pending calls so far */
  gpumem__fidx *orphans;       /* free blocks of streams not named for a sweep, or with no record (host out of
                                * memory): ready after a device synchronisation (made with the pool; never searched) */
  /* Frees of blocks noted on other streams (gpumem_record_stream), waiting for those streams'
   * events; such a block's idx is &deferred_set (in no TLSF: no search finds it). */
  struct gpumem__deferred *deferred;
  struct gpumem__deferred *park_spare; /* during a reset: records of ranges left aliased (deferred_clear) */
  size_t ndeferred;
  gpumem__fidx deferred_set;
  int graph;                   /* a graph pool's (graph.c): no events, no trimming by policy */
  gpumem_stats st;
  gpumem__vmpool *vm;          /* expandable segments; NULL = plain segments only */
  /* Single-stream expandable pools ("solo", see free_locked): */
  int solo;                    /* SOLO_*: no stream yet, one stream warming up (solo_s, events as usual),
                                * one stream (solo_s), several (or a plain pool) */
  unsigned solo_frees;         /* SOLO_WARM: frees on solo_s so far */
  gpumem_stream solo_s;
  gpumem__srec *solo_r;        /* solo_s's record */
  int dirty;                   /* READY may hold blocks freed on solo_s whose work is still pending */
  int quarantine;              /* a second stream came while dirty: it takes READY blocks only from
                                * segments opened since (solo_era 0) until dirty is cleared */
  uint64_t dirty_seq;          /* frees made READY at once so far */
  gpumem_event sev;            /* settle event: recorded on solo_s after free number sev_seq */
  uint64_t sev_seq;
  int has_sev;
  /* what the current call allows the unmap guard (vm_guard) to do */
  gpumem_stream g_stream;      /* the stream the call names ... */
  int g_named;                 /* ... when set */
  int g_wait;                  /* it may wait for the device */
  /* share.c: shared GPUs and the watcher (share.h) */
  struct gpumem__pshare *share; /* NULL: neither (a graph pool, or sharing off and watch_interval_ms 0) */
  int watching;                /* the watcher thread runs (set by share.c under the lock) */
};

enum { SOLO_NONE = 0, SOLO_ONE = 1, SOLO_MANY = 2, SOLO_WARM = 3 };
/* Frees on the first stream, with no other stream seen, before the pool stops recording events
 * at frees (SOLO_WARM -> SOLO_ONE). Until then a free gets its event as in any pool, so a block
 * freed on S is reused by another stream T as soon as S's work completes (a short program, or
 * one that soon adds streams, never notices solo mode); after it, blocks S freed before T came
 * wait for S's next call or a device synchronisation. */
#define SOLO_WARM_FREES 256
/* Frees of blocks up to this size go to READY at once in solo mode (see free_locked). */
#define SOLO_READY_MAX (8 * MiB)

/* ---------------------------------------------------------------------- */
/* Small helpers                                                           */

static inline int msb64(uint64_t x) { return 63 - __builtin_clzll(x); }
static inline int ctz64(uint64_t x) { return __builtin_ctzll(x); }

static inline uint64_t cached_bytes(const gpumem__pool *p) { return p->st.reserved_bytes - p->st.allocated_bytes; }

/* The watcher runs while this holds (share.c; DESIGN.md "Trimming"): the pool holds cached memory, or a
 * thread cache keyed to it may hold some or take some in without a pool call. A cache's blocks count as
 * allocated for the pool (tcache.c), and a cache takes in only blocks its thread frees; so with nothing
 * allocated no cache holds a block, and none can before an allocation, a pool call that starts the
 * watcher again: a pool left empty (by a trim, say) lets it end although threads stay keyed. With
 * blocks allocated and a cache keyed, which of them are cached is known only under every cache lock,
 * and a free into a cache makes no pool call: the watcher stays. */
static inline int watch_wanted(const gpumem__pool *p) {
  return cached_bytes(p) > 0 ||
         (p->st.allocated_bytes > 0 && atomic_load_explicit(&p->tc_keyed, memory_order_relaxed) > 0);
}


#define LOG(p, lvl, ...) gpumem__log(&(p)->ctx->opt.log, (lvl), __VA_ARGS__)

/* A helper defined in a header, used by some of the files that include it. */
#define GPUMEM__POOL_LOCAL static __attribute__((unused))

/* ---------------------------------------------------------------------- */
/* Between the pool's files (one owner each, named above its group)        */

/* block_index.c: free-set objects and whole-set moves */
void gpumem__fidx_clear(gpumem__fidx *f, int kind);
gpumem__fidx *gpumem__fidx_new(gpumem__pool *p, int kind);
void gpumem__fidx_recycle(gpumem__pool *p, gpumem__fidx *f);
void gpumem__drain_to(gpumem__pool *p, gpumem__fidx *f, gpumem__fidx *to);
static inline void gpumem__drain_to_ready(gpumem__pool *p, gpumem__fidx *f) { gpumem__drain_to(p, f, p->ready); }

/* stream_order.c: stream records, events, pending batches, the solo path */
gpumem__srec *gpumem__srec_get(gpumem__pool *p, gpumem_stream s);
size_t gpumem__srec_reap(gpumem__pool *p);
gpumem__batch *gpumem__harvest(gpumem__pool *p, gpumem__srec *r, int with_event);
void gpumem__poll_pending(gpumem__pool *p);
void gpumem__stream_touch(gpumem__pool *p, gpumem__srec *r);
int gpumem__pool_pending_blocks(const gpumem__pool *p);
/* Bytes of the blocks r's stream freed that are not READY yet (usable by that stream only): unbatched
 * and in its pending batches. */
uint64_t gpumem__srec_pending_bytes(const gpumem__srec *r);
/* Free bytes not yet usable by every stream: freed on stream r (*own) or on the others (*other: unbatched,
 * in pending batches, orphaned), and frees waiting for the streams gpumem_record_stream noted (*noted). */
void gpumem__pool_inflight(const gpumem__pool *p, const gpumem__srec *r, uint64_t *own, uint64_t *other,
                           uint64_t *noted);
/* The frees still pending, for the out-of-memory report (pool.c): per stream, oldest record first, the
 * bytes and blocks freed on it that other streams may take only once the device has run its work (its
 * unbatched frees and its pending batches), the first GPUMEM__PENDING_LISTED streams by name and the
 * rest as one sum; then frees waiting for streams noted by gpumem_record_stream, and those of streams
 * not named lately (orphans). "none" when nothing is pending. Pool lock held. */
#define GPUMEM__PENDING_LISTED 8
void gpumem__pool_pending_describe(const gpumem__pool *p, char *buf, size_t cap);
gpumem_status gpumem__settle(gpumem__pool *p);
void gpumem__solo_drain(gpumem__pool *p, gpumem__srec *r);
gpumem_status gpumem__vm_guard(void *arg);
void gpumem__solo_note_slow(gpumem__pool *p, gpumem_stream stream);
void gpumem__quarantine_step(gpumem__pool *p, gpumem_stream stream, int named);
void gpumem__sync_all(gpumem__pool *p);
int gpumem__sync_stream(gpumem__pool *p, gpumem__srec *r);
uint64_t gpumem__adopt_pending(gpumem__pool *p, gpumem__srec *t, uint64_t want, size_t fit, int cls);
int gpumem__defer_free(gpumem__pool *p, gpumem__block *b, gpumem_stream stream);
/* A free block of a stream with no record (no host memory): READY after a device synchronisation, else
 * (it failed, or a capture is under way) with the orphans until the next one. Pool lock held. */
void gpumem__place_unrecorded(gpumem__pool *p, gpumem__block *b);
enum { GPUMEM__DEFER_POLL = 0, GPUMEM__DEFER_WAIT = 1, GPUMEM__DEFER_SYNCED = 2 };
void gpumem__poll_deferred(gpumem__pool *p, int how);
void gpumem__deferred_clear(gpumem__pool *p);
/* Lending (expandable.c, gpumem__vm_lend): a parked free made ready (host memory and an event
 * recorded on `stream` now; NULL when either can not be had), given back unused, or given the block
 * whose memory was lent (it waits there until the event completed). */
gpumem__deferred *gpumem__lend_begin(gpumem__pool *p, gpumem_stream stream);
void gpumem__lend_cancel(gpumem__pool *p, gpumem__deferred *d);
/* A parked lent free with no event, for a range whose alias a reset could not unmap (gpumem__vm_keep_seg;
 * parked by gpumem__lend_park, given back unused by free()); NULL without host memory. */
gpumem__deferred *gpumem__park_rec_new(gpumem__pool *p);
/* Up to k records in park_spare (those deferred_clear kept, then new ones while host memory lasts): how many
 * there are, at most k. */
size_t gpumem__park_spare_fill(gpumem__pool *p, size_t k);
/* Frees the records gpumem__deferred_clear kept for kept segments' aliases (pool_clear_locked's end). */
void gpumem__park_spare_free(gpumem__pool *p);
/* 1 when b is parked as a lending's donor (its aliases may be partly unmapped); for the invariant check. */
int gpumem__deferred_lent(const gpumem__pool *p, const gpumem__block *b);
void gpumem__lend_park(gpumem__pool *p, gpumem__deferred *d, gpumem__block *b);

/* trim.c: when and how cached memory goes back */
gpumem_status gpumem__seg_release(gpumem__pool *p, gpumem__segment *s);
gpumem_status gpumem__release_empty(gpumem__pool *p, uint64_t keep, uint64_t *released);
void gpumem__count_trim(gpumem__pool *p, uint64_t released, const char *why);
void gpumem__check_threshold(gpumem__pool *p);
int gpumem__check_free_fraction(gpumem__pool *p);

/* expandable.c: placement in expandable segments */
gpumem_status gpumem__vm_alloc_locked(gpumem__pool *p, size_t rsize, int rcls, gpumem_stream stream,
                                      gpumem__block **out);
gpumem_status gpumem__vm_release_idle(gpumem__pool *p, uint64_t keep, uint64_t *released);
gpumem_status gpumem__vm_clear(gpumem__pool *p);
int gpumem__vm_keep_seg(gpumem__pool *p, gpumem__segment *s);
/* The most block structs gpumem__vm_keep_seg may take for s: one per alias range and one per gap, and the rest. */
size_t gpumem__vm_keep_blocks(const gpumem__segment *s);

/* pool.c: gpumem__pool_largest_free with the pool lock held (the out-of-memory report) */
uint64_t gpumem__pool_largest_free_locked(const gpumem__pool *p);
/* pool.c: segments from the backend */
gpumem_status gpumem__seg_create(gpumem__pool *p, size_t size, int cls, gpumem__segment **out);
/* The allocation of rsize bytes on `stream` (record r, may be NULL) raised the reserved peak from peak0:
 * with GPUMEM_LOG=debug, log what the pool held then besides live memory, when that is more than a
 * little. */
void gpumem__peak_note(gpumem__pool *p, const gpumem__srec *r, gpumem_stream stream, size_t rsize, uint64_t peak0);
void gpumem__seg_unlink(gpumem__pool *p, gpumem__segment *s);
void gpumem__free_place(gpumem__pool *p, gpumem__block *b, gpumem_stream stream, int named);

/* pool_check.c: the invariant checker (GPUMEM_DEBUG builds check after every call) */
gpumem_status gpumem__vm_check_seg(gpumem__pool *p, gpumem__segment *s);
gpumem_status gpumem__pool_check_locked(gpumem__pool *p);

/* ---------------------------------------------------------------------- */
/* Stream records and the current call (inline: every allocation reads them) */

static inline size_t stream_hash(gpumem_stream s) {
  uint64_t x = (uint64_t)(uintptr_t)s;
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 17);
}

GPUMEM__POOL_LOCAL gpumem__srec *srec_find(gpumem__pool *p, gpumem_stream s) {
  if (p->scap == 0) return NULL;
  size_t i = stream_hash(s) & (p->scap - 1);
  while (p->stab[i] != NULL) {
    if (p->stab[i]->stream == s) return p->stab[i];
    i = (i + 1) & (p->scap - 1);
  }
  return NULL;
}

/* What the current call allows the guard to do (see settle). */
static inline void guard_ctx(gpumem__pool *p, gpumem_stream stream, int named, int may_wait) {
  p->g_stream = stream;
  p->g_named = named;
  p->g_wait = may_wait;
}

#define SREC_REAP_MIN 64 /* stream records a pool keeps before it looks for idle ones */

/* At the end of a call that may have made records (a free): drop the idle ones once there are many
 * (amortised: the next look comes after the count doubled, or SREC_REAP_MIN). No record is held then. */
static inline void srec_maybe_reap(gpumem__pool *p) {
  if (GPUMEM__UNLIKELY(p->scount > p->reap_at)) (void)gpumem__srec_reap(p);
}

static inline void solo_note(gpumem__pool *p, gpumem_stream stream) {
  if (p->solo == SOLO_MANY || (p->solo != SOLO_NONE && stream == p->solo_s)) return;
  gpumem__solo_note_slow(p, stream);
}



#include "block_index.h"
#include "share.h"

/* Bytes reserved on p's device: what p holds changed by delta (kept with p->st.reserved_bytes, under
 * p's lock), so that every pool of the device sees the others' (gpumem__pool_others). */
static inline void gpumem__dev_reserved_add(gpumem__pool *p, int64_t delta) {
  gpumem__dev_reserved_change(p->ctx, p->device, delta);
}

/* What the device's other pools hold (the main pool and the graph pools: limit_bytes counts them all). Pool
 * lock held. */
static inline uint64_t gpumem__pool_others(const gpumem__pool *p) {
  uint64_t all = atomic_load_explicit(&p->ctx->dev_reserved[p->device], memory_order_relaxed);
  return all > p->st.reserved_bytes ? all - p->st.reserved_bytes : 0;
}

/* The limit left to p (0: none): limit_bytes less what the other pools of the device hold, and never
 * less than what p holds (the others took the rest: p may still rearrange what it has, as moving idle
 * chunks, but not grow). Pool lock held. */
static inline uint64_t gpumem__pool_limit(const gpumem__pool *p) {
  if (p->limit == 0) return 0;
  uint64_t o = gpumem__pool_others(p), own = p->st.reserved_bytes;
  if (p->limit > o && p->limit - o > own) return p->limit - o;
  return own > 0 ? own : 1;
}

#endif /* GPUMEM_POOL_H */
