#include <algorithm>

#include "mmtensor/error.h"
#include "format.h"
#include "quoted_names.h"
#include "mmtensor/schema.h"
#include "utf8.h"

namespace mmt {
namespace {

using format::kMaxFieldNameBytes;
using format::kMaxFieldRank;

bool is_identity(IntArrayRef order) {
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

Field Field::fixed(std::string name, ScalarType dtype, IntArrayRef shape) {
  Field field{std::move(name), dtype, DimVector(shape), {}};
  field.validate();
  MMT_CHECK(field.is_fixed(), ValueError, "field '", field.name, "': Field::fixed needs a shape "
            "without variable dimensions, got ", shape, " (use Field::ragged)");
  return field;
}

Field Field::ragged(std::string name, ScalarType dtype, IntArrayRef shape) {
  Field field{std::move(name), dtype, DimVector(shape), {}};
  field.validate();
  MMT_CHECK(!field.is_fixed(), ValueError, "field '", field.name, "': Field::ragged needs at "
            "least one variable dimension (-1) in its shape, got ", shape, " (use Field::fixed)");
  return field;
}

Field Field::bytes(std::string name) { return ragged(std::move(name), kUInt8, {kVariableDim}); }

Field& Field::stored_channels_last() {
  if (shape.size() == 3) return with_storage_order({1, 2, 0});
  if (shape.size() == 4) return with_storage_order({1, 2, 3, 0});
  throw ValueError(detail::str("field '", name, "': channels-last storage needs a [C, H, W] or "
                               "[C, D, H, W] shape, got ", IntArrayRef(shape)));
}

Field& Field::with_storage_order(IntArrayRef order) {
  Field candidate = *this;
  candidate.storage_order = DimVector(order);
  candidate.validate();
  // The identity is row-major, which an empty order already means: one spelling per layout.
  storage_order = is_identity(order) ? DimVector() : DimVector(order);
  return *this;
}

bool Field::is_fixed() const { return variable_dims() == 0; }

bool Field::stored_in_logical_order() const {
  for (size_t d = 0; d < storage_order.size(); ++d)
    if (storage_order[d] != static_cast<int64_t>(d)) return false;
  return true;
}

int64_t Field::variable_dims() const {
  return std::count(shape.begin(), shape.end(), kVariableDim);
}

int64_t Field::fixed_numel() const {
  MMT_CHECK(is_fixed(), ValueError, "field '", name, "' is ragged (shape ", IntArrayRef(shape),
            "): it has no fixed element count");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;  // validate() proved this cannot overflow
  return numel;
}

int64_t Field::fixed_nbytes() const { return fixed_numel() * element_size(dtype); }

DimVector Field::value_strides(IntArrayRef sizes) const {
  const size_t rank = sizes.size();
  DimVector strides(rank, 0);
  int64_t step = 1;
  // storage_order lists logical dimensions from outermost to innermost in memory.
  for (size_t k = rank; k-- > 0;) {
    size_t dim = storage_order.empty() ? k : static_cast<size_t>(storage_order[k]);
    strides[dim] = step;
    // Empty dimensions count as 1, so sizes with a 0 can span more than numel() suggests.
    MMT_CHECK(k == 0 || !__builtin_mul_overflow(step, std::max<int64_t>(sizes[dim], 1), &step), ValueError,
              "field '", name, "': sizes ", sizes, " span more elements than fit in int64");
  }
  return strides;
}

void Field::validate() const {
  MMT_CHECK(!name.empty(), ValueError, "a field needs a non-empty name");
  MMT_CHECK(name.size() <= kMaxFieldNameBytes, ValueError, "field name of ", name.size(),
            " bytes is longer than ", kMaxFieldNameBytes);
  // Names become file names (`mmt export` writes NAME.npy) and JSON text: no control
  // characters, valid UTF-8 (both checked before the name is quoted in any message), no path
  // separator, no '.' or '..'.
  const size_t control = detail::first_control_character(name);
  MMT_CHECK(control == std::string::npos, ValueError, "field name of ", name.size(),
            " bytes has a control character at byte ", control);
  const size_t invalid = detail::first_invalid_utf8(name);
  MMT_CHECK(invalid == std::string::npos, ValueError, "field name of ", name.size(),
            " bytes is not valid UTF-8 (byte ", invalid, ")");
  MMT_CHECK(name != "." && name != ".." && name.find('/') == std::string::npos, ValueError, "field name '", name,
            "' cannot be a file name: it contains '/' or is '.' or '..'");
  MMT_CHECK(is_valid_scalar_type_code(static_cast<uint8_t>(dtype)), ValueError, "field '", name,
            "': invalid dtype code ", static_cast<int>(dtype));
  MMT_CHECK(static_cast<int64_t>(shape.size()) <= kMaxFieldRank, ValueError, "field '", name,
            "': rank ", shape.size(), " exceeds the limit of ", kMaxFieldRank);
  int64_t numel_bytes = element_size(dtype);
  for (int64_t d : shape) {
    MMT_CHECK(d >= 1 || d == kVariableDim, ValueError, "field '", name, "': shape ",
              IntArrayRef(shape), " has dimension ", d, " (dimensions are >= 1, or -1 for variable)");
    if (d != kVariableDim)
      MMT_CHECK(!__builtin_mul_overflow(numel_bytes, d, &numel_bytes), ValueError, "field '", name,
                "': shape ", IntArrayRef(shape), " holds more bytes than fit in 64 bits");
  }
  if (!storage_order.empty()) {
    MMT_CHECK(storage_order.size() == shape.size(), ValueError, "field '", name,
              "': storage_order ", IntArrayRef(storage_order), " must have one entry per dimension of ",
              IntArrayRef(shape));
    std::vector<bool> seen(shape.size(), false);
    for (int64_t d : storage_order) {
      MMT_CHECK(d >= 0 && d < static_cast<int64_t>(shape.size()) && !seen[static_cast<size_t>(d)],
                ValueError, "field '", name, "': storage_order ", IntArrayRef(storage_order),
                " is not a permutation of 0..", shape.size() - 1);
      seen[static_cast<size_t>(d)] = true;
    }
  }
}

bool operator==(const Field& a, const Field& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         (is_identity(a.storage_order) ? DimVector() : a.storage_order) ==
             (is_identity(b.storage_order) ? DimVector() : b.storage_order);
}

Schema::Schema(std::vector<Field> fields) {
  for (Field& field : fields) add(std::move(field));
}

Schema& Schema::add(Field field) {
  field.validate();
  MMT_CHECK(!index_.contains(field.name), ValueError, "schema already has a field named '", field.name, "'");
  if (is_identity(field.storage_order)) field.storage_order.clear();
  fields_.push_back(std::move(field));
  try {  // the index never names a field the vector lacks
    index_.emplace(fields_.back().name, fields_.size() - 1);
  } catch (...) {
    fields_.pop_back();
    throw;
  }
  return *this;
}

std::optional<size_t> Schema::find(std::string_view name) const {
  // A few fields (the usual case, looked up per sample): a scan beats the map's pointer chase.
  constexpr size_t kScanBelow = 8;
  if (fields_.size() < kScanBelow) {
    for (size_t i = 0; i < fields_.size(); ++i)
      if (fields_[i].name == name) return i;
    return std::nullopt;
  }
  if (auto it = index_.find(name); it != index_.end()) return it->second;
  return std::nullopt;
}

size_t Schema::index_of(std::string_view name) const {
  if (auto i = find(name)) return *i;
  const auto name_of = [](const Field& field) -> const std::string& { return field.name; };
  // The name asked for is the caller's text: escaped, so a NUL in it cannot end the message.
  throw ValueError(detail::str("unknown field '", detail::escaped(detail::cut_for_message(std::string(name), 200)),
                               "'; the schema has ",
                               fields_.empty() ? std::string("no fields") : detail::quoted_names(fields_, name_of)));
}

bool Schema::all_fixed() const {
  return std::all_of(fields_.begin(), fields_.end(), [](const Field& f) { return f.is_fixed(); });
}

bool operator==(const Schema& a, const Schema& b) { return a.fields_ == b.fields_; }

}  // namespace mmt
