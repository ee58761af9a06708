// splitmix64's finaliser, the engine's one way to turn seeds and counters into well-mixed
// 64-bit keys (the sampler's shuffles, a transform's per-sample seeds).
#pragma once

#include <cstdint>

namespace mmt::detail {

inline constexpr uint64_t kGoldenRatio64 = 0x9e3779b97f4a7c15ULL;

// Full avalanche: every input bit flips each output bit with probability about 1/2. Cheap.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A key for item `b` under key `a`: unrelated keys for neighbouring b.
inline uint64_t derive_key(uint64_t a, uint64_t b) { return mix64(a + kGoldenRatio64 * (b + 1)); }

}  // namespace mmt::detail
