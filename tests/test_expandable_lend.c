/* Lending (src/expandable.c, src/vmseg.c "Lending"): in an expandable pool with several streams, a
 * stream's request that would grow the pool past its peak takes the memory of the stream's own free
 * blocks whose queued work may still use them, mapped a second time under the new block, instead
 * of new memory. The lending block serves nobody, its own stream included, until the stream's work
 * queued up to the request has completed; then its old mappings go and its range is READY.
 * The sim's delayed mode keeps the stream's work pending until the test completes it.
 * Checked: the memory held, the lending block's range kept from every allocation while pending,
 * invariants and the sim's memory at every step, a reset, a destroy and trims while a lent block
 * is pending, and the error paths (no event, a failing map): no lending, nothing lost. */
#include <stdint.h>
#include <string.h>

#include "gpumem/sim.h"
#include "testutil.h"

gpumem_status gpumem__check_invariants(gpumem_context *ctx);

#define SA ((gpumem_stream)(uintptr_t)0xA0)
#define SB ((gpumem_stream)(uintptr_t)0xB0)
#define MIB ((size_t)1 << 20)

static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

static gpumem_context *ctx_new(void) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.expandable = 1;
  cfg.flags |= GPUMEM_CONFIG_NO_ENV;
  return tu_ctx_new(&cfg);
}

static uint64_t reserved(gpumem_context *ctx) { return tu_stats(ctx, 0).reserved_bytes; }

/* The pool holds exactly what the sim device has handed out, and its invariants hold. */
static void check_held(gpumem_context *ctx) {
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  assert_int_equal(reserved(ctx), tu_sim_used(0));
}

/* The scene: two streams (so frees are stream-ordered); on A, a 128 MiB block p between two live
 * blocks, freed while A's work is pending; then A asks for 256 MiB (r), past the pool's peak. */
typedef struct scene {
  gpumem_context *ctx;
  void *lo, *p, *hi, *r;
  uint64_t held_before; /* reserved before r */
} scene;

static void scene_begin(scene *s) {
  memset(s, 0, sizeof *s);
  s->ctx = ctx_new();
  gpumem_sim_set_delayed(1);
  void *b;
  assert_status(gpumem_alloc(s->ctx, 0, MIB, SB, &b), GPUMEM_OK); /* a second stream */
  assert_status(gpumem_free(s->ctx, b, SB), GPUMEM_OK);
  assert_status(gpumem_alloc(s->ctx, 0, 64 * MIB, SA, &s->lo), GPUMEM_OK);
  assert_status(gpumem_alloc(s->ctx, 0, 128 * MIB, SA, &s->p), GPUMEM_OK);
  assert_status(gpumem_alloc(s->ctx, 0, 64 * MIB, SA, &s->hi), GPUMEM_OK);
  assert_status(gpumem_free(s->ctx, s->p, SA), GPUMEM_OK); /* A's work on it is still queued */
  check_held(s->ctx);
  s->held_before = reserved(s->ctx);
}

/* Frees what the scene left live (r when set), then the context must end with nothing held. */
static void scene_end(scene *s) {
  gpumem_sim_set_delayed(0);
  gpumem_sim_complete_all();
  if (s->r != NULL) assert_status(gpumem_free(s->ctx, s->r, SA), GPUMEM_OK);
  assert_status(gpumem_free(s->ctx, s->lo, SA), GPUMEM_OK);
  assert_status(gpumem_free(s->ctx, s->hi, SA), GPUMEM_OK);
  check_held(s->ctx);
  tu_ctx_done(s->ctx);
  gpumem_sim_fail_clear();
}

/* The 128 MiB freed on A serves A's 256 MiB request: the pool grows by about half of it. */
static void test_lend_serves_own_stream(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  uint64_t maps0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  check_held(s.ctx);
  uint64_t grew = reserved(s.ctx) - s.held_before;
  assert_true(grew <= 140 * MIB); /* without lending: 256 MiB */
  assert_true(grew >= 128 * MIB);
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) > maps0);
  assert_false(overlaps(s.r, 256 * MIB, s.p, 128 * MIB));
  /* while A's work is pending, p's range serves nobody, A included */
  void *q[6];
  for (int i = 0; i < 6; i++) {
    gpumem_stream st = i % 2 ? SB : SA;
    assert_status(gpumem_alloc(s.ctx, 0, (size_t)(i + 1) * 16 * MIB, st, &q[i]), GPUMEM_OK);
    assert_false(overlaps(q[i], (size_t)(i + 1) * 16 * MIB, s.p, 128 * MIB));
    check_held(s.ctx);
  }
  for (int i = 0; i < 6; i++) assert_status(gpumem_free(s.ctx, q[i], i % 2 ? SB : SA), GPUMEM_OK);
  /* A's work completes: the next allocation that needs memory finds p's range READY again */
  gpumem_sim_stream_complete(0, SA);
  gpumem_sim_stream_complete(0, SB);
  void *w;
  assert_status(gpumem_alloc(s.ctx, 0, 128 * MIB, SB, &w), GPUMEM_OK);
  check_held(s.ctx);
  gpumem_stats st = tu_stats(s.ctx, 0);
  assert_int_equal(st.allocated_bytes, 64 * MIB + 64 * MIB + 256 * MIB + 128 * MIB);
  assert_status(gpumem_free(s.ctx, w, SB), GPUMEM_OK);
  scene_end(&s);
}

/* A request on another stream never takes A's pending memory: B grows by all it asks. */
static void test_lend_only_own_stream(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SB, &s.r), GPUMEM_OK);
  check_held(s.ctx);
  assert_true(reserved(s.ctx) - s.held_before >= 256 * MIB);
  assert_false(overlaps(s.r, 256 * MIB, s.p, 128 * MIB));
  scene_end(&s);
}

/* A reset and a destroy while the lending block waits: everything is given back. */
static void test_lend_reset_destroy_pending(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  gpumem_context *keeper = ctx_new(); /* keeps the sim device while s.ctx is destroyed */
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  assert_true(reserved(s.ctx) - s.held_before < 256 * MIB);
  assert_status(gpumem_reset(s.ctx, 0, 0), GPUMEM_OK);
  check_held(s.ctx);
  assert_int_equal(reserved(s.ctx), 0);
  assert_int_equal(tu_sim_used(0), 0);
  /* and once more, destroyed with it pending */
  void *b;
  assert_status(gpumem_alloc(s.ctx, 0, MIB, SB, &b), GPUMEM_OK);
  assert_status(gpumem_alloc(s.ctx, 0, 128 * MIB, SA, &s.p), GPUMEM_OK);
  assert_status(gpumem_alloc(s.ctx, 0, 64 * MIB, SA, &s.hi), GPUMEM_OK);
  assert_status(gpumem_free(s.ctx, s.p, SA), GPUMEM_OK);
  uint64_t h0 = reserved(s.ctx);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  assert_true(reserved(s.ctx) - h0 < 256 * MIB);
  check_held(s.ctx);
  tu_ctx_forget(s.ctx);
  assert_status(gpumem_destroy(s.ctx, GPUMEM_DESTROY_FORCE), GPUMEM_OK);
  assert_int_equal(tu_sim_used(0), 0);
  gpumem_sim_set_delayed(0);
  gpumem_sim_complete_all();
  tu_ctx_done(keeper);
}

/* No event can be recorded: nothing is lent (the pool grows as before), nothing is lost. */
static void test_lend_no_event(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INVALID_VALUE, 1), GPUMEM_OK);
  gpumem_status st = gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r);
  gpumem_sim_fail_clear();
  if (st == GPUMEM_OK) {
    assert_true(reserved(s.ctx) - s.held_before >= 256 * MIB);
  } else {
    s.r = NULL;
    assert_int_equal(reserved(s.ctx), s.held_before); /* refused with a status: nothing changed */
  }
  check_held(s.ctx);
  scene_end(&s);
}

/* The second map fails: what was lent stays lent, the rest is new memory, the block is whole. */
static void test_lend_map_fails(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 2, GPUMEM_SIM_ERR_INVALID_VALUE, 0), GPUMEM_OK);
  gpumem_status st = gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r);
  gpumem_sim_fail_clear();
  check_held(s.ctx);
  if (st == GPUMEM_OK) {
    uint64_t grew = reserved(s.ctx) - s.held_before;
    assert_true(grew < 256 * MIB && grew > 140 * MIB); /* the first chunk was lent, the rest is new */
    tu_stamp(s.r, 256 * MIB, 7);
    assert_true(tu_stamp_ok(s.r, 256 * MIB, 7));
  } else {
    s.r = NULL;
  }
  gpumem_sim_complete_all();
  void *w;
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SB, &w), GPUMEM_OK);
  check_held(s.ctx);
  assert_status(gpumem_free(s.ctx, w, SB), GPUMEM_OK);
  scene_end(&s);
}

/* Trims while the lending block waits, and after the borrower is freed with it still waiting:
 * each returns OK, the lent memory stays under the borrower (its data intact), the pool holds
 * exactly what the sim device handed out, and once the stream's work is done a trim gives back
 * everything that is not live. */
static void test_lend_trim_pending(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  assert_true(reserved(s.ctx) - s.held_before < 256 * MIB); /* it lent */
  tu_stamp(s.r, 256 * MIB, 11);
  uint64_t released = 0;
  assert_status(gpumem_trim(s.ctx, 0, 0, &released), GPUMEM_OK);
  check_held(s.ctx);
  assert_true(tu_stamp_ok(s.r, 256 * MIB, 11));
  assert_true(reserved(s.ctx) >= 64 * MIB + 64 * MIB + 256 * MIB);
  /* the borrower freed on its stream while the lending block still waits */
  assert_status(gpumem_free(s.ctx, s.r, SA), GPUMEM_OK);
  s.r = NULL;
  assert_status(gpumem_trim(s.ctx, 0, 0, &released), GPUMEM_OK);
  check_held(s.ctx);
  /* the stream's work done: nothing but lo and hi is held after a trim */
  gpumem_sim_complete_all();
  assert_status(gpumem_trim(s.ctx, 0, 0, &released), GPUMEM_OK);
  check_held(s.ctx);
  assert_int_equal(reserved(s.ctx), 64 * MIB + 64 * MIB);
  /* the pool still serves: a block over the old ranges keeps its data */
  void *w;
  assert_status(gpumem_alloc(s.ctx, 0, 384 * MIB, SB, &w), GPUMEM_OK);
  tu_stamp(w, 384 * MIB, 12);
  assert_true(tu_stamp_ok(w, 384 * MIB, 12));
  check_held(s.ctx);
  assert_status(gpumem_free(s.ctx, w, SB), GPUMEM_OK);
  scene_end(&s);
}

/* The stream's work done, a trim unmaps the lending block's old mappings, and the second unmap fails:
 * the block stays parked (its range serves nobody, though part of it is no longer mapped) until a
 * later synchronisation unmaps the rest; then it is READY and nothing is lost. */
static void test_lend_unlend_fails_half_way(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  assert_true(reserved(s.ctx) - s.held_before < 256 * MIB); /* it lent */
  gpumem_sim_complete_all();
  uint64_t maps0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 2, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  uint64_t released = 0;
  gpumem_status st = gpumem_trim(s.ctx, 0, 0, &released);
  assert_true(st == GPUMEM_OK || st == GPUMEM_ERR_BACKEND);
  gpumem_sim_fail_clear();
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP) >= maps0 + 2); /* the failed unmap was made */
  check_held(s.ctx);
  void *q[4];
  for (int i = 0; i < 4; i++) {
    assert_status(gpumem_alloc(s.ctx, 0, 32 * MIB, i % 2 ? SB : SA, &q[i]), GPUMEM_OK);
    assert_false(overlaps(q[i], 32 * MIB, s.p, 128 * MIB));
    check_held(s.ctx);
  }
  for (int i = 0; i < 4; i++) assert_status(gpumem_free(s.ctx, q[i], i % 2 ? SB : SA), GPUMEM_OK);
  /* a synchronising trim with the backend working: the rest is unmapped, the range is READY */
  assert_status(gpumem_trim(s.ctx, 0, 0, &released), GPUMEM_OK);
  check_held(s.ctx);
  assert_int_equal(reserved(s.ctx), 64 * MIB + 256 * MIB + 64 * MIB);
  void *w;
  assert_status(gpumem_alloc(s.ctx, 0, 128 * MIB, SB, &w), GPUMEM_OK);
  check_held(s.ctx);
  assert_status(gpumem_free(s.ctx, w, SB), GPUMEM_OK);
  scene_end(&s);
}

/* A reset while the lending block waits, every unmap failing: the pool keeps its space (the reset
 * itself succeeds: every allocation is invalidated, the memory stays cached). The lending block's
 * range still maps the memory now mapped under r's old range as well: it must serve no allocation
 * while the second mapping lasts, or two blocks would share memory (a fuzzer input found allocated
 * bytes above reserved ones). Once the backend works again, a synchronising trim unmaps it, the
 * range serves again and everything goes back. */
static void test_lend_reset_unmap_fails(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  assert_true(reserved(s.ctx) - s.held_before < 256 * MIB); /* it lent */
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_reset(s.ctx, 0, 0), GPUMEM_OK);
  check_held(s.ctx);
  uint64_t held = reserved(s.ctx);
  assert_true(held > 0);
  assert_int_equal(tu_stats(s.ctx, 0).allocated_bytes, 0);
  /* with maps failing, what is mapped serves: never the aliased range, never more than is held */
  void *q[64];
  int n = 0;
  for (; n < 64; n++) {
    if (gpumem_alloc(s.ctx, 0, 16 * MIB, n % 2 ? SB : SA, &q[n]) != GPUMEM_OK) break;
    assert_false(overlaps(q[n], 16 * MIB, s.p, 128 * MIB));
    check_held(s.ctx);
    gpumem_stats st = tu_stats(s.ctx, 0);
    assert_true(st.allocated_bytes <= st.reserved_bytes);
  }
  assert_true(n >= 8); /* lo, hi and r's old ranges: 64 + 64 + 256 MiB, less what the alias holds */
  assert_true((uint64_t)n * 16 * MIB <= held);
  for (int i = 0; i < n; i++) assert_status(gpumem_free(s.ctx, q[i], i % 2 ? SB : SA), GPUMEM_OK);
  /* the backend works again: a trim synchronises, unmaps the alias and gives back what is cached */
  gpumem_sim_fail_clear();
  gpumem_sim_set_delayed(0);
  gpumem_sim_complete_all();
  uint64_t released = 0;
  assert_status(gpumem_trim(s.ctx, 0, 0, &released), GPUMEM_OK);
  check_held(s.ctx);
  assert_int_equal(reserved(s.ctx), 0);
  void *w;
  assert_status(gpumem_alloc(s.ctx, 0, 384 * MIB, SB, &w), GPUMEM_OK);
  check_held(s.ctx);
  assert_status(gpumem_free(s.ctx, w, SB), GPUMEM_OK);
  tu_ctx_done(s.ctx);
}

/* The same reset with unmaps failing, then a destroy while they still fail: the destroy gives up on
 * the space without a leak of the pool's own records (the sanitizer builds check) or a crash. */
static void test_lend_reset_then_destroy_unmap_fails(void **state) {
  (void)state;
  scene s;
  scene_begin(&s);
  assert_status(gpumem_alloc(s.ctx, 0, 256 * MIB, SA, &s.r), GPUMEM_OK);
  assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_status(gpumem_reset(s.ctx, 0, 0), GPUMEM_OK);
  check_held(s.ctx);
  tu_ctx_forget(s.ctx);
  (void)gpumem_destroy(s.ctx, GPUMEM_DESTROY_FORCE);
  gpumem_sim_fail_clear();
  gpumem_sim_set_delayed(0);
  gpumem_sim_complete_all();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lend_serves_own_stream, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_only_own_stream, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_reset_destroy_pending, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_no_event, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_map_fails, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_trim_pending, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_unlend_fails_half_way, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_reset_unmap_fails, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_lend_reset_then_destroy_unmap_fails, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
