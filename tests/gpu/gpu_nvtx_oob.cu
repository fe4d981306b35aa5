/*
 * gpu_nvtx_oob: a planted out-of-bounds write past a pool block, for
 * compute-sanitizer's memcheck with the NVTX memory annotations of the CUDA
 * backend (built with GPUMEM_WITH_NVTX).
 *
 * Two blocks come from one segment: a (1000 bytes requested, 1024 in the
 * pool) and b. A kernel writes a[0..999] (fine) and then, unless "clean" is
 * given, a[1000]: past the requested size but inside the segment that
 * cudaMalloc returned, so memcheck only sees it because the segment is an
 * NVTX sub-allocator heap and a is a region of 1000 bytes in it.
 *
 *   compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 9 gpu_nvtx_oob        -> 1 error, exit 9
 *   compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 9 gpu_nvtx_oob clean  -> 0 errors, exit 0
 *
 * Without the sanitizer (plain ctest) the planted byte lands in the block's
 * rounding padding: harmless, and the program checks only that it ran.
 */
#include "gpu_util.h"

__global__ void write_bytes(unsigned char *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = (unsigned char)i;
}

int main(int argc, char **argv) {
  require_gpu("gpu_nvtx_oob");
  int clean = argc > 1 && strcmp(argv[1], "clean") == 0;
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.expandable = 0; /* the NVTX heaps are the cudaMalloc segments of the plain mode */
  gpumem_context *ctx = make_ctx(&cfg);
  unsigned char *a = NULL, *b = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, 1000, NULL, (void **)&a), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(ctx, 0, 4096, NULL, (void **)&b), GPUMEM_OK);
  printf("a = %p (1000 bytes requested), b = %p\n", (void *)a, (void *)b);
  CUDA_OK(cudaSetDevice(0));
  write_bytes<<<4, 256>>>(a, 1000); /* in bounds */
  write_bytes<<<16, 256>>>(b, 4096);
  if (!clean) {
    printf("planting a 1-byte write at a[1000], one past the requested size\n");
    write_bytes<<<1, 1>>>(a + 1000, 1);
  }
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_ST(gpumem_free(ctx, a, NULL), GPUMEM_OK);
  CHECK_ST(gpumem_free(ctx, b, NULL), GPUMEM_OK);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  return finish("gpu_nvtx_oob");
}
