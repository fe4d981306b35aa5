/* Configuration: defaults, struct_size, bad values, GPUMEM_* environment, GPUMEM_CONFIG_NO_ENV. */
#include <math.h>

#include "testutil.h"

static void test_defaults(void **state) {
  (void)state;
  gpumem_config cfg;
  memset(&cfg, 0x5A, sizeof cfg);
  gpumem_config_init(&cfg);
  assert_int_equal(cfg.struct_size, sizeof(gpumem_config));
  assert_int_equal(cfg.flags, 0);
  assert_true(cfg.backend == NULL || strcmp(cfg.backend, "auto") == 0);
  assert_null(cfg.custom_backend);
  assert_true(cfg.release_threshold == GPUMEM_UNLIMITED);
  assert_true(fabs(cfg.trim_free_fraction - 0.10) < 1e-12);
  assert_true(cfg.limit_bytes == 0);
  assert_true(cfg.limit_fraction == 0.0);
  assert_true(cfg.initial_bytes == 0);
  assert_null(cfg.oom_callback);
  assert_null(cfg.oom_user);
  assert_null(cfg.log_callback);
  assert_null(cfg.log_user);
  assert_int_equal(cfg.log_level, GPUMEM_LOG_WARN);
  assert_int_equal(cfg.stream_deps, 0);
  assert_true(cfg.peak_headroom == 0.0);
  assert_int_equal(cfg.capture_probe, 1);
  gpumem_config_init(NULL); /* harmless */
}

static void test_create_null_args(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  assert_status(gpumem_create(&cfg, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_create(NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  /* cfg NULL means defaults; with backend "auto" the sim is the fallback, so it works everywhere */
  gpumem_context *ctx = NULL;
  assert_status(gpumem_create(NULL, &ctx), GPUMEM_OK);
  assert_non_null(ctx);
  tu_ctx_register(ctx);
  assert_true(strlen(gpumem_backend_name(ctx)) > 0);
  tu_ctx_done(ctx);
}

static void expect_bad_config(const gpumem_config *cfg) {
  gpumem_context *ctx = (gpumem_context *)0x1;
  assert_status(gpumem_create(cfg, &ctx), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(ctx, (gpumem_context *)0x1); /* out untouched */
}

static void test_struct_size(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.struct_size = 0;
  expect_bad_config(&cfg);
  cfg.struct_size = 1;
  expect_bad_config(&cfg);
  cfg.struct_size = 3;
  expect_bad_config(&cfg);

  /* an older caller's struct: a prefix; what lies past struct_size is not read */
  tu_config(&cfg);
  cfg.struct_size = (uint32_t)offsetof(gpumem_config, limit_bytes);
  cfg.limit_bytes = 1;          /* would refuse every allocation if it were read */
  cfg.limit_fraction = 1e-9;    /* likewise */
  cfg.initial_bytes = UINT64_MAX / 2; /* likewise: would fail the first allocation */
  cfg.peak_headroom = -1.0;     /* would be refused at create */
  cfg.log_callback = NULL;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 1 << 20, NULL, &p), GPUMEM_OK);
  assert_non_null(p);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_bad_values(void **state) {
  (void)state;
  gpumem_config cfg;
  const double bad_fractions[] = {-0.1, 1.5, -1e300, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad_fractions / sizeof bad_fractions[0]; i++) {
    tu_config(&cfg);
    cfg.trim_free_fraction = bad_fractions[i];
    expect_bad_config(&cfg);
    tu_config(&cfg);
    cfg.limit_fraction = bad_fractions[i];
    expect_bad_config(&cfg);
    tu_config(&cfg);
    cfg.peak_headroom = bad_fractions[i];
    expect_bad_config(&cfg);
  }
  tu_config(&cfg);
  cfg.log_level = (gpumem_log_level)(GPUMEM_LOG_OFF + 1);
  expect_bad_config(&cfg);
  tu_config(&cfg);
  cfg.log_level = (gpumem_log_level)-1;
  expect_bad_config(&cfg);
  tu_config(&cfg);
  cfg.flags = 0x80000000u; /* unknown flag */
  expect_bad_config(&cfg);

  /* boundary values are fine */
  const double ok_fractions[] = {0.0, 0.5, 1.0};
  for (size_t i = 0; i < sizeof ok_fractions / sizeof ok_fractions[0]; i++) {
    tu_config(&cfg);
    cfg.trim_free_fraction = ok_fractions[i];
    cfg.limit_fraction = ok_fractions[i];
    cfg.peak_headroom = ok_fractions[i];
    tu_ctx_done(tu_ctx_new(&cfg));
  }
  tu_config(&cfg);
  cfg.log_level = GPUMEM_LOG_OFF;
  tu_ctx_done(tu_ctx_new(&cfg));
  tu_config(&cfg);
  cfg.log_level = GPUMEM_LOG_DEBUG;
  tu_ctx_done(tu_ctx_new(&cfg));
}

static void test_unknown_backend_name(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.backend = "no-such-backend";
  gpumem_context *ctx = (gpumem_context *)0x1;
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_ERR_NO_BACKEND);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
  cfg.backend = "";
  gpumem_status s = gpumem_create(&cfg, &ctx);
  assert_true(s == GPUMEM_ERR_NO_BACKEND || s == GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
}

static void test_config_copied(void **state) {
  (void)state;
  /* the context keeps its own copy: the caller's strings and struct may go away */
  char name[16];
  snprintf(name, sizeof name, "%s", tu_backend());
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.backend = name;
  cfg.limit_bytes = 8 * TU_MiB;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  memset(name, 'x', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  memset(&cfg, 0, sizeof cfg);
  assert_string_equal(gpumem_backend_name(ctx), tu_backend());
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x1);
  tu_ctx_done(ctx);
}

/* ---------------------------------------------------------------------- */
/* Environment                                                             */

/* Create with env var=value set (restored afterwards), capturing the log at WARN. */
static gpumem_status create_with_env(const char *var, const char *value, unsigned flags, tu_log *log,
                                     gpumem_context **out) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = flags;
  if (log) tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  tu_setenv(var, value);
  gpumem_context *ctx = NULL;
  gpumem_status s = gpumem_create(&cfg, &ctx);
  tu_env_restore();
  if (s == GPUMEM_OK) {
    tu_ctx_register(ctx);
    *out = ctx;
  }
  return s;
}

static void expect_env_rejected(const char *var, const char *value) {
  tu_log *log = tu_log_new();
  gpumem_context *ctx = (gpumem_context *)0x1;
  gpumem_status s = create_with_env(var, value, 0, log, &ctx);
  if (s != GPUMEM_ERR_INVALID_ARGUMENT) {
    print_error("%s=\"%s\" gave %s, expected GPUMEM_ERR_INVALID_ARGUMENT\n", var, value, gpumem_status_name(s));
    if (s == GPUMEM_OK) tu_ctx_done(ctx);
    tu_log_free(log);
    fail();
  }
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
  if (tu_log_count_matching(log, var, NULL) < 1) {
    print_error("no log line names %s (value \"%s\"); captured:\n", var, value);
    tu_log_dump(log);
    tu_log_free(log);
    fail();
  }
  tu_log_free(log);
  /* with GPUMEM_CONFIG_NO_ENV the same garbage is ignored */
  ctx = NULL;
  assert_status(create_with_env(var, value, GPUMEM_CONFIG_NO_ENV, NULL, &ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* var=value is accepted, and a block of `size` bytes is allocated and freed under it. */
static void expect_env_alloc_ok(const char *var, const char *value, size_t size) {
  gpumem_context *ctx = NULL;
  assert_status(create_with_env(var, value, 0, NULL, &ctx), GPUMEM_OK);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, size, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_env_garbage(void **state) {
  (void)state;
  static const char *const byte_vars[] = {"GPUMEM_RELEASE_THRESHOLD", "GPUMEM_LIMIT_BYTES", "GPUMEM_INITIAL_BYTES"};
  static const char *const bad_bytes[] = {"abc", "12XB", "-5", "1.5.3", "10 MiB junk", "0x", "99999999999999999999999",
                                          "16EiB0", "GiB"};
  for (size_t v = 0; v < sizeof byte_vars / sizeof byte_vars[0]; v++)
    for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++) expect_env_rejected(byte_vars[v], bad_bytes[i]);

  static const char *const frac_vars[] = {"GPUMEM_TRIM_FREE_FRACTION", "GPUMEM_LIMIT_FRACTION", "GPUMEM_PEAK_HEADROOM"};
  static const char *const bad_fracs[] = {"x", "1.5", "-0.1", "nan", "0.5abc", "inf"};
  for (size_t v = 0; v < sizeof frac_vars / sizeof frac_vars[0]; v++)
    for (size_t i = 0; i < sizeof bad_fracs / sizeof bad_fracs[0]; i++) expect_env_rejected(frac_vars[v], bad_fracs[i]);

  expect_env_rejected("GPUMEM_LOG", "loud");
  expect_env_rejected("GPUMEM_LOG", "5");
  static const char *const bool_vars[] = {"GPUMEM_EXPANDABLE", "GPUMEM_STREAM_DEPS", "GPUMEM_CAPTURE_PROBE"};
  static const char *const bad_bools[] = {"2", "maybe", "-1", "1x"};
  for (size_t v = 0; v < sizeof bool_vars / sizeof bool_vars[0]; v++)
    for (size_t i = 0; i < sizeof bad_bools / sizeof bad_bools[0]; i++) expect_env_rejected(bool_vars[v], bad_bools[i]);
}

static void test_env_backend(void **state) {
  (void)state;
  /* GPUMEM_BACKEND overrides the config */
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.backend = "no-such-backend";
  tu_setenv("GPUMEM_BACKEND", tu_backend());
  gpumem_context *ctx = tu_ctx_new(&cfg);
  assert_string_equal(gpumem_backend_name(ctx), tu_backend());
  tu_ctx_done(ctx);

  /* ... unless NO_ENV */
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  ctx = (gpumem_context *)0x1;
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_ERR_NO_BACKEND);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);

  /* an unknown name in the environment fails creation */
  tu_setenv("GPUMEM_BACKEND", "no-such-backend");
  tu_config(&cfg);
  gpumem_status s = gpumem_create(&cfg, &ctx);
  assert_true(s == GPUMEM_ERR_NO_BACKEND || s == GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
  /* and applies with cfg NULL too */
  s = gpumem_create(NULL, &ctx);
  assert_true(s == GPUMEM_ERR_NO_BACKEND || s == GPUMEM_ERR_INVALID_ARGUMENT);
  tu_env_restore();

  if (tu_is_sim()) {
    tu_setenv("GPUMEM_BACKEND", "sim");
    assert_status(gpumem_create(NULL, &ctx), GPUMEM_OK);
    tu_ctx_register(ctx);
    assert_string_equal(gpumem_backend_name(ctx), "sim");
    tu_ctx_done(ctx);
  }
}

static void test_env_limit_bytes_suffixes(void **state) {
  (void)state;
  /* every spelling of 4 MiB: 2 MiB fits, 8 MiB does not */
  static const char *const four_mib[] = {"4194304", "4096K", "4096KiB", "4M", "4MiB"};
  for (size_t i = 0; i < sizeof four_mib / sizeof four_mib[0]; i++) {
    gpumem_context *ctx = NULL;
    assert_status(create_with_env("GPUMEM_LIMIT_BYTES", four_mib[i], 0, NULL, &ctx), GPUMEM_OK);
    void *p = NULL, *q = (void *)0x1;
    assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &q), GPUMEM_ERR_LIMIT_EXCEEDED);
    assert_ptr_equal(q, (void *)0x1);
    assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &p), GPUMEM_OK);
    gpumem_stats st = tu_stats(ctx, 0);
    assert_true(st.reserved_bytes <= 4 * TU_MiB);
    assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
    tu_ctx_done(ctx);
  }
  /* large suffixes: the limit is at least 1 GiB, so a 512 MiB block fits */
  static const char *const big[] = {"1G", "1GiB", "1T", "1TiB"};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) expect_env_alloc_ok("GPUMEM_LIMIT_BYTES", big[i], 512 * TU_MiB);
  /* 1G caps at 1 GiB: 2 GiB is refused (the sim device has 16 GiB) */
  if (tu_is_sim()) {
    gpumem_context *ctx = NULL;
    assert_status(create_with_env("GPUMEM_LIMIT_BYTES", "1G", 0, NULL, &ctx), GPUMEM_OK);
    void *p = (void *)0x1;
    assert_status(gpumem_alloc(ctx, 0, 2 * TU_GiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
    tu_ctx_done(ctx);
  }
}

static void test_env_overrides_config(void **state) {
  (void)state;
  /* env wins over the config field ... */
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.limit_bytes = 8 * TU_MiB;
  tu_setenv("GPUMEM_LIMIT_BYTES", "0");
  gpumem_context *ctx = tu_ctx_new(&cfg);
  tu_env_restore();
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);

  /* ... unless NO_ENV, also for cfg == NULL-equivalent defaults */
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  tu_setenv("GPUMEM_LIMIT_BYTES", "1MiB");
  tu_setenv("GPUMEM_RELEASE_THRESHOLD", "garbage");
  tu_setenv("GPUMEM_TRIM_FREE_FRACTION", "garbage");
  tu_setenv("GPUMEM_LIMIT_FRACTION", "garbage");
  tu_setenv("GPUMEM_INITIAL_BYTES", "garbage");
  tu_setenv("GPUMEM_LOG", "garbage");
  tu_setenv("GPUMEM_BACKEND", "garbage");
  ctx = tu_ctx_new(&cfg);
  p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);

  /* cfg NULL: the environment applies */
  tu_env_restore();
  tu_setenv("GPUMEM_BACKEND", tu_backend());
  tu_setenv("GPUMEM_LIMIT_BYTES", "garbage");
  ctx = (gpumem_context *)0x1;
  assert_status(gpumem_create(NULL, &ctx), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
  tu_setenv("GPUMEM_LIMIT_BYTES", "4MiB");
  assert_status(gpumem_create(NULL, &ctx), GPUMEM_OK);
  tu_ctx_register(ctx);
  p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  tu_ctx_done(ctx);
}

static void test_env_release_threshold(void **state) {
  (void)state;
  gpumem_context *ctx = NULL;
  assert_status(create_with_env("GPUMEM_RELEASE_THRESHOLD", "0", 0, NULL, &ctx), GPUMEM_OK);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  tu_assert_stats_sane(&st);
  assert_true(st.cached_bytes == 0); /* threshold 0: nothing stays cached */
  tu_ctx_done(ctx);

  /* the default (unlimited) keeps the memory cached */
  gpumem_config cfg;
  tu_config(&cfg);
  ctx = tu_ctx_new(&cfg);
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  st = tu_stats(ctx, 0);
  assert_true(st.cached_bytes >= 4 * TU_MiB);
  tu_ctx_done(ctx);
}

static void test_env_limit_fraction(void **state) {
  (void)state;
  gpumem_context *ctx = NULL;
  assert_status(create_with_env("GPUMEM_LIMIT_FRACTION", "0.25", 0, NULL, &ctx), GPUMEM_OK);
  gpumem_device_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_OK);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, (size_t)(info.total_bytes / 2), NULL, &p), GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_ptr_equal(p, (void *)0x1);
  p = NULL;
  assert_status(gpumem_alloc(ctx, 0, (size_t)(info.total_bytes / 16), NULL, &p), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes <= info.total_bytes / 4);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_env_trim_free_fraction(void **state) {
  (void)state;
  /* parses; 0 disables; the behaviour itself is covered by test_trim */
  gpumem_context *ctx = NULL;
  assert_status(create_with_env("GPUMEM_TRIM_FREE_FRACTION", "0", 0, NULL, &ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
  assert_status(create_with_env("GPUMEM_TRIM_FREE_FRACTION", "0.5", 0, NULL, &ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
  assert_status(create_with_env("GPUMEM_TRIM_FREE_FRACTION", "1", 0, NULL, &ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_env_peak_headroom(void **state) {
  (void)state;
  /* parses in [0, 1]; the behaviour itself is covered by test_expandable_segments (test_peak_headroom) */
  static const char *const ok[] = {"0", "0.2", "1", " 0.5 "};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) expect_env_alloc_ok("GPUMEM_PEAK_HEADROOM", ok[i], 3 * TU_MiB);
}

static void test_env_capture_probe(void **state) {
  (void)state;
  /* 0 and 1 parse; what each does is covered by test_graph_pool and the Python test_capture_probe_keyword */
  static const char *const ok[] = {"0", "1"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) expect_env_alloc_ok("GPUMEM_CAPTURE_PROBE", ok[i], 3 * TU_MiB);
}

static void test_env_initial_bytes(void **state) {
  (void)state;
  gpumem_context *ctx = NULL;
  assert_status(create_with_env("GPUMEM_INITIAL_BYTES", "32MiB", 0, NULL, &ctx), GPUMEM_OK);
  /* nothing before first use */
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes == 0);
  if (tu_is_sim()) assert_true(tu_sim_used(0) == 0);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 1024, NULL, &p), GPUMEM_OK);
  st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes >= 32 * TU_MiB);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_env_log(void **state) {
  (void)state;
  /* GPUMEM_LOG=debug lowers the level: growth is logged at debug */
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log *log = tu_log_new();
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  tu_setenv("GPUMEM_LOG", "debug");
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  assert_true(log->per_level[GPUMEM_LOG_DEBUG] > 0);
  tu_env_restore();

  /* GPUMEM_LOG=off silences a callback asking for debug */
  tu_log_clear(log);
  tu_log_install(&cfg, log, GPUMEM_LOG_DEBUG);
  tu_setenv("GPUMEM_LOG", "off");
  ctx = tu_ctx_new(&cfg);
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  assert_int_equal(log->count, 0);
  tu_env_restore();

  /* every documented level name parses */
  static const char *const levels[] = {"debug", "info", "warn", "error", "off"};
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
    tu_setenv("GPUMEM_LOG", levels[i]);
    tu_ctx_done(tu_ctx_new(&cfg));
    tu_env_restore();
  }
  tu_log_free(log);
}

static void test_env_sim_devices_garbage(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0); /* the sim re-reads its env only with no context alive */
  static const char *const bad[] = {"banana", "2x", "x16GiB", "16GiB,,8GiB", "16QiB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tu_setenv("GPUMEM_SIM_DEVICES", bad[i]);
    tu_log *log = tu_log_new();
    gpumem_config cfg;
    tu_config(&cfg);
    tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
    gpumem_context *ctx = (gpumem_context *)0x1;
    gpumem_status s = gpumem_create(&cfg, &ctx);
    if (s != GPUMEM_ERR_INVALID_ARGUMENT) {
      print_error("GPUMEM_SIM_DEVICES=\"%s\" gave %s\n", bad[i], gpumem_status_name(s));
      if (s == GPUMEM_OK) gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
      tu_log_free(log);
      fail();
    }
    assert_ptr_equal(ctx, (gpumem_context *)0x1);
    int named = tu_log_count_matching(log, "GPUMEM_SIM_DEVICES", NULL);
    if (named < 1) tu_log_dump(log);
    tu_log_free(log);
    assert_true(named >= 1);
    tu_env_restore();
  }
  /* and a good value works again afterwards */
  tu_ctx_done(tu_ctx_new(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_defaults),
      TU_TEST(test_create_null_args),
      TU_TEST(test_struct_size),
      TU_TEST(test_bad_values),
      TU_TEST(test_unknown_backend_name),
      TU_TEST(test_config_copied),
      TU_TEST(test_env_garbage),
      TU_TEST(test_env_backend),
      TU_TEST(test_env_limit_bytes_suffixes),
      TU_TEST(test_env_overrides_config),
      TU_TEST(test_env_release_threshold),
      TU_TEST(test_env_limit_fraction),
      TU_TEST(test_env_trim_free_fraction),
      TU_TEST(test_env_peak_headroom),
      TU_TEST(test_env_capture_probe),
      TU_TEST(test_env_initial_bytes),
      TU_TEST(test_env_log),
      TU_TEST(test_env_sim_devices_garbage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
