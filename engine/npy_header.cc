// The .npy header: magic, version, length, and the Python dict literal numpy writes, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }
// parsed by a small parser (never evaluated), and its inverse for writing. np.load reads the
// dict with Python's ast.literal_eval; this parser takes the subset of Python's syntax that
// writers of .npy files use (other writers than numpy's included: whitespace and newlines
// anywhere between the tokens, either quote), and refuses what literal_eval refuses (a
// dimension with a leading zero) where it could otherwise read a number numpy does not.
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

using detail::kNpyMagic;
using detail::kNpyMagicBytes;
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
      if (!is_space(c) && c != '\0')
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
  // Python's whitespace between the tokens of a bracketed expression: space, tab, form feed
  // and line breaks (a writer that puts each key on a line of its own; np.load reads it).
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\n' || c == '\r'; }
  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
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
    // Python reads no decimal integer with a leading zero but zero itself ("0", "00"), so
    // np.load refuses "(03, 2)"; reading it as 3 would accept a file numpy does not.
    const size_t start = pos_;
    size_t end = pos_;
    while (end < text_.size() && std::isdigit(static_cast<unsigned char>(text_[end]))) ++end;
    const std::string_view digits = text_.substr(start, end - start);
    if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string_view::npos) {
      const std::string_view value = digits.substr(digits.find_first_not_of('0'));
      fail(detail::str("dimension '", digits, "' has a leading zero, which Python's integer syntax (and so np.load) ",
                       "refuses; write ", value));
    }
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

constexpr std::string_view kAcceptedDescrs =
    "mmtensor reads a type string of b1, u1, i1, i2, u2, i4, u4, i8, u8, f2, f4, f8, c8 or c16, after a byte "
    "order '<', '>', '=' or '|' or alone (native order), or one of the names bool, int8, uint8, int16, uint16, "
    "int32, uint32, int64, uint64, float16, float32, float64, complex64 and complex128";

// The names numpy gives these types (str(a.dtype)), which np.load also reads as a descr.
// They carry their size, so they mean one type to every writer.
constexpr struct {
  std::string_view name;
  ScalarType dtype;
} kSizedNames[] = {{"bool", kBool},       {"int8", kInt8},       {"uint8", kUInt8},     {"int16", kInt16},
                   {"uint16", kUInt16},   {"int32", kInt32},     {"uint32", kUInt32},   {"int64", kInt64},
                   {"uint64", kUInt64},   {"float16", kFloat16}, {"float32", kFloat32}, {"float64", kFloat64},
                   {"complex64", kComplex64}, {"complex128", kComplex128}};

// Names and one-letter codes np.load also reads, but whose size is not in them. Some differ
// between platforms ('int', 'l' and 'long' are 8 bytes in numpy on Linux, 4 on Windows) or
// from C ('float' is numpy's float64 but C's 4-byte float), so a writer may have meant
// another type than numpy reads; others ('f', 'd', 'h') are fixed, but one rule (only
// spellings that carry the size) is easier to state and to follow than a list. Refused with
// the sized spellings to use instead.
constexpr std::string_view kUnsizedNames[] = {
    "int",      "uint",      "float",  "double", "single", "half", "short", "ushort", "byte", "ubyte", "intc",
    "uintc",    "int_",      "intp",   "uintp",  "long",   "ulong", "longlong", "ulonglong", "float_", "bool_",
    "bool8",    "int0",      "uint0",  "?",      "b",      "B",    "h",     "H",      "i",    "I",     "l",
    "L",        "q",         "Q",      "p",      "P",      "e",    "f",     "d",      "complex", "cfloat", "cdouble",
    "csingle",  "complex_",  "singlecomplex", "F", "D"};

// numpy's type codes (a descr without its byte order) of the dtypes mmtensor has: read by
// resolve_descr() and written by npy_descr(). bfloat16 has none.
constexpr struct {
  std::string_view code;
  ScalarType dtype;
} kTypeCodes[] = {{"b1", kBool},      {"u1", kUInt8},      {"i1", kInt8},    {"i2", kInt16},
                  {"u2", kUInt16},    {"i4", kInt32},      {"u4", kUInt32},  {"i8", kInt64},
                  {"u8", kUInt64},    {"f2", kFloat16},    {"f4", kFloat32}, {"f8", kFloat64},
                  {"c8", kComplex64}, {"c16", kComplex128}};

// Maps a descr such as "<f4", "i4" or "float32" to the dtype and byte order, or explains the
// refusal. A type string without a byte order, or with '|' ("not applicable") on a
// multi-byte type, is in native order, as numpy reads it.
void resolve_descr(NpyHeader& header, std::string_view what) {
  const std::string& d = header.descr;
  auto refuse = [&](std::string_view why) { refuse_descr(what, d, why); };
  const bool native_big = std::endian::native == std::endian::big;
  for (const auto& n : kSizedNames) {
    if (n.name != d) continue;
    header.dtype = n.dtype;
    header.big_endian = element_size(n.dtype) > 1 && native_big;
    return;
  }
  std::string_view code = d;
  char order = '=';
  if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '=' || code[0] == '|')) {
    order = code[0];
    code.remove_prefix(1);
  }
  // numpy takes the one-letter codes with a byte order too ("<d", ">H", "|?"); its names
  // ("int", "float") only without one.
  const bool unsized = std::any_of(std::begin(kUnsizedNames), std::end(kUnsizedNames), [&](std::string_view name) {
    return name == d || (code.size() == 1 && name == code);
  });
  if (unsized)
    refuse(detail::str("numpy reads this name too, but mmtensor takes only spellings that carry the size (some ",
                       "names without it, such as 'int', 'l' and 'float', mean another size on another platform, or ",
                       "in C), so write the type the data holds with its size: ", kAcceptedDescrs));
  for (const auto& t : kTypeCodes) {
    if (t.code != code) continue;
    header.dtype = t.dtype;
    header.big_endian = element_size(t.dtype) > 1 && (order == '>' || (order != '<' && native_big));
    return;
  }
  const auto starts = [&](std::string_view prefix) { return code.starts_with(prefix); };
  if (code.empty()) refuse(detail::str("not a numpy type string; ", kAcceptedDescrs));
  if (code[0] == 'O' || code == "object")
    refuse("object arrays hold pickled Python objects, which mmtensor never loads");
  if (code[0] == 'U' || code[0] == 'S' || code[0] == 'a' || starts("str") || starts("bytes") || starts("unicode"))
    refuse("string arrays are not supported");
  if ((code[0] == 'c' && code.size() > 1) || code == "G" || starts("complex") || starts("clong"))
    refuse("only complex64 (c8) and complex128 (c16) are supported among complex numbers");
  if (code[0] == 'M' || code[0] == 'm' || starts("datetime") || starts("timedelta"))
    refuse("datetime and timedelta arrays are not supported");
  if (code[0] == 'V' || code == "void") refuse("void (raw record) arrays are not supported");
  if (code[0] == 'f') refuse(detail::str("only float16, float32 and float64 are supported among floats; ", kAcceptedDescrs));
  refuse(detail::str("not a numeric type mmtensor supports; ", kAcceptedDescrs));
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
  // '|' for one-byte types, which have no byte order (numpy writes "|u1"), else the host's.
  const char order = element_size(dtype) == 1                       ? '|'
                     : std::endian::native == std::endian::little ? '<'
                                                                   : '>';
  for (const auto& t : kTypeCodes)
    if (t.dtype == dtype) return order + std::string(t.code);
  throw ValueError(
      "bfloat16 has no numpy dtype, so it cannot be written to .npy; convert it to float32 first");
}

std::string detail::npy_header_bytes(ScalarType dtype, IntArrayRef shape, bool fortran_order) {
  std::string dict = "{'descr': '" + npy_descr(dtype) + "', 'fortran_order': " + (fortran_order ? "True" : "False") +
                     ", 'shape': (";
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
