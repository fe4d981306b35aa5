/* fuzz_ops.c: libFuzzer harness for libgpumem on the sim backend.
 *
 * The input is decoded into a configuration (first 2 bytes: thresholds, limits,
 * the OOM callback, initial bytes, stream_deps, plain or expandable segments) and a sequence of
 * operations: alloc, free (one in eight after gpumem_record_stream on one or
 * two streams), double/interior/foreign free, trim, reset, scope begin/alloc/end, buffers, stream switches, delayed-event mode and stream
 * completion, fault injection (gpumem_sim_fail_nth; gpumem_sim_fail_every, a driver failing now and
 * then: code 179; the host running out of memory at the k-th host allocation of the library: code
 * 199) and clearing, external
 * device usage, absurd sizes. Every operation is checked against a reference
 * model of the live blocks:
 *   - contents stamped into every live block are checked before each free and
 *     after every operation that could move or drop memory (trim, reset,
 *     scope end, OOM callback, fault clearing);
 *   - no two live blocks overlap, every pointer is 256-byte aligned;
 *   - statuses are the ones gpumem.h documents for the function, and
 *     GPUMEM_ERR_BACKEND only while a fault is armed; a failed call leaves its
 *     out-parameter untouched and changes no block;
 *   - stream order: before each free the harness queues a work item that uses
 *     the block on the freeing stream and on each noted stream
 *     (gpumem_sim_stream_submit); a later allocation that gets any of that
 *     memory on another stream while such an item is still pending on the sim
 *     (delayed mode) is a violation (order_check);
 *   - after a free the pointer is invalid (a second free gives
 *     GPUMEM_ERR_INVALID_POINTER, ptr_info too); a reset invalidates every
 *     block of the device;
 *   - stats after every step: num_live and requested_bytes equal the model,
 *     allocated_bytes >= the rounded model bytes, cached = reserved - allocated,
 *     reserved <= capacity (and <= limit_bytes), reserved equals what the sim
 *     has handed out, the ALL_DEVICES sum equals the per-device stats;
 *   - at the end everything is freed, destroy(ctx, 0) succeeds and the sim has
 *     0 bytes handed out.
 *   - in a build with -DGPUMEM_DEBUG_CHECKS=ON, the pool's own invariant checks
 *     after every allocation and free (slower, and deeper: the granule maps,
 *     idle lists and free indexes of expandable segments).
 * A violation prints what and where, then __builtin_trap().
 *
 * Build: fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined), or
 * with -DFUZZ_STANDALONE for a plain main() that runs files/directories given
 * as arguments, or random inputs: `fuzz_ops_standalone -random N [SEED]`.
 * At exit it prints "fuzz_ops: N inputs, M operations" and how many allocations
 * got memory freed with work queued (operations counted
 * over every input run in the process).
 */
#include <gpumem.h>
#include <gpumem/sim.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define DEVS 2
#define DEV_CAP (64 * MiB) /* GPUMEM_SIM_DEVICES=2x64MiB */
#define MAXB 96            /* model blocks */
#define MAXSCOPES 2
#define MAXBUF 4
#define MAXOPS 2048
#define NSTREAMS 4

static unsigned long long g_ops, g_inputs, g_allocs_ok, g_frees_ok, g_resets_ok, g_faults, g_ooms;

/* ---------------------------------------------------------------------- */
/* Failure                                                                 */

static int g_cur_op = -1;
static const char *g_cur_name = "";

__attribute__((noreturn, format(printf, 2, 3))) static void die(int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz_ops: VIOLATION (fuzz_ops.c:%d, op #%d %s): ", line, g_cur_op, g_cur_name);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  __builtin_trap();
}
#define CHECK(cond, ...)                 \
  do {                                   \
    if (!(cond)) die(__LINE__, __VA_ARGS__); \
  } while (0)
#define SN(s) gpumem_status_name(s)

/* FUZZ_OPS_TRACE=1 in the environment prints every operation (to debug a crash input). */
static int g_trace;
#define TRACE(...)                                  \
  do {                                              \
    if (g_trace) fprintf(stderr, "  " __VA_ARGS__); \
  } while (0)

/* ---------------------------------------------------------------------- */
/* Input reader                                                            */

typedef struct reader {
  const uint8_t *d;
  size_t n, i;
} reader;

static int more(const reader *r) { return r->i < r->n; }
static uint8_t u8(reader *r) { return r->i < r->n ? r->d[r->i++] : 0; }
static uint16_t u16(reader *r) {
  uint16_t a = u8(r);
  return (uint16_t)(a | (uint16_t)u8(r) << 8);
}
static uint32_t u32(reader *r) {
  uint32_t a = u16(r);
  return a | (uint32_t)u16(r) << 16;
}

/* ---------------------------------------------------------------------- */
/* Model                                                                   */

enum { OWN_PLAIN = 0, OWN_SCOPE = 1, OWN_BUF = 2 };

typedef struct mblock {
  void *p;      /* NULL = slot empty */
  size_t n;
  int dev;
  uint64_t tag;
  int owner, owner_ix;
  gpumem_stream st; /* allocated on: the block is ready for work queued there */
  int graph;        /* allocated on a stream being captured: in the capture's pool, which gpumem_reset leaves */
} mblock;

typedef struct mscope {
  gpumem_scope *s;
  int dev;
  gpumem_stream st;
  int nblocks; /* model blocks owned (they stay in the model until the scope ends) */
} mscope;

typedef struct mbuf {
  gpumem_buffer b;
  int bix; /* model block, -1 when empty */
} mbuf;

typedef struct world {
  gpumem_context *ctx;
  mblock b[MAXB];
  mscope sc[MAXSCOPES];
  mbuf buf[MAXBUF];
  int armed;            /* a fault may fire: GPUMEM_ERR_BACKEND (and OOM) tolerated */
  uint64_t limit;       /* limit_bytes, 0 = none */
  void *recent[8];      /* recently freed pointers, for double frees */
  int nrecent;
  uint64_t next_tag;
  int oom_cb_frees;     /* how many blocks the OOM callback may free per call */
  int in_callback;
} world;

static world W;
static int unmet_capture(void);
/* a backend call may be refused: a fault armed, or a capture under way the library has not met */
#define ARMED (W.armed || unmet_capture())
static gpumem_context *g_keeper; /* holds the sim state between inputs */

static const gpumem_stream g_streams[NSTREAMS] = {NULL, (gpumem_stream)0x100, (gpumem_stream)0x200, (gpumem_stream)0x300};

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* Stamp the first and last 16 bytes and 8 bytes in the middle (cheap for any size). */
static void put_bytes(uint8_t *p, size_t n, uint64_t v) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * (i % 8))) ^ (uint8_t)i;
}
static int chk_bytes(const uint8_t *p, size_t n, uint64_t v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != ((uint8_t)(v >> (8 * (i % 8))) ^ (uint8_t)i)) return 0;
  return 1;
}
static void stamp(const mblock *b) {
  uint8_t *p = b->p;
  uint64_t v = mix64(b->tag);
  if (b->n < 64) {
    put_bytes(p, b->n, v);
    return;
  }
  put_bytes(p, 16, v);
  put_bytes(p + b->n / 2, 8, v ^ 1);
  put_bytes(p + b->n - 16, 16, v ^ 2);
}
static int stamp_ok(const mblock *b) {
  const uint8_t *p = b->p;
  uint64_t v = mix64(b->tag);
  if (b->n < 64) return chk_bytes(p, b->n, v);
  return chk_bytes(p, 16, v) && chk_bytes(p + b->n / 2, 8, v ^ 1) && chk_bytes(p + b->n - 16, 16, v ^ 2);
}

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static void check_all_contents(void) {
  for (int i = 0; i < MAXB; i++)
    if (W.b[i].p) CHECK(stamp_ok(&W.b[i]), "block %d (%p, %zu bytes, device %d) lost its contents", i, W.b[i].p, W.b[i].n, W.b[i].dev);
}

static int model_find(void *p) {
  for (int i = 0; i < MAXB; i++)
    if (W.b[i].p == p) return i;
  return -1;
}

static int model_free_slot(void) { return model_find(NULL); }

static void remember_freed(void *p) {
  W.recent[W.nrecent++ % 8] = p;
}

/* Add a new block after a successful alloc: alignment, no overlap, stamp. */
static int model_add(void *p, size_t n, int dev, int owner, int owner_ix) {
  CHECK(p != NULL, "successful alloc of %zu bytes gave NULL", n);
  CHECK(((uintptr_t)p & 255) == 0, "pointer %p is not 256-byte aligned", p);
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < MAXB; i++) {
    if (!W.b[i].p) continue;
    uintptr_t c = (uintptr_t)W.b[i].p;
    CHECK(a + n <= c || c + W.b[i].n <= a, "new block %p+%zu (device %d) overlaps live block %d %p+%zu (device %d)", p, n, dev, i,
          W.b[i].p, W.b[i].n, W.b[i].dev);
  }
  int k = model_free_slot();
  CHECK(k >= 0, "model full (harness bug)");
  W.b[k] = (mblock){p, n, dev, ++W.next_tag, owner, owner_ix};
  stamp(&W.b[k]);
  size_t sz = 0;
  int d = -1;
  gpumem_status s = gpumem_ptr_info(W.ctx, p, &sz, &d);
  CHECK(s == GPUMEM_OK && sz == n && d == dev, "ptr_info(%p) after alloc: %s size %zu/%zu device %d/%d", p, SN(s), sz, n, d, dev);
  g_allocs_ok++;
  return k;
}

static void model_drop(int k) {
  remember_freed(W.b[k].p);
  W.b[k].p = NULL;
}

/* ---------------------------------------------------------------------- */
/* Stream order                                                            */

/* The harness uses each block as a caller would: before freeing it, it queues a work item that uses
 * the block on the freeing stream and on every stream noted by gpumem_record_stream
 * (gpumem_sim_stream_submit; in delayed mode the item stays pending until the sim completes it).
 * Every free leaves a record of those items, and every allocation is checked against the records of
 * the memory it got: a block freed on stream S may serve S at once, another stream only once S's item
 * has completed; a noted stream's item must have completed before any other stream gets it
 * (DESIGN, "Allocation"; the library is stricter, waiting for noted streams' items on S too). A
 * record whose items all completed is dropped. */
#define MAXPEND 128
static int capturing(int dev, gpumem_stream st);
typedef struct pend {
  int used, dev, ns;
  uintptr_t a;
  size_t n;
  gpumem_stream s[3]; /* s[0]: the freeing stream; then the noted ones */
  uint64_t t[3];
} pend;
static pend g_pend[MAXPEND];
static unsigned g_pend_next;
static unsigned long long g_order_checks, g_order_pending;

static int item_done(int dev, gpumem_stream st, uint64_t t) {
  int done = 0;
  gpumem_status s = gpumem_sim_stream_done(dev, st, t, &done);
  CHECK(s == GPUMEM_OK, "sim_stream_done: %s", SN(s));
  return done;
}

static int pend_all_done(const pend *q) {
  for (int i = 0; i < q->ns; i++)
    if (!item_done(q->dev, q->s[i], q->t[i])) return 0;
  return 1;
}

/* The caller orders stream u's later work after the work queued on stream a so far (as with
 * cudaStreamWaitEvent), or, when the sim has no room for one more wait, synchronises a. */
static void user_wait(int dev, gpumem_stream u, gpumem_stream a) {
  if (u == a) return;
  if (capturing(dev, u) || capturing(dev, a)) {
    /* a wait would join the capture: the caller waits for a's work before it instead (what a synchronised
     * before the capture began, the sim completes: no backend call, so the capture stays valid) */
    gpumem_sim_stream_complete(dev, a);
    return;
  }
  gpumem_status s = gpumem_sim_stream_wait(dev, u, a);
  if (s == GPUMEM_ERR_OUT_OF_MEMORY) {
    gpumem_sim_stream_complete(dev, a);
    return;
  }
  CHECK(s == GPUMEM_OK, "sim_stream_wait: %s", SN(s));
}

/* One work item of the caller's on stream u (a kernel using a block). */
static uint64_t user_submit(int dev, gpumem_stream u) {
  uint64_t t = 0;
  if (capturing(dev, u)) return 0; /* captured, not run: nothing the device does now */
  gpumem_status s = gpumem_sim_stream_submit(dev, u, &t);
  CHECK(s == GPUMEM_OK, "sim_stream_submit: %s", SN(s));
  return t;
}

/* The caller's last uses of block b before it is freed on stream st: a work item on st and on each noted
 * stream, each first ordered after the block's own stream (the block is ready for work there; a caller
 * who uses it elsewhere orders that work after it). Returns the record's slot (kept only if the free
 * succeeds: pend_commit). */
static int pend_uses(const mblock *b, gpumem_stream st, const gpumem_stream *noted, int nnoted) {
  int k = -1;
  for (unsigned i = 0; i < MAXPEND && k < 0; i++) {
    unsigned j = (g_pend_next + i) % MAXPEND;
    if (!g_pend[j].used || pend_all_done(&g_pend[j])) k = (int)j;
  }
  if (k < 0) k = (int)(g_pend_next % MAXPEND); /* all pending: the oldest slot is reused (coverage lost, no false alarm) */
  g_pend_next = (unsigned)k + 1;
  pend *q = &g_pend[k];
  memset(q, 0, sizeof *q);
  q->dev = b->dev;
  q->a = (uintptr_t)b->p;
  q->n = b->n;
  for (int i = -1; i < nnoted; i++) {
    gpumem_stream u = i < 0 ? st : noted[i];
    if (i >= 0 && u == st) continue;
    user_wait(b->dev, u, b->st);
    q->s[q->ns] = u;
    q->t[q->ns] = user_submit(b->dev, u);
    q->ns++;
  }
  return k;
}

static void pend_commit(int k, int freed) { g_pend[k].used = freed; }

/* A new block [p, p + n) on stream st of dev: no work the caller queued on its memory before a free is
 * still pending on another stream. */
static void order_check(int dev, const void *p, size_t n, gpumem_stream st) {
  const uintptr_t a = (uintptr_t)p;
  if (capturing(dev, st)) return; /* its work runs when the graph is launched: graph_check's pool rule instead */
  for (int j = 0; j < MAXPEND; j++) {
    pend *q = &g_pend[j];
    if (!q->used) continue;
    if (q->dev != dev || a + n <= q->a || q->a + q->n <= a) continue;
    g_order_checks++;
    int waited = 0;
    for (int i = 0; i < q->ns; i++) {
      if (item_done(dev, q->s[i], q->t[i])) continue;
      waited = 1;
      /* still running: only work that st's new work follows on the device may be (st's own, one st
       * waits for, directly or through other streams: the caller's waits and the library's) */
      int ordered = 0;
      CHECK(gpumem_sim_stream_ordered(dev, st, q->s[i], q->t[i], &ordered) == GPUMEM_OK, "sim_stream_ordered");
      CHECK(ordered, "new block %p+%zu on stream %p (device %d) overlaps %p+%zu, freed on stream %p, whose %s stream %p "
            "has not completed the work queued before the free (item %llu), and nothing orders it before the new "
            "block's stream", p, n, st, dev, (void *)q->a, q->n, q->s[0], i == 0 ? "freeing" : "noted", q->s[i],
            (unsigned long long)q->t[i]);
    }
    g_order_pending += waited;
    if (!waited) q->used = 0;
  }
}

/* ---------------------------------------------------------------------- */
/* Captures nobody routed                                                  */

/* At most one capture at a time, on a stream other than NULL (gpumem_sim_stream_begin_capture). The
 * library must make no backend call that invalidates it (checked at its end, unless a fault was armed
 * meanwhile: then the library may not learn of it), and the memory allocated on the capturing stream
 * belongs to the capture's pool: no allocation outside that capture gets any of it until the pool is
 * released (gpumem_capture_pools_release), which keeps it while the library still knows the capture
 * (under way, or ended with no call on its stream since and no gpumem_capture_ended). The harness follows
 * what it knows for sure: a capture it told the library of (gpumem_capture_ended) is known to have ended;
 * one ended since without that may or may not be. A capture during which
 * a fault was armed is not checked: the library may have taken a failed question for its end. */
#define MAXCAP 16
#define MAXGR 256
enum { CAP_NONE = 0, CAP_ACTIVE, CAP_ENDED, CAP_KNOWN_ENDED };
typedef struct mcap {
  int state, dev, armed;
  gpumem_stream st;
  int met;  /* a call of the library named its stream since it began: the library knows it from then on */
  int lost; /* invalidated before that: gpumem.h's ::gpumem_graph_pool says a capture is known from its
             * first allocation or free; before, a call (a trim's device synchronisation, an event on the
             * NULL stream) may invalidate it, and then nothing of it is checked */
} mcap;
typedef struct grange {
  int used, dev, cap;
  uintptr_t a;
  size_t n;
} grange;
static mcap g_cap[MAXCAP];
static int g_ncap, g_active = -1; /* captures so far (slots reused modulo MAXCAP), the one under way */
static grange g_gr[MAXGR];
static unsigned long long g_captures, g_capture_blocks;
/* capture operations (FUZZ_OPS_CAPTURE=0: off, for an input found before they were added) */
static int g_capture_ops;

static int capturing(int dev, gpumem_stream st) {
  return g_active >= 0 && g_cap[g_active].dev == dev && g_cap[g_active].st == st;
}

/* A capture under way that the library has not met yet: a backend call it makes may be refused
 * (GPUMEM_ERR_BACKEND), as with a fault armed. */
static int unmet_capture(void) { return g_active >= 0 && !g_cap[g_active].met; }

/* Before each operation: a capture invalidated before the library met it is lost (mcap.lost). */
static void capture_check(void) {
  if (g_active < 0 || g_cap[g_active].lost) return;
  mcap *m = &g_cap[g_active];
  int cs = 0;
  uint64_t id = 0;
  if (gpumem_sim_stream_capture_status(m->dev, m->st, &cs, &id, NULL) != GPUMEM_OK || cs != 2) return;
  CHECK(!m->met || m->armed || W.armed, "operation #%d invalidated the capture on stream %p (device %d), which the library "
        "knew, with no fault armed", g_cur_op - 1, m->st, m->dev);
  m->lost = 1;
}

/* A call that named stream st of dev succeeded: the library has met the capture there, if any. */
static void named(int dev, gpumem_stream st) {
  if (g_active >= 0 && g_cap[g_active].dev == dev && g_cap[g_active].st == st) g_cap[g_active].met = 1;
}

/* A new block [p, p + n) on st of dev: in the capture's pool if it is the capture's, else over no
 * memory of a pool not released. */
static void graph_check(int dev, const void *p, size_t n, gpumem_stream st) {
  const uintptr_t a = (uintptr_t)p;
  const int mine = capturing(dev, st) ? g_active : -1;
  for (int j = 0; j < MAXGR; j++) {
    const grange *q = &g_gr[j];
    if (!q->used || q->dev != dev || a + n <= q->a || q->a + q->n <= a) continue;
    /* (a fault armed during the capture may have failed the library's question about it, which it takes for a
     * capture that has ended, as for a stream destroyed after its capture: its pool is not followed) */
    if (g_cap[q->cap].armed || g_cap[q->cap].lost) continue;
    CHECK(q->cap == mine, "new block %p+%zu on stream %p (device %d) overlaps %p+%zu of the pool of capture %d, not "
          "released", p, n, st, dev, (void *)q->a, q->n, q->cap);
  }
  if (mine < 0) return;
  g_capture_blocks++;
  for (int j = 0; j < MAXGR; j++)
    if (!g_gr[j].used) {
      g_gr[j] = (grange){1, dev, mine, a, n};
      return;
    }
  /* (full: this block's memory is not followed; no false alarm) */
}

static void op_capture(reader *r) {
  uint8_t k = u8(r);
  int dev = (k >> 2) % DEVS;
  switch (k % 4) {
    case 0: { /* begin */
      if (g_active >= 0) return;
      gpumem_stream st = g_streams[1 + (k >> 3) % (NSTREAMS - 1)];
      int mode = (k >> 5) % 3;
      for (int c = 0; c < MAXCAP; c++) /* one capture per stream: an ended one not known yet is asked about first */
        if (g_cap[c].state == CAP_ENDED && g_cap[c].dev == dev && g_cap[c].st == st) return;
      gpumem_status s = gpumem_sim_stream_begin_capture(dev, st, mode);
      TRACE("begin_capture(dev %d, stream %p, mode %d) = %s\n", dev, st, mode, SN(s));
      CHECK(s == GPUMEM_OK, "sim begin_capture: %s", SN(s));
      int c = g_ncap++ % MAXCAP;
      if (g_cap[c].state != CAP_NONE) { /* the slot is reused: what it followed is dropped */
        for (int j = 0; j < MAXGR; j++)
          if (g_gr[j].cap == c) g_gr[j].used = 0;
      }
      g_cap[c] = (mcap){CAP_ACTIVE, dev, W.armed, st, 0, 0};
      g_active = c;
      g_captures++;
      break;
    }
    case 1: { /* end */
      if (g_active < 0) return;
      mcap *m = &g_cap[g_active];
      int inv = -1;
      gpumem_status s = gpumem_sim_stream_end_capture(m->dev, m->st, &inv);
      TRACE("end_capture(dev %d, stream %p) = %s invalidated %d\n", m->dev, m->st, SN(s), inv);
      CHECK(s == GPUMEM_OK, "sim end_capture: %s", SN(s));
      CHECK(!inv || m->armed || m->lost || W.armed, "the library invalidated the capture on stream %p (device %d) with no fault armed",
            m->st, m->dev);
      m->state = CAP_ENDED;
      g_active = -1;
      break;
    }
    case 2: { /* the library is told */
      gpumem_stream st = (k & 0x80) ? NULL : g_streams[1 + (k >> 3) % (NSTREAMS - 1)];
      if (st == NULL && g_active >= 0 && g_cap[g_active].dev == dev) return; /* NULL: "none is under way there" */
      gpumem_status s = gpumem_capture_ended(W.ctx, dev, st);
      TRACE("capture_ended(dev %d, stream %p) = %s\n", dev, st, SN(s));
      CHECK(s == GPUMEM_OK, "capture_ended: %s", SN(s));
      for (int c = 0; c < MAXCAP; c++)
        if (g_cap[c].state == CAP_ENDED && g_cap[c].dev == dev && (st == NULL || g_cap[c].st == st))
          g_cap[c].state = CAP_KNOWN_ENDED;
      break;
    }
    default: { /* release the pools of captures known to have ended */
      int d = (k & 0x80) ? GPUMEM_ALL_DEVICES : dev;
      gpumem_status s = gpumem_capture_pools_release(W.ctx, d);
      TRACE("capture_pools_release(%d) = %s\n", d, SN(s));
      CHECK(s == GPUMEM_OK, "capture_pools_release: %s", SN(s));
      /* the library releases the pools of captures it knows have ended: those it was told of, and maybe those
       * ended with a call on their stream since (it may have asked then): the memory of both is followed no
       * more (no false alarm), and the second stay ENDED (the library may still know them: reset is refused) */
      for (int c = 0; c < MAXCAP; c++) {
        if ((g_cap[c].state != CAP_KNOWN_ENDED && g_cap[c].state != CAP_ENDED) || (d >= 0 && g_cap[c].dev != d)) continue;
        if (g_cap[c].state == CAP_KNOWN_ENDED) g_cap[c].state = CAP_NONE;
        for (int j = 0; j < MAXGR; j++)
          if (g_gr[j].cap == c) g_gr[j].used = 0;
      }
      break;
    }
  }
}

static int count_live(int dev, int owner) {
  int c = 0;
  for (int i = 0; i < MAXB; i++)
    if (W.b[i].p && (dev < 0 || W.b[i].dev == dev) && (owner < 0 || W.b[i].owner == owner)) c++;
  return c;
}

/* Pick the k-th live block (mod count) with the given owner kind (-1 any) and device (-1 any). */
static int pick(unsigned k, int owner, int dev) {
  int c = count_live(dev, owner);
  if (c == 0) return -1;
  k %= (unsigned)c;
  for (int i = 0; i < MAXB; i++)
    if (W.b[i].p && (dev < 0 || W.b[i].dev == dev) && (owner < 0 || W.b[i].owner == owner) && k-- == 0) return i;
  return -1;
}

/* ---------------------------------------------------------------------- */
/* Stats                                                                   */

/* the pool's invariant checks (src/pool_check.c), which a GPUMEM_DEBUG_CHECKS build runs after every
 * allocation and free and counts when they fail (other builds never run them: the count stays 0) */
uint64_t gpumem__invariant_failures(const char **last);
/* what the library counts as held on a device for limit_bytes (every pool of it: src/pool.h) */
uint64_t gpumem__dev_reserved_bytes(gpumem_context *ctx, int device);

static void check_stats(void) {
  const char *why = NULL;
  CHECK(gpumem__invariant_failures(&why) == 0, "pool invariant violated: %s", why != NULL ? why : "?");
  gpumem_stats sum;
  memset(&sum, 0, sizeof sum);
  for (int d = 0; d < DEVS; d++) {
    gpumem_stats s;
    memset(&s, 0xab, sizeof s);
    s.struct_size = sizeof s;
    gpumem_status st = gpumem_get_stats(W.ctx, d, &s);
    CHECK(st == GPUMEM_OK, "get_stats(%d): %s", d, SN(st));
    uint64_t live = 0, req = 0, rounded = 0;
    for (int i = 0; i < MAXB; i++)
      if (W.b[i].p && W.b[i].dev == d) {
        live++;
        req += W.b[i].n;
        rounded += round256(W.b[i].n);
      }
    CHECK(s.num_live == live, "device %d: num_live %llu, model %llu", d, (unsigned long long)s.num_live, (unsigned long long)live);
    CHECK(s.requested_bytes == req, "device %d: requested_bytes %llu, model %llu", d, (unsigned long long)s.requested_bytes,
          (unsigned long long)req);
    CHECK(s.allocated_bytes >= rounded, "device %d: allocated_bytes %llu < rounded model bytes %llu", d,
          (unsigned long long)s.allocated_bytes, (unsigned long long)rounded);
    CHECK(live != 0 || s.allocated_bytes == 0, "device %d: no live block but allocated_bytes %llu", d, (unsigned long long)s.allocated_bytes);
    CHECK(s.allocated_bytes <= s.reserved_bytes, "device %d: allocated %llu > reserved %llu", d, (unsigned long long)s.allocated_bytes,
          (unsigned long long)s.reserved_bytes);
    CHECK(s.cached_bytes == s.reserved_bytes - s.allocated_bytes, "device %d: cached %llu != reserved %llu - allocated %llu", d,
          (unsigned long long)s.cached_bytes, (unsigned long long)s.reserved_bytes, (unsigned long long)s.allocated_bytes);
    CHECK(s.reserved_bytes <= DEV_CAP, "device %d: reserved %llu > capacity", d, (unsigned long long)s.reserved_bytes);
    CHECK(gpumem__dev_reserved_bytes(W.ctx, d) == s.reserved_bytes, "device %d: the limit counts %llu bytes held, stats say %llu",
          d, (unsigned long long)gpumem__dev_reserved_bytes(W.ctx, d), (unsigned long long)s.reserved_bytes);
    CHECK(W.limit == 0 || s.reserved_bytes <= W.limit, "device %d: reserved %llu > limit %llu", d, (unsigned long long)s.reserved_bytes,
          (unsigned long long)W.limit);
    CHECK(s.allocated_peak >= s.allocated_bytes && s.reserved_peak >= s.reserved_bytes, "device %d: peak below current", d);
    CHECK(s.num_frees <= s.num_allocs && s.num_live <= s.num_allocs - s.num_frees, "device %d: counters: allocs %llu frees %llu live %llu", d,
          (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees, (unsigned long long)s.num_live);
    /* no check between reserved_bytes and num_segments: with expandable segments an
     * address range may have no chunk mapped, and idle chunks may be held with no range */
    CHECK(s.num_backend_frees <= s.num_backend_allocs, "device %d: more backend frees than allocs", d);
    uint64_t used = 0;
    st = gpumem_sim_used_bytes(d, &used);
    /* the sim charges whole 4 KiB pages; a segment cut to the request near a limit may not be a page multiple */
    CHECK(st == GPUMEM_OK && used >= s.reserved_bytes && used - s.reserved_bytes < 4096 * (s.num_segments + 1),
          "device %d: sim has %llu bytes handed out, stats say reserved %llu in %llu segments (%s)", d, (unsigned long long)used,
          (unsigned long long)s.reserved_bytes, (unsigned long long)s.num_segments, SN(st));
    sum.allocated_bytes += s.allocated_bytes;
    sum.reserved_bytes += s.reserved_bytes;
    sum.num_live += s.num_live;
    sum.num_allocs += s.num_allocs;
    sum.num_frees += s.num_frees;
    sum.requested_bytes += s.requested_bytes;
  }
  gpumem_stats all;
  all.struct_size = sizeof all;
  gpumem_status st = gpumem_get_stats(W.ctx, GPUMEM_ALL_DEVICES, &all);
  CHECK(st == GPUMEM_OK, "get_stats(ALL): %s", SN(st));
  CHECK(all.allocated_bytes == sum.allocated_bytes && all.reserved_bytes == sum.reserved_bytes && all.num_live == sum.num_live &&
            all.num_allocs == sum.num_allocs && all.num_frees == sum.num_frees && all.requested_bytes == sum.requested_bytes,
        "ALL_DEVICES stats are not the sum of the devices");
}

/* ---------------------------------------------------------------------- */
/* Status sets                                                             */

static int alloc_status_ok(gpumem_status s, int absurd) {
  if (s == GPUMEM_OK || s == GPUMEM_ERR_OUT_OF_MEMORY || s == GPUMEM_ERR_LIMIT_EXCEEDED) return 1;
  if (absurd && s == GPUMEM_ERR_INVALID_ARGUMENT) return 1;
  if (ARMED && s == GPUMEM_ERR_BACKEND) return 1;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* OOM callback: frees some plain blocks of the device, asks for a retry.  */

static int oom_cb(void *user, int device, size_t requested) {
  (void)user;
  (void)requested;
  CHECK(device >= 0 && device < DEVS, "OOM callback for device %d", device);
  CHECK(!W.in_callback, "OOM callback re-entered");
  W.in_callback = 1;
  int freed = 0;
  for (int i = 0; i < MAXB && freed < W.oom_cb_frees; i++) {
    if (!W.b[i].p || W.b[i].dev != device || W.b[i].owner != OWN_PLAIN) continue;
    CHECK(stamp_ok(&W.b[i]), "block %d damaged (seen in OOM callback)", i);
    int pk = pend_uses(&W.b[i], NULL, NULL, 0);
    gpumem_status s = gpumem_free(W.ctx, W.b[i].p, NULL);
    CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND), "free in OOM callback: %s", SN(s));
    pend_commit(pk, s == GPUMEM_OK);
    if (s == GPUMEM_OK) {
      model_drop(i);
      freed++;
    }
  }
  uint64_t rel = 0;
  gpumem_status s = gpumem_trim(W.ctx, device, 0, &rel);
  CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND), "trim in OOM callback: %s", SN(s));
  W.in_callback = 0;
  return freed > 0;
}

/* ---------------------------------------------------------------------- */
/* Operations                                                              */

static size_t decode_size(reader *r, int *absurd) {
  uint8_t k = u8(r);
  uint32_t v = u32(r);
  *absurd = 0;
  switch (k % 16) {
    case 0: case 1: case 2: case 3: case 4: return 1 + v % 2048;              /* tiny */
    case 5: case 6: case 7: return 1 + v % (1 * MiB);                         /* small class */
    case 8: case 9: return 1 * MiB + 1 + v % (9 * MiB);                       /* 20 MiB segments */
    case 10: return 10 * MiB + 1 + v % (30 * MiB);                            /* own segment */
    case 11: return 40 * MiB + v % (30 * MiB);                                /* near or over capacity */
    case 12: return (size_t)(v % 4) * 256 + (v & 0x100 ? 0 : 1);              /* 0, 1, 256, 257, ... */
    case 13: return (size_t)2 * MiB * (1 + v % 8) - (v & 1);                  /* segment-sized edges */
    default: {
      *absurd = 1;
      static const size_t big[] = {SIZE_MAX,          SIZE_MAX - 1,        SIZE_MAX - 255,     SIZE_MAX - 256,
                                   SIZE_MAX - (2u << 20) + 2, SIZE_MAX / 2 + 1, (size_t)1 << 40, DEV_CAP + 1,
                                   (size_t)DEV_CAP * 2, SIZE_MAX - (2u << 20) + 1, SIZE_MAX - (2u << 20), (size_t)1 << 63};
      return big[v % (sizeof big / sizeof big[0])];
    }
  }
}

static void op_alloc(reader *r, int tagged) {
  int dev = u8(r) % DEVS;
  gpumem_stream st = g_streams[u8(r) % NSTREAMS];
  int absurd;
  size_t n = decode_size(r, &absurd);
  if (model_free_slot() < 0) return;
  void *p = (void *)0x7;
  gpumem_status s = tagged ? gpumem_alloc_tagged(W.ctx, dev, n, st, "fuzz", &p) : gpumem_alloc(W.ctx, dev, n, st, &p);
  TRACE("alloc(dev %d, %zu, stream %p) = %s %p\n", dev, n, st, SN(s), s == GPUMEM_OK ? p : NULL);
  CHECK(alloc_status_ok(s, absurd), "alloc(%d, %zu): %s", dev, n, SN(s));
  if (s != GPUMEM_OK) {
    CHECK(p == (void *)0x7, "failed alloc (%s) changed *out_ptr to %p", SN(s), p);
    if (s == GPUMEM_ERR_OUT_OF_MEMORY) g_ooms++;
    if (W.oom_cb_frees) check_all_contents();
    return;
  }
  if (n == 0) {
    CHECK(p == NULL, "alloc of 0 bytes gave %p", p);
    return;
  }
  CHECK(!absurd || n <= DEV_CAP, "absurd size %zu succeeded", n);
  order_check(dev, p, n, st);
  graph_check(dev, p, n, st);
  named(dev, st);
  int k = model_add(p, n, dev, OWN_PLAIN, 0);
  W.b[k].st = st;
  W.b[k].graph = capturing(dev, st);
}

static void op_free(reader *r) {
  unsigned k = u8(r), ks = u8(r);
  gpumem_stream st = g_streams[ks % NSTREAMS];
  int i = pick(k, OWN_PLAIN, -1);
  if (i < 0) {
    gpumem_status s = gpumem_free(W.ctx, NULL, st);
    CHECK(s == GPUMEM_OK, "free(NULL): %s", SN(s));
    return;
  }
  CHECK(stamp_ok(&W.b[i]), "block %d (%p, %zu bytes) lost its contents before free", i, W.b[i].p, W.b[i].n);
  gpumem_stream noted[2];
  int nnoted = 0;
  if ((ks >> 4) == 0xA || (ks >> 4) == 0xB) {
    /* one free in eight (by the stream byte's high bits, which older inputs rarely set): the block is
     * first noted on one or two streams (gpumem_record_stream), so its free parks it behind their events */
    noted[nnoted++] = g_streams[(ks >> 2) % NSTREAMS];
    gpumem_status s = gpumem_record_stream(W.ctx, W.b[i].p, noted[0]);
    TRACE("record_stream(%p, %p) = %s\n", W.b[i].p, noted[0], SN(s));
    if (s == GPUMEM_ERR_OUT_OF_MEMORY && ARMED) nnoted--; /* (host memory: not noted) */
    else CHECK(s == GPUMEM_OK, "record_stream of a live block: %s", SN(s));
    if (nnoted == 1 && (ks & 0x10)) {
      noted[nnoted++] = g_streams[((ks >> 2) + 1) % NSTREAMS];
      s = gpumem_record_stream(W.ctx, W.b[i].p, noted[1]);
      if (s == GPUMEM_ERR_OUT_OF_MEMORY && ARMED) nnoted--;
      else CHECK(s == GPUMEM_OK, "record_stream of a live block: %s", SN(s));
    }
  }
  int pk = pend_uses(&W.b[i], st, noted, nnoted);
  gpumem_status s = gpumem_free(W.ctx, W.b[i].p, st);
  TRACE("free(%p [%zu, dev %d], stream %p) = %s\n", W.b[i].p, W.b[i].n, W.b[i].dev, st, SN(s));
  CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND), "free(%p): %s", W.b[i].p, SN(s));
  pend_commit(pk, s == GPUMEM_OK);
  if (s == GPUMEM_OK) {
    void *p = W.b[i].p; /* (a free does not always make its stream's capture known: the calling thread's cache
                         * may take the block without asking, gpumem.h, ::gpumem_graph_pool) */
    model_drop(i);
    g_frees_ok++;
    size_t sz = 1;
    s = gpumem_ptr_info(W.ctx, p, &sz, NULL);
    CHECK(s == GPUMEM_ERR_INVALID_POINTER && sz == 1, "ptr_info of a freed pointer: %s", SN(s));
  } else {
    s = gpumem_ptr_info(W.ctx, W.b[i].p, NULL, NULL);
    CHECK(s == GPUMEM_OK, "free failed but the block is gone (ptr_info %s)", SN(s));
  }
}

/* Frees the library must refuse: recently freed, interior, foreign. */
static void op_bad_free(reader *r) {
  uint8_t k = u8(r);
  void *p = NULL;
  int local;
  switch (k % 4) {
    case 0:
    case 1:
      if (W.nrecent == 0) return;
      p = W.recent[k % (W.nrecent < 8 ? W.nrecent : 8)];
      if (model_find(p) >= 0) return; /* handed out again since */
      break;
    case 2: {
      int i = pick(u8(r), -1, -1);
      if (i < 0 || W.b[i].n <= 256) return;
      p = (char *)W.b[i].p + 256 * (1 + u8(r) % (W.b[i].n / 256)) - (k & 4 ? 0 : 256 - 1 - u8(r) % 255);
      if ((char *)p >= (char *)W.b[i].p + W.b[i].n || p == W.b[i].p) return;
      break;
    }
    default:
      p = &local; /* a host stack address */
      break;
  }
  gpumem_status s = gpumem_free(W.ctx, p, g_streams[k % NSTREAMS]);
  CHECK(s == GPUMEM_ERR_INVALID_POINTER, "bad free(%p) gave %s", p, SN(s));
  s = gpumem_ptr_info(W.ctx, p, NULL, NULL);
  CHECK(s == GPUMEM_ERR_INVALID_POINTER, "ptr_info(%p) of a bad pointer gave %s", p, SN(s));
}

static void op_trim(reader *r) {
  uint8_t k = u8(r);
  int dev = k & 1 ? GPUMEM_ALL_DEVICES : (int)((k >> 1) % DEVS);
  uint64_t keep = (k & 0x10) ? 0 : (uint64_t)u16(r) << 10;
  gpumem_stats before;
  before.struct_size = sizeof before;
  CHECK(gpumem_get_stats(W.ctx, dev, &before) == GPUMEM_OK, "stats");
  uint64_t rel = 12345;
  gpumem_status s = gpumem_trim(W.ctx, dev, keep, &rel);
  TRACE("trim(%d, keep %llu) = %s released %llu\n", dev, (unsigned long long)keep, SN(s), (unsigned long long)rel);
  CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND), "trim(%d, %llu): %s", dev, (unsigned long long)keep, SN(s));
  gpumem_stats after;
  after.struct_size = sizeof after;
  CHECK(gpumem_get_stats(W.ctx, dev, &after) == GPUMEM_OK, "stats");
  if (s == GPUMEM_OK) {
    CHECK(before.reserved_bytes - after.reserved_bytes == rel, "trim released %llu but reserved went %llu -> %llu",
          (unsigned long long)rel, (unsigned long long)before.reserved_bytes, (unsigned long long)after.reserved_bytes);
    int caps = 0; /* (a capture the library may know of: the first trim's calls may learn it has ended) */
    for (int c = 0; c < MAXCAP; c++) caps |= g_cap[c].state != CAP_NONE;
    if (!ARMED && keep == 0 && !caps) {
      /* everything given back that can be: a second trim releases nothing */
      uint64_t rel2 = 99;
      s = gpumem_trim(W.ctx, dev, 0, &rel2);
      CHECK(s == GPUMEM_OK && rel2 == 0, "second trim(0) released %llu (%s)", (unsigned long long)rel2, SN(s));
    }
  }
  check_all_contents();
}

static void end_scope(int j, int after_reset);

/* Drop device dev's blocks from the model after a reset invalidated them. */
static void model_reset_device(int dev) {
  /* free a few of the invalidated pointers (nothing was allocated since) */
  int tried = 0;
  for (int i = 0; i < MAXB; i++) {
    if (!W.b[i].p || W.b[i].dev != dev) continue;
    if (W.b[i].graph && gpumem_ptr_info(W.ctx, W.b[i].p, NULL, NULL) == GPUMEM_OK) {
      /* a capture's pool is not reset (its graph may still run): the block stays live, the caller's */
      if (W.b[i].owner == OWN_SCOPE) {
        W.sc[W.b[i].owner_ix].nblocks--;
        W.b[i].owner = OWN_PLAIN;
      }
      continue;
    }
    if (tried++ < 3) {
      gpumem_status q = gpumem_free(W.ctx, W.b[i].p, NULL);
      CHECK(q == GPUMEM_ERR_INVALID_POINTER, "free of a block invalidated by reset gave %s", SN(q));
    }
    if (W.b[i].owner == OWN_PLAIN) model_drop(i);
  }
  /* scopes and buffers holding invalidated pointers end now, before any new
   * allocation could be given the same addresses (see docs/RELIABILITY.md) */
  for (int j = 0; j < MAXSCOPES; j++)
    if (W.sc[j].s && W.sc[j].dev == dev) end_scope(j, 1);
  for (int j = 0; j < MAXBUF; j++) {
    mbuf *b = &W.buf[j];
    if (b->bix >= 0 && b->b.device == dev) {
      gpumem_buffer_release(&b->b); /* gpumem_free gives INVALID_POINTER inside: harmless (a capture pool's block: freed) */
      CHECK(b->b.ptr == NULL && b->b.ctx == NULL, "buffer not zeroed by release");
      model_drop(b->bix);
      b->bix = -1;
    }
  }
  for (int i = 0; i < MAXB; i++)
    CHECK(!W.b[i].p || W.b[i].dev != dev || (W.b[i].graph && W.b[i].owner == OWN_PLAIN),
          "model still has blocks on the reset device (harness bug)");
}

static void op_reset(reader *r) {
  uint8_t k = u8(r);
  int dev = k & 1 ? GPUMEM_ALL_DEVICES : (int)((k >> 1) % DEVS);
  gpumem_status s = gpumem_reset(W.ctx, dev, 0);
  TRACE("reset(%d) = %s\n", dev, SN(s));
  int known = 0; /* a capture the library may know of, on any device: the context is in capture mode and refuses
                  * (GPUMEM_ERR_BUSY) */
  for (int c = 0; c < MAXCAP; c++) known |= g_cap[c].state == CAP_ACTIVE || g_cap[c].state == CAP_ENDED;
  CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND) || (known && s == GPUMEM_ERR_BUSY), "reset(%d): %s", dev,
        SN(s));
  if (s == GPUMEM_OK) g_resets_ok++;
  for (int d = 0; d < DEVS; d++) {
    if (dev >= 0 && d != dev) continue;
    int valid = 0, invalid = 0;
    for (int i = 0; i < MAXB; i++)
      if (W.b[i].p && W.b[i].dev == d) {
        /* (the capture pools are not reset: a block of one stays live; one allocated while a fault hid the
         * capture from the library is the main pool's, and goes with it) */
        if (gpumem_ptr_info(W.ctx, W.b[i].p, NULL, NULL) == GPUMEM_OK) valid += !W.b[i].graph;
        else invalid++;
      }
    if (s == GPUMEM_OK) {
      CHECK(valid == 0, "reset(%d) succeeded but %d blocks of device %d are still live", dev, valid, d);
    } else if (dev >= 0) {
      CHECK(invalid == 0, "failed reset(%d) (%s) invalidated %d blocks", dev, SN(s), invalid);
    } else {
      /* reset(ALL) that fails on one device may have reset the others: each device all or nothing */
      CHECK(valid == 0 || invalid == 0, "failed reset(ALL) left device %d half reset (%d live, %d invalid)", d, valid, invalid);
    }
    if (valid == 0 && (s == GPUMEM_OK || invalid > 0)) model_reset_device(d); /* (a device with nothing to tell: as it was) */
  }
  check_all_contents();
}

static void op_scope_begin(reader *r) {
  int j = u8(r) % MAXSCOPES;
  int dev = u8(r) % DEVS;
  gpumem_stream st = g_streams[u8(r) % NSTREAMS];
  if (W.sc[j].s) return;
  gpumem_scope *sc = (gpumem_scope *)0x9;
  gpumem_status s = gpumem_scope_begin(W.ctx, dev, st, &sc);
  if (s == GPUMEM_ERR_OUT_OF_MEMORY && ARMED) { /* (host memory) */
    CHECK(sc == (gpumem_scope *)0x9, "scope_begin failed and wrote its out-parameter");
    return;
  }
  CHECK(s == GPUMEM_OK, "scope_begin(%d): %s", dev, SN(s));
  W.sc[j] = (mscope){sc, dev, st, 0};
}

static void op_scope_alloc(reader *r) {
  int j = u8(r) % MAXSCOPES;
  int absurd;
  size_t n = decode_size(r, &absurd);
  if (!W.sc[j].s || model_free_slot() < 0) return;
  if (u8(r) % 4 == 0) CHECK(gpumem_scope_set_tag(W.sc[j].s, "fuzz-scope") == GPUMEM_OK, "scope_set_tag");
  void *p = (void *)0x7;
  gpumem_status s = gpumem_scope_alloc(W.sc[j].s, n, &p);
  TRACE("scope_alloc(%d, %zu) = %s %p\n", j, n, SN(s), s == GPUMEM_OK ? p : NULL);
  CHECK(alloc_status_ok(s, absurd), "scope_alloc(%zu): %s", n, SN(s));
  if (s != GPUMEM_OK) {
    CHECK(p == (void *)0x7, "failed scope_alloc changed *out_ptr");
    if (W.oom_cb_frees) check_all_contents();
    return;
  }
  if (n == 0) {
    CHECK(p == NULL, "scope_alloc of 0 gave %p", p);
    return;
  }
  order_check(W.sc[j].dev, p, n, W.sc[j].st);
  graph_check(W.sc[j].dev, p, n, W.sc[j].st);
  named(W.sc[j].dev, W.sc[j].st);
  int k = model_add(p, n, W.sc[j].dev, OWN_SCOPE, j);
  W.b[k].st = W.sc[j].st;
  W.b[k].graph = capturing(W.sc[j].dev, W.sc[j].st);
  W.sc[j].nblocks++;
}

static void end_scope(int j, int after_reset) {
  mscope *m = &W.sc[j];
  int pk[MAXB];
  for (int i = 0; i < MAXB; i++) {
    pk[i] = -1;
    if (W.b[i].p && W.b[i].owner == OWN_SCOPE && W.b[i].owner_ix == j && !after_reset) {
      CHECK(stamp_ok(&W.b[i]), "scope block %d damaged before scope_end", i);
      pk[i] = pend_uses(&W.b[i], m->st, NULL, 0);
    }
  }
  gpumem_status s = gpumem_scope_end(m->s);
  TRACE("scope_end(%d, after_reset %d) = %s\n", j, after_reset, SN(s));
  if (after_reset)
    /* a scope forgets what it allocated before a reset of its device: its end frees nothing, OK */
    CHECK(s == GPUMEM_OK, "scope_end after reset (%d blocks): %s", m->nblocks, SN(s));
  else
    CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND), "scope_end: %s", SN(s));
  for (int i = 0; i < MAXB; i++) {
    if (!W.b[i].p || W.b[i].owner != OWN_SCOPE || W.b[i].owner_ix != j) continue;
    gpumem_status q = gpumem_ptr_info(W.ctx, W.b[i].p, NULL, NULL);
    if (pk[i] >= 0) pend_commit(pk[i], q != GPUMEM_OK);
    if (q == GPUMEM_OK) {
      /* only a failed free may leave a block live, or a reset since the scope began (it frees nothing it
       * allocated before, and a capture pool's block outlives the reset); it becomes the caller's */
      CHECK((s != GPUMEM_OK && !after_reset) || W.b[i].graph, "block %d still live after scope_end (%s)", i, SN(s));
      W.b[i].owner = OWN_PLAIN;
    } else {
      CHECK(q == GPUMEM_ERR_INVALID_POINTER, "ptr_info after scope_end: %s", SN(q));
      model_drop(i);
    }
  }
  memset(m, 0, sizeof *m);
}

static void op_scope_end(reader *r) {
  int j = u8(r) % MAXSCOPES;
  if (!W.sc[j].s) return;
  end_scope(j, 0);
  check_all_contents();
}

static void op_buffer(reader *r) {
  int j = u8(r) % MAXBUF;
  mbuf *b = &W.buf[j];
  if (b->bix >= 0) { /* release */
    CHECK(stamp_ok(&W.b[b->bix]), "buffer block damaged");
    void *p = b->b.ptr;
    int pk = pend_uses(&W.b[b->bix], b->b.stream, NULL, 0);
    gpumem_buffer_release(&b->b);
    CHECK(b->b.ptr == NULL && b->b.ctx == NULL && b->b.size == 0, "buffer not zeroed by release");
    gpumem_buffer_release(&b->b); /* twice is harmless */
    gpumem_status q = gpumem_ptr_info(W.ctx, p, NULL, NULL);
    pend_commit(pk, q != GPUMEM_OK);
    if (q == GPUMEM_OK) {
      CHECK(ARMED, "buffer release left the block live with no fault armed");
      W.b[b->bix].owner = OWN_PLAIN; /* its free failed: the block is still ours */
    } else {
      model_drop(b->bix);
    }
    b->bix = -1;
    return;
  }
  int dev = u8(r) % DEVS;
  gpumem_stream st = g_streams[u8(r) % NSTREAMS];
  int absurd;
  size_t n = decode_size(r, &absurd);
  if (model_free_slot() < 0) return;
  gpumem_buffer nb;
  memset(&nb, 0x5a, sizeof nb);
  gpumem_buffer copy = nb;
  gpumem_status s = gpumem_buffer_alloc(W.ctx, dev, n, st, &nb);
  TRACE("buffer_alloc(%d, %zu) = %s %p\n", dev, n, SN(s), s == GPUMEM_OK ? nb.ptr : NULL);
  CHECK(alloc_status_ok(s, absurd), "buffer_alloc(%zu): %s", n, SN(s));
  if (s != GPUMEM_OK) {
    CHECK(memcmp(&nb, &copy, sizeof nb) == 0, "failed buffer_alloc changed *out");
    return;
  }
  if (n == 0) {
    CHECK(nb.ptr == NULL, "buffer of 0 bytes has a pointer");
    gpumem_buffer_release(&nb);
    return;
  }
  CHECK(nb.ctx == W.ctx && nb.size == n && nb.device == dev && nb.stream == st, "buffer fields wrong");
  b->b = nb;
  order_check(dev, nb.ptr, n, st);
  graph_check(dev, nb.ptr, n, st);
  named(dev, st);
  b->bix = model_add(nb.ptr, n, dev, OWN_BUF, j);
  W.b[b->bix].st = st;
  W.b[b->bix].graph = capturing(dev, st);
}

static void op_fault(reader *r) {
  uint8_t k = u8(r);
  gpumem_sim_call kind = (gpumem_sim_call)(k % GPUMEM_SIM_CALL_KINDS_);
  uint64_t nth = 1 + u8(r) % 8;
  int err = ((k & 0x40) && kind == GPUMEM_SIM_CALL_MALLOC) ? GPUMEM_SIM_ERR_OUT_OF_MEMORY : GPUMEM_SIM_ERR_INJECTED;
  int repeat = (k & 0x80) != 0;
  gpumem_status s = gpumem_sim_fail_nth(kind, nth, err, repeat);
  TRACE("fail_nth(kind %d, nth %llu, err %d, repeat %d)\n", (int)kind, (unsigned long long)nth, err, repeat);
  CHECK(s == GPUMEM_OK, "fail_nth: %s", SN(s));
  W.armed = 1;
  if (g_active >= 0) g_cap[g_active].armed = 1; /* the library may miss the capture from now on */
  g_faults++;
}

/* the library's host allocations (hostmem.c): the next few succeed, then one fails, or every one from then
 * on; GPUMEM_ERR_OUT_OF_MEMORY is then expected anywhere (a free still succeeds), as with a backend fault */
uint64_t gpumem__host_fault_count(void);
void gpumem__host_fault_arm(uint64_t after, int persist);
void gpumem__host_fault_clear(void);
static int g_host_ops;

static void op_host_fault(reader *r) {
  uint8_t k = u8(r);
  uint64_t after = k & 0x3f;
  int persist = (k & 0x80) != 0;
  TRACE("host fault (after %llu, persist %d)\n", (unsigned long long)after, persist);
  gpumem__host_fault_arm(after, persist);
  W.armed = 1;
  if (g_active >= 0) g_cap[g_active].armed = 1;
  g_faults++;
}

/* Code 179 (FUZZ_OPS_EVERY=0 turns it off): a driver failing now and then. Calls of a kind fail from the
 * nth on, every `every`-th one (2-5), the ones between succeeding, until cleared: a call over several
 * chunks or blocks then half succeeds, with gaps. */
static int g_every_ops;
static void op_fault_every(reader *r) {
  uint8_t k = u8(r);
  gpumem_sim_call kind = (gpumem_sim_call)(k % GPUMEM_SIM_CALL_KINDS_);
  uint64_t nth = 1 + ((k >> 3) & 7);
  uint64_t every = 2 + ((k >> 6) & 3);
  gpumem_status s = gpumem_sim_fail_every(kind, nth, every, GPUMEM_SIM_ERR_INJECTED);
  TRACE("fail_every(kind %d, nth %llu, every %llu)\n", (int)kind, (unsigned long long)nth, (unsigned long long)every);
  CHECK(s == GPUMEM_OK, "fail_every: %s", SN(s));
  W.armed = 1;
  if (g_active >= 0) g_cap[g_active].armed = 1;
  g_faults++;
}

static void op_fault_clear(void) {
  TRACE("fail_clear\n");
  gpumem_sim_fail_clear();
  gpumem__host_fault_clear();
  W.armed = 0;
  /* after clearing, the next calls work: a small alloc succeeds on some device unless both are full */
  check_all_contents();
}

static void op_sim(reader *r) {
  uint8_t k = u8(r);
  TRACE("sim op %u\n", k % 5u);
  switch (k % 5) {
    case 0: gpumem_sim_set_delayed(1); break;
    case 1: gpumem_sim_set_delayed(0); break;
    case 2: gpumem_sim_stream_complete((k >> 3) % 3 == 2 ? -1 : (int)((k >> 3) % 3), g_streams[u8(r) % NSTREAMS]); break;
    case 3: gpumem_sim_complete_all(); break;
    default: {
      int dev = (k >> 3) % DEVS;
      uint64_t bytes = (uint64_t)(u8(r) % 80) * MiB;
      gpumem_status s = gpumem_sim_set_external_usage(dev, bytes);
      CHECK(s == GPUMEM_OK || s == GPUMEM_ERR_OUT_OF_MEMORY, "set_external_usage: %s", SN(s));
      break;
    }
  }
}

static void op_queries(reader *r) {
  uint8_t k = u8(r);
  int dev = (int)(int8_t)k % 4; /* -3..3: bad devices too */
  gpumem_device_info info;
  memset(&info, 0x33, sizeof info);
  info.struct_size = sizeof info;
  gpumem_status s = gpumem_device_get_info(W.ctx, dev, &info);
  if (dev >= 0 && dev < DEVS) {
    CHECK(s == GPUMEM_OK || (ARMED && s == GPUMEM_ERR_BACKEND), "device_get_info(%d): %s", dev, SN(s));
    if (s == GPUMEM_OK) CHECK(info.total_bytes == DEV_CAP && info.free_bytes <= DEV_CAP && info.ordinal == dev, "device info wrong");
  } else {
    CHECK(s == GPUMEM_ERR_INVALID_DEVICE, "device_get_info(%d): %s", dev, SN(s));
    void *p = (void *)0x7;
    s = gpumem_alloc(W.ctx, dev, 64, NULL, &p);
    CHECK(s == GPUMEM_ERR_INVALID_DEVICE && p == (void *)0x7, "alloc on device %d: %s", dev, SN(s));
    if (dev != GPUMEM_ALL_DEVICES) {
      s = gpumem_trim(W.ctx, dev, 0, NULL);
      CHECK(s == GPUMEM_ERR_INVALID_DEVICE, "trim on device %d: %s", dev, SN(s));
      s = gpumem_reset(W.ctx, dev, 0);
      CHECK(s == GPUMEM_ERR_INVALID_DEVICE, "reset on device %d: %s", dev, SN(s));
      gpumem_stats st;
      st.struct_size = sizeof st;
      s = gpumem_get_stats(W.ctx, dev, &st);
      CHECK(s == GPUMEM_ERR_INVALID_DEVICE, "stats on device %d: %s", dev, SN(s));
    }
  }
  if (k & 0x80) CHECK(gpumem_reset_peak_stats(W.ctx, GPUMEM_ALL_DEVICES) == GPUMEM_OK, "reset_peak_stats");
}

/* ---------------------------------------------------------------------- */
/* One input                                                               */

static void log_to_stderr(void *user, gpumem_log_level level, const char *msg) {
  (void)user;
  (void)level;
  fprintf(stderr, "    log: %s\n", msg);
}

static void run_input(const uint8_t *data, size_t size) {
  reader rd = {data, size, 0};
  reader *r = &rd;
  memset(&W, 0, sizeof W);
  memset(g_pend, 0, sizeof g_pend);
  memset(g_cap, 0, sizeof g_cap);
  memset(g_gr, 0, sizeof g_gr);
  g_ncap = 0;
  g_active = -1;
  for (int j = 0; j < MAXBUF; j++) W.buf[j].bix = -1;
  g_inputs++;
  g_cur_op = -1;
  g_cur_name = "create";

  uint8_t c0 = u8(r), c1 = u8(r);
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.log_level = GPUMEM_LOG_OFF;
  if (getenv("FUZZ_OPS_LOG") != NULL) { /* FUZZ_OPS_LOG=1: the library's debug log, to stderr */
    cfg.log_level = GPUMEM_LOG_DEBUG;
    cfg.log_callback = log_to_stderr;
  }
  static const uint64_t thresholds[] = {GPUMEM_UNLIMITED, 0, 1 * MiB, 8 * MiB};
  cfg.release_threshold = thresholds[c0 & 3];
  cfg.trim_free_fraction = (c0 & 4) ? 0.0 : (c0 & 8) ? 0.5 : 0.10;
  if (c0 & 0x10) {
    static const uint64_t limits[] = {4 * MiB, 21 * MiB, 40 * MiB, 63 * MiB};
    cfg.limit_bytes = limits[c1 & 3];
  } else if (c0 & 0x20) {
    cfg.limit_fraction = 0.5;
  }
  W.limit = cfg.limit_bytes ? cfg.limit_bytes : (c0 & 0x20) ? DEV_CAP / 2 : 0;
  if (c0 & 0x40) {
    cfg.oom_callback = oom_cb;
    W.oom_cb_frees = 1 + (c1 >> 2) % 4;
  }
  if (c0 & 0x80) cfg.initial_bytes = (uint64_t)((c1 >> 4) % 4) * 8 * MiB;
  cfg.stream_deps = (c1 & 0x40) != 0; /* another stream's pending frees, its later work ordered after theirs */
  cfg.expandable = (c1 & 0x80) == 0;  /* plain segments */
  gpumem_status s = gpumem_create(&cfg, &W.ctx);
  CHECK(s == GPUMEM_OK, "create: %s", SN(s));
  TRACE("config: release_threshold %llu trim_free_fraction %.2f limit %llu/%.2f oom_cb %d initial %llu stream_deps %d "
        "expandable %d\n",
        (unsigned long long)cfg.release_threshold, cfg.trim_free_fraction, (unsigned long long)cfg.limit_bytes, cfg.limit_fraction,
        W.oom_cb_frees, (unsigned long long)cfg.initial_bytes, cfg.stream_deps, cfg.expandable);
  gpumem_sim_set_delayed(0);

  for (int op = 0; op < MAXOPS && more(r); op++) {
    uint8_t code = u8(r);
    g_cur_op = op;
    g_ops++;
    capture_check();
    TRACE("op %d code %u\n", op, code % 20u);
    switch (code % 20) {
      case 0: case 1: case 2: case 3: g_cur_name = "alloc"; op_alloc(r, 0); break;
      case 4: g_cur_name = "alloc_tagged"; op_alloc(r, 1); break;
      case 5: case 6: case 7: case 8: g_cur_name = "free"; op_free(r); break;
      case 9: g_cur_name = "bad_free"; op_bad_free(r); break;
      case 10: g_cur_name = "trim"; op_trim(r); break;
      case 11: g_cur_name = "reset"; op_reset(r); break;
      case 12: g_cur_name = "scope_begin"; op_scope_begin(r); break;
      case 13: g_cur_name = "scope_alloc"; op_scope_alloc(r); break;
      case 14: g_cur_name = "scope_end"; op_scope_end(r); break;
      case 15: g_cur_name = "buffer"; op_buffer(r); break;
      case 16: g_cur_name = "fault"; op_fault(r); break;
      case 17: g_cur_name = "fault_clear"; op_fault_clear(); break;
      case 18: g_cur_name = "sim"; op_sim(r); break;
      default:
        if (code >= 200 && g_capture_ops) { /* (219, 239: two of the codes of queries) */
          g_cur_name = "capture";
          op_capture(r);
        } else if (code == 179 && g_every_ops) {
          g_cur_name = "fault_every";
          op_fault_every(r);
        } else if (code == 199 && g_host_ops) {
          g_cur_name = "host_fault";
          op_host_fault(r);
        } else {
          g_cur_name = "queries";
          op_queries(r);
        }
        break;
    }
    check_stats();
  }

  /* Teardown: clear faults, complete work, free everything, destroy, nothing held. */
  g_cur_op = -1;
  g_cur_name = "teardown";
  capture_check(); /* (what the last operation did) */
  gpumem_sim_fail_clear();
  gpumem__host_fault_clear();
  W.armed = 0;
  if (g_active >= 0) { /* the capture under way ends, the library is told, the pools go */
    int inv = -1;
    mcap *m = &g_cap[g_active];
    CHECK(gpumem_sim_stream_end_capture(m->dev, m->st, &inv) == GPUMEM_OK, "sim end_capture");
    CHECK(!inv || m->armed || m->lost, "the library invalidated the capture on stream %p (device %d) with no fault armed", m->st,
          m->dev);
    g_active = -1;
  }
  CHECK(gpumem_capture_ended(W.ctx, GPUMEM_ALL_DEVICES, NULL) == GPUMEM_OK, "capture_ended(ALL, NULL)");
  gpumem_sim_set_delayed(0);
  gpumem_sim_complete_all();
  for (int d = 0; d < DEVS; d++) (void)gpumem_sim_set_external_usage(d, 0);
  check_all_contents();
  for (int j = 0; j < MAXSCOPES; j++)
    if (W.sc[j].s) end_scope(j, 0);
  for (int j = 0; j < MAXBUF; j++)
    if (W.buf[j].bix >= 0) {
      gpumem_buffer_release(&W.buf[j].b);
      model_drop(W.buf[j].bix);
      W.buf[j].bix = -1;
    }
  for (int i = 0; i < MAXB; i++)
    if (W.b[i].p) {
      CHECK(stamp_ok(&W.b[i]), "block %d damaged at teardown", i);
      s = gpumem_free(W.ctx, W.b[i].p, g_streams[i % NSTREAMS]);
      CHECK(s == GPUMEM_OK, "free at teardown: %s", SN(s));
      model_drop(i);
    }
  CHECK(gpumem_capture_pools_release(W.ctx, GPUMEM_ALL_DEVICES) == GPUMEM_OK, "capture_pools_release(ALL)");
  check_stats();
  /* after clearing, the next calls work */
  void *p = NULL;
  s = gpumem_alloc(W.ctx, 0, 4096, NULL, &p);
  CHECK(s == GPUMEM_OK || (W.limit != 0 && W.limit < 2 * MiB && s == GPUMEM_ERR_LIMIT_EXCEEDED), "alloc after clearing faults: %s", SN(s));
  if (p) CHECK(gpumem_free(W.ctx, p, NULL) == GPUMEM_OK, "free after clearing faults");
  s = gpumem_destroy(W.ctx, 0);
  CHECK(s == GPUMEM_OK, "destroy with nothing live: %s", SN(s));
  for (int d = 0; d < DEVS; d++) {
    uint64_t used = 1;
    s = gpumem_sim_used_bytes(d, &used);
    CHECK(s == GPUMEM_OK && used == 0, "device %d: %llu bytes still handed out after destroy (%s)", d, (unsigned long long)used, SN(s));
  }
}

/* ---------------------------------------------------------------------- */
/* Entry points                                                            */

static void report(void) {
  fprintf(stderr,
          "fuzz_ops: %llu inputs, %llu operations (%llu allocs, %llu frees, %llu resets succeeded; %llu faults armed, %llu OOM; "
          "%llu allocations over memory freed with work queued, %llu of them with that work still running, ordered before theirs; "
          "%llu captures, %llu blocks allocated in them)\n",
          g_inputs, g_ops, g_allocs_ok, g_frees_ok, g_resets_ok, g_faults, g_ooms, g_order_checks, g_order_pending, g_captures,
          g_capture_blocks);
}

static void setup(void) {
  g_trace = getenv("FUZZ_OPS_TRACE") != NULL && *getenv("FUZZ_OPS_TRACE") == '1';
  g_capture_ops = getenv("FUZZ_OPS_CAPTURE") == NULL || *getenv("FUZZ_OPS_CAPTURE") != '0';
  g_host_ops = getenv("FUZZ_OPS_HOST") == NULL || *getenv("FUZZ_OPS_HOST") != '0';
  g_every_ops = getenv("FUZZ_OPS_EVERY") == NULL || *getenv("FUZZ_OPS_EVERY") != '0';
  setenv("GPUMEM_SIM_DEVICES", "2x64MiB", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("GPUMEM_LOG");
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.log_level = GPUMEM_LOG_OFF;
  gpumem_status s = gpumem_create(&cfg, &g_keeper);
  if (s != GPUMEM_OK) {
    fprintf(stderr, "fuzz_ops: keeper context: %s\n", SN(s));
    abort();
  }
  int n = 0;
  gpumem_device_count(g_keeper, &n);
  if (n != DEVS) {
    fprintf(stderr, "fuzz_ops: %d sim devices, expected %d (another sim context alive?)\n", n, DEVS);
    abort();
  }
  atexit(report);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setup();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_input(data, size);
  return 0;
}

#ifdef FUZZ_STANDALONE
#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return 1;
  }
  static uint8_t buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  run_input(buf, n);
  return 0;
}

static int run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) return run_file(path);
  DIR *d = opendir(path);
  if (!d) return 1;
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, e->d_name);
    rc |= run_file(full);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv) {
  setup();
  if (argc >= 3 && strcmp(argv[1], "-random") == 0) {
    unsigned long long n = strtoull(argv[2], NULL, 10);
    uint64_t x = argc >= 4 ? strtoull(argv[3], NULL, 10) : 1;
    static uint8_t buf[4096];
    const char *last = getenv("FUZZ_OPS_LAST");
    for (unsigned long long k = 0; k < n; k++) {
      size_t len = 16 + (size_t)(mix64(x + k) % (sizeof buf - 16));
      for (size_t i = 0; i < len; i += 8) {
        uint64_t v = mix64(x * 0x9e3779b97f4a7c15ull + k * 4096 + i);
        memcpy(buf + i, &v, len - i < 8 ? len - i : 8);
      }
      if (last != NULL) { /* FUZZ_OPS_LAST=FILE: each input is written there first, so a violating one is kept */
        FILE *f = fopen(last, "wb");
        if (f != NULL) {
          fwrite(buf, 1, len, f);
          fclose(f);
        }
      }
      run_input(buf, len);
    }
    return 0;
  }
  int rc = 0;
  for (int i = 1; i < argc; i++) rc |= run_path(argv[i]);
  return rc;
}
#endif
