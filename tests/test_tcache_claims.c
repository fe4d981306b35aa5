/* The inlined hits of the per-thread caches (src/tcache.h): a block a thread's
 * cache handed out is remembered with its state and claimed on that thread's
 * free by one compare-and-swap, without the pointer index; the hits run before
 * the argument checks. Here: stale memories (the block freed elsewhere and
 * handed out again), races between the remembering thread and the index,
 * double frees after a hit, bad arguments with a warm cache, a trace started
 * while a cache is warm, a reset between remembering and freeing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "../src/tcache.h" /* gpumem__tc_own_of: which remembered blocks share a slot */

gpumem_status gpumem__check_invariants(gpumem_context *ctx);

enum { SZ = 64 * 1024 };

static gpumem_context *g_ctx;

/* warm this thread's cache on (ctx, device 0, NULL): after this it holds two blocks of SZ, and
 * alloc/free pairs of SZ are hits (4 allocations, 4 frees) */
static void warm(gpumem_context *ctx) {
  for (int i = 0; i < 2; i++) {
    void *p, *q;
    assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK);
    assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &q), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
    assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  }
}

static void assert_clean(gpumem_context *ctx, uint64_t allocs) {
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0 && s.requested_bytes == 0);
  assert_true(s.num_allocs == allocs && s.num_frees == allocs);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
}

/* ---- a free after a hit: the second free of the pointer is rejected ---------------------------- */

static void test_double_free_after_hit(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  warm(ctx);
  void *p;
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK); /* a hit: remembered */
  size_t req = 0;
  assert_status(gpumem_ptr_info(ctx, p, &req, NULL), GPUMEM_OK);
  assert_int_equal(req, SZ);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);                        /* claimed, cached */
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);       /* not live */
  assert_status(gpumem_ptr_info(ctx, p, &req, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, (char *)p + 256, NULL), GPUMEM_ERR_INVALID_POINTER); /* interior */
  assert_clean(ctx, 5);
  tu_ctx_done(ctx);
}

/* ---- bad arguments while the cache could serve the call --------------------------------------- */

static void test_bad_arguments_with_warm_cache(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  warm(ctx);
  gpumem_stats before = tu_stats(ctx, 0);
  void *p = (void *)0x1;
  assert_status(gpumem_alloc(NULL, 0, SZ, NULL, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_alloc(ctx, -1, SZ, NULL, &p), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_alloc(ctx, 1 << 20, SZ, NULL, &p), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_alloc(ctx, 0, 0, NULL, &p), GPUMEM_OK);
  assert_null(p);
  assert_status(gpumem_alloc(ctx, 0, SIZE_MAX, NULL, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_alloc(ctx, 0, SIZE_MAX - 100, NULL, &p), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_free(NULL, (void *)0x100000, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_free(ctx, NULL, NULL), GPUMEM_OK);
  /* a pointer the cache handed out, freed with the wrong context: rejected, still live */
  gpumem_context *other = tu_ctx_new(NULL);
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(other, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(NULL, p, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_ptr_info(ctx, p, NULL, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  tu_ctx_done(other);
  gpumem_stats after = tu_stats(ctx, 0);
  assert_true(after.num_allocs == before.num_allocs + 1 && after.num_frees == before.num_frees + 1);
  assert_clean(ctx, 5);
  tu_ctx_done(ctx);
}

/* ---- garbage pointers never match an empty or stale slot ------------------------------------ */

static void test_garbage_pointers_with_warm_cache(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  warm(ctx);
  void *live;
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &live), GPUMEM_OK); /* remembered */
  /* a trim flushes the cache: its slots are emptied while `live` stays live in its remembered state */
  assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  gpumem_stats before = tu_stats(ctx, 0);
  for (uintptr_t v = 1; v < 8192; v++)
    assert_status(gpumem_free(ctx, (void *)v, NULL), GPUMEM_ERR_INVALID_POINTER);
  for (uintptr_t v = 1; v < 512; v++)
    assert_status(gpumem_free(ctx, (char *)live + v, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, (void *)UINTPTR_MAX, NULL), GPUMEM_ERR_INVALID_POINTER);
  gpumem_stats after = tu_stats(ctx, 0);
  tu_assert_stats_equal(&before, &after);
  size_t req = 0;
  assert_status(gpumem_ptr_info(ctx, live, &req, NULL), GPUMEM_OK);
  assert_int_equal(req, SZ);
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* ---- a stale memory: the block was freed by another thread and handed out again --------------- */

typedef struct hop {
  gpumem_context *ctx;
  void *in;   /* freed by the thread */
  void *out;  /* allocated by the thread (SZ) */
  gpumem_status st_free, st_alloc;
} hop;

static void *hop_main(void *arg) {
  hop *h = arg;
  h->st_free = gpumem_free(h->ctx, h->in, NULL);
  h->st_alloc = gpumem_alloc(h->ctx, 0, SZ, NULL, &h->out);
  return NULL;
}

static void test_stale_memory(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  warm(ctx);
  uint64_t allocs = 4;
  for (int r = 0; r < 50; r++) {
    void *p;
    assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK); /* remembered by this thread */
    allocs++;
    /* another thread frees it (through the index) and allocates SZ: often the same block again */
    hop h = {ctx, p, NULL, GPUMEM_ERR_INTERNAL, GPUMEM_ERR_INTERNAL};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hop_main, &h), 0);
    pthread_join(t, NULL);
    allocs++;
    assert_status(h.st_free, GPUMEM_OK);
    assert_status(h.st_alloc, GPUMEM_OK);
    /* this thread's memory of p is stale: a free of p is live exactly when the other thread got p back */
    gpumem_status want = h.out == p ? GPUMEM_OK : GPUMEM_ERR_INVALID_POINTER;
    assert_status(gpumem_free(ctx, p, NULL), want);
    if (h.out != p) assert_status(gpumem_free(ctx, h.out, NULL), GPUMEM_OK);
    assert_status(gpumem_free(ctx, h.out, NULL), GPUMEM_ERR_INVALID_POINTER);
    assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  }
  assert_clean(ctx, allocs);
  tu_ctx_done(ctx);
}

/* ---- the remembering thread and another thread free one pointer at once ----------------------- */

static pthread_barrier_t g_bar;
static void *g_ptr;
static atomic_int g_ok, g_invalid;
static int g_rounds;

static void count(gpumem_status s) {
  if (s == GPUMEM_OK) atomic_fetch_add(&g_ok, 1);
  else if (s == GPUMEM_ERR_INVALID_POINTER) atomic_fetch_add(&g_invalid, 1);
}

static void *racer(void *arg) {
  (void)arg;
  for (int r = 0; r < g_rounds; r++) {
    pthread_barrier_wait(&g_bar);
    count(gpumem_free(g_ctx, g_ptr, NULL));
    pthread_barrier_wait(&g_bar);
  }
  return NULL;
}

static void test_race_with_remembering_thread(void **state) {
  (void)state;
  g_ctx = tu_ctx_new(NULL);
  warm(g_ctx);
  g_rounds = (int)tu_scaled(2000, 50);
  atomic_store(&g_ok, 0);
  atomic_store(&g_invalid, 0);
  pthread_barrier_init(&g_bar, NULL, 2);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, racer, NULL), 0);
  for (int r = 0; r < g_rounds; r++) {
    assert_status(gpumem_alloc(g_ctx, 0, SZ, NULL, &g_ptr), GPUMEM_OK); /* a hit: remembered here */
    pthread_barrier_wait(&g_bar);
    count(gpumem_free(g_ctx, g_ptr, NULL)); /* the compare-and-swap, against the other's index claim */
    pthread_barrier_wait(&g_bar);
    assert_int_equal(atomic_load(&g_ok), r + 1);
    assert_int_equal(atomic_load(&g_invalid), r + 1);
  }
  pthread_join(t, NULL);
  pthread_barrier_destroy(&g_bar);
  assert_clean(g_ctx, 4 + (uint64_t)g_rounds);
  tu_ctx_done(g_ctx);
}

/* ---- a block freed into a cache through the index is remembered there ---------------------------- */

/* The worker frees a pointer the main thread allocated (through the index: its cache never handed it
 * out), while the main thread waits; the main thread's free of it then is a double free. The
 * worker's pairs of SZ after that get the same block back from its cache, and its frees of it claim
 * it through the memory its first free left (the state its next pop gives the block). */
static pthread_barrier_t g_bar2;
static gpumem_status g_worker_st[6];
static void *worker_frees_foreign(void *arg) {
  void *p = arg, *q = NULL;
  g_worker_st[0] = gpumem_free(g_ctx, p, NULL); /* through the index, into this thread's cache */
  pthread_barrier_wait(&g_bar2);                 /* main: a free of p now is a double free */
  pthread_barrier_wait(&g_bar2);
  g_worker_st[1] = gpumem_free(g_ctx, p, NULL); /* cached here: rejected */
  g_worker_st[2] = GPUMEM_OK;
  for (int i = 0; i < 3 && g_worker_st[2] == GPUMEM_OK; i++) {
    if ((g_worker_st[2] = gpumem_alloc(g_ctx, 0, SZ, NULL, &q)) != GPUMEM_OK || q != p) break; /* an exact hit: p */
    g_worker_st[2] = gpumem_free(g_ctx, q, NULL);
  }
  g_worker_st[3] = q == p ? GPUMEM_OK : GPUMEM_ERR_INTERNAL;
  g_worker_st[4] = gpumem_free(g_ctx, q, NULL); /* a double free after the claim */
  g_worker_st[5] = gpumem_alloc(g_ctx, 0, SZ, NULL, &q); /* p again, freed by the main thread */
  pthread_barrier_wait(&g_bar2);
  return q;
}

static void test_remembered_at_index_free(void **state) {
  (void)state;
  g_ctx = tu_ctx_new(NULL);
  void *p, *q;
  assert_status(gpumem_alloc(g_ctx, 0, SZ, NULL, &p), GPUMEM_OK);
  pthread_barrier_init(&g_bar2, NULL, 2);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, worker_frees_foreign, p), 0);
  pthread_barrier_wait(&g_bar2);
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER); /* in the worker's cache */
  size_t req = 0;
  assert_status(gpumem_ptr_info(g_ctx, p, &req, NULL), GPUMEM_ERR_INVALID_POINTER);
  pthread_barrier_wait(&g_bar2);
  pthread_barrier_wait(&g_bar2); /* the worker holds p again, live */
  assert_status(g_worker_st[0], GPUMEM_OK);
  assert_status(g_worker_st[1], GPUMEM_ERR_INVALID_POINTER);
  assert_status(g_worker_st[2], GPUMEM_OK);
  assert_status(g_worker_st[3], GPUMEM_OK);
  assert_status(g_worker_st[4], GPUMEM_ERR_INVALID_POINTER);
  assert_status(g_worker_st[5], GPUMEM_OK);
  void *ret = NULL;
  pthread_join(t, &ret);
  pthread_barrier_destroy(&g_bar2);
  assert_ptr_equal(ret, p);
  assert_status(gpumem_ptr_info(g_ctx, p, &req, NULL), GPUMEM_OK);
  assert_int_equal(req, SZ);
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_OK); /* the worker's allocation, freed here */
  assert_status(gpumem_free(g_ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_alloc(g_ctx, 0, SZ, NULL, &q), GPUMEM_OK);
  assert_status(gpumem_free(g_ctx, q, NULL), GPUMEM_OK);
  assert_clean(g_ctx, 6);
  tu_ctx_done(g_ctx);
}

/* ---- a flush for trim or growth keeps the live blocks remembered, forgets the ones it gives back - */

/* p (live) and q (cached) are remembered by this thread; a flush that frees no block record (trim,
 * growth, out of memory) gives q back to the pool and forgets it, and keeps p: p's free after it is
 * still claimed, q's is a double free (the pool holds q's record in the state its slot anticipated
 * for the next pop, so a slot left behind would claim a free block of the pool). */
static void flush_then_free(gpumem_context *ctx, int by_growth) {
  void *p, *q, *big = NULL;
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK); /* hits: remembered live */
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &q), GPUMEM_OK);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_OK); /* cached, remembered for its next pop */
  if (by_growth) {
    /* more than the pool holds: it grows, and the cache is flushed first (tcache.c gpumem__tc_alloc) */
    assert_status(gpumem_alloc(ctx, 0, (size_t)512 << 20, NULL, &big), GPUMEM_OK);
  } else {
    assert_status(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  }
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_ERR_INVALID_POINTER); /* given back: not live */
  size_t req = 0;
  assert_status(gpumem_ptr_info(ctx, p, &req, NULL), GPUMEM_OK);
  assert_int_equal(req, SZ);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_ERR_INVALID_POINTER);
  if (big != NULL) assert_status(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
}

static void test_flush_keeps_live_memories(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  uint64_t allocs = 0;
  for (int by_growth = 0; by_growth < 2; by_growth++) {
    for (int r = 0; r < 3; r++) {
      warm(ctx);
      flush_then_free(ctx, by_growth);
      allocs += 6 + (uint64_t)by_growth; /* warm's 4, p, q, big */
    }
  }
  /* the freed blocks come back from the pool and the cache serves them as before */
  warm(ctx);
  assert_clean(ctx, allocs + 4);
  tu_ctx_done(ctx);
}

/* ---- a reset between the hit and the free: the memory is dropped, the free rejected ------------ */

static void test_reset_drops_memories(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  warm(ctx);
  void *p, *q;
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK); /* a hit */
  assert_status(gpumem_alloc(ctx, 0, 3 * SZ, NULL, &q), GPUMEM_OK); /* from the pool, remembered too */
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, q, NULL), GPUMEM_ERR_INVALID_POINTER);
  /* the pool works on, and the cache warms again */
  warm(ctx);
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK);
  assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  tu_assert_stats_sane(&s);
  assert_true(s.num_live == 0 && s.allocated_bytes == 0);
  assert_status(gpumem__check_invariants(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* ---- a trace started while the cache is warm records every call after it --------------------- */

static void count_lines(const char *path, int *a, int *f) {
  FILE *fp = fopen(path, "r");
  assert_non_null(fp);
  char line[512];
  *a = *f = 0;
  while (fgets(line, sizeof line, fp)) {
    if (line[0] == 'a') (*a)++;
    if (line[0] == 'f') (*f)++;
  }
  fclose(fp);
}

static void test_trace_with_warm_cache(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  warm(ctx);
  void *live;
  assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &live), GPUMEM_OK); /* remembered, before the trace */
  char path[256];
  const char *dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/gpumem_claims_%d.trace", dir && dir[0] ? dir : "/tmp", (int)getpid());
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  for (int i = 0; i < 3; i++) {
    void *p;
    assert_status(gpumem_alloc(ctx, 0, SZ, NULL, &p), GPUMEM_OK);
    assert_status(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  }
  assert_status(gpumem_free(ctx, live, NULL), GPUMEM_OK); /* allocated before the trace: a free line too */
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  int a, f;
  count_lines(path, &a, &f);
  remove(path);
  assert_int_equal(a, 3);
  assert_true(f == 3 || f == 4);
  /* after the trace the cache serves again */
  warm(ctx);
  assert_clean(ctx, 12);
  tu_ctx_done(ctx);
}

/* ---- when a cache is rekeyed depends on the calls, not on the blocks' addresses ---------------- */

/* The slot of the cache's table of remembered blocks an address goes to (the table's hash). */
static size_t own_slot(const void *p) {
  static gpumem__tc probe;
  return (size_t)(gpumem__tc_own_of(&probe, (uintptr_t)p) - probe.own);
}

/* A cache keyed to stream A holding blocks is flushed and rekeyed after 16 calls on another stream.
 * A free on A in between counts the same whether the freed block is still remembered (the inlined
 * hit) or its slot was taken by a later block (the full path): otherwise when the cache moves, and
 * so where later blocks go, would depend on where the backend put the memory. Run both ways. */
static void rekey_after_misses(int collide) {
  enum { N = 4096, SMALL = 256 };
  const gpumem_stream A = (gpumem_stream)(uintptr_t)0xA0, B = (gpumem_stream)(uintptr_t)0xB0;
  gpumem_context *ctx = tu_ctx_new(NULL);
  static void *blk[N];
  static int last_in[GPUMEM__TC_OWN]; /* (index + 1) of the newest block remembered in each slot */
  memset(last_in, 0, sizeof last_in);
  int x1 = -1, x2 = -1;
  for (int i = 0; i < N; i++) {
    assert_status(gpumem_alloc(ctx, 0, SMALL, A, &blk[i]), GPUMEM_OK);
    last_in[own_slot(blk[i])] = i + 1;
  }
  /* collide: x1 shares its slot with x2, remembered after it; else both are still remembered */
  for (int i = 0; i < N && x2 < 0; i++) {
    int owner = last_in[own_slot(blk[i])] - 1;
    if (collide && owner != i) x1 = i, x2 = owner;
    if (!collide && owner == i) {
      if (x1 < 0) x1 = i;
      else x2 = i;
    }
  }
  assert_true(x1 >= 0 && x2 > x1);
  if (collide) assert_int_equal(own_slot(blk[x1]), own_slot(blk[x2]));
  else assert_int_equal(last_in[own_slot(blk[x1])], x1 + 1); /* x1 is still remembered */
  assert_status(gpumem_free(ctx, blk[x2], A), GPUMEM_OK); /* kept: the cache holds a block */
  assert_int_equal(gpumem__tc_cached_bytes(), SMALL);
  void *onb[16];
  for (int i = 0; i < 15; i++) assert_status(gpumem_alloc(ctx, 0, SMALL, B, &onb[i]), GPUMEM_OK); /* 15 misses */
  assert_status(gpumem_free(ctx, blk[x1], A), GPUMEM_OK); /* kept too */
  assert_int_equal(gpumem__tc_cached_bytes(), 2 * SMALL);
  assert_status(gpumem_alloc(ctx, 0, SMALL, B, &onb[15]), GPUMEM_OK); /* the 16th: flushed, keyed to B */
  assert_int_equal(gpumem__tc_cached_bytes(), 0);
  for (int i = 0; i < 16; i++) assert_status(gpumem_free(ctx, onb[i], B), GPUMEM_OK);
  for (int i = 0; i < N; i++)
    if (i != x1 && i != x2) assert_status(gpumem_free(ctx, blk[i], A), GPUMEM_OK);
  assert_clean(ctx, N + 16);
  tu_ctx_done(ctx);
}

static void test_rekey_counts_calls_not_slots(void **state) {
  (void)state;
  TU_REQUIRE_SIM(); /* (streams A and B are tokens, as on sim) */
  TU_SKIP_UNDER_VALGRIND("[  SKIP    ] thread caches are off while memcheck's annotations are on");
  rekey_after_misses(0);
  rekey_after_misses(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_double_free_after_hit, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_bad_arguments_with_warm_cache, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_pointers_with_warm_cache, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_stale_memory, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_race_with_remembering_thread, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_remembered_at_index_free, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_flush_keeps_live_memories, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_reset_drops_memories, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_trace_with_warm_cache, tu_setup, tu_teardown),
      cmocka_unit_test_setup_teardown(test_rekey_counts_calls_not_slots, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
