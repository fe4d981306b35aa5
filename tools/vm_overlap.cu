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

int main(int argc, char **argv) {
  const size_t n = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const size_t mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 8;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 9;
  Probe p;
  if (!probe_open("vm_overlap", &p)) return 2;
  const size_t chunk = mib << 20;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &p.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (chunk % gran != 0) {
    std::fprintf(stderr, "chunk of %zu MiB is not a multiple of the granularity %zu\n", mib, gran);
    return 2;
  }
  CUdeviceptr a = 0, b = 0;
  CK(cuMemAddressReserve(&a, n * chunk, 0, 0, 0));
  CK(cuMemAddressReserve(&b, n * chunk, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> ha(n), hb(n);
  std::vector<double> t_map, t_unmap, t_main, t_wall;
  map_chunks(p, a, chunk, ha); /* warm-up */
  unmap_chunks(a, chunk, ha);
  for (int r = 0; r < rounds; r++) {
    /* alone */
    map_chunks(p, a, chunk, ha);
    double t0 = now_us();
    map_chunks(p, b, chunk, hb);
    t_map.push_back((now_us() - t0) / n);
    t0 = now_us();
    unmap_chunks(a, chunk, ha);
    t_unmap.push_back((now_us() - t0) / n);
    unmap_chunks(b, chunk, hb);
    /* side by side */
    map_chunks(p, a, chunk, ha);
    t0 = now_us();
    std::thread w([&] {
      CK(cuCtxSetCurrent(p.ctx));
      unmap_chunks(a, chunk, ha);
    });
    map_chunks(p, b, chunk, hb);
    t_main.push_back((now_us() - t0) / n);
    w.join();
    t_wall.push_back((now_us() - t0) / n);
    unmap_chunks(b, chunk, hb);
  }
  std::printf("vm_overlap: %zu chunks of %zu MiB, %d rounds, us per chunk (median)\n", n, mib, rounds);
  std::printf("alone:        create+map+access %.1f, unmap+release %.1f, sum %.1f\n", median(t_map),
              median(t_unmap), median(t_map) + median(t_unmap));
  std::printf("side by side: main thread's create+map+access %.1f, both threads done %.1f\n", median(t_main),
              median(t_wall));
  CK(cuMemAddressFree(a, n * chunk));
  CK(cuMemAddressFree(b, n * chunk));
  CK(cuDevicePrimaryCtxRelease(p.dev));
  return 0;
}
