/* log.c: level filtering and formatting; output goes to the log callback, or to
 * stderr only when GPUMEM_LOG asked for it. The library never prints otherwise. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

const char *gpumem__log_level_name(gpumem_log_level level) {
  switch (level) {
    case GPUMEM_LOG_DEBUG: return "debug";
    case GPUMEM_LOG_INFO: return "info";
    case GPUMEM_LOG_WARN: return "warn";
    case GPUMEM_LOG_ERROR: return "error";
    case GPUMEM_LOG_OFF: return "off";
  }
  return "?";
}

void gpumem__vlog(const gpumem__logger *lg, gpumem_log_level level, const char *fmt, va_list ap) {
  if (!GPUMEM__LOG_PRINTS(lg, level)) return;
  char buf[1024];
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof buf) { /* mark truncation */
    buf[sizeof buf - 4] = '.';
    buf[sizeof buf - 3] = '.';
    buf[sizeof buf - 2] = '.';
  }
  if (lg->fn != NULL) {
    lg->fn(lg->user, level, buf);
  } else {
    fprintf(stderr, "gpumem [%s] %s\n", gpumem__log_level_name(level), buf);
  }
}

void gpumem__log(const gpumem__logger *lg, gpumem_log_level level, const char *fmt, ...) {
  if (!GPUMEM__LOG_ON(lg, level)) return;
  va_list ap;
  va_start(ap, fmt);
  gpumem__vlog(lg, level, fmt, ap);
  va_end(ap);
}

void gpumem__bappend(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = (*len + (size_t)n < cap) ? *len + (size_t)n : cap - 1;
}
