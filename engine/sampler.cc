#include "mmtensor/sampler.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>

#include "checksum.h"
#include "splitmix.h"
#include "mmtensor/error.h"

namespace mmt {

namespace {

using detail::derive_key;
using detail::mix64;

// A keyed bijection of [0, n) that needs no table. Storing a shuffled index array would cost
// 4-8 bytes per record; this costs nothing, and any position of an epoch can be computed
// directly, which is what makes mid-epoch resume free.
//
// An alternating Feistel network over [0, 2^bits), the smallest such domain holding n (at
// most 2n, so cycle walking back into [0, n) takes under 2 steps on average). x splits into
// a high part of bits/2 bits and a low part of the rest; rounds alternately add a keyed hash
// of one part to the other, modulo its size. Two choices make its permutations as good as a
// uniform shuffle's by every statistic we measured (bench/RESULTS.md, "Random orders"):
//   - Addition, not XOR: XOR with a constant is an even permutation of a part of >= 2 bits,
//     so a XOR network only ever makes even permutations of its domain (when n is the
//     domain's size, half of all orders never occur; cycle walking into a smaller n mixes
//     parities only a little: 37 odd orders in 2000 at n = 1000). Adding an odd constant is
//     an odd permutation of a part of any size.
//   - More rounds when the parts are small: over a few bits a round's hash is a random
//     function of a tiny domain, far from a random permutation, and 6 rounds left records
//     of a 5-record epoch 8% more likely in some places than others.
// Round r hashes with key + (r + 1) * golden ratio, splitmix64's stream: nothing to derive or
// store per round, so a permutation is a few words and free to make (quasi-random makes one
// per position, for the window the position falls in).
// Over 3 bits (n of 5 to 8), a part of 1 bit beside one of 2, the network's orders stayed
// measurably non-uniform even at 16 rounds: whole orders of 5 records up to 5% more or less
// frequent than others (chi-squared 1,347 on 119 degrees of freedom over 4 million epochs),
// triples of positions at z = 5-15, though each record's place was right within 0.3%. Those n
// take a Fisher-Yates shuffle of a table instead, one byte an entry in one word, drawn from
// the key's splitmix64 stream: as cheap to make as 16 rounds are to run, and exact.
class KeyedPermutation {
 public:
  static constexpr uint64_t kTableMin = 5, kTableMax = 8;

  static bool shuffled_by_table(uint64_t n) { return n >= kTableMin && n <= kTableMax; }

  KeyedPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
    if (shuffled_by_table(n)) {
      make_table();
      return;
    }
    const int bits = std::max(2, static_cast<int>(std::bit_width(n - (n > 0))));  // 2^bits >= n
    high_bits_ = bits / 2;
    low_bits_ = bits - high_bits_;
    high_mask_ = (uint64_t{1} << high_bits_) - 1;
    low_mask_ = (uint64_t{1} << low_bits_) - 1;
    rounds_ = high_bits_ >= 4 ? 6 : high_bits_ == 3 ? 10 : 16;  // measured, see above
  }

  uint64_t operator()(uint64_t x) const {
    if (n_ <= 1) return x;
    if (shuffled_by_table(n_)) return (table_ >> (8 * x)) & 0xff;
    // The walk ends because the network permutes the domain and x's cycle passes through
    // [0, n) again.
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

  // Entry x in byte x of table_: Fisher-Yates from the last entry down, each swap with one
  // of the entries up to it drawn uniformly (a 64-bit draw reduced mod at most 8: bias 2^-61).
  void make_table() {
    uint8_t entries[kTableMax];
    for (uint64_t i = 0; i < n_; ++i) entries[i] = static_cast<uint8_t>(i);
    uint64_t stream = key_;
    for (uint64_t i = n_ - 1; i > 0; --i) {
      stream += kGolden;
      std::swap(entries[i], entries[mix64(stream) % (i + 1)]);
    }
    table_ = 0;
    for (uint64_t i = 0; i < n_; ++i) table_ |= static_cast<uint64_t>(entries[i]) << (8 * i);
  }

  uint64_t encrypt(uint64_t x) const {
    uint64_t high = x >> low_bits_, low = x & low_mask_;
    uint64_t round_key = key_;
    for (int r = 0; r < rounds_; r += 2) {  // rounds_ is even
      round_key += kGolden;
      high = (high + mix64(low ^ round_key)) & high_mask_;
      round_key += kGolden;
      low = (low + mix64(high ^ round_key)) & low_mask_;
    }
    return (high << low_bits_) | low;
  }

  uint64_t n_;
  uint64_t key_;
  int high_bits_ = 1, low_bits_ = 1, rounds_ = 16;
  uint64_t high_mask_ = 1, low_mask_ = 1;
  uint64_t table_ = 0;  // n of 5 to 8: the permutation, a byte an entry
};

// The weights as integers W_s = w_s * 2^k for one k, when every W_s is below 2^62: integer
// weights, dataset sizes, and proportions such as 0.3 and 0.7 (whose doubles differ by one
// binary order or so). nullopt for weights too far apart in scale.
std::optional<std::vector<int64_t>> weights_as_integers(const std::vector<MixtureSource>& sources) {
  std::vector<uint64_t> mantissas(sources.size(), 0);
  std::vector<int> exponents(sources.size(), 0);
  int lowest = INT32_MAX;
  for (size_t s = 0; s < sources.size(); ++s) {
    if (sources[s].weight <= 0) continue;
    int exponent = 0;
    const double fraction = std::frexp(sources[s].weight, &exponent);  // weight = fraction * 2^exponent
    uint64_t mantissa = static_cast<uint64_t>(std::ldexp(fraction, 53));  // exact: 53 bits
    const int zeros = std::countr_zero(mantissa);
    mantissas[s] = mantissa >> zeros;
    exponents[s] = exponent - 53 + zeros;
    lowest = std::min(lowest, exponents[s]);
  }
  std::vector<int64_t> out(sources.size(), 0);
  for (size_t s = 0; s < sources.size(); ++s) {
    if (mantissas[s] == 0) continue;
    const int shift = exponents[s] - lowest;
    if (shift > 62 || std::bit_width(mantissas[s]) + shift > 62) return std::nullopt;
    out[s] = static_cast<int64_t>(mantissas[s] << shift);
  }
  return out;
}

// Each source's positions an epoch: its weight's share of epoch_size, rounded down, and the
// positions left one each to the largest remainders (ties to the first source), so the
// counts add up to epoch_size exactly and no source is more than one position off its share.
// Exact (integer arithmetic, the same counts on every machine) where weights_as_integers()
// holds them; otherwise in long double, whose rounding may settle a near tie either way.
std::vector<int64_t> mixture_counts_of(const std::vector<MixtureSource>& sources, int64_t epoch_size) {
  if (const std::optional<std::vector<int64_t>> weights = weights_as_integers(sources); weights && epoch_size > 0) {
    __int128 total = 0;
    for (const int64_t w : *weights) total += w;
    std::vector<int64_t> counts(sources.size(), 0);
    std::vector<__int128> remainders(sources.size(), 0);  // of shares epoch_size * w / total
    int64_t assigned = 0;
    for (size_t s = 0; s < sources.size(); ++s) {
      const __int128 scaled = static_cast<__int128>(epoch_size) * (*weights)[s];
      counts[s] = static_cast<int64_t>(scaled / total);
      remainders[s] = scaled % total;
      assigned += counts[s];
    }
    std::vector<size_t> by_remainder;
    for (size_t s = 0; s < sources.size(); ++s)
      if ((*weights)[s] > 0) by_remainder.push_back(s);
    std::stable_sort(by_remainder.begin(), by_remainder.end(),
                     [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
    for (size_t i = 0; assigned < epoch_size; ++i) {  // fewer left than sources of weight
      ++counts[by_remainder[i]];
      ++assigned;
    }
    return counts;
  }
  // Weights scaled by the largest first: their sum cannot overflow, even where long double
  // is a double (weights near DBL_MAX would otherwise sum to inf and every share to 0).
  double largest = 0;
  for (const MixtureSource& source : sources) largest = std::max(largest, source.weight);
  long double total_weight = 0;
  for (const MixtureSource& source : sources) total_weight += source.weight / largest;
  std::vector<int64_t> counts(sources.size(), 0);
  if (epoch_size == 0) return counts;
  std::vector<long double> remainders(sources.size(), 0);
  int64_t assigned = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    const long double share = static_cast<long double>(epoch_size) * (sources[s].weight / largest / total_weight);
    const long double whole = std::floor(share);
    counts[s] = std::clamp<int64_t>(static_cast<int64_t>(std::min<long double>(whole, epoch_size)), 0,
                                    epoch_size - assigned);
    remainders[s] = share - whole;
    assigned += counts[s];
  }
  // Rounding of the shares may leave a few positions (never more than the sources): to the
  // largest remainders among sources of nonzero weight.
  std::vector<size_t> by_remainder;
  for (size_t s = 0; s < sources.size(); ++s)
    if (sources[s].weight > 0) by_remainder.push_back(s);
  std::stable_sort(by_remainder.begin(), by_remainder.end(),
                   [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
  for (size_t i = 0; assigned < epoch_size; i = (i + 1) % by_remainder.size()) {
    ++counts[by_remainder[i]];
    ++assigned;
  }
  return counts;
}

}  // namespace

std::string_view to_string(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::Sequential: return "sequential";
    case SamplerKind::Random: return "random";
    case SamplerKind::QuasiRandom: return "quasi_random";
  }
  return "unknown";
}

std::optional<SamplerKind> sampler_kind_from_string(std::string_view name) {
  if (name == "sequential") return SamplerKind::Sequential;
  if (name == "random") return SamplerKind::Random;
  if (name == "quasi_random" || name == "quasi-random") return SamplerKind::QuasiRandom;
  return std::nullopt;
}

IndexList::IndexList() {
  static const auto empty = std::make_shared<const std::vector<int64_t>>();
  indices_ = empty;
}
IndexList::IndexList(std::vector<int64_t> indices)
    : indices_(std::make_shared<const std::vector<int64_t>>(std::move(indices))) {}
IndexList::IndexList(std::initializer_list<int64_t> indices)
    : indices_(std::make_shared<const std::vector<int64_t>>(indices)) {}

bool operator==(const IndexList& a, const IndexList& b) {
  return a.indices_ == b.indices_ || *a.indices_ == *b.indices_;
}

// The order is made over "positions" 0..M-1 and mapped to records at the end: a position is
// the record itself without a subset, the subset's entry for Sequential and Random, and an
// entry of the sorted subset for QuasiRandom, whose chunks are then runs of that sorted list.
struct Sampler::Layout {
  SamplerOptions options;
  int64_t records = 0;    // the dataset's
  int64_t positions = 0;  // an epoch's: the subset's size, or records
  // QuasiRandom: where each chunk's positions begin (chunks + 1 entries; empty otherwise).
  // With a subset, only the chunks holding some of its records count, each with as many
  // positions as it holds entries.
  std::vector<int64_t> chunk_first_record;
  uint64_t chunk_layout_hash = 0;  // of chunk_first_record; 0 when it is empty
  uint64_t subset_hash = 0;        // of options.subset's entries; 0 without one
  // What a position maps to: options.subset (Sequential, Random) or its sorted copy
  // (QuasiRandom); std::nullopt without a subset.
  std::optional<IndexList> position_records;
  // With a mixture: each source's range and its positions an epoch, and where each source's
  // positions begin (sources + 1 entries). Empty without one.
  std::vector<int64_t> mixture_counts;
  std::vector<int64_t> mixture_first_position;
  std::vector<int64_t> mixture_full_pass_positions;  // per source: (c_s / n_s) * n_s
  uint64_t mixture_hash = 0;
  // QuasiRandom over a mixture: each source's range cut at chunk boundaries into pieces;
  // source s has pieces [mixture_piece_begin[s], mixture_piece_begin[s + 1]).
  std::vector<int64_t> piece_first_record;
  std::vector<int64_t> piece_records;
  std::vector<size_t> mixture_piece_begin;

  bool mixed() const { return !mixture_counts.empty(); }
  const std::vector<MixtureSource>& mixture_sources() const { return options.mixture->sources; }

  int64_t record_at(int64_t position) const {
    return position_records ? (*position_records)[position] : position;
  }
};

struct EpochOrder::Tables {
  std::shared_ptr<const Sampler::Layout> layout;
  uint64_t epoch_key = 0;
  KeyedPermutation positions{0, 0};  // Random: built once per epoch, not per position
  // Random over a mixture: per source, the permutation its partial pass takes records from.
  std::vector<KeyedPermutation> mixture_partial;
  // Sequential over a mixture: per source, the record of it the epoch starts at, (e * c_s)
  // mod n_s: where epoch e - 1 stopped (negative epochs too: the remainder in [0, n_s)).
  std::vector<int64_t> mixture_start;
  // QuasiRandom: each shuffled slot's first record (a chunk's, or a mixture's piece's; with a
  // subset, its first entry of the sorted list), and positions before each slot.
  std::vector<int64_t> slot_start;
  std::vector<int64_t> slot_first_position;  // slots + 1 entries
  // QuasiRandom, per window of window_chunks slots: the records before it (windows + 1
  // entries: searched instead of every slot's).
  std::vector<int64_t> window_first_position;
  bool shuffles_five_to_eight = false;  // EpochOrder::shuffles_five_to_eight()
};

Sampler Sampler::create(int64_t num_records, SamplerOptions options,
                        std::vector<int64_t> chunk_record_counts) {
  MMT_CHECK(num_records >= 0, ValueError, "Sampler: num_records must be >= 0, got ", num_records);
  MMT_CHECK(options.world_size >= 1, ValueError, "Sampler: world_size must be >= 1, got ",
            options.world_size);
  MMT_CHECK(options.rank >= 0 && options.rank < options.world_size, ValueError,
            "Sampler: rank ", options.rank, " is outside [0, world_size=", options.world_size, ")");
  MMT_CHECK(options.window_chunks >= 0, ValueError, "Sampler: window_chunks must be >= 0, got ",
            options.window_chunks);
  MMT_CHECK(options.kind == SamplerKind::Sequential || options.kind == SamplerKind::Random ||
                options.kind == SamplerKind::QuasiRandom,
            ValueError, "Sampler: unknown kind ", static_cast<int>(options.kind),
            " (sequential, random or quasi_random)");
  // Positions past the end (padding) reach num_records + world_size - 2: keep them in int64.
  MMT_CHECK(num_records <= INT64_MAX - options.world_size, ValueError, "Sampler: ", num_records,
            " records and world_size ", options.world_size, " overflow a position");
  auto layout = std::make_shared<Layout>();
  layout->records = num_records;
  layout->positions = num_records;
  if (options.mixture) resolve_mixture(*layout, num_records, options);
  if (options.subset) {
    const IndexList& subset = *options.subset;
    MMT_CHECK(subset.size() <= INT64_MAX - options.world_size, ValueError, "Sampler: a subset of ",
              subset.size(), " entries and world_size ", options.world_size, " overflow a position");
    for (int64_t i = 0; i < subset.size(); ++i)
      MMT_CHECK(subset[i] >= 0 && subset[i] < num_records, ValueError, "Sampler: subset entry ", i, " is ",
                subset[i], ", outside [0, ", num_records, ") (the records the order is drawn from)");
    layout->positions = subset.size();
    layout->position_records = subset;
  }
  if (options.kind == SamplerKind::QuasiRandom) {
    MMT_CHECK(!chunk_record_counts.empty() || num_records == 0, ValueError,
              "Sampler: quasi-random sampling needs the chunk layout (chunk_record_counts)");
    std::vector<int64_t> chunk_first;  // the records', chunks + 1 entries
    chunk_first.reserve(chunk_record_counts.size() + 1);
    chunk_first.push_back(0);
    int64_t total = 0;
    for (size_t i = 0; i < chunk_record_counts.size(); ++i) {
      const int64_t count = chunk_record_counts[i];
      MMT_CHECK(count >= 0 && count <= num_records - total, ValueError, "Sampler: chunk ", i,
                " holds ", count, " records, which does not fit in num_records=", num_records);
      total += count;
      chunk_first.push_back(total);
    }
    MMT_CHECK(total == num_records, ValueError, "Sampler: the chunk layout holds ", total,
              " records but num_records is ", num_records);
    if (options.subset) {
      // Sorted by record, the subset's entries of one chunk are a run: that run is the chunk.
      std::span<const int64_t> entries = options.subset->span();
      if (!std::is_sorted(entries.begin(), entries.end())) {
        std::vector<int64_t> sorted(entries.begin(), entries.end());
        std::sort(sorted.begin(), sorted.end());
        layout->position_records = IndexList(std::move(sorted));
        entries = layout->position_records->span();
      }
      layout->chunk_first_record.push_back(0);
      size_t next = 0;
      for (size_t c = 0; c + 1 < chunk_first.size(); ++c) {
        const size_t run_begin = next;
        while (next < entries.size() && entries[next] < chunk_first[c + 1]) ++next;
        if (next > run_begin) layout->chunk_first_record.push_back(static_cast<int64_t>(next));
      }
    } else {
      layout->chunk_first_record = std::move(chunk_first);
    }
    if (options.window_chunks == 0) options.window_chunks = kDefaultWindowChunks;
    // (The subset's hash comes below, once position_records is the sorted list.)
    // Never 0, so that "no layout" (the other kinds) cannot equal a layout's hash.
    layout->chunk_layout_hash = detail::checksum64(layout->chunk_first_record.data(),
                                                   layout->chunk_first_record.size() * sizeof(int64_t)) | 1;
  }
  if (layout->position_records) {
    // Of the list the order is made from: the subset as given, or sorted for QuasiRandom,
    // whose order does not depend on the list's order (a list rebuilt from a set resumes).
    const IndexList& list = *layout->position_records;
    layout->subset_hash = detail::checksum64(list.begin(), static_cast<size_t>(list.size()) * sizeof(int64_t)) | 1;
  }
  layout->options = options;
  if (layout->mixed() && options.kind == SamplerKind::QuasiRandom) cut_mixture_pieces(*layout);
  return Sampler(std::move(layout));
}

void Sampler::resolve_mixture(Layout& layout, int64_t num_records, const SamplerOptions& options) {
  const Mixture& mixture = *options.mixture;
  MMT_CHECK(!options.subset, ValueError,
            "Sampler: give a subset or a mixture, not both (a mixture's sources are record ranges: give the "
            "subset's records as sources of their own)");
  MMT_CHECK(!mixture.sources.empty(), ValueError, "Sampler: a mixture needs at least one source");
  MMT_CHECK(mixture.epoch_size >= 0, ValueError, "Sampler: a mixture's epoch_size must be >= 0, got ",
            mixture.epoch_size);
  int64_t records_in_sources = 0;
  for (size_t s = 0; s < mixture.sources.size(); ++s) {
    const MixtureSource& source = mixture.sources[s];
    MMT_CHECK(source.first_record >= 0 && source.num_records >= 0 && source.first_record <= num_records &&
                  source.num_records <= num_records - source.first_record,
              ValueError, "Sampler: mixture source ", s, " (", source.num_records, " records from ",
              source.first_record, ") is not within [0, ", num_records, ") (the records the order is drawn from)");
    MMT_CHECK(std::isfinite(source.weight) && source.weight >= 0, ValueError, "Sampler: mixture source ", s,
              " has weight ", source.weight, "; a weight is a finite number >= 0");
    MMT_CHECK(source.num_records <= INT64_MAX / 2 - records_in_sources, ValueError,
              "Sampler: the mixture's sources hold more than 2^62 records together");
    records_in_sources += source.num_records;
  }
  const int64_t epoch_size = mixture.epoch_size != 0 ? mixture.epoch_size : records_in_sources;
  MMT_CHECK(epoch_size <= INT64_MAX - options.world_size, ValueError, "Sampler: a mixture epoch of ", epoch_size,
            " positions and world_size ", options.world_size, " overflow a position");
  const bool weighted = std::any_of(mixture.sources.begin(), mixture.sources.end(),
                                    [](const MixtureSource& source) { return source.weight > 0; });
  MMT_CHECK(weighted || epoch_size == 0, ValueError, "Sampler: every mixture source has weight 0, so none can fill an "
            "epoch of ", epoch_size, " positions");
  layout.mixture_counts = mixture_counts_of(mixture.sources, epoch_size);
  layout.mixture_first_position.assign(1, 0);
  for (size_t s = 0; s < mixture.sources.size(); ++s) {
    MMT_CHECK(layout.mixture_counts[s] == 0 || mixture.sources[s].num_records > 0, ValueError,
              "Sampler: mixture source ", s, " has weight ", mixture.sources[s].weight, " (",
              layout.mixture_counts[s], " positions an epoch) but no records to draw them from");
    layout.mixture_first_position.push_back(layout.mixture_first_position.back() + layout.mixture_counts[s]);
    const int64_t n = mixture.sources[s].num_records;
    layout.mixture_full_pass_positions.push_back(n == 0 ? 0 : layout.mixture_counts[s] / n * n);
  }
  // The order depends on the ranges and counts, not on the weights that gave the counts.
  std::vector<int64_t> drawn;
  for (size_t s = 0; s < mixture.sources.size(); ++s)
    drawn.insert(drawn.end(), {mixture.sources[s].first_record, mixture.sources[s].num_records, layout.mixture_counts[s]});
  layout.mixture_hash = detail::checksum64(drawn.data(), drawn.size() * sizeof(int64_t)) | 1;
  layout.positions = epoch_size;
}

void Sampler::cut_mixture_pieces(Layout& layout) {
  const std::vector<int64_t>& chunk_first = layout.chunk_first_record;  // records: no subset with a mixture
  const std::vector<MixtureSource>& sources = layout.mixture_sources();
  layout.mixture_piece_begin.assign(1, 0);
  __int128 slots = 0;  // an epoch's, at most
  for (size_t s = 0; s < sources.size(); ++s) {
    const int64_t first = sources[s].first_record, end = first + sources[s].num_records;
    // The chunk holding `first`, then each chunk up to `end`; chunks of no records give no piece.
    auto c = static_cast<size_t>(std::upper_bound(chunk_first.begin(), chunk_first.end(), first) - chunk_first.begin());
    for (int64_t at = first; at < end; ++c) {
      const int64_t piece_end = std::min(end, chunk_first[c]);
      if (piece_end > at) {
        layout.piece_first_record.push_back(at);
        layout.piece_records.push_back(piece_end - at);
      }
      at = std::max(at, piece_end);
    }
    layout.mixture_piece_begin.push_back(layout.piece_first_record.size());
    const int64_t n = sources[s].num_records, count = layout.mixture_counts[s];
    const auto pieces = static_cast<__int128>(layout.mixture_piece_begin[s + 1] - layout.mixture_piece_begin[s]);
    // Each full pass is every piece; the partial one at most each piece and one more (its
    // run may start and end in the same piece), and never more than its records.
    if (n > 0) slots += pieces * (count / n) + std::min<__int128>(pieces + 1, count % n);
  }
  MMT_CHECK(slots <= kMaxMixturePieces, ValueError, "Sampler: quasi-random sampling over this mixture could shuffle ",
            static_cast<int64_t>(std::min<__int128>(slots, INT64_MAX)), " pieces of chunks an epoch (each pass over "
            "a source is each chunk it touches once), more than ", kMaxMixturePieces,
            ": too many passes over sources of many chunks; use the random sampler");
}

int64_t Sampler::num_records() const { return layout_->records; }
int64_t Sampler::epoch_size() const { return layout_->positions; }
int64_t Sampler::num_chunks() const {
  return layout_->chunk_first_record.empty()
             ? 0 : static_cast<int64_t>(layout_->chunk_first_record.size()) - 1;
}
const SamplerOptions& Sampler::options() const { return layout_->options; }
uint64_t Sampler::chunk_layout_hash() const { return layout_->chunk_layout_hash; }
uint64_t Sampler::subset_hash() const { return layout_->subset_hash; }
const std::vector<int64_t>& Sampler::mixture_counts() const { return layout_->mixture_counts; }
uint64_t Sampler::mixture_hash() const { return layout_->mixture_hash; }

void Sampler::mixture_pieces(const Layout& layout, uint64_t epoch_key, std::vector<int64_t>& start,
                             std::vector<int64_t>& positions) {
  const std::vector<MixtureSource>& sources = layout.mixture_sources();
  for (size_t s = 0; s < sources.size(); ++s) {
    const size_t begin = layout.mixture_piece_begin[s], end = layout.mixture_piece_begin[s + 1];
    const int64_t n = sources[s].num_records, count = layout.mixture_counts[s];
    if (n == 0) continue;
    for (int64_t pass = 0; pass < count / n; ++pass) {
      for (size_t p = begin; p < end; ++p) {
        start.push_back(layout.piece_first_record[p]);
        positions.push_back(layout.piece_records[p]);
      }
    }
    // The partial pass: the source's pieces in an order keyed by epoch and source, read as a
    // ring of its n records, from a keyed offset for count mod n records. Each record is then
    // drawn with probability exactly (count mod n) / n, whatever its piece's size, and the run
    // is whole pieces but at its two ends.
    int64_t left = count % n;
    if (left == 0) continue;
    const uint64_t pieces = end - begin;
    const KeyedPermutation piece_order(pieces, derive_key(epoch_key, 0x7069656365730000ULL ^ s));
    const auto offset = static_cast<int64_t>(mix64(derive_key(epoch_key, 0x6f66667365740000ULL ^ s)) %
                                             static_cast<uint64_t>(n));  // bias under n / 2^64
    uint64_t i = 0;
    int64_t within = offset;  // records into the ring's i-th piece
    while (within >= layout.piece_records[begin + static_cast<size_t>(piece_order(i))])
      within -= layout.piece_records[begin + static_cast<size_t>(piece_order(i++))];
    for (; left > 0; i = (i + 1) % pieces, within = 0) {
      const size_t p = begin + static_cast<size_t>(piece_order(i));
      const int64_t take = std::min(left, layout.piece_records[p] - within);
      start.push_back(layout.piece_first_record[p] + within);
      positions.push_back(take);
      left -= take;
    }
  }
}

EpochOrder Sampler::epoch(int64_t epoch) const {
  auto tables = std::make_shared<EpochOrder::Tables>();
  tables->layout = layout_;
  tables->epoch_key = derive_key(mix64(layout_->options.seed), static_cast<uint64_t>(epoch));
  // Whether a shuffle of this epoch is of a table (KeyedPermutation): what a resume by an
  // older state must be refused for. A mixture's source whose count is a whole number of
  // passes draws no partial pass, and shuffles none.
  const auto partial_pass = [&](size_t s) {
    const int64_t n = layout_->mixture_sources()[s].num_records;
    return n > 0 && layout_->mixture_counts[s] % n != 0;
  };
  const auto note = [&](int64_t n) {
    if (KeyedPermutation::shuffled_by_table(static_cast<uint64_t>(n))) tables->shuffles_five_to_eight = true;
  };
  if (layout_->options.kind == SamplerKind::Random) {
    tables->positions = KeyedPermutation(static_cast<uint64_t>(layout_->positions), tables->epoch_key);
    note(layout_->positions);
    // Keyed by epoch and source, so a partial pass draws other records each epoch.
    for (size_t s = 0; s < layout_->mixture_counts.size(); ++s) {
      tables->mixture_partial.emplace_back(static_cast<uint64_t>(layout_->mixture_sources()[s].num_records),
                                           derive_key(tables->epoch_key, 0x6d69787475726500ULL ^ s));
      if (partial_pass(s)) note(layout_->mixture_sources()[s].num_records);
    }
  }
  if (layout_->options.kind == SamplerKind::Sequential) {
    for (size_t s = 0; s < layout_->mixture_counts.size(); ++s) {
      const __int128 n = layout_->mixture_sources()[s].num_records;
      const __int128 product = static_cast<__int128>(epoch) * layout_->mixture_counts[s];
      tables->mixture_start.push_back(n == 0 ? 0 : static_cast<int64_t>(((product % n) + n) % n));
    }
  }
  if (layout_->options.kind == SamplerKind::QuasiRandom) {
    // The pieces the epoch shuffles, in a fixed order: the chunks; or over a mixture, each
    // source's pieces once per full pass, then the pieces its partial pass takes.
    std::vector<int64_t> piece_start, piece_positions;
    piece_start.reserve(layout_->mixed() ? layout_->piece_first_record.size() : static_cast<size_t>(num_chunks()));
    piece_positions.reserve(piece_start.capacity());
    if (layout_->mixed()) {
      mixture_pieces(*layout_, tables->epoch_key, piece_start, piece_positions);
    } else {
      const int64_t chunks = num_chunks();
      for (int64_t c = 0; c < chunks; ++c) {
        piece_start.push_back(layout_->chunk_first_record[c]);
        piece_positions.push_back(layout_->chunk_first_record[c + 1] - layout_->chunk_first_record[c]);
      }
    }
    for (size_t s = 0; s < layout_->mixture_counts.size(); ++s)  // mixture_pieces()'s piece orders
      if (partial_pass(s))
        note(static_cast<int64_t>(layout_->mixture_piece_begin[s + 1] - layout_->mixture_piece_begin[s]));
    const auto slots = static_cast<int64_t>(piece_start.size());
    const KeyedPermutation slot_order(static_cast<uint64_t>(slots), tables->epoch_key);
    note(slots);
    tables->slot_start.resize(static_cast<size_t>(slots));
    tables->slot_first_position.resize(static_cast<size_t>(slots) + 1);
    int64_t position = 0;
    for (int64_t slot = 0; slot < slots; ++slot) {
      const auto piece = static_cast<size_t>(slot_order(static_cast<uint64_t>(slot)));
      tables->slot_start[slot] = piece_start[piece];
      tables->slot_first_position[slot] = position;
      position += piece_positions[piece];
    }
    tables->slot_first_position[slots] = position;
    const int64_t window = layout_->options.window_chunks;
    const int64_t windows = slots / window + (slots % window != 0);
    tables->window_first_position.resize(static_cast<size_t>(windows) + 1);
    for (int64_t w = 0; w < windows; ++w) tables->window_first_position[w] = tables->slot_first_position[w * window];
    tables->window_first_position[windows] = position;
    for (int64_t w = 0; w < windows; ++w) note(tables->window_first_position[w + 1] - tables->window_first_position[w]);
  }
  return EpochOrder(std::move(tables), epoch);
}

int64_t EpochOrder::size() const { return tables_ ? tables_->layout->positions : 0; }

bool EpochOrder::shuffles_five_to_eight() const { return tables_ && tables_->shuffles_five_to_eight; }

int64_t EpochOrder::operator[](int64_t position) const {
  const int64_t n = size();
  MMT_CHECK(position >= 0 && position < n, IndexError, "EpochOrder: position ", position,
            " is out of range for an epoch of ", n, " records");
  return tables_->layout->record_at(unmapped(position));
}

int64_t EpochOrder::mixture_record(int64_t position) const {
  const Sampler::Layout& layout = *tables_->layout;
  const auto& first = layout.mixture_first_position;
  // The last source whose first position <= position (so sources of no positions are
  // passed). A shuffled position lands in a random source: a binary search mispredicts a
  // branch a step, a count over a few sources does not branch at all.
  size_t s = 0;
  if (first.size() <= 17) {
    for (size_t i = 1; i + 1 < first.size(); ++i) s += static_cast<size_t>(first[i] <= position);
  } else {
    s = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), position) - first.begin()) - 1;
  }
  const MixtureSource& source = layout.mixture_sources()[s];
  const auto n = static_cast<uint64_t>(source.num_records);
  const auto j = static_cast<uint64_t>(position - first[s]);  // the source's j-th position
  if (layout.options.kind == SamplerKind::Sequential) {
    const auto start = static_cast<uint64_t>(tables_->mixture_start[s]);  // < n, and j < c_s: no overflow
    return source.first_record + static_cast<int64_t>((start + j) % n);
  }
  // Random: a full pass over the source visits each record once, in any order (the epoch's
  // permutation orders them); the partial pass takes the first entries of a permutation of
  // the source keyed by epoch and source (Tables::mixture_partial).
  // (A division costs as much as a round of the shuffle: none on the partial pass, and none
  // on the first full one.)
  const auto full_pass_positions = static_cast<uint64_t>(layout.mixture_full_pass_positions[s]);
  if (j >= full_pass_positions)
    return source.first_record + static_cast<int64_t>(tables_->mixture_partial[s](j - full_pass_positions));
  return source.first_record + static_cast<int64_t>(j < n ? j : j % n);
}

int64_t EpochOrder::unmapped(int64_t position) const {
  const Sampler::Layout& layout = *tables_->layout;
  switch (layout.options.kind) {
    case SamplerKind::Sequential:
      return layout.mixed() ? mixture_record(position) : position;
    case SamplerKind::Random: {
      const auto shuffled = static_cast<int64_t>(tables_->positions(static_cast<uint64_t>(position)));
      return layout.mixed() ? mixture_record(shuffled) : shuffled;
    }
    case SamplerKind::QuasiRandom: break;
  }
  // Find the window holding `position` (upper_bound passes empty windows: the one found is
  // the last whose first position <= position), shuffle within it, then find the slot.
  const auto& window_first = tables_->window_first_position;
  const int64_t window_index =
      static_cast<int64_t>(std::upper_bound(window_first.begin(), window_first.end(), position) -
                           window_first.begin()) - 1;
  const int64_t base = window_first[window_index];
  const KeyedPermutation within(static_cast<uint64_t>(window_first[window_index + 1] - base),
                                derive_key(tables_->epoch_key, static_cast<uint64_t>(window_index)));
  const int64_t target = base + static_cast<int64_t>(within(static_cast<uint64_t>(position - base)));
  const auto& first = tables_->slot_first_position;
  const int64_t slots = static_cast<int64_t>(tables_->slot_start.size());
  const int64_t window = layout.options.window_chunks;
  const int64_t window_begin = window_index * window;
  const int64_t window_end = std::min(slots, window_begin + window);
  // upper_bound skips empty chunks: the slot found is the last whose first position <= target.
  const int64_t slot = static_cast<int64_t>(std::upper_bound(first.begin() + window_begin,
                                                             first.begin() + window_end + 1, target) -
                                            first.begin()) - 1;
  return tables_->slot_start[slot] + (target - first[slot]);
}

std::vector<int64_t> EpochOrder::to_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(size()));
  for (int64_t p = 0; p < size(); ++p) out[p] = (*this)[p];
  return out;
}

int64_t EpochOrder::rank_size(int64_t consumed) const {
  const int64_t n = size();
  MMT_CHECK(consumed >= 0 && consumed <= n, IndexError, "EpochOrder: consumed=", consumed,
            " is outside [0, ", n, "]");
  if (!tables_) return 0;
  const SamplerOptions& options = tables_->layout->options;
  const int64_t remaining = n - consumed;
  const int64_t world = options.world_size;
  return options.drop_tail ? remaining / world : remaining / world + (remaining % world != 0);
}

int64_t EpochOrder::rank_position(int64_t consumed, int64_t j) const {
  const int64_t count = rank_size(consumed);
  MMT_CHECK(j >= 0 && j < count, IndexError, "EpochOrder: sample ", j, " is out of range: this rank takes ",
            count, " samples after position ", consumed);
  const SamplerOptions& options = tables_->layout->options;
  // Padding repeats the epoch's first positions, as DistributedSampler repeats the head of its
  // indices; a resume with the same world size then pads exactly as the run it continues.
  const int64_t n = size();
  const int64_t position = consumed + j * options.world_size + options.rank;
  return position < n ? position : (position - n) % n;
}

std::vector<int64_t> EpochOrder::rank_indices(int64_t consumed) const {
  std::vector<int64_t> out(static_cast<size_t>(rank_size(consumed)));
  rank_records(consumed, 0, out);
  return out;
}

void EpochOrder::rank_records(int64_t consumed, int64_t first, std::span<int64_t> out) const {
  const int64_t count = rank_size(consumed);
  const auto rows = static_cast<int64_t>(out.size());
  MMT_CHECK(first >= 0 && first <= count && rows <= count - first, IndexError, "EpochOrder: samples [", first, ", ",
            first + rows, ") are out of range: this rank takes ", count, " samples after position ", consumed);
  if (rows == 0) return;
  const Sampler::Layout& layout = *tables_->layout;
  const int64_t n = size(), world = layout.options.world_size;
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t position = consumed + (first + j) * world + layout.options.rank;  // as rank_position()
    out[j] = unmapped(position < n ? position : (position - n) % n);
  }
  if (!layout.position_records) return;
  // A random entry of a list of millions misses the caches (~150 ns from DRAM, measured in
  // bench/sampler_bench.cc): touch them all first, so the misses overlap.
  const int64_t* list = layout.position_records->begin();
  for (int64_t j = 0; j < rows; ++j) __builtin_prefetch(list + out[j]);
  for (int64_t j = 0; j < rows; ++j) out[j] = list[out[j]];
}

int64_t EpochOrder::consumed_after(int64_t consumed, int64_t taken) const {
  const int64_t count = rank_size(consumed);
  MMT_CHECK(taken >= 0 && taken <= count, IndexError, "EpochOrder: taken=", taken,
            " is outside [0, ", count, "] after position ", consumed);
  if (!tables_) return 0;
  return std::min(size(), consumed + taken * tables_->layout->options.world_size);
}

}  // namespace mmt
