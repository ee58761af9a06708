// The read-ahead policy of loaders and of Dataset::get_batch (read_ahead.h).
#include "read_ahead.h"

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

void ReadAheadPolicy::note_new_epoch() {
  if (mode_ == ReadAhead::Auto && read_bytes_unknown_.load(std::memory_order_relaxed))
    hinting_.store(false, std::memory_order_relaxed);
}

}  // namespace mmt::detail
