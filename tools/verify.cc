// mmt verify FILE... [--against INPUT... | --folder DIR]: checks every structure and checksum
// (of every file, for shards read as one dataset), and optionally that the records equal the
// inputs the dataset was packed from.
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
  std::vector<std::string> files;
  std::vector<std::string> against;
  std::string folder;
  int64_t samples = 0;
  uint64_t seed = 0;
  // Which options were given: an empty value is not an absent one.
  const CLI::Option* against_option = nullptr;
  const CLI::Option* folder_option = nullptr;
  const CLI::Option* samples_option = nullptr;
  const CLI::Option* seed_option = nullptr;
};

// Refusals of the command line, before the dataset is read: a comparison asked for with an
// empty source must not pass as "no comparison asked for".
void check_options(const VerifyArgs& args) {
  if (args.folder_option->count() > 0 && args.folder.empty())
    throw UsageError("--folder is empty: name the class folder to compare the dataset with");
  for (const std::string& input : args.against)
    if (input.empty())
      throw UsageError("--against has an empty input: give NAME=PATH.npy, PATH.npz or NAME=PATH, as to mmt pack");
  const bool comparing = args.against_option->count() > 0 || args.folder_option->count() > 0;
  if (!comparing && (args.samples_option->count() > 0 || args.seed_option->count() > 0))
    throw UsageError(detail::str(args.samples_option->count() > 0 ? "--samples" : "--seed",
                                 " chooses the records to compare with the sources: it needs --against or --folder"));
}

// "a, b" for the fields the sources give; the dataset's others, not compared, after them.
std::string compared_fields(const Schema& dataset, const Schema& sources) {
  std::string compared, skipped;
  for (const Field& f : sources) compared += detail::str(compared.empty() ? "" : ", ", printable(f.name));
  for (const Field& f : dataset) {
    const bool given = std::any_of(sources.begin(), sources.end(), [&](const Field& s) { return s.name == f.name; });
    if (!given) skipped += detail::str(skipped.empty() ? "" : ", ", printable(f.name));
  }
  std::string text = detail::str(sources.size() == 1 ? "field " : "fields ", compared);
  if (!skipped.empty()) text += detail::str("; not compared, as the sources do not give them: ", skipped);
  return text;
}

// Several files checked as one dataset: when they are shards of one pack, all of them. The
// concatenation names the shards it holds under kShardMetadataKey ("0,2/3 of R") only when
// some are missing; any other value is a user's own key, and left alone.
void check_every_shard(const Dataset& ds) {
  const auto it = ds.metadata().find(std::string(kShardMetadataKey));
  const std::optional<ShardList> held = it == ds.metadata().end() ? std::nullopt : parse_shard_list(it->second);
  if (!held || static_cast<int64_t>(held->shards.size()) == held->count) return;
  std::string missing;
  int64_t listed = 0;
  for (int64_t k = 0; k < held->count && listed < 20; ++k)
    if (!std::binary_search(held->shards.begin(), held->shards.end(), k)) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      ++listed;
    }
  throw ValueError(detail::str("these files hold shards ", it->second, ": shard", listed == 1 ? " " : "s ", missing,
                               listed == 20 ? "..." : "", " missing; verify checks the dataset whole (give a ",
                               "shard's file alone to check it alone)"));
}

void run_verify(const VerifyArgs& args) {
  check_options(args);
  Dataset ds = Dataset::open_concat(args.files);
  if (args.files.size() > 1) check_every_shard(ds);  // before hashing every byte of them
  ds.verify();  // each part in turn; a fault is named with its part's path
  DatasetInfo info = ds.info();
  // Shards are counted, so that a script reading the line sees how many files were checked.
  const std::string files = args.files.size() > 1 ? detail::str(args.files.size(), " files, ") : std::string();
  std::cout << printable(ds.path()) << ": sound: " << files << info.records << " records in " << info.chunks
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
  std::cout << printable(ds.path()) << ": " << compared << (indices.empty() ? " records (all)" : " random records")
            << " equal their sources byte for byte (" << compared_fields(ds.schema(), sources.schema()) << ")\n";
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check every structure and checksum; exit 0 when sound, 1 with the chunk and fault otherwise");
  cmd->add_option("FILE", args->files, kFilesHelp)->required();
  args->against_option =
      cmd->add_option("--against", args->against,
                      "Also compare the records with these pack inputs (same syntax as mmt pack); fields are "
                      "matched by name, and a subset of the dataset's fields may be given")
          ->expected(1, -1);
  args->folder_option = cmd->add_option("--folder", args->folder, "Also compare the records with this class folder");
  args->samples_option = add_integer_option(cmd, "--samples", args->samples,
                                            "Compare this many distinct random records instead of all (0: all)",
                                            int64_t{0});
  args->seed_option = add_integer_option(cmd, "--seed", args->seed, "Seed for --samples");
  cmd->callback([args] { run_verify(*args); });
}

}  // namespace mmt::tool
