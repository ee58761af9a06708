// Read-ahead: the policy that decides when the loader (and Dataset::get_batch) hints a
// batch's pages to the kernel, what Dataset::prefetch asks the kernel to read, and that
// hints never change a batch.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crafted_file_util.h"
#include "importer_test_util.h"
#include "loader_test_util.h"
#include "mmtensor/error.h"
#include "mmtensor/loader.h"
#include "page_cache.h"
#include "read_ahead.h"

namespace mmt {
namespace {

using detail::ReadAheadPolicy;
using testing::drain_epoch;
using testing::expect_batch_matches_dataset;
using testing::TempDir;
using testing::write_loader_dataset;

// Drops the file's pages from the page cache; false where that did not happen (files kept
// in memory by a tmpfs, a filesystem that ignores the advice): drop_from_page_cache checks.
bool evict(const std::string& path) { return detail::drop_from_page_cache(path); }

// The file, evicted, opened with Random advice: the open's own reads (preamble, footer)
// must not read around them, which on a disk with a large read_ahead_kb is the whole of a
// small file. nullopt where the file cannot be evicted.
std::optional<Dataset> open_cold(const std::string& path) {
  if (!evict(path)) return std::nullopt;
  ReaderOptions reader_options;
  reader_options.advice = AccessAdvice::Random;
  return Dataset::open(path, reader_options);
}

// Waits (up to 2 s) until the file's cached page count stops growing: the reads that hints
// started have arrived.
void wait_for_reads_to_settle(const std::string& path) {
  int64_t last = -1;
  for (int still = 0, polls = 0; still < 3 && polls < 200; ++polls) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::optional<detail::CachedPages> now = detail::cached_pages(path);
    const int64_t resident = now ? now->resident : -1;
    still = resident == last ? still + 1 : 0;
    last = resident;
  }
}

// Bytes the calling thread had read from storage while fn() ran.
template <typename Fn>
int64_t bytes_read_by(Fn&& fn) {
  return detail::thread_storage_read_by(std::forward<Fn>(fn));
}

TEST(ReadAheadPolicyTest, AutoHintsFromTheStartUntilEightHintsInARowFoundTheirBatchCached) {
  ReadAheadPolicy policy(ReadAhead::Auto);
  EXPECT_TRUE(policy.hinting());
  EXPECT_FALSE(policy.watching_faults());
  for (int i = 0; i < ReadAheadPolicy::kWarmHintsToStop - 1; ++i) policy.note_hint(0);
  policy.note_hint(4096);  // one batch that was read: the count starts again
  EXPECT_TRUE(policy.hinting());
  for (int i = 0; i < ReadAheadPolicy::kWarmHintsToStop - 1; ++i) policy.note_hint(0);
  EXPECT_TRUE(policy.hinting());
  policy.note_hint(0);
  EXPECT_FALSE(policy.hinting());
  EXPECT_TRUE(policy.watching_faults());
  EXPECT_EQ(policy.batches_hinted(), 2 * ReadAheadPolicy::kWarmHintsToStop);
}

TEST(ReadAheadPolicyTest, AutoTurnsHintsBackOnAtAMajorFaultAndSaysSoOnce) {
  ReadAheadPolicy policy(ReadAhead::Auto);
  for (int i = 0; i < ReadAheadPolicy::kWarmHintsToStop; ++i) policy.note_hint(0);
  ASSERT_FALSE(policy.hinting());
  EXPECT_FALSE(policy.note_gather_faults(0));
  EXPECT_FALSE(policy.hinting());
  EXPECT_TRUE(policy.note_gather_faults(3));  // the caller then hints what is scheduled
  EXPECT_TRUE(policy.hinting());
  EXPECT_FALSE(policy.note_gather_faults(5));  // already on
  policy.note_new_epoch();  // read bytes are known: an epoch changes nothing
  EXPECT_TRUE(policy.hinting());
}

TEST(ReadAheadPolicyTest, WithoutReadByteCountsAutoHintsUntilTheEpochEnds) {
  ReadAheadPolicy policy(ReadAhead::Auto);
  for (int i = 0; i < 3 * ReadAheadPolicy::kWarmHintsToStop; ++i) policy.note_hint(-1);
  EXPECT_TRUE(policy.hinting());
  policy.note_new_epoch();
  EXPECT_FALSE(policy.hinting());
  EXPECT_TRUE(policy.note_gather_faults(1));
}

TEST(ReadAheadPolicyTest, AlwaysAndNeverDoNotAdapt) {
  ReadAheadPolicy always(ReadAhead::Always), never(ReadAhead::Never);
  for (int i = 0; i < 2 * ReadAheadPolicy::kWarmHintsToStop; ++i) always.note_hint(0);
  always.note_new_epoch();
  EXPECT_TRUE(always.hinting());
  EXPECT_FALSE(never.hinting());
  EXPECT_FALSE(never.note_gather_faults(100));
  EXPECT_FALSE(never.hinting());
  EXPECT_FALSE(never.watching_faults());
}

TEST(ReadAheadPolicyTest, ThreadCountsAreReadable) {
  EXPECT_GE(detail::thread_major_faults(), 0);
  const int64_t read = detail::thread_storage_read_bytes();
  EXPECT_GE(read, -1);  // -1 only on a kernel without task I/O accounting
  EXPECT_GE(detail::process_storage_read_bytes(), read < 0 ? -1 : 0);
  std::string why_not;
  EXPECT_FALSE(detail::drop_from_page_cache("/nonexistent/file", &why_not));
  EXPECT_NE(why_not.find("/nonexistent/file"), std::string::npos) << why_not;
}

class LoaderReadAheadTest : public ::testing::TestWithParam<const char*> {
 protected:
  TempDir dir;
};

// Every batch equals get(i) whatever the hints, for fixed, channels-last and ragged fields,
// uncompressed and compressed, with workers and without; and the order is the same.
TEST_P(LoaderReadAheadTest, HintsNeverChangeABatch) {
  const std::string path = write_loader_dataset(dir, 203, CodecSpec::parse(GetParam()), 16);
  Dataset dataset = Dataset::open(path);
  const std::vector<std::string> fields = {"x", "label", "image", "tokens"};
  for (int workers : {0, 2}) {
    std::vector<int64_t> reference;
    for (ReadAhead mode : {ReadAhead::Never, ReadAhead::Always, ReadAhead::Auto}) {
      LoaderOptions options;
      options.batch_size = 10;
      options.sampler.kind = SamplerKind::Random;
      options.sampler.seed = 99;
      options.num_workers = workers;
      options.read_ahead = mode;
      Loader loader(dataset, options);
      std::vector<int64_t> order;
      int64_t batches = 0;
      while (std::optional<Batch> batch = loader.next()) {
        expect_batch_matches_dataset(*batch, dataset, fields);
        order.insert(order.end(), batch->indices().begin(), batch->indices().end());
        ++batches;
      }
      if (reference.empty()) reference = order;
      EXPECT_EQ(order, reference) << workers << " workers";
      const LoaderStats stats = loader.stats();
      if (mode == ReadAhead::Never) {
        EXPECT_EQ(stats.batches_read_ahead, 0);
        EXPECT_FALSE(stats.reading_ahead);
      }
      // Always hints each batch of the epoch (and, ahead, some of the next one's).
      if (mode == ReadAhead::Always) {
        EXPECT_GE(stats.batches_read_ahead, batches) << workers << " workers";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, LoaderReadAheadTest, ::testing::Values("none", "lz4", "zstd"));

TEST(LoaderReadAheadAutoTest, AWarmFileStopsBeingHintedAndAFileGoneColdIsHintedAgain) {
  if (detail::thread_storage_read_bytes() < 0) GTEST_SKIP() << "the kernel keeps no per-thread read_bytes";
  TempDir dir;
  const std::string path = write_loader_dataset(dir, 2000, {}, 64);
  if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  Dataset dataset = Dataset::open(path);
  LoaderOptions options;
  options.batch_size = 8;
  options.sampler.kind = SamplerKind::Random;
  // No workers: between next() calls nothing reads the file, so the eviction below holds
  // (a worker gathering the next epoch would map its pages again meanwhile).
  options.num_workers = 0;
  options.pin_memory = false;
  Loader loader(dataset, options);
  EXPECT_TRUE(loader.stats().reading_ahead);  // Auto starts hinting
  (void)drain_epoch(loader);  // the whole file is read: warm from here
  (void)drain_epoch(loader);
  const LoaderStats warm = loader.stats();
  EXPECT_GE(warm.batches_read_ahead, ReadAheadPolicy::kWarmHintsToStop);
  EXPECT_FALSE(warm.reading_ahead) << "a warm epoch kept hinting";
  // Hardly a batch more is hinted while the file stays cached: a stray major fault (the
  // machine evicting a page meanwhile) may turn hints on for a few batches, not for 250.
  (void)drain_epoch(loader);
  EXPECT_LE(loader.stats().batches_read_ahead - warm.batches_read_ahead,
            ReadAheadPolicy::kWarmHintsToStop + loader.ring_slots());

  // Cold again: the process lets go of the pages it mapped (a mapped page stays cached), the
  // file leaves the page cache, and the next gather's major faults turn the hints back on.
  const int64_t before_cold = loader.stats().batches_read_ahead;
  dataset.advise(AccessAdvice::DontNeed);
  if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path << " again";
  (void)drain_epoch(loader);
  EXPECT_GT(loader.stats().batches_read_ahead, before_cold) << "a cold file was not hinted again";
}

// When a gather's major fault turns hints back on, the batch being gathered is hinted too if
// pieces of it are still to be gathered (here its ragged field's, gathered after its fixed
// rows): their reads then run together rather than one fault at a time. A batch gathered in
// one piece is not: its gather is already under way. No workers and a ring of two slots, so
// the count is exact. Without workers the consumer gives the hints, before the pieces of the
// batch it waits for: with a ragged piece left, it hints its own batch and the one scheduled
// after it, then gathers the ragged piece; with none left, next() returns at once and the
// next batch's hint waits for the next call.
TEST(LoaderReadAheadAutoTest, TheFaultThatTurnsHintsOnAlsoHintsTheRestOfItsOwnBatch) {
  if (detail::thread_storage_read_bytes() < 0) GTEST_SKIP() << "the kernel keeps no per-thread read_bytes";
  TempDir dir;
  const std::string path = write_loader_dataset(dir, 2000, {}, 64);
  for (const bool with_ragged_piece : {true, false}) {
    SCOPED_TRACE(with_ragged_piece ? "fields x and tokens: two pieces a batch" : "field x: one piece a batch");
    Dataset dataset = Dataset::open(path);
    LoaderOptions options;
    options.batch_size = 8;
    options.fields = with_ragged_piece ? std::vector<std::string>{"x", "tokens"} : std::vector<std::string>{"x"};
    options.sampler.kind = SamplerKind::Random;
    options.num_workers = 0;
    options.prefetch_batches = 1;
    options.pin_memory = false;
    Loader loader(dataset, options);
    (void)drain_epoch(loader);  // the whole file is read: warm from here, and hints go off
    (void)drain_epoch(loader);
    ASSERT_FALSE(loader.stats().reading_ahead) << "a warm epoch kept hinting";
    dataset.advise(AccessAdvice::DontNeed);
    if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
    const int64_t before = loader.stats().batches_read_ahead;
    const std::optional<Batch> batch = loader.next();  // its first rows fault: hints go on
    ASSERT_TRUE(batch.has_value());
    EXPECT_TRUE(loader.stats().reading_ahead);
    EXPECT_EQ(loader.stats().batches_read_ahead - before, with_ragged_piece ? 2 : 0);
    expect_batch_matches_dataset(*batch, dataset, options.fields);
  }
}

TEST(DatasetPrefetchTest, AnUncompressedRecordIsHintedAloneNotItsWholeChunk) {
  if (detail::thread_storage_read_bytes() < 0) GTEST_SKIP() << "the kernel keeps no per-thread read_bytes";
  TempDir dir;
  // 4160-byte records, 240 a chunk: chunks of 998,400 bytes, padded to the alignment, so the
  // file is not one contiguous column and each record is found through its chunk.
  const std::string path = dir.file("p.mmt");
  Schema schema({Field::fixed("x", kFloat32, {1040})});
  WriterOptions writer_options;
  writer_options.chunk_records = 240;
  DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
  for (int64_t i = 0; i < 480; ++i) writer.append({full({1040}, static_cast<double>(i), kFloat32)});
  writer.finish();
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  Dataset& dataset = *cold;
  ASSERT_EQ(dataset.num_chunks(), 2);
  const std::vector<int64_t> one{300};
  const int64_t read = bytes_read_by([&] { dataset.prefetch(one); });
  EXPECT_GT(read, 0);
  EXPECT_LE(read, 3 * 4096) << "the hint read more than the record's pages";
  EXPECT_TRUE(dataset.get(300, "x").equal(full({1040}, 300.0, kFloat32)));
}

TEST(DatasetPrefetchTest, ARaggedRecordIsHintedByItsValuesNotItsWholeChunk) {
  if (detail::thread_storage_read_bytes() < 0) GTEST_SKIP() << "the kernel keeps no per-thread read_bytes";
  TempDir dir;
  // 64 documents of 16,384 int32 tokens (64 KiB each) and a label, in one 4 MiB chunk.
  const std::string path = dir.file("tokens.mmt");
  Schema schema({Field::fixed("label", kInt64, {}), Field::ragged("tokens", kInt32, {kVariableDim})});
  WriterOptions writer_options;
  writer_options.chunk_records = 64;
  DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
  for (int64_t i = 0; i < 64; ++i)
    writer.append({full({}, static_cast<double>(i), kInt64), full({16384}, static_cast<double>(i), kInt32)});
  writer.finish();
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  Dataset& dataset = *cold;
  ASSERT_EQ(dataset.num_chunks(), 1);
  const std::vector<int64_t> one{40};
  const int64_t read = bytes_read_by([&] { dataset.prefetch(one); });
  // The document's 64 KiB, and the few pages that say where it is.
  EXPECT_GE(read, 64 * 1024);
  EXPECT_LE(read, 64 * 1024 + 6 * 4096) << "the hint read more than the record's values";
  EXPECT_TRUE(dataset.get(40, "tokens").equal(full({16384}, 40.0, kInt32)));
  EXPECT_THROW(dataset.prefetch(std::vector<int64_t>{64}), IndexError);
}

TEST(DatasetPrefetchTest, RaggedRecordsInManyChunksAreLocatedTogetherNotOneFaultAChunk) {
  TempDir dir;
  // 64 chunks of 16 records, each with three ragged fields of 2-8 KiB values: a batch that
  // picks one record in each of 32 chunks must find 32 chunks' sections, up to three levels
  // deep. Hinted level by level, those reads arrive together; one chunk at a time (as before),
  // each was a blocking fault: 64 for "mask" here.
  const std::string path = dir.file("docs.mmt");
  Schema schema({Field::fixed("label", kInt64, {}), Field::ragged("tokens", kInt32, {kVariableDim}),
                 Field::ragged("mask", kUInt8, {kVariableDim}), Field::ragged("ids", kInt64, {kVariableDim})});
  WriterOptions writer_options;
  writer_options.chunk_records = 16;
  DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
  auto mask_of = [](int64_t i) { return full({8192 + i % 7}, static_cast<double>(i % 2), kUInt8); };
  auto ids_of = [](int64_t i) { return full({256 + i % 5}, static_cast<double>(i), kInt64); };
  for (int64_t i = 0; i < 1024; ++i)
    writer.append({full({}, static_cast<double>(i), kInt64), full({2048}, static_cast<double>(i % 1000), kInt32),
                   mask_of(i), ids_of(i)});
  writer.finish();
  std::vector<int64_t> batch;
  for (int64_t c = 62; c >= 0; c -= 2) batch.push_back(16 * c + c % 16);
  batch.push_back(batch.front());  // a chunk met again
  // Major faults of prefetch(batch, fields) on a cold file, and of reading the chosen fields
  // once the hinted reads have arrived; nullopt where the file cannot be made cold. The
  // kernel counts a wait for a page still being read as a major fault too, so on a disk that
  // answers one read at a time prefetch may take up to one a chunk and level in the worst
  // case; located chunk by chunk, it took one each every time (64 here).
  constexpr int64_t kPrefetchBound = 32, kAfterBound = 4;
  auto cold_faults = [&](const std::vector<std::string>& fields, auto check_record) {
    std::optional<Dataset> cold = open_cold(path);
    if (!cold) return std::optional<std::pair<int64_t, int64_t>>{};
    const int64_t before = detail::thread_major_faults();
    cold->prefetch(batch, fields);
    const int64_t prefetching = detail::thread_major_faults() - before;
    wait_for_reads_to_settle(path);
    const int64_t after_before = detail::thread_major_faults();
    for (int64_t i : batch) check_record(*cold, i);
    return std::optional<std::pair<int64_t, int64_t>>{{prefetching, detail::thread_major_faults() - after_before}};
  };
  // The second field chosen, the first not: the walk goes through it.
  const auto mask = cold_faults({"label", "mask"}, [&](const Dataset& dataset, int64_t i) {
    EXPECT_EQ(dataset.get(i, "label").item<int64_t>(), i);
    EXPECT_TRUE(dataset.get(i, "mask").equal(mask_of(i))) << i;
  });
  if (!mask) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  EXPECT_LE(mask->first, kPrefetchBound) << "locating 32 chunks' sections took " << mask->first << " blocking reads";
  EXPECT_LE(mask->second, kAfterBound) << "the hints missed pages: reading took " << mask->second << " blocking reads";
  // The first and third chosen, the one between not.
  const auto outer = cold_faults({"tokens", "ids"}, [&](const Dataset& dataset, int64_t i) {
    EXPECT_TRUE(dataset.get(i, "tokens").equal(full({2048}, static_cast<double>(i % 1000), kInt32))) << i;
    EXPECT_TRUE(dataset.get(i, "ids").equal(ids_of(i))) << i;
  });
  ASSERT_TRUE(outer);
  EXPECT_LE(outer->first, kPrefetchBound) << "locating 32 chunks' sections took " << outer->first << " blocking reads";
  EXPECT_LE(outer->second, kAfterBound) << "the hints missed pages: reading took " << outer->second << " blocking reads";
}

TEST(DatasetPrefetchTest, NoFieldHintsNothingButStillChecksTheIndices) {
  TempDir dir;
  const std::string path = write_loader_dataset(dir, 40, CodecSpec::parse("lz4"), 8);
  const std::vector<std::string> none;
  EXPECT_THROW(Dataset::open(path).prefetch(std::vector<int64_t>{40}, none), IndexError);
  std::optional<Dataset> cold = open_cold(path);
  if (!cold || detail::thread_storage_read_bytes() < 0) GTEST_SKIP() << "cannot measure cold reads of " << path;
  const std::vector<int64_t> some{1, 17, 33};
  EXPECT_EQ(bytes_read_by([&] { cold->prefetch(some, none); }), 0) << "no field was asked for";
}

TEST(PageCacheTest, DroppingAFileChecksThatItsPagesLeft) {
  TempDir dir;
  const std::string path = write_loader_dataset(dir, 64);
  std::string why_not;
  if (!detail::drop_from_page_cache(path, &why_not)) GTEST_SKIP() << why_not;
  const std::optional<detail::CachedPages> after = detail::cached_pages(path);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->resident, 0);
  EXPECT_GT(after->total, 0);
  {
    // Pages a mapping maps stay cached: the drop says so rather than report a cold file.
    Dataset dataset = Dataset::open(path);
    for (int64_t i = 0; i < dataset.size(); ++i) (void)dataset.get(i, "x").clone();  // read, not just viewed
    EXPECT_FALSE(detail::drop_from_page_cache(path, &why_not));
    EXPECT_NE(why_not.find("still in the page cache"), std::string::npos) << why_not;
  }
  EXPECT_TRUE(detail::drop_from_page_cache(path, &why_not)) << why_not;
}

TEST(DatasetPrefetchTest, OnlyTheFieldsAskedForAreHinted) {
  if (detail::thread_storage_read_bytes() < 0) GTEST_SKIP() << "the kernel keeps no per-thread read_bytes";
  TempDir dir;
  // 64 KiB images beside 8-byte labels: a loader of labels must not read the images.
  const std::string path = dir.file("images.mmt");
  Schema schema({Field::fixed("image", kUInt8, {65536}), Field::fixed("label", kInt64, {})});
  DatasetWriter writer = DatasetWriter::create(path, schema);
  for (int64_t i = 0; i < 64; ++i) writer.append({full({65536}, static_cast<double>(i), kUInt8), full({}, static_cast<double>(i), kInt64)});
  writer.finish();
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  Dataset& dataset = *cold;
  const std::vector<int64_t> some{3, 17, 40};
  const std::vector<std::string> label{"label"};
  const int64_t labels_read = bytes_read_by([&] { dataset.prefetch(some, label); });
  EXPECT_GT(labels_read, 0);
  EXPECT_LE(labels_read, 3 * 2 * 4096) << "hinting labels read their images";
  EXPECT_GE(bytes_read_by([&] { dataset.prefetch(some); }), 3 * 65536 - labels_read) << "every field, when none is named";
  const std::vector<std::string> unknown{"imgae"};
  const std::string message = testing::error_of([&] { dataset.prefetch(some, unknown); });
  EXPECT_NE(message.find("imgae"), std::string::npos) << message;
}

// The read-ahead tests below lay records out for 4 KiB pages.
bool four_kib_pages() { return ::sysconf(_SC_PAGESIZE) == 4096; }

// get_batch's own read-ahead (ReaderOptions::read_ahead). 2000 records of 4160 bytes (a
// float32 [1040] each, value = the record's index), 240 a chunk: 8.3 MB, each record on
// pages of its own; or records [first, stop) of them, a shard of the 2000, `chunk_records` a
// chunk.
std::string write_page_sized_records(const TempDir& dir, const std::string& name = "pages.mmt", int64_t first = 0,
                                     int64_t stop = 2000, int64_t chunk_records = 240) {
  const std::string path = dir.file(name);
  Schema schema({Field::fixed("x", kFloat32, {1040}), Field::fixed("label", kInt64, {})});
  WriterOptions writer_options;
  writer_options.chunk_records = chunk_records;
  DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
  for (int64_t i = first; i < stop; ++i)
    writer.append({full({1040}, static_cast<double>(i), kFloat32), full({}, static_cast<double>(i), kInt64)});
  writer.finish();
  return path;
}

// The 2000 records in three shards, read as one by Dataset::open_concat. Chunks of 256
// records fill whole pages, so each shard's records lie back to back (the contiguous fixed
// layout), and a batch over the shards is gathered as one run; chunks of 240 do not, and a
// batch is gathered part by part.
std::vector<std::string> write_page_sized_shards(const TempDir& dir, int64_t chunk_records = 256) {
  return {write_page_sized_records(dir, "shard-0.mmt", 0, 700, chunk_records),
          write_page_sized_records(dir, "shard-1.mmt", 700, 1300, chunk_records),
          write_page_sized_records(dir, "shard-2.mmt", 1300, 2000, chunk_records)};
}

// Shards laid out back to back (gathered as one run), or not (gathered part by part): Auto
// decides for the whole batch either way.
struct ShardLayout {
  int64_t chunk_records;
  bool one_run;
};
std::string shard_layout_name(const ::testing::TestParamInfo<ShardLayout>& info) {
  return info.param.one_run ? "OneRun" : "PartByPart";
}
class ShardsReadAheadTest : public ::testing::TestWithParam<ShardLayout> {};
INSTANTIATE_TEST_SUITE_P(Layouts, ShardsReadAheadTest, ::testing::Values(ShardLayout{256, true}, ShardLayout{240, false}),
                         shard_layout_name);

// Whether each part's own read-ahead hinted nothing (the concatenation's decides for it).
bool parts_hinted_nothing(const Dataset& shards) {
  for (const Dataset& part : shards.parts())
    if (part.read_ahead_stats().batches_read_ahead != 0) return false;
  return true;
}

// `count` distinct records from `first` on, `step` apart, wrapping around 2000.
std::vector<int64_t> spread_records(int64_t first, int64_t count, int64_t step = 7) {
  std::vector<int64_t> indices;
  for (int64_t k = 0; k < count; ++k) indices.push_back((first + k * step) % 2000);
  return indices;
}

void expect_gathered(const Tensor& x, std::span<const int64_t> indices) {
  for (size_t b = 0; b < indices.size(); ++b)
    ASSERT_EQ(x[static_cast<int64_t>(b)][1039].item<float>(), static_cast<float>(indices[b])) << "row " << b;
}

// Whether the kernel counts what a hint of `path` makes it read in the hinting thread's
// read_bytes (not on FUSE or NFS, say, where Auto cannot tell a warm hint from a cold one and
// hints until a gather is fast). Leaves the file evicted.
bool hints_are_charged_to_the_thread(const std::string& path) {
  if (detail::thread_storage_read_bytes() < 0) return false;
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) return false;
  const int64_t read = bytes_read_by([&] { cold->prefetch(std::vector<int64_t>{cold->size() / 2}); });
  cold->advise(AccessAdvice::DontNeed);
  *cold = Dataset();
  return read > 0 && evict(path);
}

// Auto (the default): a cold batch is hinted before it is gathered, from the first one on
// (its pages found missing with mincore); a warm file is not hinted, and hints stop once
// eight in a row found their batch cached.
TEST(DatasetReadAheadTest, AutoHintsColdBatchesFromTheFirstAndStopsOnceTheyAreCached) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  if (!hints_are_charged_to_the_thread(path)) GTEST_SKIP() << "reads of " << path << " are not charged to the thread";
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  Dataset& dataset = *cold;
  EXPECT_EQ(dataset.read_ahead_stats().batches_read_ahead, 0);
  EXPECT_FALSE(dataset.read_ahead_stats().reading_ahead) << "Auto starts with hints off";
  const std::vector<int64_t> batch = spread_records(5, 64);
  expect_gathered(dataset.get_batch(batch, "x"), batch);
  EXPECT_EQ(dataset.read_ahead_stats().batches_read_ahead, 1) << "the first, cold batch was not hinted";
  EXPECT_TRUE(dataset.read_ahead_stats().reading_ahead);
  // The same records again: cached now, so each hint reads nothing; the eighth such stops them.
  for (int64_t k = 0; k < ReadAheadPolicy::kWarmHintsToStop; ++k) expect_gathered(dataset.get_batch(batch, "x"), batch);
  EXPECT_FALSE(dataset.read_ahead_stats().reading_ahead);
  EXPECT_EQ(dataset.read_ahead_stats().batches_read_ahead, 1 + ReadAheadPolicy::kWarmHintsToStop);
  for (int k = 0; k < 20; ++k) expect_gathered(dataset.get_batch(batch, "x"), batch);
  EXPECT_EQ(dataset.read_ahead_stats().batches_read_ahead, 1 + ReadAheadPolicy::kWarmHintsToStop) << "a warm batch was hinted";

  // A warm file is not hinted at all.
  for (int64_t first = 0; first < 2000; first += 100) (void)dataset.get_batch(spread_records(first, 100, 1), "x");
  ReaderOptions random_advice;  // no read-around below: the file stays cold where not read
  random_advice.advice = AccessAdvice::Random;
  Dataset warm = Dataset::open(path, random_advice);
  for (int k = 0; k < 10; ++k) (void)warm.get_batch(spread_records(k, 256), "x");
  EXPECT_EQ(warm.read_ahead_stats().batches_read_ahead, 0);

  // The file goes cold under the open dataset: a gather that waited for the disk has the next
  // batch checked, which is hinted.
  warm.advise(AccessAdvice::DontNeed);
  dataset.advise(AccessAdvice::DontNeed);
  if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path << " again";
  for (int k = 0; k < 4 && warm.read_ahead_stats().batches_read_ahead == 0; ++k) {
    const std::vector<int64_t> fresh = spread_records(11 * k + 1, 256, 29);  // not neighbours: hinted when cold
    expect_gathered(warm.get_batch(fresh, "x"), fresh);
  }
  EXPECT_GE(warm.read_ahead_stats().batches_read_ahead, 1) << "a file gone cold was not hinted";
}

// What a run_as_nobody() child found: `skipped` where it could not read as nobody (then
// `failure` says why); otherwise what went wrong, or "" when nothing did.
struct NobodyRun {
  bool skipped = false;
  std::string failure;
};

// Runs body() in a child process as the user nobody, who neither owns nor may write the
// files `paths` (made readable to others first), so that mincore() would make its answer up
// for that user. body() returns what went wrong ("" when nothing did); the child sends it
// back through a pipe.
NobodyRun run_as_nobody(const TempDir& dir, const std::vector<std::string>& paths,
                        const std::function<std::string()>& body) {
  std::filesystem::permissions(dir.path(), std::filesystem::perms::others_read | std::filesystem::perms::others_exec,
                               std::filesystem::perm_options::add);
  for (const std::string& path : paths)
    std::filesystem::permissions(path, std::filesystem::perms::others_read, std::filesystem::perm_options::add);
  constexpr int kSkipped = 10;
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return {false, "pipe failed"};
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return {false, "fork failed"};
  }
  if (child == 0) {
    ::close(pipe_fds[0]);
    const auto finish = [&](int code, const std::string& message) {
      (void)!::write(pipe_fds[1], message.data(), message.size());
      ::_exit(code);
    };
    // nobody; dumpable again, so that it may read its own /proc/thread-self/io.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0 || ::prctl(PR_SET_DUMPABLE, 1) != 0)
      finish(kSkipped, "cannot become nobody here");
    if (detail::thread_storage_read_bytes() < 0) finish(kSkipped, "nobody cannot read its own read_bytes here");
    for (const std::string& path : paths)
      if (::access(path.c_str(), R_OK) != 0) finish(kSkipped, "nobody cannot read " + path + " here");
    try {
      finish(0, body());
    } catch (const std::exception& e) {
      finish(0, std::string("an exception: ") + e.what());
    } catch (...) {  // nothing may unwind into gtest, which would run the rest of the suite here
      finish(0, "an exception");
    }
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buffer[256];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return {false, "the child did not exit normally"};
  return {WEXITSTATUS(status) == kSkipped, message};
}

// Why a test reading as nobody cannot run here, or nothing.
std::optional<std::string> cannot_read_as_nobody() {
  if (::geteuid() != 0) return "needs root, to read the file as a user who neither owns nor may write it";
  // The child allocates, and the parent's pool threads may be inside malloc: under GCC 12's
  // AddressSanitizer, whose allocator is not fork-safe (test_util.h), that child can hang.
  if (testing::kAddressSanitizer) return "GCC 12's AddressSanitizer allocator is not fork-safe";
  return std::nullopt;
}

// Where mincore() would make its answer up (a file the reader neither owns nor may write),
// a sample of the first batch (eight records) is hinted to find out whether the file is
// cold: hints go on when that read anything, and stay off for a warm file. Run as another
// user in a child process.
TEST(DatasetReadAheadTest, WhereMincoreWouldNotTellTheFirstBatchIsSampledToFindOut) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  if (const auto why = cannot_read_as_nobody()) GTEST_SKIP() << *why;
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  if (!hints_are_charged_to_the_thread(path)) GTEST_SKIP() << "reads of " << path << " are not charged to the thread";
  if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  const NobodyRun run = run_as_nobody(dir, {path}, [&]() -> std::string {
    const std::vector<int64_t> batch = spread_records(5, 64);
    ReaderOptions random_advice;  // the open's own reads must not read the small file around them
    random_advice.advice = AccessAdvice::Random;
    const Dataset cold = Dataset::open(path, random_advice);
    const Tensor x = cold.get_batch(batch, "x");
    if (x[63][0].item<float>() != static_cast<float>(batch[63])) return "the batch is wrong";
    if (cold.read_ahead_stats().batches_read_ahead != 1 || !cold.read_ahead_stats().reading_ahead)
      return "a cold first batch did not turn hints on";
    const Dataset warm = Dataset::open(path);
    (void)warm.get_batch(batch, "x");
    if (warm.read_ahead_stats().batches_read_ahead != 0 || warm.read_ahead_stats().reading_ahead)
      return "a warm first batch was hinted, or turned hints on";
    for (int k = 0; k < 20; ++k) (void)warm.get_batch(batch, "x");
    if (warm.read_ahead_stats().batches_read_ahead != 0) return "a warm file went on being hinted";
    return "";
  });
  if (run.skipped) GTEST_SKIP() << run.failure;
  EXPECT_EQ(run.failure, "");
}

// Shards read as one: Auto checks the first batch, hints it whole (over all its parts at
// once, the parts' own read-ahead left out) when it is cold, and read_ahead_stats() counts
// that one hint; a batch of neighbouring records is left to the kernel; a warm set of shards
// is not hinted.
TEST_P(ShardsReadAheadTest, ShardsReadAsOneHintAColdFirstBatchWholeAndCountIt) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  TempDir dir;
  const std::vector<std::string> paths = write_page_sized_shards(dir, GetParam().chunk_records);
  if (!hints_are_charged_to_the_thread(paths[1])) GTEST_SKIP() << "reads of " << paths[1] << " are not charged to the thread";
  for (const std::string& path : paths)
    if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  ReaderOptions random_advice;  // the open's own reads must not read the small files around them
  random_advice.advice = AccessAdvice::Random;
  const Dataset cold = Dataset::open_concat(paths, random_advice);
  ASSERT_EQ(cold.parts()[0].column_is_view("x"), GetParam().one_run);  // the layout this test is about
  EXPECT_EQ(cold.read_ahead_stats().batches_read_ahead, 0);
  const std::vector<int64_t> batch = spread_records(5, 64, 29);  // in every shard
  expect_gathered(cold.get_batch(batch, "x"), batch);
  EXPECT_EQ(cold.read_ahead_stats().batches_read_ahead, 1) << "the cold first batch was not hinted, or not counted";
  EXPECT_TRUE(cold.read_ahead_stats().reading_ahead);
  // Hints are on now. Neighbours across a shard's end, cold: gathered unhinted all the same,
  // left to the kernel; then a cold random batch, hinted (hints stay on while they find cold
  // pages, whatever the gathers took).
  const std::vector<int64_t> run = spread_records(600, 200, 1);
  expect_gathered(cold.get_batch(run, "x"), run);
  EXPECT_EQ(cold.read_ahead_stats().batches_read_ahead, 1) << "a batch of neighbouring records was hinted";
  const std::vector<int64_t> random = spread_records(1001, 64, 13);
  expect_gathered(cold.get_batch(random, "x"), random);
  EXPECT_EQ(cold.read_ahead_stats().batches_read_ahead, 2) << "a cold random batch was not hinted";
  EXPECT_TRUE(parts_hinted_nothing(cold)) << "a part hinted its own share of a batch";

  for (int64_t first = 0; first < 2000; first += 100) (void)cold.get_batch(spread_records(first, 100, 1), "x");
  const Dataset warm = Dataset::open_concat(paths, random_advice);
  for (int k = 0; k < 10; ++k) (void)warm.get_batch(spread_records(k, 256), "x");
  EXPECT_EQ(warm.read_ahead_stats().batches_read_ahead, 0);
  EXPECT_FALSE(warm.read_ahead_stats().reading_ahead);
}

// The same where mincore() would make its answer up: eight of the first batch's records are
// hinted, and what that read says the shards are cold. Run as another user in a child.
TEST_P(ShardsReadAheadTest, ShardsWhereMincoreWouldNotTellAreSampledToFindOut) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  if (const auto why = cannot_read_as_nobody()) GTEST_SKIP() << *why;
  TempDir dir;
  const std::vector<std::string> paths = write_page_sized_shards(dir, GetParam().chunk_records);
  if (!hints_are_charged_to_the_thread(paths[1])) GTEST_SKIP() << "reads of " << paths[1] << " are not charged to the thread";
  for (const std::string& path : paths)
    if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  const NobodyRun run = run_as_nobody(dir, paths, [&]() -> std::string {
    const std::vector<int64_t> batch = spread_records(5, 64, 29);
    ReaderOptions random_advice;
    random_advice.advice = AccessAdvice::Random;
    const Dataset cold = Dataset::open_concat(paths, random_advice);
    const Tensor x = cold.get_batch(batch, "x");
    if (x[63][0].item<float>() != static_cast<float>(batch[63])) return "the batch is wrong";
    if (cold.read_ahead_stats().batches_read_ahead != 1 || !cold.read_ahead_stats().reading_ahead)
      return "a cold first batch was not hinted once, as a whole";
    if (!parts_hinted_nothing(cold)) return "a part hinted its own share of the batch";
    const Dataset warm = Dataset::open_concat(paths);
    for (int k = 0; k < 20; ++k) (void)warm.get_batch(batch, "x");
    if (warm.read_ahead_stats().batches_read_ahead != 0 || warm.read_ahead_stats().reading_ahead)
      return "warm shards were hinted";
    return "";
  });
  if (run.skipped) GTEST_SKIP() << run.failure;
  EXPECT_EQ(run.failure, "");
}

// Opening a cold file reads a few pages at either end of it, whatever the advice: not the
// megabytes the kernel's read-around would add to each (read_ahead_kb), which a set of shards
// opened together paid for every shard.
TEST(DatasetOpenTest, AColdOpenReadsAFewPagesWhateverTheAdvice) {
  if (!four_kib_pages()) GTEST_SKIP() << "a few pages: of 4 KiB";
  TempDir dir;
  const std::string path = write_page_sized_records(dir);  // 8.3 MB
  if (!hints_are_charged_to_the_thread(path)) GTEST_SKIP() << "reads of " << path << " are not charged to the thread";
  for (AccessAdvice advice : {AccessAdvice::Normal, AccessAdvice::Sequential, AccessAdvice::Random}) {
    if (!evict(path)) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
    ReaderOptions options;
    options.advice = advice;
    Dataset dataset;
    const int64_t read = bytes_read_by([&] { dataset = Dataset::open(path, options); });
    EXPECT_LE(read, 64 << 10) << "advice " << static_cast<int>(advice);
    expect_gathered(dataset.get_batch(std::vector<int64_t>{1999, 0}, "x"), std::vector<int64_t>{1999, 0});
  }
}

// How the kernel reads around a fault in the mapping that holds `address`: "rr" (MADV_RANDOM),
// "sr" (MADV_SEQUENTIAL) or "" (normal), from its VmFlags in /proc/self/smaps.
std::string read_pattern_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char permissions[5] = {};
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s", &begin, &end, permissions) == 3) {  // a mapping's first line
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      for (const char* pattern : {" rr", " sr"})
        if (line.find(pattern) != std::string::npos) return pattern + 1;
      return "";
    }
  }
  return "?";
}

// The reader's advice holds once the open (which reads under MADV_RANDOM) is done, and again
// after verify() (which scans under MADV_SEQUENTIAL): WillNeed and DontNeed, which do not set
// a read pattern, leave the kernel's normal one, not the open's.
TEST(DatasetOpenTest, TheReadersAdviceHoldsAfterTheOpenAndAfterVerify) {
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  const std::pair<AccessAdvice, const char*> expected[] = {
      {AccessAdvice::Normal, ""},    {AccessAdvice::Random, "rr"},  {AccessAdvice::Sequential, "sr"},
      {AccessAdvice::WillNeed, ""}, {AccessAdvice::DontNeed, ""}};
  for (const auto& [advice, pattern] : expected) {
    ReaderOptions options;
    options.advice = advice;
    const Dataset dataset = Dataset::open(path, options);
    const void* mapped = dataset.get(0)["x"].data_ptr();  // uncompressed: a view into the mapping
    EXPECT_EQ(read_pattern_at(mapped), pattern) << "after the open, advice " << static_cast<int>(advice);
    dataset.verify();
    EXPECT_EQ(read_pattern_at(mapped), pattern) << "after verify(), advice " << static_cast<int>(advice);
  }
}

// A batch of records close together (a sequential scan, a shard read in order) is left to the
// kernel's own readahead, which runs ahead of the reader: hinting it just before the gather
// would read it alone (3.5-4x slower for a cold sequential scan). A random batch after it is
// checked (the dense gather was slow) and hinted.
TEST(DatasetReadAheadTest, AutoLeavesBatchesOfNeighbouringRecordsToTheKernel) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  for (int64_t first = 1000; first < 1512; first += 256) {
    const std::vector<int64_t> run = spread_records(first, 256, 1);
    expect_gathered(cold->get_batch(run, "x"), run);
  }
  std::vector<int64_t> shuffled = spread_records(1600, 200, 1);  // dense, in any order
  std::reverse(shuffled.begin(), shuffled.end());
  expect_gathered(cold->get_batch(shuffled, "x"), shuffled);
  EXPECT_EQ(cold->read_ahead_stats().batches_read_ahead, 0);
  const std::vector<int64_t> random = spread_records(3, 64, 29);
  expect_gathered(cold->get_batch(random, "x"), random);
  EXPECT_EQ(cold->read_ahead_stats().batches_read_ahead, 1) << "a cold random batch after a slow gather was not hinted";
}

// The check after a slow gather belongs to the dataset that gathered: a warm dataset read in
// turn on the same thread neither uses it up nor pays for it.
TEST(DatasetReadAheadTest, AColdFileReadInTurnWithAWarmOneIsStillChecked) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  TempDir other_dir;
  const std::string other_path = write_page_sized_records(other_dir);
  const Dataset other = Dataset::open(other_path);
  for (int64_t first = 0; first < 2000; first += 250) (void)other.get_batch(spread_records(first, 250, 1), "x");
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  // Its first batch is checked and hinted; hints then stay on. Turn them off on a few
  // records read again and again, then read new records in turn with the warm dataset.
  const std::vector<int64_t> few = spread_records(0, 16, 13);
  for (int64_t k = 0; k <= ReadAheadPolicy::kWarmHintsToStop; ++k) (void)cold->get_batch(few, "x");
  ASSERT_FALSE(cold->read_ahead_stats().reading_ahead);
  // Uses up the check that follows the last hint, on a warm batch. A warm gather that took
  // 100 us or more (dataset.h's mark: a loaded machine, a sanitizer) would leave a check for
  // the next batch, so repeat until one, timed from outside, took less. Where none does (an
  // AddressSanitizer build beside another test on CI's two cores), the next batch is checked
  // rightly, and what follows cannot be seen.
  bool warm_gather_was_fast = false;
  for (int attempt = 0; attempt < 1000 && !warm_gather_was_fast; ++attempt) {
    const auto start = std::chrono::steady_clock::now();
    (void)cold->get_batch(few, "x");
    warm_gather_was_fast = std::chrono::steady_clock::now() - start < std::chrono::microseconds(100);
  }
  if (!warm_gather_was_fast) GTEST_SKIP() << "no warm gather of 16 records took under 100 us here";
  const int64_t before = cold->read_ahead_stats().batches_read_ahead;
  // New records: gathered unhinted (nothing to check: the last gather was fast) and slow, so
  // the next batch is checked, although the warm dataset gathers in between on this thread.
  const std::vector<int64_t> fresh = spread_records(500, 128, 11);
  expect_gathered(cold->get_batch(fresh, "x"), fresh);
  EXPECT_EQ(cold->read_ahead_stats().batches_read_ahead, before);
  (void)other.get_batch(spread_records(3, 8, 17), "x");
  const std::vector<int64_t> next = spread_records(537, 128, 11);
  expect_gathered(cold->get_batch(next, "x"), next);
  EXPECT_EQ(cold->read_ahead_stats().batches_read_ahead, before + 1) << "the warm dataset's gather hid the cold one's";
  EXPECT_EQ(other.read_ahead_stats().batches_read_ahead, 0);
}

// A warm gather may take 100 us or more (large records, or records scattered over a file
// larger than the CPU's caches). Without a major page fault it read nothing from the disk,
// and leaves the next batch unchecked: a warm dataset's batches are not checked over and over.
TEST(DatasetReadAheadTest, SlowWarmGathersAreNotCheckedOverAndOver) {
  TempDir dir;
  const std::string path = dir.file("wide.mmt");
  {
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kFloat32, {16384})}));
    for (int64_t i = 0; i < 1000; ++i) writer.append({full({16384}, static_cast<double>(i), kFloat32)});
    writer.finish();
  }
  const Dataset warm = Dataset::open(path);  // just written: in the page cache
  Tensor out = empty({64, 16384}, kFloat32);
  int slow_gathers = 0;
  for (int64_t round = 0; round < 20; ++round) {
    std::vector<int64_t> batch;  // 64 records of 64 KiB spread over the 65 MB file: not neighbours
    for (int64_t k = 0; k < 64; ++k) batch.push_back((round * 7 + k * 151) % 1000);
    const auto start = std::chrono::steady_clock::now();
    warm.get_batch(batch, "x", out);
    slow_gathers += std::chrono::steady_clock::now() - start >= detail::kSlowGather;
    ASSERT_EQ(out[63][0].item<float>(), static_cast<float>(batch[63]));
  }
  if (slow_gathers < 10) GTEST_SKIP() << "4 MiB warm gathers took under 100 us here: too few were slow";
  // The first batch, and the one after the first slow gather (nothing to compare its faults
  // with yet); a stray major fault of the thread (memory pressure) may add one or two.
  EXPECT_LE(warm.read_ahead_stats().batches_checked, 4);
  EXPECT_EQ(warm.read_ahead_stats().batches_read_ahead, 0);
}

// The largest field decides: images missing from the page cache are found behind labels that
// were read already (a label shares a page with at most one image's last bytes).
TEST(DatasetReadAheadTest, TheLargestFieldDecidesWhetherABatchIsCold) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  TempDir dir;
  const std::string path = dir.file("images.mmt");
  {
    Schema schema({Field::fixed("image", kUInt8, {3, 64, 64}), Field::fixed("label", kInt64, {})});
    WriterOptions writer_options;
    writer_options.chunk_records = 64;
    DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
    for (int64_t i = 0; i < 1000; ++i)
      writer.append({full({3, 64, 64}, static_cast<double>(i % 200), kUInt8), full({}, static_cast<double>(i), kInt64)});
    writer.finish();
  }
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  std::vector<int64_t> all(1000);
  std::iota(all.begin(), all.end(), 0);
  (void)cold->get_batch(all, "label");  // dense: not hinted; cold: slow, so the next batch is checked
  ASSERT_EQ(cold->read_ahead_stats().batches_read_ahead, 0);
  // None of the four records probed (7, 901, 641, 488) starts on a page: each image's first
  // and last pages hold labels read above.
  const std::vector<int64_t> batch{7, 300, 901, 55, 641, 212, 488, 999};
  const std::vector<std::string> fields{"label", "image"};
  std::vector<Tensor> outs{empty({8}, kInt64), empty({8, 3, 64, 64}, kUInt8)};
  cold->get_batch(batch, fields, outs);
  EXPECT_EQ(cold->read_ahead_stats().batches_read_ahead, 1) << "cold images behind cached labels were not hinted";
  for (size_t b = 0; b < batch.size(); ++b) {
    EXPECT_EQ(outs[0][static_cast<int64_t>(b)].item<int64_t>(), batch[b]);
    EXPECT_EQ(outs[1][static_cast<int64_t>(b)][2][63][63].item<uint8_t>(), batch[b] % 200);
  }
}

// Compressed chunks are hinted whole, unless the chunk cache holds them decoded.
TEST(DatasetReadAheadTest, AColdCompressedFileIsHintedByItsChunks) {
  if (!four_kib_pages()) GTEST_SKIP() << "records laid out for 4 KiB pages";
  TempDir dir;
  const std::string path = dir.file("lz4.mmt");
  {
    Schema schema({Field::fixed("x", kFloat32, {1040}), Field::fixed("label", kInt64, {})});
    WriterOptions writer_options;
    writer_options.chunk_records = 16;
    writer_options.codec = CodecSpec::parse("lz4");
    DatasetWriter writer = DatasetWriter::create(path, schema, writer_options);
    for (int64_t i = 0; i < 2000; ++i)
      writer.append({full({1040}, static_cast<double>(i), kFloat32), full({}, static_cast<double>(i), kInt64)});
    writer.finish();
  }
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  const std::vector<int64_t> batch = spread_records(5, 32, 61);
  expect_gathered(cold->get_batch(batch, "x"), batch);
  EXPECT_EQ(cold->read_ahead_stats().batches_read_ahead, 1);
  EXPECT_TRUE(cold->read_ahead_stats().reading_ahead);
}

// A hint never changes what get_batch throws: a bad index, or a damaged chunk entry, gives the
// same error whatever the read-ahead.
TEST(DatasetReadAheadTest, ErrorsAreTheSameWithAndWithoutHints) {
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  std::vector<std::byte> bytes;
  {
    const std::string text = testing::file_bytes(path);
    bytes.resize(text.size());
    std::memcpy(bytes.data(), text.data(), text.size());
  }
  const format::Footer footer = testing::footer_of(bytes);
  bytes[footer.chunk_table_offset + 3 * format::kChunkEntryBytes + 8] ^= std::byte{1};  // chunk 3 (records 720-959)
  const std::string damaged = dir.file("damaged.mmt");
  testutil::write_file(damaged, bytes);
  std::vector<std::string> messages;
  for (const ReadAhead mode : {ReadAhead::Never, ReadAhead::Auto, ReadAhead::Always}) {
    ReaderOptions options;
    options.read_ahead = mode;
    const Dataset dataset = Dataset::open(damaged, options);
    messages.push_back(testing::error_of([&] { (void)dataset.get_batch(std::vector<int64_t>{5, 800, 1900}, "x"); }));
    messages.push_back(testing::error_of([&] { (void)dataset.get_batch(std::vector<int64_t>{5, 2000, 1900}, "x"); }));
  }
  ASSERT_NE(messages[0].find("chunk 3"), std::string::npos) << messages[0];
  ASSERT_NE(messages[1].find("2000"), std::string::npos) << messages[1];
  for (size_t k = 2; k < messages.size(); ++k) EXPECT_EQ(messages[k], messages[k % 2]);
}

// Many threads read one dataset at once, from cold to warm, some with threads > 1: every
// batch holds its records (and ThreadSanitizer watches the policy and the per-thread state).
TEST(DatasetReadAheadTest, ConcurrentGetBatchOnOneDatasetFromColdToWarm) {
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  std::optional<Dataset> cold = open_cold(path);
  if (!cold) GTEST_SKIP() << "cannot drop pages from the page cache of " << path;
  const Dataset& dataset = *cold;
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&, t] {
      for (int k = 0; k < 30; ++k) {
        const std::vector<int64_t> batch = spread_records(97 * k + t, 48, 41);
        const Tensor x = dataset.get_batch(batch, "x", /*threads=*/1 + t % 2);
        for (size_t b = 0; b < batch.size(); ++b)
          wrong += x[static_cast<int64_t>(b)][0].item<float>() != static_cast<float>(batch[b]);
      }
    });
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(dataset.read_ahead_stats().batches_read_ahead, 1);
}

// Always hints every batch of two records or more, Never none; a record alone is never
// hinted (nothing to read in parallel).
TEST(DatasetReadAheadTest, AlwaysHintsEveryBatchAndNeverNone) {
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  ReaderOptions options;
  options.read_ahead = ReadAhead::Always;
  const Dataset always = Dataset::open(path, options);
  EXPECT_TRUE(always.read_ahead_stats().reading_ahead);
  const std::vector<int64_t> batch = spread_records(3, 16);
  const std::vector<std::string> fields{"x", "label"};
  std::vector<Tensor> outs{empty({16, 1040}, kFloat32), empty({16}, kInt64)};
  for (int k = 0; k < 3; ++k) always.get_batch(batch, fields, outs);
  expect_gathered(outs[0], batch);
  (void)always.get_batch(std::vector<int64_t>{4}, "label");
  EXPECT_EQ(always.read_ahead_stats().batches_read_ahead, 3);

  options.read_ahead = ReadAhead::Never;
  always.advise(AccessAdvice::DontNeed);
  (void)evict(path);  // cold where it can be; warm, Never hints nothing either
  const Dataset never = Dataset::open(path, options);
  for (int k = 0; k < 3; ++k) expect_gathered(never.get_batch(spread_records(k, 64), "x"), spread_records(k, 64));
  EXPECT_EQ(never.read_ahead_stats().batches_read_ahead, 0);
  EXPECT_FALSE(never.read_ahead_stats().reading_ahead);

  options.read_ahead = static_cast<ReadAhead>(9);
  const std::string message = testing::error_of([&] { (void)Dataset::open(path, options); });
  EXPECT_NE(message.find("ReaderOptions::read_ahead must be Auto, Always or Never, got 9"), std::string::npos) << message;
}

// A loader hints its batches by its own policy, ahead of their gathers: its gathers never
// add the dataset's hints (which would hint every batch twice).
TEST(DatasetReadAheadTest, ALoadersGathersLeaveTheDatasetsReadAheadAlone) {
  TempDir dir;
  const std::string path = write_page_sized_records(dir);
  ReaderOptions reader_options;
  reader_options.read_ahead = ReadAhead::Always;
  Dataset dataset = Dataset::open(path, reader_options);
  LoaderOptions options;
  options.batch_size = 64;
  options.sampler.kind = SamplerKind::Random;
  options.pin_memory = false;
  options.read_ahead = ReadAhead::Never;
  for (const int workers : {1, 0}) {  // none: every gather on the calling thread
    options.num_workers = workers;
    Loader loader(dataset, options);
    EXPECT_EQ(drain_epoch(loader).size(), 2000u);
    EXPECT_EQ(loader.stats().batches_read_ahead, 0);
  }
  EXPECT_EQ(dataset.read_ahead_stats().batches_read_ahead, 0);
  // The loader's workers and next() leave the calling thread as it was.
  (void)dataset.get_batch(spread_records(0, 8), "x");
  EXPECT_EQ(dataset.read_ahead_stats().batches_read_ahead, 1);
}

TEST(LoaderReadAheadOptionsTest, AnUnknownModeIsRefused) {
  TempDir dir;
  Dataset dataset = Dataset::open(write_loader_dataset(dir, 10));
  LoaderOptions options;
  options.read_ahead = static_cast<ReadAhead>(7);
  const std::string message = testing::error_of([&] { Loader loader(dataset, options); });
  EXPECT_NE(message.find("read_ahead must be Auto, Always or Never, got 7"), std::string::npos) << message;
}

}  // namespace
}  // namespace mmt
