/* The thread caches' lock (src/tcache.h, src/tcache.c): each cache's owner takes it with plain
 * stores; other threads (statistics, trim, reset of peaks, destroy) take it under the cache list's
 * mutex with one membarrier for all caches. Here: owners doing inlined hits as fast as they can
 * while another thread takes every cache over and over; every block's contents are stamped and
 * checked (a block handed to two owners, or flushed while its owner pops it, shows as damage or as
 * inexact statistics), and the statistics are exact once the owners stop. The same tests run with
 * GPUMEM_TC_LOCKED=1 (the spinlock used without membarrier) as test_tcache_lock_locked. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);

enum { WORKERS = 4, HELD = 4 };

/* The sanitizers run this 5 (TSan) to 17 (clang ASan+UBSan) times slower; they check every access,
 * so fewer will do */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define UNDER_SAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define UNDER_SAN 1
#endif
#endif
#ifdef UNDER_SAN
#define SAN_DIV 8
#else
#define SAN_DIV 1
#endif

static gpumem_context *g_ctx;
static atomic_int g_done;
static atomic_int g_damage;
static atomic_ullong g_allocs;
static unsigned long g_iters, g_taken;

static size_t size_of(unsigned long i, int id) {
  static const size_t sizes[] = {4096, 65536, 512, 200000, 65536, 1u << 20};
  return sizes[(i + (unsigned long)id) % (sizeof sizes / sizeof sizes[0])];
}

static void *owner(void *arg) {
  int id = (int)(intptr_t)arg;
  void *held[HELD];
  size_t hsz[HELD];
  uint32_t hst[HELD];
  for (int h = 0; h < HELD; h++) {
    hsz[h] = size_of((unsigned long)h, id);
    if (gpumem_alloc(g_ctx, 0, hsz[h], NULL, &held[h]) != GPUMEM_OK) return (void *)1;
    hst[h] = (uint32_t)(id << 24 | h);
    tu_stamp(held[h], hsz[h], hst[h]);
    atomic_fetch_add(&g_allocs, 1);
  }
  for (unsigned long i = 0; i < g_iters; i++) {
    /* pairs: hits on this thread's cache, while the other thread takes it over */
    size_t n = size_of(i, id);
    void *p;
    if (gpumem_alloc(g_ctx, 0, n, NULL, &p) != GPUMEM_OK) return (void *)2;
    uint32_t st = (uint32_t)(id << 24 | (i & 0xffffff)) | 0x800000u;
    tu_stamp(p, n, st);
    atomic_fetch_add(&g_allocs, 1);
    if (!tu_stamp_ok(p, n, st)) atomic_fetch_add(&g_damage, 1);
    if (gpumem_free(g_ctx, p, NULL) != GPUMEM_OK) return (void *)3;
    /* now and then one of the held blocks changes: its memory must not have been handed out */
    if ((i & 15) == 0) {
      int h = (int)((i >> 4) % HELD);
      if (!tu_stamp_ok(held[h], hsz[h], hst[h])) atomic_fetch_add(&g_damage, 1);
      if (gpumem_free(g_ctx, held[h], NULL) != GPUMEM_OK) return (void *)4;
      hsz[h] = size_of(i + (unsigned long)h, id);
      if (gpumem_alloc(g_ctx, 0, hsz[h], NULL, &held[h]) != GPUMEM_OK) return (void *)5;
      hst[h] = (uint32_t)(id << 24 | (i & 0xffff) << 4 | (unsigned)h);
      tu_stamp(held[h], hsz[h], hst[h]);
      atomic_fetch_add(&g_allocs, 1);
    }
  }
  for (int h = 0; h < HELD; h++) {
    if (!tu_stamp_ok(held[h], hsz[h], hst[h])) atomic_fetch_add(&g_damage, 1);
    if (gpumem_free(g_ctx, held[h], NULL) != GPUMEM_OK) return (void *)6;
  }
  return NULL;
}

/* the other side: statistics (every cache), trims (every cache flushed), peak resets */
static void *taker(void *arg) {
  (void)arg;
  unsigned long k = 0;
  while (!atomic_load(&g_done)) {
    gpumem_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = (uint32_t)sizeof s;
    if (gpumem_get_stats(g_ctx, 0, &s) != GPUMEM_OK) return (void *)1;
    /* taken with every cache locked: consistent, whatever the owners are doing */
    if (s.num_allocs < s.num_frees || s.num_live != s.num_allocs - s.num_frees) return (void *)2;
    if (s.allocated_bytes > s.reserved_bytes || s.requested_bytes > s.allocated_bytes) return (void *)3;
    if (s.num_live > (uint64_t)WORKERS * (HELD + 1)) return (void *)4;
    /* a trim flushes every cache of the pool; with keep = all it gives no memory back (cheap) */
    if (gpumem_trim(g_ctx, 0, (k & 63) == 0 ? 0 : UINT64_MAX, NULL) != GPUMEM_OK) return (void *)5;
    if ((k & 15) == 0 && gpumem_reset_peak_stats(g_ctx, 0) != GPUMEM_OK) return (void *)6;
    k++;
    sched_yield(); /* a monitoring thread, not a wall: the owners get on between its calls */
  }
  g_taken = k;
  return k == 0 ? (void *)7 : NULL;
}

static void run_owners_against_taker(void) {
  g_ctx = tu_ctx_new(NULL);
  atomic_store(&g_done, 0);
  atomic_store(&g_damage, 0);
  atomic_store(&g_allocs, 0);
  pthread_t w[WORKERS], t;
  assert_int_equal(pthread_create(&t, NULL, taker, NULL), 0);
  for (int i = 0; i < WORKERS; i++) assert_int_equal(pthread_create(&w[i], NULL, owner, (void *)(intptr_t)i), 0);
  for (int i = 0; i < WORKERS; i++) {
    void *rv = (void *)1;
    pthread_join(w[i], &rv);
    assert_null(rv);
  }
  atomic_store(&g_done, 1);
  void *rv = (void *)1;
  pthread_join(t, &rv);
  assert_null(rv);
  assert_int_equal(atomic_load(&g_damage), 0);
  print_message("%llu allocations; the other thread took every cache %lu times\n",
                (unsigned long long)atomic_load(&g_allocs), g_taken);
  gpumem_stats s = tu_stats(g_ctx, 0);
  tu_assert_stats_sane(&s);
  uint64_t n = atomic_load(&g_allocs);
  assert_true(s.num_allocs == n && s.num_frees == n);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0 && s.requested_bytes == 0);
  assert_status(gpumem__check_invariants(g_ctx), GPUMEM_OK);
  tu_ctx_done(g_ctx);
}

static void test_hits_against_other_threads(void **state) {
  (void)state;
  g_iters = tu_scaled(10000 / SAN_DIV, 1000);
  run_owners_against_taker();
}

/* the owners' threads end (their caches are flushed at exit, under the list mutex) while the other
 * thread is taking every cache, many times over */
static void test_owners_come_and_go(void **state) {
  (void)state;
  g_iters = tu_scaled(1000, 100);
  int rounds = (int)tu_scaled(10 / SAN_DIV + 2, 3);
  for (int r = 0; r < rounds; r++) run_owners_against_taker();
}

/* ---- the protocol is logged (info) once per context, at its first thread-cache call ------------ */

static int g_said, g_said_asym, g_said_locked_env;
static void on_log(void *user, gpumem_log_level level, const char *msg) {
  (void)user;
  if (level != GPUMEM_LOG_INFO || strncmp(msg, "thread caches: ", 15) != 0) return;
  g_said++;
  g_said_asym += strstr(msg, "asymmetric lock (membarrier)") != NULL;
  g_said_locked_env += strstr(msg, "spinlock, no inlined hits (GPUMEM_TC_LOCKED=1)") != NULL;
}

/* valgrind's memcheck, the tool the sim annotates blocks for (src/backends/sim.c: it preloads its
 * own library, which names it) */
static int under_memcheck(void) {
  const char *pre = getenv("LD_PRELOAD");
  return tu_on_valgrind() && pre != NULL && strstr(pre, "vgpreload_memcheck") != NULL;
}

static void test_protocol_logged(void **state) {
  (void)state;
  const char *e = getenv("GPUMEM_TC_LOCKED");
  int forced = e != NULL && e[0] == '1';
  for (int round = 0; round < 2; round++) { /* a second context says it again, once */
    gpumem_config cfg;
    tu_config(&cfg);
    cfg.flags |= GPUMEM_CONFIG_NO_ENV; /* (ctest sets GPUMEM_LOG=off) */
    cfg.log_callback = on_log;
    cfg.log_level = GPUMEM_LOG_INFO;
    g_said = g_said_asym = g_said_locked_env = 0;
    gpumem_context *ctx = tu_ctx_new(&cfg);
    for (int i = 0; i < 4; i++) {
      void *p;
      assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &p), GPUMEM_OK);
      assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
    }
    if (tu_is_sim() && under_memcheck()) {
      /* the sim annotates blocks for memcheck: monitoring is on, the thread caches are off, and
       * nothing is said (TROUBLESHOOTING.md: "no line at all") */
      assert_int_equal(g_said, 0);
    } else {
      assert_int_equal(g_said, 1);
      if (forced) assert_int_equal(g_said_locked_env, 1);
      else assert_int_equal(g_said_locked_env, 0); /* asymmetric, or the spinlock for want of membarrier */
    }
    tu_ctx_done(ctx);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_hits_against_other_threads, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_owners_come_and_go, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_protocol_logged, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
