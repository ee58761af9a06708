// The IDX format of MNIST, Fashion-MNIST and their kin, plain or gzip-compressed.
//
// An IDX file is a 4-byte magic (0x00 0x00, a type code, the number of dimensions), one
// big-endian uint32 per dimension, then the elements in row-major order, big-endian:
//   type 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.
// A file starting with the gzip magic (1f 8b) is decompressed on the fly (concatenated gzip
// members included); the header tells how many bytes to expect, so nothing beyond that is
// ever allocated.
//
// Reading trusts nothing: the element count is checked for overflow and the data must fill
// the rest of the file (or of the decompressed stream) exactly.
//
// Errors: IoError when the file cannot be opened; FormatError naming the file and what is
// wrong ("t10k-labels-idx1-ubyte: magic 0x00000903 is not an IDX magic: the first two bytes
// must be zero"; "...: truncated: header declares 10000 elements of uint8 = 10000 bytes but
// the file holds 9000 after the header"); a gzip stream that is corrupt or truncated also
// gives a FormatError.
//
// Thread safety: all functions are safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mmtensor/dtype.h"
#include "mmtensor/tensor.h"

namespace mmt {

// The element type an IDX type code stands for; FormatError for an unknown code.
ScalarType idx_scalar_type(uint8_t type_code, std::string_view what);

// Loads an IDX file. For an uncompressed file of 1-byte elements, the tensor is a zero-copy
// read-only view of the file; otherwise the elements are decoded into host memory in native
// byte order.
Tensor load_idx(const std::string& path);

// Parses a whole IDX file held in memory (plain or gzip); the result owns a host copy.
Tensor parse_idx(std::span<const std::byte> bytes, std::string_view what);

}  // namespace mmt
