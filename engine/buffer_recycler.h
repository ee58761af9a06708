// BufferRecycler: the writer's chunk buffers, handed back after use and lent out again.
//
// A writer fills, compresses and writes one chunk after another, each in buffers of the same
// few sizes (the chunk, the codec's bound). Allocating them fresh per chunk makes every page
// of every chunk fault and be zeroed on first touch (the allocator serves blocks this large
// straight from mmap): measured at a quarter of an uncompressed pack's time. Recycled
// buffers are already faulted in.
//
// - take(n) lends a buffer of at least n bytes: an idle one (the smallest that fits, and at
//   most twice n, so a small request never pins a large block) or a new io::allocate() one,
//   so allocation failures and the fault-injection seam are unchanged.
// - give(buffer) takes it back, keeping at most `max_idle` buffers (the rest are freed).
// - Contents of a lent buffer are unspecified.
//
// Thread safety: every method may be called from many threads at once (compression tasks
// return their input buffers from the writer's pool threads).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "file_io.h"

namespace mmt::detail {

struct RecycledBuffer {
  io::Buffer bytes;
  int64_t capacity_bytes = 0;
  std::byte* get() const { return bytes.get(); }
};

class BufferRecycler {
 public:
  explicit BufferRecycler(size_t max_idle) : max_idle_(max_idle) { idle_.reserve(max_idle); }

  // Throws IoError (ENOMEM) naming `what` when a new buffer cannot be had.
  RecycledBuffer take(int64_t nbytes, const char* what);
  void give(RecycledBuffer buffer) noexcept;
  void set_max_idle(size_t max_idle);
  size_t idle() const;

 private:
  mutable std::mutex mutex_;
  size_t max_idle_;
  std::vector<RecycledBuffer> idle_;
};

}  // namespace mmt::detail
