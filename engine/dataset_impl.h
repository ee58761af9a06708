// The reader's shared state (Dataset::Impl) and the chunk-level operations the reader's
// files build on: open (dataset_open.cc), chunk validation and decoding (dataset_chunks.cc),
// sample views (dataset.cc), batch gathers (dataset_batch.cc).
//
// Trust: open() validates only the fixed-size structures (preamble, footer, schema). A
// chunk's table entry (and, as ReaderOptions say, its payload) is validated the first time
// the chunk is used and then kept in `validated_chunks`, one slot per chunk allocated with
// calloc, so open stays O(1) in practice (untouched pages cost nothing) and a used chunk's
// entry is never read from the file again.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chunk_cache.h"
#include "format.h"
#include "mapping_guard.h"
#include "mmtensor/dataset.h"
#include "read_ahead.h"

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

// A chunk table entry that passed validation. `state` is accessed atomically: 0 not yet
// validated, 1 being stored by the thread that won the race, 2 ready to read.
struct ValidatedChunk {
  uint8_t state;
  uint8_t codec;
  uint32_t record_count;
  uint64_t file_offset;
  uint64_t stored_bytes;
  uint64_t decoded_bytes;
  uint64_t first_record;
  uint64_t payload_checksum;  // for Dataset::chunk(): ChunkInfo reports it

  // The entry's fields the reader uses after validation, in and out.
  void store(const format::ChunkEntry& e) {
    payload_checksum = e.payload_checksum;
    codec = e.codec;
    record_count = e.record_count;
    file_offset = e.file_offset;
    stored_bytes = e.stored_bytes;
    decoded_bytes = e.decoded_bytes;
    first_record = e.first_record;
  }
  format::ChunkEntry entry() const {
    format::ChunkEntry e;
    e.file_offset = file_offset;
    e.stored_bytes = stored_bytes;
    e.decoded_bytes = decoded_bytes;
    e.first_record = first_record;
    e.record_count = record_count;
    e.codec = codec;
    e.payload_checksum = payload_checksum;
    return e;
  }
};

// Bytes of decoded chunks alive, shared with each chunk's deleter (a chunk may outlive the
// Dataset through a view).
struct DecodedMemory {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  void add(int64_t nbytes) {
    const int64_t now = live.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
    int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
};

struct Dataset::Impl {
  std::string path;
  std::string absolute_path;  // path against the working folder at open()
  ReaderOptions options;
  UntypedStorage file;  // the whole file, read-only
  const std::byte* base = nullptr;
  int64_t file_bytes = 0;
  // The mapped file's identity (st_dev, st_ino), when the path named it as the open ended;
  // verify() compares that file's size now with file_bytes. Unknown: both 0.
  uint64_t file_device = 0, file_inode = 0;
  format::Preamble preamble;
  format::Footer footer;
  std::shared_ptr<const Schema> schema;
  Metadata metadata;
  CodecSpec codec;
  bool codec_named = true;  // the schema block names it (else info() reads the chunks')
  std::string writer;
  format::RecordLayout layout;
  std::vector<FieldPlan> plans;
  int64_t record_count = 0;
  int64_t chunk_count = 0;
  int64_t records_per_chunk = 0;
  int64_t record_stride_bytes = 0;
  // What every record takes at least in a decoded chunk: its fixed slot, plus a value end and
  // its extents (8 bytes each) in each ragged field's section (FORMAT.md, check 14).
  int64_t min_decoded_bytes_per_record = 0;
  std::shared_ptr<DecodedMemory> decoded_memory = std::make_shared<DecodedMemory>();
  int64_t data_offset = 0;
  int64_t schema_offset = 0;
  int64_t chunk_table_offset = 0;
  bool contiguous = false;  // kFlagContiguousFixedLayout, checked against the schema
  uint64_t instance_id = 0;  // unique per open(), keys per-thread shortcuts
  // Gives the mapping the advice ReaderOptions::advice says, whatever other advice it had
  // (the open's reads, verify()'s scan): Normal, Random and Sequential set how faults read
  // around, WillNeed and DontNeed leave that as it was, so they go on top of Normal.
  void apply_reader_advice() const;
  // A new instance_id: files and concatenations (whose get_batch keeps per-thread marks too)
  // draw from one count, so no two live readers share one.
  static uint64_t new_instance_id();
  std::unique_ptr<ValidatedChunk, decltype(&std::free)> validated_chunks{nullptr, &std::free};
  // Slots that reached state 2. Once it equals chunk_count, hot paths skip the per-record
  // check (and the division that finds the record's chunk).
  mutable std::atomic<int64_t> validated_count{0};
  // The decoded-chunk cache, this file's own, or shared by the parts of a concatenation
  // (Dataset::open_concat), where this file's chunk c is key cache_key_base + c.
  std::shared_ptr<detail::ChunkCache> cache;
  int64_t cache_key_base = 0;
  int64_t cache_key(int64_t chunk) const { return cache_key_base + chunk; }
  mutable std::unique_ptr<detail::ReadAheadPolicy> read_ahead;  // get_batch's (ReaderOptions::read_ahead)
  // Auto, hints off: get_batch checks whether a batch is cold on its first call (any thread),
  // and after this dataset's slow gather on the same thread (ReaderOptions::read_ahead): with
  // mincore when it tells this user about the page cache (detail::mincore_reports_page_cache),
  // else by hinting a sample of the batch.
  bool mincore_reports_page_cache = false;
  mutable std::atomic<bool> first_batch_unchecked{true};
  mutable std::atomic<int64_t> last_decoded_chunk{-1};  // to notice chunks decoded in order
  mutable std::atomic<uint64_t> fingerprint{0};  // Dataset::fingerprint(), once computed; 0 before

  // Runs fn() with a SIGBUS raised by reading the mapping (the file shrunk by another
  // program) turned into IoError naming the path and byte. fn must own nothing with a
  // destructor a fault could skip (mapping_guard.h); the engine guards its own reads of the
  // mapping: table entries, checksums, decoding, batch and column copies, verify.
  template <typename Fn>
  decltype(auto) guarded(Fn&& fn) const {
    return detail::guard_mapped_reads(detail::MappedRegion{&path, base, file_bytes}, std::forward<Fn>(fn));
  }
  // guarded(fn) when `ref` is the file's mapping (an uncompressed chunk); a decoded chunk is
  // the reader's own memory and needs no guard.
  template <typename Fn>
  decltype(auto) guarded_if_mapped(const ChunkRef& ref, Fn&& fn) const {
    if (ref.storage.data() == base) return guarded(std::forward<Fn>(fn));
    return fn();
  }

  // Opens `path`. A concatenation passes the cache its parts share (and this part's first
  // key, and the decoded-memory count they share); otherwise the file gets its own.
  struct SharedCache {
    std::shared_ptr<detail::ChunkCache> cache;
    int64_t key_base = 0;
    std::shared_ptr<DecodedMemory> decoded_memory;
  };
  static std::shared_ptr<const Impl> open(const std::string& path, const ReaderOptions& options,
                                          const SharedCache* shared_cache = nullptr);

  // Python-style index -> [0, record_count); IndexError naming `what` otherwise.
  int64_t normalize_index(int64_t index, const char* what) const;
  int64_t chunk_of(int64_t record) const;
  // The entry, checked against the file (no payload hash, no caching). dataset_chunks.cc.
  format::ChunkEntry check_entry(int64_t chunk) const;
  // The chunk's entry, validated on first use (with its payload checksum when the options
  // say so) and remembered.
  format::ChunkEntry validated_entry(int64_t chunk) const {
    ValidatedChunk& slot = validated_chunks.get()[chunk];
    if (std::atomic_ref<uint8_t>(slot.state).load(std::memory_order_acquire) != 2) [[unlikely]]
      return validate_chunk(chunk, /*force_payload_check=*/false);
    return slot.entry();
  }
  // The entry as checked at its validation, when that happened already; otherwise read and
  // checked now (check_entry), without validating the payload.
  format::ChunkEntry entry_without_validating(int64_t chunk) const {
    const ValidatedChunk& slot = validated_chunks.get()[chunk];
    if (std::atomic_ref<const uint8_t>(slot.state).load(std::memory_order_acquire) == 2) return slot.entry();
    return check_entry(chunk);
  }
  bool all_chunks_validated() const {
    return validated_count.load(std::memory_order_acquire) == chunk_count;
  }
  void ensure_validated(int64_t chunk) const {
    if (std::atomic_ref<uint8_t>(validated_chunks.get()[chunk].state).load(std::memory_order_acquire) != 2)
      [[unlikely]] validate_chunk(chunk, /*force_payload_check=*/false);
  }
  // Validates the entry and, when the options ask for it (or force_payload_check), hashes the
  // payload; remembers the entry once everything the options require has been checked.
  format::ChunkEntry validate_chunk(int64_t chunk, bool force_payload_check) const;
  // The chunk's decoded bytes (the mapping itself for uncompressed chunks).
  ChunkRef chunk_ref(int64_t chunk) const;
  // The same without decoding: nullopt for a compressed chunk the cache does not hold.
  // get_batch looks up a whole batch's chunks with it before splitting the copy across
  // threads, so the threads that copy from cached chunks never contend on the cache's lock.
  std::optional<ChunkRef> cached_chunk_ref(int64_t chunk) const;
  // Decodes a compressed chunk into fresh memory (no cache).
  UntypedStorage decode_chunk(int64_t chunk, const format::ChunkEntry& entry) const;
  // The chunk holding `record`, checked to hold it (the table of a varying-size file is
  // searched, and a corrupt one could point elsewhere).
  ChunkRef chunk_ref_holding(int64_t record) const;
  // That check alone: FormatError unless chunk `chunk` ([first_record, + record_count)) holds
  // `record`.
  void check_chunk_holds(int64_t chunk, int64_t first_record, int64_t record_count, int64_t record) const;
  // The entry of the chunk holding `record` (in range), its index in *chunk: chunk_of's
  // candidate, its entry (entry_without_validating) and check_chunk_holds in one.
  format::ChunkEntry entry_holding(int64_t record, int64_t* chunk) const;
  // Dataset::prefetch of the fields at schema positions `fields`.
  void prefetch(std::span<const int64_t> indices, std::span<const size_t> fields) const;
  // Whether the page cache lacks the first or last page of the largest fixed field's value
  // (of `fields`) of one of four of these records, or, compressed, of its chunk (unless the
  // chunk cache holds the chunk): mincore() of up to eight pages, a few microseconds. False
  // when unsure (a bad index, a damaged chunk entry: the gather reports those).
  bool batch_looks_cold(std::span<const int64_t> indices, std::span<const size_t> fields) const noexcept;
  // Record `record`'s value of field `field`, as a view into `ref`.
  Tensor field_view(const ChunkRef& ref, int64_t record, size_t field) const;
  Tensor ragged_view(const ChunkRef& ref, int64_t record, size_t field) const;
  // The same in a section already located (one walk of the chain serves many values).
  Tensor ragged_view(const ChunkRef& ref, const format::RaggedSection& section, int64_t record, size_t field) const;
  // Ragged field `field`'s section of chunk `ref`, located and checked (its reads guarded).
  // It walks the sections before it: O(ragged fields before `field`).
  format::RaggedSection ragged_section(const ChunkRef& ref, size_t field) const;
  // The section of the ragged field after the one whose section is `previous` (nullptr: the
  // first ragged field's), in O(1): how get() and verify() visit every ragged field in one walk.
  format::RaggedSection next_ragged_section(const ChunkRef& ref, const format::RaggedSection* previous,
                                            size_t field) const;
  // Record `record`'s value in that section: reads its value range and extents and checks
  // them as the format requires (the range inside the section, extents that fit and do not
  // overflow, as many elements as the range holds); writes its sizes to `sizes` (one per
  // dimension) and returns the range in elements. It reads the chunk's bytes unguarded and
  // owns nothing a fault could skip: call it inside guarded_if_mapped, once per record or
  // once around a whole run of records.
  struct ValueRange {
    int64_t begin = 0;
    int64_t end = 0;
  };
  ValueRange read_ragged_value(const ChunkRef& ref, const format::RaggedSection& section, int64_t record,
                               size_t field, int64_t* sizes) const;
  // Checks every ragged value of a chunk (Dataset::verify); `sizes` holds as many values as
  // the schema's largest rank. Reads the chunk unguarded, as read_ragged_value does.
  void verify_ragged_structure(const ChunkRef& ref, int64_t* sizes) const;
  // Checks that every bool value of a chunk is 0 or 1 (Dataset::verify); reads unguarded too.
  // Call after verify_ragged_structure, which checks the sections it walks.
  void verify_bool_values(const ChunkRef& ref) const;
  bool has_bool_field = false;
};

// The Impl of a Dataset handle; ValueError for an empty handle.
inline const Dataset::Impl& checked_impl(const std::shared_ptr<const Dataset::Impl>& impl) {
  if (!impl) throw ValueError("this Dataset is empty; assign it from Dataset::open()");
  return *impl;
}

// Inside a catch block: re-throws the FormatError or ChecksumError being handled (a
// decoder's or a structure's, which know the chunk but not the file) with the dataset's path
// in front, keeping its type.
[[noreturn]] void rethrow_in_file(const std::string& path);

}  // namespace mmt
