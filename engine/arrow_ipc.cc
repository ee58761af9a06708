#include "arrow_ipc.h"

#include <lz4frame.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "decode_limit.h"
#include "decompressed_file.h"
#include "flatbuffer_table.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "scratch_file.h"
#include "utf8.h"

namespace mmt::detail {

namespace {

// Message.fbs: MessageHeader's codes and the metadata versions read.
constexpr uint8_t kSchemaMessage = 1, kDictionaryBatchMessage = 2, kRecordBatchMessage = 3;
constexpr int16_t kMetadataV4 = 3, kMetadataV5 = 4;
constexpr char kFileMagic[] = "ARROW1";  // 6 bytes, padded to 8 at the start
// Bounds on what a schema may declare, so that a damaged one costs little to refuse: fields
// nest no deeper than this, and a schema has no more fields in all.
constexpr int kMaxFieldDepth = 64;
constexpr int kMaxFields = 1 << 20;

int64_t load_i64(const std::byte* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
int32_t load_i32(const std::byte* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

const char* time_unit_name(int unit) {
  switch (unit) {
    case 0: return "s";
    case 1: return "ms";
    case 2: return "us";
    case 3: return "ns";
    default: return "?";
  }
}

struct SchemaReader {
  const std::string& where;
  // What the schema may cost to copy out: the metadata's own size. A FlatBuffer may point at
  // one table or string from many places, so a small one could otherwise ask for gigabytes.
  int64_t budget;
  int fields_read = 0;

  void spend(int64_t bytes) {
    budget -= bytes;
    MMT_CHECK(budget >= 0, FormatError, where, ": its schema refers to the same tables and strings many times over, "
              "more than its metadata holds (a damaged or hostile file)");
  }

  ArrowKeyValues key_values(const FlatTable& table, int slot) {
    ArrowKeyValues out;
    const FlatVector entries = table.vector(slot, 4, "custom_metadata");
    for (uint32_t i = 0; i < entries.count; ++i) {
      const FlatTable entry = table.table_in(entries, i, "a KeyValue");
      const std::string_view key = entry.string(0, "a key").value_or(""), value = entry.string(1, "a value").value_or("");
      spend(8 + static_cast<int64_t>(key.size() + value.size()));
      out.emplace_back(std::string(key), std::string(value));
    }
    return out;
  }

  ArrowField field(const FlatTable& table, int depth) {
    MMT_CHECK(depth <= kMaxFieldDepth, FormatError, where, ": fields nested deeper than ", kMaxFieldDepth);
    MMT_CHECK(++fields_read <= kMaxFields, FormatError, where, ": more than ", kMaxFields, " fields");
    ArrowField out;
    out.name = std::string(table.string(0, "a field's name").value_or(""));
    spend(16 + static_cast<int64_t>(out.name.size()));
    out.type = static_cast<ArrowTypeId>(table.scalar<uint8_t>(2, 0));
    MMT_CHECK(out.type != ArrowTypeId::None && static_cast<uint8_t>(out.type) <= static_cast<uint8_t>(ArrowTypeId::LargeListView),
              FormatError, where, ": field '", cut_for_message(out.name, 100), "' has type code ",
              static_cast<int>(table.scalar<uint8_t>(2, 0)), ", which no Arrow type has");
    const std::optional<FlatTable> type = table.table(3, "a field's type");
    const auto type_table = [&]() -> const FlatTable& {
      MMT_CHECK(type.has_value(), FormatError, where, ": field '", cut_for_message(out.name, 100),
                "' lacks its type's parameters");
      return *type;
    };
    switch (out.type) {
      case ArrowTypeId::Int:
        out.bit_width = type_table().scalar<int32_t>(0, 0);
        out.is_signed = type_table().scalar<uint8_t>(1, 0) != 0;
        MMT_CHECK(out.bit_width == 8 || out.bit_width == 16 || out.bit_width == 32 || out.bit_width == 64, FormatError,
                  where, ": field '", cut_for_message(out.name, 100), "' is an integer of ", out.bit_width, " bits");
        break;
      case ArrowTypeId::FloatingPoint:
        out.precision = type_table().scalar<int16_t>(0, 0);
        MMT_CHECK(out.precision >= 0 && out.precision <= 2, FormatError, where, ": field '",
                  cut_for_message(out.name, 100), "' has floating-point precision ", out.precision);
        out.bit_width = 16 << out.precision;
        break;
      case ArrowTypeId::Decimal:  // precision and scale are required; bitWidth defaults to 128
        out.precision = type_table().scalar<int32_t>(0, 0);
        out.scale = type_table().scalar<int32_t>(1, 0);
        out.bit_width = type_table().scalar<int32_t>(2, 128);
        MMT_CHECK(out.bit_width == 32 || out.bit_width == 64 || out.bit_width == 128 || out.bit_width == 256,
                  FormatError, where, ": field '", cut_for_message(out.name, 100), "' is a decimal of ", out.bit_width,
                  " bits");
        break;
      case ArrowTypeId::Date:
        out.unit = type ? type->scalar<int16_t>(0, 1) : 1;
        out.bit_width = out.unit == 0 ? 32 : 64;
        break;
      case ArrowTypeId::Time:
        out.unit = type ? type->scalar<int16_t>(0, 1) : 1;
        out.bit_width = type ? type->scalar<int32_t>(1, 32) : 32;
        MMT_CHECK(out.bit_width == 32 || out.bit_width == 64, FormatError, where, ": field '",
                  cut_for_message(out.name, 100), "' is a time of ", out.bit_width, " bits");
        break;
      case ArrowTypeId::Timestamp:
        out.unit = type ? type->scalar<int16_t>(0, 0) : 0;
        out.timezone = type ? std::string(type->string(1, "a timezone").value_or("")) : std::string();
        spend(static_cast<int64_t>(out.timezone.size()));
        out.bit_width = 64;
        break;
      case ArrowTypeId::Duration:
        out.unit = type ? type->scalar<int16_t>(0, 1) : 1;
        out.bit_width = 64;
        break;
      case ArrowTypeId::Interval:
        out.unit = type ? type->scalar<int16_t>(0, 0) : 0;
        break;
      case ArrowTypeId::FixedSizeBinary:
      case ArrowTypeId::FixedSizeList:
        out.fixed_size = type_table().scalar<int32_t>(0, 0);
        MMT_CHECK(out.fixed_size >= 0, FormatError, where, ": field '", cut_for_message(out.name, 100),
                  "' has a fixed size of ", out.fixed_size);
        break;
      case ArrowTypeId::Union:
        out.dense_union = type_table().scalar<int16_t>(0, 0) == 1;
        break;
      default:
        break;
    }
    if (const std::optional<FlatTable> encoding = table.table(4, "a field's dictionary encoding")) {
      out.dictionary_encoded = true;
      out.dictionary_id = encoding->scalar<int64_t>(0, 0);
      if (const std::optional<FlatTable> index = encoding->table(1, "a dictionary's index type")) {
        out.index_bit_width = index->scalar<int32_t>(0, 0);
        out.index_signed = index->scalar<uint8_t>(1, 0) != 0;
      }
      MMT_CHECK(out.index_bit_width == 8 || out.index_bit_width == 16 || out.index_bit_width == 32 ||
                    out.index_bit_width == 64,
                FormatError, where, ": field '", cut_for_message(out.name, 100), "' has dictionary indices of ",
                out.index_bit_width, " bits");
    }
    out.metadata = key_values(table, 6);
    const FlatVector children = table.vector(5, 4, "a field's children");
    for (uint32_t i = 0; i < children.count; ++i)
      out.children.push_back(field(table.table_in(children, i, "a child field"), depth + 1));
    const size_t want = [&]() -> size_t {
      switch (out.type) {
        case ArrowTypeId::List: case ArrowTypeId::LargeList: case ArrowTypeId::FixedSizeList: case ArrowTypeId::Map:
        case ArrowTypeId::ListView: case ArrowTypeId::LargeListView: return 1;
        case ArrowTypeId::RunEndEncoded: return 2;
        case ArrowTypeId::Struct: case ArrowTypeId::Union: return out.children.size();
        default: return 0;
      }
    }();
    MMT_CHECK(out.children.size() == want, FormatError, where, ": field '", cut_for_message(out.name, 100), "' (",
              arrow_type_name(out), ") has ", out.children.size(), " child fields, where its type has ", want);
    return out;
  }
};

// The buffers a field has of its own (not its children's), views' variadic ones left out.
int own_buffers(const ArrowField& field, bool v4) {
  switch (field.type) {
    case ArrowTypeId::Null: case ArrowTypeId::RunEndEncoded: return 0;
    case ArrowTypeId::Struct: case ArrowTypeId::FixedSizeList: return 1;
    case ArrowTypeId::Binary: case ArrowTypeId::Utf8: case ArrowTypeId::LargeBinary: case ArrowTypeId::LargeUtf8:
    case ArrowTypeId::ListView: case ArrowTypeId::LargeListView: return 3;
    case ArrowTypeId::Union: return (field.dense_union ? 2 : 1) + (v4 ? 1 : 0);  // V5 unions have no validity
    default: return 2;  // validity and values, or validity and offsets
  }
}

// Numbers the fields' nodes in pre-order. A dictionary-encoded field's node is its indices'
// (its children describe the dictionary's values, which come in DictionaryBatch messages).
void number_nodes(std::vector<ArrowField>& fields, int& nodes) {
  for (ArrowField& f : fields) {
    f.node = nodes++;
    if (!f.dictionary_encoded) number_nodes(f.children, nodes);
  }
}

// One message's framing: its metadata [metadata, metadata + metadata_bytes) and body.
struct Framed {
  int64_t start = 0;
  int64_t metadata = 0, metadata_bytes = 0;
  bool end_of_stream = false;
};

// Streams the decompressed bytes of one compressed buffer into `out`.
class BufferDecompressor {
 public:
  BufferDecompressor(const std::string& path, int codec) : path_(path), codec_(codec), block_(size_t{1} << 20) {}

  // Appends what [data, data + n) decompresses to, which must be `expected` bytes.
  void run(const std::byte* data, int64_t n, int64_t expected, ScratchFile& out, const std::string& where) {
    int64_t produced = 0;
    if (codec_ == 1) {
      if (!zstd_) zstd_.reset(ZSTD_createDCtx());
      MMT_CHECK(zstd_ != nullptr, IoError, path_, ": cannot allocate a zstd decompression context");
      ZSTD_DCtx_reset(zstd_.get(), ZSTD_reset_session_only);
      ZSTD_inBuffer in{data, static_cast<size_t>(n), 0};
      size_t left = 1;
      while (in.pos < in.size || left != 0) {
        ZSTD_outBuffer o{block_.data(), block_.size(), 0};
        left = ZSTD_decompressStream(zstd_.get(), &o, &in);
        MMT_CHECK(!ZSTD_isError(left), FormatError, where, ": a corrupt zstd buffer: ", ZSTD_getErrorName(left));
        produced += static_cast<int64_t>(o.pos);
        MMT_CHECK(produced <= expected, FormatError, where, ": a compressed buffer decompresses to more than the ",
                  expected, " bytes it states");
        out.append(block_.data(), static_cast<int64_t>(o.pos));
        if (in.pos == in.size && o.pos < o.size && left != 0)
          throw FormatError(str(where, ": a zstd buffer is cut short"));
      }
    } else {
      if (lz4_ == nullptr) {
        LZ4F_dctx* context = nullptr;
        MMT_CHECK(!LZ4F_isError(LZ4F_createDecompressionContext(&context, LZ4F_VERSION)), IoError, path_,
                  ": cannot allocate an lz4 decompression context");
        lz4_.reset(context);
      }
      LZ4F_resetDecompressionContext(lz4_.get());
      size_t in_pos = 0;
      size_t hint = 1;
      while (hint != 0) {
        size_t in_size = static_cast<size_t>(n) - in_pos;
        size_t out_size = block_.size();
        hint = LZ4F_decompress(lz4_.get(), block_.data(), &out_size, data + in_pos, &in_size, nullptr);
        MMT_CHECK(!LZ4F_isError(hint), FormatError, where, ": a corrupt lz4 buffer: ", LZ4F_getErrorName(hint));
        in_pos += in_size;
        produced += static_cast<int64_t>(out_size);
        MMT_CHECK(produced <= expected, FormatError, where, ": a compressed buffer decompresses to more than the ",
                  expected, " bytes it states");
        out.append(block_.data(), static_cast<int64_t>(out_size));
        if (hint != 0 && in_pos == static_cast<size_t>(n) && out_size == 0)
          throw FormatError(str(where, ": an lz4 buffer is cut short"));
      }
    }
    MMT_CHECK(produced == expected, FormatError, where, ": a compressed buffer decompresses to ", produced,
              " bytes, where it states ", expected);
  }

 private:
  struct FreeLz4 {
    void operator()(LZ4F_dctx* c) const { LZ4F_freeDecompressionContext(c); }
  };
  std::string path_;
  int codec_;
  std::vector<std::byte> block_;
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> zstd_{nullptr, ZSTD_freeDCtx};
  std::unique_ptr<LZ4F_dctx, FreeLz4> lz4_;
};

}  // namespace

std::string arrow_type_name(const ArrowField& field) {
  if (field.dictionary_encoded) {
    ArrowField values = field;
    values.dictionary_encoded = false;
    return str("dictionary<values=", arrow_type_name(values), ", indices=", field.index_signed ? "int" : "uint",
               field.index_bit_width, ">");
  }
  const auto child = [&](size_t i) { return i < field.children.size() ? arrow_type_name(field.children[i]) : "?"; };
  switch (field.type) {
    case ArrowTypeId::Null: return "null";
    case ArrowTypeId::Int: return str(field.is_signed ? "int" : "uint", field.bit_width);
    case ArrowTypeId::FloatingPoint: return field.precision == 0 ? "halffloat" : field.precision == 1 ? "float" : "double";
    case ArrowTypeId::Binary: return "binary";
    case ArrowTypeId::Utf8: return "string";
    case ArrowTypeId::Bool: return "bool";
    case ArrowTypeId::Decimal: return str("decimal", field.bit_width, "(", field.precision, ", ", field.scale, ")");
    case ArrowTypeId::Date: return field.unit == 0 ? "date32[day]" : "date64[ms]";
    case ArrowTypeId::Time: return str("time", field.bit_width, "[", time_unit_name(field.unit), "]");
    case ArrowTypeId::Timestamp:
      return str("timestamp[", time_unit_name(field.unit), field.timezone.empty() ? "" : ", tz=", field.timezone, "]");
    case ArrowTypeId::Interval: return "interval";
    case ArrowTypeId::List: return str("list<", child(0), ">");
    case ArrowTypeId::Struct: {
      std::string out = "struct<";
      for (size_t i = 0; i < field.children.size(); ++i)
        out += str(i == 0 ? "" : ", ", field.children[i].name, ": ", child(i));
      return out + ">";
    }
    case ArrowTypeId::Union: return field.dense_union ? "dense_union" : "sparse_union";
    case ArrowTypeId::FixedSizeBinary: return str("fixed_size_binary[", field.fixed_size, "]");
    case ArrowTypeId::FixedSizeList: return str("fixed_size_list<", child(0), ">[", field.fixed_size, "]");
    case ArrowTypeId::Map: {  // its entries: struct<key, value>
      const ArrowField* entries = field.children.empty() ? nullptr : &field.children[0];
      if (entries == nullptr || entries->type != ArrowTypeId::Struct || entries->children.size() != 2) return "map";
      return str("map<", arrow_type_name(entries->children[0]), ", ", arrow_type_name(entries->children[1]), ">");
    }
    case ArrowTypeId::Duration: return str("duration[", time_unit_name(field.unit), "]");
    case ArrowTypeId::LargeBinary: return "large_binary";
    case ArrowTypeId::LargeUtf8: return "large_string";
    case ArrowTypeId::LargeList: return str("large_list<", child(0), ">");
    case ArrowTypeId::RunEndEncoded: return "run_end_encoded";
    case ArrowTypeId::BinaryView: return "binary_view";
    case ArrowTypeId::Utf8View: return "string_view";
    case ArrowTypeId::ListView: return "list_view";
    case ArrowTypeId::LargeListView: return "large_list_view";
    case ArrowTypeId::None: break;
  }
  return "none";
}

bool is_arrow_file_start(const std::byte* head, size_t n) { return n >= 6 && std::memcmp(head, kFileMagic, 6) == 0; }

bool is_arrow_stream_start(const std::byte* head, size_t n) {
  return n >= 8 && load_i32(head) == -1 && load_i32(head + 4) > 0;
}

namespace {

// Where each field's own buffers begin in `batch`, a batch of `fields` (see the header).
std::vector<int> field_buffers(const std::vector<ArrowField>& fields, int node_count, bool v4, const ArrowBatch& batch,
                               const std::string& path) {
  std::vector<int> first(static_cast<size_t>(node_count), 0);
  // Counted in int64 and held within the batch's buffers field by field: view fields' variadic
  // counts could otherwise add up past any int and wrap back to a count that fits.
  const auto buffers = static_cast<int64_t>(batch.buffers.size());
  int64_t buffer = 0;
  size_t view = 0;
  const auto too_many = [&] {
    throw FormatError(str(path, ": the batch at byte ", batch.message_offset, " has ", buffers,
                          " buffers, fewer than its fields have"));
  };
  const auto walk = [&](const auto& self, const std::vector<ArrowField>& level) -> void {
    for (const ArrowField& f : level) {
      first[static_cast<size_t>(f.node)] = static_cast<int>(buffer);
      if (f.dictionary_encoded) {  // validity and indices
        buffer += 2;
        if (buffer > buffers) too_many();
        continue;
      }
      buffer += own_buffers(f, v4);
      if (f.type == ArrowTypeId::BinaryView || f.type == ArrowTypeId::Utf8View) {
        const int64_t extra = view < batch.variadic_buffer_counts.size() ? batch.variadic_buffer_counts[view] : -1;
        MMT_CHECK(extra >= 0 && extra <= buffers, FormatError, path, ": the batch at byte ", batch.message_offset,
                  " has no valid variadic buffer count for view field '", cut_for_message(f.name, 100), "'");
        buffer += extra;
        ++view;
      }
      if (buffer > buffers) too_many();
      self(self, f.children);
    }
  };
  walk(walk, fields);
  MMT_CHECK(buffer == buffers && view == batch.variadic_buffer_counts.size(),
            FormatError, path, ": the batch at byte ", batch.message_offset, " has ", batch.buffers.size(),
            " buffers, where its fields have ", buffer);
  return first;
}

// A RecordBatch table (a record batch, or a dictionary batch's data) of `fields`, its body
// [body_start, body_start + body) in the file.
ArrowBatch read_batch(const FlatTable& header, const std::string& where, int64_t message_offset, int64_t body_start,
                      int64_t body, const std::vector<ArrowField>& fields, int node_count, bool v4,
                      const std::string& path) {
  ArrowBatch batch;
  batch.message_offset = message_offset;
  batch.rows = header.scalar<int64_t>(0, 0);
  MMT_CHECK(batch.rows >= 0, FormatError, where, ": a batch of ", batch.rows, " rows");
  const FlatVector nodes = header.vector(1, 16, "the batch's nodes");
  const FlatVector buffers = header.vector(2, 16, "the batch's buffers");
  MMT_CHECK(nodes.count == static_cast<uint32_t>(node_count), FormatError, where, ": a batch of ", nodes.count,
            " field nodes, where its fields have ", node_count);
  for (uint32_t i = 0; i < nodes.count; ++i) {
    const ArrowBatch::Node node{header.element<int64_t>(nodes, i, 0), header.element<int64_t>(nodes, i, 8)};
    MMT_CHECK(node.length >= 0 && node.null_count >= 0 && node.null_count <= node.length, FormatError, where,
              ": field node ", i, " has length ", node.length, " and ", node.null_count, " nulls");
    batch.nodes.push_back(node);
  }
  for (const ArrowField& f : fields)
    MMT_CHECK(batch.nodes[static_cast<size_t>(f.node)].length == batch.rows, FormatError, where, ": column '",
              cut_for_message(f.name, 100), "' has ", batch.nodes[static_cast<size_t>(f.node)].length,
              " values in a batch of ", batch.rows, " rows");
  for (uint32_t i = 0; i < buffers.count; ++i) {
    const ArrowBatch::Buffer buffer{header.element<int64_t>(buffers, i, 0), header.element<int64_t>(buffers, i, 8)};
    MMT_CHECK(buffer.offset >= 0 && buffer.length >= 0 && buffer.offset <= body && buffer.length <= body - buffer.offset,
              FormatError, where, ": buffer ", i, " (", buffer.length, " bytes at body byte ", buffer.offset,
              ") lies outside the ", body, "-byte body");
    batch.buffers.push_back({body_start + buffer.offset, buffer.length});
  }
  const FlatVector variadic = header.vector(4, 8, "the batch's variadic buffer counts");
  for (uint32_t i = 0; i < variadic.count; ++i) batch.variadic_buffer_counts.push_back(header.element<int64_t>(variadic, i));
  (void)field_buffers(fields, node_count, v4, batch, path);  // the buffers fit the fields
  if (const std::optional<FlatTable> compression = header.table(3, "the batch's compression")) {
    const int codec = compression->scalar<int8_t>(0, 0);
    MMT_CHECK(codec == 0 || codec == 1, ValueError, where, ": a body compressed with codec ", codec,
              "; Arrow's are LZ4_FRAME (0) and ZSTD (1)");
    MMT_CHECK(compression->scalar<int8_t>(1, 0) == 0, ValueError, where,
              ": a body compressed by a method other than BUFFER");
    batch.codec = codec;  // decompressed once the file is read, into one scratch file for it
  }
  return batch;
}

// The dictionary-encoded fields, by dictionary id (fields may share one).
// A dictionary's values may not be dictionary-encoded in turn (no packer field reads such a
// column, and copying nested dictionaries' value types would multiply the schema's size).
void encoded_fields(const std::vector<ArrowField>& fields, std::map<int64_t, const ArrowField*>& out,
                    const std::string& where, bool inside_dictionary = false) {
  for (const ArrowField& f : fields) {
    if (f.dictionary_encoded) {
      MMT_CHECK(!inside_dictionary, ValueError, where, ": field '", cut_for_message(f.name, 100),
                "' is dictionary-encoded inside a dictionary's values, which this reader does not take");
      out.emplace(f.dictionary_id, &f);
    }
    encoded_fields(f.children, out, where, inside_dictionary || f.dictionary_encoded);
  }
}

}  // namespace

std::vector<int> arrow_field_buffers(const ArrowIpc& ipc, const ArrowBatch& batch) {
  return field_buffers(ipc.fields, ipc.node_count, ipc.metadata_v4, batch, ipc.path);
}

std::vector<int> arrow_field_buffers(const ArrowIpc& ipc, const ArrowDictionary& dictionary) {
  return field_buffers(*dictionary.value, dictionary.node_count, ipc.metadata_v4, dictionary.batch, ipc.path);
}

ArrowIpc read_arrow_ipc(const std::string& path) {
  InputFile input = map_input_file(path);  // IoError naming a missing file or a folder
  ArrowIpc ipc;
  ipc.path = path;
  const auto size = static_cast<int64_t>(input.bytes.size());
  MMT_CHECK(size > 0, FormatError, path, ": an empty file, not an Arrow IPC file or stream");
  ipc.file = std::move(input.mapping);
  const std::byte* bytes = input.bytes.data();
  guard_storage_reads(ipc.file, [&] {
    // Dictionary id -> its values' field and their node count, from the schema.
    std::map<int64_t, std::pair<std::shared_ptr<const std::vector<ArrowField>>, int>> dictionaries_of;
    const auto read_schema = [&](const FlatTable& schema, const std::string& where, int64_t length) {
      MMT_CHECK(schema.scalar<int16_t>(0, 0) == 0, ValueError, path, ": big-endian Arrow data; write it again on a "
                "little-endian machine, or convert it first");
      SchemaReader reader{where, length};
      const FlatVector fields = schema.vector(1, 4, "the schema's fields");
      for (uint32_t i = 0; i < fields.count; ++i)
        ipc.fields.push_back(reader.field(schema.table_in(fields, i, "a field"), 0));
      ipc.metadata = reader.key_values(schema, 2);
      number_nodes(ipc.fields, ipc.node_count);
      std::map<int64_t, const ArrowField*> encoded;
      encoded_fields(ipc.fields, encoded, where);
      for (const auto& [id, field] : encoded) {  // each id's values, laid out as a batch of one field
        auto value = std::make_shared<std::vector<ArrowField>>(1, *field);
        value->front().dictionary_encoded = false;
        int nodes = 0;
        number_nodes(*value, nodes);
        dictionaries_of[id] = {std::move(value), nodes};
      }
    };
    const auto check_version = [&](int16_t version, const std::string& where) {
      MMT_CHECK(version == kMetadataV4 || version == kMetadataV5, ValueError, where, ": metadata version V",
                version + 1, version < kMetadataV4 ? " (Arrow before 0.8); write it again with a newer Arrow"
                                                   : ", newer than this reader's V5");
    };
    // The message at `start`: its framing (0xFFFFFFFF and an int32 length, or the length alone
    // before Arrow 0.15), its metadata within [start, metadata_end), its body from `body_start`
    // (the metadata's end when < 0) within `end`. `expected`: the message type a file's block
    // lists (0: any). Returns where the message ends, or -1 at an end-of-stream marker.
    bool schema_read = false, message_version_read = false;
    const auto read_message = [&](int64_t start, int64_t metadata_end, int64_t body_start, int64_t end,
                                  uint8_t expected, int64_t expected_body) -> int64_t {
      const std::string where = str(path, ": the Arrow message at byte ", start);
      int64_t position = start;
      MMT_CHECK(metadata_end - position >= 4, FormatError, where, " is cut short (", metadata_end - position,
                " bytes left)");
      int32_t length = load_i32(bytes + position);
      position += 4;
      if (length == -1) {  // today's framing: the continuation marker, then the length
        MMT_CHECK(metadata_end - position >= 4, FormatError, where, " is cut short after its continuation marker");
        length = load_i32(bytes + position);
        position += 4;
      }
      if (length == 0 && expected == 0) return -1;  // end of stream
      MMT_CHECK(length > 0 && length <= metadata_end - position, FormatError, where, " declares ", length,
                " bytes of metadata, but ", metadata_end - position, " are left", length > 0 ? " (cut short?)" : "");
      const std::span<const std::byte> metadata(bytes + position, static_cast<size_t>(length));
      position += length;
      if (body_start < 0) body_start = position;
      const FlatTable message = FlatTable::root(metadata, where);
      const int16_t version = message.scalar<int16_t>(0, 0);
      check_version(version, where);
      // The messages' version (unions' buffers differ in V4), one for them all. A file's
      // footer is V5 whatever its messages are (Arrow C++ writes it so), and is not compared.
      if (!message_version_read) {
        ipc.metadata_v4 = version == kMetadataV4;
        message_version_read = true;
      }
      MMT_CHECK((version == kMetadataV4) == ipc.metadata_v4, FormatError, where, ": metadata version V", version + 1,
                ", where the messages before it are V", ipc.metadata_v4 ? 4 : 5);
      const auto header_type = message.scalar<uint8_t>(1, 0);
      const int64_t body = message.scalar<int64_t>(3, 0);
      MMT_CHECK(expected_body < 0 || body == expected_body, FormatError, where, ": a body of ", body,
                " bytes, where the file's footer states ", expected_body);
      MMT_CHECK(body >= 0 && body <= end - body_start, FormatError, where, ": a body of ", body, " bytes, but ",
                end - body_start, " are left", body >= 0 ? " (cut short?)" : "");
      const std::optional<FlatTable> header = message.table(2, "the message's header");
      MMT_CHECK(header.has_value(), FormatError, where, ": a message without its header");
      MMT_CHECK(expected == 0 || header_type == expected, FormatError, where, ": message type ",
                static_cast<int>(header_type), " where the file's footer lists a ",
                expected == kDictionaryBatchMessage ? "DictionaryBatch" : "RecordBatch");
      if (!schema_read) {
        MMT_CHECK(header_type == kSchemaMessage, FormatError, where, ": the first message is not a Schema (message "
                  "type ", static_cast<int>(header_type), "); is this an Arrow IPC stream?");
        read_schema(*header, where, length);
        schema_read = true;
        return body_start + body;
      }
      if (header_type == kDictionaryBatchMessage) {
        MMT_CHECK(!dictionaries_of.empty(), FormatError, where, ": a DictionaryBatch, but no field is dictionary-encoded");
        ArrowDictionary dictionary;
        dictionary.id = header->scalar<int64_t>(0, 0);
        dictionary.delta = header->scalar<uint8_t>(2, 0) != 0;
        // A file's dictionaries hold for all its batches, wherever they lie (the format lets a
        // file give them after the batches that use them); a stream's for the batches after.
        dictionary.batches_before = ipc.file_format ? 0 : ipc.batches.size();
        const auto encoded = dictionaries_of.find(dictionary.id);
        MMT_CHECK(encoded != dictionaries_of.end(), FormatError, where, ": a DictionaryBatch of id ", dictionary.id,
                  ", which no field's dictionary encoding names");
        dictionary.value = encoded->second.first;
        dictionary.node_count = encoded->second.second;
        const std::optional<FlatTable> data = header->table(1, "the dictionary's data");
        MMT_CHECK(data.has_value(), FormatError, where, ": a DictionaryBatch without its data");
        dictionary.batch = read_batch(*data, where, start, body_start, body, *dictionary.value, dictionary.node_count,
                                      ipc.metadata_v4, path);
        // A file's dictionaries are given once, before its record batches (deltas aside).
        MMT_CHECK(!ipc.file_format || dictionary.delta ||
                      std::none_of(ipc.dictionaries.begin(), ipc.dictionaries.end(),
                                   [&](const ArrowDictionary& d) { return d.id == dictionary.id; }),
                  FormatError, where, ": a second dictionary of id ", dictionary.id, " in an Arrow file, which "
                  "replaces none (only streams replace dictionaries)");
        ipc.dictionaries.push_back(std::move(dictionary));
        return body_start + body;
      }
      MMT_CHECK(header_type == kRecordBatchMessage, FormatError, where, ": message type ",
                static_cast<int>(header_type), header_type == kSchemaMessage ? " (a second Schema)" : "",
                " where record batches are expected");
      ipc.batches.push_back(read_batch(*header, where, start, body_start, body, ipc.fields, ipc.node_count,
                                       ipc.metadata_v4, path));
      return body_start + body;
    };

    if (!is_arrow_file_start(bytes, static_cast<size_t>(size))) {  // a stream: its messages in order
      for (int64_t position = 0; position != size;) {  // a stream may end between messages
        position = read_message(position, size, -1, size, 0, -1);
        if (position < 0) break;
      }
      MMT_CHECK(schema_read, FormatError, path, ": an Arrow stream with no Schema message");
      return;
    }
    // A file: "ARROW1", 2 bytes of padding, the stream, the footer, its int32 length, "ARROW1".
    // As Arrow's own readers do, the footer is read, not the stream: it holds the schema and
    // where each dictionary and record batch lies (a Block: offset, metadata length, body
    // length; Arrow JS writes no Schema message before them).
    ipc.file_format = true;
    MMT_CHECK(size >= 8 + 10 && std::memcmp(bytes + size - 6, kFileMagic, 6) == 0, FormatError, path,
              ": begins as an Arrow IPC file but does not end with one's \"ARROW1\" (",
              size, " bytes: cut short, or still being written)");
    const int32_t footer_length = load_i32(bytes + size - 10);
    MMT_CHECK(footer_length > 0 && footer_length <= size - 18, FormatError, path, ": its footer's length (",
              footer_length, ") does not fit the file's ", size, " bytes");
    const int64_t footer_start = size - 10 - footer_length;
    const std::string footer_where = str(path, ": the Arrow file's footer at byte ", footer_start);
    const FlatTable footer = FlatTable::root(
        std::span<const std::byte>(bytes + footer_start, static_cast<size_t>(footer_length)), footer_where);
    check_version(footer.scalar<int16_t>(0, 0), footer_where);
    const std::optional<FlatTable> schema = footer.table(1, "the footer's schema");
    MMT_CHECK(schema.has_value(), FormatError, footer_where, ": no schema");
    read_schema(*schema, footer_where, footer_length);
    schema_read = true;
    struct Block {
      int64_t offset, metadata, body;
      uint8_t type;
      uint32_t index;
    };
    std::vector<Block> blocks;
    for (const auto& [slot, type] : {std::pair{2, kDictionaryBatchMessage}, std::pair{3, kRecordBatchMessage}}) {
      const FlatVector listed = footer.vector(slot, 24, "the footer's blocks");  // struct Block, 24 bytes
      for (uint32_t i = 0; i < listed.count; ++i) {
        const Block block{footer.element<int64_t>(listed, i, 0), footer.element<int32_t>(listed, i, 8),
                          footer.element<int64_t>(listed, i, 16), type, i};
        MMT_CHECK(block.offset >= 8 && block.offset < footer_start && block.metadata > 0 &&
                      block.metadata <= footer_start - block.offset && block.body >= 0 &&
                      block.body <= footer_start - block.offset - block.metadata,
                  FormatError, footer_where, ": its ", type == kRecordBatchMessage ? "record batch" : "dictionary", " ",
                  i, " (", block.metadata, " bytes of metadata and ", block.body, " of body at byte ", block.offset,
                  ") lies outside the file's ", footer_start, " bytes of messages");
        blocks.push_back(block);
      }
    }
    // Each message once: blocks that overlap (a footer listing one batch many times would make
    // a few bytes of footer stand for any number of rows, and of decompressions) are refused.
    std::vector<const Block*> by_offset;
    for (const Block& block : blocks) by_offset.push_back(&block);
    std::sort(by_offset.begin(), by_offset.end(), [](const Block* a, const Block* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); ++k) {
      const Block& before = *by_offset[k - 1];
      const Block& block = *by_offset[k];
      const auto name = [](const Block& b) {
        return str(b.type == kRecordBatchMessage ? "record batch " : "dictionary ", b.index, " (at byte ", b.offset, ")");
      };
      MMT_CHECK(block.offset >= before.offset + before.metadata + before.body, FormatError, footer_where, ": its ",
                name(block), " overlaps its ", name(before));
    }
    for (const Block& block : blocks)
      read_message(block.offset, block.offset + block.metadata, block.offset + block.metadata,
                   block.offset + block.metadata + block.body, block.type, block.body);
  });
  // Compressed batches: each buffer is an int64 uncompressed length (-1: stored as is) and
  // its compressed bytes. Decompressed into one file, each buffer at a 64-byte boundary.
  std::vector<ArrowBatch*> compressed;
  for (ArrowBatch& batch : ipc.batches)
    if (batch.codec >= 0) compressed.push_back(&batch);
  for (ArrowDictionary& dictionary : ipc.dictionaries)
    if (dictionary.batch.codec >= 0) compressed.push_back(&dictionary.batch);
  if (!compressed.empty()) {
    // What the buffers state, checked before anything is written: a zstd frame of a few bytes
    // may stand for a terabyte of zeros. Held to decode_limit() of the file, or to the scratch
    // budget where that is more (columns of one value legitimately compress past 1024 times).
    const int64_t limit = std::max(decode_limit(size), DecompressedFiles::scratch_budget());
    int64_t stated_total = 0;
    for (const ArrowBatch* batch : compressed)
      for (const ArrowBatch::Buffer& buffer : batch->buffers) {
        if (buffer.length < 8) continue;  // refused below
        const int64_t stated = guard_storage_reads(ipc.file, [&] { return load_i64(ipc.file.data() + buffer.offset); });
        const int64_t bytes = stated == -1 ? buffer.length - 8 : stated;
        if (bytes <= 0 || bytes > (int64_t{1} << 40)) continue;  // a stated size out of range: refused below
        if (__builtin_add_overflow(stated_total, bytes, &stated_total)) stated_total = INT64_MAX;
      }
    MMT_CHECK(stated_total <= limit, ValueError, path, ": its compressed batches state ", stated_total,
              " decompressed bytes, more than both ", kDecodeExpansion, " times the file's bytes (at least ",
              decode_limit(0), ") and the scratch budget (MMT_SCRATCH_BYTES, else half the free space of the ",
              "scratch folder): ", limit, "; refused as a decompression bomb (set MMT_SCRATCH_BYTES to allow more)");
    ScratchFile scratch(path, "to decompress its compressed record batches into");
    const std::byte zeros[64] = {};
    for (ArrowBatch* each : compressed) {
      ArrowBatch& batch = *each;
      batch.decompressed = true;
      BufferDecompressor decompressor(path, batch.codec);
      const std::string where = str(path, ": the batch at byte ", batch.message_offset);
      for (size_t i = 0; i < batch.buffers.size(); ++i) {
        ArrowBatch::Buffer& buffer = batch.buffers[i];
        if (scratch.size() % 64 != 0) scratch.append(zeros, 64 - scratch.size() % 64);
        const int64_t at = scratch.size();
        if (buffer.length == 0) {
          buffer.offset = at;
          continue;
        }
        const std::string buffer_where = str(where, ", buffer ", i);
        MMT_CHECK(buffer.length >= 8, FormatError, buffer_where, ": ", buffer.length,
                  " bytes, too few for a compressed buffer's length");
        guard_storage_reads(ipc.file, [&] {
          const std::byte* data = ipc.file.data() + buffer.offset;
          const int64_t stated = load_i64(data);
          if (stated == -1) {
            scratch.append(data + 8, buffer.length - 8);
            buffer.length -= 8;
          } else {
            MMT_CHECK(stated >= 0 && stated <= (int64_t{1} << 40), FormatError, buffer_where, ": states ", stated,
                      " decompressed bytes");
            decompressor.run(data + 8, buffer.length - 8, stated, scratch, buffer_where);
            buffer.length = stated;
          }
        });
        buffer.offset = at;
      }
    }
    ipc.decompressed = scratch.map(str(path, " (record batches decompressed into a temporary file in ",
                                       scratch.folder().string(), ")"));
  }
  return ipc;
}

}  // namespace mmt::detail
