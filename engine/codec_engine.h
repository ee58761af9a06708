// Block compression behind the chunk codecs (none, lz4, zstd). One call compresses or
// decompresses one whole chunk; zstd contexts are reused per thread.
//
// Decoding trusts nothing: the output buffer is exactly the size the chunk table declares
// (already capped by the caller), lz4 decodes with LZ4_decompress_safe only, and anything
// but exactly `decoded_bytes` of output is a FormatError naming `what` (e.g. "chunk 17").
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "mmtensor/codec.h"

namespace mmt::detail {

// Largest codec input one call accepts (lz4's int-sized API sets it).
int64_t max_codec_input_bytes();

// Worst-case compressed size of `src_bytes` bytes; what compress() needs in `dst`.
int64_t compress_bound(Codec codec, int64_t src_bytes);

// zstd inputs of more than a piece go through the codec in kZstdPieceBytes pieces (the frame
// one call makes, byte for byte), so that `stop` is asked between them: at zstd's highest
// levels a piece takes about half a second, a 32 MiB chunk at once twenty. (With a libzstd
// older than 1.5.2, which cannot, in one call.)
inline constexpr int64_t kZstdPieceBytes = int64_t{1} << 20;
inline constexpr int64_t kZstdPiecesAboveBytes = kZstdPieceBytes;

// Compresses src into dst and returns the compressed size, or -1 when `stop` (if given)
// returned true: it is asked before a zstd input is compressed and between its pieces.
// Codec::None copies. Throws ValueError when src is larger than max_codec_input_bytes() and
// Error when the codec fails.
int64_t compress(const CodecSpec& spec, const void* src, int64_t src_bytes, void* dst,
                 int64_t dst_capacity, const std::function<bool()>& stop = {});

// Decodes src into dst, which holds exactly decoded_bytes. Throws FormatError naming `what`
// when the data is corrupt or decodes to any other size.
void decompress(Codec codec, const void* src, int64_t src_bytes, void* dst, int64_t decoded_bytes,
                std::string_view what);

}  // namespace mmt::detail
