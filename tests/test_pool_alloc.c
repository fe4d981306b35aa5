/* Allocation: alignment, size 0, free NULL, contents, many sizes, no overlap, failure leaves *out alone, overflow. */
#include "testutil.h"

static void test_alignment(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  enum { N = 200 };
  void *p[N];
  size_t sz[N];
  uint64_t rng = 1;
  for (int i = 0; i < N; i++) {
    sz[i] = (size_t)tu_rand_range(&rng, 1, 70000);
    assert_status(gpumem_alloc(ctx, 0, sz[i], NULL, &p[i]), GPUMEM_OK);
    assert_non_null(p[i]);
    assert_int_equal((uintptr_t)p[i] % 256, 0);
  }
  assert_int_equal(tu_find_overlap(p, sz, N), -1);
  for (int i = 0; i < N; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_size_zero_and_free_null(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_stats before = tu_stats(ctx, 0);
  void *p = (void *)0x1234;
  assert_status(gpumem_alloc(ctx, 0, 0, NULL, &p), GPUMEM_OK);
  assert_null(p);
  p = (void *)0x1234;
  assert_status(gpumem_alloc_tagged(ctx, 0, 0, NULL, "zero", &p), GPUMEM_OK);
  assert_null(p);
  assert_status(gpumem_free(ctx, NULL, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, NULL, (gpumem_stream)0x99), GPUMEM_OK);
  gpumem_stats after = tu_stats(ctx, 0);
  /* size 0 is not an allocation, free(NULL) is not a free */
  tu_assert_stats_equal(&before, &after);
  if (tu_is_sim()) assert_true(tu_sim_used(0) == 0);
  tu_ctx_done(ctx);
}

static void test_contents_and_ptr_info(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  enum { N = 64 };
  void *p[N];
  size_t sz[N];
  uint64_t rng = 7;
  for (int i = 0; i < N; i++) {
    sz[i] = (size_t)tu_rand_range(&rng, 1, 3 * TU_MiB);
    assert_status(gpumem_alloc(ctx, 0, sz[i], NULL, &p[i]), GPUMEM_OK);
    tu_stamp(p[i], sz[i], (uint32_t)i);
  }
  assert_int_equal(tu_find_overlap(p, sz, N), -1);
  /* free every other one, reallocate, stamp again: nobody's contents change */
  for (int i = 0; i < N; i += 2) {
    assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
    assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  }
  for (int i = 0; i < N; i += 2) {
    sz[i] = (size_t)tu_rand_range(&rng, 1, 3 * TU_MiB);
    assert_status(gpumem_alloc(ctx, 0, sz[i], NULL, &p[i]), GPUMEM_OK);
    tu_stamp(p[i], sz[i], (uint32_t)(1000 + i));
  }
  assert_int_equal(tu_find_overlap(p, sz, N), -1);
  for (int i = 0; i < N; i++) {
    uint32_t stamp = (i % 2 == 0) ? (uint32_t)(1000 + i) : (uint32_t)i;
    if (!tu_stamp_ok(p[i], sz[i], stamp)) {
      print_error("block %d (%zu bytes at %p) lost its contents\n", i, sz[i], p[i]);
      fail();
    }
    size_t got = 0;
    int dev = -1;
    assert_status(gpumem_ptr_info(ctx, p[i], &got, &dev), GPUMEM_OK);
    assert_int_equal(got, sz[i]); /* the requested size */
    assert_int_equal(dev, 0);
    assert_status(gpumem_ptr_info(ctx, p[i], NULL, NULL), GPUMEM_OK);
  }
  for (int i = 0; i < N; i++) assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  /* freed pointers are unknown */
  size_t got = 5;
  assert_status(gpumem_ptr_info(ctx, p[0], &got, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_int_equal(got, 5);
  gpumem_status s = gpumem_ptr_info(ctx, NULL, &got, NULL);
  assert_true(s == GPUMEM_ERR_INVALID_POINTER || s == GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(got, 5);
  tu_ctx_done(ctx);
}

static void test_many_sizes(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  /* 1 B .. 1 GiB: powers of two and their neighbours, all live at once */
  enum { MAXN = 100 };
  void *p[MAXN];
  size_t sz[MAXN];
  int n = 0;
  for (int b = 0; b <= 30; b++) {
    size_t base = (size_t)1 << b;
    const size_t cand[3] = {base - 1, base, base + 1};
    for (int k = 0; k < 3; k++) {
      if (cand[k] == 0 || (b == 30 && k != 1)) continue;
      if (b >= 28 && k != 1) continue; /* keep the total reasonable on a real GPU */
      sz[n] = cand[k];
      assert_status(gpumem_alloc(ctx, 0, sz[n], NULL, &p[n]), GPUMEM_OK);
      assert_non_null(p[n]);
      assert_int_equal((uintptr_t)p[n] % 256, 0);
      tu_stamp(p[n], sz[n], (uint32_t)n);
      n++;
    }
  }
  assert_int_equal(tu_find_overlap(p, sz, (size_t)n), -1);
  gpumem_stats st = tu_stats(ctx, 0);
  tu_assert_stats_sane(&st);
  uint64_t req = 0;
  for (int i = 0; i < n; i++) req += sz[i];
  assert_true(st.requested_bytes == req);
  assert_true(st.allocated_bytes >= req);
  assert_true(st.num_live == (uint64_t)n);
  if (tu_is_sim()) assert_true(tu_sim_used(0) >= st.reserved_bytes);
  for (int i = 0; i < n; i++) {
    assert_true(tu_stamp_ok(p[i], sz[i], (uint32_t)i));
    assert_status(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  }
  st = tu_stats(ctx, 0);
  assert_true(st.allocated_bytes == 0 && st.num_live == 0 && st.requested_bytes == 0);
  tu_ctx_done(ctx);
}

static void test_failure_leaves_out_untouched(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *keep = NULL;
  assert_status(gpumem_alloc(ctx, 0, 1000, NULL, &keep), GPUMEM_OK);
  tu_stamp(keep, 1000, 42);
  gpumem_stats before = tu_stats(ctx, 0);

  /* absurd sizes: the device cannot have them */
  const size_t absurd[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 255, SIZE_MAX - 256, SIZE_MAX / 2 + 1,
                           (size_t)1 << 62, (size_t)1 << 50};
  for (size_t i = 0; i < sizeof absurd / sizeof absurd[0]; i++) {
    void *p = (void *)0x5150;
    gpumem_status s = gpumem_alloc(ctx, 0, absurd[i], NULL, &p);
    if (s != GPUMEM_ERR_OUT_OF_MEMORY && s != GPUMEM_ERR_INVALID_ARGUMENT) {
      print_error("alloc(%zu) gave %s\n", absurd[i], gpumem_status_name(s));
      fail();
    }
    assert_ptr_equal(p, (void *)0x5150);
    s = gpumem_alloc_tagged(ctx, 0, absurd[i], NULL, "absurd", &p);
    assert_true(s == GPUMEM_ERR_OUT_OF_MEMORY || s == GPUMEM_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(p, (void *)0x5150);
  }
  gpumem_stats after = tu_stats(ctx, 0);
  tu_assert_stats_sane(&after);
  /* nothing else changed: the live block and the allocated figures */
  assert_true(after.allocated_bytes == before.allocated_bytes);
  assert_true(after.num_allocs == before.num_allocs);
  assert_true(after.num_live == before.num_live);
  assert_true(tu_stamp_ok(keep, 1000, 42));
  /* and the context still works */
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 0, 5000, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, keep, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_device_capacity_exhausted(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "64MiB");
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, 0, 65 * TU_MiB, NULL, &p), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(p, (void *)0x1);
  /* fill it with 1 MiB blocks until it says no */
  void *blk[128];
  size_t sz[128];
  int n = 0;
  gpumem_status s = GPUMEM_OK;
  while (n < 128) {
    sz[n] = TU_MiB;
    s = gpumem_alloc(ctx, 0, TU_MiB, NULL, &blk[n]);
    if (s != GPUMEM_OK) break;
    n++;
  }
  assert_status(s, GPUMEM_ERR_OUT_OF_MEMORY);
  assert_true(n >= 32 && n <= 64); /* most of the device is usable */
  assert_int_equal(tu_find_overlap(blk, sz, (size_t)n), -1);
  gpumem_stats st = tu_stats(ctx, 0);
  tu_assert_stats_sane(&st);
  assert_true(st.reserved_bytes <= 64 * TU_MiB);
  for (int i = 0; i < n; i++) assert_status(gpumem_free(ctx, blk[i], NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_reuse_after_free(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *p = NULL, *q = NULL;
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &p), GPUMEM_OK);
  gpumem_stats s1 = tu_stats(ctx, 0);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  /* the cache serves the same request again without the backend */
  assert_status(gpumem_alloc(ctx, 0, 4 * TU_MiB, NULL, &q), GPUMEM_OK);
  gpumem_stats s2 = tu_stats(ctx, 0);
  assert_true(s2.num_backend_allocs == s1.num_backend_allocs);
  assert_true(s2.reserved_bytes == s1.reserved_bytes);
  assert_true(s2.num_allocs == 2 && s2.num_frees == 1 && s2.num_live == 1);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_alignment),
      TU_TEST(test_size_zero_and_free_null),
      TU_TEST(test_contents_and_ptr_info),
      TU_TEST(test_many_sizes),
      TU_TEST(test_failure_leaves_out_untouched),
      TU_TEST(test_device_capacity_exhausted),
      TU_TEST(test_reuse_after_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
