// Tests of the C++17 RAII wrappers (include/gpumem.hpp) on the sim backend.
// A plain program: every failed check prints its line and the program exits non-zero.
#include "gpumem.hpp"
#include "gpumem/sim.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace {

int failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

// Runs `f`, expecting a gpumem::error with status `want`.
template <class F> bool throws_status(F &&f, gpumem_status want, std::string *what = nullptr) {
  try {
    f();
  } catch (const gpumem::error &e) {
    if (what) *what = e.what();
    if (e.status() != want)
      std::fprintf(stderr, "  got %s, want %s\n", gpumem_status_name(e.status()), gpumem_status_name(want));
    return e.status() == want;
  }
  std::fprintf(stderr, "  no exception, want %s\n", gpumem_status_name(want));
  return false;
}

static_assert(!std::is_copy_constructible<gpumem::context>::value, "context is move-only");
static_assert(!std::is_copy_assignable<gpumem::context>::value, "context is move-only");
static_assert(std::is_nothrow_move_constructible<gpumem::context>::value, "context moves");
static_assert(!std::is_copy_constructible<gpumem::buffer>::value, "buffer is move-only");
static_assert(std::is_nothrow_move_assignable<gpumem::buffer>::value, "buffer moves");
static_assert(!std::is_copy_constructible<gpumem::scope>::value, "scope is move-only");
static_assert(std::is_nothrow_move_assignable<gpumem::scope>::value, "scope moves");
static_assert(!std::is_copy_constructible<gpumem::graph_pool>::value, "graph_pool is move-only");
static_assert(std::is_nothrow_move_assignable<gpumem::graph_pool>::value, "graph_pool moves");
static_assert(std::is_base_of<std::runtime_error, gpumem::error>::value, "error is a runtime_error");

std::uint64_t live(const gpumem::context &c, int dev = GPUMEM_ALL_DEVICES) { return c.stats(dev).num_live; }

void test_context_basics() {
  gpumem::context ctx("sim");
  CHECK(ctx);
  CHECK(ctx.get() != nullptr);
  CHECK(std::strcmp(ctx.backend_name(), "sim") == 0);
  CHECK(ctx.device_count() == 2);
  gpumem_device_info info = ctx.device_info(1);
  CHECK(info.ordinal == 1);
  CHECK(std::strncmp(info.uuid, "GPU-", 4) == 0);
  CHECK(info.total_bytes == (1ull << 30));
  CHECK(throws_status([&] { (void)ctx.device_info(7); }, GPUMEM_ERR_INVALID_DEVICE));

  // default constructor: backend from the environment (GPUMEM_BACKEND=sim, set in main)
  gpumem::context dflt;
  CHECK(std::strcmp(dflt.backend_name(), "sim") == 0);

  // from a config
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  gpumem::context from_cfg(cfg);
  CHECK(from_cfg.device_count() == 2);
}

void test_buffer_lifetime() {
  gpumem::context ctx(std::string("sim"));
  {
    gpumem::buffer b = ctx.alloc(1000, 1);
    CHECK(b);
    CHECK(b.get() != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(b.get()) % 256 == 0);
    CHECK(b.size() == 1000);
    CHECK(b.device() == 1);
    CHECK(b.stream() == nullptr);
    CHECK(b.c_buffer().ctx == ctx.get());
    std::memset(b.get(), 0xab, b.size()); // sim memory is host memory
    CHECK(b.as<unsigned char>()[999] == 0xab);
    CHECK(live(ctx, 1) == 1);
    CHECK(live(ctx, 0) == 0);
  }
  // destructor freed it
  gpumem_stats st = ctx.stats(1);
  CHECK(st.num_live == 0);
  CHECK(st.num_frees == 1);
  CHECK(st.allocated_bytes == 0);

  // zero bytes: an empty buffer
  gpumem::buffer z = ctx.alloc(0);
  CHECK(!z);
  CHECK(z.get() == nullptr);

  // release() frees now, twice is harmless
  gpumem::buffer r = ctx.alloc(4096, 0);
  CHECK(live(ctx) == 1);
  r.release();
  CHECK(!r);
  CHECK(live(ctx) == 0);
  r.release();
  CHECK(ctx.stats().num_frees == 2);

  // detach(): ownership leaves the wrapper
  gpumem::buffer d = ctx.alloc(512, 0);
  gpumem_buffer raw = d.detach();
  CHECK(!d);
  d = gpumem::buffer(); // assigning to an empty buffer frees nothing
  CHECK(live(ctx) == 1);
  gpumem_buffer_release(&raw);
  CHECK(live(ctx) == 0);

  // tagged
  {
    gpumem::buffer t = ctx.alloc_tagged(300, "cpp-test", 0);
    CHECK(t.size() == 300);
    size_t sz = 0;
    int dev = -1;
    CHECK(gpumem_ptr_info(ctx.get(), t.get(), &sz, &dev) == GPUMEM_OK);
    CHECK(sz == 300 && dev == 0);
  }
  CHECK(live(ctx) == 0);
}

void test_buffer_moves() {
  gpumem::context ctx("sim");
  gpumem::buffer a = ctx.alloc(100);
  void *pa = a.get();
  gpumem::buffer b(std::move(a));
  CHECK(!a); // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  CHECK(a.get() == nullptr && a.size() == 0);
  CHECK(b.get() == pa && b.size() == 100);
  CHECK(live(ctx) == 1);

  gpumem::buffer c = ctx.alloc(200);
  CHECK(live(ctx) == 2);
  c = std::move(b); // c's old memory is freed, c now owns pa
  CHECK(live(ctx) == 1);
  CHECK(c.get() == pa && c.size() == 100);
  CHECK(!b); // NOLINT(bugprone-use-after-move)

  gpumem::buffer &self = c;
  c = std::move(self); // self-move keeps the memory
  CHECK(c.get() == pa);
  CHECK(live(ctx) == 1);
  c = gpumem::buffer();
  CHECK(live(ctx) == 0);
}

void test_errors() {
  std::string what;
  gpumem_config badcfg;
  gpumem_config_init(&badcfg);
  badcfg.backend = "no-such-backend";
  badcfg.flags = GPUMEM_CONFIG_NO_ENV; // else GPUMEM_BACKEND=sim (set in main) would win
  CHECK(throws_status([&] { gpumem::context bad(badcfg); }, GPUMEM_ERR_NO_BACKEND, &what));
  CHECK(what.find("gpumem_create") != std::string::npos);
  CHECK(what.find("GPUMEM_ERR_NO_BACKEND") != std::string::npos);

  gpumem::context ctx("sim");
  CHECK(throws_status([&] { (void)ctx.alloc(64, 5); }, GPUMEM_ERR_INVALID_DEVICE, &what));
  CHECK(what.find("gpumem_buffer_alloc") != std::string::npos);
  CHECK(throws_status([&] { (void)ctx.alloc(64, -3); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(throws_status([&] { (void)ctx.scope(9); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(throws_status([&] { (void)ctx.stats(9); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(throws_status([&] { (void)ctx.trim(9, 0); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(throws_status([&] { ctx.release_capture_pools(9); }, GPUMEM_ERR_INVALID_DEVICE));
  ctx.release_capture_pools(); /* none made: nothing to do */
  CHECK(throws_status([&] { ctx.capture_ended(9, nullptr); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(throws_status([&] { ctx.capture_ended(GPUMEM_ALL_DEVICES, (gpumem_stream)0x40); }, GPUMEM_ERR_INVALID_DEVICE));
  ctx.capture_ended(0, (gpumem_stream)0x40); /* no capture known: nothing to do */
  ctx.capture_ended(GPUMEM_ALL_DEVICES, nullptr);

  // catchable as std::runtime_error, status kept
  try {
    int x = 0;
    ctx.free(&x);
    CHECK(false);
  } catch (const std::runtime_error &e) {
    const auto *ge = dynamic_cast<const gpumem::error *>(&e);
    CHECK(ge != nullptr);
    CHECK(ge && ge->status() == GPUMEM_ERR_INVALID_POINTER);
    CHECK(ge && std::strcmp(ge->name(), "GPUMEM_ERR_INVALID_POINTER") == 0);
  }

  // a limit: LIMIT_EXCEEDED, and nothing changes
  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = "sim";
  cfg.flags = GPUMEM_CONFIG_NO_ENV;
  cfg.limit_bytes = 64u << 20;
  gpumem::context lim(cfg);
  gpumem::buffer keep = lim.alloc(1000);
  CHECK(throws_status([&] { (void)lim.alloc(128u << 20); }, GPUMEM_ERR_LIMIT_EXCEEDED));
  CHECK(live(lim) == 1);
  CHECK(lim.stats(0).reserved_bytes <= (64u << 20));
  CHECK(lim.stats(0).num_limit_exceeded == 1);

  // raw alloc/free and double free
  void *p = ctx.alloc_raw(256);
  CHECK(p != nullptr);
  ctx.free(p);
  CHECK(throws_status([&] { ctx.free(p); }, GPUMEM_ERR_INVALID_POINTER));
  ctx.free(nullptr); // harmless
}

void test_scopes() {
  gpumem::context ctx("sim");
  {
    gpumem::scope s = ctx.scope(1);
    CHECK(s);
    s.set_tag("scope-test");
    void *a = s.alloc(1000);
    double *b = s.alloc_n<double>(64);
    CHECK(a != nullptr && b != nullptr);
    b[63] = 1.5;
    CHECK(s.alloc(0) == nullptr);
    CHECK(live(ctx, 1) == 2);
  } // destructor ends the scope
  CHECK(live(ctx) == 0);

  gpumem::scope s = ctx.scope(0);
  (void)s.alloc(10);
  (void)s.alloc(20);
  (void)s.alloc(30);
  CHECK(live(ctx, 0) == 3);
  gpumem::scope moved(std::move(s));
  CHECK(!s); // NOLINT(bugprone-use-after-move)
  CHECK(throws_status([&] { (void)s.alloc(8); }, GPUMEM_ERR_INVALID_ARGUMENT));
  CHECK(live(ctx, 0) == 3);
  moved.end();
  CHECK(!moved);
  CHECK(live(ctx, 0) == 0);
  moved.end(); // harmless when ended
  CHECK(throws_status([&] { (void)moved.alloc(8); }, GPUMEM_ERR_INVALID_ARGUMENT));

  // move assignment ends the scope held before
  gpumem::scope x = ctx.scope(0);
  (void)x.alloc(100);
  gpumem::scope y = ctx.scope(1);
  (void)y.alloc(100);
  (void)y.alloc(100);
  CHECK(live(ctx) == 3);
  x = std::move(y);
  CHECK(live(ctx, 0) == 0);
  CHECK(live(ctx, 1) == 2);
  x = gpumem::scope();
  CHECK(live(ctx) == 0);
  CHECK(ctx.stats().num_frees == 2 + 3 + 1 + 2);
}

void test_trim_reset_stats() {
  gpumem::context ctx("sim");
  {
    gpumem::buffer a = ctx.alloc(3u << 20, 0);
    gpumem::buffer b = ctx.alloc(5u << 20, 1);
    gpumem_stats all = ctx.stats(GPUMEM_ALL_DEVICES);
    gpumem_stats s0 = ctx.stats(0), s1 = ctx.stats(1);
    CHECK(all.num_live == 2);
    CHECK(all.allocated_bytes == s0.allocated_bytes + s1.allocated_bytes);
    CHECK(all.reserved_bytes == s0.reserved_bytes + s1.reserved_bytes);
    CHECK(s0.allocated_bytes >= (3u << 20));
    CHECK(s1.allocated_bytes >= (5u << 20));
  }
  gpumem_stats before = ctx.stats();
  CHECK(before.num_live == 0);
  CHECK(before.cached_bytes == before.reserved_bytes);
  CHECK(before.reserved_bytes > 0); // default: release threshold unlimited, memory stays cached
  std::uint64_t released = ctx.trim(GPUMEM_ALL_DEVICES, 0);
  CHECK(released == before.reserved_bytes);
  CHECK(ctx.stats().reserved_bytes == 0);
  CHECK(ctx.trim() == 0);

  ctx.reset_peak_stats();
  CHECK(ctx.stats().allocated_peak == 0);

  // reset invalidates live buffers; their destructors then free nothing and do not fail
  {
    gpumem::buffer survivor = ctx.alloc(1u << 20, 0);
    gpumem::buffer other = ctx.alloc(1u << 20, 1);
    ctx.reset(0);
    CHECK(live(ctx, 0) == 0);
    CHECK(ctx.stats(0).reserved_bytes == 0);
    CHECK(live(ctx, 1) == 1);
    size_t sz = 0;
    CHECK(gpumem_ptr_info(ctx.get(), survivor.get(), &sz, nullptr) == GPUMEM_ERR_INVALID_POINTER);
  }
  CHECK(live(ctx) == 0);
  // a device reset (the sim backend simulates one) also leaves nothing behind
  {
    gpumem::buffer gone = ctx.alloc(1u << 20, 1);
    ctx.reset(1, GPUMEM_RESET_DEVICE);
    CHECK(live(ctx, 1) == 0);
    CHECK(ctx.stats(1).reserved_bytes == 0);
  }
  CHECK(live(ctx) == 0);
}

void test_context_moves_and_destroy() {
  gpumem::context keep("sim"); // keeps the process-wide sim state alive
  std::uint64_t used0 = 0;
  CHECK(gpumem_sim_used_bytes(0, &used0) == GPUMEM_OK);

  gpumem::context a("sim");
  gpumem_context *raw = a.get();
  gpumem::context b(std::move(a));
  CHECK(!a); // NOLINT(bugprone-use-after-move)
  CHECK(b.get() == raw);
  a = std::move(b);
  CHECK(a.get() == raw);

  // destroy() reports BUSY and keeps the context usable
  gpumem::buffer buf = a.alloc(1u << 20);
  CHECK(throws_status([&] { a.destroy(); }, GPUMEM_ERR_BUSY));
  CHECK(a.get() == raw);
  CHECK(live(a) == 1);
  buf.release();
  a.destroy();
  CHECK(!a);
  a.destroy(); // harmless when empty

  // the destructor forces when allocations are live: the memory goes back
  {
    gpumem::context leaky("sim");
    gpumem::buffer lost = leaky.alloc(8u << 20);
    gpumem_buffer h = lost.detach(); // leaked on purpose
    (void)h;
    std::uint64_t used = 0;
    CHECK(gpumem_sim_used_bytes(0, &used) == GPUMEM_OK);
    CHECK(used >= used0 + (8u << 20));
  }
  std::uint64_t used1 = 0;
  CHECK(gpumem_sim_used_bytes(0, &used1) == GPUMEM_OK);
  CHECK(used1 == used0);

  // move assignment destroys the context held before (forcing if needed)
  {
    gpumem::context c1("sim");
    gpumem::buffer lost = c1.alloc(2u << 20);
    (void)lost.detach();
    c1 = gpumem::context("sim");
    CHECK(gpumem_sim_used_bytes(0, &used1) == GPUMEM_OK);
    CHECK(used1 == used0);
  }

  // adopt / release
  gpumem_context *rc = nullptr;
  CHECK(gpumem_create(nullptr, &rc) == GPUMEM_OK);
  gpumem::context adopted = gpumem::context::adopt(rc);
  CHECK(adopted.get() == rc);
  CHECK(adopted.release() == rc);
  CHECK(!adopted);
  CHECK(gpumem_destroy(rc, 0) == GPUMEM_OK);
}


// A buffer or scope that outlives its gpumem::context (member order, a scope declared outside the
// context's block) frees into a C context that is still alive: the last handle destroys it.
struct wrong_order {
  gpumem::buffer buf;   // destroyed after ctx: the members go in reverse order
  gpumem::scope sc;
  gpumem::context ctx;
  wrong_order() : ctx("sim") {
    buf = ctx.alloc(1u << 20);
    sc = ctx.scope(0);
    (void)sc.alloc(4096);
  }
};

void test_handles_outlive_context() {
  gpumem::context keep("sim"); // keeps the process-wide sim state alive
  std::uint64_t used0 = 0;
  CHECK(gpumem_sim_used_bytes(0, &used0) == GPUMEM_OK);
  { wrong_order w; }
  std::uint64_t used = 0;
  CHECK(gpumem_sim_used_bytes(0, &used) == GPUMEM_OK);
  CHECK(used == used0);

  gpumem::buffer b;
  gpumem::scope s;
  gpumem_context *raw = nullptr;
  {
    gpumem::context ctx("sim");
    raw = ctx.get();
    b = ctx.alloc(2u << 20);
    s = ctx.scope(0);
    (void)s.alloc(8192);
  } // the context object is gone; its C context is not
  CHECK(gpumem_sim_used_bytes(0, &used) == GPUMEM_OK);
  CHECK(used > used0);
  void *more = s.alloc(4096); // still usable
  CHECK(more != nullptr);
  gpumem_stats st{};
  st.struct_size = sizeof st;
  CHECK(gpumem_get_stats(raw, 0, &st) == GPUMEM_OK);
  CHECK(st.num_live == 3);
  s.end();
  b.release(); // the last handle: the C context is destroyed now
  CHECK(gpumem_sim_used_bytes(0, &used) == GPUMEM_OK);
  CHECK(used == used0);

  // raw allocations still live when the last handle goes: forced, as ~context() forces
  {
    gpumem::buffer last;
    {
      gpumem::context ctx("sim");
      last = ctx.alloc(4096);
      (void)ctx.alloc_raw(3u << 20); // leaked on purpose
    }
  }
  CHECK(gpumem_sim_used_bytes(0, &used) == GPUMEM_OK);
  CHECK(used == used0);

  // destroy() refuses while handles are alive, FORCE or not; after them it works
  gpumem::context c("sim");
  gpumem::scope empty = c.scope(0); // holds no memory, but would use the context
  CHECK(throws_status([&] { c.destroy(); }, GPUMEM_ERR_BUSY));
  CHECK(throws_status([&] { c.destroy(GPUMEM_DESTROY_FORCE); }, GPUMEM_ERR_BUSY));
  CHECK(c);
  (void)empty.alloc(256);
  empty.end();
  c.destroy();
  CHECK(!c);

  // a 0-byte buffer holds nothing and does not keep the context
  gpumem::context z("sim");
  gpumem::buffer none = z.alloc(0);
  CHECK(!none);
  z.destroy();

  // release(): ownership goes to the caller; live handles then follow the C rule
  gpumem::context r("sim");
  gpumem::buffer rb = r.alloc(4096);
  gpumem_context *rraw = r.release();
  CHECK(!r);
  rb.release();
  CHECK(gpumem_destroy(rraw, 0) == GPUMEM_OK);
}

void test_limits_and_text() {
  gpumem::context ctx("sim");
  CHECK(ctx.get_limit(0) == 0);
  ctx.set_limit(0, 64u << 20);
  CHECK(ctx.get_limit(0) == (64u << 20));
  CHECK(throws_status([&] { (void)ctx.alloc(128u << 20, 0); }, GPUMEM_ERR_LIMIT_EXCEEDED));
  ctx.set_limit(0, 0);
  {
    gpumem::buffer b = ctx.alloc(8u << 20, 0);
  }
  CHECK(ctx.largest_free_block(0) >= (8u << 20));
  CHECK(throws_status([&] { ctx.set_limit(7, 1); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(throws_status([&] { (void)ctx.largest_free_block(7); }, GPUMEM_ERR_INVALID_DEVICE));
  gpumem::buffer b = ctx.alloc(3u << 20, 0);
  std::string json = ctx.stats_text(GPUMEM_STATS_JSON, 0);
  CHECK(json.size() > 10 && json.front() == '{' && json.compare(json.size() - 2, 2, "}\n") == 0);
  CHECK(json.find("\"allocated_bytes\":" + std::to_string(ctx.stats(0).allocated_bytes)) != std::string::npos);
  std::string prom = ctx.stats_text(GPUMEM_STATS_PROMETHEUS);
  CHECK(prom.find("# TYPE gpumem_allocated_bytes gauge") != std::string::npos);
  CHECK(prom.find('\0') == std::string::npos);
  // (an unknown format is the C function's check, tested in C: a value outside the enum is undefined in C++)
  CHECK(throws_status([&] { (void)ctx.stats_text(GPUMEM_STATS_JSON, 7); }, GPUMEM_ERR_INVALID_DEVICE));
  // record_stream: the block's free waits for the noted stream too
  gpumem_stream s1 = reinterpret_cast<gpumem_stream>(std::uintptr_t{0x51});
  ctx.record_stream(b.get(), s1);
  int x = 0;
  CHECK(throws_status([&] { ctx.record_stream(&x, s1); }, GPUMEM_ERR_INVALID_POINTER));
}

void test_graph_pools() {
  gpumem_stream cs = reinterpret_cast<gpumem_stream>(std::uintptr_t{0xC0});
  gpumem::context ctx("sim");
  CHECK(gpumem_sim_stream_create(0, cs) == GPUMEM_OK);
  void *outside = nullptr;
  {
    gpumem::graph_pool gp = ctx.graph_pool(0);
    CHECK(gp);
    gp.begin(cs);
    {
      gpumem::graph_pool other = ctx.graph_pool(0);
      CHECK(throws_status([&] { other.begin(cs); }, GPUMEM_ERR_INVALID_ARGUMENT)); // routed to gp already
    }
    void *p = ctx.alloc_raw(1u << 20, 0, cs); // routed to the pool
    CHECK(gp.stats().num_live == 1);
    CHECK(ctx.stats(0).num_live == 1); // the device's figures count graph pools too
    ctx.free(p, cs);
    void *q = gp.alloc(2u << 20, cs);
    CHECK(gp.stats().num_live == 1);
    CHECK(throws_status([&] { gp.release(); }, GPUMEM_ERR_INVALID_ARGUMENT)); // still routed: kept
    CHECK(gp);
    gp.end(cs);
    CHECK(throws_status([&] { gp.end(cs); }, GPUMEM_ERR_INVALID_ARGUMENT));
    outside = ctx.alloc_raw(1u << 20, 0, cs); // not routed any more: the main pool
    CHECK(gp.stats().num_live == 1);
    gpumem::graph_pool moved = std::move(gp);
    CHECK(!gp && moved);
    CHECK(throws_status([&] { (void)gp.alloc(1); }, GPUMEM_ERR_INVALID_ARGUMENT));
    CHECK(throws_status([&] { (void)gp.stats(); }, GPUMEM_ERR_INVALID_ARGUMENT));
    gp.release(); // harmless when empty
    ctx.free(q, cs);
    moved.release();
    CHECK(!moved);
  }
  {
    // a pool outlives its context object: the C context goes with the pool
    gpumem::graph_pool keep;
    {
      gpumem::context c2("sim");
      keep = c2.graph_pool(1);
      CHECK(throws_status([&] { c2.destroy(); }, GPUMEM_ERR_BUSY));
    }
    void *r = keep.alloc(4096);
    CHECK(r != nullptr);
    CHECK(keep.stats().num_live == 1);
    // (the block is live when the pool goes: released with the context)
  }
  ctx.free(outside, cs);
  CHECK(ctx.stats(0).num_live == 0);
  CHECK(throws_status([&] { (void)ctx.graph_pool(7); }, GPUMEM_ERR_INVALID_DEVICE));
  CHECK(gpumem_sim_stream_destroy(0, cs) == GPUMEM_OK);
}

} // namespace

int main() {
  // Two simulated devices of 1 GiB; the default context picks sim.
  setenv("GPUMEM_SIM_DEVICES", "2x1GiB", 1);
  setenv("GPUMEM_BACKEND", "sim", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("GPUMEM_LIMIT_BYTES");
  unsetenv("GPUMEM_LIMIT_FRACTION");
  unsetenv("GPUMEM_RELEASE_THRESHOLD");
  unsetenv("GPUMEM_INITIAL_BYTES");

  struct {
    const char *name;
    void (*fn)();
  } tests[] = {
      {"context_basics", test_context_basics},
      {"buffer_lifetime", test_buffer_lifetime},
      {"buffer_moves", test_buffer_moves},
      {"errors", test_errors},
      {"scopes", test_scopes},
      {"trim_reset_stats", test_trim_reset_stats},
      {"context_moves_and_destroy", test_context_moves_and_destroy},
      {"limits_and_text", test_limits_and_text},
      {"graph_pools", test_graph_pools},
      {"handles_outlive_context", test_handles_outlive_context},
  };
  for (const auto &t : tests) {
    int before = failures;
    try {
      t.fn();
    } catch (const std::exception &e) {
      std::fprintf(stderr, "%s: unexpected exception: %s\n", t.name, e.what());
      ++failures;
    }
    std::printf("%s %s\n", failures == before ? "ok  " : "FAIL", t.name);
  }
  if (failures) {
    std::printf("%d check(s) failed\n", failures);
    return EXIT_FAILURE;
  }
  std::printf("all C++ wrapper tests passed\n");
  return EXIT_SUCCESS;
}
