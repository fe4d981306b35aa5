/*
 * gpu_trim_partial: gpumem_trim gives back freed memory inside a segment
 * that still holds live blocks (expandable segments), and shows what plain
 * segments can give back in the same situation.
 *
 * 64 blocks of 64 MiB (4 GiB) are allocated one after the other, so that
 * with expandable segments they lie in one segment; each gets its own byte
 * pattern (cudaMemset). All but 4 blocks scattered through the segment are
 * freed, then gpumem_trim(keep 0).
 *
 * Expandable segments: cudaMemGetInfo's free memory must grow by at least
 * the freed bytes less a few chunks (the physical chunks are at most 8 MiB
 * and unmapped only as a whole), trim must report about as much, and the
 * stats must add up (reserved = live, nothing cached). Plain segments: a
 * segment goes back only when all of it is free, so what trim can return
 * depends on how the blocks were grouped into segments; the figures are
 * printed, not asserted. In both modes the 4 live blocks must keep their
 * contents and stay usable (written and read back with cudaMemset and
 * cudaMemcpy), and the pool must serve a new 1 GiB block afterwards.
 */
#include "gpu_util.h"

#define NBLK 64
#define BLK (64 * MIB)
#define NLIVE 4
static const int live_idx[NLIVE] = {5, 22, 39, 60}; /* scattered through the segment */

static unsigned char *g_host; /* one block's worth of host memory for the read-backs */

static int is_live(int i) {
  for (int k = 0; k < NLIVE; k++)
    if (live_idx[k] == i) return 1;
  return 0;
}

/* Bytes of the block at p that differ from `value` (whole block read back). */
static uint64_t count_wrong(const void *p, unsigned char value) {
  CUDA_OK(cudaMemcpy(g_host, p, BLK, cudaMemcpyDeviceToHost));
  uint64_t bad = 0;
  for (uint64_t i = 0; i < BLK; i++) bad += g_host[i] != value;
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

static void run(int expandable) {
  const char *mode = expandable ? "expandable" : "plain";
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.expandable = expandable;
  cfg.flags |= GPUMEM_CONFIG_NO_ENV; /* this mode, whatever GPUMEM_EXPANDABLE says */
  gpumem_context *ctx = make_ctx(&cfg);
  void *p[NBLK];
  uint64_t f0, f1, f2, f3, total;
  mem_info(0, &f0, &total);

  for (int i = 0; i < NBLK; i++) {
    p[i] = NULL;
    CHECK_ST(gpumem_alloc(ctx, 0, BLK, NULL, &p[i]), GPUMEM_OK);
    if (p[i] != NULL) CUDA_OK(cudaMemset(p[i], 0x10 + i, BLK));
  }
  CUDA_OK(cudaDeviceSynchronize());
  mem_info(0, &f1, NULL);
  gpumem_stats s1 = stats_of(ctx, 0);
  printf("%s: %d x 64 MiB allocated: device free %.3f -> %.3f GiB (total %.3f)\n", mode, NBLK, gib(f0), gib(f1),
         gib(total));
  check_stats(&s1, "after allocating");
  CHECK(s1.num_live == NBLK && s1.allocated_bytes == (uint64_t)NBLK * BLK);
  if (expandable) CHECK(s1.num_segments == 1); /* one expandable segment holds all 64 */

  uint64_t freed = 0;
  for (int i = 0; i < NBLK; i++) {
    if (is_live(i) || p[i] == NULL) continue;
    CHECK_ST(gpumem_free(ctx, p[i], NULL), GPUMEM_OK);
    p[i] = NULL;
    freed += BLK;
  }
  mem_info(0, &f2, NULL);
  gpumem_stats s2 = stats_of(ctx, 0);
  printf("%s: %d blocks freed (%.3f GiB), %d live at blocks %d, %d, %d, %d: device free %.3f GiB (cached, still "
         "taken from the device)\n",
         mode, NBLK - NLIVE, gib(freed), NLIVE, live_idx[0], live_idx[1], live_idx[2], live_idx[3], gib(f2));
  check_stats(&s2, "after freeing");

  uint64_t released = 0;
  CHECK_ST(gpumem_trim(ctx, 0, 0, &released), GPUMEM_OK);
  mem_info(0, &f3, NULL);
  gpumem_stats s3 = stats_of(ctx, 0);
  uint64_t gained = f3 > f2 ? f3 - f2 : 0;
  printf("%s: gpumem_trim(keep 0) released %.3f GiB of the %.3f GiB freed; device free %.3f -> %.3f GiB (+%.3f GiB)\n",
         mode, gib(released), gib(freed), gib(f2), gib(f3), gib(gained));
  check_stats(&s3, "after trim");
  CHECK(s3.num_live == NLIVE && s3.allocated_bytes == (uint64_t)NLIVE * BLK);
  CHECK(released <= freed + 64 * MIB);
  CHECK(gained <= released + 64 * MIB && gained + 64 * MIB >= released); /* the device saw what trim reported */
  if (expandable) {
    const uint64_t slack = 4 * 8 * MIB + 64 * MIB; /* a few chunks, and noise in cudaMemGetInfo */
    CHECK(released + slack >= freed);
    CHECK(gained + slack >= freed);
    CHECK(s3.reserved_bytes <= (uint64_t)NLIVE * BLK + 4 * 8 * MIB);
    CHECK(s3.cached_bytes <= 4 * 8 * MIB);
  } else {
    printf("plain: segments %llu -> %llu; a segment goes back only when every block in it is free, so %.3f GiB of "
           "the freed memory stays cached (%.1f %%)\n",
           (unsigned long long)s2.num_segments, (unsigned long long)s3.num_segments, gib(s3.cached_bytes),
           freed ? 100.0 * (double)s3.cached_bytes / (double)freed : 0.0);
  }

  /* the live blocks kept their contents, and can be written and read */
  for (int k = 0; k < NLIVE; k++) {
    int i = live_idx[k];
    if (p[i] == NULL) continue;
    uint64_t bad = count_wrong(p[i], (unsigned char)(0x10 + i));
    if (bad) printf("%s: live block %d: %llu bytes changed\n", mode, i, (unsigned long long)bad);
    CHECK(bad == 0);
    CUDA_OK(cudaMemset(p[i], 0xA0 + k, BLK));
    CUDA_OK(cudaDeviceSynchronize());
    bad = count_wrong(p[i], (unsigned char)(0xA0 + k));
    CHECK(bad == 0);
  }

  /* the pool still serves: 1 GiB more, written and read back in part */
  void *q = NULL;
  CHECK_ST(gpumem_alloc(ctx, 0, GIB, NULL, &q), GPUMEM_OK);
  if (q != NULL) {
    CUDA_OK(cudaMemset(q, 0x5A, GIB));
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(count_wrong((const unsigned char *)q + GIB - BLK, 0x5A) == 0);
    CHECK_ST(gpumem_free(ctx, q, NULL), GPUMEM_OK);
  }
  for (int k = 0; k < NLIVE; k++)
    if (p[live_idx[k]] != NULL) CHECK_ST(gpumem_free(ctx, p[live_idx[k]], NULL), GPUMEM_OK);
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
  g_host = (unsigned char *)malloc(BLK);
  if (g_host == NULL) {
    printf("FAIL: no host memory\n");
    return 1;
  }
  run(1);
  run(0);
  free(g_host);
  CHECK(cudaGetLastError() == cudaSuccess);
  return finish("gpu_trim_partial");
}
