/*
 * bench-pairs: N alloc+free pairs of 64 KiB through libgpumem on the sim
 * backend. A fixed workload for instruction counting: run it under
 * callgrind for N and 2N and take (Ir(2N) - Ir(N)) / N (see
 * scripts/callgrind-pairs.sh); start-up and teardown cancel out.
 *
 *   bench-pairs N [SIZE] [STREAM]
 *
 * STREAM (a number, default 0 = NULL): the pairs on that made-up sim stream handle, e.g. 256: an
 * allocation on a stream other than NULL asks whether it is captured (capture_probe).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpumem.h"
#include "tools_common.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench-pairs N [SIZE] [STREAM]\n");
    return 2;
  }
  unsigned long long n = strtoull(argv[1], NULL, 10);
  size_t size = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : (size_t)64 * 1024;
  gpumem_stream s = argc > 3 ? (gpumem_stream)(uintptr_t)strtoull(argv[3], NULL, 10) : NULL;
  gpumem_context *ctx = tools_sim_context("bench-pairs");
  if (ctx == NULL) return 1;
  gpumem_status st;
  void *p;
  /* warm-up: the first pair grows the pool */
  if (gpumem_alloc(ctx, 0, size, s, &p) != GPUMEM_OK || gpumem_free(ctx, p, s) != GPUMEM_OK) return 1;
  for (unsigned long long i = 0; i < n; i++) {
    if ((st = gpumem_alloc(ctx, 0, size, s, &p)) != GPUMEM_OK || (st = gpumem_free(ctx, p, s)) != GPUMEM_OK) {
      fprintf(stderr, "bench-pairs: pair %llu: %s\n", i, gpumem_status_name(st));
      return 1;
    }
  }
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  return 0;
}
