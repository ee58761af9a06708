// Dataset: samples and columns as views. get(i) on an uncompressed file builds its views
// straight over the whole-file mapping without a heap allocation.
#include <algorithm>
#include <cstring>
#include <vector>

#include "dataset_concat.h"
#include "dataset_impl.h"
#include "mmtensor/error.h"

namespace mmt {

Tensor Dataset::Impl::field_view(const ChunkRef& ref, int64_t record, size_t f) const {
  const FieldPlan& plan = plans[f];
  if (!plan.fixed) return ragged_view(ref, record, f);
  const int64_t byte_offset =
      ref.payload_offset_bytes + (record - ref.first_record) * record_stride_bytes + plan.offset_bytes;
  return make_tensor_unchecked(ref.storage, plan.dtype, plan.sizes, plan.strides, byte_offset / plan.element_bytes);
}

namespace {

// Sections of ragged fields deep in the chain, for callers that ask one field at a time (the
// loader's get(i, field) per row and field, ragged_column per field): the chain of the chunk
// this thread read last, walked once and extended as needed, so reading every ragged field of
// a record costs O(fields), not O(fields^2). Keyed by the dataset's instance_id (never reused),
// the chunk and its decoded bytes' address; it holds offsets only, no memory of the chunk.
struct SectionChain {
  uint64_t owner = 0;
  int64_t chunk = -1;
  const std::byte* data = nullptr;
  std::vector<format::RaggedSection> sections;
};
thread_local SectionChain section_chain;
// Fields this close to the chain's start are walked to directly: a few steps cost less than
// the lookup, and get() of a typical schema (one or two ragged fields) stays as it was.
constexpr size_t kDirectWalkSections = 4;

}  // namespace

format::RaggedSection Dataset::Impl::ragged_section(const ChunkRef& ref, size_t f) const {
  const size_t k = plans[f].ragged_index;
  if (k >= kDirectWalkSections) {
    SectionChain& chain = section_chain;
    if (chain.owner != instance_id || chain.chunk != ref.index || chain.data != ref.storage.data()) {
      chain.sections.clear();
      chain.owner = 0;  // valid again only once a walk has started on this chunk
      chain.chunk = ref.index;
      chain.data = ref.storage.data();
    }
    while (chain.sections.size() <= k) {
      const size_t next = chain.sections.size();
      const format::RaggedSection s =
          next_ragged_section(ref, next == 0 ? nullptr : &chain.sections.back(), layout.ragged_fields[next]);
      chain.sections.push_back(s);
      chain.owner = instance_id;
    }
    return chain.sections[k];
  }
  // In an uncompressed chunk the section headers are in the mapping: guarded like every
  // other engine read (a file shrunk under the reader gives IoError here, not SIGBUS).
  try {
    return guarded_if_mapped(ref, [&] {
      return format::locate_ragged_section(ref.storage.data() + ref.payload_offset_bytes, ref.decoded_bytes,
                                           ref.record_count, record_stride_bytes, *schema, layout,
                                           plans[f].ragged_index, ref.index);
    });
  } catch (const FormatError&) {
    rethrow_in_file(path);
  }
}

format::RaggedSection Dataset::Impl::next_ragged_section(const ChunkRef& ref, const format::RaggedSection* previous,
                                                        size_t f) const {
  try {
    return guarded_if_mapped(ref, [&] {
      const int64_t offset = previous ? format::next_section_offset(previous->end_offset)
                                      : format::first_ragged_section_offset(ref.decoded_bytes, ref.record_count,
                                                                            record_stride_bytes, ref.index);
      return format::ragged_section_at(ref.storage.data() + ref.payload_offset_bytes, ref.decoded_bytes,
                                       ref.record_count, (*schema)[f], offset, ref.index);
    });
  } catch (const FormatError&) {
    rethrow_in_file(path);
  }
}

Dataset::Impl::ValueRange Dataset::Impl::read_ragged_value(const ChunkRef& ref, const format::RaggedSection& section,
                                                           int64_t record, size_t f, int64_t* sizes) const {
  const FieldPlan& plan = plans[f];
  const Field& field = (*schema)[f];
  const std::byte* chunk = ref.storage.data() + ref.payload_offset_bytes;
  const int64_t r = record - ref.first_record;
  const uint64_t start = r == 0 ? 0 : format::load_u64(chunk + section.ends_offset + 8 * (r - 1));
  const uint64_t end = format::load_u64(chunk + section.ends_offset + 8 * r);
  const uint64_t total = static_cast<uint64_t>((section.end_offset - section.values_offset) / plan.element_bytes);
  // Where a bad word lies: a file offset for an uncompressed chunk (read from the mapping),
  // else an offset in the decoded chunk.
  const auto at = [&](int64_t offset_in_chunk) {
    return ref.storage.data() == base ? detail::str(" (byte offset ", ref.payload_offset_bytes + offset_in_chunk, ")")
                                      : detail::str(" (decoded byte ", offset_in_chunk, ")");
  };
  MMT_CHECK(start <= end && end <= total, FormatError, path, ": chunk ", ref.index, ", field '", field.name,
            "': record ", record, " has value range [", start, ", ", end, ") outside the field's ", total,
            " values in this chunk", at(section.ends_offset + 8 * r));
  const int64_t vdims = field.variable_dims();
  const size_t ndim = field.shape.size();
  int64_t extent_index = 0;
  for (size_t d = 0; d < ndim; ++d) {
    int64_t size = field.shape[d];
    if (size == kVariableDim) {
      const int64_t extent_at = section.extents_offset + 8 * (r * vdims + extent_index++);
      const uint64_t extent = format::load_u64(chunk + extent_at);
      MMT_CHECK(extent <= static_cast<uint64_t>(INT64_MAX), FormatError, path, ": chunk ", ref.index, ", field '",
                field.name, "': record ", record, " has extent ", extent, at(extent_at));
      size = static_cast<int64_t>(extent);
    }
    sizes[d] = size;
  }
  int64_t numel = 0;
  MMT_CHECK(format::ragged_value_elements(sizes, ndim, &numel), FormatError, path, ": chunk ", ref.index, ", field '",
            field.name, "': the extents of record ", record, " overflow", at(section.extents_offset + 8 * r * vdims));
  MMT_CHECK(static_cast<uint64_t>(numel) == end - start, FormatError, path, ": chunk ", ref.index, ", field '",
            field.name, "': record ", record, " has extents ", IntArrayRef(sizes, ndim), " (", numel,
            " elements) but ", end - start, " values", at(section.extents_offset + 8 * r * vdims));
  return {static_cast<int64_t>(start), static_cast<int64_t>(end)};
}

Tensor Dataset::Impl::ragged_view(const ChunkRef& ref, int64_t record, size_t f) const {
  return ragged_view(ref, ragged_section(ref, f), record, f);
}

Tensor Dataset::Impl::ragged_view(const ChunkRef& ref, const format::RaggedSection& section, int64_t record,
                                  size_t f) const {
  const FieldPlan& plan = plans[f];
  const Field& field = (*schema)[f];
  DimVector sizes(field.shape.size());  // outside the guarded read: it owns memory
  int64_t* size_data = sizes.data();
  const ValueRange range =
      guarded_if_mapped(ref, [&] { return read_ragged_value(ref, section, record, f, size_data); });
  const int64_t byte_offset =
      ref.payload_offset_bytes + section.values_offset + range.begin * plan.element_bytes;
  DimVector strides = field.value_strides(sizes);
  return make_tensor_unchecked(ref.storage, plan.dtype, std::move(sizes), std::move(strides),
                               byte_offset / plan.element_bytes);
}

void Dataset::Impl::check_chunk_holds(int64_t chunk, int64_t first_record, int64_t record_count,
                                      int64_t record) const {
  MMT_CHECK(record >= first_record && record - first_record < record_count, FormatError, path,
            ": no chunk holds record ", record, ": the chunk table is out of order or leaves a gap "
            "(binary search found chunk ", chunk, " holding records [", first_record, ", +", record_count, "))");
}

format::ChunkEntry Dataset::Impl::entry_holding(int64_t record, int64_t* chunk) const {
  *chunk = chunk_of(record);
  const format::ChunkEntry e = entry_without_validating(*chunk);
  check_chunk_holds(*chunk, static_cast<int64_t>(e.first_record), e.record_count, record);
  return e;
}

ChunkRef Dataset::Impl::chunk_ref_holding(int64_t record) const {
  ChunkRef ref = chunk_ref(chunk_of(record));
  check_chunk_holds(ref.index, ref.first_record, ref.record_count, record);
  return ref;
}

namespace {

const FieldPlan& fixed_plan(const Dataset::Impl& d, size_t f, const char* what) {
  const FieldPlan& plan = d.plans[f];
  MMT_CHECK(plan.fixed, ValueError, what, ": field '", (*d.schema)[f].name, "' is ragged (shape ",
            (*d.schema)[f].shape, "); only fixed-shape fields can be ", what == std::string("column") ? "viewed as columns" : "batched",
            "; read ragged values with get() or ragged_column()");
  return plan;
}

// Record `i` (an index checked) of one file: its sample built where the caller's return value
// lies (one named result: no copy of its inline tensors on the way out).
Sample sample_of(const Dataset::Impl& d, int64_t i) {
  Sample sample(d.schema, i);
  if (d.contiguous) {
    if (!d.all_chunks_validated()) [[unlikely]]
      d.ensure_validated(i / d.records_per_chunk);
    const int64_t record_at = d.data_offset + i * d.record_stride_bytes;
    for (size_t f = 0; f < d.plans.size(); ++f) {
      const FieldPlan& plan = d.plans[f];
      assign_tensor_unchecked(sample.mutable_field(f), d.file, plan.dtype, plan.sizes, plan.strides,
                              (record_at + plan.offset_bytes) / plan.element_bytes);
    }
    return sample;
  }
  const ChunkRef ref = d.chunk_ref_holding(i);
  // Ragged sections are chained: walked once here, not once per field.
  format::RaggedSection section;
  bool past_first_ragged = false;
  for (size_t f = 0; f < d.plans.size(); ++f) {
    if (d.plans[f].fixed) {
      sample.mutable_field(f) = d.field_view(ref, i, f);
      continue;
    }
    section = d.next_ragged_section(ref, past_first_ragged ? &section : nullptr, f);
    past_first_ragged = true;
    sample.mutable_field(f) = d.ragged_view(ref, section, i, f);
  }
  return sample;
}

}  // namespace

Sample Dataset::get(int64_t index) const {
  // Each return a prvalue: the sample is made in place, whichever path makes it.
  if (concat_) [[unlikely]]
    return concat_->get(index);
  const Impl& d = checked_impl(impl_);
  return sample_of(d, d.normalize_index(index, "get"));
}

Tensor Dataset::get(int64_t index, std::string_view field) const {
  if (concat_) {
    const Location at = concat_->locate(index, "get");
    return concat_->parts[at.part].get(at.index, field);
  }
  const Impl& d = checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const int64_t i = d.normalize_index(index, "get");
  return d.field_view(d.chunk_ref_holding(i), i, f);
}

UntypedStorage Dataset::file_storage() const {
  MMT_CHECK(!concat_, ValueError, "file_storage(): ", path(), " is a concatenation of ", concat_->parts.size(),
            " files; each of parts() has its own mapping");
  return checked_impl(impl_).file;
}

bool Dataset::column_is_view(std::string_view field) const {
  if (concat_) {  // the whole column spans the parts (every part but one may be empty, though)
    size_t holding = 0, parts_holding = 0;
    for (size_t p = 0; p < concat_->parts.size(); ++p)
      if (concat_->parts[p].size() > 0) ++parts_holding, holding = p;
    if (parts_holding <= 1) return concat_->parts[holding].column_is_view(field);
    concat_->parts[0].column_is_view(field);  // an unknown field: ValueError all the same
    return false;
  }
  const Impl& d = checked_impl(impl_);
  const bool fixed = d.plans[d.schema->index_of(field)].fixed;
  // column() of one chunk's records is a view into that chunk (the mapping or its decoding).
  return fixed && (d.contiguous || d.chunk_count == 1);
}

Tensor Dataset::column(std::string_view field) const { return column(field, 0, size()); }

Tensor Dataset::column(std::string_view field, int64_t start, int64_t stop) const {
  if (concat_) return concat_->column(field, start, stop);
  const Impl& d = checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const FieldPlan& plan = fixed_plan(d, f, "column");
  MMT_CHECK(start >= 0 && start <= stop && stop <= d.record_count, IndexError, "column('", field, "', ", start,
            ", ", stop, "): the range must satisfy 0 <= start <= stop <= ", d.record_count);
  const int64_t n = stop - start;
  DimVector sizes{n};
  for (int64_t s : plan.sizes) sizes.push_back(s);
  if (d.contiguous) {
    // One strided view over the whole-file storage: record stride first, then the value's
    // strides. The view is only as sound as the chunk entries under it (a chunk of the wrong
    // codec or place): check those in the range once, as get() does one at a time.
    if (n > 0 && !d.all_chunks_validated())
      for (int64_t c = start / d.records_per_chunk; c <= (stop - 1) / d.records_per_chunk; ++c)
        d.ensure_validated(c);
    DimVector strides{d.record_stride_bytes / plan.element_bytes};
    for (int64_t s : plan.strides) strides.push_back(s);
    const int64_t offset_bytes = d.data_offset + start * d.record_stride_bytes + plan.offset_bytes;
    return Tensor(d.file, plan.dtype, sizes, strides, offset_bytes / plan.element_bytes);
  }
  DimVector strides{d.record_stride_bytes / plan.element_bytes};
  for (int64_t s : plan.strides) strides.push_back(s);
  if (n > 0) {
    // Inside one chunk: a view into that chunk (the mapping, or the decoded chunk), so a
    // compressed column read chunk by chunk is decoded once per chunk and never copied.
    const ChunkRef ref = d.chunk_ref_holding(start);
    if (stop <= ref.first_record + ref.record_count) {
      const int64_t offset_bytes =
          ref.payload_offset_bytes + (start - ref.first_record) * d.record_stride_bytes + plan.offset_bytes;
      return Tensor(ref.storage, plan.dtype, sizes, strides, offset_bytes / plan.element_bytes);
    }
  }
  // Otherwise a copy, gathered chunk by chunk, keeping the field's storage order. The chunk
  // entries of the range are checked first (no payload is read), so a corrupt record count
  // cannot size the allocation; nor can entries that share one payload (each counts its
  // stored bytes towards what it may decode to), so their payloads must follow one another
  // as verify() requires.
  uint64_t previous_payload_end = 0;
  for (int64_t record = start, previous = -1; record < stop;) {
    int64_t c = 0;
    const format::ChunkEntry e = d.entry_holding(record, &c);
    MMT_CHECK(e.file_offset >= previous_payload_end, FormatError, d.path, ": chunk ", c, "'s payload at byte ",
              e.file_offset, " overlaps chunk ", previous, "'s, which ends at byte ", previous_payload_end);
    previous_payload_end = e.file_offset + e.stored_bytes;  // both checked against the file's size
    previous = c;
    record = static_cast<int64_t>(e.first_record + e.record_count);
  }
  strides = DimVector{plan.value_bytes / plan.element_bytes};
  for (int64_t s : plan.strides) strides.push_back(s);
  Tensor out = empty_strided(sizes, strides, plan.dtype);
  std::byte* dst = static_cast<std::byte*>(out.mutable_data_ptr());
  for (int64_t record = start; record < stop;) {
    const ChunkRef ref = d.chunk_ref_holding(record);
    const std::byte* chunk = ref.storage.data() + ref.payload_offset_bytes;
    const int64_t chunk_stop = std::min(stop, ref.first_record + ref.record_count);
    auto copy_records = [&] {
      for (int64_t r = record; r < chunk_stop; ++r) {
        std::memcpy(dst + (r - start) * plan.value_bytes,
                    chunk + (r - ref.first_record) * d.record_stride_bytes + plan.offset_bytes,
                    static_cast<size_t>(plan.value_bytes));
      }
    };
    if (ref.storage.is_same(d.file))
      d.guarded(copy_records);
    else
      copy_records();
    record = chunk_stop;
  }
  return out;
}

}  // namespace mmt
