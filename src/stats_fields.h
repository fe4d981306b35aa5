/*
 * stats_fields.h: the one list of the gpumem_stats fields, in struct order.
 *
 *   GPUMEM__STATS_FIELDS(X)   X(name, kind, help) for every uint64_t field after struct_size and reserved_
 *
 * kind says what the number is and how it sums over devices (gpumem_get_stats with
 * GPUMEM_ALL_DEVICES adds every kind):
 *   COUNTER  cumulative since creation: the sum is the count of the whole context
 *            (Prometheus: a counter, name + "_total")
 *   GAUGE    a current value: the sum is the context's current value (Prometheus: a gauge)
 *   PEAK     a peak of a gauge: the sum of the devices' peaks, an upper bound of the context's
 *            peak, since the devices need not peak at once (Prometheus: a gauge)
 *
 * The public struct in gpumem.h is written out for its Doxygen comments; the static asserts
 * below fail the build when it and this list disagree (a field added, removed or moved in
 * one of them only). The Python binding's Stats is checked against this list by
 * bindings/python/tests/test_stats.py (through the JSON of gpumem_stats_format).
 */
#ifndef GPUMEM_STATS_FIELDS_H
#define GPUMEM_STATS_FIELDS_H

#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"

#define GPUMEM__STATS_FIELDS(X)                                                                    \
  X(allocated_bytes, GAUGE, "Bytes in live blocks (block sizes, i.e. rounded request sizes).")     \
  X(allocated_peak, PEAK, "Peak of allocated_bytes since creation or the last peak reset.")        \
  X(reserved_bytes, GAUGE, "Bytes held from the backend.")                                         \
  X(reserved_peak, PEAK, "Peak of reserved_bytes since creation or the last peak reset.")          \
  X(cached_bytes, GAUGE, "Reserved bytes not in live blocks (reserved - allocated).")              \
  X(num_allocs, COUNTER, "Successful allocations (size > 0).")                                     \
  X(num_frees, COUNTER, "Successful frees of non-NULL pointers.")                                  \
  X(num_live, GAUGE, "Live allocations.")                                                          \
  X(num_segments, GAUGE, "Segments currently held from the backend.")                              \
  X(num_backend_allocs, COUNTER, "Successful backend allocations.")                                \
  X(num_backend_frees, COUNTER, "Backend frees.")                                                  \
  X(num_trims, COUNTER, "Trim operations that released memory.")                                   \
  X(trimmed_bytes, COUNTER, "Bytes given back by trims.")                                          \
  X(num_oom_retries, COUNTER, "Retries after a backend out-of-memory.")                            \
  X(num_ooms, COUNTER, "Allocations that failed with out-of-memory.")                              \
  X(requested_bytes, GAUGE, "Bytes asked for by live allocations (unrounded).")                    \
  X(num_limit_exceeded, COUNTER, "Allocations refused by limit_bytes / limit_fraction.")        \
  X(num_share_asks, COUNTER, "Allocations that asked the other members of the shared group for memory.") \
  X(num_share_asked, COUNTER, "Requests of other members this process answered.")                \
  X(share_given_bytes, COUNTER, "Bytes of cached memory given back when asked by other members.")

typedef enum gpumem__stat_kind { GPUMEM__STAT_COUNTER, GPUMEM__STAT_GAUGE, GPUMEM__STAT_PEAK } gpumem__stat_kind;

/* GPUMEM__STATS_I_<name>: the place of each field in the list; GPUMEM__STATS_NFIELDS: their number */
#define GPUMEM__STATS_INDEX_(name, kind, help) GPUMEM__STATS_I_##name,
enum { GPUMEM__STATS_FIELDS(GPUMEM__STATS_INDEX_) GPUMEM__STATS_NFIELDS };
#undef GPUMEM__STATS_INDEX_

/* The list and the struct agree: the fields follow struct_size and reserved_ in list order,
 * each a uint64_t, and the last one ends the struct. */
#define GPUMEM__STATS_HEAD_ (offsetof(gpumem_stats, reserved_) + sizeof(uint32_t))
#define GPUMEM__STATS_CHECK_(name, kind, help)                                                              \
  _Static_assert(sizeof(((gpumem_stats *)0)->name) == sizeof(uint64_t), "gpumem_stats." #name ": uint64_t"); \
  _Static_assert(offsetof(gpumem_stats, name) == GPUMEM__STATS_HEAD_ + GPUMEM__STATS_I_##name * sizeof(uint64_t), \
                 "gpumem_stats." #name ": in the place GPUMEM__STATS_FIELDS gives it (src/stats_fields.h)");
GPUMEM__STATS_FIELDS(GPUMEM__STATS_CHECK_)
#undef GPUMEM__STATS_CHECK_
_Static_assert(offsetof(gpumem_stats, struct_size) == 0 && offsetof(gpumem_stats, reserved_) == sizeof(uint32_t) && GPUMEM__STATS_HEAD_ == 2 * sizeof(uint32_t),
               "gpumem_stats starts with struct_size and reserved_");
_Static_assert(sizeof(gpumem_stats) == GPUMEM__STATS_HEAD_ + GPUMEM__STATS_NFIELDS * sizeof(uint64_t),
               "gpumem_stats has exactly the fields of GPUMEM__STATS_FIELDS (src/stats_fields.h)");
#undef GPUMEM__STATS_HEAD_

#endif /* GPUMEM_STATS_FIELDS_H */
