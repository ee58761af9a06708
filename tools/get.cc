// mmt get FILE... INDEX [--field NAME] [--npy OUT.npy | --raw OUT]: one record (numbered
// across the files, for shards read as one dataset), printed as PyTorch prints tensors, or one
// field written to a file or, with "-", to standard output.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "interrupt.h"
#include "mmt_commands.h"
#include "mmtensor/dataset.h"
#include "output_file.h"

namespace mmt::tool {
namespace {

struct GetArgs {
  std::vector<std::string> files;
  std::string index;  // parsed strictly by parse_int64: CLI11 takes '' as 0 and clamps
  std::string field;
  std::string npy;
  std::string raw;
  bool force = false;
  const CLI::Option* field_option = nullptr;  // given, even empty
};

void write_raw(const std::string& path, const Tensor& t, bool force, const detail::WriteCheckpoint& checkpoint) {
  const Tensor c = t.contiguous();
  std::span<const std::byte> bytes;
  if (c.nbytes() > 0)
    bytes = {static_cast<const std::byte*>(c.data_ptr()), static_cast<size_t>(c.nbytes())};
  write_output_file(path, bytes, force, checkpoint);
}

// What an interrupted get left at its outputs: files not written (as they were), and part of
// the field, or none of it, on standard output.
std::string not_written_outputs(const std::vector<std::string>& pending) {
  std::vector<std::string> files;
  for (const std::string& output : pending)
    if (!is_standard_output(output)) files.push_back(output);
  std::string text = files.empty() ? std::string() : not_written(files);
  if (files.size() < pending.size())
    text.append(text.empty() ? "" : "; ").append("the field was not written whole to standard output");
  return text;
}

// With "-", the field goes to standard output, and nothing else does: get prints no text then
// (errors go to stderr), so the stream holds the values alone.
void check_standard_output_target(const GetArgs& args) {
  if (is_standard_output(args.npy) && is_standard_output(args.raw))
    throw UsageError("--npy - and --raw - would mix both into one stream; send one of them to a file");
  const char* option = is_standard_output(args.npy) ? "--npy" : is_standard_output(args.raw) ? "--raw" : nullptr;
  // As gzip and zstd do: binary bytes on a terminal are garbage at best, and escape sequences
  // at worst.
  MMT_CHECK(option == nullptr || args.force || ::isatty(STDOUT_FILENO) == 0, ValueError,
            "standard output is a terminal, and ", option, " - writes binary bytes there: redirect it (> FILE) or ",
            "pipe it (| PROGRAM), or pass --force to write them to the terminal anyway");
}

bool is_integer(const std::string& text) {
  try {
    (void)parse_int64(text, "");
    return true;
  } catch (const ValueError&) {
    return false;
  }
}

void run_get(const GetArgs& args) {
  int64_t index = 0;
  try {
    index = parse_int64(args.index, "INDEX");
  } catch (const ValueError& e) {
    throw UsageError(e.what());  // a bad command line, as a bad option value is
  }
  // Only the last word is INDEX: `mmt get x.mmt 3 4`, asking for two records, would read 3 as
  // a shard and fail to open it, which would not say why.
  for (const std::string& file : args.files) {
    std::error_code unknown;
    if (!std::filesystem::exists(file, unknown) && is_integer(file))
      throw UsageError(detail::str("'", printable(file), "' is taken for a dataset file, and there is none of that "
                                   "name: get reads one record, whose INDEX comes last, after the file or files"));
  }
  // An empty name would read as "no --field" and print every field.
  if (args.field_option->count() > 0 && args.field.empty())
    throw UsageError("--field is empty: name the field to print or write");
  check_standard_output_target(args);
  for (const std::string* output : {&args.npy, &args.raw})
    if (!output->empty() && !is_standard_output(*output)) check_output_path(*output, args.force, args.files);
  // A lookup from the command line is one record: hashing its chunk costs one chunk read, and
  // a damaged value is then an error naming the chunk rather than printed or written as good.
  ReaderOptions options;
  options.verify_uncompressed = true;
  Dataset ds = Dataset::open_concat(args.files, options);
  if (!args.npy.empty() || !args.raw.empty()) {
    std::string field = args.field;
    if (field.empty()) {
      MMT_CHECK(ds.schema().size() == 1, UsageError, "--npy and --raw write one field: name it with ",
                "--field (", ds.schema().size(), " fields here)");
      field = ds.schema()[0].name;
    }
    std::vector<std::string> pending;  // the outputs not written yet
    for (const std::string* output : {&args.npy, &args.raw})
      if (!output->empty()) pending.push_back(*output);
    StopSignals stop_signals;
    try {
      Tensor value = ds.get(index, field);
      if (!args.npy.empty()) {
        write_npy_file(args.npy, value, args.force, StopSignals::check);
        pending.erase(pending.begin());
      }
      if (!args.raw.empty()) write_raw(args.raw, value, args.force, StopSignals::check);
    } catch (const Interrupted& e) {
      exit_interrupted("mmt get", e.signal_number(), not_written_outputs(pending));
    }
    return;
  }
  if (!args.field.empty()) {
    std::cout << ds.get(index, args.field).to_string() << "\n";
    return;
  }
  Sample sample = ds.get(index);
  // A dict of tensors, one field a line, as pprint.pprint shows a PyTorch sample dict too wide
  // for one line (print() would put it on one); the names come from the file, so they are
  // escaped.
  std::cout << "{";
  for (size_t i = 0; i < sample.size(); ++i) {
    std::cout << (i ? ",\n " : "") << "'" << printable(ds.schema()[i].name) << "': " << sample[i].to_string();
  }
  std::cout << "}\n";
}

}  // namespace

void add_get_command(CLI::App& app) {
  auto args = std::make_shared<GetArgs>();
  CLI::App* cmd = app.add_subcommand("get", "Print one record (PyTorch's style) or write a field to .npy");
  add_files_then_option(cmd, "INDEX", args->files, args->index,
                        "The dataset file (or several shards read as one dataset, in order), then the record's "
                        "index (negative counts from the end; for shards, counted across them)");
  args->field_option = cmd->add_option("--field", args->field, "Only this field");
  CLI::Option* npy = cmd->add_option("--npy", args->npy,
                                     "Write the field to this .npy file instead of printing (-: to standard output, "
                                     "for a pipe; ./- names a file called -)");
  CLI::Option* raw = cmd->add_option("--raw", args->raw,
                                     "Write the field's elements in row-major order, nothing else (raw bytes, an "
                                     "encoded image say, as stored); -: to standard output");
  // An empty path would read as "not given" and print the record instead of writing it.
  for (CLI::Option* output : {npy, raw})
    output->check([](const std::string& value) {
      return value.empty() ? std::string("the path is empty; name the file to write") : std::string();
    });
  cmd->add_flag("--force", args->force,
                "Replace an existing --npy or --raw file (a regular file only); with -, write to standard output "
                "even when it is a terminal");
  cmd->callback([args] { run_get(*args); });
}

}  // namespace mmt::tool
