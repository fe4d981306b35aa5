/*
 * gpumem-share-demo: the processes of the shared-GPU scenario (scripts/gpu-share.sh, docs/SHARED-GPUS.md).
 *
 *   gpumem-share-demo hold [--backend B] [--gib N] [--live]   allocate N x 1 GiB, free them (unless --live),
 *                                                              say "ready", idle until stdin closes
 *   gpumem-share-demo ask  [--backend B] [--gib N]            allocate N x 1 GiB and keep them: how many it got,
 *                                                              the failures, the slowest call, the asks made
 *   gpumem-share-demo fill [--backend B] [--below F]          outside the library (the backend's own malloc, as
 *                                                              another program's cudaMalloc): take 1 GiB pieces
 *                                                              while the device's free fraction is above F
 *                                                              (default 0.05), then watch free memory for 5 s
 *
 * Sharing is configured by the environment (GPUMEM_SHARE, GPUMEM_SHARE_WAIT_MS, GPUMEM_WATCH_MS).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"
#include "gpumem/backend.h"

#define GiB ((uint64_t)1 << 30)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static gpumem_context *open_ctx(const char *backend) {
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = backend;
  gpumem_context *ctx = NULL;
  gpumem_status st = gpumem_create(&cfg, &ctx);
  if (st != GPUMEM_OK) {
    fprintf(stderr, "gpumem-share-demo: gpumem_create(%s): %s\n", backend, gpumem_status_name(st));
    return NULL;
  }
  return ctx;
}

static void device_free(gpumem_context *ctx, uint64_t *fr, uint64_t *tot) {
  gpumem_device_info di;
  di.struct_size = sizeof di;
  *fr = *tot = 0;
  if (gpumem_device_get_info(ctx, 0, &di) == GPUMEM_OK) {
    *fr = di.free_bytes;
    *tot = di.total_bytes;
  }
}

static int hold(const char *backend, int gib, int live) {
  gpumem_context *ctx = open_ctx(backend);
  if (ctx == NULL) return 1;
  void **p = calloc((size_t)gib, sizeof *p);
  int got = 0;
  for (int i = 0; i < gib; i++)
    if (gpumem_alloc(ctx, 0, GiB, NULL, &p[i]) == GPUMEM_OK) got++;
    else p[i] = NULL;
  if (!live)
    for (int i = 0; i < gib; i++)
      if (p[i] != NULL) (void)gpumem_free(ctx, p[i], NULL);
  gpumem_stats st;
  st.struct_size = sizeof st;
  (void)gpumem_get_stats(ctx, 0, &st);
  uint64_t fr, tot;
  device_free(ctx, &fr, &tot);
  printf("hold: pid %d allocated %d x 1 GiB, %s; reserved %.2f GiB, cached %.2f GiB; device free %.2f of %.2f GiB\n",
         (int)getpid(), got, live ? "kept live" : "freed (cached)", (double)st.reserved_bytes / GiB,
         (double)st.cached_bytes / GiB, (double)fr / GiB, (double)tot / GiB);
  printf("ready\n");
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  (void)gpumem_get_stats(ctx, 0, &st);
  printf("hold: at exit reserved %.2f GiB, cached %.2f GiB; asked by others %llu times, gave back %.2f GiB, "
         "trimmed %.2f GiB in %llu trims\n", (double)st.reserved_bytes / GiB, (double)st.cached_bytes / GiB,
         (unsigned long long)st.num_share_asked, (double)st.share_given_bytes / GiB, (double)st.trimmed_bytes / GiB,
         (unsigned long long)st.num_trims);
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  free(p);
  return 0;
}

static int ask(const char *backend, int gib) {
  gpumem_context *ctx = open_ctx(backend);
  if (ctx == NULL) return 1;
  void **p = calloc((size_t)gib, sizeof *p);
  int got = 0, failed = 0;
  double slowest = 0, t0 = now_s();
  for (int i = 0; i < gib; i++) {
    double a = now_s();
    gpumem_status s = gpumem_alloc(ctx, 0, GiB, NULL, &p[i]);
    double dt = now_s() - a;
    if (dt > slowest) slowest = dt;
    if (s == GPUMEM_OK) got++;
    else {
      p[i] = NULL;
      failed++;
    }
  }
  double total = now_s() - t0;
  gpumem_stats st;
  st.struct_size = sizeof st;
  (void)gpumem_get_stats(ctx, 0, &st);
  printf("ask: pid %d got %d GiB of %d, %d failed allocations; %.3f s in all, slowest call %.1f ms; asked the group "
         "%llu times\n", (int)getpid(), got, gib, failed, total, slowest * 1e3, (unsigned long long)st.num_share_asks);
  printf("RESULT got_gib=%d failures=%d total_s=%.3f slowest_ms=%.1f asks=%llu\n", got, failed, total, slowest * 1e3,
         (unsigned long long)st.num_share_asks);
  for (int i = 0; i < gib; i++)
    if (p[i] != NULL) (void)gpumem_free(ctx, p[i], NULL);
  gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  free(p);
  return 0;
}

static int fill(const char *backend, double below) {
  const gpumem_backend *b = gpumem_builtin_backend(backend);
  if (b == NULL) {
    fprintf(stderr, "gpumem-share-demo: backend %s not built\n", backend);
    return 1;
  }
  gpumem_backend be = *b;
  if (be.init != NULL && be.init(&be) != 0) {
    fprintf(stderr, "gpumem-share-demo: backend %s: init failed\n", backend);
    return 1;
  }
  uint64_t fr = 0, tot = 0;
  if (be.mem_get_info(&be, 0, &fr, &tot) != 0 || tot == 0) return 1;
  void *p[512];
  int n = 0;
  double t0 = now_s();
  while (n < 512 && (double)fr > below * (double)tot + (double)GiB) {
    if (be.malloc(&be, 0, GiB, &p[n]) != 0) break;
    n++;
    (void)be.mem_get_info(&be, 0, &fr, &tot);
  }
  double t_full = now_s();
  printf("fill: took %d GiB outside libgpumem in %.2f s; device free %.2f of %.2f GiB (%.1f %%)\n", n, t_full - t0,
         (double)fr / GiB, (double)tot / GiB, 100.0 * (double)fr / (double)tot);
  uint64_t start = fr, best = fr;
  double t_back = -1;
  while (now_s() - t_full < 5.0) {
    (void)be.mem_get_info(&be, 0, &fr, &tot);
    if (fr > best) best = fr;
    if (t_back < 0 && fr > start + GiB) t_back = now_s() - t_full;
    usleep(2000);
  }
  printf("fill: in the next 5 s free memory rose from %.2f to %.2f GiB; first GiB back after %s%.0f ms\n",
         (double)start / GiB, (double)best / GiB, t_back < 0 ? "(never) " : "", t_back < 0 ? 0.0 : t_back * 1e3);
  printf("RESULT filled_gib=%d free_before_gib=%.2f free_after_gib=%.2f back_ms=%.0f\n", n, (double)start / GiB,
         (double)best / GiB, t_back < 0 ? -1.0 : t_back * 1e3);
  for (int i = 0; i < n; i++) (void)be.free(&be, 0, p[i]);
  if (be.shutdown != NULL) be.shutdown(&be);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gpumem-share-demo hold|ask|fill [--backend B] [--gib N] [--live] [--below F]\n");
    return 2;
  }
  const char *backend = "auto";
  int gib = 83, live = 0;
  double below = 0.05;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
    else if (!strcmp(argv[i], "--gib") && i + 1 < argc) gib = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--below") && i + 1 < argc) below = atof(argv[++i]);
    else if (!strcmp(argv[i], "--live")) live = 1;
    else {
      fprintf(stderr, "gpumem-share-demo: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (gib < 1 || gib > 4096) return 2;
  if (!strcmp(argv[1], "hold")) return hold(backend, gib, live);
  if (!strcmp(argv[1], "ask")) return ask(backend, gib);
  if (!strcmp(argv[1], "fill")) return fill(backend, below);
  fprintf(stderr, "gpumem-share-demo: unknown mode %s\n", argv[1]);
  return 2;
}
