#include "file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "mmtensor/error.h"

namespace mmt::io {
namespace {

constexpr int kNumSteps = 7;

// The armed fault. Reads on the hot path are one relaxed load of `armed`.
struct FaultState {
  std::atomic<bool> armed{false};
  std::mutex mutex;
  Fault fault;
  std::array<int64_t, kNumSteps> calls{};
};
FaultState& fault_state() {
  static FaultState state;
  return state;
}

// Returns the errno to fail this call of `step` with, or 0 to let it run.
int injected_errno(Step step) {
  FaultState& state = fault_state();
  if (!state.armed.load(std::memory_order_acquire)) return 0;
  std::lock_guard lock(state.mutex);
  int64_t call = ++state.calls[static_cast<int>(step)];
  if (state.fault.step != step) return 0;
  bool fail = state.fault.forever ? call >= state.fault.nth : call == state.fault.nth;
  return fail ? state.fault.errno_value : 0;
}

std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] void throw_io(Step step, const std::string& path, int err, const std::string& extra = "") {
  throw IoError(detail::str(step_name(step), " of ", path, extra, ": ", errno_text(err)), err);
}

}  // namespace

const char* step_name(Step step) {
  switch (step) {
    case Step::Open: return "create";
    case Step::Write: return "write";
    case Step::Fsync: return "fsync";
    case Step::Rename: return "rename";
    case Step::Remove: return "remove";
    case Step::DirFsync: return "folder fsync";
    case Step::Allocate: return "allocation";
  }
  return "I/O";
}

WritableFile WritableFile::create(const std::string& path) {
  if (int err = injected_errno(Step::Open)) throw_io(Step::Open, path, err);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_io(Step::Open, path, errno);
  WritableFile file;
  file.fd_ = fd;
  file.path_ = path;
  return file;
}

WritableFile::WritableFile(WritableFile&& other) noexcept { *this = std::move(other); }

WritableFile& WritableFile::operator=(WritableFile&& other) noexcept {
  if (this == &other) return *this;
  if (fd_ >= 0) ::close(fd_);
  fd_ = other.fd_;
  offset_bytes_ = other.offset_bytes_;
  path_ = std::move(other.path_);
  other.fd_ = -1;
  other.offset_bytes_ = 0;
  return *this;
}

WritableFile::~WritableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void WritableFile::write(const void* data, int64_t nbytes) {
  MMT_CHECK(fd_ >= 0, IoError, "write of ", path_, ": the file is closed");
  const char* p = static_cast<const char*>(data);
  int64_t left = nbytes;
  if (int err = injected_errno(Step::Write)) {
    // A filling disk takes part of a write before refusing the rest.
    if (err == ENOSPC && left > 1) {
      ssize_t n = ::write(fd_, p, static_cast<size_t>(left / 2));
      if (n > 0) offset_bytes_ += n;
    }
    throw_io(Step::Write, path_, err, detail::str(" at byte offset ", offset_bytes_));
  }
  while (left > 0) {
    ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(left, int64_t{1} << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(Step::Write, path_, errno, detail::str(" at byte offset ", offset_bytes_));
    }
    if (n == 0) throw_io(Step::Write, path_, ENOSPC, detail::str(" at byte offset ", offset_bytes_));
    p += n;
    left -= n;
    offset_bytes_ += n;
  }
}

void WritableFile::write_at(int64_t offset, const void* data, int64_t nbytes) {
  MMT_CHECK(fd_ >= 0, IoError, "write of ", path_, ": the file is closed");
  if (int err = injected_errno(Step::Write)) throw_io(Step::Write, path_, err, detail::str(" at byte offset ", offset));
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(std::min<int64_t>(nbytes, int64_t{1} << 30)), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(Step::Write, path_, errno, detail::str(" at byte offset ", offset));
    }
    if (n == 0) throw_io(Step::Write, path_, ENOSPC, detail::str(" at byte offset ", offset));
    p += n;
    nbytes -= n;
    offset += n;
  }
}

void WritableFile::reserve(int64_t nbytes) {
  MMT_CHECK(fd_ >= 0, IoError, "fallocate of ", path_, ": the file is closed");
  if (nbytes <= 0) return;
  while (::fallocate(fd_, 0, 0, nbytes) != 0) {
    if (errno == EINTR) continue;  // a stop signal: the caller's next checkpoint answers it
    if (errno == EOPNOTSUPP || errno == ENOSYS) return;
    throw_io(Step::Write, path_, errno, detail::str(" (reserving its ", nbytes, " bytes)"));
  }
}

void WritableFile::pad_to(int64_t alignment) {
  static const std::byte zeros[4096] = {};
  int64_t pad = (alignment - offset_bytes_ % alignment) % alignment;
  while (pad > 0) {
    int64_t n = std::min<int64_t>(pad, sizeof(zeros));
    write(zeros, n);
    pad -= n;
  }
}

void WritableFile::fsync() {
  MMT_CHECK(fd_ >= 0, IoError, "fsync of ", path_, ": the file is closed");
  if (int err = injected_errno(Step::Fsync)) throw_io(Step::Fsync, path_, err);
  if (::fsync(fd_) != 0) throw_io(Step::Fsync, path_, errno);
}

void WritableFile::start_writeback(int64_t offset, int64_t nbytes) {
  if (fd_ < 0 || nbytes <= 0) return;
  (void)::sync_file_range(fd_, offset, nbytes, SYNC_FILE_RANGE_WRITE);
}

void WritableFile::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  // Data already reached the kernel and was fsynced by the writer; close's errors (NFS) are
  // still reported.
  if (::close(fd) != 0 && errno != EINTR) throw_io(Step::Fsync, path_, errno, " (close)");
}

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

void check_output_target(const std::string& path, bool replace, const std::string& how_to_replace) {
  MMT_CHECK(!path.empty(), ValueError, "the output path is empty");
  MMT_CHECK(path.back() != '/', ValueError, "the output path ", path, " ends in '/', as a folder's does; name a file");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    // Absent (or under a missing folder, which creating its temporary reports): free to write.
    if (err == ENOENT || err == ENOTDIR) return;
    throw IoError(detail::str("cannot check ", path, ": ", std::strerror(err)), err);
  }
  MMT_CHECK(S_ISREG(st.st_mode), IoError, path, " is ", kind_of(st.st_mode),
            "; only a regular file is replaced, even when asked to overwrite");
  // EEXIST, as open(O_EXCL) would say: callers (and Python's FileExistsError) tell it apart.
  if (!replace) throw IoError(detail::str(path, " already exists; ", how_to_replace), EEXIST);
}

void rename_file(const std::string& from, const std::string& to, bool replace) {
  if (int err = injected_errno(Step::Rename)) throw_io(Step::Rename, from, err, " to " + to);
  int rc = replace ? ::rename(from.c_str(), to.c_str())
                   : ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && !replace && (errno == EINVAL || errno == ENOSYS)) {
    // The filesystem lacks RENAME_NOREPLACE: link() refuses an existing target too.
    if (::link(from.c_str(), to.c_str()) == 0) {
      ::unlink(from.c_str());
      return;
    }
  }
  if (rc != 0 && !replace && errno == EEXIST)  // callers checked the target at their start
    throw_io(Step::Rename, from, EEXIST,
             " to " + to + " (it appeared while this file was written, made by another writer or program, and "
             "was left as it is)");
  if (rc != 0) throw_io(Step::Rename, from, errno, " to " + to);
}

void remove_file(const std::string& path) {
  if (int err = injected_errno(Step::Remove)) throw_io(Step::Remove, path, err);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_io(Step::Remove, path, errno);
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void fsync_parent_dir(const std::string& path) {
  std::string dir = parent_dir(path);
  if (int err = injected_errno(Step::DirFsync)) throw_io(Step::DirFsync, dir, err);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io(Step::DirFsync, dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems cannot fsync a folder (EINVAL); the rename is as durable as they allow.
  if (rc != 0 && err != EINVAL) throw_io(Step::DirFsync, dir, err);
}

void crash_point(const char* point) {
  const char* const crash_at = std::getenv("MMT_CRASH_AT");  // not a static (fork_safety.h)
  if (crash_at != nullptr && std::strcmp(crash_at, point) == 0) ::kill(::getpid(), SIGKILL);
}

void FreeDeleter::operator()(std::byte* p) const noexcept { std::free(p); }

Buffer allocate(int64_t nbytes, const char* what) {
  if (int err = injected_errno(Step::Allocate))
    throw IoError(detail::str("allocation of ", nbytes, " bytes for ", what, ": ", errno_text(err)), err);
  MMT_CHECK(nbytes >= 0, ValueError, "allocation of ", nbytes, " bytes for ", what);
  size_t rounded = (static_cast<size_t>(nbytes) + 63) & ~size_t{63};
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr)
    throw IoError(detail::str("allocation of ", nbytes, " bytes for ", what, ": ", errno_text(ENOMEM)), ENOMEM);
  return Buffer(static_cast<std::byte*>(p));
}

void FaultInjector::arm(const Fault& fault) {
  FaultState& state = fault_state();
  std::lock_guard lock(state.mutex);
  state.fault = fault;
  state.calls.fill(0);
  state.armed.store(true, std::memory_order_release);
}

void FaultInjector::disarm() {
  FaultState& state = fault_state();
  std::lock_guard lock(state.mutex);
  state.armed.store(false, std::memory_order_release);
}

int64_t FaultInjector::calls(Step step) {
  FaultState& state = fault_state();
  std::lock_guard lock(state.mutex);
  return state.calls[static_cast<int>(step)];
}

}  // namespace mmt::io
