/*
 * test_share_peers: shared GPUs (src/share.c) with several processes on shared simulated devices
 * (GPUMEM_SIM_SHARED): an idle holder gives its cache to a process that needs it; a holder of
 * live blocks is asked and the request is refused once it has answered; a holder whose cached
 * memory cannot be given at once is asked again until share_wait_ms; a killed holder is
 * cleaned and its memory comes back; an idle process's watcher gives its cache back when another
 * program fills the device (no call of its own); sharing off is the control; eight processes
 * with random bursts whose total live memory stays within the capacity (at most 960 MiB live of 1 GiB).
 *
 * Every case names its own simulated machine (GPUMEM_SIM_SHARED=t<pid>-<case>), so its ledger and
 * device accounting are its own, and removes both at the end. The holders are this program
 * executed again with a role (fork + exec: a child starts with no inherited state).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
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
#include <gpumem/backend.h>

#include "testutil.h"

#define MiB ((uint64_t)1024 * 1024)
#define CAP_MIB 1024
#define WAIT_LONG "60000" /* share_wait_ms of cases that must end early: a minute if they did not */

static const char *g_self;
static int g_case;

/* Cases that measure how processes meet in time (a kill, a watcher's tick) are not run under
 * memcheck: it slows each process differently, and test_share_ledger covers the code there. */
#define SKIP_UNDER_VALGRIND() TU_SKIP_UNDER_VALGRIND("[  SKIPPED ] timing between processes: not under valgrind")
static char g_name[64];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------- */
/* Roles (run in the exec'd children)                                      */

static gpumem_context *role_ctx(void) {
  gpumem_context *ctx = NULL;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  if (gpumem_create(&cfg, &ctx) != GPUMEM_OK) return NULL;
  return ctx;
}

/* hold MIB LIVE: allocate MIB in 32 MiB blocks, free them unless LIVE, say "ready", wait for stdin to close. */
static int role_hold(int mib, int live) {
  gpumem_context *ctx = role_ctx();
  if (ctx == NULL) return 10;
  void *p[256];
  int n = 0;
  for (int got = 0; got < mib && n < 256; got += 32)
    if (gpumem_alloc(ctx, 0, 32 * MiB, NULL, &p[n++]) != GPUMEM_OK) return 11;
  if (!live)
    for (int i = 0; i < n; i++) (void)gpumem_free(ctx, p[i], NULL);
  printf("ready\n");
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  return 0;
}

/* stuck LIVE_MIB DELAY_MS: hold 6 MiB cached that cannot be given back (in an 8 MiB chunk beside a
 * live 2 MiB block), 2 MiB more live, and LIVE_MIB live in 32 MiB blocks; say "ready"; at a byte on stdin, free the
 * live blocks DELAY_MS later; wait for stdin to close. */
static int role_stuck(int mib, int delay_ms) {
  gpumem_context *ctx = role_ctx();
  if (ctx == NULL) return 30;
  void *x = NULL, *w = NULL, *z = NULL, *p[256];
  if (gpumem_alloc(ctx, 0, 8 * MiB, NULL, &x) != GPUMEM_OK) return 31;
  if (gpumem_alloc(ctx, 0, 2 * MiB, NULL, &w) != GPUMEM_OK) return 31; /* after x: x's rest stays 6 MiB */
  (void)gpumem_free(ctx, x, NULL);
  if (gpumem_alloc(ctx, 0, 2 * MiB, NULL, &z) != GPUMEM_OK) return 32; /* at x's start: one chunk with x's rest */
  int n = 0;
  for (int got = 0; got < mib && n < 256; got += 32)
    if (gpumem_alloc(ctx, 0, 32 * MiB, NULL, &p[n++]) != GPUMEM_OK) return 33;
  printf("ready\n");
  fflush(stdout);
  char c;
  if (read(0, &c, 1) == 1) {
    usleep((useconds_t)delay_ms * 1000u);
    for (int i = 0; i < n; i++) (void)gpumem_free(ctx, p[i], NULL);
  }
  while (read(0, &c, 1) > 0) {
  }
  (void)gpumem_free(ctx, z, NULL);
  (void)gpumem_free(ctx, w, NULL);
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  return 0;
}

/* The shared live-byte budget of the burst case: total live of all processes stays within it. */
typedef struct budget {
  _Atomic int64_t live;
  _Atomic int start;
} budget;

/* burst SEED ROUNDS LIMIT_MIB: random bursts of allocations, each taken from the shared budget first. */
static int role_burst(unsigned seed, int rounds, int limit_mib) {
  char bname[96];
  snprintf(bname, sizeof bname, "/%s-budget", getenv("GPUMEM_SIM_SHARED"));
  int fd = shm_open(bname, O_RDWR, 0);
  if (fd < 0) return 20;
  budget *B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (B == MAP_FAILED) return 21;
  gpumem_context *ctx = role_ctx();
  if (ctx == NULL) return 22;
  while (!atomic_load(&B->start)) usleep(1000);
  const int64_t limit = (int64_t)limit_mib * (int64_t)MiB;
  unsigned long failures = 0, allocs = 0;
  void *p[64];
  uint64_t sz[64];
  for (int r = 0; r < rounds; r++) {
    int n = 0, want = 1 + (int)(rand_r(&seed) % 64u);
    for (; n < want; n++) {
      uint64_t s = (uint64_t)(1u << (rand_r(&seed) % 6u)) * 2 * MiB; /* 2 .. 64 MiB */
      int64_t cur = atomic_load(&B->live);
      int taken = 0;
      while (cur + (int64_t)s <= limit)
        if (atomic_compare_exchange_weak(&B->live, &cur, cur + (int64_t)s)) {
          taken = 1;
          break;
        }
      if (!taken) break; /* the others' live memory leaves no room: the burst ends here */
      allocs++;
      if (gpumem_alloc(ctx, 0, s, NULL, &p[n]) != GPUMEM_OK) {
        failures++;
        atomic_fetch_sub(&B->live, (int64_t)s);
        break;
      }
      sz[n] = s;
    }
    if ((rand_r(&seed) & 3u) == 0) usleep(200); /* a burst that lasts a while */
    for (int i = 0; i < n; i++) {
      (void)gpumem_free(ctx, p[i], NULL);
      atomic_fetch_sub(&B->live, (int64_t)sz[i]);
    }
  }
  gpumem_stats st;
  st.struct_size = sizeof st;
  (void)gpumem_get_stats(ctx, 0, &st);
  printf("failures %lu allocs %lu asks %llu asked %llu given %llu\n", failures, allocs,
         (unsigned long long)st.num_share_asks, (unsigned long long)st.num_share_asked,
         (unsigned long long)st.share_given_bytes);
  fflush(stdout);
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  return 0;
}

/* ---------------------------------------------------------------------- */
/* The parent side                                                         */

typedef struct child {
  pid_t pid;
  int in;   /* its stdin: closing it ends a holder */
  FILE *out;
} child;

/* Start this program with a role; env entries "NAME=VALUE" are set in the child only. */
static child spawn(const char *const *args, const char *const *env) {
  /* argv and the environment are built before fork: between fork and exec the child calls only
   * async-signal-safe functions, since another thread of this process may have held a lock (of
   * malloc, or of the environment) at the fork */
  extern char **environ;
  char *argv[16];
  int n = 0;
  argv[n++] = (char *)g_self;
  argv[n++] = (char *)"--role";
  for (int i = 0; args[i] != NULL && n < 15; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  size_t ne = 0, nx = 0;
  while (environ[ne] != NULL) ne++;
  while (env != NULL && env[nx] != NULL) nx++;
  char **envp = calloc(ne + nx + 1, sizeof *envp);
  assert_non_null(envp);
  size_t k = 0;
  for (size_t i = 0; i < ne; i++) {
    int shadowed = 0; /* an entry of env replaces the inherited one of the same name */
    for (size_t j = 0; j < nx && !shadowed; j++) {
      size_t len = (size_t)(strchr(env[j], '=') - env[j]) + 1;
      shadowed = strncmp(environ[i], env[j], len) == 0;
    }
    if (!shadowed) envp[k++] = environ[i];
  }
  for (size_t j = 0; j < nx; j++) envp[k++] = (char *)env[j];
  envp[k] = NULL;
  int pin[2], pout[2];
  assert_int_equal(pipe(pin), 0);
  assert_int_equal(pipe(pout), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(pin[0], 0);
    dup2(pout[1], 1);
    close(pin[0]);
    close(pin[1]);
    close(pout[0]);
    close(pout[1]);
    execve(g_self, argv, envp);
    _exit(127);
  }
  free(envp);
  close(pin[0]);
  close(pout[1]);
  child c = {pid, pin[1], fdopen(pout[0], "r")};
  assert_non_null(c.out);
  return c;
}

static void expect_line(child *c, const char *start, char *line, size_t cap) {
  assert_non_null(fgets(line, (int)cap, c->out));
  assert_memory_equal(line, start, strlen(start));
}

static int finish(child *c) {
  if (c->in >= 0) close(c->in);
  c->in = -1;
  int status = 0;
  assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
  fclose(c->out);
  return status;
}

/* Each case: its own simulated machine and ledger. */
static int setup(void **state) {
  (void)state;
  snprintf(g_name, sizeof g_name, "t%ld-%d", (long)getpid(), ++g_case);
  setenv("GPUMEM_SIM_SHARED", g_name, 1);
  setenv("GPUMEM_SIM_DEVICES", "1x1GiB", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("GPUMEM_SHARE");
  unsetenv("GPUMEM_SHARE_WAIT_MS");
  unsetenv("GPUMEM_WATCH_MS");
  unsetenv("GPUMEM_LOG"); /* (ctest sets it off: the log lines are checked here) */
  return 0;
}

static char g_uuid[64];

static int teardown(void **state) {
  (void)state;
  char path[256];
  snprintf(path, sizeof path, "/gpumem-sim-%lu-%s", (unsigned long)geteuid(), g_name);
  shm_unlink(path);
  snprintf(path, sizeof path, "/%s-budget", g_name);
  shm_unlink(path);
  if (g_uuid[0]) {
    const char *groups[] = {"user", "off", "grp", NULL};
    for (int i = 0; groups[i]; i++) {
      snprintf(path, sizeof path, "/gpumem-%lu-%s-%s", (unsigned long)geteuid(), groups[i], g_uuid);
      shm_unlink(path);
    }
  }
  g_uuid[0] = '\0';
  return 0;
}

static gpumem_context *parent_ctx(const char *share, uint32_t wait_ms) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.share = share;
  if (wait_ms != 0) cfg.share_wait_ms = wait_ms;
  gpumem_context *ctx = NULL;
  assert_int_equal(gpumem_create(&cfg, &ctx), GPUMEM_OK);
  gpumem_device_info di;
  di.struct_size = sizeof di;
  assert_int_equal(gpumem_device_get_info(ctx, 0, &di), GPUMEM_OK);
  memcpy(g_uuid, di.uuid, sizeof g_uuid);
  return ctx;
}

/* Allocate n blocks of `mib` MiB; returns how many failed. */
static int take(gpumem_context *ctx, void **p, int n, int mib, gpumem_status *last) {
  int fails = 0;
  for (int i = 0; i < n; i++) {
    gpumem_status st = gpumem_alloc(ctx, 0, (uint64_t)mib * MiB, NULL, &p[i]);
    if (st != GPUMEM_OK) {
      p[i] = NULL;
      fails++;
      *last = st;
    }
  }
  return fails;
}

static void give(gpumem_context *ctx, void **p, int n) {
  for (int i = 0; i < n; i++)
    if (p[i] != NULL) assert_int_equal(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
}

static gpumem_stats stats(gpumem_context *ctx) {
  gpumem_stats st;
  st.struct_size = sizeof st;
  assert_int_equal(gpumem_get_stats(ctx, 0, &st), GPUMEM_OK);
  return st;
}

/* The process holding 768 MiB cached gives it to this one, which needs 768 MiB of 1 GiB. */
static void test_idle_holder_gives(void **state) {
  (void)state;
  char line[256];
  /* its own free-fraction check off: the memory must come through the protocol (an ask) */
  child a = spawn((const char *const[]){"hold", "768", "0", NULL},
                  (const char *const[]){"GPUMEM_TRIM_FREE_FRACTION=0", NULL});
  expect_line(&a, "ready", line, sizeof line);
  gpumem_context *ctx = parent_ctx(NULL, 0);
  gpumem_share_member m[8];
  m[0].struct_size = sizeof m[0];
  size_t n = 0;
  assert_int_equal(gpumem_share_members(ctx, 0, m, 8, &n), GPUMEM_OK);
  assert_int_equal(n, 1); /* the holder (this context has no pool yet) */
  assert_int_equal(m[0].pid, a.pid);
  print_message("holder: reserved %llu cached %llu live %llu listening %d\n", (unsigned long long)m[0].reserved_bytes,
                (unsigned long long)m[0].cached_bytes, (unsigned long long)m[0].live_bytes, m[0].listening);
  assert_true(m[0].cached_bytes >= 768 * MiB && m[0].live_bytes == 0 && m[0].listening == 1);
  void *p[24];
  gpumem_status last = GPUMEM_OK;
  double t0 = now_s();
  int fails = take(ctx, p, 24, 32, &last);
  print_message("idle holder: 24 x 32 MiB, %d failed, %.1f ms\n", fails, (now_s() - t0) * 1e3);
  assert_int_equal(fails, 0);
  gpumem_stats st = stats(ctx);
  assert_true(st.num_share_asks >= 1);
  assert_int_equal(gpumem_share_members(ctx, 0, m, 8, &n), GPUMEM_OK);
  assert_int_equal(n, 2);
  for (size_t i = 0; i < n; i++) {
    if (m[i].self) continue;
    assert_int_equal(m[i].pid, a.pid);
    assert_true(m[i].was_asked >= 1 && m[i].given_bytes >= 512 * MiB);
  }
  give(ctx, p, 24);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  assert_int_equal(finish(&a), 0);
}

/* The holder's blocks are live: it answers with nothing, and the request is refused at once. */
static void test_live_holder_refused(void **state) {
  (void)state;
  char line[256];
  child a = spawn((const char *const[]){"hold", "768", "1", NULL}, NULL);
  expect_line(&a, "ready", line, sizeof line);
  gpumem_context *ctx = parent_ctx(NULL, 60000);
  void *p[24];
  gpumem_status last = GPUMEM_OK;
  double t0 = now_s();
  int fails = take(ctx, p, 24, 32, &last);
  double dt = now_s() - t0;
  print_message("live holder: 24 x 32 MiB, %d failed (%s), %.1f ms\n", fails, gpumem_status_name(last), dt * 1e3);
  assert_true(fails >= 16);
  assert_int_equal(last, GPUMEM_ERR_OUT_OF_MEMORY);
  assert_true(dt < 30.0); /* share_wait_ms is a minute: the wait ended when the member answered */
  give(ctx, p, 24);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  assert_int_equal(finish(&a), 0);
}

/* A holder killed while it holds cached memory: the sim releases its memory, the ledger forgets it. */
static void test_killed_holder(void **state) {
  (void)state;
  SKIP_UNDER_VALGRIND();
  char line[256];
  child a = spawn((const char *const[]){"hold", "768", "0", NULL}, NULL);
  expect_line(&a, "ready", line, sizeof line);
  gpumem_context *ctx = parent_ctx(NULL, 60000);
  void *first;
  assert_int_equal(gpumem_alloc(ctx, 0, 32 * MiB, NULL, &first), GPUMEM_OK); /* a member too */
  assert_int_equal(kill(a.pid, SIGKILL), 0);
  int status = finish(&a);
  assert_true(WIFSIGNALED(status));
  gpumem_share_member m[8];
  m[0].struct_size = 0;
  size_t n = 0;
  assert_int_equal(gpumem_share_members(ctx, 0, m, 8, &n), GPUMEM_OK);
  assert_int_equal(n, 1);
  assert_int_equal(m[0].self, 1);
  void *p[24];
  gpumem_status last = GPUMEM_OK;
  double t0 = now_s();
  int fails = take(ctx, p, 24, 32, &last);
  print_message("killed holder: 24 x 32 MiB, %d failed, %.1f ms\n", fails, (now_s() - t0) * 1e3);
  assert_int_equal(fails, 0);
  give(ctx, p, 24);
  assert_int_equal(gpumem_free(ctx, first, NULL), GPUMEM_OK);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

/* An idle process (sharing off: only its watcher acts) gives its cache back when another program
 * takes the device below trim_free_fraction, without a call of its own. */
static void test_pressure_without_growth(void **state) {
  (void)state;
  SKIP_UNDER_VALGRIND();
  char line[256];
  child a = spawn((const char *const[]){"hold", "256", "0", NULL},
                  (const char *const[]){"GPUMEM_SHARE=off", "GPUMEM_WATCH_MS=20", NULL});
  expect_line(&a, "ready", line, sizeof line);
  gpumem_backend be = *gpumem_builtin_backend("sim");
  assert_int_equal(be.init(&be), 0);
  uint64_t fr = 0, tot = 0;
  assert_int_equal(be.mem_get_info(&be, 0, &fr, &tot), 0);
  assert_true(fr <= tot - 256 * MiB);
  void *outside = NULL;
  assert_int_equal(be.malloc(&be, 0, 700 * MiB, &outside), 0); /* free: 1024 - 256 - 700 < 10 % */
  int polls = 0;
  for (; polls < 10000; polls++) { /* at most 10 s; the watcher ticks every 20 ms */
    assert_int_equal(be.mem_get_info(&be, 0, &fr, &tot), 0);
    if (fr >= tot - 700 * MiB) break;
    usleep(1000);
  }
  print_message("pressure: the idle holder gave its cache back after about %d ms\n", polls);
  assert_true(fr >= tot - 700 * MiB);
  assert_int_equal(be.free(&be, 0, outside), 0);
  be.shutdown(&be);
  assert_int_equal(finish(&a), 0);
}

/* A holder whose cached memory cannot be given at once (it lies in a chunk beside a live block): the
 * request asks again, after pauses, until share_wait_ms has passed (bounded: refused then); when the
 * holder frees its live blocks meanwhile, a later round gets their memory. */
static void test_busy_holder_asked_again(void **state) {
  (void)state;
  SKIP_UNDER_VALGRIND();
  char line[256];
  child a = spawn((const char *const[]){"stuck", "760", "50", NULL},
                  (const char *const[]){"GPUMEM_TRIM_FREE_FRACTION=0", NULL});
  expect_line(&a, "ready", line, sizeof line);
  gpumem_context *ctx = parent_ctx(NULL, 300);
  void *p = (void *)0x1;
  double t0 = now_s();
  assert_int_equal(gpumem_alloc(ctx, 0, 512 * MiB, NULL, &p), GPUMEM_ERR_OUT_OF_MEMORY);
  double dt = now_s() - t0;
  assert_true(p == (void *)0x1);
  print_message("busy holder: refused after %.1f ms (share_wait_ms 300)\n", dt * 1e3);
  assert_true(dt >= 0.29 && dt < 30.0); /* the holder kept cached memory: asked until the wait was over */
  assert_int_equal(stats(ctx).num_share_asks, 1);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  ctx = parent_ctx(NULL, 60000);
  assert_int_equal(write(a.in, "g", 1), 1); /* the holder frees its live blocks 50 ms from now */
  t0 = now_s();
  assert_int_equal(gpumem_alloc(ctx, 0, 512 * MiB, NULL, &p), GPUMEM_OK);
  print_message("busy holder: 512 MiB after %.1f ms\n", (now_s() - t0) * 1e3);
  gpumem_share_member m[8];
  m[0].struct_size = sizeof m[0];
  size_t n = 0;
  assert_int_equal(gpumem_share_members(ctx, 0, m, 8, &n), GPUMEM_OK);
  for (size_t i = 0; i < n; i++)
    if (!m[i].self) {
      print_message("busy holder: asked %llu times, gave %llu bytes\n", (unsigned long long)m[i].was_asked,
                    (unsigned long long)m[i].given_bytes);
      assert_true(m[i].was_asked >= 2 && m[i].given_bytes >= 256 * MiB);
    }
  assert_int_equal(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  assert_int_equal(finish(&a), 0);
}

/* The control: with sharing off the idle holder's cache stays where it is. */
static void test_sharing_off(void **state) {
  (void)state;
  char line[256];
  child a = spawn((const char *const[]){"hold", "768", "0", NULL},
                  (const char *const[]){"GPUMEM_SHARE=off", "GPUMEM_WATCH_MS=0", NULL});
  expect_line(&a, "ready", line, sizeof line);
  gpumem_context *ctx = parent_ctx("off", 0);
  size_t n = 5;
  gpumem_share_member m[2];
  m[0].struct_size = sizeof m[0];
  assert_int_equal(gpumem_share_members(ctx, 0, m, 2, &n), GPUMEM_OK);
  assert_int_equal(n, 0);
  void *p[24];
  gpumem_status last = GPUMEM_OK;
  int fails = take(ctx, p, 24, 32, &last);
  print_message("sharing off: 24 x 32 MiB, %d failed\n", fails);
  assert_true(fails >= 16);
  assert_int_equal(last, GPUMEM_ERR_OUT_OF_MEMORY);
  assert_int_equal(stats(ctx).num_share_asks, 0);
  give(ctx, p, 24);
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  assert_int_equal(finish(&a), 0);
}

/* Eight processes, random bursts, total live within the capacity: failures with sharing on and off.
 * At most 960 MiB live of 1 GiB: 0 failures in 100 runs; at the full 1024 MiB, 1 run in 100 had one
 * (docs/SHARED-GPUS.md). The members wait up to 5 s for each other, not the default 300 ms: what is
 * checked is that the memory reaches whoever asks for it, and on a loaded machine (sanitizer builds,
 * ctest -j) a member scheduled late answers after 300 ms (0-3 failures a run under ASan with the
 * suite running beside it; none with 5 s). A member that never gave would still fail, after 5 s.
 * GPUMEM_TEST_BURST_WAIT_MS sets another wait (300 for the default's figures). */
static unsigned long bursts(const char *share, const char *limit_mib) {
  char bname[96];
  snprintf(bname, sizeof bname, "/%s-budget", g_name);
  int fd = shm_open(bname, O_RDWR | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, sizeof(budget)), 0);
  budget *B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(B != MAP_FAILED);
  atomic_store(&B->live, 0);
  atomic_store(&B->start, 0);
  char env_share[64], env_wait[64];
  snprintf(env_share, sizeof env_share, "GPUMEM_SHARE=%s", share);
  const char *wait = getenv("GPUMEM_TEST_BURST_WAIT_MS"); /* (300: the default, as in docs/SHARED-GPUS.md) */
  snprintf(env_wait, sizeof env_wait, "GPUMEM_SHARE_WAIT_MS=%s", wait != NULL ? wait : "5000");
  child c[8];
  char seeds[8][16];
  for (int i = 0; i < 8; i++) {
    snprintf(seeds[i], sizeof seeds[i], "%d", 1234 + 77 * i);
    c[i] = spawn((const char *const[]){"burst", seeds[i], "150", limit_mib, NULL},
                 (const char *const[]){env_share, env_wait, NULL});
  }
  usleep(100000);
  atomic_store(&B->start, 1);
  unsigned long failures = 0, allocs = 0;
  for (int i = 0; i < 8; i++) {
    char line[256];
    expect_line(&c[i], "failures", line, sizeof line);
    unsigned long f = 0, a = 0;
    assert_int_equal(sscanf(line, "failures %lu allocs %lu", &f, &a), 2);
    failures += f;
    allocs += a;
    assert_int_equal(finish(&c[i]), 0);
  }
  print_message("8 processes, sharing %s, at most %s MiB live: %lu of %lu allocations failed\n", share, limit_mib,
                failures, allocs);
  munmap(B, sizeof *B);
  return failures;
}

static void test_bursts(void **state) {
  (void)state;
  SKIP_UNDER_VALGRIND();
  gpumem_context *ctx = parent_ctx(NULL, 0); /* (for the ledger's name at the end) */
  assert_int_equal(gpumem_destroy(ctx, 0), GPUMEM_OK);
  /* GPUMEM_TEST_BURST_MIB: another budget (to measure it in a loop: docs/SHARED-GPUS.md) */
  const char *limit = getenv("GPUMEM_TEST_BURST_MIB") != NULL ? getenv("GPUMEM_TEST_BURST_MIB") : "960";
  unsigned long on = bursts("user", limit);
  unsigned long off = bursts("off", limit);
  print_message("bursts: %lu failures with sharing on, %lu with sharing off\n", on, off);
  assert_int_equal(on, 0);
  assert_true(off > 0);
}

int main(int argc, char **argv) {
  g_self = argv[0];
  if (argc >= 3 && strcmp(argv[1], "--role") == 0) {
    if (strcmp(argv[2], "hold") == 0 && argc >= 5) return role_hold(atoi(argv[3]), atoi(argv[4]));
    if (strcmp(argv[2], "stuck") == 0 && argc >= 5) return role_stuck(atoi(argv[3]), atoi(argv[4]));
    if (strcmp(argv[2], "burst") == 0 && argc >= 6)
      return role_burst((unsigned)atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_idle_holder_gives, setup, teardown),
      cmocka_unit_test_setup_teardown(test_live_holder_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_killed_holder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pressure_without_growth, setup, teardown),
      cmocka_unit_test_setup_teardown(test_busy_holder_asked_again, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sharing_off, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bursts, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
