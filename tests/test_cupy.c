/* CuPy's CFunctionAllocator entry points (cupy.c): the stream of each block, the streams held
 * while memory allocated on them lives, errors raised through the caller's on_error, bad
 * parameter blocks. The Python side (gpumem.cupy) hands
 * these the interpreter's functions; here they are recording stand-ins. */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <string.h>

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)

static intptr_t current_stream; /* what stream_of returns: CuPy's current stream */
static int stream_calls, stream_device;
static intptr_t stream_of(int device) {
  stream_calls++;
  stream_device = device;
  return current_stream;
}

/* the interpreter's PyObject_CallFunction and Py_DecRef, recorded */
static int calls, decrefs;
static void *called_with;
static char call_format[16];
static long long call_size;
static int call_device, call_status;
static void *call_result;
/* on_stream(device, stream): its calls and what it returns (a token per stream: the "Stream object") */
static int on_stream_token;
static int stream_owner_calls, owner_device;
static intptr_t owner_stream;
static int owner_raises;
/* the "Stream object" of stream 0xA0 + 0x10 k (SA, SB, ...) is owners[k] */
#define NOWNERS 16
static char owners[NOWNERS];
static gpumem_stream stream_k(int k) { return (gpumem_stream)(uintptr_t)(0xA0 + 0x10 * k); }
static void *owner_of(intptr_t s) { return &owners[(s - 0xA0) / 0x10]; }
static int owner_index(const void *obj) {
  const char *o = obj;
  return o >= owners && o < owners + NOWNERS ? (int)(o - owners) : -1;
}
static void *fake_call(void *callable, const char *format, ...) {
  if (callable == &on_stream_token) {
    stream_owner_calls++;
    assert_string_equal(format, "in");
    va_list ap;
    va_start(ap, format);
    owner_device = va_arg(ap, int);
    owner_stream = (intptr_t)va_arg(ap, ptrdiff_t);
    va_end(ap);
    return owner_raises ? NULL : owner_of(owner_stream);
  }
  calls++;
  called_with = callable;
  snprintf(call_format, sizeof call_format, "%s", format);
  va_list ap;
  va_start(ap, format);
  call_size = (long long)va_arg(ap, ptrdiff_t);
  call_device = va_arg(ap, int);
  call_status = va_arg(ap, int);
  va_end(ap);
  return call_result; /* NULL: "raised" */
}
/* letting go of a stream's owner destroys the stream, as CuPy's Stream does when its last reference goes */
static int owner_decrefs;
static void fake_decref(void *obj) {
  int k = owner_index(obj);
  if (k >= 0) {
    owner_decrefs++;
    if (tu_is_sim()) assert_status(gpumem_sim_stream_destroy(0, stream_k(k)), GPUMEM_OK);
    return;
  }
  decrefs++;
}

static int on_error_token;

static gpumem_cupy_allocator param_for(gpumem_context *ctx) {
  gpumem_cupy_allocator a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.ctx = ctx;
  a.stream_of = stream_of;
  a.py_call = fake_call;
  a.py_decref = fake_decref;
  a.on_error = &on_error_token;
  current_stream = 0;
  stream_calls = calls = decrefs = 0;
  stream_owner_calls = owner_decrefs = owner_raises = 0;
  call_result = NULL;
  return a;
}

/* param_for with on_stream: the streams' owners held while their memory lives */
static gpumem_cupy_allocator holding_param_for(gpumem_context *ctx) {
  gpumem_cupy_allocator a = param_for(ctx);
  a.on_stream = &on_stream_token;
  return a;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* A block is freed on the stream it was allocated for, whatever CuPy's current stream is at the
 * free: stream A gets it back at once, stream B not while A's work is pending. */
static void test_free_on_the_allocation_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = param_for(ctx);
  gpumem_sim_set_delayed(1);
  const size_t n = 2 * TU_MiB;
  current_stream = (intptr_t)SA;
  void *p = gpumem_cupy_malloc(&a, n, 0);
  assert_non_null(p);
  assert_int_equal(stream_calls, 1);
  assert_int_equal(stream_device, 0);
  tu_stamp(p, n, 0xA);
  current_stream = (intptr_t)SB; /* the user switched streams before dropping the array */
  gpumem_cupy_free(&a, p, 0);
  void *q = gpumem_cupy_malloc(&a, n, 0); /* on B */
  assert_non_null(q);
  assert_false(overlaps(p, n, q, n));
  assert_true(tu_stamp_ok_pending(p, n, 0xA));
  current_stream = (intptr_t)SA;
  void *r = gpumem_cupy_malloc(&a, n, 0); /* on A: the block it freed, at once */
  assert_ptr_equal(r, p);
  gpumem_cupy_free(&a, q, 0);
  gpumem_cupy_free(&a, r, 0);
  assert_int_equal(calls, 0);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_true(s.num_live == 0);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* The default stream (CuPy's usual case); many blocks, no overlap, all freed. */
static void test_default_stream_and_many_blocks(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = param_for(ctx);
  enum { N = 64 };
  void *p[N];
  size_t sz[N];
  for (int i = 0; i < N; i++) {
    current_stream = (i % 3 == 0 && tu_is_sim()) ? (intptr_t)SA : 0; /* a made-up stream handle only on sim */
    sz[i] = (size_t)(i + 1) * 4096;
    p[i] = gpumem_cupy_malloc(&a, sz[i], 0);
    assert_non_null(p[i]);
    assert_int_equal((uintptr_t)p[i] % 256, 0);
    if (tu_is_sim()) tu_stamp(p[i], sz[i], (uint32_t)i);
  }
  assert_int_equal(tu_find_overlap(p, sz, N), -1);
  for (int i = 0; i < N; i++) {
    if (tu_is_sim()) assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
    gpumem_cupy_free(&a, p[i], 0);
  }
  assert_int_equal(calls, 0);
  assert_true(tu_stats(ctx, GPUMEM_ALL_DEVICES).num_live == 0);
  /* without stream_of: the default stream */
  a.stream_of = NULL;
  void *d = gpumem_cupy_malloc(&a, 1000, 0);
  assert_non_null(d);
  gpumem_cupy_free(&a, d, 0);
  tu_ctx_done(ctx);
}

/* Failures call on_error(size, device, status) once and give NULL; nothing is left allocated. */
static void test_failures_raise_through_on_error(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.limit_bytes = 8 * TU_MiB;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  gpumem_cupy_allocator a = param_for(ctx);

  assert_null(gpumem_cupy_malloc(&a, 64 * TU_MiB, 0));
  assert_int_equal(calls, 1);
  assert_ptr_equal(called_with, &on_error_token);
  assert_string_equal(call_format, "nii");
  assert_int_equal(call_size, 64 * TU_MiB);
  assert_int_equal(call_device, 0);
  assert_int_equal(call_status, GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_int_equal(decrefs, 0);

  calls = 0;
  assert_null(gpumem_cupy_malloc(&a, 4096, 9999));
  assert_int_equal(calls, 1);
  assert_int_equal(call_device, 9999);
  assert_int_equal(call_status, GPUMEM_ERR_INVALID_DEVICE);

  /* an on_error that returns instead of raising: its result is released, NULL all the same */
  calls = 0;
  call_result = &on_error_token;
  assert_null(gpumem_cupy_malloc(&a, (size_t)1 << 60, 0));
  assert_int_equal(calls, 1);
  assert_int_equal(decrefs, 1);
  assert_true(call_status == GPUMEM_ERR_LIMIT_EXCEEDED || call_status == GPUMEM_ERR_OUT_OF_MEMORY);
  call_result = NULL;

  /* a stream_of that failed (returned -1, having raised): NULL, on_error not called, nothing allocated */
  calls = 0;
  current_stream = -1;
  assert_null(gpumem_cupy_malloc(&a, 4096, 0));
  assert_int_equal(calls, 0);
  current_stream = 0;

  /* size 0: NULL without an error, as CuPy never asks */
  assert_null(gpumem_cupy_malloc(&a, 0, 0));
  assert_int_equal(calls, 0);

  /* no Python hooks: NULL only */
  a.py_call = NULL;
  assert_null(gpumem_cupy_malloc(&a, 64 * TU_MiB, 0));
  assert_int_equal(calls, 0);
  assert_true(tu_stats(ctx, GPUMEM_ALL_DEVICES).num_live == 0);
  tu_ctx_done(ctx);
}

/* A parameter block that is missing or of another size is not read: NULL, nothing called. */
static void test_bad_param_block(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = param_for(ctx);
  assert_null(gpumem_cupy_malloc(NULL, 4096, 0));
  a.struct_size = sizeof a - 16; /* (sizeof a - 8 is the block before on_stream: valid) */
  assert_null(gpumem_cupy_malloc(&a, 4096, 0));
  a.struct_size = sizeof a + 8;
  assert_null(gpumem_cupy_malloc(&a, 4096, 0));
  assert_int_equal(calls, 0);
  assert_int_equal(stream_calls, 0);
  gpumem_cupy_free(&a, (void *)(uintptr_t)0x1000, 0); /* ignored: the block is not read */
  gpumem_cupy_free(NULL, (void *)(uintptr_t)0x1000, 0);
  a.struct_size = sizeof a;
  gpumem_cupy_free(&a, NULL, 0);
  /* a pointer not from the context: ignored (gpumem_free refuses it), nothing changes */
  gpumem_stats before = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  static char not_device_memory[512];
  gpumem_cupy_free(&a, not_device_memory, 0);
  gpumem_stats after = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  tu_assert_stats_equal(&before, &after);
  tu_ctx_done(ctx);
}

/* With on_stream, the object owning a stream other than the default ones is held from the first
 * allocation on it until after the last free on it: CuPy destroys a Stream with its object, and a
 * free naming a destroyed stream may crash in CUDA (here the sim counts it). The default streams are
 * never asked about; on_stream raising fails the allocation with nothing allocated; a block of the
 * size before on_stream holds nothing. */
static void test_streams_held_while_their_memory_lives(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = holding_param_for(ctx);
  const size_t n = 4 * TU_MiB; /* (past the thread caches: every free reaches the pool) */
  void *p[3], *q, *d;
  size_t released = 99;
  current_stream = (intptr_t)SA;
  for (int i = 0; i < 3; i++) assert_non_null(p[i] = gpumem_cupy_malloc(&a, n, 0));
  assert_int_equal(stream_owner_calls, 1);
  assert_int_equal(owner_device, 0);
  assert_true(owner_stream == (intptr_t)SA);
  current_stream = (intptr_t)SB;
  assert_non_null(q = gpumem_cupy_malloc(&a, n, 0));
  assert_int_equal(stream_owner_calls, 2);
  for (intptr_t s = 0; s <= 2; s++) { /* NULL, legacy, per-thread: never destroyed, never asked */
    current_stream = s;
    assert_non_null(d = gpumem_cupy_malloc(&a, n, 0));
    gpumem_cupy_free(&a, d, 0);
  }
  assert_int_equal(stream_owner_calls, 2);
  current_stream = 0;
  gpumem_cupy_free(&a, p[1], 0);
  gpumem_cupy_free(&a, p[0], 0);
  gpumem_cupy_free(&a, p[2], 0); /* the last block on SA: freed on SA; SA's owner is parked */
  gpumem_cupy_free(&a, q, 0);
  assert_int_equal(owner_decrefs, 0);
  /* an allocation on a parked stream takes its hold up again: no on_stream call */
  current_stream = (intptr_t)SA;
  for (int i = 0; i < 3; i++) {
    assert_non_null(d = gpumem_cupy_malloc(&a, n, 0));
    gpumem_cupy_free(&a, d, 0);
  }
  assert_int_equal(stream_owner_calls, 2);
  current_stream = (intptr_t)SB;
  assert_non_null(q = gpumem_cupy_malloc(&a, n, 0)); /* SB held, with a live block */
  assert_int_equal(stream_owner_calls, 2);
  /* releasing lets go of the parked SA (destroying it), not of SB, whose block lives */
  assert_status(gpumem_cupy_release_streams(&a, &released), GPUMEM_OK);
  assert_int_equal(released, 1);
  assert_int_equal(owner_decrefs, 1);
  gpumem_cupy_free(&a, q, 0); /* freed on SB, alive: SB parked */
  assert_int_equal(owner_decrefs, 1);
  assert_status(gpumem_cupy_release_streams(&a, NULL), GPUMEM_OK);
  assert_int_equal(owner_decrefs, 2);
  assert_status(gpumem_cupy_release_streams(&a, &released), GPUMEM_OK); /* none left */
  assert_int_equal(released, 0);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
  current_stream = 0;
  for (int i = 0; i < 8; i++) { /* later calls on other streams: the destroyed ones are never named */
    assert_non_null(d = gpumem_cupy_malloc(&a, n << (i % 3), 0));
    gpumem_cupy_free(&a, d, 0);
  }
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
  /* a stream made again at SA's address: asked for again, held again */
  assert_status(gpumem_sim_stream_create(0, SA), GPUMEM_OK);
  assert_status(gpumem_sim_stream_create(0, SB), GPUMEM_OK);
  current_stream = (intptr_t)SA;
  assert_non_null(d = gpumem_cupy_malloc(&a, n, 0));
  assert_int_equal(stream_owner_calls, 3);
  gpumem_cupy_free(&a, d, 0);
  assert_int_equal(owner_decrefs, 2);
  /* at most 8 parked: the ninth stream parked lets go of the oldest (SA), then of the next */
  for (int k = 1; k <= 9; k++) {
    current_stream = (intptr_t)stream_k(k);
    assert_non_null(d = gpumem_cupy_malloc(&a, n, 0));
    gpumem_cupy_free(&a, d, 0);
    assert_int_equal(owner_decrefs, 2 + (k >= 8) + (k >= 9));
  }
  assert_int_equal(stream_owner_calls, 12);
  assert_status(gpumem_cupy_release_streams(&a, &released), GPUMEM_OK);
  assert_int_equal(released, 8);
  assert_int_equal(owner_decrefs, 12);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
  /* on_stream raises: NULL, the exception left pending (on_error not called), nothing allocated */
  assert_status(gpumem_sim_stream_create(0, SA), GPUMEM_OK);
  current_stream = (intptr_t)SA;
  owner_raises = 1;
  gpumem_stats before = tu_stats(ctx, 0);
  assert_null(gpumem_cupy_malloc(&a, n, 0));
  assert_int_equal(calls, 0);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_int_equal(after.num_live, before.num_live);
  assert_int_equal(after.num_allocs, before.num_allocs);
  /* the parameter block before on_stream: allocations on SA hold nothing, and it releases nothing */
  owner_raises = 0;
  a.struct_size = (uint32_t)offsetof(gpumem_cupy_allocator, on_stream);
  assert_non_null(d = gpumem_cupy_malloc(&a, n, 0));
  gpumem_cupy_free(&a, d, 0);
  assert_int_equal(stream_owner_calls, 13); /* (the raising call above counted) */
  assert_int_equal(owner_decrefs, 12);
  assert_status(gpumem_cupy_release_streams(&a, &released), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(released, 0);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
  tu_ctx_done(ctx);
}

/* gpumem_cupy_release_streams with a parameter block that cannot let go of anything: an error, and
 * the parked holds stay. */
static void test_release_streams_bad_param(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = holding_param_for(ctx);
  current_stream = (intptr_t)stream_k(3);
  assert_status(gpumem_sim_stream_create(0, stream_k(3)), GPUMEM_OK);
  void *d = gpumem_cupy_malloc(&a, 4 * TU_MiB, 0);
  assert_non_null(d);
  gpumem_cupy_free(&a, d, 0); /* parked */
  size_t released = 7;
  assert_status(gpumem_cupy_release_streams(NULL, &released), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(released, 0);
  assert_status(gpumem_cupy_release_streams(NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_cupy_allocator bad = a;
  bad.struct_size = 3;
  assert_status(gpumem_cupy_release_streams(&bad, &released), GPUMEM_ERR_INVALID_ARGUMENT);
  bad = a;
  bad.py_decref = NULL;
  assert_status(gpumem_cupy_release_streams(&bad, &released), GPUMEM_ERR_INVALID_ARGUMENT);
  bad = a;
  bad.on_stream = NULL;
  assert_status(gpumem_cupy_release_streams(&bad, &released), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(owner_decrefs, 0);
  assert_status(gpumem_cupy_release_streams(&a, &released), GPUMEM_OK);
  assert_int_equal(released, 1);
  assert_int_equal(owner_decrefs, 1);
  tu_ctx_done(ctx);
}

/* A block of a context destroyed by force is never freed: a later block at its address (another
 * context's) drops its entry, and with it the hold on its stream (parked, then released). */
static void test_stale_entry_lets_its_stream_go(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = holding_param_for(ctx);
  current_stream = (intptr_t)SA;
  assert_status(gpumem_sim_stream_create(0, SA), GPUMEM_OK);
  void *p = gpumem_cupy_malloc(&a, 4 * TU_MiB, 0);
  assert_non_null(p);
  assert_int_equal(stream_owner_calls, 1);
  gpumem_context *keeper = tu_ctx_new(NULL); /* (the sim state, and its addresses, stay) */
  tu_ctx_forget(ctx);
  assert_status(gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE), GPUMEM_OK);
  int found = 0;
  for (int round = 0; round < 2 && !found; round++) {
    gpumem_context *c2 = tu_ctx_new(NULL);
    a.ctx = c2;
    current_stream = round == 0 ? 0 : (intptr_t)SB; /* the default stream, then another one */
    void *q[8];
    int n = 0;
    for (; n < 8; n++) {
      q[n] = gpumem_cupy_malloc(&a, 4 * TU_MiB, 0);
      assert_non_null(q[n]);
      if (q[n] == p) found = 1;
    }
    if (found) { /* SA's hold has no block left: parked, and let go by a release */
      size_t released = 0;
      assert_int_equal(owner_decrefs, 0);
      assert_status(gpumem_cupy_release_streams(&a, &released), GPUMEM_OK);
      assert_int_equal(released, 1);
      assert_int_equal(owner_decrefs, 1);
    }
    for (int i = 0; i < n; i++) gpumem_cupy_free(&a, q[i], 0);
    tu_ctx_done(c2);
  }
  assert_status(gpumem_cupy_release_streams(&a, NULL), GPUMEM_OK);
  tu_ctx_done(keeper);
  if (!found) skip(); /* (no block of the new contexts fell at the old address) */
}

/* ctx NULL: the process-wide context, as gpumem_torch_alloc. */
static void test_process_wide_context(void **state) {
  (void)state;
  gpumem_cupy_allocator a = param_for(NULL);
  current_stream = tu_is_sim() ? (intptr_t)SA : 0; /* a made-up stream handle only on sim */
  void *p = gpumem_cupy_malloc(&a, 12345, 0);
  assert_non_null(p);
  gpumem_context *g = NULL;
  assert_status(gpumem_global_context(&g), GPUMEM_OK);
  size_t got = 0;
  assert_status(gpumem_ptr_info(g, p, &got, NULL), GPUMEM_OK);
  assert_int_equal(got, 12345);
  gpumem_cupy_free(&a, p, 0);
  assert_status(gpumem_ptr_info(g, p, &got, NULL), GPUMEM_ERR_INVALID_POINTER);
  if (tu_is_sim()) gpumem_sim_complete_all();
  assert_status(gpumem_trim(g, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
}

/* Threads allocating for streams of their own and the default stream at once; half of each
 * thread's blocks are freed by the main thread afterwards (CuPy arrays die on any thread). */
enum { NT = 4, PER = 400 };
typedef struct worker {
  gpumem_cupy_allocator *a;
  int id;
  void *keep[PER / 2];
  int ok;
} worker;

static _Thread_local intptr_t tls_stream;
static intptr_t tls_stream_of(int device) {
  (void)device;
  return tls_stream;
}

static void *work(void *arg) {
  worker *w = arg;
  w->ok = 1;
  for (int i = 0; i < PER; i++) {
    /* made-up stream handles on sim; a real backend gets the default stream only */
    tls_stream = (i % 2 && tu_is_sim()) ? (intptr_t)(0x1000 * (w->id + 1)) : 0;
    size_t n = 256 * (size_t)(1 + (i * 7 + w->id) % 64);
    void *p = gpumem_cupy_malloc(w->a, n, 0);
    if (p == NULL) {
      w->ok = 0;
      return NULL;
    }
    if (i % 2 == 0 && i / 2 < PER / 2) {
      w->keep[i / 2] = p;
    } else {
      gpumem_cupy_free(w->a, p, 0);
    }
  }
  return NULL;
}

/* on_stream across threads: each stream's object taken once per run of its blocks, let go once */
static atomic_int mt_taken, mt_held;
static void *mt_call(void *callable, const char *format, ...) {
  if (callable != &on_stream_token) return NULL; /* (on_error: never called here) */
  (void)format;
  atomic_fetch_add(&mt_taken, 1);
  atomic_fetch_add(&mt_held, 1);
  return &mt_taken; /* any object */
}
static void mt_decref(void *obj) {
  if (obj == &mt_taken) atomic_fetch_sub(&mt_held, 1);
}

static void test_threads(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_cupy_allocator a = param_for(ctx);
  a.stream_of = tls_stream_of;
  a.py_call = mt_call;
  a.py_decref = mt_decref;
  a.on_stream = &on_stream_token;
  atomic_store(&mt_taken, 0);
  atomic_store(&mt_held, 0);
  pthread_t t[NT];
  worker w[NT];
  for (int i = 0; i < NT; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].a = &a;
    w[i].id = i;
    assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < NT; i++) {
    assert_true(w[i].ok);
    for (int j = 0; j < PER / 2; j++) gpumem_cupy_free(&a, w[i].keep[j], 0);
  }
  assert_int_equal(calls, 0);
  assert_true(tu_stats(ctx, GPUMEM_ALL_DEVICES).num_live == 0);
  assert_true(atomic_load(&mt_held) <= 8); /* at most 8 parked after their last free */
  assert_status(gpumem_cupy_release_streams(&a, NULL), GPUMEM_OK);
  assert_int_equal(atomic_load(&mt_held), 0); /* every stream let go */
  if (tu_is_sim()) assert_true(atomic_load(&mt_taken) >= NT);
  if (tu_is_sim()) gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_free_on_the_allocation_stream),
      TU_TEST(test_default_stream_and_many_blocks),
      TU_TEST(test_failures_raise_through_on_error),
      TU_TEST(test_bad_param_block),
      TU_TEST(test_streams_held_while_their_memory_lives),
      TU_TEST(test_release_streams_bad_param),
      TU_TEST(test_stale_entry_lets_its_stream_go),
      TU_TEST(test_process_wide_context),
      TU_TEST(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
