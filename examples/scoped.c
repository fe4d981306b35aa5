/* Scoped handles in C: GPUMEM_SCOPED buffers (released automatically when
 * the variable goes out of scope, GCC and Clang) and scopes (a region whose
 * allocations are all freed at gpumem_scope_end). Runs on the simulator by
 * default (GPUMEM_BACKEND=sim unless set).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <gpumem.h>

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    gpumem_status st_ = (call);                                                                        \
    if (st_ != GPUMEM_OK) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpumem_status_name(st_));          \
      exit(EXIT_FAILURE);                                                                              \
    }                                                                                                  \
  } while (0)

static uint64_t live(gpumem_context *ctx) {
  gpumem_stats st = {.struct_size = sizeof st};
  CHECK(gpumem_get_stats(ctx, GPUMEM_ALL_DEVICES, &st));
  return st.num_live;
}

#ifdef GPUMEM_SCOPED
/* Returns early on purpose: the buffers are released on every path. */
static int step_with_scoped_buffers(gpumem_context *ctx, int fail_early) {
  GPUMEM_SCOPED gpumem_buffer in = {0};
  GPUMEM_SCOPED gpumem_buffer out = {0};
  CHECK(gpumem_buffer_alloc(ctx, 0, 1 << 20, NULL, &in));
  printf("  in  %p (%zu bytes), live %" PRIu64 "\n", in.ptr, in.size, live(ctx));
  if (fail_early) return -1; /* `in` is released here */
  CHECK(gpumem_buffer_alloc(ctx, 0, 2 << 20, NULL, &out));
  printf("  out %p (%zu bytes), live %" PRIu64 "\n", out.ptr, out.size, live(ctx));
  return 0; /* both released here */
}
#endif

int main(void) {
  setenv("GPUMEM_BACKEND", "sim", 0);
  gpumem_context *ctx;
  CHECK(gpumem_create(NULL, &ctx));
  printf("backend %s\n", gpumem_backend_name(ctx));

#ifdef GPUMEM_SCOPED
  printf("GPUMEM_SCOPED buffers, leaving early:\n");
  step_with_scoped_buffers(ctx, 1);
  printf("  live after return: %" PRIu64 "\n", live(ctx));
  if (live(ctx) != 0) return EXIT_FAILURE;
  printf("GPUMEM_SCOPED buffers, full step:\n");
  step_with_scoped_buffers(ctx, 0);
  printf("  live after return: %" PRIu64 "\n", live(ctx));
  if (live(ctx) != 0) return EXIT_FAILURE;
#else
  printf("GPUMEM_SCOPED needs GCC or Clang; using gpumem_buffer_release by hand\n");
#endif

  /* A buffer released by hand; releasing twice is harmless. */
  gpumem_buffer b = {0};
  CHECK(gpumem_buffer_alloc(ctx, 0, 4096, NULL, &b));
  gpumem_buffer_release(&b);
  gpumem_buffer_release(&b);
  if (b.ptr != NULL || live(ctx) != 0) return EXIT_FAILURE;

  /* A scope: temporaries of one phase, freed together. */
  printf("scope with temporaries:\n");
  gpumem_scope *sc;
  CHECK(gpumem_scope_begin(ctx, 0, NULL, &sc));
  CHECK(gpumem_scope_set_tag(sc, "phase-1 temporaries"));
  void *tmp[8];
  for (int i = 0; i < 8; i++) CHECK(gpumem_scope_alloc(sc, (size_t)(i + 1) * 100000 * sizeof(double), &tmp[i]));
  printf("  8 temporaries allocated, live %" PRIu64 "\n", live(ctx));
  if (live(ctx) != 8) return EXIT_FAILURE;
  CHECK(gpumem_scope_end(sc));
  printf("  scope ended, live %" PRIu64 "\n", live(ctx));
  if (live(ctx) != 0) return EXIT_FAILURE;

  gpumem_stats st = {.struct_size = sizeof st};
  CHECK(gpumem_get_stats(ctx, GPUMEM_ALL_DEVICES, &st));
  printf("%" PRIu64 " allocations, %" PRIu64 " frees, %" PRIu64 " backend allocations, %.1f MiB cached\n",
         st.num_allocs, st.num_frees, st.num_backend_allocs, st.cached_bytes / (1024.0 * 1024.0));
  CHECK(gpumem_destroy(ctx, 0)); /* OK: nothing leaked */
  return EXIT_SUCCESS;
}
