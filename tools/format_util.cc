// Number formatting and size parsing shared by the subcommands.
#include <cctype>
#include <cmath>
#include <cstdio>

#include "mmt_commands.h"
#include "mmtensor/error.h"

namespace mmt::tool {

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

int64_t parse_byte_size(const std::string& text, const std::string& option) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  MMT_CHECK(digits > 0 && digits <= 18, ValueError, option, ": '", text,
            "' is not a size (write 4096, 64K, 1M or 1G)");
  int64_t value = std::stoll(text.substr(0, digits));
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else throw ValueError(detail::str(option, ": unknown size suffix in '", text, "' (use K, M or G)"));
  MMT_CHECK(value <= (INT64_MAX >> shift), ValueError, option, ": '", text, "' is too large");
  return value << shift;
}

}  // namespace mmt::tool
