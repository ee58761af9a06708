// The .npy header: magic, version, length, and the Python dict literal numpy writes, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }
// parsed by a small strict parser (never evaluated), and its inverse for writing.
#include <bit>
#include <cctype>
#include <optional>
#include <string>

#include "import_util.h"
#include "npy_format.h"
#include "utf8.h"
#include "mmtensor/numpy_io.h"

namespace mmt {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicBytes = 6;
// numpy aligns the data to 64 bytes so it can be mapped and used in place.
constexpr size_t kNpyHeaderAlignment = 64;

// Recursive descent over the header text. Every method throws FormatError naming the source
// and the character position, so a corrupt header says where it went wrong.
class DictParser {
 public:
  DictParser(std::string_view text, std::string_view what) : text_(text), what_(what) {}

  void parse(NpyHeader& header) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{');
    skip_space();
    while (!consume('}')) {
      std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        check_once(have_descr, key);
        if (peek() == '[')  // well formed, but not a type mmtensor stores: not "corrupt"
          throw FormatError(detail::str(what_, ": unsupported dtype: a structured array (its descr is a list of "
                                        "fields); save each field as an array of its own"));
        header.descr = parse_string();
      } else if (key == "fortran_order") {
        check_once(have_order, key);
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        check_once(have_shape, key);
        header.shape = parse_shape();
      } else {
        fail(detail::str("unexpected key '", detail::escaped(key), "' (an .npy header has exactly 'descr', ",
                         "'fortran_order' and 'shape')"));
      }
      skip_space();
      if (consume(',')) {
        skip_space();
        continue;
      }
      skip_space();
      expect('}');
      break;
    }
    if (!have_descr) fail("the header has no 'descr' key");
    if (!have_order) fail("the header has no 'fortran_order' key");
    if (!have_shape) fail("the header has no 'shape' key");
    // numpy pads with spaces and ends with a newline; anything else is not its writer's.
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\n' && c != '\t' && c != '\r' && c != '\0')
        fail("unexpected text after the header dict");
      ++pos_;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError(detail::str(what_, ": corrupt .npy header at character ", pos_, ": ", why));
  }
  void check_once(bool& seen, const std::string& key) {
    if (seen) fail(detail::str("key '", detail::escaped(key), "' appears twice"));
    seen = true;
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool consume(char c) {
    if (peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!consume(c)) {
      if (pos_ >= text_.size()) fail(detail::str("expected '", c, "' but the header ended"));
      fail(detail::str("expected '", c, "' but found '", detail::escaped(text_.substr(pos_, 1)), "'"));
    }
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  // A quoted string without escapes: no key or descr numpy writes needs one.
  std::string parse_string() {
    char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    ++pos_;
    size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escape sequences are not expected in an .npy header");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    std::string value(text_.substr(start, pos_ - start));
    ++pos_;
    return value;
  }
  bool parse_bool() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("'fortran_order' must be True or False");
  }
  int64_t parse_int() {
    if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a non-negative integer");
    int64_t value = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      int digit = text_[pos_] - '0';
      if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, digit, &value))
        fail("dimension does not fit a 64-bit integer");
      ++pos_;
    }
    consume('L');  // Python 2's long literal, found in files written by old numpy
    return value;
  }
  // "()", "(5,)", "(3, 4)", "(3, 4,)".
  DimVector parse_shape() {
    DimVector shape;
    expect('(');
    skip_space();
    if (consume(')')) return shape;
    for (;;) {
      shape.push_back(parse_int());
      if (shape.size() > 64) fail("more than 64 dimensions");
      skip_space();
      if (consume(')')) {
        if (shape.size() == 1) fail("a one-element tuple needs a trailing comma: (n,)");
        return shape;
      }
      expect(',');
      skip_space();
      if (consume(')')) return shape;
    }
  }

  std::string_view text_;
  std::string_view what_;
  size_t pos_ = 0;
};

[[noreturn]] void refuse_descr(std::string_view what, std::string_view descr, std::string_view why) {
  throw FormatError(detail::str(what, ": unsupported dtype '", detail::escaped(descr), "': ", why));
}

// Maps a descr such as "<f4" to the dtype and byte order, or explains the refusal.
void resolve_descr(NpyHeader& header, std::string_view what) {
  const std::string& d = header.descr;
  auto refuse = [&](std::string_view why) { refuse_descr(what, d, why); };
  if (d.size() < 2) refuse("not a numpy type string");
  char order = d[0];
  if (order != '<' && order != '>' && order != '|' && order != '=')
    refuse("expected a byte order '<', '>', '|' or '=' first");
  std::string_view code = std::string_view(d).substr(1);
  static constexpr struct {
    std::string_view code;
    ScalarType dtype;
  } kTypes[] = {{"b1", kBool},    {"u1", kUInt8},    {"i1", kInt8},    {"i2", kInt16},
                {"u2", kUInt16},  {"i4", kInt32},    {"u4", kUInt32},  {"i8", kInt64},
                {"u8", kUInt64},  {"f2", kFloat16},  {"f4", kFloat32}, {"f8", kFloat64}};
  for (const auto& t : kTypes) {
    if (t.code != code) continue;
    header.dtype = t.dtype;
    if (element_size(t.dtype) == 1) {
      header.big_endian = false;
    } else {
      if (order == '|') refuse("a multi-byte type needs a byte order '<' or '>'");
      header.big_endian = order == '>' || (order == '=' && std::endian::native == std::endian::big);
    }
    return;
  }
  switch (code[0]) {
    case 'O': refuse_descr(what, d, "object arrays hold pickled Python objects, which mmtensor never loads");
    case 'U': case 'S': case 'a': refuse_descr(what, d, "string arrays are not supported");
    case 'c': refuse_descr(what, d, "complex numbers are not supported");
    case 'M': case 'm': refuse_descr(what, d, "datetime and timedelta arrays are not supported");
    case 'V': refuse_descr(what, d, "void (raw record) arrays are not supported");
    case 'f': refuse_descr(what, d, "only float16, float32 and float64 are supported among floats");
    default: refuse_descr(what, d, "not a numeric type mmtensor supports");
  }
}

}  // namespace

NpyHeader parse_npy_header(std::span<const std::byte> bytes, std::string_view what) {
  NpyHeader header;
  if (bytes.size() < kNpyMagicBytes + 4)
    throw FormatError(detail::str(what, ": not an .npy file: ", bytes.size(),
                                  " bytes is too short for the .npy preamble"));
  if (std::memcmp(bytes.data(), kNpyMagic, kNpyMagicBytes) != 0)
    throw FormatError(detail::str(what, ": not an .npy file: the magic \\x93NUMPY is missing"));
  header.major_version = static_cast<uint8_t>(bytes[6]);
  header.minor_version = static_cast<uint8_t>(bytes[7]);
  size_t prefix_bytes;
  uint64_t header_bytes;
  if (header.major_version == 1) {
    prefix_bytes = kNpyMagicBytes + 2 + 2;
    header_bytes = detail::load_le16(bytes.data() + 8);
  } else if (header.major_version == 2 || header.major_version == 3) {
    if (bytes.size() < kNpyMagicBytes + 6)
      throw FormatError(detail::str(what, ": truncated .npy preamble"));
    prefix_bytes = kNpyMagicBytes + 2 + 4;
    header_bytes = detail::load_le32(bytes.data() + 8);
  } else {
    throw FormatError(detail::str(what, ": unsupported .npy format version ", header.major_version,
                                  ".", header.minor_version, " (1.0, 2.0 and 3.0 are known)"));
  }
  if (header_bytes > static_cast<uint64_t>(kMaxNpyHeaderBytes))
    throw FormatError(detail::str(what, ": .npy header length ", header_bytes,
                                  " bytes exceeds the limit of ", kMaxNpyHeaderBytes));
  if (header_bytes > bytes.size() - prefix_bytes)
    throw FormatError(detail::str(what, ": truncated .npy header: it declares ", header_bytes,
                                  " bytes but only ", bytes.size() - prefix_bytes, " follow"));
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + prefix_bytes), header_bytes);
  DictParser(text, what).parse(header);
  resolve_descr(header, what);
  header.data_offset = static_cast<int64_t>(prefix_bytes + header_bytes);
  header.data_nbytes = detail::checked_shape_nbytes(header.shape, element_size(header.dtype), what);
  return header;
}

std::string npy_descr(ScalarType dtype) {
  const char order = std::endian::native == std::endian::little ? '<' : '>';
  switch (dtype) {
    case kBool: return "|b1";
    case kUInt8: return "|u1";
    case kInt8: return "|i1";
    case kInt16: return std::string(1, order) + "i2";
    case kUInt16: return std::string(1, order) + "u2";
    case kInt32: return std::string(1, order) + "i4";
    case kUInt32: return std::string(1, order) + "u4";
    case kInt64: return std::string(1, order) + "i8";
    case kUInt64: return std::string(1, order) + "u8";
    case kFloat16: return std::string(1, order) + "f2";
    case kFloat32: return std::string(1, order) + "f4";
    case kFloat64: return std::string(1, order) + "f8";
    case kBFloat16: break;
  }
  throw ValueError(
      "bfloat16 has no numpy dtype, so it cannot be written to .npy; convert it to float32 first");
}

std::string detail::npy_header_bytes(ScalarType dtype, IntArrayRef shape) {
  std::string dict = "{'descr': '" + npy_descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  dict += shape.size() == 1 ? ",), }" : "), }";
  // Version 1.0 has a 2-byte header length; beyond it numpy switches to 2.0's 4-byte length.
  int major = 1;
  size_t prefix = kNpyMagicBytes + 2 + 2;
  size_t total = (prefix + dict.size() + 1 + kNpyHeaderAlignment - 1) / kNpyHeaderAlignment *
                 kNpyHeaderAlignment;
  if (total - prefix > 65535) {
    major = 2;
    prefix = kNpyMagicBytes + 2 + 4;
    total = (prefix + dict.size() + 1 + kNpyHeaderAlignment - 1) / kNpyHeaderAlignment *
            kNpyHeaderAlignment;
  }
  size_t header_len = total - prefix;
  std::string out(kNpyMagic, kNpyMagicBytes);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i)
    out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

}  // namespace mmt
