#include <sstream>

#include "mmtensor/dataset.h"
#include "mmtensor/error.h"

namespace mmt {

Sample::Sample() = default;
Sample::~Sample() = default;

Sample::Sample(std::shared_ptr<const Schema> schema, int64_t index)
    : schema_(std::move(schema)), index_(index), count_(schema_ ? schema_->size() : 0) {
  if (count_ > kInlineFields) overflow_ = std::make_unique<Tensor[]>(count_ - kInlineFields);
}

Sample::Sample(const Sample& other) : schema_(other.schema_), index_(other.index_), count_(other.count_) {
  for (size_t i = 0; i < kInlineFields; ++i) inline_[i] = other.inline_[i];
  if (count_ > kInlineFields) {
    overflow_ = std::make_unique<Tensor[]>(count_ - kInlineFields);
    for (size_t i = 0; i < count_ - kInlineFields; ++i) overflow_[i] = other.overflow_[i];
  }
}

Sample::Sample(Sample&& other) noexcept
    : schema_(std::move(other.schema_)), index_(other.index_), count_(other.count_),
      overflow_(std::move(other.overflow_)) {
  for (size_t i = 0; i < kInlineFields; ++i) inline_[i] = std::move(other.inline_[i]);
  other.count_ = 0;
  other.index_ = -1;
}

Sample& Sample::operator=(const Sample& other) {
  if (this != &other) *this = Sample(other);
  return *this;
}

Sample& Sample::operator=(Sample&& other) noexcept {
  if (this == &other) return *this;
  schema_ = std::move(other.schema_);
  index_ = other.index_;
  count_ = other.count_;
  overflow_ = std::move(other.overflow_);
  for (size_t i = 0; i < kInlineFields; ++i) inline_[i] = std::move(other.inline_[i]);
  other.count_ = 0;
  other.index_ = -1;
  return *this;
}

const Schema& Sample::schema() const {
  static const Schema kNoFields;  // a Sample made empty or moved from holds no schema
  return schema_ ? *schema_ : kNoFields;
}

const Tensor& Sample::operator[](size_t i) const& {
  MMT_CHECK(i < count_, IndexError, "sample field index ", i, " is out of range for ", count_, " fields");
  return i < kInlineFields ? inline_[i] : overflow_[i - kInlineFields];
}

const Tensor& Sample::operator[](std::string_view field) const& {
  MMT_CHECK(schema_ != nullptr, ValueError, "empty sample has no field '", field, "'");
  return (*this)[schema_->index_of(field)];
}

Tensor& Sample::mutable_field(size_t i) {
  return i < kInlineFields ? inline_[i] : overflow_[i - kInlineFields];
}

}  // namespace mmt
