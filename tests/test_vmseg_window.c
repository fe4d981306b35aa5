/* vmseg.c / vmseg.h: the granule map's fast paths against granule-by-granule rules.
 * - gpumem__vm_best_window, the lowest-cost start of a large block inside a READY block: the scan
 *   steps 64 starts at a time where no step can lower the cost (from the idle and unmapped bit
 *   maps); against the plain one-start-at-a-time scan on random granule maps: the same answer, the
 *   same start, the same cost and the same budget left, for every map, range, size, cap and budget.
 * - gpumem__vm_place_cost and gpumem__vm_unmapped, which count short and long ranges from the bit
 *   maps: against the sum over their granules, for every cap.
 * - gpumem__vm_busy (busy bytes added and taken away; over more than a few granules a word of the
 *   idle map at a time): against a byte count per granule, the idle map and the chunks' idle and
 *   pinned granules, on a real pool of the sim backend. */
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

/* placement costs and unmapped counts of ranges of 1 to 400 granules, any start in a granule */
static void test_place_cost_matches_granules(void **state) {
  (void)state;
  uint64_t rng = 777;
  gpumem__vmspace vs;
  const uintptr_t gs = (uintptr_t)1 << SH;
  unsigned short_two_words = 0, over_cap = 0;
  const int maps = tu_on_valgrind() ? 20 : 200;
  for (int m = 0; m < maps; m++) {
    random_map(&rng, &vs);
    for (int q = 0; q < 200; q++) {
      uint32_t w = 1 + (uint32_t)tu_rand_range(&rng, 0, tu_rand(&rng) % 4 == 0 ? 400 : 40);
      uint32_t g0 = (uint32_t)tu_rand_range(&rng, 0, N - w);
      uintptr_t addr = vs.base + ((uintptr_t)g0 << SH) + (tu_rand(&rng) % 2 ? tu_rand(&rng) % gs : 0);
      /* [addr, addr + size) ends in granule g0 + w - 1 */
      uintptr_t lim = vs.base + ((uintptr_t)(g0 + w) << SH);
      size_t size = (size_t)(lim - addr) - (size_t)(tu_rand(&rng) % 2 ? tu_rand(&rng) % (lim - addr) % gs : 0);
      uint32_t last = (uint32_t)((addr + size - 1 - vs.base) >> SH);
      size_t want = 0, unm = 0;
      for (uint32_t g = g0; g <= last; g++) {
        want += gpumem__vm_gran_cost(&vs, g);
        unm += vs.cid[g] == GPUMEM__VM_NIL;
      }
      assert_int_equal(gpumem__vm_place_cost(&vs, addr, size, SIZE_MAX), want);
      assert_int_equal(gpumem__vm_unmapped(&vs, addr, size), unm);
      size_t cap = (size_t)tu_rand_range(&rng, 0, 2 * (uint64_t)(last - g0 + 1));
      size_t got = gpumem__vm_place_cost(&vs, addr, size, cap);
      if (want <= cap) assert_int_equal(got, want);
      else assert_true(got > cap);
      over_cap += want > cap;
      short_two_words += last - g0 < 32 && (g0 >> 6) != (last >> 6);
    }
  }
  assert_int_equal(gpumem__vm_place_cost(&vs, vs.base, 0, SIZE_MAX), 0);
  assert_int_equal(gpumem__vm_unmapped(&vs, vs.base, 0), 0);
  assert_true(short_two_words > 100);
  assert_true(over_cap > 100);
}

#define BR_GRANULES 700u
#define BR_LIVE 48

/* Busy bytes over a real space: random disjoint ranges made busy and idle again, short and long,
 * aligned and not; after every change the counts, the idle map, and the pool's idle and pinned
 * granules (chunks whose granules are all idle, idle granules of chunks that are not) are what the
 * byte count per granule says. */
static void test_busy_matches_granules(void **state) {
  (void)state;
  if (!tu_is_sim()) skip();
  gpumem_context *ctx = tu_ctx_new(NULL);
  gpumem_stats st;
  memset(&st, 0, sizeof st);
  st.allocated_peak = (uint64_t)1 << 40; /* new memory for every commit, no idle chunk moved */
  gpumem__vmpool *vp = gpumem__vm_pool_new(ctx, 0, (uint64_t)64 << 30, &st);
  assert_non_null(vp);
  const size_t gs = gpumem__vm_granularity(vp);
  gpumem__vmspace *vs = NULL;
  uintptr_t base = 0;
  size_t size = 0;
  assert_int_equal(gpumem__vm_space_open(vp, BR_GRANULES * gs, &vs, &base, &size), GPUMEM_OK);
  /* chunks of several lengths: commits of 1 to 9 granules, one after another */
  uint64_t rng = 4242;
  for (uint32_t g = 0; g < BR_GRANULES;) {
    uint32_t n = 1 + (uint32_t)(tu_rand(&rng) % 9);
    if (g + n > BR_GRANULES) n = BR_GRANULES - g;
    assert_int_equal(gpumem__vm_commit(vs, base + (uintptr_t)g * gs, (size_t)n * gs, 0), GPUMEM_OK);
    g += n;
  }
  for (uint32_t g = 0; g < BR_GRANULES; g++) assert_true(vs->cid[g] != GPUMEM__VM_NIL);
  static uint64_t model[BR_GRANULES];
  memset(model, 0, sizeof model);
  uintptr_t lo[BR_LIVE], hi[BR_LIVE];
  int nlive = 0;
  unsigned long long longs = 0;
  const int ops = tu_on_valgrind() ? 400 : 4000;
  for (int op = 0; op < ops; op++) {
    int delta;
    uintptr_t a, e;
    if (nlive > 0 && (nlive == BR_LIVE || tu_rand(&rng) % 2)) {
      int i = (int)(tu_rand(&rng) % (uint64_t)nlive);
      a = lo[i];
      e = hi[i];
      lo[i] = lo[nlive - 1];
      hi[i] = hi[nlive - 1];
      nlive--;
      delta = -1;
    } else {
      uint64_t len = tu_rand(&rng) % 3 == 0 ? 256 * (1 + tu_rand(&rng) % (gs / 256 * 2))
                                             : gs * (1 + tu_rand(&rng) % (tu_rand(&rng) % 2 ? 200 : 10));
      if (len > gs && tu_rand(&rng) % 2) len -= 256 * (tu_rand(&rng) % (gs / 256));
      a = (uintptr_t)tu_rand_range(&rng, 0, (BR_GRANULES * (uint64_t)gs - len) / 256) * 256;
      if (tu_rand(&rng) % 2) a &= ~(uintptr_t)(gs - 1);
      e = a + len;
      int clash = 0;
      for (int i = 0; i < nlive && !clash; i++) clash = a < hi[i] && lo[i] < e;
      if (clash) continue;
      lo[nlive] = a;
      hi[nlive] = e;
      nlive++;
      delta = +1;
      longs += (e - 1) / gs - a / gs >= 8;
    }
    gpumem__vm_busy(vs, base + a, (size_t)(e - a), delta);
    for (uint64_t g = a / gs; g <= (e - 1) / gs; g++) {
      uint64_t glo = g * gs > a ? g * gs : a, ghi = (g + 1) * gs < e ? (g + 1) * gs : e;
      model[g] = delta > 0 ? model[g] + (ghi - glo) : model[g] - (ghi - glo);
    }
    uint64_t idle = 0, pinned = 0;
    for (uint32_t g = 0; g < BR_GRANULES;) {
      uint32_t c = vs->cid[g], k = g, busy_here = 0;
      while (k < BR_GRANULES && vs->cid[k] == c) busy_here += model[k++] != 0;
      for (uint32_t j = g; j < k; j++) {
        assert_int_equal(vs->busy[j], model[j]);
        assert_int_equal((vs->idleb[j >> 6] >> (j & 63)) & 1, model[j] == 0);
        if (model[j] == 0 && busy_here > 0) pinned += gs;
      }
      if (busy_here == 0) idle += (uint64_t)(k - g) * gs;
      g = k;
    }
    uint64_t d_partial = 0, d_pinned = 0, d_idle = 0, d_allow = 0;
    gpumem__vm_describe(vp, &d_partial, &d_pinned, &d_idle, &d_allow);
    if (d_idle != idle || d_pinned != pinned) {
      print_error("op %d (%+d of [%#lx, %#lx), gran %zu): idle %llu pinned %llu, want %llu %llu\n", op, delta,
                  (unsigned long)a, (unsigned long)e, gs, (unsigned long long)d_idle, (unsigned long long)d_pinned,
                  (unsigned long long)idle, (unsigned long long)pinned);
      fail();
    }
  }
  /* about a quarter of the ranges made busy span 8 granules or more; the
   * count only guards that long ranges were exercised at all, at any scale */
  assert_true(longs * 40 > (unsigned long long)ops);
  gpumem__vm_space_clear_busy(vs);
  assert_int_equal(gpumem__vm_space_close(vs), GPUMEM_OK);
  gpumem__vm_pool_free(vp);
  tu_ctx_done(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window_matches_plain_scan),
      cmocka_unit_test(test_place_cost_matches_granules),
      cmocka_unit_test_setup_teardown(test_busy_matches_granules, tu_setup, tu_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
