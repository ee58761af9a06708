#include "cuda_host_registration.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda_check.h"
#include "fork_safety.h"
#include "mmtensor/error.h"

namespace mmt::cuda {

#if MMT_WITH_CUDA
namespace {

struct Registered {
  uintptr_t end = 0;
  int64_t handles = 0;
  bool engine_registered = true;  // false: the program had registered it; never undone here
  int device = 0;                 // whose context registered it: undone there
};

// Whether CUDA counts the page at `address` as page-locked host memory.
bool page_locked(uintptr_t address) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(address));
  cudaGetLastError();
  return status == cudaSuccess && attributes.type == cudaMemoryTypeHost;
}

// Why `device` cannot register host memory read-only, or "" when it says it can.
std::string unsupported_reason(int device) {
  for (const auto& [attribute, name] :
       {std::pair{cudaDevAttrHostRegisterSupported, "cudaDevAttrHostRegisterSupported"},
        std::pair{cudaDevAttrHostRegisterReadOnlySupported, "cudaDevAttrHostRegisterReadOnlySupported"}}) {
    int value = 1;
    if (cudaDeviceGetAttribute(&value, attribute, device) == cudaSuccess && value == 0)
      return detail::str("cuda:", device, " cannot register host memory read-only (", name, " is 0)");
    cudaGetLastError();
  }
  return "";
}

// Registered ranges by first page. Under the mutex, so that a range's last handle going and
// another loader registering it again cannot interleave.
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<uintptr_t, Registered>& registry() {
  static auto* ranges = new std::map<uintptr_t, Registered>();  // outlives static loaders
  return *ranges;
}

uintptr_t page_bytes() {
  static const uintptr_t bytes = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096);
  return bytes;
}

}  // namespace

HostRegistration HostRegistration::read_only(const void* begin, size_t bytes, int device, const std::string& what) {
  MMT_CHECK(begin != nullptr && bytes > 0, ValueError, "cannot page-lock an empty range of ", what);
  const uintptr_t page = page_bytes();
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t last = reinterpret_cast<uintptr_t>(begin) + bytes;
  MMT_CHECK(last > reinterpret_cast<uintptr_t>(begin) && last + page - 1 > last, ValueError,
            "the range of ", what, " wraps the address space");
  const uintptr_t end = (last + page - 1) & ~(page - 1);
  std::lock_guard lock(registry_mutex());
  auto& ranges = registry();
  auto found = ranges.find(first);
  if (found != ranges.end()) {
    MMT_CHECK(found->second.end == end, CudaError, "cannot page-lock ", what, ": ", end - first,
              " bytes from its first page are registered with CUDA as ", found->second.end - first,
              " bytes already");
    ++found->second.handles;
  } else {
    DeviceGuard current(device);
    // In the registry before the call: an insertion failing after it would leave the pages
    // locked for good.
    const auto entry = ranges.emplace(first, Registered{end, 1, true, device}).first;
    const cudaError_t status = cudaHostRegister(reinterpret_cast<void*>(first), end - first,
                                                cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    cudaGetLastError();  // reported here, if at all
    const auto refuse = [&](const std::string& why) {
      ranges.erase(entry);
      throw CudaError(detail::str("cannot page-lock ", what, " (", end - first,
                                  " bytes) for copies straight to the device: ", why,
                                  "; without pin_mapping, batches are gathered into pinned buffers instead"));
    };
    if (status == cudaErrorHostMemoryAlreadyRegistered) {
      // The program's own registration: used as it is and left to it, if it covers the range.
      if (!page_locked(first) || !page_locked(end - page))
        refuse("part of it is registered with CUDA already, by the program");
      entry->second.engine_registered = false;
    } else if (status != cudaSuccess) {
      const std::string unsupported = unsupported_reason(device);
      if (!unsupported.empty()) refuse(unsupported);
      refuse(detail::str("cudaHostRegister failed: ", cudaGetErrorString(status),
                         status == cudaErrorMemoryAllocation ? " (its pages must fit in memory)" : ""));
    }
  }
  HostRegistration out;
  out.begin_ = first;
  out.end_ = end;
  out.made_in_generation_ = detail::fork_generation();
  return out;
}

void HostRegistration::release() noexcept {
  if (begin_ == 0) return;
  const uintptr_t begin = std::exchange(begin_, 0);
  end_ = 0;
  if (made_in_generation_ != detail::fork_generation()) return;  // a forked child: not its registration
  std::lock_guard lock(registry_mutex());
  auto found = registry().find(begin);
  if (found == registry().end() || --found->second.handles > 0) return;
  if (found->second.engine_registered) {
    // In the registering device's context, and opening none on the device this thread has
    // current (a Python finaliser's thread, say); a failure is not left as its last error.
    on_device_noexcept(found->second.device, [&] {
      cudaHostUnregister(reinterpret_cast<void*>(begin));
      cudaGetLastError();
    });
  }
  registry().erase(found);
}

#else  // built without CUDA

HostRegistration HostRegistration::read_only(const void*, size_t, int, const std::string&) {
  throw_built_without_cuda("page-locking a file mapping for a CUDA device");
}

void HostRegistration::release() noexcept {}

#endif

HostRegistration::~HostRegistration() { release(); }

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : begin_(std::exchange(other.begin_, 0)), end_(std::exchange(other.end_, 0)),
      made_in_generation_(other.made_in_generation_) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    release();
    begin_ = std::exchange(other.begin_, 0);
    end_ = std::exchange(other.end_, 0);
    made_in_generation_ = other.made_in_generation_;
  }
  return *this;
}

}  // namespace mmt::cuda
