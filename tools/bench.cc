// mmt bench FILE... [--json] [--cold]: random-access, batch-gather and loader throughput on a
// dataset (one file, or shards read as one), each beside the memcpy reference measured in the
// same run (the same bytes gathered from host memory), so the figures compare across machines
// as ratios. --cold starts each measurement from storage instead of the page cache.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "mapping_guard.h"
#include "mmt_commands.h"
#include "mmtensor/dataset.h"
#include "mmtensor/loader.h"
#include "page_cache.h"

namespace mmt::tool {
namespace {

using Clock = std::chrono::steady_clock;

// Limits that keep a run bounded in time and memory: each measurement runs at least one step
// whatever --seconds says, and a step allocates the batch (indices, gather outputs, the
// memcpy reference's target, the loader's batches in flight).
constexpr double kMaxSecondsPerMeasurement = 3600;
constexpr int64_t kMaxBatchRecords = int64_t{1} << 20;
constexpr int64_t kMaxBatchBytes = int64_t{1} << 30;

struct BenchArgs {
  std::vector<std::string> files;
  bool json = false;
  double seconds = 1.0;
  int64_t batch = 256;
  int threads = 1;
  uint64_t seed = 0;
  bool cold = false;
};

struct Rate {
  int64_t samples = 0;
  int64_t bytes = 0;
  double seconds = 0;
  double samples_per_second() const { return seconds > 0 ? samples / seconds : 0; }
  double bytes_per_second() const { return seconds > 0 ? bytes / seconds : 0; }
};

// Repeats `step` (which returns {samples, bytes}) until `seconds` have passed.
template <typename Step>
Rate run_for(double seconds, Step&& step) {
  Rate rate;
  Clock::time_point start = Clock::now();
  do {
    auto [samples, bytes] = step();
    rate.samples += samples;
    rate.bytes += bytes;
    rate.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } while (rate.seconds < seconds);
  return rate;
}

std::vector<int64_t> random_indices(std::mt19937_64& rng, int64_t count, int64_t records) {
  std::uniform_int_distribution<int64_t> pick(0, records - 1);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t& i : out) i = pick(rng);
  return out;
}

// --seconds: a finite decimal number in (0, kMaxSecondsPerMeasurement]; CLI11's own conversion
// said only "Could not convert: --seconds = abc".
double parse_seconds(const std::string& text) {
  double seconds = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  MMT_CHECK(!text.empty() && error != std::errc::invalid_argument && end == text.data() + text.size(), ValueError,
            "--seconds '", text, "' is not a number (write 0.5 or 2)");
  // Written so that NaN fails too (every comparison with NaN is false).
  MMT_CHECK(error == std::errc() && std::isfinite(seconds) && seconds > 0 && seconds <= kMaxSecondsPerMeasurement,
            ValueError, "--seconds must be a time > 0 and at most ", kMaxSecondsPerMeasurement,
            " (per measurement), got ", text);
  return seconds;
}

// The batch's size in memory, once the dataset's record size is known.
void check_batch_bytes(const BenchArgs& args, int64_t record_bytes) {
  MMT_CHECK(record_bytes == 0 || args.batch <= kMaxBatchBytes / record_bytes, UsageError, "--batch ",
            args.batch, " makes batches of ", human_bytes(static_cast<double>(args.batch) * record_bytes),
            " (", record_bytes, " bytes a record); the limit is ", human_bytes(kMaxBatchBytes),
            ", so at most ", kMaxBatchBytes / record_bytes, " records here");
}

nlohmann::json rate_json(const Rate& r) {
  return {{"samples_per_second", r.samples_per_second()},
          {"bytes_per_second", r.bytes_per_second()},
          {"samples", r.samples},
          {"seconds", r.seconds}};
}

// Where each measurement starts. Warm: the dataset stays open, its pages cached. Cold: the
// dataset is closed (pages it has mapped would stay cached), every file's pages are dropped
// from the page cache, and the dataset is opened again; what the measurement then had read
// from storage is reported beside it.
class Start {
 public:
  explicit Start(const BenchArgs& args) : args_(args) {}

  Dataset& open_for_measurement(Dataset& ds) {
    if (!args_.cold) return ds;
    ds = Dataset();
    for (const std::string& file : args_.files) {
      std::string why_not;
      MMT_CHECK(detail::drop_from_page_cache(file, &why_not), IoError, "--cold: ", why_not);
    }
    read_before_ = detail::process_storage_read_bytes();
    // The batch gather hints each batch itself (prefetch, then get_batch): get_batch's own
    // read-ahead would hint it twice.
    ReaderOptions options;
    options.read_ahead = ReadAhead::Never;
    ds = Dataset::open_concat(args_.files, options);
    return ds;
  }
  // Marks where the measured work ended: a loader's workers go on reading the next epoch's
  // batches, which the measurement did not use (those begun while its last batch was handed
  // out are still counted: a ring's worth at most).
  void mark_end() {
    if (args_.cold) read_at_end_ = detail::process_storage_read_bytes();
  }
  // Adds, for a cold start, the bytes read from storage from open_for_measurement() to
  // mark_end() (or to now).
  void report_reads(nlohmann::json& measurement) {
    if (!args_.cold) return;
    const int64_t now = read_at_end_ >= 0 ? read_at_end_ : detail::process_storage_read_bytes();
    measurement["storage_read_bytes"] = read_before_ >= 0 && now >= 0 ? nlohmann::json(now - read_before_) : nullptr;
    read_at_end_ = -1;
  }

 private:
  const BenchArgs& args_;
  int64_t read_before_ = -1;
  int64_t read_at_end_ = -1;
};

void run_bench(const BenchArgs& args) {
  Dataset ds = Dataset::open_concat(args.files);
  MMT_CHECK(ds.size() > 0, ValueError, ds.path(), args.files.size() > 1 ? " have" : " has", " no records to read");
  Start start(args);
  std::mt19937_64 rng(args.seed);
  std::vector<std::string> fixed_fields;
  int64_t fixed_record_bytes = 0;
  for (const Field& f : ds.schema())
    if (f.is_fixed()) {
      fixed_fields.push_back(f.name);
      fixed_record_bytes += f.fixed_nbytes();
    }
  check_batch_bytes(args, fixed_record_bytes);
  // "paths": the files one by one ("file" joins several with ", ", for display only).
  nlohmann::json report = {{"file", ds.path()}, {"paths", args.files}, {"records", ds.size()},
                           {"codec", codec_text(ds.info())}, {"batch_size", args.batch},
                           {"threads", args.threads}, {"cold", args.cold}};
  if (args.files.size() > 1) {  // as mmt info --json lists them; a single file's report is unchanged
    nlohmann::json parts = nlohmann::json::array();
    for (const Dataset& part : ds.parts())
      parts.push_back({{"path", part.path()}, {"records", part.size()}, {"codec", part.info().codec.str()}});
    report["parts"] = std::move(parts);
  }

  // Warm state, as the figures promise: when the decoded chunks fit the chunk cache, every
  // chunk is used (decoded) once first. Otherwise the first second of a compressed file
  // measures its decoder, one chunk per sample, not random access.
  const DatasetInfo info = ds.info();
  const bool fits_cache = !args.cold && info.decoded_bytes <= ReaderOptions{}.cache_bytes;
  for (int64_t c = 0; c < ds.num_chunks() && fits_cache; ++c) {
    const ChunkInfo chunk = ds.chunk(c);
    if (chunk.record_count > 0) (void)ds.get(chunk.first_record);
  }
  report["chunk_cache_warmed"] = fits_cache;

  // Random access: each sample's fields are read in full (copied out), which is what a
  // training step does with them; a view that is never read would measure nothing.
  std::vector<std::byte> scratch;
  start.open_for_measurement(ds);
  // A step is 64 samples, or fewer once it has read 64 MiB: --seconds holds for records of a
  // GiB too (a step of 64 of them decoded 64 GiB before the clock was looked at again).
  constexpr int64_t kStepBytes = int64_t{64} << 20;
  Rate random_get = run_for(args.seconds, [&] {
    int64_t bytes = 0, samples = 0;
    for (int64_t index : random_indices(rng, 64, ds.size())) {
      if (bytes >= kStepBytes) break;
      ++samples;
      Sample s = ds.get(index);
      for (size_t f = 0; f < s.size(); ++f) {
        Tensor value = s[f].contiguous();
        scratch.resize(std::max<size_t>(scratch.size(), static_cast<size_t>(value.nbytes())));
        // Under the engine's SIGBUS guard, as a reader's own copies are: a file truncated
        // while it is measured is an error naming it, not the end of the process.
        if (value.nbytes() > 0)
          detail::guard_storage_reads(value.untyped_storage(), [&] {
            std::memcpy(scratch.data(), value.data_ptr(), static_cast<size_t>(value.nbytes()));
          });
        bytes += value.nbytes();
      }
    }
    return std::pair<int64_t, int64_t>{samples, bytes};
  });
  report["random_get"] = rate_json(random_get);
  start.report_reads(report["random_get"]);

  // get_batch gathers fixed-shape fields only: the gathers measure those ("fields" says
  // which), and are null for a file that has none.
  report["batch_gather"] = report["memcpy_gather"] = report["batch_gather_vs_memcpy"] = nullptr;
  if (!fixed_fields.empty()) {
    std::vector<Tensor> outs;
    for (const std::string& name : fixed_fields) {
      const Field& f = ds.schema()[ds.schema().index_of(name)];
      std::vector<int64_t> sizes{args.batch};
      sizes.insert(sizes.end(), f.shape.begin(), f.shape.end());
      outs.push_back(empty(sizes, f.dtype));
    }
    start.open_for_measurement(ds);
    Rate gather = run_for(args.seconds, [&] {
      std::vector<int64_t> indices = random_indices(rng, args.batch, ds.size());
      // From storage, a batch is read as the API documents it: its pages hinted first, so
      // that its reads are in flight together instead of one page fault at a time.
      if (args.cold) ds.prefetch(indices, fixed_fields);  // the fields gathered, no others
      ds.get_batch(indices, fixed_fields, outs, args.threads);
      return std::pair<int64_t, int64_t>{args.batch, args.batch * fixed_record_bytes};
    });
    report["batch_gather"] = rate_json(gather);
    report["batch_gather"]["prefetch"] = args.cold;
    report["batch_gather"]["fields"] = fixed_fields;
    start.report_reads(report["batch_gather"]);

    // The reference: the same gather (batch rows of the same size, random rows) done with
    // memcpy from a host buffer of up to 256 MB, on one thread.
    int64_t rows = std::max<int64_t>(1, std::min<int64_t>(ds.size(), (int64_t{256} << 20) /
                                                                        std::max<int64_t>(fixed_record_bytes, 1)));
    std::vector<std::byte> source(static_cast<size_t>(rows * fixed_record_bytes), std::byte{1});
    std::vector<std::byte> target(static_cast<size_t>(args.batch * fixed_record_bytes));
    Rate memcpy_gather = run_for(args.seconds, [&] {
      std::vector<int64_t> indices = random_indices(rng, args.batch, rows);
      for (int64_t r = 0; r < args.batch; ++r)
        std::memcpy(target.data() + r * fixed_record_bytes,
                    source.data() + indices[static_cast<size_t>(r)] * fixed_record_bytes,
                    static_cast<size_t>(fixed_record_bytes));
      return std::pair<int64_t, int64_t>{args.batch, args.batch * fixed_record_bytes};
    });
    report["memcpy_gather"] = rate_json(memcpy_gather);
    report["batch_gather_vs_memcpy"] =
        memcpy_gather.bytes_per_second() > 0 ? gather.bytes_per_second() / memcpy_gather.bytes_per_second() : 0;
  }

  // The loader: random epochs into cpu batches for the time given (at least one batch), so
  // the figure includes each epoch's start and its short last batch when epochs are short;
  // a dataset whose epoch outlasts the time (ImageNet: 1.28M records at random) is measured
  // on the part of an epoch that fits.
  LoaderOptions options;
  options.batch_size = args.batch;
  options.sampler.kind = SamplerKind::Random;
  options.sampler.seed = args.seed;
  // The consumer gathers too (next() takes the unclaimed rows of the batch it waits for), so
  // T threads are T - 1 workers and the consumer: on two cores, 2 workers + the consumer were
  // 0.77x as fast as 1 + the consumer (Fashion-MNIST, uncompressed).
  options.num_workers = std::max(1, args.threads - 1);
  options.pin_memory = false;
  start.open_for_measurement(ds);
  Loader loader(ds, options);
  int64_t epochs = 0, batches = 0;
  int64_t batches_read_ahead = 0;
  const Clock::time_point loader_deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(args.seconds));
  Rate loader_rate = run_for(args.seconds, [&] {
    // The bytes each batch delivers: its fixed fields and its variable-length values, as
    // random get counts them (the offsets and shapes beside the values are not counted).
    int64_t samples = 0, bytes = 0;
    for (;;) {
      std::optional<Batch> batch = loader.next();
      if (!batch) {
        ++epochs;
        break;
      }
      ++batches;
      samples += batch->size();
      for (const std::string& name : batch->field_names())
        bytes += batch->is_ragged(name) ? batch->ragged(name).values.nbytes() : (*batch)[name].nbytes();
      if (Clock::now() >= loader_deadline) break;
    }
    start.mark_end();
    batches_read_ahead = loader.stats().batches_read_ahead;
    return std::pair<int64_t, int64_t>{samples, bytes};
  });
  report["loader"] = rate_json(loader_rate);
  report["loader"]["epochs"] = epochs;  // whole epochs finished
  report["loader"]["batches"] = batches;
  report["loader"]["workers"] = options.num_workers;
  start.report_reads(report["loader"]);
  report["loader"]["batches_read_ahead"] = batches_read_ahead;

  if (args.json) {
    std::cout << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  // A cold measurement also says how much it read from storage: a file smaller than what the
  // measurement reads is warm by its end.
  auto line = [&](const char* what, const Rate& r, const char* key) {
    std::string from_storage;
    if (args.cold && key && report[key].contains("storage_read_bytes") && !report[key]["storage_read_bytes"].is_null())
      from_storage = "  (" + human_bytes(report[key]["storage_read_bytes"].get<double>()) + " read from storage)";
    std::printf("  %-16s %12.0f samples/s  %10s/s%s\n", what, r.samples_per_second(),
                human_bytes(r.bytes_per_second()).c_str(), from_storage.c_str());
  };
  const std::string in_files = args.files.size() > 1 ? detail::str(" in ", args.files.size(), " files") : std::string();
  std::printf("%s: %lld records%s, codec %s, batch %lld, %d thread(s)%s\n", printable(ds.path()).c_str(),
              static_cast<long long>(ds.size()), in_files.c_str(), codec_text(ds.info()).c_str(),
              static_cast<long long>(args.batch), args.threads,
              args.cold ? ", each measurement from a cold page cache" : "");
  line("random get", random_get, "random_get");
  if (fixed_fields.empty()) {
    std::printf("  %-16s no fixed-shape field to gather (get_batch gathers those only)\n", "batch gather");
  } else {
    if (fixed_fields.size() < ds.schema().size()) {
      std::string names;
      for (const std::string& name : fixed_fields) names += (names.empty() ? "" : ", ") + printable(name);
      std::printf("  (the gathers read the fixed-shape fields only: %s)\n", names.c_str());
    }
    Rate g{report["batch_gather"]["samples"], 0, report["batch_gather"]["seconds"]};
    g.bytes = static_cast<int64_t>(report["batch_gather"]["bytes_per_second"].get<double>() * g.seconds);
    line(args.cold ? "prefetch+gather" : "batch gather", g, "batch_gather");
    Rate m{report["memcpy_gather"]["samples"], 0, report["memcpy_gather"]["seconds"]};
    m.bytes = static_cast<int64_t>(report["memcpy_gather"]["bytes_per_second"].get<double>() * m.seconds);
    line("memcpy gather", m, nullptr);
    // Cold, the gather reads storage and the memcpy memory: their ratio says how slow the
    // storage is, not what the engine adds, so it is not printed as if it did (JSON keeps it).
    if (args.cold)
      std::printf("  (the gather read from storage, the memcpy from memory: no ratio of the two is shown)\n");
    else
      std::printf("  batch gather / memcpy gather = %.2f\n", report["batch_gather_vs_memcpy"].get<double>());
  }
  line("loader", loader_rate, "loader");
  std::printf("  (loader: %lld batch(es), %lld full epoch(s) of %lld records, %d worker(s))\n",
              static_cast<long long>(batches), static_cast<long long>(epochs), static_cast<long long>(ds.size()),
              options.num_workers);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure random access, batch gather and loader throughput beside memcpy");
  cmd->add_option("FILE", args->files, kFilesHelp)->required();
  cmd->add_flag("--json", args->json, "Print one JSON object");
  add_parsed_option(cmd, "--seconds", args->seconds, "Time per measurement, at most 3600 (each runs at least one step)",
                    parse_seconds)->default_str("1");
  add_integer_option(cmd, "--batch", args->batch, "Batch size in records: at most 1048576, and at most 1 GiB of fixed fields",
                     int64_t{1}, kMaxBatchRecords);
  add_integer_option(cmd, "--threads", args->threads,
                     "Gather threads, 1 to 1024 (the loader: threads - 1 workers, at least 1, and the consumer)", 1,
                     static_cast<int>(kMaxLoaderWorkers));
  add_integer_option(cmd, "--seed", args->seed, "Seed of the random indices");
  cmd->add_flag("--cold", args->cold,
                "Start each measurement from storage: drop the files' pages from the page cache and reopen them "
                "(reports the bytes read from storage; not on a tmpfs)");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace mmt::tool
