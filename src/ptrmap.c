/* ptrmap.c: the context-wide pointer index (ptrmap.h), pure look-ups: it reads
 * the blocks it points to and calls nothing above it. Every live block is here, keyed
 * by its address; gpumem_free() validates its pointer against it, so a
 * foreign, interior or already-freed pointer is rejected without changing
 * anything. 64 shards, each an open-addressing table (linear probing,
 * backward-shift deletion) under its own spinlock.
 *
 * Blocks in a thread cache keep their entry with an odd block->state: to
 * every look-up they are absent (a free of one is a double free), and
 * handing one out again is a single store by its cache's owner, no index
 * operation. A free claims a live (even) block with a compare-and-swap on
 * its state: here under the shard lock (even -> even + 2, then the entry
 * goes), or in a thread cache without the index (even -> odd, tcache.h);
 * of two claimants exactly one wins. Odd -> even only by the cache owner
 * under its cache lock (a hit), or when a flush removes the entry. */
#include "internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

void gpumem__ptrmap_lock_slow(gpumem__ptrmap_shard *s) {
  for (;;) {
    for (int i = 0; i < 64; i++)
      if (atomic_load_explicit(&s->lock, memory_order_relaxed) == 0 &&
          atomic_exchange_explicit(&s->lock, 1, memory_order_acquire) == 0)
        return;
    sched_yield();
  }
}

int gpumem__ptrmap_init(gpumem__ptrmap *m) {
  for (int i = 0; i < GPUMEM__PTRMAP_SHARDS; i++) {
    gpumem__ptrmap_shard *s = &m->shards[i];
    s->cap = 0;
    s->count = 0;
    s->slots = NULL;
    atomic_init(&s->lock, 0);
  }
  return 0;
}

void gpumem__ptrmap_destroy(gpumem__ptrmap *m) {
  for (int i = 0; i < GPUMEM__PTRMAP_SHARDS; i++) {
    free(m->shards[i].slots);
    m->shards[i].slots = NULL;
  }
}

static int grow(gpumem__ptrmap_shard *s) {
  gpumem__ptrmap_entry *ns = gpumem__ht_doubled(s->slots, &s->cap, 64, sizeof *ns, gpumem__ptrmap_entry_key,
                                                gpumem__ptrmap_key_home);
  if (ns == NULL) return -1;
  s->slots = ns;
  return 0;
}

/* keep load <= 1/2 */
static inline int need_grow(const gpumem__ptrmap_shard *s) { return (s->count + 1) * 2 > s->cap; }

int gpumem__ptrmap_insert(gpumem__ptrmap *m, uintptr_t key, gpumem__block *b, gpumem__pool *pool) {
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = gpumem__ptrmap_shard_of(m, h);
  gpumem__ptrmap_lock(s);
  if (need_grow(s) && grow(s) != 0) {
    gpumem__ptrmap_unlock(s);
    return -1;
  }
  size_t i = gpumem__ht_slot_for(s->slots, sizeof *s->slots, s->cap - 1, gpumem__ptrmap_home(s, h), key,
                                 gpumem__ptrmap_entry_key);
  if (s->slots[i].key == 0) s->count++;
  s->slots[i].key = key;
  s->slots[i].block = b;
  s->slots[i].pool = pool;
  gpumem__ptrmap_unlock(s);
  return 0;
}

/* Index of key in s, or SIZE_MAX. Caller holds the lock. */
static size_t find(gpumem__ptrmap_shard *s, uintptr_t key, uint64_t h) {
  gpumem__ptrmap_entry *e = gpumem__ptrmap_find(s, key, h);
  return e == NULL ? SIZE_MAX : (size_t)(e - s->slots);
}

/* Claim a live block for a free: even -> even + 2, so that a thread cache
 * remembering the value cannot claim it too. 0 when it is cached, or a
 * thread cache claimed it first. Shard lock held. */
static inline int claim_live(gpumem__block *b) {
  uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
  return (s & 1u) == 0 &&
         atomic_compare_exchange_strong_explicit(&b->state, &s, s + 2, memory_order_acq_rel, memory_order_acquire);
}

gpumem__pool *gpumem__ptrmap_pool(gpumem__ptrmap *m, uintptr_t key) {
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = gpumem__ptrmap_shard_of(m, h);
  gpumem__ptrmap_lock(s);
  size_t i = find(s, key, h);
  gpumem__pool *p = i == SIZE_MAX || gpumem__block_cached(s->slots[i].block) ? NULL : s->slots[i].pool;
  gpumem__ptrmap_unlock(s);
  return p;
}

/* Remove slot i of s (backward-shift deletion); returns its block. Caller holds the lock. */
static gpumem__block *remove_at(gpumem__ptrmap_shard *s, size_t i);

gpumem__block *gpumem__ptrmap_remove(gpumem__ptrmap *m, uintptr_t key, gpumem__pool *pool, int any) {
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = gpumem__ptrmap_shard_of(m, h);
  gpumem__ptrmap_lock(s);
  size_t i = find(s, key, h);
  if (i == SIZE_MAX || s->slots[i].pool != pool || (!any && !claim_live(s->slots[i].block))) {
    gpumem__ptrmap_unlock(s);
    return NULL;
  }
  gpumem__block *b = remove_at(s, i);
  if (any) {
    /* a cached block (flush) or any block of a reset: on to the next even value; no thread
     * cache claims meanwhile (the caller holds its cache lock, or every cache lock) */
    uint64_t st = atomic_load_explicit(&b->state, memory_order_relaxed);
    atomic_store_explicit(&b->state, (st | 1u) + 1u, memory_order_release);
  }
  gpumem__ptrmap_unlock(s);
  return b;
}

static gpumem__block *remove_at(gpumem__ptrmap_shard *s, size_t i) {
  gpumem__block *b = s->slots[i].block;
  gpumem__ht_delete(s->slots, sizeof *s->slots, s->cap - 1, i, gpumem__ptrmap_entry_key, gpumem__ptrmap_key_home);
  s->count--;
  return b;
}

void gpumem__ptrmap_erase_locked(gpumem__ptrmap_shard *s, gpumem__ptrmap_entry *e) {
  (void)remove_at(s, (size_t)(e - s->slots));
}

int gpumem__ptrmap_info(gpumem__ptrmap *m, uintptr_t key, size_t *requested, gpumem__pool **pool) {
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = gpumem__ptrmap_shard_of(m, h);
  gpumem__ptrmap_lock(s);
  size_t i = find(s, key, h);
  if (i == SIZE_MAX || gpumem__block_cached(s->slots[i].block)) {
    gpumem__ptrmap_unlock(s);
    return -1;
  }
  /* the block is live while its entry exists, and entries only go away under this lock */
  size_t r = s->slots[i].block->requested;
  gpumem__pool *p = s->slots[i].pool;
  gpumem__ptrmap_unlock(s);
  if (requested != NULL) *requested = r;
  if (pool != NULL) *pool = p;
  return 0;
}

int gpumem__ptrmap_contains(gpumem__ptrmap *m, uintptr_t key, const gpumem__block *b, const gpumem__pool *pool) {
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = gpumem__ptrmap_shard_of(m, h);
  gpumem__ptrmap_lock(s);
  size_t i = find(s, key, h);
  int ok = i != SIZE_MAX && s->slots[i].block == b && s->slots[i].pool == pool;
  gpumem__ptrmap_unlock(s);
  return ok;
}

size_t gpumem__ptrmap_count_pool(gpumem__ptrmap *m, const gpumem__pool *pool) {
  size_t n = 0;
  for (int k = 0; k < GPUMEM__PTRMAP_SHARDS; k++) {
    gpumem__ptrmap_shard *s = &m->shards[k];
    gpumem__ptrmap_lock(s);
    for (size_t i = 0; i < s->cap; i++)
      if (s->slots[i].key != 0 && s->slots[i].pool == pool) n++;
    gpumem__ptrmap_unlock(s);
  }
  return n;
}
