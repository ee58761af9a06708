// Page cache probes and eviction (page_cache.h).
#include "page_cache.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

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

int64_t process_major_faults() noexcept {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_majflt);
}

int64_t thread_storage_read_bytes() noexcept {
  const int64_t bytes = read_bytes_of("/proc/thread-self/io");
  if (bytes >= 0) return bytes;
  // Kernels before 3.17 have no /proc/thread-self; the same file under the thread's id.
  char task_io[64];
  std::snprintf(task_io, sizeof task_io, "/proc/self/task/%ld/io", static_cast<long>(::syscall(SYS_gettid)));
  return read_bytes_of(task_io);
}
bool thread_storage_read_bytes_known() noexcept {
  thread_local const bool known = thread_storage_read_bytes() >= 0;
  return known;
}
int64_t process_storage_read_bytes() noexcept { return read_bytes_of("/proc/self/io"); }

bool mincore_reports_page_cache(const std::string& path, uid_t file_owner) {
  return ::geteuid() == file_owner || ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) == 0;
}

std::optional<CachedPages> cached_pages(const std::string& path) {
  // A window at a time: the residency vector stays small however large the file (allocated
  // before the descriptor is opened, so nothing below throws).
  constexpr int64_t kWindowPages = int64_t{1} << 18;
  std::vector<unsigned char> resident;
  resident.reserve(static_cast<size_t>(kWindowPages));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  ok = ok && mincore_reports_page_cache(path, st.st_uid);
  CachedPages pages;
  const int64_t page_bytes = detail::page_bytes();
  pages.total = ok ? (static_cast<int64_t>(st.st_size) + page_bytes - 1) / page_bytes : 0;
  for (int64_t first = 0; ok && first < pages.total; first += kWindowPages) {
    const int64_t count = std::min(kWindowPages, pages.total - first);
    const int64_t offset = first * page_bytes;
    const size_t length = static_cast<size_t>(std::min(count * page_bytes, static_cast<int64_t>(st.st_size) - offset));
    void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, offset);
    if (map == MAP_FAILED) {
      ok = false;
      break;
    }
    resident.assign(static_cast<size_t>(count), 0);
    ok = ::mincore(map, length, resident.data()) == 0;
    ::munmap(map, length);
    for (unsigned char page : resident) pages.resident += page & 1;
  }
  ::close(fd);
  if (!ok) return std::nullopt;
  return pages;
}

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
  // Dirty pages (a file just written) are not dropped: write them back first. A filesystem
  // that cannot sync a descriptor opened for reading (some FUSE mounts) says so with EINVAL
  // or ENOSYS; the check below still tells whether the pages left.
  int err = ::fdatasync(fd) == 0 ? 0 : errno;
  if (err == EINVAL || err == ENOSYS) err = 0;
  if (err == 0) err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (err != 0) return refuse(str("cannot drop '", path, "' from the page cache: ", std::strerror(err)));
  // The advice succeeds without dropping pages that some mapping maps (in any process), and
  // does nothing at all on filesystems without a page cache of their own (an overlay over a
  // tmpfs): what is still cached is counted, not assumed. Where the kernel does not tell this
  // user (cached_pages() is nullopt), the advice is all there is to go by.
  const std::optional<CachedPages> left = cached_pages(path);
  if (left && left->resident > 0)
    return refuse(str(left->resident, " of the ", left->total, " pages of '", path, "' are still in the page "
                      "cache (mapped by a process, or kept by a filesystem that ignores POSIX_FADV_DONTNEED)"));
  return true;
}

}  // namespace mmt::detail
