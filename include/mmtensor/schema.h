// Schema: the named fields every record of a dataset has.
//
// A field has a dtype and a per-record shape. A shape with no kVariableDim is fixed: every
// record holds exactly that many elements, and whole columns of an uncompressed dataset can
// be viewed without copies. A shape with kVariableDim entries is ragged: each record has its
// own extent in those dimensions (token sequences [-1], variable-size images [-1, -1, 3], raw
// bytes such as an encoded JPEG: Field::bytes()).
//
// A field may be stored in a physical order other than its logical shape: an image field of
// logical shape [3, 224, 224] stored channels-last keeps its bytes as HWC, and a sample's
// view comes back with shape [3, 224, 224] and strides [1, 672, 3], as PyTorch's
// channels_last does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mmtensor/dims.h"
#include "mmtensor/dtype.h"

namespace mmt {

inline constexpr int64_t kVariableDim = -1;

struct Field {
  std::string name;
  ScalarType dtype = kUInt8;
  DimVector shape;          // logical per-record shape; kVariableDim marks a variable extent
  DimVector storage_order;  // physical order of the logical dims (a permutation of 0..n-1);
                            // empty means row-major, the identity

  static Field fixed(std::string name, ScalarType dtype, IntArrayRef shape);
  static Field ragged(std::string name, ScalarType dtype, IntArrayRef shape);
  static Field bytes(std::string name);  // uint8 [-1]
  // Stores [C, H, W] as HWC and [C, D, H, W] as DHWC (channels-last), without changing the
  // logical shape. Throws ValueError for other ranks.
  Field& stored_channels_last();
  Field& with_storage_order(IntArrayRef order);

  bool is_fixed() const;
  bool stored_in_logical_order() const;  // storage_order is empty or the identity
  int64_t variable_dims() const;  // how many kVariableDim entries the shape has
  // Elements and bytes of one record's value; only for fixed fields.
  int64_t fixed_numel() const;
  int64_t fixed_nbytes() const;
  // Strides (elements) of one value of concrete shape `sizes` laid out in storage_order.
  DimVector value_strides(IntArrayRef sizes) const;
  // Throws ValueError naming the field if the name, shape or order is not valid.
  void validate() const;
};

class Schema {
 public:
  Schema() = default;
  // Validates every field and that names are unique; throws ValueError otherwise.
  explicit Schema(std::vector<Field> fields);
  Schema& add(Field field);

  size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  const Field& operator[](size_t i) const { return fields_[i]; }
  const std::vector<Field>& fields() const { return fields_; }
  auto begin() const { return fields_.begin(); }
  auto end() const { return fields_.end(); }
  std::optional<size_t> find(std::string_view name) const;
  // The index of `name`; throws ValueError listing the known field names.
  size_t index_of(std::string_view name) const;
  bool all_fixed() const;
  friend bool operator==(const Schema& a, const Schema& b);

 private:
  std::vector<Field> fields_;
  // Name -> index, so that building or decoding a schema of n fields costs O(n log n): a file
  // may declare hundreds of thousands, and a duplicate check by scanning took minutes.
  std::map<std::string, size_t, std::less<>> index_;
};

bool operator==(const Field& a, const Field& b);

// User metadata: free-form key/value text stored with the dataset.
using Metadata = std::map<std::string, std::string, std::less<>>;

}  // namespace mmt
