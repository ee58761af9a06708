// A gzip-, zlib- or zstd-compressed input file decompressed into a ScratchFile (it may be
// larger than memory) and mapped: what the packer reads compressed tar archives, compressed
// MDS shards and compressed TFRecord files through. gzip: concatenated members too. zlib: one
// stream (TensorFlow's ZLIB files). zstd: concatenated and skippable frames, and any window
// the format allows (the output goes to a file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <condition_variable>
#include <mutex>
#include <vector>
#include <string>

#include "mmtensor/storage.h"

namespace mmt::detail {

enum class FileCompression : uint8_t { Gzip, Zlib, Zstd };

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
// The same for `compressed`, the mapping of the file `path` names.
UntypedStorage decompressed_file(const std::string& path, const UntypedStorage& compressed, FileCompression compression,
                                 int64_t head_bytes = 0,
                                 const std::function<void(const std::byte*, int64_t)>& check_head = {});

// Decompressed copies of compressed inputs (tar archives, MDS shards), kept in the scratch
// folder within a byte budget. A copy past the budget is dropped once the sources have read it
// and made again when its records are packed, from the compressed file as it was mapped when
// added, and checked against the first copy (its size and XXH3), so $TMPDIR needs room for the
// budget (and the copies in use), not for every input; inputs that fit are decompressed once.
// Thread-safe: a decompression runs outside the lock (threads wanting other files go on;
// those wanting the same one wait for it).
class DecompressedFiles {
 public:
  // A budget of -1: scratch_budget(), worked out when the first file is added.
  explicit DecompressedFiles(int64_t budget_bytes = -1) : budget_(budget_bytes) {}

  // Adds `bytes`, the decompression of `path` just made; hashed now, and kept while the copies
  // kept fit the budget. Returns its index.
  size_t add(const std::string& path, FileCompression compression, UntypedStorage bytes);
  // File `index`'s decompressed bytes: the kept copy, or a new decompression, which is kept
  // while the least recently used others are dropped past the budget. IoError (or the
  // decompressor's FormatError) when the file no longer decompresses to what it did.
  UntypedStorage get(size_t index) const;
  // How many decompressions get() made (the inputs' second ones).
  int64_t decompressed_again() const;

  // The budget when none is given: MMT_SCRATCH_BYTES (a number of bytes, with an optional
  // suffix K, M, G or T) when set, else half the free space of the scratch folder ($TMPDIR,
  // or /tmp). ValueError for a value of another form.
  static int64_t scratch_budget();

 private:
  struct Entry {
    std::string path;
    FileCompression compression;
    UntypedStorage compressed;  // the input as mapped when added (a rename or chdir since changes nothing)
    int64_t size = 0;
    uint64_t hash = 0;
    UntypedStorage kept;  // empty when dropped
    uint64_t last_use = 0;
    bool in_flight = false;  // being decompressed again, outside the lock
  };
  void drop_past_budget(size_t keep) const;  // with mutex_ held

  mutable std::mutex mutex_;
  mutable std::condition_variable done_;  // an in-flight decompression ended
  mutable std::vector<Entry> entries_;
  int64_t budget_;
  mutable int64_t kept_bytes_ = 0;
  mutable uint64_t clock_ = 0;
  mutable int64_t again_ = 0;
};

}  // namespace mmt::detail
