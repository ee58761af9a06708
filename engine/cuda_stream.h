// The loader's seam to the CUDA runtime for ordering work: streams, events and asynchronous
// host-to-device copies (memory itself goes through cuda_memory.h).
//
// Handles are opaque (CUstream_st* is cudaStream_t without the CUDA headers), so tests and
// benchmarks built without the CUDA include path can use them. Every call throws CudaError
// with the runtime's message; in a build without CUDA, creating a Stream or an Event throws
// CudaError("... mmtensor was built without CUDA ...").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace mmt::cuda {

// An owned stream on one device. It does not synchronise with the legacy default stream,
// so a copy on it overlaps the user's kernels; ordering is by events only.
class Stream {
 public:
  Stream() = default;  // no stream
  static Stream create(int device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  CUstream_st* get() const { return stream_; }
  int device() const { return device_; }
  explicit operator bool() const { return stream_ != nullptr; }
  void synchronize() const;  // the host waits for everything queued on it

 private:
  CUstream_st* stream_ = nullptr;
  int device_ = 0;
};

// An owned event without timing (the cheapest kind to record and wait on). An event never
// recorded counts as complete, as in CUDA.
class Event {
 public:
  Event() = default;
  static Event create(int device);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  explicit operator bool() const { return event_ != nullptr; }
  // Marks the point reached by `stream` (nullptr: the legacy default stream).
  void record(CUstream_st* stream) const;
  // Makes `stream` wait for the last record of this event, without blocking the host.
  void make_stream_wait(CUstream_st* stream) const;
  void synchronize() const;  // the host waits for the last record
  bool is_complete() const;  // cudaEventQuery

 private:
  CUevent_st* event_ = nullptr;
  int device_ = 0;
};

// The device `stream` belongs to (cudaStreamGetDevice), or -1 when the runtime cannot say:
// a default stream handle (nullptr, cudaStreamLegacy, cudaStreamPerThread), which names that
// stream of whichever device is current where it is used (the engine uses it on its own
// device: torch passes 1 for cuda:1's legacy stream whatever the thread's current device),
// or a runtime or driver without the query. Never throws: callers use it to refuse a stream
// of a device other than the one they work on.
int stream_device(CUstream_st* stream) noexcept;

// CUDA graph capture in cudaStreamCaptureModeGlobal (torch.cuda.graph's default) on one
// thread makes the runtime refuse "potentially unsafe" calls on every other thread
// (cudaEventSynchronize, cudaMalloc...), and such a call invalidates that capture. The
// loader's workers never capture: they run in relaxed mode, so a user capturing a step while
// they prefetch is neither broken by them nor breaks them. The consumer thread's own helping
// (a piece gathered inside next()) runs in relaxed mode too, for its duration.
void relax_stream_capture_on_this_thread() noexcept;
class ScopedRelaxedStreamCapture {
 public:
  ScopedRelaxedStreamCapture() noexcept;
  ~ScopedRelaxedStreamCapture();
  ScopedRelaxedStreamCapture(const ScopedRelaxedStreamCapture&) = delete;
  ScopedRelaxedStreamCapture& operator=(const ScopedRelaxedStreamCapture&) = delete;

 private:
  int previous_ = -1;  // the thread's cudaStreamCaptureMode before, or -1 when not changed
};

// cudaMemcpyAsync host -> device on `stream`; `host` should be pinned for the copy to be
// truly asynchronous (pageable memory makes the runtime stage it synchronously).
void copy_to_device_async(void* device_dst, const void* host_src, int64_t nbytes,
                          const Stream& stream);
// The same device -> host, for tests and tools.
void copy_to_host_async(void* host_dst, const void* device_src, int64_t nbytes,
                        const Stream& stream);

// One host -> device copy of a batch: `bytes` from `src` (pinned, or page-locked by
// HostRegistration) to `dst` on the stream's device.
struct CopyRun {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};
// Queues `runs` on `stream` with one cudaMemcpyBatchAsync (a driver that refuses the call gets
// one cudaMemcpyAsync a run). A batch
// of a few hundred records from a registered mapping goes at the speed of one copy of as many
// contiguous pinned bytes; a cudaMemcpyAsync a record reaches about half that (bench/RESULTS.md).
void copy_runs_to_device_async(std::span<const CopyRun> runs, const Stream& stream);

}  // namespace mmt::cuda
