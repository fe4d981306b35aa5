/* Sizes and member offsets of the C structs mirrored by bind(c) types in
 * gpumem.f90; the Fortran test compares them with c_sizeof / c_loc. */
#include <stddef.h>

#include "gpumem.h"

size_t gpumem_ftest_layout(int what);

size_t gpumem_ftest_layout(int what) {
  switch (what) {
  case 0: return sizeof(gpumem_config);
  case 1: return sizeof(gpumem_stats);
  case 2: return sizeof(gpumem_device_info);
  case 3: return offsetof(gpumem_config, log_level);
  case 4: return offsetof(gpumem_stats, num_limit_exceeded);
  case 5: return offsetof(gpumem_device_info, total_bytes);
  case 6: return offsetof(gpumem_device_info, physical_index);
  case 7: return offsetof(gpumem_config, initial_bytes);
  case 8: return offsetof(gpumem_config, peak_headroom);
  case 9: return offsetof(gpumem_config, capture_probe);
  default: return 0;
  }
}
