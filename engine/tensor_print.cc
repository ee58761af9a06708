// Printing in PyTorch's style (torch/_tensor_str.py): the same number formats, line width,
// summarisation of large tensors and dtype/size suffixes, so a sample reads like torch output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "mmtensor/tensor.h"

namespace mmt {

namespace {

constexpr int64_t kThreshold = 1000;  // summarise tensors with more elements
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;
constexpr int kPrecision = 4;

std::string printf_double(const char* fmt, double v, int width = 0) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, width, v);
  return buf;
}

class Formatter {
 public:
  Formatter(ScalarType dtype, const std::vector<double>& values)
      : floating_(is_floating_point(dtype)), boolean_(dtype == kBool) {
    if (boolean_) {
      width_ = 0;
      for (double v : values) width_ = std::max<int64_t>(width_, v != 0 ? 4 : 5);
      return;
    }
    if (!floating_) {
      for (double v : values) width_ = std::max<int64_t>(width_, int_text(v).size());
      return;
    }
    std::vector<double> finite;
    for (double v : values)
      if (std::isfinite(v) && v != 0) finite.push_back(std::fabs(v));
    if (finite.empty()) return;  // only zeros, infs and nans: integer mode, width 1
    double lo = *std::min_element(finite.begin(), finite.end());
    double hi = *std::max_element(finite.begin(), finite.end());
    for (double v : finite)
      if (v != std::ceil(v)) int_mode_ = false;
    if (int_mode_) {
      if (hi / lo > 1000.0 || hi > 1.0e8) sci_mode_ = true;
    } else if (hi / lo > 1000.0 || hi > 1.0e8 || lo < 1.0e-4) {
      sci_mode_ = true;
    }
    for (double v : values) {
      if (!(std::isfinite(v) && v != 0)) continue;
      std::string s = sci_mode_ ? printf_double("%*.4e", v)
                      : int_mode_ ? printf_double("%*.0f", v) + "."
                                  : printf_double("%*.4f", v);
      width_ = std::max<int64_t>(width_, s.size());
    }
  }

  int64_t width() const { return width_; }

  std::string format(double v) const {
    std::string s;
    if (boolean_) {
      s = v != 0 ? "True" : "False";
    } else if (!floating_) {
      s = int_text(v);
    } else if (std::isnan(v)) {
      s = "nan";
    } else if (std::isinf(v)) {
      s = v > 0 ? "inf" : "-inf";
    } else if (sci_mode_) {
      s = printf_double("%*.4e", v);
    } else if (int_mode_) {
      s = printf_double("%*.0f", v) + ".";
    } else {
      s = printf_double("%*.4f", v);
    }
    if (static_cast<int64_t>(s.size()) < width_) s.insert(0, width_ - s.size(), ' ');
    return s;
  }

 private:
  static std::string int_text(double v) {
    // Integers up to 2^63 print exactly through long double; beyond that, as uint64.
    if (v >= 9.2233720368547758e18) return std::to_string(static_cast<unsigned long long>(v));
    return std::to_string(static_cast<long long>(v));
  }

  bool floating_;
  bool boolean_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  int64_t width_ = 1;
};

// Elements of the summarised view, in the order they will be printed.
void collect(const Tensor& t, bool summarize, std::vector<double>& out) {
  if (t.dim() == 0) {
    out.push_back(t.item_as_double());
    return;
  }
  const int64_t n = t.size(0);
  auto visit = [&](int64_t i) {
    if (t.dim() == 1) out.push_back(t.select(0, i).item_as_double());
    else collect(t.select(0, i), summarize, out);
  };
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) visit(i);
    for (int64_t i = n - kEdgeItems; i < n; ++i) visit(i);
  } else {
    for (int64_t i = 0; i < n; ++i) visit(i);
  }
}

std::string vector_str(const Tensor& t, int64_t indent, bool summarize, const Formatter& fmt) {
  const int64_t element_length = fmt.width() + 2;
  const int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / element_length);
  std::vector<std::string> items;
  const int64_t n = t.size(0);
  auto add = [&](int64_t i) { items.push_back(fmt.format(t.select(0, i).item_as_double())); };
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) add(i);
    items.push_back(" ...");
    for (int64_t i = n - kEdgeItems; i < n; ++i) add(i);
  } else {
    for (int64_t i = 0; i < n; ++i) add(i);
  }
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) {
      bool new_line = static_cast<int64_t>(i) % per_line == 0;
      out += new_line ? ",\n" + std::string(indent + 1, ' ') : ", ";
    }
    out += items[i];
  }
  return out + "]";
}

std::string tensor_str(const Tensor& t, int64_t indent, bool summarize, const Formatter& fmt) {
  if (t.dim() == 0) return fmt.format(t.item_as_double());
  if (t.dim() == 1) return vector_str(t, indent, summarize, fmt);
  std::vector<std::string> slices;
  const int64_t n = t.size(0);
  auto add = [&](int64_t i) { slices.push_back(tensor_str(t.select(0, i), indent + 1, summarize, fmt)); };
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) add(i);
    slices.push_back("...");
    for (int64_t i = n - kEdgeItems; i < n; ++i) add(i);
  } else {
    for (int64_t i = 0; i < n; ++i) add(i);
  }
  const std::string sep = "," + std::string(t.dim() - 1, '\n') + std::string(indent + 1, ' ');
  std::string out = "[";
  for (size_t i = 0; i < slices.size(); ++i) out += (i ? sep : "") + slices[i];
  return out + "]";
}

}  // namespace

std::string Tensor::to_string() const {
  if (!defined_) return "[ Tensor (undefined) ]";
  const std::string prefix = "tensor(";
  const int64_t indent = static_cast<int64_t>(prefix.size());
  Tensor host = is_cuda() ? cpu() : *this;
  std::vector<std::string> suffixes;
  if (is_cuda()) suffixes.push_back("device='" + device().str() + "'");
  const bool default_dtype = dtype_ == kFloat32 || dtype_ == kInt64 || dtype_ == kBool;
  std::string body;
  if (numel() == 0) {
    if (dim() != 1) {
      std::string size = "size=(";
      for (int64_t d = 0; d < dim(); ++d) size += (d ? ", " : "") + std::to_string(sizes_[d]);
      suffixes.push_back(size + (dim() == 1 ? ",)" : ")"));
    }
    if (dtype_ != kFloat32) suffixes.push_back("dtype=torch." + std::string(mmt::to_string(dtype_)));
    body = "[]";
  } else {
    const bool summarize = numel() > kThreshold;
    std::vector<double> shown;
    collect(host, summarize, shown);
    Formatter fmt(dtype_, shown);
    body = tensor_str(host, indent, summarize, fmt);
    if (!default_dtype) suffixes.push_back("dtype=torch." + std::string(mmt::to_string(dtype_)));
  }
  std::string out = prefix + body;
  int64_t last_line = static_cast<int64_t>(out.size() - (out.rfind('\n') == std::string::npos
                                                             ? 0 : out.rfind('\n')) + 1);
  for (const auto& s : suffixes) {
    if (last_line + static_cast<int64_t>(s.size()) + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + s;
      last_line = indent + static_cast<int64_t>(s.size());
    } else {
      out += ", " + s;
      last_line += static_cast<int64_t>(s.size()) + 2;
    }
  }
  return out + ")";
}

}  // namespace mmt
