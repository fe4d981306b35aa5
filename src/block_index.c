/* block_index.c: the free-block index's objects: slabs of block structs, free sets (fidx) and
 * their recycling, and moving a whole free set into READY. */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

int gpumem__block_slab_add(gpumem__pool *p) {
  gpumem__slab *s = gpumem__aligned_alloc(_Alignof(gpumem__slab), sizeof *s); /* the blocks' 32-byte alignment */
  if (s == NULL) return -1;
  s->next = p->slabs;
  p->slabs = s;
  for (int i = SLAB_N - 1; i >= 0; i--) {
    atomic_init(&s->blocks[i].state, 0);
    s->blocks[i].next = p->bfree;
    p->bfree = &s->blocks[i];
  }
  return 0;
}

void gpumem__fidx_clear(gpumem__fidx *f, int kind) {
  memset(f, 0, sizeof *f);
  f->kind = kind;
}

gpumem__fidx *gpumem__fidx_new(gpumem__pool *p, int kind) {
  gpumem__fidx *f = p->ffree;
  if (f != NULL) {
    p->ffree = f->next_free;
    f->kind = kind;
    f->srec = NULL;
    f->batch = NULL;
    f->next_free = NULL;
    return f; /* recycled fidx are empty: heads NULL, bitmaps 0 */
  }
  f = gpumem__malloc(sizeof *f);
  if (f == NULL) return NULL;
  gpumem__fidx_clear(f, kind);
  return f;
}

void gpumem__fidx_recycle(gpumem__pool *p, gpumem__fidx *f) {
  f->next_free = p->ffree;
  p->ffree = f;
}

/* Move every block of f into `to` (another free set: READY, a pending batch, the orphans),
 * coalescing there. The blocks go in the order of f's buckets, each bucket's list from its head;
 * f's lists are not unlinked one block at a time but dropped whole (f ends empty). */
void gpumem__drain_to(gpumem__pool *p, gpumem__fidx *f, gpumem__fidx *to) {
  for (int c = 0; c < CLS_COUNT; c++) {
    gpumem__tlsf *t = &f->t[c];
    uint64_t fls = t->fl_bitmap;
    while (fls != 0) {
      int fl = ctz64(fls);
      fls &= fls - 1;
      unsigned sls = t->sl_bitmap[fl];
      while (sls != 0) {
        int sl = __builtin_ctz(sls);
        sls &= sls - 1;
        gpumem__block *b = t->heads[fl][sl], *n;
        t->heads[fl][sl] = NULL;
        for (; b != NULL; b = n) {
          n = b->fnext; /* b's merges touch blocks of `to` only, never f's */
          b->fprev = b->fnext = NULL;
          b->idx = NULL;
          insert_coalesce(p, to, b);
        }
      }
      t->sl_bitmap[fl] = 0;
    }
    t->fl_bitmap = 0;
  }
  f->nblocks = 0;
  f->bytes = 0;
}

