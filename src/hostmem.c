/* hostmem.c: the core's host memory. Every allocation of the core goes through these wrappers, so
 * that a test can make the host run out at any one of them (tests/test_hostmem_oom.c walks every
 * allocation of an operation in turn, as SQLite's malloc tests do). The backends and the tools use
 * the C library's own: a simulated device's memory is not the core's host memory.
 *
 * Disarmed (always, outside tests) a wrapper costs one relaxed load; none is on an allocation's
 * fast path (block structs come in slabs, records and tables are kept and reused). */
#include "internal.h"

#include <stdlib.h>

/* -1: disarmed; else how many more allocations succeed before the next fails */
static _Atomic int64_t hf_left = -1;
static _Atomic int hf_persist;
static _Atomic uint64_t hf_failed;

static int host_fault(void) {
  int64_t left = atomic_load_explicit(&hf_left, memory_order_relaxed);
  if (GPUMEM__LIKELY(left < 0)) return 0;
  for (;;) {
    if (left < 0) return 0;
    if (left > 0) {
      if (atomic_compare_exchange_weak_explicit(&hf_left, &left, left - 1, memory_order_relaxed, memory_order_relaxed))
        return 0;
      continue;
    }
    /* this one fails; after it, all the others too (persist) or none */
    if (atomic_load_explicit(&hf_persist, memory_order_relaxed) ||
        atomic_compare_exchange_strong_explicit(&hf_left, &left, -1, memory_order_relaxed, memory_order_relaxed)) {
      atomic_fetch_add_explicit(&hf_failed, 1, memory_order_relaxed);
      return 1;
    }
  }
}

void *gpumem__malloc(size_t n) { return host_fault() ? NULL : malloc(n); }

void *gpumem__calloc(size_t n, size_t size) { return host_fault() ? NULL : calloc(n, size); }

void *gpumem__realloc(void *p, size_t n) { return host_fault() ? NULL : realloc(p, n); }

void *gpumem__aligned_alloc(size_t align, size_t n) { return host_fault() ? NULL : aligned_alloc(align, n); }

void gpumem__host_fault_arm(uint64_t after, int persist) {
  atomic_store_explicit(&hf_persist, persist != 0, memory_order_relaxed);
  atomic_store_explicit(&hf_failed, 0, memory_order_relaxed);
  atomic_store_explicit(&hf_left, after > INT64_MAX ? INT64_MAX : (int64_t)after, memory_order_relaxed);
}

void gpumem__host_fault_clear(void) { atomic_store_explicit(&hf_left, -1, memory_order_relaxed); }

uint64_t gpumem__host_fault_count(void) { return atomic_load_explicit(&hf_failed, memory_order_relaxed); }
