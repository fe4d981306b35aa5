/*
 * gpu_backend_raw: the "cuda" vtable itself, called directly.
 *
 * - events: event_query says "not complete" (and returns 0) while a spinning
 *   kernel runs on the stream, "complete" after event_synchronize;
 * - an impossible malloc (1 PiB) gives a code that maps to
 *   GPUMEM_ERR_OUT_OF_MEMORY, and leaves no error in cudaGetLastError();
 * - virtual memory: granularity, reserve, create, map (read-write), a kernel
 *   writes and reads the mapped range, unmap, destroy, release, and the
 *   device's free memory is back where it was;
 * - device_info: name, UUID form, PCI id form, total memory, mem_get_info.
 */
#include "gpu_util.h"

#include <ctype.h>
#include <gpumem/backend.h>

int main(void) {
  require_gpu("gpu_backend_raw");
  const gpumem_backend *src = gpumem_builtin_backend("cuda");
  gpumem_backend be;
  CHECK(src != NULL);
  if (!src) return finish("gpu_backend_raw");
  memcpy(&be, src, sizeof be);
  CHECK(be.init(&be) == 0);
  int n = -1;
  CHECK(be.device_count(&be, &n) == 0 && n >= 1);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));

  /* device_info */
  {
    gpumem_backend_device_info info;
    uint64_t f = 0, t = 0;
    CHECK(be.device_info(&be, 0, &info) == 0);
    CHECK(be.mem_get_info(&be, 0, &f, &t) == 0);
    printf("device 0: name \"%s\", uuid %s, pci %s, total %.3f GiB, physical index %d; mem_get_info free %.3f GiB\n",
           info.name, info.uuid, info.pci_bus_id, gib(info.total_bytes), info.physical_index, gib(f));
    CHECK(strlen(info.uuid) == 40 && strncmp(info.uuid, "GPU-", 4) == 0);
    CHECK(info.uuid[12] == '-' && info.uuid[17] == '-' && info.uuid[22] == '-' && info.uuid[27] == '-');
    CHECK(strlen(info.pci_bus_id) == 12 && info.pci_bus_id[4] == ':' && info.pci_bus_id[7] == ':');
    for (const char *c = info.pci_bus_id; *c; c++) CHECK(!isupper((unsigned char)*c));
    CHECK(info.total_bytes == t && t > 0);
    CHECK(be.device_info(&be, n, &info) != 0);
    CHECK(be.error_status(&be, be.device_info(&be, n + 5, &info)) == GPUMEM_ERR_INVALID_DEVICE);
  }

  /* events */
  {
    cudaStream_t s;
    gpumem_event ev = NULL;
    int complete = -1;
    void *buf = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(be.malloc(&be, 0, 64 * MIB, &buf) == 0);
    CHECK(be.event_create(&be, 0, &ev) == 0);
    k_spin_then_fill<<<132, 256, 0, s>>>((unsigned char *)buf, 64 * MIB, 5, 500000000ull);
    CHECK(be.event_record(&be, 0, ev, (gpumem_stream)s) == 0);
    CHECK(be.event_query(&be, 0, ev, &complete) == 0);
    printf("event_query while a 0.5 s kernel runs: complete=%d\n", complete);
    CHECK(complete == 0);
    CHECK(cudaGetLastError() == cudaSuccess); /* NotReady left nothing behind */
    double t0 = now_s();
    CHECK(be.event_synchronize(&be, 0, ev) == 0);
    printf("event_synchronize waited %.3f s\n", now_s() - t0);
    CHECK(be.event_query(&be, 0, ev, &complete) == 0);
    CHECK(complete == 1);
    CHECK(check(buf, 64 * MIB, 5, s) == 0);
    CHECK(be.stream_synchronize(&be, 0, (gpumem_stream)s) == 0);
    CHECK(be.device_synchronize(&be, 0) == 0);
    CHECK(be.event_destroy(&be, 0, ev) == 0);
    CHECK(be.free(&be, 0, buf) == 0);
    CUDA_OK(cudaStreamDestroy(s));
  }

  /* out of memory */
  {
    void *p = (void *)0x1;
    int rc = be.malloc(&be, 0, (size_t)1 << 50, &p);
    printf("malloc(1 PiB): code %d (%s) -> %s\n", rc, be.error_string(&be, rc), gpumem_status_name(be.error_status(&be, rc)));
    CHECK(rc != 0 && be.error_status(&be, rc) == GPUMEM_ERR_OUT_OF_MEMORY);
    CHECK(p == (void *)0x1);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(be.malloc(&be, n, 4096, &p) != 0); /* bad device */
  }

  /* virtual memory */
  {
    size_t g = 0;
    void *va = NULL;
    gpumem_phys_handle h[3];
    uint64_t f0, f1, f2;
    CHECK(be.vm_granularity(&be, 0, &g) == 0);
    printf("vm granularity: %zu bytes\n", g);
    CHECK(g > 0 && (g & (g - 1)) == 0);
    size_t chunk = g * 64; /* 128 MiB with 2 MiB granularity */
    mem_info(0, &f0, NULL);
    CHECK(be.vm_reserve(&be, 0, 3 * chunk, &va) == 0);
    for (int i = 0; i < 3; i++) {
      CHECK(be.vm_create(&be, 0, chunk, &h[i]) == 0);
      CHECK(be.vm_map(&be, 0, (char *)va + (size_t)i * chunk, chunk, h[i]) == 0);
    }
    mem_info(0, &f1, NULL);
    fill(va, 3 * chunk, 11, 0);
    unsigned long long bad = check(va, 3 * chunk, 11, 0);
    printf("vm: 3 chunks of %.0f MiB mapped contiguously, device free -%.0f MiB, %llu wrong bytes\n",
           (double)chunk / MIB, (double)(f0 - f1) / MIB, bad);
    CHECK(bad == 0);
    CHECK(f0 - f1 >= 3 * chunk);
    for (int i = 0; i < 3; i++) {
      CHECK(be.vm_unmap(&be, 0, (char *)va + (size_t)i * chunk, chunk) == 0);
      CHECK(be.vm_destroy(&be, 0, h[i]) == 0);
    }
    CHECK(be.vm_release(&be, 0, va, 3 * chunk) == 0);
    mem_info(0, &f2, NULL);
    printf("vm: after unmap/destroy/release device free is %.3f GiB (before %.3f)\n", gib(f2), gib(f0));
    CHECK(f2 + 4 * MIB >= f0);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  be.shutdown(&be);
  return finish("gpu_backend_raw");
}
