// Files the subcommands write on request (get --npy/--raw, export's .npy files): each appears
// complete or not at all, an existing one is replaced only with --force, and something that
// is not a regular file (a device such as /dev/full, a symlink, a folder) is never replaced.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "mmtensor/tensor.h"
#include "temp_files.h"

namespace mmt::tool {

// Throws IoError unless `path` is free to write: absent, or a regular file and `force`; and
// ValueError, whatever `force` says, when it is the file `reading` (the dataset the command
// reads, by any name: a link, a hard link). Called before any work, so a long read is not
// wasted on a refusal.
void check_output_path(const std::string& path, bool force, const std::string& reading = "");

// Writes `bytes` to a temporary file beside `path`, fsyncs it and renames it onto `path`
// (over an existing file only with `force`). On failure the temporary is removed and `path`
// keeps what it had; the IoError names the step, the file and the system's reason.
// `checkpoint` runs between the steps (detail::WriteCheckpoint): StopSignals::check stops the
// write there, cleanly, on Ctrl-C.
void write_output_file(const std::string& path, std::span<const std::byte> bytes, bool force,
                       const detail::WriteCheckpoint& checkpoint = {});

// The same for `t` as an .npy file (the bytes save_npy writes), without a copy of a
// contiguous tensor.
void write_npy_file(const std::string& path, const Tensor& t, bool force,
                    const detail::WriteCheckpoint& checkpoint = {});

// Writes `t` as an .npy file to a temporary of `files`, to be put at `path` by its publish().
void stage_npy_file(detail::StagedFiles& files, const std::string& path, const Tensor& t);

}  // namespace mmt::tool
