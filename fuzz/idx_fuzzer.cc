// Fuzzes the IDX reader, plain and gzip: any bytes must give a tensor or an mmt::Error, never
// a crash, a hang, an out-of-bounds read or a runaway allocation.
#include <cstddef>
#include <cstdint>
#include <span>

#include "mmtensor/idx_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    (void)mmt::parse_idx(bytes, "fuzz.idx");
  } catch (const mmt::Error&) {
  }
  return 0;
}
