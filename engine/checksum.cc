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

}  // namespace mmt::detail
