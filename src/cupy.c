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
 * A block is freed on its stream, so that stream must still exist then: CuPy destroys a
 * Stream when its object goes, and arrays allocated on it may outlive it; CUDA does not
 * check the stream handles it is given (a call naming a destroyed stream reads freed
 * memory and crashed on an H200). With the caller's on_stream, the library holds a
 * reference to the object owning each stream other than the default ones (1, 2: the
 * legacy and per-thread default streams, never destroyed) while memory allocated on it
 * lives: the stream is destroyed after the last such free, not before (a second table:
 * stream -> object, live blocks). A hold whose last block is freed is parked, not let go:
 * asking Python for the object costs about a microsecond, which a loop allocating one
 * array at a time on a stream would pay at every allocation. At most CUPY_PARKED holds stay
 * parked (the oldest goes first); gpumem_cupy_release_streams() lets go of all of them.
 *
 * Errors are raised in Python through the interpreter's own functions, whose
 * addresses the caller put in the parameter block (gpumem.h): no Python header here.
 */
#include "internal.h"
#include "hashtab.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct cupy_slot {
  uintptr_t key; /* 0 = empty */
  gpumem_stream stream;
  int held; /* the block counts in its stream's hold (the hold table, next) */
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

/* ---- streams held while memory allocated on them lives ---- */

typedef struct hold_slot {
  uintptr_t key; /* the stream; 0 = empty */
  void *obj;     /* the reference on_stream returned */
  size_t n;      /* live blocks allocated on it */
} hold_slot;

static hold_slot *hold_slots; /* under cupy_lock */
static size_t hold_cap, hold_count;

static uintptr_t hold_key(const void *slot) { return ((const hold_slot *)slot)->key; }

/* A stream that is never destroyed, or none: nothing to hold. */
static int stream_lasts(gpumem_stream s) { return (uintptr_t)s <= 2; }

/* Holds with no live block, oldest first: kept so that the next allocation on their stream calls no
 * Python code. Bounded, since each keeps a dropped stream from being destroyed. */
#define CUPY_PARKED 8
static uintptr_t parked[CUPY_PARKED];
static size_t parked_count;

static void unpark_locked(uintptr_t s) {
  for (size_t k = 0; k < parked_count; k++)
    if (parked[k] == s) {
      memmove(&parked[k], &parked[k + 1], (parked_count - k - 1) * sizeof *parked);
      parked_count--;
      return;
    }
}

/* Remove s's hold (parked); its object, to let go. Lock held. */
static void *hold_drop_locked(uintptr_t s) {
  size_t mask = hold_cap - 1;
  size_t i = gpumem__ht_find(hold_slots, sizeof *hold_slots, mask, cupy_hash(s, mask), s, hold_key);
  if (i == SIZE_MAX) return NULL;
  void *obj = hold_slots[i].obj;
  gpumem__ht_delete(hold_slots, sizeof *hold_slots, mask, i, hold_key, cupy_hash);
  hold_count--;
  return obj;
}

/* Remove the oldest parked hold; its object, to let go (NULL when none is parked). Lock held. */
static void *drop_oldest_parked_locked(void) {
  if (parked_count == 0) return NULL;
  void *obj = hold_drop_locked(parked[0]);
  unpark_locked(parked[0]);
  return obj;
}

/* One more block on s: 1 when s is held (its count raised, a parked hold taken up again), 0 when
 * not held yet. Lock held. */
static int hold_more_locked(uintptr_t s) {
  if (hold_cap == 0) return 0;
  size_t mask = hold_cap - 1;
  size_t i = gpumem__ht_find(hold_slots, sizeof *hold_slots, mask, cupy_hash(s, mask), s, hold_key);
  if (i == SIZE_MAX) return 0;
  if (hold_slots[i].n++ == 0) unpark_locked(s);
  return 1;
}

/* Hold obj for s with one block; -1 on host out-of-memory. Lock held; s not held. */
static int hold_add_locked(uintptr_t s, void *obj) {
  if ((hold_count + 1) * 2 > hold_cap) {
    hold_slot *ns = gpumem__ht_doubled(hold_slots, &hold_cap, 16, sizeof *ns, hold_key, cupy_hash);
    if (ns == NULL) return -1;
    hold_slots = ns;
  }
  size_t mask = hold_cap - 1;
  size_t i = gpumem__ht_slot_for(hold_slots, sizeof *hold_slots, mask, cupy_hash(s, mask), s, hold_key);
  hold_slots[i].key = s;
  hold_slots[i].obj = obj;
  hold_slots[i].n = 1;
  hold_count++;
  return 0;
}

/* One block fewer on s. At its last, s's hold is parked; the object to let go is that of the oldest
 * parked hold when there are more than CUPY_PARKED, else NULL. Lock held. */
static void *hold_less_locked(uintptr_t s) {
  if (hold_cap == 0) return NULL;
  size_t mask = hold_cap - 1;
  size_t i = gpumem__ht_find(hold_slots, sizeof *hold_slots, mask, cupy_hash(s, mask), s, hold_key);
  if (i == SIZE_MAX || --hold_slots[i].n != 0) return NULL;
  void *gone = parked_count == CUPY_PARKED ? drop_oldest_parked_locked() : NULL;
  parked[parked_count++] = s;
  return gone;
}

/* Remove ptr's entry (under the lock); returns 1 and its stream when there was one, and in *gone the
 * stream's object to let go when the block was the last of its stream's hold (else NULL). */
static int map_take_locked(uintptr_t key, gpumem_stream *stream, void **gone) {
  if (cupy_cap == 0) return 0;
  size_t mask = cupy_cap - 1;
  size_t i = gpumem__ht_find(cupy_slots, sizeof *cupy_slots, mask, cupy_hash(key, mask), key, cupy_key);
  if (i == SIZE_MAX) return 0;
  *stream = cupy_slots[i].stream;
  if (cupy_slots[i].held) *gone = hold_less_locked((uintptr_t)cupy_slots[i].stream);
  gpumem__ht_delete(cupy_slots, sizeof *cupy_slots, mask, i, cupy_key, cupy_hash);
  atomic_fetch_sub_explicit(&cupy_count, 1, memory_order_relaxed);
  return 1;
}

static int map_take(uintptr_t key, gpumem_stream *stream, void **gone) {
  if (atomic_load_explicit(&cupy_count, memory_order_relaxed) == 0) return 0;
  pthread_mutex_lock(&cupy_lock);
  int found = map_take_locked(key, stream, gone);
  pthread_mutex_unlock(&cupy_lock);
  return found;
}

/* Insert or overwrite; an entry overwritten (a block a forced destroy left at that address) leaves its
 * stream's hold, and *gone is the object to let go if that was the hold's last block. -1 on host
 * out-of-memory (the map is unchanged then). */
static int map_put(uintptr_t key, gpumem_stream stream, int held, void **gone) {
  pthread_mutex_lock(&cupy_lock);
  size_t n = atomic_load_explicit(&cupy_count, memory_order_relaxed);
  if ((n + 1) * 2 > cupy_cap) {
    cupy_slot *ns = gpumem__ht_doubled(cupy_slots, &cupy_cap, 256, sizeof *ns, cupy_key, cupy_hash);
    if (ns == NULL) {
      pthread_mutex_unlock(&cupy_lock);
      return -1;
    }
    cupy_slots = ns;
  }
  size_t mask = cupy_cap - 1;
  size_t i = gpumem__ht_slot_for(cupy_slots, sizeof *cupy_slots, mask, cupy_hash(key, mask), key, cupy_key);
  if (cupy_slots[i].key == 0) atomic_fetch_add_explicit(&cupy_count, 1, memory_order_relaxed);
  else if (cupy_slots[i].held) *gone = hold_less_locked((uintptr_t)cupy_slots[i].stream);
  cupy_slots[i].key = key;
  cupy_slots[i].stream = stream;
  cupy_slots[i].held = held;
  pthread_mutex_unlock(&cupy_lock);
  return 0;
}

static int holds_streams(const gpumem_cupy_allocator *a) {
  return a->struct_size >= sizeof *a && a->on_stream != NULL && a->py_call != NULL && a->py_decref != NULL;
}

/* Before an allocation on s: 1 when s is held for one more block, 0 when s needs no hold (a default
 * stream, or no on_stream); -1 when on_stream raised (its exception pending); -2 when no host memory
 * is left (nothing held then). Called with the GIL (CuPy allocates holding it). */
static int hold_for(const gpumem_cupy_allocator *a, int device, gpumem_stream s) {
  if (stream_lasts(s) || !holds_streams(a)) return 0;
  pthread_mutex_lock(&cupy_lock);
  int held = hold_more_locked((uintptr_t)s);
  pthread_mutex_unlock(&cupy_lock);
  if (held) return 1;
  /* the first block on s: the object owning it, asked for without the lock (Python code runs) */
  void *obj = a->py_call(a->on_stream, "in", device, (ptrdiff_t)(intptr_t)s);
  if (obj == NULL) return -1;
  pthread_mutex_lock(&cupy_lock);
  int rc = 0;
  if (hold_more_locked((uintptr_t)s)) {
    pthread_mutex_unlock(&cupy_lock); /* another thread held it meanwhile: ours goes */
    a->py_decref(obj);
    return 1;
  }
  rc = hold_add_locked((uintptr_t)s, obj);
  pthread_mutex_unlock(&cupy_lock);
  if (rc != 0) a->py_decref(obj);
  return rc != 0 ? -2 : 1;
}

/* Let go of a stream's object (from a hold's last block), after that block's free: it may destroy the
 * stream. */
static void let_go(const gpumem_cupy_allocator *a, void *obj) {
  if (obj != NULL && a->py_decref != NULL) a->py_decref(obj);
}

/* A failed allocation that took s's hold for one block gives it back. */
static void hold_done(const gpumem_cupy_allocator *a, gpumem_stream s) {
  pthread_mutex_lock(&cupy_lock);
  void *obj = hold_less_locked((uintptr_t)s);
  pthread_mutex_unlock(&cupy_lock);
  let_go(a, obj);
}

static const gpumem_cupy_allocator *param_of(void *param) {
  const gpumem_cupy_allocator *a = param;
  /* (a block of the size before on_stream was added holds no streams) */
  if (a == NULL || (a->struct_size != sizeof *a && a->struct_size != offsetof(gpumem_cupy_allocator, on_stream)))
    return NULL;
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
  int held = hold_for(a, device, stream);
  if (held == -1) return NULL; /* on_stream has raised */
  if (held < 0) return fail(a, size, device, GPUMEM_ERR_OUT_OF_MEMORY);
  st = gpumem_alloc(ctx, device, size, stream, &p);
  if (st != GPUMEM_OK) {
    if (held) hold_done(a, stream);
    return fail(a, size, device, st);
  }
  /* an entry left at this address (a block of a context destroyed by force, never freed) goes, and
   * with it its part in its stream's hold */
  void *gone = NULL;
  gpumem_stream stale;
  if (stream != NULL) {
    if (map_put((uintptr_t)p, stream, held, &gone) != 0) {
      (void)gpumem_free(ctx, p, stream);
      if (held) hold_done(a, stream);
      return fail(a, size, device, GPUMEM_ERR_OUT_OF_MEMORY);
    }
  } else {
    (void)map_take((uintptr_t)p, &stale, &gone);
  }
  let_go(a, gone);
  return p;
}

void gpumem_cupy_free(void *param, void *ptr, int device) {
  (void)device;
  const gpumem_cupy_allocator *a = param_of(param);
  if (a == NULL || ptr == NULL) return;
  gpumem_stream stream = NULL;
  void *gone = NULL; /* the stream's object, let go after the free on it */
  (void)map_take((uintptr_t)ptr, &stream, &gone);
  gpumem_context *ctx = a->ctx != NULL ? a->ctx : gpumem__global_context_if_created();
  if (ctx != NULL) (void)gpumem_free(ctx, ptr, stream); /* (NULL: nothing was ever allocated through it) */
  let_go(a, gone);
}

gpumem_status gpumem_cupy_release_streams(void *param, size_t *released) {
  if (released != NULL) *released = 0;
  const gpumem_cupy_allocator *a = param_of(param);
  if (a == NULL || !holds_streams(a)) return GPUMEM_ERR_INVALID_ARGUMENT;
  /* one at a time, the lock not held while Python code runs (a Stream's destruction) */
  for (;;) {
    pthread_mutex_lock(&cupy_lock);
    int any = parked_count > 0;
    void *obj = drop_oldest_parked_locked();
    pthread_mutex_unlock(&cupy_lock);
    if (!any) return GPUMEM_OK;
    let_go(a, obj);
    if (released != NULL && obj != NULL) (*released)++;
  }
}
