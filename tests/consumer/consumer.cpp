// An external program using an installed libgpumem through gpumem.hpp, on the sim backend.
#include <gpumem.hpp>

#include <cstdio>

int main() {
  try {
    gpumem::context ctx("sim");
    {
      gpumem::buffer b = ctx.alloc(1 << 20);
      gpumem::scope s = ctx.scope();
      (void)s.alloc(4096);
      if (ctx.stats().num_live != 2) return 1;
    }
    if (ctx.stats().num_live != 0) return 2;
    try {
      (void)ctx.alloc(16, 1000);
      return 3;
    } catch (const gpumem::error &e) {
      if (e.status() != GPUMEM_ERR_INVALID_DEVICE) return 4;
    }
    std::printf("consumer (C++): %d device(s), trim gave back %llu bytes\n", ctx.device_count(),
                static_cast<unsigned long long>(ctx.trim()));
  } catch (const gpumem::error &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 5;
  }
  return 0;
}
