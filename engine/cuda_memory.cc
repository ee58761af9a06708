#include "cuda_memory.h"

#include <optional>
#include <string>

#include "mmtensor/device.h"
#include "mmtensor/error.h"

#include "cuda_check.h"

namespace mmt::cuda {

#if MMT_WITH_CUDA
void check(cudaError_t status, const char* what, int64_t nbytes) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // this failure is reported here: later calls must not see it again
  throw CudaError(detail::str(what, (nbytes >= 0 ? detail::str(" of ", nbytes, " bytes") : ""),
                              " failed: ", cudaGetErrorString(status)));
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (device != previous_) {
    check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
}
DeviceGuard::~DeviceGuard() {
  if (changed_ && primary_context_active(previous_)) cudaSetDevice(previous_);
}

bool primary_context_active(int device) noexcept {
  // cuDevicePrimaryCtxGetState(CUdevice, unsigned int* flags, int* active), without linking
  // the driver library: the runtime hands out the driver's entry points.
  using GetState = int (*)(int, unsigned int*, int*);
  static const GetState get_state = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetState>(fn);
  }();
  if (get_state == nullptr) return true;  // cannot tell: restore, as before
  unsigned int flags = 0;
  int active = 0;
  return get_state(device, &flags, &active) != 0 || active != 0;  // an error: restore too
}

namespace {
struct DeviceCount {
  int count = 0;
  cudaError_t status = cudaSuccess;
};
// The count cannot change while the process lives; asking the driver once is enough.
const DeviceCount& probed_devices() noexcept {
  static const DeviceCount probed = [] {
    DeviceCount out;
    out.status = cudaGetDeviceCount(&out.count);
    if (out.status != cudaSuccess) {
      cudaGetLastError();
      out.count = 0;
    }
    return out;
  }();
  return probed;
}
}  // namespace

int device_count() noexcept { return probed_devices().count; }

std::string unavailable_reason() {
  const DeviceCount& probed = probed_devices();
  if (probed.count > 0) return {};
  if (probed.status == cudaSuccess) return "no CUDA device";
  return detail::str("no CUDA device: ", cudaGetErrorString(probed.status), " (",
                     cudaGetErrorName(probed.status), ", CUDA runtime ", CUDART_VERSION / 1000, ".",
                     CUDART_VERSION % 1000 / 10, ")");
}

void use_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

int current_device() noexcept {
  if (device_count() == 0) return -1;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

void synchronize_device_noexcept(int device) noexcept {
  on_device_noexcept(device, [] {
    if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
  });
}

void* malloc_device(int64_t nbytes, int device) {
  MMT_CHECK(device >= 0 && device < device_count(), CudaError, "cuda:", device,
            " is not available (", device_count(), " CUDA device(s) found)");
  DeviceGuard guard(device);
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, static_cast<size_t>(nbytes)), "cudaMalloc", nbytes);
  return ptr;
}

void free_device(void* ptr, int device) noexcept {
  if (ptr) on_device_noexcept(device, [&] { cudaFree(ptr); });
}

void* malloc_host_pinned(int64_t nbytes, int device, std::string* cannot_pin) {
  std::optional<DeviceGuard> guard;
  if (device >= 0) guard.emplace(device);
  void* ptr = nullptr;
  const cudaError_t status = cudaHostAlloc(&ptr, static_cast<size_t>(nbytes), cudaHostAllocDefault);
  switch (status) {
    case cudaSuccess:
      return ptr;
    case cudaErrorMemoryAllocation:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotPermitted:
    case cudaErrorInitializationError:
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      cudaGetLastError();
      *cannot_pin = detail::str("cudaHostAlloc of ", nbytes, " bytes failed: ", cudaGetErrorString(status));
      return nullptr;
    default:
      check(status, "cudaHostAlloc", nbytes);
      return nullptr;
  }
}

void free_host_pinned(void* ptr) noexcept {
  if (ptr) cudaFreeHost(ptr);
}

void memcpy(void* dst, const void* src, int64_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  check(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDefault), "cudaMemcpy", nbytes);
  // cudaMemcpy returns before a device-to-device copy is done: wait, so that the engine's
  // copies are synchronous as documented (a clone() of a batch, then its release, must not
  // race the slot's refill).
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after cudaMemcpy", nbytes);
}

void memset(void* dst, int value, int64_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  check(cudaMemset(dst, value, static_cast<size_t>(nbytes)), "cudaMemset", nbytes);
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after cudaMemset", nbytes);  // likewise
}

#else  // built without CUDA

int device_count() noexcept { return 0; }
std::string unavailable_reason() { return "no CUDA device: mmtensor was built without CUDA"; }
void use_device(int) { throw_built_without_cuda("selecting a CUDA device"); }
int current_device() noexcept { return -1; }
void synchronize_device_noexcept(int) noexcept {}
void* malloc_device(int64_t, int) { throw_built_without_cuda("allocating CUDA memory"); }
void free_device(void*, int) noexcept {}
void* malloc_host_pinned(int64_t, int, std::string* cannot_pin) {
  *cannot_pin = "mmtensor was built without CUDA";
  return nullptr;
}
void free_host_pinned(void*) noexcept {}
void memcpy(void*, const void*, int64_t, int) { throw_built_without_cuda("copying to or from a CUDA device"); }
void memset(void*, int, int64_t, int) { throw_built_without_cuda("filling CUDA memory"); }

#endif

}  // namespace mmt::cuda

namespace mmt {

bool cuda_is_available() { return cuda::device_count() > 0; }
int cuda_device_count() { return cuda::device_count(); }
std::string cuda_unavailable_reason() { return cuda::unavailable_reason(); }
bool built_with_cuda() {
#if MMT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace mmt
