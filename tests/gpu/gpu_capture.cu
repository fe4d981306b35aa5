/*
 * gpu_capture: the "cuda" vtable's stream_capture on a real GPU, and that its
 * own calls are legal during a capture.
 *
 * - a stream not capturing reports NONE with id 0; during a global-mode
 *   capture ACTIVE with the id cudaStreamGetCaptureInfo gives, another id for
 *   the next capture; NONE again after cudaStreamEndCapture;
 * - a malloc (and mem_get_info, event create/query/destroy, the vm_* calls)
 *   through the backend on another thread, which is in global mode, while
 *   this thread captures in global mode does not invalidate the capture: the
 *   capture ends with a graph, which is instantiated and launched;
 * - the same malloc on the capturing thread itself;
 * - the NULL stream while a non-blocking stream captures: NONE, and the
 *   capture survives the query;
 * - a call no mode permits (stream_synchronize of the capturing stream) does
 *   invalidate it, and stream_capture then says INVALIDATED;
 * - the default streams' handles (cudaStreamLegacy, cudaStreamPerThread), asked
 *   from a thread that never made a context current (the backend asks the
 *   driver, and the runtime where the driver's call fails): NONE;
 * (A stream destroyed is never asked about: CUDA reads freed memory there and
 * crashes, tools/dead_stream.cu; the core asks only about the streams a call
 * passes, gpu_capture_pool.)
 */
#include "gpu_util.h"

#include <pthread.h>
#include <gpumem/backend.h>

__global__ void k_touch(unsigned char *p) { p[threadIdx.x] = (unsigned char)threadIdx.x; }

static gpumem_backend be;

struct other_args {
  int rc_malloc, rc_info, rc_free_later;
  void *p;
};

static void *other_thread(void *arg) {
  other_args *a = (other_args *)arg;
  uint64_t f = 0, t = 0;
  gpumem_event ev = NULL;
  int done = 0;
  a->rc_malloc = be.malloc(&be, 0, 64 * MIB, &a->p);
  a->rc_info = be.mem_get_info(&be, 0, &f, &t);
  if (be.event_create(&be, 0, &ev) == 0) {
    (void)be.event_query(&be, 0, ev, &done);
    (void)be.event_destroy(&be, 0, ev);
  }
  if (be.vm_granularity) {
    size_t g = 0;
    void *va = NULL;
    gpumem_phys_handle h = 0;
    if (be.vm_granularity(&be, 0, &g) == 0 && be.vm_reserve(&be, 0, g, &va) == 0) {
      if (be.vm_create(&be, 0, g, &h) == 0) {
        if (be.vm_map(&be, 0, va, g, h) == 0) (void)be.vm_unmap(&be, 0, va, g);
        (void)be.vm_destroy(&be, 0, h);
      }
      (void)be.vm_release(&be, 0, va, g);
    }
  }
  return NULL;
}

struct fresh_args {
  int rc_legacy, st_legacy, rc_per_thread, st_per_thread;
};

/* a thread that never called CUDA: no context is current on it */
static void *fresh_thread(void *arg) {
  fresh_args *a = (fresh_args *)arg;
  uint64_t id = 99;
  a->rc_legacy = be.stream_capture(&be, 0, (gpumem_stream)cudaStreamLegacy, &a->st_legacy, &id);
  a->rc_per_thread = be.stream_capture(&be, 0, (gpumem_stream)cudaStreamPerThread, &a->st_per_thread, &id);
  return NULL;
}

static int status_of(cudaStream_t s, uint64_t *id) {
  int st = -1;
  uint64_t i = 99;
  CHECK(be.stream_capture(&be, 0, (gpumem_stream)s, &st, &i) == 0);
  if (id) *id = i;
  return st;
}

int main(void) {
  require_gpu("gpu_capture");
  const gpumem_backend *src = gpumem_builtin_backend("cuda");
  CHECK(src != NULL);
  if (!src) return finish("gpu_capture");
  memcpy(&be, src, sizeof be);
  CHECK(be.init(&be) == 0);
  CHECK(be.version >= 3 && be.stream_capture != NULL);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));

  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned char *scratch = NULL;
  CUDA_OK(cudaMalloc(&scratch, 4096));
  uint64_t id = 0, id1 = 0, id2 = 0;
  CHECK(status_of(s, &id) == GPUMEM_CAPTURE_NONE && id == 0);

  /* global capture here, allocations through the backend on another thread */
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(status_of(s, &id1) == GPUMEM_CAPTURE_ACTIVE && id1 != 0);
  {
    cudaStreamCaptureStatus cs;
    unsigned long long rid = 0;
    CUDA_OK(cudaStreamGetCaptureInfo(s, &cs, &rid, NULL, NULL, NULL, NULL));
    CHECK(cs == cudaStreamCaptureStatusActive && rid == id1);
  }
  k_touch<<<1, 64, 0, s>>>(scratch);
  other_args a = {-1, -1, -1, NULL};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread, &a) == 0);
  pthread_join(t, NULL);
  printf("other thread during a global capture: malloc rc %d, mem_get_info rc %d\n", a.rc_malloc, a.rc_info);
  CHECK(a.rc_malloc == 0 && a.p != NULL);
  CHECK(a.rc_info == 0);
  void *mine = NULL;
  CHECK(be.malloc(&be, 0, 1 * MIB, &mine) == 0); /* the capturing thread itself */
  CHECK(status_of(s, NULL) == GPUMEM_CAPTURE_ACTIVE);
  /* the NULL stream: the capturing stream is non-blocking, so nothing blocks it */
  CHECK(status_of((cudaStream_t)0, &id) == GPUMEM_CAPTURE_NONE && id == 0);
  CHECK(status_of(s, NULL) == GPUMEM_CAPTURE_ACTIVE);
  k_touch<<<1, 64, 0, s>>>(scratch);
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  printf("cudaStreamEndCapture: %s\n", cudaGetErrorString(e));
  CHECK(e == cudaSuccess && graph != NULL);
  if (graph) {
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  CHECK(status_of(s, &id) == GPUMEM_CAPTURE_NONE && id == 0);
  CHECK(be.free(&be, 0, a.p) == 0);
  CHECK(be.free(&be, 0, mine) == 0);

  /* a new capture sequence has a new id; a synchronisation of it invalidates it */
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CHECK(status_of(s, &id2) == GPUMEM_CAPTURE_ACTIVE && id2 != 0 && id2 != id1);
  k_touch<<<1, 64, 0, s>>>(scratch);
  CHECK(be.stream_synchronize(&be, 0, (gpumem_stream)s) != 0);
  CHECK(cudaGetLastError() == cudaSuccess); /* the backend cleared what it returned */
  CHECK(status_of(s, NULL) == GPUMEM_CAPTURE_INVALIDATED);
  graph = NULL;
  e = cudaStreamEndCapture(s, &graph);
  CHECK(e == cudaErrorStreamCaptureInvalidated && graph == NULL);
  (void)cudaGetLastError();
  CHECK(status_of(s, NULL) == GPUMEM_CAPTURE_NONE);

  CHECK(be.stream_capture(&be, 0, (gpumem_stream)s, NULL, &id) != 0);

  fresh_args f = {-1, -1, -1, -1};
  CHECK(pthread_create(&t, NULL, fresh_thread, &f) == 0);
  pthread_join(t, NULL);
  printf("a thread with no context: legacy stream rc %d status %d, per-thread stream rc %d status %d\n", f.rc_legacy,
         f.st_legacy, f.rc_per_thread, f.st_per_thread);
  CHECK(f.rc_legacy == 0 && f.st_legacy == GPUMEM_CAPTURE_NONE);
  CHECK(f.rc_per_thread == 0 && f.st_per_thread == GPUMEM_CAPTURE_NONE);

  CUDA_OK(cudaFree(scratch));
  CUDA_OK(cudaStreamDestroy(s));
  be.shutdown(&be);
  return finish("gpu_capture");
}
