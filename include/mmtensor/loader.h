// Loader: turns a Dataset into a stream of batches, in host memory or on a CUDA device, fast
// enough that the GPU never waits and with memory that does not grow with the dataset.
//
//   mmt::Loader loader(dataset, {.batch_size = 256, .sampler = {.kind = SamplerKind::Random,
//                                .seed = 7}, .num_workers = 4, .device = Device::parse("cuda:0")});
//   for (mmt::Batch& batch : loader) {               // one epoch; or: while (auto b = loader.next())
//     const mmt::Tensor& images = batch["image"];    // [256, 3, 224, 224] on cuda:0
//     ...                                            // queue work on the default stream
//   }                                                // each step releases the previous batch
//
// How it works. A staging ring of `prefetch_batches + 1` slots is allocated once, at exact
// size (batch_size rows a slot, or a rank's whole epoch when that is fewer), in pinned host
// memory (and, for a CUDA device, a device buffer per slot). Batch
// numbers are assigned to slots in order and each record index is a pure function of
// (sampler, seed, epoch, resume position, batch number, row), so the sequence never depends
// on the number of threads. Worker threads gather samples straight into the slot with
// Dataset::get_batch (fixed fields) or pack them (ragged fields), decoding compressed chunks
// through the dataset's chunk cache; a next() whose batch is not ready yet gathers that
// batch's unclaimed rows itself rather than sleep. When a batch is scheduled, a worker first
// hints its pages to the kernel (read_ahead, below), so that a cold file's reads for it are
// in flight while the batches before it are gathered. A filled slot is copied to its device
// buffer with cudaMemcpyAsync on a dedicated copy stream; an event per slot marks the copy
// done. The copy into a device buffer is ordered (on the GPU, without a host wait) after an
// event recorded on the consumer's stream when the previous batch in that buffer was
// released. So gathering batch k+1, copying batch k and the user's kernels on batch k-1
// overlap. Memory is bounded by the ring, the device buffers and the chunk cache budget.
//
// Batches. A fixed field comes back as one [B, ...shape] tensor in the field's storage order
// (a channels-last field gives a channels-last batch). A ragged field comes back packed:
// values (1-d, each sample's values in logical row-major order, one after the other),
// offsets (int64 [B+1], in elements) and shapes (int64 [B, ndim]). The tensors view the
// ring: they are valid until the Batch is released (destroyed, moved-from or release());
// clone() what must outlive it. The ring's packed ragged buffers are the one exception to
// "allocated once": a slot's buffer grows (rarely, geometrically) when a batch needs more.
//
// CUDA ordering. next() makes options.consumer_stream (by default the legacy default
// stream) wait for the batch's copy on the GPU, so kernels queued there may use the batch at
// once. Batch::wait(stream) does the same for another stream and adds that stream to those
// whose queued work must finish before the slot is reused (as record_stream does in
// PyTorch); Batch::synchronize() blocks the host. When a batch was used on several streams,
// its release makes each of them wait for the work queued on the ones before (one event
// marks the slot's reuse point), so later work on those streams starts after it. A stream
// of another device than the loader's is refused with CudaError (consumer_stream by the
// constructor, others by wait()): no event can mark that device's work on a slot done. If
// the wait cannot be queued, next() throws CudaError and the batch stays first in line:
// state() does not count it. The engine's own operations on a batch's device tensors
// (cpu(), clone(), to(), copy_()) are host-synchronous and run on the legacy default stream,
// which next() also makes wait for the copy; they are safe right away whatever the consumer
// stream. (So with a consumer stream of your own, work queued on the legacy stream after
// next() starts after that batch's copy. Your own in-place changes to a batch on your stream
// are not ordered before them: synchronize that stream first.) Every stream given as consumer_stream or to
// wait() must live until the batch is released (an event is recorded on it then), must
// not be cudaStreamPerThread unless the batch is released on its consumer thread (that
// handle means "this thread's stream"), and must not be capturing a CUDA graph at next()
// or release. Another thread may capture a graph (torch.cuda.graph, global mode) while the
// loader runs: its workers, and next()'s own gathering, use relaxed capture mode (a pinned
// cpu loader's too), so they neither break that capture nor are refused by it; the thread
// that captures must not call next() or release a batch meanwhile, and no thread should
// destroy the loader then (freeing its ring is a call that capture forbids). The loader
// allocates its ring
// with its device current; the thread that calls next() should have the loader's device
// current too (cudaSetDevice, or torch.cuda.set_device in a multi-GPU job): next() helps
// gather, which may grow a pinned buffer. Releasing and destroying may happen on any thread:
// they select the loader's device and select back only to a device whose context exists,
// so they open no context on device 0 (a thread that had chosen no device is left with the
// loader's). The loader's own workers select it. mmtensor links the CUDA runtime statically:
// in a process that also loads libcudart (PyTorch), streams, events and device pointers
// pass between the two (they belong to the driver), but each runtime keeps its own last
// error, and cudaDeviceReset through either invalidates the other's objects.
//
// Subsets. options.sampler.subset limits every epoch to a list of records (sampler.h), as
// torch.utils.data.Subset does: a training and a validation loader over one file. The
// batches' indices() are then the listed records; a state records the list's hash and size,
// and a resume with another list is refused.
//
// Mixtures. options.sampler.mixture draws every epoch from several sources in proportion to
// their weights, with an epoch size of its own (sampler.h): over a concatenation of datasets,
//   Dataset sources = Dataset::open_concat({"code.mmt", "web.mmt"});
//   Loader loader(sources, {.batch_size = 256, .sampler = {.kind = SamplerKind::Random,
//                 .mixture = Mixture::of_parts(sources, {0.3, 0.7}, 1'000'000)}});
// A state records the mixture's hash and epoch size, and a resume with another is refused.
//
// Epochs and resume. next() returns std::nullopt once at the end of an epoch and the loader
// moves on to the next epoch (prefetching it at once); set_epoch() jumps to any epoch.
// state() (or Batch::state()) after any batch, passed to Loader(dataset, options, state),
// continues the exact sequence, in the middle of an epoch too. After an epoch's last batch it
// stands at that epoch's end (the epoch, every position given up): resumed there, next()
// says nullopt, as the uninterrupted loader does, then runs the next epoch, and an epoch loop
// that saved its own epoch counter with the state resumes with set_epoch(that epoch), which
// stands at its end rather than repeating it. Once that nullopt is taken (or set_epoch() moves
// on), state() is the next epoch's start. Under distributed sampling
// the state follows sampler.h's resume rule, so a resume with another world size (elastic)
// sees every remaining sample of the epoch exactly once.
//
// Errors. Bad options throw ValueError (CudaError for an unavailable device) from the
// constructor. An error in a worker (a corrupt chunk, say) is rethrown by the next() that
// reaches that batch, with the same error type and a message naming the batch, sample,
// chunk and field; the loader then rethrows it until set_epoch() restarts it. Destroying a
// loader mid-epoch stops and joins its threads promptly; batches still held stay valid.
//
// Thread safety: one thread drives a Loader (next, set_epoch, state). A Batch may be
// released on any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/device.h"
#include "mmtensor/sampler.h"
#include "mmtensor/tensor.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*: pass a cudaStream_t or torch's stream.cuda_stream

namespace mmt {

inline constexpr int kMaxLoaderWorkers = 1024;
// Epochs run in [0, kMaxEpoch): the epoch after the last one must still be an int64. The last
// one, kMaxEpoch - 1, has none after it: once it ends, next() returns nullopt for good (its
// state() stands at its end, as every epoch's does after its last batch, and a loader resumes
// there), until set_epoch() moves the loader.
inline constexpr int64_t kMaxEpoch = INT64_MAX;

// Whether workers ask the kernel to read a batch's pages (Dataset::prefetch of the loaded
// fields) while earlier batches are gathered, so a cold file is read with all of a batch's
// reads in flight instead of one page fault at a time: several times faster at random from
// disk (bench/RESULTS.md). Not to be confused with prefetch_batches, the ring's depth: how
// many batches are gathered ahead, and so how far ahead their pages are hinted.
// Hints cost about a microsecond a record, which a warm file does not need, so Auto gives
// them only while the page cache misses: from the start, and again from any major page
// fault a gather takes, until eight hints in a row found their batch cached (Linux's
// per-thread read_bytes; without it, until the epoch ends). Always hints every batch; Never
// none. (ReadAhead is declared in dataset.h: Dataset::get_batch has its own, ReaderOptions.
// A loader's gathers use the loader's, never the dataset's.)

// A per-sample stage the loader's workers run: it fills one fixed-shape field of the batch
// from a record's stored fields, so that decoding (an encoded image in a bytes field),
// cropping or normalising happens on the workers, off the training thread, as a PyTorch
// Dataset's transform does in DataLoader workers and an FFCV pipeline's decoder does.
//
//   .transforms = {{.name = "image", .inputs = {"jpeg"}, .dtype = kUInt8, .shape = {3, 224, 224},
//                   .fn = [](const SampleTransform::Input& in, const Tensor& out) {
//                     decode_and_crop(in.fields[0], in.seed, out.mutable_data_ptr<uint8_t>());
//                   }}}
//
// fn is called once per sample, on any worker thread (or the consumer's, which helps), for
// several samples at once: it must be safe to call concurrently. It writes the sample's
// output into `out`, a contiguous [shape] tensor of `dtype` in the batch's staging buffer
// (whatever it leaves unwritten holds an earlier batch's bytes). `in.fields` are the record's
// `inputs`, in that order, as Dataset::get returns them: views into the mapped file or a
// decoded chunk, valid for the call (a ragged field's value has its own shape; a bytes field
// is 1-d uint8). They may be strided: a field stored channels-last comes as a [C, H, W]
// view with HWC strides, so call .contiguous() (which copies only then) before reading one
// as flat memory. `in.seed` is a 64-bit value fixed by (sampler seed, epoch, the sample's
// position in the epoch's order): seed an augmentation's random numbers with it and the
// batches are the same whatever the number of workers, and again after a resume. A padded
// position of distributed sampling (a record repeated to even the ranks out) has its own
// seed, so the repeat is augmented anew. Every transform of a sample gets the same seed
// (an image and its mask cropped alike); mix in a constant of your own for independent draws.
// An exception from fn reaches next() as mmt::Error naming the epoch, batch, sample and
// transform, with fn's exception nested (std::rethrow_if_nested gives it back); only
// std::bad_alloc passes through as it is.
// A transform as a C function, for callers outside C++: Python passes one compiled by numba
// (`@cfunc(sig)`, its .address) or loaded from a shared library (ctypes), so that per-sample
// work runs on the loader's threads without the GIL. Called as SampleTransform::fn is (once
// per sample, concurrently): inputs[i] points to input i's values, contiguous in row-major
// order (a strided view, such as a channels-last field, is copied first), input_shapes[i] to
// its input_ndims[i] dimensions; output to the sample's [shape] values of the transform's
// dtype, contiguous. seed and index are SampleTransform::Input's. It returns 0, or any other
// value to fail the sample: next() then throws mmt::Error naming the sample and the value.
// It must not call into Python: a ctypes callback around a Python function takes the GIL,
// which the thread that destroys the loader may hold while it waits for the workers.
extern "C" {
typedef int32_t (*mmt_transform_fn)(const uint8_t* const* inputs, const int64_t* const* input_shapes,
                                    const int32_t* input_ndims, int32_t num_inputs, uint8_t* output, uint64_t seed,
                                    int64_t index);
}

struct SampleTransform {
  // A transform whose fn calls `fn` as above (ValueError for a null fn).
  static SampleTransform from_c(std::string name, std::vector<std::string> inputs, ScalarType dtype, DimVector shape,
                                mmt_transform_fn fn);

  struct Input {
    int64_t index = 0;               // the record
    std::span<const Tensor> fields;  // its inputs, in SampleTransform::inputs order
    uint64_t seed = 0;
  };
  std::string name{};                // batch[name]: [B, ...shape]; may reuse an input's name
  std::vector<std::string> inputs{}; // the dataset fields fn reads, fixed or ragged
  ScalarType dtype = kFloat32;       // of the output
  DimVector shape{};                 // one sample's output; every dimension >= 1
  std::function<void(const Input& in, const Tensor& out)> fn{};
};

struct LoaderOptions {
  int64_t batch_size = 1;
  // The batch's fields: stored fields, loaded as they are stored, in this order. A name a
  // transform's output has means that output, not a stored field of the same name; outputs
  // come after the stored fields, and are in the batch whether listed or not (list only
  // outputs to load nothing as stored). Empty: every stored field but those a transform
  // takes over (reads, or replaces by an output of the same name), so adding a transform
  // keeps the rest of the batch (the labels) as it was.
  std::vector<std::string> fields{};
  // Batch fields made per sample on the workers (above).
  std::vector<SampleTransform> transforms{};
  SamplerOptions sampler{};         // kind, seed, quasi-random window, rank / world_size
  int64_t epoch = 0;                // the first epoch, in [0, kMaxEpoch)
  bool drop_last = false;           // drop this rank's final, partial batch of each epoch
  int num_workers = 1;              // background gather threads, 0..kMaxLoaderWorkers; 0 loads
                                    // each batch inside next(), on the caller's thread (as
                                    // PyTorch's num_workers=0: no threads, easiest to debug).
                                    // They live as long as the loader, across epochs (what
                                    // PyTorch's persistent_workers=True asks for), and start
                                    // each next epoch while its predecessor's last batch is used.
                                    // next() gathers rows of the batch it waits for too, so on
                                    // C cores C - 1 workers keep every core busy; more share
                                    // the cores and run slower on warm, uncompressed data
                                    // (2 workers on 2 cores: 0.7-0.9 of 1 worker's rate,
                                    // bench/RESULTS.md). Decoding or transforms may want more.
  int prefetch_batches = 3;         // batches prepared ahead, 1..1024; the ring has this + 1 slots
  Device device = kCPU;             // cpu, or cuda:N for batches on that device
  bool pin_memory = true;           // cpu batches in page-locked memory (always for cuda);
                                    // without a CUDA device, ordinary memory and a note on
                                    // stderr, once (MMT_QUIET=1 silences it), as PyTorch warns
  // cuda: copy fixed fields of 16 KB or more a record (images) in uncompressed chunks from the
  // dataset's file mapping straight to the device, with no gather on the host (smaller fields
  // are gathered as without it): one batched DMA a batch (cudaMemcpyBatchAsync; a cudaMemcpyAsync
  // a run of adjacent records where the driver refuses it). The loader page-locks the whole
  // mapping of each of its files when it is made (cudaHostRegister, read-only; shared with other
  // loaders over the same files, undone by the last one): that reads every page into memory,
  // as fast as the page cache or the disk gives them, and keeps them there while the loader
  // lives (where the device reads host page tables, as on Grace Hopper, CUDA only populates
  // them), so the files must fit in RAM beside everything else (CudaError naming the file
  // otherwise, or the device attribute it lacks; nothing is locked when no field qualifies). Rows of compressed chunks, ragged
  // fields and transform outputs are gathered into the pinned ring as without it. On an H200,
  // batches of 150 KB images reach 0.95 of the rate of one pinned cudaMemcpyAsync of as many
  // bytes from 1 to 14 workers, against 0.78-0.81 gathered on 14 (bench/RESULTS.md). The
  // copies are the CUDA driver's reads of the mapping, outside the engine's guard: a file cut
  // short by another program under such a loader kills the process with SIGBUS, as a numpy
  // memmap would (seen on an H200; docs/RELIABILITY.md). ValueError for a cpu loader.
  bool pin_mapping = false;
  CUstream_st* consumer_stream = nullptr;  // cuda: the stream next() orders batches before
  ReadAhead read_ahead = ReadAhead::Auto;
  // The longest next() waits for its batch (as DataLoader's timeout): past it, next() throws
  // IoError (errno ETIMEDOUT) naming the batch, and the batch stays first in line, so a later
  // next() goes on waiting for it. 0 (or milliseconds::max()): no limit. The limit is checked while next() waits for
  // the workers; rows it gathers itself meanwhile are not cut short (a read cannot be).
  std::chrono::milliseconds timeout{0};
};

struct LoaderStats {
  // Read-ahead hints given: at most one a batch (counting the next epoch's first batches,
  // prefetched while the last ones are used). A hint may also come while its batch is gathered.
  int64_t batches_read_ahead = 0;
  bool reading_ahead = false;  // whether batches scheduled now are hinted
};

// Where a loader stands; see sampler.h for the meaning of `consumed` (positions of the
// epoch's global order taken by all ranks together). Serialisable as one line of JSON.
struct LoaderState {
  // 2: random and quasi-random orders are uniform shuffles (sampler.h), and the seed is a hex
  // string. 3: a subset may be given (subset_hash, subset_size); the orders are version 2's.
  // 4: a mixture may be given (mixture_hash, mixture_size). 5: the state stands in the middle
  // of an epoch whose order shuffles some run of 5 to 8 entries (shuffles_five_to_eight),
  // which version 5 shuffles by a table, exactly uniform, where earlier versions' network was
  // measurably not. to_string() writes the oldest version that holds the state: 2 without a
  // subset or mixture, so that builds from before subsets resume it, 3 with a subset, 4 with a
  // mixture and 5 with shuffles_five_to_eight, which older builds refuse by its version rather
  // than misread. parse() reads versions 1 to 5; of version 1, not a state in the middle of a
  // random or quasi-random epoch, whose order this build no longer makes (ValueError says so).
  static constexpr int kVersion = 5;

  SamplerKind sampler = SamplerKind::Sequential;
  uint64_t seed = 0;           // in the JSON, a hex string as chunk_layout
  int64_t window_chunks = 0;  // the quasi-random window the order was made with
  int64_t records = 0;        // the dataset's size: a resume on a dataset of another size is refused
  int64_t epoch = 0;
  int64_t consumed = 0;       // in [0, records], or [0, subset_size] / [0, mixture_size]
  // Sampler::chunk_layout_hash() of the order (QuasiRandom), 0 otherwise: a resume on a file
  // with the same records in other chunks is refused. A state without it (0) is not checked.
  // In the JSON, a hex string ("0x..."): readers that hold numbers as doubles keep it exact.
  uint64_t chunk_layout = 0;
  // Dataset::fingerprint() of the dataset the state was saved on: a resume on another dataset
  // of the same size (val.mmt for train.mmt), or the same one re-packed, is refused. 0 (states
  // written before it existed, or cleared by a user who means to resume on a re-packed copy)
  // is not checked. In the JSON, a hex string as chunk_layout.
  uint64_t dataset_fingerprint = 0;
  // With a subset (SamplerOptions::subset): Sampler::subset_hash() and the subset's size; a
  // resume with another subset, or none, is refused. 0 and 0 without one (to_string() writes
  // neither when subset_hash is 0). In the JSON, subset_hash is a hex string as chunk_layout.
  uint64_t subset_hash = 0;
  int64_t subset_size = 0;
  // With a mixture (SamplerOptions::mixture): Sampler::mixture_hash() and the epoch size; a
  // resume with another mixture, or none, is refused. 0 and 0 without one, as the subset's.
  uint64_t mixture_hash = 0;
  int64_t mixture_size = 0;
  // True in the middle of an epoch (0 < consumed < its size) whose order shuffles a run of 5 to
  // 8 entries (EpochOrder::shuffles_five_to_eight()): a Loader's state() sets it, parse()
  // reads it from a version-5 state. A Loader refuses to resume in the middle of such an epoch
  // by a state without it: an older build made that order otherwise, and the rest of the epoch
  // would repeat some records and skip others.
  bool shuffles_five_to_eight = false;

  std::string to_string() const;
  // The inverse of to_string(); throws ValueError naming the missing or malformed entry.
  static LoaderState parse(std::string_view text);
  friend bool operator==(const LoaderState&, const LoaderState&) = default;
};

namespace detail {
struct LoaderCore;
}

// A batch on loan from its loader: move-only; returns its ring slot when released.
class Batch {
 public:
  Batch() = default;
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() { release(); }

  bool valid() const { return core_ != nullptr; }
  int64_t size() const { return rows_; }       // rows: batch_size, or fewer in a last batch
  int64_t epoch() const { return epoch_; }
  // Batch number within this rank's epoch, counted from where the loader started it: the
  // epoch's first batch, or the batch a resume (Loader(..., state)) began with.
  int64_t number() const { return number_; }
  Device device() const { return device_; }
  // The record index of each row (host memory, valid until release).
  std::span<const int64_t> indices() const&;
  // The loader's state just after this batch: resume with it to continue after it.
  const LoaderState& state() const& { return state_after_; }
  LoaderState state() const&& { return state_after_; }  // a copy, from a batch about to go

  // A fixed field's [B, ...] tensor, or a ragged field's packed values. ValueError for a
  // field the loader does not load (the message lists those it does).
  const Tensor& operator[](std::string_view field) const&;
  bool is_ragged(std::string_view field) const;
  const RaggedBatch& ragged(std::string_view field) const&;  // ValueError for a fixed field
  // Not on a Batch about to be released (`(*loader.next())["image"]`, one line): what they
  // return views the batch's ring slot, which the loader refills once the batch is gone.
  // Name the batch (`auto batch = loader.next();`) for as long as its tensors are used. The
  // compiler cannot catch `loader.next()->ragged("x")` (operator-> gives an lvalue): that
  // one-liner dangles just the same.
  const Tensor& operator[](std::string_view field) const&& = delete;
  const RaggedBatch& ragged(std::string_view field) const&& = delete;
  std::span<const int64_t> indices() const&& = delete;
  // The batch's fields, in order: the loaded stored fields, then the transforms' outputs.
  // ValueError for a released batch.
  const std::vector<std::string>& field_names() const;

  // CUDA: makes `stream` wait for this batch's copy (no host wait) and adds it to the
  // streams whose queued work must finish before the slot is reused. A no-op on cpu: a
  // pinned cpu batch that the caller copies to a GPU asynchronously must see that copy done
  // (synchronize its stream) before the batch is released, since the slot is refilled at
  // once; with device cuda the loader does the copy and orders the reuse itself.
  void wait(CUstream_st* stream);
  // CUDA: the host waits until the batch is on the device. A no-op on cpu.
  void synchronize() const;
  // Gives the slot back now (the destructor does it otherwise). Never throws.
  void release() noexcept;

 private:
  friend struct detail::LoaderCore;
  size_t field_position(std::string_view field) const;

  std::shared_ptr<detail::LoaderCore> core_;
  int slot_ = -1;
  int64_t rows_ = 0;
  int64_t epoch_ = 0;
  int64_t number_ = 0;
  Device device_;
  // Where release() records the slot's reuse point: options.consumer_stream, and any other
  // stream passed to wait() (empty unless there was one: no allocation per batch).
  CUstream_st* consumer_stream_ = nullptr;
  std::vector<CUstream_st*> other_streams_;
  LoaderState state_after_;
  std::vector<RaggedBatch> fields_;  // fixed fields use .values only
};

class Loader {
 public:
  // Starts the workers and begins prefetching options.epoch. Throws ValueError (bad batch
  // size, workers, prefetch, unknown field, sampler options), CudaError (device missing or
  // CUDA not built in). The first loader of a Dataset reads its chunk table once (64 bytes a
  // chunk) for the fingerprint its states record.
  Loader(Dataset dataset, LoaderOptions options);
  // Resumes where `state` was taken: the state's epoch and position are used, and
  // options.epoch is ignored; a quasi-random window_chunks of 0 adopts the state's. Throws
  // ValueError when the state does not belong to this dataset and sampler (records, dataset
  // fingerprint, kind, seed, subset, window or quasi-random chunk layout differ).
  Loader(Dataset dataset, LoaderOptions options, const LoaderState& state);
  Loader(Loader&&) noexcept;
  Loader& operator=(Loader&&) noexcept;
  ~Loader();  // stops and joins the workers; batches still held stay valid

  // The next batch of the epoch, or std::nullopt at its end (the loader then moves to the
  // next epoch). Blocks until the batch is gathered (and its copy queued). Throws a worker's
  // error for the batch it hit; ValueError when every slot is held by live batches (release
  // one or raise prefetch_batches) instead of waiting forever.
  std::optional<Batch> next();
  // The same, calling poll() about every kPollInterval while next() waits for the batch or
  // gathers it, and once more before a batch it waited for leaves the queue, without the
  // loader's lock held: a binding's way to answer Ctrl-C during a long gather. An exception
  // from poll() leaves next() at once, with the batch still first in line: nothing is lost or
  // counted in state(). poll() may call state(), but not next(), set_epoch() or anything else
  // that moves this loader.
  static constexpr std::chrono::milliseconds kPollInterval{20};
  std::optional<Batch> next(const std::function<void()>& poll);

  // Range-for over the rest of the current epoch: for (mmt::Batch& batch : loader) {...}.
  // Each step releases the previous batch before taking the next one. An iterator stays in
  // the epoch it began in: once that epoch has ended some other way (an inner loop over the
  // loader took its last batch) or set_epoch() was called (to this epoch too), it is at its
  // end, rather than running on into the next epoch or through the restarted one.
  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    Batch& operator*() const { return *current_; }
    Batch* operator->() const { return &*current_; }
    Iterator& operator++();
    void operator++(int) { ++*this; }
    friend bool operator==(const Iterator& it, std::default_sentinel_t) { return !it.current_; }

   private:
    friend class Loader;
    explicit Iterator(Loader* loader);
    Loader* loader_ = nullptr;
    int64_t epoch_ = 0;  // the epoch this iterator runs through
    uint64_t set_epoch_calls_ = 0;  // the loader's set_epoch() calls when it began
    mutable std::optional<Batch> current_;
  };
  Iterator begin() { return Iterator(this); }
  std::default_sentinel_t end() { return {}; }

  // Restarts at the beginning of `epoch`. A no-op when the loader is already there with no
  // batch taken since it was made or restarted, so a loader resumed mid-epoch from a state
  // keeps its position through the set_epoch(state.epoch) an epoch loop starts with.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;
  // Batches this rank yields in the current epoch, from where the epoch was started/resumed.
  int64_t batches_in_epoch() const;
  // Where the loader stands after the last batch next() returned.
  LoaderState state() const;
  const Sampler& sampler() const;
  // The options as given, so that Loader(dataset, loader.options(), state) resumes as this
  // loader's own options would (a quasi-random window_chunks of 0 adopts the state's);
  // sampler().options() has them resolved (the automatic window).
  const LoaderOptions& options() const;
  int ring_slots() const;
  int64_t ring_bytes() const;  // host staging ring (the fixed part), in bytes
  LoaderStats stats() const;

 private:
  std::shared_ptr<detail::LoaderCore> core_;
};

}  // namespace mmt
