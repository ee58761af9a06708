// The engine's one seam to the CUDA runtime for memory: allocation, copies, fills.
// Every function throws CudaError with the runtime's message; in a build without CUDA they
// throw CudaError("mmtensor was built without CUDA ...") and device counts are 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mmt::cuda {

int device_count() noexcept;                       // 0 without a driver or device
std::string unavailable_reason();                   // why device_count() is 0; "" when it is not
// Makes `device` the calling thread's current device for good: for threads the engine owns,
// so that every CUDA call they make (including those that take no device) uses its context.
void use_device(int device);
// The calling thread's current device (cudaGetDevice), or -1 when there is none to ask.
int current_device() noexcept;
// cudaDeviceSynchronize on `device`, unchecked: the last resort of paths that must not throw.
void synchronize_device_noexcept(int device) noexcept;
void* malloc_device(int64_t nbytes, int device);   // cudaMalloc on `device`
void free_device(void* ptr, int device) noexcept;
// cudaHostAlloc, with `device` current when >= 0 (else the thread's current device, whose
// context it opens). When the runtime cannot pin (no memory to pin, the device unavailable
// or in exclusive use, a process forked after CUDA started) it returns nullptr and says why
// in *cannot_pin; any other failure (a sticky error of an earlier kernel) throws CudaError.
void* malloc_host_pinned(int64_t nbytes, int device, std::string* cannot_pin);
void free_host_pinned(void* ptr) noexcept;
// cudaMemcpy with cudaMemcpyDefault (unified addressing works out the direction), issued
// with `device` current: the CUDA side's device (the destination's when both are), so the
// copy runs on that device's legacy default stream, which the loader orders batches before.
// Both return once the work is done on the device (host-synchronous in every direction).
void memcpy(void* dst, const void* src, int64_t nbytes, int device);
void memset(void* dst, int value, int64_t nbytes, int device);

}  // namespace mmt::cuda
