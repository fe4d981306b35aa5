/* Per-thread caches (src/tcache.c): double-free races, cross-thread frees,
 * stats exact with blocks cached by other threads, thread exit, trim and
 * destroy while other threads' caches hold blocks, stream order. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);

static gpumem_context *g_ctx;
static void *g_ptr;
static pthread_barrier_t g_bar;
static atomic_int g_ok, g_invalid;

static void *race_loop(void *arg) {
  int n = (int)(intptr_t)arg;
  for (int r = 0; r < n; r++) {
    pthread_barrier_wait(&g_bar);
    gpumem_status s = gpumem_free(g_ctx, g_ptr, NULL);
    if (s == GPUMEM_OK) atomic_fetch_add(&g_ok, 1);
    else if (s == GPUMEM_ERR_INVALID_POINTER) atomic_fetch_add(&g_invalid, 1);
    pthread_barrier_wait(&g_bar);
  }
  return NULL;
}

static void test_double_free_race_loop(void **state) {
  (void)state;
  g_ctx = tu_ctx_new(NULL);
  enum { ROUNDS = 300 };
  pthread_t th[2];
  pthread_barrier_init(&g_bar, NULL, 3);
  atomic_store(&g_ok, 0);
  atomic_store(&g_invalid, 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, race_loop, (void *)(intptr_t)ROUNDS), 0);
  for (int r = 0; r < ROUNDS; r++) {
    assert_status(gpumem_alloc(g_ctx, 0, 4096 * (size_t)(1 + r % 3), NULL, &g_ptr), GPUMEM_OK);
    pthread_barrier_wait(&g_bar);
    pthread_barrier_wait(&g_bar);
    assert_int_equal(atomic_load(&g_ok), r + 1);
    assert_int_equal(atomic_load(&g_invalid), r + 1);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&g_bar);
  gpumem_stats s = tu_stats(g_ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0 && s.requested_bytes == 0);
  assert_true(s.num_allocs == ROUNDS && s.num_frees == ROUNDS);
  assert_status(gpumem__check_invariants(g_ctx), GPUMEM_OK);
  tu_ctx_done(g_ctx);
}

/* a thread allocates and frees (its cache keeps blocks), then exits or waits while the main thread reads stats, trims, destroys */
typedef struct worker_arg {
  int exit_now;
  int n;
  void *keep; /* one block left live, freed by the main thread */
} worker_arg;

static pthread_barrier_t g_hold;

static void *cacher(void *arg) {
  worker_arg *a = arg;
  void *p[8];
  for (int i = 0; i < a->n; i++) {
    if (gpumem_alloc(g_ctx, 0, 1000 + 4096 * (size_t)i, NULL, &p[i]) != GPUMEM_OK) return (void *)1;
  }
  for (int i = 1; i < a->n; i++)
    if (gpumem_free(g_ctx, p[i], NULL) != GPUMEM_OK) return (void *)2;
  a->keep = p[0];
  if (!a->exit_now) {
    pthread_barrier_wait(&g_hold); /* main thread checks with our cache full */
    pthread_barrier_wait(&g_hold);
  }
  return NULL;
}

static void test_other_threads_caches(void **state) {
  (void)state;
  g_ctx = tu_ctx_new(NULL);
  pthread_barrier_init(&g_hold, NULL, 2);
  worker_arg a = {0, 8, NULL};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, cacher, &a), 0);
  pthread_barrier_wait(&g_hold);
  /* stats exact while the worker's cache holds 7 blocks */
  gpumem_stats s = tu_stats(g_ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_allocs == 8 && s.num_frees == 7 && s.num_live == 1);
  assert_true(s.requested_bytes == 1000);
  assert_true(s.allocated_bytes == 1024);
  assert_true(s.cached_bytes == s.reserved_bytes - s.allocated_bytes);
  /* peak: one thread did it all, so it is exact */
  uint64_t peak = 0;
  for (int i = 0; i < 8; i++) peak += (1000 + 4096 * (uint64_t)i + 255) / 256 * 256;
  assert_true(s.allocated_peak == peak);
  /* trim gives back what the other thread cached */
  uint64_t rel = 0;
  assert_status(gpumem_trim(g_ctx, 0, 0, &rel), GPUMEM_OK);
  s = tu_stats(g_ctx, 0);
  assert_true(s.num_live == 1 && s.allocated_bytes == 1024);
  /* a free from this thread of the worker's block */
  assert_status(gpumem_free(g_ctx, a.keep, NULL), GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, a.keep, NULL), GPUMEM_ERR_INVALID_POINTER);
  pthread_barrier_wait(&g_hold);
  void *rv = (void *)1;
  pthread_join(th, &rv);
  assert_null(rv);
  s = tu_stats(g_ctx, 0);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0 && s.requested_bytes == 0);
  assert_status(gpumem__check_invariants(g_ctx), GPUMEM_OK);
  /* a worker that exits with a full cache: its blocks go back at thread exit */
  a.exit_now = 1;
  assert_int_equal(pthread_create(&th, NULL, cacher, &a), 0);
  pthread_join(th, &rv);
  assert_null(rv);
  s = tu_stats(g_ctx, 0);
  assert_true(s.num_allocs == 16 && s.num_frees == 15 && s.num_live == 1 && s.requested_bytes == 1000);
  assert_status(gpumem_free(g_ctx, a.keep, NULL), GPUMEM_OK);
  /* destroy while another thread's cache holds blocks of the context */
  a.exit_now = 0;
  assert_int_equal(pthread_create(&th, NULL, cacher, &a), 0);
  pthread_barrier_wait(&g_hold);
  assert_status(gpumem_free(g_ctx, a.keep, NULL), GPUMEM_OK);
  assert_status(gpumem_destroy(g_ctx, 0), GPUMEM_OK); /* no live block: the cached ones are not leaks */
  tu_ctx_forget(g_ctx);
  pthread_barrier_wait(&g_hold);
  pthread_join(th, &rv); /* the worker's exit must not touch the destroyed context */
  assert_null(rv);
  pthread_barrier_destroy(&g_hold);
  tu_assert_sim_empty();
}

/* a block freed on stream S is reused at once only by S */
static void test_stream_order(void **state) {
  (void)state;
  if (!tu_is_sim()) skip();
  g_ctx = tu_ctx_new(NULL);
  gpumem_stream s1 = (gpumem_stream)0x111, s2 = (gpumem_stream)0x222;
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(g_ctx, 0, 65536, s1, &p), GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, p, s1), GPUMEM_OK);
  assert_status(gpumem_alloc(g_ctx, 0, 65536, s1, &q), GPUMEM_OK);
  assert_ptr_equal(p, q); /* same stream: reused */
  assert_status(gpumem_free(g_ctx, q, s1), GPUMEM_OK);
  void *r = NULL;
  assert_status(gpumem_alloc(g_ctx, 0, 65536, s2, &r), GPUMEM_OK);
  assert_ptr_not_equal(p, r); /* other stream: the sim has not completed s1's work */
  assert_status(gpumem_free(g_ctx, r, s2), GPUMEM_OK);
  tu_ctx_done(g_ctx);
}

/* A block in this thread's cache keeps its pointer-index entry, marked
 * cached: to every look-up it must be absent (double free, ptr_info, free
 * through another stream or from another thread), and handed out again it
 * must be live once more with its new size. */
static void *free_other(void *arg) {
  void **pp = arg;
  *(gpumem_status *)pp[1] = gpumem_free(g_ctx, pp[0], NULL);
  return NULL;
}

static void test_cached_block_is_not_live(void **state) {
  (void)state;
  g_ctx = tu_ctx_new(NULL);
  void *p, *q;
  size_t sz = 0;
  int dev = -1;
  assert_status(gpumem_alloc(g_ctx, 0, 65536, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_OK); /* into this thread's cache */
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(g_ctx, p, (gpumem_stream)(uintptr_t)0x1234), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_ptr_info(g_ctx, p, &sz, &dev), GPUMEM_ERR_INVALID_POINTER);
  gpumem_status other = GPUMEM_OK;
  void *arg[2] = {p, &other};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, free_other, arg), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_status(other, GPUMEM_ERR_INVALID_POINTER);
  gpumem_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_status(gpumem_get_stats(g_ctx, 0, &st), GPUMEM_OK);
  assert_int_equal(st.num_live, 0);
  assert_int_equal(st.allocated_bytes, 0);
  /* the same rounded size comes back from the cache: the same block, live again */
  assert_status(gpumem_alloc(g_ctx, 0, 65536 - 100, NULL, &q), GPUMEM_OK);
  assert_ptr_equal(q, p);
  assert_status(gpumem_ptr_info(g_ctx, q, &sz, &dev), GPUMEM_OK);
  assert_int_equal(sz, 65536 - 100);
  assert_int_equal(dev, 0);
  assert_status(gpumem_get_stats(g_ctx, 0, &st), GPUMEM_OK);
  assert_int_equal(st.num_live, 1);
  assert_int_equal(st.requested_bytes, 65536 - 100);
  /* a free from another thread of a live block reached through the cache works once */
  assert_int_equal(pthread_create(&t, NULL, free_other, arg), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_status(other, GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, q, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem__check_invariants(g_ctx), GPUMEM_OK);
  /* trim flushes the caches: entries of cached blocks go with them */
  assert_status(gpumem_alloc(g_ctx, 0, 4096, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(g_ctx, 0, 0, NULL), GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem__check_invariants(g_ctx), GPUMEM_OK);
  tu_ctx_done(g_ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_double_free_race_loop),
      TU_TEST(test_other_threads_caches),
      TU_TEST(test_stream_order),
      TU_TEST(test_cached_block_is_not_live),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
