/*
 * gpu_nvtx_oob: a planted out-of-bounds write past a pool block, for
 * compute-sanitizer's memcheck with the NVTX memory annotations of the CUDA
 * backend (built with GPUMEM_WITH_NVTX). scripts/gpu-nvtx.sh runs every mode
 * below under compute-sanitizer and says what was reported.
 *
 * Library modes. Two blocks come from one segment: a (1000 bytes requested,
 * 1024 in the pool) and b. A kernel writes a[0..999] (fine) and then, in
 * mode "oob", a[1000]: past the requested size but inside the segment the
 * pool holds, so memcheck can only see it because the segment is an NVTX
 * sub-allocator heap and a is a region of 1000 bytes in it.
 *
 *   gpu_nvtx_oob [oob]   planted write at a[1000]   -> memcheck: 1 error
 *   gpu_nvtx_oob clean   in-bounds writes only      -> memcheck: 0 errors
 *
 * The config asks for plain segments; GPUMEM_EXPANDABLE=1 (the environment
 * overrides the config) asks for expandable ones, which the backend does not
 * use under compute-sanitizer (it cannot check them). The program prints what
 * the backend's annotations did (gpumem__cuda_nvtx_counters) and, under
 * compute-sanitizer, checks that every block became a region of a heap.
 *
 * Reference modes, without libgpumem (what the sanitizer does by itself):
 *   cudamalloc     cudaMalloc(1000), write at [1000]: no NVTX, must be reported
 *   raw            CUDA initialised (cudaFree(0)), then domain, cudaMalloc(2 MiB),
 *                  heap over it, region of 1000 bytes, write at [1000]
 *   raw-clean      the same without the planted write
 *   raw-early      domain created before the first context (NVTX before the
 *                  runtime is initialised, which the sanitizer's manual forbids)
 *   raw-thread     heap and region registered from a thread with no current
 *                  context (compute-sanitizer 2025.3 refuses the heap: "not ready")
 *   vmm-reserve    driver VM: heap over a 4 MiB reservation registered before
 *                  its first 2 MiB are mapped; region and write in the mapping
 *   vmm-after      heap over the whole reservation registered after the mapping
 *   vmm-chunk      heap over the mapped 2 MiB chunk only
 *                  (2025.3 refuses all three: "parameters invalid")
 *
 * Without the sanitizer the planted byte lands in memory the program owns
 * (the block's rounding padding, the rest of a pool): harmless, and the
 * program checks only that it ran.
 */
#include "gpu_util.h"

#include <cuda.h>
#include <nvtx3/nvToolsExtMem.h>

#include <thread>

extern "C" void gpumem__cuda_nvtx_counters(long long out[10]);

__global__ void write_bytes(unsigned char *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = (unsigned char)i;
}

/* The planted write, then a synchronisation that does not end the program:
 * with --destroy-on-device-error kernel the sanitizer kills the kernel and the
 * program goes on. */
static void plant(unsigned char *p, const char *what) {
  printf("planting a 1-byte write at %p (%s)\n", (void *)p, what);
  write_bytes<<<1, 1>>>(p, 1);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("after the planted write: %s (expected only under the sanitizer)\n", cudaGetErrorString(e));
    (void)cudaGetLastError();
  }
}

/* What the backend's annotations did; with checks when compute-sanitizer is attached. */
static void print_counters(const char *when, int at_end) {
  long long c[10];
  gpumem__cuda_nvtx_counters(c);
  if (c[0] < 0) {
    printf("nvtx %s: backend built WITHOUT NVTX (GPUMEM_WITH_NVTX off or nvtx3 headers not found)\n", when);
    return;
  }
  printf("nvtx %s: tool %lld, compute-sanitizer %lld, domain %s; heaps registered %lld, withdrawn %lld, refused %lld; "
         "regions registered %lld, withdrawn %lld; blocks in no heap %lld\n",
         when, c[1], c[2], c[3] ? "non-NULL" : "NULL", c[4], c[5], c[6], c[7], c[8], c[9]);
  if (c[1] && c[2]) { /* under compute-sanitizer: plain segments, every block annotated */
    CHECK(c[4] >= 1);
    CHECK(c[6] == 0);
    CHECK(c[7] == 2);
    CHECK(c[9] == 0);
    if (at_end) {
      CHECK(c[8] == 2);
      CHECK(c[5] == c[4]);
    }
  }
}

/* ---- reference modes: the NVTX memory API used directly ---- */

static nvtxMemHeapHandle_t heap_register(nvtxDomainHandle_t d, void *p, size_t n) {
  nvtxMemVirtualRangeDesc_t range = {};
  range.size = n;
  range.ptr = p;
  nvtxMemHeapDesc_t desc = {};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof desc;
  desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize = sizeof range;
  desc.typeSpecificDesc = &range;
  nvtxMemHeapHandle_t h = nvtxMemHeapRegister(d, &desc);
  printf("heap %p + %zu registered: handle %p\n", p, n, (void *)h);
  return h;
}

static void region_register(nvtxDomainHandle_t d, nvtxMemHeapHandle_t h, void *p, size_t n) {
  nvtxMemVirtualRangeDesc_t range = {};
  range.size = n;
  range.ptr = p;
  nvtxMemRegionsRegisterBatch_t b = {};
  b.extCompatID = NVTX_EXT_COMPATID_MEM;
  b.structSize = sizeof b;
  b.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  b.heap = h;
  b.regionCount = 1;
  b.regionDescElementSize = sizeof range;
  b.regionDescElements = &range;
  nvtxMemRegionsRegister(d, &b);
  printf("region %p + %zu registered\n", p, n);
}

static int raw_mode(const char *mode) {
  int early = strcmp(mode, "raw-early") == 0;
  int threaded = strcmp(mode, "raw-thread") == 0;
  int clean = strcmp(mode, "raw-clean") == 0;
  nvtxDomainHandle_t d = NULL;
  if (early) d = nvtxDomainCreateA("gpu_nvtx_oob"); /* before any context */
  CUDA_OK(cudaFree(0));
  if (!early) d = nvtxDomainCreateA("gpu_nvtx_oob");
  printf("NVTX domain %p (NULL: no tool took it)\n", (void *)d);
  unsigned char *pool = NULL;
  const size_t pool_size = 2 * MIB;
  CUDA_OK(cudaMalloc((void **)&pool, pool_size));
  nvtxMemHeapHandle_t h = NULL;
  if (threaded) {
    std::thread t([&] { /* a new thread: no current context */
      h = heap_register(d, pool, pool_size);
      region_register(d, h, pool, 1000);
    });
    t.join();
  } else {
    h = heap_register(d, pool, pool_size);
    region_register(d, h, pool, 1000);
  }
  write_bytes<<<4, 256>>>(pool, 1000); /* in bounds */
  CUDA_OK(cudaDeviceSynchronize());
  if (!clean) plant(pool + 1000, "one past a 1000-byte region of a 2 MiB heap");
  nvtxMemHeapUnregister(d, h);
  CUDA_OK(cudaFree(pool));
  return finish(mode);
}

static int cudamalloc_mode(void) {
  unsigned char *p = NULL;
  CUDA_OK(cudaMalloc((void **)&p, 1000));
  write_bytes<<<4, 256>>>(p, 1000);
  CUDA_OK(cudaDeviceSynchronize());
  plant(p + 1000, "one past a 1000-byte cudaMalloc, no NVTX");
  CUDA_OK(cudaFree(p));
  return finish("cudamalloc");
}

/* ---- driver virtual memory, reached through the runtime's entry points (no link to libcuda) ---- */

template <typename F> static F drv(const char *sym) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || fn == NULL) {
    printf("FAIL: no driver entry point %s\n", sym);
    exit(1);
  }
  return (F)fn;
}

#define DRV_OK(expr)                                                   \
  do {                                                                 \
    CUresult r_ = (expr);                                              \
    if (r_ != CUDA_SUCCESS) {                                          \
      printf("FAIL %s:%d: %s gave %d\n", __FILE__, __LINE__, #expr, (int)r_); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

static int vmm_mode(const char *mode) {
  auto reserve = drv<CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)>("cuMemAddressReserve");
  auto create = drv<CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)>(
      "cuMemCreate");
  auto map = drv<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>("cuMemMap");
  auto set_access = drv<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)>("cuMemSetAccess");
  auto unmap = drv<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto release = drv<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  auto addr_free = drv<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  auto granularity = drv<CUresult (*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)>(
      "cuMemGetAllocationGranularity");

  CUDA_OK(cudaFree(0));
  nvtxDomainHandle_t d = nvtxDomainCreateA("gpu_nvtx_oob");
  printf("NVTX domain %p (NULL: no tool took it)\n", (void *)d);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  DRV_OK(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t chunk = g < 2 * MIB ? 2 * MIB : g, span = 2 * chunk;
  CUdeviceptr va = 0;
  DRV_OK(reserve(&va, span, 0, 0, 0));
  nvtxMemHeapHandle_t h = NULL;
  if (strcmp(mode, "vmm-reserve") == 0) h = heap_register(d, (void *)va, span);
  CUmemGenericAllocationHandle ph = 0;
  DRV_OK(create(&ph, chunk, &prop, 0));
  DRV_OK(map(va, chunk, 0, ph, 0));
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_OK(set_access(va, chunk, &acc, 1));
  if (strcmp(mode, "vmm-after") == 0) h = heap_register(d, (void *)va, span);
  if (strcmp(mode, "vmm-chunk") == 0) h = heap_register(d, (void *)va, chunk);
  unsigned char *p = (unsigned char *)va;
  region_register(d, h, p, 1000);
  write_bytes<<<4, 256>>>(p, 1000);
  CUDA_OK(cudaDeviceSynchronize());
  plant(p + 1000, "one past a 1000-byte region in a mapped VM chunk");
  nvtxMemHeapUnregister(d, h);
  DRV_OK(unmap(va, chunk));
  DRV_OK(release(ph));
  DRV_OK(addr_free(va, span));
  return finish(mode);
}

/* ---- the library ---- */

static int pool_mode(int clean) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.expandable = 0; /* plain cudaMalloc segments, unless GPUMEM_EXPANDABLE=1 overrides */
  gpumem_context *ctx = make_ctx(&cfg);
  unsigned char *a = NULL, *b = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 1000, NULL, (void **)&a), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 4096, NULL, (void **)&b), GPUMEM_OK);
  printf("a = %p (1000 bytes requested), b = %p\n", (void *)a, (void *)b);
  print_counters("after the allocations", 0);
  CUDA_OK(cudaSetDevice(0));
  write_bytes<<<4, 256>>>(a, 1000); /* in bounds */
  write_bytes<<<16, 256>>>(b, 4096);
  CUDA_OK(cudaDeviceSynchronize());
  if (!clean) plant(a + 1000, "a[1000], one past the requested size");
  CHECK_ST(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  CHECK_ST(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  print_counters("at the end", 1);
  return finish(clean ? "gpu_nvtx_oob clean" : "gpu_nvtx_oob");
}

int main(int argc, char **argv) {
  require_gpu("gpu_nvtx_oob");
  const char *mode = argc > 1 ? argv[1] : "oob";
  const char *inj = getenv("NVTX_INJECTION64_PATH");
  printf("mode %s; NVTX_INJECTION64_PATH=%s; GPUMEM_EXPANDABLE=%s\n", mode, inj ? inj : "(unset)",
         getenv("GPUMEM_EXPANDABLE") ? getenv("GPUMEM_EXPANDABLE") : "(unset)");
  if (strcmp(mode, "oob") == 0) return pool_mode(0);
  if (strcmp(mode, "clean") == 0) return pool_mode(1);
  if (strcmp(mode, "cudamalloc") == 0) return cudamalloc_mode();
  if (strncmp(mode, "raw", 3) == 0) return raw_mode(mode);
  if (strncmp(mode, "vmm-", 4) == 0) return vmm_mode(mode);
  printf("unknown mode %s\n", mode);
  return 2;
}
