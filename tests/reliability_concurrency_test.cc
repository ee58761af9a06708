// Readers under concurrency (docs/RELIABILITY.md, "Thread safety" and "Replacement under
// readers"). Named ReliabilityConcurrency.* so the ThreadSanitizer stage runs them.
//   - Many threads reading one Dataset (views, batches, columns, on a cache smaller than
//     the data) while other threads open, read and close the same file.
//   - Readers of a path while a writer replaces it again and again (overwrite = rename):
//     every handle keeps reading its own generation intact, a newly opened handle sees a
//     generation at least as new as the last one its thread saw, and never a mixture.
//   - The same with `mmt pack --force` as the replacing process (skipped where mmt is not
//     built, as in the TSan build).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/numpy_io.h"
#include "test_util.h"

extern char** environ;

namespace mmt {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int64_t kRecords = 2000;
constexpr int64_t kValues = 32;

// Record i of generation g: "x" int32 [kValues] = g * 1'000'000 + i * 100 + k, "gen" int64 = g,
// and with `ragged`, "tokens" int32 [i % 4] = i.
void write_generation(const std::string& path, int64_t generation, const std::string& codec, bool ragged,
                      bool overwrite) {
  std::vector<Field> fields{Field::fixed("x", kInt32, {kValues}), Field::fixed("gen", kInt64, {})};
  if (ragged) fields.push_back(Field::ragged("tokens", kInt32, {kVariableDim}));
  WriterOptions options;
  options.codec = CodecSpec::parse(codec);
  options.chunk_records = 50;
  options.threads = 2;
  options.overwrite = overwrite;
  options.metadata["generation"] = std::to_string(generation);
  DatasetWriter writer = DatasetWriter::create(path, Schema(fields), options);
  std::vector<int32_t> x(kValues);
  for (int64_t i = 0; i < kRecords; ++i) {
    for (int64_t k = 0; k < kValues; ++k) x[k] = static_cast<int32_t>(generation * 1'000'000 + i * 100 + k);
    std::vector<Tensor> record{tensor(x), full({}, static_cast<double>(generation), kInt64)};
    if (ragged) record.push_back(full({i % 4}, static_cast<double>(i), kInt32));
    writer.append(std::span<const Tensor>(record));
  }
  writer.finish();
}

// Checks records of `ds` against generation `generation` through every read path; returns
// the number of failed checks (gtest assertions are thread-safe, but counting keeps the
// failure output short when a bug breaks everything).
int64_t check_reads(const Dataset& ds, int64_t generation, std::mt19937_64& rng, int rounds) {
  int64_t failures = 0;
  std::uniform_int_distribution<int64_t> pick(0, kRecords - 1);
  for (int round = 0; round < rounds; ++round) {
    const int64_t i = pick(rng);
    const std::vector<int32_t> x = ds.get(i, "x").to_vector<int32_t>();
    failures += x[3] != generation * 1'000'000 + i * 100 + 3;
    failures += ds.get(i, "gen").item<int64_t>() != generation;
    if (ds.schema().find("tokens")) failures += ds.get(i, "tokens").numel() != i % 4;
    std::vector<int64_t> indices(16);
    for (int64_t& index : indices) index = pick(rng);
    const std::vector<int32_t> batch = ds.get_batch(indices, "x").to_vector<int32_t>();
    for (size_t b = 0; b < indices.size(); ++b)
      failures += batch[b * kValues + 7] != generation * 1'000'000 + indices[b] * 100 + 7;
    if (round % 16 == 0) {
      const int64_t start = pick(rng) / 2;
      const std::vector<int64_t> gens = ds.column("gen", start, start + 10).to_vector<int64_t>();
      for (int64_t g : gens) failures += g != generation;
    }
  }
  return failures;
}

int64_t generation_of(const Dataset& ds) { return std::stoll(ds.metadata().at("generation")); }

struct Layout {
  const char* codec;
  bool ragged;
};

class ReliabilityConcurrency : public ::testing::TestWithParam<Layout> {};

TEST_P(ReliabilityConcurrency, ManyReadersWhileOthersOpenAndClose) {
  TempDir dir;
  const std::string path = dir.file("data.mmt");
  write_generation(path, 1, GetParam().codec, GetParam().ragged, false);
  ReaderOptions options;
  options.cache_bytes = 32 << 10;  // a few chunks: decodes, evictions and hits all happen
  const Dataset shared = Dataset::open(path, options);

  std::atomic<int64_t> failures{0}, opens{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      failures += check_reads(shared, 1, rng, 150);
    });
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      for (int k = 0; k < 25; ++k) {
        Dataset own = Dataset::open(path, options);
        failures += check_reads(own, 1, rng, 4);
        if (k % 5 == 0) own.verify();
        Tensor kept = own.get(k, "x");  // a view outliving its handle
        own = Dataset();
        failures += kept.to_vector<int32_t>()[0] != 1'000'000 + k * 100;
        ++opens;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(opens.load(), 50);
  const CacheStats stats = shared.cache_stats();
  EXPECT_LE(stats.bytes_cached, stats.budget_bytes);
}

TEST_P(ReliabilityConcurrency, ReadersKeepTheirGenerationWhileTheWriterReplacesThePath) {
  TempDir dir;
  const std::string path = dir.file("data.mmt");
  write_generation(path, 1, GetParam().codec, GetParam().ragged, false);
  constexpr int64_t kGenerations = 6;
  std::atomic<int64_t> published{1};
  std::atomic<bool> writer_done{false};
  std::atomic<int64_t> failures{0}, generations_seen{0};

  std::thread writer([&] {
    for (int64_t g = 2; g <= kGenerations; ++g) {
      write_generation(path, g, GetParam().codec, GetParam().ragged, /*overwrite=*/true);
      published.store(g);
    }
    writer_done.store(true);
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      int64_t last_seen = 0;
      std::vector<std::pair<Dataset, int64_t>> held;  // handles kept across replacements
      while (true) {
        const bool done = writer_done.load();  // read before opening: the final open sees the last one
        const int64_t at_least = published.load();
        Dataset ds = Dataset::open(path);
        const int64_t g = generation_of(ds);
        failures += g < at_least || g < last_seen;  // never an older file than already published
        last_seen = g;
        failures += check_reads(ds, g, rng, 8);
        if (held.empty() || held.back().second != g) held.emplace_back(ds, g);
        for (auto& [old, old_generation] : held) failures += check_reads(old, old_generation, rng, 2);
        if (done) break;
      }
      generations_seen += static_cast<int64_t>(held.size());
      for (auto& [old, old_generation] : held) old.verify();  // the old inodes are intact
      failures += last_seen != kGenerations;
    });
  writer.join();
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(generations_seen.load(), 3) << "each reader sees at least the first and last generation";
  // Nothing but the dataset is left in the folder: each replacement's temporary was renamed.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReliabilityConcurrency,
                         ::testing::Values(Layout{"none", false}, Layout{"none", true}, Layout{"lz4", false},
                                           Layout{"zstd", true}),
                         [](const auto& info) {
                           return std::string(info.param.codec) + (info.param.ragged ? "_chunked" : "_fixed");
                         });

// Two finished files of different sizes renamed onto one path as fast as rename(2) allows,
// while readers open the path: every open must pair the size it maps with the file it maps.
// (Sizing the mapping by stat(path) and then opening the path again maps one file's bytes to
// the other's length: "the last 8 bytes are not the end magic", or a fault past the end.)
TEST(ReliabilityConcurrencyRename, EveryOpenMapsOneWholeFileWhileThePathIsSwapped) {
  TempDir dir;
  const std::string path = dir.file("data.mmt");
  const std::string small = dir.file("small.mmt"), large = dir.file("large.mmt"), staged = dir.file("staged");
  auto write = [](const std::string& at, int64_t records, int64_t generation) {
    WriterOptions options;
    options.metadata["generation"] = std::to_string(generation);
    DatasetWriter writer = DatasetWriter::create(at, Schema({Field::fixed("x", kInt64, {})}), options);
    for (int64_t i = 0; i < records; ++i) writer.append({full({}, static_cast<double>(i), kInt64)});
    writer.finish();
  };
  write(small, 10, 1);
  write(large, 100'000, 2);
  ASSERT_NE(fs::file_size(small), fs::file_size(large));
  ASSERT_EQ(::link(small.c_str(), path.c_str()), 0);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> swaps{0};
  std::thread swapper([&] {
    for (int64_t k = 0; !stop.load(); ++k) {
      const std::string& next = k % 2 ? small : large;
      if (::link(next.c_str(), staged.c_str()) != 0 || ::rename(staged.c_str(), path.c_str()) != 0) {
        ADD_FAILURE() << "swap " << k << ": " << std::strerror(errno);
        return;
      }
      ++swaps;
    }
  });
  std::atomic<int64_t> failures{0}, opens{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&] {
      for (int k = 0; k < 2000; ++k) {
        try {
          const Dataset ds = Dataset::open(path);
          const int64_t g = generation_of(ds);
          const int64_t records = g == 1 ? 10 : 100'000;
          failures += ds.size() != records;
          failures += ds.get(records - 1, "x").item<int64_t>() != records - 1;
        } catch (const Error& e) {
          if (failures++ < 3) ADD_FAILURE() << "open " << k << ": " << e.what();
        }
        ++opens;
      }
    });
  for (std::thread& t : readers) t.join();
  stop.store(true);
  swapper.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(opens.load(), 4000);
  EXPECT_GT(swaps.load(), 0);
}

// `mmt pack --force` as another process replacing the file under this process's readers.
TEST(ReliabilityConcurrencyWithPacker, ReadersWhileMmtPackForceReplacesThePath) {
  const std::string mmt = std::string(MMT_BINARY_DIR) + "/mmt";
  if (!fs::exists(mmt)) GTEST_SKIP() << mmt << " is not built";
  TempDir dir;
  const std::string path = dir.file("data.mmt");
  // Generation g's source: an int64 array [kRecords, 8] filled with g.
  std::vector<std::string> sources;
  for (int64_t g = 0; g < 4; ++g) {
    sources.push_back(dir.file("gen" + std::to_string(g) + ".npy"));
    save_npy(sources.back(), full({kRecords, 8}, static_cast<double>(g), kInt64));
  }
  auto pack = [&](int64_t g) {
    std::vector<std::string> args{mmt, "pack", path, "x=" + sources[g], "--force", "--quiet", "--codec", "lz4",
                                  "--chunk-bytes", "16K"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, mmt.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "mmt pack generation " << g;
  };
  pack(0);
  std::atomic<bool> done{false};
  std::atomic<int64_t> failures{0}, opens{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&] {
      std::vector<Dataset> held;
      while (!done.load()) {
        Dataset ds = Dataset::open(path);
        const std::vector<int64_t> values = ds.column("x").to_vector<int64_t>();
        const int64_t g = values[0];
        for (int64_t v : values) failures += v != g;  // one generation, whole
        if (held.empty() || held.back().get(0, "x").to_vector<int64_t>()[0] != g) held.push_back(ds);
        ++opens;
      }
      for (const Dataset& old : held) {
        old.verify();
        const std::vector<int64_t> values = old.column("x").to_vector<int64_t>();
        for (int64_t v : values) failures += v != values[0];
      }
    });
  for (int64_t g = 1; g < 4; ++g) pack(g);
  done.store(true);
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(opens.load(), 0);
  EXPECT_EQ(Dataset::open(path).get(0, "x").to_vector<int64_t>()[0], 3);
}

}  // namespace
}  // namespace mmt
