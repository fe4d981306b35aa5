// vm_cost: what the CUDA driver's virtual-memory calls cost while the GPU is idle and while a
// kernel is running (on memory the calls do not touch). A chunk move in expandable segments is an
// unmap and a map + set-access; if a call waits for the running work, a move costs the GPU's
// queue, not tens of microseconds.
//
//   nvcc -O2 -o vm_cost tools/vm_cost.cu -lcuda && ./vm_cost [CHUNK_MIB] [SPIN_MS]
//
// Prints, per call, the median and the largest time in microseconds over REPS calls, idle and busy
// (each busy call is made right after launching a SPIN_MS kernel on its own non-blocking stream),
// and how long the kernel had left when the call returned (a call that waited leaves it ~0). Then,
// for 8 chunks side by side with the GPU busy: the first and the following unmaps after one launch
// (does only the first one wait?), and one cuMemSetAccess / cuMemUnmap over all 8 mappings (does
// the driver take a range that spans several, and at what cost?).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vm_probe.h"

__global__ void spin(unsigned long long ns, int *flag) {
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > ns) break;
  }
  *flag = 1;
}

struct Stat {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double med() const { return median(v); }
  double max() { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

int main(int argc, char **argv) {
  const size_t chunk_mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 8;
  const double spin_ms = argc > 2 ? std::atof(argv[2]) : 20.0;
  const int REPS = 15;
  Probe p;
  if (!probe_open("vm_cost", &p)) return 2;
  const CUmemAllocationProp &prop = p.prop;
  const CUmemAccessDesc &acc = p.acc;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t sz = ((chunk_mib << 20) + gran - 1) / gran * gran;
  const int K = 8; /* chunks side by side for the batch rows */
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, sz * K, 0, 0, 0));
  int *flag = nullptr;
  if (cudaMalloc(&flag, sizeof *flag) != cudaSuccess) return 2;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::printf("vm_cost: chunk %zu MiB (granularity %zu KiB), kernel %.1f ms, %d calls each\n", sz >> 20,
              gran >> 10, spin_ms, REPS);
  std::printf("%-22s %-5s %10s %10s %16s\n", "call", "gpu", "median us", "max us", "kernel left ms");
  for (int busy = 0; busy < 2; busy++) {
    Stat st_create, st_map, st_access, st_unmap, st_release, left_unmap, left_access;
    for (int i = 0; i < REPS; i++) {
      CUmemGenericAllocationHandle h;
      double tk = 0;
      auto launch = [&]() {
        if (!busy) return;
        cudaMemsetAsync(flag, 0, sizeof *flag, s);
        spin<<<1, 1, 0, s>>>((unsigned long long)(spin_ms * 1e6), flag);
        tk = now_us();
        cudaStreamQuery(s); /* submitted */
      };
      auto left = [&]() {
        if (!busy) return 0.0;
        return cudaStreamQuery(s) == cudaSuccess ? 0.0 : spin_ms - (now_us() - tk) / 1000.0;
      };
      /* each call right after a fresh kernel launch (busy), its time, and then the kernel's end */
      auto timed = [&](Stat &st, Stat *kernel_left, auto &&call) {
        double t0 = now_us();
        CK(call());
        st.add(now_us() - t0);
        if (kernel_left != nullptr) kernel_left->add(left());
      };
      launch();
      timed(st_create, nullptr, [&] { return cuMemCreate(&h, sz, &prop, 0); });
      cudaStreamSynchronize(s);
      launch();
      timed(st_map, nullptr, [&] { return cuMemMap(va, sz, 0, h, 0); });
      timed(st_access, &left_access, [&] { return cuMemSetAccess(va, sz, &acc, 1); });
      cudaStreamSynchronize(s);
      launch();
      timed(st_unmap, &left_unmap, [&] { return cuMemUnmap(va, sz); });
      cudaStreamSynchronize(s);
      launch();
      timed(st_release, nullptr, [&] { return cuMemRelease(h); });
      cudaStreamSynchronize(s);
    }
    const char *g = busy ? "busy" : "idle";
    auto row = [&](const char *name, Stat &st, Stat *kernel_left) {
      std::printf("%-22s %-5s %10.1f %10.1f", name, g, st.med(), st.max());
      if (kernel_left != nullptr) std::printf(" %16.2f", kernel_left->med());
      std::printf("\n");
    };
    row("cuMemCreate", st_create, nullptr);
    row("cuMemMap", st_map, nullptr);
    row("cuMemSetAccess", st_access, &left_access);
    row("cuMemUnmap", st_unmap, &left_unmap);
    row("cuMemRelease", st_release, nullptr);
  }
  /* Batches, GPU busy: K chunks mapped side by side, then (a) unmapped one call each right after one
   * kernel launch: does only the first call wait for it? (b) one cuMemSetAccess and one cuMemUnmap
   * over the whole range of K mappings: does the driver take a range that spans several? */
  {
    Stat first, rest, span_access, span_unmap;
    int span_ok = 1;
    for (int i = 0; i < REPS; i++) {
      std::vector<CUmemGenericAllocationHandle> hs(K);
      for (int k = 0; k < K; k++) {
        CK(cuMemCreate(&hs[k], sz, &prop, 0));
        CK(cuMemMap(va + k * sz, sz, 0, hs[k], 0));
      }
      CK(cuMemSetAccess(va, sz * K, &acc, 1));
      cudaStreamSynchronize(s);
      cudaMemsetAsync(flag, 0, sizeof *flag, s);
      spin<<<1, 1, 0, s>>>((unsigned long long)(spin_ms * 1e6), flag);
      cudaStreamQuery(s);
      for (int k = 0; k < K; k++) {
        double t0 = now_us();
        CK(cuMemUnmap(va + k * sz, sz));
        (k == 0 ? first : rest).add(now_us() - t0);
      }
      cudaStreamSynchronize(s);
      for (int k = 0; k < K; k++) CK(cuMemMap(va + k * sz, sz, 0, hs[k], 0));
      cudaMemsetAsync(flag, 0, sizeof *flag, s);
      spin<<<1, 1, 0, s>>>((unsigned long long)(spin_ms * 1e6), flag);
      cudaStreamQuery(s);
      double t0 = now_us();
      CUresult ra = cuMemSetAccess(va, sz * K, &acc, 1);
      span_access.add(now_us() - t0);
      t0 = now_us();
      CUresult ru = cuMemUnmap(va, sz * K);
      span_unmap.add(now_us() - t0);
      if (ra != CUDA_SUCCESS || ru != CUDA_SUCCESS) {
        span_ok = 0;
        for (int k = 0; k < K; k++) (void)cuMemUnmap(va + k * sz, sz);
      }
      cudaStreamSynchronize(s);
      for (int k = 0; k < K; k++) CK(cuMemRelease(hs[k]));
    }
    std::printf("%-22s %-5s %10.1f %10.1f   (%d chunks, one kernel launch before the first)\n", "cuMemUnmap first", "busy",
                first.med(), first.max(), K);
    std::printf("%-22s %-5s %10.1f %10.1f\n", "cuMemUnmap next ones", "busy", rest.med(), rest.max());
    std::printf("%-22s %-5s %10.1f %10.1f   (one call over %d mappings: %s)\n", "cuMemSetAccess span", "busy",
                span_access.med(), span_access.max(), K, span_ok ? "accepted" : "refused");
    std::printf("%-22s %-5s %10.1f %10.1f\n", "cuMemUnmap span", "busy", span_unmap.med(), span_unmap.max());
  }
  cudaStreamDestroy(s);
  cudaFree(flag);
  CK(cuMemAddressFree(va, sz * K));
  return 0;
}
