// What the packer's input fuzzers share: their inputs written as files (the readers take
// paths), and every value of every record read, as packing reads them.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "mmtensor/packer.h"

namespace mmt::fuzz {

// A folder of the fuzzer's own under $TMPDIR (or /tmp), made once (the fuzzers write their
// inputs there), and removed when the fuzzer exits: every run made one, and CI's fuzz stage
// left a folder a fuzzer behind. A crash keeps it, with the input that crashed.
inline const std::string& scratch_folder() {
  // Never destroyed: the exit handler runs after the destructors of statics made before it.
  static const std::string* const folder = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* made = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/mmt-fuzz-XXXXXX");
    if (::mkdtemp(made->data()) == nullptr) {  // $TMPDIR missing: /tmp, as before
      *made = "/tmp/mmt-fuzz-XXXXXX";
      if (::mkdtemp(made->data()) == nullptr) std::abort();  // nowhere to write inputs: nothing to fuzz
    }
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(*folder, ignored);
    });
    return made;
  }();
  return *folder;
}

inline bool write_whole(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = size == 0 || std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && written;
}

// Reads every byte of every value of every record, and where each comes from; then the same
// records in batches, as pack_dataset() reads them (jagged_record_batch).
inline void read_every_record(const PackSources& sources) {
  std::vector<Tensor> values, offsets;
  uint64_t sum = 0;
  const auto add = [&](const Tensor& value) {
    if (!value.defined()) return;
    const Tensor bytes = value.contiguous();
    const auto* p = static_cast<const uint8_t*>(bytes.data_ptr());
    for (int64_t i = 0; i < bytes.nbytes(); ++i) sum += p[i];
  };
  for (int64_t r = 0; r < sources.records(); ++r) {
    sources.record(r, values);
    for (const Tensor& value : values) add(value);
    (void)sources.record_origin(0, r);
  }
  for (int64_t r = 0; r < sources.records();) {
    // At most the records left: past them is an IndexError, which left every batch path of
    // an input of fewer than 1,024 records unread.
    const int64_t given = sources.jagged_record_batch(r, std::min<int64_t>(1024, sources.records() - r), values, offsets);
    if (given <= 0) {
      r += given == 0 ? 1 : -given;
      continue;
    }
    for (const Tensor& value : values) add(value);
    for (const Tensor& offset : offsets) add(offset);
    r += given;
  }
  if (sum == 1) ::write(2, "", 0);  // keeps the reads
}

}  // namespace mmt::fuzz
