#include <lz4.h>
#include <lz4hc.h>
// ZSTD_c_stableInBuffer and ZSTD_c_stableOutBuffer (zstd_compress_in_pieces) are in the
// experimental section; the library takes a stable input that grows between calls from 1.5.2
// on (checked at run time: the library is shared). Debian 12 ships 1.5.4.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <memory>
#include <utility>

#include "codec_engine.h"
#include "mmtensor/codec.h"
#include "mmtensor/error.h"
#include "utf8.h"

namespace mmt {

std::string_view to_string(Codec codec) {
  switch (codec) {
    case Codec::None: return "none";
    case Codec::LZ4: return "lz4";
    case Codec::Zstd: return "zstd";
  }
  return "invalid";
}

CodecSpec CodecSpec::parse(std::string_view text) {
  std::string_view name = text;
  std::string_view level_text;
  bool has_level = false;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    name = text.substr(0, colon);
    level_text = text.substr(colon + 1);
    has_level = true;
  }
  CodecSpec spec;
  int max_level = 0;
  if (name == "none") {
    spec.codec = Codec::None;
  } else if (name == "lz4") {
    spec.codec = Codec::LZ4;
    max_level = LZ4HC_CLEVEL_MAX;
  } else if (name == "zstd") {
    spec.codec = Codec::Zstd;
    max_level = ZSTD_maxCLevel();
  } else {
    throw ValueError(detail::str("unknown codec ", detail::quoted(text),
                                 ": expected none, lz4, lz4:LEVEL, zstd or zstd:LEVEL"));
  }
  if (has_level) {
    MMT_CHECK(spec.codec != Codec::None, ValueError, "codec 'none' takes no level, got ", detail::quoted(text));
    // Digits only (FORMAT.md): from_chars would also take a sign ("-0").
    const bool digits = !level_text.empty() && std::all_of(level_text.begin(), level_text.end(),
                                                           [](char c) { return c >= '0' && c <= '9'; });
    int level = -1;
    auto [end, ec] = std::from_chars(level_text.data(), level_text.data() + level_text.size(), level);
    MMT_CHECK(digits && ec == std::errc() && end == level_text.data() + level_text.size() && level >= 0 &&
                  level <= max_level,
              ValueError, "codec ", detail::quoted(text), ": level must be an integer in 0..", max_level);
    spec.level = level;
  }
  return spec;
}

std::string CodecSpec::str() const {
  std::string out(to_string(codec));
  if (codec != Codec::None && level != 0) {
    out += ':';  // not ":" + ...: gcc 12 warns falsely on it (-Wrestrict, its bug 105329)
    out += std::to_string(level);
  }
  return out;
}

namespace detail {
namespace {

// A zstd context per thread: creating one costs far more than compressing a small chunk.
struct ZstdContexts {
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> compress{ZSTD_createCCtx(), ZSTD_freeCCtx};
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> decompress{ZSTD_createDCtx(), ZSTD_freeDCtx};
  // Set while a frame is made in pieces: `stop` runs between them, and whatever it runs (a
  // Python signal handler) may compress on this thread too. It gets a context of its own
  // rather than reset this one mid-frame.
  bool compress_busy = false;
};
ZstdContexts& zstd_contexts() {
  thread_local ZstdContexts contexts;
  MMT_CHECK(contexts.compress && contexts.decompress, Error, "out of memory creating a zstd context");
  return contexts;
}

}  // namespace

int64_t max_codec_input_bytes() { return LZ4_MAX_INPUT_SIZE; }

int64_t compress_bound(Codec codec, int64_t src_bytes) {
  MMT_CHECK(src_bytes >= 0 && src_bytes <= max_codec_input_bytes(), ValueError,
            "cannot compress ", src_bytes, " bytes at once (at most ", max_codec_input_bytes(), ")");
  switch (codec) {
    case Codec::None: return src_bytes;
    case Codec::LZ4: return LZ4_compressBound(static_cast<int>(src_bytes));
    case Codec::Zstd: return static_cast<int64_t>(ZSTD_compressBound(static_cast<size_t>(src_bytes)));
  }
  throw ValueError(detail::str("unknown codec code ", static_cast<int>(codec)));
}

namespace {

using ZstdCompressContext = std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)>;

// One zstd frame made of kZstdPieceBytes pieces of src, `stop` asked before each but the
// first; -1 when it said to stop. The same bytes as ZSTD_compressCCtx makes.
int64_t zstd_compress_in_pieces(ZSTD_CCtx* context, int level, const void* src, int64_t src_bytes, void* dst,
                                int64_t dst_capacity, const std::function<bool()>& stop) {
  const auto check = [&](size_t code) {
    MMT_CHECK(!ZSTD_isError(code), Error, "zstd failed to compress ", src_bytes, " bytes: ", ZSTD_getErrorName(code));
    return code;
  };
  check(ZSTD_CCtx_reset(context, ZSTD_reset_session_and_parameters));
  check(ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel, level));
  // The whole input and the bound stay where they are, each piece only widening `in`: zstd
  // then reads and writes them in place, as one call does, and makes the same bytes (without
  // these, level 3 took 1.6-1.8 times as long, and its frame came out 0.1 % larger).
  check(ZSTD_CCtx_setParameter(context, ZSTD_c_stableInBuffer, 1));
  check(ZSTD_CCtx_setParameter(context, ZSTD_c_stableOutBuffer, 1));
  check(ZSTD_CCtx_setPledgedSrcSize(context, static_cast<unsigned long long>(src_bytes)));
  ZSTD_outBuffer out{dst, static_cast<size_t>(dst_capacity), 0};
  ZSTD_inBuffer in{src, 0, 0};
  while (true) {
    in.size = static_cast<size_t>(std::min<int64_t>(src_bytes, static_cast<int64_t>(in.size) + kZstdPieceBytes));
    if (in.size == static_cast<size_t>(src_bytes)) {  // the last piece, and the frame's end
      // dst holds the bound, so the frame ends; a full dst with bytes left would loop for ever.
      while (check(ZSTD_compressStream2(context, &out, &in, ZSTD_e_end)) != 0)
        MMT_CHECK(out.pos < out.size, Error, "zstd: ", src_bytes, " bytes compress to more than their bound");
      return static_cast<int64_t>(out.pos);
    }
    while (in.pos < in.size) {
      MMT_CHECK(out.pos < out.size, Error, "zstd: ", src_bytes, " bytes compress to more than their bound");
      check(ZSTD_compressStream2(context, &out, &in, ZSTD_e_continue));
    }
    if (stop && stop()) {
      ZSTD_CCtx_reset(context, ZSTD_reset_session_only);  // the frame is given up
      return -1;
    }
  }
}

int64_t zstd_compress(int level, const void* src, int64_t src_bytes, void* dst, int64_t dst_capacity,
                      const std::function<bool()>& stop) {
  static const bool pieces_supported = ZSTD_versionNumber() >= 10502;  // see the #define above
  ZstdContexts& contexts = zstd_contexts();
  ZstdCompressContext own{nullptr, ZSTD_freeCCtx};
  ZSTD_CCtx* context = contexts.compress.get();
  if (contexts.compress_busy) {  // called from `stop` of a frame in pieces on this thread
    own.reset(ZSTD_createCCtx());
    MMT_CHECK(own != nullptr, Error, "out of memory creating a zstd context");
    context = own.get();
  }
  if (stop && stop()) return -1;
  if (src_bytes > kZstdPiecesAboveBytes && pieces_supported) {
    const bool was_busy = std::exchange(contexts.compress_busy, true);
    struct Release {
      ZstdContexts& contexts;
      bool was_busy;
      ~Release() { contexts.compress_busy = was_busy; }
    } release{contexts, was_busy};
    return zstd_compress_in_pieces(context, level, src, src_bytes, dst, dst_capacity, stop);
  }
  const size_t n = ZSTD_compressCCtx(context, dst, static_cast<size_t>(dst_capacity), src, static_cast<size_t>(src_bytes), level);
  MMT_CHECK(!ZSTD_isError(n), Error, "zstd failed to compress ", src_bytes, " bytes: ", ZSTD_getErrorName(n));
  return static_cast<int64_t>(n);
}

}  // namespace

int64_t compress(const CodecSpec& spec, const void* src, int64_t src_bytes, void* dst,
                 int64_t dst_capacity, const std::function<bool()>& stop) {
  MMT_CHECK(dst_capacity >= compress_bound(spec.codec, src_bytes), ValueError,
            "compress: destination holds ", dst_capacity, " bytes, less than the bound ",
            compress_bound(spec.codec, src_bytes));
  switch (spec.codec) {
    case Codec::None:
      if (src_bytes > 0) std::memcpy(dst, src, static_cast<size_t>(src_bytes));
      return src_bytes;
    case Codec::LZ4: {
      int n = spec.level == 0
                  ? LZ4_compress_default(static_cast<const char*>(src), static_cast<char*>(dst),
                                         static_cast<int>(src_bytes), static_cast<int>(dst_capacity))
                  : LZ4_compress_HC(static_cast<const char*>(src), static_cast<char*>(dst),
                                    static_cast<int>(src_bytes), static_cast<int>(dst_capacity),
                                    spec.level);
      MMT_CHECK(n > 0 || src_bytes == 0, Error, "lz4 failed to compress ", src_bytes, " bytes");
      return n;
    }
    case Codec::Zstd:
      return zstd_compress(spec.level == 0 ? ZSTD_CLEVEL_DEFAULT : spec.level, src, src_bytes, dst, dst_capacity, stop);
  }
  throw ValueError(detail::str("unknown codec code ", static_cast<int>(spec.codec)));
}

void decompress(Codec codec, const void* src, int64_t src_bytes, void* dst, int64_t decoded_bytes,
                std::string_view what) {
  MMT_CHECK(src_bytes >= 0 && decoded_bytes >= 0, FormatError, what, ": negative codec sizes");
  switch (codec) {
    case Codec::None:
      MMT_CHECK(src_bytes == decoded_bytes, FormatError, what, ": stored ", src_bytes,
                " bytes but declares ", decoded_bytes, " decoded bytes without a codec");
      if (src_bytes > 0) std::memcpy(dst, src, static_cast<size_t>(src_bytes));
      return;
    case Codec::LZ4: {
      MMT_CHECK(src_bytes <= max_codec_input_bytes() && decoded_bytes <= max_codec_input_bytes(),
                FormatError, what, ": lz4 sizes exceed the codec's limit");
      int n = LZ4_decompress_safe(static_cast<const char*>(src), static_cast<char*>(dst),
                                  static_cast<int>(src_bytes), static_cast<int>(decoded_bytes));
      MMT_CHECK(n >= 0, FormatError, what, ": lz4 data is corrupt (", src_bytes, " stored bytes)");
      MMT_CHECK(n == decoded_bytes, FormatError, what, ": lz4 decoded ", n,
                " bytes but the chunk table declares ", decoded_bytes);
      return;
    }
    case Codec::Zstd: {
      // One frame, as the format says: the decoder would also accept concatenated and
      // skippable frames, which no writer of this format produces.
      const size_t frame_bytes = ZSTD_findFrameCompressedSize(src, static_cast<size_t>(src_bytes));
      MMT_CHECK(!ZSTD_isError(frame_bytes) && frame_bytes == static_cast<size_t>(src_bytes), FormatError, what,
                ": the ", src_bytes, " stored bytes are not one zstd frame (",
                ZSTD_isError(frame_bytes) ? std::string(ZSTD_getErrorName(frame_bytes))
                                          : detail::str("a frame of ", frame_bytes, " bytes"),
                ")");
      const unsigned long long content = ZSTD_getFrameContentSize(src, static_cast<size_t>(src_bytes));
      MMT_CHECK(content == ZSTD_CONTENTSIZE_UNKNOWN || content == static_cast<unsigned long long>(decoded_bytes),
                FormatError, what, ": the zstd frame holds ", content, " bytes but the chunk table declares ",
                decoded_bytes);
      size_t n = ZSTD_decompressDCtx(zstd_contexts().decompress.get(), dst,
                                     static_cast<size_t>(decoded_bytes), src,
                                     static_cast<size_t>(src_bytes));
      MMT_CHECK(!ZSTD_isError(n), FormatError, what, ": zstd data is corrupt or larger than the ",
                decoded_bytes, " declared bytes (", ZSTD_getErrorName(n), ")");
      MMT_CHECK(static_cast<int64_t>(n) == decoded_bytes, FormatError, what, ": zstd decoded ", n,
                " bytes but the chunk table declares ", decoded_bytes);
      return;
    }
  }
  throw FormatError(detail::str(what, ": unknown codec code ", static_cast<int>(codec)));
}

}  // namespace detail
}  // namespace mmt
