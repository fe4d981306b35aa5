/* Reset: one device / ALL, stale pointers, the other device untouched, GPUMEM_RESET_DEVICE, bad flags. */
#include "testutil.h"

static gpumem_context *two_dev_ctx(void) {
  if (tu_is_sim()) {
    assert_int_equal(tu_ctx_live(), 0);
    tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  }
  gpumem_context *ctx = tu_ctx_new(NULL);
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  if (n < 2) {
    tu_ctx_done(ctx);
    skip();
  }
  return ctx;
}

static void test_reset_one_device(void **state) {
  (void)state;
  gpumem_context *ctx = two_dev_ctx();
  void *a[4], *b[4];
  for (int i = 0; i < 4; i++) {
    assert_status(gpumem_alloc(ctx, 0, (size_t)(i + 1) * TU_MiB, NULL, &a[i]), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 1, (size_t)(i + 1) * TU_MiB, NULL, &b[i]), GPUMEM_OK);
    tu_stamp(b[i], (size_t)(i + 1) * TU_MiB, (uint32_t)i);
  }
  assert_status(gpumem_free(ctx, a[3], NULL), GPUMEM_OK); /* some cached memory too */
  gpumem_stats b1 = tu_stats(ctx, 1);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  gpumem_stats s0 = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s0);
  assert_true(s0.reserved_bytes == 0 && s0.allocated_bytes == 0 && s0.num_live == 0 && s0.num_segments == 0);
  if (tu_is_sim()) assert_true(tu_sim_used(0) == 0);
  /* stale pointers */
  for (int i = 0; i < 3; i++) {
    assert_status(gpumem_ptr_info(ctx, a[i], NULL, NULL), GPUMEM_ERR_INVALID_POINTER);
    assert_status(gpumem_free(ctx, a[i], NULL), GPUMEM_ERR_INVALID_POINTER);
  }
  /* device 1 untouched */
  gpumem_stats b2 = tu_stats(ctx, 1);
  tu_assert_stats_equal(&b1, &b2);
  for (int i = 0; i < 4; i++) assert_true(tu_stamp_ok(b[i], (size_t)(i + 1) * TU_MiB, (uint32_t)i));
  /* device 0 works again */
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &p), GPUMEM_OK);
  tu_stamp(p, 3 * TU_MiB, 99);
  assert_true(tu_stamp_ok(p, 3 * TU_MiB, 99));
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, b[i], NULL), GPUMEM_OK);
  tu_ctx_done(ctx); /* nothing live: destroy is OK */
}

static void test_reset_all(void **state) {
  (void)state;
  gpumem_context *ctx = two_dev_ctx();
  void *a = NULL, *b = NULL;
  assert_status(gpumem_alloc(ctx, 0, TU_MiB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 1, TU_MiB, NULL, &b), GPUMEM_OK);
  gpumem_scope *sc = NULL;
  void *sp = NULL;
  assert_status(gpumem_scope_begin(ctx, 1, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, TU_MiB, &sp), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, GPUMEM_ALL_DEVICES, 0), GPUMEM_OK);
  gpumem_stats all = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  assert_true(all.reserved_bytes == 0 && all.num_live == 0);
  if (tu_is_sim()) assert_true(tu_sim_used_total() == 0);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_ERR_INVALID_POINTER);
  /* ending a scope whose blocks were invalidated: ends anyway, reports the first failed free (or OK) */
  gpumem_status s = gpumem_scope_end(sc);
  assert_true(s == GPUMEM_OK || s == GPUMEM_ERR_INVALID_POINTER);
  all = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  tu_assert_stats_sane(&all);
  assert_true(all.num_live == 0);
  tu_ctx_done(ctx);
}

static void test_reset_device_flag(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_true(tu_sim_used(0) > 0);
  assert_status(gpumem_reset(ctx, 0, GPUMEM_RESET_DEVICE), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes == 0 && st.num_live == 0);
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &p), GPUMEM_OK);
  tu_stamp(p, 8 * TU_MiB, 1);
  assert_true(tu_stamp_ok(p, 8 * TU_MiB, 1));
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_reset_bad_flags(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, TU_MiB, NULL, &p), GPUMEM_OK);
  tu_stamp(p, TU_MiB, 5);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_reset(ctx, 0, 0x80u), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_reset(ctx, GPUMEM_ALL_DEVICES, 0xFFFFFFFFu), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_stats after = tu_stats(ctx, 0);
  tu_assert_stats_equal(&before, &after);
  assert_true(tu_stamp_ok(p, TU_MiB, 5));
  assert_status(gpumem_reset(ctx, -2, 0), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  /* reset of a device never used: fine */
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_reset_with_pending_frees(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, (gpumem_stream)0xA, &p), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, (gpumem_stream)0xB, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, (gpumem_stream)0xA), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK); /* synchronises, drops everything */
  assert_true(tu_sim_used(0) == 0);
  assert_status(gpumem_free(ctx, q, (gpumem_stream)0xB), GPUMEM_ERR_INVALID_POINTER);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_reset_one_device), TU_TEST(test_reset_all),        TU_TEST(test_reset_device_flag),
      TU_TEST(test_reset_bad_flags),  TU_TEST(test_reset_with_pending_frees),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
