// Fuzzes the TFRecord reader and the tf.train.Example (and SequenceExample) parser above it
// (PackSources::from_tfrecord), the packer's way: a file written, scanned, every record read.
// Input: records' data separated by "|REC|", each framed here with its true CRCs (so the
// fuzzer reaches the Example parser past the checksums); or, when the input begins with '!',
// the rest written as the file itself (the framing fuzzed). Any bytes must give records or an
// mmt::Error, never a crash, a hang, an out-of-bounds read or a runaway allocation.
#include <cstring>
#include <string_view>

#include "crc32c.h"
#include "pack_sources_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mmt::fuzz::scratch_folder() + "/input.tfrecord";
  std::string file;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (!input.empty() && input.front() == '!') {
    file = input.substr(1);
  } else {
    constexpr std::string_view kSeparator = "|REC|";
    for (size_t at = 0; at <= input.size();) {
      size_t end = input.find(kSeparator, at);
      if (end == std::string_view::npos) end = input.size();
      const std::string_view record = input.substr(at, end - at);
      const uint64_t length = record.size();
      const uint32_t length_crc = mmt::detail::masked_crc32c(mmt::detail::crc32c(&length, 8));
      const uint32_t data_crc = mmt::detail::masked_crc32c(mmt::detail::crc32c(record.data(), record.size()));
      file.append(reinterpret_cast<const char*>(&length), 8);
      file.append(reinterpret_cast<const char*>(&length_crc), 4);
      file.append(record);
      file.append(reinterpret_cast<const char*>(&data_crc), 4);
      at = end + kSeparator.size();
    }
  }
  if (!mmt::fuzz::write_whole(path, file.data(), file.size())) return 0;
  try {
    mmt::fuzz::read_every_record(mmt::PackSources::from_tfrecord(std::vector<std::string>{path}));
  } catch (const mmt::Error&) {
  }
  return 0;
}
