// Copies between layouts, dtypes and devices; every one goes through detail::copy_strided or,
// across dtypes, the same element walk with a conversion.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cuda_memory.h"
#include "mapping_guard.h"
#include "mmtensor/tensor.h"
#include "strided_copy.h"
#include "tensor_geometry.h"

namespace mmt {

namespace {

using Wide16 = float;
template <typename T>
using Arith = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, Wide16, T>;

// A floating value as integer type To, defined for every value (C++ leaves a value out of
// To's range, and NaN, undefined: UBSan's float-cast-overflow). For signed types and uint8,
// as PyTorch's casts give it on x86-64: through int64 for int64 and uint8 (PyTorch's own
// special case for uint8) and through int32 for int8, int16, uint16 and int32, then
// truncated, with the processor's "integer indefinite" (the lowest value) for what does not
// fit: 300.0 as uint8 is 44, 3e9 as int32 is INT32_MIN, NaN as int64 is INT64_MIN. uint32
// goes through int64 too (4294967296.0 is 0, -1.0 is 2^32 - 1), and uint64 takes
// [2^63, 2^64) exactly, a value in int64's range through it (-1.0 is 2^64 - 1) and anything
// else as 2^63: there PyTorch's own result depends on its compiler and the processor's
// vector instructions, so these are defined values, not its.
template <typename To, typename F>
To float_to_integer(F v) {
  static_assert(std::is_integral_v<To> && std::is_floating_point_v<F>);
  const auto in_int64 = [](F x) { return x >= F(-9223372036854775808.0) && x < F(9223372036854775808.0); };
  if constexpr (std::is_same_v<To, uint64_t>) {
    if (v >= F(9223372036854775808.0) && v < F(18446744073709551616.0))
      return static_cast<uint64_t>(v - F(9223372036854775808.0)) ^ (uint64_t{1} << 63);
    return static_cast<uint64_t>(in_int64(v) ? static_cast<int64_t>(v) : INT64_MIN);
  } else if constexpr (sizeof(To) == 8 || std::is_same_v<To, uint32_t> || std::is_same_v<To, uint8_t>) {
    return static_cast<To>(in_int64(v) ? static_cast<int64_t>(v) : INT64_MIN);
  } else {
    const bool in_int32 = v >= F(-2147483648.0) && v < F(2147483648.0);
    return static_cast<To>(in_int32 ? static_cast<int32_t>(v) : INT32_MIN);
  }
}

// copy_()'s element conversion, PyTorch's casts: through float for the half types; a real value
// becomes a complex one with imaginary part 0; a complex value becomes a real one by dropping
// its imaginary part (PyTorch warns there, once), and a bool by being nonzero in either part,
// as Python's bool(1j) and numpy read it (PyTorch's CPU cast once looked at the real part
// only, and was made to agree: pytorch/pytorch#120875).
template <typename To, typename From>
To convert_value(From v) {
  if constexpr (is_complex_type_v<From>) {
    if constexpr (is_complex_type_v<To>) {
      using Part = typename To::value_type;
      return To(static_cast<Part>(v.real()), static_cast<Part>(v.imag()));
    } else if constexpr (std::is_same_v<To, bool>) {
      return v != From(0);
    } else {
      return convert_value<To>(v.real());
    }
  } else if constexpr (is_complex_type_v<To>) {
    return To(convert_value<typename To::value_type>(v), 0);
  } else {
    Arith<From> wide = static_cast<Arith<From>>(v);
    if constexpr (std::is_same_v<To, bool>) {
      return wide != Arith<From>(0);
    } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
      return To(static_cast<float>(wide));
    } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<Arith<From>>) {
      return float_to_integer<To>(wide);
    } else {
      return static_cast<To>(wide);
    }
  }
}

DimVector byte_strides(const Tensor& t) {
  DimVector s = t.strides();
  for (auto& v : s) v *= t.element_size();
  return s;
}

// Byte range [first, last] of the storage a (non-empty) view touches.
std::pair<int64_t, int64_t> byte_span(const Tensor& t) {
  detail::Extent e = detail::element_extent(t.sizes(), t.strides());
  int64_t first = (t.storage_offset() + e.min_offset) * t.element_size();
  int64_t last = (t.storage_offset() + e.max_offset + 1) * t.element_size() - 1;
  return {first, last};
}

// By address, not by storage: two from_blob() storages over one buffer alias as well.
bool may_overlap(const Tensor& a, const Tensor& b) { return !detail::is_provably_disjoint(a, b); }

bool has_internal_overlap(const Tensor& t) {
  for (size_t d = 0; d < t.sizes().size(); ++d)
    if (t.sizes()[d] > 1 && t.strides()[d] == 0) return true;
  return false;
}

// `dst_strides`/`src_strides`: byte strides, made by the caller outside the SIGBUS guard
// (siglongjmp would skip a DimVector's destructor).
void copy_host_unguarded(const Tensor& dst, IntArrayRef dst_strides, const Tensor& src, IntArrayRef src_strides) {
  if (dst.dtype() == src.dtype()) {
    detail::copy_strided(dst.mutable_data_ptr(), dst.strides(), src.data_ptr(), src.strides(),
                         dst.sizes(), dst.element_size());
    return;
  }
  char* d = static_cast<char*>(dst.mutable_data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  dispatch_scalar_type(dst.dtype(), [&](auto dst_tag) {
    using To = decltype(dst_tag);
    dispatch_scalar_type(src.dtype(), [&](auto src_tag) {
      using From = decltype(src_tag);
      detail::for_each_element_pair(d, dst_strides, s, src_strides, dst.sizes(),
                                    [](char* out, const char* in) {
                                      To w = convert_value<To>(load_element<From>(in));
                                      std::memcpy(out, &w, sizeof(To));
                                    });
    });
  });
}

// Host-to-host copy of same-shaped views; `src` already broadcast to dst's sizes. Either side
// may be a file's mapping: a file cut short under it is an IoError, not SIGBUS.
void copy_host(const Tensor& dst, const Tensor& src) {
  const DimVector dst_strides = byte_strides(dst), src_strides = byte_strides(src);
  detail::guard_storage_reads(dst.untyped_storage(), [&] {
    detail::guard_storage_reads(src.untyped_storage(), [&] { copy_host_unguarded(dst, dst_strides, src, src_strides); });
  });
}

// A host tensor with the same layout as device tensor `t`, over a copy of the bytes it spans.
Tensor host_mirror(const Tensor& t) {
  auto [first, last] = byte_span(t);
  UntypedStorage host = UntypedStorage::allocate(last - first + 1);
  cuda::memcpy(host.mutable_data(), t.untyped_storage().data() + first, last - first + 1, t.device().index);
  return Tensor(host, t.dtype(), t.sizes(), t.strides(),
                t.storage_offset() - first / t.element_size());
}

}  // namespace

const Tensor& Tensor::copy_(const Tensor& src) const {
  MMT_CHECK(defined_ && src.defined(), ValueError, "copy_ with an undefined tensor");
  Tensor source = src;
  if (src.sizes() != sizes()) {
    try {
      source = src.expand(sizes_);
    } catch (const ValueError&) {  // expand's own words name neither tensor
      throw ValueError(detail::str("copy_: a source of shape ", src.sizes(), " does not broadcast to the output's "
                                   "shape ", sizes_, " (PyTorch: output with shape ", sizes_,
                                   " doesn't match the broadcast shape)"));
    }
  }
  if (numel() == 0) return *this;
  MMT_CHECK(!has_internal_overlap(*this), ValueError,
            "unsupported operation: more than one element of the written-to tensor refers to a "
            "single memory location. Please clone() the tensor before performing the operation.");
  if (may_overlap(*this, source)) source = source.clone(MemoryFormat::Contiguous);

  if (!is_cuda() && !source.is_cuda()) {
    copy_host(*this, source);
    return *this;
  }
  // Device copies: one cudaMemcpy when both sides are the same dense layout, else stage the
  // strided copy on the host.
  if (dtype_ == source.dtype() && IntArrayRef(strides_) == source.strides() &&
      detail::is_non_overlapping_and_dense(sizes_, strides_)) {
    auto [d0, d1] = byte_span(*this);
    auto [s0, s1] = byte_span(source);
    (void)s1;
    cuda::memcpy(storage_.mutable_data() + d0, source.untyped_storage().data() + s0, d1 - d0 + 1,
                 is_cuda() ? device().index : source.device().index);
    return *this;
  }
  Tensor host_src = source.is_cuda() ? host_mirror(source) : source;
  if (!is_cuda()) {
    copy_host(*this, host_src);
    return *this;
  }
  Tensor staged = host_mirror(*this);  // keeps the bytes between dst's elements intact
  copy_host(staged, host_src);
  auto [first, last] = byte_span(*this);
  cuda::memcpy(storage_.mutable_data() + first, staged.untyped_storage().data(), last - first + 1,
               device().index);
  return *this;
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  MMT_CHECK(defined_, ValueError, "contiguous() of an undefined tensor");
  MMT_CHECK(format != MemoryFormat::Preserve, ValueError,  // as PyTorch refuses it
            "contiguous: preserve memory format is unsupported (it says how clone() and empty_like() lay out a "
            "copy; name a layout)");
  if (is_contiguous(format)) return *this;
  Tensor out = empty(sizes_, dtype_, device(), format);
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone(MemoryFormat format) const {
  MMT_CHECK(defined_, ValueError, "clone() of an undefined tensor");
  Tensor out = format == MemoryFormat::Preserve ? empty_like(*this, format)
                                                : empty(sizes_, dtype_, device(), format);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(ScalarType dtype) const {
  MMT_CHECK(defined_, ValueError, "to() of an undefined tensor");
  if (dtype == dtype_) return *this;
  Tensor out = empty_strided(sizes_, detail::preserved_strides(sizes_, strides_), dtype, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  (void)non_blocking;  // copies through the engine are synchronous; the loader streams its own
  MMT_CHECK(defined_, ValueError, "to() of an undefined tensor");
  if (target == device()) return *this;
  // The layout kept, as clone() keeps it (dense strides in the same order for a sparse view).
  Tensor out = empty_strided(sizes_, detail::preserved_strides(sizes_, strides_), dtype_, target);
  out.copy_(*this);
  return out;
}

Tensor Tensor::pin_memory() const {
  MMT_CHECK(defined_, ValueError, "pin_memory() of an undefined tensor");
  MMT_CHECK(!is_cuda(), ValueError, "cannot pin '", device().str(),
            "' memory: only dense CPU tensors can be pinned");
  if (is_pinned()) return *this;
  Tensor out = empty_strided(sizes_, detail::preserved_strides(sizes_, strides_), dtype_, kCPU, /*pin_memory=*/true);
  out.copy_(*this);
  return out;
}

namespace {

// Fills `t` from a 0-d host tensor of `value`'s own dtype: copy_() converts it, so an
// integer reaches an integer dtype without passing through a double.
template <typename T>
const Tensor& fill_from_scalar(const Tensor& t, T value) {
  MMT_CHECK(t.defined(), ValueError, "fill_() of an undefined tensor");
  // As PyTorch: a value the dtype cannot hold is refused, not wrapped (300 into uint8).
  dispatch_scalar_type(t.dtype(), [&](auto tag) {
    MMT_CHECK(!detail::overflows<decltype(tag)>(value), ValueError, "fill_: the value ", value,
              " cannot be converted to type ", to_string(t.dtype()), " without overflow");
  });
  if (t.numel() == 0) return t;
  Tensor scalar = empty({}, scalar_type_of<T>);
  std::memcpy(scalar.mutable_data_ptr(), &value, sizeof(T));
  // Every element gets the same value, so an expanded tensor may be filled (as PyTorch fills
  // one): each broadcast dimension is written once, through its first index.
  Tensor written = t;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.strides()[d] == 0 && t.sizes()[d] > 1) written = written.narrow(d, 0, 1);
  written.copy_(scalar);
  return t;
}

}  // namespace

const Tensor& Tensor::fill_with(double value) const { return fill_from_scalar(*this, value); }
const Tensor& Tensor::fill_with(int64_t value) const { return fill_from_scalar(*this, value); }
const Tensor& Tensor::fill_with(uint64_t value) const { return fill_from_scalar(*this, value); }

namespace {

// The dtype torch.equal compares two different dtypes in (PyTorch's promotion, widened where
// that loses nothing): a complex type with a complex one (complex128 beside a double); a floating type with an integer one in
// the floating type (an int64 may round there, as in PyTorch); two floating types in float64;
// integers and bools in int64, or uint64 when one is uint64 (the caller checks the other
// side's signs first).
ScalarType equal_comparison_dtype(ScalarType a, ScalarType b) {
  if (is_complex(a) || is_complex(b)) {  // complex64 unless a double is on either side
    const bool double_precision = a == kComplex128 || b == kComplex128 || a == kFloat64 || b == kFloat64;
    return double_precision ? kComplex128 : kComplex64;
  }
  if (is_floating_point(a) && is_floating_point(b)) return kFloat64;
  if (is_floating_point(a)) return a;
  if (is_floating_point(b)) return b;
  return a == kUInt64 || b == kUInt64 ? kUInt64 : kInt64;
}

}  // namespace

bool Tensor::equal(const Tensor& other) const {
  MMT_CHECK(defined_ && other.defined(), ValueError, "equal() with an undefined tensor");
  if (sizes() != other.sizes()) return false;
  if (dtype_ != other.dtype()) {
    const ScalarType common = equal_comparison_dtype(dtype_, other.dtype());
    if (common == kUInt64) {  // a negative value equals no uint64, and must not wrap into one
      for (const Tensor* side : {this, &other}) {
        if (side->dtype() == kUInt64 || !is_signed(side->dtype())) continue;
        Tensor as_int64 = empty(sizes_, kInt64);
        as_int64.copy_(*side);
        const std::vector<int64_t> values = as_int64.to_vector<int64_t>();
        if (std::any_of(values.begin(), values.end(), [](int64_t v) { return v < 0; })) return false;
      }
    }
    Tensor a = empty(sizes_, common), b = empty(sizes_, common);
    a.copy_(*this);
    b.copy_(other);
    return a.equal(b);
  }
  Tensor a = (is_cuda() ? cpu() : *this).contiguous();
  Tensor b = (other.is_cuda() ? other.cpu() : other).contiguous();
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  const int64_t n = a.numel();
  const auto compare = [&] {
    return dispatch_scalar_type(dtype_, [&](auto tag) {
      using T = decltype(tag);
      for (int64_t i = 0; i < n; ++i) {
        const T x = load_element<T>(pa + i * sizeof(T)), y = load_element<T>(pb + i * sizeof(T));
        if (static_cast<Arith<T>>(x) != static_cast<Arith<T>>(y)) return false;
      }
      return true;
    });
  };
  // contiguous() gives a contiguous view back as it is: a and b may still be mappings.
  return detail::guard_storage_reads(a.untyped_storage(), [&] {
    return detail::guard_storage_reads(b.untyped_storage(), compare);
  });
}

}  // namespace mmt
