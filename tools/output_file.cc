#include "output_file.h"

#include <filesystem>

#include "file_io.h"
#include "mmt_commands.h"
#include "npy_format.h"
#include "temp_files.h"

namespace mmt::tool {

void check_output_path(const std::string& path, bool force, const std::string& reading) {
  std::error_code ec;
  MMT_CHECK(reading.empty() || !std::filesystem::equivalent(path, reading, ec), ValueError, "the output ",
            printable(path), " is the dataset being read (", printable(reading), "): writing it would destroy it");
  io::check_output_target(path, force, "pass --force to replace it");
}

void write_output_file(const std::string& path, std::span<const std::byte> bytes, bool force,
                       const detail::WriteCheckpoint& checkpoint) {
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
    check_output_path(path, force);
    detail::write_file_atomically(path, {header, data}, /*replace=*/force, checkpoint);
  });
}

void stage_npy_file(detail::StagedFiles& files, const std::string& path, const Tensor& t) {
  with_npy_bytes(t, [&](std::span<const std::byte> header, std::span<const std::byte> data) {
    files.stage(path, {header, data});
  });
}

}  // namespace mmt::tool
