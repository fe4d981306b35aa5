/* Graph pools (src/graph.c; DESIGN.md "Graphs"): memory allocated while a
 * stream is routed to a pool (its capture) lives in that pool, is never handed
 * to work outside it while the pool may replay, frees during the capture
 * return to it, trimming does not take it, and no library call invalidates
 * the capture (the sim models CUDA's capture rules: a forbidden call
 * invalidates it, gpumem_sim_stream_end_capture reports that). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "gpumem/sim.h"
#include "testutil.h"

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static void capture_begin(gpumem_stream s) {
  assert_status(gpumem_sim_stream_begin_capture(0, s, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
}

static void capture_end_intact(gpumem_stream s) {
  int invalidated = -1;
  assert_status(gpumem_sim_stream_end_capture(0, s, &invalidated), GPUMEM_OK);
  assert_int_equal(invalidated, 0);
}

/* After a trim of every device, nothing is live and nothing is reserved on device 0. */
static void expect_empty_after_trim(gpumem_context *ctx) {
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_int_equal(s.num_live, 0);
  assert_int_equal(s.reserved_bytes, 0);
}

typedef struct {
  gpumem_context *ctx;
  gpumem_status st;
} side_arg;

/* Another thread, another stream, during the capture: allocations that grow the pool, frees,
 * trims, statistics: none of it may invalidate a global-mode capture. */
static void *side_thread(void *a) {
  side_arg *sa = a;
  sa->st = GPUMEM_OK;
  for (int i = 0; i < 20 && sa->st == GPUMEM_OK; i++) {
    void *p;
    sa->st = gpumem_alloc(sa->ctx, 0, (size_t)(i + 1) << 20, SB, &p);
    if (sa->st == GPUMEM_OK) sa->st = gpumem_free(sa->ctx, p, SB);
    if (sa->st == GPUMEM_OK) sa->st = gpumem_trim(sa->ctx, 0, 0, NULL);
    gpumem_stats st;
    memset(&st, 0, sizeof st);
    if (sa->st == GPUMEM_OK) sa->st = gpumem_get_stats(sa->ctx, 0, &st);
  }
  return NULL;
}

static void test_capture_allocates_in_pool(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  /* memory that exists before the capture, cached in the device pool and the thread cache */
  void *before, *small;
  assert_status(gpumem_alloc(ctx, 0, 8 << 20, SA, &before), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 << 10, SA, &small), GPUMEM_OK);
  assert_status(gpumem_free(ctx, small, SA), GPUMEM_OK);
  void *early;
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &early), GPUMEM_OK);
  assert_status(gpumem_free(ctx, early, SA), GPUMEM_OK);

  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_OK);
  capture_begin(SA);
  side_arg sa = {ctx, GPUMEM_ERR_INTERNAL};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, side_thread, &sa), 0);
  void *g1, *g2, *g3;
  assert_status(gpumem_alloc(ctx, 0, 64 << 10, SA, &g1), GPUMEM_OK); /* the thread cache's size */
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &g2), GPUMEM_OK);
  assert_false(overlaps(g1, 64 << 10, small, 64 << 10)); /* not the cached block of before */
  assert_false(overlaps(g2, 4 << 20, early, 4 << 20));
  gpumem_stats gs;
  memset(&gs, 0, sizeof gs);
  assert_status(gpumem_graph_pool_get_stats(gp, &gs), GPUMEM_OK);
  assert_int_equal(gs.num_live, 2);
  /* a free during the capture returns to the pool: the next allocation of the graph reuses it */
  assert_status(gpumem_free(ctx, g2, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &g3), GPUMEM_OK);
  assert_ptr_equal(g3, g2);
  /* memory of before, freed inside the capture: no event on the capturing stream */
  assert_status(gpumem_free(ctx, before, SA), GPUMEM_OK);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_status(sa.st, GPUMEM_OK);
  capture_end_intact(SA);
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_OK);

  /* the graph may replay: nothing outside the pool gets its memory, trims do not take it */
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  memset(&gs, 0, sizeof gs);
  assert_status(gpumem_graph_pool_get_stats(gp, &gs), GPUMEM_OK);
  assert_int_equal(gs.num_live, 2);
  assert_true(gs.reserved_bytes >= (4u << 20) + (64u << 10));
  gpumem_stats dev = tu_stats(ctx, 0); /* device figures include the graph pool's */
  assert_true(dev.reserved_bytes >= gs.reserved_bytes);
  assert_true(dev.num_live >= 2);
  for (int i = 0; i < 16; i++) {
    void *q;
    size_t n = (size_t)(i % 4 + 1) << 20;
    assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
    assert_false(overlaps(q, n, g1, 64 << 10));
    assert_false(overlaps(q, n, g3, 4 << 20));
    assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  }
  /* the graph is destroyed: the pool is released; its blocks go back as they are freed */
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  assert_status(gpumem_free(ctx, g1, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, g3, SA), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  dev = tu_stats(ctx, 0);
  assert_int_equal(dev.num_live, 0);
  tu_ctx_done(ctx);
}

/* Allocations on a stream joined to the routed stream's capture go to the same pool. */
static void test_forked_stream_follows_capture(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  capture_begin(SA);
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_OK);
  /* the sim has no event waits: a second routed stream of the same pool stands for the fork */
  assert_status(gpumem_graph_pool_begin(gp, SB), GPUMEM_OK);
  void *a, *b;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SB, &b), GPUMEM_OK);
  gpumem_stats gs;
  memset(&gs, 0, sizeof gs);
  assert_status(gpumem_graph_pool_get_stats(gp, &gs), GPUMEM_OK);
  assert_int_equal(gs.num_live, 2);
  assert_status(gpumem_free(ctx, a, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, SB), GPUMEM_OK);
  capture_end_intact(SA);
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_end(gp, SB), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK); /* all free: given back now */
  tu_ctx_done(ctx);
}

/* A block noted on a captured stream (gpumem_record_stream) and freed during the capture: no event
 * is recorded on that stream (it would belong to the graph, and asking it later, as another
 * stream's allocation does, invalidates the capture); the block waits for a device
 * synchronisation instead, never served before. */
static void test_noted_free_during_capture(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  const gpumem_stream st = (gpumem_stream)(uintptr_t)0xD0;
  void *p;
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &p), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(gp, SB), GPUMEM_OK);
  capture_begin(SA);
  capture_begin(SB);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  /* another stream's allocations look at parked frees on their way to new memory */
  void *q[4];
  for (int i = 0; i < 4; i++) {
    assert_status(gpumem_alloc(ctx, 0, (size_t)(i + 1) << 24, st, &q[i]), GPUMEM_OK);
    assert_false(overlaps(q[i], (size_t)(i + 1) << 24, p, 4 << 20));
  }
  capture_end_intact(SA);
  capture_end_intact(SB);
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_end(gp, SB), GPUMEM_OK);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, q[i], st), GPUMEM_OK);
  /* after the capture, a trim synchronises the device: the parked block is free, and goes back */
  expect_empty_after_trim(ctx);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* A capture nobody routed gets a pool of its own (DESIGN.md "Graphs"): the library asks the backend
 * at the capture's first allocation on the stream, and from then on the capture is known as a routed
 * one is: its memory is not the device pool's cached memory, a free in it returns to its pool, other
 * threads' allocations, frees (the NULL stream's too) and trims leave the capture intact, and after
 * it ends nothing outside gets the graph's memory while its blocks live. */
static void test_unrouted_capture_gets_own_pool(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *before, *small, *early, *nul;
  assert_status(gpumem_alloc(ctx, 0, 8 << 20, SA, &before), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2 << 20, NULL, &nul), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 << 10, SA, &small), GPUMEM_OK);
  assert_status(gpumem_free(ctx, small, SA), GPUMEM_OK); /* in the thread cache */
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &early), GPUMEM_OK);
  assert_status(gpumem_free(ctx, early, SA), GPUMEM_OK); /* in the large slot, or the pool */
  gpumem_stats dev0 = tu_stats(ctx, 0);

  capture_begin(SA);
  void *g1, *g2, *g3;
  assert_status(gpumem_alloc(ctx, 0, 64 << 10, SA, &g1), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &g2), GPUMEM_OK);
  assert_false(overlaps(g1, 64 << 10, small, 64 << 10));
  assert_false(overlaps(g2, 4 << 20, early, 4 << 20));
  gpumem_stats dev = tu_stats(ctx, 0);
  assert_int_equal(dev.num_live, dev0.num_live + 2); /* the capture's pool counts with the device */
  assert_true(dev.reserved_bytes >= dev0.reserved_bytes + (4u << 20));
  side_arg sa = {ctx, GPUMEM_ERR_INTERNAL}; /* (its blocks would count in the figures above) */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, side_thread, &sa), 0);
  assert_status(gpumem_free(ctx, g2, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &g3), GPUMEM_OK);
  assert_ptr_equal(g3, g2); /* freed in the capture: back to its pool, for the graph's next allocation */
  void *tmp; /* a temporary of the graph, freed in the capture: every launch writes it */
  assert_status(gpumem_alloc(ctx, 0, 2 << 20, SA, &tmp), GPUMEM_OK);
  assert_status(gpumem_free(ctx, tmp, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, before, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, nul, NULL), GPUMEM_OK); /* the legacy stream, while a stream captures */
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_ERR_BUSY); /* it would synchronise the device */
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_status(sa.st, GPUMEM_OK);
  capture_end_intact(SA);

  /* the graph may replay while its blocks live: the device pool's allocations stay off them */
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  for (int i = 0; i < 16; i++) {
    void *q;
    size_t n = i % 2 ? (size_t)64 << 10 : (size_t)(i % 4 + 1) << 20;
    assert_status(gpumem_alloc(ctx, 0, n, i % 3 ? SA : SB, &q), GPUMEM_OK);
    assert_false(overlaps(q, n, g1, 64 << 10));
    assert_false(overlaps(q, n, g3, 4 << 20));
    assert_false(overlaps(q, n, tmp, 2 << 20));
    assert_status(gpumem_free(ctx, q, i % 3 ? SA : SB), GPUMEM_OK);
  }
  /* ended: a reset is allowed again; the graph's blocks freed, its pool stays (the graph may still be
   * launched) until the caller says the graphs are gone */
  assert_status(gpumem_free(ctx, g1, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, g3, SA), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  dev = tu_stats(ctx, 0);
  assert_int_equal(dev.num_live, 0);
  assert_true(dev.reserved_bytes >= (4u << 20) + (2u << 20));
  for (int i = 0; i < 8; i++) {
    void *q;
    size_t n = (size_t)(i % 4 + 1) << 20;
    assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
    assert_false(overlaps(q, n, g3, 4 << 20) || overlaps(q, n, tmp, 2 << 20) || overlaps(q, n, g1, 64 << 10));
    assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  }
  assert_status(gpumem_capture_pools_release(NULL, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_capture_pools_release(ctx, 99), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_capture_pools_release(ctx, -7), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_capture_pools_release(ctx, 0), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  dev = tu_stats(ctx, 0);
  assert_int_equal(dev.reserved_bytes, 0);
  uint64_t used = 1;
  assert_status(gpumem_sim_used_bytes(0, &used), GPUMEM_OK);
  assert_int_equal(used, 0);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* Two captures at once, neither routed: each its own pool; a second capture of the same stream after
 * the first ended gets a new one; a capture routed after the library found it takes the named pool
 * from then on. */
static void test_unrouted_captures_apart(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  capture_begin(SA);
  capture_begin(SB);
  void *a, *b, *a2;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SB, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, SA), GPUMEM_OK);
  /* a's block is SA's capture's: SB's capture does not get it */
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SB, &a2), GPUMEM_OK);
  assert_false(overlaps(a2, 1 << 20, a, 1 << 20));
  assert_status(gpumem_free(ctx, a2, SB), GPUMEM_OK);
  capture_end_intact(SA);
  /* the same stream again, a new capture: not the first capture's memory while b lives */
  capture_begin(SA);
  void *c;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &c), GPUMEM_OK);
  assert_false(overlaps(c, 1 << 20, b, 1 << 20));
  /* named now: later allocations of the capture go to the named pool */
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_OK);
  void *d;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &d), GPUMEM_OK);
  gpumem_stats gs;
  memset(&gs, 0, sizeof gs);
  assert_status(gpumem_graph_pool_get_stats(gp, &gs), GPUMEM_OK);
  assert_int_equal(gs.num_live, 1);
  capture_end_intact(SA);
  capture_end_intact(SB);
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, d, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  /* a capture under way keeps its pool through a release; the ended ones go */
  capture_begin(SB);
  void *e;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SB, &e), GPUMEM_OK);
  assert_status(gpumem_capture_pools_release(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
  capture_end_intact(SB);
  assert_status(gpumem_free(ctx, e, SB), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  assert_true(tu_stats(ctx, 0).reserved_bytes >= (1u << 20)); /* that capture's pool: not released */
  assert_status(gpumem_capture_pools_release(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
  expect_empty_after_trim(ctx);
  tu_ctx_done(ctx);
}

/* A capture that only frees through the library (PyTorch's: it allocates from its own graph pools)
 * is known from that free on, and the pool made for it, which got no memory, goes when the library
 * learns the capture ended (a call on its stream, or gpumem_capture_ended: PyTorch's
 * endAllocateToPool): a hundred such captures leave no pool behind. */
static void test_free_only_captures_leave_nothing(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_log *log = tu_log_new();
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_DEBUG);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *warm;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, NULL, &warm), GPUMEM_OK); /* the device pool exists */
  for (int i = 0; i < 100; i++) { /* (three log lines at most each: the sink keeps 512) */
    void *p;
    assert_status(gpumem_alloc(ctx, 0, 4 << 20, SA, &p), GPUMEM_OK);
    capture_begin(SA);
    assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
    capture_end_intact(SA);
    void *q; /* a call on another stream does not ask about SA (it may be destroyed by now) */
    assert_status(gpumem_alloc(ctx, 0, 64 << 10, NULL, &q), GPUMEM_OK);
    assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
    if (i % 2 == 0) {
      assert_status(gpumem_capture_ended(ctx, 0, SA), GPUMEM_OK);
    } else { /* the next call on SA sees the capture ended */
      assert_status(gpumem_alloc(ctx, 0, 64 << 10, SA, &q), GPUMEM_OK);
      assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
    }
  }
  assert_status(gpumem_free(ctx, warm, NULL), GPUMEM_OK);
  /* no capture pool is left: the device's figures are its pool's alone, and a trim empties it */
  expect_empty_after_trim(ctx);
  /* (a free the thread cache takes makes no call, and finds no capture: not every one is seen) */
  int made = tu_log_count_matching(log, "routed to no pool: a pool of its own", NULL);
  assert_true(made > 0);
  assert_int_equal(tu_log_count_matching(log, "got no memory and goes", NULL), made);
  tu_ctx_done(ctx);
  tu_log_free(log);
}

/* The library asks the backend about a stream only in a call that passes it: a capture's stream
 * destroyed after the capture is never asked about (CUDA crashes there), by calls on other streams,
 * trims, resets or releases. The capture stays known (capture mode: a reset is refused, a trim gives
 * nothing back, its pool stays through a release) until gpumem_capture_ended(ctx, device, NULL), or a
 * call on a stream made again at that handle; gpumem_capture_ended with a live stream under capture
 * keeps it; bad input. */
static void test_destroyed_capture_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  for (int round = 0; round < 2; round++) {
    void *a, *t, *q;
    if (round > 0) assert_status(gpumem_sim_stream_create(0, SA), GPUMEM_OK); /* a new stream at the handle */
    capture_begin(SA);
    assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &a), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &t), GPUMEM_OK);
    assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK); /* a temporary the graph writes */
    /* under way: asked about with its stream, kept */
    assert_status(gpumem_capture_ended(ctx, 0, SA), GPUMEM_OK);
    assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_ERR_BUSY);
    capture_end_intact(SA);
    assert_status(gpumem_free(ctx, a, SB), GPUMEM_OK); /* a block of the capture's pool, freed on SB */
    assert_status(gpumem_sim_stream_destroy(0, SA), GPUMEM_OK);
    for (int i = 0; i < 8; i++) {
      assert_status(gpumem_alloc(ctx, 0, (size_t)(i + 1) << 20, i % 2 ? SB : NULL, &q), GPUMEM_OK);
      assert_status(gpumem_free(ctx, q, i % 2 ? SB : NULL), GPUMEM_OK);
    }
    uint64_t rel = 1;
    assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, &rel), GPUMEM_OK);
    assert_int_equal(rel, 0); /* capture mode: nothing goes back */
    assert_status(gpumem_reset(ctx, GPUMEM_ALL_DEVICES, 0), GPUMEM_ERR_BUSY);
    assert_status(gpumem_capture_pools_release(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
    assert_true(tu_stats(ctx, 0).reserved_bytes >= (2u << 20)); /* the capture's pool: kept */
    assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
    if (round == 0) {
      assert_status(gpumem_capture_ended(ctx, GPUMEM_ALL_DEVICES, NULL), GPUMEM_OK); /* none under way */
    } else { /* a stream made at the same handle, named by a call: asked, the old capture forgotten */
      assert_status(gpumem_sim_stream_create(0, SA), GPUMEM_OK);
      assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &q), GPUMEM_OK);
      assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
    }
    assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
    assert_status(gpumem_capture_pools_release(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
    expect_empty_after_trim(ctx);
    assert_status(gpumem_reset(ctx, GPUMEM_ALL_DEVICES, 0), GPUMEM_OK);
  }
  /* bad input */
  assert_status(gpumem_capture_ended(NULL, 0, SA), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_capture_ended(ctx, 99, SA), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_capture_ended(ctx, 99, NULL), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_capture_ended(ctx, -2, NULL), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_capture_ended(ctx, GPUMEM_ALL_DEVICES, SA), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_capture_ended(ctx, 0, SB), GPUMEM_OK); /* no capture known: nothing to do */
  assert_status(gpumem_capture_ended(ctx, 0, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* gpumem_reset during a routed capture: GPUMEM_ERR_BUSY, nothing invalidated (the blocks stay live,
 * the capture intact); after it, the reset goes through. */
static void test_reset_during_capture(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p, *g;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SB, &p), GPUMEM_OK);
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_OK);
  capture_begin(SA);
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &g), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, GPUMEM_ALL_DEVICES, 0), GPUMEM_ERR_BUSY);
  assert_status(gpumem_reset(ctx, 0, GPUMEM_RESET_DEVICE), GPUMEM_ERR_BUSY);
  capture_end_intact(SA);
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SB), GPUMEM_OK); /* still live: nothing was invalidated */
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  /* a capture the library has not seen yet, but the device reports (the NULL stream's answer) */
  capture_begin(SB);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_ERR_BUSY);
  capture_end_intact(SB);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* Explicit allocation from a pool (PyTorch's filter-based routing), outside any capture too. */
static void test_explicit_alloc(void **state) {
  (void)state;
  TU_REQUIRE_SIM(); /* its streams are the sim's made-up handles */
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  void *p, *z = (void *)1;
  assert_status(gpumem_graph_pool_alloc(gp, 3 << 20, SA, &p), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc(gp, 0, SA, &z), GPUMEM_OK);
  assert_null(z);
  size_t sz = 0;
  int dev = -1;
  assert_status(gpumem_ptr_info(ctx, p, &sz, &dev), GPUMEM_OK);
  assert_int_equal(sz, 3 << 20);
  assert_int_equal(dev, 0);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* A pool still holding live blocks at destroy: a leak (BUSY), and FORCE frees it. */
static void test_destroy_with_live_graph_block(void **state) {
  (void)state;
  gpumem_context *ctx;
  gpumem_config cfg;
  tu_config(&cfg);
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_OK);
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  void *p;
  assert_status(gpumem_graph_pool_alloc(gp, 1 << 20, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY);
  assert_status(gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE), GPUMEM_OK);
}

static void test_bad_input(void **state) {
  (void)state;
  TU_REQUIRE_SIM(); /* made-up stream handles */
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_graph_pool *gp = NULL, *other = NULL;
  void *p = (void *)0x1234;
  assert_status(gpumem_graph_pool_create(NULL, 0, &gp), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_create(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_create(ctx, 99, &gp), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_graph_pool_create(ctx, -1, &gp), GPUMEM_ERR_INVALID_DEVICE);
  assert_null(gp);
  assert_status(gpumem_graph_pool_begin(NULL, SA), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_end(NULL, SA), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_alloc(NULL, 16, SA, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(p, (void *)0x1234);
  assert_status(gpumem_graph_pool_release(NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_get_stats(NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_create(ctx, 0, &other), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc(gp, 16, SA, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_ERR_INVALID_ARGUMENT); /* not routed */
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(gp, SA), GPUMEM_ERR_INVALID_ARGUMENT);    /* twice */
  assert_status(gpumem_graph_pool_begin(other, SA), GPUMEM_ERR_INVALID_ARGUMENT); /* to another pool */
  assert_status(gpumem_graph_pool_end(other, SA), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_ERR_INVALID_ARGUMENT);      /* still routed */
  assert_status(gpumem_graph_pool_end(gp, SA), GPUMEM_OK);
  gpumem_stats s;
  s.struct_size = 4; /* too small */
  assert_status(gpumem_graph_pool_get_stats(gp, &s), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(other), GPUMEM_OK);
  /* limits and the largest free block */
  uint64_t lim = 7, big = 7;
  assert_status(gpumem_set_limit(NULL, 0, 1), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_set_limit(ctx, 99, 1), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_get_limit(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_get_limit(ctx, 99, &lim), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_largest_free_block(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_largest_free_block(ctx, 99, &big), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(lim, 7);
  assert_int_equal(big, 7);
  tu_ctx_done(ctx);
}

/* gpumem_set_limit: the cap of PyTorch's set_per_process_memory_fraction. */
static void test_set_limit(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  uint64_t lim = 1;
  assert_status(gpumem_get_limit(ctx, 0, &lim), GPUMEM_OK);
  assert_int_equal(lim, 0);
  void *p, *q;
  assert_status(gpumem_alloc(ctx, 0, 64 << 20, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 << 20, NULL, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  uint64_t big = 0;
  assert_status(gpumem_largest_free_block(ctx, 0, &big), GPUMEM_OK);
  assert_true(big >= (64u << 20));
  assert_status(gpumem_set_limit(ctx, 0, 100 << 20), GPUMEM_OK);
  assert_status(gpumem_get_limit(ctx, 0, &lim), GPUMEM_OK);
  assert_int_equal(lim, 100 << 20);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes <= (100u << 20)); /* the cached 64 MiB above the cap went back */
  void *r = (void *)0x99;
  assert_status(gpumem_alloc(ctx, 0, 64 << 20, NULL, &r), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(r, (void *)0x99);
  assert_status(gpumem_set_limit(ctx, 0, 0), GPUMEM_OK); /* no cap */
  assert_status(gpumem_alloc(ctx, 0, 64 << 20, NULL, &r), GPUMEM_OK);
  assert_status(gpumem_free(ctx, r, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* limit_bytes is the device's: what its graph pools hold counts, for the main pool's growth and for
 * theirs (found by fuzz_ops: a capture's pool and the main pool each grew to the limit). */
static void check_limit_counts_graph_pools(int expandable) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags |= GPUMEM_CONFIG_NO_ENV;
  cfg.expandable = expandable;
  cfg.limit_bytes = 16u << 20;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  gpumem_graph_pool *gp = NULL;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  void *g = NULL, *p = (void *)0x99, *q = NULL;
  assert_status(gpumem_graph_pool_alloc(gp, 10u << 20, SA, &g), GPUMEM_OK);
  /* 10 MiB of the 16 are the graph pool's: 8 more do not fit, on any path */
  assert_status(gpumem_alloc(ctx, 0, 8u << 20, SA, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x99);
  assert_status(gpumem_alloc(ctx, 0, 4u << 20, SA, &q), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes <= (16u << 20));
  /* ... and the other way: the main pool's memory counts for the graph pool */
  void *g2 = (void *)0x99;
  assert_status(gpumem_graph_pool_alloc(gp, 4u << 20, SA, &g2), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(g2, (void *)0x99);
  st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes <= (16u << 20));
  /* the graph pool's memory back: the 8 MiB fit */
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 8u << 20, SA, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_limit_counts_graph_pools(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  check_limit_counts_graph_pools(1);
  check_limit_counts_graph_pools(0);
}

/* gpumem_set_limit is the device's limit: graph pools there are and graph pools made later keep to it
 * as the main pool does (it set only the main pool's before). */
static void test_set_limit_covers_graph_pools(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_graph_pool *before = NULL, *after = NULL;
  void *g = NULL;
  assert_status(gpumem_graph_pool_create(ctx, 0, &before), GPUMEM_OK);
  assert_status(gpumem_set_limit(ctx, 0, 32u << 20), GPUMEM_OK);
  assert_status(gpumem_graph_pool_create(ctx, 0, &after), GPUMEM_OK);
  for (int i = 0; i < 2; i++) {
    gpumem_graph_pool *gp = i ? after : before;
    assert_status(gpumem_graph_pool_alloc(gp, 48u << 20, SA, &g), GPUMEM_ERR_LIMIT_EXCEEDED);
    assert_status(gpumem_graph_pool_alloc(gp, 8u << 20, SA, &g), GPUMEM_OK);
    assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  }
  assert_status(gpumem_set_limit(ctx, 0, 0), GPUMEM_OK); /* no limit: the graph pools may grow again */
  assert_status(gpumem_graph_pool_alloc(before, 48u << 20, SA, &g), GPUMEM_OK);
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(before), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(after), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* A trim that gives back a released pool's memory says so in *released: the device's reserved bytes
 * go down by what it reports. */
static void test_trim_counts_released_pool(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_graph_pool *gp = NULL;
  void *g = NULL;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc(gp, 4u << 20, SA, &g), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK); /* g live: the pool stays until it is freed */
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_true(before.reserved_bytes >= (4u << 20));
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_int_equal(after.reserved_bytes, 0);
  assert_int_equal(rel, before.reserved_bytes - after.reserved_bytes);
  tu_ctx_done(ctx);
}

/* A released pool whose memory the backend will not take back stays, counted for its device (the sim
 * still holds that memory), and goes at a later trim. */
static void test_released_pool_free_fails(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_graph_pool *gp = NULL;
  void *g = NULL;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc(gp, 4u << 20, SA, &g), GPUMEM_OK);
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_FREE, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_ERR_BACKEND);
  uint64_t used = 0;
  assert_status(gpumem_sim_used_bytes(0, &used), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(used >= (4u << 20));
  assert_int_equal(st.reserved_bytes, used);
  gpumem_sim_fail_clear();
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  assert_int_equal(rel, used);
  assert_status(gpumem_sim_used_bytes(0, &used), GPUMEM_OK);
  assert_int_equal(used, 0);
  assert_int_equal(tu_stats(ctx, 0).reserved_bytes, 0);
  tu_ctx_done(ctx);
}

/* While a capture is known, work on the NULL stream of its device goes on without invalidating it: the
 * events the pool would record on the NULL stream for its frees (refused by CUDA for the legacy stream
 * while a blocking stream of the device is captured) are not recorded; those frees wait for a device
 * synchronisation (found by fuzz_ops with its capture operations on). */
static void test_null_stream_during_known_capture(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *warm[4], *g = NULL;
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, (size_t)(i + 1) << 20, SB, &warm[i]), GPUMEM_OK);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, warm[i], SB), GPUMEM_OK); /* a second stream: events */
  capture_begin(SA);
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, SA, &g), GPUMEM_OK); /* the library meets the capture */
  for (int i = 0; i < 32; i++) {
    void *p = NULL;
    assert_status(gpumem_alloc(ctx, 0, (size_t)(1 + i % 5) << 20, NULL, &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  }
  capture_end_intact(SA);
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  assert_status(gpumem_capture_ended(ctx, 0, SA), GPUMEM_OK);
  assert_status(gpumem_capture_pools_release(ctx, 0), GPUMEM_OK);
  expect_empty_after_trim(ctx);
  tu_ctx_done(ctx);
}

/* While a capture is known, no path frees a segment to the driver, the limit's making room included
 * (a free there invalidated the capture: found by fuzz_ops with its capture operations on). */
static void test_limit_room_during_capture(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags |= GPUMEM_CONFIG_NO_ENV;
  cfg.expandable = 0;
  cfg.limit_bytes = 16u << 20;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = NULL, *g = NULL, *q = (void *)0x99;
  assert_status(gpumem_alloc(ctx, 0, 12u << 20, SB, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SB), GPUMEM_OK);
  capture_begin(SA);
  assert_status(gpumem_alloc(ctx, 0, 1u << 20, SA, &g), GPUMEM_OK); /* the capture's pool: 2 MiB */
  /* 14 MiB fit only if the cached 12 MiB went back to the driver: not during the capture */
  assert_status(gpumem_alloc(ctx, 0, 14u << 20, SB, &q), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(q, (void *)0x99);
  capture_end_intact(SA);
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  assert_status(gpumem_capture_ended(ctx, 0, SA), GPUMEM_OK);
  assert_status(gpumem_capture_pools_release(ctx, 0), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 14u << 20, SB, &q), GPUMEM_OK); /* now the room is made */
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  expect_empty_after_trim(ctx);
  tu_ctx_done(ctx);
}

/* A second capture, begun while one is known, is met at its stream's first free as at its first
 * allocation: when the first ends, the context stays in capture mode for it (a trim frees nothing to
 * the driver, which would invalidate it). */
static void test_second_capture_met_by_free(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *c[4], *g = NULL, *b = NULL;
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, 4u << 20, NULL, &c[i]), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 1u << 20, SB, &b), GPUMEM_OK);
  capture_begin(SA);
  assert_status(gpumem_alloc(ctx, 0, 1u << 20, SA, &g), GPUMEM_OK); /* the first capture, met */
  assert_status(gpumem_sim_stream_begin_capture(0, SB, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, SB), GPUMEM_OK); /* the second one's first call */
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, c[i], NULL), GPUMEM_OK);
  capture_end_intact(SA);
  assert_status(gpumem_free(ctx, g, SA), GPUMEM_OK);
  assert_status(gpumem_capture_ended(ctx, 0, SA), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  capture_end_intact(SB);
  assert_status(gpumem_capture_ended(ctx, 0, SB), GPUMEM_OK);
  assert_status(gpumem_capture_pools_release(ctx, 0), GPUMEM_OK);
  expect_empty_after_trim(ctx);
  tu_ctx_done(ctx);
}

/* gpumem_graph_pool_alloc_at: a pool restored to a recorded state (PyTorch's checkpoints). */
static void test_alloc_at_restores_state(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  const gpumem_stream sa = tu_is_sim() ? SA : NULL; /* a made-up stream handle only on sim */
  const gpumem_stream sb = tu_stream((uintptr_t)SB);
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  void *a, *b, *c;
  assert_status(gpumem_graph_pool_alloc(gp, 3 << 20, sa, &a), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc(gp, 1000, sa, &b), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc(gp, 5 << 20, sa, &c), GPUMEM_OK);
  gpumem_stats s0;
  memset(&s0, 0, sizeof s0);
  assert_status(gpumem_graph_pool_get_stats(gp, &s0), GPUMEM_OK);
  /* the recorded state: a, b, c live. Later all are freed, the memory reused by others ... */
  assert_status(gpumem_free(ctx, a, sa), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, sa), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, sb), GPUMEM_OK);
  void *x;
  assert_status(gpumem_graph_pool_alloc(gp, 3 << 20, sb, &x), GPUMEM_OK);
  /* ... a range that overlaps a live block is refused, and nothing changes */
  assert_status(gpumem_graph_pool_alloc_at(gp, x, 4096), GPUMEM_ERR_BUSY);
  assert_status(gpumem_graph_pool_alloc_at(gp, (char *)x + (1 << 20), 1 << 20), GPUMEM_ERR_BUSY); /* inside it */
  assert_status(gpumem_graph_pool_alloc_at(gp, (char *)x + (3 << 20) - 256, 512), GPUMEM_ERR_BUSY); /* across its end */
  assert_status(gpumem_free(ctx, x, sb), GPUMEM_OK);
  /* restore: each block at its address again, in any order, the middle one first */
  assert_status(gpumem_graph_pool_alloc_at(gp, b, 1000), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc_at(gp, c, 5 << 20), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc_at(gp, a, 3 << 20), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc_at(gp, b, 1000), GPUMEM_ERR_BUSY); /* live now */
  gpumem_stats s1;
  memset(&s1, 0, sizeof s1);
  assert_status(gpumem_graph_pool_get_stats(gp, &s1), GPUMEM_OK);
  assert_int_equal(s1.allocated_bytes, s0.allocated_bytes);
  assert_int_equal(s1.num_live, s0.num_live);
  assert_int_equal(s1.reserved_bytes, s0.reserved_bytes); /* no growth: the same memory */
  /* the restored blocks are ordinary blocks: writable, freed once, never twice */
  assert_status(gpumem_free(ctx, b, sa), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, sa), GPUMEM_ERR_INVALID_POINTER);
  /* a range inside a free block, with free memory left on both sides */
  uintptr_t mid = (uintptr_t)c + (1 << 20);
  assert_status(gpumem_free(ctx, c, sa), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc_at(gp, (void *)mid, 256), GPUMEM_OK);
  void *lo, *hi;
  assert_status(gpumem_graph_pool_alloc(gp, 1 << 20, sa, &lo), GPUMEM_OK); /* the space before still serves */
  assert_status(gpumem_graph_pool_alloc(gp, 2 << 20, sa, &hi), GPUMEM_OK);
  assert_false(overlaps(lo, 1 << 20, (void *)mid, 256));
  assert_false(overlaps(hi, 2 << 20, (void *)mid, 256));
  assert_status(gpumem_free(ctx, (void *)mid, sa), GPUMEM_OK);
  assert_status(gpumem_free(ctx, lo, sa), GPUMEM_OK);
  assert_status(gpumem_free(ctx, hi, sa), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, sa), GPUMEM_OK);
  /* everything free again, coalesced: the whole first segment can be taken at its start */
  assert_status(gpumem_graph_pool_alloc_at(gp, a, 3 << 20), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, sa), GPUMEM_OK);
  assert_status(gpumem_graph_pool_get_stats(gp, &s1), GPUMEM_OK);
  assert_int_equal(s1.num_live, 0);
  assert_int_equal(s1.allocated_bytes, 0);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_alloc_at_bad_input(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  const gpumem_stream sa = tu_is_sim() ? SA : NULL; /* a made-up stream handle only on sim */
  gpumem_graph_pool *gp;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  void *a, *outside;
  assert_status(gpumem_graph_pool_alloc(gp, 4096, sa, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4096, sa, &outside), GPUMEM_OK); /* the device pool's, not the graph's */
  assert_status(gpumem_free(ctx, a, sa), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc_at(NULL, a, 4096), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_alloc_at(gp, a, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_alloc_at(gp, (char *)a + 8, 256), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_alloc_at(gp, a, SIZE_MAX), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_alloc_at(gp, NULL, 256), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_graph_pool_alloc_at(gp, outside, 256), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_graph_pool_alloc_at(gp, a, (size_t)64 << 30), GPUMEM_ERR_INVALID_POINTER); /* past its segment */
  gpumem_stats st;
  memset(&st, 0, sizeof st);
  assert_status(gpumem_graph_pool_get_stats(gp, &st), GPUMEM_OK);
  assert_int_equal(st.num_live, 0); /* nothing changed */
  assert_status(gpumem_free(ctx, outside, sa), GPUMEM_OK);
  void *keep; /* a live block keeps the released pool (and gp) until it is freed */
  assert_status(gpumem_graph_pool_alloc(gp, 8192, sa, &keep), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_alloc_at(gp, a, 4096), GPUMEM_ERR_INVALID_ARGUMENT); /* released */
  assert_status(gpumem_free(ctx, keep, sa), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_capture_allocates_in_pool, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_forked_stream_follows_capture, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_noted_free_during_capture, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_unrouted_capture_gets_own_pool, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_unrouted_captures_apart, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_reset_during_capture, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_free_only_captures_leave_nothing, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_destroyed_capture_stream, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_explicit_alloc, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_destroy_with_live_graph_block, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_bad_input, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_set_limit, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_limit_counts_graph_pools, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_set_limit_covers_graph_pools, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_null_stream_during_known_capture, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_limit_room_during_capture, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_second_capture_met_by_free, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_trim_counts_released_pool, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_released_pool_free_fails, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_alloc_at_restores_state, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_alloc_at_bad_input, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
