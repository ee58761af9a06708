// Block compression behind the chunk codecs (none, lz4, zstd). One call compresses or
// decompresses one whole chunk; zstd contexts are reused per thread.
//
// Decoding trusts nothing: the output buffer is exactly the size the chunk table declares
// (already capped by the caller), lz4 decodes with LZ4_decompress_safe only, and anything
// but exactly `decoded_bytes` of output is a FormatError naming `what` (e.g. "chunk 17").
#pragma once

#include <cstdint>
#include <string_view>

#include "mmtensor/codec.h"

namespace mmt::detail {

// Largest codec input one call accepts (lz4's int-sized API sets it).
int64_t max_codec_input_bytes();

// Worst-case compressed size of `src_bytes` bytes; what compress() needs in `dst`.
int64_t compress_bound(Codec codec, int64_t src_bytes);

// Compresses src into dst and returns the compressed size. Codec::None copies. Throws
// ValueError when src is larger than max_codec_input_bytes() and Error when the codec fails.
int64_t compress(const CodecSpec& spec, const void* src, int64_t src_bytes, void* dst,
                 int64_t dst_capacity);

// Decodes src into dst, which holds exactly decoded_bytes. Throws FormatError naming `what`
// when the data is corrupt or decodes to any other size.
void decompress(Codec codec, const void* src, int64_t src_bytes, void* dst, int64_t decoded_bytes,
                std::string_view what);

}  // namespace mmt::detail
