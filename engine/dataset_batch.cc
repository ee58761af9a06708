// Dataset::get_batch: gathers one fixed field of many records into a caller's [B, ...] buffer.
// Per record it is one memcpy when both sides are dense in the same order (else the engine's
// strided copy), with software prefetch of records a few steps ahead, split across the shared
// thread pool when the batch is large enough to pay for it.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "dataset_impl.h"
#include "mmtensor/error.h"
#include "strided_copy.h"
#include "thread_pool.h"

namespace mmt {
namespace {

// Below this many bytes per thread, waking a helper costs more than it saves.
constexpr int64_t kMinBytesPerThread = 32 << 10;
// How many records ahead to prefetch, and how much of each (the hardware prefetcher follows
// a record once its first lines are in flight).
constexpr int64_t kPrefetchDistance = 6;
constexpr int64_t kPrefetchBytes = 2048;

inline void prefetch_range(const std::byte* p, int64_t nbytes) {
  const int64_t n = std::min(nbytes, kPrefetchBytes);
  for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 0, 0);
}

struct BatchPlan {
  const Dataset::Impl* d = nullptr;
  const FieldPlan* plan = nullptr;
  std::span<const int64_t> indices;
  std::byte* out = nullptr;
  int64_t out_record_bytes = 0;  // out's stride along the batch dimension, in bytes
  bool memcpy_ok = false;        // out[b] has the field's strides and is dense
  DimVector out_strides;         // out[b]'s strides, for the strided path

  void copy_one(std::byte* dst, const std::byte* src) const {
    if (memcpy_ok)
      std::memcpy(dst, src, static_cast<size_t>(plan->value_bytes));
    else
      detail::copy_strided(dst, out_strides, src, plan->strides, plan->sizes, plan->element_bytes);
  }

  // Uncompressed back-to-back chunks: a record's address is arithmetic on the mapping.
  void gather_contiguous(int64_t lo, int64_t hi) const {
    const std::byte* data = d->base + d->data_offset + plan->offset_bytes;
    const int64_t stride = d->record_stride_bytes;
    const bool check_chunks = !d->all_chunks_validated();
    d->guarded([&] {
      for (int64_t b = lo; b < hi; ++b) {
        if (b + kPrefetchDistance < hi) prefetch_range(data + record_at(b + kPrefetchDistance) * stride, plan->value_bytes);
        const int64_t i = record_at(b);
        if (check_chunks) d->ensure_validated(i / d->records_per_chunk);
        copy_one(out + b * out_record_bytes, data + i * stride);
      }
    });
  }

  // indices[b] as a record index; get_batch checked every index before gathering.
  int64_t record_at(int64_t b) const {
    const int64_t index = indices[static_cast<size_t>(b)];
    return index < 0 ? index + d->record_count : index;
  }

  // Anything else: through the chunk (mapping or decoded cache entry). The batch's positions
  // are visited in record order, so each chunk is looked up once per batch however the
  // indices are shuffled: a random batch of 256 over a cached compressed file would otherwise
  // take the cache's lock 256 times (and contend on it with every other reading thread).
  // `by_record` holds (record, batch position) pairs sorted by record.
  void gather_chunked(std::span<const std::pair<int64_t, int64_t>> by_record) const {
    const size_t n = by_record.size();
    ChunkRef ref;
    for (size_t k = 0; k < n;) {
      const int64_t i = by_record[k].first;
      if (ref.index < 0 || i < ref.first_record || i - ref.first_record >= ref.record_count) {
        ref = d->chunk_ref(d->chunk_of(i));
        MMT_CHECK(i >= ref.first_record && i - ref.first_record < ref.record_count, FormatError, d->path,
                  ": the chunk table is not ordered: record ", i, " is not in chunk ", ref.index);
      }
      // The run of positions whose records lie in this chunk (sorted: they are consecutive).
      size_t run_end = k + 1;
      while (run_end < n && by_record[run_end].first - ref.first_record < ref.record_count) ++run_end;
      const std::byte* chunk = ref.storage.data() + ref.payload_offset_bytes + plan->offset_bytes;
      const std::pair<int64_t, int64_t>* run = by_record.data();
      auto copy_run = [&] {
        for (size_t j = k; j < run_end; ++j)
          copy_one(out + run[j].second * out_record_bytes,
                   chunk + (run[j].first - ref.first_record) * d->record_stride_bytes);
      };
      if (ref.storage.is_same(d->file))
        d->guarded(copy_run);
      else
        copy_run();
      k = run_end;
    }
  }

  // The batch's (record, position) pairs in record order, in the calling thread's scratch.
  std::span<const std::pair<int64_t, int64_t>> sorted_by_record() const {
    thread_local std::vector<std::pair<int64_t, int64_t>> by_record;
    by_record.clear();
    for (int64_t b = 0; b < static_cast<int64_t>(indices.size()); ++b) by_record.emplace_back(record_at(b), b);
    if (!std::is_sorted(by_record.begin(), by_record.end())) std::sort(by_record.begin(), by_record.end());
    return by_record;
  }
};

}  // namespace

void Dataset::get_batch(std::span<const int64_t> indices, std::string_view field, const Tensor& out,
                        int threads) const {
  const Impl& d = checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const FieldPlan& plan = d.plans[f];
  MMT_CHECK(plan.fixed, ValueError, "get_batch: field '", field, "' is ragged (shape ", (*d.schema)[f].shape,
            "); only fixed-shape fields can be batched; read ragged values with get()");
  MMT_CHECK(out.defined(), ValueError, "get_batch: the output tensor is undefined");
  MMT_CHECK(!out.is_cuda(), ValueError, "get_batch: the output must be host memory (ordinary or pinned), "
            "got a tensor on ", out.device().str(), "; gather on the host, then copy with .to(device)");
  MMT_CHECK(out.dtype() == plan.dtype, ValueError, "get_batch: field '", field, "' is ", to_string(plan.dtype),
            " but the output tensor is ", to_string(out.dtype()));
  const int64_t batch = static_cast<int64_t>(indices.size());
  DimVector expected{batch};
  for (int64_t s : plan.sizes) expected.push_back(s);
  MMT_CHECK(out.sizes() == IntArrayRef(expected), ValueError, "get_batch: field '", field, "' of ", batch,
            " records needs an output of shape ", expected, ", got ", out.sizes());
  if (batch == 0) return;
  for (int64_t index : indices) d.normalize_index(index, "get_batch");  // fail before writing anything

  BatchPlan job;
  job.d = &d;
  job.plan = &plan;
  job.indices = indices;
  job.out = static_cast<std::byte*>(out.mutable_data_ptr());
  job.out_record_bytes = out.stride(0) * plan.element_bytes;
  job.out_strides.assign(IntArrayRef(out.strides().data() + 1, out.strides().size() - 1));
  // Dense in the field's own order on both sides (size-1 dimensions' strides do not matter).
  bool same_layout = true;
  for (size_t k = 0; k < plan.sizes.size(); ++k)
    same_layout = same_layout && (plan.sizes[k] == 1 || job.out_strides[k] == plan.strides[k]);
  job.memcpy_ok = same_layout;

  const int64_t total_bytes = batch * plan.value_bytes;
  const int parts = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(threads, total_bytes / kMinBytesPerThread), 1, batch));
  // More pieces than threads, claimed in turn: a helper that wakes late takes fewer pieces
  // instead of leaving the caller waiting for its half.
  const int64_t pieces = parts == 1 ? 1 : std::min<int64_t>(batch, 4 * parts);
  // Chunked files: sorted once, then the threads take slices of the sorted list, so a chunk
  // is looked up once per batch (once per slice it straddles) rather than once per slice
  // that holds one of its records: the slices of an unsorted batch each touch most chunks,
  // and two threads taking the cache's lock for every record ran 5x slower than one.
  std::span<const std::pair<int64_t, int64_t>> by_record;
  if (!d.contiguous) by_record = job.sorted_by_record();
  auto run = [&](int64_t piece) {
    const int64_t lo = batch * piece / pieces, hi = batch * (piece + 1) / pieces;
    if (d.contiguous)
      job.gather_contiguous(lo, hi);
    else
      job.gather_chunked(by_record.subspan(static_cast<size_t>(lo), static_cast<size_t>(hi - lo)));
  };
  if (parts == 1)
    run(0);
  else
    detail::ThreadPool::shared().parallel_for(pieces, parts, run);
}

Tensor Dataset::get_batch(std::span<const int64_t> indices, std::string_view field, int threads) const {
  const Impl& d = checked_impl(impl_);
  const size_t f = d.schema->index_of(field);
  const FieldPlan& plan = d.plans[f];
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
