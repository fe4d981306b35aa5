/* Fault sweep: fail the 1st, 2nd, ... Nth backend call of each kind during a scenario, and (a driver
 * failing now and then) from each call on every 2nd or 3rd call of the kind, the ones between succeeding.
 * Every status must be a documented one, nothing may leak, stats stay consistent,
 * a failed call changes nothing, and everything works again once faults are cleared. */
#include "testutil.h"

enum { MAXP = 16 };

typedef struct run {
  gpumem_context *ctx;
  void *p[MAXP];
  size_t n[MAXP];
  int dev[MAXP];
  gpumem_stream st[MAXP];
  char where[128];
  int bad;
} run;

static int allowed(gpumem_status s, const gpumem_status *ok, int nok) {
  for (int i = 0; i < nok; i++)
    if (s == ok[i]) return 1;
  return 0;
}

#define CHECK_STATUS(r, s, ...)                                                                         \
  do {                                                                                                  \
    const gpumem_status ok_[] = {__VA_ARGS__};                                                          \
    if (!allowed((s), ok_, (int)(sizeof ok_ / sizeof ok_[0]))) {                                        \
      snprintf((r)->where, sizeof (r)->where, "line %d: undocumented status %s", __LINE__, gpumem_status_name(s)); \
      (r)->bad = 1;                                                                                     \
    }                                                                                                   \
  } while (0)

static void check_stats(run *r) {
  gpumem_stats s;
  s.struct_size = sizeof s;
  if (gpumem_get_stats(r->ctx, GPUMEM_ALL_DEVICES, &s) != GPUMEM_OK) {
    snprintf(r->where, sizeof r->where, "get_stats failed");
    r->bad = 1;
    return;
  }
  uint64_t live = 0, req = 0;
  for (int i = 0; i < MAXP; i++)
    if (r->p[i]) {
      live++;
      req += r->n[i];
    }
  if (s.allocated_bytes > s.reserved_bytes || s.cached_bytes != s.reserved_bytes - s.allocated_bytes ||
      s.num_live != live || s.requested_bytes != req || s.num_live > s.num_allocs - s.num_frees) {
    snprintf(r->where, sizeof r->where, "stats inconsistent: live %llu/%llu requested %llu/%llu reserved %llu allocated %llu",
             (unsigned long long)s.num_live, (unsigned long long)live, (unsigned long long)s.requested_bytes,
             (unsigned long long)req, (unsigned long long)s.reserved_bytes, (unsigned long long)s.allocated_bytes);
    r->bad = 1;
  }
}

static void do_alloc(run *r, int i, int dev, size_t n, gpumem_stream st) {
  void *p = (void *)0x1;
  gpumem_status s = gpumem_alloc(r->ctx, dev, n, st, &p);
  CHECK_STATUS(r, s, GPUMEM_OK, GPUMEM_ERR_OUT_OF_MEMORY, GPUMEM_ERR_BACKEND);
  if (s == GPUMEM_OK) {
    r->p[i] = p;
    r->n[i] = n;
    r->dev[i] = dev;
    r->st[i] = st;
    tu_stamp(p, n, (uint32_t)i);
  } else if (p != (void *)0x1) {
    snprintf(r->where, sizeof r->where, "failed alloc touched *out_ptr");
    r->bad = 1;
  }
  check_stats(r);
}

static void do_free(run *r, int i, gpumem_stream st) {
  if (!r->p[i]) return;
  if (!tu_stamp_ok(r->p[i], r->n[i], (uint32_t)i)) {
    snprintf(r->where, sizeof r->where, "block %d lost its contents", i);
    r->bad = 1;
  }
  gpumem_status s = gpumem_free(r->ctx, r->p[i], st);
  CHECK_STATUS(r, s, GPUMEM_OK, GPUMEM_ERR_BACKEND);
  if (s == GPUMEM_OK) r->p[i] = NULL; /* on failure nothing changed: still live, freed again later */
  check_stats(r);
}

/* The scenario; `r->ctx` exists. Streams 0x10/0x20 exercise events. */
static void scenario(run *r) {
  static const size_t sizes[] = {1000, 300000, 3 * TU_MiB, 12 * TU_MiB, 100, 40 * TU_MiB};
  for (int i = 0; i < 6; i++) do_alloc(r, i, i % 2, sizes[i], (gpumem_stream)(uintptr_t)(0x10 * (1 + i % 2)));
  do_free(r, 1, (gpumem_stream)0x10);
  do_free(r, 2, (gpumem_stream)0x20); /* cross-stream free: event */
  do_alloc(r, 7, 0, 2 * TU_MiB, (gpumem_stream)0x30);
  gpumem_device_info info;
  info.struct_size = sizeof info;
  gpumem_status s = gpumem_device_get_info(r->ctx, 1, &info);
  CHECK_STATUS(r, s, GPUMEM_OK, GPUMEM_ERR_BACKEND);
  uint64_t released = 0;
  s = gpumem_trim(r->ctx, GPUMEM_ALL_DEVICES, 0, &released);
  CHECK_STATUS(r, s, GPUMEM_OK, GPUMEM_ERR_BACKEND);
  check_stats(r);
  s = gpumem_reset(r->ctx, 1, 0);
  CHECK_STATUS(r, s, GPUMEM_OK, GPUMEM_ERR_BACKEND);
  if (s == GPUMEM_OK)
    for (int i = 0; i < MAXP; i++)
      if (r->p[i] && r->dev[i] == 1) r->p[i] = NULL; /* invalidated */
  check_stats(r);
  do_alloc(r, 8, 1, 5 * TU_MiB, NULL);
  do_alloc(r, 9, 0, 700, (gpumem_stream)0x10);
  do_free(r, 0, NULL);
  do_free(r, 3, (gpumem_stream)0x10);
  s = gpumem_trim(r->ctx, 0, TU_MiB, NULL);
  CHECK_STATUS(r, s, GPUMEM_OK, GPUMEM_ERR_BACKEND);
  check_stats(r);
}

static const char *kind_name(int k) {
  static const char *const names[] = {"malloc", "free", "event", "info", "sync", "map"};
  return names[k];
}

/* One full run; returns 1 when fine. fault_kind < 0: no fault. every > 0: from the nth call on, every
 * every-th call of the kind fails (gpumem_sim_fail_every), the ones between succeed. */
static int one_run_every(int fault_kind, uint64_t nth, uint64_t every, int error, uint64_t *calls_out) {
  run r;
  memset(&r, 0, sizeof r);
  uint64_t c0 = fault_kind >= 0 ? gpumem_sim_call_count((gpumem_sim_call)fault_kind) : 0;
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  gpumem_context *keeper = NULL;
  assert_status(gpumem_create(&cfg, &keeper), GPUMEM_OK); /* sim state lives across the run */
  gpumem_status s = gpumem_create(&cfg, &r.ctx);
  assert_status(s, GPUMEM_OK);
  if (fault_kind >= 0) {
    c0 = gpumem_sim_call_count((gpumem_sim_call)fault_kind);
    if (every > 0) assert_status(gpumem_sim_fail_every((gpumem_sim_call)fault_kind, nth, every, error), GPUMEM_OK);
    else assert_status(gpumem_sim_fail_nth((gpumem_sim_call)fault_kind, nth, error, 0), GPUMEM_OK);
  }
  scenario(&r);
  uint64_t calls = fault_kind >= 0 ? gpumem_sim_call_count((gpumem_sim_call)fault_kind) - c0 : 0;
  if (calls_out) *calls_out = calls;
  gpumem_sim_fail_clear();
  gpumem_sim_complete_all();
  /* cleared: everything works again, and the blocks that survived are intact and freeable */
  if (!r.bad) {
    void *p = NULL;
    s = gpumem_alloc(r.ctx, 0, 3 * TU_MiB, NULL, &p);
    if (s != GPUMEM_OK) {
      snprintf(r.where, sizeof r.where, "alloc after clearing: %s", gpumem_status_name(s));
      r.bad = 1;
    } else {
      gpumem_free(r.ctx, p, NULL);
    }
    for (int i = 0; i < MAXP && !r.bad; i++) {
      if (!r.p[i]) continue;
      if (!tu_stamp_ok(r.p[i], r.n[i], (uint32_t)i)) {
        snprintf(r.where, sizeof r.where, "block %d damaged", i);
        r.bad = 1;
      }
      s = gpumem_free(r.ctx, r.p[i], NULL);
      if (s != GPUMEM_OK) {
        snprintf(r.where, sizeof r.where, "free of surviving block %d after clearing: %s", i, gpumem_status_name(s));
        r.bad = 1;
      }
      r.p[i] = NULL;
    }
    if (!r.bad) check_stats(&r);
    if (!r.bad) {
      s = gpumem_destroy(r.ctx, 0);
      if (s != GPUMEM_OK) {
        snprintf(r.where, sizeof r.where, "destroy after freeing everything: %s", gpumem_status_name(s));
        r.bad = 1;
      } else {
        r.ctx = NULL;
      }
    }
  }
  if (r.ctx) gpumem_destroy(r.ctx, GPUMEM_DESTROY_FORCE);
  uint64_t used = tu_sim_used_total();
  gpumem_destroy(keeper, GPUMEM_DESTROY_FORCE);
  if (!r.bad && used != 0) {
    snprintf(r.where, sizeof r.where, "%llu bytes still held from the sim after destroy", (unsigned long long)used);
    r.bad = 1;
  }
  if (r.bad) {
    if (fault_kind >= 0)
      print_error("fault: %s call #%llu failing with %d (then every %llu-th: 0 = none): %s\n", kind_name(fault_kind),
                  (unsigned long long)nth, error, (unsigned long long)every, r.where);
    else
      print_error("no fault: %s\n", r.where);
  }
  return !r.bad;
}

static int one_run(int fault_kind, uint64_t nth, int error, uint64_t *calls_out) {
  return one_run_every(fault_kind, nth, 0, error, calls_out);
}

static void test_fault_sweep(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  assert_true(one_run(-1, 0, 0, NULL));
  int failures = 0, runs = 0;
  for (int k = 0; k < (int)GPUMEM_SIM_CALL_KINDS_; k++) {
    uint64_t calls = 0;
    /* count this kind's calls in a clean run (a fault far beyond them never fires) */
    assert_true(one_run(k, 1000000, GPUMEM_SIM_ERR_INJECTED, &calls));
    const int errors[] = {GPUMEM_SIM_ERR_INJECTED, GPUMEM_SIM_ERR_OUT_OF_MEMORY};
    for (int e = 0; e < (k == GPUMEM_SIM_CALL_MALLOC ? 2 : 1); e++)
      for (uint64_t nth = 1; nth <= calls + 1; nth++) {
        if (!tu_sweep_keep(nth, calls + 1, 2, (unsigned)(k + e))) continue; /* valgrind: a stride (testutil.h) */
        runs++;
        if (!one_run(k, nth, errors[e], NULL)) failures++;
      }
    /* a driver failing now and then: from the nth call on, every 2nd or 3rd */
    for (uint64_t every = 2; every <= 3; every++)
      for (uint64_t nth = 1; nth <= calls; nth++) {
        if (!tu_sweep_keep(nth, calls, 2, (unsigned)(k + (int)every))) continue;
        runs++;
        if (!one_run_every(k, nth, every, errors[0], NULL)) failures++;
      }
  }
  print_message("fault sweep: %d runs, %d failed\n", runs, failures);
  assert_int_equal(failures, 0);
}

static void test_fault_repeat(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  /* a kind failing on every call from the start: still only documented statuses, no leak */
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  int failures = 0;
  for (int k = 0; k < (int)GPUMEM_SIM_CALL_KINDS_; k++) {
    run r;
    memset(&r, 0, sizeof r);
    gpumem_config cfg;
    tu_config(&cfg);
    cfg.flags = GPUMEM_CONFIG_NO_ENV;
    gpumem_context *keeper = NULL;
    assert_status(gpumem_create(&cfg, &keeper), GPUMEM_OK);
    assert_status(gpumem_create(&cfg, &r.ctx), GPUMEM_OK);
    assert_status(gpumem_sim_fail_nth((gpumem_sim_call)k, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
    scenario(&r);
    gpumem_sim_fail_clear();
    gpumem_sim_complete_all();
    gpumem_status s = gpumem_destroy(r.ctx, GPUMEM_DESTROY_FORCE);
    if (s != GPUMEM_OK) {
      snprintf(r.where, sizeof r.where, "destroy FORCE after clearing: %s", gpumem_status_name(s));
      r.bad = 1;
    }
    uint64_t used = tu_sim_used_total();
    gpumem_destroy(keeper, GPUMEM_DESTROY_FORCE);
    if (!r.bad && used) {
      snprintf(r.where, sizeof r.where, "%llu bytes leaked", (unsigned long long)used);
      r.bad = 1;
    }
    if (r.bad) {
      print_error("repeat fault on %s: %s\n", kind_name(k), r.where);
      failures++;
    }
  }
  assert_int_equal(failures, 0);
}

static void test_create_faults(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  /* info calls failing while a context is created: a documented status, nothing held */
  for (uint64_t nth = 1; nth <= 4; nth++) {
    assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_INFO, nth, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
    gpumem_config cfg;
    tu_config(&cfg);
    gpumem_context *ctx = (gpumem_context *)0x1;
    gpumem_status s = gpumem_create(&cfg, &ctx);
    gpumem_sim_fail_clear();
    assert_true(s == GPUMEM_OK || s == GPUMEM_ERR_BACKEND || s == GPUMEM_ERR_NO_BACKEND);
    if (s == GPUMEM_OK) {
      tu_ctx_register(ctx);
      tu_ctx_done(ctx);
    } else {
      assert_ptr_equal(ctx, (gpumem_context *)0x1);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_fault_sweep),
      TU_TEST(test_fault_repeat),
      TU_TEST(test_create_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
