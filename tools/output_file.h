// Files the subcommands write on request (get --npy/--raw, export's .npy files): each appears
// complete or not at all, an existing one is replaced only with --force, and something that
// is not a regular file (a device such as /dev/full, a symlink, a folder) is never replaced.
// get's outputs may also be standard output, named "-".
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "mmtensor/tensor.h"
#include "temp_files.h"

namespace mmt::tool {

// Throws IoError unless `path` is free to write: absent, or a regular file and `force`; and
// ValueError, whatever `force` says, when it is one of the files `reading` (the dataset the
// command reads, each of its shards, by any name: a link, a hard link). Called before any
// work, so a long read is not wasted on a refusal.
void check_output_path(const std::string& path, bool force, const std::vector<std::string>& reading = {});

// Whether `path` names standard output: "-", as for most tools, so that values can be piped
// (`mmt get x.mmt 0 --raw - | ...`). A file named "-" is reached as ./-.
bool is_standard_output(const std::string& path);

// Writes `pieces`, in order, to standard output. `checkpoint` runs before each write(2) of at
// most detail::kCheckpointBytes and after one a signal cut short: StopSignals::check stops
// there on Ctrl-C. Unlike a file, standard output cannot appear complete or not at all: after
// a failure or a stop its reader may have part of the bytes. SIGPIPE is ignored from here on,
// so a reader that exits early (`| head -c 16`) fails the write with EPIPE, reported, instead
// of ending mmt without a word. IoError naming the reason and how many bytes went out.
void write_standard_output(std::initializer_list<std::span<const std::byte>> pieces,
                           const detail::WriteCheckpoint& checkpoint = {});

// Writes `bytes` to a temporary file beside `path`, fsyncs it and renames it onto `path`
// (over an existing file only with `force`). On failure the temporary is removed and `path`
// keeps what it had; the IoError names the step, the file and the system's reason.
// `checkpoint` runs between the steps (detail::WriteCheckpoint): StopSignals::check stops the
// write there, cleanly, on Ctrl-C. A `path` of "-" writes to standard output instead
// (write_standard_output; `force` does not apply).
void write_output_file(const std::string& path, std::span<const std::byte> bytes, bool force,
                       const detail::WriteCheckpoint& checkpoint = {});

// The same for `t` as an .npy file (the bytes save_npy writes), without a copy of a
// contiguous tensor; "-" too.
void write_npy_file(const std::string& path, const Tensor& t, bool force,
                    const detail::WriteCheckpoint& checkpoint = {});

}  // namespace mmt::tool
