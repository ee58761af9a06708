// A small persistent thread pool: the writer's chunk compression and Dataset::get_batch use
// it, and so may the loader.
//
// Workers spin briefly before sleeping, so back-to-back batches (a training loop) pay no
// wake-up latency, and an idle pool costs nothing after a few microseconds.
//
// parallel_for publishes its loop in one slot that spinning workers watch, rather than
// through the task queue: a 784-byte-record batch is gathered in under 10 us, and the queue's
// allocations, lock and hand-offs cost 1-2 us of it (more than the second core saved). When
// the slot is taken (parallel_for called from several threads at once) the loop goes through
// the queue instead. A loop that wants h helpers is taken at once by workers 0..h-1 only; the
// others look again after kLateJoinDelay (1 us), and join only if a seat is still open (a
// designated worker was busy). So a two-thread batch on a 16-core machine costs one helper's
// visit, not fifteen workers counting themselves in and out of it.
//
// A loop wakes the sleeping workers only when one of its designated workers is not polling
// (asleep, or running a task): then all of them, with one notify, and the first to run takes
// the seat (waking only the designated ones let the help come in 99-106 of 200 loops of
// 64 us after a sleep, against 200: 8 workers on a 2-vCPU VM). A worker that finds no seat
// for it goes back to sleep after a short look, and a loop a worker is not needed for does
// not prolong its spin. So get_batch(threads=2) in a loop keeps one worker polling, not every
// core of the machine (bench/thread_pool_bench.cc measures what the others cost).
//
// Thread safety: every method may be called from many threads at once. A task's exception is
// delivered through its future (submit) or rethrown by parallel_for in the calling thread.
//
// fork(): the child of a process gets a shared() pool of its own on first use. Any other pool
// is the parent's, and the child must neither use nor destroy it (its workers, and the
// waiters its condition variable counts, stayed in the parent): the writer that owns one
// lets it go in a child (fork_safety.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace mmt::detail {

// The pause between two polls of a spin-wait: frees the core's pipeline for its sibling and
// saves power while a flag is awaited.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class ThreadPool {
 public:
  // `threads` workers (at least 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();  // finishes queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // The process-wide pool for parallel_for, with one worker per CPU the process may use but
  // one (the caller works too; available_cpus(), cpu_budget.h); created on first use and never
  // destroyed (a thread still running at exit may be using it).
  static ThreadPool& shared();

  // Runs fn() on a worker; the future carries its result or exception.
  template <typename Fn>
  auto submit(Fn&& fn) -> std::future<std::invoke_result_t<Fn&>> {
    using Result = std::invoke_result_t<Fn&>;
    auto task = std::make_shared<std::packaged_task<Result()>>(std::forward<Fn>(fn));
    std::future<Result> future = task->get_future();
    enqueue([task] { (*task)(); });
    return future;
  }

  // Runs the oldest queued task on the calling thread, if any is queued; returns whether one
  // ran. A thread about to wait for a result calls it to work instead of idling.
  bool run_one_queued();

  // Calls fn(i) for every i in [0, n), on at most `parallelism` threads of which the calling
  // thread is one, and returns when all calls are done. Rethrows the first exception (the
  // remaining indices are skipped). The calling thread takes indices in increasing order from
  // the front, the other threads in decreasing order from the back (get_batch relies on it).
  void parallel_for(int64_t n, int parallelism, const std::function<void(int64_t)>& fn);

 private:
  struct Loop;  // one parallel_for's indices, function and first error

  void enqueue(std::function<void()> task);
  void worker_loop(int index);
  void stop_and_join() noexcept;
  // parallel_for through the published-loop slot; false when another caller holds it.
  bool try_published_loop(int64_t n, int helpers, const std::function<void(int64_t)>& fn);
  void queued_loop(int64_t n, int helpers, const std::function<void(int64_t)>& fn);
  // Whether a loop newer than `last_visited` may want worker `index`: it was designated for
  // it, or a seat is open. A worker about to sleep checks it.
  bool loop_may_want(int index, uint64_t last_visited) const;
  // A worker's visit to the published loop, if there is one it has not visited yet.
  void visit_published_loop(uint64_t& last_visited);

  // What a worker is doing, for a loop's owner deciding whether to wake anyone: kAsleep is
  // stored under mutex_ before the worker checks for work one last time and waits.
  enum Activity : int { kPolling, kRunningTask, kAsleep };
  struct alignas(64) WorkerActivity {  // a line each: a loop's owner reads the designated ones'
    std::atomic<int> value{kPolling};
  };
  // Wakes the sleepers when a just-published loop of `helpers` may lack a designated worker.
  // Costs a load per designated worker when they all poll (back-to-back loops).
  void wake_for_loop(int helpers);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::atomic<int64_t> queued_{0};  // queue_.size(), readable without the lock while spinning
  bool stopping_ = false;
  std::unique_ptr<WorkerActivity[]> activity_;  // one per worker, made before any starts
  int activity_count_ = 0;

  // The published loop: its owner stores `designated_`, `open_seats_` and `published_` and
  // bumps `generation_`; a worker counts itself in `visitors_` before it reads `published_`
  // and out when done, and the owner withdraws the loop (seats 0, then null) and waits for
  // visitors_ == 0 before its Loop goes away. `designated_` and `open_seats_` are hints that
  // keep workers the loop does not need from touching it; the Loop's own helpers_left decides.
  std::atomic<bool> slot_taken_{false};
  alignas(64) std::atomic<uint64_t> generation_{0};
  std::atomic<Loop*> published_{nullptr};
  std::atomic<int> designated_{0};  // workers with a lower index join the loop at once
  // Beside visitors_: a helper writes both, and the owner's wait reads that line anyway.
  alignas(64) std::atomic<int> visitors_{0};
  std::atomic<int> open_seats_{0};  // helpers the loop still wants

  std::vector<std::thread> workers_;
};

}  // namespace mmt::detail
