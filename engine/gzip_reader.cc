#include "gzip_reader.h"

#include <new>

#include <zlib.h>

#include <algorithm>
#include <climits>

#include "load_cancel.h"
#include "mmtensor/error.h"

namespace mmt::detail {
namespace {

// Inflated at most this much a call, so that a long decompression asks between steps whether
// its load was given up (load_cancel.h).
constexpr size_t kStepBytes = size_t{16} << 20;

}  // namespace

bool is_gzip(std::span<const std::byte> bytes) {
  return bytes.size() >= 2 && bytes[0] == std::byte{0x1f} && bytes[1] == std::byte{0x8b};
}

bool is_zlib_start(std::span<const std::byte> bytes) {
  if (bytes.size() < 2) return false;
  const auto cmf = static_cast<unsigned>(bytes[0]), flg = static_cast<unsigned>(bytes[1]);
  // No preset dictionary (FDICT): TensorFlow's writer sets none, and zlib cannot read one
  // without it.
  return (cmf & 0x0f) == 8 && (cmf >> 4) <= 7 && (flg & 0x20) == 0 && (cmf * 256 + flg) % 31 == 0;
}

struct GzipReader::State {
  z_stream zs{};
};

GzipReader::GzipReader(std::span<const std::byte> compressed, std::string_view what, Wrapper wrapper)
    : state_(std::make_unique<State>()), input_(compressed), what_(what), wrapper_(wrapper) {
  // 16 + MAX_WBITS: expect a gzip wrapper (header and CRC-32/size trailer, both checked);
  // MAX_WBITS alone: a zlib one (header and Adler-32).
  if (inflateInit2(&state_->zs, wrapper == Wrapper::Gzip ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK)
    throw Error(str(what_, ": zlib inflateInit2 failed"));
}

GzipReader::~GzipReader() { inflateEnd(&state_->zs); }

size_t GzipReader::read(std::byte* dst, size_t n) {
  z_stream& zs = state_->zs;
  size_t produced = 0;
  while (produced < n && !ended_) {
    if (zs.avail_in == 0) {
      size_t slice = std::min<size_t>(input_.size() - input_pos_, UINT_MAX);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(input_.data() + input_pos_));
      zs.avail_in = static_cast<uInt>(slice);
      input_pos_ += slice;
    }
    check_load_cancelled();
    size_t want = std::min<size_t>(n - produced, kStepBytes);  // a step at a time: a load may be given up
    zs.next_out = reinterpret_cast<Bytef*>(dst + produced);
    zs.avail_out = static_cast<uInt>(want);
    int rc = inflate(&zs, Z_NO_FLUSH);
    produced += want - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another member may follow; anything else after the trailer is not gzip data.
      size_t rest = zs.avail_in + (input_.size() - input_pos_);
      if (rest == 0) {
        ended_ = true;
        break;
      }
      std::span<const std::byte> tail = input_.subspan(input_.size() - rest);
      // Zero bytes after the last member (a tape's or a block device's padding) are ignored,
      // as gzip and Python's gzip module ignore them.
      if (std::all_of(tail.begin(), tail.end(), [](std::byte b) { return b == std::byte{0}; })) {
        ended_ = true;
        break;
      }
      // A zlib stream is one stream: TensorFlow's writer makes no second.
      if (wrapper_ == Wrapper::Zlib)
        throw FormatError(str(what_, ": ", rest, " bytes after the end of the zlib stream"));
      if (!is_gzip(tail))
        throw FormatError(str(what_, ": ", rest, " bytes of non-gzip data after the gzip stream"));
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && input_pos_ == input_.size())
      throw FormatError(str(what_, ": the ", name(), " stream is truncated (it ends after ",
                            position_ + static_cast<int64_t>(produced), " decompressed bytes)"));
    if (rc == Z_MEM_ERROR) throw std::bad_alloc();  // as every other allocation failure
    if (rc != Z_OK && rc != Z_BUF_ERROR)  // zlib's reason, never its bare return code ("-3")
      throw FormatError(str(what_, ": corrupt ", name(), " data (", zs.msg ? zs.msg : "zlib gives no reason", ")"));
  }
  position_ += static_cast<int64_t>(produced);
  return produced;
}

}  // namespace mmt::detail
