// Dataset as a range of its samples: range-for, std::ranges algorithms and views, iterator
// arithmetic, empty and compressed files, and samples that outlive the Dataset.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <ranges>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;

static_assert(std::random_access_iterator<Dataset::iterator>);
static_assert(std::sized_sentinel_for<Dataset::iterator, Dataset::iterator>);
static_assert(std::ranges::random_access_range<const Dataset&>);
static_assert(std::ranges::random_access_range<Dataset&>);
static_assert(std::ranges::sized_range<const Dataset&>);
static_assert(std::ranges::common_range<const Dataset&>);
static_assert(std::ranges::viewable_range<const Dataset&>);
static_assert(std::same_as<std::ranges::range_reference_t<const Dataset&>, Sample>);  // by value, as get()
static_assert(std::same_as<std::ranges::range_value_t<const Dataset&>, Sample>);
// A pointer and an index: as cheap to copy as an index.
static_assert(sizeof(Dataset::iterator) == sizeof(const Dataset*) + sizeof(int64_t));
static_assert(std::is_trivially_copyable_v<Dataset::iterator>);

const Schema& test_schema() {
  static const Schema schema({Field::fixed("image", kUInt8, {2, 3}), Field::ragged("tokens", kInt32, {kVariableDim}),
                              Field::fixed("label", kInt64, {})});
  return schema;
}

// Record i: image elements (i + k) % 251, i % 4 tokens of value i, label 7 * i.
std::string write_records(const std::string& path, int64_t records, const char* codec, int64_t chunk_records) {
  WriterOptions options;
  options.codec = CodecSpec::parse(codec);
  options.chunk_records = chunk_records;
  options.overwrite = true;
  DatasetWriter writer = DatasetWriter::create(path, test_schema(), options);
  for (int64_t i = 0; i < records; ++i) {
    Tensor image = empty({2, 3}, kUInt8);
    for (int64_t k = 0; k < 6; ++k) image.mutable_data_ptr<uint8_t>()[k] = static_cast<uint8_t>((i + k) % 251);
    Tensor tokens = full({i % 4}, static_cast<int32_t>(i), kInt32);
    writer.append({image, tokens, scalar_tensor(int64_t{7} * i)});
  }
  writer.finish();
  return path;
}

void expect_same_sample(const Sample& got, const Sample& expected) {
  ASSERT_EQ(got.index(), expected.index());
  ASSERT_EQ(got.size(), expected.size());
  for (size_t f = 0; f < got.size(); ++f) {
    EXPECT_EQ(got[f].sizes(), expected[f].sizes()) << "record " << got.index() << " field " << f;
    EXPECT_TRUE(got[f].equal(expected[f])) << "record " << got.index() << " field " << f;
  }
}

TEST(DatasetRangeTest, RangeForGivesGetOfEveryIndexAsViews) {
  TempDir dir;
  // Fixed fields only (the contiguous path) and with a ragged field (chunked), uncompressed.
  const Schema fixed_schema({Field::fixed("x", kFloat32, {4})});
  {
    DatasetWriter writer = DatasetWriter::create(dir.file("f.mmt"), fixed_schema, {});
    for (int64_t i = 0; i < 9; ++i) writer.append({full({4}, static_cast<float>(i), kFloat32)});
    writer.finish();
  }
  for (const std::string& path : {dir.file("f.mmt"), write_records(dir.file("r.mmt"), 23, "none", 5)}) {
    const Dataset ds = Dataset::open(path);
    int64_t i = 0;
    for (Sample s : ds) {
      const Sample expected = ds.get(i);
      expect_same_sample(s, expected);
      for (size_t f = 0; f < s.size(); ++f) {  // the same bytes of the mapping, not a copy
        EXPECT_EQ(s[f].data_ptr(), expected[f].data_ptr()) << path << " record " << i;
        EXPECT_EQ(s[f].untyped_storage().filename(), ds.path());
      }
      ++i;
    }
    EXPECT_EQ(i, ds.size()) << path;
  }
}

TEST(DatasetRangeTest, RangesAlgorithms) {
  TempDir dir;
  const Dataset ds = Dataset::open(write_records(dir.file("a.mmt"), 40, "none", 8));
  EXPECT_EQ(std::ranges::size(ds), 40u);
  EXPECT_EQ(std::ranges::distance(ds), 40);
  EXPECT_FALSE(std::ranges::empty(ds));
  const auto label = [](const Sample& s) { return s["label"].item<int64_t>(); };
  // Records with no tokens: every fourth one.
  EXPECT_EQ(std::ranges::count_if(ds, [](const Sample& s) { return s["tokens"].numel() == 0; }), 10);
  const auto found = std::ranges::find_if(ds, [&](const Sample& s) { return label(s) == 7 * 33; });
  ASSERT_NE(found, ds.end());
  EXPECT_EQ(found.index(), 33);
  EXPECT_EQ(found - ds.begin(), 33);
  EXPECT_EQ(std::ranges::find(ds, 20, &Sample::index).index(), 20);
  EXPECT_TRUE(std::ranges::all_of(ds, [](const Sample& s) { return s["image"].sizes() == IntArrayRef({2, 3}); }));
  std::vector<int64_t> labels;
  std::ranges::transform(std::ranges::next(ds.begin(), 36), ds.end(), std::back_inserter(labels), label);
  EXPECT_EQ(labels, (std::vector<int64_t>{252, 259, 266, 273}));
  // Random access: the sample halfway, without walking there.
  EXPECT_EQ((*std::ranges::next(ds.begin(), 25)).index(), 25);
}

// Clang before 15 cannot compile libstdc++ 12's views over any range (std::vector's neither).
#if !defined(__clang__) || __clang_major__ >= 15
TEST(DatasetRangeTest, RangesViews) {
  TempDir dir;
  const Dataset ds = Dataset::open(write_records(dir.file("v.mmt"), 40, "none", 8));
  std::vector<int64_t> seen;
  for (const Sample& s : ds | std::views::drop(10) | std::views::take(5)) seen.push_back(s.index());
  EXPECT_EQ(seen, (std::vector<int64_t>{10, 11, 12, 13, 14}));

  seen.clear();
  for (const Sample& s : ds | std::views::reverse | std::views::take(3)) seen.push_back(s.index());
  EXPECT_EQ(seen, (std::vector<int64_t>{39, 38, 37}));

  const auto label = [](const Sample& s) { return s["label"].item<int64_t>(); };
  std::vector<int64_t> labels;
  std::ranges::copy(ds | std::views::transform(label) | std::views::take(4), std::back_inserter(labels));
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 7, 14, 21}));
  EXPECT_EQ((ds | std::views::drop(30))[2].index(), 32);
  EXPECT_EQ(std::ranges::size(ds | std::views::drop(35)), 5u);

  // A range built on a temporary handle owns it (std::views::all of an rvalue).
  seen.clear();
  for (const Sample& s : Dataset::open(ds.path()) | std::views::drop(38)) seen.push_back(s.index());
  EXPECT_EQ(seen, (std::vector<int64_t>{38, 39}));
}
#endif

TEST(DatasetRangeTest, EmptyDatasetAndEmptyHandle) {
  TempDir dir;
  const Dataset ds = Dataset::open(write_records(dir.file("e.mmt"), 0, "none", 0));
  EXPECT_EQ(ds.begin(), ds.end());
  EXPECT_TRUE(std::ranges::empty(ds));
  int visits = 0;
  for (const Sample& s : ds) visits += static_cast<int>(s.size());
  EXPECT_EQ(visits, 0);
  EXPECT_THROW_WITH(*ds.begin(), IndexError, "dereferenced at position 0 of a dataset of 0 records (valid: none");

  // A handle that was never opened throws as every accessor does, not a silent empty range.
  const Dataset closed;
  EXPECT_THROW_WITH(closed.begin(), ValueError, "this Dataset is empty");
  EXPECT_THROW_WITH(closed.end(), ValueError, "this Dataset is empty");
  EXPECT_THROW_WITH(*Dataset::iterator(), ValueError, "default-constructed");
}

TEST(DatasetRangeTest, CompressedDatasetGivesTheSameSamples) {
  TempDir dir;
  for (const char* codec : {"lz4", "zstd"}) {
    ReaderOptions reader;
    reader.cache_bytes = 200;  // about one chunk: every chunk is evicted as the scan moves on
    const Dataset ds = Dataset::open(write_records(dir.file("c.mmt"), 30, codec, 4), reader);
    std::vector<Sample> samples(ds.begin(), ds.end());  // a C++17 constructor: an input iterator
    ASSERT_EQ(samples.size(), 30u) << codec;
    for (int64_t i = 0; i < 30; ++i) expect_same_sample(samples[static_cast<size_t>(i)], ds.get(i));
    // Held samples keep their decoded chunks alive past eviction.
    EXPECT_GT(ds.cache_stats().evictions, 0) << codec;
    EXPECT_EQ(samples[1]["label"].item<int64_t>(), 7);
    EXPECT_EQ(samples[29]["tokens"].to_vector<int32_t>(), std::vector<int32_t>({29}));
  }
}

TEST(DatasetRangeTest, IteratorArithmeticAndComparisons) {
  TempDir dir;
  const Dataset ds = Dataset::open(write_records(dir.file("i.mmt"), 12, "none", 5));
  const Dataset::iterator begin = ds.begin(), end = ds.end();
  EXPECT_EQ(end - begin, 12);
  EXPECT_EQ(begin - end, -12);
  Dataset::iterator it = begin + 3;
  EXPECT_EQ(it.index(), 3);
  EXPECT_EQ((3 + begin).index(), 3);
  EXPECT_EQ((end - 2).index(), 10);
  EXPECT_EQ((*it).index(), 3);
  EXPECT_EQ(it[4].index(), 7);
  EXPECT_EQ(it[-3].index(), 0);
  it += 5;
  EXPECT_EQ((*it).index(), 8);
  it -= 6;
  EXPECT_EQ(it.index(), 2);
  EXPECT_EQ((it++).index(), 2);
  EXPECT_EQ(it.index(), 3);
  EXPECT_EQ((++it).index(), 4);
  EXPECT_EQ((it--).index(), 4);
  EXPECT_EQ((--it).index(), 2);

  EXPECT_TRUE(begin < it && it <= it && it > begin && end >= it);
  EXPECT_TRUE(it != begin && it == begin + 2);
  EXPECT_EQ(begin <=> end, std::strong_ordering::less);
  EXPECT_EQ(end <=> end, std::strong_ordering::equal);
  EXPECT_EQ(Dataset::iterator(), Dataset::iterator());  // value-initialised iterators compare equal

  // Moving outside the range is arithmetic; dereferencing there is an IndexError, and before
  // begin() is not read as an index from the end.
  EXPECT_THROW_WITH(*end, IndexError, "dereferenced at position 12 of a dataset of 12 records (valid: 0..11");
  EXPECT_THROW_WITH(begin[-1], IndexError, "position -1");
  EXPECT_THROW_WITH(*(begin - 1), IndexError, "position -1");
  EXPECT_EQ((end - 1)[0].index(), 11);
}

TEST(DatasetRangeTest, ASampleFromAnIteratorOutlivesTheDataset) {
  TempDir dir;
  for (const char* codec : {"none", "zstd"}) {
    const std::string path = write_records(dir.file("o.mmt"), 10, codec, 3);
    Sample kept;
    {
      Dataset ds = Dataset::open(path);
      auto it = ds.begin() + 6;
      kept = *it;
    }  // the handle, its iterators, and its chunk cache are gone; the sample's storage is not
    EXPECT_EQ(kept.index(), 6) << codec;
    EXPECT_EQ(kept["label"].item<int64_t>(), 42) << codec;
    EXPECT_EQ(kept["tokens"].to_vector<int32_t>(), std::vector<int32_t>({6, 6})) << codec;
    EXPECT_EQ(kept["image"].at<uint8_t>({1, 2}), 11) << codec;
  }
}

}  // namespace
}  // namespace mmt
