/*
 * gpu_trim: cached memory really goes back to the device.
 *
 * 1. gpumem_trim: blocks freed into the cache are still used memory for the
 *    device (cudaMemGetInfo); gpumem_trim(keep) gives back all but `keep`
 *    bytes, and cudaMemGetInfo's free memory grows by what trim reported.
 * 2. release_threshold: a pool that may cache 1 GiB keeps no more.
 * 3. trim_free_fraction: the pool caches 16 GiB; a plain cudaMalloc outside
 *    the pool then pushes the device's free memory under 10 % of its total;
 *    the next growth of the pool must give the cached memory back.
 */
#include "gpu_util.h"

static void trim_explicit(void) {
  gpumem_config cfg;
  gpumem_context *ctx;
  void *p[8];
  uint64_t f0, f1, f2, f3, released = 0;
  int i;
  gpumem_config_init(&cfg);
  ctx = make_ctx(&cfg);
  mem_info(0, &f0, NULL);
  for (i = 0; i < 8; i++) CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &p[i]), GPUMEM_OK);
  for (i = 0; i < 8; i++) CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  mem_info(0, &f1, NULL);
  gpumem_stats s = stats_of(ctx, 0);
  printf("trim: 8 x 1 GiB freed: cached %.3f GiB; device free %.3f -> %.3f GiB\n", gib(s.cached_bytes), gib(f0), gib(f1));
  CHECK(s.cached_bytes >= 8 * GIB);
  CHECK(f0 - f1 >= 8 * GIB - 64 * MIB); /* cached memory is still taken from the device */

  CHECK_ST(gpumem_trim(ctx, 0, 2 * GIB, &released), GPUMEM_OK);
  mem_info(0, &f2, NULL);
  s = stats_of(ctx, 0);
  printf("trim(keep 2 GiB): released %.3f GiB; cached now %.3f GiB; device free %.3f GiB (+%.3f)\n", gib(released),
         gib(s.cached_bytes), gib(f2), gib(f2 - f1));
  CHECK(s.cached_bytes <= 2 * GIB);
  CHECK(released >= 6 * GIB);
  CHECK(f2 - f1 + 64 * MIB >= released && f2 - f1 <= released + 64 * MIB);

  CHECK_ST(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, &released), GPUMEM_OK);
  mem_info(0, &f3, NULL);
  s = stats_of(ctx, 0);
  printf("trim(ALL, keep 0): released %.3f GiB; reserved %.3f GiB; device free %.3f GiB (start %.3f)\n", gib(released),
         gib(s.reserved_bytes), gib(f3), gib(f0));
  CHECK(s.reserved_bytes == 0);
  CHECK(f3 + 64 * MIB >= f0);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

static void release_threshold(void) {
  gpumem_config cfg;
  gpumem_context *ctx;
  void *p[4];
  uint64_t f0, f1;
  int i;
  gpumem_config_init(&cfg);
  cfg.release_threshold = GIB;
  ctx = make_ctx(&cfg);
  mem_info(0, &f0, NULL);
  for (i = 0; i < 4; i++) CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &p[i]), GPUMEM_OK);
  for (i = 0; i < 4; i++) CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  CHECK_ST(gpumem_trim(ctx, 0, UINT64_MAX, NULL), GPUMEM_OK); /* waits for pending frees; keeps everything */
  mem_info(0, &f1, NULL);
  gpumem_stats s = stats_of(ctx, 0);
  printf("release_threshold 1 GiB: 4 x 1 GiB freed: cached %.3f GiB, device free %.3f -> %.3f GiB\n",
         gib(s.cached_bytes), gib(f0), gib(f1));
  CHECK(s.cached_bytes <= GIB);
  CHECK(f0 - f1 <= GIB + 64 * MIB);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

static void free_fraction(void) {
  gpumem_config cfg;
  gpumem_context *ctx;
  void *p[4], *q = NULL, *ext = NULL;
  uint64_t f0, total, f1, f2, f3;
  int i;
  gpumem_config_init(&cfg);
  cfg.trim_free_fraction = 0.10;
  /* plain segments: 4 GiB segments cannot serve the 5 GiB request below, so the
   * pool grows, which is when the free fraction is checked. With expandable
   * segments the four freed blocks coalesce and serve it without growing
   * (no check is due then); tests/test_trim.c covers that mode on sim. */
  cfg.expandable = 0;
  ctx = make_ctx(&cfg);
  mem_info(0, &f0, &total);
  for (i = 0; i < 4; i++) CHECK_ST(gpumem_alloc(ctx, 0, 4 * GIB, NULL, &p[i]), GPUMEM_OK);
  for (i = 0; i < 4; i++) CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  gpumem_stats s0 = stats_of(ctx, 0);
  mem_info(0, &f1, NULL);
  /* someone else takes memory until only 6 % of the device is free */
  uint64_t leave = (uint64_t)(0.06 * (double)total);
  uint64_t take = f1 > leave ? f1 - leave : 0;
  CUDA_OK(cudaMalloc(&ext, take));
  mem_info(0, &f2, NULL);
  printf("fraction: pool caches %.3f GiB; outside cudaMalloc of %.3f GiB leaves %.3f GiB free (%.1f %% of %.3f GiB)\n",
         gib(s0.cached_bytes), gib(take), gib(f2), 100.0 * (double)f2 / (double)total, gib(total));
  CHECK(s0.cached_bytes >= 16 * GIB);
  CHECK(f2 < total / 10);
  /* a request the cache cannot serve (larger than any cached block): the pool grows */
  CHECK_ST(gpumem_alloc(ctx, 0, 5 * GIB, NULL, &q), GPUMEM_OK);
  mem_info(0, &f3, NULL);
  gpumem_stats s1 = stats_of(ctx, 0);
  printf("after growing by 5 GiB: cached %.3f GiB, trims %llu, trimmed %.3f GiB, device free %.3f GiB\n",
         gib(s1.cached_bytes), (unsigned long long)s1.num_trims, gib(s1.trimmed_bytes), gib(f3));
  CHECK(s1.trimmed_bytes - s0.trimmed_bytes >= 15 * GIB);
  CHECK(f3 >= f2 + 10 * GIB);
  CHECK_ST(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  CUDA_OK(cudaFree(ext));
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
}

int main(void) {
  require_gpu("gpu_trim");
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));
  trim_explicit();
  release_threshold();
  free_fraction();
  CHECK(cudaGetLastError() == cudaSuccess);
  return finish("gpu_trim");
}
