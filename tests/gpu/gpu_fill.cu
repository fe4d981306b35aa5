/*
 * gpu_fill: blocks from the pool are real, distinct device memory.
 *
 * Many blocks of mixed sizes (256 B .. 1 GiB, odd sizes too) are taken from
 * one context; a kernel writes every byte of every block with a pattern
 * seeded by the block's index, then a second kernel reads every byte of every
 * block back. Any overlap between blocks, a pointer that is not device
 * memory, or a short block shows up as wrong bytes. Then half the blocks are
 * freed and allocated again (split/coalesced memory gets reused) and the whole
 * check runs again.
 */
#include "gpu_util.h"

#define NB 600

int main(void) {
  require_gpu("gpu_fill");
  gpumem_config cfg;
  gpumem_context *ctx;
  static void *ptr[NB];
  static uint64_t size[NB];
  uint64_t total = 0, seed_state = 12345;
  unsigned long long bad = 0;
  cudaStream_t s;
  int i, round;

  gpumem_config_init(&cfg);
  ctx = make_ctx(&cfg);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  for (i = 0; i < NB; i++) {
    seed_state = seed_state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = seed_state >> 33;
    if (i % 100 == 99) size[i] = GIB + (r % 4096);           /* big, odd sizes */
    else if (i % 10 == 9) size[i] = (r % (64 * MIB)) + 1;    /* medium */
    else size[i] = (r % (1 * MIB)) + 1;                       /* small */
    CHECK_ST(gpumem_alloc(ctx, 0, size[i], (gpumem_stream)s, &ptr[i]), GPUMEM_OK);
    CHECK(ptr[i] != NULL);
    CHECK(((uintptr_t)ptr[i] % 256) == 0);
    total += size[i];
  }
  printf("allocated %d blocks, %.3f GiB requested\n", NB, gib(total));

  for (round = 0; round < 2; round++) {
    double t0 = now_s();
    for (i = 0; i < NB; i++)
      if (ptr[i]) fill(ptr[i], size[i], (uint32_t)(i * 7919 + round), s);
    bad = 0;
    for (i = 0; i < NB; i++)
      if (ptr[i]) bad += check(ptr[i], size[i], (uint32_t)(i * 7919 + round), s);
    printf("round %d: wrote and read back %.3f GiB, %llu wrong bytes (%.2f s)\n", round, gib(total), bad,
           now_s() - t0);
    CHECK(bad == 0);
    /* free every other block (in order on s), allocate them again with other sizes */
    total = 0;
    for (i = 0; i < NB; i += 2) {
      CHECK_ST(gpumem_free(ctx, ptr[i], (gpumem_stream)s), GPUMEM_OK);
      ptr[i] = NULL;
    }
    for (i = 0; i < NB; i += 2) {
      size[i] = size[i] / 2 + 1 + (uint64_t)(i % 3) * 4096;
      CHECK_ST(gpumem_alloc(ctx, 0, size[i], (gpumem_stream)s, &ptr[i]), GPUMEM_OK);
    }
    for (i = 0; i < NB; i++) total += size[i];
  }

  {
    gpumem_stats st = stats_of(ctx, 0);
    printf("stats: allocated %.3f GiB, reserved %.3f GiB, segments %llu, backend allocs %llu\n",
           gib(st.allocated_bytes), gib(st.reserved_bytes), (unsigned long long)st.num_segments,
           (unsigned long long)st.num_backend_allocs);
    CHECK(st.num_live == NB);
  }
  for (i = 0; i < NB; i++) CHECK_ST(gpumem_free(ctx, ptr[i], (gpumem_stream)s), GPUMEM_OK);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  CUDA_OK(cudaStreamDestroy(s));
  return finish("gpu_fill");
}
