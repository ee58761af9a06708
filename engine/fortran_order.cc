#include "fortran_order.h"

#include <algorithm>

#include "mmtensor/error.h"

namespace mmt::detail {

FortranOrderPieces::FortranOrderPieces(ReadRecords read, int64_t records, IntArrayRef record_shape, ScalarType dtype,
                                       int64_t records_per_read, int64_t budget_bytes)
    : read_(std::move(read)),
      records_(records),
      record_shape_(record_shape),
      dtype_(dtype),
      records_per_read_(std::max<int64_t>(1, records_per_read)) {
  for (int64_t s : record_shape_) positions_ *= s;
  const int64_t element = element_size(dtype_);
  const int64_t budget = std::max(budget_bytes, element);
  if (records_ > 0 && records_ <= budget / element) {  // whole columns fit
    positions_per_segment_ = std::clamp<int64_t>(budget / (records_ * element), 1, std::max<int64_t>(positions_, 1));
    records_per_segment_ = records_;
  } else {  // one column is larger than the budget: runs of it
    positions_per_segment_ = 1;
    records_per_segment_ = std::min(records_, budget / element);
  }
  if (records_ == 0 || positions_ == 0) next_position_ = positions_;  // no bytes at all
}

std::span<const std::byte> FortranOrderPieces::next() {
  if (next_position_ >= positions_) return {};
  const int64_t p0 = next_position_, p1 = std::min(positions_, p0 + positions_per_segment_);
  const int64_t r0 = next_record_, r1 = std::min(records_, r0 + records_per_segment_);
  const int64_t segment_records = r1 - r0;
  const int64_t nbytes = (p1 - p0) * segment_records * element_size(dtype_);
  if (segment_.nbytes() < nbytes) segment_ = UntypedStorage::allocate(nbytes);
  const int64_t rank = static_cast<int64_t>(record_shape_.size());
  for (int64_t first = r0; first < r1; first += records_per_read_) {
    const int64_t stop = std::min(r1, first + records_per_read_);
    const Tensor values = read_(first, stop);
    MMT_CHECK(values.dim() == rank + 1 && values.size(0) == stop - first, ValueError,
              "FortranOrderPieces: records [", first, ", ", stop, ") came back with shape ", values.sizes());
    // The destination: rows of the segment (one per position), the records of this read
    // side by side within each row.
    const Tensor into(segment_, dtype_, {p1 - p0, stop - first}, {segment_records, 1}, first - r0);
    if (p1 - p0 == 1) {
      // One position: its element of each record, selected from the last dimension back so
      // the earlier ones keep their numbers.
      Tensor column = values;
      int64_t rest = p0;
      DimVector index(record_shape_.size());
      for (size_t d = 0; d < record_shape_.size(); ++d) {
        index[d] = rest % record_shape_[d];
        rest /= record_shape_[d];
      }
      for (int64_t d = rank; d >= 1; --d) column = column.select(d, index[d - 1]);
      into.select(0, 0).copy_(column);
    } else {
      // Dimensions reversed, the record one last: iterating this in row-major order walks the
      // positions in column-major order, each with its records in turn.
      DimVector order;
      for (int64_t d = rank; d >= 1; --d) order.push_back(d);
      order.push_back(0);
      const Tensor by_position = values.permute(order).reshape({positions_, stop - first});
      into.copy_(by_position.narrow(0, p0, p1 - p0));
    }
  }
  if (r1 < records_) {
    next_record_ = r1;
  } else {
    next_record_ = 0;
    next_position_ = p1;
  }
  return {segment_.data(), static_cast<size_t>(nbytes)};
}

}  // namespace mmt::detail
