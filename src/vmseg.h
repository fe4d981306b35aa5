/*
 * vmseg.h: expandable virtual-memory segments (the granule map of a device
 * pool). Internal to the core; pool.c is its only user.
 *
 * A "space" is one large address range reserved with vm_reserve. pool.c
 * lays blocks out in it as one segment of kind SEG_VM, with the usual
 * splitting and coalescing; this module only knows address ranges. Physical
 * memory backs the granules of a space (the backend's granularity: 2 MiB on
 * CUDA and sim) on demand, in chunks: one vm_create of one or more granules
 * (at most CHUNK_MAX_BYTES, vmseg.c; CHUNK_HUGE_BYTES wholly inside blocks
 * of HUGE_BLOCK_BYTES and more; one granule for a while after the device ran
 * short of memory, gpumem__vm_pressure), mapped over a run of
 * granules with one vm_map and unmapped as a whole.
 *
 *   busy[g]  bytes of granule g covered by blocks that are live, or free but
 *            not READY (freed on a stream whose work may still touch them).
 *            pool.c keeps it exact with gpumem__vm_busy().
 *   cid[g]   the chunk mapped at g, or none. A granule with busy > 0 is
 *            always mapped (gpumem__vm_commit maps it).
 *   idle     chunks none of whose granules is busy: wholly inside READY free
 *            blocks, so nothing can touch them any more. Only these are
 *            ever unmapped (trim, release threshold, or to make room for a
 *            new block's chunk at the peak). Idle granules of a chunk that
 *            also holds busy ones stay mapped until the chunk is idle.
 *   spare    chunks that are unmapped but still held (a failed map or destroy).
 *   idleb, unmb  one bit per granule: busy[g] == 0, cid[g] unmapped; kept with the arrays so that
 *            placement costs of long ranges count 64 granules at a time (gpumem__vm_place_cost).
 *
 * Reserved bytes (gpumem_stats::reserved_bytes, and what the backend holds)
 * = chunks held = (mapped + spare granules) * granularity. New memory is
 * created freely while the reserved bytes stay within their peak (and the
 * limit); beyond it, idle chunks are moved or given back first, so the peak
 * grows only when no idle chunk is left.
 *
 * Not thread-safe: every call is made under the pool lock.
 */
#ifndef GPUMEM_VMSEG_H
#define GPUMEM_VMSEG_H

#include "internal.h"

typedef struct gpumem__vmpool gpumem__vmpool;
typedef struct gpumem__vmspace gpumem__vmspace;

/* backend.c: wrappers of the optional virtual-memory methods */
/** 1 when the backend has all seven vm_* methods. */
int gpumem__be_has_vm(const gpumem_context *ctx);
gpumem_status gpumem__be_vm_granularity(gpumem_context *ctx, int dev, size_t *gran);
gpumem_status gpumem__be_vm_reserve(gpumem_context *ctx, int dev, size_t size, void **va);
gpumem_status gpumem__be_vm_release(gpumem_context *ctx, int dev, void *va, size_t size);
gpumem_status gpumem__be_vm_create(gpumem_context *ctx, int dev, size_t size, gpumem_phys_handle *h);
gpumem_status gpumem__be_vm_destroy(gpumem_context *ctx, int dev, gpumem_phys_handle h);
gpumem_status gpumem__be_vm_map(gpumem_context *ctx, int dev, void *va, size_t size, gpumem_phys_handle h);
gpumem_status gpumem__be_vm_unmap(gpumem_context *ctx, int dev, void *va, size_t size);

/**
 * The device is short of memory (this pool ran out of it, a member of its
 * shared group asked for memory, or free memory fell below
 * trim_free_fraction): for a while (FINE_NS, vmseg.c) new chunks are one
 * granule each, so that every granule that goes idle can be given back
 * while its neighbours stay live.
 */
void gpumem__vm_pressure(gpumem__vmpool *vp);
/**
 * Lending: maps chunks that lie wholly inside [saddr, saddr+ssize) of src (a free block of a
 * stream's own whose queued work may still use it) a second time, over unmapped granules of
 * [daddr, daddr+dsize) of dst (a block taken by that stream), at most max_gran granules. The old
 * mappings stay until gpumem__vm_unlend; the caller keeps the source range from every use until
 * then. Returns the granules mapped (0: none; a failing map stops it, the rest is mapped as usual).
 */
uint32_t gpumem__vm_lend(gpumem__vmspace *dst, uintptr_t daddr, size_t dsize, gpumem__vmspace *src, uintptr_t saddr,
                         size_t ssize, uint32_t max_gran);
/** Unmaps the alias mappings gpumem__vm_lend left in [addr, addr+size) (the device has passed their
 * use). GPUMEM_OK, or the first unmap error (those aliases stay; a later call retries). */
gpumem_status gpumem__vm_unlend(gpumem__vmspace *vs, uintptr_t addr, size_t size);
/** The lowest alias (a lending's first mapping, gpumem__vm_lend) of vs that starts at or above address
 * `from`: 1 with its range in *addr and *size, 0 when there is none. O(chunks). */
int gpumem__vm_next_alias(const gpumem__vmspace *vs, uintptr_t from, uintptr_t *addr, size_t *size);
/** The allowance above the live peak back to 0 (trim, a full device): new memory stays within the peak. */
void gpumem__vm_allowance_reset(gpumem__vmpool *vp);
/** The pool has seen a second stream (several = 1): the allowance rises at its slower rate from now on
 *  (vmseg.c); 0 (a reset pool, which starts over with one stream): the single-stream rate again. */
void gpumem__vm_several_streams(gpumem__vmpool *vp, int several);
/**
 * The vm state of one device pool, or NULL when the pool uses plain
 * segments: expandable is off, the backend lacks vm methods, or its
 * granularity is unusable. `total` is the device total (sizes the spaces);
 * `st` is the pool's statistics (reserved bytes and peak, backend allocs
 * and frees are kept there).
 */
gpumem__vmpool *gpumem__vm_pool_new(gpumem_context *ctx, int device, uint64_t total, gpumem_stats *st);
/**
 * Install a guard called before any idle chunk is unmapped (moved, trimmed,
 * given back): it returns GPUMEM_OK when nothing can touch the idle chunks
 * any more, or a status (GPUMEM_ERR_BUSY: not now) and then nothing is
 * unmapped: gpumem__vm_commit creates new memory instead of moving idle
 * chunks, gpumem__vm_trim stops there (no error). The pool uses it for
 * blocks that a single-stream pool made READY at their free (pool.c).
 */
void gpumem__vm_set_guard(gpumem__vmpool *vp, gpumem_status (*guard)(void *arg), void *arg);
/** Free the state; every space must be closed. */
void gpumem__vm_pool_free(gpumem__vmpool *vp);
size_t gpumem__vm_granularity(const gpumem__vmpool *vp);

/** Reserve a space of at least min_size bytes (the default size is twice the device total). */
gpumem_status gpumem__vm_space_open(gpumem__vmpool *vp, size_t min_size, gpumem__vmspace **out, uintptr_t *base,
                                    size_t *size);
/**
 * Unmap and destroy every chunk of the space and release its range (the
 * caller made sure no work touches it). GPUMEM_OK when the space is gone
 * (a chunk whose destroy failed is kept as spare, still counted, for
 * gpumem__vm_trim to retry); on another backend error the space stays open,
 * with what could not be unmapped still mapped and counted.
 */
gpumem_status gpumem__vm_space_close(gpumem__vmspace *vs);
/** Bytes mapped in the space. */
uint64_t gpumem__vm_space_mapped(const gpumem__vmspace *vs);
/** Forget every busy byte of the space (reset: every block is gone). */
void gpumem__vm_space_clear_busy(gpumem__vmspace *vs);

/* A space. Its definition is here only so that the per-allocation helpers
 * below (busy bytes, placement costs) inline into pool.c; nothing outside
 * vmseg.c writes its fields. */
struct gpumem__vmspace {
  uintptr_t base;          /* aligned to the granularity */
  uint32_t *cid;           /* n: chunk mapped at the granule, GPUMEM__VM_NIL = none */
  uint32_t *busy;          /* n: busy bytes */
  uint64_t *idleb;         /* (n + 63) / 64 words: bit g set while busy[g] == 0 (bits past n: 0) */
  uint64_t *unmb;          /* the same: bit g set while cid[g] == GPUMEM__VM_NIL */
  unsigned gshift;         /* log2 of the granularity */
  gpumem__vmpool *vp;
  gpumem__vmspace *prev, *next;
  size_t size;
  void *raw;               /* what vm_reserve returned, and its size (for vm_release) */
  size_t raw_size;
  uint32_t n;              /* granules */
  uint32_t hi;             /* one past the highest granule ever mapped: every window above it is unmapped */
  size_t nmapped;          /* granules */
  size_t naliased;         /* of them, granules of alias mappings (gpumem__vm_lend: memory counted where it is lent) */
  size_t nchunks;          /* chunks mapped in the space */
  uint32_t *chk;           /* invariant check scratch */
};

#define GPUMEM__VM_NIL UINT32_MAX

/* Out of line: n granules of chunk i (n > 0, all of them mapped there) went from no busy bytes to
 * some (delta > 0) or back to none (delta < 0); the chunk's busy granule count moves by n, and the
 * chunk leaves or joins the idle list. */
void gpumem__vm_chunk_busy(gpumem__vmspace *vs, uint32_t i, uint32_t n, int delta);
/* Out of line: gpumem__vm_busy over more than a few granules (offsets from the space's base). */
void gpumem__vm_busy_runs(gpumem__vmspace *vs, uintptr_t off, uintptr_t end, int delta);

/** [addr, addr+size) becomes busy (delta > 0) or stops being busy (delta < 0). Granule by granule;
 * over more than 8 (a large block spans hundreds, of a few chunks) gpumem__vm_busy_runs counts a
 * chunk's granules that change once per run of them, which changes the idle list the same way and
 * in the same order. */
static inline void gpumem__vm_busy(gpumem__vmspace *vs, uintptr_t addr, size_t size, int delta) {
  if (size == 0) return;
  const unsigned sh = vs->gshift;
  uintptr_t off = addr - vs->base, end = off + size;
  uint32_t g = (uint32_t)(off >> sh), last = (uint32_t)((end - 1) >> sh);
  uint32_t *busy = vs->busy;
  if (last - g >= 8) {
    gpumem__vm_busy_runs(vs, off, end, delta);
    return;
  }
  for (; g <= last; g++) {
    uintptr_t lo = (uintptr_t)g << sh, hi = lo + ((uintptr_t)1 << sh);
    if (lo < off) lo = off;
    if (hi > end) hi = end;
    uint32_t bytes = (uint32_t)(hi - lo);
    if (delta > 0) {
      if (busy[g] == 0) {
        vs->idleb[g >> 6] &= ~((uint64_t)1 << (g & 63));
        if (vs->cid[g] != GPUMEM__VM_NIL) gpumem__vm_chunk_busy(vs, vs->cid[g], 1, +1);
      }
      busy[g] += bytes;
    } else {
      busy[g] -= bytes;
      if (busy[g] == 0) {
        vs->idleb[g >> 6] |= (uint64_t)1 << (g & 63);
        if (vs->cid[g] != GPUMEM__VM_NIL) gpumem__vm_chunk_busy(vs, vs->cid[g], 1, -1);
      }
    }
  }
}
/* Bits set in x: the instruction where the target has one, else a few shifts and adds inline (the
 * library is built for the baseline x86-64, whose builtin is an out-of-line call). */
static inline unsigned gpumem__vm_popcount(uint64_t x) {
#if defined(__POPCNT__) || defined(__aarch64__)
  return (unsigned)__builtin_popcountll(x);
#else
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  x += x >> 8; /* (adds, not the usual multiply: nothing wraps, which the overflow-checking build verifies) */
  x += x >> 16;
  x += x >> 32;
  return (unsigned)(x & 0x7f);
#endif
}
/** The bits of bit map bm for granules [g, g + n), 1 <= n <= 64, low bit first; the word after g's is
 * read only when the range reaches into it (so a range may end at the map's last bit). */
static inline uint64_t gpumem__vm_bits(const uint64_t *bm, uint32_t g, uint32_t n) {
  const uint32_t w = g >> 6, s = g & 63;
  uint64_t x = bm[w] >> s;
  if (s + n > 64) x |= bm[w + 1] << (64 - s);
  return n == 64 ? x : x & (((uint64_t)1 << n) - 1);
}
/** Granule g's part of the placement cost (gpumem__vm_place_cost): 1 if no busy byte touches it, 1 more if it is not mapped. */
static inline size_t gpumem__vm_gran_cost(const gpumem__vmspace *vs, uint32_t g) {
  return (size_t)(vs->busy[g] == 0) + (size_t)(vs->cid[g] == GPUMEM__VM_NIL);
}

/**
 * The placement cost of a block at [addr, addr+size), in granules: those
 * that no busy byte touches yet (what the block adds to the footprint), plus
 * those that are not mapped (each needs a chunk: backend calls, and new
 * memory where no idle chunk can be moved). An idle mapped granule costs 1,
 * an unmapped one 2: both take a granule's worth from the pool's memory,
 * but only the unmapped one costs backend calls. Counting stops once it
 * passes cap (the result is then some value > cap).
 */
static inline size_t gpumem__vm_place_cost(const gpumem__vmspace *vs, uintptr_t addr, size_t size, size_t cap) {
  if (size == 0) return 0;
  const unsigned sh = vs->gshift;
  uintptr_t off = addr - vs->base;
  uint32_t g = (uint32_t)(off >> sh), last = (uint32_t)((off + size - 1) >> sh);
  size_t k = 0;
  if (last - g < 4) { /* one to four granules (most blocks): one by one, cheaper than the words */
    for (; g <= last && k <= cap; g++) k += gpumem__vm_gran_cost(vs, g);
    return k;
  }
  if (last - g < 32) {
    /* up to 32 granules: their bits of the two maps, from one word or two, counted in one word (the
     * idle ones low, the unmapped ones high) */
    const uint32_t n = last - g + 1;
    return gpumem__vm_popcount(gpumem__vm_bits(vs->idleb, g, n) | (gpumem__vm_bits(vs->unmb, g, n) << 32));
  }
  /* 64 granules a step: the two bit maps' words, masked to [g, last], counted */
  uint32_t w = g >> 6, wl = last >> 6;
  uint64_t m = ~(uint64_t)0 << (g & 63);
  for (;; w++, m = ~(uint64_t)0) {
    if (w == wl) m &= ~(uint64_t)0 >> (63 - (last & 63));
    k += (size_t)gpumem__vm_popcount(vs->idleb[w] & m) + gpumem__vm_popcount(vs->unmb[w] & m);
    if (w == wl || k > cap) return k;
  }
}
/** Granules of [addr, addr+size) that are not mapped. */
static inline size_t gpumem__vm_unmapped(const gpumem__vmspace *vs, uintptr_t addr, size_t size) {
  if (size == 0) return 0;
  const unsigned sh = vs->gshift;
  uintptr_t off = addr - vs->base;
  uint32_t g = (uint32_t)(off >> sh), last = (uint32_t)((off + size - 1) >> sh);
  size_t k = 0;
  if (last - g < 4) {
    for (; g <= last; g++) k += vs->cid[g] == GPUMEM__VM_NIL;
    return k;
  }
  if (last - g < 64) return gpumem__vm_popcount(gpumem__vm_bits(vs->unmb, g, last - g + 1));
  uint32_t w = g >> 6, wl = last >> 6;
  uint64_t m = ~(uint64_t)0 << (g & 63);
  for (;; w++, m = ~(uint64_t)0) {
    if (w == wl) m &= ~(uint64_t)0 >> (63 - (last & 63));
    k += gpumem__vm_popcount(vs->unmb[w] & m);
    if (w == wl) return k;
  }
}
/**
 * The granule-aligned start in [lo, last] (addresses: lo rounded up to a
 * granule) of `size` bytes with the lowest placement cost
 * (gpumem__vm_place_cost), below `cap`. Starts are scanned up to the highest
 * granule ever mapped (beyond it every start costs the most), each from the
 * last by one granule out and one in, while *budget (granules looked at,
 * decremented) lasts. Returns 1 with *addr and *cost, or 0 when no start
 * scanned costs less than cap.
 */
int gpumem__vm_best_window(const gpumem__vmspace *vs, uintptr_t lo, uintptr_t last, size_t size, size_t cap,
                           size_t *budget, uintptr_t *addr, size_t *cost);
/**
 * Where the pool's mapped memory that no busy byte uses lies (for the log: O(granules mapped)):
 * *partial, the unused bytes of granules that hold busy bytes; *pinned, idle granules of chunks that
 * also hold a busy granule (not movable); *idle, granules of idle chunks (movable, or given back);
 * *allowance, how far past the live peak new memory may now go before idle chunks are moved.
 */
void gpumem__vm_describe(const gpumem__vmpool *vp, uint64_t *partial, uint64_t *pinned, uint64_t *idle,
                         uint64_t *allowance);
/** Bytes of spare chunks (held, unmapped). */
uint64_t gpumem__vm_spare_bytes(const gpumem__vmpool *vp);
/** Granules available without creating a chunk (in idle and spare chunks). */
size_t gpumem__vm_available(const gpumem__vmpool *vp);

/**
 * Map every granule of [addr, addr+size) (already busy), one chunk per run
 * of unmapped granules (at most CHUNK_MAX_BYTES each): a new chunk while the
 * reserved bytes stay within their peak and `limit` (0 = none); beyond that
 * a spare chunk or an idle one of the run's size moved here, else idle
 * chunks (oldest first) are given back before the new one is created.
 * \return OK; LIMIT_EXCEEDED; OUT_OF_MEMORY; another backend status. On
 * failure the granules mapped so far stay mapped (idle once the caller drops
 * the busy bytes), so nothing leaks and a retry starts where this stopped.
 */
gpumem_status gpumem__vm_commit(gpumem__vmspace *vs, uintptr_t addr, size_t size, uint64_t limit);

/**
 * Give back up to `max_bytes` of held chunks (rounded up to granules):
 * spare ones, then idle ones (least recently idle first), unmapping and
 * destroying them; of the last one, only what is needed (it is given back
 * and a smaller chunk is mapped in its place). Adds what was given back to
 * *released. Returns the first backend error, if any.
 */
gpumem_status gpumem__vm_trim(gpumem__vmpool *vp, uint64_t max_bytes, uint64_t *released);

/**
 * Check the granule map against the busy bytes recomputed by the caller:
 * call gpumem__vm_check_begin, gpumem__vm_check_add for every busy block,
 * then gpumem__vm_check_end (returns 0 when consistent, else a message).
 * Every busy granule must be mapped, but where unmapped_ok: a parked lent
 * block whose aliases were partly unmapped (an unlend that failed half-way
 * keeps the block parked, out of every use, until it is retried).
 */
int gpumem__vm_check_begin(gpumem__vmspace *vs);
void gpumem__vm_check_add(gpumem__vmspace *vs, uintptr_t addr, size_t size, int unmapped_ok);
const char *gpumem__vm_check_end(gpumem__vmspace *vs);

#endif /* GPUMEM_VMSEG_H */
