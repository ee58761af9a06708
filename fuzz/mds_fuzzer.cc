// Fuzzes the MDS shard reader (PackSources::from_mds), the packer's way: the input is a shard
// file beside a fixed index.json that claims as many samples as the shard's first uint32 says,
// and every value of every record is read. Each input is read under two indexes: four columns
// (a fixed array, an int, a str, an ndarray of no fixed dtype or shape), and two of fixed size
// (a fixed array and an int), whose samples are read a run of a shard at a time. Any bytes
// must give records or an mmt::Error, never a crash, a hang, an out-of-bounds read or a
// runaway allocation.
#include <cstring>

#include "pack_sources_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& folder = mmt::fuzz::scratch_folder();
  uint32_t samples = 0;
  if (size >= 4) std::memcpy(&samples, data, 4);
  if (samples > 1'000'000) samples %= 1'000'000;  // the index's claim; the reader checks it against the shard
  if (!mmt::fuzz::write_whole(folder + "/shard.00000.mds", data, size)) return 0;
  for (const char* columns :
       {R"("column_names": ["image", "label", "text", "tokens"], "column_encodings": ["ndarray:uint8:2,3", "int", )"
        R"("str", "ndarray"], "column_sizes": [6, 8, null, null])",
        R"("column_names": ["image", "label"], "column_encodings": ["ndarray:uint8:2,3", "int"], )"
        R"("column_sizes": [6, 8])"}) {
    const std::string index = R"({"version": 2, "shards": [{"format": "mds", "version": 2, "samples": )" +
                              std::to_string(samples) + ", " + columns +
                              R"(, "compression": null, "raw_data": {"basename": "shard.00000.mds"}, "zip_data": null}]})";
    if (!mmt::fuzz::write_whole(folder + "/index.json", index.data(), index.size())) return 0;
    try {
      mmt::fuzz::read_every_record(mmt::PackSources::from_mds(std::vector<std::string>{folder}));
    } catch (const mmt::Error&) {
    }
  }
  return 0;
}
