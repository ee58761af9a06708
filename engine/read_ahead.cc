// The loader's read-ahead policy and the per-thread I/O counts it watches (read_ahead.h).
#include "read_ahead.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <string_view>

namespace mmt::detail {

int64_t thread_major_faults() noexcept {
  struct rusage usage {};
  if (::getrusage(RUSAGE_THREAD, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_majflt);
}

int64_t thread_storage_read_bytes() noexcept {
  // Opened per call: a descriptor kept per thread would leak with every thread that ends.
  // Called once per hinted batch, next to hundreds of madvise calls.
  const int fd = ::open("/proc/thread-self/io", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  const std::string_view all(text, static_cast<size_t>(n));
  constexpr std::string_view kKey = "\nread_bytes: ";
  const size_t at = all.find(kKey);
  if (at == std::string_view::npos) return -1;
  const char* first = all.data() + at + kKey.size();
  int64_t value = -1;
  if (std::from_chars(first, all.data() + all.size(), value).ec != std::errc{}) return -1;
  return value;
}

bool ReadAheadPolicy::note_gather_faults(int64_t major_faults) {
  if (mode_ != ReadAhead::Auto || major_faults <= 0) return false;
  warm_hints_in_a_row_.store(0, std::memory_order_relaxed);
  return !hinting_.exchange(true, std::memory_order_relaxed);
}

void ReadAheadPolicy::note_hint(int64_t read_bytes) {
  batches_hinted_.fetch_add(1, std::memory_order_relaxed);
  if (mode_ != ReadAhead::Auto) return;
  if (read_bytes < 0) {
    read_bytes_unknown_.store(true, std::memory_order_relaxed);
    return;
  }
  if (read_bytes > 0) {
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
