/* How much a thread cache may hold, and when it lets go (src/tcache.c, gpumem__pool_tc_budget):
 *   - at most a 64th of the device (64 MiB on a large one): what one thread's cache holds for its
 *     stream is bounded, so another thread's allocations grow the pool by at most that much;
 *   - before a pool grows, every thread's cache of it gives its blocks back: on the same stream
 *     they serve the request;
 *   - an expandable pool that would map memory for a thread whose cache holds blocks has the cache
 *     flushed first: the blocks, coalesced, serve the request, and nothing is mapped.
 * Sim only (exact byte and call counts). */
#include <pthread.h>
#include <string.h>

#include "gpumem/sim.h"
#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);
uint64_t gpumem__tc_cached_bytes(void); /* src/tcache.c, for tests: the calling thread's cache */

enum { KB = 1024, MB = 1024 * 1024 };

static gpumem_context *ctx_with(int expandable) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.expandable = expandable;
  return tu_ctx_new(&cfg);
}

/* 64 blocks, 8 of each of the 8 size classes from 512 KiB to 1 MiB (64 KiB apart): 46 MiB in all,
 * every one of which a cache with room would keep (8 blocks per class). */
enum { NBLK = 64 };
static size_t blk_size(int i) { return (size_t)(512 + 64 * (i % 8)) * KB; }

typedef struct job {
  gpumem_context *ctx;
  gpumem_stream s;
  void *p[NBLK];
  int alloc; /* 1: allocate the NBLK blocks; 0: free them */
  gpumem_status st;
} job;

static void *run_job(void *arg) {
  job *j = arg;
  j->st = GPUMEM_OK;
  for (int i = 0; i < NBLK && j->st == GPUMEM_OK; i++)
    j->st = j->alloc ? gpumem_alloc(j->ctx, 0, blk_size(i), j->s, &j->p[i]) : gpumem_free(j->ctx, j->p[i], j->s);
  return NULL;
}

static void in_thread(job *j) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_job, j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_status(j->st, GPUMEM_OK);
}

/* Thread A allocates and frees the NBLK blocks on the default stream, and stays alive (its exit would
 * flush its cache); then thread B allocates them again, on the same stream. Returns by how much the
 * pool grew for B. */
typedef struct holder {
  gpumem_context *ctx;
  gpumem_stream s;
  pthread_mutex_t m;
  pthread_cond_t cv;
  int phase; /* 0 start, 1 freed (cache warm), 2 may exit */
  gpumem_status st;
} holder;

static void *hold_main(void *arg) {
  holder *h = arg;
  job j = {.ctx = h->ctx, .s = h->s, .alloc = 1};
  run_job(&j);
  if (j.st == GPUMEM_OK) {
    j.alloc = 0;
    run_job(&j);
  }
  pthread_mutex_lock(&h->m);
  h->st = j.st;
  h->phase = 1;
  pthread_cond_broadcast(&h->cv);
  while (h->phase != 2) pthread_cond_wait(&h->cv, &h->m);
  pthread_mutex_unlock(&h->m);
  return NULL;
}

static uint64_t growth_for_second_thread(void) {
  tu_setenv("GPUMEM_SIM_DEVICES", "512MiB");
  gpumem_context *ctx = ctx_with(0);
  holder h = {.ctx = ctx, .s = NULL, .phase = 0};
  pthread_mutex_init(&h.m, NULL);
  pthread_cond_init(&h.cv, NULL);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold_main, &h), 0);
  pthread_mutex_lock(&h.m);
  while (h.phase != 1) pthread_cond_wait(&h.cv, &h.m);
  pthread_mutex_unlock(&h.m);
  assert_status(h.st, GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  assert_int_equal(before.num_live, 0);
  job b = {.ctx = ctx, .s = NULL, .alloc = 1};
  in_thread(&b);
  gpumem_stats after = tu_stats(ctx, 0);
  print_message("reserved %llu MiB -> %llu MiB\n", (unsigned long long)(before.reserved_bytes / MB),
                (unsigned long long)(after.reserved_bytes / MB));
  b.alloc = 0;
  in_thread(&b);
  pthread_mutex_lock(&h.m);
  h.phase = 2;
  pthread_cond_broadcast(&h.cv);
  pthread_mutex_unlock(&h.m);
  assert_int_equal(pthread_join(t, NULL), 0);
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  pthread_mutex_destroy(&h.m);
  pthread_cond_destroy(&h.cv);
  tu_ctx_done(ctx);
  return after.reserved_bytes - before.reserved_bytes;
}

/* A cache holds at most a 64th of the device: 8 MiB on a 512 MiB device, 64 MiB on a large one (which
 * takes all 46 MiB). */
static uint64_t cached_after_freeing_all(const char *devices) {
  tu_setenv("GPUMEM_SIM_DEVICES", devices);
  gpumem_context *ctx = ctx_with(0);
  job j = {.ctx = ctx, .s = NULL, .alloc = 1};
  run_job(&j);
  assert_status(j.st, GPUMEM_OK);
  j.alloc = 0;
  run_job(&j);
  assert_status(j.st, GPUMEM_OK);
  uint64_t held = gpumem__tc_cached_bytes();
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0);
  print_message("%s: this thread's cache holds %.2f MiB\n", devices, (double)held / MB);
  tu_ctx_done(ctx);
  return held;
}

static void test_a_cache_holds_a_64th_of_the_device(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  uint64_t small = cached_after_freeing_all("512MiB");
  assert_true(small > 4 * MB && small <= 8 * MB);
  uint64_t all = 0;
  for (int i = 0; i < NBLK; i++) all += blk_size(i);
  assert_int_equal(cached_after_freeing_all("141GiB"), all);
}

/* B on A's stream: before the pool grows for B, every cache of the pool gives its blocks back, A's too,
 * and those serve B. The pool grows by less than A's cache held (8 MiB): by the holes 2 MiB segments
 * leave at most. (Without flushing the other threads' caches it grew by 10 MiB.) */
static void test_other_threads_caches_flushed_before_growth(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  uint64_t g = growth_for_second_thread();
  assert_true(g < 8 * MB);
}

/* Expandable segments: blocks filling a granule (2 MiB) are freed into the cache; a 1 MiB request
 * then finds nothing mapped and free. The pool flushes the cache first: the blocks coalesce into
 * 2 MiB and serve it, and nothing is mapped. */
static void test_cache_flushed_before_mapping(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = ctx_with(1);
  /* 64 KiB * (1 + 2 + ... + 7) + 256 KiB = 2 MiB, in classes with room */
  static const size_t sz[] = {64 * KB, 128 * KB, 192 * KB, 256 * KB, 320 * KB, 384 * KB, 448 * KB, 256 * KB};
  enum { N = sizeof sz / sizeof sz[0] };
  void *p[N];
  for (int i = 0; i < N; i++) assert_status(gpumem_alloc(ctx, 0, sz[i], NULL, &p[i]), GPUMEM_OK);
  gpumem_stats full = tu_stats(ctx, 0);
  assert_int_equal(full.reserved_bytes, 2 * MB); /* one granule, all of it used */
  for (int i = 0; i < N; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  uint64_t maps = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
  uint64_t creates = gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC);
  void *q;
  assert_status(gpumem_alloc(ctx, 0, 1 * MB, NULL, &q), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_int_equal(s.reserved_bytes, 2 * MB);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP), maps);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC), creates);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 1 && s.allocated_bytes == 1 * MB && s.requested_bytes == 1 * MB);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_a_cache_holds_a_64th_of_the_device, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_other_threads_caches_flushed_before_growth, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_cache_flushed_before_mapping, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
