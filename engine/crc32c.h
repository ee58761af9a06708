// CRC-32C (Castagnoli), the checksum TFRecord files frame each record with (tfrecord.h).
// The CPU's crc32 instruction where it has one (SSE 4.2), else Boost.CRC's table: the same
// values, several GB/s against a few hundred MB/s.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mmt::detail {

// The CRC-32C of [data, data + n), continuing from `crc` (a previous call's result; 0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The same with Boost.CRC only (the reference the tests hold the fast path to).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

// TFRecord's "masked" CRC (TensorFlow's crc32c::Mask): rotated and offset, because a CRC of
// bytes that themselves hold CRCs is weak.
inline uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace mmt::detail
