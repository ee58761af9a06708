// Software prefetch of a byte range's first cache lines: a gather that knows its next
// record's address asks for it while it copies the current one.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mmt::detail {

// Asks for the cache lines of [p, p + min(nbytes, limit)). A hint: it never faults, whatever
// the address. Locality as __builtin_prefetch's: 2 for bytes read once and passed on (a
// gather's source), 3 for bytes about to be worked on (a transform's input). Not 0: Intel
// Xeons stall on a run of prefetchnta (dataset_batch.cc).
template <int kLocality>
inline void prefetch_bytes(const void* p, int64_t nbytes, int64_t limit) {
  const auto* bytes = static_cast<const char*>(p);
  const int64_t n = std::min(nbytes, limit);
  for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(bytes + off, 0, kLocality);
}

}  // namespace mmt::detail
