// mmt verify FILE... [--against INPUT... | --folder DIR]: checks every structure and checksum
// (of every file, for shards read as one dataset), and optionally that the records equal the
// inputs the dataset was packed from.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>
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
  std::vector<std::string> fields;  // --field: the fields to compare, named as mmt pack names them
  int64_t samples = 0;
  uint64_t seed = 0;
  JaggedArrays jagged;  // --offsets, --shapes: ragged fields of --against arrays, as mmt pack took them
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
    throw UsageError("--folder is empty: name the folder to compare the dataset with");
  for (const std::string& input : args.against) {
    if (input.empty())
      throw UsageError("--against has an empty input: give NAME=PATH.npy, PATH.npz or NAME=PATH, as to mmt pack");
    // CLI11 gives an option that needs a value the next word whatever it is: "--against
    // --folder DIR" took "--folder" for an input and reported it missing.
    MMT_CHECK(!input.starts_with("--"), UsageError, "--against takes pack inputs, and '", input,
              "' is an option: give the inputs after --against (a file of that name: ./", input, ")",
              input == "--folder" ? "; to compare with a folder, give --folder DIR alone" : "");
  }
  for (const std::string& field : args.fields)
    MMT_CHECK(!field.starts_with("--"), UsageError, "--field takes a field's name, and '", field,
              "' is an option: give the name after --field");
  const bool comparing = args.against_option->count() > 0 || args.folder_option->count() > 0;
  if (!args.fields.empty()) {
    MMT_CHECK(args.against_option->count() > 0, UsageError,
              "--field chooses the fields compared with the inputs given to --against: it needs --against");
    // Arrays, tars, Megatron and MDS datasets give all their fields, as mmt pack packs them all.
    // Refused before the dataset is hashed; inputs of no kind the files tell (missing ones)
    // are left to the reader, which names them.
    const std::span<const std::string> against = args.against;
    MMT_CHECK(!are_array_inputs(against) && !are_tar_inputs(against) && !are_megatron_inputs(against) &&
                  !are_mds_inputs(against),
              UsageError,
              "--field chooses the fields compared with dataset, Arrow, Parquet or TFRecord inputs; arrays, tar "
              "archives, Megatron and MDS datasets give all theirs, and all are compared");
  }
  MMT_CHECK(args.jagged.empty() || args.against_option->count() > 0, UsageError,
            "--offsets and --shapes give ragged fields of the arrays given to --against: they need --against");
  if (!comparing && (args.samples_option->count() > 0 || args.seed_option->count() > 0))
    throw UsageError(detail::str(args.samples_option->count() > 0 ? "--samples" : "--seed",
                                 " chooses the records to compare with the sources: it needs --against or --folder"));
}

// "a, b" for the fields the sources give; the dataset's others, not compared, after them
// (`chosen`: --field chose the sources' fields).
std::string compared_fields(const Schema& dataset, const Schema& sources, bool chosen) {
  std::string compared, skipped, lacking;
  for (const Field& f : sources) {
    std::string& list = dataset.find(f.name) ? compared : lacking;
    list += detail::str(list.empty() ? "" : ", ", printable(f.name));
  }
  for (const Field& f : dataset) {
    const bool given = std::any_of(sources.begin(), sources.end(), [&](const Field& s) { return s.name == f.name; });
    if (!given) skipped += detail::str(skipped.empty() ? "" : ", ", printable(f.name));
  }
  const auto compared_count = std::count_if(sources.begin(), sources.end(), [&](const Field& f) {
    return dataset.find(f.name).has_value();
  });
  std::string text = detail::str(compared_count == 1 ? "field " : "fields ", compared);
  if (!skipped.empty())
    text += detail::str(chosen ? "; not compared, as --field did not choose them: "
                               : "; not compared, as the sources do not give them: ",
                        skipped);
  if (!lacking.empty()) text += detail::str("; not compared, as the dataset does not hold them: ", lacking);
  return text;
}

// Several files checked as one dataset: of each pack they hold shards of (kShardMetadataKey,
// kShardSourceMetadataKey), all of them, and each as often (a pack given twice, whole, is
// two copies of a dataset; Dataset::concat has checked their order). A pack missing shards
// beside one of the same N from other sources is what shards cut from sources that changed
// between pack runs look like, and is named so.
void check_every_shard(const Dataset& ds) {
  struct Pack {
    PackedShard first;                 // the pack's N, R and sources
    std::map<int64_t, int64_t> times;  // shard -> how many files hold it
  };
  std::vector<Pack> packs;
  for (const Dataset& part : ds.parts()) {
    const std::optional<PackedShard> shard = packed_shard(part.metadata());
    if (!shard) continue;
    auto pack = std::find_if(packs.begin(), packs.end(), [&](const Pack& p) { return p.first.same_pack(*shard); });
    if (pack == packs.end()) pack = packs.insert(packs.end(), Pack{*shard, {}});
    ++pack->times[shard->index];
  }
  for (const Pack& pack : packs) {
    int64_t most = 0;
    for (const auto& [k, n] : pack.times) most = std::max(most, n);
    std::string held, missing;
    for (const auto& [k, n] : pack.times) held += detail::str(held.empty() ? "" : ",", k);
    // The first 20 shards held fewer times than the most: a walk of at most the files given
    // plus 20 steps, whatever N the (untrusted) metadata says.
    int64_t listed = 0;
    for (int64_t k = 0; k < pack.first.count && listed < 20; ++k) {
      const auto it = pack.times.find(k);
      const int64_t n = it == pack.times.end() ? 0 : it->second;
      if (n < most) missing += detail::str(listed++ == 0 ? "" : ", ", k);
    }
    if (listed == 0) continue;
    // What shards cut from inputs that changed between the runs look like: the packs of this N
    // hold each shard once between them (a rank's shards of several corpora repeat numbers).
    std::map<int64_t, int64_t> across;
    int64_t packs_of_n = 0;
    for (const Pack& p : packs) {
      if (p.first.count != pack.first.count) continue;
      ++packs_of_n;
      for (const auto& [k, n] : p.times) across[k] += n;
    }
    const bool other_sources = packs_of_n > 1 && static_cast<int64_t>(across.size()) == pack.first.count &&
                               std::all_of(across.begin(), across.end(), [](const auto& kn) { return kn.second == 1; });
    throw ValueError(detail::str(
        "these files hold shards ", held, "/", pack.first.count, " of ", pack.first.records, " records",
        pack.first.source.empty() ? "" : detail::str(" (", kShardSourceMetadataKey, " ", pack.first.source, ")"),
        ": shard",
        listed == 1 ? " " : "s ", missing, listed == 20 ? "..." : "",
        " missing", most > 1 ? detail::str(" (from one of ", most, " packs cut from inputs alike)") : std::string(),
        other_sources ? "; the other files hold the other shards of as many, cut from other inputs: were the "
                        "inputs changed between pack runs (or some shards packed by another version of "
                        "mmtensor, whose pack_source differs)? pack every shard from the same inputs, with "
                        "one version"
                      : "",
        "; verify checks the dataset whole (give a shard's file alone to check it alone)"));
  }
}

// The fields to ask of the --against inputs. --field: the user's choice, named as mmt pack
// takes it (a TFRecord feature or feature list by kind, "feature:KEY" or "feature_list:KEY",
// which a dataset packed before its metadata recorded the kinds needs). Otherwise datasets:
// the fields both hold (a repack may have kept some of them; the sources may give some of
// the dataset's, as arrays may). Arrow, Parquet and TFRecord files: the columns (features)
// the dataset holds (a pack may have chosen some); features by the keys the pack recorded, as
// a SequenceExample's context and feature lists may share one. Other inputs: none, as they
// give all their fields.
std::vector<std::string> fields_to_compare(const VerifyArgs& args, const Dataset& ds) {
  if (!args.fields.empty()) return args.fields;
  std::vector<std::string> fields;
  if (are_dataset_inputs(args.against)) {
    const Schema against = Dataset::open_concat(args.against).schema();
    for (const Field& f : ds.schema())
      if (against.find(f.name)) fields.push_back(f.name);
    MMT_CHECK(!fields.empty(), ValueError, "the datasets given to --against share no field with ", printable(ds.path()));
  } else if (are_arrow_inputs(args.against)) {  // first, as the packer tells the kinds
    for (const Field& f : ds.schema()) fields.push_back(f.name);
  } else if (are_tfrecord_inputs(args.against)) {
    fields = PackSources::tfrecord_fields_of(ds.schema(), ds.metadata(), ds.path());
  }
  return fields;
}

// Whether every field `sources` give that `ds` lacks is an Arrow or Parquet column's null
// mask: a dataset packed before every column with nulls had one, or a repack that left it
// out, holds the column without it.
bool lacks_only_masks(const Dataset& ds, const PackSources& sources) {
  return std::all_of(sources.schema().begin(), sources.schema().end(),
                     [&](const Field& f) { return ds.schema().find(f.name) || sources.is_null_mask(f.name); });
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

  // A folder packed with --paths holds field "path", tars packed with --keys "__key__":
  // compared too, with no option to repeat.
  const std::vector<std::string> fields = fields_to_compare(args, ds);
  // Tars are grouped as the pack grouped them: keys when it stored them, and the fields and
  // missing members its metadata records.
  TarOptions tar;
  if (are_tar_inputs(args.against)) {
    if (std::optional<TarOptions> recorded = tar_options_of(ds.metadata(), ds.path())) tar = std::move(*recorded);
    tar.keys = ds.schema().find("__key__").has_value();
  }
  PackSources sources =
      load_pack_sources(args.against, args.folder, ds.schema().find("path").has_value(), fields, tar, args.jagged);
  // Token windows (pack --window): the inputs cut as the pack cut them, by the dataset's record
  // of it; not datasets that are those windows already (the shards merged, or a repack).
  const std::optional<PackSources::RecordedWindows> windows = PackSources::windows_of(ds.metadata(), ds.path());
  if (windows && !PackSources::windows_of(sources.metadata(), "the inputs")) {
    sources = PackSources::token_windows(std::move(sources), windows->options);
    // The stream must be the one the windows were cut from, not only as long as their count
    // needs (a longer input would pass, its tail dropped).
    const int64_t given = PackSources::windows_of(sources.metadata(), "the inputs")->stream_tokens;
    MMT_CHECK(given == windows->stream_tokens, FormatError, printable(ds.path()), ": its windows were cut from a stream of ",
              windows->stream_tokens, " tokens (metadata key ", kTokenWindowsMetadataKey, "), but these inputs make ", given);
  }
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
  // A folder gives its fields whatever the pack kept (a repack may have left "label" out), and
  // Arrow and Parquet files masks the dataset may not hold: those the dataset holds are compared.
  const SourceFields which =
      !args.folder.empty() || lacks_only_masks(ds, sources) ? SourceFields::Shared : SourceFields::AllGiven;
  int64_t compared = compare_with_sources(ds, sources, indices, which);
  std::cout << printable(ds.path()) << ": " << compared << (indices.empty() ? " records (all)" : " random records")
            << " equal their sources byte for byte (" << compared_fields(ds.schema(), sources.schema(), !args.fields.empty()) << ")\n";
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
  // One name per --field: a repeated option must not take the files that follow it.
  cmd->add_option("--field", args->fields,
                  "With --against datasets, Arrow, Parquet or TFRecord files: compare only this field, named as "
                  "mmt pack --field names it (repeat for more; by default, every field both hold)")
      ->type_name("NAME")
      ->allow_extra_args(false);
  add_jagged_options(cmd, args->jagged);
  args->folder_option = cmd->add_option("--folder", args->folder, "Also compare the records with this folder (of class folders, or of files)");
  args->samples_option = add_integer_option(cmd, "--samples", args->samples,
                                            "Compare this many distinct random records instead of all (0: all)",
                                            int64_t{0});
  args->seed_option = add_integer_option(cmd, "--seed", args->seed, "Seed for --samples");
  cmd->callback([args] { run_verify(*args); });
}

}  // namespace mmt::tool
