// Mixtures (SamplerOptions::mixture): each epoch draws from several sources in proportion to
// their weights, with an epoch size of its own; the counts, the records drawn, determinism,
// distribution over ranks, and a loader's resume follow sampler.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "loader_test_util.h"
#include "mmtensor/error.h"
#include "mmtensor/loader.h"
#include "mmtensor/sampler.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::drain_epoch;
using testing::TempDir;

SamplerOptions mixed(SamplerKind kind, std::vector<MixtureSource> sources, int64_t epoch_size, uint64_t seed = 3) {
  SamplerOptions options;
  options.kind = kind;
  options.seed = seed;
  options.mixture = Mixture{.sources = std::move(sources), .epoch_size = epoch_size};
  return options;
}

// How often each record comes in `order`.
std::map<int64_t, int64_t> visits(const std::vector<int64_t>& order) {
  std::map<int64_t, int64_t> count;
  for (int64_t record : order) ++count[record];
  return count;
}

int64_t in_range(const std::vector<int64_t>& order, int64_t first, int64_t count) {
  return std::count_if(order.begin(), order.end(), [&](int64_t r) { return r >= first && r < first + count; });
}

TEST(Mixture, CountsFollowTheWeightsAndAddUpToTheEpochSize) {
  // 100 records in [0, 60) and [60, 100); weights 3:1 of an epoch of 10 -> 7.5 and 2.5: the
  // shares round down to 7 and 2, and the one left goes to the first of the equal remainders.
  const Sampler sampler = Sampler::create(
      100, mixed(SamplerKind::Random, {{.first_record = 0, .num_records = 60, .weight = 3},
                                       {.first_record = 60, .num_records = 40, .weight = 1}}, 10));
  EXPECT_EQ(sampler.epoch_size(), 10);
  EXPECT_EQ(sampler.mixture_counts(), (std::vector<int64_t>{8, 2}));
  // Three equal weights over 100 positions: 34, 33, 33.
  const Sampler thirds = Sampler::create(
      90, mixed(SamplerKind::Random, {{0, 30, 1.0}, {30, 30, 1.0}, {60, 30, 1.0}}, 100));
  EXPECT_EQ(thirds.mixture_counts(), (std::vector<int64_t>{34, 33, 33}));
  // epoch_size 0: the sources' records added up, shared by weight.
  const Sampler automatic = Sampler::create(100, mixed(SamplerKind::Random, {{0, 60, 1}, {60, 40, 1}}, 0));
  EXPECT_EQ(automatic.epoch_size(), 100);
  EXPECT_EQ(automatic.mixture_counts(), (std::vector<int64_t>{50, 50}));
  // Weights near DBL_MAX share as any others do.
  const Sampler huge = Sampler::create(100, mixed(SamplerKind::Random, {{0, 60, 1.5e308}, {60, 40, 1.5e308}}, 10));
  EXPECT_EQ(huge.mixture_counts(), (std::vector<int64_t>{5, 5}));
  // A source of weight 0 gets nothing; and weights as sizes give each record once.
  const Sampler zero = Sampler::create(100, mixed(SamplerKind::Random, {{0, 60, 0}, {60, 40, 1}}, 25));
  EXPECT_EQ(zero.mixture_counts(), (std::vector<int64_t>{0, 25}));
  const Sampler as_sizes = Sampler::create(100, mixed(SamplerKind::Random, {{0, 60, 60}, {60, 40, 40}}, 0));
  EXPECT_EQ(as_sizes.mixture_counts(), (std::vector<int64_t>{60, 40}));
  const std::vector<int64_t> once = as_sizes.epoch(4).to_vector();
  EXPECT_EQ(visits(once).size(), 100u);
  // Exact ties go to the first source: weights 17, 3 and 8 of 434 share 263.5, 46.5 and 124
  // (long double rounding gave the position to the second); 13 and 1 of 945, after a weight
  // of 0, share 877.5 and 67.5. Proportions of one scale (0.3, 0.7) share exactly too.
  const auto counts = [](std::vector<double> weights, int64_t epoch_size) {
    std::vector<MixtureSource> sources;
    for (size_t s = 0; s < weights.size(); ++s)
      sources.push_back({.first_record = static_cast<int64_t>(s) * 10, .num_records = 10, .weight = weights[s]});
    return Sampler::create(static_cast<int64_t>(weights.size()) * 10, mixed(SamplerKind::Random, sources, epoch_size))
        .mixture_counts();
  };
  EXPECT_EQ(counts({17, 3, 8}, 434), (std::vector<int64_t>{264, 46, 124}));
  EXPECT_EQ(counts({0, 13, 1}, 945), (std::vector<int64_t>{0, 878, 67}));
  EXPECT_EQ(counts({0.5, 0.25, 0.25}, 2), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(counts({0.3, 0.7}, 1000), (std::vector<int64_t>{300, 700}));
  EXPECT_EQ(counts({1.0, 1e-30}, 7), (std::vector<int64_t>{7, 0})) << "scales far apart: long double";
}

TEST(Mixture, AnUpsampledSourceRepeatsEachRecordEvenlyAndASubsampledOneDrawsDistinctRecords) {
  // Source A: 10 records given 25 positions (2 full passes and 5 more); source B: 90 records
  // given 25 (25 distinct ones).
  for (SamplerKind kind : {SamplerKind::Sequential, SamplerKind::Random, SamplerKind::QuasiRandom}) {
    const Sampler sampler = Sampler::create(100, mixed(kind, {{0, 10, 1}, {10, 90, 1}}, 50),
                                            std::vector<int64_t>(10, 10));  // chunks of 10 records
    ASSERT_EQ(sampler.mixture_counts(), (std::vector<int64_t>{25, 25})) << to_string(kind);
    for (int64_t epoch : {0, 1, 7}) {
      const std::vector<int64_t> order = sampler.epoch(epoch).to_vector();
      ASSERT_EQ(order.size(), 50u);
      EXPECT_EQ(in_range(order, 0, 10), 25);
      EXPECT_EQ(in_range(order, 10, 90), 25);
      const std::map<int64_t, int64_t> count = visits(order);
      int64_t thrice = 0;
      for (int64_t r = 0; r < 10; ++r) {
        ASSERT_TRUE(count.contains(r)) << "record " << r << " of the upsampled source was never drawn";
        EXPECT_TRUE(count.at(r) == 2 || count.at(r) == 3) << r << ": " << count.at(r);
        thrice += count.at(r) == 3;
      }
      EXPECT_EQ(thrice, 5);
      for (const auto& [record, times] : count) {
        if (record >= 10) {
          EXPECT_EQ(times, 1) << "record " << record << " of the subsampled source";
        }
      }
    }
  }
}

TEST(Mixture, RandomDrawsOtherRecordsOfASubsampledSourceEachEpochAndInterleavesTheSources) {
  const Sampler sampler = Sampler::create(1000, mixed(SamplerKind::Random, {{0, 100, 1}, {100, 900, 1}}, 200));
  std::set<int64_t> drawn_from_large;
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    const std::vector<int64_t> order = sampler.epoch(epoch).to_vector();
    for (int64_t record : order)
      if (record >= 100) drawn_from_large.insert(record);
    // Interleaved: the epoch's first half holds records of both sources, about half each.
    const std::vector<int64_t> head(order.begin(), order.begin() + 100);
    EXPECT_GT(in_range(head, 0, 100), 25) << "epoch " << epoch;
    EXPECT_GT(in_range(head, 100, 900), 25) << "epoch " << epoch;
  }
  // 100 of 900 each epoch, drawn afresh: 20 epochs reach nearly all of them (expected ~900 *
  // (1 - (8/9)^20) = 857).
  EXPECT_GT(drawn_from_large.size(), 780u);
  // Deterministic in (seed, epoch); another seed gives another order.
  EXPECT_EQ(sampler.epoch(3).to_vector(), sampler.epoch(3).to_vector());
  const Sampler reseeded = Sampler::create(1000, mixed(SamplerKind::Random, {{0, 100, 1}, {100, 900, 1}}, 200, 4));
  EXPECT_NE(reseeded.epoch(3).to_vector(), sampler.epoch(3).to_vector());
}

TEST(Mixture, SequentialWalksASubsampledSourceInOrderAcrossEpochs) {
  // 3 of source A's 5 records an epoch; all 4 of B's once.
  const Sampler sampler = Sampler::create(9, mixed(SamplerKind::Sequential, {{0, 5, 3}, {5, 4, 4}}, 7));
  ASSERT_EQ(sampler.mixture_counts(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(sampler.epoch(0).to_vector(), (std::vector<int64_t>{0, 1, 2, 5, 6, 7, 8}));
  EXPECT_EQ(sampler.epoch(1).to_vector(), (std::vector<int64_t>{3, 4, 0, 5, 6, 7, 8}));
  EXPECT_EQ(sampler.epoch(2).to_vector(), (std::vector<int64_t>{1, 2, 3, 5, 6, 7, 8}));
  // Epochs past 2^32 keep the rule without overflow: (e * 3) mod 5; and negative ones, which
  // an EpochOrder takes too: epoch -1 ends where epoch 0 starts.
  const int64_t huge = kMaxEpoch - 1;
  const auto start = static_cast<int64_t>((static_cast<unsigned __int128>(huge) * 3) % 5);
  EXPECT_EQ(sampler.epoch(huge)[0], start);
  EXPECT_EQ(sampler.epoch(-1).to_vector(), (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8}));
}

TEST(Mixture, QuasiRandomKeepsEachWindowToItsChunksAndSpreadsAnUpsampledSourcesPasses) {
  // 10,000 records in 100 chunks of 100; source A (chunks 0-9) upsampled 3x beside B (chunks
  // 10-99) once: each pass over A, and over B, is whole chunks.
  SamplerOptions options = mixed(SamplerKind::QuasiRandom, {{0, 1000, 3000}, {1000, 9000, 9000}}, 12000);
  options.window_chunks = 4;
  const Sampler sampler = Sampler::create(10000, options, std::vector<int64_t>(100, 100));
  ASSERT_EQ(sampler.mixture_counts(), (std::vector<int64_t>{3000, 9000}));
  for (int64_t epoch : {0, 1, 2}) {
    const std::vector<int64_t> order = sampler.epoch(epoch).to_vector();
    ASSERT_EQ(order.size(), 12000u);
    EXPECT_EQ(in_range(order, 0, 1000), 3000);
    const std::map<int64_t, int64_t> count = visits(order);
    for (int64_t r = 0; r < 1000; ++r) ASSERT_EQ(count.at(r), 3) << "record " << r << " of A";
    for (const auto& [record, times] : count)
      if (record >= 1000) {
        ASSERT_EQ(times, 1) << "record " << record << " of B";
      }
    // Windows of 4 pieces of 100 positions: each run of 400 positions from the start reads at
    // most 4 chunks, where a random order would read ~98.
    for (size_t w = 0; w + 400 <= order.size(); w += 400) {
      std::set<int64_t> chunks;
      for (size_t p = w; p < w + 400; ++p) chunks.insert(order[p] / 100);
      EXPECT_LE(chunks.size(), 4u) << "epoch " << epoch << ", positions from " << w;
    }
    // An upsampled record's three visits fall in different windows, not one batch.
    std::map<int64_t, std::vector<size_t>> where;
    for (size_t p = 0; p < order.size(); ++p)
      if (order[p] < 1000) where[order[p]].push_back(p);
    int64_t bunched = 0;
    for (const auto& [record, positions] : where) bunched += positions.back() - positions.front() < 400;
    EXPECT_LT(bunched, 50) << "epoch " << epoch;
  }
  EXPECT_EQ(sampler.epoch(1).to_vector(), sampler.epoch(1).to_vector());
  // A partial pass takes distinct records, others each epoch.
  const Sampler partial = Sampler::create(100, mixed(SamplerKind::QuasiRandom, {{0, 100, 1}}, 55),
                                          std::vector<int64_t>(2, 50));
  std::set<int64_t> drawn;
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    const std::vector<int64_t> order = partial.epoch(epoch).to_vector();
    EXPECT_EQ(visits(order).size(), 55u);
    drawn.insert(order.begin(), order.end());
  }
  EXPECT_EQ(drawn.size(), 100u);
  // And each record as often as any other, whatever its piece's size: here the source begins
  // on its first chunk's last record, a piece of one record, and 1 of its 201 records is
  // drawn an epoch (a draw by whole pieces took that record a third of the time).
  const Sampler one = Sampler::create(300, mixed(SamplerKind::QuasiRandom, {{99, 201, 1}}, 1), {100, 100, 100});
  std::map<int64_t, int64_t> drawn_once;
  for (int64_t epoch = 0; epoch < 4020; ++epoch) ++drawn_once[one.epoch(epoch)[0]];
  EXPECT_LT(drawn_once[99], 50);  // 20 expected
  EXPECT_GT(drawn_once.size(), 190u);
  // A subsampled source drawn from a keyed offset of its chunks in a keyed order keeps the
  // windows' locality: 500 of 1000 records in chunks of 100 touch at most 6 chunks.
  const Sampler half = Sampler::create(1000, mixed(SamplerKind::QuasiRandom, {{0, 1000, 1}}, 500),
                                       std::vector<int64_t>(10, 100));
  std::set<int64_t> chunks_read;
  for (int64_t record : half.epoch(2).to_vector()) chunks_read.insert(record / 100);
  EXPECT_LE(chunks_read.size(), 6u);
}

// A state resumes by position in these orders (as sampler_test.cc's pinned orders for the
// plain samplers): changing them means a new LoaderState version. Version 5 kept them (they
// shuffle no run of 5 to 8 entries).
TEST(Mixture, TheOrdersOfLoaderStateVersion5AreFixed) {
  static_assert(LoaderState::kVersion == 5, "new orders: update these values with the version");
  const Sampler sampler = Sampler::create(1000, mixed(SamplerKind::Random, {{0, 10, 1}, {10, 990, 1}}, 40, 7));
  const EpochOrder order = sampler.epoch(3);
  std::vector<int64_t> first_twelve;
  for (int64_t p = 0; p < 12; ++p) first_twelve.push_back(order[p]);
  EXPECT_EQ(first_twelve, (std::vector<int64_t>{683, 154, 887, 6, 9, 494, 822, 6, 5, 3, 605, 824}));
  // Quasi-random over a mixture (chunks of 64, windows of 2): an upsampled source and a
  // subsampled one that begins mid-chunk.
  SamplerOptions quasi = mixed(SamplerKind::QuasiRandom, {{0, 100, 1}, {130, 800, 1}}, 500, 7);
  quasi.window_chunks = 2;
  std::vector<int64_t> chunks(15, 64);
  chunks.push_back(40);
  const EpochOrder quasi_order = Sampler::create(1000, quasi, chunks).epoch(3);
  std::vector<int64_t> quasi_twelve;
  for (int64_t p = 0; p < 12; ++p) quasi_twelve.push_back(quasi_order[p]);
  EXPECT_EQ(quasi_twelve, (std::vector<int64_t>{648, 662, 643, 659, 658, 655, 660, 644, 651, 2, 641, 652}));
  EXPECT_FALSE(order.shuffles_five_to_eight());
  EXPECT_FALSE(quasi_order.shuffles_five_to_eight());
  // A source of 6 records drawn 9 times an epoch: its partial pass of 3 shuffles 6 entries.
  EXPECT_TRUE(Sampler::create(100, mixed(SamplerKind::Random, {{0, 6, 1}, {6, 94, 1}}, 18)).epoch(0).shuffles_five_to_eight());
  // Drawn 12 times, two whole passes: no partial pass, nothing shuffled by the table.
  EXPECT_FALSE(Sampler::create(100, mixed(SamplerKind::Random, {{0, 6, 1}, {6, 94, 1}}, 24)).epoch(0).shuffles_five_to_eight());
}

TEST(Mixture, SourcesMayBeGivenInAnyOrderAndOverlap) {
  const Sampler sampler = Sampler::create(20, mixed(SamplerKind::Sequential, {{10, 10, 1}, {0, 15, 1}}, 4));
  EXPECT_EQ(sampler.epoch(0).to_vector(), (std::vector<int64_t>{10, 11, 0, 1}));
}

TEST(Mixture, DistributedRanksTogetherTakeTheEpochAndAResumeTakesTheRest) {
  const auto options = [](int rank, int world) {
    SamplerOptions o = mixed(SamplerKind::Random, {{0, 7, 2}, {7, 50, 1}}, 61);
    o.rank = rank;
    o.world_size = world;
    return o;
  };
  const std::vector<int64_t> global = Sampler::create(57, options(0, 1)).epoch(2).to_vector();
  // Three ranks with padding: together the epoch's positions, the first two again as padding.
  std::vector<int64_t> together;
  for (int r = 0; r < 3; ++r) {
    const std::vector<int64_t> mine = Sampler::create(57, options(r, 3)).epoch(2).rank_indices();
    EXPECT_EQ(mine.size(), 21u);
    together.insert(together.end(), mine.begin(), mine.end());
  }
  std::vector<int64_t> expected = global;
  expected.push_back(global[0]);
  expected.push_back(global[1]);
  std::sort(together.begin(), together.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(together, expected);
  // Elastic: 20 positions taken by 4 ranks, the rest by 2 ranks: the epoch's other 41.
  const int64_t consumed = Sampler::create(57, options(0, 4)).epoch(2).consumed_after(0, 5);
  ASSERT_EQ(consumed, 20);
  std::vector<int64_t> rest;
  for (int r = 0; r < 2; ++r) {
    SamplerOptions o = options(r, 2);
    o.drop_tail = true;
    const std::vector<int64_t> mine = Sampler::create(57, o).epoch(2).rank_indices(consumed);
    rest.insert(rest.end(), mine.begin(), mine.end());
  }
  std::vector<int64_t> expected_rest(global.begin() + 20, global.begin() + 60);  // 41 drop to 40
  std::sort(rest.begin(), rest.end());
  std::sort(expected_rest.begin(), expected_rest.end());
  EXPECT_EQ(rest, expected_rest);
}

TEST(Mixture, BadMixturesAreRefusedNamingTheSource) {
  const auto refuse = [](SamplerOptions options, const std::string& text) {
    EXPECT_THROW_WITH(Sampler::create(100, options), ValueError, text);
  };
  refuse(mixed(SamplerKind::Random, {}, 10), "at least one source");
  refuse(mixed(SamplerKind::Random, {{0, 50, 1}, {60, 41, 1}}, 10), "mixture source 1 (41 records from 60) is not within [0, 100)");
  refuse(mixed(SamplerKind::Random, {{-1, 5, 1}}, 10), "mixture source 0");
  refuse(mixed(SamplerKind::Random, {{0, 50, -1}}, 10), "mixture source 0 has weight -1");
  refuse(mixed(SamplerKind::Random, {{0, 50, std::nan("")}}, 10), "a weight is a finite number");
  refuse(mixed(SamplerKind::Random, {{0, 50, 0}, {50, 50, 0}}, 10), "every mixture source has weight 0, so none can fill an epoch of 10");
  refuse(mixed(SamplerKind::Random, {{0, 50, 1}, {50, 0, 1}}, 10), "mixture source 1 has weight 1");
  refuse(mixed(SamplerKind::Random, {{0, 50, 1}}, -1), "epoch_size must be >= 0");
  // Quasi-random over a source upsampled past kMaxMixturePieces pieces an epoch: 2^23 passes
  // over its two chunks, and one more piece.
  SamplerOptions quasi = mixed(SamplerKind::QuasiRandom, {{40, 20, 1}}, (int64_t{20} << 23) + 1);
  EXPECT_THROW_WITH(Sampler::create(100, quasi, {50, 50}), ValueError, "16777217 pieces of chunks an epoch");
  SamplerOptions both = mixed(SamplerKind::Random, {{0, 50, 1}}, 10);
  both.subset = IndexList{1, 2};
  refuse(both, "a subset or a mixture, not both");
  // epoch_size 0 means the sources' 50 records, which weights of 0 cannot fill; a source of
  // no records and no weight makes an empty epoch.
  refuse(mixed(SamplerKind::Random, {{0, 50, 0}}, 0), "none can fill an epoch of 50 positions");
  EXPECT_EQ(Sampler::create(100, mixed(SamplerKind::Random, {{0, 0, 0}}, 0)).epoch(0).size(), 0);
}

TEST(Mixture, TheHashFollowsWhatIsDrawnNotTheWeightsThatGaveIt) {
  const auto hash = [](std::vector<MixtureSource> sources, int64_t epoch_size) {
    return Sampler::create(100, mixed(SamplerKind::Random, std::move(sources), epoch_size)).mixture_hash();
  };
  EXPECT_EQ(Sampler::create(100, SamplerOptions{}).mixture_hash(), 0u);
  EXPECT_NE(hash({{0, 50, 1}, {50, 50, 1}}, 10), 0u);
  EXPECT_EQ(hash({{0, 50, 1}, {50, 50, 1}}, 10), hash({{0, 50, 2}, {50, 50, 2}}, 10));
  EXPECT_NE(hash({{0, 50, 1}, {50, 50, 1}}, 10), hash({{0, 50, 1}, {50, 50, 1}}, 12));
  EXPECT_NE(hash({{0, 50, 1}, {50, 50, 1}}, 10), hash({{0, 50, 2}, {50, 50, 1}}, 10));
  EXPECT_NE(hash({{0, 50, 1}, {50, 50, 1}}, 10), hash({{0, 40, 1}, {50, 50, 1}}, 10));
}

class MixtureLoaderTest : public ::testing::Test {
 protected:
  TempDir dir;
};

TEST_F(MixtureLoaderTest, OfPartsDrawsEachFileByItsWeightAndResumesMidEpoch) {
  // Two datasets of one schema: a small one (30 records) upsampled beside a larger one (200).
  const std::string small = testing::write_loader_records(dir.file("small.mmt"), 0, 30, CodecSpec::parse("lz4"), 8);
  const std::string large = testing::write_loader_records(dir.file("large.mmt"), 0, 200, {}, 16);
  const Dataset dataset = Dataset::open_concat({small, large});
  LoaderOptions options;
  options.batch_size = 16;
  options.num_workers = 2;
  options.sampler.kind = SamplerKind::Random;
  options.sampler.seed = 9;
  options.sampler.mixture = Mixture::of_parts(dataset, {0.5, 0.5}, 120);
  EXPECT_EQ(options.sampler.mixture->sources[1].first_record, 30);
  Loader loader(dataset, options);
  EXPECT_EQ(loader.batches_in_epoch(), 8);  // 120 positions in batches of 16
  std::vector<int64_t> reference;
  while (std::optional<Batch> batch = loader.next()) {
    testing::expect_batch_matches_dataset(*batch, dataset, {"x", "label", "image", "tokens"});
    reference.insert(reference.end(), batch->indices().begin(), batch->indices().end());
  }
  EXPECT_EQ(in_range(reference, 0, 30), 60);  // each of the small file's records twice
  EXPECT_EQ(in_range(reference, 30, 200), 60);
  for (int64_t r = 0; r < 30; ++r) EXPECT_EQ(visits(reference)[r], 2) << r;

  // Resume after 3 batches: the rest of the same epoch.
  Loader first(dataset, options);
  std::vector<int64_t> seen = testing::take_batches(first, 3);
  const LoaderState state = LoaderState::parse(first.state().to_string());
  EXPECT_EQ(state.mixture_size, 120);
  EXPECT_EQ(state.consumed, 48);
  EXPECT_NE(first.state().to_string().find("\"version\":4"), std::string::npos) << first.state().to_string();
  Loader resumed(dataset, options, state);
  const std::vector<int64_t> rest = drain_epoch(resumed);
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, reference);

  // Another mixture, or none, is refused; weights giving the same counts resume.
  LoaderOptions other = options;
  other.sampler.mixture = Mixture::of_parts(dataset, {0.25, 0.75}, 120);
  EXPECT_THROW_WITH(Loader(dataset, other, state), ValueError,
                    "saved with a mixture of 120 positions an epoch");
  LoaderOptions none = options;
  none.sampler.mixture.reset();
  EXPECT_THROW_WITH(Loader(dataset, none, state), ValueError, "but the options give no mixture");
  LoaderOptions scaled = options;
  scaled.sampler.mixture = Mixture::of_parts(dataset, {2, 2}, 120);
  Loader from_scaled(dataset, scaled, state);
  EXPECT_EQ(drain_epoch(from_scaled), rest);
  EXPECT_THROW_WITH(Mixture::of_parts(dataset, {1}), ValueError, "1 weight(s) for the 2 part(s)");
}

TEST_F(MixtureLoaderTest, QuasiRandomOverPartsDecodesEachChunkOfAPassOnceAndResumes) {
  // Two lz4 files of chunks of 8 records; the small one upsampled twice.
  const std::string small = testing::write_loader_records(dir.file("small.mmt"), 0, 32, CodecSpec::parse("lz4"), 8);
  const std::string large = testing::write_loader_records(dir.file("large.mmt"), 0, 160, CodecSpec::parse("lz4"), 8);
  const Dataset dataset = Dataset::open_concat({small, large});
  LoaderOptions options;
  options.batch_size = 8;
  options.num_workers = 2;
  options.sampler.kind = SamplerKind::QuasiRandom;
  options.sampler.window_chunks = 2;
  options.sampler.seed = 5;
  options.sampler.mixture = Mixture::of_parts(dataset, {64, 160}, 224);  // small twice, large once: whole chunks
  Loader loader(dataset, options);
  std::vector<int64_t> reference;
  while (std::optional<Batch> batch = loader.next()) {
    testing::expect_batch_matches_dataset(*batch, dataset, {"x", "label", "image", "tokens"});
    reference.insert(reference.end(), batch->indices().begin(), batch->indices().end());
  }
  ASSERT_EQ(reference.size(), 224u);
  for (int64_t r = 0; r < 32; ++r) EXPECT_EQ(visits(reference)[r], 2) << r;
  EXPECT_EQ(in_range(reference, 32, 160), 160);
  // Every 16 positions (a window of two 8-record pieces) read at most two chunks.
  for (size_t w = 0; w < reference.size(); w += 16) {
    std::set<int64_t> chunks;
    for (size_t p = w; p < w + 16; ++p) chunks.insert(reference[p] / 8);
    EXPECT_LE(chunks.size(), 2u) << w;
  }
  Loader first(dataset, options);
  std::vector<int64_t> seen = testing::take_batches(first, 5);
  Loader resumed(dataset, options, LoaderState::parse(first.state().to_string()));
  const std::vector<int64_t> rest = drain_epoch(resumed);
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, reference);
}

TEST(MixtureState, ParseChecksTheMixtureEntries) {
  LoaderState state;
  state.sampler = SamplerKind::Random;
  state.records = 100;
  state.consumed = 150;
  state.mixture_hash = 0x1234;
  state.mixture_size = 200;
  const std::string text = state.to_string();
  EXPECT_NE(text.find("\"version\":4"), std::string::npos) << text;
  EXPECT_EQ(LoaderState::parse(text), state);  // consumed counts the mixture's positions
  const auto refuse = [](const std::string& text, const std::string& why) {
    EXPECT_THROW_WITH(LoaderState::parse(text), ValueError, why);
  };
  const std::string base = R"({"sampler":"random","seed":"0x0000000000000000","window_chunks":0,"records":100,"epoch":0,)";
  refuse(base + R"("consumed":0,"version":3,"mixture_hash":"0x0000000000001234","mixture_size":200})",
         "cannot name a mixture");
  refuse(base + R"("consumed":0,"version":4,"mixture_size":200})", "missing, yet 'mixture_size' is there");
  refuse(base + R"("consumed":201,"version":4,"mixture_hash":"0x0000000000001234","mixture_size":200})",
         "outside [0, mixture_size=200]");
  refuse(base + R"("consumed":0,"version":4,"mixture_hash":"0x0000000000001234","mixture_size":200,)"
                R"("subset_hash":"0x0000000000000001","subset_size":3})",
         "a subset or a mixture, not both");
}

}  // namespace
}  // namespace mmt
