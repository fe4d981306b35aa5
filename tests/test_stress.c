/* Stress: threads with random sizes, cross-thread frees, stamps checked at free, a concurrent trimmer. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "testutil.h"

enum { THREADS = 4, OPS = 4000, SLOTS = 512 };

typedef struct slot {
  void *p;
  size_t n;
  uint32_t stamp;
} slot;

static gpumem_context *g_ctx;
static slot g_slots[SLOTS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_stop;
static atomic_int g_errors;
static char g_first_error[256];

static void record_error(const char *what, gpumem_status s) {
  if (atomic_fetch_add(&g_errors, 1) == 0) snprintf(g_first_error, sizeof g_first_error, "%s: %s", what, gpumem_status_name(s));
}

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (id + 1);
  gpumem_stream stream = tu_is_sim() ? (gpumem_stream)(0x1000 + id) : NULL;
  for (int op = 0, ops = (int)tu_scaled(OPS, 500); op < ops; op++) { /* valgrind: fewer (testutil.h) */
    int i = (int)(tu_rand(&rng) % SLOTS);
    slot taken = {0};
    pthread_mutex_lock(&g_mu);
    if (g_slots[i].p) {
      taken = g_slots[i];
      g_slots[i].p = NULL;
    }
    pthread_mutex_unlock(&g_mu);
    if (taken.p) { /* free, possibly a block another thread allocated */
      if (!tu_stamp_ok(taken.p, taken.n, taken.stamp)) record_error("stamp damaged", GPUMEM_OK);
      gpumem_status s = gpumem_free(g_ctx, taken.p, stream);
      if (s != GPUMEM_OK) record_error("free", s);
      continue;
    }
    uint64_t r = tu_rand(&rng) % 100;
    size_t n = (size_t)(r < 80 ? tu_rand_range(&rng, 1, 32 * 1024) : r < 98 ? tu_rand_range(&rng, 32 * 1024, 2 * TU_MiB)
                                                                            : tu_rand_range(&rng, 2 * TU_MiB, 24 * TU_MiB));
    void *p = NULL;
    gpumem_status s = gpumem_alloc(g_ctx, 0, n, stream, &p);
    if (s != GPUMEM_OK || !p || ((uintptr_t)p % 256) != 0) {
      record_error("alloc", s);
      continue;
    }
    uint32_t stamp = (uint32_t)(id << 24 | (uint32_t)op);
    tu_stamp(p, n, stamp);
    pthread_mutex_lock(&g_mu);
    int placed = 0;
    if (!g_slots[i].p) {
      g_slots[i].p = p;
      g_slots[i].n = n;
      g_slots[i].stamp = stamp;
      placed = 1;
    }
    pthread_mutex_unlock(&g_mu);
    if (!placed) {
      if (!tu_stamp_ok(p, n, stamp)) record_error("stamp damaged (own)", GPUMEM_OK);
      s = gpumem_free(g_ctx, p, stream);
      if (s != GPUMEM_OK) record_error("free own", s);
    }
  }
  return NULL;
}

static void *trimmer(void *arg) {
  (void)arg;
  uint64_t rng = 99;
  while (!atomic_load(&g_stop)) {
    uint64_t released = 0;
    gpumem_status s = gpumem_trim(g_ctx, (tu_rand(&rng) & 1) ? 0 : GPUMEM_ALL_DEVICES, tu_rand(&rng) % (32 * TU_MiB), &released);
    if (s != GPUMEM_OK) record_error("trim", s);
    gpumem_stats st;
    st.struct_size = sizeof st;
    s = gpumem_get_stats(g_ctx, 0, &st);
    if (s != GPUMEM_OK) record_error("stats", s);
    else if (st.allocated_bytes > st.reserved_bytes || st.cached_bytes != st.reserved_bytes - st.allocated_bytes ||
             st.requested_bytes > st.allocated_bytes || st.num_live != st.num_allocs - st.num_frees)
      record_error("inconsistent stats snapshot", GPUMEM_ERR_INTERNAL);
    if (tu_rand(&rng) % 8 == 0) gpumem_reset_peak_stats(g_ctx, 0);
    sched_yield();
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.release_threshold = 64 * TU_MiB; /* threshold trims racing with everything else */
  g_ctx = tu_ctx_new(&cfg);
  memset(g_slots, 0, sizeof g_slots);
  atomic_store(&g_stop, 0);
  atomic_store(&g_errors, 0);
  pthread_t th[THREADS], tr;
  assert_int_equal(pthread_create(&tr, NULL, trimmer, NULL), 0);
  for (uintptr_t i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, worker, (void *)i), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  atomic_store(&g_stop, 1);
  pthread_join(tr, NULL);
  if (atomic_load(&g_errors)) {
    print_error("%d errors; first: %s\n", atomic_load(&g_errors), g_first_error);
    fail();
  }
  /* no two live blocks overlap */
  void *ptrs[SLOTS];
  size_t sizes[SLOTS];
  uint64_t live = 0, req = 0;
  for (int i = 0; i < SLOTS; i++) {
    ptrs[i] = g_slots[i].p;
    sizes[i] = g_slots[i].n;
    if (ptrs[i]) {
      live++;
      req += sizes[i];
    }
  }
  assert_int_equal(tu_find_overlap(ptrs, sizes, SLOTS), -1);
  gpumem_stats st = tu_stats(g_ctx, 0);
  tu_assert_stats_sane(&st);
  assert_true(st.num_live == live);
  assert_true(st.requested_bytes == req);
  assert_true(st.num_live == st.num_allocs - st.num_frees);
  for (int i = 0; i < SLOTS; i++)
    if (g_slots[i].p) {
      assert_true(tu_stamp_ok(g_slots[i].p, g_slots[i].n, g_slots[i].stamp));
      assert_status(gpumem_free(g_ctx, g_slots[i].p, NULL), GPUMEM_OK);
      g_slots[i].p = NULL;
    }
  st = tu_stats(g_ctx, 0);
  assert_true(st.num_live == 0 && st.allocated_bytes == 0);
  if (tu_is_sim()) gpumem_sim_complete_all();
  tu_ctx_done(g_ctx); /* leak check */
}

static void *creator(void *arg) {
  (void)arg;
  for (int i = 0; i < 50; i++) {
    gpumem_config cfg;
    tu_config(&cfg);
    cfg.flags = GPUMEM_CONFIG_NO_ENV;
    gpumem_context *c = NULL;
    gpumem_status s = gpumem_create(&cfg, &c);
    if (s != GPUMEM_OK) {
      record_error("create", s);
      continue;
    }
    void *p = NULL;
    s = gpumem_alloc(c, 0, 100000, NULL, &p);
    if (s != GPUMEM_OK) record_error("alloc in short-lived context", s);
    else if ((s = gpumem_free(c, p, NULL)) != GPUMEM_OK) record_error("free in short-lived context", s);
    if ((s = gpumem_destroy(c, 0)) != GPUMEM_OK) record_error("destroy", s);
  }
  return NULL;
}

static void test_concurrent_contexts(void **state) {
  (void)state;
  atomic_store(&g_errors, 0);
  gpumem_context *keeper = tu_ctx_new(NULL); /* keeps the sim state for the leak check */
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, creator, NULL), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  if (atomic_load(&g_errors)) {
    print_error("%d errors; first: %s\n", atomic_load(&g_errors), g_first_error);
    fail();
  }
  tu_assert_sim_empty();
  tu_ctx_done(keeper);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_threads),
      TU_TEST(test_concurrent_contexts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
