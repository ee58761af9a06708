// Tensor construction, metadata, element access, contiguity and factories.
#include "mmtensor/tensor.h"

#include <cstring>

#include "mapping_guard.h"
#include "tensor_geometry.h"

namespace mmt {

namespace {

// A view may only address bytes of its storage; checked once, when the view is made.
void check_view_in_bounds(const UntypedStorage& storage, ScalarType dtype, IntArrayRef sizes,
                          IntArrayRef strides, int64_t storage_offset) {
  MMT_CHECK(sizes.size() == strides.size(), ValueError, "sizes ", sizes, " and strides ", strides,
            " have different lengths");
  MMT_CHECK(storage_offset >= 0, ValueError, "storage_offset must be non-negative, got ",
            storage_offset);
  int64_t numel = detail::checked_numel(sizes);
  // An empty view may start anywhere (PyTorch's rule), but data_ptr() adds its offset in
  // bytes to the storage's address, and that product must exist.
  int64_t offset_bytes = 0;
  MMT_CHECK(!__builtin_mul_overflow(storage_offset, element_size(dtype), &offset_bytes), ValueError,
            "storage_offset ", storage_offset, " (", to_string(dtype), ") is past any address");
  if (numel == 0) return;
  detail::Extent e = detail::element_extent(sizes, strides);
  const int64_t esize = element_size(dtype);
  int64_t first = 0, last = 0, end_bytes = 0;
  bool overflow = __builtin_add_overflow(storage_offset, e.min_offset, &first) ||
                  __builtin_add_overflow(storage_offset, e.max_offset, &last) ||
                  __builtin_add_overflow(last, 1, &end_bytes) ||
                  __builtin_mul_overflow(end_bytes, esize, &end_bytes);
  MMT_CHECK(!overflow && first >= 0 && end_bytes <= storage.nbytes(), ValueError,
            "view of size ", sizes, ", stride ", strides, " and storage offset ", storage_offset,
            " (", to_string(dtype), ") reaches outside the storage of ", storage.nbytes(),
            " bytes");
}

}  // namespace

Tensor::Tensor(UntypedStorage storage, ScalarType dtype, IntArrayRef sizes, IntArrayRef strides,
               int64_t storage_offset) {
  check_view_in_bounds(storage, dtype, sizes, strides, storage_offset);
  storage_ = std::move(storage);
  dtype_ = dtype;
  sizes_ = sizes;
  strides_ = strides;
  storage_offset_ = storage_offset;
  defined_ = true;
}

Tensor::Tensor(UntypedStorage storage, ScalarType dtype, IntArrayRef sizes, int64_t storage_offset)
    : Tensor(std::move(storage), dtype, sizes, contiguous_strides(sizes), storage_offset) {}

Tensor make_tensor_unchecked(UntypedStorage storage, ScalarType dtype, DimVector sizes,
                             DimVector strides, int64_t storage_offset) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.sizes_ = std::move(sizes);
  t.strides_ = std::move(strides);
  t.storage_offset_ = storage_offset;
  t.defined_ = true;
  return t;
}

void assign_tensor_unchecked(Tensor& out, const UntypedStorage& storage, ScalarType dtype, IntArrayRef sizes,
                             IntArrayRef strides, int64_t storage_offset) {
  out.storage_ = storage;
  out.dtype_ = dtype;
  out.sizes_.assign(sizes);
  out.strides_.assign(strides);
  out.storage_offset_ = storage_offset;
  out.defined_ = true;
}

int64_t Tensor::wrap_dim(int64_t dim, int64_t ndim_plus) const {
  return detail::wrap_dim(dim, this->dim() + ndim_plus);
}

// Unlike the view operations, these do not wrap a 0-d tensor's dimension 0 or -1: a scalar
// has no size to return (PyTorch raises too).
int64_t Tensor::size(int64_t d) const {
  MMT_CHECK(dim() > 0, IndexError, "size(", d, "): the tensor has no dimensions");
  return sizes_[wrap_dim(d)];
}
int64_t Tensor::stride(int64_t d) const {
  MMT_CHECK(dim() > 0, IndexError, "stride(", d, "): the tensor has no dimensions");
  return strides_[wrap_dim(d)];
}

Tensor& Tensor::set_(UntypedStorage source, int64_t storage_offset, IntArrayRef size, IntArrayRef stride) {
  MMT_CHECK(defined_, ValueError, "set_() of an undefined tensor (it has no dtype)");
  *this = Tensor(std::move(source), dtype_, size, stride, storage_offset);  // checked, then assigned
  return *this;
}

int64_t Tensor::numel() const {
  if (!defined_) return 0;  // no elements, not the one of a 0-d tensor
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;  // bounded: checked when the view was made
  return n;
}

const void* Tensor::data_ptr() const {
  MMT_CHECK(defined_, ValueError, "data_ptr() of an undefined tensor");
  const std::byte* base = storage_.data();
  return base ? base + storage_offset_ * element_size() : nullptr;
}

void* Tensor::mutable_data_ptr() const {
  MMT_CHECK(defined_, ValueError, "mutable_data_ptr() of an undefined tensor");
  std::byte* base = storage_.mutable_data();
  return base ? base + storage_offset_ * element_size() : nullptr;
}

void Tensor::check_defined(const char* op) const {
  MMT_CHECK(defined_, ValueError, op, " of an undefined tensor");
}

void Tensor::check_dtype(ScalarType requested) const {
  MMT_CHECK(defined_, ValueError, "access to an undefined tensor");
  MMT_CHECK(requested == dtype_, ValueError, "expected a tensor of dtype ", mmt::to_string(requested),
            " but this tensor is ", mmt::to_string(dtype_));
}

const void* Tensor::element_ptr(IntArrayRef index, bool writable) const {
  MMT_CHECK(!is_cuda(), ValueError, "element access to a tensor on ", device().str(),
            "; copy it to the host with .cpu() first");
  MMT_CHECK(static_cast<int64_t>(index.size()) == dim(), IndexError, "index of ", index.size(),
            " dimension(s) for a tensor of ", dim(), " dimension(s)");
  int64_t offset = storage_offset_;
  for (size_t d = 0; d < index.size(); ++d) {
    // Negative indices count from the end, as t[-1] does in PyTorch.
    MMT_CHECK(index[d] >= -sizes_[d] && index[d] < sizes_[d], IndexError, "index ", index[d],
              " is out of bounds for dimension ", d, " with size ", sizes_[d]);
    offset += (index[d] < 0 ? index[d] + sizes_[d] : index[d]) * strides_[d];
  }
  const std::byte* base = writable ? storage_.mutable_data() : storage_.data();
  return base + offset * element_size();
}

namespace {

// The real value of a complex element, for conversions that have no room for an imaginary
// part: PyTorch's item() of a complex tensor into a real C++ type refuses a nonzero one (a
// NaN one too: it is not zero).
template <typename C>
typename C::value_type real_part_or_throw(const C& v, const char* target) {
  MMT_CHECK(v.imag() == 0, ValueError, "value (", v.real(), (v.imag() < 0 ? "" : "+"), v.imag(),
            "j) cannot be converted to type ", target, " without losing its imaginary part");
  return v.real();
}

// static_cast<To> of a one-element tensor's stored value (half types through float; a complex
// value only when its imaginary part is zero).
template <typename To>
To item_as(const Tensor& t, const char* target) {
  MMT_CHECK(t.defined() && t.numel() == 1, ValueError, "a Tensor with ", (t.defined() ? t.numel() : 0),
            " elements cannot be converted to a scalar");
  const Tensor host = t.is_cuda() ? t.cpu() : t;
  const void* p = host.data_ptr();
  return dispatch_scalar_type(t.dtype(), [&](auto tag) -> To {
    using T = decltype(tag);
    // A view into a file that another program cut short: IoError, not SIGBUS.
    const T v = detail::guard_storage_reads(host.untyped_storage(), [&] { return load_element<T>(p); });
    if constexpr (is_complex_type_v<T>) {
      if constexpr (is_complex_type_v<To>) {
        return To(v);
      } else {
        const auto real = real_part_or_throw(v, target);
        MMT_CHECK(!detail::overflows<To>(real), ValueError, "item(): the value ", real, " cannot be converted to ",
                  target, " without overflow");
        return static_cast<To>(real);
      }
    } else {
      using Arithmetic = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
      const auto value = static_cast<Arithmetic>(v);
      if constexpr (!std::is_same_v<To, double>)  // every dtype's values fit a double
        MMT_CHECK(!detail::overflows<To>(value), ValueError, "item(): the value ", +value,
                  " cannot be converted to ", target, " without overflow");
      return static_cast<To>(value);
    }
  });
}

}  // namespace

double Tensor::item_as_double() const { return item_as<double>(*this, "double"); }
int64_t Tensor::item_as_int64() const { return item_as<int64_t>(*this, "int64_t"); }
uint64_t Tensor::item_as_uint64() const { return item_as<uint64_t>(*this, "uint64_t"); }
std::complex<double> Tensor::item_as_complex() const { return item_as<std::complex<double>>(*this, "complex"); }


std::vector<double> Tensor::to_double_vector() const {
  Tensor c = contiguous();
  if (c.is_cuda()) c = c.cpu();
  std::vector<double> out(static_cast<size_t>(c.numel()));
  const char* p = static_cast<const char*>(c.data_ptr());
  // contiguous() gives a contiguous view back as it is: c may be a file's mapping.
  detail::guard_storage_reads(c.untyped_storage(), [&] {
    dispatch_scalar_type(dtype_, [&](auto tag) {
      using T = decltype(tag);
      using Wide = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
      for (size_t i = 0; i < out.size(); ++i) {
        if constexpr (is_complex_type_v<T>)
          out[i] = static_cast<double>(real_part_or_throw(load_element<T>(p + i * sizeof(T)), "double"));
        else
          out[i] = static_cast<double>(static_cast<Wide>(load_element<T>(p + i * sizeof(T))));
      }
    });
  });
  return out;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  check_defined("is_contiguous()");
  switch (format) {
    case MemoryFormat::Preserve:  // a copy's instruction, not a layout
      throw ValueError("is_contiguous: preserve memory format is unsupported (it says how clone() "
                       "and empty_like() lay out a copy; name a layout)");
    case MemoryFormat::Contiguous:
      return detail::is_contiguous_strides(sizes_, strides_);
    case MemoryFormat::ChannelsLast:
      return detail::is_channels_last_strides(sizes_, strides_);
    case MemoryFormat::ChannelsLast3d:
      return detail::is_channels_last_3d_strides(sizes_, strides_);
  }
  return false;
}

MemoryFormat Tensor::suggest_memory_format() const {
  // PyTorch's rule: by the order of the strides, dense or not (a slice of a channels-last
  // batch is still channels-last), and never for an empty tensor.
  if (dim() == 4 && detail::strides_like_channels_last(sizes_, strides_, detail::kChannelsLastOrder))
    return MemoryFormat::ChannelsLast;
  if (dim() == 5 && detail::strides_like_channels_last(sizes_, strides_, detail::kChannelsLast3dOrder))
    return MemoryFormat::ChannelsLast3d;
  return MemoryFormat::Contiguous;
}

// ---- factories ----

DimVector contiguous_strides(IntArrayRef sizes) {
  DimVector strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) {
    // A zero-size dimension makes numel 0 but the strides around it can still overflow.
    MMT_CHECK(!__builtin_mul_overflow(strides[d], std::max<int64_t>(sizes[d], 1), &strides[d - 1]),
              ValueError, "the strides of shape ", sizes, " overflow int64");
  }
  return strides;
}

DimVector strides_for(IntArrayRef sizes, MemoryFormat format) {
  switch (format) {
    case MemoryFormat::Preserve:  // there is no input whose layout to keep
      throw ValueError(detail::str("preserve memory format is unsupported for a new tensor of shape ", sizes,
                                   " (use empty_like() or clone() to keep a tensor's layout)"));
    case MemoryFormat::Contiguous:
      return contiguous_strides(sizes);
    case MemoryFormat::ChannelsLast:
      MMT_CHECK(sizes.size() == 4, ValueError,
                "required rank 4 tensor to use channels_last format, got shape ", sizes);
      return detail::dense_strides_in_order(sizes, detail::kChannelsLastOrder);
    case MemoryFormat::ChannelsLast3d:
      MMT_CHECK(sizes.size() == 5, ValueError,
                "required rank 5 tensor to use channels_last_3d format, got shape ", sizes);
      return detail::dense_strides_in_order(sizes, detail::kChannelsLast3dOrder);
  }
  return contiguous_strides(sizes);
}

Tensor empty_strided(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device,
                     bool pin_memory) {
  MMT_CHECK(sizes.size() == strides.size(), ValueError, "empty_strided: sizes ", sizes,
            " and strides ", strides, " have different lengths");
  int64_t numel = detail::checked_numel(sizes);
  int64_t span = numel == 0 ? 0 : detail::element_extent(sizes, strides).max_offset + 1;
  for (int64_t s : strides)
    MMT_CHECK(s >= 0, ValueError, "empty_strided: negative stride in ", strides);
  int64_t nbytes = 0;
  MMT_CHECK(!__builtin_mul_overflow(span, element_size(dtype), &nbytes), ValueError,
            "empty_strided: shape ", sizes, " is too large");
  MMT_CHECK(!(pin_memory && device.is_cuda()), ValueError,
            "pin_memory applies to host tensors, not ", device.str());
  UntypedStorage storage = pin_memory ? UntypedStorage::allocate_pinned(nbytes)
                                      : UntypedStorage::allocate(nbytes, device);
  return make_tensor_unchecked(std::move(storage), dtype, DimVector(sizes), DimVector(strides), 0);
}

Tensor empty(IntArrayRef sizes, ScalarType dtype, Device device, MemoryFormat format,
             bool pin_memory) {
  detail::checked_numel(sizes);
  return empty_strided(sizes, strides_for(sizes, format), dtype, device, pin_memory);
}

Tensor empty_like(const Tensor& t, MemoryFormat format) {
  MMT_CHECK(t.defined(), ValueError, "empty_like of an undefined tensor");
  if (format == MemoryFormat::Preserve)
    return empty_strided(t.sizes(), detail::preserved_strides(t.sizes(), t.strides()), t.dtype(), t.device());
  return empty(t.sizes(), t.dtype(), t.device(), format);
}

Tensor zeros(IntArrayRef sizes, ScalarType dtype, Device device) {
  Tensor t = empty(sizes, dtype, device);
  UntypedStorage storage = t.untyped_storage();  // a handle: fills the tensor's bytes
  storage.fill_(0);
  return t;
}

Tensor arange(int64_t end, ScalarType dtype) { return arange(0, end, 1, dtype); }

Tensor arange(int64_t start, int64_t end, int64_t step, ScalarType dtype) {
  // PyTorch's checks and words; values past the dtype wrap (integers) or become inf, as there.
  MMT_CHECK(step != 0, ValueError, "arange: step must be nonzero");
  MMT_CHECK(step > 0 ? end >= start : end <= start, ValueError,
            "arange: upper bound and larger bound inconsistent with step sign (start ", start, ", end ", end,
            ", step ", step, ")");
  MMT_CHECK(dtype != kBool, ValueError, "arange: not implemented for 'Bool'");
  // In 128 bits: end - start, and i * step on the way to a value in [start, end), may not fit 64.
  using Wide = __int128;
  const Wide span = Wide{end} - start;
  const Wide count = (span + step + (step > 0 ? -1 : 1)) / step;
  MMT_CHECK(count <= std::numeric_limits<int64_t>::max(), ValueError, "arange: invalid size, possible overflow? (",
            "start ", start, ", end ", end, ", step ", step, ")");
  const auto n = static_cast<int64_t>(count);
  Tensor t = empty({n}, dtype);
  if (n == 0) return t;
  const auto value_at = [&](int64_t i) { return static_cast<int64_t>(Wide{start} + Wide{i} * step); };
  char* p = static_cast<char*>(t.mutable_data_ptr());
  dispatch_scalar_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      T v;
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        v = T(static_cast<float>(value_at(i)));
      else if constexpr (is_complex_type_v<T>)
        v = T(static_cast<typename T::value_type>(value_at(i)), 0);
      else
        v = static_cast<T>(value_at(i));
      std::memcpy(p + i * sizeof(T), &v, sizeof(T));
    }
  });
  return t;
}

}  // namespace mmt
