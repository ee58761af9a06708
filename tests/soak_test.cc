// Soak: the loader runs many epochs over a compressed dataset several times larger than its
// chunk cache budget. Resident memory stays flat once warm, every thread and file descriptor
// the loader made is gone after it is destroyed, and the last epochs are as fast as the
// first ones (no decay from fragmentation, cache churn or leaks).
//
// CI runs a short soak; MMT_SOAK_EPOCHS=N runs N epochs over a bigger dataset for the figures
// recorded in docs/RELIABILITY.md (printed as one line at the end).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/loader.h"
#include "test_util.h"

namespace mmt {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

// Anonymous resident memory (heap, stacks, decoded chunks): what a leak grows. The mapped
// file's pages are left out: they count as resident once read, and the kernel reclaims them.
int64_t anonymous_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8)) * 1024;  // "RssAnon:  1234 kB"
  return 0;
}

int64_t entries_in(const char* folder) {
  int64_t n = 0;
  for (const auto& entry : fs::directory_iterator(folder)) {
    (void)entry;
    ++n;
  }
  return n;
}

// "x": float32 [kValues] with a little structure (lz4 shrinks it, decoding costs real work),
// "label": int64, "tokens": ragged int32 [i % 7].
constexpr int64_t kValues = 512;
std::string write_soak_dataset(const TempDir& dir, int64_t records) {
  WriterOptions options;
  options.codec = CodecSpec::parse("lz4");
  options.chunk_records = 128;  // 256 KiB decoded chunks
  const std::string path = dir.file("soak.mmt");
  DatasetWriter writer = DatasetWriter::create(
      path,
      Schema({Field::fixed("x", kFloat32, {kValues}), Field::fixed("label", kInt64, {}),
              Field::ragged("tokens", kInt32, {kVariableDim})}),
      options);
  std::vector<float> x(kValues);
  for (int64_t i = 0; i < records; ++i) {
    for (int64_t k = 0; k < kValues; ++k) x[k] = static_cast<float>((i * 31 + k) % 97);
    writer.append({tensor(x), full({}, static_cast<double>(i), kInt64), full({i % 7}, static_cast<double>(i), kInt32)});
  }
  writer.finish();
  return path;
}

TEST(Soak, LoaderEpochsOverADatasetLargerThanItsCacheStayFlat) {
  const char* env = std::getenv("MMT_SOAK_EPOCHS");
  const bool long_run = env != nullptr;
  const int epochs = long_run ? std::max(8, std::atoi(env)) : 32;
  const int64_t records = long_run ? 65536 : 8192;  // 32 MiB / 4 MiB of decoded "x"
  TempDir dir;
  const std::string path = write_soak_dataset(dir, records);

  ReaderOptions reader_options;
  reader_options.cache_bytes = 1 << 20;  // 4 chunks: a quarter (CI) or 1/32 (long) of the data
  Dataset dataset = Dataset::open(path, reader_options);
  const int64_t threads_before = entries_in("/proc/self/task");
  const int64_t fds_before = entries_in("/proc/self/fd");

  std::vector<double> epoch_seconds;
  std::vector<int64_t> epoch_rss;
  int64_t rows_seen = 0, label_sum = 0;
  {
    LoaderOptions options;
    options.batch_size = 64;
    options.sampler.kind = SamplerKind::QuasiRandom;
    options.sampler.seed = 11;
    options.num_workers = 2;
    options.prefetch_batches = 4;
    options.pin_memory = false;
    Loader loader(dataset, options);
    for (int epoch = 0; epoch < epochs; ++epoch) {
      const auto started = Clock::now();
      int64_t epoch_rows = 0;
      while (std::optional<Batch> batch = loader.next()) {
        epoch_rows += batch->size();
        const std::vector<int64_t> labels = (*batch)["label"].to_vector<int64_t>();
        for (int64_t label : labels) label_sum += label;
      }
      epoch_seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
      epoch_rss.push_back(anonymous_resident_bytes());
      ASSERT_EQ(epoch_rows, records) << "epoch " << epoch;
      rows_seen += epoch_rows;
    }
  }
  // Every epoch saw every record exactly once (the sum of labels is the check).
  EXPECT_EQ(label_sum, static_cast<int64_t>(epochs) * records * (records - 1) / 2);
  const CacheStats cache = dataset.cache_stats();
  EXPECT_LE(cache.bytes_cached, cache.budget_bytes);
  EXPECT_GT(cache.evictions, 0) << "the dataset must not fit the cache for this soak to mean anything";

  // Anonymous resident memory is flat: the second half of the run peaks no higher than the
  // first half (after the cold first epoch) plus allocator slack. A leak of even a few KiB
  // per batch grows steadily and fails this.
  const size_t half = epoch_rss.size() / 2;
  const int64_t warm_rss = *std::max_element(epoch_rss.begin() + 1, epoch_rss.begin() + half);
  const int64_t peak_rss = *std::max_element(epoch_rss.begin() + half, epoch_rss.end());
  // Not under AddressSanitizer: its quarantine holds freed blocks by design (RSS swings by
  // tens of MiB between epochs there); that build's LeakSanitizer checks for leaks instead.
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(peak_rss - warm_rss, int64_t{4} << 20) << "RSS grew from " << warm_rss << " to " << peak_rss;
#endif

  // The loader's threads and descriptors are gone once it is.
  EXPECT_EQ(entries_in("/proc/self/task"), threads_before);
  EXPECT_EQ(entries_in("/proc/self/fd"), fds_before);

  // No decay: the best of the last epochs is close to the best of the first ones. Minima,
  // not means, so a neighbour's burst on a shared machine does not decide the outcome.
  const size_t third = std::max<size_t>(2, epoch_seconds.size() / 3);
  const double first_best = *std::min_element(epoch_seconds.begin() + 1, epoch_seconds.begin() + 1 + third);
  const double last_best = *std::min_element(epoch_seconds.end() - third, epoch_seconds.end());
  // Asserted only in the long run someone asked for (MMT_SOAK_EPOCHS): the CI version's epochs
  // last milliseconds while ctest runs other tests on the same two cores, so a timing bound
  // there tests the neighbours, not the loader (it failed once at 0.65 for that reason). The
  // CI run still prints the ratio in its summary below.
  if (long_run) {
    EXPECT_GE(first_best / last_best, 0.7) << "throughput decayed: best epoch " << first_best << " s early, "
                                           << last_best << " s late";
  }

  const std::string summary = detail::str(
      epochs, " epochs x ", records, " records (", records * kValues * 4 >> 20, " MiB decoded, cache ",
      reader_options.cache_bytes >> 20, " MiB): anonymous RSS peak ", warm_rss >> 20, " MiB in the first half, ",
      peak_rss >> 20, " MiB in the second; best epoch early ", first_best, " s, late ", last_best, " s (ratio ", first_best / last_best,
      "); threads ", threads_before, "->", entries_in("/proc/self/task"), ", fds ", fds_before, "->",
      entries_in("/proc/self/fd"), "; cache evictions ", cache.evictions);
  std::printf("%s\nRSS MiB by epoch:", summary.c_str());
  for (int64_t rss : epoch_rss) std::printf(" %.1f", static_cast<double>(rss) / (1 << 20));
  std::printf("\n");
  RecordProperty("summary", summary);
}

}  // namespace
}  // namespace mmt
