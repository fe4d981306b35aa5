/* trim.c: the trimming policy: when cached memory goes back to the backend (trim,
 * release threshold, low device memory, out of memory) and releasing wholly free segments. */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

/* Give a wholly free READY segment back. On a backend error it stays; while a capture is known it stays
 * too (GPUMEM_ERR_BUSY: a free to the driver would invalidate the capture), whichever path asked (a trim,
 * the limit's room, an out-of-memory retry). */
gpumem_status gpumem__seg_release(gpumem__pool *p, gpumem__segment *s) {
  if (gpumem__capturing(p->ctx)) return GPUMEM_ERR_BUSY;
  gpumem_status st = p->dirty ? gpumem__settle(p) : GPUMEM_OK; /* its blocks may have been freed without an event */
  if (st != GPUMEM_OK) return st;
  st = gpumem__be_free(p->ctx, p->device, (void *)s->base);
  if (st != GPUMEM_OK) return st;
  gpumem__block *b = s->head;
  idx_remove(p, b); /* also unmarks empty */
  block_free(p, b);
  gpumem__seg_unlink(p, s);
  p->st.reserved_bytes -= s->size;
  gpumem__dev_reserved_add(p, -(int64_t)s->size);
  p->st.num_segments--;
  p->st.num_backend_frees++;
  free(s);
  return GPUMEM_OK;
}

/* Release wholly free READY segments while cached > keep. Adds to *released. */
gpumem_status gpumem__release_empty(gpumem__pool *p, uint64_t keep, uint64_t *released) {
  if (gpumem__capturing(p->ctx)) return GPUMEM_OK; /* no backend free while a capture may be under way */
  gpumem_status first = GPUMEM_OK;
  gpumem__segment *s = p->empty;
  while (s != NULL && cached_bytes(p) > keep) {
    gpumem__segment *n = s->enext;
    size_t sz = s->size;
    gpumem_status st = gpumem__seg_release(p, s);
    if (st == GPUMEM_OK) *released += sz;
    else if (st == GPUMEM_ERR_BUSY) break; /* not settled: not now */
    else if (first == GPUMEM_OK) first = st;
    s = n;
  }
  if (p->vm != NULL) {
    gpumem_status st = gpumem__vm_release_idle(p, keep, released);
    if (first == GPUMEM_OK) first = st;
  }
  return first;
}

void gpumem__count_trim(gpumem__pool *p, uint64_t released, const char *why) {
  if (released == 0) return;
  p->st.num_trims++;
  p->st.trimmed_bytes += released;
  LOG(p, GPUMEM_LOG_DEBUG, "device %d: %s gave back %llu bytes (reserved %llu)", p->device, why,
      (unsigned long long)released, (unsigned long long)p->st.reserved_bytes);
}

/* After a free: keep cached <= release_threshold, without waiting. */
void gpumem__check_threshold(gpumem__pool *p) {
  uint64_t thr = p->ctx->opt.release_threshold;
  if (cached_bytes(p) <= thr) return;
  if (p->graph) return; /* a graph pool gives memory back only when released or trimmed explicitly */
  uint64_t rel = 0;
  (void)gpumem__release_empty(p, thr, &rel);
  if (cached_bytes(p) > thr && (p->npending > 0 || p->nmarks > 0 || p->ndeferred > 0)) {
    gpumem__poll_pending(p);
    (void)gpumem__release_empty(p, thr, &rel);
  }
  if (cached_bytes(p) > thr && p->solo == SOLO_ONE && p->solo_r->idx->nblocks > 0) {
    /* the one stream's frees: READY (dirty) now; the guard settles with an event if this call names the stream */
    gpumem__solo_drain(p, p->solo_r);
    (void)gpumem__release_empty(p, thr, &rel);
  }
  gpumem__count_trim(p, rel, "release threshold");
}

/* After growing, and at every tick of the watcher (share.c): if the device's free memory is below
 * trim_free_fraction of total, give back free segments. Returns 1 when it was below. */
int gpumem__check_free_fraction(gpumem__pool *p) {
  gpumem__share_call(p, p->share, p->watching, watch_wanted(p)); /* holding memory: the watcher runs (share.c) */
  double frac = p->ctx->opt.trim_free_fraction;
  if (frac <= 0.0 || p->graph || gpumem__capturing(p->ctx)) return 0;
  uint64_t fr = 0, tot = 0;
  if (gpumem__be_mem_get_info(p->ctx, p->device, &fr, &tot) != GPUMEM_OK) return 0;
  if ((double)fr >= frac * (double)tot) return 0;
  if (p->vm != NULL) gpumem__vm_pressure(p->vm); /* from now on, chunks that can go back granule by granule */
  uint64_t rel = 0;
  /* memory pressure, as in the out-of-memory path: wait for the device so
   * that blocks freed on any stream count as free, then give them back */
  gpumem__sync_all(p);
  (void)gpumem__release_empty(p, 0, &rel);
  gpumem__count_trim(p, rel, "low device memory");
  return 1;
}

gpumem_status gpumem__pool_trim(gpumem__pool *p, uint64_t keep, uint64_t *released) {
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, NULL, 0, 1);
  gpumem__sync_all(p);
  (void)gpumem__srec_reap(p); /* the records of streams with nothing left in the pool, too */
  uint64_t rel = 0;
  gpumem_status st = gpumem__release_empty(p, keep, &rel);
  gpumem__count_trim(p, rel, "trim");
  gpumem__mutex_unlock(&p->lock);
  *released += rel;
  return st;
}

