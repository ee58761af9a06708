// Column-major (Fortran-order) bytes of a field's [records, ...] array, made a bounded piece at
// a time for a streamed write. The inverse of packing a Fortran-order .npy: `mmt export` writes
// such a field back in the order it came in, so the file it writes is the file that was packed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "mmtensor/dims.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt::detail {

// Records [first, stop) of the field, as a tensor [stop - first, record_shape...] of any
// strides.
using ReadRecords = std::function<Tensor(int64_t first, int64_t stop)>;

// In column-major order the record index varies fastest: element (r, i1, ..., ik) of an
// [N, d1, ..., dk] array is at r + N * (i1 + d1 * (i2 + ...)). The bytes are made a segment at
// a time: as many whole columns (all N records of one position within the record) as
// `budget_bytes` holds, or, when one column is larger than that, a run of one column. Each
// segment reads its records anew (at most `records_per_read` at once), so a field that fits
// the budget is read once, and a larger one once per budget's worth of output.
class FortranOrderPieces {
 public:
  FortranOrderPieces(ReadRecords read, int64_t records, IntArrayRef record_shape, ScalarType dtype,
                     int64_t records_per_read, int64_t budget_bytes);

  // The next segment's bytes (valid until the next call); empty once all are given.
  std::span<const std::byte> next();

 private:
  ReadRecords read_;
  int64_t records_;
  DimVector record_shape_;
  ScalarType dtype_;
  int64_t records_per_read_;
  int64_t positions_ = 1;               // elements in one record
  int64_t positions_per_segment_ = 1;   // whole columns in one segment
  int64_t records_per_segment_ = 0;     // records in one segment: all, unless a column exceeds the budget
  int64_t next_position_ = 0;
  int64_t next_record_ = 0;
  UntypedStorage segment_;
};

}  // namespace mmt::detail
