// Dataset::get_batch: gathers fixed fields of many records into a caller's [B, ...] buffers.
// A record's address is arithmetic on the mapping for contiguous files; for chunked ones the
// calling thread first finds every record in its chunk (one lookup per chunk, missing chunks
// decoded on every thread allowed). Then each record and field is one memcpy when both sides
// are dense in the same order (else the engine's strided copy), with software prefetch of
// records a few steps ahead, split across the shared thread pool by ranges of output rows
// when the batch is large enough to pay for it.
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <tuple>
#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu_prefetch.h"
#include "dataset_concat.h"
#include "dataset_impl.h"
#include "mmtensor/error.h"
#include "page_cache.h"
#include "streaming_copy.h"
#include "strided_copy.h"
#include "tensor_geometry.h"
#include "thread_pool.h"

namespace mmt {
namespace {

// Below this many bytes per thread, waking a helper costs more than it saves.
constexpr int64_t kMinBytesPerThread = 32 << 10;
// How many records ahead to prefetch, and how much of each (the hardware prefetcher follows
// a record once its first lines are in flight).
constexpr int64_t kPrefetchDistance = 6;
constexpr int64_t kPrefetchBytes = 2048;

// Locality 2 (prefetcht1), not 0: on an Intel Xeon VM (AVX-512, family 6 model 167) a
// prefetchnta per line stalled the gather, three times slower than no prefetch at all, where
// prefetcht0/t1 gain about 10-15% (bench/RESULTS.md, "Gather prefetch hint"). AMD Zen, where the
// non-temporal hint was first chosen, fetches t0, t1 and t2 alike.
inline void prefetch_range(const std::byte* p, int64_t nbytes) {
  detail::prefetch_bytes</*kLocality=*/2>(p, nbytes, kPrefetchBytes);
}

// Which output row batch position b is written to: b itself for get_batch, or a row of a
// larger batch when a concatenation gathers one part's records (detail::gather_parts). A
// template parameter, so the common path pays nothing for the indirection.
struct SameRows {
  int64_t operator()(int64_t b) const { return b; }
};
struct MappedRows {
  const int64_t* rows;
  int64_t operator()(int64_t b) const { return rows[b]; }
};

// One fixed field of a batch: where its value lies in a record and where its rows go.
struct FieldCopy {
  size_t field = 0;  // its position in the schema
  const FieldPlan* plan = nullptr;
  std::byte* out = nullptr;
  int64_t out_record_bytes = 0;  // out's stride along the batch dimension, in bytes
  bool memcpy_ok = false;        // out[b] has the field's strides and is dense
  bool streaming = false;        // memcpy_ok, and copied with streaming_copy (choose_streaming_stores)
  DimVector out_strides;         // out[b]'s strides, for the strided path
  detail::ByteFootprint out_footprint;  // where out's bytes lie (several fields: none may share any)

  // Copies the value that starts at `record` (a record's first byte) into row `row` of out.
  void copy_row(int64_t row, const std::byte* record) const {
    std::byte* dst = out + row * out_record_bytes;
    const std::byte* src = record + plan->offset_bytes;
    if (memcpy_ok)
      std::memcpy(dst, src, static_cast<size_t>(plan->value_bytes));
    else
      detail::copy_strided(dst, out_strides, src, plan->strides, plan->sizes, plan->element_bytes);
  }
};

// Checks that `out` can take field `field` of `batch` records; how to copy it there.
FieldCopy plan_field_copy(const Dataset::Impl& d, std::string_view field, const Tensor& out, int64_t batch) {
  const size_t f = d.schema->index_of(field);
  const FieldPlan& plan = d.plans[f];
  MMT_CHECK(plan.fixed, ValueError, "get_batch: field '", field, "' is ragged (shape ", (*d.schema)[f].shape,
            "); only fixed-shape fields can be batched here; gather ragged values with get_ragged_batch(), "
            "or read a range with ragged_column()");
  MMT_CHECK(out.defined(), ValueError, "get_batch: the output tensor for field '", field, "' is undefined");
  MMT_CHECK(!out.is_cuda(), ValueError, "get_batch: the output must be host memory (ordinary or pinned), "
            "got a tensor on ", out.device().str(), "; gather on the host, then copy with .to(device)");
  MMT_CHECK(out.dtype() == plan.dtype, ValueError, "get_batch: field '", field, "' is ", to_string(plan.dtype),
            " but the output tensor is ", to_string(out.dtype()));
  DimVector expected{batch};
  for (int64_t s : plan.sizes) expected.push_back(s);
  MMT_CHECK(out.sizes() == IntArrayRef(expected), ValueError, "get_batch: field '", field, "' of ", batch,
            " records needs an output of shape ", expected, ", got ", out.sizes());
  // As copy_(): rows written to one place would leave a batch that depends on thread timing.
  MMT_CHECK(detail::is_provably_non_overlapping(out.sizes(), out.strides()), ValueError,
            "get_batch: the output tensor for field '", field, "' has elements that may share memory (strides ",
            out.strides(), " for shape ", out.sizes(), ": they cannot be shown disjoint); clone() it, or pass a "
            "contiguous tensor");
  FieldCopy copy;
  copy.field = f;
  copy.plan = &plan;
  if (batch == 0) return copy;
  copy.out = static_cast<std::byte*>(out.mutable_data_ptr());
  copy.out_record_bytes = out.stride(0) * plan.element_bytes;
  copy.out_strides.assign(IntArrayRef(out.strides().data() + 1, out.strides().size() - 1));
  // Dense in the field's own order on both sides (size-1 dimensions' strides do not matter).
  bool same_layout = true;
  for (size_t k = 0; k < plan.sizes.size(); ++k)
    same_layout = same_layout && (plan.sizes[k] == 1 || copy.out_strides[k] == plan.strides[k]);
  copy.memcpy_ok = same_layout;
  return copy;
}

// Which of a gather's copies use streaming stores: decided for the whole gather, whose bytes
// are every field's rows (each describes output memory the caller holds: no overflow).
void choose_streaming_stores(std::span<FieldCopy> copies, int64_t batch) {
  int64_t gather_bytes = 0;
  for (const FieldCopy& copy : copies) gather_bytes += batch * copy.plan->value_bytes;
  for (FieldCopy& copy : copies)
    copy.streaming = copy.memcpy_ok && detail::use_streaming_copy(copy.plan->value_bytes, gather_bytes);
}

// "[first, last] of its storage": where an output's bytes lie, for an error message.
std::string storage_bytes(const Tensor& t) {
  const detail::Extent e = detail::element_extent(t.sizes(), t.strides());
  const int64_t element_bytes = t.element_size();
  return detail::str("[", (t.storage_offset() + e.min_offset) * element_bytes, ", ",
                     (t.storage_offset() + e.max_offset) * element_bytes + element_bytes - 1, "]");
}

// Threads write each field's rows in an unspecified order: outputs that share bytes would
// leave a batch that depends on timing. After each output alone has been checked, pairs are
// compared by footprint (O(1) a pair, no allocation): every pair for a handful of fields;
// for more (a file may hold thousands), only the pairs whose byte extents meet, found by
// sorting the outputs by their lowest byte, so that separate buffers cost O(K log K), not K^2.
void check_outputs_share_nothing(std::span<const std::string> fields, std::span<const Tensor> outs,
                                 std::span<FieldCopy> copies) {
  for (size_t j = 0; j < copies.size(); ++j) copies[j].out_footprint = detail::byte_footprint(outs[j]);
  const auto check_pair = [&](size_t k, size_t j) {
    if (k > j) std::swap(k, j);
    MMT_CHECK(detail::is_provably_disjoint(copies[k].out_footprint, copies[j].out_footprint), ValueError,
              "get_batch: the output tensors for fields '", fields[k], "' (outs[", k, "]) and '", fields[j],
              "' (outs[", j, "]) may share memory (bytes ", storage_bytes(outs[k]), " and ", storage_bytes(outs[j]),
              outs[k].is_same_storage(outs[j]) ? " of one storage" : " of storages over the same memory",
              ": they cannot be shown disjoint); pass a separate tensor for each field, or views of one buffer "
              "whose bytes do not meet (its halves, say, or its columns)");
  };
  constexpr size_t kEveryPairFields = 16;
  if (copies.size() <= kEveryPairFields) {
    for (size_t j = 0; j < copies.size(); ++j)
      for (size_t k = 0; k < j; ++k) check_pair(k, j);
    return;
  }
  thread_local std::vector<size_t> by_lowest;
  by_lowest.clear();
  for (size_t j = 0; j < copies.size(); ++j)
    if (!copies[j].out_footprint.empty) by_lowest.push_back(j);  // an empty output shares nothing
  const auto place = [&](size_t j) {
    const detail::ByteFootprint& f = copies[j].out_footprint;
    return std::tuple(f.device.type, f.device.index, f.lowest);
  };
  std::sort(by_lowest.begin(), by_lowest.end(), [&](size_t a, size_t b) { return place(a) < place(b); });
  for (size_t a = 0; a < by_lowest.size(); ++a) {
    const detail::ByteFootprint& first = copies[by_lowest[a]].out_footprint;
    for (size_t b = a + 1; b < by_lowest.size(); ++b) {
      const detail::ByteFootprint& next = copies[by_lowest[b]].out_footprint;
      if (next.device != first.device || next.lowest > first.highest) break;  // nor do those after it meet
      check_pair(by_lowest[a], by_lowest[b]);
    }
  }
}

// Sorts (record, batch position) pairs by record, keeping positions in order among equal
// records. A least-significant-digit radix sort, 8 bits a pass, over only the bits the
// records use (two passes below 65,536 records): a comparison sort of a shuffled batch
// mispredicts a branch at nearly every step, and took 8 us of a 784-byte batch's ~25 us.
// `spare` is scratch of any size.
void sort_by_record(std::vector<std::pair<int64_t, int64_t>>& pairs, std::vector<std::pair<int64_t, int64_t>>& spare) {
  const size_t n = pairs.size();
  if (n < 64) {  // the histograms would cost more than the sort
    std::sort(pairs.begin(), pairs.end());
    return;
  }
  uint64_t used_bits = 0;
  for (const auto& p : pairs) used_bits |= static_cast<uint64_t>(p.first);
  spare.resize(n);
  for (int shift = 0; shift < 64 && (used_bits >> shift) != 0; shift += 8) {
    size_t start[256] = {};
    for (const auto& p : pairs) ++start[(static_cast<uint64_t>(p.first) >> shift) & 0xff];
    if (start[(static_cast<uint64_t>(pairs[0].first) >> shift) & 0xff] == n) continue;  // one digit: no move
    size_t sum = 0;
    for (size_t& s : start) sum += std::exchange(s, sum);
    for (const auto& p : pairs) spare[start[(static_cast<uint64_t>(p.first) >> shift) & 0xff]++] = p;
    pairs.swap(spare);
  }
}

// Sorted positions [begin, end) of a batch whose records lie in `chunk`, a compressed chunk
// the cache did not hold when the batch was planned.
struct PendingRun {
  size_t begin = 0;
  size_t end = 0;
  int64_t chunk = 0;
  int64_t decoded_bytes = 0;
};

// Where each record of a chunked batch lies, worked out by the calling thread before any
// copying (see plan()). Lives in the calling thread's scratch, reused from batch to batch, so
// a steady stream of batches allocates nothing; release() drops the chunks it holds (a view's
// chunk must not outlive the call in a thread's scratch).
struct ChunkedBatchPlan {
  std::vector<const std::byte*> record_at;  // by batch position: the record's first byte
  std::vector<std::pair<int64_t, int64_t>> by_record;  // (record, batch position), sorted
  std::vector<std::pair<int64_t, int64_t>> sort_spare;
  std::vector<PendingRun> pending;
  std::vector<UntypedStorage> held;  // the chunks record_at points into; pending ones at the end
  size_t first_pending_slot = 0;     // held[first_pending_slot + k] is pending[k]'s chunk

  void release() { held.clear(); }

  // Through the chunk (the mapping, or the decoded chunk in the cache). The batch is sorted by
  // record, so each chunk it touches is looked up once however the indices are shuffled: a
  // random batch of 256 over a cached compressed file would otherwise take the cache's lock
  // 256 times, and copying threads that each look up their own chunks contend on it (two
  // threads ran slower than one). Chunks the cache does not hold are left pending for
  // decode_pending(), which decodes them on every thread the call may use.
  void plan(const Dataset::Impl& d, std::span<const int64_t> indices) {
    by_record.clear();
    for (size_t b = 0; b < indices.size(); ++b)
      by_record.emplace_back(indices[b] < 0 ? indices[b] + d.record_count : indices[b], static_cast<int64_t>(b));
    if (!std::is_sorted(by_record.begin(), by_record.end())) sort_by_record(by_record, sort_spare);
    const size_t n = by_record.size();
    record_at.resize(n);
    pending.clear();
    for (size_t k = 0; k < n;) {
      const int64_t i = by_record[k].first;
      const int64_t c = d.chunk_of(i);
      int64_t first = 0, count = 0, decoded_bytes = 0;
      const std::byte* payload = nullptr;
      if (std::optional<ChunkRef> ref = d.cached_chunk_ref(c)) {
        first = ref->first_record;
        count = ref->record_count;
        payload = ref->storage.data() + ref->payload_offset_bytes;
        held.push_back(std::move(ref->storage));
      } else {
        const format::ChunkEntry e = d.validated_entry(c);
        first = static_cast<int64_t>(e.first_record);
        count = static_cast<int64_t>(e.record_count);
        decoded_bytes = static_cast<int64_t>(e.decoded_bytes);
      }
      d.check_chunk_holds(c, first, count, i);
      // The run of positions whose records lie in this chunk (sorted: they are consecutive).
      size_t end = k + 1;
      while (end < n && by_record[end].first - first < count) ++end;
      if (payload != nullptr)
        locate_run(d, k, end, payload, first);
      else
        pending.push_back(PendingRun{k, end, c, decoded_bytes});
      k = end;
    }
    first_pending_slot = held.size();
    held.resize(held.size() + pending.size());
  }

  // Decodes pending chunk `k` (through the cache: once, however many threads want it).
  void decode_pending(const Dataset::Impl& d, size_t k) {
    const PendingRun& run = pending[k];
    ChunkRef ref = d.chunk_ref(run.chunk);
    locate_run(d, run.begin, run.end, ref.storage.data() + ref.payload_offset_bytes, ref.first_record);
    held[first_pending_slot + k] = std::move(ref.storage);
  }

  // record_at for sorted positions [begin, end), whose chunk's records start at `payload`.
  void locate_run(const Dataset::Impl& d, size_t begin, size_t end, const std::byte* payload, int64_t first) {
    for (size_t j = begin; j < end; ++j)
      record_at[static_cast<size_t>(by_record[j].second)] = payload + (by_record[j].first - first) * d.record_stride_bytes;
  }
};

// The rows one call of copy_rows copies, and the way it walks them: a thread that claims
// pieces from the back of a batch (a pool helper) walks down, one from the front (the caller)
// walks up, and each prefetches past its piece's end into the rows it will most likely claim
// next, so that its misses keep overlapping from one piece to the next. (Each piece used to
// start cold, waiting for its first record: two-thread 784-byte gathers ran each thread at
// 75% of its one-thread speed, where a plain two-thread loop keeps 85%.) `batch` bounds the
// prefetches; rows a thread prefetches and another copies are merely read twice.
struct RowRange {
  int64_t lo = 0, hi = 0;
  bool downward = false;
  int64_t batch = 0;
};

// Rows [lo, hi) of every field, prefetching a few records ahead; record_at(b) is row b's
// record's first byte. Both kinds of file copy by ranges of output rows, so each thread
// writes its own rows (copying chunked batches in record order had two threads writing
// neighbouring rows of the output, and sharing its cache lines).
//
// Kept out of line, and called from inside the guard: in a function that calls sigsetjmp (the
// guard), every variable live across it stays in memory, and this loop reloaded its bounds,
// addresses and counter from the stack around each memcpy.
template <typename RecordAt, typename RowOf>
[[gnu::noinline]] void copy_rows_unguarded(std::span<const FieldCopy> fields, const RowRange rows,
                                           const RecordAt record_at, const RowOf row_of) {
  const int64_t lo = rows.lo, hi = rows.hi, batch = rows.batch;
  const int64_t step = rows.downward ? -1 : 1;
  const int64_t first = rows.downward ? hi - 1 : lo, end = rows.downward ? lo - 1 : hi;
  const auto prefetch_ahead = [&](int64_t b, int64_t offset, int64_t value_bytes) {
    const int64_t ahead = b + step * kPrefetchDistance;
    if (ahead >= 0 && ahead < batch) prefetch_range(record_at(ahead) + offset, value_bytes);
  };
  for (const FieldCopy& field : fields) {
    const int64_t offset = field.plan->offset_bytes, value_bytes = field.plan->value_bytes;
    // The first rows too, so that their misses overlap rather than come one after another
    // (a no-op where the previous piece's walk already prefetched them).
    for (int64_t b = first, k = 0; b != end && k < kPrefetchDistance; b += step, ++k)
      prefetch_range(record_at(b) + offset, value_bytes);
    if (!field.memcpy_ok) {
      for (int64_t b = first; b != end; b += step) {
        prefetch_ahead(b, offset, value_bytes);
        field.copy_row(row_of(b), record_at(b));
      }
      continue;
    }
    std::byte* const out = field.out;
    const int64_t out_record_bytes = field.out_record_bytes;
    if (field.streaming) {
      for (int64_t b = first; b != end; b += step) {
        prefetch_ahead(b, offset, value_bytes);
        detail::streaming_copy(out + row_of(b) * out_record_bytes, record_at(b) + offset,
                               static_cast<size_t>(value_bytes));
      }
      continue;  // fenced by the caller (FenceStreamingCopies)
    }
    for (int64_t b = first; b != end; b += step) {
      prefetch_ahead(b, offset, value_bytes);
      std::memcpy(out + row_of(b) * out_record_bytes, record_at(b) + offset, static_cast<size_t>(value_bytes));
    }
  }
}

// Fences the calling thread's streaming copies when it goes, on every way out: before the
// pool or the loader hands the rows on, and after a fault too. Made outside a guarded
// section, where a fault's jump would skip its destructor.
class FenceStreamingCopies {
 public:
  explicit FenceStreamingCopies(std::span<const FieldCopy> fields)
      : any_(std::any_of(fields.begin(), fields.end(), [](const FieldCopy& f) { return f.streaming; })) {}
  ~FenceStreamingCopies() {
    if (any_) detail::streaming_copy_fence();
  }
  FenceStreamingCopies(const FenceStreamingCopies&) = delete;
  FenceStreamingCopies& operator=(const FenceStreamingCopies&) = delete;

 private:
  bool any_;
};

template <typename RecordAt, typename RowOf>
void copy_rows(const Dataset::Impl& d, std::span<const FieldCopy> fields, const RowRange rows,
               const RecordAt& record_at, const RowOf& row_of) {
  const FenceStreamingCopies fence(fields);
  // The records may lie in the mapping: a file truncated under us fails with IoError.
  d.guarded([&] { copy_rows_unguarded(fields, rows, record_at, row_of); });
}

// The first row of piece `piece` of `pieces` over `batch` rows (pieces <= batch). Pieces
// shrink toward the middle of the batch (55 40 24 9 8 25 39 56 rows for 8 pieces of 256),
// where the threads walking from either end meet: the last pieces claimed are small, so a
// thread that finishes early waits for at most a small piece of the other's. (With equal
// pieces the caller waited half a large one on average: 13% of a two-thread 784-byte batch.)
// Each piece has at least one row, so a few large records still split evenly.
int64_t piece_start(int64_t batch, int64_t pieces, int64_t piece) {
  const __int128 t = 2 * piece - pieces, p2 = __int128{pieces} * pieces;
  const __int128 shaped_rows = batch - pieces;  // shared out by the curve, beyond one row each
  return piece + static_cast<int64_t>(shaped_rows * (p2 + t * (t < 0 ? -t : t)) / (2 * p2));
}

// Runs copy(RowRange) over the batch's rows, split across up to `threads` threads when the
// bytes are enough to pay for waking a helper.
template <typename Copy>
void split_rows(int64_t batch, int64_t record_bytes, int threads, const Copy& copy) {
  const int parts = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(threads, batch * record_bytes / kMinBytesPerThread), 1, batch));
  if (parts == 1) {
    copy(RowRange{0, batch, false, batch});
    return;
  }
  // More pieces than threads, claimed in turn: a helper that wakes late takes fewer pieces
  // instead of leaving the caller waiting for its half. The caller claims from the front and
  // helpers from the back (ThreadPool::parallel_for), which is the way each walks.
  // What a helper reads first lies in one place: a closure of one pointer fits inside the
  // std::function (no allocation), and the helper follows fewer lines the caller just wrote
  // (each a cross-core miss of ~250 ns here, one after another).
  const struct Split {
    int64_t batch, pieces;
    const Copy* copy;
    pthread_t caller;
  } split{batch, std::min<int64_t>(batch, 4 * parts), &copy, ::pthread_self()};
  detail::ThreadPool::shared().parallel_for(split.pieces, parts, [s = &split](int64_t piece) {
    const bool helper = !::pthread_equal(::pthread_self(), s->caller);
    (*s->copy)(RowRange{piece_start(s->batch, s->pieces, piece), piece_start(s->batch, s->pieces, piece + 1), helper,
                        s->batch});
  });
}

// fn(0) .. fn(n - 1), on up to `threads` threads: the shared pool only when there is more
// than one of each (a single-threaded reader starts no thread).
template <typename Fn>
void for_each_on_threads(int64_t n, int threads, const Fn& fn) {
  if (threads > 1 && n > 1)
    detail::ThreadPool::shared().parallel_for(n, threads, fn);
  else
    for (int64_t k = 0; k < n; ++k) fn(k);
}

// Sorted positions [begin, end) of a planned batch, each to its row: the rows are scattered
// (record order), so this is for batches copied in groups, not the common path.
template <typename RowOf>
void copy_positions(const Dataset::Impl& d, std::span<const FieldCopy> fields, const ChunkedBatchPlan& plan,
                    size_t begin, size_t end, const RowOf& row_of) {
  if (begin == end) return;
  d.guarded([&] {
    for (const FieldCopy& field : fields)
      for (size_t j = begin; j < end; ++j) {
        const auto b = static_cast<size_t>(plan.by_record[j].second);
        field.copy_row(row_of(static_cast<int64_t>(b)), plan.record_at[b]);
      }
  });
}

// A batch whose chunks to decode exceed `hold_limit` bytes: the records of cached chunks are
// copied first, then the pending chunks in groups of at most `hold_limit` bytes (or one
// chunk), each group decoded (decode(begin, end) over pending indices), copied and let go.
template <typename Decode, typename RowOf>
void copy_in_bounded_groups(const Dataset::Impl& d, std::span<const FieldCopy> fields, ChunkedBatchPlan& plan,
                            int64_t hold_limit, int threads, const Decode& decode, const RowOf& row_of) {
  size_t cursor = 0;  // positions between pending runs lie in cached chunks, located already
  for (const PendingRun& run : plan.pending) {
    copy_positions(d, fields, plan, cursor, run.begin, row_of);
    cursor = run.end;
  }
  copy_positions(d, fields, plan, cursor, plan.by_record.size(), row_of);
  for (size_t k = 0; k < plan.first_pending_slot; ++k) plan.held[k] = UntypedStorage();  // copied: let go
  for (size_t group = 0; group < plan.pending.size();) {
    size_t group_end = group + 1;
    int64_t bytes = plan.pending[group].decoded_bytes;
    while (group_end < plan.pending.size() && bytes + plan.pending[group_end].decoded_bytes <= hold_limit)
      bytes += plan.pending[group_end++].decoded_bytes;
    decode(group, group_end);
    // Each run is its own records, so its own rows: runs copy on every thread allowed.
    for_each_on_threads(static_cast<int64_t>(group_end - group), threads, [&](int64_t k) {
      const PendingRun& run = plan.pending[group + static_cast<size_t>(k)];
      copy_positions(d, fields, plan, run.begin, run.end, row_of);
    });
    for (size_t k = group; k < group_end; ++k) plan.held[plan.first_pending_slot + k] = UntypedStorage();  // let go
    group = group_end;
  }
}

// IndexError naming the first index out of range. One branch-free pass (an out-of-line
// check per index cost up to 1 us of a ~8 us 784-byte batch); the first bad index is then
// named by normalize_index.
void check_indices(const Dataset::Impl& d, std::span<const int64_t> indices) {
  const uint64_t records = static_cast<uint64_t>(d.record_count);
  bool any_out_of_range = false;
  for (int64_t index : indices)
    any_out_of_range |= static_cast<uint64_t>(index < 0 ? index + d.record_count : index) >= records;
  if (any_out_of_range) [[unlikely]]
    for (int64_t index : indices) d.normalize_index(index, "get_batch");
}

template <typename RowOf>
void gather(const Dataset::Impl& d, std::span<const int64_t> indices, std::span<const FieldCopy> fields,
            int threads, const RowOf& row_of) {
  const int64_t batch = static_cast<int64_t>(indices.size());
  if (batch == 0 || fields.empty()) return;
  check_indices(d, indices);  // before writing anything
  int64_t record_bytes = 0;
  for (const FieldCopy& f : fields) record_bytes += f.plan->value_bytes;

  if (d.contiguous) {
    // Uncompressed back-to-back chunks: a record's address is arithmetic on the mapping, done
    // by the copying threads themselves (a list of addresses made first by the calling thread
    // cost the two-thread 784-byte gather 8%).
    if (!d.all_chunks_validated())
      for (int64_t index : indices) d.ensure_validated(d.normalize_index(index, "get_batch") / d.records_per_chunk);
    // Captured by value, and copy_rows_unguarded takes its own copy: each copying thread then
    // keeps them in registers rather than reading the calling thread's stack for every row.
    const std::byte* data = d.base + d.data_offset;
    const int64_t stride = d.record_stride_bytes, count = d.record_count;
    const int64_t* const index_at = indices.data();
    const auto record_at = [data, stride, count, index_at](int64_t b) {
      const int64_t index = index_at[b];
      return data + (index < 0 ? index + count : index) * stride;
    };
    split_rows(batch, record_bytes, threads,
               [&](const RowRange rows) { copy_rows(d, fields, rows, record_at, row_of); });
    return;
  }

  thread_local ChunkedBatchPlan scratch;
  // The lambdas below run on pool threads too: they must reach this thread's plan through a
  // reference, since naming a thread_local there names the running thread's own.
  ChunkedBatchPlan& plan = scratch;
  struct ReleasePlan {
    ChunkedBatchPlan& plan;
    ~ReleasePlan() { plan.release(); }
  } release_plan{plan};
  plan.plan(d, indices);
  // Decoding a chunk takes far longer than waking a helper: worth every thread allowed.
  // (One thread never touches the shared pool, so a single-threaded reader starts no thread.)
  auto decode = [&](size_t begin, size_t end) {
    for_each_on_threads(static_cast<int64_t>(end - begin), threads,
                        [&](int64_t k) { plan.decode_pending(d, begin + static_cast<size_t>(k)); });
  };
  // The decoded chunks a call holds at once are bounded, whatever the batch: a random batch
  // of B records over a compressed file touches up to B chunks, which would all be held until
  // the copy (B x the chunk size, past the cache budget). Past a quarter of the budget, the
  // chunks are decoded in groups, each copied out and let go before the next.
  const int64_t hold_limit = detail::decode_hold_limit_bytes(d.cache->budget_bytes());
  int64_t pending_bytes = 0;
  for (const PendingRun& run : plan.pending) pending_bytes += run.decoded_bytes;
  if (pending_bytes > hold_limit && plan.pending.size() > 1) {
    copy_in_bounded_groups(d, fields, plan, hold_limit, threads, decode, row_of);
    return;
  }
  decode(0, plan.pending.size());
  const std::byte* const* addresses = plan.record_at.data();
  const auto record_at = [addresses](int64_t b) { return addresses[b]; };
  split_rows(batch, record_bytes, threads,
             [&](const RowRange rows) { copy_rows(d, fields, rows, record_at, row_of); });
}

// The schema positions of a batch's fields, in per-thread scratch.
std::span<const size_t> field_positions(std::span<const FieldCopy> fields) {
  thread_local std::vector<size_t> positions;
  positions.clear();
  for (const FieldCopy& f : fields) positions.push_back(f.field);
  return positions;
}

// Runs prefetch() (a hint to the kernel) and returns what it made the kernel read: -1 when
// not `measured`, or where the kernel does not say. A hint never changes what a gather
// returns: whatever fails here (a bad index, a damaged chunk entry) the gather reports.
template <typename Prefetch>
int64_t hint_and_measure(bool measured, const Prefetch& prefetch) noexcept {
  try {
    if (!measured || !detail::thread_storage_read_bytes_known()) {
      prefetch();
      return -1;
    }
    return detail::thread_storage_read_by(prefetch);
  } catch (...) {
    return -1;
  }
}

// A few of the batch's records (eight, spread over it): what Auto hints to find out whether a
// batch is cold where mincore() would not tell. About 15 us.
struct HintSample {
  static constexpr size_t kRecords = 8;
  std::array<int64_t, kRecords> indices{};
  size_t size = 0;
  explicit HintSample(std::span<const int64_t> batch) : size(std::min(kRecords, batch.size())) {
    for (size_t k = 0; k < size; ++k) indices[k] = batch[k * batch.size() / size];
  }
  std::span<const int64_t> records() const { return {indices.data(), size}; }
  // What prefetch() of the sample made the kernel read; -1, and no hint, where the kernel
  // does not say (the hint would tell nothing, and cost as much).
  template <typename Prefetch>
  int64_t measured(const Prefetch& prefetch) const noexcept {
    return detail::thread_storage_read_bytes_known() ? hint_and_measure(true, prefetch) : -1;
  }
};

// The major page faults a gather on `threads` threads is charged with: the calling thread's,
// or the process's when pool threads copy too.
int64_t major_faults(int threads) {
  return threads > 1 ? detail::process_major_faults() : detail::thread_major_faults();
}

// Per thread (faults and read bytes are counted per thread), the datasets whose last gather
// here was slow, and how slow: their next batch is checked. A few at once, so that datasets
// read in turn on one thread do not erase each other's marks.
struct SlowGatherMark {
  uint64_t dataset = 0;  // an instance_id (Dataset::Impl::new_instance_id); 0: free
  std::chrono::nanoseconds took{0};
};
constexpr size_t kSlowGatherMarks = 8;
thread_local std::array<SlowGatherMark, kSlowGatherMarks> slow_gather_marks;
thread_local size_t next_mark_to_replace = 0;

void mark_slow_gather(uint64_t dataset, std::chrono::nanoseconds took) {
  SlowGatherMark* slot = nullptr;
  for (SlowGatherMark& mark : slow_gather_marks)
    if (mark.dataset == dataset || (slot == nullptr && mark.dataset == 0)) slot = &mark;
  if (slot == nullptr) slot = &slow_gather_marks[next_mark_to_replace++ % kSlowGatherMarks];
  *slot = {dataset, took};
}

// Whether `dataset` has a mark here; takes it.
bool take_slow_gather_mark(uint64_t dataset, std::chrono::nanoseconds& took) {
  for (SlowGatherMark& mark : slow_gather_marks)
    if (mark.dataset == dataset) {
      took = mark.took;
      mark.dataset = 0;
      return true;
    }
  return false;
}

using detail::kSlowGather;  // read_ahead.h: when the next batch of a dataset on the thread is checked
using detail::kSlowGatherForSample;

// Per thread: the major page faults counted at its last slow gather (of any dataset), the
// thread's own [0] and the process's [1] (a gather with pool threads); -1: none yet.
thread_local std::array<int64_t, 2> faults_at_last_slow_gather = {-1, -1};

// Whether a gather on `threads` threads that took `took` may have waited for the disk: it
// was slow, and major faults were taken since this thread's last slow gather (read_ahead.h:
// a warm gather may be slow too). Unsure (the first time, or no count): yes. One getrusage,
// for slow gathers only.
bool gather_may_have_read_disk(std::chrono::nanoseconds took, int threads) {
  if (took < kSlowGather) return false;
  const int64_t now = major_faults(threads);
  int64_t& before = faults_at_last_slow_gather[threads > 1 ? 1 : 0];
  const bool faulted = now < 0 || before < 0 || now > before;
  before = now;
  return faulted;
}

// What get_batch's read-ahead (read_ahead_gather) asks of what it gathers from: one file
// (FileBatch), or shards read as one (ShardsBatch). Each gives
//   policy(), instance_id(), first_batch_unchecked(): the reader's read-ahead state;
//   reads_nothing(): no field asked for;
//   dense(indices): detail::records_are_dense in its layout;
//   mincore_tells(): whether mincore() tells this user about the page cache of every file;
//   looks_cold(indices): mincore() of a few of the batch's records (where it tells);
//   read_by_sample_hint(indices): a HintSample hinted, and what that read (-1: unknown);
//   read_by_hint(indices): the batch hinted, counted as a hint, and what that read (-1:
//     unknown, or not measured outside Auto);
//   gather(indices, threads).
template <typename RowOf>
struct FileBatch {
  const Dataset::Impl& d;
  std::span<const FieldCopy> fields;
  const RowOf& row_of;

  detail::ReadAheadPolicy& policy() const { return *d.read_ahead; }
  uint64_t instance_id() const { return d.instance_id; }
  std::atomic<bool>& first_batch_unchecked() const { return d.first_batch_unchecked; }
  bool reads_nothing() const { return fields.empty(); }
  bool dense(std::span<const int64_t> indices) const {
    return detail::records_are_dense(indices, d.record_count, d.record_stride_bytes);
  }
  bool mincore_tells() const { return d.mincore_reports_page_cache; }
  bool looks_cold(std::span<const int64_t> indices) const { return d.batch_looks_cold(indices, field_positions(fields)); }
  int64_t read_by_sample_hint(std::span<const int64_t> indices) const {
    const HintSample sample(indices);
    return sample.measured([&] { d.prefetch(sample.records(), field_positions(fields)); });
  }
  int64_t read_by_hint(std::span<const int64_t> indices) const {
    policy().count_hint();
    return hint_and_measure(policy().mode() == ReadAhead::Auto, [&] { d.prefetch(indices, field_positions(fields)); });
  }
  void gather(std::span<const int64_t> indices, int threads) const { mmt::gather(d, indices, fields, threads, row_of); }
};

struct ShardsBatch {
  const Dataset::Concat& c;
  std::span<const std::string> fields;
  std::span<const Tensor> outs;

  detail::ReadAheadPolicy& policy() const { return *c.read_ahead; }
  uint64_t instance_id() const { return c.instance_id; }
  std::atomic<bool>& first_batch_unchecked() const { return c.first_batch_unchecked; }
  bool reads_nothing() const { return fields.empty(); }
  bool dense(std::span<const int64_t> indices) const {
    return detail::records_are_dense(indices, c.size(), c.layout().record_stride_bytes);
  }
  bool mincore_tells() const { return c.mincore_reports_page_cache; }
  bool looks_cold(std::span<const int64_t> indices) const { return c.sample_looks_cold(indices, fields); }
  int64_t read_by_sample_hint(std::span<const int64_t> indices) const {
    const HintSample sample(indices);
    return sample.measured([&] { c.prefetch(sample.records(), fields, /*every_field=*/false); });
  }
  int64_t read_by_hint(std::span<const int64_t> indices) const {
    policy().count_hint();
    return hint_and_measure(policy().mode() == ReadAhead::Auto,
                            [&] { c.prefetch(indices, fields, /*every_field=*/false); });
  }
  // Records of parts with other layouts are in no one run: part by part.
  void gather(std::span<const int64_t> indices, int threads) const {
    if (c.contiguous) return c.gather_records_at(indices, fields, outs, threads);
    c.gather_part_by_part(indices, fields, outs, threads);
  }
};

// batch.gather(), with the batch hinted first when ReaderOptions::read_ahead says so.
template <typename Batch>
void read_ahead_gather(const Batch& batch, std::span<const int64_t> indices, int threads) {
  MMT_CHECK(threads >= 1, ValueError, "get_batch: threads must be >= 1 (the calling thread counts as one), got ",
            threads);
  detail::ReadAheadPolicy& policy = batch.policy();
  if (indices.size() < 2 || batch.reads_nothing() || policy.mode() == ReadAhead::Never ||
      detail::ReadAheadPolicy::DatasetHintsOff::active())
    return batch.gather(indices, threads);
  if (policy.mode() == ReadAhead::Always) {
    batch.read_by_hint(indices);
    return batch.gather(indices, threads);
  }
  // Auto. Whether this dataset's last gather on this thread was slow, and how slow.
  std::chrono::nanoseconds slow_gather_took{0};
  const uint64_t id = batch.instance_id();
  const bool after_slow = take_slow_gather_mark(id, slow_gather_took);
  std::atomic<bool>& unchecked = batch.first_batch_unchecked();
  const bool first = unchecked.load(std::memory_order_relaxed) && unchecked.exchange(false, std::memory_order_relaxed);
  const auto timed_gather = [&] {
    const auto start = std::chrono::steady_clock::now();
    batch.gather(indices, threads);
    const auto took = std::chrono::steady_clock::now() - start;
    if (gather_may_have_read_disk(took, threads)) mark_slow_gather(id, took);
  };
  if (!policy.hinting() && !first && !after_slow) return timed_gather();  // warm lately: nothing to check
  if (batch.dense(indices)) return timed_gather();  // the kernel's to read ahead
  const bool mincore_tells = batch.mincore_tells();
  if (!policy.hinting()) {  // the page cache has not missed lately: is this batch cold?
    int64_t faults_before = -1;
    bool cold = false;
    if (mincore_tells) {
      policy.count_check();  // first || after_slow, or the early return above was taken
      cold = batch.looks_cold(indices);
    } else if (first || (after_slow && slow_gather_took >= kSlowGatherForSample)) {
      policy.count_check();
      const int64_t read = batch.read_by_sample_hint(indices);
      cold = read > 0;
      // Without read_bytes: the gather's major faults tell, for the next batch (pool threads
      // fault too when there are several).
      if (read < 0) faults_before = major_faults(threads);
    }
    if (cold) policy.note_gather_faults(1);
    if (!policy.hinting()) {
      timed_gather();
      if (faults_before >= 0) policy.note_gather_faults(major_faults(threads) - faults_before);
      return;
    }
  }
  // Without read_bytes, what the hint found is told by mincore before it, where mincore
  // tells, else by the gather's major faults after it.
  const bool read_bytes_known = detail::thread_storage_read_bytes_known();
  const bool looked_cold = !read_bytes_known && mincore_tells && batch.looks_cold(indices);
  const int64_t read = batch.read_by_hint(indices);
  const int64_t faults_before = read < 0 && !mincore_tells ? major_faults(threads) : -1;
  batch.gather(indices, threads);
  if (read >= 0) policy.note_hint_found_cold(read > 0);
  else if (mincore_tells) policy.note_hint_found_cold(looked_cold);
  else policy.note_hint_found_cold(faults_before >= 0 && major_faults(threads) > faults_before);
  if (!policy.hinting()) mark_slow_gather(id, kSlowGatherForSample);  // hints just stopped: check the next batch
}

// One file's gather, hinted first as ReaderOptions::read_ahead says.
template <typename RowOf = SameRows>
void gather_reading_ahead(const Dataset::Impl& d, std::span<const int64_t> indices, std::span<const FieldCopy> fields,
                          int threads, const RowOf& row_of = {}) {
  read_ahead_gather(FileBatch<RowOf>{d, fields, row_of}, indices, threads);
}

// The copies for fields `fields` into `outs` of `batch` rows, each checked, and checked to
// share no memory with each other; in the calling thread's scratch.
std::span<const FieldCopy> plan_copies(const Dataset::Impl& d, std::span<const std::string> fields,
                                       std::span<const Tensor> outs, int64_t batch) {
  MMT_CHECK(fields.size() == outs.size(), ValueError, "get_batch: ", fields.size(), " fields but ", outs.size(),
            " output tensors; pass one output per field");
  thread_local std::vector<FieldCopy> copies;
  copies.clear();
  for (size_t k = 0; k < fields.size(); ++k) copies.push_back(plan_field_copy(d, fields[k], outs[k], batch));
  check_outputs_share_nothing(fields, outs, copies);
  choose_streaming_stores(copies, batch);
  return copies;
}

}  // namespace

void detail::gather_parts(std::span<const PartRows> parts, int64_t batch, std::span<const std::string> fields,
                          std::span<const Tensor> outs, int threads) {
  // Planned once: the parts' schemas are equal, so are their record layouts and plans.
  const std::span<const FieldCopy> copies = plan_copies(*parts[0].part, fields, outs, batch);
  // Parts side by side, one thread each, when there are parts enough for the threads, none
  // holds most of the batch (a shuffled batch over many shards), and the batch pays for
  // waking helpers; else one after another, each split across the threads as a single file's
  // batch is. Small records from many shards would otherwise leave each part's share too
  // small to split.
  int64_t record_bytes = 0, largest = 0;
  for (const FieldCopy& f : copies) record_bytes += f.plan->value_bytes;
  for (const PartRows& p : parts) largest = std::max<int64_t>(largest, static_cast<int64_t>(p.indices.size()));
  const bool side_by_side = threads > 1 && parts.size() >= static_cast<size_t>(threads) && 4 * largest <= 3 * batch &&
                            batch * record_bytes >= 2 * kMinBytesPerThread;
  if (side_by_side) {
    // The calling thread's "hints off" (a loader hinting its batches itself) holds on the
    // pool's threads too.
    const bool hints_off = detail::ReadAheadPolicy::DatasetHintsOff::active();
    detail::ThreadPool::shared().parallel_for(static_cast<int64_t>(parts.size()), threads, [&](int64_t k) {
      const PartRows& p = parts[static_cast<size_t>(k)];
      std::optional<detail::ReadAheadPolicy::DatasetHintsOff> off;
      if (hints_off) off.emplace();
      gather_reading_ahead(*p.part, p.indices, copies, 1, MappedRows{p.rows});
    });
    return;
  }
  for (const PartRows& p : parts) gather_reading_ahead(*p.part, p.indices, copies, threads, MappedRows{p.rows});
}

bool detail::records_are_dense(std::span<const int64_t> indices, int64_t record_count, int64_t record_stride_bytes) {
  uint64_t lowest = UINT64_MAX, highest = 0;
  for (int64_t index : indices) {
    const uint64_t i = static_cast<uint64_t>(index < 0 ? index + record_count : index);  // bad ones: the gather's to report
    lowest = std::min(lowest, i);
    highest = std::max(highest, i);
  }
  const auto page = static_cast<uint64_t>(detail::page_bytes());
  const uint64_t stride = static_cast<uint64_t>(std::max<int64_t>(record_stride_bytes, 1));
  const uint64_t pages_alone = 2 * indices.size() * ((stride + page - 1) / page);
  const uint64_t span = highest - lowest + 1;  // records; huge for a bad index (not dense)
  return span <= pages_alone * page / stride;
}

void detail::gather_shards_reading_ahead(const Dataset::Concat& c, std::span<const int64_t> indices,
                                         std::span<const std::string> fields, std::span<const Tensor> outs,
                                         int threads) {
  read_ahead_gather(ShardsBatch{c, fields, outs}, indices, threads);
}

void detail::gather_records(const Dataset::Impl& layout, std::span<const int64_t> indices,
                            const ContiguousParts& parts, const GuardedRegions& regions,
                            std::span<const std::string> fields, std::span<const Tensor> outs, int threads) {
  const int64_t batch = static_cast<int64_t>(indices.size());
  const std::span<const FieldCopy> copies = plan_copies(layout, fields, outs, batch);
  if (batch == 0 || copies.empty()) return;
  int64_t record_bytes = 0;
  for (const FieldCopy& f : copies) record_bytes += f.plan->value_bytes;
  // Captured by value, as the single-file path does: each copying thread keeps them in
  // registers. The shard is looked up for each address the copy needs, not once per row
  // ahead of it: the lookups then run while earlier rows' lines are in flight, where a
  // first pass over the rows made the batch slower (bench/RESULTS.md, "Gather prefetch hint").
  const int64_t* const index_at = indices.data();
  const auto record_at = [index_at, parts](int64_t b) { return parts.record(index_at[b]); };
  split_rows(batch, record_bytes, threads, [&](const RowRange rows) {
    const FenceStreamingCopies fence(copies);
    guard_mapped_reads(regions.regions, regions.lowest, regions.end,
                       [&] { copy_rows_unguarded(copies, rows, record_at, SameRows{}); });
  });
}

void Dataset::get_batch(std::span<const int64_t> indices, std::string_view field, const Tensor& out,
                        int threads) const {
  if (concat_) {
    const std::string name(field);
    return concat_->get_batch(indices, std::span<const std::string>(&name, 1), std::span<const Tensor>(&out, 1),
                              threads);
  }
  const Impl& d = checked_impl(impl_);
  FieldCopy copy = plan_field_copy(d, field, out, static_cast<int64_t>(indices.size()));
  choose_streaming_stores(std::span<FieldCopy>(&copy, 1), static_cast<int64_t>(indices.size()));
  gather_reading_ahead(d, indices, std::span<const FieldCopy>(&copy, 1), threads);
}

void Dataset::get_batch(std::span<const int64_t> indices, std::span<const std::string> fields,
                        std::span<const Tensor> outs, int threads) const {
  if (concat_) return concat_->get_batch(indices, fields, outs, threads);
  const Impl& d = checked_impl(impl_);
  gather_reading_ahead(d, indices, plan_copies(d, fields, outs, static_cast<int64_t>(indices.size())), threads);
}

Tensor Dataset::get_batch(std::span<const int64_t> indices, std::string_view field, int threads) const {
  // A concatenation's parts share one schema, so the first part plans the output.
  const Impl& d = concat_ ? checked_impl(concat_->parts[0].impl_) : checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const FieldPlan& plan = d.plans[f];
  // A bad index is an IndexError before the batch is allocated (on an empty dataset, say,
  // whose schema may describe values of any size).
  if (concat_)
    for (int64_t index : indices) concat_->normalize_index(index, "get_batch");
  else
    check_indices(d, indices);
  DimVector sizes{static_cast<int64_t>(indices.size())};
  for (int64_t s : plan.sizes) sizes.push_back(s);
  // Keep the field's storage order (a channels-last field gives a channels-last batch).
  DimVector strides{plan.fixed ? plan.value_bytes / plan.element_bytes : 0};
  for (int64_t s : plan.strides) strides.push_back(s);
  Tensor out = plan.fixed ? empty_strided(sizes, strides, plan.dtype) : Tensor();
  get_batch(indices, field, out, threads);
  return out;
}

}  // namespace mmt
