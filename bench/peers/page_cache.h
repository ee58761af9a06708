// Page-cache control shared by every C/C++ contender of the peer benchmarks, so "warm" and
// "cold" mean the same thing for all of them. Warm: the files were just read through. Cold:
// the file's pages are dropped with posix_fadvise(POSIX_FADV_DONTNEED). The kernel keeps pages
// that a live mapping has mapped, so a cold run evicts after its open: what stays is only what
// the open itself mapped (a header, a chunk table), and resident_fraction() checks with
// mincore() how much that is. Header-only: the HDF5 and pread peers are built without the
// mmtensor library.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace mmt::peers {

// Drops the cached pages of `path` (a file, or every file under a folder). Dirty pages are
// written first, since DONTNEED skips them.
inline void evict_from_page_cache(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) evict_from_page_cache(entry.path().string());
    }
    return;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("evict: cannot open " + path + ": " + std::strerror(errno));
  ::fdatasync(fd);
  int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) throw std::runtime_error("evict: posix_fadvise on " + path + ": " + std::strerror(rc));
}

// Reads every byte of `path` (a file, or every file under a folder) so its pages are cached:
// the "warm" state every contender starts a warm run from.
inline void warm_page_cache(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) warm_page_cache(entry.path().string());
    }
    return;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("warm: cannot open " + path + ": " + std::strerror(errno));
  std::vector<char> block(size_t{1} << 20);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
}

// The fraction of `path`'s pages in the page cache, in [0, 1].
inline double resident_fraction(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("mincore: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  if (st.st_size == 0) {
    ::close(fd);
    return 0.0;
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("mincore: cannot map " + path);
  const size_t page_bytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = (static_cast<size_t>(st.st_size) + page_bytes - 1) / page_bytes;
  std::vector<unsigned char> in_core(pages);
  ::mincore(map, static_cast<size_t>(st.st_size), in_core.data());
  ::munmap(map, static_cast<size_t>(st.st_size));
  size_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return static_cast<double>(resident) / static_cast<double>(pages);
}

}  // namespace mmt::peers
