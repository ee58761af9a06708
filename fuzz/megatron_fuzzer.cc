// Fuzzes the Megatron index reader and the documents above it (PackSources::from_megatron),
// the packer's way: the pair written to files, the index mapped and checked, every document
// read. Input: a little-endian uint32 N, then N bytes of PREFIX.idx, then PREFIX.bin. Any
// bytes must give records or an mmt::Error, never a crash, a hang, an out-of-bounds read or
// a runaway allocation.
#include <algorithm>
#include <cstring>

#include "pack_sources_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = mmt::fuzz::scratch_folder() + "/corpus_text_document";
  if (size < 4) return 0;
  uint32_t index_bytes = 0;
  std::memcpy(&index_bytes, data, 4);
  const size_t index_size = std::min<size_t>(index_bytes, size - 4);
  if (!mmt::fuzz::write_whole(prefix + ".idx", data + 4, index_size) ||
      !mmt::fuzz::write_whole(prefix + ".bin", data + 4 + index_size, size - 4 - index_size))
    return 0;
  try {
    mmt::fuzz::read_every_record(mmt::PackSources::from_megatron(std::vector<std::string>{prefix}));
  } catch (const mmt::Error&) {
  }
  return 0;
}
