// The on-disk format of an mmtensor dataset, as docs/FORMAT.md specifies it: named constants,
// the fixed-size structures (Preamble, Footer, ChunkEntry) with their encoders and checking
// decoders, the record layout rule, the ragged section layout, and the schema block.
//
// Decoders trust nothing: they check lengths before reading, checksums before believing,
// and every offset against the real file size with arithmetic that cannot overflow. They
// throw FormatError (ChecksumError for a checksum mismatch) saying what is wrong and where.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "mmtensor/codec.h"
#include "mmtensor/schema.h"

namespace mmt::format {

static_assert(std::endian::native == std::endian::little,
              "mmtensor files are little-endian and the reader maps them as they are");

// ---- constants (FORMAT.md, "Constants") ----
inline constexpr unsigned char kMagic[8] = {0x89, 'M', 'M', 'T', '\r', '\n', 0x1a, '\n'};
inline constexpr unsigned char kEndMagic[8] = {0x89, 'E', 'N', 'D', '\r', '\n', 0x1a, '\n'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr int64_t kPreambleBytes = 64;
inline constexpr int64_t kFooterBytes = 72;
inline constexpr int64_t kChunkEntryBytes = 64;
inline constexpr int64_t kValueAlignment = 64;       // big values, ragged sections
inline constexpr int64_t kChunkTableAlignment = 8;
inline constexpr int64_t kMinAlignment = 64;
inline constexpr int64_t kMaxAlignment = int64_t{1} << 24;
inline constexpr uint32_t kFlagContiguousFixedLayout = 1u << 0;
inline constexpr uint32_t kKnownFlags = kFlagContiguousFixedLayout;
inline constexpr int64_t kMaxSchemaBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxDecodedChunkBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxChunkRecords = 0xffffffffLL;  // record_count is a u32
// The most decoded bytes a codec makes of one stored byte: an lz4 block's length bytes add 255
// each; a zstd RLE block turns 4 bytes (header and value) into at most 128 KiB. A chunk that
// declares more than stored_bytes times this cannot decode to it (a bomb, or a corrupt entry).
inline constexpr uint64_t kMaxLz4Expansion = 255;
inline constexpr uint64_t kMaxZstdExpansion = 32768;
inline constexpr int kMaxSchemaNesting = 16;
// Field limits (FORMAT.md "Schema"): generous, and they keep a hostile schema from asking
// for absurd metadata.
inline constexpr size_t kMaxFieldNameBytes = 1024;
inline constexpr int64_t kMaxFieldRank = 64;
// JSON values (array elements and object members) a schema block may hold, counted before
// parsing: a parser builds a node per value, tens of times the text's size in memory.
inline constexpr int64_t kMaxSchemaValues = int64_t{1} << 20;

// ---- overflow-safe arithmetic: the one bounds-check helper ----
// True when [offset, offset + nbytes) lies inside [0, size). Cannot overflow.
constexpr bool in_bounds(uint64_t offset, uint64_t nbytes, uint64_t size) {
  return offset <= size && nbytes <= size - offset;
}
// a * b or a + b, false on overflow (or a negative result).
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out) && *out >= 0;
}
inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out) && *out >= 0;
}
// A ragged value's element count from its full shape (extents and fixed dimensions), false
// when it overflows int64, or when the product with every 0 counted as 1 does (what the
// value's strides span; FORMAT.md "On every access to a ragged value"). Writers refuse such
// a value; readers refuse such a record.
inline bool ragged_value_elements(const int64_t* sizes, size_t ndim, int64_t* numel) {
  int64_t elements = 1, span = 1;
  for (size_t d = 0; d < ndim; ++d)
    if (!checked_mul(elements, sizes[d], &elements) || !checked_mul(span, sizes[d] > 1 ? sizes[d] : 1, &span))
      return false;
  *numel = elements;
  return true;
}
// Rounds up to a power-of-two `alignment`; the caller keeps value far below INT64_MAX.
constexpr int64_t round_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}
inline uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---- Preamble: the first 64 bytes ----
struct Preamble {
  uint32_t format_version = kFormatVersion;
  uint32_t preamble_bytes = kPreambleBytes;
  uint64_t alignment = 4096;
  uint64_t records_per_chunk = 0;  // 0: chunks hold varying record counts
  uint64_t record_stride_bytes = 0;
  uint32_t flags = 0;
};
void encode_preamble(const Preamble& preamble, std::byte out[kPreambleBytes]);
// `data` holds `file_bytes` bytes (the whole file).
Preamble decode_preamble(const std::byte* data, int64_t file_bytes);
// Where the first chunk starts: the preamble rounded up to the alignment.
inline int64_t data_offset(const Preamble& p) {
  return round_up(static_cast<int64_t>(p.preamble_bytes), static_cast<int64_t>(p.alignment));
}

// ---- Footer: the last 72 bytes ----
struct Footer {
  uint64_t record_count = 0;
  uint64_t chunk_count = 0;
  uint64_t chunk_table_offset = 0;
  uint64_t schema_offset = 0;
  uint64_t schema_bytes = 0;
  uint64_t file_bytes = 0;
  uint64_t schema_checksum = 0;
};
void encode_footer(const Footer& footer, std::byte out[kFooterBytes]);
// Checks the end magic, checksum, file size and that the regions tile the file as the
// format requires (given the already-decoded preamble).
Footer decode_footer(const std::byte* data, int64_t file_bytes, const Preamble& preamble);

// ---- ChunkEntry: 64 bytes per chunk in the chunk table ----
struct ChunkEntry {
  uint64_t file_offset = 0;
  uint64_t stored_bytes = 0;
  uint64_t decoded_bytes = 0;
  uint64_t first_record = 0;
  uint32_t record_count = 0;
  uint8_t codec = 0;
  uint64_t payload_checksum = 0;
};
void encode_chunk_entry(const ChunkEntry& entry, uint64_t chunk_index, std::byte out[kChunkEntryBytes]);
// Checks the entry checksum (seeded with chunk_index), reserved bytes and codec code only;
// the reader checks positions and sizes against the file (Dataset::Impl::validate_chunk).
ChunkEntry decode_chunk_entry(const std::byte* entry, uint64_t chunk_index);
// Reads the fields without checking anything: for an entry already validated once.
ChunkEntry peek_chunk_entry(const std::byte* entry);
// Reads first_record without checking anything: for binary search over the mapped table.
inline uint64_t peek_first_record(const std::byte* entry) { return load_u64(entry + 24); }
// payload_checksum = XXH3_64bits_withSeed(payload, stored_bytes, chunk_index).
uint64_t payload_checksum(const void* payload, int64_t stored_bytes, uint64_t chunk_index);

// ---- the record layout rule (FORMAT.md, "Record layout") ----
struct RecordLayout {
  std::vector<int64_t> field_offset_bytes;  // per field; -1 for ragged fields
  std::vector<size_t> ragged_fields;        // schema indices of ragged fields, in order
  int64_t record_stride_bytes = 0;
};
RecordLayout compute_record_layout(const Schema& schema);

// ---- ragged sections of a decoded chunk (FORMAT.md, "Decoded chunk payload") ----
// Offsets, relative to the chunk's first decoded byte, of one ragged field's section.
struct RaggedSection {
  int64_t ends_offset = 0;     // u64 value_end[record_count]
  int64_t extents_offset = 0;  // u64 extents[record_count * variable_dims]
  int64_t values_offset = 0;   // the values, 64-aligned
  int64_t end_offset = 0;      // one past the last value byte
};
// Sections form a chain: the first starts after the fixed region, each next one after the
// previous one's values. So finding field k's section reads the k sections before it; a
// reader that wants several walks the chain once with the two functions below.
//
// Walks the section chain up to ragged field `ragged_index` (0-based among ragged fields) and
// checks each section lies inside `decoded_bytes`. `chunk` is the chunk's first decoded byte.
RaggedSection locate_ragged_section(const std::byte* chunk, int64_t decoded_bytes,
                                    int64_t record_count, int64_t record_stride_bytes,
                                    const Schema& schema, const RecordLayout& layout,
                                    size_t ragged_index, int64_t chunk_index);
// Where a section starts, given where the previous one ended (or the fixed region's end).
inline int64_t next_section_offset(int64_t previous_end) {
  return round_up(previous_end, kValueAlignment);
}
// Where the first ragged section starts; checks that the chunk's fixed region fits.
int64_t first_ragged_section_offset(int64_t decoded_bytes, int64_t record_count, int64_t record_stride_bytes,
                                    int64_t chunk_index);
// Whether a ragged section header (value ends, then extents: record_count * (1 +
// variable_dims) u64 words) that starts at decoded byte `offset` fits in `decoded_bytes`,
// with overflow-safe arithmetic; sets *header_end to where it ends when it does.
bool ragged_header_fits(int64_t decoded_bytes, int64_t record_count, int64_t variable_dims, int64_t offset,
                        int64_t* header_end);
// The section of ragged field `field` that starts at decoded byte `offset` (the first one's
// offset, or next_section_offset(previous.end_offset)), checked to lie inside the chunk.
RaggedSection ragged_section_at(const std::byte* chunk, int64_t decoded_bytes, int64_t record_count,
                                const Field& field, int64_t offset, int64_t chunk_index);

// ---- the schema block: UTF-8 JSON ----
struct SchemaBlock {
  Schema schema;
  Metadata metadata;
  CodecSpec codec;
  std::string writer;  // e.g. "mmtensor 0.1.0"
  bool codec_named = true;  // false when a block read has no "codec" key (it is optional)
};
std::string encode_schema_block(const SchemaBlock& block);
SchemaBlock decode_schema_block(std::string_view json, int64_t file_offset);

// A schema block's size as a reader judges it: its bytes (kMaxSchemaBytes) and the ','
// separators outside its strings (fewer than kMaxSchemaValues). Each metadata entry adds
// encoded_metadata_entry_bytes() (`"key":"value"`, escapes counted), and each entry after the
// first a ',' (one byte, one separator): a writer keeps count as entries come.
struct SchemaBlockSize {
  int64_t bytes = 0;
  int64_t separators = 0;
};
SchemaBlockSize encoded_size(const SchemaBlock& block);
int64_t encoded_metadata_entry_bytes(std::string_view key, std::string_view value);

}  // namespace mmt::format
