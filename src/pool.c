/* pool.c: the pool proper: segments from the backend, the allocation path with its
 * out-of-memory and limit fallbacks, frees, thread-cache accounting, reset, stats,
 * create and destroy. */
#include "pool.h"
#include "tcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpumem__pool_device(const gpumem__pool *pool) { return pool->device; }

gpumem_status gpumem__seg_create(gpumem__pool *p, size_t size, int cls, gpumem__segment **out) {
  gpumem__segment *s = gpumem__calloc(1, sizeof *s);
  if (s == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  void *mem = NULL;
  gpumem_status st = gpumem__be_malloc(p->ctx, p->device, size, &mem);
  if (st != GPUMEM_OK) {
    free(s);
    return st;
  }
  gpumem__block *b = block_new(p);
  b->addr = (uintptr_t)mem;
  b->size = size;
  b->seg = s;
  s->pool = p;
  s->base = (uintptr_t)mem;
  s->size = size;
  s->cls = cls;
  s->kind = SEG_PLAIN;
  s->solo_era = p->solo != SOLO_MANY;
  s->head = b;
  s->next = p->segs;
  if (p->segs != NULL) p->segs->prev = s;
  p->segs = s;
  p->st.reserved_bytes += size;
  gpumem__dev_reserved_add(p, (int64_t)size);
  if (p->st.reserved_bytes > p->st.reserved_peak) p->st.reserved_peak = p->st.reserved_bytes;
  p->st.num_segments++;
  p->st.num_backend_allocs++;
  LOG(p, GPUMEM_LOG_DEBUG, "device %d: new %zu-byte segment at %p (reserved %llu)", p->device, size, mem,
      (unsigned long long)p->st.reserved_bytes);
  *out = s;
  return GPUMEM_OK;
}

void gpumem__seg_unlink(gpumem__pool *p, gpumem__segment *s) {
  if (s->prev != NULL) s->prev->next = s->next;
  else p->segs = s->next;
  if (s->next != NULL) s->next->prev = s->prev;
}

static size_t std_segment_size(size_t rsize, int rcls) {
  if (rcls == CLS_SMALL) return GPUMEM__SMALL_SEG;
  if (rsize <= GPUMEM__MEDIUM_MAX) return GPUMEM__MEDIUM_SEG;
  return (rsize + GPUMEM__LARGE_ROUND - 1) & ~(GPUMEM__LARGE_ROUND - 1); /* overflow checked by caller */
}

/* The smallest fitting block among the stream's own fidx, its pending
 * batch and READY (one good-fit candidate from each). */
static gpumem__block *search_cache(gpumem__pool *p, gpumem__srec *r, size_t rsize, int rcls) {
  gpumem__block *b = idx_find(p->ready, rsize, rcls), *c;
  if (r != NULL) {
    if ((c = idx_find(r->idx, rsize, rcls)) != NULL && (b == NULL || c->size < b->size)) b = c;
    for (gpumem__batch *bt = r->batches; bt != NULL; bt = bt->snext)
      if ((c = idx_find(bt->idx, rsize, rcls)) != NULL && (b == NULL || c->size < b->size)) b = c;
  }
  return b;
}

/* Grow by one segment for rsize: the standard size, or smaller ones that
 * still fit the request when the standard one would pass the limit or the
 * device. Returns OK with *out taken, LIMIT_EXCEEDED, OUT_OF_MEMORY or another error. */
static gpumem_status grow(gpumem__pool *p, size_t rsize, int rcls, int smallest_first_on_oom, gpumem__block **out) {
  size_t cand[3];
  int nc = 0;
  cand[nc++] = std_segment_size(rsize, rcls);
  size_t r2 = (rsize + GPUMEM__LARGE_ROUND - 1) & ~(GPUMEM__LARGE_ROUND - 1);
  if (r2 < cand[0]) cand[nc++] = r2;
  if (rsize < r2) cand[nc++] = rsize;
  gpumem_status st = GPUMEM_ERR_LIMIT_EXCEEDED;
  int tried = 0;
  for (int i = 0; i < nc; i++) {
    size_t sz = cand[i];
    if (p->limit != 0 && p->st.reserved_bytes + gpumem__pool_others(p) + sz > p->limit) continue;
    if (p->total != 0 && sz > p->total) continue;
    if (tried && !smallest_first_on_oom) break; /* one malloc on the fast path */
    tried = 1;
    gpumem__segment *s = NULL;
    st = gpumem__seg_create(p, sz, rcls, &s);
    if (st == GPUMEM_OK) {
      gpumem__block *b = s->head;
      if (b->size > rsize) {
        /* split: the rest is new memory with no pending work, READY for every stream */
        idx_insert(p, p->ready, block_split(p, b, rsize));
      }
      *out = b;
      return GPUMEM_OK;
    }
    if (st != GPUMEM_ERR_OUT_OF_MEMORY) return st;
  }
  if (!tried) return GPUMEM_ERR_LIMIT_EXCEEDED;
  return st;
}

/* What a rise of the reserved peak held besides live memory. Logged only when that is more than 1 %
 * of the live peak and 16 MiB (a cold start raises the peak with every growth, at the live peak), and
 * only at GPUMEM_LOG=debug: it walks the stream records and, with expandable segments, the granule
 * map, and it comes only when the pool grows past its peak. It tells memory the stream order keeps
 * (freed on a stream whose work the device has not run yet: docs/TROUBLESHOOTING.md) from memory
 * placement keeps. */
void gpumem__peak_note(gpumem__pool *p, const gpumem__srec *r, gpumem_stream stream, size_t rsize, uint64_t peak0) {
  const gpumem__logger *lg = &p->ctx->opt.log;
  if (!GPUMEM__LOG_ON(lg, GPUMEM_LOG_DEBUG) || p->st.reserved_peak <= peak0) return;
  uint64_t live = p->st.allocated_bytes + rsize; /* (this allocation is counted once it is returned) */
  uint64_t live_peak = p->st.allocated_peak > live ? p->st.allocated_peak : live;
  uint64_t excess = p->st.reserved_peak > live_peak ? p->st.reserved_peak - live_peak : 0;
  if (excess <= live_peak / 100 || excess < 16 * MiB) return;
  uint64_t own = 0, other = 0, noted = 0;
  gpumem__pool_inflight(p, r, &own, &other, &noted);
  const double M = 1024.0 * 1024.0;
  char vm[320] = "";
  if (p->vm != NULL) {
    uint64_t partial = 0, pinned = 0, idle = 0, allowance = 0;
    gpumem__vm_describe(p->vm, &partial, &pinned, &idle, &allowance);
    snprintf(vm, sizeof vm,
             "; of the mapped memory, %.1f MiB are unused parts of granules in use, %.1f MiB idle granules "
             "of chunks in use, %.1f MiB idle chunks (new memory may go %.1f MiB past the live peak before "
             "idle chunks move)",
             (double)partial / M, (double)pinned / M, (double)idle / M, (double)allowance / M);
  } else {
    snprintf(vm, sizeof vm, "; %.1f MiB free for every stream", (double)p->ready->bytes / M);
  }
  gpumem__log(lg, GPUMEM_LOG_DEBUG,
              "device %d: reserved peak %.1f MiB (was %.1f) for %.1f MiB on stream %p, %.1f MiB above the live "
              "peak; free blocks not yet usable by every stream: %.1f MiB freed on this stream, %.1f MiB freed "
              "on other streams (waiting for the device), %.1f MiB waiting for streams noted by "
              "gpumem_record_stream%s",
              p->device, (double)p->st.reserved_peak / M, (double)peak0 / M, (double)rsize / M, (void *)stream,
              (double)excess / M, (double)own / M, (double)other / M, (double)noted / M, vm);
}

/* One allocation attempt under the pool lock, with all the fallbacks except the OOM callback. */
static gpumem_status alloc_locked(gpumem__pool *p, size_t rsize, int rcls, gpumem_stream stream, gpumem__block **out) {
  if (p->vm != NULL) return gpumem__vm_alloc_locked(p, rsize, rcls, stream, out);
  if (block_reserve(p, 2) != 0) return GPUMEM_ERR_OUT_OF_MEMORY;
  gpumem__srec *r = srec_find(p, stream);
  if (r != NULL) gpumem__stream_touch(p, r); /* this call names the stream: its unbatched frees get their event */
  gpumem__block *b = search_cache(p, r, rsize, rcls);
  if (b == NULL && (p->npending > 0 || p->nmarks > 0 || p->ndeferred > 0)) {
    gpumem__poll_pending(p); /* events recorded by earlier calls on their own streams */
    b = idx_find(p->ready, rsize, rcls);
  }
  if (b == NULL && p->scount > (r != NULL ? 1u : 0u)) p->hungry++; /* other streams: harvest at their next call */
  if (b != NULL) {
    take(p, b, rsize);
    *out = b;
    return GPUMEM_OK;
  }

  if (p->nogrow) { /* the caller's thread cache flushes and asks again: its blocks may fit */
    p->grow_blocked = 1;
    return GPUMEM_ERR_BUSY;
  }
  uint64_t peak0 = p->st.reserved_peak;
  gpumem_status st = grow(p, rsize, rcls, 0, out);
  if (st == GPUMEM_OK) {
    gpumem__check_free_fraction(p);
    gpumem__peak_note(p, r, stream, rsize, peak0);
    return GPUMEM_OK;
  }
  if (st != GPUMEM_ERR_OUT_OF_MEMORY && st != GPUMEM_ERR_LIMIT_EXCEEDED) return st;

  /* Slow path: wait for every pending free, then retry from the cache. */
  gpumem__sync_all(p);
  b = search_cache(p, srec_find(p, stream), rsize, rcls);
  if (b != NULL) {
    take(p, b, rsize);
    *out = b;
    return GPUMEM_OK;
  }

  if (st == GPUMEM_ERR_LIMIT_EXCEEDED) {
    const uint64_t lim = gpumem__pool_limit(p); /* (what the device's other pools hold is not this pool's to give) */
    /* release free segments only if that makes room for the smallest segment that serves the request */
    uint64_t need = (uint64_t)rsize;
    if (p->st.reserved_bytes - p->empty_bytes + need <= lim) {
      uint64_t rel = 0;
      gpumem__segment *s = p->empty;
      while (s != NULL && p->st.reserved_bytes + std_segment_size(rsize, rcls) > lim) {
        gpumem__segment *n = s->enext;
        size_t sz = s->size;
        if (gpumem__seg_release(p, s) == GPUMEM_OK) rel += sz;
        s = n;
      }
      /* the standard size may still not fit: grow() falls back to smaller segments */
      if (p->st.reserved_bytes + need > lim) {
        s = p->empty;
        while (s != NULL && p->st.reserved_bytes + need > lim) {
          gpumem__segment *n = s->enext;
          size_t sz = s->size;
          if (gpumem__seg_release(p, s) == GPUMEM_OK) rel += sz;
          s = n;
        }
      }
      gpumem__count_trim(p, rel, "limit");
      st = grow(p, rsize, rcls, 1, out);
      if (st == GPUMEM_OK) return GPUMEM_OK;
      if (st != GPUMEM_ERR_LIMIT_EXCEEDED && st != GPUMEM_ERR_OUT_OF_MEMORY) return st;
    }
    if (st == GPUMEM_ERR_LIMIT_EXCEEDED) return st;
  }

  /* Out of memory: give back every free segment, retry. */
  p->st.num_oom_retries++;
  uint64_t rel = 0;
  (void)gpumem__release_empty(p, 0, &rel);
  gpumem__count_trim(p, rel, "out-of-memory retry");
  st = grow(p, rsize, rcls, 1, out);
  return st;
}

/* The out-of-memory report (warn, DESIGN.md "Trimming"): the request, the pool's allocated, reserved,
 * cached bytes and its largest free block, and the frees still pending per stream (stream_order.c),
 * formatted into buf under the pool lock; the caller adds what the other members of the shared group
 * hold (share.c) and logs it once the lock is released (a log callback may call the library).
 * Allocated counts the blocks in thread caches too, as everywhere in the pool: at an out of memory
 * those caches were flushed (gpumem__tc_alloc). why: "" or a parenthesised reason. buf stays empty
 * when no warning would be printed (the walks over blocks and streams are skipped then). */
static void oom_report_locked(gpumem__pool *p, size_t size, const char *why, char *buf, size_t cap) {
  buf[0] = '\0';
  if (!GPUMEM__LOG_PRINTS(&p->ctx->opt.log, GPUMEM_LOG_WARN)) return; /* nothing printed */
  char pending[640];
  gpumem__pool_pending_describe(p, pending, sizeof pending);
  snprintf(buf, cap,
           "device %d: out of memory allocating %zu bytes%s: allocated %llu, reserved %llu, cached %llu, largest free "
           "block %llu bytes; frees pending: %s",
           p->device, size, why, (unsigned long long)p->st.allocated_bytes, (unsigned long long)p->st.reserved_bytes,
           (unsigned long long)cached_bytes(p), (unsigned long long)gpumem__pool_largest_free_locked(p), pending);
}

/* Pool lock not held: log the report oom_report_locked made, with the shared group's peers. */
static void oom_report_log(gpumem__pool *p, const char *report) {
  if (report[0] == '\0') return;
  char peers[256];
  gpumem__share_describe(p->share, peers, sizeof peers);
  LOG(p, GPUMEM_LOG_WARN, "%s%s", report, peers);
}

gpumem_status gpumem__pool_alloc(gpumem__pool *p, size_t size, gpumem_stream stream, const char *tag, void **out,
                                 gpumem__tc_acct *acct) {
  if (size > SIZE_MAX - (GPUMEM__LARGE_ROUND - 1)) return GPUMEM_ERR_INVALID_ARGUMENT; /* rounding would overflow */
  size_t rsize = (size + GPUMEM__ALIGN - 1) & ~(GPUMEM__ALIGN - 1);
  int rcls = rsize <= GPUMEM__SMALL_MAX ? CLS_SMALL : CLS_LARGE;
  gpumem_context *ctx = p->ctx;

  gpumem__share_round asks = {0}; /* asking the shared group for memory (share.c): its rounds */
  int asking = 1;                  /* 0: no more rounds */
  for (int attempt = 0;; attempt++) {
    gpumem_status st;
    gpumem__block *b = NULL;
    gpumem__mutex_lock(&p->lock);
    if (p->limit != 0 && rsize > p->limit) {
      st = GPUMEM_ERR_LIMIT_EXCEEDED;
      if (acct != NULL) acct->hopeless = 1;
    } else if (p->total != 0 && rsize > p->total) {
      st = GPUMEM_ERR_OUT_OF_MEMORY; /* can never fit: no trimming, no callback */
      attempt = 1;
      if (acct != NULL) acct->hopeless = 1;
    } else {
      /* the caller's cache holds blocks, or another thread's cache may */
      p->nogrow = acct != NULL && (gpumem__tc_acct_cached(acct) > 0 || atomic_load_explicit(&p->tc_keyed, memory_order_relaxed) > 1);
      st = alloc_locked(p, rsize, rcls, stream, &b);
      p->nogrow = 0;
      if (p->grow_blocked) {
        p->grow_blocked = 0;
        acct->grow_blocked = 1;
        gpumem__mutex_unlock(&p->lock);
        return GPUMEM_ERR_BUSY;
      }
    }
    if (st == GPUMEM_OK) {
      /* the block's fields are set before the index publishes it: a free on another thread finds it
       * there (a stale pointer of a block a reset invalidated may be this address again) */
      b->requested = size;
      b->tag = tag;
      b->uses = NULL;
      if (gpumem__ptrmap_insert(&ctx->map, b->addr, b, p) != 0) {
        /* host out of memory: give the unused block back as a free on its stream */
        b->requested = 0;
        b->tag = NULL;
        gpumem__srec *r = gpumem__srec_get(p, stream);
        if (r != NULL) {
          b->fseq = ++r->seq;
          insert_coalesce(p, r->idx, b);
        } else {
          gpumem__place_unrecorded(p, b);
        }
        gpumem__mutex_unlock(&p->lock);
        return GPUMEM_ERR_OUT_OF_MEMORY;
      }
      p->st.allocated_bytes += b->size;
      if (acct != NULL) {
        acct->last = b;
        acct->last_size = b->size; /* (read here: once unlocked, a stale free of this address may merge b) */
        acct->last_state = atomic_load_explicit(&b->state, memory_order_relaxed);
        acct->large_ok = p->solo == SOLO_ONE; /* (solo: the search noted this call's stream: it is the one) */
        gpumem__pool_tc_peak(p, acct); /* the caller's cached blocks are not allocated */
      } else if (p->st.allocated_bytes > p->st.allocated_peak) {
        p->st.allocated_peak = p->st.allocated_bytes;
      }
      p->st.requested_bytes += size;
      p->st.num_allocs++;
      p->st.num_live++;
      gpumem__share_call(p, p->share, p->watching, watch_wanted(p));
#ifdef GPUMEM_DEBUG
      if (gpumem__pool_check_locked(p) != GPUMEM_OK) LOG(p, GPUMEM_LOG_ERROR, "invariant check failed after alloc");
#endif
      /* read under the lock: once it is released, a reset on another thread may free b's record */
      void *addr = (void *)b->addr;
      gpumem__mutex_unlock(&p->lock);
      *out = addr;
      return GPUMEM_OK;
    }
    if (st == GPUMEM_ERR_LIMIT_EXCEEDED) {
      p->st.num_limit_exceeded++;
      uint64_t limit = p->limit; /* (gpumem_set_limit changes it under the lock) */
      gpumem__mutex_unlock(&p->lock);
      LOG(p, GPUMEM_LOG_WARN, "device %d: allocation of %zu bytes refused: it would pass the limit of %llu bytes",
          p->device, size, (unsigned long long)limit);
      return st;
    }
    if (st == GPUMEM_ERR_OUT_OF_MEMORY && attempt == 0 && asking && p->share != NULL) {
      /* before the callback: the other members of the shared group give back cached memory (share.c);
       * another process may take it first, so a round may be followed by another (share_wait_ms in all) */
      gpumem__mutex_unlock(&p->lock);
      asking = gpumem__share_ask(p, p->share, rsize, &asks);
      if (asking) {
        attempt = -1; /* a fresh first attempt */
        continue;
      }
      gpumem__mutex_lock(&p->lock);
    }
    if (st != GPUMEM_ERR_OUT_OF_MEMORY || attempt > 0 || ctx->opt.oom_callback == NULL) {
      char report[1024] = "";
      if (st == GPUMEM_ERR_OUT_OF_MEMORY) {
        p->st.num_ooms++;
        oom_report_locked(p, size, "", report, sizeof report);
      }
      gpumem__mutex_unlock(&p->lock);
      oom_report_log(p, report);
      return st;
    }
    gpumem__mutex_unlock(&p->lock);
    /* the callback runs with no lock held: it may free and trim */
    LOG(p, GPUMEM_LOG_DEBUG, "device %d: calling the out-of-memory callback for %zu bytes", p->device, size);
    if (ctx->opt.oom_callback(ctx->opt.oom_user, p->device, size) == 0) {
      char report[1024];
      gpumem__mutex_lock(&p->lock);
      p->st.num_ooms++;
      oom_report_locked(p, size, " (the out-of-memory callback declined to retry)", report, sizeof report);
      gpumem__mutex_unlock(&p->lock);
      oom_report_log(p, report);
      return GPUMEM_ERR_OUT_OF_MEMORY;
    }
  }
}

/* Allocate exactly [ptr, ptr + size) from p's free memory (a graph pool's: plain segments, see
 * gpumem_graph_pool_alloc_at). The range must lie in one free block; the parts of that block
 * before and after it stay free in the block's free set. A block waiting for the streams it was
 * noted on (gpumem_record_stream) is waited for, outside a capture. */
gpumem_status gpumem__pool_alloc_at(gpumem__pool *p, void *ptr, size_t size) {
  uintptr_t addr = (uintptr_t)ptr;
  if (size == 0 || size > SIZE_MAX - GPUMEM__ALIGN || (addr & (GPUMEM__ALIGN - 1)) != 0)
    return GPUMEM_ERR_INVALID_ARGUMENT;
  size_t rsize = (size + GPUMEM__ALIGN - 1) & ~(GPUMEM__ALIGN - 1);
  gpumem_context *ctx = p->ctx;
  gpumem__mutex_lock(&p->lock);
  if (p->vm != NULL) {
    gpumem__mutex_unlock(&p->lock);
    return GPUMEM_ERR_INVALID_POINTER; /* no plain segments: graph pools never have expandable ones */
  }
  gpumem__segment *s = p->segs;
  while (s != NULL && !(addr >= s->base && addr - s->base < s->size)) s = s->next;
  gpumem_status st = GPUMEM_OK;
  gpumem__block *b = NULL;
  if (s == NULL || rsize > s->size - (addr - s->base)) {
    st = GPUMEM_ERR_INVALID_POINTER;
  } else {
    for (b = s->head; b != NULL && addr - b->addr >= b->size; b = b->next) {
    }
    if (b != NULL && b->idx == &p->deferred_set && !gpumem__capturing(ctx)) {
      gpumem__poll_deferred(p, GPUMEM__DEFER_WAIT); /* the noted streams' work, then it is free */
      for (b = s->head; b != NULL && addr - b->addr >= b->size; b = b->next) {
      }
    }
    if (b == NULL || b->idx == NULL || b->idx == &p->deferred_set || rsize > b->size - (addr - b->addr))
      st = GPUMEM_ERR_BUSY; /* part of the range is live, or still in use by noted streams */
    else if (block_reserve(p, 2) != 0)
      st = GPUMEM_ERR_OUT_OF_MEMORY;
  }
  if (st != GPUMEM_OK) {
    gpumem__mutex_unlock(&p->lock);
    return st;
  }
  gpumem__fidx *f = b->idx;
  if (addr > b->addr) {
    /* the part before the range stays free: its other neighbour is in no common set (b was merged) */
    idx_remove(p, b);
    gpumem__block *pre = block_new(p);
    pre->addr = b->addr;
    pre->size = addr - b->addr;
    pre->seg = s;
    pre->fseq = b->fseq;
    pre->prev = b->prev;
    pre->next = b;
    if (b->prev != NULL) b->prev->next = pre;
    else s->head = pre;
    b->prev = pre;
    b->addr = addr;
    b->size -= pre->size;
    idx_insert(p, f, pre);
    idx_insert(p, f, b);
  }
  take(p, b, rsize);
  /* the fields before the index publishes the block, as gpumem__pool_alloc does */
  b->requested = size;
  b->tag = NULL;
  b->uses = NULL;
  if (gpumem__ptrmap_insert(&ctx->map, b->addr, b, p) != 0) {
    b->requested = 0;
    insert_coalesce(p, f, b);
    gpumem__mutex_unlock(&p->lock);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  p->st.allocated_bytes += b->size;
  if (p->st.allocated_bytes > p->st.allocated_peak) p->st.allocated_peak = p->st.allocated_bytes;
  p->st.requested_bytes += size;
  p->st.num_allocs++;
  p->st.num_live++;
#ifdef GPUMEM_DEBUG
  if (gpumem__pool_check_locked(p) != GPUMEM_OK) LOG(p, GPUMEM_LOG_ERROR, "invariant check failed after alloc_at");
#endif
  gpumem__mutex_unlock(&p->lock);
  return GPUMEM_OK;
}

/* Free a live block already out of the pointer index, under the pool lock. */
static void free_locked(gpumem__pool *p, gpumem__block *b, gpumem_stream stream, int named) {
  p->st.allocated_bytes -= b->size;
  p->st.requested_bytes -= b->requested;
  p->st.num_frees++;
  p->st.num_live--;
  b->requested = 0;
  b->tag = NULL;
  /* noted on other streams: it waits for their work first (gpumem_record_stream) */
  if (GPUMEM__UNLIKELY(b->uses != NULL) && gpumem__defer_free(p, b, stream)) return;
  gpumem__free_place(p, b, stream, named);
}

/* A freed block (counted free already) into the free sets of its stream, or READY. */
void gpumem__free_place(gpumem__pool *p, gpumem__block *b, gpumem_stream stream, int named) {
  if (p->vm != NULL) {
    solo_note(p, stream);
    if (p->solo == SOLO_WARM && stream == p->solo_s && ++p->solo_frees >= SOLO_WARM_FREES) p->solo = SOLO_ONE;
    if (p->solo == SOLO_ONE && stream == p->solo_s) {
      /* one stream so far: no event (see "Single-stream expandable pools"); a small block READY at once */
      gpumem__srec *r = p->solo_r;
      b->fseq = ++r->seq;
      if (b->size <= SOLO_READY_MAX) {
        insert_coalesce(p, p->ready, b);
        p->dirty = 1;
        p->dirty_seq++;
      } else {
        insert_coalesce(p, r->idx, b);
      }
      return;
    }
    if (p->quarantine) gpumem__quarantine_step(p, stream, named);
  }
  gpumem__srec *r = gpumem__srec_get(p, stream);
  if (r != NULL) {
    b->fseq = ++r->seq;
    r->unasked += b->size;
    insert_coalesce(p, r->idx, b);
    if (named) gpumem__stream_touch(p, r); /* the event for other streams is recorded now, on the stream of this call */
  } else {
    gpumem__place_unrecorded(p, b);
  }
}

gpumem_status gpumem__pool_free(gpumem__pool *p, void *ptr, gpumem_stream stream) {
  gpumem__mutex_lock(&p->lock);
  gpumem__block *b = gpumem__ptrmap_remove(&p->ctx->map, (uintptr_t)ptr, p, 0);
  if (b == NULL) {
    gpumem__mutex_unlock(&p->lock);
    return GPUMEM_ERR_INVALID_POINTER;
  }
  guard_ctx(p, stream, 1, 0);
  free_locked(p, b, stream, 1);
  gpumem__check_threshold(p);
  srec_maybe_reap(p);
  gpumem__share_call(p, p->share, p->watching, watch_wanted(p));
#ifdef GPUMEM_DEBUG
  if (gpumem__pool_check_locked(p) != GPUMEM_OK) LOG(p, GPUMEM_LOG_ERROR, "invariant check failed after free");
#endif
  gpumem__mutex_unlock(&p->lock);
  return GPUMEM_OK;
}

void gpumem__pool_free_block(gpumem__pool *p, gpumem__block *b, gpumem_stream stream) {
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, stream, 1, 0);
  free_locked(p, b, stream, 1);
  gpumem__check_threshold(p);
  srec_maybe_reap(p);
  gpumem__share_call(p, p->share, p->watching, watch_wanted(p));
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_put_cached(gpumem__pool *p, gpumem__tc_acct *acct, gpumem__block **blocks, size_t n,
                             uint64_t lbytes, gpumem_stream stream, int named, int64_t *d_req, int64_t *d_live,
                             uint64_t *d_allocs, uint64_t *d_frees) {
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, stream, named, 0);
  /* (the owner may be in gpumem__pool_alloc, reading acct under this lock: it changes under it) */
  acct->lcached -= lbytes;
  uint64_t back = 0; /* the blocks' sizes, but the large block's: it was not in room */
  for (size_t i = 0; i < n; i++) {
    gpumem__block *b = blocks[i];
    back += b->size;
    /* the cache already counted this free: the pool's counters get it, the cache's deltas give it back */
    *d_req += (int64_t)b->requested;
    *d_live += 1;
    free_locked(p, b, stream, named && i + 1 == n);
  }
  acct->room += back - lbytes; /* (lbytes is one of the blocks' sizes, or 0) */
  uint64_t cached = gpumem__tc_acct_cached(acct);
  if (acct->headroom > cached) acct->headroom = cached;
  p->st.requested_bytes = (uint64_t)((int64_t)p->st.requested_bytes + *d_req);
  p->st.num_live = (uint64_t)((int64_t)p->st.num_live + *d_live);
  p->st.num_allocs += *d_allocs;
  /* (the blocks' frees were counted by the cache and again by free_locked: n come off; signed, since
   * the cache's count may be smaller than n when statistics took it since) */
  p->st.num_frees = (uint64_t)((int64_t)p->st.num_frees + (int64_t)*d_frees - (int64_t)n);
  *d_req = 0;
  *d_live = 0;
  *d_allocs = 0;
  *d_frees = 0;
  if (n > 0) gpumem__check_threshold(p);
  srec_maybe_reap(p);
  gpumem__share_call(p, p->share, p->watching, watch_wanted(p));
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_tc_peak(gpumem__pool *p, gpumem__tc_acct *acct) {
  /* the caller holds the pool lock */
  uint64_t cached = gpumem__tc_acct_cached(acct);
  uint64_t cur = p->st.allocated_bytes - cached;
  if (cur > p->st.allocated_peak) p->st.allocated_peak = cur;
  uint64_t room = p->st.allocated_peak - cur;
  acct->headroom = room < cached ? room : cached;
}

/* What the device may hold for this pool: its total, or the limit when lower (0: neither known). The
 * limit is read under the pool lock: gpumem_set_limit changes it there. */
static uint64_t tc_capacity(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  uint64_t limit = p->limit;
  gpumem__mutex_unlock(&p->lock);
  return limit != 0 && (p->total == 0 || limit < p->total) ? limit : p->total;
}

uint64_t gpumem__pool_tc_budget(gpumem__pool *p) {
  /* a 64th of what the device may hold. (Thread caches are on only while the release threshold is
   * unlimited, context.c: none holds memory a threshold would give back.) */
  uint64_t base = tc_capacity(p);
  uint64_t b = base != 0 ? base / 64 : GPUMEM__TC_MAX_BYTES;
  return b < GPUMEM__TC_MAX_BYTES ? b : GPUMEM__TC_MAX_BYTES;
}

uint64_t gpumem__pool_tc_large_budget(gpumem__pool *p) {
  /* a 16th of what the device may hold (tcache.c, the large slot). The block kept stays visible
   * (cached in the statistics) and comes back at the thread's next call to the pool, and on trim,
   * reset, out of memory, a limit, a share ask and low device memory (the watcher's check). */
  return tc_capacity(p) / GPUMEM__TC_LARGE_DIV;
}

int gpumem__pool_tc_keyed(gpumem__pool *p, int delta) {
  if (delta == 0) return atomic_load_explicit(&p->tc_keyed, memory_order_relaxed);
  return atomic_fetch_add_explicit(&p->tc_keyed, delta, memory_order_relaxed) + delta;
}

gpumem__mutex *gpumem__pool_mutex(gpumem__pool *p) { return &p->lock; }
gpumem_stats *gpumem__pool_stats_locked(gpumem__pool *p) { return &p->st; }

/* Drop everything: live blocks are invalidated, every segment, event and
 * record is given back. A segment the backend refuses to free stays in the
 * pool as one wholly free READY block (so a later trim, reset or destroy
 * gives it back) and the first such error is returned. Stats: current
 * values go to what is left, cumulative ones stay. */
static gpumem_status pool_clear_locked(gpumem__pool *p) {
  gpumem_context *ctx = p->ctx;
  /* 1. invalidate live blocks (parked frees are dropped with them) */
  gpumem__deferred_clear(p);
  for (gpumem__segment *s = p->segs; s != NULL; s = s->next)
    for (gpumem__block *b = s->head; b != NULL; b = b->next)
      if (b->idx == NULL) {
        free(b->uses);
        b->uses = NULL;
        (void)gpumem__ptrmap_remove(&ctx->map, b->addr, p, 1);
      }
  /* 2. forget every free index: batches (and their events), stream records, READY */
  gpumem__batch *bt = p->pending_head;
  while (bt != NULL) {
    gpumem__batch *n = bt->next;
    if (bt->has_ev) (void)gpumem__be_event_destroy(ctx, p->device, bt->ev);
    free(bt->idx);
    free(bt);
    bt = n;
  }
  p->pending_head = p->pending_tail = NULL;
  p->npending = 0;
  while (p->batch_free != NULL) {
    bt = p->batch_free->next;
    free(p->batch_free);
    p->batch_free = bt;
  }
  if (p->has_sev) (void)gpumem__be_event_destroy(ctx, p->device, p->sev);
  p->has_sev = 0;
  p->dirty = 0; /* every block is being dropped (the caller synchronised the device, or is destroying) */
  p->quarantine = 0;
  p->solo = p->vm != NULL ? SOLO_NONE : SOLO_MANY;
  if (p->vm != NULL) gpumem__vm_several_streams(p->vm, 0);
  p->solo_r = NULL;
  for (size_t i = 0; i < p->nev; i++) (void)gpumem__be_event_destroy(ctx, p->device, p->evcache[i]);
  p->nev = 0;
  for (gpumem__srec *r = p->sfirst, *n; r != NULL; r = n) {
    n = r->onext;
    if (r->has_mark) (void)gpumem__be_event_destroy(ctx, p->device, r->mev);
    free(r->idx);
    free(r);
  }
  if (p->scap > 0) memset(p->stab, 0, p->scap * sizeof *p->stab);
  p->sfirst = p->slast = NULL;
  p->scount = 0;
  p->nmarks = 0;
  while (p->ffree != NULL) {
    gpumem__fidx *n = p->ffree->next_free;
    free(p->ffree);
    p->ffree = n;
  }
  gpumem__fidx_clear(p->ready, IDX_READY);
  gpumem__fidx_clear(p->orphans, IDX_ORPHAN);
  p->empty = NULL;
  p->empty_bytes = 0;
  /* 3. every block struct is unused now: the slabs go but enough to keep every segment, should the
   * backend refuse to free them all (step 4), with no host memory needed (none may be left): a plain
   * segment takes one struct (it had at least one, so the slabs it leaves hold enough), an expandable
   * one at most gpumem__vm_keep_blocks. The kept structs' states go on counting (see gpumem__block). */
  size_t want = 0;
  for (gpumem__segment *s = p->segs; s != NULL; s = s->next)
    want += s->kind == SEG_VM ? gpumem__vm_keep_blocks(s) : 1;
  p->bfree = NULL;
  gpumem__slab **link = &p->slabs;
  for (size_t have = 0; *link != NULL;) {
    gpumem__slab *sl = *link;
    if (have >= want && have > 0) { /* (one slab at least: the next segments need no host memory) */
      *link = sl->next;
      free(sl);
      continue;
    }
    for (int i = SLAB_N - 1; i >= 0; i--) {
      sl->blocks[i].next = p->bfree;
      p->bfree = &sl->blocks[i];
    }
    have += SLAB_N;
    link = &sl->next;
  }
  /* 4. give the segments back (expandable ones first, while the stats still count their chunks) */
  gpumem_status vmst = p->vm != NULL ? gpumem__vm_clear(p) : GPUMEM_OK;
  gpumem_status first = vmst;
  gpumem__segment *s = p->segs;
  p->segs = NULL;
  const uint64_t held_before = p->st.reserved_bytes;
  p->st.reserved_bytes = p->vm != NULL ? gpumem__vm_spare_bytes(p->vm) : 0; /* held chunks vm_clear could not destroy */
  p->st.num_segments = 0;
  while (s != NULL) {
    gpumem__segment *n = s->next;
    gpumem_status st = s->kind == SEG_VM ? vmst : gpumem__be_free(ctx, p->device, (void *)s->base);
    if (st == GPUMEM_OK) {
      p->st.num_backend_frees++;
      free(s);
    } else {
      if (first == GPUMEM_OK) first = st;
      s->head = NULL;
      s->empty = 0;
      s->prev = NULL;
      s->next = p->segs;
      if (p->segs != NULL) p->segs->prev = s;
      p->segs = s;
      /* one READY block; an expandable one also keeps the ranges its failed unmaps left aliased out of use */
      int kept = 0;
      if (s->kind == SEG_VM) {
        kept = gpumem__vm_keep_seg(p, s) == 0;
      } else if (block_reserve(p, 1) == 0) {
        gpumem__block *b = block_new(p);
        b->addr = s->base;
        b->size = s->size;
        b->seg = s;
        s->head = b;
        idx_insert(p, p->ready, b);
        kept = 1;
      }
      if (!kept) {
        gpumem__seg_unlink(p, s);
        free(s); /* no host memory to keep track of it: it is lost to this pool */
      } else {
        p->st.reserved_bytes += s->kind == SEG_VM ? gpumem__vm_space_mapped(s->vm) : s->size;
        p->st.num_segments++;
      }
    }
    s = n;
  }
  gpumem__dev_reserved_add(p, (int64_t)p->st.reserved_bytes - (int64_t)held_before);
  p->st.allocated_bytes = 0;
  p->st.requested_bytes = 0;
  p->st.num_live = 0;
  gpumem__park_spare_free(p); /* (records step 1 kept that no kept segment took) */
  return first;
}

gpumem_status gpumem__pool_reset(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  /* if the device cannot be synchronised, nothing is invalidated */
  gpumem_status st = gpumem__be_device_synchronize(p->ctx, p->device);
  if (st != GPUMEM_OK) {
    gpumem__mutex_unlock(&p->lock);
    return st;
  }
  /* before the blocks go, and only when they do: a scope that allocated before this moment frees
   * none of them (scope.c); after a reset that failed here, scopes keep their blocks */
  atomic_fetch_add_explicit(&p->ctx->reset_gen[p->device], 1u, memory_order_acq_rel);
  uint64_t live = p->st.num_live, res = p->st.reserved_bytes;
  /* Once the first segment is given back the reset has happened: a segment
   * the backend refuses to free stays cached (a later trim or destroy gives
   * it back) and the reset still succeeds; the backend error is logged and
   * kept in gpumem_last_backend_error(). */
  if (pool_clear_locked(p) != GPUMEM_OK)
    LOG(p, GPUMEM_LOG_ERROR, "device %d: reset: %llu bytes could not be given back and stay cached", p->device,
        (unsigned long long)p->st.reserved_bytes);
  res -= p->st.reserved_bytes;
  gpumem__mutex_unlock(&p->lock);
  LOG(p, GPUMEM_LOG_INFO, "device %d: reset: %llu live allocation(s) invalidated, %llu bytes given back", p->device,
      (unsigned long long)live, (unsigned long long)res);
  return GPUMEM_OK;
}

void gpumem__pool_get_stats(gpumem__pool *p, gpumem_stats *st) {
  gpumem__mutex_lock(&p->lock);
  *st = p->st;
  st->cached_bytes = p->st.reserved_bytes - p->st.allocated_bytes;
  gpumem__mutex_unlock(&p->lock);
}

void gpumem__pool_reset_peaks(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  p->st.allocated_peak = p->st.allocated_bytes;
  p->st.reserved_peak = p->st.reserved_bytes;
  gpumem__mutex_unlock(&p->lock);
}

/* The live blocks of p after the first `skip`, into out (at most max). Pool lock held. */
static size_t live_copy_locked(gpumem__pool *p, size_t skip, gpumem__leak *out, size_t max) {
  size_t n = 0;
  for (gpumem__segment *s = p->segs; s != NULL && n < max; s = s->next)
    for (gpumem__block *b = s->head; b != NULL && n < max; b = b->next) {
      if (b->idx != NULL) continue;
      if (skip > 0) {
        skip--;
        continue;
      }
      out[n++] = (gpumem__leak){b->addr, b->size, b->requested, p->device, b->tag};
    }
  return n;
}

void gpumem__pool_live(gpumem__pool *p, uint64_t *count, uint64_t *bytes, gpumem__leak *first, size_t max,
                       size_t *nfirst) {
  gpumem__mutex_lock(&p->lock);
  *count += p->st.num_live;
  *bytes += p->st.allocated_bytes;
  if (*nfirst < max) *nfirst += live_copy_locked(p, 0, first + *nfirst, max - *nfirst);
  gpumem__mutex_unlock(&p->lock);
}

size_t gpumem__pool_live_at(gpumem__pool *p, size_t skip, gpumem__leak *out, size_t max) {
  gpumem__mutex_lock(&p->lock);
  size_t n = live_copy_locked(p, skip, out, max);
  gpumem__mutex_unlock(&p->lock);
  return n;
}

static gpumem_status pool_create_(gpumem_context *ctx, int device, int graph, gpumem__pool **out);

gpumem_status gpumem__pool_create(gpumem_context *ctx, int device, gpumem__pool **out) {
  return pool_create_(ctx, device, 0, out);
}

/* A graph pool's memory is replayed by graphs at fixed addresses: plain segments (never
 * remapped), no events (its frees are reused by their own stream), no initial segment. */
gpumem_status gpumem__pool_create_graph(gpumem_context *ctx, int device, gpumem__pool **out) {
  return pool_create_(ctx, device, 1, out); /* (the device's limit: graph.c, when it links the pool) */
}

int gpumem__pool_is_graph(const gpumem__pool *p) { return p->graph; }

void gpumem__pool_set_limit(gpumem__pool *p, uint64_t limit) {
  gpumem__mutex_lock(&p->lock);
  p->limit = limit;
  p->limit_held = limit != 0 && p->st.reserved_bytes > limit ? p->st.reserved_bytes : 0;
  gpumem__mutex_unlock(&p->lock);
}

uint64_t gpumem__pool_get_limit(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  uint64_t l = p->limit;
  gpumem__mutex_unlock(&p->lock);
  return l;
}

uint64_t gpumem__pool_largest_free(gpumem__pool *p) {
  gpumem__mutex_lock(&p->lock);
  uint64_t best = gpumem__pool_largest_free_locked(p);
  gpumem__mutex_unlock(&p->lock);
  return best;
}

uint64_t gpumem__pool_largest_free_locked(const gpumem__pool *p) {
  uint64_t best = 0;
  for (gpumem__segment *s = p->segs; s != NULL; s = s->next) {
    if (s->kind != SEG_PLAIN) continue; /* expandable: idle chunks move to wherever a block needs them */
    for (gpumem__block *b = s->head; b != NULL; b = b->next)
      if (b->idx != NULL && b->idx != &p->deferred_set && b->size > best) best = b->size;
  }
  if (p->vm != NULL) {
    /* mapped cached memory is placed wherever a block needs it (idle chunks move), once free for all */
    uint64_t idle = cached_bytes(p);
    if (idle > best) best = idle;
  }
  return best;
}

static gpumem_status pool_create_(gpumem_context *ctx, int device, int graph, gpumem__pool **out) {
  gpumem_backend_device_info info;
  memset(&info, 0, sizeof info);
  gpumem_status st = gpumem__be_device_info(ctx, device, &info);
  if (st != GPUMEM_OK) return st;
  gpumem__pool *p = gpumem__calloc(1, sizeof *p);
  if (p == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  p->ctx = ctx;
  p->device = device;
  p->total = info.total_bytes;
  p->st.struct_size = (uint32_t)sizeof(gpumem_stats);
  p->limit = gpumem__options_limit(&ctx->opt, p->total);
  p->ready = gpumem__malloc(sizeof *p->ready);
  p->orphans = gpumem__malloc(sizeof *p->orphans); /* made now: place_unrecorded needs it when the host has no memory */
  if (p->ready == NULL || p->orphans == NULL || gpumem__mutex_init(&p->lock) != 0) {
    free(p->orphans);
    free(p->ready);
    free(p);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  gpumem__fidx_clear(p->ready, IDX_READY);
  gpumem__fidx_clear(p->orphans, IDX_ORPHAN);
  gpumem__fidx_clear(&p->deferred_set, IDX_DEFERRED);
  p->graph = graph;
  p->reap_at = SREC_REAP_MIN;
  p->vm = graph ? NULL : gpumem__vm_pool_new(ctx, device, p->total, &p->st);
  p->solo = p->vm != NULL ? SOLO_NONE : SOLO_MANY;
  if (p->vm != NULL) gpumem__vm_set_guard(p->vm, gpumem__vm_guard, p);

  uint64_t init = graph ? 0 : ctx->opt.initial_bytes;
  if (init > 0) {
    if (init > (uint64_t)(SIZE_MAX - GPUMEM__LARGE_ROUND)) {
      LOG(p, GPUMEM_LOG_WARN, "device %d: initial_bytes %llu is too large; not preallocating", device,
          (unsigned long long)init);
    } else {
      size_t sz = ((size_t)init + GPUMEM__LARGE_ROUND - 1) & ~(GPUMEM__LARGE_ROUND - 1);
      gpumem__segment *s = NULL;
      if (p->limit != 0 && sz > p->limit) {
        LOG(p, GPUMEM_LOG_WARN, "device %d: initial_bytes %zu passes the limit %llu; not preallocating", device, sz,
            (unsigned long long)p->limit);
      } else if (block_reserve(p, 1) != 0 || gpumem__seg_create(p, sz, CLS_MIXED, &s) != GPUMEM_OK) {
        LOG(p, GPUMEM_LOG_WARN, "device %d: could not preallocate initial_bytes (%zu bytes)", device, sz);
      } else {
        idx_insert(p, p->ready, s->head);
      }
    }
  }
  if (!graph) p->share = gpumem__share_join(p, &info); /* NULL: no sharing, no watcher (share.c) */
  LOG(p, GPUMEM_LOG_INFO, "device %d: pool created (%s, %llu bytes total, limit %llu)", device, info.name,
      (unsigned long long)p->total, (unsigned long long)p->limit);
  *out = p;
  return GPUMEM_OK;
}

void gpumem__pool_destroy(gpumem__pool *p) {
  if (p == NULL) return;
  gpumem__share_stop(p->share); /* the watcher stops before the pool goes; the entry stays until its memory is back */
  gpumem__mutex_lock(&p->lock);
  if (p->segs != NULL) (void)gpumem__be_device_synchronize(p->ctx, p->device);
  if (pool_clear_locked(p) != GPUMEM_OK) {
    /* the backend refused some frees: try once more, then they are lost (parked ranges first: their
     * records go, and their aliases get one more unmap) */
    gpumem__deferred_clear(p);
    gpumem__park_spare_free(p);
    gpumem__segment *s = p->segs;
    while (s != NULL) {
      gpumem__segment *n = s->next;
      if (s->kind == SEG_VM ? gpumem__vm_space_close(s->vm) == GPUMEM_OK
                            : gpumem__be_free(p->ctx, p->device, (void *)s->base) == GPUMEM_OK)
        p->st.num_backend_frees++;
      else LOG(p, GPUMEM_LOG_ERROR, "device %d: segment %p (%zu bytes) could not be given back", p->device, (void *)s->base, s->size);
      free(s);
      s = n;
    }
    p->segs = NULL;
  }
  while (p->slabs != NULL) {
    gpumem__slab *n = p->slabs->next;
    free(p->slabs);
    p->slabs = n;
  }
  gpumem__dev_reserved_add(p, -(int64_t)p->st.reserved_bytes); /* the pool goes: its bytes no longer count */
  gpumem__mutex_unlock(&p->lock);
  gpumem__share_leave(p->share);
  p->share = NULL;
  free(p->stab);
  free(p->evcache);
  free(p->ready);
  free(p->orphans);
  gpumem__vm_pool_free(p->vm);
  gpumem__mutex_destroy(&p->lock);
  free(p);
}

