// Samplers: the order in which a Loader visits a dataset's records, epoch by epoch.
//
// An epoch's GLOBAL ORDER is a permutation of [0, N) fixed by (kind, seed, epoch) and, for
// quasi-random sampling, by the chunk layout and the window. It never depends on threads,
// timing or batch size; nor on world size, but for quasi-random sampling with an automatic
// window under a chunk cache budget other than the default (SamplerOptions::window_chunks
// says why, and what to set instead). Orders are computed, not stored: EpochOrder maps a
// position to a record in O(1) (random) or O(log chunks) (quasi-random), so a sampler's
// memory does not grow with the number of records (quasi-random keeps three int64 per chunk,
// or per piece of a chunk over a mixture, and one per window of chunks). A subset (below) is
// the one thing kept per entry: the list itself, shared, and for quasi-random a sorted copy
// unless the list is sorted already.
//
// Kinds:
//   - Sequential: 0, 1, ..., N-1.
//   - Random: a keyed pseudo-random permutation of [0, N), a fresh one per (seed, epoch),
//     computed per position (a Feistel network, not a table; N of 5 to 8 takes a Fisher-Yates
//     shuffle of a table of N, as every shuffle of so few entries here does). Its orders pass
//     the tests a uniform shuffle passes: where each record lands, where pairs and triples
//     land, odd and even permutations equally often, and for N up to 8 how often each whole
//     order occurs (tests/sampler_test.cc; bench/RESULTS.md, "Random orders").
//   - QuasiRandom: chunk-aware. The chunk order is shuffled, consecutive groups of
//     `window_chunks` chunks form windows, and the records of each window are shuffled
//     together. A window's decoded chunks fit the chunk cache, so each compressed chunk is
//     decoded once per epoch and a dataset larger than memory is read with locality, while a
//     batch still mixes records of many chunks.
//
// Subsets. SamplerOptions::subset limits an epoch to a list of records (a train/validation
// split inside one file; a record listed k times is visited k times an epoch, which
// oversamples it). The epoch's order is then a permutation of the list's M entries, made as
// above with positions in place of records: Sequential visits the list in its order, Random
// shuffles it, QuasiRandom groups its entries by chunk (the list sorted by record) and
// shuffles chunks and windows of chunks as above, counting only the chunks the list touches.
// Everything below (N, the resume rule) then counts the list's entries: N = M.
//
// Mixtures. SamplerOptions::mixture draws each epoch from several sources (record ranges of
// one dataset, say the parts of a concatenation: Mixture::of_parts) in proportions of their
// weights, with an epoch size of its own, as MosaicML Streaming's Stream(proportion=) and
// LitData's CombinedStreamingDataset(weights=) do: a small, valuable corpus upsampled next to
// a large web scrape. Source s gets c_s = its weight's share of epoch_size positions (shares
// rounded down, then the positions left one each to the largest remainders, ties to the
// first source; in exact integer arithmetic, the same on every machine, where the weights
// scaled by one power of two are integers below 2^62, as integer weights, sizes and
// proportions like 0.3 and 0.7 are; weights further apart in scale share in long double). When c_s exceeds its n_s records, every record is visited floor(c_s / n_s)
// times and the rest once more (a pass of its own); when it falls short, c_s distinct
// records are chosen. The epoch's positions are then ordered as above over the mixture's
// N = sum c_s positions:
//   - Random shuffles them all together (sources interleave through the epoch), and a
//     partial pass over a source draws its records afresh each epoch: a keyed permutation of
//     the source, whose first (c_s mod n_s) entries are taken.
//   - Sequential takes source 0's positions, then source 1's, ...; within a source, epoch e
//     starts where epoch e - 1 stopped (at record (e * c_s) mod n_s of the source, wrapping),
//     so a subsampled source is walked through in order over the epochs.
//   - QuasiRandom keeps its locality: each source's range is cut at chunk boundaries into
//     pieces; a full pass over the source is each of its pieces once, and a partial pass
//     reads the pieces in a keyed order (another each epoch) as a ring of the source's
//     records, taking c_s mod n_s of them from a keyed offset: whole pieces but at the run's
//     two ends, and every record drawn with the same probability. The pieces of all passes
//     of all sources are then shuffled, grouped into windows of `window_chunks` pieces and
//     shuffled within a window, as chunks are above: a window still decodes at most
//     `window_chunks` chunks, and the passes of an upsampled source are shuffled apart
//     (mostly into different windows). It keeps two int64 per piece (Sampler::create
//     refuses a mixture whose pieces an epoch could pass 2^24, kMaxMixturePieces: many
//     passes over sources of many chunks; use Random there).
// A subset does not combine with a mixture (ValueError): give the subset's records as
// sources, or split the subset out.
//
// Distributed sampling (world_size W > 1) partitions the global order as PyTorch's
// DistributedSampler does: rank r takes positions r, r + W, r + 2W, ... The tail that does
// not divide by W is padded by repeating the epoch's first positions 0, 1, ... (drop_tail =
// false, every rank gets ceil(M / W) samples; after a resume too, so a resume with the same
// world size pads exactly as the run it continues) or dropped (drop_tail = true,
// floor(M / W) samples). M is the number of positions left: N, or N - consumed on a resume.
//
// RESUME RULE. `consumed` counts the leading positions of the epoch's global order that all
// ranks together have taken. Starting from `consumed` = c, rank r takes positions c + r,
// c + r + W, c + r + 2W, ... of the global order. When every rank has taken k samples (as in
// synchronous data-parallel training, where ranks step together) the ranks together have
// taken exactly positions [c, c + k*W), so the new value is min(N, c + k*W) whatever the
// rank: every rank's state is the same number. A resume under any world size W' partitions
// the remaining positions [c', N) by the same rule, so every remaining record of the epoch is
// seen exactly once (plus the padding of the final step when drop_tail is false). If ranks
// did not step together, resume from the smallest `consumed` among them: records are then
// seen again rather than skipped.
//
// Thread safety: Sampler and EpochOrder are immutable after creation; every const method
// may be called from many threads at once. Errors: ValueError for bad options, IndexError
// for a position out of range.
#pragma once

#include <cstdint>
#include <memory>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace mmt {

class Dataset;

enum class SamplerKind : uint8_t { Sequential = 0, Random = 1, QuasiRandom = 2 };

std::string_view to_string(SamplerKind kind);  // "sequential", "random", "quasi_random"
std::optional<SamplerKind> sampler_kind_from_string(std::string_view name);

// Chunks shuffled together by a quasi-random sampler made without a dataset.
inline constexpr int64_t kDefaultWindowChunks = 16;
// The most pieces of chunks quasi-random sampling shuffles an epoch over a mixture (two int64
// each kept, 256 MiB at most, and as much again while an epoch's order is made).
inline constexpr int64_t kMaxMixturePieces = int64_t{1} << 24;

// An immutable list of record indices, shared by its copies: options that hold one copy a
// pointer, so a subset of millions of records costs its 8 bytes an entry once.
class IndexList {
 public:
  IndexList();  // empty
  IndexList(std::vector<int64_t> indices);  // NOLINT(google-explicit-constructor): .subset = ids
  IndexList(std::initializer_list<int64_t> indices);

  int64_t size() const { return static_cast<int64_t>(indices_->size()); }
  bool empty() const { return indices_->empty(); }
  int64_t operator[](int64_t i) const { return (*indices_)[static_cast<size_t>(i)]; }
  std::span<const int64_t> span() const { return *indices_; }
  const int64_t* begin() const { return indices_->data(); }
  const int64_t* end() const { return indices_->data() + indices_->size(); }
  // Equal entries in the same order (a shared list compares equal at once).
  friend bool operator==(const IndexList& a, const IndexList& b);

 private:
  std::shared_ptr<const std::vector<int64_t>> indices_;
};

// One source of a mixture: records [first_record, first_record + num_records) of the
// dataset, drawn in proportion to `weight` (finite, >= 0).
struct MixtureSource {
  int64_t first_record = 0;
  int64_t num_records = 0;
  double weight = 1.0;
  friend bool operator==(const MixtureSource&, const MixtureSource&) = default;
};

struct Mixture {
  std::vector<MixtureSource> sources{};  // at least one; ranges may be given in any order
  // Positions an epoch has; 0: the sources' records added up (each source then gets its
  // weight's share of that). With weights equal to the sources' sizes and epoch_size 0, the
  // mixture visits every record once an epoch, as a plain sampler would.
  int64_t epoch_size = 0;

  // One source per part of a concatenation (Dataset::open_concat; one file is one part), in
  // parts() order, with these weights (as many as parts, else ValueError).
  static Mixture of_parts(const Dataset& dataset, std::vector<double> weights, int64_t epoch_size = 0);
  friend bool operator==(const Mixture&, const Mixture&) = default;
};

struct SamplerOptions {
  SamplerKind kind = SamplerKind::Sequential;
  uint64_t seed = 0;
  // QuasiRandom: chunks per window. 0 = automatic: Sampler::for_dataset() makes a window a
  // third of the chunk cache budget (in largest decoded chunks): one window being finished,
  // one being entered, and headroom; Sampler::create() (given the chunk layout, which
  // quasi-random sampling always needs) uses kDefaultWindowChunks. With
  // world_size > 1 the automatic window uses the default budget (ReaderOptions), whatever
  // this process's, so that every rank computes the same order; to use another budget
  // across ranks, set the same window_chunks on all of them. A rank whose budget is below the
  // default should: measured with 16 KiB records in 1 MiB lz4 chunks and a 64 MiB budget,
  // the default-sized window (85 chunks) decoded each chunk 1.35x (8 ranks) to 2x (4 ranks)
  // per epoch, and window_chunks = 21 (a third of 64 MiB) once. At the default budget, 2 to 16
  // ranks with batches of 256-512 decoded each chunk 1.00-1.01x (bench/RESULTS.md).
  int64_t window_chunks = 0;
  int rank = 0;           // 0 <= rank < world_size
  int world_size = 1;     // number of ranks sharing the epoch
  bool drop_tail = false; // distributed: drop the tail that does not divide by world_size
                          // instead of padding it (PyTorch's DistributedSampler drop_last)
  // The records an epoch visits, as torch.utils.data.Subset or SubsetRandomSampler: each
  // entry once an epoch, in [0, num_records) (ValueError naming the first that is not).
  // std::nullopt: every record. An empty list: none (epochs of no batches).
  std::optional<IndexList> subset{};
  // Draw each epoch from these sources in these proportions (above); std::nullopt: every
  // record (or the subset) once. Not with a subset.
  std::optional<Mixture> mixture{};
};

class Sampler;

// One epoch's order. Cheap to copy (shares its tables).
class EpochOrder {
 public:
  EpochOrder() = default;

  int64_t epoch() const { return epoch_; }
  int64_t size() const;  // N: positions in the global order (the subset's size, or the records)
  // The record at `position` of the global order; IndexError outside [0, N).
  int64_t operator[](int64_t position) const;
  std::vector<int64_t> to_vector() const;  // the whole global order (N int64: for inspection)

  // This rank's view, resuming after `consumed` positions (see the resume rule above).
  // Samples this rank takes from `consumed` to the end of the epoch.
  int64_t rank_size(int64_t consumed = 0) const;
  // The global position of this rank's j-th sample from `consumed` (0 <= j < rank_size).
  int64_t rank_position(int64_t consumed, int64_t j) const;
  // The record of this rank's j-th sample from `consumed`.
  int64_t rank_at(int64_t consumed, int64_t j) const { return (*this)[rank_position(consumed, j)]; }
  std::vector<int64_t> rank_indices(int64_t consumed = 0) const;
  // rank_at(consumed, first + j) for every j of `out`, in one call: with a subset, the
  // list's entries are fetched together rather than one cache miss after another (a
  // loader's batch). IndexError unless [first, first + out.size()) lies in [0, rank_size).
  void rank_records(int64_t consumed, int64_t first, std::span<int64_t> out) const;
  // `consumed` after every rank took `taken` samples starting from `consumed`.
  int64_t consumed_after(int64_t consumed, int64_t taken) const;
  // Whether the order shuffles some run of 5 to 8 entries (an epoch of that many, a mixture
  // source of that many, that many chunks, or a quasi-random window of that many records):
  // those shuffles changed in LoaderState version 5, whose Loader refuses to resume in the
  // middle of such an epoch by an older state.
  bool shuffles_five_to_eight() const;

  struct Tables;

 private:
  friend class Sampler;
  // Where `position` (in [0, N)) lands: the record, or with a subset the entry of the list.
  int64_t unmapped(int64_t position) const;
  // The record a mixture draws at `position` of its sources' positions (in source order).
  int64_t mixture_record(int64_t position) const;
  EpochOrder(std::shared_ptr<const Tables> tables, int64_t epoch) : tables_(std::move(tables)), epoch_(epoch) {}
  std::shared_ptr<const Tables> tables_;
  int64_t epoch_ = 0;
};

class Sampler {
 public:
  // For `num_records` records. QuasiRandom needs the chunk layout: chunk_record_counts[i]
  // records in chunk i, summing to num_records, chunks in record order. Throws ValueError for
  // negative sizes, a layout that does not sum to num_records, rank outside [0, world_size),
  // world_size < 1, window_chunks < 0, a subset entry outside [0, num_records), or a mixture
  // whose source lies outside [0, num_records), has a weight that is negative or not finite,
  // or must give positions to a source of no records (all weights 0, too, with a nonzero
  // epoch size); the message names the source.
  static Sampler create(int64_t num_records, SamplerOptions options,
                        std::vector<int64_t> chunk_record_counts = {});
  // For an open dataset: reads its chunk layout, and its cache budget for an automatic window.
  static Sampler for_dataset(const Dataset& dataset, SamplerOptions options);

  int64_t num_records() const;  // the records the order is drawn from (the dataset's size)
  int64_t epoch_size() const;   // positions an epoch has: the mixture's or subset's size, or num_records()
  // The chunks the order is made from (QuasiRandom; 0 for the other kinds): with a subset,
  // those holding at least one of its records.
  int64_t num_chunks() const;
  // The options with window_chunks resolved (never 0 for QuasiRandom).
  const SamplerOptions& options() const;
  // A 64-bit hash of the chunk layout the order is made from (QuasiRandom), 0 for the kinds
  // whose order depends on num_records alone. Equal layouts give equal hashes; a loader state
  // keeps it, so a resume on a re-chunked file of the same size is refused, not misordered.
  uint64_t chunk_layout_hash() const;
  // A 64-bit hash of the subset's entries, 0 without a subset; a loader state keeps it, so a
  // resume with another subset (of any size) is refused. In their order for Sequential and
  // Random, whose orders follow it; sorted for QuasiRandom, whose order does not.
  // (chunk_layout_hash() with a subset covers how its entries fall into chunks, which is
  // all the quasi-random order takes from the file's layout: a re-chunked file that gives
  // the same runs gives the same order, and resumes.)
  uint64_t subset_hash() const;
  // With a mixture: the positions each source gets an epoch (c_s above, in sources order);
  // empty without one.
  const std::vector<int64_t>& mixture_counts() const;
  // A 64-bit hash of the mixture as drawn (each source's range and count, in order), 0
  // without one; a loader state keeps it, so a resume with another mixture is refused.
  // Weights that round to the same counts draw the same order, and resume.
  uint64_t mixture_hash() const;
  // The order of `epoch` (any value, negative included: it only keys the shuffle).
  EpochOrder epoch(int64_t epoch) const;

  struct Layout;

 private:
  explicit Sampler(std::shared_ptr<const Layout> layout) : layout_(std::move(layout)) {}
  static void resolve_mixture(Layout& layout, int64_t num_records, const SamplerOptions& options);
  // QuasiRandom over a mixture: its sources cut into pieces at chunk boundaries, once; and an
  // epoch's pieces, unshuffled (see "Mixtures" above).
  static void cut_mixture_pieces(Layout& layout);
  static void mixture_pieces(const Layout& layout, uint64_t epoch_key, std::vector<int64_t>& start,
                             std::vector<int64_t>& positions);
  std::shared_ptr<const Layout> layout_;
};

}  // namespace mmt
