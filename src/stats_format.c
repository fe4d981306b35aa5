/* stats_format.c: gpumem_stats_format(): the statistics as JSON or in the
 * Prometheus text exposition format (version 0.0.4).
 *
 * The fields, their kinds and help lines come from the one list in
 * stats_fields.h: the JSON key is the gpumem_stats member name; a counter
 * (cumulative since creation) gets the Prometheus name + "_total", a gauge
 * or a peak is a Prometheus gauge. */
#include "internal.h"
#include "stats_fields.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct field_desc {
  const char *name; /* gpumem_stats member = JSON key = Prometheus name without "gpumem_" / "_total" */
  size_t off;
  int counter;      /* 1: cumulative (Prometheus counter, "_total"); 0: gauge (a current value or a peak) */
  const char *help;
} field_desc;

#define F(name, kind, help) {#name, offsetof(gpumem_stats, name), GPUMEM__STAT_##kind == GPUMEM__STAT_COUNTER, help},
static const field_desc k_fields[] = {GPUMEM__STATS_FIELDS(F)};
#undef F
#define NFIELDS (sizeof k_fields / sizeof k_fields[0])

static uint64_t field_get(const gpumem_stats *s, size_t i) {
  uint64_t v;
  memcpy(&v, (const char *)s + k_fields[i].off, sizeof v);
  return v;
}

/* ---------------------------------------------------------------------- */
/* A writer that counts everything and stores what fits (snprintf-like)    */

typedef struct writer {
  char *buf;
  size_t cap;  /* bytes of buf usable for text (len - 1), or 0 */
  size_t len;  /* bytes the whole text has so far */
} writer;

static void w_mem(writer *w, const char *s, size_t n) {
  if (w->len < w->cap) {
    size_t room = w->cap - w->len;
    memcpy(w->buf + w->len, s, n < room ? n : room);
  }
  w->len += n;
}

static void w_str(writer *w, const char *s) { w_mem(w, s, strlen(s)); }

static void w_u64(writer *w, uint64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  w_mem(w, tmp, (size_t)n);
}

static void w_int(writer *w, int v) {
  char tmp[16];
  int n = snprintf(tmp, sizeof tmp, "%d", v);
  w_mem(w, tmp, (size_t)n);
}

/* A JSON string literal. */
static void w_json_str(writer *w, const char *s) {
  w_mem(w, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      char e[2] = {'\\', (char)*p};
      w_mem(w, e, 2);
    } else if (*p < 0x20) {
      char e[8];
      int n = snprintf(e, sizeof e, "\\u%04x", *p);
      w_mem(w, e, (size_t)n);
    } else {
      w_mem(w, (const char *)p, 1);
    }
  }
  w_mem(w, "\"", 1);
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void w_prom_label(writer *w, const char *s) {
  for (const char *p = s; *p; p++) {
    if (*p == '\\') w_mem(w, "\\\\", 2);
    else if (*p == '"') w_mem(w, "\\\"", 2);
    else if (*p == '\n') w_mem(w, "\\n", 2);
    else w_mem(w, p, 1);
  }
}

/* ---------------------------------------------------------------------- */

/* "key":value pairs; comma_first: also a ',' before the first */
static void json_fields(writer *w, const gpumem_stats *s, int comma_first) {
  for (size_t i = 0; i < NFIELDS; i++) {
    w_str(w, (i || comma_first) ? ",\"" : "\"");
    w_str(w, k_fields[i].name);
    w_str(w, "\":");
    w_u64(w, field_get(s, i));
  }
}

static void json_device(writer *w, int device, const gpumem_stats *s) {
  w_str(w, "{\"device\":");
  w_int(w, device);
  json_fields(w, s, 1);
  w_str(w, "}");
}

static void prom_sample_labels(writer *w, const char *backend, int device) {
  w_str(w, "{backend=\"");
  w_prom_label(w, backend);
  w_str(w, "\",device=\"");
  w_int(w, device);
  w_str(w, "\"}");
}

gpumem_status gpumem_stats_format(gpumem_context *ctx, int device, gpumem_stats_format_kind format, char *buf,
                                  size_t len, size_t *needed) {
  if (ctx == NULL || (buf == NULL && len != 0)) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  if (format != GPUMEM_STATS_JSON && format != GPUMEM_STATS_PROMETHEUS) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (device != GPUMEM_ALL_DEVICES && (device < 0 || device >= ctx->ndev)) return GPUMEM_ERR_INVALID_DEVICE;

  /* one snapshot per device; the JSON total is their sum, so it always matches */
  int lo = device == GPUMEM_ALL_DEVICES ? 0 : device;
  int hi = device == GPUMEM_ALL_DEVICES ? ctx->ndev : device + 1;
  int ndev = hi - lo;
  gpumem_stats one_stack[4];
  int dev_stack[4];
  gpumem_stats *snap = one_stack;
  int *devs = dev_stack;
  if (ndev > 4) {
    snap = gpumem__calloc((size_t)ndev, sizeof *snap);
    devs = gpumem__calloc((size_t)ndev, sizeof *devs);
    if (snap == NULL || devs == NULL) {
      free(snap);
      free(devs);
      return GPUMEM_ERR_OUT_OF_MEMORY;
    }
  }
  int n = 0;
  gpumem_stats total;
  memset(&total, 0, sizeof total);
  for (int d = lo; d < hi; d++) {
    /* ALL: only devices with a pool; one device: always (zeros before its first allocation) */
    if (device == GPUMEM_ALL_DEVICES && atomic_load_explicit(&ctx->pools[d], memory_order_acquire) == NULL) continue;
    memset(&snap[n], 0, sizeof snap[n]);
    snap[n].struct_size = sizeof snap[n];
    if (gpumem_get_stats(ctx, d, &snap[n]) != GPUMEM_OK) continue;
    for (size_t i = 0; i < NFIELDS; i++) {
      uint64_t v = field_get(&total, i) + field_get(&snap[n], i);
      memcpy((char *)&total + k_fields[i].off, &v, sizeof v);
    }
    devs[n++] = d;
  }

  writer w = {buf, len ? len - 1 : 0, 0};
  const char *backend = ctx->be_name;
  if (format == GPUMEM_STATS_JSON) {
    w_str(&w, "{\"backend\":");
    w_json_str(&w, backend);
    if (device != GPUMEM_ALL_DEVICES) {
      w_str(&w, ",\"device\":");
      w_int(&w, device);
      json_fields(&w, &snap[0], 1);
    } else {
      w_str(&w, ",\"devices\":[");
      for (int k = 0; k < n; k++) {
        if (k) w_str(&w, ",");
        json_device(&w, devs[k], &snap[k]);
      }
      w_str(&w, "],\"total\":{");
      json_fields(&w, &total, 0);
      w_str(&w, "}");
    }
    w_str(&w, "}\n");
  } else {
    for (size_t i = 0; i < NFIELDS; i++) {
      const char *suffix = k_fields[i].counter ? "_total" : "";
      w_str(&w, "# HELP gpumem_");
      w_str(&w, k_fields[i].name);
      w_str(&w, suffix);
      w_str(&w, " ");
      w_str(&w, k_fields[i].help);
      w_str(&w, "\n# TYPE gpumem_");
      w_str(&w, k_fields[i].name);
      w_str(&w, suffix);
      w_str(&w, k_fields[i].counter ? " counter\n" : " gauge\n");
      for (int k = 0; k < n; k++) {
        w_str(&w, "gpumem_");
        w_str(&w, k_fields[i].name);
        w_str(&w, suffix);
        prom_sample_labels(&w, backend, devs[k]);
        w_str(&w, " ");
        w_u64(&w, field_get(&snap[k], i));
        w_str(&w, "\n");
      }
    }
  }
  if (snap != one_stack) {
    free(snap);
    free(devs);
  }

  if (needed != NULL) *needed = w.len + 1;
  if (len == 0) return buf == NULL ? GPUMEM_OK : GPUMEM_ERR_INVALID_ARGUMENT;
  buf[w.len < w.cap ? w.len : w.cap] = '\0';
  return w.len < len ? GPUMEM_OK : GPUMEM_ERR_INVALID_ARGUMENT;
}
