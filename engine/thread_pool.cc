#include "thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <system_error>

#include "cpu_budget.h"
#include "fork_safety.h"
#include "mmtensor/error.h"

namespace mmt::detail {
namespace {

// How long an idle worker polls for work before it sleeps: long enough to bridge the gap
// between two batches of a training loop, short enough not to burn a shared core.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// How long a worker not designated for a loop waits before it looks for an open seat: time
// for a spinning designated worker to take its seat (a few hundred nanoseconds), short beside
// a batch that a busy designated worker would leave to the caller alone. A seat still open
// then is taken by whoever looks first, as before designation (helpers_left decides).
constexpr auto kLateJoinDelay = std::chrono::microseconds(1);
// How long a worker polls when a loop is what kept it from sleeping (woken for it, or seen
// just before it would sleep): time for its look at the loop, not a full spin. Visiting the
// loop renews the full spin.
constexpr auto kWokenLookTime = 4 * kLateJoinDelay;

}  // namespace

// One parallel_for. The caller claims indices from the front and helpers from the back, so
// with two threads each keeps writing the same half of a batch from one call to the next
// (its output lines stay in its own cache). A thread's first claim takes most of a fair share
// at once (every claim moves the shared word between cores, ~250 ns on a VM); the rest go
// one at a time, so a helper that arrives late leaves the caller only what it has not claimed.
struct ThreadPool::Loop {
  // The unclaimed indices [front, back), front in the low 32 bits: one word, so that a claim
  // from either end is one compare-exchange. parallel_for takes this path for n < 2^32.
  std::atomic<uint64_t> unclaimed{0};
  bool count_done = false;  // the queued path waits on `done`; the published one on visitors_
  alignas(64) std::atomic<int64_t> done{0};  // finished indices (queued path only)
  const std::function<void(int64_t)>* fn = nullptr;  // lives on the caller's stack
  std::atomic<int> helpers_left{0};  // how many more workers may join (parallelism - 1)
  int64_t first_claim = 1;           // indices a thread's first claim takes
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  Loop(int64_t n, int threads)
      : unclaimed(static_cast<uint64_t>(n) << 32), first_claim(std::max<int64_t>(1, n * 3 / (4 * threads))) {}

  // Up to `count` indices from one end as [lo, hi); empty when none is left.
  std::pair<int64_t, int64_t> claim(bool from_back, int64_t count) {
    uint64_t range = unclaimed.load(std::memory_order_relaxed);
    while (true) {
      const uint64_t front = range & 0xffffffffu, back = range >> 32;
      if (front >= back) return {0, 0};
      const uint64_t take = std::min<uint64_t>(static_cast<uint64_t>(count), back - front);
      const uint64_t lo = from_back ? back - take : front;
      const uint64_t rest = from_back ? lo << 32 | front : back << 32 | (front + take);
      if (unclaimed.compare_exchange_weak(range, rest, std::memory_order_relaxed))
        return {static_cast<int64_t>(lo), static_cast<int64_t>(lo + take)};
    }
  }

  // Runs unclaimed indices until none is left. After the first exception the remaining
  // indices are claimed but skipped, so the loop still ends. A thread claiming from the back
  // runs its claim top-down, so that each thread moves one way through the indices from its
  // first claim to its last (get_batch's copies prefetch ahead in that direction).
  void drain(bool from_back) {
    for (int64_t count = first_claim;; count = 1) {
      const auto [lo, hi] = claim(from_back, count);
      if (lo == hi) return;
      for (int64_t k = 0; k < hi - lo; ++k) {
        const int64_t i = from_back ? hi - 1 - k : lo + k;
        try {
          if (!failed.load(std::memory_order_relaxed)) (*fn)(i);
        } catch (...) {
          std::lock_guard lock(error_mutex);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      if (count_done) done.fetch_add(hi - lo, std::memory_order_acq_rel);
    }
  }
};

ThreadPool::ThreadPool(int threads) {
  threads = std::max(threads, 1);
  activity_ = std::make_unique<WorkerActivity[]>(static_cast<size_t>(threads));
  activity_count_ = threads;
  workers_.reserve(static_cast<size_t>(threads));
  try {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::system_error& e) {
    // The system refused another thread (a limit on threads or memory maps): the ones started
    // must be joined, or destroying them terminates the process.
    const size_t started = workers_.size();  // before stop_and_join() clears the list
    stop_and_join();
    throw Error(detail::str("cannot start ", threads, " worker threads (", started, " started): ", e.what()));
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

namespace {

// The shared pool, made on first use and never destroyed: at exit, a thread the process
// does not join (a Python daemon thread inside get_batch, say) may still be running a loop on
// it, and would find it freed; its workers, asleep or spinning, end with the process. In the
// child of a fork it is forgotten (its workers stayed in the parent) and the child makes its
// own on first use.
struct SharedPool {
  std::mutex mutex;  // serializes the making, and is held across fork() so none is half made
  std::atomic<ThreadPool*> pool{nullptr};
};

SharedPool& shared_pool() {
  static SharedPool& holder = *new SharedPool;
  return holder;
}

void lock_shared_pool_before_fork() noexcept { shared_pool().mutex.lock(); }
void unlock_shared_pool_in_parent() noexcept { shared_pool().mutex.unlock(); }
void forget_shared_pool_in_child() noexcept {
  // Not destroyed: its destructor would join workers that are not here.
  abandon_after_fork(shared_pool().pool.exchange(nullptr, std::memory_order_acq_rel));
  shared_pool().mutex.unlock();
}

// Registered when the library is loaded, not when the pool is made: registering then would
// happen under the mutex the handlers take.
[[maybe_unused]] const bool g_shared_pool_fork_handlers =
    pthread_atfork(lock_shared_pool_before_fork, unlock_shared_pool_in_parent, forget_shared_pool_in_child) == 0;

}  // namespace

ThreadPool& ThreadPool::shared() {
  SharedPool& holder = shared_pool();
  if (ThreadPool* pool = holder.pool.load(std::memory_order_acquire)) return *pool;
  std::lock_guard lock(holder.mutex);
  if (ThreadPool* pool = holder.pool.load(std::memory_order_relaxed)) return *pool;
  // parallel_for's caller is one of the threads, so one worker per other CPU: a worker more
  // would spin beside the caller on a CPU that has none to spare.
  auto* pool = new ThreadPool(std::max(1, available_cpus() - 1));
  holder.pool.store(pool, std::memory_order_release);
  return *pool;
}

void ThreadPool::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_one();
}

void ThreadPool::wake_for_loop(int helpers) {
  // Pairs with the worker's store of kAsleep before it checks generation_ (both seq_cst):
  // either it sees the new loop and stays up, or this sees it asleep.
  bool needed = false;
  for (int w = 0; w < helpers && !needed; ++w)
    needed = activity_[w].value.load(std::memory_order_seq_cst) != kPolling;
  if (!needed) return;
  {
    // Under the lock: a worker between its check and its wait gets there first. Each is
    // marked awake here, as it is from now on, though it may not run for a while yet.
    std::lock_guard lock(mutex_);
    for (int w = 0; w < activity_count_; ++w) {
      if (activity_[w].value.load(std::memory_order_relaxed) == kAsleep)
        activity_[w].value.store(kPolling, std::memory_order_relaxed);
    }
  }
  // All of them, with one notify: a designated worker asleep or busy may be slow to come, and
  // whichever sleeper runs first takes the open seat after its kLateJoinDelay look. The others
  // find the seats taken and sleep again after kWokenLookTime.
  wake_.notify_all();
}

void ThreadPool::worker_loop(int index) {
  std::atomic<int>& activity = activity_[index].value;
  // 0, the generation the pool was made with, not the current one: a loop published before
  // this thread got going (the first batch after the pool is made) still gets its help.
  uint64_t last_visited = 0;
  // A loop this worker was not designated for, and when it looks at it again.
  uint64_t deferred = 0;
  auto look_again_at = std::chrono::steady_clock::time_point{};
  // Polling goes on kSpinTime past the last work done (a task, a loop visited).
  auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
  while (true) {
    // The queue and the loop slot are polled after every pause (a batch of a few
    // microseconds should not wait for a long pause loop); the clock only every 64 polls.
    for (int polls = 1; queued_.load(std::memory_order_acquire) == 0; ++polls) {
      const uint64_t generation = generation_.load(std::memory_order_acquire);
      if (generation != last_visited) {
        if (index < designated_.load(std::memory_order_relaxed)) {
          // The spin is renewed even when the visit came too late to help: the next loop wants
          // this worker polling (finding it asleep, that loop would wake every sleeper).
          visit_published_loop(last_visited);
          spin_until = std::chrono::steady_clock::now() + kSpinTime;
          continue;
        }
        const auto now = std::chrono::steady_clock::now();
        if (generation != deferred) {
          deferred = generation;
          look_again_at = now + kLateJoinDelay;
        } else if (now >= look_again_at) {
          // Plain loads: a loop whose seats are taken costs this worker no write, and no
          // longer spin (workers that no loop needs fall asleep).
          if (open_seats_.load(std::memory_order_relaxed) > 0) {
            visit_published_loop(last_visited);
            spin_until = now + kSpinTime;
          } else {
            last_visited = generation;
          }
          continue;
        }
      }
      cpu_relax();
      if (polls % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
    }
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      while (!stopping_ && queue_.empty()) {
        // Marked before generation_ is read: a loop's owner that bumps generation_ either is
        // seen here or sees the mark (wake_for_loop). Marked again after every wake-up, as one
        // whose cause is gone (a task taken by a polling worker) leaves this worker to sleep on.
        activity.store(kAsleep, std::memory_order_seq_cst);
        if (loop_may_want(index, last_visited)) break;
        wake_.wait(lock);
      }
      activity.store(kPolling, std::memory_order_relaxed);
      if (queue_.empty()) {
        if (stopping_) return;  // and nothing left to run
        // A published loop: the worker looks at it; a visit renews its spin, finding the
        // seats taken does not.
        spin_until = std::chrono::steady_clock::now() + kWokenLookTime;
        continue;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
      activity.store(kRunningTask, std::memory_order_relaxed);
    }
    task();  // packaged_task and parallel_for helpers capture their own exceptions
    activity.store(kPolling, std::memory_order_relaxed);
    spin_until = std::chrono::steady_clock::now() + kSpinTime;
  }
}

bool ThreadPool::loop_may_want(int index, uint64_t last_visited) const {
  // A worker neither designated nor needed for an open seat sleeps through loops: their
  // owners wake the sleepers (wake_for_loop) only when a designated worker is not polling.
  return generation_.load(std::memory_order_seq_cst) != last_visited &&
         (index < designated_.load(std::memory_order_relaxed) || open_seats_.load(std::memory_order_relaxed) > 0);
}

void ThreadPool::visit_published_loop(uint64_t& last_visited) {
  last_visited = generation_.load(std::memory_order_acquire);
  // Counted in before reading the slot: the owner withdraws the loop, then waits for this
  // count to reach zero, so a loop read here stays alive until the count is given back.
  visitors_.fetch_add(1, std::memory_order_seq_cst);
  Loop* loop = published_.load(std::memory_order_seq_cst);
  if (loop != nullptr && loop->helpers_left.fetch_sub(1, std::memory_order_relaxed) > 0) {
    open_seats_.fetch_sub(1, std::memory_order_relaxed);
    loop->drain(true);
  }
  visitors_.fetch_sub(1, std::memory_order_release);
}

bool ThreadPool::run_one_queued() {
  std::function<void()> task;
  {
    std::lock_guard lock(mutex_);
    if (queue_.empty()) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_release);
  }
  task();
  return true;
}

void ThreadPool::parallel_for(int64_t n, int parallelism, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int helpers = static_cast<int>(std::min<int64_t>({int64_t{parallelism} - 1, n - 1, size()}));
  if (helpers <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (n > int64_t{0xffffffff}) {  // beyond a Loop's 32-bit ends: one thread, in order
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (!try_published_loop(n, helpers, fn)) queued_loop(n, helpers, fn);
}

bool ThreadPool::try_published_loop(int64_t n, int helpers, const std::function<void(int64_t)>& fn) {
  if (slot_taken_.exchange(true, std::memory_order_acquire)) return false;
  Loop loop(n, helpers + 1);
  loop.fn = &fn;
  loop.helpers_left.store(helpers, std::memory_order_relaxed);
  designated_.store(helpers, std::memory_order_relaxed);
  open_seats_.store(helpers, std::memory_order_relaxed);
  published_.store(&loop, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  wake_for_loop(helpers);
  loop.drain(false);
  open_seats_.store(0, std::memory_order_relaxed);
  published_.store(nullptr, std::memory_order_seq_cst);  // no new visitor reads it
  while (visitors_.load(std::memory_order_seq_cst) != 0) cpu_relax();
  slot_taken_.store(false, std::memory_order_release);
  if (loop.error) std::rethrow_exception(loop.error);
  return true;
}

void ThreadPool::queued_loop(int64_t n, int helpers, const std::function<void(int64_t)>& fn) {
  // Shared with helpers that may start after the caller has returned: they then find no
  // index left and never touch `fn`, which lives on the caller's stack.
  auto loop = std::make_shared<Loop>(n, helpers + 1);
  loop->fn = &fn;
  loop->count_done = true;
  for (int h = 0; h < helpers; ++h) enqueue([loop] { loop->drain(true); });
  loop->drain(false);
  while (loop->done.load(std::memory_order_acquire) < n) cpu_relax();
  if (loop->error) std::rethrow_exception(loop->error);
}

}  // namespace mmt::detail
