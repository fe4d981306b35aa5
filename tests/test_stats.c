/* Statistics: every field after known sequences, ALL = sum, peak reset, consistency after random sequences. */
#include "testutil.h"

static void test_fresh_and_struct_size(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_stats st = tu_stats(ctx, 0);
  gpumem_stats zero;
  memset(&zero, 0, sizeof zero);
  tu_assert_stats_equal(&st, &zero);
  st = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  tu_assert_stats_equal(&st, &zero);
  /* struct_size 0: the current size */
  gpumem_stats s0;
  memset(&s0, 0x11, sizeof s0);
  s0.struct_size = 0;
  assert_status(gpumem_get_stats(ctx, 0, &s0), GPUMEM_OK);
  assert_true(s0.allocated_bytes == 0 && s0.num_limit_exceeded == 0);
  /* an older, shorter struct: nothing written past it */
  gpumem_stats old;
  memset(&old, 0x11, sizeof old);
  old.struct_size = (uint32_t)offsetof(gpumem_stats, requested_bytes);
  assert_status(gpumem_get_stats(ctx, 0, &old), GPUMEM_OK);
  assert_true(old.num_ooms == 0);
  assert_true(old.requested_bytes == 0x1111111111111111ull);
  assert_true(old.num_limit_exceeded == 0x1111111111111111ull);
  /* too small to hold anything */
  old.struct_size = 3;
  assert_status(gpumem_get_stats(ctx, 0, &old), GPUMEM_ERR_INVALID_ARGUMENT);
  tu_ctx_done(ctx);
}

static void test_known_sequence(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a = NULL, *b = NULL;
  assert_status(gpumem_alloc(ctx, 0, 1000, NULL, &a), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_allocs == 1 && s.num_frees == 0 && s.num_live == 1);
  assert_true(s.requested_bytes == 1000);
  assert_true(s.allocated_bytes >= 1000 && s.allocated_bytes <= 1000 + 4096);
  assert_true(s.reserved_bytes >= s.allocated_bytes);
  assert_true(s.num_segments >= 1 && s.num_backend_allocs >= 1 && s.num_backend_frees == 0);
  assert_true(s.allocated_peak == s.allocated_bytes && s.reserved_peak == s.reserved_bytes);
  assert_true(s.num_trims == 0 && s.trimmed_bytes == 0 && s.num_ooms == 0 && s.num_oom_retries == 0);
  if (tu_is_sim()) assert_true(tu_sim_used(0) >= s.reserved_bytes);
  uint64_t one = s.allocated_bytes;

  assert_status(gpumem_alloc(ctx, 0, 5 * TU_MiB, NULL, &b), GPUMEM_OK);
  s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_allocs == 2 && s.num_live == 2);
  assert_true(s.requested_bytes == 1000 + 5 * TU_MiB);
  assert_true(s.allocated_bytes >= one + 5 * TU_MiB);
  uint64_t peak = s.allocated_bytes;

  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_frees == 1 && s.num_live == 1);
  assert_true(s.allocated_bytes == one && s.requested_bytes == 1000);
  assert_true(s.allocated_peak == peak);
  assert_true(s.cached_bytes == s.reserved_bytes - s.allocated_bytes);

  /* peak reset: to the current values */
  assert_status(gpumem_reset_peak_stats(ctx, 0), GPUMEM_OK);
  s = tu_stats(ctx, 0);
  assert_true(s.allocated_peak == s.allocated_bytes);
  assert_true(s.reserved_peak == s.reserved_bytes);

  /* trim: counters move, the live block stays */
  uint64_t released = 0;
  gpumem_stats before = s;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  if (released > 0) {
    assert_true(s.num_trims == before.num_trims + 1);
    assert_true(s.trimmed_bytes == before.trimmed_bytes + released);
    assert_true(s.num_backend_frees > before.num_backend_frees);
  }
  assert_true(s.reserved_bytes == before.reserved_bytes - released);
  assert_true(s.reserved_peak == before.reserved_peak);

  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_allocs == 2 && s.num_frees == 2 && s.num_live == 0);
  assert_true(s.allocated_bytes == 0 && s.reserved_bytes == 0 && s.cached_bytes == 0 && s.num_segments == 0);
  assert_true(s.num_backend_allocs == s.num_backend_frees);
  if (tu_is_sim()) assert_true(tu_sim_used(0) == 0);
  tu_ctx_done(ctx);
}

#define SUM_FIELDS(X)                                                                                          \
  X(allocated_bytes) X(reserved_bytes) X(cached_bytes) X(num_allocs) X(num_frees) X(num_live) X(num_segments) \
  X(num_backend_allocs) X(num_backend_frees) X(num_trims) X(trimmed_bytes) X(num_oom_retries) X(num_ooms)     \
  X(requested_bytes) X(num_limit_exceeded) X(num_share_asks) X(num_share_asked) X(share_given_bytes)

static void test_all_is_sum(void **state) {
  (void)state;
  if (tu_is_sim()) {
    assert_int_equal(tu_ctx_live(), 0);
    tu_setenv("GPUMEM_SIM_DEVICES", "3x1GiB");
  }
  gpumem_context *ctx = tu_ctx_new(NULL);
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  void *p[3][5];
  for (int d = 0; d < n && d < 3; d++)
    for (int i = 0; i < 5; i++) assert_status(gpumem_alloc(ctx, d, (size_t)(d + 1) * (size_t)(i + 1) * 300000, NULL, &p[d][i]), GPUMEM_OK);
  for (int d = 0; d < n && d < 3; d++)
    for (int i = 0; i < 5; i += 2) assert_status(gpumem_free(ctx, p[d][i], NULL), GPUMEM_OK);
  if (n >= 2) assert_status(gpumem_trim(ctx, 1, 0, NULL), GPUMEM_OK);
  gpumem_stats all = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  tu_assert_stats_sane(&all);
  gpumem_stats sum;
  memset(&sum, 0, sizeof sum);
  for (int d = 0; d < n; d++) {
    gpumem_stats s = tu_stats(ctx, d);
    tu_assert_stats_sane(&s);
#define ADD(f) sum.f += s.f;
    SUM_FIELDS(ADD)
#undef ADD
  }
#define CMP(f)                                                                                                \
  if (sum.f != all.f) {                                                                                       \
    print_error("ALL.%s = %llu but the devices sum to %llu\n", #f, (unsigned long long)all.f, (unsigned long long)sum.f); \
    fail();                                                                                                   \
  }
  SUM_FIELDS(CMP)
#undef CMP
  /* peak reset on ALL resets every device */
  assert_status(gpumem_reset_peak_stats(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
  for (int d = 0; d < n; d++) {
    gpumem_stats s = tu_stats(ctx, d);
    assert_true(s.allocated_peak == s.allocated_bytes && s.reserved_peak == s.reserved_bytes);
  }
  for (int d = 0; d < n && d < 3; d++)
    for (int i = 1; i < 5; i += 2) assert_status(gpumem_free(ctx, p[d][i], NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_random_sequences(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  enum { N = 400, STEPS = 6000 };
  void *p[N] = {0};
  size_t sz[N] = {0};
  uint64_t rng = 12345, live = 0, req = 0, allocs = 0, frees = 0, peak_req = 0;
  const int steps = (int)tu_scaled(STEPS, 750); /* valgrind: fewer (testutil.h) */
  for (int step = 0; step < steps; step++) {
    int i = (int)(tu_rand(&rng) % N);
    if (p[i]) {
      assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
      p[i] = NULL;
      live--;
      req -= sz[i];
      frees++;
    } else {
      uint64_t r = tu_rand(&rng) % 100;
      sz[i] = (size_t)(r < 70 ? tu_rand_range(&rng, 1, 64 * 1024) : r < 95 ? tu_rand_range(&rng, 64 * 1024, 4 * TU_MiB)
                                                                             : tu_rand_range(&rng, 4 * TU_MiB, 40 * TU_MiB));
      assert_status(gpumem_alloc(ctx, 0, sz[i], NULL, &p[i]), GPUMEM_OK);
      live++;
      req += sz[i];
      allocs++;
      if (req > peak_req) peak_req = req;
    }
    if (step % 500 == 0) assert_status(gpumem_trim(ctx, 0, tu_rand(&rng) % (64 * TU_MiB), NULL), GPUMEM_OK);
    if (step % 50 == 0 || step == steps - 1) {
      gpumem_stats s = tu_stats(ctx, 0);
      tu_assert_stats_sane(&s);
      assert_true(s.num_live == live);
      assert_true(s.num_live == s.num_allocs - s.num_frees);
      assert_true(s.num_allocs == allocs && s.num_frees == frees);
      assert_true(s.requested_bytes == req);
      assert_true(s.allocated_bytes >= req);
      assert_true(s.allocated_bytes <= req + live * 2 * TU_MiB); /* rounding is bounded */
      assert_true(s.allocated_peak >= peak_req);
      assert_true(s.reserved_bytes >= s.allocated_bytes);
      if (tu_is_sim()) assert_true(tu_sim_used(0) >= s.reserved_bytes);
    }
  }
  assert_int_equal(tu_find_overlap(p, sz, N), -1);
  for (int i = 0; i < N; i++)
    if (p[i]) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_true(s.allocated_bytes == 0 && s.num_live == 0 && s.cached_bytes == s.reserved_bytes);
  tu_ctx_done(ctx);
}

static void test_limit_and_oom_counters(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.limit_bytes = 8 * TU_MiB;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = (void *)0x1;
  for (int i = 0; i < 3; i++) assert_status(gpumem_alloc(ctx, 0, 9 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_true(s.num_limit_exceeded == 3 && s.num_allocs == 0 && s.num_ooms == 0);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_fresh_and_struct_size), TU_TEST(test_known_sequence),      TU_TEST(test_all_is_sum),
      TU_TEST(test_random_sequences),      TU_TEST(test_limit_and_oom_counters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
