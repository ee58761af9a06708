// The engine's one checksum: 64-bit xxHash3, used for the preamble, footer, schema block,
// chunk table entries and chunk payloads (docs/FORMAT.md, "Checksums").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mmt::detail {

// XXH3_64bits_withSeed(data, nbytes, seed). Seed 0 equals plain XXH3_64bits.
uint64_t checksum64(const void* data, size_t nbytes, uint64_t seed = 0);

// A 64-bit hash as text: "0x" and 16 hex digits (LoaderState's JSON, `mmt info`, messages),
// so readers that hold JSON numbers as doubles keep it exact.
std::string hex64(uint64_t value);

}  // namespace mmt::detail
