/* The releaser thread (src/releaser.c, src/vmseg.c "The releaser"): an expandable pool unmaps (and,
 * giving them back, destroys) the chunks it moves or gives back to make room on a thread of its own,
 * while the allocating thread maps the new ones.
 *
 * The sim backend is wrapped in a "gated" backend: its unmaps on the releaser thread can be held
 * (a gate) or made to fail, and every map is checked against the unmaps under way, so that nothing is
 * ever mapped over a range before its unmap has returned. Checked: a run of dynamic shapes holds and
 * maps exactly what it does without the thread; a block placed where an unmap is under way waits for
 * it; a queue overflow falls back to the allocating thread; failures (an unmap that fails once, one
 * that keeps failing, a destroy that fails) lose nothing, and the statistics, the sim's memory and the
 * pool's invariants agree at every step. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem/sim.h"
#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);
extern int gpumem__vm_releaser_mode;

#define MIB ((size_t)1 << 20)
#define ERR_GATED 999 /* the error the gated backend answers with (the sim maps unknown codes to BACKEND) */

/* ---- the gated backend ---- */

static gpumem_backend g_sim;   /* the sim's table */
static gpumem_backend g_gated; /* it, with vm_map, vm_unmap and vm_destroy wrapped */
static pthread_t g_main;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static struct {
  int gate_closed;      /* unmaps on the releaser wait while set */
  int waiting;          /* releaser unmaps waiting at the gate */
  int fail_rel_unmaps;  /* the next N unmaps on the releaser fail */
  int fail_unmaps;      /* the next N unmaps on any thread fail */
  int fail_rel_destroys;/* the next N destroys on the releaser fail */
  char *busy_va[8];     /* unmaps under way */
  size_t busy_size[8];
  int violations;       /* maps over a range whose unmap was under way */
  unsigned long rel_unmaps, main_unmaps, rel_destroys;
} g;

static int on_releaser(void) { return !pthread_equal(pthread_self(), g_main); }

static int gated_unmap(gpumem_backend *be, int device, void *va, size_t size) {
  int slot = -1, fail = 0;
  pthread_mutex_lock(&g_mu);
  if (on_releaser()) {
    g.waiting++;
    pthread_cond_broadcast(&g_cv);
    while (g.gate_closed) pthread_cond_wait(&g_cv, &g_mu);
    g.waiting--;
    g.rel_unmaps++;
    if (g.fail_rel_unmaps > 0) {
      g.fail_rel_unmaps--;
      fail = 1;
    }
  } else {
    g.main_unmaps++;
  }
  if (g.fail_unmaps > 0) {
    g.fail_unmaps--;
    fail = 1;
  }
  for (int i = 0; i < 8 && slot < 0; i++)
    if (g.busy_va[i] == NULL) slot = i;
  if (slot >= 0) {
    g.busy_va[slot] = va;
    g.busy_size[slot] = size;
  }
  pthread_mutex_unlock(&g_mu);
  struct timespec ts = {0, 200000}; /* an unmap takes a while: maps on the other thread may come meanwhile */
  if (on_releaser()) nanosleep(&ts, NULL);
  int rc = fail ? ERR_GATED : g_sim.vm_unmap(be, device, va, size);
  pthread_mutex_lock(&g_mu);
  if (slot >= 0) g.busy_va[slot] = NULL;
  pthread_mutex_unlock(&g_mu);
  return rc;
}

static int gated_map(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < 8; i++) {
    char *b = g.busy_va[i];
    if (b != NULL && (char *)va < b + g.busy_size[i] && b < (char *)va + size) g.violations++;
  }
  pthread_mutex_unlock(&g_mu);
  return g_sim.vm_map(be, device, va, size, h);
}

static int gated_destroy(gpumem_backend *be, int device, gpumem_phys_handle h) {
  int fail = 0;
  pthread_mutex_lock(&g_mu);
  if (on_releaser()) {
    g.rel_destroys++;
    if (g.fail_rel_destroys > 0) {
      g.fail_rel_destroys--;
      fail = 1;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return fail ? ERR_GATED : g_sim.vm_destroy(be, device, h);
}

static void gate(int closed) {
  pthread_mutex_lock(&g_mu);
  g.gate_closed = closed;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

/* Wait until n releaser unmaps wait at the gate. */
static void wait_at_gate(int n) {
  pthread_mutex_lock(&g_mu);
  while (g.waiting < n) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}

/* Opens the gate after arg (an intptr_t) milliseconds. */
static void *open_later(void *arg) {
  long ms = (long)(intptr_t)arg;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
  nanosleep(&ts, NULL);
  gate(0);
  return NULL;
}

/* ---- contexts ---- */

/* (the mode is read when the device's pool is made, at the first allocation: teardown sets it back) */
static gpumem_context *ctx_new(int releaser, int gated) {
  gpumem__vm_releaser_mode = releaser ? 1 : -1;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  if (gated) cfg.custom_backend = &g_gated;
  cfg.expandable = 1;
  cfg.trim_free_fraction = 0;
  cfg.flags |= GPUMEM_CONFIG_NO_ENV;
  if (getenv("DBG")) cfg.log_level = GPUMEM_LOG_DEBUG;
  return tu_ctx_new(&cfg);
}

static uint64_t reserved(gpumem_context *ctx) { return tu_stats(ctx, 0).reserved_bytes; }

/* The statistics (which wait for the releaser) are what the sim holds; the invariants hold. */
static void check_held(gpumem_context *ctx) {
  gpumem_stats st = tu_stats(ctx, 0);
  assert_int_equal(st.reserved_bytes, tu_sim_used(0));
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  assert_int_equal(g.violations, 0);
}

static int setup(void **state) {
  (void)state;
  g_main = pthread_self();
  memset(&g, 0, sizeof g);
  const gpumem_backend *sim = gpumem_builtin_backend("sim");
  assert_non_null(sim);
  g_sim = *sim;
  g_gated = *sim;
  g_gated.name = "gated";
  g_gated.vm_unmap = gated_unmap;
  g_gated.vm_map = gated_map;
  g_gated.vm_destroy = gated_destroy;
  return 0;
}

static int teardown(void **state) {
  gpumem__vm_releaser_mode = 0;
  gate(0);
  gpumem_sim_fail_clear();
  return tu_teardown(state);
}

/* ---- tests ---- */

/* Dynamic shapes: blocks of changing sizes, each step's live set freed, so that chunks move and are
 * given back. Returns the peak reserved; *maps, the sim's map-kind calls. Data survives each step. */
static uint64_t dynamic_run(gpumem_context *ctx, uint64_t *maps) {
  uint64_t m0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
  uint32_t x = 12345;
  for (int step = 0; step < 40; step++) {
    void *p[6];
    size_t n[6];
    for (int i = 0; i < 6; i++) {
      x = x * 1103515245u + 12345u;
      n[i] = ((size_t)(x >> 16) % 96 + 1) * MIB + (i == 2 ? 600 * MIB * (step % 3) / 2 : 0);
      assert_status(gpumem_alloc(ctx, 0, n[i], NULL, &p[i]), GPUMEM_OK);
      tu_stamp(p[i], n[i] < 4096 ? n[i] : 4096, (uint32_t)(step * 8 + i));
    }
    for (int i = 0; i < 6; i++) assert_true(tu_stamp_ok(p[i], n[i] < 4096 ? n[i] : 4096, (uint32_t)(step * 8 + i)));
    for (int i = 0; i < 6; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
    if (step % 8 == 0) check_held(ctx);
  }
  check_held(ctx);
  *maps = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) - m0;
  return tu_stats(ctx, 0).reserved_peak;
}

/* The thread changes when calls are made, not what the pool holds or how often it maps. */
static void test_releaser_same_as_inline(void **state) {
  (void)state;
  uint64_t maps_a = 0, maps_b = 0;
  gpumem_context *a = ctx_new(0, 1);
  uint64_t peak_a = dynamic_run(a, &maps_a);
  assert_int_equal(g.rel_unmaps, 0);
  tu_ctx_done(a);
  gpumem_context *b = ctx_new(1, 1);
  uint64_t peak_b = dynamic_run(b, &maps_b);
  assert_true(g.rel_unmaps > 0); /* it did run there */
  assert_true(g.rel_destroys > 0);
  assert_int_equal(peak_a, peak_b);
  assert_int_equal(maps_a, maps_b);
  tu_ctx_done(b);
  tu_assert_sim_empty();
}

/* A block placed where the releaser is still unmapping waits for it, then maps there. */
static void test_releaser_map_waits_for_unmap(void **state) {
  (void)state;
  gpumem_context *ctx = ctx_new(1, 1);
  void *a, *b, *c, *d;
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK); /* a's chunk is idle: the next growth moves it */
  check_held(ctx);
  gate(1);
  assert_status(gpumem_alloc(ctx, 0, 16 * MIB, NULL, &c), GPUMEM_OK);
  wait_at_gate(1); /* a's old place is being unmapped */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, open_later, (void *)(intptr_t)50), 0);
  /* a's old place is the best for 8 MiB: this waits for the gate, then maps there */
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &d), GPUMEM_OK);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_ptr_equal(d, a);
  tu_stamp(d, 8 * MIB, 7);
  tu_stamp(c, 16 * MIB, 9);
  assert_true(tu_stamp_ok(d, 8 * MIB, 7));
  assert_true(tu_stamp_ok(c, 16 * MIB, 9));
  check_held(ctx);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, d, NULL), GPUMEM_OK);
  check_held(ctx);
  tu_ctx_done(ctx);
  tu_assert_sim_empty();
}

/* More give-backs at once than the queue holds: the rest are made on the allocating thread. A trim
 * while the releaser's unmaps wait at the gate waits for them. */
static void test_releaser_queue_full(void **state) {
  (void)state;
  gpumem_context *ctx = ctx_new(1, 1);
  enum { N = 600 };
  static void *p[N];
  for (int i = 0; i < N; i++) assert_status(gpumem_alloc(ctx, 0, 2 * MIB, NULL, &p[i]), GPUMEM_OK);
  for (int i = 1; i < N; i += 2) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK); /* N/2 idle chunks */
  check_held(ctx);
  gate(1);
  void *big;
  unsigned long main0 = g.main_unmaps;
  /* The next block fits in no hole: it maps new memory past them, and the idle chunks are given back
   * to make room for it, far more than the queue holds while the gate keeps the releaser at the first. */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, open_later, (void *)(intptr_t)300), 0);
  assert_status(gpumem_alloc(ctx, 0, 700 * MIB, NULL, &big), GPUMEM_OK);
  assert_true(g.main_unmaps > main0); /* the queue was full: some were made here */
  assert_int_equal(pthread_join(t, NULL), 0);
  tu_stamp(big, 700 * MIB, 11);
  assert_true(tu_stamp_ok(big, 700 * MIB, 11));
  check_held(ctx);
  assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  for (int i = 0; i < N; i += 2) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  /* a trim: a give-back made room for before is under way no more, and everything goes */
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  assert_int_equal(reserved(ctx), 0);
  assert_int_equal(tu_sim_used(0), 0);
  check_held(ctx);
  tu_ctx_done(ctx);
  tu_assert_sim_empty();
}

/* An unmap that fails on the releaser is made again by the pool: nothing is lost. */
static void test_releaser_unmap_fails_once(void **state) {
  (void)state;
  gpumem_context *ctx = ctx_new(1, 1);
  void *a, *b, *c, *d;
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  g.fail_rel_unmaps = 1;
  unsigned long main0 = g.main_unmaps;
  assert_status(gpumem_alloc(ctx, 0, 16 * MIB, NULL, &c), GPUMEM_OK);
  check_held(ctx);
  assert_int_equal(g.main_unmaps, main0 + 1); /* the retry */
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &d), GPUMEM_OK);
  assert_ptr_equal(d, a);
  tu_stamp(d, 8 * MIB, 3);
  assert_true(tu_stamp_ok(d, 8 * MIB, 3));
  check_held(ctx);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, d, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_assert_sim_empty();
}

/* An unmap that keeps failing: the range is never mapped again (an allocation placed there fails with
 * BACKEND, nothing else is touched); a trim retries it, and then the range is used again. */
static void test_releaser_unmap_stuck(void **state) {
  (void)state;
  gpumem_context *ctx = ctx_new(1, 1);
  tu_log *log = tu_log_new();
  void *a, *b, *c, *d;
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &b), GPUMEM_OK);
  tu_stamp(b, 8 * MIB, 5);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  g.fail_unmaps = 3; /* the releaser's unmap, the pool's retry, and its retry before a map there */
  assert_status(gpumem_alloc(ctx, 0, 16 * MIB, NULL, &c), GPUMEM_OK);
  tu_stamp(c, 16 * MIB, 6);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  uint64_t held = reserved(ctx);
  /* a's old place still maps a's chunk (moved under c): no new block goes there */
  gpumem_status st = gpumem_alloc(ctx, 0, 8 * MIB, NULL, &d);
  if (st == GPUMEM_OK) {
    assert_false((char *)d < (char *)a + 8 * MIB && (char *)a < (char *)d + 8 * MIB);
    assert_status(gpumem_free(ctx, d, NULL), GPUMEM_OK);
  } else {
    assert_status(st, GPUMEM_ERR_BACKEND);
  }
  assert_true(tu_stamp_ok(b, 8 * MIB, 5));
  assert_true(tu_stamp_ok(c, 16 * MIB, 6));
  assert_true(reserved(ctx) >= held - 8 * MIB);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  /* a trim makes the unmap again: the range is free */
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  check_held(ctx);
  assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &d), GPUMEM_OK);
  tu_stamp(d, 8 * MIB, 8);
  assert_true(tu_stamp_ok(d, 8 * MIB, 8));
  assert_true(tu_stamp_ok(b, 8 * MIB, 5));
  assert_true(tu_stamp_ok(c, 16 * MIB, 6));
  check_held(ctx);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, d, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_log_free(log);
  tu_assert_sim_empty();
}

/* A destroy that fails on the releaser leaves a spare chunk, still counted; a trim gives it back. */
static void test_releaser_destroy_fails(void **state) {
  (void)state;
  gpumem_context *ctx = ctx_new(1, 1);
  enum { N = 8 };
  void *p[N], *big;
  for (int i = 0; i < N; i++) assert_status(gpumem_alloc(ctx, 0, 2 * MIB, NULL, &p[i]), GPUMEM_OK);
  for (int i = 0; i < N; i++) /* one-granule chunks, idle; the live one keeps the next block out of their range */
    if (i != N / 2) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  g.fail_rel_destroys = 1;
  assert_status(gpumem_alloc(ctx, 0, 64 * MIB, NULL, &big), GPUMEM_OK);
  check_held(ctx); /* the spare chunk is counted: the sim still holds it */
  assert_true(g.rel_destroys > 0);
  assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p[N / 2], NULL), GPUMEM_OK);
  uint64_t rel = 0;
  assert_status(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  assert_int_equal(reserved(ctx), 0);
  check_held(ctx);
  tu_ctx_done(ctx);
  tu_assert_sim_empty();
}

/* A reset and a destroy with the releaser's work under way wait for it: nothing is left. */
static void test_releaser_reset_destroy(void **state) {
  (void)state;
  for (int round = 0; round < 2; round++) {
    gpumem_context *ctx = ctx_new(1, 1);
    void *a, *b, *c;
    assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &a), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, 8 * MIB, NULL, &b), GPUMEM_OK);
    assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
    gate(1);
    assert_status(gpumem_alloc(ctx, 0, 16 * MIB, NULL, &c), GPUMEM_OK);
    wait_at_gate(1);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, open_later, (void *)(intptr_t)50), 0);
    if (round == 0) {
      assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
      assert_int_equal(reserved(ctx), 0);
      assert_int_equal(tu_sim_used(0), 0);
      check_held(ctx);
      tu_ctx_done(ctx);
    } else { /* destroyed with b and c live and the unmap waiting */
      tu_ctx_forget(ctx);
      assert_status(gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE), GPUMEM_OK);
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    tu_assert_sim_empty();
  }
}

/* Threads allocating and freeing at once on one expandable pool with the releaser: under TSan, the
 * queue's hand-offs; everywhere, the invariants and the statistics at the end. */
typedef struct worker_arg {
  gpumem_context *ctx;
  unsigned seed;
} worker_arg;

static void *worker(void *arg) {
  worker_arg *w = arg;
  uint32_t x = w->seed;
  for (int i = 0; i < 200; i++) {
    void *p;
    x = x * 1103515245u + 12345u;
    size_t n = ((size_t)(x >> 16) % 48 + 1) * MIB;
    if (gpumem_alloc(w->ctx, 0, n, NULL, &p) != GPUMEM_OK) return (void *)1;
    tu_stamp(p, 4096, x);
    if (!tu_stamp_ok(p, 4096, x)) return (void *)1;
    if (gpumem_free(w->ctx, p, NULL) != GPUMEM_OK) return (void *)1;
  }
  return NULL;
}

static void test_releaser_threads(void **state) {
  (void)state;
  gpumem_context *ctx = ctx_new(1, 0);
  pthread_t t[4];
  worker_arg w[4];
  for (int i = 0; i < 4; i++) {
    w[i].ctx = ctx;
    w[i].seed = (unsigned)(i * 7919 + 1);
    assert_int_equal(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    void *r = NULL;
    assert_int_equal(pthread_join(t[i], &r), 0);
    assert_null(r);
  }
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  assert_int_equal(reserved(ctx), tu_sim_used(0));
  tu_ctx_done(ctx);
  tu_assert_sim_empty();
}

int main(void) {
  if (!tu_is_sim()) return 0; /* the gated backend wraps the sim */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_releaser_same_as_inline, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_map_waits_for_unmap, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_queue_full, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_unmap_fails_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_unmap_stuck, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_destroy_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_reset_destroy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_releaser_threads, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
