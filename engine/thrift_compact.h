// Reading Thrift's compact protocol, the encoding of Parquet's footer and page headers,
// trusting no byte.
//
// The encoding (thrift's doc/specs/thrift-compact-protocol.md): a struct is a sequence of
// fields ended by a 0 byte. A field begins with a byte whose high nibble is the field id's
// difference from the previous field's (0: the id follows as a zigzag varint i16) and whose
// low nibble is the type: 1 true, 2 false (a bool field's value is its type), 3 i8 (one byte),
// 4 i16, 5 i32, 6 i64 (zigzag varints), 7 double (8 bytes little-endian), 8 binary (a varint
// length, then the bytes), 9 list and 10 set (a byte: the size in the high nibble, 15 for a
// varint size after it, the elements' type in the low nibble), 11 map (a varint size, then,
// if not 0, a byte of the key and value types), 12 struct. Elements of a list are values
// without field headers; a bool element is one byte.
//
// Every read is checked against the buffer, counts against the bytes left (an element takes
// at least one byte) and nesting against a depth limit; a check that fails throws FormatError
// beginning with `where` ("FILE: the footer at byte N").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "mmtensor/error.h"
#include "utf8.h"

namespace mmt::detail {

enum class ThriftType : uint8_t {
  Stop = 0, True = 1, False = 2, Byte = 3, I16 = 4, I32 = 5, I64 = 6, Double = 7, Binary = 8, List = 9, Set = 10,
  Map = 11, Struct = 12,
};

class ThriftReader {
 public:
  static constexpr int kMaxDepth = 64;

  ThriftReader(std::span<const std::byte> bytes, std::string where) : bytes_(bytes), where_(std::move(where)) {}

  size_t position() const { return position_; }

  // Reads a struct: `on_field(id, type)` for each of its fields, which must read the value
  // (or skip(type) it).
  template <class OnField>
  void read_struct(OnField&& on_field) {
    enter();
    int16_t last_id = 0;
    for (;;) {
      const uint8_t header = byte();
      const auto type = static_cast<ThriftType>(header & 0x0F);
      if (type == ThriftType::Stop) break;
      const int delta = header >> 4;
      int16_t id = 0;
      if (delta != 0) {
        id = static_cast<int16_t>(last_id + delta);
      } else {
        const int64_t long_id = zigzag(varint());
        if (long_id < INT16_MIN || long_id > INT16_MAX) fail("a field id out of range");
        id = static_cast<int16_t>(long_id);
      }
      if (static_cast<uint8_t>(type) > static_cast<uint8_t>(ThriftType::Struct)) fail("a field of unknown type");
      last_id = id;
      on_field(id, type);
    }
    --depth_;
  }

  // An integer field or element of type i8, i16, i32 or i64 (FormatError for another type).
  int64_t integer(ThriftType type) {
    switch (type) {
      case ThriftType::Byte: return static_cast<int8_t>(byte());
      case ThriftType::I16: case ThriftType::I32: case ThriftType::I64: return zigzag(varint());
      default: fail("an integer field of another type");
    }
  }
  // An integer field held to [low, high].
  int64_t integer(ThriftType type, int64_t low, int64_t high, const char* what) {
    const int64_t v = integer(type);
    if (v < low || v > high) fail(str(what, " of ", v));
    return v;
  }
  // A bool field (its value is its type).
  bool boolean(ThriftType type) {
    if (type == ThriftType::True) return true;
    if (type == ThriftType::False) return false;
    fail("a bool field of another type");
  }
  std::string_view binary(ThriftType type) {
    if (type != ThriftType::Binary) fail("a string field of another type");
    const uint64_t length = varint();
    if (length > bytes_.size() - position_) fail(str("a string of ", length, " bytes past the end"));
    const auto* p = reinterpret_cast<const char*>(bytes_.data() + position_);
    position_ += length;
    return {p, static_cast<size_t>(length)};
  }
  // A list or set field's header: its elements' type and count.
  std::pair<ThriftType, int64_t> list(ThriftType type) {
    if (type != ThriftType::List && type != ThriftType::Set) fail("a list field of another type");
    const uint8_t header = byte();
    uint64_t count = header >> 4;
    if (count == 15) count = varint();
    if (count > bytes_.size() - position_) fail(str("a list of ", count, " elements in ", bytes_.size() - position_,
                                                    " bytes"));
    return {static_cast<ThriftType>(header & 0x0F), static_cast<int64_t>(count)};
  }
  // Reads the elements of a list whose header was read: `on_element(type)` for each.
  template <class OnElement>
  void elements(std::pair<ThriftType, int64_t> header, OnElement&& on_element) {
    for (int64_t i = 0; i < header.second; ++i) on_element(header.first);
  }

  void skip(ThriftType type) {
    switch (type) {
      case ThriftType::True: case ThriftType::False: return;  // a field's value is its type
      case ThriftType::Byte: byte(); return;
      case ThriftType::I16: case ThriftType::I32: case ThriftType::I64: varint(); return;
      case ThriftType::Double:
        if (bytes_.size() - position_ < 8) fail("a double past the end");
        position_ += 8;
        return;
      case ThriftType::Binary: binary(type); return;
      case ThriftType::List: case ThriftType::Set: {
        enter();
        const auto [element, count] = list(type);
        for (int64_t i = 0; i < count; ++i) skip_element(element);
        --depth_;
        return;
      }
      case ThriftType::Map: {
        enter();
        const uint64_t count = varint();
        if (count > bytes_.size() - position_) fail("a map past the end");
        if (count > 0) {
          const uint8_t types = byte();
          for (uint64_t i = 0; i < count; ++i) {
            skip_element(static_cast<ThriftType>(types >> 4));
            skip_element(static_cast<ThriftType>(types & 0x0F));
          }
        }
        --depth_;
        return;
      }
      case ThriftType::Struct: read_struct([&](int16_t, ThriftType t) { skip(t); }); return;
      default: fail("a value of unknown type");
    }
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError(str(where_, ": ", why, " (Thrift, at byte ", position_, " of ", bytes_.size(), ")"));
  }

 private:
  void skip_element(ThriftType type) {
    if (type == ThriftType::True || type == ThriftType::False) {  // a bool element is a byte
      byte();
      return;
    }
    if (type == ThriftType::Stop || static_cast<uint8_t>(type) > static_cast<uint8_t>(ThriftType::Struct))
      fail("an element of unknown type");
    skip(type);
  }
  void enter() {
    if (++depth_ > kMaxDepth) fail(str("structures nested deeper than ", kMaxDepth));
  }
  uint8_t byte() {
    if (position_ >= bytes_.size()) fail("cut short");
    return static_cast<uint8_t>(bytes_[position_++]);
  }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      value |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return value;
    }
    fail("a varint longer than 10 bytes");
  }
  static int64_t zigzag(uint64_t v) { return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1)); }

  std::span<const std::byte> bytes_;
  std::string where_;
  size_t position_ = 0;
  int depth_ = 0;
};

}  // namespace mmt::detail
