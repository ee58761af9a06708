// Apache Parquet files, read for packing: what the Hugging Face Hub serves (every dataset's
// refs/convert/parquet branch), what pandas, polars, Spark and DuckDB write.
//
// The layout (github.com/apache/parquet-format, README.md and parquet.thrift): "PAR1", the
// column chunks of each row group, the footer (a Thrift compact-protocol FileMetaData), its
// length as a little-endian uint32, "PAR1". The footer holds the schema (a tree flattened in
// pre-order, each group followed by its num_children children), the row groups and, for each
// leaf column of each, where its pages lie. A column chunk is an optional dictionary page and
// data pages (V1 or V2), each a Thrift PageHeader and its (compressed) bytes: repetition and
// definition levels (Dremel's encoding of nulls and lists), then the values that are present.
//
// read_parquet_as_arrow decodes the columns a pack takes into Arrow's columnar layout, one
// record batch per row group, in a temporary file: pack_arrow.cc then reads them as it reads
// Arrow IPC files. Nothing is trusted: the footer, each page header, each page's size and
// decompressed size, every level and every dictionary index is checked (FormatError naming
// the file, the row group, the column and what is wrong).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "arrow_ipc.h"

namespace mmt::detail {

// The Thrift enums' values (parquet.thrift).
enum class ParquetType : int8_t {
  Group = -1, Boolean = 0, Int32, Int64, Int96, Float, Double, ByteArray, FixedLenByteArray,
};
enum class ParquetRepetition : int8_t { Required = 0, Optional, Repeated };
enum class ParquetLogical : int8_t {  // LogicalType's union members, and ConvertedType's equivalents
  None, String, Map, List, Enum, Decimal, Date, Time, Timestamp, Integer, Unknown, Json, Bson, Uuid, Float16,
  Interval, Other,
};

struct ParquetSchemaElement {
  std::string name;
  ParquetType type = ParquetType::Group;
  int32_t type_length = 0;  // FixedLenByteArray's width
  ParquetRepetition repetition = ParquetRepetition::Required;
  int32_t num_children = 0;
  ParquetLogical logical = ParquetLogical::None;
  bool map_key_value = false;  // ConvertedType MAP_KEY_VALUE
  int time_unit = 0;           // Time, Timestamp: 1 ms, 2 us, 3 ns (Arrow's TimeUnit values)
  bool adjusted_to_utc = false;
  int int_bits = 0;            // Integer
  bool int_signed = true;
  int32_t precision = 0, scale = 0;  // Decimal
};

struct ParquetColumnChunk {
  std::vector<std::string> path;  // path_in_schema
  ParquetType type = ParquetType::Boolean;
  int codec = 0;
  int64_t num_values = 0;
  int64_t data_page_offset = 0;
  int64_t dictionary_page_offset = -1;  // -1: none stated
  int64_t total_compressed_size = 0;
  int64_t total_uncompressed_size = 0;
  std::string file_path;  // data in another file (refused)
  bool has_metadata = false;
};

struct ParquetRowGroup {
  int64_t num_rows = 0;
  std::vector<ParquetColumnChunk> columns;
};

struct ParquetMetadata {
  int64_t num_rows = 0;
  std::vector<ParquetSchemaElement> schema;  // the root first, then its tree in pre-order
  std::vector<ParquetRowGroup> row_groups;
  ArrowKeyValues key_values;
  std::string created_by;
};

// Whether `head` (a file's first bytes) begins with Parquet's "PAR1".
bool is_parquet_start(const std::byte* head, size_t n);

// The footer of the Parquet file `bytes` (the whole file): FormatError naming `path` for a file
// cut short, not ending in "PAR1", or a damaged footer; ValueError for an encrypted one.
ParquetMetadata read_parquet_metadata(std::span<const std::byte> bytes, const std::string& path);
// The same from its parts: the file's size, its first 4 and last 8 bytes, and its footer
// (`footer_bytes`, the length its last 8 bytes state, read when footer_length() allows).
int64_t parquet_footer_length(int64_t size, std::span<const std::byte, 4> head, std::span<const std::byte, 8> tail,
                              const std::string& path);
ParquetMetadata parse_parquet_footer(std::span<const std::byte> footer_bytes, int64_t footer_start,
                                     const std::string& path);

// Decodes the columns `fields` names, as the packer names them (all when empty; "a" a field
// and all its columns, "a.b" column b of struct a alone, its siblings left undecoded, "a.lengths"
// field a) of the Parquet file at `path` into an ArrowIpc whose record
// batches (one per row group) lie in a temporary file. Columns map to Arrow types as pyarrow
// reads them (strings, binaries and lists with 64-bit offsets: large_string, large_list...;
// decimals as decimal128, or decimal256 past 38 digits); ValueError for what no Arrow type here
// holds (maps of keys alone, a decimal of no precision), naming the column, when it is chosen;
// FormatError for a damaged file.
ArrowIpc read_parquet_as_arrow(const std::string& path, std::span<const std::string> fields);

// Sets the least a column chunk may decode to (ParquetColumnValues::limit) instead of an
// eighth of the machine's memory; 0 restores that. For fuzzers, whose allocations are capped.
void set_parquet_decode_floor(int64_t bytes);

// Pages and their codecs and encodings (parquet_pages.cc).
struct ParquetColumnValues {
  std::vector<uint8_t> definition, repetition;  // one per entry (empty when the maximum is 0; at most 64)
  int64_t entries = 0;
  // The values present (definition at its maximum), in Arrow's layout: fixed-width values
  // (INT96 as int64 nanoseconds, BOOLEAN as one byte each), or byte arrays as `offsets`
  // (count + 1) into `values`.
  std::vector<std::byte> values;
  std::vector<int64_t> offsets;
  int64_t count = 0;
  // The most bytes its values, their offsets and its levels may take, counted in `charged`
  // (shared by the threads that decode parts of one column chunk): 1024 times the chunk's
  // bytes in the file, at least an eighth of the machine's memory and 1 GiB
  // (ValueError past it: dictionaries and runs let a few bytes of a hostile file stand for
  // any number of values).
  int64_t limit = INT64_MAX;
  std::atomic<int64_t>* charged = nullptr;
};
struct ParquetLeaf {
  ParquetType type = ParquetType::Boolean;
  int32_t type_length = 0;
  int16_t max_definition = 0, max_repetition = 0;
};
// The bytes of the file column chunk `chunk` may read: from its first page, its stated size
// (and 100 bytes more, within the data: some writers left a header out of it), before
// `data_end` (the footer's start). FormatError naming `where` for a range outside the data.
struct ParquetByteRange {
  int64_t begin = 0, end = 0;
};
ParquetByteRange parquet_chunk_range(const ParquetColumnChunk& chunk, int64_t data_end, const std::string& where);

// Reads column chunk `chunk` from `bytes` (its range, which begins at byte `first_byte` of the
// file: a copy, read without a mapping guard) as `leaf` describes it into `out` (emptied
// first; its memory is kept, for the next chunk). `where` names the file, row group and
// column. Its pages are decoded on up to `threads` threads (one part of them each) when it
// has many.
void read_parquet_column(std::span<const std::byte> bytes, int64_t first_byte, const ParquetColumnChunk& chunk,
                         const ParquetLeaf& leaf, const std::string& where, ParquetColumnValues& out, int threads = 1);

}  // namespace mmt::detail
