/* The steady state of a single-stream pool with expandable segments (src/stream_order.c,
 * "Single-stream expandable pools"): a random live set on one stream makes no
 * event calls once warm (every event record or query costs about a microsecond
 * on a GPU); the blocks it frees without an event are still never unmapped nor
 * handed to another stream while that stream's work may be pending. All
 * counts are of backend calls made by the sim backend, so the test is exact and
 * untimed. */
#include <stdlib.h>
#include <string.h>

#include "gpumem/sim.h"
#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)

static uint64_t rng_next(uint64_t *s) { /* splitmix64, as gpumem-bench */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

enum { MAX_LIVE = 300 };

typedef struct live_set {
  void *p[MAX_LIVE];
  size_t n[MAX_LIVE];
  size_t live;
  uint64_t seed;
} live_set;

/* One operation of gpumem-bench's random pattern: sizes log-uniform in 256 B .. 4 MiB (a uniform power
 * of two, then uniform within it: no libm here), random frees. */
static void random_op(gpumem_context *ctx, live_set *ls, gpumem_stream s) {
  int do_alloc = ls->live == 0 || (ls->live < MAX_LIVE && (rng_next(&ls->seed) & 1));
  if (do_alloc) {
    size_t lo = (size_t)256 << (rng_next(&ls->seed) % 14);
    size_t size = lo + (size_t)(rng_next(&ls->seed) % lo);
    assert_status(gpumem_alloc(ctx, 0, size, s, &ls->p[ls->live]), GPUMEM_OK);
    ls->n[ls->live++] = size;
  } else {
    size_t k = (size_t)(rng_next(&ls->seed) % ls->live);
    assert_status(gpumem_free(ctx, ls->p[k], s), GPUMEM_OK);
    ls->live--;
    ls->p[k] = ls->p[ls->live];
    ls->n[k] = ls->n[ls->live];
  }
}

static gpumem_context *vm_ctx(uint64_t release_threshold) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.expandable = 1;
  cfg.release_threshold = release_threshold;
  return tu_ctx_new(&cfg);
}

/* Steady state of one stream: at most 2 event calls per 1000 operations
 * (before: a record and a query about every 14 operations, ~143 per 1000),
 * stats exact, invariants kept. Run on the default stream and on another one. */
static void run_steady(gpumem_stream s) {
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "8GiB");
  gpumem_context *ctx = vm_ctx(UINT64_MAX);
  live_set ls;
  memset(&ls, 0, sizeof ls);
  ls.seed = 42;
  const unsigned long warm = 3000, ops = tu_scaled(12000, 3000);
  for (unsigned long i = 0; i < warm; i++) random_op(ctx, &ls, s);
  uint64_t ev0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_EVENT);
  uint64_t sync0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC);
  for (unsigned long i = 0; i < ops; i++) random_op(ctx, &ls, s);
  uint64_t ev = gpumem_sim_call_count(GPUMEM_SIM_CALL_EVENT) - ev0;
  uint64_t sync = gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC) - sync0;
  print_message("steady state, %lu ops: %llu event calls, %llu synchronisations\n", ops, (unsigned long long)ev,
                (unsigned long long)sync);
  assert_true(ev * 1000 <= 4 * ops);
  assert_true(sync * 1000 <= ops);
  gpumem_stats st = tu_stats(ctx, 0);
  tu_assert_stats_sane(&st);
  uint64_t req = 0;
  for (size_t i = 0; i < ls.live; i++) req += ls.n[i];
  assert_true(st.num_live == ls.live && st.requested_bytes == req);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  while (ls.live > 0) {
    ls.live--;
    assert_status(gpumem_free(ctx, ls.p[ls.live], s), GPUMEM_OK);
  }
  st = tu_stats(ctx, 0);
  assert_true(st.num_live == 0 && st.allocated_bytes == 0 && st.requested_bytes == 0);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  tu_ctx_done(ctx);
}

static void test_steady_default_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  run_steady(NULL);
}

static void test_steady_named_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  run_steady(SA);
}

/* Blocks freed on the one stream with its work pending (delayed mode): reused
 * by that stream at once, but with a release threshold of 0 not unmapped
 * until the work completed; then the next free gives them back. */
static void test_single_stream_no_unmap_while_pending(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(0);
  gpumem_sim_set_delayed(1);
  const size_t n = 8 * TU_MiB;
  void *p = NULL, *q = NULL, *r = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  tu_stamp(p, n, 0x51);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* A's kernels may still read p */
  assert_true(tu_sim_used(0) >= n);
  assert_true(tu_stamp_ok_pending(p, n, 0x51)); /* still mapped, untouched */
  /* a smaller block on A: placed in A's own free space at once, no new memory */
  gpumem_stats s0 = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, n / 2, SA, &q), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true(s1.num_backend_allocs == s0.num_backend_allocs);
  assert_true((uintptr_t)q >= (uintptr_t)p && (uintptr_t)q < (uintptr_t)p + n);
  assert_status(gpumem_free(ctx, q, SA), GPUMEM_OK);
  assert_true(tu_sim_used(0) >= n); /* pending: the threshold waits */
  if ((uintptr_t)q != (uintptr_t)p) assert_true(tu_stamp_ok_pending(p, n / 2, 0x51)); /* mapped, untouched */
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA);
  /* the next free on A finds the work complete and gives everything cached back */
  assert_status(gpumem_alloc(ctx, 0, 4096, SA, &r), GPUMEM_OK);
  assert_status(gpumem_free(ctx, r, SA), GPUMEM_OK);
  gpumem_sim_stream_complete(0, SA);
  assert_status(gpumem_alloc(ctx, 0, 4096, SA, &r), GPUMEM_OK);
  assert_status(gpumem_free(ctx, r, SA), GPUMEM_OK);
  assert_true(tu_sim_used(0) <= 2 * TU_MiB);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* A second stream arrives while blocks freed on the first (READY without an
 * event) may still be in use there: it gets none of them; once the device was
 * synchronised (trim) it reuses them without new memory. */
static void test_second_stream_waits_for_first(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(UINT64_MAX);
  gpumem_sim_set_delayed(1);
  const size_t n = 6 * TU_MiB;
  void *a[4], *b[4], *c = NULL;
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, n, SA, &a[i]), GPUMEM_OK);
  for (int i = 0; i < 4; i++) {
    tu_stamp(a[i], n, 0xA0u + (uint32_t)i);
    assert_status(gpumem_free(ctx, a[i], SA), GPUMEM_OK);
  }
  /* a non-exact fit on A moves A's frees into READY, without an event */
  assert_status(gpumem_alloc(ctx, 0, n + 4096, SA, &c), GPUMEM_OK);
  for (int i = 0; i < 4; i++) {
    assert_status(gpumem_alloc(ctx, 0, n, SB, &b[i]), GPUMEM_OK);
    for (int k = 0; k < 4; k++) {
      uintptr_t x = (uintptr_t)a[k], y = (uintptr_t)b[i];
      if (x < y + n && y < x + n) {
        print_error("block freed on A (work pending) handed to B: %p vs %p\n", a[k], b[i]);
        fail();
      }
    }
  }
  for (int k = 0; k < 4; k++)
    if ((uintptr_t)a[k] + n <= (uintptr_t)c || (uintptr_t)c + n + 4096 <= (uintptr_t)a[k])
      assert_true(tu_stamp_ok_pending(a[k], n, 0xA0u + (uint32_t)k));
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, b[i], SB), GPUMEM_OK);
  /* the device synchronised: everything free is usable by every stream */
  assert_status(gpumem_trim(ctx, 0, UINT64_MAX, NULL), GPUMEM_OK);
  gpumem_stats s0 = tu_stats(ctx, 0);
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, n, SB, &b[i]), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true(s1.num_backend_allocs == s0.num_backend_allocs && s1.reserved_bytes == s0.reserved_bytes);
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(ctx, b[i], SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, SA), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

/* The one stream grows past its peak while its frees are pending: idle
 * chunks are moved only after waiting for that stream (an event), so what the
 * backend holds stays at the peak and nothing pending is unmapped. */
static void test_single_stream_growth_waits(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(UINT64_MAX);
  gpumem_sim_set_delayed(1);
  const size_t n = 8 * TU_MiB;
  void *p = NULL, *q = NULL, *big = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, NULL, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  uint64_t peak = tu_stats(ctx, 0).reserved_peak;
  assert_status(gpumem_alloc(ctx, 0, 2 * n + 2 * TU_MiB, NULL, &big), GPUMEM_OK);
  gpumem_stats st = tu_stats(ctx, 0);
  assert_true(st.reserved_bytes <= peak + 2 * TU_MiB);
  assert_true(tu_sim_used(0) == st.reserved_bytes);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_steady_default_stream),
      TU_TEST(test_steady_named_stream),
      TU_TEST(test_single_stream_no_unmap_while_pending),
      TU_TEST(test_second_stream_waits_for_first),
      TU_TEST(test_single_stream_growth_waits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
