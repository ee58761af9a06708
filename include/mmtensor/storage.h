// UntypedStorage: a flat block of bytes and who frees it, as torch.UntypedStorage.
//
// A storage is a handle with shared ownership: copying an UntypedStorage shares the same bytes
// (like copying a torch.UntypedStorage reference), and the bytes are freed, unmapped or
// unpinned when the last handle (including every Tensor view over it) goes away. A mapping
// is therefore never unmapped under a live view.
//
// Kinds of storage:
//   - file-backed: from_file() (PyTorch's rules) or map_file() (read-only, copy-on-write or shared),
//     mapped with Boost.Interprocess; filename() is the path;
//   - host memory with a chosen alignment (default 64 bytes);
//   - pinned (page-locked) host memory, for asynchronous copies to a GPU;
//   - CUDA device memory.
//
// Thread safety: the handle may be copied and destroyed from any thread. Reading the bytes
// from many threads is safe; writing them concurrently is the caller's business, as in PyTorch.
// On bad input every function throws an mmt::Error naming the argument; none crashes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "mmtensor/device.h"

namespace mmt {

// How a file is mapped.
enum class MapMode : uint8_t {
  ReadOnly,  // pages are read-only; writing through the storage throws (datasets use this)
  Private,   // copy-on-write: writes stay in this process and never reach the file
  Shared,    // writes reach the file and every other shared mapping of it
};

// Page-access hints (madvise) for a mapped range.
enum class AccessAdvice : uint8_t { Normal, Random, Sequential, WillNeed, DontNeed };

inline constexpr size_t kDefaultHostAlignment = 64;

namespace detail {
struct StorageImpl;
}

class UntypedStorage {
 public:
  // An empty storage: nbytes() == 0, data() == nullptr, on cpu.
  UntypedStorage();

  // PyTorch's UntypedStorage.from_file(filename, shared, nbytes):
  //   shared=true : the file is mapped shared, created if missing and grown to nbytes if
  //                 smaller; writes reach the file.
  //   shared=false: the file must hold at least nbytes bytes; it is mapped copy-on-write and
  //                 changes never reach it.
  // nbytes == 0 maps the whole file (in either mode, as in PyTorch). Throws IoError (missing file,
  // directory, no permission) or ValueError (negative nbytes, file too small).
  static UntypedStorage from_file(const std::string& filename, bool shared, int64_t nbytes);

  // Maps [offset, offset + nbytes) of an existing file; nbytes < 0 maps to the end of the
  // file. offset need not be page-aligned. ReadOnly is what datasets use.
  static UntypedStorage map_file(const std::string& filename, MapMode mode = MapMode::ReadOnly,
                                 int64_t offset = 0, int64_t nbytes = -1);

  // Uninitialised memory on `device`. On cpu, aligned to `alignment` bytes (a power of two).
  static UntypedStorage allocate(int64_t nbytes, Device device = kCPU,
                                 size_t alignment = kDefaultHostAlignment);

  // Page-locked host memory (cudaHostAlloc) when a CUDA device is present, allocated with
  // `for_device` current when it is a CUDA device (else the calling thread's current device,
  // whose context this opens). Without a device, or when the runtime cannot pin (a device in
  // exclusive use elsewhere, a process forked after CUDA started), it falls back to ordinary
  // page-aligned host memory and is_pinned() reports false; the fallback is reported once on
  // stderr unless MMT_QUIET is set. CudaError for a CUDA device that does not exist.
  static UntypedStorage allocate_pinned(int64_t nbytes, Device for_device = kCPU);

  // Wraps memory the caller owns; `deleter(data)` runs when the last handle goes away.
  // `filename`: the file the bytes are mapped from, when the caller mapped one itself (for a
  // file without a name, an unlinked temporary, a description of it that error messages use).
  // filename() then reports it, and mmtensor's own copies out of the storage (the writer's)
  // turn a SIGBUS there (the file cut short, a disk error on reading it back) into an IoError
  // that names it, as they do for map_file() storages.
  static UntypedStorage from_blob(void* data, int64_t nbytes, std::function<void(void*)> deleter,
                                  Device device = kCPU, bool read_only = false, std::string filename = {});

  int64_t nbytes() const;
  size_t size() const { return static_cast<size_t>(nbytes()); }  // torch: len(storage)
  // The first byte. For cuda storage, a device pointer.
  const std::byte* data() const;
  // Writable access; throws ValueError for a read-only storage (a dataset mapping).
  std::byte* mutable_data() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  bool is_pinned() const;
  bool is_read_only() const;
  // The mapped file's path (or, for a from_blob() storage over a nameless file, the
  // description its caller gave); empty for storages not backed by a file.
  const std::string& filename() const;
  // True when both handles share the same bytes (torch: a.data_ptr() == b.data_ptr()).
  bool is_same(const UntypedStorage& other) const;
  // How many handles (storages and tensors) share these bytes.
  long use_count() const;

  // An independent copy on the same device (host copies are plain host memory).
  UntypedStorage clone() const;
  // Copies src's bytes into this storage; the sizes must match. Works across cpu and cuda.
  UntypedStorage& copy_(const UntypedStorage& src);
  // Sets every byte to `value`.
  UntypedStorage& fill_(uint8_t value);
  // A pinned host copy (or this storage itself if it is already pinned), as in PyTorch.
  // Without a CUDA device, an ordinary copy (see allocate_pinned), made again on each call.
  UntypedStorage pin_memory() const;

  // madvise() on [offset, offset + nbytes) of a storage from map_file()/from_file(); a no-op
  // for other storages (from_blob() ones included, whatever their filename), and DontNeed is
  // ignored on a copy-on-write mapping, where it would drop the process's own changes.
  void advise(AccessAdvice advice, int64_t offset = 0, int64_t nbytes = -1) const;

 private:
  explicit UntypedStorage(std::shared_ptr<detail::StorageImpl> impl);
  std::shared_ptr<detail::StorageImpl> impl_;
};

}  // namespace mmt
