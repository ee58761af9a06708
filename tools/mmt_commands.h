// The `mmt` command's subcommands. Each file adds one to the app; main() runs the parse and
// turns errors into an exit status and a message on stderr.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mmt::tool {

// Thrown by a subcommand to end with `code` (after printing what it has to say).
struct ExitStatus {
  int code;
};

inline constexpr int kExitError = 1;        // any failure: bad input, I/O, an unsound file
inline constexpr int kExitUsage = 2;        // a bad command line (any CLI11 parse error)
// Stopped by a signal: 128 + its number, as shells report it (130 for SIGINT, 143 for SIGTERM).
inline constexpr int exit_status_for_signal(int signal_number) { return 128 + signal_number; }

void add_pack_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_get_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_bench_command(CLI::App& app);

// "1.5 MB", "47.0 MB", "3.2 GB" (decimal units, as disk sizes are quoted).
std::string human_bytes(double bytes);
// "0.42 s", "1 min 05 s".
std::string human_seconds(double seconds);
// `text` (a field name, a metadata value: bytes from a file anyone may have made) made safe
// to print on a terminal: control characters (C0, DEL, and C1 as UTF-8 or as lone bytes),
// and bytes that are not UTF-8, become \xNN or \u00NN, and a backslash becomes \\, so a
// crafted dataset cannot move the cursor, retitle the window or clear the screen, and an
// escape in the output is never ambiguous. Printable UTF-8 is kept as it is.
std::string printable(std::string_view text);
// Parses "4096", "64K", "1M", "2MiB", "1G" (binary multiples) into bytes; ValueError otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& option);
// Parses a whole decimal integer: an optional sign, then digits only, within int64 (no
// spaces, hex or suffixes, nothing clamped). ValueError naming `what` otherwise.
int64_t parse_int64(const std::string& text, const std::string& what);

}  // namespace mmt::tool

namespace mmt {
class PackSources;
}
namespace mmt::tool {
// The sources named on a command line: array inputs, or a folder (not both).
PackSources load_pack_sources(const std::vector<std::string>& inputs, const std::string& folder);
}  // namespace mmt::tool
