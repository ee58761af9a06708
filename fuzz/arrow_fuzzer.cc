// Fuzzes the Arrow IPC reader (PackSources::from_arrow), the packer's way: the input is an
// Arrow stream or file (.arrow), and every value of every record is read. Any bytes must give
// records or an mmt::Error, never a crash, a hang, an out-of-bounds read or a runaway
// allocation.
#include <cstdlib>

#include "decode_limit.h"
#include "pack_sources_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Compressed batches decompress to at most 1024 times the file, or the scratch budget, and
  // at least this: within the fuzzer's memory (the scratch file may lie on a tmpfs).
  mmt::detail::set_decode_floor(int64_t{256} << 20);
  ::setenv("MMT_SCRATCH_BYTES", "256M", 1);
  const std::string path = mmt::fuzz::scratch_folder() + "/input.arrow";
  if (!mmt::fuzz::write_whole(path, data, size)) return 0;
  try {
    mmt::fuzz::read_every_record(mmt::PackSources::from_arrow(std::vector<std::string>{path}));
  } catch (const mmt::Error&) {
  }
  return 0;
}
