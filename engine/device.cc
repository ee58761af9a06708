#include <charconv>

#include "mmtensor/device.h"
#include "mmtensor/error.h"

namespace mmt {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return kCPU;
  if (text == "cuda") return Device(DeviceType::CUDA, 0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0)
      return Device(DeviceType::CUDA, index);
  }
  throw ValueError(detail::str("invalid device '", text, "': expected 'cpu', 'cuda' or 'cuda:N'"));
}

std::string Device::str() const { return is_cpu() ? "cpu" : detail::str("cuda:", index); }

}  // namespace mmt
