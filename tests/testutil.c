/* Helpers shared by the cmocka tests; see testutil.h. */
#include "testutil.h"

#include <errno.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* RUNNING_ON_VALGRIND, as src/backends/sim.c uses it (the valgrind package has the header) */
#if defined(__has_include)
#  if __has_include(<valgrind/valgrind.h>)
#    include <valgrind/valgrind.h>
#    define TU_HAVE_VALGRIND 1
#  endif
#endif

/* ---------------------------------------------------------------------- */
/* Backend selection                                                       */

const char *tu_backend(void) {
  const char *b = getenv("GPUMEM_TEST_BACKEND");
  return (b && *b) ? b : "sim";
}

int tu_is_sim(void) { return strcmp(tu_backend(), "sim") == 0; }
gpumem_stream tu_stream(uintptr_t made_up) { return (gpumem_stream)(tu_is_sim() ? made_up : (uintptr_t)1); }

void tu_config(gpumem_config *cfg) {
  gpumem_config_init(cfg);
  cfg->backend = tu_backend();
}

/* ---------------------------------------------------------------------- */
/* Test scale                                                              */

int tu_on_valgrind(void) {
#ifdef TU_HAVE_VALGRIND
  return RUNNING_ON_VALGRIND ? 1 : 0;
#else
  return 0;
#endif
}

static unsigned tu_scale_value = 1;
static pthread_once_t tu_scale_once = PTHREAD_ONCE_INIT;

static void tu_scale_init(void) {
  unsigned s = tu_on_valgrind() ? TU_VALGRIND_SCALE : 1u;
  const char *e = getenv("GPUMEM_TEST_SCALE");
  if (e && *e) {
    char *end = NULL;
    unsigned long v = strtoul(e, &end, 10);
    if (end && *end == '\0' && v >= 1 && v <= 1000000) s = (unsigned)v;
  }
  tu_scale_value = s;
  if (s != 1)
    print_message("[  SCALE   ] heavy loops scaled down %u times%s (GPUMEM_TEST_SCALE=1: full scale)\n", s,
                  tu_on_valgrind() ? " under valgrind" : "");
}

unsigned tu_scale(void) {
  (void)pthread_once(&tu_scale_once, tu_scale_init); /* threads of the tests may ask first */
  return tu_scale_value;
}

unsigned long tu_scaled(unsigned long n, unsigned long lo) {
  unsigned long v = n / tu_scale();
  if (v < lo) v = lo;
  return v < n ? v : n;
}

int tu_sweep_keep(uint64_t i, uint64_t count, unsigned edge, unsigned phase) {
  uint64_t k = tu_scale();
  if (k <= 1 || i <= edge || i + edge > count) return 1;
  k |= 1; /* odd, so the kept indexes alternate between even and odd (some sweeps vary with the parity) */
  return (i + phase) % k == 0;
}

/* ---------------------------------------------------------------------- */
/* Status assertions                                                       */

void tu_assert_status_(gpumem_status got, gpumem_status want, const char *expr, const char *file, int line) {
  if (got != want) {
    print_error("%s returned %s (%d), expected %s (%d)\n", expr, gpumem_status_name(got), (int)got,
                gpumem_status_name(want), (int)want);
    _fail(file, line);
  }
}

int tu_status_known(gpumem_status s) { return (int)s >= 0 && (int)s < (int)GPUMEM_STATUS_COUNT_; }

/* ---------------------------------------------------------------------- */
/* Contexts                                                                */

static void tu_env_restore_to(int depth);
static int tu_env_base; /* changes below this depth were made by tu_setup */
static int tu_nenv;

#define TU_MAX_CTX 64
static gpumem_context *tu_ctxs[TU_MAX_CTX];
static int tu_nctx;

void tu_ctx_register(gpumem_context *ctx) {
  assert_non_null(ctx);
  assert_true(tu_nctx < TU_MAX_CTX);
  tu_ctxs[tu_nctx++] = ctx;
}

void tu_ctx_forget(gpumem_context *ctx) {
  for (int i = 0; i < tu_nctx; i++) {
    if (tu_ctxs[i] == ctx) {
      tu_ctxs[i] = tu_ctxs[--tu_nctx];
      return;
    }
  }
}

int tu_ctx_live(void) { return tu_nctx; }

gpumem_context *tu_ctx_new(const gpumem_config *cfg) {
  gpumem_config def;
  if (!cfg) {
    tu_config(&def);
    cfg = &def;
  }
  gpumem_context *ctx = NULL;
  assert_status(gpumem_create(cfg, &ctx), GPUMEM_OK);
  assert_non_null(ctx);
  tu_ctx_register(ctx);
  return ctx;
}

uint64_t tu_sim_used(int device) {
  uint64_t used = UINT64_MAX;
  assert_status(gpumem_sim_used_bytes(device, &used), GPUMEM_OK);
  return used;
}

uint64_t tu_sim_used_total(void) {
  uint64_t total = 0;
  for (int d = 0; d < 64; d++) {
    uint64_t used = 0;
    gpumem_status s = gpumem_sim_used_bytes(d, &used);
    if (s != GPUMEM_OK) break; /* INVALID_DEVICE past the last one, NO_BACKEND when not initialised */
    total += used;
  }
  return total;
}

void tu_assert_sim_empty(void) {
  if (!tu_is_sim()) return;
  for (int d = 0; d < 64; d++) {
    uint64_t used = 0;
    gpumem_status s = gpumem_sim_used_bytes(d, &used);
    if (s != GPUMEM_OK) break;
    if (used != 0) {
      print_error("sim device %d still has %llu bytes handed out (leak)\n", d, (unsigned long long)used);
      fail();
    }
  }
}

/* A context that only keeps the process-wide sim state alive (no env, no allocations). */
static gpumem_context *tu_keeper_new(void) {
  if (!tu_is_sim()) return NULL;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.log_level = GPUMEM_LOG_OFF;
  gpumem_context *k = NULL;
  if (gpumem_create(&cfg, &k) != GPUMEM_OK) return NULL;
  return k;
}

/* src/internal.h (the tests link the static library): failed invariant checks so far. A
 * GPUMEM_DEBUG_CHECKS build checks the pool after every call and only logs (with GPUMEM_LOG=off
 * under ctest, nowhere), so every test reads the count when a context ends and at teardown. */
uint64_t gpumem__invariant_failures(const char **last);

static uint64_t tu_inv_seen; /* failures already reported (each test reports its own) */

static int tu_invariants_held(void) {
  const char *last = NULL;
  uint64_t n = gpumem__invariant_failures(&last);
  if (n == tu_inv_seen) return 1;
  print_error("%llu invariant check(s) failed in the library, the last: %s\n", (unsigned long long)(n - tu_inv_seen),
              last != NULL ? last : "?");
  tu_inv_seen = n;
  return 0;
}

void tu_ctx_done(gpumem_context *ctx) {
  assert_non_null(ctx);
  tu_ctx_forget(ctx);
  gpumem_context *keeper = (tu_nctx == 0) ? tu_keeper_new() : NULL;
  gpumem_status s = gpumem_destroy(ctx, 0);
  if (s != GPUMEM_OK) {
    gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
    if (keeper) gpumem_destroy(keeper, GPUMEM_DESTROY_FORCE);
    assert_status(s, GPUMEM_OK);
  }
  if (keeper) {
    /* nothing may remain handed out once the last context of the test is gone */
    uint64_t used = tu_sim_used_total();
    gpumem_destroy(keeper, GPUMEM_DESTROY_FORCE);
    if (used != 0) {
      print_error("after destroying the last context the sim still has %llu bytes handed out (leak)\n",
                  (unsigned long long)used);
      fail();
    }
  }
  if (!tu_invariants_held()) fail();
}

int tu_setup(void **state) {
  (void)state;
  tu_env_restore_to(0);
  tu_env_base = 0;
  tu_env_clean();
  tu_env_base = tu_nenv;
  return 0;
}

int tu_teardown(void **state) {
  (void)state;
  if (tu_is_sim()) {
    gpumem_sim_fail_clear();
    gpumem_sim_set_delayed(0);
    gpumem_sim_complete_all();
  }
  while (tu_nctx > 0) {
    gpumem_context *c = tu_ctxs[--tu_nctx];
    gpumem_destroy(c, GPUMEM_DESTROY_FORCE);
  }
  tu_env_restore_to(0);
  tu_env_base = 0;
  return tu_invariants_held() ? 0 : -1;
}

/* ---------------------------------------------------------------------- */
/* Stats                                                                   */

gpumem_stats tu_stats(gpumem_context *ctx, int device) {
  gpumem_stats st;
  memset(&st, 0xA5, sizeof st);
  st.struct_size = (uint32_t)sizeof st;
  assert_status(gpumem_get_stats(ctx, device, &st), GPUMEM_OK);
  return st;
}

#define TU_STAT_LE(a, b)                                                                            \
  do {                                                                                              \
    if (!((a) <= (b))) {                                                                            \
      print_error("stats: %s (%llu) > %s (%llu)\n", #a, (unsigned long long)(a), #b, (unsigned long long)(b)); \
      fail();                                                                                       \
    }                                                                                               \
  } while (0)
#define TU_STAT_EQ(a, b)                                                                            \
  do {                                                                                              \
    if (!((a) == (b))) {                                                                            \
      print_error("stats: %s (%llu) != %s (%llu)\n", #a, (unsigned long long)(a), #b, (unsigned long long)(b)); \
      fail();                                                                                       \
    }                                                                                               \
  } while (0)

void tu_assert_stats_sane(const gpumem_stats *s) {
  TU_STAT_LE(s->allocated_bytes, s->reserved_bytes);
  TU_STAT_EQ(s->cached_bytes, s->reserved_bytes - s->allocated_bytes);
  TU_STAT_LE(s->allocated_bytes, s->allocated_peak);
  TU_STAT_LE(s->reserved_bytes, s->reserved_peak);
  TU_STAT_LE(s->allocated_peak, s->reserved_peak);
  TU_STAT_LE(s->num_frees, s->num_allocs);
  TU_STAT_LE(s->num_live, s->num_allocs - s->num_frees); /* equal unless a reset invalidated blocks */
  TU_STAT_LE(s->requested_bytes, s->allocated_bytes);
  TU_STAT_LE(s->num_live, s->allocated_bytes); /* each live block is at least 1 byte */
  TU_STAT_LE(s->num_backend_frees, s->num_backend_allocs);
  TU_STAT_LE(s->num_segments, s->num_backend_allocs);
  TU_STAT_LE(s->num_ooms, s->num_oom_retries + s->num_ooms); /* trivially true; keeps fields referenced */
  if (s->num_live == 0) {
    TU_STAT_EQ(s->allocated_bytes, 0);
    TU_STAT_EQ(s->requested_bytes, 0);
  } else {
    TU_STAT_LE(1, s->allocated_bytes);
  }
  if (s->reserved_bytes == 0) TU_STAT_EQ(s->num_segments, 0);
  if (s->num_segments == 0) TU_STAT_EQ(s->reserved_bytes, 0);
  if (s->num_trims == 0) TU_STAT_EQ(s->trimmed_bytes, 0);
}

#define TU_STATS_FIELDS(X)                                                                            \
  X(allocated_bytes) X(allocated_peak) X(reserved_bytes) X(reserved_peak) X(cached_bytes) X(num_allocs) \
  X(num_frees) X(num_live) X(num_segments) X(num_backend_allocs) X(num_backend_frees) X(num_trims)     \
  X(trimmed_bytes) X(num_oom_retries) X(num_ooms) X(requested_bytes) X(num_limit_exceeded) X(num_share_asks) \
  X(num_share_asked) X(share_given_bytes)

int tu_stats_equal(const gpumem_stats *a, const gpumem_stats *b) {
#define TU_CMP(f) if (a->f != b->f) return 0;
  TU_STATS_FIELDS(TU_CMP)
#undef TU_CMP
  return 1;
}

void tu_assert_stats_equal(const gpumem_stats *a, const gpumem_stats *b) {
#define TU_CMP(f)                                                                                   \
  if (a->f != b->f) {                                                                               \
    print_error("stats differ in %s: %llu vs %llu\n", #f, (unsigned long long)a->f, (unsigned long long)b->f); \
    fail();                                                                                         \
  }
  TU_STATS_FIELDS(TU_CMP)
#undef TU_CMP
}

/* ---------------------------------------------------------------------- */
/* Block contents                                                          */

static inline uint8_t tu_pat(uint32_t stamp, size_t i) {
  uint64_t x = (uint64_t)stamp * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 8) ^ (x >> 16));
}

#define TU_STAMP_FULL (128 * 1024)
#define TU_STAMP_EDGE (64 * 1024)
#define TU_STAMP_STEP (1024 * 1024)
#define TU_STAMP_RUN 64
/* Scaled down (tu_scale() > 1, i.e. under valgrind): first and last 4 KiB and
 * a run every 64 KiB, so that every block's first and last bytes are still
 * touched (memcheck checks them against the block's annotation) but the byte
 * loops, at ~50x under memcheck, no longer dominate the tests' time. */
#define TU_STAMP_FULL_SCALED (8 * 1024)
#define TU_STAMP_EDGE_SCALED (4 * 1024)
#define TU_STAMP_STEP_SCALED (64 * 1024)

/* Runs BODY for each offset i the stamp covers. */
#define TU_STAMP_FOREACH(n, BODY)                                                    \
  do {                                                                               \
    const int scaled_ = tu_scale() > 1;                                              \
    const size_t full_ = scaled_ ? TU_STAMP_FULL_SCALED : TU_STAMP_FULL;             \
    const size_t edge_ = scaled_ ? TU_STAMP_EDGE_SCALED : TU_STAMP_EDGE;             \
    const size_t step_ = scaled_ ? TU_STAMP_STEP_SCALED : TU_STAMP_STEP;             \
    if ((n) <= full_) {                                                              \
      for (size_t i = 0; i < (n); i++) { BODY }                                      \
    } else {                                                                         \
      for (size_t i = 0; i < edge_; i++) { BODY }                                    \
      for (size_t i = (n) - edge_; i < (n); i++) { BODY }                            \
      for (size_t base = step_; base + TU_STAMP_RUN < (n) - edge_; base += step_)   \
        for (size_t i = base; i < base + TU_STAMP_RUN; i++) { BODY }                 \
    }                                                                                \
  } while (0)

void tu_stamp(void *p, size_t n, uint32_t stamp) {
  if (!tu_is_sim() || !p || n == 0) return;
  uint8_t *b = (uint8_t *)p;
  TU_STAMP_FOREACH(n, b[i] = tu_pat(stamp, i););
}

int tu_stamp_ok(const void *p, size_t n, uint32_t stamp) {
  if (!tu_is_sim() || !p || n == 0) return 1;
  const uint8_t *b = (const uint8_t *)p;
  int ok = 1;
  TU_STAMP_FOREACH(n, if (b[i] != tu_pat(stamp, i)) { ok = 0; break; });
  return ok;
}

int tu_stamp_ok_pending(const void *p, size_t n, uint32_t stamp) {
#ifdef TU_HAVE_VALGRIND
  VALGRIND_DISABLE_ERROR_REPORTING; /* this thread only, until the ENABLE below */
#endif
  int ok = tu_stamp_ok(p, n, stamp);
#ifdef TU_HAVE_VALGRIND
  VALGRIND_ENABLE_ERROR_REPORTING;
#endif
  return ok;
}

/* ---------------------------------------------------------------------- */
/* Overlap                                                                 */

typedef struct tu_range {
  uintptr_t lo, hi;
  size_t idx;
} tu_range;

static int tu_range_cmp(const void *a, const void *b) {
  const tu_range *x = (const tu_range *)a, *y = (const tu_range *)b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

long tu_find_overlap(void *const *ptrs, const size_t *sizes, size_t n) {
  tu_range *r = (tu_range *)malloc((n ? n : 1) * sizeof *r);
  assert_non_null(r);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (!ptrs[i] || sizes[i] == 0) continue;
    r[m].lo = (uintptr_t)ptrs[i];
    r[m].hi = r[m].lo + sizes[i];
    r[m].idx = i;
    m++;
  }
  qsort(r, m, sizeof *r, tu_range_cmp);
  long bad = -1;
  for (size_t i = 1; i < m; i++) {
    if (r[i].lo < r[i - 1].hi) {
      bad = (long)r[i].idx;
      break;
    }
  }
  free(r);
  return bad;
}

/* ---------------------------------------------------------------------- */
/* Log capture                                                             */

tu_log *tu_log_new(void) {
  tu_log *log = (tu_log *)calloc(1, sizeof *log);
  assert_non_null(log);
  pthread_mutex_t *mu = (pthread_mutex_t *)malloc(sizeof *mu);
  assert_non_null(mu);
  pthread_mutex_init(mu, NULL);
  log->mutex = mu;
  return log;
}

void tu_log_free(tu_log *log) {
  if (!log) return;
  pthread_mutex_destroy((pthread_mutex_t *)log->mutex);
  free(log->mutex);
  free(log);
}

void tu_log_clear(tu_log *log) {
  pthread_mutex_lock((pthread_mutex_t *)log->mutex);
  log->count = 0;
  memset(log->per_level, 0, sizeof log->per_level);
  pthread_mutex_unlock((pthread_mutex_t *)log->mutex);
}

void tu_log_cb(void *user, gpumem_log_level level, const char *msg) {
  tu_log *log = (tu_log *)user;
  if (!log) return;
  pthread_mutex_lock((pthread_mutex_t *)log->mutex);
  if (log->count < TU_LOG_MAX_MSGS) {
    log->levels[log->count] = (int)level;
    snprintf(log->msgs[log->count], TU_LOG_MAX_LEN, "%s", msg ? msg : "(null)");
  }
  log->count++;
  if ((int)level >= 0 && (int)level <= (int)GPUMEM_LOG_OFF) log->per_level[level]++;
  pthread_mutex_unlock((pthread_mutex_t *)log->mutex);
}

void tu_log_install(gpumem_config *cfg, tu_log *log, gpumem_log_level level) {
  cfg->log_callback = tu_log_cb;
  cfg->log_user = log;
  cfg->log_level = level;
}

int tu_log_count_matching(tu_log *log, ...) {
  int n = 0;
  pthread_mutex_lock((pthread_mutex_t *)log->mutex);
  int stored = log->count < TU_LOG_MAX_MSGS ? log->count : TU_LOG_MAX_MSGS;
  for (int i = 0; i < stored; i++) {
    va_list ap;
    va_start(ap, log);
    int all = 1;
    for (const char *sub = va_arg(ap, const char *); sub; sub = va_arg(ap, const char *)) {
      if (!strstr(log->msgs[i], sub)) {
        all = 0;
        break;
      }
    }
    va_end(ap);
    n += all;
  }
  pthread_mutex_unlock((pthread_mutex_t *)log->mutex);
  return n;
}

int tu_log_count_at_least(tu_log *log, gpumem_log_level level) {
  int n = 0;
  pthread_mutex_lock((pthread_mutex_t *)log->mutex);
  for (int l = (int)level; l <= (int)GPUMEM_LOG_OFF; l++) n += log->per_level[l];
  pthread_mutex_unlock((pthread_mutex_t *)log->mutex);
  return n;
}

void tu_log_dump(tu_log *log) {
  pthread_mutex_lock((pthread_mutex_t *)log->mutex);
  int stored = log->count < TU_LOG_MAX_MSGS ? log->count : TU_LOG_MAX_MSGS;
  for (int i = 0; i < stored; i++) print_message("  log[%d] level %d: %s\n", i, log->levels[i], log->msgs[i]);
  pthread_mutex_unlock((pthread_mutex_t *)log->mutex);
}

/* ---------------------------------------------------------------------- */
/* Environment                                                             */

#define TU_MAX_ENV 128
static struct {
  char *name;
  char *old; /* NULL = was unset */
} tu_env[TU_MAX_ENV];

void tu_setenv(const char *name, const char *value) {
  assert_true(tu_nenv < TU_MAX_ENV);
  const char *old = getenv(name);
  tu_env[tu_nenv].name = strdup(name);
  tu_env[tu_nenv].old = old ? strdup(old) : NULL;
  tu_nenv++;
  if (value)
    assert_int_equal(setenv(name, value, 1), 0);
  else
    assert_int_equal(unsetenv(name), 0);
}

static void tu_env_restore_to(int depth) {
  while (tu_nenv > depth) {
    tu_nenv--;
    if (tu_env[tu_nenv].old)
      setenv(tu_env[tu_nenv].name, tu_env[tu_nenv].old, 1);
    else
      unsetenv(tu_env[tu_nenv].name);
    free(tu_env[tu_nenv].name);
    free(tu_env[tu_nenv].old);
  }
}

void tu_env_restore(void) { tu_env_restore_to(tu_env_base); }

extern char **environ;

void tu_env_clean(void) {
  /* collect first: unsetenv changes environ */
  char *names[256];
  int n = 0;
  for (char **e = environ; e && *e && n < 256; e++) {
    const char *eq = strchr(*e, '=');
    if (!eq) continue;
    size_t len = (size_t)(eq - *e);
    int gp = len > 7 && strncmp(*e, "GPUMEM_", 7) == 0;
    /* on a real GPU, CUDA_VISIBLE_DEVICES chooses the device the suite runs on: keep it */
    int cvd = tu_is_sim() && len == strlen("CUDA_VISIBLE_DEVICES") && strncmp(*e, "CUDA_VISIBLE_DEVICES", len) == 0;
    if (!gp && !cvd) continue;
    /* the test harness's own knobs (GPUMEM_TEST_BACKEND, GPUMEM_TEST_SCALE), not library settings */
    if (len > 12 && strncmp(*e, "GPUMEM_TEST_", 12) == 0) continue;
    /* the pool mode under test (ctest runs the suite with GPUMEM_EXPANDABLE=0 and =1) */
    if (len == strlen("GPUMEM_EXPANDABLE") && strncmp(*e, "GPUMEM_EXPANDABLE", len) == 0) continue;
    names[n] = (char *)malloc(len + 1);
    memcpy(names[n], *e, len);
    names[n][len] = '\0';
    n++;
  }
  for (int i = 0; i < n; i++) {
    tu_setenv(names[i], NULL);
    free(names[i]);
  }
}

/* ---------------------------------------------------------------------- */
/* Child processes                                                         */

void tu_child_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s:%d: child check failed: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  fflush(stderr);
  _exit(1);
}

int tu_count_threads(const char *file, int (*match)(long tid, const char *line, void *arg), void *arg) {
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char line[256] = "";
    if (file != NULL) {
      char path[96];
      snprintf(path, sizeof path, "/proc/self/task/%.32s/%s", e->d_name, file);
      FILE *f = fopen(path, "r");
      if (f == NULL) continue; /* (a thread that just ended) */
      int got = fgets(line, sizeof line, f) != NULL;
      fclose(f);
      if (!got) continue;
      line[strcspn(line, "\n")] = '\0';
    }
    n += match == NULL || match(strtol(e->d_name, NULL, 10), line, arg);
  }
  closedir(d);
  return n;
}

/* Another thread, not parked in a shared FUTEX_WAIT (its syscall line: number, then arguments). */
static int not_parked(long tid, const char *line, void *arg) {
  (void)arg;
  if (tid == (long)syscall(SYS_gettid)) return 0;
  unsigned long nr = 0, a0 = 0, a1 = 1;
  return !(sscanf(line, "%lu %lx %lx", &nr, &a0, &a1) == 3 && nr == (unsigned long)SYS_futex && a1 == 0);
}

int tu_quiesce_threads(void) {
  for (int i = 0; i < 20000; i++) {
    if (tu_count_threads("syscall", not_parked, NULL) == 0) return 1;
    usleep(500);
  }
  return 0;
}

int tu_run_in_child(int (*fn)(void *arg), void *arg) {
#ifdef TU_ASAN
  (void)tu_quiesce_threads();
#endif
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(120); /* hang guard only */
    int rc = fn(arg);
    fflush(stdout);
    fflush(stderr);
    _exit(rc & 0xff);
  }
  int st = 0;
  pid_t w;
  do {
    w = waitpid(pid, &st, 0);
  } while (w < 0 && errno == EINTR);
  assert_int_equal(w, pid);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 255;
}

/* ---------------------------------------------------------------------- */
/* Utilities                                                               */

uint64_t tu_rand(uint64_t *state) {
  uint64_t x = *state ? *state : 0x2545F4914F6CDD1Dull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

uint64_t tu_rand_range(uint64_t *state, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  uint64_t span = hi - lo + 1;
  return span == 0 ? tu_rand(state) : lo + tu_rand(state) % span;
}

char *tu_capture_stderr(void (*fn)(void *arg), void *arg) {
  fflush(stderr);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(tmp), 2) >= 0);
  fn(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  long len;
  fseek(tmp, 0, SEEK_END);
  len = ftell(tmp);
  if (len < 0) len = 0;
  fseek(tmp, 0, SEEK_SET);
  char *buf = (char *)malloc((size_t)len + 1);
  assert_non_null(buf);
  size_t got = fread(buf, 1, (size_t)len, tmp);
  buf[got] = '\0';
  fclose(tmp);
  return buf;
}
