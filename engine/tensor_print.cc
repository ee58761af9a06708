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
constexpr int kPrecision = 4;       // PyTorch's default print precision

// printf of one double with a conversion ('e' or 'f') and a number of decimals.
std::string printf_double(char conversion, double v, int decimals) {
  const char fmt[] = {'%', '.', '*', conversion, '\0'};
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, decimals, v);
  return buf;
}

// Integers print exactly: a double holds them only up to 2^53.
std::string integer_text(const Tensor& scalar) {
  return is_signed(scalar.dtype()) ? std::to_string(scalar.item_as_int64()) : std::to_string(scalar.item_as_uint64());
}

// Calls visit(element) for each element of the summarised view, in the order they print.
template <typename Visit>
void collect(const Tensor& t, bool summarize, const Visit& visit) {
  if (t.dim() == 0) {
    visit(t);
    return;
  }
  const int64_t n = t.size(0);
  auto one = [&](int64_t i) {
    if (t.dim() == 1) visit(t.select(0, i));
    else collect(t.select(0, i), summarize, visit);
  };
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) one(i);
    for (int64_t i = n - kEdgeItems; i < n; ++i) one(i);
  } else {
    for (int64_t i = 0; i < n; ++i) one(i);
  }
}

class Formatter {
 public:
  // Chooses the format and width from the elements `t` shows (summarised or not).
  Formatter(const Tensor& t, bool summarize)
      : floating_(is_floating_point(t.dtype())), boolean_(t.dtype() == kBool) {
    if (boolean_) {
      width_ = 0;
      collect(t, summarize, [&](const Tensor& e) { width_ = std::max<int64_t>(width_, e.item_as_double() != 0 ? 4 : 5); });
      return;
    }
    if (!floating_) {
      collect(t, summarize, [&](const Tensor& e) { width_ = std::max<int64_t>(width_, integer_text(e).size()); });
      return;
    }
    std::vector<double> values;
    collect(t, summarize, [&](const Tensor& e) { values.push_back(e.item_as_double()); });
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
      const std::string s = finite_text(v);
      width_ = std::max<int64_t>(width_, s.size());
    }
  }

  int64_t width() const { return width_; }

  std::string format(const Tensor& scalar) const {
    std::string s;
    const double v = floating_ || boolean_ ? scalar.item_as_double() : 0.0;
    if (boolean_) {
      s = v != 0 ? "True" : "False";
    } else if (!floating_) {
      s = integer_text(scalar);
    } else if (std::isnan(v)) {
      s = "nan";
    } else if (std::isinf(v)) {
      s = v > 0 ? "inf" : "-inf";
    } else {
      s = finite_text(v);
    }
    if (static_cast<int64_t>(s.size()) < width_) s.insert(0, width_ - s.size(), ' ');
    return s;
  }

 private:
  // A finite value in the mode chosen from all the values: "1.5000e+03", "3." or "0.2500".
  std::string finite_text(double v) const {
    if (sci_mode_) return printf_double('e', v, kPrecision);
    if (int_mode_) return printf_double('f', v, 0) + ".";
    return printf_double('f', v, kPrecision);
  }

  bool floating_;
  bool boolean_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  int64_t width_ = 1;
};

// A complex element as PyTorch prints it: the real part by one formatter, the imaginary part
// by another (each chose its width from its own parts), joined by its sign: "1.+2.j", "0.-1.j".
class ComplexFormatter {
 public:
  ComplexFormatter(const Tensor& t, bool summarize) : real_(t.real(), summarize), imag_(t.imag(), summarize) {}

  // What an element adds to a line, as PyTorch counts it: both widths and the "j".
  int64_t width() const { return real_.width() + imag_.width() + 1; }

  std::string format(const Tensor& scalar) const {
    std::string real = real_.format(scalar.real());
    std::string imag = imag_.format(scalar.imag()) + "j";
    imag.erase(0, imag.find_first_not_of(' '));
    return imag[0] == '-' || imag[0] == '+' ? real + imag : real + "+" + imag;
  }

 private:
  Formatter real_;
  Formatter imag_;
};

template <typename ElementFormatter>
std::string vector_str(const Tensor& t, int64_t indent, bool summarize, const ElementFormatter& fmt) {
  const int64_t element_length = fmt.width() + 2;
  const int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / element_length);
  std::vector<std::string> items;
  const int64_t n = t.size(0);
  auto add = [&](int64_t i) { items.push_back(fmt.format(t.select(0, i))); };
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

template <typename ElementFormatter>
std::string tensor_str(const Tensor& t, int64_t indent, bool summarize, const ElementFormatter& fmt) {
  if (t.dim() == 0) return fmt.format(t);
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
  std::string sep = ",";  // appended, not "," + ...: GCC 12 warns (-Wrestrict) on that form
  sep.append(static_cast<size_t>(t.dim() - 1), '\n').append(static_cast<size_t>(indent + 1), ' ');
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
  // PyTorch's defaults with float32 as the default dtype; complex64 is then the default complex.
  const bool default_dtype = dtype_ == kFloat32 || dtype_ == kComplex64 || dtype_ == kInt64 || dtype_ == kBool;
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
    body = mmt::is_complex(dtype_) ? tensor_str(host, indent, summarize, ComplexFormatter(host, summarize))
                                   : tensor_str(host, indent, summarize, Formatter(host, summarize));
    if (!default_dtype) suffixes.push_back("dtype=torch." + std::string(mmt::to_string(dtype_)));
  }
  std::string out = prefix + body;
  // PyTorch's count (_add_suffixes: len(s) - s.rfind("\n") + 1), which decides where its
  // dtype wraps: two more than the last line's length (rfind gives -1 without a newline).
  const size_t newline = out.rfind('\n');
  int64_t last_line = static_cast<int64_t>(newline == std::string::npos ? out.size() + 2 : out.size() - newline + 1);
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
