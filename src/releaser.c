/* releaser.c: the releaser thread (see releaser.h).
 *
 * A ring of REL_CAP jobs with three counters, all under `mu`: tail (the next job queued), run (the
 * next job the thread runs) and head (the next finished job the caller takes); head <= run <= tail.
 * The caller (under its pool lock, so one at a time) writes tail and head, the thread writes run and
 * the results of the job it ran. The thread copies a job out before running it, so nothing it reads
 * during the driver calls is shared. */
#include "releaser.h"

#include "vmseg.h" /* the backend wrappers of the vm methods */

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* Jobs in flight at most. A move or give-back queues one; an allocation that gives back idle chunks
 * to make room for a huge one queues a few tens. A full queue is no error: the caller makes its
 * calls itself until the thread catches up. */
#define REL_CAP 256

struct gpumem__releaser {
  gpumem_context *ctx;
  int dev;
  pthread_mutex_t mu;
  pthread_cond_t work; /* the thread waits here for a job or stop */
  pthread_cond_t done; /* callers wait here for run to reach tail */
  uint64_t head, run, tail;
  int stop;
  int started;         /* 1: the thread runs; -1: it could not be started (no more tries) */
  pthread_t thr;
  gpumem__rel_job q[REL_CAP];
};

static void *rel_main(void *arg) {
  gpumem__releaser *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (r->run == r->tail && !r->stop) pthread_cond_wait(&r->work, &r->mu);
    if (r->run == r->tail) break; /* stop, and nothing left */
    gpumem__rel_job j = r->q[r->run % REL_CAP];
    pthread_mutex_unlock(&r->mu);
    j.unmap_st = gpumem__be_vm_unmap(r->ctx, r->dev, j.va, j.size);
    j.destroy_st = GPUMEM_OK;
    if (j.unmap_st == GPUMEM_OK && j.destroy) j.destroy_st = gpumem__be_vm_destroy(r->ctx, r->dev, j.h);
    pthread_mutex_lock(&r->mu);
    r->q[r->run % REL_CAP].unmap_st = j.unmap_st;
    r->q[r->run % REL_CAP].destroy_st = j.destroy_st;
    r->run++;
    if (r->run == r->tail) pthread_cond_broadcast(&r->done);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

gpumem__releaser *gpumem__rel_new(gpumem_context *ctx, int dev) {
  gpumem__releaser *r = calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  if (pthread_mutex_init(&r->mu, NULL) != 0) {
    free(r);
    return NULL;
  }
  if (pthread_cond_init(&r->work, NULL) != 0) {
    pthread_mutex_destroy(&r->mu);
    free(r);
    return NULL;
  }
  if (pthread_cond_init(&r->done, NULL) != 0) {
    pthread_cond_destroy(&r->work);
    pthread_mutex_destroy(&r->mu);
    free(r);
    return NULL;
  }
  r->ctx = ctx;
  r->dev = dev;
  return r;
}

/* Start the thread (mu held). 0, or -1 (then never tried again: the caller makes its own calls). */
static int rel_start(gpumem__releaser *r) {
  if (r->started != 0) return r->started > 0 ? 0 : -1;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread blocks every signal: they go to the application's */
  int rc = pthread_create(&r->thr, NULL, rel_main, r);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    r->started = -1;
    gpumem__log(&r->ctx->opt.log, GPUMEM_LOG_INFO,
                "device %d: no releaser thread (%s): chunks are unmapped on the allocating thread", r->dev,
                strerror(rc));
    return -1;
  }
  r->started = 1;
  return 0;
}

int gpumem__rel_push(gpumem__releaser *r, const gpumem__rel_job *job) {
  int ret = -1;
  pthread_mutex_lock(&r->mu);
  if (r->tail - r->head < REL_CAP && !r->stop && rel_start(r) == 0) {
    r->q[r->tail % REL_CAP] = *job;
    r->tail++;
    pthread_cond_signal(&r->work);
    ret = 0;
  }
  pthread_mutex_unlock(&r->mu);
  return ret;
}

size_t gpumem__rel_queued(const gpumem__releaser *r) { return r == NULL ? 0 : (size_t)(r->tail - r->head); }

size_t gpumem__rel_take(gpumem__releaser *r, gpumem__rel_job *out, size_t max, int wait) {
  size_t n = 0;
  pthread_mutex_lock(&r->mu);
  if (wait)
    while (r->run != r->tail) pthread_cond_wait(&r->done, &r->mu);
  while (n < max && r->head != r->run) out[n++] = r->q[r->head++ % REL_CAP];
  pthread_mutex_unlock(&r->mu);
  return n;
}

void gpumem__rel_free(gpumem__releaser *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_signal(&r->work);
  int started = r->started > 0;
  pthread_mutex_unlock(&r->mu);
  if (started) (void)pthread_join(r->thr, NULL); /* (it finishes the queue first) */
  pthread_cond_destroy(&r->done);
  pthread_cond_destroy(&r->work);
  pthread_mutex_destroy(&r->mu);
  free(r);
}
