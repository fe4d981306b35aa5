/* Scoped handles: buffers, GPUMEM_SCOPED, scopes, tags. */
#include "testutil.h"

static uint64_t live(gpumem_context *ctx) { return tu_stats(ctx, GPUMEM_ALL_DEVICES).num_live; }

static void test_buffer(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_buffer b;
  memset(&b, 0, sizeof b);
  gpumem_stream s = tu_is_sim() ? (gpumem_stream)0x5 : NULL;
  assert_status(gpumem_buffer_alloc(ctx, 0, 12345, s, &b), GPUMEM_OK);
  assert_ptr_equal(b.ctx, ctx);
  assert_non_null(b.ptr);
  assert_int_equal((uintptr_t)b.ptr % 256, 0);
  assert_int_equal(b.size, 12345);
  assert_int_equal(b.device, 0);
  assert_ptr_equal(b.stream, s);
  tu_stamp(b.ptr, b.size, 1);
  assert_true(tu_stamp_ok(b.ptr, b.size, 1));
  assert_true(live(ctx) == 1);
  gpumem_buffer_release(&b);
  gpumem_buffer zero;
  memset(&zero, 0, sizeof zero);
  assert_memory_equal(&b, &zero, sizeof b);
  assert_true(live(ctx) == 0);
  gpumem_buffer_release(&b); /* twice is harmless */
  gpumem_buffer_release(NULL);
  assert_true(tu_stats(ctx, 0).num_frees == 1);
  /* bad arguments */
  assert_status(gpumem_buffer_alloc(ctx, 0, 10, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_buffer_alloc(NULL, 0, 10, NULL, &b), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_memory_equal(&b, &zero, sizeof b);
  /* size 0: an empty buffer, releasing it is harmless */
  assert_status(gpumem_buffer_alloc(ctx, 0, 0, NULL, &b), GPUMEM_OK);
  assert_null(b.ptr);
  gpumem_buffer_release(&b);
  assert_true(tu_stats(ctx, 0).num_allocs == 1);
  tu_ctx_done(ctx);
}

static void test_gpumem_scoped(void **state) {
  (void)state;
#ifdef GPUMEM_SCOPED
  gpumem_context *ctx = tu_ctx_new(NULL);
  for (int i = 0; i < 3; i++) {
    GPUMEM_SCOPED gpumem_buffer a = {0};
    GPUMEM_SCOPED gpumem_buffer b = {0};
    GPUMEM_SCOPED gpumem_buffer never = {0}; /* stays empty: cleanup must be harmless */
    (void)never;
    assert_status(gpumem_buffer_alloc(ctx, 0, TU_MiB, NULL, &a), GPUMEM_OK);
    assert_status(gpumem_buffer_alloc(ctx, 0, 3000, NULL, &b), GPUMEM_OK);
    assert_true(live(ctx) == 2);
    if (i == 1) continue; /* leaving the scope early releases too */
    gpumem_buffer_release(&a); /* released by hand, then again at scope exit */
    assert_true(live(ctx) == 1);
  }
  assert_true(live(ctx) == 0);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.num_allocs == 6 && st.num_frees == 6);
  tu_ctx_done(ctx);
#else
  skip();
#endif
}

static void test_scope(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_scope *sc = NULL;
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_non_null(sc);
  void *p[20];
  size_t sz[20];
  for (int i = 0; i < 20; i++) {
    sz[i] = (size_t)(i + 1) * 77777;
    assert_status(gpumem_scope_alloc(sc, sz[i], &p[i]), GPUMEM_OK);
    assert_int_equal((uintptr_t)p[i] % 256, 0);
    tu_stamp(p[i], sz[i], (uint32_t)i);
  }
  assert_int_equal(tu_find_overlap(p, sz, 20), -1);
  void *z = (void *)0x1;
  assert_status(gpumem_scope_alloc(sc, 0, &z), GPUMEM_OK);
  assert_null(z);
  for (int i = 0; i < 20; i++) assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
  assert_true(live(ctx) == 20);
  /* a second scope interleaved, and a plain allocation: only the scope's go at its end */
  gpumem_scope *sc2 = NULL;
  void *q = NULL, *plain = NULL;
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc2), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc2, 1000, &q), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 1000, NULL, &plain), GPUMEM_OK);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  assert_true(live(ctx) == 2);
  assert_status(gpumem_ptr_info(ctx, q, NULL, NULL), GPUMEM_OK);
  assert_status(gpumem_ptr_info(ctx, p[0], NULL, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_scope_end(sc2), GPUMEM_OK);
  assert_true(live(ctx) == 1);
  assert_status(gpumem_free(ctx, plain, NULL), GPUMEM_OK);
  /* an empty scope */
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_scope_errors(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_scope *sc = (gpumem_scope *)0x1;
  assert_status(gpumem_scope_begin(NULL, 0, NULL, &sc), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(sc, (gpumem_scope *)0x1);
  assert_status(gpumem_scope_begin(ctx, 0, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_scope_begin(ctx, 99, NULL, &sc), GPUMEM_ERR_INVALID_DEVICE);
  void *p = (void *)0x1;
  assert_status(gpumem_scope_alloc(NULL, 10, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_scope_end(NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_scope_set_tag(NULL, "x"), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, 10, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  /* a failing allocation leaves the scope usable */
  p = (void *)0x1;
  gpumem_status s = gpumem_scope_alloc(sc, SIZE_MAX / 2, &p);
  assert_true(s == GPUMEM_ERR_OUT_OF_MEMORY || s == GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(p, (void *)0x1);
  assert_status(gpumem_scope_alloc(sc, 4096, &p), GPUMEM_OK);
  assert_true(live(ctx) == 1);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  assert_true(live(ctx) == 0);
  tu_ctx_done(ctx);
}

static void test_scope_tags_in_leak_report(void **state) {
  (void)state;
  tu_log *log = tu_log_new();
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  gpumem_scope *sc = NULL;
  void *p = NULL;
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_set_tag(sc, "activations-scope"), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, 3000, &p), GPUMEM_OK);
  assert_status(gpumem_scope_set_tag(sc, NULL), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, 3000, &p), GPUMEM_OK);
  assert_status(gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY);
  int tagged = tu_log_count_matching(log, "activations-scope", NULL);
  if (tagged < 1) tu_log_dump(log);
  assert_true(tagged >= 1);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_log_free(log);
}

/* A long tag is cut to 40 characters in the leak report, so that every listed block fits. */
static void test_long_tag_in_leak_report(void **state) {
  (void)state;
  tu_log *log = tu_log_new();
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  static char tag[2000];
  memset(tag, 'x', sizeof tag - 1);
  void *p[3] = {0};
  assert_status(gpumem_alloc_tagged(ctx, 0, 1000, NULL, tag, &p[0]), GPUMEM_OK);
  assert_status(gpumem_alloc_tagged(ctx, 0, 2000, NULL, "second", &p[1]), GPUMEM_OK);
  assert_status(gpumem_alloc_tagged(ctx, 0, 3000, NULL, "third", &p[2]), GPUMEM_OK);
  assert_status(gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY);
  char cut[48];
  memset(cut, 'x', 41);
  cut[41] = '\0';
  int n = tu_log_count_matching(log, "3 live allocation(s)", "second", "third", NULL);
  if (n != 1) tu_log_dump(log);
  assert_int_equal(n, 1);
  assert_int_equal(tu_log_count_matching(log, cut, NULL), 0); /* never more than 40 of the tag */
  for (int i = 0; i < 3; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_log_free(log);
}

/* A scope that survives a reset of its device frees nothing it allocated before the reset: those
 * addresses may belong to someone else by then. What it allocates after the reset it frees. */
static void test_scope_survives_reset(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_scope *sc = NULL;
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  void *a = NULL, *b = NULL;
  assert_status(gpumem_scope_alloc(sc, 4096, &a), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, 3 * TU_MiB, &b), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  /* the same sizes again: another owner gets the same addresses (first fits in fresh segments) */
  void *x = NULL, *y = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &x), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &y), GPUMEM_OK);
  void *c = NULL;
  assert_status(gpumem_scope_alloc(sc, 8192, &c), GPUMEM_OK); /* after the reset: the scope's own */
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  size_t sz = 0;
  assert_status(gpumem_ptr_info(ctx, x, &sz, NULL), GPUMEM_OK); /* still live */
  assert_status(gpumem_ptr_info(ctx, y, &sz, NULL), GPUMEM_OK);
  assert_status(gpumem_ptr_info(ctx, c, &sz, NULL), GPUMEM_ERR_INVALID_POINTER); /* freed by the end */
  assert_int_equal(tu_stats(ctx, 0).num_live, 2);
  assert_status(gpumem_free(ctx, x, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, NULL), GPUMEM_OK);
  /* a reset of another device leaves the scope's pointers alone */
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, 4096, &a), GPUMEM_OK);
  int ndev = 0;
  assert_status(gpumem_device_count(ctx, &ndev), GPUMEM_OK);
  if (ndev > 1) assert_status(gpumem_reset(ctx, 1, 0), GPUMEM_OK);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  assert_int_equal(tu_stats(ctx, 0).num_live, 0);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_buffer),       TU_TEST(test_gpumem_scoped),        TU_TEST(test_scope),
      TU_TEST(test_scope_errors), TU_TEST(test_scope_tags_in_leak_report), TU_TEST(test_scope_survives_reset), TU_TEST(test_long_tag_in_leak_report),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
