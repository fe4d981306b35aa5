/* Devices: count, info fields, UUID format, bad device numbers, CUDA_VISIBLE_DEVICES, GPUMEM_SIM_DEVICES. */
#include <ctype.h>
#include <limits.h>

#include "testutil.h"

static int uuid_ok(const char *u) {
  /* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
  static const int groups[] = {8, 4, 4, 4, 12};
  if (strncmp(u, "GPU-", 4) != 0) return 0;
  const char *p = u + 4;
  for (int g = 0; g < 5; g++) {
    for (int i = 0; i < groups[g]; i++, p++)
      if (!isxdigit((unsigned char)*p)) return 0;
    if (g < 4 && *p++ != '-') return 0;
  }
  return *p == '\0';
}

static int pci_ok(const char *s) {
  unsigned dom, bus, dev, fn;
  char tail;
  if (sscanf(s, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4) return 0;
  return strlen(s) >= 7;
}

static gpumem_device_info get_info(gpumem_context *ctx, int d) {
  gpumem_device_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_status(gpumem_device_get_info(ctx, d, &info), GPUMEM_OK);
  return info;
}

static void test_count_and_info(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  assert_true(n >= 1);
  if (tu_is_sim()) assert_int_equal(n, 1); /* default: one device of 16 GiB */
  for (int d = 0; d < n; d++) {
    gpumem_device_info info = get_info(ctx, d);
    assert_int_equal(info.ordinal, d);
    assert_true(strlen(info.name) > 0 && strlen(info.name) < sizeof info.name);
    if (!uuid_ok(info.uuid)) {
      print_error("bad uuid \"%s\"\n", info.uuid);
      fail();
    }
    if (!pci_ok(info.pci_bus_id)) {
      print_error("bad pci bus id \"%s\"\n", info.pci_bus_id);
      fail();
    }
    assert_true(info.total_bytes > 0);
    assert_true(info.free_bytes <= info.total_bytes);
    assert_true(info.physical_index >= -1);
    if (tu_is_sim()) {
      assert_true(info.total_bytes == 16 * TU_GiB);
      assert_true(info.free_bytes == info.total_bytes);
      assert_int_equal(info.physical_index, d);
    }
    /* struct_size 0 means the current size */
    gpumem_device_info i0;
    memset(&i0, 0, sizeof i0);
    assert_status(gpumem_device_get_info(ctx, d, &i0), GPUMEM_OK);
    assert_string_equal(i0.uuid, info.uuid);
    assert_true(i0.total_bytes == info.total_bytes);
  }
  /* free memory follows allocations (sim: exactly at least the block) */
  if (tu_is_sim()) {
    void *p = NULL;
    assert_status(gpumem_alloc(ctx, 0, 64 * TU_MiB, NULL, &p), GPUMEM_OK);
    gpumem_device_info info = get_info(ctx, 0);
    assert_true(info.free_bytes <= info.total_bytes - 64 * TU_MiB);
    assert_true(info.free_bytes == info.total_bytes - tu_sim_used(0));
    assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  }
  tu_ctx_done(ctx);
}

static void test_info_old_struct_size(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_device_info info;
  memset(&info, 0x77, sizeof info);
  info.struct_size = (uint32_t)offsetof(gpumem_device_info, physical_index);
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_OK);
  assert_true(uuid_ok(info.uuid));
  /* nothing written past the caller's size */
  int sentinel;
  memset(&sentinel, 0x77, sizeof sentinel);
  assert_int_equal(info.physical_index, sentinel);
  /* a size too small to hold anything is rejected */
  memset(&info, 0, sizeof info);
  info.struct_size = 2;
  assert_status(gpumem_device_get_info(ctx, 0, &info), GPUMEM_ERR_INVALID_ARGUMENT);
  tu_ctx_done(ctx);
}

static void test_bad_device_numbers(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  const int bad[] = {n, n + 1, 1000, INT_MAX, INT_MIN, -2, -1000};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int d = bad[i];
    gpumem_device_info info;
    memset(&info, 0x33, sizeof info);
    info.struct_size = sizeof info;
    gpumem_device_info copy = info;
    assert_status(gpumem_device_get_info(ctx, d, &info), GPUMEM_ERR_INVALID_DEVICE);
    assert_memory_equal(&info, &copy, sizeof info);
    void *p = (void *)0x1;
    assert_status(gpumem_alloc(ctx, d, 1024, NULL, &p), GPUMEM_ERR_INVALID_DEVICE);
    assert_ptr_equal(p, (void *)0x1);
    assert_status(gpumem_alloc_tagged(ctx, d, 1024, NULL, "t", &p), GPUMEM_ERR_INVALID_DEVICE);
    assert_ptr_equal(p, (void *)0x1);
    uint64_t rel = 99;
    assert_status(gpumem_trim(ctx, d, 0, &rel), GPUMEM_ERR_INVALID_DEVICE);
    assert_true(rel == 99);
    assert_status(gpumem_reset(ctx, d, 0), GPUMEM_ERR_INVALID_DEVICE);
    gpumem_stats st;
    memset(&st, 0x44, sizeof st);
    st.struct_size = sizeof st;
    assert_status(gpumem_get_stats(ctx, d, &st), GPUMEM_ERR_INVALID_DEVICE);
    assert_true(st.allocated_bytes == 0x4444444444444444ull);
    assert_status(gpumem_reset_peak_stats(ctx, d), GPUMEM_ERR_INVALID_DEVICE);
    gpumem_scope *sc = (gpumem_scope *)0x1;
    assert_status(gpumem_scope_begin(ctx, d, NULL, &sc), GPUMEM_ERR_INVALID_DEVICE);
    assert_ptr_equal(sc, (gpumem_scope *)0x1);
    gpumem_buffer b;
    memset(&b, 0x55, sizeof b);
    gpumem_buffer bc = b;
    assert_status(gpumem_buffer_alloc(ctx, d, 1024, NULL, &b), GPUMEM_ERR_INVALID_DEVICE);
    assert_memory_equal(&b, &bc, sizeof b);
  }
  /* GPUMEM_ALL_DEVICES is no device for allocation or info */
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(ctx, GPUMEM_ALL_DEVICES, 1024, NULL, &p), GPUMEM_ERR_INVALID_DEVICE);
  assert_ptr_equal(p, (void *)0x1);
  gpumem_device_info info;
  info.struct_size = sizeof info;
  assert_status(gpumem_device_get_info(ctx, GPUMEM_ALL_DEVICES, &info), GPUMEM_ERR_INVALID_DEVICE);
  /* size 0 on a bad device: the device is still checked or the call is a no-op; never a pointer */
  p = (void *)0x1;
  gpumem_status s = gpumem_alloc(ctx, n, 0, NULL, &p);
  assert_true(s == GPUMEM_ERR_INVALID_DEVICE || (s == GPUMEM_OK && p == NULL));
  tu_ctx_done(ctx);
}

/* ---------------------------------------------------------------------- */
/* Simulated devices and CUDA_VISIBLE_DEVICES (children)                   */

typedef struct cvd_case {
  const char *sim_devices; /* GPUMEM_SIM_DEVICES, NULL = unset */
  const char *cvd;         /* CUDA_VISIBLE_DEVICES, NULL = unset */
  gpumem_status create;    /* expected status of gpumem_create */
  int count;               /* expected visible devices */
  uint64_t totals[4];      /* expected total of each visible device */
  int physical[4];         /* expected physical index of each */
} cvd_case;

static int run_cvd_case(void *arg) {
  const cvd_case *c = (const cvd_case *)arg;
  if (c->sim_devices) setenv("GPUMEM_SIM_DEVICES", c->sim_devices, 1); else unsetenv("GPUMEM_SIM_DEVICES");
  if (c->cvd) setenv("CUDA_VISIBLE_DEVICES", c->cvd, 1); else unsetenv("CUDA_VISIBLE_DEVICES");
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  gpumem_context *ctx = NULL;
  TU_CHECK_STATUS(gpumem_create(&cfg, &ctx), c->create);
  if (c->create != GPUMEM_OK) return 0;
  int n = -1;
  TU_CHECK_STATUS(gpumem_device_count(ctx, &n), GPUMEM_OK);
  TU_CHECK_EQ(n, c->count);
  char uuids[4][64];
  for (int d = 0; d < n; d++) {
    gpumem_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    TU_CHECK_STATUS(gpumem_device_get_info(ctx, d, &info), GPUMEM_OK);
    TU_CHECK_EQ(info.ordinal, d);
    TU_CHECK_EQ(info.total_bytes, c->totals[d]);
    TU_CHECK_EQ(info.physical_index, c->physical[d]);
    TU_CHECK(uuid_ok(info.uuid));
    memcpy(uuids[d], info.uuid, 64);
    for (int e = 0; e < d; e++) TU_CHECK(strcmp(uuids[e], uuids[d]) != 0);
  }
  /* visible ordinals address the right device: allocate on the last one only */
  void *p = NULL;
  TU_CHECK_STATUS(gpumem_alloc(ctx, n - 1, 3 * TU_MiB, NULL, &p), GPUMEM_OK);
  for (int d = 0; d < n; d++) {
    uint64_t used = 0;
    TU_CHECK_STATUS(gpumem_sim_used_bytes(d, &used), GPUMEM_OK);
    if (d == n - 1) TU_CHECK(used >= 3 * TU_MiB);
    else TU_CHECK_EQ(used, 0); /* no device touched that was not named */
  }
  TU_CHECK_STATUS(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  TU_CHECK_STATUS(gpumem_alloc(ctx, n, 1024, NULL, &p), GPUMEM_ERR_INVALID_DEVICE);
  TU_CHECK_STATUS(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return 0;
}

static void run_case(const cvd_case *c) {
  int rc = tu_run_in_child(run_cvd_case, (void *)c);
  if (rc != 0) {
    print_error("case GPUMEM_SIM_DEVICES=%s CUDA_VISIBLE_DEVICES=%s failed in the child (exit %d)\n",
                c->sim_devices ? c->sim_devices : "(unset)", c->cvd ? c->cvd : "(unset)", rc);
    fail();
  }
}

#define G16 (16 * TU_GiB)
#define G8 (8 * TU_GiB)
#define G4 (4 * TU_GiB)

static void test_sim_devices_forms(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  const cvd_case cases[] = {
      {NULL, NULL, GPUMEM_OK, 1, {G16}, {0}},
      {"2x16GiB", NULL, GPUMEM_OK, 2, {G16, G16}, {0, 1}},
      {"16GiB,8GiB", NULL, GPUMEM_OK, 2, {G16, G8}, {0, 1}},
      {"3x1GiB,512MiB", NULL, GPUMEM_OK, 4, {TU_GiB, TU_GiB, TU_GiB, 512 * TU_MiB}, {0, 1, 2, 3}},
      {"64MiB", NULL, GPUMEM_OK, 1, {64 * TU_MiB}, {0}},
      {"banana", NULL, GPUMEM_ERR_INVALID_ARGUMENT, 0, {0}, {0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

static void test_cuda_visible_devices(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  const char *three = "16GiB,8GiB,4GiB";
  const cvd_case cases[] = {
      {three, NULL, GPUMEM_OK, 3, {G16, G8, G4}, {0, 1, 2}},
      {three, "1", GPUMEM_OK, 1, {G8}, {1}},
      {three, "1,0", GPUMEM_OK, 2, {G8, G16}, {1, 0}},
      {three, "2,0,1", GPUMEM_OK, 3, {G4, G16, G8}, {2, 0, 1}},
      {three, " 2 , 1 ", GPUMEM_OK, 2, {G4, G8}, {2, 1}},
      /* stop at the first invalid entry, keeping those before it */
      {three, "1,7,0", GPUMEM_OK, 1, {G8}, {1}},
      {three, "2,abc,0", GPUMEM_OK, 1, {G4}, {2}},
      {three, "0,-1,1", GPUMEM_OK, 1, {G16}, {0}},
      /* no device at all */
      {three, "", GPUMEM_ERR_NO_BACKEND, 0, {0}, {0}},
      {three, "-1", GPUMEM_ERR_NO_BACKEND, 0, {0}, {0}},
      {three, "7", GPUMEM_ERR_NO_BACKEND, 0, {0}, {0}},
      {three, "abc,0", GPUMEM_ERR_NO_BACKEND, 0, {0}, {0}},
      {three, "GPU-zzzz", GPUMEM_ERR_NO_BACKEND, 0, {0}, {0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

static void test_cuda_visible_devices_uuid(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "16GiB,8GiB,4GiB");
  tu_setenv("CUDA_VISIBLE_DEVICES", NULL);
  gpumem_context *ctx = tu_ctx_new(NULL);
  char u[3][64];
  for (int d = 0; d < 3; d++) memcpy(u[d], get_info(ctx, d).uuid, 64);
  tu_ctx_done(ctx);
  /* UUIDs are stable: the same after the sim state is recreated */
  ctx = tu_ctx_new(NULL);
  for (int d = 0; d < 3; d++) assert_string_equal(get_info(ctx, d).uuid, u[d]);
  tu_ctx_done(ctx);

  /* a prefix long enough to be unique selects the device; full UUIDs too; mixing with ordinals works */
  static char full2[64], pref1[64], mixed[160];
  memcpy(full2, u[2], 64);
  size_t k = 4; /* shortest prefix that tells device 1 apart from 0 and 2 */
  while (k < strlen(u[1]) && (strncmp(u[1], u[0], k) == 0 || strncmp(u[1], u[2], k) == 0)) k++;
  k = k < 12 ? 12 : k;
  memcpy(pref1, u[1], k);
  pref1[k] = '\0';
  snprintf(mixed, sizeof mixed, "%s,0", pref1);
  const cvd_case cases[] = {
      {"16GiB,8GiB,4GiB", full2, GPUMEM_OK, 1, {G4}, {2}},
      {"16GiB,8GiB,4GiB", pref1, GPUMEM_OK, 1, {G8}, {1}},
      {"16GiB,8GiB,4GiB", mixed, GPUMEM_OK, 2, {G8, G16}, {1, 0}},
      {"16GiB,8GiB,4GiB", "GPU-", GPUMEM_ERR_NO_BACKEND, 0, {0}, {0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

static void test_sim_reinit(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  gpumem_context *ctx = tu_ctx_new(NULL);
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  assert_int_equal(n, 2);
  /* the env is read when the first context is created: changing it later does nothing ... */
  tu_setenv("GPUMEM_SIM_DEVICES", "3x1GiB");
  gpumem_context *ctx2 = tu_ctx_new(NULL);
  assert_status(gpumem_device_count(ctx2, &n), GPUMEM_OK);
  assert_int_equal(n, 2);
  /* ... and reinit is refused while contexts are alive */
  assert_status(gpumem_sim_reinit(), GPUMEM_ERR_BUSY);
  tu_ctx_done(ctx2);
  tu_ctx_done(ctx);
  /* with none alive, the next context sees the new value */
  ctx = tu_ctx_new(NULL);
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  assert_int_equal(n, 3);
  tu_ctx_done(ctx);
  tu_setenv("GPUMEM_SIM_DEVICES", "not a device list");
  assert_status(gpumem_sim_reinit(), GPUMEM_ERR_INVALID_ARGUMENT);
}

static void test_lazy_pools(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  assert_int_equal(tu_ctx_live(), 0);
  tu_setenv("GPUMEM_SIM_DEVICES", "3x1GiB");
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.initial_bytes = 64 * TU_MiB;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  /* creating, counting and querying touch no memory */
  for (int d = 0; d < 3; d++) (void)get_info(ctx, d);
  assert_true(tu_sim_used_total() == 0);
  void *p = NULL;
  assert_status(gpumem_alloc(ctx, 2, 1000, NULL, &p), GPUMEM_OK);
  assert_true(tu_sim_used(0) == 0);
  assert_true(tu_sim_used(1) == 0);
  assert_true(tu_sim_used(2) >= 64 * TU_MiB); /* initial_bytes on first use */
  gpumem_stats s0 = tu_stats(ctx, 0), s2 = tu_stats(ctx, 2);
  assert_true(s0.reserved_bytes == 0 && s0.num_allocs == 0);
  assert_true(s2.reserved_bytes >= 64 * TU_MiB && s2.num_allocs == 1);
  /* trim / stats / reset of ALL do not create pools either */
  assert_status(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  assert_status(gpumem_reset_peak_stats(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK);
  (void)tu_stats(ctx, GPUMEM_ALL_DEVICES);
  assert_true(tu_sim_used(0) == 0 && tu_sim_used(1) == 0);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_count_and_info),
      TU_TEST(test_info_old_struct_size),
      TU_TEST(test_bad_device_numbers),
      TU_TEST(test_sim_devices_forms),
      TU_TEST(test_cuda_visible_devices),
      TU_TEST(test_cuda_visible_devices_uuid),
      TU_TEST(test_sim_reinit),
      TU_TEST(test_lazy_pools),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
