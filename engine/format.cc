#include "format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "checksum.h"
#include "mmtensor/error.h"
#include "utf8.h"

namespace mmt::format {
namespace {

void store_u32(std::byte* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }
void store_u64(std::byte* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }
uint32_t load_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
bool all_zero(const std::byte* p, size_t n) {
  return std::all_of(p, p + n, [](std::byte b) { return b == std::byte{0}; });
}
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Preamble field offsets (FORMAT.md, "Preamble").
constexpr size_t kPreambleVersionAt = 8, kPreambleBytesAt = 12, kAlignmentAt = 16,
                 kRecordsPerChunkAt = 24, kRecordStrideAt = 32, kFlagsAt = 40, kPreambleReservedAt = 44,
                 kPreambleChecksumAt = 56;
// Footer field offsets (FORMAT.md, "Footer").
constexpr size_t kRecordCountAt = 0, kChunkCountAt = 8, kChunkTableOffsetAt = 16, kSchemaOffsetAt = 24,
                 kSchemaBytesAt = 32, kFileBytesAt = 40, kSchemaChecksumAt = 48, kFooterChecksumAt = 56,
                 kEndMagicAt = 64;
// Chunk entry field offsets (FORMAT.md, "Chunk table").
constexpr size_t kFileOffsetAt = 0, kStoredBytesAt = 8, kDecodedBytesAt = 16, kFirstRecordAt = 24,
                 kEntryRecordCountAt = 32, kCodecAt = 36, kEntryReservedAt = 37, kPayloadChecksumAt = 48,
                 kEntryChecksumAt = 56;

}  // namespace

// ---------------------------------------------------------------------------------------------
void encode_preamble(const Preamble& p, std::byte out[kPreambleBytes]) {
  std::memset(out, 0, kPreambleBytes);
  std::memcpy(out, kMagic, sizeof kMagic);
  store_u32(out + kPreambleVersionAt, p.format_version);
  store_u32(out + kPreambleBytesAt, p.preamble_bytes);
  store_u64(out + kAlignmentAt, p.alignment);
  store_u64(out + kRecordsPerChunkAt, p.records_per_chunk);
  store_u64(out + kRecordStrideAt, p.record_stride_bytes);
  store_u32(out + kFlagsAt, p.flags);
  store_u64(out + kPreambleChecksumAt, detail::checksum64(out, kPreambleChecksumAt));
}

Preamble decode_preamble(const std::byte* data, int64_t file_bytes) {
  MMT_CHECK(file_bytes >= static_cast<int64_t>(sizeof kMagic) &&
                std::memcmp(data, kMagic, sizeof kMagic) == 0,
            FormatError, "not an mmtensor dataset: the first 8 bytes are not the mmtensor magic "
            "number (89 4D 4D 54 0D 0A 1A 0A)");
  MMT_CHECK(file_bytes >= kPreambleBytes + kFooterBytes, FormatError, "truncated dataset: the file "
            "holds ", file_bytes, " bytes, fewer than a preamble and a footer (",
            kPreambleBytes + kFooterBytes, ")");
  Preamble p;
  p.format_version = load_u32(data + kPreambleVersionAt);
  MMT_CHECK(p.format_version != 0, FormatError, "preamble at byte offset 8: format version 0 is not valid");
  MMT_CHECK(p.format_version <= kFormatVersion, FormatError, "format version ", p.format_version,
            " is newer than this reader (supports ", kFormatVersion, ")");
  p.preamble_bytes = load_u32(data + kPreambleBytesAt);
  MMT_CHECK(p.preamble_bytes == kPreambleBytes, FormatError, "preamble at byte offset 12: "
            "preamble_bytes is ", p.preamble_bytes, " but format version 1 requires ", kPreambleBytes);
  uint64_t stored = load_u64(data + kPreambleChecksumAt);
  uint64_t actual = detail::checksum64(data, kPreambleChecksumAt);
  MMT_CHECK(stored == actual, ChecksumError, "preamble checksum mismatch (bytes 0..55): the "
            "preamble is corrupt");
  p.alignment = load_u64(data + kAlignmentAt);
  p.records_per_chunk = load_u64(data + kRecordsPerChunkAt);
  p.record_stride_bytes = load_u64(data + kRecordStrideAt);
  p.flags = load_u32(data + kFlagsAt);
  MMT_CHECK((p.flags & ~kKnownFlags) == 0, FormatError, "preamble at byte offset 40: unknown flags 0x",
            std::hex, p.flags & ~kKnownFlags, std::dec, " (this reader knows 0x", std::hex,
            kKnownFlags, std::dec, "); the file needs a newer reader");
  MMT_CHECK(all_zero(data + kPreambleReservedAt, kPreambleChecksumAt - kPreambleReservedAt),
            FormatError, "preamble at byte offset 44: reserved bytes are not zero");
  MMT_CHECK(p.alignment >= static_cast<uint64_t>(kMinAlignment) &&
                p.alignment <= static_cast<uint64_t>(kMaxAlignment) && std::has_single_bit(p.alignment),
            FormatError, "preamble at byte offset 16: alignment ", p.alignment,
            " is not a power of two in [", kMinAlignment, ", ", kMaxAlignment, "]");
  MMT_CHECK(p.records_per_chunk <= static_cast<uint64_t>(kMaxChunkRecords), FormatError,
            "preamble at byte offset 24: records_per_chunk ", p.records_per_chunk,
            " exceeds the limit ", kMaxChunkRecords);
  MMT_CHECK(p.record_stride_bytes <= kInt64Max, FormatError, "preamble at byte offset 32: "
            "record_stride_bytes ", p.record_stride_bytes, " is too large");
  return p;
}

// ---------------------------------------------------------------------------------------------
void encode_footer(const Footer& f, std::byte out[kFooterBytes]) {
  std::memset(out, 0, kFooterBytes);
  store_u64(out + kRecordCountAt, f.record_count);
  store_u64(out + kChunkCountAt, f.chunk_count);
  store_u64(out + kChunkTableOffsetAt, f.chunk_table_offset);
  store_u64(out + kSchemaOffsetAt, f.schema_offset);
  store_u64(out + kSchemaBytesAt, f.schema_bytes);
  store_u64(out + kFileBytesAt, f.file_bytes);
  store_u64(out + kSchemaChecksumAt, f.schema_checksum);
  store_u64(out + kFooterChecksumAt, detail::checksum64(out, kFooterChecksumAt));
  std::memcpy(out + kEndMagicAt, kEndMagic, sizeof kEndMagic);
}

Footer decode_footer(const std::byte* data, int64_t file_bytes, const Preamble& preamble) {
  const int64_t at = file_bytes - kFooterBytes;  // decode_preamble proved file_bytes is large enough
  const std::byte* p = data + at;
  MMT_CHECK(std::memcmp(p + kEndMagicAt, kEndMagic, sizeof kEndMagic) == 0, FormatError,
            "truncated or unfinished dataset: the last 8 bytes (byte offset ", file_bytes - 8,
            ") are not the end magic; the file was cut short or its writer never finished");
  MMT_CHECK(load_u64(p + kFooterChecksumAt) == detail::checksum64(p, kFooterChecksumAt), ChecksumError,
            "footer checksum mismatch (footer at byte offset ", at, "): the footer is corrupt");
  Footer f;
  f.record_count = load_u64(p + kRecordCountAt);
  f.chunk_count = load_u64(p + kChunkCountAt);
  f.chunk_table_offset = load_u64(p + kChunkTableOffsetAt);
  f.schema_offset = load_u64(p + kSchemaOffsetAt);
  f.schema_bytes = load_u64(p + kSchemaBytesAt);
  f.file_bytes = load_u64(p + kFileBytesAt);
  f.schema_checksum = load_u64(p + kSchemaChecksumAt);
  const uint64_t size = static_cast<uint64_t>(file_bytes);
  MMT_CHECK(f.file_bytes == size, FormatError, "the footer records a file of ", f.file_bytes,
            " bytes but the file holds ", file_bytes, " (truncated, or bytes were added)");
  const uint64_t data_start = static_cast<uint64_t>(data_offset(preamble));
  MMT_CHECK(f.schema_offset >= data_start && in_bounds(f.schema_offset, f.schema_bytes, size),
            FormatError, "footer: schema block [", f.schema_offset, ", +", f.schema_bytes,
            ") is outside the file's data region [", data_start, ", ", file_bytes, ")");
  MMT_CHECK(f.schema_bytes >= 2 && f.schema_bytes <= static_cast<uint64_t>(kMaxSchemaBytes),
            FormatError, "footer: schema block of ", f.schema_bytes, " bytes (at byte offset ",
            f.schema_offset, ") is outside the allowed 2..", kMaxSchemaBytes, " bytes");
  const uint64_t table_at = static_cast<uint64_t>(
      round_up(static_cast<int64_t>(f.schema_offset + f.schema_bytes), kChunkTableAlignment));
  MMT_CHECK(f.chunk_table_offset == table_at, FormatError, "footer: chunk table offset ",
            f.chunk_table_offset, " should be ", table_at, " (right after the schema block)");
  const uint64_t table_space = size - static_cast<uint64_t>(kFooterBytes);
  MMT_CHECK(f.chunk_table_offset <= table_space &&
                f.chunk_count == (table_space - f.chunk_table_offset) / kChunkEntryBytes &&
                (table_space - f.chunk_table_offset) % kChunkEntryBytes == 0,
            FormatError, "footer: ", f.chunk_count, " chunk table entries at byte offset ",
            f.chunk_table_offset, " do not fill the space before the footer (byte offset ", at, ")");
  MMT_CHECK(f.record_count <= kInt64Max, FormatError, "footer: record count ", f.record_count,
            " is too large");
  const uint64_t rpc = preamble.records_per_chunk;
  bool counts_agree;
  if (f.record_count == 0) {
    counts_agree = f.chunk_count == 0;
  } else if (rpc != 0) {
    counts_agree = f.chunk_count == f.record_count / rpc + (f.record_count % rpc != 0);
  } else {
    counts_agree = f.chunk_count >= 1 && f.chunk_count <= f.record_count &&
                   f.record_count / f.chunk_count <= static_cast<uint64_t>(kMaxChunkRecords);
  }
  MMT_CHECK(counts_agree, FormatError, "footer: ", f.record_count, " records cannot be held by ",
            f.chunk_count, " chunks of ", rpc == 0 ? std::string("varying size")
                                                   : detail::str(rpc, " records"));
  return f;
}

// ---------------------------------------------------------------------------------------------
void encode_chunk_entry(const ChunkEntry& e, uint64_t chunk_index, std::byte out[kChunkEntryBytes]) {
  std::memset(out, 0, kChunkEntryBytes);
  store_u64(out + kFileOffsetAt, e.file_offset);
  store_u64(out + kStoredBytesAt, e.stored_bytes);
  store_u64(out + kDecodedBytesAt, e.decoded_bytes);
  store_u64(out + kFirstRecordAt, e.first_record);
  store_u32(out + kEntryRecordCountAt, e.record_count);
  out[kCodecAt] = static_cast<std::byte>(e.codec);
  store_u64(out + kPayloadChecksumAt, e.payload_checksum);
  store_u64(out + kEntryChecksumAt, detail::checksum64(out, kEntryChecksumAt, chunk_index));
}

ChunkEntry peek_chunk_entry(const std::byte* p) {
  ChunkEntry e;
  e.file_offset = load_u64(p + kFileOffsetAt);
  e.stored_bytes = load_u64(p + kStoredBytesAt);
  e.decoded_bytes = load_u64(p + kDecodedBytesAt);
  e.first_record = load_u64(p + kFirstRecordAt);
  e.record_count = load_u32(p + kEntryRecordCountAt);
  e.codec = static_cast<uint8_t>(p[kCodecAt]);
  e.payload_checksum = load_u64(p + kPayloadChecksumAt);
  return e;
}

ChunkEntry decode_chunk_entry(const std::byte* p, uint64_t chunk_index) {
  MMT_CHECK(load_u64(p + kEntryChecksumAt) == detail::checksum64(p, kEntryChecksumAt, chunk_index),
            ChecksumError, "chunk ", chunk_index, ": chunk table entry checksum mismatch (the entry "
            "is corrupt or belongs to another chunk)");
  ChunkEntry e = peek_chunk_entry(p);
  MMT_CHECK(all_zero(p + kEntryReservedAt, kPayloadChecksumAt - kEntryReservedAt), FormatError,
            "chunk ", chunk_index, ": reserved bytes of its chunk table entry are not zero");
  MMT_CHECK(e.codec <= static_cast<uint8_t>(Codec::Zstd), FormatError, "chunk ", chunk_index,
            ": unknown codec code ", static_cast<int>(e.codec));
  return e;
}

uint64_t payload_checksum(const void* payload, int64_t stored_bytes, uint64_t chunk_index) {
  return detail::checksum64(payload, static_cast<size_t>(stored_bytes), chunk_index);
}

// ---------------------------------------------------------------------------------------------
RecordLayout compute_record_layout(const Schema& schema) {
  RecordLayout layout;
  int64_t cursor = 0;
  int64_t max_alignment = 1;
  for (size_t i = 0; i < schema.size(); ++i) {
    const Field& field = schema[i];
    if (!field.is_fixed()) {
      layout.field_offset_bytes.push_back(-1);
      layout.ragged_fields.push_back(i);
      continue;
    }
    int64_t nbytes = field.fixed_nbytes();
    int64_t alignment = nbytes >= kValueAlignment ? kValueAlignment : element_size(field.dtype);
    int64_t padded = 0, end = 0;
    MMT_CHECK(checked_add(cursor, alignment - 1, &padded), ValueError, "field '", field.name,
              "': a record of this schema exceeds 2^63 bytes");
    const int64_t offset = round_up(cursor, alignment);
    MMT_CHECK(checked_add(offset, nbytes, &end), ValueError, "field '", field.name,
              "': a record of this schema exceeds 2^63 bytes");
    cursor = end;
    layout.field_offset_bytes.push_back(offset);
    max_alignment = std::max(max_alignment, alignment);
  }
  int64_t stride = 0;
  MMT_CHECK(checked_add(cursor, max_alignment - 1, &stride), ValueError,
            "a record of this schema exceeds 2^63 bytes");
  layout.record_stride_bytes = round_up(cursor, max_alignment);
  return layout;
}

int64_t first_ragged_section_offset(int64_t decoded_bytes, int64_t record_count, int64_t record_stride_bytes,
                                    int64_t chunk_index) {
  int64_t fixed_end = 0;
  MMT_CHECK(record_count >= 1 && checked_mul(record_count, record_stride_bytes, &fixed_end) &&
                fixed_end <= decoded_bytes,
            FormatError, "chunk ", chunk_index, ": ", record_count, " records of ", record_stride_bytes,
            " bytes do not fit in its ", decoded_bytes, " decoded bytes");
  return next_section_offset(fixed_end);
}

bool ragged_header_fits(int64_t decoded_bytes, int64_t record_count, int64_t variable_dims, int64_t offset,
                        int64_t* header_end) {
  int64_t words = 0, bytes = 0;
  return checked_mul(record_count, 1 + variable_dims, &words) && checked_mul(words, 8, &bytes) &&
         checked_add(offset, bytes, header_end) && *header_end <= decoded_bytes;
}

RaggedSection ragged_section_at(const std::byte* chunk, int64_t decoded_bytes, int64_t record_count,
                                const Field& field, int64_t offset, int64_t chunk_index) {
  const int64_t elem = element_size(field.dtype);
  RaggedSection s;
  s.ends_offset = offset;
  int64_t header_end = 0;
  const bool ok = ragged_header_fits(decoded_bytes, record_count, field.variable_dims(), offset, &header_end);
  MMT_CHECK(ok, FormatError, "chunk ", chunk_index, ", field '", field.name, "': the ragged "
            "section header at decoded byte ", offset, " runs past the chunk's ", decoded_bytes, " bytes");
  s.extents_offset = offset + 8 * record_count;
  s.values_offset = next_section_offset(header_end);
  MMT_CHECK(s.values_offset <= decoded_bytes, FormatError, "chunk ", chunk_index, ", field '",
            field.name, "': ragged values start at decoded byte ", s.values_offset, ", past the chunk's ",
            decoded_bytes, " bytes");
  uint64_t last_end = load_u64(chunk + s.ends_offset + 8 * (record_count - 1));
  MMT_CHECK(last_end <= static_cast<uint64_t>((decoded_bytes - s.values_offset) / elem), FormatError,
            "chunk ", chunk_index, ", field '", field.name, "': ragged values (", last_end,
            " elements, the last value end at decoded byte ", s.ends_offset + 8 * (record_count - 1),
            ") run past the chunk's ", decoded_bytes, " decoded bytes");
  s.end_offset = s.values_offset + static_cast<int64_t>(last_end) * elem;
  return s;
}

RaggedSection locate_ragged_section(const std::byte* chunk, int64_t decoded_bytes, int64_t record_count,
                                    int64_t record_stride_bytes, const Schema& schema,
                                    const RecordLayout& layout, size_t ragged_index, int64_t chunk_index) {
  int64_t offset = first_ragged_section_offset(decoded_bytes, record_count, record_stride_bytes, chunk_index);
  for (size_t k = 0;; ++k) {
    const RaggedSection s =
        ragged_section_at(chunk, decoded_bytes, record_count, schema[layout.ragged_fields[k]], offset, chunk_index);
    if (k == ragged_index) return s;
    offset = next_section_offset(s.end_offset);
  }
}

// ---------------------------------------------------------------------------------------------
namespace {

// Reading: members in std::maps, so a block of many members parses in O(n log n); writing:
// members in the order written ("fields" first, for a person reading the file).
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

[[noreturn]] void schema_error(int64_t file_offset, const std::string& what) {
  throw FormatError(detail::str("schema block at byte offset ", file_offset, ": ", what));
}

// Tells, fed a JSON text one character at a time, which characters lie outside its strings
// (a string's quotes count as inside).
class JsonStrings {
 public:
  bool outside(char c) {
    if (in_string_) {
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"') in_string_ = false;
      return false;
    }
    in_string_ = c == '"';
    return !in_string_;
  }

 private:
  bool in_string_ = false, escaped_ = false;
};

// What can be refused before parsing, in one pass over the text: NUL bytes (the parser would
// stop there and ignore the rest); nesting deeper than any schema needs (nlohmann's parser
// is iterative, but destroying a deeply nested value recurses); more values than
// kMaxSchemaValues (each ',' outside a string separates two).
void check_before_parsing(std::string_view json, int64_t file_offset) {
  // nlohmann's parser skips a UTF-8 byte order mark, which strict JSON readers refuse: two
  // readers would disagree on one checksummed block (FORMAT.md: the text begins with '{' or
  // whitespace).
  if (json.starts_with("\xEF\xBB\xBF"))
    schema_error(file_offset, "the JSON text begins with a UTF-8 byte order mark, which the format does not allow");
  int depth = 0;
  int64_t separators = 0;
  JsonStrings strings;
  for (size_t at = 0; at < json.size(); ++at) {
    const char c = json[at];
    const auto where = [&] { return detail::str(" (byte offset ", file_offset + static_cast<int64_t>(at), ")"); };
    if (c == '\0') schema_error(file_offset, "the JSON text contains a NUL byte" + where());
    if (!strings.outside(c)) continue;
    if (c == '[' || c == '{') {
      if (++depth > kMaxSchemaNesting)
        schema_error(file_offset, detail::str("JSON nested deeper than ", kMaxSchemaNesting, " levels", where()));
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',' && ++separators >= kMaxSchemaValues) {
      schema_error(file_offset, detail::str("the JSON holds more than ", kMaxSchemaValues, " values", where()));
    }
  }
}

// SAX events of a JSON text: remembers the first key met twice in one object.
struct DuplicateKeyFinder final : nlohmann::json_sax<Json> {
  std::vector<std::unordered_set<std::string>> open_objects;  // each one's keys so far
  std::string duplicate;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_objects.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!open_objects.back().insert(key).second) duplicate = key;
    return duplicate.empty();  // the first duplicate ends the pass
  }
  bool end_object() override {
    open_objects.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

int64_t json_int(const Json& v, int64_t file_offset, const std::string& what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > kInt64Max) schema_error(file_offset, what + " is too large");
    return static_cast<int64_t>(u);
  }
  if (!v.is_number_integer()) schema_error(file_offset, what + " is not an integer");
  return v.get<int64_t>();
}

DimVector json_dims(const Json& v, int64_t file_offset, const std::string& what) {
  if (!v.is_array()) schema_error(file_offset, what + " is not an array");
  DimVector dims;
  for (const Json& d : v) dims.push_back(json_int(d, file_offset, what + " entry"));
  return dims;
}

}  // namespace

std::string encode_schema_block(const SchemaBlock& block) {
  OrderedJson fields = OrderedJson::array();
  for (const Field& field : block.schema) {
    OrderedJson f;
    f["name"] = field.name;
    f["dtype"] = std::string(to_string(field.dtype));
    f["shape"] = field.shape.vec();
    if (!field.storage_order.empty()) f["storage_order"] = field.storage_order.vec();
    fields.push_back(std::move(f));
  }
  // ordered_json looks each key up by a linear search; the metadata's keys are already
  // unique and sorted, so they are appended directly (many keys would otherwise take O(n^2)).
  OrderedJson metadata = OrderedJson::object();
  auto& members = metadata.get_ref<OrderedJson::object_t&>();
  members.reserve(block.metadata.size());
  for (const auto& [key, value] : block.metadata) members.push_back({key, value});
  OrderedJson root;
  root["fields"] = std::move(fields);
  root["metadata"] = std::move(metadata);
  root["codec"] = block.codec.str();
  root["writer"] = block.writer;
  return root.dump();
}

SchemaBlockSize encoded_size(const SchemaBlock& block) {
  const std::string json = encode_schema_block(block);
  SchemaBlockSize size{static_cast<int64_t>(json.size()), 0};
  JsonStrings strings;
  for (const char c : json) size.separators += strings.outside(c) && c == ',';
  return size;
}

int64_t encoded_metadata_entry_bytes(std::string_view key, std::string_view value) {
  return static_cast<int64_t>(Json(std::string(key)).dump().size() + 1 + Json(std::string(value)).dump().size());
}

SchemaBlock decode_schema_block(std::string_view text, int64_t file_offset) {
  check_before_parsing(text, file_offset);
  Json root;
  try {
    root = Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    schema_error(file_offset, std::string("not valid JSON: ") + e.what());
  }
  // A key given twice in one object is refused (FORMAT.md): the parser kept the last. A second,
  // SAX pass over the valid text finds it (half a parse's time; parse()'s own callback
  // would see the keys too, but made parsing 60x slower).
  DuplicateKeyFinder keys;
  Json::sax_parse(text.begin(), text.end(), &keys);
  const std::string& duplicate_key = keys.duplicate;
  if (!duplicate_key.empty())
    schema_error(file_offset, "the key " + detail::quoted(duplicate_key) + " appears twice in one object");
  if (!root.is_object()) schema_error(file_offset, "the top level is not a JSON object");
  SchemaBlock block;
  auto fields = root.find("fields");
  if (fields == root.end() || !fields->is_array() || fields->empty())
    schema_error(file_offset, "\"fields\" is missing, not an array, or empty");
  for (size_t i = 0; i < fields->size(); ++i) {
    const Json& f = (*fields)[i];
    std::string where = detail::str("field ", i);
    if (!f.is_object()) schema_error(file_offset, where + " is not an object");
    auto name = f.find("name");
    auto dtype = f.find("dtype");
    auto shape = f.find("shape");
    if (name == f.end() || !name->is_string()) schema_error(file_offset, where + ": \"name\" is missing or not a string");
    // Text from the file is quoted only when harmless (detail::quoted): a name of control
    // bytes or megabytes is refused below, by Field's rules, without being printed.
    where += " (" + detail::quoted(name->get_ref<const std::string&>(), kMaxFieldNameBytes) + ")";
    if (dtype == f.end() || !dtype->is_string()) schema_error(file_offset, where + ": \"dtype\" is missing or not a string");
    if (shape == f.end()) schema_error(file_offset, where + ": \"shape\" is missing");
    std::optional<ScalarType> type = scalar_type_from_string(dtype->get<std::string>());
    if (!type || to_string(*type) != dtype->get<std::string>())
      schema_error(file_offset, where + ": unknown dtype " + detail::quoted(dtype->get_ref<const std::string&>()));
    Field field;
    field.name = name->get<std::string>();
    field.dtype = *type;
    field.shape = json_dims(*shape, file_offset, where + ": \"shape\"");
    try {
      if (auto order = f.find("storage_order"); order != f.end())
        field.with_storage_order(json_dims(*order, file_offset, where + ": \"storage_order\""));
      block.schema.add(std::move(field));
    } catch (const ValueError& e) {
      schema_error(file_offset, e.what());
    }
  }
  if (auto metadata = root.find("metadata"); metadata != root.end()) {
    if (!metadata->is_object()) schema_error(file_offset, "\"metadata\" is not an object");
    for (const auto& [key, value] : metadata->items()) {
      if (!value.is_string()) schema_error(file_offset, "metadata value of " + detail::quoted(key) + " is not a string");
      block.metadata.emplace(key, value.get<std::string>());
    }
  }
  block.codec_named = root.contains("codec");
  if (auto codec = root.find("codec"); codec != root.end()) {
    if (!codec->is_string()) schema_error(file_offset, "\"codec\" is not a string");
    try {
      block.codec = CodecSpec::parse(codec->get<std::string>());
    } catch (const ValueError& e) {
      schema_error(file_offset, e.what());
    }
  }
  if (auto writer = root.find("writer"); writer != root.end() && writer->is_string())
    block.writer = writer->get<std::string>();
  return block;
}

}  // namespace mmt::format
