/*
 * gpu_capture_pool: a CUDA graph captured with cudaStreamBeginCapture and nothing told to the
 * library (no gpumem_graph_pool_begin), through a cuda context on a real GPU (DESIGN.md "Graphs":
 * a capture that names no pool gets one of its own).
 *
 * - memory cached in the device pool before the capture (a freed 64 KiB block, a freed 4 MiB
 *   block) is not what the capture's allocations get;
 * - another thread allocating, freeing and trimming on its own stream during the global-mode
 *   capture, and gpumem_reset (GPUMEM_ERR_BUSY), leave the capture intact: it ends with a graph;
 * - the graph is instantiated and launched three times while the stream's later allocations,
 *   written with another pattern, run between the launches: the graph's blocks keep its pattern
 *   (no allocation outside the graph got its memory);
 * - after the graph's blocks are freed and the context trimmed, the capture's pool stays (the graph
 *   may still be launched); after gpumem_capture_pools_release and a trim, nothing is reserved;
 * - a capture whose stream is destroyed before the library learns the capture ended: the calls
 *   after it succeed and never ask about that stream (CUDA crashes there, tools/dead_stream.cu);
 *   the capture stays known (a reset is refused) until gpumem_capture_ended(ctx, 0, NULL); then
 *   the release and a trim leave nothing reserved, and no runtime error.
 */
#include "gpu_util.h"

#include <pthread.h>

__global__ void k_set(unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

__global__ void k_count_not(const unsigned char *p, size_t n, unsigned char v, unsigned long long *bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(bad, mine);
}

struct side_args {
  gpumem_context *ctx;
  cudaStream_t s;
  int failures;
};

static void *side_thread(void *arg) {
  side_args *a = (side_args *)arg;
  for (int i = 0; i < 20; i++) {
    void *p = NULL;
    if (gpumem_alloc(a->ctx, 0, (size_t)(i + 1) << 20, (gpumem_stream)a->s, &p) != GPUMEM_OK) a->failures++;
    if (p && gpumem_free(a->ctx, p, (gpumem_stream)a->s) != GPUMEM_OK) a->failures++;
    if (gpumem_trim(a->ctx, 0, 0, NULL) != GPUMEM_OK) a->failures++;
  }
  return NULL;
}

int main(void) {
  require_gpu("gpu_capture_pool");
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  gpumem_context *ctx = make_ctx(&cfg);
  if (!ctx) return finish("gpu_capture_pool");
  cudaStream_t s, side;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const gpumem_stream S = (gpumem_stream)s;
  unsigned long long *bad = NULL;
  CUDA_OK(cudaMalloc(&bad, sizeof *bad));

  void *small = NULL, *early = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 64 << 10, S, &small), GPUMEM_OK);
  CHECK_ST(gpumem_free(ctx, small, S), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 4 << 20, S, &early), GPUMEM_OK);
  CHECK_ST(gpumem_free(ctx, early, S), GPUMEM_OK);
  CUDA_OK(cudaStreamSynchronize(s));

  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  void *g1 = NULL, *g2 = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 64 << 10, S, &g1), GPUMEM_OK);
  side_args sa = {ctx, side, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, side_thread, &sa) == 0);
  CHECK_ST(gpumem_alloc(ctx, 0, 4 << 20, S, &g2), GPUMEM_OK);
  CHECK(g1 && !overlaps(g1, 64 << 10, small, 64 << 10));
  CHECK(g2 && !overlaps(g2, 4 << 20, early, 4 << 20));
  if (g1 && g2) {
    k_set<<<64, 256, 0, s>>>((unsigned char *)g1, 64 << 10, 0x5a);
    k_set<<<64, 256, 0, s>>>((unsigned char *)g2, 4 << 20, 0x5a);
  }
  CHECK_ST(gpumem_reset(ctx, 0, 0), GPUMEM_ERR_BUSY);
  pthread_join(t, NULL);
  printf("side thread during the capture: %d failed calls\n", sa.failures);
  CHECK(sa.failures == 0);
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  printf("cudaStreamEndCapture: %s\n", cudaGetErrorString(e));
  CHECK(e == cudaSuccess && graph != NULL);
  if (graph && g1 && g2) {
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    unsigned long long total_bad = 0, outside_bad = 0;
    for (int rep = 0; rep < 3; rep++) {
      CUDA_OK(cudaGraphLaunch(exec, s));
      /* the stream's own work between launches, in memory the pool gives it now */
      void *q[4] = {NULL, NULL, NULL, NULL};
      size_t qn[4] = {64 << 10, 4 << 20, 64 << 10, 8 << 20};
      for (int i = 0; i < 4; i++) {
        CHECK_ST(gpumem_alloc(ctx, 0, qn[i], S, &q[i]), GPUMEM_OK);
        if (!q[i]) continue;
        CHECK(!overlaps(q[i], qn[i], g1, 64 << 10) && !overlaps(q[i], qn[i], g2, 4 << 20));
        k_set<<<64, 256, 0, s>>>((unsigned char *)q[i], qn[i], 0xc3);
      }
      CUDA_OK(cudaMemsetAsync(bad, 0, sizeof *bad, s));
      k_count_not<<<64, 256, 0, s>>>((const unsigned char *)g1, 64 << 10, 0x5a, bad);
      k_count_not<<<64, 256, 0, s>>>((const unsigned char *)g2, 4 << 20, 0x5a, bad);
      unsigned long long h = 0;
      CUDA_OK(cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      total_bad += h;
      for (int i = 0; i < 4; i++) {
        if (!q[i]) continue;
        CUDA_OK(cudaMemsetAsync(bad, 0, sizeof *bad, s));
        k_count_not<<<64, 256, 0, s>>>((const unsigned char *)q[i], qn[i], 0xc3, bad);
        CUDA_OK(cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        outside_bad += h;
        CHECK_ST(gpumem_free(ctx, q[i], S), GPUMEM_OK);
      }
    }
    printf("graph launched 3 times between the stream's own allocations: %llu graph bytes and %llu other bytes "
           "changed\n",
           total_bad, outside_bad);
    CHECK(total_bad == 0 && outside_bad == 0);
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  gpumem_stats st;
  memset(&st, 0, sizeof st);
  CHECK_ST(gpumem_get_stats(ctx, 0, &st), GPUMEM_OK);
  CHECK(st.num_live == 2);
  CHECK_ST(gpumem_free(ctx, g1, S), GPUMEM_OK);
  CHECK_ST(gpumem_free(ctx, g2, S), GPUMEM_OK);
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_ST(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  memset(&st, 0, sizeof st);
  CHECK_ST(gpumem_get_stats(ctx, 0, &st), GPUMEM_OK);
  printf("after the graph's blocks were freed and a trim: %llu live, %llu bytes reserved (the capture's pool)\n",
         (unsigned long long)st.num_live, (unsigned long long)st.reserved_bytes);
  CHECK(st.num_live == 0 && st.reserved_bytes >= (4u << 20));
  CHECK_ST(gpumem_capture_pools_release(ctx, 0), GPUMEM_OK); /* the graph is destroyed */
  CHECK_ST(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
  memset(&st, 0, sizeof st);
  CHECK_ST(gpumem_get_stats(ctx, 0, &st), GPUMEM_OK);
  printf("after gpumem_capture_pools_release and a trim: %llu bytes reserved\n", (unsigned long long)st.reserved_bytes);
  CHECK(st.reserved_bytes == 0);
  /* a capture whose stream is destroyed before the library hears of the capture's end: the library
   * never asks about that stream (CUDA would crash: tools/dead_stream.cu); the capture stays known
   * until gpumem_capture_ended(ctx, 0, NULL), then its pool goes at the release */
  {
    cudaStream_t gs;
    CUDA_OK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamBeginCapture(gs, cudaStreamCaptureModeRelaxed));
    void *gp = NULL;
    CHECK_ST(gpumem_alloc(ctx, 0, 1 << 20, (gpumem_stream)gs, &gp), GPUMEM_OK);
    if (gp) k_set<<<64, 256, 0, gs>>>((unsigned char *)gp, 1 << 20, 0x11);
    CHECK_ST(gpumem_free(ctx, gp, (gpumem_stream)gs), GPUMEM_OK);
    cudaGraph_t g = NULL;
    CUDA_OK(cudaStreamEndCapture(gs, &g));
    if (g) CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaStreamDestroy(gs));
    void *after = NULL;
    for (int i = 0; i < 4; i++) { /* both paths: the NULL stream and another stream */
      CHECK_ST(gpumem_alloc(ctx, 0, (size_t)(i + 1) << 20, i % 2 ? S : NULL, &after), GPUMEM_OK);
      CHECK_ST(gpumem_free(ctx, after, i % 2 ? S : NULL), GPUMEM_OK);
    }
    CHECK_ST(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
    CHECK_ST(gpumem_reset(ctx, 0, 0), GPUMEM_ERR_BUSY); /* still known: capture mode */
    CHECK_ST(gpumem_capture_ended(ctx, 0, NULL), GPUMEM_OK);
    CHECK_ST(gpumem_capture_pools_release(ctx, 0), GPUMEM_OK);
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK_ST(gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0, NULL), GPUMEM_OK);
    memset(&st, 0, sizeof st);
    CHECK_ST(gpumem_get_stats(ctx, 0, &st), GPUMEM_OK);
    CHECK(st.reserved_bytes == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
    printf("a capture's stream destroyed before the library saw the capture end: calls after it OK, "
           "%llu bytes reserved after gpumem_capture_ended(NULL), the release and a trim\n",
           (unsigned long long)st.reserved_bytes);
  }
  CHECK_ST(gpumem_reset(ctx, 0, 0), GPUMEM_OK);
  CUDA_OK(cudaFree(bad));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaStreamDestroy(side));
  gpumem_destroy(ctx, 0);
  return finish("gpu_capture_pool");
}
