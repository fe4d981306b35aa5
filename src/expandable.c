/* expandable.c: placement in expandable virtual-memory segments (the pool side; the
 * granule map and chunk mapping are vmseg.c). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* Expandable segments (pool side; the granule map is vmseg.c)             */
/*
 * In this mode (p->vm != NULL) each size class gets one SEG_VM segment: a
 * reserved range (twice the device total) laid out by the same blocks,
 * fidx and TLSF as plain segments; the range starts as one READY block.
 * A granule is mapped while a live or not-yet-READY block overlaps it
 * (vmseg.c counts those "busy" bytes: take() adds them for blocks taken
 * from READY, insert_coalesce() removes them for blocks entering READY).
 * Physical memory comes in chunks of up to 8 MiB (64 MiB inside blocks of
 * 512 MiB and more), one backend create and one map per chunk (one granule
 * each for a while after the device ran short of memory: then every idle
 * granule can be given back). Free mapped memory stays mapped ("idle", cached); new
 * chunks are created while that keeps the reserved bytes within their peak,
 * and beyond it idle chunks are moved to where a block needs memory, or
 * given back to make room, so the peak grows only when nothing idle is
 * left. Trim and the release threshold unmap idle chunks, also inside
 * segments that still hold live blocks. Only READY memory is ever unmapped:
 * blocks whose stream work may be pending are busy.
 */

/* Granules of [b->addr, b->addr + rsize) still to map (0 for plain segments). */
static size_t vm_need(const gpumem__block *b, size_t rsize) {
  return b->seg->kind == SEG_VM ? gpumem__vm_unmapped(b->seg->vm, b->addr, rsize) : 0;
}

/* 1 when a block of rsize at the end of READY block b would cost less
 * (gpumem__vm_place_cost: granules that nothing busy touches yet, and
 * unmapped ones) than one at its start. */
static int vm_fresh_end_better(const gpumem__block *b, size_t rsize) {
  if (b->seg->kind != SEG_VM) return 0;
  return gpumem__vm_place_cost(b->seg->vm, b->addr + b->size - rsize, rsize, SIZE_MAX) <
         gpumem__vm_place_cost(b->seg->vm, b->addr, rsize, SIZE_MAX);
}

/* Like take(), for a READY block of an expandable segment, but the block is
 * cut from the end of b (which stays READY, smaller). One block must be reserved. */
static gpumem__block *vm_take_end(gpumem__pool *p, gpumem__block *b, size_t rsize) {
  idx_remove(p, b);
  gpumem__block *t = block_split(p, b, b->size - rsize);
  idx_insert(p, p->ready, b);
  gpumem__vm_busy(t->seg->vm, t->addr, rsize, +1);
  return t;
}

/* Like take(), for READY block b of an expandable segment, at addr inside it: the part before addr is
 * cut off and stays READY, then take() takes the block from the rest. Two blocks must be reserved. */
static gpumem__block *vm_take_at(gpumem__pool *p, gpumem__block *b, uintptr_t addr, size_t rsize) {
  if (addr > b->addr) {
    gpumem__fidx *f = b->idx;
    idx_remove(p, b);
    gpumem__block *r = block_split(p, b, addr - b->addr);
    idx_insert(p, f, b);
    idx_insert(p, f, r);
    b = r;
  }
  take(p, b, rsize);
  return b;
}

/* Placement in expandable segments: among up to VM_CANDIDATES free blocks
 * of each searched fidx that fit (from the request's own bucket upwards),
 * the one whose start (or, for READY blocks, end) costs least: granules
 * that nothing busy touches yet count once, unmapped ones twice (they need
 * backend calls, or new memory; gpumem__vm_place_cost); ties: the smaller
 * block, then the lower address. This stream's own free blocks are busy, so
 * they score well. */
/* Few candidates: more of them raise the replays' peaks and the backend calls (the search
 * favours blocks that are cheap to map now over better fits), fewer move more chunks
 * (docs/internals/HOT-PATH.md). */
#define VM_CANDIDATES 4
#define VM_SKIP_MAX 32 /* smaller blocks passed over in the request's own bucket */

/* The search's state: the request, and the best candidate so far. */
typedef struct vm_pick {
  size_t rsize;
  int rcls, fl0, sl0; /* the request's class and TLSF bucket */
  int clean_only;
  gpumem__block *best;
  size_t fresh;       /* its cost (SIZE_MAX while best is NULL) */
  int start_free;     /* its start costs nothing: no granule of [addr, addr + rsize) is unmapped */
} vm_pick;

/* Smallest size (bytes) of a block in TLSF bucket (fl, sl) (see tlsf_map_units). */
static inline size_t tlsf_bucket_min(int fl, int sl) {
  uint64_t u = fl == 0 ? (uint64_t)sl : (uint64_t)(TLSF_SL + sl) << (fl - 1);
  return (size_t)(u << 8);
}

/* One fidx. Returns 1 when the best can not be beaten (an exact fit that
 * touches no new granule): the search stops there. Costs are counted only
 * up to the best so far (a candidate costing more loses anyway), and not at
 * all for a candidate that can not win even at cost 0. A block that is not
 * READY is busy (every granule it touches has busy bytes, hence is mapped),
 * so placing at its start costs 0: only READY blocks are scored (ready = 1).
 * Candidates are visited, counted and skipped exactly as by a full scoring
 * of each; what is left out changes nothing in the result: a later bucket
 * of the last class that holds candidates is not visited once the best
 * costs 0 and is smaller than any block there. */
static inline __attribute__((always_inline)) int vm_consider_(gpumem__fidx *f, vm_pick *k, const int ready) {
  const size_t rsize = k->rsize;
  const int fl0 = k->fl0, clean_only = k->clean_only;
  const uint64_t flmask = ~(uint64_t)0 << fl0;
  gpumem__block *best = k->best;
  size_t fresh = k->fresh;
  int start_free = k->start_free, ret = 0;
  int seen = 0, skipped = 0;
  for (int ci = 0; ci < 2 && seen < VM_CANDIDATES; ci++) {
    gpumem__tlsf *t = &f->t[ci == 0 ? k->rcls : CLS_MIXED];
    if ((t->fl_bitmap & flmask) == 0) continue; /* bitmaps: no empty bin is visited */
    /* no class after this one has candidates: the counters matter no more once this one is left */
    const int last = ci == 1 || (f->t[CLS_MIXED].fl_bitmap & flmask) == 0;
    int fl = fl0, sl = k->sl0;
    while (seen < VM_CANDIDATES) {
      /* the next non-empty bucket from (fl, sl) on */
      unsigned sls = (unsigned)t->sl_bitmap[fl] & (~0u << sl);
      if (sls == 0) {
        uint64_t fls = t->fl_bitmap & (~(uint64_t)1 << fl);
        if (fls == 0) break;
        fl = ctz64(fls);
        sls = t->sl_bitmap[fl];
      }
      sl = __builtin_ctz(sls);
      /* every block from here on is larger than a best that costs nothing: none can win */
      if (last && fresh == 0 && tlsf_bucket_min(fl, sl) > best->size) goto out;
      int zero_here = 0;
      for (gpumem__block *b = t->heads[fl][sl]; b != NULL && seen < VM_CANDIDATES; b = b->fnext) {
        const size_t bsize = b->size;
        if (bsize < rsize || (clean_only && b->seg->solo_era)) {
          /* smaller: only in the request's own bucket, a long list of those is not walked to its end;
           * quarantine: READY of older segments may still be in use by the first stream */
          if (++skipped > VM_SKIP_MAX) break;
          continue;
        }
        seen++;
        size_t fr = 0;
        int sf = 1;
        if (best != NULL) {
          /* the order: lower cost, then the smaller block, then the lower address */
          int tie_wins = bsize < best->size || (bsize == best->size && b->addr < best->addr);
          if (fresh == 0 && !tie_wins) continue; /* loses even at cost 0 */
          if (ready && b->seg->kind == SEG_VM) {
            const gpumem__vmspace *vs = b->seg->vm;
            fr = gpumem__vm_place_cost(vs, b->addr, rsize, fresh);
            if (fr > 0) {
              sf = 0;
              size_t f2 = gpumem__vm_place_cost(vs, b->addr + bsize - rsize, rsize, fr);
              if (f2 < fr) fr = f2;
            }
          }
          if (fr > fresh || (fr == fresh && !tie_wins)) continue;
        } else if (ready && b->seg->kind == SEG_VM) {
          const gpumem__vmspace *vs = b->seg->vm;
          fr = gpumem__vm_place_cost(vs, b->addr, rsize, SIZE_MAX);
          if (fr > 0) {
            sf = 0;
            size_t f2 = gpumem__vm_place_cost(vs, b->addr + bsize - rsize, rsize, fr);
            if (f2 < fr) fr = f2;
          }
        }
        best = b;
        fresh = fr;
        start_free = sf;
        if (fr == 0) {
          if (bsize == rsize) {
            ret = 1;
            goto out;
          }
          zero_here = 1;
        }
      }
      /* a block costing nothing was found in this bucket: later buckets of
       * this class hold only larger blocks, which lose the tie */
      if (zero_here) break;
      if (++sl == TLSF_SL) {
        if (++fl == TLSF_FL) break;
        sl = 0;
      }
    }
  }
out:
  k->best = best;
  k->fresh = fresh;
  k->start_free = start_free;
  return ret;
}

static int vm_consider_ready(gpumem__fidx *f, vm_pick *k) {
  return f->nblocks == 0 ? 0 : vm_consider_(f, k, 1);
}

static int vm_consider_busy(gpumem__fidx *f, vm_pick *k) {
  return f->nblocks == 0 ? 0 : vm_consider_(f, k, 0);
}

/* The best place among this stream's free blocks (mapped) and READY ones. */
static void vm_search(gpumem__pool *p, gpumem__srec *r, vm_pick *k) {
  k->best = NULL;
  k->fresh = SIZE_MAX;
  k->start_free = 0;
  int done = 0;
  if (r != NULL) {
    done = vm_consider_busy(r->idx, k);
    for (gpumem__batch *bt = r->batches; bt != NULL && !done; bt = bt->snext) done = vm_consider_busy(bt->idx, k);
  }
  if (!done) vm_consider_ready(p->ready, k);
}

/* Large requests that would map memory also look inside READY blocks, not only at their two ends
 * (vm_search): the lowest-cost granule-aligned window of up to VM_WINDOW_BLOCKS READY blocks that
 * fit. With dynamic shapes the large blocks change size every step, and the mapped memory a freed
 * one leaves lies inside a larger free block, away from its ends: without this, the next large
 * block is placed at an end and chunks are moved to it. The scan is one pass over the granules up
 * to the highest ever mapped (gpumem__vm_best_window), made only before backend calls. */
#define VM_WINDOW_MIN ((size_t)64 << 20)
#define VM_WINDOW_BLOCKS 16
/* granules looked at per search, at most (64 GiB of address range: some tens of microseconds, a
 * driver call's worth, in the worst case; the mapped range of most pools is far smaller) */
#define VM_WINDOW_SCAN 32768

/* The READY block and start (*at) of the lowest-cost window, if any costs less than k->fresh. */
static gpumem__block *vm_window(gpumem__pool *p, const vm_pick *k, uintptr_t *at) {
  gpumem__fidx *f = p->ready;
  gpumem__block *best = NULL;
  size_t cap = k->fresh, budget = VM_WINDOW_SCAN;
  int seen = 0;
  for (int ci = 0; ci < 2 && seen < VM_WINDOW_BLOCKS; ci++) {
    if (ci == 1 && k->rcls == CLS_MIXED) break;
    gpumem__tlsf *t = &f->t[ci == 0 ? k->rcls : CLS_MIXED];
    for (int fl = k->fl0; fl < TLSF_FL && seen < VM_WINDOW_BLOCKS; fl++) {
      if (((t->fl_bitmap >> fl) & 1) == 0) continue;
      for (int sl = fl == k->fl0 ? k->sl0 : 0; sl < TLSF_SL && seen < VM_WINDOW_BLOCKS && budget > 0; sl++) {
        for (gpumem__block *b = t->heads[fl][sl]; b != NULL && seen < VM_WINDOW_BLOCKS && budget > 0; b = b->fnext) {
          if (b->size < k->rsize || b->seg->kind != SEG_VM || (k->clean_only && b->seg->solo_era)) continue;
          seen++;
          uintptr_t a = 0;
          size_t c = 0;
          if (gpumem__vm_best_window(b->seg->vm, b->addr, b->addr + b->size - k->rsize, k->rsize, cap, &budget, &a,
                                     &c)) {
            best = b;
            cap = c;
            *at = a;
          }
        }
      }
    }
  }
  return best;
}

/* A free block of the requesting stream's own serves that stream at once, but one smaller than the
 * request is passed over by vm_search, and it can not be moved or mapped elsewhere while the device
 * may still use it. With several streams and a GPU behind the host, such blocks (a large activation
 * freed on the stream, its work still queued) sit next to READY space while the request maps new
 * memory beside them. An extension places the request over one of them and the READY space on
 * either side of it: the stream reuses its own memory in order (the READY part is anyone's), and only
 * the granules of the READY part that are unmapped need memory. Looked at only before memory would
 * be mapped, among up to VM_EXT_SCAN of the stream's free blocks, largest first. */
#define VM_EXT_SCAN 64

/* The cheaper of the two ends of the window range [amin, amax] for block c (*at), in granules to map. */
static size_t vm_ext_cost(const gpumem__block *c, uintptr_t amin, uintptr_t amax, size_t rsize, uintptr_t *at) {
  const gpumem__vmspace *vs = c->seg->vm;
  size_t c1 = gpumem__vm_unmapped(vs, amax, rsize);
  *at = amax;
  if (c1 > 0 && amin != amax) {
    size_t c2 = gpumem__vm_unmapped(vs, amin, rsize);
    if (c2 < c1) {
      c1 = c2;
      *at = amin;
    }
  }
  return c1;
}

/* A READY neighbour the request may use. */
static inline int vm_ext_ready(const gpumem__pool *p, const gpumem__block *q, const vm_pick *k) {
  return q != NULL && q->idx == p->ready && !(k->clean_only && q->seg->solo_era);
}

/* One of the stream's free fidx: the best extension that maps fewer than *cap granules. */
static void vm_extend_idx(gpumem__pool *p, gpumem__fidx *f, const vm_pick *k, size_t *cap, int *budget,
                          gpumem__block **best, uintptr_t *at) {
  if (f->nblocks == 0) return;
  const size_t rsize = k->rsize;
  for (int ci = 0; ci < 2 && *budget > 0 && *cap > 0; ci++) {
    if (ci == 1 && k->rcls == CLS_MIXED) break;
    gpumem__tlsf *t = &f->t[ci == 0 ? k->rcls : CLS_MIXED];
    for (int fl = k->fl0; fl >= 0 && *budget > 0 && *cap > 0; fl--) {
      if (((t->fl_bitmap >> fl) & 1) == 0) continue;
      for (int sl = fl == k->fl0 ? k->sl0 : TLSF_SL - 1; sl >= 0 && *budget > 0 && *cap > 0; sl--) {
        for (gpumem__block *c = t->heads[fl][sl]; c != NULL && *budget > 0 && *cap > 0; c = c->fnext) {
          if (c->size >= rsize || c->seg->kind != SEG_VM) continue; /* larger ones: vm_search */
          (*budget)--;
          uintptr_t lo = c->addr, hi = c->addr + c->size;
          if (vm_ext_ready(p, c->prev, k)) lo = c->prev->addr;
          if (vm_ext_ready(p, c->next, k)) hi = c->next->addr + c->next->size;
          if (hi - lo < rsize) continue;
          /* windows that cover c: [amin, amax] (hi - lo >= rsize > c->size: neither wraps) */
          const uintptr_t cend = c->addr + c->size;
          uintptr_t amin = cend - lo < rsize ? lo : cend - rsize;
          uintptr_t amax = hi - rsize < c->addr ? hi - rsize : c->addr;
          uintptr_t a = 0;
          size_t cost = vm_ext_cost(c, amin, amax, rsize, &a);
          if (cost < *cap) {
            *cap = cost;
            *best = c;
            *at = a;
          }
        }
      }
    }
  }
}

/* The stream's free block to extend and the window's start (*at), if one maps fewer than cap granules. */
static gpumem__block *vm_extend(gpumem__pool *p, gpumem__srec *r, const vm_pick *k, size_t cap, uintptr_t *at) {
  gpumem__block *best = NULL;
  int budget = VM_EXT_SCAN;
  vm_extend_idx(p, r->idx, k, &cap, &budget, &best, at);
  for (gpumem__batch *bt = r->batches; bt != NULL; bt = bt->snext) vm_extend_idx(p, bt->idx, k, &cap, &budget, &best, at);
  return best;
}

/* Take the extension [a, a + rsize) over free block c (of a stream fidx) and its READY neighbours:
 * the parts of them outside the window stay READY. Returns the block (in no fidx). Two blocks must
 * be reserved. */
static gpumem__block *vm_ext_take(gpumem__pool *p, gpumem__block *c, uintptr_t a, size_t rsize) {
  gpumem__vmspace *vs = c->seg->vm;
  const uintptr_t cend = c->addr + c->size, end = a + rsize;
  idx_remove(p, c);
  if (a < c->addr) { /* the end of the READY block before c */
    gpumem__block *q = c->prev;
    idx_remove(p, q);
    if (q->addr < a) {
      gpumem__block *piece = block_split(p, q, a - q->addr);
      idx_insert(p, p->ready, q);
      q = piece;
    }
    gpumem__vm_busy(vs, a, c->addr - a, +1);
    q->fseq = c->fseq;
    block_absorb_next(p, q);
    c = q;
  }
  if (end > cend) { /* the start of the READY block after c */
    gpumem__block *q = c->next;
    idx_remove(p, q);
    if (q->addr + q->size > end) idx_insert(p, p->ready, block_split(p, q, end - q->addr));
    gpumem__vm_busy(vs, cend, end - cend, +1);
    block_absorb_next(p, c);
  }
  return c;
}

/* Undo vm_ext_take: [ca, cend) back into f (the stream's fidx it came from, with its free number),
 * the rest READY again. The take freed as many blocks as it used: two are still reserved. */
static void vm_ext_undo(gpumem__pool *p, gpumem__block *b, gpumem__fidx *f, uintptr_t ca, uintptr_t cend,
                        uint64_t fseq) {
  gpumem__block *mid = b;
  if (ca > b->addr) {
    mid = block_split(p, b, ca - b->addr);
    insert_coalesce(p, p->ready, b);
  }
  if (cend < mid->addr + mid->size) insert_coalesce(p, p->ready, block_split(p, mid, cend - mid->addr));
  mid->fseq = fseq;
  insert_coalesce(p, f, mid);
}

/* Lending (gpumem__vm_lend): before the pool grows past its peak for a block of a stream with
 * several streams in the pool, the stream's own free blocks that the device may still be using
 * (its unbatched frees and pending batches, largest first, up to LEND_SCAN of them) lend their
 * chunks to it; each one that lent is parked until an event recorded on the stream now has
 * completed (gpumem__lend_park), then its old mappings are unmapped and it is READY. Only where
 * the peak would rise: below it, idle chunks move at the same cost without parking anything. */
#define LEND_SCAN 8

/* f's blocks of at least min bytes into out[0..n), largest first, keeping the n largest seen (*nout). */
static void lend_collect(gpumem__fidx *f, size_t min, gpumem__block **out, int *nout, int n) {
  if (f->nblocks == 0) return;
  for (int ci = 0; ci < CLS_COUNT; ci++) {
    gpumem__tlsf *t = &f->t[ci];
    for (int fl = TLSF_FL - 1; fl >= 0; fl--) {
      if (((t->fl_bitmap >> fl) & 1) == 0) continue;
      for (int sl = TLSF_SL - 1; sl >= 0; sl--) {
        for (gpumem__block *b = t->heads[fl][sl]; b != NULL; b = b->fnext) {
          /* buckets from the largest down: once blocks are too small, or no larger than the
           * smallest kept, later buckets hold no better ones */
          if (b->size < min || (*nout == n && out[n - 1]->size >= b->size)) goto next_class;
          if (b->seg->kind != SEG_VM) continue;
          if (*nout == n) (*nout)--;
          int k = (*nout)++;
          for (; k > 0 && out[k - 1]->size < b->size; k--) out[k] = out[k - 1];
          out[k] = b;
        }
      }
    }
  next_class:;
  }
}

/* Lend the stream's own pending memory to block t (rsize, taken, need granules unmapped, avail idle). */
static void vm_lend_own(gpumem__pool *p, gpumem__srec *r, gpumem_stream stream, gpumem__block *t, size_t rsize,
                        size_t need, size_t avail) {
  const size_t g = gpumem__vm_granularity(p->vm);
  if (need <= avail || p->st.reserved_bytes + (uint64_t)(need - avail) * g <= p->st.reserved_peak) return;
  gpumem__block *donor[LEND_SCAN];
  int nd = 0;
  lend_collect(r->idx, 2 * g, donor, &nd, LEND_SCAN);
  for (gpumem__batch *bt = r->batches; bt != NULL; bt = bt->snext) lend_collect(bt->idx, 2 * g, donor, &nd, LEND_SCAN);
  size_t want = need - avail;
  for (int i = 0; i < nd && want > 0; i++) {
    gpumem__block *f = donor[i];
    /* parked before anything is lent: once its memory is mapped under t, f must never serve again
     * until its old mappings are gone */
    gpumem__deferred *d = gpumem__lend_begin(p, stream);
    if (d == NULL) return;
    uint32_t n = gpumem__vm_lend(t->seg->vm, t->addr, rsize, f->seg->vm, f->addr, f->size, (uint32_t)want);
    if (n == 0) {
      gpumem__lend_cancel(p, d);
      continue;
    }
    idx_remove(p, f);
    gpumem__lend_park(p, d, f);
    want = n < want ? want - n : 0;
  }
}

/* Granules of the best place's start still to map (1 when there is none: a new segment is needed). */
static inline size_t vm_pick_need(const vm_pick *k) {
  if (k->best == NULL) return 1;
  return k->start_free ? 0 : vm_need(k->best, k->rsize);
}

/* A new expandable segment for class rcls, holding at least rsize bytes; *out = its (READY) block. */
static gpumem_status vm_seg_open(gpumem__pool *p, size_t rsize, int rcls, gpumem__block **out) {
  gpumem__segment *s = gpumem__calloc(1, sizeof *s);
  if (s == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  uintptr_t base = 0;
  size_t size = 0;
  gpumem_status st = gpumem__vm_space_open(p->vm, rsize, &s->vm, &base, &size);
  if (st != GPUMEM_OK) {
    free(s);
    return st;
  }
  gpumem__block *b = block_new(p);
  b->addr = base;
  b->size = size;
  b->seg = s;
  s->pool = p;
  s->base = base;
  s->size = size;
  s->cls = rcls;
  s->kind = SEG_VM;
  s->solo_era = p->solo != SOLO_MANY;
  s->head = b;
  s->next = p->segs;
  if (p->segs != NULL) p->segs->prev = s;
  p->segs = s;
  p->st.num_segments++;
  idx_insert(p, p->ready, b);
  *out = b;
  return GPUMEM_OK;
}

/* Give back idle granules while cached > keep; with keep 0 also the ranges
 * of expandable segments that are wholly free and unmapped. */
gpumem_status gpumem__vm_release_idle(gpumem__pool *p, uint64_t keep, uint64_t *released) {
  gpumem_status first = GPUMEM_OK;
  gpumem__vm_allowance_reset(p->vm); /* memory is wanted back: new memory stays within the peak again */
  if (cached_bytes(p) > keep) first = gpumem__vm_trim(p->vm, cached_bytes(p) - keep, released);
  if (keep != 0) return first;
  gpumem__segment *s = p->segs;
  while (s != NULL) {
    gpumem__segment *n = s->next;
    gpumem__block *h = s->head;
    if (s->kind == SEG_VM && h->next == NULL && h->idx == p->ready && gpumem__vm_space_mapped(s->vm) == 0) {
      gpumem_status st = gpumem__vm_space_close(s->vm);
      if (st == GPUMEM_OK) {
        idx_remove(p, h);
        block_free(p, h);
        gpumem__seg_unlink(p, s);
        p->st.num_segments--;
        free(s);
      } else if (first == GPUMEM_OK) {
        first = st;
      }
    }
    s = n;
  }
  return first;
}

/* Reset/destroy: every block is being dropped; unmap and destroy every chunk
 * and release the ranges. A segment that cannot be given back stays (with
 * what is still mapped counted) and the first error is returned. */
gpumem_status gpumem__vm_clear(gpumem__pool *p) {
  gpumem_status first = GPUMEM_OK;
  gpumem__segment *s = p->segs;
  while (s != NULL) {
    gpumem__segment *n = s->next;
    if (s->kind == SEG_VM) {
      gpumem__vm_space_clear_busy(s->vm);
      gpumem_status st = gpumem__vm_space_close(s->vm);
      if (st == GPUMEM_OK) {
        gpumem__seg_unlink(p, s);
        p->st.num_segments--;
        free(s);
      } else if (first == GPUMEM_OK) {
        first = st;
      }
    }
    s = n;
  }
  uint64_t rel = 0;
  gpumem_status st = gpumem__vm_trim(p->vm, UINT64_MAX, &rel); /* spare chunks, and a second try */
  if (first == GPUMEM_OK) first = st;
  return first;
}

/* The next block of kept segment s, after `last` (NULL: the first), at [addr, addr+size). One block must be
 * reserved. */
static gpumem__block *keep_append(gpumem__pool *p, gpumem__segment *s, gpumem__block *last, uintptr_t addr,
                                  size_t size) {
  gpumem__block *b = block_new(p);
  b->addr = addr;
  b->size = size;
  b->seg = s;
  b->prev = last;
  if (last != NULL) last->next = b;
  else s->head = b;
  return b;
}

/* A segment whose space the backend refused to give back at a reset or destroy stays in the pool as
 * free blocks (pool.c, pool_clear_locked; nothing is live in it). Where a lending's first mapping is
 * still there (its unmap failed), the memory behind it is also mapped at another range of the pool,
 * which may serve a block now: the alias range must serve none, or two blocks would share memory and
 * the pool would hand out more bytes than it holds. Each alias range is parked as a lent free with no
 * event, busy (gpumem__park_rec_new: a device synchronisation tries the unmap again, then the range is
 * READY); the ranges between them are READY. s is linked into the pool's segments. Returns 0, or -1
 * with nothing built (no host memory). */
/* The next run of adjacent alias chunks at or after `at`: one parked range each (a lending's chunks are
 * adjacent, so the records deferred_clear kept, one per lending, are enough but where an unlend
 * half succeeded). */
static int next_alias_run(gpumem__vmspace *vs, uintptr_t at, uintptr_t *a, size_t *n) {
  if (!gpumem__vm_next_alias(vs, at, a, n)) return 0;
  uintptr_t a2 = 0;
  size_t n2 = 0;
  while (gpumem__vm_next_alias(vs, *a + *n, &a2, &n2) && a2 == *a + *n) *n += n2;
  return 1;
}

size_t gpumem__vm_keep_blocks(const gpumem__segment *s) {
  /* alias ranges only shrink or split between this count and the keep: at most one per alias granule */
  return 2 * s->vm->naliased + 1;
}

int gpumem__vm_keep_seg(gpumem__pool *p, gpumem__segment *s) {
  const uintptr_t end = s->base + s->size;
  uintptr_t a = 0, last_end = s->base;
  size_t n = 0, k = 0;
  for (uintptr_t at = s->base; at < end && next_alias_run(s->vm, at, &a, &n) && a < end; at = a + n) {
    k++;
    last_end = a + n < end ? a + n : end;
  }
  /* an alias and a gap each, and the rest: from the slabs pool_clear_locked kept (as many as the pool had) */
  if (block_reserve(p, 2 * k + 1) != 0) return -1;
  /* the records: those deferred_clear kept first. With fewer than k (no host memory for more), the last
   * record parks every alias range left and the gaps between them: their mapped memory serves nothing
   * until the device synchronisation that unmaps the aliases, which is no loss of memory */
  const size_t m = gpumem__park_spare_fill(p, k);
  if (m == 0 && k > 0) return -1;
  gpumem__block *last = NULL;
  uintptr_t at = s->base;
  for (size_t i = 0; at < end;) {
    if (i == k || !next_alias_run(s->vm, at, &a, &n) || a >= end) { /* no alias left */
      a = end;
      n = 0;
    }
    if (a > at) { /* the range before the next alias, or the rest */
      last = keep_append(p, s, last, at, a - at);
      idx_insert(p, p->ready, last);
    }
    if (n == 0) break;
    if (i + 1 == m && m < k) n = last_end - a; /* the last record: to the end of the last alias range */
    if (n > end - a) n = end - a;
    last = keep_append(p, s, last, a, n);
    gpumem__vm_busy(s->vm, a, n, +1);
    i++;
    gpumem__lend_park(p, gpumem__park_rec_new(p), last); /* (from park_spare: not NULL) */
    at = a + n;
    if (i == m) k = m; /* (every alias range is parked) */
  }
  return 0;
}

/* The allocation path in expandable mode. The block comes from the cache
 * as in plain mode (this stream's free blocks, then READY; the segment's
 * READY tail always fits); then its unmapped granules get chunks. */
/* Growth waits. Before it grows past its reserved peak, a pool may wait for the device (below) so
 * that blocks still in use there become READY and coalesce. The wait stalls the host until the
 * device catches up: nothing when the device keeps up, the whole queue when it runs behind (a GPU
 * 30 ms behind, waiting once a step, made PyTorch steps 12-19 % slower on the H200, run 62). So the
 * waits may stall the host at most a 32nd of each second; past that the pool lends its stream's
 * pending chunks or grows instead, and growth happens once where the waits would come every step. */
#define GWAIT_WINDOW_NS 1000000000ull
#define GWAIT_SHARE 32

static int gwait_allowed(gpumem__pool *p, uint64_t now) {
  if (now - p->gwait_win >= GWAIT_WINDOW_NS) {
    p->gwait_win = now;
    p->gwait_ns = 0;
  }
  return p->gwait_ns * GWAIT_SHARE < GWAIT_WINDOW_NS;
}

static void gwait_spent(gpumem__pool *p, uint64_t t0) {
  uint64_t t1 = gpumem__mono_ns();
  p->gwait_ns += t1 - t0;
  if (!gwait_allowed(p, t1))
    LOG(p, GPUMEM_LOG_DEBUG,
        "device %d: waits for the device before growing stalled the host %.1f ms this second: no more until "
        "the second ends (the pool lends or grows instead)",
        p->device, (double)p->gwait_ns / 1e6);
}

gpumem_status gpumem__vm_alloc_locked(gpumem__pool *p, size_t rsize, int rcls, gpumem_stream stream,
                                     gpumem__block **out) {
  solo_note(p, stream);
  if (p->quarantine) gpumem__quarantine_step(p, stream, 1);
  /* one stream: the guard may wait before moving idle chunks, as the growth check below waits */
  guard_ctx(p, stream, 1, p->solo != SOLO_MANY);
  int clean_only = p->quarantine && stream != p->solo_s;
  gpumem__srec *r = p->solo == SOLO_ONE ? p->solo_r : srec_find(p, stream);
  if (r != NULL) r->sweep = p->sweeps; /* named by this call: its free blocks stay its own (gpumem__srec_reap) */
  size_t g = gpumem__vm_granularity(p->vm);
  int synced = 0, adopted = 0;
  vm_pick k;
  k.rsize = rsize;
  k.rcls = rcls;
  tlsf_map(rsize, &k.fl0, &k.sl0);
  for (int pass = 0;; pass++) {
  search:;
    /* a take cuts a block in up to three (vm_take_at), and an earlier pass may have used blocks */
    if (block_reserve(p, 2) != 0) return GPUMEM_ERR_OUT_OF_MEMORY;
    k.clean_only = clean_only;
    vm_search(p, r, &k);
    gpumem__block *b = k.best;
    size_t cost = k.fresh, need = vm_pick_need(&k);
    if (need > 0 || (b != NULL && b->idx != p->ready && (b->size != rsize || cost != 0))) {
      /* before mapping, or before settling for a free block of this stream's
       * own that does not fit exactly (placed where it was freed): completed
       * frees become READY (their granules idle, their space placeable
       * anywhere), and this stream's unbatched frees get their event (this
       * call names the stream). An exact fit of the stream's own, all mapped,
       * is taken at once: no event is recorded or asked (on CUDA that is
       * about a microsecond per allocation). */
      if (p->npending > 0 || p->nmarks > 0 || p->ndeferred > 0) gpumem__poll_pending(p);
      if (r != NULL && r->batches == NULL && r->idx->nblocks > 0) {
        if (p->solo == SOLO_ONE) {
          gpumem__solo_drain(p, r); /* no event: READY becomes dirty */
        } else if (p->ctx->has_events) {
          (void)gpumem__harvest(p, r, 1);
          gpumem__poll_pending(p);
        }
      }
      vm_search(p, r, &k);
      b = k.best;
      need = vm_pick_need(&k);
      if (need > 0 && p->scount > 1) p->hungry++; /* other streams: harvest at their next call */
    }
    gpumem__block *wb = NULL; /* a window inside a READY block (vm_window), at wat */
    uintptr_t wat = 0;
    if (need > 0 && b != NULL && rsize >= VM_WINDOW_MIN && (wb = vm_window(p, &k, &wat)) != NULL) {
      b = wb;
      need = gpumem__vm_unmapped(b->seg->vm, wat, rsize);
    }
    gpumem__block *xb = NULL; /* an extension of this stream's own free block (vm_extend), at xat */
    uintptr_t xat = 0;
    if (need > 0 && r != NULL && p->solo == SOLO_MANY && (xb = vm_extend(p, r, &k, need, &xat)) != NULL) {
      b = xb;
      wb = NULL;
      need = gpumem__vm_unmapped(b->seg->vm, xat, rsize);
    }
    if (b != NULL && need == 0) { /* all mapped: nothing below applies but the take */
      if (xb != NULL) b = vm_ext_take(p, xb, xat, rsize);
      else if (wb != NULL) b = vm_take_at(p, wb, wat, rsize);
      else take(p, b, rsize);
      *out = b;
      return GPUMEM_OK;
    }
    if (p->nogrow && (b == NULL || need > 0)) {
      /* the caller's thread cache flushes and asks again: its blocks, coalesced, may make the mapping
       * unneeded. (Only when new memory would be created, not when idle chunks would be moved, left
       * the caches' blocks pinning granules: on the random live set of gpumem-bench, 4.5 event calls
       * per 1000 operations against 1.5, more chunk moves, and higher replay peaks.) Before the wait
       * below: the blocks given back may make it unneeded too. */
      p->grow_blocked = 1;
      return GPUMEM_ERR_BUSY;
    }
    size_t avail = gpumem__vm_available(p->vm);
    if (b != NULL && !synced && need > avail && p->ctx->has_events && p->scount == 1 && r != NULL &&
        p->st.reserved_bytes + (uint64_t)(need - avail) * g > p->st.reserved_peak && gpumem__pool_pending_blocks(p) &&
        gwait_allowed(p, gpumem__mono_ns())) {
      /* One stream (the training-loop case), growing past the peak while
       * blocks it freed may still be in use on the device (a GPU running
       * behind the host): their chunks cannot be moved and their space is
       * split from READY. Wait for the device once, so they become READY,
       * coalesce and their chunks idle, then search again. (With several
       * streams the pool does not wait for the device, another stream's work may be long: it may
       * wait for the requesting stream alone, below.)
       * Without this wait a device running behind the host raises the peak
       * (gpumem-replay --sim-lag shows it). Steady state (no growth) never waits.
       * (Blocks a single-stream pool made READY without an event are
       * coalesced already: moving their idle chunks waits for the stream in
       * vm_guard, not here.) */
      synced = 1;
      uint64_t t0 = gpumem__mono_ns();
      gpumem__sync_all(p);
      gwait_spent(p, t0);
      r = srec_find(p, stream);
      clean_only = p->quarantine && stream != p->solo_s;
      goto search;
    }
    if (b != NULL && !adopted && need > 0 && p->scount > 1 && p->ctx->opt.stream_deps &&
        gpumem__be_has_stream_wait(p->ctx) &&
        p->st.reserved_bytes + (uint64_t)need * g > p->st.reserved_peak && p->npending > 0) {
      /* With stream_deps (GPUMEM_STREAM_DEPS=1), several streams, the request past what is held
       * free and mapped (new memory, or idle chunks moved here) while other streams' frees are
       * pending: this stream takes them, its later work ordered on the device after theirs (no host
       * wait), and searches again. Growing past the peak even with every idle chunk moved here, it
       * takes enough to make up the difference; otherwise only the one pending block the request
       * fits in (the rest of its batch left), served where it lies: no chunk moves, and no idle
       * chunk goes (a chunk moves whole only to a run of its own length, the others are given back
       * and new ones made, the difference lost: with the device behind, warm replays crept past
       * the peak by it, comm 64 events behind from 1.031 to 1.144 over 12 passes; figures in
       * docs/PERFORMANCE.md). The device, not the host, pays where the other stream's work is
       * long; never a steady state that fits in what is free and mapped. Off by default: the
       * stream-order contract serves another stream's frees only once their work has completed. */
      adopted = 1;
      gpumem__srec *t = r != NULL ? r : gpumem__srec_get(p, stream);
      const int grows = need > avail;
      uint64_t got = t == NULL ? 0
                     : grows   ? gpumem__adopt_pending(p, t, (uint64_t)(need - avail) * g, 0, rcls)
                               : gpumem__adopt_pending(p, t, 0, rsize, rcls);
      if (got > 0)
        LOG(p, GPUMEM_LOG_DEBUG,
            "device %d: stream %p took %.1f MiB other streams freed, ordered after their work on the device, "
            "%s",
            p->device, (void *)stream, (double)got / (double)MiB,
            grows ? "before growing past the reserved peak" : "instead of moving idle chunks");
      r = srec_find(p, stream); /* (the poll may have made blocks READY and merged b: search again) */
      goto search;
    }
    uint64_t own = 0; /* (bytes of this stream's frees in flight, when it is worth asking) */
    if (b != NULL && !synced && need > avail && p->scount > 1 && r != NULL && r->batches != NULL &&
        p->st.reserved_bytes + (uint64_t)(need - avail) * g > p->st.reserved_peak &&
        (own = gpumem__srec_pending_bytes(r)) >= (uint64_t)(need - avail) * g && gwait_allowed(p, gpumem__mono_ns())) {
      /* Several streams, growing past the peak by no more than this stream's own frees still in
       * flight hold: wait for this stream (one event, not the device: other streams' work may be
       * long) so that they become READY and their chunks can move here. Waiting when they hold less
       * saved less than it cost in moves: replays with the device 64-256 events behind,
       * docs/internals/HOT-PATH.md. A steady state that does not grow never waits. */
      synced = 1;
      uint64_t t0 = gpumem__mono_ns();
      int waited = gpumem__sync_stream(p, r);
      gwait_spent(p, t0);
      if (waited) {
        LOG(p, GPUMEM_LOG_DEBUG,
            "device %d: waited for stream %p before growing past the reserved peak: %.1f MiB it freed were "
            "still in use on the device",
            p->device, (void *)stream, (double)own / (double)MiB);
        r = srec_find(p, stream);
        goto search;
      }
    }
    if (b == NULL) {
      gpumem_status st = vm_seg_open(p, rsize, rcls, &b);
      if (st != GPUMEM_OK) return st;
      need = vm_need(b, rsize);
    }
    gpumem_status st = GPUMEM_OK;
    if (need > avail && p->limit != 0 &&
        p->st.reserved_bytes + gpumem__pool_others(p) + (uint64_t)(need - avail) * g > p->limit) {
      st = GPUMEM_ERR_LIMIT_EXCEEDED; /* refused before anything is mapped */
    } else {
      gpumem__fidx *from = b->idx;
      uint64_t held = p->st.reserved_bytes, peak0 = p->st.reserved_peak;
      const uintptr_t xa = b->addr, xend = b->addr + b->size; /* the extended block, for the undo */
      const uint64_t xseq = b->fseq;
      if (xb != NULL) {
        b = vm_ext_take(p, xb, xat, rsize);
      } else if (wb != NULL) {
        b = vm_take_at(p, wb, wat, rsize);
      } else if (need > 0 && b->idx == p->ready && b->size > rsize && vm_fresh_end_better(b, rsize)) {
        b = vm_take_end(p, b, rsize); /* at the end it shares more granules with busy neighbours */
        need = vm_need(b, rsize);
      } else {
        take(p, b, rsize);
      }
      if (need > 0 && r != NULL && p->solo == SOLO_MANY && !p->graph && p->ctx->has_events &&
          !gpumem__capturing(p->ctx)) {
        vm_lend_own(p, r, stream, b, rsize, need, gpumem__vm_available(p->vm)); /* (b's own idle chunks are busy now) */
        need = vm_need(b, rsize);
      }
      if (need > 0) st = gpumem__vm_commit(b->seg->vm, b->addr, rsize, gpumem__pool_limit(p));
      if (st == GPUMEM_OK) {
        /* the pool grew (new chunks): the device's free memory is looked at (a query of the driver,
         * microseconds). Idle chunks moved here take nothing more from the device: no query. */
        if (p->st.reserved_bytes > held) {
          gpumem__check_free_fraction(p);
          gpumem__peak_note(p, r, stream, rsize, peak0);
        }
        *out = b;
        return GPUMEM_OK;
      }
      /* undo: the block goes back where it came from; chunks created for it are given back */
      if (xb != NULL) vm_ext_undo(p, b, from, xa, xend, xseq);
      else insert_coalesce(p, from, b);
      if (p->st.reserved_bytes > held) {
        uint64_t rel = 0;
        (void)gpumem__vm_trim(p->vm, p->st.reserved_bytes - held, &rel);
      }
    }
    if ((st != GPUMEM_ERR_OUT_OF_MEMORY && st != GPUMEM_ERR_LIMIT_EXCEEDED) || pass > 0) return st;
    /* slow path: wait for every pending free, give back what is cached, retry once */
    gpumem__sync_all(p);
    if (st == GPUMEM_ERR_OUT_OF_MEMORY) {
      p->st.num_oom_retries++;
      uint64_t rel = 0;
      (void)gpumem__release_empty(p, 0, &rel);
      gpumem__count_trim(p, rel, "out-of-memory retry");
    }
    r = srec_find(p, stream);
    clean_only = p->quarantine && stream != p->solo_s;
  }
}

