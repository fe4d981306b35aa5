/*
 * ptrmap.h: the pointer index (ptrmap.c), pure look-ups: a sharded open-addressing hash,
 * pointer -> (block, pool). It reads the blocks it points to (their state, their requested
 * size) and never calls the pool; the callers (the pool, the thread caches, the entry points)
 * call it. The look-up pieces are inline for the hot paths (tcache.h). Included by internal.h
 * (after GPUMEM__LIKELY), whose files all see it.
 */
#ifndef GPUMEM_PTRMAP_H
#define GPUMEM_PTRMAP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hashtab.h"

typedef struct gpumem__pool gpumem__pool;
typedef struct gpumem__block gpumem__block;

#define GPUMEM__PTRMAP_SHARDS 64

typedef struct gpumem__ptrmap_entry {
  uintptr_t key;          /* 0 = empty */
  gpumem__block *block;
  gpumem__pool *pool;
} gpumem__ptrmap_entry;

typedef struct gpumem__ptrmap_shard {
  atomic_int lock;        /* spinlock (ptrmap.c) */
  size_t cap;             /* power of two, or 0 */
  size_t count;
  gpumem__ptrmap_entry *slots;
  char pad_[64];
} gpumem__ptrmap_shard;

typedef struct gpumem__ptrmap {
  gpumem__ptrmap_shard shards[GPUMEM__PTRMAP_SHARDS];
} gpumem__ptrmap;

/* The look-up pieces, inline for the hot paths (tcache.h); ptrmap.c uses them too. */
static inline uint64_t gpumem__ptrmap_hash(uintptr_t key) {
  uint64_t x = (uint64_t)key >> 8; /* pointers are 256-aligned */
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return x;
}
/* The shard of hash h: the low bits (gpumem__ptrmap_home uses the high ones). */
static inline gpumem__ptrmap_shard *gpumem__ptrmap_shard_of(gpumem__ptrmap *m, uint64_t h) {
  return &m->shards[h & (GPUMEM__PTRMAP_SHARDS - 1)];
}
void gpumem__ptrmap_lock_slow(gpumem__ptrmap_shard *s);
/* Shard lock: a spinlock (exchange to take, release-store to give back, yield
 * after a few spins); held only for a probe, never across another lock. */
static inline void gpumem__ptrmap_lock(gpumem__ptrmap_shard *s) {
  if (GPUMEM__LIKELY(atomic_exchange_explicit(&s->lock, 1, memory_order_acquire) == 0)) return;
  gpumem__ptrmap_lock_slow(s);
}
static inline void gpumem__ptrmap_unlock(gpumem__ptrmap_shard *s) {
  atomic_store_explicit(&s->lock, 0, memory_order_release);
}
/* Slot position within the shard: the high bits (the low bits chose the shard). */
static inline size_t gpumem__ptrmap_home(const gpumem__ptrmap_shard *s, uint64_t h) {
  return (size_t)(h >> 6) & (s->cap - 1);
}
/* The table's two functions for hashtab.h: an entry's key (0 = empty) and a key's home slot. */
static inline uintptr_t gpumem__ptrmap_entry_key(const void *e) { return ((const gpumem__ptrmap_entry *)e)->key; }
static inline size_t gpumem__ptrmap_key_home(uintptr_t key, size_t mask) {
  return (size_t)(gpumem__ptrmap_hash(key) >> 6) & mask;
}
/* key's entry in s or NULL; shard lock held. */
static inline gpumem__ptrmap_entry *gpumem__ptrmap_find(gpumem__ptrmap_shard *s, uintptr_t key, uint64_t h) {
  if (GPUMEM__UNLIKELY(s->cap == 0)) return NULL;
  size_t mask = s->cap - 1;
  size_t i = gpumem__ht_find(s->slots, sizeof *s->slots, mask, (size_t)(h >> 6) & mask, key, gpumem__ptrmap_entry_key);
  return GPUMEM__LIKELY(i != SIZE_MAX) ? &s->slots[i] : NULL;
}

int gpumem__ptrmap_init(gpumem__ptrmap *m);
void gpumem__ptrmap_destroy(gpumem__ptrmap *m);
/** Insert; 0 on success, -1 on host out-of-memory (nothing changed). */
int gpumem__ptrmap_insert(gpumem__ptrmap *m, uintptr_t key, gpumem__block *b, gpumem__pool *pool);
/** Find the pool of key; returns NULL when absent. */
gpumem__pool *gpumem__ptrmap_pool(gpumem__ptrmap *m, uintptr_t key);
/** Remove key when it maps to pool and its block is live (any = 1: or in a thread cache); returns the block or NULL. */
gpumem__block *gpumem__ptrmap_remove(gpumem__ptrmap *m, uintptr_t key, gpumem__pool *pool, int any);
/** Remove entry e of shard s (found with gpumem__ptrmap_find; shard lock held). The block's state is the caller's. */
void gpumem__ptrmap_erase_locked(gpumem__ptrmap_shard *s, gpumem__ptrmap_entry *e);
/** Look key up and copy out the requested size and the pool of its live block. 0 if found. */
int gpumem__ptrmap_info(gpumem__ptrmap *m, uintptr_t key, size_t *requested, gpumem__pool **pool);
/** 1 if key maps to exactly (block, pool). */
int gpumem__ptrmap_contains(gpumem__ptrmap *m, uintptr_t key, const gpumem__block *b, const gpumem__pool *pool);
/** Number of entries mapping to pool. */
size_t gpumem__ptrmap_count_pool(gpumem__ptrmap *m, const gpumem__pool *pool);

#endif /* GPUMEM_PTRMAP_H */
