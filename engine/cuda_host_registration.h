// Page-locking memory the engine did not allocate (a dataset's read-only file mapping), so
// that a device's copy engines read it directly: cudaHostRegister with the read-only and
// portable flags. The loader's pin_mapping uses it to copy uncompressed records from the
// mapping to the device without a host gather (loader.h).
//
// Registrations of one range are counted process-wide: two loaders over one dataset share
// it, and the last handle to go unregisters it. A range that the program registered itself
// is used as it is and never unregistered by the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mmt::cuda {

class HostRegistration {
 public:
  HostRegistration() = default;
  // Registers [begin, begin + bytes) (whole pages: the range is widened to them) with
  // `device` current. Reading it in pins every page in memory, so this takes as long as
  // reading the range from the page cache or disk, and the range must fit in memory:
  // CudaError naming `what` and the size otherwise.
  static HostRegistration read_only(const void* begin, size_t bytes, int device, const std::string& what);
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  // Whether [p, p + bytes) lies inside the registered pages.
  bool contains(const void* p, size_t bytes) const noexcept {
    const auto at = reinterpret_cast<uintptr_t>(p);
    return begin_ != 0 && at >= begin_ && bytes <= end_ - begin_ && at - begin_ <= end_ - begin_ - bytes;
  }

 private:
  void release() noexcept;
  uintptr_t begin_ = 0;  // page-aligned
  uintptr_t end_ = 0;
  uint64_t made_in_generation_ = 0;  // fork_safety.h: a forked child unregisters nothing
};

}  // namespace mmt::cuda
