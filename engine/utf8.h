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
