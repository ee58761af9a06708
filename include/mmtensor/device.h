// Where a storage's bytes live: host memory (cpu) or a CUDA device (cuda:N).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace mmt {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // the CUDA device ordinal; 0 for cpu

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::CPU ? 0 : i) {}
  // Parses torch.device's spellings: "cpu", "cpu:N", "cuda", "cuda:N" (N a decimal index
  // without leading zeros); throws ValueError on anything else.
  static Device parse(std::string_view text);

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:N"
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

// std::cout << t.device() prints "cpu" or "cuda:N".
inline std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

inline constexpr Device kCPU{};

// CUDA availability at run time. Both are safe to call in a build without CUDA (false / 0).
bool cuda_is_available();
int cuda_device_count();
// True when this build of mmtensor contains the CUDA path.
bool built_with_cuda();
// Why cuda_device_count() is 0, in the runtime's words ("no CUDA-capable device is
// detected", "CUDA driver version is insufficient for CUDA runtime version", or that this
// build has no CUDA); empty when devices are present. A driver too old for the runtime this
// build links looks like no device at all, so tests and benchmarks print this when they skip.
std::string cuda_unavailable_reason();

}  // namespace mmt
