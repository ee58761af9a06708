// The reader's shared state (Dataset::Impl) and the chunk-level operations the reader's
// files build on: open (dataset_open.cc), chunk validation and decoding (dataset_chunks.cc),
// sample views (dataset.cc), batch gathers (dataset_batch.cc).
//
// Trust: open() validates only the fixed-size structures (preamble, footer, schema). A
// chunk's table entry (and, with verify_checksums, its payload) is validated the first time
// the chunk is used; chunk_state_ remembers which chunks passed, one byte per chunk,
// allocated with calloc so that open stays O(1) in practice (untouched pages cost nothing).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "chunk_cache.h"
#include "format.h"
#include "mmtensor/dataset.h"

namespace mmt {

// How to build one field's view, computed once at open.
struct FieldPlan {
  ScalarType dtype = kUInt8;
  int64_t element_bytes = 1;
  bool fixed = true;
  int64_t offset_bytes = 0;  // fixed: the value's offset inside a record
  int64_t value_bytes = 0;   // fixed: bytes of one value
  DimVector sizes;           // fixed: the value's logical shape
  DimVector strides;         // fixed: its strides in elements (storage order)
  bool dense_row_major = true;  // fixed: strides are the contiguous strides of sizes
  size_t ragged_index = 0;   // ragged: position among the ragged fields
};

// A chunk ready to read: its decoded bytes are storage[payload_offset_bytes, + decoded_bytes).
struct ChunkRef {
  UntypedStorage storage;  // the whole-file mapping, or the decoded chunk
  int64_t payload_offset_bytes = 0;
  int64_t decoded_bytes = 0;
  int64_t first_record = 0;
  int64_t record_count = 0;
  int64_t index = -1;
};

struct Dataset::Impl {
  std::string path;
  ReaderOptions options;
  UntypedStorage file;  // the whole file, read-only
  const std::byte* base = nullptr;
  int64_t file_bytes = 0;
  format::Preamble preamble;
  format::Footer footer;
  std::shared_ptr<const Schema> schema;
  Metadata metadata;
  CodecSpec codec;
  std::string writer;
  format::RecordLayout layout;
  std::vector<FieldPlan> plans;
  int64_t record_count = 0;
  int64_t chunk_count = 0;
  int64_t records_per_chunk = 0;
  int64_t record_stride_bytes = 0;
  int64_t data_offset = 0;
  int64_t schema_offset = 0;
  int64_t chunk_table_offset = 0;
  bool contiguous = false;  // kFlagContiguousFixedLayout, checked against the schema
  uint64_t instance_id = 0;  // unique per open(), keys per-thread shortcuts
  std::unique_ptr<uint8_t, decltype(&std::free)> chunk_state{nullptr, &std::free};
  mutable std::unique_ptr<detail::ChunkCache> cache;

  static std::shared_ptr<const Impl> open(const std::string& path, const ReaderOptions& options);

  // Python-style index -> [0, record_count); IndexError naming `what` otherwise.
  int64_t normalize_index(int64_t index, const char* what) const;
  int64_t chunk_of(int64_t record) const;
  // The entry, checked against the file (no payload hash, no caching). dataset_chunks.cc.
  format::ChunkEntry check_entry(int64_t chunk) const;
  // Validates chunk `chunk` once (entry, and the payload checksum when verify is true).
  void ensure_validated(int64_t chunk) const {
    if (std::atomic_ref<uint8_t>(chunk_state.get()[chunk]).load(std::memory_order_acquire) == 0)
      validate_chunk(chunk, options.verify_checksums);
  }
  void validate_chunk(int64_t chunk, bool verify_payload) const;
  // The chunk's decoded bytes (the mapping itself for uncompressed chunks).
  ChunkRef chunk_ref(int64_t chunk) const;
  // Decodes a compressed chunk into fresh memory (no cache).
  UntypedStorage decode_chunk(int64_t chunk, const format::ChunkEntry& entry) const;
  // Record `record`'s value of field `field`, as a view into `ref`.
  Tensor field_view(const ChunkRef& ref, int64_t record, size_t field) const;
  Tensor ragged_view(const ChunkRef& ref, int64_t record, size_t field) const;
  // Checks every ragged value of a decoded chunk (Dataset::verify).
  void verify_ragged_structure(const ChunkRef& ref) const;
};

// The Impl of a Dataset handle; ValueError for an empty handle.
inline const Dataset::Impl& checked_impl(const std::shared_ptr<const Dataset::Impl>& impl) {
  if (!impl) throw ValueError("this Dataset is empty; assign it from Dataset::open()");
  return *impl;
}

}  // namespace mmt
