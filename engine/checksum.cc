#include "checksum.h"

#include <cinttypes>
#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mmt::detail {

uint64_t checksum64(const void* data, size_t nbytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, nbytes, seed);
}

std::string hex64(uint64_t value) {
  char hex[19];
  std::snprintf(hex, sizeof hex, "0x%016" PRIx64, value);
  return hex;
}

namespace {

template <typename Canonical>
std::string hex_of(const Canonical& canonical) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (const unsigned char byte : canonical.digest) {
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

}  // namespace

std::optional<std::string> xxhash_hexdigest(std::string_view algorithm, const void* data, size_t nbytes) {
  if (algorithm == "xxh32") {
    XXH32_canonical_t canonical;
    XXH32_canonicalFromHash(&canonical, XXH32(data, nbytes, 0));
    return hex_of(canonical);
  }
  if (algorithm == "xxh64" || algorithm == "xxh3_64") {
    XXH64_canonical_t canonical;
    XXH64_canonicalFromHash(&canonical, algorithm == "xxh64" ? XXH64(data, nbytes, 0) : XXH3_64bits(data, nbytes));
    return hex_of(canonical);
  }
  if (algorithm == "xxh128" || algorithm == "xxh3_128") {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits(data, nbytes));
    return hex_of(canonical);
  }
  return std::nullopt;
}

}  // namespace mmt::detail
