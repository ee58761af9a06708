#include "fortran_order.h"

#include <algorithm>

#include "mmtensor/error.h"

namespace mmt::detail {

void write_fortran_order(const WriteAt& write_at, int64_t data_offset, const ReadRecords& read, int64_t records,
                         IntArrayRef record_shape, ScalarType dtype, int64_t records_per_read) {
  int64_t positions = 1;
  for (int64_t s : record_shape) positions *= s;
  if (records == 0) return;
  const int64_t element = element_size(dtype), rank = static_cast<int64_t>(record_shape.size());
  // Dimensions reversed, the record one last: this order's row-major walk visits the positions
  // in column-major order, each with its records in turn: one row of records per position.
  DimVector order;
  for (int64_t d = rank; d >= 1; --d) order.push_back(d);
  order.push_back(0);
  records_per_read = std::max<int64_t>(1, records_per_read);
  for (int64_t first = 0; first < records; first += records_per_read) {
    const int64_t stop = std::min(records, first + records_per_read), count = stop - first;
    const Tensor values = read(first, stop);  // read even when there is nothing to write: it checks them
    DimVector expected{count};
    for (int64_t s : record_shape) expected.push_back(s);
    MMT_CHECK(values.dtype() == dtype && values.sizes() == IntArrayRef(expected), ValueError,
              "write_fortran_order: records [", first, ", ", stop, ") came back as ", to_string(values.dtype()), " ",
              values.sizes(), ", not ", to_string(dtype), " ", IntArrayRef(expected));
    if (positions == 0) continue;
    const Tensor by_position = values.permute(order).contiguous();
    const auto* rows = static_cast<const std::byte*>(by_position.data_ptr());
    if (count == records) {  // every record: the rows lie back to back in the output too
      write_at(data_offset, {rows, static_cast<size_t>(positions * count * element)});
      continue;
    }
    const auto row_bytes = static_cast<size_t>(count * element);
    for (int64_t p = 0; p < positions; ++p)
      write_at(data_offset + (p * records + first) * element, {rows + p * count * element, row_bytes});
  }
}

}  // namespace mmt::detail
