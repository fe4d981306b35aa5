/* share.h: shared GPUs (share.c). A device pool's membership in its GPU's shared group, its
 * watcher thread, and the pool's hooks into them. Only the pool's files include it. */
#ifndef GPUMEM_SHARE_H
#define GPUMEM_SHARE_H

#include "internal.h"

struct gpumem__pshare; /* a pool's share state: ledger entry, watcher thread (share.c) */

/** At pool creation (not for graph pools): the watcher's state, and the ledger entry of the GPU of
 *  `info` when sharing is on and the device is not private. NULL when neither applies (no
 *  watcher and no sharing) or on host out of memory (then the pool works alone). */
struct gpumem__pshare *gpumem__share_join(gpumem__pool *p, const gpumem_backend_device_info *info);
/** Stop the watcher and wait for it (at pool destruction, before the pool's memory goes). Takes the pool
 *  lock briefly; call it without. */
void gpumem__share_stop(struct gpumem__pshare *ps);
/** At pool destruction, once its memory is given back: stop the watcher (if still running), give the
 *  ledger entry back, free ps (NULL: nothing). */
void gpumem__share_leave(struct gpumem__pshare *ps);

/** Pool lock held: the pool grew or a call found it holding cached memory; start the watcher if it
 *  is not running (it runs while the pool holds cached memory) and publish the figures. */
void gpumem__share_note_slow(gpumem__pool *p, struct gpumem__pshare *ps);
/** Pool lock held: publish reserved, cached and live bytes in the ledger entry (three relaxed stores). */
void gpumem__share_figures(gpumem__pool *p, struct gpumem__pshare *ps);
/** Pool lock held, on calls that do not grow (and publish the figures): at most every watch_interval_ms, the free-fraction check
 *  while no watcher runs, and the watcher started when `wanted` (watch_wanted, pool.h: the pool holds cached memory,
 *  or a thread cache may). */
static inline void gpumem__share_call(gpumem__pool *p, struct gpumem__pshare *ps, int running, int wanted) {
  if (ps == NULL) return;
  if (GPUMEM__UNLIKELY(!running && wanted)) gpumem__share_note_slow(p, ps);
  else gpumem__share_figures(p, ps);
}

/** An allocation's rounds of asking the shared group (gpumem__share_ask keeps it; zero it before the first). */
typedef struct gpumem__share_round {
  uint64_t deadline_ms; /* CLOCK_MONOTONIC: the first round's start + share_wait_ms (0 before it) */
  uint32_t pause_ms;    /* the pause before the next round when members kept memory they could not give yet */
  uint32_t rounds;
} gpumem__share_round;
/** No lock held: an allocation of rsize bytes failed after the pool's own trim. Asks the other members
 *  of the group for what the device lacks and waits for their answers; all rounds of one allocation
 *  together last at most share_wait_ms. Returns 1 to retry the allocation (members gave memory back,
 *  the device has room now, or members still hold cached memory they could not give at once: then
 *  after a short pause), 0 when nothing can come (every member answered and none holds cached
 *  memory, or the time is up). */
int gpumem__share_ask(gpumem__pool *p, struct gpumem__pshare *ps, size_t rsize, gpumem__share_round *r);
/** What the other members hold, for the out-of-memory report: "" when the pool shares nothing. */
void gpumem__share_describe(struct gpumem__pshare *ps, char *buf, size_t cap);

#endif /* GPUMEM_SHARE_H */
