/* sync.c: the core's mutex (sync.h). */
#include "sync.h"

int gpumem__mutex_init(gpumem__mutex *m) { return pthread_mutex_init(m, NULL) == 0 ? 0 : -1; }
void gpumem__mutex_destroy(gpumem__mutex *m) { (void)pthread_mutex_destroy(m); }
