// The loader with a CUDA device: the same checks as on the host, plus the stream ordering
// that lets slots be reused without host synchronisation. Skipped without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <numeric>
#include <thread>

#if MMT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cuda_stream.h"
#include "loader_test_util.h"
#include "mmtensor/sampler.h"
#include "mmtensor/error.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/loader.h"

namespace mmt {
namespace {

using testing::drain_epoch;
using testing::TempDir;
using testing::write_loader_dataset;
using testing::write_loader_records;

const std::vector<std::string> kAllFields = {"x", "label", "image", "tokens"};

class LoaderGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MMT_SKIP_WITHOUT_CUDA();
  }

  LoaderOptions cuda_options(SamplerKind kind, int64_t batch_size, int workers = 2) {
    LoaderOptions options;
    options.batch_size = batch_size;
    options.sampler.kind = kind;
    options.sampler.seed = 77;
    options.num_workers = workers;
    options.device = Device(DeviceType::CUDA, 0);
    return options;
  }

  // Copies every tensor of a device batch back and compares with Dataset::get.
  static void expect_device_batch_matches(const Batch& batch, const Dataset& dataset,
                                          const std::vector<std::string>& fields = kAllFields) {
    const std::span<const int64_t> indices = batch.indices();
    for (const std::string& field : fields) {
      if (batch.is_ragged(field)) {
        const RaggedBatch& ragged = batch.ragged(field);
        ASSERT_TRUE(ragged.values.is_cuda() && ragged.offsets.is_cuda() && ragged.shapes.is_cuda());
        const std::vector<int64_t> offsets = ragged.offsets.cpu().to_vector<int64_t>();
        const Tensor values = ragged.values.cpu();
        const Tensor shapes = ragged.shapes.cpu();
        for (int64_t row = 0; row < batch.size(); ++row) {
          const Tensor expected = dataset.get(indices[row], field);
          EXPECT_EQ(shapes[row].to_vector<int64_t>(), expected.sizes().vec());
          EXPECT_TRUE(values.narrow(0, offsets[row], offsets[row + 1] - offsets[row])
                          .view(expected.sizes()).equal(expected))
              << field << " row " << row;
        }
      } else {
        const Tensor& on_device = batch[field];
        ASSERT_TRUE(on_device.is_cuda());
        ASSERT_EQ(on_device.device(), Device(DeviceType::CUDA, 0));
        const Tensor host = on_device.cpu();
        for (int64_t row = 0; row < batch.size(); ++row)
          EXPECT_TRUE(host[row].equal(dataset.get(indices[row], field))) << field << " row " << row;
      }
    }
  }

  TempDir dir;
};

TEST_F(LoaderGpuTest, DeviceBatchesHoldWhatGetReturns) {
  for (CodecSpec codec : {CodecSpec{}, CodecSpec{Codec::LZ4, 0}}) {
    std::string name = "g";  // not "g" + str + ".mmt": gcc 12 warns falsely on it (-Wrestrict, its bug 105329)
    name += codec.str() + ".mmt";
    Dataset dataset = Dataset::open(write_loader_dataset(dir, 150, codec, 16, name));
    Loader loader(dataset, cuda_options(SamplerKind::QuasiRandom, 32, 3));
    std::vector<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) {
      EXPECT_EQ(batch->device(), Device(DeviceType::CUDA, 0));
      expect_device_batch_matches(*batch, dataset);  // .cpu() runs on the default stream
      seen.insert(seen.end(), batch->indices().begin(), batch->indices().end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(150);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all);
  }
}

TEST_F(LoaderGpuTest, TransformOutputsArriveOnTheDevice) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 50, CodecSpec::parse("lz4")));
  LoaderOptions options = cuda_options(SamplerKind::Random, 8);
  options.fields = {"label"};
  options.transforms = {{.name = "doubled",
                         .inputs = {"x"},
                         .dtype = kFloat32,
                         .shape = {4},
                         .fn = [](const SampleTransform::Input& in, const Tensor& out) {
                           const std::vector<float> x = in.fields[0].to_vector<float>();
                           for (int k = 0; k < 4; ++k) out.mutable_data_ptr<float>()[k] = 2 * x[k];
                         }}};
  Loader loader(dataset, options);
  int64_t rows = 0;
  while (std::optional<Batch> batch = loader.next()) {
    ASSERT_TRUE((*batch)["doubled"].is_cuda());
    const Tensor host = (*batch)["doubled"].cpu();
    for (int64_t row = 0; row < batch->size(); ++row, ++rows) {
      const int64_t i = batch->indices()[row];
      EXPECT_EQ(host[row].to_vector<float>(),
                (std::vector<float>{20.0f * i, 20.0f * i + 2, 20.0f * i + 4, 20.0f * i + 6}));
    }
  }
  EXPECT_EQ(rows, 50);
}

TEST_F(LoaderGpuTest, SameOrderAsOnTheHost) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 120));
  LoaderOptions options = cuda_options(SamplerKind::Random, 16, 3);
  Loader on_device(dataset, options);
  options.device = kCPU;
  options.num_workers = 1;
  Loader on_host(dataset, options);
  EXPECT_EQ(drain_epoch(on_device), drain_epoch(on_host));
}

TEST_F(LoaderGpuTest, ASlotIsReusedOnlyAfterTheConsumersStreamIsDone) {
  // Two slots and many batches: every slot is refilled many times while the consumer reads
  // the previous batch on its own stream. A copy that overtook the reader would show here.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 256));
  cuda::Stream stream = cuda::Stream::create(0);
  LoaderOptions options = cuda_options(SamplerKind::Random, 8, 2);
  options.prefetch_batches = 1;
  options.fields = {"x"};
  Loader loader(dataset, options);
  for (int epoch = 0; epoch < 3; ++epoch) {
    while (std::optional<Batch> batch = loader.next()) {
      batch->wait(stream.get());
      const std::vector<int64_t> indices(batch->indices().begin(), batch->indices().end());
      const Tensor& x = (*batch)["x"];
      Tensor host = empty(x.sizes(), kFloat32, kCPU, MemoryFormat::Contiguous, /*pin_memory=*/true);
      cuda::copy_to_host_async(host.mutable_data_ptr(), x.data_ptr(), x.nbytes(), stream);
      batch->release();  // the slot's next copy now waits, on the GPU, for the copy just queued
      stream.synchronize();
      for (size_t row = 0; row < indices.size(); ++row)
        EXPECT_TRUE(host[static_cast<int64_t>(row)].equal(dataset.get(indices[row], "x")))
            << "epoch " << epoch << " record " << indices[row];
    }
  }
}

// With a consumer stream of its own (non-blocking, as PyTorch's are), the engine's own copies
// of a batch (cpu(), clone(); on the legacy default stream) must still see the batch's copy
// and must be done before a release lets the slot be refilled: a clone taken just before the
// release holds that batch, not a mix with the next.
// Batches of 32 MiB: next() returns once a batch's copy is queued, so the copy is still
// running when cpu() and clone() start, and the race is there to lose.
TEST_F(LoaderGpuTest, EngineCopiesOfABatchAreOrderedWithACustomConsumerStream) {
  const std::string path = dir.file("large.mmt");
  {
    constexpr int64_t kRecordBytes = 4 << 20;
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("image", kUInt8, {kRecordBytes})}));
    Tensor record = empty({kRecordBytes}, kUInt8);
    for (int64_t i = 0; i < 48; ++i) {
      uint8_t* bytes = record.mutable_data_ptr<uint8_t>();
      for (int64_t k = 0; k < kRecordBytes; ++k) bytes[k] = static_cast<uint8_t>(i * 7 + k % 13);
      writer.append({record});
    }
    writer.finish();
  }
  Dataset dataset = Dataset::open(path);
  cuda::Stream stream = cuda::Stream::create(0);
  LoaderOptions options = cuda_options(SamplerKind::Random, 8, 2);
  options.prefetch_batches = 1;
  options.consumer_stream = stream.get();
  Loader loader(dataset, options);
  for (int epoch = 0; epoch < 2; ++epoch) {
    while (std::optional<Batch> batch = loader.next()) {
      const std::vector<int64_t> indices(batch->indices().begin(), batch->indices().end());
      const Tensor host = (*batch)["image"].cpu();  // no synchronize(): cpu() must wait itself
      const Tensor kept = (*batch)["image"].clone();
      batch->release();  // the slot may be refilled at once
      const Tensor kept_host = kept.cpu();
      for (size_t row = 0; row < indices.size(); ++row) {
        const Tensor expected = dataset.get(indices[row], "image");
        EXPECT_TRUE(host[static_cast<int64_t>(row)].equal(expected)) << "epoch " << epoch << " row " << row;
        EXPECT_TRUE(kept_host[static_cast<int64_t>(row)].equal(expected)) << "epoch " << epoch << " row " << row;
      }
    }
  }
}

TEST_F(LoaderGpuTest, SynchronizeMakesTheBatchReadableFromTheHost) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  Loader loader(dataset, cuda_options(SamplerKind::Sequential, 10));
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  batch->synchronize();
  EXPECT_EQ((*batch)["label"].cpu().to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(LoaderGpuTest, ResumeMidEpochOnTheDevice) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 90, CodecSpec{Codec::Zstd, 1}));
  LoaderOptions options = cuda_options(SamplerKind::QuasiRandom, 8);
  Loader reference_loader(dataset, options);
  const std::vector<int64_t> reference = drain_epoch(reference_loader);
  Loader loader(dataset, options);
  std::vector<int64_t> seen = testing::take_batches(loader, 4);
  Loader resumed(dataset, options, LoaderState::parse(loader.state().to_string()));
  const std::vector<int64_t> rest = drain_epoch(resumed);
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, reference);
}

TEST_F(LoaderGpuTest, HostBatchesArePinnedWhenAskedAndADeviceExists) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 20));
  LoaderOptions options = cuda_options(SamplerKind::Sequential, 4);
  options.device = kCPU;
  options.pin_memory = true;
  Loader loader(dataset, options);
  std::optional<Batch> batch = loader.next();
  EXPECT_TRUE((*batch)["x"].is_pinned());
}

// A user captures a CUDA graph in global mode (torch.cuda.graph's default) on one thread
// while the loader's workers prefetch and another thread takes batches: the workers' event
// waits were calls that capture forbids, which invalidated the capture and failed the epoch
// with an unexplained CudaError. The workers run in relaxed capture mode now.
TEST_F(LoaderGpuTest, AGraphCapturedOnAnotherThreadWhileTheLoaderPrefetches) {
#if MMT_WITH_CUDA
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 512));
  LoaderOptions options = cuda_options(SamplerKind::Random, 8, 2);
  options.prefetch_batches = 2;
  Loader loader(dataset, options);
  ASSERT_TRUE(loader.next());  // the ring made, the context open: before the capture begins
  std::atomic<bool> capturing{false};
  cudaError_t begin = cudaSuccess, record = cudaSuccess, end = cudaSuccess;
  std::thread capturer([&] {
    cudaSetDevice(0);
    cudaStream_t stream = nullptr;
    void* buffer = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&buffer, 1 << 20) != cudaSuccess) {
      begin = cudaErrorUnknown;
      capturing = true;
      return;
    }
    begin = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    capturing = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the loader works meanwhile
    record = cudaMemsetAsync(buffer, 7, 1 << 20, stream);
    cudaGraph_t graph = nullptr;
    end = cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaFree(buffer);
    cudaStreamDestroy(stream);
  });
  while (!capturing) std::this_thread::yield();
  int64_t batches = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  // next() and release on this thread, not the capturing one; nothing here waits on the host
  // for the GPU (this thread is not relaxed: a synchronize() would break the capture). An
  // error (the bug back) is reported after the capturer is joined, not by std::terminate.
  std::exception_ptr error;
  try {
    while (std::chrono::steady_clock::now() < until)
      if (std::optional<Batch> batch = loader.next()) ++batches;
  } catch (...) {
    error = std::current_exception();
  }
  capturer.join();
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      FAIL() << "next() during the capture: " << e.what();
    }
  }
  EXPECT_EQ(begin, cudaSuccess) << cudaGetErrorString(begin);
  EXPECT_EQ(record, cudaSuccess) << cudaGetErrorString(record);
  EXPECT_EQ(end, cudaSuccess) << cudaGetErrorString(end) << " (the capture was invalidated)";
  EXPECT_GT(batches, 0);
  while (std::optional<Batch> batch = loader.next()) expect_device_batch_matches(*batch, dataset);
#endif
}

TEST_F(LoaderGpuTest, DestroyingMidEpochWithCopiesInFlight) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 400));
  for (int round = 0; round < 10; ++round) {
    LoaderOptions options = cuda_options(SamplerKind::Random, 16, 4);
    options.prefetch_batches = 6;
    std::optional<Batch> kept;
    {
      Loader loader(dataset, options);
      kept = loader.next();
    }
    ASSERT_TRUE(kept);
    expect_device_batch_matches(*kept, dataset);
  }
}

// Records [begin, end) whose image is large enough to go from the mapping under pin_mapping:
// "label" int64 [] = i, "image" uint8 [3, 80, 80] stored channels-last (19,200 bytes, over
// kMappedRowMinBytes), "tokens" int32 ragged of length i % 5.
const std::vector<std::string> kImageFields = {"label", "image", "tokens"};
std::string write_image_records(const std::string& path, int64_t begin, int64_t end, CodecSpec codec = {}) {
  Schema schema({Field::fixed("label", kInt64, {}), Field::fixed("image", kUInt8, {3, 80, 80}).stored_channels_last(),
                 Field::ragged("tokens", kInt32, {kVariableDim})});
  WriterOptions options;
  options.codec = codec;
  options.chunk_records = 8;
  options.threads = 1;
  DatasetWriter writer = DatasetWriter::create(path, schema, options);
  std::vector<uint8_t> image(3 * 80 * 80);
  for (int64_t i = begin; i < end; ++i) {
    for (size_t p = 0; p < image.size(); ++p) image[p] = static_cast<uint8_t>((i * 131 + p * 7) & 0xff);
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < i % 5; ++t) tokens.push_back(static_cast<int32_t>(i * 100 + t));
    writer.append({full({}, static_cast<double>(i), kInt64), tensor(image, {3, 80, 80}),
                   tokens.empty() ? empty({0}, kInt32) : tensor(tokens)});
  }
  writer.finish();
  return path;
}

#if MMT_WITH_CUDA
// Whether CUDA counts `bytes` as page-locked host memory (registered or allocated pinned).
bool page_locked(const void* bytes) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, bytes) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}
#endif

TEST_F(LoaderGpuTest, PinnedMappingBatchesHoldWhatGetReturns) {
  // An uncompressed file and an lz4 one in one dataset: rows of the first come from the
  // mapping, rows of the second are gathered, in one batch; the channels-last image and the
  // ragged tokens come through too.
  Dataset dataset = Dataset::open_concat({write_image_records(dir.file("plain.mmt"), 0, 90),
                                          write_image_records(dir.file("lz4.mmt"), 90, 150, CodecSpec::parse("lz4"))});
  for (SamplerKind kind : {SamplerKind::Random, SamplerKind::Sequential}) {
    LoaderOptions options = cuda_options(kind, 32, 3);
    options.pin_mapping = true;
    Loader loader(dataset, options);
    std::vector<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) {
      expect_device_batch_matches(*batch, dataset, kImageFields);
      seen.insert(seen.end(), batch->indices().begin(), batch->indices().end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(150);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << to_string(kind);
  }
  // A field list of one mapped field.
  LoaderOptions options = cuda_options(SamplerKind::Random, 8);
  options.pin_mapping = true;
  options.fields = {"image"};
  Loader images(dataset, options);
  while (std::optional<Batch> batch = images.next()) {
    const Tensor host = (*batch)["image"].cpu();
    for (int64_t row = 0; row < batch->size(); ++row)
      EXPECT_TRUE(host[row].equal(dataset.get(batch->indices()[row], "image")));
  }
}

TEST_F(LoaderGpuTest, PinnedMappingIsSharedByLoadersAndUndoneByTheLast) {
  Dataset dataset = Dataset::open(write_image_records(dir.file("images.mmt"), 0, 200));
  LoaderOptions options = cuda_options(SamplerKind::Random, 16);
  options.pin_mapping = true;
#if MMT_WITH_CUDA
  const void* file = dataset.file_storage().data();
  EXPECT_FALSE(page_locked(file));
#endif
  {
    std::optional<Loader> first(std::in_place, dataset, options);
    Loader second(dataset, options);
#if MMT_WITH_CUDA
    EXPECT_TRUE(page_locked(file));
#endif
    first.reset();
#if MMT_WITH_CUDA
    EXPECT_TRUE(page_locked(file));  // the second loader still copies from it
#endif
    while (std::optional<Batch> batch = second.next()) expect_device_batch_matches(*batch, dataset, kImageFields);
  }
#if MMT_WITH_CUDA
  EXPECT_FALSE(page_locked(file));
#endif
  Loader again(dataset, options);  // registers anew
  std::optional<Batch> batch = again.next();
  ASSERT_TRUE(batch);
  expect_device_batch_matches(*batch, dataset, kImageFields);
#if MMT_WITH_CUDA
  // Fields too small to go from the mapping are gathered, and nothing is locked for them.
  Dataset small = Dataset::open(write_loader_dataset(dir, 50));
  Loader gathered(small, options);
  EXPECT_FALSE(page_locked(small.file_storage().data()));
  while (std::optional<Batch> b = gathered.next()) expect_device_batch_matches(*b, small);
#endif
}

}  // namespace
}  // namespace mmt
