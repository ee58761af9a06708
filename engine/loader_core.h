// The loader's shared state: the ring, its slots, the work queue and the worker threads.
// Shared by Loader and every Batch on loan, so a batch released after its loader is gone
// still finds its slot (and the buffers its tensors view stay alive).
//
// A slot moves Free -> Filling (workers gather) -> Copying (a worker queues the device copy;
// cuda only) -> Ready -> Held (a Batch owns it) -> Free. Every transition happens under
// `mutex`; the slot's buffers are touched outside it only by the owner of that state
// (workers while Filling/Copying, the Batch while Held), which is what makes them race-free.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda_host_registration.h"
#include "cuda_stream.h"
#include "fork_safety.h"
#include "mmtensor/loader.h"
#include "read_ahead.h"
#include "staging_ring.h"

namespace mmt::detail {

// pin_mapping: the smallest record of a fixed field copied from the mapping. Smaller ones (a
// label) are gathered: a DMA run of a few bytes costs the batched copy more than the gather
// costs a worker (labels gathered rather than mapped took 150 KB images from 0.954 to 0.961 of
// pinned memcpy on an H200), and the engine's reads of them stay under its mapping guard.
inline constexpr int64_t kMappedRowMinBytes = 16 * 1024;

// From this many fields on, a batch finds a field by name in a map; below it, a scan of the
// names is quicker (as Schema::find does for a schema's).
inline constexpr size_t kFieldsLookedUpByMap = 8;

struct LoaderCore : std::enable_shared_from_this<LoaderCore> {
  enum class SlotState { Free, Filling, Copying, Ready, Held };

  struct Slot {
    SlotState state = SlotState::Free;
    int64_t batch = -1;  // batch number in the epoch (from its start or resume point)
    int64_t rows = 0;
    int pieces_left = 0;
    std::vector<int64_t> indices;  // ring.slot_rows() entries, the first `rows` valid
    std::exception_ptr error;
    int64_t error_row = 0;  // the first row of the piece that failed: the lowest one wins
    bool read_ahead_queued = false;  // a hint for this batch was queued: never twice
    // pin_mapping: where row r of mapped_fields[k] comes from, at [k * ring.slot_rows() + r]:
    // its bytes in a page-locked mapping, or null when it was gathered into the slot.
    std::vector<const void*> mapped_rows;
    cuda::Event copied;    // the host-to-device copy of this slot is done
    cuda::Event consumed;  // the consumer's work on this slot's device buffer is done
  };

  // A unit of work: rows [row_begin, row_end) of every fixed field, or one ragged field
  // (ragged_field >= 0) of the whole batch, or a read-ahead hint for the whole batch
  // (read_ahead; slot -1: it touches no slot). It carries the epoch's order so that a restart
  // can replace the loader's without racing the workers that are still finishing.
  struct Piece {
    int slot = 0;
    uint64_t generation = 0;
    EpochOrder order;
    int64_t start_consumed = 0;
    int64_t batch = 0;
    int64_t rows = 0;
    int64_t row_begin = 0;
    int64_t row_end = 0;
    int ragged_field = -1;  // position in ring.fields()
    bool read_ahead = false;
  };

  LoaderCore(Dataset dataset, LoaderOptions options, const LoaderState* resume_from);
  ~LoaderCore();

  void start_workers();
  void update_work_hint_locked() { work_hint.store(stopping || !pieces.empty(), std::memory_order_release); }
  void stop_workers() noexcept;

  std::optional<Batch> next(const std::function<void()>* poll = nullptr);  // Loader::next(poll)
  void set_epoch(int64_t epoch);
  void release_slot(int slot, CUstream_st* consumer_stream,
                    std::span<CUstream_st* const> other_streams) noexcept;
  LoaderState state() const;

  // ---- under `mutex` ----
  void restart_locked(std::unique_lock<std::mutex>& lock, int64_t epoch, int64_t consumed);
  void schedule_locked();
  // Queues read-ahead hints, after those already queued and before all other work, for the
  // batches of delivery[first..] still being filled and not hinted yet. A hint is optional:
  // one that cannot be queued is skipped.
  void queue_read_ahead_locked(size_t first) noexcept;
  LoaderState state_after_locked(int64_t batch) const;
  bool mid_shuffle_of_five_to_eight(int64_t consumed) const;

  // ---- workers ----
  void worker_main();
  // Runs `piece` on the calling thread, taken from the queue with `mutex` held.
  void run_taken_piece(std::unique_lock<std::mutex>& lock, Piece piece);
  void run_piece(const Piece& piece);
  void fill_fixed_rows(const Piece& piece);
  // pin_mapping: notes where the piece's rows of mapped_fields[k] are in the page-locked
  // mappings, and gathers those that are not (compressed chunks) into the slot.
  void locate_mapped_rows(const Piece& piece, size_t k, std::span<const int64_t> indices);
  void pack_ragged_field(const Piece& piece);
  // Runs options.transforms for the piece's rows, whose records are `indices`.
  void run_transforms(const Piece& piece, std::span<const int64_t> indices);
  void read_ahead(const Piece& piece) noexcept;
  // Runs gather(); in Auto mode with hints off, one piece a batch counts the major faults it
  // takes, and the first that takes one turns hints on for the batches already scheduled.
  template <class Gather> void gather_watching_faults(const Piece& piece, Gather gather);
  void finish_piece(std::unique_lock<std::mutex>& lock, const Piece& piece, std::exception_ptr error);
  // The batch's views of a Ready slot, and the consumer stream's wait for its copy; under
  // `mutex`. The batch does not own the slot yet: next() hands it over once nothing can fail.
  Batch make_batch(int slot, int64_t batch_epoch, const LoaderState& state_after);

  // Immutable after construction.
  // fork_safety.h: in a child of the process that made it, the loader's workers are absent
  // and `mutex` may be held for ever; the Loader and its batches then touch nothing.
  const uint64_t made_in_generation = detail::fork_generation();
  Dataset dataset;
  LoaderOptions options;  // as given (checked); sampler.options() has the window resolved
  Sampler sampler;
  uint64_t dataset_fingerprint;  // what each state records; hashed once, outside the mutex
  StagingRing ring;
  // The threads that call the CUDA runtime (pinned allocations, event waits): those of a
  // cuda loader, and of a cpu loader that pins its host memory while a device exists. They
  // run in relaxed capture mode (cuda_stream.h).
  bool calls_cuda = false;
  // The device a pinned cpu loader's threads select: the constructing thread's, so that a
  // ragged buffer's regrowth opens no context on device 0 in a multi-GPU job. -1: none.
  int pinning_device = -1;
  cuda::Stream copy_stream;
  std::vector<std::string> field_names;  // ring.fields() order
  // Batch::operator[]'s lookup when there are many fields (a file may hold thousands: looked
  // up one by one, a scan a lookup made a batch's fields cost their number squared). Views of
  // field_names, which does not change once the constructor has filled it.
  std::unordered_map<std::string_view, size_t> field_position_by_name;
  std::vector<size_t> ragged_fields;     // positions in ring.fields()
  std::vector<size_t> fixed_fields;      // positions in ring.fields(), gathered on the host
  std::vector<std::string> fixed_field_names;  // their names, for one get_batch per piece
  // pin_mapping: the fixed fields copied from the mapping instead (positions in ring.fields()),
  // and the registrations of the dataset's files, which keep their pages locked. Declared
  // after `dataset`, so unregistered before its mappings can go.
  std::vector<size_t> mapped_fields;
  std::vector<cuda::HostRegistration> pinned_files;
  std::vector<size_t> transform_fields;  // positions in ring.fields(), one per options.transforms
  std::vector<std::string> read_fields;  // the dataset fields read: loaded and transform inputs
  int64_t ragged_hold_limit_bytes = 0;  // decodes a ragged piece may hold before it spills
  ReadAheadPolicy read_ahead_policy;

  mutable std::mutex mutex;
  std::condition_variable work_ready;  // workers: pieces queued or stopping
  std::condition_variable slot_done;   // consumer and restart: a slot became Ready, or work ended
  std::deque<Piece> pieces;
  // !pieces.empty() || stopping, written under `mutex` whenever either changes: an idle
  // worker polls it for a moment before sleeping on work_ready (see worker_main).
  std::atomic<bool> work_hint{false};
  bool workers_spin = false;  // when every worker and the consumer have a core of their own
  std::vector<Slot> slots;
  std::deque<int> delivery;  // slots of scheduled batches not yet handed out, in batch order
  std::vector<std::thread> workers;
  uint64_t generation = 0;   // bumped by every restart: older pieces are void
  uint64_t set_epoch_calls = 0;  // Loader::Iterator's: a loop under way ends at set_epoch()
  // `generation`, readable without the mutex: a worker running a user's transforms row by
  // row leaves a piece voided meanwhile (set_epoch, destruction) instead of finishing it.
  std::atomic<uint64_t> live_generation{0};
  int active = 0;            // pieces running plus copies being queued
  bool stopping = false;
  // While a restart waits for the workers, the epoch fields still describe the old epoch: a
  // batch released meanwhile (on another thread) must not schedule pieces from them.
  bool restarting = false;
  std::exception_ptr failure;  // sticky after a worker's error reached the consumer

  // The epoch in progress.
  int64_t epoch = 0;
  EpochOrder order;
  int64_t start_consumed = 0;
  int64_t rank_samples = 0;
  int64_t total_batches = 0;
  int64_t scheduled = 0;
  int64_t delivered = 0;
  int64_t finished_total_batches = 0;  // while end_of_epoch_pending: the finished epoch's
  bool end_of_epoch_pending = false;  // the last batch went out; next() owes one nullopt
  // What state() says: after an epoch's last batch, that epoch with every position given up,
  // until the nullopt that ends it (or set_epoch()) moves it to the next epoch's start,
  // epoch_start_state.
  LoaderState current_state;
  LoaderState epoch_start_state;  // the state restart_locked() set
};

}  // namespace mmt::detail
