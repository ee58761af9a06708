// UntypedStorage: host, pinned, CUDA and memory-mapped file storages behind one handle.
#include "mmtensor/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>

#include <boost/interprocess/file_mapping.hpp>
#include <boost/interprocess/mapped_region.hpp>

#include "cuda_memory.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "page_cache.h"

namespace bip = boost::interprocess;

namespace mmt {
namespace detail {

struct StorageImpl {
  std::byte* data = nullptr;
  int64_t nbytes = 0;
  Device device = kCPU;
  bool pinned = false;
  bool read_only = false;
  bool private_mapping = false;  // copy-on-write: dropping its pages would lose writes
  std::string filename;
  // Exactly one of these owns the bytes (or none, for an empty storage).
  std::unique_ptr<bip::mapped_region> region;
  std::function<void(void*)> deleter;

  StorageImpl() = default;
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl() {
    if (deleter) deleter(data);
    // `region` unmaps itself.
  }
};

}  // namespace detail

namespace {

using detail::StorageImpl;

std::string errno_text(int err) { return std::strerror(err); }

void check_nbytes(int64_t nbytes, const char* what) {
  MMT_CHECK(nbytes >= 0, ValueError, what, ": nbytes must be non-negative, got ", nbytes);
}

// A FIFO, socket or character device is no file to map: refused naming what it is (opening a
// FIFO read-only would block until a writer comes; growing one fails with EINVAL).
void refuse_special_file(mode_t mode, const std::string& filename, const char* what) {
  if (S_ISREG(mode) || S_ISBLK(mode) || S_ISDIR(mode)) return;
  throw IoError(detail::str(what, ": '", filename, "' is not a regular file (",
                            S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
                                                      : S_ISSOCK(mode) ? "a socket" : "a special file", ")"));
}

// Opens `filename` once and maps [offset, offset + nbytes) of it, where
// nbytes = choose_nbytes(size of the opened file). The size comes from fstat of the very
// descriptor that is mapped: a stat(path) followed by an open(path) would pair one file's size
// with another file's bytes whenever a writer renames a new generation onto the path between
// the two (the dataset writer replaces files exactly so), and then mapping past the end of a
// shorter file would fault on first touch.
template <class ChooseBytes>
std::shared_ptr<StorageImpl> map_region(const std::string& filename, MapMode mode, int64_t offset,
                                        const char* what, ChooseBytes choose_nbytes) {
  auto impl = std::make_shared<StorageImpl>();
  impl->filename = filename;
  impl->read_only = mode == MapMode::ReadOnly;
  impl->private_mapping = mode == MapMode::Private;
  // Opening a FIFO (or a terminal) read-only blocks until a writer comes, perhaps forever: such
  // a path is refused by its kind before it is opened. The fstat below still decides for the
  // file actually opened.
  struct stat kind {};
  if (::stat(filename.c_str(), &kind) == 0) refuse_special_file(kind.st_mode, filename, what);
  std::optional<bip::file_mapping> file;
  try {
    file.emplace(filename.c_str(), mode == MapMode::Shared ? bip::read_write : bip::read_only);
  } catch (const bip::interprocess_exception& e) {
    const int err = e.get_native_error();
    if (err == EISDIR) throw IoError(detail::str(what, ": '", filename, "' is a directory, not a file"), err);
    throw IoError(detail::str(what, ": cannot open '", filename, "': ", err ? errno_text(err) : e.what()), err);
  }
  struct stat st {};
  if (::fstat(file->get_mapping_handle().handle, &st) != 0) {
    const int err = errno;
    throw IoError(detail::str(what, ": cannot stat '", filename, "': ", errno_text(err)), err);
  }
  MMT_CHECK(!S_ISDIR(st.st_mode), IoError, what, ": '", filename, "' is a directory, not a file");
  MMT_CHECK(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode), IoError, what, ": '", filename,
            "' is not a regular file");
  const int64_t nbytes = choose_nbytes(static_cast<int64_t>(st.st_size));
  impl->nbytes = nbytes;
  if (nbytes == 0) return impl;  // nothing to map: mmap of length 0 is an error
  try {
    bip::mode_t region_mode = mode == MapMode::ReadOnly  ? bip::read_only
                              : mode == MapMode::Private ? bip::copy_on_write
                                                         : bip::read_write;
    impl->region = std::make_unique<bip::mapped_region>(*file, region_mode, offset,
                                                        static_cast<size_t>(nbytes));
  } catch (const bip::interprocess_exception& e) {
    throw IoError(detail::str(what, ": cannot map '", filename, "' (", nbytes, " bytes at offset ",
                              offset, "): ", e.what()),
                  e.get_native_error());
  }
  impl->data = static_cast<std::byte*>(impl->region->get_address());
  return impl;
}

std::byte* aligned_host_alloc(int64_t nbytes, size_t alignment) {
  MMT_CHECK(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0, ValueError,
            "alignment must be a power of two of at least ", sizeof(void*), ", got ", alignment);
  if (nbytes == 0) return nullptr;
  // aligned_alloc wants a size that is a multiple of the alignment.
  size_t rounded = (static_cast<size_t>(nbytes) + alignment - 1) & ~(alignment - 1);
  MMT_CHECK(rounded >= static_cast<size_t>(nbytes), ValueError, "cannot allocate ", nbytes,
            " bytes: size overflows");
  void* p = std::aligned_alloc(alignment, rounded);
  // An alignment of a page or less costs nothing; a larger one may be what failed.
  MMT_CHECK(p != nullptr, Error, "out of memory: allocating ", nbytes, " bytes of host memory",
            alignment > 4096 ? detail::str(" aligned to ", alignment, " bytes (", rounded, " with the padding)")
                             : std::string());
  return static_cast<std::byte*>(p);
}

void warn_pinned_fallback_once(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    if (std::getenv("MMT_QUIET") == nullptr)
      std::cerr << "mmtensor: " << why << "; pinned memory falls back to ordinary host memory "
                << "(is_pinned() is false)\n";
  });
}

}  // namespace

// The empty storage has no impl: default-constructed tensors and samples (every get(i)
// makes several) then cost no allocation and no shared reference count.
UntypedStorage::UntypedStorage() = default;
UntypedStorage::UntypedStorage(std::shared_ptr<StorageImpl> impl) : impl_(std::move(impl)) {}

UntypedStorage UntypedStorage::from_file(const std::string& filename, bool shared, int64_t nbytes) {
  check_nbytes(nbytes, "from_file");
  if (shared) {
    // PyTorch's rule: the file is created if needed and grown to nbytes.
    int fd = ::open(filename.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      int err = errno;
      throw IoError(detail::str("from_file: cannot open '", filename, "' for writing: ",
                                errno_text(err)),
                    err);
    }
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0;
    int err = errno;
    if (ok && S_ISDIR(st.st_mode)) {
      ::close(fd);
      throw IoError(detail::str("from_file: '", filename, "' is a directory, not a file"));
    }
    if (ok && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
      ::close(fd);
      refuse_special_file(st.st_mode, filename, "from_file");
    }
    if (ok && st.st_size < nbytes) {
      ok = ::ftruncate(fd, nbytes) == 0;
      err = errno;
    }
    ::close(fd);
    MMT_CHECK(ok, IoError, "from_file: cannot grow '", filename, "' to ", nbytes, " bytes: ",
              errno_text(err));
    return UntypedStorage(map_region(filename, MapMode::Shared, 0, "from_file", [&](int64_t file_bytes) {
      // Another process may have shrunk the file since it was grown: never map past its end.
      MMT_CHECK(file_bytes >= nbytes, IoError, "from_file: '", filename, "' shrank to ", file_bytes,
                " bytes while it was being mapped (", nbytes, " were asked for)");
      return nbytes == 0 ? file_bytes : nbytes;
    }));
  }
  return UntypedStorage(map_region(filename, MapMode::Private, 0, "from_file", [&](int64_t file_bytes) {
    MMT_CHECK(file_bytes >= nbytes, ValueError, "from_file: '", filename, "' holds ", file_bytes,
              " bytes but nbytes=", nbytes, " were asked for (with shared=false the file must "
              "hold at least nbytes)");
    return nbytes == 0 ? file_bytes : nbytes;
  }));
}

UntypedStorage UntypedStorage::map_file(const std::string& filename, MapMode mode, int64_t offset,
                                        int64_t nbytes) {
  MMT_CHECK(offset >= 0, ValueError, "map_file: offset must be non-negative, got ", offset);
  return UntypedStorage(map_region(filename, mode, offset, "map_file", [&](int64_t file_bytes) {
    MMT_CHECK(offset <= file_bytes, ValueError, "map_file: offset ", offset, " is past the end of '", filename,
              "' (", file_bytes, " bytes)");
    const int64_t mapped = nbytes < 0 ? file_bytes - offset : nbytes;
    MMT_CHECK(mapped <= file_bytes - offset, ValueError, "map_file: '", filename, "' holds ", file_bytes,
              " bytes; cannot map ", mapped, " bytes at offset ", offset);
    return mapped;
  }));
}

UntypedStorage UntypedStorage::allocate(int64_t nbytes, Device device, size_t alignment) {
  check_nbytes(nbytes, "allocate");
  auto impl = std::make_shared<StorageImpl>();
  impl->nbytes = nbytes;
  impl->device = device;
  if (device.is_cuda()) {
    // Checked for an empty storage too, as torch.empty(0, device="cuda:7") is: a tensor must
    // not claim a device that is not there (an unpickled empty CUDA tensor, say).
    MMT_CHECK(device.index >= 0 && device.index < cuda::device_count(), CudaError, device.str(),
              " is not available (", cuda::device_count(), " CUDA device(s) found)");
    if (nbytes > 0) {
      impl->data = static_cast<std::byte*>(cuda::malloc_device(nbytes, device.index));
      int index = device.index;
      impl->deleter = [index](void* p) { cuda::free_device(p, index); };
    }
    return UntypedStorage(std::move(impl));
  }
  impl->data = aligned_host_alloc(nbytes, alignment);
  impl->deleter = [](void* p) { std::free(p); };
  return UntypedStorage(std::move(impl));
}

UntypedStorage UntypedStorage::allocate_pinned(int64_t nbytes, Device for_device) {
  check_nbytes(nbytes, "allocate_pinned");
  MMT_CHECK(!for_device.is_cuda() || for_device.index < cuda::device_count(), CudaError, "allocate_pinned for ",
            for_device.str(), ": ", cuda::device_count(), " CUDA device(s) found");
  // Page alignment keeps the fallback's copies as fast as a pinned buffer's would be.
  if (cuda::device_count() == 0) {
    warn_pinned_fallback_once("no CUDA device");
    return allocate(nbytes, kCPU, 4096);
  }
  auto impl = std::make_shared<StorageImpl>();
  impl->nbytes = nbytes;
  impl->pinned = true;
  if (nbytes > 0) {
    std::string cannot_pin;
    impl->data = static_cast<std::byte*>(cuda::malloc_host_pinned(
        nbytes, for_device.is_cuda() ? static_cast<int>(for_device.index) : -1, &cannot_pin));
    if (impl->data == nullptr) {
      // No pinned memory to be had (the device held by another process in exclusive mode, a
      // child forked after CUDA started, the pinned limit reached): ordinary memory still
      // works, copies from it are only slower. Other CUDA errors were thrown.
      warn_pinned_fallback_once(cannot_pin);
      return allocate(nbytes, kCPU, 4096);
    }
    impl->deleter = [](void* p) { cuda::free_host_pinned(p); };
  }
  return UntypedStorage(std::move(impl));
}

UntypedStorage UntypedStorage::from_blob(void* data, int64_t nbytes,
                                         std::function<void(void*)> deleter, Device device,
                                         bool read_only, std::string filename) {
  check_nbytes(nbytes, "from_blob");
  MMT_CHECK(data != nullptr || nbytes == 0, ValueError, "from_blob: null data with nbytes=", nbytes);
  auto impl = std::make_shared<StorageImpl>();
  impl->data = static_cast<std::byte*>(data);
  impl->nbytes = nbytes;
  impl->device = device;
  impl->read_only = read_only;
  impl->deleter = std::move(deleter);
  impl->filename = std::move(filename);
  return UntypedStorage(std::move(impl));
}

namespace {
const std::string kNoFilename;
}  // namespace

int64_t UntypedStorage::nbytes() const { return impl_ ? impl_->nbytes : 0; }
const std::byte* UntypedStorage::data() const { return impl_ ? impl_->data : nullptr; }
std::byte* UntypedStorage::mutable_data() const {
  if (!impl_) return nullptr;
  // Read-only memory is a file mapped read-only, or memory the engine shares without a file
  // (a decoded chunk, which the cache hands to every reader of it).
  MMT_CHECK(!impl_->read_only, ValueError, "storage",
            (impl_->filename.empty() ? " is read-only (memory the engine shares, such as a decoded chunk in the cache)"
                                     : " of '" + impl_->filename + "' is read-only (mapped with MapMode::ReadOnly)"),
            "; clone() it to modify a copy");
  return impl_->data;
}
Device UntypedStorage::device() const { return impl_ ? impl_->device : kCPU; }
bool UntypedStorage::is_pinned() const { return impl_ && impl_->pinned; }
bool UntypedStorage::is_read_only() const { return impl_ && impl_->read_only; }
const std::string& UntypedStorage::filename() const { return impl_ ? impl_->filename : kNoFilename; }
bool UntypedStorage::is_same(const UntypedStorage& other) const { return impl_ == other.impl_; }
long UntypedStorage::use_count() const { return impl_.use_count(); }

UntypedStorage UntypedStorage::clone() const {
  UntypedStorage copy = allocate(nbytes(), device());
  copy.copy_(*this);
  return copy;
}

UntypedStorage& UntypedStorage::copy_(const UntypedStorage& src) {
  MMT_CHECK(src.nbytes() == nbytes(), ValueError, "copy_: storage sizes differ (", nbytes(),
            " bytes vs ", src.nbytes(), " bytes)");
  if (nbytes() == 0 || is_same(src)) return *this;
  std::byte* dst = mutable_data();
  if (is_cuda() || src.is_cuda()) {
    cuda::memcpy(dst, src.data(), nbytes(), is_cuda() ? device().index : src.device().index);
  } else {
    // Either side may be a file's mapping that another program cut short: an IoError naming
    // it, as Tensor::copy_ gives, not the death of the process.
    detail::guard_storage_reads(*this, [&] {
      detail::guard_storage_reads(src, [&] { std::memmove(dst, src.data(), static_cast<size_t>(nbytes())); });
    });
  }
  return *this;
}

UntypedStorage& UntypedStorage::fill_(uint8_t value) {
  if (nbytes() == 0) return *this;
  std::byte* dst = mutable_data();
  if (is_cuda())
    cuda::memset(dst, value, nbytes(), device().index);
  else
    detail::guard_storage_reads(*this, [&] { std::memset(dst, value, static_cast<size_t>(nbytes())); });
  return *this;
}

UntypedStorage UntypedStorage::pin_memory() const {
  MMT_CHECK(!is_cuda(), ValueError, "pin_memory: storage is on ", device().str(),
            "; only host storage can be pinned");
  if (is_pinned()) return *this;
  UntypedStorage pinned = allocate_pinned(nbytes());
  pinned.copy_(*this);
  return pinned;
}

void UntypedStorage::advise(AccessAdvice advice, int64_t offset, int64_t nbytes) const {
  if (!impl_ || !impl_->region || impl_->nbytes == 0) return;
  // MADV_DONTNEED on a copy-on-write mapping discards the process's own writes.
  if (advice == AccessAdvice::DontNeed && impl_->private_mapping) return;
  MMT_CHECK(offset >= 0 && offset <= impl_->nbytes, ValueError, "advise: offset ", offset,
            " is outside the storage (", impl_->nbytes, " bytes)");
  if (nbytes < 0 || nbytes > impl_->nbytes - offset) nbytes = impl_->nbytes - offset;
  if (nbytes == 0) return;
  // madvise wants a page-aligned start; the mapping itself begins on a page boundary.
  const auto page = static_cast<uintptr_t>(detail::page_bytes());
  uintptr_t start = reinterpret_cast<uintptr_t>(impl_->data) + static_cast<uintptr_t>(offset);
  uintptr_t aligned = start & ~(page - 1);
  size_t length = static_cast<size_t>(nbytes) + (start - aligned);
  int flag = MADV_NORMAL;
  switch (advice) {
    case AccessAdvice::Normal: flag = MADV_NORMAL; break;
    case AccessAdvice::Random: flag = MADV_RANDOM; break;
    case AccessAdvice::Sequential: flag = MADV_SEQUENTIAL; break;
    case AccessAdvice::WillNeed: flag = MADV_WILLNEED; break;
    case AccessAdvice::DontNeed: flag = MADV_DONTNEED; break;
  }
  // Advice is a hint: a refusal changes performance, never results, so it is not an error.
  ::madvise(reinterpret_cast<void*>(aligned), length, flag);
}

}  // namespace mmt
