// ReadAheadPolicy: when the loader asks the kernel to read a batch's pages before the batch
// is gathered (LoaderOptions::read_ahead). Dataset::get_batch uses it too
// (ReaderOptions::read_ahead), hinting its own batch just before gathering it, with Auto's
// hints off at open and turned on by its own checks of a batch (mincore, or a hinted sample),
// as dataset.h says. The rules below are the loader's.
//
// Why. A gather from a cold file takes one page fault at a time: each waits for the disk,
// and with the kernel's read-around each may read megabytes around one 784-byte record.
// Dataset::prefetch() of a batch a few batches ahead puts all of its reads in flight at
// once, while the batches before it are gathered. But it is one madvise a record (about a
// microsecond), several times a warm gather of small records, so Auto hints only while the
// page cache misses:
// - hints are on when the loader starts: its first batches would otherwise each fault
//   alone, and with the kernel's read-around (read_ahead_kb; 8 MiB on some cloud disks)
//   every such fault reads megabytes of a file read at random;
// - they go off after kWarmHintsToStop hints in a row made the kernel read nothing (the
//   read_bytes of /proc/thread-self/io, read around each hint): a warm file pays for that
//   many hinted batches once;
// - they go on again when a gather takes a major page fault (getrusage of the gathering
//   thread around the piece of a batch's first rows and each ragged field's piece: a
//   syscall, a fraction of a microsecond). Any major fault of that thread counts, so memory
//   pressure that evicts the program's own pages may turn hints on for a while too.
// Where the kernel does not account read bytes, hints stay on until the epoch ends. Where it
// does not charge a read to the thread that starts it (some FUSE filesystems), hints read
// "nothing" and go off, and the next major fault turns them on again.
//
// Thread safety: every method may be called from many threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>

#include "mmtensor/dataset.h"
#include "page_cache.h"

namespace mmt::detail {

// Dataset::get_batch's Auto (ReaderOptions::read_ahead), a single file's and shards' read as
// one: a gather this slow may have waited for the disk, so the next batch is checked with
// mincore() (4 to 12 syscalls, 5-15 us); below it, a warm gather pays for no check (~13 us
// for 256 784-byte records). Where mincore would not tell, the check hints a sample of the
// batch and reads what that made the kernel read (~15 us), so it waits for a slower gather.
inline constexpr auto kSlowGather = std::chrono::microseconds(100);
inline constexpr auto kSlowGatherForSample = std::chrono::microseconds(500);
// A slow gather that took no major page fault (of the gathering thread, or of the process
// when pool threads gather too) since the thread's last slow gather has read nothing from the
// disk, and leaves no check: a warm gather may itself take 100 us or more (records scattered
// over a file larger than the CPU's caches, shards read part by part), and a check of every
// such batch cost it 5-15%.

// Whether a batch's records (Python-style indices into `record_count` records laid out
// `record_stride_bytes` apart) lie close together: within twice the pages they would fill
// alone (a sequential scan, or a shard read in order, strided by the ranks as a distributed
// sampler without shuffling reads it). Auto read-ahead leaves those to the kernel's own
// readahead, which runs ahead of the reader; a hint just before the gather would read that
// batch alone, and keep the kernel from running ahead (a cold sequential scan ran 3.5-4x
// slower hinted). In dataset_batch.cc.
bool records_are_dense(std::span<const int64_t> indices, int64_t record_count, int64_t record_stride_bytes);

class ReadAheadPolicy {
 public:
  static constexpr int64_t kWarmHintsToStop = 8;

  // Always hints from the start, Never never; Auto from the start when `auto_hints_from_start`
  // (a loader: its first batches would otherwise each fault alone), else from the first
  // major fault (Dataset::get_batch, whose file is often warm, and whose every call would
  // pay for a hint).
  explicit ReadAheadPolicy(ReadAhead mode, bool auto_hints_from_start = true)
      : mode_(mode), hinting_(mode == ReadAhead::Always || (mode == ReadAhead::Auto && auto_hints_from_start)) {}

  ReadAhead mode() const { return mode_; }
  // Whether a batch scheduled now is hinted.
  bool hinting() const { return hinting_.load(std::memory_order_relaxed); }
  // Whether gathers should count their major faults (Auto, hints off).
  bool watching_faults() const { return mode_ == ReadAhead::Auto && !hinting(); }
  // Auto: a gather took `major_faults`; true when this call turned hints on (the caller then
  // hints the batches already scheduled).
  bool note_gather_faults(int64_t major_faults);
  // A hint was given; `read_bytes` is what it made the kernel read (-1: unknown).
  void note_hint(int64_t read_bytes);
  // The same in two steps, for a caller that learns what a hint found later: a hint was
  // given; then, Auto, whether it found its batch missing from the page cache (eight in a
  // row that did not turn hints off).
  void count_hint() { batches_hinted_.fetch_add(1, std::memory_order_relaxed); }
  void note_hint_found_cold(bool cold);
  // Auto, without a read_bytes count: hints off until a gather faults again.
  void note_new_epoch();
  int64_t batches_hinted() const { return batches_hinted_.load(std::memory_order_relaxed); }
  // Dataset::get_batch's Auto: a batch was checked (mincore, or a hinted sample).
  void count_check() { batches_checked_.fetch_add(1, std::memory_order_relaxed); }
  int64_t batches_checked() const { return batches_checked_.load(std::memory_order_relaxed); }

  // Set for its lifetime on the calling thread: Dataset::get_batch gives no hint of its own
  // there (a loader's gathers: the loader hints batches ahead of them by its own policy).
  class DatasetHintsOff {
   public:
    DatasetHintsOff() : was_(off_) { off_ = true; }
    ~DatasetHintsOff() { off_ = was_; }
    DatasetHintsOff(const DatasetHintsOff&) = delete;
    DatasetHintsOff& operator=(const DatasetHintsOff&) = delete;
    static bool active() { return off_; }

   private:
    static thread_local bool off_;
    bool was_;
  };

 private:
  const ReadAhead mode_;
  std::atomic<bool> hinting_;
  std::atomic<int64_t> warm_hints_in_a_row_{0};
  std::atomic<bool> read_bytes_unknown_{false};
  std::atomic<int64_t> batches_hinted_{0};
  std::atomic<int64_t> batches_checked_{0};
};

}  // namespace mmt::detail
