/* share.c: shared GPUs: the ledger of a GPU's shared group, the members' answers, and the
 * watcher that notices memory pressure while a process makes no calls.
 *
 * Ledger. One shared-memory object per physical GPU (its UUID) and group, of one user:
 * /dev/shm/gpumem-UID-GROUP-UUID, mode 0600. A file of another owner, or one others may
 * write, is never used. It holds LED_SLOTS entries; each device pool of each context (with
 * sharing on, on a device not private to the process) owns one while it lives: its pid and
 * start time, the figures it publishes (reserved, cached, live, its counters, a heartbeat), and
 * two futex words: `ask` (requesters add 1) and `answer` (the value of `ask` it last handled).
 * Everything read from the ledger is checked before it is used (a pid is a pid, a slot is in
 * range, a string is cut and made printable), since any process of the user may write anything
 * there: bad contents make a member skip an entry or the whole ledger, never crash.
 *
 * Members. A member's thread (the watcher) sleeps on its `ask` word with FUTEX_WAIT, with the
 * watch interval as the timeout (none when watch_interval_ms is 0): no polling, no CPU while
 * idle. It runs while its pool holds cached memory (started by the pool when it grows or is
 * found holding cached memory, ending at a tick that finds none), and while it runs the
 * entry is `listening`. Asked, it flushes the thread caches of its pool, gives back up to the
 * bytes asked of the cached memory (wholly free segments and idle chunks: never a live block;
 * graph pools are not members), publishes, sets `answer` and wakes the requesters. On a
 * timeout it runs the free-fraction check (trim.c), so an idle process gives memory back when
 * a neighbour fills the device, and publishes its figures.
 *
 * Requests. An allocation that failed after the pool's own trim asks every listening member
 * of its group on the GPU for the bytes the device lacks, waits until each has answered, died or
 * stopped listening, and retries if memory came back. Another process may take that memory
 * first, and a member may answer with nothing while it still holds cached memory (its own
 * allocations took what was free, its frees were still pending, or the memory lies in a chunk
 * beside a live block): then the allocation asks again, after a pause that doubles from 1 ms
 * (at most LED_SLICE_MS). All rounds of one allocation together last at most share_wait_ms; a
 * round after which no member holds cached memory ends it at once. A member whose pool is
 * being destroyed is waited for until its entry goes (its memory is on its way back).
 *
 * Dead members. An entry whose process is gone (kill(pid, 0) fails with ESRCH, or the pid now
 * names a process started at another time) is cleared by whoever meets it: nothing waits on
 * it. A requester waits on a member in slices of LED_SLICE_MS so that a member dying while
 * asked ends the wait too.
 *
 * Fork. The thread does not exist in a child; the child's inherited contexts are never used
 * there (fork.c), so their entries stay the parent's. The thread blocks every signal. It is
 * joined by gpumem_destroy; at process exit it is simply gone (exit does not wait for it). */
#include "pool.h"
#include "share.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LED_MAGIC 0x4c4d5047u /* "GPML" */
#define LED_VERSION 1u
#define LED_SLOTS 64
#define LED_SLICE_MS 20u
#define LED_PID_MAX 4194304 /* the kernel's largest pid_max */

typedef struct led_slot {
  _Atomic uint64_t owner;     /* 0: free; pid << 1 | 1: being set up; pid << 1: a member */
  _Atomic uint64_t start;     /* the owner's start time (/proc/PID/stat field 22) */
  _Atomic uint32_t ask;       /* futex: requests made of this member */
  _Atomic uint32_t answer;    /* futex: the value of ask it last answered */
  _Atomic uint32_t listening; /* 1 while its thread answers; 2 while its pool is being destroyed (all its
                               * memory is on its way back: a requester waits for the entry to go) */
  _Atomic uint32_t pad_;
  _Atomic uint64_t ask_bytes; /* the largest request not yet answered */
  _Atomic uint64_t reserved, cached, live;
  _Atomic uint64_t heartbeat_ms; /* CLOCK_MONOTONIC, at its last publication */
  _Atomic uint64_t n_asks, n_asked, given;
  char comm[32];
} led_slot;

typedef struct gpumem__pshare gpumem__pshare;

typedef struct led {
  _Atomic uint32_t magic; /* set last by the creator */
  uint32_t version;
  uint32_t size;
  uint32_t nslots;
  char uuid[64];
  char group[64];
  led_slot slots[LED_SLOTS];
} led;

struct gpumem__pshare {
  gpumem__pool *p;
  led *L;                 /* NULL: no sharing (off, private device, or no usable ledger): watcher only */
  int slot;
  char group[64];
  _Atomic uint32_t wake;  /* futex of the watcher without a ledger */
  atomic_int stop;
  pthread_t thr;
  int thr_made;           /* a thread was created and not joined (under the pool lock, or ps->jlock) */
  gpumem__mutex jlock;    /* serialises starting and joining the thread */
};

/* ---------------------------------------------------------------------- */
/* Helpers                                                                 */

/* Answer counters wrap: `a` has reached `seq` when it is at most 2^31 past it (fuzz/ubsan-ignore.txt). */
static inline int seq_reached(uint32_t a, uint32_t seq) { return (int32_t)(a - seq) >= 0; }

static uint64_t now_ms(void) { return gpumem__mono_ns() / 1000000u; }

static long futex(_Atomic uint32_t *w, int op, uint32_t val, uint32_t timeout_ms) {
  struct timespec ts, *tp = NULL;
  if (timeout_ms != UINT32_MAX) {
    ts.tv_sec = timeout_ms / 1000u;
    ts.tv_nsec = (long)(timeout_ms % 1000u) * 1000000L;
    tp = &ts;
  }
  return syscall(SYS_futex, (uint32_t *)w, op, val, tp, NULL, 0);
}
static void futex_wait(_Atomic uint32_t *w, uint32_t seen, uint32_t timeout_ms) {
  (void)futex(w, FUTEX_WAIT, seen, timeout_ms);
}
static void futex_wake(_Atomic uint32_t *w) { (void)futex(w, FUTEX_WAKE, INT_MAX, UINT32_MAX); }

/* Start time of a process (field 22 of /proc/PID/stat), 0 if unknown. */
static uint64_t proc_start(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *q = strrchr(buf, ')');
  if (q == NULL) return 0;
  q++;
  for (int field = 3; field < 22 && q != NULL; field++) q = strchr(q + 1, ' ');
  return q != NULL ? strtoull(q + 1, NULL, 10) : 0;
}

static void proc_comm(long pid, char out[32]) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/comm", pid);
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  if (fgets(out, 32, f) == NULL) out[0] = '\0';
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

/* A member whose process is gone (or whose pid names a process started at another time). */
static int pid_dead(int32_t pid, uint64_t start) {
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
  uint64_t now = proc_start(pid);
  return now != 0 && start != 0 && now != start;
}

/* The pid of a live member in slot i, or 0; a dead member's entry is cleared. */
static int32_t slot_live(led *L, int i) {
  led_slot *s = &L->slots[i];
  uint64_t owner = atomic_load_explicit(&s->owner, memory_order_acquire);
  if (owner == 0) return 0;
  uint64_t pid = owner >> 1;
  if (pid == 0 || pid > LED_PID_MAX) {
    /* nonsense: nobody can own it */
    (void)atomic_compare_exchange_strong(&s->owner, &owner, 0);
    return 0;
  }
  if ((owner & 1u) != 0) {
    /* being set up: cleared only if its process died meanwhile */
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) (void)atomic_compare_exchange_strong(&s->owner, &owner, 0);
    return 0;
  }
  if ((pid_t)pid != getpid() && pid_dead((int32_t)pid, atomic_load_explicit(&s->start, memory_order_relaxed))) {
    atomic_store_explicit(&s->listening, 0, memory_order_relaxed);
    (void)atomic_compare_exchange_strong(&s->owner, &owner, 0);
    return 0;
  }
  return (int32_t)pid;
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

/* ---------------------------------------------------------------------- */
/* Opening a ledger                                                        */

static void led_name(char *buf, size_t cap, const char *group, const char *uuid) {
  snprintf(buf, cap, "/gpumem-%lu-%s-%s", (unsigned long)geteuid(), group, uuid);
}

/* A UUID fit for a file name: GPU-, then hex digits and dashes. */
static int uuid_ok(const char *u) {
  if (strncmp(u, "GPU-", 4) != 0 || strlen(u) > 60) return 0;
  for (const char *c = u + 4; *c != '\0'; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || (*c >= 'A' && *c <= 'F') || *c == '-')) return 0;
  return u[4] != '\0';
}

/* Map the ledger `name` (creating it when `create` and new). NULL with a WARN when it cannot be used. */
static led *led_open(const gpumem__logger *lg, const char *name, int create, const char *group, const char *uuid) {
  int created = 0;
  int fd = create ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600) : -1;
  if (fd >= 0) {
    created = 1;
    if (ftruncate(fd, (off_t)sizeof(led)) != 0) {
      gpumem__log(lg, GPUMEM_LOG_WARN, "shared GPUs: cannot size the ledger /dev/shm%s: %s; sharing is off", name,
                  strerror(errno));
      close(fd);
      shm_unlink(name);
      return NULL;
    }
  } else if (!create || errno == EEXIST) {
    fd = shm_open(name, O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0) {
      if (create) gpumem__log(lg, GPUMEM_LOG_WARN, "shared GPUs: cannot open the ledger /dev/shm%s: %s; sharing is off",
                              name, strerror(errno));
      return NULL;
    }
  } else {
    gpumem__log(lg, GPUMEM_LOG_WARN, "shared GPUs: cannot create the ledger /dev/shm%s: %s; sharing is off", name,
                strerror(errno));
    return NULL;
  }
  /* only the user's own ledger, writable by nobody else, of exactly our size: a ledger of another
   * user could be read or written by that user, and a shorter file would fault on access */
  for (int tries = 0; !created; tries++) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0 || !S_ISREG(st.st_mode)) {
      gpumem__log(lg, GPUMEM_LOG_WARN,
                  "shared GPUs: the ledger /dev/shm%s belongs to another user or others may write it; ignored", name);
      close(fd);
      return NULL;
    }
    if (st.st_size == (off_t)sizeof(led)) break;
    if (st.st_size != 0 || tries >= 100) { /* 0 for 100 ms: its creator died before sizing it */
      gpumem__log(lg, GPUMEM_LOG_WARN, "shared GPUs: the ledger /dev/shm%s has a foreign size (%lld bytes); ignored",
                  name, (long long)st.st_size);
      close(fd);
      return NULL;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  led *L = mmap(NULL, sizeof(led), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (L == MAP_FAILED) {
    gpumem__log(lg, GPUMEM_LOG_WARN, "shared GPUs: cannot map the ledger /dev/shm%s: %s", name, strerror(errno));
    return NULL;
  }
  if (created) {
    L->version = LED_VERSION;
    L->size = (uint32_t)sizeof(led);
    L->nslots = LED_SLOTS;
    snprintf(L->uuid, sizeof L->uuid, "%s", uuid);
    snprintf(L->group, sizeof L->group, "%s", group);
    atomic_store_explicit(&L->magic, LED_MAGIC, memory_order_release);
    return L;
  }
  for (int tries = 0; atomic_load_explicit(&L->magic, memory_order_acquire) != LED_MAGIC && tries < 100; tries++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (atomic_load_explicit(&L->magic, memory_order_acquire) != LED_MAGIC || L->version != LED_VERSION ||
      L->size != (uint32_t)sizeof(led) || L->nslots != LED_SLOTS) {
    gpumem__log(lg, GPUMEM_LOG_WARN, "shared GPUs: the ledger /dev/shm%s is not one this library reads; ignored", name);
    munmap(L, sizeof(led));
    return NULL;
  }
  return L;
}

/* ---------------------------------------------------------------------- */
/* A member                                                                */

/* Publish the pool's figures. Pool lock held. */
static void publish(gpumem__pshare *ps) {
  if (ps->L == NULL) return;
  gpumem__pool *p = ps->p;
  led_slot *s = &ps->L->slots[ps->slot];
  atomic_store_explicit(&s->reserved, p->st.reserved_bytes, memory_order_relaxed);
  atomic_store_explicit(&s->cached, cached_bytes(p), memory_order_relaxed);
  atomic_store_explicit(&s->live, p->st.allocated_bytes, memory_order_relaxed);
  atomic_store_explicit(&s->n_asks, p->st.num_share_asks, memory_order_relaxed);
  atomic_store_explicit(&s->n_asked, p->st.num_share_asked, memory_order_relaxed);
  atomic_store_explicit(&s->given, p->st.share_given_bytes, memory_order_relaxed);
  atomic_store_explicit(&s->heartbeat_ms, now_ms(), memory_order_relaxed);
}

void gpumem__share_figures(gpumem__pool *p, gpumem__pshare *ps) {
  if (ps->L == NULL) return;
  led_slot *s = &ps->L->slots[ps->slot];
  atomic_store_explicit(&s->reserved, p->st.reserved_bytes, memory_order_relaxed);
  atomic_store_explicit(&s->cached, cached_bytes(p), memory_order_relaxed);
  atomic_store_explicit(&s->live, p->st.allocated_bytes, memory_order_relaxed);
}

/* Asked: give back up to `bytes` of cached memory, then answer `seq`. */
static void answer(gpumem__pshare *ps, uint32_t seq) {
  gpumem__pool *p = ps->p;
  gpumem_context *ctx = p->ctx;
  led_slot *s = &ps->L->slots[ps->slot];
  uint64_t bytes = atomic_exchange_explicit(&s->ask_bytes, 0, memory_order_acq_rel);
  if (bytes == 0) bytes = UINT64_MAX;
  if (ctx->tc_on) (void)gpumem__tc_flush(ctx, p, 0); /* blocks in thread caches are live for the pool */
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, NULL, 0, 1);
  if (p->vm != NULL) gpumem__vm_pressure(p->vm); /* a neighbour is short: keep every idle granule releasable */
  uint64_t cached = cached_bytes(p), rel = 0;
  uint64_t keep = cached > bytes ? cached - bytes : 0;
  if (cached > keep) {
    gpumem__sync_all(p);
    (void)gpumem__release_empty(p, keep, &rel);
  }
  gpumem__count_trim(p, rel, "asked by a member of the shared group");
  p->st.num_share_asked++;
  p->st.share_given_bytes += rel;
  publish(ps);
  gpumem__mutex_unlock(&p->lock);
  LOG(p, GPUMEM_LOG_INFO, "device %d: asked for %llu bytes by the shared group \"%s\": gave back %llu", p->device,
      (unsigned long long)(bytes == UINT64_MAX ? cached : bytes), ps->group, (unsigned long long)rel);
  atomic_store_explicit(&s->answer, seq, memory_order_release);
  futex_wake(&s->answer);
}

/* A tick: the free-fraction check and the figures. Returns 1 when the pool holds no cached memory and no
 * thread cache may (watch_wanted, pool.h) (the
 * thread ends: it detaches itself, or the start or destroy under way joins it). */
static int tick(gpumem__pshare *ps) {
  gpumem__pool *p = ps->p;
  gpumem__mutex_lock(&p->lock);
  guard_ctx(p, NULL, 0, 1); /* as a trim: no stream of its own, it may wait for the device */
  if (gpumem__check_free_fraction(p) && p->ctx->tc_on &&
      atomic_load_explicit(&p->tc_keyed, memory_order_relaxed) > 0) {
    /* low device memory, and thread caches may hold blocks (a large one of an idle thread too): they
     * come back as at an answer (cache locks before the pool lock), and the check runs again */
    gpumem__mutex_unlock(&p->lock);
    (void)gpumem__tc_flush(p->ctx, p, 0);
    gpumem__mutex_lock(&p->lock);
    guard_ctx(p, NULL, 0, 1);
    (void)gpumem__check_free_fraction(p);
  }
  publish(ps);
  /* (a thread cache keyed to the pool may hold free blocks: they count as live for the pool, and an
   * answer flushes them, so the thread stays while one may: watch_wanted, pool.h) */
  int idle = !watch_wanted(p);
  if (idle) {
    p->watching = 0;
    if (ps->L != NULL) atomic_store_explicit(&ps->L->slots[ps->slot].listening, 0, memory_order_release);
  }
  gpumem__mutex_unlock(&p->lock);
  return idle;
}

static void *watcher(void *arg) {
  gpumem__pshare *ps = arg;
  gpumem__pool *p = ps->p;
  /* named for top -H, gdb and /proc/PID/task/TID/comm: "gpumem-watch/DEVICE" (at most 15 characters) */
  char name[16];
  snprintf(name, sizeof name, "gpumem-watch/%d", p->device);
  (void)pthread_setname_np(pthread_self(), name);
  uint32_t interval = p->ctx->opt.watch_interval_ms;
  uint32_t timeout = interval != 0 ? interval : UINT32_MAX;
  _Atomic uint32_t *word = ps->L != NULL ? &ps->L->slots[ps->slot].ask : &ps->wake;
  uint64_t next = now_ms() + interval;
  for (;;) {
    uint32_t seen = atomic_load_explicit(word, memory_order_acquire);
    if (atomic_load_explicit(&ps->stop, memory_order_acquire)) break;
    if (ps->L != NULL && seen != atomic_load_explicit(&ps->L->slots[ps->slot].answer, memory_order_acquire)) {
      answer(ps, seen);
      continue;
    }
    uint64_t t = now_ms();
    if (interval != 0 && t >= next) {
      if (tick(ps)) {
        /* Ending on its own: detach, so that a process that never destroys its context (the
         * process-wide one) leaves no unjoined thread behind. A start or a stop under way holds
         * jlock and joins this thread instead. */
        if (pthread_mutex_trylock(&ps->jlock) == 0) {
          /* A free between the tick and here found no watcher and could not start one (this thread
           * held jlock, or was still running): with cached memory again, it goes on listening. */
          gpumem__mutex_lock(&p->lock);
          int again = !atomic_load_explicit(&ps->stop, memory_order_acquire) && !p->watching && watch_wanted(p) &&
                      ps->thr_made && pthread_equal(ps->thr, pthread_self());
          if (again) {
            p->watching = 1;
            if (ps->L != NULL) atomic_store_explicit(&ps->L->slots[ps->slot].listening, 1, memory_order_release);
            publish(ps);
          }
          gpumem__mutex_unlock(&p->lock);
          if (again) {
            gpumem__mutex_unlock(&ps->jlock);
            next = now_ms() + interval;
            continue;
          }
          if (ps->thr_made && pthread_equal(ps->thr, pthread_self())) {
            (void)pthread_detach(ps->thr);
            ps->thr_made = 0;
          }
          gpumem__mutex_unlock(&ps->jlock);
        }
        return NULL;
      }
      next = t + interval;
      continue;
    }
    futex_wait(word, seen, interval != 0 ? (uint32_t)(next - t) : timeout);
  }
  return NULL; /* (stopped: share_stop said listening 2) */
}

/* Join an ended (or stopping) thread. jlock held. */
static void join_locked(gpumem__pshare *ps) {
  if (!ps->thr_made) return;
  (void)pthread_join(ps->thr, NULL);
  ps->thr_made = 0;
}

void gpumem__share_note_slow(gpumem__pool *p, gpumem__pshare *ps) {
  if (p->watching || (p->ctx->opt.watch_interval_ms == 0 && ps->L == NULL)) return;
  if (p->graph || pthread_mutex_trylock(&ps->jlock) != 0) return; /* a stop or another start is under way */
  if (atomic_load_explicit(&ps->stop, memory_order_acquire)) {
    gpumem__mutex_unlock(&ps->jlock);
    return;
  }
  join_locked(ps); /* a thread that ended at its last tick (it takes no pool lock after saying so) */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread blocks every signal: they go to the application's */
  int rc = pthread_create(&ps->thr, NULL, watcher, ps);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) {
    ps->thr_made = 1;
    p->watching = 1;
    if (ps->L != NULL) atomic_store_explicit(&ps->L->slots[ps->slot].listening, 1, memory_order_release);
    publish(ps);
  } else {
    LOG(p, GPUMEM_LOG_WARN, "device %d: cannot start the watcher thread (%s): pressure is noticed only at calls",
        p->device, strerror(rc));
  }
  gpumem__mutex_unlock(&ps->jlock);
}

void gpumem__share_stop(gpumem__pshare *ps) {
  if (ps == NULL) return;
  if (ps->L != NULL) atomic_store_explicit(&ps->L->slots[ps->slot].listening, 2, memory_order_release);
  gpumem__mutex_lock(&ps->jlock);
  if (ps->thr_made) {
    atomic_store_explicit(&ps->stop, 1, memory_order_release);
    _Atomic uint32_t *word = ps->L != NULL ? &ps->L->slots[ps->slot].ask : &ps->wake;
    /* a change of the word, so that a thread about to sleep does not (a requester reads stop first) */
    atomic_fetch_add_explicit(word, 1, memory_order_acq_rel);
    futex_wake(word);
    join_locked(ps);
    if (ps->L != NULL) {
      /* the bump above is no request: answered */
      led_slot *s = &ps->L->slots[ps->slot];
      atomic_store_explicit(&s->answer, atomic_load(&s->ask), memory_order_release);
      futex_wake(&s->answer);
    }
    atomic_store_explicit(&ps->stop, 0, memory_order_release);
  }
  gpumem__mutex_lock(&ps->p->lock);
  ps->p->watching = 0;
  gpumem__mutex_unlock(&ps->p->lock);
  gpumem__mutex_unlock(&ps->jlock);
}

gpumem__pshare *gpumem__share_join(gpumem__pool *p, const gpumem_backend_device_info *info) {
  gpumem_context *ctx = p->ctx;
  int share = strcmp(ctx->opt.share, "off") != 0 && !info->private_device;
  if (!share && ctx->opt.watch_interval_ms == 0) return NULL;
  gpumem__pshare *ps = gpumem__calloc(1, sizeof *ps);
  if (ps == NULL) return NULL;
  if (gpumem__mutex_init(&ps->jlock) != 0) {
    free(ps);
    return NULL;
  }
  ps->p = p;
  ps->slot = -1;
  snprintf(ps->group, sizeof ps->group, "%s", ctx->opt.share);
  if (share && !uuid_ok(info->uuid)) {
    LOG(p, GPUMEM_LOG_WARN, "device %d: shared GPUs: the backend reports no usable UUID (\"%.64s\"); sharing is off",
        p->device, info->uuid);
    share = 0;
  }
  if (share) {
    char name[192];
    led_name(name, sizeof name, ps->group, info->uuid);
    led *L = led_open(&ctx->opt.log, name, 1, ps->group, info->uuid);
    int32_t self = (int32_t)getpid();
    uint64_t start = proc_start(self);
    for (int i = 0; L != NULL && i < LED_SLOTS && ps->slot < 0; i++) {
      (void)slot_live(L, i); /* clears a dead member's entry */
      uint64_t zero = 0;
      if (!atomic_compare_exchange_strong(&L->slots[i].owner, &zero, ((uint64_t)self << 1) | 1u)) continue;
      led_slot *s = &L->slots[i];
      atomic_store(&s->start, start);
      atomic_store(&s->listening, 0);
      atomic_store(&s->ask_bytes, 0);
      atomic_store(&s->answer, atomic_load(&s->ask));
      atomic_store(&s->reserved, 0);
      atomic_store(&s->cached, 0);
      atomic_store(&s->live, 0);
      atomic_store(&s->n_asks, 0);
      atomic_store(&s->n_asked, 0);
      atomic_store(&s->given, 0);
      atomic_store(&s->heartbeat_ms, now_ms());
      char comm[32];
      proc_comm(self, comm);
      memcpy(s->comm, comm, sizeof comm);
      atomic_store_explicit(&s->owner, (uint64_t)self << 1, memory_order_release);
      ps->slot = i;
    }
    if (L != NULL && ps->slot < 0) {
      LOG(p, GPUMEM_LOG_WARN, "device %d: shared GPUs: group \"%s\" has %d members already; this one works alone",
          p->device, ps->group, LED_SLOTS);
      munmap(L, sizeof(led));
      L = NULL;
    }
    ps->L = L;
    if (L != NULL)
      LOG(p, GPUMEM_LOG_INFO, "device %d: member of the shared group \"%s\" on %s (ledger /dev/shm%s, entry %d)",
          p->device, ps->group, info->uuid, name, ps->slot);
  }
  if (ps->L == NULL && ctx->opt.watch_interval_ms == 0) {
    gpumem__mutex_destroy(&ps->jlock);
    free(ps);
    return NULL;
  }
  return ps;
}

void gpumem__share_leave(gpumem__pshare *ps) {
  if (ps == NULL) return;
  gpumem__share_stop(ps);
  if (ps->L != NULL) {
    led_slot *s = &ps->L->slots[ps->slot];
    atomic_store(&s->listening, 0);
    atomic_store(&s->reserved, 0);
    atomic_store(&s->cached, 0);
    atomic_store(&s->live, 0);
    atomic_store_explicit(&s->owner, 0, memory_order_release);
    futex_wake(&s->answer); /* requesters waiting for its memory */
    munmap(ps->L, sizeof(led));
  }
  gpumem__mutex_destroy(&ps->jlock);
  free(ps);
}

/* ---------------------------------------------------------------------- */
/* Requests                                                                */

typedef struct target {
  int slot;
  int32_t pid;
  uint32_t seq;
  uint64_t given0;   /* its given bytes when asked */
  uint64_t held;     /* its reserved bytes when asked (or when seen leaving): what comes back if it goes */
  int done, leaving;
} target;

/* Ask every listening member of L but `self` (a slot, or -1) for `bytes`, wait until `deadline`.
 * Adds the bytes they report giving to *given and the members that answered to *answered; returns
 * how many were asked. */
static int ask_ledger(led *L, int self, uint64_t bytes, uint64_t deadline, uint64_t *given, size_t *answered) {
  target t[LED_SLOTS];
  int n = 0;
  for (int i = 0; i < LED_SLOTS; i++) {
    if (i == self) continue;
    int32_t pid = slot_live(L, i);
    if (pid == 0) continue;
    led_slot *s = &L->slots[i];
    uint32_t lis = atomic_load_explicit(&s->listening, memory_order_acquire);
    if (lis == 2 && atomic_load(&s->reserved) > 0) { /* destroying: wait for its memory */
      t[n] = (target){i, pid, 0, 0, atomic_load(&s->reserved), 0, 1};
      n++;
      continue;
    }
    if (lis != 1) continue;
    uint64_t cur = atomic_load(&s->ask_bytes);
    while (cur < bytes && !atomic_compare_exchange_weak(&s->ask_bytes, &cur, bytes)) {
    }
    t[n].slot = i;
    t[n].pid = pid;
    t[n].given0 = atomic_load(&s->given);
    t[n].seq = atomic_fetch_add_explicit(&s->ask, 1, memory_order_acq_rel) + 1u;
    t[n].held = atomic_load(&s->reserved);
    t[n].done = 0;
    t[n].leaving = 0;
    futex_wake(&s->ask);
    n++;
  }
  int left = n;
  while (left > 0) {
    for (int k = 0; k < n; k++) {
      if (t[k].done) continue;
      led_slot *s = &L->slots[t[k].slot];
      uint32_t a = atomic_load_explicit(&s->answer, memory_order_acquire);
      if (slot_live(L, t[k].slot) != t[k].pid) {
        /* gone (its pool destroyed, or its process dead): its memory went back with it */
        *given = sat_add(*given, t[k].held);
        if (t[k].leaving) (*answered)++;
        t[k].done = 1;
        left--;
        continue;
      }
      uint32_t lis = atomic_load(&s->listening);
      if (!t[k].leaving && lis == 2 && atomic_load(&s->reserved) > 0) {
        /* its pool is being destroyed (its stop also marks the request answered, with nothing given):
         * its memory comes back when the entry goes */
        t[k].leaving = 1;
        t[k].held = atomic_load(&s->reserved);
        continue;
      }
      if (!t[k].leaving && seq_reached(a, t[k].seq)) {
        uint64_t g = atomic_load(&s->given);
        *given = sat_add(*given, g >= t[k].given0 ? g - t[k].given0 : 0);
        (*answered)++;
        t[k].done = 1;
        left--;
        continue;
      }
      if (!t[k].leaving && lis != 1) {
        t[k].done = 1; /* stopped listening (it holds no cached memory): nothing comes from it */
        left--;
        continue;
      }
      uint64_t now = now_ms();
      if (now >= deadline) return n;
      uint64_t w = deadline - now;
      futex_wait(&s->answer, a, w < LED_SLICE_MS ? (uint32_t)w : LED_SLICE_MS);
      break; /* look at every member again */
    }
  }
  return n;
}

/* Cached bytes the listening members of L but `self` published (after their answers: what they kept). */
static uint64_t others_cached(led *L, int self) {
  uint64_t c = 0;
  for (int i = 0; i < LED_SLOTS; i++) {
    if (i == self || slot_live(L, i) == 0) continue;
    led_slot *s = &L->slots[i];
    uint32_t lis = atomic_load_explicit(&s->listening, memory_order_acquire);
    /* (a member being destroyed gives everything back: its reserved bytes) */
    if (lis == 1 || lis == 2) c = sat_add(c, atomic_load(lis == 1 ? &s->cached : &s->reserved));
  }
  return c;
}

int gpumem__share_ask(gpumem__pool *p, gpumem__pshare *ps, size_t rsize, gpumem__share_round *r) {
  if (ps == NULL || ps->L == NULL || gpumem__capturing(p->ctx)) return 0;
  gpumem_context *ctx = p->ctx;
  uint64_t t0 = now_ms();
  if (r->deadline_ms == 0) r->deadline_ms = t0 + ctx->opt.share_wait_ms;
  if (t0 >= r->deadline_ms) return 0;
  uint64_t fr = 0, tot = 0;
  if (gpumem__be_mem_get_info(ctx, p->device, &fr, &tot) != GPUMEM_OK) fr = 0;
  uint64_t want = ((uint64_t)rsize + GPUMEM__LARGE_ROUND - 1) & ~(uint64_t)(GPUMEM__LARGE_ROUND - 1);
  uint64_t lack = want > fr ? want - fr : want; /* free but fragmented, or taken meanwhile: ask for all of it */
  uint64_t given = 0;
  size_t answered = 0;
  int n = ask_ledger(ps->L, ps->slot, lack, r->deadline_ms, &given, &answered);
  if (n > 0) {
    if (r->rounds++ == 0) { /* (an allocation that asked, however many rounds it took) */
      gpumem__mutex_lock(&p->lock);
      p->st.num_share_asks++;
      publish(ps);
      gpumem__mutex_unlock(&p->lock);
    }
    LOG(p, GPUMEM_LOG_INFO,
        "device %d: asked %d member(s) of the shared group \"%s\" for %llu bytes (round %u): %zu answered in %llu ms, "
        "%llu bytes given back", p->device, n, ps->group, (unsigned long long)lack, r->rounds, answered,
        (unsigned long long)(now_ms() - t0), (unsigned long long)given);
  }
  if (given > 0) {
    r->pause_ms = 0;
    return 1;
  }
  /* Nothing given, but memory may have come back meanwhile (a member's own trim, one that left while
   * this allocation failed): retry when the device now has room; with nobody to ask, once. */
  int room = gpumem__be_mem_get_info(ctx, p->device, &fr, &tot) == GPUMEM_OK && fr >= want;
  if (n == 0) {
    if (!room || r->pause_ms != 0) return 0;
    r->pause_ms = 1;
    return 1;
  }
  /* Members that answered and still hold cached memory: it was in use when they answered (their own
   * allocations took it, or its stream work was pending) or lies in a chunk beside a live block.
   * Processes that free in bursts give it back moments later: ask again after a pause that doubles
   * each time, until the deadline. A group whose members hold no cached memory is refused now. */
  if (!room && others_cached(ps->L, ps->slot) == 0) return 0;
  uint64_t now = now_ms();
  if (now >= r->deadline_ms) return 0;
  if (room && r->pause_ms == 0) { /* the first retry for room comes at once */
    r->pause_ms = 1;
    return 1;
  }
  uint64_t pause = r->pause_ms == 0 ? 1 : r->pause_ms;
  r->pause_ms = pause * 2 > LED_SLICE_MS ? LED_SLICE_MS : (uint32_t)pause * 2;
  uint64_t w = r->deadline_ms - now < pause ? r->deadline_ms - now : pause;
  struct timespec ts = {0, (long)w * 1000000L};
  nanosleep(&ts, NULL);
  return 1;
}

void gpumem__share_describe(gpumem__pshare *ps, char *buf, size_t cap) {
  if (cap == 0) return;
  buf[0] = '\0';
  if (ps == NULL || ps->L == NULL) return;
  uint64_t res = 0, cac = 0, live = 0;
  int n = 0, listening = 0;
  for (int i = 0; i < LED_SLOTS; i++) {
    if (i == ps->slot || slot_live(ps->L, i) == 0) continue;
    led_slot *s = &ps->L->slots[i];
    n++;
    res = sat_add(res, atomic_load(&s->reserved));
    cac = sat_add(cac, atomic_load(&s->cached));
    live = sat_add(live, atomic_load(&s->live));
    listening += atomic_load(&s->listening) == 1;
  }
  snprintf(buf, cap,
           "; the %d other member(s) of the shared group \"%s\" on this GPU hold reserved %llu, cached %llu, live %llu "
           "bytes (%d listening)", n, ps->group, (unsigned long long)res, (unsigned long long)cac,
           (unsigned long long)live, listening);
}

/* ---------------------------------------------------------------------- */
/* Public: members and reclaim, over every group of the user on a GPU      */

/* The UUID of a device that may be shared: GPUMEM_OK, NOT_SUPPORTED (private) or an error. */
static gpumem_status device_uuid(gpumem_context *ctx, int device, char uuid[64]) {
  gpumem_backend_device_info bi;
  memset(&bi, 0, sizeof bi);
  bi.physical_index = -1;
  gpumem_status st = gpumem__be_device_info(ctx, device, &bi);
  if (st != GPUMEM_OK) return st;
  if (bi.private_device || !uuid_ok(bi.uuid)) return GPUMEM_ERR_NOT_SUPPORTED;
  memcpy(uuid, bi.uuid, 64);
  uuid[63] = '\0';
  return GPUMEM_OK;
}

typedef void (*ledger_fn)(led *L, const char *group, void *arg);

/* Calls fn for every ledger of the user on the GPU `uuid` (every group). */
static void each_ledger(gpumem_context *ctx, const char *uuid, ledger_fn fn, void *arg) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "gpumem-%lu-", (unsigned long)geteuid());
  size_t pl = strlen(prefix), ul = strlen(uuid);
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n <= pl + ul + 1 || strncmp(e->d_name, prefix, pl) != 0 || strcmp(e->d_name + n - ul, uuid) != 0 ||
        e->d_name[n - ul - 1] != '-')
      continue;
    char group[64];
    size_t gl = n - ul - 1 - pl;
    if (gl == 0 || gl >= sizeof group) continue;
    memcpy(group, e->d_name + pl, gl);
    group[gl] = '\0';
    if (!gpumem__share_name_ok(group)) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    led *L = led_open(&ctx->opt.log, name, 0, group, uuid);
    if (L == NULL) continue;
    fn(L, group, arg);
    munmap(L, sizeof(led));
  }
  closedir(d);
}

/* Slots of ctx's own pools in L (their pid and a ledger of the same name are not enough: a process may
 * hold several contexts), as a bitmask. */
static uint64_t own_slots(gpumem_context *ctx, const char *group, int device) {
  gpumem__pool *p = atomic_load_explicit(&ctx->pools[device], memory_order_acquire);
  if (p == NULL || p->share == NULL || p->share->L == NULL || strcmp(p->share->group, group) != 0) return 0;
  return (uint64_t)1 << p->share->slot;
}

typedef struct list_arg {
  gpumem_context *ctx;
  int device;
  gpumem_share_member *out;
  size_t max, n, esize;
} list_arg;

static void list_one(led *L, const char *group, void *arg) {
  list_arg *a = arg;
  uint64_t own = own_slots(a->ctx, group, a->device);
  for (int i = 0; i < LED_SLOTS; i++) {
    int32_t pid = slot_live(L, i);
    if (pid == 0) continue;
    if (a->n < a->max) {
      led_slot *s = &L->slots[i];
      gpumem_share_member m;
      memset(&m, 0, sizeof m);
      m.struct_size = (uint32_t)a->esize;
      m.pid = pid;
      for (size_t k = 0; k + 1 < sizeof m.command && k < sizeof s->comm; k++) {
        char c = s->comm[k];
        if (c == '\0') break;
        m.command[k] = (c >= 0x20 && c < 0x7f) ? c : '?';
      }
      snprintf(m.group, sizeof m.group, "%s", group);
      m.reserved_bytes = atomic_load(&s->reserved);
      m.cached_bytes = atomic_load(&s->cached);
      m.live_bytes = atomic_load(&s->live);
      m.asked = atomic_load(&s->n_asks);
      m.was_asked = atomic_load(&s->n_asked);
      m.given_bytes = atomic_load(&s->given);
      m.listening = atomic_load(&s->listening) == 1;
      m.self = (own >> i) & 1u;
      memcpy((char *)a->out + a->n * a->esize, &m, a->esize < sizeof m ? a->esize : sizeof m);
    }
    a->n++;
  }
}

gpumem_status gpumem_share_members(gpumem_context *ctx, int device, gpumem_share_member *out, size_t max,
                                   size_t *count) {
  if (ctx == NULL || count == NULL || (out == NULL && max > 0)) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device < 0 || device >= ctx->ndev) return GPUMEM_ERR_INVALID_DEVICE;
  size_t esize = sizeof(gpumem_share_member);
  if (max > 0 && out[0].struct_size != 0) {
    esize = out[0].struct_size;
    if (esize < offsetof(gpumem_share_member, pid) + sizeof(int) || esize > sizeof(gpumem_share_member))
      return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  char uuid[64];
  gpumem_status st = device_uuid(ctx, device, uuid);
  if (st != GPUMEM_OK) return st;
  list_arg a = {ctx, device, out, max, 0, esize};
  each_ledger(ctx, uuid, list_one, &a);
  *count = a.n;
  return GPUMEM_OK;
}

typedef struct reclaim_arg {
  gpumem_context *ctx;
  int device;
  uint64_t bytes, deadline, given;
  size_t answered;
} reclaim_arg;

static void reclaim_one(led *L, const char *group, void *arg) {
  reclaim_arg *a = arg;
  uint64_t own = own_slots(a->ctx, group, a->device);
  int self = own != 0 ? __builtin_ctzll(own) : -1;
  (void)ask_ledger(L, self, a->bytes, a->deadline, &a->given, &a->answered);
}

gpumem_status gpumem_share_reclaim(gpumem_context *ctx, int device, uint64_t bytes, uint32_t wait_ms, uint64_t *given,
                                   size_t *answered) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (device < 0 || device >= ctx->ndev) return GPUMEM_ERR_INVALID_DEVICE;
  char uuid[64];
  gpumem_status st = device_uuid(ctx, device, uuid);
  if (st != GPUMEM_OK) return st;
  reclaim_arg a = {ctx, device, bytes == 0 ? 1 : bytes, now_ms() + wait_ms, 0, 0};
  each_ledger(ctx, uuid, reclaim_one, &a);
  if (given != NULL) *given = a.given;
  if (answered != NULL) *answered = a.answered;
  return GPUMEM_OK;
}
