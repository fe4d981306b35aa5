/*
 * bench-pairs: N alloc+free pairs of 64 KiB through libgpumem on the sim
 * backend. A fixed workload for instruction counting: run it under
 * callgrind for N and 2N and take (Ir(2N) - Ir(N)) / N (see
 * scripts/callgrind-pairs.sh); start-up and teardown cancel out.
 *
 *   bench-pairs N [SIZE]
 */
#include <stdio.h>
#include <stdlib.h>

#include "gpumem.h"
#include "tools_common.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench-pairs N [SIZE]\n");
    return 2;
  }
  unsigned long long n = strtoull(argv[1], NULL, 10);
  size_t size = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : (size_t)64 * 1024;
  gpumem_context *ctx = tools_sim_context("bench-pairs");
  if (ctx == NULL) return 1;
  gpumem_status st;
  void *p;
  /* warm-up: the first pair grows the pool */
  if (gpumem_alloc(ctx, 0, size, NULL, &p) != GPUMEM_OK || gpumem_free(ctx, p, NULL) != GPUMEM_OK) return 1;
  for (unsigned long long i = 0; i < n; i++) {
    if ((st = gpumem_alloc(ctx, 0, size, NULL, &p)) != GPUMEM_OK || (st = gpumem_free(ctx, p, NULL)) != GPUMEM_OK) {
      fprintf(stderr, "bench-pairs: pair %llu: %s\n", i, gpumem_status_name(st));
      return 1;
    }
  }
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  return 0;
}
