// Shape arithmetic shared by the tensor files: the one place contiguity, extents and dense
// layouts are computed (PyTorch's rules: size-1 dimensions skipped, empty tensors contiguous,
// signed arithmetic, overflow checked).
#pragma once

#include <cstdint>
#include <array>
#include <optional>
#include <span>

#include "mmtensor/dims.h"
#include "mmtensor/tensor.h"

namespace mmt::detail {

// Product of sizes; throws ValueError on a negative size or int64 overflow.
int64_t checked_numel(IntArrayRef sizes);

// Lowest and highest element offsets (relative to the storage offset) a view reaches.
struct Extent {
  int64_t min_offset = 0;
  int64_t max_offset = 0;
};
// Throws ValueError if the reach overflows int64. Only meaningful when numel > 0.
Extent element_extent(IntArrayRef sizes, IntArrayRef strides);

bool is_contiguous_strides(IntArrayRef sizes, IntArrayRef strides);
// Row-major strides (size-1 dimensions skipped), an empty tensor included: what a layout is,
// where is_contiguous_strides says every empty tensor is contiguous.
bool is_row_major_strides(IntArrayRef sizes, IntArrayRef strides);
// The channels-last layouts' dimensions from the innermost out: C, then W, (D,) H, N.
inline constexpr std::array<int, 4> kChannelsLastOrder{1, 3, 2, 0};
inline constexpr std::array<int, 5> kChannelsLast3dOrder{1, 4, 3, 2, 0};
bool is_channels_last_strides(IntArrayRef sizes, IntArrayRef strides);     // 4-d
bool is_channels_last_3d_strides(IntArrayRef sizes, IntArrayRef strides);  // 5-d
// The dense strides that lay out `sizes` with the dimensions of `inner_to_outer` from the
// innermost out, by the sizes as they are (PyTorch's channels-last strides: a dimension of
// size 0 makes every stride outside it 0). ValueError when a stride passes int64.
DimVector dense_strides_in_order(IntArrayRef sizes, std::span<const int> inner_to_outer);
// Whether the strides order the dimensions as `inner_to_outer` (kChannelsLastOrder or
// kChannelsLast3dOrder), dense or not: PyTorch's is_channels_last_strides_2d/3d, which
// suggest_memory_format() reads. Never for an empty tensor, a channel stride of 0, or an
// ambiguous layout (N111, or a batch whose strides are all equal), which stay row-major.
bool strides_like_channels_last(IntArrayRef sizes, IntArrayRef strides, std::span<const int> inner_to_outer);
// True when the view covers a block of exactly numel elements with no overlaps or gaps,
// in some dimension order (so it can be copied with one memcpy into the same strides).
bool is_non_overlapping_and_dense(IntArrayRef sizes, IntArrayRef strides);
// True when no two elements of the view share memory, by a sufficient test: taken by
// increasing |stride|, each dimension of size >= 2 steps past everything the dimensions
// before it span. Every view of a dense tensor (slices, narrowing, permutations, negative
// strides) passes; an expanded one (stride 0) or an interleaving as_strided does not.
bool is_provably_non_overlapping(IntArrayRef sizes, IntArrayRef strides);
// True when no byte of `a` is a byte of `b`, by a sufficient test on addresses, whatever
// their storages (two from_blob() storages over one buffer do alias):
//   - their byte extents, [lowest byte, highest byte], do not meet (separate buffers, or
//     slices of one buffer one after the other: the halves of a batch); or
//   - they take turns along dimension 0, a row at a time: with S the gcd of their
//     dimension-0 strides in bytes, a row of `a` and a row of `b` fit side by side in S, at
//     offsets modulo S that keep them apart (columns of one [B, K] buffer, fields of an
//     array of records, even of different dtypes).
// Views interleaved more finely (columns 0 and 2 against 1 and 3) are not proven disjoint.
// An empty tensor shares nothing, nor do tensors on different devices.
bool is_provably_disjoint(const Tensor& a, const Tensor& b);
// The same test in two steps, for comparing each pair of many tensors: a footprint per
// tensor (O(dim)), then O(1) a pair. Neither allocates.
struct ByteFootprint {
  bool empty = true;
  Device device;
  intptr_t lowest = 0;      // the view's lowest byte's address
  intptr_t highest = 0;     // its highest byte's
  // Its slices along dimension 0 (a 0-d tensor: one slice of one element).
  intptr_t row_lowest = 0;  // slice 0's lowest byte's address
  int64_t row_bytes = 0;    // from a slice's lowest byte to its highest, inclusive
  int64_t row_stride = 0;   // |stride(0)| in bytes; 0 for a single slice
};
ByteFootprint byte_footprint(const Tensor& t);
bool is_provably_disjoint(const ByteFootprint& a, const ByteFootprint& b);

// Dense strides for `sizes` that keep the order of `strides` (PyTorch's infer_dense_strides,
// what clone() and empty_like() give a view that is not dense): dimensions ranked from the
// smallest stride out, equal strides by size (the smaller inner), stride-0 dimensions left
// where the row-major order puts them.
DimVector dense_strides_like(IntArrayRef sizes, IntArrayRef strides);
// The strides of a copy that keeps a view's layout (MemoryFormat::Preserve: empty_like,
// clone, to, pin_memory): the view's own when it is non-overlapping and dense, as every
// empty tensor is for PyTorch (unless a stride is negative: a new tensor's are not), else
// dense_strides_like.
DimVector preserved_strides(IntArrayRef sizes, IntArrayRef strides);

// The strides a view of `new_sizes` would need over memory laid out as (sizes, strides),
// or nullopt when no such view exists (PyTorch's rule for view()).
std::optional<DimVector> compute_view_strides(IntArrayRef sizes, IntArrayRef strides,
                                              IntArrayRef new_sizes);

// Replaces one -1 in `sizes` so the product is numel; throws ValueError with PyTorch's message.
DimVector infer_size(IntArrayRef sizes, int64_t numel);

// Wraps a possibly negative dimension into [0, ndim); throws IndexError naming the range.
int64_t wrap_dim(int64_t dim, int64_t ndim);

}  // namespace mmt::detail
