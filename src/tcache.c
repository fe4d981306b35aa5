/* tcache.c: per-thread caches in front of the pools.
 *
 * Each thread that allocates or frees gets one cache, keyed by (context,
 * pool, stream). A free on S of a block of that pool, up to GPUMEM__TC_MAX_SIZE
 * (the pool's small class, whose segments large blocks never share: cached blocks
 * pin no space a large request could use), claims the block (its state word goes
 * even -> odd by compare-and-swap, so of two threads freeing one pointer exactly
 * one wins and a later free of it is rejected) and keeps it in the bin of its
 * size class (8 per power of two, GPUMEM__TC_BIN_CAP blocks each); its
 * pointer-index entry stays, marked not live. An alloc on S takes a cached
 * block of its rounded size up to 12.5 % more (odd -> even): the inlined hit in
 * tcache.h takes the block freed last in the request's class when it is not
 * smaller (a class spans 12.5 %); else near_fit takes the smallest such block
 * of that class and the two above. No index operation either way, no pool
 * lock. The claim finds the block through the index (gpumem__tc_free, under
 * the shard lock), or, for a block this cache remembers (one it handed out
 * from the pool, or one freed into it), through that memory (tcache.h, no
 * shared lock at all). A cache holds at most
 * gpumem__pool_tc_budget bytes (64 MiB; a 64th of a device or limit smaller
 * than 4 GiB), and is flushed before its pool would map or grow for
 * this thread (the pool's nogrow): its blocks, coalesced, may serve instead.
 * A flush removes its cached blocks' entries and gives the blocks to the
 * pool, and forgets them; a rekey, reset or detach forgets every block the
 * cache remembered, a flush for growth, out of memory or trim keeps the live
 * ones remembered.
 * A block above GPUMEM__TC_MAX_SIZE has the cache's one large slot instead
 * ("The large slot" below): kept from a free right after its hand-out to the
 * next allocation of its size, given back before any other call to the pool.
 * Stream order: the cache only ever serves the stream the block was freed
 * on. Cached blocks are live for the pool; statistics are the pool's
 * adjusted by every cache's counters, read under every cache lock.
 *
 * Locks: g_reg (the list of every thread cache) -> cache locks (list
 * order) -> pool lock -> pointer-index shard lock. A cache lock is
 * asymmetric (tcache.h): its owner takes it with plain stores and holds it
 * only inside an allocator call (never across the pool's out-of-memory
 * callback), so flushes by other threads (trim, reset, out of memory,
 * destroy, statistics), which take it under g_reg with one membarrier for
 * all caches, never wait on a blocked thread.
 * Thread exit (a pthread key destructor) flushes the cache and frees it;
 * gpumem_destroy flushes and detaches every cache of the context.
 */
#include "tcache.h"

#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && defined(__has_include)
#if __has_include(<linux/membarrier.h>) && __has_include(<sys/syscall.h>)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__NR_membarrier)
#define GPUMEM__TC_MEMBARRIER 1
#endif
#endif
#endif
#ifndef GPUMEM__TC_MEMBARRIER
#define GPUMEM__TC_MEMBARRIER 0
#endif

/* Calls on another key before a non-empty cache is flushed and rekeyed. The count restarts at the
 * calls on the cache's key that reach this file (the pool's path), not at its inlined hits (they
 * write nothing more), nor at a free the cache keeps: such a free is an inlined hit unless the block's
 * slot in own[] was taken by a later block, which depends on addresses, and when a cache moves must
 * not (it decides where later blocks go). */
#define TC_REKEY_MISSES 16

static pthread_mutex_t g_reg = PTHREAD_MUTEX_INITIALIZER;
static gpumem__tc *g_list;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static int g_key_ok;
gpumem__tc gpumem__tc_none = {.ctx = (gpumem_context *)&gpumem__tc_none};
_Thread_local gpumem__tc *gpumem__tls_tc = &gpumem__tc_none;
static _Thread_local int tls_dead; /* the destructor ran: no new cache for this thread */

int gpumem__tc_asym;

/* membarrier(2): a full memory barrier on every running thread of this process (tcache.h: the
 * asymmetric cache lock). */
static int heavy_barrier(void) {
#if GPUMEM__TC_MEMBARRIER
  return syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 ? 0 : -1;
#else
  return -1;
#endif
}

/* Once, before the first cache: 1 when the process is registered for expedited membarriers (the
 * registration is kept across fork, and is per process: every thread is covered). */
static const char *g_asym_why = "membarrier(2) not built in: not Linux"; /* why not, for the log */
static int asym_init(void) {
#if GPUMEM__TC_MEMBARRIER
  const char *e = getenv("GPUMEM_TC_LOCKED"); /* tests: the spinlock protocol, as without membarrier */
  g_asym_why = "GPUMEM_TC_LOCKED=1";
  if (e != NULL && e[0] == '1') return 0;
  g_asym_why = "membarrier(2) not available: an old kernel, or a seccomp filter";
  long q = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q < 0 || (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return 0;
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0) return 0;
  return heavy_barrier() == 0;
#else
  return 0;
#endif
}

static void spin_pause(int *i) {
  if (++*i >= 64) {
    *i = 0;
    sched_yield();
  }
}

/* Without membarrier, every side's lock: the spinlock lk. */
static void lk_lock(gpumem__tc *c) {
  int i = 0;
  for (;;) {
    if (atomic_load_explicit(&c->lk, memory_order_relaxed) == 0 &&
        atomic_exchange_explicit(&c->lk, 1, memory_order_acquire) == 0)
      return;
    spin_pause(&i);
  }
}

/* The owner's side: wait while another thread holds (or wants) the cache, then take it. */
void gpumem__tc_lock_slow(gpumem__tc *c) {
  if (!gpumem__tc_asym) {
    lk_lock(c);
    return;
  }
  int i = 0;
  for (;;) {
    while (atomic_load_explicit(&c->remote, memory_order_relaxed) != 0) spin_pause(&i);
    if (gpumem__tc_trylock(c)) return;
  }
}

/* Another thread's side (g_reg held: one such thread at a time). Without membarrier: the spinlock. */
static void remote_want(gpumem__tc *c) {
  if (gpumem__tc_asym) atomic_store_explicit(&c->remote, 1, memory_order_seq_cst);
}
static void remote_wait(gpumem__tc *c) {
  if (!gpumem__tc_asym) {
    lk_lock(c);
    return;
  }
  int i = 0;
  while (atomic_load_explicit(&c->busy, memory_order_acquire) != 0) spin_pause(&i);
}
static void remote_unlock(gpumem__tc *c) {
  if (gpumem__tc_asym) atomic_store_explicit(&c->remote, 0, memory_order_release);
  else atomic_store_explicit(&c->lk, 0, memory_order_release);
}

/* A new (zeroed) cache: unlocked, empty, detached. */
static void own_clear(gpumem__tc *c);
static void tc_init(gpumem__tc *c) {
  atomic_init(&c->busy, 0);
  atomic_init(&c->remote, gpumem__tc_asym ? 0 : GPUMEM__TC_REMOTE_LOCKED);
  atomic_init(&c->lk, 0);
  own_clear(c);
  for (size_t u = 0; u <= GPUMEM__TC_MAX_SIZE >> 8; u++) c->class_of[u] = (uint8_t)gpumem__tc_class(u << 8);
}

static void own_clear(gpumem__tc *c) {
  for (int i = 0; i < GPUMEM__TC_OWN; i++) c->own[i].key = GPUMEM__TC_OWN_EMPTY;
  c->lfresh.key = GPUMEM__TC_OWN_EMPTY;
}

/* Give every cached block back to c->pool and fold the counters. Cache lock held.
 * forget: every remembered block is forgotten (a reset or destroy may drop them, a rekey makes them
 * another pool's). Else only the blocks given back are: the remembered live blocks stay, so that
 * their frees after a flush for growth, out of memory or trim still find them here. That is safe
 * because those flushes free no block record (only a reset or destroy frees the slabs), and a
 * remembered live block's slot expects its state now, which only moves on (a free of it anywhere
 * else makes the slot's claim fail). A block given back is forgotten: the removal from the index
 * makes its state the one its slot anticipated for the next pop. */
static void flush_some(gpumem__tc *c, int named, int forget, int large_only);
static void flush_locked(gpumem__tc *c, int named, int forget) { flush_some(c, named, forget, 0); }

/* large_only: only the large slot's block goes back (the owner, before it asks the pool: large_before_pool). */
static __attribute__((noinline)) void flush_some(gpumem__tc *c, int named, int forget, int large_only) {
  if (!large_only) c->flushes++;
  if (forget) own_clear(c);
  if (c->pool == NULL) return;
  if (gpumem__tc_acct_cached(&c->acct) == 0 && c->d_req == 0 && c->d_allocs == 0 && c->d_frees == 0) return;
  gpumem__block *all[GPUMEM__TC_CLASSES * GPUMEM__TC_BIN_CAP + 1];
  size_t n = 0;
  uint64_t lbytes = 0;
  if (c->lblk != NULL) {
    gpumem__block *b = c->lblk;
    c->lblk = NULL;
    lbytes = c->lsz;
    if (c->lfresh.key == b->addr) c->lfresh.key = GPUMEM__TC_OWN_EMPTY;
    (void)gpumem__ptrmap_remove(&c->ctx->map, b->addr, c->pool, 1); /* (as for the classes below) */
    all[n++] = b;
  }
  for (int k = 0; k < (large_only ? 0 : GPUMEM__TC_CLASSES); k++) {
    while (c->n[k] > 0) {
      gpumem__block *b = c->blk[(size_t)k * GPUMEM__TC_BIN_CAP + --c->n[k]];
      gpumem__tc_own *o = gpumem__tc_own_of(c, b->addr);
      if (o->key == b->addr) o->key = GPUMEM__TC_OWN_EMPTY;
      /* cached: no one else removes or claims the entry, so it is there; the removal makes the state even */
      (void)gpumem__ptrmap_remove(&c->ctx->map, b->addr, c->pool, 1);
      all[n++] = b;
    }
  }
  int64_t d_live = (int64_t)c->d_allocs - (int64_t)c->d_frees; /* frees may outnumber allocs here */
  gpumem__pool_put_cached(c->pool, &c->acct, all, n, lbytes, c->stream, named, &c->d_req, &d_live, &c->d_allocs,
                          &c->d_frees);
}

/* The pool c is keyed to (NULL: none), counted in the pools (gpumem__pool_tc_keyed). Cache lock held. */
static void tc_set_pool(gpumem__tc *c, gpumem__pool *p) {
  if (c->pool == p) return;
  if (c->pool != NULL) gpumem__pool_tc_keyed(c->pool, -1);
  c->pool = p;
  if (p != NULL) gpumem__pool_tc_keyed(p, +1);
}

/* Cache lock held. The owner may be inside gpumem__pool_alloc with &c->acct (it reads and writes
 * the record under the pool lock only, without its cache lock): the record changes under that pool
 * lock too. */
static void tc_detach(gpumem__tc *c) {
  c->ctx = NULL;
  gpumem__pool *p = c->pool;
  if (p != NULL) gpumem__mutex_lock(gpumem__pool_mutex(p));
  c->acct.budget = c->acct.room = 0;
  c->lbudget = 0;
  c->acct.large_ok = 0;
  c->acct.headroom = 0;
  if (p != NULL) gpumem__mutex_unlock(gpumem__pool_mutex(p));
  tc_set_pool(c, NULL);
}

/* Once per context, at its first allocation through a thread cache: which lock protocol the caches use
 * (info), so that a user who finds the hits slow (a container whose seccomp filter blocks membarrier)
 * can see why. */
static __attribute__((noinline)) void tc_say_protocol_(gpumem_context *ctx) {
  if (atomic_exchange_explicit(&ctx->tc_said, 1, memory_order_relaxed) != 0) return;
  if (gpumem__tc_asym)
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "thread caches: asymmetric lock (membarrier), inlined hits");
  else
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "thread caches: spinlock, no inlined hits (%s)", g_asym_why);
}

static inline void tc_say_protocol(gpumem_context *ctx) {
  if (GPUMEM__UNLIKELY(atomic_load_explicit(&ctx->tc_said, memory_order_relaxed) == 0)) tc_say_protocol_(ctx);
}

static void tc_rekey(gpumem__tc *c, gpumem_context *ctx, gpumem__pool *p, gpumem_stream stream) {
  if (c->ctx != NULL) flush_locked(c, 0, 1);
  if (GPUMEM__MON_ON(ctx) || gpumem__capturing(ctx) || gpumem__pool_is_graph(p)) {
    /* the inlined hits must miss: while monitoring (trace.c detaches every cache when it turns it
     * on), while a stream is routed to a graph pool (graph.c detaches them at each route: a hit
     * would hand the graph memory that work outside it reuses), and for a graph pool's blocks */
    tc_detach(c);
    return;
  }
  c->ctx = ctx;
  tc_set_pool(c, p);
  c->dev = gpumem__pool_device(p);
  c->stream = stream;
  c->astream = stream != NULL && ctx->cap_probe ? (gpumem_stream)((uintptr_t)stream ^ 1u) : stream;
  c->acct.budget = c->acct.room = gpumem__pool_tc_budget(p); /* nothing cached */
  c->lbudget = gpumem__pool_tc_large_budget(p);
  c->acct.large_ok = 0; /* until the pool says it is single-stream on this stream (gpumem__pool_alloc) */
  c->acct.headroom = 0;
  c->misses = 0;
}

static void tc_destructor(void *arg) {
  gpumem__tc *c = arg;
  pthread_mutex_lock(&g_reg);
  gpumem__tc_lock(c);
  if (c->ctx != NULL) flush_locked(c, 0, 1);
  tc_detach(c);
  if (c->prev != NULL) c->prev->next = c->next;
  else g_list = c->next;
  if (c->next != NULL) c->next->prev = c->prev;
  gpumem__tc_unlock(c);
  pthread_mutex_unlock(&g_reg);
  gpumem__tls_tc = &gpumem__tc_none;
  tls_dead = 1;
  free(c);
}

/* fork (registered by fork.c): the child must not find the list or a cache locked by a thread
 * that does not exist there. The caches of the parent's threads hold blocks of the parent's
 * contexts, which the child cannot use: forgotten there. */
void gpumem__tc_fork_prepare(void) { gpumem__tc_lock_all(); }
void gpumem__tc_fork_parent(void) { gpumem__tc_unlock_all(); }
void gpumem__tc_fork_child(void) {
  atomic_store_explicit(&gpumem__tc_none.busy, 0, memory_order_relaxed); /* a thread of the parent may have held it */
  gpumem__tc *c = g_list;
  g_list = NULL;
  while (c != NULL) {
    gpumem__tc *n = c->next;
    if (c == gpumem__tls_tc) {
      memset(c, 0, sizeof *c);
      tc_init(c);
      g_list = c;
    } else {
      free(c);
    }
    c = n;
  }
  pthread_mutex_unlock(&g_reg); /* taken by gpumem__tc_fork_prepare in this thread */
}

static void key_init(void) {
  gpumem__tc_asym = asym_init(); /* before the first cache: every cache is made with one protocol */
  g_key_ok = pthread_key_create(&g_key, tc_destructor) == 0;
  if (g_key_ok && gpumem__fork_init_caches() != 0) {
    (void)pthread_key_delete(g_key);
    g_key_ok = 0;
  }
}

/* This thread's cache, created on first use; NULL when none can be had. */
static gpumem__tc *tc_self(void) {
  gpumem__tc *c = gpumem__tls_tc;
  if (GPUMEM__LIKELY(c != &gpumem__tc_none)) return c;
  if (tls_dead) return NULL;
  (void)pthread_once(&g_once, key_init);
  if (!g_key_ok) return NULL;
  c = gpumem__calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  tc_init(c);
  if (pthread_setspecific(g_key, c) != 0) {
    free(c);
    return NULL;
  }
  pthread_mutex_lock(&g_reg);
  c->next = g_list;
  if (g_list != NULL) g_list->prev = c;
  g_list = c;
  pthread_mutex_unlock(&g_reg);
  gpumem__tls_tc = c;
  return c;
}

/* After a call on another key: rekey an empty cache at once, a full one after a few misses. Cache lock held. */
static void tc_miss(gpumem__tc *c, gpumem_context *ctx, gpumem__pool *p, gpumem_stream stream) {
  if (gpumem__tc_acct_cached(&c->acct) == 0 || ++c->misses >= TC_REKEY_MISSES) tc_rekey(c, ctx, p, stream);
}

/* The smallest cached block of rsize .. rsize + rsize / 8 (at most 12.5 % more than asked, like a
 * size class): its size, its class in *k and its place there in *at; or 0. Such blocks are in rsize's class
 * or the two above it, and every block of a class is smaller than every block of the next: the first
 * of those classes that has one holds the smallest. Requests of random sizes rarely find their exact
 * size again; a near one spares the pool path (several hundred instructions and, on a GPU, at times
 * an event call) for a bounded waste. Cache lock held, rsize <= GPUMEM__TC_MAX_SIZE. */
static size_t near_fit(const gpumem__tc *c, size_t rsize, unsigned *k, unsigned *at) {
  if (gpumem__tc_acct_cached(&c->acct) < rsize) return 0; /* no cached block is that large */
  const size_t hi = rsize + rsize / 8;
  unsigned first = c->class_of[rsize >> 8];
  unsigned end = first + 3u < GPUMEM__TC_CLASSES ? first + 3u : GPUMEM__TC_CLASSES;
  for (unsigned i = first; i < end; i++) {
    const size_t *sz = c->sz + (size_t)i * GPUMEM__TC_BIN_CAP;
    unsigned n = c->n[i], best = n;
    size_t bs = hi + 1u;
    for (unsigned j = 0; j < n; j++) {
      if (sz[j] >= rsize && sz[j] < bs) {
        best = j;
        bs = sz[j];
      }
    }
    if (best < n) {
      *k = i;
      *at = best;
      return bs;
    }
  }
  return 0;
}

/* The large slot. A block above GPUMEM__TC_MAX_SIZE freed by this cache's thread on its key right
 * after this cache handed it out (no pool call of this cache came between: the block is lfresh) is
 * kept in the slot, and the next allocation of exactly its rounded size takes it back: no pool lock,
 * no search, no split, no coalescing, no index operation (the free claims it through lfresh with one
 * compare-and-swap, as the inlined free claims a small block). Any other call of this cache that goes
 * to the pool gives the slot's block back first (large_before_pool), so that the pool sees the
 * sequence of frees and allocations it would have seen without the slot: the block comes back where
 * the pool's search, in the same state as at its allocation, would have placed that request again.
 * A kept block that serves a different request, or waits across other calls to the pool, splits the
 * space the pool searches: the replays' peaks rose with it. Only while the pool is single-stream on
 * this stream (solo mode, acct.large_ok), whose own frees record no event either: a block kept here
 * costs another stream nothing it would otherwise have had. */

/* The rounded size a large slot's block of a request of `size` bytes (above GPUMEM__TC_MAX_SIZE) has:
 * 0 for a size that cannot be rounded, which no block has (the pool refuses it). */
static inline size_t large_rsize(size_t size) { return size > SIZE_MAX - 255 ? 0 : (size + 255) & ~(size_t)255; }

/* 1 if the large block of bsize may be kept. Cache lock held. */
static int large_fits(const gpumem__tc *c, size_t bsize) {
  return c->lblk == NULL && bsize <= c->lbudget; /* (lfresh is set only where the pool allows: acct.large_ok) */
}

/* Before a call of this cache's thread to pool p on (ctx, stream) (an allocation it does not serve, a
 * free it does not keep): the slot's block goes back to p first (named when the call names the
 * cache's stream), and no block is fresh any more. Cache lock held. */
static inline void large_before_pool(gpumem__tc *c, gpumem__pool *p, gpumem_context *ctx, gpumem_stream stream) {
  c->lfresh.key = GPUMEM__TC_OWN_EMPTY;
  if (GPUMEM__UNLIKELY(c->lblk != NULL) && c->pool == p) flush_some(c, c->ctx == ctx && c->stream == stream, 0, 1);
}

/* Take the slot's block for a request of size (tag): live again (as gpumem__tc_take_last; lfresh
 * still remembers it, with the state the revive gives it). Cache lock held; the caller accounts the
 * headroom. */
static gpumem__block *large_take(gpumem__tc *c, size_t size, const char *tag) {
  gpumem__block *b = c->lblk;
  c->lblk = NULL;
  c->acct.lcached = 0;
  b->requested = size;
  b->tag = tag;
  gpumem__tc_revive(b); /* the state lfresh expects */
  c->d_req += (int64_t)size;
  c->d_allocs++;
  return b;
}

/* A free on this cache's key of lfresh's block: when it may be kept, it is claimed without the
 * index (the swap decides, as in the inlined free: tcache.h) and kept in the slot. 1 when kept; 0:
 * nothing changed. Cache lock held, keyed to the call. */
static int large_claim(gpumem__tc *c) {
  gpumem__tc_own *o = &c->lfresh;
  if (!large_fits(c, o->meta)) return 0;
  uint64_t state = o->state;
  gpumem__block *b = o->b;
  if (!atomic_compare_exchange_strong_explicit(&b->state, &state, state + 1u, memory_order_acq_rel,
                                               memory_order_relaxed))
    return 0;
  o->state += 2u; /* the state its next take gives it */
  c->lblk = b;
  c->lsz = o->meta;
  c->acct.lcached = o->meta;
  c->acct.headroom += o->meta;
  c->d_req -= (int64_t)b->requested;
  c->d_frees++;
  return 1;
}

int gpumem__tc_probed_alloc(gpumem_context *ctx, int dev, size_t size, gpumem_stream stream, const char *tag,
                            void **out) {
  int hit = gpumem__tc_fast_alloc_(ctx, dev, size, stream, tag, out, 1);
  if (hit == -1) return gpumem__tc_near_hit(size, tag, out) > 0; /* (locked for it; it unlocks) */
  return hit > 0;
}

int gpumem__tc_large_hit(gpumem_context *ctx, int dev, size_t size, gpumem_stream stream, const char *tag, void **out) {
  gpumem__tc *c = gpumem__tls_tc;
  if (!gpumem__tc_trylock(c)) return 0; /* (no membarrier: the full path, which looks too) */
  gpumem__block *b = c->lblk;
  if (b != NULL && c->ctx == ctx && c->dev == dev && c->astream == stream && c->lsz == large_rsize(size) &&
      c->lsz <= c->acct.headroom) {
    c->acct.headroom -= c->lsz;
    b = large_take(c, size, tag);
    void *addr = (void *)b->addr; /* while locked: a reset flushes the cache, then frees b's record */
    gpumem__tc_unlock_fast(c);
    *out = addr;
    return 1;
  }
  gpumem__tc_unlock_fast(c);
  return 0;
}

int gpumem__tc_near_hit(size_t size, const char *tag, void **out) {
  gpumem__tc *c = gpumem__tls_tc;
  size_t rsize = (size + 255) & ~(size_t)255; /* no wrap: size <= GPUMEM__TC_MAX_SIZE */
  unsigned k = 0, at = 0;
  size_t bsize = size != 0 ? near_fit(c, rsize, &k, &at) : 0;
  if (bsize != 0 && bsize <= c->acct.headroom) {
    c->acct.headroom -= bsize;
    gpumem__block *b = gpumem__tc_pop(c, k, at, size, tag);
    void *addr = (void *)b->addr; /* while locked: a reset flushes the cache, then frees b's record */
    gpumem__tc_unlock_fast(c); /* (taken by the inlined hit's try) */
    *out = addr;
    return 1;
  }
  gpumem__tc_unlock_fast(c); /* (taken by the inlined hit's try) */
  return bsize != 0 ? -1 : 0;
}

/* b was just taken out of c (locked, keyed to pool p) for this call: the allocated peak (the headroom,
 * else under the pool lock), then *out, unlocked. */
static gpumem_status take_held(gpumem__tc *c, gpumem__pool *p, gpumem__block *b, void **out) {
  if (b->size <= c->acct.headroom) {
    c->acct.headroom -= b->size;
  } else {
    gpumem__mutex_lock(gpumem__pool_mutex(p));
    gpumem__pool_tc_peak(p, &c->acct);
    gpumem__mutex_unlock(gpumem__pool_mutex(p));
  }
  void *addr = (void *)b->addr; /* while locked (a reset frees the record after its flush) */
  gpumem__tc_unlock(c);
  *out = addr;
  return GPUMEM_OK;
}

gpumem_status gpumem__tc_alloc(gpumem_context *ctx, gpumem__pool *p, size_t size, gpumem_stream stream,
                               const char *tag, void **out, int looked) {
  gpumem__tc *c = tc_self();
  gpumem_status st;
  if (c == NULL) {
    if (gpumem__graph_alloc_routed(ctx, gpumem__pool_device(p), size, stream, tag, out, &st)) return st;
    return gpumem__pool_alloc(p, size, stream, tag, out, NULL);
  }
  tc_say_protocol(ctx); /* (no lock held: the log callback may do what it likes) */
  gpumem__tc_acct *acct = NULL;
  unsigned flushes = 0;
  int fresh = 0; /* a large block from the pool becomes lfresh */
  gpumem__tc_lock(c);
  /* keyed to another (context, pool, stream): an empty cache is rekeyed now, before the pool is asked
   * (so that the pool sees it: see grow_blocked below), a full one after a few such calls */
  if (!(c->ctx == ctx && c->pool == p && c->stream == stream)) tc_miss(c, ctx, p, stream);
  if (c->ctx == ctx && c->pool == p && c->stream == stream) {
    c->misses = 0;
    acct = &c->acct;
    acct->last = NULL;
    acct->hopeless = 0;
    flushes = c->flushes;
    /* (a look just made found nothing; only another thread's flush changed the cache since, and that
     * emptied it) */
    if (size <= GPUMEM__TC_MAX_SIZE && !looked) {
      size_t rsize = (size + 255) & ~(size_t)255; /* no wrap: size is small here */
      unsigned k = 0, at = 0;
      if (near_fit(c, rsize, &k, &at) != 0) return take_held(c, p, gpumem__tc_pop(c, k, at, size, tag), out);
    } else if (size > GPUMEM__TC_MAX_SIZE) {
      size_t rsize = large_rsize(size);
      if (!looked && c->lblk != NULL && c->lsz == rsize) return take_held(c, p, large_take(c, size, tag), out);
      /* the large block from the pool is remembered (lfresh) only when this size was asked for last
       * time too: requests of sizes that do not repeat pay nothing for the slot */
      fresh = rsize == c->lprev;
      c->lprev = rsize;
    }
  }
  large_before_pool(c, p, ctx, stream);
  gpumem__tc_unlock(c);
  /* not keyed: while routes exist no cache is (tc_rekey), and the allocation may be a graph's */
  if (acct == NULL && gpumem__graph_alloc_routed(ctx, gpumem__pool_device(p), size, stream, tag, out, &st)) return st;
  /* acct is read by the pool under its lock: only this thread, or a flush under the pool lock, changes it */
  st = gpumem__pool_alloc(p, size, stream, tag, out, acct);
  if (acct != NULL && acct->grow_blocked) {
    /* the pool would grow (or map) while this cache, or another thread's cache of the pool, may hold
     * blocks: give them back first (cached blocks pin pieces of segments and granules; flushed, they
     * coalesce and may serve this request). This cache's blocks go back as frees on this call's
     * stream when that is theirs, the others' without naming theirs (their events wait for their
     * streams' next calls, as at any rekey). */
    acct->grow_blocked = 0;
    gpumem__tc_lock(c);
    if (c->ctx == ctx && c->pool == p) flush_locked(c, c->stream == stream, 0);
    gpumem__tc_unlock(c);
    if (gpumem__pool_tc_keyed(p, 0) > 1) (void)gpumem__tc_flush(ctx, p, 0); /* the other threads' caches of p */
    st = gpumem__pool_alloc(p, size, stream, tag, out, NULL);
  }
  if ((st == GPUMEM_ERR_OUT_OF_MEMORY || st == GPUMEM_ERR_LIMIT_EXCEEDED) && !(acct != NULL && acct->hopeless)) {
    /* every cache of p is empty after the flush (no grow_blocked can come back: acct NULL). Not for a
     * request above the limit or the device: the same refusal again, counted and logged twice. */
    if (gpumem__tc_flush(ctx, p, 0) > 0) st = gpumem__pool_alloc(p, size, stream, tag, out, NULL);
  }
  if (acct != NULL && st == GPUMEM_OK && acct->last != NULL && (size <= GPUMEM__TC_MAX_SIZE || fresh)) {
    /* remember the block, so that this thread's free of it claims it without the index; not when a
     * flush came between (a reset may have dropped it), nor when the cache was rekeyed. large_ok is
     * read under the cache lock: another thread's flush clears it under that lock (tc_detach). A
     * large size not asked for last time takes no lock here. */
    gpumem__tc_lock(c);
    if (size <= GPUMEM__TC_MAX_SIZE || acct->large_ok) {
      gpumem__block *b = acct->last;
      size_t bsize = acct->last_size;
      if (c->flushes == flushes && c->ctx == ctx && c->pool == p && c->stream == stream) {
        if (bsize <= GPUMEM__TC_MAX_SIZE)
          gpumem__tc_remember(c, b, (uintptr_t)*out, acct->last_state, bsize, c->class_of[bsize >> 8]);
        else
          c->lfresh = (gpumem__tc_own){(uintptr_t)*out, b, acct->last_state, bsize};
      }
      acct->last = NULL;
    }
    gpumem__tc_unlock(c);
  }
  return st;
}

gpumem_status gpumem__tc_free(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  gpumem__tc *c = tc_self();
  if (c == NULL) return gpumem__free_unmonitored(ctx, ptr, stream);
  /* (no tc_say_protocol: a block of this context came from gpumem__tc_alloc, which said it) */
  uintptr_t key = (uintptr_t)ptr;
  uint64_t h = gpumem__ptrmap_hash(key);
  gpumem__ptrmap_shard *s = gpumem__ptrmap_shard_of(&ctx->map, h);
  gpumem__tc_lock(c);
  if (GPUMEM__UNLIKELY(c->lfresh.key == key) && c->ctx == ctx && c->stream == stream && large_claim(c)) {
    /* the large block this cache handed out last */
    c->misses = 0;
    gpumem__tc_unlock(c);
    return GPUMEM_OK;
  }
  /* one look-up in the index claims the live block either way: kept in this cache (even -> odd,
   * the entry stays) or taken out of the index for its pool (even -> even + 2, the entry goes) */
  gpumem__ptrmap_lock(s);
  gpumem__ptrmap_entry *e = gpumem__ptrmap_find(s, key, h);
  gpumem__block *b = e != NULL ? e->block : NULL;
  uint64_t state = b != NULL ? atomic_load_explicit(&b->state, memory_order_acquire) : 1u;
  if (GPUMEM__UNLIKELY((state & 1u) != 0)) { /* absent, or in a thread cache: not live */
    gpumem__ptrmap_unlock(s);
    gpumem__tc_unlock(c);
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN,
                "gpumem_free(%p): not a live allocation of this context (never allocated, already freed, or interior)",
                ptr);
    return GPUMEM_ERR_INVALID_POINTER;
  }
  gpumem__pool *p = e->pool;
  size_t bsize = b->size;
  unsigned k = bsize <= GPUMEM__TC_MAX_SIZE ? c->class_of[bsize >> 8] : 0;
  int keep = bsize <= GPUMEM__TC_MAX_SIZE && c->ctx == ctx && c->stream == stream && p == c->pool &&
             b->uses == NULL && gpumem__tc_fits(c, k, bsize); /* noted on other streams: the pool waits for them */
  /* a thread cache that remembered the block may claim it without the shard lock: the swap decides */
  if (!atomic_compare_exchange_strong_explicit(&b->state, &state, state + (keep ? 1u : 2u), memory_order_acq_rel,
                                               memory_order_acquire)) {
    gpumem__ptrmap_unlock(s);
    gpumem__tc_unlock(c);
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "gpumem_free(%p): freed by another thread at the same time", ptr);
    return GPUMEM_ERR_INVALID_POINTER;
  }
  if (keep) {
    gpumem__ptrmap_unlock(s);
    gpumem__tc_push(c, k, b, bsize);
    /* remembered with the state its next pop gives it: this thread's free of it after that claims
     * it without the index (tcache.h) */
    gpumem__tc_remember(c, b, key, state + 2u, bsize, k);
    gpumem__tc_unlock(c);
    return GPUMEM_OK;
  }
  gpumem__ptrmap_erase_locked(s, e);
  gpumem__ptrmap_unlock(s);
  /* this thread owns b now; a reset takes every cache lock first, so it cannot drop b under us */
  large_before_pool(c, p, ctx, stream);
  gpumem__pool_free_block(p, b, stream);
  if (c->ctx == ctx && c->pool == p && c->stream == stream) c->misses = 0;
  else tc_miss(c, ctx, p, stream);
  gpumem__tc_unlock(c);
  return GPUMEM_OK;
}

uint64_t gpumem__tc_cached_bytes(void) {
  gpumem__tc *c = gpumem__tls_tc;
  if (c == &gpumem__tc_none) return 0;
  gpumem__tc_lock(c);
  uint64_t n = gpumem__tc_acct_cached(&c->acct);
  gpumem__tc_unlock(c);
  return n;
}

size_t gpumem__tc_flush(gpumem_context *ctx, gpumem__pool *p, int detach) {
  size_t n = 0;
  /* the protocol is fixed before the first cache exists: read it only after that choice */
  (void)pthread_once(&g_once, key_init);
  pthread_mutex_lock(&g_reg);
  /* every cache is asked for at once, with one barrier; each is given back as soon as it is done */
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) remote_want(c);
  if (gpumem__tc_asym && g_list != NULL) (void)heavy_barrier();
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) {
    remote_wait(c);
    if (c->ctx == ctx && (p == NULL || c->pool == p)) {
      for (int k = 0; k < GPUMEM__TC_CLASSES; k++) n += c->n[k];
      n += c->lblk != NULL;
      flush_locked(c, 0, detach); /* a detach (destroy, monitoring) forgets every remembered block */
      if (detach) tc_detach(c);
    }
    remote_unlock(c);
  }
  pthread_mutex_unlock(&g_reg);
  return n;
}

void gpumem__tc_lock_all(void) {
  (void)pthread_once(&g_once, key_init); /* (as in gpumem__tc_flush) */
  pthread_mutex_lock(&g_reg);
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) remote_want(c);
  if (gpumem__tc_asym && g_list != NULL) (void)heavy_barrier();
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) remote_wait(c);
}

void gpumem__tc_unlock_all(void) {
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) remote_unlock(c);
  pthread_mutex_unlock(&g_reg);
}

void gpumem__tc_flush_locked(gpumem_context *ctx, gpumem__pool *p) {
  for (gpumem__tc *c = g_list; c != NULL; c = c->next)
    if (c->ctx == ctx && c->pool == p) flush_locked(c, 0, 1); /* a reset drops the blocks */
}

void gpumem__tc_pool_stats(gpumem_context *ctx, gpumem__pool *p, gpumem_stats *one) {
  gpumem__mutex_lock(gpumem__pool_mutex(p));
  *one = *gpumem__pool_stats_locked(p);
  gpumem__mutex_unlock(gpumem__pool_mutex(p));
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) {
    if (c->ctx != ctx || c->pool != p) continue;
    one->allocated_bytes -= gpumem__tc_acct_cached(&c->acct);
    one->requested_bytes = (uint64_t)((int64_t)one->requested_bytes + c->d_req);
    one->num_live = (uint64_t)((int64_t)one->num_live + (int64_t)c->d_allocs - (int64_t)c->d_frees);
    one->num_allocs += c->d_allocs;
    one->num_frees += c->d_frees;
  }
  one->cached_bytes = one->reserved_bytes - one->allocated_bytes;
}

void gpumem__tc_reset_peaks(gpumem_context *ctx, gpumem__pool *p) {
  gpumem__mutex_lock(gpumem__pool_mutex(p));
  gpumem_stats *st = gpumem__pool_stats_locked(p);
  uint64_t cur = st->allocated_bytes;
  for (gpumem__tc *c = g_list; c != NULL; c = c->next) {
    if (c->ctx != ctx || c->pool != p) continue;
    cur -= gpumem__tc_acct_cached(&c->acct);
    c->acct.headroom = 0;
  }
  st->allocated_peak = cur;
  st->reserved_peak = st->reserved_bytes;
  gpumem__mutex_unlock(gpumem__pool_mutex(p));
}
