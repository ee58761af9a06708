// Number formatting and size parsing shared by the subcommands.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cwchar>
#include <string_view>

#include <locale.h>

#include "mmt_commands.h"
#include "mmtensor/error.h"
#include "utf8.h"

namespace mmt::tool {

std::string codec_text(const DatasetInfo& info) { return info.codecs_differ ? "mixed" : info.codec.str(); }

std::string human_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1000 && unit < 5) {
    bytes /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

std::string human_seconds(double seconds) {
  char text[32];
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) {
    std::snprintf(text, sizeof text, seconds < 10 ? "%.2f s" : "%.0f s", seconds);
  } else {
    long total = std::lround(seconds);
    std::snprintf(text, sizeof text, "%ld min %02ld s", total / 60, total % 60);
  }
  return text;
}

std::string printable(std::string_view text) { return detail::escaped(text); }

size_t display_width(std::string_view text) {
  // wcwidth reads the thread's LC_CTYPE: C.UTF-8 for this call, whatever the process's is.
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t{});
  if (utf8 == locale_t{}) {  // no such locale: a column per character (bytes that start one)
    return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    }));
  }
  const locale_t previous = uselocale(utf8);
  size_t width = 0;
  std::mbstate_t state{};
  for (size_t i = 0; i < text.size();) {
    wchar_t c = 0;
    const size_t length = std::mbrtowc(&c, text.data() + i, text.size() - i, &state);
    if (length == 0 || length > text.size() - i) {  // NUL, or not UTF-8: printable() escapes those
      state = std::mbstate_t{};
      ++width;
      ++i;
      continue;
    }
    // -1: a character wcwidth does not know (unassigned); terminals give it a column.
    // Controls, which it also calls -1, are escaped by printable() before this.
    const int columns = wcwidth(c);
    width += columns < 0 ? 1 : static_cast<size_t>(columns);
    i += length;
  }
  uselocale(previous);
  return width;
}

std::string pad_to_width(std::string text, size_t width) {
  const size_t used = display_width(text);
  if (used < width) text.append(width - used, ' ');
  return text;
}

std::string printable_message(std::string_view message) { return detail::escaped(message, /*escape_backslash=*/false); }

int64_t parse_byte_size(const std::string& text, const std::string& option) {
  // The suffix is the letters at the end; what comes before must be a whole decimal number.
  size_t suffix_at = text.size();
  while (suffix_at > 0 && std::isalpha(static_cast<unsigned char>(text[suffix_at - 1]))) --suffix_at;
  const std::string number = text.substr(0, suffix_at);
  std::string suffix = text.substr(suffix_at);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  MMT_CHECK(std::any_of(number.begin(), number.end(), is_digit), ValueError, option, ": '", text,
            "' is not a size (write 4096, 64K, 1M or 1G)");
  MMT_CHECK(std::all_of(number.begin(), number.end(), is_digit), ValueError, option, ": '", text, "': the number '",
            number, "' is not a whole decimal number (write decimal digits, then K, M or G if wanted: 4096, 1536K, 1M)");
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else throw ValueError(detail::str(option, ": unknown size suffix '", text.substr(suffix_at), "' in '", text,
                                    "' (use K, M or G)"));
  int64_t value = 0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  MMT_CHECK(error == std::errc() && end == number.data() + number.size() && value <= (INT64_MAX >> shift),
            ValueError, option, ": '", text, "' is too large");
  return value << shift;
}

int64_t parse_int64(const std::string& text, const std::string& what, int64_t min, int64_t max) {
  const bool has_sign = !text.empty() && (text[0] == '+' || text[0] == '-');
  const std::string_view digits = std::string_view(text).substr(has_sign ? 1 : 0);
  const auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  // The hint offers a negative value only where one is allowed.
  MMT_CHECK(!digits.empty() && std::all_of(digits.begin(), digits.end(), is_digit), ValueError, what, " '",
            text, "' is not an integer (",
            min < 0 ? "write 17 or -1: an optional sign, then digits only" : "write 17: digits only", ")");
  // Only the range is left to check; from_chars reports it instead of clamping (it takes a
  // '-' but not a '+').
  const char* first = text.data() + (text[0] == '+' ? 1 : 0);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(first, text.data() + text.size(), value);
  MMT_CHECK(error == std::errc() && end == text.data() + text.size() && value >= min && value <= max, ValueError,
            what, " '", text, "' is out of range: it must be within [", min, ", ", max, "]");
  return value;
}

uint64_t parse_uint64(const std::string& text, const std::string& what, uint64_t max) {
  const std::string_view digits = std::string_view(text).substr(!text.empty() && text[0] == '+' ? 1 : 0);
  const auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  MMT_CHECK(!digits.empty() && std::all_of(digits.begin(), digits.end(), is_digit), ValueError, what, " '",
            text, "' is not a non-negative integer (write 17: digits only)");
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  MMT_CHECK(error == std::errc() && end == digits.data() + digits.size() && value <= max, ValueError, what, " '",
            text, "' is out of range: it must be within [0, ", max, "]");
  return value;
}

}  // namespace mmt::tool
