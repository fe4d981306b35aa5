/* Per-device work and cleanup across CUDA_VISIBLE_DEVICES.
 *
 * Device numbers in libgpumem are the visible ordinals, after
 * CUDA_VISIBLE_DEVICES. This example prints the mapping from visible ordinal
 * to physical device and UUID (what nvidia-smi shows), allocates on every
 * visible device in reverse order, and cleans up device by device: trim
 * frees the cache of one device without touching the others. No pool is
 * ever created on a device that was not named.
 *
 * ctest runs it on the simulator as
 *   CUDA_VISIBLE_DEVICES=1,0 GPUMEM_SIM_DEVICES=16GiB,8GiB example_multi_device
 * so visible device 0 is physical device 1 (8 GiB). When CUDA_VISIBLE_DEVICES
 * lists plain ordinals the example checks the mapping against it.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpumem.h>

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    gpumem_status st_ = (call);                                                                        \
    if (st_ != GPUMEM_OK) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpumem_status_name(st_));          \
      exit(EXIT_FAILURE);                                                                              \
    }                                                                                                  \
  } while (0)

#define MAXDEV 16

/* Parses CUDA_VISIBLE_DEVICES when it is a list of plain ordinals; returns their count, or -1. */
static int parse_visible(int *ord, int max) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v || !*v) return -1;
  int n = 0;
  const char *p = v;
  while (*p && n < max) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0) return -1; /* a UUID or something else: no check */
    ord[n++] = (int)x;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return n;
}

static void device_stats(gpumem_context *ctx, int d, gpumem_stats *st) {
  st->struct_size = sizeof *st;
  CHECK(gpumem_get_stats(ctx, d, st));
}

int main(void) {
  setenv("GPUMEM_BACKEND", "sim", 0);
  setenv("GPUMEM_SIM_DEVICES", "16GiB,8GiB", 0);

  gpumem_context *ctx;
  CHECK(gpumem_create(NULL, &ctx));
  int ndev = 0;
  CHECK(gpumem_device_count(ctx, &ndev));
  if (ndev > MAXDEV) ndev = MAXDEV;
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  printf("backend %s, CUDA_VISIBLE_DEVICES=%s, %d visible device(s)\n", gpumem_backend_name(ctx),
         cvd ? cvd : "(unset)", ndev);

  int expect[MAXDEV];
  int nexpect = parse_visible(expect, MAXDEV);
  int bad = 0;
  printf("visible  physical  uuid                                      pci bus id     total\n");
  for (int d = 0; d < ndev; d++) {
    gpumem_device_info info = {.struct_size = sizeof info};
    CHECK(gpumem_device_get_info(ctx, d, &info));
    printf("%7d  %8d  %-40s  %-13s  %.1f GiB\n", d, info.physical_index, info.uuid, info.pci_bus_id,
           info.total_bytes / 1073741824.0);
    if (d < nexpect && info.physical_index >= 0 && info.physical_index != expect[d]) {
      fprintf(stderr, "visible device %d should be physical device %d\n", d, expect[d]);
      bad = 1;
    }
  }
  if (bad) return EXIT_FAILURE;

  /* Allocate on the last device first: no other device gets a pool. */
  void *p[MAXDEV][4];
  for (int d = ndev - 1; d >= 0; d--) {
    for (int i = 0; i < 4; i++) CHECK(gpumem_alloc(ctx, d, (size_t)(d + 1) * (16u << 20), NULL, &p[d][i]));
    if (d == ndev - 1 && ndev > 1) {
      gpumem_stats s0;
      device_stats(ctx, 0, &s0);
      printf("after allocating on device %d only: device 0 reserved %" PRIu64 " bytes\n", d, s0.reserved_bytes);
      if (s0.reserved_bytes != 0) return EXIT_FAILURE;
    }
  }
  for (int d = 0; d < ndev; d++)
    for (int i = 0; i < 4; i++) CHECK(gpumem_free(ctx, p[d][i], NULL));

  /* Clean up one device at a time; the others keep their cache. */
  for (int d = 0; d < ndev; d++) {
    uint64_t released = 0;
    CHECK(gpumem_trim(ctx, d, 0, &released));
    gpumem_stats s;
    device_stats(ctx, d, &s);
    printf("device %d: trim gave back %.0f MiB, reserved now %" PRIu64, d, released / 1048576.0, s.reserved_bytes);
    if (d + 1 < ndev) {
      gpumem_stats next;
      device_stats(ctx, d + 1, &next);
      printf(", device %d still caches %.0f MiB", d + 1, next.cached_bytes / 1048576.0);
      if (next.cached_bytes == 0) return EXIT_FAILURE;
    }
    printf("\n");
    if (s.reserved_bytes != 0) return EXIT_FAILURE;
  }
  CHECK(gpumem_destroy(ctx, 0));
  return EXIT_SUCCESS;
}
