// GzipReader: pulls decompressed bytes out of a gzip stream held in memory (a mapped file),
// so a reader that knows how many bytes it needs never allocates more than that. Handles
// concatenated gzip members (as `cat a.gz b.gz` or pigz produce) as one stream. Reads a zlib
// stream (RFC 1950: TensorFlow's ZLIB TFRecord files) as well, when told to.
//
// Errors are FormatErrors naming the source: a corrupt stream, a stream cut short, or bytes
// after the last member that are not another gzip member (after a zlib stream: any but zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace mmt::detail {

// True when `bytes` starts with the gzip magic 1f 8b.
bool is_gzip(std::span<const std::byte> bytes);

// Whether TensorFlow would call `bytes` a ZLIB stream: a zlib header (RFC 1950) of deflate,
// a window of at most 32 KiB, no preset dictionary, and a check that divides by 31.
bool is_zlib_start(std::span<const std::byte> bytes);

class GzipReader {
 public:
  // The wrapper around the deflate data: gzip's header and trailer (CRC-32 and size), or
  // zlib's (Adler-32); both checked.
  enum class Wrapper { Gzip, Zlib };

  // `compressed` must outlive the reader.
  GzipReader(std::span<const std::byte> compressed, std::string_view what, Wrapper wrapper = Wrapper::Gzip);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Decompresses up to n bytes into dst; returns fewer only when the stream has ended
  // cleanly. Throws FormatError when it is corrupt or truncated.
  size_t read(std::byte* dst, size_t n);
  // Decompressed bytes handed out so far.
  int64_t position() const { return position_; }

 private:
  const char* name() const { return wrapper_ == Wrapper::Gzip ? "gzip" : "zlib"; }
  struct State;
  std::unique_ptr<State> state_;
  std::span<const std::byte> input_;
  std::string what_;
  Wrapper wrapper_;
  size_t input_pos_ = 0;  // bytes of input given to zlib so far
  int64_t position_ = 0;
  bool ended_ = false;
};

}  // namespace mmt::detail
