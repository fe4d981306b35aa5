// torch_shim.cpp: libgpumem as PyTorch's CUDA allocator.
//
// Implements c10::cuda::CUDACachingAllocator::CUDAAllocator on the C API of
// gpumem.h, so that PyTorch's promises hold with libgpumem underneath: out of
// memory raises torch.OutOfMemoryError, Tensor.record_stream holds, CUDA graph
// capture allocates from graph-private pools, empty_cache trims, the memory
// fraction is a limit, and the memory statistics report libgpumem's figures.
// Built against the installed PyTorch by gpumem/torch.py (at pip install, or
// on first enable() through torch.utils.cpp_extension).
//
// Every allocation is made on the current device and the current stream and
// freed on the stream it was allocated on, as PyTorch's own allocator does; a
// table from pointer to (stream, device, size, pool) remembers that stream.
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gpumem.h"

/* The build passes the source hash as an identifier (h<hex>): a string would lose its quotes on
 * the way through ninja's command line. */
#ifndef GPUMEM_TORCH_SHIM_HASH
#define GPUMEM_TORCH_SHIM_HASH hunknown
#endif

namespace gpumem_torch {

using c10::DeviceIndex;
using c10::MempoolId_t;
namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;

// The most devices a process can have; PyTorch's DeviceIndex is an int8_t.
constexpr int kMaxDevices = 128;

std::string format_size(uint64_t size) {
  char buf[64];
  if (size <= 1024) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes", size);
  } else if (size <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(size) / 1024.0);
  } else if (size <= 1073741824ull) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(size) / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(size) / 1073741824.0);
  }
  return buf;
}

std::string status_text(gpumem_status st) {
  return std::string(gpumem_status_name(st)) + " (" + gpumem_strerror(st) + ")";
}

// One live block: what its free needs (the stream it was allocated on) and
// what the statistics and pool checks read.
struct Meta {
  cudaStream_t stream;
  size_t size;
  gpumem_graph_pool* pool; // NULL outside graph pools
  int device;
};

// Pointer -> Meta, in shards so that threads allocating at once rarely meet.
class BlockTable {
 public:
  void insert(void* p, const Meta& m) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> g(s.mu);
    s.map.emplace(p, m);
  }
  // Removes and returns the entry; false when p is not a live block of the shim.
  bool take(void* p, Meta* out) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.map.find(p);
    if (it == s.map.end()) return false;
    *out = it->second;
    s.map.erase(it);
    return true;
  }
  bool find(const void* p, Meta* out) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.map.find(const_cast<void*>(p));
    if (it == s.map.end()) return false;
    *out = it->second;
    return true;
  }
  std::vector<std::pair<void*, Meta>> list_pool(gpumem_graph_pool* pool) {
    std::vector<std::pair<void*, Meta>> r;
    for (Shard& s : shards_) {
      std::lock_guard<std::mutex> g(s.mu);
      for (const auto& kv : s.map)
        if (kv.second.pool == pool) r.emplace_back(kv.first, kv.second);
    }
    std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return r;
  }
  std::unordered_set<void*> in_pool(gpumem_graph_pool* pool) {
    std::unordered_set<void*> r;
    for (Shard& s : shards_) {
      std::lock_guard<std::mutex> g(s.mu);
      for (const auto& kv : s.map)
        if (kv.second.pool == pool) r.insert(kv.first);
    }
    return r;
  }

 private:
  static constexpr size_t kShards = 64;
  struct Shard {
    std::mutex mu;
    std::unordered_map<void*, Meta> map;
  };
  Shard& shard(const void* p) {
    uint64_t h = (reinterpret_cast<uintptr_t>(p) >> 8) * 0x9E3779B97F4A7C15ull;
    return shards_[h >> 58];
  }
  std::array<Shard, kShards> shards_;
};

// Counters the shim keeps itself because libgpumem has no peak for them.
struct DeviceCounters {
  std::atomic<int64_t> live{0}, live_peak{0};
  std::atomic<int64_t> requested{0}, requested_peak{0};
  std::atomic<int64_t> allocs{0}, frees{0};
  std::atomic<int64_t> requested_total{0}, requested_freed{0};
  std::atomic<int64_t> segments_peak{0};
};

void raise_peak(std::atomic<int64_t>& peak, int64_t v) {
  int64_t cur = peak.load(std::memory_order_relaxed);
  while (v > cur && !peak.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// Accumulated figures at the last resetAccumulatedStats(): reported values are relative to them.
struct Baseline {
  int64_t allocs = 0, frees = 0, requested_total = 0, requested_freed = 0;
  int64_t backend_allocs = 0, backend_frees = 0, retries = 0, ooms = 0;
};

// A PyTorch memory pool id on one device, mapped to a libgpumem graph pool.
struct PoolRec {
  gpumem_graph_pool* pool;
  int use_count;
};

struct Active {
  MempoolId_t id;
  gpumem_graph_pool* pool;
  std::function<bool(cudaStream_t)> filter;
};

void deleter(void* ptr);

// getCheckpointState's result: the live blocks of one graph pool, by address.
struct Checkpoint final : CCA::AllocatorState {
  DeviceIndex device = -1;
  gpumem_graph_pool* pool = nullptr;
  std::vector<std::pair<void*, Meta>> blocks;
};

class GpumemAllocator final : public CCA::CUDAAllocator {
 public:
  explicit GpumemAllocator(gpumem_context* ctx) : ctx_(ctx) {}

  // ------------------------------------------------------------ allocation

  c10::DataPtr allocate(size_t size) override {
    DeviceIndex device = current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* p = size != 0 ? malloc_on(size, device, stream) : nullptr;
    return {p, p, &deleter, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }

  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    DeviceIndex device = current_device();
    return malloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    return malloc_on(nbytes, current_device(), stream);
  }

  void raw_delete(void* ptr) override {
    if (ptr == nullptr) return;
    gpumem_status st = free_ptr(ptr);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: raw_delete(", ptr, ") failed: ",
                st == GPUMEM_ERR_INVALID_POINTER
                    ? std::string("the pointer was not allocated by the gpumem allocator or was already freed")
                    : status_text(st));
  }

  // Frees a block on the stream it was allocated on. Never throws (deleters run in destructors).
  gpumem_status free_ptr(void* ptr) noexcept {
    Meta m;
    if (!table_.take(ptr, &m)) return GPUMEM_ERR_INVALID_POINTER;
    gpumem_status st = gpumem_free(ctx_, ptr, m.stream);
    if (st != GPUMEM_OK) return st;
    DeviceCounters& c = counters_[m.device];
    c.live.fetch_sub(1, std::memory_order_relaxed);
    c.requested.fetch_sub(static_cast<int64_t>(m.size), std::memory_order_relaxed);
    c.frees.fetch_add(1, std::memory_order_relaxed);
    c.requested_freed.fetch_add(static_cast<int64_t>(m.size), std::memory_order_relaxed);
    return GPUMEM_OK;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ------------------------------------------------------------ lifecycle

  void init(int device_count) override {
    device_count_ = device_count;
    initialized_.store(true);
  }
  bool initialized() override { return initialized_.load(); }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }
  std::string name() override { return "gpumem"; }

  // ------------------------------------------------------------ streams

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // As PyTorch's allocator: a null storage and memory of another allocator (e.g. IPC) are skipped.
    if (!ptr.get() || ptr.get_deleter() != &deleter) return;
    gpumem_status st = gpumem_record_stream(ctx_, ptr.get(), stream.stream());
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: record_stream(", ptr.get(), ", stream ", stream.id(),
                ") failed: ", status_text(st));
  }

  // ------------------------------------------------------------ cache, limit

  void emptyCache(MempoolId_t mempool_id) override {
    // A graph pool is never trimmed: its memory returns when the pool is released.
    if (mempool_id.first != 0 || mempool_id.second != 0) return;
    gpumem_status st = gpumem_trim(ctx_, GPUMEM_ALL_DEVICES, 0, nullptr);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: empty_cache failed: ", status_text(st));
  }

  void cacheInfo(DeviceIndex device, size_t* largestBlock) override {
    check_device(device);
    // As PyTorch's allocator: a zero initial guess starts from the device's free memory.
    if (*largestBlock == 0) *largestBlock = device_info(device).free_bytes;
    uint64_t largest = 0;
    gpumem_status st = gpumem_largest_free_block(ctx_, device, &largest);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: cacheInfo failed: ", status_text(st));
    *largestBlock = std::max<size_t>(*largestBlock, static_cast<size_t>(largest));
  }

  void setMemoryFraction(double fraction, DeviceIndex device) override {
    check_device(device);
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "invalid fraction: ", fraction, ". Please set within [0, 1].");
    uint64_t total = device_info(device).total_bytes;
    uint64_t limit = static_cast<uint64_t>(fraction * static_cast<double>(total));
    // libgpumem's 0 means "no limit"; PyTorch's fraction 0 means "nothing more can be reserved".
    if (limit == 0) limit = 1;
    if (fraction >= 1.0) limit = 0;
    gpumem_status st = gpumem_set_limit(ctx_, device, limit);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: set_per_process_memory_fraction(", fraction, ") failed: ", status_text(st));
    std::lock_guard<std::mutex> g(pools_mu_);
    fractions_[device] = {fraction, limit};
  }

  double getMemoryFraction(DeviceIndex device) override {
    check_device(device);
    uint64_t limit = 0;
    gpumem_status st = gpumem_get_limit(ctx_, device, &limit);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: get_per_process_memory_fraction failed: ", status_text(st));
    {
      std::lock_guard<std::mutex> g(pools_mu_);
      auto it = fractions_.find(device);
      if (it != fractions_.end() && it->second.second == limit) return it->second.first;
    }
    if (limit == 0) return 1.0;
    return static_cast<double>(limit) / static_cast<double>(device_info(device).total_bytes);
  }

  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex device) override {
    check_device(device);
    return {}; // libgpumem does not expose its segments per stream
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    // libgpumem exposes blocks, not the segments under them: the block is its own base.
    Meta m;
    TORCH_CHECK(table_.find(ptr, &m), "gpumem: getBaseAllocation(", ptr,
                "): not the start of a live block of the gpumem allocator");
    if (size != nullptr) *size = m.size;
    return ptr;
  }

  // ------------------------------------------------------------ statistics

  DeviceStats getDeviceStats(DeviceIndex device) override {
    check_device(device);
    gpumem_stats s{};
    s.struct_size = sizeof s;
    gpumem_status st = gpumem_get_stats(ctx_, device, &s);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: memory_stats(", static_cast<int>(device), ") failed: ", status_text(st));
    DeviceCounters& c = counters_[device];
    Baseline b;
    {
      std::lock_guard<std::mutex> g(pools_mu_);
      b = baseline_[device];
    }
    raise_peak(c.segments_peak, static_cast<int64_t>(s.num_segments));
    auto i64 = [](uint64_t v) { return static_cast<int64_t>(v); };
    const size_t all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    DeviceStats r;
    auto& alloc = r.allocation[all];
    alloc.current = c.live.load(std::memory_order_relaxed);
    alloc.peak = std::max(alloc.current, c.live_peak.load(std::memory_order_relaxed));
    alloc.allocated = c.allocs.load(std::memory_order_relaxed) - b.allocs;
    alloc.freed = c.frees.load(std::memory_order_relaxed) - b.frees;
    // A freed block waiting for its streams is not visible through the C API: active = allocated.
    r.active[all] = alloc;
    auto& seg = r.segment[all];
    seg.current = i64(s.num_segments);
    seg.peak = std::max(seg.current, c.segments_peak.load(std::memory_order_relaxed));
    seg.allocated = i64(s.num_backend_allocs) - b.backend_allocs;
    seg.freed = i64(s.num_backend_frees) - b.backend_frees;
    auto& ab = r.allocated_bytes[all];
    ab.current = i64(s.allocated_bytes);
    ab.peak = i64(s.allocated_peak);
    r.active_bytes[all] = ab;
    auto& rb = r.reserved_bytes[all];
    rb.current = i64(s.reserved_bytes);
    rb.peak = i64(s.reserved_peak);
    auto& rq = r.requested_bytes[all];
    rq.current = c.requested.load(std::memory_order_relaxed);
    rq.peak = std::max(rq.current, c.requested_peak.load(std::memory_order_relaxed));
    rq.allocated = c.requested_total.load(std::memory_order_relaxed) - b.requested_total;
    rq.freed = c.requested_freed.load(std::memory_order_relaxed) - b.requested_freed;
    r.num_alloc_retries = i64(s.num_oom_retries) - b.retries;
    r.num_ooms = i64(s.num_ooms + s.num_limit_exceeded) - b.ooms;
    r.num_device_alloc = i64(s.num_backend_allocs) - b.backend_allocs;
    r.num_device_free = i64(s.num_backend_frees) - b.backend_frees;
    r.max_split_size = -1; // libgpumem has no split-size limit (PyTorch's "unlimited")
    return r;
  }

  void resetAccumulatedStats(DeviceIndex device) override {
    check_device(device);
    gpumem_stats s{};
    s.struct_size = sizeof s;
    gpumem_status st = gpumem_get_stats(ctx_, device, &s);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: reset_accumulated_memory_stats failed: ", status_text(st));
    DeviceCounters& c = counters_[device];
    Baseline b;
    b.allocs = c.allocs.load();
    b.frees = c.frees.load();
    b.requested_total = c.requested_total.load();
    b.requested_freed = c.requested_freed.load();
    b.backend_allocs = static_cast<int64_t>(s.num_backend_allocs);
    b.backend_frees = static_cast<int64_t>(s.num_backend_frees);
    b.retries = static_cast<int64_t>(s.num_oom_retries);
    b.ooms = static_cast<int64_t>(s.num_ooms + s.num_limit_exceeded);
    std::lock_guard<std::mutex> g(pools_mu_);
    baseline_[device] = b;
  }

  void resetPeakStats(DeviceIndex device) override {
    check_device(device);
    gpumem_status st = gpumem_reset_peak_stats(ctx_, device);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: reset_peak_memory_stats failed: ", status_text(st));
    DeviceCounters& c = counters_[device];
    c.live_peak.store(c.live.load());
    c.requested_peak.store(c.requested.load());
    gpumem_stats s{};
    s.struct_size = sizeof s;
    if (gpumem_get_stats(ctx_, device, &s) == GPUMEM_OK)
      c.segments_peak.store(static_cast<int64_t>(s.num_segments));
  }

  CCA::SnapshotInfo snapshot(MempoolId_t /*mempool_id*/, bool include_traces) override {
    // libgpumem does not list its segments: an empty but well-formed snapshot.
    CCA::SnapshotInfo info;
    if (include_traces) info.device_traces.resize(static_cast<size_t>(std::max(device_count_, 0)));
    info.config_metadata.garbage_collection_threshold = 0.0;
    info.config_metadata.max_split_size = SIZE_MAX;
    info.config_metadata.pinned_num_register_threads = 0;
    info.config_metadata.expandable_segments = false;
    info.config_metadata.release_lock_on_malloc = false;
    info.config_metadata.pinned_use_host_register = false;
    info.config_metadata.graph_capture_record_stream_reuse = false;
    info.config_metadata.last_allocator_settings = "gpumem";
    return info;
  }

  // ------------------------------------------------------------ graph and memory pools

  void createOrIncrefPool(DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    check_device(device);
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "gpumem: a MemPool with an allocator of its own is not supported while gpumem is PyTorch's allocator");
    std::lock_guard<std::mutex> g(pools_mu_);
    incref_locked(device, mempool_id);
  }

  int getPoolUseCount(DeviceIndex device, MempoolId_t mempool_id) override {
    std::lock_guard<std::mutex> g(pools_mu_);
    auto it = pools_.find({device, mempool_id});
    TORCH_CHECK(it != pools_.end(), "gpumem: no memory pool (", mempool_id.first, ", ", mempool_id.second,
                ") on device ", static_cast<int>(device));
    return it->second.use_count;
  }

  void beginAllocateToPool(DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    check_device(device);
    std::lock_guard<std::mutex> g(pools_mu_);
    std::vector<Active>& act = active_[device];
    for (const Active& a : act)
      TORCH_CHECK(a.id != mempool_id, "beginAllocateToPool: already recording to mempool_id");
    PoolRec& rec = incref_locked(device, mempool_id);
    act.push_back({mempool_id, rec.pool, std::move(filter)});
    n_active_[device].fetch_add(1, std::memory_order_release);
  }

  void endAllocateToPool(DeviceIndex device, MempoolId_t mempool_id) override {
    check_device(device);
    {
      std::lock_guard<std::mutex> g(pools_mu_);
      std::vector<Active>& act = active_[device];
      auto it = act.begin();
      while (it != act.end() && it->id != mempool_id) ++it;
      TORCH_CHECK(it != act.end(), "endAllocatePool: not currently recording to mempool_id");
      act.erase(it);
      n_active_[device].fetch_sub(1, std::memory_order_release);
    }
    // CUDAGraph::capture_end calls this right after cudaStreamEndCapture, with the capture
    // stream current. Frees made during the capture (of blocks allocated before it) made the
    // library find the capture; it forgets it now, asking about that live stream, instead of at
    // the stream's next allocation or free (the next capture, for torch.cuda.graph's side stream).
    cudaStream_t s = c10::cuda::getCurrentCUDAStream(device).stream();
    if (s != nullptr) (void)gpumem_capture_ended(ctx_, static_cast<int>(device), s);
  }

  void releasePool(DeviceIndex device, MempoolId_t mempool_id) override {
    std::lock_guard<std::mutex> g(pools_mu_);
    auto it = pools_.find({device, mempool_id});
    TORCH_CHECK(it != pools_.end(), "gpumem: releasePool: no memory pool (", mempool_id.first, ", ",
                mempool_id.second, ") on device ", static_cast<int>(device));
    if (--it->second.use_count > 0) return;
    // The last user is gone: cached memory returns now, each live block when it is freed.
    gpumem_status st = gpumem_graph_pool_release(it->second.pool);
    pools_.erase(it);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: releasing graph pool failed: ", status_text(st));
  }

  bool checkPoolLiveAllocations(DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override {
    gpumem_graph_pool* pool = nullptr;
    {
      std::lock_guard<std::mutex> g(pools_mu_);
      auto it = pools_.find({device, mempool_id});
      TORCH_CHECK(it != pools_.end(), "gpumem: checkPoolLiveAllocations: no memory pool on device ",
                  static_cast<int>(device));
      pool = it->second.pool;
    }
    return table_.in_pool(pool) == expected_live_allocations;
  }

  void setUseOnOOM(DeviceIndex /*device*/, MempoolId_t /*mempool_id*/, bool use_on_oom) override {
    TORCH_CHECK_NOT_IMPLEMENTED(!use_on_oom, "gpumem: MemPool(use_on_oom=True) is not supported");
  }

  void setNoSplit(DeviceIndex /*device*/, MempoolId_t /*mempool_id*/) override {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "gpumem: MemPool(no_split=True) is not supported");
  }

  // A checkpoint of a graph pool is the list of its live blocks (CUDA graph trees take one after
  // each recording); restoring it makes exactly those blocks live again, at their addresses.
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(DeviceIndex device, MempoolId_t id) override {
    check_device(device);
    gpumem_graph_pool* pool = pool_of(device, id, "getCheckpointState");
    auto state = std::make_shared<Checkpoint>();
    state->device = device;
    state->pool = pool;
    state->blocks = table_.list_pool(pool);
    return state;
  }

  CCA::CheckpointDelta setCheckpointPoolState(DeviceIndex device, std::shared_ptr<CCA::AllocatorState> pps) override {
    check_device(device);
    auto* state = dynamic_cast<Checkpoint*>(pps.get());
    TORCH_CHECK(state != nullptr && state->device == device,
                "gpumem: setCheckpointPoolState: not a checkpoint of the gpumem allocator on device ",
                static_cast<int>(device));
    gpumem_graph_pool* pool = state->pool;
    {
      std::lock_guard<std::mutex> g(pools_mu_);
      bool known = false;
      for (const auto& kv : pools_) known = known || kv.second.pool == pool;
      TORCH_CHECK(known, "gpumem: setCheckpointPoolState: the checkpoint's memory pool was released");
    }
    std::unordered_map<void*, Meta> want;
    for (const auto& b : state->blocks) want.emplace(b.first, b.second);
    CCA::CheckpointDelta delta;
    // Every live block of the pool counts as freed (PyTorch's contract); those the checkpoint
    // also holds, with the same size, stay live in libgpumem and come back as allocated.
    for (const auto& cur : table_.list_pool(pool)) {
      delta.ptrs_freed.push_back(cur.first);
      auto it = want.find(cur.first);
      if (it != want.end() && it->second.size == cur.second.size) continue;
      gpumem_status st = free_ptr(cur.first);
      TORCH_CHECK(st == GPUMEM_OK, "gpumem: setCheckpointPoolState: freeing ", cur.first, " failed: ",
                  status_text(st));
    }
    std::unordered_set<void*> live;
    for (const auto& cur : table_.list_pool(pool)) live.insert(cur.first);
    for (const auto& b : state->blocks) {
      void* p = b.first;
      const Meta& m = b.second;
      if (!live.count(p)) {
        gpumem_status st = gpumem_graph_pool_alloc_at(pool, p, m.size);
        TORCH_CHECK(st == GPUMEM_OK, "gpumem: setCheckpointPoolState: restoring the block at ", p, " (",
                    m.size, " bytes) failed: ", status_text(st));
        table_.insert(p, m);
        count_alloc(m.device, m.size);
      }
      delta.dataptrs_allocd.emplace_back(p, p, &deleter, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // ------------------------------------------------------------ IPC, history, peers

  CCA::ShareableHandle shareIpcHandle(void* /*ptr*/) override {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "gpumem: sharing CUDA tensors between processes (IPC handles) is not "
                                "supported while gpumem is PyTorch's allocator");
  }

  std::shared_ptr<void> getIpcDevPtr(std::string /*handle*/) override {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "gpumem: opening CUDA IPC handles is not supported while gpumem is "
                                "PyTorch's allocator");
  }

  bool isHistoryEnabled() override { return false; }

  void recordHistory(bool enabled, CCA::CreateContextFn /*context_recorder*/, size_t /*alloc_trace_max_entries*/,
                     CCA::RecordContext /*when*/, bool /*clearHistory*/,
                     const std::vector<std::string>& /*skip_actions*/) override {
    TORCH_CHECK_NOT_IMPLEMENTED(!enabled,
                                "gpumem: torch.cuda.memory._record_memory_history is not supported; "
                                "record a libgpumem trace instead (GPUMEM_TRACE=path)");
  }

  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(pools_mu_);
    oom_observers_.push_back(std::move(observer));
  }

  // Trace trackers receive segment events; libgpumem emits none, so they are kept and never called.
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> g(pools_mu_);
    trace_trackers_.push_back(std::move(tracker));
  }

  void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    // Virtual-memory segments are mapped on their own device only: across devices without
    // peer access the copy goes through cudaMemcpyPeerAsync, as PyTorch does for its own.
    if (p2p_enabled || dstDevice == srcDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  gpumem_context* context() const { return ctx_; }

 private:
  DeviceIndex current_device() {
    DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return device;
  }

  void check_device(DeviceIndex device) {
    int n = device_count_ > 0 ? device_count_ : static_cast<int>(c10::cuda::device_count());
    TORCH_CHECK(device >= 0 && device < n && device < kMaxDevices, "gpumem: invalid device ",
                static_cast<int>(device), " (", n, " visible)");
  }

  gpumem_device_info device_info(DeviceIndex device) {
    gpumem_device_info info{};
    info.struct_size = sizeof info;
    gpumem_status st = gpumem_device_get_info(ctx_, device, &info);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: device_get_info(", static_cast<int>(device), ") failed: ",
                status_text(st));
    return info;
  }

  PoolRec& incref_locked(DeviceIndex device, MempoolId_t id) {
    auto it = pools_.find({device, id});
    if (it != pools_.end()) {
      it->second.use_count++;
      return it->second;
    }
    gpumem_graph_pool* pool = nullptr;
    gpumem_status st = gpumem_graph_pool_create(ctx_, device, &pool);
    TORCH_CHECK(st == GPUMEM_OK, "gpumem: creating a graph pool on device ", static_cast<int>(device),
                " failed: ", status_text(st));
    return pools_.emplace(std::make_pair(device, id), PoolRec{pool, 1}).first->second;
  }

  // The graph pool the first matching filter of the device routes `stream` to, or NULL.
  gpumem_graph_pool* routed_pool(DeviceIndex device, cudaStream_t stream) {
    if (n_active_[device].load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard<std::mutex> g(pools_mu_);
    for (const Active& a : active_[device])
      if (a.filter(stream)) return a.pool;
    return nullptr;
  }

  void* malloc_on(size_t size, DeviceIndex device, cudaStream_t stream) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "gpumem: invalid device ", static_cast<int>(device));
    gpumem_graph_pool* pool = routed_pool(device, stream);
    void* p = nullptr;
    gpumem_status st = pool != nullptr ? gpumem_graph_pool_alloc(pool, size, stream, &p)
                                       : gpumem_alloc(ctx_, device, size, stream, &p);
    if (st != GPUMEM_OK) fail(st, size, device);
    TORCH_CHECK(p != nullptr, "gpumem: allocation of ", size, " bytes returned no memory");
    try {
      table_.insert(p, Meta{stream, size, pool, device});
    } catch (...) {
      (void)gpumem_free(ctx_, p, stream);
      throw;
    }
    count_alloc(device, size);
    return p;
  }

  void count_alloc(int device, size_t size) {
    DeviceCounters& c = counters_[device];
    raise_peak(c.live_peak, c.live.fetch_add(1, std::memory_order_relaxed) + 1);
    int64_t sz = static_cast<int64_t>(size);
    raise_peak(c.requested_peak, c.requested.fetch_add(sz, std::memory_order_relaxed) + sz);
    c.allocs.fetch_add(1, std::memory_order_relaxed);
    c.requested_total.fetch_add(sz, std::memory_order_relaxed);
  }

  gpumem_graph_pool* pool_of(DeviceIndex device, MempoolId_t id, const char* what) {
    std::lock_guard<std::mutex> g(pools_mu_);
    auto it = pools_.find({device, id});
    TORCH_CHECK(it != pools_.end(), "gpumem: ", what, ": no memory pool (", id.first, ", ", id.second,
                ") on device ", static_cast<int>(device));
    return it->second.pool;
  }

  [[noreturn]] void fail(gpumem_status st, size_t size, DeviceIndex device) {
    int dev = static_cast<int>(device);
    if (st != GPUMEM_ERR_OUT_OF_MEMORY && st != GPUMEM_ERR_LIMIT_EXCEEDED) {
      int code = 0;
      const char* msg = nullptr;
      std::string backend;
      if (st == GPUMEM_ERR_BACKEND && gpumem_last_backend_error(ctx_, &code, &msg) == GPUMEM_OK)
        backend = " (CUDA error " + std::to_string(code) + ": " + (msg ? msg : "") + ")";
      TORCH_CHECK(false, "gpumem: allocating ", size, " bytes on device ", dev, " failed: ", status_text(st),
                  backend);
    }
    gpumem_stats s{};
    s.struct_size = sizeof s;
    (void)gpumem_get_stats(ctx_, device, &s);
    gpumem_device_info info{};
    info.struct_size = sizeof info;
    (void)gpumem_device_get_info(ctx_, device, &info);
    uint64_t largest = 0;
    (void)gpumem_largest_free_block(ctx_, device, &largest);
    uint64_t limit = 0;
    (void)gpumem_get_limit(ctx_, device, &limit);
    std::vector<CCA::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> g(pools_mu_);
      observers = oom_observers_;
    }
    for (const auto& obs : observers) obs(device, s.allocated_bytes, info.total_bytes, info.free_bytes);
    std::string why;
    if (st == GPUMEM_ERR_LIMIT_EXCEEDED) {
      why = " This process's memory limit on GPU " + std::to_string(dev) + " is " + format_size(limit) + " (" +
            std::to_string(limit) +
            " bytes; set by torch.cuda.set_per_process_memory_fraction or GPUMEM_LIMIT_BYTES / "
            "GPUMEM_LIMIT_FRACTION) and the request would pass it.";
    } else {
      why = " libgpumem gave its cached memory back and retried before failing.";
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", format_size(size), " (",
                     size, " bytes) on GPU ", dev, ". GPU ", dev, " has a total capacity of ",
                     format_size(info.total_bytes), " of which ", format_size(info.free_bytes), " (",
                     info.free_bytes, " bytes) is free. gpumem has ", format_size(s.reserved_bytes), " (",
                     s.reserved_bytes, " bytes) reserved on this GPU: ", format_size(s.allocated_bytes), " (",
                     s.allocated_bytes, " bytes) allocated and ", format_size(s.cached_bytes), " (",
                     s.cached_bytes, " bytes) cached (reserved but unallocated); the largest free cached block is ",
                     format_size(largest), " (", largest, " bytes).", why, " [", gpumem_status_name(st), "]");
  }

  gpumem_context* ctx_;
  std::atomic<bool> initialized_{false};
  bool enabled_ = true;
  int device_count_ = 0;
  BlockTable table_;
  std::array<DeviceCounters, kMaxDevices> counters_;
  std::array<std::atomic<int>, kMaxDevices> n_active_{};
  std::mutex pools_mu_; // pools_, active_, fractions_, baseline_, observers
  std::map<std::pair<int, MempoolId_t>, PoolRec> pools_;
  std::array<std::vector<Active>, kMaxDevices> active_;
  std::map<int, std::pair<double, uint64_t>> fractions_;
  std::array<Baseline, kMaxDevices> baseline_;
  std::vector<CCA::OutOfMemoryObserver> oom_observers_;
  std::vector<CCA::AllocatorTraceTracker> trace_trackers_;
};

// The installed allocator; never destroyed, since PyTorch holds its pointer and
// tensors may be freed during interpreter shutdown.
GpumemAllocator* g_allocator = nullptr;
std::mutex g_install_mu;

void deleter(void* ptr) {
  if (ptr == nullptr || g_allocator == nullptr) return;
  gpumem_status st = g_allocator->free_ptr(ptr);
  if (st != GPUMEM_OK) TORCH_WARN("gpumem: freeing ", ptr, " failed: ", status_text(st));
}

// Makes the shim PyTorch's CUDA allocator. Idempotent. PyTorch refuses once its
// own allocator was initialised ("Can't swap an already initialized allocator").
void install() {
  std::lock_guard<std::mutex> g(g_install_mu);
  if (g_allocator != nullptr) return;
  gpumem_context* ctx = nullptr;
  gpumem_status st = gpumem_global_context(&ctx);
  TORCH_CHECK(st == GPUMEM_OK, "gpumem: the process-wide context could not be created: ", status_text(st));
  std::string backend = gpumem_backend_name(ctx);
  TORCH_CHECK(backend == "cuda", "gpumem: PyTorch needs libgpumem's CUDA backend, but the process-wide context uses '",
              backend, "' (check GPUMEM_BACKEND and that libgpumem was built with CUDA)");
  auto* a = new GpumemAllocator(ctx);
  // PyTorch keeps the shared_ptr; the no-op deleter keeps the allocator alive past it (see g_allocator).
  std::shared_ptr<CCA::CUDAAllocator> sp(a, [](CCA::CUDAAllocator*) {});
  try {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(sp);
  } catch (...) {
    delete a;
    throw;
  }
  g_allocator = a;
}

bool installed() { return g_allocator != nullptr && CCA::get() == g_allocator; }

uintptr_t context_handle() {
  TORCH_CHECK(g_allocator != nullptr, "gpumem: the allocator is not installed");
  return reinterpret_cast<uintptr_t>(g_allocator->context());
}

} // namespace gpumem_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "libgpumem as PyTorch's CUDA allocator (used by gpumem.torch)";
  m.def("install", &gpumem_torch::install, "Make libgpumem PyTorch's CUDA allocator");
  m.def("installed", &gpumem_torch::installed, "True while the shim is PyTorch's CUDA allocator");
  m.def("allocator_name", [] { return c10::cuda::CUDACachingAllocator::name(); },
        "name() of PyTorch's current CUDA allocator");
  m.def("context_handle", &gpumem_torch::context_handle, "The gpumem_context* the shim allocates from, as an int");
#define GPUMEM_TORCH_STR_(x) #x
#define GPUMEM_TORCH_STR(x) GPUMEM_TORCH_STR_(x)
  m.attr("SHIM_HASH") = std::string(GPUMEM_TORCH_STR(GPUMEM_TORCH_SHIM_HASH)).substr(1);
  m.attr("TORCH_VERSION") = TORCH_VERSION;
}
