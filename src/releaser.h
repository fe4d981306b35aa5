/*
 * releaser.h: the releaser thread of a device pool's expandable segments. Internal to the core;
 * vmseg.c is its only user.
 *
 * Unmapping a chunk and destroying it are driver calls of tens of microseconds each (cuMemUnmap,
 * cuMemRelease: docs/internals/HOT-PATH.md), and the allocation that moves an idle chunk or gives
 * one back to make room waits for them although it needs neither result: its own chunk is created
 * and mapped elsewhere. The driver lets the two run at once from two host threads
 * (tools/vm_overlap.cu), so vmseg.c hands them to this thread and goes on with its own calls.
 *
 * A job is one unmap of [va, va+size) and, when `destroy` is set and the unmap succeeded, one
 * destroy of the handle. Jobs run one at a time, in the order they were queued. The thread takes
 * no lock of the core, only this queue's own mutex: the pool lock may be held while waiting for it.
 * It starts with the first job and ends at gpumem__rel_free. Signals are blocked in it.
 */
#ifndef GPUMEM_RELEASER_H
#define GPUMEM_RELEASER_H

#include "internal.h"

typedef struct gpumem__rel_job {
  void *va;              /* the mapping to unmap */
  size_t size;
  gpumem_phys_handle h;  /* its handle */
  uint32_t len;          /* granules (for the caller) */
  uint32_t g;            /* first granule of the mapping in its space (for the caller) */
  void *space;           /* the caller's space */
  uint8_t destroy;       /* destroy h once it is unmapped */
  gpumem_status unmap_st;   /* results: GPUMEM_OK, or the backend's status */
  gpumem_status destroy_st; /* (GPUMEM_OK when no destroy was asked; not tried after a failed unmap) */
} gpumem__rel_job;

typedef struct gpumem__releaser gpumem__releaser;

/** A releaser for device `dev` of ctx, or NULL (no host memory: the caller makes the calls itself). The thread
 *  starts with the first job. */
gpumem__releaser *gpumem__rel_new(gpumem_context *ctx, int dev);
/** Queue a job (its result fields are ignored). 0, or -1 when the queue is full or the thread cannot start:
 *  then the caller makes the calls itself. */
int gpumem__rel_push(gpumem__releaser *r, const gpumem__rel_job *job);
/** Jobs queued and not yet taken by gpumem__rel_take (done or not). */
size_t gpumem__rel_queued(const gpumem__releaser *r);
/** Up to max finished jobs, oldest first, with their results, into out; returns how many. With wait set,
 *  first waits until every queued job has finished. */
size_t gpumem__rel_take(gpumem__releaser *r, gpumem__rel_job *out, size_t max, int wait);
/** Waits for every queued job, stops the thread and frees r (NULL: nothing). Jobs not taken are lost: take
 *  them first. */
void gpumem__rel_free(gpumem__releaser *r);

#endif /* GPUMEM_RELEASER_H */
