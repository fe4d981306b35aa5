/*
 * gpu_oom: out of memory with real memory, then trim and retry.
 *
 * The pool takes most of the device in CHUNK-sized blocks until the device is
 * out of memory (the last request must fail with GPUMEM_ERR_OUT_OF_MEMORY,
 * not crash or leave a CUDA error behind). Every block is freed: the memory
 * stays cached in the pool, so the device is still full. A request of a
 * different, larger size cannot be carved from the cached blocks and does not
 * fit in what is free: it must succeed anyway, because the pool trims its
 * cache and retries. Its memory is then written and read back.
 */
#include "gpu_util.h"

#define CHUNK (2 * GIB)
#define MAXB 1024

int main(void) {
  require_gpu("gpu_oom");
  gpumem_config cfg;
  gpumem_context *ctx;
  static void *p[MAXB];
  int n = 0, i;
  gpumem_status st = GPUMEM_OK;
  uint64_t f0, total, f_full, f_after;
  void *big = NULL;
  double t0;

  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));
  mem_info(0, &f0, &total);
  printf("device 0: %.3f GiB free of %.3f GiB at start\n", gib(f0), gib(total));

  gpumem_config_init(&cfg);
  cfg.trim_free_fraction = 0.0; /* only the out-of-memory path may trim here */
  ctx = make_ctx(&cfg);

  t0 = now_s();
  while (n < MAXB) {
    st = gpumem_alloc(ctx, 0, CHUNK, NULL, &p[n]);
    if (st != GPUMEM_OK) break;
    n++;
  }
  printf("took %d blocks of %.0f GiB (%.3f GiB) in %.2f s; next request: %s\n", n, gib(CHUNK), gib((uint64_t)n * CHUNK),
         now_s() - t0, gpumem_status_name(st));
  CHECK_ST(st, GPUMEM_ERR_OUT_OF_MEMORY);
  CHECK(cudaGetLastError() == cudaSuccess); /* the backend cleared the runtime's error */
  CHECK((uint64_t)n * CHUNK > total / 2);
  {
    gpumem_stats s = stats_of(ctx, 0);
    printf("stats after OOM: num_ooms %llu, num_oom_retries %llu\n", (unsigned long long)s.num_ooms,
           (unsigned long long)s.num_oom_retries);
    CHECK(s.num_ooms >= 1);
  }

  for (i = 0; i < n; i++) CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  CUDA_OK(cudaDeviceSynchronize());
  mem_info(0, &f_full, NULL);
  {
    gpumem_stats s = stats_of(ctx, 0);
    printf("all freed: pool caches %.3f GiB, device free %.3f GiB\n", gib(s.cached_bytes), gib(f_full));
    CHECK(s.cached_bytes >= (uint64_t)n * CHUNK);
  }

  /* larger than one cached block, larger than what is free */
  uint64_t want = CHUNK + CHUNK / 2 + 4096;
  CHECK(f_full < want);
  t0 = now_s();
  st = gpumem_alloc(ctx, 0, want, NULL, &big);
  printf("request of %.3f GiB with the device full of cached blocks: %s in %.3f s\n", gib(want), gpumem_status_name(st),
         now_s() - t0);
  CHECK_ST(st, GPUMEM_OK);
  {
    gpumem_stats s = stats_of(ctx, 0);
    printf("stats: num_oom_retries %llu, num_trims %llu, trimmed %.3f GiB, reserved %.3f GiB\n",
           (unsigned long long)s.num_oom_retries, (unsigned long long)s.num_trims, gib(s.trimmed_bytes),
           gib(s.reserved_bytes));
  }
  if (big) {
    fill(big, want, 77, 0);
    unsigned long long bad = check(big, want, 77, 0);
    printf("wrote and read back the block: %llu wrong bytes\n", bad);
    CHECK(bad == 0);
    CHECK_ST(gpumem_free(ctx, big, NULL), GPUMEM_OK);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  mem_info(0, &f_after, NULL);
  printf("after destroy: %.3f GiB free (start: %.3f GiB)\n", gib(f_after), gib(f0));
  CHECK(f_after + 64 * MIB >= f0);
  return finish("gpu_oom");
}
