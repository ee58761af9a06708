#include "output_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "mmtensor/error.h"
#include "npy_format.h"
#include "temp_files.h"

namespace mmt::tool {
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

void check_output_path(const std::string& path, bool force) {
  MMT_CHECK(!path.empty(), ValueError, "the output path is empty");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    // Absent (or under a missing folder, which creating the file reports): free to write.
    if (err == ENOENT || err == ENOTDIR) return;
    throw IoError(detail::str("cannot check ", path, ": ", std::strerror(err)), err);
  }
  // rename() would put a regular file in the place of a device or link, even with --force:
  // that is never what a user asking to overwrite an output means.
  MMT_CHECK(S_ISREG(st.st_mode), IoError, path, " is ", kind_of(st.st_mode),
            "; only a regular file is replaced, even with --force");
  MMT_CHECK(force, IoError, path, " already exists; pass --force to replace it");
}

void write_output_file(const std::string& path, std::span<const std::byte> bytes, bool force) {
  check_output_path(path, force);
  // Without --force the rename refuses a file that appeared since the check (no clobber).
  detail::write_file_atomically(path, {bytes}, /*replace=*/force);
}

void write_npy_file(const std::string& path, const Tensor& t, bool force) {
  const Tensor host = (t.is_cuda() ? t.cpu() : t).contiguous();
  const std::string header = detail::npy_header_bytes(host.dtype(), host.sizes());
  std::span<const std::byte> data;
  if (host.nbytes() > 0)
    data = {static_cast<const std::byte*>(host.data_ptr()), static_cast<size_t>(host.nbytes())};
  check_output_path(path, force);
  detail::write_file_atomically(path, {std::as_bytes(std::span(header)), data}, /*replace=*/force);
}

}  // namespace mmt::tool
