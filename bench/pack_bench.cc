// Packing throughput against its physical limits, measured alternately in the same run
// (issue 4):
//   - uncompressed: pack_dataset() vs writing the same bytes sequentially to a file in the
//     same folder (1 MiB writes, then fsync, as the writer's finish() does): target >= 0.8;
//   - lz4 / zstd with T threads: pack_dataset() vs the raw codec compressing the same chunks
//     on one thread, times T: target >= 0.8.
// The data is Fashion-MNIST's training images and labels when installed (what the main job
// packs), else a synthetic image-like array of the same size. Files go to MMT_BENCH_DIR
// (default: the system temp folder); that folder's disk is the reference. Every timed pack
// and reference write creates a new file (the previous one is removed untimed).
//   - small rows from Arrow (BM_PackArrowSmallRowsVsDisk): 1,000,000 rows of a string (20-200
//     bytes), an int64 and a float32 in record batches of 1,000 rows (what Hugging Face's
//     datasets writes), packed uncompressed, against the disk as above: target >= 0.8.
//   - TFRecord files (BM_PackTfRecordVsDisk/BYTES): about 100 MB of tf.train.Example records,
//     each an "image/encoded" bytes_list of BYTES bytes (784: Fashion-MNIST's size; 110,000:
//     an ImageNet JPEG's) and an int64 "image/class/label", as TFDS writes image datasets,
//     packed uncompressed, against the disk as above: target >= 0.8.
//   - token documents from numpy (BM_PackJaggedDocumentsVsDisk): 400,000 documents of 1 to 511
//     uint16 tokens (about 200 MB) in one .npy and their offsets in another (--offsets), each
//     document a record, packed uncompressed, against the disk as above: target >= 0.8.
// Counters: vs_disk / vs_codec_x_threads (the targets' ratios), pack_MBps, reference_MBps.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec_engine.h"
#include "mmtensor/idx_io.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "ratio.h"
#include "../tests/arrow_test_util.h"
#include "../tests/tfrecord_test_util.h"

namespace {

using namespace mmt;
namespace fs = std::filesystem;

constexpr int kRounds = 5;  // each round writes the data twice; keep the disk traffic modest
constexpr int64_t kChunkBytes = 1 << 20;

std::string bench_dir() {
  const char* env = std::getenv("MMT_BENCH_DIR");
  std::string dir = (env && *env ? fs::path(env) : fs::temp_directory_path()) /
                    ("mmt-pack-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// The sources every benchmark packs, loaded once (decompression is not what is measured).
struct Workload {
  std::string dir = bench_dir();
  PackSources sources;
  Tensor images;  // the bulk of the bytes, for the codec reference
  std::string label;

  Workload() {
    const std::string fm = "/usr/share/datasets/fashion-mnist/";
    if (fs::exists(fm + "train-images-idx3-ubyte.gz") && fs::exists(fm + "train-labels-idx1-ubyte.gz")) {
      std::vector<std::string> specs{"images=" + fm + "train-images-idx3-ubyte.gz",
                                     "labels=" + fm + "train-labels-idx1-ubyte.gz"};
      sources = PackSources::from_arrays(specs);
      images = load_idx(fm + "train-images-idx3-ubyte.gz");
      label = "fashion-mnist";
    } else {
      // Smooth blobs plus noise: compresses roughly like small grey images do.
      images = empty({60000, 28, 28}, kUInt8);
      uint8_t* p = images.mutable_data_ptr<uint8_t>();
      std::mt19937 rng(7);
      for (int64_t i = 0; i < images.numel(); ++i) {
        int64_t x = i % 28, y = (i / 28) % 28;
        int v = ((x - 14) * (x - 14) + (y - 14) * (y - 14) < 100) ? 180 + static_cast<int>(rng() % 40) : 0;
        p[i] = static_cast<uint8_t>(v);
      }
      save_npy(dir + "/images.npy", images);
      save_npy(dir + "/labels.npy", arange(60000, kUInt8));
      std::vector<std::string> specs{"images=" + dir + "/images.npy", "labels=" + dir + "/labels.npy"};
      sources = PackSources::from_arrays(specs);
      label = "synthetic";
    }
  }
  ~Workload() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

Workload& workload() {
  static Workload w;
  return w;
}

std::string output_path() { return workload().dir + "/out.mmt"; }
std::string reference_path() { return workload().dir + "/reference.bin"; }

// Run untimed before every timed pack or reference write: both then create a new file, and
// neither pays for tearing down the previous one (replacing a 50 MB file drops its page
// cache inside rename(), ~20 ms here, which is not the disk's write speed).
void remove_outputs() {
  std::error_code ignored;
  fs::remove(output_path(), ignored);
  fs::remove(reference_path(), ignored);
}

WriteStats pack_once(const std::string& codec, int threads) {
  Workload& w = workload();
  PackOptions options;
  options.writer.codec = CodecSpec::parse(codec);
  options.writer.chunk_bytes = kChunkBytes;
  options.writer.threads = threads;
  options.writer.overwrite = true;
  return pack_dataset(output_path(), w.sources, options);
}

// Sequential write of `bytes` in 1 MiB blocks, then fsync: the disk's speed for a new file.
void write_reference(int64_t bytes) {
  static std::vector<char> block(1 << 20, 7);
  const std::string path = reference_path();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  for (int64_t done = 0; done < bytes;) {
    size_t n = static_cast<size_t>(std::min<int64_t>(bytes - done, static_cast<int64_t>(block.size())));
    ssize_t w = ::write(fd, block.data(), n);
    if (w <= 0) std::abort();
    done += w;
  }
  ::fsync(fd);
  ::close(fd);
}

// The raw codec over the same bytes in the writer's chunk size, on one thread.
void codec_reference(const CodecSpec& spec) {
  const Tensor& images = workload().images;
  const auto* src = static_cast<const std::byte*>(images.data_ptr());
  static std::vector<std::byte> dst;
  dst.resize(static_cast<size_t>(detail::compress_bound(spec.codec, kChunkBytes)));
  for (int64_t offset = 0; offset < images.nbytes(); offset += kChunkBytes) {
    int64_t n = std::min(kChunkBytes, images.nbytes() - offset);
    benchmark::DoNotOptimize(
        detail::compress(spec, src + offset, n, dst.data(), static_cast<int64_t>(dst.size())));
  }
}

void report(benchmark::State& state, const WriteStats& stats, double reference_seconds) {
  state.SetBytesProcessed(state.iterations() * stats.bytes_in);
  state.counters["pack_MBps"] = stats.bytes_in / stats.seconds / 1e6;
  state.counters["reference_MBps"] = stats.bytes_in / reference_seconds / 1e6;
  state.counters["ratio"] = static_cast<double>(stats.bytes_in) / static_cast<double>(stats.bytes_out);
  state.SetLabel(workload().label);
}

void BM_PackUncompressedVsDisk(benchmark::State& state) {
  WriteStats stats;
  for (auto _ : state) {
    state.PauseTiming();
    remove_outputs();
    state.ResumeTiming();
    stats = pack_once("none", 1);
  }
  int64_t file_bytes = stats.bytes_out;
  state.counters["vs_disk"] = bench::median_speed_ratio([&] { pack_once("none", 1); },
                                                        [&] { write_reference(file_bytes); }, kRounds, remove_outputs);
  remove_outputs();
  report(state, stats, bench::seconds_of([&] { write_reference(file_bytes); }));
  remove_outputs();
}

void BM_PackCompressedVsCodec(benchmark::State& state, const std::string& codec) {
  const int threads = static_cast<int>(state.range(0));
  CodecSpec spec = CodecSpec::parse(codec);
  WriteStats stats;
  for (auto _ : state) {
    state.PauseTiming();
    remove_outputs();
    state.ResumeTiming();
    stats = pack_once(codec, threads);
  }
  // reference time / pack time, with the reference being one thread: divide by the threads
  // to compare against the codec's throughput times the threads used.
  double speed = bench::median_speed_ratio([&] { pack_once(codec, threads); },
                                           [&] { codec_reference(spec); }, kRounds, remove_outputs);
  state.counters["vs_codec_x_threads"] = speed / threads;
  state.counters["threads"] = threads;
  report(state, stats, bench::seconds_of([&] { codec_reference(spec); }));
}

// An Arrow IPC file of small rows (a text dataset's form), written once.
struct SmallRows {
  std::string path = workload().dir + "/small_rows.arrow";
  PackSources sources;

  SmallRows() {
    namespace arrow = mmt::testutil::arrow;
    constexpr int64_t kRows = 1'000'000, kBatchRows = 1000;
    std::mt19937 rng(11);
    std::vector<std::vector<arrow::Column>> batches;
    for (int64_t first = 0; first < kRows; first += kBatchRows) {
      std::vector<std::string> texts;
      std::vector<int64_t> ids;
      std::vector<float> scores;
      for (int64_t i = first; i < first + kBatchRows; ++i) {
        texts.emplace_back(20 + rng() % 181, static_cast<char>('a' + i % 26));
        ids.push_back(i);
        scores.push_back(static_cast<float>(i % 1000) / 7.0f);
      }
      batches.push_back({arrow::texts("text", texts), arrow::numbers("id", ids), arrow::numbers("score", scores)});
    }
    const arrow::Written written = arrow::write(batches, {.file_format = true});
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(written.bytes.data(), 1, written.bytes.size(), f) != written.bytes.size()) std::abort();
    std::fclose(f);
    const std::vector<std::string> specs{path};
    sources = PackSources::from_arrow(specs);
  }
};

SmallRows& small_rows() {
  static SmallRows rows;
  return rows;
}

// Packs `sources` uncompressed over a fresh output, as every pack-against-the-disk benchmark
// does.
WriteStats pack_uncompressed(const PackSources& sources) {
  PackOptions options;
  options.writer.overwrite = true;
  return pack_dataset(output_path(), sources, options);
}

// Times packing `sources` (written before the timing starts) and reports it against a write
// of the same bytes to the disk: vs_disk, MB/s and records per second.
void report_pack_vs_disk(benchmark::State& state, const PackSources& sources, const std::string& label) {
  WriteStats stats;
  for (auto _ : state) {
    state.PauseTiming();
    remove_outputs();
    state.ResumeTiming();
    stats = pack_uncompressed(sources);
  }
  const int64_t file_bytes = stats.bytes_out;
  state.counters["vs_disk"] = bench::median_speed_ratio([&] { pack_uncompressed(sources); },
                                                        [&] { write_reference(file_bytes); }, kRounds, remove_outputs);
  remove_outputs();
  state.SetBytesProcessed(state.iterations() * stats.bytes_in);
  state.counters["pack_MBps"] = stats.bytes_in / stats.seconds / 1e6;
  state.counters["records_per_s"] = stats.records / stats.seconds;
  state.counters["reference_MBps"] = file_bytes / bench::seconds_of([&] { write_reference(file_bytes); }) / 1e6;
  state.SetLabel(label);
  remove_outputs();
}

void BM_PackArrowSmallRowsVsDisk(benchmark::State& state) {
  report_pack_vs_disk(state, small_rows().sources, "1M arrow rows: string, int64, float32");
}

// A TFRecord file of about 100 MB of records of `record_bytes` image bytes and a label,
// written once per size.
struct TfRecordImages {
  std::string path;
  PackSources sources;

  explicit TfRecordImages(int64_t record_bytes) : path(workload().dir + "/images-" + std::to_string(record_bytes) + ".tfrecord") {
    const int64_t records = 100'000'000 / record_bytes;
    std::mt19937 rng(13);
    std::vector<std::string> examples;
    std::string image(static_cast<size_t>(record_bytes), '\0');
    for (int64_t r = 0; r < records; ++r) {
      for (char& c : image) c = static_cast<char>(rng());
      examples.push_back(testutil::example_bytes(
          {{"image/encoded", std::vector<std::string>{image}}, {"image/class/label", std::vector<int64_t>{r % 1000}}}));
    }
    const testutil::Bytes bytes = testutil::tfrecord_file(examples);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
    sources = PackSources::from_tfrecord(std::vector<std::string>{path});
  }
};

const PackSources& tfrecord_images(int64_t record_bytes) {
  static std::map<int64_t, std::unique_ptr<TfRecordImages>> files;
  std::unique_ptr<TfRecordImages>& file = files[record_bytes];
  if (!file) file = std::make_unique<TfRecordImages>(record_bytes);
  return file->sources;
}

void BM_PackTfRecordVsDisk(benchmark::State& state) {
  const PackSources& sources = tfrecord_images(state.range(0));
  report_pack_vs_disk(state, sources, std::to_string(sources.records()) + " TFRecord Examples: image bytes, int64 label");
}

// Tokenized documents as numpy keeps them: one token array and where each document starts.
struct JaggedDocuments {
  PackSources sources;

  JaggedDocuments() {
    constexpr int64_t kDocuments = 400'000;
    std::mt19937 rng(17);
    std::vector<int64_t> offsets{0};
    for (int64_t d = 0; d < kDocuments; ++d) offsets.push_back(offsets.back() + 1 + static_cast<int64_t>(rng() % 511));
    Tensor tokens = empty({offsets.back()}, kUInt16);
    uint16_t* t = tokens.mutable_data_ptr<uint16_t>();
    for (int64_t k = 0; k < offsets.back(); ++k) t[k] = static_cast<uint16_t>(rng());
    const std::string dir = workload().dir;
    save_npy(dir + "/tokens.npy", tokens);
    save_npy(dir + "/offsets.npy", tensor<int64_t>(offsets));
    const std::vector<std::string> specs{"tokens=" + dir + "/tokens.npy"};
    sources = PackSources::from_arrays(specs, {.offsets = {{"tokens", dir + "/offsets.npy"}}});
  }
};

void BM_PackJaggedDocumentsVsDisk(benchmark::State& state) {
  static JaggedDocuments documents;
  report_pack_vs_disk(state, documents.sources, "400k token documents: tokens.npy + --offsets");
}

BENCHMARK(BM_PackJaggedDocumentsVsDisk)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_PackTfRecordVsDisk)->Arg(784)->Arg(110000)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_PackArrowSmallRowsVsDisk)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_PackUncompressedVsDisk)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackCompressedVsCodec, lz4, std::string("lz4"))
    ->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(BM_PackCompressedVsCodec, zstd, std::string("zstd"))
    ->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace
