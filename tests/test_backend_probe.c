/*
 * test_backend_probe.c: the CUDA and HIP backends on a machine that may have
 * no GPU and no driver (the CPU machine, CI).
 *
 * - "cuda" / "hip" fail cleanly at gpumem_create with GPUMEM_ERR_NO_BACKEND
 *   where there is no device (no /dev/nvidiactl, no /dev/kfd), and print
 *   nothing to stdout or stderr (both are captured around the call);
 * - "auto" falls back to sim there;
 * - the vtables exist when built, and their error mapping is right;
 * - on a machine with the device, the same calls must succeed instead.
 *
 * hw_tests.cmake defines GPUMEM_TEST_HAVE_CUDA / GPUMEM_TEST_HAVE_HIP (0/1)
 * for this file from the configure result.
 */
#include "testutil.h"

#include <fcntl.h>
#include <unistd.h>

#ifndef GPUMEM_TEST_HAVE_CUDA
#define GPUMEM_TEST_HAVE_CUDA 0
#endif
#ifndef GPUMEM_TEST_HAVE_HIP
#define GPUMEM_TEST_HAVE_HIP 0
#endif

/* Raw codes shared by the CUDA runtime and HIP (cudaError_t / hipError_t values). */
#define RAW_INVALID_VALUE 1
#define RAW_OUT_OF_MEMORY 2         /* cudaErrorMemoryAllocation, hipErrorOutOfMemory */
#define RAW_INSUFFICIENT_DRIVER 35  /* cudaErrorInsufficientDriver, hipErrorInsufficientDriver */
#define RAW_NO_DEVICE 100           /* cudaErrorNoDevice, hipErrorNoDevice */
#define RAW_INVALID_DEVICE 101      /* cudaErrorInvalidDevice, hipErrorInvalidDevice */
#define RAW_NOT_SUPPORTED 801       /* cudaErrorNotSupported, hipErrorNotSupported */

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

/* 1 when the machine certainly has no device for the backend: then NO_BACKEND is required. */
static int surely_no_device(const char *backend) {
  if (strcmp(backend, "cuda") == 0) return !file_exists("/dev/nvidiactl") && !file_exists("/dev/nvidia0");
  if (strcmp(backend, "hip") == 0) return !file_exists("/dev/kfd");
  return 0;
}

/* ---- capture of stdout and stderr around a call ---- */

typedef struct capture {
  int saved_out, saved_err;
  FILE *tmp;
} capture;

static void capture_begin(capture *c) {
  fflush(stdout);
  fflush(stderr);
  c->tmp = tmpfile();
  assert_non_null(c->tmp);
  c->saved_out = dup(1);
  c->saved_err = dup(2);
  assert_true(c->saved_out >= 0 && c->saved_err >= 0);
  assert_true(dup2(fileno(c->tmp), 1) >= 0);
  assert_true(dup2(fileno(c->tmp), 2) >= 0);
}

/* Restore the descriptors; returns how many bytes were written meanwhile (and copies up to cap-1 of them). */
static long capture_end(capture *c, char *buf, size_t cap) {
  long n;
  fflush(stdout);
  fflush(stderr);
  dup2(c->saved_out, 1);
  dup2(c->saved_err, 2);
  close(c->saved_out);
  close(c->saved_err);
  n = ftell(c->tmp);
  if (buf && cap) {
    size_t got;
    rewind(c->tmp);
    got = fread(buf, 1, cap - 1, c->tmp);
    buf[got] = '\0';
  }
  fclose(c->tmp);
  return n;
}

static gpumem_status create_with(const char *backend, gpumem_context **out, long *printed, char *text, size_t cap) {
  gpumem_config cfg;
  gpumem_status st;
  capture c;
  gpumem_config_init(&cfg);
  cfg.backend = backend;
  capture_begin(&c);
  st = gpumem_create(&cfg, out);
  *printed = capture_end(&c, text, cap);
  return st;
}

/* ---- tests ---- */

static void test_builtin_vtables(void **state) {
  const gpumem_backend *cu = gpumem_builtin_backend("cuda");
  const gpumem_backend *hip = gpumem_builtin_backend("hip");
  (void)state;
  if (GPUMEM_TEST_HAVE_CUDA) {
    assert_non_null(cu);
    assert_string_equal(cu->name, "cuda");
  } else {
    assert_null(cu);
  }
  if (GPUMEM_TEST_HAVE_HIP) {
    assert_non_null(hip);
    assert_string_equal(hip->name, "hip");
  } else {
    assert_null(hip);
  }
  {
    const gpumem_backend *all[2];
    int i;
    all[0] = cu;
    all[1] = hip;
    for (i = 0; i < 2; i++) {
      const gpumem_backend *b = all[i];
      if (!b) continue;
      assert_true(b->version >= 1);
      assert_int_equal(b->struct_size, sizeof(gpumem_backend));
      /* every method, including the optional ones, is provided */
      assert_non_null(b->init);
      assert_non_null(b->shutdown);
      assert_non_null(b->device_count);
      assert_non_null(b->device_info);
      assert_non_null(b->mem_get_info);
      assert_non_null(b->malloc);
      assert_non_null(b->free);
      assert_non_null(b->event_create);
      assert_non_null(b->event_destroy);
      assert_non_null(b->event_record);
      assert_non_null(b->event_query);
      assert_non_null(b->event_synchronize);
      assert_non_null(b->stream_synchronize);
      assert_non_null(b->device_synchronize);
      assert_non_null(b->device_reset);
      assert_non_null(b->error_status);
      assert_non_null(b->error_string);
      assert_non_null(b->vm_granularity);
      assert_non_null(b->vm_reserve);
      assert_non_null(b->vm_release);
      assert_non_null(b->vm_create);
      assert_non_null(b->vm_destroy);
      assert_non_null(b->vm_map);
      assert_non_null(b->vm_unmap);
    }
  }
}

static void check_error_mapping(const gpumem_backend *b) {
  const char *s;
  assert_int_equal(b->error_status(b, RAW_OUT_OF_MEMORY), GPUMEM_ERR_OUT_OF_MEMORY);
  assert_int_equal(b->error_status(b, RAW_NO_DEVICE), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(b->error_status(b, RAW_INSUFFICIENT_DRIVER), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(b->error_status(b, RAW_INVALID_DEVICE), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(b->error_status(b, RAW_NOT_SUPPORTED), GPUMEM_ERR_NOT_SUPPORTED);
  assert_int_equal(b->error_status(b, RAW_INVALID_VALUE), GPUMEM_ERR_BACKEND);
  assert_int_equal(b->error_status(b, 0), GPUMEM_OK);
  s = b->error_string(b, RAW_OUT_OF_MEMORY);
  assert_non_null(s);
  assert_true(strstr(s, "memory") != NULL || strstr(s, "Memory") != NULL);
  s = b->error_string(b, RAW_NO_DEVICE);
  assert_non_null(s);
  assert_true(s[0] != '\0');
}

static void test_error_mapping(void **state) {
  const gpumem_backend *b;
  (void)state;
  b = gpumem_builtin_backend("cuda");
  if (b) check_error_mapping(b);
  b = gpumem_builtin_backend("hip");
  if (b) check_error_mapping(b);
  if (!gpumem_builtin_backend("cuda") && !gpumem_builtin_backend("hip")) skip();
}

/* The raw vtable without a device: init fails with a NO_BACKEND code, and other methods fail without crashing. */
static void check_raw_without_device(const char *name) {
  const gpumem_backend *src = gpumem_builtin_backend(name);
  gpumem_backend b;
  void *p = (void *)0x1234;
  uint64_t f = 77, t = 77;
  gpumem_backend_device_info info;
  int rc, code;
  char out[512];
  long printed;
  capture c;
  if (!src) {
    skip();
    return;
  }
  if (!surely_no_device(name)) {
    print_message("[  SKIP    ] %s: this machine may have a device\n", name);
    skip();
    return;
  }
  memcpy(&b, src, sizeof b);
  capture_begin(&c);
  rc = b.init(&b);
  code = b.malloc(&b, 0, 4096, &p);
  (void)b.mem_get_info(&b, 0, &f, &t);
  (void)b.device_info(&b, 0, &info);
  printed = capture_end(&c, out, sizeof out);
  assert_int_not_equal(rc, 0);
  assert_int_equal(b.error_status(&b, rc), GPUMEM_ERR_NO_BACKEND);
  assert_int_not_equal(code, 0);
  assert_true(b.error_status(&b, code) == GPUMEM_ERR_NO_BACKEND || b.error_status(&b, code) == GPUMEM_ERR_INVALID_DEVICE);
  assert_ptr_equal(p, (void *)0x1234); /* output untouched on failure */
  if (printed != 0) fail_msg("%s backend printed %ld bytes: %s", name, printed, out);
}

static void test_raw_cuda_without_device(void **state) {
  (void)state;
  check_raw_without_device("cuda");
}

static void test_raw_hip_without_device(void **state) {
  (void)state;
  check_raw_without_device("hip");
}

static void check_create(const char *name) {
  gpumem_context *ctx = (gpumem_context *)0x1;
  char out[512];
  long printed = 0;
  gpumem_status st;
  int i;
  if (!gpumem_builtin_backend(name)) {
    /* not built: NO_BACKEND too, and silent */
    st = create_with(name, &ctx, &printed, out, sizeof out);
    assert_int_equal(st, GPUMEM_ERR_NO_BACKEND);
    assert_ptr_equal(ctx, (gpumem_context *)0x1);
    if (printed != 0) fail_msg("create(%s) printed: %s", name, out);
    return;
  }
  for (i = 0; i < 3; i++) { /* a second and third try behave the same (cached driver state) */
    ctx = (gpumem_context *)0x1;
    st = create_with(name, &ctx, &printed, out, sizeof out);
    if (printed != 0) fail_msg("create(%s) printed %ld bytes: %s", name, printed, out);
    if (surely_no_device(name)) {
      assert_int_equal(st, GPUMEM_ERR_NO_BACKEND);
      assert_ptr_equal(ctx, (gpumem_context *)0x1);
    } else if (st == GPUMEM_OK) {
      int n = 0;
      tu_ctx_register(ctx);
      assert_string_equal(gpumem_backend_name(ctx), name);
      assert_int_equal(gpumem_device_count(ctx, &n), GPUMEM_OK);
      assert_true(n >= 1);
      tu_ctx_done(ctx);
    } else {
      assert_int_equal(st, GPUMEM_ERR_NO_BACKEND);
    }
  }
}

static void test_create_cuda(void **state) {
  (void)state;
  check_create("cuda");
}

static void test_create_hip(void **state) {
  (void)state;
  check_create("hip");
}

/* GPUMEM_BACKEND in the environment overrides the config: "cuda" there gives NO_BACKEND too. */
static void test_env_backend_cuda(void **state) {
  gpumem_context *ctx = NULL;
  gpumem_config cfg;
  gpumem_status st;
  capture c;
  char out[512];
  long printed;
  (void)state;
  if (!surely_no_device("cuda")) skip();
  tu_setenv("GPUMEM_BACKEND", "cuda");
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  capture_begin(&c);
  st = gpumem_create(&cfg, &ctx);
  printed = capture_end(&c, out, sizeof out);
  assert_int_equal(st, GPUMEM_ERR_NO_BACKEND);
  if (printed != 0) fail_msg("printed: %s", out);
}

/* "auto" takes cuda, then hip, then sim: with neither device it is sim, silently. */
static void test_auto_falls_back_to_sim(void **state) {
  gpumem_context *ctx = NULL;
  char out[512];
  long printed = 0;
  gpumem_status st;
  void *p = NULL;
  (void)state;
  st = create_with("auto", &ctx, &printed, out, sizeof out);
  if (printed != 0) fail_msg("create(auto) printed: %s", out);
  assert_int_equal(st, GPUMEM_OK);
  tu_ctx_register(ctx);
  if (surely_no_device("cuda") && surely_no_device("hip")) assert_string_equal(gpumem_backend_name(ctx), "sim");
  /* and it works */
  assert_int_equal(gpumem_alloc(ctx, 0, 4096, NULL, &p), GPUMEM_OK);
  assert_non_null(p);
  assert_int_equal(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);

  /* NULL backend = auto too */
  st = create_with(NULL, &ctx, &printed, out, sizeof out);
  if (printed != 0) fail_msg("create(NULL) printed: %s", out);
  assert_int_equal(st, GPUMEM_OK);
  tu_ctx_register(ctx);
  if (surely_no_device("cuda") && surely_no_device("hip")) assert_string_equal(gpumem_backend_name(ctx), "sim");
  tu_ctx_done(ctx);
}

/* A log callback, unlike stderr, does receive why the backend is unusable. */
static void test_reason_logged_to_callback(void **state) {
  gpumem_context *ctx = NULL;
  gpumem_config cfg;
  tu_log *log = tu_log_new();
  capture c;
  char out[512];
  long printed;
  gpumem_status st;
  (void)state;
  if (!gpumem_builtin_backend("cuda") || !surely_no_device("cuda")) {
    tu_log_free(log);
    skip();
    return;
  }
  gpumem_config_init(&cfg);
  cfg.backend = "cuda";
  tu_log_install(&cfg, log, GPUMEM_LOG_DEBUG);
  capture_begin(&c);
  st = gpumem_create(&cfg, &ctx);
  printed = capture_end(&c, out, sizeof out);
  assert_int_equal(st, GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(printed, 0);
  assert_true(log->count >= 1);
  assert_true(tu_log_count_matching(log, "cuda", NULL) >= 1);
  tu_log_free(log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_builtin_vtables),
      TU_TEST(test_error_mapping),
      TU_TEST(test_raw_cuda_without_device),
      TU_TEST(test_raw_hip_without_device),
      TU_TEST(test_create_cuda),
      TU_TEST(test_create_hip),
      TU_TEST(test_env_backend_cuda),
      TU_TEST(test_auto_falls_back_to_sim),
      TU_TEST(test_reason_logged_to_callback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
