/* pool_check.c: the pool's invariant checker (gpumem__pool_check; after every call in
 * GPUMEM_DEBUG builds). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

/* every failed check, for the tests (a GPUMEM_DEBUG build's check after a call only logs) */
static _Atomic uint64_t g_failures;
static const char *_Atomic g_last;

uint64_t gpumem__invariant_failures(const char **last) {
  if (last != NULL) *last = atomic_load_explicit(&g_last, memory_order_relaxed);
  return atomic_load_explicit(&g_failures, memory_order_relaxed);
}

/* For the tests: what the device's pools hold by the count the limit reads (gpumem__pool_others), which must
 * equal the device's reserved_bytes in gpumem_get_stats (main pool and graph pools). */
uint64_t gpumem__dev_reserved_bytes(gpumem_context *ctx, int device) {
  if (ctx == NULL || device < 0 || device >= ctx->ndev) return 0;
  return atomic_load_explicit(&ctx->dev_reserved[device], memory_order_relaxed);
}

static void failed(const char *what) {
  atomic_store_explicit(&g_last, what, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_failures, 1, memory_order_relaxed);
}

gpumem_status gpumem__vm_check_seg(gpumem__pool *p, gpumem__segment *s) {
  if (gpumem__vm_check_begin(s->vm) != 0) return GPUMEM_OK; /* no host memory to check with */
  for (gpumem__block *b = s->head; b != NULL; b = b->next)
    if (b->idx == NULL || b->idx->kind != IDX_READY)
      gpumem__vm_check_add(s->vm, b->addr, b->size, b->idx == &p->deferred_set && gpumem__deferred_lent(p, b));
  const char *why = gpumem__vm_check_end(s->vm);
  if (why == NULL) return GPUMEM_OK;
  failed(why); /* (a literal: it outlives the call) */
  LOG(p, GPUMEM_LOG_ERROR, "invariant violated (device %d): expandable segment at %p: %s", p->device,
      (void *)s->base, why);
  return GPUMEM_ERR_INTERNAL;
}

/* ---------------------------------------------------------------------- */
/* Invariant checker                                                       */

#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) {                                                        \
      failed(#cond);                                                      \
      LOG(p, GPUMEM_LOG_ERROR, "invariant violated (device %d): %s", p->device, #cond); \
      return GPUMEM_ERR_INTERNAL;                                         \
    }                                                                     \
  } while (0)

static gpumem_status check_fidx(gpumem__pool *p, gpumem__fidx *f, int kind, size_t *seen) {
  CHECK(f->kind == kind);
  size_t n = 0;
  uint64_t bytes = 0;
  for (int c = 0; c < CLS_COUNT; c++) {
    gpumem__tlsf *t = &f->t[c];
    for (int fl = 0; fl < TLSF_FL; fl++) {
      CHECK(((t->fl_bitmap >> fl) & 1u) == (t->sl_bitmap[fl] != 0));
      for (int sl = 0; sl < TLSF_SL; sl++) {
        CHECK(((t->sl_bitmap[fl] >> sl) & 1u) == (t->heads[fl][sl] != NULL));
        gpumem__block *prev = NULL;
        for (gpumem__block *b = t->heads[fl][sl]; b != NULL; b = b->fnext) {
          int bfl, bsl;
          tlsf_map(b->size, &bfl, &bsl);
          CHECK(bfl == fl && bsl == sl);
          CHECK(b->idx == f);
          CHECK(b->fprev == prev);
          CHECK(b->seg != NULL && b->seg->cls == c);
          prev = b;
          n++;
          bytes += b->size;
        }
      }
    }
  }
  CHECK(n == f->nblocks);
  CHECK(bytes == f->bytes);
  *seen += n;
  return GPUMEM_OK;
}

static gpumem_status pool_check_locked(gpumem__pool *p, int check_map, uint64_t *live_out) {
  uint64_t reserved = 0, allocated = 0, requested = 0, live = 0, nseg = 0, empty_bytes = 0;
  size_t free_blocks = 0, ndeferred = 0;
  for (gpumem__segment *s = p->segs; s != NULL; s = s->next) {
    CHECK(s->pool == p);
    CHECK(s->next == NULL || s->next->prev == s);
    CHECK(s->head != NULL && s->head->prev == NULL && s->head->addr == s->base);
    uintptr_t at = s->base;
    for (gpumem__block *b = s->head; b != NULL; b = b->next) {
      CHECK(b->seg == s);
      CHECK(b->addr == at);
      CHECK(b->size > 0 && b->size % GPUMEM__ALIGN == 0);
      CHECK(b->next == NULL || b->next->prev == b);
      if (b->idx == &p->deferred_set) {
        ndeferred++; /* freed, waiting for noted streams: counted free, in no free set */
      } else if (b->idx == NULL) {
        live++;
        allocated += b->size;
        requested += b->requested;
        CHECK(b->requested > 0 && b->requested <= b->size);
        if (check_map) CHECK(gpumem__ptrmap_contains(&p->ctx->map, b->addr, b, p));
      } else {
        free_blocks++;
        CHECK(b->next == NULL || b->next->idx != b->idx); /* coalesced */
      }
      at += b->size;
    }
    CHECK(at == s->base + s->size);
    int whole = s->kind == SEG_PLAIN && s->head->next == NULL && s->head->idx == p->ready;
    CHECK(whole == s->empty);
    if (s->empty) empty_bytes += s->size;
    reserved += s->kind == SEG_VM ? gpumem__vm_space_mapped(s->vm) : s->size;
    if (s->kind == SEG_VM && gpumem__vm_check_seg(p, s) != GPUMEM_OK) return GPUMEM_ERR_INTERNAL;
    nseg++;
  }
  size_t empties = 0;
  for (gpumem__segment *s = p->empty; s != NULL; s = s->enext) {
    CHECK(s->empty);
    empties += s->size;
  }
  CHECK(empties == empty_bytes && empty_bytes == p->empty_bytes);
  size_t seen = 0;
  gpumem_status st = check_fidx(p, p->ready, IDX_READY, &seen);
  if (st != GPUMEM_OK) return st;
  size_t ns = 0;
  size_t in_table = 0;
  for (size_t i = 0; i < p->scap; i++) in_table += p->stab[i] != NULL;
  CHECK(in_table == p->scount);
  CHECK((p->sfirst == NULL) == (p->slast == NULL) && (p->slast == NULL || p->slast->onext == NULL));
  for (gpumem__srec *r = p->sfirst; r != NULL; r = r->onext) {
    ns++;
    CHECK(ns <= p->scount && (r->onext != NULL || r == p->slast));
    CHECK(srec_find(p, r->stream) == r);
    CHECK(r->idx->srec == r);
    st = check_fidx(p, r->idx, IDX_STREAM, &seen);
    if (st != GPUMEM_OK) return st;
    for (gpumem__batch *b = r->batches; b != NULL; b = b->snext) CHECK(b->srec == r);
  }
  CHECK(ns == p->scount);
  size_t nb = 0;
  for (gpumem__batch *b = p->pending_head; b != NULL; b = b->next) {
    nb++;
    CHECK(b->idx->batch == b);
    CHECK(b->next != NULL || p->pending_tail == b);
    st = check_fidx(p, b->idx, IDX_PENDING, &seen);
    if (st != GPUMEM_OK) return st;
  }
  CHECK(nb == p->npending);
  if (p->orphans != NULL) {
    st = check_fidx(p, p->orphans, IDX_ORPHAN, &seen);
    if (st != GPUMEM_OK) return st;
  }
  CHECK(ndeferred == p->ndeferred);
  CHECK(seen == free_blocks);
  CHECK(reserved + (p->vm != NULL ? gpumem__vm_spare_bytes(p->vm) : 0) == p->st.reserved_bytes);
  CHECK(allocated == p->st.allocated_bytes);
  /* Thread caches keep their calls' deltas until a flush: a block reused from a cache changed its
   * requested size without the pool, a cached block is live for the pool (its count catches up at the
   * flush), and the peak leaves cached blocks out (gpumem__pool_tc_peak) while allocated_bytes holds
   * them. These three are exact once the caches are flushed (gpumem__check_invariants flushes). */
  int tc_pending = p->ctx->tc_on && !check_map;
  CHECK(requested == p->st.requested_bytes || tc_pending);
  CHECK(live == p->st.num_live || tc_pending);
  CHECK(nseg == p->st.num_segments);
  CHECK(p->st.allocated_peak >= p->st.allocated_bytes || tc_pending);
  CHECK(p->st.reserved_peak >= p->st.reserved_bytes);
  /* Growth never passes the limit; a limit set below what is reserved leaves that memory in place
   * until it is freed and trimmed (gpumem_set_limit), so reserved may stay up to what it was then. */
  CHECK(p->limit == 0 || p->st.reserved_bytes <= p->limit || p->st.reserved_bytes <= p->limit_held);
  if (live_out != NULL) *live_out = live;
  return GPUMEM_OK;
}

gpumem_status gpumem__pool_check_locked(gpumem__pool *p) { return pool_check_locked(p, 0, NULL); }

gpumem_status gpumem__pool_check(gpumem__pool *p, uint64_t *live_count) {
  gpumem__mutex_lock(&p->lock);
  gpumem_status st = pool_check_locked(p, 1, live_count);
  gpumem__mutex_unlock(&p->lock);
  return st;
}
