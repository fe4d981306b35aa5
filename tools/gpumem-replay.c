/*
 * gpumem-replay: replay allocation traces (shared/traces/README.md format)
 * through libgpumem and report fragmentation and speed.
 *
 *   gpumem-replay [--backend NAME] [--device N] [--repeat N] [--sample-used] [--json] TRACE...
 *
 * For each trace: events, allocs, peak live bytes (largest sum of live
 * requested sizes), peak reserved bytes (gpumem_stats.reserved_peak), their
 * ratio, and ns per event (wall time of the replay loop / events; the median
 * over --repeat runs). Each distinct STREAM value gets a stream of its own
 * (0 = the default stream). IDs never freed stay live until the context is
 * destroyed with GPUMEM_DESTROY_FORCE.
 *
 * --sample-used: one extra (untimed) run that reads the backend's used
 * memory (gpumem_sim_used_bytes on sim; elsewhere total - free from the
 * backend's mem_get_info, i.e. cudaMemGetInfo, minus the used memory before
 * the run) after every allocation that made the backend allocate (a malloc
 * or vm_create call, seen by the wrapper below: used memory grows only
 * then, so the peak is the same as when sampling after every allocation),
 * and reports its peak. --sample-every samples after every allocation.
 * (Until 2026-11-30 it called gpumem_device_get_info after every allocation:
 * on CUDA that is cudaGetDeviceProperties and more per call, which kept the
 * bert_dyn and gpt2_gen replays on the H200 from finishing in 90 s.)
 *
 * --sim-lag N / --sim-behind N (sim): the simulated device runs behind the
 * host, and each trace also reports its stream-order floor: the peak of an
 * ideal allocator under the same stream-order rules (a stream reuses its own
 * frees at once, others' once the device completed them) with memory that
 * divides freely (stream_order_floor below). peak_reserved over the floor
 * is what placement costs; the floor over peak_live is what the device
 * running behind costs any allocator that keeps the contract.
 *
 * The backend is wrapped (gpumem_builtin_backend, a copy whose virtual-memory
 * methods count their calls and the time spent in them), so every run also
 * reports the virtual-memory calls of expandable segments: vm_map (on CUDA
 * one cuMemMap and one cuMemSetAccess each), vm_unmap, vm_create, vm_destroy,
 * vm_reserve, vm_release, and the wall time inside them (of the last timed
 * run). --no-vm-count uses the backend unwrapped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "gpumem/backend.h"
#include "gpumem/sim.h"
#include "tools_common.h"

typedef struct options {
  const char *backend;
  int device;
  int repeat;
  int sample_used;
  int sample_every;
  size_t sim_lag;
  size_t sim_behind;
  int warm;          /* --warm N: untimed passes in the same context before the timed one */
  int json;
  int no_vm_count;
  const char *json_out;
} options;

/* Virtual-memory calls of one run, counted by the wrapper below. */
enum { VMC_MAP, VMC_UNMAP, VMC_CREATE, VMC_DESTROY, VMC_RESERVE, VMC_RELEASE, VMC_N_ };
static const char *const vmc_name[VMC_N_] = {"map", "unmap", "create", "destroy", "reserve", "release"};
/* Stream-order calls of one run: what makes a multi-stream or lagging workload slow on a GPU. */
enum { SOC_RECORD, SOC_QUERY, SOC_EVSYNC, SOC_STREAMSYNC, SOC_DEVSYNC, SOC_N_ };
static const char *const soc_name[SOC_N_] = {"event_record", "event_query", "event_synchronize",
                                             "stream_synchronize", "device_synchronize"};
typedef struct vm_counts {
  uint64_t calls[VMC_N_];
  uint64_t ns; /* wall time inside the calls */
  uint64_t so[SOC_N_];
  uint64_t meminfo, meminfo_ns; /* mem_get_info calls (the free-fraction check) and the time in them */
} vm_counts;

typedef struct result {
  int ok;
  char error[600];
  double ns_per_event;     /* median */
  double *ns_runs;
  uint64_t reserved_peak;
  uint64_t allocated_peak;
  uint64_t backend_allocs;
  uint64_t num_trims;
  uint64_t used_peak;      /* --sample-used */
  int used_sampled;
  uint64_t used_samples;   /* readings taken */
  int streams_null;        /* backend without stream support in the tools: NULL for all */
  int vm_counted;
  vm_counts vm;            /* of the last timed run */
  uint64_t floor;          /* --sim-lag / --sim-behind: the stream-order floor (0: not computed) */
} result;

/* ---- the counting wrapper ------------------------------------------------ *
 * The replay is single-threaded and uses one context at a time, so plain
 * statics do. The built-in methods ignore their vtable argument but for
 * init, which may clear the annotation methods in the core's copy (which is
 * then the wrapper's copy, as it should be). */
static const gpumem_backend *g_inner;
static gpumem_backend g_wrap;
static vm_counts g_vm;
static uint64_t g_grows; /* malloc and vm_create calls: when used memory may grow */

#define VMC_CALL(kind, expr)                         \
  do {                                               \
    uint64_t t0_ = tools_now_ns();                   \
    int rc_ = (expr);                                \
    g_vm.ns += tools_now_ns() - t0_;                 \
    g_vm.calls[kind]++;                              \
    return rc_;                                      \
  } while (0)

static int w_vm_reserve(gpumem_backend *be, int device, size_t size, void **va) {
  VMC_CALL(VMC_RESERVE, g_inner->vm_reserve(be, device, size, va));
}
static int w_vm_release(gpumem_backend *be, int device, void *va, size_t size) {
  VMC_CALL(VMC_RELEASE, g_inner->vm_release(be, device, va, size));
}
static int w_vm_create(gpumem_backend *be, int device, size_t size, gpumem_phys_handle *h) {
  g_grows++;
  VMC_CALL(VMC_CREATE, g_inner->vm_create(be, device, size, h));
}
static int w_malloc(gpumem_backend *be, int device, size_t size, void **ptr) {
  g_grows++;
  return g_inner->malloc(be, device, size, ptr);
}
static int w_vm_destroy(gpumem_backend *be, int device, gpumem_phys_handle h) {
  VMC_CALL(VMC_DESTROY, g_inner->vm_destroy(be, device, h));
}
static int w_vm_map(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h) {
  VMC_CALL(VMC_MAP, g_inner->vm_map(be, device, va, size, h));
}
static int w_vm_unmap(gpumem_backend *be, int device, void *va, size_t size) {
  VMC_CALL(VMC_UNMAP, g_inner->vm_unmap(be, device, va, size));
}

static int w_event_record(gpumem_backend *be, int device, gpumem_event ev, gpumem_stream stream) {
  g_vm.so[SOC_RECORD]++;
  return g_inner->event_record(be, device, ev, stream);
}
static int w_event_query(gpumem_backend *be, int device, gpumem_event ev, int *complete) {
  g_vm.so[SOC_QUERY]++;
  return g_inner->event_query(be, device, ev, complete);
}
static int w_event_synchronize(gpumem_backend *be, int device, gpumem_event ev) {
  g_vm.so[SOC_EVSYNC]++;
  return g_inner->event_synchronize(be, device, ev);
}
static int w_stream_synchronize(gpumem_backend *be, int device, gpumem_stream stream) {
  g_vm.so[SOC_STREAMSYNC]++;
  return g_inner->stream_synchronize(be, device, stream);
}
static int w_mem_get_info(gpumem_backend *be, int device, uint64_t *free_b, uint64_t *total_b) {
  uint64_t t0 = tools_now_ns();
  int rc = g_inner->mem_get_info(be, device, free_b, total_b);
  g_vm.meminfo_ns += tools_now_ns() - t0;
  g_vm.meminfo++;
  return rc;
}
static int w_device_synchronize(gpumem_backend *be, int device) {
  g_vm.so[SOC_DEVSYNC]++;
  return g_inner->device_synchronize(be, device);
}

/* Wrap the built-in backend `name`; NULL when it is not built in or has no virtual memory. */
static const gpumem_backend *wrap_backend(const char *name) {
  const gpumem_backend *in = gpumem_builtin_backend(name);
  if (in == NULL || in->vm_map == NULL || in->vm_unmap == NULL || in->vm_create == NULL || in->vm_destroy == NULL ||
      in->vm_reserve == NULL || in->vm_release == NULL)
    return NULL;
  g_inner = in;
  g_wrap = *in;
  g_wrap.vm_reserve = w_vm_reserve;
  g_wrap.vm_release = w_vm_release;
  g_wrap.vm_create = w_vm_create;
  g_wrap.vm_destroy = w_vm_destroy;
  g_wrap.vm_map = w_vm_map;
  g_wrap.vm_unmap = w_vm_unmap;
  if (in->event_record) g_wrap.event_record = w_event_record;
  if (in->event_query) g_wrap.event_query = w_event_query;
  if (in->event_synchronize) g_wrap.event_synchronize = w_event_synchronize;
  if (in->stream_synchronize) g_wrap.stream_synchronize = w_stream_synchronize;
  if (in->device_synchronize) g_wrap.device_synchronize = w_device_synchronize;
  g_wrap.malloc = w_malloc;
  g_wrap.mem_get_info = w_mem_get_info;
  return &g_wrap;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gpumem-replay [options] TRACE...\n"
          "  --backend NAME   sim (default), cuda, hip or auto\n"
          "  --device N       device ordinal (default 0)\n"
          "  --repeat N       timed runs per trace; ns/event is their median (default 1)\n"
          "  --sample-used    one more run reading the backend's used memory after each allocation\n"
          "                   that made the backend allocate (its peak)\n"
          "  --sample-every   with --sample-used: read it after every allocation\n"
          "  --sim-lag N      sim: the device completes queued work only every N events (a GPU behind the host)\n"
          "  --sim-behind N   sim: the device completes work N events after it was queued (a GPU a constant\n"
          "                   distance behind the host)\n"
          "                   (with either: the stream-order floor, the least any allocator that keeps the\n"
          "                   stream order could hold with the device that far behind)\n"
          "  --warm N         replay the trace N times untimed in the same context first (a warm pool, as in\n"
          "                   gpumem-bench's trace pattern); figures and vm calls are of the timed pass\n"
          "  --json           JSON output instead of the table\n"
          "  --json-out FILE  the table, and JSON into FILE\n"
          "  --no-vm-count    do not wrap the backend to count its virtual-memory calls\n"
          "Traces: gzip text, 'a ID SIZE STREAM [DEVICE]' / 'f ID [STREAM]' / 'n ID STREAM' (record_stream)\n"
          "lines (reader: %s).\n"
          "On sim, GPUMEM_SIM_DEVICES defaults to 1x141GiB here.\n",
          tools_trace_reader());
}

/* The backend's used memory on the device (sim: what it handed out; else
 * total - free, minus `base`). Built-in backends: their mem_get_info directly
 * (cudaMemGetInfo), not gpumem_device_get_info, which also asks for the
 * device's name, UUID and PCI id (cudaGetDeviceProperties: far too slow to
 * call after every allocation). */
static uint64_t used_now(gpumem_context *ctx, const char *backend, int device, uint64_t base, int *ok) {
  uint64_t used = 0;
  if (!strcmp(backend, "sim")) {
    if (gpumem_sim_used_bytes(device, &used) != GPUMEM_OK) *ok = 0;
    return used;
  }
  uint64_t fr = 0, tot = 0;
  const gpumem_backend *be = gpumem_builtin_backend(backend);
  if (be != NULL && be->mem_get_info != NULL) {
    gpumem_backend copy = *be; /* (the built-in methods do not use their vtable argument) */
    if (be->mem_get_info(&copy, device, &fr, &tot) != 0) {
      *ok = 0;
      return 0;
    }
  } else {
    gpumem_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (gpumem_device_get_info(ctx, device, &info) != GPUMEM_OK) {
      *ok = 0;
      return 0;
    }
    fr = info.free_bytes;
    tot = info.total_bytes;
  }
  used = tot - fr;
  return used > base ? used - base : 0;
}

/* How the simulated device runs behind the host (sim only; 0 = not): --sim-lag completes all queued
 * work every `lag` events, --sim-behind completes work `behind` events after it was queued (the
 * clock counts events over every pass of the run). */
typedef struct sim_model {
  size_t lag, behind;
  uint64_t clock;
} sim_model;

static void sim_before(sim_model *m) {
  if (m->behind != 0) gpumem_sim_set_clock(m->clock);
}

static void sim_after(sim_model *m, size_t i) {
  if (m->lag != 0 && i % m->lag == m->lag - 1) gpumem_sim_complete_all();
  if (m->behind != 0 && ++m->clock > m->behind) gpumem_sim_complete_before(m->clock - m->behind);
}

/* The first event of a pass at which work queued at its event i has completed, as sim_after
 * completes it (i + 1 when the device keeps up). */
static uint64_t sim_done_at(const sim_model *m, size_t i) {
  if (m->lag != 0) return (uint64_t)(i / m->lag) * m->lag + m->lag;
  if (m->behind != 0) return (uint64_t)i + m->behind + 1;
  return (uint64_t)i + 1;
}

/* One event: an allocation into ptrs[slot], a free of it (the slot then NULL), or a note of it on a
 * stream (gpumem_record_stream). */
static gpumem_status replay_event(gpumem_context *ctx, int dev, const tools_event *e, void **ptrs,
                                  gpumem_stream *streams) {
  if (e->kind == TOOLS_EV_ALLOC) return gpumem_alloc(ctx, dev, (size_t)e->size, streams[e->stream], &ptrs[e->slot]);
  if (e->kind == TOOLS_EV_NOTE) return gpumem_record_stream(ctx, ptrs[e->slot], streams[e->stream]);
  gpumem_status st = gpumem_free(ctx, ptrs[e->slot], streams[e->stream]);
  if (st == GPUMEM_OK) ptrs[e->slot] = NULL;
  return st;
}

/* The events in order: each allocation into ptrs[slot], each free of it (its slot then NULL), the
 * simulated device behind the host as m says. Stops at the first failure: *at is its event (n when
 * none failed). */
static gpumem_status replay_events(gpumem_context *ctx, int dev, const tools_event *ev, size_t n, void **ptrs,
                                   gpumem_stream *streams, sim_model *m, size_t *at) {
  gpumem_status st = GPUMEM_OK;
  size_t i;
  for (i = 0; i < n; i++) {
    const tools_event *e = &ev[i];
    sim_before(m);
    st = replay_event(ctx, dev, e, ptrs, streams);
    if (st != GPUMEM_OK) break;
    sim_after(m, i);
  }
  *at = i;
  return st;
}

/* The stream-order floor of a trace replayed with the simulated device behind the host: the peak
 * that an allocator holding to the stream-order contract (DESIGN.md, Allocation) and wasting nothing
 * to block boundaries, alignment or placement would reach. Memory is taken as freely divisible: a
 * free on stream S may serve S's next allocations at once, any stream's once the device completed
 * the work queued before the free (sim_done_at: --sim-lag at the end of the free's window of `lag`
 * events, --sim-behind `behind` events later; a block noted on streams by an 'n' line serves its own
 * stream only then too, as gpumem_record_stream asks), and the floor grows only by what an
 * allocation finds in neither. A stream takes its own newest frees first (their work completes
 * last). Sizes are the requested ones, as in peak_live, over one pass from an empty pool. Without a
 * lag every free completes at once and the floor is peak_live. Returns 0 when out of host memory. */
typedef struct floor_free {
  uint64_t avail;  /* first event at which every stream may take it */
  uint64_t bytes;  /* not yet taken by its own stream */
  uint32_t below;  /* the previous entry of the same stream's stack (UINT32_MAX: none) */
} floor_free;

static uint64_t stream_order_floor(const tools_trace *t, const sim_model *m) {
  size_t n = t->num_events;
  floor_free *q = malloc((n ? n : 1) * sizeof *q);    /* frees in event order: avail never decreases */
  uint32_t *top = malloc((t->num_streams + 1) * sizeof *top); /* each stream's newest entry */
  uint64_t *size = calloc(t->num_allocs + 1, sizeof *size);
  uint8_t *noted = calloc(t->num_allocs + 1, 1); /* noted on a stream (gpumem_record_stream) */
  if (!q || !top || !size || !noted) {
    free(q);
    free(top);
    free(size);
    free(noted);
    return 0;
  }
  for (size_t k = 0; k <= t->num_streams; k++) top[k] = UINT32_MAX;
  size_t head = 0, nq = 0;
  uint64_t ready = 0, floor = 0;
  for (size_t i = 0; i < n; i++) {
    const tools_event *e = &t->events[i];
    for (; head < nq && q[head].avail <= i; head++) { /* completed: every stream's */
      ready += q[head].bytes;
      q[head].bytes = 0;
    }
    if (e->kind == TOOLS_EV_NOTE) {
      noted[e->slot] = 1;
    } else if (e->kind == TOOLS_EV_ALLOC) {
      uint64_t need = e->size;
      size[e->slot] = e->size;
      uint32_t *tp = &top[e->stream];
      while (need > 0 && *tp != UINT32_MAX) {
        floor_free *f = &q[*tp];
        uint64_t take = f->bytes < need ? f->bytes : need;
        f->bytes -= take;
        need -= take;
        if (f->bytes == 0) *tp = f->below;
      }
      uint64_t take = ready < need ? ready : need;
      ready -= take;
      floor += need - take;
    } else {
      uint64_t b = size[e->slot];
      size[e->slot] = 0;
      if (b == 0) continue;
      q[nq].avail = sim_done_at(m, i);
      q[nq].bytes = b;
      q[nq].below = UINT32_MAX;
      if (!noted[e->slot]) { /* a block noted on other streams waits for them, even for its own stream */
        q[nq].below = top[e->stream];
        top[e->stream] = (uint32_t)nq;
      }
      nq++;
    }
  }
  free(q);
  free(top);
  free(size);
  free(noted);
  return floor;
}

/* One replay. Returns 0 or -1 (message in r->error). */
static int replay_once(const options *o, const tools_trace *t, void **ptrs, gpumem_stream *streams,
                       const gpumem_backend *wrapped, int sample, double *ns, result *r) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = o->backend;
  cfg.custom_backend = wrapped;
  memset(&g_vm, 0, sizeof g_vm);
  gpumem_context *ctx = NULL;
  gpumem_status st = gpumem_create(&cfg, &ctx);
  if (st != GPUMEM_OK) {
    snprintf(r->error, sizeof r->error, "gpumem_create(%s): %s", o->backend, gpumem_status_name(st));
    return -1;
  }
  const char *bname = gpumem_backend_name(ctx);
  uint64_t base = 0;
  int used_ok = 1;
  if (sample && strcmp(bname, "sim") != 0) base = used_now(ctx, bname, o->device, 0, &used_ok);
  uint64_t used_peak = 0, samples = 0, grows_seen = UINT64_MAX;
  int dev = o->device;
  /* --sim-lag N / --sim-behind N: the simulated device runs behind the host (sim only) */
  const int is_sim = !strcmp(bname, "sim");
  sim_model m = {is_sim ? o->sim_lag : 0, is_sim ? o->sim_behind : 0, 0};
  if (m.lag != 0 || m.behind != 0) gpumem_sim_set_delayed(1);
  const tools_event *ev = t->events;
  size_t n = t->num_events;
  size_t i;
  /* --warm N: the trace N times first in this context, what it leaves live freed after each pass, so
   * that the timed pass (and its vm calls) start from a pool that holds the trace's memory, as in a
   * training loop's later steps and in gpumem-bench's trace pattern */
  for (int w = 0; w < o->warm && st == GPUMEM_OK; w++) {
    st = replay_events(ctx, dev, ev, n, ptrs, streams, &m, &i);
    for (i = 0; i < n; i++) {
      const tools_event *e = &ev[i];
      if (e->kind == TOOLS_EV_ALLOC && ptrs[e->slot] != NULL) {
        if (st == GPUMEM_OK) st = gpumem_free(ctx, ptrs[e->slot], streams[e->stream]);
        ptrs[e->slot] = NULL;
      }
    }
    if (st != GPUMEM_OK) {
      snprintf(r->error, sizeof r->error, "warm-up pass %d: %s", w + 1, gpumem_status_name(st));
      (void)gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
      return -1;
    }
  }
  if (o->warm > 0) memset(&g_vm, 0, sizeof g_vm);
  uint64_t t0 = tools_now_ns();
  if (!sample) {
    st = replay_events(ctx, dev, ev, n, ptrs, streams, &m, &i);
  } else {
    for (i = 0; i < n; i++) {
      const tools_event *e = &ev[i];
      sim_before(&m);
      st = replay_event(ctx, dev, e, ptrs, streams);
      if (st != GPUMEM_OK) break;
      if (e->kind == TOOLS_EV_ALLOC && (o->sample_every || wrapped == NULL || g_grows != grows_seen)) {
        grows_seen = g_grows;
        uint64_t u = used_now(ctx, bname, dev, base, &used_ok);
        samples++;
        if (u > used_peak) used_peak = u;
      }
      sim_after(&m, i);
    }
  }
  if (m.lag != 0 || m.behind != 0) {
    gpumem_sim_complete_all();
    gpumem_sim_set_delayed(0);
  }
  tools_device_sync(bname, dev);
  uint64_t t1 = tools_now_ns();
  int rc = 0;
  if (st != GPUMEM_OK) {
    static const char *const kinds[] = {"free", "alloc", "record_stream"};
    snprintf(r->error, sizeof r->error, "event %zu (%s of %llu bytes): %s", i, kinds[ev[i].kind],
             (unsigned long long)ev[i].size, gpumem_status_name(st));
    rc = -1;
  }
  gpumem_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (gpumem_get_stats(ctx, dev, &s) == GPUMEM_OK) {
    r->reserved_peak = s.reserved_peak;
    r->allocated_peak = s.allocated_peak;
    r->backend_allocs = s.num_backend_allocs;
    r->num_trims = s.num_trims;
  }
  if (sample) {
    r->used_peak = used_peak;
    r->used_sampled = used_ok;
    r->used_samples = samples;
  }
  *ns = n ? (double)(t1 - t0) / (double)n : 0.0;
  if (!sample) {
    r->vm = g_vm; /* the replay's calls, before destroy gives everything back */
    r->vm_counted = wrapped != NULL;
  }
  st = gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  if (st != GPUMEM_OK && rc == 0) {
    snprintf(r->error, sizeof r->error, "gpumem_destroy(FORCE): %s", gpumem_status_name(st));
    rc = -1;
  }
  return rc;
}

static void replay_trace(const options *o, const tools_trace *t, result *r) {
  memset(r, 0, sizeof *r);
  void **ptrs = calloc(t->num_allocs ? t->num_allocs : 1, sizeof *ptrs);
  gpumem_stream *streams = calloc(t->num_streams ? t->num_streams : 1, sizeof *streams);
  r->ns_runs = calloc((size_t)o->repeat, sizeof *r->ns_runs);
  if (!ptrs || !streams || !r->ns_runs) {
    snprintf(r->error, sizeof r->error, "out of host memory");
    goto out;
  }
  /* stream index with value 0 is the default stream */
  size_t def = t->num_streams;
  for (size_t k = 0; k < t->num_streams; k++)
    if (t->stream_values[k] == 0) def = k;
  /* build streams so that the index of value 0 maps to NULL */
  gpumem_stream *tmp = calloc(t->num_streams + 1, sizeof *tmp);
  if (!tmp) {
    snprintf(r->error, sizeof r->error, "out of host memory");
    goto out;
  }
  /* resolve the backend name first ("auto") with a throw-away context */
  const char *bname = o->backend;
  gpumem_context *probe = NULL;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = o->backend;
  gpumem_status st = gpumem_create(&cfg, &probe);
  if (st != GPUMEM_OK) {
    snprintf(r->error, sizeof r->error, "gpumem_create(%s): %s", o->backend, gpumem_status_name(st));
    free(tmp);
    goto out;
  }
  char bbuf[32];
  snprintf(bbuf, sizeof bbuf, "%s", gpumem_backend_name(probe));
  bname = bbuf;
  size_t nonzero = t->num_streams - (def < t->num_streams);
  char err[256] = "";
  int all_null = 0;
  if (tools_streams_create(bname, o->device, nonzero + 1, 1, tmp, &all_null, err, sizeof err) != 0) {
    snprintf(r->error, sizeof r->error, "%s", err);
    gpumem_destroy(probe, GPUMEM_DESTROY_FORCE);
    free(tmp);
    goto out;
  }
  r->streams_null = all_null;
  for (size_t k = 0, j = 1; k < t->num_streams; k++) streams[k] = (k == def) ? NULL : tmp[j++];
  const gpumem_backend *wrapped = o->no_vm_count ? NULL : wrap_backend(bname);

  int ok = 1;
  for (int rep = 0; rep < o->repeat && ok; rep++)
    if (replay_once(o, t, ptrs, streams, wrapped, 0, &r->ns_runs[rep], r) != 0) ok = 0;
  if (ok && o->sample_used) {
    double ns_sampled;
    result rs = *r;
    if (replay_once(o, t, ptrs, streams, wrapped, 1, &ns_sampled, &rs) != 0) {
      ok = 0;
      memcpy(r->error, rs.error, sizeof r->error);
    } else {
      r->used_peak = rs.used_peak;
      r->used_sampled = rs.used_sampled;
      r->used_samples = rs.used_samples;
    }
  }
  r->ok = ok;
  if (ok) r->ns_per_event = tools_median(r->ns_runs, (size_t)o->repeat);
  if (ok && !strcmp(bname, "sim") && (o->sim_lag != 0 || o->sim_behind != 0)) {
    sim_model m = {o->sim_lag, o->sim_behind, 0};
    r->floor = stream_order_floor(t, &m);
  }
  tools_streams_destroy(bname, o->device, nonzero + 1, tmp);
  gpumem_destroy(probe, GPUMEM_DESTROY_FORCE);
  free(tmp);
out:
  free(ptrs);
  free(streams);
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

int main(int argc, char **argv) {
  options o = {.backend = "sim", .device = 0, .repeat = 1};
  int first = argc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--backend") && i + 1 < argc) o.backend = argv[++i];
    else if (!strcmp(a, "--device") && i + 1 < argc) o.device = atoi(argv[++i]);
    else if (!strcmp(a, "--repeat") && i + 1 < argc) o.repeat = atoi(argv[++i]);
    else if (!strcmp(a, "--sample-used")) o.sample_used = 1;
    else if (!strcmp(a, "--sample-every")) o.sample_every = 1;
    else if (!strcmp(a, "--sim-lag") && i + 1 < argc) o.sim_lag = (size_t)strtoull(argv[++i], NULL, 10);
    else if (!strcmp(a, "--sim-behind") && i + 1 < argc) o.sim_behind = (size_t)strtoull(argv[++i], NULL, 10);
    else if (!strcmp(a, "--warm") && i + 1 < argc) o.warm = atoi(argv[++i]);
    else if (!strcmp(a, "--json")) o.json = 1;
    else if (!strcmp(a, "--no-vm-count")) o.no_vm_count = 1;
    else if (!strcmp(a, "--json-out") && i + 1 < argc) o.json_out = argv[++i];
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--")) {
      first = i + 1;
      break;
    } else if (a[0] == '-') {
      fprintf(stderr, "gpumem-replay: unknown option %s\n", a);
      usage(stderr);
      return 2;
    } else {
      first = i;
      break;
    }
  }
  if (first >= argc || o.repeat < 1 || o.warm < 0) {
    usage(stderr);
    return 2;
  }
  int sim_sized = 0;
  if (!strcmp(o.backend, "sim") || !strcmp(o.backend, "auto")) sim_sized = tools_default_sim_devices("1x141GiB");

  int failures = 0;
  FILE *jf = o.json ? stdout : NULL;
  if (o.json_out && !(jf = fopen(o.json_out, "w"))) {
    perror(o.json_out);
    return 1;
  }
  if (jf)
    fprintf(jf, "{\n  \"tool\": \"gpumem-replay\",\n  \"backend\": \"%s\",\n  \"device\": %d,\n  \"repeat\": %d,\n"
           "  \"sim_devices\": ",
           o.backend, o.device, o.repeat);
  if (jf) {
    tools_json_string(jf, getenv("GPUMEM_SIM_DEVICES"));
    fprintf(jf, ",\n  \"traces\": [");
  }
  if (!o.json) {
    printf("gpumem-replay: backend %s, device %d, %d timed run(s) per trace%s%s\n", o.backend, o.device, o.repeat,
           sim_sized ? ", GPUMEM_SIM_DEVICES=1x141GiB" : "",
           !strcmp(o.backend, "sim") ? " (sim: CPU-only figures)" : "");
    printf("%-22s %9s %8s %15s %15s %7s %9s%s\n", "trace", "events", "allocs", "peak_live", "peak_reserved", "ratio",
           "ns/event", o.sample_used ? "       peak_used  used/live" : "");
  }
  for (int i = first; i < argc; i++) {
    tools_trace t;
    char err[512];
    result r;
    memset(&r, 0, sizeof r);
    int loaded = tools_trace_load(argv[i], &t, err, sizeof err) == 0;
    if (loaded) replay_trace(&o, &t, &r);
    else snprintf(r.error, sizeof r.error, "%s", err);
    if (!r.ok) failures++;
    double ratio = (loaded && t.peak_live) ? (double)r.reserved_peak / (double)t.peak_live : 0.0;
    double uratio = (loaded && t.peak_live) ? (double)r.used_peak / (double)t.peak_live : 0.0;
    if (jf) {
      fprintf(jf, "%s\n    {\"trace\": ", i == first ? "" : ",");
      tools_json_string(jf, argv[i]);
      fprintf(jf, ", \"ok\": %s", r.ok ? "true" : "false");
      if (!r.ok) {
        fprintf(jf, ", \"error\": ");
        tools_json_string(jf, r.error);
      }
      if (loaded) {
        fprintf(jf, ", \"workload\": ");
        tools_json_string(jf, t.workload);
        fprintf(jf, ", \"events\": %zu, \"allocs\": %zu, \"frees\": %zu, \"unmatched_frees\": %zu, \"notes\": %zu"
               ", \"unmatched_notes\": %zu, \"streams\": %zu, \"peak_live_bytes\": %llu",
               t.num_events, t.num_allocs, t.num_frees, t.num_unmatched_frees, t.num_notes, t.num_unmatched_notes,
               t.num_streams, (unsigned long long)t.peak_live);
        if (t.pytorch_max_reserved)
          fprintf(jf, ", \"pytorch_max_reserved\": %llu", (unsigned long long)t.pytorch_max_reserved);
      }
      if (r.ok) {
        fprintf(jf, ", \"peak_reserved_bytes\": %llu, \"ratio\": %.4f, \"allocated_peak\": %llu"
               ", \"backend_allocs\": %llu, \"trims\": %llu, \"ns_per_event\": %.2f, \"ns_per_event_runs\": [",
               (unsigned long long)r.reserved_peak, ratio, (unsigned long long)r.allocated_peak,
               (unsigned long long)r.backend_allocs, (unsigned long long)r.num_trims, r.ns_per_event);
        for (int k = 0; k < o.repeat; k++) fprintf(jf, "%s%.2f", k ? ", " : "", r.ns_runs[k]);
        fprintf(jf, "], \"streams_all_null\": %s", r.streams_null ? "true" : "false");
        if (o.sample_used)
          fprintf(jf, ", \"peak_used_bytes\": %llu, \"used_ratio\": %.4f, \"used_sampled\": %s, \"used_samples\": %llu",
                 (unsigned long long)r.used_peak, uratio, r.used_sampled ? "true" : "false",
                 (unsigned long long)r.used_samples);
        if (r.vm_counted) {
          for (int k = 0; k < VMC_N_; k++)
            fprintf(jf, ", \"vm_%s_calls\": %llu", vmc_name[k], (unsigned long long)r.vm.calls[k]);
          fprintf(jf, ", \"vm_call_ns\": %llu", (unsigned long long)r.vm.ns);
          for (int k = 0; k < SOC_N_; k++)
            fprintf(jf, ", \"%s_calls\": %llu", soc_name[k], (unsigned long long)r.vm.so[k]);
          fprintf(jf, ", \"mem_get_info_calls\": %llu, \"mem_get_info_ns\": %llu", (unsigned long long)r.vm.meminfo,
                  (unsigned long long)r.vm.meminfo_ns);
        }
        if (r.floor != 0 && t.peak_live != 0)
          fprintf(jf, ", \"floor_bytes\": %llu, \"floor_ratio\": %.4f, \"held_over_floor\": %.4f",
                  (unsigned long long)r.floor, (double)r.floor / (double)t.peak_live,
                  (double)r.reserved_peak / (double)r.floor);
      }
      fprintf(jf, "}");
    }
    if (o.json) {
      /* JSON only */
    } else if (r.ok) {
      printf("%-22s %9zu %8zu %15llu %15llu %7.3f %9.1f", base_name(argv[i]), t.num_events, t.num_allocs,
             (unsigned long long)t.peak_live, (unsigned long long)r.reserved_peak, ratio, r.ns_per_event);
      if (o.sample_used) printf(" %15llu %10.3f%s", (unsigned long long)r.used_peak, uratio, r.used_sampled ? "" : " (sampling failed)");
      printf("\n");
      if (r.vm_counted && (r.vm.calls[VMC_MAP] || r.vm.calls[VMC_RESERVE])) {
        printf("  vm calls:");
        for (int k = 0; k < VMC_N_; k++) printf(" %s %llu", vmc_name[k], (unsigned long long)r.vm.calls[k]);
        printf("; %.1f ms in them (%.1f ns/event)\n", (double)r.vm.ns / 1e6,
               t.num_events ? (double)r.vm.ns / (double)t.num_events : 0.0);
      }
      if (r.vm_counted) {
        printf("  stream-order calls:");
        for (int k = 0; k < SOC_N_; k++) printf(" %s %llu", soc_name[k], (unsigned long long)r.vm.so[k]);
        printf("; mem_get_info %llu (%.1f ms)\n", (unsigned long long)r.vm.meminfo, (double)r.vm.meminfo_ns / 1e6);
      }
      if (r.floor != 0 && t.peak_live != 0)
        printf("  stream-order floor: %llu bytes (%.3f of peak_live; held %.3f of it)\n",
               (unsigned long long)r.floor, (double)r.floor / (double)t.peak_live,
               (double)r.reserved_peak / (double)r.floor);
      if (r.streams_null) printf("  note: %zu streams replayed on the default stream (no stream support for this backend in the tools)\n", t.num_streams);
      if (t.num_unmatched_frees) printf("  note: %zu frees of unknown IDs skipped\n", t.num_unmatched_frees);
      if (t.num_notes) printf("  %zu record_stream notes replayed\n", t.num_notes);
      if (t.num_unmatched_notes)
        printf("  note: %zu record_stream notes of unknown or freed IDs skipped\n", t.num_unmatched_notes);
    } else {
      printf("%-22s FAILED: %s\n", base_name(argv[i]), r.error);
    }
    free(r.ns_runs);
    if (loaded) tools_trace_free(&t);
  }
  if (jf) fprintf(jf, "\n  ]\n}\n");
  if (jf && jf != stdout) fclose(jf);
  return failures ? 1 : 0;
}
