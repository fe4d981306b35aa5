/* stream_order.c: stream-ordered reuse: stream records, events, pending batches, single-stream
 * marks, and the single-stream ("solo") path of expandable pools. */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

gpumem__srec *gpumem__srec_get(gpumem__pool *p, gpumem_stream s) {
  gpumem__srec *r = srec_find(p, s);
  if (r != NULL) return r;
  if ((p->scount + 1) * 2 > p->scap) {
    size_t ncap = p->scap ? p->scap * 2 : 8;
    gpumem__srec **nt = gpumem__calloc(ncap, sizeof *nt);
    if (nt == NULL) return NULL;
    for (size_t i = 0; i < p->scap; i++) {
      if (p->stab[i] == NULL) continue;
      size_t j = stream_hash(p->stab[i]->stream) & (ncap - 1);
      while (nt[j] != NULL) j = (j + 1) & (ncap - 1);
      nt[j] = p->stab[i];
    }
    free(p->stab);
    p->stab = nt;
    p->scap = ncap;
  }
  r = gpumem__calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  r->idx = gpumem__fidx_new(p, IDX_STREAM);
  if (r->idx == NULL) {
    free(r);
    return NULL;
  }
  r->stream = s;
  r->sweep = p->sweeps;
  r->idx->srec = r;
  size_t i = stream_hash(s) & (p->scap - 1);
  while (p->stab[i] != NULL) i = (i + 1) & (p->scap - 1);
  p->stab[i] = r;
  p->scount++;
  if (p->slast != NULL) p->slast->onext = r;
  else p->sfirst = r;
  p->slast = r;
  return r;
}

/* ---------------------------------------------------------------------- */
/* Stream record lifetime                                                  */
/*
 * A record exists while its stream has something in the pool: free blocks in its own index, a
 * pending batch, a mark, or the single-stream path's role (solo_r). Once none of that is left, the
 * record (about 8 KB: the index's buckets) is dropped; the stream gets a new one at its next free.
 * Nothing else points at a record (batches and free sets only of its own, which are gone then), and
 * the pool's functions hold a record only within one call under the pool lock, so records are
 * dropped only at the end of a free (srec_maybe_reap, once there are more than reap_at) or by a
 * trim, never while a caller holds one. Dropping forgets only the per-stream free counter (fseq)
 * and harvest point (fed), which order blocks of that record alone.
 *
 * A stream that is never named again (an application that makes a stream per request and
 * destroys it) may leave free blocks without an event in its index: a thread cache's flush gives
 * blocks back without naming their stream, and the backend is never called with a stream outside a
 * call that names it (see gpumem__stream_touch), so no event can be recorded for them any more.
 * Such blocks were usable only after a device synchronisation already; a sweep moves those of
 * streams not named since the sweep before into one pool-wide set (orphans, never searched), which
 * the next device synchronisation (trim, reset, the out-of-memory and limit paths) makes READY, and
 * drops their records. So host memory stays in proportion to the streams in use, not to every
 * stream ever named. (Graph pools keep theirs: they never synchronise.)
 */

#define FREE_KEEP 16 /* spare free sets and batch structs kept for reuse after a sweep */

static int srec_idle(const gpumem__pool *p, const gpumem__srec *r) {
  return r->idx->nblocks == 0 && r->batches == NULL && !r->has_mark && r != p->solo_r;
}

/* A free block of a stream that has no record (no host memory for one): usable by every stream once
 * the device has been synchronised. While it cannot be (the synchronisation fails, or a capture is
 * under way, which a synchronisation would invalidate), the stream's work on the block may still be
 * running: it waits with the orphans, which the next device synchronisation makes READY. (Made at
 * pool creation, the orphans' set needs no host memory here.) */
void gpumem__place_unrecorded(gpumem__pool *p, gpumem__block *b) {
  if (!gpumem__capturing(p->ctx) && gpumem__be_device_synchronize(p->ctx, p->device) == GPUMEM_OK)
    insert_coalesce(p, p->ready, b);
  else
    insert_coalesce(p, p->orphans, b);
}

/* r's free blocks have no event and r was not named since the last sweep: they go to orphans. */
static int srec_orphan(gpumem__pool *p, gpumem__srec *r) {
  if (r->idx->nblocks == 0 || r->batches != NULL || r->has_mark || r == p->solo_r || p->graph) return 0;
  if (r->sweep == p->sweeps) return 0; /* named since the last sweep: it may be named again soon */
  gpumem__drain_to(p, r->idx, p->orphans);
  return 1;
}

static void srec_free(gpumem__srec *r) {
  free(r->idx);
  free(r);
}

/* Spare free sets and batch structs beyond FREE_KEEP go back to the host. */
static void spares_trim(gpumem__pool *p) {
  size_t n = 0;
  for (gpumem__fidx **pp = &p->ffree; *pp != NULL;) {
    if (++n <= FREE_KEEP) {
      pp = &(*pp)->next_free;
      continue;
    }
    gpumem__fidx *f = *pp;
    *pp = f->next_free;
    free(f);
  }
  n = 0;
  for (gpumem__batch **pp = &p->batch_free; *pp != NULL;) {
    if (++n <= FREE_KEEP) {
      pp = &(*pp)->next;
      continue;
    }
    gpumem__batch *b = *pp;
    *pp = b->next;
    free(b);
  }
}

size_t gpumem__srec_reap(gpumem__pool *p) {
  if (p->npending > 0 || p->nmarks > 0) gpumem__poll_pending(p); /* completed batches leave their records idle */
  size_t keep = 0;
  for (gpumem__srec *r = p->sfirst; r != NULL; r = r->onext)
    if (!srec_idle(p, r) && !srec_orphan(p, r)) keep++;
  p->sweeps++;
  size_t dropped = p->scount - keep;
  if (dropped > 0) {
    size_t ncap = 8;
    while ((keep + 1) * 2 > ncap) ncap *= 2;
    gpumem__srec **nt = gpumem__calloc(ncap, sizeof *nt);
    if (nt == NULL) { /* no host memory for the smaller table: keep every record, try at a later sweep */
      dropped = 0;
    } else {
      gpumem__srec **link = &p->sfirst;
      p->slast = NULL;
      for (gpumem__srec *r = p->sfirst, *n; r != NULL; r = n) {
        n = r->onext;
        if (srec_idle(p, r)) { /* (an orphaned record is idle now) */
          srec_free(r);
          continue;
        }
        *link = r;
        link = &r->onext;
        p->slast = r;
        size_t j = stream_hash(r->stream) & (ncap - 1);
        while (nt[j] != NULL) j = (j + 1) & (ncap - 1);
        nt[j] = r;
      }
      *link = NULL;
      free(p->stab);
      p->stab = nt;
      p->scap = ncap;
      p->scount = keep;
    }
  }
  spares_trim(p);
  p->reap_at = p->scount * 2 > SREC_REAP_MIN ? p->scount * 2 : SREC_REAP_MIN;
  return dropped;
}

size_t gpumem__pool_stream_records(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  size_t n = p->scount;
  gpumem__mutex_unlock(&p->lock);
  return n;
}

static gpumem_status ev_get(gpumem__pool *p, gpumem_event *ev) {
  if (p->nev > 0) {
    *ev = p->evcache[--p->nev];
    return GPUMEM_OK;
  }
  return gpumem__be_event_create(p->ctx, p->device, ev);
}

static void ev_put(gpumem__pool *p, gpumem_event ev) {
  if (p->nev == p->evcap) {
    size_t ncap = p->evcap ? p->evcap * 2 : 8;
    gpumem_event *n = gpumem__realloc(p->evcache, ncap * sizeof *n);
    if (n == NULL) {
      (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
      return;
    }
    p->evcache = n;
    p->evcap = ncap;
  }
  p->evcache[p->nev++] = ev;
}

/* Move all STREAM blocks of r into a new pending batch. With with_event, one
 * event is recorded on r's stream; without, the batch completes only by a
 * device synchronisation. Returns the batch or NULL (nothing moved). */
gpumem__batch *gpumem__harvest(gpumem__pool *p, gpumem__srec *r, int with_event) {
  if (r->idx->nblocks == 0) return NULL;
  gpumem_event ev = NULL;
  if (with_event) {
    if (ev_get(p, &ev) != GPUMEM_OK) return NULL;
    if (gpumem__be_event_record(p->ctx, p->device, ev, r->stream) != GPUMEM_OK) {
      (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
      return NULL;
    }
  }
  gpumem__batch *b = p->batch_free;
  if (b != NULL) p->batch_free = b->next;
  else b = gpumem__malloc(sizeof *b);
  gpumem__fidx *nf = b != NULL ? gpumem__fidx_new(p, IDX_STREAM) : NULL;
  if (nf == NULL) {
    if (b != NULL) {
      b->next = p->batch_free;
      p->batch_free = b;
    }
    if (with_event) ev_put(p, ev);
    return NULL;
  }
  memset(b, 0, sizeof *b);
  b->ev = ev;
  b->has_ev = with_event;
  b->srec = r;
  b->idx = r->idx;
  b->idx->kind = IDX_PENDING;
  b->idx->batch = b;
  nf->srec = r;
  r->idx = nf;
  /* append to the pool's pending list, push on the stream's list */
  b->prev = p->pending_tail;
  if (p->pending_tail != NULL) p->pending_tail->next = b;
  else p->pending_head = b;
  p->pending_tail = b;
  p->npending++;
  b->snext = r->batches;
  if (r->batches != NULL) r->batches->sprev = b;
  r->batches = b;
  return b;
}

/* A batch whose blocks have left (batch_complete, gpumem__adopt_pending) leaves the pool's and its
 * stream's lists, its event and free set recycled. */
static void batch_retire(gpumem__pool *p, gpumem__batch *b) {
  gpumem__fidx *f = b->idx;
  if (b->prev != NULL) b->prev->next = b->next;
  else p->pending_head = b->next;
  if (b->next != NULL) b->next->prev = b->prev;
  else p->pending_tail = b->prev;
  p->npending--;
  if (b->sprev != NULL) b->sprev->snext = b->snext;
  else b->srec->batches = b->snext;
  if (b->snext != NULL) b->snext->sprev = b->sprev;
  if (b->has_ev) ev_put(p, b->ev);
  gpumem__fidx_recycle(p, f);
  b->next = p->batch_free;
  p->batch_free = b;
}

/* The batch's event completed: its blocks become READY (coalescing). */
static void batch_complete(gpumem__pool *p, gpumem__batch *b) {
  gpumem__drain_to_ready(p, b->idx);
  batch_retire(p, b);
}

/* Other streams' pending batches, oldest first, become t's own frees until they hold `want` bytes
 * (with `fit` non-zero, `want` aside: from the first batch that holds one, the single free block a
 * request of `fit` bytes and class `cls` would take (idx_find), the rest of the batch left to its
 * event):
 * t's later work waits on the device for each batch's event (stream_wait_event), so t may reuse
 * them in its stream order, and the other streams once t's own event has completed (which comes
 * after theirs). The host does not wait. Returns the bytes taken; 0 without stream_deps, where the
 * backend has no stream dependencies, in a graph pool, during a capture (a capturing stream may not
 * wait for an event from outside it), or when nothing is pending. */
uint64_t gpumem__adopt_pending(gpumem__pool *p, gpumem__srec *t, uint64_t want, size_t fit, int cls) {
  if (!p->ctx->opt.stream_deps || p->graph || !gpumem__be_has_stream_wait(p->ctx) || gpumem__capturing(p->ctx) ||
      p->npending == 0)
    return 0;
  gpumem__poll_pending(p); /* what has completed becomes READY without a dependency */
  uint64_t got = 0;
  for (gpumem__batch *b = p->pending_head, *n; b != NULL && (fit != 0 || got < want); b = n) {
    n = b->next;
    if (b->srec == t || !b->has_ev) continue;
    gpumem__block *one = fit != 0 ? idx_find(b->idx, fit, cls) : NULL;
    if (fit != 0 && one == NULL) continue;
    if (gpumem__be_stream_wait_event(p->ctx, p->device, t->stream, b->ev) != GPUMEM_OK) break;
    if (one != NULL) {
      got += one->size;
      idx_remove(p, one);
      insert_coalesce(p, t->idx, one);
      if (b->idx->nblocks == 0) batch_retire(p, b);
      break;
    }
    got += b->idx->bytes;
    gpumem__drain_to(p, b->idx, t->idx);
    batch_retire(p, b);
  }
  return got;
}

/* Wait for the work queued on r's stream up to its latest free, then make every block it freed READY:
 * the frees get an event if they have none, the newest batch's event is waited for, and the older
 * batches, recorded before it on the same stream, are complete too. Returns 1 when blocks became
 * READY; 0 (nothing changed but batching) during a capture, when there is nothing to wait for, or
 * when the backend could not record or wait. */
int gpumem__sync_stream(gpumem__pool *p, gpumem__srec *r) {
  if (gpumem__capturing(p->ctx)) return 0; /* a wait on a capturing stream is not allowed */
  if (r->idx->nblocks > 0) (void)gpumem__harvest(p, r, 1);
  gpumem__batch *b = r->batches;
  if (b == NULL || !b->has_ev || gpumem__be_event_synchronize(p->ctx, p->device, b->ev) != GPUMEM_OK) return 0;
  /* the stream's blocks lent from before this point first: their chunks may be among these */
  if (p->ndeferred > 0) gpumem__poll_deferred(p, GPUMEM__DEFER_POLL);
  while (r->batches != NULL) batch_complete(p, r->batches);
  return 1;
}

/* Single-stream marks. While a pool has seen one stream only, moving its
 * frees into batches would split its free space between fidx (worse fit,
 * less coalescing: plain-mode replays lost up to 25%), so the event is
 * recorded at the free as a "mark" and the blocks stay in the stream's
 * fidx; once the mark's event completed, the blocks freed before it
 * (fseq <= mark_seq) become READY, at a poll. */
static void mark_drop(gpumem__pool *p, gpumem__srec *r) {
  ev_put(p, r->mev);
  r->has_mark = 0;
  p->nmarks--;
}

static void mark_record(gpumem__pool *p, gpumem__srec *r) {
  gpumem_event ev;
  if (ev_get(p, &ev) != GPUMEM_OK) return;
  if (gpumem__be_event_record(p->ctx, p->device, ev, r->stream) != GPUMEM_OK) {
    (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
    return;
  }
  r->mev = ev;
  r->mark_seq = r->seq;
  r->has_mark = 1;
  p->nmarks++;
}

/* r's mark completed: its blocks freed before it become READY. */
static void mark_release(gpumem__pool *p, gpumem__srec *r) {
  gpumem__fidx *f = r->idx;
  for (int c = 0; c < CLS_COUNT; c++) {
    gpumem__tlsf *t = &f->t[c];
    uint64_t fls = t->fl_bitmap; /* a copy: blocks leave f below, but only the non-empty bins at entry matter */
    while (fls != 0) {
      int fl = ctz64(fls);
      fls &= fls - 1;
      unsigned sls = t->sl_bitmap[fl];
      while (sls != 0) {
        int sl = __builtin_ctz(sls);
        sls &= sls - 1;
        gpumem__block *b = t->heads[fl][sl], *n;
        for (; b != NULL; b = n) {
          n = b->fnext; /* in f: untouched by a merge into READY */
          if (b->fseq > r->mark_seq) continue;
          idx_remove(p, b);
          insert_coalesce(p, p->ready, b);
        }
      }
    }
  }
  mark_drop(p, r);
}

static void poll_marks(gpumem__pool *p) {
  for (gpumem__srec *r = p->sfirst, *n; r != NULL && p->nmarks > 0; r = n) {
    n = r->onext;
    int done = 0;
    if (r->has_mark && gpumem__be_event_query(p->ctx, p->device, r->mev, &done) == GPUMEM_OK && done)
      mark_release(p, r);
  }
}

/* Move every batch (and mark) whose event has completed to READY. No waiting. */
void gpumem__poll_pending(gpumem__pool *p) {
  if (p->ndeferred > 0) gpumem__poll_deferred(p, GPUMEM__DEFER_POLL);
  poll_marks(p);
  /* oldest first; a stream's newer batch is not asked while its older one is still pending */
  const uint64_t poll = ++p->polls;
  gpumem__batch *b = p->pending_head;
  while (b != NULL) {
    gpumem__batch *n = b->next;
    if (b->has_ev && b->srec->blocked != poll) {
      int done = 0;
      if (gpumem__be_event_query(p->ctx, p->device, b->ev, &done) == GPUMEM_OK && done) batch_complete(p, b);
      else b->srec->blocked = poll;
    }
    b = n;
  }
}

/* Bytes freed on a stream whose batch is pending after which a free asks the batch's event even
 * when no miss is waiting: a 128th of what the pool holds, at least 2 MiB. Frees left
 * unbatched serve only their own stream, and waiting for another stream's miss left them there
 * at the peaks: multi-stream replays 1.099 / 1.075 / 1.109 (two models, loader, comm side
 * stream) against 1.084 / 1.030 / 1.060 with this, for an event query per 1/128 of the pool
 * freed (figures: docs/internals/HOT-PATH.md). */
#define ASK_MIN_BYTES ((uint64_t)2 << 20)
static inline uint64_t ask_bytes(const gpumem__pool *p) {
  uint64_t a = p->st.reserved_bytes / 128;
  return a > ASK_MIN_BYTES ? a : ASK_MIN_BYTES;
}

/* Stream-handle policy: the pool calls the backend with a stream handle only
 * during a call in which the user passed that stream (the stream may be
 * destroyed by the application right after the call returns). So the batch
 * event covering frees on S is recorded on S during a free or an alloc on S,
 * never on behalf of another stream; other streams only query events that
 * were already recorded (event_query names no stream). Blocks freed on S
 * stay unbatched in S's index (S may reuse them at once) until a call on S
 * asks: when some miss has happened since S was last harvested
 * (pool->hungry moved) or ask_bytes() were freed on S since the last ask.
 * Then completed batches of S become READY, and the unbatched blocks get an
 * event: a new batch while S has at most one pending, else they join the
 * newer of its two pending batches, whose event is recorded again after them.
 * At most two pending batches per stream: events on one stream complete in
 * order (a poll does not ask S's newer batch while its older one is pending),
 * so polling costs O(streams), and the older batch's event never moves, so it
 * completes once the device gets there however much S keeps freeing. With a
 * single batch, S's frees made while it was pending had no event until S's
 * next call after it completed: a stream that went quiet (a side stream at
 * the end of a step) kept them from the others until then, which with the
 * device behind the host held multi-stream replays at 1.121 / 1.122 / 1.187
 * (two models, loader, comm side stream; --sim-lag 64) against 1.096 / 1.038
 * / 1.154 (docs/internals/HOT-PATH.md). Blocks of a stream that is never
 * named again are recovered by a device synchronisation (trim, reset, the
 * out-of-memory and limit paths), which makes every free block of the
 * device READY. */
void gpumem__stream_touch(gpumem__pool *p, gpumem__srec *r) {
  r->sweep = p->sweeps; /* named by this call (see gpumem__srec_reap) */
  /* graph pools use no events; while a capture may be under way the stream may be the captured
   * one, and an event recorded in a capture cannot be asked (its blocks wait for the next call or
   * a device synchronisation) */
  if (r->idx->nblocks == 0 || !p->ctx->has_events || p->graph || gpumem__capturing(p->ctx)) return;
  if (p->scount < 2 && p->hungry == 0) { /* one stream so far: a mark, the blocks stay */
    if (!r->has_mark) mark_record(p, r);
    return;
  }
  if (r->has_mark) mark_drop(p, r); /* the batch below gets a newer event */
  gpumem__batch *b = r->batches;
  if (b != NULL) {
    /* no miss is waiting and little was freed since the last ask: do not ask */
    if (r->fed == p->hungry && r->unasked < ask_bytes(p)) return;
    r->unasked = 0;
    /* the older one first: a stream's events complete in order */
    gpumem__batch *old = b->snext != NULL ? b->snext : b;
    int done = 0;
    if (old->has_ev && gpumem__be_event_query(p->ctx, p->device, old->ev, &done) == GPUMEM_OK && done) {
      batch_complete(p, old);
      done = 0;
      if (old != b && b->has_ev && gpumem__be_event_query(p->ctx, p->device, b->ev, &done) == GPUMEM_OK && done)
        batch_complete(p, b);
    }
    b = r->batches;
    if (b != NULL && b->snext != NULL) {
      /* both pending: the newer one takes these frees too, its event recorded again after them */
      if (b->has_ev && gpumem__be_event_record(p->ctx, p->device, b->ev, r->stream) == GPUMEM_OK)
        gpumem__drain_to(p, r->idx, b->idx);
      return;
    }
  }
  if (gpumem__harvest(p, r, 1) != NULL) {
    r->fed = p->hungry;
    r->unasked = 0;
  }
}

/* pool_pending_blocks: 1 when some free block is not READY yet (in a pending batch, or unbatched in its
 * stream's index); pool_pending: that, or READY holds blocks whose stream work may be pending (a
 * single-stream pool's "dirty" READY). */
int gpumem__pool_pending_blocks(const gpumem__pool *p) {
  if (p->npending > 0 || p->orphans->nblocks > 0) return 1;
  for (const gpumem__srec *r = p->sfirst; r != NULL; r = r->onext)
    if (r->idx->nblocks > 0) return 1;
  return 0;
}

static int pool_pending(const gpumem__pool *p) {
  return p->dirty || p->ndeferred > 0 || gpumem__pool_pending_blocks(p);
}

/* Single-stream expandable pools ("solo"). Once an expandable pool has
 * seen SOLO_WARM_FREES frees on one stream S and no other stream (before
 * that, frees get their events as in any pool), a free on S puts the block
 * into S's index and, when the search wants it, straight into READY
 * (coalescing with every free neighbour): S may reuse it at once, and there
 * is no other stream to keep it from. A block of a small-class segment goes
 * to READY at once: keeping it in S's index first, and moving it when a
 * search wanted it, searched twice and moved every block twice, for no
 * better peaks. Larger blocks stay in S's index, where an exact fit is
 * taken back without touching the granule counts (gpumem__vm_busy is
 * linear in a block's granules, so a large block through READY costs
 * microseconds). No event is recorded or asked: in the
 * steady state of a single-stream program the pool makes no backend call at
 * all. READY is then "dirty": S's work on those blocks may still be queued,
 * which matters in two places only:
 *   - unmapping: vmseg.c calls vm_guard before it unmaps an idle chunk (to
 *     move it, trim it or give it back); the guard settles (an event recorded
 *     on S, during a call that names S, or a device synchronisation) or, when
 *     the call may not wait, refuses: then new memory is created instead of
 *     moving idle chunks (vmseg.c), or trimming stops until a later call.
 *     Plain segments (initial_bytes) are given back only once settled.
 *   - a second stream T: from then on frees go to their stream's index as in
 *     every multi-stream pool, and while READY is dirty T takes READY blocks
 *     only from segments opened since (quarantine); the next call on S
 *     records the settle event, and once it completed (asked at T's calls)
 *     or after any device synchronisation READY is clean again.
 * Replays (gpumem-replay --sample-used, sim): the same or lower peaks than
 * harvesting S's frees into batches with events, and with a device running
 * behind the host (--sim-lag) lower, since freed blocks coalesce at once. */
static void dirty_clear(gpumem__pool *p) {
  p->dirty = 0;
  p->quarantine = 0;
  if (p->has_sev) {
    ev_put(p, p->sev);
    p->has_sev = 0;
  }
}

/* Try to make dirty READY clean, as the current call allows (g_*): an event
 * on solo_s (recorded now if the call names solo_s), waited for or asked;
 * else, if the call may wait, a device synchronisation. GPUMEM_OK when clean,
 * GPUMEM_ERR_BUSY when not now, or a backend error. */
gpumem_status gpumem__settle(gpumem__pool *p) {
  if (!p->dirty) return GPUMEM_OK;
  int on_s = p->g_named && p->g_stream == p->solo_s && p->ctx->has_events && !gpumem__capturing(p->ctx);
  if (on_s && (!p->has_sev || p->sev_seq < p->dirty_seq)) {
    gpumem_event ev = p->sev;
    if (p->has_sev || ev_get(p, &ev) == GPUMEM_OK) {
      if (gpumem__be_event_record(p->ctx, p->device, ev, p->solo_s) == GPUMEM_OK) {
        p->sev = ev;
        p->has_sev = 1;
        p->sev_seq = p->dirty_seq; /* it follows every free made READY so far */
      } else {
        if (p->has_sev) p->has_sev = 0; /* its state is unknown now */
        (void)gpumem__be_event_destroy(p->ctx, p->device, ev);
      }
    }
  }
  if (p->has_sev && p->sev_seq >= p->dirty_seq) {
    int done = 0;
    if (p->g_wait ? gpumem__be_event_synchronize(p->ctx, p->device, p->sev) == GPUMEM_OK
                  : gpumem__be_event_query(p->ctx, p->device, p->sev, &done) == GPUMEM_OK && done) {
      dirty_clear(p);
      return GPUMEM_OK;
    }
  }
  if (p->g_wait && !gpumem__capturing(p->ctx)) {
    gpumem_status st = gpumem__be_device_synchronize(p->ctx, p->device);
    if (st != GPUMEM_OK) return st;
    dirty_clear(p);
    return GPUMEM_OK;
  }
  return GPUMEM_ERR_BUSY;
}

/* The one stream's free blocks become READY now (coalescing), without an event. */
void gpumem__solo_drain(gpumem__pool *p, gpumem__srec *r) {
  gpumem__drain_to_ready(p, r->idx);
  p->dirty = 1;
  p->dirty_seq++;
}

/* vmseg.c, before it unmaps an idle chunk (gpumem__vm_set_guard). */
gpumem_status gpumem__vm_guard(void *arg) {
  gpumem__pool *p = arg;
  return p->dirty ? gpumem__settle(p) : GPUMEM_OK;
}

/* A second stream: frees are stream-ordered from now on, and the allowance of the granule map rises
 * at its several-streams rate (vmseg.c). */
static void solo_many(gpumem__pool *p) {
  p->solo = SOLO_MANY;
  gpumem__vm_several_streams(p->vm, 1);
}

/* An expandable pool's call names `stream` (solo mode, see above). */
void gpumem__solo_note_slow(gpumem__pool *p, gpumem_stream stream) {
  if (p->solo == SOLO_NONE) {
    gpumem__srec *r = gpumem__srec_get(p, stream);
    if (r == NULL) return; /* no host memory: stays undecided, frees take the usual path */
    p->solo = SOLO_WARM;
    p->solo_s = stream;
    p->solo_r = r;
    p->solo_frees = 0;
    return;
  }
  if (p->solo == SOLO_WARM) { /* a second stream before the first one's frees went without events */
    solo_many(p);
    return;
  }
  if (p->solo == SOLO_ONE) {
    solo_many(p);
    if (p->dirty) p->quarantine = 1;
    LOG(p, GPUMEM_LOG_DEBUG, "device %d: a second stream: frees are stream-ordered from now on%s", p->device,
        p->dirty ? " (READY quarantined until the first stream's work is known complete)" : "");
  }
}

/* Quarantine: the first stream's next call records the settle event; every call asks it. */
void gpumem__quarantine_step(gpumem__pool *p, gpumem_stream stream, int named) {
  guard_ctx(p, stream, named, 0);
  (void)gpumem__settle(p);
}

/* Wait for every pending free of the device and make it READY: one device
 * synchronisation (no stream handle of an earlier call is used). If the
 * device cannot be synchronised, wait on the events already recorded. */
void gpumem__sync_all(gpumem__pool *p) {
  if (!pool_pending(p)) return;
  if (gpumem__capturing(p->ctx)) return; /* a device synchronisation would invalidate a capture */
  if (gpumem__be_device_synchronize(p->ctx, p->device) == GPUMEM_OK) {
    dirty_clear(p);
    if (p->ndeferred > 0) gpumem__poll_deferred(p, GPUMEM__DEFER_SYNCED);
    for (gpumem__srec *r = p->sfirst; r != NULL && p->nmarks > 0; r = r->onext)
      if (r->has_mark) mark_drop(p, r);
    while (p->pending_head != NULL) batch_complete(p, p->pending_head);
    for (gpumem__srec *r = p->sfirst; r != NULL; r = r->onext)
      if (r->idx->nblocks > 0) gpumem__drain_to_ready(p, r->idx);
    if (p->orphans->nblocks > 0) gpumem__drain_to_ready(p, p->orphans);
    return;
  }
  if (p->ndeferred > 0) gpumem__poll_deferred(p, GPUMEM__DEFER_WAIT);
  gpumem__batch *b = p->pending_head;
  while (b != NULL) {
    gpumem__batch *n = b->next;
    if (b->has_ev && gpumem__be_event_synchronize(p->ctx, p->device, b->ev) == GPUMEM_OK) batch_complete(p, b);
    b = n;
  }
  for (gpumem__srec *r = p->sfirst, *n; r != NULL && p->nmarks > 0; r = n) {
    n = r->onext;
    if (r->has_mark && gpumem__be_event_synchronize(p->ctx, p->device, r->mev) == GPUMEM_OK)
      mark_release(p, r);
  }
  if (p->dirty && p->has_sev && p->sev_seq >= p->dirty_seq &&
      gpumem__be_event_synchronize(p->ctx, p->device, p->sev) == GPUMEM_OK)
    dirty_clear(p);
}


/* ---------------------------------------------------------------------- */
/* Streams noted on live blocks (gpumem_record_stream)                     */
/*
 * A live block may be used by work on streams other than the one it is freed
 * on. Each such stream is noted on the block (gpumem__uses). Its free then
 * records one event on every noted stream other than the freeing one and
 * parks the block (a gpumem__deferred, the block in no TLSF) until every event
 * has completed, so it serves no allocation, on any stream, before the noted
 * streams' work is done. One more event is recorded on the freeing stream (the
 * stream of this call): once it has completed too, no stream's work on the
 * block is left and it goes to READY, where every stream may take it at once.
 * Without it (no event could be had), or while it is still pending, the block
 * is freed on the freeing stream as any block is (gpumem__free_place): it
 * serves that stream, and the others only after the freeing stream's next call
 * gives it an event, which for a data-loading stream's input batch (noted on
 * the main stream, freed on the loading stream) is the next step: the main
 * stream grew by the batch meanwhile (loader 1.065 of the live peak replayed
 * and live on the H200, 1.032 with the event). Noting bumps the block's state
 * by 2 (it stays live): a thread cache that remembers the block then misses
 * it, so the free takes the full path, which sees the notes (tcache.c never
 * keeps such a block).
 * The noted streams must be valid until the free: the free is the one call
 * that names them to the backend (documented with gpumem_record_stream).
 */

struct gpumem__uses {
  uint32_t n, cap;
  gpumem_stream s[];
};

struct gpumem__deferred {
  struct gpumem__deferred *next;
  gpumem__block *b;
  gpumem_stream stream; /* the freeing stream */
  uint32_t nev;         /* 0: freed while a capture may be under way, when no event may be recorded
                         * (a noted stream may be the one captured): it waits for a device synchronisation */
  int own;              /* ev[nev - 1] was recorded on the freeing stream: the block goes to READY */
  int lent;             /* its memory is mapped again under a block of the same stream (gpumem__vm_lend): its
                         * own mappings are unmapped once ev[0] completed, then it is READY */
  gpumem_event ev[];
};

uint64_t gpumem__srec_pending_bytes(const gpumem__srec *r) {
  uint64_t n = r->idx->bytes;
  for (const gpumem__batch *bt = r->batches; bt != NULL; bt = bt->snext) n += bt->idx->bytes;
  return n;
}

void gpumem__pool_inflight(const gpumem__pool *p, const gpumem__srec *r, uint64_t *own, uint64_t *other,
                           uint64_t *noted) {
  uint64_t o = 0, t = 0, n = 0;
  for (const gpumem__srec *s = p->sfirst; s != NULL; s = s->onext) {
    if (s == r) o += gpumem__srec_pending_bytes(s);
    else t += gpumem__srec_pending_bytes(s);
  }
  t += p->orphans->bytes;
  for (const gpumem__deferred *d = p->deferred; d != NULL; d = d->next)
    if (!d->lent) n += d->b->size; /* (a lent block's memory is in use under another block) */
  *own = o;
  *other = t;
  *noted = n;
}

static const char *blocks_word(uint64_t n) { return n == 1 ? "block" : "blocks"; }

void gpumem__pool_pending_describe(const gpumem__pool *p, char *buf, size_t cap) {
  if (cap == 0) return;
  buf[0] = '\0';
  size_t at = 0, nstreams = 0, listed = 0;
  uint64_t more_bytes = 0, more_blocks = 0;
  for (const gpumem__srec *r = p->sfirst; r != NULL; r = r->onext) {
    uint64_t nb = r->idx->nblocks;
    for (const gpumem__batch *bt = r->batches; bt != NULL; bt = bt->snext) nb += bt->idx->nblocks;
    if (nb == 0) continue;
    uint64_t bytes = gpumem__srec_pending_bytes(r);
    if (nstreams++ < GPUMEM__PENDING_LISTED) {
      gpumem__bappend(buf, cap, &at, "%s%llu bytes in %llu %s on ", listed++ == 0 ? "" : ", ", (unsigned long long)bytes,
          (unsigned long long)nb, blocks_word(nb));
      if (r->stream == NULL) gpumem__bappend(buf, cap, &at, "the default stream");
      else gpumem__bappend(buf, cap, &at, "stream %p", r->stream);
    } else {
      more_bytes += bytes;
      more_blocks += nb;
    }
  }
  if (nstreams > listed)
    gpumem__bappend(buf, cap, &at, ", %llu bytes in %llu %s on %zu more stream(s)", (unsigned long long)more_bytes,
        (unsigned long long)more_blocks, blocks_word(more_blocks), nstreams - listed);
  /* then the frees no stream's own event releases */
  uint64_t nbytes = 0, nblocks = 0;
  for (const gpumem__deferred *d = p->deferred; d != NULL; d = d->next)
    if (!d->lent) { /* (a lent block's memory is in use under another block) */
      nbytes += d->b->size;
      nblocks++;
    }
  if (nblocks > 0)
    gpumem__bappend(buf, cap, &at, "%s%llu bytes in %llu %s waiting for streams noted by gpumem_record_stream",
        at == 0 ? "" : ", ", (unsigned long long)nbytes, (unsigned long long)nblocks, blocks_word(nblocks));
  if (p->orphans->nblocks > 0)
    gpumem__bappend(buf, cap, &at, "%s%llu bytes in %llu %s of streams not named lately (until a device synchronisation)",
        at == 0 ? "" : ", ", (unsigned long long)p->orphans->bytes, (unsigned long long)p->orphans->nblocks,
        blocks_word(p->orphans->nblocks));
  if (at == 0) gpumem__bappend(buf, cap, &at, "none");
}

gpumem_status gpumem__pool_record_stream(gpumem__pool *p, void *ptr, gpumem_stream stream) {
  gpumem_status st = GPUMEM_OK;
  uintptr_t key = (uintptr_t)ptr;
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *sh = gpumem__ptrmap_shard_of(&p->ctx->map, h);
  gpumem__mutex_lock(&p->lock);
  gpumem__ptrmap_lock(sh);
  gpumem__ptrmap_entry *e = gpumem__ptrmap_find(sh, key, h);
  gpumem__block *b = e != NULL && e->pool == p ? e->block : NULL;
  uint64_t state = b != NULL ? atomic_load_explicit(&b->state, memory_order_acquire) : 1u;
  if ((state & 1u) != 0) { /* absent, another pool's, or in a thread cache: not live */
    st = GPUMEM_ERR_INVALID_POINTER;
    goto out;
  }
  gpumem__uses *u = b->uses;
  for (uint32_t i = 0; u != NULL && i < u->n; i++)
    if (u->s[i] == stream) goto out; /* noted already */
  if (u == NULL || u->n == u->cap) {
    uint32_t cap = u == NULL ? 2 : u->cap * 2;
    gpumem__uses *nu = gpumem__realloc(u, sizeof *nu + cap * sizeof nu->s[0]);
    if (nu == NULL) {
      st = GPUMEM_ERR_OUT_OF_MEMORY;
      goto out;
    }
    if (u == NULL) nu->n = 0;
    nu->cap = cap;
    b->uses = u = nu;
  }
  u->s[u->n++] = stream;
  /* even -> even + 2: still live, but no thread cache's memory of it matches (see above); the
   * shard lock keeps a concurrent free's look-up and swap from passing between */
  atomic_fetch_add_explicit(&b->state, 2u, memory_order_acq_rel);
out:
  gpumem__ptrmap_unlock(sh);
  gpumem__mutex_unlock(&p->lock);
  return st;
}

/* A free of b (counted already) on `stream`, b noted on other streams: events on those, b parked.
 * Returns 1 when it is held here (parked, or with the orphans), 0 when the caller frees it at once (no other stream, or the wait was done
 * here because no event or host memory could be had). */
int gpumem__defer_free(gpumem__pool *p, gpumem__block *b, gpumem_stream stream) {
  gpumem__uses *u = b->uses;
  b->uses = NULL;
  uint32_t n = 0;
  for (uint32_t i = 0; i < u->n; i++) n += u->s[i] != stream;
  if (n == 0) {
    free(u);
    return 0;
  }
  gpumem__deferred *d = p->ctx->has_events ? gpumem__malloc(sizeof *d + (n + 1) * sizeof d->ev[0]) : NULL;
  int ok = d != NULL;
  if (ok && gpumem__capturing(p->ctx)) n = 0; /* no event, no wait now: parked until the device is synchronised */
  /* a capture the library has not met yet (none of its calls named the stream): an event recorded on a
   * stream it captures, or on the NULL stream while a blocking stream of the device captures (CUDA's
   * answer for the NULL stream covers those), would invalidate it: asked first, here only (a noted
   * free), so parked the same way while one is under way or the backend cannot answer */
  if (ok && n > 0 && p->ctx->cap_probe && gpumem__be_has_capture(p->ctx)) {
    uint64_t id = 0;
    int busy = gpumem__be_capture_quiet(p->ctx, p->device, stream, &id) != GPUMEM_CAPTURE_NONE;
    for (uint32_t i = 0; !busy && i < u->n; i++)
      busy = u->s[i] != stream && gpumem__be_capture_quiet(p->ctx, p->device, u->s[i], &id) != GPUMEM_CAPTURE_NONE;
    if (busy) n = 0;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; ok && n > 0 && i < u->n; i++) {
    if (u->s[i] == stream) continue;
    if (ev_get(p, &d->ev[k]) != GPUMEM_OK) {
      ok = 0;
      break;
    }
    if (gpumem__be_event_record(p->ctx, p->device, d->ev[k], u->s[i]) != GPUMEM_OK) {
      (void)gpumem__be_event_destroy(p->ctx, p->device, d->ev[k]);
      ok = 0;
      break;
    }
    k++;
  }
  free(u);
  if (!ok) {
    /* no event or no host memory: wait for the device here, then b is free as usual; if the device
     * cannot be synchronised either (or a capture is under way, which a synchronisation would
     * invalidate), the noted streams' work may still be running: b is parked without events until a
     * device synchronisation succeeds, or, with no host memory for that, waits with the orphans,
     * which the next device synchronisation makes READY */
    if (d == NULL) { /* (no host memory: READY after a synchronisation, else with the orphans) */
      gpumem__place_unrecorded(p, b);
      return 1;
    }
    for (uint32_t i = 0; i < k; i++) ev_put(p, d->ev[i]);
    if (!gpumem__capturing(p->ctx) && gpumem__be_device_synchronize(p->ctx, p->device) == GPUMEM_OK) {
      free(d);
      return 0;
    }
    k = 0;
    n = 0;
  }
  d->own = 0;
  if (n > 0 && ev_get(p, &d->ev[k]) == GPUMEM_OK) { /* the freeing stream's work, up to this free */
    if (gpumem__be_event_record(p->ctx, p->device, d->ev[k], stream) == GPUMEM_OK) {
      k++;
      d->own = 1;
    } else {
      (void)gpumem__be_event_destroy(p->ctx, p->device, d->ev[k]);
    }
  }
  d->nev = k;
  d->lent = 0;
  d->b = b;
  d->stream = stream;
  d->next = p->deferred;
  p->deferred = d;
  p->ndeferred++;
  b->idx = &p->deferred_set;
  return 1;
}

gpumem__deferred *gpumem__lend_begin(gpumem__pool *p, gpumem_stream stream) {
  gpumem__deferred *d = gpumem__malloc(sizeof *d + sizeof d->ev[0]);
  if (d == NULL) return NULL;
  if (ev_get(p, &d->ev[0]) != GPUMEM_OK) {
    free(d);
    return NULL;
  }
  if (gpumem__be_event_record(p->ctx, p->device, d->ev[0], stream) != GPUMEM_OK) {
    (void)gpumem__be_event_destroy(p->ctx, p->device, d->ev[0]);
    free(d);
    return NULL;
  }
  d->nev = 1;
  d->own = 0;
  d->lent = 1;
  d->b = NULL;
  d->stream = stream;
  return d;
}

gpumem__deferred *gpumem__park_rec_new(gpumem__pool *p) {
  gpumem__deferred *d = p->park_spare;
  if (d != NULL) p->park_spare = d->next;
  else d = gpumem__malloc(sizeof *d);
  if (d == NULL) return NULL;
  d->nev = 0; /* no event: a device synchronisation (DEFER_SYNCED) lets it go */
  d->own = 0;
  d->lent = 1;
  d->b = NULL;
  d->stream = NULL;
  return d;
}

void gpumem__lend_cancel(gpumem__pool *p, gpumem__deferred *d) {
  ev_put(p, d->ev[0]);
  free(d);
}

void gpumem__lend_park(gpumem__pool *p, gpumem__deferred *d, gpumem__block *b) {
  b->uses = NULL; /* (it held the free number: a parked block is in no stream's fidx, and a reset takes it for live) */
  d->b = b;
  d->next = p->deferred;
  p->deferred = d;
  p->ndeferred++;
  b->idx = &p->deferred_set;
}

/* Parked frees whose events all completed are freed on their stream: asked (DEFER_POLL), waited
 * for (DEFER_WAIT), or known complete since the device was synchronised (DEFER_SYNCED, the only
 * way a free parked without events completes). */
void gpumem__poll_deferred(gpumem__pool *p, int how) {
  gpumem__deferred **pp = &p->deferred;
  while (*pp != NULL) {
    gpumem__deferred *d = *pp;
    if (d->nev == 0 && how != GPUMEM__DEFER_SYNCED) {
      pp = &d->next;
      continue;
    }
    const int wait = how == GPUMEM__DEFER_WAIT;
    /* the noted streams' events must have completed; the freeing stream's (last) only decides
     * where the block goes */
    const uint32_t noted = d->nev - (uint32_t)d->own;
    uint32_t i = how == GPUMEM__DEFER_SYNCED ? d->nev : 0;
    for (; i < d->nev; i++) {
      int done = 0;
      if (wait ? gpumem__be_event_synchronize(p->ctx, p->device, d->ev[i]) != GPUMEM_OK
               : gpumem__be_event_query(p->ctx, p->device, d->ev[i], &done) != GPUMEM_OK || !done)
        break;
    }
    if (i < noted) {
      pp = &d->next;
      continue;
    }
    const int all = i == d->nev;
    for (i = 0; i < d->nev; i++) ev_put(p, d->ev[i]);
    if (d->lent && gpumem__vm_unlend(d->b->seg->vm, d->b->addr, d->b->size) != GPUMEM_OK) {
      d->nev = 0; /* an unmap failed: kept (its range unusable) until a device synchronisation tries again */
      pp = &d->next;
      continue;
    }
    *pp = d->next;
    p->ndeferred--;
    d->b->idx = NULL;
    if (d->lent || (all && d->own)) insert_coalesce(p, p->ready, d->b); /* every stream's work on it has completed */
    else gpumem__free_place(p, d->b, d->stream, 0);       /* its stream's own; 0: no backend call with it now */
    free(d);
  }
}

int gpumem__deferred_lent(const gpumem__pool *p, const gpumem__block *b) {
  for (const gpumem__deferred *d = p->deferred; d != NULL; d = d->next)
    if (d->b == b) return d->lent;
  return 0;
}

/* Reset and destroy: parked frees are dropped with every other block. A lent range whose unmap fails
 * again stays aliased: its record is kept (park_spare) for gpumem__vm_keep_seg to park the range with,
 * so that no host memory is needed then (none may be left). */
void gpumem__deferred_clear(gpumem__pool *p) {
  while (p->deferred != NULL) {
    gpumem__deferred *d = p->deferred;
    p->deferred = d->next;
    for (uint32_t i = 0; i < d->nev; i++) (void)gpumem__be_event_destroy(p->ctx, p->device, d->ev[i]);
    const int aliased = d->lent && gpumem__vm_unlend(d->b->seg->vm, d->b->addr, d->b->size) != GPUMEM_OK; /* before the chunks go */
    d->b->idx = NULL;
    if (aliased) {
      d->next = p->park_spare;
      p->park_spare = d;
    } else {
      free(d);
    }
  }
  p->ndeferred = 0;
}

size_t gpumem__park_spare_fill(gpumem__pool *p, size_t k) {
  size_t have = 0;
  for (gpumem__deferred *d = p->park_spare; d != NULL && have < k; d = d->next) have++;
  for (; have < k; have++) {
    gpumem__deferred *d = gpumem__malloc(sizeof *d);
    if (d == NULL) break;
    d->next = p->park_spare;
    p->park_spare = d;
  }
  return have;
}

void gpumem__park_spare_free(gpumem__pool *p) {
  while (p->park_spare != NULL) {
    gpumem__deferred *d = p->park_spare;
    p->park_spare = d->next;
    free(d);
  }
}
