/* tcache.h: the per-thread cache's layout and its inlined hot paths.
 *
 * gpumem_alloc and gpumem_free try gpumem__tc_fast_alloc / _free first, before
 * any argument check: one thread-local load, a try of the cache's lock (a plain store and a load),
 * a class look-up, and (for a free) the cache's memory of the blocks it handed
 * out or took in plus one compare-and-swap, all inlined into the entry point.
 * Anything else (a miss, another key, a full class, the peak moving, the lock
 * taken) returns 0 or -1 and the caller checks its arguments and takes the
 * out-of-line path (context.c, tcache.c).
 * The protocol is described at the top of tcache.c and ptrmap.c. */
#ifndef GPUMEM_TCACHE_H
#define GPUMEM_TCACHE_H

#include "internal.h"

#include <sched.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPUMEM__HAS_TSAN 1
#endif
#endif
#ifndef GPUMEM__HAS_TSAN
#define GPUMEM__HAS_TSAN 0
#endif
/* 1: the hot paths use their x86-64 instructions (gpumem__tc_trylock, gpumem__tc_revive); 0: C11
 * atomics, also under ThreadSanitizer, which sees only those. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__) && !GPUMEM__HAS_TSAN
#define GPUMEM__TC_X86 1
#else
#define GPUMEM__TC_X86 0
#endif

#define GPUMEM__TC_MAX_SIZE ((size_t)1 << 20)   /* block sizes cached: up to 1 MiB */
#define GPUMEM__TC_CLASSES 81                   /* size classes: gpumem__tc_class(GPUMEM__TC_MAX_SIZE) + 1 */
#define GPUMEM__TC_BIN_CAP 8                    /* blocks per class */
#define GPUMEM__TC_MAX_BYTES ((uint64_t)64 << 20) /* bytes per cache, at most (gpumem__pool_tc_budget) */
/* A block above GPUMEM__TC_MAX_SIZE is kept in the cache's one large slot only from its free to the next
 * call (tcache.c, "The large slot"), under a bound of its own: a GPUMEM__TC_LARGE_DIV-th of the device
 * or limit (gpumem__pool_tc_large_budget). */
#define GPUMEM__TC_LARGE_DIV 16
#define GPUMEM__TC_OWN_LOG 10
#define GPUMEM__TC_OWN (1 << GPUMEM__TC_OWN_LOG)   /* blocks this cache remembers (tcache.h gpumem__tc_own) */

/* A block this cache remembers: one it handed out from the pool, or one freed into it, with the
 * state the block has while it is live by this cache's hand-out (gpumem__block: states only grow).
 * A block freed into the cache is remembered with the state its next pop gives it (the state at
 * the free plus 2; only this cache's owner changes the state of a cached block, by one pop, and a
 * flush forgets every block it gives back). While the block's state equals `state`, it is that same live
 * allocation, so a free by this thread claims it with one compare-and-swap, without the index.
 * The pop itself writes nothing here. key GPUMEM__TC_OWN_EMPTY = empty. Entries refer to blocks of
 * c->pool only: a rekey, a reset's flush and a detach clear them all (a pool reset frees block
 * structs only after flushing every cache under its lock); the other flushes (growth, out of
 * memory, trim) clear the slots of the blocks they give back and keep the live ones (tcache.c
 * flush_locked). */
typedef struct gpumem__tc_own {
  uintptr_t key;               /* the block's address */
  gpumem__block *b;
  uint64_t state;
  size_t meta;                 /* the block's size (a multiple of 256) | its size class (the low 8 bits) */
} gpumem__tc_own;
/* An empty slot's key: 0, which no call can match, since gpumem_free tests ptr != NULL before the
 * inlined hit. (Any other value could be passed by a caller; an empty slot keeps the block pointer
 * and state it had, and a block remembered before a flush may still be live in that state.) */
#define GPUMEM__TC_OWN_EMPTY ((uintptr_t)0)

/* Cached blocks: class k holds n[k] blocks, blk[k * GPUMEM__TC_BIN_CAP + j] for j < n[k], of sizes
 * sz[...] (any size of the class), the most recently freed last. Flat arrays, so that one lea
 * finds the last block of a class. */
typedef struct gpumem__tc {
  atomic_int busy;             /* the owner holds the cache (the asymmetric lock, below) */
  atomic_int remote;           /* another thread holds it or wants it; GPUMEM__TC_REMOTE_LOCKED: no membarrier */
  atomic_int lk;               /* the spinlock of every side when there is no membarrier */
  int dev;                     /* key: device of pool */
  gpumem_context *ctx;         /* key; NULL = detached (then every bin and own entry is empty) */
  gpumem_stream stream;        /* key */
  gpumem_stream astream;       /* the key the allocation hits match: stream, or (stream ^ 1, a handle no call
                                * passes) when an allocation on stream must first ask whether it is captured
                                * (gpumem__graph_probe: only NULL, which no capture takes, needs not) */
  gpumem__pool *pool;
  gpumem__tc_acct acct;        /* room, budget, headroom (see internal.h); cached bytes == 0 iff no block cached */
  int64_t d_req;               /* counters not yet in the pool's statistics (live = allocs - frees) */
  uint64_t d_allocs, d_frees;
  unsigned misses;
  unsigned flushes;            /* flush_locked calls (tcache.c: a block from the pool is remembered only if none came between) */
  struct gpumem__tc *prev, *next; /* g_reg list */
  uint8_t n[GPUMEM__TC_CLASSES];
  size_t sz[GPUMEM__TC_CLASSES * GPUMEM__TC_BIN_CAP];
  gpumem__block *blk[GPUMEM__TC_CLASSES * GPUMEM__TC_BIN_CAP];
  gpumem__block *lblk;         /* the large slot: a freed block above GPUMEM__TC_MAX_SIZE (NULL: empty) ... */
  size_t lsz;                  /* ... of this size (acct.lcached while it is there) */
  size_t lprev;                /* the rounded size of the last request above GPUMEM__TC_MAX_SIZE the pool served */
  uint64_t lbudget;            /* the slot's block has at most this size (gpumem__pool_tc_large_budget) */
  gpumem__tc_own lfresh;       /* the large block this cache handed out last, while no pool call of this cache came
                                * since (meta: its size; key GPUMEM__TC_OWN_EMPTY: none) */
  gpumem__tc_own own[GPUMEM__TC_OWN];
  /* gpumem__tc_class of every size up to GPUMEM__TC_MAX_SIZE, by units of 256 bytes: in the cache, so
   * that the inlined hit reads it at an offset from the one pointer it has (no shift by a variable
   * count, no other base register) */
  uint8_t class_of[(GPUMEM__TC_MAX_SIZE >> 8) + 1];
} gpumem__tc;

/* This thread's cache (NULL until its first call, or after its destructor ran).
 * Not initial-exec: the shared library is dlopen()ed (Python, ctypes), and
 * an initial-exec access makes the loader place all of the library's TLS
 * (cudart_static's too) in the static TLS block, which fails ("cannot
 * allocate memory in static TLS block"). Where the compiler has it, the
 * library is built with TLS descriptors (-mtls-dialect=gnu2, src/CMakeLists.txt),
 * which make this access cheap without that constraint. */
extern _Thread_local gpumem__tc *gpumem__tls_tc;
/* What gpumem__tls_tc points to before this thread's first call and after its cache is gone:
 * keyed to no context (its ctx is its own address), so the inlined hits miss on it. Never
 * locked but by those hits' try-lock, never changed. */
extern gpumem__tc gpumem__tc_none;

/* The cache lock is asymmetric. Its owner (the thread whose cache it is) takes it with plain stores
 * and loads, no locked instruction: it sets `busy`, then reads `remote`; zero, the cache is its own
 * until it clears `busy`. Another thread (a flush, statistics, a reset: always under g_reg, so one
 * at a time) sets `remote`, then makes every running thread of the process execute a full memory
 * barrier (membarrier(2), MEMBARRIER_CMD_PRIVATE_EXPEDITED), then waits for `busy` to be clear.
 * After that barrier, either the owner's `busy` is visible to it, or the owner's read of `remote`
 * comes after the barrier and sees it set (the owner then clears `busy` and waits, or, in an inlined
 * hit, takes the full path). This is Dekker's mutual exclusion with the owner's fence moved to the
 * rare side (userspace RCU, folly's asymmetric fences, the JVM's biased locks do the same).
 * Where membarrier is not available (not Linux, an old kernel, a seccomp filter), `remote` stays at
 * GPUMEM__TC_REMOTE_LOCKED: every inlined hit misses, and the owner and the others share `lk`, a
 * plain spinlock, on the out-of-line paths (correct, slower). */
#define GPUMEM__TC_REMOTE_LOCKED 2
/* 1: membarrier is registered and the asymmetric protocol is in use (set once, before any cache exists) */
extern int gpumem__tc_asym;

void gpumem__tc_lock_slow(gpumem__tc *c);

/* The inlined hits only try the owner's side of the lock: held by another thread (a flush), or with
 * no membarrier (`remote` stays GPUMEM__TC_REMOTE_LOCKED), they leave it to the full path, and with
 * no call left in them they need no saved registers. A plain store and a load, no locked
 * instruction; the unlock is gpumem__tc_unlock_fast. */
#if GPUMEM__TC_X86
/* x86-64: the store, and a compare of `remote` in memory (no register for its value). x86 keeps
 * loads in order, and the "memory" clobber keeps the compiler from moving accesses across: the
 * load is an acquire. (Not under ThreadSanitizer, which sees only C11 atomics.) */
static inline __attribute__((always_inline)) int gpumem__tc_trylock(gpumem__tc *c) {
  __asm__ goto("movl $1, %0\n\tcmpl $0, %1\n\tjne %l[taken]" : : "m"(c->busy), "m"(c->remote) : "memory", "cc"
               : taken);
  return 1;
taken:
  atomic_store_explicit(&c->busy, 0, memory_order_release);
  return 0;
}
#else
static inline __attribute__((always_inline)) int gpumem__tc_trylock(gpumem__tc *c) {
  atomic_store_explicit(&c->busy, 1, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
  if (GPUMEM__LIKELY(atomic_load_explicit(&c->remote, memory_order_acquire) == 0)) return 1;
  atomic_store_explicit(&c->busy, 0, memory_order_release);
  return 0;
}
#endif
/* Release what gpumem__tc_trylock took (the protocol is then the asymmetric one). */
static inline __attribute__((always_inline)) void gpumem__tc_unlock_fast(gpumem__tc *c) {
  atomic_store_explicit(&c->busy, 0, memory_order_release);
}

/* Take the calling thread's own cache lock (c == gpumem__tls_tc, or the destructor's cache), waiting
 * for another thread that holds it. */
static inline void gpumem__tc_lock(gpumem__tc *c) {
  if (GPUMEM__LIKELY(gpumem__tc_asym) && GPUMEM__LIKELY(gpumem__tc_trylock(c))) return;
  gpumem__tc_lock_slow(c);
}
static inline void gpumem__tc_unlock(gpumem__tc *c) {
  if (GPUMEM__LIKELY(gpumem__tc_asym)) gpumem__tc_unlock_fast(c);
  else atomic_store_explicit(&c->lk, 0, memory_order_release);
}

/* A cached block becomes live again: its state goes odd -> even, with release order (a free or
 * gpumem_ptr_info that sees the new state sees the fields written before). Only the owner of the
 * cache that holds the block changes its state (the others read it, or compare-and-swap it, which
 * fails while it is odd), so on x86-64 a plain add to memory does it: an aligned 8-byte store is
 * atomic to readers, x86 keeps stores in order, and the "memory" clobber keeps the compiler from
 * moving the field writes after it. (Not under ThreadSanitizer, which sees only C11 atomics.) */
static inline __attribute__((always_inline)) void gpumem__tc_revive(gpumem__block *b) {
#if GPUMEM__TC_X86
  __asm__ volatile("addq $1, %0" : "+m"(*(uint64_t *)&b->state) : : "memory");
#else
  atomic_store_explicit(&b->state, atomic_load_explicit(&b->state, memory_order_relaxed) + 1u, memory_order_release);
#endif
}
/* The size class of a block or rounded request of bsize <= GPUMEM__TC_MAX_SIZE bytes: in units of
 * 256 B, exact below 8 units (2 KiB), then 8 classes per power of two (a class spans 12.5 % of its
 * smallest size), as the pool's TLSF buckets. 64 KiB -> 48, 1 MiB -> 80. gpumem__tc.class_of holds it for
 * every size. */
static inline unsigned gpumem__tc_class(size_t bsize) {
  size_t u = bsize >> 8;
  /* s = log2(u) - 3, and 0 below 16 units: then u >> s is 8..15 (the class within its power of two,
   * plus 8), or u itself below 8 */
  unsigned s = (unsigned)(__builtin_clzll((unsigned long long)(u | 8u)) ^ 63) - 3u;
  return (s << 3) + (unsigned)(u >> s);
}

/* 1 when the cache c may hold a block in its large slot: read without its lock, by its owner, as a hint
 * (gpumem__tc_large_hit looks again under the lock). x86-64: a plain load; where the hot paths use C11
 * atomics (ThreadSanitizer, which sees a race in any unlocked read), always 1. */
static inline __attribute__((always_inline)) int gpumem__tc_large_held(const gpumem__tc *c) {
#if GPUMEM__TC_X86
  return __atomic_load_n(&c->lblk, __ATOMIC_RELAXED) != NULL;
#else
  (void)c;
  return 1;
#endif
}

/* Where key is remembered (a multiplicative hash: block addresses share their low bits). */
static inline gpumem__tc_own *gpumem__tc_own_of(gpumem__tc *c, uintptr_t key) {
  return &c->own[(key * 0x9E3779B97F4A7C15u) >> (64 - GPUMEM__TC_OWN_LOG)];
}

/* Remember block b at addr (of bsize bytes, class k), live with state `state` when this cache hands
 * it out. Cache lock held. (addr and bsize come from the caller: a block the pool handed out may be
 * freed by a stale pointer on another thread meanwhile, so its record is not read here.) */
static inline void gpumem__tc_remember(gpumem__tc *c, gpumem__block *b, uintptr_t addr, uint64_t state, size_t bsize,
                                       unsigned k) {
  gpumem__tc_own *o = gpumem__tc_own_of(c, addr);
  o->key = addr;
  o->b = b;
  o->state = state;
  o->meta = bsize | k;
}

/* Between a test of cache fields and their update: the compiler forgets the values it loaded, so
 * that the update is one read-modify-write instruction (x86: subb $1, mem) rather than a copy, an
 * add and a store of the value it still had. Changes nothing else (the cache is locked). */
#if defined(__GNUC__) || defined(__clang__)
#define GPUMEM__TC_RMW_BARRIER() __asm__ volatile("" ::: "memory")
#else
#define GPUMEM__TC_RMW_BARRIER() ((void)0)
#endif

/* Take the last block of class k (at last = k * GPUMEM__TC_BIN_CAP + n[k] - 1, n[k] > 0; bsize bytes)
 * for a request of size (tag): live again. Cache lock held; the caller accounts the headroom. */
static inline __attribute__((always_inline)) gpumem__block *gpumem__tc_take_last(gpumem__tc *c, unsigned k, size_t last,
                                                                                 size_t bsize, size_t size,
                                                                                 const char *tag) {
  gpumem__block *b = c->blk[last];
  GPUMEM__TC_RMW_BARRIER();
  c->n[k]--;
  c->acct.room += bsize;
  b->requested = size;
  b->tag = tag;
  gpumem__tc_revive(b); /* the state the slot that remembers b expects */
  c->d_req += (int64_t)size;
  c->d_allocs++;
  return b;
}

/* Take block j of class k (j < n[k]) for a request of size (tag): it changes places with the last
 * block of the class, which is then taken. Cache lock held; the caller accounts the headroom. */
static inline gpumem__block *gpumem__tc_pop(gpumem__tc *c, unsigned k, unsigned j, size_t size, const char *tag) {
  size_t base = (size_t)k * GPUMEM__TC_BIN_CAP, last = base + c->n[k] - 1u, at = base + j;
  gpumem__block *b = c->blk[at];
  size_t bsize = c->sz[at];
  c->blk[at] = c->blk[last];
  c->sz[at] = c->sz[last];
  c->blk[last] = b;
  c->sz[last] = bsize;
  return gpumem__tc_take_last(c, k, last, bsize, size, tag);
}

/* Keep the block b (of bsize bytes, class k; just claimed: odd state) in its class. Cache lock held. */
static inline void gpumem__tc_push(gpumem__tc *c, unsigned k, gpumem__block *b, size_t bsize) {
  size_t at = (size_t)k * GPUMEM__TC_BIN_CAP + c->n[k];
  c->sz[at] = bsize;
  c->blk[at] = b;
  GPUMEM__TC_RMW_BARRIER();
  c->n[k]++;
  c->acct.room -= bsize;
  c->acct.headroom += bsize;
  c->d_req -= (int64_t)b->requested;
  c->d_frees++;
}

/* 1 if a block of bsize (class k) may be cached. Cache lock held. */
static inline int gpumem__tc_fits(const gpumem__tc *c, unsigned k, size_t bsize) {
  return c->n[k] < GPUMEM__TC_BIN_CAP && bsize <= c->acct.room;
}

/* 1 and *out set: served from this thread's cache (the block freed last in rsize's class, when it
 * is not smaller than rsize: then it is at most 12.5 % larger). 0: nothing changed, take the full path. -1: the cache is keyed to these
 * arguments and stays locked: gpumem__tc_near_hit looks further (out of line, so that this path
 * makes no call and saves no register). -2: the request is above GPUMEM__TC_MAX_SIZE and the cache's
 * large slot may hold a block (the cache not locked): gpumem__tc_large_hit looks there. Runs before any argument check: a cache serves only the
 * (ctx, dev, stream) it is keyed to, which were valid when it was keyed. A NULL ctx matches only a
 * detached cache, whose bins are empty; a size of 0 finds no block (every block has 256 bytes or
 * more); a forked child and monitoring (ctx->mon) detach the caches (tcache.c, trace.c). */
static inline __attribute__((always_inline)) int gpumem__tc_fast_alloc_(gpumem_context *ctx, int dev, size_t size,
                                                                        gpumem_stream stream, const char *tag,
                                                                        void **out, const int probed) {
  gpumem__tc *c = gpumem__tls_tc;
  if (GPUMEM__UNLIKELY(size > GPUMEM__TC_MAX_SIZE)) return gpumem__tc_large_held(c) ? -2 : 0; /* alloc_large (context.c) */
  if (GPUMEM__UNLIKELY(!gpumem__tc_trylock(c))) return 0;
  /* (probed: the key itself matches, and the backend is asked whether the stream is captured, with the
   * cache held: a remote flush waits for one driver question, where letting go and taking the cache
   * again cost the probed pair 271 instructions against 224, scripts/callgrind-pairs.sh ... 256) */
  if (GPUMEM__LIKELY(c->ctx == ctx && c->dev == dev && (probed ? c->stream : c->astream) == stream)) {
    if (probed && !gpumem__graph_uncaptured(ctx, dev, stream)) {
      gpumem__tc_unlock_fast(c);
      return 0;
    }
    /* (from here on the call's ctx, dev and stream are the cache's: alloc_near in context.c reads them there) */
    size_t rsize = (size + 255) & ~(size_t)255;
    unsigned k = c->class_of[rsize >> 8];
    unsigned n = c->n[k];
    size_t last, bsize;
    /* a block of rsize's class that is not smaller is at most 12.5 % larger (a class spans 12.5 % of
     * its smallest size, and exactly one size below 2 KiB); its place is computed once n > 0 */
    if (GPUMEM__LIKELY(n > 0 && (bsize = c->sz[last = (size_t)k * GPUMEM__TC_BIN_CAP + n - 1u]) >= rsize &&
                       bsize <= c->acct.headroom)) {
      GPUMEM__TC_RMW_BARRIER();
      c->acct.headroom -= bsize;
      gpumem__block *b = gpumem__tc_take_last(c, k, last, bsize, size, tag);
      void *addr = (void *)b->addr; /* while locked: a reset flushes the cache, then frees b's record */
      gpumem__tc_unlock_fast(c);
      *out = addr;
      return 1;
    }
    return -1;
  }
  gpumem__tc_unlock_fast(c);
  return 0;
}

static inline __attribute__((always_inline)) int gpumem__tc_fast_alloc(gpumem_context *ctx, int dev, size_t size,
                                                                       gpumem_stream stream, const char *tag,
                                                                       void **out) {
  return gpumem__tc_fast_alloc_(ctx, dev, size, stream, tag, out, 0);
}

/* The same hit for an allocation on a stream that asks about capture (astream), after the inlined one
 * missed (context.c alloc_probed): with the cache keyed to the call, the backend is asked, and when the
 * stream is not captured the hit is made as the inlined one would: 1 and *out set; else 0 and nothing
 * changed (the cache unlocked either way), for the full path. */
int gpumem__tc_probed_alloc(gpumem_context *ctx, int dev, size_t size, gpumem_stream stream, const char *tag,
                            void **out);

/* After gpumem__tc_fast_alloc returned -1 (the calling thread's cache is locked and keyed to the
 * call): 1 and *out set when a cached block of size .. size + 12.5 % serves it; else nothing
 * changed, and 0 when no cached block fits (the full path need not look again), -1 when one fits
 * but only the full path may take it (the allocated peak moves: gpumem__tc_alloc). Either way the
 * cache is unlocked. */
int gpumem__tc_near_hit(size_t size, const char *tag, void **out);

/* After gpumem__tc_fast_alloc returned -2 (a request above GPUMEM__TC_MAX_SIZE; the cache is not
 * locked): 1 and *out set when the calling thread's cache, keyed to (ctx, dev, stream), holds a block
 * of exactly the request's rounded size in its large slot; else 0, nothing changed. */
int gpumem__tc_large_hit(gpumem_context *ctx, int dev, size_t size, gpumem_stream stream, const char *tag, void **out);

/* 1: a block this cache remembers, freed into it. 0: nothing changed, take the full path. -1: the
 * cache is keyed to this call's ctx and stream and remembers ptr, but cannot take it (its class is
 * full, the budget, or the block is not live in the state remembered): the cache stays locked, and
 * free_held (context.c, out of line) unlocks it and takes the full path, with the ctx and stream
 * read from the cache, so that this path keeps only ptr in a register for it. ptr != NULL (the
 * caller tests it: an empty slot's key is 0). Runs before the other argument checks: only a
 * pointer this cache remembers can match, and only on the (ctx, stream) the cache is keyed to. */
static inline __attribute__((always_inline)) int gpumem__tc_fast_free(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  gpumem__tc *c = gpumem__tls_tc;
  uintptr_t key = (uintptr_t)ptr;
  gpumem__tc_own *o = gpumem__tc_own_of(c, key);
  if (GPUMEM__UNLIKELY(!gpumem__tc_trylock(c))) return 0;
  if (GPUMEM__LIKELY(o->key == key && c->ctx == ctx && c->stream == stream)) {
    size_t meta = o->meta;
    size_t bsize = meta & ~(size_t)255;
    unsigned k = (unsigned)(meta & 255u);
    uint64_t state = o->state;
    gpumem__block *b = o->b;
    /* (the slot stays, expecting the state the next pop gives the block: the block's
     * state passes it only through that pop, and a flush forgets the blocks it gives back) */
    if (GPUMEM__LIKELY(gpumem__tc_fits(c, k, bsize)) &&
        GPUMEM__LIKELY(atomic_compare_exchange_strong_explicit(&b->state, &state, state + 1u, memory_order_acq_rel,
                                                               memory_order_relaxed))) {
      GPUMEM__TC_RMW_BARRIER();
      o->state += 2u; /* (o->state was state: the claim's swap compared it) */
      gpumem__tc_push(c, k, b, bsize);
      gpumem__tc_unlock_fast(c);
      return 1;
    }
    return -1;
  }
  gpumem__tc_unlock_fast(c);
  return 0;
}

#endif
