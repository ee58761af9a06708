#include "import_util.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mmt::detail {

int64_t regular_file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    throw IoError(str(path, ": cannot open: ", std::strerror(err)), err);
  }
  if (S_ISDIR(st.st_mode)) throw IoError(str(path, ": is a directory, not a file"), EISDIR);
  if (!S_ISREG(st.st_mode))
    throw IoError(str(path, ": is not a regular file (a device, FIFO or socket): its size is unknown; copy what it "
                            "gives to a file first"));
  // /proc, /sys and the like give their files as regular files of size 0 that hold data:
  // read as empty, they would pack no records and succeed. Told by the filesystem, not by
  // reading them (a read may block, as a trace pipe's, or consume, as /proc/kmsg's).
  struct statfs fs;
  if (st.st_size == 0 && ::statfs(path.c_str(), &fs) == 0) {
    const auto type = static_cast<unsigned long>(fs.f_type);
    MMT_CHECK(type != PROC_SUPER_MAGIC && type != SYSFS_MAGIC && type != DEBUGFS_MAGIC && type != TRACEFS_MAGIC &&
                  type != CGROUP2_SUPER_MAGIC && type != SECURITYFS_MAGIC,
              IoError, path, ": a file of a kernel filesystem (/proc, /sys), whose size reads as 0 bytes whatever "
              "it holds; copy it to a file first");
  }
  return static_cast<int64_t>(st.st_size);
}

UntypedStorage read_file_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw IoError(str(path, ": cannot open: ", std::strerror(err)), err);
  }
  FileCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw IoError(str(path, ": is not a regular file"));
  UntypedStorage storage = UntypedStorage::allocate(static_cast<int64_t>(st.st_size));
  std::byte* dst = storage.nbytes() ? storage.mutable_data() : nullptr;
  int64_t done = 0;
  while (done < storage.nbytes()) {
    ssize_t got = ::pread(fd, dst + done, static_cast<size_t>(storage.nbytes() - done), done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int err = errno;
      throw IoError(str(path, ": read failed: ", std::strerror(err)), err);
    }
    if (got == 0) throw IoError(str(path, ": the file shrank while it was being read"));
    done += got;
  }
  return storage;
}

InputFile map_input_file(const std::string& path) {
  InputFile file;
  file.path = path;
  (void)regular_file_size(path);  // words the common errors; the mapping takes its own size
  file.mapping = UntypedStorage::map_file(path, MapMode::ReadOnly);
  file.bytes = {file.mapping.data(), static_cast<size_t>(file.mapping.nbytes())};
  return file;
}

int64_t checked_shape_nbytes(IntArrayRef shape, int64_t element_bytes, std::string_view what) {
  // The extent of every dimension but zero-sized ones must fit too: strides are computed
  // over max(size, 1), so (0, 2^40, 2^40) holds no bytes but still has unrepresentable strides.
  int64_t span_bytes = element_bytes;
  bool empty = false;
  for (int64_t extent : shape) {
    MMT_CHECK(extent >= 0, FormatError, what, ": negative dimension ", extent, " in shape ", shape);
    empty = empty || extent == 0;
    if (__builtin_mul_overflow(span_bytes, std::max<int64_t>(extent, 1), &span_bytes))
      throw FormatError(str(what, ": shape ", shape, " of ", element_bytes,
                            "-byte elements overflows a 64-bit byte count"));
  }
  return empty ? 0 : span_bytes;
}

void DistinctInputs::add(const std::string& path, std::string_view input) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  const auto [earlier, first] = seen_.emplace(std::pair<uint64_t, uint64_t>(st.st_dev, st.st_ino), path);
  MMT_CHECK(first, ValueError, "input '", input.empty() ? std::string_view(path) : input, "' is ", earlier->second,
            " again; each ", each_, " is packed once");
}

}  // namespace mmt::detail
