// Internal pieces of the .npy reader and writer shared with the .npz reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mmtensor/numpy_io.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt::detail {

// The preamble and the header dict of a C-order array, padded with spaces and a newline so
// the data starts on a 64-byte boundary, as numpy writes it.
std::string npy_header_bytes(ScalarType dtype, IntArrayRef shape);

// The tensor described by `header` whose data starts at byte `data_offset` of `storage`
// (which must hold header.data_nbytes bytes from there). A view over `storage` when the data
// is in native byte order and aligned for its dtype; otherwise a host copy in native order.
// Bool data is checked to hold only 0 and 1.
Tensor npy_tensor_over(const UntypedStorage& storage, int64_t data_offset,
                       const NpyHeader& header, std::string_view what);

// A host copy of the elements at `data`, in native order, with the header's layout.
Tensor npy_tensor_copy(const std::byte* data, const NpyHeader& header, std::string_view what);

// Whether npy_tensor_over() gives a view (rather than a copy) of the data at `data`, which
// lies at byte `data_offset` of its storage: native byte order, aligned for the dtype, and
// not empty.
bool npy_viewable(const std::byte* data, int64_t data_offset, const NpyHeader& header);

// An array's values where they lie, before any copy: header.data_nbytes bytes from byte
// `data_offset` of `storage`, in the header's byte order, aligned for the dtype or not. A
// caller too short of memory to copy a large array whole (the packer) converts it a few
// records at a time; npy_tensor_over() makes it a tensor.
struct NpyValues {
  std::string name;  // an .npz member's array name; empty for an .npy file
  std::string what;  // the source in error messages: a path, or "archive.npz:x.npy"
  NpyHeader header;
  UntypedStorage storage;  // the file's mapping, or an inflated member's host buffer
  int64_t data_offset = 0;
};

// The .npy file at `path`, mapped; the file must hold exactly the data its header declares.
NpyValues map_npy_values(const std::string& path);

// The arrays of the .npz at `path`, in member order: stored members within the archive's
// mapping, deflated ones inflated into host memory. Every check of load_npz() is made,
// CRC-32s included, but for bool values, which npy_tensor_over() checks (a bool array, of
// 1-byte elements, is always made a tensor: never misaligned or byte-swapped).
std::vector<NpyValues> map_npz_values(const std::string& path);

}  // namespace mmt::detail
