/* The thread cache's large slot (src/tcache.c, "The large slot"): a block above 1 MiB that a thread
 * frees right after its cache handed it out, in a pool that has seen that one stream only, waits in
 * the cache for the next allocation of its size:
 *   - repeated pairs of one large size take the same block back, with exact statistics, and every
 *     free is still validated (a second free of the kept block is refused);
 *   - another stream never gets it while the freeing stream's work may be pending, and from the
 *     second stream on nothing is kept;
 *   - a block noted on another stream (gpumem_record_stream) is not kept: it waits for that stream;
 *   - trim, reset and a lower limit give it back, and so does another thread's allocation that
 *     needs the memory (the limit path flushes every cache of the pool), and low device memory
 *     (the watcher's free-fraction check).
 * Sim only (exact byte counts, delayed streams). */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "gpumem/sim.h"
#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);
uint64_t gpumem__tc_cached_bytes(void); /* src/tcache.c, for tests: the calling thread's cache */

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)
#define MiB ((size_t)1 << 20)

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static gpumem_context *ctx_new(uint64_t limit) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.limit_bytes = limit;
  return tu_ctx_new(&cfg);
}

/* Frees on s until the pool records no more events at frees (its solo mode): pairs of two sizes in
 * turn, which the large slot never keeps (a size is kept only when the request before had it too). */
static void warm(gpumem_context *ctx, gpumem_stream s) {
  for (int i = 0; i < 300; i++) {
    void *p = NULL;
    assert_status(gpumem_alloc(ctx, 0, (i & 1) ? 3 * MiB : 3 * MiB + 4096, s, &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, s), GPUMEM_OK);
  }
}

/* Two pairs of n bytes on s, then an allocation and its free: that block is kept; returns it. */
static void *park(gpumem_context *ctx, size_t n, gpumem_stream s) {
  void *p = NULL;
  for (int i = 0; i < 2; i++) {
    assert_status(gpumem_alloc(ctx, 0, n, s, &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, s), GPUMEM_OK);
  }
  assert_status(gpumem_alloc(ctx, 0, n, s, &p), GPUMEM_OK);
  uint64_t before = gpumem__tc_cached_bytes();
  assert_status(gpumem_free(ctx, p, s), GPUMEM_OK);
  assert_int_equal(gpumem__tc_cached_bytes() - before, n); /* in the large slot */
  return p;
}

static void test_pairs_take_the_kept_block(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = ctx_new(0);
  warm(ctx, SA);
  const size_t sizes[] = {2 * MiB, 64 * MiB, 1024 * MiB};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    const size_t n = sizes[k];
    void *p = park(ctx, n, SA);
    assert_status(gpumem_reset_peak_stats(ctx, 0), GPUMEM_OK);
    gpumem_stats s0 = tu_stats(ctx, 0);
    assert_int_equal(s0.allocated_bytes, 0);
    assert_int_equal(s0.cached_bytes, s0.reserved_bytes); /* the kept block counts as cached */
    for (int i = 0; i < 100; i++) {
      void *q = NULL;
      assert_status(gpumem_alloc(ctx, 0, n, SA, &q), GPUMEM_OK);
      assert_ptr_equal(q, p);
      if (i == 50) {
        gpumem_stats s = tu_stats(ctx, 0);
        assert_int_equal(s.allocated_bytes, n);
        assert_int_equal(s.requested_bytes, n);
        assert_int_equal(s.num_live, 1);
        assert_int_equal(s.allocated_peak, n);
      }
      assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
    }
    gpumem_stats s1 = tu_stats(ctx, 0);
    assert_int_equal(s1.allocated_bytes, 0);
    assert_int_equal(s1.requested_bytes, 0);
    assert_int_equal(s1.num_live, 0);
    assert_int_equal(s1.num_allocs, s0.num_allocs + 100);
    assert_int_equal(s1.num_frees, s0.num_frees + 100);
    assert_int_equal(s1.allocated_peak, n);
    assert_int_equal(s1.num_backend_allocs, s0.num_backend_allocs);
    assert_int_equal(s1.reserved_bytes, s0.reserved_bytes);
    /* kept, not live: a second free, and a look-up, are refused, and change nothing */
    assert_status(gpumem_free(ctx, p, SA), GPUMEM_ERR_INVALID_POINTER);
    assert_status(gpumem_ptr_info(ctx, p, NULL, NULL), GPUMEM_ERR_INVALID_POINTER);
    gpumem_stats s2 = tu_stats(ctx, 0);
    assert_true(tu_stats_equal(&s1, &s2));
    assert_int_equal(gpumem__tc_cached_bytes(), n);
    /* another size: the kept block goes back to the pool first */
    void *r = NULL;
    assert_status(gpumem_alloc(ctx, 0, n + MiB, SA, &r), GPUMEM_OK);
    assert_int_equal(gpumem__tc_cached_bytes(), 0);
    assert_status(gpumem_free(ctx, r, SA), GPUMEM_OK);
  }
  /* every call of this thread to the pool gives the kept block back first, also one that needs no
   * new memory (which would flush the cache anyway): a free the cache does not keep ... */
  const size_t n = 8 * MiB;
  void *q = NULL, *t = NULL;
  assert_status(gpumem_alloc(ctx, 0, n + MiB, SA, &q), GPUMEM_OK);
  (void)park(ctx, n, SA);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  /* ... and a small allocation the pool serves from a segment it has */
  assert_status(gpumem_alloc(ctx, 0, 4096, SA, &t), GPUMEM_OK);
  assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK); /* (kept in its class) */
  (void)park(ctx, n, SA);
  assert_status(gpumem_alloc(ctx, 0, 16384, SA, &t), GPUMEM_OK);
  assert_true(gpumem__tc_cached_bytes() < n);
  assert_status(gpumem_free(ctx, t, SA), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_other_stream_waits(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = ctx_new(0);
  warm(ctx, SA);
  gpumem_sim_set_delayed(1);
  const size_t n = 4 * MiB;
  void *p = park(ctx, n, SA);
  tu_stamp(p, n, 0xA1); /* work queued on A before the free may still use p (the stamp stands for it) */
  void *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SB, &q), GPUMEM_OK);
  assert_false(overlaps(p, n, q, n));
  assert_true(tu_stamp_ok_pending(p, n, 0xA1));
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  /* two streams now: a large free on A is no longer kept */
  void *r = NULL;
  for (int i = 0; i < 3; i++) {
    assert_status(gpumem_alloc(ctx, 0, n, SA, &r), GPUMEM_OK);
    assert_status(gpumem_free(ctx, r, SA), GPUMEM_OK);
    assert_int_equal(gpumem__tc_cached_bytes(), 0);
  }
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_record_stream_not_kept(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = ctx_new(0);
  warm(ctx, SA);
  gpumem_sim_set_delayed(1);
  const size_t n = 16 * MiB;
  void *x = NULL, *y = NULL;
  for (int i = 0; i < 2; i++) { /* the size repeats: the next block of it is kept at its free ... */
    assert_status(gpumem_alloc(ctx, 0, n, SA, &x), GPUMEM_OK);
    assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  }
  assert_status(gpumem_alloc(ctx, 0, n, SA, &x), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, x, SB), GPUMEM_OK); /* ... unless another stream uses it */
  tu_stamp(x, n, 0xB1);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_ERR_INVALID_POINTER);
  /* B's work may still use x: not even A gets it back */
  assert_status(gpumem_alloc(ctx, 0, n, SA, &y), GPUMEM_OK);
  assert_false(overlaps(x, n, y, n));
  assert_true(tu_stamp_ok_pending(x, n, 0xB1));
  assert_status(gpumem_free(ctx, y, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_trim_reset_limit_give_it_back(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  gpumem_context *ctx = ctx_new(0);
  warm(ctx, NULL);
  const size_t n = 64 * MiB;
  (void)park(ctx, n, NULL);
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, &rel), GPUMEM_OK);
  assert_true(rel >= n);
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_int_equal(s.reserved_bytes, 0);
  assert_int_equal(tu_sim_used(0), 0);

  void *p = park(ctx, n, NULL);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  s = tu_stats(ctx, 0);
  assert_int_equal(s.reserved_bytes, 0);
  assert_int_equal(s.allocated_bytes, 0);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);

  warm(ctx, NULL); /* (the reset made the pool new: no stream seen) */
  (void)park(ctx, n, NULL);
  assert_status(gpumem_set_limit(ctx, 0, 32 * MiB), GPUMEM_OK);
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  s = tu_stats(ctx, 0);
  assert_true(s.reserved_bytes <= 32 * MiB);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* Another thread keeps a block in its large slot and waits; this one needs that memory. */
typedef struct holder {
  gpumem_context *ctx;
  size_t n;
  pthread_barrier_t kept, done;
  uint64_t cached_after;
} holder;

static void *hold(void *arg) {
  holder *h = arg;
  (void)park(h->ctx, h->n, NULL);
  pthread_barrier_wait(&h->kept);
  pthread_barrier_wait(&h->done);
  h->cached_after = gpumem__tc_cached_bytes();
  return NULL;
}

static void test_limit_takes_another_threads_block(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  const uint64_t limit = 256 * MiB; /* a large slot holds at most 16 MiB */
  gpumem_context *ctx = ctx_new(limit);
  warm(ctx, NULL);
  holder h = {.ctx = ctx, .n = 16 * MiB};
  pthread_barrier_init(&h.kept, NULL, 2);
  pthread_barrier_init(&h.done, NULL, 2);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold, &h), 0);
  pthread_barrier_wait(&h.kept);
  void *big = NULL;
  gpumem_status st = gpumem_alloc(ctx, 0, limit - 8 * MiB, NULL, &big);
  pthread_barrier_wait(&h.done);
  assert_int_equal(pthread_join(t, NULL), 0);
  pthread_barrier_destroy(&h.kept);
  pthread_barrier_destroy(&h.done);
  assert_status(st, GPUMEM_OK);
  assert_int_equal(h.cached_after, 0);
  assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* An idle thread's kept block goes back when the device runs low: the watcher's free-fraction check
 * (share.c, tick) flushes the pool's thread caches. Another context takes most of the device. */
static void test_low_device_memory_gives_it_back(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  TU_REQUIRE_CACHES();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "1GiB"); /* a large slot holds up to 64 MiB */
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.share = "off";
  cfg.watch_interval_ms = 10;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  warm(ctx, NULL);
  const size_t n = 64 * MiB;
  (void)park(ctx, n, NULL);
  cfg.watch_interval_ms = 0;
  gpumem_context *other = tu_ctx_new(&cfg);
  gpumem_device_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_status(gpumem_device_get_info(other, 0, &info), GPUMEM_OK);
  void *big = NULL;
  assert_true(info.free_bytes > 64 * MiB);
  assert_status(gpumem_alloc(other, 0, (size_t)(info.free_bytes - 48 * MiB) & ~(2 * MiB - 1), NULL, &big), GPUMEM_OK);
  /* the device is below 10 % free now: the watcher's next check gives the kept block back */
  int polls = 0;
  while (gpumem__tc_cached_bytes() != 0 && polls++ < 5000) usleep(1000);
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_int_equal(s.allocated_bytes, 0);
  assert_status(gpumem_free(other, big, NULL), GPUMEM_OK);
  tu_ctx_done(other);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_pairs_take_the_kept_block),
      TU_TEST(test_other_stream_waits),
      TU_TEST(test_record_stream_not_kept),
      TU_TEST(test_trim_reset_limit_give_it_back),
      TU_TEST(test_limit_takes_another_threads_block),
      TU_TEST(test_low_device_memory_gives_it_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
