/* tcache.h: the per-thread cache's layout and its inlined hot paths (issue 4).
 *
 * gpumem_alloc and gpumem_free try gpumem__tc_fast_alloc / _free first: one
 * thread-local load, the cache's spinlock, a bin look-up and (for a free)
 * one probe of the pointer index, all inlined into the entry point. Anything
 * else (a miss, another key, a full bin, the peak moving) returns 0 and the
 * caller takes the out-of-line path in tcache.c, which redoes the checks.
 * The protocol is described at the top of tcache.c and ptrmap.c. */
#ifndef GPUMEM_TCACHE_H
#define GPUMEM_TCACHE_H

#include "internal.h"

#include <sched.h>

#define GPUMEM__TC_MAX_SIZE ((size_t)1 << 20)   /* block sizes cached: up to 1 MiB */
#define GPUMEM__TC_BINS 32                      /* direct-mapped by block size */
#define GPUMEM__TC_BIN_CAP 8                    /* blocks per bin */
#define GPUMEM__TC_MAX_BYTES ((uint64_t)4 << 20) /* bytes per cache */

typedef struct gpumem__tc_bin {
  size_t size; /* block size held (valid while n > 0) */
  unsigned n;
  gpumem__block *b[GPUMEM__TC_BIN_CAP];
} gpumem__tc_bin;

typedef struct gpumem__tc {
  atomic_int busy;             /* the spinlock */
  int dev;                     /* key: device of pool */
  gpumem_context *ctx;         /* key; NULL = detached */
  gpumem_stream stream;        /* key */
  gpumem__pool *pool;
  gpumem__tc_acct acct;        /* cached bytes, headroom (see internal.h); cached == 0 iff no block cached */
  int64_t d_req;               /* counters not yet in the pool's statistics (live = allocs - frees) */
  uint64_t d_allocs, d_frees;
  unsigned misses;
  struct gpumem__tc *prev, *next; /* g_reg list */
  gpumem__tc_bin bins[GPUMEM__TC_BINS];
} gpumem__tc;

/* This thread's cache (NULL until its first call, or after its destructor ran).
 * Not initial-exec: the shared library is dlopen()ed (Python, ctypes), and
 * an initial-exec access makes the loader place all of the library's TLS
 * (cudart_static's too) in the static TLS block, which fails ("cannot
 * allocate memory in static TLS block"). Where the compiler has it, the
 * library is built with TLS descriptors (-mtls-dialect=gnu2, src/CMakeLists.txt),
 * which make this access cheap without that constraint. */
extern _Thread_local gpumem__tc *gpumem__tls_tc;

void gpumem__tc_lock_slow(gpumem__tc *c);

static inline void gpumem__tc_lock(gpumem__tc *c) {
  if (GPUMEM__LIKELY(atomic_exchange_explicit(&c->busy, 1, memory_order_acquire) == 0)) return;
  gpumem__tc_lock_slow(c);
}
static inline void gpumem__tc_unlock(gpumem__tc *c) { atomic_store_explicit(&c->busy, 0, memory_order_release); }

static inline gpumem__tc_bin *gpumem__tc_bin_of(gpumem__tc *c, size_t bsize) {
  return &c->bins[(uint32_t)((bsize >> 8) * 0x9E3779B1u) >> 27];
}

/* Take a block of bin bn for a request of size (tag): live again. Cache lock held, bn->n > 0.
 * The caller accounts the headroom. */
static inline gpumem__block *gpumem__tc_pop(gpumem__tc *c, gpumem__tc_bin *bn, size_t size, const char *tag) {
  gpumem__block *b = bn->b[--bn->n];
  b->requested = size;
  b->tag = tag;
  /* live again: a free or gpumem_ptr_info that sees the cleared mark sees the fields above */
  atomic_store_explicit(&b->tc_cached, 0, memory_order_release);
  c->misses = 0;
  c->acct.cached -= b->size;
  c->d_req += (int64_t)size;
  c->d_allocs++;
  return b;
}

/* 1 and *out set: served from this thread's cache. 0: nothing changed, take the full path. */
static inline int gpumem__tc_fast_alloc(gpumem_context *ctx, int dev, size_t size, gpumem_stream stream,
                                        const char *tag, void **out) {
  gpumem__tc *c = gpumem__tls_tc;
  if (GPUMEM__UNLIKELY(c == NULL) || GPUMEM__UNLIKELY(size > GPUMEM__TC_MAX_SIZE)) return 0;
  size_t rsize = (size + 255) & ~(size_t)255;
  gpumem__tc_lock(c);
  gpumem__tc_bin *bn = gpumem__tc_bin_of(c, rsize);
  if (GPUMEM__LIKELY(c->ctx == ctx && c->dev == dev && c->stream == stream && bn->n > 0 && bn->size == rsize &&
                     rsize <= c->acct.headroom)) {
    gpumem__block *b = gpumem__tc_pop(c, bn, size, tag);
    c->acct.headroom -= rsize;
    gpumem__tc_unlock(c);
    *out = (void *)b->addr;
    return 1;
  }
  gpumem__tc_unlock(c);
  return 0;
}

/* 1: freed into this thread's cache. 0: nothing changed, take the full path. */
static inline int gpumem__tc_fast_free(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  gpumem__tc *c = gpumem__tls_tc;
  if (GPUMEM__UNLIKELY(c == NULL)) return 0;
  uintptr_t key = (uintptr_t)ptr;
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = &ctx->map.shards[h & (GPUMEM__PTRMAP_SHARDS - 1)];
  gpumem__tc_lock(c);
  if (GPUMEM__UNLIKELY(c->ctx != ctx || c->stream != stream)) goto miss;
  gpumem__ptrmap_lock(s);
  gpumem__ptrmap_entry *e = gpumem__ptrmap_find(s, key, h);
  if (GPUMEM__UNLIKELY(e == NULL)) goto miss_shard;
  gpumem__block *b = e->block;
  size_t bsize = b->size;
  gpumem__tc_bin *bn = gpumem__tc_bin_of(c, bsize);
  if (GPUMEM__UNLIKELY(e->pool != c->pool || bsize > GPUMEM__TC_MAX_SIZE ||
                       c->acct.cached + bsize > GPUMEM__TC_MAX_BYTES || bn->n >= GPUMEM__TC_BIN_CAP ||
                       (bn->n > 0 && bn->size != bsize) ||
                       atomic_load_explicit(&b->tc_cached, memory_order_acquire) != 0))
    goto miss_shard;
  atomic_store_explicit(&b->tc_cached, 1, memory_order_relaxed); /* the ownership step; the shard lock orders it */
  gpumem__ptrmap_unlock(s);
  bn->size = bsize;
  bn->b[bn->n++] = b;
  c->misses = 0;
  c->acct.cached += bsize;
  c->acct.headroom += bsize;
  c->d_req -= (int64_t)b->requested;
  c->d_frees++;
  gpumem__tc_unlock(c);
  return 1;
miss_shard:
  gpumem__ptrmap_unlock(s);
miss:
  gpumem__tc_unlock(c);
  return 0;
}

#endif
