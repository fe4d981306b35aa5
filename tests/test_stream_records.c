/* Stream records (stream_order.c): the per-stream state of a pool lives while its stream has
 * something in the pool (free blocks, a pending batch, a mark) and is dropped after, at the end of
 * a free once there are many, and by a trim. An application that makes a short-lived stream per
 * request keeps host memory bounded (before, about 8 KB stayed for every stream ever named: 200,000
 * streams held 1.5 GB), and stream-ordered reuse stays as strict. Counted through the pool's
 * record count (an internal call) and the process's heap (glibc's mallinfo2). */
#include <malloc.h>

#include "testutil.h"

/* internal (src/internal.h), linked from the static library */
gpumem_status gpumem__check_invariants(gpumem_context *ctx);
size_t gpumem__stream_records(gpumem_context *ctx, int device);

/* Streams per case: 50,000 (200,000 stay at 64 records as well); fewer in the sanitizer builds,
 * where the pool's invariant checks run after every call (still far above the bound). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GPUMEM_TEST_SANITIZED 1 /* clang's spelling of gcc's __SANITIZE_* */
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(GPUMEM_TEST_SANITIZED)
#define STREAMS 1000ul
#else
#define STREAMS 50000ul
#endif

#define STREAM(i) ((gpumem_stream)(uintptr_t)(0x100000u + (uintptr_t)(i) * 16u))

static size_t heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#else
  return 0;
#endif
}

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

/* One allocation and free on each of many streams, each stream never named again. */
static void churn(gpumem_context *ctx, unsigned long first, unsigned long n, size_t size) {
  for (unsigned long i = first; i < first + n; i++) {
    void *p = NULL;
    assert_status(gpumem_alloc(ctx, 0, size, STREAM(i), &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, STREAM(i)), GPUMEM_OK);
  }
}

static void many_streams(const gpumem_config *cfg, size_t size) {
  TU_REQUIRE_SIM(); /* stream handles are tokens on sim */
  gpumem_context *ctx = tu_ctx_new(cfg);
  const unsigned long n = tu_scaled(STREAMS, 1000);
  churn(ctx, 0, 1000, size); /* the pool and its first records exist: measure from here */
  size_t heap0 = heap_in_use();
  size_t most = 0;
  for (unsigned long done = 0; done < n; done += 500) {
    churn(ctx, 1000 + done, 500, size);
    size_t r = gpumem__stream_records(ctx, 0);
    if (r > most) most = r;
  }
  size_t heap1 = heap_in_use();
  print_message("%lu streams: at most %zu stream records, heap %+lld bytes\n", n, most,
                (long long)heap1 - (long long)heap0);
  /* at most a few sweeps' worth (SREC_REAP_MIN = 64, then twice the records still in use) */
  assert_true(most <= 256);
  /* the sim keeps a small record of every stream token it saw (like a driver, until the stream is
   * destroyed; tokens here are never destroyed): well under a kilobyte per stream in all, where the
   * pool alone kept about 8 KB per stream before */
  if (heap0 != 0) assert_true(heap1 < heap0 + (size_t)n * 512);
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  assert_true(gpumem__stream_records(ctx, 0) <= 1);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_many_streams_cached(void **state) {
  (void)state;
  many_streams(NULL, 4096); /* thread caches: a free on another stream than the cache's goes to the pool */
}

static void test_many_streams_large(void **state) {
  (void)state;
  many_streams(NULL, 3 * TU_MiB); /* not cached: every call is the pool's */
}

static void test_many_streams_plain(void **state) {
  (void)state;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.expandable = 0;
  cfg.release_threshold = 64 * TU_MiB; /* thread caches off */
  many_streams(&cfg, 8192);
}

/* A stream whose frees wait for its work keeps its record through any number of sweeps, and
 * another stream does not get the block before that work completed. */
static void test_pending_record_kept(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.expandable = 0;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  gpumem_sim_set_delayed(1);
  const size_t n = 12 * TU_MiB; /* a segment of its own */
  gpumem_stream sa = STREAM(7000001), sb = STREAM(7000002);
  void *x = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, sa, &x), GPUMEM_OK);
  assert_status(gpumem_free(ctx, x, sa), GPUMEM_OK); /* its event is pending on sa */
  churn(ctx, 0, STREAMS < 2000 ? 600 : 2000, 4096);   /* many sweeps meanwhile */
  assert_status(gpumem_alloc(ctx, 0, n, sb, &q), GPUMEM_OK);
  assert_false(overlaps(x, n, q, n)); /* sa's work is not complete: a new segment */
  assert_status(gpumem_free(ctx, q, sb), GPUMEM_OK);
  gpumem_sim_stream_complete(0, sa);
  churn(ctx, 3000, 200, 4096);
  void *r = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, sb, &r), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_status(gpumem_free(ctx, r, sb), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  gpumem_sim_set_delayed(0);
  tu_ctx_done(ctx);
}

/* A trim drops the records of streams whose frees it waited for. */
static void test_trim_drops_records(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_sim_set_delayed(1);
  for (unsigned i = 0; i < 40; i++) { /* below the sweep's threshold: only the trim drops them */
    void *p = NULL;
    assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, STREAM(i), &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, STREAM(i)), GPUMEM_OK);
  }
  assert_true(gpumem__stream_records(ctx, 0) >= 40);
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  assert_true(gpumem__stream_records(ctx, 0) <= 1);
  gpumem_sim_set_delayed(0);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_many_streams_cached), TU_TEST(test_many_streams_large), TU_TEST(test_many_streams_plain),
      TU_TEST(test_pending_record_kept), TU_TEST(test_trim_drops_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
