// PackSources::from_arrow: Apache Arrow IPC files and streams (arrow_ipc.h) as pack sources,
// one record per row, one field per column; values view the mapped files.
//
// Columns and the fields they make (a struct's columns are flattened: "image.bytes"):
//   integers, floats, date/time/timestamp/duration  a value of that dtype (the storage's
//                                                   integer for the temporal types)
//   bool                                            bool (Arrow's bits unpacked)
//   decimal32/64/128/256(P, S)                      float64: its integer times 10^-S, exact
//                                                   (the decimal read back) up to 15 digits,
//                                                   rounded past that
//   binary, string, large_binary, large_string,     bytes (uint8, variable length)
//   binary_view, string_view (Polars' strings)
//   fixed_size_binary[W]                            uint8 [W]
//   a list of strings (one level: list<string>, large_list<binary>...)
//                                                   two fields: NAME, the row's strings joined
//                                                   (bytes), and NAME.lengths, each string's
//                                                   length in bytes (int64, fixed where every
//                                                   row has as many strings)
//   lists (list, large_list, fixed_size_list), nested, of the numeric types or bool
//                                                   an array, one dimension a list level:
//                                                   fixed where the level's lists all have one
//                                                   length (a fixed_size_list's, or the same
//                                                   length throughout the inputs), else
//                                                   variable (ragged); each row's lists at a
//                                                   level must then have one length (a jagged
//                                                   row is refused: no tensor holds it)
//   dictionary-encoded columns (pandas categoricals) of the types above (not lists)
//                                                   each row its value, as the columns above
//   a list of structs (list<struct<role, content>>) flattened: a column for each of the
//                                                   struct's, as a list of its values (of the
//                                                   types above: "messages.role" a list of
//                                                   strings, "objects.bbox" a list of fixed-
//                                                   size lists); a null struct inside is refused
//   a map (a list of struct<key, value>)            the same: NAME.key and NAME.value
// A null row is stored as NaN in a fixed-shape float field (as pandas reads it), empty in a
// variable-length one, zeros in another fixed one, and every column with a null has beside it
// a field NAME.valid (bool: the row is not null), which alone tells a null from a NaN, an empty
// string or a zero (nulls counted, per field, in the metadata key "arrow_nulls"); a null inside
// a list is refused. Other types
// (decimals, unions, list views, lists of lists of strings) are refused by name, unless
// `fields` leaves them out; a struct's name in `fields` stands for all its columns.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "arrow_ipc.h"
#include "parquet.h"
#include "flatbuffer_table.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "utf8.h"

namespace mmt {

namespace detail {

struct ArrowColumns {
  enum class Leaf : uint8_t { Values, Bool, FixedBytes, Bytes, Decimal };
  struct Level {
    enum class Kind : uint8_t { Struct, List, LargeList, FixedList } kind;
    int node = 0;
    int32_t fixed = 0;  // FixedList: its list size
  };
  struct Column {
    std::string name;
    std::string type_name;   // the Arrow type of the column (its leaf, under the structs)
    std::vector<Level> path;  // the structs, then the list levels, above the leaf
    size_t structs = 0;       // path[0, structs) are structs
    int leaf_node = 0;
    Leaf leaf = Leaf::Values;
    bool wide_offsets = false;  // Bytes: large_binary/large_string
    // Bytes: binary_view/string_view, whose buffers are validity, the views (16 bytes each: a
    // string of up to 12 bytes inline, a longer one's place in a data buffer) and the data
    // buffers (a batch's "variadic" ones).
    bool views = false;
    int scale = 0;              // Decimal: its values are integers times 10^-scale
    ScalarType dtype = kUInt8;
    int64_t item = 1;          // bytes of a leaf value (FixedBytes: the width; Decimal: the integer's)
    DimVector shape;           // the field's
    int64_t nulls = 0;         // null rows
    // A list of strings is two fields: its strings joined (bytes), and, under NAME.lengths,
    // each one's length in bytes (int64, a value a string): this is the second.
    bool lengths = false;
    // A column with null rows has beside it, under NAME.valid, whether each row is not null
    // (bool): this is the second (a list of strings' follows its lengths).
    bool validity = false;
    // A dictionary-encoded column: its indices are node `index_node` of the record batches,
    // its values (the leaf) node 0 of its dictionary's batches.
    bool dictionary = false;
    int64_t dictionary_id = 0;
    int index_node = 0;
    int index_bytes = 4;
    bool index_signed = true;
    std::string value_type;  // the dictionary's values' Arrow type
  };
  // The part of a dictionary that one dictionary batch gives: values [end of the part before,
  // end) are its values [0, ...). A generation is a dictionary and the deltas after it, until
  // the next that replaces it.
  struct DictionaryPart {
    uint32_t dictionary = 0;  // in its input's ArrowIpc::dictionaries, ascending
    int64_t end = 0;          // values of its generation up to its end
    size_t generation = 0;    // where its generation's first part is, in the id's parts
  };
  struct Batch {
    uint32_t input = 0, batch = 0;
    std::vector<int> first_buffer;  // by node
    size_t dictionaries_before = 0;  // its input's dictionaries that hold for it: [0, this)
  };
  std::vector<ArrowIpc> inputs;
  std::vector<std::vector<std::vector<int>>> dictionary_buffers;  // [input][dictionary]: first buffer by node
  std::vector<std::map<int64_t, std::vector<DictionaryPart>>> dictionary_parts;  // [input]: by id, in order
  std::vector<Batch> batches;
  std::vector<int64_t> batch_end;  // rows before the end of each batch, all inputs in order
  std::vector<Column> columns;
};

}  // namespace detail

namespace {

using detail::ArrowBatch;
using detail::ArrowColumns;
using detail::ArrowField;
using detail::ArrowIpc;
using detail::ArrowTypeId;
using detail::str;

// What a list of strings' lengths field adds to its column's Arrow type in "arrow_types".
constexpr std::string_view kLengthsType = " (lengths)";
namespace fs = std::filesystem;

// The dtype of a numeric Arrow type; nullopt for others.
std::optional<ScalarType> numeric_dtype(const ArrowField& f) {
  switch (f.type) {
    case ArrowTypeId::Int:
      switch (f.bit_width) {
        case 8: return f.is_signed ? kInt8 : kUInt8;
        case 16: return f.is_signed ? kInt16 : kUInt16;
        case 32: return f.is_signed ? kInt32 : kUInt32;
        default: return f.is_signed ? kInt64 : kUInt64;
      }
    case ArrowTypeId::FloatingPoint: return f.precision == 0 ? kFloat16 : f.precision == 1 ? kFloat32 : kFloat64;
    case ArrowTypeId::Date: case ArrowTypeId::Time: case ArrowTypeId::Timestamp: case ArrowTypeId::Duration:
      return f.bit_width == 32 ? kInt32 : kInt64;
    default: return std::nullopt;
  }
}

// One batch's nodes and buffers as a column reads them: a record batch, or a dictionary's.
class BatchView {
 public:
  BatchView() = default;
  BatchView(const ArrowIpc& ipc, const ArrowBatch& batch, const std::vector<int>& first_buffer, const char* kind)
      : ipc_(&ipc), batch_(&batch), first_buffer_(&first_buffer), bytes_(&ipc.bytes_of(batch)), kind_(kind) {}

  std::string where() const {
    if (batch_->row_group >= 0) return str(ipc_->path, ", row group ", batch_->row_group);
    return str(ipc_->path, ", the ", kind_, " at byte ", batch_->message_offset);
  }
  const UntypedStorage& bytes() const { return *bytes_; }
  const ArrowBatch::Buffer& buffer(int node, int k) const {
    return batch_->buffers[static_cast<size_t>((*first_buffer_)[static_cast<size_t>(node)] + k)];
  }
  const ArrowBatch::Node& node(int n) const { return batch_->nodes[static_cast<size_t>(n)]; }

  bool is_null(int n, int64_t index) const {
    if (node(n).null_count == 0) return false;
    const ArrowBatch::Buffer& validity = buffer(n, 0);
    const auto byte = static_cast<uint8_t>(bytes_->data()[validity.offset + index / 8]);
    return ((byte >> (index % 8)) & 1) == 0;
  }
  // Whether any of values [start, end) of node `n` is null.
  bool any_null(int n, int64_t start, int64_t end) const {
    if (node(n).null_count == 0) return false;
    for (int64_t i = start; i < end; ++i)
      if (is_null(n, i)) return true;
    return false;
  }
  int64_t offset_at(const ArrowBatch::Buffer& offsets, bool wide, int64_t index) const {
    const std::byte* p = bytes_->data() + offsets.offset;
    if (wide) {
      int64_t v;
      std::memcpy(&v, p + 8 * index, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, p + 4 * index, 4);
    return v;
  }
  // A binary_view/string_view node's data buffers: those between its views and the next node's
  // buffers (a view node has no children), as arrow_field_buffers() counted them.
  int64_t data_buffers(int n) const {
    const auto next = static_cast<size_t>(n) + 1;
    const int end = next < first_buffer_->size() ? (*first_buffer_)[next] : static_cast<int>(batch_->buffers.size());
    return end - (*first_buffer_)[static_cast<size_t>(n)] - 2;
  }
  // Where value j of binary_view/string_view node `n` lies in bytes(): inline in its view (up
  // to 12 bytes), else in one of the node's data buffers. False, with `why` when given, for a
  // view that says a negative length or a place outside its data buffers.
  struct StringAt {
    int64_t offset = 0, length = 0;
  };
  bool string_at(int n, int64_t j, StringAt& out, std::string* why = nullptr) const {
    const ArrowBatch::Buffer& views = buffer(n, 1);
    const std::byte* view = bytes_->data() + views.offset + 16 * j;
    int32_t length, index, offset;
    std::memcpy(&length, view, 4);
    std::memcpy(&index, view + 8, 4);
    std::memcpy(&offset, view + 12, 4);
    if (length <= 12) {
      out = {views.offset + 16 * j + 4, length};
      if (length >= 0) return true;
      if (why != nullptr) *why = str("has a view of length ", length, " for value ", j);
      return false;
    }
    const int64_t buffers = data_buffers(n);
    if (index < 0 || index >= buffers) {
      if (why != nullptr) *why = str("has value ", j, " in data buffer ", index, ", where the batch has ", buffers, " for it");
      return false;
    }
    const ArrowBatch::Buffer& data = buffer(n, 2 + index);
    if (offset < 0 || length > data.length - offset) {
      if (why != nullptr)
        *why = str("has value ", j, " (", length, " bytes at byte ", offset, " of data buffer ", index,
                   ") past that buffer's ", data.length, " bytes");
      return false;
    }
    out = {data.offset + offset, length};
    return true;
  }
  // The bytes a binary_view/string_view node's views and data buffers cover in this batch,
  // each once (buffers may name the same bytes: their sum could be any multiple of the file).
  int64_t view_node_bytes(int n) const {
    std::vector<std::pair<int64_t, int64_t>> ranges;  // [start, end)
    for (int64_t k = 1; k < 2 + data_buffers(n); ++k) {
      const ArrowBatch::Buffer& b = buffer(n, static_cast<int>(k));
      ranges.emplace_back(b.offset, b.offset + b.length);
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t bytes = 0, covered = INT64_MIN;  // covered: where the ranges so far end
    for (const auto& [start, end] : ranges) {
      if (end <= covered) continue;
      bytes += end - std::max(start, covered);
      covered = end;
    }
    return bytes;
  }
  // A dictionary index: value `index` of an integer buffer of `bytes`-byte values.
  int64_t integer_at(const ArrowBatch::Buffer& values, int bytes, bool is_signed, int64_t index) const {
    const std::byte* p = bytes_->data() + values.offset + bytes * index;
    switch (bytes) {
      case 1: return is_signed ? int64_t{static_cast<int8_t>(*p)} : int64_t{static_cast<uint8_t>(*p)};
      case 2: { uint16_t v; std::memcpy(&v, p, 2); return is_signed ? int64_t{static_cast<int16_t>(v)} : int64_t{v}; }
      case 4: { uint32_t v; std::memcpy(&v, p, 4); return is_signed ? int64_t{static_cast<int32_t>(v)} : int64_t{v}; }
      default: { int64_t v; std::memcpy(&v, p, 8); return v; }  // uint64 past int64 reads negative: refused
    }
  }

  // Checks the buffers `column` reads in this batch against its nodes: validity bitmaps,
  // sizes, offsets in order and within their children. Call before row().
  void check(const ArrowColumns::Column& column) const {
    const auto fail = [&](const std::string& why) {
      throw FormatError(str(where(), ": column '", detail::cut_for_message(column.name, 100), "' ", why));
    };
    const auto need_validity = [&](int n) {
      if (node(n).null_count > 0 && buffer(n, 0).length < (node(n).length + 7) / 8)
        fail(str("has ", node(n).null_count, " nulls but a validity bitmap of ", buffer(n, 0).length, " bytes for ",
                 node(n).length, " values"));
    };
    for (size_t k = 0; k < column.path.size(); ++k) {
      const ArrowColumns::Level& level = column.path[k];
      const int child = k + 1 < column.path.size() ? column.path[k + 1].node
                        : column.dictionary        ? column.index_node
                                                   : column.leaf_node;
      need_validity(level.node);
      switch (level.kind) {
        case ArrowColumns::Level::Kind::Struct:
          if (node(child).length < node(level.node).length) fail("has a struct child shorter than its struct");
          break;
        case ArrowColumns::Level::Kind::FixedList:
          if (node(child).length / level.fixed < node(level.node).length)
            fail(str("has a fixed-size list's values (", node(child).length, ") too few for its ",
                     node(level.node).length, " lists of ", level.fixed));
          break;
        case ArrowColumns::Level::Kind::List:
        case ArrowColumns::Level::Kind::LargeList:
          check_offsets(buffer(level.node, 1), level.kind == ArrowColumns::Level::Kind::LargeList,
                        node(level.node).length, node(child).length, fail);
          break;
      }
    }
    if (column.dictionary) {  // the indices; the values are checked once, in their dictionary's batch
      need_validity(column.index_node);
      if (buffer(column.index_node, 1).length / column.index_bytes < node(column.index_node).length)
        fail(str("has an indices buffer of ", buffer(column.index_node, 1).length, " bytes, too few for ",
                 node(column.index_node).length, " indices"));
      return;
    }
    need_validity(column.leaf_node);
    const int64_t length = node(column.leaf_node).length;
    switch (column.leaf) {
      case ArrowColumns::Leaf::Values:
      case ArrowColumns::Leaf::FixedBytes:
      case ArrowColumns::Leaf::Decimal:
        if (buffer(column.leaf_node, 1).length / column.item < length)
          fail(str("has a values buffer of ", buffer(column.leaf_node, 1).length, " bytes, too few for ", length,
                   " values of ", column.item, " bytes"));
        break;
      case ArrowColumns::Leaf::Bool:
        if (buffer(column.leaf_node, 1).length < (length + 7) / 8)
          fail(str("has a values bitmap of ", buffer(column.leaf_node, 1).length, " bytes, too few for ", length,
                   " values"));
        break;
      case ArrowColumns::Leaf::Bytes:
        if (column.views) {
          check_views(column.leaf_node, length, fail);
          break;
        }
        check_offsets(buffer(column.leaf_node, 1), column.wide_offsets, length, buffer(column.leaf_node, 2).length, fail);
        break;
    }
  }

 private:
  template <class Fail>
  void check_offsets(const ArrowBatch::Buffer& offsets, bool wide, int64_t lists, int64_t child_length,
                     const Fail& fail) const {
    const int64_t width = wide ? 8 : 4;
    if (offsets.length / width < lists + 1) {
      if (lists == 0) return;  // an empty array may leave its offsets out (none is read then)
      fail(str("has an offsets buffer of ", offsets.length, " bytes, too few for ", lists, " lists"));
    }
    int64_t previous = offset_at(offsets, wide, 0);
    if (previous < 0) fail(str("has a first offset of ", previous));
    for (int64_t j = 1; j <= lists; ++j) {
      const int64_t next = offset_at(offsets, wide, j);
      if (next < previous) fail(str("has offsets out of order at list ", j - 1, " (", previous, " then ", next, ")"));
      previous = next;
    }
    if (previous > child_length)
      fail(str("has offsets reaching ", previous, ", past the ", child_length, " values they index"));
  }

  // Every non-null view of node `n` (a null's may hold anything): within its data buffers.
  template <class Fail>
  void check_views(int n, int64_t values, const Fail& fail) const {
    if (buffer(n, 1).length / 16 < values)
      fail(str("has a views buffer of ", buffer(n, 1).length, " bytes, too few for ", values, " values of 16 bytes"));
    StringAt at;
    std::string why;
    for (int64_t j = 0; j < values; ++j)
      if (!is_null(n, j) && !string_at(n, j, at, &why)) fail(why);
  }

  const ArrowIpc* ipc_ = nullptr;
  const ArrowBatch* batch_ = nullptr;
  const std::vector<int>* first_buffer_ = nullptr;
  const UntypedStorage* bytes_ = nullptr;
  const char* kind_ = "";
};

// Where one row of a column lies: its leaf range, in `view`'s batch (the record batch, or a
// dictionary's), and its shape (an inner dimension under an empty list is unknown: -1), or null.
struct RowAt {
  bool null = false;
  BatchView view;
  int64_t start = 0, end = 0;  // leaf values (Values, Bool, the strings of `lengths`) or bytes
  DimVector dims;
};

// Reads rows of the columns of one record batch.
class ColumnReader {
 public:
  ColumnReader(const ArrowColumns& arrow, size_t batch_index)
      : arrow_(arrow), batch_(arrow.batches[batch_index]), ipc_(arrow.inputs[batch_.input]),
        view_(ipc_, ipc_.batches[batch_.batch], batch_.first_buffer, "record batch") {}

  const BatchView& view() const { return view_; }
  std::string where() const { return view_.where(); }

  // Row `row` of the column (checked first). ValueError naming the row for a jagged list or a
  // null inside a list; FormatError for a dictionary index outside its dictionary.
  void row(const ArrowColumns::Column& column, int64_t row, RowAt& at) const {
    at.dims.clear();
    at.view = view_;
    at.null = false;
    for (size_t k = 0; k < column.structs; ++k) at.null = at.null || view_.is_null(column.path[k].node, row);
    int64_t start = row, end = row + 1;
    if (column.dictionary) {
      at.null = at.null || view_.is_null(column.index_node, row);
      if (at.null) return;
      const int64_t index = view_.integer_at(view_.buffer(column.index_node, 1), column.index_bytes,
                                             column.index_signed, row);
      // The dictionary's parts that hold for this batch: the last generation of those before it.
      const auto& by_id = arrow_.dictionary_parts[batch_.input];
      const auto found = by_id.find(column.dictionary_id);
      const std::vector<ArrowColumns::DictionaryPart>* parts = found == by_id.end() ? nullptr : &found->second;
      const auto last = parts == nullptr ? 0
                                         : std::partition_point(parts->begin(), parts->end(),
                                                                [&](const ArrowColumns::DictionaryPart& p) {
                                                                  return p.dictionary < batch_.dictionaries_before;
                                                                }) - parts->begin();
      if (last == 0)
        throw FormatError(str(where(), ": column '", detail::cut_for_message(column.name, 100), "', row ", row,
                              ": no dictionary of id ", column.dictionary_id, " comes before it"));
      const auto first = parts->begin() + static_cast<ptrdiff_t>((*parts)[static_cast<size_t>(last - 1)].generation);
      const auto stop = parts->begin() + last;
      const auto part = std::upper_bound(first, stop, index,
                                         [](int64_t i, const ArrowColumns::DictionaryPart& p) { return i < p.end; });
      if (index < 0 || part == stop)
        throw FormatError(str(where(), ": column '", detail::cut_for_message(column.name, 100), "', row ", row,
                              ": dictionary index ",
                              column.index_signed ? str(index) : str(static_cast<uint64_t>(index)),
                              " is outside its dictionary's ", (stop - 1)->end, " values"));
      const int64_t before = part == first ? 0 : (part - 1)->end;
      const detail::ArrowDictionary& dictionary = ipc_.dictionaries[part->dictionary];
      at.view = BatchView(ipc_, dictionary.batch, arrow_.dictionary_buffers[batch_.input][part->dictionary],
                          "dictionary batch");
      start = index - before;
      end = start + 1;
      if (at.view.is_null(column.leaf_node, start)) at.null = true;  // a null among the dictionary's values
      if (at.null) return;
      leaf(column, start, end, at);
      return;
    }
    at.null = at.null || view_.is_null(column.path.size() > column.structs ? column.path[column.structs].node
                                                                           : column.leaf_node, row);
    if (at.null) return;
    for (size_t k = column.structs; k < column.path.size(); ++k) {
      const ArrowColumns::Level& level = column.path[k];
      if (level.kind == ArrowColumns::Level::Kind::Struct) {  // inside a list: its values are the list's
        if (start == end) continue;
        within(column, level.node, start, end, row);
        if (view_.any_null(level.node, start, end)) inner_null(column, row);
        continue;
      }
      if (start == end) {  // under an empty list: no lists here, whose length is then unknown
        at.dims.push_back(level.kind == ArrowColumns::Level::Kind::FixedList ? level.fixed : kVariableDim);
        continue;
      }
      within(column, level.node, start, end, row);
      // A null list inside the row: no tensor holds it (a null row's own lists, which
      // writers fill with nulls too, are never read).
      if (k > column.structs && view_.any_null(level.node, start, end)) inner_null(column, row);
      if (level.kind == ArrowColumns::Level::Kind::FixedList) {
        at.dims.push_back(level.fixed);
        start *= level.fixed;  // within the node's length, which check() held to its values'
        end *= level.fixed;
        continue;
      }
      const ArrowBatch::Buffer& offsets = view_.buffer(level.node, 1);
      const bool wide = level.kind == ArrowColumns::Level::Kind::LargeList;
      const int64_t first = view_.offset_at(offsets, wide, start);
      const int64_t length = view_.offset_at(offsets, wide, start + 1) - first;
      int64_t last = first + length;
      for (int64_t j = start + 1; j < end; ++j) {
        const int64_t next = view_.offset_at(offsets, wide, j + 1);
        if (next - last != length)
          throw ValueError(str(where(), ": column '", detail::cut_for_message(column.name, 100), "', row ", row,
                               ": a jagged list (its lists at depth ", at.dims.size() + 1, " have lengths ", length,
                               " and ", next - last, "), which no tensor holds"));
        last = next;
      }
      at.dims.push_back(length);
      start = first;
      end = last;
    }
    if (start == end) {  // nothing at the leaf: no offsets to read (an empty array may have none)
      at.start = at.end = 0;
      if (column.leaf == ArrowColumns::Leaf::FixedBytes) at.dims.push_back(column.item);
      if (column.leaf == ArrowColumns::Leaf::Bytes && !column.lengths) at.dims.assign(1, 0);
      if (column.leaf == ArrowColumns::Leaf::Bytes && column.lengths && at.dims.empty()) at.dims.push_back(0);
      return;
    }
    within(column, column.leaf_node, start, end, row);
    if (column.path.size() > column.structs && view_.any_null(column.leaf_node, start, end)) inner_null(column, row);
    leaf(column, start, end, at);
  }

 private:
  // The leaf's range for values [start, end) of its node, in at.view's batch.
  static void leaf(const ArrowColumns::Column& column, int64_t start, int64_t end, RowAt& at) {
    switch (column.leaf) {
      case ArrowColumns::Leaf::Values:
      case ArrowColumns::Leaf::Bool:
      case ArrowColumns::Leaf::Decimal:
        at.start = start;
        at.end = end;
        break;
      case ArrowColumns::Leaf::FixedBytes:
        at.start = start * column.item;
        at.end = end * column.item;
        at.dims.push_back(column.item);
        break;
      case ArrowColumns::Leaf::Bytes:
        if (column.lengths) {  // the strings [start, end): their lengths are read from the offsets
          at.start = start;
          at.end = end;
          break;
        }
        if (column.views) {  // the strings [start, end), gathered from their views when read
          at.start = start;
          at.end = end;
          // Checked not negative; one that changed since is refused when read. The sum saturates:
          // views may repeat one string any number of times (refuse_repeated_views).
          int64_t bytes = 0;
          for (int64_t j = start; j < end; ++j) {
            int32_t length;
            std::memcpy(&length, at.view.bytes().data() + at.view.buffer(column.leaf_node, 1).offset + 16 * j, 4);
            if (__builtin_add_overflow(bytes, std::max(length, 0), &bytes)) bytes = std::numeric_limits<int64_t>::max();
          }
          at.dims.assign(1, bytes);
          break;
        }
        at.start = at.view.offset_at(at.view.buffer(column.leaf_node, 1), column.wide_offsets, start);
        at.end = at.view.offset_at(at.view.buffer(column.leaf_node, 1), column.wide_offsets, end);
        at.dims.assign(1, at.end - at.start);  // a list of strings: their bytes joined
        break;
    }
  }
  // Within the lists (or values) of node `n`: always so for a checked file, unless it changed
  // since (then offsets read now could lead anywhere).
  void within(const ArrowColumns::Column& column, int n, int64_t start, int64_t end, int64_t row) const {
    if (start < 0 || end < start || end > view_.node(n).length) [[unlikely]]
      throw IoError(str(where(), ": column '", detail::cut_for_message(column.name, 100), "', row ", row,
                        ": its offsets changed while the file was being packed"));
  }
  [[noreturn, gnu::cold]] void inner_null(const ArrowColumns::Column& column, int64_t row) const {
    throw ValueError(str(where(), ": column '", detail::cut_for_message(column.name, 100), "', row ", row,
                         ": a null inside its lists, which no tensor holds"));
  }

  const ArrowColumns& arrow_;
  const ArrowColumns::Batch& batch_;
  const ArrowIpc& ipc_;
  BatchView view_;
};

// Views let many strings share bytes: a list of a million views of one megabyte-long string
// would be a terabyte. A row of a list of strings that joins more bytes than its batch's views
// and data buffers cover, and past a gigabyte, is refused as such a bomb; so is a batch whose
// rows come to 1024 times those bytes, and past a gigabyte (`batch_total` adds this row's;
// `held`, -1 until then, keeps the batch's bytes). A column of one string a row (as a
// dictionary's) holds each within its data buffer: no row or batch is bigger than a plain
// column of those strings would be.
void refuse_repeated_views(const ArrowColumns::Column& column, int64_t row, const RowAt& at,
                           int64_t* batch_total = nullptr, int64_t* held = nullptr) {
  if (!column.views || column.lengths || column.path.size() == column.structs || at.null || at.dims.empty()) return;
  constexpr int64_t kGigabyte = int64_t{1} << 30;
  const int64_t bytes = at.dims.back();
  int64_t total = 0;
  if (batch_total != nullptr && __builtin_add_overflow(*batch_total, bytes, batch_total)) *batch_total = INT64_MAX;
  if (batch_total != nullptr) total = *batch_total;
  if (bytes <= kGigabyte && total <= kGigabyte) return;
  int64_t covered = held != nullptr ? *held : -1;
  if (covered < 0) covered = at.view.view_node_bytes(column.leaf_node);  // sorts the buffers: once a batch
  if (held != nullptr) *held = covered;
  const bool row_over = bytes > kGigabyte && bytes > covered;
  const bool batch_over = total > kGigabyte && total / 1024 > covered;
  if (!row_over && !batch_over) return;
  throw FormatError(str(at.view.where(), ": column '", detail::cut_for_message(column.name, 100), "', row ", row, ": ",
                        row_over ? str("its strings come to ", bytes, " bytes, more than")
                                 : str("the rows up to it come to ", total, " bytes, more than 1024 times"),
                        " the ", covered, " the batch's views and data hold",
                        ": views repeating the same bytes, refused as a bomb"));
}

// Runs fn() with a fault reading either of an input's mappings (the file, its decompressed
// batches) made an IoError: a row may read a record batch of one and a dictionary of the other.
template <class Fn>
void guard_input(const ArrowIpc& ipc, const Fn& fn) {
  detail::guard_storage_reads(ipc.file, [&] {
    if (ipc.decompressed.nbytes() > 0)
      detail::guard_storage_reads(ipc.decompressed, fn);
    else
      fn();
  });
}

// The levels of `column` that are dimensions: its lists, below the structs it is flattened out of
// (a struct inside a list, list<struct<...>>, is a dimension of none).
std::vector<const ArrowColumns::Level*> list_levels(const ArrowColumns::Column& column) {
  std::vector<const ArrowColumns::Level*> out;
  for (size_t k = column.structs; k < column.path.size(); ++k)
    if (column.path[k].kind != ArrowColumns::Level::Kind::Struct) out.push_back(&column.path[k]);
  return out;
}

// The columns a field makes, with `path` the levels above it: structs are flattened ("image.
// bytes"), and so are structs inside lists (list<struct<role, content>>: "messages.role" and
// "messages.content", each a list of its values; `within` is then the list's type, for its
// columns' type names); `refused` names what no field holds.
void add_columns(const ArrowField& field, const std::string& prefix, std::vector<ArrowColumns::Level> path,
                 const std::string& within, std::vector<ArrowColumns::Column>& out, std::vector<std::string>& refused) {
  const std::string name = prefix.empty() ? field.name : str(prefix, ".", field.name);
  const auto refuse = [&](const std::string& why) { refused.push_back(str("'", name, "' (", why, ")")); };
  const auto is_struct = [](const ArrowField& f) { return f.type == ArrowTypeId::Struct && !f.dictionary_encoded; };
  if (is_struct(field)) {
    path.push_back({ArrowColumns::Level::Kind::Struct, field.node, 0});
    for (const ArrowField& child : field.children) add_columns(child, name, path, within, out, refused);
    return;
  }
  ArrowColumns::Column column;
  column.name = name;
  column.type_name = within.empty() ? arrow_type_name(field) : str(arrow_type_name(field), " in ", within);
  while (column.structs < path.size() && path[column.structs].kind == ArrowColumns::Level::Kind::Struct)
    ++column.structs;
  const bool under_list = column.structs < path.size();
  column.path = std::move(path);
  const ArrowField* leaf = &field;
  if (field.dictionary_encoded) {  // its values are node 0 of its dictionary's batches
    if (under_list) return refuse("a list of dictionary-encoded values");
    column.dictionary = true;
    column.dictionary_id = field.dictionary_id;
    column.index_node = field.node;
    column.index_bytes = field.index_bit_width / 8;
    column.index_signed = field.index_signed;
    column.leaf_node = 0;
    ArrowField values = field;
    values.dictionary_encoded = false;
    column.value_type = arrow_type_name(values);
  } else {
    while (leaf->type == ArrowTypeId::List || leaf->type == ArrowTypeId::LargeList ||
           leaf->type == ArrowTypeId::FixedSizeList || leaf->type == ArrowTypeId::Map) {
      if (leaf->type == ArrowTypeId::FixedSizeList && leaf->fixed_size == 0)
        return refuse("a fixed_size_list of 0 values");
      // A map is a list of its entries, struct<key, value>: NAME.key and NAME.value.
      if (leaf->type == ArrowTypeId::Map &&
          (leaf->children[0].type != ArrowTypeId::Struct || leaf->children[0].children.size() != 2))
        return refuse("a map whose entries are not a struct of a key and a value");
      const bool wide = leaf->type == ArrowTypeId::LargeList || (leaf->type == ArrowTypeId::Map && leaf->bit_width == 64);
      column.path.push_back({leaf->type == ArrowTypeId::FixedSizeList ? ArrowColumns::Level::Kind::FixedList
                             : wide                                   ? ArrowColumns::Level::Kind::LargeList
                                                                      : ArrowColumns::Level::Kind::List,
                             leaf->node, leaf->fixed_size});
      leaf = &leaf->children[0];
      if (leaf->dictionary_encoded) return refuse("a list of dictionary-encoded values");
      if (is_struct(*leaf)) {  // a list of structs: each of the struct's columns a list of its values
        column.path.push_back({ArrowColumns::Level::Kind::Struct, leaf->node, 0});
        const std::string list_type = within.empty() ? arrow_type_name(field) : within;  // the outermost list's
        for (const ArrowField& child : leaf->children) add_columns(child, name, column.path, list_type, out, refused);
        return;
      }
    }
    column.leaf_node = leaf->node;
  }
  const size_t lists = list_levels(column).size();
  const bool listed = lists > 0;
  if (const std::optional<ScalarType> dtype = numeric_dtype(*leaf)) {
    column.leaf = ArrowColumns::Leaf::Values;
    column.dtype = *dtype;
    column.item = element_size(*dtype);
  } else if (leaf->type == ArrowTypeId::Decimal) {
    // Digits a decimal of its width holds (Arrow's limits), and a scale a float64 can take.
    const int digits = leaf->bit_width == 32 ? 9 : leaf->bit_width == 64 ? 18 : leaf->bit_width == 128 ? 38 : 76;
    if (leaf->precision < 1 || leaf->precision > digits || leaf->scale < -digits || leaf->scale > digits)
      return refuse(str(column.type_name, ": a precision outside 1 to ", digits, ", or a scale outside -", digits, " to ", digits));
    column.leaf = ArrowColumns::Leaf::Decimal;
    column.dtype = kFloat64;
    column.item = leaf->bit_width / 8;
    column.scale = leaf->scale;
  } else if (leaf->type == ArrowTypeId::Bool) {
    column.leaf = ArrowColumns::Leaf::Bool;
    column.dtype = kBool;
  } else if (!listed && leaf->type == ArrowTypeId::FixedSizeBinary && leaf->fixed_size > 0) {
    column.leaf = ArrowColumns::Leaf::FixedBytes;
    column.item = leaf->fixed_size;
  } else if (lists <= 1 &&
             (leaf->type == ArrowTypeId::Binary || leaf->type == ArrowTypeId::Utf8 ||
              leaf->type == ArrowTypeId::LargeBinary || leaf->type == ArrowTypeId::LargeUtf8 ||
              leaf->type == ArrowTypeId::BinaryView || leaf->type == ArrowTypeId::Utf8View)) {
    column.leaf = ArrowColumns::Leaf::Bytes;
    column.wide_offsets = leaf->type == ArrowTypeId::LargeBinary || leaf->type == ArrowTypeId::LargeUtf8;
    column.views = leaf->type == ArrowTypeId::BinaryView || leaf->type == ArrowTypeId::Utf8View;
  } else {
    return refuse(column.dictionary ? str(column.type_name, ": dictionaries of numbers, bools or strings are read")
                  : listed          ? str(column.type_name, ": lists hold numbers, bools or (one level of) strings here")
                                    : column.type_name);
  }
  if (column.leaf == ArrowColumns::Leaf::Bytes && listed) {  // a list of strings: two fields
    ArrowColumns::Column lengths = column;
    lengths.name += ".lengths";
    lengths.type_name += kLengthsType;
    lengths.lengths = true;
    lengths.dtype = kInt64;
    lengths.item = 8;
    out.push_back(std::move(column));
    out.push_back(std::move(lengths));
    return;
  }
  out.push_back(std::move(column));
}

bool same_fields(const std::vector<ArrowField>& a, const std::vector<ArrowField>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    // A map's offsets are 32-bit in Arrow files, 64-bit from Parquet ones (its bit_width).
    if (a[i].name != b[i].name || arrow_type_name(a[i]) != arrow_type_name(b[i]) ||
        (a[i].type == ArrowTypeId::Map && a[i].bit_width != b[i].bit_width) ||
        a[i].dictionary_encoded != b[i].dictionary_encoded || a[i].dictionary_id != b[i].dictionary_id ||
        !same_fields(a[i].children, b[i].children))
      return false;
  }
  return true;
}

// Whether the file at `path` is Parquet: named so, or beginning with "PAR1".
bool is_parquet_file(const std::string& path) {
  const std::string extension = fs::path(path).extension().string();
  if (extension == ".parquet" || extension == ".pq" || extension == ".parq") return true;
  std::byte head[4] = {};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const size_t got = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  return detail::is_parquet_start(head, got);
}

// The Parquet files directly in `folder` (a Hugging Face Hub dataset's split: train-00000-of-
// 00004.parquet ...), in name order; none when it holds none.
std::vector<std::string> parquet_files_in(const fs::path& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.is_regular_file(ec) && entry.path().extension() == ".parquet") out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The files an input names: an Arrow or Parquet file, a folder that Hugging Face datasets'
// save_to_disk wrote (state.json lists its data files, in order), or a folder of Parquet files.
std::vector<std::string> arrow_files_of(const std::string& spec) {
  std::error_code ec;
  if (!fs::is_directory(spec, ec)) return {spec};
  const fs::path folder(spec);
  if (!fs::exists(folder / "state.json", ec) && !fs::exists(folder / "dataset_dict.json", ec)) {
    std::vector<std::string> parquet = parquet_files_in(folder);
    if (!parquet.empty()) return parquet;
  }
  if (fs::exists(folder / "dataset_dict.json", ec)) {
    std::string splits;
    for (const auto& entry : fs::directory_iterator(folder, ec))
      if (entry.is_directory(ec) && fs::exists(entry.path() / "state.json", ec))
        splits += str(splits.empty() ? "" : ", ", entry.path().filename().string());
    throw ValueError(str(spec, ": a Hugging Face DatasetDict (splits: ", splits.empty() ? "none found" : splits,
                         "); pack one split's folder, such as ", (folder / "train").string()));
  }
  const fs::path state_path = folder / "state.json";
  MMT_CHECK(fs::is_regular_file(state_path, ec), ValueError, spec, ": a folder without state.json or .parquet files; "
            "Arrow inputs are .arrow or .parquet files, a folder of .parquet files, or a folder that Hugging Face "
            "datasets' save_to_disk wrote");
  const UntypedStorage text = detail::read_file_bytes(state_path.string());
  const nlohmann::json state = nlohmann::json::parse(text.data(), text.data() + text.nbytes(), nullptr, false);
  const auto files = state.is_object() ? state.find("_data_files") : state.end();
  MMT_CHECK(state.is_object() && files != state.end() && files->is_array(), FormatError, state_path.string(),
            ": not a Hugging Face dataset state (no list \"_data_files\")");
  std::vector<std::string> out;
  for (const nlohmann::json& file : *files) {
    const auto name = file.is_object() ? file.find("filename") : file.end();
    MMT_CHECK(name != file.end() && name->is_string(), FormatError, state_path.string(),
              ": an entry of \"_data_files\" has no \"filename\"");
    const fs::path relative(name->get<std::string>());
    bool inside = !relative.empty() && relative.is_relative();
    for (const fs::path& part : relative) inside = inside && part != "..";
    MMT_CHECK(inside, FormatError, state_path.string(), ": the data file '",
              detail::cut_for_message(relative.string(), 200), "' is not a path inside its folder");
    out.push_back((folder / relative).string());
  }
  MMT_CHECK(!out.empty(), ValueError, state_path.string(), ": lists no data files");
  return out;
}

// Hugging Face's features, from the schema metadata "huggingface" ({"info": {"features":
// {...}}}): the class names of the one ClassLabel column, when exactly one is packed and its
// names are a list of strings. Nothing else of the (untrusted) JSON is copied.
std::optional<std::vector<std::string>> class_names(const nlohmann::json& huggingface,
                                                    const std::vector<std::string>& fields) {
  const auto info = huggingface.is_object() ? huggingface.find("info") : huggingface.end();
  if (info == huggingface.end() || !info->is_object()) return std::nullopt;
  const auto features = info->find("features");
  if (features == info->end() || !features->is_object()) return std::nullopt;
  std::optional<std::vector<std::string>> names;
  int labels = 0;
  for (const auto& [name, feature] : features->items()) {
    if (!feature.is_object()) continue;
    const auto type = feature.find("_type");
    if (type == feature.end() || !type->is_string() || type->get_ref<const std::string&>() != "ClassLabel") continue;
    if (std::find(fields.begin(), fields.end(), name) == fields.end()) continue;
    ++labels;
    const auto list = feature.find("names");
    if (list == feature.end() || !list->is_array()) continue;
    std::vector<std::string> read;
    for (const nlohmann::json& each : *list) {
      if (!each.is_string()) return std::nullopt;
      read.push_back(each.get<std::string>());
    }
    names = std::move(read);
  }
  return labels == 1 ? names : std::nullopt;
}

}  // namespace

bool are_arrow_inputs(std::span<const std::string> specs) {
  for (const std::string& spec : specs) {
    std::error_code ec;
    if (fs::is_directory(spec, ec)) {
      if (fs::exists(fs::path(spec) / "state.json", ec) || fs::exists(fs::path(spec) / "dataset_dict.json", ec) ||
          !parquet_files_in(spec).empty())
        return true;
      continue;
    }
    const std::string extension = fs::path(spec).extension().string();
    const bool named = extension == ".arrow" || extension == ".arrows" || extension == ".feather" ||
                       extension == ".ipc" || extension == ".parquet" || extension == ".pq" || extension == ".parq";
    std::byte head[8] = {};
    FILE* f = std::fopen(spec.c_str(), "rb");
    if (f == nullptr) {
      if (named && spec.find('=') == std::string::npos) return true;  // from_arrow names it missing
      continue;
    }
    const size_t got = std::fread(head, 1, sizeof head, f);
    // "ARROW1" is Arrow's own. A stream is named by its extension, or by its first message
    // being a Schema (0xFFFFFFFF could begin other files; that message could not).
    bool stream = false;
    if (!named && detail::is_arrow_stream_start(head, got)) {
      int32_t length = 0;
      std::memcpy(&length, head + 4, 4);
      std::vector<std::byte> metadata(static_cast<size_t>(std::min(length, int32_t{1} << 24)));
      if (std::fread(metadata.data(), 1, metadata.size(), f) == metadata.size()) {
        try {
          const std::string where = spec;
          const detail::FlatTable message = detail::FlatTable::root(metadata, where);
          const auto version = message.scalar<int16_t>(0, 0);
          stream = message.scalar<uint8_t>(1, 0) == 1 && (version == 3 || version == 4) && message.table(2, "a header");
        } catch (const FormatError&) {
        }
      }
    }
    std::fclose(f);
    if (stream || detail::is_arrow_file_start(head, got) || detail::is_parquet_start(head, got) ||
        (named && detail::is_arrow_stream_start(head, got)))
      return true;
    // A file named as Arrow's or Parquet's is one, whatever its bytes (a stream from before
    // Arrow 0.15 begins with its metadata's length alone): an empty or damaged one is named by
    // the Arrow reader, not taken for an array input that lacks a NAME=.
    if (named && spec.find('=') == std::string::npos) return true;
  }
  return false;
}

PackSources PackSources::from_arrow(std::span<const std::string> specs, std::span<const std::string> fields) {
  MMT_CHECK(!specs.empty(), ValueError, "no Arrow files to pack");
  auto arrow = std::make_shared<ArrowColumns>();
  PackSources out;
  std::string source;
  for (const std::string& spec : specs) {
    for (const std::string& path : arrow_files_of(spec)) {
      const bool parquet = is_parquet_file(path);
      ArrowIpc ipc = parquet ? detail::read_parquet_as_arrow(path, fields) : detail::read_arrow_ipc(path);
      if (arrow->inputs.empty()) source = parquet ? "parquet" : "arrow";
      else if (source != (parquet ? "parquet" : "arrow")) source = "arrow+parquet";
      if (!arrow->inputs.empty())
        MMT_CHECK(same_fields(ipc.fields, arrow->inputs.front().fields), ValueError, path, ": its columns differ from ",
                  "those of ", arrow->inputs.front().path, "; the files packed together must have the same columns");
      const auto input = static_cast<uint32_t>(arrow->inputs.size());
      // Each dictionary id's parts, in order: a delta adds its values to the id's generation,
      // another begins a new one. A record batch reads the dictionaries before it (a file's:
      // all of them), which a row's lookup finds by binary search: memory a dictionary.
      std::map<int64_t, std::vector<ArrowColumns::DictionaryPart>> parts_by_id;
      std::vector<std::vector<int>> dictionary_buffers;
      for (size_t d = 0; d < ipc.dictionaries.size(); ++d) {
        const detail::ArrowDictionary& dictionary = ipc.dictionaries[d];
        dictionary_buffers.push_back(detail::arrow_field_buffers(ipc, dictionary));
        std::vector<ArrowColumns::DictionaryPart>& parts = parts_by_id[dictionary.id];
        const bool continues = dictionary.delta && !parts.empty();
        const int64_t before = continues ? parts.back().end : 0;
        int64_t end = 0;
        MMT_CHECK(!__builtin_add_overflow(before, dictionary.batch.rows, &end), FormatError, path,
                  ": dictionaries of too many values");
        parts.push_back({static_cast<uint32_t>(d), end, continues ? parts.back().generation : parts.size()});
      }
      size_t next_dictionary = 0;
      for (size_t b = 0; b < ipc.batches.size(); ++b) {
        while (next_dictionary < ipc.dictionaries.size() && ipc.dictionaries[next_dictionary].batches_before <= b)
          ++next_dictionary;
        if (ipc.batches[b].rows == 0) continue;
        arrow->batches.push_back(
            {input, static_cast<uint32_t>(b), detail::arrow_field_buffers(ipc, ipc.batches[b]), next_dictionary});
        MMT_CHECK(!__builtin_add_overflow(out.records_, ipc.batches[b].rows, &out.records_), FormatError, path,
                  ": too many rows");
        arrow->batch_end.push_back(out.records_);
      }
      arrow->dictionary_buffers.push_back(std::move(dictionary_buffers));
      arrow->dictionary_parts.push_back(std::move(parts_by_id));
      out.input_paths_.push_back(path);
      arrow->inputs.push_back(std::move(ipc));
    }
  }
  const ArrowIpc& first = arrow->inputs.front();
  // The columns, and which are packed.
  std::vector<ArrowColumns::Column> all;
  std::vector<std::string> refused;
  std::vector<std::string> masks_asked;  // NAME.valid chosen by name
  for (const ArrowField& field : first.fields) add_columns(field, "", {}, "", all, refused);
  if (fields.empty()) {
    MMT_CHECK(refused.empty(), ValueError, first.path, ": columns of types no field holds: ",
              detail::cut_for_message(detail::joined(refused), 2000), "; choose the columns to pack (mmt pack --field NAME, repeated; PackSources::from_arrow's fields)");
    arrow->columns = all;
  } else {
    const auto chosen = [&](const std::string& name) {
      return std::any_of(arrow->columns.begin(), arrow->columns.end(),
                         [&](const ArrowColumns::Column& c) { return c.name == name; });
    };
    // Each column once: one named twice is refused; one a struct's name also brings is not.
    const auto choose = [&](const ArrowColumns::Column& column) {
      if (!chosen(column.name)) arrow->columns.push_back(column);
    };
    for (size_t k = 0; k < fields.size(); ++k) {
      const std::string& name = fields[k];
      MMT_CHECK(std::find(fields.begin(), fields.begin() + static_cast<ptrdiff_t>(k), name) == fields.begin() + static_cast<ptrdiff_t>(k),
                ValueError, first.path, ": column '", detail::cut_for_message(name, 100), "' is chosen twice");
      const auto named = [&](const std::string& column_name) {
        return std::find_if(all.begin(), all.end(), [&](const ArrowColumns::Column& c) { return c.name == column_name; });
      };
      auto it = named(name);
      // NAME.valid, the mask of a column with nulls (verify chooses every field a pack made):
      // NAME, which brings it (checked below, once the nulls are counted).
      if (it == all.end() && name.ends_with(".valid")) {
        const std::string column = name.substr(0, name.size() - 6);
        it = named(column);
        if (it != all.end() && it->lengths) it = all.end();  // a list of strings' mask is NAME.valid
        if (it != all.end()) masks_asked.push_back(name);
        // A list of strings' mask, its lengths chosen without its strings: the lengths bring it.
        const auto asked = [&](const std::string& n) { return std::find(fields.begin(), fields.end(), n) != fields.end(); };
        if (it != all.end() && asked(column + ".lengths") && !asked(column)) continue;
      }
      if (it != all.end()) {
        choose(*it);
        // A list of strings' lengths follow its strings, unless chosen apart: the joined bytes
        // alone could not be split.
        const auto next = it + 1;
        if (next != all.end() && next->lengths && !it->lengths &&
            std::find(fields.begin(), fields.end(), next->name) == fields.end())
          choose(*next);
        continue;
      }
      const auto refusal = [&](const std::string& column_name) {
        return std::find_if(refused.begin(), refused.end(),
                            [&](const std::string& r) { return r.starts_with(str("'", column_name)); });
      };
      const auto why = refusal(str(name, "' ("));
      MMT_CHECK(why == refused.end(), ValueError, first.path, ": column ", *why, " is of a type no field holds");
      // A struct (or a list of structs) by its name: all its columns.
      const std::string prefix = str(name, ".");
      const auto inner_why = refusal(prefix);
      MMT_CHECK(inner_why == refused.end(), ValueError, first.path, ": column ", *inner_why,
                " is of a type no field holds; choose the others of '", detail::cut_for_message(name, 100), "' by their names");
      bool found = false;
      for (const ArrowColumns::Column& c : all) {
        if (!c.name.starts_with(prefix)) continue;
        choose(c);
        found = true;
      }
      if (found) continue;
      std::vector<std::string> known;
      for (const ArrowColumns::Column& c : all) known.push_back(c.name);
      throw ValueError(str(first.path, ": no column '", detail::cut_for_message(name, 100), "' (its columns: ",
                           detail::cut_for_message(detail::joined(known), 2000), ")"));
    }
  }
  MMT_CHECK(!arrow->columns.empty(), ValueError, first.path, ": no columns");

  // Dictionaries: each one a column reads holds values of its type, their buffers checked.
  std::vector<std::vector<bool>> dictionary_checked(arrow->inputs.size());
  for (size_t i = 0; i < arrow->inputs.size(); ++i) dictionary_checked[i].assign(arrow->inputs[i].dictionaries.size(), false);
  for (const ArrowColumns::Column& column : arrow->columns) {
    if (!column.dictionary) continue;
    ArrowColumns::Column values = column;
    values.path.clear();
    values.structs = 0;
    values.dictionary = false;
    for (size_t i = 0; i < arrow->inputs.size(); ++i) {
      const ArrowIpc& ipc = arrow->inputs[i];
      for (size_t d = 0; d < ipc.dictionaries.size(); ++d) {
        const detail::ArrowDictionary& dictionary = ipc.dictionaries[d];
        if (dictionary.id != column.dictionary_id) continue;
        if (dictionary_checked[i][d]) continue;  // another column of this id checked it (of one value type)
        dictionary_checked[i][d] = true;
        const BatchView view(ipc, dictionary.batch, arrow->dictionary_buffers[i][d], "dictionary batch");
        MMT_CHECK(arrow_type_name(dictionary.value->front()) == column.value_type, FormatError, view.where(),
                  ": column '", detail::cut_for_message(column.name, 100), "' reads dictionary ", column.dictionary_id,
                  " as ", column.value_type, ", but it holds ", arrow_type_name(dictionary.value->front()));
        guard_input(ipc, [&] { view.check(values); });
      }
    }
  }

  // Every row read once: the buffers checked, each list level's length seen (a level is
  // fixed where every row's is the same), nulls counted, jagged rows refused.
  for (ArrowColumns::Column& column : arrow->columns) {
    const std::vector<const ArrowColumns::Level*> lists = list_levels(column);
    const size_t levels = lists.size();
    std::vector<int64_t> common(levels, -2);  // -2: none seen; -1: lengths differ
    const bool variable_leaf = column.leaf == ArrowColumns::Leaf::Bytes;
    const bool joined = variable_leaf && levels > 0 && !column.lengths;  // a list of strings' bytes
    const bool floating = (column.leaf == ArrowColumns::Leaf::Values || column.leaf == ArrowColumns::Leaf::Decimal) &&
                          is_floating_point(column.dtype);
    int64_t filled_nulls = 0;  // null rows stored as NaN or zeros (where the field is fixed)
    RowAt at;
    for (size_t b = 0; b < arrow->batches.size(); ++b) {
      const ColumnReader reader(*arrow, b);
      int64_t view_bytes = 0, view_held = -1;  // for refuse_repeated_views
      guard_input(arrow->inputs[arrow->batches[b].input], [&] {
        reader.view().check(column);
        const ArrowIpc& ipc = arrow->inputs[arrow->batches[b].input];
        const int64_t rows = ipc.batches[arrow->batches[b].batch].rows;
        for (int64_t r = 0; r < rows; ++r) {
          reader.row(column, r, at);
          refuse_repeated_views(column, r, at, &view_bytes, &view_held);
          if (at.null) {
            // Floats take NaN where the field is fixed (as pandas reads them); a variable
            // field stores the row empty (its outer length then varies); other fixed fields
            // store zeros. NAME.valid says which rows are null.
            const bool outer_variable = levels > 0 && lists[0]->kind != ArrowColumns::Level::Kind::FixedList;
            ++column.nulls;
            if (!floating && !variable_leaf && !outer_variable) {
              ++filled_nulls;
              continue;
            }
            if (floating) ++filled_nulls;
            // Stored empty: the outer length varies, a fixed-size list's of strings too (its
            // lengths field is then ragged). Floats keep their shape, filled with NaN.
            if (levels > 0 && !floating) common[0] = -1;
            continue;
          }
          for (size_t k = 0; k < levels && !joined; ++k) {
            const int64_t length = at.dims[k];
            if (length == kVariableDim) continue;  // under an empty list: unknown
            common[k] = common[k] == -2 ? length : common[k] == length ? length : -1;
          }
          const bool items = column.leaf == ArrowColumns::Leaf::Values || column.lengths;
          out.total_bytes_ += items                                         ? (at.end - at.start) * column.item
                              : column.leaf == ArrowColumns::Leaf::Decimal ? (at.end - at.start) * 8  // as float64
                              : column.views                                ? at.dims.back()
                                                                            : at.end - at.start;
        }
      });
    }
    for (size_t k = 0; k < levels && !joined; ++k) {
      const ArrowColumns::Level& level = *lists[k];
      const bool fixed_list = level.kind == ArrowColumns::Level::Kind::FixedList && (k > 0 || common[0] != -1 || floating);
      column.shape.push_back(fixed_list ? level.fixed : common[k] >= 1 ? common[k] : kVariableDim);
    }
    if (column.leaf == ArrowColumns::Leaf::FixedBytes) column.shape.push_back(column.item);
    if (variable_leaf && !column.lengths) column.shape.push_back(kVariableDim);
    if (std::none_of(column.shape.begin(), column.shape.end(), [](int64_t d) { return d == kVariableDim; })) {
      int64_t values = 1;  // the NaN or zeros of a null row
      for (const int64_t d : column.shape) values *= d;
      out.total_bytes_ += filled_nulls * values * static_cast<int64_t>(element_size(column.dtype));
    }
  }

  // The NAME.valid of each column with nulls, right after it; a list of strings', after its
  // lengths (null in the same rows), or after the lengths alone when they are chosen without
  // the strings: a mask reads the null rows of the column before it. A mask never takes the
  // name of a column of the file, chosen or not: verify, asking for it by name, would get
  // that column.
  const auto is_chosen = [&](const std::string& name) {
    return std::any_of(arrow->columns.begin(), arrow->columns.end(), [&](const ArrowColumns::Column& c) { return c.name == name; });
  };
  std::vector<ArrowColumns::Column> with_validity;
  for (size_t c = 0; c < arrow->columns.size(); ++c) {
    const ArrowColumns::Column& column = arrow->columns[c];
    with_validity.push_back(column);
    if (column.nulls == 0) continue;
    // A list of strings' lengths chosen apart from its strings: the strings' mask is theirs.
    const std::string strings = column.lengths ? column.name.substr(0, column.name.size() - 8) : column.name;
    if (column.lengths && is_chosen(strings)) continue;
    const bool lengths_follow = !column.lengths && c + 1 < arrow->columns.size() &&
                                arrow->columns[c + 1].lengths && arrow->columns[c + 1].name == column.name + ".lengths";
    if (lengths_follow) with_validity.push_back(arrow->columns[++c]);
    const std::string name = strings + ".valid";
    for (const ArrowColumns::Column& other : all)
      MMT_CHECK(other.name != name, ValueError, first.path, ": column '", detail::cut_for_message(strings, 100),
                "' has nulls, and its mask, '", detail::cut_for_message(name, 100),
                "', would take the name of a column of the file; leave '", detail::cut_for_message(strings, 100),
                "' out (mmt pack --field NAME, repeated), or rename one of the two");
    ArrowColumns::Column valid = with_validity.back();
    valid.name = name;
    // The strings' Arrow type, without the lengths' mark.
    valid.type_name = column.type_name.substr(0, column.type_name.size() - (column.lengths ? kLengthsType.size() : 0)) + " (valid)";
    valid.lengths = false;
    valid.views = false;  // nothing of its column's is read for it: the rows' nulls alone
    valid.validity = true;
    valid.dtype = kBool;
    valid.shape.clear();
    valid.nulls = 0;
    out.total_bytes_ += out.records_;
    with_validity.push_back(std::move(valid));
  }
  arrow->columns = std::move(with_validity);
  for (const std::string& mask : masks_asked)
    MMT_CHECK(is_chosen(mask), ValueError, first.path, ": no column '", detail::cut_for_message(mask, 100), "': column '",
              detail::cut_for_message(mask.substr(0, mask.size() - 6), 100), "' has no nulls, so no mask");

  std::vector<Field> schema_fields;
  nlohmann::json types = nlohmann::json::object(), nulls = nlohmann::json::object();
  std::vector<std::string> names;
  for (const ArrowColumns::Column& column : arrow->columns) {
    try {
      const bool fixed = std::none_of(column.shape.begin(), column.shape.end(), [](int64_t d) { return d == kVariableDim; });
      schema_fields.push_back(fixed ? Field::fixed(column.name, column.dtype, column.shape)
                                    : Field::ragged(column.name, column.dtype, column.shape));
    } catch (const ValueError& e) {
      throw ValueError(str(first.path, ": column '", detail::cut_for_message(column.name, 100), "' cannot be a field: ",
                           e.what()));
    }
    types[column.name] = column.type_name;
    if (column.nulls > 0) nulls[column.name] = column.nulls;
    names.push_back(column.name);
    out.origins_.push_back(str(column.name, "=", first.path, arrow->inputs.size() > 1 ? ", ..." : "", " (Arrow column, ",
                               column.type_name, ")"));
  }
  try {
    out.schema_ = Schema(std::move(schema_fields));
  } catch (const ValueError& e) {  // "a.b" flattened onto a column of that name
    throw ValueError(str(first.path, ": ", e.what()));
  }
  out.metadata_["source"] = source;
  out.metadata_["arrow_types"] = types.dump();
  if (!nulls.empty()) out.metadata_["arrow_nulls"] = nulls.dump();
  for (const auto& [key, value] : first.metadata) {
    if (key != "huggingface") continue;
    // Hugging Face's features (Image, Audio, ClassLabel...): what the bytes and numbers are.
    out.metadata_["huggingface"] = value;
    const nlohmann::json parsed = nlohmann::json::parse(value, nullptr, false);
    if (const std::optional<std::vector<std::string>> classes = class_names(parsed, names))
      out.metadata_["classes"] = nlohmann::json(*classes).dump();
  }
  out.arrow_ = std::move(arrow);
  return out;
}

namespace {

// The byte lengths of strings [at.start, at.end) of a list-of-strings column, from their offsets.
Tensor string_lengths(const ArrowColumns::Column& column, int64_t row, const RowAt& at) {
  Tensor lengths = empty({at.end - at.start}, kInt64);
  if (at.end == at.start) return lengths;
  auto* out = static_cast<int64_t*>(lengths.mutable_data_ptr());
  const BatchView& view = at.view;
  const ArrowBatch::Buffer& offsets = view.buffer(column.leaf_node, 1);
  if (column.views) {
    detail::guard_storage_reads(view.bytes(), [&] {
      BatchView::StringAt string;
      for (int64_t j = at.start; j < at.end; ++j) {
        MMT_CHECK(view.string_at(column.leaf_node, j, string), IoError, view.where(), ": column '", column.name,
                  "', row ", row, ": changed while the file was being packed");
        out[j - at.start] = string.length;
      }
    });
    return lengths;
  }
  detail::guard_storage_reads(view.bytes(), [&] {
    int64_t previous = view.offset_at(offsets, column.wide_offsets, at.start);
    for (int64_t j = at.start; j < at.end; ++j) {
      const int64_t next = view.offset_at(offsets, column.wide_offsets, j + 1);
      MMT_CHECK(next >= previous, IoError, view.where(), ": column '", column.name, "', row ", row,
                ": changed while the file was being packed");
      out[j - at.start] = next - previous;
      previous = next;
    }
  });
  return lengths;
}

// A decimal's value: its integer (`bytes` of little-endian two's complement) times 10^-scale.
// The integer and the power of ten are exact as doubles up to 15 digits and 10^22, so the one
// rounding of the division gives the double nearest the decimal, which reads back as it.
double decimal_value(const std::byte* p, int64_t bytes, int scale) {
  static constexpr double kPowers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                       1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  const auto load = [](const std::byte* q, int64_t n) {  // n <= 16 bytes, sign-extended
    unsigned __int128 u = 0;
    std::memcpy(&u, q, static_cast<size_t>(n));
    const int shift = static_cast<int>(128 - 8 * n);
    return shift == 0 ? static_cast<__int128>(u) : static_cast<__int128>(u << shift) >> shift;
  };
  double value;
  if (bytes <= 16) {
    value = static_cast<double>(load(p, bytes));
  } else {  // decimal256: as an __int128 when its high half only extends the low half's sign
    const __int128 low = load(p, 16), high = load(p + 16, 16);
    value = high == (low < 0 ? -1 : 0)
                ? static_cast<double>(low)  // past that, |value| >= 2^127: the sum loses no more than a rounding
                : std::ldexp(static_cast<double>(high), 128) + static_cast<double>(static_cast<unsigned __int128>(low));
  }
  const int magnitude = scale < 0 ? -scale : scale;
  if (magnitude < 23) return scale >= 0 ? value / kPowers[magnitude] : value * kPowers[magnitude];
  // 10^23 and past are not doubles: the decimal's text, read back, is the nearest one (for an
  // integer a double holds exactly; a larger one is rounded already).
  if (std::abs(value) < 0x1p53) {
    char text[48];
    const auto integer = std::to_chars(text, text + 24, static_cast<int64_t>(value)).ptr;
    *integer = 'e';
    const auto end = std::to_chars(integer + 1, text + sizeof text, -scale).ptr;
    double nearest = 0;
    std::from_chars(text, end, nearest);  // never out of range: 16 digits, an exponent within 76
    return nearest;
  }
  return scale >= 0 ? value / std::pow(10.0, magnitude) : value * std::pow(10.0, magnitude);
}

// Leaf values [start, end) of a Bool or Decimal column, whose buffer begins at `data`,
// converted into `out`: bools (Arrow's bits) as bytes 0 and 1, decimals as float64.
void convert_leaf(const ArrowColumns::Column& column, const std::byte* data, int64_t start, int64_t end, void* out) {
  if (column.leaf == ArrowColumns::Leaf::Bool) {
    const auto* bits = reinterpret_cast<const uint8_t*>(data);
    auto* to = static_cast<uint8_t*>(out);
    for (int64_t j = start; j < end; ++j) to[j - start] = (bits[j / 8] >> (j % 8)) & 1;
    return;
  }
  auto* to = static_cast<double*>(out);
  for (int64_t j = start; j < end; ++j) to[j - start] = decimal_value(data + j * column.item, column.item, column.scale);
}

// The strings [at.start, at.end) of a binary_view/string_view column, their bytes joined: one
// is a view of the mapped file, several are gathered from where their views say.
Tensor view_strings(const ArrowColumns::Column& column, int64_t row, const RowAt& at) {
  const BatchView& view = at.view;
  const auto changed = [&] {
    return IoError(str(view.where(), ": column '", column.name, "', row ", row, ": changed while the file was being packed"));
  };
  const int64_t total = at.dims.back();
  BatchView::StringAt string;
  if (at.end - at.start == 1) {
    bool found = false;
    detail::guard_storage_reads(view.bytes(), [&] { found = view.string_at(column.leaf_node, at.start, string); });
    if (!found || string.length != total) throw changed();
    return Tensor(view.bytes(), kUInt8, {total}, string.offset);
  }
  Tensor joined = empty({total}, kUInt8);
  auto* out = static_cast<std::byte*>(joined.mutable_data_ptr());
  int64_t filled = 0;
  detail::guard_storage_reads(view.bytes(), [&] {
    for (int64_t j = at.start; j < at.end; ++j) {
      if (!view.string_at(column.leaf_node, j, string) || string.length > total - filled) throw changed();
      if (string.length == 0) continue;  // (a list of empty strings joins to no bytes: `out` is null)
      std::memcpy(out + filled, view.bytes().data() + string.offset, static_cast<size_t>(string.length));
      filled += string.length;
    }
  });
  if (filled != total) throw changed();
  return joined;
}

// Row `r` of `column` as `field` holds it, `at` being where row() found it: a view of the
// file where its values lie so, else converted (bools, decimals, views' strings, nulls).
void row_value(const ArrowColumns::Column& column, const Field& field, int64_t r, RowAt& at, Tensor& value) {
  if (column.validity) {
    value = full({}, at.null ? 0 : 1, kBool);
    return;
  }
  if (at.null) {  // NaN in a fixed float field, zeros in another, else empty
    if (field.is_fixed()) {
      value = full(field.shape, is_floating_point(field.dtype) ? std::numeric_limits<double>::quiet_NaN() : 0.0,
                   field.dtype);
      return;
    }
    DimVector shape = field.shape;
    for (int64_t& d : shape) d = d == kVariableDim ? 0 : d;
    value = empty(shape, field.dtype);
    return;
  }
  // Dimensions under an empty list are the field's (0 where it varies). The file could have
  // changed since it was checked: what is read must still fit the field.
  const BatchView& view = at.view;
  MMT_CHECK(at.dims.size() == field.shape.size(), IoError, view.where(), ": column '", column.name, "', row ", r,
            ": its shape changed while the file was being packed");
  for (size_t k = 0; k < at.dims.size(); ++k) {
    if (at.dims[k] == kVariableDim) at.dims[k] = field.shape[k] == kVariableDim ? 0 : field.shape[k];
    MMT_CHECK(field.shape[k] == kVariableDim || field.shape[k] == at.dims[k], IoError, view.where(), ": column '",
              column.name, "', row ", r, ": its shape changed while the file was being packed");
  }
  switch (column.leaf) {
    case ArrowColumns::Leaf::Values: {
      const ArrowBatch::Buffer& data = view.buffer(column.leaf_node, 1);
      MMT_CHECK(at.start >= 0 && at.end >= at.start && at.end <= data.length / column.item, IoError, view.where(),
                ": column '", column.name, "', row ", r, ": changed while the file was being packed");
      if (at.end == at.start) {
        value = empty(at.dims, column.dtype);
      } else if (data.offset % column.item == 0) {
        value = Tensor(view.bytes(), column.dtype, at.dims, data.offset / column.item + at.start);
      } else {  // unaligned (a writer that does not pad): copied
        Tensor copy = empty(at.dims, column.dtype);
        detail::guard_storage_reads(view.bytes(), [&] {
          std::memcpy(copy.mutable_data_ptr(), view.bytes().data() + data.offset + at.start * column.item,
                      static_cast<size_t>((at.end - at.start) * column.item));
        });
        value = std::move(copy);
      }
      break;
    }
    case ArrowColumns::Leaf::Decimal:
    case ArrowColumns::Leaf::Bool: {  // converted: bools from bits, decimals to float64
      const ArrowBatch::Buffer& data = view.buffer(column.leaf_node, 1);
      const bool bools = column.leaf == ArrowColumns::Leaf::Bool;
      MMT_CHECK(at.start >= 0 && at.end >= at.start &&
                    (bools ? (at.end + 7) / 8 <= data.length : at.end <= data.length / column.item),
                IoError, view.where(), ": column '", column.name, "', row ", r,
                ": changed while the file was being packed");
      Tensor converted = empty(at.dims, bools ? kBool : kFloat64);
      if (at.end > at.start)
        detail::guard_storage_reads(view.bytes(), [&] {
          convert_leaf(column, view.bytes().data() + data.offset, at.start, at.end, converted.mutable_data_ptr());
        });
      value = std::move(converted);
      break;
    }
    case ArrowColumns::Leaf::FixedBytes:
    case ArrowColumns::Leaf::Bytes: {
      if (column.lengths) {
        value = string_lengths(column, r, at);
        break;
      }
      if (at.end == at.start) {
        value = empty(at.dims, kUInt8);
        break;
      }
      if (column.views) {
        value = view_strings(column, r, at);
        break;
      }
      const ArrowBatch::Buffer& data = view.buffer(column.leaf_node, column.leaf == ArrowColumns::Leaf::Bytes ? 2 : 1);
      MMT_CHECK(at.start >= 0 && at.end >= at.start && at.end <= data.length, IoError, view.where(), ": column '",
                column.name, "', row ", r, ": changed while the file was being packed");
      value = Tensor(view.bytes(), kUInt8, at.dims, data.offset + at.start);
      break;
    }
  }
}

// The bytes of strings and lists a batch of rows holds, at most (but for its first row).
constexpr int64_t kBatchBytes = int64_t{4} << 20;

// A record batch's rows as one batch for DatasetWriter::append_batch(values, offsets): most
// columns are views of the file as they lie (numbers, fixed-size lists of them, fixed-size
// binaries), strings and lists go in their jagged layout (the values as they lie, the offsets
// copied), bools and decimals are converted. The rows then cost one copy per field and
// chunk, not the per-record work of arrow_record(). Columns whose rows need that work
// (dictionaries, views, lists of strings or structs, null rows whose strings hold bytes) are
// read row by row as arrow_record() reads them, into one buffer (GatheredRows), and so is a
// column whose rows are out of place (the file changed since it was checked): row() then
// refuses them with arrow_record()'s message.
class BatchRows {
 public:
  BatchRows(const ArrowColumns::Column& column, const BatchView& view) : column_(column), view_(view) {
    if (column.dictionary || column.views || column.lengths) return;
    size_t k = column.structs;
    top_ = k < column.path.size() ? column.path[k].node : column.leaf_node;
    if (k < column.path.size() && column.path[k].kind != ArrowColumns::Level::Kind::FixedList) {
      if (column.path[k].kind == ArrowColumns::Level::Kind::Struct) return;  // a list of structs is row by row
      listed_ = true;
      wide_ = column.path[k].kind == ArrowColumns::Level::Kind::LargeList;
      ++k;
    }
    for (; k < column.path.size(); ++k) {
      if (column.path[k].kind != ArrowColumns::Level::Kind::FixedList) return;
      fixed_.push_back(&column.path[k]);
      inner_ *= column.path[k].fixed;
    }
    if (column.leaf == ArrowColumns::Leaf::Bytes && (listed_ || !fixed_.empty())) return;
    possible_ = true;
  }
  bool possible() const { return possible_; }
  // Whether the rows are jagged (strings, lists): read offsets() first.
  bool jagged() const { return listed_ || column_.leaf == ArrowColumns::Leaf::Bytes; }

  // Rows [row, row + count): their nulls (a struct's, or the row's own), false when none of
  // them is null; `nulls` is then left empty.
  bool nulls(int64_t row, int64_t count, std::vector<uint8_t>& nulls) const {
    nulls.clear();
    bool any = false;
    for (size_t k = 0; k <= column_.structs; ++k) {
      const int node = k < column_.structs ? column_.path[k].node : top_;
      if (view_.node(node).null_count == 0) continue;
      if (nulls.empty()) nulls.assign(static_cast<size_t>(count), 0);
      for (int64_t i = 0; i < count; ++i)
        if (view_.is_null(node, row + i)) nulls[static_cast<size_t>(i)] = 1, any = true;
    }
    if (!any) nulls.clear();
    return any;
  }
  // The offsets of jagged rows [row, row + count) into `out` (count + 1 of them, in leaf rows:
  // a string's bytes, a list's elements); false if out of order or past the values they index.
  bool offsets(int64_t row, int64_t count, std::vector<int64_t>& out) const {
    const int node = listed_ ? top_ : column_.leaf_node;
    const ArrowBatch::Buffer& buffer = view_.buffer(node, 1);
    const bool wide = listed_ ? wide_ : column_.wide_offsets;
    if (row + count > view_.node(node).length || buffer.length / (wide ? 8 : 4) < row + count + 1) return false;
    out.resize(static_cast<size_t>(count + 1));
    for (int64_t i = 0; i <= count; ++i) out[static_cast<size_t>(i)] = view_.offset_at(buffer, wide, row + i);
    for (int64_t i = 0; i < count; ++i)
      if (out[static_cast<size_t>(i) + 1] < out[static_cast<size_t>(i)]) return false;
    const int64_t children = listed_ ? view_.node(fixed_.empty() ? column_.leaf_node : fixed_[0]->node).length
                                     : view_.buffer(column_.leaf_node, 2).length;
    return out[0] >= 0 && out.back() <= children;
  }
  // Bytes one leaf row of `offsets()` holds (what the batch's size is counted in).
  int64_t row_bytes() const {
    if (column_.leaf == ArrowColumns::Leaf::Bytes) return 1;
    return inner_ * (column_.leaf == ArrowColumns::Leaf::Bool ? 1 : element_size(column_.dtype));
  }

  // The rows as `field` takes them: values [count, ...] (or back to back, with `offsets`, for
  // jagged rows, whose offsets() are `at`), or false for rows that go one at a time.
  bool read(const Field& field, int64_t row, int64_t count, const std::vector<uint8_t>& nulls,
            const std::vector<int64_t>& at, Tensor& values, Tensor& offsets) const {
    if (column_.dtype != field.dtype) return false;
    if (!jagged()) {
      DimVector shape{count};
      for (const ArrowColumns::Level* level : fixed_) shape.push_back(level->fixed);
      if (column_.leaf == ArrowColumns::Leaf::FixedBytes) shape.push_back(column_.item);
      if (!(IntArrayRef(shape.data() + 1, shape.size() - 1) == IntArrayRef(field.shape))) return false;
      if (!inner_values_present(row, count, nulls)) return false;
      if (!leaf(row * inner_, (row + count) * inner_, shape, values)) return false;
      if (!nulls.empty()) fill_nulls(values, nulls);
      return true;
    }
    // Jagged: a null row holds nothing (its lists, or string, must be empty as it lies).
    for (size_t i = 0; i < nulls.size(); ++i)
      if (nulls[i] != 0 && at[i + 1] != at[i]) return false;
    const int64_t first = at.front(), last = at.back();
    if (listed_ && !inner_values_present(first, last - first, {})) return false;
    DimVector shape{last - first};
    for (const ArrowColumns::Level* level : fixed_) shape.push_back(level->fixed);
    if (field.shape.size() != shape.size() ||
        !std::equal(shape.begin() + 1, shape.end(), field.shape.begin() + 1))
      return false;
    if (field.shape[0] != kVariableDim) {  // every row the field's length: a [count, length, ...] view
      for (size_t i = 0; i + 1 < at.size(); ++i)
        if (at[i + 1] - at[i] != field.shape[0]) return false;
      DimVector rows{count, field.shape[0]};
      for (const ArrowColumns::Level* level : fixed_) rows.push_back(level->fixed);
      return leaf(first * inner_, last * inner_, rows, values);
    }
    if (!leaf(first * inner_, last * inner_, shape, values)) return false;
    offsets = empty({count + 1}, kInt64);
    auto* out = offsets.mutable_data_ptr<int64_t>();
    for (size_t i = 0; i < at.size(); ++i) out[i] = at[i] - first;
    return true;
  }

 private:
  // Leaf values [start, end) (bytes for strings) as a tensor of `shape`: a view where they lie
  // in place, else converted (bools, decimals); false if past their buffer.
  bool leaf(int64_t start, int64_t end, const DimVector& shape, Tensor& out) const {
    const int n = column_.leaf_node;
    if (column_.leaf != ArrowColumns::Leaf::Bytes && end > view_.node(n).length) return false;
    switch (column_.leaf) {
      case ArrowColumns::Leaf::Values:
      case ArrowColumns::Leaf::FixedBytes: {
        const ArrowBatch::Buffer& data = view_.buffer(n, 1);
        const int64_t item = column_.leaf == ArrowColumns::Leaf::Values ? column_.item : 1;
        const int64_t scale = column_.leaf == ArrowColumns::Leaf::Values ? 1 : column_.item;  // bytes a value
        if (data.offset % item != 0 || end * scale > data.length / item) return false;
        out = Tensor(view_.bytes(), column_.dtype, shape, data.offset / item + start * scale);
        return true;
      }
      case ArrowColumns::Leaf::Bytes: {
        const ArrowBatch::Buffer& data = view_.buffer(n, 2);
        if (end > data.length) return false;
        out = Tensor(view_.bytes(), kUInt8, shape, data.offset + start);
        return true;
      }
      case ArrowColumns::Leaf::Bool:
      case ArrowColumns::Leaf::Decimal: {
        const ArrowBatch::Buffer& data = view_.buffer(n, 1);
        const bool bools = column_.leaf == ArrowColumns::Leaf::Bool;
        if (bools ? (end + 7) / 8 > data.length : end > data.length / column_.item) return false;
        out = empty(shape, bools ? kBool : kFloat64);
        convert_leaf(column_, view_.bytes().data() + data.offset, start, end, out.mutable_data_ptr());
        return true;
      }
    }
    return false;
  }
  // Whether no value below elements [start, start + count) of the top level is null: the
  // fixed-size lists inside, and the leaf under any list (arrow_record() refuses a null inside
  // a list). For a fixed-size list the elements are the rows, and those in `nulls` are left
  // out: a null row's values are never read.
  bool inner_values_present(int64_t start, int64_t count, const std::vector<uint8_t>& nulls) const {
    if (!listed_ && fixed_.empty()) return true;  // the leaf's nulls are the rows'
    std::vector<std::pair<int, int64_t>> below;  // a node, and its values an element holds
    int64_t per = listed_ ? 1 : fixed_[0]->fixed;
    for (size_t k = listed_ ? 0 : 1; k < fixed_.size(); ++k) {
      below.emplace_back(fixed_[k]->node, per);
      per *= fixed_[k]->fixed;
    }
    below.emplace_back(column_.leaf_node, per);
    for (const auto& [node, values] : below) {
      if (view_.node(node).null_count == 0) continue;
      if (nulls.empty()) {
        if (view_.any_null(node, start * values, (start + count) * values)) return false;
        continue;
      }
      for (int64_t i = 0; i < count; ++i)
        if (nulls[static_cast<size_t>(i)] == 0 && view_.any_null(node, (start + i) * values, (start + i + 1) * values))
          return false;
    }
    return true;
  }
  // Null rows of a fixed field: NaN for floats, else zeros (arrow_record()'s values for them).
  void fill_nulls(Tensor& values, const std::vector<uint8_t>& nulls) const {
    // A view of the file is copied first; bools and decimals were converted into their own.
    const bool view = column_.leaf == ArrowColumns::Leaf::Values || column_.leaf == ArrowColumns::Leaf::FixedBytes;
    Tensor copy = view ? values.clone(MemoryFormat::Contiguous) : values;
    const int64_t record_bytes = copy.nbytes() / std::max<int64_t>(copy.size(0), 1);
    auto* base = static_cast<std::byte*>(copy.mutable_data_ptr());
    const IntArrayRef sizes = copy.sizes();
    const Tensor filler = full(IntArrayRef(sizes.data() + 1, sizes.size() - 1),
                               is_floating_point(copy.dtype()) ? std::numeric_limits<double>::quiet_NaN() : 0.0,
                               copy.dtype());
    for (size_t i = 0; i < nulls.size(); ++i)
      if (nulls[i] != 0) std::memcpy(base + static_cast<int64_t>(i) * record_bytes, filler.data_ptr(), record_bytes);
    values = std::move(copy);
  }

  const ArrowColumns::Column& column_;
  const BatchView& view_;
  bool possible_ = false;
  int top_ = 0;         // the node whose nulls are the row's own
  bool listed_ = false;  // a list (List or LargeList) first: jagged
  bool wide_ = false;
  std::vector<const ArrowColumns::Level*> fixed_;  // the fixed-size lists after it
  int64_t inner_ = 1;                              // leaf values an element of the top level holds
};

// The rows of a column that a batch cannot take as they lie (dictionaries, views, lists of
// strings, null rows whose strings hold bytes, ...), each read as arrow_record() reads it
// and copied one after another: the writer still copies the batch once per field and chunk.
struct GatheredRows {
  bool wanted = false;
  std::vector<std::byte> bytes;
  std::vector<int64_t> ends;  // after each row: its bytes (a fixed field) or rows along dimension 0
  std::vector<uint8_t> null;  // each row's

  // Whether a batch holds the field's rows: fixed, or varying in its first dimension alone.
  static bool holds(const Field& field) {
    return field.is_fixed() || (field.variable_dims() == 1 && field.shape[0] == kVariableDim);
  }
  // Reads row `row` after those read so far; returns its bytes, or -1 (and reads nothing) for
  // a row of `too_big` bytes or more. Refusals are arrow_record()'s.
  int64_t read(const ColumnReader& reader, const ArrowColumns::Column& column, const Field& field, int64_t row,
               int64_t too_big = INT64_MAX) {
    thread_local RowAt at;
    reader.row(column, row, at);
    refuse_repeated_views(column, row, at);
    if (!at.null) {  // its value's bytes, saturating (views may name one string many times)
      int64_t bytes = element_size(field.dtype);
      for (const int64_t d : at.dims)
        if (__builtin_mul_overflow(bytes, std::max<int64_t>(d, 0), &bytes)) bytes = INT64_MAX;
      if (bytes >= too_big) return -1;
    }
    row_value(column, field, row, at, value_);
    const Tensor dense = value_.contiguous();
    const auto* from = static_cast<const std::byte*>(dense.data_ptr());
    if (bytes.capacity() == 0) bytes.reserve(static_cast<size_t>(kBatchBytes / 4));
    bytes.insert(bytes.end(), from, from + dense.nbytes());
    const int64_t rows_before = ends.empty() ? 0 : ends.back();
    ends.push_back(field.is_fixed() ? static_cast<int64_t>(bytes.size()) : rows_before + dense.size(0));
    null.push_back(at.null ? 1 : 0);
    return dense.nbytes();
  }
  // The first `count` rows read, as append_batch() takes them; the bytes are handed over.
  void take(const Field& field, int64_t count, Tensor& values, Tensor& offsets) {
    DimVector shape{field.is_fixed() ? count : (count == 0 ? 0 : ends[static_cast<size_t>(count) - 1])};
    for (size_t d = field.is_fixed() ? 0 : 1; d < field.shape.size(); ++d) shape.push_back(field.shape[d]);
    if (!field.is_fixed()) {
      offsets = empty({count + 1}, kInt64);
      auto* out = offsets.mutable_data_ptr<int64_t>();
      out[0] = 0;
      for (int64_t i = 0; i < count; ++i) out[i + 1] = ends[static_cast<size_t>(i)];
    }
    // The tensor owns the buffer (a huge row is not copied a second time).
    auto* held = new std::vector<std::byte>(std::move(bytes));
    if (held->empty()) held->resize(1);
    UntypedStorage storage = UntypedStorage::from_blob(
        held->data(), static_cast<int64_t>(held->size()), [held](void*) { delete held; });
    values = Tensor(std::move(storage), field.dtype, shape, 0);
  }

 private:
  Tensor value_;
};

}  // namespace

int64_t PackSources::arrow_batch(int64_t start, int64_t count, std::vector<Tensor>& values,
                                 std::vector<Tensor>& offsets) const {
  const ArrowColumns& arrow = *arrow_;
  const auto [b, row] = detail::part_of(arrow.batch_end, start);
  count = std::min(count, arrow.batch_end[b] - start);  // the rows of one record batch
  if (count <= 0) return 0;
  const ColumnReader reader(arrow, b);
  const size_t columns = arrow.columns.size();
  std::vector<BatchRows> plans;
  plans.reserve(columns);
  std::vector<GatheredRows> gathered(columns);
  for (size_t c = 0; c < columns; ++c) {
    plans.emplace_back(arrow.columns[c], reader.view());
    // A field the jagged layout cannot hold (two dimensions that vary): row by row.
    if (!arrow.columns[c].validity && !GatheredRows::holds(schema_[c])) return -count;
    gathered[c].wanted = !plans[c].possible() && !arrow.columns[c].validity;
  }
  thread_local std::vector<std::vector<int64_t>> at;     // each jagged column's offsets
  thread_local std::vector<std::vector<uint8_t>> nulls;  // each column's null rows
  at.resize(columns);
  nulls.resize(columns);
  std::vector<Tensor> batch_values(columns), batch_offsets(columns);
  const int64_t r = row;  // a plain variable for the lambda
  guard_input(arrow.inputs[arrow.batches[b].input], [&] {
    // The rows whose strings and lists come to kBatchBytes (at least one): a batch of images
    // is a few of them, not a thousand (a Ctrl-C waits for what a batch copies).
    std::vector<int64_t> bytes_before(static_cast<size_t>(count) + 1, 0);
    for (size_t c = 0; c < columns; ++c) {
      if (gathered[c].wanted || arrow.columns[c].validity || !plans[c].jagged()) continue;
      if (!plans[c].offsets(r, count, at[c])) {  // the file changed: row() says how
        gathered[c].wanted = true;
        continue;
      }
      const int64_t row_bytes = plans[c].row_bytes();
      for (int64_t i = 0; i <= count; ++i)
        bytes_before[static_cast<size_t>(i)] += (at[c][static_cast<size_t>(i)] - at[c][0]) * row_bytes;
    }
    const auto past = std::upper_bound(bytes_before.begin() + 1, bytes_before.end(), kBatchBytes);
    count = std::max<int64_t>(1, past - bytes_before.begin() - 1);
    // Gathered columns row by row, as arrow_record() reads them, up to the row that takes the
    // batch past kBatchBytes.
    const bool any_gathered =
        std::any_of(gathered.begin(), gathered.end(), [](const GatheredRows& g) { return g.wanted; });
    // A row of a megabyte or more goes alone, row by row: record() keeps its string a view of
    // the file, where the batch would copy it once more.
    int64_t gathered_bytes = 0;
    for (int64_t i = 0; any_gathered && i < count; ++i) {
      int64_t row_bytes = 0;
      for (size_t c = 0; c < columns && row_bytes >= 0; ++c) {
        if (!gathered[c].wanted) continue;
        const int64_t bytes = gathered[c].read(reader, arrow.columns[c], schema_[c], r + i, kBatchBytes / 4);
        row_bytes = bytes < 0 ? -1 : row_bytes + bytes;
      }
      if (row_bytes < 0) {
        count = i;  // the rows before it; 0: it goes by itself
        break;
      }
      gathered_bytes += row_bytes;
      if (bytes_before[static_cast<size_t>(i) + 1] + gathered_bytes > kBatchBytes) count = i + 1;
    }
    if (count == 0) return;
    for (size_t c = 0; c < columns; ++c) {
      const ArrowColumns::Column& column = arrow.columns[c];
      if (column.validity) {  // the null rows of its column, just before it
        Tensor valid = empty({count}, kBool);
        auto* out = static_cast<uint8_t*>(valid.mutable_data_ptr());
        const std::vector<uint8_t>& null = gathered[c - 1].wanted ? gathered[c - 1].null : nulls[c - 1];
        for (int64_t i = 0; i < count; ++i) out[i] = null.empty() || null[static_cast<size_t>(i)] == 0;
        batch_values[c] = std::move(valid);
        continue;
      }
      if (!gathered[c].wanted) {
        if (plans[c].jagged()) at[c].resize(static_cast<size_t>(count) + 1);
        plans[c].nulls(r, count, nulls[c]);
        if (plans[c].read(schema_[c], r, count, nulls[c], at[c], batch_values[c], batch_offsets[c])) continue;
        // Rows the batch cannot take as they lie (a null string holding bytes): gathered.
        gathered[c].wanted = true;
        for (int64_t i = 0; i < count; ++i) gathered[c].read(reader, column, schema_[c], r + i);
      }
      gathered[c].take(schema_[c], count, batch_values[c], batch_offsets[c]);
    }
  });
  if (count == 0) return -1;  // a row too big to copy into the batch
  values = std::move(batch_values);
  offsets = std::move(batch_offsets);
  return count;
}

void PackSources::arrow_record(int64_t index, std::vector<Tensor>& values) const {
  const ArrowColumns& arrow = *arrow_;
  const auto [b, row] = detail::part_of(arrow.batch_end, index);
  const ColumnReader reader(arrow, b);
  thread_local std::vector<RowAt> rows;  // record() runs on many threads; no allocation a record
  rows.resize(arrow.columns.size());
  const int64_t r = row;  // a plain variable for the lambda
  guard_input(arrow.inputs[arrow.batches[b].input], [&] {
    for (size_t c = 0; c < arrow.columns.size(); ++c) {
      if (arrow.columns[c].validity) {  // its column's, just before it: not read again
        rows[c].null = rows[c - 1].null;
        continue;
      }
      reader.row(arrow.columns[c], r, rows[c]);
    }
  });
  for (size_t c = 0; c < arrow.columns.size(); ++c) refuse_repeated_views(arrow.columns[c], r, rows[c]);
  for (size_t c = 0; c < arrow.columns.size(); ++c) row_value(arrow.columns[c], schema_[c], r, rows[c], values[c]);
}

bool PackSources::is_null_mask(std::string_view name) const {
  const auto types = metadata_.find("arrow_types");
  if (types == metadata_.end() || !schema_.find(name)) return false;
  const nlohmann::json arrow_types = nlohmann::json::parse(types->second, nullptr, /*allow_exceptions=*/false);
  if (!arrow_types.is_object()) return false;
  const auto type = arrow_types.find(std::string(name));
  return type != arrow_types.end() && type->is_string() && type->get<std::string>().ends_with(" (valid)");
}

std::string PackSources::arrow_origin(size_t field, int64_t index) const {
  const ArrowColumns& arrow = *arrow_;
  const auto [b, row] = detail::part_of(arrow.batch_end, index);
  const ColumnReader reader(arrow, b);
  return str("row ", row, " of ", reader.where(), " (column '", arrow.columns[field].name, "')");
}

}  // namespace mmt
