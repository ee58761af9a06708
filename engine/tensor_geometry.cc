#include "tensor_geometry.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>

#include "mmtensor/error.h"

namespace mmt::detail {

int64_t checked_numel(IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    MMT_CHECK(s >= 0, ValueError, "negative size ", s, " in shape ", sizes);
    MMT_CHECK(!__builtin_mul_overflow(n, s, &n), ValueError, "shape ", sizes,
              " has more elements than fit in int64");
  }
  return n;
}

Extent element_extent(IntArrayRef sizes, IntArrayRef strides) {
  Extent e;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] <= 1) continue;
    int64_t reach = 0;
    MMT_CHECK(!__builtin_mul_overflow(sizes[d] - 1, strides[d], &reach), ValueError,
              "stride ", strides[d], " of dimension ", d, " overflows int64");
    int64_t& side = reach >= 0 ? e.max_offset : e.min_offset;
    MMT_CHECK(!__builtin_add_overflow(side, reach, &side), ValueError,
              "strides ", strides, " over sizes ", sizes, " overflow int64");
  }
  return e;
}

bool is_contiguous_strides(IntArrayRef sizes, IntArrayRef strides) {
  // An empty tensor is contiguous whatever its strides, as in PyTorch: with a 0 anywhere, not
  // only in a dimension met before the first mismatch.
  for (int64_t size : sizes)
    if (size == 0) return true;
  return is_row_major_strides(sizes, strides);
}

bool is_row_major_strides(IntArrayRef sizes, IntArrayRef strides) {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

namespace {
bool is_dense_in_order(IntArrayRef sizes, IntArrayRef strides, std::span<const int> order) {
  int64_t expected = 1;
  for (int d : order) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}
}  // namespace

DimVector dense_strides_in_order(IntArrayRef sizes, std::span<const int> inner_to_outer) {
  DimVector out(sizes.size(), 1);
  int64_t step = 1;
  for (int d : inner_to_outer) {
    out[d] = step;
    MMT_CHECK(!__builtin_mul_overflow(step, sizes[d], &step), ValueError, "the strides of shape ", sizes,
              " overflow int64");
  }
  return out;
}

bool strides_like_channels_last(IntArrayRef sizes, IntArrayRef strides, std::span<const int> inner_to_outer) {
  if (sizes.size() != inner_to_outer.size()) return false;
  const int channels = inner_to_outer.front(), batch = inner_to_outer.back();
  if (strides[channels] == 0) return false;  // nothing to tell channels from anything
  // Each dimension, from the channels out, must step at least over all that the ones inside
  // it span (a size-1 dimension spans its stride).
  int64_t spanned = 0;
  for (int d : inner_to_outer) {
    if (sizes[d] == 0 || strides[d] < spanned) return false;
    // The batch stepping exactly as the channels: an N111 tensor, or one whose strides are
    // all equal; either reads as row-major too, which wins.
    if (d == batch && spanned == strides[channels]) return false;
    spanned = strides[d];
    if (sizes[d] > 1 && __builtin_mul_overflow(spanned, sizes[d], &spanned)) spanned = INT64_MAX;
  }
  return true;
}

bool is_channels_last_strides(IntArrayRef sizes, IntArrayRef strides) {
  return sizes.size() == 4 && is_dense_in_order(sizes, strides, kChannelsLastOrder);
}

bool is_channels_last_3d_strides(IntArrayRef sizes, IntArrayRef strides) {
  return sizes.size() == 5 && is_dense_in_order(sizes, strides, kChannelsLast3dOrder);
}

bool is_non_overlapping_and_dense(IntArrayRef sizes, IntArrayRef strides) {
  const size_t n = sizes.size();
  if (n == 1) return sizes[0] < 2 || strides[0] == 1;
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    if (sizes[a] < 2) return false;  // size-1 dims go last; they do not matter
    if (sizes[b] < 2) return true;
    return strides[a] < strides[b];
  });
  int64_t expected = 1;
  for (size_t i : perm) {
    if (sizes[i] == 0) return true;
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

bool is_provably_non_overlapping(IntArrayRef sizes, IntArrayRef strides) {
  // |stride| and size of the dimensions of size >= 2, sorted by |stride| (insertion sort:
  // a handful of dimensions, and no heap allocation on get_batch's path).
  DimVector abs_strides, dim_sizes;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return true;  // no elements
    if (sizes[d] < 2) continue;
    const int64_t stride = strides[d] < 0 ? -strides[d] : strides[d];
    size_t at = abs_strides.size();
    abs_strides.push_back(stride);
    dim_sizes.push_back(sizes[d]);
    for (; at > 0 && abs_strides[at - 1] > stride; --at) {
      abs_strides[at] = abs_strides[at - 1];
      dim_sizes[at] = dim_sizes[at - 1];
    }
    abs_strides[at] = stride;
    dim_sizes[at] = sizes[d];
  }
  int64_t span = 0;  // the largest offset the dimensions so far reach, in elements
  for (size_t k = 0; k < abs_strides.size(); ++k) {
    if (abs_strides[k] <= span) return false;
    // A tensor's elements lie in its storage, so stride * (size - 1) fits in int64.
    span += abs_strides[k] * (dim_sizes[k] - 1);
  }
  return true;
}

ByteFootprint byte_footprint(const Tensor& t) {
  ByteFootprint f;
  f.device = t.device();
  if (t.numel() == 0) return f;
  f.empty = false;
  // A tensor's elements lie in its storage, so its reach in bytes fits in int64.
  const int64_t element_bytes = t.element_size();
  const intptr_t first = reinterpret_cast<intptr_t>(t.data_ptr());
  const IntArrayRef sizes = t.sizes(), strides = t.strides();
  const Extent whole = element_extent(sizes, strides);
  f.lowest = first + whole.min_offset * element_bytes;
  f.highest = first + whole.max_offset * element_bytes + element_bytes - 1;
  if (sizes.empty()) {  // one element: a single row
    f.row_lowest = first;
    f.row_bytes = element_bytes;
    return f;
  }
  const Extent row = element_extent(IntArrayRef(sizes.data() + 1, sizes.size() - 1),
                                    IntArrayRef(strides.data() + 1, strides.size() - 1));
  f.row_lowest = first + row.min_offset * element_bytes;
  f.row_bytes = (row.max_offset - row.min_offset + 1) * element_bytes;
  f.row_stride = sizes[0] > 1 ? (strides[0] < 0 ? -strides[0] : strides[0]) * element_bytes : 0;
  return f;
}

bool is_provably_disjoint(const ByteFootprint& a, const ByteFootprint& b) {
  if (a.empty || b.empty || a.device != b.device) return true;
  if (a.highest < b.lowest || b.highest < a.lowest) return true;
  // Each row of a starts at a.row_lowest plus a multiple of a.row_stride, so of s, and
  // likewise for b: modulo s, a's rows cover [0, a.row_bytes) and b's [gap, gap + b.row_bytes).
  // (s is 0 when neither has two rows: the extents alone decide.)
  const int64_t s = std::gcd(a.row_stride, b.row_stride);
  if (s == 0) return false;
  int64_t gap = static_cast<int64_t>(b.row_lowest - a.row_lowest) % s;
  if (gap < 0) gap += s;
  return gap >= a.row_bytes && gap + b.row_bytes <= s;
}

DimVector dense_strides_like(IntArrayRef sizes, IntArrayRef strides) {
  const size_t ndim = sizes.size();
  // order[0] is the innermost dimension; from the row-major order (last dimension innermost),
  // an insertion sort moves a dimension inward past those with larger strides. A stride of 0
  // compares with nothing, so it neither moves nor lets others past it.
  std::vector<size_t> order(ndim);
  for (size_t k = 0; k < ndim; ++k) order[k] = ndim - 1 - k;
  // By |stride|: a view walking a dimension backwards keeps that dimension's place.
  const auto magnitude = [&](size_t d) { return strides[d] == INT64_MIN ? INT64_MAX : std::abs(strides[d]); };
  const auto outer = [&](size_t a, size_t b) {  // 1: a belongs outside b; -1: inside; 0: either
    if (strides[a] == 0 || strides[b] == 0) return 0;
    if (magnitude(a) != magnitude(b)) return magnitude(a) < magnitude(b) ? -1 : 1;
    return sizes[a] > sizes[b] ? 1 : 0;
  };
  for (size_t i = 1; i < ndim; ++i) {
    size_t moving = i;
    for (size_t k = i; k-- > 0;) {
      const int comparison = outer(order[k], order[moving]);
      if (comparison < 0) break;
      if (comparison > 0) {
        std::swap(order[k], order[moving]);
        moving = k;
      }
    }
  }
  DimVector out(ndim, 1);
  int64_t step = 1;
  for (const size_t d : order) {
    out[d] = step;
    // An empty tensor's other dimensions may be as large as int64 allows.
    MMT_CHECK(!__builtin_mul_overflow(step, std::max<int64_t>(sizes[d], 1), &step), ValueError,
              "the strides of shape ", sizes, " overflow int64");
  }
  return out;
}

DimVector preserved_strides(IntArrayRef sizes, IntArrayRef strides) {
  const bool has_negative = std::any_of(strides.begin(), strides.end(), [](int64_t s) { return s < 0; });
  const bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
  if (!has_negative && (empty || is_non_overlapping_and_dense(sizes, strides))) return DimVector(strides);
  return dense_strides_like(sizes, strides);
}

bool is_provably_disjoint(const Tensor& a, const Tensor& b) {
  return is_provably_disjoint(byte_footprint(a), byte_footprint(b));
}

std::optional<DimVector> compute_view_strides(IntArrayRef old_sizes, IntArrayRef old_strides,
                                              IntArrayRef new_sizes) {
  DimVector new_strides(new_sizes.size(), 0);
  if (old_sizes.empty()) {  // a 0-d tensor views as any shape of one element
    new_strides.assign(new_sizes.size(), 1);
    return new_strides;
  }
  const int64_t numel = checked_numel(old_sizes);
  if (numel == 0 && old_sizes == new_sizes) return DimVector(old_strides);
  if (numel == 0) return contiguous_strides(new_sizes);  // ValueError where they overflow
  // Walk the old dimensions from the innermost, grouping those that are contiguous with
  // each other ("chunks"); each chunk must be covered exactly by consecutive new dimensions.
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_sizes[tensor_d];
    bool chunk_ends = tensor_d == 0 ||
                      (old_sizes[tensor_d - 1] != 1 &&
                       old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_sizes[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = old_strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

DimVector infer_size(IntArrayRef sizes, int64_t numel) {
  DimVector out(sizes);
  int64_t known = 1;
  int64_t infer_at = -1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == -1) {
      MMT_CHECK(infer_at < 0, ValueError, "only one dimension can be inferred (shape ", sizes, ")");
      infer_at = static_cast<int64_t>(d);
    } else {
      MMT_CHECK(sizes[d] >= 0, ValueError, "invalid shape dimension ", sizes[d], " in ", sizes);
      MMT_CHECK(!__builtin_mul_overflow(known, sizes[d], &known), ValueError, "shape ", sizes,
                " has more elements than fit in int64");
    }
  }
  if (infer_at >= 0) {
    MMT_CHECK(known != 0 && numel % known == 0, ValueError, "shape '", sizes,
              "' is invalid for input of size ", numel);
    out[infer_at] = numel / known;
  } else {
    MMT_CHECK(known == numel, ValueError, "shape '", sizes, "' is invalid for input of size ",
              numel);
  }
  return out;
}

int64_t wrap_dim(int64_t dim, int64_t ndim) {
  int64_t lo = ndim > 0 ? -ndim : -1;
  int64_t hi = ndim > 0 ? ndim - 1 : 0;
  MMT_CHECK(dim >= lo && dim <= hi, IndexError, "Dimension out of range (expected to be in range of [",
            lo, ", ", hi, "], but got ", dim, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

}  // namespace mmt::detail
