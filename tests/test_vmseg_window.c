/* vmseg.c: gpumem__vm_best_window, the lowest-cost start of a large block inside a READY block.
 * The scan steps 64 starts at a time where no step can lower the cost (from the idle and unmapped
 * bit maps); this checks it against the plain one-start-at-a-time scan on random granule maps:
 * the same answer, the same start, the same cost and the same budget left, for every map, range,
 * size, cap and budget. */
#include "testutil.h"

#include "../src/vmseg.h"

/* the scan one start at a time (the rule gpumem__vm_best_window follows) */
static int ref_window(const gpumem__vmspace *vs, uintptr_t lo, uintptr_t last, size_t size, size_t cap,
                      size_t *budget, uintptr_t *addr, size_t *cost) {
  if (size == 0 || last < lo || *budget == 0) return 0;
  const unsigned sh = vs->gshift;
  const uintptr_t gs = (uintptr_t)1 << sh;
  uintptr_t off = (lo - vs->base + gs - 1) & ~(gs - 1), end = last - vs->base;
  if (off > end) return 0;
  uint32_t g = (uint32_t)(off >> sh), gend = (uint32_t)(end >> sh);
  uint32_t w = (uint32_t)((size + gs - 1) >> sh);
  if (cap <= (size_t)w - 1) return 0;
  if (gend >= vs->hi) gend = vs->hi > g ? vs->hi - 1 : g;
  size_t c = 0;
  for (uint32_t k = g; k < g + w; k++) c += gpumem__vm_gran_cost(vs, k);
  *budget = *budget > w ? *budget - w : 0;
  size_t best = cap;
  uint32_t bg = 0;
  for (;;) {
    if (c < best) {
      best = c;
      bg = g;
      if (best <= (size_t)w - 1) break;
    }
    if (g == gend || *budget == 0) break;
    --*budget;
    c = c - gpumem__vm_gran_cost(vs, g) + gpumem__vm_gran_cost(vs, g + w);
    g++;
  }
  if (best >= cap) return 0;
  *addr = vs->base + ((uintptr_t)bg << sh);
  *cost = best;
  return 1;
}

#define N 4096u
#define SH 21u

static uint32_t cid[N], busy[N];
static uint64_t idleb[N / 64], unmb[N / 64];

/* A random map in runs (chunks mapped or not, busy stretches), as a pool leaves it: a busy granule
 * is mapped, an unmapped one is idle. */
static void random_map(uint64_t *rng, gpumem__vmspace *vs) {
  memset(idleb, 0, sizeof idleb);
  memset(unmb, 0, sizeof unmb);
  uint32_t g = 0;
  int kind = 0;
  while (g < N) {
    uint32_t run = 1 + (uint32_t)tu_rand_range(rng, 0, tu_rand(rng) % 4 == 0 ? 300 : 20);
    kind = (int)(tu_rand(rng) % 3); /* 0 busy, 1 idle mapped, 2 unmapped */
    for (uint32_t k = 0; k < run && g < N; k++, g++) {
      cid[g] = kind == 2 ? GPUMEM__VM_NIL : g / 4;
      busy[g] = kind == 0 ? 1 + (uint32_t)(tu_rand(rng) % 4096) : 0;
      if (busy[g] == 0) idleb[g >> 6] |= (uint64_t)1 << (g & 63);
      if (cid[g] == GPUMEM__VM_NIL) unmb[g >> 6] |= (uint64_t)1 << (g & 63);
    }
  }
  memset(vs, 0, sizeof *vs);
  vs->base = (uintptr_t)1 << 40;
  vs->cid = cid;
  vs->busy = busy;
  vs->idleb = idleb;
  vs->unmb = unmb;
  vs->gshift = SH;
  vs->n = N;
  vs->hi = (uint32_t)tu_rand_range(rng, 1, N);
}

static void test_window_matches_plain_scan(void **state) {
  (void)state;
  uint64_t rng = 12345;
  gpumem__vmspace vs;
  unsigned found = 0, fast = 0;
  const int maps = tu_on_valgrind() ? 40 : 400;
  for (int m = 0; m < maps; m++) {
    random_map(&rng, &vs);
    for (int q = 0; q < 50; q++) {
      const uintptr_t gs = (uintptr_t)1 << SH;
      uint32_t w = 1 + (uint32_t)tu_rand_range(&rng, 0, tu_rand(&rng) % 2 ? 600 : 40);
      size_t size = (size_t)w * gs - (size_t)tu_rand_range(&rng, 0, gs - 1);
      /* the window's last granule stays in the map: last + size <= the end of the space */
      uint32_t g0 = (uint32_t)tu_rand_range(&rng, 0, N - w);
      uint32_t g1 = (uint32_t)tu_rand_range(&rng, g0, N - w);
      uintptr_t lo = vs.base + ((uintptr_t)g0 << SH) + (tu_rand(&rng) % 3 == 0 ? tu_rand(&rng) % gs : 0);
      uintptr_t last = vs.base + ((uintptr_t)g1 << SH);
      size_t cap = tu_rand(&rng) % 4 == 0 ? SIZE_MAX : (size_t)tu_rand_range(&rng, 0, 3 * (uint64_t)w);
      size_t budget = tu_rand(&rng) % 3 == 0 ? (size_t)tu_rand_range(&rng, 0, 3000) : 32768;
      size_t b1 = budget, b2 = budget, c1 = 0, c2 = 0;
      uintptr_t a1 = 0, a2 = 0;
      int r1 = gpumem__vm_best_window(&vs, lo, last, size, cap, &b1, &a1, &c1);
      int r2 = ref_window(&vs, lo, last, size, cap, &b2, &a2, &c2);
      if (r1 != r2 || b1 != b2 || (r1 && (a1 != a2 || c1 != c2))) {
        print_error("map %d query %d: lo %u last %u w %u cap %zu budget %zu: got %d %zu %#lx %zu, want %d %zu %#lx %zu\n",
                    m, q, g0, g1, w, cap, budget, r1, b1, (unsigned long)a1, c1, r2, b2, (unsigned long)a2, c2);
        fail();
      }
      found += (unsigned)r1;
      fast += g1 - g0 >= 64;
    }
  }
  /* the maps and queries reach both answers and the 64-at-a-time steps */
  assert_true(found > 100);
  assert_true(fast > 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window_matches_plain_scan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
