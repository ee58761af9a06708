// Checking CUDA runtime calls and selecting a device, shared by the engine's CUDA files
// (memory, streams, events). Only for builds with MMT_WITH_CUDA.
#pragma once

#if MMT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mmt::cuda {

// Throws CudaError "<what>[ of N bytes] failed: <runtime message>" unless status is success,
// clearing the runtime's sticky error first so later calls are not poisoned.
void check(cudaError_t status, const char* what, int64_t nbytes = -1);

// Makes `device` current for the calling thread while it lives (a thread's current device
// is per thread), then restores the previous one. It touches the current device only when
// it differs: since CUDA 12, cudaSetDevice creates that device's primary context, so setting
// "back" to a device the thread never chose (0 by default) would open a context there.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// The same for paths that must not throw (destructors, frees): runs fn() with `device`
// current, unchecked.
template <typename Fn>
void on_device_noexcept(int device, Fn&& fn) noexcept {
  int previous = device;
  cudaGetDevice(&previous);
  const bool change = previous != device;
  if (change) cudaSetDevice(device);
  fn();
  if (change) cudaSetDevice(previous);
}

}  // namespace mmt::cuda
#endif
