/* Limits: limit_bytes, limit_fraction, LIMIT_EXCEEDED without growing, initial_bytes, a limit lowered
 * below what is reserved. */
#include "testutil.h"

/* src/internal.h (the tests link the static library) */
gpumem_status gpumem__check_invariants(gpumem_context *ctx);

static void test_limit_bytes(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  const uint64_t lim = 32 * TU_MiB;
  cfg.limit_bytes = lim;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *a = NULL, *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, NULL, &a), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  uint64_t used = tu_is_sim() ? tu_sim_used(0) : 0;
  assert_status(gpumem_alloc(ctx, 0, 33 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x1);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(after.reserved_bytes == before.reserved_bytes);
  assert_true(after.num_backend_allocs == before.num_backend_allocs);
  assert_true(after.num_limit_exceeded == before.num_limit_exceeded + 1);
  assert_true(after.num_allocs == before.num_allocs && after.num_ooms == before.num_ooms);
  if (tu_is_sim()) assert_true(tu_sim_used(0) == used);
  /* small blocks until the limit says no: reserved never passes it */
  void *blk[256];
  int n = 0;
  gpumem_status s = GPUMEM_OK;
  while (n < 256) {
    s = gpumem_alloc(ctx, 0, 512 * TU_KiB, NULL, &blk[n]);
    gpumem_stats st = tu_stats(ctx, 0);
    tu_assert_stats_sane(&st);
    assert_true(st.reserved_bytes <= lim);
    assert_true(st.reserved_peak <= lim);
    if (s != GPUMEM_OK) break;
    n++;
  }
  assert_status(s, GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_true(n >= 16); /* the 16 MiB left under the limit are mostly usable */
  for (int i = 0; i < n; i++) assert_status(gpumem_free(ctx, blk[i], NULL), GPUMEM_OK);
  /* cached memory under the limit serves what fits */
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  /* with everything free, a request up to the limit fits (cached memory is given back to make room) */
  assert_status(gpumem_alloc(ctx, 0, 30 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_limit_fraction(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "1GiB,4GiB");
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.limit_fraction = 0.25;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 300 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x1);
  /* per device: a quarter of 4 GiB is 1 GiB */
  assert_status(gpumem_alloc(ctx, 1, 300 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 200 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_true(tu_stats(ctx, 0).reserved_bytes <= 256 * TU_MiB);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);

  /* both set: the stricter one applies */
  tu_config(&cfg);
  cfg.limit_fraction = 0.25;
  cfg.limit_bytes = 512 * TU_MiB;
  ctx = tu_ctx_new(&cfg);
  p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 300 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_status(gpumem_alloc(ctx, 1, 600 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x1);
  tu_ctx_done(ctx);
}

static void test_initial_bytes(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.initial_bytes = 32 * TU_MiB;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes == 0); /* not before first use */
  void *first = NULL;
  assert_status(gpumem_alloc(ctx, 0, 1024, NULL, &first), GPUMEM_OK);
  st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes >= 32 * TU_MiB);
  uint64_t backend_allocs = st.num_backend_allocs;
  /* the preallocation serves later requests without the backend */
  void *p[16];
  for (int i = 0; i < 16; i++) assert_status(gpumem_alloc(ctx, 0, TU_MiB, NULL, &p[i]), GPUMEM_OK);
  st = tu_stats(ctx, 0);
  assert_true(st.num_backend_allocs == backend_allocs);
  for (int i = 0; i < 16; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, first, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* One refusal is counted and logged once, also when the calling thread's cache holds blocks (the
 * cache is flushed and the pool asked again only where that can help). */
static void test_refusal_counted_once(void **state) {
  (void)state;
  TU_REQUIRE_CACHES();
  tu_log *log = tu_log_new();
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.limit_bytes = 64 * TU_MiB;
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *small[4];
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &small[i]), GPUMEM_OK);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, small[i], NULL), GPUMEM_OK); /* cached */
  void *big = NULL;
  assert_status(gpumem_alloc(ctx, 0, 128 * TU_MiB, NULL, &big), GPUMEM_ERR_LIMIT_EXCEEDED); /* never fits */
  assert_null(big);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_int_equal(st.num_limit_exceeded, 1);
  assert_int_equal(tu_log_count_matching(log, "refused", NULL), 1);
  /* one that fits the limit alone but not beside what is reserved: also once */
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &small[i]), GPUMEM_OK);
  void *mid = NULL;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &mid), GPUMEM_OK);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, small[i], NULL), GPUMEM_OK);
  void *more = NULL;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &more), GPUMEM_ERR_LIMIT_EXCEEDED);
  st = tu_stats(ctx, 0);
  assert_int_equal(st.num_limit_exceeded, 2);
  assert_int_equal(tu_log_count_matching(log, "refused", NULL), 2);
  assert_status(gpumem_free(ctx, mid, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_log_free(log);
}

/* A limit set below what is reserved: cached memory above it goes back at once, live memory stays
 * (reserved over the limit, every invariant holding), nothing grows until the memory is freed, and
 * then the pool fits under the new limit. */
static void test_limit_lowered_below_live(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *live = NULL, *spare = NULL, *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 48 * TU_MiB, NULL, &live), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, NULL, &spare), GPUMEM_OK);
  tu_stamp(live, 48 * TU_MiB, 7);
  assert_status(gpumem_free(ctx, spare, NULL), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_true(before.reserved_bytes >= 64 * TU_MiB);
  const uint64_t lim = 32 * TU_MiB;
  assert_status(gpumem_set_limit(ctx, 0, lim), GPUMEM_OK);
  uint64_t got = 0;
  assert_status(gpumem_get_limit(ctx, 0, &got), GPUMEM_OK);
  assert_true(got == lim);
  gpumem_stats mid = tu_stats(ctx, 0);
  tu_assert_stats_sane(&mid);
  assert_true(mid.reserved_bytes > lim);                                   /* the live block stays */
  assert_true(mid.reserved_bytes + 16 * TU_MiB <= before.reserved_bytes); /* the cached 16 MiB went back */
  assert_true(mid.allocated_bytes == before.allocated_bytes);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  /* nothing grows while over the limit */
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x1);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(after.reserved_bytes == mid.reserved_bytes);
  assert_true(tu_stamp_ok(live, 48 * TU_MiB, 7));
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  /* once freed and trimmed the pool is under the limit, and a request up to it fits */
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  after = tu_stats(ctx, 0);
  assert_true(after.reserved_bytes <= lim);
  assert_status(gpumem_alloc(ctx, 0, 30 * TU_MiB, NULL, &p), GPUMEM_OK);
  after = tu_stats(ctx, 0);
  assert_true(after.reserved_bytes <= lim);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_limit_bytes),
      TU_TEST(test_limit_fraction),
      TU_TEST(test_initial_bytes),
      TU_TEST(test_refusal_counted_once),
      TU_TEST(test_limit_lowered_below_live),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
