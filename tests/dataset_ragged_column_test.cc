// Dataset::ragged_column: a range of a ragged field's records packed as values + offsets +
// shapes, as a token stream is read in order. Inside one chunk the values are a view into
// the chunk; across chunks, or for a field stored in another order, a copy. And
// Dataset::get_ragged_batch: any records, packed the same way.
#include <gtest/gtest.h>

#include <numeric>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;

constexpr int64_t kDocs = 300;

int64_t doc_length(int64_t i) { return (i * 37) % 50; }  // 0..49 tokens, zero-length ones too

// "tokens" int32 [-1]: document i holds i * 1000 + k for k < doc_length(i); "id" int64 = i.
std::string write_tokens(const TempDir& dir, const std::string& codec, int64_t chunk_records) {
  WriterOptions options;
  options.codec = CodecSpec::parse(codec);
  options.chunk_records = chunk_records;
  const std::string path = dir.file("tokens-" + codec + ".mmt");
  DatasetWriter writer = DatasetWriter::create(
      path, Schema({Field::ragged("tokens", kInt32, {kVariableDim}), Field::fixed("id", kInt64, {})}), options);
  for (int64_t i = 0; i < kDocs; ++i) {
    std::vector<int32_t> tokens(static_cast<size_t>(doc_length(i)));
    for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = static_cast<int32_t>(i * 1000 + static_cast<int64_t>(k));
    writer.append({tensor(tokens).view({static_cast<int64_t>(tokens.size())}), full({}, static_cast<double>(i), kInt64)});
  }
  writer.finish();
  return path;
}

// What ragged_column must equal: get(i) of every record, flattened and concatenated.
void expect_matches_get(const Dataset& ds, const RaggedBatch& packed, const char* field, int64_t start,
                        int64_t stop) {
  const std::vector<int64_t> offsets = packed.offsets.to_vector<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(offsets.size()), stop - start + 1);
  ASSERT_EQ(packed.values.dim(), 1);
  ASSERT_EQ(packed.values.size(0), offsets.back());
  ASSERT_EQ(packed.shapes.size(0), stop - start);
  for (int64_t i = start; i < stop; ++i) {
    const Tensor expected = ds.get(i, field);
    const int64_t row = i - start;
    const Tensor got = packed.values.narrow(0, offsets[row], offsets[row + 1] - offsets[row]);
    EXPECT_TRUE(got.equal(expected.contiguous().flatten())) << "record " << i;
    EXPECT_EQ(packed.shapes.select(0, row).to_vector<int64_t>(),
              std::vector<int64_t>(expected.sizes().begin(), expected.sizes().end()))
        << "record " << i;
  }
}

class RaggedColumn : public ::testing::TestWithParam<const char*> {
 protected:
  TempDir dir;
};

TEST_P(RaggedColumn, ARangeInsideOneChunkIsAViewIntoThatChunk) {
  const Dataset ds = Dataset::open(write_tokens(dir, GetParam(), 64));
  const ChunkInfo chunk = ds.chunk(1);  // records [64, 128)
  const RaggedBatch packed = ds.ragged_column("tokens", chunk.first_record + 3, chunk.first_record + 40);
  expect_matches_get(ds, packed, "tokens", chunk.first_record + 3, chunk.first_record + 40);
  // The view starts where get() of its first record points: no copy was made.
  const Tensor first = ds.get(chunk.first_record + 3, "tokens");
  EXPECT_TRUE(packed.values.untyped_storage().is_same(first.untyped_storage()));
  EXPECT_EQ(packed.values.data_ptr(), first.data_ptr());
  if (std::string(GetParam()) == "none") {
    EXPECT_EQ(packed.values.untyped_storage().filename(), ds.path());
  }
}

TEST_P(RaggedColumn, ARangeAcrossChunksIsACopyOfTheSameValues) {
  const Dataset ds = Dataset::open(write_tokens(dir, GetParam(), 64));
  for (auto [start, stop] : {std::pair<int64_t, int64_t>{50, 200}, {0, kDocs}, {63, 65}, {10, 10}, {kDocs, kDocs}}) {
    SCOPED_TRACE(::testing::Message() << "[" << start << ", " << stop << ")");
    const RaggedBatch packed = ds.ragged_column("tokens", start, stop);
    expect_matches_get(ds, packed, "tokens", start, stop);
    EXPECT_EQ(packed.values.dtype(), kInt32);
  }
  int64_t all_tokens = 0;
  for (int64_t i = 0; i < kDocs; ++i) all_tokens += doc_length(i);
  EXPECT_EQ(ds.ragged_column("tokens", 0, kDocs).offsets.to_vector<int64_t>().back(), all_tokens);
}

TEST_P(RaggedColumn, ReadingChunkByChunkGivesEveryTokenOnce) {
  // The streaming idiom: one view per chunk, nothing copied.
  const Dataset ds = Dataset::open(write_tokens(dir, GetParam(), 64));
  std::vector<int32_t> stream;
  for (int64_t c = 0; c < ds.num_chunks(); ++c) {
    const ChunkInfo chunk = ds.chunk(c);
    const RaggedBatch packed = ds.ragged_column("tokens", chunk.first_record, chunk.first_record + chunk.record_count);
    const std::vector<int32_t> values = packed.values.to_vector<int32_t>();
    stream.insert(stream.end(), values.begin(), values.end());
  }
  std::vector<int32_t> expected;
  for (int64_t i = 0; i < kDocs; ++i)
    for (int64_t k = 0; k < doc_length(i); ++k) expected.push_back(static_cast<int32_t>(i * 1000 + k));
  EXPECT_EQ(stream, expected);
}

INSTANTIATE_TEST_SUITE_P(Codecs, RaggedColumn, ::testing::Values("none", "lz4", "zstd"));

TEST(RaggedColumnLayout, AFieldStoredInAnotherOrderComesBackInLogicalOrder) {
  // [3, -1] stored as [-1, 3] (column-major): values are packed row-major, as the Loader packs them.
  TempDir dir;
  const std::string path = dir.file("planes.mmt");
  Field planes = Field::ragged("planes", kFloat32, {3, kVariableDim});
  planes.with_storage_order({1, 0});
  {
    DatasetWriter writer = DatasetWriter::create(path, Schema({planes}), WriterOptions{});
    for (int64_t i = 0; i < 20; ++i) writer.append({arange(i * 100, i * 100 + 3 * (i % 5), 1, kFloat32).view({3, i % 5})});
    writer.finish();
  }
  const Dataset ds = Dataset::open(path);
  ASSERT_FALSE(ds.get(2, "planes").is_contiguous());
  const RaggedBatch packed = ds.ragged_column("planes", 1, 9);
  expect_matches_get(ds, packed, "planes", 1, 9);
  EXPECT_EQ(packed.shapes.select(0, 1).to_vector<int64_t>(), (std::vector<int64_t>{3, 2}));
  // A batch of the same records in order packs the same way.
  std::vector<int64_t> indices(8);
  std::iota(indices.begin(), indices.end(), int64_t{1});
  const RaggedBatch batch = ds.get_ragged_batch(indices, "planes");
  EXPECT_TRUE(batch.values.equal(packed.values));
  EXPECT_TRUE(batch.offsets.equal(packed.offsets));
  EXPECT_TRUE(batch.shapes.equal(packed.shapes));
}

TEST(RaggedColumnErrors, AFixedFieldABadRangeAndAnUnknownFieldAreRefused) {
  TempDir dir;
  const Dataset ds = Dataset::open(write_tokens(dir, "none", 64));
  EXPECT_THROW_WITH(ds.ragged_column("id", 0, 10), ValueError, "read it with column()");
  EXPECT_THROW_WITH(ds.ragged_column("tokens", 5, 4), IndexError, "0 <= start <= stop <= 300");
  EXPECT_THROW_WITH(ds.ragged_column("tokens", -1, 4), IndexError, "0 <= start <= stop <= 300");
  EXPECT_THROW_WITH(ds.ragged_column("tokens", 0, kDocs + 1), IndexError, "0 <= start <= stop <= 300");
  EXPECT_THROW_WITH(ds.ragged_column("nope", 0, 1), ValueError, "unknown field 'nope'; the schema has 'tokens', 'id'");
  EXPECT_THROW_WITH(ds.column("tokens"), ValueError, "ragged_column()");
}

// get_ragged_batch: records in any order, packed as a range is.
TEST_P(RaggedColumn, ABatchOfAnyRecordsIsPackedAsARangeIs) {
  const Dataset ds = Dataset::open(write_tokens(dir, GetParam(), 64));
  const std::vector<int64_t> indices{299, 0, 17, 17, -1, 150, 1, 64};  // repeats, negatives, across chunks
  const RaggedBatch batch = ds.get_ragged_batch(indices, "tokens");
  const std::vector<int64_t> offsets = batch.offsets.to_vector<int64_t>();
  ASSERT_EQ(offsets.size(), indices.size() + 1);
  for (size_t b = 0; b < indices.size(); ++b) {
    const Tensor expected = ds.get(indices[b], "tokens");
    EXPECT_TRUE(batch.values.narrow(0, offsets[b], offsets[b + 1] - offsets[b]).equal(expected)) << b;
    EXPECT_EQ(batch.shapes.select(0, static_cast<int64_t>(b)).to_vector<int64_t>(), std::vector<int64_t>{expected.size(0)});
  }
  EXPECT_EQ(ds.get_ragged_batch(std::vector<int64_t>{}, "tokens").offsets.to_vector<int64_t>(), std::vector<int64_t>{0});
}

TEST(RaggedBatchErrors, AFixedFieldAndABadIndexAreRefused) {
  TempDir dir;
  const Dataset ds = Dataset::open(write_tokens(dir, "none", 64));
  const std::vector<int64_t> in_range{1, 2};
  EXPECT_THROW_WITH(ds.get_ragged_batch(in_range, "id"), ValueError, "gather it with get_batch()");
  EXPECT_THROW(ds.get_ragged_batch(std::vector<int64_t>{1, kDocs}, "tokens"), IndexError);
  EXPECT_THROW_WITH(ds.get_ragged_batch(in_range, "nope"), ValueError, "unknown field 'nope'");
}

}  // namespace
}  // namespace mmt
