#include "decode_limit.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace mmt::detail {
namespace {

std::atomic<int64_t> floor_override{0};  // set_decode_floor

int64_t minimum_limit() {
  static const int64_t limit = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const int64_t memory = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
    return std::max<int64_t>(int64_t{1} << 30, memory / 8);
  }();
  const int64_t override = floor_override.load();
  return override > 0 ? override : limit;
}

}  // namespace

int64_t decode_limit(int64_t stored) {
  const int64_t floor = minimum_limit();
  if (stored <= floor / kDecodeExpansion) return floor;
  return stored > INT64_MAX / kDecodeExpansion ? INT64_MAX : stored * kDecodeExpansion;
}

void set_decode_floor(int64_t bytes) { floor_override.store(bytes); }

}  // namespace mmt::detail
