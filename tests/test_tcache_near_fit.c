/* A thread cache with no block of the exact size asked serves a cached block
 * of up to 12.5 % more (the one freed last in the request's size class when it
 * is not smaller, else the smallest of the class and the two above: src/tcache.c
 * near_fit), and never a block outside that window; statistics stay exact
 * (requested bytes are the request's, allocated bytes the block's). */
#include <string.h>

#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);

enum { KB = 1024 };

/* one block of `size` cached in this thread's cache; returns its address */
static void *cache_one(gpumem_context *ctx, size_t size) {
  void *p;
  assert_status(gpumem_alloc(ctx, 0, size, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  return p;
}

static void test_near_size_is_served_from_the_cache(void **state) {
  (void)state;
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a = cache_one(ctx, 100 * KB);
  gpumem_stats before = tu_stats(ctx, 0);
  void *p;
  /* 92 KiB: 100 KiB is within 12.5 % above it */
  assert_status(gpumem_alloc(ctx, 0, 92 * KB, NULL, &p), GPUMEM_OK);
  assert_ptr_equal(p, a);
  size_t req = 0;
  assert_status(gpumem_ptr_info(ctx, p, &req, NULL), GPUMEM_OK);
  assert_int_equal(req, 92 * KB);
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_int_equal(s.requested_bytes, 92 * KB);
  assert_int_equal(s.allocated_bytes, 100 * KB);
  assert_int_equal(s.num_live, 1);
  assert_int_equal(s.num_backend_allocs, before.num_backend_allocs);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  s = tu_stats(ctx, 0);
  assert_true(s.num_live == 0 && s.requested_bytes == 0 && s.allocated_bytes == 0);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_outside_the_window_is_not(void **state) {
  (void)state;
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a = cache_one(ctx, 100 * KB);
  void *p, *q;
  /* 88 KiB: 100 KiB is 13.6 % more, outside the window */
  assert_status(gpumem_alloc(ctx, 0, 88 * KB, NULL, &p), GPUMEM_OK);
  assert_ptr_not_equal(p, a);
  /* larger than the cached block: never served from it */
  assert_status(gpumem_alloc(ctx, 0, 100 * KB + 256, NULL, &q), GPUMEM_OK);
  assert_ptr_not_equal(q, a);
  size_t req = 0;
  assert_status(gpumem_ptr_info(ctx, q, &req, NULL), GPUMEM_OK);
  assert_int_equal(req, 100 * KB + 256);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_smallest_fitting_block_wins(void **state) {
  (void)state;
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *big, *small, *x;
  assert_status(gpumem_alloc(ctx, 0, 112 * KB, NULL, &big), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 104 * KB, NULL, &small), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4 * KB, NULL, &x), GPUMEM_OK); /* keeps the two apart */
  assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, small, NULL), GPUMEM_OK);
  void *p;
  assert_status(gpumem_alloc(ctx, 0, 100 * KB, NULL, &p), GPUMEM_OK); /* both fit (12 % and 4 %): 104 KiB */
  assert_ptr_equal(p, small);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, x, NULL), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.requested_bytes == 0 && s.allocated_bytes == 0);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_near_size_is_served_from_the_cache, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_outside_the_window_is_not, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_smallest_fitting_block_wins, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
