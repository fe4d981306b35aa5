/*
 * test_hostmem_oom.c: the host runs out of memory at each host allocation of an operation in turn
 * (hostmem.c's fault), as SQLite's malloc tests walk theirs. For every k, a fresh context is set up
 * with no fault, then the operation runs with the k-th host allocation failing (once, or that one
 * and every later one), until an operation completes with no allocation failed. Each run must:
 *   - return GPUMEM_OK or GPUMEM_ERR_OUT_OF_MEMORY (the operation's documented statuses), never crash;
 *   - leave the pools' invariants whole (gpumem__check_invariants) and the blocks that were live
 *     before unchanged: same contents, still freeable;
 *   - give every byte back to the (sim) device once the context is destroyed.
 * The free scenarios also check stream order: a block freed on a stream whose work on it is still
 * running serves no other stream before that work is done, also when the host has no memory for the
 * stream's record and the device cannot be synchronised either.
 */
#include "testutil.h"

#include "../src/internal.h"

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)
#define SC ((gpumem_stream)(uintptr_t)0xC0)
#define SD ((gpumem_stream)(uintptr_t)0xD0)

#define NKEEP 3
#define MAX_STEPS 400 /* more host allocations than any operation here makes */

typedef struct fx {
  gpumem_context *ctx;
  int expandable;
  void *keep[NKEEP]; /* live across the operation, stamped */
  size_t keep_n[NKEEP];
  void *got[4]; /* what the operation made (freed by the scenario's cleanup) */
  gpumem_stream got_s[4];
  size_t got_n[4];
  int ngot;
  gpumem_scope *scope;
  gpumem_graph_pool *gp;
  int capturing; /* SC is being captured into gp */
  uint64_t ticket; /* work on the freed block (free scenarios) */
  gpumem_stream ticket_s;
  void *freed;
  size_t freed_n;
  unsigned freed_mask; /* the keep blocks the operation frees (bit i: keep[i]) */
  int keep_gone;  /* a reset invalidated the keep blocks */
  int destroyed;  /* the operation destroyed ctx (keeper holds the sim's state) */
  gpumem_context *keeper;
} fx;

typedef struct scenario {
  const char *name;
  gpumem_status (*op)(fx *f);
  void (*after)(fx *f, gpumem_status st); /* optional, faults cleared (sim faults still set) */
  int sync_fails;                         /* the device cannot be synchronised during op and after */
  int free_fails;                         /* the backend refuses every free (and vm destroy) during op */
  int delayed;                            /* sim streams complete work only when told */
  int allocates;                          /* op makes a host allocation in every configuration */
  void (*prep)(fx *f);                    /* optional, before the faults are armed */
} scenario;

static uint32_t stamp_of(int i) { return 0x5eed0000u + (uint32_t)i; }

static void setup(fx *f, int expandable, int delayed) {
  memset(f, 0, sizeof *f);
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.expandable = expandable;
  f->expandable = expandable;
  f->ctx = tu_ctx_new(&cfg);
  gpumem_sim_set_delayed(delayed);
  static const size_t sizes[NKEEP] = {4096, 1 << 20, 6 << 20};
  for (int i = 0; i < NKEEP; i++) {
    f->keep_n[i] = sizes[i];
    assert_status(gpumem_alloc(f->ctx, 0, sizes[i], i == 1 ? SB : SA, &f->keep[i]), GPUMEM_OK);
    tu_stamp(f->keep[i], sizes[i], stamp_of(i));
  }
  gpumem_sim_complete_all();
}

/* the capture ends, not invalidated by anything the library did during it */
static void end_capture(fx *f) {
  f->capturing = 0;
  int inv = -1;
  assert_status(gpumem_graph_pool_end(f->gp, SC), GPUMEM_OK);
  assert_status(gpumem_sim_stream_end_capture(0, SC, &inv), GPUMEM_OK);
  if (inv != 0) fail_msg("the capture was invalidated");
  assert_status(gpumem_capture_ended(f->ctx, 0, SC), GPUMEM_OK);
}

static void cleanup(fx *f) {
  if (f->destroyed) {
    gpumem_sim_fail_clear();
    tu_ctx_forget(f->ctx);
    tu_ctx_done(f->keeper); /* the last context: the sim's every byte back */
    return;
  }
  if (f->capturing) end_capture(f);
  gpumem_sim_fail_clear();
  gpumem_sim_complete_all();
  for (int i = 0; i < f->ngot; i++) assert_status(gpumem_free(f->ctx, f->got[i], f->got_s[i]), GPUMEM_OK);
  if (f->scope != NULL) assert_status(gpumem_scope_end(f->scope), GPUMEM_OK);
  if (f->gp != NULL) assert_status(gpumem_graph_pool_release(f->gp), GPUMEM_OK);
  for (int i = 0; i < NKEEP; i++)
    if (!(f->freed_mask >> i & 1u)) assert_status(gpumem_free(f->ctx, f->keep[i], i == 1 ? SB : SA), GPUMEM_OK);
  gpumem_sim_complete_all();
  assert_status(gpumem__check_invariants(f->ctx), GPUMEM_OK);
  tu_ctx_done(f->ctx); /* the sim's every byte back */
}

static void sweep(const scenario *sc, int expandable, int persist) {
  uint64_t k = 0;
  for (; k < MAX_STEPS; k++) {
    fx f;
    setup(&f, expandable, sc->delayed);
    if (sc->prep != NULL) sc->prep(&f);
    if (sc->sync_fails)
      assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_SYNC, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
    if (sc->free_fails)
      assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_FREE, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
    gpumem__host_fault_arm(k, persist);
    gpumem_status st = sc->op(&f);
    const uint64_t failed = gpumem__host_fault_count();
    gpumem__host_fault_clear();
    if (sc->free_fails) gpumem_sim_fail_clear();
    /* nothing the device handed out is lost to the pools' count */
    const gpumem_stats ds = f.destroyed ? (gpumem_stats){0} : tu_stats(f.ctx, 0);
    if (tu_sim_used(0) != ds.reserved_bytes)
      fail_msg("%s (%s, %s, k %llu): the device has %llu bytes handed out, the stats say %llu reserved", sc->name,
               expandable ? "expandable" : "plain", persist ? "persistent" : "once", (unsigned long long)k,
               (unsigned long long)tu_sim_used(0), (unsigned long long)ds.reserved_bytes);
    if (st != GPUMEM_OK && st != GPUMEM_ERR_OUT_OF_MEMORY && !(sc->free_fails && st == GPUMEM_ERR_BACKEND))
      fail_msg("%s (%s, %s, k %llu): status %s", sc->name, expandable ? "expandable" : "plain",
               persist ? "persistent" : "once", (unsigned long long)k, gpumem_status_name(st));
    if (failed == 0 && st != GPUMEM_OK)
      fail_msg("%s (k %llu): %s with no host allocation failed", sc->name, (unsigned long long)k, gpumem_status_name(st));
    if (!f.destroyed && gpumem__check_invariants(f.ctx) != GPUMEM_OK)
      fail_msg("%s (%s, %s, k %llu): invariants broken", sc->name, expandable ? "expandable" : "plain",
               persist ? "persistent" : "once", (unsigned long long)k);
    for (int i = 0; i < NKEEP; i++)
      if (!(f.freed_mask >> i & 1u) && !f.keep_gone && !f.destroyed && !tu_stamp_ok(f.keep[i], f.keep_n[i], stamp_of(i)))
        fail_msg("%s (k %llu): live block %d changed", sc->name, (unsigned long long)k, i);
    if (sc->after != NULL) sc->after(&f, st);
    cleanup(&f);
    if (failed == 0) break;
  }
  if (sc->allocates) assert_true(k > 0); /* the walk reached at least one host allocation... */
  assert_true(k < MAX_STEPS);            /* ...and the operation finished */
}

static void sweep_all(const scenario *sc) {
  for (int expandable = 0; expandable < 2; expandable++)
    for (int persist = 0; persist < 2; persist++) sweep(sc, expandable, persist);
}

/* ---------------------------------------------------------------------- */
/* Operations                                                              */

static gpumem_status got_alloc(fx *f, size_t n, gpumem_stream s) {
  void *p = NULL;
  gpumem_status st = gpumem_alloc(f->ctx, 0, n, s, &p);
  if (st == GPUMEM_OK) {
    f->got[f->ngot] = p;
    f->got_s[f->ngot] = s;
    f->got_n[f->ngot] = n;
    f->ngot++;
  } else {
    assert_null(p);
  }
  return st;
}

/* allocations of every size path on a stream never named before, two on one named already */
static gpumem_status op_alloc(fx *f) {
  gpumem_status st = got_alloc(f, 512, SC);
  if (st == GPUMEM_OK) st = got_alloc(f, 3 << 20, SC);
  if (st == GPUMEM_OK) st = got_alloc(f, 40 << 20, SD);
  if (st == GPUMEM_OK) st = got_alloc(f, 200 << 10, SA);
  return st;
}

static void after_alloc(fx *f, gpumem_status st) {
  (void)st;
  void *ptrs[NKEEP + 4];
  size_t sizes[NKEEP + 4];
  size_t n = 0;
  for (int i = 0; i < NKEEP; i++, n++) {
    ptrs[n] = f->keep[i];
    sizes[n] = f->keep_n[i];
  }
  for (int i = 0; i < f->ngot; i++, n++) {
    ptrs[n] = f->got[i];
    sizes[n] = f->got_n[i];
  }
  assert_int_equal(tu_find_overlap(ptrs, sizes, n), -1);
}

/* keep[2] freed on free_s, with work that uses it queued on work_s first (checked by after_free) */
static gpumem_status free_with_work(fx *f, gpumem_stream work_s, gpumem_stream free_s) {
  f->freed_mask |= 1u << 2;
  f->freed = f->keep[2];
  f->freed_n = f->keep_n[2];
  f->ticket_s = work_s;
  assert_status(gpumem_sim_stream_submit(0, work_s, &f->ticket), GPUMEM_OK);
  return gpumem_free(f->ctx, f->freed, free_s);
}

/* a free on a stream that has no record yet, with that stream's work on the block still running */
static gpumem_status op_free_new_stream(fx *f) { return free_with_work(f, SD, SD); }

/* noted on another stream, then freed: the note's and the park's host memory */
static gpumem_status op_noted_free(fx *f) {
  gpumem_status st = gpumem_record_stream(f->ctx, f->keep[2], SC);
  return st != GPUMEM_OK ? st : free_with_work(f, SC, SA);
}

/* the freed block serves no allocation on another stream while the work on it runs */
static void after_free(fx *f, gpumem_status st) {
  if (f->freed == NULL) return; /* the note failed (out of memory): nothing was freed */
  assert_status(st, GPUMEM_OK);  /* a free never fails for want of host memory */
  const gpumem_stream others[2] = {SB, SA};
  for (int i = 0; i < 2; i++) {
    if (others[i] == f->ticket_s) continue;
    void *q = NULL;
    gpumem_status a = gpumem_alloc(f->ctx, 0, f->freed_n, others[i], &q);
    if (a != GPUMEM_OK) continue; /* (no synchronisation: the pool may not grow past what it has) */
    const uintptr_t p0 = (uintptr_t)f->freed, q0 = (uintptr_t)q;
    if (q0 < p0 + f->freed_n && p0 < q0 + f->freed_n) {
      int done = 0, ordered = 0;
      assert_status(gpumem_sim_stream_done(0, f->ticket_s, f->ticket, &done), GPUMEM_OK);
      assert_status(gpumem_sim_stream_ordered(0, others[i], f->ticket_s, f->ticket, &ordered), GPUMEM_OK);
      if (!done && !ordered) fail_msg("freed block served stream %p while stream %p's work on it ran", others[i], f->ticket_s);
    }
    f->got[f->ngot] = q;
    f->got_s[f->ngot] = others[i];
    f->got_n[f->ngot] = f->freed_n;
    f->ngot++;
  }
  /* once the device can be synchronised again, a trim gives the freed block's memory back */
  gpumem_sim_fail_clear();
  gpumem_sim_complete_all();
  assert_status(gpumem_trim(f->ctx, 0, 0, NULL), GPUMEM_OK);
}

static gpumem_status op_trim(fx *f) {
  assert_status(gpumem_free(f->ctx, f->keep[2], SA), GPUMEM_OK);
  f->freed_mask |= 1u << 2;
  uint64_t released = 0;
  return gpumem_trim(f->ctx, 0, 0, &released);
}

static gpumem_status op_scope(fx *f) {
  gpumem_status st = gpumem_scope_begin(f->ctx, 0, SC, &f->scope);
  for (int i = 0; st == GPUMEM_OK && i < 40; i++) {
    void *p = NULL;
    st = gpumem_scope_alloc(f->scope, (size_t)(i + 1) * 1000, &p);
  }
  return st;
}

static gpumem_status op_graph(fx *f) {
  gpumem_status st = gpumem_graph_pool_create(f->ctx, 0, &f->gp);
  if (st != GPUMEM_OK) {
    f->gp = NULL;
    return st;
  }
  void *p = NULL;
  st = gpumem_graph_pool_alloc(f->gp, 2 << 20, SC, &p);
  if (st == GPUMEM_OK) st = gpumem_free(f->ctx, p, SC);
  return st;
}

static gpumem_status op_stats(fx *f) {
  char buf[8192];
  size_t need = 0;
  gpumem_status st = gpumem_stats_format(f->ctx, -1, GPUMEM_STATS_PROMETHEUS, buf, sizeof buf, &need);
  if (st == GPUMEM_OK) st = gpumem_stats_format(f->ctx, 0, GPUMEM_STATS_JSON, buf, sizeof buf, &need);
  return st;
}

static gpumem_status op_reset(fx *f) {
  gpumem_status st = gpumem_reset(f->ctx, 0, 0);
  f->keep_gone = st == GPUMEM_OK; /* a reset that failed invalidated nothing */
  return st;
}

static void after_reset(fx *f, gpumem_status st) {
  (void)st;
  if (!f->keep_gone) return;
  for (int i = 0; i < NKEEP; i++) /* the pool works: the keep blocks again, for cleanup to free */
    assert_status(gpumem_alloc(f->ctx, 0, f->keep_n[i], i == 1 ? SB : SA, &f->keep[i]), GPUMEM_OK);
}

/* more cached segments than one slab of block structs holds (pool.h, SLAB_N): at a reset that the backend
 * refuses, each stays cached as one free block, with no host memory needed for any of them */
#define MANY_SEGS 160
static void prep_many_segments(fx *f) {
  static void *p[MANY_SEGS];
  for (int i = 0; i < MANY_SEGS; i++) assert_status(gpumem_alloc(f->ctx, 0, 12u << 20, SA, &p[i]), GPUMEM_OK);
  for (int i = 0; i < MANY_SEGS; i++) assert_status(gpumem_free(f->ctx, p[i], SA), GPUMEM_OK);
  gpumem_sim_complete_all();
}

/* Expandable: a lending whose old mappings a trim unmapped only in part, every other unmap failing (a
 * driver failing now and then): the alias ranges left are not adjacent, more of them than the one record
 * the lending had. A reset that the backend refuses to unmap for keeps them parked (gpumem__vm_keep_seg):
 * with no host memory for more records, the last record it has parks the rest and the gaps between them. */
static void prep_lend_split(fx *f) {
  if (!f->expandable) return;
  void *p = NULL, *b = NULL;
  assert_status(gpumem_alloc(f->ctx, 0, 1u << 20, SB, &b), GPUMEM_OK);
  assert_status(got_alloc(f, 64u << 20, SA), GPUMEM_OK);
  assert_status(gpumem_alloc(f->ctx, 0, 128u << 20, SA, &p), GPUMEM_OK);
  assert_status(got_alloc(f, 64u << 20, SA), GPUMEM_OK);
  assert_status(gpumem_free(f->ctx, p, SA), GPUMEM_OK); /* SA's work on it is still queued */
  assert_status(gpumem_free(f->ctx, b, SB), GPUMEM_OK); /* a second stream with frees: stream-ordered */
  const uint64_t before = tu_stats(f->ctx, 0).reserved_bytes;
  assert_status(got_alloc(f, 256u << 20, SA), GPUMEM_OK);
  assert_true(tu_stats(f->ctx, 0).reserved_bytes - before < (256u << 20)); /* it lent p's memory */
  gpumem_sim_complete_all();
  assert_status(gpumem_sim_fail_every(GPUMEM_SIM_CALL_MAP, 2, 2, GPUMEM_SIM_ERR_INJECTED), GPUMEM_OK);
  uint64_t released = 0;
  gpumem_status st = gpumem_trim(f->ctx, 0, 0, &released);
  assert_true(st == GPUMEM_OK || st == GPUMEM_ERR_BACKEND);
  gpumem_sim_fail_clear();
  assert_status(gpumem__check_invariants(f->ctx), GPUMEM_OK);
}

static gpumem_status op_reset_unmaps_fail(fx *f) {
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  return op_reset(f);
}

static void after_reset_lend(fx *f, gpumem_status st) {
  if (f->keep_gone) f->ngot = 0; /* invalidated with the keep blocks */
  after_reset(f, st);
}

/* a capture the library has met is under way (an allocation on its stream went to the graph pool) */
static void prep_capture(fx *f) {
  assert_status(gpumem_graph_pool_create(f->ctx, 0, &f->gp), GPUMEM_OK);
  assert_status(gpumem_sim_stream_begin_capture(0, SC, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_status(gpumem_graph_pool_begin(f->gp, SC), GPUMEM_OK);
  f->capturing = 1;
  void *p = NULL;
  assert_status(gpumem_alloc(f->ctx, 0, 1 << 20, SC, &p), GPUMEM_OK);
  assert_status(gpumem_free(f->ctx, p, SC), GPUMEM_OK);
}

/* during the capture: a free on a stream with no record, and a noted free */
static gpumem_status op_capture_frees(fx *f) {
  f->freed_mask |= 1u << 2;
  assert_status(gpumem_free(f->ctx, f->keep[2], SD), GPUMEM_OK);
  gpumem_status st = gpumem_record_stream(f->ctx, f->keep[1], SD);
  if (st == GPUMEM_OK) {
    f->freed_mask |= 1u << 1;
    assert_status(gpumem_free(f->ctx, f->keep[1], SB), GPUMEM_OK);
  }
  return st;
}

static void after_capture(fx *f, gpumem_status st) {
  (void)st;
  end_capture(f);
}

/* a destroy that must succeed with blocks live (FORCE), a graph pool's too: its annotations end for
 * every live block, with no host memory for the list (checked under valgrind: scripts/valgrind.sh) */
static void prep_destroy(fx *f) {
  f->keeper = tu_ctx_new(NULL);
  assert_status(gpumem_graph_pool_create(f->ctx, 0, &f->gp), GPUMEM_OK);
  void *g = NULL;
  assert_status(gpumem_graph_pool_alloc(f->gp, 1u << 20, SA, &g), GPUMEM_OK);
}

static gpumem_status op_destroy_force(fx *f) {
  gpumem_status st = gpumem_destroy(f->ctx, GPUMEM_DESTROY_FORCE);
  assert_status(st, GPUMEM_OK); /* a forced destroy needs no host memory */
  f->destroyed = 1;
  return st;
}

/* ---------------------------------------------------------------------- */

static void test_create(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  gpumem_context *keeper = tu_ctx_new(NULL); /* the sim's state lives across the failed creations */
  uint64_t k = 0;
  for (; k < MAX_STEPS; k++) {
    gpumem_config cfg;
    tu_config(&cfg);
    gpumem_context *ctx = NULL;
    gpumem__host_fault_arm(k, 1);
    gpumem_status st = gpumem_create(&cfg, &ctx);
    const uint64_t failed = gpumem__host_fault_count();
    gpumem__host_fault_clear();
    if (st != GPUMEM_OK) {
      assert_status(st, GPUMEM_ERR_OUT_OF_MEMORY);
      assert_null(ctx);
      continue;
    }
    void *p;
    assert_status(gpumem_alloc(ctx, 0, 1 << 20, NULL, &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
    assert_status(gpumem_destroy(ctx, 0), GPUMEM_OK);
    if (failed == 0) break;
  }
  assert_true(k > 0 && k < MAX_STEPS);
  tu_ctx_done(keeper);
}

#define SCENARIO_TEST(fn, ...)                        \
  static void fn(void **state) {                      \
    (void)state;                                      \
    TU_REQUIRE_SIM();                                 \
    static const scenario sc = {__VA_ARGS__};         \
    sweep_all(&sc);                                   \
  }

SCENARIO_TEST(test_alloc, "alloc", op_alloc, after_alloc, 0, 0, 0, 1, NULL)
SCENARIO_TEST(test_alloc_no_sync, "alloc, no synchronisation", op_alloc, after_alloc, 1, 0, 1, 1, NULL)
SCENARIO_TEST(test_free_new_stream, "free on a new stream", op_free_new_stream, after_free, 0, 0, 1, 1, NULL)
SCENARIO_TEST(test_free_new_stream_no_sync, "free on a new stream, no synchronisation", op_free_new_stream, after_free, 1, 0, 1, 1, NULL)
SCENARIO_TEST(test_noted_free, "noted free", op_noted_free, after_free, 0, 0, 1, 1, NULL)
SCENARIO_TEST(test_noted_free_no_sync, "noted free, no synchronisation", op_noted_free, after_free, 1, 0, 1, 1, NULL)
SCENARIO_TEST(test_trim, "trim", op_trim, NULL, 0, 0, 0, 0, NULL)
SCENARIO_TEST(test_scope, "scope", op_scope, NULL, 0, 0, 0, 1, NULL)
SCENARIO_TEST(test_graph_pool, "graph pool", op_graph, NULL, 0, 0, 0, 1, NULL)
SCENARIO_TEST(test_stats_format, "stats format", op_stats, NULL, 0, 0, 0, 0, NULL)
SCENARIO_TEST(test_reset, "reset", op_reset, after_reset, 0, 0, 0, 0, NULL)
SCENARIO_TEST(test_reset_free_fails, "reset, the backend refusing frees", op_reset, after_reset, 0, 1, 0, 0, NULL)
SCENARIO_TEST(test_reset_many_free_fails, "reset of many segments, the backend refusing frees", op_reset, after_reset, 0,
              1, 0, 0, prep_many_segments)
SCENARIO_TEST(test_reset_split_alias, "reset keeping alias ranges split by failed unmaps", op_reset_unmaps_fail,
              after_reset_lend, 0, 1, 1, 0, prep_lend_split)
SCENARIO_TEST(test_destroy_force, "forced destroy with live blocks", op_destroy_force, NULL, 0, 0, 0, 0, prep_destroy)
SCENARIO_TEST(test_capture_frees, "frees during a capture", op_capture_frees, after_capture, 0, 0, 1, 1, prep_capture)

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_create),
      TU_TEST(test_alloc),
      TU_TEST(test_alloc_no_sync),
      TU_TEST(test_free_new_stream),
      TU_TEST(test_free_new_stream_no_sync),
      TU_TEST(test_noted_free),
      TU_TEST(test_noted_free_no_sync),
      TU_TEST(test_trim),
      TU_TEST(test_scope),
      TU_TEST(test_graph_pool),
      TU_TEST(test_stats_format),
      TU_TEST(test_reset),
      TU_TEST(test_capture_frees),
      TU_TEST(test_reset_free_fails),
      TU_TEST(test_reset_many_free_fails),
      TU_TEST(test_reset_split_alias),
      TU_TEST(test_destroy_force),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
