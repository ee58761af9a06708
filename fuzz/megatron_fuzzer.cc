// Fuzzes the Megatron index reader and the documents above it (PackSources::from_megatron),
// the packer's way: the pair written to files, the index mapped and checked, every document
// read. Input: a little-endian uint32 N, then N bytes of PREFIX.idx, then PREFIX.bin. Any
// bytes must give records or an mmt::Error, never a crash, a hang, an out-of-bounds read or
// a runaway allocation.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mmtensor/packer.h"

namespace {

bool write_whole(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = size == 0 || std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && written;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = [] {
    char folder[] = "/tmp/mmt-megatron-fuzz-XXXXXX";
    const char* made = ::mkdtemp(folder);
    return std::string(made != nullptr ? made : "/tmp") + "/corpus_text_document";
  }();
  if (size < 4) return 0;
  uint32_t index_bytes = 0;
  std::memcpy(&index_bytes, data, 4);
  const size_t index_size = std::min<size_t>(index_bytes, size - 4);
  if (!write_whole(prefix + ".idx", data + 4, index_size) ||
      !write_whole(prefix + ".bin", data + 4 + index_size, size - 4 - index_size))
    return 0;
  try {
    const mmt::PackSources sources = mmt::PackSources::from_megatron(std::vector<std::string>{prefix});
    std::vector<mmt::Tensor> values;
    uint64_t sum = 0;
    for (int64_t r = 0; r < sources.records(); ++r) {
      sources.record(r, values);
      const mmt::Tensor bytes = values[0].contiguous();
      const auto* p = static_cast<const uint8_t*>(bytes.data_ptr());
      for (int64_t i = 0; i < bytes.nbytes(); ++i) sum += p[i];
      (void)sources.record_origin(0, r);
    }
    if (sum == 1) ::write(2, "", 0);  // keeps the reads
  } catch (const mmt::Error&) {
  }
  return 0;
}
