// NumPy's file formats: .npy (one array) and .npz (a ZIP archive of .npy members).
//
// Reading trusts nothing in the file. The header is capped at kMaxNpyHeaderBytes before
// anything is allocated; its dict is parsed (never evaluated) by a parser for the part of
// Python's literal syntax that .npy writers use: either quote, whitespace and line breaks
// between the tokens (np.load reads them), but not a dimension with a leading zero such as
// "03" (Python, and so np.load, refuses it); the shape's element and byte counts are checked
// for overflow; the data must fill the rest of the file exactly. Bytes after the array, which
// np.load ignores, are refused on purpose: they usually mean a shape out of date (rows appended
// without rewriting the header), which would be packed short without a word; the message
// counts them and says how to cut them off. ZIP members are located through the
// central directory (ZIP64 records and extra fields included), may be stored or deflated,
// and have their CRC-32 checked before any of their bytes are used. An archive is read where
// Python's zipfile reads it: with up to 64 KiB of other bytes after it, an end record whose
// comment length runs past the end of the file, or other bytes before it (a self-extractor's
// stub; its offsets then count from the archive's start, and np.load itself refuses such a
// file, as it looks for "PK" at the start).
//
// Supported element types: every numeric dtype numpy and mmtensor share, and bool
// ('|b1', '|u1', '|i1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8', '<f2', '<f4', '<f8',
// '<c8', '<c16' and their '>' variants; a big-endian complex value has each part swapped).
// As np.load reads them: a type string without a byte order ('i4'), or with '=', or with '|'
// on a multi-byte type, is in native order; numpy's names of these types ('bool', 'int8',
// 'uint8', ... 'uint64', 'float16', 'float32', 'float64', 'complex64', 'complex128') are read
// too. Names np.load reads that do not carry a size ('int', 'float', 'double', 'l', 'f', 'D',
// 'complex', ...) are refused: some differ between platforms or from C's type of that name
// ('float' is numpy's float64, C's 4-byte float), so the file's writer may have meant another
// type. Structured, object, string, datetime, extended-precision float and complex ('<f16',
// '<c32') arrays are refused with a FormatError naming the descr. A bool array whose bytes
// are not 0 or 1 is refused.
//
// Layout: a C-order array comes back contiguous; a Fortran-order array comes back as a view
// with column-major strides over the same bytes (as numpy does), so t.is_contiguous() is
// false and t.contiguous() makes the C-order copy. A big-endian array is converted into host
// memory in native byte order.
//
// Errors: IoError when the file cannot be opened or read; FormatError when its bytes are
// not a valid array, with the file and the rule broken in the message ("x.npy: header
// declares shape (60000, 28, 28) of <f4 = 188160000 bytes but the file holds 1000 bytes
// after the header"); ChecksumError for a ZIP member whose CRC-32 does not match.
//
// Thread safety: all functions are safe to call concurrently on different paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mmtensor/dims.h"
#include "mmtensor/dtype.h"
#include "mmtensor/tensor.h"

namespace mmt {

// Headers longer than this are refused before any allocation (numpy's own default limit is
// 10000 bytes; this leaves room for very high-rank shapes).
inline constexpr int64_t kMaxNpyHeaderBytes = 65536;

// What an .npy header says, after validation.
struct NpyHeader {
  int major_version = 1;      // 1, 2 or 3
  int minor_version = 0;
  std::string descr;          // as written in the file, e.g. "<f4"
  ScalarType dtype = kUInt8;
  bool big_endian = false;    // the data's byte order (false for 1-byte types)
  bool fortran_order = false;
  DimVector shape;
  int64_t data_offset = 0;    // bytes from the start of the .npy to the first data byte
  int64_t data_nbytes = 0;    // numel * element size
};

// Parses and validates the header at the start of `bytes` (which may hold only the header or
// the whole file). `what` names the source in error messages (a path, "archive.npz:x.npy").
// Does not check that the data is present.
NpyHeader parse_npy_header(std::span<const std::byte> bytes, std::string_view what);

// Reads and validates the header of the .npy file at `path`, and that the file holds exactly
// the data it declares (no fewer bytes, and none after them).
NpyHeader read_npy_header(const std::string& path);

// Loads an .npy file. With mmap=true and data in native byte order at an address aligned for
// its dtype, the tensor is a zero-copy read-only view of the file (numpy's
// np.load(mmap_mode='r')): its storage's filename() is `path`. Otherwise (mmap=false, a
// big-endian array, misaligned data) the elements are copied into host memory.
Tensor load_npy(const std::string& path, bool mmap = true);

// Parses a whole .npy held in memory; the result owns a host copy of the elements.
Tensor parse_npy(std::span<const std::byte> bytes, std::string_view what);

// The .npy descr numpy uses for `dtype` in native byte order ("<f4", "|b1", ...).
// Throws ValueError for bfloat16, which numpy has no dtype for.
std::string npy_descr(ScalarType dtype);

// The bytes of an .npy file holding `t` in C order (format 1.0, or 2.0 when the header
// does not fit 1.0), with the header padded to 64 bytes as numpy writes it. Host or device
// tensors of any strides. Throws ValueError for bfloat16.
std::vector<std::byte> npy_bytes(const Tensor& t);

// Writes `t` to `path` as npy_bytes() describes. The file appears complete or not at all: it
// is written to a temporary file in the same folder and renamed over `path`, replacing an
// existing file. Throws IoError naming the step and path (full disk, no permission).
void save_npy(const std::string& path, const Tensor& t);

// One member of an .npz archive.
struct NpzMember {
  // The array's name: the member's file name without ".npy", in UTF-8. A name stored without
  // ZIP's UTF-8 flag is read as code page 437, as Python's zipfile (and np.load) reads it.
  std::string name;
  Tensor array;
};

// Loads every array of an .npz file, in the archive's member order, at once (np.load loads a
// member when it is indexed; the packer needs them all). Deflated members are inflated into
// host memory. A stored member, with mmap=true, is a zero-copy read-only view of
// the file when its data is in native byte order at an address aligned for its dtype (like
// load_npy; numpy's zip headers often leave it unaligned, and byte arrays are always aligned);
// otherwise it is copied into host memory. Members whose names do not end in ".npy" are
// refused, as are encrypted members and compression methods other than stored (0) and
// deflate (8).
std::vector<NpzMember> load_npz(const std::string& path, bool mmap = true);

// The same for an archive held in memory; `what` names it in error messages.
std::vector<NpzMember> parse_npz(std::span<const std::byte> bytes, std::string_view what);

}  // namespace mmt
