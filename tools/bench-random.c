/*
 * bench-random: gpumem-bench's random live set (tools_random_ops: 50,000
 * operations, at most 1000 blocks live, sizes log-uniform in 256 B .. 4 MiB)
 * through libgpumem on the sim backend, PASSES times over in one context. A
 * fixed workload for instruction counting: run it under callgrind for P and 2P
 * passes and take (Ir(2P) - Ir(P)) / (P * 50000) (see
 * scripts/callgrind-random.sh): start-up, the first pass's growth and teardown
 * cancel out, what is left is the steady state.
 *
 *   bench-random PASSES
 */
#include <stdio.h>
#include <stdlib.h>

#include "gpumem.h"
#include "tools_common.h"

enum { NOPS = 50000 };

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench-random PASSES\n");
    return 2;
  }
  int passes = atoi(argv[1]);
  tools_rand_op *ops = tools_random_ops(NOPS);
  if (ops == NULL) return 1;
  gpumem_context *ctx = tools_sim_context("bench-random");
  if (ctx == NULL) {
    free(ops);
    return 1;
  }
  gpumem_status st = GPUMEM_OK;
  static void *live[TOOLS_RANDOM_MAX_LIVE];
  for (int p = 0; p < passes; p++) {
    size_t n = 0;
    for (size_t i = 0; i < NOPS; i++) {
      if (ops[i].size > 0) {
        st = gpumem_alloc(ctx, 0, ops[i].size, NULL, &live[n++]);
      } else {
        st = gpumem_free(ctx, live[ops[i].index], NULL);
        live[ops[i].index] = live[--n];
      }
      if (st != GPUMEM_OK) {
        fprintf(stderr, "bench-random: pass %d, operation %zu: %s\n", p, i, gpumem_status_name(st));
        free(ops);
        return 1;
      }
    }
    while (n > 0) (void)gpumem_free(ctx, live[--n], NULL);
  }
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  free(ops);
  return 0;
}
