// View operations: new metadata over the same storage, never a copy (reshape excepted).
#include <algorithm>

#include "mmtensor/tensor.h"
#include "tensor_geometry.h"

namespace mmt {

namespace {
Tensor restride(const Tensor& t, DimVector sizes, DimVector strides, int64_t offset) {
  return make_tensor_unchecked(t.untyped_storage(), t.dtype(), std::move(sizes), std::move(strides),
                               offset);
}

// Where index `start` of dimension `d` (wrapped) begins: an element's offset when the tensor
// has one there. In an empty tensor it may be none; where it could not be one (past int64,
// negative under a negative stride, or past any address once counted in bytes) it stays
// where the tensor starts.
int64_t offset_of_start(const Tensor& t, int64_t start, int64_t d) {
  int64_t offset = 0, offset_bytes = 0;
  if (__builtin_mul_overflow(start, t.strides()[d], &offset) ||
      __builtin_add_overflow(offset, t.storage_offset(), &offset) || offset < 0 ||
      __builtin_mul_overflow(offset, t.element_size(), &offset_bytes))
    return t.storage_offset();
  return offset;
}

// PyTorch's stride for a size-1 dimension put outside one of (size, stride): a step over
// that whole dimension. Where that passes int64 (a huge stride of a dimension of at most one
// element, or of any dimension of an empty tensor), 0: such a stride is never applied.
int64_t stride_outside(int64_t size, int64_t stride) {
  int64_t out = 0;
  return __builtin_mul_overflow(size, stride, &out) ? 0 : out;
}
}  // namespace

Tensor Tensor::as_strided(IntArrayRef sizes, IntArrayRef strides, int64_t storage_offset) const {
  check_defined("as_strided()");
  return Tensor(storage_, dtype_, sizes, strides, storage_offset);
}

Tensor Tensor::view(IntArrayRef sizes) const {
  check_defined("view()");
  DimVector shape = detail::infer_size(sizes, numel());
  auto strides = detail::compute_view_strides(sizes_, strides_, shape);
  MMT_CHECK(strides.has_value(), ValueError,
            "view size is not compatible with input tensor's size and stride (at least one "
            "dimension spans across two contiguous subspaces). Use .reshape(...) instead. "
            "(input size ", sizes_, ", stride ", strides_, "; requested size ", IntArrayRef(shape), ")");
  return restride(*this, std::move(shape), std::move(*strides), storage_offset_);
}

Tensor Tensor::reshape(IntArrayRef sizes) const {
  check_defined("reshape()");
  DimVector shape = detail::infer_size(sizes, numel());
  if (auto strides = detail::compute_view_strides(sizes_, strides_, shape))
    return restride(*this, std::move(shape), std::move(*strides), storage_offset_);
  return contiguous().view(shape);
}

Tensor Tensor::permute(IntArrayRef dims) const {
  check_defined("permute()");
  MMT_CHECK(static_cast<int64_t>(dims.size()) == dim(), ValueError,
            "permute(): number of dimensions in the tensor input does not match the "
            "length of the desired ordering of dimensions i.e. input.dim() = ", dim(),
            " is not equal to len(dims) = ", dims.size());
  DimVector sizes(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i]);
    MMT_CHECK(!seen[d], ValueError, "permute(): duplicate dims are not allowed (dims ", dims, ")");
    seen[d] = true;
    sizes[i] = sizes_[d];
    strides[i] = strides_[d];
  }
  return restride(*this, std::move(sizes), std::move(strides), storage_offset_);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  check_defined("transpose()");
  if (dim() == 0) {
    wrap_dim(dim0);
    wrap_dim(dim1);
    return *this;
  }
  int64_t a = wrap_dim(dim0), b = wrap_dim(dim1);
  DimVector sizes = sizes_, strides = strides_;
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  return restride(*this, std::move(sizes), std::move(strides), storage_offset_);
}

Tensor Tensor::t() const {
  check_defined("t()");
  MMT_CHECK(dim() <= 2, ValueError, "t() expects a tensor with <= 2 dimensions, but self is ",
            dim(), "D");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  check_defined("select()");
  MMT_CHECK(dim() > 0, IndexError, "select() cannot be applied to a 0-dim tensor.");
  d = wrap_dim(d);
  const int64_t size = sizes_[d];
  MMT_CHECK(index >= -size && index < size, IndexError, "select(): index ", index,
            " out of range for tensor of size ", sizes_, " at dimension ", d);
  if (index < 0) index += size;
  DimVector sizes = sizes_, strides = strides_;
  const int64_t offset = offset_of_start(*this, index, d);
  sizes.erase(d);
  strides.erase(d);
  return restride(*this, std::move(sizes), std::move(strides), offset);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  check_defined("narrow()");
  MMT_CHECK(dim() > 0, IndexError, "narrow() cannot be applied to a 0-dim tensor.");
  d = wrap_dim(d);
  const int64_t size = sizes_[d];
  MMT_CHECK(start >= -size && start <= size, IndexError, "start out of range (expected to be in "
            "range of [", -size, ", ", size, "], but got ", start, ")");
  if (start < 0) start += size;
  MMT_CHECK(length >= 0, IndexError, "narrow(): length must be non-negative.");
  MMT_CHECK(start <= size - length, IndexError, "start (", start, ") + length (", length,
            ") exceeds dimension size (", size, ").");
  return slice(d, start, start + length, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t stop, int64_t step) const {
  check_defined("slice()");
  MMT_CHECK(dim() > 0, IndexError, "slice() cannot be applied to a 0-dim tensor.");
  MMT_CHECK(step > 0, ValueError, "slice step must be positive, got ", step);
  d = wrap_dim(d);
  const int64_t size = sizes_[d];
  // Python's clamping: negative bounds count from the end, then clamp into [0, size].
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  start = std::clamp<int64_t>(start, 0, size);
  stop = std::clamp<int64_t>(stop, start, size);
  // Written so that no step overflows: stop - start + step - 1 could.
  const int64_t length = stop > start ? (stop - start - 1) / step + 1 : 0;
  DimVector sizes = sizes_, strides = strides_;
  // An empty result still starts at `start`, as in PyTorch (x[5:5].storage_offset() is 5).
  const int64_t offset = offset_of_start(*this, start, d);
  sizes[d] = length;
  // A stride that overflows steps nowhere: the dimension has at most one element then.
  if (__builtin_mul_overflow(strides_[d], step, &strides[d])) strides[d] = strides_[d];
  return restride(*this, std::move(sizes), std::move(strides), offset);
}

Tensor Tensor::squeeze() const {
  check_defined("squeeze()");
  DimVector sizes, strides;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    if (sizes_[d] == 1) continue;
    sizes.push_back(sizes_[d]);
    strides.push_back(strides_[d]);
  }
  return restride(*this, std::move(sizes), std::move(strides), storage_offset_);
}

Tensor Tensor::squeeze(int64_t d) const {
  check_defined("squeeze()");
  if (dim() == 0) {
    wrap_dim(d);
    return *this;
  }
  d = wrap_dim(d);
  if (sizes_[d] != 1) return *this;
  DimVector sizes = sizes_, strides = strides_;
  sizes.erase(d);
  strides.erase(d);
  return restride(*this, std::move(sizes), std::move(strides), storage_offset_);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  check_defined("unsqueeze()");
  d = wrap_dim(d, /*ndim_plus=*/1);
  DimVector sizes = sizes_, strides = strides_;
  // PyTorch's choice: the new dimension steps over the whole dimension it precedes.
  int64_t stride = d >= dim() ? 1 : stride_outside(sizes_[d], strides_[d]);
  sizes.insert(d, 1);
  strides.insert(d, stride);
  return restride(*this, std::move(sizes), std::move(strides), storage_offset_);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  check_defined("flatten()");
  if (dim() == 0) {  // a 0-d tensor's dims are 0 and -1, as for a 1-d one
    wrap_dim(start_dim, /*ndim_plus=*/1);
    wrap_dim(end_dim, /*ndim_plus=*/1);
    return reshape({1});
  }
  int64_t s = wrap_dim(start_dim), e = wrap_dim(end_dim);
  MMT_CHECK(s <= e, ValueError, "flatten() has invalid args: start_dim cannot come after end_dim");
  if (s == e) return *this;
  DimVector sizes;
  int64_t merged = 1;
  for (int64_t d = 0; d < dim(); ++d) {
    if (d < s || d > e) {
      sizes.push_back(sizes_[d]);
    } else {
      // An empty tensor's other dimensions may be as large as int64 allows.
      MMT_CHECK(!__builtin_mul_overflow(merged, sizes_[d], &merged), ValueError, "flatten(", start_dim, ", ",
                end_dim, ") of shape ", sizes_, ": the merged size overflows int64");
      if (d == e) sizes.push_back(merged);
    }
  }
  return reshape(sizes);
}

Tensor Tensor::expand(IntArrayRef sizes) const {
  check_defined("expand()");
  MMT_CHECK(static_cast<int64_t>(sizes.size()) >= dim(), ValueError, "expand: the number of "
            "sizes provided (", sizes.size(), ") must be greater or equal to the number of "
            "dimensions in the tensor (", dim(), ")");
  const size_t n = sizes.size();
  const size_t lead = n - sizes_.size();
  DimVector out_sizes(n), out_strides(n);
  for (size_t i = n; i-- > 0;) {  // inside out: a new dimension's stride depends on the next one's
    if (i < lead) {
      MMT_CHECK(sizes[i] >= 0, ValueError, "expand: the expanded size ", sizes[i],
                " is not allowed in a leading, non-existing dimension ", i);
      out_sizes[i] = sizes[i];
      // PyTorch's strides: a new dimension of size 1 steps over the next one, as unsqueeze()
      // makes it; one that broadcasts, or any over a 0-d tensor, has stride 0.
      out_strides[i] = sizes[i] != 1 || lead == n ? 0 : stride_outside(out_sizes[i + 1], out_strides[i + 1]);
      continue;
    }
    const size_t j = i - lead;
    int64_t target = sizes[i] == -1 ? sizes_[j] : sizes[i];
    MMT_CHECK(target >= 0, ValueError, "expand: the expanded size ", sizes[i], " at dimension ", i,
              " is negative (-1 keeps the existing size)");
    if (target == sizes_[j]) {
      out_sizes[i] = target;
      out_strides[i] = strides_[j];
    } else {
      MMT_CHECK(sizes_[j] == 1, ValueError, "The expanded size of the tensor (", target,
                ") must match the existing size (", sizes_[j], ") at non-singleton dimension ",
                i, ".  Target sizes: ", sizes, ".  Tensor sizes: ", sizes_);
      out_sizes[i] = target;
      out_strides[i] = 0;
    }
  }
  (void)detail::checked_numel(out_sizes);  // an element count past int64 is refused, as PyTorch does
  return restride(*this, std::move(out_sizes), std::move(out_strides), storage_offset_);
}

namespace {
// A complex tensor's parts as a view of its part dtype: each complex element is two parts, so
// strides and offset double; `part` 0 is the real one, 1 the imaginary one.
Tensor complex_part(const Tensor& t, int64_t part, const char* op) {
  MMT_CHECK(t.defined(), ValueError, op, " of an undefined tensor");
  MMT_CHECK(is_complex(t.dtype()), ValueError, op, " is not implemented for tensors with non-complex dtypes (",
            to_string(t.dtype()), ")");
  // In a tensor with elements, a dimension of two or more lies in the storage, so its stride
  // doubled fits int64; any other stride (of a size-0 or size-1 dimension, or of an empty
  // tensor) is never applied, and stride_outside's 0 stands in for one that would not fit.
  DimVector strides = t.strides();
  for (auto& s : strides) s = stride_outside(2, s);
  return make_tensor_unchecked(t.untyped_storage(), to_real_value_type(t.dtype()), DimVector(t.sizes()),
                               std::move(strides), t.storage_offset() * 2 + part);
}
}  // namespace

Tensor Tensor::real() const {
  MMT_CHECK(defined_, ValueError, "real() of an undefined tensor");
  return mmt::is_complex(dtype_) ? complex_part(*this, 0, "real()") : *this;
}

Tensor Tensor::imag() const { return complex_part(*this, 1, "imag()"); }

Tensor Tensor::view_as_real() const {
  Tensor parts = complex_part(*this, 0, "view_as_real()");
  DimVector sizes(parts.sizes()), strides(parts.strides());
  sizes.push_back(2);
  strides.push_back(1);
  return make_tensor_unchecked(storage_, parts.dtype(), std::move(sizes), std::move(strides), parts.storage_offset());
}

}  // namespace mmt
