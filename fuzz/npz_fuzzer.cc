// Fuzzes the .npz (ZIP) reader, members and all: any bytes must give arrays or an
// mmt::Error, never a crash, a hang, an out-of-bounds read or a runaway allocation. Both
// ways in: parse_npz over the bytes in memory, and the packer's way, the archive mapped from
// a file and each deflated member inflated front to back in pieces (then once more from its
// start, as a read behind the last one does).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mmtensor/numpy_io.h"
#include "npy_format.h"

namespace {

void read_as_the_packer_does(std::span<const std::byte> bytes) {
  static const int fd = ::memfd_create("fuzz.npz", 0);  // a file without a disk
  if (fd < 0 || ::ftruncate(fd, 0) != 0) return;
  if (::pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) return;
  for (mmt::detail::NpyValues& v : mmt::detail::map_npz_values("/proc/self/fd/" + std::to_string(fd))) {
    if (!v.deflated) continue;
    std::vector<std::byte> piece(4096);
    const int64_t n = v.header.data_nbytes;
    for (int64_t at = 0; at < n; at += static_cast<int64_t>(piece.size()))
      v.deflated->read(v.data_offset + at, piece.data(), std::min<int64_t>(static_cast<int64_t>(piece.size()), n - at));
    if (n > 0) v.deflated->read(v.data_offset, piece.data(), 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    for (const mmt::NpzMember& m : mmt::parse_npz(bytes, "fuzz.npz")) (void)m.array.contiguous();
  } catch (const mmt::Error&) {
  }
  try {
    read_as_the_packer_does(bytes);
  } catch (const mmt::Error&) {
  }
  return 0;
}
