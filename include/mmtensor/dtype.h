// Element types of tensors and dataset fields, named as in PyTorch (torch.float32 ...).
#pragma once

#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <string_view>
#include <type_traits>
#include <utility>

namespace mmt {

enum class ScalarType : uint8_t {
  Bool = 0,
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  UInt16 = 4,
  Int32 = 5,
  UInt32 = 6,
  Int64 = 7,
  UInt64 = 8,
  Float16 = 9,
  BFloat16 = 10,
  Float32 = 11,
  Float64 = 12,
  // Appended after the others, so that every earlier code keeps its value.
  ComplexFloat = 13,   // torch.complex64: two float32, real part first
  ComplexDouble = 14,  // torch.complex128: two float64, real part first
};
inline constexpr int kNumScalarTypes = 15;

// PyTorch-style spellings: mmt::kFloat32 reads like torch.float32.
inline constexpr ScalarType kBool = ScalarType::Bool;
inline constexpr ScalarType kUInt8 = ScalarType::UInt8;
inline constexpr ScalarType kInt8 = ScalarType::Int8;
inline constexpr ScalarType kInt16 = ScalarType::Int16;
inline constexpr ScalarType kUInt16 = ScalarType::UInt16;
inline constexpr ScalarType kInt32 = ScalarType::Int32;
inline constexpr ScalarType kUInt32 = ScalarType::UInt32;
inline constexpr ScalarType kInt64 = ScalarType::Int64;
inline constexpr ScalarType kUInt64 = ScalarType::UInt64;
inline constexpr ScalarType kFloat16 = ScalarType::Float16;
inline constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
inline constexpr ScalarType kFloat32 = ScalarType::Float32;
inline constexpr ScalarType kFloat64 = ScalarType::Float64;
inline constexpr ScalarType kComplex64 = ScalarType::ComplexFloat;
inline constexpr ScalarType kComplex128 = ScalarType::ComplexDouble;

// Size of one element in bytes.
constexpr int64_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::Bool: case ScalarType::UInt8: case ScalarType::Int8: return 1;
    case ScalarType::Int16: case ScalarType::UInt16: case ScalarType::Float16:
    case ScalarType::BFloat16: return 2;
    case ScalarType::Int32: case ScalarType::UInt32: case ScalarType::Float32: return 4;
    case ScalarType::Int64: case ScalarType::UInt64: case ScalarType::Float64:
    case ScalarType::ComplexFloat: return 8;
    case ScalarType::ComplexDouble: return 16;
  }
  return 0;
}

constexpr bool is_floating_point(ScalarType t) {
  return t == ScalarType::Float16 || t == ScalarType::BFloat16 || t == ScalarType::Float32 ||
         t == ScalarType::Float64;
}

// torch.is_complex: complex64 and complex128 (which are not is_floating_point, as in PyTorch).
constexpr bool is_complex(ScalarType t) { return t == ScalarType::ComplexFloat || t == ScalarType::ComplexDouble; }

// The real type of a complex type's parts (torch.complex64 -> torch.float32); `t` otherwise.
constexpr ScalarType to_real_value_type(ScalarType t) {
  return t == ScalarType::ComplexFloat ? ScalarType::Float32 : t == ScalarType::ComplexDouble ? ScalarType::Float64 : t;
}

// Whether the type holds negative values (torch.dtype.is_signed): the floating and complex
// types and the signed integers.
constexpr bool is_signed(ScalarType t) {
  return is_floating_point(t) || is_complex(t) || t == ScalarType::Int8 || t == ScalarType::Int16 || t == ScalarType::Int32 ||
         t == ScalarType::Int64;
}

// "float32", "uint8", ... (PyTorch's names without the "torch." prefix).
std::string_view to_string(ScalarType t);
// std::cout << t.dtype() prints to_string(t), as print(t.dtype) prints torch.float32.
inline std::ostream& operator<<(std::ostream& out, ScalarType t) { return out << to_string(t); }
// The inverse of to_string; also accepts PyTorch's aliases ("float", "double", "half", "long",
// "int", "short", "byte", "char", "cfloat", "cdouble") and a "torch." prefix.
std::optional<ScalarType> scalar_type_from_string(std::string_view name);
// True when the value is a valid ScalarType code (for decoding untrusted bytes).
constexpr bool is_valid_scalar_type_code(uint8_t code) { return code < kNumScalarTypes; }

// 16-bit floating-point storage types. They convert to and from float; no arithmetic.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float value);
  explicit operator float() const;
};
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value);
  explicit operator float() const;
};

// The ScalarType of a C++ type: scalar_type_of<float> == kFloat32.
template <typename T> struct ScalarTypeOf;
template <> struct ScalarTypeOf<bool> { static constexpr ScalarType value = kBool; };
template <> struct ScalarTypeOf<uint8_t> { static constexpr ScalarType value = kUInt8; };
template <> struct ScalarTypeOf<int8_t> { static constexpr ScalarType value = kInt8; };
template <> struct ScalarTypeOf<int16_t> { static constexpr ScalarType value = kInt16; };
template <> struct ScalarTypeOf<uint16_t> { static constexpr ScalarType value = kUInt16; };
template <> struct ScalarTypeOf<int32_t> { static constexpr ScalarType value = kInt32; };
template <> struct ScalarTypeOf<uint32_t> { static constexpr ScalarType value = kUInt32; };
template <> struct ScalarTypeOf<int64_t> { static constexpr ScalarType value = kInt64; };
template <> struct ScalarTypeOf<uint64_t> { static constexpr ScalarType value = kUInt64; };
template <> struct ScalarTypeOf<Half> { static constexpr ScalarType value = kFloat16; };
template <> struct ScalarTypeOf<BFloat16> { static constexpr ScalarType value = kBFloat16; };
template <> struct ScalarTypeOf<float> { static constexpr ScalarType value = kFloat32; };
template <> struct ScalarTypeOf<double> { static constexpr ScalarType value = kFloat64; };
template <> struct ScalarTypeOf<std::complex<float>> { static constexpr ScalarType value = kComplex64; };
template <> struct ScalarTypeOf<std::complex<double>> { static constexpr ScalarType value = kComplex128; };
template <typename T> inline constexpr ScalarType scalar_type_of = ScalarTypeOf<T>::value;

// True for std::complex<float> and std::complex<double>, the C++ types of the complex dtypes.
template <typename T> inline constexpr bool is_complex_type_v = false;
template <typename R> inline constexpr bool is_complex_type_v<std::complex<R>> = true;

// The element of type T stored at `p` (any alignment). A bool is read as its byte and true
// when that byte is nonzero: a byte from a file may be neither 0 nor 1, and loading it as a
// C++ bool would be undefined behaviour.
template <typename T>
T load_element(const void* p) {
  if constexpr (std::is_same_v<T, bool>) {
    uint8_t byte;
    std::memcpy(&byte, p, 1);
    return byte != 0;
  } else {
    T value;
    std::memcpy(&value, p, sizeof(T));
    return value;
  }
}

namespace detail {
// PyTorch's c10::overflows: whether converting `value` to To would change it (or be undefined
// behaviour). As in PyTorch: a negative integer may wrap into an unsigned type as far down as
// -max (uint8 takes -1 as 255); inf and nan go into any floating type, nan into no integer
// type; a floating value goes into an integer type when it lies in [lowest, max] (so -0.5 goes
// into int8 but into no unsigned type, and 255.9 not into uint8, as in PyTorch). Half holds up to
// 65504 and BFloat16 up to about 3.39e38; bool takes anything; a complex To, its real part.
template <typename To, typename From>
constexpr bool overflows(From value) {
  if constexpr (std::is_same_v<To, bool> || std::is_same_v<From, bool>) {
    return false;
  } else if constexpr (is_complex_type_v<To>) {
    return overflows<typename To::value_type>(value);
  } else if constexpr (std::is_floating_point_v<To> || std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    double max = 0;
    if constexpr (std::is_same_v<To, Half>) max = 65504.0;
    else if constexpr (std::is_same_v<To, BFloat16>) max = 3.3895313892515355e38;
    else max = static_cast<double>(std::numeric_limits<To>::max());
    const auto v = static_cast<double>(value);
    if (v != v || v == std::numeric_limits<double>::infinity() || v == -std::numeric_limits<double>::infinity())
      return false;
    return v > max || v < -max;
  } else if constexpr (std::is_floating_point_v<From>) {  // an integer To
    using Limits = std::numeric_limits<To>;
    if (value != value) return true;
    // [lowest, max], as PyTorch; for a max a double rounds up (int64's, to 2^63), 2^digits
    // bounds it instead, exactly.
    const From past_max = static_cast<From>(Limits::max() / 2 + 1) * 2;
    return !(value >= static_cast<From>(Limits::lowest()) && value <= static_cast<From>(Limits::max()) &&
             value < past_max);
  } else if constexpr (!std::is_signed_v<To> && std::is_signed_v<From>) {
    if (value >= 0) return !std::in_range<To>(value);
    return static_cast<std::make_unsigned_t<From>>(-(value + 1)) >= std::numeric_limits<To>::max();
  } else {
    return !std::in_range<To>(value);
  }
}
}  // namespace detail

// Calls fn(T{}) with the C++ type T of `t`; the one type switch the engine uses.
template <typename Fn>
decltype(auto) dispatch_scalar_type(ScalarType t, Fn&& fn) {
  switch (t) {
    case ScalarType::Bool: return fn(bool{});
    case ScalarType::UInt8: return fn(uint8_t{});
    case ScalarType::Int8: return fn(int8_t{});
    case ScalarType::Int16: return fn(int16_t{});
    case ScalarType::UInt16: return fn(uint16_t{});
    case ScalarType::Int32: return fn(int32_t{});
    case ScalarType::UInt32: return fn(uint32_t{});
    case ScalarType::Int64: return fn(int64_t{});
    case ScalarType::UInt64: return fn(uint64_t{});
    case ScalarType::Float16: return fn(Half{});
    case ScalarType::BFloat16: return fn(BFloat16{});
    case ScalarType::Float32: return fn(float{});
    case ScalarType::Float64: return fn(double{});
    case ScalarType::ComplexFloat: return fn(std::complex<float>{});
    case ScalarType::ComplexDouble: return fn(std::complex<double>{});
  }
  return fn(uint8_t{});
}

}  // namespace mmt
