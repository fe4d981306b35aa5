/*
 * gpu_stream_churn: a stream per request, on the real device. Each request
 * creates a stream, allocates on it, writes the memory with a kernel, frees
 * it on that stream, and destroys the stream (without synchronising it: the
 * library must never name a destroyed stream). The pool's stream records
 * must stay bounded (they are dropped once a stream has nothing left in the
 * pool), later blocks must read back what was written into them (stream
 * order across the churn), and every status is OK. Prints the figures.
 */
#include "gpu_util.h"

extern "C" size_t gpumem__stream_records(gpumem_context *ctx, int device); /* internal, for tests */

int main(int argc, char **argv) {
  require_gpu("gpu_stream_churn");
  const int requests = argc > 1 ? atoi(argv[1]) : 20000;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  gpumem_context *ctx = make_ctx(&cfg);
  CUDA_OK(cudaSetDevice(0));
  size_t most = 0;
  unsigned long long bad = 0;
  double t0 = now_s();
  for (int i = 0; i < requests; i++) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p = NULL;
    const uint64_t n = (i % 7 == 0) ? 3 * MIB : 64 * 1024; /* pool path and thread-cache path */
    CHECK_ST(gpumem_alloc(ctx, 0, (size_t)n, (gpumem_stream)s, &p), GPUMEM_OK);
    if (p) {
      fill(p, n, (uint32_t)i, s);
      if (i % 1000 == 0) bad += check(p, n, (uint32_t)i, s);
      CHECK_ST(gpumem_free(ctx, p, (gpumem_stream)s), GPUMEM_OK);
    }
    CUDA_OK(cudaStreamDestroy(s));
    size_t r = gpumem__stream_records(ctx, 0);
    if (r > most) most = r;
  }
  CUDA_OK(cudaDeviceSynchronize());
  double dt = now_s() - t0;
  /* blocks freed on destroyed streams are reused by the default stream once their work completed */
  void *q = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, NULL, &q), GPUMEM_OK);
  if (q) {
    fill(q, 64 * MIB, 99, 0);
    bad += check(q, 64 * MIB, 99, 0);
    CHECK_ST(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  }
  uint64_t rel = 0;
  CHECK_ST(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  size_t after = gpumem__stream_records(ctx, 0);
  gpumem_stats st = stats_of(ctx, 0);
  printf("%d requests (a stream each) in %.2f s: at most %zu stream records, %zu after trim, "
         "reserved peak %.2f GiB, %llu wrong bytes\n",
         requests, dt, most, after, gib(st.reserved_peak), bad);
  CHECK(most <= 256);
  CHECK(after <= 1);
  CHECK(bad == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return finish("gpu_stream_churn");
}
