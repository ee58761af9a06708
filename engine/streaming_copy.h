// Copies that bypass the CPU caches (non-temporal stores), for large values a gather writes
// and the CPU does not read again soon: a batch bound for the GPU, whose bytes the DMA engine
// reads from memory, or a batch too large to stay in the last-level cache anyway. An ordinary
// store first reads the destination line into the cache (a read for ownership) and later
// writes it back; a non-temporal store only writes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mmt::detail {

// Which values get_batch copies with streaming_copy. Auto, the default: values of at least
// kStreamingMinValueBytes, when the gather is bound for a device or the bytes written before
// the CPU reads them (the whole batch, every field; for the loader, its ring) fill at least
// streaming_min_batch_bytes() (GatherDestination). Never and Always are for benchmarks that
// compare the two ways. Process-wide.
enum class StreamingStores { Auto, Never, Always };
StreamingStores streaming_stores() noexcept;
void set_streaming_stores(StreamingStores mode) noexcept;

// Sets the mode while it lives (benchmarks and tests).
class ScopedStreamingStores {
 public:
  explicit ScopedStreamingStores(StreamingStores mode) noexcept : previous_(streaming_stores()) {
    set_streaming_stores(mode);
  }
  ~ScopedStreamingStores() { set_streaming_stores(previous_); }
  ScopedStreamingStores(const ScopedStreamingStores&) = delete;
  ScopedStreamingStores& operator=(const ScopedStreamingStores&) = delete;

 private:
  StreamingStores previous_;
};

// Smaller values lose: a line a record fills only in part costs a read-modify-write in
// memory (784-byte records gathered 1.5-1.6x slower with streaming stores; bench/RESULTS.md,
// "Streaming stores").
constexpr int64_t kStreamingMinValueBytes = 16 << 10;
// The size of the L3 cache a core shares (sysfs), at least 32 MB: a batch smaller than that
// may still be in the cache when its consumer reads it, and memcpy then wins.
int64_t streaming_min_batch_bytes() noexcept;

// Whether values of `value_bytes` are copied with streaming_copy by a gather that writes
// `gather_bytes` in all (every field's rows).
bool use_streaming_copy(int64_t value_bytes, int64_t gather_bytes) noexcept;

// Describes, while it lives, where the calling thread's gathers go. `device_bound`: their
// bytes are read next by a copy engine, not by this processor (the loader's pinned ring for
// cuda:N). `bytes_in_flight`: how many bytes may be written before the CPU reads these, when
// a gather is one piece of more (the loader gathers a batch in pieces, and several batches
// ahead of its consumer: its whole ring); the larger of it and the gather's own bytes counts.
class GatherDestination {
 public:
  GatherDestination(bool device_bound, int64_t bytes_in_flight) noexcept;
  ~GatherDestination();
  GatherDestination(const GatherDestination&) = delete;
  GatherDestination& operator=(const GatherDestination&) = delete;

 private:
  bool previous_device_bound_;
  int64_t previous_bytes_in_flight_;
};

// memcpy's contract, with non-temporal stores for the destination's whole 64-byte lines
// (memcpy for the rest, and on other processors than x86-64).
void streaming_copy(void* dst, const void* src, size_t nbytes) noexcept;

// Orders the streaming copies this thread made before its later stores: non-temporal stores
// are weakly ordered, and a mutex's release does not wait for them. Call it before the
// copied bytes are handed to another thread or a device.
void streaming_copy_fence() noexcept;

}  // namespace mmt::detail
