/**
 * \file gpumem.hpp
 * \brief Header-only C++17 RAII wrappers over the libgpumem C API.
 *
 * \code
 * gpumem::context ctx("sim");                       // or ctx(cfg), or ctx() for defaults
 * gpumem::buffer b = ctx.alloc(1 << 20, 0);          // freed when b goes out of scope
 * {
 *   gpumem::scope s = ctx.scope(0);
 *   void *tmp = s.alloc(4096);                       // freed when s goes out of scope
 * }
 * ctx.trim(GPUMEM_ALL_DEVICES, 0);
 * gpumem_stats st = ctx.stats(0);
 * \endcode
 *
 * Every failing call throws gpumem::error, which carries the ::gpumem_status.
 * Destructors never throw. All classes are move-only; a moved-from object is
 * empty and its destructor does nothing.
 *
 * Lifetimes: a gpumem::buffer, gpumem::scope or gpumem::graph_pool made by a
 * gpumem::context shares ownership of the C context with it. If the gpumem::context object is
 * destroyed first (member order, a scope declared outside the context's block),
 * the C context stays alive until the last such handle is gone, and is then
 * destroyed as ~context() would have (forced, with a leak report, if raw
 * allocations are still live): a handle never frees into a destroyed context.
 * context::destroy() refuses (::GPUMEM_ERR_BUSY) while such handles are alive.
 * Handles that do not come from a gpumem::context (a buffer built from a C
 * ::gpumem_buffer, scope(gpumem_scope *), buffer::detach()'s result, raw
 * pointers) follow the C rule: the context must outlive them.
 *
 * Thread safety is that of the C functions wrapped: a context may be used by
 * many threads at once; one buffer or scope object must be used by one thread
 * at a time.
 */
#ifndef GPUMEM_HPP
#define GPUMEM_HPP

#include "gpumem.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

/** \brief C++ RAII wrappers of libgpumem. */
namespace gpumem {

/**
 * \brief Exception thrown by the wrappers when a C call returns a status other than ::GPUMEM_OK.
 *
 * what() reads "<function>: <GPUMEM_ERR_...>: <sentence>".
 */
class error : public std::runtime_error {
public:
  /**
   * \brief Make an error for a failing call.
   * \param s    the status returned.
   * \param what the name of the C function that failed, e.g. "gpumem_alloc".
   */
  error(gpumem_status s, const char *what)
      : std::runtime_error(std::string(what ? what : "gpumem") + ": " + gpumem_status_name(s) + ": " +
                           gpumem_strerror(s)),
        status_(s) {}

  /** \brief The ::gpumem_status of the failing call. */
  gpumem_status status() const noexcept { return status_; }

  /** \brief The status name, e.g. "GPUMEM_ERR_OUT_OF_MEMORY". */
  const char *name() const noexcept { return gpumem_status_name(status_); }

private:
  gpumem_status status_;
};

/**
 * \brief Throw gpumem::error if `s` is not ::GPUMEM_OK.
 * \param s    a status returned by a C function.
 * \param what the function's name, used in the message.
 */
inline void check(gpumem_status s, const char *what) {
  if (s != GPUMEM_OK) throw error(s, what);
}

class context;

/** \brief Implementation details of the wrappers. */
namespace detail {
/**
 * \brief The C context shared by a gpumem::context and the buffers and scopes it made.
 *
 * Destroyed with the last of them: then the C context is destroyed (forced when raw allocations
 * are still live) unless ownership was given up with context::release().
 */
struct context_state {
  gpumem_context *ctx = nullptr; ///< the C context
  bool owned = true;             ///< false after context::release(): the caller destroys it
  /** \brief Own `c`. */
  explicit context_state(gpumem_context *c) noexcept : ctx(c) {}
  context_state(const context_state &) = delete;            ///< not copyable
  context_state &operator=(const context_state &) = delete; ///< not copyable
  /** \brief Destroys the C context as ~context() does. */
  ~context_state() {
    if (ctx == nullptr || !owned) return;
    if (gpumem_destroy(ctx, 0) == GPUMEM_ERR_BUSY) (void)gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  }
};
} // namespace detail

/**
 * \brief An owned allocation (wraps ::gpumem_buffer); freed on its stream when destroyed.
 *
 * Made by context::alloc(): it keeps the C context alive until it is gone (see the file's
 * lifetime notes). Move-only.
 */
class buffer {
public:
  /** \brief An empty buffer (get() is nullptr). */
  buffer() noexcept : b_{} {}

  /** \brief Take ownership of a C buffer filled by gpumem_buffer_alloc(); `b` is left empty. */
  explicit buffer(gpumem_buffer &&b) noexcept : b_(b) { b = gpumem_buffer{}; }

  /** \brief Move: `other` is left empty. */
  buffer(buffer &&other) noexcept : b_(other.b_), owner_(std::move(other.owner_)) { other.b_ = gpumem_buffer{}; }

  /** \brief Move assignment: frees the memory held so far, then takes `other`'s. */
  buffer &operator=(buffer &&other) noexcept {
    if (this != &other) {
      release();
      b_ = other.b_;
      other.b_ = gpumem_buffer{};
      owner_ = std::move(other.owner_);
    }
    return *this;
  }

  buffer(const buffer &) = delete;            ///< not copyable
  buffer &operator=(const buffer &) = delete; ///< not copyable

  /** \brief Frees the memory (gpumem_buffer_release()); errors are ignored. */
  ~buffer() { gpumem_buffer_release(&b_); } // (owner_, destroyed after, may destroy the context)

  /** \brief The device pointer; nullptr when empty (also for a 0-byte allocation). */
  void *get() const noexcept { return b_.ptr; }

  /** \brief The device pointer as `T *`. */
  template <class T> T *as() const noexcept { return static_cast<T *>(b_.ptr); }

  /** \brief The size requested, in bytes; 0 when empty. */
  std::size_t size() const noexcept { return b_.size; }

  /** \brief The device ordinal of the allocation. */
  int device() const noexcept { return b_.device; }

  /** \brief The stream the memory was allocated on and will be freed on. */
  gpumem_stream stream() const noexcept { return b_.stream; }

  /** \brief True when the buffer holds memory. */
  explicit operator bool() const noexcept { return b_.ptr != nullptr; }

  /** \brief The underlying C handle (still owned by this object). */
  const gpumem_buffer &c_buffer() const noexcept { return b_; }

  /** \brief Free the memory now (on its stream) and leave the buffer empty; harmless when empty. */
  void release() noexcept {
    gpumem_buffer_release(&b_);
    owner_.reset();
  }

  /**
   * \brief Give up ownership without freeing: returns the C handle and leaves this object empty.
   *
   * The caller must later pass the handle to gpumem_buffer_release(), while the context lives
   * (the handle does not keep it alive).
   */
  gpumem_buffer detach() noexcept {
    gpumem_buffer out = b_;
    b_ = gpumem_buffer{};
    owner_.reset();
    return out;
  }

private:
  friend class context;
  buffer(gpumem_buffer &&b, std::shared_ptr<detail::context_state> owner) noexcept
      : b_(b), owner_(std::move(owner)) {
    b = gpumem_buffer{};
  }

  gpumem_buffer b_;
  std::shared_ptr<detail::context_state> owner_; // keeps the C context alive while b_ holds memory
};

/**
 * \brief A region (wraps ::gpumem_scope): everything allocated in it is freed when it ends.
 *
 * Made by context::scope(): it keeps the C context alive until it is gone (see the file's
 * lifetime notes). Ends in its destructor, or earlier with end(). Move-only; used by one thread
 * at a time.
 */
class scope {
public:
  /** \brief An empty (already ended) scope. */
  scope() noexcept = default;

  /** \brief Take ownership of a scope from gpumem_scope_begin(). */
  explicit scope(gpumem_scope *s) noexcept : s_(s) {}

  /** \brief Move: `other` is left empty. */
  scope(scope &&other) noexcept : s_(std::exchange(other.s_, nullptr)), owner_(std::move(other.owner_)) {}

  /** \brief Move assignment: ends the scope held so far, then takes `other`'s. */
  scope &operator=(scope &&other) noexcept {
    if (this != &other) {
      if (s_) (void)gpumem_scope_end(s_);
      s_ = std::exchange(other.s_, nullptr);
      owner_ = std::move(other.owner_);
    }
    return *this;
  }

  scope(const scope &) = delete;            ///< not copyable
  scope &operator=(const scope &) = delete; ///< not copyable

  /** \brief Ends the scope, freeing everything allocated in it; errors are ignored. */
  ~scope() {
    if (s_) (void)gpumem_scope_end(s_);
  }

  /**
   * \brief Allocate `bytes` in the scope, freed when the scope ends.
   * \return the device pointer (nullptr for 0 bytes).
   * \throws gpumem::error with ::GPUMEM_ERR_INVALID_ARGUMENT when the scope has
   *         ended, or any status of gpumem_scope_alloc().
   */
  void *alloc(std::size_t bytes) {
    if (!s_) throw error(GPUMEM_ERR_INVALID_ARGUMENT, "gpumem_scope_alloc");
    void *p = nullptr;
    check(gpumem_scope_alloc(s_, bytes, &p), "gpumem_scope_alloc");
    return p;
  }

  /** \brief Allocate `count` objects of type T in the scope. \throws gpumem::error as alloc(). */
  template <class T> T *alloc_n(std::size_t count) { return static_cast<T *>(alloc(count * sizeof(T))); }

  /**
   * \brief Tag every later allocation of the scope (shown in leak reports).
   * \param tag must stay valid until the scope ends; nullptr clears it.
   * \throws gpumem::error when the scope has ended.
   */
  void set_tag(const char *tag) {
    if (!s_) throw error(GPUMEM_ERR_INVALID_ARGUMENT, "gpumem_scope_set_tag");
    check(gpumem_scope_set_tag(s_, tag), "gpumem_scope_set_tag");
  }

  /**
   * \brief End the scope now, freeing everything allocated in it. Harmless when already ended.
   * \throws gpumem::error with the first error of a free; the scope is ended anyway.
   */
  void end() {
    if (!s_) return;
    gpumem_scope *s = std::exchange(s_, nullptr);
    gpumem_status st = gpumem_scope_end(s);
    owner_.reset(); // (may destroy the context: after the scope's frees)
    check(st, "gpumem_scope_end");
  }

  /** \brief True while the scope has not ended. */
  explicit operator bool() const noexcept { return s_ != nullptr; }

  /** \brief The underlying C handle (still owned by this object); nullptr when ended. */
  gpumem_scope *get() const noexcept { return s_; }

private:
  friend class context;
  scope(gpumem_scope *s, std::shared_ptr<detail::context_state> owner) noexcept : s_(s), owner_(std::move(owner)) {}

  gpumem_scope *s_ = nullptr;
  std::shared_ptr<detail::context_state> owner_; // keeps the C context alive until the scope ends
};

/**
 * \brief A private pool for CUDA/HIP graph captures (wraps ::gpumem_graph_pool); released when destroyed.
 *
 * Made by context::graph_pool(): it keeps the C context alive until it is gone (see the file's
 * lifetime notes). Route a capturing stream to it with begin() and end(), or allocate from it
 * explicitly with alloc(); its blocks are freed with context::free() (in order on a stream).
 * Its memory never serves work outside the pool while it lives; destroying it (or release())
 * gives its cached memory back, and each block still live when it is freed. Move-only.
 */
class graph_pool {
public:
  /** \brief An empty (released) pool. */
  graph_pool() noexcept = default;

  /** \brief Move: `other` is left empty. */
  graph_pool(graph_pool &&other) noexcept : p_(std::exchange(other.p_, nullptr)), owner_(std::move(other.owner_)) {}

  /** \brief Move assignment: releases the pool held so far (errors ignored), then takes `other`'s. */
  graph_pool &operator=(graph_pool &&other) noexcept {
    if (this != &other) {
      if (p_) (void)gpumem_graph_pool_release(p_);
      p_ = std::exchange(other.p_, nullptr);
      owner_ = std::move(other.owner_);
    }
    return *this;
  }

  graph_pool(const graph_pool &) = delete;            ///< not copyable
  graph_pool &operator=(const graph_pool &) = delete; ///< not copyable

  /**
   * \brief Releases the pool; errors are ignored (a pool with streams still routed to it, which the
   *        C call refuses, then stays until the context is destroyed).
   */
  ~graph_pool() {
    if (p_) (void)gpumem_graph_pool_release(p_);
  }

  /**
   * \brief Route allocations on `stream` (and on every stream of its capture) to this pool until end().
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_ARGUMENT: released, or `stream` routed to another pool).
   */
  void begin(gpumem_stream stream) { check(gpumem_graph_pool_begin(live_("gpumem_graph_pool_begin"), stream), "gpumem_graph_pool_begin"); }

  /** \brief Stop routing `stream` to this pool. \throws gpumem::error (`stream` not routed to it). */
  void end(gpumem_stream stream) { check(gpumem_graph_pool_end(live_("gpumem_graph_pool_end"), stream), "gpumem_graph_pool_end"); }

  /**
   * \brief Allocate `bytes` from the pool on `stream`; free it with context::free().
   * \throws gpumem::error as gpumem_graph_pool_alloc() (::GPUMEM_ERR_OUT_OF_MEMORY, ...).
   */
  void *alloc(std::size_t bytes, gpumem_stream stream = nullptr) {
    void *p = nullptr;
    check(gpumem_graph_pool_alloc(live_("gpumem_graph_pool_alloc"), bytes, stream, &p), "gpumem_graph_pool_alloc");
    return p;
  }

  /**
   * \brief Allocate exactly [`ptr`, `ptr` + `bytes`) of the pool's free memory (gpumem_graph_pool_alloc_at()).
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_POINTER, ::GPUMEM_ERR_BUSY, ...).
   */
  void alloc_at(void *ptr, std::size_t bytes) {
    check(gpumem_graph_pool_alloc_at(live_("gpumem_graph_pool_alloc_at"), ptr, bytes), "gpumem_graph_pool_alloc_at");
  }

  /** \brief The pool's statistics. \throws gpumem::error when released. */
  gpumem_stats stats() const {
    gpumem_stats st{};
    st.struct_size = sizeof st;
    check(gpumem_graph_pool_get_stats(live_("gpumem_graph_pool_get_stats"), &st), "gpumem_graph_pool_get_stats");
    return st;
  }

  /**
   * \brief Release the pool now. Harmless when already released.
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_ARGUMENT: streams still routed to it; the pool is
   *         kept then, and may be ended and released again).
   */
  void release() {
    if (!p_) return;
    check(gpumem_graph_pool_release(p_), "gpumem_graph_pool_release");
    p_ = nullptr;
    owner_.reset(); // (may destroy the context: after the release)
  }

  /** \brief True until released. */
  explicit operator bool() const noexcept { return p_ != nullptr; }

  /** \brief The underlying C handle (still owned by this object); nullptr when released. */
  gpumem_graph_pool *get() const noexcept { return p_; }

private:
  friend class context;
  graph_pool(gpumem_graph_pool *p, std::shared_ptr<detail::context_state> owner) noexcept : p_(p), owner_(std::move(owner)) {}

  gpumem_graph_pool *live_(const char *fn) const {
    if (!p_) throw error(GPUMEM_ERR_INVALID_ARGUMENT, fn);
    return p_;
  }

  gpumem_graph_pool *p_ = nullptr;
  std::shared_ptr<detail::context_state> owner_; // keeps the C context alive until the pool is released
};

/**
 * \brief A libgpumem context (wraps ::gpumem_context). Move-only.
 *
 * The destructor destroys the context normally; if allocations are still
 * live (::GPUMEM_ERR_BUSY, a leak report is logged) it destroys it again
 * with ::GPUMEM_DESTROY_FORCE, so that the memory always goes back. Call
 * destroy() to see the status instead. While buffers or scopes made from it
 * are alive, the destructor leaves the C context to them: the last one to go
 * destroys it (see the file's lifetime notes).
 */
class context {
public:
  /**
   * \brief Create a context with the default configuration (backend "auto"; `GPUMEM_*` environment applies).
   * \throws gpumem::error with any status of gpumem_create().
   */
  context() { own(nullptr); }

  /**
   * \brief Create a context on a named backend ("auto", "cuda", "hip", "sim"), other settings default.
   * \param backend the backend name; nullptr = "auto". `GPUMEM_BACKEND` still overrides it.
   * \throws gpumem::error with any status of gpumem_create().
   */
  explicit context(const char *backend) {
    gpumem_config cfg;
    gpumem_config_init(&cfg);
    cfg.backend = backend;
    own(&cfg);
  }

  /** \brief As context(const char *). \throws gpumem::error with any status of gpumem_create(). */
  explicit context(const std::string &backend) : context(backend.c_str()) {}

  /**
   * \brief Create a context from a full configuration (start from gpumem_config_init()).
   * \throws gpumem::error with any status of gpumem_create().
   */
  explicit context(const gpumem_config &cfg) { own(&cfg); }

  /**
   * \brief Take ownership of a context made with gpumem_create().
   * \throws std::bad_alloc when no host memory is left for the shared ownership record; `raw`
   *         then stays the caller's.
   */
  static context adopt(gpumem_context *raw) { return context(raw, adopt_tag{}); }

  /** \brief Move: `other` is left empty. */
  context(context &&other) noexcept : st_(std::move(other.st_)) {}

  /** \brief Move assignment: destroys the context held so far (as the destructor does), then takes `other`'s. */
  context &operator=(context &&other) noexcept {
    if (this != &other) {
      close_noexcept();
      st_ = std::move(other.st_);
    }
    return *this;
  }

  context(const context &) = delete;            ///< not copyable
  context &operator=(const context &) = delete; ///< not copyable

  /**
   * \brief Destroys the context; forces (::GPUMEM_DESTROY_FORCE) when allocations are still live.
   *
   * While buffers or scopes made from it are alive, the C context is destroyed (the same way)
   * when the last of them is gone instead.
   */
  ~context() { close_noexcept(); }

  /**
   * \brief Destroy the context now.
   * \param flags 0 or ::GPUMEM_DESTROY_FORCE.
   * \throws gpumem::error with ::GPUMEM_ERR_BUSY when live allocations remain and
   *         FORCE is not given, or (FORCE or not) while buffers or scopes made from
   *         this context are alive (they would free into a destroyed context): the
   *         context then stays owned and usable.
   */
  void destroy(unsigned flags = 0) {
    if (!st_) return;
    if (st_.use_count() > 1)
      throw error(GPUMEM_ERR_BUSY, "gpumem::context::destroy (buffers, scopes or graph pools made from the context are alive)");
    check(gpumem_destroy(st_->ctx, flags), "gpumem_destroy");
    st_->ctx = nullptr;
    st_.reset();
  }

  /** \brief The raw C handle (still owned by this object); nullptr when empty. */
  gpumem_context *get() const noexcept { return st_ ? st_->ctx : nullptr; }

  /**
   * \brief Give up ownership: returns the raw handle, which the caller must gpumem_destroy().
   *
   * Buffers and scopes made from this context that are still alive then follow the C rule:
   * destroy the context only after them.
   */
  gpumem_context *release() noexcept {
    if (!st_) return nullptr;
    gpumem_context *raw = st_->ctx;
    st_->owned = false;
    st_.reset();
    return raw;
  }

  /** \brief True when the object owns a context. */
  explicit operator bool() const noexcept { return st_ != nullptr; }

  /** \brief The backend's name ("cuda", "hip", "sim", ...); "" when empty. */
  const char *backend_name() const noexcept { return gpumem_backend_name(raw_()); }

  /** \brief Number of visible devices. \throws gpumem::error. */
  int device_count() const {
    int n = 0;
    check(gpumem_device_count(raw_(), &n), "gpumem_device_count");
    return n;
  }

  /**
   * \brief Information about a visible device (name, UUID, PCI bus id, total and free bytes).
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_DEVICE, ::GPUMEM_ERR_BACKEND, ...).
   */
  gpumem_device_info device_info(int device) const {
    gpumem_device_info info{};
    info.struct_size = sizeof info;
    check(gpumem_device_get_info(raw_(), device, &info), "gpumem_device_get_info");
    return info;
  }

  /**
   * \brief Allocate an owned buffer, ready for work on `stream`.
   * \param bytes  size; 0 gives an empty buffer.
   * \param device visible device ordinal.
   * \param stream cudaStream_t / hipStream_t, nullptr = default stream.
   * \throws gpumem::error (::GPUMEM_ERR_OUT_OF_MEMORY, ::GPUMEM_ERR_LIMIT_EXCEEDED, ::GPUMEM_ERR_INVALID_DEVICE, ...).
   */
  buffer alloc(std::size_t bytes, int device = 0, gpumem_stream stream = nullptr) {
    gpumem_buffer b{};
    check(gpumem_buffer_alloc(raw_(), device, bytes, stream, &b), "gpumem_buffer_alloc");
    if (!b.ptr) return buffer(std::move(b));
    return buffer(std::move(b), st_);
  }

  /**
   * \brief Allocate an owned buffer with a tag shown in leak reports.
   * \param bytes  size; 0 gives an empty buffer.
   * \param tag    must stay valid while the buffer is live (a string literal is typical).
   * \param device visible device ordinal.
   * \param stream the stream, nullptr = default stream.
   * \throws gpumem::error as alloc().
   */
  buffer alloc_tagged(std::size_t bytes, const char *tag, int device = 0, gpumem_stream stream = nullptr) {
    void *p = nullptr;
    check(gpumem_alloc_tagged(raw_(), device, bytes, stream, tag, &p), "gpumem_alloc_tagged");
    if (!p) return buffer();
    gpumem_buffer b{raw_(), p, bytes, device, stream};
    return buffer(std::move(b), st_);
  }

  /**
   * \brief Begin a scope on one device and stream.
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_DEVICE, ...).
   */
  gpumem::scope scope(int device = 0, gpumem_stream stream = nullptr) {
    gpumem_scope *s = nullptr;
    check(gpumem_scope_begin(raw_(), device, stream, &s), "gpumem_scope_begin");
    return gpumem::scope(s, st_);
  }

  /**
   * \brief Give cached memory back, keeping at most `keep_bytes` cached per device.
   * \param device     a device or ::GPUMEM_ALL_DEVICES.
   * \param keep_bytes cached bytes each device may keep.
   * \return the bytes given back.
   * \throws gpumem::error.
   */
  std::uint64_t trim(int device = GPUMEM_ALL_DEVICES, std::uint64_t keep_bytes = 0) {
    std::uint64_t released = 0;
    check(gpumem_trim(raw_(), device, keep_bytes, &released), "gpumem_trim");
    return released;
  }

  /**
   * \brief Give back the pools made for graph captures nobody routed, once those graphs are
   *        destroyed (gpumem_capture_pools_release()).
   * \param device a device or ::GPUMEM_ALL_DEVICES.
   * \throws gpumem::error.
   */
  void release_capture_pools(int device = GPUMEM_ALL_DEVICES) {
    check(gpumem_capture_pools_release(raw_(), device), "gpumem_capture_pools_release");
  }

  /**
   * \brief Tell the library that a graph capture nobody routed has ended (gpumem_capture_ended()):
   *        `stream` is asked about (it must be alive); with `stream` NULL, every such capture on
   *        `device` is forgotten without asking.
   * \param device the stream's device; with a NULL stream, a device or ::GPUMEM_ALL_DEVICES.
   * \param stream the stream whose capture ended, or NULL.
   * \throws gpumem::error.
   */
  void capture_ended(int device, gpumem_stream stream) {
    check(gpumem_capture_ended(raw_(), device, stream), "gpumem_capture_ended");
  }

  /**
   * \brief Invalidate every live allocation on a device and give all its memory back.
   *
   * Buffers and scopes still holding invalidated pointers free nothing when
   * they are destroyed (their free fails with ::GPUMEM_ERR_INVALID_POINTER, ignored).
   * \param device a device or ::GPUMEM_ALL_DEVICES.
   * \param flags  0 or ::GPUMEM_RESET_DEVICE (dangerous: resets the device for the whole process).
   * \throws gpumem::error (::GPUMEM_ERR_NOT_SUPPORTED, ...).
   */
  void reset(int device, unsigned flags = 0) { check(gpumem_reset(raw_(), device, flags), "gpumem_reset"); }

  /**
   * \brief Statistics of one device, or the sum over all with ::GPUMEM_ALL_DEVICES.
   * \throws gpumem::error.
   */
  gpumem_stats stats(int device = GPUMEM_ALL_DEVICES) const {
    gpumem_stats st{};
    st.struct_size = sizeof st;
    check(gpumem_get_stats(raw_(), device, &st), "gpumem_get_stats");
    return st;
  }

  /** \brief Reset the peak statistics of a device (or all) to the current values. \throws gpumem::error. */
  void reset_peak_stats(int device = GPUMEM_ALL_DEVICES) {
    check(gpumem_reset_peak_stats(raw_(), device), "gpumem_reset_peak_stats");
  }

  /**
   * \brief The statistics as text (gpumem_stats_format()): ::GPUMEM_STATS_JSON or ::GPUMEM_STATS_PROMETHEUS.
   * \param format the format.
   * \param device a device or ::GPUMEM_ALL_DEVICES.
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_ARGUMENT for an unknown format, ::GPUMEM_ERR_INVALID_DEVICE);
   *         std::bad_alloc.
   */
  std::string stats_text(gpumem_stats_format_kind format = GPUMEM_STATS_JSON, int device = GPUMEM_ALL_DEVICES) const {
    std::size_t need = 0;
    check(gpumem_stats_format(raw_(), device, format, nullptr, 0, &need), "gpumem_stats_format");
    for (;;) { // the numbers may grow between the size query and the text: retry with the new size
      std::string text(need + 256, '\0');
      gpumem_status st = gpumem_stats_format(raw_(), device, format, &text[0], text.size(), &need);
      if (st == GPUMEM_OK) {
        text.resize(need > 0 ? need - 1 : 0);
        return text;
      }
      if (need <= text.size()) check(st, "gpumem_stats_format");
    }
  }

  /**
   * \brief Cap the bytes reserved on `device` (gpumem_set_limit(); 0 removes the cap), its graph pools included.
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_DEVICE, ...).
   */
  void set_limit(int device, std::uint64_t limit_bytes) { check(gpumem_set_limit(raw_(), device, limit_bytes), "gpumem_set_limit"); }

  /** \brief The cap on bytes reserved on `device` (0: none). \throws gpumem::error. */
  std::uint64_t get_limit(int device = 0) const {
    std::uint64_t v = 0;
    check(gpumem_get_limit(raw_(), device, &v), "gpumem_get_limit");
    return v;
  }

  /** \brief The largest block one allocation on `device` gets from the cache without growing. \throws gpumem::error. */
  std::uint64_t largest_free_block(int device = 0) const {
    std::uint64_t v = 0;
    check(gpumem_largest_free_block(raw_(), device, &v), "gpumem_largest_free_block");
    return v;
  }

  /**
   * \brief Note that `stream` uses the block at `ptr` (gpumem_record_stream(), PyTorch's
   *        `Tensor.record_stream`): its free waits for that stream's work too.
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_POINTER, ...).
   */
  void record_stream(void *ptr, gpumem_stream stream) { check(gpumem_record_stream(raw_(), ptr, stream), "gpumem_record_stream"); }

  /**
   * \brief A private pool for graph captures on `device` (gpumem_graph_pool_create()).
   * \throws gpumem::error (::GPUMEM_ERR_INVALID_DEVICE, ::GPUMEM_ERR_OUT_OF_MEMORY).
   */
  gpumem::graph_pool graph_pool(int device = 0) {
    gpumem_graph_pool *p = nullptr;
    check(gpumem_graph_pool_create(raw_(), device, &p), "gpumem_graph_pool_create");
    return gpumem::graph_pool(p, st_);
  }

  /** \brief Allocate raw memory (gpumem_alloc()); free it with free(). \throws gpumem::error. */
  void *alloc_raw(std::size_t bytes, int device = 0, gpumem_stream stream = nullptr) {
    void *p = nullptr;
    check(gpumem_alloc(raw_(), device, bytes, stream, &p), "gpumem_alloc");
    return p;
  }

  /** \brief Free raw memory from alloc_raw() in order on `stream`. \throws gpumem::error (::GPUMEM_ERR_INVALID_POINTER, ...). */
  void free(void *ptr, gpumem_stream stream = nullptr) { check(gpumem_free(raw_(), ptr, stream), "gpumem_free"); }

private:
  struct adopt_tag {};
  context(gpumem_context *raw, adopt_tag) : st_(raw != nullptr ? std::make_shared<detail::context_state>(raw) : nullptr) {}

  /* Create the C context and own it (a failure to allocate the record destroys it again). */
  void own(const gpumem_config *cfg) {
    gpumem_context *raw = nullptr;
    check(gpumem_create(cfg, &raw), "gpumem_create");
    try {
      st_ = std::make_shared<detail::context_state>(raw);
    } catch (...) {
      (void)gpumem_destroy(raw, GPUMEM_DESTROY_FORCE);
      throw;
    }
  }

  gpumem_context *raw_() const noexcept { return st_ ? st_->ctx : nullptr; }

  /* Drop this object's share: the C context is destroyed now, or by the last buffer or scope. */
  void close_noexcept() noexcept { st_.reset(); }

  std::shared_ptr<detail::context_state> st_;
};

} // namespace gpumem

#endif /* GPUMEM_HPP */
