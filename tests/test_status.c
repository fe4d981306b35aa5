/* Status names and messages: every status, out-of-range values. */
#include "testutil.h"

static const struct {
  gpumem_status s;
  const char *name;
} k_names[] = {
    {GPUMEM_OK, "GPUMEM_OK"},
    {GPUMEM_ERR_INVALID_ARGUMENT, "GPUMEM_ERR_INVALID_ARGUMENT"},
    {GPUMEM_ERR_INVALID_DEVICE, "GPUMEM_ERR_INVALID_DEVICE"},
    {GPUMEM_ERR_INVALID_POINTER, "GPUMEM_ERR_INVALID_POINTER"},
    {GPUMEM_ERR_OUT_OF_MEMORY, "GPUMEM_ERR_OUT_OF_MEMORY"},
    {GPUMEM_ERR_LIMIT_EXCEEDED, "GPUMEM_ERR_LIMIT_EXCEEDED"},
    {GPUMEM_ERR_BUSY, "GPUMEM_ERR_BUSY"},
    {GPUMEM_ERR_NO_BACKEND, "GPUMEM_ERR_NO_BACKEND"},
    {GPUMEM_ERR_BACKEND, "GPUMEM_ERR_BACKEND"},
    {GPUMEM_ERR_NOT_SUPPORTED, "GPUMEM_ERR_NOT_SUPPORTED"},
    {GPUMEM_ERR_INTERNAL, "GPUMEM_ERR_INTERNAL"},
};

static void test_values_fixed(void **state) {
  (void)state;
  /* the contract fixes OK = 0; the rest are ABI once released */
  assert_int_equal(GPUMEM_OK, 0);
  assert_int_equal(GPUMEM_ERR_INVALID_ARGUMENT, 1);
  assert_int_equal(GPUMEM_ERR_INVALID_DEVICE, 2);
  assert_int_equal(GPUMEM_ERR_INVALID_POINTER, 3);
  assert_int_equal(GPUMEM_ERR_OUT_OF_MEMORY, 4);
  assert_int_equal(GPUMEM_ERR_LIMIT_EXCEEDED, 5);
  assert_int_equal(GPUMEM_ERR_BUSY, 6);
  assert_int_equal(GPUMEM_ERR_NO_BACKEND, 7);
  assert_int_equal(GPUMEM_ERR_BACKEND, 8);
  assert_int_equal(GPUMEM_ERR_NOT_SUPPORTED, 9);
  assert_int_equal(GPUMEM_ERR_INTERNAL, 10);
  assert_int_equal(GPUMEM_STATUS_COUNT_, 11);
}

static void test_every_name(void **state) {
  (void)state;
  assert_int_equal(sizeof k_names / sizeof k_names[0], (size_t)GPUMEM_STATUS_COUNT_);
  for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
    const char *n = gpumem_status_name(k_names[i].s);
    assert_non_null(n);
    assert_string_equal(n, k_names[i].name);
  }
}

static void test_every_message(void **state) {
  (void)state;
  for (int i = 0; i < (int)GPUMEM_STATUS_COUNT_; i++) {
    const char *m = gpumem_strerror((gpumem_status)i);
    assert_non_null(m);
    assert_true(strlen(m) > 3);
    /* the message is a sentence, not the name */
    assert_null(strstr(m, "GPUMEM_"));
    /* distinct messages for distinct statuses */
    for (int j = 0; j < i; j++) assert_string_not_equal(m, gpumem_strerror((gpumem_status)j));
  }
  assert_string_equal(gpumem_strerror(GPUMEM_OK), "success");
  /* the messages come from the one list in gpumem.h */
#define CHECK_MSG(name, value, msg) assert_string_equal(gpumem_strerror((gpumem_status)(value)), msg);
  GPUMEM_STATUS_MAP(CHECK_MSG)
#undef CHECK_MSG
}

static void test_out_of_range(void **state) {
  (void)state;
  const int bad[] = {-1, -100, (int)GPUMEM_STATUS_COUNT_, (int)GPUMEM_STATUS_COUNT_ + 1, 1000, 0x7fffffff,
                     (int)0x80000000u};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *n = gpumem_status_name((gpumem_status)bad[i]);
    assert_non_null(n);
    assert_string_equal(n, "GPUMEM_UNKNOWN_STATUS");
    const char *m = gpumem_strerror((gpumem_status)bad[i]);
    assert_non_null(m);
    assert_true(strlen(m) > 0);
    for (int j = 0; j < (int)GPUMEM_STATUS_COUNT_; j++) assert_string_not_equal(m, gpumem_strerror((gpumem_status)j));
  }
}

static void test_names_static(void **state) {
  (void)state;
  /* static strings: the same pointer each time, usable from any thread */
  for (int i = 0; i < (int)GPUMEM_STATUS_COUNT_; i++) {
    assert_ptr_equal(gpumem_status_name((gpumem_status)i), gpumem_status_name((gpumem_status)i));
    assert_ptr_equal(gpumem_strerror((gpumem_status)i), gpumem_strerror((gpumem_status)i));
  }
}

static void test_last_backend_error(void **state) {
  (void)state;
  assert_status(gpumem_last_backend_error(NULL, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  gpumem_context *ctx = tu_ctx_new(NULL);
  int code = 12345;
  const char *msg = (const char *)"untouched";
  /* no backend error yet: code 0 */
  assert_status(gpumem_last_backend_error(ctx, &code, &msg), GPUMEM_OK);
  assert_int_equal(code, 0);
  assert_status(gpumem_last_backend_error(ctx, NULL, NULL), GPUMEM_OK);
  if (tu_is_sim()) {
    /* an injected generic fault surfaces as GPUMEM_ERR_BACKEND and its raw code stays retrievable */
    assert_status(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
    void *p = (void *)0x1;
    gpumem_status s = gpumem_alloc(ctx, 0, 1 << 20, NULL, &p);
    gpumem_sim_fail_clear();
    assert_status(s, GPUMEM_ERR_BACKEND);
    assert_ptr_equal(p, (void *)0x1);
    assert_status(gpumem_last_backend_error(ctx, &code, &msg), GPUMEM_OK);
    assert_int_equal(code, GPUMEM_SIM_ERR_INJECTED);
    assert_non_null(msg);
    assert_true(strlen(msg) > 0);
  }
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_values_fixed), TU_TEST(test_every_name),   TU_TEST(test_every_message),
      TU_TEST(test_out_of_range), TU_TEST(test_names_static), TU_TEST(test_last_backend_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
