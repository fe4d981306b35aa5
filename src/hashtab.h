/*
 * hashtab.h: linear-probing open addressing over a caller's array, the pieces every table of
 * the core shares (the pointer index ptrmap.c, the trace's live map trace.c, the CuPy maps cupy.c).
 *
 * The caller owns the array (cap slots of esize bytes, cap a power of two, mask = cap - 1),
 * its load (at most 1/2, so that a probe always meets an empty slot) and when it grows
 * (gpumem__ht_doubled). A slot is empty when its key is 0, and an all-zero slot is empty. Two
 * functions describe the table:
 *   key(slot)        the slot's key, 0 when empty
 *   home(key, mask)  the slot the key's probe starts at
 * Deletion is by backward shift, so probe chains stay intact without tombstones.
 *
 * Everything is static inline and the functions are passed as constants, so that each table
 * compiles to its own loops (the pointer index's look-up is on the hot path).
 */
#ifndef GPUMEM_HASHTAB_H
#define GPUMEM_HASHTAB_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *gpumem__calloc(size_t n, size_t size); /* hostmem.c (internal.h includes this file) */

#if defined(__GNUC__) || defined(__clang__)
#  define GPUMEM__HT_LIKELY(x) __builtin_expect(!!(x), 1)
#else
#  define GPUMEM__HT_LIKELY(x) (x)
#endif

typedef uintptr_t (*gpumem__ht_key_fn)(const void *slot);
typedef size_t (*gpumem__ht_home_fn)(uintptr_t key, size_t mask);

#define GPUMEM__HT_SLOT(slots, esize, i) ((char *)(slots) + (size_t)(i) * (esize))

/** The slot holding key (not 0), probing from slot i (its home), or SIZE_MAX when absent. */
static inline size_t gpumem__ht_find(const void *slots, size_t esize, size_t mask, size_t i, uintptr_t key,
                                     gpumem__ht_key_fn keyf) {
  for (;;) {
    uintptr_t k = keyf((const char *)slots + i * esize);
    if (GPUMEM__HT_LIKELY(k == key)) return i;
    if (k == 0) return SIZE_MAX;
    i = (i + 1) & mask;
  }
}

/** The slot for key (not 0), probing from slot i (its home): the one holding it, else the empty one where it goes. */
static inline size_t gpumem__ht_slot_for(const void *slots, size_t esize, size_t mask, size_t i, uintptr_t key,
                                         gpumem__ht_key_fn keyf) {
  for (;;) {
    uintptr_t k = keyf((const char *)slots + i * esize);
    if (k == 0 || k == key) return i;
    i = (i + 1) & mask;
  }
}

/** Empty slot i (occupied) by backward shift: each later slot of the chain whose home is not cyclically in
 *  (hole, slot] moves into the hole; the last hole is zeroed. */
static inline void gpumem__ht_delete(void *slots, size_t esize, size_t mask, size_t i, gpumem__ht_key_fn keyf,
                                     gpumem__ht_home_fn homef) {
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    uintptr_t kj = keyf(GPUMEM__HT_SLOT(slots, esize, j));
    if (kj == 0) break;
    size_t k = homef(kj, mask);
    if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
      memcpy(GPUMEM__HT_SLOT(slots, esize, i), GPUMEM__HT_SLOT(slots, esize, j), esize);
      i = j;
    }
  }
  memset(GPUMEM__HT_SLOT(slots, esize, i), 0, esize);
}

/** Double the table (to `first` slots when it has none): a new all-zero array with old's occupied slots
 *  rehashed into it, old freed and *cap updated; NULL on host out-of-memory, with old and *cap unchanged. */
static inline void *gpumem__ht_doubled(void *old, size_t *cap, size_t first, size_t esize, gpumem__ht_key_fn keyf,
                                       gpumem__ht_home_fn homef) {
  const size_t ocap = *cap, ncap = ocap ? ocap * 2 : first, mask = ncap - 1;
  void *ns = gpumem__calloc(ncap, esize);
  if (ns == NULL) return NULL;
  for (size_t i = 0; i < ocap; i++) {
    const void *s = (const char *)old + i * esize;
    uintptr_t k = keyf(s);
    if (k == 0) continue;
    size_t j = gpumem__ht_slot_for(ns, esize, mask, homef(k, mask), k, keyf);
    memcpy(GPUMEM__HT_SLOT(ns, esize, j), s, esize);
  }
  free(old);
  *cap = ncap;
  return ns;
}

#endif /* GPUMEM_HASHTAB_H */
