#include "mmtensor/sampler.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "checksum.h"
#include "mmtensor/error.h"

namespace mmt {

namespace {

uint64_t mix64(uint64_t z) {  // the splitmix64 finaliser: full avalanche, cheap
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t derive_key(uint64_t a, uint64_t b) { return mix64(a + 0x9e3779b97f4a7c15ULL * (b + 1)); }

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
class KeyedPermutation {
 public:
  KeyedPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
    const int bits = std::max(2, static_cast<int>(std::bit_width(n - (n > 0))));  // 2^bits >= n
    high_bits_ = bits / 2;
    low_bits_ = bits - high_bits_;
    high_mask_ = (uint64_t{1} << high_bits_) - 1;
    low_mask_ = (uint64_t{1} << low_bits_) - 1;
    rounds_ = high_bits_ >= 4 ? 6 : high_bits_ == 3 ? 10 : 16;  // measured, see above
  }

  uint64_t operator()(uint64_t x) const {
    if (n_ <= 1) return x;
    // The walk ends because the network permutes the domain and x's cycle passes through
    // [0, n) again.
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

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
};

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

struct Sampler::Layout {
  SamplerOptions options;
  int64_t records = 0;
  std::vector<int64_t> chunk_first_record;  // chunks + 1 entries; empty unless QuasiRandom
  uint64_t chunk_layout_hash = 0;           // of chunk_first_record; 0 when it is empty
};

struct EpochOrder::Tables {
  std::shared_ptr<const Sampler::Layout> layout;
  uint64_t epoch_key = 0;
  KeyedPermutation records{0, 0};  // Random: built once per epoch, not per position
  // QuasiRandom: the chunk in each shuffled slot, and records before each slot.
  std::vector<int64_t> slot_chunk;
  std::vector<int64_t> slot_first_position;  // slots + 1 entries
  // QuasiRandom, per window of window_chunks slots: the records before it (windows + 1
  // entries: searched instead of every slot's).
  std::vector<int64_t> window_first_position;
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
  if (options.kind == SamplerKind::QuasiRandom) {
    MMT_CHECK(!chunk_record_counts.empty() || num_records == 0, ValueError,
              "Sampler: quasi-random sampling needs the chunk layout (chunk_record_counts)");
    layout->chunk_first_record.reserve(chunk_record_counts.size() + 1);
    layout->chunk_first_record.push_back(0);
    int64_t total = 0;
    for (size_t i = 0; i < chunk_record_counts.size(); ++i) {
      const int64_t count = chunk_record_counts[i];
      MMT_CHECK(count >= 0 && count <= num_records - total, ValueError, "Sampler: chunk ", i,
                " holds ", count, " records, which does not fit in num_records=", num_records);
      total += count;
      layout->chunk_first_record.push_back(total);
    }
    MMT_CHECK(total == num_records, ValueError, "Sampler: the chunk layout holds ", total,
              " records but num_records is ", num_records);
    if (options.window_chunks == 0) options.window_chunks = kDefaultWindowChunks;
    // Never 0, so that "no layout" (the other kinds) cannot equal a layout's hash.
    layout->chunk_layout_hash = detail::checksum64(layout->chunk_first_record.data(),
                                                   layout->chunk_first_record.size() * sizeof(int64_t)) | 1;
  }
  layout->options = options;
  return Sampler(std::move(layout));
}

int64_t Sampler::num_records() const { return layout_->records; }
int64_t Sampler::num_chunks() const {
  return layout_->chunk_first_record.empty()
             ? 0 : static_cast<int64_t>(layout_->chunk_first_record.size()) - 1;
}
const SamplerOptions& Sampler::options() const { return layout_->options; }
uint64_t Sampler::chunk_layout_hash() const { return layout_->chunk_layout_hash; }

EpochOrder Sampler::epoch(int64_t epoch) const {
  auto tables = std::make_shared<EpochOrder::Tables>();
  tables->layout = layout_;
  tables->epoch_key = derive_key(mix64(layout_->options.seed), static_cast<uint64_t>(epoch));
  if (layout_->options.kind == SamplerKind::Random)
    tables->records = KeyedPermutation(static_cast<uint64_t>(layout_->records), tables->epoch_key);
  if (layout_->options.kind == SamplerKind::QuasiRandom) {
    const int64_t chunks = num_chunks();
    const KeyedPermutation chunk_order(static_cast<uint64_t>(chunks), tables->epoch_key);
    tables->slot_chunk.resize(static_cast<size_t>(chunks));
    tables->slot_first_position.resize(static_cast<size_t>(chunks) + 1);
    int64_t position = 0;
    for (int64_t slot = 0; slot < chunks; ++slot) {
      const auto chunk = static_cast<int64_t>(chunk_order(static_cast<uint64_t>(slot)));
      tables->slot_chunk[slot] = chunk;
      tables->slot_first_position[slot] = position;
      position += layout_->chunk_first_record[chunk + 1] - layout_->chunk_first_record[chunk];
    }
    tables->slot_first_position[chunks] = position;
    const int64_t window = layout_->options.window_chunks;
    const int64_t windows = chunks / window + (chunks % window != 0);
    tables->window_first_position.resize(static_cast<size_t>(windows) + 1);
    for (int64_t w = 0; w < windows; ++w) tables->window_first_position[w] = tables->slot_first_position[w * window];
    tables->window_first_position[windows] = position;
  }
  return EpochOrder(std::move(tables), epoch);
}

int64_t EpochOrder::size() const { return tables_ ? tables_->layout->records : 0; }

int64_t EpochOrder::operator[](int64_t position) const {
  const int64_t n = size();
  MMT_CHECK(position >= 0 && position < n, IndexError, "EpochOrder: position ", position,
            " is out of range for an epoch of ", n, " records");
  const Sampler::Layout& layout = *tables_->layout;
  switch (layout.options.kind) {
    case SamplerKind::Sequential:
      return position;
    case SamplerKind::Random:
      return static_cast<int64_t>(tables_->records(static_cast<uint64_t>(position)));
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
  const int64_t slots = static_cast<int64_t>(tables_->slot_chunk.size());
  const int64_t window = layout.options.window_chunks;
  const int64_t window_begin = window_index * window;
  const int64_t window_end = std::min(slots, window_begin + window);
  // upper_bound skips empty chunks: the slot found is the last whose first position <= target.
  const int64_t slot = static_cast<int64_t>(std::upper_bound(first.begin() + window_begin,
                                                             first.begin() + window_end + 1, target) -
                                            first.begin()) - 1;
  return layout.chunk_first_record[tables_->slot_chunk[slot]] + (target - first[slot]);
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
  const int64_t count = rank_size(consumed);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) out[j] = rank_at(consumed, j);
  return out;
}

int64_t EpochOrder::consumed_after(int64_t consumed, int64_t taken) const {
  const int64_t count = rank_size(consumed);
  MMT_CHECK(taken >= 0 && taken <= count, IndexError, "EpochOrder: taken=", taken,
            " is outside [0, ", count, "] after position ", consumed);
  if (!tables_) return 0;
  return std::min(size(), consumed + taken * tables_->layout->options.world_size);
}

}  // namespace mmt
