#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "chunk_cache.h"
#include "mmtensor/error.h"

namespace mmt {
namespace {

using detail::ChunkCache;

std::function<UntypedStorage()> decoder(int64_t nbytes, std::atomic<int>* calls, uint8_t fill = 0) {
  return [=] {
    ++*calls;
    UntypedStorage s = UntypedStorage::allocate(nbytes);
    s.fill_(fill);
    return s;
  };
}

TEST(ChunkCacheTest, HitsMissesAndLruEvictionWithinTheBudget) {
  ChunkCache cache(300);
  std::atomic<int> calls{0};
  UntypedStorage a = cache.get_or_decode(1, decoder(100, &calls));
  EXPECT_TRUE(cache.get_or_decode(1, decoder(100, &calls)).is_same(a));
  cache.get_or_decode(2, decoder(100, &calls));
  cache.get_or_decode(3, decoder(100, &calls));
  cache.get_or_decode(1, decoder(100, &calls));  // 1 is now most recent; 2 is the oldest
  cache.get_or_decode(4, decoder(100, &calls));  // evicts 2
  EXPECT_EQ(calls.load(), 4);
  cache.get_or_decode(3, decoder(100, &calls));
  cache.get_or_decode(1, decoder(100, &calls));
  EXPECT_EQ(calls.load(), 4);
  cache.get_or_decode(2, decoder(100, &calls));
  EXPECT_EQ(calls.load(), 5);
  CacheStats stats = cache.stats();
  EXPECT_EQ(stats.misses, 5);
  EXPECT_EQ(stats.hits, 4);
  EXPECT_EQ(stats.evictions, 2);
  EXPECT_EQ(stats.bytes_cached, 300);
  EXPECT_EQ(stats.budget_bytes, 300);
}

// find() serves hits like get_or_decode() (counted, moved to the front of the LRU order) and
// leaves misses to the caller: nothing decoded, nothing counted.
TEST(ChunkCacheTest, FindServesHitsAndNeverDecodes) {
  ChunkCache cache(200);
  std::atomic<int> calls{0};
  EXPECT_FALSE(cache.find(1).has_value());
  EXPECT_EQ(cache.stats().misses, 0);
  UntypedStorage a = cache.get_or_decode(1, decoder(100, &calls));
  cache.get_or_decode(2, decoder(100, &calls));
  std::optional<UntypedStorage> found = cache.find(1);  // 1 is now most recent; 2 the oldest
  ASSERT_TRUE(found.has_value());
  EXPECT_TRUE(found->is_same(a));
  cache.get_or_decode(3, decoder(100, &calls));  // evicts 2, not 1
  EXPECT_TRUE(cache.find(1).has_value());
  EXPECT_FALSE(cache.find(2).has_value());
  EXPECT_EQ(calls.load(), 3);
  const CacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.misses, 3);
  EXPECT_EQ(stats.evictions, 1);
}

TEST(ChunkCacheTest, ChunksLargerThanTheBudgetAreReturnedButNotKept) {
  ChunkCache cache(50);
  std::atomic<int> calls{0};
  UntypedStorage big = cache.get_or_decode(7, decoder(100, &calls, 9));
  EXPECT_EQ(big.nbytes(), 100);
  EXPECT_EQ(cache.stats().bytes_cached, 0);
  cache.get_or_decode(7, decoder(100, &calls, 9));
  EXPECT_EQ(calls.load(), 2);
  ChunkCache none(0);
  none.get_or_decode(1, decoder(1, &calls));
  EXPECT_EQ(none.stats().bytes_cached, 0);
}

TEST(ChunkCacheTest, EvictedEntriesStayAliveWhileHeld) {
  ChunkCache cache(100);
  std::atomic<int> calls{0};
  UntypedStorage held = cache.get_or_decode(1, decoder(100, &calls, 42));
  cache.get_or_decode(2, decoder(100, &calls));  // evicts 1
  cache.clear();
  EXPECT_EQ(held.use_count(), 1);
  EXPECT_EQ(static_cast<uint8_t>(held.data()[99]), 42);
}

TEST(ChunkCacheTest, DecoderErrorsReachEveryWaiterAndAreNotCached) {
  ChunkCache cache(1000);
  std::atomic<int> calls{0};
  auto failing = [&]() -> UntypedStorage {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    throw FormatError("chunk 3: corrupt");
  };
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      try {
        cache.get_or_decode(3, failing);
      } catch (const FormatError&) {
        ++errors;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 4);
  EXPECT_LE(calls.load(), 4);
  std::atomic<int> ok_calls{0};
  cache.get_or_decode(3, decoder(10, &ok_calls));
  EXPECT_EQ(ok_calls.load(), 1);
}

TEST(ChunkCacheTest, AChunkWantedByManyThreadsIsDecodedOnce) {
  ChunkCache cache(1 << 20);
  std::atomic<int> calls{0};
  std::atomic<bool> go{false};
  auto slow = [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return UntypedStorage::allocate(64);
  };
  std::vector<UntypedStorage> results(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      results[t] = cache.get_or_decode(5, slow);
    });
  go = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(calls.load(), 1);
  for (const auto& r : results) EXPECT_TRUE(r.is_same(results[0]));
  EXPECT_EQ(cache.stats().misses, 1);
  EXPECT_EQ(cache.stats().hits, 7);
}

}  // namespace
}  // namespace mmt
