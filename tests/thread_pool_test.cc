// ThreadPool::parallel_for, which get_batch splits a batch with: every index runs exactly once
// whichever path the loop takes (the published slot that spinning workers watch, or the queue
// when several callers loop at once), on at most `parallelism` threads, and the first
// exception reaches the caller after every claimed index has finished.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "thread_pool.h"

namespace mmt {
namespace {

using detail::ThreadPool;

TEST(ThreadPoolParallelFor, RunsEveryIndexOnceForManySizes) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 8, 64, 1000}) {
    for (int parallelism : {1, 2, 4, 8}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      pool.parallel_for(n, parallelism, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "n " << n << " index " << i;
    }
  }
}

TEST(ThreadPoolParallelFor, UsesAtMostParallelismThreads) {
  ThreadPool pool(4);
  for (int round = 0; round < 20; ++round) {
    std::mutex mutex;
    std::set<std::thread::id> threads;
    pool.parallel_for(64, 2, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      std::lock_guard lock(mutex);
      threads.insert(std::this_thread::get_id());
    });
    EXPECT_LE(threads.size(), 2u) << "round " << round;
  }
}

TEST(ThreadPoolParallelFor, ConcurrentCallersEachGetTheirOwnLoopDone) {
  ThreadPool pool(2);
  constexpr int kCallers = 4, kRounds = 200, kN = 33;
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::atomic<int>> runs(kN);
        pool.parallel_for(kN, 3, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
        for (auto& r : runs)
          if (r.load() != 1) wrong.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadPoolParallelFor, NestedLoopsFinish) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, 3, [&](int64_t) { pool.parallel_for(16, 3, [&](int64_t j) { total.fetch_add(j); }); });
  EXPECT_EQ(total.load(), 8 * (15 * 16 / 2));
}

TEST(ThreadPoolParallelFor, RethrowsTheFirstErrorAfterClaimedIndicesFinish) {
  ThreadPool pool(2);
  for (int round = 0; round < 100; ++round) {
    std::atomic<int> running{0};
    try {
      pool.parallel_for(32, 3, [&](int64_t i) {
        running.fetch_add(1);
        if (i == 5) {
          running.fetch_sub(1);
          throw std::runtime_error("index 5 failed");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(5));
        running.fetch_sub(1);
      });
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "index 5 failed");
    }
    // Nothing of the loop still runs once parallel_for has returned.
    EXPECT_EQ(running.load(), 0) << "round " << round;
  }
}

TEST(ThreadPoolParallelFor, WorkersThatSleptAreWokenForALoop) {
  ThreadPool pool(1);
  // Longer than the workers' spin: they are asleep on the condition variable now.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::mutex mutex;
  std::set<std::thread::id> threads;
  for (int round = 0; round < 20 && threads.size() < 2; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pool.parallel_for(16, 2, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard lock(mutex);
      threads.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(threads.size(), 2u) << "the sleeping worker never joined a loop";
}

// A loop wanting one helper is taken at once by worker 0 only; when that worker is busy (here,
// with queued tasks that wait for the loop to end) another takes the seat after a short delay.
TEST(ThreadPoolParallelFor, ABusyDesignatedWorkerLeavesItsSeatToAnother) {
  ThreadPool pool(4);
  for (int round = 0; round < 10; ++round) {
    // Three of the four workers busy, whichever they are: the free one may be worker 0 (the
    // designated path) or not (the late one).
    std::atomic<bool> release{false};
    std::atomic<int> started{0};
    std::vector<std::future<void>> busy;
    for (int b = 0; b < 3; ++b)
      busy.push_back(pool.submit([&] {
        started.fetch_add(1);
        while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }));
    while (started.load() < 3) std::this_thread::yield();
    // Every other round the free worker has fallen asleep first: the loop must wake it as a
    // stand-in when worker 0 is the busy one.
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::mutex mutex;
    std::set<std::thread::id> threads;
    pool.parallel_for(40, 2, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard lock(mutex);
      threads.insert(std::this_thread::get_id());
    });
    release = true;
    for (auto& f : busy) f.get();
    EXPECT_EQ(threads.size(), 2u) << "round " << round << ": no free worker helped the loop";
  }
}

// The first loop of a new pool, published before its worker has started running, is still
// helped: the worker once took the generation it saw at start as visited already.
TEST(ThreadPoolParallelFor, AWorkerThatStartsLateHelpsTheFirstLoop) {
  for (int round = 0; round < 20; ++round) {
    ThreadPool pool(1);
    std::atomic<bool> second_ran{false};
    bool helped = false;
    pool.parallel_for(2, 2, [&](int64_t i) {
      if (i == 1) {
        second_ran = true;
        return;
      }
      // Index 0 (the caller's) waits, up to 5 s, for a helper to run index 1.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!second_ran && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      helped = second_ran;
    });
    ASSERT_TRUE(helped) << "round " << round << ": the new pool's worker did not help its first loop";
  }
}

}  // namespace
}  // namespace mmt
