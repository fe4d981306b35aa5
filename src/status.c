/* status.c: status names and messages (from GPUMEM_STATUS_MAP). */
#include "internal.h"

#include <stdlib.h>

const char *gpumem_status_name(gpumem_status s) {
  switch (s) {
#define GPUMEM__STATUS_NAME(name, value, msg) \
  case GPUMEM_##name:                         \
    return "GPUMEM_" #name;
    GPUMEM_STATUS_MAP(GPUMEM__STATUS_NAME)
#undef GPUMEM__STATUS_NAME
    default:
      return "GPUMEM_UNKNOWN_STATUS";
  }
}

const char *gpumem_strerror(gpumem_status s) {
  switch (s) {
#define GPUMEM__STATUS_MSG(name, value, msg) \
  case GPUMEM_##name:                        \
    return msg;
    GPUMEM_STATUS_MAP(GPUMEM__STATUS_MSG)
#undef GPUMEM__STATUS_MSG
    default:
      return "unknown status code";
  }
}
