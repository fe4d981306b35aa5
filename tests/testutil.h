/**
 * \file testutil.h
 * \brief Helpers shared by the cmocka tests (tests/test_*.c).
 *
 * Backend: every helper that creates a context uses the backend named by the
 * environment variable GPUMEM_TEST_BACKEND (default "sim"). Parts of a test
 * that only make sense on the simulator (fault injection, delayed events,
 * host access to device memory, CUDA_VISIBLE_DEVICES games) call
 * TU_REQUIRE_SIM(), which skips the test on any other backend.
 *
 * Context bookkeeping and leak check: contexts made by tu_ctx_new() are
 * registered; tu_ctx_done() destroys one (asserting GPUMEM_OK) and, when it
 * was the last registered one and the backend is sim, checks that the sim
 * has 0 bytes handed out on every device (the check runs while a keeper
 * context holds the process-wide sim state alive, so it sees the state the
 * test used). tu_teardown() is a cmocka teardown that force-destroys what a
 * failed test left behind, clears sim faults and delayed mode, and restores
 * every environment variable changed through tu_setenv().
 *
 * The sim reads GPUMEM_SIM_DEVICES and CUDA_VISIBLE_DEVICES when the first
 * context using it is created after none was alive: set them (tu_setenv)
 * before the first context of a test, or run the case in a child process
 * (tu_run_in_child) when the environment of the whole process matters.
 */
#ifndef GPUMEM_TESTUTIL_H
#define GPUMEM_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <gpumem.h>
#include <gpumem/backend.h>
#include <gpumem/sim.h>

#define TU_KiB ((uint64_t)1024)
#define TU_MiB ((uint64_t)1024 * 1024)
#define TU_GiB ((uint64_t)1024 * 1024 * 1024)

/** cmocka_unit_test with tu_setup / tu_teardown. */
#define TU_TEST(f) cmocka_unit_test_setup_teardown(f, tu_setup, tu_teardown)

/* ---------------------------------------------------------------------- */
/* Backend selection                                                       */

/** Backend under test: $GPUMEM_TEST_BACKEND, default "sim". */
const char *tu_backend(void);
/** 1 when the backend under test is the simulator. */
int tu_is_sim(void);
/**
 * A stream handle other than NULL for tests that need one: `made_up` on sim (which takes any
 * handle), else the legacy default stream's handle (cudaStreamLegacy, 0x1), which every CUDA call
 * accepts with no stream created. A made-up handle is no stream to a driver: the capture probe asks
 * the driver about every stream. Not cudaStreamPerThread: once a thread has used it, a forked child
 * that calls exit() crashes in CUDA's own teardown (tools/fork_exit.cu), and test_trace forks.
 */
gpumem_stream tu_stream(uintptr_t made_up);
/** Skip the current test unless the backend under test is sim. */
#define TU_REQUIRE_SIM()                                                     \
  do {                                                                       \
    if (!tu_is_sim()) {                                                      \
      print_message("[  SKIP    ] sim-only test (backend %s)\n", tu_backend()); \
      skip();                                                                \
    }                                                                        \
  } while (0)

/** Skip the current test under valgrind's memcheck, printing why (msg: a string literal). */
#define TU_SKIP_UNDER_VALGRIND(msg)           \
  do {                                        \
    if (tu_on_valgrind()) {                   \
      print_message("%s\n", msg);             \
      skip();                                 \
    }                                         \
  } while (0)

/**
 * Skip a test of the thread caches where they are off: under valgrind's memcheck the sim annotates
 * every block, which turns the monitoring hooks on, and while they are on the pool serves every call.
 */
#define TU_REQUIRE_CACHES() TU_SKIP_UNDER_VALGRIND("skipped: thread caches are off under memcheck")

/** gpumem_config_init() then backend = tu_backend(). Flags stay 0 (environment applies). */
void tu_config(gpumem_config *cfg);

/* ---------------------------------------------------------------------- */
/* Test scale (valgrind)                                                   */

/**
 * Divisor for the iteration counts of the heavy loops (the fault sweeps,
 * the threaded stress tests): 1 in normal runs, so they always run at full
 * scale. Under valgrind (RUNNING_ON_VALGRIND, when <valgrind/valgrind.h> was
 * found at build time) it is TU_VALGRIND_SCALE, so that memcheck can run
 * every test in CI. $GPUMEM_TEST_SCALE (a positive integer, read once)
 * overrides both: GPUMEM_TEST_SCALE=1 runs full scale under valgrind.
 * tu_setup() leaves GPUMEM_TEST_* variables alone.
 */
unsigned tu_scale(void);
/** Default divisor under valgrind. */
#define TU_VALGRIND_SCALE 16u
/** 1 when the test runs under valgrind (0 when valgrind.h was not found at build time). */
int tu_on_valgrind(void);
/** n / tu_scale(), at least lo (and at most n): an iteration count scaled down under valgrind. */
unsigned long tu_scaled(unsigned long n, unsigned long lo);
/**
 * Whether a sweep over indexes 1..count keeps index i at this scale: all of
 * them at scale 1; otherwise the first and the last `edge`, and every s-th
 * between, s = tu_scale() made odd (so that kept indexes alternate between
 * even and odd), offset by `phase` (so that the sweeps of different kinds
 * cover different indexes).
 */
int tu_sweep_keep(uint64_t i, uint64_t count, unsigned edge, unsigned phase);

/* ---------------------------------------------------------------------- */
/* Contexts                                                                */

/** Create and register a context from cfg (NULL = tu_config defaults); asserts GPUMEM_OK. */
gpumem_context *tu_ctx_new(const gpumem_config *cfg);
/** Register a context created elsewhere (so tu_ctx_done / tu_teardown know it). */
void tu_ctx_register(gpumem_context *ctx);
/** Forget a registered context without destroying it (e.g. after the test destroyed it itself). */
void tu_ctx_forget(gpumem_context *ctx);
/** Number of registered (live) contexts. */
int tu_ctx_live(void);
/** Destroy (flags 0, asserts GPUMEM_OK), unregister, and leak-check when it was the last one. */
void tu_ctx_done(gpumem_context *ctx);
/**
 * Assert that the sim has no bytes handed out on any device. Needs a live sim
 * state: call it while some context is alive (otherwise it checks nothing).
 * A no-op on other backends.
 */
void tu_assert_sim_empty(void);
/** Sum of gpumem_sim_used_bytes over all visible devices (0 if the sim is not initialised). */
uint64_t tu_sim_used_total(void);
/** gpumem_sim_used_bytes(device), asserting GPUMEM_OK. */
uint64_t tu_sim_used(int device);

/** cmocka teardown: force-destroy leftovers, clear sim faults and delayed mode, restore environment. */
int tu_teardown(void **state);
/**
 * cmocka setup: tu_env_clean(), so every test starts from library defaults
 * (ctest sets GPUMEM_LOG=off, which would override log levels).
 */
int tu_setup(void **state);

/* ---------------------------------------------------------------------- */
/* Stats                                                                   */

/** gpumem_get_stats with struct_size set; asserts GPUMEM_OK. */
gpumem_stats tu_stats(gpumem_context *ctx, int device);
/**
 * Assert the invariants every gpumem_stats must satisfy:
 * cached = reserved - allocated, allocated <= reserved, peaks >= current,
 * num_live = num_allocs - num_frees, requested <= allocated, ...
 */
void tu_assert_stats_sane(const gpumem_stats *s);
/** 1 when every counter and figure of a and b is equal. */
int tu_stats_equal(const gpumem_stats *a, const gpumem_stats *b);
/** Assert stats equal, naming the first field that differs. */
void tu_assert_stats_equal(const gpumem_stats *a, const gpumem_stats *b);

/* ---------------------------------------------------------------------- */
/* Block contents (sim only: its device memory is host memory)             */

/**
 * Write a pattern derived from `stamp` into [p, p+n). Blocks larger than
 * 128 KiB get their first and last 64 KiB and one 64-byte run per MiB
 * between, so that huge blocks stay cheap. When tu_scale() > 1 (valgrind):
 * blocks up to 8 KiB whole, else the first and last 4 KiB and one 64-byte
 * run per 64 KiB. No-op unless the backend is sim.
 */
void tu_stamp(void *p, size_t n, uint32_t stamp);
/** 1 when [p, p+n) still holds the pattern tu_stamp(p, n, stamp) wrote (always 1 unless sim). */
int tu_stamp_ok(const void *p, size_t n, uint32_t stamp);
/**
 * tu_stamp_ok for a block the test has already freed while stream work on it
 * is still pending (delayed mode): the sim keeps that memory untouched, and
 * the test reads it on purpose to prove it. memcheck knows the block as
 * freed (the sim announces every free), so under valgrind these reads, and
 * only these, are not reported.
 */
int tu_stamp_ok_pending(const void *p, size_t n, uint32_t stamp);

/* ---------------------------------------------------------------------- */
/* Live block set and overlap check                                        */

/**
 * Return -1 when no two of the n ranges [ptrs[i], ptrs[i]+sizes[i]) overlap
 * (NULL pointers and zero sizes are ignored), else the index of one of an
 * overlapping pair. The arrays are not modified.
 */
long tu_find_overlap(void *const *ptrs, const size_t *sizes, size_t n);

/* ---------------------------------------------------------------------- */
/* Log capture                                                             */

#define TU_LOG_MAX_MSGS 512
#define TU_LOG_MAX_LEN 1024

/** A thread-safe log sink; install with tu_log_install(). */
typedef struct tu_log {
  void *mutex;                           /* pthread_mutex_t *, opaque here */
  int count;                             /* messages received (may exceed TU_LOG_MAX_MSGS) */
  int per_level[GPUMEM_LOG_OFF + 1];     /* messages per level */
  int levels[TU_LOG_MAX_MSGS];           /* level of each stored message */
  char msgs[TU_LOG_MAX_MSGS][TU_LOG_MAX_LEN];
} tu_log;

/** Allocate an empty log sink (free with tu_log_free). */
tu_log *tu_log_new(void);
void tu_log_free(tu_log *log);
/** Forget every captured message. */
void tu_log_clear(tu_log *log);
/** The log callback (user = tu_log *). */
void tu_log_cb(void *user, gpumem_log_level level, const char *msg);
/** Set cfg->log_callback/log_user/log_level to capture into log. */
void tu_log_install(gpumem_config *cfg, tu_log *log, gpumem_log_level level);
/** Number of captured messages containing every one of the NULL-terminated substrings (case-sensitive). */
int tu_log_count_matching(tu_log *log, ...);
/** Number of captured messages at `level` or above. */
int tu_log_count_at_least(tu_log *log, gpumem_log_level level);
/** Print every captured message (debug aid). */
void tu_log_dump(tu_log *log);

/* ---------------------------------------------------------------------- */
/* Environment                                                             */

/** setenv (value NULL = unsetenv), remembering the previous value for tu_env_restore(). */
void tu_setenv(const char *name, const char *value);
/**
 * Restore every variable changed by tu_setenv() since the last restore,
 * newest first, except the cleaning tu_setup() did (undone by tu_teardown()).
 */
void tu_env_restore(void);
/**
 * Unset every GPUMEM_* variable (except GPUMEM_TEST_*, the harness's own), and on sim also
 * CUDA_VISIBLE_DEVICES, saving them for tu_env_restore().
 */
void tu_env_clean(void);

/* ---------------------------------------------------------------------- */
/* Child processes                                                         */

/**
 * Run fn(arg) in a forked child and return its exit status: fn's return
 * value (0 = pass), 128 + signal number if it died of a signal. The child
 * must not use cmocka assertions (a failure would longjmp into the child's
 * copy of the test runner): use TU_CHECK* which print and _exit(1).
 * A child that runs more than 120 s is killed (SIGALRM) as a hang guard.
 */
int tu_run_in_child(int (*fn)(void *arg), void *arg);

/* TU_ASAN: built with AddressSanitizer (GCC or Clang). */
#if defined(__SANITIZE_ADDRESS__)
#  define TU_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define TU_ASAN 1
#  endif
#endif

/**
 * Wait (up to 10 s) until every other thread of the process is parked in a shared FUTEX_WAIT
 * (op 0: how the library's watcher threads sleep; glibc's and the sanitizers' own waits are
 * private), where it holds no lock; returns 1 when they are, 0 on timeout. For a fork under
 * ASan: GCC's libasan takes no allocator lock at fork, so a fork while another thread is inside
 * malloc (a watcher starting, or reading /proc) leaves the child's allocator locked for good.
 * tu_run_in_child calls it under ASan. (glibc's malloc takes its locks at fork: programs
 * without ASan need none of this.)
 */
int tu_quiesce_threads(void);

/**
 * Threads of this process (/proc/self/task) for which match(tid, line, arg) returns nonzero, where
 * line is the first line of /proc/self/task/TID/FILE without its newline (FILE NULL: line is "",
 * nothing is read; match NULL: every thread counts). -1 when /proc cannot be read.
 */
int tu_count_threads(const char *file, int (*match)(long tid, const char *line, void *arg), void *arg);

/** In a child: fail it (exit 1) with a message if cond is false. */
#define TU_CHECK(cond)                                                                    \
  do {                                                                                    \
    if (!(cond)) tu_child_fail(__FILE__, __LINE__, "%s", #cond);                           \
  } while (0)
/** In a child: fail it if a != b (compared as long long). */
#define TU_CHECK_EQ(a, b)                                                                 \
  do {                                                                                    \
    long long tu_a_ = (long long)(a), tu_b_ = (long long)(b);                             \
    if (tu_a_ != tu_b_)                                                                   \
      tu_child_fail(__FILE__, __LINE__, "%s == %s (%lld != %lld)", #a, #b, tu_a_, tu_b_); \
  } while (0)
/** In a child: fail it if status s is not want, naming both. */
#define TU_CHECK_STATUS(s, want)                                                          \
  do {                                                                                    \
    gpumem_status tu_s_ = (s), tu_w_ = (want);                                            \
    if (tu_s_ != tu_w_)                                                                   \
      tu_child_fail(__FILE__, __LINE__, "%s gave %s, expected %s", #s,                    \
                    gpumem_status_name(tu_s_), gpumem_status_name(tu_w_));                \
  } while (0)
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 3, 4)))
#endif
void tu_child_fail(const char *file, int line, const char *fmt, ...);

/* ---------------------------------------------------------------------- */
/* Status assertions                                                       */

/** Assert a status, printing both names on mismatch. */
#define assert_status(s, want) tu_assert_status_((s), (want), #s, __FILE__, __LINE__)
void tu_assert_status_(gpumem_status got, gpumem_status want, const char *expr, const char *file, int line);
/** 1 when s is one of the statuses gpumem.h declares (GPUMEM_OK .. GPUMEM_STATUS_COUNT_-1). */
int tu_status_known(gpumem_status s);

/* ---------------------------------------------------------------------- */
/* Small utilities                                                         */

/** Deterministic PRNG (xorshift64*), per-caller state. */
uint64_t tu_rand(uint64_t *state);
/** Random in [lo, hi]. */
uint64_t tu_rand_range(uint64_t *state, uint64_t lo, uint64_t hi);

/** Capture everything written to fd 2 while fn(arg) runs; returns malloc'd text (caller frees). */
char *tu_capture_stderr(void (*fn)(void *arg), void *arg);

#endif /* GPUMEM_TESTUTIL_H */
