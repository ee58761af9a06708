// Internal pieces of the .npy reader and writer shared with the .npz reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace mmt::detail
