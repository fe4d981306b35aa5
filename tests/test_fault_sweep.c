/* Fault sweep per scenario: for each scenario, count the backend calls of
 * each kind (malloc, free, event, info, sync, map) it makes in a clean run,
 * then run it again once for every i = 1..count (+1) and every kind with the
 * i-th call of that kind failing (GPUMEM_SIM_ERR_INJECTED, and for malloc
 * also GPUMEM_SIM_ERR_OUT_OF_MEMORY), and once for every i with the i-th call and every 2nd (then 3rd)
 * one after it failing, the calls between succeeding (gpumem_sim_fail_every). In every run:
 *   - every status is one gpumem.h documents for that function
 *     (GPUMEM_ERR_BACKEND only because a fault is armed);
 *   - a failed call leaves its out-parameter untouched and changes no block
 *     (a failed free leaves the block live, a failed reset of one device
 *     invalidates nothing on it);
 *   - stats match the model after every call (num_live, requested_bytes,
 *     cached = reserved - allocated) and reserved matches what the sim handed out;
 *   - block contents survive everything but their own free;
 *   - after gpumem_sim_fail_clear() the next calls work, and after destroy
 *     (plain after freeing the survivors on odd runs, FORCE on even runs)
 *     the sim has 0 bytes handed out.
 * Scenarios: size classes, cross-stream frees with delayed events, trim
 * (explicit and threshold), reset, scopes and buffers, OOM with callback and limit.
 * tests/test_fault_mixed.c sweeps one mixed scenario; this file sweeps each feature on its own.
 */
#include "testutil.h"

enum { MAXP = 32 };

typedef struct run {
  gpumem_context *ctx;
  void *p[MAXP];
  size_t n[MAXP];
  int dev[MAXP];
  int armed;     /* a fault is armed: BACKEND (and OOM) tolerated */
  int has_limit; /* LIMIT_EXCEEDED tolerated */
  char where[256];
  int bad;
  int victim;    /* OOM callback: slot it frees next (-1 none) */
  int cb_calls;
} run;

static run *g_run; /* for the OOM callback */

#define FAILF(r, ...)                                               \
  do {                                                              \
    if (!(r)->bad) {                                                \
      int off_ = snprintf((r)->where, sizeof (r)->where, "line %d: ", __LINE__); \
      snprintf((r)->where + off_, sizeof (r)->where - (size_t)off_, __VA_ARGS__); \
    }                                                               \
    (r)->bad = 1;                                                   \
  } while (0)

static int in_set(gpumem_status s, const gpumem_status *set, int n) {
  for (int i = 0; i < n; i++)
    if (s == set[i]) return 1;
  return 0;
}

/* Is s documented for an alloc-like call in this run? */
static int alloc_ok(run *r, gpumem_status s) {
  static const gpumem_status base[] = {GPUMEM_OK, GPUMEM_ERR_OUT_OF_MEMORY};
  if (in_set(s, base, 2)) return 1;
  if (s == GPUMEM_ERR_LIMIT_EXCEEDED && r->has_limit) return 1;
  if (s == GPUMEM_ERR_BACKEND && r->armed) return 1;
  return 0;
}
/* OK, or BACKEND while a fault is armed (free, trim, reset, info, scope_end). */
static int plain_ok(run *r, gpumem_status s) { return s == GPUMEM_OK || (s == GPUMEM_ERR_BACKEND && r->armed); }

static void check_stats(run *r) {
  uint64_t live_all = 0;
  for (int d = 0; d < 2; d++) {
    gpumem_stats s;
    s.struct_size = sizeof s;
    gpumem_status st = gpumem_get_stats(r->ctx, d, &s);
    if (st != GPUMEM_OK) {
      FAILF(r, "get_stats(%d): %s", d, gpumem_status_name(st));
      return;
    }
    uint64_t live = 0, req = 0;
    for (int i = 0; i < MAXP; i++)
      if (r->p[i] && r->dev[i] == d) {
        live++;
        req += r->n[i];
      }
    live_all += live;
    if (s.num_live != live || s.requested_bytes != req || s.allocated_bytes > s.reserved_bytes ||
        s.cached_bytes != s.reserved_bytes - s.allocated_bytes || s.num_live > s.num_allocs - s.num_frees)
      FAILF(r, "device %d stats: live %llu (model %llu) requested %llu (model %llu) reserved %llu allocated %llu cached %llu", d,
            (unsigned long long)s.num_live, (unsigned long long)live, (unsigned long long)s.requested_bytes, (unsigned long long)req,
            (unsigned long long)s.reserved_bytes, (unsigned long long)s.allocated_bytes, (unsigned long long)s.cached_bytes);
    uint64_t used = tu_sim_used(d);
    if (used < s.reserved_bytes || used - s.reserved_bytes >= 4096 * (s.num_segments + 1))
      FAILF(r, "device %d: the sim has %llu bytes handed out, the pool says it reserved %llu", d, (unsigned long long)used,
            (unsigned long long)s.reserved_bytes);
  }
  (void)live_all;
}

static void check_contents(run *r) {
  for (int i = 0; i < MAXP; i++)
    if (r->p[i] && !tu_stamp_ok(r->p[i], r->n[i], (uint32_t)(i * 7919 + 1))) FAILF(r, "block %d lost its contents", i);
}

static void A(run *r, int i, int dev, size_t n, gpumem_stream st) {
  if (r->p[i]) return;
  void *p = (void *)0x11;
  gpumem_status s = gpumem_alloc(r->ctx, dev, n, st, &p);
  if (!alloc_ok(r, s)) FAILF(r, "alloc(%d, %zu): undocumented %s", dev, n, gpumem_status_name(s));
  if (s == GPUMEM_OK) {
    if (!p || ((uintptr_t)p & 255)) FAILF(r, "alloc gave %p", p);
    r->p[i] = p;
    r->n[i] = n;
    r->dev[i] = dev;
    tu_stamp(p, n, (uint32_t)(i * 7919 + 1));
  } else if (p != (void *)0x11) {
    FAILF(r, "failed alloc (%s) changed *out_ptr", gpumem_status_name(s));
  }
  check_stats(r);
}

static void F(run *r, int i, gpumem_stream st) {
  if (!r->p[i]) return;
  if (!tu_stamp_ok(r->p[i], r->n[i], (uint32_t)(i * 7919 + 1))) FAILF(r, "block %d lost its contents", i);
  gpumem_status s = gpumem_free(r->ctx, r->p[i], st);
  if (!plain_ok(r, s)) FAILF(r, "free: undocumented %s", gpumem_status_name(s));
  if (s == GPUMEM_OK) {
    r->p[i] = NULL;
  } else if (gpumem_ptr_info(r->ctx, r->p[i], NULL, NULL) != GPUMEM_OK) {
    FAILF(r, "failed free (%s) dropped the block", gpumem_status_name(s));
  }
  check_stats(r);
}

static void T(run *r, int dev, uint64_t keep) {
  uint64_t rel = 0x5555;
  gpumem_status s = gpumem_trim(r->ctx, dev, keep, &rel);
  if (!plain_ok(r, s)) FAILF(r, "trim: undocumented %s", gpumem_status_name(s));
  check_contents(r);
  check_stats(r);
}

static void R(run *r, int dev) {
  gpumem_status s = gpumem_reset(r->ctx, dev, 0);
  if (!plain_ok(r, s)) FAILF(r, "reset(%d): undocumented %s", dev, gpumem_status_name(s));
  for (int d = 0; d < 2; d++) {
    if (dev >= 0 && d != dev) continue;
    int valid = 0, invalid = 0;
    for (int i = 0; i < MAXP; i++)
      if (r->p[i] && r->dev[i] == d) {
        if (gpumem_ptr_info(r->ctx, r->p[i], NULL, NULL) == GPUMEM_OK) valid++;
        else invalid++;
      }
    if (s == GPUMEM_OK && valid) FAILF(r, "reset(%d) succeeded, %d blocks of device %d still live", dev, valid, d);
    if (s != GPUMEM_OK && dev >= 0 && invalid) FAILF(r, "failed reset(%d) (%s) invalidated %d blocks", dev, gpumem_status_name(s), invalid);
    if (valid && invalid) FAILF(r, "device %d half reset: %d live, %d invalid", d, valid, invalid);
    if (valid == 0)
      for (int i = 0; i < MAXP; i++)
        if (r->p[i] && r->dev[i] == d) {
          gpumem_status f = gpumem_free(r->ctx, r->p[i], NULL);
          if (f != GPUMEM_ERR_INVALID_POINTER) FAILF(r, "free of a pointer invalidated by reset gave %s", gpumem_status_name(f));
          r->p[i] = NULL;
        }
  }
  check_contents(r);
  check_stats(r);
}

/* ---------------------------------------------------------------------- */
/* Scenarios                                                               */

#define S(k) ((gpumem_stream)(uintptr_t)(0x100 * (k)))

static void sc_classes(run *r) {
  static const size_t sizes[] = {1, 255, 256, 4097, 300000, TU_MiB, TU_MiB + 1, 9 * TU_MiB, 10 * TU_MiB + 1, 33 * TU_MiB};
  for (int i = 0; i < 10; i++) A(r, i, i & 1, sizes[i], S(1));
  for (int i = 0; i < 10; i += 2) F(r, i, S(1));
  for (int i = 0; i < 10; i += 2) A(r, i, 0, sizes[9 - i], S(1)); /* reuse from the cache */
  for (int i = 0; i < 10; i++) F(r, i, S(1));
}

static void sc_cross_stream(run *r) {
  gpumem_sim_set_delayed(1);
  A(r, 0, 0, 500000, S(1));
  A(r, 1, 0, 500000, S(1));
  A(r, 2, 0, 4 * TU_MiB, S(2));
  F(r, 0, S(2)); /* freed on another stream than it was allocated on */
  F(r, 1, S(1));
  F(r, 2, S(3));
  A(r, 3, 0, 500000, S(3)); /* needs S1/S2 work done: events recorded, queried */
  A(r, 4, 0, 4 * TU_MiB, S(1));
  gpumem_sim_stream_complete(0, S(2));
  A(r, 5, 0, 500000, S(4));
  gpumem_sim_stream_complete(-1, S(3));
  F(r, 3, S(1));
  F(r, 4, S(4));
  A(r, 6, 0, 500000, S(2));
  T(r, 0, 0); /* waits for pending frees */
  F(r, 5, NULL);
  F(r, 6, S(3));
  gpumem_sim_set_delayed(0);
}

static void sc_trim(run *r) {
  for (int i = 0; i < 6; i++) A(r, i, i % 2, (size_t)(i + 1) * 3 * TU_MiB, S(1 + i % 3));
  F(r, 1, S(1));
  F(r, 2, S(2));
  T(r, 1, 0);
  T(r, GPUMEM_ALL_DEVICES, 2 * TU_MiB);
  F(r, 0, S(3));
  F(r, 3, NULL);
  T(r, GPUMEM_ALL_DEVICES, 0);
  A(r, 7, 0, 12 * TU_MiB, S(1));
  F(r, 4, S(1));
  F(r, 5, S(1));
  F(r, 7, S(2));
  T(r, 0, 0);
}

static void sc_reset(run *r) {
  A(r, 0, 0, 1000, S(1));
  A(r, 1, 0, 5 * TU_MiB, S(2));
  A(r, 2, 1, 2000, S(1));
  A(r, 3, 1, 40 * TU_MiB, S(1));
  F(r, 1, S(3)); /* a pending cross-stream free at the reset */
  R(r, 0);
  A(r, 4, 0, 3000, S(1)); /* works after a reset */
  A(r, 5, 1, 6 * TU_MiB, NULL);
  R(r, GPUMEM_ALL_DEVICES);
  A(r, 6, 1, 100, S(2));
  F(r, 6, S(2));
}

static void sc_scope(run *r) {
  gpumem_scope *sc = (gpumem_scope *)0x22;
  gpumem_status s = gpumem_scope_begin(r->ctx, 1, S(1), &sc);
  if (s != GPUMEM_OK && s != GPUMEM_ERR_OUT_OF_MEMORY) FAILF(r, "scope_begin: %s", gpumem_status_name(s));
  if (s != GPUMEM_OK) {
    if (sc != (gpumem_scope *)0x22) FAILF(r, "failed scope_begin changed *out");
    return;
  }
  static const size_t sizes[] = {100, 70000, 3 * TU_MiB, 12 * TU_MiB, 256};
  void *mine[5] = {0};
  for (int i = 0; i < 5; i++) {
    void *p = (void *)0x33;
    s = gpumem_scope_alloc(sc, sizes[i], &p);
    if (!alloc_ok(r, s)) FAILF(r, "scope_alloc: undocumented %s", gpumem_status_name(s));
    if (s == GPUMEM_OK) {
      mine[i] = p;
      tu_stamp(p, sizes[i], 0xabc0u + (uint32_t)i);
    } else if (p != (void *)0x33) {
      FAILF(r, "failed scope_alloc changed *out_ptr");
    }
  }
  gpumem_buffer b;
  memset(&b, 0x44, sizeof b);
  gpumem_buffer copy = b;
  gpumem_status bs = gpumem_buffer_alloc(r->ctx, 0, 2 * TU_MiB, S(2), &b);
  if (!alloc_ok(r, bs)) FAILF(r, "buffer_alloc: undocumented %s", gpumem_status_name(bs));
  if (bs != GPUMEM_OK && memcmp(&b, &copy, sizeof b) != 0) FAILF(r, "failed buffer_alloc changed *out");
  for (int i = 0; i < 5; i++)
    if (mine[i] && !tu_stamp_ok(mine[i], sizes[i], 0xabc0u + (uint32_t)i)) FAILF(r, "scope block %d damaged", i);
  s = gpumem_scope_end(sc);
  if (!plain_ok(r, s)) FAILF(r, "scope_end: undocumented %s", gpumem_status_name(s));
  for (int i = 0; i < 5; i++) {
    if (!mine[i]) continue;
    if (gpumem_ptr_info(r->ctx, mine[i], NULL, NULL) == GPUMEM_OK) {
      if (s == GPUMEM_OK) FAILF(r, "scope_end OK but block %d still live", i);
      /* a block whose free failed stays live: it is the caller's now */
      for (int k = 0; k < MAXP; k++)
        if (!r->p[k]) {
          r->p[k] = mine[i];
          r->n[k] = sizes[i];
          r->dev[k] = 1;
          tu_stamp(mine[i], sizes[i], (uint32_t)(k * 7919 + 1));
          break;
        }
    }
  }
  if (bs == GPUMEM_OK) {
    void *bp = b.ptr;
    gpumem_buffer_release(&b);
    if (b.ptr || b.ctx) FAILF(r, "buffer_release did not zero the buffer");
    gpumem_buffer_release(&b); /* twice is harmless */
    if (gpumem_ptr_info(r->ctx, bp, NULL, NULL) == GPUMEM_OK) FAILF(r, "buffer_release left its block live");
  }
  check_stats(r);
}

static int oom_cb(void *user, int device, size_t requested) {
  (void)user;
  (void)requested;
  run *r = g_run;
  r->cb_calls++;
  if (r->victim < 0 || !r->p[r->victim] || r->dev[r->victim] != device) return 0;
  int v = r->victim;
  r->victim = -1;
  gpumem_status s = gpumem_free(r->ctx, r->p[v], NULL);
  if (!plain_ok(r, s)) FAILF(r, "free in the OOM callback: %s", gpumem_status_name(s));
  if (s == GPUMEM_OK) r->p[v] = NULL;
  return s == GPUMEM_OK;
}

static void sc_oom(run *r) {
  /* device 0: 100 MiB taken by "another process", so 156 MiB are left; the
   * third 60 MiB block does not fit until the callback frees one */
  assert_status(gpumem_sim_set_external_usage(0, 100 * TU_MiB), GPUMEM_OK);
  A(r, 0, 0, 60 * TU_MiB, S(1));
  A(r, 1, 0, 60 * TU_MiB, S(1));
  r->victim = 0;
  A(r, 2, 0, 60 * TU_MiB, S(2));
  r->victim = -1;
  A(r, 3, 0, 60 * TU_MiB, S(1)); /* out of memory, the callback declines */
  F(r, 1, S(1));
  assert_status(gpumem_sim_set_external_usage(0, 0), GPUMEM_OK);
  /* limit (limit_fraction 0.75 = 192 MiB per device) on device 1 */
  A(r, 4, 1, 100 * TU_MiB, S(1));
  A(r, 5, 1, 100 * TU_MiB, S(1)); /* LIMIT_EXCEEDED */
  F(r, 4, S(2));
  A(r, 5, 1, 100 * TU_MiB, S(1)); /* fits once the free segment is given back */
  F(r, 2, NULL);
  F(r, 5, NULL);
}

typedef struct scenario {
  const char *name;
  void (*fn)(run *r);
  int with_oom_cb;
  uint64_t release_threshold;
} scenario;

static const scenario g_scenarios[] = {
    {"size classes", sc_classes, 0, GPUMEM_UNLIMITED},
    {"cross-stream, delayed events", sc_cross_stream, 0, GPUMEM_UNLIMITED},
    {"trim (explicit and threshold)", sc_trim, 0, 8 * TU_MiB},
    {"reset", sc_reset, 0, GPUMEM_UNLIMITED},
    {"scope and buffer", sc_scope, 0, GPUMEM_UNLIMITED},
    {"OOM callback and limit", sc_oom, 1, GPUMEM_UNLIMITED},
};

static const char *kind_name(int k) {
  static const char *const names[] = {"malloc", "free", "event", "info", "sync", "map"};
  return names[k];
}

/* One run of a scenario; fault_kind < 0: none. Returns 1 when fine; *calls gets the calls of fault_kind made. */
static int one_run_every(const scenario *sc, int fault_kind, uint64_t nth, uint64_t every, int error, int force_destroy,
                         uint64_t *calls) {
  run r;
  memset(&r, 0, sizeof r);
  r.victim = -1;
  g_run = &r;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.release_threshold = sc->release_threshold;
  if (sc->with_oom_cb) {
    cfg.oom_callback = oom_cb;
    cfg.limit_fraction = 0.75; /* 192 MiB of 256 */
    r.has_limit = 1;
  }
  gpumem_context *keeper = NULL;
  gpumem_config kc;
  tu_config(&kc);
  kc.flags = GPUMEM_CONFIG_NO_ENV;
  assert_status(gpumem_create(&kc, &keeper), GPUMEM_OK); /* the sim state lives across the run */
  assert_status(gpumem_create(&cfg, &r.ctx), GPUMEM_OK);
  uint64_t c0 = fault_kind >= 0 ? gpumem_sim_call_count((gpumem_sim_call)fault_kind) : 0;
  if (fault_kind >= 0) {
    if (every > 0) assert_status(gpumem_sim_fail_every((gpumem_sim_call)fault_kind, nth, every, error), GPUMEM_OK);
    else assert_status(gpumem_sim_fail_nth((gpumem_sim_call)fault_kind, nth, error, 0), GPUMEM_OK);
    r.armed = 1;
  }
  sc->fn(&r);
  if (calls) *calls = fault_kind >= 0 ? gpumem_sim_call_count((gpumem_sim_call)fault_kind) - c0 : 0;
  gpumem_sim_fail_clear();
  r.armed = 0;
  gpumem_sim_set_delayed(0);
  for (int d = 0; d < 2; d++) (void)gpumem_sim_set_external_usage(d, 0);
  gpumem_sim_complete_all();
  check_contents(&r);
  check_stats(&r);
  /* cleared: the next calls work */
  void *p = (void *)0x1;
  gpumem_status s = gpumem_alloc(r.ctx, 1, 3 * TU_MiB, NULL, &p);
  if (s != GPUMEM_OK) FAILF(&r, "alloc after clearing the fault: %s", gpumem_status_name(s));
  else if ((s = gpumem_free(r.ctx, p, NULL)) != GPUMEM_OK) FAILF(&r, "free after clearing the fault: %s", gpumem_status_name(s));
  uint64_t rel = 0;
  if ((s = gpumem_trim(r.ctx, GPUMEM_ALL_DEVICES, 0, &rel)) != GPUMEM_OK) FAILF(&r, "trim after clearing the fault: %s", gpumem_status_name(s));
  if (force_destroy) {
    s = gpumem_destroy(r.ctx, GPUMEM_DESTROY_FORCE);
    if (s != GPUMEM_OK) FAILF(&r, "destroy FORCE: %s", gpumem_status_name(s));
  } else {
    for (int i = 0; i < MAXP; i++) F(&r, i, NULL);
    s = gpumem_destroy(r.ctx, 0);
    if (s != GPUMEM_OK) {
      FAILF(&r, "destroy after freeing everything: %s", gpumem_status_name(s));
      gpumem_destroy(r.ctx, GPUMEM_DESTROY_FORCE);
    }
  }
  uint64_t used = tu_sim_used_total();
  if (used) FAILF(&r, "%llu bytes still handed out by the sim after destroy", (unsigned long long)used);
  gpumem_destroy(keeper, GPUMEM_DESTROY_FORCE);
  g_run = NULL;
  if (r.bad) {
    if (fault_kind >= 0)
      print_error("[%s] %s call #%llu failing with %d (then every %llu-th: 0 = none): %s\n", sc->name, kind_name(fault_kind),
                  (unsigned long long)nth, error, (unsigned long long)every, r.where);
    else
      print_error("[%s] no fault: %s\n", sc->name, r.where);
  }
  return !r.bad;
}

static int one_run(const scenario *sc, int fault_kind, uint64_t nth, int error, int force_destroy, uint64_t *calls) {
  return one_run_every(sc, fault_kind, nth, 0, error, force_destroy, calls);
}

static void sweep(const scenario *sc) {
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "2x256MiB");
  assert_true(one_run(sc, -1, 0, 0, 0, NULL));
  assert_true(one_run(sc, -1, 0, 0, 1, NULL));
  int runs = 0, failures = 0;
  char counts[256];
  size_t len = 0;
  counts[0] = '\0';
  for (int k = 0; k < (int)GPUMEM_SIM_CALL_KINDS_; k++) {
    uint64_t calls = 0;
    assert_true(one_run(sc, k, 1u << 30, GPUMEM_SIM_ERR_INJECTED, 0, &calls)); /* count: a fault that never fires */
    len += (size_t)snprintf(counts + len, sizeof counts - len, "%s%s %llu", k ? ", " : "", kind_name(k), (unsigned long long)calls);
    const int errors[] = {GPUMEM_SIM_ERR_INJECTED, GPUMEM_SIM_ERR_OUT_OF_MEMORY};
    for (int e = 0; e < (k == GPUMEM_SIM_CALL_MALLOC ? 2 : 1); e++)
      for (uint64_t nth = 1; nth <= calls + 1; nth++) {
        if (!tu_sweep_keep(nth, calls + 1, 2, (unsigned)(k + e))) continue; /* valgrind: a stride (testutil.h) */
        runs++;
        if (!one_run(sc, k, nth, errors[e], (int)(nth & 1), NULL)) failures++;
      }
    /* a driver failing now and then (gpumem_sim_fail_every): from the nth call on every 2nd or 3rd one fails, the
     * ones between succeed, so that a call over several chunks, segments or events half succeeds with gaps */
    for (uint64_t every = 2; every <= 3; every++)
      for (uint64_t nth = 1; nth <= calls; nth++) {
        if (!tu_sweep_keep(nth, calls, 2, (unsigned)(k + (int)every))) continue;
        runs++;
        if (!one_run_every(sc, k, nth, every, errors[0], (int)((nth + every) & 1), NULL)) failures++;
      }
  }
  print_message("[%s] calls: %s; %d faulty runs, %d failed\n", sc->name, counts, runs, failures);
  assert_int_equal(failures, 0);
}

static void test_sweep_classes(void **state) { (void)state; sweep(&g_scenarios[0]); }
static void test_sweep_cross_stream(void **state) { (void)state; sweep(&g_scenarios[1]); }
static void test_sweep_trim(void **state) { (void)state; sweep(&g_scenarios[2]); }
static void test_sweep_reset(void **state) { (void)state; sweep(&g_scenarios[3]); }
static void test_sweep_scope(void **state) { (void)state; sweep(&g_scenarios[4]); }
static void test_sweep_oom(void **state) { (void)state; sweep(&g_scenarios[5]); }

/* The scenario must really exercise what it is named after: a clean run of
 * each makes calls of the kinds it is meant to fault (else the sweep proves nothing). */
static void test_scenarios_make_calls(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_SIM_DEVICES", "2x256MiB");
  uint64_t c[6];
  for (int s = 0; s < 6; s++) {
    for (int k = 0; k < 6; k++) assert_true(one_run(&g_scenarios[s], k, 1u << 30, GPUMEM_SIM_ERR_INJECTED, 0, &c[k]));
    assert_true(c[GPUMEM_SIM_CALL_MALLOC] > 0);
    if (s == 1) assert_true(c[GPUMEM_SIM_CALL_EVENT] > 0); /* cross-stream: events */
    if (s == 2 || s == 3) assert_true(c[GPUMEM_SIM_CALL_FREE] > 0);
    if (s == 3) assert_true(c[GPUMEM_SIM_CALL_SYNC] > 0); /* reset synchronises */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_scenarios_make_calls),
      TU_TEST(test_sweep_classes),
      TU_TEST(test_sweep_cross_stream),
      TU_TEST(test_sweep_trim),
      TU_TEST(test_sweep_reset),
      TU_TEST(test_sweep_scope),
      TU_TEST(test_sweep_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
