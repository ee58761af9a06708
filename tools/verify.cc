// mmt verify FILE [--against INPUT... | --folder DIR]: checks every structure and checksum,
// and optionally that the records equal the inputs the dataset was packed from.
#include <algorithm>
#include <iostream>
#include <memory>
#include <random>
#include <unordered_set>

#include "mmt_commands.h"
#include "mmtensor/dataset.h"
#include "mmtensor/packer.h"

namespace mmt::tool {
namespace {

struct VerifyArgs {
  std::string file;
  std::vector<std::string> against;
  std::string folder;
  int64_t samples = 0;
  uint64_t seed = 0;
};

void run_verify(const VerifyArgs& args) {
  Dataset ds = Dataset::open(args.file);
  ds.verify();
  DatasetInfo info = ds.info();
  std::cout << args.file << ": sound: " << info.records << " records in " << info.chunks
            << " chunks, every structure and checksum checked\n";
  if (args.against.empty() && args.folder.empty()) return;

  PackSources sources = load_pack_sources(args.against, args.folder);
  std::vector<int64_t> indices;
  if (args.samples > 0 && args.samples < ds.size()) {
    // `samples` distinct records (Floyd's sampling: O(samples) memory whatever the size), in
    // file order, which reads the file forwards.
    std::mt19937_64 rng(args.seed);
    std::unordered_set<int64_t> picked;
    for (int64_t j = ds.size() - args.samples; j < ds.size(); ++j) {
      const int64_t t = std::uniform_int_distribution<int64_t>(0, j)(rng);
      picked.insert(picked.contains(t) ? j : t);
    }
    indices.assign(picked.begin(), picked.end());
    std::sort(indices.begin(), indices.end());
  }
  int64_t compared = compare_with_sources(ds, sources, indices);
  std::cout << args.file << ": " << compared << (indices.empty() ? " records (all)" : " random records")
            << " equal their sources byte for byte\n";
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check every structure and checksum; exit 0 when sound, 1 with the chunk and fault otherwise");
  cmd->add_option("FILE", args->file, "The dataset file")->required();
  cmd->add_option("--against", args->against,
                  "Also compare the records with these pack inputs (same syntax as mmt pack)")
      ->expected(1, -1);
  cmd->add_option("--folder", args->folder, "Also compare the records with this class folder");
  add_integer_option(cmd, "--samples", args->samples, "Compare this many distinct random records instead of all (0: all)",
                     int64_t{0});
  add_integer_option(cmd, "--seed", args->seed, "Seed for --samples");
  cmd->callback([args] { run_verify(*args); });
}

}  // namespace mmt::tool
