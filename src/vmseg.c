/* vmseg.c: expandable virtual-memory segments, the granule map (see vmseg.h).
 *
 * Per space, per granule: the chunk handle mapped there (0 = none) and the
 * busy byte count. Mapped granules with busy == 0 are "idle" and sit on a
 * doubly linked list (indices, oldest first), so that finding a chunk to
 * move or give back is O(1). Every backend call goes through backend.c. */
#include "vmseg.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
/* the default size of a space, in multiples of the device total */
#define SPACE_TOTAL_FACTOR 2
/* a space when the backend reports no total */
#define SPACE_FALLBACK ((size_t)64 << 30)

struct gpumem__vmspace {
  gpumem__vmpool *vp;
  gpumem__vmspace *prev, *next;
  uintptr_t base;          /* aligned to the granularity */
  size_t size;
  void *raw;               /* what vm_reserve returned, and its size (for vm_release) */
  size_t raw_size;
  uint32_t n;              /* granules */
  gpumem_phys_handle *h;   /* n: chunk mapped at the granule, 0 = none */
  uint32_t *busy;          /* n: busy bytes */
  uint32_t *lprev, *lnext; /* n: idle list links */
  uint32_t ihead, itail;
  size_t nidle;
  size_t nmapped;
  uint32_t *chk;           /* invariant check scratch */
};

struct gpumem__vmpool {
  gpumem_context *ctx;
  int dev;
  size_t gran;
  uint64_t total;
  gpumem_stats *st;
  gpumem__vmspace *spaces;
  size_t nidle;            /* over all spaces */
  gpumem_phys_handle *spare;
  size_t nspare, capspare;
};

#define LOG(vp, lvl, ...) gpumem__log(&(vp)->ctx->opt.log, (lvl), __VA_ARGS__)

static void space_free(gpumem__vmspace *vs);

/* ---------------------------------------------------------------------- */
/* Pool                                                                    */

gpumem__vmpool *gpumem__vm_pool_new(gpumem_context *ctx, int device, uint64_t total, gpumem_stats *st) {
  if (!ctx->opt.expandable || !gpumem__be_has_vm(ctx)) return NULL;
  size_t g = 0;
  if (gpumem__be_vm_granularity(ctx, device, &g) != GPUMEM_OK) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "device %d: no virtual memory: plain segments", device);
    return NULL;
  }
  /* a power of two that keeps blocks 256-aligned and fits the busy counters */
  if (g < 256 || (g & (g - 1)) != 0 || g > ((size_t)1 << 31)) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "device %d: vm granularity %zu unusable: plain segments", device, g);
    return NULL;
  }
  gpumem__vmpool *vp = calloc(1, sizeof *vp);
  if (vp == NULL) return NULL;
  vp->ctx = ctx;
  vp->dev = device;
  vp->gran = g;
  vp->total = total;
  vp->st = st;
  return vp;
}

void gpumem__vm_pool_free(gpumem__vmpool *vp) {
  if (vp == NULL) return;
  /* last tries for what the pool could not give back (logged by backend.c if they fail) */
  for (size_t i = 0; i < vp->nspare; i++) (void)gpumem__be_vm_destroy(vp->ctx, vp->dev, vp->spare[i]);
  while (vp->spaces != NULL) {
    gpumem__vmspace *vs = vp->spaces;
    vp->spaces = vs->next;
    space_free(vs);
  }
  free(vp->spare);
  free(vp);
}

size_t gpumem__vm_granularity(const gpumem__vmpool *vp) { return vp->gran; }

size_t gpumem__vm_available(const gpumem__vmpool *vp) { return vp->nidle + vp->nspare; }

uint64_t gpumem__vm_spare_bytes(const gpumem__vmpool *vp) { return (uint64_t)vp->nspare * vp->gran; }

static void held_add(gpumem__vmpool *vp) {
  vp->st->reserved_bytes += vp->gran;
  if (vp->st->reserved_bytes > vp->st->reserved_peak) vp->st->reserved_peak = vp->st->reserved_bytes;
  vp->st->num_backend_allocs++;
}

static void held_sub(gpumem__vmpool *vp) {
  vp->st->reserved_bytes -= vp->gran;
  vp->st->num_backend_frees++;
}

/* Keep an unmapped chunk for later (a map or destroy failed). 0, or -1 when
 * there is no host memory to remember it (then it is lost to this pool). */
static int spare_push(gpumem__vmpool *vp, gpumem_phys_handle h) {
  if (vp->nspare == vp->capspare) {
    size_t ncap = vp->capspare ? vp->capspare * 2 : 8;
    gpumem_phys_handle *n = realloc(vp->spare, ncap * sizeof *n);
    if (n == NULL) return -1;
    vp->spare = n;
    vp->capspare = ncap;
  }
  vp->spare[vp->nspare++] = h;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Idle list                                                               */

static void idle_push(gpumem__vmspace *vs, uint32_t g) {
  vs->lprev[g] = vs->itail;
  vs->lnext[g] = NIL;
  if (vs->itail != NIL) vs->lnext[vs->itail] = g;
  else vs->ihead = g;
  vs->itail = g;
  vs->nidle++;
  vs->vp->nidle++;
}

static void idle_remove(gpumem__vmspace *vs, uint32_t g) {
  uint32_t a = vs->lprev[g], b = vs->lnext[g];
  if (a != NIL) vs->lnext[a] = b;
  else vs->ihead = b;
  if (b != NIL) vs->lprev[b] = a;
  else vs->itail = a;
  vs->lprev[g] = vs->lnext[g] = NIL;
  vs->nidle--;
  vs->vp->nidle--;
}

static void *gaddr(const gpumem__vmspace *vs, uint32_t g) { return (void *)(vs->base + (uintptr_t)g * vs->vp->gran); }

/* ---------------------------------------------------------------------- */
/* Spaces                                                                  */

static void space_free(gpumem__vmspace *vs) {
  free(vs->h);
  free(vs->busy);
  free(vs->lprev);
  free(vs->lnext);
  free(vs->chk);
  free(vs);
}

gpumem_status gpumem__vm_space_open(gpumem__vmpool *vp, size_t min_size, gpumem__vmspace **out, uintptr_t *base,
                                    size_t *size) {
  size_t g = vp->gran;
  size_t want = SPACE_FALLBACK;
  if (vp->total > 0 && vp->total <= (uint64_t)(SIZE_MAX / 4)) want = (size_t)vp->total * SPACE_TOTAL_FACTOR;
  if (want < min_size) want = min_size;
  if (want > SIZE_MAX - g) return GPUMEM_ERR_OUT_OF_MEMORY;
  want = (want + g - 1) & ~(g - 1);
  if (want / g >= (size_t)NIL) want = ((size_t)NIL - 1) * g;
  if (want < min_size) return GPUMEM_ERR_OUT_OF_MEMORY;
  gpumem__vmspace *vs = calloc(1, sizeof *vs);
  if (vs == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  /* the backend may refuse a large range: halve down to what the request needs */
  void *va = NULL;
  gpumem_status st;
  for (;;) {
    st = gpumem__be_vm_reserve(vp->ctx, vp->dev, want, &va);
    if (st == GPUMEM_OK) break;
    size_t half = (want / 2 + g - 1) & ~(g - 1);
    if (st != GPUMEM_ERR_OUT_OF_MEMORY || half < min_size || half < g || half == want) {
      free(vs);
      return st;
    }
    want = half;
  }
  if (va == NULL) {
    free(vs);
    return GPUMEM_ERR_BACKEND;
  }
  void *raw = va;
  size_t raw_size = want;
  if (((uintptr_t)va & (g - 1)) != 0) {
    /* not aligned to the granularity: reserve one granule more and align inside it */
    (void)gpumem__be_vm_release(vp->ctx, vp->dev, va, want);
    raw_size = want + g;
    st = gpumem__be_vm_reserve(vp->ctx, vp->dev, raw_size, &raw);
    if (st != GPUMEM_OK || raw == NULL) {
      free(vs);
      return st != GPUMEM_OK ? st : GPUMEM_ERR_BACKEND;
    }
    va = (void *)(((uintptr_t)raw + g - 1) & ~(uintptr_t)(g - 1));
  }
  size_t n = want / g;
  vs->h = calloc(n, sizeof *vs->h);
  vs->busy = calloc(n, sizeof *vs->busy);
  vs->lprev = malloc(n * sizeof *vs->lprev);
  vs->lnext = malloc(n * sizeof *vs->lnext);
  if (vs->h == NULL || vs->busy == NULL || vs->lprev == NULL || vs->lnext == NULL) {
    (void)gpumem__be_vm_release(vp->ctx, vp->dev, raw, raw_size);
    space_free(vs);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  vs->vp = vp;
  vs->base = (uintptr_t)va;
  vs->size = want;
  vs->raw = raw;
  vs->raw_size = raw_size;
  vs->n = (uint32_t)n;
  vs->ihead = vs->itail = NIL;
  vs->next = vp->spaces;
  if (vp->spaces != NULL) vp->spaces->prev = vs;
  vp->spaces = vs;
  LOG(vp, GPUMEM_LOG_DEBUG, "device %d: reserved %zu bytes of address space at %p", vp->dev, want, va);
  *out = vs;
  *base = vs->base;
  *size = want;
  return GPUMEM_OK;
}

uint64_t gpumem__vm_space_mapped(const gpumem__vmspace *vs) { return (uint64_t)vs->nmapped * vs->vp->gran; }

void gpumem__vm_space_clear_busy(gpumem__vmspace *vs) {
  for (uint32_t g = 0; g < vs->n; g++) {
    if (vs->busy[g] != 0 && vs->h[g] != 0) idle_push(vs, g);
    vs->busy[g] = 0;
  }
}

/* Unmap and destroy the chunk at idle granule g. On an unmap error it stays;
 * on a destroy error it becomes spare (still held). */
static gpumem_status give_back(gpumem__vmspace *vs, uint32_t g) {
  gpumem__vmpool *vp = vs->vp;
  gpumem_status st = gpumem__be_vm_unmap(vp->ctx, vp->dev, gaddr(vs, g), vp->gran);
  if (st != GPUMEM_OK) return st;
  gpumem_phys_handle h = vs->h[g];
  idle_remove(vs, g);
  vs->h[g] = 0;
  vs->nmapped--;
  st = gpumem__be_vm_destroy(vp->ctx, vp->dev, h);
  if (st == GPUMEM_OK) {
    held_sub(vp);
  } else if (spare_push(vp, h) != 0) {
    held_sub(vp); /* cannot even remember it: no longer ours */
  }
  return st;
}

gpumem_status gpumem__vm_space_close(gpumem__vmspace *vs) {
  gpumem__vmpool *vp = vs->vp;
  gpumem_status first = GPUMEM_OK;
  uint32_t g = vs->ihead;
  while (g != NIL) {
    uint32_t nx = vs->lnext[g];
    gpumem_status st = give_back(vs, g);
    if (st != GPUMEM_OK && first == GPUMEM_OK) first = st;
    g = nx;
  }
  if (vs->nmapped != 0) return first != GPUMEM_OK ? first : GPUMEM_ERR_INTERNAL;
  /* (a chunk whose destroy failed is spare now: gpumem__vm_trim retries it) */
  gpumem_status st = gpumem__be_vm_release(vp->ctx, vp->dev, vs->raw, vs->raw_size);
  if (st != GPUMEM_OK) return st;
  if (vs->prev != NULL) vs->prev->next = vs->next;
  else vp->spaces = vs->next;
  if (vs->next != NULL) vs->next->prev = vs->prev;
  LOG(vp, GPUMEM_LOG_DEBUG, "device %d: released %zu bytes of address space at %p", vp->dev, vs->size,
      (void *)vs->base);
  space_free(vs);
  return GPUMEM_OK;
}

/* ---------------------------------------------------------------------- */
/* Busy bytes and mapping                                                  */

void gpumem__vm_busy(gpumem__vmspace *vs, uintptr_t addr, size_t size, int delta) {
  if (size == 0) return;
  size_t gs = vs->vp->gran;
  uintptr_t off = addr - vs->base, end = off + size;
  uint32_t g = (uint32_t)(off / gs), last = (uint32_t)((end - 1) / gs);
  for (; g <= last; g++) {
    uintptr_t lo = (uintptr_t)g * gs, hi = lo + gs;
    if (lo < off) lo = off;
    if (hi > end) hi = end;
    uint32_t bytes = (uint32_t)(hi - lo);
    if (delta > 0) {
      if (vs->busy[g] == 0 && vs->h[g] != 0) idle_remove(vs, g);
      vs->busy[g] += bytes;
    } else {
      vs->busy[g] -= bytes;
      if (vs->busy[g] == 0 && vs->h[g] != 0) idle_push(vs, g);
    }
  }
}

size_t gpumem__vm_fresh(const gpumem__vmspace *vs, uintptr_t addr, size_t size) {
  if (size == 0) return 0;
  size_t gs = vs->vp->gran;
  uintptr_t off = addr - vs->base;
  uint32_t g = (uint32_t)(off / gs), last = (uint32_t)((off + size - 1) / gs);
  size_t k = 0;
  for (; g <= last; g++) k += vs->busy[g] == 0;
  return k;
}

size_t gpumem__vm_unmapped(const gpumem__vmspace *vs, uintptr_t addr, size_t size) {
  if (size == 0) return 0;
  size_t gs = vs->vp->gran;
  uintptr_t off = addr - vs->base;
  uint32_t g = (uint32_t)(off / gs), last = (uint32_t)((off + size - 1) / gs);
  size_t k = 0;
  for (; g <= last; g++) k += vs->h[g] == 0;
  return k;
}

/* A chunk for a granule about to be mapped: spare, else moved from an idle
 * granule (the oldest), else new. */
static gpumem_status get_chunk(gpumem__vmpool *vp, uint64_t limit, gpumem_phys_handle *h) {
  if (vp->nspare > 0) {
    *h = vp->spare[--vp->nspare];
    return GPUMEM_OK;
  }
  for (gpumem__vmspace *s = vp->spaces; s != NULL; s = s->next) {
    if (s->nidle == 0) continue;
    uint32_t g = s->ihead;
    gpumem_status st = gpumem__be_vm_unmap(vp->ctx, vp->dev, gaddr(s, g), vp->gran);
    if (st != GPUMEM_OK) {
      /* try it last next time */
      idle_remove(s, g);
      idle_push(s, g);
      return st;
    }
    *h = s->h[g];
    idle_remove(s, g);
    s->h[g] = 0;
    s->nmapped--;
    return GPUMEM_OK;
  }
  if (limit != 0 && vp->st->reserved_bytes + vp->gran > limit) return GPUMEM_ERR_LIMIT_EXCEEDED;
  gpumem_status st = gpumem__be_vm_create(vp->ctx, vp->dev, vp->gran, h);
  if (st != GPUMEM_OK) return st;
  held_add(vp);
  return GPUMEM_OK;
}

gpumem_status gpumem__vm_commit(gpumem__vmspace *vs, uintptr_t addr, size_t size, uint64_t limit) {
  if (size == 0) return GPUMEM_OK;
  gpumem__vmpool *vp = vs->vp;
  size_t gs = vp->gran;
  uintptr_t off = addr - vs->base;
  uint32_t g = (uint32_t)(off / gs), last = (uint32_t)((off + size - 1) / gs);
  for (; g <= last; g++) {
    if (vs->h[g] != 0) continue;
    gpumem_phys_handle h = 0;
    gpumem_status st = get_chunk(vp, limit, &h);
    if (st != GPUMEM_OK) return st;
    st = gpumem__be_vm_map(vp->ctx, vp->dev, gaddr(vs, g), gs, h);
    if (st != GPUMEM_OK) {
      if (spare_push(vp, h) != 0 && gpumem__be_vm_destroy(vp->ctx, vp->dev, h) == GPUMEM_OK) held_sub(vp);
      return st;
    }
    vs->h[g] = h;
    vs->nmapped++;
    if (vs->busy[g] == 0) idle_push(vs, g); /* (callers mark busy first; kept exact regardless) */
  }
  return GPUMEM_OK;
}

gpumem_status gpumem__vm_trim(gpumem__vmpool *vp, uint64_t max_bytes, uint64_t *released) {
  gpumem_status first = GPUMEM_OK;
  uint64_t rel = 0;
  /* spare chunks first: they back nothing */
  size_t keep = 0;
  for (size_t i = 0; i < vp->nspare; i++) {
    if (rel >= max_bytes) {
      vp->spare[keep++] = vp->spare[i];
      continue;
    }
    gpumem_status st = gpumem__be_vm_destroy(vp->ctx, vp->dev, vp->spare[i]);
    if (st == GPUMEM_OK) {
      held_sub(vp);
      rel += vp->gran;
    } else {
      if (first == GPUMEM_OK) first = st;
      vp->spare[keep++] = vp->spare[i];
    }
  }
  vp->nspare = keep;
  for (gpumem__vmspace *s = vp->spaces; s != NULL && rel < max_bytes; s = s->next) {
    uint32_t g = s->ihead;
    size_t todo = s->nidle; /* a failed granule moves to the tail: visit each once */
    while (g != NIL && todo-- > 0 && rel < max_bytes) {
      uint32_t nx = s->lnext[g];
      gpumem_status st = give_back(s, g);
      if (st == GPUMEM_OK) {
        rel += vp->gran;
      } else {
        if (first == GPUMEM_OK) first = st; /* (a chunk whose destroy failed is spare: still held) */
        break; /* the backend is failing: stop here */
      }
      g = nx;
    }
    if (first != GPUMEM_OK) break;
  }
  *released += rel;
  return first;
}

/* ---------------------------------------------------------------------- */
/* Invariant check                                                         */

int gpumem__vm_check_begin(gpumem__vmspace *vs) {
  if (vs->chk == NULL) vs->chk = calloc(vs->n, sizeof *vs->chk);
  else memset(vs->chk, 0, vs->n * sizeof *vs->chk);
  return vs->chk != NULL ? 0 : -1;
}

void gpumem__vm_check_add(gpumem__vmspace *vs, uintptr_t addr, size_t size) {
  if (vs->chk == NULL || size == 0) return;
  size_t gs = vs->vp->gran;
  uintptr_t off = addr - vs->base, end = off + size;
  for (uint32_t g = (uint32_t)(off / gs); g <= (uint32_t)((end - 1) / gs); g++) {
    uintptr_t lo = (uintptr_t)g * gs, hi = lo + gs;
    if (lo < off) lo = off;
    if (hi > end) hi = end;
    vs->chk[g] += (uint32_t)(hi - lo);
  }
}

const char *gpumem__vm_check_end(gpumem__vmspace *vs) {
  if (vs->chk == NULL) return NULL; /* no host memory to check with */
  size_t mapped = 0, idle = 0;
  for (uint32_t g = 0; g < vs->n; g++) {
    if (vs->chk[g] != vs->busy[g]) return "busy bytes of a granule differ from its live and not-READY blocks";
    if (vs->busy[g] != 0 && vs->h[g] == 0) return "a granule under a live or not-READY block is not mapped";
    if (vs->h[g] != 0) mapped++;
    if (vs->h[g] != 0 && vs->busy[g] == 0) idle++;
  }
  if (mapped != vs->nmapped) return "mapped granule count";
  if (idle != vs->nidle) return "idle granule count";
  size_t n = 0;
  uint32_t prev = NIL;
  for (uint32_t g = vs->ihead; g != NIL; g = vs->lnext[g]) {
    if (g >= vs->n || vs->h[g] == 0 || vs->busy[g] != 0 || vs->lprev[g] != prev) return "idle list";
    prev = g;
    if (++n > vs->nidle) return "idle list longer than its count";
  }
  if (n != vs->nidle || vs->itail != prev) return "idle list length";
  free(vs->chk);
  vs->chk = NULL;
  return NULL;
}
