// Ratios measured in one run: a shared machine drifts, so every figure is reported against a
// physical reference (memcpy of the same bytes, the raw codec) timed alternately with it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include <benchmark/benchmark.h>

namespace mmt::bench {

inline double seconds_of(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median over `rounds` of time(reference) / time(subject), the two timed back to back in
// each round so that both see the same machine state. A ratio of 1.0 means "as fast as the
// reference"; higher is faster.
// `untimed`, when given, runs before every timed call of either (removing the files the
// previous call wrote, say).
inline double median_speed_ratio(const std::function<void()>& subject,
                                 const std::function<void()>& reference, int rounds = 31,
                                 const std::function<void()>& untimed = {}) {
  auto prepare = [&] {
    if (untimed) untimed();
  };
  prepare();
  subject();
  prepare();
  reference();  // warm caches and page tables for both
  std::vector<double> ratios;
  for (int i = 0; i < rounds; ++i) {
    prepare();
    double s = seconds_of(subject);
    prepare();
    double r = seconds_of(reference);
    ratios.push_back(r / s);
  }
  std::nth_element(ratios.begin(), ratios.begin() + rounds / 2, ratios.end());
  return ratios[rounds / 2];
}

// A memcpy of `bytes` between two buffers that stay allocated and faulted in.
class MemcpyReference {
 public:
  explicit MemcpyReference(size_t bytes) : src_(bytes, 1), dst_(bytes, 0) {}
  void operator()() {
    std::memcpy(dst_.data(), src_.data(), src_.size());
    benchmark::DoNotOptimize(dst_.data());
    benchmark::ClobberMemory();
  }

 private:
  std::vector<char> src_;
  std::vector<char> dst_;
};

}  // namespace mmt::bench
