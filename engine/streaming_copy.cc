#include "streaming_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace mmt::detail {
namespace {

std::atomic<StreamingStores> mode{StreamingStores::Auto};
thread_local bool device_bound = false;      // GatherDestination
thread_local int64_t bytes_in_flight = 0;    // GatherDestination

}  // namespace

StreamingStores streaming_stores() noexcept { return mode.load(std::memory_order_relaxed); }
void set_streaming_stores(StreamingStores m) noexcept { mode.store(m, std::memory_order_relaxed); }

namespace {

// The size of the level-3 cache the calling core shares, from sysfs ("32768K"); -1 if unknown.
// Not sysconf(_SC_LEVEL3_CACHE_SIZE): on an AMD EPYC VM it gave the whole socket's 256 MB
// where a core shares 32 MB.
int64_t shared_l3_bytes() noexcept try {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    int64_t size = 0;
    std::string unit;
    if (!(level_file >> level) || level != 3) continue;
    if (!(size_file >> size) || size <= 0) return -1;
    size_file >> unit;  // "32768K": the number and its unit may also be apart
    const char suffix = !unit.empty() ? unit[0] : 'B';
    return suffix == 'K' ? size << 10 : suffix == 'M' ? size << 20 : size;
  }
  return -1;
} catch (...) {  // no memory for a path: the floor will do
  return -1;
}

// 0 until first asked. Not a function-local static: a loader's worker is usually the first to
// ask, and a fork while it was filling one left the static's guard taken in the child, whose
// first get_batch of a large field then waited for ever (fork_safety.h). Threads that ask at
// once each read sysfs and store the same value.
std::atomic<int64_t> min_batch_bytes_read{0};

}  // namespace

int64_t streaming_min_batch_bytes() noexcept {
  int64_t bytes = min_batch_bytes_read.load(std::memory_order_relaxed);
  if (bytes == 0) {
    bytes = std::max<int64_t>(shared_l3_bytes(), int64_t{32} << 20);
    min_batch_bytes_read.store(bytes, std::memory_order_relaxed);
  }
  return bytes;
}

bool use_streaming_copy(int64_t value_bytes, int64_t gather_bytes) noexcept {
  switch (streaming_stores()) {
    case StreamingStores::Never:
      return false;
    case StreamingStores::Always:
      return true;
    case StreamingStores::Auto:
      break;
  }
  if (value_bytes < kStreamingMinValueBytes) return false;
  return device_bound || std::max(gather_bytes, bytes_in_flight) >= streaming_min_batch_bytes();
}

GatherDestination::GatherDestination(bool bound, int64_t in_flight) noexcept
    : previous_device_bound_(device_bound), previous_bytes_in_flight_(bytes_in_flight) {
  device_bound = bound;
  bytes_in_flight = in_flight;
}

GatherDestination::~GatherDestination() {
  device_bound = previous_device_bound_;
  bytes_in_flight = previous_bytes_in_flight_;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MMT_SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MMT_SANITIZED_BUILD 1
#endif
#endif

void streaming_copy(void* dst, const void* src, size_t nbytes) noexcept {
#if defined(MMT_SANITIZED_BUILD)
  // The sanitizers do not see the non-temporal stores: memcpy the same bytes first, so that
  // ASan checks the destination and TSan sees the write.
  std::memcpy(dst, src, nbytes);
#endif
#if defined(__x86_64__)
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
  // Up to the destination's next line with memcpy, so that every streamed line is whole: a
  // line written partly by ordinary and partly by non-temporal stores flushes early.
  const size_t head = std::min(nbytes, (64 - reinterpret_cast<uintptr_t>(out) % 64) % 64);
  std::memcpy(out, in, head);
  out += head, in += head, nbytes -= head;
  for (; nbytes >= 64; out += 64, in += 64, nbytes -= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + 48), d);
  }
  std::memcpy(out, in, nbytes);
#else
  std::memcpy(dst, src, nbytes);
#endif
}

void streaming_copy_fence() noexcept {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace mmt::detail
