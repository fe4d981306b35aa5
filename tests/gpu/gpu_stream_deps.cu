/*
 * gpu_stream_deps: stream_deps (GPUMEM_STREAM_DEPS=1) on a real device.
 *
 * Expandable segments, two streams A and B. On A: blocks LO, P (128 MiB) and HI; a kernel on A
 * spins for SPIN, then writes 0x22 over P; P is freed on A while it spins. B then asks for R
 * (128 MiB), past the pool's peak: with stream_deps B takes P's memory (R overlaps P, the pool does
 * not grow), and B's later work waits on the device for A's kernel (cudaStreamWaitEvent). R is
 * filled with 0x33 on B right away, so R must read 0x33 at the end: had B's fill run before A's
 * kernel finished, the kernel's 0x22 would be there. The host never waits for A meanwhile.
 */
#include "gpu_util.h"

#define SPIN_NS 300000000ull /* 0.3 s */

int main(void) {
  require_gpu("gpu_stream_deps");
  CUDA_OK(cudaSetDevice(0));
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.expandable = 1;
  cfg.stream_deps = 1;
  gpumem_context *ctx = make_ctx(&cfg);
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  gpumem_stream sa = (gpumem_stream)a, sb = (gpumem_stream)b;

  void *t = NULL, *lo = NULL, *p = NULL, *hi = NULL, *r = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, MIB, sb, &t), GPUMEM_OK); /* a second stream: frees are stream-ordered */
  CHECK_ST(gpumem_free(ctx, t, sb), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, sa, &lo), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 128 * MIB, sa, &p), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, sa, &hi), GPUMEM_OK);
  if (!lo || !p || !hi) return finish("gpu_stream_deps");
  fill(p, 128 * MIB, 0x11, a);
  k_spin_then_fill<<<264, 256, 0, a>>>((unsigned char *)p, 128 * MIB, 0x22, SPIN_NS);
  CUDA_OK(cudaGetLastError());
  CHECK_ST(gpumem_free(ctx, p, sa), GPUMEM_OK); /* the kernel still spins */
  uint64_t held0 = stats_of(ctx, 0).reserved_bytes;
  double t0 = now_s();
  CHECK_ST(gpumem_alloc(ctx, 0, 128 * MIB, sb, &r), GPUMEM_OK);
  double took = now_s() - t0;
  uint64_t grew = stats_of(ctx, 0).reserved_bytes - held0;
  if (r) fill(r, 128 * MIB, 0x33, b);
  int spinning = cudaStreamQuery(a) == cudaErrorNotReady;
  (void)cudaGetLastError();
  printf("128 MiB on B after A freed 128 MiB still in use: the pool grew by %.0f MiB, R %s P, the "
         "allocation took %.1f ms, A's kernel %s\n",
         (double)grew / MIB, r && overlaps(r, 128 * MIB, p, 128 * MIB) ? "overlaps" : "is apart from", took * 1e3,
         spinning ? "still spinning" : "already done");
  CHECK(spinning);
  CHECK(took < 0.2); /* no host wait for A's 0.3 s kernel */
  CHECK(grew == 0);
  CHECK(r && overlaps(r, 128 * MIB, p, 128 * MIB));
  CUDA_OK(cudaDeviceSynchronize());
  unsigned long long bad = r ? check(r, 128 * MIB, 0x33, b) : 0;
  CUDA_OK(cudaDeviceSynchronize());
  printf("wrong bytes in R: %llu\n", bad);
  CHECK(bad == 0);
  void *all[] = {lo, hi, r};
  gpumem_stream on[] = {sa, sa, sb};
  for (int i = 0; i < 3; i++)
    if (all[i]) CHECK_ST(gpumem_free(ctx, all[i], on[i]), GPUMEM_OK);
  CUDA_OK(cudaDeviceSynchronize());
  uint64_t rel = 0;
  CHECK_ST(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  CHECK(stats_of(ctx, 0).reserved_bytes == 0);
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return finish("gpu_stream_deps");
}
