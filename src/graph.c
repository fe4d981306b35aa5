/* graph.c: graph pools (stream capture) and the streams routed to them.
 *
 * A graph pool owns a device pool of its own (gpumem__pool_create_graph:
 * plain segments that never move, no events, no trimming by policy), so its
 * memory is never handed to work outside the graphs that use it. Allocations
 * reach it explicitly (gpumem_graph_pool_alloc, what PyTorch's filter-based
 * routing uses) or through a route: gpumem_graph_pool_begin(pool, stream)
 * sends every allocation on that stream, and on every stream of the same
 * capture, to the pool until gpumem_graph_pool_end. Frees find the pool
 * through the pointer index, as every free does.
 *
 * While any route exists a capture may be under way, and the rules of
 * capture hold for the whole context: no thread cache is keyed to it (each
 * route detaches them, and tcache.c keys none while routes exist: a hit
 * would hand out memory that work outside the graph reuses), frees record no
 * event on their stream, and no call synchronises the device or gives memory
 * back to it (gpumem__capturing; the backends make their other calls legal
 * in any capture mode). Released pools whose blocks are still live are kept
 * until those blocks are freed; gpumem_trim and gpumem_destroy give them back.
 *
 * A capture nobody routed gets a pool of its own. The backend reports a
 * stream's capture state (stream_capture), so an allocation or a free on a
 * stream other than NULL (the legacy stream, which no capture takes) that no
 * route covers asks it first (gpumem__graph_probe; the thread caches' inlined
 * allocation hits miss for such streams, tcache.h astream); a stream found
 * capturing gets a pool created for that capture and a route (the pool marked `autop`),
 * and from then on the capture is known like a routed one: the other streams
 * of the capture find the pool by the capture's id, and no thread synchronises
 * the device or frees to it. Such a route is dropped once its stream, named
 * again by an allocation or a free or by gpumem_capture_ended, reports the
 * capture ended (gpumem__graph_reap), or when the caller states that no such
 * capture is under way (gpumem_capture_ended with no stream). The library asks
 * about no other stream: a stream handle is used only
 * in the call that passes it, since the application may destroy the stream
 * right after its capture, and CUDA does not check the handles it is given (the
 * driver's capture query of a destroyed stream crashed on an H100 and an H200).
 * The pool stays after the capture, since the graph may be launched as long as
 * it lives and uses the memory of blocks freed during the capture as well:
 * nothing else allocates from it, and gpumem_capture_pools_release releases it.
 * A capture is learned of at its first allocation or free through the
 * library: work it captured before that is the caller's.
 */
#include "internal.h"
#include "tcache.h"

#include <stdlib.h>
#include <string.h>

struct gpumem_graph_pool {
  gpumem_context *ctx;
  int device;
  gpumem__pool *pool;
  int nroutes;     /* streams routed to it */
  int released;    /* gpumem_graph_pool_release was called: given back once its blocks are free */
  int autop;       /* made for a capture nobody routed (gpumem__graph_probe); its routes are dropped when the
                    * capture ends (gpumem__graph_reap), the pool kept until gpumem_capture_pools_release */
  struct gpumem_graph_pool *next;
};

typedef struct gpumem__route {
  gpumem_graph_pool *gp;
  gpumem_stream stream;
  uint64_t capture_id; /* the stream's capture, once seen capturing (0: not yet) */
} gpumem__route;
/* (a route to a pool made for a capture, gp->autop, was added by gpumem__graph_probe, and only those:
 * no caller holds such a pool to route a stream to it) */

/* Appends a route of stream to gp (caller holds ctx->lock). 0: no host memory, nothing changed. */
static int route_add_locked(gpumem_context *ctx, gpumem_graph_pool *gp, gpumem_stream stream, uint64_t id) {
  int n = atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);
  if ((size_t)n == ctx->route_cap) {
    size_t cap = ctx->route_cap ? ctx->route_cap * 2 : 4;
    gpumem__route *r = gpumem__realloc(ctx->routes, cap * sizeof *r);
    if (r == NULL) return 0;
    ctx->routes = r;
    ctx->route_cap = cap;
  }
  ctx->routes[n].gp = gp;
  ctx->routes[n].stream = stream;
  ctx->routes[n].capture_id = id;
  gp->nroutes++;
  if (gp->autop) atomic_fetch_add_explicit(&ctx->nauto, 1, memory_order_relaxed);
  atomic_store_explicit(&ctx->nroutes, n + 1, memory_order_release);
  return 1;
}

/* Removes route i (caller holds ctx->lock). A pool made for a capture stays when its capture ends: the
 * graph may be launched for as long as it lives, and it uses the memory of the blocks freed during the
 * capture too (gpumem_capture_pools_release gives such pools back). */
static void route_drop_locked(gpumem_context *ctx, int i) {
  int n = atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);
  gpumem__route *r = &ctx->routes[i];
  gpumem_graph_pool *gp = r->gp;
  if (gp->autop) atomic_fetch_sub_explicit(&ctx->nauto, 1, memory_order_relaxed);
  gp->nroutes--;
  ctx->routes[i] = ctx->routes[n - 1];
  atomic_store_explicit(&ctx->nroutes, n - 1, memory_order_release);
}

/* 1 when the capture of route r has ended: its stream captures nothing, or another capture, or the
 * backend can no longer answer for it (a stream destroyed after its capture). */
static int route_ended(gpumem_context *ctx, const gpumem__route *r) {
  uint64_t id = 0;
  int st = gpumem__be_capture_quiet(ctx, r->gp->device, r->stream, &id);
  return (st != GPUMEM_CAPTURE_ACTIVE && st != GPUMEM_CAPTURE_INVALIDATED) || (id != 0 && id != r->capture_id);
}

/* Drops the routes found by asking the backend whose capture has ended (caller holds ctx->lock): those
 * of `stream` on device, the stream the current call names (no other stream is asked about: see above),
 * or with `all`, every one of device without asking (the caller says none is under way).
 * Returns how many were dropped (then gpumem__graph_collect, without the lock). */
static int reap_locked(gpumem_context *ctx, int device, gpumem_stream stream, int all) {
  if (atomic_load_explicit(&ctx->nauto, memory_order_relaxed) == 0) return 0;
  int dropped = 0;
  for (int i = 0; i < atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);) {
    gpumem__route *r = &ctx->routes[i];
    if (r->gp->autop && (device == GPUMEM_ALL_DEVICES || r->gp->device == device) &&
        (all || (stream != NULL && r->stream == stream && route_ended(ctx, r)))) {
      gpumem_graph_pool *gp = r->gp;
      const unsigned long long id = (unsigned long long)r->capture_id;
      route_drop_locked(ctx, i); /* (r is another route from here on) */
      /* a pool that never got memory (the capture only freed through the library, as PyTorch's do: it
       * allocates from its own graph pools) has nothing a graph uses: it goes now */
      if (gp->nroutes == 0) {
        gpumem_stats st;
        gpumem__pool_get_stats(gp->pool, &st);
        if (st.reserved_bytes == 0 && st.num_live == 0) gp->released = 1;
        gpumem__log(&ctx->opt.log, GPUMEM_LOG_DEBUG, "device %d: capture %llu ended; its pool %s", gp->device,
                    id, gp->released ? "got no memory and goes" : "stays until gpumem_capture_pools_release");
      }
      dropped++;
      continue;
    }
    i++;
  }
  return dropped;
}

/* The route of capture `id` on device (caller holds ctx->lock), or NULL. Routes made before their
 * capture began learn its id here. */
static gpumem_graph_pool *capture_route_locked(gpumem_context *ctx, int device, uint64_t id) {
  int n = atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);
  for (int i = 0; i < n; i++) {
    gpumem__route *r = &ctx->routes[i];
    if (r->gp->device != device) continue;
    if (r->capture_id == 0) { /* routed before its capture began: look now */
      int rs = GPUMEM_CAPTURE_NONE;
      uint64_t rid = 0;
      if (gpumem__be_stream_capture(ctx, device, r->stream, &rs, &rid) == GPUMEM_OK && rs == GPUMEM_CAPTURE_ACTIVE)
        r->capture_id = rid;
    }
    if (r->capture_id == id) return r->gp;
  }
  return NULL;
}

static void graph_destroy_locked(gpumem_context *ctx, gpumem_graph_pool *gp);
static gpumem_graph_pool *graph_route(gpumem_context *ctx, int device, gpumem_stream stream, int *failed);

/* A new graph pool into the context's list, with the device's limit: the one gpumem_set_limit gave the
 * main pool, if any (gpumem__graph_set_limit sets both under the same lock, so none is missed). */
static void link_locked(gpumem_context *ctx, gpumem_graph_pool *gp) {
  gpumem__pool *main = atomic_load_explicit(&ctx->pools[gp->device], memory_order_acquire);
  if (main != NULL) gpumem__pool_set_limit(gp->pool, gpumem__pool_get_limit(main));
  gp->next = ctx->graphs;
  ctx->graphs = gp;
}

/* The pool of capture `id`, which `stream` takes part in and no route covers: another stream's of
 * the same capture, or one made for it now with a route from stream. NULL and *failed = 1 when no
 * host memory is left for it. */
static gpumem_graph_pool *capture_pool(gpumem_context *ctx, int device, gpumem_stream stream, uint64_t id,
                                       int *failed) {
  gpumem__mutex_lock(&ctx->lock);
  gpumem_graph_pool *gp = capture_route_locked(ctx, device, id);
  gpumem__mutex_unlock(&ctx->lock);
  if (gp != NULL) return gp;
  /* made outside the lock (pool creation takes its own); another thread of the capture may make one
   * meanwhile, and then this one goes */
  gpumem_graph_pool *mine = gpumem__calloc(1, sizeof *mine);
  if (mine == NULL || gpumem__pool_create_graph(ctx, device, &mine->pool) != GPUMEM_OK) {
    free(mine);
    *failed = 1;
    return NULL;
  }
  mine->ctx = ctx;
  mine->device = device;
  mine->autop = 1;
  gpumem__mutex_lock(&ctx->lock);
  link_locked(ctx, mine);
  gp = capture_route_locked(ctx, device, id);
  if (gp == NULL) {
    if (route_add_locked(ctx, mine, stream, id)) {
      gp = mine;
    } else {
      *failed = 1;
    }
  }
  if (gp != mine) graph_destroy_locked(ctx, mine); /* (empty, never routed: nothing to wait for) */
  gpumem__mutex_unlock(&ctx->lock);
  if (gp == mine)
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_DEBUG, "device %d: capture %llu on stream %p, routed to no pool: a pool of its own",
                device, (unsigned long long)id, stream);
  /* as at every route: each thread cache gives its blocks back and none is keyed while it exists */
  if (gp == mine && ctx->tc_on) (void)gpumem__tc_flush(ctx, NULL, 1);
  return gp;
}

gpumem_graph_pool *gpumem__graph_probe(gpumem_context *ctx, int device, gpumem_stream stream, int *failed) {
  *failed = 0;
  int cst = GPUMEM_CAPTURE_NONE;
  uint64_t id = 0;
  /* an invalidated capture makes no graph: its allocations may come from anywhere */
  if (gpumem__be_stream_capture(ctx, device, stream, &cst, &id) != GPUMEM_OK || cst != GPUMEM_CAPTURE_ACTIVE || id == 0)
    return NULL;
  return capture_pool(ctx, device, stream, id, failed);
}

int gpumem__graph_uncaptured(gpumem_context *ctx, int device, gpumem_stream stream) {
  if (!ctx->cap_probe || gpumem__capturing(ctx)) return 0;
  uint64_t id = 0;
  /* (a NONE answer is all that is taken; anything else takes the full path, which asks again) */
  return gpumem__be_capture_quiet(ctx, device, stream, &id) == GPUMEM_CAPTURE_NONE;
}

/* reap_locked under the lock, then the collection of what it dropped. */
static void reap(gpumem_context *ctx, int device, gpumem_stream stream, int all) {
  if (atomic_load_explicit(&ctx->nauto, memory_order_relaxed) == 0) return; /* (without the lock) */
  gpumem__mutex_lock(&ctx->lock);
  int dropped = reap_locked(ctx, device, stream, all);
  gpumem__mutex_unlock(&ctx->lock);
  if (dropped > 0) gpumem__graph_collect(ctx, 0, GPUMEM_ALL_DEVICES, NULL);
}

void gpumem__graph_reap(gpumem_context *ctx, int device, gpumem_stream stream) {
  if (stream != NULL) reap(ctx, device, stream, 0);
}

/* An allocation from gp, announced to the monitoring hooks as every allocation is (its free
 * through gpumem_free announces its end). */
gpumem_status gpumem__graph_alloc(gpumem_graph_pool *gp, size_t size, gpumem_stream stream, const char *tag,
                                  void **out_ptr) {
  gpumem_status st = gpumem__pool_alloc(gp->pool, size, stream, tag, out_ptr, NULL);
  if (GPUMEM__MON_ON(gp->ctx) && st == GPUMEM_OK) gpumem__monitor_alloc(gp->ctx, gp->device, *out_ptr, size, stream);
  return st;
}

gpumem_status gpumem_graph_pool_create(gpumem_context *ctx, int device, gpumem_graph_pool **out) {
  if (ctx == NULL || out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device < 0 || device >= ctx->ndev) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem_graph_pool *gp = gpumem__calloc(1, sizeof *gp);
  if (gp == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  gpumem_status st = gpumem__pool_create_graph(ctx, device, &gp->pool);
  if (st != GPUMEM_OK) {
    free(gp);
    return st;
  }
  gp->ctx = ctx;
  gp->device = device;
  gpumem__mutex_lock(&ctx->lock);
  link_locked(ctx, gp);
  gpumem__mutex_unlock(&ctx->lock);
  *out = gp;
  return GPUMEM_OK;
}

int gpumem__graph_alloc_routed(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, const char *tag,
                               void **out_ptr, gpumem_status *st) {
  if (GPUMEM__LIKELY(!gpumem__capturing(ctx))) return 0;
  int failed = 0;
  gpumem_graph_pool *gp = graph_route(ctx, device, stream, &failed);
  if (gp == NULL) {
    if (!failed) return 0;
    *st = GPUMEM_ERR_OUT_OF_MEMORY; /* a capture's own pool could not be made: not the main pool's memory */
    return 1;
  }
  *st = gpumem__graph_alloc(gp, size, stream, tag, out_ptr);
  return 1;
}

gpumem_status gpumem_graph_pool_alloc(gpumem_graph_pool *gp, size_t size, gpumem_stream stream, void **out_ptr) {
  if (gp == NULL || out_ptr == NULL || gp->released) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(gp->ctx)) return gpumem__forked_status(gp->ctx, __func__);
  if (size == 0) {
    *out_ptr = NULL;
    return GPUMEM_OK;
  }
  return gpumem__graph_alloc(gp, size, stream, NULL, out_ptr);
}

gpumem_status gpumem_graph_pool_alloc_at(gpumem_graph_pool *gp, void *ptr, size_t size) {
  if (gp == NULL || gp->released) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(gp->ctx)) return gpumem__forked_status(gp->ctx, __func__);
  gpumem_status st = gpumem__pool_alloc_at(gp->pool, ptr, size);
  if (GPUMEM__MON_ON(gp->ctx) && st == GPUMEM_OK) gpumem__monitor_alloc(gp->ctx, gp->device, ptr, size, NULL);
  return st;
}

gpumem_status gpumem_graph_pool_begin(gpumem_graph_pool *gp, gpumem_stream stream) {
  if (gp == NULL || gp->released) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem_context *ctx = gp->ctx;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  gpumem_status st = GPUMEM_OK;
  gpumem__mutex_lock(&ctx->lock);
  int dropped = reap_locked(ctx, gp->device, stream, 0);
  int n = atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);
  for (int i = 0; i < n; i++)
    if (ctx->routes[i].stream == stream && ctx->routes[i].gp->device == gp->device) {
      if (!ctx->routes[i].gp->autop) {
        st = GPUMEM_ERR_INVALID_ARGUMENT; /* routed already (to this pool or another) */
        goto out;
      }
      route_drop_locked(ctx, i); /* named now: the pool found for its capture keeps what it has */
      dropped++;
      break;
    }
  int cst = GPUMEM_CAPTURE_NONE;
  uint64_t id = 0;
  if (gpumem__be_stream_capture(ctx, gp->device, stream, &cst, &id) != GPUMEM_OK || cst != GPUMEM_CAPTURE_ACTIVE) id = 0;
  if (!route_add_locked(ctx, gp, stream, id)) st = GPUMEM_ERR_OUT_OF_MEMORY;
out:
  gpumem__mutex_unlock(&ctx->lock);
  if (dropped > 0) gpumem__graph_collect(ctx, 0, GPUMEM_ALL_DEVICES, NULL);
  /* every thread cache gives its blocks back and lets go of the context; with the route counted
   * first, none is keyed to it again until the last route ends (tcache.c) */
  if (st == GPUMEM_OK && ctx->tc_on) (void)gpumem__tc_flush(ctx, NULL, 1);
  return st;
}

gpumem_status gpumem_graph_pool_end(gpumem_graph_pool *gp, gpumem_stream stream) {
  if (gp == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem_context *ctx = gp->ctx;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  gpumem_status st = GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem__mutex_lock(&ctx->lock);
  int n = atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);
  for (int i = 0; i < n; i++) {
    if (ctx->routes[i].gp != gp || ctx->routes[i].stream != stream) continue;
    route_drop_locked(ctx, i);
    st = GPUMEM_OK;
    break;
  }
  gpumem__mutex_unlock(&ctx->lock);
  return st;
}

/* The graph pool an allocation on (device, stream) goes to while routes exist, or NULL: the stream's
 * route; else, when the stream is being captured, the pool of its capture (a stream forked into a
 * routed stream's capture, an event waited on in it, allocates for that graph), made for it if no
 * route has that capture (*failed = 1 when that fails). Ended captures found by asking are reaped first. */
static gpumem_graph_pool *graph_route(gpumem_context *ctx, int device, gpumem_stream stream, int *failed) {
  gpumem_graph_pool *found = NULL;
  int cst = GPUMEM_CAPTURE_NONE, dropped = 0;
  uint64_t id = 0;
  gpumem__mutex_lock(&ctx->lock);
  dropped = reap_locked(ctx, device, stream, 0);
  int n = atomic_load_explicit(&ctx->nroutes, memory_order_relaxed);
  for (int i = 0; i < n && found == NULL; i++)
    if (ctx->routes[i].stream == stream && ctx->routes[i].gp->device == device) found = ctx->routes[i].gp;
  if (found == NULL && gpumem__be_has_capture(ctx) &&
      gpumem__be_stream_capture(ctx, device, stream, &cst, &id) == GPUMEM_OK && cst == GPUMEM_CAPTURE_ACTIVE && id != 0)
    found = capture_route_locked(ctx, device, id);
  gpumem__mutex_unlock(&ctx->lock);
  if (dropped > 0) gpumem__graph_collect(ctx, 0, GPUMEM_ALL_DEVICES, NULL);
  /* a capture nobody routed (the NULL stream reports one of the device's captures, without an id) */
  if (found == NULL && stream != NULL && ctx->cap_probe && cst == GPUMEM_CAPTURE_ACTIVE && id != 0)
    found = capture_pool(ctx, device, stream, id, failed);
  return found;
}

/* Unlinks and destroys gp (caller holds ctx->lock; no capture under way). */
static void graph_destroy_locked(gpumem_context *ctx, gpumem_graph_pool *gp) {
  for (gpumem_graph_pool **pp = &ctx->graphs; *pp != NULL; pp = &(*pp)->next)
    if (*pp == gp) {
      *pp = gp->next;
      break;
    }
  gpumem__pool_destroy(gp->pool);
  free(gp);
}

/* A released pool (caller holds ctx->lock, no capture under way): what is free goes back (added to
 * *released), and a pool with nothing left goes. One whose segment the backend would not take stays
 * (released, counted for its device) and is tried again at the next collection. Returns the trim's
 * status. */
static gpumem_status release_free_locked(gpumem_context *ctx, gpumem_graph_pool *gp, uint64_t *released) {
  uint64_t rel = 0;
  gpumem_status st = gpumem__pool_trim(gp->pool, 0, &rel);
  *released += rel;
  gpumem_stats ps;
  gpumem__pool_get_stats(gp->pool, &ps);
  if (ps.num_live == 0 && ps.reserved_bytes == 0) graph_destroy_locked(ctx, gp);
  return st;
}

gpumem_status gpumem_graph_pool_release(gpumem_graph_pool *gp) {
  if (gp == NULL || gp->released) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem_context *ctx = gp->ctx;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  gpumem_status st = GPUMEM_OK;
  gpumem__mutex_lock(&ctx->lock);
  if (gp->nroutes > 0) {
    st = GPUMEM_ERR_INVALID_ARGUMENT;
  } else {
    gp->released = 1;
    uint64_t rel = 0;
    if (!gpumem__capturing(ctx)) st = release_free_locked(ctx, gp, &rel); /* the rest when freed */
  }
  gpumem__mutex_unlock(&ctx->lock);
  return st;
}

gpumem_status gpumem_graph_pool_get_stats(gpumem_graph_pool *gp, gpumem_stats *out) {
  if (gp == NULL || out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(gp->ctx)) return gpumem__forked_status(gp->ctx, __func__);
  size_t want = out->struct_size ? out->struct_size : sizeof *out;
  if (want < offsetof(gpumem_stats, allocated_peak)) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem_stats st;
  gpumem__pool_get_stats(gp->pool, &st);
  st.struct_size = (uint32_t)want;
  memcpy(out, &st, want < sizeof st ? want : sizeof st);
  return GPUMEM_OK;
}

gpumem_status gpumem_capture_pools_release(gpumem_context *ctx, int device) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device != GPUMEM_ALL_DEVICES && (device < 0 || device >= ctx->ndev)) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem__mutex_lock(&ctx->lock);
  /* a capture the library still knows of keeps its pool (its route holds it): it may be under way,
   * and its stream is not asked about (gpumem_capture_ended) */
  for (gpumem_graph_pool *gp = ctx->graphs; gp != NULL; gp = gp->next)
    if (gp->autop && gp->nroutes == 0 && (device == GPUMEM_ALL_DEVICES || gp->device == device)) gp->released = 1;
  gpumem__mutex_unlock(&ctx->lock);
  gpumem__graph_collect(ctx, 0, GPUMEM_ALL_DEVICES, NULL); /* what is free now goes back; the rest as it is freed, at the next trim */
  return GPUMEM_OK;
}

gpumem_status gpumem_capture_ended(gpumem_context *ctx, int device, gpumem_stream stream) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device >= ctx->ndev || device < (stream == NULL ? GPUMEM_ALL_DEVICES : 0)) return GPUMEM_ERR_INVALID_DEVICE;
  reap(ctx, device, stream, stream == NULL);
  return GPUMEM_OK;
}

void gpumem__graph_set_limit(gpumem_context *ctx, gpumem__pool *main, int device, uint64_t limit) {
  gpumem__mutex_lock(&ctx->lock);
  gpumem__pool_set_limit(main, limit);
  for (gpumem_graph_pool *gp = ctx->graphs; gp != NULL; gp = gp->next)
    if (gp->device == device) gpumem__pool_set_limit(gp->pool, limit);
  gpumem__mutex_unlock(&ctx->lock);
}

void gpumem__graph_each(gpumem_context *ctx, int device, void (*fn)(gpumem__pool *p, void *arg), void *arg) {
  gpumem__mutex_lock(&ctx->lock);
  for (gpumem_graph_pool *gp = ctx->graphs; gp != NULL; gp = gp->next)
    if (device < 0 || gp->device == device) fn(gp->pool, arg);
  gpumem__mutex_unlock(&ctx->lock);
}

void gpumem__graph_collect(gpumem_context *ctx, int destroy_all, int device, uint64_t *released) {
  uint64_t rel_all = 0;
  gpumem__mutex_lock(&ctx->lock);
  if (destroy_all) {
    while (ctx->graphs != NULL) graph_destroy_locked(ctx, ctx->graphs);
    free(ctx->routes);
    ctx->routes = NULL;
    ctx->route_cap = 0;
    atomic_store_explicit(&ctx->nroutes, 0, memory_order_relaxed);
    atomic_store_explicit(&ctx->nauto, 0, memory_order_relaxed);
  } else if (!gpumem__capturing(ctx)) {
    gpumem_graph_pool *gp = ctx->graphs;
    while (gp != NULL) {
      gpumem_graph_pool *n = gp->next;
      if (gp->released && (device == GPUMEM_ALL_DEVICES || gp->device == device))
        (void)release_free_locked(ctx, gp, &rel_all);
      gp = n;
    }
  }
  gpumem__mutex_unlock(&ctx->lock);
  if (released != NULL) *released += rel_all;
}
