/*
 * gpu_trim_partial: gpumem_trim gives back freed memory inside a segment
 * that still holds live blocks (expandable segments), and shows what plain
 * segments can give back in the same situation.
 *
 * Two layouts, each in both modes:
 *  A. 64 blocks of 64 MiB (4 GiB), allocated one after the other (with
 *     expandable segments they lie in one segment); all but 4 blocks
 *     scattered through it are freed.
 *  B. 400 blocks of 5 MiB (2000 MiB), every 10th kept live (40 blocks):
 *     plain segments put 4 such blocks in one 20 MiB segment, and the
 *     blocks do not end on 2 MiB boundaries.
 * Each block gets its own byte pattern (cudaMemset); then gpumem_trim(keep 0).
 *
 * Expandable segments: cudaMemGetInfo's free memory must grow by what trim
 * reports, and that must be the freed bytes less what the live blocks keep
 * mapped around them: physical chunks are at most 8 MiB and go back only as
 * a whole, so a live block can keep at most 16 MiB of free neighbours (A:
 * 64 MiB blocks fill their chunks exactly: everything freed goes back).
 * Plain segments: a segment goes back only when all of it is free, so what
 * trim can return depends on how blocks were grouped into segments (A: one
 * segment per 64 MiB block, all of it; B: only segments without a live
 * block); the figures are printed, not asserted. In both modes the live
 * blocks must keep their contents and stay usable (written and read back
 * with cudaMemset and cudaMemcpy), the stats must add up, and the pool must
 * serve a new 1 GiB block afterwards.
 */
#include "gpu_util.h"

#define MAXBLK (64 * MIB)
#define MAXN 400

typedef struct layout {
  const char *name;
  int n;          /* blocks */
  uint64_t size;  /* bytes each */
  int live_every; /* block i stays live when i % live_every == live_at (0: the list below) */
  int live_at;
} layout;

static const int live_a[] = {5, 22, 39, 60}; /* layout A: scattered through the segment */

static unsigned char *g_host; /* one block's worth of host memory for the read-backs */

static int is_live(const layout *l, int i) {
  if (l->live_every > 0) return i % l->live_every == l->live_at;
  for (size_t k = 0; k < sizeof live_a / sizeof live_a[0]; k++)
    if (live_a[k] == i) return 1;
  return 0;
}

/* Bytes of the n-byte block at p that differ from `value` (whole block read back). */
static uint64_t count_wrong(const void *p, uint64_t n, unsigned char value) {
  CUDA_OK(cudaMemcpy(g_host, p, n, cudaMemcpyDeviceToHost));
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; i++) bad += g_host[i] != value;
  return bad;
}

static void check_stats(const gpumem_stats *s, const char *when) {
  printf("  stats %s: allocated %.3f GiB, reserved %.3f GiB, cached %.3f GiB, live %llu, segments %llu, trims %llu, "
         "trimmed %.3f GiB\n",
         when, gib(s->allocated_bytes), gib(s->reserved_bytes), gib(s->cached_bytes), (unsigned long long)s->num_live,
         (unsigned long long)s->num_segments, (unsigned long long)s->num_trims, gib(s->trimmed_bytes));
  CHECK(s->reserved_bytes >= s->allocated_bytes);
  CHECK(s->cached_bytes == s->reserved_bytes - s->allocated_bytes);
  CHECK(s->reserved_peak >= s->reserved_bytes);
  CHECK(s->allocated_peak >= s->allocated_bytes);
}

static void run(const layout *l, int expandable) {
  char mode[64];
  snprintf(mode, sizeof mode, "%s, %s", l->name, expandable ? "expandable" : "plain");
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.expandable = expandable;
  cfg.flags |= GPUMEM_CONFIG_NO_ENV; /* this mode, whatever GPUMEM_EXPANDABLE says */
  gpumem_context *ctx = make_ctx(&cfg);
  static void *p[MAXN];
  const uint64_t n = l->size;
  uint64_t f0, f1, f2, f3, total;
  mem_info(0, &f0, &total);

  for (int i = 0; i < l->n; i++) {
    p[i] = NULL;
    CHECK_ST(gpumem_alloc(ctx, 0, n, NULL, &p[i]), GPUMEM_OK);
    if (p[i] != NULL) CUDA_OK(cudaMemset(p[i], (i * 7 + 1) & 0xff, n));
  }
  CUDA_OK(cudaDeviceSynchronize());
  mem_info(0, &f1, NULL);
  gpumem_stats s1 = stats_of(ctx, 0);
  printf("%s: %d x %.0f MiB allocated: device free %.3f -> %.3f GiB (total %.3f)\n", mode, l->n,
         (double)n / (double)MIB, gib(f0), gib(f1), gib(total));
  check_stats(&s1, "after allocating");
  CHECK(s1.num_live == (uint64_t)l->n && s1.allocated_bytes == (uint64_t)l->n * n);
  if (expandable) CHECK(s1.num_segments == 1); /* one expandable segment holds them all */

  uint64_t freed = 0;
  int nlive = 0;
  for (int i = 0; i < l->n; i++) {
    if (is_live(l, i)) {
      nlive++;
      continue;
    }
    if (p[i] == NULL) continue;
    CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
    p[i] = NULL;
    freed += n;
  }
  mem_info(0, &f2, NULL);
  gpumem_stats s2 = stats_of(ctx, 0);
  printf("%s: %d blocks freed (%.3f GiB), %d live: device free %.3f GiB (cached, still taken from the device)\n", mode,
         l->n - nlive, gib(freed), nlive, gib(f2));
  check_stats(&s2, "after freeing");

  uint64_t released = 0;
  CHECK_ST(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  mem_info(0, &f3, NULL);
  gpumem_stats s3 = stats_of(ctx, 0);
  uint64_t gained = f3 > f2 ? f3 - f2 : 0;
  printf("%s: gpumem_trim(keep 0) released %.3f GiB of the %.3f GiB freed (%.1f %%); device free %.3f -> %.3f GiB "
         "(+%.3f GiB); %.3f GiB stays reserved for %.3f GiB live\n",
         mode, gib(released), gib(freed), freed ? 100.0 * (double)released / (double)freed : 0.0, gib(f2), gib(f3),
         gib(gained), gib(s3.reserved_bytes), gib(s3.allocated_bytes));
  check_stats(&s3, "after trim");
  CHECK(s3.num_live == (uint64_t)nlive && s3.allocated_bytes == (uint64_t)nlive * n);
  CHECK(s3.cached_bytes == s3.reserved_bytes - s3.allocated_bytes);
  CHECK(released <= freed + 64 * MIB);
  CHECK(gained <= released + 64 * MIB && gained + 64 * MIB >= released); /* the device saw what trim reported */
  if (expandable) {
    /* a live block keeps at most 16 MiB of free neighbours mapped (A: none); 64 MiB of cudaMemGetInfo noise */
    const uint64_t kept = (n % (2 * MIB) == 0 ? 0 : (uint64_t)nlive * 16 * MIB), noise = 64 * MIB;
    CHECK(released + kept >= freed);
    CHECK(gained + kept + noise >= freed);
    CHECK(s3.reserved_bytes <= s3.allocated_bytes + kept);
  } else {
    printf("%s: segments %llu -> %llu; a segment goes back only when every block in it is free, so %.3f GiB of the "
           "freed memory stays cached\n",
           mode, (unsigned long long)s2.num_segments, (unsigned long long)s3.num_segments, gib(s3.cached_bytes));
  }

  /* the live blocks kept their contents, and can be written and read */
  uint64_t bad_total = 0;
  for (int i = 0; i < l->n; i++) {
    if (!is_live(l, i) || p[i] == NULL) continue;
    uint64_t bad = count_wrong(p[i], n, (unsigned char)((i * 7 + 1) & 0xff));
    if (bad) printf("%s: live block %d: %llu bytes changed\n", mode, i, (unsigned long long)bad);
    bad_total += bad;
    CUDA_OK(cudaMemset(p[i], 0xA5, n));
    CUDA_OK(cudaDeviceSynchronize());
    bad_total += count_wrong(p[i], n, 0xA5);
  }
  printf("%s: %d live blocks read back, rewritten and read again: %llu wrong bytes\n", mode, nlive,
         (unsigned long long)bad_total);
  CHECK(bad_total == 0);

  /* the pool still serves: 1 GiB more, written and its last 64 MiB read back */
  void *q = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &q), GPUMEM_OK);
  if (q != NULL) {
    CUDA_OK(cudaMemset(q, 0x5A, GIB));
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(count_wrong((const unsigned char *)q + GIB - MAXBLK, MAXBLK, 0x5A) == 0);
    CHECK_ST(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  }
  for (int i = 0; i < l->n; i++)
    if (p[i] != NULL) CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
  gpumem_stats s4 = stats_of(ctx, 0);
  check_stats(&s4, "at the end");
  CHECK(s4.num_live == 0 && s4.allocated_bytes == 0);
  CHECK_ST(gpumem_destroy(ctx, 0), GPUMEM_OK);
  uint64_t f5;
  mem_info(0, &f5, NULL);
  printf("%s: destroyed: device free %.3f GiB (start %.3f)\n", mode, gib(f5), gib(f0));
  CHECK(f5 + 64 * MIB >= f0);
}

int main(void) {
  require_gpu("gpu_trim_partial");
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0));
  g_host = (unsigned char *)malloc(MAXBLK);
  if (g_host == NULL) {
    printf("FAIL: no host memory\n");
    return 1;
  }
  static const layout a = {"A: 64 x 64 MiB", 64, 64 * MIB, 0, 0};
  static const layout b = {"B: 400 x 5 MiB", 400, 5 * MIB, 10, 3};
  run(&a, 1);
  run(&a, 0);
  run(&b, 1);
  run(&b, 0);
  free(g_host);
  CHECK(cudaGetLastError() == cudaSuccess);
  return finish("gpu_trim_partial");
}
