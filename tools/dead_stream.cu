// dead_stream: what CUDA does when asked about a stream that was destroyed. libgpumem asks the
// backend about the streams of captures nobody announced (graph.c); a program may destroy such a
// stream right after its capture, before the library's next call on it.
//
//   nvcc -O1 -o dead_stream tools/dead_stream.cu -lcuda && for m in 1 2 3 4 5 6 7 8; do ./dead_stream $m; echo "mode $m: rc $?"; done
//
// Modes (each in its own process: a crash shows as a signal):
//   1 runtime cudaStreamGetCaptureInfo on a destroyed stream     2 the driver's cuStreamGetCaptureInfo
//   3 and 4: the same after the stream captured and its capture ended
//   5 cudaStreamQuery on a destroyed stream                       6 cuStreamGetId on a destroyed stream
//   7 a user object retained by a capture's graph (cudaStreamGetCaptureInfo's graph): its destructor
//     runs once the graph and its instance are destroyed
//   8 the driver's query on a destroyed stream after 64 other streams were created and destroyed
#include <cuda_runtime.h>
#include <cuda.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
__global__ void k(int *p) { p[threadIdx.x] = threadIdx.x; }
static std::atomic<int> g_dtor{0};
static void dtor(void *) { g_dtor.store(1); }
int main(int argc, char **argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 1;
  int *p;
  cudaSetDevice(0);
  cudaMalloc(&p, 4096);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  CUstreamCaptureStatus cst = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  if (mode == 3 || mode == 4 || mode == 7) {
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    k<<<1, 32, 0, s>>>(p);
    if (mode == 7) {
      cudaGraph_t cg = nullptr;
      cudaError_t e = cudaStreamGetCaptureInfo(s, &st, &id, &cg, nullptr, nullptr, nullptr);
      cudaUserObject_t uo;
      cudaError_t e2 = cudaUserObjectCreate(&uo, nullptr, dtor, 1, cudaUserObjectNoDestructorSync);
      cudaError_t e3 = cudaGraphRetainUserObject(cg, uo, 1, cudaGraphUserObjectMove);
      printf("capture info %d (graph %p), user object %d, retain %d\n", (int)e, (void *)cg, (int)e2, (int)e3);
    }
    cudaStreamEndCapture(s, &g);
    if (mode == 7) {
      cudaGraphExec_t x;
      cudaGraphInstantiate(&x, g, 0);
      cudaGraphDestroy(g);
      cudaStreamSynchronize(s);
      printf("graph destroyed, instance kept: destructor ran %d\n", g_dtor.load());
      cudaGraphLaunch(x, s);
      cudaStreamSynchronize(s);
      cudaGraphExecDestroy(x);
      for (int i = 0; i < 100 && !g_dtor.load(); i++) usleep(1000);
      printf("instance destroyed too: destructor ran %d\n", g_dtor.load());
      return 0;
    }
    cudaGraphDestroy(g);
  }
  cudaStreamDestroy(s);
  if (mode == 8)
    for (int i = 0; i < 64; i++) {
      cudaStream_t o;
      cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking);
      cudaStreamDestroy(o);
    }
  fflush(stdout);
  if (mode == 1 || mode == 3) {
    cudaError_t e = cudaStreamGetCaptureInfo(s, &st, &id, nullptr, nullptr, nullptr, nullptr);
    printf("runtime: %d (%s) status %d\n", (int)e, cudaGetErrorName(e), (int)st);
  } else if (mode == 2 || mode == 4 || mode == 8) {
    CUresult r = cuStreamGetCaptureInfo((CUstream)s, &cst, &cid, nullptr, nullptr, nullptr, nullptr);
    printf("driver: %d status %d\n", (int)r, (int)cst);
  } else if (mode == 5) {
    cudaError_t e = cudaStreamQuery(s);
    printf("cudaStreamQuery: %d (%s)\n", (int)e, cudaGetErrorName(e));
  } else if (mode == 6) {
    unsigned long long sid = 0;
    CUresult r = cuStreamGetId((CUstream)s, &sid);
    printf("cuStreamGetId: %d\n", (int)r);
  }
  printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
  return 0;
}
