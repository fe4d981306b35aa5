/* vmseg.c: expandable virtual-memory segments, the granule map (see vmseg.h).
 *
 * Per space, per granule: the chunk mapped there (an index into the pool's
 * chunk table, NIL = none) and the busy byte count. A chunk is one physical
 * allocation (one vm_create) of one or more granules, mapped with one
 * vm_map call over a run of granules and unmapped as a whole. A driver call
 * costs tens of microseconds whatever the size (one call over a range of
 * several mappings costs one call per mapping, and a mapping of part of a
 * chunk is refused): fewer chunks, not calls over ranges, save time
 * (figures: docs/internals/HOT-PATH.md). Chunks with no busy granule are "idle"
 * and sit on one doubly linked list per pool (indices, oldest first).
 * Every backend call goes through backend.c. */
#include "vmseg.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NIL GPUMEM__VM_NIL
/* the default size of a space, in multiples of the device total */
#define SPACE_TOTAL_FACTOR 2
/* a space when the backend reports no total */
#define SPACE_FALLBACK ((size_t)64 << 30)
/* The largest chunk, in bytes: a run of unmapped granules longer than this
 * gets several chunks. A chunk is unmapped only as a whole, so a block that
 * stays live inside a chunk keeps the chunk's other granules from being
 * moved or trimmed while they are idle: larger chunks mean fewer backend
 * calls and slightly higher peaks; 8 MiB keeps held/live under 1.02 on the
 * recorded traces with about a quarter of the calls of 2 MiB chunks. */
#define CHUNK_MAX_BYTES ((size_t)8 << 20)
/* Blocks of at least HUGE_BLOCK_BYTES get chunks of up to CHUNK_HUGE_BYTES. Such a block covers
 * its chunks whole but at its two ends, so larger chunks pin nothing while it lives, and when it
 * is freed they serve the next huge block with an eighth of the calls: dynamic shapes (attention
 * scores of changing lengths) move most of their chunks for a few blocks of this size, each move
 * an unmap and a map of tens of microseconds on CUDA. */
#define HUGE_BLOCK_BYTES ((size_t)512 << 20)
#define CHUNK_HUGE_BYTES ((size_t)64 << 20)
/* After the device ran short of memory (gpumem__vm_pressure), new chunks are one granule each for
 * this long: every granule that goes idle can then be given back at once, which a chunk that
 * still holds a live block elsewhere does not allow. Renewed by every new sign of pressure; once
 * it has passed, chunks grow to CHUNK_MAX_BYTES again. The cost is driver calls (one create and
 * one map per granule) while it lasts. 10 s is not tuned: it spans the bursts of processes that
 * share a device, and a single process that saw one moment of pressure soon maps 8 MiB chunks
 * again (the burst figures: docs/SHARED-GPUS.md). */
#define FINE_NS ((uint64_t)10 * 1000000000u)
/* idle chunks looked at for one of exactly the size a run needs (moved there whole) */
#define FIT_SCAN 16
/* Moves of idle chunks after which the allowance above the live peak grows (see fill). A workload
 * whose steady state keeps moving chunks (each move is an unmap, a map and a set-access: on an H200
 * about 60 us of host time idle and 120-330 us while kernels run; none waits for queued work) buys its way
 * out with memory; a workload that moves little stays at the peak. Fewer moves per raise buy
 * more memory sooner, more moves per raise leave more moves (figures: docs/internals/HOT-PATH.md). */
#ifndef MOVES_PER_RAISE /* (a build-time override, for A/B runs) */
#define MOVES_PER_RAISE 16
#endif
/* ... once the pool has seen several streams. There a stream's frees wait for its events, so memory
 * in flight already lifts the peak above the live one: the allowance rises at a third of the rate.
 * Replays (cold; two_models, loader, comm) 1.062 / 1.030 / 1.047 at 16 moves, 1.025 / 1.024 / 1.022 at
 * 48, two_models after 12 passes 1.096 at 32, 1.071 at 48. Live on two H200s, six runs a side of
 * two_models: 1.031-1.065 at 32, 1.025-1.065 at 48, at the same step times (the peak takes two values,
 * about 2650 and 2750 MiB, with either); comm within the spread of memory in flight (1.019-1.073 both).
 * 48 is kept for the replays. Single-stream ResNet-50 training paid 2.5 % a step for 32 (1.071 ->
 * 1.056), so one stream keeps MOVES_PER_RAISE. */
#ifndef MOVES_PER_RAISE_STREAMS
#define MOVES_PER_RAISE_STREAMS 48
#endif
/* ... and only when those moves came often: within RAISE_ALLOCS_PER_MOVE allocations of the pool per
 * move. A workload that settles into rare moves (dynamic shapes, a generation loop, two streams whose
 * allocations interleave differently every step) would otherwise keep raising the allowance for ever:
 * replayed 48 times, BERT with dynamic shapes crept from 1.042 to 1.109, GPT-2 generation from 1.003 to
 * 1.065, and paid no fewer moves for it. Moves slower than this rate cost little (a move is 60-330 us;
 * one per 64 allocations is 2-5 % of the step of the recorded trainings, and their steady states move
 * less): the memory is not worth it. 32 keeps more moves (multi-stream replays 250-400 a pass), 128 lets
 * most of the creep back (figures: docs/internals/HOT-PATH.md). */
#ifndef RAISE_ALLOCS_PER_MOVE
#define RAISE_ALLOCS_PER_MOVE 64
#endif
/* ... and, once the pool has seen several streams, never past 1/ALLOWANCE_STREAMS_DIV of the live peak.
 * There, moves keep coming whatever the allowance (two models trained on two streams replayed with the
 * device 64 events behind: 48 moves in every 1,000-2,000 allocations while it rose to 416 MiB, 15 % of
 * the live peak, and held 1.161 after 4 passes), and they cost little: a move is about 60 us of host
 * time and nothing on the device (tools/vm_gpu_cost.cu: kernels run as fast while the host moves 13-21
 * chunks a millisecond). Live on an H200 (run 60 of bench/results/2026-12-h200-runs.md, ten pairs of
 * processes, 100 steps of two_models): 1.030-1.032 of the live peak against 1.030-1.056 (median 1.043),
 * at 79.9 against 79.0 ms a step (medians; the processes of one allocator spread by 23 ms). One stream
 * keeps no such bound: ResNet-50 training replayed with it moves 30 times as many chunks a pass. */
#ifndef ALLOWANCE_STREAMS_DIV
#define ALLOWANCE_STREAMS_DIV 32
#endif

typedef struct vmchunk {
  gpumem_phys_handle h;
  gpumem__vmspace *vs;   /* mapped in; NULL = free table slot */
  uint32_t start, len;   /* granules [start, start + len) of vs */
  uint32_t nbusy;        /* granules of it with busy bytes */
  uint32_t prev, next;   /* idle list links (next: free-slot list when free) */
  uint32_t mate;         /* lent or alias: the other mapping of the same handle */
  uint8_t idle;          /* on the idle list */
  uint8_t lent;          /* its handle is also mapped by an alias (gpumem__vm_lend): never given back */
  uint8_t alias;         /* a second mapping of a lent chunk's handle: only ever unmapped, never destroyed */
} vmchunk;

typedef struct spare_chunk {
  gpumem_phys_handle h;
  uint32_t len;
} spare_chunk;

/* struct gpumem__vmspace is in vmseg.h (the per-allocation helpers there inline into pool.c) */

struct gpumem__vmpool {
  gpumem_context *ctx;
  int dev;
  size_t gran;
  uint32_t chunk_max;      /* granules */
  uint32_t chunk_huge;     /* granules, for blocks of HUGE_BLOCK_BYTES and more */
  uint64_t total;
  gpumem_stats *st;
  gpumem__vmspace *spaces;
  vmchunk *ch;             /* chunk table */
  uint32_t nch, capch, freech;
  uint32_t ihead, itail;   /* idle chunks, oldest first */
  size_t nidle;            /* granules in idle chunks */
  spare_chunk *spare;      /* unmapped but held (a failed map or destroy) */
  size_t nspare, capspare; /* capspare >= nheld once a chunk was made: a failed destroy needs no host memory */
  size_t nheld;            /* physical chunks held (made, not yet destroyed) */
  size_t spare_gran;
  uint64_t allowance;       /* bytes above the live peak that new memory may take (see fill) */
  uint32_t moves;          /* idle-chunk moves counted towards the next raise of the allowance */
  uint64_t moves_from;     /* st->num_allocs when that count started */
  int several;             /* the pool has seen several streams (gpumem__vm_several_streams): the allowance
                            * rises every MOVES_PER_RAISE_STREAMS moves, up to 1/ALLOWANCE_STREAMS_DIV */
  uint64_t fine_until;     /* CLOCK_MONOTONIC ns until which new chunks are one granule (0: not) */
  uint32_t nalias;         /* alias mappings (gpumem__vm_lend) not yet unmapped */
  gpumem_status (*guard)(void *arg); /* before an unmap (gpumem__vm_set_guard) */
  void *guard_arg;
};

#define LOG(vp, lvl, ...) gpumem__log(&(vp)->ctx->opt.log, (lvl), __VA_ARGS__)

static void space_free(gpumem__vmspace *vs);

/* ---------------------------------------------------------------------- */
/* Pool                                                                    */

gpumem__vmpool *gpumem__vm_pool_new(gpumem_context *ctx, int device, uint64_t total, gpumem_stats *st) {
  if (!ctx->opt.expandable || !gpumem__be_has_vm(ctx)) return NULL;
  size_t g = 0;
  if (gpumem__be_vm_granularity(ctx, device, &g) != GPUMEM_OK) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "device %d: no virtual memory: plain segments", device);
    return NULL;
  }
  /* a power of two that keeps blocks 256-aligned and fits the busy counters */
  if (g < 256 || (g & (g - 1)) != 0 || g > ((size_t)1 << 31)) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "device %d: vm granularity %zu unusable: plain segments", device, g);
    return NULL;
  }
  gpumem__vmpool *vp = gpumem__calloc(1, sizeof *vp);
  if (vp == NULL) return NULL;
  vp->ctx = ctx;
  vp->dev = device;
  vp->gran = g;
  vp->chunk_max = CHUNK_MAX_BYTES > g ? (uint32_t)(CHUNK_MAX_BYTES / g) : 1;
  vp->chunk_huge = CHUNK_HUGE_BYTES > g ? (uint32_t)(CHUNK_HUGE_BYTES / g) : 1;
  vp->total = total;
  vp->st = st;
  vp->freech = vp->ihead = vp->itail = NIL;
  return vp;
}

void gpumem__vm_pool_free(gpumem__vmpool *vp) {
  if (vp == NULL) return;
  /* last tries for what the pool could not give back (logged by backend.c if they fail) */
  for (size_t i = 0; i < vp->nspare; i++) (void)gpumem__be_vm_destroy(vp->ctx, vp->dev, vp->spare[i].h);
  while (vp->spaces != NULL) {
    gpumem__vmspace *vs = vp->spaces;
    vp->spaces = vs->next;
    space_free(vs);
  }
  free(vp->spare);
  free(vp->ch);
  free(vp);
}

void gpumem__vm_set_guard(gpumem__vmpool *vp, gpumem_status (*guard)(void *arg), void *arg) {
  vp->guard = guard;
  vp->guard_arg = arg;
}

size_t gpumem__vm_granularity(const gpumem__vmpool *vp) { return vp->gran; }

size_t gpumem__vm_available(const gpumem__vmpool *vp) { return vp->nidle + vp->spare_gran; }

uint64_t gpumem__vm_spare_bytes(const gpumem__vmpool *vp) { return (uint64_t)vp->spare_gran * vp->gran; }

void gpumem__vm_describe(const gpumem__vmpool *vp, uint64_t *partial, uint64_t *pinned, uint64_t *idle,
                         uint64_t *allowance) {
  uint64_t part = 0, pin = 0;
  for (const gpumem__vmspace *vs = vp->spaces; vs != NULL; vs = vs->next)
    for (uint32_t g = 0; g < vs->hi; g++) {
      uint32_t c = vs->cid[g];
      if (c == NIL) continue;
      if (vs->busy[g] != 0) part += vp->gran - vs->busy[g];
      else if (vp->ch[c].nbusy > 0) pin += vp->gran;
    }
  *partial = part;
  *pinned = pin;
  *idle = (uint64_t)vp->nidle * vp->gran;
  *allowance = vp->allowance;
}

void gpumem__vm_pressure(gpumem__vmpool *vp) { vp->fine_until = gpumem__mono_ns() + FINE_NS; }

/* The largest new chunk now, in granules: one while pressure lasts (FINE_NS). Read only where a
 * chunk is about to be created (a backend call follows). */
static uint32_t chunk_limit(gpumem__vmpool *vp) {
  if (vp->fine_until == 0) return vp->chunk_max;
  if (gpumem__mono_ns() < vp->fine_until) return 1;
  vp->fine_until = 0;
  return vp->chunk_max;
}

static void held_add(gpumem__vmpool *vp, uint32_t len) {
  vp->st->reserved_bytes += (uint64_t)len * vp->gran;
  gpumem__dev_reserved_change(vp->ctx, vp->dev, (int64_t)((uint64_t)len * vp->gran));
  if (vp->st->reserved_bytes > vp->st->reserved_peak) vp->st->reserved_peak = vp->st->reserved_bytes;
  vp->st->num_backend_allocs++;
  vp->nheld++;
}

static void held_sub(gpumem__vmpool *vp, uint32_t len) {
  vp->st->reserved_bytes -= (uint64_t)len * vp->gran;
  gpumem__dev_reserved_change(vp->ctx, vp->dev, -(int64_t)((uint64_t)len * vp->gran));
  vp->st->num_backend_frees++;
  vp->nheld--;
}

/* Room in the spare list for `want` chunks. 0, or -1 when there is no host memory. */
static int spare_reserve(gpumem__vmpool *vp, size_t want) {
  if (want <= vp->capspare) return 0;
  size_t ncap = vp->capspare ? vp->capspare * 2 : 8;
  if (ncap < want) ncap = want;
  spare_chunk *n = gpumem__realloc(vp->spare, ncap * sizeof *n);
  if (n == NULL) return -1;
  vp->spare = n;
  vp->capspare = ncap;
  return 0;
}

/* Keep an unmapped chunk for later (a map or destroy failed). 0, or -1 when
 * there is no host memory to remember it (then it is lost to this pool; not
 * reached: map_new reserves room for every chunk held before making one). */
static int spare_push(gpumem__vmpool *vp, gpumem_phys_handle h, uint32_t len) {
  if (vp->nspare == vp->capspare && spare_reserve(vp, vp->nspare + 1) != 0) return -1;
  vp->spare[vp->nspare].h = h;
  vp->spare[vp->nspare].len = len;
  vp->nspare++;
  vp->spare_gran += len;
  return 0;
}

static void spare_remove(gpumem__vmpool *vp, size_t i) {
  vp->spare_gran -= vp->spare[i].len;
  vp->spare[i] = vp->spare[--vp->nspare];
}

/* A chunk no longer mapped and no longer wanted: destroy it, or keep it as
 * spare (still held) when the destroy fails. Returns the destroy's status. */
static gpumem_status drop_handle(gpumem__vmpool *vp, gpumem_phys_handle h, uint32_t len) {
  gpumem_status st = gpumem__be_vm_destroy(vp->ctx, vp->dev, h);
  if (st == GPUMEM_OK) held_sub(vp, len);
  else if (spare_push(vp, h, len) != 0) held_sub(vp, len); /* cannot even remember it: no longer ours */
  return st;
}

/* ---------------------------------------------------------------------- */
/* Chunk table and idle list                                               */

static uint32_t chunk_alloc(gpumem__vmpool *vp) {
  if (vp->freech != NIL) {
    uint32_t i = vp->freech;
    vp->freech = vp->ch[i].next;
    return i;
  }
  if (vp->nch == vp->capch) {
    if (vp->capch >= NIL / 2) return NIL;
    uint32_t ncap = vp->capch ? vp->capch * 2 : 64;
    vmchunk *n = gpumem__realloc(vp->ch, (size_t)ncap * sizeof *n);
    if (n == NULL) return NIL;
    vp->ch = n;
    vp->capch = ncap;
  }
  return vp->nch++;
}

static void chunk_release_slot(gpumem__vmpool *vp, uint32_t i) {
  memset(&vp->ch[i], 0, sizeof vp->ch[i]);
  vp->ch[i].next = vp->freech;
  vp->freech = i;
}

static void idle_push(gpumem__vmpool *vp, uint32_t i) {
  vmchunk *c = &vp->ch[i];
  c->prev = vp->itail;
  c->next = NIL;
  if (vp->itail != NIL) vp->ch[vp->itail].next = i;
  else vp->ihead = i;
  vp->itail = i;
  c->idle = 1;
  vp->nidle += c->len;
}

static void idle_remove(gpumem__vmpool *vp, uint32_t i) {
  vmchunk *c = &vp->ch[i];
  uint32_t a = c->prev, b = c->next;
  if (a != NIL) vp->ch[a].next = b;
  else vp->ihead = b;
  if (b != NIL) vp->ch[b].prev = a;
  else vp->itail = a;
  c->prev = c->next = NIL;
  c->idle = 0;
  vp->nidle -= c->len;
}

static void *gaddr(const gpumem__vmspace *vs, uint32_t g) { return (void *)(vs->base + (uintptr_t)g * vs->vp->gran); }

/* Record chunk i (handle h, len granules) as mapped at granule g of vs. */
static void chunk_place(gpumem__vmspace *vs, uint32_t i, gpumem_phys_handle h, uint32_t g, uint32_t len) {
  gpumem__vmpool *vp = vs->vp;
  vmchunk *c = &vp->ch[i];
  c->h = h;
  c->vs = vs;
  c->start = g;
  c->len = len;
  c->nbusy = 0;
  c->prev = c->next = NIL;
  c->idle = 0;
  c->lent = c->alias = 0;
  c->mate = NIL;
  for (uint32_t k = g; k < g + len; k++) {
    vs->cid[k] = i;
    vs->unmb[k >> 6] &= ~((uint64_t)1 << (k & 63));
    c->nbusy += vs->busy[k] != 0;
  }
  vs->nmapped += len;
  vs->nchunks++;
  if (g + len > vs->hi) vs->hi = g + len;
  if (c->nbusy == 0) idle_push(vp, i); /* (callers mark busy first; kept exact regardless) */
}

/* Unmap chunk i (idle) and forget it; *h and *len say what it was. On an
 * unmap error it stays mapped, last in the idle list. */
static gpumem_status chunk_unmap(gpumem__vmpool *vp, uint32_t i, gpumem_phys_handle *h, uint32_t *len) {
  vmchunk *c = &vp->ch[i];
  gpumem__vmspace *vs = c->vs;
  gpumem_status st = vp->guard != NULL ? vp->guard(vp->guard_arg) : GPUMEM_OK;
  if (st != GPUMEM_OK) return st; /* its memory may still be in use: not now (the chunk stays where it is) */
  st = gpumem__be_vm_unmap(vp->ctx, vp->dev, gaddr(vs, c->start), (size_t)c->len * vp->gran);
  if (st != GPUMEM_OK) {
    if (c->idle) { /* try it last next time */
      idle_remove(vp, i);
      idle_push(vp, i);
    }
    return st;
  }
  if (c->idle) idle_remove(vp, i);
  for (uint32_t k = c->start; k < c->start + c->len; k++) {
    vs->cid[k] = NIL;
    vs->unmb[k >> 6] |= (uint64_t)1 << (k & 63);
  }
  vs->nmapped -= c->len;
  vs->nchunks--;
  *h = c->h;
  *len = c->len;
  chunk_release_slot(vp, i);
  return GPUMEM_OK;
}

/* Unmap and destroy idle chunk i. On an unmap error it stays; on a destroy
 * error it becomes spare (still held). */
static gpumem_status give_back(gpumem__vmpool *vp, uint32_t i) {
  gpumem_phys_handle h = 0;
  uint32_t len = 0;
  if (vp->ch[i].lent) { /* an alias still maps its memory: not before that is unmapped; try it last next time */
    if (vp->ch[i].idle) {
      idle_remove(vp, i);
      idle_push(vp, i);
    }
    return GPUMEM_ERR_BUSY;
  }
  const int alias = vp->ch[i].alias;
  const uint32_t mate = vp->ch[i].mate;
  gpumem__vmspace *vs = vp->ch[i].vs;
  gpumem_status st = chunk_unmap(vp, i, &h, &len);
  if (st != GPUMEM_OK) return st;
  if (alias) {
    vs->naliased -= len; /* the memory is the mate's: nothing to destroy; the mate may be idle now */
    vp->ch[mate].lent = 0;
    vp->nalias--;
    if (vp->ch[mate].nbusy == 0 && !vp->ch[mate].idle) idle_push(vp, mate);
    return GPUMEM_OK;
  }
  return drop_handle(vp, h, len);
}

/* Map handle h (len granules, held) at granule g of vs. On failure the handle
 * is destroyed (or kept as spare) and the status returned. */
static gpumem_status map_handle(gpumem__vmspace *vs, uint32_t g, gpumem_phys_handle h, uint32_t len) {
  gpumem__vmpool *vp = vs->vp;
  uint32_t i = chunk_alloc(vp);
  gpumem_status st = i == NIL ? GPUMEM_ERR_OUT_OF_MEMORY
                              : gpumem__be_vm_map(vp->ctx, vp->dev, gaddr(vs, g), (size_t)len * vp->gran, h);
  if (st != GPUMEM_OK) {
    if (i != NIL) chunk_release_slot(vp, i);
    (void)drop_handle(vp, h, len);
    return st;
  }
  chunk_place(vs, i, h, g, len);
  return GPUMEM_OK;
}

/* Create a chunk of len granules and map it at granule g of vs. */
static gpumem_status map_new(gpumem__vmspace *vs, uint32_t g, uint32_t len) {
  gpumem__vmpool *vp = vs->vp;
  gpumem_phys_handle h = 0;
  /* the spare list can take every chunk held, this one too, before it is made: a chunk whose map or
   * destroy fails later is remembered without host memory (none may be left then) */
  if (spare_reserve(vp, vp->nheld + 1) != 0) return GPUMEM_ERR_OUT_OF_MEMORY;
  gpumem_status st = gpumem__be_vm_create(vp->ctx, vp->dev, (size_t)len * vp->gran, &h);
  if (st != GPUMEM_OK) return st;
  held_add(vp, len);
  return map_handle(vs, g, h, len);
}

/* Give back idle chunk i but for `keep` of its granules: the chunk is
 * unmapped and destroyed, and a new one of `keep` granules is mapped at its
 * start (the chunk was wholly idle: nothing can touch it). Returns the
 * status of giving back; if the new chunk cannot be had, more than asked was
 * given back, which is no error. */
static gpumem_status shrink(gpumem__vmpool *vp, uint32_t i, uint32_t keep) {
  gpumem__vmspace *vs = vp->ch[i].vs;
  uint32_t start = vp->ch[i].start;
  const int alias = vp->ch[i].alias;
  gpumem_status st = give_back(vp, i);
  if (st != GPUMEM_OK || keep == 0 || alias) return st;
  uint32_t step = chunk_limit(vp) == 1 ? 1 : keep; /* under pressure: granules that can go back one by one */
  for (uint32_t g = 0; g < keep; g += step)
    if (map_new(vs, start + g, step) != GPUMEM_OK) {
      LOG(vp, GPUMEM_LOG_DEBUG, "device %d: trim gave back %u granules more than asked", vp->dev, keep - g);
      break;
    }
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Spaces                                                                  */

/* Every bit of a space's bit map set for granules 0..n-1, none past them. */
static void bits_all(const gpumem__vmspace *vs, uint64_t *bits) {
  size_t words = ((size_t)vs->n + 63) / 64;
  memset(bits, 0xff, words * sizeof *bits);
  if (vs->n & 63) bits[words - 1] = ~(uint64_t)0 >> (64 - (vs->n & 63));
}

static void space_free(gpumem__vmspace *vs) {
  free(vs->cid);
  free(vs->busy);
  free(vs->idleb);
  free(vs->unmb);
  free(vs->chk);
  free(vs);
}

gpumem_status gpumem__vm_space_open(gpumem__vmpool *vp, size_t min_size, gpumem__vmspace **out, uintptr_t *base,
                                    size_t *size) {
  size_t g = vp->gran;
  size_t want = SPACE_FALLBACK;
  if (vp->total > 0 && vp->total <= (uint64_t)(SIZE_MAX / 4)) want = (size_t)vp->total * SPACE_TOTAL_FACTOR;
  if (want < min_size) want = min_size;
  if (want > SIZE_MAX - g) return GPUMEM_ERR_OUT_OF_MEMORY;
  want = (want + g - 1) & ~(g - 1);
  if (want / g >= (size_t)NIL) want = ((size_t)NIL - 1) * g;
  if (want < min_size) return GPUMEM_ERR_OUT_OF_MEMORY;
  gpumem__vmspace *vs = gpumem__calloc(1, sizeof *vs);
  if (vs == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  /* the backend may refuse a large range: halve down to what the request needs */
  void *va = NULL;
  gpumem_status st;
  for (;;) {
    st = gpumem__be_vm_reserve(vp->ctx, vp->dev, want, &va);
    if (st == GPUMEM_OK) break;
    size_t half = (want / 2 + g - 1) & ~(g - 1);
    if (st != GPUMEM_ERR_OUT_OF_MEMORY || half < min_size || half < g || half == want) {
      free(vs);
      return st;
    }
    want = half;
  }
  if (va == NULL) {
    free(vs);
    return GPUMEM_ERR_BACKEND;
  }
  void *raw = va;
  size_t raw_size = want;
  if (((uintptr_t)va & (g - 1)) != 0) {
    /* not aligned to the granularity: reserve one granule more and align inside it */
    (void)gpumem__be_vm_release(vp->ctx, vp->dev, va, want);
    raw_size = want + g;
    st = gpumem__be_vm_reserve(vp->ctx, vp->dev, raw_size, &raw);
    if (st != GPUMEM_OK || raw == NULL) {
      free(vs);
      return st != GPUMEM_OK ? st : GPUMEM_ERR_BACKEND;
    }
    va = (void *)(((uintptr_t)raw + g - 1) & ~(uintptr_t)(g - 1));
  }
  size_t n = want / g;
  vs->cid = gpumem__malloc(n * sizeof *vs->cid);
  vs->busy = gpumem__calloc(n, sizeof *vs->busy);
  vs->idleb = gpumem__malloc(((n + 63) / 64) * sizeof *vs->idleb);
  vs->unmb = gpumem__malloc(((n + 63) / 64) * sizeof *vs->unmb);
  if (vs->cid == NULL || vs->busy == NULL || vs->idleb == NULL || vs->unmb == NULL) {
    (void)gpumem__be_vm_release(vp->ctx, vp->dev, raw, raw_size);
    space_free(vs);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  memset(vs->cid, 0xff, n * sizeof *vs->cid); /* NIL */
  vs->n = (uint32_t)n;
  bits_all(vs, vs->idleb);
  bits_all(vs, vs->unmb);
  vs->vp = vp;
  vs->base = (uintptr_t)va;
  vs->gshift = (unsigned)__builtin_ctzll((unsigned long long)g);
  vs->size = want;
  vs->raw = raw;
  vs->raw_size = raw_size;
  vs->next = vp->spaces;
  if (vp->spaces != NULL) vp->spaces->prev = vs;
  vp->spaces = vs;
  LOG(vp, GPUMEM_LOG_DEBUG, "device %d: reserved %zu bytes of address space at %p", vp->dev, want, va);
  *out = vs;
  *base = vs->base;
  *size = want;
  return GPUMEM_OK;
}

uint64_t gpumem__vm_space_mapped(const gpumem__vmspace *vs) {
  return (uint64_t)(vs->nmapped - vs->naliased) * vs->vp->gran;
}

void gpumem__vm_space_clear_busy(gpumem__vmspace *vs) {
  gpumem__vmpool *vp = vs->vp;
  memset(vs->busy, 0, (size_t)vs->n * sizeof *vs->busy);
  bits_all(vs, vs->idleb);
  for (uint32_t i = 0; i < vp->nch; i++) {
    vmchunk *c = &vp->ch[i];
    if (c->vs != vs) continue;
    c->nbusy = 0;
    if (!c->idle && !c->lent) idle_push(vp, i); /* a lent chunk is never idle: its alias may still map it */
  }
}

int gpumem__vm_next_alias(const gpumem__vmspace *vs, uintptr_t from, uintptr_t *addr, size_t *size) {
  const gpumem__vmpool *vp = vs->vp;
  if (vp->nalias == 0 || from >= vs->base + (uintptr_t)vs->n * vp->gran) return 0;
  const uint32_t g0 = from <= vs->base ? 0 : (uint32_t)((from - vs->base + vp->gran - 1) / vp->gran);
  uint32_t best = NIL;
  for (uint32_t i = 0; i < vp->nch; i++) {
    const vmchunk *c = &vp->ch[i];
    if (c->vs == vs && c->alias && c->start >= g0 && (best == NIL || c->start < vp->ch[best].start)) best = i;
  }
  if (best == NIL) return 0;
  *addr = (uintptr_t)gaddr(vs, vp->ch[best].start);
  *size = (size_t)vp->ch[best].len * vp->gran;
  return 1;
}

gpumem_status gpumem__vm_space_close(gpumem__vmspace *vs) {
  gpumem__vmpool *vp = vs->vp;
  gpumem_status first = GPUMEM_OK;
  /* aliases first (any space's: their mates may be here), then the chunks they kept from being given back */
  for (uint32_t i = 0; i < vp->nch && vp->nalias > 0; i++)
    if (vp->ch[i].vs != NULL && vp->ch[i].alias && vp->ch[i].idle) (void)give_back(vp, i);
  for (uint32_t i = 0; i < vp->nch && vs->nchunks > 0; i++) {
    if (vp->ch[i].vs != vs || !vp->ch[i].idle) continue;
    gpumem_status st = give_back(vp, i);
    if (st != GPUMEM_OK && first == GPUMEM_OK) first = st;
  }
  if (vs->nmapped != 0) return first != GPUMEM_OK ? first : GPUMEM_ERR_INTERNAL;
  /* (a chunk whose destroy failed is spare now: gpumem__vm_trim retries it) */
  gpumem_status st = gpumem__be_vm_release(vp->ctx, vp->dev, vs->raw, vs->raw_size);
  if (st != GPUMEM_OK) return st;
  if (vs->prev != NULL) vs->prev->next = vs->next;
  else vp->spaces = vs->next;
  if (vs->next != NULL) vs->next->prev = vs->prev;
  LOG(vp, GPUMEM_LOG_DEBUG, "device %d: released %zu bytes of address space at %p", vp->dev, vs->size,
      (void *)vs->base);
  space_free(vs);
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Busy bytes and mapping                                                  */

int gpumem__vm_best_window(const gpumem__vmspace *vs, uintptr_t lo, uintptr_t last, size_t size, size_t cap,
                           size_t *budget, uintptr_t *addr, size_t *cost) {
  if (size == 0 || last < lo || *budget == 0) return 0;
  const unsigned sh = vs->gshift;
  const uintptr_t gs = (uintptr_t)1 << sh;
  uintptr_t off = (lo - vs->base + gs - 1) & ~(gs - 1), end = last - vs->base;
  if (off > end) return 0;
  uint32_t g = (uint32_t)(off >> sh), gend = (uint32_t)(end >> sh);
  uint32_t w = (uint32_t)((size + gs - 1) >> sh); /* granules of a window that starts on a granule */
  /* No window costs less than w - 1: its granules lie in [lo, last + size), one READY block, where
   * only the last one can hold a neighbour's busy bytes. A cap at or below that cannot be beaten, and
   * once a window costs that much the scan stops: none after it can cost less. */
  if (cap <= (size_t)w - 1) return 0;
  if (gend >= vs->hi) gend = vs->hi > g ? vs->hi - 1 : g; /* (a start at or above hi: nothing mapped) */
  size_t c = gpumem__vm_place_cost(vs, vs->base + ((uintptr_t)g << sh), (size_t)w << sh, SIZE_MAX);
  *budget = *budget > w ? *budget - w : 0;
  size_t best = cap;
  uint32_t bg = 0;
  for (;;) {
    if (c < best) {
      best = c;
      bg = g;
      if (best <= (size_t)w - 1) break;
    }
    if (g == gend || *budget == 0) break;
    /* Here best <= c. A step lowers c only where the granule coming in costs less than the one going
     * out; the steps before the first such one (up to 64 at a time, from the bit maps) cannot give a
     * new best, and are taken at once, counted in the budget as one by one. */
    if (gend - g >= 64 && *budget >= 64) { /* (then every bit read is of a granule the steps would read) */
      uint64_t oi = gpumem__vm_bits(vs->idleb, g, 64), ou = gpumem__vm_bits(vs->unmb, g, 64);
      uint64_t ii = gpumem__vm_bits(vs->idleb, g + w, 64), iu = gpumem__vm_bits(vs->unmb, g + w, 64);
      /* (cost = idle + unmapped, and an unmapped granule is idle: in < out exactly where this is set) */
      uint64_t lower = (~ii & oi) | (~iu & ou);
      uint32_t n = lower != 0 ? (uint32_t)__builtin_ctzll(lower) : 64;
      if (n > 0) {
        uint64_t m = n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
        c = c + gpumem__vm_popcount(ii & m) + gpumem__vm_popcount(iu & m) - gpumem__vm_popcount(oi & m) -
            gpumem__vm_popcount(ou & m);
        g += n;
        *budget -= n;
        continue;
      }
    }
    --*budget;
    /* (g + w <= the last granule of [lo, last + size)) */
    c = c - gpumem__vm_gran_cost(vs, g) + gpumem__vm_gran_cost(vs, g + w);
    g++;
  }
  if (best >= cap) return 0;
  *addr = vs->base + ((uintptr_t)bg << sh);
  *cost = best;
  return 1;
}

/* The run of granules of one chunk whose state changed (busy_runs): counted once per run. */
typedef struct busy_run {
  uint32_t c, n; /* chunk, granules */
} busy_run;

static inline void busy_run_add(gpumem__vmspace *vs, busy_run *r, uint32_t c, int delta) {
  if (c == GPUMEM__VM_NIL) return;
  if (c == r->c) {
    r->n++;
    return;
  }
  if (r->n != 0) gpumem__vm_chunk_busy(vs, r->c, r->n, delta);
  r->c = c;
  r->n = 1;
}

/* One granule, `bytes` of it. */
static inline void busy_one(gpumem__vmspace *vs, busy_run *r, uint32_t g, uint32_t bytes, int delta) {
  uint32_t was = vs->busy[g];
  vs->busy[g] = delta > 0 ? was + bytes : was - bytes;
  if ((delta > 0 ? was : vs->busy[g]) != 0) return; /* no change of state */
  vs->idleb[g >> 6] ^= (uint64_t)1 << (g & 63);      /* (the bit said busy[g] == 0) */
  busy_run_add(vs, r, vs->cid[g], delta);
}

/* The granules wholly inside the range, [g, e), a word of the idle map at a time: every one gains or
 * loses a whole granule; those that change state are found from the map (gaining) or from the counts
 * (losing), and only they are looked at one by one. */
static void busy_whole(gpumem__vmspace *vs, busy_run *r, uint32_t g, uint32_t e, int delta) {
  uint32_t *busy = vs->busy;
  const uint32_t gb = (uint32_t)1 << vs->gshift;
  while (g < e) {
    const uint32_t w = g >> 6, s = g & 63, n = e - g < 64 - s ? e - g : 64 - s; /* [g, g + n): one word */
    const uint64_t m = (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << s;
    uint64_t ch;
    if (delta > 0) {
      ch = vs->idleb[w] & m;
      vs->idleb[w] &= ~m;
      for (uint32_t j = 0; j < n; j++) busy[g + j] += gb;
    } else {
      uint64_t z = 0;
      for (uint32_t j = 0; j < n; j++) {
        busy[g + j] -= gb;
        z |= (uint64_t)(busy[g + j] == 0) << j;
      }
      ch = z << s;
      vs->idleb[w] |= ch;
    }
    for (; ch != 0; ch &= ch - 1) busy_run_add(vs, r, vs->cid[(w << 6) + (uint32_t)__builtin_ctzll(ch)], delta);
    g += n;
  }
}

void gpumem__vm_busy_runs(gpumem__vmspace *vs, uintptr_t off, uintptr_t end, int delta) {
  const unsigned sh = vs->gshift;
  const uintptr_t gs = (uintptr_t)1 << sh;
  uint32_t g = (uint32_t)(off >> sh), last = (uint32_t)((end - 1) >> sh);
  busy_run r = {GPUMEM__VM_NIL, 0};
  /* granules in order: the first (part of it, maybe), those wholly inside, the last (part of it) */
  if ((off & (gs - 1)) != 0) {
    uintptr_t hi = ((uintptr_t)g + 1) << sh;
    busy_one(vs, &r, g, (uint32_t)((hi < end ? hi : end) - off), delta);
    g++;
  }
  uint32_t e = (uint32_t)(end >> sh); /* the first granule not wholly inside */
  if (e > g) busy_whole(vs, &r, g, e, delta);
  if (e >= g && e <= last) busy_one(vs, &r, e, (uint32_t)(end - ((uintptr_t)e << sh)), delta);
  if (r.n != 0) gpumem__vm_chunk_busy(vs, r.c, r.n, delta);
}

void gpumem__vm_chunk_busy(gpumem__vmspace *vs, uint32_t i, uint32_t n, int delta) {
  gpumem__vmpool *vp = vs->vp;
  if (delta > 0) {
    if (vp->ch[i].idle) idle_remove(vp, i);
    vp->ch[i].nbusy += n;
  } else {
    vp->ch[i].nbusy -= n;
    if (vp->ch[i].nbusy == 0 && !vp->ch[i].lent) idle_push(vp, i); /* (a lent chunk waits for its alias to go) */
  }
}

/* Map `len` granules at granule g of vs that are all unmapped, in one chunk.
 *
 * Memory held grows only where it must: new memory is created as long as
 * that keeps the reserved bytes within their peak, or within the live peak
 * plus the allowance (and the limit); beyond that, held chunks are used
 * first: a spare one that fits, an idle one of exactly this size (moved: one
 * unmap, one map), else idle chunks (oldest first) are given back before the
 * new one is created. So the peak grows only when no idle chunk is left, as
 * when every 2 MiB chunk was moved one by one, but with a few calls per run
 * of granules instead of two per granule; and below the peak nothing is
 * moved at all. The allowance starts at 0 and grows by one largest chunk
 * every MOVES_PER_RAISE moves that came within RAISE_ALLOCS_PER_MOVE
 * allocations a move: a steady state that keeps moving chunks often settles
 * where it needs none, one that moves rarely keeps its few moves (it grows by 1/128 of the live peak, at least a
 * granule, at most a largest chunk), with several streams to at most 1/ALLOWANCE_STREAMS_DIV of the
 * live peak. Trimming (gpumem__vm_allowance_reset) and a full device set it back to 0. A config's
 * peak_headroom lifts the bound to that fraction past the live peak, except while the device is short
 * of memory: moves cost driver calls (about 60 us each on an H200), and with shapes that change every
 * step a pool held near its live peak moves chunks at every new large block, where one allowed about
 * a fifth more memory settles and moves none (docs/TUNING.md). */
static gpumem_status fill(gpumem__vmspace *vs, uint32_t g, uint32_t len, uint64_t limit) {
  gpumem__vmpool *vp = vs->vp;
  uint64_t add = (uint64_t)len * vp->gran;
  uint64_t cap = vp->st->reserved_peak;
  if (vp->st->allocated_peak + vp->allowance > cap) cap = vp->st->allocated_peak + vp->allowance;
  const double headroom = vp->ctx->opt.peak_headroom;
  if (headroom > 0.0 && vp->fine_until == 0) {
    /* peak_headroom: the user's choice of memory over moves, set aside while the device is short of
     * memory (chunk_limit, called before fill, clears fine_until once that has passed) */
    uint64_t h = vp->st->allocated_peak + (uint64_t)((double)vp->st->allocated_peak * headroom);
    if (h > cap) cap = h;
  }
  if (limit != 0 && limit < cap) cap = limit;
  if (vp->st->reserved_bytes + add > cap && vp->nidle + vp->spare_gran > 0) {
    const uint32_t per_raise = vp->several ? MOVES_PER_RAISE_STREAMS : MOVES_PER_RAISE;
    if (++vp->moves >= per_raise) {
      /* by 1/128 of the live peak, at least a granule, at most a largest chunk; only when the moves
       * came often (RAISE_ALLOCS_PER_MOVE) */
      uint64_t allocs = vp->st->num_allocs - vp->moves_from; /* (wraps to large if the count went back: no raise) */
      vp->moves = 0;
      vp->moves_from = vp->st->num_allocs;
      if (allocs <= (uint64_t)per_raise * RAISE_ALLOCS_PER_MOVE) {
        uint64_t step = vp->st->allocated_peak / 128 / vp->gran;
        if (step < 1) step = 1;
        if (step > vp->chunk_max) step = vp->chunk_max;
        vp->allowance += step * vp->gran;
        const uint64_t most = (vp->st->allocated_peak / ALLOWANCE_STREAMS_DIV) & ~(uint64_t)(vp->gran - 1);
        if (vp->several && vp->allowance > most) vp->allowance = most;
        LOG(vp, GPUMEM_LOG_DEBUG,
            "device %d: %u idle-chunk moves in %llu allocations: new memory may now go %llu MiB past the live peak",
            vp->dev, per_raise, (unsigned long long)allocs, (unsigned long long)(vp->allowance >> 20));
      } else {
        LOG(vp, GPUMEM_LOG_DEBUG,
            "device %d: %u idle-chunk moves in %llu allocations: rare enough, new memory stays within %llu MiB "
            "past the live peak",
            vp->dev, per_raise, (unsigned long long)allocs, (unsigned long long)(vp->allowance >> 20));
      }
    }
    /* a spare chunk that fits */
    for (size_t k = 0; k < vp->nspare; k++) {
      if (vp->spare[k].len != len) continue;
      gpumem_phys_handle h = vp->spare[k].h;
      spare_remove(vp, k);
      return map_handle(vs, g, h, len);
    }
    /* an idle chunk of exactly this size: move it */
    uint32_t i = vp->ihead;
    for (int k = 0; k < FIT_SCAN && i != NIL && (vp->ch[i].len != len || vp->ch[i].lent || vp->ch[i].alias); k++)
      i = vp->ch[i].next;
    int guarded = 0; /* the guard refused: idle chunks stay, new memory is created */
    if (i != NIL && vp->ch[i].len == len && !vp->ch[i].lent && !vp->ch[i].alias) {
      gpumem_phys_handle h = 0;
      uint32_t l = 0;
      gpumem_status st = chunk_unmap(vp, i, &h, &l);
      if (st == GPUMEM_OK) return map_handle(vs, g, h, l);
      if (st != GPUMEM_ERR_BUSY) return st;
      guarded = 1;
    }
    /* give back spare, then idle chunks, until the new chunk fits under the cap (or nothing idle is left) */
    while (vp->nspare > 0 && vp->st->reserved_bytes + add > cap) {
      spare_chunk s = vp->spare[vp->nspare - 1];
      spare_remove(vp, vp->nspare - 1);
      gpumem_status st = drop_handle(vp, s.h, s.len);
      if (st != GPUMEM_OK) return st;
    }
    while (!guarded && vp->ihead != NIL && vp->st->reserved_bytes + add > cap) {
      gpumem_status st = give_back(vp, vp->ihead);
      if (st == GPUMEM_ERR_BUSY) break;
      if (st != GPUMEM_OK) return st;
    }
  }
  if (limit != 0 && vp->st->reserved_bytes + add > limit) return GPUMEM_ERR_LIMIT_EXCEEDED;
  gpumem_status st = map_new(vs, g, len);
  if (st == GPUMEM_ERR_OUT_OF_MEMORY) {
    gpumem__vm_allowance_reset(vp); /* the device is full: pack tightly */
    gpumem__vm_pressure(vp);
  }
  if (st == GPUMEM_ERR_OUT_OF_MEMORY && vp->ihead != NIL) {
    /* the device is full (others took memory): give idle chunks back and try again */
    uint64_t freed = 0;
    while (vp->ihead != NIL && freed < add) {
      freed += (uint64_t)vp->ch[vp->ihead].len * vp->gran;
      gpumem_status gst = give_back(vp, vp->ihead);
      if (gst == GPUMEM_ERR_BUSY) return st; /* still out of memory: the caller waits and retries */
      if (gst != GPUMEM_OK) return gst;
    }
    st = map_new(vs, g, len);
  }
  return st;
}

gpumem_status gpumem__vm_commit(gpumem__vmspace *vs, uintptr_t addr, size_t size, uint64_t limit) {
  if (size == 0) return GPUMEM_OK;
  gpumem__vmpool *vp = vs->vp;
  size_t gs = vp->gran;
  uintptr_t off = addr - vs->base;
  uint32_t g = (uint32_t)(off / gs), last = (uint32_t)((off + size - 1) / gs);
  /* granules wholly inside the block, [inner, inner_end): only there may a huge chunk go, so that
   * no neighbour ever shares one */
  uint32_t inner = (uint32_t)((off + gs - 1) / gs), inner_end = (uint32_t)((off + size) / gs);
  int huge = size >= HUGE_BLOCK_BYTES && vp->chunk_huge > vp->chunk_max;
  uint32_t cmax = 0;
  while (g <= last) {
    if (vs->cid[g] != NIL) {
      g++;
      continue;
    }
    if (cmax == 0) {
      cmax = chunk_limit(vp);
      if (cmax != vp->chunk_max) huge = 0; /* under pressure: one granule each */
    }
    uint32_t e = g; /* a run of unmapped granules, at most cmax long (a huge chunk: exactly chunk_huge) */
    uint32_t lim = cmax;
    if (huge && g >= inner && inner_end - g >= vp->chunk_huge) lim = vp->chunk_huge;
    while (e <= last && vs->cid[e] == NIL && e - g < lim) e++;
    if (e - g < lim && e - g > cmax) e = g + cmax; /* something mapped before a whole huge chunk: a normal one */
    gpumem_status st = fill(vs, g, e - g, limit);
    if (st != GPUMEM_OK) return st;
    g = e;
  }
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Lending                                                                 */
/*
 * A stream's own free blocks serve that stream at once, in stream order, but only where they lie:
 * a request larger than any of them maps new memory beside them while the device still runs the
 * work queued before their frees (a GPU behind the host), and the pool grows by what they hold.
 * Their chunks cannot be moved there (an unmap under queued work is a fault), but a chunk's memory
 * may be mapped at a second address: the request takes it there, stream-ordered after that work as
 * any reuse of the stream's own memory is, and the first mapping stays, unused, until the stream
 * has passed the free (then gpumem__vm_unlend unmaps it). No memory is created and none is moved:
 * one map and one set-access now, one unmap later, the calls of a move. The chunk's record moves
 * to the new place (it is "lent": its handle is not destroyed while the other mapping lasts), and
 * the old place keeps a record marked "alias" (unmapped, never destroyed). */

/* The first granule p in [from, to) with [p, p + len) unmapped and inside [from, to), or NIL. */
static uint32_t unmapped_run(const gpumem__vmspace *vs, uint32_t from, uint32_t to, uint32_t len) {
  uint32_t run = 0;
  for (uint32_t g = from; g < to; g++) {
    run = vs->cid[g] == NIL ? run + 1 : 0;
    if (run == len) return g + 1 - len;
  }
  return NIL;
}

uint32_t gpumem__vm_lend(gpumem__vmspace *dst, uintptr_t daddr, size_t dsize, gpumem__vmspace *src, uintptr_t saddr,
                         size_t ssize, uint32_t max_gran) {
  gpumem__vmpool *vp = dst->vp;
  const size_t gs = vp->gran;
  const uintptr_t soff = saddr - src->base, doff = daddr - dst->base;
  /* the source's whole granules [s0, s1): only chunks wholly inside them are its alone */
  const uint32_t s0 = (uint32_t)((soff + gs - 1) / gs), s1 = (uint32_t)((soff + ssize) / gs);
  const uint32_t d0 = (uint32_t)(doff / gs), d1 = (uint32_t)((doff + dsize - 1) / gs) + 1;
  uint32_t lent = 0, at = d0;
  for (uint32_t g = s0; g < s1 && lent < max_gran;) {
    const uint32_t c = src->cid[g];
    if (c == NIL) {
      g++;
      continue;
    }
    const uint32_t start = vp->ch[c].start, len = vp->ch[c].len;
    if (start < g || start + len > s1 || vp->ch[c].lent || vp->ch[c].alias || lent + len > max_gran) {
      g = start + len > g ? start + len : g + 1; /* shared with a neighbour, lent already, or too much */
      continue;
    }
    const uint32_t p = unmapped_run(dst, at, d1, len);
    if (p == NIL) {
      g += len;
      continue;
    }
    const uint32_t j = chunk_alloc(vp); /* (may move the table) */
    if (j == NIL) break;
    const gpumem_phys_handle h = vp->ch[c].h;
    if (gpumem__be_vm_map(vp->ctx, vp->dev, gaddr(dst, p), (size_t)len * gs, h) != GPUMEM_OK) {
      chunk_release_slot(vp, j);
      break; /* the rest is mapped as usual */
    }
    chunk_place(dst, j, h, p, len);
    if (vp->ch[j].idle) idle_remove(vp, j); /* (dst is busy there: not so) */
    vp->ch[j].lent = 1;
    vp->ch[j].mate = c;
    vp->ch[c].alias = 1;
    vp->ch[c].mate = j;
    src->naliased += len;
    vp->nalias++;
    lent += len;
    at = p + len;
    g += len;
  }
  if (lent > 0)
    LOG(vp, GPUMEM_LOG_DEBUG, "device %d: %u granules of the stream's own pending frees mapped again at %p",
        vp->dev, lent, (void *)daddr);
  return lent;
}

gpumem_status gpumem__vm_unlend(gpumem__vmspace *vs, uintptr_t addr, size_t size) {
  gpumem__vmpool *vp = vs->vp;
  if (vp->nalias == 0 || size == 0) return GPUMEM_OK;
  const uintptr_t off = addr - vs->base;
  const uint32_t last = (uint32_t)((off + size - 1) / vp->gran);
  gpumem_status first = GPUMEM_OK;
  for (uint32_t g = (uint32_t)(off / vp->gran); g <= last;) {
    const uint32_t c = vs->cid[g];
    if (c == NIL || !vp->ch[c].alias) {
      g++;
      continue;
    }
    const uint32_t next = vp->ch[c].start + vp->ch[c].len;
    gpumem_status st = give_back(vp, c); /* an alias: unmapped only */
    if (st != GPUMEM_OK && first == GPUMEM_OK) first = st;
    g = next;
  }
  return first;
}

void gpumem__vm_several_streams(gpumem__vmpool *vp, int several) {
  vp->several = several != 0;
  if (several)
    LOG(vp, GPUMEM_LOG_DEBUG, "device %d: several streams: the allowance above the live peak rises every %u moves",
        vp->dev, (unsigned)MOVES_PER_RAISE_STREAMS);
}

void gpumem__vm_allowance_reset(gpumem__vmpool *vp) {
  vp->allowance = 0;
  vp->moves = 0;
  vp->moves_from = vp->st->num_allocs;
}

gpumem_status gpumem__vm_trim(gpumem__vmpool *vp, uint64_t max_bytes, uint64_t *released) {
  gpumem_status first = GPUMEM_OK;
  uint64_t rel = 0;
  /* spare chunks first: they back nothing */
  size_t k = 0;
  while (k < vp->nspare && rel < max_bytes) {
    spare_chunk s = vp->spare[k];
    gpumem_status st = gpumem__be_vm_destroy(vp->ctx, vp->dev, s.h);
    if (st == GPUMEM_OK) {
      spare_remove(vp, k); /* (the last one moves to k) */
      held_sub(vp, s.len);
      rel += (uint64_t)s.len * vp->gran;
    } else {
      if (first == GPUMEM_OK) first = st;
      k++;
    }
  }
  /* then idle chunks, oldest first; the last one only in part */
  size_t todo = 0; /* a failed chunk moves to the tail: visit each once */
  for (uint32_t i = vp->ihead; i != NIL; i = vp->ch[i].next) todo++;
  while (vp->ihead != NIL && todo > 0 && rel < max_bytes) {
    todo--;
    uint32_t i = vp->ihead;
    uint32_t len = vp->ch[i].len;
    uint64_t left = max_bytes - rel; /* (max_bytes may be UINT64_MAX: no rounding-up addition) */
    uint64_t want = left / vp->gran + (left % vp->gran != 0); /* granules */
    uint32_t keep = want < len ? len - (uint32_t)want : 0;
    uint64_t held0 = vp->st->reserved_bytes;
    gpumem_status st = shrink(vp, i, keep);
    if (held0 > vp->st->reserved_bytes) rel += held0 - vp->st->reserved_bytes;
    if (st == GPUMEM_ERR_BUSY) break; /* the guard: idle chunks may still be in use, not now */
    if (st != GPUMEM_OK) {
      if (first == GPUMEM_OK) first = st; /* (a chunk whose destroy failed is spare: still held) */
      break; /* the backend is failing: stop here */
    }
  }
  *released += rel;
  return first;
}

/* ---------------------------------------------------------------------- */
/* Invariant check                                                         */

int gpumem__vm_check_begin(gpumem__vmspace *vs) {
  if (vs->chk == NULL) vs->chk = gpumem__calloc(vs->n, sizeof *vs->chk);
  else memset(vs->chk, 0, vs->n * sizeof *vs->chk);
  return vs->chk != NULL ? 0 : -1;
}

/* chk[g]: the busy bytes the caller counted, and this bit where a parked lent block may have lost the
 * mapping (granule sizes stay far below it) */
#define CHK_UNMAPPED_OK 0x80000000u

void gpumem__vm_check_add(gpumem__vmspace *vs, uintptr_t addr, size_t size, int unmapped_ok) {
  if (vs->chk == NULL || size == 0) return;
  size_t gs = vs->vp->gran;
  uintptr_t off = addr - vs->base, end = off + size;
  for (uint32_t g = (uint32_t)(off / gs); g <= (uint32_t)((end - 1) / gs); g++) {
    uintptr_t lo = (uintptr_t)g * gs, hi = lo + gs;
    if (lo < off) lo = off;
    if (hi > end) hi = end;
    vs->chk[g] += (uint32_t)(hi - lo);
    if (unmapped_ok) vs->chk[g] |= CHK_UNMAPPED_OK;
  }
}

const char *gpumem__vm_check_end(gpumem__vmspace *vs) {
  if (vs->chk == NULL) return NULL; /* no host memory to check with */
  gpumem__vmpool *vp = vs->vp;
  size_t mapped = 0;
  for (uint32_t g = 0; g < vs->n; g++) {
    if ((vs->chk[g] & ~CHK_UNMAPPED_OK) != vs->busy[g]) return "busy bytes of a granule differ from its live and not-READY blocks";
    if (vs->busy[g] != 0 && vs->cid[g] == NIL && !(vs->chk[g] & CHK_UNMAPPED_OK))
      return "a granule under a live or not-READY block is not mapped";
    if (((vs->idleb[g >> 6] >> (g & 63)) & 1) != (vs->busy[g] == 0)) return "idle bit map";
    if (((vs->unmb[g >> 6] >> (g & 63)) & 1) != (vs->cid[g] == NIL)) return "unmapped bit map";
    if (vs->cid[g] == NIL) continue;
    mapped++;
    if (vs->cid[g] >= vp->nch) return "chunk index out of range";
    const vmchunk *c = &vp->ch[vs->cid[g]];
    if (c->vs != vs || g < c->start || g - c->start >= c->len) return "granule outside its chunk";
  }
  if (mapped != vs->nmapped) return "mapped granule count";
  size_t nchunks = 0, idle_here = 0;
  for (uint32_t i = 0; i < vp->nch; i++) {
    const vmchunk *c = &vp->ch[i];
    if (c->vs != vs) continue;
    nchunks++;
    if (c->len == 0 || c->start + (uint64_t)c->len > vs->n) return "chunk range";
    uint32_t nb = 0;
    for (uint32_t g = c->start; g < c->start + c->len; g++) {
      if (vs->cid[g] != i) return "chunk granules";
      nb += vs->busy[g] != 0;
    }
    if (nb != c->nbusy) return "busy granule count of a chunk";
    if (c->idle != (nb == 0 && !c->lent)) return "a chunk is idle exactly when none of its granules is busy";
    if (c->alias && (c->mate >= vp->nch || !vp->ch[c->mate].lent || vp->ch[c->mate].mate != i)) return "alias";
    idle_here += c->idle;
  }
  if (nchunks != vs->nchunks) return "chunk count";
  size_t n = 0, gran = 0, here = 0;
  uint32_t prev = NIL;
  for (uint32_t i = vp->ihead; i != NIL; i = vp->ch[i].next) {
    const vmchunk *c = &vp->ch[i];
    if (i >= vp->nch || c->vs == NULL || !c->idle || c->nbusy != 0 || c->prev != prev) return "idle list";
    prev = i;
    gran += c->len;
    here += c->vs == vs;
    if (++n > vp->nch) return "idle list longer than the chunk table";
  }
  if (vp->itail != prev || gran != vp->nidle || here != idle_here) return "idle list length";
  free(vs->chk);
  vs->chk = NULL;
  return NULL;
}
