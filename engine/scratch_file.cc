#include "scratch_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "load_cancel.h"
#include "mmtensor/error.h"

namespace mmt::detail {

ScratchFile::ScratchFile(std::string what, std::string purpose) : what_(std::move(what)), purpose_(std::move(purpose)) {
  // $TMPDIR, or /tmp when it is unset or empty (`TMPDIR= cmd` is a common way to unset it,
  // and Python's tempfile skips an empty one too).
  const char* tmpdir = std::getenv("TMPDIR");
  folder_ = tmpdir && *tmpdir ? tmpdir : "/tmp";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder_, ec))
    throw IoError(str(what_, ": no temporary folder ", purpose_, ": ", tmpdir && *tmpdir ? "TMPDIR is '" : "'",
                      folder_.string(), "': ", ec ? ec.message() : std::string("not a folder")),
                  ec ? ec.value() : ENOTDIR);
  fd_ = ::open(folder_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0 && errno != ENOENT && errno != ENOTDIR) {  // no O_TMPFILE there (or refused): a named one
    std::string name = (folder_ / "mmtensor-scratch-XXXXXX").string();
    fd_ = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd_ >= 0 && ::unlink(name.c_str()) != 0) {
      const int err = errno;
      ::close(fd_);  // the destructor of an object whose constructor throws does not run
      fd_ = -1;
      fail("unlink", err);
    }
  }
  if (fd_ < 0) fail("create", errno);
}

ScratchFile::~ScratchFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ScratchFile::fail(const char* step, int err) const {
  throw IoError(str(what_, ": cannot ", step, " a temporary file in ", folder_.string(), " ", purpose_, ": ",
                    std::strerror(err), "; set TMPDIR to a folder on a disk with room"),
                err);
}

void ScratchFile::reserve(int64_t nbytes) {
  if (nbytes > 0 && ::fallocate(fd_, 0, 0, nbytes) != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
    fail("reserve space for", errno);
}

void ScratchFile::append(const std::byte* data, int64_t n) {
  check_load_cancelled();  // the loads that take long write here, a step at a time
  write_bytes(size_, data, n);
  size_ += n;
}

void ScratchFile::resize(int64_t nbytes) {
  if (::ftruncate(fd_, nbytes) != 0) fail("size", errno);
  size_ = nbytes;
}

void ScratchFile::write_at(int64_t offset, const std::byte* data, int64_t n) const {
  assert(offset >= 0 && n >= 0 && offset <= size_ - n);
  write_bytes(offset, data, n);
}

void ScratchFile::write_bytes(int64_t offset, const std::byte* data, int64_t n) const {
  for (int64_t written = 0; written < n;) {
    const ssize_t w = ::pwrite(fd_, data + written, static_cast<size_t>(n - written), offset + written);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write", w < 0 ? errno : ENOSPC);
    written += w;
  }
}

UntypedStorage ScratchFile::map(std::string name) {
  if (size_ == 0) return UntypedStorage();
  void* mapped = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
  if (mapped == MAP_FAILED) fail("map", errno);
  const int64_t nbytes = size_;
  return UntypedStorage::from_blob(
      mapped, nbytes, [nbytes](void* p) { ::munmap(p, static_cast<size_t>(nbytes)); }, kCPU, /*read_only=*/true,
      std::move(name));
}

}  // namespace mmt::detail
