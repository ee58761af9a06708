// The loader when memory runs out part-way through a restart: every allocation the calling
// thread makes in set_epoch() or in the next() that ends an epoch is made to fail in turn,
// and the loader must stay usable, with no batch lost, repeated or left stuck in the ring.
//
// The failures come from a replacement of the global operator new that throws on the calling
// thread's k-th allocation once armed (unarmed, it is malloc). The sanitizers bring their own
// operator new, which this file must not replace, so there the tests skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <optional>

#include "loader_test_util.h"
#include "mmtensor/loader.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MMT_TEST_ALLOCATION_FAILURES 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MMT_TEST_ALLOCATION_FAILURES 0
#endif
#endif
#ifndef MMT_TEST_ALLOCATION_FAILURES
#define MMT_TEST_ALLOCATION_FAILURES 1
#endif

#if MMT_TEST_ALLOCATION_FAILURES
namespace {
thread_local int64_t allocations_until_failure = 0;  // > 0: armed; the one that reaches 0 throws
}

// GCC sees free() reach memory from operator new once these are inlined: here they are the pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t nbytes) {
  if (allocations_until_failure > 0 && --allocations_until_failure == 0) throw std::bad_alloc();
  if (void* p = std::malloc(nbytes != 0 ? nbytes : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t nbytes) { return ::operator new(nbytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace mmt {
namespace {

using testing::drain_epoch;
using testing::TempDir;
using testing::write_loader_dataset;

// Arms the hook: this thread's k-th allocation from now fails. Disarms when it goes.
struct FailingAllocation {
  explicit FailingAllocation(int64_t k) {
#if MMT_TEST_ALLOCATION_FAILURES
    allocations_until_failure = k;
#endif
  }
  ~FailingAllocation() { disarm(); }
  // True when the armed allocation did not happen: the code ran without reaching it.
  bool disarm() {
#if MMT_TEST_ALLOCATION_FAILURES
    const bool unused = allocations_until_failure > 0;
    allocations_until_failure = 0;
    return unused;
#else
    return true;
#endif
  }
};

LoaderOptions random_order(int workers) {
  LoaderOptions options;
  options.batch_size = 8;
  options.sampler.kind = SamplerKind::Random;
  options.sampler.seed = 7;
  options.num_workers = workers;
  options.prefetch_batches = 2;
  return options;
}

class LoaderOutOfMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!MMT_TEST_ALLOCATION_FAILURES) GTEST_SKIP() << "the sanitizer's operator new cannot be replaced";
  }
  TempDir dir;
};

// set_epoch() failing at any allocation leaves the loader where it was; a retry then gives the
// new epoch's whole order. (A restart used to move to the new epoch before building its order,
// so the retry saw an epoch with nothing delivered, did nothing, and next() reported every
// staging slot held.)
TEST_F(LoaderOutOfMemoryTest, SetEpochThatRunsOutOfMemoryCanBeRetried) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  for (int workers : {0, 2}) {
    const LoaderOptions options = random_order(workers);
    const std::vector<int64_t> epoch_one = Loader(dataset, options).sampler().epoch(1).to_vector();
    bool reached_the_end = false;
    for (int64_t k = 1; !reached_the_end; ++k) {
      SCOPED_TRACE(::testing::Message() << workers << " workers, allocation " << k << " fails");
      ASSERT_LT(k, 10000);
      Loader loader(dataset, options);
      (void)loader.next();  // mid-epoch 0: the restart has slots to free and a queue to clear
      bool failed = false;
      {
        FailingAllocation failing(k);
        try {
          loader.set_epoch(1);
        } catch (const std::bad_alloc&) {
          failed = true;
        }
        reached_the_end = failing.disarm();
      }
      if (failed) loader.set_epoch(1);  // the retry
      EXPECT_EQ(loader.epoch(), 1);
      EXPECT_EQ(drain_epoch(loader), epoch_one);
    }
  }
}

// The next() that hands out an epoch's last batch also starts the next epoch. Failing at any
// allocation there loses no batch and repeats none. If the hand-over failed, the batch is
// still first in line; if its gather failed, next() keeps reporting it and state() resumes
// at that batch; if the restart failed, the batch comes out, the following next() reports
// the failure, and set_epoch() carries on.
TEST_F(LoaderOutOfMemoryTest, EndOfEpochThatRunsOutOfMemoryLosesNoBatch) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  for (int workers : {0, 2}) {
    const LoaderOptions options = random_order(workers);
    Loader reference(dataset, options);
    const std::vector<int64_t> epoch_zero = reference.sampler().epoch(0).to_vector();
    const std::vector<int64_t> epoch_one = reference.sampler().epoch(1).to_vector();
    bool reached_the_end = false;
    for (int64_t k = 1; !reached_the_end; ++k) {
      SCOPED_TRACE(::testing::Message() << workers << " workers, allocation " << k << " fails");
      ASSERT_LT(k, 10000);
      Loader loader(dataset, options);
      std::vector<int64_t> seen;
      const auto take = [&](const std::optional<Batch>& batch) {
        ASSERT_TRUE(batch);
        seen.insert(seen.end(), batch->indices().begin(), batch->indices().end());
      };
      for (int b = 0; b < 4; ++b) take(loader.next());
      bool gather_failed = false;
      {
        FailingAllocation failing(k);
        try {
          std::optional<Batch> last = loader.next();
          reached_the_end = failing.disarm();
          take(last);
        } catch (const std::bad_alloc&) {
          failing.disarm();
          try {
            take(loader.next());  // the hand-over failed: still first in line
          } catch (const std::bad_alloc&) {
            gather_failed = true;
          }
        }
      }
      if (gather_failed) {
        Loader resumed(dataset, options, loader.state());
        const std::vector<int64_t> rest = drain_epoch(resumed);
        seen.insert(seen.end(), rest.begin(), rest.end());
        EXPECT_EQ(seen, epoch_zero);
        continue;
      }
      EXPECT_EQ(seen, epoch_zero);
      EXPECT_EQ(loader.epoch(), 0);
      bool restart_failed = false;
      try {
        EXPECT_FALSE(loader.next());  // the end of epoch 0
      } catch (const std::bad_alloc&) {
        restart_failed = true;
        loader.set_epoch(1);
      }
      EXPECT_EQ(loader.epoch(), 1);
      EXPECT_EQ(drain_epoch(loader), epoch_one) << (restart_failed ? "after set_epoch" : "");
    }
  }
}

}  // namespace
}  // namespace mmt
