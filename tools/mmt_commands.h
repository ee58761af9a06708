// The `mmt` command's subcommands. Each file adds one to the app; main() runs the parse and
// turns errors into an exit status and a message on stderr.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"

namespace mmt::tool {

// Thrown by a subcommand to end with `code` (after printing what it has to say).
struct ExitStatus {
  int code;
};

inline constexpr int kExitError = 1;        // any failure: bad input, I/O, an unsound file
inline constexpr int kExitUsage = 2;        // a bad command line: a parse error, a refused option value
// Stopped by a signal: 128 + its number, as shells report it (130 for SIGINT, 143 for SIGTERM).
inline constexpr int exit_status_for_signal(int signal_number) { return 128 + signal_number; }

void add_pack_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_get_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_bench_command(CLI::App& app);

// Said by a subcommand once its output file stands ("out.mmt was written and is complete"):
// a later failure to write standard output (a full disk, a closed pipe) is reported with it,
// so a user whose script sees the failure knows the work was not lost.
void note_published(std::string what);

// "1.5 MB", "47.0 MB", "3.2 GB" (decimal units, as disk sizes are quoted).
std::string human_bytes(double bytes);
// A dataset's codec as the commands print it: "mixed" for shards packed with different
// codecs (info() would give the first part's), else the codec ("zstd:3").
std::string codec_text(const DatasetInfo& info);
// "0.42 s", "1 min 05 s".
std::string human_seconds(double seconds);
// `text` (a field name, a metadata value: bytes from a file anyone may have made) made safe
// to print on a terminal: control characters (C0, DEL, and C1 as UTF-8 or as lone bytes),
// and bytes that are not UTF-8, become \xNN or \u00NN, and a backslash becomes \\, so a
// crafted dataset cannot move the cursor, retitle the window or clear the screen, and an
// escape in the output is never ambiguous. Printable UTF-8 is kept as it is.
std::string printable(std::string_view text);
// How many terminal columns printable() text takes: wide (CJK) characters count 2,
// combining and zero-width ones 0 (wcwidth under C.UTF-8); for aligning columns, where its
// bytes would over-count every character that is not ASCII.
size_t display_width(std::string_view text);
// `text` followed by spaces up to `width` columns (display_width), as printf's %-*s pads bytes.
std::string pad_to_width(std::string text, size_t width);
// An error message made safe to print: its control characters and bytes that are not UTF-8
// escaped as printable() escapes them, its backslashes kept. The engine and the subcommands
// escape the text from files they quote (printable(), detail::escaped()), so doubling the
// backslashes here would double those escapes ("the magic \\x93NUMPY"); this pass is the
// guard for text no one escaped.
std::string printable_message(std::string_view message);
// Parses "4096", "64K", "1M", "2MiB", "1G" (binary multiples) into bytes; ValueError otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& option);
// Parses a whole decimal integer: an optional sign, then digits only, within [min, max] (no
// spaces, hex or suffixes, nothing clamped). ValueError naming `what`, and the real range,
// otherwise; the hint suggests a negative value only when `min` allows one.
int64_t parse_int64(const std::string& text, const std::string& what, int64_t min = INT64_MIN,
                    int64_t max = INT64_MAX);
// The same for an unsigned value within [0, max] (a seed): an optional '+', then digits only.
uint64_t parse_uint64(const std::string& text, const std::string& what, uint64_t max = UINT64_MAX);

// A bad command line found after the parse (an empty --folder, an option that needs another):
// main() reports it as it reports CLI11's parse errors, "mmt SUB: error: ..." and kExitUsage.
class UsageError : public ValueError {
 public:
  using ValueError::ValueError;
};

// Adds an integer option whose text is parsed strictly (parse_int64 / parse_uint64) within
// [min, max]: CLI11's own conversion takes '' as 0 and clamps what is out of range. A bad
// value ends the command as a usage error naming the option, what was typed and the range.
template <typename Int>
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& name, Int& target, const std::string& help,
                                Int min = std::numeric_limits<Int>::min(), Int max = std::numeric_limits<Int>::max()) {
  const std::string flag = name;
  if constexpr (std::is_unsigned_v<Int>)  // parse_uint64 takes no lower bound
    MMT_CHECK(min == 0, ValueError, "add_integer_option(", name, "): an unsigned option's minimum must be 0");
  CLI::Option* option = cmd->add_option_function<std::string>(
      name,
      [&target, flag, min, max](const std::string& text) {
        try {
          if constexpr (std::is_unsigned_v<Int>)
            target = static_cast<Int>(parse_uint64(text, flag, static_cast<uint64_t>(max)));
          else
            target = static_cast<Int>(parse_int64(text, flag, static_cast<int64_t>(min), static_cast<int64_t>(max)));
        } catch (const std::exception& e) {
          throw CLI::ValidationError(e.what());  // parse_*64 name the option themselves
        }
      },
      help);
  option->default_str(std::to_string(target))->type_name(std::is_unsigned_v<Int> ? "UINT" : "INT");
  return option;
}

// What the subcommands that read a dataset say of FILE: Dataset::open_concat reads the files.
inline constexpr const char* kFilesHelp = "The dataset file, or several shards read as one dataset, in order";

// Adds the positionals "FILE... <last_name>": the dataset's files, then one more word (export's
// DIR, get's INDEX). CLI11 gives a repeated positional every word, leaving none for a
// positional after it, so the words are taken as one list (as cp takes SOURCE... DIRECTORY)
// and its last word is split off into `last`.
CLI::Option* add_files_then_option(CLI::App* cmd, const std::string& last_name, std::vector<std::string>& files,
                                   std::string& last, const std::string& help);

// Adds an option whose value `parse` turns into `target` (a size, a codec): a ValueError from
// it ends the command as a usage error, as a bad integer does.
template <typename T, typename Parse>
CLI::Option* add_parsed_option(CLI::App* cmd, const std::string& name, T& target, const std::string& help,
                               Parse parse) {
  CLI::Option* option = cmd->add_option_function<std::string>(
      name,
      [&target, parse](const std::string& text) {
        try {
          target = parse(text);
        } catch (const std::exception& e) {
          throw CLI::ValidationError(e.what());
        }
      },
      help);
  return option;
}

}  // namespace mmt::tool

namespace mmt::tool {
// The sources named on a command line: array inputs, datasets (only `fields` of them when
// some are named), tar archives (grouped as `tar` says: keys, the fields chosen, missing
// members), or a folder (not both), with its files' paths as field "path" when `folder_paths`.
// `jagged`: ragged fields of array inputs in the jagged layout (--offsets, --shapes).
PackSources load_pack_sources(const std::vector<std::string>& inputs, const std::string& folder, bool folder_paths,
                              const std::vector<std::string>& fields, const TarOptions& tar = {},
                              const JaggedArrays& jagged = {});
// --offsets NAME=PATH.npy and --shapes NAME=PATH.npy (each repeated), as `pack` and `verify
// --against` take them, into `jagged`.
void add_jagged_options(CLI::App* cmd, JaggedArrays& jagged);
}  // namespace mmt::tool
