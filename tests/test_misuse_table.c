/* Every public C function against each bad input it can be given, and the status it must answer:
 * the table of docs/RELIABILITY.md ("Bad arguments"), row by row. With GPUMEM_TEST_PRINT_TABLE=1
 * the test prints the table in Markdown as it checks it (that is how the document's table is
 * made). After every row, nothing may have changed: no live block, out-parameters untouched. */
#include <limits.h>
#include <stdint.h>

#include "testutil.h"

static int g_print;
static int g_rows;
static const char *g_last_fn;

static void row_(const char *fn, const char *input, gpumem_status got, gpumem_status want, int line) {
  g_rows++;
  if (g_print) {
    printf("| %s | %s | `%s` |\n", strcmp(fn, g_last_fn ? g_last_fn : "") == 0 ? "" : fn, input,
           gpumem_status_name(want));
    g_last_fn = fn;
  }
  if (got != want)
    fail_msg("line %d: %s, %s: got %s, want %s", line, fn, input, gpumem_status_name(got), gpumem_status_name(want));
}
#define ROW(fn, input, call, want) row_(fn, input, (call), (want), __LINE__)

#define SENTINEL ((void *)0x5e5e5e00)

static void test_table(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  const char *pe = getenv("GPUMEM_TEST_PRINT_TABLE");
  g_print = pe != NULL && pe[0] == '1';
  if (g_print) printf("\n| Function | Bad input | Status |\n|---|---|---|\n");
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = SENTINEL;
  int n = -7;
  uint64_t u = 77;
  size_t sz = 5;
  gpumem_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  gpumem_device_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  char host[512];
  void *live = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &live), GPUMEM_OK);
  void *freed = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &freed), GPUMEM_OK);
  assert_status(gpumem_free(ctx, freed, NULL), GPUMEM_OK);
  gpumem_config cfg;

  /* context */
  ROW("gpumem_create", "`out` NULL", gpumem_create(NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_context *c2 = (gpumem_context *)SENTINEL;
  gpumem_config_init(&cfg);
  cfg.struct_size = 4;
  ROW("gpumem_create", "`struct_size` too small or larger than the library's", gpumem_create(&cfg, &c2),
      GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_config_init(&cfg);
  cfg.flags = 0x80u;
  ROW("gpumem_create", "unknown `flags` bits", gpumem_create(&cfg, &c2), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_config_init(&cfg);
  cfg.trim_free_fraction = 1.5;
  ROW("gpumem_create", "a fraction outside [0, 1], NaN or infinite", gpumem_create(&cfg, &c2),
      GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_config_init(&cfg);
  cfg.log_level = (gpumem_log_level)9;
  ROW("gpumem_create", "`log_level` not a level", gpumem_create(&cfg, &c2), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_config_init(&cfg);
  cfg.backend = "no-such-backend";
  ROW("gpumem_create", "unknown backend name", gpumem_create(&cfg, &c2), GPUMEM_ERR_NO_BACKEND);
  tu_setenv("GPUMEM_LIMIT_BYTES", "lots");
  ROW("gpumem_create", "a bad `GPUMEM_*` value (`GPUMEM_LIMIT_BYTES=lots`)", gpumem_create(NULL, &c2),
      GPUMEM_ERR_INVALID_ARGUMENT);
  tu_setenv("GPUMEM_LIMIT_BYTES", NULL);
  assert_ptr_equal(c2, SENTINEL);
  ROW("gpumem_destroy", "`ctx` NULL", gpumem_destroy(NULL, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_destroy", "unknown `flags` bits", gpumem_destroy(ctx, 0x40u), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_destroy", "live blocks, no FORCE (a leak report is logged)", gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY);
  ROW("gpumem_device_count", "`ctx` or `count` NULL", gpumem_device_count(ctx, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_device_get_info", "`ctx` or `info` NULL", gpumem_device_get_info(ctx, 0, NULL),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_device_get_info", "`device` < 0, >= count, `INT_MIN`, `INT_MAX`, ALL", gpumem_device_get_info(ctx, INT_MAX, &info),
      GPUMEM_ERR_INVALID_DEVICE);
  info.struct_size = 2;
  ROW("gpumem_device_get_info", "`struct_size` too small", gpumem_device_get_info(ctx, 0, &info),
      GPUMEM_ERR_INVALID_ARGUMENT);
  info.struct_size = sizeof info;
  ROW("gpumem_last_backend_error", "`ctx` NULL", gpumem_last_backend_error(NULL, &n, NULL), GPUMEM_ERR_INVALID_ARGUMENT);

  /* allocation */
  ROW("gpumem_alloc", "`ctx` or `out_ptr` NULL", gpumem_alloc(NULL, 0, 64, NULL, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_alloc", "`device` < 0 (ALL too), >= count, `INT_MIN`, `INT_MAX`", gpumem_alloc(ctx, -1, 64, NULL, &p),
      GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_alloc", "`size` near `SIZE_MAX` (rounding would overflow)", gpumem_alloc(ctx, 0, SIZE_MAX, NULL, &p),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_alloc", "`size` more than the device has", gpumem_alloc(ctx, 0, (size_t)1 << 40, NULL, &p),
      GPUMEM_ERR_OUT_OF_MEMORY);
  assert_status(gpumem_set_limit(ctx, 1, 64 * TU_MiB), GPUMEM_OK);
  ROW("gpumem_alloc", "`size` above the device's limit", gpumem_alloc(ctx, 1, 128 * TU_MiB, NULL, &p),
      GPUMEM_ERR_LIMIT_EXCEEDED);
  assert_status(gpumem_set_limit(ctx, 1, 0), GPUMEM_OK);
  assert_ptr_equal(p, SENTINEL);
  ROW("gpumem_alloc_tagged", "as `gpumem_alloc` (a NULL tag is no tag)", gpumem_alloc_tagged(ctx, 5, 64, NULL, "t", &p),
      GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_free", "`ctx` NULL", gpumem_free(NULL, live, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_free", "a pointer freed already, interior, from the host or another context",
      gpumem_free(ctx, freed, NULL), GPUMEM_ERR_INVALID_POINTER);
  ROW("gpumem_free", "", gpumem_free(ctx, (char *)live + 256, NULL), GPUMEM_ERR_INVALID_POINTER);
  ROW("gpumem_free", "", gpumem_free(ctx, host, NULL), GPUMEM_ERR_INVALID_POINTER);
  ROW("gpumem_ptr_info", "`ctx` or `ptr` NULL", gpumem_ptr_info(ctx, NULL, &sz, &n), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_ptr_info", "not the start of a live block", gpumem_ptr_info(ctx, freed, &sz, &n),
      GPUMEM_ERR_INVALID_POINTER);
  ROW("gpumem_record_stream", "`ctx` NULL", gpumem_record_stream(NULL, live, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_record_stream", "`ptr` NULL, or not a live block", gpumem_record_stream(ctx, freed, NULL),
      GPUMEM_ERR_INVALID_POINTER);

  /* graph pools */
  gpumem_graph_pool *gp = (gpumem_graph_pool *)SENTINEL;
  ROW("gpumem_graph_pool_create", "`ctx` or `out` NULL", gpumem_graph_pool_create(ctx, 0, NULL),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_graph_pool_create", "a bad device", gpumem_graph_pool_create(ctx, 2, &gp), GPUMEM_ERR_INVALID_DEVICE);
  assert_ptr_equal(gp, SENTINEL);
  ROW("gpumem_graph_pool_begin", "`pool` NULL", gpumem_graph_pool_begin(NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp), GPUMEM_OK);
  gpumem_graph_pool *gp2 = NULL;
  assert_status(gpumem_graph_pool_create(ctx, 0, &gp2), GPUMEM_OK);
  gpumem_stream gs = (gpumem_stream)(uintptr_t)0x6a0;
  assert_status(gpumem_graph_pool_begin(gp, gs), GPUMEM_OK);
  ROW("gpumem_graph_pool_begin", "`stream` routed to another pool already", gpumem_graph_pool_begin(gp2, gs),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_graph_pool_release", "`pool` NULL, or streams still routed to it", gpumem_graph_pool_release(gp),
      GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_end(gp, gs), GPUMEM_OK);
  ROW("gpumem_graph_pool_end", "`pool` NULL, or `stream` not routed to it", gpumem_graph_pool_end(gp, gs),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_graph_pool_alloc", "`pool` NULL; otherwise as `gpumem_alloc`", gpumem_graph_pool_alloc(NULL, 64, NULL, &p),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_graph_pool_get_stats", "`pool` or `out` NULL, `struct_size` too small",
      gpumem_graph_pool_get_stats(gp, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_graph_pool_release(gp), GPUMEM_OK);
  assert_status(gpumem_graph_pool_release(gp2), GPUMEM_OK);

  /* scoped handles */
  ROW("gpumem_buffer_alloc", "`out` NULL; otherwise as `gpumem_alloc`", gpumem_buffer_alloc(ctx, 0, 64, NULL, NULL),
      GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_scope *sc = (gpumem_scope *)SENTINEL;
  ROW("gpumem_scope_begin", "`ctx` or `out` NULL", gpumem_scope_begin(NULL, 0, NULL, &sc), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_scope_begin", "a bad device (ALL too)", gpumem_scope_begin(ctx, -1, NULL, &sc), GPUMEM_ERR_INVALID_DEVICE);
  assert_ptr_equal(sc, SENTINEL);
  ROW("gpumem_scope_alloc", "`scope` or `out_ptr` NULL; otherwise as `gpumem_alloc`",
      gpumem_scope_alloc(NULL, 64, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_scope_set_tag", "`scope` NULL", gpumem_scope_set_tag(NULL, "t"), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_scope_end", "`scope` NULL", gpumem_scope_end(NULL), GPUMEM_ERR_INVALID_ARGUMENT);

  /* trimming, limits, reset */
  ROW("gpumem_trim", "`ctx` NULL", gpumem_trim(NULL, 0, 0, &u), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_trim", "a bad device (ALL is allowed)", gpumem_trim(ctx, INT_MIN, 0, &u), GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_set_limit", "`ctx` NULL", gpumem_set_limit(NULL, 0, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_set_limit", "a bad device (ALL too)", gpumem_set_limit(ctx, GPUMEM_ALL_DEVICES, 0),
      GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_get_limit", "`ctx` or `limit_bytes` NULL", gpumem_get_limit(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_get_limit", "a bad device (ALL too)", gpumem_get_limit(ctx, 2, &u), GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_largest_free_block", "`ctx` or `bytes` NULL", gpumem_largest_free_block(ctx, 0, NULL),
      GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_largest_free_block", "a bad device (ALL too)", gpumem_largest_free_block(ctx, -1, &u),
      GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_reset", "`ctx` NULL, unknown `flags` bits", gpumem_reset(ctx, 0, 0x10u), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_reset", "a bad device (ALL is allowed)", gpumem_reset(ctx, 2, 0), GPUMEM_ERR_INVALID_DEVICE);

  /* statistics */
  ROW("gpumem_get_stats", "`ctx` or `out` NULL", gpumem_get_stats(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  st.struct_size = 4;
  ROW("gpumem_get_stats", "`struct_size` too small", gpumem_get_stats(ctx, 0, &st), GPUMEM_ERR_INVALID_ARGUMENT);
  st.struct_size = sizeof st;
  ROW("gpumem_get_stats", "a bad device (ALL is allowed)", gpumem_get_stats(ctx, 2, &st), GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_reset_peak_stats", "`ctx` NULL", gpumem_reset_peak_stats(NULL, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_reset_peak_stats", "a bad device (ALL is allowed)", gpumem_reset_peak_stats(ctx, 3),
      GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_stats_format", "`ctx` NULL, `buf` NULL with `len` > 0, an unknown format",
      gpumem_stats_format(ctx, 0, (gpumem_stats_format_kind)7, host, sizeof host, &sz), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_stats_format", "a bad device", gpumem_stats_format(ctx, 9, GPUMEM_STATS_JSON, host, sizeof host, &sz),
      GPUMEM_ERR_INVALID_DEVICE);
  ROW("gpumem_stats_format", "`len` too small (`*needed` says how much)",
      gpumem_stats_format(ctx, 0, GPUMEM_STATS_JSON, host, 4, &sz), GPUMEM_ERR_INVALID_ARGUMENT);

  /* monitoring */
  ROW("gpumem_trace_start", "`ctx` or `path` NULL, `path` empty, a file that cannot be created",
      gpumem_trace_start(ctx, "/nonexistent-dir-gpumem/t.txt"), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_trace_start", "`path` ending in `.gz`", gpumem_trace_start(ctx, "/tmp/t.txt.gz"),
      GPUMEM_ERR_NOT_SUPPORTED);
  ROW("gpumem_trace_stop", "`ctx` NULL", gpumem_trace_stop(NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  ROW("gpumem_global_context", "`out` NULL", gpumem_global_context(NULL), GPUMEM_ERR_INVALID_ARGUMENT);

  /* nothing changed */
  assert_ptr_equal(p, SENTINEL);
  assert_int_equal(u, 77);
  gpumem_stats now = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  assert_int_equal(now.num_live, 1);
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK);
  if (g_print) printf("\n%d rows\n", g_rows);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {TU_TEST(test_table)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
