// Dataset::Concat: several dataset files read as one (Dataset::open_concat, Dataset::concat).
// Each Dataset method that a concatenation answers differently from one file starts with
// `if (concat_) return concat_->...`; the rest of the engine sees single files only, so
// everything a part does (validation, zero-copy views, the chunk cache, read-ahead, guarded
// reads naming its path) stays as it is.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mapping_guard.h"
#include "read_ahead.h"
#include "mmtensor/dataset.h"

namespace mmt {
namespace detail {

// The part holding `record`, given the parts' ends (ends[p] = first record after part p, in
// order): the number of parts that end at or before it, empty parts before it skipped. A
// search without branches on the record (a shuffled batch would mispredict about half of
// them): it runs once per record of every batch.
inline size_t part_holding(const int64_t* ends, size_t parts, int64_t record) {
  const int64_t* at = ends;
  size_t len = parts;
  while (len > 1) {
    const size_t half = len / 2;
    at += at[half - 1] <= record ? half : 0;
    len -= half;
  }
  return static_cast<size_t>(at - ends) + (*at <= record ? 1 : 0);
}

// Where a concatenation of contiguous parts keeps record i of part p: part_data[p] +
// (i - firsts[p]) * stride, p = part_holding(firsts + 1, parts, i).
struct ContiguousParts {
  const std::byte* const* part_data = nullptr;
  const int64_t* firsts = nullptr;  // parts + 1 entries
  size_t parts = 0;
  int64_t stride = 0;  // record_stride_bytes, the same in every part
  int64_t records = 0;
  const std::byte* record(int64_t index) const {
    const int64_t i = index < 0 ? index + records : index;
    const size_t p = part_holding(firsts + 1, parts, i);
    return part_data[p] + (i - firsts[p]) * stride;
  }
};

// Several mappings guarded as one (mapping_guard.h): the parts' files.
struct GuardedRegions {
  std::vector<MappedRegion> regions;
  uintptr_t lowest = 0;
  uintptr_t end = 0;
};
}  // namespace detail

struct Dataset::Concat {
  std::vector<Dataset> parts;         // single files (never concatenations), in order; at least two
  std::vector<int64_t> first_record;  // parts.size() + 1: part p holds records [first_record[p], first_record[p + 1])
  std::vector<int64_t> first_chunk;   // the same for chunks
  std::shared_ptr<const Schema> schema;  // the first part's (every part's is equal)
  Metadata metadata;                     // the union of the parts'
  std::string path;                      // the parts' paths joined by ", "
  std::string absolute_path;             // the parts' absolute paths, joined alike
  ReaderOptions options;
  mutable std::atomic<uint64_t> fingerprint{0};  // 0 until computed
  // Every part uncompressed with fixed fields back to back (kFlagContiguousFixedLayout): a
  // batch's records are addresses, and get_batch copies the whole batch in one run
  // (detail::gather_records) instead of part by part.
  bool contiguous = false;
  std::vector<const std::byte*> part_data;  // contiguous: each part's first record
  detail::GuardedRegions regions;          // every part's mapping
  mutable std::atomic<bool> all_validated{false};  // every part's chunks validated (stays true)
  // ReaderOptions::read_ahead for whole batches over the parts: the policy a single file's
  // get_batch follows, over the whole batch whatever parts it falls in
  // (detail::gather_shards_reading_ahead; the parts' own policies stay out of it);
  // read_ahead_stats() counts its hints with the parts'.
  std::unique_ptr<detail::ReadAheadPolicy> read_ahead;
  uint64_t instance_id = 0;  // Impl::new_instance_id(): keys get_batch's per-thread marks
  bool mincore_reports_page_cache = false;  // for every part (Impl::mincore_reports_page_cache)
  mutable std::atomic<bool> first_batch_unchecked{true};

  // Checks the parts against each other and builds the tables; flattens nested ones.
  static std::shared_ptr<const Concat> make(std::vector<Dataset> parts, const ReaderOptions& options);

  int64_t size() const { return first_record.back(); }
  // The first part, whose record layout every part shares (their schemas are equal).
  const Impl& layout() const { return *parts[0].impl_; }
  int64_t num_chunks() const { return first_chunk.back(); }
  // Python-style index -> [0, size()); IndexError naming `what` otherwise.
  int64_t normalize_index(int64_t index, const char* what) const;
  // The part holding record `record` (in range), or chunk `chunk` (in range). Empty parts
  // hold nothing and are never returned.
  size_t part_of_record(int64_t record) const;
  size_t part_of_chunk(int64_t chunk) const;
  // Dataset::locate, with `what` naming the caller in an IndexError.
  Location locate(int64_t index, const char* what) const;

  DatasetInfo info() const;
  uint64_t compute_fingerprint() const;
  ChunkInfo chunk(int64_t chunk_index) const;
  Sample get(int64_t index) const;
  Tensor column(std::string_view field, int64_t start, int64_t stop) const;
  RaggedBatch ragged_column(std::string_view field, int64_t start, int64_t stop) const;
  RaggedBatch get_ragged_batch(std::span<const int64_t> indices, std::string_view field) const;
  void get_batch(std::span<const int64_t> indices, std::span<const std::string> fields, std::span<const Tensor> outs,
                 int threads) const;
  void prefetch(std::span<const int64_t> indices, std::span<const std::string> fields, bool every_field) const;
  // get_batch's gathers, without a hint of their own (the batch's hint, if any, was
  // Concat::read_ahead's, over all its parts at once): part by part (detail::gather_parts,
  // or a part's own get_batch for a batch inside one part), the parts' own hints off; and, of
  // contiguous parts, as one run (detail::gather_records).
  void gather_part_by_part(std::span<const int64_t> indices, std::span<const std::string> fields,
                           std::span<const Tensor> outs, int threads) const;
  void gather_records_at(std::span<const int64_t> indices, std::span<const std::string> fields,
                         std::span<const Tensor> outs, int threads) const;
  // Whether four of the batch's records (spread over it) miss pages of the page cache
  // (Impl::batch_looks_cold); only where mincore() tells about every part
  // (mincore_reports_page_cache). False when unsure.
  bool sample_looks_cold(std::span<const int64_t> indices, std::span<const std::string> fields) const noexcept;
  CacheStats cache_stats() const;
  ReadAheadStats read_ahead_stats() const;
};

namespace detail {

// For a concatenation's get_batch (dataset_batch.cc): gathers each part's records `indices`
// (in range for that part) into rows rows[k] of `outs`, each a [batch, ...] output checked
// as get_batch checks it, on up to `threads` threads. Every part must have the same schema.
// A part hints its share as its own get_batch would, unless the calling thread holds
// ReadAheadPolicy::DatasetHintsOff (Concat::gather_part_by_part does), which then holds on
// the pool's threads too.
struct PartRows {
  const Dataset::Impl* part = nullptr;
  std::span<const int64_t> indices;
  const int64_t* rows = nullptr;
};
void gather_parts(std::span<const PartRows> parts, int64_t batch, std::span<const std::string> fields,
                  std::span<const Tensor> outs, int threads);

// For a concatenation of contiguous parts (dataset_batch.cc): copies row b of `outs` from
// record indices[b] (in range, its chunk validated; `parts` says where it is, in one of
// `regions`), the whole batch as one run over up to `threads` threads, prefetching across
// the parts as across one file. The copying threads find the records themselves. `layout`
// is any part (their record layouts are equal).
void gather_records(const Dataset::Impl& layout, std::span<const int64_t> indices, const ContiguousParts& parts,
                    const GuardedRegions& regions, std::span<const std::string> fields,
                    std::span<const Tensor> outs, int threads);

// For a concatenation's get_batch (dataset_batch.cc): the whole batch gathered
// (Concat::gather_records_at over contiguous parts, else Concat::gather_part_by_part with the
// parts' hints off), with ReaderOptions::read_ahead deciding whether the batch is hinted
// first, over all its parts at once, as a single file's get_batch decides (Concat::read_ahead).
void gather_shards_reading_ahead(const Dataset::Concat& c, std::span<const int64_t> indices,
                                 std::span<const std::string> fields, std::span<const Tensor> outs, int threads);

}  // namespace detail
}  // namespace mmt
