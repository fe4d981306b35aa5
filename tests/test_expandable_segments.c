/* Expandable virtual-memory segments (src/vmseg.c) on the sim backend:
 * granule bookkeeping, trimming and the release threshold inside segments
 * that still hold live blocks, the out-of-memory retry, no unmapping of
 * memory with pending stream work, fault injection into vm calls, and the
 * GPUMEM_EXPANDABLE switch. */
#include "testutil.h"

#include <time.h>

/* internal (src/internal.h), linked from the static library */
gpumem_status gpumem__check_invariants(gpumem_context *ctx);

#define GRAN (2 * TU_MiB)
#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)

static gpumem_context *vm_ctx(gpumem_config *cfg) {
  gpumem_config def;
  if (cfg == NULL) {
    tu_config(&def);
    cfg = &def;
  }
  tu_setenv("GPUMEM_EXPANDABLE", "1");
  return tu_ctx_new(cfg);
}

/* What the sim holds is exactly the reserved bytes, a whole number of granules, and the pool is consistent. */
static void assert_held_exact(gpumem_context *ctx) {
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  uint64_t used = tu_sim_used(0);
  if (used != s.reserved_bytes || used % GRAN != 0) {
    print_error("sim used %llu, reserved %llu\n", (unsigned long long)used, (unsigned long long)s.reserved_bytes);
    fail();
  }
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
}

static void test_granule_bookkeeping(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(NULL);
  enum { N = 64 };
  void *p[N] = {0};
  size_t n[N] = {0};
  uint64_t rng = 12345;
  for (int it = 0, iters = (int)tu_scaled(1500, 500); it < iters; it++) { /* valgrind: fewer (testutil.h) */
    int i = (int)tu_rand_range(&rng, 0, N - 1);
    if (p[i] != NULL) {
      assert_true(tu_stamp_ok(p[i], n[i], (uint32_t)i));
      assert_status(gpumem_free(ctx, p[i], (it & 1) ? SA : NULL), GPUMEM_OK);
      p[i] = NULL;
    } else {
      int big = tu_rand_range(&rng, 0, 3) == 0;
      n[i] = (size_t)(big ? tu_rand_range(&rng, 1, 40 * TU_MiB) : tu_rand_range(&rng, 1, 1536 * TU_KiB));
      assert_status(gpumem_alloc(ctx, 0, n[i], (it & 2) ? SA : NULL, &p[i]), GPUMEM_OK);
      assert_true(((uintptr_t)p[i] & 255u) == 0);
      tu_stamp(p[i], n[i], (uint32_t)i);
    }
    assert_held_exact(ctx);
    if (it % 500 == 499) {
      assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
      assert_held_exact(ctx);
    }
  }
  long ov = tu_find_overlap(p, n, N);
  assert_true(ov < 0);
  for (int i = 0; i < N; i++)
    if (p[i] != NULL) {
      assert_true(tu_stamp_ok(p[i], n[i], (uint32_t)i));
      assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
    }
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_true(s.reserved_bytes == 0 && s.num_segments == 0 && tu_sim_used(0) == 0);
  assert_true(s.num_backend_allocs == s.num_backend_frees);
  tu_ctx_done(ctx);
}

/* A live block at the start of a segment and freed blocks behind it: trim gives their granules back. */
static void test_trim_inside_segment(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(NULL);
  void *a = NULL, *b = NULL, *c = NULL;
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, NULL, &c), GPUMEM_OK);
  tu_stamp(a, 3 * TU_MiB, 0xA);
  assert_true(tu_sim_used(0) >= 35 * TU_MiB);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  uint64_t before = tu_sim_used(0);
  assert_true(before >= 35 * TU_MiB); /* freed memory stays cached (mapped) */
  /* keep 5 MiB cached: exactly down to it where granularity allows */
  uint64_t released = 0;
  assert_status(gpumem_trim(ctx, 0, 5 * TU_MiB, &released), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_true(s.cached_bytes <= 5 * TU_MiB && s.cached_bytes + GRAN > 5 * TU_MiB);
  assert_true(released == before - tu_sim_used(0));
  assert_held_exact(ctx);
  released = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  /* only a's granules stay: 3 MiB live -> 2 granules */
  assert_true(tu_sim_used(0) == 4 * TU_MiB);
  assert_true(tu_stamp_ok(a, 3 * TU_MiB, 0xA));
  s = tu_stats(ctx, 0);
  assert_true(s.num_trims >= 2 && s.num_segments >= 1);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_release_threshold_inside_segment(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.release_threshold = 4 * TU_MiB;
  gpumem_context *ctx = vm_ctx(&cfg);
  void *a = NULL, *b[6];
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &a), GPUMEM_OK);
  for (int i = 0; i < 6; i++) assert_status(gpumem_alloc(ctx, 0, 10 * TU_MiB, NULL, &b[i]), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 62 * TU_MiB);
  for (int i = 0; i < 6; i++) {
    assert_status(gpumem_free(ctx, b[i], NULL), GPUMEM_OK);
    gpumem_stats s = tu_stats(ctx, 0);
    assert_true(s.cached_bytes <= cfg.release_threshold);
    assert_held_exact(ctx);
  }
  assert_true(tu_sim_used(0) <= 2 * TU_MiB + cfg.release_threshold);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* Delayed mode: a block freed on A while A's work is pending is neither
 * unmapped (threshold 0) nor handed to B; once A completes, trim gives it back. */
static void test_no_unmap_while_pending(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.release_threshold = 0;
  gpumem_context *ctx = vm_ctx(&cfg);
  gpumem_sim_set_delayed(1);
  const size_t n = 8 * TU_MiB;
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, n, SA, &p), GPUMEM_OK);
  tu_stamp(p, n, 0x77);
  assert_status(gpumem_free(ctx, p, SA), GPUMEM_OK); /* A's kernels may still read p */
  assert_true(tu_sim_used(0) >= n);
  assert_true(tu_stamp_ok_pending(p, n, 0x77)); /* still mapped, untouched */
  assert_status(gpumem_alloc(ctx, 0, n, SB, &q), GPUMEM_OK);
  assert_false((uintptr_t)q < (uintptr_t)p + n && (uintptr_t)p < (uintptr_t)q + n);
  assert_true(tu_stamp_ok_pending(p, n, 0x77));
  assert_true(tu_sim_used(0) >= 2 * n);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, q, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  tu_ctx_done(ctx);
}

/* Out of memory: wait for pending frees, move their chunks, retry. */
static void test_oom_trim_retry(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "256MiB");
  gpumem_context *ctx = vm_ctx(NULL);
  gpumem_sim_set_delayed(1);
  void *x = NULL, *y = NULL;
  assert_status(gpumem_alloc(ctx, 0, 100 * TU_MiB, SA, &x), GPUMEM_OK);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK); /* pending on A */
  gpumem_stats before = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, 200 * TU_MiB, SB, &y), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(after.num_oom_retries == before.num_oom_retries + 1);
  assert_true(after.reserved_bytes == 200 * TU_MiB && tu_sim_used(0) == 200 * TU_MiB);
  assert_held_exact(ctx);
  /* more than the device can ever hold: OUT_OF_MEMORY, nothing changes */
  void *z = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 100 * TU_MiB, SB, &z), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_true(z == (void *)0x1);
  assert_true(tu_sim_used(0) == 200 * TU_MiB);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  gpumem_sim_complete_all();
  tu_ctx_done(ctx);
}

static void test_limit(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.limit_bytes = 64 * TU_MiB;
  gpumem_context *ctx = vm_ctx(&cfg);
  void *a = NULL, *b = NULL, *c = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 40 * TU_MiB, NULL, &a), GPUMEM_OK);
  gpumem_stats s0 = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, 30 * TU_MiB, NULL, &c), GPUMEM_ERR_LIMIT_EXCEEDED);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true(c == (void *)0x1 && s1.reserved_bytes == s0.reserved_bytes &&
              s1.num_backend_allocs == s0.num_backend_allocs);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  /* the freed 40 MiB are moved, not added to: 60 MiB fit under 64 */
  assert_status(gpumem_alloc(ctx, 0, 60 * TU_MiB, NULL, &b), GPUMEM_OK);
  assert_true(tu_stats(ctx, 0).reserved_bytes <= 64 * TU_MiB);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* One scenario under a fault on the nth call of a kind: documented statuses, exact accounting, no leak. */
static int fault_run(gpumem_sim_call kind, uint64_t nth, int err, int *bad) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.expandable = 1;
  cfg.log_level = GPUMEM_LOG_OFF;
  gpumem_context *keeper = NULL, *ctx = NULL;
  assert_status(gpumem_create(&cfg, &keeper), GPUMEM_OK);
  assert_status(gpumem_create(&cfg, &ctx), GPUMEM_OK);
  uint64_t c0 = gpumem_sim_call_count(kind);
  assert_status(gpumem_sim_fail_nth(kind, nth, err, 0), GPUMEM_OK);
  static const size_t sizes[] = {3 * TU_MiB, 700, 9 * TU_MiB, 1536 * TU_KiB, 20 * TU_MiB, 5 * TU_MiB};
  void *p[6] = {0};
  for (int i = 0; i < 6; i++) {
    void *q = (void *)0x1;
    gpumem_status s = gpumem_alloc(ctx, 0, sizes[i], i % 2 ? SA : NULL, &q);
    if (s == GPUMEM_OK) {
      p[i] = q;
      tu_stamp(q, sizes[i], (uint32_t)i);
    } else if (!(s == GPUMEM_ERR_OUT_OF_MEMORY || s == GPUMEM_ERR_BACKEND) || q != (void *)0x1) {
      *bad = 1;
    }
    if (i == 3 && p[2] != NULL) {
      if (gpumem_free(ctx, p[2], SA) != GPUMEM_OK) *bad = 1;
      p[2] = NULL;
    }
    gpumem_stats st = tu_stats(ctx, 0);
    uint64_t used = tu_sim_used(0);
    if (st.allocated_bytes > st.reserved_bytes || used != st.reserved_bytes) *bad = 2;
    if (gpumem__check_invariants(ctx) != GPUMEM_OK) *bad = 3;
  }
  gpumem_status s = gpumem_trim(ctx, 0, 0, NULL);
  if (s != GPUMEM_OK && s != GPUMEM_ERR_BACKEND) *bad = 4;
  if (gpumem__check_invariants(ctx) != GPUMEM_OK) *bad = 5;
  uint64_t calls = gpumem_sim_call_count(kind) - c0;
  gpumem_sim_fail_clear();
  for (int i = 0; i < 6; i++)
    if (p[i] != NULL) {
      if (!tu_stamp_ok(p[i], sizes[i], (uint32_t)i)) *bad = 6;
      if (gpumem_free(ctx, p[i], NULL) != GPUMEM_OK) *bad = 7;
    }
  if (gpumem_destroy(ctx, 0) != GPUMEM_OK) *bad = 8;
  if (tu_sim_used_total() != 0) *bad = 9;
  gpumem_destroy(keeper, GPUMEM_DESTROY_FORCE);
  return (int)calls;
}

static void test_vm_faults(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  static const gpumem_sim_call kinds[] = {GPUMEM_SIM_CALL_MAP, GPUMEM_SIM_CALL_MALLOC, GPUMEM_SIM_CALL_FREE};
  int runs = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    for (int e = 0; e < 2; e++) {
      int err = e ? GPUMEM_SIM_ERR_OUT_OF_MEMORY : GPUMEM_SIM_ERR_INJECTED;
      for (uint64_t nth = 1;; nth++) {
        int bad = 0;
        int calls = fault_run(kinds[k], nth, err, &bad);
        runs++;
        if (bad) {
          print_error("fault on call %llu of kind %d (error %d): check %d failed\n", (unsigned long long)nth,
                      (int)kinds[k], err, bad);
          fail();
        }
        if ((uint64_t)calls < nth) break; /* the fault was past the last call */
      }
    }
  }
  assert_true(runs > 20);
}

static void test_switch(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  /* the default is expandable: a 5 MiB block holds 3 granules, not a 20 MiB segment */
  tu_setenv("GPUMEM_EXPANDABLE", NULL); /* (ctest may run the suite with it set) */
  gpumem_config cfg;
  tu_config(&cfg);
  assert_true(cfg.expandable == 1);
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 5 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_true(tu_stats(ctx, 0).reserved_bytes == 6 * TU_MiB);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  /* GPUMEM_EXPANDABLE=0: plain segments */
  tu_setenv("GPUMEM_EXPANDABLE", "0");
  ctx = tu_ctx_new(&cfg);
  assert_status(gpumem_alloc(ctx, 0, 5 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_true(tu_stats(ctx, 0).reserved_bytes == 20 * TU_MiB);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  /* the config field, without the environment */
  tu_setenv("GPUMEM_EXPANDABLE", "off");
  cfg.expandable = 0;
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  ctx = tu_ctx_new(&cfg);
  assert_status(gpumem_alloc(ctx, 0, 5 * TU_MiB, NULL, &p), GPUMEM_OK);
  assert_true(tu_stats(ctx, 0).reserved_bytes == 20 * TU_MiB);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  /* a bad value is refused */
  tu_setenv("GPUMEM_EXPANDABLE", "maybe");
  tu_config(&cfg);
  gpumem_context *bad = (gpumem_context *)0x1;
  assert_status(gpumem_create(&cfg, &bad), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_true(bad == (gpumem_context *)0x1);
}

/* reset with live blocks in expandable segments gives every chunk and range back */
static void test_reset_gives_everything_back(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(NULL);
  void *a = NULL, *b = NULL;
  assert_status(gpumem_alloc(ctx, 0, 30 * TU_MiB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 1000, SA, &b), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  assert_true(s.reserved_bytes == 0 && s.num_segments == 0 && s.num_live == 0 && tu_sim_used(0) == 0);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &a), GPUMEM_OK);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* Backend vm calls of the sim (counted by the sim: vm_reserve/map/unmap, and
 * vm_create / vm_destroy as allocations and frees), since a snapshot. */
typedef struct vm_calls {
  uint64_t map, create, destroy;
} vm_calls;

static vm_calls vm_calls_now(void) {
  vm_calls c = {gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP), gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC),
                gpumem_sim_call_count(GPUMEM_SIM_CALL_FREE)};
  return c;
}

static uint64_t vm_calls_since(vm_calls a) {
  vm_calls b = vm_calls_now();
  return (b.map - a.map) + (b.create - a.create) + (b.destroy - a.destroy);
}

/* One training-like iteration: a forward pass allocates activations (sizes
 * from 300 KiB to 160 MiB, scaled by `scale` percent: the batch size of a
 * dynamic-shape model), a backward pass frees them newest first while
 * allocating and freeing gradients of the same sizes. Returns the peak of
 * live bytes of the iteration (on top of `base` bytes live before it). */
static uint64_t train_step(gpumem_context *ctx, unsigned scale, uint64_t base) {
  static const size_t act[] = {
      3 * TU_MiB, 160 * TU_MiB, 300 * TU_KiB, 48 * TU_MiB, 5 * TU_MiB + 12345, 96 * TU_MiB, 1536 * TU_KiB,
      24 * TU_MiB,  9 * TU_MiB,   130 * TU_MiB, 2 * TU_MiB + 1,          40 * TU_MiB, 700 * TU_KiB, 64 * TU_MiB,
  };
  enum { NA = sizeof act / sizeof act[0] };
  void *a[NA];
  size_t n[NA];
  uint64_t live = base, peak = base;
  for (int i = 0; i < NA; i++) {
    n[i] = (act[i] / 100) * scale + 256;
    assert_status(gpumem_alloc(ctx, 0, n[i], NULL, &a[i]), GPUMEM_OK);
    live += n[i];
    if (live > peak) peak = live;
  }
  for (int i = NA - 1; i >= 0; i--) {
    void *g = NULL;
    assert_status(gpumem_alloc(ctx, 0, n[i], NULL, &g), GPUMEM_OK);
    if (live + n[i] > peak) peak = live + n[i];
    assert_status(gpumem_free(ctx, g, NULL), GPUMEM_OK);
    assert_status(gpumem_free(ctx, a[i], NULL), GPUMEM_OK);
    live -= n[i];
  }
  return peak;
}

/* Backend vm calls stay few: mapping costs tens of microseconds per call on
 * a GPU (cuMemCreate, cuMemMap + cuMemSetAccess, cuMemUnmap), so a pool
 * that mapped 2 MiB at a time paid two calls per 2 MiB that a block needs
 * and every move of a 2 MiB chunk. Deterministic counts on sim, no timing. */
static void test_vm_call_budget(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(NULL);
  void *params = NULL;
  const size_t np = 500 * TU_MiB + 4096;
  vm_calls c0 = vm_calls_now();
  assert_status(gpumem_alloc(ctx, 0, np, NULL, &params), GPUMEM_OK);
  /* 251 granules in one run: 63 chunks of at most 8 MiB, one create and one map each (and one vm_reserve);
   * 2 MiB at a time took 503 calls */
  uint64_t first = vm_calls_since(c0);
  print_message("500 MiB block: %llu vm calls\n", (unsigned long long)first);
  assert_true(first <= 2 * 63 + 1);

  /* fixed shapes: once the first iteration has mapped what it needs, the others map nothing */
  uint64_t peak_live = train_step(ctx, 100, np);
  vm_calls c1 = vm_calls_now();
  for (int it = 0; it < 5; it++) train_step(ctx, 100, np);
  uint64_t steady = vm_calls_since(c1);
  print_message("fixed shapes: %llu vm calls in 5 iterations after the first\n", (unsigned long long)steady);
  assert_true(steady == 0);

  /* dynamic shapes: batch size 40 % to 130 % of the first (deterministic) */
  uint64_t rng = 777;
  vm_calls c2 = vm_calls_now();
  for (int it = 0; it < 40; it++) {
    uint64_t p = train_step(ctx, (unsigned)tu_rand_range(&rng, 40, 130), np);
    if (p > peak_live) peak_live = p;
  }
  uint64_t dyn = vm_calls_since(c2);
  gpumem_stats s = tu_stats(ctx, 0);
  uint64_t gran_peak = s.reserved_peak / GRAN;
  double ratio = (double)s.reserved_peak / (double)peak_live;
  print_message("dynamic shapes: %llu vm calls in 40 iterations; peak reserved %llu (%llu granules), peak live %llu, "
                "ratio %.4f\n",
                (unsigned long long)dyn, (unsigned long long)s.reserved_peak, (unsigned long long)gran_peak,
                (unsigned long long)peak_live, ratio);
  /* with 2 MiB at a time (until 2026-11-30) this took 244 calls: two per granule the peak grew by,
   * and two per move of an idle 2 MiB chunk; now 118, at the same ratio (1.0047) */
  assert_true(dyn <= gran_peak / 4);
  assert_true(ratio <= 1.03);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, params, NULL), GPUMEM_OK);
  uint64_t total = vm_calls_since(c0);
  print_message("total: %llu vm calls\n", (unsigned long long)total);
  assert_true(total <= gran_peak); /* 2 MiB at a time: 1,396 (two per granule at least); now 416 */
  tu_ctx_done(ctx);
}

/* After the device ran short of memory (the pool's own out of memory, or free memory below
 * trim_free_fraction), new chunks are one granule each: a block freed beside a live one gives all its
 * granules but the live one's back. Before, one chunk of 8 MiB holds them all while the live block
 * stays. Returns what the device holds after that trim. */
static uint64_t held_beside_live(int pressure) {
  tu_setenv("GPUMEM_SIM_DEVICES", "64MiB");
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.trim_free_fraction = pressure == 2 ? 0.99 : 0.0; /* 2: every growth finds the device "low" */
  gpumem_context *ctx = vm_ctx(&cfg);
  void *big = NULL, *more = (void *)0x1, *b = NULL, *c = NULL;
  if (pressure == 1) {
    assert_status(gpumem_alloc(ctx, 0, 60 * TU_MiB, NULL, &big), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &more), GPUMEM_ERR_OUT_OF_MEMORY);
    assert_true(more == (void *)0x1);
    assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  } else if (pressure == 2) {
    assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &big), GPUMEM_OK);
    assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  }
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &b), GPUMEM_OK); /* 4 granules */
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &c), GPUMEM_OK); /* on b's first granule (mapped) */
  assert_true(tu_sim_used(0) == 8 * TU_MiB);
  tu_stamp(c, 2 * TU_MiB, 0xC);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  uint64_t held = tu_sim_used(0);
  assert_true(tu_stamp_ok(c, 2 * TU_MiB, 0xC));
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  return held;
}

static void test_pressure_granule_chunks(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  uint64_t calm = held_beside_live(0), oom = held_beside_live(1), low = held_beside_live(2);
  print_message("held beside a live 2 MiB block after trim: %llu MiB (no pressure), %llu (after out of memory), "
                "%llu (after low free memory)\n", (unsigned long long)(calm / TU_MiB),
                (unsigned long long)(oom / TU_MiB), (unsigned long long)(low / TU_MiB));
  assert_true(calm == 8 * TU_MiB); /* one chunk: the single-process default (fewer backend calls) */
  assert_true(oom == 2 * TU_MiB);
  assert_true(low == 2 * TU_MiB);
}

/* A block of 512 MiB or more gets chunks of 64 MiB inside it, and chunks of at most 8 MiB at its
 * ends, where a granule may be shared with a neighbour: a freed huge block then gives back all but
 * the granules its live neighbours touch, as smaller blocks do, with an eighth of the calls. (Blocks
 * below 512 MiB keep chunks of 8 MiB: test_vm_call_budget.) */
static void test_huge_block_chunks(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(NULL);
  void *a = NULL, *h = NULL, *d = NULL;
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &a), GPUMEM_OK); /* granule 0, half of 1 */
  gpumem_stats s0 = tu_stats(ctx, 0);
  /* [3 MiB, 1 GiB + 3 MiB): granule 1 is shared with a, 2..512 wholly inside, 513 half */
  assert_status(gpumem_alloc(ctx, 0, TU_GiB, NULL, &h), GPUMEM_OK);
  assert_true((uintptr_t)h == (uintptr_t)a + 3 * TU_MiB);
  gpumem_stats s1 = tu_stats(ctx, 0);
  uint64_t creates = s1.num_backend_allocs - s0.num_backend_allocs;
  print_message("1 GiB block: %llu chunks created\n", (unsigned long long)creates);
  /* 15 of 64 MiB (granules 2..481), 8 of 8 MiB (482..513): 8 MiB chunks alone take 128 */
  assert_true(creates == 15 + 8);
  assert_true(s1.reserved_bytes == 4 * TU_MiB + 512 * (uint64_t)GRAN);
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &d), GPUMEM_OK); /* half of 513, and 514 */
  assert_true((uintptr_t)d == (uintptr_t)h + TU_GiB);
  tu_stamp(a, 3 * TU_MiB, 0xA);
  tu_stamp(d, 3 * TU_MiB, 0xD);
  assert_status(gpumem_free(ctx, h, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  /* a's chunk (granules 0..1), the 8 MiB chunk with granule 513 and d's granule 514: no huge chunk
   * reaches a neighbour */
  assert_true(tu_sim_used(0) == 4 * TU_MiB + 8 * TU_MiB + 2 * TU_MiB);
  assert_true(tu_stamp_ok(a, 3 * TU_MiB, 0xA) && tu_stamp_ok(d, 3 * TU_MiB, 0xD));
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, d, NULL), GPUMEM_OK);
  assert_held_exact(ctx);
  tu_ctx_done(ctx);
}

/* A large request that would map memory is placed where a READY block is already mapped, also away
 * from the block's two ends: here the mapped memory a freed block left lies between an unmapped
 * gap (trimmed) and the unmapped rest of the space, and a smaller block goes there with no backend
 * call; the parts before and after it stay free and usable. */
static void test_window_inside_free_block(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *ctx = vm_ctx(NULL);
  void *g = NULL, *x = NULL, *y = NULL, *z = NULL;
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, NULL, &g), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 256 * TU_MiB, NULL, &x), GPUMEM_OK);
  assert_true((uintptr_t)x == (uintptr_t)g + 64 * TU_MiB);
  assert_status(gpumem_free(ctx, g, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK); /* g's granules unmapped */
  assert_status(gpumem_free(ctx, x, NULL), GPUMEM_OK);    /* x's stay mapped, idle */
  gpumem_stats s0 = tu_stats(ctx, 0);
  uint64_t maps0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
  /* at the free block's start it would need g's 32 granules, at its end 96: inside it, none */
  assert_status(gpumem_alloc(ctx, 0, 192 * TU_MiB, NULL, &y), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true((uintptr_t)y == (uintptr_t)x);
  assert_true(s1.num_backend_allocs == s0.num_backend_allocs);
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) == maps0);
  assert_true(s1.reserved_bytes == s0.reserved_bytes);
  tu_stamp(y, 192 * TU_MiB, 0x7);
  assert_held_exact(ctx);
  /* the part before it (g's place) and after it are free blocks of their own */
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, NULL, &z), GPUMEM_OK);
  assert_true((uintptr_t)z == (uintptr_t)g || (uintptr_t)z == (uintptr_t)y + 192 * TU_MiB);
  tu_stamp(z, 64 * TU_MiB, 0x8);
  assert_true(tu_stamp_ok(y, 192 * TU_MiB, 0x7));
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, y, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, z, NULL), GPUMEM_OK);
  assert_held_exact(ctx);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  tu_ctx_done(ctx);
}

/* Several streams, the device behind the host: a request larger than a block its own stream freed
 * (still in use on the device, so it can not move) is placed over that block and the READY space
 * after it, and only that space is mapped; no other stream gets the block while it is pending. */
static gpumem_context *extend_setup(void **a, void **b) {
  gpumem_context *ctx = vm_ctx(NULL);
  gpumem_sim_set_delayed(1);
  void *t = NULL;
  assert_status(gpumem_alloc(ctx, 0, TU_MiB, SB, &t), GPUMEM_OK); /* a second stream */
  assert_status(gpumem_free(ctx, t, SB), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, SA, a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, SA, b), GPUMEM_OK);
  assert_true((uintptr_t)*b == (uintptr_t)*a + 16 * TU_MiB);
  tu_stamp(*a, 16 * TU_MiB, 0x3);
  assert_status(gpumem_free(ctx, *b, SA), GPUMEM_OK); /* SA's work may still use it */
  return ctx;
}

static void test_extend_own_free_block(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  void *a = NULL, *b = NULL, *x = NULL, *y = NULL;
  gpumem_context *ctx = extend_setup(&a, &b);
  gpumem_stats s0 = tu_stats(ctx, 0);
  /* its own stream: 80 MiB over the 32 it freed, 48 MiB of new memory (more than the stream's own
   * frees in flight: no wait for the stream, test_wait_for_own_stream) */
  assert_status(gpumem_alloc(ctx, 0, 80 * TU_MiB, SA, &x), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true((uintptr_t)x == (uintptr_t)b);
  assert_true(s1.reserved_bytes == s0.reserved_bytes + 48 * TU_MiB);
  assert_true(s1.allocated_bytes == s0.allocated_bytes + 80 * TU_MiB);
  tu_stamp(x, 80 * TU_MiB, 0x6);
  assert_held_exact(ctx);
  /* the space after it is still free, and another stream gets it */
  assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, SB, &y), GPUMEM_OK);
  assert_true((uintptr_t)y == (uintptr_t)x + 80 * TU_MiB);
  tu_stamp(y, 32 * TU_MiB, 0x5);
  assert_true(tu_stamp_ok(a, 16 * TU_MiB, 0x3) && tu_stamp_ok(x, 80 * TU_MiB, 0x6));
  assert_held_exact(ctx);
  /* freed, completed: all READY again, nothing held that trim can not give back */
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_held_exact(ctx);
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  gpumem_sim_set_delayed(0);
  tu_ctx_done(ctx);
}

/* The extension's memory can not be made (a failed create): the status, the output untouched, and the
 * freed block is still its stream's and still waits for the device: no other stream gets it. */
static void test_extend_backend_failure(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  void *a = NULL, *b = NULL, *y = NULL;
  gpumem_context *ctx = extend_setup(&a, &b);
  gpumem_stats s0 = tu_stats(ctx, 0);
  void *x = (void *)0x1;
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 80 * TU_MiB, SA, &x), GPUMEM_ERR_BACKEND);
  gpumem_sim_fail_clear();
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true(x == (void *)0x1);
  assert_true(s1.allocated_bytes == s0.allocated_bytes && s1.num_live == s0.num_live);
  assert_true(s1.reserved_bytes == s0.reserved_bytes);
  assert_true(tu_stamp_ok(a, 16 * TU_MiB, 0x3));
  assert_held_exact(ctx);
  assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, SB, &y), GPUMEM_OK);
  assert_false((uintptr_t)y < (uintptr_t)b + 32 * TU_MiB && (uintptr_t)b < (uintptr_t)y + 32 * TU_MiB);
  /* the same request again succeeds */
  assert_status(gpumem_alloc(ctx, 0, 80 * TU_MiB, SA, &x), GPUMEM_OK);
  tu_stamp(x, 80 * TU_MiB, 0x6);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  gpumem_sim_set_delayed(0);
  tu_ctx_done(ctx);
}

/* Several streams, growing past the peak by no more than the requesting stream's own frees still in
 * flight: the pool waits for that stream (one event, not the device) and moves their chunks instead
 * of making new memory. x1 and x2 are separated by live blocks, so neither fits 64 MiB alone. */
static tu_log *g_wait_log; /* the debug lines of the pool of own_wait_setup */

/* The end of the tests with a debug log and delayed completion: every stream done, a trim gives
 * everything back, the context and the log go. */
static void logged_done(gpumem_context *ctx) {
  gpumem_sim_complete_all();
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  gpumem_sim_set_delayed(0);
  tu_ctx_done(ctx);
  tu_log_free(g_wait_log);
  g_wait_log = NULL;
}

static gpumem_context *own_wait_setup(void *v[4]) {
  gpumem_config cfg;
  tu_config(&cfg);
  g_wait_log = tu_log_new();
  tu_log_install(&cfg, g_wait_log, GPUMEM_LOG_DEBUG);
  gpumem_context *ctx = vm_ctx(&cfg);
  gpumem_sim_set_delayed(1);
  void *t = NULL;
  assert_status(gpumem_alloc(ctx, 0, GRAN, SB, &t), GPUMEM_OK); /* a second stream, one whole granule */
  for (int i = 0; i < 4; i++) assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, SA, &v[i]), GPUMEM_OK);
  assert_status(gpumem_free(ctx, t, SB), GPUMEM_OK);
  tu_stamp(v[1], 32 * TU_MiB, 0x1);
  tu_stamp(v[3], 32 * TU_MiB, 0x3);
  assert_status(gpumem_free(ctx, v[0], SA), GPUMEM_OK); /* x1, x2: SA's work may still use them */
  assert_status(gpumem_free(ctx, v[2], SA), GPUMEM_OK);
  return ctx;
}

static void own_wait_done(gpumem_context *ctx, void *v[4], void *x) {
  assert_true(tu_stamp_ok(v[1], 32 * TU_MiB, 0x1) && tu_stamp_ok(v[3], 32 * TU_MiB, 0x3));
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, v[1], SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, v[3], SA), GPUMEM_OK);
  logged_done(ctx);
}

static void test_wait_for_own_stream(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  void *v[4] = {0}, *x = NULL;
  gpumem_context *ctx = own_wait_setup(v);
  gpumem_stats s0 = tu_stats(ctx, 0);
  uint64_t syncs0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC);
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SA, &x), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true(s1.reserved_bytes == s0.reserved_bytes && s1.reserved_peak == s0.reserved_peak);
  assert_true(s1.num_backend_allocs == s0.num_backend_allocs);
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC) == syncs0); /* no stream or device synchronize */
  /* GPUMEM_LOG=debug says so */
  assert_int_equal(tu_log_count_matching(g_wait_log, "waited for stream", NULL), 1);
  assert_int_equal(tu_log_count_matching(g_wait_log, "64.0 MiB it freed were still in use on the device", NULL), 1);
  tu_stamp(x, 64 * TU_MiB, 0x9);
  own_wait_done(ctx, v, x);
}

/* ... and when the wait fails (every event call of the backend fails), the pool grows as before: the
 * allocation succeeds with new memory, and nothing else changes. */
static void test_wait_for_own_stream_fails(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  void *v[4] = {0}, *x = NULL;
  gpumem_context *ctx = own_wait_setup(v);
  gpumem_stats s0 = tu_stats(ctx, 0);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SA, &x), GPUMEM_OK);
  gpumem_sim_fail_clear();
  assert_int_equal(tu_log_count_matching(g_wait_log, "waited for stream", NULL), 0);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_true(s1.reserved_bytes == s0.reserved_bytes + 64 * TU_MiB);
  assert_true(s1.allocated_bytes == s0.allocated_bytes + 64 * TU_MiB && s1.num_live == s0.num_live + 1);
  tu_stamp(x, 64 * TU_MiB, 0x9);
  own_wait_done(ctx, v, x);
}

/* stream_deps: SA frees 64 MiB whose work the device has not run; SB, growing past the peak, takes
 * it (the same addresses, no new memory), its later work ordered after SA's on the device, so that
 * SB's completion completes SA's event. Without stream_deps (the default), or when the backend's
 * stream_wait_event fails, SB gets new memory and SA's block waits for its event. */
static gpumem_event g_before_free; /* recorded on SA just before its free of x */

/* An expandable sim context with stream_deps as given (and backend `be`, NULL: the sim), debug lines
 * in g_wait_log, the device running only when told. */
static gpumem_context *deps_ctx(int deps, gpumem_backend *be) {
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.stream_deps = deps;
  cfg.custom_backend = be;
  g_wait_log = tu_log_new();
  tu_log_install(&cfg, g_wait_log, GPUMEM_LOG_DEBUG);
  gpumem_context *ctx = vm_ctx(&cfg);
  gpumem_sim_set_delayed(1);
  return ctx;
}

static gpumem_context *deps_setup(int deps, void **keep, void **x) {
  gpumem_context *ctx = deps_ctx(deps, NULL);
  void *t = NULL;
  assert_status(gpumem_alloc(ctx, 0, GRAN, SB, &t), GPUMEM_OK); /* a second stream */
  assert_status(gpumem_free(ctx, t, SB), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SA, x), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, SA, keep), GPUMEM_OK);
  tu_stamp(*keep, 32 * TU_MiB, 0x4);
  gpumem_backend be = *gpumem_builtin_backend("sim");
  assert_int_equal(be.event_create(&be, 0, &g_before_free), 0);
  assert_int_equal(be.event_record(&be, 0, g_before_free, SA), 0);
  assert_status(gpumem_free(ctx, *x, SA), GPUMEM_OK); /* 64 MiB: asks its event at once */
  return ctx;
}

static void deps_done(gpumem_context *ctx, void *keep, void *y) {
  gpumem_backend be = *gpumem_builtin_backend("sim");
  assert_int_equal(be.event_destroy(&be, 0, g_before_free), 0);
  assert_true(tu_stamp_ok(keep, 32 * TU_MiB, 0x4));
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, keep, SA), GPUMEM_OK);
  logged_done(ctx);
}

static void test_stream_deps_take_pending(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  void *keep = NULL, *x = NULL, *y = NULL;
  gpumem_context *ctx = deps_setup(1, &keep, &x);
  gpumem_stats s0 = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SB, &y), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_ptr_equal(y, x);
  assert_true(s1.reserved_bytes == s0.reserved_bytes && s1.num_backend_allocs == s0.num_backend_allocs);
  assert_int_equal(tu_log_count_matching(g_wait_log, "took 64.0 MiB other streams freed", NULL), 1);
  /* SB's work after the take waits for SA's: SB's completion completes SA's */
  gpumem_event ev = NULL;
  gpumem_backend be = *gpumem_builtin_backend("sim");
  assert_int_equal(be.event_create(&be, 0, &ev), 0);
  assert_int_equal(be.event_record(&be, 0, ev, SA), 0); /* after SA's free */
  int done = 0;
  assert_int_equal(be.event_query(&be, 0, g_before_free, &done), 0);
  assert_false(done);
  gpumem_sim_stream_complete(0, SB);
  assert_int_equal(be.event_query(&be, 0, g_before_free, &done), 0);
  assert_true(done); /* SA's work before the free ran before SB's */
  assert_int_equal(be.event_query(&be, 0, ev, &done), 0);
  assert_false(done); /* SA's work after the free is not waited for */
  tu_stamp(y, 64 * TU_MiB, 0x9);
  assert_int_equal(be.event_destroy(&be, 0, ev), 0);
  deps_done(ctx, keep, y);
}

static void test_stream_deps_off_or_failing(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  for (int k = 0; k < 2; k++) {
    void *keep = NULL, *x = NULL, *y = NULL;
    gpumem_context *ctx = deps_setup(k, &keep, &x); /* k 0: off; k 1: on, the wait fails */
    gpumem_stats s0 = tu_stats(ctx, 0);
    if (k == 1) assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SB, &y), GPUMEM_OK);
    gpumem_sim_fail_clear();
    gpumem_stats s1 = tu_stats(ctx, 0);
    assert_true((uintptr_t)y >= (uintptr_t)x + 64 * TU_MiB || (uintptr_t)y + 64 * TU_MiB <= (uintptr_t)x);
    assert_true(s1.reserved_bytes == s0.reserved_bytes + 64 * TU_MiB);
    assert_true(s1.allocated_bytes == s0.allocated_bytes + 64 * TU_MiB && s1.num_live == s0.num_live + 1);
    assert_int_equal(tu_log_count_matching(g_wait_log, "other streams freed", NULL), 0);
    tu_stamp(y, 64 * TU_MiB, 0x9);
    deps_done(ctx, keep, y);
  }
}

#define DU (64 * TU_MiB)
#define SC ((gpumem_stream)(uintptr_t)0xC0)
/* stream_deps when idle chunks could make room: SB asks 128 MiB past every free mapped block while
 * 128 MiB of idle chunks lie elsewhere (z1 SB's and z2 SC's, 64 MiB each, completed, around a live w). If
 * SA's pending frees hold a block that fits (x, 128 MiB), SB takes that block where it lies (not the
 * 32 MiB freed with it): no chunk moves, no new memory. If they hold only smaller ones (x1, x2: 64 MiB
 * each), or the backend's stream_wait_event fails, SB leaves them to SA and moves the idle chunks (one
 * unmap and one map each, no new memory). */
static int g_waits_failed;
static int failing_stream_wait(gpumem_backend *be, int device, gpumem_stream stream, gpumem_event ev) {
  (void)be, (void)device, (void)stream, (void)ev;
  g_waits_failed++;
  return GPUMEM_SIM_ERR_INJECTED;
}

static gpumem_backend g_nowait_be; /* the sim whose stream_wait_event fails */

static gpumem_context *deps_idle_setup(int whole, int wait_fails, void *live[3], void **x) {
  g_nowait_be = *gpumem_builtin_backend("sim");
  g_nowait_be.stream_wait_event = failing_stream_wait;
  gpumem_context *ctx = deps_ctx(1, wait_fails ? &g_nowait_be : NULL);
  void *z1 = NULL, *z2 = NULL, *x2 = NULL, *xa = NULL;
  assert_status(gpumem_alloc(ctx, 0, DU, SB, &z1), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, DU, SB, &live[0]), GPUMEM_OK); /* w */
  assert_status(gpumem_alloc(ctx, 0, DU, SC, &z2), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, DU, SB, &live[1]), GPUMEM_OK);
  if (whole) {
    assert_status(gpumem_alloc(ctx, 0, 2 * DU, SA, x), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, DU, SA, &live[2]), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, DU / 2, SA, &xa), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, DU / 2, SA, &x2), GPUMEM_OK); /* freed in x's batch, left to SA */
  } else {
    assert_status(gpumem_alloc(ctx, 0, DU, SA, x), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, DU, SA, &live[2]), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, DU, SA, &x2), GPUMEM_OK);
  }
  for (int i = 0; i < 3; i++) tu_stamp(live[i], DU, (unsigned)(0x10 + i));
  assert_status(gpumem_free(ctx, z1, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, z2, SC), GPUMEM_OK); /* (a stream's first large free asks its event) */
  gpumem_sim_stream_complete(0, SB);
  gpumem_sim_stream_complete(0, SC); /* z1, z2 become READY at the next poll: their chunks idle */
  if (whole) { /* SA's batches: {xa}, then {x2, x} (a third ask joins the newer of a stream's two) */
    assert_status(gpumem_free(ctx, xa, SA), GPUMEM_OK);
    assert_status(gpumem_free(ctx, x2, SA), GPUMEM_OK);
  }
  assert_status(gpumem_free(ctx, *x, SA), GPUMEM_OK); /* SA's: the device has not run its work */
  if (!whole) assert_status(gpumem_free(ctx, x2, SA), GPUMEM_OK);
  return ctx;
}

static void deps_idle_done(gpumem_context *ctx, void *live[3], void *y) {
  for (int i = 0; i < 3; i++) assert_true(tu_stamp_ok(live[i], DU, (unsigned)(0x10 + i)));
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, y, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, live[0], SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, live[1], SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, live[2], SA), GPUMEM_OK);
  logged_done(ctx);
}

static void test_stream_deps_take_fitting_before_moving(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  for (int k = 0; k < 3; k++) {
    const int whole = k < 2, takes = k == 0; /* k 1: a fitting block, but the backend's wait fails */
    void *live[3] = {0}, *x = NULL, *y = NULL;
    g_waits_failed = 0;
    gpumem_context *ctx = deps_idle_setup(whole, k == 1, live, &x);
    gpumem_stats s0 = tu_stats(ctx, 0);
    uint64_t maps0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
    assert_status(gpumem_alloc(ctx, 0, 2 * DU, SB, &y), GPUMEM_OK);
    gpumem_stats s1 = tu_stats(ctx, 0);
    assert_true(s1.reserved_bytes == s0.reserved_bytes && s1.num_backend_allocs == s0.num_backend_allocs);
    assert_true(s1.allocated_bytes == s0.allocated_bytes + 2 * DU && s1.num_live == s0.num_live + 1);
    assert_int_equal(g_waits_failed, k == 1); /* asked once, refused: nothing taken */
    if (takes) {
      assert_ptr_equal(y, x);
      assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) == maps0); /* nothing moved */
      assert_int_equal(
          tu_log_count_matching(g_wait_log, "took 128.0 MiB other streams freed", "instead of moving idle chunks", NULL),
          1);
    } else {
      /* SA's blocks stay SA's: the idle chunks moved (an unmap and a map each) */
      assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) > maps0);
      assert_int_equal(tu_log_count_matching(g_wait_log, "other streams freed", NULL), 0);
      assert_true((uintptr_t)y >= (uintptr_t)x + 2 * DU || (uintptr_t)y + 2 * DU <= (uintptr_t)x);
    }
    tu_stamp(y, 2 * DU, 0x9);
    deps_idle_done(ctx, live, y);
  }
}

/* A wait that stalls the host: the sim's event wait, 40 ms late (a GPU far behind the host). */
static gpumem_backend_event_synchronize_fn g_sim_evsync;
static int slow_event_synchronize(gpumem_backend *be, int device, gpumem_event ev) {
  struct timespec ts = {0, 40 * 1000 * 1000};
  nanosleep(&ts, NULL);
  return g_sim_evsync(be, device, ev);
}

/* The growth waits stall the host at most a 32nd of each second: after one wait of 40 ms, a second
 * growth in the same second does not wait; the stream's own pending frees lend their chunks to it
 * (no host stall, no new memory), and the pool's figures stay exact. */
static void test_wait_budget(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_backend be = *gpumem_builtin_backend("sim");
  g_sim_evsync = be.event_synchronize;
  be.event_synchronize = slow_event_synchronize;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.custom_backend = &be;
  g_wait_log = tu_log_new();
  tu_log_install(&cfg, g_wait_log, GPUMEM_LOG_DEBUG);
  gpumem_context *ctx = vm_ctx(&cfg);
  gpumem_sim_set_delayed(1);
  void *t = NULL, *v[8] = {0}, *x = NULL, *y = NULL;
  assert_status(gpumem_alloc(ctx, 0, GRAN, SB, &t), GPUMEM_OK);
  for (int i = 0; i < 8; i++) assert_status(gpumem_alloc(ctx, 0, 32 * TU_MiB, SA, &v[i]), GPUMEM_OK);
  assert_status(gpumem_free(ctx, t, SB), GPUMEM_OK);
  assert_status(gpumem_free(ctx, v[0], SA), GPUMEM_OK); /* two holes of 32 MiB, SA's work may use them */
  assert_status(gpumem_free(ctx, v[2], SA), GPUMEM_OK);
  /* the first growth waits (40 ms, more than a 32nd of a second) and reuses the holes */
  gpumem_stats s0 = tu_stats(ctx, 0);
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SA, &x), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_int_equal(tu_log_count_matching(g_wait_log, "waited for stream", NULL), 1);
  assert_true(s1.reserved_bytes == s0.reserved_bytes);
  assert_int_equal(tu_log_count_matching(g_wait_log, "stalled the host", NULL), 1);
  /* two more holes: this growth, within the same second, does not wait */
  assert_status(gpumem_free(ctx, v[4], SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, v[6], SA), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, SA, &y), GPUMEM_OK);
  gpumem_stats s2 = tu_stats(ctx, 0);
  assert_int_equal(tu_log_count_matching(g_wait_log, "waited for stream", NULL), 1);
  assert_true(s2.reserved_bytes == s1.reserved_bytes); /* their chunks lent, not waited for */
  assert_int_equal(tu_log_count_matching(g_wait_log, "own pending frees mapped again", NULL), 2);
  assert_true(s2.allocated_bytes == s1.allocated_bytes && s2.num_live == s1.num_live - 1); /* y for v4 and v6 */
  tu_stamp(x, 64 * TU_MiB, 0x9);
  tu_stamp(y, 64 * TU_MiB, 0xa);
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, x, SA), GPUMEM_OK);
  assert_status(gpumem_free(ctx, y, SA), GPUMEM_OK);
  for (int i = 1; i < 8; i += 2) assert_status(gpumem_free(ctx, v[i], SA), GPUMEM_OK);
  logged_done(ctx);
}

/* peak_headroom: new memory may go that fraction past the live peak before idle chunks are moved.
 * A (16 MiB, two 8 MiB chunks) and X (2 MiB) live, A freed: C (18 MiB) does not fit in A's place and
 * goes after X, on 9 unmapped granules. Held near the live peak (18 MiB), A's idle chunks move under
 * C (reserved 20 MiB); with headroom 1 the pool may hold up to 36 MiB and creates C's memory instead,
 * moving nothing; limit_bytes still binds, and after the device ran out of memory the headroom is set
 * aside (moves again) while that pressure lasts. Returns the reserved bytes after C. */
static uint64_t headroom_case(double headroom, uint64_t limit, int pressure, uint64_t *moves) {
  tu_setenv("GPUMEM_SIM_DEVICES", "64MiB");
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.peak_headroom = headroom;
  cfg.limit_bytes = limit;
  cfg.trim_free_fraction = 0.0;
  gpumem_context *ctx = vm_ctx(&cfg);
  if (pressure) {
    void *big = NULL, *more = (void *)0x1;
    assert_status(gpumem_alloc(ctx, 0, 60 * TU_MiB, NULL, &big), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, 8 * TU_MiB, NULL, &more), GPUMEM_ERR_OUT_OF_MEMORY);
    assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
    assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
    assert_status(gpumem_reset_peak_stats(ctx, 0), GPUMEM_OK);
  }
  void *a = NULL, *x = NULL, *c = NULL;
  assert_status(gpumem_alloc(ctx, 0, 16 * TU_MiB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, NULL, &x), GPUMEM_OK);
  tu_stamp(x, 2 * TU_MiB, 0x5);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  uint64_t m0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP), c0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC);
  assert_status(gpumem_alloc(ctx, 0, 18 * TU_MiB, NULL, &c), GPUMEM_OK);
  assert_true((uintptr_t)c >= (uintptr_t)x + 2 * TU_MiB);
  /* a new chunk is a create and a map, a moved one an unmap and a map */
  uint64_t maps = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) - m0;
  uint64_t creates = gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC) - c0;
  assert_true(maps >= creates && (maps - creates) % 2 == 0);
  *moves = (maps - creates) / 2;
  tu_stamp(c, 18 * TU_MiB, 0xC);
  assert_true(tu_stamp_ok(x, 2 * TU_MiB, 0x5) && tu_stamp_ok(c, 18 * TU_MiB, 0xC));
  uint64_t held = tu_stats(ctx, 0).reserved_bytes;
  assert_held_exact(ctx);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, x, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_env_restore();
  return held;
}

static void test_peak_headroom(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  uint64_t u0 = 0, u1 = 0, ul = 0, up = 0;
  uint64_t lean = headroom_case(0.0, 0, 0, &u0), roomy = headroom_case(1.0, 0, 0, &u1);
  uint64_t limited = headroom_case(1.0, 24 * TU_MiB, 0, &ul), pressed = headroom_case(1.0, 0, 1, &up);
  print_message("reserved after C: %llu MiB (no headroom, %llu moves), %llu (headroom 1, %llu), %llu (headroom 1, "
                "limit 24 MiB, %llu), %llu (headroom 1 after out of memory, %llu)\n",
                (unsigned long long)(lean / TU_MiB), (unsigned long long)u0, (unsigned long long)(roomy / TU_MiB),
                (unsigned long long)u1, (unsigned long long)(limited / TU_MiB), (unsigned long long)ul,
                (unsigned long long)(pressed / TU_MiB), (unsigned long long)up);
  assert_true(lean == 20 * TU_MiB && u0 == 2);       /* A's two chunks moved under C, one granule new */
  assert_true(roomy == 36 * TU_MiB && u1 == 0);      /* all of C created, nothing moved */
  assert_true(limited <= 24 * TU_MiB && ul > 0);     /* the limit binds before the headroom */
  assert_true(pressed == 20 * TU_MiB && up > 0);     /* one-granule chunks of A moved: as without headroom */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_granule_bookkeeping), TU_TEST(test_trim_inside_segment),
      TU_TEST(test_release_threshold_inside_segment), TU_TEST(test_no_unmap_while_pending),
      TU_TEST(test_oom_trim_retry), TU_TEST(test_limit), TU_TEST(test_vm_faults), TU_TEST(test_switch),
      TU_TEST(test_reset_gives_everything_back), TU_TEST(test_vm_call_budget), TU_TEST(test_pressure_granule_chunks),
      TU_TEST(test_huge_block_chunks), TU_TEST(test_window_inside_free_block),
      TU_TEST(test_extend_own_free_block), TU_TEST(test_extend_backend_failure), TU_TEST(test_wait_for_own_stream),
      TU_TEST(test_wait_for_own_stream_fails),
      TU_TEST(test_wait_budget),
      TU_TEST(test_stream_deps_take_pending),
      TU_TEST(test_stream_deps_off_or_failing),
      TU_TEST(test_stream_deps_take_fitting_before_moving),
      TU_TEST(test_peak_headroom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
