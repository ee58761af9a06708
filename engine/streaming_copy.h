// Copies that bypass the CPU caches (non-temporal stores), for large values a gather writes
// and the CPU does not read again soon: a batch bound for the GPU, whose bytes the DMA engine
// reads from memory. An ordinary store first reads the destination line into the cache (a
// read for ownership) and later writes it back; a non-temporal store only writes. On a
// memory-bound gather with the device's copy reading at the same time, that is a quarter of
// the memory traffic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mmt::detail {

// Values of at least this many bytes are gathered with streaming_copy (the default:
// kDefaultStreamingCopyMinBytes). Process-wide; for benchmarks that compare the two ways.
int64_t streaming_copy_min_bytes() noexcept;
void set_streaming_copy_min_bytes(int64_t nbytes) noexcept;

// memcpy's contract, with non-temporal stores for the destination's whole 16-byte blocks
// (memcpy on other processors than x86-64).
void streaming_copy(void* dst, const void* src, size_t nbytes) noexcept;

// Orders the streaming copies this thread made before its later stores: non-temporal stores
// are weakly ordered, and a mutex's release does not wait for them. Call it before the
// copied bytes are handed to another thread or a device.
void streaming_copy_fence() noexcept;

}  // namespace mmt::detail
