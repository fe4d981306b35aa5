/*
 * gpu_lend: lending (src/expandable.c) on a real device, where the second mapping is real.
 *
 * Expandable segments, two streams A and B. On A: blocks LO, P (128 MiB) and HI; a kernel on A
 * spins for SPIN, then writes pattern 0x22 over P; P is freed on A while it spins. A then asks for
 * R (256 MiB), past the pool's peak: the pool lends P's memory to R (mapped a second time) instead
 * of creating 256 MiB, which the pool's reserved bytes and the driver's free memory show. R is
 * filled with 0x33 on A, after the spinning kernel in A's order, so R must read 0x33 at the end
 * although the old kernel wrote P's memory through P's address. Meanwhile blocks of P's size are
 * allocated on A and on B and filled: none may overlap P's range while A's kernel runs (P serves
 * nobody until A has passed the free), and each must keep its pattern. Once A is done, P's range
 * serves again and a trim gives everything back (the driver's free memory returns).
 */
#include "gpu_util.h"

#define SPIN_NS 300000000ull /* 0.3 s */

int main(void) {
  require_gpu("gpu_lend");
  CUDA_OK(cudaSetDevice(0));
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.expandable = 1;
  gpumem_context *ctx = make_ctx(&cfg);
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  gpumem_stream sa = (gpumem_stream)a, sb = (gpumem_stream)b;
  uint64_t free0 = 0, total = 0, free1 = 0, free2 = 0;
  mem_info(0, &free0, &total);

  void *t = NULL, *lo = NULL, *p = NULL, *hi = NULL, *r = NULL, *qa = NULL, *qb = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, MIB, sb, &t), GPUMEM_OK); /* a second stream: frees are stream-ordered */
  CHECK_ST(gpumem_free(ctx, t, sb), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, sa, &lo), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 128 * MIB, sa, &p), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 64 * MIB, sa, &hi), GPUMEM_OK);
  if (!lo || !p || !hi) return finish("gpu_lend");
  fill(p, 128 * MIB, 0x11, a);
  k_spin_then_fill<<<264, 256, 0, a>>>((unsigned char *)p, 128 * MIB, 0x22, SPIN_NS);
  CUDA_OK(cudaGetLastError());
  CHECK_ST(gpumem_free(ctx, p, sa), GPUMEM_OK); /* the kernel still spins */
  uint64_t held0 = stats_of(ctx, 0).reserved_bytes;
  CHECK_ST(gpumem_alloc(ctx, 0, 256 * MIB, sa, &r), GPUMEM_OK);
  uint64_t grew = stats_of(ctx, 0).reserved_bytes - held0;
  mem_info(0, &free1, &total);
  fill(r, 256 * MIB, 0x33, a);
  CHECK_ST(gpumem_alloc(ctx, 0, 128 * MIB, sa, &qa), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 128 * MIB, sb, &qb), GPUMEM_OK);
  int spinning = cudaStreamQuery(a) == cudaErrorNotReady;
  (void)cudaGetLastError();
  if (qa) fill(qa, 128 * MIB, 0x44, a);
  if (qb) fill(qb, 128 * MIB, 0x55, b);
  printf("256 MiB on A after A freed 128 MiB still in use: the pool grew by %.0f MiB (256 without lending), "
         "the driver's free memory fell by %.0f MiB; A's kernel %s\n",
         (double)grew / MIB, (double)(free0 - free1) / MIB - 256.0, spinning ? "still spinning" : "already done");
  CHECK(spinning);
  CHECK(grew < 200 * MIB);
  CHECK(!overlaps(r, 256 * MIB, p, 128 * MIB));
  CHECK(qa && !overlaps(qa, 128 * MIB, p, 128 * MIB));
  CHECK(qb && !overlaps(qb, 128 * MIB, p, 128 * MIB));
  CUDA_OK(cudaDeviceSynchronize());
  unsigned long long bad_r = check(r, 256 * MIB, 0x33, a);
  unsigned long long bad_qa = qa ? check(qa, 128 * MIB, 0x44, a) : 0;
  unsigned long long bad_qb = qb ? check(qb, 128 * MIB, 0x55, b) : 0;
  CUDA_OK(cudaDeviceSynchronize());
  printf("wrong bytes: R %llu, A's 128 MiB %llu, B's 128 MiB %llu\n", bad_r, bad_qa, bad_qb);
  CHECK(bad_r == 0 && bad_qa == 0 && bad_qb == 0);
  /* A is done: P's range serves again (a miss polls the parked block) */
  void *w = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 192 * MIB, sb, &w), GPUMEM_OK);
  if (w) fill(w, 192 * MIB, 0x66, b);
  CUDA_OK(cudaDeviceSynchronize());
  if (w) CHECK(check(w, 192 * MIB, 0x66, b) == 0);
  void *all[] = {lo, hi, r, qa, qb, w};
  gpumem_stream on[] = {sa, sa, sa, sa, sb, sb};
  for (int i = 0; i < 6; i++)
    if (all[i]) CHECK_ST(gpumem_free(ctx, all[i], on[i]), GPUMEM_OK);
  CUDA_OK(cudaDeviceSynchronize());
  uint64_t rel = 0;
  CHECK_ST(gpumem_trim(ctx, 0, 0, &rel), GPUMEM_OK);
  gpumem_stats s = stats_of(ctx, 0);
  mem_info(0, &free2, &total);
  printf("after trim: reserved %llu bytes, the driver's free memory %.0f MiB from where it started\n",
         (unsigned long long)s.reserved_bytes, ((double)free2 - (double)free0) / MIB);
  CHECK(s.reserved_bytes == 0);
  CHECK(free2 + 64 * MIB >= free0);
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return finish("gpu_lend");
}
