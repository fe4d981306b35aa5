/**
 * \file gpumem/sim.h
 * \brief Controls of the host simulator backend ("sim"), for tests.
 *
 * The sim backend simulates devices in host memory. Its state is
 * process-wide (like a real GPU driver): every context using "sim" sees the
 * same devices, memory and streams. The devices are (re)read from
 * `GPUMEM_SIM_DEVICES` and `CUDA_VISIBLE_DEVICES` when the first context
 * using sim is created after none was alive (or at gpumem_sim_reinit()).
 *
 * Streams are opaque tokens: any pointer value is a stream (NULL is the
 * default stream). Events complete at once unless delayed mode is on; then
 * an event recorded on a stream completes only when the test completes the
 * stream's work with gpumem_sim_stream_complete(), or when the stream or the
 * device is synchronised (the simulated wait "waits" by completing it).
 */
#ifndef GPUMEM_SIM_H
#define GPUMEM_SIM_H

#include "../gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

/** \brief Sim backend error codes (returned by its vtable methods). */
typedef enum gpumem_sim_error {
  GPUMEM_SIM_OK = 0,                /**< success */
  GPUMEM_SIM_ERR_INVALID_VALUE = 1, /**< bad argument (maps to ::GPUMEM_ERR_BACKEND) */
  GPUMEM_SIM_ERR_OUT_OF_MEMORY = 2, /**< capacity exhausted (maps to ::GPUMEM_ERR_OUT_OF_MEMORY) */
  GPUMEM_SIM_ERR_BAD_ENV = 3,       /**< GPUMEM_SIM_DEVICES does not parse (maps to ::GPUMEM_ERR_INVALID_ARGUMENT; its message names the variable) */
  GPUMEM_SIM_ERR_INVALID_DEVICE = 101, /**< bad device (maps to ::GPUMEM_ERR_INVALID_DEVICE) */
  GPUMEM_SIM_ERR_NO_DEVICE = 100,   /**< no visible device (maps to ::GPUMEM_ERR_NO_BACKEND) */
  GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED = 900, /**< refused while a stream captures; the capture is invalidated (as cudaErrorStreamCaptureUnsupported; maps to ::GPUMEM_ERR_BACKEND) */
  GPUMEM_SIM_ERR_CAPTURE_INVALIDATED = 901, /**< the stream's capture was invalidated earlier (as cudaErrorStreamCaptureInvalidated; ::GPUMEM_ERR_BACKEND) */
  GPUMEM_SIM_ERR_CAPTURE_IMPLICIT = 906,    /**< the NULL stream used while a stream of the device captures; invalidates it (as cudaErrorStreamCaptureImplicit; ::GPUMEM_ERR_BACKEND) */
  GPUMEM_SIM_ERR_CAPTURED_EVENT = 907,      /**< query or wait on an event last recorded in a capture; invalidates it if under way (as cudaErrorCapturedEvent; ::GPUMEM_ERR_BACKEND) */
  GPUMEM_SIM_ERR_INJECTED = 999     /**< an injected generic fault (maps to ::GPUMEM_ERR_BACKEND) */
} gpumem_sim_error;

/** \brief Kinds of backend call that faults can be injected into. */
typedef enum gpumem_sim_call {
  GPUMEM_SIM_CALL_MALLOC = 0, /**< malloc and vm_create */
  GPUMEM_SIM_CALL_FREE = 1,   /**< free and vm_destroy */
  GPUMEM_SIM_CALL_EVENT = 2,  /**< event create/record/query/synchronize, stream_wait_event */
  GPUMEM_SIM_CALL_INFO = 3,   /**< device_info and mem_get_info */
  GPUMEM_SIM_CALL_SYNC = 4,   /**< stream/device synchronize */
  GPUMEM_SIM_CALL_MAP = 5,    /**< vm_reserve, vm_map, vm_unmap */
  GPUMEM_SIM_CALL_KINDS_ = 6  /**< number of kinds (not a kind) */
} gpumem_sim_call;

/**
 * \brief Fail the `nth` next call (1 = the very next) of a kind with `error`.
 * \param kind   the kind of call (::gpumem_sim_call).
 * \param nth    which call of that kind fails, counting from 1 (the very next).
 * \param error  the backend code the call returns (a ::gpumem_sim_error).
 * \param repeat 0: fail once; non-zero: fail that call and every later call of the kind until cleared.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT for a bad kind or nth < 1.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_fail_nth(gpumem_sim_call kind, uint64_t nth, int error, int repeat);

/**
 * \brief Fail calls of a kind now and then: the `nth` next call (1 = the very next), and from there every
 * `every`-th call (nth, nth + every, nth + 2 * every, ...), until cleared; the calls between succeed.
 * Models a driver whose calls fail intermittently (a call over a range then half succeeds, with gaps).
 * Replaces any fault armed for the kind.
 * \param kind   the kind of call (::gpumem_sim_call).
 * \param nth    the first call that fails, counting from 1.
 * \param every  the distance between failing calls (1: every call from nth on).
 * \param error  the backend code the calls return (a ::gpumem_sim_error).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT for a bad kind, nth < 1, every < 1 or error 0.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_fail_every(gpumem_sim_call kind, uint64_t nth, uint64_t every, int error);

/** \brief Clear every injected fault. Thread-safe. */
GPUMEM_API void gpumem_sim_fail_clear(void);

/** \brief Number of calls of a kind made since the sim state was created (counts failed calls too). Thread-safe. */
GPUMEM_API uint64_t gpumem_sim_call_count(gpumem_sim_call kind);

/**
 * \brief Delayed-completion mode: when on, events recorded on a stream stay
 *        pending until the stream's work is completed explicitly.
 * Thread-safe.
 */
GPUMEM_API void gpumem_sim_set_delayed(int on);

/** \brief Complete all work queued so far on one stream of one device (device -1 = every device). Thread-safe. */
GPUMEM_API void gpumem_sim_stream_complete(int device, gpumem_stream stream);

/**
 * \brief Queue one work item on a stream, as a kernel the caller launches there (for instance one that
 *        uses a block before the block is freed): it completes with the stream's other work
 *        (at once unless delayed mode is on; see gpumem_sim_set_delayed()).
 * \param device a visible device ordinal.
 * \param stream the stream (NULL: the default stream).
 * \param ticket out: the item's position on the stream, for gpumem_sim_stream_done().
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT for a NULL `ticket`; ::GPUMEM_ERR_INVALID_DEVICE
 *         for a device the sim does not show, ::GPUMEM_ERR_NO_BACKEND while no context uses the sim;
 *         ::GPUMEM_ERR_BACKEND for a stream being captured or
 *         destroyed (gpumem_sim_stream_destroy()); ::GPUMEM_ERR_OUT_OF_MEMORY without host memory.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_submit(int device, gpumem_stream stream, uint64_t *ticket);

/**
 * \brief Order a stream's later work after the work queued on another stream so far, as
 *        cudaStreamWaitEvent on an event recorded on `on` now: the work item this queues on `stream`
 *        completes only after that work (when `stream`'s work up to it completes, so does `on`'s).
 *        Nothing is queued when `on`'s work has completed or the streams are the same.
 * \param device a visible device ordinal.
 * \param stream the stream whose later work waits (NULL: the default stream).
 * \param on the stream waited for (NULL: the default stream).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_DEVICE for a device the sim does not show,
 *         ::GPUMEM_ERR_NO_BACKEND while no context uses the sim; ::GPUMEM_ERR_BACKEND for a stream
 *         being captured or destroyed; ::GPUMEM_ERR_OUT_OF_MEMORY without host memory or with too many
 *         waits of `stream` not passed yet.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_wait(int device, gpumem_stream stream, gpumem_stream on);

/**
 * \brief Whether the work of a stream up to `ticket` (gpumem_sim_stream_submit(), or a position
 *        counted the same way) has completed: a test's way to tell whether the device may still be
 *        using memory that work touched.
 * \param device a visible device ordinal.
 * \param stream the stream (NULL: the default stream).
 * \param ticket a position on the stream (gpumem_sim_stream_submit()).
 * \param done out: 1 if completed, 0 if not (a stream never used has completed ticket 0 only).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT for a NULL `done`; ::GPUMEM_ERR_NO_BACKEND while no
 *         context uses the sim; ::GPUMEM_ERR_INVALID_DEVICE for
 *         a device the sim does not show.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_done(int device, gpumem_stream stream, uint64_t ticket, int *done);

/**
 * \brief Whether work queued on `stream` from now on runs after `on`'s work up to `ticket`: that
 *        work has completed, or `stream` is `on`, or `stream` waits for it through waits queued so
 *        far (gpumem_sim_stream_wait(), or the backend's stream_wait_event as the library uses it),
 *        directly or through other streams: whether a block that work used may be handed to
 *        `stream` now without a race on the device.
 * \param device a visible device ordinal.
 * \param stream the stream whose later work is asked about (NULL: the default stream).
 * \param on the stream of the earlier work (NULL: the default stream).
 * \param ticket a position on `on` (gpumem_sim_stream_submit()).
 * \param ordered out: 1 if that work is ordered before, 0 if not (also when the sim has no host memory
 *        to follow the waits with and the work has not completed).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT for a NULL `ordered`; ::GPUMEM_ERR_NO_BACKEND while
 *         no context uses the sim; ::GPUMEM_ERR_INVALID_DEVICE for a device the sim does not show.
 * Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_ordered(int device, gpumem_stream stream, gpumem_stream on, uint64_t ticket,
                                                   int *ordered);

/** \brief Complete all work on every stream of every device. Thread-safe. */
GPUMEM_API void gpumem_sim_complete_all(void);

/**
 * \brief Clocked delayed mode: from now on, each event recorded in delayed mode carries the clock
 *        `now` (any increasing count the caller keeps, as the number of operations so far), and
 *        gpumem_sim_complete_before completes the work recorded before a given clock: a device
 *        that runs a constant distance behind the host. gpumem_sim_set_delayed(0) ends it.
 * Thread-safe.
 */
GPUMEM_API void gpumem_sim_set_clock(uint64_t now);

/**
 * \brief Clocked delayed mode: complete, on every stream of every device, the work recorded while
 *        the clock was less than `t` (at most the last 1024 records of a stream stay pending).
 * Thread-safe.
 */
GPUMEM_API void gpumem_sim_complete_before(uint64_t t);

/**
 * \brief Bytes the sim backend has handed out on a visible device (plain and
 *        virtual-memory chunks), i.e. what a real device would show as used by this process.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_NO_BACKEND (sim not initialised).
 */
GPUMEM_API gpumem_status gpumem_sim_used_bytes(int device, uint64_t *used);

/**
 * \brief Simulate memory taken by someone else (another process) on a
 *        visible device: it reduces the device's free memory.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_OUT_OF_MEMORY; ::GPUMEM_ERR_NO_BACKEND.
 */
GPUMEM_API gpumem_status gpumem_sim_set_external_usage(int device, uint64_t bytes);

/** \brief Capture modes, as cudaStreamCaptureMode (values equal to CUDA's). */
typedef enum gpumem_sim_capture_mode {
  GPUMEM_SIM_CAPTURE_GLOBAL = 0,       /**< cudaStreamCaptureModeGlobal (a thread's default interaction mode) */
  GPUMEM_SIM_CAPTURE_THREAD_LOCAL = 1, /**< cudaStreamCaptureModeThreadLocal */
  GPUMEM_SIM_CAPTURE_RELAXED = 2       /**< cudaStreamCaptureModeRelaxed */
} gpumem_sim_capture_mode;

/**
 * \brief Begin capturing a stream of a visible device, as cudaStreamBeginCapture.
 *
 * Until gpumem_sim_stream_end_capture(), an event recorded on the stream is
 * recorded into the capture and runs nothing, and the sim refuses, with a
 * `GPUMEM_SIM_ERR_CAPTURE_*` code, what CUDA refuses (see the rules in sim.c
 * and cuda.c), invalidating the capture. The capture belongs to the calling
 * thread (for the global and thread-local rules).
 * \param device a visible device ordinal.
 * \param stream the stream to capture (not NULL).
 * \param mode a ::gpumem_sim_capture_mode.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL stream: the legacy
 *         stream cannot be captured; bad mode); ::GPUMEM_ERR_BUSY (the stream is
 *         already capturing); ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_NO_BACKEND
 *         (sim not initialised); ::GPUMEM_ERR_OUT_OF_MEMORY (host memory). Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_begin_capture(int device, gpumem_stream stream, int mode);

/**
 * \brief End a stream's capture, as cudaStreamEndCapture.
 * \param device a visible device ordinal.
 * \param stream the capturing stream.
 * \param invalidated may be NULL; set to 1 when the capture had been
 *        invalidated (CUDA would return cudaErrorStreamCaptureInvalidated and no
 *        graph), else 0.
 * \return ::GPUMEM_OK (the stream no longer captures); ::GPUMEM_ERR_INVALID_ARGUMENT
 *         (NULL stream, the stream is not capturing, or a non-relaxed capture
 *         ended from another thread than the one that began it: it stays
 *         under way); ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_NO_BACKEND. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_end_capture(int device, gpumem_stream stream, int *invalidated);

/**
 * \brief A stream's capture state, as the vtable's stream_capture() reports it.
 * \param device a visible device ordinal.
 * \param stream the stream asked about.
 * \param status  set to 0 (none), 1 (active) or 2 (invalidated): GPUMEM_CAPTURE_* of gpumem/backend.h.
 *                For the NULL stream: 1 while a stream of the device captures.
 * \param capture_id set to the capture's id (unique in the process), 0 with none.
 * \param nodes   may be NULL; set to the number of work items recorded into the capture.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL output);
 *         ::GPUMEM_ERR_INVALID_DEVICE; ::GPUMEM_ERR_NO_BACKEND. Thread-safe; invalidates nothing.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_capture_status(int device, gpumem_stream stream, int *status,
                                                          uint64_t *capture_id, uint64_t *nodes);

/**
 * \brief Destroy a stream, as cudaStreamDestroy: from now on the handle names no
 *        stream, and a backend call that names it (event_record, stream_wait_event,
 *        stream_synchronize, stream_capture) fails with `GPUMEM_SIM_ERR_INVALID_VALUE` and is
 *        counted by gpumem_sim_dead_stream_uses(). CUDA does not check such a handle: the call
 *        reads freed driver memory (cuStreamGetCaptureInfo crashed on an H100 and an H200), so a
 *        library must not keep using a stream handle after the call that passed it.
 * \param device a visible device ordinal.
 * \param stream the stream (not NULL: the legacy stream is never destroyed).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL stream, or destroyed already);
 *         ::GPUMEM_ERR_BUSY (the stream's capture is not ended); ::GPUMEM_ERR_INVALID_DEVICE;
 *         ::GPUMEM_ERR_NO_BACKEND (sim not initialised); ::GPUMEM_ERR_OUT_OF_MEMORY (host memory).
 *         Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_destroy(int device, gpumem_stream stream);

/**
 * \brief Make a stream at a handle, as cudaStreamCreate may return the address of a
 *        stream destroyed before: a destroyed handle names a stream again, with no work
 *        queued. Nothing to do for a handle that was not destroyed (sim streams are made on
 *        first use).
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL stream); ::GPUMEM_ERR_INVALID_DEVICE;
 *         ::GPUMEM_ERR_NO_BACKEND. Thread-safe.
 */
GPUMEM_API gpumem_status gpumem_sim_stream_create(int device, gpumem_stream stream);

/** \brief Backend calls that named a destroyed stream since the sim state was created
 *         (see gpumem_sim_stream_destroy()): 0 in a library that uses only the streams its callers pass
 *         in the call. Thread-safe. */
GPUMEM_API uint64_t gpumem_sim_dead_stream_uses(void);

/**
 * \brief Swap the calling thread's capture interaction mode, as
 *        cudaThreadExchangeStreamCaptureMode (each thread starts in global mode).
 * \param mode in: the new ::gpumem_sim_capture_mode; out: the previous one.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_INVALID_ARGUMENT (NULL or bad mode). Thread-safe (per thread).
 */
GPUMEM_API gpumem_status gpumem_sim_thread_exchange_capture_mode(int *mode);

/**
 * \brief Whether the sim makes its own potentially unsafe calls (malloc,
 *        mem_get_info, event create/destroy/query, vm_*) in relaxed mode, as
 *        the CUDA backend does. On by default; off models a backend that does
 *        not, so that tests can see what the relaxation prevents. Thread-safe.
 * \param on 1: relaxed (default), 0: the caller's mode.
 */
GPUMEM_API void gpumem_sim_set_capture_relax(int on);

/**
 * \brief Re-read `GPUMEM_SIM_DEVICES` and `CUDA_VISIBLE_DEVICES` now.
 * \return ::GPUMEM_OK; ::GPUMEM_ERR_BUSY if a context using sim is alive;
 *         ::GPUMEM_ERR_INVALID_ARGUMENT if the variables do not parse;
 *         ::GPUMEM_ERR_NO_BACKEND if they parse but leave no visible device.
 */
GPUMEM_API gpumem_status gpumem_sim_reinit(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_SIM_H */
