/* A simulation-style time-step loop: long-lived fields allocated once, and
 * per-step temporaries in a scope that ends with the step. The pool serves
 * the temporaries from its cache: after a few steps in which it settles
 * (expandable segments create a little memory rather than move mapped
 * memory around every step), no step calls the backend. A trim at the end
 * gives the cache back.
 *
 * Usage: example_timestep [steps]   (default 100; sim backend unless GPUMEM_BACKEND is set)
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpumem.h>

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    gpumem_status st_ = (call);                                                                        \
    if (st_ != GPUMEM_OK) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpumem_status_name(st_));          \
      exit(EXIT_FAILURE);                                                                              \
    }                                                                                                  \
  } while (0)

enum { NX = 256, NY = 256 };

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 100;
  if (steps < 2) steps = 2;
  setenv("GPUMEM_BACKEND", "sim", 0);

  gpumem_context *ctx;
  CHECK(gpumem_create(NULL, &ctx));
  const int dev = 0;
  const gpumem_stream stream = NULL; /* a real code passes its cudaStream_t */
  int host_memory = strcmp(gpumem_backend_name(ctx), "sim") == 0; /* sim memory is host memory */

  /* Long-lived state: two fields, swapped each step. */
  const size_t field_bytes = (size_t)NX * NY * sizeof(double);
  void *cur, *next;
  CHECK(gpumem_alloc_tagged(ctx, dev, field_bytes, stream, "field cur", &cur));
  CHECK(gpumem_alloc_tagged(ctx, dev, field_bytes, stream, "field next", &next));
  if (host_memory) memset(cur, 0, field_bytes);

  gpumem_stats st = {.struct_size = sizeof st};
  uint64_t backend_allocs_after_first = 0;
  for (int step = 0; step < steps; step++) {
    gpumem_scope *sc;
    CHECK(gpumem_scope_begin(ctx, dev, stream, &sc));
    /* Temporaries whose sizes vary a little from step to step (adaptive work). */
    size_t nflux = (size_t)NX * NY * (1 + step % 3);
    void *flux_mem, *halo;
    CHECK(gpumem_scope_alloc(sc, nflux * sizeof(double), &flux_mem));
    CHECK(gpumem_scope_alloc(sc, (size_t)(2 * NX + 2 * NY) * sizeof(double), &halo));
    double *flux = flux_mem;
    if (host_memory) { /* the "kernel": next = cur + 1, through the temporaries */
      double *c = cur, *n = next;
      for (size_t i = 0; i < (size_t)NX * NY; i++) {
        flux[i] = 1.0;
        n[i] = c[i] + flux[i];
      }
    }
    CHECK(gpumem_scope_end(sc)); /* temporaries freed, cached for the next step */
    void *t = cur;
    cur = next;
    next = t;

    CHECK(gpumem_get_stats(ctx, dev, &st));
    if (st.num_live != 2) {
      fprintf(stderr, "step %d: %" PRIu64 " live allocations, expected 2\n", step, st.num_live);
      return EXIT_FAILURE;
    }
    if (step == steps / 2) backend_allocs_after_first = st.num_backend_allocs; /* settled */
    if (step % (steps / 4 > 0 ? steps / 4 : 1) == 0)
      printf("step %4d: live %" PRIu64 ", allocated %.2f MiB, reserved %.2f MiB, backend allocations %" PRIu64 "\n",
             step, st.num_live, st.allocated_bytes / 1048576.0, st.reserved_bytes / 1048576.0, st.num_backend_allocs);
  }
  if (host_memory && ((double *)cur)[NX * NY - 1] != (double)steps) {
    fprintf(stderr, "wrong result %g, expected %d\n", ((double *)cur)[NX * NY - 1], steps);
    return EXIT_FAILURE;
  }
  printf("%d steps: %" PRIu64 " allocations served by %" PRIu64 " backend allocations\n", steps, st.num_allocs,
         st.num_backend_allocs);
  if (steps >= 100 && st.num_backend_allocs != backend_allocs_after_first) {
    fprintf(stderr, "steady state still allocates from the backend (second half of the steps)\n");
    return EXIT_FAILURE;
  }

  CHECK(gpumem_free(ctx, cur, stream));
  CHECK(gpumem_free(ctx, next, stream));
  uint64_t released = 0;
  CHECK(gpumem_trim(ctx, dev, 0, &released));
  printf("trim gave back %.2f MiB\n", released / 1048576.0);
  CHECK(gpumem_destroy(ctx, 0));
  return EXIT_SUCCESS;
}
