/* Stream-ordered reuse: same stream at once, other streams only after the freeing stream's work
 * completed. A block freed on stream A serves stream B once A's work before the free has
 * completed, without the pool growing (DESIGN.md: "on another stream only after the work queued
 * on S before the free has completed"), also in a pool that has seen only A so far; and after a
 * long single-stream run (where the pool stops recording an event at each free: the solo path),
 * B still never gets A's memory while A's work is pending; and A's frees reach other streams
 * without A being asked by them: once enough was freed on A, or after another stream missed. */
#include "testutil.h"

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)
#define SC ((gpumem_stream)(uintptr_t)0xC0)

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static void test_same_stream_immediate_reuse(void **state) {
  (void)state;
  /* on sim: a 64 MiB device and 40 MiB blocks, so two such blocks can never be held at once */
  if (tu_is_sim()) {
    assert_int_equal(tu_ctx_live(), 0);
    tu_setenv("GPUMEM_SIM_DEVICES", "64MiB");
  }
  gpumem_context *ctx = tu_ctx_new(NULL);
  if (tu_is_sim()) gpumem_sim_set_delayed(1);
  gpumem_stream s = tu_is_sim() ? SA : NULL;
  void *p = NULL, *q = NULL;
  const size_t n = 40 * TU_MiB;
  assert_status(gpumem_alloc(ctx, 0, n, s, &p), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_status(gpumem_free(ctx, p, s), GPUMEM_OK);
  /* no completion in between: the same stream may reuse at once, without new backend memory */
  assert_status(gpumem_alloc(ctx, 0, n, s, &q), GPUMEM_OK);
  gpumem_stats s2 = tu_stats(ctx, 0);
  assert_true(s2.num_backend_allocs == s1.num_backend_allocs);
  assert_true(s2.reserved_bytes == s1.reserved_bytes);
  if (tu_is_sim()) assert_true(overlaps(p, n, q, n)); /* the only 40 MiB there is */
  assert_status(gpumem_free(ctx, q, s), GPUMEM_OK);
  if (tu_is_sim()) gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_cross_stream_waits_for_event(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 2 * TU_MiB;
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  tu_stamp(p, n, 0xA);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* work queued on A may still read p */

  /* B must not get any part of p while A's work is pending */
  enum { K = 8 };
  void *q[K];
  size_t qs[K];
  for (int i = 0; i < K; i++) {
    qs[i] = (i % 2) ? n : n / 4;
    assert_status(gpumem_alloc(ctx, 0, qs[i], SB, &q[i]), GPUMEM_OK);
    if (overlaps(p, n, q[i], qs[i])) {
      print_error("block freed on stream A handed to stream B before A completed (%p vs %p)\n", p, q[i]);
      fail();
    }
    tu_stamp(q[i], qs[i], (uint32_t)(0xB00 + i));
  }
  assert_true(tu_stamp_ok_pending(p, n, 0xA)); /* A's data was not overwritten by B's users */
  for (int i = 0; i < K; i++) assert_status(gpumem_free(ctx, q[i], SB), GPUMEM_OK);

  /* once A's work completes, B may have it: the pool serves B without growing */
  gpumem_sim_stream_complete(0, SB);
  gpumem_sim_stream_complete(0, SA);
  gpumem_stats before = tu_stats(ctx, 0);
  void *r = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SC, &r), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(after.reserved_bytes == before.reserved_bytes);
  assert_true(after.num_backend_allocs == before.num_backend_allocs);
  assert_status(gpumem_free(ctx, r, SC), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_cross_stream_address_reuse_after_completion(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 8 * TU_MiB;
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SB, &q), GPUMEM_OK);
  assert_false(overlaps(p, n, q, n));
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  /* complete only A: p becomes available to anyone, q (pending on B) not */
  gpumem_sim_stream_complete(0, SA);
  void *r = NULL, *t = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SC, &r), GPUMEM_OK);
  assert_false(overlaps(q, n, r, n));
  assert_status(gpumem_alloc(ctx, 0, n, SC, &t), GPUMEM_OK);
  assert_false(overlaps(q, n, t, n));
  assert_false(overlaps(r, n, t, n));
  assert_status(gpumem_free(ctx, r, SC), GPUMEM_OK);
  assert_status(gpumem_free(ctx, t, SC), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_free_on_other_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = TU_MiB;
  void *p = NULL;
  /* allocated for A, handed to B's work, freed on B */
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  tu_stamp(p, n, 77);
  assert_status(gpumem_free(ctx, p, SB), GPUMEM_OK);
  /* A (not the freeing stream) must wait for B */
  void *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
  assert_false(overlaps(p, n, q, n));
  tu_stamp(q, n, 78);
  assert_true(tu_stamp_ok_pending(p, n, 77)); /* p: freed on B, B still pending */
  /* B itself may reuse at once */
  void *r = NULL;
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, n, SB, &r), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(after.num_backend_allocs == before.num_backend_allocs);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, r, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_pending_then_sync_paths(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  /* a small device: the only memory left is pending on another stream, so the pool must wait for it */
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "64MiB");
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, SA, &p), GPUMEM_OK);
  tu_stamp(p, 40 * TU_MiB, 1);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  /* waiting (event synchronize) completes A's work in the sim, so this succeeds */
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, SB, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  /* trim waits for pending frees and gives everything back */
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes == 0);
  assert_true(tu_sim_used(0) == 0);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_many_streams_no_overlap(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  enum { N = 300, NS = 5 };
  void *p[N] = {0};
  size_t sz[N] = {0};
  gpumem_stream st[N];
  uint64_t rng = 3;
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < N; i++) {
      if (p[i] && tu_rand(&rng) % 2) {
        assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
        assert_status(gpumem_free(ctx, p[i], st[i]), GPUMEM_OK);
        p[i] = NULL;
      } else if (!p[i]) {
        sz[i] = (size_t)tu_rand_range(&rng, 1, 600000);
        st[i] = (gpumem_stream)(uintptr_t)(0x100 * (1 + tu_rand(&rng) % NS));
        assert_status(gpumem_alloc(ctx, 0, sz[i], st[i], &p[i]), GPUMEM_OK);
        tu_stamp(p[i], sz[i], (uint32_t)i);
      }
    }
    assert_int_equal(tu_find_overlap(p, sz, N), -1);
    if (round == 1) gpumem_sim_complete_all();
  }
  for (int i = 0; i < N; i++)
    if (p[i]) {
      assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
      assert_status(gpumem_free(ctx, p[i], st[i]), GPUMEM_OK);
    }
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* Handover: blocks above the thread caches' sizes, so the pool decides. */
enum { HANDOVER_N = 4 * 1024 * 1024 };

static void test_short_program_hands_over_after_completion(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_EXPANDABLE", "1"); /* the only room is p's (a plain segment holds more than p) */
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  void *p, *q;
  assert_status(gpumem_alloc(ctx, 0, HANDOVER_N, SA, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, HANDOVER_N, SB, &q), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(overlaps(p, HANDOVER_N, q, HANDOVER_N));
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  assert_int_equal(after.num_backend_allocs, before.num_backend_allocs);
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_long_single_stream_run_never_hands_over_early(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  /* a long run on A alone: past the pool's warm-up, its frees get no event */
  for (int i = 0; i < 600; i++) {
    void *t;
    assert_status(gpumem_alloc(ctx, 0, HANDOVER_N + (size_t)(i % 7) * 256 * 1024, SA, &t), GPUMEM_OK);
    assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK);
  }
  void *p;
  assert_status(gpumem_alloc(ctx, 0, HANDOVER_N, SA, &p), GPUMEM_OK);
  tu_stamp(p, HANDOVER_N, 0xA);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* A's queued work may still read p */
  /* B, while A's work is pending: never any part of p (nor of anything A freed) */
  void *q[4];
  for (int i = 0; i < 4; i++) {
    assert_status(gpumem_alloc(ctx, 0, HANDOVER_N, SB, &q[i]), GPUMEM_OK);
    assert_false(overlaps(p, HANDOVER_N, q[i], HANDOVER_N));
    tu_stamp(q[i], HANDOVER_N, (uint32_t)(0xB0 + i));
  }
  assert_true(tu_stamp_ok_pending(p, HANDOVER_N, 0xA));
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, q[i], SB), GPUMEM_OK);
  /* A's next call, then completion: A's memory is everyone's again */
  void *t;
  assert_status(gpumem_alloc(ctx, 0, 512, SA, &t), GPUMEM_OK);
  assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  gpumem_stats before = tu_stats(ctx, 0);
  void *r[4];
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, HANDOVER_N, SB, &r[i]), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, r[i], SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* The pool's second stream, B, with a free of its own (a stream record: the pool is multi-stream,
 * frees are batched with events); returns B's live 2 MiB block (above the thread caches' sizes, so the
 * pool sees its calls). */
static void *second_stream(gpumem_context *ctx) {
  void *y = NULL;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, SB, &y), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, SB, &y), GPUMEM_OK);
  return y;
}

/* B allocates n bytes: its block lies inside one of A's k freed blocks of n bytes, and the pool does
 * not grow for it. Returns B's block. */
static void *b_takes_a_block(gpumem_context *ctx, void *const *freed, int k, size_t n) {
  void *q = NULL;
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, n, SB, &q), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  int reused = 0;
  for (int i = 0; i < k; i++) reused |= overlaps(freed[i], n, q, n);
  print_message("B's block %s A's freed blocks; reserved %llu -> %llu\n", reused ? "inside" : "outside",
                (unsigned long long)before.reserved_bytes, (unsigned long long)after.reserved_bytes);
  assert_true(reused);
  assert_true(after.reserved_bytes == before.reserved_bytes);
  return q;
}

/* Frees on a stream whose earlier batch is still pending are asked about once enough was freed
 * (a 128th of the pool, at least 2 MiB), not only after another stream missed: blocks A freed
 * while nothing else ran serve B once A's work completed, and the pool does not grow for B. */
static void test_large_frees_reach_other_streams(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  enum { K = 8 };
  const size_t n = 8 * TU_MiB;
  void *x = NULL, *y = NULL, *p[K], *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, SA, &x), GPUMEM_OK);
  for (int i = 0; i < K; i++) assert_status(gpumem_alloc(ctx, 0, n, SA, &p[i]), GPUMEM_OK);
  y = second_stream(ctx);
  gpumem_sim_set_delayed(1);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK); /* A's batch, pending */
  gpumem_sim_complete_all();                          /* done on the device; nobody asked yet */
  for (int i = 0; i < K; i++) assert_status(gpumem_free(ctx, p[i], SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  q = b_takes_a_block(ctx, p, K, n);
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* A stream's last frees while its batch is still pending get an event of their own (a second
 * batch): once A's work completed, they serve B although A makes no call after them. (With one
 * batch per stream they stayed in A's index without an event until A's next call.) */
static void test_tail_frees_reach_other_streams(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  const size_t n = 8 * TU_MiB;
  void *x = NULL, *y = NULL, *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, SA, &x), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  y = second_stream(ctx);
  gpumem_sim_set_delayed(1);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK); /* A's batch, pending */
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* A's last free: asks, x's batch not done */
  gpumem_sim_complete_all();                          /* A's work done; A makes no more calls */
  q = b_takes_a_block(ctx, &p, 1, n);
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* With two batches pending, later frees join the newer one and its event is recorded again after
 * them: none of those blocks serves another stream before the new record's work completed, even
 * when the newer batch's first record has (a device a constant distance behind: the sim's clock). */
static void test_joined_frees_wait_for_their_record(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  const size_t n = 8 * TU_MiB;
  void *x = NULL, *y = NULL, *p1 = NULL, *p2 = NULL, *q[3] = {NULL, NULL, NULL};
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, SA, &x), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p1), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p2), GPUMEM_OK);
  y = second_stream(ctx);
  gpumem_sim_set_delayed(1);
  gpumem_sim_set_clock(1);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);  /* batch 1, recorded at 1 */
  gpumem_sim_set_clock(2);
  assert_status(gpumem_free(ctx, p1, SA), GPUMEM_OK); /* batch 2, recorded at 2 */
  gpumem_sim_set_clock(3);
  assert_status(gpumem_free(ctx, p2, SA), GPUMEM_OK); /* joins batch 2, recorded again at 3 */
  gpumem_sim_complete_before(3);                       /* the records at 1 and 2 are done, not the one at 3 */
  for (int i = 0; i < 3; i++) assert_status(gpumem_alloc(ctx, 0, n, SB, &q[i]), GPUMEM_OK);
  for (int i = 0; i < 3; i++) {
    assert_false(overlaps(p1, n, q[i], n));
    assert_false(overlaps(p2, n, q[i], n));
  }
  for (int i = 0; i < 3; i++) assert_status(gpumem_free(ctx, q[i], SB), GPUMEM_OK);
  gpumem_sim_complete_all(); /* now they are done: B may have them */
  gpumem_sim_set_delayed(0);
  void *r = NULL;
  assert_status(gpumem_alloc(ctx, 0, 2 * n, SC, &r), GPUMEM_OK);
  assert_status(gpumem_free(ctx, r, SC), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* A miss of another stream (an allocation that would map new memory) makes the next free on A ask
 * A's pending batch even when A freed little since: A's earlier frees then serve other streams. */
static void test_miss_makes_a_stream_ask(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_EXPANDABLE", "1"); /* the miss of an expandable pool (plain pools: alloc_locked in pool.c) */
  gpumem_context *ctx = tu_ctx_new(NULL);
  const size_t n = 8 * TU_MiB, small = 3 * TU_MiB / 2; /* small: above the thread caches, below what asks */
  void *x = NULL, *y = NULL, *big = NULL, *q = NULL, *z = NULL, *w = NULL;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, SA, &x), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &big), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, small, SA, &z), GPUMEM_OK);
  y = second_stream(ctx);
  gpumem_sim_set_delayed(1);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);   /* A's batch: x, pending */
  assert_status(gpumem_free(ctx, big, SA), GPUMEM_OK); /* 8 MiB: asks, not done: big stays unbatched */
  gpumem_stats s0 = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, n, SB, &q), GPUMEM_OK); /* B misses: new memory */
  assert_true(tu_stats(ctx, 0).reserved_bytes > s0.reserved_bytes);
  gpumem_sim_complete_all(); /* x and big done on the device */
  /* a free on A below what asks by itself: after B's miss it asks; x's batch is done, so big and z
   * get a batch of their own */
  assert_status(gpumem_free(ctx, z, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, n, SC, &w), GPUMEM_OK); /* a third stream: big's memory, no growth */
  gpumem_stats s2 = tu_stats(ctx, 0);
  print_message("reserved %llu -> %llu; C's block %s big\n", (unsigned long long)s1.reserved_bytes,
                (unsigned long long)s2.reserved_bytes, overlaps(big, n, w, n) ? "inside" : "outside");
  assert_true(s2.reserved_bytes == s1.reserved_bytes);
  assert_true(overlaps(big, n, w, n));
  assert_status(gpumem_free(ctx, w, SC), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* GPUMEM_LOG=debug explains a rise of the reserved peak above the live peak: a block freed on A
 * while A's work is pending cannot serve B, so B's allocation grows the pool, and the log line says
 * that 64 MiB of it were freed on another stream and wait for the device. A growth at the live peak
 * (the first allocation) logs nothing. Expandable segments and plain segments. */
typedef struct peak_log {
  char last[1024];
  int n;
} peak_log;

static void peak_log_fn(void *user, gpumem_log_level level, const char *msg) {
  peak_log *l = user;
  if (level != GPUMEM_LOG_DEBUG || strstr(msg, "reserved peak") == NULL) return;
  l->n++;
  snprintf(l->last, sizeof l->last, "%s", msg);
}

static void peak_log_run(int expandable) {
  tu_setenv("GPUMEM_EXPANDABLE", expandable ? "1" : "0");
  peak_log log;
  memset(&log, 0, sizeof log);
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.log_callback = peak_log_fn;
  cfg.log_user = &log;
  cfg.log_level = GPUMEM_LOG_DEBUG;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  gpumem_sim_set_delayed(1);
  const size_t n = 64 * TU_MiB;
  void *x = NULL, *y = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &x), GPUMEM_OK);
  assert_int_equal(log.n, 0); /* the pool grew at the live peak */
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SB, &y), GPUMEM_OK);
  assert_false(overlaps(x, n, y, n));
  print_message("%s\n", log.last);
  assert_int_equal(log.n, 1);
  assert_non_null(strstr(log.last, "for 64.0 MiB on stream"));
  assert_non_null(strstr(log.last, "0.0 MiB freed on this stream"));
  assert_non_null(strstr(log.last, "64.0 MiB freed on other streams"));
  assert_non_null(strstr(log.last, expandable ? "idle chunks" : "free for every stream"));
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_peak >= 2 * n);
  /* a block noted on stream C and freed on A waits for C: B grows again, and the line says so */
  void *z = NULL, *w = NULL;
  assert_status(gpumem_alloc(ctx, 0, n / 2, SA, &z), GPUMEM_OK); /* A's own free memory, at once */
  assert_status(gpumem_record_stream(ctx, z, SC), GPUMEM_OK);
  assert_status(gpumem_free(ctx, z, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n / 2, SB, &w), GPUMEM_OK);
  print_message("%s\n", log.last);
  assert_int_equal(log.n, 2);
  assert_non_null(strstr(log.last, "32.0 MiB waiting for streams noted by gpumem_record_stream"));
  assert_status(gpumem_free(ctx, w, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
  tu_setenv("GPUMEM_EXPANDABLE", NULL);
}

static void test_peak_log_names_memory_in_flight(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  peak_log_run(1);
  peak_log_run(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_same_stream_immediate_reuse),
      TU_TEST(test_cross_stream_waits_for_event),
      TU_TEST(test_cross_stream_address_reuse_after_completion),
      TU_TEST(test_free_on_other_stream),
      TU_TEST(test_pending_then_sync_paths),
      TU_TEST(test_many_streams_no_overlap),
      TU_TEST(test_short_program_hands_over_after_completion),
      TU_TEST(test_long_single_stream_run_never_hands_over_early),
      TU_TEST(test_large_frees_reach_other_streams),
      TU_TEST(test_tail_frees_reach_other_streams),
      TU_TEST(test_joined_frees_wait_for_their_record),
      TU_TEST(test_miss_makes_a_stream_ask),
      TU_TEST(test_peak_log_names_memory_in_flight),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
