// The engine's one strided-copy routine. Every copy between tensor layouts (contiguous(),
// clone(), copy_(), channels-last conversion, the dataset writer's records, get_batch into a
// strided buffer) goes through copy_strided().
//
// It drops size-1 dimensions, orders dimensions by the destination's strides, merges
// dimensions that are contiguous together in both source and destination, and then moves
// the innermost runs with memcpy when both sides are dense there; a 2-d transpose at the
// innermost level (NCHW -> NHWC, a matrix transpose) is copied in cache-sized tiles.
#pragma once

#include <cstdint>

#include "mmtensor/dims.h"

namespace mmt::detail {

// Copies a [sizes] block of `element_bytes`-sized elements. Strides are in elements.
// The two regions must not overlap (the caller stages through a temporary if they do).
void copy_strided(void* dst, IntArrayRef dst_strides, const void* src, IntArrayRef src_strides,
                  IntArrayRef sizes, int64_t element_bytes);

// Calls fn(dst_elem, src_elem) for every element pair, in an order that walks memory
// reasonably; for conversions between dtypes and other per-element work.
template <typename Fn>
void for_each_element_pair(char* dst, IntArrayRef dst_strides_bytes, const char* src,
                           IntArrayRef src_strides_bytes, IntArrayRef sizes, Fn&& fn) {
  const size_t ndim = sizes.size();
  for (size_t d = 0; d < ndim; ++d)
    if (sizes[d] == 0) return;
  if (ndim == 0) {
    fn(dst, src);
    return;
  }
  DimVector counter(ndim, 0);
  const int64_t inner = sizes[ndim - 1];
  const int64_t dst_inner = dst_strides_bytes[ndim - 1];
  const int64_t src_inner = src_strides_bytes[ndim - 1];
  while (true) {
    char* d = dst;
    const char* s = src;
    for (int64_t i = 0; i < inner; ++i, d += dst_inner, s += src_inner) fn(d, s);
    // Advance the odometer over the outer dimensions.
    size_t dim = ndim - 1;
    while (true) {
      if (dim == 0) return;
      --dim;
      dst += dst_strides_bytes[dim];
      src += src_strides_bytes[dim];
      if (++counter[dim] < sizes[dim]) break;
      dst -= dst_strides_bytes[dim] * sizes[dim];
      src -= src_strides_bytes[dim] * sizes[dim];
      counter[dim] = 0;
    }
  }
}

}  // namespace mmt::detail
