// The narrow I/O seam of the dataset writer. Every write, fsync, rename, remove and folder
// fsync the writer performs, and every chunk buffer it allocates, goes through this file, so
// a test can put a fault in any step (FaultInjector) and check what a failure leaves behind.
//
// Errors are IoError naming the step and the path ("fsync of /data/x.mmt.tmp-12-ab: Input/
// output error"), with the errno value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mmt::io {

// The steps a fault can be put in.
enum class Step : uint8_t { Open, Write, Fsync, Rename, Remove, DirFsync, Allocate };
const char* step_name(Step step);

// A file created for writing (never an existing one: O_EXCL), written sequentially.
class WritableFile {
 public:
  WritableFile() = default;
  // Creates `path`; throws IoError if it exists or the folder refuses it.
  static WritableFile create(const std::string& path);
  WritableFile(WritableFile&& other) noexcept;
  WritableFile& operator=(WritableFile&& other) noexcept;
  ~WritableFile();  // closes without syncing

  // Writes all n bytes (retrying short writes and EINTR); throws IoError otherwise.
  void write(const void* data, int64_t nbytes);
  // Writes all n bytes at byte `offset` (pwrite: offset() is not moved), for a file written
  // out of order; throws IoError as write() does.
  void write_at(int64_t offset, const void* data, int64_t nbytes);
  // Reserves the file's first `nbytes` on the disk (fallocate, which also makes the file that
  // long), so that a full disk fails here rather than in the middle of the writes; a file
  // system without fallocate just writes as it goes. Throws IoError otherwise.
  void reserve(int64_t nbytes);
  // Writes zero bytes until offset() is a multiple of `alignment`.
  void pad_to(int64_t alignment);
  void fsync();
  // Asks the kernel to start writing [offset, offset + nbytes) to the disk now, without
  // waiting (sync_file_range WRITE): the disk then works while the writer keeps producing,
  // and the final fsync() waits for the tail only. A hint: its failures are not reported
  // here (fsync() reports any write error).
  void start_writeback(int64_t offset, int64_t nbytes);
  void close();
  int64_t offset() const { return offset_bytes_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  int64_t offset_bytes_ = 0;
  std::string path_;
};

// Throws IoError unless `path` may become a new file: absent, or a regular file and
// `replace`. rename() would put a regular file in the place of a device, a pipe, a folder or
// a symbolic link, which is never what asking to overwrite an output means, so those are
// refused even with `replace`. `how_to_replace` ends the message for an existing file
// ("pass --force to replace it"). Throws IoError when the path cannot be examined,
// ValueError for a path that ends in '/'.
void check_output_target(const std::string& path, bool replace, const std::string& how_to_replace);
// rename(2); with replace=false the target must not exist (RENAME_NOREPLACE), so a file that
// appeared at the target after the writer checked is never clobbered.
void rename_file(const std::string& from, const std::string& to, bool replace);
// unlink(2); a missing file is not an error. Throws IoError otherwise.
void remove_file(const std::string& path);
// fsync of the folder holding `path`, which makes a rename in it durable.
void fsync_parent_dir(const std::string& path);
// The folder part of `path` ("." when it has none).
std::string parent_dir(const std::string& path);

// Test-only crash points: when the environment variable MMT_CRASH_AT equals `point`, the
// process kills itself with SIGKILL right there, as a power cut or an OOM kill would. The
// writer names "after-write" (all bytes written, not fsynced), "after-fsync" (fsynced, not
// renamed) and "after-rename" (renamed, folder not fsynced); tests/reliability_kill_test.cc
// checks what each leaves at the target path.
void crash_point(const char* point);

// A 64-byte-aligned heap buffer; allocation goes through the seam so it can be failed.
struct FreeDeleter {
  void operator()(std::byte* p) const noexcept;
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;
// Throws IoError (ENOMEM) naming `what` when the memory cannot be had.
Buffer allocate(int64_t nbytes, const char* what);

// Test-only fault injection. Each armed step counts its calls from 1; the Nth call (and,
// with `forever`, every later one) fails with `errno_value`. A failed Write with ENOSPC
// first writes half of its bytes, as a filling disk does. Process-wide and thread-safe;
// disarm() (or a ScopedFault going out of scope) restores normal behaviour.
struct Fault {
  Step step = Step::Write;
  int64_t nth = 1;
  bool forever = false;
  int errno_value = 5;  // EIO
};
class FaultInjector {
 public:
  static void arm(const Fault& fault);
  static void disarm();
  // How many calls of `step` were made since the last arm(); for tests that count steps.
  static int64_t calls(Step step);
};
class ScopedFault {
 public:
  explicit ScopedFault(const Fault& fault) { FaultInjector::arm(fault); }
  ~ScopedFault() { FaultInjector::disarm(); }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
};

}  // namespace mmt::io
