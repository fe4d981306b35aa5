/* sync.h: the core's mutex, a thin wrapper so that a different primitive can be swapped in
 * (sync.c). The pointer index and the thread caches have spinlocks of their own (ptrmap.h,
 * tcache.h). */
#ifndef GPUMEM_SYNC_H
#define GPUMEM_SYNC_H

#include <pthread.h>

typedef pthread_mutex_t gpumem__mutex;
/** 0 on success, -1 when the system has no resources for another mutex. */
int gpumem__mutex_init(gpumem__mutex *m);
void gpumem__mutex_destroy(gpumem__mutex *m);
#define gpumem__mutex_lock(m) ((void)pthread_mutex_lock(m))
#define gpumem__mutex_unlock(m) ((void)pthread_mutex_unlock(m))
/** 1 when taken, 0 when another thread holds it. */
#define gpumem__mutex_trylock(m) (pthread_mutex_trylock(m) == 0)

#endif /* GPUMEM_SYNC_H */
