/* gpumem_stats_format: JSON (checked by a small parser here), Prometheus
 * (every line checked against the exposition format with POSIX regexes),
 * snprintf-like size handling, label and string escaping. */
#include <regex.h>

#include "testutil.h"

/* ---------------------------------------------------------------------- */
/* A minimal JSON parser: validates the whole text and finds values by path */

typedef struct jp {
  const char *s;
  size_t i;
  int err;
} jp;

static void jp_ws(jp *p) {
  while (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\t' || p->s[p->i] == '\r') p->i++;
}

static int jp_value(jp *p);

/* Parse a string; when out != NULL copy its unescaped text (cap bytes). */
static int jp_string(jp *p, char *out, size_t cap) {
  size_t n = 0;
  if (p->s[p->i] != '"') return p->err = 1, -1;
  p->i++;
  for (;;) {
    char c = p->s[p->i++];
    if (c == '\0' || (unsigned char)c < 0x20) return p->err = 1, -1;
    if (c == '"') break;
    if (c == '\\') {
      char e = p->s[p->i++];
      if (e == 'u') {
        unsigned v = 0;
        for (int k = 0; k < 4; k++) {
          char h = p->s[p->i++];
          if (h >= '0' && h <= '9') v = v * 16 + (unsigned)(h - '0');
          else if (h >= 'a' && h <= 'f') v = v * 16 + (unsigned)(h - 'a' + 10);
          else if (h >= 'A' && h <= 'F') v = v * 16 + (unsigned)(h - 'A' + 10);
          else return p->err = 1, -1;
        }
        c = (char)v;
      } else if (e == '"' || e == '\\' || e == '/') {
        c = e;
      } else if (e == 'n') {
        c = '\n';
      } else if (e == 't') {
        c = '\t';
      } else {
        return p->err = 1, -1;
      }
    }
    if (out != NULL && n + 1 < cap) out[n++] = c;
  }
  if (out != NULL) out[n] = '\0';
  return 0;
}

static int jp_number(jp *p) {
  size_t st = p->i;
  if (p->s[p->i] == '-') p->i++;
  if (p->s[p->i] < '0' || p->s[p->i] > '9') return p->err = 1, -1;
  if (p->s[p->i] == '0' && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9') return p->err = 1, -1; /* no leading 0 */
  while (p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  return p->i > st ? 0 : -1;
}

static int jp_value(jp *p) {
  jp_ws(p);
  char c = p->s[p->i];
  if (c == '{') {
    p->i++;
    jp_ws(p);
    if (p->s[p->i] == '}') return p->i++, 0;
    for (;;) {
      jp_ws(p);
      if (jp_string(p, NULL, 0) != 0) return -1;
      jp_ws(p);
      if (p->s[p->i++] != ':') return p->err = 1, -1;
      if (jp_value(p) != 0) return -1;
      jp_ws(p);
      c = p->s[p->i++];
      if (c == '}') return 0;
      if (c != ',') return p->err = 1, -1;
    }
  }
  if (c == '[') {
    p->i++;
    jp_ws(p);
    if (p->s[p->i] == ']') return p->i++, 0;
    for (;;) {
      if (jp_value(p) != 0) return -1;
      jp_ws(p);
      c = p->s[p->i++];
      if (c == ']') return 0;
      if (c != ',') return p->err = 1, -1;
    }
  }
  if (c == '"') return jp_string(p, NULL, 0);
  if (!strncmp(p->s + p->i, "true", 4) || !strncmp(p->s + p->i, "null", 4)) return p->i += 4, 0;
  if (!strncmp(p->s + p->i, "false", 5)) return p->i += 5, 0;
  return jp_number(p);
}

/* 1 when text is exactly one JSON value (plus whitespace). */
static int json_valid(const char *text) {
  jp p = {text, 0, 0};
  if (jp_value(&p) != 0 || p.err) return 0;
  jp_ws(&p);
  return text[p.i] == '\0';
}

/* Find the value of `key` in the object starting at text[*at] (must be '{'); sets *at to the value. */
static int json_member(const char *text, size_t *at, const char *key) {
  jp p = {text, *at, 0};
  jp_ws(&p);
  if (text[p.i] != '{') return -1;
  p.i++;
  for (;;) {
    jp_ws(&p);
    if (text[p.i] == '}') return -1;
    char k[128];
    if (jp_string(&p, k, sizeof k) != 0) return -1;
    jp_ws(&p);
    if (text[p.i++] != ':') return -1;
    jp_ws(&p);
    if (!strcmp(k, key)) {
      *at = p.i;
      return 0;
    }
    if (jp_value(&p) != 0) return -1;
    jp_ws(&p);
    if (text[p.i] == ',') p.i++;
  }
}

/* The idx-th element of the array at text[*at]. */
static int json_element(const char *text, size_t *at, size_t idx) {
  jp p = {text, *at, 0};
  jp_ws(&p);
  if (text[p.i] != '[') return -1;
  p.i++;
  for (size_t k = 0;; k++) {
    jp_ws(&p);
    if (text[p.i] == ']') return -1;
    if (k == idx) {
      *at = p.i;
      return 0;
    }
    if (jp_value(&p) != 0) return -1;
    jp_ws(&p);
    if (text[p.i] == ',') p.i++;
  }
}

/* Array length at text[at]. */
static size_t json_length(const char *text, size_t at) {
  for (size_t n = 0;; n++) {
    size_t el = at;
    if (json_element(text, &el, n) != 0) return n;
  }
}

static uint64_t json_u64(const char *text, size_t at) {
  assert_true(text[at] >= '0' && text[at] <= '9');
  return strtoull(text + at, NULL, 10);
}

/* ---------------------------------------------------------------------- */

typedef struct fdesc {
  const char *name;
  size_t off;
  int counter;
} fdesc;
#define FD(n, c) {#n, offsetof(gpumem_stats, n), c}
static const fdesc k_fields[] = {
    FD(allocated_bytes, 0), FD(allocated_peak, 0),    FD(reserved_bytes, 0),     FD(reserved_peak, 0),
    FD(cached_bytes, 0),    FD(num_allocs, 1),        FD(num_frees, 1),          FD(num_live, 0),
    FD(num_segments, 0),    FD(num_backend_allocs, 1), FD(num_backend_frees, 1), FD(num_trims, 1),
    FD(trimmed_bytes, 1),   FD(num_oom_retries, 1),   FD(num_ooms, 1),           FD(requested_bytes, 0),
    FD(num_limit_exceeded, 1), FD(num_share_asks, 1), FD(num_share_asked, 1),   FD(share_given_bytes, 1),
};
#define NF (sizeof k_fields / sizeof k_fields[0])

static uint64_t fget(const gpumem_stats *s, size_t i) {
  uint64_t v;
  memcpy(&v, (const char *)s + k_fields[i].off, sizeof v);
  return v;
}

/* Format into a malloc'd buffer of exactly the needed size. */
static char *format(gpumem_context *ctx, int device, gpumem_stats_format_kind kind) {
  size_t need = 0;
  assert_status(gpumem_stats_format(ctx, device, kind, NULL, 0, &need), GPUMEM_OK);
  assert_true(need > 1);
  char *buf = malloc(need);
  assert_non_null(buf);
  size_t need2 = 0;
  assert_status(gpumem_stats_format(ctx, device, kind, buf, need, &need2), GPUMEM_OK);
  assert_int_equal(need2, need);
  assert_int_equal(strlen(buf), need - 1);
  return buf;
}

/* Every field of the object at text[at] equals s. */
static void check_json_fields(const char *text, size_t at, const gpumem_stats *s) {
  for (size_t i = 0; i < NF; i++) {
    size_t v = at;
    if (json_member(text, &v, k_fields[i].name) != 0) fail_msg("JSON lacks %s: %s", k_fields[i].name, text);
    if (json_u64(text, v) != fget(s, i))
      fail_msg("JSON %s = %llu, stats %llu", k_fields[i].name, (unsigned long long)json_u64(text, v),
               (unsigned long long)fget(s, i));
  }
}

static void test_json_one_device(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a, *b;
  assert_status(gpumem_alloc(ctx, 0, 1000, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 0, 3 * TU_MiB, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  char *text = format(ctx, 0, GPUMEM_STATS_JSON);
  assert_true(json_valid(text));
  gpumem_stats s = tu_stats(ctx, 0);
  check_json_fields(text, 0, &s);
  size_t at = 0;
  assert_int_equal(json_member(text, &at, "device"), 0);
  assert_int_equal(json_u64(text, at), 0);
  at = 0;
  assert_int_equal(json_member(text, &at, "backend"), 0);
  char name[64];
  jp p = {text, at, 0};
  assert_int_equal(jp_string(&p, name, sizeof name), 0);
  assert_string_equal(name, gpumem_backend_name(ctx));
  at = 0;
  assert_int_not_equal(json_member(text, &at, "struct_size"), 0);
  at = 0;
  assert_int_not_equal(json_member(text, &at, "reserved_"), 0);
  free(text);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

static void test_json_all_devices(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_SIM_DEVICES", "3x1GiB");
  gpumem_context *ctx = tu_ctx_new(NULL);
  /* before any allocation: no device has a pool, the total is all zeros */
  char *text = format(ctx, GPUMEM_ALL_DEVICES, GPUMEM_STATS_JSON);
  assert_true(json_valid(text));
  size_t at = 0;
  assert_int_equal(json_member(text, &at, "devices"), 0);
  assert_int_equal(json_length(text, at), 0);
  free(text);

  void *a, *b, *c;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 2, 5 * TU_MiB, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 2, 777, NULL, &c), GPUMEM_OK);
  text = format(ctx, GPUMEM_ALL_DEVICES, GPUMEM_STATS_JSON);
  assert_true(json_valid(text));
  at = 0;
  assert_int_equal(json_member(text, &at, "devices"), 0);
  size_t arr = at;
  assert_int_equal(json_length(text, arr), 2); /* devices 0 and 2: the ones with a pool */
  int want_dev[2] = {0, 2};
  for (size_t k = 0; k < 2; k++) {
    size_t el = arr;
    assert_int_equal(json_element(text, &el, k), 0);
    size_t d = el;
    assert_int_equal(json_member(text, &d, "device"), 0);
    assert_int_equal(json_u64(text, d), want_dev[k]);
    gpumem_stats s = tu_stats(ctx, want_dev[k]);
    check_json_fields(text, el, &s);
  }
  at = 0;
  assert_int_equal(json_member(text, &at, "total"), 0);
  gpumem_stats all = tu_stats(ctx, GPUMEM_ALL_DEVICES);
  check_json_fields(text, at, &all);
  free(text);
  /* one device without a pool: zeros, still one object */
  text = format(ctx, 1, GPUMEM_STATS_JSON);
  assert_true(json_valid(text));
  gpumem_stats zero;
  memset(&zero, 0, sizeof zero);
  check_json_fields(text, 0, &zero);
  free(text);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

/* ---------------------------------------------------------------------- */
/* Prometheus                                                              */

static regex_t re_help, re_type, re_sample;

static void compile_res(void) {
  assert_int_equal(regcomp(&re_help, "^# HELP (gpumem_[a-z_]+) [^\n]+$", REG_EXTENDED), 0);
  assert_int_equal(regcomp(&re_type, "^# TYPE (gpumem_[a-z_]+) (gauge|counter)$", REG_EXTENDED), 0);
  assert_int_equal(regcomp(&re_sample,
                           "^(gpumem_[a-z_]+)\\{backend=\"(([^\"\\\\]|\\\\[\"\\\\n])*)\",device=\"([0-9]+)\"\\} ([0-9]+)$",
                           REG_EXTENDED),
                   0);
}

static void free_res(void) {
  regfree(&re_help);
  regfree(&re_type);
  regfree(&re_sample);
}

static void sub(const char *line, const regmatch_t *m, char *out, size_t cap) {
  size_t n = (size_t)(m->rm_eo - m->rm_so);
  assert_true(n < cap);
  memcpy(out, line + m->rm_so, n);
  out[n] = '\0';
}

/* Check every line; compare each sample with stats[device] (ndev entries); count samples. */
static int check_prometheus(const char *text, const gpumem_stats *stats, int ndev, const char *backend_escaped) {
  char *copy = strdup(text);
  assert_non_null(copy);
  assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
  char family[128] = "", type[16] = "";
  int state = 0; /* 0: expect HELP, 1: expect TYPE, 2: samples or HELP */
  int samples = 0, families = 0;
  char *save = NULL;
  for (char *line = strtok_r(copy, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
    regmatch_t m[8];
    char name[128];
    if (regexec(&re_help, line, 8, m, 0) == 0) {
      assert_true(state != 1);
      sub(line, &m[1], family, sizeof family);
      state = 1;
      families++;
      continue;
    }
    if (regexec(&re_type, line, 8, m, 0) == 0) {
      assert_int_equal(state, 1);
      sub(line, &m[1], name, sizeof name);
      assert_string_equal(name, family);
      sub(line, &m[2], type, sizeof type);
      /* counters and only counters end in _total */
      size_t fl = strlen(family);
      int total = fl > 6 && !strcmp(family + fl - 6, "_total");
      assert_int_equal(total, !strcmp(type, "counter"));
      state = 2;
      continue;
    }
    if (regexec(&re_sample, line, 8, m, 0) != 0) fail_msg("not an exposition-format line: '%s'", line);
    assert_int_equal(state, 2);
    sub(line, &m[1], name, sizeof name);
    assert_string_equal(name, family);
    char be[128], dev[16], val[32];
    sub(line, &m[2], be, sizeof be);
    assert_string_equal(be, backend_escaped);
    sub(line, &m[4], dev, sizeof dev);
    sub(line, &m[5], val, sizeof val);
    int d = atoi(dev);
    assert_true(d >= 0 && d < ndev);
    /* the field: family minus "gpumem_" and "_total" */
    char field[128];
    snprintf(field, sizeof field, "%s", family + 7);
    size_t fl = strlen(field);
    if (!strcmp(type, "counter")) field[fl - 6] = '\0';
    size_t i;
    for (i = 0; i < NF; i++)
      if (!strcmp(k_fields[i].name, field)) break;
    if (i == NF) fail_msg("unknown metric %s", family);
    assert_int_equal(k_fields[i].counter, !strcmp(type, "counter"));
    assert_true(strtoull(val, NULL, 10) == fget(&stats[d], i));
    samples++;
  }
  assert_int_equal(families, (int)NF);
  free(copy);
  return samples;
}

static void test_prometheus(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  tu_setenv("GPUMEM_SIM_DEVICES", "2x1GiB");
  compile_res();
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a, *b;
  assert_status(gpumem_alloc(ctx, 1, 12345, NULL, &a), GPUMEM_OK);
  assert_status(gpumem_alloc(ctx, 1, 2 * TU_MiB, NULL, &b), GPUMEM_OK);
  assert_status(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  assert_status(gpumem_trim(ctx, 1, 0, NULL), GPUMEM_OK);
  gpumem_stats st[2] = {tu_stats(ctx, 0), tu_stats(ctx, 1)};
  /* all devices: only device 1 has a pool, one sample per family */
  char *text = format(ctx, GPUMEM_ALL_DEVICES, GPUMEM_STATS_PROMETHEUS);
  assert_int_equal(check_prometheus(text, st, 2, "sim"), (int)NF);
  assert_non_null(strstr(text, "# TYPE gpumem_reserved_bytes gauge\n"));
  assert_non_null(strstr(text, "# TYPE gpumem_num_allocs_total counter\n"));
  assert_non_null(strstr(text, "gpumem_num_allocs_total{backend=\"sim\",device=\"1\"} 2\n"));
  assert_non_null(strstr(text, "gpumem_requested_bytes{backend=\"sim\",device=\"1\"} 12345\n"));
  free(text);
  /* device 0 on its own: zeros */
  text = format(ctx, 0, GPUMEM_STATS_PROMETHEUS);
  assert_int_equal(check_prometheus(text, st, 2, "sim"), (int)NF);
  free(text);
  void *c;
  assert_status(gpumem_alloc(ctx, 0, 100, NULL, &c), GPUMEM_OK);
  st[0] = tu_stats(ctx, 0);
  text = format(ctx, GPUMEM_ALL_DEVICES, GPUMEM_STATS_PROMETHEUS);
  assert_int_equal(check_prometheus(text, st, 2, "sim"), 2 * (int)NF);
  free(text);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  assert_status(gpumem_free(ctx, c, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  free_res();
}

/* A custom backend (the sim under another name) whose name needs escaping. */
static void test_escaping(void **state) {
  (void)state;
  TU_REQUIRE_SIM();
  compile_res();
  gpumem_backend be = *gpumem_builtin_backend("sim");
  be.name = "we\"ird\\name";
  gpumem_config cfg;
  tu_config(&cfg);
  cfg.custom_backend = &be;
  gpumem_context *ctx = tu_ctx_new(&cfg);
  void *a;
  assert_status(gpumem_alloc(ctx, 0, 256, NULL, &a), GPUMEM_OK);
  char *text = format(ctx, GPUMEM_ALL_DEVICES, GPUMEM_STATS_JSON);
  assert_true(json_valid(text));
  assert_non_null(strstr(text, "\"backend\":\"we\\\"ird\\\\name\""));
  free(text);
  gpumem_stats st = tu_stats(ctx, 0);
  text = format(ctx, 0, GPUMEM_STATS_PROMETHEUS);
  assert_int_equal(check_prometheus(text, &st, 1, "we\\\"ird\\\\name"), (int)NF);
  free(text);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
  free_res();
}

static void test_sizes_and_errors(void **state) {
  (void)state;
  gpumem_context *ctx = tu_ctx_new(NULL);
  void *a;
  assert_status(gpumem_alloc(ctx, 0, 4096, NULL, &a), GPUMEM_OK);
  for (int kind = 0; kind < 2; kind++) {
    gpumem_stats_format_kind k = (gpumem_stats_format_kind)kind;
    char *full = format(ctx, 0, k);
    size_t need = strlen(full) + 1;
    /* too small by one: truncated, NUL-terminated, *needed set, INVALID_ARGUMENT */
    char *small = malloc(need);
    assert_non_null(small);
    memset(small, 'x', need);
    size_t got = 0;
    assert_status(gpumem_stats_format(ctx, 0, k, small, need - 1, &got), GPUMEM_ERR_INVALID_ARGUMENT);
    assert_int_equal(got, need);
    assert_int_equal(strlen(small), need - 2);
    assert_memory_equal(small, full, need - 2);
    assert_true(small[need - 1] == 'x'); /* nothing written past len */
    /* len 1: the empty string */
    got = 0;
    assert_status(gpumem_stats_format(ctx, 0, k, small, 1, &got), GPUMEM_ERR_INVALID_ARGUMENT);
    assert_int_equal(got, need);
    assert_int_equal(small[0], '\0');
    /* a buffer and len 0: nothing written, too small */
    small[0] = 'y';
    assert_status(gpumem_stats_format(ctx, 0, k, small, 0, &got), GPUMEM_ERR_INVALID_ARGUMENT);
    assert_int_equal(small[0], 'y');
    /* bigger than needed; needed may be NULL */
    char big[8192];
    assert_true(need < sizeof big);
    assert_status(gpumem_stats_format(ctx, 0, k, big, sizeof big, NULL), GPUMEM_OK);
    assert_string_equal(big, full);
    free(small);
    free(full);
  }
  char buf[16];
  size_t need = 0;
  assert_status(gpumem_stats_format(NULL, 0, GPUMEM_STATS_JSON, buf, sizeof buf, &need), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_stats_format(ctx, 0, (gpumem_stats_format_kind)7, buf, sizeof buf, &need),
                GPUMEM_ERR_INVALID_ARGUMENT);
  assert_status(gpumem_stats_format(ctx, 0, GPUMEM_STATS_JSON, NULL, 5, &need), GPUMEM_ERR_INVALID_ARGUMENT);
  int n = 0;
  assert_status(gpumem_device_count(ctx, &n), GPUMEM_OK);
  assert_status(gpumem_stats_format(ctx, n, GPUMEM_STATS_JSON, buf, sizeof buf, &need), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_stats_format(ctx, -2, GPUMEM_STATS_JSON, buf, sizeof buf, &need), GPUMEM_ERR_INVALID_DEVICE);
  assert_status(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TU_TEST(test_json_one_device), TU_TEST(test_json_all_devices), TU_TEST(test_prometheus),
      TU_TEST(test_escaping),        TU_TEST(test_sizes_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
