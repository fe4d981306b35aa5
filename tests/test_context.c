/* Context: create/destroy statuses, backend names, custom backends, auto fallback, BUSY + leak report, FORCE. */
#include "testutil.h"

static void test_create_destroy(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  assert_string_equal(gpumem_backend_name(ctx), tu_backend());
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  assert_true(n >= 1);
  tu_ctx_done(ctx);

  /* several contexts at once, destroyed in either order */
  gpumem_context *a = tu_ctx_new(NULL), *b = tu_ctx_new(NULL), *c = tu_ctx_new(NULL);
  assert_true(a != b && b != c && a != c);
  tu_ctx_done(b);
  tu_ctx_done(a);
  tu_ctx_done(c);
}

static void test_null_args(void **state) {
  (void)state;
  assert_status(gpumem_destroy(NULL, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_destroy(NULL, GPUMEM_DESTROY_FORCE), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_string_equal(gpumem_backend_name(NULL), "");
  int n = 77;
  assert_status(gpumem_device_count(NULL, &n), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(n, 77);
  gpumem_context *ctx = tu_ctx_new(NULL);
  assert_status(gpumem_device_count(ctx, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_device_get_info(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(NULL, 0, 1024, NULL, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(p, (void *)0x1);
  assert_status(gpumem_alloc(ctx, 0, 1024, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_free(NULL, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_trim(NULL, 0, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_reset(NULL, 0, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_stats st;
  st.struct_size = sizeof st;
  assert_status(gpumem_get_stats(NULL, 0, &st), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_get_stats(ctx, 0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_reset_peak_stats(NULL, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_ptr_info(NULL, (void *)0x1000, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  tu_ctx_done(ctx);
}

static void test_destroy_bad_flags(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_destroy(ctx, 0x80u), GPUMEM_ERR_INVALID_ARGUMENT);
  /* still usable */
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_builtin_backends(void **state) {
  (void)state;
  const gpumem_backend *sim = gpumem_builtin_backend("sim");
  assert_non_null(sim);
  assert_string_equal(sim->name, "sim");
  assert_true(sim->version >= 1);
  assert_non_null(sim->malloc);
  assert_non_null(sim->free);
  assert_non_null(sim->device_count);
  assert_null(gpumem_builtin_backend("no-such-backend"));
  assert_null(gpumem_builtin_backend(NULL));
  assert_null(gpumem_builtin_backend("auto")); /* auto is a policy, not a backend */
  const char *const names[] = {"cuda", "hip"};
  for (size_t i = 0; i < 2; i++) {
    const gpumem_backend *b = gpumem_builtin_backend(names[i]);
    if (b) assert_string_equal(b->name, names[i]);
  }
}

static void test_backend_not_built(void **state) {
  (void)state;
  /* asking for a backend that is not built fails cleanly */
  const char *const names[] = {"cuda", "hip"};
  for (size_t i = 0; i < 2; i++) {
    if (gpumem_builtin_backend(names[i])) continue;
    gpumem_config cfg;
    gpumem_config_init(&cfg);
    cfg.backend = names[i];
    gpumem_context *ctx = (gpumem_context *)0x1;
    assert_status(gpumem_create(&cfg, &ctx), GPUMEM_ERR_NO_BACKEND);
    assert_ptr_equal(ctx, (gpumem_context *)0x1);
  }
}

static void test_auto_fallback(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_config cfg;
  gpumem_config_init(&cfg); /* backend NULL = auto */
  gpumem_context *ctx = tu_ctx_new(&cfg);
  const char *name = gpumem_backend_name(ctx);
  assert_true(strcmp(name, "cuda") == 0 || strcmp(name, "hip") == 0 || strcmp(name, "sim") == 0);
  if (!gpumem_builtin_backend("cuda") && !gpumem_builtin_backend("hip")) assert_string_equal(name, "sim");
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  assert_true(n >= 1); /* auto picks a backend that has a device */
  tu_ctx_done(ctx);

  cfg.backend = "auto";
  ctx = tu_ctx_new(&cfg);
  tu_ctx_done(ctx);

  /* no device anywhere (CUDA_VISIBLE_DEVICES hides them all): auto finds nothing */
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("CUDA_VISIBLE_DEVICES", "");
  ctx = (gpumem_context *)0x1;
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_ERR_NO_BACKEND);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
  tu_env_restore();
  tu_ctx_done(tu_ctx_new(&cfg));
}

/* ---------------------------------------------------------------------- */
/* A custom backend: the sim wrapped with call counters                    */

typedef struct tracer {
  gpumem_backend inner; /* a copy of the sim's vtable */
  int inits, shutdowns;
  int mallocs, frees;
  int init_result;
} tracer;

static tracer g_tr;

#define INNER (&g_tr.inner)
static int tr_init(gpumem_backend *be) {
  assert_ptr_equal(be->user_data, &g_tr);
  g_tr.inits++;
  if (g_tr.init_result) return g_tr.init_result;
  return INNER->init ? INNER->init(INNER) : 0;
}
static void tr_shutdown(gpumem_backend *be) {
  (void)be;
  g_tr.shutdowns++;
  if (INNER->shutdown) INNER->shutdown(INNER);
}
static int tr_device_count(gpumem_backend *be, int *n) {
  (void)be;
  return INNER->device_count(INNER, n);
}
static int tr_device_info(gpumem_backend *be, int d, gpumem_backend_device_info *i) {
  (void)be;
  return INNER->device_info(INNER, d, i);
}
static int tr_mem_get_info(gpumem_backend *be, int d, uint64_t *f, uint64_t *t) {
  (void)be;
  return INNER->mem_get_info(INNER, d, f, t);
}
static int tr_malloc(gpumem_backend *be, int d, size_t n, void **p) {
  (void)be;
  g_tr.mallocs++;
  return INNER->malloc(INNER, d, n, p);
}
static int tr_free(gpumem_backend *be, int d, void *p) {
  (void)be;
  g_tr.frees++;
  return INNER->free(INNER, d, p);
}
static int tr_device_synchronize(gpumem_backend *be, int d) {
  (void)be;
  return INNER->device_synchronize(INNER, d);
}
static gpumem_status tr_error_status(const gpumem_backend *be, int code) {
  (void)be;
  if (code == 4242) return GPUMEM_ERR_NO_BACKEND;
  return INNER->error_status ? INNER->error_status(INNER, code) : GPUMEM_ERR_BACKEND;
}
static const char *tr_error_string(const gpumem_backend *be, int code) {
  (void)be;
  if (code == 4242) return "tracer: refused";
  return INNER->error_string ? INNER->error_string(INNER, code) : "tracer error";
}

/* Only the required methods: no events, no VM, no device reset. */
static gpumem_backend tracer_vtable(void) {
  memset(&g_tr, 0, sizeof g_tr);
  g_tr.inner = *gpumem_builtin_backend("sim");
  gpumem_backend be;
  memset(&be, 0, sizeof be);
  be.version = GPUMEM_BACKEND_VERSION;
  be.struct_size = sizeof be;
  be.name = "tracer";
  be.user_data = &g_tr;
  be.init = tr_init;
  be.shutdown = tr_shutdown;
  be.device_count = tr_device_count;
  be.device_info = tr_device_info;
  be.mem_get_info = tr_mem_get_info;
  be.malloc = tr_malloc;
  be.free = tr_free;
  be.device_synchronize = tr_device_synchronize;
  be.error_status = tr_error_status;
  be.error_string = tr_error_string;
  return be;
}

static void test_custom_backend(void **state) {
  (void)state;
  TU_REQUIRE_SIM(); /* wraps the sim */
  gpumem_backend be = tracer_vtable();
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "no-such-backend"; /* ignored: custom_backend wins */
  cfg.custom_backend = &be;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  assert_int_equal(g_tr.inits, 1);
  /* the core copied the struct: changing ours changes nothing */
  be.name = "changed";
  be.malloc = NULL;
  be.user_data = NULL;
  assert_string_equal(gpumem_backend_name(ctx), "tracer");

  void *p[4] = {0};
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, (size_t)(i + 1) * TU_MiB, NULL, &p[i]), GPUMEM_OK);
  assert_true(g_tr.mallocs >= 1);
  /* cross-stream frees without events: ordering falls back to device synchronisation */
  assert_status(gpumem_free(ctx, p[0], (gpumem_stream)0x10), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p[1], NULL), GPUMEM_OK);
  void *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, TU_MiB, (gpumem_stream)0x20, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p[2], NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p[3], NULL), GPUMEM_OK);
  /* GPUMEM_RESET_DEVICE is not supported without device_reset */
  assert_status(gpumem_reset(ctx, 0, GPUMEM_RESET_DEVICE), GPUMEM_ERR_NOT_SUPPORTED);
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  int mallocs = g_tr.mallocs;
  tu_ctx_done(ctx);
  assert_int_equal(g_tr.shutdowns, 1);
  assert_int_equal(g_tr.frees, mallocs); /* everything the core took, it gave back */
}

static void test_custom_backend_init_fails(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_backend be = tracer_vtable();
  g_tr.init_result = 4242; /* mapped by error_status to NO_BACKEND */
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.custom_backend = &be;
  gpumem_context *ctx = (gpumem_context *)0x1;
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_ERR_NO_BACKEND);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
  assert_int_equal(g_tr.inits, 1);
  assert_int_equal(g_tr.mallocs, 0);
  /* without error_status every code is GPUMEM_ERR_BACKEND */
  be.error_status = NULL;
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_ERR_BACKEND);
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
}

static void expect_custom_rejected(const gpumem_backend *be, const char *what) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.custom_backend = be;
  gpumem_context *ctx = (gpumem_context *)0x1;
  gpumem_status s = gpumem_create(&cfg, &ctx);
  if (s != GPUMEM_ERR_INVALID_ARGUMENT && s != GPUMEM_ERR_NO_BACKEND) {
    print_error("custom backend with %s: %s\n", what, gpumem_status_name(s));
    if (s == GPUMEM_OK) gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
    fail();
  }
  assert_ptr_equal(ctx, (gpumem_context *)0x1);
}

static void test_custom_backend_validation(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_backend be;
  be = tracer_vtable(); be.version = 0;               expect_custom_rejected(&be, "version 0");
  be = tracer_vtable(); be.struct_size = 0;           expect_custom_rejected(&be, "struct_size 0");
  be = tracer_vtable(); be.struct_size = 8;           expect_custom_rejected(&be, "struct_size 8");
  be = tracer_vtable(); be.name = NULL;               expect_custom_rejected(&be, "no name");
  be = tracer_vtable(); be.device_count = NULL;       expect_custom_rejected(&be, "no device_count");
  be = tracer_vtable(); be.device_info = NULL;        expect_custom_rejected(&be, "no device_info");
  be = tracer_vtable(); be.mem_get_info = NULL;       expect_custom_rejected(&be, "no mem_get_info");
  be = tracer_vtable(); be.malloc = NULL;             expect_custom_rejected(&be, "no malloc");
  be = tracer_vtable(); be.free = NULL;               expect_custom_rejected(&be, "no free");
  be = tracer_vtable(); be.device_synchronize = NULL; expect_custom_rejected(&be, "no device_synchronize");
  /* event methods come as a group */
  be = tracer_vtable(); be.event_create = g_tr.inner.event_create; expect_custom_rejected(&be, "event_create alone");
  assert_int_equal(g_tr.inits, 0); /* rejected before init */
  /* a well-formed one is accepted */
  be = tracer_vtable();
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.custom_backend = &be;
  tu_ctx_done(tu_ctx_new(&cfg));
  assert_int_equal(g_tr.inits, 1);
  assert_int_equal(g_tr.shutdowns, 1);
}

/* ---------------------------------------------------------------------- */
/* destroy: BUSY, leak report, FORCE                                       */

/* 1 if text contains the decimal number v not embedded in a longer number. */
static int has_number(const char *text, unsigned long long v) {
  char num[32];
  snprintf(num, sizeof num, "%llu", v);
  size_t n = strlen(num);
  for (const char *p = strstr(text, num); p; p = strstr(p + 1, num)) {
    int left = (p == text) || !(p[-1] >= '0' && p[-1] <= '9');
    int right = !(p[n] >= '0' && p[n] <= '9');
    if (left && right) return 1;
  }
  return 0;
}

static void test_destroy_busy_leak_report(void **state) {
  (void)state;
  tu_log *log = tu_log_new();
  gpumem_config cfg;
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  enum { N = 7 };
  const size_t sz = 1234567;
  void *p[N];
  for (int i = 0; i < N; i++) assert_status(gpumem_alloc_tagged(ctx, 0, sz, NULL, "leaky-weights", &p[i]), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  tu_log_clear(log);

  assert_status(gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY);
  /* the report: count, bytes, and the first blocks with size, device and tag */
  size_t total = 0;
  for (int i = 0; i < log->count && i < TU_LOG_MAX_MSGS; i++) total += strlen(log->msgs[i]) + 1;
  char *text = (char *)calloc(total + 1, 1);
  assert_non_null(text);
  for (int i = 0; i < log->count && i < TU_LOG_MAX_MSGS; i++) {
    strcat(text, log->msgs[i]);
    strcat(text, "\n");
  }
  if (!(tu_log_count_at_least(log, GPUMEM_LOG_WARN) >= 1 && has_number(text, N) && strstr(text, "leaky-weights") &&
        (has_number(text, (unsigned long long)N * sz) || has_number(text, st.allocated_bytes) ||
         strstr(text, "MiB") || strstr(text, "MB")) &&
        (has_number(text, sz) || strstr(text, "MiB") || strstr(text, "MB")))) {
    print_error("leak report lacks count/bytes/tag/size; got:\n%s\n", text);
    free(text);
    tu_log_free(log);
    fail();
  }
  free(text);

  /* BUSY changed nothing: the context stays usable and the blocks live */
  gpumem_stats st2 = tu_stats(ctx, 0);
  tu_assert_stats_equal(&st, &st2);
  for (int i = 0; i < N; i++) {
    size_t got = 0;
    int dev = -5;
    assert_status(gpumem_ptr_info(ctx, p[i], &got, &dev), GPUMEM_OK);
    assert_int_equal(got, sz);
    assert_int_equal(dev, 0);
  }
  void *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  for (int i = 0; i < N; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  tu_log_clear(log);
  tu_ctx_done(ctx);
  assert_int_equal(tu_log_count_matching(log, "leaky-weights", NULL), 0); /* no report when nothing leaked */
  tu_log_free(log);
}

static void test_destroy_force(void **state) {
  (void)state;
  gpumem_context *keeper = NULL;
  if (tu_is_sim()) {
    gpumem_config kc;
    tu_config(&kc);
    kc.flags = GPUMEM_CONFIG_NO_ENV;
    keeper = tu_ctx_new(&kc); /* keeps the sim state so the leak check sees it */
  }
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = NULL;
  for (int i = 0; i < 10; i++) assert_status(gpumem_alloc(ctx, 0, (size_t)(i + 1) * 100000, NULL, &p), GPUMEM_OK);
  gpumem_scope *sc = NULL;
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, TU_MiB, &p), GPUMEM_OK);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  if (tu_is_sim()) assert_true(tu_sim_used(0) > 0);
  tu_ctx_forget(ctx);
  assert_status(gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE), GPUMEM_OK);
  tu_assert_sim_empty();
  if (keeper) tu_ctx_done(keeper);
}

static void test_two_contexts_share_device(void **state) {
  (void)state;
  gpumem_context *a = tu_ctx_new(NULL), *b = tu_ctx_new(NULL);
  void *pa = NULL, *pb = NULL;
  assert_status(gpumem_alloc(a, 0, TU_MiB, NULL, &pa), GPUMEM_OK);
  assert_status(gpumem_alloc(b, 0, TU_MiB, NULL, &pb), GPUMEM_OK);
  assert_ptr_not_equal(pa, pb);
  void *ptrs[2] = {pa, pb};
  size_t sizes[2] = {TU_MiB, TU_MiB};
  assert_int_equal(tu_find_overlap(ptrs, sizes, 2), -1);
  /* a pointer of one context is foreign to the other */
  assert_status(gpumem_free(b, pa, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(a, pa, NULL), GPUMEM_OK);
  assert_status(gpumem_free(b, pb, NULL), GPUMEM_OK);
  /* destroying one leaves the other working */
  tu_ctx_done(a);
  assert_status(gpumem_alloc(b, 0, TU_MiB, NULL, &pb), GPUMEM_OK);
  assert_status(gpumem_free(b, pb, NULL), GPUMEM_OK);
  tu_ctx_done(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_create_destroy),
      TU_TEST(test_null_args),
      TU_TEST(test_destroy_bad_flags),
      TU_TEST(test_builtin_backends),
      TU_TEST(test_backend_not_built),
      TU_TEST(test_auto_fallback),
      TU_TEST(test_custom_backend),
      TU_TEST(test_custom_backend_init_fails),
      TU_TEST(test_custom_backend_validation),
      TU_TEST(test_destroy_busy_leak_report),
      TU_TEST(test_destroy_force),
      TU_TEST(test_two_contexts_share_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
