// vm_overlap: do the CUDA driver's virtual-memory calls on two host threads run side by side, or
// one after the other? A chunk move is an unmap (and, for memory given back, a release) of the old
// place and a create, map and set-access at the new one. The allocating thread needs only the
// second half before it returns; were the first half made on another thread, a move would cost the
// allocation only the second half, if the driver lets the two threads' calls overlap.
//
//   nvcc -O2 -std=c++17 -o vm_overlap tools/vm_overlap.cu -lcuda -lpthread && ./vm_overlap [CHUNKS] [CHUNK_MIB] [ROUNDS]
//
// Per round, with CHUNKS chunks of CHUNK_MIB mapped at range A:
//   alone:   the main thread creates, maps and sets access for CHUNKS new chunks at range B (t_map),
//            then unmaps and releases the ones at A (t_unmap);
//   side by side: the same, with a second thread unmapping and releasing A's chunks while the main
//            thread maps B's: the main thread's time (t_main) and the wall time of both (t_wall).
// Prints the medians over ROUNDS in microseconds per chunk. t_main near t_map: the calls overlap;
// t_main near t_map + t_unmap: the driver serialises them, and another thread saves nothing.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "vm_probe.h"

struct Space {
  CUdevice dev;
  size_t chunk;
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
};

static void map_all(const Space &s, CUdeviceptr base, std::vector<CUmemGenericAllocationHandle> &h) {
  for (size_t i = 0; i < h.size(); i++) {
    CK(cuMemCreate(&h[i], s.chunk, &s.prop, 0));
    CK(cuMemMap(base + i * s.chunk, s.chunk, 0, h[i], 0));
    CK(cuMemSetAccess(base + i * s.chunk, s.chunk, &s.acc, 1));
  }
}

static void unmap_all(const Space &s, CUdeviceptr base, std::vector<CUmemGenericAllocationHandle> &h) {
  for (size_t i = 0; i < h.size(); i++) {
    CK(cuMemUnmap(base + i * s.chunk, s.chunk));
    CK(cuMemRelease(h[i]));
  }
}

int main(int argc, char **argv) {
  const size_t n = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const size_t mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 8;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 9;
  CK(cuInit(0));
  Space s;
  CK(cuDeviceGet(&s.dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, s.dev));
  CK(cuCtxSetCurrent(ctx));
  s.chunk = mib << 20;
  device_chunk(s.dev, &s.prop, &s.acc);
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &s.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (s.chunk % gran != 0) {
    std::fprintf(stderr, "chunk of %zu MiB is not a multiple of the granularity %zu\n", mib, gran);
    return 2;
  }
  CUdeviceptr a = 0, b = 0;
  CK(cuMemAddressReserve(&a, n * s.chunk, 0, 0, 0));
  CK(cuMemAddressReserve(&b, n * s.chunk, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> ha(n), hb(n);
  std::vector<double> t_map, t_unmap, t_main, t_wall;
  map_all(s, a, ha); /* warm-up */
  unmap_all(s, a, ha);
  for (int r = 0; r < rounds; r++) {
    /* alone */
    map_all(s, a, ha);
    double t0 = now_us();
    map_all(s, b, hb);
    t_map.push_back((now_us() - t0) / n);
    t0 = now_us();
    unmap_all(s, a, ha);
    t_unmap.push_back((now_us() - t0) / n);
    unmap_all(s, b, hb);
    /* side by side */
    map_all(s, a, ha);
    t0 = now_us();
    std::thread w([&] {
      CK(cuCtxSetCurrent(ctx));
      unmap_all(s, a, ha);
    });
    map_all(s, b, hb);
    t_main.push_back((now_us() - t0) / n);
    w.join();
    t_wall.push_back((now_us() - t0) / n);
    unmap_all(s, b, hb);
  }
  std::printf("vm_overlap: %zu chunks of %zu MiB, %d rounds, us per chunk (median)\n", n, mib, rounds);
  std::printf("alone:        create+map+access %.1f, unmap+release %.1f, sum %.1f\n", median(t_map),
              median(t_unmap), median(t_map) + median(t_unmap));
  std::printf("side by side: main thread's create+map+access %.1f, both threads done %.1f\n", median(t_main),
              median(t_wall));
  CK(cuMemAddressFree(a, n * s.chunk));
  CK(cuMemAddressFree(b, n * s.chunk));
  CK(cuDevicePrimaryCtxRelease(s.dev));
  return 0;
}
