// ChunkCache: decoded chunks of one dataset, kept in LRU order within a byte budget.
//
// - A chunk asked for by several threads at once is decoded once: the first asker decodes,
//   the others wait for its result (or its exception).
// - Entries are UntypedStorage handles, so a view into an evicted chunk keeps its bytes alive;
//   eviction only drops the cache's own reference.
// - A chunk larger than the whole budget is decoded and returned but not kept.
//
// Thread safety: every method may be called from many threads at once. A cache is usable in
// the child of a fork() (see fork_safety.h): what its threads were decoding is decoded again.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "mmtensor/dataset.h"
#include "mmtensor/storage.h"

namespace mmt::detail {

// What one reading call (a get_batch, a loader piece packing a ragged field) may hold in
// decoded chunks beyond the cache before it copies them out and lets them go: a quarter of
// the budget, so a few concurrent callers stay within about twice the budget.
inline int64_t decode_hold_limit_bytes(int64_t cache_budget_bytes) { return cache_budget_bytes / 4; }

class ChunkCache {
 public:
  explicit ChunkCache(int64_t budget_bytes);
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // The decoded chunk `key`, from the cache or from decode() (called at most once at a time
  // per key). decode()'s exception reaches every thread waiting for that key; nothing is
  // cached then, so a later call tries again.
  UntypedStorage get_or_decode(int64_t key, const std::function<UntypedStorage()>& decode);

  // The decoded chunk `key` when the cache holds it (a hit, moved to the front of the LRU
  // order); nullopt otherwise, without decoding or waiting for a decode in flight, and
  // without counting a miss: the caller decodes through get_or_decode(), which counts it.
  std::optional<UntypedStorage> find(int64_t key);
  // Whether the cache holds (or is decoding) `key`: no LRU move, no count. For hints, which
  // must not change what stays cached.
  bool holds(int64_t key) const;

  // Counts a hit served outside the cache (a reader's per-thread last-chunk shortcut).
  void note_hit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  CacheStats stats() const;
  void clear();
  int64_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Entry {
    UntypedStorage storage;
    std::list<int64_t>::iterator lru_position;
  };
  void evict_until_fits(int64_t incoming_bytes);  // mutex_ held
  // fork(): every live cache's mutex is taken before it and given back on both sides; the
  // child also forgets the decodes in flight, which only the parent's threads can finish
  // (fork_safety.h). Without that, a child asking for such a chunk would wait forever.
  static void lock_all_before_fork() noexcept;
  static void unlock_all_in_parent() noexcept;
  static void unlock_all_in_child() noexcept;
  static const bool fork_handlers_registered_;

  const int64_t budget_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<int64_t, Entry> entries_;
  std::list<int64_t> lru_;  // most recently used first
  std::unordered_map<int64_t, std::shared_future<UntypedStorage>> in_flight_;
  int64_t bytes_cached_ = 0;
  std::atomic<int64_t> hits_{0};
  int64_t misses_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace mmt::detail
