// The dataset reader against the physical references it is built from, measured in the same
// run (issue 3). Every figure is a ratio, reference time / engine time (higher is faster):
//   BM_Get: get(i) of random records of an uncompressed file, page cache warm: ns per
//     sample (target < 100 ns).
//   BM_GetBatch/record_bytes/threads: get_batch of 256 random records into a contiguous
//     buffer, uncompressed, warm.
//       vs_bare_gather: a bare loop of memcpy calls over the same mapping and indices on one
//         thread (target >= 0.9 with threads = 1);
//       vs_memcpy: one memcpy of the same number of contiguous bytes (targets with the
//         machine's two cores: >= 0.5 for 784-byte records, >= 0.9 for 150528-byte records).
//       (threads = 2) ideal_2t_vs_memcpy: what this machine allows: the best two-thread
//         gather we know how to write, with nothing of the engine in it (a dedicated helper
//         thread spinning on a flag, each thread copying a fixed half with the engine's
//         prefetch), against the same memcpy; vs_ideal_2t: the engine against it (the
//         quotient of the two ratios: the helper's spinning would slow the engine's pool).
//   BM_GetBatchStreamingStores/record_bytes/threads: get_batch with non-temporal stores
//     (engine/streaming_copy.h) against get_batch with memcpy, alternated, each into its own
//     output: vs_memcpy_gather = speed(streaming) / speed(memcpy); > 1 where streaming pays.
//     auto_streams: whether the default streams such a batch here.
//   BM_ReadCompressed/codec/read: every record of an lz4 / zstd file, against the raw codec
//     decompressing the same chunks into one reused buffer (vs_raw_codec, target >= 0.8):
//       read=chunks: chunk by chunk, each field's records of a chunk as one column view
//         (column(field, first, stop)): the target's measure;
//       read=get: record by record with get(i), in order; adds the views of every sample
//         (about 50 ns each) to the decoding, which at 784 bytes per record is ~80 ns.
//   BM_Open/records: Dataset::open of a file of 1,000 or 100,000,000 records (ms; the same).
//   BM_GetBatchColdRandom: 40 random batches of 256 784-byte records (600,000 of them,
//     500 MB) gathered with get_batch from a cold file (its pages dropped before each pass,
//     the dataset opened after), ReaderOptions::read_ahead Auto against Never, alternated:
//     vs_never = time(Never) / time(Auto); read_amplification = bytes read from storage /
//     bytes delivered. Skips itself where the temporary folder keeps files in memory.
//   BM_GetBatchColdSequential/stride: the same for 400 consecutive batches from a random
//     record (80 MB), or 50 batches of one rank's share of 8 (every 8th record): the
//     kernel's readahead serves them; Auto must not slow them (vs_never ~1).
#include <benchmark/benchmark.h>
#include <lz4.h>
#include <unistd.h>
#include <zstd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "cold_reads.h"
#include "ratio.h"
#include "streaming_copy.h"

namespace {

using namespace mmt;

// Files are written once per process into a temporary folder removed at exit.
class BenchFiles {
 public:
  static BenchFiles& get() {
    static BenchFiles files;
    return files;
  }
  ~BenchFiles() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Records of one uint8 image [record_bytes] and an int64 label, written with `codec`.
  const std::string& images(int64_t record_bytes, int64_t records, const std::string& codec) {
    return images_range(record_bytes, 0, records, codec);
  }
  // The same records in `parts` shards of equal size (Dataset::open_concat reads them as one).
  std::vector<std::string> image_shards(int64_t record_bytes, int64_t records, int64_t parts) {
    std::vector<std::string> paths;
    for (int64_t p = 0; p < parts; ++p)
      paths.push_back(images_range(record_bytes, records * p / parts, records * (p + 1) / parts, "none"));
    return paths;
  }

  // `records` one-byte records: the smallest record the format has.
  const std::string& tiny(int64_t records) {
    const std::string key = "tiny" + std::to_string(records);
    auto it = paths_.find(key);
    if (it != paths_.end()) return it->second;
    const std::string path = (dir_ / (key + ".mmt")).string();
    WriterOptions options;
    options.chunk_bytes = 4 << 20;
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("label", kUInt8, {})}), options);
    Tensor zero = zeros({}, kUInt8);
    for (int64_t i = 0; i < records; ++i) writer.append({zero});
    writer.finish();
    return paths_.emplace(key, path).first->second;
  }

 private:
  // Records [begin, end) of the images() numbering.
  const std::string& images_range(int64_t record_bytes, int64_t begin, int64_t end, const std::string& codec) {
    const std::string key = std::to_string(record_bytes) + "x" + std::to_string(end) +
                            (begin > 0 ? "from" + std::to_string(begin) : std::string()) + "-" + codec;
    auto it = paths_.find(key);
    if (it != paths_.end()) return it->second;
    const std::string path = (dir_ / (key + ".mmt")).string();
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.chunk_bytes = 1 << 20;
    DatasetWriter writer = DatasetWriter::create(
        path, Schema({Field::fixed("image", kUInt8, {record_bytes}), Field::fixed("label", kInt64, {})}), options);
    Tensor image = empty({record_bytes}, kUInt8);
    uint8_t* pixels = image.mutable_data_ptr<uint8_t>();
    std::mt19937 rng(7);
    for (int64_t i = begin; i < end; ++i) {
      // Fashion-MNIST-like: a dark background with a noisy object, so codecs have work to do.
      for (int64_t p = 0; p < record_bytes; ++p)
        pixels[p] = (p / 28 + i) % 4 == 0 ? 0 : static_cast<uint8_t>(((p * 3 + i) & 0xf0) | (rng() & 0x7));
      writer.append({image, full({}, static_cast<double>(i % 10), kInt64)});
    }
    writer.finish();
    return paths_.emplace(key, path).first->second;
  }

  BenchFiles() {
    dir_ = std::filesystem::temp_directory_path() / ("mmtensor-dataset-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  std::filesystem::path dir_;
  std::map<std::string, std::string> paths_;
};

std::vector<int64_t> random_indices(int64_t count, int64_t records, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> indices(static_cast<size_t>(count));
  for (auto& i : indices) i = static_cast<int64_t>(rng() % static_cast<uint64_t>(records));
  return indices;
}

void BM_Get(benchmark::State& state) {
  const int64_t records = 100000;
  Dataset ds = Dataset::open(BenchFiles::get().images(784, records, "none"));
  const std::vector<int64_t> indices = random_indices(1 << 16, records, 1);
  for (int64_t i = 0; i < records; ++i) ds.get(i);  // validate every chunk once (first-use checks)
  size_t k = 0;
  for (auto _ : state) {
    Sample s = ds.get(indices[k++ & 0xffff]);
    benchmark::DoNotOptimize(s[0].data_ptr());
  }
  state.SetItemsProcessed(state.iterations());
}

// The machine's bound for a two-thread gather: a helper thread that spins on a generation
// counter (no pool, no queue, no allocation) and copies the second half of every batch while
// the caller copies the first, both prefetching like the engine.
class IdealTwoThreadGather {
 public:
  IdealTwoThreadGather(const std::byte* base, int64_t stride, int64_t record_bytes, std::byte* out)
      : base_(base), stride_(stride), record_bytes_(record_bytes), out_(out), helper_([this] { help(); }) {}
  ~IdealTwoThreadGather() {
    stop_.store(true);
    helper_.join();
  }
  void operator()(const std::vector<int64_t>& indices) {
    indices_ = &indices;
    const uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
    generation_.store(generation, std::memory_order_release);
    copy(indices, 0, static_cast<int64_t>(indices.size()) / 2);
    while (done_.load(std::memory_order_acquire) != generation) __builtin_ia32_pause();
    benchmark::ClobberMemory();
  }

 private:
  void copy(const std::vector<int64_t>& indices, int64_t lo, int64_t hi) const {
    for (int64_t b = lo; b < hi; ++b) {
      if (b + 6 < hi) {
        const std::byte* ahead = base_ + indices[static_cast<size_t>(b + 6)] * stride_;
        for (int64_t off = 0; off < std::min<int64_t>(record_bytes_, 2048); off += 64) __builtin_prefetch(ahead + off, 0, 2);
      }
      std::memcpy(out_ + b * record_bytes_, base_ + indices[static_cast<size_t>(b)] * stride_, static_cast<size_t>(record_bytes_));
    }
  }
  void help() {
    uint64_t seen = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      const uint64_t generation = generation_.load(std::memory_order_acquire);
      if (generation == seen) {
        __builtin_ia32_pause();
        continue;
      }
      seen = generation;
      const int64_t n = static_cast<int64_t>(indices_->size());
      copy(*indices_, n / 2, n);
      done_.store(generation, std::memory_order_release);
    }
  }

  const std::byte* base_;
  int64_t stride_, record_bytes_;
  std::byte* out_;
  const std::vector<int64_t>* indices_ = nullptr;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::thread helper_;
};

void BM_GetBatch(benchmark::State& state) {
  const int64_t record_bytes = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t batch = 256;
  // Enough records that a batch is not served from the CPU caches.
  const int64_t records = record_bytes >= 100000 ? 1200 : 100000;
  Dataset ds = Dataset::open(BenchFiles::get().images(record_bytes, records, "none"));
  Tensor column = ds.column("image");
  const std::byte* base = static_cast<const std::byte*>(column.data_ptr());
  const int64_t stride_bytes = column.stride(0);
  Tensor out = empty({batch, record_bytes}, kUInt8);
  std::byte* dst = static_cast<std::byte*>(out.mutable_data_ptr());
  std::vector<std::vector<int64_t>> batches;
  for (uint32_t b = 0; b < 64; ++b) batches.push_back(random_indices(batch, records, 100 + b));
  for (const auto& indices : batches) ds.get_batch(indices, "image", out, threads);  // first-use checks

  size_t round = 0;
  auto engine = [&] { ds.get_batch(batches[round++ % batches.size()], "image", out, threads); };
  auto bare_gather = [&] {
    const auto& indices = batches[round++ % batches.size()];
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(dst + b * record_bytes, base + indices[b] * stride_bytes, static_cast<size_t>(record_bytes));
    benchmark::ClobberMemory();
  };
  for (auto _ : state) engine();
  state.SetBytesProcessed(state.iterations() * batch * record_bytes);
  bench::MemcpyReference one_memcpy(static_cast<size_t>(batch * record_bytes));
  state.counters["vs_bare_gather"] = bench::median_speed_ratio(engine, bare_gather, 101);
  state.counters["vs_memcpy"] = bench::median_speed_ratio(engine, one_memcpy, 101);
  if (threads == 2) {
    IdealTwoThreadGather ideal(base, stride_bytes, record_bytes, dst);
    auto ideal_gather = [&] { ideal(batches[round++ % batches.size()]); };
    // Not timed against the engine directly: the helper spins on the second core all along,
    // where the engine's own pool worker would have to share it.
    const double ideal_vs_memcpy = bench::median_speed_ratio(ideal_gather, one_memcpy, 101);
    state.counters["ideal_2t_vs_memcpy"] = ideal_vs_memcpy;
    state.counters["vs_ideal_2t"] = state.counters["vs_memcpy"] / ideal_vs_memcpy;
  }
}

// get_batch with non-temporal stores (detail::streaming_copy) against get_batch with memcpy,
// alternated in one run, each into an output of its own (one shared output would start every
// memcpy pass from a buffer the streaming pass had just evicted from the caches):
// vs_memcpy_gather = speed(streaming) / speed(memcpy).
void BM_GetBatchStreamingStores(benchmark::State& state) {
  const int64_t record_bytes = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t batch = 256;
  const int64_t records = record_bytes >= 100000 ? 1200 : record_bytes >= 60000 ? 2000 : record_bytes >= 8192 ? 8000 : 100000;
  Dataset ds = Dataset::open(BenchFiles::get().images(record_bytes, records, "none"));
  Tensor streamed = empty({batch, record_bytes}, kUInt8), copied = empty({batch, record_bytes}, kUInt8);
  std::vector<std::vector<int64_t>> batches;
  for (uint32_t b = 0; b < 64; ++b) batches.push_back(random_indices(batch, records, 100 + b));
  for (const auto& indices : batches) ds.get_batch(indices, "image", copied, threads);  // first-use checks
  size_t round = 0;
  auto gather_with = [&](detail::StreamingStores mode, const Tensor& out) {
    const detail::ScopedStreamingStores streaming(mode);
    ds.get_batch(batches[round++ % batches.size()], "image", out, threads);
  };
  auto streaming = [&] { gather_with(detail::StreamingStores::Always, streamed); };
  auto ordinary = [&] { gather_with(detail::StreamingStores::Never, copied); };
  for (auto _ : state) streaming();
  state.SetBytesProcessed(state.iterations() * batch * record_bytes);
  state.counters["vs_memcpy_gather"] = bench::median_speed_ratio(streaming, ordinary, 101);
  state.counters["batch_MB"] = static_cast<double>(batch * record_bytes) / (1 << 20);
  // What the default (Auto) does with this batch on this machine: 1 streams.
  state.counters["auto_streams"] = detail::use_streaming_copy(record_bytes, batch * record_bytes);
}

void BM_ReadCompressed(benchmark::State& state) {
  const std::string codec = state.range(0) == 0 ? "lz4" : "zstd";
  const bool by_chunk = state.range(1) == 0;
  state.SetLabel(codec + (by_chunk ? " chunk by chunk" : " get(i)"));
  const int64_t records = 20000;
  const std::string& path = BenchFiles::get().images(784, records, codec);
  ReaderOptions options;
  options.cache_bytes = 4 << 20;  // a few chunks: every pass decodes every chunk once
  Dataset ds = Dataset::open(path, options);
  UntypedStorage file = UntypedStorage::map_file(path);
  std::vector<ChunkInfo> chunks;
  int64_t decoded_bytes = 0, max_chunk = 0;
  for (int64_t c = 0; c < ds.num_chunks(); ++c) {
    chunks.push_back(ds.chunk(c));
    decoded_bytes += chunks.back().decoded_bytes;
    max_chunk = std::max(max_chunk, chunks.back().decoded_bytes);
  }
  std::vector<char> buffer(static_cast<size_t>(max_chunk));
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  auto raw_codec = [&] {
    for (const ChunkInfo& c : chunks) {
      const char* src = reinterpret_cast<const char*>(file.data() + c.file_offset);
      if (c.codec == Codec::LZ4)
        LZ4_decompress_safe(src, buffer.data(), static_cast<int>(c.stored_bytes), static_cast<int>(c.decoded_bytes));
      else
        ZSTD_decompressDCtx(dctx, buffer.data(), buffer.size(), src, static_cast<size_t>(c.stored_bytes));
      benchmark::ClobberMemory();
    }
  };
  auto engine = [&] {
    if (by_chunk) {
      for (const ChunkInfo& c : chunks)
        for (const Field& field : ds.schema()) {
          Tensor records_of_chunk = ds.column(field.name, c.first_record, c.first_record + c.record_count);
          benchmark::DoNotOptimize(records_of_chunk.data_ptr());
        }
      return;
    }
    for (int64_t i = 0; i < records; ++i) {
      Sample s = ds.get(i);
      benchmark::DoNotOptimize(s[0].data_ptr());
    }
  };
  for (auto _ : state) engine();
  state.SetBytesProcessed(state.iterations() * decoded_bytes);
  state.counters["vs_raw_codec"] = bench::median_speed_ratio(engine, raw_codec, 15);
  state.counters["ratio_stored"] = static_cast<double>(ds.info().stored_bytes) / static_cast<double>(decoded_bytes);
  ZSTD_freeDCtx(dctx);
}

void BM_Open(benchmark::State& state) {
  const std::string& path = BenchFiles::get().tiny(state.range(0));
  for (auto _ : state) {
    Dataset ds = Dataset::open(path);
    benchmark::DoNotOptimize(ds.size());
  }
  state.counters["records"] = static_cast<double>(state.range(0));
}

// Cold passes of get_batch (bench/cold_reads.h): the dataset opened with the pass's
// read-ahead, then batches of kColdBatch records (image and label) gathered into one set of
// buffers on one thread. `batches_for(dataset, random)` makes the pass's batch maker: it
// fills a batch's indices and returns true, or returns false when the pass is done.
constexpr int64_t kColdBatch = 256;

template <typename BatchesFor>
auto get_batch_pass(BatchesFor batches_for) {
  return [batches_for](const std::vector<std::string>& paths, ReadAhead read_ahead, uint64_t seed, const auto& end) {
    ReaderOptions options;
    options.read_ahead = read_ahead;
    const Dataset dataset = Dataset::open_concat(paths, options);
    const std::vector<std::string> fields{"image", "label"};
    const std::vector<Tensor> outs{empty({kColdBatch, 1, 28, 28}, kUInt8), empty({kColdBatch}, kInt64)};
    std::mt19937_64 random(seed);
    auto next_batch = batches_for(dataset, random);
    std::vector<int64_t> indices(kColdBatch);
    int64_t batches = 0;
    for (; next_batch(indices); ++batches) dataset.get_batch(indices, fields, outs, /*threads=*/1);
    end();
    return batches * (outs[0].nbytes() + outs[1].nbytes());
  };
}

// 40 random batches, Auto against Never: from one file, or (shards:1) from the same records
// in 8 shards read as one; (captions:1) records with a ragged caption too, whose shards are
// read part by part.
void BM_GetBatchColdRandom(benchmark::State& state) {
  if (const std::string& why = bench::cold_reads_unavailable(); !why.empty())
    return state.SkipWithError(("no cold reads to measure: " + why).c_str());
  const bool shards = state.range(0) != 0, captions = state.range(1) != 0;
  const Dataset& written = captions ? bench::captioned_records(shards)
                                    : shards ? bench::small_records_shards() : bench::small_records_dataset();
  bench::run_cold_random_passes(state, written,
                                get_batch_pass([](const Dataset& dataset, std::mt19937_64& random) {
                                  std::uniform_int_distribution<int64_t> record(0, dataset.size() - 1);
                                  return [&random, record, left = 40](std::vector<int64_t>& indices) mutable {
                                    if (left-- == 0) return false;
                                    for (int64_t& i : indices) i = record(random);
                                    return true;
                                  };
                                }));
}

// A run of consecutive batches from a random record (a resumed scan), or one rank's share of
// such a run (a distributed sampler without shuffling: every `stride`-th record). The
// kernel's own readahead serves it, and Auto must leave it so (it does not hint neighbouring
// records).
void BM_GetBatchColdSequential(benchmark::State& state) {
  if (const std::string& why = bench::cold_reads_unavailable(); !why.empty())
    return state.SkipWithError(("no cold reads to measure: " + why).c_str());
  const int64_t stride = state.range(0), batches = 400 / stride;  // 80 MB, or 10 MB of every 8th record
  bench::run_cold_random_passes(
      state, bench::small_records_dataset(),
      get_batch_pass([stride, batches](const Dataset& dataset, std::mt19937_64& random) {
        const int64_t span = batches * kColdBatch * stride;
        const int64_t first = std::uniform_int_distribution<int64_t>(0, dataset.size() - span)(random);
        return [stride, next = first, left = batches](std::vector<int64_t>& indices) mutable {
          if (left-- == 0) return false;
          for (int64_t& i : indices) i = std::exchange(next, next + stride);
          return true;
        };
      }));
}

// Shards read as one (Dataset::open_concat) against the same records in one file, both
// uncompressed and warm, the same random indices alternated in one run.
//   BM_GetShards: get(i) ns per sample over 8 shards; vs_one_file = time(one file) /
//     time(shards), 4096 gets at a time (the lookup of the part, and the sample renumbered).
//   BM_GetBatchShards/record_bytes/threads: get_batch of 256 random records spread over 8
//     shards into one buffer; vs_one_file as above (our target >= 0.9: a batch over shards
//     is gathered part by part straight into its rows, not staged and copied again), and
//     vs_memcpy. vs_one_file is a ratio of medians of single batches timed in turn.
constexpr int64_t kShards = 8;

// time(reference) / time(subject), each the median of `rounds` single calls made in turn.
// For calls of a few microseconds, where a median of per-round quotients (ratio.h) swung
// between 0.4 and 1.2 from run to run here: each call inherits the caches the other left.
double ratio_of_medians(const std::function<void()>& subject, const std::function<void()>& reference, int rounds) {
  std::vector<double> s, r;
  for (int i = 0; i < rounds; ++i) {
    s.push_back(bench::seconds_of(subject));
    r.push_back(bench::seconds_of(reference));
  }
  std::nth_element(s.begin(), s.begin() + rounds / 2, s.end());
  std::nth_element(r.begin(), r.begin() + rounds / 2, r.end());
  return r[static_cast<size_t>(rounds / 2)] / s[static_cast<size_t>(rounds / 2)];
}

void BM_GetShards(benchmark::State& state) {
  const int64_t records = 100000;
  const Dataset one = Dataset::open(BenchFiles::get().images(784, records, "none"));
  const Dataset shards = Dataset::open_concat(BenchFiles::get().image_shards(784, records, kShards));
  const std::vector<int64_t> indices = random_indices(1 << 16, records, 1);
  for (int64_t i = 0; i < records; ++i) one.get(i), shards.get(i);  // first-use checks
  size_t k = 0;
  for (auto _ : state) {
    Sample s = shards.get(indices[k++ & 0xffff]);
    benchmark::DoNotOptimize(s[0].data_ptr());
  }
  state.SetItemsProcessed(state.iterations());
  const auto gets = [&](const Dataset& ds) {
    return [&ds, &indices, &k] {
      for (int r = 0; r < 4096; ++r) {
        Sample s = ds.get(indices[k++ & 0xffff]);
        benchmark::DoNotOptimize(s[0].data_ptr());
      }
    };
  };
  state.counters["vs_one_file"] = ratio_of_medians(gets(shards), gets(one), 2001);
}

void BM_GetBatchShards(benchmark::State& state) {
  const int64_t record_bytes = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t batch = 256;
  const int64_t records = record_bytes >= 100000 ? 1200 : 100000;
  const Dataset one = Dataset::open(BenchFiles::get().images(record_bytes, records, "none"));
  const Dataset shards = Dataset::open_concat(BenchFiles::get().image_shards(record_bytes, records, kShards));
  Tensor out = empty({batch, record_bytes}, kUInt8);
  std::vector<std::vector<int64_t>> batches;
  for (uint32_t b = 0; b < 64; ++b) batches.push_back(random_indices(batch, records, 100 + b));
  for (const auto& indices : batches) {  // first-use checks
    one.get_batch(indices, "image", out, threads);
    shards.get_batch(indices, "image", out, threads);
  }
  size_t round = 0;
  const auto gather = [&](const Dataset& ds) {
    return [&ds, &batches, &round, &out, threads] { ds.get_batch(batches[round++ % batches.size()], "image", out, threads); };
  };
  for (auto _ : state) gather(shards)();
  state.SetBytesProcessed(state.iterations() * batch * record_bytes);
  state.counters["vs_one_file"] = ratio_of_medians(gather(shards), gather(one), record_bytes >= 100000 ? 201 : 20001);
  bench::MemcpyReference one_memcpy(static_cast<size_t>(batch * record_bytes));
  state.counters["vs_memcpy"] = bench::median_speed_ratio(gather(shards), one_memcpy, 101);
}

}  // namespace

BENCHMARK(BM_Get)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_GetShards)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_GetBatchShards)
    ->ArgsProduct({{784, 150528}, {1, 2}})
    ->ArgNames({"record_bytes", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_GetBatch)
    ->ArgsProduct({{784, 150528}, {1, 2}})
    ->ArgNames({"record_bytes", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_GetBatchStreamingStores)
    ->ArgsProduct({{784, 16384, 65536, 150528}, {1, 2}})
    ->ArgNames({"record_bytes", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_ReadCompressed)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"codec", "read"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Open)->Arg(1000)->Arg(100000000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GetBatchColdRandom)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"shards", "captions"})->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GetBatchColdSequential)->Arg(1)->Arg(8)->ArgName("stride")->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
