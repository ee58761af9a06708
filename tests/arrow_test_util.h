// Writes Apache Arrow IPC streams and files for the tests, as pyarrow lays them out
// (arrow_ipc.h gives the format): FlatBuffers metadata built here by hand, buffers padded to
// 8 bytes, bodies optionally compressed (LZ4_FRAME or ZSTD, each buffer prefixed with its
// int64 length). Columns are built with the helpers below, one batch at a time.
#pragma once

#include <lz4frame.h>
#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace mmt::testutil::arrow {

// ---- a FlatBuffers builder: tables, strings and vectors, laid out front to back ------------
struct Fb;
using FbPtr = std::shared_ptr<Fb>;
struct Fb {
  enum class Kind { Table, String, Tables, Strings, Structs } kind = Kind::Table;
  std::map<int, std::variant<std::vector<uint8_t>, FbPtr>> fields;  // Table: slot -> scalar bytes or child
  std::string text;                                                  // String
  std::vector<FbPtr> items;                                          // Tables, Strings (as String Fbs)
  std::vector<uint8_t> raw;                                          // Structs: the elements' bytes
  uint32_t count = 0;                                                // Structs: how many
};

template <class T>
std::vector<uint8_t> bytes_of(T value) {
  std::vector<uint8_t> out(sizeof(T));
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}
inline FbPtr table() { return std::make_shared<Fb>(); }
inline FbPtr string(std::string text) {
  auto s = std::make_shared<Fb>();
  s->kind = Fb::Kind::String;
  s->text = std::move(text);
  return s;
}
inline FbPtr tables(std::vector<FbPtr> items) {
  auto v = std::make_shared<Fb>();
  v->kind = Fb::Kind::Tables;
  v->items = std::move(items);
  return v;
}
inline FbPtr structs(std::vector<uint8_t> raw, uint32_t count) {
  auto v = std::make_shared<Fb>();
  v->kind = Fb::Kind::Structs;
  v->raw = std::move(raw);
  v->count = count;
  return v;
}
template <class T>
void set(const FbPtr& t, int slot, T value) {
  t->fields[slot] = bytes_of(value);
}
inline void set_child(const FbPtr& t, int slot, FbPtr child) { t->fields[slot] = std::move(child); }

class FbWriter {
 public:
  // The buffer of `root`, its first 4 bytes the root offset.
  static std::vector<uint8_t> finish(const FbPtr& root) {
    FbWriter w;
    w.out_.resize(4);
    w.pending_.push_back({0, root});
    while (!w.pending_.empty()) {
      auto [at, node] = w.pending_.front();
      w.pending_.erase(w.pending_.begin());
      const uint32_t position = w.write(node);
      const uint32_t offset = position - at;
      std::memcpy(w.out_.data() + at, &offset, 4);
    }
    while (w.out_.size() % 8 != 0) w.out_.push_back(0);
    return w.out_;
  }

 private:
  void align(size_t n) {
    while (out_.size() % n != 0) out_.push_back(0);
  }
  uint32_t write(const FbPtr& node) {
    switch (node->kind) {
      case Fb::Kind::String: {
        align(4);
        const auto at = static_cast<uint32_t>(out_.size());
        const auto n = static_cast<uint32_t>(node->text.size());
        append(&n, 4);
        append(node->text.data(), n);
        out_.push_back(0);
        return at;
      }
      case Fb::Kind::Structs: {
        // The elements (8-byte fields) follow the count at an 8-byte boundary.
        while ((out_.size() + 4) % 8 != 0) out_.push_back(0);
        const auto at = static_cast<uint32_t>(out_.size());
        append(&node->count, 4);
        append(node->raw.data(), node->raw.size());
        return at;
      }
      case Fb::Kind::Tables:
      case Fb::Kind::Strings: {
        align(4);
        const auto at = static_cast<uint32_t>(out_.size());
        const auto n = static_cast<uint32_t>(node->items.size());
        append(&n, 4);
        for (const FbPtr& item : node->items) {
          pending_.push_back({static_cast<uint32_t>(out_.size()), item});
          append("\0\0\0\0", 4);
        }
        return at;
      }
      case Fb::Kind::Table: break;
    }
    // The vtable, then the table: its soffset, then its fields, each at its own alignment.
    int slots = 0;
    for (const auto& [slot, value] : node->fields) slots = std::max(slots, slot + 1);
    // Lay the fields out first, to know the table's size.
    std::vector<std::pair<int, uint16_t>> placed;
    size_t size = 4;
    for (const auto& [slot, value] : node->fields) {
      const size_t n = std::holds_alternative<FbPtr>(value) ? 4 : std::get<std::vector<uint8_t>>(value).size();
      while (size % n != 0) ++size;
      placed.push_back({slot, static_cast<uint16_t>(size)});
      size += n;
    }
    align(2);
    const auto vtable = static_cast<uint32_t>(out_.size());
    const auto vtable_bytes = static_cast<uint16_t>(4 + 2 * slots);
    const auto table_bytes = static_cast<uint16_t>(size);
    append(&vtable_bytes, 2);
    append(&table_bytes, 2);
    std::vector<uint16_t> offsets(static_cast<size_t>(slots), 0);
    for (const auto& [slot, at] : placed) offsets[static_cast<size_t>(slot)] = at;
    append(offsets.data(), offsets.size() * 2);
    align(8);
    const auto table_at = static_cast<uint32_t>(out_.size());
    const int32_t to_vtable = static_cast<int32_t>(table_at) - static_cast<int32_t>(vtable);
    out_.resize(table_at + size, 0);
    std::memcpy(out_.data() + table_at, &to_vtable, 4);
    size_t i = 0;
    for (const auto& [slot, value] : node->fields) {
      const uint16_t at = placed[i++].second;
      if (std::holds_alternative<FbPtr>(value)) {
        pending_.push_back({table_at + at, std::get<FbPtr>(value)});
      } else {
        const auto& b = std::get<std::vector<uint8_t>>(value);
        std::memcpy(out_.data() + table_at + at, b.data(), b.size());
      }
    }
    return table_at;
  }
  void append(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t> out_;
  std::vector<std::pair<uint32_t, FbPtr>> pending_;
};

// ---- Arrow columns ----------------------------------------------------------------------------
// Type codes (Schema.fbs's Type union).
enum TypeId : uint8_t {
  kNull = 1, kInt = 2, kFloatingPoint = 3, kBinary = 4, kUtf8 = 5, kBool = 6, kDecimal = 7, kTimestamp = 10,
  kInterval = 11,
  kList = 12, kStruct = 13, kFixedSizeBinary = 15, kFixedSizeList = 16, kLargeBinary = 19, kLargeUtf8 = 20,
  kMap = 17, kLargeList = 21, kBinaryView = 23, kUtf8View = 24,
};

// One column (a field and its arrays) of one batch.
struct Column {
  std::string name;
  uint8_t type = kInt;
  FbPtr type_table;  // the type's parameters
  std::vector<Column> children;
  int64_t length = 0, null_count = 0;
  std::vector<std::vector<uint8_t>> buffers;  // its own
  int64_t data_buffers = -1;  // binary_view/string_view: its buffers past the views (the batch's variadic count)
  // Dictionary-encoded: the type (and children) are the values', the buffers the indices'.
  bool dictionary = false;
  int64_t dictionary_id = 0;
  int index_bits = 32;
  bool index_signed = true;
};

// A validity bitmap for `valid` (empty: every value valid, and no bitmap written).
inline std::vector<uint8_t> validity(const std::vector<bool>& valid, int64_t& nulls) {
  nulls = 0;
  if (valid.empty()) return {};
  std::vector<uint8_t> bits((valid.size() + 7) / 8, 0);
  for (size_t i = 0; i < valid.size(); ++i) {
    if (valid[i]) bits[i / 8] |= static_cast<uint8_t>(1 << (i % 8));
    else ++nulls;
  }
  return bits;
}

template <class T>
Column numbers(std::string name, const std::vector<T>& values, const std::vector<bool>& valid = {}) {
  Column c;
  c.name = std::move(name);
  c.type_table = table();
  if constexpr (std::is_floating_point_v<T>) {
    c.type = kFloatingPoint;
    set<int16_t>(c.type_table, 0, sizeof(T) == 4 ? 1 : 2);
  } else {
    c.type = kInt;
    set<int32_t>(c.type_table, 0, static_cast<int32_t>(8 * sizeof(T)));
    set<uint8_t>(c.type_table, 1, std::is_signed_v<T> ? 1 : 0);
  }
  c.length = static_cast<int64_t>(values.size());
  c.buffers.push_back(validity(valid, c.null_count));
  c.buffers.emplace_back(reinterpret_cast<const uint8_t*>(values.data()),
                         reinterpret_cast<const uint8_t*>(values.data() + values.size()));
  return c;
}

inline Column bools(std::string name, const std::vector<bool>& values, const std::vector<bool>& valid = {}) {
  Column c;
  c.name = std::move(name);
  c.type = kBool;
  c.type_table = table();
  c.length = static_cast<int64_t>(values.size());
  c.buffers.push_back(validity(valid, c.null_count));
  int64_t unused = 0;
  c.buffers.push_back(validity(values, unused));
  if (values.empty()) c.buffers.back().clear();
  return c;
}

// binary (utf8 = false) or string; large: 64-bit offsets.
inline Column texts(std::string name, const std::vector<std::string>& values, const std::vector<bool>& valid = {},
                    bool utf8 = true, bool large = false) {
  Column c;
  c.name = std::move(name);
  c.type = large ? (utf8 ? kLargeUtf8 : kLargeBinary) : (utf8 ? kUtf8 : kBinary);
  c.type_table = table();
  c.length = static_cast<int64_t>(values.size());
  c.buffers.push_back(validity(valid, c.null_count));
  std::vector<uint8_t> offsets, data;
  int64_t at = 0;
  const auto put = [&](int64_t v) {
    if (large) {
      const auto b = bytes_of<int64_t>(v);
      offsets.insert(offsets.end(), b.begin(), b.end());
    } else {
      const auto b = bytes_of<int32_t>(static_cast<int32_t>(v));
      offsets.insert(offsets.end(), b.begin(), b.end());
    }
  };
  put(0);
  for (const std::string& v : values) {
    data.insert(data.end(), v.begin(), v.end());
    at += static_cast<int64_t>(v.size());
    put(at);
  }
  c.buffers.push_back(std::move(offsets));
  c.buffers.push_back(std::move(data));
  return c;
}

// binary_view (utf8 = false) or string_view, as Polars writes its strings: each value a
// 16-byte view, its length and, up to 12 bytes, the string inline; past that, its first 4
// bytes, the data buffer it lies in and its offset there. A data buffer holds up to
// `buffer_bytes` (a longer string takes one of its own).
inline Column string_views(std::string name, const std::vector<std::string>& values, const std::vector<bool>& valid = {},
                           bool utf8 = true, size_t buffer_bytes = 64) {
  Column c;
  c.name = std::move(name);
  c.type = utf8 ? kUtf8View : kBinaryView;
  c.type_table = table();
  c.length = static_cast<int64_t>(values.size());
  c.buffers.push_back(validity(valid, c.null_count));
  std::vector<uint8_t> views;
  std::vector<std::vector<uint8_t>> data;
  for (const std::string& v : values) {
    uint8_t view[16] = {};
    const auto length = static_cast<int32_t>(v.size());
    std::memcpy(view, &length, 4);
    if (v.size() <= 12) {
      std::memcpy(view + 4, v.data(), v.size());
    } else {
      if (data.empty() || data.back().size() + v.size() > buffer_bytes) data.emplace_back();
      const auto index = static_cast<int32_t>(data.size() - 1);
      const auto offset = static_cast<int32_t>(data.back().size());
      std::memcpy(view + 4, v.data(), 4);
      std::memcpy(view + 8, &index, 4);
      std::memcpy(view + 12, &offset, 4);
      data.back().insert(data.back().end(), v.begin(), v.end());
    }
    views.insert(views.end(), view, view + 16);
  }
  c.buffers.push_back(std::move(views));
  c.data_buffers = static_cast<int64_t>(data.size());
  for (std::vector<uint8_t>& d : data) c.buffers.push_back(std::move(d));
  return c;
}

inline Column fixed_binary(std::string name, int32_t width, const std::vector<std::string>& values) {
  Column c;
  c.name = std::move(name);
  c.type = kFixedSizeBinary;
  c.type_table = table();
  set<int32_t>(c.type_table, 0, width);
  c.length = static_cast<int64_t>(values.size());
  c.buffers.emplace_back();
  std::vector<uint8_t> data;
  for (const std::string& v : values) data.insert(data.end(), v.begin(), v.end());
  c.buffers.push_back(std::move(data));
  return c;
}

// A list column over `child` (its values), the lists cut at `offsets` (lists + 1 entries).
inline Column list(std::string name, Column child, const std::vector<int64_t>& offsets,
                   const std::vector<bool>& valid = {}, bool large = false) {
  Column c;
  c.name = std::move(name);
  c.type = large ? kLargeList : kList;
  c.type_table = table();
  c.length = static_cast<int64_t>(offsets.size()) - 1;
  c.buffers.push_back(validity(valid, c.null_count));
  std::vector<uint8_t> packed;
  for (int64_t o : offsets) {
    const auto b = large ? bytes_of<int64_t>(o) : bytes_of<int32_t>(static_cast<int32_t>(o));
    packed.insert(packed.end(), b.begin(), b.end());
  }
  c.buffers.push_back(std::move(packed));
  child.name = "item";
  c.children.push_back(std::move(child));
  return c;
}

inline Column fixed_list(std::string name, Column child, int32_t size, int64_t lists, const std::vector<bool>& valid = {}) {
  Column c;
  c.name = std::move(name);
  c.type = kFixedSizeList;
  c.type_table = table();
  set<int32_t>(c.type_table, 0, size);
  c.length = lists;
  c.buffers.push_back(validity(valid, c.null_count));
  child.name = "item";
  c.children.push_back(std::move(child));
  return c;
}

inline Column structure(std::string name, std::vector<Column> children, int64_t length, const std::vector<bool>& valid = {}) {
  Column c;
  c.name = std::move(name);
  c.type = kStruct;
  c.type_table = table();
  c.length = length;
  c.buffers.push_back(validity(valid, c.null_count));
  c.children = std::move(children);
  return c;
}

// A map column: lists (cut at `offsets`) of struct<key, value> entries, Arrow's layout.
inline Column map(std::string name, Column keys, Column values, const std::vector<int64_t>& offsets,
                  const std::vector<bool>& valid = {}) {
  const int64_t entries = keys.length;
  keys.name = "key";
  values.name = "value";
  std::vector<Column> pair;
  pair.push_back(std::move(keys));
  pair.push_back(std::move(values));
  Column c = list(std::move(name), structure("entries", std::move(pair), entries), offsets, valid);
  c.type = kMap;
  c.children[0].name = "entries";
  return c;
}

// decimal(precision, scale) of `bit_width` bits (32, 64, 128, 256): each value its integer,
// little-endian two's complement (an __int128 sign-extended into a decimal256's 32 bytes).
inline Column decimals(std::string name, const std::vector<__int128>& unscaled, int32_t precision, int32_t scale,
                       int32_t bit_width = 128, const std::vector<bool>& valid = {}) {
  Column c;
  c.name = std::move(name);
  c.type = kDecimal;
  c.type_table = table();
  set<int32_t>(c.type_table, 0, precision);
  set<int32_t>(c.type_table, 1, scale);
  set<int32_t>(c.type_table, 2, bit_width);
  c.length = static_cast<int64_t>(unscaled.size());
  c.buffers.push_back(validity(valid, c.null_count));
  std::vector<uint8_t> data;
  for (const __int128 v : unscaled) {
    uint8_t bytes[32];
    std::memcpy(bytes, &v, 16);
    std::memset(bytes + 16, v < 0 ? 0xff : 0, 16);
    data.insert(data.end(), bytes, bytes + bit_width / 8);
  }
  c.buffers.push_back(std::move(data));
  return c;
}

// A type no field holds: interval[months] (4-byte values).
inline Column intervals(std::string name, int64_t length) {
  Column c;
  c.name = std::move(name);
  c.type = kInterval;
  c.type_table = table();
  set<int16_t>(c.type_table, 0, 0);  // YEAR_MONTH
  c.length = length;
  c.buffers.emplace_back();
  c.buffers.emplace_back(static_cast<size_t>(4 * length), uint8_t{0});
  return c;
}

// A dictionary-encoded column: `values_like`'s type, indices (int32, or `index_bits` wide)
// into dictionary `id`.
template <class Index = int32_t>
Column encoded(std::string name, const Column& values_like, int64_t id, const std::vector<Index>& indices,
               const std::vector<bool>& valid = {}) {
  Column c;
  c.name = std::move(name);
  c.type = values_like.type;
  c.type_table = values_like.type_table;
  c.children = values_like.children;
  c.dictionary = true;
  c.dictionary_id = id;
  c.index_bits = static_cast<int>(8 * sizeof(Index));
  c.index_signed = std::is_signed_v<Index>;
  c.length = static_cast<int64_t>(indices.size());
  c.buffers.push_back(validity(valid, c.null_count));
  c.buffers.emplace_back(reinterpret_cast<const uint8_t*>(indices.data()),
                         reinterpret_cast<const uint8_t*>(indices.data() + indices.size()));
  return c;
}

// A DictionaryBatch: dictionary `id`'s values (a column of the values' type), written before
// record batch `before` (0: before them all).
struct DictionaryWrite {
  int64_t id = 0;
  Column values;
  bool delta = false;
  size_t before = 0;
};

struct WriteOptions {
  bool file_format = false;         // "ARROW1" ... footer ... "ARROW1"
  bool legacy_framing = false;      // no continuation markers (before Arrow 0.15)
  int codec = -1;                   // -1 none, 0 LZ4_FRAME, 1 ZSTD
  bool end_marker = true;           // the end-of-stream marker
  bool schema_message = true;       // a file's Schema message (Arrow JS writes none: the footer's alone)
  bool v4_messages = false;         // messages of metadata version V4 (the footer stays V5, as Arrow C++ writes it)
  std::vector<std::pair<std::string, std::string>> metadata;  // the schema's
  std::vector<DictionaryWrite> dictionaries;
};

struct Written {
  std::vector<uint8_t> bytes;
  std::vector<size_t> message_ends;  // where each message (and its body) ends
};

namespace detail_writer {

inline FbPtr field_of(const Column& c) {
  FbPtr f = table();
  set_child(f, 0, string(c.name));
  set<uint8_t>(f, 1, 1);  // nullable
  set<uint8_t>(f, 2, c.type);
  set_child(f, 3, c.type_table);
  if (c.dictionary) {
    FbPtr encoding = table();
    set<int64_t>(encoding, 0, c.dictionary_id);
    FbPtr index = table();
    set<int32_t>(index, 0, c.index_bits);
    set<uint8_t>(index, 1, c.index_signed ? 1 : 0);
    set_child(encoding, 1, index);
    set_child(f, 4, encoding);
  }
  std::vector<FbPtr> children;
  for (const Column& child : c.children) children.push_back(field_of(child));
  set_child(f, 5, tables(std::move(children)));
  return f;
}

inline void flatten(const Column& c, std::vector<uint8_t>& nodes, uint32_t& node_count,
                    std::vector<const std::vector<uint8_t>*>& buffers, std::vector<uint8_t>& variadic) {
  auto l = bytes_of<int64_t>(c.length), n = bytes_of<int64_t>(c.null_count);
  nodes.insert(nodes.end(), l.begin(), l.end());
  nodes.insert(nodes.end(), n.begin(), n.end());
  ++node_count;
  for (const auto& b : c.buffers) buffers.push_back(&b);
  if (c.data_buffers >= 0) {
    const auto count = bytes_of<int64_t>(c.data_buffers);
    variadic.insert(variadic.end(), count.begin(), count.end());
  }
  if (c.dictionary) return;  // its children are its dictionary's values', not in the batch
  for (const Column& child : c.children) flatten(child, nodes, node_count, buffers, variadic);
}

inline std::vector<uint8_t> compress(const std::vector<uint8_t>& data, int codec) {
  std::vector<uint8_t> out = bytes_of<int64_t>(static_cast<int64_t>(data.size()));
  if (codec == 1) {
    std::vector<uint8_t> z(ZSTD_compressBound(data.size()));
    const size_t n = ZSTD_compress(z.data(), z.size(), data.data(), data.size(), 3);
    out.insert(out.end(), z.begin(), z.begin() + static_cast<std::ptrdiff_t>(n));
  } else {
    std::vector<uint8_t> z(LZ4F_compressFrameBound(data.size(), nullptr));
    const size_t n = LZ4F_compressFrame(z.data(), z.size(), data.data(), data.size(), nullptr);
    out.insert(out.end(), z.begin(), z.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

inline void message(std::vector<uint8_t>& out, uint8_t header_type, const FbPtr& header,
                    const std::vector<uint8_t>& body, const WriteOptions& options) {
  FbPtr m = table();
  set<int16_t>(m, 0, options.v4_messages ? 3 : 4);  // V4 or V5
  set<uint8_t>(m, 1, header_type);
  set_child(m, 2, header);
  set<int64_t>(m, 3, static_cast<int64_t>(body.size()));
  std::vector<uint8_t> metadata = FbWriter::finish(m);
  if (!options.legacy_framing) {
    const auto marker = bytes_of<int32_t>(-1);
    out.insert(out.end(), marker.begin(), marker.end());
  }
  // Padded so that the body starts at a multiple of 8.
  while ((out.size() + 4 + metadata.size()) % 8 != 0) metadata.push_back(0);
  const auto length = bytes_of<int32_t>(static_cast<int32_t>(metadata.size()));
  out.insert(out.end(), length.begin(), length.end());
  out.insert(out.end(), metadata.begin(), metadata.end());
  out.insert(out.end(), body.begin(), body.end());
}

}  // namespace detail_writer

// A stream (or file) of one schema (the first batch's columns) and these batches.
inline Written write(const std::vector<std::vector<Column>>& batches, const WriteOptions& options = {}) {
  using namespace detail_writer;
  Written w;
  if (options.file_format) {
    w.bytes = {'A', 'R', 'R', 'O', 'W', '1', 0, 0};
  }
  FbPtr schema = table();
  std::vector<FbPtr> fields;
  for (const Column& c : batches.at(0)) fields.push_back(field_of(c));
  set_child(schema, 1, tables(std::move(fields)));
  if (!options.metadata.empty()) {
    std::vector<FbPtr> entries;
    for (const auto& [key, value] : options.metadata) {
      FbPtr kv = table();
      set_child(kv, 0, string(key));
      set_child(kv, 1, string(value));
      entries.push_back(kv);
    }
    set_child(schema, 2, tables(std::move(entries)));
  }
  if (!options.file_format || options.schema_message) {
    message(w.bytes, 1, schema, {}, options);
    w.message_ends.push_back(w.bytes.size());
  }
  // The footer's Blocks (offset, metadata length, 4 bytes of padding, body length) of the
  // dictionaries and the record batches.
  std::vector<uint8_t> dictionary_blocks, batch_blocks;
  const auto add_block = [&](std::vector<uint8_t>& blocks, size_t offset, size_t body) {
    const auto at = bytes_of<int64_t>(static_cast<int64_t>(offset));
    const auto metadata = bytes_of<int32_t>(static_cast<int32_t>(w.bytes.size() - offset - body));
    const auto length = bytes_of<int64_t>(static_cast<int64_t>(body));
    blocks.insert(blocks.end(), at.begin(), at.end());
    blocks.insert(blocks.end(), metadata.begin(), metadata.end());
    blocks.insert(blocks.end(), 4, 0);
    blocks.insert(blocks.end(), length.begin(), length.end());
  };
  // A RecordBatch table of `columns` and its body.
  const auto record_batch = [&](const std::vector<Column>& columns, std::vector<uint8_t>& body) {
    std::vector<uint8_t> nodes, buffer_specs, variadic;
    uint32_t node_count = 0;
    std::vector<const std::vector<uint8_t>*> buffers;
    for (const Column& c : columns) flatten(c, nodes, node_count, buffers, variadic);
    for (const std::vector<uint8_t>* b : buffers) {
      const std::vector<uint8_t> stored = options.codec >= 0 && !b->empty() ? compress(*b, options.codec) : *b;
      const auto offset = bytes_of<int64_t>(static_cast<int64_t>(body.size()));
      const auto length = bytes_of<int64_t>(static_cast<int64_t>(stored.size()));
      buffer_specs.insert(buffer_specs.end(), offset.begin(), offset.end());
      buffer_specs.insert(buffer_specs.end(), length.begin(), length.end());
      body.insert(body.end(), stored.begin(), stored.end());
      while (body.size() % 8 != 0) body.push_back(0);
    }
    FbPtr batch = table();
    set<int64_t>(batch, 0, columns.empty() ? 0 : columns[0].length);
    set_child(batch, 1, structs(std::move(nodes), node_count));
    set_child(batch, 2, structs(std::move(buffer_specs), static_cast<uint32_t>(buffers.size())));
    if (!variadic.empty()) {
      const auto counts = static_cast<uint32_t>(variadic.size() / 8);
      set_child(batch, 4, structs(std::move(variadic), counts));
    }
    if (options.codec >= 0) {
      FbPtr compression = table();
      set<int8_t>(compression, 0, static_cast<int8_t>(options.codec));
      set_child(batch, 3, compression);
    }
    return batch;
  };
  for (size_t b = 0; b <= batches.size(); ++b) {
    for (const DictionaryWrite& d : options.dictionaries) {
      if (d.before != b) continue;
      std::vector<uint8_t> body;
      FbPtr dictionary = table();
      set<int64_t>(dictionary, 0, d.id);
      set_child(dictionary, 1, record_batch({d.values}, body));
      set<uint8_t>(dictionary, 2, d.delta ? 1 : 0);
      const size_t offset = w.bytes.size();
      message(w.bytes, 2, dictionary, body, options);
      add_block(dictionary_blocks, offset, body.size());
      w.message_ends.push_back(w.bytes.size());
    }
    if (b == batches.size()) break;
    std::vector<uint8_t> body;
    FbPtr batch = record_batch(batches[b], body);
    const size_t offset = w.bytes.size();
    message(w.bytes, 3, batch, body, options);
    add_block(batch_blocks, offset, body.size());
    w.message_ends.push_back(w.bytes.size());
  }
  if (options.end_marker) {
    const auto marker = bytes_of<int32_t>(-1), zero = bytes_of<int32_t>(0);
    if (!options.legacy_framing) w.bytes.insert(w.bytes.end(), marker.begin(), marker.end());
    w.bytes.insert(w.bytes.end(), zero.begin(), zero.end());
  }
  if (options.file_format) {
    // The footer (the schema and the blocks, which readers read instead of the stream), its
    // length, the magic.
    FbPtr footer = table();
    set<int16_t>(footer, 0, 4);
    set_child(footer, 1, schema);
    const auto dictionaries = static_cast<uint32_t>(dictionary_blocks.size() / 24);
    const auto record_batches = static_cast<uint32_t>(batch_blocks.size() / 24);
    set_child(footer, 2, structs(std::move(dictionary_blocks), dictionaries));
    set_child(footer, 3, structs(std::move(batch_blocks), record_batches));
    const std::vector<uint8_t> bytes = FbWriter::finish(footer);
    w.bytes.insert(w.bytes.end(), bytes.begin(), bytes.end());
    const auto length = bytes_of<int32_t>(static_cast<int32_t>(bytes.size()));
    w.bytes.insert(w.bytes.end(), length.begin(), length.end());
    for (const char c : {'A', 'R', 'R', 'O', 'W', '1'}) w.bytes.push_back(static_cast<uint8_t>(c));
  }
  return w;
}

}  // namespace mmt::testutil::arrow
