// fork_exit: whether a forked child of a CUDA process can call exit() after the parent's thread
// used a default-stream handle. CUDA's own teardown runs in the child at exit(); on an H100 with
// driver 580 (CUDA 13) the child is killed by SIGSEGV once the forking thread has used
// cudaStreamPerThread (any call: a capture query, a memset, an event record), and exits cleanly
// after cudaStreamLegacy or nothing. libgpumem's tests use the legacy handle on GPUs for that
// reason (tests/testutil.h tu_stream); a program that forks should end its children with _exit().
//
//   nvcc -O1 -o fork_exit tools/fork_exit.cu -lcuda && for m in 0 1 2 3 4 5; do ./fork_exit $m; done
//
// Modes: 0 nothing, 1 cudaStreamGetCaptureInfo(PerThread), 2 the same on Legacy,
// 3 cuStreamGetCaptureInfo(CU_STREAM_PER_THREAD), 4 cudaMemsetAsync on PerThread,
// 5 an event recorded on PerThread and queried.
#include <cuda_runtime.h>
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  void *p; cudaSetDevice(0); cudaMalloc(&p, 1 << 20);
  cudaStreamCaptureStatus st; unsigned long long id;
  CUstreamCaptureStatus cst; cuuint64_t cid;
  if (mode == 1) cudaStreamGetCaptureInfo(cudaStreamPerThread, &st, &id, nullptr, nullptr, nullptr, nullptr);
  if (mode == 2) cudaStreamGetCaptureInfo(cudaStreamLegacy, &st, &id, nullptr, nullptr, nullptr, nullptr);
  if (mode == 3) cuStreamGetCaptureInfo(CU_STREAM_PER_THREAD, &cst, &cid, nullptr, nullptr, nullptr, nullptr);
  if (mode == 4) cudaMemsetAsync(p, 0, 1 << 20, cudaStreamPerThread);
  if (mode == 5) { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, cudaStreamPerThread); cudaEventQuery(e); }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) exit(0);
  int s = 0; waitpid(pid, &s, 0);
  printf("mode %d: child %s %d\n", mode, WIFSIGNALED(s) ? "signal" : "exit", WIFSIGNALED(s) ? WTERMSIG(s) : WEXITSTATUS(s));
  return 0;
}
