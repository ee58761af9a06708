#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>

namespace mmt::detail {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long an idle worker polls for work before it sleeps: long enough to bridge the gap
// between two batches of a training loop, short enough not to burn a shared core.
constexpr auto kSpinTime = std::chrono::microseconds(50);

}  // namespace

ThreadPool::ThreadPool(int threads) {
  threads = std::max(threads, 1);
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

int ThreadPool::hardware_threads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& ThreadPool::shared() {
  // parallel_for's caller is one of the threads, so one worker per other core: a worker more
  // would spin beside the caller on a core that has none to spare.
  static ThreadPool pool(std::max(1, hardware_threads() - 1));
  return pool;
}

void ThreadPool::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_one();
}

void ThreadPool::worker_loop() {
  while (true) {
    auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    // The queue is polled after every pause (a batch of a few microseconds should not wait
    // for a long pause loop); the clock only every 64 polls.
    for (int polls = 1; queued_.load(std::memory_order_acquire) == 0; ++polls) {
      cpu_relax();
      if (polls % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
    }
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    task();  // packaged_task and parallel_for helpers capture their own exceptions
  }
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
  int helpers = static_cast<int>(std::min<int64_t>({int64_t{parallelism} - 1, n - 1, size()}));
  if (helpers <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Shared with helpers that may start after the caller has returned: they then find no
  // index left and never touch `fn`, which lives on the caller's stack.
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    int64_t n = 0;
    const std::function<void(int64_t)>* fn = nullptr;
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  state->n = n;
  state->fn = &fn;
  auto drain = [](State& s) {
    while (true) {
      int64_t i = s.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= s.n) return;
      try {
        if (!s.failed.load(std::memory_order_relaxed)) (*s.fn)(i);
      } catch (...) {
        std::lock_guard lock(s.error_mutex);
        if (!s.error) s.error = std::current_exception();
        s.failed.store(true, std::memory_order_relaxed);
      }
      s.done.fetch_add(1, std::memory_order_acq_rel);
    }
  };
  for (int h = 0; h < helpers; ++h) enqueue([state, drain] { drain(*state); });
  drain(*state);
  while (state->done.load(std::memory_order_acquire) < n) cpu_relax();
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace mmt::detail
