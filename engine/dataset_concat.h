// Dataset::Concat: several dataset files read as one (Dataset::open_concat, Dataset::concat).
// Each Dataset method that a concatenation answers differently from one file starts with
// `if (concat_) return concat_->...`; the rest of the engine sees single files only, so
// everything a part does (validation, zero-copy views, the chunk cache, read-ahead, guarded
// reads naming its path) stays as it is.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mmtensor/dataset.h"

namespace mmt {

struct Dataset::Concat {
  std::vector<Dataset> parts;         // single files (never concatenations), in order; at least two
  std::vector<int64_t> first_record;  // parts.size() + 1: part p holds records [first_record[p], first_record[p + 1])
  std::vector<int64_t> first_chunk;   // the same for chunks
  std::shared_ptr<const Schema> schema;  // the first part's (every part's is equal)
  Metadata metadata;                     // the union of the parts'
  std::string path;                      // the parts' paths joined by ", "
  ReaderOptions options;
  mutable std::atomic<uint64_t> fingerprint{0};  // 0 until computed

  // Checks the parts against each other and builds the tables; flattens nested ones.
  static std::shared_ptr<const Concat> make(std::vector<Dataset> parts, const ReaderOptions& options);

  int64_t size() const { return first_record.back(); }
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
  CacheStats cache_stats() const;
  ReadAheadStats read_ahead_stats() const;
};

namespace detail {

// For a concatenation's get_batch (dataset_batch.cc): gathers each part's records `indices`
// (in range for that part) into rows rows[k] of `outs`, each a [batch, ...] output checked
// as get_batch checks it, on up to `threads` threads. Every part must have the same schema.
// ReaderOptions::read_ahead applies to each part as to its own get_batch.
struct PartRows {
  const Dataset::Impl* part = nullptr;
  std::span<const int64_t> indices;
  const int64_t* rows = nullptr;
};
void gather_parts(std::span<const PartRows> parts, int64_t batch, std::span<const std::string> fields,
                  std::span<const Tensor> outs, int threads);

}  // namespace detail
}  // namespace mmt
