/* Allocation traces: gpumem_trace_start/stop and GPUMEM_TRACE. A recorded
 * workload is parsed back and compared event by event, replayed through the
 * library (recording the replay gives the same events), read by
 * gpumem-replay, recorded from several threads at once, across a reset and
 * on several devices. */
#include <pthread.h>
#include <unistd.h>

#include "testutil.h"

typedef struct ev {
  char kind;       /* 'a', 'f' or 'n' */
  uint64_t id;
  uint64_t size;
  uint64_t stream; /* 'a': the allocation's; 'f': the free's when has_stream; 'n': the noted stream */
  int device;
  int has_stream;  /* 'f': the line names the free's stream (not the allocation's) */
} ev;

typedef struct parsed {
  ev *e;
  size_t n, cap;
  int header, backend, date, device0, end;
  int nheader; /* "# libgpumem trace" lines */
} parsed;

static void tmp_path(char *buf, size_t n, const char *tag) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, n, "%s/gpumem_test_trace_%ld_%s.txt", dir && *dir ? dir : "/tmp", (long)getpid(), tag);
}

static void push(parsed *p, ev e) {
  if (p->n == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 256;
    p->e = realloc(p->e, p->cap * sizeof *p->e);
    assert_non_null(p->e);
  }
  p->e[p->n++] = e;
}

/* Parse a trace file strictly: comment lines, 'a ID SIZE STREAM [DEVICE]', 'f ID [STREAM]', 'n ID STREAM'. */
static parsed parse(const char *path) {
  parsed p;
  memset(&p, 0, sizeof p);
  FILE *f = fopen(path, "r");
  if (f == NULL) fail_msg("cannot open %s", path);
  char line[512];
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    assert_true(len > 0 && line[len - 1] == '\n');
    if (line[0] == '#') {
      if (!strcmp(line, "# libgpumem trace\n")) p.header = 1, p.nheader++;
      if (!strncmp(line, "# backend ", 10)) p.backend = 1;
      if (!strncmp(line, "# date ", 7)) p.date = 1;
      if (!strncmp(line, "# device 0 ", 11)) p.device0 = 1;
      if (!strncmp(line, "# end: ", 7)) p.end = 1;
      continue;
    }
    ev e;
    memset(&e, 0, sizeof e);
    unsigned long long id, size, stream;
    int dev, consumed = 0;
    if (line[0] == 'a') {
      int k = sscanf(line, "a %llu %llu %llu %d%n", &id, &size, &stream, &dev, &consumed);
      if (k == 4) {
        assert_true(line[consumed] == '\n' && dev != 0);
        e.device = dev;
      } else {
        assert_int_equal(sscanf(line, "a %llu %llu %llu%n", &id, &size, &stream, &consumed), 3);
        assert_true(line[consumed] == '\n');
      }
      e.kind = 'a';
      e.id = id;
      e.size = size;
      e.stream = stream;
    } else if (line[0] == 'f') {
      if (sscanf(line, "f %llu %llu%n", &id, &stream, &consumed) == 2) {
        e.has_stream = 1;
        e.stream = stream;
      } else {
        assert_int_equal(sscanf(line, "f %llu%n", &id, &consumed), 1);
      }
      assert_true(line[consumed] == '\n');
      e.kind = 'f';
      e.id = id;
    } else if (line[0] == 'n') {
      assert_int_equal(sscanf(line, "n %llu %llu%n", &id, &stream, &consumed), 2);
      assert_true(line[consumed] == '\n');
      e.kind = 'n';
      e.id = id;
      e.stream = stream;
    } else {
      fail_msg("bad trace line: %s", line);
    }
    push(&p, e);
  }
  fclose(f);
  return p;
}

/* IDs: 'a' lines in increasing order from 1, every 'f' and 'n' of a live ID, each 'f' at most once. */
static void check_consistent(const parsed *p) {
  uint64_t next = 1;
  size_t nalloc = 0;
  for (size_t i = 0; i < p->n; i++)
    if (p->e[i].kind == 'a') nalloc++;
  char *live = calloc(nalloc + 2, 1);
  assert_non_null(live);
  for (size_t i = 0; i < p->n; i++) {
    const ev *e = &p->e[i];
    if (e->kind == 'a') {
      assert_true(e->id == next);
      next++;
      live[e->id] = 1;
    } else {
      assert_true(e->id >= 1 && e->id < next);
      if (!live[e->id]) fail_msg("event %zu names ID %llu which is not live", i, (unsigned long long)e->id);
      if (e->kind == 'f') live[e->id] = 0;
    }
  }
  free(live);
}

/* ---------------------------------------------------------------------- */

#define NOPS 3000
#define NSLOTS 64

/* A deterministic workload; fills want (the events it should produce). */
static void workload(gpumem_context *ctx, uint64_t seed, parsed *want) {
  void *ptr[NSLOTS] = {0};
  uint64_t id[NSLOTS] = {0}, astream[NSLOTS] = {0};
  uint64_t next = 1;
  const uint64_t streams[3] = {0, (uintptr_t)tu_stream(0x1000), (uintptr_t)tu_stream(0x2000)};
  for (int op = 0; op < NOPS; op++) {
    int k = (int)tu_rand_range(&seed, 0, NSLOTS - 1);
    if (ptr[k] == NULL) {
      uint64_t r = tu_rand_range(&seed, 0, 9);
      size_t size = r < 6 ? (size_t)tu_rand_range(&seed, 1, 70000)
                          : (size_t)tu_rand_range(&seed, 1, 12 * TU_MiB); /* small and large */
      uint64_t s = streams[tu_rand_range(&seed, 0, 2)];
      assert_status(gpumem_alloc(ctx, 0, size, (gpumem_stream)(uintptr_t)s, &ptr[k]), GPUMEM_OK);
      id[k] = next++;
      astream[k] = s;
      if (want) push(want, (ev){'a', id[k], size, s, 0, 0});
    } else {
      assert_status(gpumem_free(ctx, ptr[k], NULL), GPUMEM_OK);
      ptr[k] = NULL;
      /* freed on the default stream: the line names it when the block was allocated on another */
      if (want) push(want, (ev){'f', id[k], 0, 0, 0, astream[k] != 0});
    }
  }
  /* a zero-size allocation and a NULL free record nothing */
  void *z = (void *)1;
  assert_status(gpumem_alloc(ctx, 0, 0, NULL, &z), GPUMEM_OK);
  assert_status(gpumem_free(ctx, NULL, NULL), GPUMEM_OK);
  /* an invalid free records nothing */
  if (ptr[0] != NULL) assert_status(gpumem_free(ctx, (char *)ptr[0] + 256, NULL), GPUMEM_ERR_INVALID_POINTER);
  /* free slots 5.. first, then 0..4 */
  for (int k = 5; k < NSLOTS; k++)
    if (ptr[k] != NULL) {
      assert_status(gpumem_free(ctx, ptr[k], NULL), GPUMEM_OK);
      if (want) push(want, (ev){'f', id[k], 0, 0, 0, astream[k] != 0});
    }
  for (int k = 0; k < 5; k++)
    if (ptr[k] != NULL) {
      assert_status(gpumem_free(ctx, ptr[k], NULL), GPUMEM_OK);
      if (want) push(want, (ev){'f', id[k], 0, 0, 0, astream[k] != 0});
    }
}

static void assert_same_events(const parsed *got, const parsed *want) {
  assert_int_equal(got->n, want->n);
  for (size_t i = 0; i < want->n; i++) {
    const ev *g = &got->e[i], *w = &want->e[i];
    if (g->kind != w->kind || g->id != w->id || g->size != w->size || g->stream != w->stream ||
        g->device != w->device || g->has_stream != w->has_stream)
      fail_msg("event %zu: got %c %llu %llu %llu, want %c %llu %llu %llu", i, g->kind, (unsigned long long)g->id,
               (unsigned long long)g->size, (unsigned long long)g->stream, w->kind, (unsigned long long)w->id,
               (unsigned long long)w->size, (unsigned long long)w->stream);
  }
}

/* Replay parsed events through ctx (streams as recorded: a free on its line's stream, else on its
 * allocation's); frees everything left at the end. */
static void replay(gpumem_context *ctx, const parsed *p) {
  size_t nalloc = 0;
  for (size_t i = 0; i < p->n; i++)
    if (p->e[i].kind == 'a') nalloc++;
  void **ptrs = calloc(nalloc + 2, sizeof *ptrs);
  uint64_t *astream = calloc(nalloc + 2, sizeof *astream);
  assert_true(ptrs != NULL && astream != NULL);
  for (size_t i = 0; i < p->n; i++) {
    const ev *e = &p->e[i];
    if (e->kind == 'a') {
      assert_status(gpumem_alloc(ctx, e->device, (size_t)e->size, (gpumem_stream)(uintptr_t)e->stream, &ptrs[e->id]),
                    GPUMEM_OK);
      astream[e->id] = e->stream;
    } else if (e->kind == 'n') {
      assert_status(gpumem_record_stream(ctx, ptrs[e->id], (gpumem_stream)(uintptr_t)e->stream), GPUMEM_OK);
    } else {
      uint64_t fs = e->has_stream ? e->stream : astream[e->id];
      assert_status(gpumem_free(ctx, ptrs[e->id], (gpumem_stream)(uintptr_t)fs), GPUMEM_OK);
      ptrs[e->id] = NULL;
    }
  }
  free(astream);
  for (size_t i = 0; i < nalloc + 2; i++)
    if (ptrs[i] != NULL) assert_status(gpumem_free(ctx, ptrs[i], NULL), GPUMEM_OK);
  free(ptrs);
}

/* Replays p in a new context that records the replay into path2: the same events. Returns the
 * context (its trace stopped). */
static gpumem_context *rerecord(const parsed *p, const char *path2) {
  gpumem_context *ctx2 = tu_ctx_new(NULL);
  assert_status(gpumem_trace_start(ctx2, path2), GPUMEM_OK);
  replay(ctx2, p);
  assert_status(gpumem_trace_stop(ctx2), GPUMEM_OK);
  parsed again = parse(path2);
  assert_same_events(&again, p);
  free(again.e);
  return ctx2;
}

/* gpumem-replay reads the trace (plain text) and replays it. */
static void replay_bin_accepts(const char *path) {
#ifdef GPUMEM_REPLAY_BIN
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "GPUMEM_LOG=off '%s' '%s' 2>&1", GPUMEM_REPLAY_BIN, path);
  FILE *pf = popen(cmd, "r");
  assert_non_null(pf);
  char out[8192];
  size_t n = fread(out, 1, sizeof out - 1, pf);
  out[n] = '\0';
  int rc = pclose(pf);
  if (rc != 0 || strstr(out, "FAILED") != NULL) fail_msg("gpumem-replay failed (%d):\n%s", rc, out);
  char base[600];
  const char *slash = strrchr(path, '/');
  snprintf(base, sizeof base, "%s", slash ? slash + 1 : path);
  base[22] = '\0'; /* the table's first column is 22 wide */
  if (strstr(out, base) == NULL) fail_msg("gpumem-replay output lacks the trace:\n%s", out);
#else
  (void)path;
#endif
}

static void test_round_trip(void **state) {
  (void)state;
  char path[512], path2[512];
  tmp_path(path, sizeof path, "rt");
  tmp_path(path2, sizeof path2, "rt2");
  gpumem_context *ctx = tu_ctx_new(NULL);
  parsed want;
  memset(&want, 0, sizeof want);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  assert_status(gpumem_trace_start(ctx, path2), GPUMEM_ERR_BUSY);
  workload(ctx, 42, &want);
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK); /* twice is fine */
  parsed got = parse(path);
  assert_true(got.header && got.backend && got.date && got.device0 && got.end);
  check_consistent(&got);
  assert_same_events(&got, &want);

  /* replay it with the library, recording the replay: the same events */
  gpumem_context *ctx2 = rerecord(&got, path2);
  gpumem_stats s1 = tu_stats(ctx, 0), s2 = tu_stats(ctx2, 0);
  assert_true(s1.num_allocs == s2.num_allocs && s1.num_frees == s2.num_frees);
  assert_true(s1.allocated_peak == s2.allocated_peak && s1.reserved_peak == s2.reserved_peak);
  tu_ctx_done(ctx2);
  tu_ctx_done(ctx);
  free(got.e);
  free(want.e);

  replay_bin_accepts(path);
  unlink(path);
  unlink(path2);
}

/* ---------------------------------------------------------------------- */

static void test_env_file(void **state) {
  (void)state;
  char path[512];
  tmp_path(path, sizeof path, "env2");
  tu_setenv("GPUMEM_TRACE", path);
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a, *b;
  const gpumem_stream s77 = tu_stream(77);
  assert_status(gpumem_alloc(ctx, 0, 1000, s77, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2000, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_ERR_BUSY);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  tu_ctx_done(ctx); /* destroy closes the trace */
  parsed p = parse(path);
  assert_true(p.header && p.end);
  parsed want;
  memset(&want, 0, sizeof want);
  push(&want, (ev){'a', 1, 1000, (uintptr_t)s77, 0, 0});
  push(&want, (ev){'a', 2, 2000, 0, 0, 0});
  push(&want, (ev){'f', 1, 0, 0, 0, 1}); /* freed on the default stream, allocated on s77 */
  push(&want, (ev){'f', 2, 0, 0, 0, 0});
  assert_same_events(&p, &want);
  free(p.e);
  free(want.e);
  unlink(path);

  /* GPUMEM_CONFIG_NO_ENV: ignored */
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.flags |= GPUMEM_CONFIG_NO_ENV;
  tu_setenv("GPUMEM_TRACE", "/nonexistent-dir-gpumem/x.txt");
  ctx = tu_ctx_new(&cfg);
  tu_ctx_done(ctx);

  /* a bad path: INVALID_ARGUMENT, a log line naming the variable */
  tu_log *log = tu_log_new();
  tu_config(&cfg);
  tu_log_install(&cfg, log, GPUMEM_LOG_WARN);
  gpumem_context *bad = NULL;
  assert_status(gpumem_create(&cfg, &bad), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_null(bad);
  assert_int_equal(tu_log_count_matching(log, "GPUMEM_TRACE", "/nonexistent-dir-gpumem/x.txt", NULL), 1);
  /* .gz is refused too */
  tu_setenv("GPUMEM_TRACE", "/tmp/x.txt.gz");
  assert_status(gpumem_create(&cfg, &bad), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_true(tu_log_count_matching(log, "GPUMEM_TRACE", NULL) >= 2);
  tu_log_free(log);

  /* empty or blanks: unset, as for every GPUMEM_* variable (no trace, no file named by blanks) */
  tu_setenv("GPUMEM_TRACE", "");
  ctx = tu_ctx_new(NULL);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK); /* no trace was being recorded */
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
  tu_setenv("GPUMEM_TRACE", "   ");
  ctx = tu_ctx_new(NULL);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
  assert_int_equal(access("   ", F_OK), -1);
  /* surrounding blanks are not part of the path */
  char padded[600];
  snprintf(padded, sizeof padded, "  %s \t", path);
  unlink(path);
  tu_setenv("GPUMEM_TRACE", padded);
  ctx = tu_ctx_new(NULL);
  tu_ctx_done(ctx);
  assert_int_equal(access(path, R_OK), 0);
  unlink(path);

  /* %p and %c expand */
  char pat[512], want_path[600];
  const char *dir = getenv("TMPDIR");
  snprintf(pat, sizeof pat, "%s/gpumem_test_trace_pid%%p.txt", dir && *dir ? dir : "/tmp");
  snprintf(want_path, sizeof want_path, "%s/gpumem_test_trace_pid%ld.txt", dir && *dir ? dir : "/tmp", (long)getpid());
  tu_setenv("GPUMEM_TRACE", pat);
  ctx = tu_ctx_new(NULL);
  tu_ctx_done(ctx);
  assert_int_equal(access(want_path, R_OK), 0);
  unlink(want_path);
}

static void test_api_errors(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  assert_status(gpumem_trace_start(NULL, "/tmp/x"), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_trace_start(ctx, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_trace_start(ctx, ""), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_trace_start(ctx, "/nonexistent-dir-gpumem/t.txt"), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_trace_start(ctx, "/tmp/t.txt.gz"), GPUMEM_ERR_NOT_SUPPORTED);
  assert_status(gpumem_trace_stop(NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* ---------------------------------------------------------------------- */

typedef struct targ {
  gpumem_context *ctx;
  uint64_t seed;
} targ;

static void *thread_fn(void *arg) {
  targ *t = arg;
  void *ptr[32] = {0};
  for (int op = 0; op < 4000; op++) {
    int k = (int)tu_rand_range(&t->seed, 0, 31);
    if (ptr[k] == NULL) {
      if (gpumem_alloc(t->ctx, 0, (size_t)tu_rand_range(&t->seed, 1, 300000), (gpumem_stream)(uintptr_t)(t->seed % 3),
                       &ptr[k]) != GPUMEM_OK)
        return (void *)1;
    } else {
      if (gpumem_free(t->ctx, ptr[k], NULL) != GPUMEM_OK) return (void *)1;
      ptr[k] = NULL;
    }
  }
  for (int k = 0; k < 32; k++)
    if (ptr[k] && gpumem_free(t->ctx, ptr[k], NULL) != GPUMEM_OK) return (void *)1;
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  char path[512];
  tmp_path(path, sizeof path, "thr");
  gpumem_context *ctx = tu_ctx_new(NULL);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  enum { NT = 6 };
  pthread_t th[NT];
  targ args[NT];
  for (int i = 0; i < NT; i++) {
    args[i] = (targ){ctx, 1000 + (uint64_t)i};
    assert_int_equal(pthread_create(&th[i], NULL, thread_fn, &args[i]), 0);
  }
  for (int i = 0; i < NT; i++) {
    void *r;
    pthread_join(th[i], &r);
    assert_null(r);
  }
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  gpumem_stats s = tu_stats(ctx, 0);
  parsed p = parse(path);
  check_consistent(&p);
  size_t na = 0, nf = 0;
  for (size_t i = 0; i < p.n; i++) *(p.e[i].kind == 'a' ? &na : &nf) += 1;
  assert_true(na == s.num_allocs && nf == s.num_frees && na == nf);
  free(p.e);
  tu_ctx_done(ctx);
  unlink(path);
}

static void test_reset_and_devices(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  char path[512];
  tmp_path(path, sizeof path, "reset");
  gpumem_context *ctx = tu_ctx_new(NULL);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  void *a, *b, *c, *d;
  assert_status(gpumem_alloc(ctx, 0, 100, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 1, 200, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 300, NULL, &c), GPUMEM_OK);
  assert_status(gpumem_reset(ctx, 0, 0), GPUMEM_OK); /* frees a and c */
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_alloc(ctx, 0, 400, NULL, &d), GPUMEM_OK);
  assert_status(gpumem_free(ctx, d, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  parsed p = parse(path);
  check_consistent(&p);
  parsed want;
  memset(&want, 0, sizeof want);
  push(&want, (ev){'a', 1, 100, 0, 0, 0});
  push(&want, (ev){'a', 2, 200, 0, 1, 0});
  push(&want, (ev){'a', 3, 300, 0, 0, 0});
  push(&want, (ev){'f', 1, 0, 0, 0, 0});
  push(&want, (ev){'f', 3, 0, 0, 0, 0});
  push(&want, (ev){'a', 4, 400, 0, 0, 0});
  push(&want, (ev){'f', 4, 0, 0, 0, 0});
  push(&want, (ev){'f', 2, 0, 0, 0, 0});
  assert_same_events(&p, &want);
  free(p.e);
  free(want.e);
  tu_ctx_done(ctx);
  unlink(path);
}

/* gpumem-replay reads traces strictly: a line that is not a comment, an 'a ID SIZE STREAM
 * [DEVICE]', an 'f ID [STREAM]' or an 'n ID STREAM' with decimal fields is refused, and a long
 * comment is one comment. */
#ifdef GPUMEM_REPLAY_BIN
static int replay_rc(const char *path, const void *content, size_t n, char *out, size_t cap) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(content, 1, n, f), n);
  fclose(f);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "GPUMEM_LOG=off '%s' '%s' 2>&1", GPUMEM_REPLAY_BIN, path);
  FILE *pf = popen(cmd, "r");
  assert_non_null(pf);
  size_t got = fread(out, 1, cap - 1, pf);
  out[got] = '\0';
  return pclose(pf);
}
#endif

static void test_replay_strict(void **state) {
  (void)state;
#ifdef GPUMEM_REPLAY_BIN
  char path[512], out[8192];
  tmp_path(path, sizeof path, "strict");
  static const char *const bad[] = {
      "a 5\n", "a 1 100banana 0\n", "a 1 -5 0\n", "a 1 99999999999999999999999 0\n", "a1 5 0\n",
      "f\n", "f 1x\n", "a 1 5 0 1 2\n", "x 1\n", "a 1 5 0 99999999999\n", "f 1 2 3\n", "f 1 x\n", "n 1\n",
      "n 1 2 3\n", "n\n", "n 1 -2\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = replay_rc(path, bad[i], strlen(bad[i]), out, sizeof out);
    if (rc == 0 || strstr(out, "FAILED") == NULL) fail_msg("accepted %s:\n%s", bad[i], out);
  }
  char zeros[4096];
  memset(zeros, 0, sizeof zeros);
  int rc = replay_rc(path, zeros, sizeof zeros, out, sizeof out);
  if (rc == 0 || strstr(out, "NUL") == NULL) fail_msg("accepted a file of NUL bytes:\n%s", out);
  /* a comment longer than any buffer, whose tail looks like an event; CRLF line ends */
  char longc[2048];
  size_t n = 0;
  longc[n++] = '#';
  while (n < 1500) longc[n++] = 'x';
  n += (size_t)snprintf(longc + n, sizeof longc - n, " a 1 5 0\r\na 1 4096 0 1\r\nf 1\r\n");
  rc = replay_rc(path, longc, n, out, sizeof out);
  if (rc != 0 || strstr(out, "FAILED") != NULL) fail_msg("refused a long comment:\n%s", out);
  unlink(path);
#else
  skip();
#endif
}

/* gpumem_record_stream is recorded as 'n ID STREAM', a free on a stream other than the allocation's
 * as 'f ID STREAM'; a record_stream that fails, or of a block allocated before the trace began,
 * writes nothing. Replaying the file makes the same calls (the same lines again). */
static void test_record_stream_lines(void **state) {
  (void)state;
  TU_REQUIRE_SIM(); /* the stream handles are tokens: events recorded on them are valid only on sim */
  char path[512], path2[512];
  tmp_path(path, sizeof path, "note");
  tmp_path(path2, sizeof path2, "note2");
  const uint64_t s1 = 0x1000, s2 = 0x2000, s3 = 0x3000;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *early, *a, *b;
  assert_status(gpumem_alloc(ctx, 0, 4096, (gpumem_stream)(uintptr_t)s1, &early), GPUMEM_OK);
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, TU_MiB, (gpumem_stream)(uintptr_t)s1, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2 * TU_MiB, (gpumem_stream)(uintptr_t)s1, &b), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, a, (gpumem_stream)(uintptr_t)s2), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, early, (gpumem_stream)(uintptr_t)s2), GPUMEM_OK); /* no line */
  assert_status(gpumem_record_stream(ctx, (char *)a + 64, (gpumem_stream)(uintptr_t)s2),
                GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_record_stream(ctx, NULL, (gpumem_stream)(uintptr_t)s2), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, a, (gpumem_stream)(uintptr_t)s1), GPUMEM_OK);
  assert_status(gpumem_record_stream(ctx, a, (gpumem_stream)(uintptr_t)s2), GPUMEM_ERR_INVALID_POINTER);
  assert_status(gpumem_free(ctx, b, (gpumem_stream)(uintptr_t)s3), GPUMEM_OK);
  assert_status(gpumem_free(ctx, early, (gpumem_stream)(uintptr_t)s1), GPUMEM_OK); /* no line */
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  parsed p = parse(path);
  check_consistent(&p);
  parsed want;
  memset(&want, 0, sizeof want);
  push(&want, (ev){'a', 1, TU_MiB, s1, 0, 0});
  push(&want, (ev){'a', 2, 2 * TU_MiB, s1, 0, 0});
  push(&want, (ev){'n', 1, 0, s2, 0, 0});
  push(&want, (ev){'f', 1, 0, 0, 0, 0});
  push(&want, (ev){'f', 2, 0, s3, 0, 1});
  assert_same_events(&p, &want);

  tu_ctx_done(rerecord(&p, path2));
  tu_ctx_done(ctx);
  free(p.e);
  free(want.e);
  replay_bin_accepts(path);
  unlink(path);
  unlink(path2);
}

/* gpumem-replay makes the 'n' lines' calls: with the simulated device behind the host, a block noted
 * on another stream is not reused by its own stream's next allocation (two blocks' worth held, and
 * the stream-order floor says so too); without the note line it is (one block's worth). */
static void test_replay_notes(void **state) {
  (void)state;
#ifdef GPUMEM_REPLAY_BIN
  char path[512], out[8192], cmd[1400];
  tmp_path(path, sizeof path, "replaynote");
  static const char *const traces[2] = {
      "a 1 67108864 1\nn 1 2\nf 1\na 2 67108864 1\nf 2\n", /* noted on stream 2 */
      "a 1 67108864 1\nf 1\na 2 67108864 1\nf 2\n",         /* not noted */
  };
  double ratio[2] = {0, 0}, floor[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(traces[k], f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "GPUMEM_LOG=off '%s' --json --sim-behind 8 '%s' 2>&1", GPUMEM_REPLAY_BIN, path);
    FILE *pf = popen(cmd, "r");
    assert_non_null(pf);
    size_t n = fread(out, 1, sizeof out - 1, pf);
    out[n] = '\0';
    assert_int_equal(pclose(pf), 0);
    const char *r = strstr(out, "\"ratio\": "), *fl = strstr(out, "\"floor_ratio\": ");
    if (r == NULL || fl == NULL) fail_msg("no ratio or floor in:\n%s", out);
    ratio[k] = strtod(r + 9, NULL);
    floor[k] = strtod(fl + 15, NULL);
    if (k == 0 && strstr(out, "\"notes\": 1") == NULL) fail_msg("the note is not counted:\n%s", out);
  }
  if (!(ratio[0] > 1.9 && ratio[1] < 1.1 && floor[0] > 1.9 && floor[1] < 1.1))
    fail_msg("noted: ratio %.3f floor %.3f; not noted: ratio %.3f floor %.3f", ratio[0], floor[0], ratio[1],
             floor[1]);
  unlink(path);
#else
  skip();
#endif
}

/* ---------------------------------------------------------------------- */
/* fork: the trace is the parent's                                         */

static gpumem_context *g_fork_ctx;

/* A child that never calls the library and ends with exit(): stdio and atexit handlers run. */
static int child_exit_only(void *arg) {
  (void)arg;
  exit(0);
}

/* A child that calls the inherited context: refused, and nothing reaches the parent's trace. */
static int child_calls(void *arg) {
  (void)arg;
  void *p = NULL;
  TU_CHECK_STATUS(gpumem_alloc(g_fork_ctx, 0, 256, NULL, &p), GPUMEM_ERR_NOT_SUPPORTED);
  TU_CHECK_STATUS(gpumem_trace_start(g_fork_ctx, "/tmp/gpumem_never.txt"), GPUMEM_ERR_NOT_SUPPORTED);
  TU_CHECK_STATUS(gpumem_trace_stop(g_fork_ctx), GPUMEM_ERR_NOT_SUPPORTED);
  exit(0);
}

static void test_fork_child_exit(void **state) {
  (void)state;
  char path[512];
  tmp_path(path, sizeof path, "fork");
  gpumem_context *ctx = tu_ctx_new(NULL);
  g_fork_ctx = ctx;
  assert_status(gpumem_trace_start(ctx, path), GPUMEM_OK);
  void *a, *b, *c;
  assert_status(gpumem_alloc(ctx, 0, 1000, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 2000, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  /* the lines so far are buffered (far below the buffer's size) when the children are made */
  assert_int_equal(tu_run_in_child(child_exit_only, NULL), 0);
  assert_int_equal(tu_run_in_child(child_calls, NULL), 0);
  assert_status(gpumem_alloc(ctx, 0, 3000, NULL, &c), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  assert_status(gpumem_trace_stop(ctx), GPUMEM_OK);
  parsed p = parse(path);
  assert_int_equal(p.nheader, 1);
  assert_true(p.end);
  check_consistent(&p);
  parsed want;
  memset(&want, 0, sizeof want);
  push(&want, (ev){'a', 1, 1000, 0, 0, 0});
  push(&want, (ev){'a', 2, 2000, 0, 0, 0});
  push(&want, (ev){'f', 1, 0, 0, 0, 0});
  push(&want, (ev){'a', 3, 3000, 0, 0, 0});
  push(&want, (ev){'f', 2, 0, 0, 0, 0});
  push(&want, (ev){'f', 3, 0, 0, 0, 0});
  assert_same_events(&p, &want);
  free(p.e);
  free(want.e);
  replay_bin_accepts(path);
  tu_ctx_done(ctx);
  unlink(path);
}

/* A process that exits with its trace still open (the framework entry points' context is never
 * destroyed): what is buffered reaches the file. */
static char g_exit_path[512];
static int child_traces_then_exits(void *arg) {
  (void)arg;
  gpumem_context *ctx = NULL;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim"; /* (a forked child cannot use CUDA once the parent did; the trace is the same) */
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  TU_CHECK_STATUS(gpumem_create(&cfg, &ctx), GPUMEM_OK);
  TU_CHECK_STATUS(gpumem_trace_start(ctx, g_exit_path), GPUMEM_OK);
  void *p = NULL;
  TU_CHECK_STATUS(gpumem_alloc(ctx, 0, 4096, NULL, &p), GPUMEM_OK);
  TU_CHECK_STATUS(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  exit(0);
}

static void test_exit_flushes(void **state) {
  (void)state;
  tmp_path(g_exit_path, sizeof g_exit_path, "exit");
  assert_int_equal(tu_run_in_child(child_traces_then_exits, NULL), 0);
  parsed p = parse(g_exit_path);
  assert_int_equal(p.nheader, 1);
  check_consistent(&p);
  assert_int_equal(p.n, 2);
  free(p.e);
  unlink(g_exit_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_round_trip), TU_TEST(test_env_file), TU_TEST(test_api_errors),
      TU_TEST(test_threads),    TU_TEST(test_reset_and_devices), TU_TEST(test_fork_child_exit),
      TU_TEST(test_exit_flushes), TU_TEST(test_replay_strict), TU_TEST(test_record_stream_lines),
      TU_TEST(test_replay_notes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
