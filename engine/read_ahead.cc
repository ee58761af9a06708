// The read-ahead policy of loaders and of Dataset::get_batch (read_ahead.h).
#include "read_ahead.h"

#include <algorithm>

namespace mmt::detail {

thread_local bool ReadAheadPolicy::DatasetHintsOff::off_ = false;

bool ReadAheadPolicy::note_gather_faults(int64_t major_faults) {
  if (mode_ != ReadAhead::Auto || major_faults <= 0) return false;
  warm_hints_in_a_row_.store(0, std::memory_order_relaxed);
  return !hinting_.exchange(true, std::memory_order_relaxed);
}

void ReadAheadPolicy::note_hint(int64_t read_bytes) {
  count_hint();
  if (mode_ != ReadAhead::Auto) return;
  if (read_bytes < 0) {
    read_bytes_unknown_.store(true, std::memory_order_relaxed);
    return;
  }
  note_hint_found_cold(read_bytes > 0);
}

void ReadAheadPolicy::note_hint_found_cold(bool cold) {
  if (mode_ != ReadAhead::Auto) return;
  if (cold) {
    warm_hints_in_a_row_.store(0, std::memory_order_relaxed);
    return;
  }
  if (warm_hints_in_a_row_.fetch_add(1, std::memory_order_relaxed) + 1 >= kWarmHintsToStop) {
    warm_hints_in_a_row_.store(0, std::memory_order_relaxed);
    hinting_.store(false, std::memory_order_relaxed);
  }
}

void ReadAheadPolicy::note_warm_gather(std::chrono::nanoseconds took, size_t records) {
  if (records == 0) return;
  // The last such gather's, not the fastest: one taken on more threads, or of a smaller
  // field, would otherwise make every later batch look slow.
  warm_gather_ps_per_record_.store(took.count() * 1000 / static_cast<int64_t>(records), std::memory_order_relaxed);
}

std::chrono::nanoseconds ReadAheadPolicy::slow_gather(size_t records) const {
  const int64_t ps = warm_gather_ps_per_record_.load(std::memory_order_relaxed);
  const __int128 over_warm_ns = __int128{kSlowGatherOverWarm} * ps * static_cast<__int128>(records) / 1000;
  const auto over_warm = std::chrono::nanoseconds(static_cast<int64_t>(std::min<__int128>(over_warm_ns, INT64_MAX)));
  return std::max<std::chrono::nanoseconds>(kSlowGather, over_warm);
}

void ReadAheadPolicy::note_new_epoch() {
  if (mode_ == ReadAhead::Auto && read_bytes_unknown_.load(std::memory_order_relaxed))
    hinting_.store(false, std::memory_order_relaxed);
}

}  // namespace mmt::detail
