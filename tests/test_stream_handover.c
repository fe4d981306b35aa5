/* A block freed on stream A serves stream B once A's work before the free has
 * completed, without the pool growing (DESIGN.md: "on another stream only
 * after the work queued on S before the free has completed"), also in a pool
 * that has seen only A so far; and after a long single-stream run (where the
 * pool stops recording an event at each free: src/pool.c "Single-stream
 * expandable pools"), B still never gets A's memory while A's work is
 * pending. Blocks above the thread caches' sizes, so the pool decides. */
#include <stdint.h>

#include "gpumem/sim.h"
#include "testutil.h"

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)

enum { N = 4 * 1024 * 1024 };

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static void test_short_program_hands_over_after_completion(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  void *p, *q;
  assert_status(gpumem_alloc(ctx, 0, N, SA, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, N, SB, &q), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(overlaps(p, N, q, N));
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
    assert_status(gpumem_alloc(ctx, 0, N + (size_t)(i % 7) * 256 * 1024, SA, &t), GPUMEM_OK);
    assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK);
  }
  void *p;
  assert_status(gpumem_alloc(ctx, 0, N, SA, &p), GPUMEM_OK);
  tu_stamp(p, N, 0xA);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* A's queued work may still read p */
  /* B, while A's work is pending: never any part of p (nor of anything A freed) */
  void *q[4];
  for (int i = 0; i < 4; i++) {
    assert_status(gpumem_alloc(ctx, 0, N, SB, &q[i]), GPUMEM_OK);
    assert_false(overlaps(p, N, q[i], N));
    tu_stamp(q[i], N, (uint32_t)(0xB0 + i));
  }
  assert_true(tu_stamp_ok_pending(p, N, 0xA));
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, q[i], SB), GPUMEM_OK);
  /* A's next call, then completion: A's memory is everyone's again */
  void *t;
  assert_status(gpumem_alloc(ctx, 0, 512, SA, &t), GPUMEM_OK);
  assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  gpumem_stats before = tu_stats(ctx, 0);
  void *r[4];
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, N, SB, &r[i]), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_int_equal(after.reserved_bytes, before.reserved_bytes);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, r[i], SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_short_program_hands_over_after_completion, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_long_single_stream_run_never_hands_over_early, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
