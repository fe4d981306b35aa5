/*
 * test_share_ledger: the shared group's ledger against bad contents and bad neighbours
 * (src/share.c), the sharing options, and the watcher thread's life (it exists only while the
 * pool holds cached memory; none with watch_interval_ms 0 and sharing off; a fork's child
 * starts its own).
 *
 * Each case names its own simulated machine (GPUMEM_SIM_SHARED), hence its own ledger.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <gpumem.h>

#include "testutil.h"

#define MiB ((uint64_t)1024 * 1024)

static int g_case;
static char g_name[64];
static char g_uuid[64];
static char g_log[8192];

static void log_cb(void *user, gpumem_log_level level, const char *msg) {
  (void)user;
  if (level < GPUMEM_LOG_WARN) return;
  size_t n = strlen(g_log);
  snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void ledger_path(char *buf, size_t cap, const char *group) {
  snprintf(buf, cap, "/gpumem-%lu-%s-%s", (unsigned long)geteuid(), group, g_uuid);
}

/* The UUID this case's simulated device has, without creating a pool (no ledger yet). */
static void learn_uuid(void) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  gpumem_context *ctx = NULL;
  assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_OK);
  gpumem_device_info di;
  di.struct_size = sizeof di;
  assert_int_equal(gpumem_device_get_info(ctx, 0, &di), GPUMEM_OK);
  memcpy(g_uuid, di.uuid, sizeof g_uuid);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_name, sizeof g_name, "l%ld-%d", (long)getpid(), ++g_case);
  setenv("GPUMEM_SIM_SHARED", g_name, 1);
  setenv("GPUMEM_SIM_DEVICES", "1x1GiB", 1);
  unsetenv("GPUMEM_SHARE");
  unsetenv("GPUMEM_SHARE_WAIT_MS");
  unsetenv("GPUMEM_WATCH_MS");
  unsetenv("GPUMEM_LOG"); /* (ctest sets it off: the log lines are checked here) */
  g_log[0] = '\0';
  learn_uuid();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char path[256];
  snprintf(path, sizeof path, "/gpumem-sim-%lu-%s", (unsigned long)geteuid(), g_name);
  shm_unlink(path);
  const char *groups[] = {"user", "grp", "bad", NULL};
  for (int i = 0; groups[i]; i++) {
    ledger_path(path, sizeof path, groups[i]);
    shm_unlink(path);
  }
  unsetenv("GPUMEM_SIM_SHARED");
  return 0;
}

static gpumem_context *mk(const char *share, uint32_t wait_ms, uint32_t watch_ms, uint64_t thr) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.share = share;
  if (wait_ms) cfg.share_wait_ms = wait_ms;
  cfg.watch_interval_ms = watch_ms;
  if (thr) cfg.release_threshold = thr;
  cfg.log_callback = log_cb;
  gpumem_context *ctx = NULL;
  assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_OK);
  return ctx;
}

/* Alloc and free once: the pool exists, holds cached memory, and is a member. */
static void touch(gpumem_context *ctx, uint64_t bytes) {
  void *p;
  assert_int_equal(gpumem_alloc(ctx, 0, bytes, NULL, &p), GPUMEM_OK);
  assert_int_equal(gpumem_free(ctx, p, NULL), GPUMEM_OK);
}

static size_t members(gpumem_context *ctx) {
  gpumem_share_member m[80];
  m[0].struct_size = sizeof m[0];
  size_t n = 0;
  assert_int_equal(gpumem_share_members(ctx, 0, m, 80, &n), GPUMEM_OK);
  for (size_t i = 0; i < n && i < 80; i++) {
    assert_true(m[i].pid > 0 && m[i].pid <= 4194304);
    assert_true(memchr(m[i].command, '\0', sizeof m[i].command) != NULL);
    for (const char *c = m[i].command; *c; c++) assert_true(*c >= 0x20 && *c < 0x7f);
  }
  return n;
}

static unsigned char *map_ledger(const char *group, size_t *size) {
  char path[256];
  ledger_path(path, sizeof path, group);
  int fd = shm_open(path, O_RDWR, 0);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  *size = (size_t)st.st_size;
  unsigned char *m = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(m != MAP_FAILED);
  return m;
}

/* Random bytes over every entry (the header stays): members, requests, reclaims and destroy survive
 * and nothing waits longer than share_wait_ms. */
static void test_garbage_entries(void **state) {
  (void)state;
  gpumem_context *ctx = mk(NULL, 200, 20, 0);
  touch(ctx, 64 * MiB);
  size_t size = 0;
  unsigned char *m = map_ledger("user", &size);
  unsigned seed = 12345;
  for (int round = 0; round < 20; round++) {
    const size_t head = 16 + 128; /* magic .. group: kept, or the ledger is ignored as a whole */
    for (size_t i = head; i < size; i++) m[i] = (unsigned char)rand_r(&seed);
    if (round % 4 == 1) {
      /* an entry that names a live process that is no member (our parent): it never answers */
      uint64_t owner = (uint64_t)getppid() << 1, start = 0; /* (start 0: unknown, not taken as another process) */
      unsigned char *e = m + head + 128; /* entry 1 (entry 0 is this context's) */
      memcpy(e, &owner, sizeof owner);
      memcpy(e + 8, &start, sizeof start);
      uint32_t one = 1;
      memcpy(e + 8 + 8 + 4 + 4, &one, sizeof one); /* listening */
    }
    (void)members(ctx);
    void *p[40];
    int n = 0;
    double t0 = now_s();
    gpumem_status st = GPUMEM_OK;
    while (n < 40 && (st = gpumem_alloc(ctx, 0, 64 * MiB, NULL, &p[n])) == GPUMEM_OK) n++;
    double dt = now_s() - t0;
    assert_int_equal(st, GPUMEM_ERR_OUT_OF_MEMORY);
    assert_true(dt < 20.0); /* share_wait_ms 200 per round: bounded */
    for (int i = 0; i < n; i++) assert_int_equal(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
    uint64_t given = 0;
    size_t answered = 0;
    assert_int_equal(gpumem_share_reclaim(ctx, 0, GPUMEM_UNLIMITED, 100, &given, &answered), GPUMEM_OK);
  }
  munmap(m, size);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

/* A ledger of a foreign layout, one others may write, one of the wrong size: ignored with a warning;
 * the context works alone. */
static void bad_ledger(void (*spoil)(int fd), const char *expect) {
  char path[256];
  ledger_path(path, sizeof path, "user");
  int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  spoil(fd);
  close(fd);
  g_log[0] = '\0';
  gpumem_context *ctx = mk(NULL, 0, 20, 0);
  touch(ctx, 64 * MiB);
  assert_non_null(strstr(g_log, expect));
  void *p;
  assert_int_equal(gpumem_alloc(ctx, 0, 512 * MiB, NULL, &p), GPUMEM_OK);
  assert_int_equal(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

static void spoil_magic(int fd) {
  assert_int_equal(ftruncate(fd, 8336), 0); /* the size of a ledger: only the contents are foreign */
  char junk[64];
  memset(junk, 0x5a, sizeof junk);
  assert_int_equal(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
}
static void spoil_mode(int fd) {
  assert_int_equal(ftruncate(fd, 8336), 0);
  assert_int_equal(fchmod(fd, 0666), 0);
}
static void spoil_size(int fd) { assert_int_equal(ftruncate(fd, 100), 0); }

static void test_foreign_ledger(void **state) {
  (void)state;
  bad_ledger(spoil_magic, "not one this library reads");
}
static void test_writable_ledger(void **state) {
  (void)state;
  bad_ledger(spoil_mode, "others may write it");
}
static void test_short_ledger(void **state) {
  (void)state;
  bad_ledger(spoil_size, "foreign size");
}

/* Bad values of the options: GPUMEM_ERR_INVALID_ARGUMENT at create, the variable named in the log. */
static void test_bad_options(void **state) {
  (void)state;
  const char *vars[][2] = {{"GPUMEM_SHARE", "bad name"},   {"GPUMEM_SHARE", "a/b"},
                           {"GPUMEM_SHARE", "x123456789012345678901234567890123456789012345678"},
                           {"GPUMEM_SHARE_WAIT_MS", "-1"}, {"GPUMEM_SHARE_WAIT_MS", "abc"},
                           {"GPUMEM_SHARE_WAIT_MS", "10x"}, {"GPUMEM_WATCH_MS", "99999999999"},
                           {"GPUMEM_WATCH_MS", "2 days"}};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    setenv(vars[i][0], vars[i][1], 1);
    gpumem_config cfg;
    gpumem_config_init(&cfg);
    cfg.backend = "sim";
    cfg.log_callback = log_cb;
    g_log[0] = '\0';
    gpumem_context *ctx = (gpumem_context *)&cfg;
    assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(ctx, (gpumem_context *)&cfg); /* untouched */
    assert_non_null(strstr(g_log, vars[i][0]));
    unsetenv(vars[i][0]);
  }
  const char *shares[] = {"", "a b", "../x", "user!"};
  for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
    gpumem_config cfg;
    gpumem_config_init(&cfg);
    cfg.backend = "sim";
    cfg.share = shares[i];
    gpumem_context *ctx = NULL;
    assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_ERR_INVALID_ARGUMENT);
  }
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  assert_int_equal(cfg.share_wait_ms, 300);
  assert_int_equal(cfg.watch_interval_ms, 200);
  assert_null(cfg.share);
  cfg.backend = "sim";
  cfg.share_wait_ms = 86400001u;
  gpumem_context *ctx = NULL;
  assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_ERR_INVALID_ARGUMENT);
  /* good values: units, and the names */
  setenv("GPUMEM_WATCH_MS", "1s", 1);
  setenv("GPUMEM_SHARE_WAIT_MS", "150ms", 1);
  setenv("GPUMEM_SHARE", "grp", 1);
  ctx = mk(NULL, 0, 0, 0);
  touch(ctx, 4 * MiB);
  gpumem_share_member m[4];
  m[0].struct_size = sizeof m[0];
  size_t n = 0;
  assert_int_equal(gpumem_share_members(ctx, 0, m, 4, &n), GPUMEM_OK);
  assert_int_equal(n, 1);
  assert_string_equal(m[0].group, "grp");
  assert_int_equal(m[0].self, 1);
  assert_int_equal(m[0].pid, getpid());
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  unsetenv("GPUMEM_WATCH_MS");
  unsetenv("GPUMEM_SHARE_WAIT_MS");
  unsetenv("GPUMEM_SHARE");
  /* bad arguments of the calls */
  ctx = mk(NULL, 0, 0, 0);
  assert_int_equal(gpumem_share_members(NULL, 0, m, 4, &n), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_share_members(ctx, 0, m, 4, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_share_members(ctx, 0, NULL, 4, &n), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_share_members(ctx, 1, m, 4, &n), GPUMEM_ERR_INVALID_DEVICE);
  m[0].struct_size = 3;
  assert_int_equal(gpumem_share_members(ctx, 0, m, 4, &n), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_share_members(ctx, 0, NULL, 0, &n), GPUMEM_OK);
  assert_int_equal(gpumem_share_reclaim(NULL, 0, 1, 0, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_share_reclaim(ctx, -1, 1, 0, NULL, NULL), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

/* Without GPUMEM_SIM_SHARED the sim's devices are each process's own: no group to list or ask. */
static void test_private_device(void **state) {
  (void)state;
  unsetenv("GPUMEM_SIM_SHARED");
  gpumem_context *ctx = mk(NULL, 0, 0, 0);
  size_t n = 0;
  assert_int_equal(gpumem_share_members(ctx, 0, NULL, 0, &n), GPUMEM_ERR_NOT_SUPPORTED);
  assert_int_equal(gpumem_share_reclaim(ctx, 0, 1, 0, NULL, NULL), GPUMEM_ERR_NOT_SUPPORTED);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  setenv("GPUMEM_SIM_SHARED", "bad/name", 1);
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_ERR_INVALID_ARGUMENT);
}

static int nthreads(void) {
  int n = tu_count_threads(NULL, NULL, NULL);
  assert_true(n > 0);
  return n;
}

static int comm_is(long tid, const char *line, void *name) {
  (void)tid;
  return strcmp(line, name) == 0;
}

/* Threads named `name`. */
static int named_threads(const char *name) { return tu_count_threads("comm", comm_is, (void *)name); }

/* The watcher exists while the pool holds cached memory, and not at all with watch 0 and sharing off;
 * it is named gpumem-watch/DEVICE. */
static void test_watcher_life(void **state) {
  (void)state;
  int base = nthreads();
  /* (a release threshold turns the thread caches off: none holds blocks of the pool) */
  gpumem_context *ctx = mk("off", 0, 0, (uint64_t)1 << 40);
  touch(ctx, 64 * MiB);
  assert_int_equal(nthreads(), base);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);

  ctx = mk("off", 0, 10, (uint64_t)1 << 40);
  void *p;
  assert_int_equal(gpumem_alloc(ctx, 0, 64 * MiB, NULL, &p), GPUMEM_OK); /* an exact fit: nothing cached yet */
  assert_int_equal(gpumem_free(ctx, p, NULL), GPUMEM_OK);                /* cached: the watcher starts */
  assert_int_equal(nthreads(), base + 1);
  int polls = 0; /* (it names itself once it runs) */
  while (named_threads("gpumem-watch/0") != 1 && polls++ < 5000) usleep(1000);
  assert_int_equal(named_threads("gpumem-watch/0"), 1);
  uint64_t rel = 0;
  assert_int_equal(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK); /* nothing cached: it ends at its next tick */
  polls = 0;
  while (nthreads() != base && polls++ < 5000) usleep(1000);
  assert_int_equal(nthreads(), base);
  touch(ctx, 64 * MiB); /* cached again: started again */
  assert_int_equal(nthreads(), base + 1);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK); /* joined */
  assert_int_equal(nthreads(), base);
}

/* With thread caches on (no release threshold), a thread that allocated stays keyed to the pool: the
 * watcher still ends once the pool is empty (a trim gave everything back), and starts again at the
 * next allocation, even an exact fit that caches nothing in the pool (the thread's cache may keep
 * the block at its free, without a pool call). */
static void test_watcher_ends_with_thread_caches(void **state) {
  (void)state;
  TU_REQUIRE_CACHES();
  int base = nthreads();
  gpumem_context *ctx = mk("off", 0, 10, 0);
  for (int round = 0; round < 2; round++) {
    void *p;
    assert_int_equal(gpumem_alloc(ctx, 0, round == 0 ? 4096 : 64 * MiB, NULL, &p), GPUMEM_OK);
    assert_int_equal(nthreads(), base + 1); /* (round 1: an exact fit, the pool caches nothing) */
    assert_int_equal(gpumem_free(ctx, p, NULL), GPUMEM_OK);
    uint64_t rel = 0;
    assert_int_equal(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
    gpumem_stats st;
    st.struct_size = sizeof st;
    assert_int_equal(gpumem_get_stats(ctx, 0, &st), GPUMEM_OK);
    assert_true(st.reserved_bytes == 0 && st.cached_bytes == 0);
    int polls = 0; /* nothing held: it ends at its next tick (10 ms) */
    while (nthreads() != base && polls++ < 2000) usleep(1000);
    assert_int_equal(nthreads(), base);
  }
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  assert_int_equal(nthreads(), base);
}

/* fork() while the watcher runs and answers: the child creates a context of its own, is a member with
 * its own entry, and exits at once; the parent's watcher goes on. */
#ifdef TU_ASAN
/* Under ASan the parent's watcher has no ticks (interval 0), and each fork waits until it is
 * parked on its ledger word (tu_quiesce_threads says why). */
#define FORK_WATCH_MS 0
#else
#define FORK_WATCH_MS 5
#endif

static void test_fork(void **state) {
  (void)state;
  gpumem_context *ctx = mk(NULL, 0, FORK_WATCH_MS, 0);
  touch(ctx, 64 * MiB);
  for (int round = 0; round < 4; round++) {
#ifdef TU_ASAN
    assert_true(tu_quiesce_threads());
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      void *q;
      int ok = gpumem_destroy(ctx, 0) == GPUMEM_ERR_NOT_SUPPORTED; /* the parent's */
      gpumem_config cfg;
      gpumem_config_init(&cfg);
      cfg.backend = "sim";
      uint64_t want = 960 * MiB; /* the parent gives its cache */
      size_t expect = 2;
#if defined(__SANITIZE_THREAD__)
      /* TSan cannot start threads after a fork of a multithreaded process: the child stays out of the
       * group (no thread) and takes what is free */
      cfg.share = "off";
      cfg.watch_interval_ms = 0;
      want = 64 * MiB;
      expect = 1;
#endif
      gpumem_context *c2 = NULL;
      ok = ok && gpumem_create(&cfg, &c2) == GPUMEM_OK;
      ok = ok && gpumem_alloc(c2, 0, want, NULL, &q) == GPUMEM_OK;
      ok = ok && gpumem_free(c2, q, NULL) == GPUMEM_OK;
      size_t n = 0;
      ok = ok && gpumem_share_members(c2, 0, NULL, 0, &n) == GPUMEM_OK && n == expect;
      ok = ok && gpumem_destroy(c2, 0) == GPUMEM_OK;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    touch(ctx, 64 * MiB);
  }
  assert_int_equal(members(ctx), 1);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_garbage_entries, setup, teardown),
      cmocka_unit_test_setup_teardown(test_foreign_ledger, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writable_ledger, setup, teardown),
      cmocka_unit_test_setup_teardown(test_short_ledger, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_options, setup, teardown),
      cmocka_unit_test_setup_teardown(test_private_device, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watcher_life, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watcher_ends_with_thread_caches, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
