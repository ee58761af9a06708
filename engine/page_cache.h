// What the kernel's page cache holds and reads for this process: the counts the loader's
// read-ahead watches (read_ahead.h), and the eviction that cold-read measurements start from
// (mmt bench --cold, the benchmarks, the tests). Linux only, as the rest of the engine.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

namespace mmt::detail {

// The page size. Asked each time (glibc answers from memory, without a system call) rather
// than kept in a function-local static: a thread inside that static's first initialisation
// when the process forks would leave its guard taken in the child for ever (fork_safety.h).
inline int64_t page_bytes() noexcept { return ::sysconf(_SC_PAGESIZE); }

// Major page faults the calling thread has taken so far, and the whole process.
int64_t thread_major_faults() noexcept;
int64_t process_major_faults() noexcept;
// Bytes the calling thread has had read from storage so far (read_bytes in
// /proc/thread-self/io, which counts the reads a hint starts), or -1 when the kernel does
// not keep that count.
int64_t thread_storage_read_bytes() noexcept;
// Whether thread_storage_read_bytes() gives a count on this thread (asked once a thread).
bool thread_storage_read_bytes_known() noexcept;
// Runs fn() and returns what the calling thread had read from storage meanwhile: what a hint
// made the kernel read. -1 when the kernel does not say.
template <typename Fn>
int64_t thread_storage_read_by(Fn&& fn) {
  const int64_t before = thread_storage_read_bytes();
  fn();
  if (before < 0) return -1;
  const int64_t after = thread_storage_read_bytes();
  return after >= 0 ? after - before : -1;
}
// The same for the whole process (/proc/self/io), or -1.
int64_t process_storage_read_bytes() noexcept;

// Whether mincore() of a shared mapping of the file at `path` (owned by `file_owner`)
// reports the page cache to this user. Since Linux 5.0 it reports every page as resident
// unless the caller owns the file, may write it, or holds CAP_FOWNER over it (so that it
// cannot be used to spy on other users' reads): for anyone else its answer is made up. True
// when this user owns the file or may write it. Root is not trusted as such: root in a
// container may hold no capability over a file owned outside it. Where CAP_FOWNER would have
// been enough (root, a read-only mount), this says false: callers then do without mincore.
bool mincore_reports_page_cache(const std::string& path, uid_t file_owner);

// How many of a file's pages the page cache holds (mincore), of how many.
struct CachedPages {
  int64_t resident = 0;
  int64_t total = 0;
};
// nullopt where the file cannot be opened or mapped, or where the kernel does not tell this
// user (since Linux 5.0, mincore() of a file the user neither owns nor may write reports
// every page as cached).
std::optional<CachedPages> cached_pages(const std::string& path);

// Writes back and drops `path`'s pages from the page cache (posix_fadvise DONTNEED), so the
// next reads come from storage, and checks with cached_pages() that none is left. Pages
// that a mapping still maps stay: close the datasets that read the file first. False, with
// the reason in *why_not, where that cannot be done: a tmpfs or ramfs (files live in
// memory), a file that cannot be opened, a refusal, pages still cached afterwards. Where
// cached_pages() cannot tell, the advice is trusted.
bool drop_from_page_cache(const std::string& path, std::string* why_not = nullptr);

}  // namespace mmt::detail
