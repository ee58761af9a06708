// Sampler::for_dataset: a sampler shaped by an open dataset's chunk layout and cache budget.
// Kept apart from sampler.cc so the pure orders carry no dependency on the reader.
#include <algorithm>

#include "mmtensor/dataset.h"
#include "mmtensor/sampler.h"

namespace mmt {

namespace {

// Fits two windows of decoded chunks in the cache: the one being read and the next one the
// prefetching loader is already entering.
int64_t automatic_window(const Dataset& dataset) {
  const int64_t chunks = dataset.num_chunks();
  if (chunks == 0) return 1;
  const int64_t average_chunk_bytes = std::max<int64_t>(1, dataset.info().decoded_bytes / chunks);
  const int64_t budget_bytes = dataset.cache_stats().budget_bytes;
  return std::clamp<int64_t>(budget_bytes / (2 * average_chunk_bytes), 1, chunks);
}

}  // namespace

Sampler Sampler::for_dataset(const Dataset& dataset, SamplerOptions options) {
  std::vector<int64_t> counts;
  if (options.kind == SamplerKind::QuasiRandom) {
    const int64_t chunks = dataset.num_chunks();
    counts.reserve(static_cast<size_t>(chunks));
    for (int64_t c = 0; c < chunks; ++c) counts.push_back(dataset.chunk(c).record_count);
    if (options.window_chunks == 0) options.window_chunks = automatic_window(dataset);
  }
  return create(dataset.size(), options, std::move(counts));
}

}  // namespace mmt
