/* options.c: config defaults, validation and the GPUMEM_* environment.
 *
 * The option table below is the one place that names each option, its
 * environment variable and its default; gpumem_config_init() takes the
 * defaults from it and the README table is written from it. */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GPUMEM__OPT(field, env, kind, def, doc)                                                   \
  {                                                                                               \
    #field, env, kind, def, doc, offsetof(gpumem_config, field), offsetof(gpumem__options, field) \
  }

/* log_level lives in gpumem__options::log.level */
#define GPUMEM__OPT_LOG(field, env, kind, def, doc)                                                       \
  {                                                                                                       \
    #field, env, kind, def, doc, offsetof(gpumem_config, field), offsetof(gpumem__options, log) +          \
                                                                     offsetof(gpumem__logger, level)      \
  }

static const gpumem__option_desc gpumem__options_tab[] = {
    GPUMEM__OPT(backend, "GPUMEM_BACKEND", GPUMEM__OPT_STRING, "auto",
                "backend: auto (cuda, then hip, then sim), cuda, hip or sim"),
    GPUMEM__OPT(release_threshold, "GPUMEM_RELEASE_THRESHOLD", GPUMEM__OPT_BYTES_INF, "unlimited",
                "cached free bytes a device pool may keep"),
    GPUMEM__OPT(trim_free_fraction, "GPUMEM_TRIM_FREE_FRACTION", GPUMEM__OPT_FRACTION, "0.10",
                "give cached memory back when device free memory falls below this fraction of total (0 disables)"),
    GPUMEM__OPT(limit_bytes, "GPUMEM_LIMIT_BYTES", GPUMEM__OPT_BYTES_NONE, "0",
                "hard cap on bytes reserved per device (0 = none)"),
    GPUMEM__OPT(limit_fraction, "GPUMEM_LIMIT_FRACTION", GPUMEM__OPT_FRACTION, "0",
                "hard cap as a fraction of device total (0 = none)"),
    GPUMEM__OPT(initial_bytes, "GPUMEM_INITIAL_BYTES", GPUMEM__OPT_BYTES, "0",
                "bytes preallocated on a device's first use and kept cached"),
    GPUMEM__OPT_LOG(log_level, "GPUMEM_LOG", GPUMEM__OPT_LOG_LEVEL, "warn",
                    "debug, info, warn, error or off; when set, messages go to stderr unless a log callback is installed"),
    GPUMEM__OPT(expandable, "GPUMEM_EXPANDABLE", GPUMEM__OPT_BOOL, "1",
                "1: expandable virtual-memory segments (physical chunks mapped on demand) where the backend supports them; 0: plain segments"),
    GPUMEM__OPT(share, "GPUMEM_SHARE", GPUMEM__OPT_SHARE, "user",
                "shared GPUs: user (this user's processes on the same GPU give each other cached memory), off, or a group name"),
    GPUMEM__OPT(share_wait_ms, "GPUMEM_SHARE_WAIT_MS", GPUMEM__OPT_MS, "300",
                "milliseconds an allocation that found no device memory waits for the group's members to give cached memory back"),
    GPUMEM__OPT(watch_interval_ms, "GPUMEM_WATCH_MS", GPUMEM__OPT_MS, "200",
                "milliseconds between free-memory checks while no pool grows (calls and a watcher thread); 0 = none"),
    GPUMEM__OPT(stream_deps, "GPUMEM_STREAM_DEPS", GPUMEM__OPT_BOOL, "0",
                "1: before growing past its peak (or moving idle chunks), a stream may take memory other streams freed that the device has not reached, "
                "its later work ordered after theirs on the device; 0: only memory whose work has completed"),
    GPUMEM__OPT(peak_headroom, "GPUMEM_PEAK_HEADROOM", GPUMEM__OPT_FRACTION, "0",
                "expandable pools: new memory may go this fraction past the peak of live bytes before idle chunks are moved "
                "(memory for the driver calls of moves); 0: as little as possible"),
    GPUMEM__OPT(capture_probe, "GPUMEM_CAPTURE_PROBE", GPUMEM__OPT_BOOL, "1",
                "1: an allocation or free on a stream other than NULL asks the backend whether the stream is being captured, "
                "so that a capture nobody routed to a graph pool gets one of its own; 0: only routed captures are known"),
};

const gpumem__option_desc *gpumem__options_table(size_t *count) {
  if (count != NULL) *count = sizeof gpumem__options_tab / sizeof gpumem__options_tab[0];
  return gpumem__options_tab;
}

/* ---------------------------------------------------------------------- */
/* Parsers                                                                 */

static const char *skip_ws(const char *s) {
  while (*s != '\0' && isspace((unsigned char)*s)) s++;
  return s;
}

/* Copy s without surrounding whitespace into buf; -1 if too long. */
static int trimmed(const char *s, char *buf, size_t cap) {
  s = skip_ws(s);
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
  if (n >= cap) return -1;
  memcpy(buf, s, n);
  buf[n] = '\0';
  return 0;
}

int gpumem__parse_bytes(const char *s, int allow_inf, uint64_t *out) {
  char buf[128];
  if (s == NULL || trimmed(s, buf, sizeof buf) != 0 || buf[0] == '\0') return -1;
  if (allow_inf && (strcasecmp(buf, "unlimited") == 0 || strcasecmp(buf, "inf") == 0 ||
                    strcasecmp(buf, "infinity") == 0)) {
    *out = UINT64_MAX;
    return 0;
  }
  const char *p = buf;
  if (!isdigit((unsigned char)*p)) return -1; /* no sign, no empty number */
  uint64_t ip = 0;
  while (isdigit((unsigned char)*p)) {
    unsigned d = (unsigned)(*p - '0');
    if (ip > (UINT64_MAX - d) / 10) return -1;
    ip = ip * 10 + d;
    p++;
  }
  /* optional fraction: up to 18 digits are kept */
  uint64_t fnum = 0, fden = 1;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p)) return -1;
    while (isdigit((unsigned char)*p)) {
      if (fden < 1000000000000000000ull) {
        fnum = fnum * 10 + (uint64_t)(*p - '0');
        fden *= 10;
      }
      p++;
    }
  }
  p = skip_ws(p);
  uint64_t mult = 1;
  static const struct {
    const char *sfx;
    unsigned shift;
  } sfx[] = {{"", 0},    {"b", 0},    {"k", 10},   {"kb", 10}, {"kib", 10}, {"m", 20},
             {"mb", 20}, {"mib", 20}, {"g", 30},   {"gb", 30}, {"gib", 30}, {"t", 40},
             {"tb", 40}, {"tib", 40}, {"p", 50},   {"pb", 50}, {"pib", 50}};
  size_t i;
  for (i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
    if (strcasecmp(p, sfx[i].sfx) == 0) {
      mult = (uint64_t)1 << sfx[i].shift;
      break;
    }
  }
  if (i == sizeof sfx / sizeof sfx[0]) return -1;
  if (ip > UINT64_MAX / mult) return -1;
  uint64_t v = ip * mult;
  if (fnum != 0) {
    /* fnum/fden < 1, so fnum*mult/fden < mult; compute without overflow */
    long double extra = (long double)fnum * (long double)mult / (long double)fden;
    uint64_t e = (uint64_t)extra;
    if (v > UINT64_MAX - e) return -1;
    v += e;
  }
  *out = v;
  return 0;
}

static int parse_fraction(const char *s, double *out) {
  char buf[128];
  if (s == NULL || trimmed(s, buf, sizeof buf) != 0 || buf[0] == '\0') return -1;
  char *end = NULL;
  errno = 0;
  double v = strtod(buf, &end);
  if (end == buf || *end != '\0' || errno == ERANGE) return -1;
  if (!isfinite(v) || v < 0.0 || v > 1.0) return -1;
  *out = v;
  return 0;
}

static int parse_bool(const char *s, int *out) {
  char buf[16];
  if (s == NULL || trimmed(s, buf, sizeof buf) != 0) return -1;
  static const char *const yes[] = {"1", "on", "true", "yes"}, *const no[] = {"0", "off", "false", "no"};
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    if (strcasecmp(buf, yes[i]) == 0) {
      *out = 1;
      return 0;
    }
    if (strcasecmp(buf, no[i]) == 0) {
      *out = 0;
      return 0;
    }
  }
  return -1;
}

/* A group name: letters, digits, '.', '_', '-' (it becomes part of a shared-memory object's name). */
int gpumem__share_name_ok(const char *s) {
  size_t n = 0;
  for (; s[n] != '\0'; n++) {
    char c = s[n];
    if (!(isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-')) return 0;
    if (n >= 48) return 0;
  }
  return n > 0;
}

static int parse_share(const char *s, char out[64]) {
  char buf[64];
  if (s == NULL || trimmed(s, buf, sizeof buf) != 0 || !gpumem__share_name_ok(buf)) return -1;
  if (strcasecmp(buf, "user") == 0) memcpy(buf, "user", 5);
  else if (strcasecmp(buf, "off") == 0 || strcmp(buf, "0") == 0 || strcasecmp(buf, "none") == 0) memcpy(buf, "off", 4);
  memcpy(out, buf, sizeof buf);
  return 0;
}

static int parse_ms(const char *s, uint32_t *out) {
  char buf[32];
  if (s == NULL || trimmed(s, buf, sizeof buf) != 0 || !isdigit((unsigned char)buf[0])) return -1;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(buf, &end, 10);
  if (errno == ERANGE) return -1;
  const char *u = skip_ws(end);
  if (strcasecmp(u, "s") == 0) {
    if (v > 86400ull) return -1;
    v *= 1000ull;
  } else if (*u != '\0' && strcasecmp(u, "ms") != 0) {
    return -1;
  }
  if (v > 86400000ull) return -1;
  *out = (uint32_t)v;
  return 0;
}

static int parse_log_level(const char *s, gpumem_log_level *out) {
  char buf[32];
  if (s == NULL || trimmed(s, buf, sizeof buf) != 0) return -1;
  static const struct {
    const char *name;
    gpumem_log_level level;
  } names[] = {{"debug", GPUMEM_LOG_DEBUG}, {"info", GPUMEM_LOG_INFO}, {"warn", GPUMEM_LOG_WARN},
               {"warning", GPUMEM_LOG_WARN}, {"error", GPUMEM_LOG_ERROR}, {"off", GPUMEM_LOG_OFF},
               {"none", GPUMEM_LOG_OFF},    {"0", GPUMEM_LOG_DEBUG},     {"1", GPUMEM_LOG_INFO},
               {"2", GPUMEM_LOG_WARN},      {"3", GPUMEM_LOG_ERROR},     {"4", GPUMEM_LOG_OFF}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcasecmp(buf, names[i].name) == 0) {
      *out = names[i].level;
      return 0;
    }
  }
  return -1;
}

/* Parse text for option d into dst (a field of kind d->kind). */
static int parse_option(const gpumem__option_desc *d, const char *text, void *dst) {
  switch (d->kind) {
    case GPUMEM__OPT_STRING: {
      char buf[64];
      if (trimmed(text, buf, sizeof buf) != 0 || buf[0] == '\0') return -1;
      memcpy(dst, buf, sizeof buf);
      return 0;
    }
    case GPUMEM__OPT_BYTES_INF:
    case GPUMEM__OPT_BYTES: {
      uint64_t v;
      if (gpumem__parse_bytes(text, d->kind == GPUMEM__OPT_BYTES_INF, &v) != 0) return -1;
      memcpy(dst, &v, sizeof v);
      return 0;
    }
    case GPUMEM__OPT_BYTES_NONE: {
      char buf[32];
      uint64_t v;
      if (trimmed(text, buf, sizeof buf) == 0 &&
          (strcasecmp(buf, "none") == 0 || strcasecmp(buf, "unlimited") == 0 || strcasecmp(buf, "inf") == 0 ||
           strcasecmp(buf, "off") == 0)) {
        v = 0;
      } else if (gpumem__parse_bytes(text, 0, &v) != 0) {
        return -1;
      }
      memcpy(dst, &v, sizeof v);
      return 0;
    }
    case GPUMEM__OPT_FRACTION: {
      double v;
      if (parse_fraction(text, &v) != 0) return -1;
      memcpy(dst, &v, sizeof v);
      return 0;
    }
    case GPUMEM__OPT_LOG_LEVEL: {
      gpumem_log_level v;
      if (parse_log_level(text, &v) != 0) return -1;
      memcpy(dst, &v, sizeof v);
      return 0;
    }
    case GPUMEM__OPT_BOOL: {
      int v;
      if (parse_bool(text, &v) != 0) return -1;
      memcpy(dst, &v, sizeof v);
      return 0;
    }
    case GPUMEM__OPT_SHARE: return parse_share(text, dst);
    case GPUMEM__OPT_MS: {
      uint32_t v;
      if (parse_ms(text, &v) != 0) return -1;
      memcpy(dst, &v, sizeof v);
      return 0;
    }
  }
  return -1;
}

static const char *kind_expect(gpumem__opt_kind k) {
  switch (k) {
    case GPUMEM__OPT_STRING: return "a backend name";
    case GPUMEM__OPT_BYTES_INF: return "a byte count (e.g. 512MiB, 2G, 4096) or \"unlimited\"";
    case GPUMEM__OPT_BYTES_NONE: return "a byte count (e.g. 512MiB, 2G, 4096), 0 or \"none\"";
    case GPUMEM__OPT_BYTES: return "a byte count (e.g. 512MiB, 2G, 4096)";
    case GPUMEM__OPT_FRACTION: return "a number between 0 and 1";
    case GPUMEM__OPT_LOG_LEVEL: return "one of debug, info, warn, error, off";
    case GPUMEM__OPT_BOOL: return "1 or 0 (on/off, true/false, yes/no)";
    case GPUMEM__OPT_SHARE: return "user, off, or a group name (letters, digits, '.', '_', '-'; at most 48)";
    case GPUMEM__OPT_MS: return "milliseconds (e.g. 250, 250ms, 2s; at most a day)";
  }
  return "?";
}

/* ---------------------------------------------------------------------- */
/* Config                                                                  */

void gpumem_config_init(gpumem_config *cfg) {
  if (cfg == NULL) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->struct_size = (uint32_t)sizeof *cfg;
  size_t n;
  const gpumem__option_desc *tab = gpumem__options_table(&n);
  for (size_t i = 0; i < n; i++) {
    const gpumem__option_desc *d = &tab[i];
    if (d->kind == GPUMEM__OPT_STRING || d->kind == GPUMEM__OPT_SHARE) continue; /* NULL: "auto", "user" */
    (void)parse_option(d, d->default_text, (char *)cfg + d->cfg_offset);
  }
}

/* Smallest struct_size accepted: struct_size and flags. An older caller's
 * struct is a prefix: members that lie wholly within struct_size are read,
 * the rest keep their defaults. */
#define GPUMEM__CONFIG_MIN_SIZE (offsetof(gpumem_config, flags) + sizeof(uint32_t))

gpumem_status gpumem__options_resolve(const gpumem_config *cfg_in, gpumem__options *opt) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  if (cfg_in != NULL) {
    size_t n = cfg_in->struct_size;
    if (n < GPUMEM__CONFIG_MIN_SIZE || n > sizeof(gpumem_config)) return GPUMEM_ERR_INVALID_ARGUMENT;
#define GPUMEM__TAKE(m) \
  if (offsetof(gpumem_config, m) + sizeof cfg.m <= n) memcpy(&cfg.m, &cfg_in->m, sizeof cfg.m)
    GPUMEM__TAKE(flags);
    GPUMEM__TAKE(backend);
    GPUMEM__TAKE(custom_backend);
    GPUMEM__TAKE(release_threshold);
    GPUMEM__TAKE(trim_free_fraction);
    GPUMEM__TAKE(limit_bytes);
    GPUMEM__TAKE(limit_fraction);
    GPUMEM__TAKE(initial_bytes);
    GPUMEM__TAKE(oom_callback);
    GPUMEM__TAKE(oom_user);
    GPUMEM__TAKE(log_callback);
    GPUMEM__TAKE(log_user);
    GPUMEM__TAKE(log_level);
    GPUMEM__TAKE(expandable);
    GPUMEM__TAKE(share);
    GPUMEM__TAKE(share_wait_ms);
    GPUMEM__TAKE(watch_interval_ms);
    GPUMEM__TAKE(stream_deps);
    GPUMEM__TAKE(peak_headroom);
    GPUMEM__TAKE(capture_probe);
#undef GPUMEM__TAKE
  }

  gpumem__options o;
  memset(&o, 0, sizeof o);
  o.log.fn = cfg.log_callback;
  o.log.user = cfg.log_user;
  o.log.level = cfg.log_level;
  o.log.to_stderr = 0;

  /* values of the config itself */
  if ((cfg.flags & ~(uint32_t)GPUMEM_CONFIG_NO_ENV) != 0) {
    gpumem__log(&o.log, GPUMEM_LOG_WARN, "gpumem_config.flags has unknown bits 0x%x", (unsigned)cfg.flags);
    return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  if ((int)cfg.log_level < (int)GPUMEM_LOG_DEBUG || (int)cfg.log_level > (int)GPUMEM_LOG_OFF) {
    o.log.level = GPUMEM_LOG_WARN;
    gpumem__log(&o.log, GPUMEM_LOG_WARN, "gpumem_config.log_level %d is not a log level", (int)cfg.log_level);
    return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  { /* every fraction of the option table (trim_free_fraction, limit_fraction, peak_headroom) */
    size_t nt;
    const gpumem__option_desc *tab = gpumem__options_table(&nt);
    for (size_t i = 0; i < nt; i++) {
      if (tab[i].kind != GPUMEM__OPT_FRACTION) continue;
      double v;
      memcpy(&v, (const char *)&cfg + tab[i].cfg_offset, sizeof v);
      if (!isfinite(v) || v < 0.0 || v > 1.0) {
        gpumem__log(&o.log, GPUMEM_LOG_WARN, "gpumem_config.%s must be in [0, 1]", tab[i].field);
        return GPUMEM_ERR_INVALID_ARGUMENT;
      }
    }
  }
  const char *bname = cfg.backend != NULL ? cfg.backend : "auto";
  if (strlen(bname) >= sizeof o.backend) {
    memcpy(o.backend, "<name too long>", sizeof "<name too long>");
  } else {
    memcpy(o.backend, bname, strlen(bname) + 1);
  }
  o.custom_backend = cfg.custom_backend;
  o.release_threshold = cfg.release_threshold;
  o.trim_free_fraction = cfg.trim_free_fraction;
  o.limit_bytes = cfg.limit_bytes;
  o.limit_fraction = cfg.limit_fraction;
  o.initial_bytes = cfg.initial_bytes;
  o.oom_callback = cfg.oom_callback;
  o.oom_user = cfg.oom_user;
  o.flags = cfg.flags;
  o.expandable = cfg.expandable != 0;
  o.stream_deps = cfg.stream_deps != 0;
  o.peak_headroom = cfg.peak_headroom;
  o.capture_probe = cfg.capture_probe != 0;
  if (parse_share(cfg.share != NULL ? cfg.share : "user", o.share) != 0) {
    gpumem__log(&o.log, GPUMEM_LOG_WARN,
                "gpumem_config.share \"%.64s\" is invalid: expected user, off, or a group name (letters, digits, "
                "'.', '_', '-'; at most 48)", cfg.share);
    return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  if (cfg.share_wait_ms > 86400000u || cfg.watch_interval_ms > 86400000u) {
    gpumem__log(&o.log, GPUMEM_LOG_WARN, "gpumem_config.share_wait_ms and watch_interval_ms must be at most a day");
    return GPUMEM_ERR_INVALID_ARGUMENT;
  }
  o.share_wait_ms = cfg.share_wait_ms;
  o.watch_interval_ms = cfg.watch_interval_ms;

  if ((cfg.flags & GPUMEM_CONFIG_NO_ENV) == 0) {
    size_t n;
    const gpumem__option_desc *tab = gpumem__options_table(&n);
    /* GPUMEM_LOG first, so that the other variables are reported where it asks */
    for (int pass = 0; pass < 2; pass++) {
      for (size_t i = 0; i < n; i++) {
        const gpumem__option_desc *d = &tab[i];
        if ((pass == 0) != (d->kind == GPUMEM__OPT_LOG_LEVEL)) continue;
        const char *v = getenv(d->env);
        if (v == NULL || *skip_ws(v) == '\0') continue; /* unset or empty: no override */
        if (parse_option(d, v, (char *)&o + d->opt_offset) != 0) {
          gpumem__log(&o.log, GPUMEM_LOG_WARN, "environment variable %s=\"%.64s\" is invalid: expected %s", d->env, v,
                      kind_expect(d->kind));
          return GPUMEM_ERR_INVALID_ARGUMENT;
        }
        if (d->kind == GPUMEM__OPT_LOG_LEVEL) o.log.to_stderr = (o.log.fn == NULL);
      }
    }
  }
  *opt = o;
  return GPUMEM_OK;
}

uint64_t gpumem__options_limit(const gpumem__options *opt, uint64_t total) {
  uint64_t lim = opt->limit_bytes;
  if (opt->limit_fraction > 0.0 && total > 0) {
    double f = opt->limit_fraction * (double)total;
    uint64_t fl = f >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)f;
    if (lim == 0 || fl < lim) lim = fl;
    if (lim == 0) lim = 1; /* a tiny fraction still means "a limit" */
  }
  return lim;
}
