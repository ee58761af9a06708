#include "cuda_host_registration.h"

#include <unistd.h>

#include <map>
#include <mutex>
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
};

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
    const cudaError_t status = cudaHostRegister(reinterpret_cast<void*>(first), end - first,
                                                cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    bool engine_registered = true;
    if (status == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();  // the program's own registration: use it, leave it
      engine_registered = false;
    } else if (status != cudaSuccess) {
      cudaGetLastError();
      throw CudaError(detail::str("cannot page-lock ", what, " (", end - first,
                                  " bytes) for copies straight to the device: cudaHostRegister failed: ",
                                  cudaGetErrorString(status),
                                  ". Its pages must fit in memory; without pin_mapping, batches are "
                                  "gathered into pinned buffers instead"));
    }
    ranges.emplace(first, Registered{end, 1, engine_registered});
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
  if (found->second.engine_registered) cudaHostUnregister(reinterpret_cast<void*>(begin));
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
