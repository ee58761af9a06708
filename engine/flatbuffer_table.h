// Reading FlatBuffers tables, the binary layout of Arrow's IPC metadata, trusting no byte.
//
// The layout (flatbuffers.dev, "internals"): a buffer begins with a uint32 offset to its root
// table. A table begins with an int32 that, subtracted from the table's position, gives its
// vtable: uint16 vtable bytes, uint16 table bytes, then one uint16 a field (slot), the field's
// offset from the table's start, 0 for a field left out (it takes its default). A field that
// is a table, string or vector holds a uint32 offset from the field's own position. A string
// is a uint32 length and its bytes; a vector a uint32 count and its elements (structs inline,
// tables as uint32 offsets from each element's position). A union takes two slots: its type
// (uint8), then its value (a table).
//
// Every read here is checked against the buffer; a check that fails throws FormatError
// beginning with the `where` the table was read with ("FILE: the Arrow message at byte N").
// Values are copied out with memcpy: a damaged buffer may place them unaligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mmtensor/error.h"

namespace mmt::detail {

class FlatTable;

// A vector field: `count` elements of `element_bytes` from byte `first` of the buffer.
struct FlatVector {
  uint32_t count = 0;
  size_t first = 0;
  size_t element_bytes = 0;
};

class FlatTable {
 public:
  // The root table of `buffer`. `where` must outlive the tables read from it.
  static FlatTable root(std::span<const std::byte> buffer, const std::string& where) {
    FlatTable none(buffer, 0, where);
    return none.table_at_offset(0, "the root table");
  }

  // Whether slot `slot` is present.
  bool has(int slot) const { return field_offset(slot) != 0; }

  // A scalar field (an integer, a bool as uint8, an enum), or `otherwise` when left out.
  template <class T>
  T scalar(int slot, T otherwise) const {
    const uint16_t at = field_offset(slot);
    if (at == 0) return otherwise;
    return load<T>(position_ + at, "a field");
  }

  // A table field; nullopt when left out.
  std::optional<FlatTable> table(int slot, const char* what) const {
    const uint16_t at = field_offset(slot);
    if (at == 0) return std::nullopt;
    return table_at_offset(position_ + at, what);
  }

  // A string field; nullopt when left out.
  std::optional<std::string_view> string(int slot, const char* what) const {
    const uint16_t at = field_offset(slot);
    if (at == 0) return std::nullopt;
    const size_t start = target(position_ + at, what);
    const uint32_t length = load<uint32_t>(start, what);
    need(start + 4, length, what);
    return std::string_view(reinterpret_cast<const char*>(buffer_.data() + start + 4), length);
  }

  // A vector field of elements of `element_bytes` each (4 for tables); empty when left out.
  FlatVector vector(int slot, size_t element_bytes, const char* what) const {
    const uint16_t at = field_offset(slot);
    if (at == 0) return {0, 0, element_bytes};
    const size_t start = target(position_ + at, what);
    const uint32_t count = load<uint32_t>(start, what);
    // count * element_bytes cannot overflow: element_bytes is small and count < 2^32.
    need(start + 4, static_cast<uint64_t>(count) * element_bytes, what);
    return {count, start + 4, element_bytes};
  }

  // Element `index` of a vector of tables.
  FlatTable table_in(const FlatVector& vector, uint32_t index, const char* what) const {
    return table_at_offset(vector.first + size_t{4} * index, what);
  }
  // Element `index` of a vector of scalars or structs, as T at `field` bytes into the element.
  template <class T>
  T element(const FlatVector& vector, uint32_t index, size_t field = 0) const {
    return load<T>(vector.first + vector.element_bytes * index + field, "a vector element");
  }

 private:
  FlatTable(std::span<const std::byte> buffer, size_t position, const std::string& where)
      : buffer_(buffer), position_(position), where_(&where) {}

  [[noreturn]] void fail(const char* what, const std::string& why) const {
    throw FormatError(std::string(*where_) + ": " + what + " " + why + " (the FlatBuffers metadata is damaged)");
  }
  void need(size_t start, uint64_t bytes, const char* what) const {
    if (start > buffer_.size() || bytes > buffer_.size() - start)
      fail(what, "at byte " + std::to_string(start) + " runs past the " + std::to_string(buffer_.size()) +
                     "-byte metadata");
  }
  template <class T>
  T load(size_t start, const char* what) const {
    need(start, sizeof(T), what);
    T value;
    std::memcpy(&value, buffer_.data() + start, sizeof(T));
    return value;
  }
  // Where the uint32 offset at `start` leads.
  size_t target(size_t start, const char* what) const {
    const uint32_t offset = load<uint32_t>(start, what);
    const uint64_t to = static_cast<uint64_t>(start) + offset;
    if (offset == 0 || to >= buffer_.size()) fail(what, "has an offset that leads out of the metadata");
    return static_cast<size_t>(to);
  }
  FlatTable table_at_offset(size_t start, const char* what) const {
    const size_t table = target(start, what);
    const int32_t to_vtable = load<int32_t>(table, what);
    const int64_t vtable = static_cast<int64_t>(table) - to_vtable;
    if (vtable < 0 || static_cast<uint64_t>(vtable) + 4 > buffer_.size()) fail(what, "has a vtable out of the metadata");
    FlatTable out(buffer_, table, *where_);
    out.vtable_ = static_cast<size_t>(vtable);
    out.vtable_bytes_ = load<uint16_t>(out.vtable_, what);
    const uint16_t table_bytes = load<uint16_t>(out.vtable_ + 2, what);
    if (out.vtable_bytes_ < 4 || out.vtable_bytes_ % 2 != 0) fail(what, "has a vtable of a size no vtable has");
    need(out.vtable_, out.vtable_bytes_, what);
    need(table, table_bytes, what);
    out.table_bytes_ = table_bytes;
    return out;
  }
  // The field's offset from the table's start; 0 when the slot is absent. A field must lie
  // within the table's declared bytes.
  uint16_t field_offset(int slot) const {
    const size_t entry = 4 + size_t{2} * static_cast<size_t>(slot);
    if (entry + 2 > vtable_bytes_) return 0;
    uint16_t at;
    std::memcpy(&at, buffer_.data() + vtable_ + entry, 2);
    if (at != 0 && at >= table_bytes_) fail("a field", "lies past its table's end");
    return at;
  }

  std::span<const std::byte> buffer_;
  size_t position_ = 0;
  size_t vtable_ = 0;
  uint16_t vtable_bytes_ = 0;
  uint16_t table_bytes_ = 0;
  const std::string* where_;
};

}  // namespace mmt::detail
