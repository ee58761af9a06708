#include "staging_ring.h"

#include <algorithm>

#include "mmtensor/error.h"

namespace mmt::detail {

namespace {

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  MMT_CHECK(!__builtin_mul_overflow(a, b, &out), ValueError, "Loader: ", what, " overflows int64 (",
            a, " x ", b, ")");
  return out;
}

int64_t align_up(int64_t bytes, int64_t alignment) {
  MMT_CHECK(bytes <= INT64_MAX - alignment, ValueError, "Loader: staging slot of ", bytes,
            " bytes is too large");
  return (bytes + alignment - 1) / alignment * alignment;
}

// Pinned with the loader's device current: its context, not the calling thread's (device 0
// on a thread that never chose one).
UntypedStorage allocate_host(int64_t nbytes, bool pinned, Device device) {
  return pinned ? UntypedStorage::allocate_pinned(nbytes, device)
                : UntypedStorage::allocate(nbytes, kCPU, StagingRing::kRegionAlignment);
}

}  // namespace

StagingRing::StagingRing(std::vector<Field> fields, int64_t slot_rows, int slots, Device device,
                         bool pin_memory)
    : slot_rows_(slot_rows), slots_(slots), device_(device),
      pin_memory_(pin_memory || device.is_cuda()) {
  int ragged_count = 0;
  int64_t offset_bytes = 0;
  for (Field& field : fields) {
    FieldLayout layout;
    layout.ragged = !field.is_fixed();
    layout.stored_in_logical_order = field.stored_in_logical_order();
    layout.data_offset_bytes = offset_bytes;
    if (layout.ragged) {
      layout.ragged_index = ragged_count++;
      offset_bytes += align_up(checked_mul(slot_rows + 1, 8, "offsets of field '" + field.name + "'"),
                               kRegionAlignment);
      layout.shapes_offset_bytes = offset_bytes;
      const auto ndim = static_cast<int64_t>(field.shape.size());
      offset_bytes += align_up(checked_mul(checked_mul(slot_rows, ndim, "shapes"), 8,
                                           "shapes of field '" + field.name + "'"),
                               kRegionAlignment);
    } else {
      offset_bytes += align_up(checked_mul(slot_rows, field.fixed_nbytes(),
                                           "a batch of field '" + field.name + "'"),
                               kRegionAlignment);
    }
    layout.field = std::move(field);
    fields_.push_back(std::move(layout));
  }
  slot_bytes_ = offset_bytes;
  const int64_t ring_bytes = checked_mul(slot_bytes_, slots_, "the staging ring");
  host_ = allocate_host(ring_bytes, pin_memory_, device_);
  if (device_.is_cuda()) device_ring_ = UntypedStorage::allocate(ring_bytes, device_);
  ragged_.assign(static_cast<size_t>(slots_), std::vector<RaggedBuffers>(static_cast<size_t>(ragged_count)));
}

Tensor StagingRing::fixed_view(int slot, size_t f, int64_t rows, bool on_device) const {
  const FieldLayout& layout = fields_[f];
  const Field& field = layout.field;
  const int64_t element_bytes = element_size(field.dtype);
  DimVector sizes{rows};
  DimVector strides{field.fixed_numel()};
  const DimVector value_strides = field.value_strides(field.shape);
  for (size_t d = 0; d < field.shape.size(); ++d) {
    sizes.push_back(field.shape[d]);
    strides.push_back(value_strides[d]);
  }
  const int64_t offset_bytes = slot * slot_bytes_ + layout.data_offset_bytes;
  return Tensor(on_device ? device_ring_ : host_, field.dtype, sizes, strides,
                offset_bytes / element_bytes);
}

Tensor StagingRing::offsets_view(int slot, size_t f, int64_t rows, bool on_device) const {
  const FieldLayout& layout = ragged_layout(f);
  return Tensor(on_device ? device_ring_ : host_, kInt64, {rows + 1},
                (slot * slot_bytes_ + layout.data_offset_bytes) / 8);
}

Tensor StagingRing::shapes_view(int slot, size_t f, int64_t rows, bool on_device) const {
  const FieldLayout& layout = ragged_layout(f);
  return Tensor(on_device ? device_ring_ : host_, kInt64,
                {rows, static_cast<int64_t>(layout.field.shape.size())},
                (slot * slot_bytes_ + layout.shapes_offset_bytes) / 8);
}

Tensor StagingRing::values_view(int slot, size_t f, bool on_device) const {
  const FieldLayout& layout = ragged_layout(f);
  const RaggedBuffers& buffers = ragged_[slot][layout.ragged_index];
  return Tensor(on_device ? buffers.device : buffers.host, layout.field.dtype,
                {buffers.used_bytes / element_size(layout.field.dtype)});
}

void StagingRing::reserve_values(int slot, size_t f, int64_t elements,
                                 const cuda::Event& consumer_done) {
  const FieldLayout& layout = ragged_layout(f);
  RaggedBuffers& buffers = ragged_[slot][layout.ragged_index];
  const int64_t needed_bytes = checked_mul(elements, element_size(layout.field.dtype),
                                           "packed values of field '" + layout.field.name + "'");
  // Allocated on first use even when empty, so a batch of empty values still views device
  // memory on a device.
  if (needed_bytes > buffers.host.nbytes() || buffers.host.nbytes() == 0) {
    // Half again as much as needed: batches vary, and a buffer sized to the largest batch
    // seen so far stops growing after a few batches.
    const int64_t capacity_bytes =
        align_up(std::max<int64_t>(needed_bytes + needed_bytes / 2, kRegionAlignment), kRegionAlignment);
    if (device_.is_cuda()) {
      if (consumer_done) consumer_done.synchronize();
      buffers.device = UntypedStorage::allocate(capacity_bytes, device_);
    }
    buffers.host = allocate_host(capacity_bytes, pin_memory_, device_);
  }
  buffers.used_bytes = needed_bytes;
}

void StagingRing::copy_slot_to_device(int slot, const cuda::Stream& stream) const {
  const int64_t offset_bytes = slot * slot_bytes_;
  cuda::copy_to_device_async(device_ring_.mutable_data() + offset_bytes,
                             host_.data() + offset_bytes, slot_bytes_, stream);
  for (const RaggedBuffers& buffers : ragged_[slot])
    cuda::copy_to_device_async(buffers.device.mutable_data(), buffers.host.data(),
                               buffers.used_bytes, stream);
}

void StagingRing::copy_slot_to_device(int slot, const cuda::Stream& stream, int64_t rows,
                                      std::span<const size_t> sourced, std::span<const void* const> sources) const {
  thread_local std::vector<cuda::CopyRun> runs;
  runs.clear();
  const auto add = [&](std::byte* dst, const std::byte* src, int64_t bytes) {
    if (bytes == 0) return;
    if (!runs.empty()) {
      cuda::CopyRun& last = runs.back();
      if (static_cast<std::byte*>(last.dst) + last.bytes == dst &&
          static_cast<const std::byte*>(last.src) + last.bytes == src) {
        last.bytes += static_cast<size_t>(bytes);
        return;
      }
    }
    runs.push_back({dst, src, static_cast<size_t>(bytes)});
  };
  const int64_t slot_offset = slot * slot_bytes_;
  std::byte* device = device_ring_.mutable_data() + slot_offset;
  const std::byte* host = host_.data() + slot_offset;
  for (size_t f = 0; f < fields_.size(); ++f) {
    const FieldLayout& layout = fields_[f];
    const int64_t begin = layout.data_offset_bytes;
    const int64_t end = f + 1 < fields_.size() ? fields_[f + 1].data_offset_bytes : slot_bytes_;
    const auto k = std::find(sourced.begin(), sourced.end(), f);
    if (k == sourced.end()) {
      add(device + begin, host + begin, end - begin);
      continue;
    }
    const int64_t row_bytes = layout.field.fixed_nbytes();
    const void* const* row_sources = sources.data() + (k - sourced.begin()) * slot_rows_;
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t at = begin + row * row_bytes;
      const auto* mapped = static_cast<const std::byte*>(row_sources[row]);
      add(device + at, mapped ? mapped : host + at, row_bytes);
    }
  }
  for (const RaggedBuffers& buffers : ragged_[slot])
    add(buffers.device.mutable_data(), buffers.host.data(), buffers.used_bytes);
  cuda::copy_runs_to_device_async(runs, stream);
}

const StagingRing::FieldLayout& StagingRing::ragged_layout(size_t f) const {
  const FieldLayout& layout = fields_[f];
  MMT_CHECK(layout.ragged, ValueError, "field '", layout.field.name, "' is not ragged");
  return layout;
}

}  // namespace mmt::detail
