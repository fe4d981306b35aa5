/* cuda_streams.c: real CUDA streams for the tools; compiled only with GPUMEM_HAVE_CUDA. */
#include <cuda_runtime.h>

#include <stdio.h>

#include "tools_common.h"

int tools_cuda_stream_create(int device, gpumem_stream *s, char *err, size_t errlen) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(device);
  cudaStream_t st = NULL;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaSetDevice(prev);
  if (e != cudaSuccess) {
    if (err && errlen) snprintf(err, errlen, "cudaStreamCreate: %s", cudaGetErrorString(e));
    return -1;
  }
  *s = (gpumem_stream)st;
  return 0;
}

void tools_cuda_stream_destroy(int device, gpumem_stream s) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaStreamSynchronize((cudaStream_t)s);
  cudaStreamDestroy((cudaStream_t)s);
  cudaSetDevice(prev);
}

void tools_cuda_device_sync(int device) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  cudaSetDevice(prev);
}
