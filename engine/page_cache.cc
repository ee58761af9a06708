// Page cache probes and eviction (page_cache.h).
#include "page_cache.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "mmtensor/error.h"

namespace mmt::detail {

namespace {

// read_bytes from a /proc io file: opened per call (a descriptor kept per thread would leak
// with every thread that ends), and read once per hinted batch or measurement.
int64_t read_bytes_of(const char* proc_file) noexcept {
  const int fd = ::open(proc_file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  const std::string_view all(text, static_cast<size_t>(n));
  constexpr std::string_view kKey = "\nread_bytes: ";
  const size_t at = all.find(kKey);
  if (at == std::string_view::npos) return -1;
  const char* first = all.data() + at + kKey.size();
  int64_t value = -1;
  if (std::from_chars(first, all.data() + all.size(), value).ec != std::errc{}) return -1;
  return value;
}

}  // namespace

int64_t thread_major_faults() noexcept {
  struct rusage usage {};
  if (::getrusage(RUSAGE_THREAD, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_majflt);
}

int64_t thread_storage_read_bytes() noexcept { return read_bytes_of("/proc/thread-self/io"); }
int64_t process_storage_read_bytes() noexcept { return read_bytes_of("/proc/self/io"); }

bool drop_from_page_cache(const std::string& path, std::string* why_not) {
  auto refuse = [&](std::string reason) {
    if (why_not) *why_not = std::move(reason);
    return false;
  };
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) return refuse(str("cannot stat '", path, "': ", std::strerror(errno)));
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)
    return refuse(str("'", path, "' is on a tmpfs or ramfs, which keeps files in memory"));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return refuse(str("cannot open '", path, "': ", std::strerror(errno)));
  // Dirty pages (a file just written) are not dropped: write them back first.
  int err = ::fdatasync(fd) == 0 ? 0 : errno;
  if (err == 0) err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (err != 0) return refuse(str("cannot drop '", path, "' from the page cache: ", std::strerror(err)));
  return true;
}

}  // namespace mmt::detail
