// The loader against what it is built from, measured in the same run (issue 5).
//   BM_LoaderVsGetBatch/threads/side: one epoch of the loader (random order, uncompressed,
//     warm, batch 256 of uint8 [3, side, side] images)
//     against Dataset::get_batch alone on the same indices with the same thread count.
//     vs_get_batch = time(get_batch) / time(loader): the pipeline's cost; target >= 0.9.
//     Run with threads 1 and 2: loader_samples_per_s shows the scaling.
//   BM_LoaderTransform/threads/side: one epoch (random, uncompressed, warm, batch 256) whose
//     uint8 [3, side, side] images become normalised float32 on the loader's workers (a
//     SampleTransform: (x / 255 - 0.5) / 0.25), against the consumer doing it: get_batch of
//     the images on one thread, then the same arithmetic on the batch. vs_consumer =
//     time(consumer) / time(loader): what moving the work off the training thread gives.
//     With 1 worker the consumer's thread helps gather, so the loader has two threads
//     against the reference's one; the stage's own cost per sample (get(), the call, a row
//     view) is in bench/RESULTS.md, measured apart. c_function:1 gives the stage as a C
//     function (SampleTransform::from_c, what Python's mmtensor.Transform passes).
//   BM_LoaderToDevice/workers: host-to-device throughput of the loader (cuda:0, warm,
//     uncompressed [3, 224, 224] uint8 records, batch 256) against pinned cudaMemcpyAsync of
//     the same batch bytes on one stream. vs_pinned_memcpy = loader bytes/s / memcpy bytes/s;
//     target >= 0.9. batches_per_s compares with bench/peer_dataloader.py (PyTorch
//     DataLoader(pin_memory=True) over np.memmap, same shape and batch size): target >= 3x.
//     Skips itself without a CUDA device. streaming:1 is the default (values of 16 KB and
//     more bound for the device go with non-temporal stores, engine/streaming_copy.h),
//     streaming:0 gathers with memcpy; prefetch: batches in flight. pin_mapping:1 copies the
//     records from the page-locked file mapping with no host gather (LoaderOptions::pin_mapping);
//     make_loader_ms is then the page-locking of the 1.2 GB file, done when a loader is made.
//     process_cores_busy: the process's CPU time (every thread) over the timed epochs' wall time.
//   BM_LoaderColdRandom/record_bytes: the loader reading a cold file at random (2 workers,
//     batch 256, uncompressed; the file's pages dropped from the page cache before each pass,
//     the dataset opened after), with read_ahead Auto against Never, alternated in each
//     round: vs_never = time(Never) / time(Auto). read_amplification = bytes read from
//     storage / bytes delivered (the kernel's read-around can read megabytes for one small
//     record). 784-byte records (Fashion-MNIST size, 600,000 of them: 500 MB) and 150 KB
//     records (3x224x224, 8,192: 1.2 GB); 40 and 16 batches a pass. Skips itself where the
//     temporary folder keeps files in memory (tmpfs: nothing to evict).
//   BM_LoaderColdRandomTokens: the same for a ragged field: 200,000 documents of 16..4096
//     int32 tokens (580 MB, 1 MiB chunks), 20 batches a pass. A random batch touches about
//     one chunk a document, and each chunk's ragged section must be located before its
//     document's place is known.
//   BM_LoaderTokensSequential: one epoch of a ragged int32 token field (documents of 16..4096
//     tokens, log-uniform, 1 MiB chunks, uncompressed, warm) through the loader in sequential
//     order, batch 256, one worker, against memcpy of each batch's tokens as one contiguous
//     block (what a flat token array with offsets costs). vs_memcpy = time(memcpy) /
//     time(loader).
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cold_reads.h"
#include "cuda_stream.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/loader.h"
#include "page_cache.h"
#include "streaming_copy.h"

namespace {

using namespace mmt;
using namespace mmt::bench;

// CIFAR-sized records (3 KB: per-batch overheads show) and 48 KB records (bandwidth shows).
const Dataset& host_dataset(int64_t side) {
  if (side == 32) {
    static BenchDataset small("host32", 8192, {3, 32, 32});  // 24 MB
    return small.dataset();
  }
  static BenchDataset large("host128", 2048, {3, 128, 128});  // 96 MB
  return large.dataset();
}

const Dataset& device_dataset() {
  // 147 KB records, 1.2 GB: 32 batches an epoch, so the pipeline's drain at each epoch's
  // end (the next epoch is scheduled once its predecessor's last batch is out) is a small
  // part of the time, as it is in training.
  static BenchDataset data("device", 8192, {3, 224, 224});
  return data.dataset();
}

// `documents` documents of 16..4096 int32 tokens (log-uniform lengths, about 2.9 KB on
// average), in 1 MiB chunks, uncompressed; the same lengths in every run.
void write_token_documents(const std::string& path, int64_t documents) {
  WriterOptions options;
  options.chunk_bytes = 1 << 20;
  DatasetWriter writer =
      DatasetWriter::create(path, Schema({Field::ragged("tokens", kInt32, {kVariableDim})}), options);
  std::mt19937_64 random(20240607);
  std::uniform_real_distribution<double> log_length(std::log(16.0), std::log(4096.0));
  for (int64_t i = 0; i < documents; ++i) {
    Tensor doc = empty({static_cast<int64_t>(std::exp(log_length(random)))}, kInt32);
    int32_t* values = doc.mutable_data_ptr<int32_t>();
    for (int64_t t = 0; t < doc.numel(); ++t) values[t] = static_cast<int32_t>(i + t);
    writer.append({doc});
  }
  writer.finish();
}

// 20,000 documents, about 58 MB of tokens.
const Dataset& token_dataset() {
  static BenchDataset tokens("tokens", [](const std::string& path, int64_t) { write_token_documents(path, 20000); });
  return tokens.dataset();
}

// 200,000 documents, about 580 MB, for cold reads: a random batch touches about one 1 MiB
// chunk a document.
const Dataset& cold_token_dataset() {
  static BenchDataset tokens("cold-tokens", [](const std::string& path, int64_t) { write_token_documents(path, 200000); });
  return tokens.dataset();
}

constexpr int64_t kHostBatch = 256;
const std::string kFields[] = {"image", "label"};

// Steady state, measured without bias: each round makes a loader, runs one warm-up epoch,
// then times `epochs` more without a pause (the ring is as full at the end of the window as
// at its start), and is destroyed before the reference runs, so that its prefetching of
// the next epoch neither steals the reference's CPU nor gives the loader free batches.
struct Timed {
  double seconds = 0;
  int64_t batches = 0;
  int64_t samples = 0;
  std::vector<int64_t> indices;  // in the order they came
};

Timed time_loader_epochs(const Dataset& dataset, const LoaderOptions& options, int epochs,
                         CUstream_st* consumer_stream, const cuda::Stream* sync_stream) {
  Loader loader(dataset, options);
  auto drain = [&](Timed* timed) {
    std::optional<Batch> held;  // hold one batch while taking the next, as a training step does
    while (std::optional<Batch> batch = loader.next()) {
      if (consumer_stream) batch->wait(consumer_stream);
      benchmark::DoNotOptimize(batch->indices().data());
      if (timed) {
        timed->indices.insert(timed->indices.end(), batch->indices().begin(), batch->indices().end());
        ++timed->batches;
        timed->samples += batch->size();
      }
      held = std::move(batch);
    }
  };
  drain(nullptr);
  Timed timed;
  timed.indices.reserve(static_cast<size_t>(dataset.size() * epochs));
  const double t0 = now_seconds();
  for (int e = 0; e < epochs; ++e) drain(&timed);
  if (sync_stream) sync_stream->synchronize();
  timed.seconds = now_seconds() - t0;
  return timed;
}

// The rounds of a loader benchmark: each times `epochs` loader epochs, then `reference` (given
// the loader's indices, in the order they came) right after it. Returns the median of
// reference time / loader time; adds the loader's time and samples to the totals.
struct LoaderRounds {
  double median_ratio = 0;
  double loader_seconds = 0;
  int64_t samples = 0;
};

template <typename Reference>
LoaderRounds run_loader_rounds(benchmark::State& state, const Dataset& dataset, const LoaderOptions& options,
                               int epochs, const Reference& reference) {
  LoaderRounds rounds;
  std::vector<double> ratios;
  for (auto _ : state) {
    const Timed loader = time_loader_epochs(dataset, options, epochs, nullptr, nullptr);
    const double t0 = now_seconds();
    reference(loader.indices);
    ratios.push_back((now_seconds() - t0) / loader.seconds);
    rounds.loader_seconds += loader.seconds;
    rounds.samples += loader.samples;
    state.SetIterationTime(loader.seconds);
  }
  rounds.median_ratio = median(ratios);
  return rounds;
}

void BM_LoaderVsGetBatch(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t side = state.range(1);
  const Dataset& dataset = host_dataset(side);
  LoaderOptions options;
  options.batch_size = kHostBatch;
  options.fields = {"image", "label"};
  options.sampler.kind = SamplerKind::Random;
  options.num_workers = threads;
  options.pin_memory = false;  // the reference gathers into ordinary memory too
  const int epochs = static_cast<int>(std::max<int64_t>(1, 64 * kHostBatch / dataset.size()));
  Tensor images = empty({kHostBatch, 3, side, side}, kUInt8);
  Tensor labels = empty({kHostBatch}, kInt64);
  images.fill_(0);

  const LoaderRounds rounds = run_loader_rounds(state, dataset, options, epochs, [&](const std::vector<int64_t>& order) {
    for (size_t first = 0; first < order.size(); first += kHostBatch) {
      const size_t rows = std::min<size_t>(kHostBatch, order.size() - first);
      const std::span<const int64_t> indices(order.data() + first, rows);
      const Tensor outs[] = {images.narrow(0, 0, static_cast<int64_t>(rows)),
                             labels.narrow(0, 0, static_cast<int64_t>(rows))};
      dataset.get_batch(indices, kFields, outs, threads);  // both fields in one call, as the loader does
      benchmark::ClobberMemory();
    }
  });
  state.counters["vs_get_batch"] = rounds.median_ratio;
  state.counters["loader_samples_per_s"] = rounds.samples / rounds.loader_seconds;
  state.SetBytesProcessed(rounds.samples * (3 * side * side + 8));
}

// The normalisation of BM_LoaderTransform, over `count` values.
void normalise(const uint8_t* in, float* out, int64_t count) {
  for (int64_t k = 0; k < count; ++k) out[k] = (static_cast<float>(in[k]) * (1.0f / 255) - 0.5f) * 4.0f;
}

// The same as a C function (SampleTransform::from_c, what Python's Transform passes).
extern "C" int32_t normalise_c(const uint8_t* const* inputs, const int64_t* const* shapes, const int32_t* ndims,
                               int32_t, uint8_t* output, uint64_t, int64_t) {
  int64_t count = 1;
  for (int32_t d = 0; d < ndims[0]; ++d) count *= shapes[0][d];
  normalise(inputs[0], reinterpret_cast<float*>(output), count);
  return 0;
}

void BM_LoaderTransform(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t side = state.range(1);
  const bool c_function = state.range(2) != 0;
  const int64_t values = 3 * side * side;
  const Dataset& dataset = host_dataset(side);
  LoaderOptions options;
  options.batch_size = kHostBatch;
  options.transforms = {{.name = "image",
                         .inputs = {"image"},
                         .dtype = kFloat32,
                         .shape = {3, side, side},
                         .fn = [values](const SampleTransform::Input& in, const Tensor& out) {
                           normalise(in.fields[0].data_ptr<uint8_t>(), out.mutable_data_ptr<float>(), values);
                         }}};
  if (c_function) options.transforms = {SampleTransform::from_c("image", {"image"}, kFloat32, {3, side, side}, normalise_c)};
  options.sampler.kind = SamplerKind::Random;
  options.num_workers = threads;
  options.pin_memory = false;
  const int epochs = static_cast<int>(std::max<int64_t>(1, 64 * kHostBatch / dataset.size()));
  Tensor images = empty({kHostBatch, 3, side, side}, kUInt8);
  Tensor normalised = empty({kHostBatch, 3, side, side}, kFloat32);
  images.fill_(0);
  normalised.fill_(0);
  const LoaderRounds rounds = run_loader_rounds(state, dataset, options, epochs, [&](const std::vector<int64_t>& order) {
    for (size_t first = 0; first < order.size(); first += kHostBatch) {
      const size_t rows = std::min<size_t>(kHostBatch, order.size() - first);
      const std::span<const int64_t> indices(order.data() + first, rows);
      dataset.get_batch(indices, "image", images.narrow(0, 0, static_cast<int64_t>(rows)), 1);
      normalise(images.data_ptr<uint8_t>(), normalised.mutable_data_ptr<float>(), static_cast<int64_t>(rows) * values);
      benchmark::ClobberMemory();
    }
  });
  state.counters["vs_consumer"] = rounds.median_ratio;
  state.counters["loader_samples_per_s"] = rounds.samples / rounds.loader_seconds;
  state.SetBytesProcessed(rounds.samples * values * 4);
}

// A pass of `batches` random batches through a loader with 2 workers; `delivered` counts a
// batch's bytes.
template <typename Delivered>
auto loader_pass(int64_t batches, Delivered delivered) {
  return [batches, delivered](const std::vector<std::string>& paths, ReadAhead read_ahead, uint64_t seed,
                              const auto& end) {
    Dataset dataset = Dataset::open_concat(paths);
    LoaderOptions options;
    options.batch_size = kHostBatch;
    options.sampler.kind = SamplerKind::Random;
    options.sampler.seed = seed;
    options.num_workers = 2;
    options.pin_memory = false;
    options.read_ahead = read_ahead;
    Loader loader(dataset, options);
    int64_t bytes = 0;
    for (int64_t b = 0; b < batches; ++b) bytes += delivered(*loader.next());
    end();
    return bytes;
  };
}

void BM_LoaderColdRandom(benchmark::State& state) {
  if (const std::string& why = cold_reads_unavailable(); !why.empty())
    return state.SkipWithError(("no cold reads to measure: " + why).c_str());
  const int64_t record_bytes = state.range(0);
  const Dataset& written = record_bytes < 4096 ? small_records_dataset() : device_dataset();
  run_cold_random_passes(state, written, loader_pass(record_bytes < 4096 ? 40 : 16, [](const Batch& batch) {
                           return batch["image"].nbytes() + batch["label"].nbytes();
                         }));
}

void BM_LoaderColdRandomTokens(benchmark::State& state) {
  if (const std::string& why = cold_reads_unavailable(); !why.empty())
    return state.SkipWithError(("no cold reads to measure: " + why).c_str());
  run_cold_random_passes(state, cold_token_dataset(),
                         loader_pass(20, [](const Batch& batch) { return batch["tokens"].nbytes(); }));
}

void BM_LoaderTokensSequential(benchmark::State& state) {
  const Dataset& dataset = token_dataset();
  LoaderOptions options;
  options.batch_size = kHostBatch;
  options.sampler.kind = SamplerKind::Sequential;
  options.num_workers = 1;
  options.pin_memory = false;  // the reference copies into ordinary memory too
  // The reference: each batch's tokens as one block, from a flat copy of the whole stream.
  const RaggedBatch all = dataset.ragged_column("tokens", 0, dataset.size());
  const Tensor flat = all.values.contiguous().clone();
  const int64_t* ends = all.offsets.data_ptr<int64_t>();
  std::vector<int32_t> out(static_cast<size_t>(flat.numel()));
  const int epochs = 4;

  const LoaderRounds rounds = run_loader_rounds(state, dataset, options, epochs, [&](const std::vector<int64_t>&) {
    for (int e = 0; e < epochs; ++e) {
      for (int64_t first = 0; first < dataset.size(); first += kHostBatch) {
        const int64_t stop = std::min(dataset.size(), first + kHostBatch);
        std::memcpy(out.data(), flat.data_ptr<int32_t>() + ends[first],
                    static_cast<size_t>(ends[stop] - ends[first]) * sizeof(int32_t));
        benchmark::ClobberMemory();
      }
    }
  });
  const double bytes = static_cast<double>(rounds.samples) / static_cast<double>(dataset.size()) *
                       static_cast<double>(flat.nbytes());  // whole epochs
  state.counters["vs_memcpy"] = rounds.median_ratio;
  state.counters["loader_GB_per_s"] = bytes / rounds.loader_seconds / 1e9;
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

void BM_LoaderToDevice(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    // With MMT_REQUIRE_CUDA=1 (on a GPU machine) a device this build cannot use is fatal,
    // not a skipped row in a run that exits 0.
    const char* required = std::getenv("MMT_REQUIRE_CUDA");
    if (required != nullptr && std::string_view(required) == "1") {
      std::fprintf(stderr, "BM_LoaderToDevice: MMT_REQUIRE_CUDA=1, but %s\n",
                   cuda_unavailable_reason().c_str());
      std::exit(2);
    }
    state.SkipWithError(cuda_unavailable_reason().c_str());
    return;
  }
  constexpr int64_t kBatch = 256;
  const Dataset& dataset = device_dataset();
  // streaming: 1 is what ships (Auto: values of 16 KB and more bound for the device go with
  // non-temporal stores), 0 gathers every value with memcpy.
  const detail::ScopedStreamingStores streaming(state.range(1) ? detail::StreamingStores::Auto
                                                               : detail::StreamingStores::Never);
  LoaderOptions options;
  options.batch_size = kBatch;
  options.fields = {"image", "label"};
  options.sampler.kind = SamplerKind::Random;
  options.num_workers = static_cast<int>(state.range(0));
  options.prefetch_batches = static_cast<int>(state.range(2));
  options.device = Device(DeviceType::CUDA, 0);
  options.pin_mapping = state.range(3) != 0;
  const int64_t batch_bytes = kBatch * (3 * 224 * 224 + 8);
  const int epochs = 4;
  const auto process_cpu_seconds = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  };
  double make_loader_seconds = now_seconds();
  std::optional<Loader>(std::in_place, dataset, options).reset();
  make_loader_seconds = now_seconds() - make_loader_seconds;

  // The reference: pinned host -> device copies of one batch's bytes, queued back to back.
  UntypedStorage pinned = UntypedStorage::allocate_pinned(batch_bytes);
  pinned.fill_(1);
  UntypedStorage device = UntypedStorage::allocate(batch_bytes, options.device);
  cuda::Stream stream = cuda::Stream::create(0);
  auto memcpy_bytes_per_s = [&](int64_t copies) {
    const double t0 = now_seconds();
    for (int64_t c = 0; c < copies; ++c)
      cuda::copy_to_device_async(device.mutable_data(), pinned.data(), batch_bytes, stream);
    stream.synchronize();
    return copies * static_cast<double>(batch_bytes) / (now_seconds() - t0);
  };

  memcpy_bytes_per_s(8);
  std::vector<double> ratios, memcpy_rates;
  double loader_seconds = 0, cpu_seconds = 0;
  int64_t batches = 0;
  for (auto _ : state) {
    const double cpu_before = process_cpu_seconds();
    const Timed loader = time_loader_epochs(dataset, options, epochs, stream.get(), &stream);
    cpu_seconds += process_cpu_seconds() - cpu_before;
    const double loader_rate = loader.batches * static_cast<double>(batch_bytes) / loader.seconds;
    const double memcpy_rate = memcpy_bytes_per_s(loader.batches);
    ratios.push_back(loader_rate / memcpy_rate);
    memcpy_rates.push_back(memcpy_rate);
    loader_seconds += loader.seconds;
    batches += loader.batches;
    state.SetIterationTime(loader.seconds);
  }
  state.counters["vs_pinned_memcpy"] = median(ratios);
  state.counters["batches_per_s"] = batches / loader_seconds;
  state.counters["loader_GB_per_s"] = batches * static_cast<double>(batch_bytes) / loader_seconds / 1e9;
  state.counters["memcpy_GB_per_s"] = median(memcpy_rates) / 1e9;
  state.counters["make_loader_ms"] = make_loader_seconds * 1e3;
  // Includes each round's untimed warm-up epoch and loader set-up: an upper bound.
  state.counters["process_cores_busy"] = cpu_seconds / loader_seconds;
  state.SetBytesProcessed(batches * batch_bytes);
}

}  // namespace

BENCHMARK(BM_LoaderVsGetBatch)->ArgsProduct({{1, 2}, {32, 128}})->ArgNames({"threads", "side"})
    ->Iterations(9)
    ->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderTransform)->ArgsProduct({{1, 2}, {32, 128}, {0, 1}})->ArgNames({"threads", "side", "c_function"})
    ->Iterations(9)
    ->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderColdRandom)->Arg(784)->Arg(150528)->ArgName("record_bytes")->Iterations(5)
    ->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderColdRandomTokens)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderTokensSequential)->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderToDevice)->ArgsProduct({{4, 8, 14}, {0, 1}, {4}, {0}})->Args({14, 1, 8, 0})->Args({15, 1, 8, 0})
    ->ArgsProduct({{1, 2, 4, 14}, {1}, {4}, {1}})
    ->ArgNames({"workers", "streaming", "prefetch", "pin_mapping"})->Iterations(5)
    ->UseManualTime()->Unit(benchmark::kMillisecond);
