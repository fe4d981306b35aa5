/*
 * gpu_streams: stream-ordered reuse is safe, proven with the data.
 *
 * A block X is allocated on stream A; a kernel on A spins for SPIN seconds
 * and then writes pattern 0xA.. into X; X is freed on A right away, while
 * that kernel still runs. Then a block of the same size is allocated on
 * stream B and a kernel on B writes pattern 0xB.. into it at once.
 * After both streams finish, the B block must hold B's pattern everywhere:
 * had the pool handed X to B before A's kernel ended, A's late write would
 * show. Three setups:
 *   1. default config (the pool may grow a new block for B);
 *   2. a limit that leaves no room for a second block, so B can only get X
 *      (after waiting for A's work) or fail with LIMIT_EXCEEDED/OUT_OF_MEMORY;
 *   3. same stream: a new allocation on A may get X at once (ordered after
 *      the kernel on A), and A's next kernel's pattern must be the result.
 * Also measures how long each allocation took and whether A was still busy.
 */
#include "gpu_util.h"

#define SIZE (256 * MIB)
#define SPIN_NS 1500000000ull

static void one(const char *name, uint64_t limit, int same_stream) {
  gpumem_config cfg;
  gpumem_context *ctx;
  cudaStream_t a, b;
  void *x = NULL, *y = NULL;
  double t0, t_free, t_alloc;
  gpumem_status st;
  cudaError_t q_after_free, q_after_alloc;

  gpumem_config_init(&cfg);
  cfg.limit_bytes = limit;
  ctx = make_ctx(&cfg);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

  CHECK_ST(gpumem_alloc(ctx, 0, SIZE, (gpumem_stream)a, &x), GPUMEM_OK);
  if (!x) return;
  k_spin_then_fill<<<264, 256, 0, a>>>((unsigned char *)x, SIZE, 0xA1, SPIN_NS);
  CUDA_OK(cudaGetLastError());
  t0 = now_s();
  CHECK_ST(gpumem_free(ctx, x, (gpumem_stream)a), GPUMEM_OK);
  t_free = now_s() - t0;
  q_after_free = cudaStreamQuery(a);
  (void)cudaGetLastError();
  CHECK(q_after_free == cudaErrorNotReady); /* the kernel still runs: the setup is meaningful */

  cudaStream_t s2 = same_stream ? a : b;
  uint32_t seed2 = same_stream ? 0xC3 : 0xB2;
  t0 = now_s();
  st = gpumem_alloc(ctx, 0, SIZE, (gpumem_stream)s2, &y);
  t_alloc = now_s() - t0;
  q_after_alloc = cudaStreamQuery(a);
  (void)cudaGetLastError();
  printf("%s: free took %.3f ms; second alloc on %s: %s in %.3f ms, %s X, stream A %s when it returned\n", name,
         t_free * 1e3, same_stream ? "A" : "B", gpumem_status_name(st), t_alloc * 1e3,
         y == x ? "reused" : "did not reuse", q_after_alloc == cudaErrorNotReady ? "still busy" : "idle");
  if (st == GPUMEM_OK) {
    fill(y, SIZE, seed2, s2);
    CUDA_OK(cudaStreamSynchronize(s2));
    CUDA_OK(cudaStreamSynchronize(a));
    unsigned long long bad = check(y, SIZE, seed2, s2);
    printf("%s: %llu of %llu bytes of the second block are wrong\n", name, bad, (unsigned long long)SIZE);
    CHECK(bad == 0);
    CHECK_ST(gpumem_free(ctx, y, (gpumem_stream)s2), GPUMEM_OK);
  } else {
    CHECK(limit != 0 && (st == GPUMEM_ERR_LIMIT_EXCEEDED || st == GPUMEM_ERR_OUT_OF_MEMORY));
    CUDA_OK(cudaStreamSynchronize(a));
  }
  if (same_stream && st == GPUMEM_OK) CHECK(y == x || t_alloc < 1.0); /* no needless wait on the same stream */
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
}

int main(void) {
  require_gpu("gpu_streams");
  one("default", 0, 0);
  one("tight-limit", SIZE + SIZE / 2, 0);
  one("same-stream", 0, 1);
  return finish("gpu_streams");
}
