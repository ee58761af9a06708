// Dataset::ragged_column: records [start, stop) of a ragged field, packed as values, offsets
// and shapes (RaggedBatch). Inside one chunk the values of consecutive records are
// consecutive (docs/FORMAT.md, "Decoded chunk payload": record r's values end where record
// r+1's begin), so a range there is one view when the field is stored in its logical order,
// the way a token stream is. Dataset::get_ragged_batch: any records, packed the same way.
#include <algorithm>
#include <cstring>
#include <vector>

#include "dataset_concat.h"
#include "dataset_impl.h"
#include "mmtensor/error.h"
#include "strided_copy.h"

namespace mmt {

namespace {

// What a second read of a chunk says when it no longer agrees with the first.
FormatError changed_while_read(const Dataset::Impl& d, const ChunkRef& ref, const Field& spec, int64_t first,
                               int64_t last) {
  return FormatError(detail::str(d.path, ": chunk ", ref.index, ", field '", spec.name, "': the values of records [",
                                 first, ", ", last, ") changed while they were read (is the file being rewritten?)"));
}

// Copies record `record`'s value of ragged field `f` to `dst`, packed in logical row-major
// order, under the mapping's guard. `expected_numel` is what an earlier pass sized `dst` by.
void copy_ragged_value(const Dataset::Impl& d, const ChunkRef& ref, const format::RaggedSection& section,
                       int64_t record, size_t f, int64_t expected_numel, std::byte* dst) {
  const Tensor value = d.ragged_view(ref, section, record, f);
  if (value.numel() != expected_numel) throw changed_while_read(d, ref, (*d.schema)[f], record, record + 1);
  if (expected_numel == 0) return;
  const DimVector packed_strides = contiguous_strides(value.sizes());
  d.guarded_if_mapped(ref, [&] {
    detail::copy_strided(dst, packed_strides, value.data_ptr(), value.strides(), value.sizes(),
                         d.plans[f].element_bytes);
  });
}

}  // namespace

RaggedBatch Dataset::get_ragged_batch(std::span<const int64_t> indices, std::string_view field) const {
  if (concat_) return concat_->get_ragged_batch(indices, field);
  const Impl& d = checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const Field& spec = (*d.schema)[f];
  const FieldPlan& plan = d.plans[f];
  MMT_CHECK(!plan.fixed, ValueError, "get_ragged_batch: field '", field, "' has the fixed shape ", spec.shape,
            "; gather it with get_batch()");
  const int64_t batch = static_cast<int64_t>(indices.size());
  std::vector<int64_t> records(indices.size());
  for (size_t b = 0; b < indices.size(); ++b) records[b] = d.normalize_index(indices[b], "get_ragged_batch");
  const int64_t ndim = static_cast<int64_t>(spec.shape.size());
  RaggedBatch out;
  out.offsets = empty({batch + 1}, kInt64);
  out.shapes = empty({batch, ndim}, kInt64);
  int64_t* offsets = out.offsets.mutable_data_ptr<int64_t>();
  int64_t* shapes = out.shapes.mutable_data_ptr<int64_t>();
  // Pass 1: each value checked as get() checks it, its shape and size noted. No view is
  // kept, so no decoded chunk is held past its record.
  offsets[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const ChunkRef ref = d.chunk_ref_holding(records[b]);
    const format::RaggedSection section = d.ragged_section(ref, f);
    Impl::ValueRange range;
    d.guarded_if_mapped(ref, [&] { range = d.read_ragged_value(ref, section, records[b], f, shapes + b * ndim); });
    MMT_CHECK(!__builtin_add_overflow(offsets[b], range.end - range.begin, &offsets[b + 1]), FormatError, d.path,
              ": get_ragged_batch: field '", spec.name, "': the values of ", b + 1, " records overflow a count");
  }
  // Pass 2: the values, each read again (a chunk may have been evicted meanwhile) and checked
  // against what pass 1 sized the buffer by.
  out.values = empty({offsets[batch]}, plan.dtype);
  std::byte* values = static_cast<std::byte*>(out.values.mutable_data_ptr());
  for (int64_t b = 0; b < batch; ++b) {
    const ChunkRef ref = d.chunk_ref_holding(records[b]);
    copy_ragged_value(d, ref, d.ragged_section(ref, f), records[b], f, offsets[b + 1] - offsets[b],
                      values + offsets[b] * plan.element_bytes);
  }
  return out;
}

RaggedBatch Dataset::ragged_column(std::string_view field, int64_t start, int64_t stop) const {
  if (concat_) return concat_->ragged_column(field, start, stop);
  const Impl& d = checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const Field& spec = (*d.schema)[f];
  const FieldPlan& plan = d.plans[f];
  MMT_CHECK(!plan.fixed, ValueError, "ragged_column('", field, "'): the field has the fixed shape ", spec.shape,
            "; read it with column()");
  MMT_CHECK(start >= 0 && start <= stop && stop <= d.record_count, IndexError, "ragged_column('", field, "', ",
            start, ", ", stop, "): the range must satisfy 0 <= start <= stop <= ", d.record_count);
  const int64_t n = stop - start;
  const int64_t ndim = static_cast<int64_t>(spec.shape.size());
  RaggedBatch out;
  // Sized as chunks prove their records (each chunk's section holds its records' ends): a
  // footer's or preamble's record counts alone could claim billions of records in a file of a
  // few KiB. A range inside one chunk is sized once, exactly.
  int64_t* offsets = nullptr;
  int64_t* shapes = nullptr;
  int64_t rows_allocated = -1;  // nothing allocated yet
  const auto make_room = [&](int64_t rows) {
    if (rows <= rows_allocated) return;
    const int64_t grown = std::min(n, std::max(rows, 2 * rows_allocated));  // never past n: exact at the end
    Tensor more_offsets = empty({grown + 1}, kInt64), more_shapes = empty({grown, ndim}, kInt64);
    if (rows_allocated < 0) {
      more_offsets.mutable_data_ptr<int64_t>()[0] = 0;
    } else {
      std::memcpy(more_offsets.mutable_data_ptr(), offsets, static_cast<size_t>(rows_allocated + 1) * 8);
      if (rows_allocated * ndim > 0)
        std::memcpy(more_shapes.mutable_data_ptr(), shapes, static_cast<size_t>(rows_allocated * ndim) * 8);
    }
    out.offsets = std::move(more_offsets);
    out.shapes = std::move(more_shapes);
    offsets = out.offsets.mutable_data_ptr<int64_t>();
    shapes = out.shapes.mutable_data_ptr<int64_t>();
    rows_allocated = grown;
  };

  // Pass 1: every value checked as get() checks it (its range inside the chunk, its extents
  // against its element count), its shape and offset noted. Nothing is sized by the file
  // before its values have passed those checks. The section is found once per chunk and the
  // chunk's records are read under one guard, not one per record.
  const bool logical_order = spec.stored_in_logical_order();  // each value is contiguous
  int64_t first_value_byte = 0;  // where the one-chunk view starts, in its chunk's storage
  ChunkRef first_chunk;
  bool one_chunk = true;
  for (int64_t record = start; record < stop;) {
    const ChunkRef ref = d.chunk_ref_holding(record);
    if (record == start) first_chunk = ref;
    else one_chunk = false;
    const int64_t chunk_stop = std::min(stop, ref.first_record + ref.record_count);
    const format::RaggedSection section = d.ragged_section(ref, f);  // the records' ends fit the chunk
    make_room(chunk_stop - start);
    d.guarded_if_mapped(ref, [&] {
      for (; record < chunk_stop; ++record) {
        const int64_t row = record - start;
        const Dataset::Impl::ValueRange range = d.read_ragged_value(ref, section, record, f, shapes + row * ndim);
        MMT_CHECK(!__builtin_add_overflow(offsets[row], range.end - range.begin, &offsets[row + 1]), FormatError,
                  d.path, ": field '", spec.name, "': the values of records [", start, ", ", record + 1,
                  ") overflow a count");
        if (row == 0) first_value_byte = ref.payload_offset_bytes + section.values_offset + range.begin * plan.element_bytes;
      }
    });
  }
  make_room(0);  // an empty range: offsets [0] and no shapes
  const int64_t total = offsets[n];
  if (n > 0 && one_chunk && logical_order) {
    out.values = Tensor(first_chunk.storage, plan.dtype, {total}, {1}, first_value_byte / plan.element_bytes);
    return out;
  }

  // Pass 2: a copy, chunk by chunk; one memcpy per chunk when stored in logical order. The
  // chunk is read again (the mapping, or a chunk decoded again after eviction), so what it
  // says now must agree with what pass 1 sized the buffer by: a file rewritten in place
  // meanwhile must not make a copy run past the buffer or the chunk.
  out.values = empty({total}, plan.dtype);
  if (total == 0) return out;
  std::byte* values = static_cast<std::byte*>(out.values.mutable_data_ptr());
  const int64_t element_bytes = plan.element_bytes;
  DimVector scratch_shape(static_cast<size_t>(ndim));
  for (int64_t record = start; record < stop;) {
    const ChunkRef ref = d.chunk_ref_holding(record);
    const int64_t chunk_stop = std::min(stop, ref.first_record + ref.record_count);
    const format::RaggedSection section = d.ragged_section(ref, f);
    if (logical_order) {
      const int64_t expected = offsets[chunk_stop - start] - offsets[record - start];
      int64_t begin = 0, end = 0;
      d.guarded_if_mapped(ref, [&] {
        begin = d.read_ragged_value(ref, section, record, f, scratch_shape.data()).begin;
        end = d.read_ragged_value(ref, section, chunk_stop - 1, f, scratch_shape.data()).end;
      });
      if (end - begin != expected) throw changed_while_read(d, ref, spec, record, chunk_stop);
      const std::byte* src = ref.storage.data() + ref.payload_offset_bytes + section.values_offset + begin * element_bytes;
      std::byte* dst = values + offsets[record - start] * element_bytes;
      d.guarded_if_mapped(ref, [&] { std::memcpy(dst, src, static_cast<size_t>(expected * element_bytes)); });
      record = chunk_stop;
      continue;
    }
    for (; record < chunk_stop; ++record)
      copy_ragged_value(d, ref, section, record, f, offsets[record - start + 1] - offsets[record - start],
                        values + offsets[record - start] * element_bytes);
  }
  return out;
}

}  // namespace mmt
