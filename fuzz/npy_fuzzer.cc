// Fuzzes the .npy reader: any bytes must give a tensor or an mmt::Error, never a crash, a
// hang or a read outside the input.
#include <cstddef>
#include <cstdint>
#include <span>

#include "mmtensor/numpy_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    mmt::Tensor t = mmt::parse_npy(bytes, "fuzz.npy");
    // Touch every element through the layout the header declared.
    (void)t.contiguous();
  } catch (const mmt::Error&) {
  }
  return 0;
}
