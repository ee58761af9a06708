// Checking CUDA runtime calls and selecting a device, shared by the engine's CUDA files
// (memory, streams, events). In a build without CUDA, only the error every call raises.
#pragma once

#if MMT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mmt::cuda {

// Throws CudaError "<what>[ of N bytes] failed: <runtime message>" unless status is success,
// clearing the thread's last error (this failure) first. A sticky error (an illegal address)
// stays: nothing but a new process clears it.
void check(cudaError_t status, const char* what, int64_t nbytes = -1);

// Whether `device`'s primary context exists already (cuDevicePrimaryCtxGetState, reached
// through the runtime's driver entry points; true when that cannot be asked).
bool primary_context_active(int device) noexcept;

// Makes `device` current for the calling thread while it lives (a thread's current device
// is per thread), then restores the previous one. It touches the current device only when
// it differs, and restores it only when that device's primary context exists: since CUDA
// 12, cudaSetDevice creates the context, so setting "back" to a device the thread never
// chose (0 by default) would open one there (0.3-0.5 GiB on GPU 0 for every process of a
// multi-GPU job). PyTorch's guards avoid that context too, and also remember the device its
// code should see; mmtensor cannot, so such a thread is left with `device` current.
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
  if (change && primary_context_active(previous)) cudaSetDevice(previous);
}

}  // namespace mmt::cuda
#else  // built without CUDA

#include "mmtensor/error.h"

namespace mmt::cuda {

// Throws CudaError "<what>: mmtensor was built without CUDA (...how to build it with CUDA)".
[[noreturn]] inline void throw_built_without_cuda(const char* what) {
  throw CudaError(detail::str(what, ": mmtensor was built without CUDA (configure with the "
                                    "CUDA Toolkit installed, or -DMMT_WITH_CUDA=ON)"));
}

}  // namespace mmt::cuda
#endif
