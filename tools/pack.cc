// mmt pack OUTPUT INPUT... : builds a dataset from .npy, .npz, IDX files, a folder, or datasets (a repack).
#include <algorithm>
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

#include "format.h"
#include "interrupt.h"
#include "mmt_commands.h"
#include "mmtensor/codec.h"
#include "mmtensor/packer.h"
#include "output_file.h"
#include "progress.h"

namespace mmt::tool {
namespace {

struct PackArgs {
  std::string output;
  std::vector<std::string> inputs;
  std::string folder;
  CodecSpec codec;
  int64_t chunk_bytes = int64_t{1} << 20;
  int64_t align = 4096;
  int threads = 0;
  bool force = false;
  bool quiet = false;
  bool paths = false;  // --paths: a folder's file paths as field "path"
  bool keys = false;   // --keys: tar samples' keys as field "__key__"
  std::vector<std::string> extensions;  // --ext: a tar sample's fields (alternatives joined by ';')
  std::string missing;                  // --missing: error, skip or empty
  std::optional<WindowOptions> window;  // --window LENGTH[:STRIDE] (and --separator)
  std::optional<int64_t> separator;
  std::vector<std::string> fields;  // --field: the fields of dataset inputs kept
  std::pair<int64_t, int64_t> shard{0, 1};  // --shard K/N: share K of N
  JaggedArrays jagged;  // --offsets, --shapes: ragged fields of arrays
  const CLI::Option* folder_option = nullptr;  // given, even empty
};

// "K/N": share K (from 0) of N. At most a million shards: more is a typo, not a plan.
std::pair<int64_t, int64_t> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  MMT_CHECK(slash != std::string::npos, ValueError, "--shard takes K/N (share K of N, K from 0), got '", text, "'");
  constexpr int64_t kMaxShards = 1'000'000;
  const int64_t shards = parse_int64(text.substr(slash + 1), "--shard's N", 1, kMaxShards);
  const int64_t shard = parse_int64(text.substr(0, slash), "--shard's K", 0, shards - 1);
  return {shard, shards};
}

// "LENGTH" or "LENGTH:STRIDE", in tokens.
WindowOptions parse_window(const std::string& text) {
  const size_t colon = text.find(':');
  WindowOptions window;
  window.length = parse_int64(text.substr(0, colon), "--window's LENGTH", 1);
  if (colon != std::string::npos) window.stride = parse_int64(text.substr(colon + 1), "--window's STRIDE", 1);
  return window;
}

// The writer's own rules, checked as the command line is parsed, so a refusal is a usage
// error that names the flag the user typed (the writer would name WriterOptions fields), and
// comes before any input is loaded.
int64_t parse_chunk_bytes(const std::string& text) {
  const int64_t bytes = parse_byte_size(text, "--chunk-bytes");
  MMT_CHECK(bytes > 0, ValueError, "--chunk-bytes must be > 0, got ", text);
  return bytes;
}

int64_t parse_alignment(const std::string& text) {
  const int64_t bytes = parse_byte_size(text, "--align");
  MMT_CHECK(bytes >= format::kMinAlignment && bytes <= format::kMaxAlignment &&
                std::has_single_bit(static_cast<uint64_t>(bytes)),
            ValueError, "--align must be a power of two from ", format::kMinAlignment, " to ",
            format::kMaxAlignment >> 20, "M (", format::kMaxAlignment, "), got ", text);
  return bytes;
}

CodecSpec parse_codec(const std::string& text) {
  try {
    return CodecSpec::parse(text);
  } catch (const ValueError& e) {
    throw ValueError(detail::str("--codec: ", e.what()));
  }
}

WriterOptions writer_options(const PackArgs& args) {
  WriterOptions options;
  options.codec = args.codec;
  options.chunk_bytes = args.chunk_bytes;
  options.alignment = args.align;
  options.threads = args.threads;
  options.overwrite = args.force;
  return options;
}

// Shards of one pack merged with some missing make a dataset of its own (its file claims no
// shard), so no later check can tell that it lacks records: said once, here, while the
// command line still shows what was given. Merging a subset on purpose is allowed.
void warn_of_missing_shards(const std::vector<std::string>& inputs) {
  if (inputs.empty() || !are_dataset_inputs(inputs)) return;
  const Dataset merged = Dataset::open_concat(inputs);
  const auto it = merged.metadata().find(std::string(kShardMetadataKey));
  if (it == merged.metadata().end()) return;
  const std::optional<ShardList> list = parse_shard_list(it->second);
  // One shard keeps its keys (it is still that shard of the pack); several but not all lose them.
  if (!list || list->shards.size() < 2 || static_cast<int64_t>(list->shards.size()) >= list->count) return;
  std::string missing;
  for (int64_t k = 0, listed = 0; k < list->count && listed < 10; ++k) {
    if (std::binary_search(list->shards.begin(), list->shards.end(), k)) continue;
    missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    ++listed;
  }
  const int64_t absent = list->count - static_cast<int64_t>(list->shards.size());
  std::cerr << "mmt pack: warning: the inputs are " << list->shards.size() << " of the " << list->count
            << " shards of one pack; shard" << (absent > 1 ? "s " : " ") << missing << (absent > 10 ? ", ..." : "")
            << " missing. The output is a dataset of its own, of those shards' records only, and says nothing "
            << "of the others\n";
}

void run_pack(const PackArgs& args) {
  // The writer would refuse it too, but only after the inputs were loaded, and in its words.
  // Command-line mistakes exit 2 (UsageError), as CLI11's own do.
  MMT_CHECK(!args.output.empty(), UsageError, "OUTPUT is empty: name the dataset file to create (e.g. train.mmt)");
  if (args.folder_option->count() > 0 && args.folder.empty())
    throw UsageError("--folder is empty: name the folder to pack");
  WriterOptions options = writer_options(args);
  // Checked before loading anything, so a long import is not wasted on a refusal; the
  // writer checks again when it publishes (the file may appear meanwhile).
  check_output_path(args.output, args.force);

  CodecSpec codec = options.codec;
  MMT_CHECK(!args.paths || !args.folder.empty(), UsageError, "--paths stores the path of each file of a --folder; give --folder");
  TarOptions tar{.keys = args.keys, .extensions = args.extensions};
  if (!args.missing.empty()) {
    const std::optional<MissingMember> missing = missing_member_from_string(args.missing);
    MMT_CHECK(missing.has_value(), UsageError, "--missing takes error, skip or empty, got '", args.missing, "'");
    tar.missing = *missing;
  }
  MMT_CHECK(!args.separator || args.window, UsageError, "--separator goes between the documents of --window's stream; give --window");
  // Reading the inputs writes nothing at the output (what it decodes goes to unlinked scratch
  // files), so a Ctrl-C there ends the command at once, with a word.
  std::optional<QuitSignals> quit_signals(
      std::in_place, detail::str("mmt pack: interrupted while reading its inputs: ",
                                 printable_message(not_written({args.output})), "\n"));
  PackSources sources = load_pack_sources(args.inputs, args.folder, args.paths, args.fields, tar, args.jagged);
  warn_of_missing_shards(args.inputs);
  if (args.window) {
    WindowOptions window = *args.window;
    window.separator = args.separator;
    sources = PackSources::token_windows(std::move(sources), window);
  }
  const auto [shard, shards] = args.shard;
  const RecordRange range = shard_records(sources.records(), shard, shards);
  // A shard's share of the bytes, for the progress bar: exact for arrays, near for a folder.
  const auto share_bytes = static_cast<int64_t>(
      sources.records() > 0 ? static_cast<__int128>(sources.total_bytes()) * range.size() / sources.records() : 0);
  ProgressBar bar("packing", range.size(), share_bytes);
  PackOptions pack_options;
  pack_options.writer = std::move(options);
  pack_options.shard = shard;
  pack_options.shards = shards;
  pack_options.cancel = &StopSignals::flag();
  if (bar.enabled())
    pack_options.on_progress = [&](const WriteStats& s) { bar.update(s.records, s.bytes_in); };

  WriteStats stats;
  {
    quit_signals.reset();  // from here the pack writes: a signal asks it to stop and clean up
    StopSignals stop_signals;
    try {
      stats = pack_dataset(args.output, sources, std::move(pack_options));
    } catch (const PackCancelled& e) {
      bar.finish();
      exit_interrupted("mmt pack", StopSignals::signal_number(), e.what());
    } catch (const Error& e) {
      bar.finish();
      std::cerr << "mmt pack: error: " << printable_message(e.what()) << "\n";
      const auto* io_error = dynamic_cast<const IoError*>(&e);
      std::error_code ec;
      if (io_error && io_error->errno_value() == EEXIST && !args.force)
        // The path was free when checked above; the rename (or the writer's create) refused
        // what appeared there since: another pack to the same path won the race.
        std::cerr << "mmt pack: another process created " << printable(args.output)
                  << " meanwhile; it was kept, and this run's dataset was not written\n";
      else
        std::cerr << "mmt pack: " << printable(args.output)
                  << (std::filesystem::exists(std::filesystem::symlink_status(args.output, ec))
                          ? " was left as it was\n"
                          : " was not created\n");
      throw ExitStatus{kExitError};
    }
  }
  bar.finish();
  // From here on the dataset stands: a summary that cannot be printed says so.
  note_published(detail::str(args.output, " was written and is complete"));
  if (args.quiet) return;
  std::signal(SIGPIPE, SIG_IGN);  // `mmt pack ... | head -0`: EPIPE, reported with that note, not a silent death
  // Values over the whole file (its headers and alignment too): what packing cost on disk.
  // `mmt info`'s ratio is the codec's alone (chunks decoded over chunks stored).
  double ratio = stats.bytes_out > 0 ? static_cast<double>(stats.bytes_in) / stats.bytes_out : 0;
  double rate = stats.seconds > 0 ? stats.bytes_in / stats.seconds : 0;
  char ratio_text[32];
  std::snprintf(ratio_text, sizeof ratio_text, "%.2fx", ratio);
  std::cout << "packed " << stats.records << " records (" << sources.schema().size()
            << " fields) into " << printable(args.output) << " in " << human_seconds(stats.seconds) << "\n"
            << "  bytes in " << human_bytes(stats.bytes_in) << " (values), bytes out "
            << human_bytes(stats.bytes_out) << " (the file), in/out " << ratio_text << ", "
            << human_bytes(rate) << "/s, " << stats.chunks << " chunks, codec "
            << codec.str() << "\n";
  if (shards > 1)
    std::cout << "  shard " << shard << " of " << shards << " (numbered from 0): records [" << range.begin << ", "
              << range.end << ") of the inputs' " << sources.records()
              << "; the shards read as one dataset in that order (mmt info SHARD...)\n";
  if (sources.hidden_skipped() > 0) {
    const char* plural = sources.hidden_skipped() == 1 ? "" : "s";
    if (!args.folder.empty())
      std::cout << "  skipped " << sources.hidden_skipped() << " hidden file" << plural << " or folder" << plural
                << " (names starting with '.') under " << printable(args.folder) << "\n";
    else
      std::cout << "  skipped " << sources.hidden_skipped() << " tar member" << plural
                << " of no sample (no '.' in the file name, or a leading one)\n";
  }
  if (sources.samples_skipped() > 0)
    std::cout << "  skipped " << sources.samples_skipped() << " sample" << (sources.samples_skipped() == 1 ? "" : "s")
              << " lacking a field's member (--missing skip)\n";
}

}  // namespace

PackSources load_pack_sources(const std::vector<std::string>& inputs, const std::string& folder, bool folder_paths,
                              const std::vector<std::string>& fields, const TarOptions& tar, const JaggedArrays& jagged) {
  const bool tar_keys = tar.keys;
  const bool tar_grouping = !tar.extensions.empty() || tar.missing != MissingMember::Error;
  if (!folder.empty()) {
    MMT_CHECK(jagged.empty(), UsageError, "--offsets and --shapes give ragged fields of array inputs, not of a folder");
    MMT_CHECK(!tar_grouping, UsageError, "--ext and --missing choose the fields of tar archives' samples, not of a folder");
    MMT_CHECK(!tar_keys, UsageError, "--keys stores the key of each sample of tar archives; a folder has --paths");
    MMT_CHECK(inputs.empty(), UsageError,
              "--folder makes one record per file; it cannot be combined with array inputs");
    MMT_CHECK(fields.empty(), UsageError, "--field chooses fields of dataset inputs, not of a folder");
    return PackSources::from_folder(folder, {.paths = folder_paths});
  }
  MMT_CHECK(!inputs.empty(), UsageError,
            "no inputs: give NAME=PATH.npy, PATH.npz, NAME=PATH (IDX, .gz or not), HDF5 files (PATH.h5, NAME=PATH.h5:DATASET), raw files (NAME=PATH:DTYPE), datasets, tar archives, Megatron or MDS datasets, Arrow, Parquet or TFRecord files or --folder DIR");
  try {
    return PackSources::from_inputs(inputs, fields, tar, jagged);
  } catch (const InputSpecError& e) {
    if (tar_keys) throw UsageError("--keys stores the key of each sample of tar archives; these inputs are not tar archives");
    if (tar_grouping) throw UsageError("--ext and --missing choose the fields of tar archives' samples; these inputs are not tar archives");
    if (!fields.empty()) throw UsageError("--field chooses fields of dataset inputs; of arrays, tar archives, Megatron or MDS datasets, all are packed");
    throw;
  }
}

void add_jagged_options(CLI::App* cmd, JaggedArrays& jagged) {
  // NAME=PATH, NAME given once an option.
  const auto parse_into = [](std::map<std::string, std::string, std::less<>>& into, const std::string& option) {
    return [&into, option](const std::vector<std::string>& texts) {
      for (const std::string& text : texts) {
        const size_t eq = text.find('=');
        MMT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < text.size(), UsageError, option,
                  " takes NAME=PATH.npy (the field NAME of an array input), got '", printable(text), "'");
        MMT_CHECK(into.emplace(text.substr(0, eq), text.substr(eq + 1)).second, UsageError, option, " names field '",
                  printable(text.substr(0, eq)), "' twice");
      }
    };
  };
  cmd->add_option_function<std::vector<std::string>>(
         "--offsets", parse_into(jagged.offsets, "--offsets"),
         "With array inputs: field NAME is ragged, its input's rows the records' values back to back, PATH.npy "
         "(records + 1 integers from 0, as mmt export writes NAME.offsets.npy) where each record starts")
      ->type_name("NAME=PATH")
      ->allow_extra_args(false);
  cmd->add_option_function<std::vector<std::string>>(
         "--shapes", parse_into(jagged.shapes, "--shapes"),
         "With --offsets NAME: PATH.npy holds each record's shape (integers [records, ndim]) for records that vary "
         "after their first dimension, their values 1-D (as mmt export writes NAME.shapes.npy)")
      ->type_name("NAME=PATH")
      ->allow_extra_args(false);
}

void add_pack_command(CLI::App& app) {
  auto args = std::make_shared<PackArgs>();
  CLI::App* cmd = app.add_subcommand("pack", "Build a dataset from .npy, .npz, IDX, HDF5 or raw files, tar archives (WebDataset), Megatron indexed datasets, MosaicML Streaming datasets, Arrow or Parquet files (Hugging Face datasets), TFRecord files or a folder, or repack datasets");
  cmd->footer(
      "Inputs:\n"
      "  NAME=PATH.npy   one field; the first dimension indexes records\n"
      "  PATH.npz        one field per array in the archive\n"
      "  NAME=PATH       an IDX file, gzip-compressed or not (MNIST's *-idx3-ubyte.gz)\n"
      "  PATH.h5         HDF5: every dataset at the file's root a field, named by it\n"
      "  NAME=PATH.h5:DATASET  one HDF5 dataset (train/images in a group); integers,\n"
      "                  floats, h5py's bools and complex; chunked and gzip/szip ones are\n"
      "                  decoded into a temporary file in $TMPDIR (or /tmp)\n"
      "  NAME=PATH:DTYPE[:D1xD2...]  a raw file of values with no header (nanoGPT's\n"
      "                  train.bin: tokens=train.bin:uint16), records of one value or that shape\n"
      "  NAME=VALUES --offsets NAME=OFFSETS.npy [--shapes NAME=SHAPES.npy]  a ragged field\n"
      "                  in PyTorch's jagged layout (what mmt export writes): record i is\n"
      "                  VALUES[OFFSETS[i]:OFFSETS[i+1]] (documents of a token array); with\n"
      "                  SHAPES ([records, ndim]) the values are 1-D, each record reshaped\n"
      "  PATH.mmt...     mmtensor datasets (all inputs), read as one and repacked: another\n"
      "                  codec, chunk size or alignment, shards merged into one file;\n"
      "                  --field NAME (repeated) keeps only those fields\n"
      "  PATH.tar...     WebDataset shards (all inputs): one record per sample (members\n"
      "                  with one key, KEY.EXT), one field per extension holding the\n"
      "                  member's bytes; .cls as int64. --keys adds each sample's key\n"
      "                  ('__key__'); --ext 'jpg;png' --ext cls chooses the fields (the first\n"
      "                  alternative a sample has), --missing skip|empty what a sample\n"
      "                  lacking one gives. gzip and zstd archives (.tar.gz, .tar.zst) are\n"
      "                  decompressed first into a temporary file in $TMPDIR (or /tmp)\n"
      "  [NAME=]PREFIX...  Megatron-LM indexed datasets (all inputs; PREFIX, PREFIX.idx or\n"
      "                  PREFIX.bin): one record per document, its tokens in field NAME\n"
      "                  ('tokens' by default), the index's dtype\n"
      "  DIR...          MosaicML Streaming (MDS) datasets (all inputs; a folder holding\n"
      "                  index.json, or that file): one record per sample, one field per\n"
      "                  column; zstd and gz shards are decompressed into $TMPDIR\n"
      "  PATH.arrow...   Apache Arrow IPC files or streams (all inputs; .arrow, .arrows,\n"
      "                  .feather, .ipc), or a folder Hugging Face datasets' save_to_disk\n"
      "                  wrote: one record per row, one field per column (structs\n"
      "                  flattened: image.bytes); numbers, bools, byte strings and lists\n"
      "                  of numbers (N-d arrays); a list of strings as NAME (joined) and\n"
      "                  NAME.lengths; a list of structs (messages: list<struct<role,\n"
      "                  content>>) as a field a column, each a list of its values\n"
      "                  (messages.role, messages.role.lengths, messages.content...);\n"
      "                  a map as NAME.key and NAME.value.\n"
      "                  --field NAME (repeated) keeps only those columns (a struct's\n"
      "                  name: all its columns; leaving out a type no field holds)\n"
      "  PATH.parquet... Parquet files (all inputs; .parquet, .pq), or a folder of them\n"
      "                  (a Hugging Face Hub split, in name order): packed as Arrow\n"
      "                  columns are; the columns chosen are decoded a row group at a\n"
      "                  time into a temporary file in $TMPDIR (or /tmp)\n"
      "  PATH.tfrecord... TensorFlow TFRecord files of tf.train.Example records (all\n"
      "                  inputs; .tfrecord, .tfrecords, TFDS' NAME.tfrecord-00000-of-00008,\n"
      "                  gzip- or zlib-compressed or not): one record per Example, one\n"
      "                  field per feature ('/' in a key is '.': image.encoded);\n"
      "                  int64_list and float_list as int64 and float32 (a scalar, [n]\n"
      "                  or ragged, as the records hold one, n or varying values);\n"
      "                  bytes_list as bytes, or NAME (joined) and NAME.lengths where\n"
      "                  records hold other than one. A SequenceExample's feature\n"
      "                  lists are fields of the record's steps: [steps, n] numbers,\n"
      "                  uint8 [steps, W] for byte strings of W bytes, else NAME and\n"
      "                  NAME.lengths (each step's).\n"
      "                  --field NAME (repeated) keeps only those features (by field\n"
      "                  name or key; feature:KEY or feature_list:KEY where a\n"
      "                  SequenceExample's context and feature lists share KEY)\n"
      "  --window L[:S]  with one field of tokens (a 1-D array, Megatron documents, or\n"
      "                  --field of datasets holding documents): records of L tokens starting every S (default\n"
      "                  L) over the field's values as one stream; --separator T puts\n"
      "                  token T after each document (an end-of-text token)\n"
      "  --folder DIR    one record per file: its bytes ('data') and the index of its\n"
      "                  class subfolder ('label'); class names go to the metadata.\n"
      "                  A folder of files alone (no subfolders) gives 'data' only.\n"
      "                  --paths adds each file's path under DIR ('path', bytes).\n"
      "                  Hidden files and folders (names starting with '.', such as\n"
      "                  .DS_Store) are skipped; the summary says how many\n"
      "Arrays are read where they lie or converted a batch of records at a time; a\n"
      "gzipped IDX file, or one of multi-byte values, is read into memory whole. A\n"
      "Fortran-order array that is compressed, big-endian or unaligned is converted once\n"
      "into a temporary file in $TMPDIR (or /tmp): it needs that much free space there.\n"
      "Compressed tars and MDS shards are kept decompressed there within MMT_SCRATCH_BYTES\n"
      "(such as 20G; half its free space by default); those past it are decompressed\n"
      "again when packed.\n"
      "--shard K/N packs one share of the records, so N processes (or machines) pack a\n"
      "large dataset in parallel; every shard keeps the whole schema and metadata, and\n"
      "the N files read as one dataset, in order (mmt info part-*.mmt). Name them so that\n"
      "they sort in that order (part-00.mmt ... part-15.mmt, not part-0 ... part-15).\n"
      "Example:\n"
      "  mmt pack train.mmt images=train-images-idx3-ubyte.gz labels=train-labels-idx1-ubyte.gz --codec lz4\n"
      "  mmt pack train-zstd.mmt part-*.mmt --codec zstd:9\n"
      "  mmt pack laion.mmt shard-{0000..0099}.tar --keys\n"
      "  mmt pack cifar10.mmt ~/cifar10/train --field img.bytes --field label   # save_to_disk's folder\n"
      "  mmt pack imagenet.mmt train-*.tfrecord --field image/encoded --field image/class/label\n"
      "  mmt pack gpt.mmt tokens=train.npy --window 2049:2048   # inputs and shifted targets\n"
      "  mmt pack pile.mmt pile_text_document --window 2049:2048 --separator 0\n"
      "  for k in 00 01 02 03; do mmt pack part-$k.mmt --folder photos/ --shard $k/4 & done; wait");
  cmd->add_option("OUTPUT", args->output, "The dataset file to create")->required();
  cmd->add_option("INPUT", args->inputs, "Inputs (see below)");
  args->folder_option =
      cmd->add_option("--folder", args->folder, "A folder of class subfolders (or of files alone) to pack instead of arrays");
  cmd->add_option("--field", args->fields, "With dataset, Arrow, Parquet or TFRecord inputs: keep this field (repeat for more; all if none)")
      ->type_name("NAME")
      ->allow_extra_args(false);
  cmd->add_flag("--paths", args->paths, "With --folder: store each file's path under the folder as field 'path'");
  add_jagged_options(cmd, args->jagged);
  cmd->add_flag("--keys", args->keys, "With tar archives: store each sample's key as field '__key__'");
  cmd->add_option("--ext", args->extensions,
                  "With tar archives: a field, by extension or alternatives joined by ';' (jpg;png), repeated; "
                  "other members are passed over")
      ->type_name("EXT[;EXT...]")
      ->allow_extra_args(false);
  cmd->add_option("--missing", args->missing,
                  "With tar archives: what a sample lacking a field gives: error (default), skip (the sample is "
                  "left out) or empty (0 bytes)")
      ->type_name("error|skip|empty");
  add_parsed_option(cmd, "--window", args->window, "Records of LENGTH tokens every STRIDE over one field's values",
                    [](const std::string& text) { return std::optional<WindowOptions>(parse_window(text)); })
      ->type_name("LENGTH[:STRIDE]");
  add_parsed_option(cmd, "--separator", args->separator, "With --window: a token after each document",
                    [](const std::string& text) { return std::optional<int64_t>(parse_int64(text, "--separator")); })
      ->type_name("TOKEN");
  add_parsed_option(cmd, "--codec", args->codec, "none, lz4[:LEVEL] or zstd[:LEVEL]", parse_codec)->default_str("none");
  add_parsed_option(cmd, "--chunk-bytes", args->chunk_bytes, "Target decoded bytes per chunk (e.g. 1M)",
                    parse_chunk_bytes)->default_str("1M");
  add_parsed_option(cmd, "--align", args->align, "Chunk alignment in the file, a power of two from 64 to 16M",
                    parse_alignment)->default_str("4096");
  // The cap keeps a typo such as --threads 100000 from asking for that many threads.
  add_integer_option(cmd, "--threads", args->threads, "Compression threads, 0 to 1024 (0: one per CPU this process may use)", 0,
                     static_cast<int>(kMaxWriterThreads));
  add_parsed_option(cmd, "--shard", args->shard,
                    "Pack only share K of N (K from 0): records K*R/N up to (K+1)*R/N of the R inputs",
                    parse_shard)->type_name("K/N");
  cmd->add_flag("--force", args->force, "Replace OUTPUT if it exists");
  cmd->add_flag("--quiet", args->quiet, "Print no summary");
  cmd->callback([args] { run_pack(*args); });
}

}  // namespace mmt::tool
