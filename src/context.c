/* context.c: create/destroy, devices, the alloc/free entry points, trim,
 * reset, statistics. Pools are created lazily, one per device, on the first
 * allocation on that device: no call touches a device the caller did not name. */
#include "tcache.h"
#include "stats_fields.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* Create / destroy                                                        */

gpumem_status gpumem_create(const gpumem_config *cfg, gpumem_context **out) {
  if (out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem__options opt;
  gpumem_status st = gpumem__options_resolve(cfg, &opt);
  if (st != GPUMEM_OK) return st;
  gpumem_context *ctx = gpumem__calloc(1, sizeof *ctx);
  if (ctx == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  ctx->opt = opt;
  /* per-thread caches: not with a release threshold (it counts every free block) */
  ctx->tc_on = opt.release_threshold == GPUMEM_UNLIMITED;
  /* each step that fails goes to the label that undoes the steps before it, in reverse order */
  st = GPUMEM_ERR_OUT_OF_MEMORY;
  if (gpumem__mutex_init(&ctx->lock) != 0) goto fail_ctx;
  if (gpumem__ptrmap_init(&ctx->map) != 0) goto fail_lock;
  st = gpumem__backend_open(ctx);
  ctx->fork_gen = gpumem__fork_init(); /* after the backend's own atfork handlers: ours run first at fork */
  if (st != GPUMEM_OK) goto fail_map;
  ctx->pools = gpumem__calloc((size_t)ctx->ndev, sizeof *ctx->pools);
  ctx->devinfo = gpumem__calloc((size_t)ctx->ndev, sizeof *ctx->devinfo);
  ctx->devinfo_ok = gpumem__calloc((size_t)ctx->ndev, sizeof *ctx->devinfo_ok);
  ctx->reset_gen = gpumem__calloc((size_t)ctx->ndev, sizeof *ctx->reset_gen);
  ctx->dev_reserved = gpumem__calloc((size_t)ctx->ndev, sizeof *ctx->dev_reserved);
  if (ctx->pools == NULL || ctx->devinfo == NULL || ctx->devinfo_ok == NULL || ctx->reset_gen == NULL ||
      ctx->dev_reserved == NULL) {
    st = GPUMEM_ERR_OUT_OF_MEMORY;
    goto fail_backend;
  }
  st = gpumem__monitor_init(ctx); /* annotations, GPUMEM_TRACE; cleans up after itself on failure */
  if (st != GPUMEM_OK) goto fail_backend;
  for (int i = 0; i < ctx->ndev; i++) {
    atomic_init(&ctx->pools[i], NULL);
    atomic_init(&ctx->devinfo_ok[i], 0);
    atomic_init(&ctx->reset_gen[i], 0);
    atomic_init(&ctx->dev_reserved[i], 0);
  }
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "context created: backend %s, %d device(s)", ctx->be_name, ctx->ndev);
  *out = ctx;
  return GPUMEM_OK;

fail_backend:
  free(ctx->pools);
  free(ctx->devinfo);
  free(ctx->devinfo_ok);
  free(ctx->reset_gen);
  free(ctx->dev_reserved);
  gpumem__backend_close(ctx);
fail_map:
  gpumem__ptrmap_destroy(&ctx->map);
fail_lock:
  gpumem__mutex_destroy(&ctx->lock);
fail_ctx:
  free(ctx);
  return st;
}

static inline gpumem__pool *pool_get(gpumem_context *ctx, int dev) {
  return atomic_load_explicit(&ctx->pools[dev], memory_order_acquire);
}

/* The pool of dev, created on first use. */
static gpumem_status pool_get_or_create(gpumem_context *ctx, int dev, gpumem__pool **out) {
  gpumem__pool *p = pool_get(ctx, dev);
  if (GPUMEM__LIKELY(p != NULL)) {
    *out = p;
    return GPUMEM_OK;
  }
  gpumem_status st = GPUMEM_OK;
  gpumem__mutex_lock(&ctx->lock);
  p = atomic_load_explicit(&ctx->pools[dev], memory_order_relaxed);
  if (p == NULL) {
    st = gpumem__pool_create(ctx, dev, &p);
    if (st == GPUMEM_OK) atomic_store_explicit(&ctx->pools[dev], p, memory_order_release);
  }
  gpumem__mutex_unlock(&ctx->lock);
  if (st == GPUMEM_OK) *out = p;
  return st;
}

#define GPUMEM__LEAK_MAX 8

/* Graph pools' live blocks in destroy's leak report. */
typedef struct leak_acc {
  uint64_t *count, *bytes;
  gpumem__leak *first;
  size_t *nfirst;
} leak_acc;

static void graph_live(gpumem__pool *p, void *arg) {
  leak_acc *a = arg;
  gpumem__pool_live(p, a->count, a->bytes, a->first, GPUMEM__LEAK_MAX, a->nfirst);
}

/* Live blocks of graph pools end for the monitoring hooks too, as the device pools' do. */
static void graph_drop(gpumem__pool *p, void *ctx) { gpumem__monitor_drop((gpumem_context *)ctx, p); }

gpumem_status gpumem_destroy(gpumem_context *ctx, unsigned flags) {
  if (ctx == NULL || (flags & ~GPUMEM_DESTROY_FORCE) != 0) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (ctx->tc_on) (void)gpumem__tc_flush(ctx, NULL, 1); /* every thread's cached blocks back to the pools */
  uint64_t count = 0, bytes = 0;
  gpumem__leak first[GPUMEM__LEAK_MAX];
  size_t nfirst = 0;
  for (int d = 0; d < ctx->ndev; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    if (p != NULL) gpumem__pool_live(p, &count, &bytes, first, GPUMEM__LEAK_MAX, &nfirst);
  }
  leak_acc la = {&count, &bytes, first, &nfirst};
  gpumem__graph_each(ctx, -1, graph_live, &la);
  if (count > 0) {
    char msg[1024];
    size_t len = 0;
    gpumem__bappend(msg, sizeof msg, &len, "gpumem_destroy: %llu live allocation(s), %llu bytes not freed%s",
            (unsigned long long)count, (unsigned long long)bytes,
            (flags & GPUMEM_DESTROY_FORCE) ? " (freed by GPUMEM_DESTROY_FORCE)" : "");
    for (size_t i = 0; i < nfirst; i++)
      gpumem__bappend(msg, sizeof msg, &len, "; %p: %zu bytes (requested %zu), device %d, tag %s%.40s%s", (void *)first[i].ptr,
              first[i].size, first[i].requested, first[i].device, first[i].tag ? "\"" : "",
              first[i].tag ? first[i].tag : "(none)", first[i].tag ? "\"" : "");
    if (count > nfirst) gpumem__bappend(msg, sizeof msg, &len, "; ... %llu more", (unsigned long long)(count - nfirst));
    gpumem__log(&ctx->opt.log, (flags & GPUMEM_DESTROY_FORCE) ? GPUMEM_LOG_INFO : GPUMEM_LOG_WARN, "%s", msg);
    if (!(flags & GPUMEM_DESTROY_FORCE)) return GPUMEM_ERR_BUSY;
  }
  if (count > 0 && GPUMEM__MON_ON(ctx)) gpumem__graph_each(ctx, -1, graph_drop, ctx);
  gpumem__graph_collect(ctx, 1, GPUMEM_ALL_DEVICES, NULL);
  for (int d = 0; d < ctx->ndev; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    if (p != NULL && count > 0 && GPUMEM__MON_ON(ctx)) gpumem__monitor_drop(ctx, p);
    if (p != NULL) gpumem__pool_destroy(p);
    atomic_store_explicit(&ctx->pools[d], NULL, memory_order_relaxed);
  }
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "context destroyed (backend %s)", ctx->be_name);
  gpumem__monitor_fini(ctx);
  gpumem__backend_close(ctx);
  free(ctx->pools);
  free(ctx->devinfo);
  free(ctx->devinfo_ok);
  free(ctx->reset_gen);
  free(ctx->dev_reserved);
  gpumem__ptrmap_destroy(&ctx->map);
  gpumem__mutex_destroy(&ctx->lock);
  free(ctx);
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Devices                                                                 */

gpumem_status gpumem_device_count(gpumem_context *ctx, int *count) {
  if (ctx == NULL || count == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  *count = ctx->ndev;
  return GPUMEM_OK;
}

static inline int valid_device(const gpumem_context *ctx, int dev) { return dev >= 0 && dev < ctx->ndev; }

gpumem_status gpumem_device_get_info(gpumem_context *ctx, int device, gpumem_device_info *info) {
  if (ctx == NULL || info == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  size_t want = info->struct_size ? info->struct_size : sizeof *info;
  if (want < offsetof(gpumem_device_info, ordinal) + sizeof(int)) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (!valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  /* name, UUID, PCI id, total and physical index do not change while the
   * context lives: asked once per device (on CUDA that costs ~10 ms), the
   * free bytes every time */
  gpumem_backend_device_info bi;
  gpumem_status st;
  if (atomic_load_explicit(&ctx->devinfo_ok[device], memory_order_acquire)) {
    bi = ctx->devinfo[device];
  } else {
    memset(&bi, 0, sizeof bi);
    bi.physical_index = -1;
    st = gpumem__be_device_info(ctx, device, &bi);
    if (st != GPUMEM_OK) return st;
    gpumem__mutex_lock(&ctx->lock);
    if (!atomic_load_explicit(&ctx->devinfo_ok[device], memory_order_relaxed)) {
      ctx->devinfo[device] = bi;
      atomic_store_explicit(&ctx->devinfo_ok[device], 1, memory_order_release);
    }
    gpumem__mutex_unlock(&ctx->lock);
  }
  uint64_t fr = 0, tot = 0;
  st = gpumem__be_mem_get_info(ctx, device, &fr, &tot);
  if (st != GPUMEM_OK) return st;
  gpumem_device_info d;
  memset(&d, 0, sizeof d);
  d.struct_size = (uint32_t)(info->struct_size ? info->struct_size : sizeof d);
  d.ordinal = device;
  memcpy(d.name, bi.name, sizeof d.name);
  d.name[sizeof d.name - 1] = '\0';
  memcpy(d.uuid, bi.uuid, sizeof d.uuid);
  d.uuid[sizeof d.uuid - 1] = '\0';
  memcpy(d.pci_bus_id, bi.pci_bus_id, sizeof d.pci_bus_id);
  d.pci_bus_id[sizeof d.pci_bus_id - 1] = '\0';
  d.total_bytes = bi.total_bytes ? bi.total_bytes : tot;
  d.free_bytes = fr;
  d.physical_index = bi.physical_index;
  memcpy(info, &d, want < sizeof d ? want : sizeof d);
  return GPUMEM_OK;
}

const char *gpumem_backend_name(const gpumem_context *ctx) { return ctx != NULL ? ctx->be_name : ""; }

/* ---------------------------------------------------------------------- */
/* Allocation                                                              */

/* Every check of gpumem_alloc, then the full path (looked: the calling thread's cache was searched
 * for this call already, gpumem__tc_alloc). */
static inline __attribute__((always_inline)) gpumem_status alloc_checked_(gpumem_context *ctx, int device, size_t size,
                                                                          gpumem_stream stream, const char *tag,
                                                                          void **out_ptr, int looked) {
  if (GPUMEM__UNLIKELY(ctx == NULL || out_ptr == NULL)) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (GPUMEM__UNLIKELY(!valid_device(ctx, device))) return GPUMEM_ERR_INVALID_DEVICE;
  if (GPUMEM__UNLIKELY(size == 0)) {
    *out_ptr = NULL;
    return GPUMEM_OK;
  }
  return gpumem__alloc_slow(ctx, device, size, stream, tag, out_ptr, looked);
}

/* (alloc_checked and alloc_near take out_ptr before tag: gpumem_alloc's tail calls to them then
 * find it in the register it came in) */
static gpumem_status alloc_checked(gpumem_context *ctx, int device, size_t size, gpumem_stream stream,
                                   void **out_ptr, const char *tag) {
  return alloc_checked_(ctx, device, size, stream, tag, out_ptr, 0);
}

/* gpumem__tc_fast_alloc found the calling thread's cache keyed to this call, and left it locked:
 * a near fit, else every check and the full path, which does not search the cache again. (The
 * first, second and fourth parameters are unused: size, out_ptr and tag come in the registers
 * gpumem_alloc has them in, and the call's ctx, device and stream are read from the cache.) */
static GPUMEM__NOIPA gpumem_status alloc_near(void *unused0, int unused1, size_t size, void *unused3,
                                                           void **out_ptr, const char *tag) {
  (void)unused0;
  (void)unused1;
  (void)unused3;
  /* the call's ctx, dev and stream are those of the cache, read while it is locked */
  gpumem__tc *c = gpumem__tls_tc;
  gpumem_context *ctx = c->ctx;
  int device = c->dev;
  gpumem_stream stream = c->stream;
  int hit = gpumem__tc_near_hit(size, tag, out_ptr);
  if (hit > 0) return GPUMEM_OK;
  return alloc_checked_(ctx, device, size, stream, tag, out_ptr, hit == 0);
}

/* A request above GPUMEM__TC_MAX_SIZE (gpumem__tc_fast_alloc returned -2): the calling thread's large
 * slot, else every check and the full path. (The parameters come in the registers gpumem_alloc has
 * them in.) */
static GPUMEM__NOIPA gpumem_status alloc_large(gpumem_context *ctx, int device, size_t size, gpumem_stream stream,
                                               void **out_ptr, const char *tag) {
  if (gpumem__tc_large_hit(ctx, device, size, stream, tag, out_ptr)) return GPUMEM_OK;
  return alloc_checked(ctx, device, size, stream, out_ptr, tag);
}

/* The inlined hit missed on a stream other than NULL: the thread cache keyed to the call misses there
 * when the stream must first be asked about capture (tcache.h astream); the hit after asking, else
 * every check and the full path. */
static GPUMEM__NOIPA gpumem_status alloc_probed(gpumem_context *ctx, int device, size_t size, gpumem_stream stream,
                                                void **out_ptr, const char *tag) {
  if (gpumem__tc_probed_alloc(ctx, device, size, stream, tag, out_ptr)) return GPUMEM_OK;
  return alloc_checked(ctx, device, size, stream, out_ptr, tag);
}

/* The one allocation path: the thread cache's hit inline (it matches only arguments it was keyed
 * to, which passed these checks then: tcache.h), then every check and the full path. */
static inline __attribute__((always_inline)) gpumem_status alloc_impl(gpumem_context *ctx, int device, size_t size, gpumem_stream stream,
                                       const char *tag, void **out_ptr) {
  if (GPUMEM__LIKELY(out_ptr != NULL)) {
    int hit = gpumem__tc_fast_alloc(ctx, device, size, stream, tag, out_ptr);
    if (GPUMEM__LIKELY(hit > 0)) return GPUMEM_OK;
    if (hit == -1) return alloc_near(NULL, 0, size, NULL, out_ptr, tag); /* the cache stays locked for it */
    if (hit < 0) return alloc_large(ctx, device, size, stream, out_ptr, tag);
    if (stream != NULL) return alloc_probed(ctx, device, size, stream, out_ptr, tag); /* (a miss only) */
  }
  return alloc_checked(ctx, device, size, stream, out_ptr, tag);
}

gpumem_status gpumem__alloc_slow(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, const char *tag,
                                 void **out_ptr, int looked) {
  gpumem__pool *p;
  gpumem_status st = pool_get_or_create(ctx, device, &p);
  if (st != GPUMEM_OK) return st;
  /* a stream being captured that nobody routed gets a pool for its capture (graph.c) before any cache
   * is asked: the inlined hits miss for such streams (tcache.h astream) */
  if (stream != NULL && ctx->cap_probe && !gpumem__capturing(ctx)) {
    int failed = 0;
    (void)gpumem__graph_probe(ctx, device, stream, &failed);
    if (GPUMEM__UNLIKELY(failed)) return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  /* allocations routed to a graph pool are decided where no thread cache is keyed (tc_alloc) */
  if (GPUMEM__LIKELY(ctx->tc_on) && !GPUMEM__MON_ON(ctx))
    return gpumem__tc_alloc(ctx, p, size, stream, tag, out_ptr, looked);
  const int mon = GPUMEM__MON_ON(ctx);
  if (mon) gpumem__monitor_alloc_enter(ctx);
  if (!gpumem__graph_alloc_routed(ctx, device, size, stream, tag, out_ptr, &st)) {
    st = gpumem__pool_alloc(p, size, stream, tag, out_ptr, NULL);
    if (mon && st == GPUMEM_OK) gpumem__monitor_alloc(ctx, device, *out_ptr, size, stream);
  }
  if (mon) gpumem__monitor_alloc_exit(ctx);
  return st;
}

gpumem_status gpumem_alloc_tagged(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, const char *tag,
                                  void **out_ptr) {
  return alloc_impl(ctx, device, size, stream, tag, out_ptr);
}

gpumem_status gpumem_alloc(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, void **out_ptr) {
  return alloc_impl(ctx, device, size, stream, NULL, out_ptr);
}

/* Every check of gpumem_free, then the full path. */
static __attribute__((noinline)) gpumem_status free_checked(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  if (GPUMEM__UNLIKELY(ctx == NULL)) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__UNLIKELY(ptr == NULL)) return GPUMEM_OK;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  /* a free may record an event on its stream, which a capture must not have queried later: a capture
   * found here is known from now on (graph.c); one found before on this stream may have ended */
  /* (a second capture, begun while one is known, is met here as the first was: another capture being known
   * does not tell about this one) */
  const int known = atomic_load_explicit(&ctx->nauto, memory_order_relaxed) > 0;
  if (stream != NULL && (GPUMEM__UNLIKELY(known) || (ctx->cap_probe && !gpumem__capturing(ctx)))) {
    gpumem__pool *bp = gpumem__ptrmap_pool(&ctx->map, (uintptr_t)ptr); /* (the stream is of the block's device) */
    int failed = 0; /* (no pool for the capture: the free itself needs none) */
    if (bp != NULL && known) gpumem__graph_reap(ctx, gpumem__pool_device(bp), stream);
    if (bp != NULL && ctx->cap_probe) (void)gpumem__graph_probe(ctx, gpumem__pool_device(bp), stream, &failed);
  }
  if (GPUMEM__MON_ON(ctx)) return gpumem__monitor_free(ctx, ptr, stream); /* calls gpumem__free_unmonitored */
  if (GPUMEM__LIKELY(ctx->tc_on)) return gpumem__tc_free(ctx, ptr, stream);
  return gpumem__free_unmonitored(ctx, ptr, stream);
}

/* gpumem__tc_fast_free found ptr remembered by the calling thread's cache, keyed to this call, and
 * left the cache locked: the full path, with the call's ctx and stream read from the cache. */
static GPUMEM__NOIPA gpumem_status free_held(void *unused0, void *ptr) {
  (void)unused0; /* (ptr comes in the register gpumem_free has it in) */
  gpumem__tc *c = gpumem__tls_tc;
  gpumem_context *ctx = c->ctx;
  gpumem_stream stream = c->stream;
  gpumem__tc_unlock_fast(c); /* (taken by the inlined hit's try) */
  return free_checked(ctx, ptr, stream);
}

gpumem_status gpumem_free(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  /* a block this thread's cache remembers, claimed without the index (tcache.h) */
  if (GPUMEM__LIKELY(ptr != NULL)) {
    int hit = gpumem__tc_fast_free(ctx, ptr, stream);
    if (GPUMEM__LIKELY(hit > 0)) return GPUMEM_OK;
    if (hit < 0) return free_held(NULL, ptr);
  }
  return free_checked(ctx, ptr, stream);
}

gpumem_status gpumem__free_unmonitored(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  /* The pool is found through the index, and the pool removes the entry
   * under its own lock, so a concurrent reset or double free is caught. */
  for (int tries = 0; tries < 4; tries++) {
    gpumem__pool *p = gpumem__ptrmap_pool(&ctx->map, (uintptr_t)ptr);
    if (p == NULL) break;
    gpumem_status st = gpumem__pool_free(p, ptr, stream);
    if (st != GPUMEM_ERR_INVALID_POINTER) return st;
  }
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN,
              "gpumem_free(%p): not a live allocation of this context (never allocated, already freed, or interior)",
              ptr);
  return GPUMEM_ERR_INVALID_POINTER;
}

gpumem_status gpumem_record_stream(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (ptr == NULL) return GPUMEM_ERR_INVALID_POINTER;
  /* as in a free: the pool is found through the index and checks the entry under its lock */
  for (int tries = 0; tries < 4; tries++) {
    gpumem__pool *p = gpumem__ptrmap_pool(&ctx->map, (uintptr_t)ptr);
    if (p == NULL) break;
    gpumem_status st = (atomic_load_explicit(&ctx->mon, memory_order_relaxed) & GPUMEM__MON_TRACE)
                           ? gpumem__monitor_record_stream(ctx, p, ptr, stream)
                           : gpumem__pool_record_stream(p, ptr, stream);
    if (st != GPUMEM_ERR_INVALID_POINTER) return st;
  }
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "gpumem_record_stream(%p): not a live allocation of this context", ptr);
  return GPUMEM_ERR_INVALID_POINTER;
}

gpumem_status gpumem_ptr_info(gpumem_context *ctx, const void *ptr, size_t *size, int *device) {
  if (ctx == NULL || ptr == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  gpumem__pool *p = NULL;
  if (gpumem__ptrmap_info(&ctx->map, (uintptr_t)ptr, size, &p) != 0) return GPUMEM_ERR_INVALID_POINTER;
  if (device != NULL) *device = gpumem__pool_device(p); /* fixed for the pool's life, the context's */
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Trim and reset                                                          */

gpumem_status gpumem_trim(gpumem_context *ctx, int device, uint64_t keep_bytes, uint64_t *released) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device != GPUMEM_ALL_DEVICES && !valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  uint64_t rel = 0;
  gpumem_status first = GPUMEM_OK;
  int lo = device == GPUMEM_ALL_DEVICES ? 0 : device;
  int hi = device == GPUMEM_ALL_DEVICES ? ctx->ndev : device + 1;
  for (int d = lo; d < hi; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    if (p == NULL) continue;
    if (ctx->tc_on) (void)gpumem__tc_flush(ctx, p, 0);
    gpumem_status st = gpumem__pool_trim(p, keep_bytes, &rel);
    if (st != GPUMEM_OK && first == GPUMEM_OK) first = st;
  }
  gpumem__graph_collect(ctx, 0, device, &rel); /* released graph pools whose blocks were freed since: counted */
  if (released != NULL) *released = rel;
  return first;
}

gpumem_status gpumem_set_limit(gpumem_context *ctx, int device, uint64_t limit_bytes) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (!valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem__pool *p;
  gpumem_status st = pool_get_or_create(ctx, device, &p);
  if (st != GPUMEM_OK) return st;
  gpumem__graph_set_limit(ctx, p, device, limit_bytes); /* one limit for the device: its graph pools too */
  gpumem_stats s;
  gpumem__pool_get_stats(p, &s);
  if (limit_bytes != 0 && s.reserved_bytes > limit_bytes) {
    /* cached memory above the new cap goes back now; live memory stays until it is freed */
    if (ctx->tc_on) (void)gpumem__tc_flush(ctx, p, 0);
    uint64_t rel = 0, keep = limit_bytes > s.allocated_bytes ? limit_bytes - s.allocated_bytes : 0;
    st = gpumem__pool_trim(p, keep, &rel);
  }
  return st;
}

gpumem_status gpumem_get_limit(gpumem_context *ctx, int device, uint64_t *limit_bytes) {
  if (ctx == NULL || limit_bytes == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (!valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem__pool *p = pool_get(ctx, device);
  if (p != NULL) {
    *limit_bytes = gpumem__pool_get_limit(p);
    return GPUMEM_OK;
  }
  /* no pool yet (none is made for this): the limit it will get */
  gpumem_backend_device_info bi;
  memset(&bi, 0, sizeof bi);
  if (ctx->opt.limit_fraction > 0.0) {
    gpumem_status st = gpumem__be_device_info(ctx, device, &bi);
    if (st != GPUMEM_OK) return st;
  }
  *limit_bytes = gpumem__options_limit(&ctx->opt, bi.total_bytes);
  return GPUMEM_OK;
}

gpumem_status gpumem_largest_free_block(gpumem_context *ctx, int device, uint64_t *bytes) {
  if (ctx == NULL || bytes == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (!valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem__pool *p = pool_get(ctx, device);
  *bytes = p != NULL ? gpumem__pool_largest_free(p) : 0;
  return GPUMEM_OK;
}

gpumem_status gpumem_reset(gpumem_context *ctx, int device, unsigned flags) {
  if (ctx == NULL || (flags & ~GPUMEM_RESET_DEVICE) != 0) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device != GPUMEM_ALL_DEVICES && !valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  if ((flags & GPUMEM_RESET_DEVICE) && !gpumem__be_has_device_reset(ctx)) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "gpumem_reset: backend %s has no device reset", ctx->be_name);
    return GPUMEM_ERR_NOT_SUPPORTED;
  }
  gpumem_status first = GPUMEM_OK;
  int lo = device == GPUMEM_ALL_DEVICES ? 0 : device;
  int hi = device == GPUMEM_ALL_DEVICES ? ctx->ndev : device + 1;
  /* a reset synchronises the device and frees to it, which would invalidate a capture under way (and
   * hand its graph's memory to other work): refused while one is known, or the backend reports one
   * on a device (the NULL stream's answer: CUDA's covers the blocking streams) */
  if (gpumem__capturing(ctx)) return GPUMEM_ERR_BUSY;
  for (int d = lo; d < hi && ctx->cap_probe; d++) {
    if (pool_get(ctx, d) == NULL) continue; /* (nothing of ours there; no query makes a context on it) */
    int cst = GPUMEM_CAPTURE_NONE;
    uint64_t id = 0;
    if (gpumem__be_stream_capture(ctx, d, NULL, &cst, &id) == GPUMEM_OK && cst != GPUMEM_CAPTURE_NONE)
      return GPUMEM_ERR_BUSY;
  }
  for (int d = lo; d < hi; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    gpumem_status st = GPUMEM_OK;
    /* every cache lock is held across the reset: a free racing it lands in a cache flushed here, or fails */
    if (p != NULL && ctx->tc_on) {
      gpumem__tc_lock_all();
      gpumem__tc_flush_locked(ctx, p);
    }
    if (p != NULL) st = GPUMEM__MON_ON(ctx) ? gpumem__monitor_reset(ctx, p) : gpumem__pool_reset(p);
    if (p != NULL && ctx->tc_on) gpumem__tc_unlock_all();
    if (st == GPUMEM_OK && (flags & GPUMEM_RESET_DEVICE)) st = gpumem__be_device_reset(ctx, d);
    if (st != GPUMEM_OK && first == GPUMEM_OK) first = st;
  }
  return first;
}

/* ---------------------------------------------------------------------- */
/* Statistics                                                              */

#define GPUMEM__STATS_MIN (offsetof(gpumem_stats, allocated_bytes) + sizeof(uint64_t))

/* Every field adds up over devices (a peak to an upper bound of the context's peak: stats_fields.h). */
static void stats_add(gpumem_stats *a, const gpumem_stats *b) {
#define GPUMEM__STATS_ADD_(name, kind, help) a->name += b->name;
  GPUMEM__STATS_FIELDS(GPUMEM__STATS_ADD_)
#undef GPUMEM__STATS_ADD_
}

static void graph_stats_add(gpumem__pool *p, void *arg) {
  gpumem_stats one;
  gpumem__pool_get_stats(p, &one);
  stats_add((gpumem_stats *)arg, &one);
}

gpumem_status gpumem_get_stats(gpumem_context *ctx, int device, gpumem_stats *out) {
  if (ctx == NULL || out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  size_t want = out->struct_size ? out->struct_size : sizeof *out;
  if (want < GPUMEM__STATS_MIN) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (device != GPUMEM_ALL_DEVICES && !valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem_stats sum;
  memset(&sum, 0, sizeof sum);
  int lo = device == GPUMEM_ALL_DEVICES ? 0 : device;
  int hi = device == GPUMEM_ALL_DEVICES ? ctx->ndev : device + 1;
  if (ctx->tc_on) gpumem__tc_lock_all(); /* exact: every thread cache's counters with the pool's */
  for (int d = lo; d < hi; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    if (p == NULL) continue;
    gpumem_stats one;
    if (ctx->tc_on) gpumem__tc_pool_stats(ctx, p, &one);
    else gpumem__pool_get_stats(p, &one);
    stats_add(&sum, &one);
  }
  if (ctx->tc_on) gpumem__tc_unlock_all();
  /* graph pools' memory counts for its device, as PyTorch counts its graph pools */
  gpumem__graph_each(ctx, device, graph_stats_add, &sum);
  sum.struct_size = (uint32_t)(out->struct_size ? out->struct_size : sizeof sum);
  sum.reserved_ = 0;
  memcpy(out, &sum, want < sizeof sum ? want : sizeof sum);
  return GPUMEM_OK;
}

gpumem_status gpumem_reset_peak_stats(gpumem_context *ctx, int device) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device != GPUMEM_ALL_DEVICES && !valid_device(ctx, device)) return GPUMEM_ERR_INVALID_DEVICE;
  int lo = device == GPUMEM_ALL_DEVICES ? 0 : device;
  int hi = device == GPUMEM_ALL_DEVICES ? ctx->ndev : device + 1;
  if (ctx->tc_on) gpumem__tc_lock_all();
  for (int d = lo; d < hi; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    if (p == NULL) continue;
    if (ctx->tc_on) gpumem__tc_reset_peaks(ctx, p);
    else gpumem__pool_reset_peaks(p);
  }
  if (ctx->tc_on) gpumem__tc_unlock_all();
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Invariants                                                              */

gpumem_status gpumem__check_invariants(gpumem_context *ctx) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (ctx->tc_on) (void)gpumem__tc_flush(ctx, NULL, 0); /* cached blocks are live for the pool, not in the index */
  for (int d = 0; d < ctx->ndev; d++) {
    gpumem__pool *p = pool_get(ctx, d);
    if (p == NULL) continue;
    uint64_t live = 0;
    gpumem_status st = gpumem__pool_check(p, &live);
    if (st != GPUMEM_OK) return st;
    /* Only meaningful when no other thread is allocating or freeing. */
    size_t inmap = gpumem__ptrmap_count_pool(&ctx->map, p);
    if (inmap != live) {
      gpumem__log(&ctx->opt.log, GPUMEM_LOG_ERROR,
                  "invariant violated (device %d): pointer index has %zu entries, pool has %llu live blocks", d, inmap,
                  (unsigned long long)live);
      return GPUMEM_ERR_INTERNAL;
    }
  }
  return GPUMEM_OK;
}

size_t gpumem__stream_records(gpumem_context *ctx, int device) {
  if (ctx == NULL || !valid_device(ctx, device)) return 0;
  gpumem__pool *p = pool_get(ctx, device);
  return p != NULL ? gpumem__pool_stream_records(p) : 0;
}
