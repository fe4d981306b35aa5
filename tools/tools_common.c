/* tools_common.c: timing, medians, JSON, trace reader, streams for the tools. */
#include "tools_common.h"

#include <math.h>

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef GPUMEM_TOOLS_HAVE_ZLIB
#include <zlib.h>
#endif

uint64_t tools_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tools_median(const double *v, size_t n) {
  if (n == 0) return 0.0;
  double *c = malloc(n * sizeof *c);
  if (!c) return v[0];
  memcpy(c, v, n * sizeof *c);
  qsort(c, n, sizeof *c, cmp_double);
  double m = (n % 2) ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return m;
}

void tools_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

int tools_default_sim_devices(const char *value) {
  if (getenv("GPUMEM_SIM_DEVICES")) return 0;
  setenv("GPUMEM_SIM_DEVICES", value, 0);
  return 1;
}

static void seterr(char *err, size_t n, const char *fmt, ...) {
  if (!err || !n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

/* ---- trace reader --------------------------------------------------------- */

/* Whole lines, with their true length: the reader buffers raw bytes itself (gzread or fread), so
 * that a NUL byte inside a line is seen (gzgets and fgets stop at none and hide it) and a line
 * longer than the caller's buffer is known to be cut (then the rest is skipped). */
typedef struct line_reader {
#ifdef GPUMEM_TOOLS_HAVE_ZLIB
  gzFile gz;
#else
  FILE *pipe;
#endif
  char *buf;
  size_t pos, end;
  int eof, error;
} line_reader;

#define READER_BUF ((size_t)1 << 17)

const char *tools_trace_reader(void) {
#ifdef GPUMEM_TOOLS_HAVE_ZLIB
  return "zlib";
#else
  return "gzip -dc";
#endif
}

static int reader_open(line_reader *r, const char *path, char *err, size_t errlen) {
#ifdef GPUMEM_TOOLS_HAVE_ZLIB
  r->gz = gzopen(path, "rb"); /* reads plain text transparently too */
  if (!r->gz) {
    seterr(err, errlen, "%s: %s", path, strerror(errno ? errno : ENOENT));
    return -1;
  }
  gzbuffer(r->gz, 1u << 17);
  r->buf = malloc(READER_BUF);
  if (!r->buf) {
    gzclose(r->gz);
    seterr(err, errlen, "out of host memory");
    return -1;
  }
#else
  FILE *probe = fopen(path, "rb");
  if (!probe) {
    seterr(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  fclose(probe);
  /* single-quote the path for the shell */
  size_t n = strlen(path);
  char *cmd = malloc(4 * n + 32);
  if (!cmd) {
    seterr(err, errlen, "out of host memory");
    return -1;
  }
  char *p = cmd + sprintf(cmd, "gzip -dcf -- '");
  for (size_t i = 0; i < n; i++) {
    if (path[i] == '\'') { memcpy(p, "'\\''", 4); p += 4; }
    else *p++ = path[i];
  }
  strcpy(p, "'");
  r->pipe = popen(cmd, "r");
  free(cmd);
  if (!r->pipe) {
    seterr(err, errlen, "%s: cannot run gzip: %s", path, strerror(errno));
    return -1;
  }
  r->buf = malloc(READER_BUF);
  if (!r->buf) {
    pclose(r->pipe);
    seterr(err, errlen, "out of host memory");
    return -1;
  }
#endif
  r->pos = r->end = 0;
  r->eof = r->error = 0;
  return 0;
}

static int reader_fill(line_reader *r) {
  if (r->eof) return 0;
#ifdef GPUMEM_TOOLS_HAVE_ZLIB
  int n = gzread(r->gz, r->buf, (unsigned)READER_BUF);
  if (n < 0) r->error = 1;
  if (n <= 0) {
    r->eof = 1;
    return 0;
  }
#else
  size_t n = fread(r->buf, 1, READER_BUF, r->pipe);
  if (n == 0) {
    if (ferror(r->pipe)) r->error = 1;
    r->eof = 1;
    return 0;
  }
#endif
  r->pos = 0;
  r->end = (size_t)n;
  return 1;
}

/* The next line into buf (cap bytes, NUL-terminated, its '\n' dropped): returns its length in the
 * file (more than cap - 1 when it was cut), or -1 at the end. *nul: the line holds a NUL byte. */
static long reader_line(line_reader *r, char *buf, size_t cap, int *nul) {
  size_t len = 0, kept = 0;
  int any = 0;
  *nul = 0;
  for (;;) {
    if (r->pos == r->end && !reader_fill(r)) break;
    any = 1;
    char c = r->buf[r->pos++];
    if (c == '\n') break;
    if (c == '\0') *nul = 1;
    if (kept + 1 < cap) buf[kept++] = c;
    len++;
  }
  buf[kept] = '\0';
  return any ? (long)len : -1;
}

/* returns 0 when the stream ended cleanly */
static int reader_close(line_reader *r) {
  free(r->buf);
  r->buf = NULL;
#ifdef GPUMEM_TOOLS_HAVE_ZLIB
  int errnum = 0;
  gzerror(r->gz, &errnum);
  int rc = gzclose(r->gz);
  return r->error || (errnum != Z_OK && errnum != Z_STREAM_END) || rc != Z_OK;
#else
  return (pclose(r->pipe) != 0) | r->error;
#endif
}

/* One decimal field of an event line: blanks, then digits only (no sign), then a blank or the end.
 * 0 and *v set, or -1 (missing, not a number, trailing letters, or beyond 64 bits). */
static int field_u64(const char **p, uint64_t *v) {
  const char *s = *p;
  if (*s != ' ' && *s != '\t') return -1;
  while (*s == ' ' || *s == '\t') s++;
  if (*s < '0' || *s > '9') return -1;
  uint64_t x = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    unsigned d = (unsigned)(*s - '0');
    if (x > (UINT64_MAX - d) / 10u) return -1;
    x = x * 10u + d;
  }
  if (*s != '\0' && *s != ' ' && *s != '\t' && *s != '\r') return -1;
  *p = s;
  *v = x;
  return 0;
}

/* Only blanks (and a '\r' of a CRLF file) left. */
static int at_end(const char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\r') s++;
  return *s == '\0';
}

/* open-addressing map from trace ID to slot */
typedef struct idmap {
  uint64_t *keys;
  uint32_t *vals; /* slot + 1; 0 = empty */
  size_t cap, used;
} idmap;

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

static int idmap_grow(idmap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  uint64_t *nk = calloc(ncap, sizeof *nk);
  uint32_t *nv = calloc(ncap, sizeof *nv);
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->vals[i]) continue;
    size_t j = mix64(m->keys[i]) & (ncap - 1);
    while (nv[j]) j = (j + 1) & (ncap - 1);
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return 0;
}

/* returns a pointer to the value cell for key (0 if new) or NULL on OOM */
static uint32_t *idmap_cell(idmap *m, uint64_t key, int insert) {
  if (insert && (m->used + 1) * 2 > m->cap && idmap_grow(m) != 0) return NULL;
  if (!m->cap) return NULL;
  size_t j = mix64(key) & (m->cap - 1);
  while (m->vals[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
  if (!m->vals[j]) {
    if (!insert) return NULL;
    m->keys[j] = key;
    m->used++;
  }
  return &m->vals[j];
}

typedef struct growbuf {
  void *p;
  size_t n, cap, elem;
} growbuf;

static void *growbuf_push(growbuf *b) {
  if (b->n == b->cap) {
    size_t ncap = b->cap ? b->cap * 2 : 4096;
    void *np = realloc(b->p, ncap * b->elem);
    if (!np) return NULL;
    b->p = np;
    b->cap = ncap;
  }
  return (char *)b->p + b->elem * b->n++;
}

static uint64_t header_number(const char *line, const char *key) {
  const char *p = strstr(line, key);
  if (!p) return 0;
  return strtoull(p + strlen(key), NULL, 10);
}

/* The dense index of stream value sv in streams (appended when new): 0, 1 when there are more than
 * UINT16_MAX + 1 streams, -1 out of host memory. */
static int stream_index(growbuf *streams, uint64_t sv, size_t *out) {
  size_t si;
  for (si = 0; si < streams->n; si++)
    if (((uint64_t *)streams->p)[si] == sv) break;
  if (si == streams->n) {
    uint64_t *np = growbuf_push(streams);
    if (!np) return -1;
    *np = sv;
  }
  *out = si;
  return si > UINT16_MAX ? 1 : 0;
}

int tools_trace_load(const char *path, tools_trace *out, char *err, size_t errlen) {
  tools_trace t;
  memset(&t, 0, sizeof t);
  line_reader r;
  if (reader_open(&r, path, err, errlen) != 0) return -1;

  idmap ids = {0};
  growbuf ev = {.elem = sizeof(tools_event)};
  growbuf slot_size = {.elem = sizeof(uint64_t)};
  growbuf slot_stream = {.elem = sizeof(uint16_t)};
  growbuf streams = {.elem = sizeof(uint64_t)};
  uint64_t live = 0;
  char line[512];
  size_t lineno = 0;
  int rc = -1;
  long len;
  int nul = 0;

  while ((len = reader_line(&r, line, sizeof line, &nul)) >= 0) {
    lineno++;
    if (nul) {
      seterr(err, errlen, "%s:%zu: a NUL byte: not a text trace", path, lineno);
      goto done;
    }
    char *s = line;
    while (*s == ' ' || *s == '\t') s++;
    if (*s == '#') { /* a comment of any length: what did not fit the buffer is skipped with it */
      if (!strncmp(s, "# workload ", 11)) {
        sscanf(s + 11, "%127s", t.workload);
      } else if (!strncmp(s, "# pytorch ", 10)) {
        t.pytorch_max_allocated = header_number(s, "max_allocated ");
        t.pytorch_max_reserved = header_number(s, "max_reserved ");
      }
      continue;
    }
    if (*s == '\r' || *s == 0) continue;
    if ((size_t)len >= sizeof line) {
      seterr(err, errlen, "%s:%zu: event line longer than %zu bytes", path, lineno, sizeof line - 1);
      goto done;
    }
    char kind = *s;
    const char *e = s + 1;
    if (kind == 'a') {
      uint64_t id, size, sv, dev = 0;
      if (field_u64(&e, &id) != 0 || field_u64(&e, &size) != 0 || field_u64(&e, &sv) != 0 ||
          (!at_end(e) && (field_u64(&e, &dev) != 0 || dev > (uint64_t)INT32_MAX)) || !at_end(e)) {
        seterr(err, errlen, "%s:%zu: bad alloc line (expected 'a ID SIZE STREAM [DEVICE]')", path, lineno);
        goto done;
      }
      uint32_t *cell = idmap_cell(&ids, id, 1);
      if (!cell) goto oom;
      if (*cell) {
        seterr(err, errlen, "%s:%zu: ID %llu allocated twice", path, lineno, (unsigned long long)id);
        goto done;
      }
      size_t si;
      int sr = stream_index(&streams, sv, &si);
      if (sr < 0) goto oom;
      if (sr > 0) {
        seterr(err, errlen, "%s: too many streams", path);
        goto done;
      }
      uint64_t *ss = growbuf_push(&slot_size);
      uint16_t *st = growbuf_push(&slot_stream);
      tools_event *x = growbuf_push(&ev);
      if (!ss || !st || !x) goto oom;
      *cell = (uint32_t)slot_size.n; /* slot + 1 */
      *ss = size;
      *st = (uint16_t)si;
      x->size = size;
      x->slot = (uint32_t)(slot_size.n - 1);
      x->stream = (uint16_t)si;
      x->kind = TOOLS_EV_ALLOC;
      live += size;
      if (live > t.peak_live) t.peak_live = live;
      t.num_allocs++;
    } else if (kind == 'f' || kind == 'n') {
      /* 'f ID [STREAM]' (STREAM: the free's, when not the allocation's), 'n ID STREAM' */
      uint64_t id, sv = 0;
      int has_stream = 0, bad = field_u64(&e, &id) != 0;
      if (!bad && !at_end(e)) {
        bad = field_u64(&e, &sv) != 0;
        has_stream = 1;
      }
      if (!bad && !at_end(e)) bad = 1;
      if (kind == 'n' && !has_stream) bad = 1;
      if (bad) {
        seterr(err, errlen, kind == 'f' ? "%s:%zu: bad free line (expected 'f ID [STREAM]')"
                                        : "%s:%zu: bad note line (expected 'n ID STREAM')",
               path, lineno);
        goto done;
      }
      uint32_t *cell = idmap_cell(&ids, id, 0);
      if (!cell || *cell == 0 || *cell == UINT32_MAX) {
        if (kind == 'f') t.num_unmatched_frees++;
        else t.num_unmatched_notes++;
        continue;
      }
      uint32_t slot = *cell - 1;
      size_t si = ((uint16_t *)slot_stream.p)[slot];
      if (has_stream) {
        int sr = stream_index(&streams, sv, &si);
        if (sr < 0) goto oom;
        if (sr > 0) {
          seterr(err, errlen, "%s: too many streams", path);
          goto done;
        }
      }
      tools_event *x = growbuf_push(&ev);
      if (!x) goto oom;
      x->size = 0;
      x->slot = slot;
      x->stream = (uint16_t)si;
      if (kind == 'n') {
        x->kind = TOOLS_EV_NOTE;
        t.num_notes++;
        continue;
      }
      *cell = UINT32_MAX; /* freed: a second free is unmatched */
      x->kind = TOOLS_EV_FREE;
      live -= ((uint64_t *)slot_size.p)[slot];
      t.num_frees++;
    } else {
      seterr(err, errlen, "%s:%zu: unknown event '%c'", path, lineno, kind);
      goto done;
    }
  }
  if (reader_close(&r) != 0) {
    r = (line_reader){0};
    seterr(err, errlen, "%s: read or decompression error", path);
    goto done_closed;
  }
  t.path = strdup(path);
  t.events = ev.p;
  t.num_events = ev.n;
  t.stream_values = streams.p;
  t.num_streams = streams.n;
  ev.p = NULL;
  streams.p = NULL;
  if (!t.path) goto oom_closed;
  *out = t;
  rc = 0;
  goto done_closed;
oom:
  seterr(err, errlen, "out of host memory reading %s", path);
done:
  reader_close(&r);
  goto done_closed;
oom_closed:
  seterr(err, errlen, "out of host memory reading %s", path);
done_closed:
  free(ids.keys);
  free(ids.vals);
  free(ev.p);
  free(slot_size.p);
  free(slot_stream.p);
  free(streams.p);
  if (rc != 0) free(t.path);
  return rc;
}

void tools_trace_free(tools_trace *t) {
  if (!t) return;
  free(t->path);
  free(t->events);
  free(t->stream_values);
  memset(t, 0, sizeof *t);
}

/* ---- streams -------------------------------------------------------------- */

/* sim streams are opaque tokens: the addresses of these bytes */
static char sim_tokens[65536];

int tools_streams_create(const char *backend, int device, size_t n, int default0, gpumem_stream *out,
                         int *all_null, char *err, size_t errlen) {
  (void)device;
  *all_null = 0;
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  if (!strcmp(backend, "sim")) {
    if (n > sizeof sim_tokens) {
      seterr(err, errlen, "too many streams (%zu)", n);
      return -1;
    }
    for (size_t i = (default0 ? 1 : 0); i < n; i++) out[i] = &sim_tokens[i];
    return 0;
  }
#ifdef GPUMEM_HAVE_CUDA
  if (!strcmp(backend, "cuda")) {
    for (size_t i = (default0 ? 1 : 0); i < n; i++) {
      if (tools_cuda_stream_create(device, &out[i], err, errlen) != 0) {
        tools_streams_destroy(backend, device, i, out);
        return -1;
      }
    }
    return 0;
  }
#endif
  *all_null = n > (default0 ? 1u : 0u);
  return 0;
}

void tools_streams_destroy(const char *backend, int device, size_t n, gpumem_stream *s) {
  (void)backend;
  (void)device;
#ifdef GPUMEM_HAVE_CUDA
  if (!strcmp(backend, "cuda"))
    for (size_t i = 0; i < n; i++)
      if (s[i]) tools_cuda_stream_destroy(device, s[i]);
#endif
  for (size_t i = 0; i < n; i++) s[i] = NULL;
}

void tools_device_sync(const char *backend, int device) {
  (void)backend;
  (void)device;
#ifdef GPUMEM_HAVE_CUDA
  if (!strcmp(backend, "cuda")) tools_cuda_device_sync(device);
#endif
}

gpumem_context *tools_sim_context(const char *who) {
  tools_default_sim_devices("1x141GiB");
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  gpumem_context *ctx = NULL;
  gpumem_status st = gpumem_create(&cfg, &ctx);
  if (st != GPUMEM_OK) {
    fprintf(stderr, "%s: gpumem_create: %s\n", who, gpumem_status_name(st));
    return NULL;
  }
  return ctx;
}

/* ---- the random live set -------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

tools_rand_op *tools_random_ops(size_t nops) {
  tools_rand_op *ops = malloc((nops > 0 ? nops : 1) * sizeof *ops);
  if (ops == NULL) return NULL;
  uint64_t seed = 42;
  size_t live = 0;
  const double lo = log(256.0), hi = log(4.0 * 1024 * 1024);
  for (size_t i = 0; i < nops; i++) {
    int do_alloc = live == 0 || (live < TOOLS_RANDOM_MAX_LIVE && (rng_next(&seed) & 1));
    if (do_alloc) {
      ops[i].size = (size_t)exp(lo + (hi - lo) * rng_unit(&seed));
      ops[i].index = 0;
      live++;
    } else {
      ops[i].size = 0;
      ops[i].index = (size_t)(rng_next(&seed) % live);
      live--;
    }
  }
  return ops;
}
