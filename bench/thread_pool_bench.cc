// What the parallel_for pool costs the rest of the machine, beside the work it does.
//   BM_PoolCpuBesideTwoThreadLoops/workers/gap_us: a pool of `workers` threads (1; 7; 15, the
//     shared pool of a 16-core host) serves loops
//     that want one helper (get_batch(threads=2)'s shape: 16 pieces of ~0.5 us each), with
//     `gap_us` between loops (0: back to back; 20: shorter than the workers' 50 us spin; 200:
//     longer, so workers fall asleep between loops). pool_cpu_us_per_loop is the CPU time
//     the process spent outside the calling thread per loop: the one helper's share of the
//     work plus whatever the other workers burn watching loops they are not needed for.
//     On a machine with fewer cores than workers the figure is capped by the cores, so read
//     it beside cpu_cores_busy (process CPU time over wall time).
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <thread>

#include "thread_pool.h"

namespace {

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// About half a microsecond of arithmetic, not optimized away.
void piece_of_work(int64_t piece, volatile uint64_t* sink) {
  uint64_t x = static_cast<uint64_t>(piece) + 1;
  for (int k = 0; k < 200; ++k) x = x * 6364136223846793005u + 1442695040888963407u;
  *sink = x;
}

void BM_PoolCpuBesideTwoThreadLoops(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const auto gap = std::chrono::microseconds(state.range(1));
  mmt::detail::ThreadPool pool(workers);
  volatile uint64_t sink = 0;
  const std::function<void(int64_t)> work = [&](int64_t piece) { piece_of_work(piece, &sink); };
  // Settled: every worker has started and gone to sleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int64_t loops = 0;
  const double process_before = process_cpu_seconds(), caller_before = thread_cpu_seconds();
  const auto wall_before = std::chrono::steady_clock::now();
  for (auto _ : state) {
    pool.parallel_for(16, 2, work);
    ++loops;
    if (gap.count() > 0) {
      // A busy wait, as a caller waiting on a GPU stream might: sleep_for would round a
      // 20 us gap up to the timer's slack.
      const auto until = std::chrono::steady_clock::now() + gap;
      while (std::chrono::steady_clock::now() < until) {
      }
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
  const double pool_cpu = (process_cpu_seconds() - process_before) - (thread_cpu_seconds() - caller_before);
  state.counters["pool_cpu_us_per_loop"] = pool_cpu * 1e6 / static_cast<double>(loops);
  state.counters["cpu_cores_busy"] = (process_cpu_seconds() - process_before) / wall;
}
BENCHMARK(BM_PoolCpuBesideTwoThreadLoops)
    ->ArgsProduct({{1, 7, 15}, {0, 20, 200}})
    ->ArgNames({"workers", "gap_us"})
    ->MinTime(0.5)
    ->UseRealTime();

}  // namespace
