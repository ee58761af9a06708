// Loading and saving .npy files: the data part (the header lives in npy_header.cc).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "file_io.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/numpy_io.h"
#include "npy_format.h"
#include "scratch_file.h"
#include "temp_files.h"

namespace mmt {
namespace detail {
namespace {

// numpy's Fortran order: the first index varies fastest.
DimVector fortran_strides(IntArrayRef shape) {
  DimVector strides(shape.size(), 1);
  for (size_t i = 1; i < shape.size(); ++i)
    strides[i] = strides[i - 1] * std::max<int64_t>(shape[i - 1], 1);
  return strides;
}

Tensor layout_over(UntypedStorage storage, const NpyHeader& header, int64_t storage_offset) {
  if (header.fortran_order)
    return Tensor(std::move(storage), header.dtype, header.shape, fortran_strides(header.shape),
                  storage_offset);
  return Tensor(std::move(storage), header.dtype, header.shape, storage_offset);
}

void check_bools(const std::byte* data, const NpyHeader& header, std::string_view what) {
  if (header.dtype != kBool) return;
  int64_t bad = first_invalid_bool(data, header.data_nbytes);
  if (bad >= 0)
    throw FormatError(str(what, ": bool element ", bad, " holds the byte ",
                          static_cast<int>(static_cast<uint8_t>(data[bad])),
                          "; a '|b1' array may hold only 0 and 1"));
}

// One IoError wording for every failed system call here: step, path, reason.
[[noreturn]] void throw_io(std::string_view step, const std::string& path) {
  int err = errno;
  throw IoError(str(step, " of ", path, ": ", std::strerror(err)), err);
}

void read_all_at(int fd, std::byte* data, size_t n, int64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t got = ::pread(fd, data, std::min<size_t>(n, size_t{1} << 30), offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_io("read", path);
    }
    if (got == 0) throw FormatError(str(path, ": the file shrank while it was being read"));
    data += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
}

}  // namespace

void check_npy_data_size(const NpyHeader& header, uint64_t available_bytes, std::string_view what, NpySource source) {
  const uint64_t declared = static_cast<uint64_t>(header.data_nbytes);
  if (available_bytes == declared) return;
  std::string shape = "(";
  for (size_t i = 0; i < header.shape.size(); ++i) shape.append(i ? ", " : "").append(std::to_string(header.shape[i]));
  shape.append(header.shape.size() == 1 ? ",)" : ")");
  std::string message = str(what, ": header declares shape ", shape, " of ", header.descr, " = ", declared, " bytes but the ",
                            source == NpySource::ArchiveMember ? "member" : source == NpySource::Buffer ? "buffer" : "file",
                            " holds ", available_bytes, " bytes after the header");
  if (available_bytes < declared) throw FormatError(message);
  // np.load reads the declared bytes and ignores the rest. Refused here all the same: bytes
  // after an array usually mean a header whose shape is out of date (rows appended to the
  // file without rewriting it), and packing the declared rows would drop the others without
  // a word. The message counts them, and says how to cut them off if they are not data.
  const uint64_t extra = available_bytes - declared;
  message.append(str(": ", extra, extra == 1 ? " byte follows" : " bytes follow", " the array"));
  if (!header.fortran_order && !header.shape.empty()) {
    uint64_t row_bytes = static_cast<uint64_t>(element_size(header.dtype));
    for (size_t i = 1; i < header.shape.size(); ++i) row_bytes *= static_cast<uint64_t>(header.shape[i]);
    if (row_bytes > 0 && extra % row_bytes == 0)
      message.append(str(", as many as ", extra / row_bytes, extra == row_bytes ? " more row" : " more rows",
                         " along the first dimension"));
  }
  message.append(". np.load ignores such bytes; mmtensor refuses them, as they usually mean a shape out of date (rows "
                 "appended without rewriting the header), which packing would silently cut short. If they are data, ");
  const uint64_t whole = static_cast<uint64_t>(header.data_offset) + declared;
  switch (source) {
    case NpySource::ArchiveMember:
      message.append("save the array again with its whole shape; if not, save the member again without them (np.savez)");
      break;
    case NpySource::Buffer:
      message.append(str("write the whole shape into the header; if not, pass only the first ", whole, " bytes"));
      break;
    case NpySource::File:
      message.append(str("write the whole shape into the header; if not, cut them off: truncate -s ", whole, " FILE"));
      break;
  }
  throw FormatError(message);
}

namespace {

// npy_tensor_copy(), reading `data` (inside `source`) under guard_storage_reads().
Tensor copy_values(const UntypedStorage& source, const std::byte* data, const NpyHeader& header, std::string_view what) {
  guard_storage_reads(source, [&] { check_bools(data, header, what); });
  UntypedStorage storage = UntypedStorage::allocate(header.data_nbytes);  // outside the guard: it owns memory
  std::byte* out = storage.mutable_data();
  if (header.data_nbytes > 0)
    guard_storage_reads(source, [&] { copy_to_native(out, data, header.data_nbytes, header.dtype, header.big_endian); });
  return layout_over(std::move(storage), header, 0);
}

}  // namespace

Tensor npy_tensor_copy(const std::byte* data, const NpyHeader& header, std::string_view what) {
  return copy_values(UntypedStorage(), data, header, what);
}

bool npy_viewable(const std::byte* data, int64_t data_offset, const NpyHeader& header) {
  int64_t elem = element_size(header.dtype);
  bool native = elem == 1 || header.big_endian == (std::endian::native == std::endian::big);
  // A view counts its offset in elements, so the offset and the address must both be aligned.
  bool aligned = reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(elem) == 0 &&
                 data_offset % elem == 0;
  return native && aligned && header.data_nbytes > 0;
}

Tensor npy_tensor_over(const UntypedStorage& storage, int64_t data_offset,
                       const NpyHeader& header, std::string_view what) {
  if (data_offset < 0 || data_offset > storage.nbytes())
    throw FormatError(str(what, ": the data's offset ", data_offset, " lies outside its ", storage.nbytes(), " bytes"));
  // More bytes than declared are allowed here: `storage` may be a whole .npz archive.
  if (header.data_nbytes > storage.nbytes() - data_offset)
    check_npy_data_size(header, static_cast<uint64_t>(storage.nbytes() - data_offset), what);
  const std::byte* data = storage.data() + data_offset;
  if (!npy_viewable(data, data_offset, header)) return copy_values(storage, data, header, what);
  guard_storage_reads(storage, [&] { check_bools(data, header, what); });
  return layout_over(storage, header, data_offset / element_size(header.dtype));
}

// Written a block at a time, so the process never holds more than a block of the array;
// the page cache holds the file, and can write it out.
UntypedStorage fortran_values_in_temporary_file(const NpyHeader& header, const std::string& what,
                                                const std::function<void(int64_t, std::byte*, int64_t)>& read) {
  if (header.data_nbytes == 0) return UntypedStorage();
  const int64_t nbytes = header.data_nbytes;
  ScratchFile file(what, str("to convert this Fortran-order array in (", nbytes, " bytes)"));
  // The space, reserved before the conversion starts: a full disk fails now, not after most
  // of the array (or, on thin or remote storage, at a later write-back).
  file.reserve(nbytes);
  const int64_t element_bytes = element_size(header.dtype);
  const int64_t block_bytes = (int64_t{4} << 20) / element_bytes * element_bytes;
  std::vector<std::byte> block(static_cast<size_t>(std::min(block_bytes, nbytes)));
  for (int64_t done = 0; done < nbytes;) {
    const int64_t n = std::min(block_bytes, nbytes - done);
    read(done, block.data(), n);
    copy_to_native(block.data(), block.data(), n, header.dtype, header.big_endian);
    file.append(block.data(), n);
    done += n;
  }
  return file.map(str("the temporary file in ", file.folder().string(), " holding ", what, " converted from Fortran order"));
}

NpyValues map_npy_values(const std::string& path) {
  NpyValues values;
  values.what = path;
  values.header = read_npy_header(path);
  if (values.header.data_nbytes > 0)
    values.storage = UntypedStorage::map_file(path, MapMode::ReadOnly, values.header.data_offset,
                                              values.header.data_nbytes);
  return values;
}

}  // namespace detail

NpyHeader read_npy_header(const std::string& path) {
  int64_t file_bytes = detail::regular_file_size(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) detail::throw_io("open", path);
  detail::FileCloser closer{fd};
  // The preamble holds the header's length; read no more than the capped header.
  int64_t prefix_bytes = std::min<int64_t>(file_bytes, 12 + kMaxNpyHeaderBytes);
  std::vector<std::byte> prefix(static_cast<size_t>(prefix_bytes));
  detail::read_all_at(fd, prefix.data(), prefix.size(), 0, path);
  NpyHeader header = parse_npy_header(prefix, path);
  detail::check_npy_data_size(header, static_cast<uint64_t>(file_bytes - header.data_offset), path);
  return header;
}

Tensor load_npy(const std::string& path, bool mmap) {
  if (mmap) {
    const detail::NpyValues values = detail::map_npy_values(path);
    return detail::npy_tensor_over(values.storage, 0, values.header, path);
  }
  NpyHeader header = read_npy_header(path);
  if (header.data_nbytes == 0) return detail::npy_tensor_copy(nullptr, header, path);
  UntypedStorage storage = UntypedStorage::allocate(header.data_nbytes);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) detail::throw_io("open", path);
  detail::FileCloser closer{fd};
  detail::read_all_at(fd, storage.mutable_data(), static_cast<size_t>(header.data_nbytes),
                      header.data_offset, path);
  return detail::npy_tensor_over(storage, 0, header, path);
}

Tensor parse_npy(std::span<const std::byte> bytes, std::string_view what) {
  NpyHeader header = parse_npy_header(bytes, what);
  detail::check_npy_data_size(header, bytes.size() - static_cast<size_t>(header.data_offset), what,
                              detail::NpySource::Buffer);
  return detail::npy_tensor_copy(bytes.data() + header.data_offset, header, what);
}

std::vector<std::byte> npy_bytes(const Tensor& t) {
  MMT_CHECK(t.defined(), ValueError, "npy_bytes: the tensor is undefined");
  Tensor host = t.is_cuda() ? t.cpu() : t;
  host = host.contiguous();
  std::string header = detail::npy_header_bytes(host.dtype(), host.sizes());
  std::vector<std::byte> out(header.size() + static_cast<size_t>(host.nbytes()));
  std::memcpy(out.data(), header.data(), header.size());
  if (host.nbytes() > 0)
    std::memcpy(out.data() + header.size(), host.data_ptr(), static_cast<size_t>(host.nbytes()));
  return out;
}

void save_npy(const std::string& path, const Tensor& t) {
  MMT_CHECK(t.defined(), ValueError, "save_npy(", path, "): the tensor is undefined");
  Tensor host = t.is_cuda() ? t.cpu() : t;
  host = host.contiguous();
  std::string header = detail::npy_header_bytes(host.dtype(), host.sizes());

  std::span<const std::byte> data;
  if (host.nbytes() > 0)
    data = {static_cast<const std::byte*>(host.data_ptr()), static_cast<size_t>(host.nbytes())};
  detail::write_file_atomically(path, {std::as_bytes(std::span(header)), data}, /*replace=*/true);
}

}  // namespace mmt
