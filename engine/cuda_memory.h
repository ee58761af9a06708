// The engine's one seam to the CUDA runtime for memory: allocation, copies, fills.
// Every function throws CudaError with the runtime's message; in a build without CUDA they
// throw CudaError("mmtensor was built without CUDA ...") and device counts are 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mmt::cuda {

int device_count() noexcept;                       // 0 without a driver or device
void* malloc_device(int64_t nbytes, int device);   // cudaMalloc on `device`
void free_device(void* ptr, int device) noexcept;
void* malloc_host_pinned(int64_t nbytes);          // cudaHostAlloc
void free_host_pinned(void* ptr) noexcept;
// cudaMemcpy with cudaMemcpyDefault (unified addressing works out the direction).
void memcpy(void* dst, const void* src, int64_t nbytes);
void memset(void* dst, int value, int64_t nbytes, int device);

}  // namespace mmt::cuda
