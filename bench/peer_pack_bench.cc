// mmtensor's packing for the peer benchmarks: builds the files its reading benchmarks use from
// the same .npy sources the peers are packed from (bench/peers/prepare.py), and reports the
// time (including finish()'s fsync, as the peers' times include theirs) and the file size.
// Registered only with MMT_PEER_DIR set and MMT_PEER_PHASE=pack.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>
#include <vector>

#include "mmtensor/dataset_writer.h"
#include "mmtensor/packer.h"
#include "peer_data.h"

namespace {

using namespace mmt;
using namespace mmt::bench::peers;

// Same records per chunk as the chunked peers (prepare.py's FMNIST_CHUNK_RECORDS).
constexpr int64_t kFmnistChunkRecords = 1024;

void report_pack(benchmark::State& state, const std::string& path, const WriteStats& stats) {
  state.counters["records"] = static_cast<double>(stats.records);
  state.counters["bytes"] = static_cast<double>(stats.bytes_in);
  state.counters["file_bytes"] = static_cast<double>(std::filesystem::file_size(path));
}

void pack_arrays(benchmark::State& state, const std::string& workload, const std::string& codec,
                 int64_t chunk_records) {
  const std::string dir = peer_dir() + "/" + workload;
  const std::string path = dir + "/" + codec + ".mmt";
  for (auto _ : state) {
    std::vector<std::string> specs = {"image=" + dir + "/images.npy", "label=" + dir + "/labels.npy"};
    PackOptions options;
    options.writer.codec = CodecSpec::parse(codec);
    options.writer.chunk_records = chunk_records;
    options.writer.overwrite = true;
    WriteStats stats = pack_dataset(path, PackSources::from_arrays(specs), options);
    state.PauseTiming();
    report_pack(state, path, stats);
    state.ResumeTiming();
  }
}

// Token sequences come as the flat-array-plus-offsets pair; each document becomes one record
// of a ragged int32 field.
void pack_tokens(benchmark::State& state, const std::string& codec) {
  const std::string dir = peer_dir() + "/tokens";
  const std::string path = dir + "/" + codec + ".mmt";
  for (auto _ : state) {
    Tensor tokens = load_npy(dir + "/tokens.npy");
    Tensor offsets = load_npy(dir + "/offsets.npy");
    const int64_t* off = offsets.data_ptr<int64_t>();
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.overwrite = true;
    DatasetWriter writer = DatasetWriter::create(
        path, Schema({Field::ragged("tokens", kInt32, {kVariableDim})}), options);
    for (int64_t doc = 0; doc + 1 < offsets.numel(); ++doc) {
      writer.append({tokens.narrow(0, off[doc], off[doc + 1] - off[doc])});
    }
    WriteStats stats = writer.finish();
    state.PauseTiming();
    report_pack(state, path, stats);
    state.ResumeTiming();
  }
}

void register_pack_benchmarks() {
  if (peer_dir().empty() || !pack_phase()) return;
  for (const char* codec : {"none", "lz4", "zstd"}) {
    benchmark::RegisterBenchmark(
        (std::string("Peer/fmnist/mmtensor ") + codec + "/pack").c_str(),
        [codec](benchmark::State& s) { pack_arrays(s, "fmnist", codec, kFmnistChunkRecords); })
        ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // Uncompressed records of 147 KiB: the writer's default 1 MiB chunks.
  benchmark::RegisterBenchmark("Peer/imagenet/mmtensor none/pack",
                               [](benchmark::State& s) { pack_arrays(s, "imagenet", "none", 0); })
      ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
  for (const char* codec : {"none", "zstd"}) {
    benchmark::RegisterBenchmark((std::string("Peer/tokens/mmtensor ") + codec + "/pack").c_str(),
                                 [codec](benchmark::State& s) { pack_tokens(s, codec); })
        ->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

const bool registered = (register_pack_benchmarks(), true);

}  // namespace
