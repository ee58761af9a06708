// Several dataset files read as one (Dataset::open_concat, Dataset::concat): every accessor
// of a concatenation of shards gives what the same records packed into one file give, the
// loader runs, samples and resumes over it, and parts that do not belong together are
// refused with the part and the difference named.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "loader_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/loader.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;

using testing::kThreadSanitizer;

// Records [begin, end) of write_loader_records' numbering, so that shards of [0, N) and one
// file of [0, N) hold the same records.
std::string write_range(const std::string& path, int64_t begin, int64_t end, const char* codec = "none",
                        int64_t chunk_records = 8, Metadata metadata = {}) {
  return testing::write_loader_records(path, begin, end, CodecSpec::parse(codec), chunk_records, std::move(metadata));
}

// Shards of [0, 100) (one of them empty) and the same records in one file.
struct Shards {
  static constexpr int64_t kRecords = 100;
  std::vector<std::string> paths;
  std::string whole;

  Shards(const TempDir& dir, const char* codec, int64_t chunk_records = 8) {
    const std::vector<int64_t> bounds = {0, 37, 37, 87, 100};  // part 1 is empty
    for (size_t p = 0; p + 1 < bounds.size(); ++p)
      paths.push_back(write_range(dir.file("shard" + std::to_string(p) + ".mmt"), bounds[p], bounds[p + 1], codec,
                                  chunk_records));
    whole = write_range(dir.file("whole.mmt"), 0, kRecords, codec, chunk_records);
  }
};

void expect_same_tensor(const Tensor& got, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(got.equal(expected)) << what;
}

void expect_same_ragged(const RaggedBatch& got, const RaggedBatch& expected, const std::string& what) {
  expect_same_tensor(got.values, expected.values, what + " values");
  expect_same_tensor(got.offsets, expected.offsets, what + " offsets");
  expect_same_tensor(got.shapes, expected.shapes, what + " shapes");
}

class DatasetConcatTest : public ::testing::TestWithParam<const char*> {
 protected:
  TempDir dir;
};

TEST_P(DatasetConcatTest, SamplesChunksAndLookupsMatchOneFile) {
  const Shards shards(dir, GetParam());
  const Dataset ds = Dataset::open_concat(shards.paths);
  const Dataset whole = Dataset::open(shards.whole);
  ASSERT_EQ(ds.size(), Shards::kRecords);
  EXPECT_EQ(ds.schema(), whole.schema());
  EXPECT_EQ(ds.parts().size(), 4u);
  EXPECT_EQ(ds.path(), shards.paths[0] + ", " + shards.paths[1] + ", " + shards.paths[2] + ", " + shards.paths[3]);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const Sample got = ds.get(i), expected = whole.get(i);
    ASSERT_EQ(got.index(), i);
    for (size_t f = 0; f < got.size(); ++f)
      expect_same_tensor(got[f], expected[f], "record " + std::to_string(i) + " field " + std::to_string(f));
    expect_same_tensor(ds.get(i, "tokens"), whole.get(i, "tokens"), "get(i, field) " + std::to_string(i));
  }
  EXPECT_EQ(ds.get(-1).index(), 99);
  EXPECT_EQ(ds.get(-1)["label"].item<int64_t>(), 99);
  // Where each record lives: part 1 is empty, so record 37 is part 2's first.
  EXPECT_EQ(ds.locate(36).part, 0u);
  EXPECT_EQ(ds.locate(36).index, 36);
  EXPECT_EQ(ds.locate(37).part, 2u);
  EXPECT_EQ(ds.locate(37).index, 0);
  EXPECT_EQ(ds.locate(-1).part, 3u);
  EXPECT_EQ(ds.locate(-1).index, 12);
  EXPECT_THROW_WITH(ds.get(100), IndexError, "record index 100 is out of range for a dataset of 100 records in 4 parts");
  EXPECT_THROW_WITH(ds.get(-101), IndexError, "valid: -100..99");
  EXPECT_THROW_WITH(ds.get(0, "nope"), ValueError, "'label'");
  // Chunks are numbered across the parts, and tile the records in order.
  int64_t chunks = 0;
  for (const Dataset& part : ds.parts()) chunks += part.num_chunks();
  ASSERT_EQ(ds.num_chunks(), chunks);
  int64_t next_first = 0;
  for (int64_t c = 0; c < ds.num_chunks(); ++c) {
    const ChunkInfo chunk = ds.chunk(c);
    EXPECT_EQ(chunk.index, c);
    EXPECT_EQ(chunk.first_record, next_first) << "chunk " << c;
    // Its part, and where in that part's file it lies.
    const Dataset::Location at = ds.locate(chunk.first_record);
    ASSERT_EQ(chunk.part, static_cast<int64_t>(at.part)) << "chunk " << c;
    const Dataset part = ds.parts()[at.part];
    EXPECT_EQ(chunk.file_offset, part.chunk(part.chunk_of(at.index)).file_offset) << "chunk " << c;
    for (int64_t r = chunk.first_record; r < chunk.first_record + chunk.record_count; ++r)
      ASSERT_EQ(ds.chunk_of(r), c) << "record " << r;
    next_first += chunk.record_count;
  }
  EXPECT_EQ(next_first, ds.size());
  EXPECT_THROW_WITH(ds.chunk(chunks), IndexError, "out of range");
  // info() adds the parts up.
  const DatasetInfo info = ds.info();
  EXPECT_EQ(info.records, 100);
  EXPECT_EQ(info.chunks, chunks);
  EXPECT_EQ(info.part_count, 4);
  EXPECT_FALSE(info.codecs_differ);
  EXPECT_EQ(ds.parts()[1].info().part_count, 1);
  int64_t file_bytes = 0;
  for (const std::string& path : shards.paths) file_bytes += static_cast<int64_t>(std::filesystem::file_size(path));
  EXPECT_EQ(info.file_bytes, file_bytes);
  int64_t decoded_bytes = 0;
  for (const Dataset& part : ds.parts()) decoded_bytes += part.info().decoded_bytes;
  EXPECT_EQ(info.decoded_bytes, decoded_bytes);
  // As a range: every sample in order.
  int64_t expected_index = 0;
  for (const Sample& sample : ds) EXPECT_EQ(sample.index(), expected_index++);
  EXPECT_EQ(expected_index, 100);
  ds.verify();
}

TEST_P(DatasetConcatTest, BatchesSpreadOverPartsMatchOneFile) {
  const Shards shards(dir, GetParam());
  const Dataset ds = Dataset::open_concat(shards.paths);
  const Dataset whole = Dataset::open(shards.whole);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> pick(-100, 99);
  const std::vector<std::string> fields = {"x", "label", "image"};
  for (int threads : {1, 2}) {
    for (int64_t batch : {1, 5, 64, 300}) {
      std::vector<int64_t> indices(static_cast<size_t>(batch));
      for (int64_t& i : indices) i = pick(rng);  // repeats and negative indices included
      for (const std::string& field : fields)
        expect_same_tensor(ds.get_batch(indices, field, threads), whole.get_batch(indices, field, threads),
                           field + " batch " + std::to_string(batch) + " threads " + std::to_string(threads));
      // Several fields at once, into views of one buffer (its columns, not contiguous).
      Tensor both = empty({batch, 2}, kInt64);
      Tensor label_a = both.select(1, 0), label_b = both.select(1, 1);
      const std::vector<std::string> twice = {"label", "label"};
      ds.get_batch(indices, twice, std::vector<Tensor>{label_a, label_b}, threads);
      expect_same_tensor(label_a, whole.get_batch(indices, "label"), "label into a column");
      expect_same_tensor(label_b, label_a, "the second column");
      expect_same_ragged(ds.get_ragged_batch(indices, "tokens"), whole.get_ragged_batch(indices, "tokens"),
                         "tokens batch " + std::to_string(batch));
    }
  }
  // A batch inside one part, and one made of one record of each non-empty part.
  const std::vector<int64_t> inside = {40, 41, 86, 37};
  expect_same_tensor(ds.get_batch(inside, "image"), whole.get_batch(inside, "image"), "inside part 2");
  const std::vector<int64_t> each = {99, 0, 50};
  expect_same_tensor(ds.get_batch(each, "x", 2), whole.get_batch(each, "x"), "one of each part");
  // Bad input: nothing is written.
  const std::vector<int64_t> bad = {0, 50, 100};
  Tensor out = zeros({3}, kInt64);
  EXPECT_THROW_WITH(ds.get_batch(bad, "label", out), IndexError, "record index 100 is out of range");
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_THROW_WITH(ds.get_batch(each, "label", zeros({2}, kInt64)), ValueError, "needs an output of shape [3]");
  EXPECT_THROW_WITH(ds.get_batch(std::vector<int64_t>{}, "label", zeros({2}, kInt64)), ValueError,
                    "needs an output of shape [0]");
  EXPECT_THROW_WITH(ds.get_batch(each, "tokens"), ValueError, "is ragged");
  EXPECT_THROW_WITH(ds.get_batch(each, "label", 0), ValueError, "threads must be >= 1");
  EXPECT_THROW_WITH(ds.get_ragged_batch(each, "x"), ValueError, "fixed shape");
  ds.prefetch(each);
  ds.prefetch(each, std::vector<std::string>{"image"});
  EXPECT_THROW_WITH(ds.prefetch(each, std::vector<std::string>{"nope"}), ValueError, "'label'");
}

// Whatever ReaderOptions::read_ahead says (one decision for the whole batch over the parts,
// the parts' own read-ahead left out), a batch is what one file gives, and a bad index
// writes nothing.
TEST_P(DatasetConcatTest, BatchesMatchOneFileUnderEveryReadAhead) {
  const Shards shards(dir, GetParam());
  const Dataset whole = Dataset::open(shards.whole);
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<int64_t> pick(-100, 99);
  for (ReadAhead read_ahead : {ReadAhead::Auto, ReadAhead::Always, ReadAhead::Never}) {
    ReaderOptions options;
    options.read_ahead = read_ahead;
    const Dataset ds = Dataset::open_concat(shards.paths, options);
    for (int round = 0; round < 12; ++round)
      for (int threads : {1, 2}) {
        std::vector<int64_t> indices(static_cast<size_t>(1 + round * 29));
        for (int64_t& i : indices) i = pick(rng);
        const std::string what = "round " + std::to_string(round) + " threads " + std::to_string(threads);
        expect_same_tensor(ds.get_batch(indices, "image", threads), whole.get_batch(indices, "image"), what);
        expect_same_tensor(ds.get_batch(indices, "label", threads), whole.get_batch(indices, "label"), what);
      }
    for (const Dataset& part : ds.parts())
      EXPECT_EQ(part.read_ahead_stats().batches_read_ahead, 0) << "a part hinted its own share of a batch";
    EXPECT_EQ(ds.read_ahead_stats().batches_read_ahead > 0, read_ahead == ReadAhead::Always);
    Tensor out = zeros({3}, kInt64);
    EXPECT_THROW_WITH(ds.get_batch(std::vector<int64_t>{0, 99, 100}, "label", out), IndexError,
                      "get_batch: record index 100 is out of range");
    EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  }
  // Handles opened with other read-aheads: the first one's decides for the whole batch.
  ReaderOptions never, always;
  never.read_ahead = ReadAhead::Never;
  always.read_ahead = ReadAhead::Always;
  std::vector<Dataset> never_first, always_first;
  for (const std::string& p : shards.paths) {
    never_first.push_back(Dataset::open(p, never_first.empty() ? never : always));
    always_first.push_back(Dataset::open(p, always_first.empty() ? always : never));
  }
  const std::vector<int64_t> spread = {0, 50, 99, 10, 60};
  for (const auto& [handles, hinted] : {std::pair{&never_first, false}, std::pair{&always_first, true}}) {
    const Dataset ds = Dataset::concat(*handles);
    expect_same_tensor(ds.get_batch(spread, "image"), whole.get_batch(spread, "image"), "concat of handles");
    EXPECT_EQ(ds.read_ahead_stats().batches_read_ahead, hinted ? 1 : 0);
    for (const Dataset& part : ds.parts()) EXPECT_EQ(part.read_ahead_stats().batches_read_ahead, 0);
  }
}

TEST_P(DatasetConcatTest, ColumnsAcrossPartsAreCopiesAndInsideOneAreThePartsOwn) {
  const Shards shards(dir, GetParam());
  const Dataset ds = Dataset::open_concat(shards.paths);
  const Dataset whole = Dataset::open(shards.whole);
  EXPECT_FALSE(ds.column_is_view("x"));
  for (const auto& [start, stop] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 100}, {30, 40}, {36, 38}, {37, 87}, {0, 37}, {86, 88}, {5, 5}, {100, 100}, {0, 0}}) {
    const std::string range = "[" + std::to_string(start) + ", " + std::to_string(stop) + ")";
    for (const char* field : {"x", "label", "image"}) {
      const Tensor got = ds.column(field, start, stop);
      expect_same_tensor(got, whole.column(field, start, stop), std::string(field) + " " + range);
      if (std::string(field) == "image" && stop > start) {  // channels-last stays channels-last
        EXPECT_EQ(got.stride(1), 1) << range;
      }
    }
    expect_same_ragged(ds.ragged_column("tokens", start, stop), whole.ragged_column("tokens", start, stop),
                       "tokens " + range);
  }
  // Inside one chunk of an uncompressed part: a view into that part's mapping.
  if (std::string(GetParam()) == "none") {
    const Tensor inside = ds.column("x", 38, 44);  // part 2's records [1, 7), all in its chunk 0
    EXPECT_EQ(inside.untyped_storage().filename(), shards.paths[2]);
  }
  EXPECT_THROW_WITH(ds.column("x", 0, 101), IndexError, "0 <= start <= stop <= 100");
  EXPECT_THROW_WITH(ds.column("tokens", 0, 50), ValueError, "ragged");
  EXPECT_THROW_WITH(ds.ragged_column("x", 0, 50), ValueError, "fixed shape");
}

INSTANTIATE_TEST_SUITE_P(Codecs, DatasetConcatTest, ::testing::Values("none", "lz4", "zstd:3"));

TEST(DatasetConcat, PartsThatDoNotBelongTogetherAreRefused) {
  TempDir dir;
  const std::string a = write_range(dir.file("a.mmt"), 0, 10);
  const std::string b = write_range(dir.file("b.mmt"), 10, 20);
  {
    WriterOptions options;
    DatasetWriter writer = DatasetWriter::create(
        dir.file("other.mmt"), Schema({Field::fixed("x", kFloat32, {4}), Field::fixed("label", kInt32, {})}), options);
    writer.finish();
  }
  EXPECT_THROW_WITH(Dataset::open_concat({a, dir.file("other.mmt")}), ValueError,
                    "part 1 (" + dir.file("other.mmt") + ") has other fields than part 0 (" + a + "): it has 2 fields");
  const std::string wider = dir.file("wider.mmt");
  {
    std::vector<Field> fields = Dataset::open(a).schema().fields();
    fields[2] = Field::fixed("image", kUInt8, {3, 4, 4});  // row-major, not channels-last
    DatasetWriter::create(wider, Schema(fields)).finish();
  }
  EXPECT_THROW_WITH(Dataset::open_concat({a, b, wider}), ValueError,
                    "its field 2 is 'image' uint8 [3, 4, 4], the first part's 'image' uint8 [3, 4, 4] stored in order");
  // Metadata: the union, and a key the parts disagree on is refused.
  const std::string c = write_range(dir.file("c.mmt"), 0, 3, "none", 8, {{"classes", "[\"cat\",\"dog\"]"}, {"s", "1"}});
  const std::string d = write_range(dir.file("d.mmt"), 3, 6, "none", 8, {{"classes", "[\"cat\",\"dog\"]"}, {"t", "2"}});
  const std::string e = write_range(dir.file("e.mmt"), 6, 9, "none", 8, {{"classes", "[\"dog\",\"cat\"]"}});
  const Dataset cd = Dataset::open_concat({c, d});
  EXPECT_EQ(cd.metadata(), (Metadata{{"classes", "[\"cat\",\"dog\"]"}, {"s", "1"}, {"t", "2"}}));
  EXPECT_THROW_WITH(Dataset::open_concat({c, d, e}), ValueError,
                    "metadata 'classes' is \"[\"cat\",\"dog\"]\" in part 0 (" + c + ") but \"[\"dog\",\"cat\"]\" in part 2");
  // No parts, an empty handle, a missing file.
  EXPECT_THROW_WITH(Dataset::open_concat({}), ValueError, "no paths given");
  EXPECT_THROW_WITH(Dataset::concat({}), ValueError, "no datasets given");
  EXPECT_THROW_WITH(Dataset::concat({Dataset::open(a), Dataset()}), ValueError, "part 1 is an empty Dataset handle");
  EXPECT_THROW(Dataset::open_concat({a, dir.file("missing.mmt")}), IoError);
}

// pack's npy_fortran_order says how the sources were laid out, a hint for export: parts that
// differ in it (or lack it) still read as one dataset, and the hint stays only where all agree.
TEST(DatasetConcat, TheFortranOrderHintIsKeptOnlyWhereEveryPartAgrees) {
  TempDir dir;
  const Metadata x{{"npy_fortran_order", R"(["x"])"}, {"classes", "[]"}};
  const std::string f1 = write_range(dir.file("f1.mmt"), 0, 3, "none", 8, x);
  const std::string f2 = write_range(dir.file("f2.mmt"), 3, 6, "none", 8, x);
  const std::string y = write_range(dir.file("y.mmt"), 6, 9, "none", 8, {{"npy_fortran_order", R"(["y"])"}});
  const std::string c = write_range(dir.file("c.mmt"), 9, 12, "none", 8, {{"classes", "[]"}});
  EXPECT_EQ(Dataset::open_concat({f1, f2}).metadata(), x);
  EXPECT_EQ(Dataset::open_concat({f1, y}).metadata().count("npy_fortran_order"), 0u) << "two values";
  EXPECT_EQ(Dataset::open_concat({c, f1}).metadata(), (Metadata{{"classes", "[]"}})) << "absent, then present";
  EXPECT_EQ(Dataset::open_concat({f1, c}).metadata().count("npy_fortran_order"), 0u) << "present, then absent";
  EXPECT_EQ(Dataset::open(f1).metadata(), x) << "one file keeps its own";
  const Dataset nested = Dataset::concat({Dataset::open_concat({f1, f2}), Dataset::open(f1)});
  EXPECT_EQ(nested.metadata(), x) << "flattened, then settled over the files";
  EXPECT_EQ(Dataset::concat({Dataset::open_concat({f1, f2}), Dataset::open(c)}).metadata().count("npy_fortran_order"), 0u);
  // Other keys are still refused when they differ.
  const std::string other = write_range(dir.file("o.mmt"), 0, 3, "none", 8, {{"npy_fortran_order", R"(["x"])"}, {"classes", "[1]"}});
  EXPECT_THROW_WITH(Dataset::open_concat({f1, other}), ValueError, "metadata 'classes'");
}

TEST(DatasetConcat, HandlesFlattenAndOnePartIsThatPart) {
  TempDir dir;
  const Dataset a = Dataset::open(write_range(dir.file("a.mmt"), 0, 10));
  const Dataset b = Dataset::open(write_range(dir.file("b.mmt"), 10, 25));
  const Dataset c = Dataset::open(write_range(dir.file("c.mmt"), 25, 30));
  const Dataset one = Dataset::concat({a});
  EXPECT_EQ(one.path(), a.path());
  EXPECT_EQ(one.parts().size(), 1u);
  EXPECT_EQ(Dataset::open_concat({a.path()}).path(), a.path());
  const Dataset ab_c = Dataset::concat({Dataset::concat({a, b}), c});
  ASSERT_EQ(ab_c.parts().size(), 3u);
  EXPECT_EQ(ab_c.size(), 30);
  for (int64_t i = 0; i < 30; ++i) ASSERT_EQ(ab_c.get(i, "label").item<int64_t>(), i);
  // Parts packed with different codecs: info() says so, and keeps the first part's codec.
  const Dataset mixed = Dataset::concat({a, Dataset::open(write_range(dir.file("d.mmt"), 30, 40, "zstd:5"))});
  EXPECT_TRUE(mixed.info().codecs_differ);
  EXPECT_EQ(mixed.info().codec, CodecSpec{});
  EXPECT_EQ(mixed.chunk(mixed.num_chunks() - 1).codec, Codec::Zstd);
  EXPECT_FALSE(ab_c.info().codecs_differ);
  // The same file twice is a dataset twice as long (oversampling a shard).
  const Dataset twice = Dataset::concat({a, a});
  EXPECT_EQ(twice.size(), 20);
  EXPECT_EQ(twice.get(15, "label").item<int64_t>(), 5);
  // Fingerprints: the same parts in the same order agree; another order differs.
  EXPECT_EQ(Dataset::concat({a, b}).fingerprint(), Dataset::open_concat({a.path(), b.path()}).fingerprint());
  EXPECT_NE(Dataset::concat({a, b}).fingerprint(), Dataset::concat({b, a}).fingerprint());
  EXPECT_NE(Dataset::concat({a, b}).fingerprint(), a.fingerprint());
  // Views outlive the concatenation and its parts' handles.
  Tensor view;
  {
    const Dataset ab = Dataset::concat({a, b});
    view = ab.get(12, "x");
  }
  EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{120, 121, 122, 123}));
}

TEST(DatasetConcat, OpenConcatGivesThePartsOneCacheBudget) {
  TempDir dir;
  std::vector<std::string> paths;
  for (int p = 0; p < 4; ++p)
    paths.push_back(write_range(dir.file("s" + std::to_string(p) + ".mmt"), 25 * p, 25 * (p + 1), "zstd:1", 5));
  ReaderOptions options;
  options.cache_bytes = 3 * 5 * 128;  // about three decoded chunks (5 records of 96 fixed bytes, and tokens)
  const Dataset ds = Dataset::open_concat(paths, options);
  EXPECT_EQ(ds.options().cache_bytes, options.cache_bytes);
  for (int64_t i = 0; i < ds.size(); ++i) (void)ds.get(i);
  const CacheStats stats = ds.cache_stats();
  EXPECT_EQ(stats.budget_bytes, options.cache_bytes);  // one budget, not one per part
  EXPECT_EQ(stats.misses, ds.num_chunks());            // each chunk decoded once, read in order
  EXPECT_LE(stats.bytes_cached, options.cache_bytes);
  EXPECT_GT(stats.evictions, 0);
  // Handles concatenated keep their own caches: the stats add them up, each once.
  const Dataset a = Dataset::open(paths[0], options), b = Dataset::open(paths[1], options);
  const Dataset ab = Dataset::concat({a, b, a});
  EXPECT_EQ(ab.cache_stats().budget_bytes, options.cache_bytes);  // the smallest part's: what a window can count on
}

TEST(DatasetConcat, APartTruncatedUnderTheReaderGivesIoErrorNotSigbus) {
  if (kThreadSanitizer) GTEST_SKIP() << "the SIGBUS guard does not work under ThreadSanitizer";
  TempDir dir;
  const std::string a = write_range(dir.file("a.mmt"), 0, 40, "none", 8);
  const std::string b = write_range(dir.file("b.mmt"), 40, 80, "none", 8);
  const Dataset ds = Dataset::open_concat({a, b});
  std::filesystem::resize_file(b, 4096);  // the data of b's chunks is gone, its mapping stays
  EXPECT_THROW_WITH(ds.column("x", 0, 80), IoError, b);
  EXPECT_THROW_WITH(ds.ragged_column("tokens", 30, 60), IoError, b);
  const std::vector<int64_t> indices = {0, 70, 5, 50};
  EXPECT_THROW_WITH(ds.get_batch(indices, "x"), IoError, b);
}

TEST(DatasetConcat, VerifyAndReadsNameTheDamagedPart) {
  TempDir dir;
  const std::string a = write_range(dir.file("a.mmt"), 0, 20, "lz4", 4);
  const std::string b = write_range(dir.file("b.mmt"), 20, 40, "lz4", 4);
  const ChunkInfo damaged = testing::damage_chunk(b, 2);  // records 28..31
  const Dataset ds = Dataset::open_concat({a, b});
  EXPECT_THROW_WITH(ds.verify(), ChecksumError, b);
  EXPECT_THROW_WITH(ds.get(20 + damaged.first_record), ChecksumError, b);
  EXPECT_NO_THROW(ds.get(19));
}

// Fixed fields only, uncompressed, chunked by size: contiguous files, whose batches over
// several parts are gathered as one run (each record found by address) rather than part by part.
std::string write_fixed_range(const std::string& path, int64_t begin, int64_t end, int64_t alignment = 4096) {
  WriterOptions options;
  options.alignment = alignment;
  options.threads = 1;
  options.chunk_bytes = 4096;  // several chunks a part
  DatasetWriter writer = DatasetWriter::create(
      path, Schema({Field::fixed("x", kFloat32, {4}), Field::fixed("label", kInt64, {})}), options);
  for (int64_t i = begin; i < end; ++i) {
    std::vector<float> x;
    for (int k = 0; k < 4; ++k) x.push_back(static_cast<float>(10 * i + k));
    writer.append({tensor(x), full({}, static_cast<double>(i), kInt64)});
  }
  writer.finish();
  return path;
}

TEST(DatasetConcat, ContiguousPartsGatherAsOneRunUnderEveryReadAhead) {
  TempDir dir;
  const std::vector<int64_t> bounds = {0, 1000, 1000, 2500, 2501, 4000};  // an empty part, a one-record part
  std::vector<std::string> paths;
  for (size_t p = 0; p + 1 < bounds.size(); ++p)
    paths.push_back(write_fixed_range(dir.file("f" + std::to_string(p) + ".mmt"), bounds[p], bounds[p + 1]));
  const Dataset whole = Dataset::open(write_fixed_range(dir.file("whole.mmt"), 0, 4000));
  ASSERT_TRUE(whole.column_is_view("x"));  // the layout this test is about
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int64_t> pick(-4000, 3999);
  for (ReadAhead read_ahead : {ReadAhead::Auto, ReadAhead::Always, ReadAhead::Never}) {
    ReaderOptions options;
    options.read_ahead = read_ahead;
    const Dataset ds = Dataset::open_concat(paths, options);
    for (int round = 0; round < 20; ++round)  // Auto: the first batch checked (and hinted when cold)
      for (int threads : {1, 2}) {
        std::vector<int64_t> indices(static_cast<size_t>(round == 19 ? 3000 : 1 + round * 37));  // 3000: split over threads
        for (int64_t& i : indices) i = pick(rng);
        Tensor x = empty({static_cast<int64_t>(indices.size()), 4}, kFloat32);
        Tensor label = empty({static_cast<int64_t>(indices.size()), 2}, kInt64).select(1, 1);  // strided rows
        ds.get_batch(indices, std::vector<std::string>{"x", "label"}, std::vector<Tensor>{x, label}, threads);
        ASSERT_TRUE(x.equal(whole.get_batch(indices, "x"))) << "round " << round << " threads " << threads;
        ASSERT_TRUE(label.equal(whole.get_batch(indices, "label"))) << "round " << round;
      }
    // A bad index anywhere in the batch: IndexError, and nothing written.
    Tensor out = zeros({3}, kInt64);
    EXPECT_THROW_WITH(ds.get_batch(std::vector<int64_t>{0, 3999, 4000}, "label", out), IndexError,
                      "record index 4000");
    EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  }
  // A part truncated under the reader: IoError naming it, on both ways of gathering.
  if (kThreadSanitizer) return;  // the SIGBUS guard does not work under ThreadSanitizer
  const Dataset ds = Dataset::open_concat(paths);
  const std::vector<int64_t> spread = {5, 1200, 3000, 2500, 3999, 17};
  for (int warm = 0; warm < 4; ++warm) (void)ds.get_batch(spread, "x");  // its pages in use
  std::filesystem::resize_file(paths[4], 4096);
  EXPECT_THROW_WITH(ds.get_batch(spread, "x"), IoError, paths[4]);
  EXPECT_THROW_WITH(ds.get_batch(spread, "x", 2), IoError, paths[4]);
}

TEST(DatasetConcat, LoaderCoversEveryRecordOnceAndResumesOnTheSameParts) {
  TempDir dir;
  const Shards shards(dir, "lz4", 6);
  const Dataset ds = Dataset::open_concat(shards.paths);
  for (SamplerKind kind : {SamplerKind::Sequential, SamplerKind::Random, SamplerKind::QuasiRandom}) {
    LoaderOptions options;
    options.batch_size = 16;
    options.sampler.kind = kind;
    options.sampler.seed = 5;
    options.num_workers = 2;
    Loader loader(ds, options);
    std::vector<int64_t> seen;
    while (std::optional<Batch> batch = loader.next()) {
      testing::expect_batch_matches_dataset(*batch, ds, {"x", "label", "image", "tokens"});
      for (int64_t row = 0; row < batch->size(); ++row)
        EXPECT_EQ((*batch)["label"][row].item<int64_t>(), batch->indices()[static_cast<size_t>(row)]);
      seen.insert(seen.end(), batch->indices().begin(), batch->indices().end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(100);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << to_string(kind);
  }
  // Resume mid-epoch: the same order as without stopping; refused on the parts reordered.
  LoaderOptions options;
  options.batch_size = 8;
  options.sampler.kind = SamplerKind::QuasiRandom;
  options.sampler.seed = 9;
  Loader first(ds, options);
  const std::vector<int64_t> full = testing::drain_epoch(first);
  Loader stopped(ds, options);
  std::vector<int64_t> order = testing::take_batches(stopped, 3);
  const LoaderState state = stopped.state();
  Loader resumed(Dataset::open_concat(shards.paths), options, state);
  const std::vector<int64_t> rest = testing::drain_epoch(resumed);
  order.insert(order.end(), rest.begin(), rest.end());
  EXPECT_EQ(order, full);
  std::vector<std::string> reordered = shards.paths;
  std::swap(reordered[0], reordered[2]);
  EXPECT_THROW_WITH(Loader(Dataset::open_concat(reordered), options, state), ValueError, "another");
}

}  // namespace
}  // namespace mmt
