// The loader's workers: gather fixed fields and pack ragged ones straight into ring slots,
// queue the device copy of a completed slot, and turn failures into errors that name the
// batch, sample, chunk and field.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_prefetch.h"
#include "cuda_memory.h"
#include "loader_core.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "splitmix.h"
#include "streaming_copy.h"
#include "strided_copy.h"
#include "thread_pool.h"

namespace mmt::detail {

namespace {

// Spill capacity a thread keeps between pieces, so that small spills allocate once; a larger
// one is freed after its piece (spilling happens only past a quarter of the cache budget).
constexpr size_t kSpillKeptBytes = size_t{4} << 20;

// Rethrows `error` as the same mmt::Error type with `context` in front of its message, so a
// caller catching ChecksumError still catches it.
[[noreturn]] void rethrow_with_context(std::exception_ptr error, const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const ChecksumError& e) {
    throw ChecksumError(context + ": " + e.what());
  } catch (const FormatError& e) {
    throw FormatError(context + ": " + e.what());
  } catch (const IoError& e) {
    throw IoError(context + ": " + e.what(), e.errno_value());
  } catch (const IndexError& e) {
    throw IndexError(context + ": " + e.what());
  } catch (const ValueError& e) {
    throw ValueError(context + ": " + e.what());
  } catch (const CudaError& e) {
    throw CudaError(context + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(context + ": " + e.what());
  }
}

std::string batch_context(const LoaderCore::Piece& piece, const std::string& field) {
  return detail::str("Loader: epoch ", piece.order.epoch(), ", batch ", piece.batch, ", field '",
                     field, "'");
}

// Copies `value`, packed, to `dst` under the mapping guard (the value may be a view into the
// mapping: a file truncated by another program fails with IoError instead of killing the
// thread with SIGBUS; only raw pointers live inside the guard). A ragged value read alone is
// such a view, whose bytes fail only when copied.
// `dst_strides` (elements): the destination's layout, when not packed.
void copy_guarded(const Dataset& dataset, const Tensor& value, std::byte* dst, const DimVector* dst_strides = nullptr) {
  const DimVector packed_strides = dst_strides ? *dst_strides : contiguous_strides(value.sizes());
  const UntypedStorage& source = value.untyped_storage();
  const int64_t element_bytes = element_size(value.dtype());
  // The storage's own file (a part's, when the dataset is several) names a fault best.
  const std::string& file = source.filename().empty() ? dataset.path() : source.filename();
  detail::guard_mapped_reads(detail::MappedRegion{&file, source.data(), source.nbytes()}, [&] {
    detail::copy_strided(dst, packed_strides, value.data_ptr(), value.strides(), value.sizes(), element_bytes);
  });
}

// The chunk holding `index`, for an error message: "?" when the chunk table cannot say.
std::string chunk_of_or_unknown(const Dataset& dataset, int64_t index) {
  try {
    return std::to_string(dataset.chunk_of(index));
  } catch (...) {
    return "?";
  }
}

// Reading or copying failed somewhere in `indices`: find the first record (and of its fields,
// the first) that fails on its own, so the error names the sample, its chunk and the field;
// without one, name the batch.
[[noreturn]] void rethrow_for_sample(const Dataset& dataset, const LoaderCore::Piece& piece,
                                     std::span<const std::string> fields, std::span<const int64_t> indices,
                                     int64_t first_row, std::exception_ptr error) {
  std::vector<std::byte> scratch;
  for (size_t i = 0; i < indices.size(); ++i) {
    for (const std::string& field : fields) {
      std::exception_ptr sample_error;
      try {
        // Read again the way the batch read it, inside the engine's guards: a copy made here
        // (.contiguous() of a channels-last view) would fault unguarded on a truncated file.
        if (dataset.schema()[dataset.schema().index_of(field)].is_fixed())
          (void)dataset.get_batch(indices.subspan(i, 1), field, /*threads=*/1);
        else
        {
          const Tensor value = dataset.ragged_column(field, indices[i], indices[i] + 1).values;
          scratch.resize(static_cast<size_t>(value.nbytes()));
          copy_guarded(dataset, value, scratch.data());
        }
      } catch (...) {
        sample_error = std::current_exception();
      }
      if (!sample_error) continue;
      rethrow_with_context(sample_error,
                           detail::str("Loader: epoch ", piece.order.epoch(), ", batch ", piece.batch,
                                       ", sample ", indices[i], " (row ", first_row + static_cast<int64_t>(i),
                                       "), chunk ", chunk_of_or_unknown(dataset, indices[i]), ", field '", field, "'"));
    }
  }
  std::string names;
  for (const std::string& field : fields) names += (names.empty() ? "'" : ", '") + field + "'";
  rethrow_with_context(error, detail::str("Loader: epoch ", piece.order.epoch(), ", batch ", piece.batch,
                                          fields.size() == 1 ? ", field " : ", fields ", names, ", rows ",
                                          first_row, "..", first_row + static_cast<int64_t>(indices.size()) - 1));
}

}  // namespace

void LoaderCore::worker_main() {
  if (calls_cuda) {
    // A new thread's current device is 0; calls that take no device (pinned allocations
    // when a ragged buffer grows) would open a context there for a loader on cuda:1, or for
    // a pinned cpu loader of a process that works on another device.
    const int device = options.device.is_cuda() ? static_cast<int>(options.device.index) : pinning_device;
    try {
      if (device >= 0) cuda::use_device(device);
    } catch (...) {
      // The calls that name a device still select it; a failing device reports itself there.
    }
    cuda::relax_stream_capture_on_this_thread();  // cuda_stream.h: a user's graph capture elsewhere
  }
  std::unique_lock lock(mutex);
  while (true) {
    if (workers_spin && !stopping && pieces.empty()) {
      // Batches follow each other every few tens of microseconds; a worker woken through the
      // scheduler for each one pays that much again. Poll for a moment first (only when the
      // workers and the consumer have a core each: spinning on a shared core steals it).
      lock.unlock();
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      for (int polls = 1; !work_hint.load(std::memory_order_acquire); ++polls) {
        cpu_relax();
        if (polls % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
      }
      lock.lock();
    }
    work_ready.wait(lock, [&] { return stopping || !pieces.empty(); });
    if (stopping) return;
    Piece piece = std::move(pieces.front());
    pieces.pop_front();
    update_work_hint_locked();
    run_taken_piece(lock, std::move(piece));
  }
}

void LoaderCore::run_taken_piece(std::unique_lock<std::mutex>& lock, Piece piece) {
  ++active;
  lock.unlock();
  std::exception_ptr error;
  try {
    run_piece(piece);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  finish_piece(lock, piece, error);
}

void LoaderCore::run_piece(const Piece& piece) {
  if (piece.read_ahead) return read_ahead(piece);
  // The slot's host bytes may still be read by the copy of the batch it held before.
  if (options.device.is_cuda()) slots[piece.slot].copied.synchronize();
  if (piece.ragged_field >= 0) gather_watching_faults(piece, [&] { pack_ragged_field(piece); });
  else gather_watching_faults(piece, [&] { fill_fixed_rows(piece); });
}

template <class Gather>
void LoaderCore::gather_watching_faults(const Piece& piece, Gather gather) {
  // The piece of a batch's first rows, and each ragged field's piece, are enough to notice a
  // cold file, and keep the two getrusage calls out of the other pieces of a warm one.
  if (!(piece.row_begin == 0 && read_ahead_policy.watching_faults())) return gather();
  const int64_t faults_before = thread_major_faults();
  gather();
  if (!read_ahead_policy.note_gather_faults(thread_major_faults() - faults_before)) return;
  std::lock_guard lock(mutex);  // hints just went on: for the batches already scheduled too
  if (piece.generation == generation && !stopping && !restarting) {
    // This batch is hinted too while other pieces of it are still to be gathered; a batch of
    // one piece is being gathered already.
    if (slots[piece.slot].pieces_left <= 1) slots[piece.slot].read_ahead_queued = true;
    queue_read_ahead_locked(0);
    update_work_hint_locked();
    work_ready.notify_all();
  }
}

void LoaderCore::read_ahead(const Piece& piece) noexcept {
  // A hint: whatever fails here (a damaged chunk entry, no memory) is the gather's to report.
  try {
    thread_local std::vector<int64_t> indices;
    indices.resize(static_cast<size_t>(piece.rows));
    piece.order.rank_records(piece.start_consumed, piece.batch * options.batch_size, indices);
    const bool auto_mode = read_ahead_policy.mode() == ReadAhead::Auto;
    const auto hint = [&] { dataset.prefetch(indices, read_fields); };  // the fields read, and only those
    int64_t read = -1;
    if (auto_mode) read = thread_storage_read_by(hint);
    else hint();
    read_ahead_policy.note_hint(read);
  } catch (...) {
  }
}

void LoaderCore::fill_fixed_rows(const Piece& piece) {
  Slot& slot = slots[piece.slot];
  const std::span<int64_t> indices(slot.indices.data() + piece.row_begin,
                                   static_cast<size_t>(piece.row_end - piece.row_begin));
  piece.order.rank_records(piece.start_consumed, piece.batch * options.batch_size + piece.row_begin, indices);
  // Every fixed field in one call: over a compressed file the piece is sorted and its chunks
  // looked up once, not once per field.
  thread_local std::vector<Tensor> rows;
  struct ReleaseRows {  // views of the ring's slot: never kept past the piece
    ~ReleaseRows() { rows.clear(); }
  } release_rows;
  for (size_t f : fixed_fields)
    rows.push_back(ring.fixed_view(piece.slot, f, piece.rows, /*on_device=*/false)
                       .narrow(0, piece.row_begin, piece.row_end - piece.row_begin));
  if (!fixed_fields.empty()) try {
      const ReadAheadPolicy::DatasetHintsOff hints_are_the_loaders;  // it hinted this batch by its own policy
      // A slot bound for a device is read next by the copy engine, not by this processor; a
      // host slot is read after up to the whole ring has been written. Either way large values
      // may go there with streaming stores (engine/streaming_copy.h).
      const detail::GatherDestination destination(options.device.is_cuda(), ring.slots() * ring.slot_bytes());
      dataset.get_batch(indices, fixed_field_names, rows, /*threads=*/1);
    } catch (...) {
      rethrow_for_sample(dataset, piece, fixed_field_names, indices, piece.row_begin, std::current_exception());
    }
  for (size_t k = 0; k < mapped_fields.size(); ++k) locate_mapped_rows(piece, k, indices);
  if (!transform_fields.empty()) run_transforms(piece, indices);
}

void LoaderCore::locate_mapped_rows(const Piece& piece, size_t k, std::span<const int64_t> indices) {
  const size_t f = mapped_fields[k];
  const Field& field = ring.fields()[f].field;
  const std::string& name = field_names[f];
  const int64_t row_bytes = field.fixed_nbytes();
  // A row's bytes in the slot, laid out as the field is stored: a value viewed in the mapping
  // with these strides is those bytes as they are.
  const DimVector row_strides = field.value_strides(field.shape);
  std::byte* first_row = static_cast<std::byte*>(ring.fixed_view(piece.slot, f, piece.rows, false).mutable_data_ptr());
  const void** sources = slots[piece.slot].mapped_rows.data() + k * static_cast<size_t>(ring.slot_rows());
  size_t file = 0;  // the registration that held the last row: a run of rows is mostly in one file
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t row = piece.row_begin + static_cast<int64_t>(i);
    try {
      const Tensor value = dataset.get(indices[i], name);
      const void* bytes = value.data_ptr();
      bool mapped = std::ranges::equal(value.strides(), row_strides);
      if (mapped && !pinned_files[file].contains(bytes, static_cast<size_t>(row_bytes))) {
        mapped = false;
        for (size_t p = 0; p < pinned_files.size() && !mapped; ++p)
          if (pinned_files[p].contains(bytes, static_cast<size_t>(row_bytes))) mapped = true, file = p;
      }
      if (mapped) {
        sources[row] = bytes;
      } else {  // a decoded chunk's value (or one the mapping holds in another layout)
        sources[row] = nullptr;
        copy_guarded(dataset, value, first_row + row * row_bytes, &row_strides);
      }
    } catch (...) {
      rethrow_for_sample(dataset, piece, std::span<const std::string>(&name, 1), indices.subspan(i, 1), row,
                         std::current_exception());
    }
  }
}

namespace {

// The bytes of a transform's input prefetched a row ahead: all of a small record; the head
// of a large one, whose fn streams the rest behind the hardware prefetcher.
constexpr int64_t kTransformPrefetchBytes = 4096;

// SampleTransform::Input::seed: unrelated seeds for neighbouring positions and epochs.
uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t position) {
  return detail::derive_key(detail::derive_key(detail::mix64(seed), static_cast<uint64_t>(epoch)),
                            static_cast<uint64_t>(position));
}

}  // namespace

void LoaderCore::run_transforms(const Piece& piece, std::span<const int64_t> indices) {
  // One row ahead: the next record's inputs are looked up, and their first bytes prefetched,
  // before fn runs on this one, so that fn does not start on a cache miss (a record picked at
  // random is in memory, not in the caches, even when the file is warm). Two rows' views at
  // most are held: over a compressed file, each may pin a decoded chunk.
  thread_local std::vector<Tensor> current, ahead;
  struct ReleaseInputs {  // views that pin decoded chunks: never kept past the piece
    ~ReleaseInputs() {
      current.clear();
      ahead.clear();
    }
  } release_inputs;
  const int64_t first_sample = piece.batch * options.batch_size;
  const auto index_of = [&](int64_t row) { return indices[static_cast<size_t>(row - piece.row_begin)]; };
  for (size_t t = 0; t < options.transforms.size(); ++t) {
    const SampleTransform& transform = options.transforms[t];
    const auto read = [&](int64_t row, std::vector<Tensor>& into) -> std::exception_ptr {
      try {
        into.clear();
        for (const std::string& input : transform.inputs) into.push_back(dataset.get(index_of(row), input));
        for (const Tensor& view : into)
          detail::prefetch_bytes</*kLocality=*/3>(view.data_ptr(), view.nbytes(), kTransformPrefetchBytes);
        return nullptr;
      } catch (...) {
        return std::current_exception();
      }
    };
    const Tensor out = ring.fixed_view(piece.slot, transform_fields[t], piece.rows, /*on_device=*/false);
    std::exception_ptr ahead_error = read(piece.row_begin, ahead);
    for (int64_t row = piece.row_begin; row < piece.row_end; ++row) {
      // A user's transform may take long a row (heavy augmentation): a piece that a restart
      // or the loader's destruction voided meanwhile is left here, not finished for nothing.
      if (live_generation.load(std::memory_order_relaxed) != piece.generation) return;
      std::swap(current, ahead);
      const std::exception_ptr read_error = std::move(ahead_error);
      if (!read_error && row + 1 < piece.row_end) ahead_error = read(row + 1, ahead);
      const int64_t index = index_of(row);
      const auto context = [&] {  // only on the way out: not a string per sample
        return detail::str("Loader: epoch ", piece.order.epoch(), ", batch ", piece.batch, ", sample ", index,
                           " (row ", row, "), transform '", transform.name, "'");
      };
      if (read_error) {  // the engine's error (a damaged chunk): its own type, and the chunk
        rethrow_with_context(read_error, detail::str(context(), ", reading its inputs in chunk ",
                                                     chunk_of_or_unknown(dataset, index)));
      }
      try {
        // The position before padding wraps it: a repeated record is augmented anew.
        const int64_t position = piece.start_consumed + (first_sample + row) * options.sampler.world_size +
                                 options.sampler.rank;
        const SampleTransform::Input in{index, current, sample_seed(options.sampler.seed, piece.order.epoch(), position)};
        transform.fn(in, out[row]);
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception& e) {
        std::throw_with_nested(Error(detail::str(context(), ": ", e.what())));
      } catch (...) {
        std::throw_with_nested(Error(detail::str(context(), ": an exception that is not a std::exception")));
      }
    }
  }
}

void LoaderCore::pack_ragged_field(const Piece& piece) {
  const size_t f = static_cast<size_t>(piece.ragged_field);
  const std::string& name = field_names[f];
  const std::span<const std::string> field_name(&name, 1);
  // The batch in parts: a run of consecutive records inside one chunk (a sequential sampler's
  // batch of a token stream) is read with one ragged_column(), whose values are one view into
  // the chunk, copied at once; any other row is one get(). A field stored in another order
  // than its logical one is read row by row: ragged_column() would copy it once more.
  // Per-thread scratch: after the first batches, packing allocates nothing but a run's small
  // offsets and shapes.
  struct Part {
    int64_t row_begin = 0, row_end = 0;
    Tensor values;   // the part's values: a run's 1-d values, or one record's value
    Tensor offsets;  // runs only: int64 [rows + 1] into `values`
    Tensor shapes;   // runs only: int64 [rows, ndim]
    DimVector sizes;      // values.sizes(), kept when the values are spilled
    int64_t numel = 0;
    int64_t spilled_at = -1;  // >= 0: the values were copied to `spill` at this byte and let go
  };
  thread_local std::vector<int64_t> indices;
  thread_local std::vector<Part> parts;
  // Values copied out of the chunks early. A random batch of ragged records over compressed
  // data touches a chunk per row, and the parts' views would hold every one of them until the
  // packing below: past ragged_hold_limit_bytes, the parts read so far are copied here (one
  // more copy) and their chunks let go, so a piece holds a bounded amount of decodes.
  thread_local std::vector<std::byte> spill;
  // The views pin decoded chunks in the cache: never keep them. A large spill buffer is let go
  // too: the consumer's thread packs pieces as well, and would otherwise hold a batch's worth
  // of values for as long as it lives, loader and dataset long gone.
  struct ReleaseViews {
    ~ReleaseViews() {
      parts.clear();
      if (spill.capacity() > kSpillKeptBytes) std::vector<std::byte>().swap(spill);
    }
  } release_views;
  indices.resize(static_cast<size_t>(piece.rows));
  parts.clear();
  spill.clear();
  const int64_t element_bytes = element_size(ring.fields()[f].field.dtype);
  int64_t held_bytes = 0;  // decoded chunks the unspilled parts hold, each counted once
  const void* last_held = nullptr;
  size_t first_unspilled = 0;
  // Copies the values of part p, packed, to `dst` (copy_guarded); a failure names its sample.
  const auto copy_values = [&](const Part& part, std::byte* dst) {
    try {
      copy_guarded(dataset, part.values, dst);
    } catch (...) {
      const std::span<const int64_t> failed(indices.data() + part.row_begin,
                                            static_cast<size_t>(part.row_end - part.row_begin));
      rethrow_for_sample(dataset, piece, field_name, failed, part.row_begin, std::current_exception());
    }
  };
  piece.order.rank_records(piece.start_consumed, piece.batch * options.batch_size,
                           std::span<int64_t>(indices.data(), static_cast<size_t>(piece.rows)));
  int64_t total_elements = 0;
  for (int64_t row = 0; row < piece.rows;) {
    Part& part = parts.emplace_back();
    part.row_begin = row;
    part.row_end = row + 1;
    try {
      if (ring.fields()[f].stored_in_logical_order && row + 1 < piece.rows && indices[row + 1] == indices[row] + 1) {
        const ChunkInfo chunk = dataset.chunk(dataset.chunk_of(indices[row]));
        const int64_t chunk_stop = chunk.first_record + chunk.record_count;
        while (part.row_end < piece.rows && indices[part.row_end] == indices[part.row_end - 1] + 1 &&
               indices[part.row_end] < chunk_stop)
          ++part.row_end;
      }
      if (part.row_end - row > 1) {
        RaggedBatch run = dataset.ragged_column(name, indices[row], indices[part.row_end - 1] + 1);
        part.values = std::move(run.values);
        part.offsets = std::move(run.offsets);
        part.shapes = std::move(run.shapes);
      } else {
        part.values = dataset.get(indices[row], name);
      }
    } catch (...) {
      const std::span<const int64_t> failed(indices.data() + row, static_cast<size_t>(part.row_end - row));
      rethrow_for_sample(dataset, piece, field_name, failed, row, std::current_exception());
    }
    part.numel = part.values.numel();
    part.sizes.assign(part.values.sizes());
    total_elements += part.numel;
    row = part.row_end;
    const UntypedStorage& holds = part.values.untyped_storage();
    if (holds.filename().empty() && holds.data() != last_held) {  // a decoded chunk, not the mapping
      held_bytes += holds.nbytes();
      last_held = holds.data();
    }
    if (held_bytes > ragged_hold_limit_bytes) {
      for (; first_unspilled < parts.size(); ++first_unspilled) {
        Part& held = parts[first_unspilled];
        if (held.numel == 0) {  // nothing to copy, but an empty view may still hold its chunk
          held.values = Tensor();
          continue;
        }
        held.spilled_at = static_cast<int64_t>(spill.size());
        spill.resize(spill.size() + static_cast<size_t>(held.numel * element_bytes));
        copy_values(held, spill.data() + held.spilled_at);
        held.values = Tensor();
      }
      held_bytes = 0;
      last_held = nullptr;
    }
  }
  ring.reserve_values(piece.slot, f, total_elements, slots[piece.slot].consumed);
  const Tensor packed = ring.values_view(piece.slot, f, /*on_device=*/false);
  int64_t* offsets = ring.offsets_view(piece.slot, f, piece.rows, false).mutable_data_ptr<int64_t>();
  int64_t* shapes = ring.shapes_view(piece.slot, f, piece.rows, false).mutable_data_ptr<int64_t>();
  const size_t ndim = ring.fields()[f].field.shape.size();
  std::byte* packed_bytes = static_cast<std::byte*>(packed.mutable_data_ptr());
  int64_t position = 0;
  for (const Part& part : parts) {
    if (part.offsets.defined()) {
      const int64_t* run_offsets = part.offsets.data_ptr<int64_t>();
      const int64_t* run_shapes = part.shapes.data_ptr<int64_t>();
      for (int64_t row = part.row_begin; row < part.row_end; ++row) {
        const int64_t j = row - part.row_begin;
        offsets[row] = position + run_offsets[j];
        for (size_t d = 0; d < ndim; ++d) shapes[row * ndim + d] = run_shapes[j * static_cast<int64_t>(ndim) + d];
      }
    } else {
      MMT_CHECK(part.sizes.size() == ndim, FormatError, batch_context(piece, name), ", sample ",
                indices[part.row_begin], ": value has ", part.sizes.size(), " dimensions, the field ", ndim);
      offsets[part.row_begin] = position;
      for (size_t d = 0; d < ndim; ++d) shapes[part.row_begin * ndim + d] = part.sizes[d];
    }
    std::byte* dst = packed_bytes + position * element_bytes;
    if (part.spilled_at >= 0)
      std::memcpy(dst, spill.data() + part.spilled_at, static_cast<size_t>(part.numel * element_bytes));
    else if (part.numel > 0)
      copy_values(part, dst);
    position += part.numel;
  }
  offsets[piece.rows] = position;
}

void LoaderCore::finish_piece(std::unique_lock<std::mutex>& lock, const Piece& piece,
                              std::exception_ptr error) {
  // A hint holds no slot; a restart voided this batch (its slot is reset).
  if (piece.read_ahead || piece.generation != generation) {
    --active;
    slot_done.notify_all();
    return;
  }
  Slot& slot = slots[piece.slot];
  // Of several failing pieces, report the first row's, whichever thread finished first.
  if (error && (!slot.error || piece.row_begin < slot.error_row)) {
    slot.error = error;
    slot.error_row = piece.row_begin;
  }
  if (--slot.pieces_left > 0) {
    if (--active == 0) slot_done.notify_all();  // a restart may be waiting for the workers
    return;
  }
  if (options.device.is_cuda() && !slot.error) {
    slot.state = SlotState::Copying;
    lock.unlock();
    std::exception_ptr copy_error;
    try {
      // On the GPU, not the host: the copy waits for the kernels that read the previous batch.
      slot.consumed.make_stream_wait(copy_stream.get());
      if (mapped_fields.empty()) ring.copy_slot_to_device(piece.slot, copy_stream);
      else ring.copy_slot_to_device(piece.slot, copy_stream, slot.rows, mapped_fields, slot.mapped_rows);
      slot.copied.record(copy_stream.get());
    } catch (...) {
      // Part of the copy may be queued, reading the slot's host memory. Workers refill a
      // slot once `copied` has passed, so the event must mark this copy (or, if it cannot,
      // the stream is drained here) before the slot comes back.
      try {
        slot.copied.record(copy_stream.get());
      } catch (...) {
        try {
          copy_stream.synchronize();
        } catch (...) {  // a broken device: the error below is what gets reported
        }
      }
      try {
        rethrow_with_context(std::current_exception(),
                             detail::str("Loader: epoch ", piece.order.epoch(), ", batch ", piece.batch,
                                         ", copy to ", options.device.str()));
      } catch (...) {
        copy_error = std::current_exception();
      }
    }
    lock.lock();
    if (copy_error && piece.generation == generation) slot.error = copy_error;
  }
  if (piece.generation == generation) slot.state = SlotState::Ready;
  --active;
  slot_done.notify_all();
}

}  // namespace mmt::detail
