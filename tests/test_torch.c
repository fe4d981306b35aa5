/* Framework entry points on the process-wide context. */
#include "testutil.h"

static void test_torch_alloc_free(void **state) {
  (void)state;
  gpumem_context *g = NULL, *g2 = NULL;
  assert_status(gpumem_global_context(&g), GPUMEM_OK);
  assert_non_null(g);
  assert_status(gpumem_global_context(&g2), GPUMEM_OK);
  assert_ptr_equal(g, g2);
  assert_status(gpumem_global_context(NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_stats before = tu_stats(g, GPUMEM_ALL_DEVICES);
  void *p[16];
  size_t sz[16];
  for (int i = 0; i < 16; i++) {
    sz[i] = (size_t)1 << (i + 4);
    p[i] = gpumem_torch_alloc(sz[i], 0, NULL);
    assert_non_null(p[i]);
    assert_int_equal((uintptr_t)p[i] % 256, 0);
    tu_stamp(p[i], sz[i], (uint32_t)i);
  }
  assert_int_equal(tu_find_overlap(p, sz, 16), -1);
  gpumem_stats mid = tu_stats(g, GPUMEM_ALL_DEVICES);
  assert_true(mid.num_live == before.num_live + 16);
  for (int i = 0; i < 16; i++) {
    assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
    size_t got = 0;
    assert_status(gpumem_ptr_info(g, p[i], &got, NULL), GPUMEM_OK);
    assert_int_equal(got, sz[i]);
    gpumem_torch_free(p[i], sz[i], 0, NULL);
  }
  gpumem_stats after = tu_stats(g, GPUMEM_ALL_DEVICES);
  assert_true(after.num_live == before.num_live);
  /* absurd requests give NULL, bad devices too; nothing crashes */
  assert_null(gpumem_torch_alloc(SIZE_MAX, 0, NULL));
  assert_null(gpumem_torch_alloc(SIZE_MAX - 100, 0, NULL));
  assert_null(gpumem_torch_alloc((size_t)1 << 60, 0, NULL));
  assert_null(gpumem_torch_alloc(1024, 9999, NULL));
  assert_null(gpumem_torch_alloc(1024, -5, NULL));
  gpumem_torch_free(NULL, 0, 0, NULL);
  gpumem_stats end = tu_stats(g, GPUMEM_ALL_DEVICES);
  tu_assert_stats_sane(&end);
  assert_true(end.num_live == before.num_live);
  /* the global context stays (process lifetime): release its cache */
  assert_status(gpumem_trim(g, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  if (tu_is_sim()) assert_true(tu_sim_used_total() == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_torch_alloc_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
