// The loader's scheduling: epochs, slot assignment, hand-out and return of batches.
// The workers' side is in loader_worker.cc; the layout of the buffers in staging_ring.cc.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <tuple>
#include <utility>

#include "checksum.h"
#include "chunk_cache.h"
#include "cpu_budget.h"
#include "cuda_memory.h"
#include "cuda_stream.h"
#include "loader_core.h"
#include "mmtensor/error.h"

namespace mmt {
namespace detail {

namespace {

// Threads and slots beyond these are a mistake, not a configuration.
constexpr int kMaxPrefetchBatches = 1024;

// The ring's fields: the dataset fields loaded as stored, then the transforms' outputs.
std::vector<Field> selected_fields(const Dataset& dataset, const LoaderOptions& options) {
  const Schema& schema = dataset.schema();
  MMT_CHECK(!schema.empty(), ValueError, "Loader: dataset ", dataset.path(), " has no fields");
  const auto is_output = [&](const std::string& name) {
    return std::any_of(options.transforms.begin(), options.transforms.end(),
                       [&](const SampleTransform& transform) { return transform.name == name; });
  };
  std::vector<Field> fields;
  if (options.fields.empty()) {
    // Every stored field that no transform takes over: one a transform reads, or one whose
    // name an output takes, comes back as the transform made it, not also as stored. (A
    // name in a non-empty `fields` that an output has is that output, too.)
    for (const Field& field : schema.fields()) {
      const bool read_by_a_transform = std::any_of(
          options.transforms.begin(), options.transforms.end(), [&](const SampleTransform& transform) {
            return std::find(transform.inputs.begin(), transform.inputs.end(), field.name) != transform.inputs.end();
          });
      if (!read_by_a_transform && !is_output(field.name)) fields.push_back(field);
    }
  }
  for (size_t i = 0; i < options.fields.size(); ++i) {
    const std::string& name = options.fields[i];
    for (size_t j = 0; j < i; ++j)
      MMT_CHECK(options.fields[j] != name, ValueError, "Loader: field '", name, "' is listed twice");
    if (is_output(name)) continue;  // the transform's output, not the stored field of that name
    try {
      fields.push_back(schema[schema.index_of(name)]);
    } catch (const ValueError& e) {  // it lists the known names
      throw ValueError(detail::str("Loader: LoaderOptions::fields: ", e.what()));
    }
  }
  for (const SampleTransform& transform : options.transforms) {
    for (const Field& chosen : fields)
      MMT_CHECK(chosen.name != transform.name, ValueError, "Loader: transform '", transform.name,
                "' fills a batch field of that name, which another transform fills already");
    for (const std::string& input : transform.inputs) {
      try {
        (void)schema.index_of(input);
      } catch (const ValueError& e) {  // it lists the known names
        throw ValueError(detail::str("Loader: transform '", transform.name, "', input '", input, "': ", e.what()));
      }
    }
    MMT_CHECK(static_cast<bool>(transform.fn), ValueError, "Loader: transform '", transform.name, "' has no fn");
    try {
      fields.push_back(Field::fixed(transform.name, transform.dtype, transform.shape));
    } catch (const Error& e) {
      throw ValueError(detail::str("Loader: transform '", transform.name, "': ", e.what()));
    }
  }
  return fields;
}

// The dataset fields a loader reads: those it loads and the transforms' inputs, each once.
std::vector<std::string> read_field_names(const LoaderOptions& options, const std::vector<Field>& loaded) {
  std::vector<std::string> names;
  for (const Field& field : loaded) names.push_back(field.name);
  for (const SampleTransform& transform : options.transforms)
    for (const std::string& input : transform.inputs)
      if (std::find(names.begin(), names.end(), input) == names.end()) names.push_back(input);
  return names;
}

LoaderOptions checked(LoaderOptions options, const Dataset& dataset) {
  MMT_CHECK(dataset.is_open(), ValueError, "Loader: the dataset is not open");
  MMT_CHECK(options.batch_size >= 1, ValueError, "Loader: batch_size must be >= 1, got ",
            options.batch_size);
  MMT_CHECK(options.num_workers >= 0 && options.num_workers <= kMaxLoaderWorkers, ValueError,
            "Loader: num_workers must be in [0, ", kMaxLoaderWorkers, "], got ", options.num_workers);
  MMT_CHECK(options.epoch >= 0 && options.epoch < kMaxEpoch, ValueError, "Loader: epoch must be in [0, ",
            kMaxEpoch, "), got ", options.epoch);
  MMT_CHECK(options.read_ahead == ReadAhead::Auto || options.read_ahead == ReadAhead::Always ||
                options.read_ahead == ReadAhead::Never,
            ValueError, "Loader: read_ahead must be Auto, Always or Never, got ",
            static_cast<int>(options.read_ahead));
  MMT_CHECK(options.timeout.count() >= 0, ValueError, "Loader: timeout must be >= 0 ms (0: no limit), got ",
            options.timeout.count(), " ms");
  MMT_CHECK(options.prefetch_batches >= 1 && options.prefetch_batches <= kMaxPrefetchBatches,
            ValueError, "Loader: prefetch_batches must be in [1, ", kMaxPrefetchBatches, "], got ",
            options.prefetch_batches);
  MMT_CHECK(!options.pin_mapping || options.device.is_cuda(), ValueError,
            "Loader: pin_mapping copies records from the file mapping to a CUDA device; device is ",
            options.device.str(), " (leave pin_mapping off, or ask for cuda:N)");
  if (options.device.is_cuda()) {
    MMT_CHECK(built_with_cuda(), CudaError, "Loader: device ", options.device.str(),
              " was asked for, but mmtensor was built without CUDA");
    MMT_CHECK(options.device.index >= 0 && options.device.index < cuda_device_count(), CudaError,
              "Loader: device ", options.device.str(), " is not available (",
              cuda_device_count(), " CUDA device(s) found)");
    // The wait for a batch's copy would cross devices, but the event that marks a slot
    // reusable cannot be recorded on another device's stream.
    const int stream_device = cuda::stream_device(options.consumer_stream);
    MMT_CHECK(stream_device < 0 || stream_device == options.device.index, CudaError,
              "Loader: consumer_stream belongs to cuda:", stream_device, ", not to the loader's device ",
              options.device.str(), "; pass a stream of ", options.device.str());
  }
  return options;
}

// Rows a staging slot needs: a batch never holds more samples than a rank takes in a whole
// epoch (at least one slot row, for an empty dataset), so a batch_size far above the dataset
// does not allocate, and pin, memory no batch can use.
int64_t slot_rows(int64_t batch_size, const Sampler& sampler) {
  const int64_t records = sampler.epoch_size();
  const int64_t world = sampler.options().world_size;
  const int64_t most_per_rank = records / world + (records % world != 0);
  return std::clamp<int64_t>(most_per_rank, 1, batch_size);
}

// "a subset of 5 entries (hash 0x...)" or "no subset", for the resume check.
std::string subset_description(uint64_t hash, int64_t size) {
  if (hash == 0) return "no subset";
  return detail::str("a subset of ", size, " entries (hash ", detail::hex64(hash), ")");
}

// "a mixture of 1000 positions an epoch (hash 0x...)" or "no mixture", for the resume check.
std::string mixture_description(uint64_t hash, int64_t size) {
  if (hash == 0) return "no mixture";
  return detail::str("a mixture of ", size, " positions an epoch (hash ", detail::hex64(hash), ")");
}

SamplerOptions resumed_sampler_options(SamplerOptions options, const LoaderState* state) {
  if (state && options.kind == SamplerKind::QuasiRandom && options.window_chunks == 0)
    options.window_chunks = state->window_chunks;  // the order must be the one it was saved in
  return options;
}

}  // namespace

LoaderCore::LoaderCore(Dataset dataset_in, LoaderOptions options_in, const LoaderState* resume_from)
    : dataset(std::move(dataset_in)),
      options(checked(std::move(options_in), dataset)),
      sampler(Sampler::for_dataset(dataset, resumed_sampler_options(options.sampler, resume_from))),
      dataset_fingerprint(dataset.fingerprint()),
      ring(selected_fields(dataset, options), slot_rows(options.batch_size, sampler),
           options.prefetch_batches + 1, options.device, options.pin_memory),
      read_ahead_policy(options.read_ahead) {
  calls_cuda = options.device.is_cuda() || (ring.pins_host() && cuda::device_count() > 0);
  if (calls_cuda && !options.device.is_cuda()) pinning_device = cuda::current_device();
  const size_t loaded = ring.fields().size() - options.transforms.size();
  std::vector<Field> loaded_fields;
  for (size_t f = 0; f < ring.fields().size(); ++f) {
    field_names.push_back(ring.fields()[f].field.name);
    if (f >= loaded) transform_fields.push_back(f);
    else if (ring.fields()[f].ragged) ragged_fields.push_back(f);
    else if (options.pin_mapping && ring.fields()[f].field.fixed_nbytes() >= kMappedRowMinBytes) {
      mapped_fields.push_back(f);
    } else {
      fixed_fields.push_back(f);
      fixed_field_names.push_back(ring.fields()[f].field.name);
    }
    if (f < loaded) loaded_fields.push_back(ring.fields()[f].field);
  }
  if (field_names.size() >= kFieldsLookedUpByMap)
    for (size_t f = 0; f < field_names.size(); ++f) field_position_by_name.emplace(field_names[f], f);
  read_fields = read_field_names(options, loaded_fields);
  ragged_hold_limit_bytes = detail::decode_hold_limit_bytes(dataset.cache_stats().budget_bytes);
  slots.resize(static_cast<size_t>(ring.slots()));
  for (Slot& slot : slots) {
    slot.indices.resize(static_cast<size_t>(ring.slot_rows()));
    slot.mapped_rows.resize(mapped_fields.size() * static_cast<size_t>(ring.slot_rows()));
    if (options.device.is_cuda()) {
      slot.copied = cuda::Event::create(options.device.index);
      slot.consumed = cuda::Event::create(options.device.index);
    }
  }
  if (options.device.is_cuda()) copy_stream = cuda::Stream::create(options.device.index);

  int64_t first_epoch = options.epoch, consumed = 0;
  if (resume_from) {
    const LoaderState& state = *resume_from;
    const SamplerOptions& mine = sampler.options();  // resolved: the window the order is made with
    MMT_CHECK(state.records == dataset.size(), ValueError, "Loader: the state was saved for a dataset of ",
              state.records, " records; ", dataset.path(), " has ", dataset.size());
    MMT_CHECK(state.sampler == mine.kind, ValueError, "Loader: the state was saved with a ",
              to_string(state.sampler), " sampler; the options ask for ", to_string(mine.kind));
    MMT_CHECK(state.seed == mine.seed, ValueError, "Loader: the state was saved with seed ",
              state.seed, "; the options say ", mine.seed);
    MMT_CHECK(state.subset_hash == sampler.subset_hash(), ValueError, "Loader: the state was saved with ",
              subset_description(state.subset_hash, state.subset_size), ", but the options give ",
              subset_description(sampler.subset_hash(), sampler.epoch_size()),
              " (a resume must visit the same list, or the rest of its epoch would be other records)");
    MMT_CHECK(state.mixture_hash == sampler.mixture_hash(), ValueError, "Loader: the state was saved with ",
              mixture_description(state.mixture_hash, state.mixture_size), ", but the options give ",
              mixture_description(sampler.mixture_hash(), sampler.epoch_size()),
              " (a resume must draw from the same sources in the same counts, or the rest of its epoch would be "
              "other records)");
    MMT_CHECK(mine.kind != SamplerKind::QuasiRandom || state.window_chunks == mine.window_chunks,
              ValueError, "Loader: the state was saved with a window of ", state.window_chunks,
              " chunks; the options say ", mine.window_chunks, " (0 adopts the state's)");
    MMT_CHECK(state.chunk_layout == 0 || state.chunk_layout == sampler.chunk_layout_hash(), ValueError,
              "Loader: the state was saved for another chunk layout than ", dataset.path(), "'s ",
              dataset.num_chunks(), " chunks (the file was re-packed); its quasi-random order would differ");
    MMT_CHECK(state.dataset_fingerprint == 0 || state.dataset_fingerprint == dataset_fingerprint, ValueError,
              "Loader: the state was saved on another dataset than ", dataset.path(), " (fingerprint ",
              detail::hex64(state.dataset_fingerprint), ", this file's is ", detail::hex64(dataset_fingerprint), ": another file of ",
              dataset.size(), " records, or this one re-packed",
              dataset.parts().size() > 1 ? ", or these files read as one in another order, which numbers their records "
                                           "otherwise (give them in the order the state was saved with)"
                                         : "",
              "); to resume on a re-packed copy of the same records, in the same order, clear the state's "
              "dataset_fingerprint");
    MMT_CHECK(state.consumed >= 0 && state.consumed <= sampler.epoch_size(), ValueError,
              "Loader: the state's consumed=", state.consumed, " is outside [0, ", sampler.epoch_size(), "]");
    // Shuffles of 5 to 8 entries changed in version 5 (LoaderState::shuffles_five_to_eight):
    // an older state counts positions of an order this build no longer makes. At an epoch's
    // start or end it counts none, or all.
    const bool mid_epoch = state.consumed > 0 && state.consumed < sampler.epoch_size();
    MMT_CHECK(!mid_epoch || state.shuffles_five_to_eight || !sampler.epoch(state.epoch).shuffles_five_to_eight(),
              ValueError,
              "Loader: the state stands in the middle of epoch ", state.epoch, " (consumed=", state.consumed, " of ",
              sampler.epoch_size(), "), whose ", to_string(state.sampler), " order shuffles a run of 5 to 8 entries, "
              "which mmtensor shuffles otherwise since loader states of version 5: resuming would repeat some records "
              "and skip others. Start the epoch over (consumed = 0) or go on with the next one");
    first_epoch = state.epoch;
    consumed = state.consumed;
  }
  // Last of the checks: locking reads the whole files, which a refused state need not wait for.
  if (!mapped_fields.empty()) {  // nothing to lock when every field is gathered anyway
    for (const Dataset& part : dataset.parts()) {
      const UntypedStorage file = part.file_storage();
      pinned_files.push_back(cuda::HostRegistration::read_only(file.data(), static_cast<size_t>(file.nbytes()),
                                                               options.device.index, "Loader: pin_mapping: " + part.path()));
    }
  }
  std::unique_lock lock(mutex);
  restart_locked(lock, first_epoch, consumed);
}

LoaderCore::~LoaderCore() {
  // Queued copies read the pinned ring and write the device buffers, and the consumer's
  // kernels may still read the device buffers of released batches: all must outlive them.
  // Each wait on its own: one that fails must not skip the others, and the device's whole
  // queue is the fallback.
  bool drained = true;
  try {
    copy_stream.synchronize();
  } catch (...) {
    drained = false;
  }
  if (options.device.is_cuda())
    for (Slot& slot : slots) try {
        slot.consumed.synchronize();
      } catch (...) {
        drained = false;
      }
  if (!drained && options.device.is_cuda()) cuda::synchronize_device_noexcept(options.device.index);
}

void LoaderCore::start_workers() {
  workers_spin = options.num_workers + 1 <= detail::available_cpus();
  workers.reserve(static_cast<size_t>(options.num_workers));
  try {
    for (int w = 0; w < options.num_workers; ++w) workers.emplace_back([this] { worker_main(); });
  } catch (...) {
    stop_workers();
    throw;
  }
}

void LoaderCore::stop_workers() noexcept {
  {
    std::lock_guard lock(mutex);
    stopping = true;
    ++generation;
    live_generation.store(generation, std::memory_order_relaxed);
    pieces.clear();
    update_work_hint_locked();
  }
  work_ready.notify_all();
  for (std::thread& worker : workers)
    if (worker.joinable()) worker.join();
  workers.clear();
}

void LoaderCore::restart_locked(std::unique_lock<std::mutex>& lock, int64_t new_epoch,
                                int64_t consumed) {
  // Every epoch is below kMaxEpoch, so the callers' epoch + 1 cannot overflow; they do not
  // move past the last epoch, and set_epoch()'s is checked here.
  MMT_CHECK(new_epoch >= 0 && new_epoch < kMaxEpoch, ValueError, "Loader: epoch ", new_epoch,
            " is outside [0, ", kMaxEpoch, ")");
  // What can fail (the order's tables, out of memory) comes before anything changes: a failed
  // restart leaves the loader in the epoch it was in, and the caller may simply retry.
  EpochOrder new_order = sampler.epoch(new_epoch);
  const int64_t new_rank_samples = new_order.rank_size(consumed);
  ++generation;
  live_generation.store(generation, std::memory_order_relaxed);
  pieces.clear();
  update_work_hint_locked();
  restarting = true;
  slot_done.wait(lock, [&] { return active == 0; });  // workers finish what they hold
  restarting = false;
  for (Slot& slot : slots) {
    if (slot.state == SlotState::Held) continue;  // on loan; comes back through release_slot
    slot.state = SlotState::Free;
    slot.error = nullptr;
  }
  delivery.clear();
  failure = nullptr;
  end_of_epoch_pending = false;
  read_ahead_policy.note_new_epoch();
  epoch = new_epoch;
  order = std::move(new_order);
  start_consumed = consumed;
  rank_samples = new_rank_samples;
  const int64_t batch = options.batch_size;
  total_batches = options.drop_last ? rank_samples / batch : rank_samples / batch + (rank_samples % batch != 0);
  scheduled = delivered = 0;
  const SamplerOptions& sampler_options = sampler.options();
  current_state = LoaderState{.sampler = sampler_options.kind,
                              .seed = sampler_options.seed,
                              .window_chunks = sampler_options.window_chunks,
                              .records = dataset.size(),
                              .epoch = new_epoch,
                              .consumed = consumed,
                              .chunk_layout = sampler.chunk_layout_hash(),
                              .dataset_fingerprint = dataset_fingerprint,
                              .subset_hash = sampler.subset_hash(),
                              .subset_size = sampler.subset_hash() != 0 ? sampler.epoch_size() : 0,
                              .mixture_hash = sampler.mixture_hash(),
                              .mixture_size = sampler.mixture_hash() != 0 ? sampler.epoch_size() : 0,
                              .shuffles_five_to_eight = mid_shuffle_of_five_to_eight(consumed)};
  epoch_start_state = current_state;
  try {
    schedule_locked();
  } catch (...) {
    // The new epoch stands, with fewer batches queued than slots allow. Recorded as the
    // loader's failure, so next() reports it and set_epoch() restarts instead of seeing an
    // epoch that has delivered nothing and returning.
    failure = std::current_exception();
    throw;
  }
}

void LoaderCore::schedule_locked() {
  if (stopping || failure || restarting) return;
  bool queued = false;
  const size_t first_new = delivery.size();  // the slots scheduled now follow, in batch order
  for (int s = 0; s < static_cast<int>(slots.size()) && scheduled < total_batches; ++s) {
    Slot& slot = slots[s];
    if (slot.state != SlotState::Free) continue;
    const int64_t rows = std::min(options.batch_size, rank_samples - scheduled * options.batch_size);
    // Row ranges split the gather across the workers and the consumer (who helps with the
    // batch it waits for), so one batch's latency shrinks with threads even when the ring
    // is shallow. They also write the slot's indices, which is why there is at least one.
    const int64_t row_pieces = std::min<int64_t>(options.num_workers + 1, rows);
    // A slot is queued whole or not at all: an allocation failing half-way takes its pieces
    // back out, and the slot stays free (a half-queued slot would never be delivered nor
    // freed, one slot fewer in the ring until the next restart).
    const size_t pieces_before = pieces.size();
    try {
      Piece piece{s, generation, order, start_consumed, scheduled, rows, 0, rows, -1};
      for (int64_t p = 0; p < row_pieces; ++p) {
        piece.row_begin = rows * p / row_pieces;
        piece.row_end = rows * (p + 1) / row_pieces;
        pieces.push_back(piece);
      }
      piece.row_begin = 0;
      piece.row_end = rows;
      for (size_t f : ragged_fields) {
        piece.ragged_field = static_cast<int>(f);
        pieces.push_back(piece);
      }
      delivery.push_back(s);
    } catch (...) {
      pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(pieces_before), pieces.end());
      if (queued) {
        update_work_hint_locked();
        work_ready.notify_all();
      }
      throw;
    }
    slot.state = SlotState::Filling;
    slot.batch = scheduled;
    slot.rows = rows;
    slot.error = nullptr;
    slot.read_ahead_queued = false;
    slot.pieces_left = static_cast<int>(row_pieces + ragged_fields.size());
    ++scheduled;
    queued = true;
  }
  if (queued) {
    if (read_ahead_policy.hinting()) queue_read_ahead_locked(first_new);
    update_work_hint_locked();
    work_ready.notify_all();
  }
}

void LoaderCore::queue_read_ahead_locked(size_t first) noexcept {
  // Ahead of the gathers, so that a worker starts the batches' reads before it gathers the
  // batches queued earlier (their gathers are what the reads overlap); behind the hints
  // already queued, which are for sooner batches.
  try {
    std::vector<Piece> hints;
    std::vector<Slot*> hinted;
    for (size_t k = first; k < delivery.size(); ++k) {
      Slot& slot = slots[delivery[k]];
      if (slot.state != SlotState::Filling || slot.read_ahead_queued) continue;
      hints.push_back(Piece{-1, generation, order, start_consumed, slot.batch, slot.rows, 0, slot.rows, -1, true});
      hinted.push_back(&slot);
    }
    const auto after_hints = std::find_if(pieces.begin(), pieces.end(), [](const Piece& p) { return !p.read_ahead; });
    pieces.insert(after_hints, std::make_move_iterator(hints.begin()), std::make_move_iterator(hints.end()));
    for (Slot* slot : hinted) slot->read_ahead_queued = true;
  } catch (...) {  // out of memory: the batches are read without hints
  }
}

// Whether a state `consumed` positions into the epoch stands in the middle of an order that
// shuffles a run of 5 to 8 entries: only then is it written as version 5, which older builds
// refuse; at the epoch's start or end they resume it as this build does.
bool LoaderCore::mid_shuffle_of_five_to_eight(int64_t consumed) const {
  return consumed > 0 && consumed < sampler.epoch_size() && order.shuffles_five_to_eight();
}

LoaderState LoaderCore::state_after_locked(int64_t batch) const {
  LoaderState state = current_state;
  // After the epoch's last batch, the epoch with every position given up (the tail drop_last
  // leaves out included), not the next epoch's start: a loader resumed there gives what the
  // uninterrupted one gives next, the end of the epoch (next() says nullopt) and then the next
  // epoch. A training loop that saved its own epoch counter with this state resumes with
  // set_epoch(that epoch), which then stands at the epoch's end instead of repeating it.
  // Every position: with drop_tail the rank's samples end short of the epoch's size, and a
  // resume under another world size would otherwise be given that dropped tail.
  state.epoch = epoch;
  state.consumed = batch + 1 >= total_batches ? sampler.epoch_size()
                                              : order.consumed_after(start_consumed, (batch + 1) * options.batch_size);
  state.shuffles_five_to_eight = mid_shuffle_of_five_to_eight(state.consumed);
  return state;
}

std::optional<Batch> LoaderCore::next(const std::function<void()>* poll) {
  std::unique_lock lock(mutex);
  if (failure) std::rethrow_exception(failure);
  if (end_of_epoch_pending) {
    end_of_epoch_pending = false;
    current_state = epoch_start_state;  // the finished epoch is behind: the next one's start
    return std::nullopt;
  }
  if (delivered == total_batches) {  // an epoch without batches, or the last epoch, done
    if (epoch + 1 < kMaxEpoch) restart_locked(lock, epoch + 1, 0);
    return std::nullopt;
  }
  MMT_CHECK(!delivery.empty(), ValueError, "Loader: all ", slots.size(),
            " staging slots are held by live batches; release a batch before calling next(), "
            "or raise prefetch_batches");
  const int s = delivery.front();
  const auto wait_started = std::chrono::steady_clock::now();
  auto last_poll = wait_started;
  bool waited = false;
  while (slots[s].state != SlotState::Ready) {
    waited = true;
    if (poll != nullptr && std::chrono::steady_clock::now() - last_poll >= Loader::kPollInterval) {
      // Unlocked: poll() may wait for a lock of its own (Python's GIL) that a thread releasing
      // a batch (which takes `mutex`) holds. Nothing here has changed yet, so an exception
      // from it leaves the batch first in line; only this thread drives next(), so `s` stays
      // the front.
      lock.unlock();
      (*poll)();
      lock.lock();
      last_poll = std::chrono::steady_clock::now();
      if (failure) std::rethrow_exception(failure);
      continue;
    }
    // Rather than sleep, the consumer gathers what is left of the batch it waits for: its
    // core is idle anyway, and a hand-off through the scheduler is saved.
    // A hint for this batch still queued is given first: its reads then run in parallel
    // instead of one fault at a time. Without workers, every hint ahead is the consumer's.
    const auto mine = std::find_if(pieces.begin(), pieces.end(), [&](const Piece& p) {
      return p.slot == s || (p.read_ahead && (options.num_workers == 0 || p.batch == slots[s].batch));
    });
    if (mine == pieces.end()) {
      // A limit beyond what the clock can add (milliseconds::max(), meaning "forever") is none.
      const bool limited = options.timeout.count() > 0 &&
                           options.timeout < std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 std::chrono::steady_clock::time_point::max() - wait_started);
      const auto deadline = limited ? wait_started + options.timeout : std::chrono::steady_clock::time_point::max();
      if (poll != nullptr && (!limited || last_poll + Loader::kPollInterval < deadline)) {
        slot_done.wait_until(lock, last_poll + Loader::kPollInterval);  // then poll, or go on
      } else if (!limited) {
        slot_done.wait(lock);
      } else if (slot_done.wait_until(lock, deadline) == std::cv_status::timeout &&
                 slots[s].state != SlotState::Ready) {
        // Nothing changes: the batch stays first in line for the next call.
        throw IoError(detail::str("Loader: epoch ", epoch, ", batch ", slots[s].batch, " was not ready after ",
                                  options.timeout.count(), " ms (LoaderOptions::timeout): the workers are still "
                                  "gathering it (a slow or hung read?); next() again goes on waiting for it"),
                      ETIMEDOUT);
      }
      if (failure) std::rethrow_exception(failure);
      continue;
    }
    Piece piece = std::move(*mine);
    pieces.erase(mine);
    update_work_hint_locked();
    // Gathering here waits on slot events and may grow pinned buffers: calls that another
    // thread's graph capture in global mode forbids (cuda_stream.h).
    std::optional<cuda::ScopedRelaxedStreamCapture> relaxed;
    if (calls_cuda) relaxed.emplace();
    run_taken_piece(lock, std::move(piece));
  }
  if (poll != nullptr && waited) {
    // Once more after a wait, before the batch leaves the queue: what came during the last
    // piece gathered here (which may take long) is answered with the batch still first in
    // line. A batch ready at once is taken without a call: its next() is too short to matter.
    lock.unlock();
    (*poll)();
    lock.lock();
    if (failure) std::rethrow_exception(failure);
  }
  Slot& slot = slots[s];
  if (slot.error) {
    delivery.pop_front();
    failure = slot.error;
    slot.state = SlotState::Free;
    std::rethrow_exception(failure);
  }
  // Everything that can fail comes before the batch leaves the queue: a failure here (the
  // consumer stream cannot wait on the copy's event, say) leaves the loader where it was, so
  // the batch is neither lost nor counted in state().
  const LoaderState state_after = state_after_locked(slot.batch);
  Batch batch = make_batch(s, epoch, state_after);
  delivery.pop_front();
  slot.state = SlotState::Held;
  current_state = state_after;
  ++delivered;
  if (delivered == total_batches) {
    // Prefetch the next epoch while the user works on this last batch.
    finished_total_batches = total_batches;
    const int64_t finished_epoch = epoch;
    try {
      // The last epoch has none after it: the loader stays at its end, and next() says so.
      if (epoch + 1 < kMaxEpoch) restart_locked(lock, epoch + 1, 0);
    } catch (...) {  // out of memory, say: the next next() reports it
      failure = std::current_exception();
    }
    current_state = state_after;
    // Only an epoch that moved on owes a nullopt (and makes epoch() report the one before).
    end_of_epoch_pending = epoch != finished_epoch;
  }
  // The batch owns its slot from here (its release takes `mutex`: not before the unlock).
  batch.core_ = shared_from_this();
  lock.unlock();
  return batch;
}

void LoaderCore::set_epoch(int64_t new_epoch) {
  std::unique_lock lock(mutex);
  ++set_epoch_calls;  // loops under way end (Loader::Iterator)
  // Nothing delivered yet in the epoch it stands in: already there. That includes a loader
  // resumed mid-epoch, whose training loop calls set_epoch(e) before its first batch, as
  // every epoch loop does; restarting would show the resumed epoch's first samples twice.
  if (new_epoch == epoch && delivered == 0 && !failure) {
    if (end_of_epoch_pending) current_state = epoch_start_state;  // moved on explicitly: no nullopt is owed
    end_of_epoch_pending = false;
    return;
  }
  restart_locked(lock, new_epoch, 0);
}

void LoaderCore::release_slot(int s, CUstream_st* consumer_stream,
                              std::span<CUstream_st* const> other_streams) noexcept {
  Slot& slot = slots[s];
  if (options.device.is_cuda()) {
    try {
      // One event marks the slot's reuse point after the work of every stream that used the
      // batch: each stream waits for the event recorded on the one before, then records it.
      CUstream_st* last = consumer_stream;
      for (CUstream_st* stream : other_streams) {
        slot.consumed.record(last);
        slot.consumed.make_stream_wait(stream);
        last = stream;
      }
      slot.consumed.record(last);
    } catch (...) {
      // A stream the event cannot be recorded on (destroyed, or another device's): nothing
      // on the GPU can mark the end of the work on this slot, so the host waits for all of
      // the device's work before the slot can be refilled.
      cuda::synchronize_device_noexcept(options.device.index);
    }
  }
  std::lock_guard lock(mutex);
  slot.state = SlotState::Free;
  try {
    schedule_locked();
  } catch (...) {  // out of memory queueing pieces: the consumer's next() reports it
    if (!failure) failure = std::current_exception();
    slot_done.notify_all();
  }
}

LoaderState LoaderCore::state() const {
  std::lock_guard lock(mutex);
  return current_state;
}

}  // namespace detail

// ---- Loader ----

namespace {
detail::LoaderCore& live(const std::shared_ptr<detail::LoaderCore>& core) {
  MMT_CHECK(core != nullptr, ValueError, "Loader: this loader was moved from");
  if (detail::inherited_through_fork(core->made_in_generation))
    detail::throw_inherited_through_fork(
        "Loader", "Make a new Loader in this process; the Dataset it read is good here too.");
  return *core;
}

// Stops and joins the workers, or in the child of a fork lets the loader go untouched: its
// workers stayed in the parent, and one of them may hold its lock (fork_safety.h).
void stop(std::shared_ptr<detail::LoaderCore>& core) noexcept {
  if (!core) return;
  if (detail::inherited_through_fork(core->made_in_generation)) {
    detail::abandon_after_fork(new std::shared_ptr<detail::LoaderCore>(std::move(core)));
    return;
  }
  core->stop_workers();
}
}  // namespace

Loader::Loader(Dataset dataset, LoaderOptions options)
    : core_(std::make_shared<detail::LoaderCore>(std::move(dataset), std::move(options), nullptr)) {
  core_->start_workers();
}

Loader::Loader(Dataset dataset, LoaderOptions options, const LoaderState& state)
    : core_(std::make_shared<detail::LoaderCore>(std::move(dataset), std::move(options), &state)) {
  core_->start_workers();
}

Loader::Loader(Loader&&) noexcept = default;

Loader& Loader::operator=(Loader&& other) noexcept {
  if (this != &other) {
    stop(core_);
    core_ = std::move(other.core_);
  }
  return *this;
}

Loader::~Loader() { stop(core_); }

std::optional<Batch> Loader::next() { return live(core_).next(); }
std::optional<Batch> Loader::next(const std::function<void()>& poll) { return live(core_).next(&poll); }

namespace {

// The epoch Loader::epoch() reports: the one whose last batch was taken until the next is
// asked for.
int64_t epoch_locked(const detail::LoaderCore& core) {
  return core.end_of_epoch_pending ? core.epoch - 1 : core.epoch;
}

// Where a loop over the loader stands: its epoch, and the set_epoch() calls so far, read
// under one lock, as a loop asks at each step.
std::pair<int64_t, uint64_t> loop_place(detail::LoaderCore& core) {
  std::lock_guard lock(core.mutex);
  return {epoch_locked(core), core.set_epoch_calls};
}

}  // namespace

Loader::Iterator::Iterator(Loader* loader) : loader_(loader) {
  std::tie(epoch_, set_epoch_calls_) = loop_place(live(loader->core_));
  current_ = loader->next();
}

Loader::Iterator& Loader::Iterator::operator++() {
  current_.reset();  // the slot goes back before the next batch is asked for
  // Its epoch ended another way (an inner loop over the loader ran it out) or set_epoch()
  // moved the loader, to this epoch's start too: this loop is over, rather than running on
  // into the next epoch or through the restarted one.
  if (loop_place(live(loader_->core_)) != std::pair(epoch_, set_epoch_calls_)) return *this;
  current_ = loader_->next();
  return *this;
}
void Loader::set_epoch(int64_t epoch) { live(core_).set_epoch(epoch); }
LoaderState Loader::state() const { return live(core_).state(); }
const Sampler& Loader::sampler() const { return live(core_).sampler; }
const LoaderOptions& Loader::options() const { return live(core_).options; }
int Loader::ring_slots() const { return live(core_).ring.slots(); }
int64_t Loader::ring_bytes() const { return live(core_).ring.host_storage().nbytes(); }
LoaderStats Loader::stats() const {
  const detail::ReadAheadPolicy& policy = live(core_).read_ahead_policy;
  return {.batches_read_ahead = policy.batches_hinted(), .reading_ahead = policy.hinting()};
}

int64_t Loader::epoch() const {
  auto& core = live(core_);
  std::lock_guard lock(core.mutex);
  return epoch_locked(core);
}

int64_t Loader::batches_in_epoch() const {
  auto& core = live(core_);
  std::lock_guard lock(core.mutex);
  return core.end_of_epoch_pending ? core.finished_total_batches : core.total_batches;
}

}  // namespace mmt
