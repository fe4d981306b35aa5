/* Trimming: one device and ALL, keep_bytes, released figure, release_threshold, trim_free_fraction. */
#include "testutil.h"

/* On sim: two 1 GiB devices, so that one device's trim can be told apart from the other's. */
static int two_devices(void) {
  if (tu_is_sim()) {
    assert_int_equal(tu_ctx_live(), 0);
    tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  }
  return 0;
}

static int ndev(gpumem_context *ctx) {
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  return n;
}

static void fill_and_free(gpumem_context *ctx, int dev, int count, size_t size) {
  void *p[64];
  assert_true(count <= 64);
  for (int i = 0; i < count; i++) assert_status(gpumem_alloc(ctx, dev, size, NULL, &p[i]), GPUMEM_OK);
  for (int i = 0; i < count; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
}

static void test_trim_one_device(void **state) {
  (void)state;
  two_devices();
  gpumem_context *ctx = tu_ctx_new(NULL);
  if (ndev(ctx) < 2) skip();
  fill_and_free(ctx, 0, 8, 3 * TU_MiB);
  fill_and_free(ctx, 1, 8, 3 * TU_MiB);
  gpumem_stats b0 = tu_stats(ctx, 0), b1 = tu_stats(ctx, 1);
  assert_true(b0.cached_bytes >= 24 * TU_MiB);
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  gpumem_stats a0 = tu_stats(ctx, 0), a1 = tu_stats(ctx, 1);
  tu_assert_stats_sane(&a0);
  assert_true(released == b0.reserved_bytes - a0.reserved_bytes);
  assert_true(released >= 24 * TU_MiB);
  assert_true(a0.reserved_bytes == 0 && a0.cached_bytes == 0 && a0.num_segments == 0);
  assert_true(a0.num_trims == b0.num_trims + 1);
  assert_true(a0.trimmed_bytes == b0.trimmed_bytes + released);
  assert_true(a0.num_backend_frees > b0.num_backend_frees);
  tu_assert_stats_equal(&b1, &a1); /* the other device is untouched */
  if (tu_is_sim()) {
    assert_true(tu_sim_used(0) == 0);
    assert_true(tu_sim_used(1) >= b1.reserved_bytes);
  }
  /* nothing left to trim: released 0 and num_trims unchanged */
  released = 77;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  assert_true(released == 0);
  gpumem_stats c0 = tu_stats(ctx, 0);
  assert_true(c0.num_trims == a0.num_trims);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK); /* released may be NULL */
  tu_ctx_done(ctx);
}

static void test_trim_all(void **state) {
  (void)state;
  two_devices();
  gpumem_context *ctx = tu_ctx_new(NULL);
  int n = ndev(ctx);
  for (int d = 0; d < n && d < 2; d++) fill_and_free(ctx, d, 4, 5 * TU_MiB);
  gpumem_stats before = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, &released), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  assert_true(released == before.reserved_bytes);
  assert_true(after.reserved_bytes == 0 && after.cached_bytes == 0);
  assert_true(after.trimmed_bytes == before.trimmed_bytes + released);
  if (tu_is_sim()) assert_true(tu_sim_used_total() == 0);
  tu_ctx_done(ctx);
}

static void test_trim_keep_bytes(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  fill_and_free(ctx, 0, 10, 4 * TU_MiB);
  fill_and_free(ctx, 0, 3, 21 * TU_MiB);
  fill_and_free(ctx, 0, 40, 100 * TU_KiB);
  gpumem_stats b = tu_stats(ctx, 0);
  const uint64_t keep = 16 * TU_MiB;
  assert_true(b.cached_bytes > keep);
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, 0, keep, &released), GPUMEM_OK);
  gpumem_stats a = tu_stats(ctx, 0);
  tu_assert_stats_sane(&a);
  /* nothing is live, so every cached byte can go: at most keep_bytes stay */
  assert_true(a.cached_bytes <= keep);
  assert_true(released == b.reserved_bytes - a.reserved_bytes);
  assert_true(released > 0);
  if (tu_is_sim()) assert_true(tu_sim_used(0) >= a.reserved_bytes);
  /* keep more than cached: nothing happens */
  assert_status(gpumem_trim(ctx, 0, UINT64_MAX, &released), GPUMEM_OK);
  assert_true(released == 0);
  tu_ctx_done(ctx);
}

static void test_trim_with_live_blocks(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *live = NULL;
  const size_t ln = 2 * TU_MiB + 5;
  assert_status(gpumem_alloc(ctx, 0, ln, NULL, &live), GPUMEM_OK);
  tu_stamp(live, ln, 3);
  fill_and_free(ctx, 0, 10, 4 * TU_MiB);
  fill_and_free(ctx, 0, 3, 21 * TU_MiB);
  gpumem_stats b = tu_stats(ctx, 0);
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  gpumem_stats a = tu_stats(ctx, 0);
  tu_assert_stats_sane(&a);
  /* the blocks that were never next to the live one can go; the live block stays */
  assert_true(released > 0);
  assert_true(released == b.reserved_bytes - a.reserved_bytes);
  assert_true(a.cached_bytes < b.cached_bytes);
  assert_true(a.allocated_bytes == b.allocated_bytes && a.num_live == 1);
  assert_true(a.reserved_bytes >= ln);
  assert_true(tu_stamp_ok(live, ln, 3));
  size_t sz = 0;
  assert_status(gpumem_ptr_info(ctx, live, &sz, NULL), GPUMEM_OK);
  assert_int_equal(sz, ln);
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK);
  /* now everything can go */
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  a = tu_stats(ctx, 0);
  assert_true(a.reserved_bytes == 0);
  tu_ctx_done(ctx);
}

static void test_release_threshold(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  const uint64_t thr = 8 * TU_MiB;
  cfg.release_threshold = thr;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  enum { N = 12 };
  void *p[N];
  for (int i = 0; i < N; i++) assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &p[i]), GPUMEM_OK);
  for (int i = 0; i < N; i++) {
    assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
    gpumem_stats st = tu_stats(ctx, 0);
    tu_assert_stats_sane(&st);
    /* Memory in a segment that still holds a live block may not be returnable
     * (plain segments); once nothing is live every cached byte is. */
    if (i == N - 1 && st.cached_bytes > thr) {
      print_error("after free %d: cached %llu > release_threshold %llu\n", i, (unsigned long long)st.cached_bytes,
                  (unsigned long long)thr);
      fail();
    }
  }
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.num_trims >= 1);
  if (tu_is_sim()) assert_true(tu_sim_used(0) <= thr + 64 * TU_KiB);
  tu_ctx_done(ctx);
}

/* Returns cached bytes after: alloc 100 MiB, free, external usage 700 MiB, alloc 150 MiB (the pool grows). */
static uint64_t free_fraction_scenario(double fraction, gpumem_stats *out) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.trim_free_fraction = fraction;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 100 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.cached_bytes >= 100 * TU_MiB);
  /* someone else takes memory: free falls to about 224 MiB of 1 GiB, under half */
  assert_status(gpumem_sim_set_external_usage(0, 700 * TU_MiB), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 150 * TU_MiB, NULL, &q), GPUMEM_OK); /* cannot come from the cache: grows */
  *out = tu_stats(ctx, 0);
  tu_assert_stats_sane(out);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  assert_status(gpumem_sim_set_external_usage(0, 0), GPUMEM_OK);
  tu_ctx_done(ctx);
  return out->cached_bytes;
}

static void test_trim_free_fraction(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "1GiB");
  gpumem_stats with, without;
  /* expandable segments never grow while cached chunks are idle: the 150 MiB
   * block takes the 100 MiB over (moved, not trimmed) and only 50 MiB are new */
  tu_setenv("GPUMEM_EXPANDABLE", "1");
  uint64_t cv = free_fraction_scenario(0.5, &with);
  assert_true(cv < 2 * TU_MiB);
  assert_true(with.reserved_bytes >= 150 * TU_MiB && with.reserved_bytes < 152 * TU_MiB);
  /* plain segments: */
  tu_setenv("GPUMEM_EXPANDABLE", "0");
  /* fraction 0.5: the growth sees free < 50 % and gives the cached 100 MiB back */
  uint64_t c1 = free_fraction_scenario(0.5, &with);
  assert_true(c1 < 100 * TU_MiB);
  assert_true(with.num_trims >= 1);
  assert_true(with.reserved_bytes < 250 * TU_MiB);
  /* fraction 0 disables it: the 100 MiB stay cached */
  uint64_t c0 = free_fraction_scenario(0.0, &without);
  assert_true(c0 >= 100 * TU_MiB);
  assert_true(without.num_trims == 0);
}

static void test_trim_invalid(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  uint64_t r = 5;
  assert_status(gpumem_trim(ctx, -2, 0, &r), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_trim(ctx, 1 << 20, 0, &r), GPUMEM_ERR_INVALID_DEVICE);
  assert_true(r == 5);
  /* trimming a device never used is fine and releases nothing */
  assert_status(gpumem_trim(ctx, 0, 0, &r), GPUMEM_OK);
  assert_true(r == 0);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_trim_one_device),    TU_TEST(test_trim_all),           TU_TEST(test_trim_keep_bytes), TU_TEST(test_trim_with_live_blocks),
      TU_TEST(test_release_threshold), TU_TEST(test_trim_free_fraction), TU_TEST(test_trim_invalid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
