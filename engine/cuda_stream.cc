#include "cuda_stream.h"

#include <utility>
#include <vector>

#include "cuda_check.h"
#include "cuda_memory.h"
#include "mmtensor/error.h"

#if MMT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mmt::cuda {

#if MMT_WITH_CUDA
namespace {

// Streams and events belong to the device current when they are made: every call selects
// the object's device with DeviceGuard or on_device_noexcept (cuda_check.h).
void check_device(int device) {
  MMT_CHECK(device >= 0 && device < device_count(), CudaError, "cuda:", device,
            " is not available (", device_count(), " CUDA device(s) found)");
}

}  // namespace

Stream Stream::create(int device) {
  check_device(device);
  DeviceGuard current(device);
  Stream out;
  check(cudaStreamCreateWithFlags(&out.stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  out.device_ = device;
  return out;
}

Stream::~Stream() {
  if (stream_) on_device_noexcept(device_, [&] { cudaStreamDestroy(stream_); });
}

void Stream::synchronize() const {
  if (!stream_) return;
  DeviceGuard current(device_);
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

Event Event::create(int device) {
  check_device(device);
  DeviceGuard current(device);
  Event out;
  check(cudaEventCreateWithFlags(&out.event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  out.device_ = device;
  return out;
}

Event::~Event() {
  if (event_) on_device_noexcept(device_, [&] { cudaEventDestroy(event_); });
}

void Event::record(CUstream_st* stream) const {
  DeviceGuard current(device_);
  check(cudaEventRecord(event_, stream), "cudaEventRecord");
}

void Event::make_stream_wait(CUstream_st* stream) const {
  DeviceGuard current(device_);
  check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

void Event::synchronize() const {
  if (!event_) return;
  DeviceGuard current(device_);
  check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

bool Event::is_complete() const {
  DeviceGuard current(device_);
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    // "Not ready" is an answer, but the runtime records it as the thread's last error: clear
    // it, as PyTorch does after its queries, or the caller's next check would report it.
    cudaGetLastError();
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}

void copy_to_device_async(void* device_dst, const void* host_src, int64_t nbytes,
                          const Stream& stream) {
  if (nbytes == 0) return;
  DeviceGuard current(stream.device());
  check(cudaMemcpyAsync(device_dst, host_src, static_cast<size_t>(nbytes), cudaMemcpyHostToDevice,
                        stream.get()),
        "cudaMemcpyAsync (host to device)");
}

void copy_to_host_async(void* host_dst, const void* device_src, int64_t nbytes,
                        const Stream& stream) {
  if (nbytes == 0) return;
  DeviceGuard current(stream.device());
  check(cudaMemcpyAsync(host_dst, device_src, static_cast<size_t>(nbytes), cudaMemcpyDeviceToHost,
                        stream.get()),
        "cudaMemcpyAsync (device to host)");
}

void copy_runs_to_device_async(std::span<const CopyRun> runs, const Stream& stream) {
  if (runs.empty()) return;
  DeviceGuard current(stream.device());
  const auto one_by_one = [&] {
    for (const CopyRun& run : runs)
      if (run.bytes > 0)
        check(cudaMemcpyAsync(run.dst, run.src, run.bytes, cudaMemcpyHostToDevice, stream.get()),
              "cudaMemcpyAsync (host to device)");
  };
  // Scratch kept per thread: a loader's workers queue a batch every millisecond or so. The
  // sources go as void*: CUDA 12.8 declared them so (12.9 made them const), and void** passes
  // for const void* const* too.
  thread_local std::vector<void*> dsts;
  thread_local std::vector<void*> srcs;
  thread_local std::vector<size_t> sizes;
  dsts.clear();
  srcs.clear();
  sizes.clear();
  for (const CopyRun& run : runs) {
    if (run.bytes == 0) continue;  // the batch call refuses empty copies
    dsts.push_back(run.dst);
    srcs.push_back(const_cast<void*>(run.src));
    sizes.push_back(run.bytes);
  }
  if (dsts.empty()) return;
  // The sources are read in stream order: a registered mapping stays valid until the loader
  // has waited for the stream, and a pinned slot is refilled only after its copy's event.
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attributes_index = 0;
#if CUDART_VERSION >= 13000
  const cudaError_t status = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(),
                                                  &attributes, &attributes_index, 1, stream.get());
#else  // 12.8 and 12.9 (CMakeLists.txt's MMT_MIN_CUDA): an index of the copy that failed, too
  size_t failed_index = 0;
  const cudaError_t status = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(),
                                                  &attributes, &attributes_index, 1, &failed_index, stream.get());
#endif
  if (status == cudaErrorNotSupported || status == cudaErrorCallRequiresNewerDriver) {
    cudaGetLastError();  // a driver without batched copies: the same copies one by one
    one_by_one();
    return;
  }
  check(status, "cudaMemcpyBatchAsync (host to device)");
}

int stream_device(CUstream_st* stream) noexcept {
  // The default-stream handles: cudaStreamGetDevice answers the caller's current device for
  // them, but they name that stream of the device they are used on.
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return -1;
  int device = -1;
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess) {
    cudaGetLastError();  // an unanswered question, not an error for the caller's next check
    return -1;
  }
  return device;
}

void relax_stream_capture_on_this_thread() noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) cudaGetLastError();  // no driver: nothing to relax
}

ScopedRelaxedStreamCapture::ScopedRelaxedStreamCapture() noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess) previous_ = static_cast<int>(mode);
  else cudaGetLastError();
}

ScopedRelaxedStreamCapture::~ScopedRelaxedStreamCapture() {
  if (previous_ < 0) return;
  cudaStreamCaptureMode mode = static_cast<cudaStreamCaptureMode>(previous_);
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) cudaGetLastError();
}

#else  // built without CUDA

Stream Stream::create(int) { throw_built_without_cuda("creating a CUDA stream"); }
Stream::~Stream() = default;
void Stream::synchronize() const {}
Event Event::create(int) { throw_built_without_cuda("creating a CUDA event"); }
Event::~Event() = default;
void Event::record(CUstream_st*) const { throw_built_without_cuda("recording a CUDA event"); }
void Event::make_stream_wait(CUstream_st*) const { throw_built_without_cuda("waiting on a CUDA event"); }
void Event::synchronize() const {}
bool Event::is_complete() const { return true; }
void copy_to_device_async(void*, const void*, int64_t, const Stream&) {
  throw_built_without_cuda("copying to a CUDA device");
}
void copy_to_host_async(void*, const void*, int64_t, const Stream&) {
  throw_built_without_cuda("copying from a CUDA device");
}
void copy_runs_to_device_async(std::span<const CopyRun>, const Stream&) {
  throw_built_without_cuda("copying to a CUDA device");
}
int stream_device(CUstream_st*) noexcept { return -1; }
void relax_stream_capture_on_this_thread() noexcept {}
ScopedRelaxedStreamCapture::ScopedRelaxedStreamCapture() noexcept = default;
ScopedRelaxedStreamCapture::~ScopedRelaxedStreamCapture() = default;

#endif

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream doomed(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event doomed(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

}  // namespace mmt::cuda
