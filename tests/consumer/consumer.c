/* An external program using an installed libgpumem (C API), on the sim backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpumem.h>
#include <gpumem/backend.h>

int main(void) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  gpumem_context *ctx = NULL;
  gpumem_status st = gpumem_create(&cfg, &ctx);
  if (st != GPUMEM_OK) {
    fprintf(stderr, "gpumem_create: %s\n", gpumem_status_name(st));
    return 1;
  }
  if (gpumem_builtin_backend("sim") == NULL) return 2;
  void *p = NULL;
  if (gpumem_alloc(ctx, 0, 1 << 20, NULL, &p) != GPUMEM_OK || p == NULL) return 3;
  memset(p, 1, 1 << 20); /* sim memory is host memory */
  if (gpumem_free(ctx, p, NULL) != GPUMEM_OK) return 4;
  uint64_t released = 0;
  if (gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, &released) != GPUMEM_OK || released == 0) return 5;
  if (gpumem_destroy(ctx, 0) != GPUMEM_OK) return 6;
  printf("consumer (C): libgpumem %d.%d.%d, backend sim, trim gave back %llu bytes\n", GPUMEM_VERSION_MAJOR,
         GPUMEM_VERSION_MINOR, GPUMEM_VERSION_PATCH, (unsigned long long)released);
  return 0;
}
