/* Stream-handle policy: the core calls the backend with a stream handle only
 * during a call that named that stream (an application may destroy a stream
 * right after freeing on it), and cross-stream reuse still happens once the
 * freeing stream's event completed. Sim only (delayed events, a wrapped vtable). */
#include "testutil.h"

#include <gpumem/backend.h>
#include <pthread.h>
#include <stdatomic.h>

/* internal (src/internal.h), linked from the static library */
gpumem_status gpumem__check_invariants(gpumem_context *ctx);

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

/* ---------------------------------------------------------------------- */
/* A sim vtable whose stream methods check the stream against the stream of
 * the call in progress (set by the test, per thread). */

static gpumem_backend g_wrap;
static const gpumem_backend *g_sim;
static _Thread_local gpumem_stream tl_cur;
static _Thread_local int tl_in_call; /* 1: a call naming tl_cur; 0: a call naming no stream */
static atomic_ulong g_bad, g_stream_calls;

static void note(gpumem_stream s) {
  atomic_fetch_add(&g_stream_calls, 1);
  if (!tl_in_call || s != tl_cur) atomic_fetch_add(&g_bad, 1);
}
static int w_event_record(gpumem_backend *be, int dev, gpumem_event ev, gpumem_stream s) {
  (void)be;
  note(s);
  return g_sim->event_record((gpumem_backend *)g_sim, dev, ev, s);
}
static int w_stream_synchronize(gpumem_backend *be, int dev, gpumem_stream s) {
  (void)be;
  note(s);
  return g_sim->stream_synchronize((gpumem_backend *)g_sim, dev, s);
}

static int w_stream_wait_event(gpumem_backend *be, int dev, gpumem_stream s, gpumem_event ev) {
  (void)be;
  note(s);
  return g_sim->stream_wait_event((gpumem_backend *)g_sim, dev, s, ev);
}
static int w_stream_capture(gpumem_backend *be, int dev, gpumem_stream s, int *status, uint64_t *id) {
  (void)be;
  if (s != NULL) note(s); /* (the NULL stream is never destroyed: asked about from any call) */
  return g_sim->stream_capture((gpumem_backend *)g_sim, dev, s, status, id);
}

static gpumem_context *wrapped_ctx(void) {
  g_sim = gpumem_builtin_backend("sim");
  assert_non_null(g_sim);
  g_wrap = *g_sim;
  g_wrap.name = "sim-stream-check";
  g_wrap.event_record = w_event_record;
  g_wrap.stream_synchronize = w_stream_synchronize;
  g_wrap.stream_wait_event = w_stream_wait_event;
  g_wrap.stream_capture = w_stream_capture;
  atomic_store(&g_bad, 0);
  atomic_store(&g_stream_calls, 0);
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.backend = NULL;
  cfg.custom_backend = &g_wrap;
  cfg.expandable = 0; /* plain segments: the address checks below assume one segment per large block */
  cfg.flags |= GPUMEM_CONFIG_NO_ENV; /* whatever GPUMEM_EXPANDABLE says */
  return tu_ctx_new(&cfg);
}

/* The calls of the test, each telling the wrapper which stream it names. */
static gpumem_status c_alloc(gpumem_context *ctx, size_t n, gpumem_stream s, void **p) {
  tl_cur = s;
  tl_in_call = 1;
  gpumem_status st = gpumem_alloc(ctx, 0, n, s, p);
  tl_in_call = 0;
  return st;
}
static gpumem_status c_free(gpumem_context *ctx, void *p, gpumem_stream s) {
  tl_cur = s;
  tl_in_call = 1;
  gpumem_status st = gpumem_free(ctx, p, s);
  tl_in_call = 0;
  return st;
}

/* ---------------------------------------------------------------------- */

/* free on S records the batch event on S; S completes; an alloc on T reuses. */
static void test_free_complete_alloc_other(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = wrapped_ctx();
  gpumem_sim_set_delayed(1);
  const size_t n = 12 * TU_MiB; /* a segment of its own: no remainder to serve B */
  void *x = NULL, *q = NULL;
  assert_status(c_alloc(ctx, n, SA, &x), GPUMEM_OK);
  assert_status(c_free(ctx, x, SA), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  gpumem_sim_stream_complete(0, SA);
  assert_status(c_alloc(ctx, n, SB, &q), GPUMEM_OK);
  gpumem_stats s2 = tu_stats(ctx, 0);
  assert_true(overlaps(x, n, q, n));
  assert_true(s2.num_backend_allocs == s1.num_backend_allocs);
  assert_status(c_free(ctx, q, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_true(atomic_load(&g_bad) == 0);
  assert_true(atomic_load(&g_stream_calls) > 0);
  tu_ctx_done(ctx);
}

/* Blocks freed on S while its batch is pending stay unbatched: T gets them
 * only after a later call on S recorded their event and S completed. */
static void test_unbatched_until_next_call(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = wrapped_ctx();
  gpumem_sim_set_delayed(1);
  const size_t n = 12 * TU_MiB, wn = 24 * TU_MiB; /* segments of their own */
  void *x = NULL, *y = NULL, *w = NULL, *q1 = NULL, *q2 = NULL, *q3 = NULL, *q4 = NULL, *q5 = NULL;
  assert_status(c_alloc(ctx, n, SA, &x), GPUMEM_OK);
  assert_status(c_alloc(ctx, n, SA, &y), GPUMEM_OK);
  assert_status(c_free(ctx, x, SA), GPUMEM_OK); /* batch {x}, event on A */
  assert_status(c_free(ctx, y, SA), GPUMEM_OK); /* batch pending: y unbatched */
  assert_status(c_alloc(ctx, n, SB, &q1), GPUMEM_OK); /* A's work pending: neither x nor y */
  assert_false(overlaps(q1, n, x, n) || overlaps(q1, n, y, n));
  gpumem_sim_stream_complete(0, SA);
  assert_status(c_alloc(ctx, n, SB, &q2), GPUMEM_OK); /* the batch completed: x */
  assert_true(overlaps(q2, n, x, n));
  assert_status(c_alloc(ctx, n, SB, &q3), GPUMEM_OK); /* y has no event yet: B grows */
  assert_false(overlaps(q3, n, y, n));
  assert_status(c_alloc(ctx, wn, SA, &w), GPUMEM_OK); /* a call on A records the event for y */
  assert_status(c_alloc(ctx, n, SB, &q4), GPUMEM_OK); /* pending: not y */
  assert_false(overlaps(q4, n, y, n));
  gpumem_stats s1 = tu_stats(ctx, 0);
  gpumem_sim_stream_complete(0, SA);
  assert_status(c_alloc(ctx, n, SB, &q5), GPUMEM_OK);
  gpumem_stats s2 = tu_stats(ctx, 0);
  assert_true(overlaps(q5, n, y, n));
  assert_true(s2.num_backend_allocs == s1.num_backend_allocs);
  void *qs[] = {q1, q2, q3, q4, q5};
  for (int i = 0; i < 5; i++) assert_status(c_free(ctx, qs[i], SB), GPUMEM_OK);
  assert_status(c_free(ctx, w, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_true(atomic_load(&g_bad) == 0);
  tu_ctx_done(ctx);
}

/* A call on S that finds its batch pending asks the event when a miss is
 * waiting, and once it completed records a new batch for the rest. */
static void test_pending_batch_renewed_on_demand(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = wrapped_ctx();
  gpumem_sim_set_delayed(1);
  const size_t n = 12 * TU_MiB, wn = 24 * TU_MiB;
  void *x = NULL, *y = NULL, *v = NULL, *q0 = NULL, *q1 = NULL, *q2 = NULL;
  assert_status(c_alloc(ctx, n, SA, &x), GPUMEM_OK);
  assert_status(c_alloc(ctx, n, SA, &y), GPUMEM_OK);
  assert_status(c_alloc(ctx, wn, SA, &v), GPUMEM_OK);
  assert_status(c_free(ctx, x, SA), GPUMEM_OK);        /* batch {x} */
  assert_status(c_free(ctx, y, SA), GPUMEM_OK);        /* unbatched */
  assert_status(c_alloc(ctx, 2 * wn, SB, &q0), GPUMEM_OK); /* a miss while A is pending */
  gpumem_sim_stream_complete(0, SA);
  assert_status(c_free(ctx, v, SA), GPUMEM_OK);        /* asks the batch: done; records {y, v} */
  gpumem_stats s1 = tu_stats(ctx, 0);
  gpumem_sim_stream_complete(0, SA);
  assert_status(c_alloc(ctx, n, SB, &q1), GPUMEM_OK);
  assert_status(c_alloc(ctx, n, SB, &q2), GPUMEM_OK);
  gpumem_stats s2 = tu_stats(ctx, 0);
  assert_true(s2.num_backend_allocs == s1.num_backend_allocs);
  assert_true((overlaps(q1, n, x, n) && overlaps(q2, n, y, n)) || (overlaps(q1, n, y, n) && overlaps(q2, n, x, n)));
  assert_status(c_free(ctx, q0, SB), GPUMEM_OK);
  assert_status(c_free(ctx, q1, SB), GPUMEM_OK);
  assert_status(c_free(ctx, q2, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_true(atomic_load(&g_bad) == 0);
  tu_ctx_done(ctx);
}

/* One stream only: every stream call names that stream. */
static void test_single_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = wrapped_ctx();
  uint64_t rng = 5;
  void *ptr[16] = {0};
  for (int i = 0; i < 2000; i++) {
    int k = (int)(tu_rand(&rng) % 16);
    if (ptr[k] != NULL) {
      assert_status(c_free(ctx, ptr[k], SA), GPUMEM_OK);
      ptr[k] = NULL;
    } else {
      assert_status(c_alloc(ctx, (size_t)tu_rand_range(&rng, 1, 8) * TU_MiB, SA, &ptr[k]), GPUMEM_OK);
    }
  }
  for (int k = 0; k < 16; k++) assert_status(c_free(ctx, ptr[k], SA), GPUMEM_OK);
  assert_true(atomic_load(&g_bad) == 0);
  tu_ctx_done(ctx);
}

/* Temporary streams, destroyed (never named again) after a free on them:
 * trim and the out-of-memory path recover their blocks by device
 * synchronisation; no backend call ever names a dead stream. */
static void test_dead_streams(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "256MiB");
  gpumem_context *ctx = wrapped_ctx();
  for (int round = 0; round < 4; round++) {
    gpumem_stream t = (gpumem_stream)(uintptr_t)(0x1000 + 0x10 * round);
    void *p = NULL, *q = NULL, *r = NULL;
    assert_status(c_alloc(ctx, 64 * TU_MiB, t, &p), GPUMEM_OK);
    assert_status(c_free(ctx, p, t), GPUMEM_OK);
    /* t is "destroyed" here: it is never passed again */
    assert_status(c_alloc(ctx, 128 * TU_MiB, NULL, &q), GPUMEM_OK); /* a miss: polls, never records on t */
    assert_status(c_alloc(ctx, 64 * TU_MiB, NULL, &r), GPUMEM_OK);
    assert_status(c_free(ctx, q, NULL), GPUMEM_OK);
    assert_status(c_free(ctx, r, NULL), GPUMEM_OK);
    if (round % 2 == 0) assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  }
  /* out-of-memory path: memory freed on dead streams comes back by device synchronisation */
  gpumem_sim_set_delayed(1);
  for (int i = 0; i < 3; i++) {
    gpumem_stream t = (gpumem_stream)(uintptr_t)(0x2000 + 0x10 * i);
    void *p = NULL;
    assert_status(c_alloc(ctx, 64 * TU_MiB, t, &p), GPUMEM_OK);
    assert_status(c_free(ctx, p, t), GPUMEM_OK);
  }
  void *big = NULL;
  assert_status(c_alloc(ctx, 200 * TU_MiB, NULL, &big), GPUMEM_OK);
  assert_status(c_free(ctx, big, NULL), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_true(atomic_load(&g_bad) == 0);
  tu_ctx_done(ctx);
}

/* A capture found on a stream (no route named it) is asked about only in calls on that stream: the
 * application may destroy the stream right after the capture (CUDA crashes when asked about it).
 * Calls on other streams, trims, a reset and a release between never name it; a call on it later,
 * or gpumem_capture_ended, forgets the capture. */
static void test_capture_stream_asked_only_when_named(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = wrapped_ctx();
  for (int round = 0; round < 3; round++) {
    gpumem_stream t = (gpumem_stream)(uintptr_t)(0x3000 + 0x10 * round);
    void *a = NULL, *b = NULL, *q = NULL;
    assert_status(gpumem_sim_stream_begin_capture(0, t, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
    assert_status(c_alloc(ctx, 4 * TU_MiB, t, &a), GPUMEM_OK);
    assert_status(c_alloc(ctx, 4 * TU_MiB, t, &b), GPUMEM_OK);
    assert_status(c_free(ctx, a, t), GPUMEM_OK);
    assert_status(gpumem_sim_stream_end_capture(0, t, NULL), GPUMEM_OK);
    /* t is "destroyed" here */
    for (int i = 0; i < 6; i++) {
      gpumem_stream s = i % 2 ? SA : NULL;
      assert_status(c_alloc(ctx, (size_t)(i + 1) * TU_MiB, s, &q), GPUMEM_OK);
      assert_status(c_free(ctx, q, s), GPUMEM_OK);
    }
    assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
    assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_ERR_BUSY); /* the capture is still known */
    assert_status(gpumem_capture_pools_release(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
    assert_true(atomic_load(&g_bad) == 0);
    if (round == 0) {
      tl_cur = t; /* the block is freed on t while t lives: a call naming t */
      tl_in_call = 1;
      assert_status(gpumem_capture_ended(ctx, 0, t), GPUMEM_OK);
      tl_in_call = 0;
      assert_status(c_free(ctx, b, t), GPUMEM_OK);
    } else {
      assert_status(c_free(ctx, b, SB), GPUMEM_OK); /* freed on another stream: t is never named */
      assert_status(gpumem_capture_ended(ctx, GPUMEM_ALL_DEVICES, NULL), GPUMEM_OK);
    }
    assert_status(gpumem_capture_pools_release(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
    assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
    assert_int_equal(tu_stats(ctx, 0).reserved_bytes, 0);
    assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  }
  assert_true(atomic_load(&g_bad) == 0);
  assert_true(atomic_load(&g_stream_calls) > 0);
  tu_ctx_done(ctx);
}

/* Random multi-stream, multi-thread work (small and large sizes, trims):
 * no stream call names a stream other than the current call's, and no
 * block is ever handed out twice. */
typedef struct worker_arg {
  gpumem_context *ctx;
  int id;
} worker_arg;

static void *worker(void *argp) {
  worker_arg *a = argp;
  uint64_t rng = 777 + (uint64_t)a->id;
  enum { LIVE = 24 };
  void *ptr[LIVE] = {0};
  size_t sz[LIVE] = {0};
  gpumem_stream st[LIVE] = {0};
  for (int i = 0, iters = (int)tu_scaled(3000, 300); i < iters; i++) { /* valgrind: fewer (testutil.h) */
    int k = (int)(tu_rand(&rng) % LIVE);
    if (ptr[k] != NULL) {
      if (!tu_stamp_ok(ptr[k], sz[k], (uint32_t)(a->id * 1000 + k))) return (void *)1;
      gpumem_stream fs = (tu_rand(&rng) % 4 == 0) ? (gpumem_stream)(uintptr_t)(0x100 * (1 + tu_rand(&rng) % 6)) : st[k];
      if (c_free(a->ctx, ptr[k], fs) != GPUMEM_OK) return (void *)1;
      ptr[k] = NULL;
    } else {
      size_t n = (tu_rand(&rng) % 3 == 0) ? (size_t)tu_rand_range(&rng, 1, 12) * TU_MiB
                                          : (size_t)tu_rand_range(&rng, 1, 256) * 1024;
      gpumem_stream s = (gpumem_stream)(uintptr_t)(0x100 * (1 + tu_rand(&rng) % 6));
      if (c_alloc(a->ctx, n, s, &ptr[k]) != GPUMEM_OK) return (void *)1;
      sz[k] = n;
      st[k] = s;
      tu_stamp(ptr[k], n, (uint32_t)(a->id * 1000 + k));
    }
    if (i % 500 == 250 && a->id == 0) {
      if (gpumem_trim(a->ctx, 0, 0, NULL) != GPUMEM_OK) return (void *)1;
    }
    if (i % 97 == 0) gpumem_sim_complete_all();
  }
  for (int k = 0; k < LIVE; k++)
    if (ptr[k] != NULL && c_free(a->ctx, ptr[k], st[k]) != GPUMEM_OK) return (void *)1;
  return NULL;
}

static void test_threads_streams_policy(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = wrapped_ctx();
  gpumem_sim_set_delayed(1);
  enum { T = 4 };
  pthread_t th[T];
  worker_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i].ctx = ctx;
    args[i].id = i;
    assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    void *ret = NULL;
    assert_int_equal(pthread_join(th[i], &ret), 0);
    assert_null(ret);
  }
  gpumem_sim_complete_all();
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  assert_true(atomic_load(&g_bad) == 0);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_free_complete_alloc_other), TU_TEST(test_unbatched_until_next_call),
      TU_TEST(test_pending_batch_renewed_on_demand), TU_TEST(test_single_stream),
      TU_TEST(test_dead_streams), TU_TEST(test_capture_stream_asked_only_when_named),
      TU_TEST(test_threads_streams_policy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
