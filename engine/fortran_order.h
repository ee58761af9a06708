// Writes a field's [records, ...] array in column-major (Fortran) order, reading its records
// once. The inverse of packing a Fortran-order .npy: `mmt export` writes such a field back in
// the order it came in, so the file it writes is the file that was packed.
#pragma once

#include <cstdint>
#include <functional>

#include "mmtensor/dims.h"
#include "mmtensor/tensor.h"
#include "temp_files.h"

namespace mmt::detail {

// Records [first, stop) of the field, as a tensor [stop - first, record_shape...] of any
// strides.
using ReadRecords = std::function<Tensor(int64_t first, int64_t stop)>;

// The caller has checked that records * element size * positions fits the file (and int64).
// In column-major order the record index varies fastest: element (r, i1, ..., ik) of an
// [N, d1, ..., dk] array goes to data_offset + (r + N * (i1 + d1 * (i2 + ...))) * element
// size. The records are read once, `records_per_read` at a time; each read becomes one write
// per position within a record (a run of that read's records), or a single write when the
// read holds every record. Memory: the read and one reordered copy of it.
void write_fortran_order(const WriteAt& write_at, int64_t data_offset, const ReadRecords& read, int64_t records,
                         IntArrayRef record_shape, ScalarType dtype, int64_t records_per_read);

}  // namespace mmt::detail
