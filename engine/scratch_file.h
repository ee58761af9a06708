// An unnamed file in $TMPDIR (or /tmp) for data the packer makes that may be larger than
// memory: a Fortran-order array converted to record order, a compressed tar archive
// decompressed. Written front to back (or sized first, then filled by several threads at
// once), then mapped read-only. O_TMPFILE (or a name unlinked
// at once where a filesystem lacks it): nothing is left on disk after the pack, or a crash.
// On a tmpfs (/tmp on some systems) the file is in memory after all: set TMPDIR to a folder
// on a disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "mmtensor/storage.h"

namespace mmt::detail {

class ScratchFile {
 public:
  // `what` names the input and `purpose` the use, for messages: IoError "WHAT: cannot create
  // a temporary file in FOLDER PURPOSE: REASON; set TMPDIR to a folder on a disk with room"
  // (PURPOSE such as "to convert this Fortran-order array in (N bytes)"), and the same for
  // each later step. A missing TMPDIR folder is named as such.
  ScratchFile(std::string what, std::string purpose);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Reserves `nbytes` on the disk (fallocate), so that a full disk fails now rather than
  // after most of the work; a filesystem without fallocate writes as it goes.
  void reserve(int64_t nbytes);
  // Appends [data, data + n).
  void append(const std::byte* data, int64_t n);
  // The file becomes `nbytes` long; bytes never written read as zeros. Then write_at() fills it.
  void resize(int64_t nbytes);
  // Writes [data, data + n) at `offset`, inside the size resize() gave. Threads may write
  // ranges that do not overlap at once.
  void write_at(int64_t offset, const std::byte* data, int64_t n) const;
  int64_t size() const { return size_; }
  const std::filesystem::path& folder() const { return folder_; }
  // The file's bytes, mapped read-only under the name `name` (the file has none: a storage
  // with a filename is read under the mapping guard, so a disk error reading the pages back
  // is an IoError naming it, not SIGBUS). An empty storage for an empty file. The mapping
  // outlives the ScratchFile, which closes its descriptor when destroyed.
  UntypedStorage map(std::string name);

 private:
  [[noreturn]] void fail(const char* step, int err) const;
  void write_bytes(int64_t offset, const std::byte* data, int64_t n) const;  // pwrite until done

  std::string what_, purpose_;
  std::filesystem::path folder_;
  int fd_ = -1;
  int64_t size_ = 0;
};

}  // namespace mmt::detail
