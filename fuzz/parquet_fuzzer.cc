// Fuzzes the Parquet reader (PackSources::from_arrow on a .parquet file), the packer's way:
// every value of every record is read. Any bytes must give records or an mmt::Error, never a
// crash, a hang or an out-of-bounds read.
//
// Inputs whose footer states more than 2^22 values in a column chunk are passed over: RLE
// levels and dictionaries are legitimately small encodings of huge columns (a run of 2^31
// nulls is 6 bytes), whose decoding would only measure the fuzzer's memory limit.
#include "pack_sources_fuzz.h"
#include "parquet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A column chunk decodes to at most 1024 times its pages' stated size, and at least this:
  // within the fuzzer's cap on one allocation.
  mmt::detail::set_parquet_decode_floor(int64_t{256} << 20);
  try {
    const mmt::detail::ParquetMetadata meta = mmt::detail::read_parquet_metadata(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "input.parquet");
    for (const mmt::detail::ParquetRowGroup& group : meta.row_groups)
      for (const mmt::detail::ParquetColumnChunk& chunk : group.columns)
        if (chunk.num_values > (int64_t{1} << 22)) return 0;
  } catch (const mmt::Error&) {
  }
  const std::string path = mmt::fuzz::scratch_folder() + "/input.parquet";
  if (!mmt::fuzz::write_whole(path, data, size)) return 0;
  try {
    mmt::fuzz::read_every_record(mmt::PackSources::from_arrow(std::vector<std::string>{path}));
  } catch (const mmt::Error&) {
  }
  return 0;
}
