// The engine's one checksum: 64-bit xxHash3, used for the preamble, footer, schema block,
// chunk table entries and chunk payloads (docs/FORMAT.md, "Checksums").
#pragma once

#include <cstddef>
#include <cstdint>

namespace mmt::detail {

// XXH3_64bits_withSeed(data, nbytes, seed). Seed 0 equals plain XXH3_64bits.
uint64_t checksum64(const void* data, size_t nbytes, uint64_t seed = 0);

}  // namespace mmt::detail
