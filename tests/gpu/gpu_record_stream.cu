/*
 * gpu_record_stream: gpumem_record_stream holds while a kernel is still reading.
 *
 * For each size (4 KiB and 64 KiB: thread-cache sizes; 1 MiB and 64 MiB: pool
 * sizes; 512 MiB), with plain and with expandable segments: block X is
 * allocated on stream A and filled with pattern P there; stream B waits for A,
 * then a kernel on B spins for SPIN and only then checks X against P, counting
 * wrong bytes. X is noted on B (gpumem_record_stream) and freed on A while that
 * kernel still spins. At once, ROUNDS blocks of X's size are allocated on A,
 * and on a third stream C, and filled with other patterns: had any of them been
 * given X before B's kernel finished, B would count wrong bytes. Afterwards
 * (B done) X must be reusable again: the pool does not leak it.
 * The control repeats the case without gpumem_record_stream, which is the bug
 * record_stream exists for: it must show wrong bytes on A's reuse (or the pool
 * must not have reused X, then the control says so).
 */
#include "gpu_util.h"

#define SPIN_NS 300000000ull /* 0.3 s */
#define ROUNDS 4

__device__ unsigned long long g_late_bad;

/* Spin for `ns`, then count the bytes of [p, p+n) that differ from pattern_byte(i, seed). */
__global__ void k_spin_then_check(const unsigned char *p, uint64_t n, uint32_t seed, uint64_t ns) {
  if (threadIdx.x == 0) {
    uint64_t t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
  }
  __syncthreads();
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  unsigned long long mine = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    if (p[i] != pattern_byte(i, seed)) mine++;
  if (mine) atomicAdd(&g_late_bad, mine);
}

/* Returns the wrong bytes B's late reader saw; *reused: how many new blocks got X's address. */
static unsigned long long one(gpumem_context *ctx, uint64_t size, int note, int *reused, int *b_busy) {
  cudaStream_t a, b, c;
  cudaEvent_t ev;
  void *x = NULL, *y[2 * ROUNDS] = {0};
  unsigned long long *d = NULL, bad = 0;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_OK(cudaGetSymbolAddress((void **)&d, g_late_bad));
  CUDA_OK(cudaMemset(d, 0, sizeof *d));

  CHECK_ST(gpumem_alloc(ctx, 0, size, (gpumem_stream)a, &x), GPUMEM_OK);
  if (!x) return ~0ull;
  fill(x, size, 0x51, a);
  CUDA_OK(cudaEventRecord(ev, a));
  CUDA_OK(cudaStreamWaitEvent(b, ev, 0));
  k_spin_then_check<<<264, 256, 0, b>>>((const unsigned char *)x, size, 0x51, SPIN_NS);
  CUDA_OK(cudaGetLastError());
  if (note) CHECK_ST(gpumem_record_stream(ctx, x, (gpumem_stream)b), GPUMEM_OK);
  CHECK_ST(gpumem_free(ctx, x, (gpumem_stream)a), GPUMEM_OK);
  *reused = 0;
  for (int r = 0; r < ROUNDS; r++) {
    CHECK_ST(gpumem_alloc(ctx, 0, size, (gpumem_stream)a, &y[2 * r]), GPUMEM_OK);
    CHECK_ST(gpumem_alloc(ctx, 0, size, (gpumem_stream)c, &y[2 * r + 1]), GPUMEM_OK);
    if (y[2 * r]) fill(y[2 * r], size, 0x60 + r, a);
    if (y[2 * r + 1]) fill(y[2 * r + 1], size, 0x70 + r, c);
    *reused += (y[2 * r] == x) + (y[2 * r + 1] == x);
  }
  *b_busy = cudaStreamQuery(b) == cudaErrorNotReady; /* the reader still spun: the case means something */
  (void)cudaGetLastError();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(&bad, d, sizeof bad, cudaMemcpyDeviceToHost));
  for (int r = 0; r < 2 * ROUNDS; r++)
    if (y[r]) CHECK_ST(gpumem_free(ctx, y[r], (gpumem_stream)(r % 2 ? c : a)), GPUMEM_OK);
  CUDA_OK(cudaEventDestroy(ev));
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  CUDA_OK(cudaStreamDestroy(c));
  return bad;
}

int main(void) {
  static const uint64_t sizes[] = {4096, 64 << 10, MIB, 64 * MIB, 512 * MIB};
  int control_wrong = 0, control_reused = 0;
  require_gpu("gpu_record_stream");
  CUDA_OK(cudaSetDevice(0));
  for (int expandable = 0; expandable <= 1; expandable++) {
    gpumem_config cfg;
    gpumem_config_init(&cfg);
    cfg.expandable = expandable;
    gpumem_context *ctx = make_ctx(&cfg);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      uint64_t size = sizes[k];
      int reused = 0, busy = 0, creused = 0, cbusy = 0;
      unsigned long long bad = one(ctx, size, 1, &reused, &busy);
      printf("%s segments, %8llu bytes, noted:     reader saw %llu wrong bytes, %d of %d new blocks got X, "
             "reader %s when they were made\n", expandable ? "expandable" : "plain", (unsigned long long)size, bad,
             reused, 2 * ROUNDS, busy ? "still spinning" : "already done");
      CHECK(bad == 0);
      CHECK(reused == 0 || !busy);
      CHECK(busy);
      /* X comes back once the reader is done: a new allocation of that size is served from the cache */
      gpumem_stats s0 = stats_of(ctx, 0);
      void *z = NULL;
      CHECK_ST(gpumem_alloc(ctx, 0, size, NULL, &z), GPUMEM_OK);
      gpumem_stats s1 = stats_of(ctx, 0);
      CHECK(s1.num_backend_allocs == s0.num_backend_allocs);
      if (z) CHECK_ST(gpumem_free(ctx, z, NULL), GPUMEM_OK);
      unsigned long long cbad = one(ctx, size, 0, &creused, &cbusy);
      printf("%s segments, %8llu bytes, not noted: reader saw %llu wrong bytes, %d of %d new blocks got X (control)\n",
             expandable ? "expandable" : "plain", (unsigned long long)size, cbad, creused, 2 * ROUNDS);
      control_wrong += cbad != 0;
      control_reused += creused != 0;
    }
    CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  }
  printf("control (no record_stream): %d of %d cases reused X early, %d of them with wrong bytes seen\n",
         control_reused, 2 * (int)(sizeof sizes / sizeof sizes[0]), control_wrong);
  CHECK(control_wrong > 0); /* the setup detects the bug record_stream prevents */
  return finish("gpu_record_stream");
}
