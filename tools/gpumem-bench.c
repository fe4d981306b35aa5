/*
 * gpumem-bench: libgpumem against the backend's own allocators, in one run.
 *
 *   gpumem-bench [--backend NAME] [--device N] [--repeat N] [--quick] [--json]
 *                [--trace FILE] [--no-trace] [--only NAME[,NAME...]]
 *                [--patterns pair,random,threads,trace]
 *
 * Patterns (every measurement repeated --repeat times, the median printed):
 *   pair SIZE       alloc+free pairs at 512 B, 64 KiB, 2 MiB, 64 MiB, 1 GiB (ns per pair)
 *   random          RMM-style random live set: up to 1000 live blocks, sizes
 *                   256 B .. 4 MiB log-uniform, random frees (ns per op; one
 *                   untimed pass per allocator first)
 *   threads T       T = 1, 4, 16 threads doing 64 KiB pairs, each on a stream of
 *                   its own (aggregate ns per pair = wall / total pairs)
 *   trace           replay of a trace (ns per event), streams as in gpumem-replay; a trace's
 *                   record_stream lines ('n ID STREAM') are libgpumem's gpumem_record_stream
 *                   calls, which the other allocators' columns skip (they free at the free)
 *
 * Allocators: "libgpumem" always; on sim also "sim-raw" (the sim backend's
 * malloc/free vtable calls, i.e. what libgpumem saves you from); on cuda
 * "cudaMalloc", "cudaMallocAsync" (own pool, release threshold UINT64_MAX),
 * and "torch" (PyTorch's caching allocator) when built with PyTorch.
 * Each timed loop ends with the allocator's device synchronisation (inside
 * the timed region). Blocks are never touched: this measures the allocator.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "gpumem.h"
#include "gpumem/backend.h"
#include "tools_common.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)
#define MAX_ALLOCATORS 6
#define MAX_THREADS 16

/* ---- allocators ------------------------------------------------------------ */

static int g_device;

typedef struct lib_self {
  gpumem_context *ctx;
} lib_self;

static int lib_alloc(void *self, size_t size, gpumem_stream s, void **p) {
  return gpumem_alloc(((lib_self *)self)->ctx, g_device, size, s, p) != GPUMEM_OK;
}
static int lib_free(void *self, void *p, size_t size, gpumem_stream s) {
  (void)size;
  return gpumem_free(((lib_self *)self)->ctx, p, s) != GPUMEM_OK;
}
static int lib_note(void *self, void *p, gpumem_stream s) {
  return gpumem_record_stream(((lib_self *)self)->ctx, p, s) != GPUMEM_OK;
}
static const char *g_backend_name = "sim";
static void lib_sync(void *self) {
  (void)self;
  tools_device_sync(g_backend_name, g_device);
}
static void lib_trim(void *self) {
  lib_sync(self);
  gpumem_trim(((lib_self *)self)->ctx, GPUMEM_ALL_DEVICES, 0, NULL);
}

/* the sim backend's vtable, called directly */
static gpumem_backend g_sim_be;
static int raw_alloc(void *self, size_t size, gpumem_stream s, void **p) {
  (void)self;
  (void)s;
  return g_sim_be.malloc(&g_sim_be, g_device, size, p) != 0;
}
static int raw_free(void *self, void *p, size_t size, gpumem_stream s) {
  (void)self;
  (void)size;
  (void)s;
  return g_sim_be.free(&g_sim_be, g_device, p) != 0;
}

/* ---- options, results -------------------------------------------------------- */

typedef struct options {
  const char *backend;
  int repeat;
  int quick;
  int json;
  const char *trace;
  const char *only;
  const char *patterns; /* --patterns: pair,random,threads,trace (default all) */
  const char *json_out;
} options;

typedef struct cell {
  int ok;
  double median;
  double runs[64];
} cell;

typedef struct row {
  char pattern[300];
  const char *unit;
  size_t iterations;
  cell cells[MAX_ALLOCATORS];
} row;

static bench_allocator g_alloc[MAX_ALLOCATORS];
static int g_nalloc;

/* ---- patterns ------------------------------------------------------------------ */

/* returns ns per pair, or -1 on failure */
static double run_pairs(const bench_allocator *a, size_t size, size_t iters, gpumem_stream s) {
  void *p;
  if (a->alloc(a->self, size, s, &p) || a->free(a->self, p, size, s)) return -1; /* warm-up */
  if (a->sync) a->sync(a->self);
  uint64_t t0 = tools_now_ns();
  for (size_t i = 0; i < iters; i++) {
    if (a->alloc(a->self, size, s, &p)) return -1;
    if (a->free(a->self, p, size, s)) return -1;
  }
  if (a->sync) a->sync(a->self);
  return (double)(tools_now_ns() - t0) / (double)iters;
}

static tools_rand_op *g_rops;
static size_t g_nrops;
#define RANDOM_MAX_LIVE TOOLS_RANDOM_MAX_LIVE

static int make_random_ops(size_t nops) {
  g_rops = tools_random_ops(nops);
  g_nrops = nops;
  return g_rops != NULL ? 0 : -1;
}

static double run_random(const bench_allocator *a) {
  void *ptrs[RANDOM_MAX_LIVE];
  size_t sizes[RANDOM_MAX_LIVE];
  size_t live = 0;
  int failed = 0;
  uint64_t t0 = tools_now_ns();
  for (size_t i = 0; i < g_nrops; i++) {
    const tools_rand_op *op = &g_rops[i];
    if (op->size) {
      if (a->alloc(a->self, op->size, NULL, &ptrs[live])) {
        failed = 1;
        break;
      }
      sizes[live++] = op->size;
    } else {
      size_t k = op->index;
      if (a->free(a->self, ptrs[k], sizes[k], NULL)) {
        failed = 1;
        break;
      }
      ptrs[k] = ptrs[--live];
      sizes[k] = sizes[live];
    }
  }
  if (a->sync) a->sync(a->self);
  uint64_t t1 = tools_now_ns();
  while (live) {
    live--;
    a->free(a->self, ptrs[live], sizes[live], NULL);
  }
  if (a->sync) a->sync(a->self);
  return failed ? -1 : (double)(t1 - t0) / (double)g_nrops;
}

typedef struct thread_arg {
  const bench_allocator *a;
  gpumem_stream stream;
  size_t pairs;
  pthread_barrier_t *ready, *go;
  int failed;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *t = p;
  const bench_allocator *a = t->a;
  void *ptr;
  if (a->thread_init) a->thread_init(a->self);
  if (a->alloc(a->self, 64 * KiB, t->stream, &ptr) || a->free(a->self, ptr, 64 * KiB, t->stream)) t->failed = 1;
  pthread_barrier_wait(t->ready);
  pthread_barrier_wait(t->go);
  for (size_t i = 0; i < t->pairs && !t->failed; i++) {
    if (a->alloc(a->self, 64 * KiB, t->stream, &ptr) || a->free(a->self, ptr, 64 * KiB, t->stream)) t->failed = 1;
  }
  return NULL;
}

static gpumem_stream g_thread_streams[MAX_THREADS];

/* The clock starts before any thread can begin its timed pairs (they are held
 * at `go` until the main thread has read it) and stops after the last one
 * joined: wake-up latency counts against the allocator, never in its favour. */
static double run_threads(const bench_allocator *a, int nthreads, size_t pairs_per_thread) {
  pthread_t th[MAX_THREADS];
  thread_arg args[MAX_THREADS];
  pthread_barrier_t ready, go;
  pthread_barrier_init(&ready, NULL, (unsigned)nthreads + 1);
  pthread_barrier_init(&go, NULL, (unsigned)nthreads + 1);
  int created = 0;
  for (int i = 0; i < nthreads; i++) {
    args[i] = (thread_arg){a, g_thread_streams[i], pairs_per_thread, &ready, &go, 0};
    if (pthread_create(&th[i], NULL, thread_main, &args[i]) != 0) break;
    created++;
  }
  for (int i = created; i < nthreads; i++) { /* stand in for threads that could not be created */
    args[i].failed = 1;
    pthread_barrier_wait(&ready);
  }
  pthread_barrier_wait(&ready);
  uint64_t t0 = tools_now_ns();
  for (int i = created; i < nthreads; i++) pthread_barrier_wait(&go);
  pthread_barrier_wait(&go);
  for (int i = 0; i < created; i++) pthread_join(th[i], NULL);
  if (a->sync) a->sync(a->self);
  uint64_t t1 = tools_now_ns();
  pthread_barrier_destroy(&ready);
  pthread_barrier_destroy(&go);
  for (int i = 0; i < nthreads; i++)
    if (args[i].failed) return -1;
  return (double)(t1 - t0) / (double)((size_t)nthreads * pairs_per_thread);
}

static tools_trace g_trace;
static int g_have_trace;
static void **g_trace_ptrs;
static gpumem_stream *g_trace_streams;
static size_t g_trace_nstreams_made;
static gpumem_stream *g_trace_made;

static double run_trace(const bench_allocator *a) {
  const tools_event *ev = g_trace.events;
  size_t n = g_trace.num_events, i;
  int failed = 0;
  for (size_t k = 0; k < g_trace.num_allocs; k++) g_trace_ptrs[k] = NULL;
  uint64_t t0 = tools_now_ns();
  for (i = 0; i < n; i++) {
    const tools_event *e = &ev[i];
    if (e->kind == TOOLS_EV_ALLOC) {
      if (e->size == 0) continue; /* not every allocator accepts size 0 */
      if (a->alloc(a->self, (size_t)e->size, g_trace_streams[e->stream], &g_trace_ptrs[e->slot])) {
        failed = 1;
        break;
      }
    } else if (e->kind == TOOLS_EV_NOTE) {
      if (a->note != NULL && g_trace_ptrs[e->slot] &&
          a->note(a->self, g_trace_ptrs[e->slot], g_trace_streams[e->stream])) {
        failed = 1;
        break;
      }
    } else if (g_trace_ptrs[e->slot]) {
      if (a->free(a->self, g_trace_ptrs[e->slot], 0, g_trace_streams[e->stream])) {
        failed = 1;
        break;
      }
      g_trace_ptrs[e->slot] = NULL;
    }
  }
  if (a->sync) a->sync(a->self);
  uint64_t t1 = tools_now_ns();
  /* free what is still live (untimed) */
  for (size_t k = 0; k < n; k++) {
    const tools_event *e = &ev[k];
    if (e->kind == TOOLS_EV_ALLOC && g_trace_ptrs[e->slot]) {
      a->free(a->self, g_trace_ptrs[e->slot], 0, g_trace_streams[e->stream]);
      g_trace_ptrs[e->slot] = NULL;
    }
  }
  if (a->sync) a->sync(a->self);
  return failed ? -1 : (double)(t1 - t0) / (double)n;
}

/* ---- driver ---------------------------------------------------------------------- */

enum kind { K_PAIR, K_RANDOM, K_THREADS, K_TRACE };

typedef struct pattern {
  enum kind kind;
  size_t size;      /* K_PAIR */
  int threads;      /* K_THREADS */
  size_t iters;     /* pairs, ops, pairs per thread */
} pattern;

static void measure(const options *o, const pattern *p, row *r) {
  for (int a = 0; a < g_nalloc; a++) r->cells[a].ok = 1;
  if (p->kind == K_RANDOM) {
    /* one untimed pass per allocator first, as the pairs' warm-up pair: the timed runs measure the
     * steady state, not the first growth of each allocator's pool (which took 270-550 ns/op for
     * libgpumem and 770-840 for PyTorch's allocator on the H200, runs 25-27 of GPU-TESTING.md) */
    for (int a = 0; a < g_nalloc; a++)
      if (run_random(&g_alloc[a]) < 0) r->cells[a].ok = 0;
  }
  for (int rep = 0; rep < o->repeat; rep++) {
    for (int a = 0; a < g_nalloc; a++) { /* interleaved, so drift hits every allocator alike */
      if (!r->cells[a].ok) continue;
      double v = -1;
      switch (p->kind) {
      case K_PAIR: v = run_pairs(&g_alloc[a], p->size, p->iters, NULL); break;
      case K_RANDOM: v = run_random(&g_alloc[a]); break;
      case K_THREADS: v = run_threads(&g_alloc[a], p->threads, p->iters); break;
      case K_TRACE: v = run_trace(&g_alloc[a]); break;
      }
      if (v < 0) r->cells[a].ok = 0;
      else r->cells[a].runs[rep] = v;
    }
  }
  for (int a = 0; a < g_nalloc; a++) {
    if (r->cells[a].ok) r->cells[a].median = tools_median(r->cells[a].runs, (size_t)o->repeat);
    if (g_alloc[a].trim) g_alloc[a].trim(g_alloc[a].self);
  }
}

static const char *size_label(size_t s, char *buf, size_t n) {
  if (s >= GiB && s % GiB == 0) snprintf(buf, n, "%zu GiB", s / GiB);
  else if (s >= MiB && s % MiB == 0) snprintf(buf, n, "%zu MiB", s / MiB);
  else if (s >= KiB && s % KiB == 0) snprintf(buf, n, "%zu KiB", s / KiB);
  else snprintf(buf, n, "%zu B", s);
  return buf;
}

static int in_list(const char *list, const char *name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    if (!c) break;
    p = c + 1;
  }
  return 0;
}

static int wanted(const options *o, const char *name) { return in_list(o->only, name); }

static void usage(FILE *f) {
  fprintf(f, "usage: gpumem-bench [--backend sim|cuda|hip|auto] [--device N] [--repeat N] [--quick|--smoke] [--json]\n"
             "                    [--json-out FILE] [--trace FILE | --no-trace] [--only ALLOCATOR[,ALLOCATOR...]]\n"
             "                    [--patterns pair,random,threads,trace]\n"
             "  --json: JSON instead of the table; --json-out FILE: the table, and JSON into FILE\n"
             "  allocators: libgpumem, sim-raw (sim), cudaMalloc, cudaMallocAsync, torch (cuda builds)\n");
}

int main(int argc, char **argv) {
  options o = {.backend = "sim", .repeat = 7};
  int repeat_set = 0, no_trace = 0;
#ifdef GPUMEM_BENCH_DEFAULT_TRACE
  o.trace = GPUMEM_BENCH_DEFAULT_TRACE;
#endif
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--backend") && i + 1 < argc) o.backend = argv[++i];
    else if (!strcmp(a, "--device") && i + 1 < argc) g_device = atoi(argv[++i]);
    else if (!strcmp(a, "--repeat") && i + 1 < argc) {
      o.repeat = atoi(argv[++i]);
      repeat_set = 1;
    } else if (!strcmp(a, "--quick")) o.quick = 1;
    else if (!strcmp(a, "--smoke")) o.quick = 2; /* tests: 1/100 of the iterations, 1 run */
    else if (!strcmp(a, "--json")) o.json = 1;
    else if (!strcmp(a, "--json-out") && i + 1 < argc) o.json_out = argv[++i];
    else if (!strcmp(a, "--trace") && i + 1 < argc) o.trace = argv[++i];
    else if (!strcmp(a, "--no-trace")) no_trace = 1;
    else if (!strcmp(a, "--only") && i + 1 < argc) o.only = argv[++i];
    else if (!strcmp(a, "--patterns") && i + 1 < argc) o.patterns = argv[++i];
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "gpumem-bench: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (no_trace) o.trace = NULL;
  if (o.quick && !repeat_set) o.repeat = o.quick == 2 ? 1 : 3;
  if (o.repeat < 1 || o.repeat > 64) {
    fprintf(stderr, "gpumem-bench: --repeat must be 1..64\n");
    return 2;
  }
  if (!strcmp(o.backend, "sim") || !strcmp(o.backend, "auto")) tools_default_sim_devices("1x141GiB");

  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = o.backend;
  lib_self lib = {0};
  gpumem_status st = gpumem_create(&cfg, &lib.ctx);
  if (st != GPUMEM_OK) {
    fprintf(stderr, "gpumem-bench: gpumem_create(%s): %s\n", o.backend, gpumem_status_name(st));
    return 1;
  }
  g_backend_name = gpumem_backend_name(lib.ctx);
  int is_sim = !strcmp(g_backend_name, "sim");
  if (wanted(&o, "libgpumem"))
    g_alloc[g_nalloc++] = (bench_allocator){"libgpumem", &lib, lib_alloc, lib_free, lib_sync, lib_trim, NULL, lib_note};
  if (is_sim && wanted(&o, "sim-raw")) {
    const gpumem_backend *be = gpumem_builtin_backend("sim");
    if (be) {
      /* the sim state is process-wide and already set up by the context above */
      g_sim_be = *be;
      g_alloc[g_nalloc++] = (bench_allocator){"sim-raw", NULL, raw_alloc, raw_free, NULL, NULL, NULL, NULL};
    }
  }
  char err[256] = "";
#ifdef GPUMEM_HAVE_CUDA
  int cuda_setup = 0;
  if (!strcmp(g_backend_name, "cuda")) {
    bench_allocator cm, ca;
    if (bench_cuda_setup(g_device, &cm, &ca, err, sizeof err) == 0) {
      cuda_setup = 1;
      if (wanted(&o, "cudaMalloc")) g_alloc[g_nalloc++] = cm;
      if (wanted(&o, "cudaMallocAsync")) g_alloc[g_nalloc++] = ca;
    } else {
      fprintf(stderr, "gpumem-bench: %s (CUDA allocators skipped)\n", err);
    }
#ifdef GPUMEM_BENCH_HAVE_TORCH
    bench_allocator ta;
    if (wanted(&o, "torch")) {
      if (bench_torch_setup(g_device, &ta, err, sizeof err) == 0) g_alloc[g_nalloc++] = ta;
      else fprintf(stderr, "gpumem-bench: %s (torch skipped)\n", err);
    }
#endif
  }
#endif
  if (g_nalloc == 0) {
    fprintf(stderr, "gpumem-bench: no allocator selected\n");
    gpumem_destroy(lib.ctx, GPUMEM_DESTROY_FORCE);
    return 2;
  }

  /* streams: one per thread; the trace's streams */
  int all_null = 0;
  if (tools_streams_create(g_backend_name, g_device, MAX_THREADS, 0, g_thread_streams, &all_null, err, sizeof err)) {
    fprintf(stderr, "gpumem-bench: %s\n", err);
    return 1;
  }
  if (o.trace) {
    if (tools_trace_load(o.trace, &g_trace, err, sizeof err) != 0) {
      fprintf(stderr, "gpumem-bench: %s (trace pattern skipped)\n", err);
    } else {
      g_trace_ptrs = calloc(g_trace.num_allocs + 1, sizeof *g_trace_ptrs);
      g_trace_streams = calloc(g_trace.num_streams + 1, sizeof *g_trace_streams);
      g_trace_made = calloc(g_trace.num_streams + 1, sizeof *g_trace_made);
      if (!g_trace_ptrs || !g_trace_streams || !g_trace_made) return 1;
      size_t def = g_trace.num_streams;
      for (size_t k = 0; k < g_trace.num_streams; k++)
        if (g_trace.stream_values[k] == 0) def = k;
      g_trace_nstreams_made = g_trace.num_streams - (def < g_trace.num_streams) + 1;
      int an = 0;
      if (tools_streams_create(g_backend_name, g_device, g_trace_nstreams_made, 1, g_trace_made, &an, err, sizeof err)) {
        fprintf(stderr, "gpumem-bench: %s\n", err);
        return 1;
      }
      for (size_t k = 0, j = 1; k < g_trace.num_streams; k++) g_trace_streams[k] = k == def ? NULL : g_trace_made[j++];
      g_have_trace = 1;
    }
  }

  size_t div = o.quick == 2 ? 100 : o.quick ? 10 : 1;
  pattern pats[16];
  int np = 0;
  const size_t sizes[] = {512, 64 * KiB, 2 * MiB, 64 * MiB, GiB};
  const size_t size_iters[] = {20000, 20000, 20000, 2000, 200};
  if (in_list(o.patterns, "pair"))
    for (int i = 0; i < 5; i++) pats[np++] = (pattern){K_PAIR, sizes[i], 0, size_iters[i] / div};
  if (in_list(o.patterns, "random")) pats[np++] = (pattern){K_RANDOM, 0, 0, 50000 / div};
  const int thr[] = {1, 4, 16};
  if (in_list(o.patterns, "threads"))
    for (int i = 0; i < 3; i++) pats[np++] = (pattern){K_THREADS, 64 * KiB, thr[i], 20000 / div};
  if (g_have_trace && in_list(o.patterns, "trace")) pats[np++] = (pattern){K_TRACE, 0, 0, g_trace.num_events};
  if (make_random_ops(50000 / div) != 0) return 1;

  row rows[16];
  memset(rows, 0, sizeof rows);
  int progress = !o.json && isatty(fileno(stderr));
  for (int i = 0; i < np; i++) {
    row *r = &rows[i];
    char sb[32];
    switch (pats[i].kind) {
    case K_PAIR:
      snprintf(r->pattern, sizeof r->pattern, "pair %s", size_label(pats[i].size, sb, sizeof sb));
      r->unit = "ns/pair";
      break;
    case K_RANDOM:
      snprintf(r->pattern, sizeof r->pattern, "random live<=%d", RANDOM_MAX_LIVE);
      r->unit = "ns/op";
      break;
    case K_THREADS:
      snprintf(r->pattern, sizeof r->pattern, "threads %d x 64 KiB", pats[i].threads);
      r->unit = "ns/pair";
      break;
    case K_TRACE: {
      const char *b = strrchr(o.trace, '/');
      snprintf(r->pattern, sizeof r->pattern, "trace %s", b ? b + 1 : o.trace);
      r->unit = "ns/event";
      break;
    }
    }
    r->iterations = pats[i].iters;
    if (progress) {
      fprintf(stderr, "  %s ...\r", r->pattern);
      fflush(stderr);
    }
    measure(&o, &pats[i], r);
  }

  FILE *jf = o.json ? stdout : NULL;
  if (o.json_out && !(jf = fopen(o.json_out, "w"))) {
    perror(o.json_out);
    jf = NULL;
  }
  const char *label = is_sim ? "sim: CPU-only figures (no GPU; the sim backend's costs, not a device's)"
                             : g_backend_name;
  if (jf) {
    fprintf(jf, "{\n  \"tool\": \"gpumem-bench\",\n  \"backend\": ");
    tools_json_string(jf, g_backend_name);
    fprintf(jf, ",\n  \"label\": ");
    tools_json_string(jf, label);
    fprintf(jf, ",\n  \"device\": %d,\n  \"repeat\": %d,\n  \"quick\": %s,\n  \"allocators\": [", g_device, o.repeat,
           o.quick ? "true" : "false");
    for (int a = 0; a < g_nalloc; a++) fprintf(jf, "%s\"%s\"", a ? ", " : "", g_alloc[a].name);
    fprintf(jf, "],\n  \"rows\": [");
    for (int i = 0; i < np; i++) {
      fprintf(jf, "%s\n    {\"pattern\": \"%s\", \"unit\": \"%s\", \"iterations\": %zu, \"results\": {", i ? "," : "",
             rows[i].pattern, rows[i].unit, rows[i].iterations);
      for (int a = 0; a < g_nalloc; a++) {
        const cell *c = &rows[i].cells[a];
        fprintf(jf, "%s\"%s\": ", a ? ", " : "", g_alloc[a].name);
        if (!c->ok) {
          fprintf(jf, "null");
          continue;
        }
        fprintf(jf, "{\"median\": %.2f, \"runs\": [", c->median);
        for (int k = 0; k < o.repeat; k++) fprintf(jf, "%s%.2f", k ? ", " : "", c->runs[k]);
        fprintf(jf, "]}");
      }
      fprintf(jf, "}}");
    }
    fprintf(jf, "\n  ]\n}\n");
  }
  if (!o.json) {
    if (progress) fprintf(stderr, "%40s\r", "");
    printf("gpumem-bench: backend %s, device %d; median of %d runs%s\n", label, g_device, o.repeat,
           o.quick == 2 ? " (--smoke: 1/100 of the iterations)" : o.quick ? " (--quick: 1/10 of the iterations)" : "");
    if (all_null) printf("note: streams are NULL for this backend in the tools\n");
    printf("%-24s %-9s", "pattern", "unit");
    for (int a = 0; a < g_nalloc; a++) printf(" %15s", g_alloc[a].name);
    printf("\n");
    for (int i = 0; i < np; i++) {
      printf("%-24s %-9s", rows[i].pattern, rows[i].unit);
      for (int a = 0; a < g_nalloc; a++) {
        if (rows[i].cells[a].ok) printf(" %15.1f", rows[i].cells[a].median);
        else printf(" %15s", "fail");
      }
      printf("\n");
    }
  }

  if (jf && jf != stdout) fclose(jf);
  if (g_have_trace) {
    tools_streams_destroy(g_backend_name, g_device, g_trace_nstreams_made, g_trace_made);
    tools_trace_free(&g_trace);
  }
  tools_streams_destroy(g_backend_name, g_device, MAX_THREADS, g_thread_streams);
#ifdef GPUMEM_HAVE_CUDA
  if (cuda_setup) bench_cuda_teardown();
#endif
  free(g_rops);
  free(g_trace_ptrs);
  free(g_trace_streams);
  free(g_trace_made);
  gpumem_destroy(lib.ctx, GPUMEM_DESTROY_FORCE);
  return 0;
}
