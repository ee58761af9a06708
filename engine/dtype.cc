#include <bit>
#include <cmath>

#include "mmtensor/dims.h"
#include "mmtensor/dtype.h"

namespace mmt {

std::string_view to_string(ScalarType t) {
  switch (t) {
    case ScalarType::Bool: return "bool";
    case ScalarType::UInt8: return "uint8";
    case ScalarType::Int8: return "int8";
    case ScalarType::Int16: return "int16";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::Int32: return "int32";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::Int64: return "int64";
    case ScalarType::UInt64: return "uint64";
    case ScalarType::Float16: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float32: return "float32";
    case ScalarType::Float64: return "float64";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
  }
  return "invalid";
}

std::optional<ScalarType> scalar_type_from_string(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  for (int code = 0; code < kNumScalarTypes; ++code) {
    auto t = static_cast<ScalarType>(code);
    if (to_string(t) == name) return t;
  }
  // PyTorch's aliases.
  if (name == "float") return kFloat32;
  if (name == "double") return kFloat64;
  if (name == "half") return kFloat16;
  if (name == "long") return kInt64;
  if (name == "int") return kInt32;
  if (name == "short") return kInt16;
  if (name == "cfloat") return kComplex64;
  if (name == "cdouble") return kComplex128;
  if (name == "byte") return kUInt8;  // torch.byte (NumPy's "byte" is int8: the Python module refuses it)
  if (name == "char") return kInt8;   // torch.char
  return std::nullopt;
}

// IEEE binary16 <-> binary32 with round-to-nearest-even, handling subnormals, inf and NaN.
Half::Half(float value) {
  uint32_t f = std::bit_cast<uint32_t>(value);
  uint32_t sign = (f >> 16) & 0x8000u;
  uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (keep NaN quiet)
    bits = static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to a value beyond the largest half: inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs < 0x38800000u) {  // subnormal half (or zero): scale by adding a magic float
    float magic = std::bit_cast<float>(0x3f000000u);  // 0.5
    float scaled = std::bit_cast<float>(abs) + magic;
    bits = static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(scaled) - 0x3f000000u));
    return;
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  bits = static_cast<uint16_t>(sign | (abs >> 13));
}

Half::operator float() const {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        ++shift;
      }
      mant &= 0x3ffu;
      out = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

BFloat16::BFloat16(float value) {
  uint32_t f = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) {
    bits = static_cast<uint16_t>((f >> 16) | 0x40u);
    return;
  }
  uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);  // round to nearest even
  bits = static_cast<uint16_t>((f + rounding) >> 16);
}

BFloat16::operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

std::ostream& operator<<(std::ostream& out, IntArrayRef values) {
  out << '[';
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  return out << ']';
}

}  // namespace mmt
