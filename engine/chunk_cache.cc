#include "chunk_cache.h"

#include <pthread.h>

#include <unordered_set>

#include "mmtensor/error.h"

namespace mmt::detail {
namespace {

// Every live cache, for the fork handlers. Never destroyed: a cache may be destroyed after
// static destruction began (a Dataset kept in a static object).
struct LiveCaches {
  std::mutex mutex;
  std::unordered_set<ChunkCache*> caches;
};

LiveCaches& live_caches() {
  static LiveCaches* const live = new LiveCaches;
  return *live;
}

}  // namespace

// Registered when the library is loaded, not on first use: a fork racing a first use could
// otherwise leave the registration's guard taken in the child.
const bool ChunkCache::fork_handlers_registered_ =
    pthread_atfork(&lock_all_before_fork, &unlock_all_in_parent, &unlock_all_in_child) == 0;

ChunkCache::ChunkCache(int64_t budget_bytes) : budget_bytes_(budget_bytes) {
  MMT_CHECK(budget_bytes >= 0, ValueError, "chunk cache budget must be >= 0 bytes, got ", budget_bytes);
  LiveCaches& live = live_caches();
  std::lock_guard lock(live.mutex);
  live.caches.insert(this);
}

ChunkCache::~ChunkCache() {
  LiveCaches& live = live_caches();
  std::lock_guard lock(live.mutex);
  live.caches.erase(this);
}

// The registry's lock first, then each cache's: no thread takes them in the other order (a
// cache's methods never touch the registry), so this cannot deadlock.
void ChunkCache::lock_all_before_fork() noexcept {
  LiveCaches& live = live_caches();
  live.mutex.lock();
  for (ChunkCache* cache : live.caches) cache->mutex_.lock();
}

void ChunkCache::unlock_all_in_parent() noexcept {
  LiveCaches& live = live_caches();
  for (ChunkCache* cache : live.caches) cache->mutex_.unlock();
  live.mutex.unlock();
}

void ChunkCache::unlock_all_in_child() noexcept {
  // The child has one thread, the one that forked; no thread of it waits on these futures
  // (their promises are on the stacks of threads that stayed behind). A later request for
  // such a chunk decodes it here.
  LiveCaches& live = live_caches();
  for (ChunkCache* cache : live.caches) {
    cache->in_flight_.clear();
    cache->mutex_.unlock();
  }
  live.mutex.unlock();
}

std::optional<UntypedStorage> ChunkCache::find(int64_t key) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru_position);
  hits_.fetch_add(1, std::memory_order_relaxed);
  return it->second.storage;
}

bool ChunkCache::holds(int64_t key) const {
  std::lock_guard lock(mutex_);
  return entries_.contains(key) || in_flight_.contains(key);
}

UntypedStorage ChunkCache::get_or_decode(int64_t key, const std::function<UntypedStorage()>& decode) {
  // Made on a miss only: a promise allocates its shared state, and hits are the hot path
  // (a batch over a cached file looks up every chunk it touches).
  std::optional<std::promise<UntypedStorage>> promise;
  {
    std::unique_lock lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru_position);
      hits_.fetch_add(1, std::memory_order_relaxed);
      return it->second.storage;
    }
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      std::shared_future<UntypedStorage> pending = it->second;
      hits_.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      return pending.get();  // rethrows the decoder's exception
    }
    promise.emplace();
    in_flight_.emplace(key, promise->get_future().share());
    ++misses_;
  }
  UntypedStorage decoded;
  try {
    decoded = decode();
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      in_flight_.erase(key);
    }
    promise->set_exception(std::current_exception());
    throw;
  }
  {
    std::lock_guard lock(mutex_);
    in_flight_.erase(key);
    if (decoded.nbytes() <= budget_bytes_) {
      evict_until_fits(decoded.nbytes());
      lru_.push_front(key);
      entries_.emplace(key, Entry{decoded, lru_.begin()});
      bytes_cached_ += decoded.nbytes();
    }
  }
  promise->set_value(decoded);
  return decoded;
}

void ChunkCache::evict_until_fits(int64_t incoming_bytes) {
  while (!lru_.empty() && bytes_cached_ > budget_bytes_ - incoming_bytes) {
    auto it = entries_.find(lru_.back());
    bytes_cached_ -= it->second.storage.nbytes();
    entries_.erase(it);
    lru_.pop_back();
    ++evictions_;
  }
}

CacheStats ChunkCache::stats() const {
  std::lock_guard lock(mutex_);
  CacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_;
  s.evictions = evictions_;
  s.bytes_cached = bytes_cached_;
  s.budget_bytes = budget_bytes_;
  return s;
}

void ChunkCache::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
  lru_.clear();
  bytes_cached_ = 0;
}

}  // namespace mmt::detail
