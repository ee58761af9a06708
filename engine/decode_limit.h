// How many bytes an input's compressed or encoded data may decode to. Codecs, dictionaries and
// runs let a few bytes of a file stand for gigabytes: a hostile file could fill the memory or
// the scratch disk. Real data stays far below the limit: 1024 times its bytes in the file, and
// at least an eighth of the machine's memory and 1 GiB (a dictionary of long strings repeated
// is legal, and far past its size). The Parquet reader holds each column chunk to it, the
// Arrow reader a file's compressed batches.
#pragma once

#include <cstdint>

namespace mmt::detail {

inline constexpr int64_t kDecodeExpansion = 1024;

// The limit for data of `stored` bytes in the file (what it claims decoded is not counted:
// nothing bounds a claim).
int64_t decode_limit(int64_t stored);

// Sets the least a limit may be instead of an eighth of the machine's memory; 0 restores that.
// For fuzzers, whose allocations are capped, and tests.
void set_decode_floor(int64_t bytes);

}  // namespace mmt::detail
