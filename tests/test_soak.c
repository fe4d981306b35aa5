/* Soak: many threads on several devices for a fixed time. Random sizes (every
 * size class, now and then a huge one), random streams, cross-thread and
 * cross-stream frees, random trims, resets and peak resets, delayed events
 * completed by a separate thread (sim), contents stamped and checked at every
 * free, stats checked by a monitor thread.
 *
 * A reset invalidates every block of a device, including blocks other threads
 * hold: each device has a rwlock; alloc/free on a device hold it shared, a
 * reset holds it exclusively, checks that freeing a few of the invalidated
 * pointers gives GPUMEM_ERR_INVALID_POINTER, and drops the device's blocks
 * from the model.
 *
 * Environment (read before cmocka's setup cleans GPUMEM_*):
 *   GPUMEM_SOAK_SECONDS   duration (default 3)
 *   GPUMEM_SOAK_THREADS   worker threads (default 6)
 *   GPUMEM_SOAK_DEVICES   sim only: GPUMEM_SIM_DEVICES for the run (default 3x512MiB, so OOM happens)
 *   GPUMEM_SOAK_SEED      random seed (default: the time; printed)
 *   GPUMEM_SOAK_MAX_MIB   largest "huge" request in MiB (default 192)
 *   GPUMEM_TEST_BACKEND   backend (default sim); on others contents are not checked
 *                         and every operation uses the default stream
 * Prints one summary line "soak: ..." with the figures.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "testutil.h"

enum { MAX_THREADS = 64, MAX_DEV = 16, SLOTS = 384 };

typedef struct slot {
  void *p;
  size_t n;
  uint32_t stamp;
} slot;

typedef struct devstate {
  pthread_rwlock_t rw;     /* shared: alloc/free on the device; exclusive: reset */
  pthread_mutex_t mu;      /* guards slots */
  slot slots[SLOTS];
} devstate;

static double g_seconds = 3.0;
static int g_threads = 6;
static const char *g_sim_devices = "3x512MiB";
static uint64_t g_seed;
static uint64_t g_max_mib = 192;

static gpumem_context *g_ctx;
static int g_ndev;
static devstate g_dev[MAX_DEV];
static atomic_int g_stop;
static atomic_int g_errors;
static char g_first_error[512];
static atomic_ullong g_ops, g_allocs, g_frees, g_ooms, g_trims, g_resets, g_invalidated, g_cross_stream, g_huge;
static atomic_ullong g_max_reserved, g_stat_checks;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void record_error(const char *fmt, ...);

static void record_error(const char *fmt, ...) {
  if (atomic_fetch_add(&g_errors, 1) == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_first_error, sizeof g_first_error, fmt, ap);
    va_end(ap);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static gpumem_stream stream_of(int k) { return tu_is_sim() ? (gpumem_stream)(uintptr_t)(0x1000 + 0x10 * (uintptr_t)k) : NULL; }

static size_t random_size(uint64_t *rng) {
  uint64_t r = tu_rand(rng) % 1000;
  if (r < 700) return (size_t)tu_rand_range(rng, 1, 64 * 1024);                 /* small */
  if (r < 900) return (size_t)tu_rand_range(rng, 64 * 1024, TU_MiB);            /* small class, big */
  if (r < 985) return (size_t)tu_rand_range(rng, TU_MiB + 1, 10 * TU_MiB);      /* medium segments */
  if (r < 998) return (size_t)tu_rand_range(rng, 10 * TU_MiB + 1, 48 * TU_MiB); /* own segment */
  atomic_fetch_add(&g_huge, 1);
  return (size_t)tu_rand_range(rng, 48 * TU_MiB, g_max_mib * TU_MiB);          /* huge */
}

static void check_and_free(int dev, slot *s, gpumem_stream st, int own_stream) {
  if (!tu_stamp_ok(s->p, s->n, s->stamp)) record_error("device %d: block %p (%zu bytes) lost its contents", dev, s->p, s->n);
  size_t sz = 0;
  int d = -1;
  gpumem_status rc = gpumem_ptr_info(g_ctx, s->p, &sz, &d);
  if (rc != GPUMEM_OK || sz != s->n || d != dev)
    record_error("ptr_info(%p): %s size %zu/%zu device %d/%d", s->p, gpumem_status_name(rc), sz, s->n, d, dev);
  rc = gpumem_free(g_ctx, s->p, st);
  if (rc != GPUMEM_OK) record_error("free(%p) on device %d: %s", s->p, dev, gpumem_status_name(rc));
  atomic_fetch_add(&g_frees, 1);
  if (!own_stream) atomic_fetch_add(&g_cross_stream, 1);
}

static void do_reset(int dev, uint64_t *rng) {
  devstate *D = &g_dev[dev];
  /* every device's write lock (in device order; a worker holds one read lock at a time): the memory
   * the reset gives back may be handed to another device's pool at the same addresses (sim maps
   * host memory, and a GPU's address space is shared too), and a stale pointer that is live on
   * another device is a valid pointer to free. With every device held, no address can be handed
   * out again before the checks below. (Seen: a stale pointer of device 0 live on device 1 as a
   * 40 MB block; its free returned GPUMEM_OK, rightly.) */
  for (int d = 0; d < g_ndev; d++) pthread_rwlock_wrlock(&g_dev[d].rw);
  gpumem_status rc = gpumem_reset(g_ctx, dev, 0);
  if (rc != GPUMEM_OK) {
    record_error("reset(%d): %s", dev, gpumem_status_name(rc));
  } else {
    int checked = 0;
    pthread_mutex_lock(&D->mu);
    for (int i = 0; i < SLOTS; i++) {
      if (!D->slots[i].p) continue;
      /* nobody can allocate on any device while we hold the write locks: the
       * address cannot have been handed out again */
      if (checked < 4 && (tu_rand(rng) & 1)) {
        gpumem_status f = gpumem_free(g_ctx, D->slots[i].p, NULL);
        if (f != GPUMEM_ERR_INVALID_POINTER)
          record_error("free of a pointer invalidated by reset(%d) gave %s", dev, gpumem_status_name(f));
        checked++;
      }
      D->slots[i].p = NULL;
      atomic_fetch_add(&g_invalidated, 1);
    }
    pthread_mutex_unlock(&D->mu);
    gpumem_stats s;
    s.struct_size = sizeof s;
    if (gpumem_get_stats(g_ctx, dev, &s) != GPUMEM_OK || s.num_live != 0 || s.allocated_bytes != 0 || s.reserved_bytes != 0)
      record_error("after reset(%d): num_live %llu allocated %llu reserved %llu", dev, (unsigned long long)s.num_live,
                   (unsigned long long)s.allocated_bytes, (unsigned long long)s.reserved_bytes);
    atomic_fetch_add(&g_resets, 1);
  }
  for (int d = g_ndev - 1; d >= 0; d--) pthread_rwlock_unlock(&g_dev[d].rw);
}

static void *worker(void *arg) {
  int id = (int)(uintptr_t)arg;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1) ^ g_seed;
  uint32_t seq = 0;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    uint64_t r = tu_rand(&rng) % 10000;
    int dev = (int)(tu_rand(&rng) % (uint64_t)g_ndev);
    atomic_fetch_add_explicit(&g_ops, 1, memory_order_relaxed);
    if (r < 3) { /* reset: rare, it drops a whole device */
      do_reset(dev, &rng);
      continue;
    }
    if (r < 40) { /* trim one device or all */
      uint64_t released = 0;
      int which = (tu_rand(&rng) & 1) ? dev : GPUMEM_ALL_DEVICES;
      gpumem_status rc = gpumem_trim(g_ctx, which, tu_rand(&rng) % (64 * TU_MiB), &released);
      if (rc != GPUMEM_OK) record_error("trim(%d): %s", which, gpumem_status_name(rc));
      atomic_fetch_add(&g_trims, 1);
      continue;
    }
    devstate *D = &g_dev[dev];
    int i = (int)(tu_rand(&rng) % SLOTS);
    /* 3 of 4 operations on the thread's own stream, the rest on another one */
    int own = (tu_rand(&rng) % 4) != 0;
    gpumem_stream st = stream_of(own ? id : (int)(tu_rand(&rng) % (uint64_t)(g_threads + 2)));
    pthread_rwlock_rdlock(&D->rw);
    slot taken = {0};
    pthread_mutex_lock(&D->mu);
    if (D->slots[i].p) {
      taken = D->slots[i];
      D->slots[i].p = NULL;
    }
    pthread_mutex_unlock(&D->mu);
    if (taken.p) {
      check_and_free(dev, &taken, st, own);
      pthread_rwlock_unlock(&D->rw);
      continue;
    }
    size_t n = random_size(&rng);
    void *p = (void *)0x5;
    gpumem_status rc = gpumem_alloc(g_ctx, dev, n, st, &p);
    if (rc == GPUMEM_ERR_OUT_OF_MEMORY) {
      if (p != (void *)0x5) record_error("failed alloc changed *out_ptr");
      atomic_fetch_add(&g_ooms, 1);
      pthread_rwlock_unlock(&D->rw);
      continue;
    }
    if (rc != GPUMEM_OK || p == NULL || ((uintptr_t)p % 256) != 0) {
      record_error("alloc(%d, %zu): %s, %p", dev, n, gpumem_status_name(rc), p);
      pthread_rwlock_unlock(&D->rw);
      continue;
    }
    atomic_fetch_add(&g_allocs, 1);
    slot mine = {p, n, (uint32_t)id << 24 | (seq++ & 0xffffffu)};
    tu_stamp(p, n, mine.stamp);
    int placed = 0;
    pthread_mutex_lock(&D->mu);
    if (!D->slots[i].p) {
      D->slots[i] = mine;
      placed = 1;
    }
    pthread_mutex_unlock(&D->mu);
    if (!placed) check_and_free(dev, &mine, st, 1);
    pthread_rwlock_unlock(&D->rw);
  }
  return NULL;
}

/* Stats snapshots, peak resets, and (sim) completion of delayed work. */
static void *monitor(void *arg) {
  (void)arg;
  uint64_t rng = 12345;
  while (!atomic_load(&g_stop)) {
    uint64_t reserved = 0;
    for (int d = 0; d < g_ndev; d++) {
      gpumem_stats s;
      s.struct_size = sizeof s;
      gpumem_status rc = gpumem_get_stats(g_ctx, d, &s);
      if (rc != GPUMEM_OK) {
        record_error("get_stats(%d): %s", d, gpumem_status_name(rc));
        continue;
      }
      if (s.allocated_bytes > s.reserved_bytes || s.cached_bytes != s.reserved_bytes - s.allocated_bytes ||
          s.requested_bytes > s.allocated_bytes || s.num_live > s.num_allocs - s.num_frees || s.num_frees > s.num_allocs ||
          s.allocated_peak < s.allocated_bytes || s.reserved_peak < s.reserved_bytes)
        record_error("device %d: inconsistent stats snapshot (allocated %llu reserved %llu cached %llu live %llu allocs %llu frees %llu)",
                     d, (unsigned long long)s.allocated_bytes, (unsigned long long)s.reserved_bytes,
                     (unsigned long long)s.cached_bytes, (unsigned long long)s.num_live, (unsigned long long)s.num_allocs,
                     (unsigned long long)s.num_frees);
      reserved += s.reserved_bytes;
      atomic_fetch_add(&g_stat_checks, 1);
    }
    unsigned long long prev = atomic_load(&g_max_reserved);
    while (reserved > prev && !atomic_compare_exchange_weak(&g_max_reserved, &prev, reserved)) {
    }
    if (tu_rand(&rng) % 16 == 0) gpumem_reset_peak_stats(g_ctx, GPUMEM_ALL_DEVICES);
    if (tu_is_sim()) {
      uint64_t r = tu_rand(&rng) % 4;
      if (r == 0) gpumem_sim_complete_all();
      else gpumem_sim_stream_complete((int)(tu_rand(&rng) % (uint64_t)g_ndev), stream_of((int)(tu_rand(&rng) % (uint64_t)(g_threads + 2))));
    }
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static void test_soak(void **state) {
  (void)state;
  if (tu_is_sim()) {
    tu_setenv("GPUMEM_SIM_DEVICES", g_sim_devices);
    gpumem_sim_set_delayed(1);
  }
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.release_threshold = 256 * TU_MiB; /* threshold trims racing with everything else */
  g_ctx = tu_ctx_new(&cfg);
  assert_status(gpumem_device_count(g_ctx, &g_ndev), GPUMEM_OK);
  if (g_ndev > MAX_DEV) g_ndev = MAX_DEV;
  for (int d = 0; d < g_ndev; d++) {
    pthread_rwlock_init(&g_dev[d].rw, NULL);
    pthread_mutex_init(&g_dev[d].mu, NULL);
    memset(g_dev[d].slots, 0, sizeof g_dev[d].slots);
  }
  pthread_t th[MAX_THREADS], mon;
  double t0 = now_s();
  assert_int_equal(pthread_create(&mon, NULL, monitor, NULL), 0);
  for (int i = 0; i < g_threads; i++) assert_int_equal(pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i), 0);
  while (now_s() - t0 < g_seconds && atomic_load(&g_errors) == 0) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < g_threads; i++) pthread_join(th[i], NULL);
  pthread_join(mon, NULL);
  double secs = now_s() - t0;
  if (tu_is_sim()) gpumem_sim_set_delayed(0);

  /* the survivors: no overlap, contents intact, stats match the model */
  for (int d = 0; d < g_ndev && atomic_load(&g_errors) == 0; d++) {
    void *ptrs[SLOTS];
    size_t sizes[SLOTS];
    uint64_t live = 0, req = 0;
    for (int i = 0; i < SLOTS; i++) {
      ptrs[i] = g_dev[d].slots[i].p;
      sizes[i] = g_dev[d].slots[i].n;
      if (ptrs[i]) {
        live++;
        req += sizes[i];
      }
    }
    if (tu_find_overlap(ptrs, sizes, SLOTS) != -1) record_error("device %d: live blocks overlap", d);
    gpumem_stats s = tu_stats(g_ctx, d);
    tu_assert_stats_sane(&s);
    if (s.num_live != live || s.requested_bytes != req)
      record_error("device %d: stats say %llu live / %llu requested, the model %llu / %llu", d, (unsigned long long)s.num_live,
                   (unsigned long long)s.requested_bytes, (unsigned long long)live, (unsigned long long)req);
    for (int i = 0; i < SLOTS; i++)
      if (g_dev[d].slots[i].p) {
        check_and_free(d, &g_dev[d].slots[i], NULL, 1);
        g_dev[d].slots[i].p = NULL;
      }
    s = tu_stats(g_ctx, d);
    if (s.num_live != 0 || s.allocated_bytes != 0) record_error("device %d: blocks left after freeing all", d);
  }
  unsigned long long ops = atomic_load(&g_ops);
  print_message("soak: seed %llu, backend %s, %d threads, %d devices, %.1f s, %llu ops (%.0f ops/s), %llu allocs, %llu frees "
                "(%llu cross-stream), %llu huge, %llu OOM, %llu trims, %llu resets (%llu blocks invalidated), "
                "max reserved %.1f MiB, %llu stats checks, errors %d\n",
                (unsigned long long)g_seed, tu_backend(), g_threads, g_ndev, secs, ops, (double)ops / secs, (unsigned long long)atomic_load(&g_allocs),
                (unsigned long long)atomic_load(&g_frees), (unsigned long long)atomic_load(&g_cross_stream),
                (unsigned long long)atomic_load(&g_huge), (unsigned long long)atomic_load(&g_ooms),
                (unsigned long long)atomic_load(&g_trims), (unsigned long long)atomic_load(&g_resets),
                (unsigned long long)atomic_load(&g_invalidated), (double)atomic_load(&g_max_reserved) / (double)TU_MiB,
                (unsigned long long)atomic_load(&g_stat_checks), atomic_load(&g_errors));
  if (atomic_load(&g_errors)) {
    print_error("%d errors; first: %s\n", atomic_load(&g_errors), g_first_error);
    fail();
  }
  assert_true(atomic_load(&g_allocs) > 0 && atomic_load(&g_frees) > 0);
  if (tu_is_sim()) gpumem_sim_complete_all();
  for (int d = 0; d < g_ndev; d++) {
    pthread_rwlock_destroy(&g_dev[d].rw);
    pthread_mutex_destroy(&g_dev[d].mu);
  }
  tu_ctx_done(g_ctx); /* leak check */
}

int main(void) {
  const char *e;
  if ((e = getenv("GPUMEM_SOAK_SECONDS")) && *e) g_seconds = atof(e);
  if ((e = getenv("GPUMEM_SOAK_THREADS")) && *e) g_threads = atoi(e);
  if ((e = getenv("GPUMEM_SOAK_DEVICES")) && *e) g_sim_devices = e;
  if ((e = getenv("GPUMEM_SOAK_MAX_MIB")) && *e) g_max_mib = strtoull(e, NULL, 10);
  g_seed = (e = getenv("GPUMEM_SOAK_SEED")) && *e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL);
  if (g_threads < 1) g_threads = 1;
  if (g_threads > MAX_THREADS) g_threads = MAX_THREADS;
  if (g_max_mib < 49) g_max_mib = 49;
  static char devs[256];
  snprintf(devs, sizeof devs, "%s", g_sim_devices); /* survives tu_env_clean */
  g_sim_devices = devs;
  const struct CMUnitTest tests[] = {
      TU_TEST(test_soak),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
