/**
 * \file backends/sim.c
 * \brief The host simulator backend ("sim"): simulated devices in host memory.
 *
 * State is process-wide, like a GPU driver's: every vtable copy and every
 * context using "sim" share the same devices, memory, streams and events.
 * init() takes a reference (the first one parses the environment),
 * shutdown() drops it (the last one unmaps everything). One mutex guards it
 * all; every method is thread-safe.
 *
 * Environment (read by the first init() and by gpumem_sim_reinit()):
 *
 * - `GPUMEM_SIM_DEVICES`: the physical devices and their capacities, a
 *   comma-separated list of `[COUNTx]SIZE` items, e.g. `2x16GiB`,
 *   `16GiB,8GiB`, `3x1GiB,512MiB`. SIZE is a decimal integer with an
 *   optional unit: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB
 *   (case-insensitive; every unit is binary, KB = KiB = 1024 bytes; no unit
 *   means bytes). Spaces around tokens are allowed. COUNT and SIZE must be
 *   at least 1 and at most ::SIM_MAX_DEVICES devices in total. Unset: one
 *   device of 16 GiB. Anything else (empty, `banana`, `0x16GiB`, `-1GiB`,
 *   overflow) makes init() fail with ::GPUMEM_SIM_ERR_BAD_ENV.
 * - `CUDA_VISIBLE_DEVICES`, as the CUDA runtime reads it: comma-separated
 *   entries, each a decimal ordinal (spaces around it allowed) or a `GPU-`
 *   UUID prefix matching exactly one physical device. Reading stops at the
 *   first invalid entry (not a number, out of range, unknown or ambiguous
 *   UUID prefix, a device already listed, `MIG-...`), keeping the entries
 *   before it. Unset: every device in order. Empty, `-1`, or a list whose
 *   first entry is invalid: no device, init() fails with
 *   ::GPUMEM_SIM_ERR_NO_DEVICE.
 *
 * Memory:
 * - malloc() maps fresh anonymous memory (MAP_NORESERVE, page aligned,
 *   host readable and writable, zero-filled) and charges its size rounded
 *   up to 4 KiB against the device capacity; it fails with
 *   ::GPUMEM_SIM_ERR_OUT_OF_MEMORY when used + external + charge would
 *   pass the capacity. mem_get_info() reports free = capacity - used -
 *   external. malloc(0) gives NULL; free(NULL) succeeds.
 * - Virtual memory: granularity 2 MiB. vm_reserve() maps a PROT_NONE range
 *   aligned to the granularity; vm_create() charges the chunk's size;
 *   vm_map() makes a range of a reservation readable and writable;
 *   vm_unmap() gives its RAM back (MADV_DONTNEED) and makes it PROT_NONE
 *   again; the chunk's charge is returned once it is both destroyed and no
 *   longer mapped. Unlike a real driver the contents of a chunk do not
 *   survive an unmap, and mapping one chunk twice does not alias: each
 *   mapping is fresh zeroed memory.
 * - device_reset() unmaps every allocation, reservation and chunk of the
 *   device and completes its streams; events and stream records stay valid.
 *
 * Shared devices (`GPUMEM_SIM_SHARED=NAME`, NAME of letters, digits, `.`,
 * `_`, `-`, at most 48): the processes of one user that name the same NAME
 * see the same physical devices. Their capacity is accounted in a
 * shared-memory object (`/dev/shm/gpumem-sim-UID-NAME`, mode 0600): each
 * process's charges per device, so that what one process holds is missing
 * from every other's free memory and a malloc that would pass the capacity
 * fails in any of them. The memory of a process that died is released (its
 * charges are dropped at the next charge or query of any process), as a
 * driver releases a dead process's memory. The devices' UUIDs are derived
 * from NAME, so that processes of another NAME (another simulated machine)
 * never look like peers; without GPUMEM_SIM_SHARED each process's devices are
 * its own (device_info sets private_device). The first process fixes the
 * capacities: a process whose GPUMEM_SIM_DEVICES differs fails init() with
 * ::GPUMEM_SIM_ERR_BAD_ENV, as does a NAME that is not valid or an object of
 * another user or with a foreign layout.
 *
 * Fault injection and delayed mode live in static storage that survives the
 * state (they can be set before any context exists). Call counts count from
 * the creation of the state (the first init() after none was held); calls
 * made while no state exists count too and are kept until the next one is
 * created.
 */
#include "gpumem/backend.h"
#include "gpumem/sim.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* valgrind client requests (annotate_alloc/annotate_free): memcheck then sees
 * every block the pool hands out as one heap block. They cost a few
 * instructions, and the core skips them entirely when not under memcheck. */
#if defined(__has_include) && !defined(GPUMEM_NO_VALGRIND)
#  if __has_include(<valgrind/valgrind.h>)
#    include <valgrind/valgrind.h>
#    include <valgrind/memcheck.h>
#    define SIM_HAVE_VALGRIND 1
#  endif
#endif

/** Most physical devices GPUMEM_SIM_DEVICES may describe. */
#define SIM_MAX_DEVICES 64
/** Default capacity: one device of 16 GiB. */
#define SIM_DEFAULT_CAPACITY (16ull << 30)
/** Charge granularity of malloc(). */
#define SIM_PAGE ((size_t)4096)
/** Virtual-memory granularity. */
#define SIM_VM_GRANULARITY ((size_t)2 << 20)

extern const gpumem_backend gpumem__sim_backend;

/* ------------------------------------------------------------------------ */
/* A small open-addressing hash map, uintptr_t -> uintptr_t (key 0 = empty). */

typedef struct sim_map {
  uintptr_t *keys;
  uintptr_t *vals;
  size_t cap; /* power of two, or 0 */
  size_t len;
} sim_map;

static size_t sim__hash(uintptr_t k, size_t cap) {
  uint64_t x = (uint64_t)k * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return (size_t)x & (cap - 1);
}

static int sim__map_grow(sim_map *m) {
  size_t ncap = m->cap ? m->cap * 2 : 16;
  uintptr_t *nk = calloc(ncap, sizeof *nk);
  uintptr_t *nv = calloc(ncap, sizeof *nv);
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (m->keys[i]) {
      size_t j = sim__hash(m->keys[i], ncap);
      while (nk[j]) j = (j + 1) & (ncap - 1);
      nk[j] = m->keys[i];
      nv[j] = m->vals[i];
    }
  }
  free(m->keys);
  free(m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return 0;
}

/* Index of key, or SIZE_MAX. */
static size_t sim__map_find(const sim_map *m, uintptr_t k) {
  if (!m->cap || !k) return SIZE_MAX;
  size_t i = sim__hash(k, m->cap);
  while (m->keys[i]) {
    if (m->keys[i] == k) return i;
    i = (i + 1) & (m->cap - 1);
  }
  return SIZE_MAX;
}

static int sim__map_get(const sim_map *m, uintptr_t k, uintptr_t *v) {
  size_t i = sim__map_find(m, k);
  if (i == SIZE_MAX) return 0;
  if (v) *v = m->vals[i];
  return 1;
}

/* Insert a new key (must be absent). 0 on success, -1 if out of host memory. */
static int sim__map_put(sim_map *m, uintptr_t k, uintptr_t v) {
  if ((m->len + 1) * 4 > m->cap * 3 && sim__map_grow(m) != 0) return -1;
  size_t i = sim__hash(k, m->cap);
  while (m->keys[i]) i = (i + 1) & (m->cap - 1);
  m->keys[i] = k;
  m->vals[i] = v;
  m->len++;
  return 0;
}

/* Remove the entry at slot i (backward-shift deletion). */
static void sim__map_del_at(sim_map *m, size_t i) {
  size_t mask = m->cap - 1;
  size_t j = i;
  m->keys[i] = 0;
  m->len--;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->keys[j]) break;
    size_t home = sim__hash(m->keys[j], m->cap);
    /* move j into the hole at i unless home lies cyclically in (i, j] */
    int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!stays) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      m->keys[j] = 0;
      i = j;
    }
  }
}

static void sim__map_free(sim_map *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------------ */
/* State                                                                     */

/* A stream's wait on another's event (stream_wait_event): once the waiting stream has completed
 * its work item `at`, the other stream has completed `target`. */
#define SIM_DEPS 32
struct sim_stream;
typedef struct sim_dep {
  uint64_t at;
  struct sim_stream *on;
  uint64_t target;
} sim_dep;

typedef struct sim_stream {
  uint64_t submitted; /* work items recorded so far */
  uint64_t completed; /* work items completed */
  int cap_status;     /* GPUMEM_CAPTURE_NONE / ACTIVE / INVALIDATED */
  int cap_mode;       /* GPUMEM_SIM_CAPTURE_* the capture was begun with */
  uint64_t cap_id;    /* the capture sequence's id, 0 with none */
  uint64_t cap_nodes; /* work items recorded into the capture */
  uintptr_t cap_thread; /* sim__self() of the thread that began it */
  uint64_t *stamps;   /* clocked mode: the clock at each record, by target modulo SIM_RING (NULL until then) */
  int ndep;           /* waits on other streams not passed yet, in dep (SIM_DEPS, NULL until the first) */
  sim_dep *dep;
  int dead;           /* gpumem_sim_stream_destroy: the handle names no stream until gpumem_sim_stream_create */
} sim_stream;

/* Records per stream whose clock the clocked mode remembers; older ones are complete. */
#define SIM_RING 1024u

typedef struct sim_event {
  int device;
  sim_stream *stream; /* NULL until recorded */
  uint64_t target;    /* stream->submitted at record time */
  uint64_t captured;  /* id of the capture it was last recorded in, 0 if none */
} sim_event;

typedef struct sim_chunk { /* a vm_create() physical chunk */
  size_t size;
  size_t nmapped;
  int destroyed;
} sim_chunk;

typedef struct sim_mapping {
  char *va;
  size_t size;
  gpumem_phys_handle handle;
} sim_mapping;

typedef struct sim_resv { /* a vm_reserve() range */
  struct sim_resv *next;
  char *va;
  size_t size;
  sim_mapping *maps; /* sorted by address, none overlapping */
  size_t nmaps, capmaps;
} sim_resv;

typedef struct sim_device { /* one visible device */
  int physical;
  uint64_t capacity;
  uint64_t used;     /* charged by malloc and vm_create */
  uint64_t external; /* gpumem_sim_set_external_usage */
  sim_map allocs;    /* ptr -> mapped length */
  sim_map streams;   /* stream pointer (non-NULL) -> sim_stream* */
  sim_stream default_stream;
  sim_map chunks;    /* handle -> sim_chunk* */
  sim_resv *resvs;
  sim_map poisoned;  /* under valgrind: malloc'd ptr -> 1 once made inaccessible but for announced blocks */
} sim_device;

typedef struct sim_config { /* what the environment says */
  int nphys;
  uint64_t capacity[SIM_MAX_DEVICES];
  int nvis;
  int visible[SIM_MAX_DEVICES]; /* visible ordinal -> physical index */
  char shared[64];              /* GPUMEM_SIM_SHARED, "" when unset */
} sim_config;

/* ------------------------------------------------------------------------ */
/* Shared devices (GPUMEM_SIM_SHARED): the capacity accounting in shared memory */

#define SIM_SH_MAGIC 0x53504d47u /* "GMPS" */
#define SIM_SH_VERSION 1u
#define SIM_SH_PROCS 128

typedef struct sim_sh_proc {
  int32_t pid;                    /* 0 = free */
  uint32_t pad_;
  uint64_t start;                 /* the process's start time (/proc/PID/stat), against pid reuse */
  _Atomic uint64_t used[SIM_MAX_DEVICES]; /* charged bytes per physical device */
} sim_sh_proc;

typedef struct sim_sh {
  _Atomic uint32_t magic;         /* written last by the creator */
  uint32_t version;
  uint32_t size;
  uint32_t nphys;
  uint64_t capacity[SIM_MAX_DEVICES];
  pthread_mutex_t lock;           /* process-shared, robust: charges are checked and made under it */
  sim_sh_proc procs[SIM_SH_PROCS];
} sim_sh;

static sim_sh *g_sh;              /* mapped while a state of a shared configuration exists */
static int g_sh_slot = -1;        /* this process's entry (-1: none) */
static int g_sh_held;             /* this process holds g_sh->lock (under g_lock) */
static uint64_t g_uuid_salt;      /* 0, or the hash of GPUMEM_SIM_SHARED: the devices' UUIDs depend on it */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* fork(): a child must be able to create a sim context of its own even if
 * another parent thread held g_lock at the fork. */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void sim__atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void sim__atfork_release(void) { pthread_mutex_unlock(&g_lock); }
static void sim__sh_fork_child(void);
static void sim__atfork_child(void) {
  sim__sh_fork_child();
  pthread_mutex_unlock(&g_lock);
}
static void sim__atfork_register(void) {
  (void)pthread_atfork(sim__atfork_prepare, sim__atfork_release, sim__atfork_child);
}

static struct {
  int refs;
  int ndev;
  sim_device *dev;
  sim_map events; /* sim_event* -> 1 */
  uint64_t next_handle;
  int ncaptures;  /* streams whose capture is not yet ended (active or invalidated) */
  int ndead;      /* streams destroyed (gpumem_sim_stream_destroy) and not made again */
} g;

/* Survive the state: fault injection, call counts, delayed mode. */
static struct {
  uint64_t calls[GPUMEM_SIM_CALL_KINDS_];
  uint64_t countdown[GPUMEM_SIM_CALL_KINDS_]; /* 0 = nothing armed */
  int error[GPUMEM_SIM_CALL_KINDS_];
  int repeat[GPUMEM_SIM_CALL_KINDS_];
  int sticky[GPUMEM_SIM_CALL_KINDS_]; /* repeat fault has fired: fail every call */
  uint64_t every[GPUMEM_SIM_CALL_KINDS_]; /* gpumem_sim_fail_every: the countdown's next start (0 = none) */
  int delayed;
  int clocked;    /* gpumem_sim_set_clock: records carry the clock (completed by gpumem_sim_complete_before) */
  uint64_t clock;
  uint64_t next_capture_id; /* capture ids are unique in the process, across states */
  int no_relax;             /* gpumem_sim_set_capture_relax(0) */
  uint64_t dead_uses;       /* backend calls that named a destroyed stream (gpumem_sim_dead_stream_uses) */
} g_ctl;

/* Count a call of a kind; return the injected error, or 0. Lock held. */
static int sim__enter(gpumem_sim_call kind) {
  g_ctl.calls[kind]++;
  if (g_ctl.sticky[kind]) return g_ctl.error[kind];
  if (g_ctl.countdown[kind]) {
    if (--g_ctl.countdown[kind] == 0) {
      if (g_ctl.repeat[kind]) g_ctl.sticky[kind] = 1;
      g_ctl.countdown[kind] = g_ctl.every[kind];
      return g_ctl.error[kind];
    }
  }
  return 0;
}

/* How a potentially unsafe call is made during a capture (see Stream capture). */
enum { SIM_CALLER_MODE = 0, SIM_RELAXED = 1 };
static int sim__unsafe(int relax);

/* The device, or NULL (sets *err). Lock held. */
static sim_device *sim__device(int device, int *err) {
  if (g.refs <= 0 || !g.dev) {
    *err = GPUMEM_SIM_ERR_NO_DEVICE;
    return NULL;
  }
  if (device < 0 || device >= g.ndev) {
    *err = GPUMEM_SIM_ERR_INVALID_DEVICE;
    return NULL;
  }
  return &g.dev[device];
}

/* Start time of a process (field 22 of /proc/PID/stat), 0 if unknown. */
static uint64_t sim__proc_start(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p) return 0;
  p++;
  for (int field = 3; field < 22 && p; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* A process that is gone (or whose pid now names another process). */
static int sim__proc_dead(int32_t pid, uint64_t start) {
  if (pid <= 0) return 1;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
  uint64_t now = sim__proc_start(pid);
  return now != 0 && start != 0 && now != start;
}

static void sim__sh_lock(void) {
  int rc = pthread_mutex_lock(&g_sh->lock);
  if (rc == EOWNERDEAD) (void)pthread_mutex_consistent(&g_sh->lock); /* a process died holding it: counts are single stores */
  g_sh_held = 1;
}
static void sim__sh_unlock(void) {
  g_sh_held = 0;
  (void)pthread_mutex_unlock(&g_sh->lock);
}

/* Bytes other processes hold on a physical device; drops the entries of dead processes. Shared lock held. */
static uint64_t sim__sh_others(int phys) {
  uint64_t sum = 0;
  pid_t self = getpid();
  for (int i = 0; i < SIM_SH_PROCS; i++) {
    sim_sh_proc *pr = &g_sh->procs[i];
    if (pr->pid == 0 || i == g_sh_slot) continue;
    if (pr->pid != self && sim__proc_dead(pr->pid, pr->start)) {
      for (int k = 0; k < SIM_MAX_DEVICES; k++) atomic_store(&pr->used[k], 0);
      pr->pid = 0; /* its memory goes back, as a driver's would */
      continue;
    }
    uint64_t u = atomic_load(&pr->used[phys]);
    sum = u > UINT64_MAX - sum ? UINT64_MAX : sum + u;
  }
  return sum;
}

/* This process's charge of a device, for the others to see. */
static void sim__sh_publish(const sim_device *d) {
  if (g_sh && g_sh_slot >= 0) atomic_store(&g_sh->procs[g_sh_slot].used[d->physical], d->used);
}

static uint64_t sim__avail(const sim_device *d) {
  uint64_t taken = d->used + d->external;
  if (g_sh) {
    int mine = !g_sh_held;
    if (mine) sim__sh_lock();
    uint64_t o = sim__sh_others(d->physical);
    if (mine) sim__sh_unlock();
    taken = o > UINT64_MAX - taken ? UINT64_MAX : taken + o;
  }
  return taken >= d->capacity ? 0 : d->capacity - taken;
}

/* ------------------------------------------------------------------------ */
/* Environment parsing                                                       */

static int sim__is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int sim__is_digit(char c) { return c >= '0' && c <= '9'; }
static char sim__lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

static const char *sim__skip_space(const char *p) {
  while (sim__is_space(*p)) p++;
  return p;
}

/* Parse a decimal integer; NULL on no digits or overflow. */
static const char *sim__parse_u64(const char *p, uint64_t *out) {
  uint64_t v = 0;
  if (!sim__is_digit(*p)) return NULL;
  while (sim__is_digit(*p)) {
    uint64_t d = (uint64_t)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return NULL;
    v = v * 10 + d;
    p++;
  }
  *out = v;
  return p;
}

/* Parse an optional unit at p (letters up to a separator); return the
 * multiplier shift, or -1 if the word is not a unit. */
static const char *sim__parse_unit(const char *p, unsigned *shift) {
  char w[4];
  size_t n = 0;
  while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) {
    if (n == sizeof w) return NULL;
    w[n++] = sim__lower(*p++);
  }
  if (n == 0) {
    *shift = 0;
    return p;
  }
  static const char prefixes[] = "bkmgt";
  const char *q = memchr(prefixes, w[0], 5);
  if (!q) return NULL;
  unsigned s = (unsigned)(q - prefixes) * 10;
  if (w[0] == 'b') {
    if (n != 1) return NULL;
  } else if (n == 2) {
    if (w[1] != 'b') return NULL;
  } else if (n == 3) {
    if (w[1] != 'i' || w[2] != 'b') return NULL;
  } else if (n != 1) {
    return NULL;
  }
  *shift = s;
  return p;
}

/* Parse GPUMEM_SIM_DEVICES. 0 or GPUMEM_SIM_ERR_BAD_ENV. */
static int sim__parse_devices(const char *s, sim_config *cfg) {
  cfg->nphys = 0;
  if (!s) {
    cfg->nphys = 1;
    cfg->capacity[0] = SIM_DEFAULT_CAPACITY;
    return 0;
  }
  const char *p = s;
  for (;;) {
    uint64_t count = 1, num, size;
    unsigned shift;
    p = sim__skip_space(p);
    if (!(p = sim__parse_u64(p, &num))) return GPUMEM_SIM_ERR_BAD_ENV;
    p = sim__skip_space(p);
    if (*p == 'x' || *p == 'X') {
      count = num;
      p = sim__skip_space(p + 1);
      if (!(p = sim__parse_u64(p, &num))) return GPUMEM_SIM_ERR_BAD_ENV;
      p = sim__skip_space(p);
    }
    if (!(p = sim__parse_unit(p, &shift))) return GPUMEM_SIM_ERR_BAD_ENV;
    p = sim__skip_space(p);
    if (shift && num > (UINT64_MAX >> shift)) return GPUMEM_SIM_ERR_BAD_ENV;
    size = num << shift;
    if (count == 0 || size == 0) return GPUMEM_SIM_ERR_BAD_ENV;
    if (count > (uint64_t)(SIM_MAX_DEVICES - cfg->nphys)) return GPUMEM_SIM_ERR_BAD_ENV;
    for (uint64_t i = 0; i < count; i++) cfg->capacity[cfg->nphys++] = size;
    if (*p == '\0') return 0;
    if (*p != ',') return GPUMEM_SIM_ERR_BAD_ENV;
    p++;
  }
}

static uint64_t sim__mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The stable UUID of a physical device (of the shared configuration named by g_uuid_salt). */
static void sim__uuid(int physical, char out[64]) {
  uint64_t hi = sim__mix(0x67707566656d0000ull + 2u * (uint64_t)physical + g_uuid_salt);
  uint64_t lo = sim__mix(0x67707566656d0000ull + 2u * (uint64_t)physical + 1u + g_uuid_salt);
  snprintf(out, 64, "GPU-%08" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%04" PRIx64 "-%012" PRIx64, hi >> 32,
           (hi >> 16) & 0xffffu, hi & 0xffffu, lo >> 48, lo & (uint64_t)0xffffffffffffull);
}

/* Physical index an entry names, or -1 if invalid. [b, e) is the entry. */
static int sim__visible_entry(const char *b, const char *e, int nphys) {
  while (b < e && sim__is_space(*b)) b++;
  while (e > b && sim__is_space(e[-1])) e--;
  if (b == e) return -1;
  if (sim__is_digit(*b)) {
    uint64_t v = 0;
    for (const char *p = b; p < e; p++) {
      if (!sim__is_digit(*p)) return -1;
      v = v * 10 + (uint64_t)(*p - '0');
      if (v >= (uint64_t)nphys) return -1;
    }
    return (int)v;
  }
  size_t n = (size_t)(e - b);
  if (n <= 4 || strncmp(b, "GPU-", 4) != 0) return -1;
  int found = -1;
  for (int i = 0; i < nphys; i++) {
    char u[64];
    sim__uuid(i, u);
    if (n > strlen(u)) continue;
    size_t k = 4;
    while (k < n && sim__lower(b[k]) == u[k]) k++;
    if (k == n) {
      if (found >= 0) return -1; /* ambiguous */
      found = i;
    }
  }
  return found;
}

/* Parse CUDA_VISIBLE_DEVICES into cfg->visible. */
static void sim__parse_visible(const char *s, sim_config *cfg) {
  cfg->nvis = 0;
  if (!s) {
    for (int i = 0; i < cfg->nphys; i++) cfg->visible[cfg->nvis++] = i;
    return;
  }
  const char *b = s;
  for (;;) {
    const char *e = strchr(b, ',');
    if (!e) e = b + strlen(b);
    int phys = sim__visible_entry(b, e, cfg->nphys);
    if (phys < 0) return;
    for (int i = 0; i < cfg->nvis; i++)
      if (cfg->visible[i] == phys) return; /* duplicate */
    cfg->visible[cfg->nvis++] = phys;
    if (*e == '\0') return;
    b = e + 1;
  }
}

/* Read both variables. 0, GPUMEM_SIM_ERR_BAD_ENV or GPUMEM_SIM_ERR_NO_DEVICE. */
/* FNV-1a of n bytes (it wraps on purpose: fuzz/ubsan-ignore.txt matches *hash*). */
static uint64_t sim__fnv_hash(const char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
  return h;
}

static int sim__read_env(sim_config *cfg) {
  int rc = sim__parse_devices(getenv("GPUMEM_SIM_DEVICES"), cfg);
  if (rc) return rc;
  const char *sh = getenv("GPUMEM_SIM_SHARED");
  cfg->shared[0] = '\0';
  g_uuid_salt = 0;
  if (sh && *sh) {
    size_t n = strlen(sh);
    if (n > 48) return GPUMEM_SIM_ERR_BAD_ENV;
    for (size_t i = 0; i < n; i++) {
      char c = sh[i];
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || sim__is_digit(c) || c == '.' || c == '_' || c == '-'))
        return GPUMEM_SIM_ERR_BAD_ENV;
    }
    memcpy(cfg->shared, sh, n + 1);
    g_uuid_salt = sim__fnv_hash(sh, n) | 1u;
  }
  sim__parse_visible(getenv("CUDA_VISIBLE_DEVICES"), cfg);
  return cfg->nvis ? 0 : GPUMEM_SIM_ERR_NO_DEVICE;
}

/* Take an entry of the shared accounting for this process (g_sh mapped). 0, or -1 when all are taken. */
static int sim__sh_claim(void) {
  sim__sh_lock();
  int32_t self = (int32_t)getpid();
  int slot = -1;
  for (int i = 0; i < SIM_SH_PROCS && slot < 0; i++) {
    sim_sh_proc *pr = &g_sh->procs[i];
    if (pr->pid != 0 && sim__proc_dead(pr->pid, pr->start)) pr->pid = 0;
    if (pr->pid == 0) slot = i;
  }
  if (slot >= 0) {
    sim_sh_proc *pr = &g_sh->procs[slot];
    pr->pid = self;
    pr->start = sim__proc_start(self);
    for (int k = 0; k < SIM_MAX_DEVICES; k++) atomic_store(&pr->used[k], 0);
  }
  sim__sh_unlock();
  g_sh_slot = slot;
  return slot >= 0 ? 0 : -1;
}

/* In a fork's child (g_lock held): the memory the child inherited the records of is the parent's,
 * accounted in the parent's entry; the child starts with nothing charged, in an entry of its own. */
static void sim__sh_fork_child(void) {
  if (!g_sh) return;
  for (int i = 0; i < g.ndev; i++) g.dev[i].used = 0;
  if (sim__sh_claim() != 0) g_sh_slot = -1;
}

/* Map (creating it if new) the shared accounting of cfg->shared and take an entry. 0 or an error code. g_lock held. */
static int sim__sh_open(const sim_config *cfg) {
  char name[96];
  snprintf(name, sizeof name, "/gpumem-sim-%lu-%s", (unsigned long)geteuid(), cfg->shared);
  int created = 0;
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    created = 1;
    if (ftruncate(fd, (off_t)sizeof(sim_sh)) != 0) {
      close(fd);
      shm_unlink(name);
      return GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    }
  } else if (errno == EEXIST) {
    fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return GPUMEM_SIM_ERR_BAD_ENV;
  } else {
    return GPUMEM_SIM_ERR_BAD_ENV;
  }
  struct stat st;
  /* another user's object, one others may write, or one not (yet) of our size is not ours to use */
  for (int tries = 0; !created; tries++) {
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
      close(fd);
      return GPUMEM_SIM_ERR_BAD_ENV;
    }
    if (st.st_size == (off_t)sizeof(sim_sh)) break;
    if (tries >= 200) { /* 200 ms: its creator died before sizing it, or it is foreign */
      close(fd);
      return GPUMEM_SIM_ERR_BAD_ENV;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  sim_sh *sh = mmap(NULL, sizeof(sim_sh), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (sh == MAP_FAILED) return GPUMEM_SIM_ERR_OUT_OF_MEMORY;
  if (created) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&sh->lock, &a);
    pthread_mutexattr_destroy(&a);
    sh->version = SIM_SH_VERSION;
    sh->size = (uint32_t)sizeof(sim_sh);
    sh->nphys = (uint32_t)cfg->nphys;
    for (int i = 0; i < cfg->nphys; i++) sh->capacity[i] = cfg->capacity[i];
    atomic_store(&sh->magic, SIM_SH_MAGIC);
  } else {
    for (int tries = 0; atomic_load(&sh->magic) != SIM_SH_MAGIC && tries < 200; tries++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    int ok = atomic_load(&sh->magic) == SIM_SH_MAGIC && sh->version == SIM_SH_VERSION &&
             sh->size == (uint32_t)sizeof(sim_sh) && sh->nphys == (uint32_t)cfg->nphys;
    for (int i = 0; ok && i < cfg->nphys; i++) ok = sh->capacity[i] == cfg->capacity[i];
    if (!ok) {
      munmap(sh, sizeof(sim_sh));
      return GPUMEM_SIM_ERR_BAD_ENV;
    }
  }
  g_sh = sh;
  if (sim__sh_claim() != 0) {
    munmap(sh, sizeof(sim_sh));
    g_sh = NULL;
    return GPUMEM_SIM_ERR_OUT_OF_MEMORY; /* SIM_SH_PROCS processes share it already */
  }
  return 0;
}

/* Give this process's entry back and unmap. g_lock held. */
static void sim__sh_close(void) {
  if (!g_sh) return;
  sim__sh_lock();
  if (g_sh_slot >= 0) {
    sim_sh_proc *pr = &g_sh->procs[g_sh_slot];
    for (int k = 0; k < SIM_MAX_DEVICES; k++) atomic_store(&pr->used[k], 0);
    pr->pid = 0;
  }
  sim__sh_unlock();
  munmap(g_sh, sizeof(sim_sh));
  g_sh = NULL;
  g_sh_slot = -1;
}

/* ------------------------------------------------------------------------ */
/* Device teardown                                                           */

/* Unmap everything of a device and free its chunks; keeps stream records. */
static void sim__device_release_memory(sim_device *d) {
  for (size_t i = 0; i < d->allocs.cap; i++)
    if (d->allocs.keys[i]) munmap((void *)d->allocs.keys[i], (size_t)d->allocs.vals[i]);
  sim__map_free(&d->allocs);
  sim__map_free(&d->poisoned);
  while (d->resvs) {
    sim_resv *r = d->resvs;
    d->resvs = r->next;
    munmap(r->va, r->size);
    free(r->maps);
    free(r);
  }
  for (size_t i = 0; i < d->chunks.cap; i++)
    if (d->chunks.keys[i]) free((void *)d->chunks.vals[i]);
  sim__map_free(&d->chunks);
  d->used = 0;
  sim__sh_publish(d);
}

static void sim__device_complete(sim_device *d) {
  d->default_stream.completed = d->default_stream.submitted;
  d->default_stream.ndep = 0;
  for (size_t i = 0; i < d->streams.cap; i++)
    if (d->streams.keys[i]) {
      sim_stream *s = (sim_stream *)d->streams.vals[i];
      s->completed = s->submitted;
      s->ndep = 0;
    }
}

/* s has completed its work up to s->completed: so has every stream it waited on there, up to what
 * it waited for (the device ran that work first). Lock held. */
static void sim__pull(sim_stream *s) {
  if (s->ndep == 0) return;
  sim_dep fire[SIM_DEPS];
  int nf = 0, k = 0;
  for (int i = 0; i < s->ndep; i++) {
    if (s->completed >= s->dep[i].at) fire[nf++] = s->dep[i];
    else s->dep[k++] = s->dep[i];
  }
  s->ndep = k; /* (before pulling others: a chain may come back to s) */
  for (int i = 0; i < nf; i++)
    if (fire[i].on->completed < fire[i].target) {
      fire[i].on->completed = fire[i].target;
      sim__pull(fire[i].on);
    }
}

static void sim__state_free(void) {
  for (int i = 0; i < g.ndev; i++) {
    sim_device *d = &g.dev[i];
    sim__device_release_memory(d);
    for (size_t j = 0; j < d->streams.cap; j++)
      if (d->streams.keys[j]) {
        free(((sim_stream *)d->streams.vals[j])->stamps);
        free(((sim_stream *)d->streams.vals[j])->dep);
        free((void *)d->streams.vals[j]);
      }
    sim__map_free(&d->streams);
    free(d->default_stream.stamps);
    free(d->default_stream.dep);
    d->default_stream.stamps = NULL;
  }
  free(g.dev);
  g.dev = NULL;
  __atomic_store_n(&g.ndev, 0, __ATOMIC_RELEASE); /* (read without the lock: sim_stream_capture) */
  __atomic_store_n(&g.ncaptures, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&g.ndead, 0, __ATOMIC_RELEASE);
  sim__sh_close();
  for (size_t i = 0; i < g.events.cap; i++)
    if (g.events.keys[i]) free((void *)g.events.keys[i]);
  sim__map_free(&g.events);
}

/* ------------------------------------------------------------------------ */
/* Vtable: lifecycle and devices                                             */

#ifdef SIM_HAVE_VALGRIND
static void sim_annotate_alloc(gpumem_backend *be, int device, void *ptr, size_t size) {
  (void)be;
  /* The first block announced in a piece of malloc'd memory makes the whole
   * piece inaccessible, so that memcheck flags accesses between blocks (past
   * a block's requested size). Memory of the sim's direct users, who announce
   * nothing, stays accessible. */
  pthread_mutex_lock(&g_lock);
  int rc = 0;
  sim_device *d = g.refs > 0 ? sim__device(device, &rc) : NULL;
  if (d != NULL) {
    for (size_t i = 0; i < d->allocs.cap; i++) {
      uintptr_t base = d->allocs.keys[i], len = d->allocs.vals[i];
      if (base == 0 || (uintptr_t)ptr < base || (uintptr_t)ptr >= base + len) continue;
      if (sim__map_find(&d->poisoned, base) == SIZE_MAX && sim__map_put(&d->poisoned, base, 1) == 0)
        VALGRIND_MAKE_MEM_NOACCESS((void *)base, len);
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  VALGRIND_MALLOCLIKE_BLOCK(ptr, size, 0, 0); /* contents undefined, as device memory's */
}

static void sim_annotate_free(gpumem_backend *be, int device, void *ptr, size_t size) {
  (void)be;
  (void)device;
  (void)size;
  VALGRIND_FREELIKE_BLOCK(ptr, 0);
}
#endif

#ifdef SIM_HAVE_VALGRIND
/* True under valgrind's memcheck, the one tool that reads the annotations.
 * Other tools (callgrind counting instructions, helgrind, drd) would only pay
 * for the monitoring hooks they turn on. memcheck preloads its own
 * vgpreload_memcheck-<platform>.so, which names the tool. */
static int sim__under_memcheck(void) {
  if (!RUNNING_ON_VALGRIND) return 0;
  const char *pre = getenv("LD_PRELOAD");
  return pre != NULL && strstr(pre, "vgpreload_memcheck") != NULL;
}
#endif

static int sim_init(gpumem_backend *be) {
  (void)pthread_once(&g_atfork_once, sim__atfork_register);
#ifdef SIM_HAVE_VALGRIND
  /* be is the core's copy: without valgrind the core skips the annotations */
  if (be != NULL && !sim__under_memcheck()) {
    be->annotate_alloc = NULL;
    be->annotate_free = NULL;
  }
#endif
  (void)be;
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  if (g.refs == 0) {
    sim_config cfg;
    rc = sim__read_env(&cfg);
    if (rc == 0) {
      g.dev = calloc((size_t)cfg.nvis, sizeof *g.dev);
      if (!g.dev) {
        rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
      } else {
        __atomic_store_n(&g.ndev, cfg.nvis, __ATOMIC_RELEASE);
        for (int i = 0; i < cfg.nvis; i++) {
          g.dev[i].physical = cfg.visible[i];
          g.dev[i].capacity = cfg.capacity[cfg.visible[i]];
        }
        if (g.next_handle == 0) g.next_handle = 1;
        memset(g_ctl.calls, 0, sizeof g_ctl.calls);
        g_ctl.dead_uses = 0;
        if (cfg.shared[0] && (rc = sim__sh_open(&cfg)) != 0) {
          free(g.dev);
          g.dev = NULL;
          __atomic_store_n(&g.ndev, 0, __ATOMIC_RELEASE); /* (read without the lock: sim_stream_capture) */
        }
      }
    }
  }
  if (rc == 0) g.refs++;
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static void sim_shutdown(gpumem_backend *be) {
  (void)be;
  pthread_mutex_lock(&g_lock);
  if (g.refs > 0 && --g.refs == 0) sim__state_free();
  pthread_mutex_unlock(&g_lock);
}

static int sim_device_count(gpumem_backend *be, int *count) {
  (void)be;
  if (!count) return GPUMEM_SIM_ERR_INVALID_VALUE;
  pthread_mutex_lock(&g_lock);
  int rc = (g.refs > 0) ? 0 : GPUMEM_SIM_ERR_NO_DEVICE;
  if (rc == 0) *count = g.ndev;
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_device_info(gpumem_backend *be, int device, gpumem_backend_device_info *info) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_INFO);
  if (rc == 0 && !info) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  if (rc == 0) {
    sim_device *d = sim__device(device, &rc);
    if (d) {
      memset(info, 0, sizeof *info);
      snprintf(info->name, sizeof info->name, "libgpumem simulated device");
      sim__uuid(d->physical, info->uuid);
      snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "0000:%02x:00.0", (unsigned)d->physical + 1u);
      info->total_bytes = d->capacity;
      info->physical_index = d->physical;
      info->private_device = g_sh == NULL;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_mem_get_info(gpumem_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_INFO);
  if (rc == 0 && (!free_bytes || !total_bytes)) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  if (rc == 0) {
    sim_device *d = sim__device(device, &rc);
    if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
    if (d) {
      *free_bytes = sim__avail(d);
      *total_bytes = d->capacity;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Vtable: plain memory                                                      */

static int sim_malloc(gpumem_backend *be, int device, size_t size, void **ptr) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_MALLOC);
  if (rc == 0 && !ptr) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d && g_sh) sim__sh_lock(); /* the check and the charge, at once for every process */
  if (d) {
    if (size == 0) {
      *ptr = NULL;
    } else if (size > SIZE_MAX - (SIM_PAGE - 1) || (uint64_t)size > sim__avail(d)) {
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else {
      size_t len = (size + SIM_PAGE - 1) & ~(SIM_PAGE - 1);
      if ((uint64_t)len > sim__avail(d)) {
        rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
      } else {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
          rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
        } else if (sim__map_put(&d->allocs, (uintptr_t)p, (uintptr_t)len) != 0) {
          munmap(p, len);
          rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
        } else {
          d->used += len;
          sim__sh_publish(d);
          *ptr = p;
        }
      }
    }
  }
  if (d && g_sh) sim__sh_unlock();
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_free(gpumem_backend *be, int device, void *ptr) {
  (void)be;
  int rc;
  void *unmap = NULL;
  size_t len = 0;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_FREE);
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && ptr && (rc = sim__unsafe(SIM_CALLER_MODE)) != 0) d = NULL;
  if (d && ptr) {
    size_t i = sim__map_find(&d->allocs, (uintptr_t)ptr);
    if (i == SIZE_MAX) {
      rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    } else {
      len = (size_t)d->allocs.vals[i];
      sim__map_del_at(&d->allocs, i);
      size_t j = sim__map_find(&d->poisoned, (uintptr_t)ptr);
      if (j != SIZE_MAX) sim__map_del_at(&d->poisoned, j);
      d->used -= len;
      sim__sh_publish(d);
      unmap = ptr;
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (unmap) munmap(unmap, len);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Vtable: streams and events                                                */

/* The record of a stream, created on demand; NULL if out of host memory. Lock held. */
static sim_stream *sim__stream(sim_device *d, gpumem_stream stream, int create) {
  if (!stream) return &d->default_stream;
  uintptr_t v;
  if (sim__map_get(&d->streams, (uintptr_t)stream, &v)) return (sim_stream *)v;
  if (!create) return NULL;
  sim_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  if (sim__map_put(&d->streams, (uintptr_t)stream, (uintptr_t)s) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

/* A backend call naming a destroyed stream: counted (CUDA does not check the handle: such a call
 * reads freed driver memory, and cuStreamGetCaptureInfo on an H100 and an H200 crashed), and
 * GPUMEM_SIM_ERR_INVALID_VALUE; 0 for a stream that lives. Lock held. */
static int sim__dead_use(sim_device *d, gpumem_stream stream) {
  if (!stream || __atomic_load_n(&g.ndead, __ATOMIC_RELAXED) == 0) return 0;
  sim_stream *s = sim__stream(d, stream, 0);
  if (!s || !s->dead) return 0;
  g_ctl.dead_uses++;
  return GPUMEM_SIM_ERR_INVALID_VALUE;
}

/* Look up an event of a device. Lock held. */
static sim_event *sim__event(int device, gpumem_event ev, int *rc) {
  if (!sim__device(device, rc)) return NULL;
  if (!ev || !sim__map_get(&g.events, (uintptr_t)ev, NULL) || ((sim_event *)ev)->device != device) {
    *rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    return NULL;
  }
  return (sim_event *)ev;
}

/* ------------------------------------------------------------------------ */
/* Stream capture                                                            */
/*
 * The sim models CUDA's stream capture (the rules and their sources are in
 * cuda.c): while a stream captures, an event recorded on it is recorded into
 * the capture (cap_nodes) and runs nothing; a call that CUDA refuses in that
 * state fails with a GPUMEM_SIM_ERR_CAPTURE_* code and invalidates the capture
 * it conflicts with:
 * - potentially unsafe calls (malloc, free, mem_get_info, event create,
 *   destroy, query and synchronize, stream synchronize of a stream that is not
 *   capturing, the vm_* calls but vm_granularity) are refused when the calling
 *   thread's interaction mode is global and it has a non-relaxed capture under
 *   way or another thread has a global one; or when its mode is thread-local
 *   and it has a non-relaxed capture under way. The sim makes its own
 *   malloc, mem_get_info, event create/destroy/query and vm_* calls in relaxed
 *   mode, as cuda.c does (gpumem_sim_set_capture_relax(0) turns that off);
 *   free, the synchronisations and device_reset keep the caller's mode;
 * - whatever the mode: synchronizing a capturing stream, querying or
 *   synchronizing an event last recorded in a capture, synchronizing or
 *   resetting a device while one of its streams captures, and using the NULL
 *   stream (record, synchronize) while a stream of the device captures (every
 *   simulated stream is a blocking one).
 * Calls on a stream whose capture was invalidated fail with
 * GPUMEM_SIM_ERR_CAPTURE_INVALIDATED until the capture is ended.
 */

static _Thread_local char sim_tls_self;
static _Thread_local int sim_tls_mode = GPUMEM_SIM_CAPTURE_GLOBAL;

static uintptr_t sim__self(void) { return (uintptr_t)&sim_tls_self; }

/* Call f on every stream of every device whose capture is not ended. Lock held. */
#define SIM_FOR_CAPTURES(dev_, s_, body)                                           \
  do {                                                                            \
    for (int i_ = 0; g.ncaptures > 0 && i_ < g.ndev; i_++) {                       \
      sim_device *dev_ = &g.dev[i_];                                              \
      for (size_t j_ = 0; j_ < dev_->streams.cap; j_++) {                         \
        if (!dev_->streams.keys[j_]) continue;                                    \
        sim_stream *s_ = (sim_stream *)dev_->streams.vals[j_];                    \
        if (s_->cap_status == GPUMEM_CAPTURE_NONE) continue;                      \
        body                                                                      \
      }                                                                           \
    }                                                                             \
  } while (0)

/* 1 when a stream of the device has a capture under way. Lock held. */
static int sim__device_capturing(const sim_device *d) {
  int any = 0;
  SIM_FOR_CAPTURES(dd, cs, {
    if (dd == d && cs->cap_status == GPUMEM_CAPTURE_ACTIVE) any = 1;
  });
  return any;
}

/* Invalidate every active capture of a device. Lock held. */
static void sim__invalidate_device(const sim_device *d) {
  SIM_FOR_CAPTURES(dd, cs, {
    if (dd == d && cs->cap_status == GPUMEM_CAPTURE_ACTIVE) cs->cap_status = GPUMEM_CAPTURE_INVALIDATED;
  });
}

/* Invalidate the active capture with this id, if any. Lock held. */
static void sim__invalidate_id(uint64_t id) {
  SIM_FOR_CAPTURES(dd, cs, {
    (void)dd;
    if (cs->cap_id == id && cs->cap_status == GPUMEM_CAPTURE_ACTIVE) cs->cap_status = GPUMEM_CAPTURE_INVALIDATED;
  });
}

/*
 * A potentially unsafe call by this thread: 0 when the capture rules allow
 * it; else GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED, and the captures that forbid
 * it are invalidated. `relax`: the sim makes this call in relaxed mode (as
 * cuda.c does), unless gpumem_sim_set_capture_relax(0). Lock held.
 */
static int sim__unsafe(int relax) {
  int mode = (relax == SIM_RELAXED && !g_ctl.no_relax) ? GPUMEM_SIM_CAPTURE_RELAXED : sim_tls_mode;
  int refused = 0;
  if (mode == GPUMEM_SIM_CAPTURE_RELAXED || g.ncaptures == 0) return 0;
  uintptr_t me = sim__self();
  SIM_FOR_CAPTURES(dd, cs, {
    (void)dd;
    if (cs->cap_status != GPUMEM_CAPTURE_ACTIVE) continue;
    int mine = cs->cap_thread == me;
    if ((mine && cs->cap_mode != GPUMEM_SIM_CAPTURE_RELAXED) ||
        (!mine && cs->cap_mode == GPUMEM_SIM_CAPTURE_GLOBAL && mode == GPUMEM_SIM_CAPTURE_GLOBAL)) {
      cs->cap_status = GPUMEM_CAPTURE_INVALIDATED;
      refused = 1;
    }
  });
  return refused ? GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED : 0;
}

/* Use of a stream of a device by a call that queues or waits on it: 0, or why
 * not (and the captures it conflicts with invalidated). Lock held. */
static int sim__stream_use(sim_device *d, gpumem_stream stream) {
  if (g.ncaptures == 0) return 0;
  if (!stream) {
    if (!sim__device_capturing(d)) return 0;
    sim__invalidate_device(d);
    return GPUMEM_SIM_ERR_CAPTURE_IMPLICIT;
  }
  sim_stream *s = sim__stream(d, stream, 0);
  if (s && s->cap_status == GPUMEM_CAPTURE_INVALIDATED) return GPUMEM_SIM_ERR_CAPTURE_INVALIDATED;
  return 0;
}

static int sim_event_create(gpumem_backend *be, int device, gpumem_event *ev) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_EVENT);
  if (rc == 0 && !ev) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  if (rc == 0 && sim__device(device, &rc)) rc = sim__unsafe(SIM_RELAXED);
  if (rc == 0) {
    sim_event *e = calloc(1, sizeof *e);
    if (!e || sim__map_put(&g.events, (uintptr_t)e, 1) != 0) {
      free(e);
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else {
      e->device = device;
      *ev = e;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_event_destroy(gpumem_backend *be, int device, gpumem_event ev) {
  (void)be;
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  sim_event *e = sim__event(device, ev, &rc);
  if (e && (rc = sim__unsafe(SIM_RELAXED)) != 0) e = NULL;
  if (e) {
    sim__map_del_at(&g.events, sim__map_find(&g.events, (uintptr_t)e));
    free(e);
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* Clocked mode: remember the clock of the record just made on s (its target s->submitted). A
 * stream with more than SIM_RING records pending has its oldest completed; without host memory for
 * the ring, its work completes at once. Lock held. */
static void sim__stamp(sim_stream *s) {
  if (!g_ctl.clocked) return;
  if (s->stamps == NULL && (s->stamps = calloc(SIM_RING, sizeof *s->stamps)) == NULL) {
    s->completed = s->submitted;
    sim__pull(s);
    return;
  }
  if (s->submitted - s->completed > SIM_RING) {
    s->completed = s->submitted - SIM_RING;
    sim__pull(s);
  }
  s->stamps[s->submitted % SIM_RING] = g_ctl.clock;
}

/* Clocked mode: the records of s made before clock t are complete. Lock held. */
static void sim__complete_before(sim_stream *s, uint64_t t) {
  while (s->completed < s->submitted && (s->stamps == NULL || s->stamps[(s->completed + 1) % SIM_RING] < t))
    s->completed++;
  sim__pull(s);
}

static int sim_event_record(gpumem_backend *be, int device, gpumem_event ev, gpumem_stream stream) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_EVENT);
  sim_event *e = rc == 0 ? sim__event(device, ev, &rc) : NULL;
  if (e && (rc = sim__dead_use(&g.dev[device], stream)) != 0) e = NULL;
  if (e && (rc = sim__stream_use(&g.dev[device], stream)) != 0) e = NULL;
  if (e) {
    sim_stream *s = sim__stream(&g.dev[device], stream, 1);
    if (!s) {
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else if (s->cap_status == GPUMEM_CAPTURE_ACTIVE) {
      s->cap_nodes++; /* recorded into the capture: runs nothing now */
      e->captured = s->cap_id;
      e->stream = NULL;
      e->target = 0;
    } else {
      e->captured = 0;
      if (g_ctl.delayed) {
        s->submitted++;
        sim__stamp(s);
      } else {
        s->completed = s->submitted;
        sim__pull(s);
      }
      e->stream = s;
      e->target = s->submitted;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_event_query(gpumem_backend *be, int device, gpumem_event ev, int *complete) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_EVENT);
  if (rc == 0 && !complete) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  sim_event *e = rc == 0 ? sim__event(device, ev, &rc) : NULL;
  if (e && e->captured) {
    sim__invalidate_id(e->captured);
    rc = GPUMEM_SIM_ERR_CAPTURED_EVENT;
    e = NULL;
  }
  if (e && (rc = sim__unsafe(SIM_RELAXED)) != 0) e = NULL;
  if (e) *complete = !e->stream || e->stream->completed >= e->target;
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_event_synchronize(gpumem_backend *be, int device, gpumem_event ev) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_EVENT);
  sim_event *e = rc == 0 ? sim__event(device, ev, &rc) : NULL;
  if (e && e->captured) {
    sim__invalidate_id(e->captured);
    rc = GPUMEM_SIM_ERR_CAPTURED_EVENT;
    e = NULL;
  }
  if (e && (rc = sim__unsafe(SIM_CALLER_MODE)) != 0) e = NULL;
  if (e && e->stream && e->stream->completed < e->target) {
    e->stream->completed = e->target;
    sim__pull(e->stream);
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* s's later work waits for o's up to `target` (not complete, o another stream): a work item on s
 * whose completion completes o up to there (sim__pull). Lock held. */
static int sim__wait_on(sim_stream *s, sim_stream *o, uint64_t target) {
  sim__pull(s);
  if (s->dep == NULL && (s->dep = calloc(SIM_DEPS, sizeof *s->dep)) == NULL) return GPUMEM_SIM_ERR_OUT_OF_MEMORY;
  if (s->ndep == SIM_DEPS) return GPUMEM_SIM_ERR_OUT_OF_MEMORY;
  s->submitted++;
  sim__stamp(s);
  s->dep[s->ndep].at = s->submitted;
  s->dep[s->ndep].on = o;
  s->dep[s->ndep].target = target;
  s->ndep++;
  return 0;
}

/* The stream's later work waits for the event's: a work item on the stream whose completion
 * completes the event's stream up to the event (sim__pull). Nothing when the event is complete or
 * was recorded on the same stream. */
static int sim_stream_wait_event(gpumem_backend *be, int device, gpumem_stream stream, gpumem_event ev) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_EVENT);
  sim_event *e = rc == 0 ? sim__event(device, ev, &rc) : NULL;
  if (e && e->captured) {
    sim__invalidate_id(e->captured);
    rc = GPUMEM_SIM_ERR_CAPTURED_EVENT;
    e = NULL;
  }
  if (e && (rc = sim__dead_use(&g.dev[device], stream)) != 0) e = NULL;
  if (e && (rc = sim__stream_use(&g.dev[device], stream)) != 0) e = NULL;
  if (e) {
    sim_stream *s = sim__stream(&g.dev[device], stream, 1);
    if (!s) {
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else if (s->cap_status == GPUMEM_CAPTURE_ACTIVE) {
      s->cap_status = GPUMEM_CAPTURE_INVALIDATED; /* an event from outside the capture */
      rc = GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED;
    } else if (e->stream && e->stream != s && e->stream->completed < e->target) {
      rc = sim__wait_on(s, e->stream, e->target);
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_stream_synchronize(gpumem_backend *be, int device, gpumem_stream stream) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_SYNC);
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__dead_use(d, stream)) != 0) d = NULL;
  if (d) {
    sim_stream *s = sim__stream(d, stream, 0);
    if (s && s->cap_status == GPUMEM_CAPTURE_ACTIVE) {
      s->cap_status = GPUMEM_CAPTURE_INVALIDATED; /* a capturing stream stands for no work to wait for */
      rc = GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED;
    } else {
      rc = sim__stream_use(d, stream);
      if (rc == 0) rc = sim__unsafe(SIM_CALLER_MODE);
    }
    if (rc == 0 && s) {
      s->completed = s->submitted;
      sim__pull(s);
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_device_synchronize(gpumem_backend *be, int device) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_SYNC);
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && sim__device_capturing(d)) {
    sim__invalidate_device(d); /* the device contains the capture: waiting for it is invalid */
    rc = GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED;
    d = NULL;
  }
  if (d) sim__device_complete(d);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_device_reset(gpumem_backend *be, int device) {
  (void)be;
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d && sim__device_capturing(d)) {
    sim__invalidate_device(d);
    rc = GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED;
    d = NULL;
  }
  if (d) {
    sim__device_release_memory(d);
    sim__device_complete(d);
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Vtable: errors                                                            */

static gpumem_status sim_error_status(const gpumem_backend *be, int code) {
  (void)be;
  switch (code) {
  case GPUMEM_SIM_OK: return GPUMEM_OK;
  case GPUMEM_SIM_ERR_OUT_OF_MEMORY: return GPUMEM_ERR_OUT_OF_MEMORY;
  case GPUMEM_SIM_ERR_NO_DEVICE: return GPUMEM_ERR_NO_BACKEND;
  case GPUMEM_SIM_ERR_INVALID_DEVICE: return GPUMEM_ERR_INVALID_DEVICE;
  case GPUMEM_SIM_ERR_BAD_ENV: return GPUMEM_ERR_INVALID_ARGUMENT;
  default: return GPUMEM_ERR_BACKEND;
  }
}

static const char *sim_error_string(const gpumem_backend *be, int code) {
  (void)be;
  switch (code) {
  case GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED:
    return "sim: operation not permitted while a stream is capturing (a potentially unsafe call under a global or "
           "thread-local capture, or a synchronisation of a capturing stream or of its device); the capture is now "
           "invalidated";
  case GPUMEM_SIM_ERR_CAPTURE_INVALIDATED:
    return "sim: the stream's capture was invalidated by an earlier operation; end the capture first";
  case GPUMEM_SIM_ERR_CAPTURE_IMPLICIT:
    return "sim: the NULL (legacy) stream was used while a stream of the device is capturing; the capture is now "
           "invalidated";
  case GPUMEM_SIM_ERR_CAPTURED_EVENT:
    return "sim: the event was last recorded in a capture and stands for no work: it cannot be queried or waited for";
  case GPUMEM_SIM_OK: return "sim: no error";
  case GPUMEM_SIM_ERR_INVALID_VALUE:
    return "sim: invalid value (a NULL output, an unknown pointer, event or handle, or a misaligned or unknown range)";
  case GPUMEM_SIM_ERR_OUT_OF_MEMORY: return "sim: out of memory: the simulated device's capacity is exhausted";
  case GPUMEM_SIM_ERR_BAD_ENV:
    return "sim: GPUMEM_SIM_DEVICES does not parse: expected a comma-separated list of [COUNTx]SIZE items "
           "with SIZE a positive integer and an optional unit B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB or TiB "
           "(e.g. \"2x16GiB\" or \"16GiB,8GiB\"), at most 64 devices";
  case GPUMEM_SIM_ERR_INVALID_DEVICE: return "sim: invalid device ordinal";
  case GPUMEM_SIM_ERR_NO_DEVICE:
    return "sim: no simulated device is visible (CUDA_VISIBLE_DEVICES is empty, -1, or starts with an invalid entry), "
           "or the sim backend is not initialised";
  case GPUMEM_SIM_ERR_INJECTED: return "sim: injected fault";
  default: return "sim: unknown error";
  }
}

/* ------------------------------------------------------------------------ */
/* Vtable: virtual memory                                                    */

static int sim_vm_granularity(gpumem_backend *be, int device, size_t *granularity) {
  (void)be;
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  if (!granularity) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  else if (sim__device(device, &rc)) *granularity = SIM_VM_GRANULARITY;
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim__aligned(const void *va, size_t size) {
  return ((uintptr_t)va % SIM_VM_GRANULARITY) == 0 && size % SIM_VM_GRANULARITY == 0;
}

static int sim_vm_reserve(gpumem_backend *be, int device, size_t size, void **va) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_MAP);
  if (rc == 0 && (!va || size == 0 || size > SIZE_MAX / 2)) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d) {
    size_t len = (size + SIM_VM_GRANULARITY - 1) & ~(SIM_VM_GRANULARITY - 1);
    size_t total = len + SIM_VM_GRANULARITY;
    sim_resv *r = calloc(1, sizeof *r);
    char *p = r ? mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) : MAP_FAILED;
    if (p == MAP_FAILED) {
      free(r);
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else {
      uintptr_t a = ((uintptr_t)p + SIM_VM_GRANULARITY - 1) & ~(uintptr_t)(SIM_VM_GRANULARITY - 1);
      size_t head = (size_t)(a - (uintptr_t)p);
      size_t tail = total - head - len;
      if (head) munmap(p, head);
      if (tail) munmap(p + head + len, tail);
      r->va = p + head;
      r->size = len;
      r->next = d->resvs;
      d->resvs = r;
      *va = r->va;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* The reservation of a device that contains [va, va+size), or NULL. */
static sim_resv *sim__resv_containing(sim_device *d, const char *va, size_t size) {
  for (sim_resv *r = d->resvs; r; r = r->next)
    if (va >= r->va && (size_t)(va - r->va) <= r->size && size <= r->size - (size_t)(va - r->va)) return r;
  return NULL;
}

static int sim_vm_release(gpumem_backend *be, int device, void *va, size_t size) {
  (void)be;
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d) {
    sim_resv **pr = &d->resvs;
    while (*pr && (*pr)->va != (char *)va) pr = &(*pr)->next;
    sim_resv *r = *pr;
    size_t len = (size + SIM_VM_GRANULARITY - 1) & ~(SIM_VM_GRANULARITY - 1);
    if (!r || size == 0 || size > SIZE_MAX / 2 || len != r->size || r->nmaps) {
      rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    } else {
      *pr = r->next;
      munmap(r->va, r->size);
      free(r->maps);
      free(r);
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static sim_chunk *sim__chunk(sim_device *d, gpumem_phys_handle h) {
  uintptr_t v;
  if (h == 0 || h > UINTPTR_MAX || !sim__map_get(&d->chunks, (uintptr_t)h, &v)) return NULL;
  return (sim_chunk *)v;
}

static int sim_vm_create(gpumem_backend *be, int device, size_t size, gpumem_phys_handle *h) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_MALLOC);
  if (rc == 0 && (!h || size == 0 || size % SIM_VM_GRANULARITY)) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d && g_sh) sim__sh_lock();
  if (d) {
    sim_chunk *c;
    if ((uint64_t)size > sim__avail(d)) {
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else if (!(c = calloc(1, sizeof *c))) {
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else if (sim__map_put(&d->chunks, (uintptr_t)g.next_handle, (uintptr_t)c) != 0) {
      free(c);
      rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    } else {
      c->size = size;
      d->used += size;
      sim__sh_publish(d);
      *h = g.next_handle++;
    }
  }
  if (d && g_sh) sim__sh_unlock();
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* Drop a chunk that is destroyed and no longer mapped. */
static void sim__chunk_maybe_drop(sim_device *d, gpumem_phys_handle h, sim_chunk *c) {
  if (c->destroyed && c->nmapped == 0) {
    d->used -= c->size;
    sim__sh_publish(d);
    sim__map_del_at(&d->chunks, sim__map_find(&d->chunks, (uintptr_t)h));
    free(c);
  }
}

static int sim_vm_destroy(gpumem_backend *be, int device, gpumem_phys_handle h) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_FREE);
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d) {
    sim_chunk *c = sim__chunk(d, h);
    if (!c || c->destroyed) {
      rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    } else {
      c->destroyed = 1;
      sim__chunk_maybe_drop(d, h, c);
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* The first of r's mappings (sorted by address) that starts at or above p. Lock held. */
static size_t sim__map_at(const sim_resv *r, const char *p) {
  size_t lo = 0, hi = r->nmaps;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->maps[mid].va < p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int sim_vm_map(gpumem_backend *be, int device, void *va, size_t size, gpumem_phys_handle h) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_MAP);
  if (rc == 0 && (!va || size == 0 || !sim__aligned(va, size))) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d) {
    char *p = va;
    sim_resv *r = sim__resv_containing(d, p, size);
    sim_chunk *c = sim__chunk(d, h);
    if (!r || !c || c->destroyed || size > c->size) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    size_t at = rc == 0 ? sim__map_at(r, p) : 0;
    if (rc == 0 && ((at > 0 && r->maps[at - 1].va + r->maps[at - 1].size > p) ||
                    (at < r->nmaps && r->maps[at].va < p + size)))
      rc = GPUMEM_SIM_ERR_INVALID_VALUE; /* overlap */
    if (rc == 0 && r->nmaps == r->capmaps) {
      size_t ncap = r->capmaps ? r->capmaps * 2 : 8;
      sim_mapping *nm = realloc(r->maps, ncap * sizeof *nm);
      if (!nm) rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
      else {
        r->maps = nm;
        r->capmaps = ncap;
      }
    }
    if (rc == 0 && mprotect(p, size, PROT_READ | PROT_WRITE) != 0) rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    if (rc == 0) {
      memmove(&r->maps[at + 1], &r->maps[at], (r->nmaps - at) * sizeof *r->maps);
      r->maps[at].va = p;
      r->maps[at].size = size;
      r->maps[at].handle = h;
      r->nmaps++;
      c->nmapped++;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static int sim_vm_unmap(gpumem_backend *be, int device, void *va, size_t size) {
  (void)be;
  int rc;
  pthread_mutex_lock(&g_lock);
  rc = sim__enter(GPUMEM_SIM_CALL_MAP);
  if (rc == 0 && (!va || size == 0 || !sim__aligned(va, size))) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  sim_device *d = rc == 0 ? sim__device(device, &rc) : NULL;
  if (d && (rc = sim__unsafe(SIM_RELAXED)) != 0) d = NULL;
  if (d) {
    char *p = va;
    sim_resv *r = sim__resv_containing(d, p, size);
    size_t covered = 0, at = 0, end = 0;
    if (!r) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    /* the range must consist of whole mappings, without gaps: [at, end) of the sorted maps */
    if (rc == 0) {
      at = end = sim__map_at(r, p); /* (one that starts below p and reaches into the range leaves it short) */
      for (; rc == 0 && end < r->nmaps && r->maps[end].va < p + size; end++) {
        const sim_mapping *m = &r->maps[end];
        if (m->va + m->size <= p + size) covered += m->size;
        else rc = GPUMEM_SIM_ERR_INVALID_VALUE; /* partial */
      }
    }
    if (rc == 0 && covered != size) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
    if (rc == 0) {
      madvise(p, size, MADV_DONTNEED);
      if (mprotect(p, size, PROT_NONE) != 0) {
        /* cannot fail on a range we mapped ourselves short of running out of
         * kernel mappings; replace the range to be sure it is inaccessible */
        mmap(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      }
      for (size_t i = at; i < end; i++) {
        sim_mapping m = r->maps[i];
        sim_chunk *c = sim__chunk(d, m.handle);
        if (c) {
          c->nmapped--;
          sim__chunk_maybe_drop(d, m.handle, c);
        }
      }
      memmove(&r->maps[at], &r->maps[end], (r->nmaps - end) * sizeof *r->maps);
      r->nmaps -= end - at;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Vtable: stream capture                                                    */

/* A query: legal during any capture, invalidates nothing. Lock held. */
static int sim__capture_query(int device, gpumem_stream stream, int *status, uint64_t *id, uint64_t *nodes) {
  int rc = 0;
  sim_device *d = sim__device(device, &rc);
  if (!d) return rc;
  *status = GPUMEM_CAPTURE_NONE;
  *id = 0;
  if (nodes) *nodes = 0;
  if (!stream) {
    if (sim__device_capturing(d)) *status = GPUMEM_CAPTURE_ACTIVE; /* the legacy stream is blocked by it */
    return 0;
  }
  sim_stream *s = sim__stream(d, stream, 0);
  if (s && s->cap_status != GPUMEM_CAPTURE_NONE) {
    *status = s->cap_status;
    *id = s->cap_id;
    if (nodes) *nodes = s->cap_nodes;
  }
  return 0;
}

static int sim_stream_capture(gpumem_backend *be, int device, gpumem_stream stream, int *status, uint64_t *capture_id) {
  (void)be;
  if (!status || !capture_id) return GPUMEM_SIM_ERR_INVALID_VALUE;
  /* no capture anywhere: the answer without the lock (the core asks at every allocation on a stream
   * other than NULL; a driver's query of a stream's capture state takes no global lock either) */
  if (__atomic_load_n(&g.ncaptures, __ATOMIC_ACQUIRE) == 0 && __atomic_load_n(&g.ndead, __ATOMIC_ACQUIRE) == 0 &&
      device >= 0 && device < __atomic_load_n(&g.ndev, __ATOMIC_ACQUIRE)) {
    *status = GPUMEM_CAPTURE_NONE;
    *capture_id = 0;
    return 0;
  }
  pthread_mutex_lock(&g_lock);
  int rc = 0;
  sim_device *d = sim__device(device, &rc);
  if (d != NULL) rc = sim__dead_use(d, stream);
  if (rc == 0) rc = sim__capture_query(device, stream, status, capture_id, NULL);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The vtable                                                                */

const gpumem_backend gpumem__sim_backend = {
  .version = GPUMEM_BACKEND_VERSION,
  .struct_size = (uint32_t)sizeof(gpumem_backend),
  .name = "sim",
  .user_data = NULL,
  .init = sim_init,
  .shutdown = sim_shutdown,
  .device_count = sim_device_count,
  .device_info = sim_device_info,
  .mem_get_info = sim_mem_get_info,
  .malloc = sim_malloc,
  .free = sim_free,
  .event_create = sim_event_create,
  .event_destroy = sim_event_destroy,
  .event_record = sim_event_record,
  .event_query = sim_event_query,
  .event_synchronize = sim_event_synchronize,
  .stream_synchronize = sim_stream_synchronize,
  .device_synchronize = sim_device_synchronize,
  .device_reset = sim_device_reset,
  .error_status = sim_error_status,
  .error_string = sim_error_string,
  .vm_granularity = sim_vm_granularity,
  .vm_reserve = sim_vm_reserve,
  .vm_release = sim_vm_release,
  .vm_create = sim_vm_create,
  .vm_destroy = sim_vm_destroy,
  .vm_map = sim_vm_map,
  .vm_unmap = sim_vm_unmap,
#ifdef SIM_HAVE_VALGRIND
  .annotate_alloc = sim_annotate_alloc,
  .annotate_free = sim_annotate_free,
#endif
  .stream_capture = sim_stream_capture,
  .stream_wait_event = sim_stream_wait_event,
};

/* ------------------------------------------------------------------------ */
/* gpumem/sim.h                                                              */

GPUMEM_API gpumem_status gpumem_sim_fail_nth(gpumem_sim_call kind, uint64_t nth, int error, int repeat) {
  if ((int)kind < 0 || (int)kind >= GPUMEM_SIM_CALL_KINDS_ || nth < 1 || error == 0) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  g_ctl.countdown[kind] = nth;
  g_ctl.error[kind] = error;
  g_ctl.repeat[kind] = repeat != 0;
  g_ctl.sticky[kind] = 0;
  g_ctl.every[kind] = 0;
  pthread_mutex_unlock(&g_lock);
  return GPUMEM_OK;
}

GPUMEM_API gpumem_status gpumem_sim_fail_every(gpumem_sim_call kind, uint64_t nth, uint64_t every, int error) {
  if ((int)kind < 0 || (int)kind >= GPUMEM_SIM_CALL_KINDS_ || nth < 1 || every < 1 || error == 0)
    return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  g_ctl.countdown[kind] = nth;
  g_ctl.error[kind] = error;
  g_ctl.repeat[kind] = 0;
  g_ctl.sticky[kind] = 0;
  g_ctl.every[kind] = every;
  pthread_mutex_unlock(&g_lock);
  return GPUMEM_OK;
}

GPUMEM_API void gpumem_sim_fail_clear(void) {
  pthread_mutex_lock(&g_lock);
  for (int k = 0; k < GPUMEM_SIM_CALL_KINDS_; k++) {
    g_ctl.countdown[k] = 0;
    g_ctl.error[k] = 0;
    g_ctl.repeat[k] = 0;
    g_ctl.sticky[k] = 0;
    g_ctl.every[k] = 0;
  }
  pthread_mutex_unlock(&g_lock);
}

GPUMEM_API uint64_t gpumem_sim_call_count(gpumem_sim_call kind) {
  uint64_t n = 0;
  if ((int)kind < 0 || (int)kind >= GPUMEM_SIM_CALL_KINDS_) return 0;
  pthread_mutex_lock(&g_lock);
  n = g_ctl.calls[kind];
  pthread_mutex_unlock(&g_lock);
  return n;
}

static void sim__complete_all_locked(void) {
  for (int i = 0; i < g.ndev; i++) sim__device_complete(&g.dev[i]);
}

GPUMEM_API void gpumem_sim_set_delayed(int on) {
  pthread_mutex_lock(&g_lock);
  g_ctl.delayed = on != 0;
  if (!on) {
    sim__complete_all_locked(); /* immediate mode has no pending work */
    g_ctl.clocked = 0;
  }
  pthread_mutex_unlock(&g_lock);
}

GPUMEM_API void gpumem_sim_set_clock(uint64_t now) {
  pthread_mutex_lock(&g_lock);
  g_ctl.clocked = 1;
  g_ctl.clock = now;
  pthread_mutex_unlock(&g_lock);
}

GPUMEM_API void gpumem_sim_complete_before(uint64_t t) {
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g.ndev; i++) {
    sim_device *d = &g.dev[i];
    sim__complete_before(&d->default_stream, t);
    for (size_t j = 0; j < d->streams.cap; j++)
      if (d->streams.keys[j]) sim__complete_before((sim_stream *)d->streams.vals[j], t);
  }
  pthread_mutex_unlock(&g_lock);
}

GPUMEM_API void gpumem_sim_stream_complete(int device, gpumem_stream stream) {
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g.ndev; i++) {
    if (device != -1 && device != i) continue;
    sim_stream *s = sim__stream(&g.dev[i], stream, 0);
    if (s) {
      s->completed = s->submitted;
      sim__pull(s);
    }
  }
  pthread_mutex_unlock(&g_lock);
}

static gpumem_status sim__status_of(int rc);

GPUMEM_API gpumem_status gpumem_sim_stream_submit(int device, gpumem_stream stream, uint64_t *ticket) {
  int rc = 0;
  if (ticket == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  sim_stream *s = d != NULL ? sim__stream(d, stream, 1) : NULL;
  if (d != NULL && s == NULL) rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
  if (s != NULL && (s->dead || s->cap_status != GPUMEM_CAPTURE_NONE)) rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  if (rc == 0) {
    s->submitted++;
    if (g_ctl.delayed) {
      sim__stamp(s);
    } else {
      s->completed = s->submitted;
      sim__pull(s);
    }
    *ticket = s->submitted;
  }
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

GPUMEM_API gpumem_status gpumem_sim_stream_wait(int device, gpumem_stream stream, gpumem_stream on) {
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  sim_stream *s = d != NULL ? sim__stream(d, stream, 1) : NULL;
  sim_stream *o = d != NULL ? sim__stream(d, on, 1) : NULL;
  if (d != NULL && (s == NULL || o == NULL)) rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
  if (rc == 0 && (s->dead || o->dead || s->cap_status != GPUMEM_CAPTURE_NONE || o->cap_status != GPUMEM_CAPTURE_NONE))
    rc = GPUMEM_SIM_ERR_INVALID_VALUE;
  if (rc == 0 && s != o && o->completed < o->submitted) /* as sim_stream_wait_event on an event recorded on `on` now */
    rc = sim__wait_on(s, o, o->submitted);
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

/* How far each stream's work is known to run before s's later work: reach[s] is everything of s;
 * a wait of a stream x made at or before reach[x] carries it to the stream waited for, up to the
 * position waited for (sim__pull's chains), to a fixed point. Returns o's reach (0 if none). Lock held. */
static uint64_t sim__reach(sim_device *d, sim_stream *s, const sim_stream *o) {
  size_t n = 1;
  for (size_t j = 0; j < d->streams.cap; j++) n += d->streams.keys[j] != 0;
  sim_stream **st = calloc(n, sizeof *st);
  uint64_t *reach = calloc(n, sizeof *reach);
  uint64_t r = 0;
  if (st != NULL && reach != NULL) {
    size_t k = 0;
    st[k++] = &d->default_stream;
    for (size_t j = 0; j < d->streams.cap && k < n; j++)
      if (d->streams.keys[j]) st[k++] = (sim_stream *)d->streams.vals[j];
    for (size_t i = 0; i < n; i++)
      if (st[i] == s) reach[i] = UINT64_MAX;
    for (int changed = 1; changed;) {
      changed = 0;
      for (size_t i = 0; i < n; i++)
        for (int q = 0; reach[i] != 0 && q < st[i]->ndep; q++) {
          const sim_dep *dp = &st[i]->dep[q];
          if (dp->at > reach[i]) continue;
          for (size_t m = 0; m < n; m++)
            if (st[m] == dp->on && reach[m] < dp->target) {
              reach[m] = dp->target;
              changed = 1;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
      if (st[i] == o) r = reach[i];
  }
  free(st);
  free(reach);
  return r;
}

GPUMEM_API gpumem_status gpumem_sim_stream_ordered(int device, gpumem_stream stream, gpumem_stream on, uint64_t ticket,
                                                   int *ordered) {
  int rc = 0;
  if (ordered == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d != NULL) {
    sim_stream *s = sim__stream(d, stream, 0);
    const sim_stream *o = sim__stream(d, on, 0);
    if (o == NULL) *ordered = ticket == 0;
    else if (s == NULL) *ordered = o->completed >= ticket;
    else *ordered = o->completed >= ticket || sim__reach(d, s, o) >= ticket;
  }
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

GPUMEM_API gpumem_status gpumem_sim_stream_done(int device, gpumem_stream stream, uint64_t ticket, int *done) {
  int rc = 0;
  if (done == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d != NULL) {
    const sim_stream *s = sim__stream(d, stream, 0);
    *done = s == NULL ? ticket == 0 : s->completed >= ticket;
  }
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

GPUMEM_API void gpumem_sim_complete_all(void) {
  pthread_mutex_lock(&g_lock);
  sim__complete_all_locked();
  pthread_mutex_unlock(&g_lock);
}

static gpumem_status sim__status_of(int rc) { return sim_error_status(&gpumem__sim_backend, rc); }

GPUMEM_API gpumem_status gpumem_sim_used_bytes(int device, uint64_t *used) {
  int rc = 0;
  if (!used) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d) *used = d->used;
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

GPUMEM_API gpumem_status gpumem_sim_set_external_usage(int device, uint64_t bytes) {
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d) {
    if (d->used > d->capacity || bytes > d->capacity - d->used) rc = GPUMEM_SIM_ERR_OUT_OF_MEMORY;
    else d->external = bytes;
  }
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

GPUMEM_API gpumem_status gpumem_sim_reinit(void) {
  int rc;
  pthread_mutex_lock(&g_lock);
  if (g.refs > 0) {
    pthread_mutex_unlock(&g_lock);
    return GPUMEM_ERR_BUSY;
  }
  sim_config cfg;
  rc = sim__read_env(&cfg);
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

/* gpumem_sim_stream_destroy (dead 1) and gpumem_sim_stream_create (dead 0). */
static gpumem_status sim__stream_set_dead(int device, gpumem_stream stream, int dead) {
  int rc = 0;
  gpumem_status st = GPUMEM_OK;
  if (!stream) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  sim_stream *s = d ? sim__stream(d, stream, dead) : NULL; /* (a stream never used needs no record to live) */
  if (!d) {
    st = sim__status_of(rc);
  } else if (dead) {
    if (!s) st = GPUMEM_ERR_OUT_OF_MEMORY;
    else if (s->dead) st = GPUMEM_ERR_INVALID_ARGUMENT;
    else if (s->cap_status != GPUMEM_CAPTURE_NONE) st = GPUMEM_ERR_BUSY;
    else {
      s->dead = 1;
      __atomic_fetch_add(&g.ndead, 1, __ATOMIC_RELEASE);
    }
  } else if (s && s->dead) {
    s->dead = 0;
    s->completed = s->submitted; /* the old stream's work is done (a new stream has none queued) */
    sim__pull(s);
    __atomic_fetch_sub(&g.ndead, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

GPUMEM_API gpumem_status gpumem_sim_stream_destroy(int device, gpumem_stream stream) {
  return sim__stream_set_dead(device, stream, 1);
}

GPUMEM_API gpumem_status gpumem_sim_stream_create(int device, gpumem_stream stream) {
  return sim__stream_set_dead(device, stream, 0);
}

GPUMEM_API uint64_t gpumem_sim_dead_stream_uses(void) {
  pthread_mutex_lock(&g_lock);
  uint64_t n = g_ctl.dead_uses;
  pthread_mutex_unlock(&g_lock);
  return n;
}

static int sim__mode_ok(int mode) {
  return mode == GPUMEM_SIM_CAPTURE_GLOBAL || mode == GPUMEM_SIM_CAPTURE_THREAD_LOCAL ||
         mode == GPUMEM_SIM_CAPTURE_RELAXED;
}

GPUMEM_API gpumem_status gpumem_sim_stream_begin_capture(int device, gpumem_stream stream, int mode) {
  int rc = 0;
  gpumem_status st = GPUMEM_OK;
  if (!stream || !sim__mode_ok(mode)) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d) {
    sim_stream *s = sim__stream(d, stream, 1);
    if (!s) {
      st = GPUMEM_ERR_OUT_OF_MEMORY;
    } else if (s->cap_status != GPUMEM_CAPTURE_NONE) {
      st = GPUMEM_ERR_BUSY;
    } else {
      s->cap_status = GPUMEM_CAPTURE_ACTIVE;
      s->cap_mode = mode;
      s->cap_id = ++g_ctl.next_capture_id;
      s->cap_nodes = 0;
      s->cap_thread = sim__self();
      __atomic_fetch_add(&g.ncaptures, 1, __ATOMIC_RELEASE);
    }
  } else {
    st = sim__status_of(rc);
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

GPUMEM_API gpumem_status gpumem_sim_stream_end_capture(int device, gpumem_stream stream, int *invalidated) {
  int rc = 0;
  gpumem_status st = GPUMEM_OK;
  if (!stream) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  sim_device *d = sim__device(device, &rc);
  if (d) {
    sim_stream *s = sim__stream(d, stream, 0);
    if (!s || s->cap_status == GPUMEM_CAPTURE_NONE) {
      st = GPUMEM_ERR_INVALID_ARGUMENT; /* not capturing */
    } else if (s->cap_mode != GPUMEM_SIM_CAPTURE_RELAXED && s->cap_thread != sim__self()) {
      st = GPUMEM_ERR_INVALID_ARGUMENT; /* a non-relaxed capture ends on the thread that began it */
    } else {
      if (invalidated) *invalidated = s->cap_status == GPUMEM_CAPTURE_INVALIDATED;
      s->cap_status = GPUMEM_CAPTURE_NONE;
      s->cap_id = 0;
      s->cap_thread = 0;
      __atomic_fetch_sub(&g.ncaptures, 1, __ATOMIC_RELEASE);
    }
  } else {
    st = sim__status_of(rc);
  }
  pthread_mutex_unlock(&g_lock);
  return st;
}

GPUMEM_API gpumem_status gpumem_sim_stream_capture_status(int device, gpumem_stream stream, int *status,
                                                          uint64_t *capture_id, uint64_t *nodes) {
  if (!status || !capture_id) return GPUMEM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&g_lock);
  int rc = sim__capture_query(device, stream, status, capture_id, nodes);
  pthread_mutex_unlock(&g_lock);
  return sim__status_of(rc);
}

GPUMEM_API gpumem_status gpumem_sim_thread_exchange_capture_mode(int *mode) {
  if (!mode || !sim__mode_ok(*mode)) return GPUMEM_ERR_INVALID_ARGUMENT;
  int prev = sim_tls_mode;
  sim_tls_mode = *mode;
  *mode = prev;
  return GPUMEM_OK;
}

GPUMEM_API void gpumem_sim_set_capture_relax(int on) {
  pthread_mutex_lock(&g_lock);
  g_ctl.no_relax = on == 0;
  pthread_mutex_unlock(&g_lock);
}
