// Shared by the importers (npy, npz, idx): mapping an input file whole, checked size
// arithmetic for shapes read from untrusted headers, and byte-order conversion.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mmtensor/dims.h"
#include "mmtensor/dtype.h"
#include "mmtensor/error.h"
#include "mmtensor/storage.h"

namespace mmt::detail {

// Packers that copy runs of small records into one batch for the writer (MDS samples with
// bytes columns, TFRecord examples): a run holds up to kCopiedRunBytes of them, and a record
// of kRecordAloneBytes or more goes alone, as views of its input: a run would copy it twice
// (into the run, then into the chunk), where small records gain more from the writer's batch
// path than the copy costs.
inline constexpr int64_t kCopiedRunBytes = int64_t{4} << 20;
inline constexpr int64_t kRecordAloneBytes = int64_t{64} << 10;

// Closes a file descriptor when it goes out of scope (an importer's open file, on every
// path out, an exception's included).
struct FileCloser {
  int fd;
  ~FileCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// A whole input file mapped read-only. An empty file gives an empty span and no mapping
// (mapping zero bytes is an error on POSIX).
struct InputFile {
  std::string path;
  UntypedStorage mapping;
  std::span<const std::byte> bytes;
};
// Throws IoError naming the path for a missing file, a folder, or a refused open/map.
InputFile map_input_file(const std::string& path);

// The whole file at `path` read into host memory (for small files, where a mapping costs
// more than a read). Throws IoError naming the path.
UntypedStorage read_file_bytes(const std::string& path);

// A pack input spec split into NAME and PATH: "NAME=PATH" when the part before the first '='
// could be a field name (no '/'), else ("", spec). InputSpecError for a name with '/' before
// an existing file. (packer.cc)
std::pair<std::string, std::string> split_input_spec(const std::string& spec);
// A "PATH:SUFFIX" input spec (raw values' PATH:DTYPE, HDF5's PATH:DATASET) split at the ':'
// after its file: the longest part before a ':' that `names_a_file` accepts (a path may hold
// ':' itself), and what follows. nullopt when no part before a ':' is accepted. Each reader
// says which files it takes: raw values any but a folder (to refuse a device by what it is),
// HDF5 regular files only (its probe would block on a FIFO). (packer.cc)
std::optional<std::pair<std::string, std::string>> split_at_file(
    const std::string& spec, const std::function<bool(const std::string&)>& names_a_file);
// For readers of inputs packed alone (tar archives, TFRecord files): ValueError, before the
// reader tries to open it, for a spec that is no file but another kind's input: "NAME=PATH"
// of an existing file (an array, or a field name given to a `kind` input, which names its
// own fields), or a Megatron PREFIX. `kind`: "tar archives". (packer.cc)
void refuse_input_of_another_kind(const std::string& spec, std::string_view kind);

// Inputs that each must be packed once (tar archives, TFRecord files, Megatron datasets):
// add() refuses a file given before under any spelling or hard link (the same device and
// inode), one stat an input, so tens of thousands of shards cost what listing them costs.
// A path that cannot be stat'ed is let through: its reader names it. (import_util.cc)
class DistinctInputs {
 public:
  // `each`: what the message says is packed once ("tar archive").
  explicit DistinctInputs(std::string each) : each_(std::move(each)) {}
  // ValueError "input 'INPUT' is EARLIER again; each tar archive is packed once" when `path`
  // is a file added before. `input`: the spec the user gave, when it is not `path` itself.
  void add(const std::string& path, std::string_view input = {});

 private:
  std::string each_;
  std::map<std::pair<uint64_t, uint64_t>, std::string> seen_;  // (device, inode) -> its first path
};

// Names joined with ", ", for messages ("a, b, c").
inline std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Which part of several holds `index`, and its index there, given each part's end (records
// before the end of each part, ascending): the packer's sources read as one (Megatron pairs,
// MDS shards). `index` must be below ends.back().
inline std::pair<size_t, int64_t> part_of(const std::vector<int64_t>& ends, int64_t index) {
  const auto part = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), index) - ends.begin());
  return {part, index - (part == 0 ? 0 : ends[part - 1])};
}

// The size in bytes of the regular file at `path`; IoError otherwise.
int64_t regular_file_size(const std::string& path);

// numel(shape) * element_bytes, or FormatError "<what>: shape <shape> overflows" when the
// product does not fit int64. Negative extents are refused too.
int64_t checked_shape_nbytes(IntArrayRef shape, int64_t element_bytes, std::string_view what);

// Copies `count` elements of `element_bytes` each from src to dst, reversing the bytes of
// each element (big-endian <-> little-endian). dst and src either do not overlap or are the
// same (an in-place swap: each element is read whole before it is written); for 1-byte
// elements, which have nothing to swap, they must not overlap.
inline void copy_byteswapped(std::byte* dst, const std::byte* src, int64_t count,
                             int64_t element_bytes) {
  switch (element_bytes) {
    case 1:
      std::memcpy(dst, src, static_cast<size_t>(count));
      return;
    case 2:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, src + i * 2, 2);
        v = __builtin_bswap16(v);
        std::memcpy(dst + i * 2, &v, 2);
      }
      return;
    case 4:
      for (int64_t i = 0; i < count; ++i) {
        uint32_t v;
        std::memcpy(&v, src + i * 4, 4);
        v = __builtin_bswap32(v);
        std::memcpy(dst + i * 4, &v, 4);
      }
      return;
    case 8:
      for (int64_t i = 0; i < count; ++i) {
        uint64_t v;
        std::memcpy(&v, src + i * 8, 8);
        v = __builtin_bswap64(v);
        std::memcpy(dst + i * 8, &v, 8);
      }
      return;
  }
  throw ValueError(str("copy_byteswapped: unsupported element size ", element_bytes));
}

// Copies `nbytes` of `dtype` elements stored in `big_endian` order into native order. dst and
// src either do not overlap or are the same (converted in place). Byte order is per value: a
// complex element's real and imaginary parts are each swapped on their own, never exchanged.
inline void copy_to_native(std::byte* dst, const std::byte* src, int64_t nbytes, ScalarType dtype,
                           bool big_endian) {
  constexpr bool kHostBigEndian = std::endian::native == std::endian::big;
  const int64_t value_bytes = element_size(to_real_value_type(dtype));
  if (big_endian == kHostBigEndian || value_bytes == 1) {
    if (nbytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(nbytes));
  } else {
    copy_byteswapped(dst, src, nbytes / value_bytes, value_bytes);
  }
}

// Index of the first byte that is neither 0 nor 1, or -1: bool elements must hold one of
// those, since any other value read as a C++ bool is undefined behaviour.
inline int64_t first_invalid_bool(const std::byte* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (static_cast<uint8_t>(data[i]) > 1) return i;
  return -1;
}

// Big-endian unsigned integers read from untrusted bytes (the caller checked the length).
inline uint32_t load_be32(const std::byte* p) {
  return (uint32_t(uint8_t(p[0])) << 24) | (uint32_t(uint8_t(p[1])) << 16) |
         (uint32_t(uint8_t(p[2])) << 8) | uint32_t(uint8_t(p[3]));
}
// Little-endian ones (ZIP, the .npy header length).
inline uint16_t load_le16(const std::byte* p) {
  return static_cast<uint16_t>(uint8_t(p[0]) | (uint8_t(p[1]) << 8));
}
inline uint32_t load_le32(const std::byte* p) {
  return uint32_t(uint8_t(p[0])) | (uint32_t(uint8_t(p[1])) << 8) |
         (uint32_t(uint8_t(p[2])) << 16) | (uint32_t(uint8_t(p[3])) << 24);
}
inline uint64_t load_le64(const std::byte* p) {
  return uint64_t(load_le32(p)) | (uint64_t(load_le32(p + 4)) << 32);
}

}  // namespace mmt::detail
