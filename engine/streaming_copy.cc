#include "streaming_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace mmt::detail {
namespace {

// From 16 KB a value: gathers of such records were 1.10-1.34 times as fast with streaming
// stores on an AMD EPYC VM, where 784-byte records were 2.4-3.2 times slower: a batch of small
// records stays in the cache, and partly filled lines cost a write to memory each
// (bench/RESULTS.md, "Streaming stores").
constexpr int64_t kDefaultStreamingCopyMinBytes = 16 << 10;
std::atomic<int64_t> min_bytes{kDefaultStreamingCopyMinBytes};

}  // namespace

int64_t streaming_copy_min_bytes() noexcept { return min_bytes.load(std::memory_order_relaxed); }
void set_streaming_copy_min_bytes(int64_t nbytes) noexcept { min_bytes.store(nbytes, std::memory_order_relaxed); }

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MMT_SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MMT_SANITIZED_BUILD 1
#endif
#endif

void streaming_copy(void* dst, const void* src, size_t nbytes) noexcept {
#if defined(MMT_SANITIZED_BUILD)
  // The sanitizers do not see the intrinsics' loads and stores: memcpy the same bytes first,
  // so that ASan checks both ranges and TSan sees the write.
  std::memcpy(dst, src, nbytes);
#endif
#if defined(__x86_64__)
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
  // The head up to the destination's next 16-byte boundary, the way memcpy does it.
  const size_t head = std::min(nbytes, (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16);
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
