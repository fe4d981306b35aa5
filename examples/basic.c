/* The main job of libgpumem, on two devices: allocate, free (memory stays
 * cached for reuse), trim (cached memory goes back to the driver), reset
 * (every allocation of a device invalidated, all its memory given back),
 * with statistics after each step.
 *
 * Without a GPU it runs on the simulator: if GPUMEM_SIM_DEVICES is not set it
 * simulates two devices of 16 GiB. On a machine with GPUs, GPUMEM_BACKEND=cuda
 * runs the same program on the first two visible devices.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <gpumem.h>

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    gpumem_status st_ = (call);                                                                        \
    if (st_ != GPUMEM_OK) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, gpumem_status_name(st_),      \
              gpumem_strerror(st_));                                                                   \
      exit(EXIT_FAILURE);                                                                              \
    }                                                                                                  \
  } while (0)

#define MiB (1024.0 * 1024.0)

static void print_stats(gpumem_context *ctx, int ndev, const char *when) {
  printf("%-28s", when);
  for (int d = 0; d < ndev; d++) {
    gpumem_stats st = {.struct_size = sizeof st};
    CHECK(gpumem_get_stats(ctx, d, &st));
    printf(" | dev %d: live %3" PRIu64 " alloc %8.1f MiB reserved %8.1f MiB cached %8.1f MiB", d, st.num_live,
           st.allocated_bytes / MiB, st.reserved_bytes / MiB, st.cached_bytes / MiB);
  }
  printf("\n");
}

int main(void) {
  setenv("GPUMEM_SIM_DEVICES", "2x16GiB", 0); /* only if unset */

  gpumem_context *ctx;
  CHECK(gpumem_create(NULL, &ctx)); /* backend "auto": cuda, hip, then sim; GPUMEM_BACKEND overrides */
  int ndev = 0;
  CHECK(gpumem_device_count(ctx, &ndev));
  if (ndev > 2) ndev = 2;
  printf("backend %s, using %d device(s)\n", gpumem_backend_name(ctx), ndev);
  for (int d = 0; d < ndev; d++) {
    gpumem_device_info info = {.struct_size = sizeof info};
    CHECK(gpumem_device_get_info(ctx, d, &info));
    printf("  device %d: %s %s, %.1f GiB total, %.1f GiB free\n", d, info.name, info.uuid,
           info.total_bytes / (MiB * 1024), info.free_bytes / (MiB * 1024));
  }

  /* 1. allocate: a few large arrays and many small ones per device */
  enum { NBIG = 4, NSMALL = 64 };
  void *big[2][NBIG], *small[2][NSMALL];
  for (int d = 0; d < ndev; d++) {
    for (int i = 0; i < NBIG; i++) CHECK(gpumem_alloc(ctx, d, (size_t)(i + 1) * 64 << 20, NULL, &big[d][i]));
    for (int i = 0; i < NSMALL; i++) CHECK(gpumem_alloc(ctx, d, 4096 + 512 * (size_t)i, NULL, &small[d][i]));
  }
  print_stats(ctx, ndev, "after allocating");

  /* 2. free: the memory stays cached in the pools */
  for (int d = 0; d < ndev; d++) {
    for (int i = 0; i < NBIG; i++) CHECK(gpumem_free(ctx, big[d][i], NULL));
    for (int i = 0; i < NSMALL; i += 2) CHECK(gpumem_free(ctx, small[d][i], NULL));
  }
  print_stats(ctx, ndev, "after freeing");

  /* reuse: the same sizes again come from the cache, not from the driver */
  gpumem_stats before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
  CHECK(gpumem_get_stats(ctx, GPUMEM_ALL_DEVICES, &before));
  for (int d = 0; d < ndev; d++) {
    for (int i = 0; i < NBIG; i++) CHECK(gpumem_alloc(ctx, d, (size_t)(i + 1) * 64 << 20, NULL, &big[d][i]));
    for (int i = 0; i < NBIG; i++) CHECK(gpumem_free(ctx, big[d][i], NULL));
  }
  CHECK(gpumem_get_stats(ctx, GPUMEM_ALL_DEVICES, &after));
  printf("reallocating %d arrays took %" PRIu64 " new backend allocations\n", NBIG * ndev,
         after.num_backend_allocs - before.num_backend_allocs);

  /* 3. trim: give the cached memory back to the driver (device 0 keeps 32 MiB) */
  uint64_t released = 0;
  CHECK(gpumem_trim(ctx, 0, 32u << 20, &released));
  printf("trim device 0 (keep 32 MiB): gave back %.1f MiB\n", released / MiB);
  if (ndev > 1) {
    CHECK(gpumem_trim(ctx, 1, 0, &released));
    printf("trim device 1 (keep 0):      gave back %.1f MiB\n", released / MiB);
  }
  print_stats(ctx, ndev, "after trimming");

  /* 4. reset: device 0's remaining live allocations are invalidated */
  CHECK(gpumem_reset(ctx, 0, 0));
  print_stats(ctx, ndev, "after reset of device 0");
  gpumem_status st = gpumem_free(ctx, small[0][1], NULL);
  printf("freeing a pointer invalidated by the reset: %s\n", gpumem_status_name(st));
  if (st != GPUMEM_ERR_INVALID_POINTER) return EXIT_FAILURE;

  /* destroy: device 1 still has live blocks, so a plain destroy reports them */
  st = gpumem_destroy(ctx, 0);
  printf("destroy with live allocations: %s\n", gpumem_status_name(st));
  if (ndev > 1 && st != GPUMEM_ERR_BUSY) return EXIT_FAILURE;
  if (st == GPUMEM_ERR_BUSY) {
    for (int i = 1; i < NSMALL; i += 2) CHECK(gpumem_free(ctx, small[1][i], NULL));
    CHECK(gpumem_get_stats(ctx, GPUMEM_ALL_DEVICES, &after));
    printf("totals: %" PRIu64 " allocations, %" PRIu64 " frees, peak reserved %.1f MiB, %" PRIu64
           " trims gave back %.1f MiB\n",
           after.num_allocs, after.num_frees, after.reserved_peak / MiB, after.num_trims, after.trimmed_bytes / MiB);
    CHECK(gpumem_destroy(ctx, 0));
  }
  printf("done\n");
  return EXIT_SUCCESS;
}
