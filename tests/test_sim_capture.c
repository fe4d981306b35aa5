/*
 * test_sim_capture.c: the sim backend's model of stream capture, driven
 * through its vtable (no core): begin/end, status and ids, what each mode
 * refuses and which refusals invalidate a capture, the sim's relaxed calls,
 * global mode across threads, thread-local mode, the calls no mode permits,
 * destroyed streams, and bad input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include <gpumem.h>
#include <gpumem/backend.h>
#include <gpumem/sim.h>

extern const gpumem_backend gpumem__sim_backend;

static gpumem_backend be;
static char tok_a, tok_b;
#define SA ((gpumem_stream)&tok_a)
#define SB ((gpumem_stream)&tok_b)

static int setup(void **state) {
  (void)state;
  be = gpumem__sim_backend;
  unsetenv("GPUMEM_SIM_DEVICES");
  unsetenv("CUDA_VISIBLE_DEVICES");
  setenv("GPUMEM_SIM_DEVICES", "2x1GiB", 1);
  return be.init(&be) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  gpumem_sim_set_capture_relax(1);
  be.shutdown(&be);
  return 0;
}

static int cap_status(int dev, gpumem_stream s, uint64_t *id) {
  int st = -1;
  uint64_t i = 99;
  assert_int_equal(be.stream_capture(&be, dev, s, &st, &i), 0);
  if (id) *id = i;
  return st;
}

static void end_ok(gpumem_stream s, int want_invalidated) {
  int inv = -1;
  assert_int_equal(gpumem_sim_stream_end_capture(0, s, &inv), GPUMEM_OK);
  assert_int_equal(inv, want_invalidated);
}

static void test_begin_end_status_ids(void **state) {
  (void)state;
  uint64_t id1 = 0, id2 = 0, id = 0;
  assert_true(be.version >= 3);
  assert_non_null(be.stream_capture);
  assert_int_equal(cap_status(0, SA, &id), GPUMEM_CAPTURE_NONE);
  assert_int_equal(id, 0);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(cap_status(0, SA, &id1), GPUMEM_CAPTURE_ACTIVE);
  assert_true(id1 != 0);
  assert_int_equal(cap_status(0, SB, &id), GPUMEM_CAPTURE_NONE); /* other stream */
  assert_int_equal(cap_status(1, SA, &id), GPUMEM_CAPTURE_NONE); /* same token, other device */
  assert_int_equal(cap_status(0, NULL, &id), GPUMEM_CAPTURE_ACTIVE); /* legacy stream is blocked */
  assert_int_equal(id, 0);
  end_ok(SA, 0);
  assert_int_equal(cap_status(0, SA, &id), GPUMEM_CAPTURE_NONE);
  assert_int_equal(cap_status(0, NULL, &id), GPUMEM_CAPTURE_NONE);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(cap_status(0, SA, &id2), GPUMEM_CAPTURE_ACTIVE);
  assert_true(id2 != id1); /* unique per capture sequence */
  end_ok(SA, 0);
}

static void test_record_is_captured_not_run(void **state) {
  (void)state;
  gpumem_event ev;
  int done = -1, st;
  uint64_t id, nodes = 0;
  gpumem_sim_set_delayed(1);
  assert_int_equal(be.event_create(&be, 0, &ev), 0);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(be.event_record(&be, 0, ev, SA), 0);
  assert_int_equal(be.event_record(&be, 0, ev, SA), 0);
  assert_int_equal(gpumem_sim_stream_capture_status(0, SA, &st, &id, &nodes), GPUMEM_OK);
  assert_int_equal(st, GPUMEM_CAPTURE_ACTIVE);
  assert_int_equal(nodes, 2);
  /* querying a captured event: refused whatever the mode, and invalidates the capture */
  assert_int_equal(be.event_query(&be, 0, ev, &done), GPUMEM_SIM_ERR_CAPTURED_EVENT);
  assert_int_equal(done, -1);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
  assert_int_equal(be.event_record(&be, 0, ev, SA), GPUMEM_SIM_ERR_CAPTURE_INVALIDATED);
  end_ok(SA, 1);
  /* still a captured event after the end; a record outside a capture makes it plain again */
  assert_int_equal(be.event_synchronize(&be, 0, ev), GPUMEM_SIM_ERR_CAPTURED_EVENT);
  assert_int_equal(be.event_record(&be, 0, ev, SA), 0);
  assert_int_equal(be.event_query(&be, 0, ev, &done), 0);
  assert_int_equal(done, 0); /* delayed: the real record is pending */
  gpumem_sim_stream_complete(0, SA);
  assert_int_equal(be.event_query(&be, 0, ev, &done), 0);
  assert_int_equal(done, 1);
  assert_int_equal(be.event_destroy(&be, 0, ev), 0);
  gpumem_sim_set_delayed(0);
}

/* The backend's own unsafe calls on the capturing thread: legal because the sim relaxes them. */
static void test_relaxed_calls_do_not_invalidate(void **state) {
  (void)state;
  void *p = NULL, *va = NULL;
  uint64_t f, t;
  gpumem_phys_handle h = 0;
  gpumem_event ev;
  int done;
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, 4096, &p), 0);
  assert_int_equal(be.mem_get_info(&be, 0, &f, &t), 0);
  assert_int_equal(be.event_create(&be, 0, &ev), 0);
  assert_int_equal(be.event_query(&be, 0, ev, &done), 0);
  assert_int_equal(be.vm_reserve(&be, 0, 2u << 20, &va), 0);
  assert_int_equal(be.vm_create(&be, 0, 2u << 20, &h), 0);
  assert_int_equal(be.vm_map(&be, 0, va, 2u << 20, h), 0);
  assert_int_equal(be.vm_unmap(&be, 0, va, 2u << 20), 0);
  assert_int_equal(be.vm_destroy(&be, 0, h), 0);
  assert_int_equal(be.vm_release(&be, 0, va, 2u << 20), 0);
  assert_int_equal(be.event_destroy(&be, 0, ev), 0);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_ACTIVE);
  /* free keeps the caller's mode: refused, and the capture is lost */
  assert_int_equal(be.free(&be, 0, p), GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
  end_ok(SA, 1);
  assert_int_equal(be.free(&be, 0, p), 0);
}

/* Without the sim's relaxation, each potentially unsafe call invalidates a global capture of this thread. */
static void test_each_unsafe_call_invalidates_unrelaxed(void **state) {
  (void)state;
  gpumem_sim_set_capture_relax(0);
  for (int k = 0; k < 5; k++) {
    void *p = NULL, *va = NULL;
    uint64_t f, t;
    gpumem_phys_handle h;
    gpumem_event ev;
    int rc = -1;
    assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_THREAD_LOCAL), GPUMEM_OK);
    switch (k) {
    case 0: rc = be.malloc(&be, 0, 4096, &p); break;
    case 1: rc = be.mem_get_info(&be, 0, &f, &t); break;
    case 2: rc = be.event_create(&be, 0, &ev); break;
    case 3: rc = be.vm_reserve(&be, 0, 2u << 20, &va); break;
    case 4: rc = be.vm_create(&be, 0, 2u << 20, &h); break;
    }
    assert_int_equal(rc, GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED);
    assert_int_equal(be.error_status(&be, rc), GPUMEM_ERR_BACKEND);
    assert_non_null(strstr(be.error_string(&be, rc), "capturing"));
    assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
    end_ok(SA, 1);
  }
  /* a relaxed capture of this thread refuses nothing */
  void *p = NULL;
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, 4096, &p), 0);
  assert_int_equal(be.free(&be, 0, p), 0);
  end_ok(SA, 0);
  /* nor does a thread that switched itself to relaxed mode */
  int mode = GPUMEM_SIM_CAPTURE_RELAXED;
  assert_int_equal(gpumem_sim_thread_exchange_capture_mode(&mode), GPUMEM_OK);
  assert_int_equal(mode, GPUMEM_SIM_CAPTURE_GLOBAL);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(be.malloc(&be, 0, 4096, &p), 0);
  assert_int_equal(be.free(&be, 0, p), 0);
  end_ok(SA, 0);
  assert_int_equal(gpumem_sim_thread_exchange_capture_mode(&mode), GPUMEM_OK);
  assert_int_equal(mode, GPUMEM_SIM_CAPTURE_RELAXED);
}

/* Calls that conflict with any capture, relaxed ones included. */
static void test_incompatible_calls_invalidate_in_any_mode(void **state) {
  (void)state;
  gpumem_event ev;
  assert_int_equal(be.event_create(&be, 0, &ev), 0);
  for (int k = 0; k < 5; k++) {
    int rc = -1, want = GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED;
    assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
    switch (k) {
    case 0: rc = be.stream_synchronize(&be, 0, SA); break;
    case 1: rc = be.device_synchronize(&be, 0); break;
    case 2: rc = be.device_reset(&be, 0); break;
    case 3: rc = be.stream_synchronize(&be, 0, NULL); want = GPUMEM_SIM_ERR_CAPTURE_IMPLICIT; break;
    case 4: rc = be.event_record(&be, 0, ev, NULL); want = GPUMEM_SIM_ERR_CAPTURE_IMPLICIT; break;
    }
    assert_int_equal(rc, want);
    assert_int_equal(be.error_status(&be, rc), GPUMEM_ERR_BACKEND);
    assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
    assert_int_equal(be.stream_synchronize(&be, 0, SA), GPUMEM_SIM_ERR_CAPTURE_INVALIDATED);
    end_ok(SA, 1);
  }
  /* another stream and another device are untouched by a capture */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_int_equal(be.stream_synchronize(&be, 0, SB), 0);
  assert_int_equal(be.device_synchronize(&be, 1), 0);
  assert_int_equal(be.event_record(&be, 0, ev, SB), 0);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_ACTIVE);
  end_ok(SA, 0);
  assert_int_equal(be.event_destroy(&be, 0, ev), 0);
}

typedef struct thr_arg {
  int mode;     /* the thread's interaction mode */
  int relax;    /* make the call as the sim's relaxed malloc (1) or free (0) */
  int rc;
} thr_arg;

static void *other_thread(void *p) {
  thr_arg *a = p;
  int mode = a->mode;
  void *q = NULL;
  gpumem_sim_thread_exchange_capture_mode(&mode);
  if (a->relax) {
    a->rc = be.malloc(&be, 0, 4096, &q);
    if (a->rc == 0) a->rc = be.free(&be, 0, q) == 0 ? 0 : -1000;
  } else {
    uint64_t f, t;
    a->rc = be.mem_get_info(&be, 0, &f, &t);
  }
  gpumem_sim_thread_exchange_capture_mode(&mode);
  return NULL;
}

static int run_other(int mode, int relax) {
  pthread_t t;
  thr_arg a = {mode, relax, -1};
  assert_int_equal(pthread_create(&t, NULL, other_thread, &a), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  return a.rc;
}

static void test_global_mode_across_threads(void **state) {
  (void)state;
  gpumem_sim_set_capture_relax(0);
  /* a global capture here: another thread in global mode is refused, and the capture lost */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(run_other(GPUMEM_SIM_CAPTURE_GLOBAL, 0), GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
  end_ok(SA, 1);
  /* ... but not one in thread-local or relaxed mode */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(run_other(GPUMEM_SIM_CAPTURE_THREAD_LOCAL, 0), 0);
  assert_int_equal(run_other(GPUMEM_SIM_CAPTURE_RELAXED, 0), 0);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_ACTIVE);
  end_ok(SA, 0);
  /* with the sim's relaxation, a malloc on another thread in global mode is legal */
  gpumem_sim_set_capture_relax(1);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(run_other(GPUMEM_SIM_CAPTURE_GLOBAL, 1), -1000); /* malloc legal; free is not */
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
  end_ok(SA, 1);
}

static void test_thread_local_mode(void **state) {
  (void)state;
  gpumem_sim_set_capture_relax(0);
  /* a thread-local capture ignores other threads, even in global mode ... */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_THREAD_LOCAL), GPUMEM_OK);
  assert_int_equal(run_other(GPUMEM_SIM_CAPTURE_GLOBAL, 0), 0);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_ACTIVE);
  /* ... but not its own thread */
  uint64_t f, t;
  assert_int_equal(be.mem_get_info(&be, 0, &f, &t), GPUMEM_SIM_ERR_CAPTURE_UNSUPPORTED);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_INVALIDATED);
  end_ok(SA, 1);
  /* a relaxed capture on another thread does not refuse this one */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_int_equal(run_other(GPUMEM_SIM_CAPTURE_GLOBAL, 0), 0);
  end_ok(SA, 0);
}

typedef struct end_arg {
  gpumem_status st;
} end_arg;

static void *end_elsewhere(void *p) {
  end_arg *a = p;
  a->st = gpumem_sim_stream_end_capture(0, SA, NULL);
  return NULL;
}

static void test_bad_input(void **state) {
  (void)state;
  int st;
  uint64_t id;
  assert_int_equal(gpumem_sim_stream_begin_capture(0, NULL, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, 7), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, -1), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_begin_capture(5, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_end_capture(0, SA, &st), GPUMEM_ERR_INVALID_ARGUMENT); /* end without begin */
  assert_int_equal(gpumem_sim_stream_end_capture(0, NULL, &st), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_end_capture(-1, SA, &st), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_capture_status(0, SA, NULL, &id, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_capture_status(9, SA, &st, &id, NULL), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_thread_exchange_capture_mode(NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  int bad = 3;
  assert_int_equal(gpumem_sim_thread_exchange_capture_mode(&bad), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(bad, 3);
  /* the vtable method */
  assert_int_equal(be.stream_capture(&be, 0, SA, NULL, &id), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.stream_capture(&be, 0, SA, &st, NULL), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.stream_capture(&be, 2, SA, &st, &id), GPUMEM_SIM_ERR_INVALID_DEVICE);
  /* double begin: refused, the capture under way is untouched */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_ERR_BUSY);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_ACTIVE);
  /* a global capture ends on its own thread only */
  pthread_t t;
  end_arg a = {GPUMEM_OK};
  assert_int_equal(pthread_create(&t, NULL, end_elsewhere, &a), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(a.st, GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_ACTIVE);
  assert_int_equal(gpumem_sim_stream_end_capture(0, SA, NULL), GPUMEM_OK); /* invalidated may be NULL */
  /* a relaxed one may end elsewhere */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_int_equal(pthread_create(&t, NULL, end_elsewhere, &a), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(a.st, GPUMEM_OK);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_NONE);
}

static void test_no_state(void **state) {
  (void)state;
  int st;
  uint64_t id;
  be.shutdown(&be); /* the fixture's reference: no sim state now */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(gpumem_sim_stream_end_capture(0, SA, NULL), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(be.stream_capture(&be, 0, SA, &st, &id), GPUMEM_SIM_ERR_NO_DEVICE);
  assert_int_equal(be.init(&be), 0); /* for the teardown */
  /* a capture left under way at shutdown is gone with the state */
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SA, GPUMEM_SIM_CAPTURE_GLOBAL), GPUMEM_OK);
  be.shutdown(&be);
  assert_int_equal(be.init(&be), 0);
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_NONE);
  void *p;
  gpumem_sim_set_capture_relax(0);
  assert_int_equal(be.malloc(&be, 0, 4096, &p), 0);
  assert_int_equal(be.free(&be, 0, p), 0);
}

/* A destroyed stream: every vtable call naming it is refused and counted (CUDA reads freed memory
 * there: a crash on an H100 and an H200); other streams are untouched; a stream made again at the
 * handle lives, with nothing queued; bad input. */
static void test_destroyed_stream(void **state) {
  (void)state;
  int st;
  uint64_t id;
  gpumem_event ev;
  assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
  assert_int_equal(be.event_create(&be, 0, &ev), 0);
  assert_int_equal(be.event_record(&be, 0, ev, SA), 0);
  assert_int_equal(gpumem_sim_stream_destroy(0, SA), GPUMEM_OK);
  assert_int_equal(be.stream_capture(&be, 0, SA, &st, &id), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.event_record(&be, 0, ev, SA), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.stream_wait_event(&be, 0, SA, ev), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(be.stream_synchronize(&be, 0, SA), GPUMEM_SIM_ERR_INVALID_VALUE);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 4);
  /* the same handle on the other device, other streams, NULL: alive */
  assert_int_equal(cap_status(1, SA, NULL), GPUMEM_CAPTURE_NONE);
  assert_int_equal(cap_status(0, SB, NULL), GPUMEM_CAPTURE_NONE);
  assert_int_equal(cap_status(0, NULL, NULL), GPUMEM_CAPTURE_NONE);
  assert_int_equal(be.event_record(&be, 0, ev, SB), 0);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 4);
  /* bad input; a capturing stream cannot be destroyed */
  assert_int_equal(gpumem_sim_stream_destroy(0, SA), GPUMEM_ERR_INVALID_ARGUMENT); /* twice */
  assert_int_equal(gpumem_sim_stream_destroy(0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_destroy(7, SB), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_create(0, NULL), GPUMEM_ERR_INVALID_ARGUMENT);
  assert_int_equal(gpumem_sim_stream_create(-3, SB), GPUMEM_ERR_INVALID_DEVICE);
  assert_int_equal(gpumem_sim_stream_begin_capture(0, SB, GPUMEM_SIM_CAPTURE_RELAXED), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_destroy(0, SB), GPUMEM_ERR_BUSY);
  end_ok(SB, 0);
  /* made again: alive, nothing counted */
  assert_int_equal(gpumem_sim_stream_create(0, SA), GPUMEM_OK);
  assert_int_equal(gpumem_sim_stream_create(0, SB), GPUMEM_OK); /* (never destroyed: nothing to do) */
  assert_int_equal(cap_status(0, SA, NULL), GPUMEM_CAPTURE_NONE);
  assert_int_equal(be.event_record(&be, 0, ev, SA), 0);
  assert_int_equal(be.stream_synchronize(&be, 0, SA), 0);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 4);
  assert_int_equal(be.event_destroy(&be, 0, ev), 0);
  /* a new sim state counts from 0 */
  be.shutdown(&be);
  assert_int_equal(gpumem_sim_stream_destroy(0, SA), GPUMEM_ERR_NO_BACKEND);
  assert_int_equal(be.init(&be), 0);
  assert_int_equal(gpumem_sim_dead_stream_uses(), 0);
}

/* Version-3 method through the built-in registry, as the core finds it. */
static void test_builtin_vtable(void **state) {
  (void)state;
  const gpumem_backend *b = gpumem_builtin_backend("sim");
  assert_non_null(b);
  assert_int_equal(b->version, GPUMEM_BACKEND_VERSION);
  assert_int_equal(GPUMEM_BACKEND_VERSION, 4);
  assert_ptr_equal(b->stream_capture, be.stream_capture);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_begin_end_status_ids, setup, teardown),
    cmocka_unit_test_setup_teardown(test_record_is_captured_not_run, setup, teardown),
    cmocka_unit_test_setup_teardown(test_relaxed_calls_do_not_invalidate, setup, teardown),
    cmocka_unit_test_setup_teardown(test_each_unsafe_call_invalidates_unrelaxed, setup, teardown),
    cmocka_unit_test_setup_teardown(test_incompatible_calls_invalidate_in_any_mode, setup, teardown),
    cmocka_unit_test_setup_teardown(test_global_mode_across_threads, setup, teardown),
    cmocka_unit_test_setup_teardown(test_thread_local_mode, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
    cmocka_unit_test_setup_teardown(test_destroyed_stream, setup, teardown),
    cmocka_unit_test_setup_teardown(test_no_state, setup, teardown),
    cmocka_unit_test_setup_teardown(test_builtin_vtable, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
