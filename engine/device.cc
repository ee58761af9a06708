#include <charconv>

#include "mmtensor/device.h"
#include "mmtensor/error.h"

namespace mmt {

Device Device::parse(std::string_view text) {
  // torch.device's grammar: an index is 0 or digits without a leading zero ("cuda:01" is
  // refused), and "cpu:N" names the one host.
  const auto index_of = [](std::string_view digits) {
    int index = -1;
    if (digits.empty() || digits[0] < '0' || digits[0] > '9' || (digits.size() > 1 && digits[0] == '0')) return -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    return ec == std::errc() && end == digits.data() + digits.size() ? index : -1;
  };
  if (text == "cpu" || (text.starts_with("cpu:") && index_of(text.substr(4)) >= 0)) return kCPU;
  if (text == "cuda") return Device(DeviceType::CUDA, 0);
  if (text.starts_with("cuda:"))
    if (const int index = index_of(text.substr(5)); index >= 0) return Device(DeviceType::CUDA, index);
  throw ValueError(detail::str("invalid device '", text, "': expected 'cpu', 'cuda' or 'cuda:N' (N an index: 0, 1, ...)"));
}

std::string Device::str() const { return is_cpu() ? "cpu" : detail::str("cuda:", index); }

}  // namespace mmt
