// What an epoch's order costs per sample, beside the gather it feeds.
//   BM_EpochOrder/kind/records: the records of an epoch's positions, in batches of 256
//     (EpochOrder::rank_records, as the loader asks for each batch). Random at
//     Fashion-MNIST's 60,000 records, ImageNet's 1,281,167 and 100 million; QuasiRandom
//     (1024-record chunks, the default 16-chunk window) at the same sizes. ns_per_position is the figure to set beside a
//     gather's time per sample (a 784-byte record costs ~50 ns warm).
//   BM_EpochOrderOfASubset/kind/records: the same over a subset of every other record
//     (SamplerOptions::subset, records/2 entries): what mapping a position through the list
//     adds (a load from it, which misses the caches once the list outgrows them).
//   BM_EpochOrderOfAMixture/kind/records: Random or QuasiRandom (chunks of 1024 records) over
//     a mixture (SamplerOptions::mixture) of four
//     equal record ranges weighted 0.4, 0.3, 0.2, 0.1, an epoch of `records` positions: the
//     first two sources are upsampled, the last two subsampled, so most positions take the
//     source lookup and a keyed permutation of the source on top of the epoch's shuffle.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "mmtensor/sampler.h"

namespace {

enum class Selection { Every, Subset, Mixture };

void run_epoch_order(benchmark::State& state, Selection selection) {
  const auto kind = static_cast<mmt::SamplerKind>(state.range(0));
  const int64_t records = state.range(1);
  std::vector<int64_t> chunks;
  if (kind == mmt::SamplerKind::QuasiRandom) {
    for (int64_t left = records; left > 0; left -= 1024) chunks.push_back(left < 1024 ? left : 1024);
  }
  mmt::SamplerOptions options{.kind = kind, .seed = 20240607};
  if (selection == Selection::Mixture) {
    const int64_t quarter = records / 4;
    mmt::Mixture mixture{.epoch_size = records};
    for (int s = 0; s < 4; ++s)
      mixture.sources.push_back({.first_record = s * quarter, .num_records = quarter, .weight = 0.4 - 0.1 * s});
    options.mixture = std::move(mixture);
  }
  if (selection == Selection::Subset) {
    std::vector<int64_t> every_other(static_cast<size_t>(records / 2));
    for (size_t i = 0; i < every_other.size(); ++i) every_other[i] = static_cast<int64_t>(2 * i);
    options.subset = std::move(every_other);
  }
  const mmt::Sampler sampler = mmt::Sampler::create(records, options, std::move(chunks));
  const mmt::EpochOrder order = sampler.epoch(3);
  // 4 million positions a pass at most, one after another from the epoch's middle, as a
  // loader asks for them (positions spread with a stride would make quasi-random's subset
  // list look cold: a window's entries are read together).
  const int64_t epoch_size = order.size();
  const int64_t positions = epoch_size < 4'000'000 ? epoch_size : 4'000'000;
  const int64_t first = (epoch_size - positions) / 2;
  constexpr int64_t kBatch = 256;
  std::vector<int64_t> records_of_batch(kBatch);
  int64_t sum = 0;
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t p = 0; p < positions; p += kBatch) {  // a loader's batches
      const std::span<int64_t> batch(records_of_batch.data(), static_cast<size_t>(std::min(kBatch, positions - p)));
      order.rank_records(first, p, batch);
      for (int64_t record : batch) sum += record;
    }
    benchmark::DoNotOptimize(sum);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  state.counters["ns_per_position"] = seconds * 1e9 / static_cast<double>(state.iterations() * positions);
  state.SetLabel(std::string(mmt::to_string(kind)));
}

void BM_EpochOrder(benchmark::State& state) { run_epoch_order(state, Selection::Every); }
void BM_EpochOrderOfASubset(benchmark::State& state) { run_epoch_order(state, Selection::Subset); }
void BM_EpochOrderOfAMixture(benchmark::State& state) { run_epoch_order(state, Selection::Mixture); }

BENCHMARK(BM_EpochOrder)
    ->ArgNames({"kind", "records"})
    ->ArgsProduct({{static_cast<int64_t>(mmt::SamplerKind::Random), static_cast<int64_t>(mmt::SamplerKind::QuasiRandom)},
                   {60'000, 1'281'167, 100'000'000}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EpochOrderOfASubset)
    ->ArgNames({"kind", "records"})
    ->ArgsProduct({{static_cast<int64_t>(mmt::SamplerKind::Random), static_cast<int64_t>(mmt::SamplerKind::QuasiRandom)},
                   {60'000, 1'281'167, 100'000'000}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EpochOrderOfAMixture)
    ->ArgNames({"kind", "records"})
    ->ArgsProduct({{static_cast<int64_t>(mmt::SamplerKind::Random), static_cast<int64_t>(mmt::SamplerKind::QuasiRandom)},
                   {60'000, 1'281'167, 100'000'000}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
