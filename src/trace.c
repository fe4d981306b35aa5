/* trace.c: monitoring hooks of the context: allocation traces
 * (gpumem_trace_start/stop, GPUMEM_TRACE) and the backend's annotations for
 * checking tools (annotate_alloc/annotate_free: NVTX, valgrind).
 *
 * The entry points in context.c test one field, ctx->mon, and call in here
 * only when it is non-zero (a trace is recorded, or the backend annotates).
 *
 * Ordering: a free runs under the monitor lock (ctx->trace_lock) together
 * with its annotation and its trace line; an allocation is announced and
 * recorded under the same lock after the pool handed it out. So when another
 * thread gets the same address next, its annotation and its "a" line come
 * after the previous owner's, and the pointer -> ID map below never confuses
 * two owners of one address. A free or reset that fails changes nothing.
 * This serialises frees only while a trace is recorded or a checking tool
 * is attached.
 *
 * Trace format (shared/traces/README.md, plus the optional fields and lines below):
 *   # comments
 *   a ID SIZE STREAM [DEVICE]
 *   f ID [STREAM]    STREAM: the free's, written when it is not the allocation's
 *   n ID STREAM      gpumem_record_stream noted the live block ID on STREAM
 * so that a replay frees on the streams the program named and keeps a block
 * noted on other streams for them as the program's pool did.
 */
#include "internal.h"
#include "hashtab.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- */
/* pointer -> (ID, device) map: linear probing, backward-shift deletion     */

typedef struct trace_slot {
  uintptr_t key; /* 0 = empty */
  uint64_t id;
  uintptr_t stream; /* the allocation's (a free on another stream names its own) */
  int device;
} trace_slot;

/* The trace is written through a buffer of its own and write(2), not a stdio FILE: a process that
 * forks and whose child ends with exit() (having never called the library) would flush the child's
 * copy of a FILE's buffer into the file, writing the same lines twice. The child's copy of this
 * buffer is plain memory that nothing writes out. */
#define TRACE_BUF ((size_t)1 << 16)

struct gpumem__trace {
  int fd;
  size_t used;           /* bytes in buf */
  char *buf;             /* TRACE_BUF bytes */
  char *path;
  uint64_t next_id;      /* IDs in allocation order, from 1 */
  uint64_t nallocs, nfrees;
  trace_slot *slots;
  size_t cap;            /* power of two */
  size_t count;
  int write_error;       /* errno of the first failed write, 0 if none */
  gpumem_context *ctx;
  struct gpumem__trace *prev, *next; /* g_open */
};

/* Open traces, so that what is buffered reaches the file when the process exits without closing
 * them (the process-wide context of the framework entry points is never destroyed). */
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpumem__trace *g_open;
static pthread_once_t g_exit_once = PTHREAD_ONCE_INIT;
static void trace_flush(struct gpumem__trace *t);

/* At exit: flush the traces of this process's contexts. Not an inherited one's (a forked child's
 * copy of its parent's trace: its lines are the parent's, which writes them), and none whose lock is
 * held (a thread inside a call; exit() from a log callback): only try-locks, no waiting. */
static void trace_atexit(void) {
  int got = 0;
  for (int i = 0; i < 1000 && !(got = pthread_mutex_trylock(&g_open_lock) == 0); i++) sched_yield();
  if (!got) return;
  for (struct gpumem__trace *t = g_open; t != NULL; t = t->next) {
    if (GPUMEM__FORKED(t->ctx) || !gpumem__mutex_trylock(&t->ctx->trace_lock)) continue;
    if (t->ctx->trace == t) trace_flush(t);
    gpumem__mutex_unlock(&t->ctx->trace_lock);
  }
  pthread_mutex_unlock(&g_open_lock);
}
static void trace_atexit_register(void) { (void)atexit(trace_atexit); }

static void open_list_add(struct gpumem__trace *t) {
  (void)pthread_once(&g_exit_once, trace_atexit_register);
  pthread_mutex_lock(&g_open_lock);
  t->prev = NULL;
  t->next = g_open;
  if (g_open != NULL) g_open->prev = t;
  g_open = t;
  pthread_mutex_unlock(&g_open_lock);
}

static void open_list_remove(struct gpumem__trace *t) {
  pthread_mutex_lock(&g_open_lock);
  if (t->prev != NULL) t->prev->next = t->next;
  else g_open = t->next;
  if (t->next != NULL) t->next->prev = t->prev;
  pthread_mutex_unlock(&g_open_lock);
}

static size_t slot_hash(uintptr_t k, size_t mask) {
  uint64_t x = (uint64_t)k;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & mask;
}

static uintptr_t slot_key(const void *slot) { return ((const trace_slot *)slot)->key; }

static int map_grow(struct gpumem__trace *t) {
  trace_slot *ns = gpumem__ht_doubled(t->slots, &t->cap, 1024, sizeof *ns, slot_key, slot_hash);
  if (ns == NULL) return -1;
  t->slots = ns;
  return 0;
}

/* Insert or overwrite; -1 on host out-of-memory. */
static int map_put(struct gpumem__trace *t, uintptr_t key, uint64_t id, uintptr_t stream, int device) {
  if ((t->count + 1) * 2 > t->cap && map_grow(t) != 0) return -1;
  size_t mask = t->cap - 1;
  size_t i = gpumem__ht_slot_for(t->slots, sizeof *t->slots, mask, slot_hash(key, mask), key, slot_key);
  if (t->slots[i].key == 0) t->count++;
  t->slots[i].key = key;
  t->slots[i].id = id;
  t->slots[i].stream = stream;
  t->slots[i].device = device;
  return 0;
}

static int slot_cmp_id(const void *a, const void *b) {
  uint64_t x = ((const trace_slot *)a)->id, y = ((const trace_slot *)b)->id;
  return (x > y) - (x < y);
}

/* The slot of key, or NULL. */
static trace_slot *map_find(struct gpumem__trace *t, uintptr_t key) {
  if (t->cap == 0) return NULL;
  size_t mask = t->cap - 1;
  size_t i = gpumem__ht_find(t->slots, sizeof *t->slots, mask, slot_hash(key, mask), key, slot_key);
  return i == SIZE_MAX ? NULL : &t->slots[i];
}

/* Remove key; returns 1 and its ID and allocation stream when present. */
static int map_take(struct gpumem__trace *t, uintptr_t key, uint64_t *id, uintptr_t *stream) {
  trace_slot *sl = map_find(t, key);
  if (sl == NULL) return 0;
  *id = sl->id;
  *stream = sl->stream;
  gpumem__ht_delete(t->slots, sizeof *t->slots, t->cap - 1, (size_t)(sl - t->slots), slot_key, slot_hash);
  t->count--;
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Writing                                                                 */

/* write(2) all of [s, s + n), retrying short writes and EINTR; 0 or an errno. */
static int write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno ? errno : EIO;
    }
    if (w == 0) return EIO;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

static void trace_flush(struct gpumem__trace *t) {
  if (t->used == 0) return;
  int e = t->write_error ? 0 : write_all(t->fd, t->buf, t->used);
  if (e != 0) t->write_error = e;
  t->used = 0;
}

static void trace_write(struct gpumem__trace *t, const char *s, size_t n) {
  if (t->write_error) return;
  if (t->used + n > TRACE_BUF) trace_flush(t);
  if (n > TRACE_BUF) {
    int e = write_all(t->fd, s, n);
    if (e != 0 && !t->write_error) t->write_error = e;
    return;
  }
  memcpy(t->buf + t->used, s, n);
  t->used += n;
}

static void trace_printf(struct gpumem__trace *t, const char *fmt, ...) GPUMEM__PRINTF(2, 3);
static void trace_printf(struct gpumem__trace *t, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  trace_write(t, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Decimal digits of v at the end of buf[0..20]; returns the start. */
static char *u64_dec(char *end, uint64_t v) {
  char *p = end;
  do {
    *--p = (char)('0' + v % 10u);
    v /= 10u;
  } while (v != 0);
  return p;
}

static void put_u64(char **w, uint64_t v) {
  char tmp[24];
  char *s = u64_dec(tmp + sizeof tmp, v);
  size_t n = (size_t)(tmp + sizeof tmp - s);
  memcpy(*w, s, n);
  *w += n;
}

/* Write one event line: "KIND ID" and the n fields after it (n <= 3). */
static void trace_event(struct gpumem__trace *t, char kind, uint64_t id, const uint64_t *fields, int n) {
  char line[4 + 24 * 4], *w = line;
  *w++ = kind;
  *w++ = ' ';
  put_u64(&w, id);
  for (int i = 0; i < n; i++) {
    *w++ = ' ';
    put_u64(&w, fields[i]);
  }
  *w++ = '\n';
  trace_write(t, line, (size_t)(w - line));
}

static void trace_free_struct(struct gpumem__trace *t) {
  if (t == NULL) return;
  free(t->slots);
  free(t->buf);
  free(t->path);
  free(t);
}

/* Expand %p (pid) and %c (context counter) in path. NULL on host out-of-memory. */
static char *expand_path(const char *path, unsigned long ctx_no) {
  size_t n = strlen(path), cap = n + 1;
  for (size_t i = 0; i + 1 < n; i++)
    if (path[i] == '%' && (path[i + 1] == 'p' || path[i + 1] == 'c')) cap += 24;
  char *out = gpumem__malloc(cap);
  if (out == NULL) return NULL;
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if (path[i] == '%' && i + 1 < n && (path[i + 1] == 'p' || path[i + 1] == 'c')) {
      unsigned long v = path[i + 1] == 'p' ? (unsigned long)getpid() : ctx_no;
      w += (size_t)snprintf(out + w, cap - w, "%lu", v);
      i++;
    } else {
      out[w++] = path[i];
    }
  }
  out[w] = '\0';
  return out;
}

static void write_header(gpumem_context *ctx, struct gpumem__trace *t) {
  char date[64] = "unknown";
  time_t now = time(NULL);
  struct tm tmv;
  if (now != (time_t)-1 && gmtime_r(&now, &tmv) != NULL) strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  char comm[64] = "";
  FILE *cf = fopen("/proc/self/comm", "r");
  if (cf != NULL) {
    if (fgets(comm, sizeof comm, cf) == NULL) comm[0] = '\0';
    fclose(cf);
  }
  comm[strcspn(comm, " \t\r\n")] = '\0';
  trace_printf(t,
          "# libgpumem trace\n"
          "# format: 'a ID SIZE STREAM [DEVICE]' (SIZE as requested, STREAM the stream handle, DEVICE absent = 0), "
          "'f ID [STREAM]' (STREAM when not the allocation's), 'n ID STREAM' (gpumem_record_stream)\n"
          "# libgpumem %d.%d.%d\n"
          "# workload %s\n"
          "# backend %s\n"
          "# date %s\n"
          "# pid %ld\n",
          GPUMEM_VERSION_MAJOR, GPUMEM_VERSION_MINOR, GPUMEM_VERSION_PATCH, comm[0] ? comm : "unknown",
          ctx->be_name, date, (long)getpid());
  for (int d = 0; d < ctx->ndev; d++) {
    gpumem_backend_device_info bi;
    memset(&bi, 0, sizeof bi);
    bi.physical_index = -1;
    if (gpumem__be_device_info(ctx, d, &bi) != GPUMEM_OK) {
      trace_printf(t, "# device %d (no information)\n", d);
      continue;
    }
    bi.name[sizeof bi.name - 1] = '\0';
    bi.uuid[sizeof bi.uuid - 1] = '\0';
    trace_printf(t, "# device %d name \"%s\" uuid %s total_bytes %llu\n", d, bi.name, bi.uuid,
            (unsigned long long)bi.total_bytes);
  }
}

/* ---------------------------------------------------------------------- */
/* Start / stop                                                            */

static _Atomic unsigned long g_ctx_counter;

static void mon_set(gpumem_context *ctx, unsigned bit, int on) {
  if (on) atomic_fetch_or_explicit(&ctx->mon, bit, memory_order_relaxed);
  else atomic_fetch_and_explicit(&ctx->mon, ~bit, memory_order_relaxed);
}

/* what: "GPUMEM_TRACE" or "gpumem_trace_start", for the log line. Called with trace_lock held. */
static gpumem_status trace_open_locked(gpumem_context *ctx, const char *path, const char *what) {
  if (ctx->trace != NULL) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "%s: a trace is already being recorded (%s)", what, ctx->trace->path);
    return GPUMEM_ERR_BUSY;
  }
  size_t n = strlen(path);
  if (n >= 3 && strcmp(path + n - 3, ".gz") == 0) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN,
                "%s=%s: gzip output is not supported; record plain text and compress it afterwards", what, path);
    return GPUMEM_ERR_NOT_SUPPORTED;
  }
  struct gpumem__trace *t = gpumem__calloc(1, sizeof *t);
  if (t == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  t->path = expand_path(path, atomic_fetch_add(&g_ctx_counter, 1));
  t->fd = -1;
  t->buf = gpumem__malloc(TRACE_BUF);
  if (t->buf == NULL || t->path == NULL || map_grow(t) != 0) {
    trace_free_struct(t);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  t->fd = open(t->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (t->fd < 0) {
    int e = errno;
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "%s=%s: cannot create the trace file: %s", what, t->path,
                strerror(e));
    trace_free_struct(t);
    return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  t->next_id = 1;
  t->ctx = ctx;
  write_header(ctx, t);
  ctx->trace = t;
  open_list_add(t);
  mon_set(ctx, GPUMEM__MON_TRACE, 1);
  gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "recording an allocation trace into %s", t->path);
  return GPUMEM_OK;
}

static gpumem_status trace_close_locked(gpumem_context *ctx) {
  struct gpumem__trace *t = ctx->trace;
  if (t == NULL) return GPUMEM_OK;
  mon_set(ctx, GPUMEM__MON_TRACE, 0);
  ctx->trace = NULL;
  open_list_remove(t);
  trace_printf(t, "# end: %llu allocations, %llu frees, %zu live\n", (unsigned long long)t->nallocs,
               (unsigned long long)t->nfrees, t->count);
  trace_flush(t);
  if (close(t->fd) != 0 && !t->write_error) t->write_error = errno ? errno : EIO;
  gpumem_status st = GPUMEM_OK;
  if (t->write_error) {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_WARN, "trace %s is incomplete: writing failed: %s", t->path,
                strerror(t->write_error));
    st = GPUMEM_ERR_INVALID_ARGUMENT;
  } else {
    gpumem__log(&ctx->opt.log, GPUMEM_LOG_INFO, "trace %s written: %llu allocations, %llu frees", t->path,
                (unsigned long long)t->nallocs, (unsigned long long)t->nfrees);
  }
  trace_free_struct(t);
  return st;
}

gpumem_status gpumem_trace_start(gpumem_context *ctx, const char *path) {
  if (ctx == NULL || path == NULL || path[0] == '\0') return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  gpumem__mutex_lock(&ctx->trace_lock);
  gpumem_status st = trace_open_locked(ctx, path, "gpumem_trace_start");
  gpumem__mutex_unlock(&ctx->trace_lock);
  /* the thread caches' inlined hits skip the hooks: detach every cache (a cache attaches again
   * only while ctx->mon is 0, tcache.c) */
  if (st == GPUMEM_OK && ctx->tc_on) (void)gpumem__tc_flush(ctx, NULL, 1);
  return st;
}

gpumem_status gpumem_trace_stop(gpumem_context *ctx) {
  if (ctx == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  /* the trace is the parent's: the child neither writes nor closes it */
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  gpumem__mutex_lock(&ctx->trace_lock);
  gpumem_status st = trace_close_locked(ctx);
  gpumem__mutex_unlock(&ctx->trace_lock);
  return st;
}

/* ---------------------------------------------------------------------- */
/* Context hooks                                                           */

gpumem_status gpumem__monitor_init(gpumem_context *ctx) {
  atomic_init(&ctx->mon, 0u);
  ctx->trace = NULL;
  if (gpumem__mutex_init(&ctx->trace_lock) != 0) return GPUMEM_ERR_OUT_OF_MEMORY;
  if (pthread_rwlock_init(&ctx->mon_rw, NULL) != 0) {
    gpumem__mutex_destroy(&ctx->trace_lock);
    return GPUMEM_ERR_OUT_OF_MEMORY;
  }
  if (gpumem__be_has_annotations(ctx)) mon_set(ctx, GPUMEM__MON_ANNOTATE, 1);
  const char *env = (ctx->opt.flags & GPUMEM_CONFIG_NO_ENV) ? NULL : getenv("GPUMEM_TRACE");
  /* as every GPUMEM_* variable: empty or blanks = unset, surrounding blanks are not part of the value */
  size_t len = 0;
  if (env != NULL) {
    while (*env == ' ' || *env == '\t' || *env == '\n' || *env == '\r' || *env == '\v' || *env == '\f') env++;
    len = strlen(env);
    while (len > 0 && (env[len - 1] == ' ' || env[len - 1] == '\t' || env[len - 1] == '\n' || env[len - 1] == '\r' ||
                       env[len - 1] == '\v' || env[len - 1] == '\f'))
      len--;
  }
  if (len > 0) {
    gpumem_status st;
    char *path = gpumem__malloc(len + 1);
    if (path == NULL) {
      st = GPUMEM_ERR_OUT_OF_MEMORY;
    } else {
      memcpy(path, env, len);
      path[len] = '\0';
      gpumem__mutex_lock(&ctx->trace_lock);
      st = trace_open_locked(ctx, path, "GPUMEM_TRACE");
      gpumem__mutex_unlock(&ctx->trace_lock);
      free(path);
      /* every refusal at create is a bad environment value */
      if (st == GPUMEM_ERR_NOT_SUPPORTED || st == GPUMEM_ERR_BUSY) st = GPUMEM_ERR_INVALID_ARGUMENT;
    }
    if (st != GPUMEM_OK) {
      pthread_rwlock_destroy(&ctx->mon_rw);
      gpumem__mutex_destroy(&ctx->trace_lock);
      return st;
    }
  }
  return GPUMEM_OK;
}

void gpumem__monitor_fini(gpumem_context *ctx) {
  gpumem__mutex_lock(&ctx->trace_lock);
  (void)trace_close_locked(ctx);
  gpumem__mutex_unlock(&ctx->trace_lock);
  gpumem__mutex_destroy(&ctx->trace_lock);
  pthread_rwlock_destroy(&ctx->mon_rw);
}

/* A monitored allocation is the pool's allocation, then its announcement and trace line under
 * trace_lock. A monitored reset between the two would withdraw the annotation of a block not yet
 * announced, and the announcement would then come for a block already invalidated (valgrind: an
 * invalid free, then overlapping blocks; a trace: an 'a' line whose block the reset ended). So
 * monitored allocations hold mon_rw for reading across both, a monitored reset holds it for
 * writing. (Frees are serialised with resets by trace_lock already.) */
void gpumem__monitor_alloc_enter(gpumem_context *ctx) { (void)pthread_rwlock_rdlock(&ctx->mon_rw); }
void gpumem__monitor_alloc_exit(gpumem_context *ctx) { (void)pthread_rwlock_unlock(&ctx->mon_rw); }

void gpumem__monitor_alloc(gpumem_context *ctx, int device, void *ptr, size_t size, gpumem_stream stream) {
  unsigned mon = atomic_load_explicit(&ctx->mon, memory_order_relaxed);
  gpumem__mutex_lock(&ctx->trace_lock);
  if (mon & GPUMEM__MON_ANNOTATE) gpumem__be_annotate_alloc(ctx, device, ptr, size);
  struct gpumem__trace *t = (mon & GPUMEM__MON_TRACE) ? ctx->trace : NULL;
  if (t != NULL) {
    uint64_t id = t->next_id++;
    if (map_put(t, (uintptr_t)ptr, id, (uintptr_t)stream, device) != 0) {
      /* no host memory to remember the ID: the free will be missing from the trace */
      if (!t->write_error) t->write_error = ENOMEM;
    }
    const uint64_t f[3] = {(uint64_t)size, (uint64_t)(uintptr_t)stream, (uint64_t)device};
    trace_event(t, 'a', id, f, device != 0 ? 3 : 2);
    t->nallocs++;
  }
  gpumem__mutex_unlock(&ctx->trace_lock);
}

static void trace_reset_locked(struct gpumem__trace *t, int device);

/* Write "f ID" for ptr when the trace knows it, "f ID STREAM" when freed on a stream other than its
 * allocation's. trace_lock held. */
static void trace_free_locked(struct gpumem__trace *t, void *ptr, gpumem_stream stream) {
  uint64_t id;
  uintptr_t astream;
  if (t == NULL || !map_take(t, (uintptr_t)ptr, &id, &astream)) return;
  const uint64_t f = (uint64_t)(uintptr_t)stream;
  trace_event(t, 'f', id, &f, (uintptr_t)stream != astream);
  t->nfrees++;
}

gpumem_status gpumem__monitor_record_stream(gpumem_context *ctx, gpumem__pool *pool, void *ptr,
                                            gpumem_stream stream) {
  /* under the monitor lock, as a free: the line names the block's current owner */
  gpumem__mutex_lock(&ctx->trace_lock);
  gpumem_status st = gpumem__pool_record_stream(pool, ptr, stream);
  struct gpumem__trace *t = ctx->trace;
  trace_slot *sl = st == GPUMEM_OK && t != NULL ? map_find(t, (uintptr_t)ptr) : NULL;
  if (sl != NULL) {
    const uint64_t f = (uint64_t)(uintptr_t)stream;
    trace_event(t, 'n', sl->id, &f, 1);
  }
  gpumem__mutex_unlock(&ctx->trace_lock);
  return st;
}

gpumem_status gpumem__monitor_free(gpumem_context *ctx, void *ptr, gpumem_stream stream) {
  unsigned mon = atomic_load_explicit(&ctx->mon, memory_order_relaxed);
  size_t req = 0;
  gpumem__pool *pool = NULL;
  int annotated = (mon & GPUMEM__MON_ANNOTATE) && gpumem__ptrmap_info(&ctx->map, (uintptr_t)ptr, &req, &pool) == 0;
  int dev = annotated ? gpumem__pool_device(pool) : 0;
  /* The free, its annotation and its trace line happen under the monitor
   * lock, and so do an allocation's: the next owner of the address is
   * announced and recorded only after this free was. A free that fails
   * changes nothing here either. */
  gpumem__mutex_lock(&ctx->trace_lock);
  gpumem_status st = gpumem__free_unmonitored(ctx, ptr, stream);
  if (st == GPUMEM_OK) {
    if (annotated) gpumem__be_annotate_free(ctx, dev, ptr, req);
    if (mon & GPUMEM__MON_TRACE) trace_free_locked(ctx->trace, ptr, stream);
  }
  gpumem__mutex_unlock(&ctx->trace_lock);
  return st;
}

/* The live blocks of a pool (malloc'd array, *n entries), or NULL. */
static gpumem__leak *live_blocks(gpumem__pool *pool, size_t *n) {
  uint64_t count = 0, bytes = 0;
  size_t nfirst = 0;
  gpumem__pool_live(pool, &count, &bytes, NULL, 0, &nfirst);
  /* a little slack for blocks handed out meanwhile (a reset racing allocations is the caller's bug anyway) */
  size_t max = (size_t)count + 64;
  gpumem__leak *live = gpumem__calloc(max, sizeof *live);
  if (live == NULL) return NULL;
  count = 0;
  gpumem__pool_live(pool, &count, &bytes, live, max, &nfirst);
  *n = nfirst;
  return live;
}

void gpumem__monitor_drop(gpumem_context *ctx, gpumem__pool *pool) {
  if (!(atomic_load_explicit(&ctx->mon, memory_order_relaxed) & GPUMEM__MON_ANNOTATE)) return;
  size_t n = 0;
  gpumem__leak *live = live_blocks(pool, &n);
  int device = gpumem__pool_device(pool);
  for (size_t i = 0; live != NULL && i < n; i++)
    gpumem__be_annotate_free(ctx, device, (void *)live[i].ptr, live[i].requested);
  free(live);
  if (live != NULL) return;
  /* no host memory for the list (the pool goes anyway): a page at a time on the stack */
  gpumem__leak page[32];
  for (size_t at = 0, k; (k = gpumem__pool_live_at(pool, at, page, 32)) > 0; at += k)
    for (size_t i = 0; i < k; i++) gpumem__be_annotate_free(ctx, device, (void *)page[i].ptr, page[i].requested);
}

gpumem_status gpumem__monitor_reset(gpumem_context *ctx, gpumem__pool *pool) {
  (void)pthread_rwlock_wrlock(&ctx->mon_rw); /* no monitored allocation half done (see monitor_alloc_enter) */
  unsigned mon = atomic_load_explicit(&ctx->mon, memory_order_relaxed);
  int device = gpumem__pool_device(pool);
  gpumem__mutex_lock(&ctx->trace_lock);
  size_t n = 0;
  gpumem__leak *live = (mon & GPUMEM__MON_ANNOTATE) ? live_blocks(pool, &n) : NULL;
  /* no host memory to list the blocks whose annotations the reset ends: no reset (a memory checker
   * would keep them as allocated, and the memory handed out again would overlap them) */
  gpumem_status st = (mon & GPUMEM__MON_ANNOTATE) && live == NULL ? GPUMEM_ERR_OUT_OF_MEMORY : gpumem__pool_reset(pool);
  if (st == GPUMEM_OK) { /* a reset that failed changed nothing */
    for (size_t i = 0; live != NULL && i < n; i++)
      gpumem__be_annotate_free(ctx, device, (void *)live[i].ptr, live[i].requested);
    if ((mon & GPUMEM__MON_TRACE) && ctx->trace != NULL) trace_reset_locked(ctx->trace, device);
  }
  gpumem__mutex_unlock(&ctx->trace_lock);
  (void)pthread_rwlock_unlock(&ctx->mon_rw);
  free(live);
  return st;
}

/* "# reset device D" and "f ID" for every live ID of the device, in ID order. trace_lock held. */
static void trace_reset_locked(struct gpumem__trace *t, int device) {
  char line[64];
  int n = snprintf(line, sizeof line, "# reset device %d\n", device);
  trace_write(t, line, (size_t)n);
  size_t n_dev = 0;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slots[i].key != 0 && t->slots[i].device == device) n_dev++;
  if (n_dev == 0) return;
  trace_slot *v = gpumem__malloc(n_dev * sizeof *v);
  if (v == NULL) {
    if (!t->write_error) t->write_error = ENOMEM;
    return;
  }
  size_t k = 0;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slots[i].key != 0 && t->slots[i].device == device) v[k++] = t->slots[i];
  if (n_dev > 1) qsort(v, n_dev, sizeof *v, slot_cmp_id);
  for (k = 0; k < n_dev; k++) trace_free_locked(t, (void *)v[k].key, (gpumem_stream)v[k].stream);
  free(v);
}
