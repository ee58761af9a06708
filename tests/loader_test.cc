// The loader on the host: batch contents, epoch coverage, determinism across thread counts,
// resume (also elastic), errors from workers, and clean shutdown mid-epoch.
#include "mmtensor/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <thread>
#include <utility>

#include "checksum.h"
#include "loader_test_util.h"
#include "mmtensor/error.h"

namespace mmt {
namespace {

using testing::drain_epoch;
using testing::expect_batch_matches_dataset;
using testing::TempDir;
using testing::write_loader_dataset;

const std::vector<std::string> kAllFields = {"x", "label", "image", "tokens"};

LoaderOptions options_for(SamplerKind kind, int64_t batch_size, int workers = 2) {
  LoaderOptions options;
  options.batch_size = batch_size;
  options.sampler.kind = kind;
  options.sampler.seed = 1234;
  options.num_workers = workers;
  return options;
}

// `options` for rank `rank` of `world_size` ranks.
LoaderOptions on_rank(LoaderOptions options, int rank, int world_size) {
  options.sampler.rank = rank;
  options.sampler.world_size = world_size;
  return options;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

class LoaderTest : public ::testing::Test {
 protected:
  TempDir dir;
};

// (*loader.next())["x"] in one line would view the ring slot of a batch released at once,
// which the loader refills: refused at compile time. Named batches work as before.
template <typename B>
concept IndexableByName = requires { std::declval<B>()["x"]; };
template <typename B>
concept HasIndices = requires { std::declval<B>().indices(); };
template <typename B>
concept HasRagged = requires { std::declval<B>().ragged("x"); };
static_assert(!IndexableByName<Batch&&> && !HasIndices<Batch&&> && !HasRagged<Batch&&>);
static_assert(IndexableByName<Batch&> && HasIndices<Batch&> && HasRagged<const Batch&>);

TEST_F(LoaderTest, BatchesHoldWhatGetReturnsForTheirIndices) {
  for (CodecSpec codec : {CodecSpec{}, CodecSpec{Codec::LZ4, 0}, CodecSpec{Codec::Zstd, 3}}) {
    std::string name = "d";  // not "d" + str + ".mmt": gcc 12 warns falsely on it (-Wrestrict, its bug 105329)
    name += codec.str() + ".mmt";
    Dataset dataset = Dataset::open(write_loader_dataset(dir, 150, codec, 16, name));
    for (SamplerKind kind : {SamplerKind::Sequential, SamplerKind::Random, SamplerKind::QuasiRandom}) {
      Loader loader(dataset, options_for(kind, 32, 3));
      int64_t batches = 0;
      while (std::optional<Batch> batch = loader.next()) {
        EXPECT_EQ(batch->device(), kCPU);
        expect_batch_matches_dataset(*batch, dataset, kAllFields);
        ++batches;
      }
      EXPECT_EQ(batches, 5) << codec.str() << " " << to_string(kind);
    }
  }
}

TEST_F(LoaderTest, SequentialRaggedBatchesThatCrossChunksMidBatchHoldWhatGetReturns) {
  // Chunks of 16, batches of 10: runs of consecutive records start mid-batch and stop at
  // chunk boundaries. "planes" [3, -1] is stored column-major, so its runs are not views.
  Field planes = Field::ragged("planes", kFloat32, {3, kVariableDim});
  planes.with_storage_order({1, 0});
  const Schema schema({Field::ragged("tokens", kInt32, {kVariableDim}), planes});
  for (CodecSpec codec : {CodecSpec{}, CodecSpec{Codec::LZ4, 0}, CodecSpec{Codec::Zstd, 3}}) {
    std::string path = "ragged";  // not "ragged" + str: gcc 12 -Wrestrict (its bug 105329)
    path += codec.str() + ".mmt";
    path = dir.file(path);
    {
      WriterOptions writer_options;
      writer_options.codec = codec;
      writer_options.chunk_records = 16;
      DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
      for (int64_t i = 0; i < 150; ++i)
        writer.append({arange(i * 100, i * 100 + i % 7, 1, kInt32),
                       arange(i * 10, i * 10 + 3 * (i % 4), 1, kFloat32).view({3, i % 4})});
      writer.finish();
    }
    Dataset dataset = Dataset::open(path);
    for (int workers : {1, 3}) {
      LoaderOptions options = options_for(SamplerKind::Sequential, 10, workers);
      Loader loader(dataset, options);
      int64_t next_index = 0;
      while (std::optional<Batch> batch = loader.next()) {
        expect_batch_matches_dataset(*batch, dataset, {"tokens", "planes"});
        for (int64_t index : batch->indices()) EXPECT_EQ(index, next_index++);
      }
      EXPECT_EQ(next_index, 150) << codec.str();
    }
  }
}

TEST_F(LoaderTest, ZeroWorkersLoadEachBatchInsideNextOnTheCallersThread) {
  const auto threads_now = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator{});
  };
  for (CodecSpec codec : {CodecSpec{}, CodecSpec{Codec::Zstd, 3}}) {
    std::string name = "zero";  // not "zero" + str: gcc 12 -Wrestrict (its bug 105329)
    name += codec.str() + ".mmt";
    Dataset dataset = Dataset::open(write_loader_dataset(dir, 90, codec, 16, name));
    const auto threads_before = threads_now();
    LoaderOptions options = options_for(SamplerKind::Random, 16, 0);
    Loader loader(dataset, options);
    EXPECT_EQ(threads_now(), threads_before);  // no worker was started
    std::vector<int64_t> order;
    std::optional<LoaderState> after_two;
    while (std::optional<Batch> batch = loader.next()) {
      expect_batch_matches_dataset(*batch, dataset, kAllFields);
      order.insert(order.end(), batch->indices().begin(), batch->indices().end());
      if (order.size() == 32) after_two = batch->state();
    }
    EXPECT_EQ(threads_now(), threads_before);
    // The same order as with workers, and a resume continues it.
    Loader with_workers(dataset, options_for(SamplerKind::Random, 16, 2));
    EXPECT_EQ(drain_epoch(with_workers), order);
    ASSERT_TRUE(after_two);
    Loader resumed(dataset, options, *after_two);
    EXPECT_EQ(drain_epoch(resumed), std::vector<int64_t>(order.begin() + 32, order.end()));
  }
}

TEST_F(LoaderTest, FixedFieldsAreOneBatchTensorInTheFieldsStorageOrder) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  Loader loader(dataset, options_for(SamplerKind::Sequential, 8));
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ((*batch)["x"].sizes().vec(), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ((*batch)["label"].sizes().vec(), (std::vector<int64_t>{8}));
  const Tensor& image = (*batch)["image"];
  EXPECT_EQ(image.sizes().vec(), (std::vector<int64_t>{8, 3, 4, 4}));
  EXPECT_TRUE(image.is_contiguous(MemoryFormat::ChannelsLast));  // stored channels-last
  EXPECT_EQ((*batch)["label"].to_vector<int64_t>(), iota(8));
  EXPECT_THROW((*batch)["nope"], ValueError);
  EXPECT_THROW(batch->ragged("x"), ValueError);
}

TEST_F(LoaderTest, OnlyTheRequestedFieldsAreLoaded) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 20));
  LoaderOptions options = options_for(SamplerKind::Random, 5);
  options.fields = {"tokens", "label"};
  Loader loader(dataset, options);
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  expect_batch_matches_dataset(*batch, dataset, {"tokens", "label"});
  EXPECT_EQ(batch->field_names(), (std::vector<std::string>{"tokens", "label"}));  // in the order asked
  EXPECT_THROW((*batch)["x"], ValueError);
  options.fields = {"label", "missing"};
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.fields = {"label", "label"};
  EXPECT_THROW(Loader(dataset, options), ValueError);
}

// A range-for stays in the epoch it began in: an inner loop that runs the epoch out ends the
// outer one too (it ran on into every later epoch, for ever), as does an iterator kept from an
// epoch set_epoch() left.
TEST_F(LoaderTest, ARangeForEndsWithItsEpoch) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  Loader loader(dataset, options_for(SamplerKind::Random, 10));
  int outer = 0, inner = 0;
  for (Batch& batch : loader) {
    (void)batch;
    ++outer;
    for (Batch& other : loader) {
      (void)other;
      ++inner;
    }
  }
  EXPECT_EQ(outer, 1);
  EXPECT_EQ(inner, 3);
  EXPECT_EQ(loader.epoch(), 1);
  auto stale = loader.begin();
  ASSERT_FALSE(stale == loader.end());
  loader.set_epoch(5);
  ++stale;
  EXPECT_TRUE(stale == loader.end());
  int batches = 0;
  for (Batch& batch : loader) batches += batch.size() > 0;
  EXPECT_EQ(batches, 4);
  // set_epoch() to the epoch a loop is in restarts it: the loop ends there too.
  auto restarted = loader.begin();
  loader.set_epoch(loader.epoch());
  ++restarted;
  EXPECT_TRUE(restarted == loader.end());
}

// The last epoch has none after it: it ends as any other (its next() said the epoch after was
// outside the range), next() then returns nullopt for good, and its state resumes there.
TEST_F(LoaderTest, TheLastEpochEndsAndItsStateResumes) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  for (bool drop_last : {false, true}) {
    LoaderOptions options = options_for(SamplerKind::Random, 16);
    options.epoch = kMaxEpoch - 1;
    options.drop_last = drop_last;
    Loader loader(dataset, options);
    int64_t rows = 0;
    for (Batch& batch : loader) rows += batch.size();
    EXPECT_EQ(rows, drop_last ? 32 : 40);
    EXPECT_FALSE(loader.next());
    EXPECT_FALSE(loader.next());
    EXPECT_EQ(loader.epoch(), kMaxEpoch - 1);
    // At the end, the tail drop_last left out is given up too, as the next epoch's start
    // gives it up for any other epoch: a resume that keeps tails has nothing left.
    options.drop_last = false;
    Loader resumed(dataset, options, LoaderState::parse(loader.state().to_string()));
    EXPECT_FALSE(resumed.next()) << drop_last;
    resumed.set_epoch(0);
    rows = 0;
    for (Batch& batch : resumed) rows += batch.size();
    EXPECT_EQ(rows, 40);
  }
}

// A file of many fields (a feature store's columns): a batch finds each by name in a map, not
// by a scan of all the names a lookup, and one it lacks is named with the first of those it holds.
TEST_F(LoaderTest, BatchOfManyFieldsFindsEachByName) {
  constexpr int64_t kFields = 300;
  std::vector<Field> fields;
  for (int64_t f = 0; f < kFields; ++f) fields.push_back(Field::fixed("c" + std::to_string(f), kInt32, {}));
  DatasetWriter writer = DatasetWriter::create(dir.file("wide.mmt"), Schema(fields));
  std::vector<Tensor> columns;
  for (int64_t f = 0; f < kFields; ++f) columns.push_back(arange(f * 100, f * 100 + 20, 1, kInt32));
  writer.append_batch(columns);
  writer.finish();
  Dataset dataset = Dataset::open(dir.file("wide.mmt"));
  Loader loader(dataset, options_for(SamplerKind::Sequential, 20));
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  for (int64_t f = kFields - 1; f >= 0; --f)
    ASSERT_EQ((*batch)["c" + std::to_string(f)].to_vector<int32_t>(), columns[f].to_vector<int32_t>()) << f;
  EXPECT_THROW_WITH((*batch)["nope"], ValueError,
                    "Batch: no field 'nope' in this batch (it holds 'c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7', 'c8', "
                    "'c9', 'c10', 'c11', 'c12', 'c13', 'c14', 'c15', 'c16', 'c17', 'c18', 'c19', 'c20', 'c21', "
                    "'c22', 'c23', 'c24', 'c25', 'c26', 'c27', 'c28', 'c29', 'c30', 'c31' and 268 more)");
}

// pin_mapping copies from the file mapping to a device: a cpu loader asking for it is told so,
// and without a device (or CUDA) the cuda loader's own error comes first.
TEST_F(LoaderTest, PinMappingNeedsACudaDevice) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 20));
  LoaderOptions options = options_for(SamplerKind::Random, 5);
  options.pin_mapping = true;
  EXPECT_THROW_WITH(Loader(dataset, options), ValueError, "pin_mapping copies records from the file mapping to a CUDA device; device is cpu");
  EXPECT_EQ(dataset.file_storage().filename(), dataset.path());
  Dataset both = Dataset::concat({dataset, dataset});
  EXPECT_THROW_WITH(both.file_storage(), ValueError, "is a concatenation of 2 files; each of parts() has its own mapping");
  if (cuda_device_count() == 0) {
    options.device = Device(DeviceType::CUDA, 0);
    EXPECT_THROW(Loader(dataset, options), CudaError);
  }
}

// Assigning a loader over another stops the old one's threads and takes the new one's place
// mid-epoch; a loader moved from is empty, and assigning to itself changes nothing.
TEST_F(LoaderTest, MoveAssignmentStopsTheOldLoaderAndContinuesTheNewOne) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  Loader reference(dataset, options_for(SamplerKind::Random, 8));
  std::vector<std::vector<int64_t>> expected;
  while (std::optional<Batch> batch = reference.next())
    expected.emplace_back(batch->indices().begin(), batch->indices().end());

  Loader target(dataset, options_for(SamplerKind::Sequential, 4));
  ASSERT_TRUE(target.next());
  Loader source(dataset, options_for(SamplerKind::Random, 8));
  std::optional<Batch> first = source.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(std::vector<int64_t>(first->indices().begin(), first->indices().end()), expected[0]);
  first.reset();
  target = std::move(source);
  Loader& same = target;
  target = std::move(same);
  for (size_t b = 1; b < expected.size(); ++b) {
    std::optional<Batch> batch = target.next();
    ASSERT_TRUE(batch) << b;
    EXPECT_EQ(std::vector<int64_t>(batch->indices().begin(), batch->indices().end()), expected[b]) << b;
  }
  EXPECT_FALSE(target.next());
}

TEST_F(LoaderTest, EverySampleOncePerEpochWithAndWithoutDropLast) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 103, CodecSpec{Codec::LZ4, 0}));
  for (SamplerKind kind : {SamplerKind::Sequential, SamplerKind::Random, SamplerKind::QuasiRandom}) {
    LoaderOptions options = options_for(kind, 10);
    std::vector<int64_t> sizes;
    Loader loader(dataset, options);
    EXPECT_EQ(loader.batches_in_epoch(), 11);
    EXPECT_EQ(sorted(drain_epoch(loader, &sizes)), iota(103)) << to_string(kind);
    EXPECT_EQ(sizes.back(), 3);

    options.drop_last = true;
    Loader dropping(dataset, options);
    EXPECT_EQ(dropping.batches_in_epoch(), 10);
    const std::vector<int64_t> seen = drain_epoch(dropping);
    ASSERT_EQ(seen.size(), 100u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 100u);
    // What is dropped is the tail of the same order.
    const std::vector<int64_t> order = dropping.sampler().epoch(0).to_vector();
    EXPECT_EQ(seen, std::vector<int64_t>(order.begin(), order.begin() + 100));
  }
}

TEST_F(LoaderTest, QuasiRandomDecodesEachCompressedChunkOncePerEpoch) {
  const std::string path = write_loader_dataset(dir, 640, CodecSpec{Codec::Zstd, 1}, 16);
  int64_t chunks = 0, largest_chunk_bytes = 0;
  {
    Dataset dataset = Dataset::open(path);
    chunks = dataset.num_chunks();
    for (int64_t c = 0; c < chunks; ++c)
      largest_chunk_bytes = std::max(largest_chunk_bytes, dataset.chunk(c).decoded_bytes);
  }
  ReaderOptions reader;
  reader.cache_bytes = 6 * largest_chunk_bytes;  // 6 of the 40 chunks fit
  for (SamplerKind kind : {SamplerKind::QuasiRandom, SamplerKind::Random}) {
    Dataset dataset = Dataset::open(path, reader);
    Loader loader(dataset, options_for(kind, 8, 2));
    EXPECT_EQ(sorted(drain_epoch(loader)), iota(640));
    // Once the epoch's last batch is out, the loader prefetches the next epoch: its ring of
    // four 8-record batches reaches into at most three more chunks.
    const int64_t decodes = dataset.cache_stats().misses;
    if (kind == SamplerKind::QuasiRandom) {
      EXPECT_EQ(loader.sampler().options().window_chunks, 2);  // a third of the budget
      EXPECT_GE(decodes, chunks);
      EXPECT_LE(decodes, chunks + 3);
    } else {
      EXPECT_GT(decodes, 4 * chunks);  // what the chunk-aware order saves
    }
  }
}

TEST_F(LoaderTest, DistributedRanksTogetherCoverTheEpoch) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 100));
  std::vector<int64_t> all;
  for (int rank = 0; rank < 4; ++rank) {
    Loader loader(dataset, on_rank(options_for(SamplerKind::QuasiRandom, 7), rank, 4));
    const std::vector<int64_t> mine = drain_epoch(loader);
    EXPECT_EQ(mine.size(), 25u);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(sorted(all), iota(100));
}

// Each rank is its own process with its own ReaderOptions. The automatic quasi-random window
// came from the process's cache budget, so ranks opened with different budgets shuffled
// different windows and together saw some records twice and others never.
TEST_F(LoaderTest, DistributedRanksWithDifferentCacheBudgetsStillCoverTheEpochOnce) {
  const std::string path = write_loader_dataset(dir, 640, CodecSpec{Codec::Zstd, 1}, 16);  // 40 chunks
  std::vector<int64_t> all;
  int64_t window = -1;
  for (int rank = 0; rank < 4; ++rank) {
    ReaderOptions reader;
    reader.cache_bytes = int64_t{4096} << (3 * rank);  // 4 KiB .. 2 MiB: 1 to all 40 chunks fit
    Dataset dataset = Dataset::open(path, reader);
    Loader loader(dataset, on_rank(options_for(SamplerKind::QuasiRandom, 8), rank, 4));
    if (window < 0) window = loader.sampler().options().window_chunks;
    EXPECT_EQ(loader.sampler().options().window_chunks, window) << "rank " << rank;
    const std::vector<int64_t> mine = drain_epoch(loader);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(sorted(all), iota(640));
}

// Memory is bounded by the ring and the cache budget (issue 5). A random batch touches a
// chunk per row; fixed fields were bounded by get_batch, but packing a ragged field held
// every row's chunk until the batch was packed: here 64 chunks against a budget of 8.
TEST_F(LoaderTest, RandomRaggedBatchesOverCompressedChunksHoldDecodedMemoryNearTheBudget) {
  const std::string path = dir.file("tokens.mmt");
  {
    WriterOptions options;
    options.codec = CodecSpec::parse("lz4");
    options.chunk_records = 2;
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::ragged("tokens", kInt32, {kVariableDim})}), options);
    for (int64_t i = 0; i < 256; ++i) writer.append({full({1000 + i}, static_cast<double>(i), kInt32)});  // ~4 KiB
    writer.finish();
  }
  ReaderOptions reader;
  reader.cache_bytes = 8 * 9000;  // about 8 chunks
  Dataset dataset = Dataset::open(path, reader);
  for (int workers : {0, 1}) {
    Loader loader(dataset, options_for(SamplerKind::Random, 64, workers));
    int64_t seen = 0;
    while (std::optional<Batch> batch = loader.next()) {
      const RaggedBatch& tokens = batch->ragged("tokens");
      const int64_t* offsets = tokens.offsets.data_ptr<int64_t>();
      for (int64_t row = 0; row < batch->size(); ++row) {
        const int64_t i = batch->indices()[row];
        ASSERT_EQ(offsets[row + 1] - offsets[row], 1000 + i);
        ASSERT_EQ(tokens.values.data_ptr<int32_t>()[offsets[row + 1] - 1], i);
      }
      seen += batch->size();
    }
    EXPECT_EQ(seen, 256);
  }
  EXPECT_LE(dataset.cache_stats().decoded_bytes_peak, 3 * reader.cache_bytes);
}

TEST_F(LoaderTest, TheOrderDoesNotDependOnThreadsOrPrefetch) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 200, CodecSpec{Codec::Zstd, 1}));
  std::vector<int64_t> reference;
  for (int workers : {0, 1, 2, 5}) {
    for (int prefetch : {1, 4}) {
      LoaderOptions options = options_for(SamplerKind::Random, 16, workers);
      options.prefetch_batches = prefetch;
      options.epoch = 3;
      Loader loader(dataset, options);
      const std::vector<int64_t> order = drain_epoch(loader);
      if (reference.empty()) reference = order;
      EXPECT_EQ(order, reference) << workers << " workers, prefetch " << prefetch;
    }
  }
  EXPECT_EQ(reference, Sampler::for_dataset(dataset, options_for(SamplerKind::Random, 1).sampler)
                           .epoch(3).to_vector());
}

TEST_F(LoaderTest, EpochsFollowOneAnotherWithFreshOrders) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 50));
  Loader loader(dataset, options_for(SamplerKind::Random, 8));
  EXPECT_EQ(loader.epoch(), 0);
  const std::vector<int64_t> first = drain_epoch(loader);
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.state().epoch, 1);
  EXPECT_EQ(loader.state().consumed, 0);
  const std::vector<int64_t> second = drain_epoch(loader);
  EXPECT_NE(first, second);
  EXPECT_EQ(sorted(second), iota(50));
  loader.set_epoch(0);
  EXPECT_EQ(drain_epoch(loader), first);
  loader.set_epoch(1);  // already there after draining epoch 0: a no-op, no empty epoch
  EXPECT_EQ(drain_epoch(loader), second);
}

TEST_F(LoaderTest, RangeForRunsOneEpochAndReleasesAsItGoes) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 45));
  LoaderOptions options = options_for(SamplerKind::Random, 8);
  options.prefetch_batches = 1;  // two slots: holding more than one batch would throw
  Loader loader(dataset, options);
  const std::vector<int64_t> expected = loader.sampler().epoch(0).to_vector();
  std::vector<int64_t> seen;
  for (Batch& batch : loader) {
    expect_batch_matches_dataset(batch, dataset, {"x", "tokens"});
    seen.insert(seen.end(), batch.indices().begin(), batch.indices().end());
  }
  EXPECT_EQ(seen, expected);
  int64_t samples = 0;
  for (Batch& batch : loader) samples += batch.size();  // the next epoch
  EXPECT_EQ(samples, 45);
  EXPECT_EQ(loader.epoch(), 2);
}

TEST_F(LoaderTest, ResumeMidEpochContinuesTheExactSequence) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 130, CodecSpec{Codec::LZ4, 0}));
  for (SamplerKind kind : {SamplerKind::Random, SamplerKind::QuasiRandom}) {
    LoaderOptions options = options_for(kind, 9, 3);
    options.epoch = 2;
    Loader reference_loader(dataset, options);
    const std::vector<int64_t> reference = drain_epoch(reference_loader);

    Loader loader(dataset, options);
    std::vector<int64_t> seen;
    std::string saved;
    for (int b = 0; b < 5; ++b) {
      std::optional<Batch> batch = loader.next();
      ASSERT_TRUE(batch);
      seen.insert(seen.end(), batch->indices().begin(), batch->indices().end());
      EXPECT_EQ(batch->state(), loader.state());
      saved = loader.state().to_string();
    }
    const LoaderState state = LoaderState::parse(saved);
    EXPECT_EQ(state.epoch, 2);
    EXPECT_EQ(state.consumed, 45);
    // Another batch size and thread count on resume: the sequence of samples is the same.
    LoaderOptions resumed_options = options;
    resumed_options.batch_size = 4;
    resumed_options.num_workers = 1;
    Loader resumed(dataset, resumed_options, state);
    // A training loop's `for (epoch = state.epoch; ...) { loader.set_epoch(epoch); ... }` keeps
    // the resume position: the loader is already in that epoch, with nothing taken.
    resumed.set_epoch(state.epoch);
    const std::vector<int64_t> rest = drain_epoch(resumed);
    seen.insert(seen.end(), rest.begin(), rest.end());
    EXPECT_EQ(seen, reference) << to_string(kind);
    EXPECT_EQ(resumed.state().epoch, 3);
  }
}

// The state after an epoch's last batch stands at that epoch's end, not at the next one's
// start: a training loop that saved its own epoch counter beside it resumes with
// set_epoch(that epoch) and goes on with the next, where it used to repeat the whole epoch;
// a loader resumed without set_epoch() gives what the uninterrupted one gave next, the
// epoch's end (nullopt), then the next epoch.
TEST_F(LoaderTest, AStateTakenOnAnEpochsLastBatchResumesAtThatEpochsEnd) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  for (bool drop_last : {false, true}) {
    SCOPED_TRACE(drop_last ? "drop_last" : "keep the tail");
    LoaderOptions options = options_for(SamplerKind::Random, drop_last ? 4 : 5);
    options.drop_last = drop_last;
    Loader reference(dataset, options);
    (void)drain_epoch(reference);
    const std::vector<int64_t> epoch1 = drain_epoch(reference);

    Loader loader(dataset, options);
    loader.set_epoch(0);
    std::optional<LoaderState> saved;
    while (std::optional<Batch> batch = loader.next()) saved = batch->state();
    ASSERT_TRUE(saved);
    EXPECT_EQ(saved->epoch, 0);
    EXPECT_EQ(saved->consumed, 10) << "every position given up, the tail drop_last leaves out too";
    EXPECT_EQ(loader.state().epoch, 1) << "once the epoch's nullopt is taken, the next epoch's start";
    EXPECT_EQ(loader.state().consumed, 0);

    Loader resumed(dataset, options, *saved);
    resumed.set_epoch(0);  // the loop's own counter, saved with the state
    EXPECT_TRUE(drain_epoch(resumed).empty());
    resumed.set_epoch(1);
    EXPECT_EQ(drain_epoch(resumed), epoch1);

    Loader plain(dataset, options, *saved);
    EXPECT_EQ(plain.state(), *saved);
    EXPECT_FALSE(plain.next());
    EXPECT_EQ(drain_epoch(plain), epoch1);
  }
  // Ranks that drop the tail (10 records over 4 ranks: 8 taken) still give up all 10, so a
  // resume under another world size is not handed the dropped tail.
  LoaderOptions ranks = on_rank(options_for(SamplerKind::Random, 2), 0, 4);
  ranks.sampler.drop_tail = true;
  Loader rank0(dataset, ranks);
  std::optional<LoaderState> last;
  while (std::optional<Batch> batch = rank0.next()) last = batch->state();
  ASSERT_TRUE(last);
  EXPECT_EQ(last->consumed, 10);
  Loader elastic(dataset, on_rank(options_for(SamplerKind::Random, 2), 0, 2), *last);
  EXPECT_FALSE(elastic.next());
}

// options() are the options as given: a loader made from another's options() and a state (as
// Python's load_state_dict makes one) adopts the state's quasi-random window where the options
// left it automatic, whatever window the other loader's cache budget gave it.
TEST_F(LoaderTest, OptionsAreAsGivenSoALoaderMadeFromThemAdoptsTheStatesWindow) {
  const std::string path = write_loader_dataset(dir, 640, CodecSpec{Codec::Zstd, 1}, 16);  // 40 chunks
  ReaderOptions small;
  small.cache_bytes = 4096;
  Dataset small_cache = Dataset::open(path, small), default_cache = Dataset::open(path);
  const LoaderOptions options = options_for(SamplerKind::QuasiRandom, 8);
  Loader saver(small_cache, options);
  (void)testing::take_batches(saver, 3);
  const LoaderState state = saver.state();
  const std::vector<int64_t> rest = drain_epoch(saver);

  Loader other(default_cache, options);
  EXPECT_EQ(other.options().sampler.window_chunks, 0);
  EXPECT_NE(other.sampler().options().window_chunks, state.window_chunks);
  Loader resumed(default_cache, other.options(), state);
  EXPECT_EQ(resumed.sampler().options().window_chunks, state.window_chunks);
  EXPECT_EQ(drain_epoch(resumed), rest);
}

TEST_F(LoaderTest, ResumeWithTheSameWorldSizePadsExactlyAsTheRunItContinues) {
  // 10 records over 4 ranks: 2 padded samples, which repeat the epoch's head as PyTorch's
  // DistributedSampler does, whether or not the run was interrupted first. (They repeated the
  // positions after the resume point instead.)
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  for (int rank = 0; rank < 4; ++rank) {
    const LoaderOptions options = on_rank(options_for(SamplerKind::Random, 2), rank, 4);
    Loader reference_loader(dataset, options);
    const std::vector<int64_t> reference = drain_epoch(reference_loader);
    Loader loader(dataset, options);
    std::optional<Batch> first = loader.next();
    std::vector<int64_t> seen(first->indices().begin(), first->indices().end());
    const LoaderState state = first->state();
    first.reset();
    Loader resumed(dataset, options, state);
    const std::vector<int64_t> rest = drain_epoch(resumed);
    seen.insert(seen.end(), rest.begin(), rest.end());
    EXPECT_EQ(seen, reference) << "rank " << rank << ", resumed at " << state.consumed;
  }
}

TEST_F(LoaderTest, ElasticResumeCoversTheRestOfTheEpochExactlyOnce) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 120));
  LoaderOptions options = options_for(SamplerKind::Random, 5);
  options.sampler.drop_tail = true;
  std::vector<int64_t> seen;
  LoaderState saved;
  for (int rank = 0; rank < 4; ++rank) {  // four ranks take three batches each
    Loader loader(dataset, on_rank(options, rank, 4));
    const std::vector<int64_t> mine = testing::take_batches(loader, 3);
    seen.insert(seen.end(), mine.begin(), mine.end());
    if (rank > 0) {
      EXPECT_EQ(loader.state(), saved);  // every rank agrees on the state
    }
    saved = loader.state();
  }
  EXPECT_EQ(saved.consumed, 60);
  for (int rank = 0; rank < 3; ++rank) {  // the job comes back with three ranks
    Loader loader(dataset, on_rank(options, rank, 3), saved);
    const std::vector<int64_t> mine = drain_epoch(loader);
    EXPECT_EQ(mine.size(), 20u);
    seen.insert(seen.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(sorted(seen), iota(120));
}

TEST_F(LoaderTest, ResumeRefusesAStateFromAnotherDatasetOrSampler) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 30));
  LoaderOptions options = options_for(SamplerKind::Random, 4);
  Loader loader(dataset, options);
  loader.next();
  LoaderState state = loader.state();
  state.records = 31;
  EXPECT_THROW(Loader(dataset, options, state), ValueError);
  state = loader.state();
  state.seed = 99;
  EXPECT_THROW(Loader(dataset, options, state), ValueError);
  state = loader.state();
  state.sampler = SamplerKind::Sequential;
  EXPECT_THROW(Loader(dataset, options, state), ValueError);

  // Another file of the same size (here the same records in lz4 chunks) is refused by the
  // state's dataset fingerprint; a byte-identical copy resumes, and so does a state whose
  // fingerprint the user cleared to vouch for a re-packed copy.
  Dataset other = Dataset::open(write_loader_dataset(dir, 30, CodecSpec::parse("lz4"), 16, "other.mmt"));
  EXPECT_NE(other.fingerprint(), dataset.fingerprint());
  try {
    Loader resumed(other, options, loader.state());
    ADD_FAILURE() << "a state saved on another dataset of the same size was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("saved on another dataset than"), std::string::npos) << e.what();
  }
  std::filesystem::copy_file(dataset.path(), dir.file("copy.mmt"));
  Dataset copy = Dataset::open(dir.file("copy.mmt"));
  EXPECT_EQ(copy.fingerprint(), dataset.fingerprint());
  Loader from_copy(copy, options, loader.state());
  const std::optional<Batch> from_copy_batch = from_copy.next(), original_batch = loader.next();
  ASSERT_TRUE(from_copy_batch && original_batch);
  EXPECT_TRUE(std::ranges::equal(from_copy_batch->indices(), original_batch->indices()));
  state = loader.state();
  state.dataset_fingerprint = 0;
  EXPECT_NO_THROW(Loader(other, options, state));

  // Files read as one in another order than the state's: refused, saying so (clearing the
  // fingerprint would resume on records numbered otherwise).
  const std::string a = write_loader_dataset(dir, 30, {}, 16, "a.mmt"), b = testing::write_loader_records(dir.file("b.mmt"), 30, 60);
  Loader concatenated(Dataset::open_concat({a, b}), options);
  concatenated.next();
  try {
    Loader reordered(Dataset::open_concat({b, a}), options, concatenated.state());
    ADD_FAILURE() << "a concatenation in another order was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("or these files read as one in another order"), std::string::npos) << e.what();
  }
}

TEST_F(LoaderTest, ASubsetSplitsOneFileIntoTrainingAndValidationRecords) {
  // One file, two loaders: every fifth record is held out for validation.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 100, CodecSpec::parse("lz4"), 16));
  std::vector<int64_t> train, validation;
  for (int64_t i = 0; i < 100; ++i) (i % 5 == 0 ? validation : train).push_back(i);
  for (SamplerKind kind : {SamplerKind::Sequential, SamplerKind::Random, SamplerKind::QuasiRandom}) {
    LoaderOptions options = options_for(kind, 7, 2);
    options.sampler.subset = train;
    Loader loader(dataset, options);
    EXPECT_EQ(loader.sampler().epoch_size(), 80);
    EXPECT_EQ(loader.batches_in_epoch(), 12);  // ceil(80 / 7)
    std::vector<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) {
      expect_batch_matches_dataset(*batch, dataset, {"x", "label", "image", "tokens"});
      seen.insert(seen.end(), batch->indices().begin(), batch->indices().end());
    }
    EXPECT_EQ(sorted(seen), train) << to_string(kind);
    if (kind == SamplerKind::Sequential) {
      EXPECT_EQ(seen, train);
    }
    options.sampler.subset = validation;
    options.drop_last = true;
    Loader validation_loader(dataset, options);
    const std::vector<int64_t> held_out = drain_epoch(validation_loader);
    EXPECT_EQ(held_out.size(), 14u) << to_string(kind);  // 20 records, two whole batches of 7
    for (int64_t index : held_out) EXPECT_EQ(index % 5, 0);
  }
  // An empty list: epochs without batches, as for an empty dataset.
  LoaderOptions options = options_for(SamplerKind::Random, 7, 2);
  options.sampler.subset = IndexList{};
  Loader nothing(dataset, options);
  EXPECT_FALSE(nothing.next().has_value());
  EXPECT_FALSE(nothing.next().has_value());  // the next epoch is empty too
}

TEST_F(LoaderTest, ASubsetResumesMidEpochAndRefusesAnotherList) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 90, CodecSpec::parse("zstd"), 8));
  std::vector<int64_t> subset;
  for (int64_t i = 89; i >= 0; i -= 2) subset.push_back(i);  // 45 entries, unsorted
  for (SamplerKind kind : {SamplerKind::Random, SamplerKind::QuasiRandom}) {
    LoaderOptions options = options_for(kind, 5, 2);
    options.sampler.subset = subset;
    Loader reference_loader(dataset, options);
    const std::vector<int64_t> reference = drain_epoch(reference_loader);
    Loader loader(dataset, options);
    std::vector<int64_t> seen = testing::take_batches(loader, 3);
    const LoaderState state = LoaderState::parse(loader.state().to_string());
    EXPECT_EQ(state.consumed, 15);
    EXPECT_EQ(state.subset_size, 45);
    EXPECT_EQ(state.records, 90);
    Loader resumed(dataset, options, state);
    const std::vector<int64_t> rest = drain_epoch(resumed);
    seen.insert(seen.end(), rest.begin(), rest.end());
    EXPECT_EQ(seen, reference) << to_string(kind);

    // Another list, or none: the positions would name other records.
    for (const std::optional<IndexList>& other :
         {std::optional<IndexList>(std::nullopt), std::optional<IndexList>(IndexList{1, 3, 5})}) {
      LoaderOptions other_options = options;
      other_options.sampler.subset = other;
      EXPECT_THROW_WITH(Loader(dataset, other_options, state), ValueError,
                        "the state was saved with a subset of 45 entries");
    }
    // The same list in another order: a random order follows the list's, a quasi-random one
    // sorts it first (so a list rebuilt from a set resumes).
    LoaderOptions reordered = options;
    reordered.sampler.subset = std::vector<int64_t>(subset.rbegin(), subset.rend());
    if (kind == SamplerKind::Random) {
      EXPECT_THROW_WITH(Loader(dataset, reordered, state), ValueError, "the state was saved with a subset of 45 entries");
    } else {
      Loader from_reordered(dataset, reordered, state);
      EXPECT_EQ(drain_epoch(from_reordered), rest);
    }
    // A state without a subset is refused by a loader given one.
    LoaderOptions whole = options;
    whole.sampler.subset.reset();
    Loader whole_loader(dataset, whole);
    whole_loader.next();
    EXPECT_THROW_WITH(Loader(dataset, options, whole_loader.state()), ValueError,
                      "saved with no subset, but the options give a subset of 45 entries");
  }
}

TEST_F(LoaderTest, AVersion2StateAsTheBuildBeforeSubsetsWroteItResumes) {
  // The text the build before subsets (5680aee) wrote after two batches of 5, byte for byte
  // but the fingerprint, which depends on the file.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  const LoaderOptions options = options_for(SamplerKind::Random, 5);
  const std::string text = std::string(R"({"consumed":10,"dataset_fingerprint":")") +
                           detail::hex64(dataset.fingerprint()) +
                           R"(","epoch":0,"records":40,"sampler":"random","seed":"0x00000000000004d2","version":2,"window_chunks":0})";
  Loader reference_loader(dataset, options);
  const std::vector<int64_t> reference = drain_epoch(reference_loader);
  Loader resumed(dataset, options, LoaderState::parse(text));
  EXPECT_EQ(drain_epoch(resumed), std::vector<int64_t>(reference.begin() + 10, reference.end()));
  // And this build writes the same text for it.
  Loader loader(dataset, options);
  loader.next();
  loader.next();
  EXPECT_EQ(loader.state().to_string(), text);
}

TEST_F(LoaderTest, ASubsetSurvivesAnElasticResume) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 150));
  std::vector<int64_t> subset;
  for (int64_t i = 0; i < 150; ++i)
    if (i % 3 != 1) subset.push_back(i);  // 100 entries
  LoaderOptions options = options_for(SamplerKind::Random, 5, 3);
  options.sampler.subset = subset;
  options.sampler.drop_tail = true;
  std::vector<int64_t> seen;
  LoaderState saved;
  for (int rank = 0; rank < 4; ++rank) {  // four ranks take two batches of 5 each
    Loader loader(dataset, on_rank(options, rank, 4));
    const std::vector<int64_t> mine = testing::take_batches(loader, 2);
    seen.insert(seen.end(), mine.begin(), mine.end());
    saved = loader.state();
  }
  EXPECT_EQ(saved.consumed, 40);
  for (int rank = 0; rank < 2; ++rank) {  // the job comes back with two ranks
    Loader loader(dataset, on_rank(options, rank, 2), saved);
    const std::vector<int64_t> mine = drain_epoch(loader);
    EXPECT_EQ(mine.size(), 30u);
    seen.insert(seen.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(sorted(seen), subset);
}

TEST_F(LoaderTest, ResumeRefusesAQuasiRandomStateFromAFileRepackedInOtherChunks) {
  // Same 64 records, chunks of 16 then of 8: the quasi-random order differs, so a resume
  // would see some records twice and skip others. The state's chunk_layout refuses it.
  Dataset by16 = Dataset::open(write_loader_dataset(dir, 64, {}, 16, "by16.mmt"));
  Dataset by8 = Dataset::open(write_loader_dataset(dir, 64, {}, 8, "by8.mmt"));
  LoaderOptions options = options_for(SamplerKind::QuasiRandom, 4);
  options.sampler.window_chunks = 2;
  Loader loader(by16, options);
  loader.next();
  const LoaderState state = loader.state();
  EXPECT_NE(state.chunk_layout, 0u);
  EXPECT_NO_THROW(Loader(by16, options, state));
  try {
    Loader resumed(by8, options, state);
    ADD_FAILURE() << "a state from another chunk layout was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("chunk layout"), std::string::npos) << e.what();
  }
  // Random order depends on the record count alone: the re-packed file resumes it.
  options.sampler.kind = SamplerKind::Random;
  Loader random(by16, options);
  random.next();
  EXPECT_EQ(random.state().chunk_layout, 0u);
  LoaderState random_state = random.state();
  EXPECT_THROW(Loader(by8, options, random_state), ValueError);  // another file, as far as it can tell
  random_state.dataset_fingerprint = 0;  // the user vouches for the same records
  EXPECT_NO_THROW(Loader(by8, options, random_state));
}

TEST(LoaderState, RoundTripsThroughTextAndRejectsDamage) {
  LoaderState state{.sampler = SamplerKind::QuasiRandom,
                     .seed = 18446744073709551615ULL,
                     .window_chunks = 12,
                     .records = 1000,
                     .epoch = 7,
                     .consumed = 640,
                     .chunk_layout = 0xfedcba9876543211ULL,
                     .dataset_fingerprint = 0x0123456789abcdefULL};
  EXPECT_EQ(LoaderState::parse(state.to_string()), state);
  EXPECT_NE(state.to_string().find(R"("dataset_fingerprint":"0x0123456789abcdef")"), std::string::npos);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0,"dataset_fingerprint":1})"), ValueError);
  // The seed is a hex string too, so that it survives a round trip through doubles; a
  // number, a negative one above all, is refused.
  EXPECT_NE(state.to_string().find(R"("seed":"0xffffffffffffffff")"), std::string::npos) << state.to_string();
  for (const char* seed : {"1", "-1", R"("1")", R"("0x1")"})
    EXPECT_THROW(LoaderState::parse(std::string(R"({"version":2,"sampler":"random","window_chunks":0,"records":5,"epoch":0,"consumed":0,"seed":)") + seed + "}"), ValueError) << seed;
  // The layout hash is a hex string: a reader that holds JSON numbers as doubles keeps it.
  EXPECT_NE(state.to_string().find(R"("chunk_layout":"0xfedcba9876543211")"), std::string::npos) << state.to_string();
  EXPECT_EQ(LoaderState::parse(R"({"version":2,"sampler":"quasi_random","seed":"0x0000000000000001","window_chunks":2,"records":5,"epoch":0,"consumed":0,"chunk_layout":"0x00000000000000ff"})").chunk_layout, 0xffu);
  // A quasi-random order exists only for a window of at least one chunk; a 0 was hand-made.
  EXPECT_THROW_WITH(LoaderState::parse(R"({"version":2,"sampler":"quasi_random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0,"chunk_layout":"0x00000000000000ff"})"),
                    ValueError, "quasi-random state needs the window its order was made with");
  for (const char* layout : {"255", R"("0xff")", R"("ff00000000000000ff")", R"("0x-000000000000ff")", R"("0x00000000000000fg")"})
    EXPECT_THROW(LoaderState::parse(std::string(R"({"version":2,"sampler":"quasi_random","seed":"0x0000000000000001","window_chunks":2,"records":5,"epoch":0,"consumed":0,"chunk_layout":)") + layout + "}"), ValueError) << layout;
  // Only a quasi-random order depends on the chunks.
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0,"chunk_layout":"0x00000000000000ff"})"), ValueError);
  // A state saved before chunk_layout existed reads as "not recorded".
  EXPECT_EQ(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0})").chunk_layout, 0u);
  EXPECT_THROW(LoaderState::parse("not json"), ValueError);
  EXPECT_THROW(LoaderState::parse("[1, 2]"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version": 2})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":6,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"shuffle","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":6})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0.5,"consumed":0})"), ValueError);
  // Out of range, not wrapped: 2^32+1 is not version 1, 2^64-1 is not epoch -1, and the
  // epoch after INT64_MAX - 1 would overflow.
  EXPECT_THROW(LoaderState::parse(R"({"version":4294967297,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":18446744073709551615,"consumed":0})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":9223372036854775807,"consumed":0})"), ValueError);
  EXPECT_THROW(LoaderState::parse(R"({"version":2,"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":-1,"consumed":0})"), ValueError);
}

// A state comes from a user's checkpoint: a hostile one must be refused with a short message,
// never crash the process. Quoting a value nested 100,000 deep used to recurse past the stack.
TEST(LoaderState, NestedOrHugeValuesAreRefusedWithAShortMessage) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string base = R"({"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0,"version":)";
  for (const std::string& text : {deep, base + deep + "}", std::string(R"({"a":{"b":1}})")}) {
    try {
      LoaderState::parse(text);
      ADD_FAILURE() << "accepted " << text.substr(0, 40);
    } catch (const ValueError& e) {
      EXPECT_NE(std::string_view(e.what()).find("found a nested"), std::string_view::npos) << e.what();
    }
  }
  // A megabyte string where a number belongs is quoted by its first characters only.
  try {
    LoaderState::parse(base + '"' + std::string(1 << 20, 'x') + "\"}");
    ADD_FAILURE() << "accepted a string version";
  } catch (const ValueError& e) {
    EXPECT_LT(std::string_view(e.what()).size(), 400u) << std::string_view(e.what()).substr(0, 400);
    EXPECT_NE(std::string_view(e.what()).find("bytes)"), std::string_view::npos);
  }
  // Cut where a UTF-8 character begins, and a parse error's quoted token cut too.
  for (const std::string& text : {base + '"' + std::string(118, 'x') + "\u00e9\u00e9\"}",
                                  "\"" + std::string(1 << 20, 'x')}) {
    try {
      LoaderState::parse(text);
      ADD_FAILURE() << "accepted";
    } catch (const ValueError& e) {
      const std::string_view message(e.what());
      EXPECT_LT(message.size(), 500u) << message.substr(0, 500);
      const size_t cut = message.find("... (");
      ASSERT_NE(cut, std::string_view::npos) << message.substr(0, 500);
      EXPECT_NE(static_cast<unsigned char>(message[cut - 1]), 0xC3) << "cut inside a UTF-8 character";
    }
  }
}

TEST(LoaderState, ASubsetIsVersion3AndAStateWithoutOneStaysVersion2) {
  LoaderState state{.sampler = SamplerKind::Random, .seed = 5, .records = 1000, .epoch = 2, .consumed = 80};
  // Builds from before subsets read version 2: a state they can resume is still written so.
  EXPECT_NE(state.to_string().find(R"("version":2)"), std::string::npos) << state.to_string();
  EXPECT_EQ(state.to_string().find("subset"), std::string::npos) << state.to_string();
  state.subset_hash = 0x8000000000000001ULL;
  state.subset_size = 90;
  const std::string text = state.to_string();
  // With a subset it is version 3, which those builds refuse by its version, not misread.
  EXPECT_NE(text.find(R"("version":3)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("subset_hash":"0x8000000000000001","subset_size":90)"), std::string::npos) << text;
  EXPECT_EQ(LoaderState::parse(text), state);
  // consumed counts the subset's entries, not the records.
  state.consumed = 91;
  EXPECT_THROW_WITH(LoaderState::parse(state.to_string()), ValueError, "outside [0, subset_size=90]");
  const std::string head = R"({"sampler":"random","seed":"0x0000000000000001","window_chunks":0,"records":5,"epoch":0,"consumed":0,)";
  EXPECT_THROW_WITH(LoaderState::parse(head + R"("version":2,"subset_hash":"0x0000000000000003","subset_size":1})"),
                    ValueError, "subsets came with version 3");
  EXPECT_THROW_WITH(LoaderState::parse(head + R"("version":3,"subset_size":1})"), ValueError, "'subset_hash' is missing");
  EXPECT_THROW_WITH(LoaderState::parse(head + R"("version":3,"subset_hash":"0x0000000000000000","subset_size":1})"),
                    ValueError, "'subset_hash' is 0, which no subset hashes to");
  EXPECT_THROW_WITH(LoaderState::parse(head + R"("version":3,"subset_hash":"0x0000000000000003"})"), ValueError,
                    "missing entry 'subset_size'");
  EXPECT_THROW(LoaderState::parse(head + R"("version":3,"subset_hash":"0x0000000000000003","subset_size":-1})"), ValueError);
  // Version 3 without a subset is read too (hand-written, or a later writer's).
  EXPECT_EQ(LoaderState::parse(head + R"("version":3})").subset_hash, 0u);
}

TEST(LoaderState, AVersion1StateResumesWhereItsOrderIsUnchanged) {
  // Version 1 wrote the seed as a JSON number. Its sequential orders, and every epoch's start
  // and end, are what they were; the middle of a random or quasi-random epoch is not (the
  // shuffles changed in version 2), so resuming there would repeat and skip records.
  const LoaderState sequential = LoaderState::parse(
      R"({"version":1,"sampler":"sequential","seed":18446744073709551615,"window_chunks":0,"records":5,"epoch":3,"consumed":2})");
  EXPECT_EQ(sequential.seed, 18446744073709551615ULL);
  EXPECT_EQ(sequential.consumed, 2);
  EXPECT_EQ(LoaderState::parse(R"({"version":1,"sampler":"random","seed":7,"window_chunks":0,"records":5,"epoch":3,"consumed":0})").seed, 7u);
  EXPECT_EQ(LoaderState::parse(R"({"version":1,"sampler":"random","seed":7,"window_chunks":0,"records":5,"epoch":3,"consumed":5})").consumed, 5);
  EXPECT_THROW_WITH(LoaderState::parse(R"({"version":1,"sampler":"random","seed":7,"window_chunks":0,"records":5,"epoch":3,"consumed":2})"),
                    ValueError, "Start the epoch over");
  EXPECT_THROW(LoaderState::parse(R"({"version":1,"sampler":"quasi_random","seed":7,"window_chunks":2,"records":5,"epoch":3,"consumed":4})"), ValueError);
  // A negative version-1 seed is one a reader held signed: read back as version-1 builds did.
  EXPECT_EQ(LoaderState::parse(R"({"version":1,"sampler":"sequential","seed":-1,"window_chunks":0,"records":5,"epoch":3,"consumed":2})").seed,
            18446744073709551615ULL);
  EXPECT_THROW(LoaderState::parse(R"({"version":1,"sampler":"sequential","seed":"7","window_chunks":0,"records":5,"epoch":3,"consumed":2})"), ValueError);
}

// Version 5 shuffles runs of 5 to 8 entries by a table (sampler.cc): a state of an older
// build in the middle of such an epoch counts positions of an order this build no longer
// makes, and is refused; one of an epoch of other sizes, or at an epoch's start, resumes. A
// state this build saves there is version 5, which older builds refuse by its version.
TEST_F(LoaderTest, AnOlderStateInTheMiddleOfAShuffleOfFiveToEightIsRefused) {
  Dataset six = Dataset::open(write_loader_dataset(dir, 6, {}, 16, "six.mmt"));
  Dataset forty = Dataset::open(write_loader_dataset(dir, 40, {}, 16, "forty.mmt"));
  LoaderOptions options;
  options.batch_size = 2;
  options.sampler.kind = SamplerKind::Random;
  options.sampler.seed = 3;
  const auto version4 = [&](const Dataset& ds, int64_t consumed) {
    return LoaderState::parse(R"({"version":4,"sampler":"random","seed":"0x0000000000000003","window_chunks":0,"records":)" +
                              std::to_string(ds.size()) + R"(,"epoch":1,"consumed":)" + std::to_string(consumed) + "}");
  };
  EXPECT_THROW_WITH(Loader(six, options, version4(six, 2)), ValueError,
                    "Loader: the state stands in the middle of epoch 1 (consumed=2 of 6), whose random order shuffles a "
                    "run of 5 to 8 entries");
  EXPECT_NO_THROW(Loader(six, options, version4(six, 0)));
  EXPECT_NO_THROW(Loader(six, options, version4(six, 6)));
  EXPECT_NO_THROW(Loader(forty, options, version4(forty, 2)));
  // This build's state there: version 5, and it resumes the exact sequence.
  Loader loader(six, options);
  std::vector<int64_t> seen;
  std::optional<Batch> first = loader.next();
  ASSERT_TRUE(first);
  seen.assign(first->indices().begin(), first->indices().end());
  const std::string saved = loader.state().to_string();
  first.reset();
  EXPECT_NE(saved.find(R"("version":5)"), std::string::npos) << saved;
  EXPECT_TRUE(LoaderState::parse(saved).shuffles_five_to_eight);
  Loader resumed(six, options, LoaderState::parse(saved));
  const std::vector<int64_t> rest = drain_epoch(resumed);
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, Sampler::create(6, options.sampler).epoch(0).to_vector());
  // At the epoch's end no position of its order is owed: version 2, for older builds too.
  EXPECT_NE(resumed.state().to_string().find(R"("version":2)"), std::string::npos) << resumed.state().to_string();
  // Forty records shuffle no such run: their states stay version 2, for older builds.
  Loader large(forty, options);
  ASSERT_TRUE(large.next());
  EXPECT_NE(large.state().to_string().find(R"("version":2)"), std::string::npos) << large.state().to_string();
  // Quasi-random over 6 chunks shuffles 6 slots: refused in the middle too.
  Dataset six_chunks = Dataset::open(write_loader_dataset(dir, 60, {}, 10, "six_chunks.mmt"));
  LoaderOptions quasi = options;
  quasi.sampler.kind = SamplerKind::QuasiRandom;
  quasi.sampler.window_chunks = 2;
  const LoaderState quasi4 = LoaderState::parse(
      R"({"version":4,"sampler":"quasi_random","seed":"0x0000000000000003","window_chunks":2,"records":60,"epoch":0,"consumed":10})");
  EXPECT_THROW_WITH(Loader(six_chunks, quasi, quasi4), ValueError, "whose quasi_random order shuffles a run of 5 to 8");
}

TEST_F(LoaderTest, RejectsBadOptions) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  LoaderOptions options;
  options.batch_size = 0;
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.batch_size = 2;
  options.num_workers = -1;
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.num_workers = 1;
  options.prefetch_batches = 0;
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.prefetch_batches = 2;
  options.sampler.rank = 3;
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.sampler.rank = 0;
  options.sampler.kind = static_cast<SamplerKind>(7);  // divided by zero in a worker (SIGFPE)
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.sampler.kind = SamplerKind::Random;
  options.epoch = -1;
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.epoch = INT64_MAX;
  EXPECT_THROW(Loader(dataset, options), ValueError);
  options.epoch = 0;
  {
    Loader loader(dataset, options);
    EXPECT_THROW(loader.set_epoch(-1), ValueError);
    EXPECT_THROW(loader.set_epoch(INT64_MAX), ValueError);
    EXPECT_EQ(drain_epoch(loader).size(), 10u) << "a refused epoch leaves the loader as it was";
  }
  options.device = Device(DeviceType::CUDA, cuda_device_count());  // one past the last
  EXPECT_THROW(Loader(dataset, options), CudaError);
  EXPECT_THROW(Loader(Dataset(), LoaderOptions{}), ValueError);
}

TEST_F(LoaderTest, HoldingEverySlotIsAnErrorNotAHang) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  LoaderOptions options = options_for(SamplerKind::Sequential, 4);
  options.prefetch_batches = 1;  // two slots
  Loader loader(dataset, options);
  EXPECT_EQ(loader.ring_slots(), 2);
  std::optional<Batch> a = loader.next();
  std::optional<Batch> b = loader.next();
  EXPECT_THROW(loader.next(), ValueError);
  a.reset();  // a slot comes back: the loader goes on
  std::optional<Batch> c = loader.next();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->indices()[0], 8);
}

TEST_F(LoaderTest, RingIsSizedExactlyOnce) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 100));
  LoaderOptions options = options_for(SamplerKind::Sequential, 64);
  options.fields = {"x", "image"};
  options.prefetch_batches = 2;
  Loader loader(dataset, options);
  // x: 64*16 bytes, image: 64*48 bytes, each region rounded to 256, three slots.
  EXPECT_EQ(loader.ring_bytes(), 3 * (1024 + 3072));
}

TEST_F(LoaderTest, ABatchSizeAboveTheDatasetAllocatesOnlyWhatAnEpochHolds) {
  // A validation set of 10 records read with a training batch size: one batch of 10, and a
  // ring of 10 rows a slot, not the billion rows (16 GB of "x" alone) the batch size names.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  LoaderOptions options = options_for(SamplerKind::Random, int64_t{1} << 30);
  options.fields = {"x", "image", "tokens"};
  options.prefetch_batches = 2;
  Loader loader(dataset, options);
  EXPECT_EQ(loader.ring_bytes(), 3 * (256 + 512 + 256 + 256));  // x 160, image 480, offsets 88, shapes 80
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->size(), 10);
  EXPECT_EQ(sorted({batch->indices().begin(), batch->indices().end()}), iota(10));
  expect_batch_matches_dataset(*batch, dataset, {"x", "image", "tokens"});
  batch.reset();
  EXPECT_FALSE(loader.next());

  // Three ranks split 10 records 4, 4 and 4 (padded) or 3, 3 and 3 (tail dropped): a slot
  // holds the 4 rows a padded rank takes (x 64, image 192, offsets 40, shapes 32 bytes).
  options.sampler.world_size = 3;
  options.sampler.rank = 2;
  for (bool drop_tail : {false, true}) {
    options.sampler.drop_tail = drop_tail;
    Loader ranked(dataset, options);
    EXPECT_EQ(ranked.ring_bytes(), 3 * (256 + 256 + 256 + 256));
    std::optional<Batch> part = ranked.next();
    ASSERT_TRUE(part);
    EXPECT_EQ(part->size(), drop_tail ? 3 : 4);
    expect_batch_matches_dataset(*part, dataset, {"x", "image", "tokens"});
    part.reset();
    EXPECT_FALSE(ranked.next());
  }
}

TEST_F(LoaderTest, AWorkerErrorNamesTheSampleAndChunk) {
  const std::string path = write_loader_dataset(dir, 160, CodecSpec{Codec::LZ4, 0});
  const ChunkInfo damaged = testing::damage_chunk(path, 3);
  const int64_t damaged_first = damaged.first_record, damaged_count = damaged.record_count;
  Dataset dataset = Dataset::open(path);
  // Every field, and the ragged field alone (a sequential batch of it is read as runs).
  for (const std::vector<std::string>& fields : {std::vector<std::string>{}, std::vector<std::string>{"tokens"}}) {
    LoaderOptions options = options_for(SamplerKind::Sequential, 16, 2);
    options.fields = fields;
    Loader loader(dataset, options);
    int good_batches = 0;
    try {
      while (std::optional<Batch> batch = loader.next()) {
        expect_batch_matches_dataset(*batch, dataset, fields.empty() ? kAllFields : fields);
        ++good_batches;
      }
      ADD_FAILURE() << "a damaged chunk went unnoticed";
    } catch (const FormatError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("chunk 3"), std::string::npos) << message;
      EXPECT_NE(message.find("sample " + std::to_string(damaged_first)), std::string::npos) << message;
    }
    EXPECT_EQ(good_batches, damaged_first / 16);  // the batches before it came through
    EXPECT_GT(damaged_count, 0);
    EXPECT_THROW(loader.next(), FormatError);     // the error is sticky...
    loader.set_epoch(0);                          // ...until a restart
    EXPECT_TRUE(loader.next().has_value());
  }
}

TEST_F(LoaderTest, DestroyingMidEpochIsPromptAndBatchesOutliveTheLoader) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 400, CodecSpec{Codec::Zstd, 1}));
  for (int round = 0; round < 20; ++round) {
    LoaderOptions options = options_for(SamplerKind::Random, 8, 4);
    options.prefetch_batches = 6;
    std::optional<Batch> kept;
    {
      Loader loader(dataset, options);
      for (int b = 0; b <= round % 3; ++b) kept = loader.next();
    }  // workers are busy filling slots here
    ASSERT_TRUE(kept);
    expect_batch_matches_dataset(*kept, dataset, kAllFields);
  }
  Loader never_used(dataset, options_for(SamplerKind::Random, 8, 4));
}

TEST_F(LoaderTest, BatchesCanBeReleasedFromAnotherThread) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 64));
  LoaderOptions options = options_for(SamplerKind::Sequential, 4);
  options.prefetch_batches = 1;
  Loader loader(dataset, options);
  int64_t count = 0;
  while (std::optional<Batch> batch = loader.next()) {
    std::thread releaser([b = std::move(*batch)]() mutable { b.release(); });
    releaser.join();
    ++count;
  }
  EXPECT_EQ(count, 16);
}

TEST_F(LoaderTest, ABatchReleasedOnAnotherThreadDuringARestartLeavesTheNewEpochIntact) {
  // The restart (set_epoch here; next() at an epoch's end too) waits for the workers with the
  // lock released. A batch released then used to schedule pieces from the old epoch's order
  // into the new epoch's slots: rows of the wrong samples, and slots marked ready too early.
  // Slow decoding (zstd, a cache of one byte) keeps the workers busy through the restart.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 3000, CodecSpec{Codec::Zstd, 19}, 16), [] {
    ReaderOptions reader;
    reader.cache_bytes = 1;
    return reader;
  }());
  LoaderOptions options = options_for(SamplerKind::Random, 64);
  options.sampler.seed = 3;
  options.fields = {"x", "label"};
  Loader loader(dataset, options);
  int64_t wrong = 0;
  for (int round = 0; round < 300 && wrong == 0; ++round) {
    std::optional<Batch> held = loader.next();
    ASSERT_TRUE(held);
    std::atomic<bool> go{false};
    std::thread releaser([&] {
      while (!go.load()) {
      }
      held.reset();
    });
    const int64_t epoch = loader.epoch() + 1;
    go = true;
    loader.set_epoch(epoch);
    releaser.join();
    const std::vector<int64_t> expected = loader.sampler().epoch(epoch).rank_indices();
    for (int64_t b = 0; b < 4; ++b) {  // as many as the ring has slots: each is refilled
      std::optional<Batch> batch = loader.next();
      ASSERT_TRUE(batch);
      EXPECT_EQ(batch->epoch(), epoch);
      EXPECT_EQ(batch->number(), b);
      const std::vector<int64_t> labels = (*batch)["label"].to_vector<int64_t>();
      for (int64_t row = 0; row < batch->size(); ++row) {
        wrong += batch->indices()[row] != expected[b * 64 + row];
        wrong += labels[row] != batch->indices()[row];  // the label of record i is i
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_F(LoaderTest, AnEmptyDatasetHasEmptyEpochs) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 0));
  Loader loader(dataset, options_for(SamplerKind::QuasiRandom, 4));
  EXPECT_FALSE(loader.next().has_value());
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_FALSE(loader.next().has_value());
}

}  // namespace
}  // namespace mmt
