/* Wrong use of gpumem_free: foreign, interior, double, other context; nothing changes after an invalid free. */
#include "testutil.h"

/* Free bad, expect INVALID_POINTER, and check that nothing changed. */
static void expect_invalid_free(gpumem_context *ctx, void *bad, gpumem_stream stream, void *live, size_t live_size,
                                uint32_t live_stamp) {
  gpumem_stats before = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  uint64_t used = tu_is_sim() ? tu_sim_used_total() : 0;
  gpumem_status s = gpumem_free(ctx, bad, stream);
  if (s != GPUMEM_ERR_INVALID_POINTER) {
    print_error("gpumem_free(%p) gave %s, expected GPUMEM_ERR_INVALID_POINTER\n", bad, gpumem_status_name(s));
    fail();
  }
  gpumem_stats after = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  tu_assert_stats_equal(&before, &after);
  if (tu_is_sim()) assert_true(tu_sim_used_total() == used);
  if (live) {
    assert_true(tu_stamp_ok(live, live_size, live_stamp));
    size_t sz = 0;
    assert_status(gpumem_ptr_info(ctx, live, &sz, NULL), GPUMEM_OK);
    assert_int_equal(sz, live_size);
  }
}

static void test_foreign_pointers(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *live = NULL;
  const size_t n = 3 * TU_MiB + 17;
  assert_status(gpumem_alloc(ctx, 0, n, NULL, &live), GPUMEM_OK);
  tu_stamp(live, n, 9);
  int on_stack = 0;
  void *heap = malloc(4096);
  assert_non_null(heap);
  expect_invalid_free(ctx, &on_stack, NULL, live, n, 9);
  expect_invalid_free(ctx, heap, NULL, live, n, 9);
  expect_invalid_free(ctx, (void *)(uintptr_t)0x1000, NULL, live, n, 9);
  expect_invalid_free(ctx, (void *)(uintptr_t)0x100, (gpumem_stream)0x7, live, n, 9);
  expect_invalid_free(ctx, (void *)(uintptr_t)UINTPTR_MAX, NULL, live, n, 9);
  expect_invalid_free(ctx, (void *)((uintptr_t)UINTPTR_MAX & ~(uintptr_t)255), NULL, live, n, 9);
  free(heap);
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_interior_pointers(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a = NULL, *b = NULL;
  const size_t n = 1 * TU_MiB;
  assert_status(gpumem_alloc(ctx, 0, n, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, n, NULL, &b), GPUMEM_OK);
  tu_stamp(a, n, 1);
  char *ca = (char *)a;
  expect_invalid_free(ctx, ca + 1, NULL, a, n, 1);
  expect_invalid_free(ctx, ca + 256, NULL, a, n, 1);
  expect_invalid_free(ctx, ca + 4096, NULL, a, n, 1);
  expect_invalid_free(ctx, ca + n - 1, NULL, a, n, 1);
  expect_invalid_free(ctx, ca - 256, NULL, a, n, 1);
  /* just past the end of the last block handed out: a free part of a segment, or nothing */
  if ((char *)b + n != ca) expect_invalid_free(ctx, (char *)b + n, NULL, a, n, 1);
  size_t sz = 0;
  assert_status(gpumem_ptr_info(ctx, ca + 256, &sz, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_double_free(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *keep = NULL, *a = NULL, *b = NULL;
  assert_status(gpumem_alloc(ctx, 0, 5000, NULL, &keep), GPUMEM_OK);
  tu_stamp(keep, 5000, 5);
  assert_status(gpumem_alloc(ctx, 0, 100000, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  expect_invalid_free(ctx, a, NULL, keep, 5000, 5);
  expect_invalid_free(ctx, a, (gpumem_stream)0x3, keep, 5000, 5);
  /* a freed block coalesced with its neighbour: still invalid */
  assert_status(gpumem_alloc(ctx, 0, 100000, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 100000, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  expect_invalid_free(ctx, b, NULL, keep, 5000, 5);
  expect_invalid_free(ctx, a, NULL, keep, 5000, 5);
  /* after a trim the memory is gone from the pool: still invalid */
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  expect_invalid_free(ctx, a, NULL, keep, 5000, 5);
  /* the same address handed out again is valid exactly once */
  void *c = NULL;
  assert_status(gpumem_alloc(ctx, 0, 100000, NULL, &c), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  expect_invalid_free(ctx, c, NULL, keep, 5000, 5);
  assert_status(gpumem_free(ctx, keep, NULL), GPUMEM_OK);
  expect_invalid_free(ctx, keep, NULL, NULL, 0, 0);
  tu_ctx_done(ctx);
}

static void test_other_context(void **state) {
  (void)state;
  gpumem_context *a = tu_ctx_new(NULL), *b = tu_ctx_new(NULL);
  void *pa = NULL, *pb = NULL;
  assert_status(gpumem_alloc(a, 0, 2 * TU_MiB, NULL, &pa), GPUMEM_OK);
  assert_status(gpumem_alloc(b, 0, 2 * TU_MiB, NULL, &pb), GPUMEM_OK);
  tu_stamp(pa, 2 * TU_MiB, 11);
  tu_stamp(pb, 2 * TU_MiB, 12);
  expect_invalid_free(b, pa, NULL, pb, 2 * TU_MiB, 12);
  expect_invalid_free(a, pb, NULL, pa, 2 * TU_MiB, 11);
  assert_status(gpumem_ptr_info(b, pa, NULL, NULL), GPUMEM_ERR_INVALID_POINTER);
  /* and the owners still free them */
  assert_true(tu_stamp_ok(pa, 2 * TU_MiB, 11));
  assert_status(gpumem_free(a, pa, NULL), GPUMEM_OK);
  assert_status(gpumem_free(b, pb, NULL), GPUMEM_OK);
  /* a pointer of a destroyed context is foreign */
  void *pc = NULL;
  assert_status(gpumem_alloc(a, 0, 4096, NULL, &pc), GPUMEM_OK);
  assert_status(gpumem_free(a, pc, NULL), GPUMEM_OK);
  tu_ctx_done(a);
  expect_invalid_free(b, pc, NULL, NULL, 0, 0);
  tu_ctx_done(b);
}

static void test_scope_pointers_are_validated(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_scope *sc = NULL;
  void *p = NULL;
  assert_status(gpumem_scope_begin(ctx, 0, NULL, &sc), GPUMEM_OK);
  assert_status(gpumem_scope_alloc(sc, 8192, &p), GPUMEM_OK);
  expect_invalid_free(ctx, (char *)p + 256, NULL, NULL, 0, 0);
  assert_status(gpumem_scope_end(sc), GPUMEM_OK);
  expect_invalid_free(ctx, p, NULL, NULL, 0, 0);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_foreign_pointers), TU_TEST(test_interior_pointers), TU_TEST(test_double_free),
      TU_TEST(test_other_context),    TU_TEST(test_scope_pointers_are_validated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
