// What an epoch's order costs per sample, beside the gather it feeds.
//   BM_EpochOrder/kind/records: EpochOrder::operator[] over every position of one epoch (the
//     loader asks it for each row of each batch). Random at Fashion-MNIST's 60,000 records,
//     ImageNet's 1,281,167 and 100 million; QuasiRandom (1024-record chunks, the default
//     16-chunk window) at the same sizes. ns_per_position is the figure to set beside a
//     gather's time per sample (a 784-byte record costs ~50 ns warm).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "mmtensor/sampler.h"

namespace {

void BM_EpochOrder(benchmark::State& state) {
  const auto kind = static_cast<mmt::SamplerKind>(state.range(0));
  const int64_t records = state.range(1);
  std::vector<int64_t> chunks;
  if (kind == mmt::SamplerKind::QuasiRandom) {
    for (int64_t left = records; left > 0; left -= 1024) chunks.push_back(left < 1024 ? left : 1024);
  }
  const mmt::Sampler sampler =
      mmt::Sampler::create(records, {.kind = kind, .seed = 20240607}, std::move(chunks));
  const mmt::EpochOrder order = sampler.epoch(3);
  // 4 million positions a pass at most, spread over the whole epoch.
  const int64_t positions = records < 4'000'000 ? records : 4'000'000;
  const int64_t step = records / positions;
  int64_t sum = 0;
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t p = 0; p < positions; ++p) sum += order[p * step];
    benchmark::DoNotOptimize(sum);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  state.counters["ns_per_position"] = seconds * 1e9 / static_cast<double>(state.iterations() * positions);
  state.SetLabel(std::string(mmt::to_string(kind)));
}

BENCHMARK(BM_EpochOrder)
    ->ArgNames({"kind", "records"})
    ->ArgsProduct({{static_cast<int64_t>(mmt::SamplerKind::Random), static_cast<int64_t>(mmt::SamplerKind::QuasiRandom)},
                   {60'000, 1'281'167, 100'000'000}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
