// read_parquet_as_arrow: a Parquet file's columns assembled from their levels (Dremel's
// record shredding, undone) into Arrow's columnar layout, one record batch per row group,
// written to a temporary file for pack_arrow.cc to read as it reads Arrow IPC.
//
// The schema's tree becomes Arrow fields as pyarrow makes them: a group is a struct, a
// LIST-annotated group (three-level, or the two-level forms older writers made) or an
// unannotated repeated field is a list, a leaf is the Arrow type of its physical and logical
// type. Strings, binaries and lists take 64-bit offsets (large_string...): a row group's
// strings may pass 2 GiB.
//
// Assembly: each Arrow node has "slots", its values in the batch. A node under lists has the
// levels of its innermost list's repeated field, (R, D): its slots are the entries (level
// pairs) of any leaf below it with repetition <= R and definition >= D, in order (R = D = 0 at
// the top: one slot a row). A slot's value is present when its definition reaches the node's
// own; a list's length in a slot is the number of its element's slots up to its next slot.
// Levels of the nodes a struct shares are read from its first leaf; under lists, each other
// leaf's levels must place it in the same lists (same_lists_above).
#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include "cpu_budget.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "parquet.h"
#include "scratch_file.h"
#include "utf8.h"

namespace mmt::detail {

namespace {

constexpr int kMaxDepth = 64;

struct SchemaNode {
  const ParquetSchemaElement* element = nullptr;
  std::string path;  // the names from the top, joined with '.' (path_in_schema)
  std::vector<SchemaNode> children;
  int16_t definition = 0, repetition = 0;  // the levels at this node
  int leaf = -1;                           // its column, for a leaf
};

// Builds the tree below schema[index] (a group of `count` children): FormatError for a tree
// that does not fit the list.
void build_tree(const ParquetMetadata& meta, size_t& index, SchemaNode& parent, int depth, int& leaves,
                const std::string& path) {
  MMT_CHECK(depth <= kMaxDepth, ValueError, path, ": a schema nested deeper than ", kMaxDepth, " levels");
  const int32_t count = parent.element->num_children;
  for (int32_t i = 0; i < count; ++i) {
    MMT_CHECK(index < meta.schema.size(), FormatError, path, ": its schema's groups state more children (",
              count, " for '", cut_for_message(parent.element->name, 100), "') than it has elements");
    SchemaNode& node = parent.children.emplace_back();
    node.element = &meta.schema[index++];
    node.path = parent.path.empty() ? node.element->name : str(parent.path, ".", node.element->name);
    const bool optional = node.element->repetition != ParquetRepetition::Required;
    const bool repeated = node.element->repetition == ParquetRepetition::Repeated;
    node.definition = static_cast<int16_t>(parent.definition + (optional ? 1 : 0));
    node.repetition = static_cast<int16_t>(parent.repetition + (repeated ? 1 : 0));
    if (node.element->type == ParquetType::Group) {
      build_tree(meta, index, node, depth + 1, leaves, path);
    } else {
      MMT_CHECK(node.element->num_children == 0, FormatError, path, ": its schema's leaf '",
                cut_for_message(node.element->name, 100), "' states children");
      node.leaf = leaves++;
    }
  }
}

// What a column cannot be read as (ValueError naming it, when chosen): `name` is its column's
// as the packer names it ("pts.d"; empty: the top-level field's).
struct Refused {
  std::string why;
  std::string name;
};

// Whether the packer's column `name` ("a", "a.b": structs flattened, lists and maps adding no
// name) is among `fields` (all when empty), or holds or is held by one of them.
bool wanted_column(std::span<const std::string> fields, const std::string& name) {
  if (fields.empty()) return true;
  return std::any_of(fields.begin(), fields.end(), [&](const std::string& f) {
    return f == name || (f.size() > name.size() && f.starts_with(name) && f[name.size()] == '.') ||
           (name.size() > f.size() && name.starts_with(f) && name[f.size()] == '.');
  });
}

// An Arrow node and how its buffers are made.
struct PlanNode {
  enum class Kind : uint8_t { Leaf, Struct, List } kind = Kind::Leaf;
  int first_buffer = 0;
  int16_t slot_repetition = 0, slot_definition = 0;
  int16_t present_definition = 0;
  int16_t child_repetition = 0, child_definition = 0;  // List: its element's slots
  int column = 0;                                      // Leaf: its column; else the first leaf below
  int value_bytes = 0;  // Leaf: Arrow's bytes a value (0: bytes with offsets; -1: bool bits)
  // Leaf, a decimal: Parquet's bytes a value (INT32 4, INT64 8, little-endian; a FIXED_LEN_
  // BYTE_ARRAY its length, 0 a BYTE_ARRAY, big-endian: Spark's legacy form stores 4 and 8 byte
  // ones too), widened to Arrow's value_bytes.
  int decimal_stored = -1;
  bool decimal_little_endian = false;
  std::vector<int> children;  // nodes
  std::string name;           // its schema path, for messages
};

struct Plan {
  std::vector<PlanNode> nodes;  // by Arrow node, in pre-order
  int buffers = 0;
};

class Converter {
 public:
  // Converts the columns `fields` chooses (all when empty): a struct's others are left out,
  // undecoded (a Parquet file is read column by column).
  Converter(Plan& plan, std::span<const std::string> fields, const std::string& path)
      : plan_(plan), fields_(fields), path_(path) {}

  // The Arrow field of `n`, whose slots are (repetition, definition); `as_element` when it is
  // the repeated field a list's elements are (then not itself a list); `flat` the name the
  // packer gives its columns (the list's for a list's element); `all_children`: a struct's
  // children all converted, chosen or not (a map's key and value).
  ArrowField convert(const SchemaNode& n, int16_t repetition, int16_t definition, bool as_element,
                     const std::string& flat, bool all_children = false) {
    const ParquetSchemaElement& e = *n.element;
    const bool group = e.type == ParquetType::Group;
    if (e.repetition == ParquetRepetition::Repeated && !as_element) {
      // An unannotated repeated field: a list, never null, of required elements (a repeated
      // group: of structs).
      ArrowField list = begin(n, ArrowTypeId::LargeList, PlanNode::Kind::List, repetition, definition,
                              static_cast<int16_t>(n.definition - 1));
      PlanNode& node = plan_.nodes[static_cast<size_t>(list.node)];
      node.child_repetition = n.repetition;
      node.child_definition = n.definition;
      const int self = list.node;
      list.children.push_back(convert(n, n.repetition, n.definition, true, flat));
      finish(self, list.children);
      return list;
    }
    if (!group) return leaf(n, repetition, definition);
    // A repeated key_value group (MAP_KEY_VALUE) is a map's element: a struct.
    if (e.logical == ParquetLogical::Map && !as_element) return map(n, repetition, definition, flat);
    if (e.logical == ParquetLogical::List && !as_element) return list(n, repetition, definition, flat);
    if (n.children.empty()) throw Refused{"a group of no columns"};
    ArrowField out = begin(n, ArrowTypeId::Struct, PlanNode::Kind::Struct, repetition, definition, n.definition);
    const int self = out.node;
    // The children chosen: those `fields` names (or holds), or all of them when the struct
    // itself, or a column above it, is chosen (or a map's entries).
    const auto child_name = [&](const SchemaNode& child) { return str(flat, ".", child.element->name); };
    const bool choosing = !all_children && std::any_of(n.children.begin(), n.children.end(), [&](const SchemaNode& child) {
      return wanted_column(fields_, child_name(child));
    });
    // A name below this struct that none of its columns is (the packer would find it missing
    // only after every row group was decoded).
    for (const std::string& f : fields_) {
      if (all_children || choosing || f.size() <= flat.size() + 1 || !f.starts_with(flat) || f[flat.size()] != '.')
        continue;
      std::vector<std::string> names;
      for (const SchemaNode& child : n.children) names.push_back(child_name(child));
      throw ValueError(str(path_, ": no column '", cut_for_message(f, 100), "' (the columns of '",
                           cut_for_message(flat, 100), "': ", cut_for_message(joined(names), 2000), ")"));
    }
    for (const SchemaNode& child : n.children) {
      const std::string name = child_name(child);
      if (choosing && !wanted_column(fields_, name)) continue;
      try {
        out.children.push_back(convert(child, repetition, definition, false, name));
      } catch (Refused& r) {
        if (r.name.empty()) r.name = name;
        throw;
      }
    }
    finish(self, out.children);
    return out;
  }

 private:
  ArrowField begin(const SchemaNode& n, ArrowTypeId type, PlanNode::Kind kind, int16_t repetition, int16_t definition,
                   int16_t present) {
    const std::string& name = n.element->name;
    ArrowField f;
    f.name = name;
    f.type = type;
    f.node = static_cast<int>(plan_.nodes.size());
    PlanNode& node = plan_.nodes.emplace_back();
    node.kind = kind;
    node.first_buffer = plan_.buffers;
    plan_.buffers += kind == PlanNode::Kind::Struct ? 1 : type == ArrowTypeId::LargeBinary || type == ArrowTypeId::LargeUtf8 ? 3 : 2;
    node.slot_repetition = repetition;
    node.slot_definition = definition;
    node.present_definition = present;
    node.name = n.path;
    return f;
  }
  void finish(int self, const std::vector<ArrowField>& children) {
    PlanNode& node = plan_.nodes[static_cast<size_t>(self)];
    for (const ArrowField& child : children) node.children.push_back(child.node);
    node.column = plan_.nodes[static_cast<size_t>(children.front().node)].column;
  }

  // A LIST-annotated group: three levels (group, repeated group, element), or the two-level
  // forms (LogicalTypes.md, "Backward-compatibility rules").
  ArrowField list(const SchemaNode& n, int16_t repetition, int16_t definition, const std::string& flat) {
    const ParquetSchemaElement& e = *n.element;
    if (n.children.size() != 1 || n.children[0].element->repetition != ParquetRepetition::Repeated)
      throw Refused{"a LIST group whose one child is not a repeated field"};
    const SchemaNode& repeated = n.children[0];
    ArrowField out = begin(n, ArrowTypeId::LargeList, PlanNode::Kind::List, repetition, definition, n.definition);
    PlanNode& node = plan_.nodes[static_cast<size_t>(out.node)];
    node.child_repetition = repeated.repetition;
    node.child_definition = repeated.definition;
    const int self = out.node;
    const ParquetSchemaElement& r = *repeated.element;
    if (r.type != ParquetType::Group || repeated.children.size() != 1 ||
        repeated.children[0].element->repetition == ParquetRepetition::Repeated || r.name == "array" ||
        r.name == e.name + "_tuple") {
      // The repeated field is the element: a value, or a struct of its fields (two levels).
      out.children.push_back(convert(repeated, repeated.repetition, repeated.definition, true, flat));
    } else {  // three levels: the repeated group's one field is the element (a value, list, struct)
      out.children.push_back(convert(repeated.children[0], repeated.repetition, repeated.definition, false, flat));
    }
    finish(self, out.children);
    return out;
  }

  // A MAP-annotated group (or the MAP_KEY_VALUE of older writers): repeated group key_value
  // { required key; optional value } (LogicalTypes.md, "Maps"), a list of struct<key, value>
  // as Arrow's map is, with 64-bit offsets.
  ArrowField map(const SchemaNode& n, int16_t repetition, int16_t definition, const std::string& flat) {
    if (n.children.size() != 1 || n.children[0].element->repetition != ParquetRepetition::Repeated ||
        n.children[0].element->type != ParquetType::Group || n.children[0].children.empty() ||
        n.children[0].children.size() > 2)
      throw Refused{"a MAP group whose one child is not a repeated group of a key and a value"};
    if (n.children[0].children.size() == 1) throw Refused{"a map of keys alone"};
    const SchemaNode& key_value = n.children[0];
    ArrowField out = begin(n, ArrowTypeId::Map, PlanNode::Kind::List, repetition, definition, n.definition);
    out.bit_width = 64;
    PlanNode& node = plan_.nodes[static_cast<size_t>(out.node)];
    node.child_repetition = key_value.repetition;
    node.child_definition = key_value.definition;
    const int self = out.node;
    // A map's entries keep their key and value, whichever is chosen (Arrow's map has both);
    // below them, what is chosen.
    out.children.push_back(convert(key_value, key_value.repetition, key_value.definition, true, flat, true));
    finish(self, out.children);
    return out;
  }

  ArrowField leaf(const SchemaNode& n, int16_t repetition, int16_t definition) {
    const ParquetSchemaElement& e = *n.element;
    ArrowField f;
    int value_bytes = 0;
    switch (e.type) {
      case ParquetType::Boolean: f.type = ArrowTypeId::Bool; value_bytes = -1; break;
      case ParquetType::Int32:
      case ParquetType::Int64: {
        const int physical = e.type == ParquetType::Int32 ? 32 : 64;
        f.bit_width = physical;
        if (e.logical == ParquetLogical::Decimal) return decimal(n, repetition, definition, physical / 8, true);
        if (e.logical == ParquetLogical::Date && physical == 32) {
          f.type = ArrowTypeId::Date;
          f.unit = 0;  // days
        } else if (e.logical == ParquetLogical::Time && e.time_unit != 0) {
          f.type = ArrowTypeId::Time;
          f.unit = e.time_unit;
        } else if (e.logical == ParquetLogical::Timestamp && physical == 64 && e.time_unit != 0) {
          f.type = ArrowTypeId::Timestamp;
          f.unit = e.time_unit;
          if (e.adjusted_to_utc) f.timezone = "UTC";
        } else {
          f.type = ArrowTypeId::Int;
          f.is_signed = e.logical == ParquetLogical::Integer ? e.int_signed : true;
          // INT(8) and INT(16) are stored in INT32s: narrowed to their width.
          if (e.logical == ParquetLogical::Integer && physical == 32 && (e.int_bits == 8 || e.int_bits == 16))
            f.bit_width = e.int_bits;
        }
        value_bytes = f.bit_width / 8;
        break;
      }
      case ParquetType::Int96:  // a legacy timestamp: read as nanoseconds, as pyarrow does
        f.type = ArrowTypeId::Timestamp;
        f.bit_width = 64;
        f.unit = 3;
        value_bytes = 8;
        break;
      case ParquetType::Float: f.type = ArrowTypeId::FloatingPoint; f.precision = 1; value_bytes = 4; break;
      case ParquetType::Double: f.type = ArrowTypeId::FloatingPoint; f.precision = 2; value_bytes = 8; break;
      case ParquetType::ByteArray:
        if (e.logical == ParquetLogical::Decimal) return decimal(n, repetition, definition, 0);
        f.type = e.logical == ParquetLogical::String || e.logical == ParquetLogical::Json ? ArrowTypeId::LargeUtf8
                                                                                          : ArrowTypeId::LargeBinary;
        break;
      case ParquetType::FixedLenByteArray:
        if (e.logical == ParquetLogical::Decimal && e.type_length > 0 && e.type_length <= 32)
          return decimal(n, repetition, definition, e.type_length);
        if (e.logical == ParquetLogical::Decimal)
          throw Refused{str("decimal(", e.precision, ", ", e.scale, ") in ", e.type_length, "-byte values")};
        if (e.type_length <= 0 || e.type_length > (1 << 24))
          throw Refused{str("a FIXED_LEN_BYTE_ARRAY of ", e.type_length, " bytes")};
        if (e.logical == ParquetLogical::Float16 && e.type_length == 2) {
          f.type = ArrowTypeId::FloatingPoint;
          f.precision = 0;
        } else {
          f.type = ArrowTypeId::FixedSizeBinary;
          f.fixed_size = e.type_length;
        }
        value_bytes = e.type_length;
        break;
      default: throw Refused{"a leaf of no type"};
    }
    if (e.logical == ParquetLogical::Unknown) throw Refused{"null (a column of nulls only)"};
    ArrowField out = begin(n, f.type, PlanNode::Kind::Leaf, repetition, definition, n.definition);
    f.name = out.name;
    f.node = out.node;
    PlanNode& node = plan_.nodes[static_cast<size_t>(f.node)];
    node.column = n.leaf;
    node.value_bytes = value_bytes;
    return f;
  }

  // A DECIMAL leaf, stored in `stored`-byte integers (0: byte arrays): Arrow's decimal128 (up
  // to 38 digits) or decimal256 (76), which the packer reads as float64.
  ArrowField decimal(const SchemaNode& n, int16_t repetition, int16_t definition, int stored,
                     bool little_endian = false) {
    const ParquetSchemaElement& e = *n.element;
    if (e.precision < 1 || e.precision > 76 || e.scale < -76 || e.scale > 76)
      throw Refused{str("decimal(", e.precision, ", ", e.scale, ")")};
    ArrowField f;
    f.type = ArrowTypeId::Decimal;
    f.precision = e.precision;
    f.scale = e.scale;
    f.bit_width = e.precision <= 38 ? 128 : 256;
    ArrowField out = begin(n, f.type, PlanNode::Kind::Leaf, repetition, definition, n.definition);
    f.name = out.name;
    f.node = out.node;
    PlanNode& node = plan_.nodes[static_cast<size_t>(f.node)];
    node.column = n.leaf;
    node.value_bytes = f.bit_width / 8;
    node.decimal_stored = stored;
    node.decimal_little_endian = little_endian;
    return f;
  }

  Plan& plan_;
  std::span<const std::string> fields_;
  const std::string& path_;
};

// The leaves below a schema node, by column.
void leaves_of(const SchemaNode& n, std::vector<const SchemaNode*>& out) {
  if (n.leaf >= 0) out[static_cast<size_t>(n.leaf)] = &n;
  for (const SchemaNode& child : n.children) leaves_of(child, out);
}

// A row group decoded: each node's length and nulls, each buffer's bytes (by buffer index).
struct DecodedGroup {
  std::vector<ArrowBatch::Node> nodes;
  std::vector<std::vector<std::byte>> buffers;
  std::exception_ptr error;
  bool done = false;

  void write(int index, const void* data, size_t n) {
    const auto* p = static_cast<const std::byte*>(data);
    buffers[static_cast<size_t>(index)].assign(p, p + n);
  }
  // Takes `bytes` whole (a column's values, as decoded): no copy.
  void take(int index, std::vector<std::byte>&& bytes) { buffers[static_cast<size_t>(index)] = std::move(bytes); }
};

// Value `i` of a decimal column, Parquet's integer (an INT32 or INT64, little-endian; big-endian
// bytes otherwise), as Arrow's: node.value_bytes of little-endian two's complement at `out`.
// False for a value of more bytes than that which are not its sign's.
bool widen_decimal(const PlanNode& node, const ParquetColumnValues& column, int64_t i, std::byte* out) {
  const auto width = static_cast<size_t>(node.value_bytes);
  const std::byte* value;
  size_t length;
  if (node.decimal_stored == 0) {
    value = column.values.data() + column.offsets[static_cast<size_t>(i)];
    length = static_cast<size_t>(column.offsets[static_cast<size_t>(i) + 1] - column.offsets[static_cast<size_t>(i)]);
  } else {
    length = static_cast<size_t>(node.decimal_stored);
    value = column.values.data() + static_cast<size_t>(i) * length;
  }
  if (node.decimal_little_endian) {  // INT32, INT64
    std::memcpy(out, value, length);
    std::memset(out + length, static_cast<int>(value[length - 1] >> 7) != 0 ? 0xff : 0, width - length);
    return true;
  }
  if (length == 0) {  // an empty byte array: zero, as Arrow's readers take it
    std::memset(out, 0, width);
    return true;
  }
  const std::byte sign = (value[0] >> 7) != std::byte{0} ? std::byte{0xff} : std::byte{0};
  for (size_t k = 0; k + width < length; ++k)  // bytes past Arrow's width only repeat the sign
    if (value[k] != sign || (k + 1 + width == length && ((value[k + 1] ^ sign) >> 7) != std::byte{0})) return false;
  const size_t used = std::min(length, width);
  for (size_t k = 0; k < used; ++k) out[k] = value[length - 1 - k];
  std::memset(out + used, static_cast<int>(sign), width - used);
  return true;
}

// Writes node `index`'s buffers, and its length and nulls, from its column's levels and values.
// A leaf's values are taken from `column` (its ancestors, which read only the levels, come
// before it).
void assemble(const PlanNode& node, int index, ParquetColumnValues& column, int16_t max_definition,
              DecodedGroup& out, const std::string& where) {
  const auto definition = [&](int64_t e) { return column.definition.empty() ? int16_t{0} : int16_t{column.definition[static_cast<size_t>(e)]}; };
  const auto repetition = [&](int64_t e) { return column.repetition.empty() ? int16_t{0} : int16_t{column.repetition[static_cast<size_t>(e)]}; };
  const auto is_slot = [&](int64_t e, int16_t r, int16_t d) { return repetition(e) <= r && definition(e) >= d; };
  int64_t length = 0, nulls = 0;
  std::vector<uint8_t> validity;
  const auto add_slot = [&](bool valid) {
    if (length % 8 == 0) validity.push_back(0);
    if (valid) validity.back() |= static_cast<uint8_t>(1u << (length % 8));
    else ++nulls;
    ++length;
  };
  const int64_t entries = column.entries;
  switch (node.kind) {
    case PlanNode::Kind::Struct:
      for (int64_t e = 0; e < entries; ++e)
        if (is_slot(e, node.slot_repetition, node.slot_definition)) add_slot(definition(e) >= node.present_definition);
      break;
    case PlanNode::Kind::List: {
      std::vector<int64_t> offsets;
      int64_t elements = 0;
      for (int64_t e = 0; e < entries; ++e) {
        if (is_slot(e, node.slot_repetition, node.slot_definition)) {
          offsets.push_back(elements);
          add_slot(definition(e) >= node.present_definition);
        }
        if (is_slot(e, node.child_repetition, node.child_definition)) ++elements;
      }
      offsets.push_back(elements);
      out.write(node.first_buffer + 1, offsets.data(), offsets.size() * 8);
      break;
    }
    case PlanNode::Kind::Leaf: {
      int64_t next = 0;  // the next present value
      // Every entry's value is present (its definition at the maximum) when as many values
      // were decoded as there are entries (the pages' decoder checks each page's count).
      const bool every_slot_present = column.count == column.entries;
      if (node.value_bytes == 0) {  // bytes: the values as they are, offsets a slot
        std::vector<int64_t> offsets;
        offsets.reserve(static_cast<size_t>(column.count) + 1);
        offsets.push_back(0);
        for (int64_t e = 0; e < entries; ++e) {
          if (!is_slot(e, node.slot_repetition, node.slot_definition)) continue;
          const bool present = definition(e) == max_definition;
          add_slot(present);
          if (present) ++next;
          offsets.push_back(column.offsets[static_cast<size_t>(next)]);
        }
        out.write(node.first_buffer + 1, offsets.data(), offsets.size() * 8);
        out.take(node.first_buffer + 2, std::move(column.values));
      } else if (node.value_bytes == -1) {  // bool: bits
        std::vector<uint8_t> bits;
        int64_t slot = 0;
        for (int64_t e = 0; e < entries; ++e) {
          if (!is_slot(e, node.slot_repetition, node.slot_definition)) continue;
          const bool present = definition(e) == max_definition;
          add_slot(present);
          if (slot % 8 == 0) bits.push_back(0);
          if (present && column.values[static_cast<size_t>(next++)] != std::byte{0})
            bits.back() |= static_cast<uint8_t>(1u << (slot % 8));
          ++slot;
        }
        out.write(node.first_buffer + 1, bits.data(), bits.size());
      } else {
        const auto width = static_cast<size_t>(node.value_bytes);
        const size_t stored = column.count > 0 ? column.values.size() / static_cast<size_t>(column.count) : width;
        const bool decimal = node.decimal_stored >= 0;  // each integer widened to Arrow's width
        if (every_slot_present && stored == width && !decimal) {  // as decoded: no copy
          length = column.count;
          out.take(node.first_buffer + 1, std::move(column.values));
          break;
        }
        // Held to the column's decoding limit as its values were: a null decimal costs a
        // level's bit in the file and 16 or 32 bytes here.
        if (decimal && entries > column.limit / static_cast<int64_t>(width))
          throw ValueError(str(where, ": its ", entries, " decimals widen to more than ", column.limit,
                               " bytes (1024 times its column chunk's bytes in the file, and at least an eighth of ",
                               "this machine's memory); such a file is refused as a decompression bomb"));
        std::vector<std::byte> values;
        values.reserve(static_cast<size_t>(entries) * width);
        for (int64_t e = 0; e < entries; ++e) {
          if (!is_slot(e, node.slot_repetition, node.slot_definition)) continue;
          const bool present = definition(e) == max_definition;
          add_slot(present);
          const size_t at = values.size();
          values.resize(at + width);
          if (!present) continue;
          if (!decimal) {  // a narrower value (INT(8), INT(16) in INT32s) is the low bytes: little-endian
            std::memcpy(values.data() + at, column.values.data() + static_cast<size_t>(next++) * stored, width);
          } else if (!widen_decimal(node, column, next++, values.data() + at)) {
            // Entries are rows when nothing repeats: name the row, else the value's place.
            throw FormatError(str(where, ": ", column.repetition.empty() ? "row " : "value ",
                                  column.repetition.empty() ? e : next - 1, ": a decimal of more bytes than the ",
                                  width, " of its precision's"));
          }
        }
        out.write(node.first_buffer + 1, values.data(), values.size());
      }
      break;
    }
  }
  if (nulls == 0) validity.clear();
  out.write(node.first_buffer, validity.data(), validity.size());
  out.nodes[static_cast<size_t>(index)] = {length, nulls};
}

// A leaf's levels, kept while the other leaves of its structs are compared with them.
struct LeafLevels {
  std::vector<uint8_t> repetition, definition;
  int64_t entries = 0;
};

// Whether two leaves of a struct whose slots are (repetition, definition) place their values
// in the same lists above it: their entries that begin a slot or an empty or null list above
// it, as their repetition and their definition up to the struct's, are the same.
bool same_lists_above(const LeafLevels& a, const ParquetColumnValues& b, int16_t repetition, int16_t definition) {
  const auto level = [](const std::vector<uint8_t>& levels, int64_t e) {
    return levels.empty() ? 0 : int{levels[static_cast<size_t>(e)]};
  };
  int64_t i = 0, j = 0;
  for (;;) {
    while (i < a.entries && level(a.repetition, i) > repetition) ++i;
    while (j < b.entries && level(b.repetition, j) > repetition) ++j;
    if (i == a.entries || j == b.entries) return i == a.entries && j == b.entries;
    if (level(a.repetition, i) != level(b.repetition, j) ||
        std::min<int>(level(a.definition, i), definition) != std::min<int>(level(b.definition, j), definition))
      return false;
    ++i;
    ++j;
  }
}

}  // namespace

ArrowIpc read_parquet_as_arrow(const std::string& path, std::span<const std::string> fields) {
  InputFile input = map_input_file(path);  // IoError naming a missing file or a folder
  ArrowIpc ipc;
  ipc.path = path;
  ipc.file = std::move(input.mapping);
  const std::span<const std::byte> bytes = input.bytes;
  // The mapped bytes are copied out under the mapping guard (a file cut while mapped is an
  // IoError, not SIGBUS) and parsed from the copies: a guarded section may own nothing that a
  // fault's jump would skip (mapping_guard.h).
  const auto copy_out = [&](int64_t offset, int64_t n, std::byte* into) {
    if (n == 0) return;  // an empty file maps to no address
    guard_storage_reads(ipc.file, [&] { std::memcpy(into, bytes.data() + offset, static_cast<size_t>(n)); });
  };
  const auto size = static_cast<int64_t>(bytes.size());
  std::array<std::byte, 4> head{};
  std::array<std::byte, 8> tail{};
  copy_out(0, std::min<int64_t>(size, 4), head.data());
  if (size >= 8) copy_out(size - 8, 8, tail.data());
  const int64_t footer_length = parquet_footer_length(size, head, tail, path);
  const int64_t data_end = size - 8 - footer_length;  // the footer's start: pages lie before it
  std::vector<std::byte> footer(static_cast<size_t>(footer_length));
  copy_out(data_end, footer_length, footer.data());
  const ParquetMetadata meta = parse_parquet_footer(footer, data_end, path);
  footer = {};

  // The schema's tree and the Arrow fields of the columns chosen.
  SchemaNode root;
  root.element = &meta.schema.front();
  size_t index = 1;
  int leaves = 0;
  build_tree(meta, index, root, 0, leaves, path);
  MMT_CHECK(index == meta.schema.size(), FormatError, path, ": its schema has ", meta.schema.size() - index,
            " elements outside its tree");
  std::vector<const SchemaNode*> leaf_nodes(static_cast<size_t>(leaves));
  leaves_of(root, leaf_nodes);
  std::vector<std::string> names, refused;
  for (const SchemaNode& child : root.children) names.push_back(child.element->name);
  for (const std::string& f : fields) {
    const bool known = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return f == name || (f.size() > name.size() && f.starts_with(name) && f[name.size()] == '.');
    });
    MMT_CHECK(known, ValueError, path, ": no column '", cut_for_message(f, 100), "' (its columns: ",
              cut_for_message(joined(names), 2000), ")");
  }
  Plan plan;
  Converter converter(plan, fields, path);
  for (const SchemaNode& child : root.children) {
    const std::string& name = child.element->name;
    if (!wanted_column(fields, name)) continue;
    const size_t nodes_before = plan.nodes.size();
    const int buffers_before = plan.buffers;
    try {
      ipc.fields.push_back(converter.convert(child, 0, 0, false, name));
    } catch (const Refused& r) {
      plan.nodes.resize(nodes_before);
      plan.buffers = buffers_before;
      refused.push_back(str("'", r.name.empty() ? name : r.name, "' (", r.why, ")"));
    }
  }
  MMT_CHECK(refused.empty(), ValueError, path, ": columns of types no field holds: ",
            cut_for_message(joined(refused), 2000),
            "; choose the columns to pack (mmt pack --field NAME, repeated; PackSources::from_arrow's fields)");
  ipc.node_count = static_cast<int>(plan.nodes.size());
  for (const auto& [key, value] : meta.key_values)
    if (key != "ARROW:schema") ipc.metadata.emplace_back(key, value);  // pyarrow's own copy of the schema

  // The columns each chosen leaf's values feed: the leaf, and the nodes it is the first below.
  std::vector<std::vector<int>> fed_by(static_cast<size_t>(leaves));
  for (size_t n = 0; n < plan.nodes.size(); ++n)
    fed_by[static_cast<size_t>(plan.nodes[n].column)].push_back(static_cast<int>(n));
  // The structs inside lists above each leaf: a struct's lists and validity come from its first
  // leaf, so each other leaf's levels must place its values in the same lists (equal counts
  // alone could pair one row's role with another's content).
  std::vector<std::vector<int>> structs_over(static_cast<size_t>(leaves));
  for (size_t n = 0; n < plan.nodes.size(); ++n) {
    if (plan.nodes[n].kind != PlanNode::Kind::Struct || plan.nodes[n].slot_repetition == 0) continue;
    std::vector<int> below{static_cast<int>(n)};
    while (!below.empty()) {
      const PlanNode& node = plan.nodes[static_cast<size_t>(below.back())];
      below.pop_back();
      if (node.kind == PlanNode::Kind::Leaf) structs_over[static_cast<size_t>(node.column)].push_back(static_cast<int>(n));
      below.insert(below.end(), node.children.begin(), node.children.end());
    }
  }

  // The row groups of rows, checked against the schema and the footer's count first.
  std::vector<size_t> groups;
  int64_t rows = 0;
  for (size_t g = 0; g < meta.row_groups.size(); ++g) {
    const ParquetRowGroup& group = meta.row_groups[g];
    MMT_CHECK(group.columns.size() == static_cast<size_t>(leaves), FormatError, path, ", row group ", g, " has ",
              group.columns.size(), " column chunks for the schema's ", leaves, " columns");
    MMT_CHECK(!__builtin_add_overflow(rows, group.num_rows, &rows), FormatError, path, ": too many rows");
    if (group.num_rows > 0) groups.push_back(g);
  }
  MMT_CHECK(rows == meta.num_rows, FormatError, path, ": its row groups hold ", rows, " rows, not the ", meta.num_rows,
            " its footer states");

  // Row groups are decoded on threads, a few ahead of the one written and within a memory
  // budget (at least one row group), and written to the scratch file in order, each buffer at
  // a 64-byte boundary. A column chunk's pages are split among the CPUs the row groups leave
  // (a file of one row group decodes on them all).
  const int cpus = available_cpus();
  const size_t threads = std::min<size_t>({groups.size(), static_cast<size_t>(cpus), 8});
  const int page_threads = std::max(1, cpus / static_cast<int>(std::max<size_t>(threads, 1)));

  // Decodes row group `g` into `out`, with `values` a column chunk's (its memory kept).
  const auto decode = [&](size_t g, DecodedGroup& out, ParquetColumnValues& values, std::vector<std::byte>& chunk_bytes) {
    const ParquetRowGroup& group = meta.row_groups[g];
    const std::string group_where = str(path, ", row group ", g);
    out.nodes.resize(plan.nodes.size());
    out.buffers.resize(static_cast<size_t>(plan.buffers));
    std::vector<LeafLevels> first_leaf_levels(static_cast<size_t>(leaves));  // of the structs' first leaves
    for (int c = 0; c < leaves; ++c) {
      if (fed_by[static_cast<size_t>(c)].empty()) continue;
      const ParquetColumnChunk& chunk = group.columns[static_cast<size_t>(c)];
      const SchemaNode& leaf = *leaf_nodes[static_cast<size_t>(c)];
      const std::string where = str(group_where, ", column '", cut_for_message(leaf.path, 200), "'");
      MMT_CHECK(chunk.has_metadata, ValueError, where, ": its metadata is encrypted or missing");
      MMT_CHECK(chunk.file_path.empty(), ValueError, where, ": its data lies in another file ('",
                cut_for_message(chunk.file_path, 200), "'); pack the data files themselves");
      MMT_CHECK(chunk.type == leaf.element->type, FormatError, where, ": its chunk's physical type differs from the schema's");
      const ParquetLeaf description{leaf.element->type, leaf.element->type_length, leaf.definition, leaf.repetition};
      const ParquetByteRange range = parquet_chunk_range(chunk, data_end, where);
      chunk_bytes.resize(static_cast<size_t>(range.end - range.begin));
      copy_out(range.begin, range.end - range.begin, chunk_bytes.data());
      read_parquet_column(chunk_bytes, range.begin, chunk, description, where, values, page_threads);
      bool first_of_a_struct = false;
      for (const int n : structs_over[static_cast<size_t>(c)]) {
        const PlanNode& node = plan.nodes[static_cast<size_t>(n)];
        if (node.column == c) {
          first_of_a_struct = true;
          continue;
        }
        MMT_CHECK(same_lists_above(first_leaf_levels[static_cast<size_t>(node.column)], values, node.slot_repetition,
                                   node.slot_definition),
                  FormatError, where, ": its levels place its values in other lists than those of column '",
                  cut_for_message(leaf_nodes[static_cast<size_t>(node.column)]->path, 200), "', beside it in group '",
                  cut_for_message(node.name, 200), "'");
      }
      for (const int n : fed_by[static_cast<size_t>(c)])
        assemble(plan.nodes[static_cast<size_t>(n)], n, values, leaf.definition, out, where);
      if (first_of_a_struct)  // kept, one copy, until the row group is decoded
        first_leaf_levels[static_cast<size_t>(c)] = {std::move(values.repetition), std::move(values.definition),
                                                     values.entries};
    }
    // The top level's slots are the row group's rows; a struct's columns have its slots (their
    // levels share the struct's).
    for (const ArrowField& top : ipc.fields)
      MMT_CHECK(out.nodes[static_cast<size_t>(top.node)].length == group.num_rows, FormatError, group_where,
                ": column '", cut_for_message(top.name, 100), "' holds ", out.nodes[static_cast<size_t>(top.node)].length,
                " rows, not the row group's ", group.num_rows);
    for (size_t n = 0; n < plan.nodes.size(); ++n) {
      if (plan.nodes[n].kind != PlanNode::Kind::Struct) continue;
      for (const int child : plan.nodes[n].children)
        MMT_CHECK(out.nodes[static_cast<size_t>(child)].length == out.nodes[n].length, FormatError, group_where,
                  ": group '", cut_for_message(plan.nodes[n].name, 200), "' holds ", out.nodes[n].length,
                  " values, but its column '", cut_for_message(plan.nodes[static_cast<size_t>(child)].name, 200),
                  "' ", out.nodes[static_cast<size_t>(child)].length, " (their levels differ)");
    }
  };

  std::optional<ScratchFile> scratch;
  if (!groups.empty()) scratch.emplace(path, "to decode its Parquet row groups into");
  const size_t window = 2 * std::max<size_t>(threads, 1);
  // Each row group's decoded bytes as its chosen columns state them (uncompressed).
  constexpr int64_t kInFlightBytes = int64_t{1} << 30;
  std::vector<int64_t> estimate(groups.size(), 0);
  for (size_t k = 0; k < groups.size(); ++k)
    for (int c = 0; c < leaves; ++c)
      if (!fed_by[static_cast<size_t>(c)].empty())
        estimate[k] += std::min(meta.row_groups[groups[k]].columns[static_cast<size_t>(c)].total_uncompressed_size,
                                kInFlightBytes - estimate[k]);  // at most the budget: no overflow
  int64_t in_flight = 0;
  std::vector<DecodedGroup> decoded(groups.size());
  std::mutex mutex;
  std::condition_variable changed;
  size_t next = 0, written = 0;
  bool stop = false;
  const auto work = [&] {
    ParquetColumnValues values;
    std::vector<std::byte> chunk_bytes;  // a column chunk's bytes, copied out of the mapping
    for (;;) {
      size_t k = 0;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] {
          return stop || next >= groups.size() ||
                 (next < written + window && (next == written || in_flight + estimate[next] <= kInFlightBytes));
        });
        if (stop || next >= groups.size()) return;
        k = next++;
        in_flight += estimate[k];
      }
      DecodedGroup& out = decoded[k];
      try {
        try {
          decode(groups[k], out, values, chunk_bytes);
        } catch (const std::bad_alloc&) {
          throw IoError(str(path, ", row group ", groups[k], ": not enough memory to decode it (its columns state ",
                            estimate[k], " bytes uncompressed)"));
        }
      } catch (...) {
        out.error = std::current_exception();
      }
      std::lock_guard lock(mutex);
      out.done = true;
      if (out.error) stop = true;  // the groups after it are not needed
      changed.notify_all();
    }
  };
  struct Joiner {  // stops and joins the workers however this function leaves
    std::vector<std::thread> workers;
    std::mutex& mutex;
    std::condition_variable& changed;
    bool& stop;
    ~Joiner() {
      {
        std::lock_guard lock(mutex);
        stop = true;
      }
      changed.notify_all();
      for (std::thread& t : workers) t.join();
    }
  } joiner{{}, mutex, changed, stop};
  for (size_t t = 0; t < threads; ++t) joiner.workers.emplace_back(work);
  static const std::byte zeros[64] = {};
  for (size_t k = 0; k < groups.size(); ++k) {
    DecodedGroup& group = decoded[k];
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return group.done; });
    }
    if (group.error) std::rethrow_exception(group.error);
    ArrowBatch& batch = ipc.batches.emplace_back();
    batch.rows = meta.row_groups[groups[k]].num_rows;
    batch.decompressed = true;
    batch.row_group = static_cast<int64_t>(groups[k]);
    batch.nodes = std::move(group.nodes);
    batch.buffers.resize(group.buffers.size());
    for (size_t b = 0; b < group.buffers.size(); ++b) {
      if (scratch->size() % 64 != 0) scratch->append(zeros, 64 - scratch->size() % 64);
      const std::vector<std::byte>& bytes = group.buffers[b];
      batch.buffers[b] = {scratch->size(), static_cast<int64_t>(bytes.size())};
      if (!bytes.empty()) scratch->append(bytes.data(), static_cast<int64_t>(bytes.size()));
    }
    group = DecodedGroup{};  // its memory freed
    std::lock_guard lock(mutex);
    ++written;
    in_flight -= estimate[k];
    changed.notify_all();
  }
  if (scratch)
    ipc.decompressed = scratch->map(str(path, " (Parquet row groups decoded into a temporary file in ",
                                        scratch->folder().string(), ")"));
  return ipc;
}

}  // namespace mmt::detail
