#include "output_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "file_io.h"
#include "mmt_commands.h"
#include "npy_format.h"
#include "temp_files.h"

namespace mmt::tool {

void check_output_path(const std::string& path, bool force, const std::vector<std::string>& reading) {
  for (const std::string& file : reading) {
    std::error_code ec;
    MMT_CHECK(!std::filesystem::equivalent(path, file, ec), ValueError, "the output ", printable(path),
              " is the dataset being read (", printable(file), "): writing it would destroy it");
  }
  io::check_output_target(path, force, "pass --force to replace it");
}

bool is_standard_output(const std::string& path) { return path == "-"; }

void write_standard_output(std::initializer_list<std::span<const std::byte>> pieces,
                           const detail::WriteCheckpoint& checkpoint) {
  std::signal(SIGPIPE, SIG_IGN);
  std::cout.flush();  // text printed before goes out first
  uint64_t total_bytes = 0, written_bytes = 0;
  for (std::span<const std::byte> piece : pieces) total_bytes += piece.size();
  for (std::span<const std::byte> piece : pieces) {
    while (!piece.empty()) {
      if (checkpoint) checkpoint();
      const size_t n = std::min<size_t>(piece.size(), static_cast<size_t>(detail::kCheckpointBytes));
      const ssize_t done = ::write(STDOUT_FILENO, piece.data(), n);
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0) {
        const int err = done < 0 ? errno : EIO;
        throw IoError(detail::str("cannot write to standard output: ", std::strerror(err), " (", written_bytes, " of ",
                                  total_bytes, " bytes written",
                                  err == EPIPE ? "; the program reading it stopped before the end" : "", ")"),
                      err);
      }
      piece = piece.subspan(static_cast<size_t>(done));
      written_bytes += static_cast<uint64_t>(done);
    }
  }
}

void write_output_file(const std::string& path, std::span<const std::byte> bytes, bool force,
                       const detail::WriteCheckpoint& checkpoint) {
  if (is_standard_output(path)) return write_standard_output({bytes}, checkpoint);
  check_output_path(path, force);
  // Without --force the rename refuses a file that appeared since the check (no clobber).
  detail::write_file_atomically(path, {bytes}, /*replace=*/force, checkpoint);
}

namespace {

// The header and data bytes of `t` as an .npy file, handed to `write`.
template <typename Write>
void with_npy_bytes(const Tensor& t, Write&& write) {
  const Tensor host = (t.is_cuda() ? t.cpu() : t).contiguous();
  const std::string header = detail::npy_header_bytes(host.dtype(), host.sizes());
  std::span<const std::byte> data;
  if (host.nbytes() > 0)
    data = {static_cast<const std::byte*>(host.data_ptr()), static_cast<size_t>(host.nbytes())};
  write(std::as_bytes(std::span(header)), data);
}

}  // namespace

void write_npy_file(const std::string& path, const Tensor& t, bool force, const detail::WriteCheckpoint& checkpoint) {
  with_npy_bytes(t, [&](std::span<const std::byte> header, std::span<const std::byte> data) {
    if (is_standard_output(path)) return write_standard_output({header, data}, checkpoint);
    check_output_path(path, force);
    detail::write_file_atomically(path, {header, data}, /*replace=*/force, checkpoint);
  });
}

}  // namespace mmt::tool
