/*
 * gpu_reset: gpumem_reset with and without GPUMEM_RESET_DEVICE.
 *
 * Without the flag: every live block is invalidated (a later free gives
 * GPUMEM_ERR_INVALID_POINTER), all the pool's memory goes back to the device
 * (cudaMemGetInfo), and the pool works again afterwards.
 * With the flag: cudaDeviceReset also runs, so even memory taken outside the
 * pool (a plain cudaMalloc) comes back; the backend then re-activates the
 * device's primary context and the pool works again (data written and read).
 */
#include "gpu_util.h"

/* Allocate, write and read back, free; on the default stream (a stream the
 * test destroyed must not hold freed blocks: see gpu_stream_destroy). */
static void use_pool(gpumem_context *ctx, const char *when) {
  void *p = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 512 * MIB + 12345, NULL, &p), GPUMEM_OK);
  if (p) {
    fill(p, 512 * MIB + 12345, 99, 0);
    unsigned long long bad = check(p, 512 * MIB + 12345, 99, 0);
    printf("%s: pool block written and read back, %llu wrong bytes\n", when, bad);
    CHECK(bad == 0);
    CHECK_ST(gpumem_free(ctx, p, NULL), GPUMEM_OK);
  }
  CUDA_OK(cudaDeviceSynchronize());
}

int main(void) {
  require_gpu("gpu_reset");
  gpumem_config cfg;
  gpumem_context *ctx;
  void *p[3], *ext = NULL;
  uint64_t f0, f1, f2, f3, f4, total;
  int i;

  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));
  mem_info(0, &f0, &total);
  gpumem_config_init(&cfg);
  ctx = make_ctx(&cfg);

  for (i = 0; i < 3; i++) {
    CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &p[i]), GPUMEM_OK);
    fill(p[i], GIB, (uint32_t)i, 0);
  }
  CUDA_OK(cudaDeviceSynchronize());
  mem_info(0, &f1, NULL);
  CHECK_ST(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  mem_info(0, &f2, NULL);
  gpumem_stats s = stats_of(ctx, 0);
  printf("reset(0): device free %.3f -> %.3f GiB (start %.3f); reserved %.3f GiB, live %llu\n", gib(f1), gib(f2), gib(f0),
         gib(s.reserved_bytes), (unsigned long long)s.num_live);
  CHECK(f2 + 64 * MIB >= f0);
  CHECK(s.reserved_bytes == 0 && s.num_live == 0);
  for (i = 0; i < 3; i++) CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_ERR_INVALID_POINTER);
  use_pool(ctx, "after reset(0)");

  /* GPUMEM_RESET_DEVICE: also memory outside the pool goes */
  CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &p[0]), GPUMEM_OK);
  CUDA_OK(cudaMalloc(&ext, 2 * GIB));
  mem_info(0, &f3, NULL);
  CHECK_ST(gpumem_reset(ctx, 0, GPUMEM_RESET_DEVICE), GPUMEM_OK);
  CHECK(cudaGetLastError() == cudaSuccess);
  CUDA_OK(cudaFree(0)); /* the test's own runtime state comes back */
  mem_info(0, &f4, NULL);
  s = stats_of(ctx, 0);
  printf("reset(0, RESET_DEVICE): device free %.3f -> %.3f GiB (start %.3f); reserved %.3f GiB\n", gib(f3), gib(f4),
         gib(f0), gib(s.reserved_bytes));
  CHECK(f4 + 64 * MIB >= f0);
  CHECK(s.reserved_bytes == 0);
  CHECK_ST(gpumem_free(ctx, p[0], NULL), GPUMEM_ERR_INVALID_POINTER);
  use_pool(ctx, "after reset(0, RESET_DEVICE)");

  /* a second device reset in a row, then use again */
  CHECK_ST(gpumem_reset(ctx, GPUMEM_ALL_DEVICES, GPUMEM_RESET_DEVICE), GPUMEM_OK);
  use_pool(ctx, "after reset(ALL, RESET_DEVICE)");
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return finish("gpu_reset");
}
