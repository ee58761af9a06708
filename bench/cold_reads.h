// What the cold-read benchmarks share (bench/loader_bench.cc, bench/dataset_bench.cc):
// datasets written once per process, the check that the temporary folder can evict a file,
// and rounds of passes over a cold file with read-ahead Never and Auto alternated.
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "page_cache.h"

namespace mmt::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


inline double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}


// A dataset written once per process by `write(path, part)` into a temporary folder that is
// removed at exit: one file, or `parts` shards read as one (Dataset::open_concat).
class BenchDataset {
 public:
  BenchDataset(const std::string& name, const std::function<void(const std::string&, int64_t)>& write,
               int64_t parts = 1)
      : dir_(std::filesystem::temp_directory_path() / ("mmtensor-bench-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
    std::vector<std::string> paths;
    for (int64_t part = 0; part < parts; ++part) {
      paths.push_back((dir_ / (name + (parts > 1 ? "-" + std::to_string(part) : "") + ".mmt")).string());
      write(paths.back(), part);
    }
    dataset_ = Dataset::open_concat(paths);
  }
  // `records` uint8 images of `shape`, and an int64 label, in 4 MiB chunks; in `parts` shards
  // of consecutive records. With `captions`, each record also has a caption of 0..31 bytes
  // (a ragged field: the records are then not laid out back to back, and shards of them are
  // read part by part).
  BenchDataset(const std::string& name, int64_t records, std::vector<int64_t> shape, int64_t parts = 1,
               bool captions = false)
      : BenchDataset(
            name,
            [&](const std::string& path, int64_t part) {
              std::vector<Field> fields{Field::fixed("image", kUInt8, shape), Field::fixed("label", kInt64, {})};
              if (captions) fields.push_back(Field::bytes("caption"));
              WriterOptions options;
              options.chunk_bytes = 4 << 20;
              DatasetWriter writer = DatasetWriter::create(path, Schema(fields), options);
              Tensor image = empty(shape, kUInt8);
              uint8_t* pixels = image.mutable_data_ptr<uint8_t>();
              for (int64_t i = records * part / parts; i < records * (part + 1) / parts; ++i) {
                for (int64_t p = 0; p < image.numel(); ++p) pixels[p] = static_cast<uint8_t>(i * 31 + p);
                Tensor label = full({}, static_cast<double>(i % 1000), kInt64);
                if (captions)
                  writer.append({image, label, full({i % 32}, static_cast<double>('a' + i % 26), kUInt8)});
                else
                  writer.append({image, label});
              }
              writer.finish();
            },
            parts) {}
  ~BenchDataset() {
    dataset_ = Dataset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const Dataset& dataset() const { return dataset_; }

 private:
  std::filesystem::path dir_;
  Dataset dataset_;
};

// Fashion-MNIST-sized records (784 bytes; 500 MB in all), for cold reads: one file in the
// process, whichever benchmark asks first.
inline const Dataset& small_records_dataset() {
  static BenchDataset data("small", 600000, {1, 28, 28});
  return data.dataset();
}
// The same records in 8 shards, read as one.
inline const Dataset& small_records_shards() {
  static BenchDataset data("small-shard", 600000, {1, 28, 28}, 8);
  return data.dataset();
}
// The same records with a caption each (not back to back), in one file or in 8 shards.
inline const Dataset& captioned_records(bool shards) {
  static BenchDataset file("captioned", 600000, {1, 28, 28}, 1, /*captions=*/true);
  if (!shards) return file.dataset();
  static BenchDataset in_shards("captioned-shard", 600000, {1, 28, 28}, 8, /*captions=*/true);
  return in_shards.dataset();
}

// Why cold reads cannot be measured in the temporary folder ("" when they can): a small file
// written there must leave the page cache on request (a tmpfs or ramfs keeps files in
// memory). Checked before a cold benchmark writes its hundreds of megabytes.
inline const std::string& cold_reads_unavailable() {
  static const std::string why = [] {
    const std::filesystem::path probe =
        std::filesystem::temp_directory_path() / ("mmtensor-cold-probe-" + std::to_string(::getpid()));
    {
      std::FILE* f = std::fopen(probe.c_str(), "wb");
      if (f == nullptr) return "cannot write " + probe.string() + ": " + std::strerror(errno);
      const std::vector<char> page(1 << 16, 'x');
      const bool written = std::fwrite(page.data(), 1, page.size(), f) == page.size();
      if (std::fclose(f) != 0 || !written) return "cannot write " + probe.string();
    }
    std::string why_not;
    const bool dropped = detail::drop_from_page_cache(probe.string(), &why_not);
    std::error_code ec;
    std::filesystem::remove(probe, ec);
    return dropped ? std::string() : why_not;
  }();
  return why;
}

// Rounds of two passes over the cold files of `written` (one, or its shards; their pages
// dropped before each pass), one with read-ahead Never and one with Auto, alternated.
// `read_pass(paths, mode, seed, end)` opens the files (Dataset::open_concat), reads them with
// that read-ahead, calls end() after its last read (before its loader stops and its dataset
// closes: their teardown is not timed, and what a loader's workers read ahead after that is
// not counted), and returns the bytes it delivered; each pass takes a new seed. The time of a
// pass includes the open.
template <typename ReadPass>
void run_cold_random_passes(benchmark::State& state, const Dataset& written, ReadPass read_pass) {
  // The written dataset's open read its header and chunk table through its mapping, and pages
  // a mapping maps stay cached: let go of them (nothing here reads that mapping again).
  written.advise(AccessAdvice::DontNeed);
  std::vector<std::string> paths;
  for (const Dataset& part : written.parts()) paths.push_back(part.path());
  std::string why_not;
  const auto drop_all = [&] {
    for (const std::string& path : paths)
      if (!detail::drop_from_page_cache(path, &why_not)) return false;
    return true;
  };
  if (!drop_all()) {
    state.SkipWithError(("no cold reads to measure: " + why_not).c_str());
    return;
  }
  struct Pass {
    double seconds = 0;
    int64_t delivered = 0;
    int64_t read = 0;
  };
  uint64_t seed = 1;
  auto pass = [&](ReadAhead read_ahead) -> std::optional<Pass> {
    Pass result;
    if (!drop_all()) return std::nullopt;  // a warm pass measures nothing
    const int64_t read_before = detail::process_storage_read_bytes();
    const double t0 = now_seconds();
    bool ended = false;
    const auto end = [&] {
      result.seconds = now_seconds() - t0;
      result.read = detail::process_storage_read_bytes() - read_before;
      ended = true;
    };
    result.delivered = read_pass(paths, read_ahead, seed++, end);
    if (!ended) {
      why_not = "the pass never called end()";
      return std::nullopt;
    }
    return result;  // read_pass closed its dataset (and stopped its loader) before the next pass evicts
  };
  std::vector<double> ratios;
  double auto_seconds = 0, never_seconds = 0;
  int64_t auto_delivered = 0, never_delivered = 0, auto_read = 0, never_read = 0;
  for (auto _ : state) {
    const std::optional<Pass> never_pass = pass(ReadAhead::Never);
    const std::optional<Pass> hinted_pass = never_pass ? pass(ReadAhead::Auto) : std::nullopt;
    if (!hinted_pass) {
      state.SkipWithError(("a pass could not start cold: " + why_not).c_str());
      return;
    }
    const Pass& never = *never_pass;
    const Pass& hinted = *hinted_pass;
    ratios.push_back(never.seconds / hinted.seconds);
    auto_seconds += hinted.seconds;
    never_seconds += never.seconds;
    auto_delivered += hinted.delivered;
    never_delivered += never.delivered;
    auto_read += hinted.read;
    never_read += never.read;
    state.SetIterationTime(hinted.seconds);
  }
  state.counters["vs_never"] = median(ratios);
  state.counters["auto_MB_per_s"] = auto_delivered / auto_seconds / 1e6;
  state.counters["never_MB_per_s"] = never_delivered / never_seconds / 1e6;
  state.counters["read_amplification_auto"] = static_cast<double>(auto_read) / auto_delivered;
  state.counters["read_amplification_never"] = static_cast<double>(never_read) / never_delivered;
  state.SetBytesProcessed(auto_delivered);
}

}  // namespace mmt::bench
