#include "checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mmt::detail {

uint64_t checksum64(const void* data, size_t nbytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, nbytes, seed);
}

}  // namespace mmt::detail
