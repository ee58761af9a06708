// The loader's staging ring: the host (and device) buffers its batches are gathered into.
//
// Every slot has the same layout, fixed by the loaded fields and the slot's rows B (the
// loader's batch size, or a rank's whole epoch when that is smaller):
//   fixed field : B * record bytes
//   ragged field: offsets int64[B + 1] and shapes int64[B * ndim]
// each region starting on a kRegionAlignment boundary. The slots of the ring are one host
// allocation (pinned when asked, or when a device is the destination) and, for a device,
// one device allocation of the same size: both made once, at exact size. A ragged field's
// packed values cannot be sized in advance, so each slot owns a values buffer per ragged
// field that grows geometrically when a batch needs more; in the steady state it does not.
//
// Thread safety: distinct slots may be used from distinct threads; one slot by one thread
// at a time (the loader's slot states guarantee it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda_stream.h"
#include "mmtensor/schema.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt::detail {

class StagingRing {
 public:
  static constexpr int64_t kRegionAlignment = 256;  // CUDA's allocation granularity for vectors

  struct FieldLayout {
    Field field;
    bool ragged = false;
    bool stored_in_logical_order = true;  // the field's storage_order is the identity
    int64_t data_offset_bytes = 0;     // fixed: the [B, ...] block; ragged: offsets
    int64_t shapes_offset_bytes = 0;   // ragged only
    int ragged_index = -1;             // ragged only: which values buffer
  };

  StagingRing(std::vector<Field> fields, int64_t slot_rows, int slots, Device device,
              bool pin_memory);

  int slots() const { return slots_; }
  int64_t slot_rows() const { return slot_rows_; }  // B: the most rows a batch in a slot has
  int64_t slot_bytes() const { return slot_bytes_; }
  Device device() const { return device_; }
  bool has_device_buffers() const { return device_.is_cuda(); }
  const std::vector<FieldLayout>& fields() const { return fields_; }
  const UntypedStorage& host_storage() const { return host_; }
  // Whether host buffers are asked for pinned (a ragged buffer's regrowth asks again, even
  // after the ring fell back to ordinary memory).
  bool pins_host() const { return pin_memory_; }

  // [rows, ...] view of fixed field `f` in `slot`, in the field's storage order.
  Tensor fixed_view(int slot, size_t f, int64_t rows, bool on_device) const;
  // int64 [rows + 1] offsets and [rows, ndim] shapes of ragged field `f`.
  Tensor offsets_view(int slot, size_t f, int64_t rows, bool on_device) const;
  Tensor shapes_view(int slot, size_t f, int64_t rows, bool on_device) const;
  // 1-d view of the packed values of ragged field `f`, as many as reserve_values() set.
  Tensor values_view(int slot, size_t f, bool on_device) const;

  // Makes room for `elements` values of ragged field `f` in `slot` and records that many as
  // used. Before a device buffer is replaced, `consumer_done` is waited on (the old buffer
  // may still be read by kernels queued on the consumer's stream).
  void reserve_values(int slot, size_t f, int64_t elements, const cuda::Event& consumer_done);

  // Queues the copies of `slot`'s fixed part and used ragged values to its device buffers.
  void copy_slot_to_device(int slot, const cuda::Stream& stream) const;
  // The same, except that the first `rows` rows of each fixed field sourced[k] come from
  // sources[k * slot_rows() + row] where that is not null (a page-locked file mapping: loader
  // pin_mapping), else from the slot; only those rows of those fields are copied. One batched
  // copy for all of it, whose adjacent rows (a sequential batch's) are merged into runs.
  void copy_slot_to_device(int slot, const cuda::Stream& stream, int64_t rows, std::span<const size_t> sourced,
                           std::span<const void* const> sources) const;

 private:
  struct RaggedBuffers {
    UntypedStorage host;
    UntypedStorage device;
    int64_t used_bytes = 0;
  };
  const FieldLayout& ragged_layout(size_t f) const;

  std::vector<FieldLayout> fields_;
  int64_t slot_rows_;
  int slots_;
  Device device_;
  bool pin_memory_;
  int64_t slot_bytes_ = 0;
  UntypedStorage host_;
  UntypedStorage device_ring_;
  std::vector<std::vector<RaggedBuffers>> ragged_;  // [slot][ragged field]
};

}  // namespace mmt::detail
