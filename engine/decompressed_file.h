// A gzip- or zstd-compressed input file decompressed into a ScratchFile (it may be larger
// than memory) and mapped: what the packer reads compressed tar archives and compressed MDS
// shards through. gzip: concatenated members too. zstd: concatenated and skippable frames,
// and any window the format allows (the output goes to a file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "mmtensor/storage.h"

namespace mmt::detail {

enum class FileCompression : uint8_t { Gzip, Zstd };

// The compressor whose magic `head` (a file's first bytes) begins with: "gzip", "zstd" (a
// frame, or pzstd's skippable frame before one), "bzip2", "xz"; nullptr for none of them.
const char* compressor_of(const std::byte* head, size_t n);

// `check_head` (optional) sees the first `head_bytes` decompressed bytes as soon as they are
// out (fewer when the file decompresses to fewer), and throws to refuse the file before the
// rest fills the temporary folder. FormatError naming `path` for a corrupt or cut-short
// stream; IoError for the scratch file (ScratchFile says). The mapping is named
// "PATH (decompressed into a temporary file in FOLDER)".
UntypedStorage decompressed_file(const std::string& path, FileCompression compression, int64_t head_bytes = 0,
                                 const std::function<void(const std::byte*, int64_t)>& check_head = {});

}  // namespace mmt::detail
