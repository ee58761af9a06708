// UTF-8 validation for the text a dataset stores in its JSON schema block (field names,
// metadata): JSON text is UTF-8, and a writer that let other bytes through would fail at
// finish() with the JSON library's message instead of naming the field or key.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mmt::detail {

// The offset of the first byte that does not belong to a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or npos.
inline size_t first_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    unsigned char min_second = 0x80, max_second = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) min_second = 0xA0;  // overlong
      if (lead == 0xED) max_second = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) min_second = 0x90;  // overlong
      if (lead == 0xF4) max_second = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (size - i < length || bytes[i + 1] < min_second || bytes[i + 1] > max_second) return i;
    for (size_t k = 2; k < length; ++k)
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    i += length;
  }
  return std::string_view::npos;
}

// The offset of the first control character: C0 controls, DEL, or a C1 control U+0080..U+009F
// (UTF-8 C2 80..C2 9F), which some terminals obey too; npos when there is none.
inline size_t first_control_character(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const bool c1 = byte == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (byte < 0x20 || byte == 0x7F || c1) return i;
  }
  return std::string_view::npos;
}

// Whether text from a file may go into an error message as it is: well-formed UTF-8, no
// control character (a terminal would obey it), and short.
inline bool is_safe_to_quote(std::string_view text, size_t max_bytes) {
  return text.size() <= max_bytes && first_invalid_utf8(text) == std::string_view::npos &&
         first_control_character(text) == std::string_view::npos;
}

// The length of the well-formed UTF-8 sequence at the start of `text`, or 0 when it is not
// one (a stray continuation byte, a truncated or overlong sequence, a surrogate, past U+10FFFF).
inline size_t utf8_sequence_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  const size_t length = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                        : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
  if (length == 0 || text.size() < length) return 0;
  for (size_t i = 1; i < length; ++i)
    if ((byte(i) & 0xC0) != 0x80) return 0;
  if ((lead == 0xE0 && byte(1) < 0xA0) || (lead == 0xED && byte(1) > 0x9F) ||
      (lead == 0xF0 && byte(1) < 0x90) || (lead == 0xF4 && byte(1) > 0x8F))
    return 0;
  return length;
}

// `text` cut to about `max_bytes` for a message, never inside a UTF-8 character (Python would
// show an undecodable message as an empty one), with its full length said.
inline std::string cut_for_message(std::string text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "... (" + std::to_string(text.size()) + " bytes)";
}

// `text` made safe to print and unambiguous to read: control characters (C0, DEL, and C1 as
// UTF-8 or as lone bytes) and bytes that are not UTF-8 become \xNN or \u00NN, and a backslash
// becomes \\ (so an escape in the output is never ambiguous); printable UTF-8 is kept as it
// is. For text from a file (a field name, an .npy descr, an .npz member name) that goes into
// an error message: a terminal would obey its control characters, and a NUL would end the
// message where what() is read as a C string.
inline std::string escaped(std::string_view text, bool escape_backslash = true) {
  std::string out;
  out.reserve(text.size());
  const auto append_escape = [&](char kind, unsigned value) {
    static constexpr char kHex[] = "0123456789abcdef";
    out.push_back('\\');
    out.push_back(kind);
    if (kind == 'u') out.append("00");
    out.push_back(kHex[(value >> 4) & 0xF]);
    out.push_back(kHex[value & 0xF]);
  };
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : utf8_sequence_length(text.substr(i));
    // A lone surrogate as Python's surrogatepass encodes it (ED A0..BF 80..BF, a name made
    // by os.fsdecode of bytes that are not UTF-8): \udcff, as Python shows it.
    if (c == 0xED && i + 2 < text.size() &&
        (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0xA0 && (static_cast<unsigned char>(text[i + 2]) & 0xC0) == 0x80) {
      const unsigned point = 0xD000u | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu) << 6 |
                             (static_cast<unsigned char>(text[i + 2]) & 0x3Fu);
      static constexpr char kHex[] = "0123456789abcdef";
      out.append("\\u");
      for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(point >> shift) & 0xF]);
      i += 3;
      continue;
    }
    if (c == '\\') {
      out.append(escape_backslash ? "\\\\" : "\\");
    } else if (c < 0x20 || c == 0x7F || length == 0) {
      append_escape('x', c);  // C0 controls, DEL, and bytes that are not UTF-8 (a lone 0x9b is CSI)
    } else if (c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      append_escape('u', static_cast<unsigned char>(text[i + 1]));  // C1: U+0080..U+009F
    } else {
      out.append(text.substr(i, length));
    }
    i += length == 0 ? 1 : length;
  }
  return out;
}

// Text from a file or a user for an error message: in single quotes when it is safe to
// show as it is, else described (a terminal would obey its control characters).
inline std::string quoted(std::string_view text, size_t max_bytes = 1024) {
  std::string out;  // appended piece by piece: gcc 12 warns falsely on "'" + ... (-Wrestrict, its bug 105329)
  if (is_safe_to_quote(text, max_bytes)) {
    out.reserve(text.size() + 2);
    out.push_back('\'');
    out.append(text);
    out.push_back('\'');
  } else {
    out.push_back('(');
    out.append(std::to_string(text.size()));
    out.append(" bytes not shown: control characters, invalid UTF-8 or too long)");
  }
  return out;
}

}  // namespace mmt::detail
