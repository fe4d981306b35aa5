/*
 * test_sim_backend.c: the host simulator backend, driven through its vtable
 * directly (no core): GPUMEM_SIM_DEVICES and CUDA_VISIBLE_DEVICES parsing,
 * UUIDs, memory, capacity, external usage, events, device reset, virtual
 * memory, fault injection, reference counting and threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gpumem.h>
#include <gpumem/backend.h>
#include <gpumem/sim.h>

extern const gpumem_backend gpumem__sim_backend;

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define TiB ((uint64_t)1 << 40)

static gpumem_backend be; /* our copy, as the core makes one */
static int refs;          /* references this test holds */

/* Set the two variables (NULL = unset) and init; count the reference on success. */
static int sim_up(const char *devices, const char *visible) {
  if (devices) setenv("GPUMEM_SIM_DEVICES", devices, 1);
  else unsetenv("GPUMEM_SIM_DEVICES");
  if (visible) setenv("CUDA_VISIBLE_DEVICES", visible, 1);
  else unsetenv("CUDA_VISIBLE_DEVICES");
  int rc = be.init(&be);
  if (rc == 0) refs++;
  return rc;
}

static void sim_down(void) {
  be.shutdown(&be);
  refs--;
}

static int setup(void **state) {
  (void)state;
  be = gpumem__sim_backend;
  refs = 0;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  while (refs > 0) sim_down();
  gpumem_sim_fail_clear();
  gpumem_sim_set_delayed(0);
  unsetenv("GPUMEM_SIM_DEVICES");
  unsetenv("CUDA_VISIBLE_DEVICES");
  return 0;
}

static int count(void) {
  int n = -1;
  assert_int_equal(be.device_count(&be, &n), 0);
  return n;
}

static gpumem_backend_device_info info(int device) {
  gpumem_backend_device_info di;
  memset(&di, 0x5a, sizeof di);
  assert_int_equal(be.device_info(&be, device, &di), 0);
  return di;
}

static uint64_t used(int device) {
  uint64_t u = UINT64_MAX;
  assert_int_equal(gpumem_sim_used_bytes(device, &u), GPUMEM_OK);
  return u;
}

static uint64_t free_bytes(int device) {
  uint64_t f = 0, t = 0;
  assert_int_equal(be.mem_get_info(&be, device, &f, &t), 0);
  return f;
}

/* ------------------------------------------------------------------------ */

static void test_vtable(void **state) {
  (void)state;
  assert_int_equal(be.version, GPUMEM_BACKEND_VERSION);
  assert_int_equal(be.struct_size, sizeof(gpumem_backend));
  assert_string_equal(be.name, "sim");
  assert_non_null(be.init);
  assert_non_null(be.shutdown);
  assert_non_null(be.device_count);
  assert_non_null(be.device_info);
  assert_non_null(be.mem_get_info);
  assert_non_null(be.malloc);
  assert_non_null(be.free);
  assert_non_null(be.event_create);
  assert_non_null(be.event_destroy);
  assert_non_null(be.event_record);
  assert_non_null(be.event_query);
  assert_non_null(be.event_synchronize);
  assert_non_null(be.stream_synchronize);
  assert_non_null(be.device_synchronize);
  assert_non_null(be.device_reset);
  assert_non_null(be.error_status);
  assert_non_null(be.error_string);
  assert_non_null(be.vm_granularity);
  assert_non_null(be.vm_reserve);
  assert_non_null(be.vm_release);
  assert_non_null(be.vm_create);
  assert_non_null(be.vm_destroy);
  assert_non_null(be.vm_map);
  assert_non_null(be.vm_unmap);
}

static void test_error_mapping(void **state) {
  (void)state;
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_OUT_OF_MEMORY), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_NO_DEVICE), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_INVALID_DEVICE), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_BAD_ENV), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_INVALID_VALUE), GPUMEM_ERR_BACKEND);
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_INJECTED), GPUMEM_ERR_BACKEND);
  assert_int_equal(be.error_status(&be, 12345), GPUMEM_ERR_BACKEND);
  const int codes[] = {GPUMEM_SIM_ERR_INVALID_VALUE, GPUMEM_SIM_ERR_OUT_OF_MEMORY, GPUMEM_SIM_ERR_BAD_ENV,
                       GPUMEM_SIM_ERR_INVALID_DEVICE, GPUMEM_SIM_ERR_NO_DEVICE, GPUMEM_SIM_ERR_INJECTED, 12345};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *s = be.error_string(&be, codes[i]);
    assert_non_null(s);
    assert_true(strlen(s) > 5);
    for (size_t j = 0; j < i; j++) assert_string_not_equal(s, be.error_string(&be, codes[j]));
  }
  const char *bad = be.error_string(&be, GPUMEM_SIM_ERR_BAD_ENV);
  assert_non_null(strstr(bad, "GPUMEM_SIM_DEVICES"));
  assert_non_null(strstr(bad, "2x16GiB"));
}

typedef struct env_case {
  const char *value;
  int ndev;                /* expected count, 0 = BAD_ENV */
  uint64_t capacity[9];
} env_case;

static void test_sim_devices_env(void **state) {
  (void)state;
  static const env_case cases[] = {
    {NULL, 1, {16 * GiB}},
    {"2x16GiB", 2, {16 * GiB, 16 * GiB}},
    {"16GiB,8GiB", 2, {16 * GiB, 8 * GiB}},
    {"3x1GiB,512MiB", 4, {GiB, GiB, GiB, 512 * MiB}},
    {" 1g , 2 X 3m,4096,1KB,1k,1kib,1T,5b", 9, {GiB, 3 * MiB, 3 * MiB, 4096, 1024, 1024, 1024, TiB, 5}},
    {"2TiB,7MB,1gb", 3, {2 * TiB, 7 * MiB, GiB}},
    {"64x1MiB", 64, {MiB, MiB, MiB, MiB, MiB, MiB, MiB, MiB, MiB}},
    {"16777215TiB", 1, {16777215 * TiB}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const env_case *c = &cases[i];
    assert_int_equal(sim_up(c->value, NULL), 0);
    assert_int_equal(count(), c->ndev);
    for (int d = 0; d < c->ndev && d < 9; d++) {
      gpumem_backend_device_info di = info(d);
      assert_int_equal(di.total_bytes, c->capacity[d]);
      assert_int_equal(di.physical_index, d);
      uint64_t f = 0, t = 0;
      assert_int_equal(be.mem_get_info(&be, d, &f, &t), 0);
      assert_int_equal(t, c->capacity[d]);
      assert_int_equal(f, c->capacity[d]);
    }
    sim_down();
  }
  static const char *const bad[] = {
    "banana", "0x16GiB", "-1GiB", "", " ", ",", "16GiB,", ",16GiB", "16GiB,,8GiB", "2x", "x16GiB",
    "16GiBs", "16QB", "16 GiB 4", "1.5GiB", "0GiB", "0", "2x0MiB", "16Ki", "16iB", "16GiBB",
    "99999999999999999999", "16777216TiB", "18446744073709551615K", "65x1GiB", "64x1GiB,1GiB",
    "2x3x1GiB", "0x10", "16GiB;8GiB", "1e9",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = sim_up(bad[i], NULL);
    if (rc != GPUMEM_SIM_ERR_BAD_ENV) print_error("GPUMEM_SIM_DEVICES=\"%s\" gave %d\n", bad[i], rc);
    assert_int_equal(rc, GPUMEM_SIM_ERR_BAD_ENV);
    assert_int_equal(gpumem_sim_reinit(), GPUMEM_ERR_INVALID_ARGUMENT);
  }
  /* the failed inits took no reference: nothing is initialised */
  uint64_t u;
  assert_int_equal(gpumem_sim_used_bytes(0, &u), GPUMEM_ERR_NO_BACKEND);
  int n;
  assert_int_equal(be.device_count(&be, &n), GPUMEM_SIM_ERR_NO_DEVICE);
}

static void test_reinit_and_refcount(void **state) {
  (void)state;
  setenv("GPUMEM_SIM_DEVICES", "2x1GiB", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  assert_int_equal(gpumem_sim_reinit(), GPUMEM_OK);
  setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  assert_int_equal(gpumem_sim_reinit(), GPUMEM_ERR_NO_BACKEND);

  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  void *p = NULL;
  assert_int_equal(be.malloc(&be, 1, 10 * MiB, &p), 0);
  /* a second reference shares the state and does not re-read the environment */
  gpumem_backend be2 = gpumem__sim_backend;
  setenv("GPUMEM_SIM_DEVICES", "5x1GiB", 1);
  assert_int_equal(be2.init(&be2), 0);
  int n = 0;
  assert_int_equal(be2.device_count(&be2, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(gpumem_sim_reinit(), GPUMEM_ERR_BUSY);
  assert_int_equal(used(1), 10 * MiB);
  be2.shutdown(&be2);
  /* still alive through our reference */
  assert_int_equal(used(1), 10 * MiB);
  memset(p, 1, 10 * MiB);
  assert_int_equal(gpumem_sim_reinit(), GPUMEM_ERR_BUSY);
  sim_down();
  /* the last shutdown freed everything */
  uint64_t u;
  assert_int_equal(gpumem_sim_used_bytes(1, &u), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(gpumem_sim_set_external_usage(0, 1), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(be.malloc(&be, 0, 4096, &p), GPUMEM_SIM_ERR_NO_DEVICE);
  assert_int_equal(gpumem_sim_reinit(), GPUMEM_OK);
  /* a new state re-reads the environment and starts empty */
  assert_int_equal(sim_up("5x1GiB", NULL), 0);
  assert_int_equal(count(), 5);
  assert_int_equal(used(1), 0);
  sim_down();
  /* an extra shutdown is harmless */
  be.shutdown(&be);
  assert_int_equal(sim_up(NULL, NULL), 0);
  assert_int_equal(count(), 1);
}

/* ------------------------------------------------------------------------ */
/* CUDA_VISIBLE_DEVICES                                                      */

#define NPHYS 4
static char g_uuid[NPHYS][64];

static void load_uuids(void) {
  assert_int_equal(sim_up("1GiB,2GiB,3GiB,4GiB", NULL), 0);
  assert_int_equal(count(), NPHYS);
  for (int i = 0; i < NPHYS; i++) {
    gpumem_backend_device_info di = info(i);
    strcpy(g_uuid[i], di.uuid);
  }
  sim_down();
}

/* Init with the visible list; check the physical devices in order (-1 ends). */
static void expect_visible(const char *visible, const int *phys) {
  int n = 0;
  while (phys[n] >= 0) n++;
  int rc = sim_up("1GiB,2GiB,3GiB,4GiB", visible);
  if (n == 0) {
    if (rc != GPUMEM_SIM_ERR_NO_DEVICE) print_error("CUDA_VISIBLE_DEVICES=\"%s\" gave %d\n", visible, rc);
    assert_int_equal(rc, GPUMEM_SIM_ERR_NO_DEVICE);
    assert_int_equal(be.error_status(&be, rc), GPUMEM_ERR_NO_BACKEND);
    return;
  }
  assert_int_equal(rc, 0);
  int got = count();
  if (got != n) print_error("CUDA_VISIBLE_DEVICES=\"%s\": %d devices, expected %d\n", visible ? visible : "(unset)", got, n);
  assert_int_equal(got, n);
  for (int i = 0; i < n; i++) {
    gpumem_backend_device_info di = info(i);
    assert_int_equal(di.physical_index, phys[i]);
    assert_int_equal(di.total_bytes, (uint64_t)(phys[i] + 1) * GiB);
    assert_string_equal(di.uuid, g_uuid[phys[i]]);
  }
  uint64_t u;
  assert_int_equal(gpumem_sim_used_bytes(n, &u), GPUMEM_ERR_INVALID_DEVICE);
  sim_down();
}

static void test_visible_devices(void **state) {
  (void)state;
  load_uuids();
  expect_visible(NULL, (const int[]){0, 1, 2, 3, -1});
  expect_visible("1", (const int[]){1, -1});
  expect_visible("1,0", (const int[]){1, 0, -1});
  expect_visible("3,2,1,0", (const int[]){3, 2, 1, 0, -1});
  expect_visible("0,0", (const int[]){0, -1});
  expect_visible("2,1,2,0", (const int[]){2, 1, -1});
  expect_visible("0,banana,1", (const int[]){0, -1});
  expect_visible(" 2 , 3 ", (const int[]){2, 3, -1});
  expect_visible("3,4,0", (const int[]){3, -1});
  expect_visible("0,1,", (const int[]){0, 1, -1});
  expect_visible("0,,1", (const int[]){0, -1});
  expect_visible("1,-1,0", (const int[]){1, -1});
  expect_visible("1,2x,0", (const int[]){1, -1});
  expect_visible("1 2", (const int[]){-1});
  expect_visible("", (const int[]){-1});
  expect_visible("-1", (const int[]){-1});
  expect_visible("-1,0", (const int[]){-1});
  expect_visible("4", (const int[]){-1});
  expect_visible("banana,0", (const int[]){-1});
  expect_visible(",0", (const int[]){-1});
  expect_visible("99999999999999999999999", (const int[]){-1});

  char buf[256];
  /* UUID prefixes */
  snprintf(buf, sizeof buf, "%.12s", g_uuid[1]); /* GPU-xxxxxxxx */
  expect_visible(buf, (const int[]){1, -1});
  snprintf(buf, sizeof buf, "%s", g_uuid[2]); /* full UUID */
  expect_visible(buf, (const int[]){2, -1});
  snprintf(buf, sizeof buf, " %s ,0", g_uuid[3]);
  expect_visible(buf, (const int[]){3, 0, -1});
  snprintf(buf, sizeof buf, "2,%.14s,1", g_uuid[2]); /* duplicate through its UUID */
  expect_visible(buf, (const int[]){2, -1});
  snprintf(buf, sizeof buf, "0,%.10s,1", g_uuid[3]);
  expect_visible(buf, (const int[]){0, 3, 1, -1});
  snprintf(buf, sizeof buf, "%sa", g_uuid[1]); /* longer than any UUID */
  expect_visible(buf, (const int[]){-1});
  snprintf(buf, sizeof buf, "MIG-%s", g_uuid[1] + 4);
  expect_visible(buf, (const int[]){-1});
  snprintf(buf, sizeof buf, "1,%s", g_uuid[1] + 4); /* no GPU- prefix */
  expect_visible(buf, (const int[]){1, -1});
  expect_visible("GPU-", (const int[]){-1});
  expect_visible("0,GPU-zz", (const int[]){0, -1});
  expect_visible("0,GPU", (const int[]){0, -1});

  /* ambiguous prefix: among 40 devices two share their first hex digit */
  setenv("GPUMEM_SIM_DEVICES", "40x1GiB", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  assert_int_equal(be.init(&be), 0);
  refs++;
  char u40[40][64];
  for (int i = 0; i < 40; i++) strcpy(u40[i], info(i).uuid);
  sim_down();
  int a = -1, b = -1;
  for (int i = 0; i < 40 && a < 0; i++)
    for (int j = i + 1; j < 40; j++)
      if (u40[i][4] == u40[j][4]) {
        a = i;
        b = j;
        break;
      }
  assert_true(a >= 0);
  snprintf(buf, sizeof buf, "%.5s", u40[a]);
  assert_int_equal(sim_up("40x1GiB", buf), GPUMEM_SIM_ERR_NO_DEVICE);
  snprintf(buf, sizeof buf, "%d,%.5s,%d", b, u40[a], a);
  assert_int_equal(sim_up("40x1GiB", buf), 0);
  assert_int_equal(count(), 1);
  assert_int_equal(info(0).physical_index, b);
  sim_down();
  /* a unique longer prefix of the same device works */
  snprintf(buf, sizeof buf, "%s", u40[a]);
  assert_int_equal(sim_up("40x1GiB", buf), 0);
  assert_int_equal(count(), 1);
  assert_int_equal(info(0).physical_index, a);
  sim_down();
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

static void test_uuid_and_info(void **state) {
  (void)state;
  char first[64][64];
  assert_int_equal(sim_up("64x1GiB", NULL), 0);
  for (int i = 0; i < 64; i++) {
    gpumem_backend_device_info di = info(i);
    /* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
    assert_int_equal(strlen(di.uuid), 40);
    assert_memory_equal(di.uuid, "GPU-", 4);
    for (int k = 4; k < 40; k++) {
      if (k == 12 || k == 17 || k == 22 || k == 27) assert_int_equal(di.uuid[k], '-');
      else assert_true(is_hex(di.uuid[k]));
    }
    for (int j = 0; j < i; j++) assert_string_not_equal(di.uuid, first[j]);
    strcpy(first[i], di.uuid);
    char pci[32];
    snprintf(pci, sizeof pci, "0000:%02x:00.0", i + 1);
    assert_string_equal(di.pci_bus_id, pci);
    assert_string_equal(di.name, "libgpumem simulated device");
    assert_int_equal(di.physical_index, i);
  }
  sim_down();
  /* stable across states and independent of the capacities and the mapping */
  assert_int_equal(sim_up("2GiB,3GiB,4GiB,5GiB,6GiB,7GiB", "5,2"), 0);
  assert_string_equal(info(0).uuid, first[5]);
  assert_string_equal(info(1).uuid, first[2]);
  sim_down();
  /* bad arguments */
  assert_int_equal(sim_up(NULL, NULL), 0);
  gpumem_backend_device_info di;
  assert_int_equal(be.device_info(&be, 1, &di), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.device_info(&be, -1, &di), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.device_info(&be, 0, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  uint64_t f, t;
  assert_int_equal(be.mem_get_info(&be, 1, &f, &t), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.mem_get_info(&be, 0, NULL, &t), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.device_count(&be, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

static void test_memory_rw(void **state) {
  (void)state;
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  static const size_t sizes[] = {1, 255, 256, 4096, 4097, 3 * MiB + 17, 64 * MiB};
  enum { N = sizeof sizes / sizeof sizes[0] };
  unsigned char *p[N];
  uint64_t charged = 0;
  for (int i = 0; i < N; i++) {
    void *q = NULL;
    assert_int_equal(be.malloc(&be, 0, sizes[i], &q), 0);
    assert_non_null(q);
    assert_int_equal((uintptr_t)q % 256, 0);
    p[i] = q;
    charged += (sizes[i] + 4095) / 4096 * 4096;
    assert_int_equal(used(0), charged);
    for (size_t k = 0; k < sizes[i]; k += (sizes[i] > 8192 ? 4093 : 1)) assert_int_equal(p[i][k], 0);
    memset(p[i], 0x40 + i, sizes[i]);
  }
  assert_int_equal(used(1), 0);
  assert_int_equal(free_bytes(0), GiB - charged);
  for (int i = 0; i < N; i++) {
    assert_int_equal(p[i][0], 0x40 + i);
    assert_int_equal(p[i][sizes[i] - 1], 0x40 + i);
    assert_int_equal(p[i][sizes[i] / 2], 0x40 + i);
    for (int j = 0; j < i; j++) /* no overlap */
      assert_true(p[i] + sizes[i] <= p[j] || p[j] + sizes[j] <= p[i]);
  }
  /* wrong frees change nothing */
  assert_int_equal(be.free(&be, 0, p[3] + 256), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.free(&be, 1, p[3]), GPUMEM_SIM_ERR_INVALID_VALUE);
  int local;
  assert_int_equal(be.free(&be, 0, &local), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.free(&be, 2, p[3]), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(used(0), charged);
  assert_int_equal(p[3][0], 0x43);
  for (int i = 0; i < N; i++) {
    assert_int_equal(be.free(&be, 0, p[i]), 0);
    charged -= (sizes[i] + 4095) / 4096 * 4096;
    assert_int_equal(used(0), charged);
  }
  assert_int_equal(be.free(&be, 0, p[0]), GPUMEM_SIM_ERR_INVALID_VALUE); /* double free */
  /* size 0 and NULL */
  void *q = (void *)&local;
  assert_int_equal(be.malloc(&be, 0, 0, &q), 0);
  assert_null(q);
  assert_int_equal(be.free(&be, 0, NULL), 0);
  assert_int_equal(be.malloc(&be, 0, 16, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  q = (void *)&local;
  assert_int_equal(be.malloc(&be, 2, 16, &q), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.malloc(&be, -1, 16, &q), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_ptr_equal(q, &local);
  assert_int_equal(used(0), 0);
}

/* Many live allocations freed in a scrambled order: the pointer index keeps every one. */
static void test_memory_many(void **state) {
  (void)state;
  assert_int_equal(sim_up("1GiB", NULL), 0);
  enum { N = 3000 };
  static void *p[N];
  uint64_t x = 12345;
  for (int i = 0; i < N; i++) {
    assert_int_equal(be.malloc(&be, 0, 4096, &p[i]), 0);
    *(int *)p[i] = i;
  }
  assert_int_equal(used(0), (uint64_t)N * 4096);
  for (int i = N - 1; i > 0; i--) { /* shuffle */
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int j = (int)((x >> 33) % (uint64_t)(i + 1));
    void *t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(be.free(&be, 0, p[i]), 0);
    if (i % 7 == 0) assert_int_equal(be.free(&be, 0, p[i]), GPUMEM_SIM_ERR_INVALID_VALUE);
    if (i + 1 < N) assert_true(*(int *)p[i + 1] >= 0 && *(int *)p[i + 1] < N);
  }
  assert_int_equal(used(0), 0);
}

static void test_capacity_oom(void **state) {
  (void)state;
  assert_int_equal(sim_up("64MiB,64GiB", NULL), 0);
  void *a = NULL, *b = NULL, *c = (void *)&b;
  assert_int_equal(be.malloc(&be, 0, 48 * MiB, &a), 0);
  assert_int_equal(free_bytes(0), 16 * MiB);
  assert_int_equal(be.malloc(&be, 0, 32 * MiB, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(c, &b); /* untouched */
  assert_int_equal(be.error_status(&be, GPUMEM_SIM_ERR_OUT_OF_MEMORY), GPUMEM_ERR_OUT_OF_MEMORY);
  /* rounding counts: 16 MiB - 4095 bytes still needs 16 MiB */
  assert_int_equal(be.malloc(&be, 0, 16 * MiB - 4095, &b), 0);
  assert_int_equal(free_bytes(0), 0);
  assert_int_equal(be.malloc(&be, 0, 1, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.free(&be, 0, b), 0);
  assert_int_equal(be.malloc(&be, 0, 16 * MiB + 1, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.free(&be, 0, a), 0);
  assert_int_equal(be.malloc(&be, 0, 64 * MiB, &a), 0);
  assert_int_equal(be.malloc(&be, 0, 1, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.free(&be, 0, a), 0);
  assert_int_equal(be.malloc(&be, 0, SIZE_MAX, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.malloc(&be, 0, SIZE_MAX - 100, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.malloc(&be, 0, 64 * MiB + 1, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(c, &b);
  /* a large device costs no RAM until touched */
  assert_int_equal(be.malloc(&be, 1, 48 * GiB, &a), 0);
  assert_int_equal(used(1), 48 * GiB);
  ((char *)a)[0] = 1;
  ((char *)a)[48 * GiB - 1] = 2;
  assert_int_equal(be.malloc(&be, 1, 17 * GiB, &c), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.free(&be, 1, a), 0);
  assert_int_equal(used(0), 0);
  assert_int_equal(used(1), 0);
  assert_int_equal(free_bytes(1), 64 * GiB);
}

static void test_external_usage(void **state) {
  (void)state;
  assert_int_equal(sim_up("1GiB,1GiB", NULL), 0);
  assert_int_equal(gpumem_sim_set_external_usage(0, 768 * MiB), GPUMEM_OK);
  assert_int_equal(free_bytes(0), 256 * MiB);
  assert_int_equal(free_bytes(1), GiB);
  void *a = NULL, *b = NULL;
  assert_int_equal(be.malloc(&be, 0, 512 * MiB, &a), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.malloc(&be, 0, 200 * MiB, &a), 0);
  assert_int_equal(free_bytes(0), 56 * MiB);
  assert_int_equal(used(0), 200 * MiB); /* external usage is not ours */
  assert_int_equal(gpumem_sim_set_external_usage(0, 900 * MiB), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_int_equal(free_bytes(0), 56 * MiB); /* unchanged */
  assert_int_equal(gpumem_sim_set_external_usage(0, 824 * MiB), GPUMEM_OK);
  assert_int_equal(free_bytes(0), 0);
  assert_int_equal(be.vm_create(&be, 0, 2 * MiB, &(gpumem_phys_handle){0}), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(gpumem_sim_set_external_usage(0, 0), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, 512 * MiB, &b), 0);
  assert_int_equal(free_bytes(0), GiB - 712 * MiB);
  assert_int_equal(gpumem_sim_set_external_usage(2, 0), GPUMEM_ERR_INVALID_DEVICE);
  uint64_t u;
  assert_int_equal(gpumem_sim_used_bytes(-1, &u), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_used_bytes(0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(be.free(&be, 0, a), 0);
  assert_int_equal(be.free(&be, 0, b), 0);
  /* external usage lives with the state: a new state starts without it */
  assert_int_equal(gpumem_sim_set_external_usage(1, GiB), GPUMEM_OK);
  assert_int_equal(free_bytes(1), 0);
  sim_down();
  assert_int_equal(sim_up("1GiB,1GiB", NULL), 0);
  assert_int_equal(free_bytes(1), GiB);
}

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

static int done(int device, gpumem_event ev) {
  int c = -1;
  assert_int_equal(be.event_query(&be, device, ev, &c), 0);
  assert_true(c == 0 || c == 1);
  return c;
}

static void test_events_immediate(void **state) {
  (void)state;
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  gpumem_event e = NULL, f = NULL;
  assert_int_equal(be.event_create(&be, 0, &e), 0);
  assert_non_null(e);
  assert_int_equal(be.event_create(&be, 1, &f), 0);
  assert_ptr_not_equal(e, f);
  assert_true(done(0, e)); /* never recorded: complete */
  assert_int_equal(be.event_record(&be, 0, e, NULL), 0);
  assert_true(done(0, e));
  assert_int_equal(be.event_record(&be, 0, e, (gpumem_stream)(uintptr_t)0x1234), 0); /* a stream never seen */
  assert_true(done(0, e));
  assert_int_equal(be.event_synchronize(&be, 0, e), 0);
  assert_int_equal(be.stream_synchronize(&be, 0, (gpumem_stream)(uintptr_t)0x9999), 0);
  assert_int_equal(be.device_synchronize(&be, 0), 0);
  /* wrong device, unknown event, bad arguments */
  int c;
  assert_int_equal(be.event_record(&be, 1, e, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_query(&be, 1, e, &c), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_query(&be, 0, e, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_query(&be, 0, (gpumem_event)&c, &c), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_destroy(&be, 0, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_destroy(&be, 0, f), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_create(&be, 2, &f), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.event_create(&be, 0, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.device_synchronize(&be, 2), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.stream_synchronize(&be, -1, NULL), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.event_destroy(&be, 0, e), 0);
  assert_int_equal(be.event_destroy(&be, 0, e), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_destroy(&be, 1, f), 0);
  /* an event left alive is freed by the last shutdown (ASan would see a leak) */
  assert_int_equal(be.event_create(&be, 1, &f), 0);
}

static void test_events_delayed(void **state) {
  (void)state;
  gpumem_stream A = (gpumem_stream)(uintptr_t)0xA000, B = (gpumem_stream)(uintptr_t)0xB000;
  gpumem_sim_set_delayed(1); /* before any state: kept */
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  gpumem_event e1, e2, e3, e4, d1;
  assert_int_equal(be.event_create(&be, 0, &e1), 0);
  assert_int_equal(be.event_create(&be, 0, &e2), 0);
  assert_int_equal(be.event_create(&be, 0, &e3), 0);
  assert_int_equal(be.event_create(&be, 0, &e4), 0);
  assert_int_equal(be.event_create(&be, 1, &d1), 0);
  assert_int_equal(be.event_record(&be, 0, e1, A), 0);
  assert_int_equal(be.event_record(&be, 0, e2, B), 0);
  assert_int_equal(be.event_record(&be, 1, d1, A), 0);
  assert_false(done(0, e1));
  assert_false(done(0, e2));
  assert_false(done(1, d1));
  /* completing A on device 0 completes e1 only */
  gpumem_sim_stream_complete(0, A);
  assert_true(done(0, e1));
  assert_false(done(0, e2));
  assert_false(done(1, d1));
  /* later work on A is pending again; stream_synchronize completes it */
  assert_int_equal(be.event_record(&be, 0, e3, A), 0);
  assert_false(done(0, e3));
  assert_true(done(0, e1));
  assert_int_equal(be.stream_synchronize(&be, 0, A), 0);
  assert_true(done(0, e3));
  assert_false(done(0, e2));
  /* event_synchronize completes up to that event, not later work */
  assert_int_equal(be.event_record(&be, 0, e3, B), 0);
  assert_int_equal(be.event_synchronize(&be, 0, e2), 0);
  assert_true(done(0, e2));
  assert_false(done(0, e3));
  /* device_synchronize completes every stream of that device only */
  assert_int_equal(be.event_record(&be, 0, e4, NULL), 0);
  assert_false(done(0, e4));
  assert_int_equal(be.device_synchronize(&be, 0), 0);
  assert_true(done(0, e3));
  assert_true(done(0, e4));
  assert_false(done(1, d1));
  /* device -1 completes that stream on every device */
  assert_int_equal(be.event_record(&be, 0, e1, A), 0);
  gpumem_sim_stream_complete(-1, A);
  assert_true(done(0, e1));
  assert_true(done(1, d1));
  /* re-recording moves the event */
  assert_int_equal(be.event_record(&be, 1, d1, B), 0);
  assert_false(done(1, d1));
  gpumem_sim_stream_complete(1, (gpumem_stream)(uintptr_t)0xC000); /* unknown stream: nothing */
  assert_false(done(1, d1));
  gpumem_sim_complete_all();
  assert_true(done(1, d1));
  /* turning delayed mode off completes what is pending */
  assert_int_equal(be.event_record(&be, 0, e1, A), 0);
  assert_int_equal(be.event_record(&be, 0, e2, NULL), 0);
  assert_false(done(0, e1));
  gpumem_sim_set_delayed(0);
  assert_true(done(0, e1));
  assert_true(done(0, e2));
  assert_int_equal(be.event_record(&be, 0, e1, A), 0);
  assert_true(done(0, e1));
  gpumem_event all[] = {e1, e2, e3, e4};
  for (int i = 0; i < 4; i++) assert_int_equal(be.event_destroy(&be, 0, all[i]), 0);
  assert_int_equal(be.event_destroy(&be, 1, d1), 0);
}

/* stream_wait_event: B's later work waits for A's event, so B's completion completes A up to the
 * event (and no further); a complete event, one of the same stream, and bad arguments. */
static void test_stream_wait_event(void **state) {
  (void)state;
  gpumem_stream A = (gpumem_stream)(uintptr_t)0xA000, B = (gpumem_stream)(uintptr_t)0xB000;
  gpumem_sim_set_delayed(1);
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  assert_true(be.version >= 4 && be.stream_wait_event != NULL);
  gpumem_event ea, ea2, eb, d1;
  assert_int_equal(be.event_create(&be, 0, &ea), 0);
  assert_int_equal(be.event_create(&be, 0, &ea2), 0);
  assert_int_equal(be.event_create(&be, 0, &eb), 0);
  assert_int_equal(be.event_create(&be, 1, &d1), 0);
  assert_int_equal(be.event_record(&be, 0, ea, A), 0);
  assert_int_equal(be.stream_wait_event(&be, 0, B, ea), 0);
  assert_int_equal(be.event_record(&be, 0, ea2, A), 0); /* after the wait: not waited for */
  assert_int_equal(be.event_record(&be, 0, eb, B), 0);
  assert_false(done(0, ea));
  gpumem_sim_stream_complete(0, B);
  assert_true(done(0, eb));
  assert_true(done(0, ea));
  assert_false(done(0, ea2));
  /* the same through event_synchronize and stream_synchronize */
  assert_int_equal(be.event_record(&be, 0, ea, A), 0);
  assert_int_equal(be.stream_wait_event(&be, 0, B, ea), 0);
  assert_int_equal(be.event_record(&be, 0, ea2, A), 0);
  assert_int_equal(be.event_record(&be, 0, eb, B), 0);
  assert_int_equal(be.event_synchronize(&be, 0, eb), 0);
  assert_true(done(0, ea));
  assert_false(done(0, ea2));
  assert_int_equal(be.event_record(&be, 0, ea, A), 0);
  assert_int_equal(be.stream_wait_event(&be, 0, NULL, ea), 0);
  assert_int_equal(be.stream_synchronize(&be, 0, NULL), 0);
  assert_true(done(0, ea));
  /* chains: B waits for A, the default stream for B */
  assert_int_equal(be.event_record(&be, 0, ea, A), 0);
  assert_int_equal(be.stream_wait_event(&be, 0, B, ea), 0);
  assert_int_equal(be.event_record(&be, 0, eb, B), 0);
  assert_int_equal(be.stream_wait_event(&be, 0, NULL, eb), 0);
  gpumem_sim_stream_complete(0, NULL);
  assert_true(done(0, eb));
  assert_true(done(0, ea));
  /* a complete event, or one of the same stream: nothing to wait for */
  assert_int_equal(be.stream_wait_event(&be, 0, B, ea), 0);
  assert_int_equal(be.event_record(&be, 0, ea, A), 0);
  assert_int_equal(be.stream_wait_event(&be, 0, A, ea), 0);
  assert_false(done(0, ea));
  /* bad arguments: an event of another device, no event, a bad device */
  assert_int_equal(be.stream_wait_event(&be, 0, B, d1), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.stream_wait_event(&be, 0, B, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.stream_wait_event(&be, 7, B, ea), GPUMEM_SIM_ERR_INVALID_DEVICE);
  /* an injected fault */
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.stream_wait_event(&be, 0, B, ea), GPUMEM_SIM_ERR_INJECTED);
  gpumem_sim_fail_clear();
  /* a capturing stream may not wait for an event from outside its capture: it is invalidated */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, B, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(be.stream_wait_event(&be, 0, B, ea), GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED);
  int inv = 0;
  assert_int_equal(gpumem_sim_stream_end_capture(0, B, &inv), GPUMEM_OK);
  assert_true(inv);
  gpumem_sim_complete_all();
  gpumem_event all[] = {ea, ea2, eb};
  for (int i = 0; i < 3; i++) assert_int_equal(be.event_destroy(&be, 0, all[i]), 0);
  assert_int_equal(be.event_destroy(&be, 1, d1), 0);
  gpumem_sim_set_delayed(0);
}

/* The caller's own work (gpumem_sim_stream_submit, _wait, _done, _ordered): items complete with their
 * stream's work, at once unless delayed; a wait orders a stream's later items after another's, through
 * chains of waits too; bad input. */
static void test_caller_work(void **state) {
  (void)state;
  gpumem_stream A = (gpumem_stream)(uintptr_t)0xA000, B = (gpumem_stream)(uintptr_t)0xB000;
  uint64_t t = 0, ta = 0, tb = 0;
  int d = -1;
  assert_int_equal(gpumem_sim_stream_submit(0, A, &t), GPUMEM_ERR_NO_BACKEND); /* no sim yet */
  assert_int_equal(gpumem_sim_stream_done(0, A, 1, &d), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(gpumem_sim_stream_wait(0, A, B), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(gpumem_sim_stream_ordered(0, A, B, 1, &d), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  /* immediate mode: done at once */
  assert_int_equal(gpumem_sim_stream_submit(0, A, &t), GPUMEM_OK);
  assert_true(t >= 1);
  assert_int_equal(gpumem_sim_stream_done(0, A, t, &d), GPUMEM_OK);
  assert_int_equal(d, 1);
  /* a stream never used has completed ticket 0 only */
  assert_int_equal(gpumem_sim_stream_done(1, B, 0, &d), GPUMEM_OK);
  assert_int_equal(d, 1);
  assert_int_equal(gpumem_sim_stream_done(1, B, 1, &d), GPUMEM_OK);
  assert_int_equal(d, 0);
  /* delayed: pending until the stream's work completes */
  gpumem_sim_set_delayed(1);
  assert_int_equal(gpumem_sim_stream_submit(0, A, &ta), GPUMEM_OK);
  assert_int_equal(ta, t + 1);
  assert_int_equal(gpumem_sim_stream_done(0, A, ta, &d), GPUMEM_OK);
  assert_int_equal(d, 0);
  /* B waits for A: completing B completes A's item too, not A's later one */
  assert_int_equal(gpumem_sim_stream_wait(0, B, A), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_submit(0, A, &t), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_submit(0, B, &tb), GPUMEM_OK);
  gpumem_sim_stream_complete(0, B);
  assert_int_equal(gpumem_sim_stream_done(0, B, tb, &d), GPUMEM_OK);
  assert_int_equal(d, 1);
  assert_int_equal(gpumem_sim_stream_done(0, A, ta, &d), GPUMEM_OK);
  assert_int_equal(d, 1);
  assert_int_equal(gpumem_sim_stream_done(0, A, t, &d), GPUMEM_OK);
  assert_int_equal(d, 0);
  /* ordered: A's pending item is not before B's later work (no wait), it is before A's own and, after
   * B waits for A and the default stream for B, before the default stream's (a chain) */
  int o = -1;
  assert_int_equal(gpumem_sim_stream_ordered(0, B, A, t, &o), GPUMEM_OK);
  assert_int_equal(o, 0);
  assert_int_equal(gpumem_sim_stream_ordered(0, A, A, t, &o), GPUMEM_OK);
  assert_int_equal(o, 1);
  assert_int_equal(gpumem_sim_stream_wait(0, B, A), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_submit(0, B, &tb), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_ordered(0, NULL, A, t, &o), GPUMEM_OK);
  assert_int_equal(o, 0);
  assert_int_equal(gpumem_sim_stream_wait(0, NULL, B), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_ordered(0, B, A, t, &o), GPUMEM_OK);
  assert_int_equal(o, 1);
  assert_int_equal(gpumem_sim_stream_ordered(0, NULL, A, t, &o), GPUMEM_OK);
  assert_int_equal(o, 1);
  assert_int_equal(gpumem_sim_stream_ordered(0, NULL, A, t + 1, &o), GPUMEM_OK); /* not queued yet */
  assert_int_equal(o, 0);
  assert_int_equal(gpumem_sim_stream_ordered(1, B, A, 1, &o), GPUMEM_OK); /* streams device 1 never saw */
  assert_int_equal(o, 0);
  assert_int_equal(gpumem_sim_stream_ordered(1, B, A, 0, &o), GPUMEM_OK);
  assert_int_equal(o, 1);
  gpumem_sim_stream_complete(0, NULL);
  assert_int_equal(gpumem_sim_stream_done(0, A, t, &d), GPUMEM_OK);
  assert_int_equal(d, 1);
  /* nothing to wait for: A's work done, or the same stream; the default stream is a stream */
  gpumem_sim_stream_complete(0, A);
  assert_int_equal(gpumem_sim_stream_wait(0, B, A), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_wait(0, A, A), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_submit(0, NULL, &t), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_done(0, NULL, t, &d), GPUMEM_OK);
  assert_int_equal(d, 0);
  gpumem_sim_complete_all();
  assert_int_equal(gpumem_sim_stream_done(0, NULL, t, &d), GPUMEM_OK);
  assert_int_equal(d, 1);
  /* bad input: nothing changes */
  d = 7;
  t = 9;
  assert_int_equal(gpumem_sim_stream_submit(0, A, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_done(0, A, 1, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_submit(5, A, &t), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_done(-1, A, 1, &d), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_wait(2, A, B), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_ordered(0, A, B, 1, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_ordered(9, A, B, 1, &d), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(t, 9);
  assert_int_equal(d, 7);
  /* a capturing stream queues nothing of the caller's */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, B, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_submit(0, B, &t), GPUMEM_ERR_BACKEND);
  assert_int_equal(gpumem_sim_stream_wait(0, B, A), GPUMEM_ERR_BACKEND);
  assert_int_equal(t, 9);
  int inv = 1;
  assert_int_equal(gpumem_sim_stream_end_capture(0, B, &inv), GPUMEM_OK);
  gpumem_sim_set_delayed(0);
}

/* Clocked delayed mode: records carry the clock; complete_before completes those made before a
 * clock, per stream in order; a stream keeps at most 1024 records pending; delayed mode off ends it. */
static void test_events_clocked(void **state) {
  (void)state;
  gpumem_stream A = (gpumem_stream)(uintptr_t)0xA000, B = (gpumem_stream)(uintptr_t)0xB000;
  gpumem_sim_set_delayed(1);
  assert_int_equal(sim_up("1x1GiB", NULL), 0);
  gpumem_event e1, e2, e3, e4;
  assert_int_equal(be.event_create(&be, 0, &e1), 0);
  assert_int_equal(be.event_create(&be, 0, &e2), 0);
  assert_int_equal(be.event_create(&be, 0, &e3), 0);
  assert_int_equal(be.event_create(&be, 0, &e4), 0);
  gpumem_sim_set_clock(10);
  assert_int_equal(be.event_record(&be, 0, e1, A), 0);
  gpumem_sim_set_clock(20);
  assert_int_equal(be.event_record(&be, 0, e2, B), 0);
  assert_int_equal(be.event_record(&be, 0, e3, A), 0);
  gpumem_sim_complete_before(10); /* nothing was recorded before 10 */
  assert_false(done(0, e1));
  gpumem_sim_complete_before(11);
  assert_true(done(0, e1));
  assert_false(done(0, e2));
  assert_false(done(0, e3));
  /* re-recording e1 at 30 moves it behind the clock again */
  gpumem_sim_set_clock(30);
  assert_int_equal(be.event_record(&be, 0, e1, A), 0);
  gpumem_sim_complete_before(21);
  assert_true(done(0, e2));
  assert_true(done(0, e3));
  assert_false(done(0, e1));
  /* more than 1024 records pending on a stream: the oldest complete */
  assert_int_equal(be.event_record(&be, 0, e4, B), 0); /* at 30 */
  for (int i = 0; i < 1024; i++) assert_int_equal(be.event_record(&be, 0, e2, B), 0);
  assert_true(done(0, e4));
  assert_false(done(0, e2));
  assert_false(done(0, e1));
  /* delayed mode off completes everything and ends the clock */
  gpumem_sim_set_delayed(0);
  assert_true(done(0, e1));
  assert_true(done(0, e2));
  gpumem_event all[] = {e1, e2, e3, e4};
  for (int i = 0; i < 4; i++) assert_int_equal(be.event_destroy(&be, 0, all[i]), 0);
}

/* ------------------------------------------------------------------------ */
/* Device reset                                                              */

static void test_device_reset(void **state) {
  (void)state;
  gpumem_sim_set_delayed(1);
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  void *a, *b, *c, *va;
  gpumem_phys_handle h;
  assert_int_equal(be.malloc(&be, 0, 10 * MiB, &a), 0);
  assert_int_equal(be.malloc(&be, 0, 4096, &b), 0);
  assert_int_equal(be.malloc(&be, 1, 3 * MiB, &c), 0);
  assert_int_equal(be.vm_reserve(&be, 0, 8 * MiB, &va), 0);
  assert_int_equal(be.vm_create(&be, 0, 4 * MiB, &h), 0);
  assert_int_equal(be.vm_map(&be, 0, va, 4 * MiB, h), 0);
  memset(va, 7, 4 * MiB);
  gpumem_event e;
  assert_int_equal(be.event_create(&be, 0, &e), 0);
  assert_int_equal(be.event_record(&be, 0, e, (gpumem_stream)(uintptr_t)0x77), 0);
  assert_false(done(0, e));
  assert_int_equal(used(0), 14 * MiB + 4096);

  assert_int_equal(be.device_reset(&be, 0), 0);
  assert_int_equal(used(0), 0);
  assert_int_equal(free_bytes(0), GiB);
  assert_int_equal(used(1), 3 * MiB);
  assert_true(done(0, e)); /* its streams were completed; the event stays valid */
  assert_int_equal(be.free(&be, 0, a), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_destroy(&be, 0, h), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_release(&be, 0, va, 8 * MiB), GPUMEM_SIM_ERR_INVALID_VALUE);
  memset(c, 1, 3 * MiB); /* the other device is untouched */
  /* the device works normally again */
  assert_int_equal(be.malloc(&be, 0, GiB, &a), 0);
  memset(a, 3, MiB);
  assert_int_equal(be.free(&be, 0, a), 0);
  assert_int_equal(be.vm_reserve(&be, 0, 2 * MiB, &va), 0);
  assert_int_equal(be.vm_create(&be, 0, 2 * MiB, &h), 0);
  assert_int_equal(be.vm_map(&be, 0, va, 2 * MiB, h), 0);
  assert_int_equal(((char *)va)[100], 0);
  assert_int_equal(be.device_reset(&be, 0), 0);
  assert_int_equal(be.device_reset(&be, 0), 0);
  assert_int_equal(be.device_reset(&be, 2), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.event_destroy(&be, 0, e), 0);
  assert_int_equal(be.free(&be, 1, c), 0);
  (void)b;
}

/* ------------------------------------------------------------------------ */
/* Virtual memory                                                            */

static void test_vm_roundtrip(void **state) {
  (void)state;
  assert_int_equal(sim_up("2x64MiB", NULL), 0);
  const size_t G = 2 * MiB;
  size_t gran = 0;
  assert_int_equal(be.vm_granularity(&be, 0, &gran), 0);
  assert_int_equal(gran, G);
  assert_int_equal(be.vm_granularity(&be, 2, &gran), GPUMEM_SIM_ERR_INVALID_DEVICE);
  assert_int_equal(be.vm_granularity(&be, 0, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);

  void *va0 = NULL;
  assert_int_equal(be.vm_reserve(&be, 0, 8 * G + 1, &va0), 0); /* rounded up to 9 granules */
  assert_int_equal((uintptr_t)va0 % G, 0);
  char *va = va0;
  assert_int_equal(used(0), 0); /* reserving costs nothing */

  gpumem_phys_handle h1, h2, h3;
  assert_int_equal(be.vm_create(&be, 0, 2 * G, &h1), 0);
  assert_int_equal(be.vm_create(&be, 0, G, &h2), 0);
  assert_int_equal(used(0), 3 * G);
  assert_int_equal(free_bytes(0), 64 * MiB - 3 * G);
  assert_int_equal(be.vm_map(&be, 0, va, 2 * G, h1), 0);
  assert_int_equal(be.vm_map(&be, 0, va + 2 * G, G, h2), 0);
  for (size_t i = 0; i < 3 * G; i += 4096) assert_int_equal(va[i], 0);
  memset(va, 0xab, 3 * G);
  assert_int_equal((unsigned char)va[3 * G - 1], 0xab);

  /* validation */
  assert_int_equal(be.vm_create(&be, 0, G + 1, &h3), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_create(&be, 0, 0, &h3), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_create(&be, 0, G, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_create(&be, 0, 64 * MiB, &h3), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.vm_create(&be, 0, G, &h3), 0);
  assert_int_equal(be.vm_map(&be, 0, va + 4096, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE);   /* misaligned */
  assert_int_equal(be.vm_map(&be, 0, va + 4 * G, 4096, h3), GPUMEM_SIM_ERR_INVALID_VALUE); /* size */
  assert_int_equal(be.vm_map(&be, 0, va + 2 * G, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE);  /* overlap */
  assert_int_equal(be.vm_map(&be, 0, va + G, 2 * G, h3), GPUMEM_SIM_ERR_INVALID_VALUE);  /* overlap, bigger than h3 */
  assert_int_equal(be.vm_map(&be, 0, va + G, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE);  /* inside the mapping before */
  assert_int_equal(be.vm_map(&be, 0, va + 4 * G, 2 * G, h3), GPUMEM_SIM_ERR_INVALID_VALUE); /* bigger than h3 */
  assert_int_equal(be.vm_map(&be, 0, va + 9 * G, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE);  /* past the reservation */
  assert_int_equal(be.vm_map(&be, 0, va + 8 * G, 2 * G, h1), GPUMEM_SIM_ERR_INVALID_VALUE); /* straddles the end */
  assert_int_equal(be.vm_map(&be, 0, va + 4 * G, G, 999999), GPUMEM_SIM_ERR_INVALID_VALUE); /* unknown handle */
  assert_int_equal(be.vm_map(&be, 0, NULL, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_map(&be, 1, va + 4 * G, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE); /* other device */
  assert_int_equal(be.vm_unmap(&be, 0, va, G), GPUMEM_SIM_ERR_INVALID_VALUE);      /* half of a mapping */
  assert_int_equal(be.vm_unmap(&be, 0, va + G, 2 * G), GPUMEM_SIM_ERR_INVALID_VALUE); /* starts inside one */
  assert_int_equal(be.vm_unmap(&be, 0, va + 2 * G, 2 * G), GPUMEM_SIM_ERR_INVALID_VALUE); /* gap */
  assert_int_equal(be.vm_unmap(&be, 0, va + 4 * G, G), GPUMEM_SIM_ERR_INVALID_VALUE); /* nothing mapped */
  assert_int_equal(be.vm_unmap(&be, 1, va, 2 * G), GPUMEM_SIM_ERR_INVALID_VALUE);  /* other device */
  assert_int_equal(be.vm_release(&be, 0, va, 9 * G), GPUMEM_SIM_ERR_INVALID_VALUE); /* still mapped */
  assert_int_equal(be.vm_release(&be, 0, va + G, 8 * G), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_reserve(&be, 0, 0, &va0), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_reserve(&be, 0, G, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_destroy(&be, 1, h3), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.vm_destroy(&be, 0, 0), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal((unsigned char)va[0], 0xab); /* nothing changed */

  /* unmap two adjacent mappings at once; RAM is given back: re-mapping reads zeros */
  assert_int_equal(be.vm_unmap(&be, 0, va, 3 * G), 0);
  assert_int_equal(used(0), 4 * G); /* chunks still exist */
  assert_int_equal(be.vm_map(&be, 0, va, 2 * G, h1), 0);
  for (size_t i = 0; i < 2 * G; i += 4096) assert_int_equal(va[i], 0);
  unsigned char vec[4];
  assert_int_equal(mincore(va + 2 * G, 4 * 4096, vec), 0);
  for (int i = 0; i < 4; i++) assert_int_equal(vec[i] & 1, 0); /* unmapped range has no RAM */

  /* destroy while mapped: the charge goes once also unmapped */
  assert_int_equal(be.vm_destroy(&be, 0, h1), 0);
  assert_int_equal(be.vm_destroy(&be, 0, h1), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(used(0), 4 * G);
  va[5] = 1; /* still mapped, still usable */
  assert_int_equal(be.vm_map(&be, 0, va + 4 * G, 2 * G, h1), GPUMEM_SIM_ERR_INVALID_VALUE); /* destroyed */
  assert_int_equal(be.vm_unmap(&be, 0, va, 2 * G), 0);
  assert_int_equal(used(0), 2 * G);
  assert_int_equal(be.vm_destroy(&be, 0, h2), 0); /* never mapped again: uncharged at once */
  assert_int_equal(used(0), G);
  /* a chunk may be mapped at two places (no aliasing in the sim) */
  assert_int_equal(be.vm_map(&be, 0, va + 8 * G, G, h3), 0); /* (out of address order) */
  assert_int_equal(be.vm_map(&be, 0, va + 6 * G, G, h3), 0);
  assert_int_equal(be.vm_map(&be, 0, va + 8 * G, G, h3), GPUMEM_SIM_ERR_INVALID_VALUE); /* mapped there */
  va[8 * G + 1] = 5;
  assert_int_equal(be.vm_destroy(&be, 0, h3), 0);
  assert_int_equal(be.vm_unmap(&be, 0, va + 6 * G, G), 0);
  assert_int_equal(used(0), G);
  assert_int_equal(va[8 * G + 1], 5);
  assert_int_equal(be.vm_unmap(&be, 0, va + 8 * G, G), 0);
  assert_int_equal(used(0), 0);
  assert_int_equal(be.vm_release(&be, 0, va, 8 * G + 1), 0); /* size as given to reserve */
  assert_int_equal(be.vm_release(&be, 0, va, 9 * G), GPUMEM_SIM_ERR_INVALID_VALUE); /* gone */

  /* a reservation and chunks left alive are freed by the last shutdown */
  assert_int_equal(be.vm_reserve(&be, 1, 4 * G, &va0), 0);
  assert_int_equal(be.vm_create(&be, 1, G, &h1), 0);
  assert_int_equal(be.vm_map(&be, 1, (char *)va0 + G, G, h1), 0);
  assert_int_equal(used(1), G);
}

/* ------------------------------------------------------------------------ */
/* Fault injection                                                           */

static void test_fault_malloc_free(void **state) {
  (void)state;
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_KINDS_, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_nth((gpumem_sim_call)-1, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 0, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, 0, 0), GPUMEM_ERR_INVALID_ARGUMENT);

  void *z = NULL;
  assert_int_equal(be.malloc(&be, 0, MiB, &z), GPUMEM_SIM_ERR_NO_DEVICE); /* no state: counted */
  assert_true(gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC) >= 1);
  assert_int_equal(sim_up("1GiB", NULL), 0);
  /* counts start again with the state */
  for (int k = 0; k < GPUMEM_SIM_CALL_KINDS_; k++) assert_int_equal(gpumem_sim_call_count((gpumem_sim_call)k), 0);
  uint64_t n0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC);
  void *p[4] = {NULL, NULL, NULL, NULL}, *q = (void *)&n0;
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 2, GPUMEM_SIM_ERR_OUT_OF_MEMORY, 0), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, MiB, &p[0]), 0);
  assert_int_equal(be.malloc(&be, 0, MiB, &q), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(q, &n0);
  assert_int_equal(used(0), MiB); /* the failed call did nothing */
  assert_int_equal(be.malloc(&be, 0, MiB, &p[1]), 0);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC), n0 + 3);
  /* vm_create counts as MALLOC; repeat fails every later call until cleared */
  gpumem_phys_handle h;
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_int_equal(be.vm_create(&be, 0, 2 * MiB, &h), GPUMEM_SIM_ERR_INJECTED);
  for (int i = 0; i < 5; i++) assert_int_equal(be.malloc(&be, 0, 4096, &q), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(used(0), 2 * MiB);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_MALLOC), n0 + 9);
  gpumem_sim_fail_clear();
  assert_int_equal(be.vm_create(&be, 0, 2 * MiB, &h), 0);
  assert_int_equal(be.malloc(&be, 0, 4096, &p[2]), 0);
  /* repeat from the 3rd call on */
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 3, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, 4096, &p[3]), 0);
  assert_int_equal(be.malloc(&be, 0, 4096, &q), 0);
  assert_int_equal(be.free(&be, 0, q), 0);
  assert_int_equal(be.malloc(&be, 0, 4096, &q), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.malloc(&be, 0, 4096, &q), GPUMEM_SIM_ERR_INJECTED);
  /* a new fail_nth replaces the old one */
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 2, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, 4096, &q), 0);
  assert_int_equal(be.free(&be, 0, q), 0);
  assert_int_equal(be.malloc(&be, 0, 4096, &q), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.malloc(&be, 0, 4096, &q), 0);
  assert_int_equal(be.free(&be, 0, q), 0);

  /* FREE covers free and vm_destroy; a failed free leaves the pointer valid */
  uint64_t f0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_FREE);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_FREE, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.free(&be, 0, p[0]), GPUMEM_SIM_ERR_INJECTED);
  memset(p[0], 1, MiB);
  assert_int_equal(be.free(&be, 0, p[0]), 0);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_FREE, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_int_equal(be.vm_destroy(&be, 0, h), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.free(&be, 0, p[1]), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.free(&be, 0, NULL), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_FREE), f0 + 5);
  gpumem_sim_fail_clear();
  assert_int_equal(be.vm_destroy(&be, 0, h), 0);
  for (int i = 1; i < 4; i++) assert_int_equal(be.free(&be, 0, p[i]), 0);
  assert_int_equal(used(0), 0);
}

/* fail_every: call nth and every every-th after it fail, the ones between succeed, until cleared */
static void test_fault_every(void **state) {
  (void)state;
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_KINDS_, 1, 2, GPUMEM_SIM_ERR_INJECTED), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_every((gpumem_sim_call)-1, 1, 2, GPUMEM_SIM_ERR_INJECTED), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_MALLOC, 0, 2, GPUMEM_SIM_ERR_INJECTED), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_MALLOC, 1, 0, GPUMEM_SIM_ERR_INJECTED), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_MALLOC, 1, 2, 0), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(sim_up("1GiB", NULL), 0);
  void *q = NULL;
  assert_int_equal(be.malloc(&be, 0, MiB, &q), 0); /* the refused calls armed nothing */
  assert_int_equal(be.free(&be, 0, q), 0);
  /* the 2nd, 5th and 8th calls fail */
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_MALLOC, 2, 3, GPUMEM_SIM_ERR_OUT_OF_MEMORY), GPUMEM_OK);
  void *p[9];
  int failed = 0;
  for (int i = 0; i < 9; i++) {
    int rc = be.malloc(&be, 0, MiB, &p[i]);
    assert_int_equal(rc, (i % 3 == 1) ? GPUMEM_SIM_ERR_OUT_OF_MEMORY : 0);
    if (rc != 0) p[i] = NULL, failed++;
  }
  assert_int_equal(failed, 3);
  assert_int_equal(used(0), 6 * MiB); /* the failed calls did nothing */
  /* a fail_nth replaces it; fail_clear ends it */
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_MALLOC, 1, 1, GPUMEM_SIM_ERR_INJECTED), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, MiB, &q), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.malloc(&be, 0, MiB, &q), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MALLOC, 2, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, MiB, &q), 0);
  assert_int_equal(be.free(&be, 0, q), 0);
  assert_int_equal(be.malloc(&be, 0, MiB, &q), GPUMEM_SIM_ERR_INJECTED);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(be.malloc(&be, 0, MiB, &q), 0);
    assert_int_equal(be.free(&be, 0, q), 0);
  }
  assert_int_equal(gpumem_sim_fail_every(GPUMEM_SIM_CALL_FREE, 1, 2, GPUMEM_SIM_ERR_INJECTED), GPUMEM_OK);
  gpumem_sim_fail_clear();
  for (int i = 0; i < 9; i++)
    if (p[i] != NULL) assert_int_equal(be.free(&be, 0, p[i]), 0);
  assert_int_equal(used(0), 0);
}

static void test_fault_event_info_sync_map(void **state) {
  (void)state;
  /* injected before any state exists */
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_INFO, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  gpumem_backend_device_info di;
  uint64_t fb, tb, i0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_INFO);
  assert_int_equal(be.device_info(&be, 0, &di), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.device_info(&be, 0, &di), 0);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_INFO, 2, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.mem_get_info(&be, 1, &fb, &tb), 0);
  assert_int_equal(be.mem_get_info(&be, 1, &fb, &tb), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.mem_get_info(&be, 1, &fb, &tb), 0);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_INFO), i0 + 5);
  int n;
  assert_int_equal(be.device_count(&be, &n), 0); /* not an INFO call */
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_INFO), i0 + 5);

  /* EVENT: create, record, query, synchronize (destroy never fails) */
  gpumem_sim_set_delayed(1);
  gpumem_event e = NULL, x = (gpumem_event)&n;
  uint64_t e0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_EVENT);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.event_create(&be, 0, &x), GPUMEM_SIM_ERR_INJECTED);
  assert_ptr_equal(x, &n);
  assert_int_equal(be.event_create(&be, 0, &e), 0);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.event_record(&be, 0, e, NULL), GPUMEM_SIM_ERR_INJECTED);
  assert_true(done(0, e)); /* the failed record did not record */
  assert_int_equal(be.event_record(&be, 0, e, NULL), 0);
  int c = 7;
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_EVENT, 1, GPUMEM_SIM_ERR_INJECTED, 1), GPUMEM_OK);
  assert_int_equal(be.event_query(&be, 0, e, &c), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(c, 7);
  assert_int_equal(be.event_synchronize(&be, 0, e), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.event_destroy(&be, 0, x), GPUMEM_SIM_ERR_INVALID_VALUE); /* destroy is not injected */
  gpumem_sim_fail_clear();
  assert_false(done(0, e)); /* the failed synchronize did not wait */
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_EVENT), e0 + 8);

  /* SYNC: stream and device synchronize */
  uint64_t s0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_SYNC, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.stream_synchronize(&be, 0, NULL), GPUMEM_SIM_ERR_INJECTED);
  assert_false(done(0, e));
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_SYNC, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.device_synchronize(&be, 0), GPUMEM_SIM_ERR_INJECTED);
  assert_false(done(0, e));
  assert_int_equal(be.device_synchronize(&be, 0), 0);
  assert_true(done(0, e));
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_SYNC), s0 + 3);
  assert_int_equal(be.event_destroy(&be, 0, e), 0);

  /* MAP: vm_reserve, vm_map, vm_unmap */
  uint64_t m0 = gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP);
  void *va = (void *)&n;
  gpumem_phys_handle h;
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.vm_reserve(&be, 0, 4 * MiB, &va), GPUMEM_SIM_ERR_INJECTED);
  assert_ptr_equal(va, &n);
  assert_int_equal(be.vm_reserve(&be, 0, 4 * MiB, &va), 0);
  assert_int_equal(be.vm_create(&be, 0, 2 * MiB, &h), 0);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 1, GPUMEM_SIM_ERR_OUT_OF_MEMORY, 0), GPUMEM_OK);
  assert_int_equal(be.vm_map(&be, 0, va, 2 * MiB, h), GPUMEM_SIM_ERR_OUT_OF_MEMORY);
  assert_int_equal(be.vm_unmap(&be, 0, va, 2 * MiB), GPUMEM_SIM_ERR_INVALID_VALUE); /* was not mapped */
  assert_int_equal(be.vm_map(&be, 0, va, 2 * MiB, h), 0);
  memset(va, 9, 2 * MiB);
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_MAP, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  assert_int_equal(be.vm_unmap(&be, 0, va, 2 * MiB), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(((unsigned char *)va)[12345], 9); /* still mapped */
  assert_int_equal(be.vm_unmap(&be, 0, va, 2 * MiB), 0);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP), m0 + 7);
  assert_int_equal(be.vm_destroy(&be, 0, h), 0);
  assert_int_equal(be.vm_release(&be, 0, va, 4 * MiB), 0); /* not a MAP call */
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_MAP), m0 + 7);
  assert_int_equal(used(0), 0);

  /* an injected fault that outlives the state still fires in the next one */
  assert_int_equal(gpumem_sim_fail_nth(GPUMEM_SIM_CALL_SYNC, 1, GPUMEM_SIM_ERR_INJECTED, 0), GPUMEM_OK);
  sim_down();
  assert_int_equal(sim_up("1GiB", NULL), 0);
  assert_int_equal(be.device_synchronize(&be, 0), GPUMEM_SIM_ERR_INJECTED);
  assert_int_equal(be.device_synchronize(&be, 0), 0);
  assert_int_equal(gpumem_sim_call_count(GPUMEM_SIM_CALL_KINDS_), 0);
}

/* ------------------------------------------------------------------------ */
/* Threads                                                                   */

#define NTHREADS 8
#define NITER 400

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  int dev = id % 2;
  gpumem_stream s = (gpumem_stream)(uintptr_t)(0x1000 + id);
  gpumem_event e = NULL;
  if (be.event_create(&be, dev, &e) != 0) return (void *)1;
  for (int i = 0; i < NITER; i++) {
    void *p = NULL;
    size_t sz = (size_t)((i * 7919 + id * 131) % 200 + 1) * 1024;
    if (be.malloc(&be, dev, sz, &p) != 0) return (void *)2;
    memset(p, id, sz);
    if (be.event_record(&be, dev, e, s) != 0) return (void *)3;
    int c = 0;
    if (be.event_query(&be, dev, e, &c) != 0 || !c) return (void *)4;
    if (((unsigned char *)p)[sz - 1] != (unsigned char)id) return (void *)5;
    if (be.free(&be, dev, p) != 0) return (void *)6;
    if (i % 50 == 0) {
      uint64_t f, t;
      if (be.mem_get_info(&be, dev, &f, &t) != 0) return (void *)7;
      void *va;
      gpumem_phys_handle h;
      if (be.vm_reserve(&be, dev, 4 * MiB, &va) != 0 || be.vm_create(&be, dev, 2 * MiB, &h) != 0 ||
          be.vm_map(&be, dev, va, 2 * MiB, h) != 0)
        return (void *)8;
      memset(va, id, 2 * MiB);
      if (be.vm_unmap(&be, dev, va, 2 * MiB) != 0 || be.vm_destroy(&be, dev, h) != 0 ||
          be.vm_release(&be, dev, va, 4 * MiB) != 0)
        return (void *)9;
    }
  }
  if (be.event_destroy(&be, dev, e) != 0) return (void *)10;
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  assert_int_equal(sim_up("2x1GiB", NULL), 0);
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
  for (int i = 0; i < NTHREADS; i++) {
    void *r = (void *)1;
    assert_int_equal(pthread_join(t[i], &r), 0);
    assert_null(r);
  }
  assert_int_equal(used(0), 0);
  assert_int_equal(used(1), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_vtable, setup, teardown),
    cmocka_unit_test_setup_teardown(test_error_mapping, setup, teardown),
    cmocka_unit_test_setup_teardown(test_sim_devices_env, setup, teardown),
    cmocka_unit_test_setup_teardown(test_reinit_and_refcount, setup, teardown),
    cmocka_unit_test_setup_teardown(test_visible_devices, setup, teardown),
    cmocka_unit_test_setup_teardown(test_uuid_and_info, setup, teardown),
    cmocka_unit_test_setup_teardown(test_memory_rw, setup, teardown),
    cmocka_unit_test_setup_teardown(test_memory_many, setup, teardown),
    cmocka_unit_test_setup_teardown(test_capacity_oom, setup, teardown),
    cmocka_unit_test_setup_teardown(test_external_usage, setup, teardown),
    cmocka_unit_test_setup_teardown(test_events_immediate, setup, teardown),
    cmocka_unit_test_setup_teardown(test_events_delayed, setup, teardown),
    cmocka_unit_test_setup_teardown(test_stream_wait_event, setup, teardown),
    cmocka_unit_test_setup_teardown(test_caller_work, setup, teardown),
    cmocka_unit_test_setup_teardown(test_events_clocked, setup, teardown),
    cmocka_unit_test_setup_teardown(test_device_reset, setup, teardown),
    cmocka_unit_test_setup_teardown(test_vm_roundtrip, setup, teardown),
    cmocka_unit_test_setup_teardown(test_fault_malloc_free, setup, teardown),
    cmocka_unit_test_setup_teardown(test_fault_every, setup, teardown),
    cmocka_unit_test_setup_teardown(test_fault_event_info_sync_map, setup, teardown),
    cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
