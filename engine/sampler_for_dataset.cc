// Sampler::for_dataset: a sampler shaped by an open dataset's chunk layout and cache budget.
// Kept apart from sampler.cc so the pure orders carry no dependency on the reader.
#include <algorithm>

#include "mmtensor/dataset.h"
#include "mmtensor/sampler.h"

namespace mmt {

namespace {

// Two windows are live at a window boundary (the one being finished by batches still in
// flight, and the next one); a third window's worth of budget is headroom, so that chunks of
// uneven size and slow pieces do not push a chunk out before its last record is read.
int64_t automatic_window(int64_t budget_bytes, int64_t largest_chunk_bytes, int64_t chunks) {
  if (chunks == 0) return 1;
  return std::clamp<int64_t>(budget_bytes / (3 * std::max<int64_t>(1, largest_chunk_bytes)), 1, chunks);
}

}  // namespace

Mixture Mixture::of_parts(const Dataset& dataset, std::vector<double> weights, int64_t epoch_size) {
  const std::vector<Dataset> parts = dataset.parts();
  MMT_CHECK(weights.size() == parts.size(), ValueError, "Mixture::of_parts: ", weights.size(),
            " weight(s) for the ", parts.size(), " part(s) of ", dataset.path(), " (one weight a part)");
  Mixture mixture{.epoch_size = epoch_size};
  int64_t first = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    mixture.sources.push_back({.first_record = first, .num_records = parts[p].size(), .weight = weights[p]});
    first += parts[p].size();
  }
  return mixture;
}

Sampler Sampler::for_dataset(const Dataset& dataset, SamplerOptions options) {
  std::vector<int64_t> counts;
  if (options.kind == SamplerKind::QuasiRandom) {
    const int64_t chunks = dataset.num_chunks();
    counts.reserve(static_cast<size_t>(chunks));
    int64_t largest_chunk_bytes = 0;
    for (int64_t c = 0, next_first = 0; c < chunks; ++c) {
      const ChunkInfo chunk = dataset.chunk(c);
      // The table's entries are checked one at a time; that they follow one another is the
      // file's business too (a FormatError naming it, not the Sampler's ValueError).
      MMT_CHECK(chunk.first_record == next_first, FormatError, dataset.path(), ": chunk ", c, " starts at record ",
                chunk.first_record, " but the chunks before it end at record ", next_first,
                " (the chunk table is damaged; mmt verify says more)");
      next_first += chunk.record_count;
      counts.push_back(chunk.record_count);
      largest_chunk_bytes = std::max(largest_chunk_bytes, chunk.decoded_bytes);
    }
    if (options.window_chunks == 0) {
      // Every rank must compute the same order, or ranks would see some records twice and
      // others never: with several ranks the window comes from the default budget, not this
      // process's (ranks opened with different cache_bytes used to get different windows).
      const int64_t budget =
          options.world_size > 1 ? ReaderOptions{}.cache_bytes : dataset.cache_stats().budget_bytes;
      options.window_chunks = automatic_window(budget, largest_chunk_bytes, chunks);
    }
  }
  return create(dataset.size(), options, std::move(counts));
}

}  // namespace mmt
