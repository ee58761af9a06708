// Apache Arrow IPC files and streams, read for packing: what Hugging Face `datasets` saves
// (save_to_disk's data-*.arrow and its cache files: the stream format), Feather V2 and
// pyarrow.ipc files (the file format: "ARROW1", the stream, a footer, "ARROW1").
//
// The layout (arrow.apache.org/docs/format/Columnar.html, "Serialization and IPC"): a stream
// is a sequence of messages, each 0xFFFFFFFF, an int32 metadata length, a FlatBuffers
// `Message` (Message.fbs) padded to 8 bytes, then its body of `bodyLength` bytes; streams
// from before Arrow 0.15 lack the 0xFFFFFFFF. An end-of-stream marker is a length of 0; a
// stream may also just end between messages. The first message is the Schema; the others are
// RecordBatch messages (and DictionaryBatch ones for dictionary-encoded fields), whose
// FieldNodes and Buffers follow the schema's fields in pre-order. A file is read by its
// footer (File.fbs: the schema, and a Block for each dictionary and record batch: where its
// message lies, its metadata's and its body's lengths), as Arrow's own readers read it: the
// stream inside may lack its Schema message (Arrow JS writes none).
//
// Nothing is trusted: every message, buffer and node is checked against the file and the
// schema here (FormatError naming the file, the message's byte and what is wrong); the
// values in the buffers (offsets, validity bits) are left to the reader of the columns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mmtensor/storage.h"

namespace mmt::detail {

// The Type union's codes (Schema.fbs).
enum class ArrowTypeId : uint8_t {
  None = 0, Null, Int, FloatingPoint, Binary, Utf8, Bool, Decimal, Date, Time, Timestamp, Interval, List, Struct,
  Union, FixedSizeBinary, FixedSizeList, Map, Duration, LargeBinary, LargeUtf8, LargeList, RunEndEncoded, BinaryView,
  Utf8View, ListView, LargeListView,
};

using ArrowKeyValues = std::vector<std::pair<std::string, std::string>>;

struct ArrowField {
  std::string name;
  ArrowTypeId type = ArrowTypeId::None;
  int bit_width = 0;       // Int, Time, Decimal; the storage width of Date, Timestamp, Duration;
                           // Map: 64 for 64-bit offsets (the Parquet reader's), else Arrow's 32
  bool is_signed = false;  // Int
  int precision = 0;       // FloatingPoint: 0 half, 1 single, 2 double; Decimal: its digits
  int scale = 0;           // Decimal: a value is its integer times 10^-scale
  int unit = 0;            // Date, Time, Timestamp, Duration, Interval: the enum's value
  int32_t fixed_size = 0;  // FixedSizeBinary's byte width, FixedSizeList's list size
  bool dense_union = false;
  std::string timezone;    // Timestamp
  bool dictionary_encoded = false;  // then its type and children are its dictionary's values'
  int64_t dictionary_id = 0;
  int index_bit_width = 32;         // the indices' integer type (DictionaryEncoding.indexType)
  bool index_signed = true;
  std::vector<ArrowField> children;
  ArrowKeyValues metadata;  // "ARROW:extension:name"...
  // Its place in a batch: its node is nodes[node] (pre-order; a dictionary-encoded field's
  // node is its indices', and its children, the dictionary's value type, have none: -1);
  // arrow_field_buffers() says where its own buffers begin.
  int node = -1;
};

// "int32", "list<float>", "timestamp[us, tz=UTC]", "struct<bytes: binary, path: string>":
// pyarrow's spelling, for messages and the metadata.
std::string arrow_type_name(const ArrowField& field);

struct ArrowBatch {
  struct Node {
    int64_t length = 0;
    int64_t null_count = 0;
  };
  struct Buffer {
    int64_t offset = 0;  // in `bytes` (the file, or the decompressed copy)
    int64_t length = 0;
  };
  int64_t rows = 0;
  int64_t message_offset = 0;  // the message's first byte in the file, for errors
  int codec = -1;              // its body's compression: -1 none, 0 LZ4_FRAME, 1 ZSTD
  bool decompressed = false;   // its buffers lie in ArrowIpc::decompressed, not the file
  int64_t row_group = -1;      // a Parquet row group's number (parquet.h), for errors
  std::vector<Node> nodes;
  std::vector<Buffer> buffers;
  std::vector<int64_t> variadic_buffer_counts;
};

// A dictionary-encoded field's values (a DictionaryBatch): laid out as a batch of one field,
// `value` (the encoded field's type and children), numbered from node 0. A delta adds its
// values after those before; another replaces them for the record batches after it.
struct ArrowDictionary {
  int64_t id = 0;
  bool delta = false;
  size_t batches_before = 0;  // record batches before it in the stream
  std::shared_ptr<const std::vector<ArrowField>> value;  // shared by the dictionaries of one id
  int node_count = 0;
  ArrowBatch batch;
};

struct ArrowIpc {
  std::string path;
  UntypedStorage file;          // mapped (an empty file is refused)
  UntypedStorage decompressed;  // the buffers of compressed batches, decompressed (ScratchFile)
  bool file_format = false;     // "ARROW1" ... "ARROW1"; else a stream
  bool metadata_v4 = false;     // metadata version V4 (V5 otherwise), whose unions have validity buffers
  std::vector<ArrowField> fields;
  ArrowKeyValues metadata;
  std::vector<ArrowBatch> batches;
  std::vector<ArrowDictionary> dictionaries;
  int node_count = 0;  // nodes a batch has: every field, in pre-order
  const UntypedStorage& bytes_of(const ArrowBatch& batch) const { return batch.decompressed ? decompressed : file; }
};

// Whether `head` (a file's first bytes) begins as an Arrow IPC file ("ARROW1") or a stream of
// today's framing (0xFFFFFFFF and a metadata length).
bool is_arrow_file_start(const std::byte* head, size_t n);
bool is_arrow_stream_start(const std::byte* head, size_t n);

// Reads the schema and every batch's nodes and buffers of the file at `path` (mapped).
// IoError for a file that cannot be read; FormatError for a damaged one (a cut, a bad
// FlatBuffer, nodes or buffers that do not fit the schema or the body, a compressed buffer
// that does not decompress to its stated size); ValueError for what this reader does not
// take: big-endian data, metadata before V4 (Arrow before 0.8), a body compressed with a
// codec other than LZ4_FRAME or ZSTD, compressed buffers that state more bytes than both
// decode_limit() of the file and the scratch budget (a decompression bomb). Compressed buffers are decompressed into a
// ScratchFile ($TMPDIR needs room for them).
ArrowIpc read_arrow_ipc(const std::string& path);

// Where each field's own buffers begin in `batch`, by the field's node index (views' variadic
// buffers counted); FormatError when the batch's buffers or variadic counts do not match the
// schema.
std::vector<int> arrow_field_buffers(const ArrowIpc& ipc, const ArrowBatch& batch);
// The same for a dictionary's batch.
std::vector<int> arrow_field_buffers(const ArrowIpc& ipc, const ArrowDictionary& dictionary);

}  // namespace mmt::detail
