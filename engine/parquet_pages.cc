// A Parquet column chunk's pages: their headers, codecs, levels and value encodings
// (parquet-format's README.md, Encodings.md and Compression.md), decoded into one column's
// levels and present values. Every size is checked before it is used; a codec must produce
// exactly the size its page states.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <limits>
#include <thread>

#include <brotli/decode.h>
#include <lz4.h>
#include <snappy.h>
#include <zlib.h>
#include <unistd.h>
#include <zstd.h>

#include "decode_limit.h"
#include "parquet.h"
#include "thrift_compact.h"
#include "utf8.h"

namespace mmt::detail {

namespace {

enum Codec : int { kUncompressed = 0, kSnappy, kGzip, kLzo, kBrotli, kLz4Hadoop, kZstd, kLz4Raw };
enum Encoding : int {
  kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kDeltaBinaryPacked = 5, kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7, kRleDictionary = 8, kByteStreamSplit = 9,
};
enum PageType : int { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

const char* encoding_name(int e) {
  switch (e) {
    case kPlain: return "PLAIN";
    case kPlainDictionary: return "PLAIN_DICTIONARY";
    case kRle: return "RLE";
    case kBitPacked: return "BIT_PACKED";
    case kDeltaBinaryPacked: return "DELTA_BINARY_PACKED";
    case kDeltaLengthByteArray: return "DELTA_LENGTH_BYTE_ARRAY";
    case kDeltaByteArray: return "DELTA_BYTE_ARRAY";
    case kRleDictionary: return "RLE_DICTIONARY";
    case kByteStreamSplit: return "BYTE_STREAM_SPLIT";
    default: return "an unknown encoding";
  }
}

const char* type_name(ParquetType t) {
  switch (t) {
    case ParquetType::Boolean: return "BOOLEAN";
    case ParquetType::Int32: return "INT32";
    case ParquetType::Int64: return "INT64";
    case ParquetType::Int96: return "INT96";
    case ParquetType::Float: return "FLOAT";
    case ParquetType::Double: return "DOUBLE";
    case ParquetType::ByteArray: return "BYTE_ARRAY";
    case ParquetType::FixedLenByteArray: return "FIXED_LEN_BYTE_ARRAY";
    default: return "a group";
  }
}

using Bytes = std::span<const std::byte>;

// Errors name the file, row group, column and page.
struct Where {
  const std::string& base;
  int64_t page = -1;
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError(page >= 0 ? str(base, ", the page at byte ", page, ": ", why) : str(base, ": ", why));
  }
  [[noreturn]] void refuse(const std::string& why) const {
    throw ValueError(page >= 0 ? str(base, ", the page at byte ", page, ": ", why) : str(base, ": ", why));
  }
};

uint32_t load_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint32_t load_u32_big_endian(const std::byte* p) { return __builtin_bswap32(load_u32(p)); }

// --- Codecs ---------------------------------------------------------------------------------

// Output grown as a codec produces it (never past `expected`), so a page that states a huge
// size but holds little costs only what it holds.
class GrowingOutput {
 public:
  GrowingOutput(std::vector<std::byte>& out, size_t expected, size_t input) : out_(out), expected_(expected) {
    out_.resize(std::min(expected, std::max<size_t>(size_t{1} << 16, input * 4)));
  }
  // Room after `produced`: more when full, none once `expected` bytes are out.
  bool grow(size_t produced) {
    if (produced < out_.size()) return true;
    if (out_.size() >= expected_) return false;
    out_.resize(std::min(expected_, out_.size() * 2));
    return true;
  }
  std::byte* data() { return out_.data(); }
  size_t size() const { return out_.size(); }

 private:
  std::vector<std::byte>& out_;
  size_t expected_;
};

void decompress_zstd(Bytes in, size_t expected, std::vector<std::byte>& out, const Where& where) {
  ZSTD_DCtx* context = ZSTD_createDCtx();
  if (context == nullptr) throw std::bad_alloc();
  GrowingOutput growing(out, expected, in.size());
  ZSTD_inBuffer source{in.data(), in.size(), 0};
  size_t produced = 0, last = 1;
  while (source.pos < source.size || last != 0) {
    if (!growing.grow(produced)) {
      ZSTD_freeDCtx(context);
      where.fail(str("its zstd data decompresses to more than the ", expected, " bytes stated"));
    }
    ZSTD_outBuffer target{growing.data(), growing.size(), produced};
    const size_t before_in = source.pos, before_out = produced;
    last = ZSTD_decompressStream(context, &target, &source);
    produced = target.pos;
    if (ZSTD_isError(last)) {
      const std::string why = ZSTD_getErrorName(last);
      ZSTD_freeDCtx(context);
      where.fail(str("its zstd data does not decompress (", why, ")"));
    }
    if (source.pos == before_in && produced == before_out && produced < growing.size()) {
      ZSTD_freeDCtx(context);
      where.fail("its zstd data is cut short");
    }
  }
  ZSTD_freeDCtx(context);
  if (produced != expected) where.fail(str("its zstd data decompresses to ", produced, " bytes, not the ", expected, " stated"));
}

void decompress_gzip(Bytes in, size_t expected, std::vector<std::byte>& out, const Where& where) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) throw std::bad_alloc();  // gzip or zlib wrapper
  GrowingOutput growing(out, expected, in.size());
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  size_t consumed = 0, produced = 0;
  const auto fail = [&](const std::string& why) {
    inflateEnd(&z);
    where.fail(why);
  };
  for (;;) {
    const size_t in_now = std::min<size_t>(in.size() - consumed, std::numeric_limits<uInt>::max());
    z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data() + consumed));
    z.avail_in = static_cast<uInt>(in_now);
    if (!growing.grow(produced)) fail(str("its gzip data decompresses to more than the ", expected, " bytes stated"));
    const size_t out_now = std::min<size_t>(growing.size() - produced, std::numeric_limits<uInt>::max());
    z.next_out = reinterpret_cast<Bytef*>(growing.data() + produced);
    z.avail_out = static_cast<uInt>(out_now);
    const int rc = inflate(&z, Z_NO_FLUSH);
    consumed += in_now - z.avail_in;
    produced += out_now - z.avail_out;
    if (rc == Z_STREAM_END) {
      if (consumed == in.size()) break;
      if (inflateReset(&z) != Z_OK) fail("its gzip data does not decompress");  // another member follows
      continue;
    }
    if (rc == Z_BUF_ERROR && z.avail_out != 0) fail("its gzip data is cut short");
    if (rc != Z_OK && rc != Z_BUF_ERROR) fail(str("its gzip data does not decompress (", z.msg ? z.msg : "damaged", ")"));
  }
  inflateEnd(&z);
  if (produced != expected) where.fail(str("its gzip data decompresses to ", produced, " bytes, not the ", expected, " stated"));
}

void decompress_brotli(Bytes in, size_t expected, std::vector<std::byte>& out, const Where& where) {
  BrotliDecoderState* state = BrotliDecoderCreateInstance(nullptr, nullptr, nullptr);
  if (state == nullptr) throw std::bad_alloc();
  GrowingOutput growing(out, expected, in.size());
  size_t available_in = in.size(), produced = 0;
  const auto* next_in = reinterpret_cast<const uint8_t*>(in.data());
  for (;;) {
    size_t available_out = growing.size() - produced;
    auto* next_out = reinterpret_cast<uint8_t*>(growing.data() + produced);
    const BrotliDecoderResult result =
        BrotliDecoderDecompressStream(state, &available_in, &next_in, &available_out, &next_out, nullptr);
    produced = growing.size() - available_out;
    if (result == BROTLI_DECODER_RESULT_SUCCESS) break;
    std::string why;
    if (result == BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT) {
      if (growing.grow(produced)) continue;
      why = str("its brotli data decompresses to more than the ", expected, " bytes stated");
    } else if (result == BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT) {
      why = "its brotli data is cut short";
    } else {
      why = str("its brotli data does not decompress (",
                BrotliDecoderErrorString(BrotliDecoderGetErrorCode(state)), ")");
    }
    BrotliDecoderDestroyInstance(state);
    where.fail(why);
  }
  BrotliDecoderDestroyInstance(state);
  if (produced != expected) where.fail(str("its brotli data decompresses to ", produced, " bytes, not the ", expected, " stated"));
}

// LZ4's block format has a largest ratio (255 bytes of a match a byte), snappy's too: a page
// stating more than its bytes could hold is refused before anything is allocated.
void check_ratio(Bytes in, size_t expected, size_t ratio, const char* codec, const Where& where) {
  if (expected / ratio > in.size() + 64)
    where.fail(str("states ", expected, " decompressed bytes, more than ", in.size(), " bytes of ", codec, " can hold"));
}

bool lz4_block(Bytes in, std::byte* out, size_t expected) {
  if (in.size() > INT32_MAX || expected > INT32_MAX) return false;
  const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()), reinterpret_cast<char*>(out),
                                      static_cast<int>(in.size()), static_cast<int>(expected));
  return got >= 0 && static_cast<size_t>(got) == expected;
}

// The deprecated LZ4 codec: Hadoop's framing (big-endian decompressed and compressed sizes,
// then an LZ4 block, repeated), or, as some writers made it, one bare block.
bool lz4_hadoop(Bytes in, std::byte* out, size_t expected) {
  size_t at = 0, produced = 0;
  while (at < in.size()) {
    if (in.size() - at < 8) return false;
    const uint32_t decompressed = load_u32_big_endian(in.data() + at);
    const uint32_t compressed = load_u32_big_endian(in.data() + at + 4);
    at += 8;
    if (compressed > in.size() - at || decompressed > expected - produced) return false;
    if (!lz4_block(in.subspan(at, compressed), out + produced, decompressed)) return false;
    at += compressed;
    produced += decompressed;
  }
  return produced == expected;
}

void decompress(int codec, Bytes in, size_t expected, std::vector<std::byte>& out, const Where& where) {
  if (codec != kUncompressed && codec != kLzo && expected == 0) {
    // Nothing to decompress: writers compress an empty values section (arrow's zstd frame of
    // nothing) or leave it empty (Spark's V2 pages of nulls); readers take either.
    out.clear();
    return;
  }
  switch (codec) {
    case kUncompressed:
      if (in.size() != expected)
        where.fail(str("is uncompressed but holds ", in.size(), " bytes, not the ", expected, " stated"));
      out.assign(in.begin(), in.end());
      return;
    case kSnappy: {
      size_t stated = 0;
      if (!snappy::GetUncompressedLength(reinterpret_cast<const char*>(in.data()), in.size(), &stated) ||
          stated != expected)
        where.fail(str("its snappy data states ", stated, " decompressed bytes, not the ", expected, " stated"));
      check_ratio(in, expected, 32, "snappy", where);
      out.resize(expected);
      if (!snappy::RawUncompress(reinterpret_cast<const char*>(in.data()), in.size(), reinterpret_cast<char*>(out.data())))
        where.fail("its snappy data does not decompress");
      return;
    }
    case kGzip: return decompress_gzip(in, expected, out, where);
    case kBrotli: return decompress_brotli(in, expected, out, where);
    case kZstd: return decompress_zstd(in, expected, out, where);
    case kLz4Raw:
    case kLz4Hadoop:
      check_ratio(in, expected, 256, "LZ4", where);
      out.resize(expected);
      if (codec == kLz4Hadoop && lz4_hadoop(in, out.data(), expected)) return;
      if (!lz4_block(in, out.data(), expected))
        where.fail(str("its LZ4 data does not decompress to the ", expected, " bytes stated"));
      return;
    case kLzo: where.refuse("compressed with LZO, which this reader does not read; rewrite it with another codec");
    default: where.fail(str("compressed with codec ", codec, ", which Parquet does not define"));
  }
}

// --- Bits ------------------------------------------------------------------------------------

// `width` bits (0 to 64) from bit `bit` of `data` (`n` bytes), least significant bit first.
uint64_t bits_at(const std::byte* data, size_t n, uint64_t bit, int width) {
  if (width == 0) return 0;
  const size_t first = bit / 8;
  const int shift = static_cast<int>(bit % 8);
  if (width <= 56 && first + 8 <= n) {
    uint64_t v;
    std::memcpy(&v, data + first, 8);
    return (v >> shift) & ((uint64_t{1} << width) - 1);
  }
  unsigned __int128 v = 0;
  const size_t bytes = (static_cast<size_t>(shift) + static_cast<size_t>(width) + 7) / 8;
  for (size_t i = 0; i < bytes && first + i < n; ++i) v |= static_cast<unsigned __int128>(static_cast<uint8_t>(data[first + i])) << (8 * i);
  v >>= shift;
  return width == 64 ? static_cast<uint64_t>(v) : static_cast<uint64_t>(v) & ((uint64_t{1} << width) - 1);
}

int bit_width_of(int64_t max_value) {
  int w = 0;
  while (w < 63 && (int64_t{1} << w) <= max_value) ++w;
  return w;
}

// A varint from `in` at `at` (moved past it).
uint64_t varint(Bytes in, size_t& at, const Where& where, const char* what) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= in.size()) where.fail(str("its ", what, " are cut short"));
    const auto b = static_cast<uint8_t>(in[at++]);
    value |= uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80) == 0) return value;
  }
  where.fail(str("its ", what, " hold a varint longer than 10 bytes"));
}
int64_t zigzag(uint64_t v) { return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1)); }

// The RLE / bit-packing hybrid (Encodings.md): runs, each a varint header whose low bit says
// bit-packed (groups of 8 values, `width` bits each) or repeated (a value in ceil(width / 8)
// bytes, header >> 1 times). Decodes `count` values into `out` with `store(index, value)`,
// and each repeated run with `store_run(first, n, value)`; returns the bytes read.
template <class Store, class StoreRun>
size_t decode_hybrid(Bytes in, int width, int64_t count, const Where& where, const char* what, Store&& store,
                     StoreRun&& store_run) {
  size_t at = 0;
  int64_t done = 0;
  const size_t value_bytes = (static_cast<size_t>(width) + 7) / 8;
  while (done < count) {
    const uint64_t header = varint(in, at, where, what);
    if (header & 1) {
      const uint64_t groups = header >> 1;
      if (groups == 0 || groups > in.size()) where.fail(str("its ", what, " hold a bit-packed run of ", groups, " groups"));
      const uint64_t values = groups * 8;
      const size_t bytes = static_cast<size_t>(groups) * static_cast<size_t>(width);
      // A writer may end the last run early; the values it holds are read.
      const size_t available = std::min(bytes, in.size() - at);
      const int64_t take = static_cast<int64_t>(std::min<uint64_t>(values, static_cast<uint64_t>(count - done)));
      if (width > 0 && static_cast<uint64_t>(take) * static_cast<uint64_t>(width) > available * 8)
        where.fail(str("its ", what, " are cut short in a bit-packed run"));
      for (int64_t i = 0; i < take; ++i)
        store(done + i, bits_at(in.data() + at, available, static_cast<uint64_t>(i) * static_cast<uint64_t>(width), width));
      done += take;
      at += available;
    } else {
      const uint64_t run = header >> 1;
      if (run == 0) where.fail(str("its ", what, " hold a run of length 0"));
      if (in.size() - at < value_bytes) where.fail(str("its ", what, " are cut short in a repeated run"));
      uint64_t value = 0;
      for (size_t i = 0; i < value_bytes; ++i) value |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
      at += value_bytes;
      const int64_t take = static_cast<int64_t>(std::min<uint64_t>(run, static_cast<uint64_t>(count - done)));
      store_run(done, take, value);
      done += take;
    }
  }
  return at;
}
template <class Store>
size_t decode_hybrid(Bytes in, int width, int64_t count, const Where& where, const char* what, Store&& store) {
  return decode_hybrid(in, width, count, where, what, store, [&](int64_t first, int64_t n, uint64_t value) {
    for (int64_t i = 0; i < n; ++i) store(first + i, value);
  });
}

// Levels of `count` entries, each at most `max` (RLE: the hybrid; BIT_PACKED: the deprecated
// packing, most significant bit first), appended to `out`.
void decode_levels(Bytes in, int encoding, int16_t max, int64_t count, std::vector<uint8_t>& out, const Where& where,
                   const char* what) {
  const int width = bit_width_of(max);
  const size_t first = out.size();
  out.resize(first + static_cast<size_t>(count));
  uint8_t* levels = out.data() + first;
  bool bad = false;
  if (encoding == kRle) {
    decode_hybrid(
        in, width, count, where, what,
        [&](int64_t i, uint64_t v) {
          bad |= v > static_cast<uint64_t>(max);
          levels[i] = static_cast<uint8_t>(v);
        },
        [&](int64_t first_level, int64_t n, uint64_t v) {  // runs are most of a column's levels
          bad |= v > static_cast<uint64_t>(max);
          std::memset(levels + first_level, static_cast<int>(v & 0xFF), static_cast<size_t>(n));
        });
  } else if (encoding == kBitPacked) {
    if (static_cast<uint64_t>(count) * static_cast<uint64_t>(width) > in.size() * 8) where.fail(str("its ", what, " are cut short"));
    for (int64_t i = 0; i < count; ++i) {
      uint64_t v = 0;
      for (int b = 0; b < width; ++b) {
        const uint64_t bit = static_cast<uint64_t>(i) * static_cast<uint64_t>(width) + static_cast<uint64_t>(b);
        v = (v << 1) | ((static_cast<uint8_t>(in[bit / 8]) >> (7 - bit % 8)) & 1);
      }
      bad |= v > static_cast<uint64_t>(max);
      levels[i] = static_cast<uint8_t>(v);
    }
  } else {
    where.refuse(str("its ", what, " are encoded with ", encoding_name(encoding), ", which levels are not"));
  }
  if (bad) where.fail(str("its ", what, " hold a level past the column's maximum of ", max));
}

// --- Values ----------------------------------------------------------------------------------

// A column chunk's values and levels are held to decode_limit() of its bytes.
constexpr int64_t kExpansion = kDecodeExpansion;

// Counts `more` bytes decoded against the column chunk's limit, shared by the threads that
// decode parts of it: dictionaries and runs let a few bytes of a file stand for any number of
// values, and the values, their offsets and the levels are held to the limit together.
void charge(const ParquetColumnValues& out, uint64_t more, const Where& where) {
  bool over = more > static_cast<uint64_t>(out.limit);
  if (!over && out.charged != nullptr)
    over = out.charged->fetch_add(static_cast<int64_t>(more)) > out.limit - static_cast<int64_t>(more);
  if (over)
    where.refuse(str("decodes to more than ", out.limit, " bytes (", kExpansion,
                     " times its column chunk's bytes in the file, and at least an eighth of this machine's ",
                     "memory); such a file is refused as a decompression bomb"));
}

size_t value_width(const ParquetLeaf& leaf) {
  switch (leaf.type) {
    case ParquetType::Boolean: return 1;
    case ParquetType::Int32: case ParquetType::Float: return 4;
    case ParquetType::Int64: case ParquetType::Double: case ParquetType::Int96: return 8;
    case ParquetType::FixedLenByteArray: return static_cast<size_t>(leaf.type_length);
    default: return 0;  // ByteArray
  }
}

class ValueDecoder {
 public:
  ValueDecoder(const ParquetLeaf& leaf, ParquetColumnValues& out, const Where& where, std::vector<std::byte>& previous)
      : leaf_(leaf), out_(out), where_(where), previous_(previous), width_(value_width(leaf)) {}

  void decode(int encoding, Bytes in, int64_t n, const ParquetColumnValues* dictionary) {
    if (n == 0) return;
    switch (encoding) {
      case kPlain: return plain(in, n);
      case kPlainDictionary:
      case kRleDictionary: return dictionary_indices(in, n, dictionary);
      case kRle:
        if (leaf_.type != ParquetType::Boolean) break;
        return rle_booleans(in, n);
      case kDeltaBinaryPacked:
        if (leaf_.type != ParquetType::Int32 && leaf_.type != ParquetType::Int64) break;
        return delta_integers(in, n);
      case kDeltaLengthByteArray:
        if (leaf_.type != ParquetType::ByteArray) break;
        return delta_length_byte_arrays(in, n);
      case kDeltaByteArray:
        if (leaf_.type != ParquetType::ByteArray && leaf_.type != ParquetType::FixedLenByteArray) break;
        return delta_byte_arrays(in, n);
      case kByteStreamSplit:
        if (leaf_.type == ParquetType::Boolean || leaf_.type == ParquetType::ByteArray || leaf_.type == ParquetType::Int96) break;
        return byte_stream_split(in, n);
      default: break;
    }
    where_.refuse(str("values of ", type_name(leaf_.type), " encoded with ", encoding_name(encoding), " (",
                      encoding, "), which this reader does not read"));
  }

 private:
  std::byte* grow_fixed(int64_t n) {
    const size_t before = out_.values.size();
    room(static_cast<uint64_t>(n) * width_);
    out_.values.resize(before + static_cast<size_t>(n) * width_);
    out_.count += n;
    return out_.values.data() + before;
  }
  void add_bytes(const std::byte* p, size_t n) {
    room(n + sizeof(int64_t));  // its bytes and its offset
    out_.values.insert(out_.values.end(), p, p + n);
    out_.offsets.push_back(static_cast<int64_t>(out_.values.size()));
    ++out_.count;
  }
  void room(uint64_t more) const { charge(out_, more, where_); }
  void need(Bytes in, uint64_t bytes, const char* what) const {
    if (bytes > in.size()) where_.fail(str("its ", what, " need ", bytes, " bytes, but the page holds ", in.size()));
  }

  void plain(Bytes in, int64_t n) {
    switch (leaf_.type) {
      case ParquetType::Boolean: {
        need(in, (static_cast<uint64_t>(n) + 7) / 8, "PLAIN booleans");
        std::byte* p = grow_fixed(n);
        for (int64_t i = 0; i < n; ++i) p[i] = std::byte{static_cast<uint8_t>((static_cast<uint8_t>(in[static_cast<size_t>(i / 8)]) >> (i % 8)) & 1)};
        return;
      }
      case ParquetType::Int96: {
        need(in, static_cast<uint64_t>(n) * 12, "PLAIN INT96 values");
        auto* p = grow_fixed(n);
        for (int64_t i = 0; i < n; ++i) {
          // Nanoseconds of the day (int64), then the Julian day (int32): made nanoseconds
          // since the Unix epoch (Julian day 2440588), as pyarrow reads them.
          int64_t nanos;
          int32_t day;
          std::memcpy(&nanos, in.data() + 12 * i, 8);
          std::memcpy(&day, in.data() + 12 * i + 8, 4);
          int64_t value = 0;
          if (__builtin_mul_overflow(int64_t{day} - 2440588, int64_t{86400} * 1000000000, &value) ||
              __builtin_add_overflow(value, nanos, &value))
            where_.refuse(str("an INT96 timestamp (Julian day ", day, ") outside what int64 nanoseconds hold"));
          std::memcpy(p + 8 * i, &value, 8);
        }
        return;
      }
      case ParquetType::ByteArray: {
        size_t at = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (in.size() - at < 4) where_.fail(str("its PLAIN byte arrays are cut short at value ", i, " of ", n));
          const uint32_t length = load_u32(in.data() + at);
          at += 4;
          if (length > in.size() - at) where_.fail(str("its PLAIN byte array ", i, " of ", length, " bytes runs past the page"));
          add_bytes(in.data() + at, length);
          at += length;
        }
        return;
      }
      default: {
        need(in, static_cast<uint64_t>(n) * width_, "PLAIN values");
        std::memcpy(grow_fixed(n), in.data(), static_cast<size_t>(n) * width_);
        return;
      }
    }
  }

  void dictionary_indices(Bytes in, int64_t n, const ParquetColumnValues* dictionary) {
    if (dictionary == nullptr) where_.fail("has dictionary-encoded values but its column chunk has no dictionary page");
    if (in.empty()) where_.fail("its dictionary indices are missing");
    const int width = static_cast<int>(static_cast<uint8_t>(in[0]));
    if (width > 32) where_.fail(str("its dictionary indices are ", width, " bits wide"));
    const uint64_t size = static_cast<uint64_t>(dictionary->count);
    bool bad = false;
    if (leaf_.type == ParquetType::ByteArray) {
      decode_hybrid(in.subspan(1), width, n, where_, "dictionary indices", [&](int64_t, uint64_t index) {
        if (index >= size) return void(bad = true);
        const int64_t start = dictionary->offsets[index], end = dictionary->offsets[index + 1];
        add_bytes(dictionary->values.data() + start, static_cast<size_t>(end - start));
      });
    } else {
      std::byte* p = grow_fixed(n);
      decode_hybrid(in.subspan(1), width, n, where_, "dictionary indices", [&](int64_t i, uint64_t index) {
        if (index >= size) return void(bad = true);
        std::memcpy(p + static_cast<size_t>(i) * width_, dictionary->values.data() + index * width_, width_);
      });
    }
    if (bad) where_.fail(str("has a dictionary index past its dictionary's ", size, " values"));
  }

  void rle_booleans(Bytes in, int64_t n) {
    need(in, 4, "RLE booleans' length");
    const uint32_t length = load_u32(in.data());
    need(in.subspan(4), length, "RLE booleans");
    std::byte* p = grow_fixed(n);
    bool bad = false;
    decode_hybrid(in.subspan(4, length), 1, n, where_, "RLE booleans", [&](int64_t i, uint64_t v) {
      bad |= v > 1;
      p[i] = std::byte{static_cast<uint8_t>(v & 1)};
    });
    if (bad) where_.fail("its RLE booleans hold a value other than 0 and 1");
  }

  // DELTA_BINARY_PACKED: `n` integers into `store(i, value)`; returns the bytes read.
  template <class Store>
  size_t delta_binary_packed(Bytes in, int64_t n, Store&& store) const {
    size_t at = 0;
    const uint64_t block = varint(in, at, where_, "delta header");
    const uint64_t miniblocks = varint(in, at, where_, "delta header");
    const uint64_t total = varint(in, at, where_, "delta header");
    uint64_t value = static_cast<uint64_t>(zigzag(varint(in, at, where_, "delta header")));
    if (block == 0 || block % 128 != 0 || block > (uint64_t{1} << 20) || miniblocks == 0 || block % miniblocks != 0 ||
        (block / miniblocks) % 32 != 0)
      where_.fail(str("its DELTA_BINARY_PACKED header states blocks of ", block, " values in ", miniblocks, " miniblocks"));
    if (total < static_cast<uint64_t>(n))
      where_.fail(str("its DELTA_BINARY_PACKED values number ", total, ", fewer than the page's ", n));
    const uint64_t per_miniblock = block / miniblocks;
    store(0, value);
    int64_t done = 1;
    while (done < n) {
      const uint64_t min_delta = static_cast<uint64_t>(zigzag(varint(in, at, where_, "delta blocks")));
      if (in.size() - at < miniblocks) where_.fail("its DELTA_BINARY_PACKED bit widths are cut short");
      const size_t widths = at;
      at += miniblocks;
      for (uint64_t m = 0; m < miniblocks && done < n; ++m) {
        const int width = static_cast<int>(static_cast<uint8_t>(in[widths + m]));
        if (width > 64) where_.fail(str("its DELTA_BINARY_PACKED miniblock is ", width, " bits wide"));
        const size_t bytes = static_cast<size_t>(per_miniblock) * static_cast<size_t>(width) / 8;
        if (in.size() - at < bytes) where_.fail("its DELTA_BINARY_PACKED miniblocks are cut short");
        const int64_t take = static_cast<int64_t>(std::min<uint64_t>(per_miniblock, static_cast<uint64_t>(n - done)));
        for (int64_t i = 0; i < take; ++i) {
          value += min_delta + bits_at(in.data() + at, bytes, static_cast<uint64_t>(i) * static_cast<uint64_t>(width), width);
          store(done + i, value);
        }
        done += take;
        at += bytes;
      }
    }
    return at;
  }

  void delta_integers(Bytes in, int64_t n) {
    std::byte* p = grow_fixed(n);
    if (leaf_.type == ParquetType::Int32) {
      delta_binary_packed(in, n, [&](int64_t i, uint64_t v) {
        const auto narrow = static_cast<uint32_t>(v);
        std::memcpy(p + 4 * i, &narrow, 4);
      });
    } else {
      delta_binary_packed(in, n, [&](int64_t i, uint64_t v) { std::memcpy(p + 8 * i, &v, 8); });
    }
  }

  // Lengths (DELTA_BINARY_PACKED), then the bytes one after another.
  std::vector<int64_t> lengths(Bytes in, int64_t n, size_t& at, const char* what) const {
    room(static_cast<uint64_t>(n) * sizeof(int64_t));
    std::vector<int64_t> out(static_cast<size_t>(n));
    bool bad = false;
    at = delta_binary_packed(in, n, [&](int64_t i, uint64_t v) {  // lengths are INT32s
      const auto length = static_cast<int32_t>(static_cast<uint32_t>(v));
      bad |= length < 0;
      out[static_cast<size_t>(i)] = length;
    });
    if (bad) where_.fail(str("its ", what, " hold a negative length"));
    return out;
  }

  void delta_length_byte_arrays(Bytes in, int64_t n) {
    size_t at = 0;
    const std::vector<int64_t> sizes = lengths(in, n, at, "DELTA_LENGTH_BYTE_ARRAY lengths");
    for (int64_t i = 0; i < n; ++i) {
      const auto length = static_cast<size_t>(sizes[static_cast<size_t>(i)]);
      if (length > in.size() - at) where_.fail(str("its DELTA_LENGTH_BYTE_ARRAY value ", i, " runs past the page"));
      add_bytes(in.data() + at, length);
      at += length;
    }
  }

  // Prefix lengths, then suffixes (DELTA_LENGTH_BYTE_ARRAY): each value the previous one's
  // first `prefix` bytes and its suffix.
  void delta_byte_arrays(Bytes in, int64_t n) {
    size_t at = 0;
    const std::vector<int64_t> prefixes = lengths(in, n, at, "DELTA_BYTE_ARRAY prefix lengths");
    size_t suffix_at = 0;
    const Bytes rest = in.subspan(at);
    const std::vector<int64_t> suffixes = lengths(rest, n, suffix_at, "DELTA_BYTE_ARRAY suffix lengths");
    std::vector<std::byte>& previous = previous_;
    std::vector<std::byte> value;
    for (int64_t i = 0; i < n; ++i) {
      const auto prefix = static_cast<size_t>(prefixes[static_cast<size_t>(i)]);
      const auto suffix = static_cast<size_t>(suffixes[static_cast<size_t>(i)]);
      if (prefix > previous.size()) where_.fail(str("its DELTA_BYTE_ARRAY value ", i, " takes a prefix of ", prefix,
                                                    " bytes from a value of ", previous.size()));
      if (suffix > rest.size() - suffix_at) where_.fail(str("its DELTA_BYTE_ARRAY value ", i, " runs past the page"));
      value.assign(previous.begin(), previous.begin() + static_cast<std::ptrdiff_t>(prefix));
      value.insert(value.end(), rest.data() + suffix_at, rest.data() + suffix_at + suffix);
      suffix_at += suffix;
      if (leaf_.type == ParquetType::FixedLenByteArray) {
        if (value.size() != width_) where_.fail(str("its DELTA_BYTE_ARRAY value ", i, " has ", value.size(),
                                                    " bytes, not the column's ", width_));
        std::memcpy(grow_fixed(1), value.data(), width_);
      } else {
        add_bytes(value.data(), value.size());
      }
      previous.swap(value);
    }
  }

  // Byte k of every value, then byte k + 1...
  void byte_stream_split(Bytes in, int64_t n) {
    need(in, static_cast<uint64_t>(n) * width_, "BYTE_STREAM_SPLIT values");
    std::byte* p = grow_fixed(n);
    for (size_t k = 0; k < width_; ++k) {
      const std::byte* stream = in.data() + k * static_cast<size_t>(n);
      for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i) * width_ + k] = stream[i];
    }
  }

  const ParquetLeaf& leaf_;
  ParquetColumnValues& out_;
  const Where& where_;
  std::vector<std::byte>& previous_;
  size_t width_;
};

struct PageHeader {
  int type = -1;
  int64_t uncompressed = -1, compressed = -1;
  // DataPageHeader, DictionaryPageHeader, DataPageHeaderV2
  int64_t num_values = -1, num_nulls = 0, num_rows = 0;
  int encoding = -1, definition_encoding = kRle, repetition_encoding = kRle;
  int64_t definition_bytes = 0, repetition_bytes = 0;
  bool is_compressed = true;
};

PageHeader read_page_header(ThriftReader& in) {
  PageHeader h;
  in.read_struct([&](int16_t id, ThriftType type) {
    switch (id) {
      case 1: h.type = static_cast<int>(in.integer(type, INT32_MIN, INT32_MAX, "a page type")); break;
      case 2: h.uncompressed = in.integer(type, 0, INT32_MAX, "an uncompressed page size"); break;
      case 3: h.compressed = in.integer(type, 0, INT32_MAX, "a compressed page size"); break;
      case 5: case 7: case 8:
        if (type != ThriftType::Struct) return in.skip(type);
        in.read_struct([&](int16_t f, ThriftType t) {
          if (f == 1) return void(h.num_values = in.integer(t, 0, INT32_MAX, "a page's value count"));
          if (id == 8) {  // DataPageHeaderV2
            switch (f) {
              case 2: h.num_nulls = in.integer(t, 0, INT32_MAX, "a null count"); return;
              case 3: h.num_rows = in.integer(t, 0, INT32_MAX, "a page's row count"); return;
              case 4: h.encoding = static_cast<int>(in.integer(t, 0, INT32_MAX, "an encoding")); return;
              case 5: h.definition_bytes = in.integer(t, 0, INT32_MAX, "a definition levels' size"); return;
              case 6: h.repetition_bytes = in.integer(t, 0, INT32_MAX, "a repetition levels' size"); return;
              case 7: h.is_compressed = in.boolean(t); return;
              default: return in.skip(t);
            }
          }
          if (f == 2) return void(h.encoding = static_cast<int>(in.integer(t, 0, INT32_MAX, "an encoding")));
          if (id == 5 && f == 3) return void(h.definition_encoding = static_cast<int>(in.integer(t, 0, INT32_MAX, "an encoding")));
          if (id == 5 && f == 4) return void(h.repetition_encoding = static_cast<int>(in.integer(t, 0, INT32_MAX, "an encoding")));
          in.skip(t);
        });
        break;
      default: in.skip(type); break;
    }
  });
  return h;
}

// The bytes a slot of the leaf's values takes in Arrow's layout (an int64 offset for bytes; a
// byte for a bool, as decoded; INT96 as int64 nanoseconds).
uint64_t arrow_slot_bytes(const ParquetLeaf& leaf) {
  switch (leaf.type) {
    case ParquetType::Boolean: return 1;
    case ParquetType::Int32:
    case ParquetType::Float: return 4;
    case ParquetType::FixedLenByteArray: return static_cast<uint64_t>(std::max(leaf.type_length, 1));
    default: return 8;  // Int64, Int96, Double, ByteArray's offsets
  }
}

// The count of entries whose definition level is the maximum (values present).
int64_t present(const std::vector<uint8_t>& definition, size_t first, int16_t max) {
  return std::count(definition.begin() + static_cast<std::ptrdiff_t>(first), definition.end(), static_cast<uint8_t>(max));
}


// A data page found by the scan of a column chunk: its header, where it lies, its bytes.
struct DataPage {
  PageHeader header;
  int64_t position = 0;  // its header's first byte
  Bytes stored;
};

// Decodes data page `p` of a column chunk (codec `codec`) into `out`, appending to its levels
// and values; `page` is scratch memory for its decompressed bytes.
void decode_data_page(const DataPage& p, int codec, const ParquetLeaf& leaf, const ParquetColumnValues* dictionary,
                      ParquetColumnValues& out, std::vector<std::byte>& page, std::vector<std::byte>& previous,
                      const std::string& where_text) {
  const Where where{where_text, p.position};
  const PageHeader& h = p.header;
  const int64_t level_bytes = (leaf.max_definition > 0 ? 1 : 0) + (leaf.max_repetition > 0 ? 1 : 0);
  charge(out, static_cast<uint64_t>(h.num_values) * static_cast<uint64_t>(level_bytes), where);
  Bytes values;
  const size_t definition_first = out.definition.size();
  if (h.type == kDataPage) {
    decompress(codec, p.stored, static_cast<size_t>(h.uncompressed), page, where);
    Bytes rest = page;
    // Repetition levels, then definition levels, each (RLE) after its int32 size.
    const auto levels = [&](int encoding, int16_t max, std::vector<uint8_t>& into, const char* what) {
      if (max == 0) return;
      if (encoding == kRle) {
        if (rest.size() < 4) where.fail(str("its ", what, " are cut short"));
        const uint32_t size = load_u32(rest.data());
        if (size > rest.size() - 4) where.fail(str("its ", what, " of ", size, " bytes run past the page"));
        decode_levels(rest.subspan(4, size), encoding, max, h.num_values, into, where, what);
        rest = rest.subspan(4 + size);
      } else {
        const size_t size = (static_cast<size_t>(h.num_values) * static_cast<size_t>(bit_width_of(max)) + 7) / 8;
        if (size > rest.size()) where.fail(str("its ", what, " are cut short"));
        decode_levels(rest.subspan(0, size), encoding, max, h.num_values, into, where, what);
        rest = rest.subspan(size);
      }
    };
    levels(h.repetition_encoding, leaf.max_repetition, out.repetition, "repetition levels");
    levels(h.definition_encoding, leaf.max_definition, out.definition, "definition levels");
    values = rest;
  } else {
    // V2: the levels (RLE, without sizes) are never compressed; the values may be.
    if (h.repetition_bytes + h.definition_bytes > h.compressed || h.repetition_bytes + h.definition_bytes > h.uncompressed)
      where.fail(str("its levels' ", h.repetition_bytes + h.definition_bytes, " bytes exceed the page"));
    const Bytes repetition = p.stored.subspan(0, static_cast<size_t>(h.repetition_bytes));
    const Bytes definition = p.stored.subspan(static_cast<size_t>(h.repetition_bytes), static_cast<size_t>(h.definition_bytes));
    if (leaf.max_repetition > 0)
      decode_levels(repetition, kRle, leaf.max_repetition, h.num_values, out.repetition, where, "repetition levels");
    if (leaf.max_definition > 0)
      decode_levels(definition, kRle, leaf.max_definition, h.num_values, out.definition, where, "definition levels");
    const Bytes body = p.stored.subspan(static_cast<size_t>(h.repetition_bytes + h.definition_bytes));
    const auto body_size = static_cast<size_t>(h.uncompressed - h.repetition_bytes - h.definition_bytes);
    // Writers before Arrow 3 marked compressed values uncompressed (ARROW-10353): values of
    // another size than stated are decompressed.
    if (codec != kUncompressed && (h.is_compressed || body.size() != body_size)) {
      decompress(codec, body, body_size, page, where);
      values = page;
    } else {
      if (body.size() != body_size) where.fail(str("its values hold ", body.size(), " bytes, not the ", body_size, " stated"));
      values = body;
    }
  }
  const int64_t n = leaf.max_definition == 0 ? h.num_values : present(out.definition, definition_first, leaf.max_definition);
  // Entries without a value (nulls) take a slot of the value's width in Arrow's layout all
  // the same (an offset for bytes): counted now, before the assembly allocates them, or 335
  // bytes of runs of nulls would stand for 13 GB of slots at 1 byte of levels each.
  if (leaf.max_definition > 0) charge(out, static_cast<uint64_t>(h.num_values - n) * arrow_slot_bytes(leaf), where);
  const int64_t count_before = out.count;
  ValueDecoder(leaf, out, where, previous).decode(h.encoding, values, n, dictionary);
  if (out.count - count_before != n)
    where.fail(str("decodes ", out.count - count_before, " values, not the ", n, " its levels make present"));
  out.entries += h.num_values;
}

// Appends `part` (the pages after those of `out`) to `out`.
void append_part(ParquetColumnValues& out, const ParquetColumnValues& part) {
  out.definition.insert(out.definition.end(), part.definition.begin(), part.definition.end());
  out.repetition.insert(out.repetition.end(), part.repetition.begin(), part.repetition.end());
  const auto base = static_cast<int64_t>(out.values.size());
  out.values.insert(out.values.end(), part.values.begin(), part.values.end());
  if (!out.offsets.empty())
    for (size_t i = 1; i < part.offsets.size(); ++i) out.offsets.push_back(base + part.offsets[i]);
  out.entries += part.entries;
  out.count += part.count;
}

}  // namespace

void set_parquet_decode_floor(int64_t bytes) { set_decode_floor(bytes); }

ParquetByteRange parquet_chunk_range(const ParquetColumnChunk& chunk, int64_t data_end, const std::string& where_text) {
  const Where where{where_text};
  // The chunk begins at its dictionary page when it states one before its data pages (some
  // writers state 0 or none; a dictionary page first is then read as such anyway).
  int64_t begin = chunk.data_page_offset;
  if (chunk.dictionary_page_offset > 0 && chunk.dictionary_page_offset < begin) begin = chunk.dictionary_page_offset;
  if (begin < 4 || begin >= data_end)
    where.fail(str("its pages begin at byte ", begin, ", outside the data (bytes 4 to ", data_end, ")"));
  if (chunk.total_compressed_size <= 0 || chunk.total_compressed_size > data_end - begin)
    where.fail(str("states ", chunk.total_compressed_size, " bytes from byte ", begin, ", outside the data (bytes 4 to ",
                   data_end, ")"));
  // parquet-mr before 1.2.9 left the dictionary page's header out of the size (PARQUET-816):
  // up to 100 bytes more may be read, within the data.
  return {begin, std::min(data_end, begin + chunk.total_compressed_size + 100)};
}

void read_parquet_column(std::span<const std::byte> bytes, int64_t first_byte, const ParquetColumnChunk& chunk,
                         const ParquetLeaf& leaf, const std::string& where_text, ParquetColumnValues& out, int threads) {
  Where where{where_text};
  if (leaf.type == ParquetType::FixedLenByteArray && (leaf.type_length <= 0 || leaf.type_length > (1 << 24)))
    where.fail(str("a FIXED_LEN_BYTE_ARRAY of ", leaf.type_length, " bytes"));
  const int64_t limit = decode_limit(static_cast<int64_t>(bytes.size()));
  std::atomic<int64_t> charged{0};  // bytes decoded, by every part (ParquetColumnValues::charged)
  const auto reset = [&](ParquetColumnValues& values) {
    values.definition.clear();
    values.repetition.clear();
    values.values.clear();
    values.offsets.clear();
    values.entries = values.count = 0;
    values.limit = limit;
    values.charged = &charged;
    if (leaf.type == ParquetType::ByteArray) values.offsets.push_back(0);
  };
  reset(out);
  if (leaf.type == ParquetType::ByteArray) {
    // Room for the values as the chunk states them (a hint, held to what the chunk's bytes
    // could hold uncompressed): no copy as they grow.
    const auto hint = static_cast<size_t>(std::min<int64_t>(chunk.total_uncompressed_size,
                                                            static_cast<int64_t>(bytes.size()) * 64));
    if (hint > out.values.capacity()) out.values.reserve(hint);
  }
  ParquetColumnValues dictionary;
  bool has_dictionary = false;
  reset(dictionary);
  const auto chunk_end = static_cast<int64_t>(bytes.size());
  int64_t position = 0;  // in `bytes`; first_byte + position in the file

  // The pages' headers first (the dictionary decoded when met): the data pages may then be
  // decoded on several threads.
  std::vector<std::byte> page;
  // DELTA_BYTE_ARRAY's last value: parquet-mr before 1.8 let a page's first value take a prefix
  // of the page before's last (PARQUET-246), so those pages are decoded in order.
  std::vector<std::byte> previous;
  std::vector<DataPage> pages;
  bool carries_values = false;
  int64_t entries = 0;
  while (entries < chunk.num_values) {
    if (position >= chunk_end)
      where.fail(str("its pages end at byte ", first_byte + position, " with ", entries, " of its ", chunk.num_values,
                     " values"));
    where.page = first_byte + position;
    ThriftReader in(bytes.subspan(static_cast<size_t>(position)), str(where_text, ", the page header at byte ", where.page));
    const PageHeader h = read_page_header(in);
    const int64_t data_start = position + static_cast<int64_t>(in.position());
    if (h.compressed < 0 || h.uncompressed < 0) where.fail("its header lacks the page's sizes");
    if (h.compressed > chunk_end - data_start)
      where.fail(str("its ", h.compressed, " bytes run past the column chunk's end at byte ", first_byte + chunk_end));
    const Bytes stored = bytes.subspan(static_cast<size_t>(data_start), static_cast<size_t>(h.compressed));
    const int64_t page_position = first_byte + position;
    position = data_start + h.compressed;

    if (h.type != kDataPage && h.type != kDataPageV2 && h.type != kDictionaryPage) continue;  // an index page, or a kind from later
    if (h.num_values < 0) where.fail("its header lacks the page's value count");
    if (h.type == kDictionaryPage) {
      if (has_dictionary || !pages.empty()) where.fail("a dictionary page that is not the column chunk's first page");
      if (h.encoding != kPlain && h.encoding != kPlainDictionary)
        where.refuse(str("a dictionary page encoded with ", encoding_name(h.encoding)));
      decompress(chunk.codec, stored, static_cast<size_t>(h.uncompressed), page, where);
      ValueDecoder(leaf, dictionary, where, previous).decode(kPlain, page, h.num_values, nullptr);
      has_dictionary = true;
      continue;
    }
    if (h.num_values > chunk.num_values - entries)
      where.fail(str("holds ", h.num_values, " values, past its column chunk's ", chunk.num_values));
    entries += h.num_values;
    carries_values |= h.encoding == kDeltaByteArray;
    pages.push_back({h, page_position, stored});
  }
  const ParquetColumnValues* dictionary_read = has_dictionary ? &dictionary : nullptr;

  // Pages split into parts of about equal bytes, one a thread (the first into `out`), then
  // joined: for a chunk of many pages when threads are spare.
  size_t parts = 1;
  if (threads > 1 && !carries_values) parts = std::min<size_t>(static_cast<size_t>(threads), pages.size() / 2);
  if (parts <= 1) {
    for (const DataPage& p : pages) decode_data_page(p, chunk.codec, leaf, dictionary_read, out, page, previous, where_text);
  } else {
    int64_t total = 0;
    for (const DataPage& p : pages) total += static_cast<int64_t>(p.stored.size());
    std::vector<size_t> first_page{0};
    int64_t bytes = 0;
    for (size_t i = 0; i < pages.size() && first_page.size() < parts; ++i) {
      bytes += static_cast<int64_t>(pages[i].stored.size());
      if (bytes * static_cast<int64_t>(parts) >= total * static_cast<int64_t>(first_page.size()) && i + 1 < pages.size())
        first_page.push_back(i + 1);
    }
    first_page.push_back(pages.size());
    const size_t count = first_page.size() - 1;
    std::vector<ParquetColumnValues> rest(count);
    std::vector<std::exception_ptr> errors(count);
    const auto run = [&](size_t part) {
      try {
        ParquetColumnValues& into = part == 0 ? out : rest[part];
        if (part > 0) reset(into);
        std::vector<std::byte> own_page, own_previous;
        for (size_t i = first_page[part]; i < first_page[part + 1]; ++i)
          decode_data_page(pages[i], chunk.codec, leaf, dictionary_read, into, own_page, own_previous, where_text);
      } catch (...) {
        errors[part] = std::current_exception();
      }
    };
    {
      std::vector<std::jthread> workers;
      for (size_t part = 1; part < count; ++part) workers.emplace_back(run, part);
      run(0);
    }
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    for (size_t part = 1; part < count; ++part) append_part(out, rest[part]);
  }
  if (leaf.max_repetition > 0 && !out.repetition.empty() && out.repetition.front() != 0)
    Where{where_text, pages.front().position}.fail("its first value continues a list (repetition level above 0)");
}

}  // namespace mmt::detail
