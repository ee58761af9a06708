// Tensor: a strided view (dtype, sizes, strides, storage offset) over an UntypedStorage.
//
// Semantics follow PyTorch's torch.Tensor: sizes and strides are counted in elements, as is
// storage_offset(); element (i, j, ...) lives at byte
//     (storage_offset + i*stride[0] + j*stride[1] + ...) * element_size
// of the storage. View operations (view, permute, transpose, select, narrow, slice, squeeze,
// unsqueeze, expand) make new metadata over the same storage and never copy; reshape() and
// flatten() return a view when the strides allow it and a copy otherwise (writes to a copy
// do not reach the original); contiguous() copies only when needed; clone() always copies.
// MemoryFormat::Preserve is for copies (clone, empty_like, to): is_contiguous(), contiguous(),
// empty() and strides_for() refuse it with ValueError, as PyTorch does.
//
// Beyond PyTorch, deliberately: as_strided() and the strided constructor take negative
// strides (numpy-style, bounds-checked), which PyTorch refuses; and copy_() from a source that
// partly overlaps the destination copies as if the source were read first (memmove), where
// PyTorch refuses. A destination with elements that share memory (expanded) is refused, as in
// PyTorch.
//
// Lifetime: a Tensor holds shared ownership of its storage, so a view outlives the dataset,
// mapping or tensor it came from. Memory is kept alive, not unchanged: a Loader batch's
// tensors live in a ring slot that is refilled once the batch is released (loader.h), so a
// tensor kept past that must be clone()d.
//
// Thread safety: const methods may be called from many threads at once. Writing elements
// concurrently is the caller's business.
//
// Errors: an out-of-range dimension or index throws IndexError; an impossible shape or a
// refused view throws ValueError with the reason (and, for view(), a hint to use reshape()).
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "mmtensor/dims.h"
#include "mmtensor/dtype.h"
#include "mmtensor/error.h"
#include "mmtensor/storage.h"

namespace mmt {

enum class MemoryFormat : uint8_t {
  Contiguous,      // row-major (NCHW for 4-d)
  ChannelsLast,    // 4-d NCHW shape with NHWC strides
  ChannelsLast3d,  // 5-d NCDHW shape with NDHWC strides
  Preserve,        // keep the input's layout where possible (clone, empty_like)
};

// Python-style slice bounds for Tensor::slice; negative start/stop count from the end.
inline constexpr int64_t kSliceEnd = std::numeric_limits<int64_t>::max();

class Tensor {
 public:
  // An undefined tensor (defined() == false).
  Tensor() = default;
  // A view over `storage`. Checks that every reachable element lies inside the storage
  // (ValueError otherwise), so a Tensor never addresses bytes outside its storage.
  Tensor(UntypedStorage storage, ScalarType dtype, IntArrayRef sizes, IntArrayRef strides,
         int64_t storage_offset = 0);
  // A view with contiguous (row-major) strides.
  Tensor(UntypedStorage storage, ScalarType dtype, IntArrayRef sizes, int64_t storage_offset = 0);

  bool defined() const { return defined_; }
  ScalarType dtype() const { return dtype_; }
  ScalarType scalar_type() const { return dtype_; }
  Device device() const { return storage_.device(); }
  bool is_cuda() const { return storage_.is_cuda(); }
  bool is_pinned() const { return storage_.is_pinned(); }
  bool is_complex() const { return mmt::is_complex(dtype_); }
  bool is_floating_point() const { return mmt::is_floating_point(dtype_); }
  IntArrayRef sizes() const { return sizes_; }
  IntArrayRef strides() const { return strides_; }
  IntArrayRef shape() const { return sizes_; }
  // size(d) and stride(d) accept negative dimensions, as in PyTorch; a 0-d tensor has none
  // (IndexError).
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t storage_offset() const { return storage_offset_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t ndimension() const { return dim(); }
  int64_t numel() const;
  int64_t element_size() const { return mmt::element_size(dtype_); }
  // numel() * element_size(): the bytes the elements occupy, not the storage's size.
  int64_t nbytes() const { return numel() * element_size(); }
  const UntypedStorage& untyped_storage() const { return storage_; }

  // Address of element (0, 0, ...). mutable_* throws for a read-only storage.
  const void* data_ptr() const;
  void* mutable_data_ptr() const;
  template <typename T> const T* data_ptr() const {
    check_dtype(scalar_type_of<T>);
    return static_cast<const T*>(data_ptr());
  }
  template <typename T> T* mutable_data_ptr() const {
    check_dtype(scalar_type_of<T>);
    return static_cast<T*>(mutable_data_ptr());
  }

  // Checked element access on host tensors: at<float>({1, 2}); negative indices count from
  // the end, as in PyTorch (at<float>({-1, 0})). Throws IndexError.
  // Loads and stores go through memcpy: a mapping viewed at any byte offset may leave an
  // element unaligned, and a bool byte from a file may be neither 0 nor 1 (load_element).
  template <typename T> T at(IntArrayRef index) const {
    check_dtype(scalar_type_of<T>);
    return load_element<T>(element_ptr(index));
  }
  template <typename T> void set(IntArrayRef index, T value) const {
    check_dtype(scalar_type_of<T>);
    std::memcpy(const_cast<void*>(element_ptr(index, /*writable=*/true)), &value, sizeof(T));
  }
  // The single element of a one-element tensor, converted to T (any dtype) as static_cast
  // converts the stored value: an integer read as an integer type is exact (a double holds
  // integers only up to 2^53). A value T cannot hold is a ValueError, as in PyTorch
  // (detail::overflows: a negative integer may wrap into an unsigned T, and a float is
  // truncated toward zero).
  // A complex element converts to a real T only when its imaginary part is zero (ValueError
  // otherwise, as PyTorch's item<double>() refuses it); item<std::complex<double>>() reads it.
  template <typename T> T item() const {
    if constexpr (is_complex_type_v<T>) return static_cast<T>(item_as_complex());
    else if constexpr (std::is_same_v<T, bool>) return item_as_complex() != 0.0;
    else if constexpr (std::is_integral_v<T>) {
      if (is_floating_point() || is_complex()) return checked_item<T>(item_as_double());
      if (dtype_ == kUInt64) return checked_item<T>(item_as_uint64());
      return checked_item<T>(item_as_int64());
    } else {
      return checked_item<T>(item_as_double());
    }
  }
  double item_as_double() const;
  // The element as an int64_t / uint64_t (exact for integer dtypes; ValueError for a value
  // the type cannot hold, as item() says).
  int64_t item_as_int64() const;
  uint64_t item_as_uint64() const;
  std::complex<double> item_as_complex() const;
  // All elements converted to double, in row-major order (for tests and printing); complex
  // elements as item_as_double() converts them.
  std::vector<double> to_double_vector() const;
  // All elements as T (the tensor's own dtype), in row-major order; from the host or a device.
  template <typename T> std::vector<T> to_vector() const {
    check_dtype(scalar_type_of<T>);
    // A view of a file's mapping is copied first, by the engine's guarded copy: the loop below
    // runs in the caller's code, where a file cut short under it would be a SIGBUS.
    const Tensor host = is_cuda() ? cpu() : *this;
    const Tensor c = host.untyped_storage().filename().empty() ? host.contiguous() : host.clone(MemoryFormat::Contiguous);
    const char* p = static_cast<const char*>(c.data_ptr());
    std::vector<T> out(static_cast<size_t>(c.numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = load_element<T>(p + i * sizeof(T));
    return out;
  }

  // ---- views (no copies) ----
  Tensor view(IntArrayRef sizes) const;  // one size may be -1
  Tensor reshape(IntArrayRef sizes) const;
  Tensor permute(IntArrayRef dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a tensor of at most 2 dimensions
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // x[start:stop:step] along dim, with Python's clamping of start/stop; step > 0.
  Tensor slice(int64_t dim, int64_t start = 0, int64_t stop = kSliceEnd, int64_t step = 1) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  // Broadcasts size-1 dimensions to `sizes` with stride 0; -1 keeps a size.
  Tensor expand(IntArrayRef sizes) const;
  Tensor as_strided(IntArrayRef sizes, IntArrayRef strides, int64_t storage_offset) const;
  // torch.real / torch.imag: the real or imaginary parts of a complex tensor as a view of the
  // parts' dtype (float32 for complex64), strides in that dtype's elements. real() of a real
  // tensor is the tensor itself; imag() of one is a ValueError, as in PyTorch.
  Tensor real() const;
  Tensor imag() const;
  // torch.view_as_real: a complex tensor as a view with one more, last dimension of size 2
  // holding (real, imaginary); ValueError for a real tensor.
  Tensor view_as_real() const;

  // ---- layout ----
  bool is_contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  // The layout a copy should keep (ChannelsLast for a 4-d channels-last tensor, ...).
  MemoryFormat suggest_memory_format() const;
  // This tensor if it already is contiguous in `format`, else a copy that is.
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  // torch's x.to(memory_format=...): contiguous(format), and this tensor for Preserve (to()'s
  // default in PyTorch: nothing to change).
  Tensor to(MemoryFormat format) const { return format == MemoryFormat::Preserve ? *this : contiguous(format); }
  // Always a new storage.
  Tensor clone(MemoryFormat format = MemoryFormat::Preserve) const;
  // Copies src's elements into this tensor (same sizes, or src broadcastable; any layouts,
  // any dtypes, host or device). Returns *this. Dtypes convert as PyTorch casts them; a
  // complex value into a real dtype keeps its real part (PyTorch warns there), into bool is
  // true when either part is nonzero. Into a device view with gaps between its
  // elements, the whole span is read, changed and written back: a kernel writing those gaps
  // at the same time on another stream would lose its writes.
  const Tensor& copy_(const Tensor& src) const;
  // torch's t.set_(source, storage_offset, size, stride): this tensor becomes a view of
  // `source` with that geometry (checked as the constructor checks it) and keeps its dtype.
  // It changes this handle only; other views of the old storage are untouched.
  Tensor& set_(UntypedStorage source, int64_t storage_offset, IntArrayRef size, IntArrayRef stride);
  // Same layout class on another device; this tensor itself when already there. The copy is
  // always synchronous: non_blocking is accepted for PyTorch's signature (the Loader's copies
  // are the asynchronous ones).
  Tensor to(Device device, bool non_blocking = false) const;
  // torch's x.to(dtype): this tensor when it has that dtype, else a copy on the same device,
  // its layout kept, converted as copy_() converts (x.to(kFloat32) of a uint8 image).
  Tensor to(ScalarType dtype) const;
  Tensor cpu() const { return to(kCPU); }
  // A copy in pinned host memory (this tensor when already pinned). Without a CUDA device,
  // or when the device cannot pin (UntypedStorage::allocate_pinned), the copy is ordinary
  // memory (is_pinned() false, a note on stderr once), and each call copies again. PyTorch
  // raises there instead.
  Tensor pin_memory() const;
  // Sets every element to `value`, converted to the dtype as copy_() converts. An integer
  // value is converted from an integer, so it stays exact in an integer dtype:
  // fill_(int64_t{1} << 60 | 1) on an int64 tensor (a double would have rounded it).
  template <typename T>
    requires std::is_arithmetic_v<T>
  const Tensor& fill_(T value) const {
    if constexpr (std::is_floating_point_v<T>) return fill_with(static_cast<double>(value));
    else if constexpr (std::is_signed_v<T>) return fill_with(static_cast<int64_t>(value));
    else return fill_with(static_cast<uint64_t>(value));
  }
  const Tensor& zero_() const { return fill_(0.0); }

  // torch.equal: same sizes and the same values; different dtypes are compared after
  // PyTorch's type promotion (an int64 and a float32 in float32).
  bool equal(const Tensor& other) const;
  // True when both views share one storage.
  bool is_same_storage(const Tensor& other) const { return storage_.is_same(other.storage_); }

  // Printed as PyTorch prints it: tensor([[1., 2.], [3., 4.]]) with dtype when not default.
  std::string to_string() const;
  friend std::ostream& operator<<(std::ostream& out, const Tensor& t) {
    return out << t.to_string();
  }

 private:
  const Tensor& fill_with(double value) const;
  const Tensor& fill_with(int64_t value) const;
  const Tensor& fill_with(uint64_t value) const;
  void check_dtype(ScalarType requested) const;
  void check_defined(const char* op) const;  // ValueError naming `op` for an undefined tensor
  template <typename T, typename From> static T checked_item(From value) {
    if constexpr (requires { ScalarTypeOf<T>::value; })
      MMT_CHECK(!detail::overflows<T>(value), ValueError, "item(): the value ", value, " cannot be converted to ",
                mmt::to_string(scalar_type_of<T>), " without overflow");
    else
      MMT_CHECK(!detail::overflows<T>(value), ValueError, "item(): the value ", value,
                " cannot be converted to the requested type without overflow");
    return static_cast<T>(value);
  }
  const void* element_ptr(IntArrayRef index, bool writable = false) const;
  int64_t wrap_dim(int64_t dim, int64_t ndim_plus = 0) const;

  UntypedStorage storage_;
  DimVector sizes_;
  DimVector strides_;
  int64_t storage_offset_ = 0;
  ScalarType dtype_ = ScalarType::Float32;
  bool defined_ = false;

  friend Tensor make_tensor_unchecked(UntypedStorage, ScalarType, DimVector, DimVector, int64_t);
  friend void assign_tensor_unchecked(Tensor&, const UntypedStorage&, ScalarType, IntArrayRef, IntArrayRef, int64_t);
};

// ---- factories ----
// Contiguous strides of `sizes` in elements: [2, 3] -> [3, 1].
DimVector contiguous_strides(IntArrayRef sizes);
// Strides of `sizes` laid out in `format`: [32,3,224,224] ChannelsLast -> [150528,1,672,3].
DimVector strides_for(IntArrayRef sizes, MemoryFormat format);

Tensor empty(IntArrayRef sizes, ScalarType dtype = kFloat32, Device device = kCPU,
             MemoryFormat format = MemoryFormat::Contiguous, bool pin_memory = false);
Tensor empty_strided(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype = kFloat32,
                     Device device = kCPU, bool pin_memory = false);
Tensor empty_like(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor zeros(IntArrayRef sizes, ScalarType dtype = kFloat32, Device device = kCPU);
// A new tensor of `dtype` filled with `value` as fill_() fills it (integers exact).
template <typename T>
  requires std::is_arithmetic_v<T>
Tensor full(IntArrayRef sizes, T value, ScalarType dtype = kFloat32, Device device = kCPU) {
  Tensor out = empty(sizes, dtype, device);
  out.fill_(value);
  return out;
}
// 0, 1, ..., end-1 (int64 by default, like torch.arange with integer arguments).
Tensor arange(int64_t end, ScalarType dtype = kInt64);
Tensor arange(int64_t start, int64_t end, int64_t step = 1, ScalarType dtype = kInt64);
// A 1-d tensor holding `values`, or shaped by `sizes` (whose product must match).
template <typename T>
Tensor tensor(const std::vector<T>& values, IntArrayRef sizes = {});
template <typename T>
Tensor tensor(std::initializer_list<T> values, IntArrayRef sizes = {}) {
  return tensor(std::vector<T>(values), sizes);
}
// A 0-d tensor of T's dtype holding `value` exactly: scalar_tensor(int64_t{42}), or
// scalar_tensor<uint8_t>(7). (tensor<T>({v}) is 1-d: empty sizes mean "as many as values".)
template <typename T>
Tensor scalar_tensor(T value);
// A 2-d tensor from rows: tensor2d<int64_t>({{1, 2}, {3, 4}}).
template <typename T>
Tensor tensor2d(std::initializer_list<std::initializer_list<T>> rows);

// Builds a view without the bounds check; for the engine's hot paths that have already
// validated the extent (Dataset::get). Not for user code.
Tensor make_tensor_unchecked(UntypedStorage storage, ScalarType dtype, DimVector sizes,
                             DimVector strides, int64_t storage_offset);
// The same view made in `out` (a sample's field, filled in place: no temporary tensor).
void assign_tensor_unchecked(Tensor& out, const UntypedStorage& storage, ScalarType dtype, IntArrayRef sizes,
                             IntArrayRef strides, int64_t storage_offset);

// ---- template definitions ----
template <typename T>
Tensor tensor(const std::vector<T>& values, IntArrayRef sizes) {
  DimVector shape = sizes.empty() ? DimVector{static_cast<int64_t>(values.size())} : DimVector(sizes);
  Tensor out = empty(shape, scalar_type_of<T>);
  MMT_CHECK(out.numel() == static_cast<int64_t>(values.size()), ValueError, "tensor(): ",
            values.size(), " values do not fill shape ", IntArrayRef(shape));
  if (!values.empty()) {
    T* dst = out.mutable_data_ptr<T>();
    for (size_t i = 0; i < values.size(); ++i) dst[i] = values[i];
  }
  return out;
}

template <typename T>
Tensor scalar_tensor(T value) {
  Tensor out = empty({}, scalar_type_of<T>);
  *out.mutable_data_ptr<T>() = value;
  return out;
}

template <typename T>
Tensor tensor2d(std::initializer_list<std::initializer_list<T>> rows) {
  std::vector<T> flat;
  int64_t cols = rows.size() ? static_cast<int64_t>(rows.begin()->size()) : 0;
  for (const auto& row : rows) {
    MMT_CHECK(static_cast<int64_t>(row.size()) == cols, ValueError,
              "tensor2d(): rows of different lengths (", row.size(), " vs ", cols, ")");
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return tensor(flat, {static_cast<int64_t>(rows.size()), cols});
}

}  // namespace mmt
