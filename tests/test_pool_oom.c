/* Out of memory: trim-and-retry, the OOM callback, counters, injected OOM. All on a 64 MiB simulated device. */
#include "testutil.h"

typedef struct oom_cb_state {
  gpumem_context *ctx;
  int calls;
  int device;
  size_t requested;
  void *to_free; /* freed by the callback when non-NULL */
  int answer;
} oom_cb_state;

static int oom_cb(void *user, int device, size_t requested) {
  oom_cb_state *s = (oom_cb_state *)user;
  s->calls++;
  s->device = device;
  s->requested = requested;
  if (s->to_free) {
    gpumem_free(s->ctx, s->to_free, NULL);
    gpumem_trim(s->ctx, device, 0, NULL); /* allowed from the callback */
    s->to_free = NULL;
  }
  return s->answer;
}

static gpumem_context *small_device_ctx_log(oom_cb_state *cb, gpumem_oom_fn fn, tu_log *log) {
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "1x64MiB");
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.watch_interval_ms = 0; /* no watcher: its free-fraction trims would race the trim-and-retry counted here */
  if (cb) {
    cfg.oom_callback = fn != NULL ? fn : oom_cb;
    cfg.oom_user = cb;
  }
  if (log) tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  if (cb) cb->ctx = ctx;
  return ctx;
}

static gpumem_context *small_device_ctx(oom_cb_state *cb) { return small_device_ctx_log(cb, NULL, NULL); }

static void test_trim_and_retry(void **state) {
  (void)state;
  oom_cb_state cb = {0};
  gpumem_context *ctx = small_device_ctx(&cb);
  /* fill the device with 4 MiB blocks */
  void *p[32];
  int n = 0;
  while (n < 32 && gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p[n]) == GPUMEM_OK) n++;
  assert_true(n >= 8);
  for (int i = 0; i < n; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  int calls_before = cb.calls;
  /* a different, bigger size: the cache holds the memory in pieces; the pool must give them back and retry */
  void *big = NULL;
  assert_status(gpumem_alloc(ctx, 0, 48 * TU_MiB, NULL, &big), GPUMEM_OK);
  assert_non_null(big);
  tu_stamp(big, 48 * TU_MiB, 48);
  gpumem_stats after = tu_stats(ctx, 0);
  tu_assert_stats_sane(&after);
  if (after.num_backend_allocs > before.num_backend_allocs) {
    /* it had to grow: the old pieces were given back on the way */
    assert_true(after.num_trims > before.num_trims || after.num_oom_retries > before.num_oom_retries ||
                after.num_backend_frees > before.num_backend_frees);
  }
  assert_true(after.num_ooms == before.num_ooms);
  assert_int_equal(cb.calls, calls_before); /* trimming was enough: no callback */
  assert_true(tu_stamp_ok(big, 48 * TU_MiB, 48));
  assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_callback_frees_and_retries(void **state) {
  (void)state;
  oom_cb_state cb = {0};
  gpumem_context *ctx = small_device_ctx(&cb);
  void *hog = NULL, *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &hog), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  cb.to_free = hog;
  cb.answer = 1;
  const size_t want = 40 * TU_MiB + 12345;
  assert_status(gpumem_alloc(ctx, 0, want, NULL, &p), GPUMEM_OK);
  assert_int_equal(cb.calls, 1);
  assert_int_equal(cb.device, 0);
  assert_int_equal(cb.requested, want);
  assert_null(cb.to_free);
  gpumem_stats after = tu_stats(ctx, 0);
  tu_assert_stats_sane(&after);
  assert_true(after.num_oom_retries > before.num_oom_retries);
  assert_true(after.num_ooms == before.num_ooms);
  assert_true(after.num_live == 1);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_callback_declines(void **state) {
  (void)state;
  oom_cb_state cb = {0};
  gpumem_context *ctx = small_device_ctx(&cb);
  void *hog = NULL, *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &hog), GPUMEM_OK);
  tu_stamp(hog, 40 * TU_MiB, 4);
  gpumem_stats before = tu_stats(ctx, 0);
  cb.answer = 0;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &p), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(p, (void *)0x1);
  assert_int_equal(cb.calls, 1);
  gpumem_stats after = tu_stats(ctx, 0);
  tu_assert_stats_sane(&after);
  assert_true(after.num_ooms == before.num_ooms + 1);
  assert_true(after.num_live == before.num_live && after.allocated_bytes == before.allocated_bytes);
  assert_true(tu_stamp_ok(hog, 40 * TU_MiB, 4));

  /* asking for a retry without freeing anything: exactly one more retry, then OUT_OF_MEMORY (no endless loop) */
  cb.calls = 0;
  cb.answer = 1;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &p), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(p, (void *)0x1);
  assert_int_equal(cb.calls, 1);
  gpumem_stats again = tu_stats(ctx, 0);
  assert_true(again.num_ooms == after.num_ooms + 1);
  assert_true(again.num_oom_retries > after.num_oom_retries);

  /* the context still works for what fits */
  void *small = NULL;
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &small), GPUMEM_OK);
  assert_status(gpumem_free(ctx, small, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, hog, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_no_callback_oom(void **state) {
  (void)state;
  gpumem_context *ctx = small_device_ctx(NULL);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 65 * TU_MiB, NULL, &p), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(p, (void *)0x1);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.num_ooms == 1);
  assert_true(st.num_allocs == 0 && st.reserved_bytes == 0);
  tu_ctx_done(ctx);
}

static void test_injected_oom_once(void **state) {
  (void)state;
  oom_cb_state cb = {0};
  gpumem_context *ctx = small_device_ctx(&cb);
  /* one backend malloc fails with OOM: the pool trims, retries and succeeds */
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, GPUMEM_SIM_ERR_OUT_OF_MEMORY, 0), GPUMEM_OK);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &p), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.num_oom_retries >= 1);
  assert_true(st.num_ooms == 0);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);

  /* every backend malloc fails: OUT_OF_MEMORY after the callback */
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, GPUMEM_SIM_ERR_OUT_OF_MEMORY, 1), GPUMEM_OK);
  cb.calls = 0;
  cb.answer = 0;
  p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &p), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(p, (void *)0x1);
  assert_int_equal(cb.calls, 1);
  st = tu_stats(ctx, 0);
  assert_true(st.num_ooms == 1);
  gpumem_sim_fail_clear();
  /* cleared: works again */
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_generic_backend_error_is_not_oom(void **state) {
  (void)state;
  oom_cb_state cb = {0};
  gpumem_context *ctx = small_device_ctx(&cb);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &p), GPUMEM_ERR_BACKEND);
  assert_ptr_equal(p, (void *)0x1);
  gpumem_sim_fail_clear();
  assert_int_equal(cb.calls, 0); /* not an out-of-memory: no callback */
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.num_ooms == 0);
  tu_ctx_done(ctx);
}

/* The out-of-memory report (DESIGN.md, Trimming, item 4): one warning with the request, the
 * device's allocated, reserved, cached bytes and largest free block (as gpumem_get_stats and
 * gpumem_largest_free_block give them), and the frees still pending per stream. */
static void expect_report(tu_log *log, gpumem_context *ctx, size_t want, const char *why, const char *pending) {
  gpumem_stats st = tu_stats(ctx, 0);
  uint64_t largest = 0;
  assert_status(gpumem_largest_free_block(ctx, 0, &largest), GPUMEM_OK);
  char head[128], figures[256];
  snprintf(head, sizeof head, "device 0: out of memory allocating %zu bytes%s: ", want, why);
  snprintf(figures, sizeof figures,
           "allocated %llu, reserved %llu, cached %llu, largest free block %llu bytes; frees pending: ",
           (unsigned long long)st.allocated_bytes, (unsigned long long)st.reserved_bytes,
           (unsigned long long)st.cached_bytes, (unsigned long long)largest);
  tu_log_dump(log);
  assert_int_equal(tu_log_count_matching(log, "out of memory", NULL), 1);
  assert_int_equal(tu_log_count_matching(log, head, figures, pending, NULL), 1);
}

/* A request no trim can serve (above the device) fails at once, before any wait: the report lists
 * the frees still pending on each stream, the first 8 streams by name and the rest as one sum. A
 * request that fits the device but not beside the live memory fails after the pool waited for
 * every pending free and given back every free segment: nothing is pending or cached then. */
static void test_report_names_pending_frees(void **state) {
  (void)state;
  tu_log *log = tu_log_new();
  gpumem_context *ctx = small_device_ctx_log(NULL, NULL, log);
  gpumem_sim_set_delayed(1);
  void *live = NULL, *p[10];
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &live), GPUMEM_OK);
  for (int i = 0; i < 10; i++) assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &p[i]), GPUMEM_OK);
  /* freed on streams whose work has not run: the other streams may not take them yet */
  for (int i = 0; i < 10; i++) assert_status(gpumem_free(ctx, p[i], (gpumem_stream)(uintptr_t)(0x100 + i)), GPUMEM_OK);
  void *q = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 65 * TU_MiB, NULL, &q), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(q, (void *)0x1);
  assert_true(tu_stats(ctx, 0).cached_bytes > 0);
  expect_report(log, ctx, 65 * TU_MiB, "",
                "2097152 bytes in 1 block on stream 0x100, 2097152 bytes in 1 block on stream 0x101, ");
  assert_int_equal(tu_log_count_matching(log, "2097152 bytes in 1 block on stream 0x107, "
                                              "4194304 bytes in 2 blocks on 2 more stream(s)", NULL), 1);
  assert_int_equal(tu_log_count_matching(log, "stream 0x108", NULL), 0);

  tu_log_clear(log);
  assert_status(gpumem_alloc(ctx, 0, 60 * TU_MiB, NULL, &q), GPUMEM_ERR_OUT_OF_MEMORY);
  expect_report(log, ctx, 60 * TU_MiB, "", "frees pending: none");
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
  tu_log_free(log);
}

static int free_on_stream_and_decline(void *user, int device, size_t requested) {
  oom_cb_state *s = (oom_cb_state *)user;
  s->calls++;
  s->device = device;
  s->requested = requested;
  if (s->to_free) gpumem_free(s->ctx, s->to_free, (gpumem_stream)(uintptr_t)0x5b); /* work not run yet: pending */
  s->to_free = NULL;
  return 0;
}

/* The callback frees a block on a stream and declines to retry: the report says so, with the same
 * figures, the block pending on that stream among them. */
static void test_report_when_callback_declines(void **state) {
  (void)state;
  tu_log *log = tu_log_new();
  oom_cb_state cb = {0};
  gpumem_context *ctx = small_device_ctx_log(&cb, free_on_stream_and_decline, log);
  gpumem_sim_set_delayed(1);
  void *hog = NULL, *x = NULL, *q = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &hog), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &x), GPUMEM_OK);
  cb.to_free = x;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &q), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(q, (void *)0x1);
  assert_int_equal(cb.calls, 1);
  assert_null(cb.to_free);
  assert_true(tu_stats(ctx, 0).cached_bytes > 0);
  expect_report(log, ctx, 40 * TU_MiB, " (the out-of-memory callback declined to retry)",
                "frees pending: 8388608 bytes in 1 block on stream 0x5b");
  assert_status(gpumem_free(ctx, hog, NULL), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
  tu_log_free(log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_trim_and_retry),    TU_TEST(test_callback_frees_and_retries),
      TU_TEST(test_callback_declines), TU_TEST(test_no_callback_oom),
      TU_TEST(test_injected_oom_once), TU_TEST(test_generic_backend_error_is_not_oom),
      TU_TEST(test_report_names_pending_frees), TU_TEST(test_report_when_callback_declines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
