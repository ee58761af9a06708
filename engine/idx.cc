// IDX files (MNIST's format), plain or gzip-compressed. See include/mmtensor/idx_io.h.
#include <array>
#include <vector>

#include "gzip_reader.h"
#include "import_util.h"
#include "mmtensor/idx_io.h"

namespace mmt {
namespace {

using detail::str;

constexpr size_t kIdxMagicBytes = 4;
// Deflate expands at most about 1032:1, which bounds what a compressed file can really hold,
// so a forged header cannot make us allocate more than that.
constexpr int64_t kMaxDeflateRatio = 1032;

struct IdxHeader {
  ScalarType dtype = kUInt8;
  DimVector shape;
  int64_t data_offset = 0;  // bytes: magic + 4 per dimension
  int64_t data_nbytes = 0;
};

// Validates the magic; returns the number of dimensions.
int magic_dims(const std::byte* magic, std::string_view what, ScalarType& dtype) {
  uint32_t value = detail::load_be32(magic);
  if (magic[0] != std::byte{0} || magic[1] != std::byte{0})
    throw FormatError(str(what, ": magic 0x", std::hex, value,
                          " is not an IDX magic: the first two bytes must be zero"));
  dtype = idx_scalar_type(static_cast<uint8_t>(magic[2]), what);
  return static_cast<uint8_t>(magic[3]);
}

void finish_header(IdxHeader& h, std::string_view what) {
  h.data_offset = static_cast<int64_t>(kIdxMagicBytes + 4 * h.shape.size());
  h.data_nbytes = detail::checked_shape_nbytes(h.shape, element_size(h.dtype), what);
}

std::string size_mismatch(const IdxHeader& h, int64_t available, std::string_view what,
                          std::string_view holder) {
  return str(what, ": header declares shape ", IntArrayRef(h.shape), " of ", to_string(h.dtype),
             " = ", h.data_nbytes, " bytes but the ", holder, " holds ", available,
             " bytes after the header",
             available < h.data_nbytes ? " (truncated?)" : "");
}

Tensor decode_plain(std::span<const std::byte> bytes, const UntypedStorage* mapping,
                    std::string_view what) {
  if (bytes.size() < kIdxMagicBytes)
    throw FormatError(str(what, ": not an IDX file: ", bytes.size(), " bytes is too short for the magic"));
  IdxHeader h;
  int dims = magic_dims(bytes.data(), what, h.dtype);
  if (static_cast<size_t>(dims) * 4 > bytes.size() - kIdxMagicBytes)
    throw FormatError(str(what, ": truncated IDX header: ", dims, " dimensions need ", dims * 4,
                          " bytes but only ", bytes.size() - kIdxMagicBytes, " follow the magic"));
  for (int d = 0; d < dims; ++d)
    h.shape.push_back(detail::load_be32(bytes.data() + kIdxMagicBytes + 4 * d));
  finish_header(h, what);
  int64_t available = static_cast<int64_t>(bytes.size()) - h.data_offset;
  if (available != h.data_nbytes) throw FormatError(size_mismatch(h, available, what, "file"));
  const std::byte* data = bytes.data() + h.data_offset;
  // One-byte elements have no byte order, so the file's bytes are the tensor's bytes.
  if (mapping && element_size(h.dtype) == 1 && h.data_nbytes > 0)
    return Tensor(*mapping, h.dtype, h.shape, data - mapping->data());
  UntypedStorage storage = UntypedStorage::allocate(h.data_nbytes);
  if (h.data_nbytes > 0)
    detail::copy_to_native(storage.mutable_data(), data, h.data_nbytes, h.dtype, /*big_endian=*/true);
  return Tensor(std::move(storage), h.dtype, h.shape);
}

// Reads the header first, so the decompressed size is known before anything is allocated.
Tensor decode_gzip(std::span<const std::byte> bytes, std::string_view what) {
  detail::GzipReader gz(bytes, what);
  auto read_exact = [&](std::byte* dst, size_t n, std::string_view part) {
    size_t got = gz.read(dst, n);
    if (got != n)
      throw FormatError(str(what, ": truncated IDX ", part, ": the decompressed stream ends after ",
                            gz.position(), " bytes"));
  };
  std::array<std::byte, kIdxMagicBytes> magic;
  read_exact(magic.data(), magic.size(), "magic");
  IdxHeader h;
  int dims = magic_dims(magic.data(), what, h.dtype);
  std::vector<std::byte> dim_bytes(static_cast<size_t>(dims) * 4);
  read_exact(dim_bytes.data(), dim_bytes.size(), "header");
  for (int d = 0; d < dims; ++d) h.shape.push_back(detail::load_be32(dim_bytes.data() + 4 * d));
  finish_header(h, what);
  if (h.data_nbytes / kMaxDeflateRatio > static_cast<int64_t>(bytes.size()))
    throw FormatError(str(what, ": header declares ", h.data_nbytes, " bytes of data, more than ",
                          "a gzip stream of ", bytes.size(), " bytes can hold (truncated?)"));
  UntypedStorage storage = UntypedStorage::allocate(h.data_nbytes);
  if (h.data_nbytes > 0) {
    size_t got = gz.read(storage.mutable_data(), static_cast<size_t>(h.data_nbytes));
    if (got != static_cast<size_t>(h.data_nbytes))
      throw FormatError(size_mismatch(h, static_cast<int64_t>(got), what, "decompressed stream"));
  }
  std::byte extra;
  if (gz.read(&extra, 1) != 0)
    throw FormatError(str(what, ": the decompressed stream continues past the ", h.data_nbytes,
                          " data bytes its header declares"));
  detail::copy_to_native(storage.mutable_data(), storage.data(), h.data_nbytes, h.dtype, /*big_endian=*/true);
  return Tensor(std::move(storage), h.dtype, h.shape);
}

}  // namespace

ScalarType idx_scalar_type(uint8_t type_code, std::string_view what) {
  switch (type_code) {
    case 0x08: return kUInt8;
    case 0x09: return kInt8;
    case 0x0B: return kInt16;
    case 0x0C: return kInt32;
    case 0x0D: return kFloat32;
    case 0x0E: return kFloat64;
  }
  throw FormatError(str(what, ": unknown IDX type code 0x", std::hex, int{type_code},
                        " (known: 0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int, 0x0D float, ",
                        "0x0E double)"));
}

Tensor load_idx(const std::string& path) {
  detail::InputFile file = detail::map_input_file(path);
  if (detail::is_gzip(file.bytes)) return decode_gzip(file.bytes, path);
  return decode_plain(file.bytes, &file.mapping, path);
}

Tensor parse_idx(std::span<const std::byte> bytes, std::string_view what) {
  if (detail::is_gzip(bytes)) return decode_gzip(bytes, what);
  return decode_plain(bytes, nullptr, what);
}

}  // namespace mmt
