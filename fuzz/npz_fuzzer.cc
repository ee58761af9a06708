// Fuzzes the .npz (ZIP) reader, members and all: any bytes must give arrays or an
// mmt::Error, never a crash, a hang, an out-of-bounds read or a runaway allocation.
#include <cstddef>
#include <cstdint>
#include <span>

#include "mmtensor/numpy_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    for (const mmt::NpzMember& m : mmt::parse_npz(bytes, "fuzz.npz")) (void)m.array.contiguous();
  } catch (const mmt::Error&) {
  }
  return 0;
}
