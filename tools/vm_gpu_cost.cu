// vm_gpu_cost: does remapping memory cost the GPU's running work? A chunk move in expandable
// segments (an unmap, a map and a set-access) changes the page tables the device uses; vm_cost.cu
// shows that no call waits for queued work, but the device may still pay (its translation caches
// invalidated, the page-table update itself). This runs kernels back to back and times them on
// the GPU, once with the host idle and once with the host moving chunks of another range all the
// while, as an allocator at a moving peak does.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -o vm_gpu_cost tools/vm_gpu_cost.cu -lcuda && ./vm_gpu_cost [BUF_MIB] [LAUNCHES] [CHUNK_MIB]
//
// The kernels read and write a BUF_MIB buffer mapped with the virtual-memory calls in 64 MiB chunks
// (as the pool maps its memory): "stream" reads it in order, "gather" at scattered places (many
// translations). Printed per kernel kind: ms per launch idle, ms per launch while the host moves
// chunks, the moves made and their rate. The moved chunks are never touched by the kernels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vm_probe.h"

__global__ void stream_k(const float *in, float *out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[i] * 2.0f + 1.0f;
}

__global__ void gather_k(const float *in, float *out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[(i * 2654435761ull) % n];
}

struct Mapped {
  CUdeviceptr va = 0;
  size_t size = 0, chunk = 0;
  std::vector<CUmemGenericAllocationHandle> h;
};

static Mapped map_range(const Probe &p, size_t size, size_t chunk) {
  Mapped m;
  m.size = size;
  m.chunk = chunk;
  CK(cuMemAddressReserve(&m.va, size, 0, 0, 0));
  m.h.resize(size / chunk);
  map_chunks(p, m.va, chunk, m.h);
  return m;
}

static void unmap_range(Mapped &m) {
  unmap_chunks(m.va, m.chunk, m.h);
  CK(cuMemAddressFree(m.va, m.size));
}

int main(int argc, char **argv) {
  const size_t buf_mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 2048;
  const int launches = argc > 2 ? std::atoi(argv[2]) : 40;
  const size_t chunk_mib = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 8;
  if (buf_mib == 0 || buf_mib % 128 != 0 || launches < 1 || chunk_mib == 0 || chunk_mib % 2 != 0) {
    std::fprintf(stderr, "vm_gpu_cost: BUF_MIB a multiple of 128, LAUNCHES >= 1, CHUNK_MIB a multiple of 2\n");
    return 2;
  }
  Probe p;
  if (!probe_open("vm_gpu_cost", &p)) return 2;
  const size_t half = (buf_mib << 20) / 2;
  Mapped buf = map_range(p, 2 * half, (size_t)64 << 20);
  const float *in = (const float *)(uintptr_t)buf.va;
  float *out = (float *)(uintptr_t)(buf.va + half);
  const size_t n = half / sizeof(float);
  /* the chunks the host moves: K of them, between two ranges of K slots */
  const int K = 16;
  const size_t chunk = chunk_mib << 20;
  CUdeviceptr mv[2];
  CK(cuMemAddressReserve(&mv[0], chunk * K, 0, 0, 0));
  CK(cuMemAddressReserve(&mv[1], chunk * K, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> mh(K);
  map_chunks(p, mv[0], chunk, mh);
  int side = 0, next = 0;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("vm_gpu_cost: %zu MiB buffer in 64 MiB chunks, %d launches a run, moves of %zu MiB chunks\n", buf_mib,
              launches, chunk_mib);
  for (int kind = 0; kind < 2; kind++) {
    std::vector<double> idle_ms, busy_ms;
    double moves_total = 0, busy_wall = 0;
    for (int round = 0; round < 6; round++) {
      const bool moving = round % 2 == 1;
      cudaEventRecord(e0, s);
      for (int l = 0; l < launches; l++) {
        if (kind == 0) stream_k<<<1024, 256, 0, s>>>(in, out, n);
        else gather_k<<<1024, 256, 0, s>>>(in, out, n);
      }
      cudaEventRecord(e1, s);
      double t0 = now_us();
      long moves = 0;
      if (moving) {
        while (cudaEventQuery(e1) == cudaErrorNotReady) {
          /* one move: chunk `next` from side to the other side */
          CK(cuMemUnmap(mv[side] + next * chunk, chunk));
          CK(cuMemMap(mv[1 - side] + next * chunk, chunk, 0, mh[next], 0));
          CK(cuMemSetAccess(mv[1 - side] + next * chunk, chunk, &p.acc, 1));
          moves++;
          if (++next == K) {
            next = 0;
            side = 1 - side;
          }
        }
      }
      cudaEventSynchronize(e1);
      double wall = now_us() - t0;
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (cudaGetLastError() != cudaSuccess) {
        std::fprintf(stderr, "vm_gpu_cost: kernel failed\n");
        return 2;
      }
      if (round < 2) continue; /* warm-up pair */
      (moving ? busy_ms : idle_ms).push_back(ms / launches);
      if (moving) {
        moves_total += (double)moves;
        busy_wall += wall;
      }
    }
    std::printf("%-7s ms per launch: host idle %.3f, host moving chunks %.3f (%+.1f %%); %.0f moves, %.2f per ms\n",
                kind == 0 ? "stream" : "gather", median(idle_ms), median(busy_ms),
                100.0 * (median(busy_ms) / median(idle_ms) - 1.0), moves_total, moves_total / (busy_wall / 1000.0));
  }
  for (int i = 0; i < K; i++) {
    /* every chunk is mapped on `side` for i < next, on the other side from next on */
    CK(cuMemUnmap(mv[i < next ? 1 - side : side] + i * chunk, chunk));
    CK(cuMemRelease(mh[i]));
  }
  CK(cuMemAddressFree(mv[0], chunk * K));
  CK(cuMemAddressFree(mv[1], chunk * K));
  unmap_range(buf);
  return 0;
}
