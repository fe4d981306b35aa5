/* fork.h: fork detection and the core's atfork handlers (fork.c). A context belongs to the
 * process that created it. */
#ifndef GPUMEM_FORK_H
#define GPUMEM_FORK_H

#include <stdatomic.h>

#include "gpumem.h"

/** Incremented in the child of every fork() (pthread_atfork, registered at the first gpumem_create). */
extern _Atomic unsigned gpumem__fork_gen;
/** Register the atfork handler once; returns the current generation. */
unsigned gpumem__fork_init(void);
/** True when ctx was created in the parent of this (forked) process: it must not be used here. */
#define GPUMEM__FORKED(ctx) \
  GPUMEM__UNLIKELY((ctx)->fork_gen != atomic_load_explicit(&gpumem__fork_gen, memory_order_relaxed))
/** Register the thread caches' atfork handlers once (tcache.c, before its first cache); 0 on success,
 *  -1 when they could not be registered (then the caches must stay off). */
int gpumem__fork_init_caches(void);
/** Status (and a WARN log line) for a call on a context inherited through fork(). */
gpumem_status gpumem__forked_status(gpumem_context *ctx, const char *fn);

#endif /* GPUMEM_FORK_H */
