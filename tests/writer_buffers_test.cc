// The writer's machinery for reusing memory and threads: recycled chunk buffers and the
// thread pool's caller-runs step. Packing speed depends on both (bench/pack_bench.cc); these
// tests pin down the behaviour the writer relies on.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "buffer_recycler.h"
#include "file_io.h"
#include "mmtensor/error.h"
#include "thread_pool.h"

namespace mmt {
namespace {

using detail::BufferRecycler;
using detail::RecycledBuffer;

TEST(BufferRecyclerTest, ReusesAGivenBufferThatFits) {
  BufferRecycler recycler(4);
  RecycledBuffer first = recycler.take(1 << 20, "a chunk");
  std::byte* address = first.get();
  EXPECT_EQ(first.capacity_bytes, 1 << 20);
  recycler.give(std::move(first));
  EXPECT_EQ(recycler.idle(), 1u);
  RecycledBuffer again = recycler.take((1 << 20) - 100, "a chunk");  // smaller still fits
  EXPECT_EQ(again.get(), address);
  EXPECT_EQ(again.capacity_bytes, 1 << 20);
  EXPECT_EQ(recycler.idle(), 0u);
}

TEST(BufferRecyclerTest, NeverLendsATooSmallOrFarTooLargeBuffer) {
  BufferRecycler recycler(4);
  recycler.give(recycler.take(4096, "small"));
  recycler.give(recycler.take(1 << 20, "large"));
  RecycledBuffer bigger = recycler.take(8192, "bigger than the small one");
  EXPECT_EQ(bigger.capacity_bytes, 8192);  // the 1 MiB block is over twice the request: new
  EXPECT_EQ(recycler.idle(), 2u);
  RecycledBuffer best = recycler.take(3000, "fits the small one");
  EXPECT_EQ(best.capacity_bytes, 4096);
}

TEST(BufferRecyclerTest, KeepsAtMostMaxIdleBuffers) {
  BufferRecycler recycler(2);
  std::vector<RecycledBuffer> lent;
  for (int i = 0; i < 5; ++i) lent.push_back(recycler.take(1024, "a chunk"));
  for (auto& buffer : lent) recycler.give(std::move(buffer));
  EXPECT_EQ(recycler.idle(), 2u);
  recycler.set_max_idle(3);
  recycler.give(recycler.take(4096, "one more"));
  EXPECT_EQ(recycler.idle(), 3u);
  recycler.give(RecycledBuffer{});  // an empty buffer is ignored
  EXPECT_EQ(recycler.idle(), 3u);
}

TEST(BufferRecyclerTest, NewBuffersGoThroughTheAllocationSeam) {
  BufferRecycler recycler(2);
  io::ScopedFault fault({io::Step::Allocate, /*nth=*/1, /*forever=*/true, ENOMEM});
  try {
    recycler.take(1024, "a chunk buffer");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("a chunk buffer"), std::string::npos) << e.what();
  }
}

TEST(BufferRecyclerTest, ManyThreadsTakeAndGive) {
  BufferRecycler recycler(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        RecycledBuffer buffer = recycler.take(4096 + (i % 3) * 1024, "a chunk");
        buffer.get()[0] = std::byte{1};
        recycler.give(std::move(buffer));
      }
    });
  for (auto& thread : threads) thread.join();
  EXPECT_LE(recycler.idle(), 4u);
}

TEST(ThreadPoolTest, RunOneQueuedRunsTheOldestTaskOnTheCaller) {
  detail::ThreadPool pool(1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> started{false};
  auto blocker = pool.submit([&] {
    started = true;
    released.wait();
  });
  while (!started) std::this_thread::yield();  // the only worker is now busy
  std::thread::id ran_on;
  auto queued = pool.submit([&] { ran_on = std::this_thread::get_id(); return 7; });
  EXPECT_TRUE(pool.run_one_queued());
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(queued.get(), 7);
  EXPECT_FALSE(pool.run_one_queued());  // nothing left in the queue
  release.set_value();
  blocker.get();
}

}  // namespace
}  // namespace mmt
