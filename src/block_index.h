/* block_index.h: the free-block index, inline (every allocation and free runs it).
 *
 * Blocks are address-ordered within their segment (prev/next), so a block is
 * split and coalesced with its neighbours in O(1). Each free set ("fidx")
 * holds one TLSF (two-level segregated fit: bitmaps, O(1) good fit) per size
 * class. Block and fidx objects come from block_index.c.
 */
#ifndef GPUMEM_BLOCK_INDEX_H
#define GPUMEM_BLOCK_INDEX_H

#include "pool.h"

#include <string.h>

/* block_index.c: a new slab of block structs on the pool's free list (-1: no host memory) */
int gpumem__block_slab_add(gpumem__pool *p);

static inline void tlsf_map_units(uint64_t u, int *fl, int *sl) {
  if (u < TLSF_SL) {
    *fl = 0;
    *sl = (int)u;
    return;
  }
  int l = msb64(u);
  int f = l - (TLSF_SL_LOG - 1);
  if (f >= TLSF_FL) {
    *fl = TLSF_FL - 1;
    *sl = TLSF_SL - 1;
    return;
  }
  *fl = f;
  *sl = (int)((u >> (l - TLSF_SL_LOG)) & (TLSF_SL - 1));
}

/* Bucket of a block of `size` bytes (units of 256 B: 8 linear buckets, then 8 per power of two). */
static inline void tlsf_map(size_t size, int *fl, int *sl) { tlsf_map_units((uint64_t)size >> 8, fl, sl); }

static inline void tlsf_insert(gpumem__tlsf *t, gpumem__block *b) {
  int fl, sl;
  tlsf_map(b->size, &fl, &sl);
  gpumem__block *h = t->heads[fl][sl];
  b->fprev = NULL;
  b->fnext = h;
  if (h != NULL) h->fprev = b;
  t->heads[fl][sl] = b;
  t->sl_bitmap[fl] |= (uint8_t)(1u << sl);
  t->fl_bitmap |= (uint64_t)1 << fl;
}

static inline void tlsf_remove(gpumem__tlsf *t, gpumem__block *b) {
  int fl, sl;
  tlsf_map(b->size, &fl, &sl);
  if (b->fprev != NULL) b->fprev->fnext = b->fnext;
  else t->heads[fl][sl] = b->fnext;
  if (b->fnext != NULL) b->fnext->fprev = b->fprev;
  b->fprev = b->fnext = NULL;
  if (t->heads[fl][sl] == NULL) {
    t->sl_bitmap[fl] &= (uint8_t) ~(1u << sl);
    if (t->sl_bitmap[fl] == 0) t->fl_bitmap &= ~((uint64_t)1 << fl);
  }
}

/* A free block of at least size bytes, or NULL. Best fit among the first
 * TLSF_EXACT_SCAN blocks of the bucket the size falls into (its blocks that
 * fit are the tightest there are); failing that, good fit: the first
 * non-empty bucket above whose every block fits. Taking the first fit of a
 * larger bucket while the request's own bucket holds a fitting block splits
 * large blocks needlessly: on the ResNet-50 replays in plain segments that
 * raised the peak to 1.71 times the live bytes, against 1.18 with this order
 * (bert_dyn 1.33 against 1.25). */
#define TLSF_EXACT_SCAN 32
GPUMEM__POOL_LOCAL gpumem__block *tlsf_find(gpumem__tlsf *t, size_t size) {
  if (t->fl_bitmap == 0) return NULL;
  int efl, esl;
  tlsf_map(size, &efl, &esl);
  if (t->sl_bitmap[efl] & (1u << esl)) {
    gpumem__block *best = NULL;
    int n = 0;
    for (gpumem__block *b = t->heads[efl][esl]; b != NULL && n < TLSF_EXACT_SCAN; b = b->fnext, n++)
      if (b->size >= size && (best == NULL || b->size < best->size)) {
        best = b;
        if (b->size == size) break;
      }
    if (best != NULL) return best;
  }
  uint64_t u = (uint64_t)size >> 8;
  int fl, sl;
  if (u >= TLSF_SL) u += ((uint64_t)1 << (msb64(u) - TLSF_SL_LOG)) - 1; /* round up to a bucket boundary */
  tlsf_map_units(u, &fl, &sl);
  unsigned slmap = (unsigned)t->sl_bitmap[fl] & (~0u << sl);
  if (slmap == 0) {
    uint64_t flmap = fl + 1 < 64 ? t->fl_bitmap & (~(uint64_t)0 << (fl + 1)) : 0;
    if (flmap != 0) {
      fl = ctz64(flmap);
      slmap = t->sl_bitmap[fl];
    }
  }
  if (slmap != 0) {
    sl = __builtin_ctz(slmap);
    for (gpumem__block *b = t->heads[fl][sl]; b != NULL; b = b->fnext)
      if (b->size >= size) return b; /* the head, except in the last (clamped) bucket */
  }
  return NULL;
}

GPUMEM__POOL_LOCAL int block_reserve(gpumem__pool *p, size_t n) {
  size_t have = 0;
  for (gpumem__block *b = p->bfree; b != NULL && have < n; b = b->next) have++;
  for (; have < n; have += SLAB_N) /* a slab at a time: SLAB_N more blocks each */
    if (gpumem__block_slab_add(p) != 0) return -1;
  return 0;
}

/* Caller reserved one first. */
GPUMEM__POOL_LOCAL gpumem__block *block_new(gpumem__pool *p) {
  gpumem__block *b = p->bfree;
  p->bfree = b->next;
  /* every field but the state, which goes on counting (see gpumem__block): a
   * thread cache may still remember an old value and try it at any time */
  memset(b, 0, offsetof(gpumem__block, state));
  return b;
}

GPUMEM__POOL_LOCAL void block_free(gpumem__pool *p, gpumem__block *b) {
  b->idx = NULL;
  b->seg = NULL;
  b->next = p->bfree;
  p->bfree = b;
}

GPUMEM__POOL_LOCAL void seg_mark_empty(gpumem__pool *p, gpumem__segment *s) {
  if (s->empty || s->kind != SEG_PLAIN) return; /* an expandable segment is given back by vm_release_idle */
  s->empty = 1;
  s->eprev = NULL;
  s->enext = p->empty;
  if (p->empty != NULL) p->empty->eprev = s;
  p->empty = s;
  p->empty_bytes += s->size;
}

GPUMEM__POOL_LOCAL void seg_unmark_empty(gpumem__pool *p, gpumem__segment *s) {
  if (!s->empty) return;
  s->empty = 0;
  if (s->eprev != NULL) s->eprev->enext = s->enext;
  else p->empty = s->enext;
  if (s->enext != NULL) s->enext->eprev = s->eprev;
  s->eprev = s->enext = NULL;
  p->empty_bytes -= s->size;
}

static inline void idx_insert(gpumem__pool *p, gpumem__fidx *f, gpumem__block *b) {
  b->idx = f;
  tlsf_insert(&f->t[b->seg->cls], b);
  f->nblocks++;
  f->bytes += b->size;
  if (f->kind == IDX_READY && b->size == b->seg->size) seg_mark_empty(p, b->seg);
}

static inline void idx_remove(gpumem__pool *p, gpumem__block *b) {
  gpumem__fidx *f = b->idx;
  if (f->kind == IDX_READY && b->size == b->seg->size) seg_unmark_empty(p, b->seg);
  tlsf_remove(&f->t[b->seg->cls], b);
  f->nblocks--;
  f->bytes -= b->size;
  b->idx = NULL;
}

/* b takes in the block after it, which is in no fidx (its struct is freed). */
static inline void block_absorb_next(gpumem__pool *p, gpumem__block *b) {
  gpumem__block *q = b->next;
  b->size += q->size;
  b->next = q->next;
  if (q->next != NULL) q->next->prev = b;
  block_free(p, q);
}

/* Insert b (in no fidx) into f, merging with neighbours already in f. */
GPUMEM__POOL_LOCAL void insert_coalesce(gpumem__pool *p, gpumem__fidx *f, gpumem__block *b) {
  if (f->kind == IDX_READY && b->seg->kind == SEG_VM) gpumem__vm_busy(b->seg->vm, b->addr, b->size, -1);
  gpumem__block *q = b->prev;
  if (q != NULL && q->idx == f) {
    idx_remove(p, q);
    if (b->fseq > q->fseq) q->fseq = b->fseq;
    block_absorb_next(p, q);
    b = q;
  }
  q = b->next;
  if (q != NULL && q->idx == f) {
    idx_remove(p, q);
    if (q->fseq > b->fseq) b->fseq = q->fseq;
    block_absorb_next(p, b);
  }
  idx_insert(p, f, b);
}

/* Search one fidx for a block for a request of class rcls. */
GPUMEM__POOL_LOCAL gpumem__block *idx_find(gpumem__fidx *f, size_t rsize, int rcls) {
  if (f == NULL || f->nblocks == 0) return NULL;
  gpumem__block *b = tlsf_find(&f->t[rcls], rsize);
  if (b == NULL) b = tlsf_find(&f->t[CLS_MIXED], rsize);
  return b;
}

/* Cut block b (in no fidx) at offset `at` (0 < at < b->size): b keeps the first part, the
 * returned block (in no fidx either) is the rest, linked after it. One block must be reserved. */
GPUMEM__POOL_LOCAL gpumem__block *block_split(gpumem__pool *p, gpumem__block *b, size_t at) {
  gpumem__block *r = block_new(p);
  r->addr = b->addr + at;
  r->size = b->size - at;
  r->seg = b->seg;
  r->fseq = b->fseq;
  r->prev = b;
  r->next = b->next;
  if (b->next != NULL) b->next->prev = r;
  b->next = r;
  b->size = at;
  return r;
}

/* Take free block b for rsize bytes: split off the rest into b's fidx. One
 * block must be reserved. The remainder's other neighbour is never in the
 * same fidx (it would have been merged with b), so no coalescing is needed. */
GPUMEM__POOL_LOCAL void take(gpumem__pool *p, gpumem__block *b, size_t rsize) {
  gpumem__fidx *f = b->idx;
  if (f->kind == IDX_READY && b->seg->kind == SEG_VM) gpumem__vm_busy(b->seg->vm, b->addr, rsize, +1);
  idx_remove(p, b);
  if (b->size > rsize) idx_insert(p, f, block_split(p, b, rsize));
}


#endif /* GPUMEM_BLOCK_INDEX_H */
