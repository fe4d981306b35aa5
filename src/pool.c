/* pool.c: the per-device pool.
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
 * if S has no pending batch, "harvests" it (while the pool has seen only
 * one stream, a "mark" instead: the event is recorded, the blocks stay in
 * S's fidx; see mark_record): one event recorded on S now
 * (later than every free in it, hence safe) and the whole fidx moved into a
 * pending batch (O(1): the fidx object changes hands). The backend is only
 * ever called with the stream of the current call (see stream_touch): an
 * application may destroy a stream right after freeing on it. An alloc on
 * T takes the smallest fit among T's fidx, T's pending batch and READY; on
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
enum { IDX_STREAM = 0, IDX_PENDING = 1, IDX_READY = 2 };
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
  gpumem__batch *batches;      /* its pending batch (at most one) */
  uint64_t fed;                /* pool->hungry when this stream was last harvested (see stream_touch) */
  uint64_t seq;                /* frees on this stream so far (block fseq) */
  gpumem_event mev;            /* single-stream mark: event recorded on the stream ... */
  uint64_t mark_seq;           /* ... after its free number mark_seq */
  int has_mark;
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
  gpumem__fidx *ready;
  gpumem__segment *segs;
  gpumem__segment *empty;
  uint64_t empty_bytes;
  gpumem__srec **stab;         /* open addressing, power-of-two capacity */
  size_t scap, scount;
  gpumem__batch *pending_head, *pending_tail;
  size_t npending;
  gpumem_event *evcache;
  size_t nev, evcap;
  gpumem__block *bfree;        /* block slab free list (through next) */
  gpumem__slab *slabs;
  gpumem__fidx *ffree;
  gpumem__batch *batch_free;
  uint64_t hungry;             /* misses that wanted other streams' free blocks (see stream_touch) */
  atomic_int tc_keyed;         /* thread caches keyed to this pool (gpumem__pool_tc_keyed) */
  int nogrow;                  /* thread caches of this pool may hold blocks: do not grow, let them flush first */
  int grow_blocked;            /* ... and the call would have grown */
  size_t nmarks;               /* streams with a pending mark */
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

int gpumem__pool_device(const gpumem__pool *pool) { return pool->device; }
int gpumem__pool_device_of(const gpumem__pool *pool) { return pool->device; }
size_t gpumem__block_requested(const gpumem__block *b) { return b->requested; }

#define LOG(p, lvl, ...) gpumem__log(&(p)->ctx->opt.log, (lvl), __VA_ARGS__)

#ifdef GPUMEM_DEBUG
static gpumem_status gpumem__pool_check_locked_(gpumem__pool *p);
#endif
static gpumem_status vm_release_idle(gpumem__pool *p, uint64_t keep, uint64_t *released);

/* ---------------------------------------------------------------------- */
/* TLSF                                                                    */

static inline void tlsf_map_units(uint64_t u, int *fl, int *sl) {
  if (u < TLSF_SL) {
    *fl = 0;
    *sl = (int)u;
    return;
  }
  int l = msb64(u);
  int f = l - (TLSF_SL_LOG - 1);
  if (f >= TLSF_FL) {
    *fl = TLSF_FL - 1;
    *sl = TLSF_SL - 1;
    return;
  }
  *fl = f;
  *sl = (int)((u >> (l - TLSF_SL_LOG)) & (TLSF_SL - 1));
}

/* Bucket of a block of `size` bytes (units of 256 B: 8 linear buckets, then 8 per power of two). */
static inline void tlsf_map(size_t size, int *fl, int *sl) { tlsf_map_units((uint64_t)size >> 8, fl, sl); }

static inline void tlsf_insert(gpumem__tlsf *t, gpumem__block *b) {
  int fl, sl;
  tlsf_map(b->size, &fl, &sl);
  gpumem__block *h = t->heads[fl][sl];
  b->fprev = NULL;
  b->fnext = h;
  if (h != NULL) h->fprev = b;
  t->heads[fl][sl] = b;
  t->sl_bitmap[fl] |= (uint8_t)(1u << sl);
  t->fl_bitmap |= (uint64_t)1 << fl;
}

static inline void tlsf_remove(gpumem__tlsf *t, gpumem__block *b) {
  int fl, sl;
  tlsf_map(b->size, &fl, &sl);
  if (b->fprev != NULL) b->fprev->fnext = b->fnext;
  else t->heads[fl][sl] = b->fnext;
  if (b->fnext != NULL) b->fnext->fprev = b->fprev;
  b->fprev = b->fnext = NULL;
  if (t->heads[fl][sl] == NULL) {
    t->sl_bitmap[fl] &= (uint8_t) ~(1u << sl);
    if (t->sl_bitmap[fl] == 0) t->fl_bitmap &= ~((uint64_t)1 << fl);
  }
}

/* A free block of at least size bytes, or NULL. Good fit: the first
 * non-empty bucket whose every block fits; failing that, a bounded scan of
 * the bucket size itself falls into. */
static gpumem__block *tlsf_find(gpumem__tlsf *t, size_t size) {
  if (t->fl_bitmap == 0) return NULL;
  uint64_t u = (uint64_t)size >> 8;
  int fl, sl;
  if (u >= TLSF_SL) u += ((uint64_t)1 << (msb64(u) - TLSF_SL_LOG)) - 1; /* round up to a bucket boundary */
  tlsf_map_units(u, &fl, &sl);
  unsigned slmap = (unsigned)t->sl_bitmap[fl] & (~0u << sl);
  if (slmap == 0) {
    uint64_t flmap = fl + 1 < 64 ? t->fl_bitmap & (~(uint64_t)0 << (fl + 1)) : 0;
    if (flmap != 0) {
      fl = ctz64(flmap);
      slmap = t->sl_bitmap[fl];
    }
  }
  if (slmap != 0) {
    sl = __builtin_ctz(slmap);
    for (gpumem__block *b = t->heads[fl][sl]; b != NULL; b = b->fnext)
      if (b->size >= size) return b; /* the head, except in the last (clamped) bucket */
  }
  /* the exact bucket may hold a fitting block the rounded search skipped */
  int efl, esl;
  tlsf_map(size, &efl, &esl);
  int n = 0;
  for (gpumem__block *b = t->heads[efl][esl]; b != NULL && n < 32; b = b->fnext, n++)
    if (b->size >= size) return b;
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Metadata allocation: block slab, fidx and batch recycling               */

static int block_reserve(gpumem__pool *p, int n) {
  int have = 0;
  for (gpumem__block *b = p->bfree; b != NULL && have < n; b = b->next) have++;
  if (have >= n) return 0;
  gpumem__slab *s = aligned_alloc(_Alignof(gpumem__slab), sizeof *s); /* the blocks' 32-byte alignment */
  if (s == NULL) return -1;
  s->next = p->slabs;
  p->slabs = s;
  for (int i = SLAB_N - 1; i >= 0; i--) {
    atomic_init(&s->blocks[i].state, 0);
    s->blocks[i].next = p->bfree;
    p->bfree = &s->blocks[i];
  }
  return 0;
}

/* Caller reserved one first. */
static gpumem__block *block_new(gpumem__pool *p) {
  gpumem__block *b = p->bfree;
  p->bfree = b->next;
  /* every field but the state, which goes on counting (see gpumem__block): a
   * thread cache may still remember an old value and try it at any time */
  memset(b, 0, offsetof(gpumem__block, state));
  return b;
}

static void block_free(gpumem__pool *p, gpumem__block *b) {
  b->idx = NULL;
  b->seg = NULL;
  b->next = p->bfree;
  p->bfree = b;
}

static void fidx_clear(gpumem__fidx *f, int kind) {
  memset(f, 0, sizeof *f);
  f->kind = kind;
}

static gpumem__fidx *fidx_new(gpumem__pool *p, int kind) {
  gpumem__fidx *f = p->ffree;
  if (f != NULL) {
    p->ffree = f->next_free;
    f->kind = kind;
    f->srec = NULL;
    f->batch = NULL;
    f->next_free = NULL;
    return f; /* recycled fidx are empty: heads NULL, bitmaps 0 */
  }
  f = malloc(sizeof *f);
  if (f == NULL) return NULL;
  fidx_clear(f, kind);
  return f;
}

static void fidx_recycle(gpumem__pool *p, gpumem__fidx *f) {
  f->next_free = p->ffree;
  p->ffree = f;
}

/* ---------------------------------------------------------------------- */
/* Free-index membership                                                   */

static void seg_mark_empty(gpumem__pool *p, gpumem__segment *s) {
  if (s->empty || s->kind != SEG_PLAIN) return; /* an expandable segment is given back by vm_release_idle */
  s->empty = 1;
  s->eprev = NULL;
  s->enext = p->empty;
  if (p->empty != NULL) p->empty->eprev = s;
  p->empty = s;
  p->empty_bytes += s->size;
}

static void seg_unmark_empty(gpumem__pool *p, gpumem__segment *s) {
  if (!s->empty) return;
  s->empty = 0;
  if (s->eprev != NULL) s->eprev->enext = s->enext;
  else p->empty = s->enext;
  if (s->enext != NULL) s->enext->eprev = s->eprev;
  s->eprev = s->enext = NULL;
  p->empty_bytes -= s->size;
}

static inline void idx_insert(gpumem__pool *p, gpumem__fidx *f, gpumem__block *b) {
  b->idx = f;
  tlsf_insert(&f->t[b->seg->cls], b);
  f->nblocks++;
  f->bytes += b->size;
  if (f->kind == IDX_READY && b->size == b->seg->size) seg_mark_empty(p, b->seg);
}

static inline void idx_remove(gpumem__pool *p, gpumem__block *b) {
  gpumem__fidx *f = b->idx;
  if (f->kind == IDX_READY && b->size == b->seg->size) seg_unmark_empty(p, b->seg);
  tlsf_remove(&f->t[b->seg->cls], b);
  f->nblocks--;
  f->bytes -= b->size;
  b->idx = NULL;
}

/* Insert b (in no fidx) into f, merging with neighbours already in f. */
static void insert_coalesce(gpumem__pool *p, gpumem__fidx *f, gpumem__block *b) {
  if (f->kind == IDX_READY && b->seg->kind == SEG_VM) gpumem__vm_busy(b->seg->vm, b->addr, b->size, -1);
  gpumem__block *q = b->prev;
  if (q != NULL && q->idx == f) {
    idx_remove(p, q);
    q->size += b->size;
    if (b->fseq > q->fseq) q->fseq = b->fseq;
    q->next = b->next;
    if (b->next != NULL) b->next->prev = q;
    block_free(p, b);
    b = q;
  }
  q = b->next;
  if (q != NULL && q->idx == f) {
    idx_remove(p, q);
    b->size += q->size;
    if (q->fseq > b->fseq) b->fseq = q->fseq;
    b->next = q->next;
    if (q->next != NULL) q->next->prev = b;
    block_free(p, q);
  }
  idx_insert(p, f, b);
}

/* Search one fidx for a block for a request of class rcls. */
static gpumem__block *idx_find(gpumem__fidx *f, size_t rsize, int rcls) {
  if (f == NULL || f->nblocks == 0) return NULL;
  gpumem__block *b = tlsf_find(&f->t[rcls], rsize);
  if (b == NULL) b = tlsf_find(&f->t[CLS_MIXED], rsize);
  return b;
}

/* Take free block b for rsize bytes: split off the rest into b's fidx. One
 * block must be reserved. The remainder's other neighbour is never in the
 * same fidx (it would have been merged with b), so no coalescing is needed. */
static void take(gpumem__pool *p, gpumem__block *b, size_t rsize) {
  gpumem__fidx *f = b->idx;
  if (f->kind == IDX_READY && b->seg->kind == SEG_VM) gpumem__vm_busy(b->seg->vm, b->addr, rsize, +1);
  idx_remove(p, b);
  if (b->size > rsize) {
    gpumem__block *r = block_new(p);
    r->addr = b->addr + rsize;
    r->size = b->size - rsize;
    r->seg = b->seg;
    r->fseq = b->fseq;
    r->prev = b;
    r->next = b->next;
    if (b->next != NULL) b->next->prev = r;
    b->next = r;
    b->size = rsize;
    idx_insert(p, f, r);
  }
}

/* ---------------------------------------------------------------------- */
/* Stream records                                                          */

static inline size_t stream_hash(gpumem_stream s) {
  uint64_t x = (uint64_t)(uintptr_t)s;
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 17);
}

static gpumem__srec *srec_find(gpumem__pool *p, gpumem_stream s) {
  if (p->scap == 0) return NULL;
  size_t i = stream_hash(s) & (p->scap - 1);
  while (p->stab[i] != NULL) {
    if (p->stab[i]->stream == s) return p->stab[i];
    i = (i + 1) & (p->scap - 1);
  }
  return NULL;
}

static gpumem__srec *srec_get(gpumem__pool *p, gpumem_stream s) {
  gpumem__srec *r = srec_find(p, s);
  if (r != NULL) return r;
  if ((p->scount + 1) * 2 > p->scap) {
    size_t ncap = p->scap ? p->scap * 2 : 8;
    gpumem__srec **nt = calloc(ncap, sizeof *nt);
    if (nt == NULL) return NULL;
    for (size_t i = 0; i < p->scap; i++) {
      if (p->stab[i] == NULL) continue;
      size_t j = stream_hash(p->stab[i]->stream) & (ncap - 1);
      while (nt[j] != NULL) j = (j + 1) & (ncap - 1);
      nt[j] = p->stab[i];
    }
    free(p->stab);
    p->stab = nt;
    p->scap = ncap;
  }
  r = calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  r->idx = fidx_new(p, IDX_STREAM);
  if (r->idx == NULL) {
    free(r);
    return NULL;
  }
  r->stream = s;
  r->idx->srec = r;
  size_t i = stream_hash(s) & (p->scap - 1);
  while (p->stab[i] != NULL) i = (i + 1) & (p->scap - 1);
  p->stab[i] = r;
  p->scount++;
  return r;
}

/* ---------------------------------------------------------------------- */
/* Events and pending batches                                              */

static gpumem_status ev_get(gpumem__pool *p, gpumem_event *ev) {
  if (p->nev > 0) {
    *ev = p->evcache[--p->nev];
    return GPUMEM_OK;
  }
  return gpumem__be_event_create(p->ctx, p->device, ev);
}

static void ev_put(gpumem__pool *p, gpumem_event ev) {
  if (p->nev == p->evcap) {
    size_t ncap = p->evcap ? p->evcap * 2 : 8;
    gpumem_event *n = realloc(p->evcache, ncap * sizeof *n);
    if (n == NULL) {
      (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
      return;
    }
    p->evcache = n;
    p->evcap = ncap;
  }
  p->evcache[p->nev++] = ev;
}

/* Move all STREAM blocks of r into a new pending batch. With with_event, one
 * event is recorded on r's stream; without, the batch completes only by a
 * device synchronisation. Returns the batch or NULL (nothing moved). */
static gpumem__batch *harvest(gpumem__pool *p, gpumem__srec *r, int with_event) {
  if (r->idx->nblocks == 0) return NULL;
  gpumem_event ev = NULL;
  if (with_event) {
    if (ev_get(p, &ev) != GPUMEM_OK) return NULL;
    if (gpumem__be_event_record(p->ctx, p->device, ev, r->stream) != GPUMEM_OK) {
      (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
      return NULL;
    }
  }
  gpumem__batch *b = p->batch_free;
  if (b != NULL) p->batch_free = b->next;
  else b = malloc(sizeof *b);
  gpumem__fidx *nf = b != NULL ? fidx_new(p, IDX_STREAM) : NULL;
  if (nf == NULL) {
    if (b != NULL) {
      b->next = p->batch_free;
      p->batch_free = b;
    }
    if (with_event) ev_put(p, ev);
    return NULL;
  }
  memset(b, 0, sizeof *b);
  b->ev = ev;
  b->has_ev = with_event;
  b->srec = r;
  b->idx = r->idx;
  b->idx->kind = IDX_PENDING;
  b->idx->batch = b;
  nf->srec = r;
  r->idx = nf;
  /* append to the pool's pending list, push on the stream's list */
  b->prev = p->pending_tail;
  if (p->pending_tail != NULL) p->pending_tail->next = b;
  else p->pending_head = b;
  p->pending_tail = b;
  p->npending++;
  b->snext = r->batches;
  if (r->batches != NULL) r->batches->sprev = b;
  r->batches = b;
  return b;
}

/* Move every block of f into READY (coalescing). The blocks go in the order
 * of f's buckets, each bucket's list from its head; f's lists are not
 * unlinked one block at a time but dropped whole (f ends empty). */
static void drain_to_ready(gpumem__pool *p, gpumem__fidx *f) {
  gpumem__fidx *ready = p->ready;
  for (int c = 0; c < CLS_COUNT; c++) {
    gpumem__tlsf *t = &f->t[c];
    uint64_t fls = t->fl_bitmap;
    while (fls != 0) {
      int fl = ctz64(fls);
      fls &= fls - 1;
      unsigned sls = t->sl_bitmap[fl];
      while (sls != 0) {
        int sl = __builtin_ctz(sls);
        sls &= sls - 1;
        gpumem__block *b = t->heads[fl][sl], *n;
        t->heads[fl][sl] = NULL;
        for (; b != NULL; b = n) {
          n = b->fnext; /* b's merges touch READY blocks only, never f's */
          b->fprev = b->fnext = NULL;
          b->idx = NULL;
          insert_coalesce(p, ready, b);
        }
      }
      t->sl_bitmap[fl] = 0;
    }
    t->fl_bitmap = 0;
  }
  f->nblocks = 0;
  f->bytes = 0;
}

/* The batch's event completed: its blocks become READY (coalescing). */
static void batch_complete(gpumem__pool *p, gpumem__batch *b) {
  gpumem__fidx *f = b->idx;
  drain_to_ready(p, f);
  if (b->prev != NULL) b->prev->next = b->next;
  else p->pending_head = b->next;
  if (b->next != NULL) b->next->prev = b->prev;
  else p->pending_tail = b->prev;
  p->npending--;
  if (b->sprev != NULL) b->sprev->snext = b->snext;
  else b->srec->batches = b->snext;
  if (b->snext != NULL) b->snext->sprev = b->sprev;
  if (b->has_ev) ev_put(p, b->ev);
  fidx_recycle(p, f);
  b->next = p->batch_free;
  p->batch_free = b;
}

/* Single-stream marks. While a pool has seen one stream only, moving its
 * frees into batches would split its free space between fidx (worse fit,
 * less coalescing: plain-mode replays lost up to 25%), so the event is
 * recorded at the free as a "mark" and the blocks stay in the stream's
 * fidx; once the mark's event completed, the blocks freed before it
 * (fseq <= mark_seq) become READY, at a poll. */
static void mark_drop(gpumem__pool *p, gpumem__srec *r) {
  ev_put(p, r->mev);
  r->has_mark = 0;
  p->nmarks--;
}

static void mark_record(gpumem__pool *p, gpumem__srec *r) {
  gpumem_event ev;
  if (ev_get(p, &ev) != GPUMEM_OK) return;
  if (gpumem__be_event_record(p->ctx, p->device, ev, r->stream) != GPUMEM_OK) {
    (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
    return;
  }
  r->mev = ev;
  r->mark_seq = r->seq;
  r->has_mark = 1;
  p->nmarks++;
}

/* r's mark completed: its blocks freed before it become READY. */
static void mark_release(gpumem__pool *p, gpumem__srec *r) {
  gpumem__fidx *f = r->idx;
  for (int c = 0; c < CLS_COUNT; c++) {
    gpumem__tlsf *t = &f->t[c];
    uint64_t fls = t->fl_bitmap; /* a copy: blocks leave f below, but only the non-empty bins at entry matter */
    while (fls != 0) {
      int fl = ctz64(fls);
      fls &= fls - 1;
      unsigned sls = t->sl_bitmap[fl];
      while (sls != 0) {
        int sl = __builtin_ctz(sls);
        sls &= sls - 1;
        gpumem__block *b = t->heads[fl][sl], *n;
        for (; b != NULL; b = n) {
          n = b->fnext; /* in f: untouched by a merge into READY */
          if (b->fseq > r->mark_seq) continue;
          idx_remove(p, b);
          insert_coalesce(p, p->ready, b);
        }
      }
    }
  }
  mark_drop(p, r);
}

static void poll_marks(gpumem__pool *p) {
  for (size_t i = 0; i < p->scap && p->nmarks > 0; i++) {
    gpumem__srec *r = p->stab[i];
    int done = 0;
    if (r != NULL && r->has_mark && gpumem__be_event_query(p->ctx, p->device, r->mev, &done) == GPUMEM_OK && done)
      mark_release(p, r);
  }
}

/* Move every batch (and mark) whose event has completed to READY. No waiting. */
static void poll_pending(gpumem__pool *p) {
  poll_marks(p);
  gpumem__batch *b = p->pending_head;
  while (b != NULL) {
    gpumem__batch *n = b->next;
    if (b->has_ev) {
      int done = 0;
      if (gpumem__be_event_query(p->ctx, p->device, b->ev, &done) == GPUMEM_OK && done) batch_complete(p, b);
    }
    b = n;
  }
}

/* Stream-handle policy: the pool calls the backend with a stream handle only
 * during a call in which the user passed that stream (the stream may be
 * destroyed by the application right after the call returns). So the batch
 * event covering frees on S is recorded on S during a free or an alloc on S,
 * never on behalf of another stream; other streams only query events that
 * were already recorded (event_query names no stream). At most one pending
 * batch per stream: events on one stream complete in order, and polling
 * then costs O(streams). Blocks freed on S while its batch is pending stay
 * unbatched (S may reuse them at once); a later call on S asks the pending
 * event only if some miss has happened since S was last harvested
 * (pool->hungry moved) and, once it completed, records a new batch. Blocks
 * of a stream that is never named again are recovered by a device
 * synchronisation (trim, reset, the out-of-memory and limit paths), which
 * makes every free block of the device READY. */
static void stream_touch(gpumem__pool *p, gpumem__srec *r) {
  if (r->idx->nblocks == 0 || !p->ctx->has_events) return;
  if (p->scount < 2 && p->hungry == 0) { /* one stream so far: a mark, the blocks stay */
    if (!r->has_mark) mark_record(p, r);
    return;
  }
  if (r->has_mark) mark_drop(p, r); /* the batch below gets a newer event */
  gpumem__batch *b = r->batches;
  if (b != NULL) {
    if (r->fed == p->hungry) return; /* no miss is waiting: do not ask */
    int done = 0;
    if (!b->has_ev || gpumem__be_event_query(p->ctx, p->device, b->ev, &done) != GPUMEM_OK || !done) return;
    batch_complete(p, b);
    if (r->batches != NULL) return;
  }
  if (harvest(p, r, 1) != NULL) r->fed = p->hungry;
}

/* pool_pending_blocks: 1 when some free block is not READY yet (in a pending batch, or unbatched in its
 * stream's index); pool_pending: that, or READY holds blocks whose stream work may be pending (a
 * single-stream pool's "dirty" READY). */
static int pool_pending_blocks(const gpumem__pool *p) {
  if (p->npending > 0) return 1;
  for (size_t i = 0; i < p->scap; i++)
    if (p->stab[i] != NULL && p->stab[i]->idx->nblocks > 0) return 1;
  return 0;
}

static int pool_pending(const gpumem__pool *p) { return p->dirty || pool_pending_blocks(p); }

/* Single-stream expandable pools ("solo"). Once an expandable pool has
 * seen SOLO_WARM_FREES frees on one stream S and no other stream (before
 * that, frees get their events as in any pool), a free on S puts the block
 * into S's index and, when the search wants it, straight into READY
 * (coalescing with every free neighbour): S may reuse it at once, and there
 * is no other stream to keep it from. A block of a small-class segment goes
 * to READY at once: keeping it in S's index first, and moving it when a
 * search wanted it, searched twice and moved every block twice (the random
 * live set of gpumem-bench took 12 % more instructions per operation, and the
 * replays' peaks were the same or higher). Larger blocks stay in S's index,
 * where an exact fit is taken back without touching the granule counts
 * (gpumem__vm_busy is linear in a block's granules: a 1 GiB pair through
 * READY took 8.9 us on the H200, against 0.18 us). No event is recorded or asked: in the
 * steady state of a single-stream program the pool makes no backend call at
 * all. READY is then "dirty": S's work on those blocks may still be queued,
 * which matters in two places only:
 *   - unmapping: vmseg.c calls vm_guard before it unmaps an idle chunk (to
 *     move it, trim it or give it back); the guard settles (an event recorded
 *     on S, during a call that names S, or a device synchronisation) or, when
 *     the call may not wait, refuses: then new memory is created instead of
 *     moving idle chunks (vmseg.c), or trimming stops until a later call.
 *     Plain segments (initial_bytes) are given back only once settled.
 *   - a second stream T: from then on frees go to their stream's index as in
 *     every multi-stream pool, and while READY is dirty T takes READY blocks
 *     only from segments opened since (quarantine); the next call on S
 *     records the settle event, and once it completed (asked at T's calls)
 *     or after any device synchronisation READY is clean again.
 * Replays (gpumem-replay --sample-used, sim): the same or lower peaks than
 * harvesting S's frees into batches with events, and with a device running
 * behind the host (--sim-lag) lower, since freed blocks coalesce at once. */
static void dirty_clear(gpumem__pool *p) {
  p->dirty = 0;
  p->quarantine = 0;
  if (p->has_sev) {
    ev_put(p, p->sev);
    p->has_sev = 0;
  }
}

/* Try to make dirty READY clean, as the current call allows (g_*): an event
 * on solo_s (recorded now if the call names solo_s), waited for or asked;
 * else, if the call may wait, a device synchronisation. GPUMEM_OK when clean,
 * GPUMEM_ERR_BUSY when not now, or a backend error. */
static gpumem_status settle(gpumem__pool *p) {
  if (!p->dirty) return GPUMEM_OK;
  int on_s = p->g_named && p->g_stream == p->solo_s && p->ctx->has_events;
  if (on_s && (!p->has_sev || p->sev_seq < p->dirty_seq)) {
    gpumem_event ev = p->sev;
    if (p->has_sev || ev_get(p, &ev) == GPUMEM_OK) {
      if (gpumem__be_event_record(p->ctx, p->device, ev, p->solo_s) == GPUMEM_OK) {
        p->sev = ev;
        p->has_sev = 1;
        p->sev_seq = p->dirty_seq; /* it follows every free made READY so far */
      } else {
        if (p->has_sev) p->has_sev = 0; /* its state is unknown now */
        (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
      }
    }
  }
  if (p->has_sev && p->sev_seq >= p->dirty_seq) {
    int done = 0;
    if (p->g_wait ? gpumem__be_event_synchronize(p->ctx, p->device, p->sev) == GPUMEM_OK
                  : gpumem__be_event_query(p->ctx, p->device, p->sev, &done) == GPUMEM_OK && done) {
      dirty_clear(p);
      return GPUMEM_OK;
    }
  }
  if (p->g_wait) {
    gpumem_status st = gpumem__be_device_synchronize(p->ctx, p->device);
    if (st != GPUMEM_OK) return st;
    dirty_clear(p);
    return GPUMEM_OK;
  }
  return GPUMEM_ERR_BUSY;
}

/* The one stream's free blocks become READY now (coalescing), without an event. */
static void solo_drain(gpumem__pool *p, gpumem__srec *r) {
  drain_to_ready(p, r->idx);
  p->dirty = 1;
  p->dirty_seq++;
}

/* vmseg.c, before it unmaps an idle chunk (gpumem__vm_set_guard). */
static gpumem_status vm_guard(void *arg) {
  gpumem__pool *p = arg;
  return p->dirty ? settle(p) : GPUMEM_OK;
}

/* What the current call allows the guard to do (see settle). */
static inline void guard_ctx(gpumem__pool *p, gpumem_stream stream, int named, int may_wait) {
  p->g_stream = stream;
  p->g_named = named;
  p->g_wait = may_wait;
}

/* An expandable pool's call names `stream` (solo mode, see above). */
static void solo_note_slow(gpumem__pool *p, gpumem_stream stream) {
  if (p->solo == SOLO_NONE) {
    gpumem__srec *r = srec_get(p, stream);
    if (r == NULL) return; /* no host memory: stays undecided, frees take the usual path */
    p->solo = SOLO_WARM;
    p->solo_s = stream;
    p->solo_r = r;
    p->solo_frees = 0;
    return;
  }
  if (p->solo == SOLO_WARM) { /* a second stream before the first one's frees went without events */
    p->solo = SOLO_MANY;
    return;
  }
  if (p->solo == SOLO_ONE) {
    p->solo = SOLO_MANY;
    if (p->dirty) p->quarantine = 1;
    LOG(p, GPUMEM_LOG_DEBUG, "device %d: a second stream: frees are stream-ordered from now on%s", p->device,
        p->dirty ? " (READY quarantined until the first stream's work is known complete)" : "");
  }
}

static inline void solo_note(gpumem__pool *p, gpumem_stream stream) {
  if (p->solo == SOLO_MANY || (p->solo != SOLO_NONE && stream == p->solo_s)) return;
  solo_note_slow(p, stream);
}

/* Quarantine: the first stream's next call records the settle event; every call asks it. */
static void quarantine_step(gpumem__pool *p, gpumem_stream stream, int named) {
  guard_ctx(p, stream, named, 0);
  (void)settle(p);
}

/* Wait for every pending free of the device and make it READY: one device
 * synchronisation (no stream handle of an earlier call is used). If the
 * device cannot be synchronised, wait on the events already recorded. */
static void sync_all(gpumem__pool *p) {
  if (!pool_pending(p)) return;
  if (gpumem__be_device_synchronize(p->ctx, p->device) == GPUMEM_OK) {
    dirty_clear(p);
    for (size_t i = 0; i < p->scap && p->nmarks > 0; i++)
      if (p->stab[i] != NULL && p->stab[i]->has_mark) mark_drop(p, p->stab[i]);
    while (p->pending_head != NULL) batch_complete(p, p->pending_head);
    for (size_t i = 0; i < p->scap; i++)
      if (p->stab[i] != NULL && p->stab[i]->idx->nblocks > 0) drain_to_ready(p, p->stab[i]->idx);
    return;
  }
  gpumem__batch *b = p->pending_head;
  while (b != NULL) {
    gpumem__batch *n = b->next;
    if (b->has_ev && gpumem__be_event_synchronize(p->ctx, p->device, b->ev) == GPUMEM_OK) batch_complete(p, b);
    b = n;
  }
  for (size_t i = 0; i < p->scap && p->nmarks > 0; i++) {
    gpumem__srec *r = p->stab[i];
    if (r != NULL && r->has_mark && gpumem__be_event_synchronize(p->ctx, p->device, r->mev) == GPUMEM_OK)
      mark_release(p, r);
  }
  if (p->dirty && p->has_sev && p->sev_seq >= p->dirty_seq &&
      gpumem__be_event_synchronize(p->ctx, p->device, p->sev) == GPUMEM_OK)
    dirty_clear(p);
}

/* ---------------------------------------------------------------------- */
/* Segments                                                                */

static gpumem_status seg_create(gpumem__pool *p, size_t size, int cls, gpumem__segment **out) {
  gpumem__segment *s = calloc(1, sizeof *s);
  if (s == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  void *mem = NULL;
  gpumem_status st = gpumem__be_malloc(p->ctx, p->device, size, &mem);
  if (st != GPUMEM_OK) {
    free(s);
    return st;
  }
  gpumem__block *b = block_new(p);
  b->addr = (uintptr_t)mem;
  b->size = size;
  b->seg = s;
  s->pool = p;
  s->base = (uintptr_t)mem;
  s->size = size;
  s->cls = cls;
  s->kind = SEG_PLAIN;
  s->solo_era = p->solo != SOLO_MANY;
  s->head = b;
  s->next = p->segs;
  if (p->segs != NULL) p->segs->prev = s;
  p->segs = s;
  p->st.reserved_bytes += size;
  if (p->st.reserved_bytes > p->st.reserved_peak) p->st.reserved_peak = p->st.reserved_bytes;
  p->st.num_segments++;
  p->st.num_backend_allocs++;
  LOG(p, GPUMEM_LOG_DEBUG, "device %d: new %zu-byte segment at %p (reserved %llu)", p->device, size, mem,
      (unsigned long long)p->st.reserved_bytes);
  *out = s;
  return GPUMEM_OK;
}

static void seg_unlink(gpumem__pool *p, gpumem__segment *s) {
  if (s->prev != NULL) s->prev->next = s->next;
  else p->segs = s->next;
  if (s->next != NULL) s->next->prev = s->prev;
}

/* Give a wholly free READY segment back. On a backend error it stays. */
static gpumem_status seg_release(gpumem__pool *p, gpumem__segment *s) {
  gpumem_status st = p->dirty ? settle(p) : GPUMEM_OK; /* its blocks may have been freed without an event */
  if (st != GPUMEM_OK) return st;
  st = gpumem__be_free(p->ctx, p->device, (void *)s->base);
  if (st != GPUMEM_OK) return st;
  gpumem__block *b = s->head;
  idx_remove(p, b); /* also unmarks empty */
  block_free(p, b);
  seg_unlink(p, s);
  p->st.reserved_bytes -= s->size;
  p->st.num_segments--;
  p->st.num_backend_frees++;
  free(s);
  return GPUMEM_OK;
}

/* Release wholly free READY segments while cached > keep. Adds to *released. */
static gpumem_status release_empty(gpumem__pool *p, uint64_t keep, uint64_t *released) {
  gpumem_status first = GPUMEM_OK;
  gpumem__segment *s = p->empty;
  while (s != NULL && cached_bytes(p) > keep) {
    gpumem__segment *n = s->enext;
    size_t sz = s->size;
    gpumem_status st = seg_release(p, s);
    if (st == GPUMEM_OK) *released += sz;
    else if (st == GPUMEM_ERR_BUSY) break; /* not settled: not now */
    else if (first == GPUMEM_OK) first = st;
    s = n;
  }
  if (p->vm != NULL) {
    gpumem_status st = vm_release_idle(p, keep, released);
    if (first == GPUMEM_OK) first = st;
  }
  return first;
}

static void count_trim(gpumem__pool *p, uint64_t released, const char *why) {
  if (released == 0) return;
  p->st.num_trims++;
  p->st.trimmed_bytes += released;
  LOG(p, GPUMEM_LOG_DEBUG, "device %d: %s gave back %llu bytes (reserved %llu)", p->device, why,
      (unsigned long long)released, (unsigned long long)p->st.reserved_bytes);
}

/* After a free: keep cached <= release_threshold, without waiting. */
static void check_threshold(gpumem__pool *p) {
  uint64_t thr = p->ctx->opt.release_threshold;
  if (cached_bytes(p) <= thr) return;
  uint64_t rel = 0;
  (void)release_empty(p, thr, &rel);
  if (cached_bytes(p) > thr && (p->npending > 0 || p->nmarks > 0)) {
    poll_pending(p);
    (void)release_empty(p, thr, &rel);
  }
  if (cached_bytes(p) > thr && p->solo == SOLO_ONE && p->solo_r->idx->nblocks > 0) {
    /* the one stream's frees: READY (dirty) now; the guard settles with an event if this call names the stream */
    solo_drain(p, p->solo_r);
    (void)release_empty(p, thr, &rel);
  }
  count_trim(p, rel, "release threshold");
}

/* After growing: if the device's free memory is below trim_free_fraction of total, give back free segments. */
static void check_free_fraction(gpumem__pool *p) {
  double frac = p->ctx->opt.trim_free_fraction;
  if (frac <= 0.0) return;
  uint64_t fr = 0, tot = 0;
  if (gpumem__be_mem_get_info(p->ctx, p->device, &fr, &tot) != GPUMEM_OK) return;
  if ((double)fr >= frac * (double)tot) return;
  uint64_t rel = 0;
  /* memory pressure, as in the out-of-memory path: wait for the device so
   * that blocks freed on any stream count as free, then give them back */
  sync_all(p);
  (void)release_empty(p, 0, &rel);
  count_trim(p, rel, "low device memory");
}

/* ---------------------------------------------------------------------- */
/* Allocation                                                              */

static size_t std_segment_size(size_t rsize, int rcls) {
  if (rcls == CLS_SMALL) return GPUMEM__SMALL_SEG;
  if (rsize <= GPUMEM__MEDIUM_MAX) return GPUMEM__MEDIUM_SEG;
  return (rsize + GPUMEM__LARGE_ROUND - 1) & ~(GPUMEM__LARGE_ROUND - 1); /* overflow checked by caller */
}

/* The smallest fitting block among the stream's own fidx, its pending
 * batch and READY (one good-fit candidate from each). */
static gpumem__block *search_cache(gpumem__pool *p, gpumem__srec *r, size_t rsize, int rcls) {
  gpumem__block *b = idx_find(p->ready, rsize, rcls), *c;
  if (r != NULL) {
    if ((c = idx_find(r->idx, rsize, rcls)) != NULL && (b == NULL || c->size < b->size)) b = c;
    for (gpumem__batch *bt = r->batches; bt != NULL; bt = bt->snext)
      if ((c = idx_find(bt->idx, rsize, rcls)) != NULL && (b == NULL || c->size < b->size)) b = c;
  }
  return b;
}

/* Grow by one segment for rsize: the standard size, or smaller ones that
 * still fit the request when the standard one would pass the limit or the
 * device. Returns OK with *out taken, LIMIT_EXCEEDED, OUT_OF_MEMORY or another error. */
static gpumem_status grow(gpumem__pool *p, size_t rsize, int rcls, int smallest_first_on_oom, gpumem__block **out) {
  size_t cand[3];
  int nc = 0;
  cand[nc++] = std_segment_size(rsize, rcls);
  size_t r2 = (rsize + GPUMEM__LARGE_ROUND - 1) & ~(GPUMEM__LARGE_ROUND - 1);
  if (r2 < cand[0]) cand[nc++] = r2;
  if (rsize < r2) cand[nc++] = rsize;
  gpumem_status st = GPUMEM_ERR_LIMIT_EXCEEDED;
  int tried = 0;
  for (int i = 0; i < nc; i++) {
    size_t sz = cand[i];
    if (p->limit != 0 && p->st.reserved_bytes + sz > p->limit) continue;
    if (p->total != 0 && sz > p->total) continue;
    if (tried && !smallest_first_on_oom) break; /* one malloc on the fast path */
    tried = 1;
    gpumem__segment *s = NULL;
    st = seg_create(p, sz, rcls, &s);
    if (st == GPUMEM_OK) {
      gpumem__block *b = s->head;
      if (b->size > rsize) {
        /* split: the rest is new memory with no pending work, READY for every stream */
        gpumem__block *rest = block_new(p);
        rest->addr = b->addr + rsize;
        rest->size = b->size - rsize;
        rest->seg = s;
        rest->prev = b;
        b->next = rest;
        b->size = rsize;
        idx_insert(p, p->ready, rest);
      }
      *out = b;
      return GPUMEM_OK;
    }
    if (st != GPUMEM_ERR_OUT_OF_MEMORY) return st;
  }
  if (!tried) return GPUMEM_ERR_LIMIT_EXCEEDED;
  return st;
}

/* ---------------------------------------------------------------------- */
/* Expandable segments (pool side; the granule map is vmseg.c)             */
/*
 * In this mode (p->vm != NULL) each size class gets one SEG_VM segment: a
 * reserved range (twice the device total) laid out by the same blocks,
 * fidx and TLSF as plain segments; the range starts as one READY block.
 * A granule is mapped while a live or not-yet-READY block overlaps it
 * (vmseg.c counts those "busy" bytes: take() adds them for blocks taken
 * from READY, insert_coalesce() removes them for blocks entering READY).
 * Physical memory comes in chunks of up to 8 MiB, one backend create and
 * one map per chunk. Free mapped memory stays mapped ("idle", cached); new
 * chunks are created while that keeps the reserved bytes within their peak,
 * and beyond it idle chunks are moved to where a block needs memory, or
 * given back to make room, so the peak grows only when nothing idle is
 * left. Trim and the release threshold unmap idle chunks, also inside
 * segments that still hold live blocks. Only READY memory is ever unmapped:
 * blocks whose stream work may be pending are busy.
 */

/* Granules of [b->addr, b->addr + rsize) still to map (0 for plain segments). */
static size_t vm_need(const gpumem__block *b, size_t rsize) {
  return b->seg->kind == SEG_VM ? gpumem__vm_unmapped(b->seg->vm, b->addr, rsize) : 0;
}

/* 1 when a block of rsize at the end of READY block b would cost less
 * (gpumem__vm_place_cost: granules that nothing busy touches yet, and
 * unmapped ones) than one at its start. */
static int vm_fresh_end_better(const gpumem__block *b, size_t rsize) {
  if (b->seg->kind != SEG_VM) return 0;
  return gpumem__vm_place_cost(b->seg->vm, b->addr + b->size - rsize, rsize, SIZE_MAX) <
         gpumem__vm_place_cost(b->seg->vm, b->addr, rsize, SIZE_MAX);
}

/* Like take(), for a READY block of an expandable segment, but the block is
 * cut from the end of b (which stays READY, smaller). One block must be reserved. */
static gpumem__block *vm_take_end(gpumem__pool *p, gpumem__block *b, size_t rsize) {
  idx_remove(p, b);
  gpumem__block *t = block_new(p);
  t->addr = b->addr + b->size - rsize;
  t->size = rsize;
  t->seg = b->seg;
  t->prev = b;
  t->next = b->next;
  if (b->next != NULL) b->next->prev = t;
  b->next = t;
  b->size -= rsize;
  idx_insert(p, p->ready, b);
  gpumem__vm_busy(t->seg->vm, t->addr, rsize, +1);
  return t;
}

/* Placement in expandable segments: among up to VM_CANDIDATES free blocks
 * of each searched fidx that fit (from the request's own bucket upwards),
 * the one whose start (or, for READY blocks, end) costs least: granules
 * that nothing busy touches yet count once, unmapped ones twice (they need
 * backend calls, or new memory; gpumem__vm_place_cost); ties: the smaller
 * block, then the lower address. This stream's own free blocks are busy, so
 * they score well. */
/* (4, not 16: with 16 the replays' peaks were higher, 1.018 / 1.003 / 1.007 against 1.015 / 1.003 /
 * 1.005 for bert_dyn, gpt2_gen, resnet50 on sim, with more vm calls, and the random live set of
 * gpumem-bench cost 278.8 instructions per operation against 266.0; 2 moved more chunks on bert_dyn) */
#define VM_CANDIDATES 4
#define VM_SKIP_MAX 32 /* smaller blocks passed over in the request's own bucket */

/* The search's state: the request, and the best candidate so far. */
typedef struct vm_pick {
  size_t rsize;
  int rcls, fl0, sl0; /* the request's class and TLSF bucket */
  int clean_only;
  gpumem__block *best;
  size_t fresh;       /* its cost (SIZE_MAX while best is NULL) */
  int start_free;     /* its start costs nothing: no granule of [addr, addr + rsize) is unmapped */
} vm_pick;

/* Smallest size (bytes) of a block in TLSF bucket (fl, sl) (see tlsf_map_units). */
static inline size_t tlsf_bucket_min(int fl, int sl) {
  uint64_t u = fl == 0 ? (uint64_t)sl : (uint64_t)(TLSF_SL + sl) << (fl - 1);
  return (size_t)(u << 8);
}

/* One fidx. Returns 1 when the best can not be beaten (an exact fit that
 * touches no new granule): the search stops there. Costs are counted only
 * up to the best so far (a candidate costing more loses anyway), and not at
 * all for a candidate that can not win even at cost 0. A block that is not
 * READY is busy (every granule it touches has busy bytes, hence is mapped),
 * so placing at its start costs 0: only READY blocks are scored (ready = 1).
 * Candidates are visited, counted and skipped exactly as by a full scoring
 * of each; what is left out changes nothing in the result: a later bucket
 * of the last class that holds candidates is not visited once the best
 * costs 0 and is smaller than any block there. */
static inline __attribute__((always_inline)) int vm_consider_(gpumem__fidx *f, vm_pick *k, const int ready) {
  const size_t rsize = k->rsize;
  const int fl0 = k->fl0, clean_only = k->clean_only;
  const uint64_t flmask = ~(uint64_t)0 << fl0;
  gpumem__block *best = k->best;
  size_t fresh = k->fresh;
  int start_free = k->start_free, ret = 0;
  int seen = 0, skipped = 0;
  for (int ci = 0; ci < 2 && seen < VM_CANDIDATES; ci++) {
    gpumem__tlsf *t = &f->t[ci == 0 ? k->rcls : CLS_MIXED];
    if ((t->fl_bitmap & flmask) == 0) continue; /* bitmaps: no empty bin is visited */
    /* no class after this one has candidates: the counters matter no more once this one is left */
    const int last = ci == 1 || (f->t[CLS_MIXED].fl_bitmap & flmask) == 0;
    int fl = fl0, sl = k->sl0;
    while (seen < VM_CANDIDATES) {
      /* the next non-empty bucket from (fl, sl) on */
      unsigned sls = (unsigned)t->sl_bitmap[fl] & (~0u << sl);
      if (sls == 0) {
        uint64_t fls = t->fl_bitmap & (~(uint64_t)1 << fl);
        if (fls == 0) break;
        fl = ctz64(fls);
        sls = t->sl_bitmap[fl];
      }
      sl = __builtin_ctz(sls);
      /* every block from here on is larger than a best that costs nothing: none can win */
      if (last && fresh == 0 && tlsf_bucket_min(fl, sl) > best->size) goto out;
      int zero_here = 0;
      for (gpumem__block *b = t->heads[fl][sl]; b != NULL && seen < VM_CANDIDATES; b = b->fnext) {
        const size_t bsize = b->size;
        if (bsize < rsize || (clean_only && b->seg->solo_era)) {
          /* smaller: only in the request's own bucket, a long list of those is not walked to its end;
           * quarantine: READY of older segments may still be in use by the first stream */
          if (++skipped > VM_SKIP_MAX) break;
          continue;
        }
        seen++;
        size_t fr = 0;
        int sf = 1;
        if (best != NULL) {
          /* the order: lower cost, then the smaller block, then the lower address */
          int tie_wins = bsize < best->size || (bsize == best->size && b->addr < best->addr);
          if (fresh == 0 && !tie_wins) continue; /* loses even at cost 0 */
          if (ready && b->seg->kind == SEG_VM) {
            const gpumem__vmspace *vs = b->seg->vm;
            fr = gpumem__vm_place_cost(vs, b->addr, rsize, fresh);
            if (fr > 0) {
              sf = 0;
              size_t f2 = gpumem__vm_place_cost(vs, b->addr + bsize - rsize, rsize, fr);
              if (f2 < fr) fr = f2;
            }
          }
          if (fr > fresh || (fr == fresh && !tie_wins)) continue;
        } else if (ready && b->seg->kind == SEG_VM) {
          const gpumem__vmspace *vs = b->seg->vm;
          fr = gpumem__vm_place_cost(vs, b->addr, rsize, SIZE_MAX);
          if (fr > 0) {
            sf = 0;
            size_t f2 = gpumem__vm_place_cost(vs, b->addr + bsize - rsize, rsize, fr);
            if (f2 < fr) fr = f2;
          }
        }
        best = b;
        fresh = fr;
        start_free = sf;
        if (fr == 0) {
          if (bsize == rsize) {
            ret = 1;
            goto out;
          }
          zero_here = 1;
        }
      }
      /* a block costing nothing was found in this bucket: later buckets of
       * this class hold only larger blocks, which lose the tie */
      if (zero_here) break;
      if (++sl == TLSF_SL) {
        if (++fl == TLSF_FL) break;
        sl = 0;
      }
    }
  }
out:
  k->best = best;
  k->fresh = fresh;
  k->start_free = start_free;
  return ret;
}

static int vm_consider_ready(gpumem__fidx *f, vm_pick *k) {
  return f->nblocks == 0 ? 0 : vm_consider_(f, k, 1);
}

static int vm_consider_busy(gpumem__fidx *f, vm_pick *k) {
  return f->nblocks == 0 ? 0 : vm_consider_(f, k, 0);
}

/* The best place among this stream's free blocks (mapped) and READY ones. */
static void vm_search(gpumem__pool *p, gpumem__srec *r, vm_pick *k) {
  k->best = NULL;
  k->fresh = SIZE_MAX;
  k->start_free = 0;
  int done = 0;
  if (r != NULL) {
    done = vm_consider_busy(r->idx, k);
    for (gpumem__batch *bt = r->batches; bt != NULL && !done; bt = bt->snext) done = vm_consider_busy(bt->idx, k);
  }
  if (!done) vm_consider_ready(p->ready, k);
}

/* Granules of the best place's start still to map (1 when there is none: a new segment is needed). */
static inline size_t vm_pick_need(const vm_pick *k) {
  if (k->best == NULL) return 1;
  return k->start_free ? 0 : vm_need(k->best, k->rsize);
}

/* A new expandable segment for class rcls, holding at least rsize bytes; *out = its (READY) block. */
static gpumem_status vm_seg_open(gpumem__pool *p, size_t rsize, int rcls, gpumem__block **out) {
  gpumem__segment *s = calloc(1, sizeof *s);
  if (s == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  uintptr_t base = 0;
  size_t size = 0;
  gpumem_status st = gpumem__vm_space_open(p->vm, rsize, &s->vm, &base, &size);
  if (st != GPUMEM_OK) {
    free(s);
    return st;
  }
  gpumem__block *b = block_new(p);
  b->addr = base;
  b->size = size;
  b->seg = s;
  s->pool = p;
  s->base = base;
  s->size = size;
  s->cls = rcls;
  s->kind = SEG_VM;
  s->solo_era = p->solo != SOLO_MANY;
  s->head = b;
  s->next = p->segs;
  if (p->segs != NULL) p->segs->prev = s;
  p->segs = s;
  p->st.num_segments++;
  idx_insert(p, p->ready, b);
  *out = b;
  return GPUMEM_OK;
}

/* Give back idle granules while cached > keep; with keep 0 also the ranges
 * of expandable segments that are wholly free and unmapped. */
static gpumem_status vm_release_idle(gpumem__pool *p, uint64_t keep, uint64_t *released) {
  gpumem_status first = GPUMEM_OK;
  if (cached_bytes(p) > keep) first = gpumem__vm_trim(p->vm, cached_bytes(p) - keep, released);
  if (keep != 0) return first;
  gpumem__segment *s = p->segs;
  while (s != NULL) {
    gpumem__segment *n = s->next;
    gpumem__block *h = s->head;
    if (s->kind == SEG_VM && h->next == NULL && h->idx == p->ready && gpumem__vm_space_mapped(s->vm) == 0) {
      gpumem_status st = gpumem__vm_space_close(s->vm);
      if (st == GPUMEM_OK) {
        idx_remove(p, h);
        block_free(p, h);
        seg_unlink(p, s);
        p->st.num_segments--;
        free(s);
      } else if (first == GPUMEM_OK) {
        first = st;
      }
    }
    s = n;
  }
  return first;
}

/* Reset/destroy: every block is being dropped; unmap and destroy every chunk
 * and release the ranges. A segment that cannot be given back stays (with
 * what is still mapped counted) and the first error is returned. */
static gpumem_status vm_clear(gpumem__pool *p) {
  gpumem_status first = GPUMEM_OK;
  gpumem__segment *s = p->segs;
  while (s != NULL) {
    gpumem__segment *n = s->next;
    if (s->kind == SEG_VM) {
      gpumem__vm_space_clear_busy(s->vm);
      gpumem_status st = gpumem__vm_space_close(s->vm);
      if (st == GPUMEM_OK) {
        seg_unlink(p, s);
        p->st.num_segments--;
        free(s);
      } else if (first == GPUMEM_OK) {
        first = st;
      }
    }
    s = n;
  }
  uint64_t rel = 0;
  gpumem_status st = gpumem__vm_trim(p->vm, UINT64_MAX, &rel); /* spare chunks, and a second try */
  if (first == GPUMEM_OK) first = st;
  return first;
}

/* The allocation path in expandable mode. The block comes from the cache
 * as in plain mode (this stream's free blocks, then READY; the segment's
 * READY tail always fits); then its unmapped granules get chunks. */
static gpumem_status vm_alloc_locked(gpumem__pool *p, size_t rsize, int rcls, gpumem_stream stream,
                                     gpumem__block **out) {
  if (block_reserve(p, 2) != 0) return GPUMEM_ERR_OUT_OF_MEMORY;
  solo_note(p, stream);
  if (p->quarantine) quarantine_step(p, stream, 1);
  /* one stream: the guard may wait before moving idle chunks, as the growth check below waits */
  guard_ctx(p, stream, 1, p->solo != SOLO_MANY);
  int clean_only = p->quarantine && stream != p->solo_s;
  gpumem__srec *r = p->solo == SOLO_ONE ? p->solo_r : srec_find(p, stream);
  size_t g = gpumem__vm_granularity(p->vm);
  int synced = 0;
  vm_pick k;
  k.rsize = rsize;
  k.rcls = rcls;
  tlsf_map(rsize, &k.fl0, &k.sl0);
  for (int pass = 0;; pass++) {
  search:;
    k.clean_only = clean_only;
    vm_search(p, r, &k);
    gpumem__block *b = k.best;
    size_t cost = k.fresh, need = vm_pick_need(&k);
    if (need > 0 || (b != NULL && b->idx != p->ready && (b->size != rsize || cost != 0))) {
      /* before mapping, or before settling for a free block of this stream's
       * own that does not fit exactly (placed where it was freed): completed
       * frees become READY (their granules idle, their space placeable
       * anywhere), and this stream's unbatched frees get their event (this
       * call names the stream). An exact fit of the stream's own, all mapped,
       * is taken at once: no event is recorded or asked (on CUDA that is
       * about a microsecond per allocation). */
      if (p->npending > 0 || p->nmarks > 0) poll_pending(p);
      if (r != NULL && r->batches == NULL && r->idx->nblocks > 0) {
        if (p->solo == SOLO_ONE) {
          solo_drain(p, r); /* no event: READY becomes dirty */
        } else if (p->ctx->has_events) {
          (void)harvest(p, r, 1);
          poll_pending(p);
        }
      }
      vm_search(p, r, &k);
      b = k.best;
      need = vm_pick_need(&k);
    }
    if (b != NULL && need == 0) { /* all mapped: nothing below applies but the take */
      take(p, b, rsize);
      *out = b;
      return GPUMEM_OK;
    }
    if (p->nogrow && (b == NULL || need > 0)) {
      /* the caller's thread cache flushes and asks again: its blocks, coalesced, may make the mapping
       * unneeded. (Only when new memory would be created, not when idle chunks would be moved, left
       * the caches' blocks pinning granules: on the random live set of gpumem-bench, 4.5 event calls
       * per 1000 operations against 1.5, more chunk moves, and higher replay peaks.) Before the wait
       * below: the blocks given back may make it unneeded too. */
      p->grow_blocked = 1;
      return GPUMEM_ERR_BUSY;
    }
    size_t avail = gpumem__vm_available(p->vm);
    if (b != NULL && !synced && need > avail && p->ctx->has_events && p->scount == 1 && r != NULL &&
        p->st.reserved_bytes + (uint64_t)(need - avail) * g > p->st.reserved_peak && pool_pending_blocks(p)) {
      /* One stream (the training-loop case), growing past the peak while
       * blocks it freed may still be in use on the device (a GPU running
       * behind the host): their chunks cannot be moved and their space is
       * split from READY. Wait for the device once, so they become READY,
       * coalesce and their chunks idle, then search again. (With several
       * streams the pool does not wait: another stream's work may be long.)
       * Replays on the simulator with its work held back (gpumem-replay
       * --sim-lag 400): resnet50 1.255 -> 1.055, bert_dyn 1.139 -> 1.031
       * (docs/PERFORMANCE.md). Steady state (no growth) never waits.
       * (Blocks a single-stream pool made READY without an event are
       * coalesced already: moving their idle chunks waits for the stream in
       * vm_guard, not here.) */
      synced = 1;
      sync_all(p);
      r = srec_find(p, stream);
      clean_only = p->quarantine && stream != p->solo_s;
      goto search;
    }
    if (b == NULL) {
      gpumem_status st = vm_seg_open(p, rsize, rcls, &b);
      if (st != GPUMEM_OK) return st;
      need = vm_need(b, rsize);
    }
    gpumem_status st = GPUMEM_OK;
    if (need > avail && p->limit != 0 && p->st.reserved_bytes + (uint64_t)(need - avail) * g > p->limit) {
      st = GPUMEM_ERR_LIMIT_EXCEEDED; /* refused before anything is mapped */
    } else {
      gpumem__fidx *from = b->idx;
      uint64_t held = p->st.reserved_bytes;
      if (need > 0 && b->idx == p->ready && b->size > rsize && vm_fresh_end_better(b, rsize)) {
        b = vm_take_end(p, b, rsize); /* at the end it shares more granules with busy neighbours */
        need = vm_need(b, rsize);
      } else {
        take(p, b, rsize);
      }
      if (need > 0) st = gpumem__vm_commit(b->seg->vm, b->addr, rsize, p->limit);
      if (st == GPUMEM_OK) {
        if (need > 0) check_free_fraction(p); /* mapped: new chunks, or idle ones moved here */
        *out = b;
        return GPUMEM_OK;
      }
      /* undo: the block goes back where it came from; chunks created for it are given back */
      insert_coalesce(p, from, b);
      if (p->st.reserved_bytes > held) {
        uint64_t rel = 0;
        (void)gpumem__vm_trim(p->vm, p->st.reserved_bytes - held, &rel);
      }
    }
    if ((st != GPUMEM_ERR_OUT_OF_MEMORY && st != GPUMEM_ERR_LIMIT_EXCEEDED) || pass > 0) return st;
    /* slow path: wait for every pending free, give back what is cached, retry once */
    sync_all(p);
    if (st == GPUMEM_ERR_OUT_OF_MEMORY) {
      p->st.num_oom_retries++;
      uint64_t rel = 0;
      (void)release_empty(p, 0, &rel);
      count_trim(p, rel, "out-of-memory retry");
    }
    r = srec_find(p, stream);
    clean_only = p->quarantine && stream != p->solo_s;
  }
}

static gpumem_status vm_check_seg(gpumem__pool *p, gpumem__segment *s) {
  if (gpumem__vm_check_begin(s->vm) != 0) return GPUMEM_OK; /* no host memory to check with */
  for (gpumem__block *b = s->head; b != NULL; b = b->next)
    if (b->idx == NULL || b->idx->kind != IDX_READY) gpumem__vm_check_add(s->vm, b->addr, b->size);
  const char *why = gpumem__vm_check_end(s->vm);
  if (why == NULL) return GPUMEM_OK;
  LOG(p, GPUMEM_LOG_ERROR, "invariant violated (device %d): expandable segment at %p: %s", p->device,
      (void *)s->base, why);
  return GPUMEM_ERR_INTERNAL;
}

/* One allocation attempt under the pool lock, with all the fallbacks except the OOM callback. */
static gpumem_status alloc_locked(gpumem__pool *p, size_t rsize, int rcls, gpumem_stream stream, gpumem__block **out) {
  if (p->vm != NULL) return vm_alloc_locked(p, rsize, rcls, stream, out);
  if (block_reserve(p, 2) != 0) return GPUMEM_ERR_OUT_OF_MEMORY;
  gpumem__srec *r = srec_find(p, stream);
  if (r != NULL) stream_touch(p, r); /* this call names the stream: its unbatched frees get their event */
  gpumem__block *b = search_cache(p, r, rsize, rcls);
  if (b == NULL && (p->npending > 0 || p->nmarks > 0)) {
    poll_pending(p); /* events recorded by earlier calls on their own streams */
    b = idx_find(p->ready, rsize, rcls);
  }
  if (b == NULL && p->scount > (r != NULL ? 1u : 0u)) p->hungry++; /* other streams: harvest at their next call */
  if (b != NULL) {
    take(p, b, rsize);
    *out = b;
    return GPUMEM_OK;
  }

  if (p->nogrow) { /* the caller's thread cache flushes and asks again: its blocks may fit */
    p->grow_blocked = 1;
    return GPUMEM_ERR_BUSY;
  }
  gpumem_status st = grow(p, rsize, rcls, 0, out);
  if (st == GPUMEM_OK) {
    check_free_fraction(p);
    return GPUMEM_OK;
  }
  if (st != GPUMEM_ERR_OUT_OF_MEMORY && st != GPUMEM_ERR_LIMIT_EXCEEDED) return st;

  /* Slow path: wait for every pending free, then retry from the cache. */
  sync_all(p);
  b = search_cache(p, srec_find(p, stream), rsize, rcls);
  if (b != NULL) {
    take(p, b, rsize);
    *out = b;
    return GPUMEM_OK;
  }

  if (st == GPUMEM_ERR_LIMIT_EXCEEDED) {
    /* release free segments only if that makes room for the smallest segment that serves the request */
    uint64_t need = (uint64_t)rsize;
    if (p->st.reserved_bytes - p->empty_bytes + need <= p->limit) {
      uint64_t rel = 0;
      gpumem__segment *s = p->empty;
      while (s != NULL && p->st.reserved_bytes + std_segment_size(rsize, rcls) > p->limit) {
        gpumem__segment *n = s->enext;
        size_t sz = s->size;
        if (seg_release(p, s) == GPUMEM_OK) rel += sz;
        s = n;
      }
      /* the standard size may still not fit: grow() falls back to smaller segments */
      if (p->st.reserved_bytes + need > p->limit) {
        s = p->empty;
        while (s != NULL && p->st.reserved_bytes + need > p->limit) {
          gpumem__segment *n = s->enext;
          size_t sz = s->size;
          if (seg_release(p, s) == GPUMEM_OK) rel += sz;
          s = n;
        }
      }
      count_trim(p, rel, "limit");
      st = grow(p, rsize, rcls, 1, out);
      if (st == GPUMEM_OK) return GPUMEM_OK;
      if (st != GPUMEM_ERR_LIMIT_EXCEEDED && st != GPUMEM_ERR_OUT_OF_MEMORY) return st;
    }
    if (st == GPUMEM_ERR_LIMIT_EXCEEDED) return st;
  }

  /* Out of memory: give back every free segment, retry. */
  p->st.num_oom_retries++;
  uint64_t rel = 0;
  (void)release_empty(p, 0, &rel);
  count_trim(p, rel, "out-of-memory retry");
  st = grow(p, rsize, rcls, 1, out);
  return st;
}

gpumem_status gpumem__pool_alloc(gpumem__pool *p, size_t size, gpumem_stream stream, const char *tag, void **out,
                                 gpumem__tc_acct *acct) {
  if (size > SIZE_MAX - (GPUMEM__LARGE_ROUND - 1)) return GPUMEM_ERR_INVALID_ARGUMENT; /* rounding would overflow */
  size_t rsize = (size + GPUMEM__ALIGN - 1) & ~(GPUMEM__ALIGN - 1);
  int rcls = rsize <= GPUMEM__SMALL_MAX ? CLS_SMALL : CLS_LARGE;
  gpumem_context *ctx = p->ctx;

  for (int attempt = 0;; attempt++) {
    gpumem_status st;
    gpumem__block *b = NULL;
    gpumem__mutex_lock(&p->lock);
    if (p->limit != 0 && rsize > p->limit) {
      st = GPUMEM_ERR_LIMIT_EXCEEDED;
    } else if (p->total != 0 && rsize > p->total) {
      st = GPUMEM_ERR_OUT_OF_MEMORY; /* can never fit: no trimming, no callback */
      attempt = 1;
    } else {
      /* the caller's cache holds blocks, or another thread's cache may */
      p->nogrow = acct != NULL && (gpumem__tc_acct_cached(acct) > 0 || atomic_load_explicit(&p->tc_keyed, memory_order_relaxed) > 1);
      st = alloc_locked(p, rsize, rcls, stream, &b);
      p->nogrow = 0;
      if (p->grow_blocked) {
        p->grow_blocked = 0;
        acct->grow_blocked = 1;
        gpumem__mutex_unlock(&p->lock);
        return GPUMEM_ERR_BUSY;
      }
    }
    if (st == GPUMEM_OK) {
      if (gpumem__ptrmap_insert(&ctx->map, b->addr, b, p) != 0) {
        /* host out of memory: give the unused block back as a free on its stream */
        gpumem__srec *r = srec_get(p, stream);
        if (r != NULL) {
          b->fseq = ++r->seq;
          insert_coalesce(p, r->idx, b);
        } else {
          (void)gpumem__be_device_synchronize(ctx, p->device);
          insert_coalesce(p, p->ready, b);
        }
        gpumem__mutex_unlock(&p->lock);
        return GPUMEM_ERR_OUT_OF_MEMORY;
      }
      b->requested = size;
      b->tag = tag;
      p->st.allocated_bytes += b->size;
      if (acct != NULL) {
        acct->last = b;
        acct->last_state = atomic_load_explicit(&b->state, memory_order_relaxed);
        gpumem__pool_tc_peak(p, acct); /* the caller's cached blocks are not allocated */
      } else if (p->st.allocated_bytes > p->st.allocated_peak) {
        p->st.allocated_peak = p->st.allocated_bytes;
      }
      p->st.requested_bytes += size;
      p->st.num_allocs++;
      p->st.num_live++;
#ifdef GPUMEM_DEBUG
      if (gpumem__pool_check_locked_(p) != GPUMEM_OK) LOG(p, GPUMEM_LOG_ERROR, "invariant check failed after alloc");
#endif
      gpumem__mutex_unlock(&p->lock);
      *out = (void *)b->addr;
      return GPUMEM_OK;
    }
    if (st == GPUMEM_ERR_LIMIT_EXCEEDED) {
      p->st.num_limit_exceeded++;
      gpumem__mutex_unlock(&p->lock);
      LOG(p, GPUMEM_LOG_WARN, "device %d: allocation of %zu bytes refused: it would pass the limit of %llu bytes",
          p->device, size, (unsigned long long)p->limit);
      return st;
    }
    if (st != GPUMEM_ERR_OUT_OF_MEMORY || attempt > 0 || ctx->opt.oom_callback == NULL) {
      if (st == GPUMEM_ERR_OUT_OF_MEMORY) p->st.num_ooms++;
      uint64_t res = p->st.reserved_bytes, alloc = p->st.allocated_bytes;
      gpumem__mutex_unlock(&p->lock);
      if (st == GPUMEM_ERR_OUT_OF_MEMORY)
        LOG(p, GPUMEM_LOG_WARN, "device %d: out of memory allocating %zu bytes (allocated %llu, reserved %llu)",
            p->device, size, (unsigned long long)alloc, (unsigned long long)res);
      return st;
    }
    gpumem__mutex_unlock(&p->lock);
    /* the callback runs with no lock held: it may free and trim */
    LOG(p, GPUMEM_LOG_DEBUG, "device %d: calling the out-of-memory callback for %zu bytes", p->device, size);
    if (ctx->opt.oom_callback(ctx->opt.oom_user, p->device, size) == 0) {
      gpumem__mutex_lock(&p->lock);
      p->st.num_ooms++;
      gpumem__mutex_unlock(&p->lock);
      LOG(p, GPUMEM_LOG_WARN, "device %d: out of memory allocating %zu bytes (callback declined to retry)", p->device,
          size);
      return GPUMEM_ERR_OUT_OF_MEMORY;
    }
  }
}

/* Free a live block already out of the pointer index, under the pool lock. */
static void free_locked(gpumem__pool *p, gpumem__block *b, gpumem_stream stream, int named) {
  p->st.allocated_bytes -= b->size;
  p->st.requested_bytes -= b->requested;
  p->st.num_frees++;
  p->st.num_live--;
  b->requested = 0;
  b->tag = NULL;
  if (p->vm != NULL) {
    solo_note(p, stream);
    if (p->solo == SOLO_WARM && stream == p->solo_s && ++p->solo_frees >= SOLO_WARM_FREES) p->solo = SOLO_ONE;
    if (p->solo == SOLO_ONE && stream == p->solo_s) {
      /* one stream so far: no event (see "Single-stream expandable pools"); a small block READY at once */
      gpumem__srec *r = p->solo_r;
      b->fseq = ++r->seq;
      if (b->size <= SOLO_READY_MAX) {
        insert_coalesce(p, p->ready, b);
        p->dirty = 1;
        p->dirty_seq++;
      } else {
        insert_coalesce(p, r->idx, b);
      }
      return;
    }
    if (p->quarantine) quarantine_step(p, stream, named);
  }
  gpumem__srec *r = srec_get(p, stream);
  if (r != NULL) {
    b->fseq = ++r->seq;
    insert_coalesce(p, r->idx, b);
    if (named) stream_touch(p, r); /* the event for other streams is recorded now, on the stream of this call */
  } else {
    /* no host memory for a stream record: wait, then the block is usable by all */
    (void)gpumem__be_device_synchronize(p->ctx, p->device);
    insert_coalesce(p, p->ready, b);
  }
}

gpumem_status gpumem__pool_free(gpumem__pool *p, void *ptr, gpumem_stream stream) {
  gpumem__mutex_lock(&p->lock);
  gpumem__block *b = gpumem__ptrmap_remove(&p->ctx->map, (uintptr_t)ptr, p, 0);
  if (b == NULL) {
    gpumem__mutex_unlock(&p->lock);
    return GPUMEM_ERR_INVALID_POINTER;
  }
  guard_ctx(p, stream, 1, 0);
  free_locked(p, b, stream, 1);
  check_threshold(p);
#ifdef GPUMEM_DEBUG
  if (gpumem__pool_check_locked_(p) != GPUMEM_OK) LOG(p, GPUMEM_LOG_ERROR, "invariant check failed after free");
#endif
  gpumem__mutex_unlock(&p->lock);
  return GPUMEM_OK;
}

void gpumem__pool_free_block(gpumem__pool *p, gpumem__block *b, gpumem_stream stream) {
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, stream, 1, 0);
  free_locked(p, b, stream, 1);
  check_threshold(p);
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_put_cached(gpumem__pool *p, gpumem__tc_acct *acct, gpumem__block **blocks, size_t n,
                             gpumem_stream stream, int named, int64_t *d_req, int64_t *d_live, uint64_t *d_allocs,
                             uint64_t *d_frees) {
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, stream, named, 0);
  for (size_t i = 0; i < n; i++) {
    gpumem__block *b = blocks[i];
    acct->room += b->size;
    /* the cache already counted this free: the pool's counters get it, the cache's deltas give it back */
    *d_req += (int64_t)b->requested;
    *d_live += 1;
    *d_frees -= 1;
    free_locked(p, b, stream, named && i + 1 == n);
  }
  uint64_t cached = gpumem__tc_acct_cached(acct);
  if (acct->headroom > cached) acct->headroom = cached;
  p->st.requested_bytes = (uint64_t)((int64_t)p->st.requested_bytes + *d_req);
  p->st.num_live = (uint64_t)((int64_t)p->st.num_live + *d_live);
  p->st.num_allocs += *d_allocs;
  p->st.num_frees += *d_frees;
  *d_req = 0;
  *d_live = 0;
  *d_allocs = 0;
  *d_frees = 0;
  if (n > 0) check_threshold(p);
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_tc_peak(gpumem__pool *p, gpumem__tc_acct *acct) {
  /* the caller holds the pool lock */
  uint64_t cached = gpumem__tc_acct_cached(acct);
  uint64_t cur = p->st.allocated_bytes - cached;
  if (cur > p->st.allocated_peak) p->st.allocated_peak = cur;
  uint64_t room = p->st.allocated_peak - cur;
  acct->headroom = room < cached ? room : cached;
}

uint64_t gpumem__pool_tc_budget(const gpumem__pool *p) {
  /* a 64th of what the device may hold (its total, or the limit). (Thread caches are on only while
   * the release threshold is unlimited, context.c: none holds memory a threshold would give back.) */
  uint64_t base = p->limit != 0 && (p->total == 0 || p->limit < p->total) ? p->limit : p->total;
  uint64_t b = base != 0 ? base / 64 : GPUMEM__TC_MAX_BYTES;
  return b < GPUMEM__TC_MAX_BYTES ? b : GPUMEM__TC_MAX_BYTES;
}

int gpumem__pool_tc_keyed(gpumem__pool *p, int delta) {
  if (delta == 0) return atomic_load_explicit(&p->tc_keyed, memory_order_relaxed);
  return atomic_fetch_add_explicit(&p->tc_keyed, delta, memory_order_relaxed) + delta;
}

gpumem__mutex *gpumem__pool_mutex(gpumem__pool *p) { return &p->lock; }
gpumem_stats *gpumem__pool_stats_locked(gpumem__pool *p) { return &p->st; }

/* ---------------------------------------------------------------------- */
/* Trim, reset, stats                                                      */

gpumem_status gpumem__pool_trim(gpumem__pool *p, uint64_t keep, uint64_t *released) {
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, NULL, 0, 1);
  sync_all(p);
  uint64_t rel = 0;
  gpumem_status st = release_empty(p, keep, &rel);
  count_trim(p, rel, "trim");
  gpumem__mutex_unlock(&p->lock);
  *released += rel;
  return st;
}

/* Drop everything: live blocks are invalidated, every segment, event and
 * record is given back. A segment the backend refuses to free stays in the
 * pool as one wholly free READY block (so a later trim, reset or destroy
 * gives it back) and the first such error is returned. Stats: current
 * values go to what is left, cumulative ones stay. */
static gpumem_status pool_clear_locked(gpumem__pool *p) {
  gpumem_context *ctx = p->ctx;
  /* 1. invalidate live blocks */
  for (gpumem__segment *s = p->segs; s != NULL; s = s->next)
    for (gpumem__block *b = s->head; b != NULL; b = b->next)
      if (b->idx == NULL) (void)gpumem__ptrmap_remove(&ctx->map, b->addr, p, 1);
  /* 2. forget every free index: batches (and their events), stream records, READY */
  gpumem__batch *bt = p->pending_head;
  while (bt != NULL) {
    gpumem__batch *n = bt->next;
    if (bt->has_ev) (void)gpumem__be_event_destroy(ctx, p->device, bt->ev);
    free(bt->idx);
    free(bt);
    bt = n;
  }
  p->pending_head = p->pending_tail = NULL;
  p->npending = 0;
  while (p->batch_free != NULL) {
    bt = p->batch_free->next;
    free(p->batch_free);
    p->batch_free = bt;
  }
  if (p->has_sev) (void)gpumem__be_event_destroy(ctx, p->device, p->sev);
  p->has_sev = 0;
  p->dirty = 0; /* every block is being dropped (the caller synchronised the device, or is destroying) */
  p->quarantine = 0;
  p->solo = p->vm != NULL ? SOLO_NONE : SOLO_MANY;
  p->solo_r = NULL;
  for (size_t i = 0; i < p->nev; i++) (void)gpumem__be_event_destroy(ctx, p->device, p->evcache[i]);
  p->nev = 0;
  for (size_t i = 0; i < p->scap; i++) {
    if (p->stab[i] == NULL) continue;
    if (p->stab[i]->has_mark) (void)gpumem__be_event_destroy(ctx, p->device, p->stab[i]->mev);
    free(p->stab[i]->idx);
    free(p->stab[i]);
    p->stab[i] = NULL;
  }
  p->scount = 0;
  p->nmarks = 0;
  while (p->ffree != NULL) {
    gpumem__fidx *n = p->ffree->next_free;
    free(p->ffree);
    p->ffree = n;
  }
  fidx_clear(p->ready, IDX_READY);
  p->empty = NULL;
  p->empty_bytes = 0;
  /* 3. every block struct is unused now */
  while (p->slabs != NULL) {
    gpumem__slab *n = p->slabs->next;
    free(p->slabs);
    p->slabs = n;
  }
  p->bfree = NULL;
  /* 4. give the segments back (expandable ones first, while the stats still count their chunks) */
  gpumem_status vmst = p->vm != NULL ? vm_clear(p) : GPUMEM_OK;
  gpumem_status first = vmst;
  gpumem__segment *s = p->segs;
  p->segs = NULL;
  p->st.reserved_bytes = p->vm != NULL ? gpumem__vm_spare_bytes(p->vm) : 0; /* held chunks vm_clear could not destroy */
  p->st.num_segments = 0;
  while (s != NULL) {
    gpumem__segment *n = s->next;
    gpumem_status st = s->kind == SEG_VM ? vmst : gpumem__be_free(ctx, p->device, (void *)s->base);
    if (st == GPUMEM_OK) {
      p->st.num_backend_frees++;
      free(s);
    } else {
      if (first == GPUMEM_OK) first = st;
      if (block_reserve(p, 1) != 0) {
        free(s); /* no host memory to keep track of it: it is lost to this pool */
      } else {
        gpumem__block *b = block_new(p);
        b->addr = s->base;
        b->size = s->size;
        b->seg = s;
        s->head = b;
        s->empty = 0;
        s->prev = NULL;
        s->next = p->segs;
        if (p->segs != NULL) p->segs->prev = s;
        p->segs = s;
        p->st.reserved_bytes += s->kind == SEG_VM ? gpumem__vm_space_mapped(s->vm) : s->size;
        p->st.num_segments++;
        idx_insert(p, p->ready, b);
      }
    }
    s = n;
  }
  p->st.allocated_bytes = 0;
  p->st.requested_bytes = 0;
  p->st.num_live = 0;
  return first;
}

gpumem_status gpumem__pool_reset(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  /* if the device cannot be synchronised, nothing is invalidated */
  gpumem_status st = gpumem__be_device_synchronize(p->ctx, p->device);
  if (st != GPUMEM_OK) {
    gpumem__mutex_unlock(&p->lock);
    return st;
  }
  uint64_t live = p->st.num_live, res = p->st.reserved_bytes;
  /* Once the first segment is given back the reset has happened: a segment
   * the backend refuses to free stays cached (a later trim or destroy gives
   * it back) and the reset still succeeds; the backend error is logged and
   * kept in gpumem_last_backend_error(). */
  if (pool_clear_locked(p) != GPUMEM_OK)
    LOG(p, GPUMEM_LOG_ERROR, "device %d: reset: %llu bytes could not be given back and stay cached", p->device,
        (unsigned long long)p->st.reserved_bytes);
  res -= p->st.reserved_bytes;
  gpumem__mutex_unlock(&p->lock);
  LOG(p, GPUMEM_LOG_INFO, "device %d: reset: %llu live allocation(s) invalidated, %llu bytes given back", p->device,
      (unsigned long long)live, (unsigned long long)res);
  return GPUMEM_OK;
}

void gpumem__pool_get_stats(gpumem__pool *p, gpumem_stats *st) {
  gpumem__mutex_lock(&p->lock);
  *st = p->st;
  st->cached_bytes = p->st.reserved_bytes - p->st.allocated_bytes;
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_reset_peaks(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  p->st.allocated_peak = p->st.allocated_bytes;
  p->st.reserved_peak = p->st.reserved_bytes;
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_live(gpumem__pool *p, uint64_t *count, uint64_t *bytes, gpumem__leak *first, size_t max,
                       size_t *nfirst) {
  gpumem__mutex_lock(&p->lock);
  *count += p->st.num_live;
  *bytes += p->st.allocated_bytes;
  for (gpumem__segment *s = p->segs; s != NULL && *nfirst < max; s = s->next) {
    for (gpumem__block *b = s->head; b != NULL && *nfirst < max; b = b->next) {
      if (b->idx != NULL) continue;
      gpumem__leak *l = &first[(*nfirst)++];
      l->ptr = b->addr;
      l->size = b->size;
      l->requested = b->requested;
      l->device = p->device;
      l->tag = b->tag;
    }
  }
  gpumem__mutex_unlock(&p->lock);
}

/* ---------------------------------------------------------------------- */
/* Create / destroy                                                        */

gpumem_status gpumem__pool_create(gpumem_context *ctx, int device, gpumem__pool **out) {
  gpumem_backend_device_info info;
  memset(&info, 0, sizeof info);
  gpumem_status st = gpumem__be_device_info(ctx, device, &info);
  if (st != GPUMEM_OK) return st;
  gpumem__pool *p = calloc(1, sizeof *p);
  if (p == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  p->ctx = ctx;
  p->device = device;
  p->total = info.total_bytes;
  p->st.struct_size = (uint32_t)sizeof(gpumem_stats);
  uint64_t lim = ctx->opt.limit_bytes;
  if (ctx->opt.limit_fraction > 0.0 && p->total > 0) {
    double f = ctx->opt.limit_fraction * (double)p->total;
    uint64_t fl = f >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)f;
    if (lim == 0 || fl < lim) lim = fl;
    if (lim == 0) lim = 1; /* a tiny fraction still means "a limit" */
  }
  p->limit = lim;
  p->ready = malloc(sizeof *p->ready);
  if (p->ready == NULL || gpumem__mutex_init(&p->lock) != 0) {
    free(p->ready);
    free(p);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  fidx_clear(p->ready, IDX_READY);
  p->vm = gpumem__vm_pool_new(ctx, device, p->total, &p->st);
  p->solo = p->vm != NULL ? SOLO_NONE : SOLO_MANY;
  if (p->vm != NULL) gpumem__vm_set_guard(p->vm, vm_guard, p);

  uint64_t init = ctx->opt.initial_bytes;
  if (init > 0) {
    if (init > (uint64_t)(SIZE_MAX - GPUMEM__LARGE_ROUND)) {
      LOG(p, GPUMEM_LOG_WARN, "device %d: initial_bytes %llu is too large; not preallocating", device,
          (unsigned long long)init);
    } else {
      size_t sz = ((size_t)init + GPUMEM__LARGE_ROUND - 1) & ~(GPUMEM__LARGE_ROUND - 1);
      gpumem__segment *s = NULL;
      if (p->limit != 0 && sz > p->limit) {
        LOG(p, GPUMEM_LOG_WARN, "device %d: initial_bytes %zu passes the limit %llu; not preallocating", device, sz,
            (unsigned long long)p->limit);
      } else if (block_reserve(p, 1) != 0 || seg_create(p, sz, CLS_MIXED, &s) != GPUMEM_OK) {
        LOG(p, GPUMEM_LOG_WARN, "device %d: could not preallocate initial_bytes (%zu bytes)", device, sz);
      } else {
        idx_insert(p, p->ready, s->head);
      }
    }
  }
  LOG(p, GPUMEM_LOG_INFO, "device %d: pool created (%s, %llu bytes total, limit %llu)", device, info.name,
      (unsigned long long)p->total, (unsigned long long)p->limit);
  *out = p;
  return GPUMEM_OK;
}

void gpumem__pool_destroy(gpumem__pool *p) {
  if (p == NULL) return;
  gpumem__mutex_lock(&p->lock);
  if (p->segs != NULL) (void)gpumem__be_device_synchronize(p->ctx, p->device);
  if (pool_clear_locked(p) != GPUMEM_OK) {
    /* the backend refused some frees: try once more, then they are lost */
    gpumem__segment *s = p->segs;
    while (s != NULL) {
      gpumem__segment *n = s->next;
      if (s->kind == SEG_VM ? gpumem__vm_space_close(s->vm) == GPUMEM_OK
                            : gpumem__be_free(p->ctx, p->device, (void *)s->base) == GPUMEM_OK)
        p->st.num_backend_frees++;
      else LOG(p, GPUMEM_LOG_ERROR, "device %d: segment %p (%zu bytes) could not be given back", p->device, (void *)s->base, s->size);
      free(s);
      s = n;
    }
    p->segs = NULL;
    while (p->slabs != NULL) {
      gpumem__slab *n = p->slabs->next;
      free(p->slabs);
      p->slabs = n;
    }
  }
  gpumem__mutex_unlock(&p->lock);
  free(p->stab);
  free(p->evcache);
  free(p->ready);
  gpumem__vm_pool_free(p->vm);
  gpumem__mutex_destroy(&p->lock);
  free(p);
}

/* ---------------------------------------------------------------------- */
/* Invariant checker                                                       */

#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) {                                                        \
      LOG(p, GPUMEM_LOG_ERROR, "invariant violated (device %d): %s", p->device, #cond); \
      return GPUMEM_ERR_INTERNAL;                                         \
    }                                                                     \
  } while (0)

static gpumem_status check_fidx(gpumem__pool *p, gpumem__fidx *f, int kind, size_t *seen) {
  CHECK(f->kind == kind);
  size_t n = 0;
  uint64_t bytes = 0;
  for (int c = 0; c < CLS_COUNT; c++) {
    gpumem__tlsf *t = &f->t[c];
    for (int fl = 0; fl < TLSF_FL; fl++) {
      CHECK(((t->fl_bitmap >> fl) & 1u) == (t->sl_bitmap[fl] != 0));
      for (int sl = 0; sl < TLSF_SL; sl++) {
        CHECK(((t->sl_bitmap[fl] >> sl) & 1u) == (t->heads[fl][sl] != NULL));
        gpumem__block *prev = NULL;
        for (gpumem__block *b = t->heads[fl][sl]; b != NULL; b = b->fnext) {
          int bfl, bsl;
          tlsf_map(b->size, &bfl, &bsl);
          CHECK(bfl == fl && bsl == sl);
          CHECK(b->idx == f);
          CHECK(b->fprev == prev);
          CHECK(b->seg != NULL && b->seg->cls == c);
          prev = b;
          n++;
          bytes += b->size;
        }
      }
    }
  }
  CHECK(n == f->nblocks);
  CHECK(bytes == f->bytes);
  *seen += n;
  return GPUMEM_OK;
}

static gpumem_status pool_check_locked(gpumem__pool *p, int check_map, uint64_t *live_out) {
  uint64_t reserved = 0, allocated = 0, requested = 0, live = 0, nseg = 0, empty_bytes = 0;
  size_t free_blocks = 0;
  for (gpumem__segment *s = p->segs; s != NULL; s = s->next) {
    CHECK(s->pool == p);
    CHECK(s->next == NULL || s->next->prev == s);
    CHECK(s->head != NULL && s->head->prev == NULL && s->head->addr == s->base);
    uintptr_t at = s->base;
    for (gpumem__block *b = s->head; b != NULL; b = b->next) {
      CHECK(b->seg == s);
      CHECK(b->addr == at);
      CHECK(b->size > 0 && b->size % GPUMEM__ALIGN == 0);
      CHECK(b->next == NULL || b->next->prev == b);
      if (b->idx == NULL) {
        live++;
        allocated += b->size;
        requested += b->requested;
        CHECK(b->requested > 0 && b->requested <= b->size);
        if (check_map) CHECK(gpumem__ptrmap_contains(&p->ctx->map, b->addr, b, p));
      } else {
        free_blocks++;
        CHECK(b->next == NULL || b->next->idx != b->idx); /* coalesced */
      }
      at += b->size;
    }
    CHECK(at == s->base + s->size);
    int whole = s->kind == SEG_PLAIN && s->head->next == NULL && s->head->idx == p->ready;
    CHECK(whole == s->empty);
    if (s->empty) empty_bytes += s->size;
    reserved += s->kind == SEG_VM ? gpumem__vm_space_mapped(s->vm) : s->size;
    if (s->kind == SEG_VM && vm_check_seg(p, s) != GPUMEM_OK) return GPUMEM_ERR_INTERNAL;
    nseg++;
  }
  size_t empties = 0;
  for (gpumem__segment *s = p->empty; s != NULL; s = s->enext) {
    CHECK(s->empty);
    empties += s->size;
  }
  CHECK(empties == empty_bytes && empty_bytes == p->empty_bytes);
  size_t seen = 0;
  gpumem_status st = check_fidx(p, p->ready, IDX_READY, &seen);
  if (st != GPUMEM_OK) return st;
  size_t ns = 0;
  for (size_t i = 0; i < p->scap; i++) {
    gpumem__srec *r = p->stab[i];
    if (r == NULL) continue;
    ns++;
    CHECK(srec_find(p, r->stream) == r);
    CHECK(r->idx->srec == r);
    st = check_fidx(p, r->idx, IDX_STREAM, &seen);
    if (st != GPUMEM_OK) return st;
    for (gpumem__batch *b = r->batches; b != NULL; b = b->snext) CHECK(b->srec == r);
  }
  CHECK(ns == p->scount);
  size_t nb = 0;
  for (gpumem__batch *b = p->pending_head; b != NULL; b = b->next) {
    nb++;
    CHECK(b->idx->batch == b);
    CHECK(b->next != NULL || p->pending_tail == b);
    st = check_fidx(p, b->idx, IDX_PENDING, &seen);
    if (st != GPUMEM_OK) return st;
  }
  CHECK(nb == p->npending);
  CHECK(seen == free_blocks);
  CHECK(reserved + (p->vm != NULL ? gpumem__vm_spare_bytes(p->vm) : 0) == p->st.reserved_bytes);
  CHECK(allocated == p->st.allocated_bytes);
  /* a block reused from a thread cache changed its requested size without the pool: exact once the caches are flushed */
  CHECK(requested == p->st.requested_bytes || (p->ctx->tc_on && !check_map));
  CHECK(live == p->st.num_live);
  CHECK(nseg == p->st.num_segments);
  CHECK(p->st.allocated_peak >= p->st.allocated_bytes);
  CHECK(p->st.reserved_peak >= p->st.reserved_bytes);
  CHECK(p->limit == 0 || p->st.reserved_bytes <= p->limit);
  if (live_out != NULL) *live_out = live;
  return GPUMEM_OK;
}

#ifdef GPUMEM_DEBUG
static gpumem_status gpumem__pool_check_locked_(gpumem__pool *p) { return pool_check_locked(p, 0, NULL); }
#endif

gpumem_status gpumem__pool_check(gpumem__pool *p, uint64_t *live_count) {
  gpumem__mutex_lock(&p->lock);
  gpumem_status st = pool_check_locked(p, 1, live_count);
  gpumem__mutex_unlock(&p->lock);
  return st;
}
