// capture_cost: what asking whether a stream is being captured costs (the runtime's
// cudaStreamGetCaptureInfo, and the driver's cuStreamGetCaptureInfo that the cuda backend's
// stream_capture asks, falling back to the runtime's where it fails), on a stream that is
// not captured, from 1 and from T threads at once, each on a stream of its own. libgpumem asks it at
// every allocation on a stream other than NULL, so that a capture nobody announced gets a pool of
// its own (src/graph.c); this is that price.
//
//   nvcc -O2 -o capture_cost tools/capture_cost.cu -lcuda -lpthread && ./capture_cost [CALLS] [THREADS]
//
// Prints the median over 5 runs of ns per call, for 1 thread and for THREADS threads (per call of
// each thread, all running at once), for the runtime's call and for the driver's (cuStreamIsCapturing
// and cuStreamGetCaptureInfo, without the runtime's layer). It also checks what the cuda backend
// relies on when it asks the driver: during a capture both calls give the same capture id, and a
// thread with no context current gets an answer, or an error (then the backend asks the runtime).
#include <cuda.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

static double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

struct arg {
  cudaStream_t s;
  long calls;
  double ns;
  pthread_barrier_t *go;
  int how; /* 0 runtime GetCaptureInfo, 1 driver IsCapturing, 2 driver GetCaptureInfo */
};

static void *worker(void *p) {
  arg *a = static_cast<arg *>(p);
  cudaSetDevice(0);
  cudaStreamCaptureStatus st;
  unsigned long long id = 0;
  pthread_barrier_wait(a->go);
  double t0 = now_ns();
  CUstreamCaptureStatus cst;
  cuuint64_t cid = 0;
  for (long i = 0; i < a->calls; i++) {
    if (a->how == 0) {
#if CUDART_VERSION >= 13000
      if (cudaStreamGetCaptureInfo(a->s, &st, &id, nullptr, nullptr, nullptr, nullptr) != cudaSuccess) std::abort();
#else
      if (cudaStreamGetCaptureInfo(a->s, &st, &id) != cudaSuccess) std::abort();
#endif
      if (st != cudaStreamCaptureStatusNone) std::abort();
    } else if (a->how == 1) {
      if (cuStreamIsCapturing((CUstream)a->s, &cst) != CUDA_SUCCESS || cst != CU_STREAM_CAPTURE_STATUS_NONE) std::abort();
    } else {
#if CUDA_VERSION >= 13000
      if (cuStreamGetCaptureInfo((CUstream)a->s, &cst, &cid, nullptr, nullptr, nullptr, nullptr) != CUDA_SUCCESS) std::abort();
#else
      if (cuStreamGetCaptureInfo((CUstream)a->s, &cst, &cid) != CUDA_SUCCESS) std::abort();
#endif
      if (cst != CU_STREAM_CAPTURE_STATUS_NONE) std::abort();
    }
  }
  a->ns = (now_ns() - t0) / a->calls;
  return nullptr;
}

static CUresult drv_info(cudaStream_t s, CUstreamCaptureStatus *cst, cuuint64_t *cid) {
#if CUDA_VERSION >= 13000
  return cuStreamGetCaptureInfo((CUstream)s, cst, cid, nullptr, nullptr, nullptr, nullptr);
#else
  return cuStreamGetCaptureInfo((CUstream)s, cst, cid);
#endif
}

static void *no_context(void *p) {
  CUstreamCaptureStatus cst = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CUcontext c = nullptr;
  cuCtxGetCurrent(&c);
  CUresult r = drv_info(*static_cast<cudaStream_t *>(p), &cst, &cid);
  printf("driver query from a thread with %s context current: CUresult %d, status %d\n", c ? "a" : "no", (int)r,
         (int)cst);
  return nullptr;
}

static double run(int threads, long calls, std::vector<cudaStream_t> &streams, int how) {
  std::vector<pthread_t> t(threads);
  std::vector<arg> a(threads);
  pthread_barrier_t go;
  pthread_barrier_init(&go, nullptr, threads);
  for (int i = 0; i < threads; i++) {
    a[i] = {streams[i], calls, 0, &go, how};
    pthread_create(&t[i], nullptr, worker, &a[i]);
  }
  double sum = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], nullptr);
    sum += a[i].ns;
  }
  pthread_barrier_destroy(&go);
  return sum / threads;
}

int main(int argc, char **argv) {
  long calls = argc > 1 ? atol(argv[1]) : 1000000;
  int threads = argc > 2 ? atoi(argv[2]) : 16;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    fprintf(stderr, "capture_cost: no device\n");
    return 1;
  }
  std::vector<cudaStream_t> streams(threads);
  for (auto &s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  {
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    CUstreamCaptureStatus cst;
    cuuint64_t cid = 0;
    cudaGraph_t g = nullptr;
    int ok = cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeRelaxed) == cudaSuccess;
#if CUDART_VERSION >= 13000
    ok = ok && cudaStreamGetCaptureInfo(streams[0], &st, &id, nullptr, nullptr, nullptr, nullptr) == cudaSuccess;
#else
    ok = ok && cudaStreamGetCaptureInfo(streams[0], &st, &id) == cudaSuccess;
#endif
    ok = ok && drv_info(streams[0], &cst, &cid) == CUDA_SUCCESS;
    ok = ok && cudaStreamEndCapture(streams[0], &g) == cudaSuccess;
    printf("capture ids: runtime %llu, driver %llu, status %d/%d: %s\n", id, (unsigned long long)cid, (int)st,
           (int)cst, ok && id == cid && (int)st == (int)cst && st == cudaStreamCaptureStatusActive ? "agree" : "DIFFER");
    if (g) cudaGraphDestroy(g);
    pthread_t t;
    pthread_create(&t, nullptr, no_context, &streams[0]);
    pthread_join(t, nullptr);
  }
  const char *names[] = {"cudaStreamGetCaptureInfo", "cuStreamIsCapturing", "cuStreamGetCaptureInfo"};
  for (int how = 0; how < 3; how++)
    for (int n : {1, threads}) {
      std::vector<double> r;
      for (int rep = 0; rep < 5; rep++) r.push_back(run(n, calls, streams, how));
      std::sort(r.begin(), r.end());
      printf("%-25s %2d thread(s), a stream each: %.1f ns per call (median of 5; %.1f-%.1f)\n", names[how], n, r[2],
             r[0], r[4]);
    }
  return 0;
}
