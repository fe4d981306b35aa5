/* Logging: callback levels, and nothing on stderr unless asked. */
#include "testutil.h"

static void workload(gpumem_context *ctx) {
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_alloc_tagged(ctx, 0, 5000, NULL, "log-leak", &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, (char *)q + 256, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  void *big = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, SIZE_MAX / 4, NULL, &big), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_status(gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY); /* leak report at warn */
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
}

static void test_callback_levels(void **state) {
  (void)state;
  const gpumem_log_level levels[] = {GPUMEM_LOG_DEBUG, GPUMEM_LOG_INFO, GPUMEM_LOG_WARN, GPUMEM_LOG_ERROR,
                                     GPUMEM_LOG_OFF};
  int counts[5];
  for (int i = 0; i < 5; i++) {
    tu_log *log = tu_log_new();
    gpumem_config cfg;
    tu_config(&cfg);
    tu_log_install(&cfg, log, levels[i]);
    gpumem_context *ctx = tu_ctx_new(&cfg);
    workload(ctx);
    tu_ctx_done(ctx);
    counts[i] = log->count;
    /* nothing below the level */
    for (int l = 0; l < (int)levels[i]; l++) assert_int_equal(log->per_level[l], 0);
    assert_int_equal(log->per_level[GPUMEM_LOG_OFF], 0);
    int stored = log->count < TU_LOG_MAX_MSGS ? log->count : TU_LOG_MAX_MSGS;
    for (int m = 0; m < stored; m++) {
      size_t n = strlen(log->msgs[m]);
      assert_true(n > 0);
      assert_true(log->msgs[m][n - 1] != '\n');
    }
    if (levels[i] <= GPUMEM_LOG_WARN) assert_true(tu_log_count_matching(log, "log-leak", NULL) >= 1);
    if (levels[i] == GPUMEM_LOG_DEBUG) assert_true(log->per_level[GPUMEM_LOG_DEBUG] > 0);
    tu_log_free(log);
  }
  for (int i = 1; i < 5; i++) assert_true(counts[i] <= counts[i - 1]);
  assert_int_equal(counts[4], 0);
}

static void run_quiet(void *arg) {
  (void)arg;
  gpumem_config cfg;
  tu_config(&cfg); /* no callback; GPUMEM_LOG unset by tu_setup */
  gpumem_context *ctx = tu_ctx_new(&cfg);
  workload(ctx);
  tu_ctx_done(ctx);
  /* a bad environment value is not printed either */
  tu_setenv("GPUMEM_LIMIT_BYTES", "garbage");
  gpumem_context *c2 = NULL;
  assert_status(gpumem_create(&cfg, &c2), GPUMEM_ERR_INVALID_ARGUMENT);
  tu_env_restore();
  /* nor bad config values */
  cfg.trim_free_fraction = 7.0;
  assert_status(gpumem_create(&cfg, &c2), GPUMEM_ERR_INVALID_ARGUMENT);
}

static void test_silent_by_default(void **state) {
  (void)state;
  char *out = tu_capture_stderr(run_quiet, NULL);
  if (out[0] != '\0') {
    print_error("the library printed to stderr without being asked:\n%s\n", out);
    free(out);
    fail();
  }
  free(out);
}

static void run_env_log(void *arg) {
  (void)arg;
  gpumem_config cfg;
  tu_config(&cfg);
  tu_setenv("GPUMEM_LOG", "warn");
  gpumem_context *ctx = tu_ctx_new(&cfg);
  workload(ctx);
  tu_ctx_done(ctx);
  tu_env_restore();
}

static void test_gpumem_log_env_prints(void **state) {
  (void)state;
  char *out = tu_capture_stderr(run_env_log, NULL);
  int ok = strstr(out, "log-leak") != NULL;
  if (!ok) print_error("GPUMEM_LOG=warn without a callback should print the leak report to stderr; got:\n%s\n", out);
  free(out);
  assert_true(ok);
}

static void run_env_log_with_cb(void *arg) {
  tu_log *log = (tu_log *)arg;
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  tu_setenv("GPUMEM_LOG", "debug");
  gpumem_context *ctx = tu_ctx_new(&cfg);
  workload(ctx);
  tu_ctx_done(ctx);
  tu_env_restore();
}

static void test_gpumem_log_env_with_callback(void **state) {
  (void)state;
  tu_log *log = tu_log_new();
  char *out = tu_capture_stderr(run_env_log_with_cb, log);
  int quiet = out[0] == '\0';
  if (!quiet) print_error("with a callback installed nothing goes to stderr; got:\n%s\n", out);
  free(out);
  assert_true(quiet);
  assert_true(log->per_level[GPUMEM_LOG_DEBUG] > 0);
  assert_true(tu_log_count_matching(log, "log-leak", NULL) >= 1);
  tu_log_free(log);
}

/* A backend call failing with "no backend" (the driver unloading: calls PyTorch makes at interpreter
 * exit, after the CUDA runtime has gone) returns the status without a warn or error line; another
 * backend error is still an error line. */
static void test_no_backend_is_quiet(void **state) {
  (void)state;
  TU_REQUIRE_SIM(); /* the fault is injected into the sim */
  tu_log *log = tu_log_new();
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_DEBUG);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, TU_MiB, NULL, &p), GPUMEM_OK);
  gpumem_device_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_OK); /* its fixed part asked once, kept */
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_INFO, 1, GPUMEM_SIM_ERR_NO_DEVICE, 1), GPUMEM_OK);
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_ERR_NO_BACKEND);
  int code = 0;
  const char *msg = NULL;
  assert_status(gpumem_last_backend_error(ctx, &code, &msg), GPUMEM_OK);
  assert_int_equal(code, GPUMEM_SIM_ERR_NO_DEVICE);
  assert_int_equal(log->per_level[GPUMEM_LOG_WARN] + log->per_level[GPUMEM_LOG_ERROR], 0);
  assert_true(tu_log_count_matching(log, "mem_get_info", NULL) >= 1);
  /* the allocation is untouched and is freed */
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  gpumem_sim_fail_clear();
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_INFO, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_ERR_BACKEND);
  assert_int_equal(log->per_level[GPUMEM_LOG_ERROR], 1);
  gpumem_sim_fail_clear();
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_log_free(log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_callback_levels),
      TU_TEST(test_silent_by_default),
      TU_TEST(test_gpumem_log_env_prints),
      TU_TEST(test_gpumem_log_env_with_callback),
      TU_TEST(test_no_backend_is_quiet),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
