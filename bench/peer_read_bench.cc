// mmtensor's side of the peer benchmarks, and the physical limits beside it: every contender
// reads the same records (index files written once by bench/peers/prepare.py with a fixed
// seed) into a contiguous buffer, one thread, with the protocol of peers/peer_common.h: open
// is its own figure (Peer/<workload>/mmtensor <codec>/open, median of warm opens); a warm op
// opens once outside the timer and runs one untimed pass before the timed one; a cold_* op
// opens outside the timer (decoded-chunk cache empty), evicts the file's pages, then times the
// reads. Names are Peer/<workload>/<contender>/<op>; counters: records and bytes per run.
// References measured here, warmed up the same way: `memcpy` gathers the same records from
// anonymous memory into the same buffer, and `raw lz4`/`raw zstd` decode the very chunk
// payloads of mmtensor's compressed files with the libraries called directly. Registered only
// with MMT_PEER_DIR set (see peer_data.h).
#include <benchmark/benchmark.h>
#include <lz4.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mmtensor/dataset.h"
#include "peer_data.h"
#include "peers/page_cache.h"
#include "peers/peer_common.h"
#include "ratio.h"

namespace {

using namespace mmt;
using namespace mmt::bench::peers;
using mmt::peers::evict_from_page_cache;
using mmt::peers::is_cold;
using mmt::peers::median_open_seconds;
using mmt::peers::resident_fraction;
using mmt::peers::warm_page_cache;

constexpr int64_t kEpochBatch = 256;  // every epoch op gathers batches of 256 (full ones only)

IndexRows rows_for(const std::string& workload, const std::string& op, int64_t records) {
  if (op == "seq_epoch" || op == "cold_seq_epoch") {
    IndexRows r;
    r.indices = arange(records);
    r.batch = kEpochBatch;
    r.rows = records / kEpochBatch;
    return r;
  }
  if (op == "single") return load_index_rows(workload, "single", 1);
  if (op == "cold_batch256") return load_index_rows(workload, "batch256");
  if (op == "random_epoch" || op == "quasi_epoch") return load_index_rows(workload, op, kEpochBatch);
  return load_index_rows(workload, op);
}

// Fixed-shape records (image + label): single access through get(), batches through get_batch().
struct FixedGather {
  Tensor image;  // [B, ...] uint8
  Tensor label;  // [B] int64

  FixedGather(const Dataset& ds, int64_t batch) {
    DimVector sizes = {batch};
    for (int64_t d : ds.schema()[ds.schema().index_of("image")].shape) sizes.push_back(d);
    image = empty(sizes, kUInt8);
    label = empty({batch}, kInt64);
  }
  void run(const Dataset& ds, const IndexRows& rows, bool single) const {
    for (int64_t r = 0; r < rows.rows; ++r) {
      std::span<const int64_t> idx = rows.row(r);
      if (single) {
        Sample s = ds.get(idx[0]);
        image[0].copy_(s[0]);
        label[0].copy_(s[1]);
      } else {
        static const std::string kFields[] = {"image", "label"};
        const Tensor outs[] = {image, label};
        ds.get_batch(idx, kFields, outs);
      }
    }
    benchmark::DoNotOptimize(image.data_ptr());
  }
};

// Ragged token sequences packed as values + offsets, as a loader hands them to a model.
// Random rows: get() per document. Rows of consecutive documents (the sequential epochs):
// ragged_column() per run of the row inside one chunk, a view there, so the row costs one
// memcpy per chunk it touches, as the flat+offsets peer's one slice per batch does.
struct TokenGather {
  std::vector<int32_t> values;
  std::vector<int64_t> offsets;
  bool consecutive = false;

  TokenGather(int64_t batch, bool consecutive_rows)
      : values(batch * 4096), offsets(batch + 1), consecutive(consecutive_rows) {}
  void run(const Dataset& ds, const IndexRows& rows) {
    for (int64_t r = 0; r < rows.rows; ++r) {
      if (consecutive) {
        gather_consecutive(ds, rows.row(r));
        continue;
      }
      int64_t filled = 0;
      int64_t k = 0;
      for (int64_t i : rows.row(r)) {
        Tensor doc = ds.get(i, "tokens");
        std::memcpy(values.data() + filled, doc.data_ptr(), static_cast<size_t>(doc.nbytes()));
        filled += doc.numel();
        offsets[++k] = filled;
      }
    }
    benchmark::DoNotOptimize(values.data());
  }

 private:
  void gather_consecutive(const Dataset& ds, std::span<const int64_t> row) {
    const int64_t stop = row.back() + 1;
    int64_t filled = 0;
    int64_t k = 0;
    for (int64_t start = row.front(); start < stop;) {
      const ChunkInfo chunk = ds.chunk(ds.chunk_of(start));
      const int64_t piece_stop = std::min(stop, chunk.first_record + chunk.record_count);
      const RaggedBatch piece = ds.ragged_column("tokens", start, piece_stop);
      if (piece.values.numel() > 0)
        std::memcpy(values.data() + filled, piece.values.data_ptr(), static_cast<size_t>(piece.values.nbytes()));
      const int64_t* piece_offsets = piece.offsets.data_ptr<int64_t>();
      for (int64_t j = 1; j <= piece_stop - start; ++j) offsets[++k] = filled + piece_offsets[j];
      filled += piece.values.numel();
      start = piece_stop;
    }
  }
};

int64_t record_count(const std::string& path) { return Dataset::open(path).size(); }

// `codec` names the file; "none-noverify" reads none.mmt with checksum verification off, to
// show what the default first-use verification costs.
std::string mmtensor_path(const std::string& workload, std::string& codec, ReaderOptions& reader) {
  if (codec == "none-noverify") {
    codec = "none";
    reader.verify_checksums = false;
  }
  return peer_dir() + "/" + workload + "/" + codec + ".mmt";
}

// Dataset::open on a warm page cache, as its own figure (manual time: the median open).
void open_mmtensor(benchmark::State& state, const std::string& workload, std::string codec) {
  ReaderOptions reader;
  const std::string path = mmtensor_path(workload, codec, reader);
  warm_page_cache(path);
  for (auto _ : state) {
    state.SetIterationTime(median_open_seconds([&] { return Dataset::open(path, reader); }));
  }
  state.counters["records"] = 1;
  state.counters["bytes"] = 0;
}

void read_mmtensor(benchmark::State& state, const std::string& workload, std::string codec,
                   const std::string& op) {
  ReaderOptions reader;
  const std::string path = mmtensor_path(workload, codec, reader);
  const int64_t records = record_count(path);
  const IndexRows rows = rows_for(workload, op, records);
  const bool tokens = workload == "tokens";
  const bool single = op == "single";
  if (!is_cold(op)) warm_page_cache(path);
  Dataset ds = Dataset::open(path, reader);  // outside the timer: open is its own figure
  TokenGather token_gather(tokens ? rows.batch : 0, op == "seq_epoch" || op == "cold_seq_epoch");
  std::unique_ptr<FixedGather> fixed_gather;
  if (!tokens) fixed_gather = std::make_unique<FixedGather>(ds, rows.batch);
  auto read_all = [&] {
    if (tokens) {
      token_gather.run(ds, rows);
    } else {
      fixed_gather->run(ds, rows, single);
    }
  };
  if (is_cold(op)) {
    // The open mapped the header and chunk table; every other page leaves (the check below).
    evict_from_page_cache(path);
    state.counters["resident_after_evict"] = resident_fraction(path);
  } else {
    read_all();  // the untimed warm-up pass: the timed one is steady state
  }
  for (auto _ : state) read_all();
  state.counters["records"] = static_cast<double>(rows.total());
  double bytes = 0;
  if (tokens) {  // exact bytes of the documents read
    for (int64_t r = 0; r < rows.rows; ++r)
      for (int64_t i : rows.row(r)) bytes += static_cast<double>(ds.get(i, "tokens").nbytes());
  } else {
    bytes = static_cast<double>(rows.total() * (fixed_gather->image[0].nbytes() + 8));
  }
  state.counters["bytes"] = bytes;
  // The alternating ratio of ratio.h, for the warm uncompressed gathers where it means "how
  // close to a plain memcpy of the same records", on the same open dataset.
  if (!tokens && codec == "none" && !is_cold(op) && op.find("epoch") == std::string::npos) {
    Tensor source = load_npy(peer_dir() + "/" + workload + "/images.npy").contiguous().clone();
    const int64_t record_bytes = fixed_gather->image[0].nbytes();
    auto* dst = static_cast<uint8_t*>(fixed_gather->image.mutable_data_ptr());
    const auto* src = static_cast<const uint8_t*>(source.data_ptr());
    auto memcpy_gather = [&] {
      for (int64_t r = 0; r < rows.rows; ++r) {
        int64_t k = 0;
        for (int64_t i : rows.row(r)) std::memcpy(dst + k++ * record_bytes, src + i * record_bytes, record_bytes);
      }
      benchmark::ClobberMemory();
    };
    state.counters["vs_memcpy"] = mmt::bench::median_speed_ratio(read_all, memcpy_gather, 7);
  }
}

// The same records copied from anonymous memory: what any reader must at least spend.
void read_memcpy(benchmark::State& state, const std::string& workload, const std::string& op) {
  const std::string dir = peer_dir() + "/" + workload;
  if (workload == "tokens") {
    Tensor tokens = load_npy(dir + "/tokens.npy").clone();
    Tensor offsets = load_npy(dir + "/offsets.npy").clone();
    const int64_t* off = offsets.data_ptr<int64_t>();
    const int32_t* src = tokens.data_ptr<int32_t>();
    const IndexRows rows = rows_for(workload, op, offsets.numel() - 1);
    std::vector<int32_t> values(rows.batch * 4096);
    double bytes = 0;
    auto gather = [&] {
      bytes = 0;
      for (int64_t r = 0; r < rows.rows; ++r) {
        int64_t filled = 0;
        for (int64_t i : rows.row(r)) {
          const int64_t n = off[i + 1] - off[i];
          std::memcpy(values.data() + filled, src + off[i], static_cast<size_t>(n) * 4);
          filled += n;
          bytes += static_cast<double>(n) * 4;
        }
      }
      benchmark::DoNotOptimize(values.data());
    };
    gather();  // untimed warm-up pass, as every contender gets
    for (auto _ : state) gather();
    state.counters["records"] = static_cast<double>(rows.total());
    state.counters["bytes"] = bytes;
    return;
  }
  Tensor images = load_npy(dir + "/images.npy").clone();  // anonymous memory, faulted in
  Tensor labels = load_npy(dir + "/labels.npy").clone();
  const int64_t record_bytes = images[0].nbytes();
  const IndexRows rows = rows_for(workload, op, images.size(0));
  std::vector<uint8_t> image_out(rows.batch * record_bytes);
  std::vector<int64_t> label_out(rows.batch);
  const auto* src = static_cast<const uint8_t*>(images.data_ptr());
  const int64_t* label_src = labels.data_ptr<int64_t>();
  auto gather = [&] {
    for (int64_t r = 0; r < rows.rows; ++r) {
      int64_t k = 0;
      for (int64_t i : rows.row(r)) {
        std::memcpy(image_out.data() + k * record_bytes, src + i * record_bytes, record_bytes);
        label_out[k++] = label_src[i];
      }
    }
    benchmark::DoNotOptimize(image_out.data());
    benchmark::DoNotOptimize(label_out.data());
  };
  gather();  // untimed warm-up pass: faults the output buffer in
  for (auto _ : state) gather();
  state.counters["records"] = static_cast<double>(rows.total());
  state.counters["bytes"] = static_cast<double>(rows.total() * (record_bytes + 8));
}

// Every chunk payload of an mmtensor file decoded by the codec library itself, no engine.
void decode_raw(benchmark::State& state, const std::string& workload, const std::string& codec) {
  const std::string path = peer_dir() + "/" + workload + "/" + codec + ".mmt";
  Dataset ds = Dataset::open(path);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<ChunkInfo> chunks;
  int64_t largest = 0;
  for (int64_t c = 0; c < ds.num_chunks(); ++c) {
    chunks.push_back(ds.chunk(c));
    largest = std::max(largest, chunks.back().decoded_bytes);
  }
  std::vector<char> out(largest);
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  double decoded = 0;
  auto decode_all = [&] {
    decoded = 0;
    for (const ChunkInfo& c : chunks) {
      const char* src = file.data() + c.file_offset;
      if (c.codec == Codec::LZ4) {
        if (LZ4_decompress_safe(src, out.data(), static_cast<int>(c.stored_bytes),
                                static_cast<int>(c.decoded_bytes)) != c.decoded_bytes) {
          state.SkipWithError("lz4 decode failed");
        }
      } else {
        size_t n = ZSTD_decompressDCtx(dctx.get(), out.data(), out.size(), src, c.stored_bytes);
        if (ZSTD_isError(n)) state.SkipWithError("zstd decode failed");
      }
      decoded += static_cast<double>(c.decoded_bytes);
    }
    benchmark::DoNotOptimize(out.data());
  };
  decode_all();  // untimed warm-up pass
  for (auto _ : state) decode_all();
  state.counters["records"] = static_cast<double>(ds.size());
  state.counters["bytes"] = decoded;
}

void add(const std::string& name, std::function<void(benchmark::State&)> fn) {
  benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& s) { fn(s); })
      ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
}

void add_open(const std::string& workload, const std::string& codec) {
  benchmark::RegisterBenchmark(("Peer/" + workload + "/mmtensor " + codec + "/open").c_str(),
                               [=](benchmark::State& s) { open_mmtensor(s, workload, codec); })
      ->Iterations(1)->Unit(benchmark::kMicrosecond)->UseManualTime();
}

void register_read_benchmarks() {
  if (peer_dir().empty() || pack_phase()) return;
  for (const char* codec : {"none", "none-noverify", "lz4", "zstd"}) add_open("fmnist", codec);
  for (const char* codec : {"none", "none-noverify"}) add_open("imagenet", codec);
  for (const char* codec : {"none", "zstd"}) add_open("tokens", codec);
  const std::vector<std::string> fixed_ops = {"single", "batch64", "batch256", "seq_epoch",
                                              "random_epoch", "cold_seq_epoch", "cold_batch256"};
  for (const char* codec : {"none", "none-noverify", "lz4", "zstd"}) {
    std::vector<std::string> ops = fixed_ops;
    ops.push_back("quasi_epoch");
    for (const std::string& op : ops)
      add(std::string("Peer/fmnist/mmtensor ") + codec + "/" + op,
          [=](benchmark::State& s) { read_mmtensor(s, "fmnist", codec, op); });
  }
  for (const char* codec : {"none", "none-noverify"})
    for (const std::string& op : fixed_ops)
      add(std::string("Peer/imagenet/mmtensor ") + codec + "/" + op,
          [=](benchmark::State& s) { read_mmtensor(s, "imagenet", codec, op); });
  for (const char* codec : {"none", "zstd"})
    for (const char* op : {"single", "batch64", "batch256", "seq_epoch", "cold_seq_epoch"})
      add(std::string("Peer/tokens/mmtensor ") + codec + "/" + op,
          [=](benchmark::State& s) { read_mmtensor(s, "tokens", codec, op); });
  for (const char* op : {"single", "batch64", "batch256", "seq_epoch", "random_epoch", "quasi_epoch"})
    add(std::string("Peer/fmnist/memcpy/") + op, [=](benchmark::State& s) { read_memcpy(s, "fmnist", op); });
  for (const char* op : {"single", "batch64", "batch256", "seq_epoch", "random_epoch"})
    add(std::string("Peer/imagenet/memcpy/") + op, [=](benchmark::State& s) { read_memcpy(s, "imagenet", op); });
  for (const char* op : {"single", "batch64", "batch256", "seq_epoch"})
    add(std::string("Peer/tokens/memcpy/") + op, [=](benchmark::State& s) { read_memcpy(s, "tokens", op); });
  for (const char* codec : {"lz4", "zstd"})
    add(std::string("Peer/fmnist/raw ") + codec + "/decode_all",
        [=](benchmark::State& s) { decode_raw(s, "fmnist", codec); });
  add("Peer/tokens/raw zstd/decode_all", [](benchmark::State& s) { decode_raw(s, "tokens", "zstd"); });
}

const bool registered = (register_read_benchmarks(), true);

}  // namespace
