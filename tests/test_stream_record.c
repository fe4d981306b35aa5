/* gpumem_record_stream (src/stream_order.c, "Streams noted on live blocks"):
 * a block allocated on A, used by work on B too and noted with
 * gpumem_record_stream(B), then freed on A, serves no allocation on any
 * stream, A included, before B's work queued up to the free has completed.
 * Every size path: thread-cache sizes, pool sizes, large blocks; expandable
 * and plain segments. The sim's delayed mode keeps B's work pending until the
 * test completes it. Bad input: clear statuses, nothing changed. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "gpumem/sim.h"
#include "testutil.h"

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)
#define SC ((gpumem_stream)(uintptr_t)0xC0)

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static gpumem_context *ctx_mode(int expandable) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.expandable = expandable;
  cfg.flags |= GPUMEM_CONFIG_NO_ENV;
  return tu_ctx_new(&cfg);
}

/* Whether B's work can have completed: only a device synchronisation by the library completes
 * another stream's work on the sim (the test completes A's itself). */
static uint64_t syncs(void) { return gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC); }

/* p of n bytes, noted on B (and C), freed on A: 40 allocations of n on A, and on B, while B's
 * (and C's) work is pending, never overlap p; once it completed, p's memory serves again. */
static void check_size(size_t n, int expandable, int two_streams) {
  gpumem_context *ctx = ctx_mode(expandable);
  gpumem_sim_set_delayed(1);
  void *p;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  /* warm the path as a loop would: the block has been through A's thread cache before */
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK); /* twice: the same */
  if (two_streams) assert_status(gpumem_record_stream(ctx, p, SC), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA); /* A's own work is done; B's (and C's) is not */
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA);
  uint64_t s0 = syncs();
  void *q[40];
  int checked = 0;
  for (int i = 0; i < 40; i++) {
    gpumem_stream s = i % 2 ? SB : SA;
    assert_status(gpumem_alloc(ctx, 0, n, s, &q[i]), GPUMEM_OK);
    if (syncs() == s0) { /* the device was not waited for: B's work is still pending */
      assert_false(overlaps(p, n, q[i], n));
      checked++;
    }
    gpumem_sim_stream_complete(0, SA);
  }
  assert_true(checked >= 8); /* the pool grows for a while before it waits for the device */
  for (int i = 0; i < 40; i++) assert_status(gpumem_free(ctx, q[i], i % 2 ? SB : SA), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SB);
  if (two_streams) {
    /* C still pending: still never p */
    gpumem_sim_stream_complete(0, SA);
    void *r;
    uint64_t s1 = syncs();
    assert_status(gpumem_alloc(ctx, 0, n, SA, &r), GPUMEM_OK);
    assert_true(syncs() != s1 || !overlaps(p, n, r, n));
    assert_status(gpumem_free(ctx, r, SA), GPUMEM_OK);
    gpumem_sim_stream_complete(0, SC);
  }
  gpumem_sim_complete_all();
  /* everything completed: the memory is free for reuse (a trim can give all of it back) */
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_int_equal(st.num_live, 0);
  assert_int_equal(st.allocated_bytes, 0);
  tu_ctx_done(ctx);
}

static void test_thread_cache_size(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  check_size(64 * 1024, 1, 0);
  check_size(64 * 1024, 0, 0);
}

static void test_pool_size(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  check_size(4 * 1024 * 1024, 1, 0);
  check_size(4 * 1024 * 1024, 0, 1);
}

static void test_large_size(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  check_size(64 * 1024 * 1024, 1, 1);
  check_size(64 * 1024 * 1024, 0, 0);
}

/* Noting the freeing stream itself changes nothing: A reuses the block at once. */
static void test_freeing_stream_noted(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 4 * 1024 * 1024;
  void *p, *q;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* The noted streams' events are what the block waits for: a trim (which waits for the device)
 * makes it free; a reset drops noted and parked blocks with everything else. */
static void test_trim_and_reset_with_noted_blocks(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  void *p, *q, *r;
  assert_status(gpumem_alloc(ctx, 0, 8 << 20, SA, &p), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 8 << 20, SA, &q), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 << 10, SA, &r), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, q, SB), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, r, SC), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* parked */
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_int_equal(st.num_live, 2);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK); /* parked again */
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK); /* drops the parked q and the noted live r */
  assert_status(gpumem_free(ctx, r, SA), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_record_stream(ctx, r, SB), GPUMEM_ERR_INVALID_POINTER);
  st = tu_stats(ctx, 0);
  assert_int_equal(st.num_live, 0);
  assert_int_equal(st.reserved_bytes, 0);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* No event can be recorded on the noted stream: the free waits for the device instead. */
static void test_event_failure_waits(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 4 * 1024 * 1024;
  void *p, *q;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  uint64_t syncs = gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_sim_fail_clear();
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC) > syncs);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* No event can be recorded on the noted stream and the device cannot be synchronised either: B's
 * work may still be running, so the block is parked without events; no stream gets it, A included,
 * until a device synchronisation succeeds (here, a trim's once the faults are gone). */
static void test_event_and_sync_failure_parks(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 4 * 1024 * 1024;
  void *p, *q[2];
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_SYNC, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_int_equal(st.num_live, 0);
  /* B's work pending and no synchronisation possible: A and C are given other memory */
  for (int i = 0; i < 2; i++) {
    assert_status(gpumem_alloc(ctx, 0, n, i ? SC : SA, &q[i]), GPUMEM_OK);
    assert_false(overlaps(p, n, q[i], n));
  }
  for (int i = 0; i < 2; i++) assert_status(gpumem_free(ctx, q[i], i ? SC : SA), GPUMEM_OK);
  gpumem_sim_fail_clear();
  /* the device can be synchronised again: a trim waits for it, and the parked block is free */
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  st = tu_stats(ctx, 0);
  assert_int_equal(st.allocated_bytes, 0);
  assert_int_equal(st.reserved_bytes, 0);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* A noted free while a capture the library has not met is under way on the device (no call named its
 * stream yet): an event on the NULL stream, or on the captured stream, would invalidate it, so the
 * free asks first and parks the block without events until a device synchronisation (found by fuzz_ops
 * with its capture operations on). */
static void test_noted_free_during_unmet_capture(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 4 * 1024 * 1024;
  void *p, *q, *r;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, q, SC), GPUMEM_OK);
  assert_status(gpumem_sim_stream_begin_capture(0, SC, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK); /* NULL: the legacy stream, which the capture blocks */
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);   /* noted on the captured stream */
  assert_status(gpumem_alloc(ctx, 0, n, SA, &r), GPUMEM_OK);
  assert_false(overlaps(p, n, r, n)); /* parked: B's work may be running */
  assert_false(overlaps(q, n, r, n));
  int inv = -1;
  assert_status(gpumem_sim_stream_end_capture(0, SC, &inv), GPUMEM_OK);
  assert_int_equal(inv, 0);
  assert_status(gpumem_free(ctx, r, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK); /* synchronises the device: the parked blocks go */
  gpumem_stats st = tu_stats(ctx, 0);
  assert_int_equal(st.allocated_bytes, 0);
  assert_int_equal(st.reserved_bytes, 0);
  tu_ctx_done(ctx);
}

static void test_bad_input(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_context *other = tu_ctx_new(NULL);
  void *p, *o;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_alloc(other, 0, 1 << 20, NULL, &o), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_record_stream(NULL, p, SB), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_record_stream(ctx, NULL, SB), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_record_stream(ctx, (char *)p + 256, SB), GPUMEM_ERR_INVALID_POINTER); /* interior */
  assert_status(gpumem_record_stream(ctx, o, SB), GPUMEM_ERR_INVALID_POINTER);               /* another context's */
  int local;
  assert_status(gpumem_record_stream(ctx, &local, SB), GPUMEM_ERR_INVALID_POINTER); /* never allocated */
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(tu_stats_equal(&before, &after));
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, p, SB), GPUMEM_ERR_INVALID_POINTER); /* freed (now in a cache) */
  assert_status(gpumem_free(other, o, NULL), GPUMEM_OK);
  tu_ctx_done(other);
  tu_ctx_done(ctx);
}

/* Several threads note one block at once, then it is freed: one note per stream, no lost note. */
typedef struct {
  gpumem_context *ctx;
  void *p;
  gpumem_stream s;
} note_arg;

static void *note_thread(void *a) {
  note_arg *na = a;
  for (int i = 0; i < 200; i++)
    if (gpumem_record_stream(na->ctx, na->p, na->s) != GPUMEM_OK) return (void *)1;
  return NULL;
}

static void test_concurrent_notes(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  const size_t n = 2 * 1024 * 1024;
  for (int round = 0; round < 20; round++) {
    void *p;
    assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
    pthread_t t[4];
    note_arg a[4];
    for (int i = 0; i < 4; i++) {
      a[i].ctx = ctx;
      a[i].p = p;
      a[i].s = (gpumem_stream)(uintptr_t)(0x1000 + 0x10 * i);
      assert_int_equal(pthread_create(&t[i], NULL, note_thread, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
      void *ret;
      assert_int_equal(pthread_join(t[i], &ret), 0);
      assert_null(ret);
    }
    assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
    /* three of the four noted streams complete: p still never comes back */
    for (int i = 0; i < 3; i++) gpumem_sim_stream_complete(0, a[i].s);
    gpumem_sim_stream_complete(0, SA);
    void *q;
    uint64_t s1 = syncs();
    assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
    assert_true(syncs() != s1 || !overlaps(p, n, q, n));
    assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
    gpumem_sim_complete_all();
  }
  tu_ctx_done(ctx);
}

/* A pool that has seen streams A and C (the sim's work delayed), and p of n bytes allocated on A
 * and noted on B. Returns the context; *p_out is p. */
static gpumem_context *noted_on_b(int expandable, size_t n, void **p_out) {
  gpumem_context *ctx = ctx_mode(expandable);
  gpumem_sim_set_delayed(1);
  void *c;
  assert_status(gpumem_alloc(ctx, 0, n, SA, p_out), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4096, SC, &c), GPUMEM_OK); /* a second stream of the pool */
  assert_status(gpumem_free(ctx, c, SC), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_status(gpumem_record_stream(ctx, *p_out, SB), GPUMEM_OK);
  return ctx;
}

/* Once B's work and A's (up to the free) have completed, the block is every stream's: C gets its
 * memory without a call on A and without a device synchronisation, and the pool does not grow.
 * (Freed on A as any block was, it served only A until A's next call gave it an event: a loading
 * stream's batch, noted on the main stream, sat there through the main stream's next step.) */
static void test_noted_block_ready_for_every_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  for (int expandable = 0; expandable < 2; expandable++) {
    const size_t n = 16 * 1024 * 1024;
    void *p, *q;
    gpumem_context *ctx = noted_on_b(expandable, n, &p);
    assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* A's and B's work pending */
    /* B pending: C never gets p */
    gpumem_sim_stream_complete(0, SA);
    uint64_t s0 = syncs();
    assert_status(gpumem_alloc(ctx, 0, n, SC, &q), GPUMEM_OK); /* (kept live: C's own free block would be taken first) */
    assert_true(syncs() != s0 || !overlaps(p, n, q, n));
    /* B done too: C gets p's memory, nothing new is reserved */
    gpumem_sim_complete_all();
    gpumem_stats before = tu_stats(ctx, 0);
    s0 = syncs();
    void *big;
    assert_status(gpumem_alloc(ctx, 0, n, SC, &big), GPUMEM_OK);
    gpumem_stats after = tu_stats(ctx, 0);
    assert_true(syncs() == s0);
    assert_true(overlaps(p, n, big, n));
    assert_int_equal(after.reserved_bytes, before.reserved_bytes);
    assert_status(gpumem_free(ctx, big, SC), GPUMEM_OK);
    assert_status(gpumem_free(ctx, q, SC), GPUMEM_OK);
    gpumem_sim_complete_all();
    tu_ctx_done(ctx);
  }
}

/* The freeing stream's event could not be recorded (the fourth event call of the free: B's
 * create and record, then A's): the block still waits for B, no device synchronisation, and then
 * serves A as a block freed on A does; the other streams get it after A's next call. */
static void test_noted_block_own_event_fails(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  const size_t n = 16 * 1024 * 1024;
  void *p, *q[3];
  gpumem_context *ctx = noted_on_b(1, n, &p);
  uint64_t s0 = syncs(), e0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_EVENT);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 4, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_sim_fail_clear();
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_EVENT) - e0 == 4); /* the fourth was the one refused */
  assert_true(syncs() == s0);
  /* B pending: neither A nor C gets p (their blocks kept live: a stream takes its own free ones first) */
  gpumem_sim_stream_complete(0, SA);
  gpumem_sim_stream_complete(0, SC);
  for (int i = 0; i < 2; i++) {
    assert_status(gpumem_alloc(ctx, 0, n, i ? SC : SA, &q[i]), GPUMEM_OK);
    assert_true(syncs() != s0 || !overlaps(p, n, q[i], n));
  }
  /* B done: A reuses p at once */
  gpumem_sim_complete_all();
  s0 = syncs();
  assert_status(gpumem_alloc(ctx, 0, n, SA, &q[2]), GPUMEM_OK);
  assert_true(syncs() == s0 && overlaps(p, n, q[2], n));
  for (int i = 0; i < 3; i++) assert_status(gpumem_free(ctx, q[i], i == 1 ? SC : SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_thread_cache_size, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_pool_size, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_large_size, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_freeing_stream_noted, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_trim_and_reset_with_noted_blocks, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_event_failure_waits, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_event_and_sync_failure_parks, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_noted_free_during_unmet_capture, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_bad_input, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_notes, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_noted_block_ready_for_every_stream, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_noted_block_own_event_fails, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
