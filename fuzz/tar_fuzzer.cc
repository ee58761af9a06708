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

#include "pack_sources_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz.tar", 0);  // a file without a disk
  if (fd < 0 || ::ftruncate(fd, 0) != 0) return 0;
  if (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  try {
    mmt::fuzz::read_every_record(
        mmt::PackSources::from_tars({"/proc/self/fd/" + std::to_string(fd)}, {.keys = true}));
  } catch (const mmt::Error&) {
  }
  return 0;
}
