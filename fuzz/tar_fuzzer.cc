// Fuzzes the tar reader and the WebDataset grouping above it (PackSources::from_tars), the
// packer's way: the archive mapped from a file, samples grouped, every value of every record
// read. Any bytes must give records or an mmt::Error, never a crash, a hang, an
// out-of-bounds read or a runaway allocation.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mmtensor/packer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz.tar", 0);  // a file without a disk
  if (fd < 0 || ::ftruncate(fd, 0) != 0) return 0;
  if (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  try {
    const mmt::PackSources sources =
        mmt::PackSources::from_tars({"/proc/self/fd/" + std::to_string(fd)}, {.keys = true});
    std::vector<mmt::Tensor> values;
    uint64_t sum = 0;
    for (int64_t r = 0; r < sources.records(); ++r) {
      sources.record(r, values);
      for (const mmt::Tensor& value : values) {
        const mmt::Tensor bytes = value.contiguous();
        const auto* p = static_cast<const uint8_t*>(bytes.data_ptr());
        for (int64_t i = 0; i < bytes.nbytes(); ++i) sum += p[i];
      }
      (void)sources.record_origin(0, r);
    }
    if (sum == 1) ::write(2, "", 0);  // keeps the reads
  } catch (const mmt::Error&) {
  }
  return 0;
}
