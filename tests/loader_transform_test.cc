// SampleTransform: per-sample stages the loader's workers run, filling batch fields from a
// record's stored fields (loader.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <stdexcept>
#include <optional>
#include <thread>

#include "loader_test_util.h"
#include "mmtensor/error.h"
#include "mmtensor/loader.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;
using testing::write_loader_dataset;

// "padded": the ragged "tokens" of a record (i % 5 values) padded with -1 to a fixed [5],
// the decode of a variable-length value into a fixed-shape batch field.
SampleTransform pad_tokens() {
  return {.name = "padded",
          .inputs = {"tokens"},
          .dtype = kInt32,
          .shape = {5},
          .fn = [](const SampleTransform::Input& in, const Tensor& out) {
            const Tensor& tokens = in.fields[0];
            int32_t* dst = out.mutable_data_ptr<int32_t>();
            std::fill(dst, dst + 5, -1);
            const std::vector<int32_t> values = tokens.to_vector<int32_t>();
            std::copy(values.begin(), values.end(), dst);
          }};
}

// "scaled": x * 2 + label, from two inputs, as float32 [4].
SampleTransform scale_x() {
  return {.name = "scaled",
          .inputs = {"x", "label"},
          .dtype = kFloat32,
          .shape = {4},
          .fn = [](const SampleTransform::Input& in, const Tensor& out) {
            const std::vector<float> x = in.fields[0].to_vector<float>();
            const double label = static_cast<double>(in.fields[1].item<int64_t>());
            for (int k = 0; k < 4; ++k) out.mutable_data_ptr<float>()[k] = static_cast<float>(2 * x[k] + label);
          }};
}

// "seed": the sample's seed and record, as int64 [2].
SampleTransform record_seed() {
  return {.name = "seed",
          .inputs = {},
          .dtype = kInt64,
          .shape = {2},
          .fn = [](const SampleTransform::Input& in, const Tensor& out) {
            out.mutable_data_ptr<int64_t>()[0] = static_cast<int64_t>(in.seed);
            out.mutable_data_ptr<int64_t>()[1] = in.index;
          }};
}

class LoaderTransformTest : public ::testing::Test {
 protected:
  TempDir dir;
};

// The seeds of an epoch: one per sample, fixed by (seed, epoch, position).
std::vector<std::pair<int64_t, int64_t>> seeds_of_epoch(Loader& loader) {
  std::vector<std::pair<int64_t, int64_t>> out;
  while (std::optional<Batch> batch = loader.next()) {
    const Tensor& seeds = (*batch)["seed"];
    for (int64_t row = 0; row < batch->size(); ++row) {
      EXPECT_EQ(seeds[row][1].item<int64_t>(), batch->indices()[row]);
      out.emplace_back(seeds[row][0].item<int64_t>(), seeds[row][1].item<int64_t>());
    }
  }
  return out;
}

// A slow transform (heavy augmentation: 40 ms a sample here, 2 s a batch) held set_epoch()
// and the destructor until the worker's whole batch was done, and that batch was thrown away.
// A voided piece is now left between rows. (Bounds far above the expected few rows' worth.)
TEST_F(LoaderTransformTest, SetEpochAndDestructionDoNotWaitForASlowTransformsBatch) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 400, CodecSpec{}, 16, "slow.mmt"));
  std::atomic<int64_t> calls{0};
  SampleTransform slow = scale_x();
  slow.fn = [&calls, fn = slow.fn](const SampleTransform::Input& in, const Tensor& out) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    fn(in, out);
  };
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  {
    Loader loader(dataset, {.batch_size = 50, .transforms = {slow}, .num_workers = 1, .prefetch_batches = 2});
    ASSERT_TRUE(loader.next());  // the worker is on the batches after it now
    const Clock::time_point restart = Clock::now();
    loader.set_epoch(1);
    EXPECT_LT(seconds_since(restart), 0.5);  // was the rest of the piece: up to 1 s
    ASSERT_TRUE(loader.next());
    const Clock::time_point destroyed = Clock::now();
    const int64_t calls_before = calls.load();
    std::optional<Loader> gone(std::move(loader));
    gone.reset();
    EXPECT_LT(seconds_since(destroyed), 0.5);
    EXPECT_LT(calls.load() - calls_before, 10);
  }
}

// A transform given as a C function (what Python passes from numba or a shared library):
// contiguous inputs with their shapes, the output row, the seed and the record.
extern "C" int32_t sum_of_x_plus_label(const uint8_t* const* inputs, const int64_t* const* shapes,
                                       const int32_t* ndims, int32_t count, uint8_t* output, uint64_t seed,
                                       int64_t index) {
  if (count != 2 || ndims[0] != 1 || shapes[0][0] != 4 || ndims[1] != 0) return 1;
  const auto* x = reinterpret_cast<const float*>(inputs[0]);
  auto* out = reinterpret_cast<int64_t*>(output);
  out[0] = static_cast<int64_t>(x[0] + x[1] + x[2] + x[3]) + *reinterpret_cast<const int64_t*>(inputs[1]);
  out[1] = index;
  out[2] = static_cast<int64_t>(seed & 0x7fffffff);
  return index == 21 ? 5 : 0;
}

// Reads "image" ([3, 4, 4], stored channels-last: a strided view the C function gets copied
// contiguous, in logical order) as the sum of k * value[k], which only the right order gives.
extern "C" int32_t weighted_image_sum(const uint8_t* const* inputs, const int64_t* const* shapes, const int32_t* ndims,
                                      int32_t count, uint8_t* output, uint64_t, int64_t) {
  if (count != 1 || ndims[0] != 3 || shapes[0][0] != 3 || shapes[0][1] != 4 || shapes[0][2] != 4) return 1;
  int64_t sum = 0;
  for (int64_t k = 0; k < 48; ++k) sum += k * inputs[0][k];
  *reinterpret_cast<int64_t*>(output) = sum;
  return 0;
}

TEST_F(LoaderTransformTest, ACFunctionIsATransform) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 20));
  LoaderOptions options;
  options.batch_size = 20;
  options.num_workers = 2;
  options.fields = {"label"};
  options.transforms = {SampleTransform::from_c("sum", {"x", "label"}, kInt64, {3}, sum_of_x_plus_label),
                        SampleTransform::from_c("image_sum", {"image"}, kInt64, {1}, weighted_image_sum)};
  Loader loader(dataset, options);
  const std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  const Tensor sums = (*batch)["sum"];
  for (int64_t row = 0; row < 20; ++row) {
    const int64_t i = batch->indices()[static_cast<size_t>(row)];
    EXPECT_EQ(sums[row][0].item<int64_t>(), 40 * i + 6 + i);  // x = 10i + k, k < 4; label = i
    EXPECT_EQ(sums[row][1].item<int64_t>(), i);
    const Tensor image = dataset.get(i, "image");
    ASSERT_FALSE(image.is_contiguous());  // the strided view from_c copies
    const Tensor logical = image.contiguous();
    int64_t want = 0;
    for (int64_t k = 0; k < 48; ++k) want += k * logical.data_ptr<uint8_t>()[k];
    EXPECT_EQ((*batch)["image_sum"][row][0].item<int64_t>(), want) << i;
  }
  // A nonzero return fails the sample, named with the value.
  Dataset more = Dataset::open(write_loader_dataset(dir, 30, {}, 16, "more.mmt"));
  Loader failing(more, options);
  failing.next();
  EXPECT_THROW_WITH(failing.next(), Error, "sample 21 (row 1), transform 'sum': the C function of transform 'sum' returned 5");
  EXPECT_THROW_WITH(SampleTransform::from_c("x", {"x"}, kInt64, {1}, nullptr), ValueError, "has no function");
}

TEST_F(LoaderTransformTest, WorkersFillTheTransformsFieldsFromEachRecord) {
  for (CodecSpec codec : {CodecSpec{}, CodecSpec::parse("lz4")}) {
    Dataset dataset = Dataset::open(write_loader_dataset(dir, 70, codec, 16, "d" + codec.str() + ".mmt"));
    LoaderOptions options{.batch_size = 8, .fields = {"label"}, .transforms = {pad_tokens(), scale_x()},
                          .sampler = {.kind = SamplerKind::Random, .seed = 3}, .num_workers = 2};
    Loader loader(dataset, options);
    std::set<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) {
      EXPECT_EQ(batch->is_ragged("padded"), false);
      EXPECT_EQ((*batch)["padded"].sizes().vec(), (std::vector<int64_t>{batch->size(), 5}));
      EXPECT_EQ((*batch)["scaled"].dtype(), kFloat32);
      EXPECT_THROW_WITH((void)(*batch)["x"], ValueError, "it holds 'label', 'padded', 'scaled'");
      for (int64_t row = 0; row < batch->size(); ++row) {
        const int64_t i = batch->indices()[row];
        seen.insert(i);
        EXPECT_EQ((*batch)["label"][row].item<int64_t>(), i);
        const std::vector<int32_t> padded = (*batch)["padded"][row].to_vector<int32_t>();
        for (int64_t t = 0; t < 5; ++t)
          EXPECT_EQ(padded[t], t < i % 5 ? static_cast<int32_t>(i * 100 + t) : -1) << "record " << i << " t " << t;
        const std::vector<float> scaled = (*batch)["scaled"][row].to_vector<float>();
        for (int k = 0; k < 4; ++k) EXPECT_EQ(scaled[k], static_cast<float>(2 * (10 * i + k) + i)) << "record " << i;
      }
    }
    EXPECT_EQ(seen.size(), 70u);
  }
}

TEST_F(LoaderTransformTest, WithNoFieldsListedEveryStoredFieldNoTransformTakesOverIsLoaded) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  // scale_x reads "x" and "label": those come back only as its output.
  Loader loader(dataset, {.batch_size = 4, .transforms = {scale_x()}});
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_THROW_WITH((void)(*batch)["label"], ValueError, "it holds 'image', 'tokens', 'scaled')");
  // An output may take the name of an input it replaces: "x" decoded into "x".
  SampleTransform x_again = scale_x();
  x_again.name = "x";
  Loader renamed(dataset, {.batch_size = 4, .transforms = {x_again}});
  std::optional<Batch> renamed_batch = renamed.next();
  EXPECT_EQ((*renamed_batch)["x"][1].to_vector<float>(), (std::vector<float>{21, 23, 25, 27}));
  EXPECT_THROW_WITH((void)(*renamed_batch)["label"], ValueError, "it holds 'image', 'tokens', 'x')");
  // Listed fields: a name an output has is that output. Only outputs: nothing as stored.
  Loader listed(dataset, {.batch_size = 4, .fields = {"x", "label"}, .transforms = {x_again}});
  std::optional<Batch> listed_batch = listed.next();
  EXPECT_EQ((*listed_batch)["x"][1].to_vector<float>(), (std::vector<float>{21, 23, 25, 27}));
  EXPECT_EQ((*listed_batch)["label"][1].item<int64_t>(), 1);
  Loader only_outputs(dataset, {.batch_size = 4, .fields = {"scaled"}, .transforms = {scale_x()}});
  const std::optional<Batch> outputs_batch = only_outputs.next();
  EXPECT_THROW_WITH((void)(*outputs_batch)["x"], ValueError, "it holds 'scaled')");
}

TEST_F(LoaderTransformTest, ATransformRunsBesideALoadedRaggedField) {
  // Row pieces (fixed fields and transforms) and ragged pieces fill one slot side by side.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 50, CodecSpec::parse("lz4"), 8));
  Loader loader(dataset, {.batch_size = 6, .fields = {"tokens", "label"}, .transforms = {pad_tokens()},
                          .sampler = {.kind = SamplerKind::Random, .seed = 4}, .num_workers = 2});
  int64_t rows = 0;
  while (std::optional<Batch> batch = loader.next()) {
    testing::expect_batch_matches_dataset(*batch, dataset, {"tokens", "label"});
    const RaggedBatch& tokens = batch->ragged("tokens");
    const std::vector<int64_t> offsets = tokens.offsets.to_vector<int64_t>();
    const std::vector<int32_t> values = tokens.values.to_vector<int32_t>();
    for (int64_t row = 0; row < batch->size(); ++row, ++rows) {
      const std::vector<int32_t> padded = (*batch)["padded"][row].to_vector<int32_t>();
      const int64_t length = offsets[row + 1] - offsets[row];
      for (int64_t t = 0; t < 5; ++t)
        EXPECT_EQ(padded[t], t < length ? values[offsets[row] + t] : -1) << "row " << row;
    }
  }
  EXPECT_EQ(rows, 50);
}

TEST_F(LoaderTransformTest, ADamagedInputIsReportedWithItsTypeSampleAndChunk) {
  const std::string path = write_loader_dataset(dir, 64, CodecSpec::parse("lz4"), 16);
  const int64_t damaged_first = testing::damage_chunk(path, 2).first_record;
  Dataset dataset = Dataset::open(path);
  // Only the output: the transform's read is the first to meet the damage.
  Loader loader(dataset, {.batch_size = 8, .fields = {"scaled"}, .transforms = {scale_x()}});
  try {
    while (loader.next()) {
    }
    ADD_FAILURE() << "a damaged chunk went unnoticed";
  } catch (const ChecksumError& e) {
    EXPECT_NE(std::string(e.what()).find("sample " + std::to_string(damaged_first) + " (row 0), transform 'scaled', "
                                         "reading its inputs in chunk 2"),
              std::string::npos) << e.what();
  }
}

TEST_F(LoaderTransformTest, SeedsFollowTheSubsetAndRanksAndAPaddedRepeatGetsItsOwn) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  std::vector<int64_t> subset = {3, 5, 7, 11, 13, 17, 19};  // 7 entries over 2 ranks: one padded
  std::map<int64_t, std::vector<int64_t>> seeds_of_record;
  int64_t samples = 0;
  for (int rank = 0; rank < 2; ++rank) {
    LoaderOptions options{.batch_size = 2, .transforms = {record_seed()},
                          .sampler = {.kind = SamplerKind::Random, .seed = 9, .rank = rank, .world_size = 2,
                                      .subset = subset}};
    Loader loader(dataset, options);
    for (const auto& [seed, index] : seeds_of_epoch(loader)) {
      seeds_of_record[index].push_back(seed);
      ++samples;
    }
  }
  EXPECT_EQ(samples, 8);
  EXPECT_EQ(seeds_of_record.size(), 7u);
  std::set<int64_t> distinct;
  for (const auto& [index, seeds] : seeds_of_record) {
    EXPECT_TRUE(std::binary_search(subset.begin(), subset.end(), index)) << index;
    distinct.insert(seeds.begin(), seeds.end());
  }
  EXPECT_EQ(distinct.size(), 8u);  // the padded repeat's seed is not its original's
}

TEST_F(LoaderTransformTest, SeedsAreTheSameWhateverTheWorkersAndAfterAResume) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 60, CodecSpec::parse("zstd"), 8));
  LoaderOptions options{.batch_size = 7, .transforms = {record_seed()},
                        .sampler = {.kind = SamplerKind::QuasiRandom, .seed = 11}, .epoch = 2};
  options.num_workers = 0;
  Loader reference_loader(dataset, options);
  const auto reference = seeds_of_epoch(reference_loader);
  ASSERT_EQ(reference.size(), 60u);
  std::set<int64_t> distinct;
  for (const auto& [seed, index] : reference) distinct.insert(seed);
  EXPECT_EQ(distinct.size(), 60u);  // every sample its own
  for (int workers : {1, 3}) {
    options.num_workers = workers;
    Loader loader(dataset, options);
    EXPECT_EQ(seeds_of_epoch(loader), reference) << workers << " workers";
  }
  // A resume continues with the same seeds for the same samples.
  Loader interrupted(dataset, options);
  std::vector<std::pair<int64_t, int64_t>> seen;
  for (int b = 0; b < 3; ++b) {
    std::optional<Batch> batch = interrupted.next();
    for (int64_t row = 0; row < batch->size(); ++row)
      seen.emplace_back((*batch)["seed"][row][0].item<int64_t>(), batch->indices()[row]);
  }
  Loader resumed(dataset, options, interrupted.state());
  const auto rest = seeds_of_epoch(resumed);
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, reference);
  // Another epoch, another seed for every sample.
  const auto next_epoch = seeds_of_epoch(reference_loader);
  std::map<int64_t, int64_t> seed_of_record;
  for (const auto& [seed, index] : reference) seed_of_record[index] = seed;
  int same = 0;
  for (const auto& [seed, index] : next_epoch) same += seed_of_record[index] == seed;
  EXPECT_EQ(same, 0);
}

TEST_F(LoaderTransformTest, ATransformsExceptionNamesTheSampleAndKeepsTheOriginal) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 30));
  SampleTransform failing = scale_x();
  failing.fn = [](const SampleTransform::Input& in, const Tensor& out) {
    if (in.index == 17) throw std::runtime_error("cannot decode");
    out.zero_();
  };
  for (int workers : {0, 2}) {
    Loader loader(dataset, {.batch_size = 5, .transforms = {failing}, .num_workers = workers});
    bool thrown = false;
    try {
      while (loader.next()) {
      }
    } catch (const Error& e) {
      thrown = true;
      EXPECT_NE(std::string(e.what()).find("batch 3, sample 17 (row 2), transform 'scaled': cannot decode"),
                std::string::npos) << e.what();
      try {
        std::rethrow_if_nested(e);
        ADD_FAILURE() << "the transform's exception is not nested";
      } catch (const std::runtime_error& original) {
        EXPECT_STREQ(original.what(), "cannot decode");
      }
    }
    EXPECT_TRUE(thrown) << workers << " workers";
    EXPECT_THROW(loader.next(), Error);  // sticky until set_epoch
    loader.set_epoch(1);
  }
}

// A slow read the consumer must wait for: scale_x() that, on a worker thread (not the
// calling one, which gathers too), sleeps `ms` in each record of batch 0 (records 0 to 7 of
// batches of 8) and sets `worker_in_batch_0` first.
SampleTransform slow_in_batch_0_on_workers(int ms, std::atomic<bool>& worker_in_batch_0) {
  SampleTransform slow = scale_x();
  slow.fn = [consumer = std::this_thread::get_id(), ms, &worker_in_batch_0](const SampleTransform::Input& in,
                                                                           const Tensor& out) {
    if (in.index < 8 && std::this_thread::get_id() != consumer) {
      worker_in_batch_0 = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    out.zero_();
  };
  return slow;
}

// Whether `flag` was set within about 10 s.
bool wait_until_set(const std::atomic<bool>& flag) {
  for (int polls = 0; !flag && polls < 10000; ++polls) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag;
}

// A worker stuck on a slow read (here a transform that sleeps on a worker thread) makes
// next() give up after options.timeout, and a later next() gets the batch.
TEST_F(LoaderTransformTest, NextGivesUpAfterTheTimeoutAndALaterCallGetsTheBatch) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 16));
  std::atomic<bool> worker_in_batch_0{false};
  Loader loader(dataset, {.batch_size = 8, .transforms = {slow_in_batch_0_on_workers(40, worker_in_batch_0)},
                          .num_workers = 1, .timeout = std::chrono::milliseconds(20)});
  // Once the worker holds a piece of batch 0, next() gathers the rest and must wait for it.
  ASSERT_TRUE(wait_until_set(worker_in_batch_0));
  int timeouts = 0;
  std::optional<Batch> batch;
  while (!batch) {
    try {
      batch = loader.next();
      ASSERT_TRUE(batch);
    } catch (const IoError& e) {
      ++timeouts;
      EXPECT_EQ(e.errno_value(), ETIMEDOUT);
      EXPECT_NE(std::string(e.what()).find("epoch 0, batch 0 was not ready after 20 ms"), std::string::npos) << e.what();
      ASSERT_LT(timeouts, 100);
    }
  }
  EXPECT_GE(timeouts, 1);
  EXPECT_EQ(batch->number(), 0);  // the batch waited for, not a later one
  EXPECT_EQ(batch->indices()[0], 0);
  batch.reset();
  EXPECT_EQ(testing::drain_epoch(loader).size(), 8u);
  EXPECT_THROW(Loader(dataset, {.batch_size = 8, .timeout = std::chrono::milliseconds(-1)}), ValueError);
}

// A limit larger than the clock can add to now (milliseconds::max(), "forever") is no limit,
// not a deadline that wrapped into the past.
TEST_F(LoaderTransformTest, ATimeoutBeyondTheClockIsNoLimit) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 16));
  for (const auto timeout : {std::chrono::milliseconds::max(), std::chrono::milliseconds(int64_t{10'000'000'000'000})}) {
    std::atomic<bool> worker_in_batch_0{false};
    Loader loader(dataset, {.batch_size = 8, .transforms = {slow_in_batch_0_on_workers(40, worker_in_batch_0)},
                            .num_workers = 1, .timeout = timeout});
    ASSERT_TRUE(wait_until_set(worker_in_batch_0));
    std::optional<Batch> batch;
    ASSERT_NO_THROW(batch = loader.next()) << timeout.count() << " ms";
    ASSERT_TRUE(batch);
    EXPECT_EQ(batch->number(), 0);
  }
}

// next(poll) calls poll() while it waits (a binding checks for Ctrl-C there); an exception
// from poll() leaves next() with the batch first in line, as a timeout does, and without
// poll() counting it in state(). Polls come about every Loader::kPollInterval.
TEST_F(LoaderTransformTest, APollThatThrowsLeavesTheBatchFirstInLine) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 16));
  std::atomic<bool> worker_in_batch_0{false};
  Loader loader(dataset, {.batch_size = 8, .transforms = {slow_in_batch_0_on_workers(200, worker_in_batch_0)},
                          .num_workers = 1});
  ASSERT_TRUE(wait_until_set(worker_in_batch_0));
  const std::string state_before = loader.state().to_string();
  struct Interrupted {};
  int polls = 0;
  EXPECT_THROW(loader.next([&] {
    if (++polls == 2) throw Interrupted{};  // polled again while the worker still reads
  }), Interrupted);
  EXPECT_EQ(polls, 2);
  EXPECT_EQ(loader.state().to_string(), state_before);
  std::optional<Batch> batch = loader.next([] {});
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->number(), 0);  // the batch waited for, not a later one
  EXPECT_EQ(batch->indices()[0], 0);
  batch.reset();
  EXPECT_EQ(testing::drain_epoch(loader).size(), 8u);
}

TEST_F(LoaderTransformTest, BadTransformsAreRefusedWithTheReason) {
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  const auto refused = [&](SampleTransform transform, const std::string& text, std::vector<std::string> fields = {}) {
    LoaderOptions options{.batch_size = 2, .fields = std::move(fields), .transforms = {std::move(transform)}};
    EXPECT_THROW_WITH(Loader(dataset, options), ValueError, text);
  };
  SampleTransform t = scale_x();
  t.inputs = {"x", "lable"};
  refused(t, "transform 'scaled', input 'lable': ");
  t = scale_x();
  t.fn = nullptr;
  refused(t, "transform 'scaled' has no fn");
  t = scale_x();
  t.fn = [](const SampleTransform::Input&, const Tensor&) {};
  refused(t, "field 'x' is listed twice", {"x", "x"});
  refused(t, "Loader: LoaderOptions::fields: unknown field 'lable'; the schema has", {"x", "lable"});
  t = scale_x();
  t.shape = {4, 0};
  refused(t, "transform 'scaled'");
  t.shape = {-1};
  refused(t, "transform 'scaled'");
  t = scale_x();
  t.name = "";
  refused(t, "transform ''");
  LoaderOptions twice{.batch_size = 2, .transforms = {scale_x(), scale_x()}};
  EXPECT_THROW_WITH(Loader(dataset, twice), ValueError, "another transform fills already");
}

TEST_F(LoaderTransformTest, ReadAheadHintsTheTransformsInputsNotTheirOutputs) {
  // The hints name dataset fields: an output's name ("padded") is none, and must not be hinted.
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 40));
  Loader loader(dataset, {.batch_size = 8, .transforms = {pad_tokens()}, .num_workers = 2,
                          .read_ahead = ReadAhead::Always});
  int64_t rows = 0;
  while (std::optional<Batch> batch = loader.next()) rows += batch->size();
  EXPECT_EQ(rows, 40);
  EXPECT_GT(loader.stats().batches_read_ahead, 0);
}

}  // namespace
}  // namespace mmt
