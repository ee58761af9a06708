// Fuzzes the MDS shard reader (PackSources::from_mds), the packer's way: the input is a shard
// file beside a fixed index.json of four columns (a fixed array, an int, a str, an ndarray of
// no fixed dtype or shape) that claims as many samples as the shard's first uint32 says, and
// every value of every record is read. Any bytes must give records or an mmt::Error, never a
// crash, a hang, an out-of-bounds read or a runaway allocation.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mmtensor/packer.h"

namespace {

bool write_whole(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = size == 0 || std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && written;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string folder = [] {
    char name[] = "/tmp/mmt-mds-fuzz-XXXXXX";
    const char* made = ::mkdtemp(name);
    return std::string(made != nullptr ? made : "/tmp");
  }();
  uint32_t samples = 0;
  if (size >= 4) std::memcpy(&samples, data, 4);
  if (samples > 1'000'000) samples %= 1'000'000;  // the index's claim; the reader checks it against the shard
  const std::string index =
      R"({"version": 2, "shards": [{"format": "mds", "version": 2, "samples": )" + std::to_string(samples) +
      R"(, "column_names": ["image", "label", "text", "tokens"], "column_encodings": ["ndarray:uint8:2,3", "int", )"
      R"("str", "ndarray"], "column_sizes": [6, 8, null, null], "compression": null, "raw_data": {"basename": )"
      R"("shard.00000.mds"}, "zip_data": null}]})";
  if (!write_whole(folder + "/index.json", index.data(), index.size()) ||
      !write_whole(folder + "/shard.00000.mds", data, size))
    return 0;
  try {
    const mmt::PackSources sources = mmt::PackSources::from_mds(std::vector<std::string>{folder});
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
