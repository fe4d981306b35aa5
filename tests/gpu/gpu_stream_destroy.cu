/*
 * gpu_stream_destroy: a stream destroyed after a block was freed on it.
 *
 * A common pattern: a temporary stream, memory allocated and freed on it,
 * the stream synchronised and destroyed. The freed block stays cached in the
 * pool. A later allocation on another stream must not touch the destroyed
 * stream (recording an event on a destroyed stream is undefined behaviour in
 * CUDA and can crash). DESIGN.md: the cross-stream event is "recorded at the
 * free". The test passes if nothing crashes, every status is OK and the data
 * written into the later blocks reads back.
 */
#include "gpu_util.h"

int main(void) {
  require_gpu("gpu_stream_destroy");
  gpumem_config cfg;
  gpumem_context *ctx;
  cudaStream_t t;
  void *p = NULL, *q = NULL, *r = NULL;
  CUDA_OK(cudaSetDevice(0));
  gpumem_config_init(&cfg);
  ctx = make_ctx(&cfg);

  for (int round = 0; round < 3; round++) {
    CUDA_OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, (gpumem_stream)t, &p), GPUMEM_OK);
    fill(p, 64 * MIB, 3, t);
    CHECK_ST(gpumem_free(ctx, p, (gpumem_stream)t), GPUMEM_OK);
    CUDA_OK(cudaStreamSynchronize(t));
    CUDA_OK(cudaStreamDestroy(t));
    printf("round %d: 64 MiB freed on a stream that is now destroyed; allocating on the default stream\n", round);
    /* a miss in the cache (larger than anything cached) makes the pool look at other streams' frees */
    CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &q), GPUMEM_OK);
    CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, NULL, &r), GPUMEM_OK);
    if (q && r) {
      fill(q, GIB, 4, 0);
      fill(r, 64 * MIB, 5, 0);
      unsigned long long bad = check(q, GIB, 4, 0) + check(r, 64 * MIB, 5, 0);
      printf("round %d: later blocks written and read back, %llu wrong bytes\n", round, bad);
      CHECK(bad == 0);
    }
    CHECK_ST(gpumem_free(ctx, q, NULL), GPUMEM_OK);
    CHECK_ST(gpumem_free(ctx, r, NULL), GPUMEM_OK);
    CHECK_ST(gpumem_trim(ctx, 0, 0, NULL), GPUMEM_OK);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return finish("gpu_stream_destroy");
}
