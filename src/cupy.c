/* cupy.c: the framework entry points for CuPy's CFunctionAllocator
 * (gpumem_cupy_malloc/free), on a given context or the process-wide one (global.c).
 *
 * CuPy's free names no stream, but a block must be freed in order on the stream it
 * was allocated for (else another stream could reuse it while work queued on the
 * first still uses it). The stream of each live block allocated for a stream other
 * than the default one is kept here, in one process-wide map (pointer -> stream):
 * live device pointers are unique in the process, whichever context holds them.
 * Allocations for the default stream, CuPy's usual case, touch the map only while
 * it holds anything (to drop a stale entry a forced destroy left at that address).
 *
 * Errors are raised in Python through the interpreter's own functions, whose
 * addresses the caller put in the parameter block (gpumem.h): no Python header here.
 */
#include "internal.h"
#include "hashtab.h"

#include <stdlib.h>

typedef struct cupy_slot {
  uintptr_t key; /* 0 = empty */
  gpumem_stream stream;
} cupy_slot;

static pthread_mutex_t cupy_lock = PTHREAD_MUTEX_INITIALIZER;
static cupy_slot *cupy_slots;
static size_t cupy_cap;          /* power of two, or 0 */
static _Atomic size_t cupy_count; /* read without the lock for the "map is empty" test */

static uintptr_t cupy_key(const void *slot) { return ((const cupy_slot *)slot)->key; }

static size_t cupy_hash(uintptr_t k, size_t mask) {
  uint64_t x = (uint64_t)k;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & mask;
}

/* Remove ptr's entry (under the lock); returns 1 and its stream when there was one. */
static int map_take_locked(uintptr_t key, gpumem_stream *stream) {
  if (cupy_cap == 0) return 0;
  size_t mask = cupy_cap - 1;
  size_t i = gpumem__ht_find(cupy_slots, sizeof *cupy_slots, mask, cupy_hash(key, mask), key, cupy_key);
  if (i == SIZE_MAX) return 0;
  *stream = cupy_slots[i].stream;
  gpumem__ht_delete(cupy_slots, sizeof *cupy_slots, mask, i, cupy_key, cupy_hash);
  atomic_fetch_sub_explicit(&cupy_count, 1, memory_order_relaxed);
  return 1;
}

static int map_take(uintptr_t key, gpumem_stream *stream) {
  if (atomic_load_explicit(&cupy_count, memory_order_relaxed) == 0) return 0;
  pthread_mutex_lock(&cupy_lock);
  int found = map_take_locked(key, stream);
  pthread_mutex_unlock(&cupy_lock);
  return found;
}

/* Insert or overwrite; -1 on host out-of-memory (the map is unchanged then). */
static int map_put(uintptr_t key, gpumem_stream stream) {
  pthread_mutex_lock(&cupy_lock);
  size_t n = atomic_load_explicit(&cupy_count, memory_order_relaxed);
  if ((n + 1) * 2 > cupy_cap) {
    size_t ncap = cupy_cap ? cupy_cap * 2 : 256;
    cupy_slot *ns = gpumem__ht_grown(cupy_slots, cupy_cap, ncap, sizeof *ns, cupy_key, cupy_hash);
    if (ns == NULL) {
      pthread_mutex_unlock(&cupy_lock);
      return -1;
    }
    free(cupy_slots);
    cupy_slots = ns;
    cupy_cap = ncap;
  }
  size_t mask = cupy_cap - 1;
  size_t i = gpumem__ht_slot_for(cupy_slots, sizeof *cupy_slots, mask, cupy_hash(key, mask), key, cupy_key);
  if (cupy_slots[i].key == 0) atomic_fetch_add_explicit(&cupy_count, 1, memory_order_relaxed);
  cupy_slots[i].key = key;
  cupy_slots[i].stream = stream;
  pthread_mutex_unlock(&cupy_lock);
  return 0;
}

static const gpumem_cupy_allocator *param_of(void *param) {
  const gpumem_cupy_allocator *a = param;
  if (a == NULL || a->struct_size != sizeof *a) return NULL;
  return a;
}

static gpumem_context *ctx_of(const gpumem_cupy_allocator *a, gpumem_status *st) {
  gpumem_context *ctx = a->ctx;
  *st = GPUMEM_OK;
  if (ctx == NULL) *st = gpumem_global_context(&ctx);
  return *st == GPUMEM_OK ? ctx : NULL;
}

/* Let the caller's on_error raise; NULL for the allocation either way. */
static void *fail(const gpumem_cupy_allocator *a, size_t size, int device, gpumem_status st) {
  if (a != NULL && a->py_call != NULL && a->on_error != NULL) {
    /* "n": Py_ssize_t; CuPy's sizes are Py_ssize_t, so the cast keeps them */
    void *r = a->py_call(a->on_error, "nii", (ptrdiff_t)size, device, (int)st);
    if (r != NULL && a->py_decref != NULL) a->py_decref(r); /* returned instead of raising: NULL all the same */
  }
  return NULL;
}

void *gpumem_cupy_malloc(void *param, size_t size, int device) {
  const gpumem_cupy_allocator *a = param_of(param);
  if (a == NULL) return NULL; /* nothing to raise through */
  if (size == 0) return NULL;
  gpumem_status st;
  gpumem_context *ctx = ctx_of(a, &st);
  if (ctx == NULL) return fail(a, size, device, st);
  gpumem_stream stream = NULL;
  if (a->stream_of != NULL) {
    intptr_t s = a->stream_of(device);
    if (s == -1) return NULL; /* stream_of has raised */
    stream = (gpumem_stream)s;
  }
  void *p = NULL;
  st = gpumem_alloc(ctx, device, size, stream, &p);
  if (st != GPUMEM_OK) return fail(a, size, device, st);
  if (stream != NULL) {
    if (map_put((uintptr_t)p, stream) != 0) {
      (void)gpumem_free(ctx, p, stream);
      return fail(a, size, device, GPUMEM_ERR_OUT_OF_MEMORY);
    }
  } else {
    gpumem_stream stale;
    (void)map_take((uintptr_t)p, &stale);
  }
  return p;
}

void gpumem_cupy_free(void *param, void *ptr, int device) {
  (void)device;
  const gpumem_cupy_allocator *a = param_of(param);
  if (a == NULL || ptr == NULL) return;
  gpumem_stream stream = NULL;
  (void)map_take((uintptr_t)ptr, &stream);
  gpumem_context *ctx = a->ctx != NULL ? a->ctx : gpumem__global_context_if_created();
  if (ctx == NULL) return; /* nothing was ever allocated through the process-wide context */
  (void)gpumem_free(ctx, ptr, stream);
}
