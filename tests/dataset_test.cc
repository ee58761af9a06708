// Dataset round trips and reader behaviour: every dtype, fixed, ragged and bytes fields,
// storage orders, codecs, zero-copy views, concurrency, and the user-facing errors.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <tuple>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;

// A deterministic value for record `record` with concrete `sizes`: element k is
// (record * 31 + k) % 97, converted to `dtype`.
Tensor value_for(int64_t record, ScalarType dtype, IntArrayRef sizes) {
  Tensor source = empty(sizes, kFloat64);
  int64_t numel = source.numel();
  double* p = source.mutable_data_ptr<double>();
  for (int64_t k = 0; k < numel; ++k) p[k] = static_cast<double>((record * 31 + k) % 97);
  Tensor out = empty(sizes, dtype);
  out.copy_(source);
  return out;
}

// The ragged extent of record `record`: cycles through 0..4 so empty values occur.
int64_t ragged_length(int64_t record) { return record % 5; }

DimVector concrete_shape(const Field& field, int64_t record) {
  DimVector sizes(field.shape);
  for (auto& s : sizes)
    if (s == kVariableDim) s = ragged_length(record) + 1 - (record % 2);  // includes 0 for some
  return sizes;
}

Tensor field_value(const Field& field, int64_t record) {
  return value_for(record, field.dtype, concrete_shape(field, record));
}

std::string write_dataset(const std::string& path, const Schema& schema, int64_t records, WriterOptions options) {
  DatasetWriter writer = DatasetWriter::create(path, schema, options);
  for (int64_t i = 0; i < records; ++i) {
    std::vector<Tensor> values;
    for (const Field& field : schema) values.push_back(field_value(field, i));
    writer.append(values);
  }
  writer.finish();
  return path;
}

// A dataset of `records` records written with `codec` in chunks of `chunk_records`, opened.
Dataset write_chunked(const std::string& path, const Schema& schema, int64_t records, const char* codec,
                      int64_t chunk_records) {
  WriterOptions options;
  options.codec = CodecSpec::parse(codec);
  options.chunk_records = chunk_records;
  return Dataset::open(write_dataset(path, schema, records, options));
}

void expect_all_records(const Dataset& ds, const Schema& schema, int64_t records) {
  ASSERT_EQ(ds.size(), records);
  for (int64_t i = 0; i < records; ++i) {
    Sample sample = ds.get(i);
    ASSERT_EQ(sample.index(), i);
    ASSERT_EQ(sample.size(), schema.size());
    for (size_t f = 0; f < schema.size(); ++f) {
      const Tensor expected = field_value(schema[f], i);
      const Tensor& got = sample[f];
      ASSERT_EQ(got.dtype(), expected.dtype()) << schema[f].name << " record " << i;
      ASSERT_EQ(got.sizes(), expected.sizes()) << schema[f].name << " record " << i;
      ASSERT_TRUE(got.equal(expected)) << schema[f].name << " record " << i;
      // One field alone finds its ragged section by another path than the whole sample.
      ASSERT_TRUE(ds.get(i, schema[f].name).equal(expected)) << schema[f].name << " record " << i;
    }
  }
}

class CodecRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(CodecRoundTrip, EveryDtypeFixedAndRagged) {
  TempDir dir;
  std::vector<Field> fields;
  for (int code = 0; code < kNumScalarTypes; ++code) {
    auto dtype = static_cast<ScalarType>(code);
    std::string name(to_string(dtype));
    fields.push_back(Field::fixed(name + "_fixed", dtype, {2, 3}));
    fields.push_back(Field::ragged(name + "_ragged", dtype, {kVariableDim, 2}));
  }
  fields.push_back(Field::bytes("blob"));
  fields.push_back(Field::fixed("scalar", kInt64, {}));
  Schema schema(fields);
  WriterOptions options;
  options.codec = CodecSpec::parse(GetParam());
  options.chunk_records = 7;
  options.alignment = 64;
  options.threads = 2;
  const std::string path = write_dataset(dir.file("all.mmt"), schema, 40, options);
  Dataset ds = Dataset::open(path);
  EXPECT_EQ(ds.schema(), schema);
  EXPECT_EQ(ds.info().codec, options.codec);
  EXPECT_EQ(ds.num_chunks(), 6);
  expect_all_records(ds, schema, 40);
  ds.verify();
}

TEST_P(CodecRoundTrip, FixedOnlyChunkedByBytes) {
  TempDir dir;
  Schema schema({Field::fixed("image", kUInt8, {1, 28, 28}), Field::fixed("label", kUInt8, {})});
  WriterOptions options;
  options.codec = CodecSpec::parse(GetParam());
  options.chunk_bytes = 10000;
  const std::string path = write_dataset(dir.file("mnist.mmt"), schema, 100, options);
  Dataset ds = Dataset::open(path);
  expect_all_records(ds, schema, 100);
  EXPECT_GT(ds.num_chunks(), 1);
  Tensor column = ds.column("label");
  ASSERT_EQ(column.sizes(), IntArrayRef({100}));
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(column.at<uint8_t>({i}), (i * 31) % 97);
  EXPECT_EQ(ds.column_is_view("image"), options.codec.codec == Codec::None);
  ds.verify();
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecRoundTrip, ::testing::Values("none", "lz4", "lz4:9", "zstd", "zstd:19"));

// path() is as given; absolute_path() names the file opened whatever the working folder
// becomes (a pickled Dataset reopened after a chdir read another file, or none).
TEST(DatasetTest, AbsolutePathIsFixedAtOpen) {
  TempDir dir;
  for (const char* name : {"a.mmt", "b.mmt"}) {
    DatasetWriter writer = DatasetWriter::create(dir.file(name), Schema({Field::fixed("x", kInt32, {})}));
    writer.append({full({}, 1, kInt32)});
    writer.finish();
  }
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  const Dataset one = Dataset::open("a.mmt");
  const Dataset both = Dataset::open_concat({"a.mmt", "./b.mmt"});
  std::filesystem::current_path("/");
  EXPECT_EQ(one.path(), "a.mmt");
  EXPECT_EQ(one.absolute_path(), dir.file("a.mmt"));
  EXPECT_EQ(Dataset::open(one.absolute_path()).fingerprint(), one.fingerprint());
  EXPECT_EQ(both.absolute_path(), dir.file("a.mmt") + ", " + (dir.path() / "./b.mmt").string());
  EXPECT_EQ(both.parts()[1].absolute_path(), (dir.path() / "./b.mmt").string());
  std::filesystem::current_path(before);
}

// ds[5]["image"] in one line: the Sample is a temporary, and a reference into it dangled
// (a crash at -O2, stack-use-after-scope under ASan). On a temporary the view comes by
// value, and keeps the record's memory alive.
static_assert(std::is_same_v<decltype(std::declval<Sample>()["x"]), Tensor>);
static_assert(std::is_same_v<decltype(std::declval<Sample>()[size_t{0}]), Tensor>);
static_assert(std::is_same_v<decltype(std::declval<Sample>().field("x")), Tensor>);
static_assert(std::is_same_v<decltype(std::declval<const Sample&>()["x"]), const Tensor&>);
TEST(DatasetTest, AFieldOfATemporarySampleOutlivesIt) {
  TempDir dir;
  DatasetWriter writer = DatasetWriter::create(dir.file("t.mmt"), Schema({Field::fixed("x", kInt32, {64})}));
  for (int i = 0; i < 8; ++i) writer.append({full({64}, i, kInt32)});
  writer.finish();
  const Dataset ds = Dataset::open(dir.file("t.mmt"));
  const Tensor& five = ds[5]["x"];  // binds a Tensor: its lifetime is the reference's
  std::vector<Sample> others;
  for (int i = 0; i < 8; ++i) others.push_back(ds[i]);  // reuse the stack and heap around it
  EXPECT_TRUE(five.equal(full({64}, 5, kInt32)));
}

TEST(DatasetTest, RaggedOnlyChunkedByBytesUsesChunkSearch) {
  TempDir dir;
  Schema schema({Field::bytes("jpeg"), Field::ragged("boxes", kFloat32, {kVariableDim, 4})});
  WriterOptions options;
  options.chunk_bytes = 300;
  options.alignment = 64;
  const std::string path = write_dataset(dir.file("ragged.mmt"), schema, 200, options);
  Dataset ds = Dataset::open(path);
  EXPECT_GT(ds.num_chunks(), 5);
  expect_all_records(ds, schema, 200);
  for (int64_t i = 0; i < 200; i += 17) {
    ChunkInfo chunk = ds.chunk(ds.chunk_of(i));
    EXPECT_LE(chunk.first_record, i);
    EXPECT_LT(i, chunk.first_record + chunk.record_count);
  }
  ds.verify();
}

TEST(DatasetTest, ChannelsLastFieldComesBackWithChannelsLastStrides) {
  TempDir dir;
  const int64_t C = 3, H = 4, W = 5;
  Schema schema({Field::fixed("image", kUInt8, {C, H, W}).stored_channels_last()});
  WriterOptions options;
  options.alignment = 64;
  const std::string path = write_dataset(dir.file("cl.mmt"), schema, 10, options);
  Dataset ds = Dataset::open(path);
  Tensor image = ds.get(3)["image"];
  EXPECT_EQ(image.sizes(), IntArrayRef({C, H, W}));
  EXPECT_EQ(image.strides(), IntArrayRef({1, W * C, C}));
  EXPECT_TRUE(image.equal(value_for(3, kUInt8, {C, H, W})));
  // The bytes in the file are HWC: element (c, h, w) sits at (h*W + w)*C + c.
  const uint8_t* hwc = static_cast<const uint8_t*>(image.data_ptr());
  EXPECT_EQ(hwc[(2 * W + 1) * C + 1], image.at<uint8_t>({1, 2, 1}));
  Tensor column = ds.column("image");
  EXPECT_EQ(column.strides()[1], 1);
  Tensor batch = ds.get_batch(std::vector<int64_t>{4, 1}, "image");
  EXPECT_TRUE(batch[0].equal(value_for(4, kUInt8, {C, H, W})));
  EXPECT_TRUE(batch[1].equal(value_for(1, kUInt8, {C, H, W})));
}

TEST(DatasetTest, NonContiguousSourcesAreWrittenByValue) {
  TempDir dir;
  Schema schema({Field::fixed("m", kFloat32, {4, 3}), Field::ragged("r", kInt32, {kVariableDim})});
  const std::string path = dir.file("strided.mmt");
  DatasetWriter writer = DatasetWriter::create(path, schema);
  std::vector<Tensor> expected_m, expected_r;
  for (int64_t i = 0; i < 6; ++i) {
    Tensor base = value_for(i, kFloat32, {3, 4});
    Tensor transposed = base.t();                                    // [4, 3], strides [1, 4]
    Tensor stepped = value_for(i, kInt32, {10}).slice(0, 1, 10, 3);  // stride 3
    writer.append({transposed, stepped});
    expected_m.push_back(transposed.contiguous());
    expected_r.push_back(stepped.contiguous());
  }
  writer.finish();
  Dataset ds = Dataset::open(path);
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_TRUE(ds.get(i, "m").equal(expected_m[i]));
    EXPECT_TRUE(ds.get(i, "r").equal(expected_r[i]));
  }
}

TEST(DatasetTest, ZeroAndOneRecord) {
  TempDir dir;
  Schema schema({Field::fixed("x", kFloat32, {2}), Field::bytes("b")});
  write_dataset(dir.file("zero.mmt"), schema, 0, {});
  Dataset zero = Dataset::open(dir.file("zero.mmt"));
  EXPECT_EQ(zero.size(), 0);
  EXPECT_EQ(zero.num_chunks(), 0);
  EXPECT_THROW(zero.get(0), IndexError);
  EXPECT_EQ(zero.column("x").sizes(), IntArrayRef({0, 2}));
  EXPECT_EQ(zero.get_batch(std::vector<int64_t>{}, "x").sizes(), IntArrayRef({0, 2}));
  zero.verify();
  // An index is checked before the batch is allocated: the schema of a file with no records
  // may describe values of any size (16 TiB here; allocating [1, 16 TiB] failed first).
  write_dataset(dir.file("huge.mmt"), Schema({Field::fixed("x", kUInt8, {int64_t{1} << 44})}), 0, {});
  const std::vector<int64_t> first{0};
  EXPECT_THROW_WITH(Dataset::open(dir.file("huge.mmt")).get_batch(first, "x"), IndexError,
                    "get_batch: record index 0 is out of range");

  write_dataset(dir.file("one.mmt"), schema, 1, {});
  Dataset one = Dataset::open(dir.file("one.mmt"));
  expect_all_records(one, schema, 1);
  EXPECT_TRUE(one.get(-1)["x"].equal(field_value(schema[0], 0)));
}

TEST(DatasetTest, RecordsLargerThanAChunkGetAChunkEach) {
  TempDir dir;
  Schema schema({Field::fixed("big", kFloat64, {64}), Field::bytes("blob")});
  for (const char* codec : {"none", "zstd"}) {
    WriterOptions options;
    options.chunk_bytes = 100;  // smaller than one record
    options.alignment = 64;     // a compressed chunk holds at least the alignment's bytes
    options.codec = CodecSpec::parse(codec);
    options.overwrite = true;
    write_dataset(dir.file("big.mmt"), schema, 9, options);
    Dataset ds = Dataset::open(dir.file("big.mmt"));
    EXPECT_EQ(ds.num_chunks(), 9) << codec;
    expect_all_records(ds, schema, 9);
    for (int64_t c = 0; c < 9; ++c) EXPECT_EQ(ds.chunk(c).record_count, 1);
  }
}

TEST(DatasetTest, ColumnIsOneViewOverTheMappedFile) {
  TempDir dir;
  Schema schema({Field::fixed("image", kUInt8, {1, 28, 28}), Field::fixed("label", kInt64, {})});
  WriterOptions options;
  options.chunk_bytes = 8192;
  const std::string path = write_dataset(dir.file("col.mmt"), schema, 50, options);
  Dataset ds = Dataset::open(path);
  ASSERT_TRUE(ds.column_is_view("image"));
  Tensor images = ds.column("image");
  EXPECT_EQ(images.sizes(), IntArrayRef({50, 1, 28, 28}));
  Tensor one = ds.get(17)["image"];
  EXPECT_TRUE(images.is_same_storage(one));
  EXPECT_EQ(images.untyped_storage().filename(), path);
  EXPECT_EQ(one.untyped_storage().filename(), path);
  EXPECT_EQ(images[17].data_ptr(), one.data_ptr());
  for (int64_t i = 0; i < 50; ++i) ASSERT_TRUE(images[i].equal(field_value(schema[0], i)));
  Tensor range = ds.column("label", 10, 20);
  EXPECT_TRUE(range.is_same_storage(one));
  EXPECT_EQ(range.sizes(), IntArrayRef({10}));
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(range.at<int64_t>({i}), ((10 + i) * 31) % 97);
  EXPECT_THROW(ds.column("label", 5, 51), IndexError);
}

// One chunk: column() is a view into it (the decoded chunk, or the mapping of a ragged-schema
// file), and column_is_view() says so; it used to say false.
TEST(DatasetTest, AColumnOfOneChunkIsAViewAndSaysSo) {
  TempDir dir;
  Schema schema({Field::fixed("v", kInt32, {3})});
  Dataset compressed = write_chunked(dir.file("one-lz4.mmt"), schema, 5, "lz4", 8);
  ASSERT_EQ(compressed.num_chunks(), 1);
  EXPECT_TRUE(compressed.column_is_view("v"));
  EXPECT_TRUE(compressed.column("v").untyped_storage().is_same(compressed.get(0)["v"].untyped_storage()));
  Schema ragged({Field::fixed("v", kInt32, {3}), Field::bytes("raw")});
  Dataset mapped = write_chunked(dir.file("one-ragged.mmt"), ragged, 5, "none", 8);
  ASSERT_EQ(mapped.num_chunks(), 1);
  EXPECT_TRUE(mapped.column_is_view("v"));
  EXPECT_EQ(mapped.column("v").untyped_storage().filename(), dir.file("one-ragged.mmt"));
  EXPECT_FALSE(mapped.column_is_view("raw"));
}

TEST(DatasetTest, CompressedColumnIsAGatheredCopy) {
  TempDir dir;
  Schema schema({Field::fixed("v", kInt32, {3})});
  Dataset ds = write_chunked(dir.file("c.mmt"), schema, 11, "lz4", 4);
  EXPECT_FALSE(ds.column_is_view("v"));
  Tensor column = ds.column("v", 2, 9);
  ASSERT_EQ(column.sizes(), IntArrayRef({7, 3}));
  for (int64_t i = 0; i < 7; ++i) EXPECT_TRUE(column[i].equal(field_value(schema[0], i + 2)));
}

// Reading a compressed column chunk by chunk: each chunk's range is a view into the decoded
// chunk, shared with get(), so the chunk is decoded once and nothing is copied.
TEST(DatasetTest, RangeInsideOneChunkIsAViewOfThatChunk) {
  TempDir dir;
  Schema schema({Field::fixed("v", kInt32, {3}), Field::fixed("label", kUInt8, {})});
  Dataset ds = write_chunked(dir.file("c.mmt"), schema, 11, "zstd", 4);
  for (int64_t c = 0; c < ds.num_chunks(); ++c) {
    const ChunkInfo chunk = ds.chunk(c);
    Tensor range = ds.column("v", chunk.first_record, chunk.first_record + chunk.record_count);
    ASSERT_EQ(range.sizes(), IntArrayRef({chunk.record_count, 3}));
    for (int64_t r = 0; r < chunk.record_count; ++r)
      EXPECT_TRUE(range[r].equal(field_value(schema[0], chunk.first_record + r)));
    EXPECT_TRUE(range.untyped_storage().is_same(ds.get(chunk.first_record)["v"].untyped_storage())) << "chunk " << c;
  }
  EXPECT_EQ(ds.cache_stats().misses, ds.num_chunks());
  // A range across chunks is still a correct copy.
  Tensor across = ds.column("label", 3, 6);
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(across[i].equal(field_value(schema[1], i + 3)));
  EXPECT_FALSE(across.untyped_storage().is_same(ds.get(3)["label"].untyped_storage()));

  // Uncompressed chunks of a schema with a ragged field: a view into the mapping.
  Schema ragged({Field::fixed("v", kInt32, {3}), Field::bytes("raw")});
  Dataset rds = write_chunked(dir.file("r.mmt"), ragged, 10, "none", 4);
  ASSERT_FALSE(rds.column_is_view("v"));
  Tensor in_chunk = rds.column("v", 4, 8);
  EXPECT_EQ(in_chunk.untyped_storage().filename(), dir.file("r.mmt"));
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(in_chunk[i].equal(field_value(ragged[0], i + 4)));
}

TEST(DatasetTest, ViewsOutliveTheDataset) {
  TempDir dir;
  Schema schema({Field::fixed("x", kFloat32, {8}), Field::bytes("b")});
  for (const char* codec : {"none", "zstd"}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.overwrite = true;
    write_dataset(dir.file("v.mmt"), schema, 5, options);
    Sample sample;
    Tensor column;
    {
      Dataset ds = Dataset::open(dir.file("v.mmt"));
      sample = ds.get(2);
      column = ds.column("x");
    }
    EXPECT_TRUE(sample["x"].equal(field_value(schema[0], 2))) << codec;
    EXPECT_TRUE(sample["b"].equal(field_value(schema[1], 2))) << codec;
    EXPECT_TRUE(column[4].equal(field_value(schema[0], 4))) << codec;
  }
}

// A copied sample holds the same views, past kInlineFields fields too (the extra ones live
// in a heap array of its own), and outlives the sample it was copied from.
TEST(DatasetTest, ACopiedSampleHoldsTheSameViewsBeyondItsInlineFields) {
  TempDir dir;
  std::vector<Field> fields;
  for (int f = 0; f < 6; ++f) {
    std::string name = "f";  // not "f" + to_string: gcc 12 warns falsely on it (-Wrestrict, its bug 105329)
    name += std::to_string(f);
    fields.push_back(Field::fixed(name, kInt32, {2}));
  }
  Schema schema(fields);
  write_dataset(dir.file("six.mmt"), schema, 3, WriterOptions{});
  Dataset ds = Dataset::open(dir.file("six.mmt"));
  Sample copy;
  {
    const Sample original = ds.get(1);
    copy = original;
    const Sample constructed(original);
    ASSERT_EQ(constructed.size(), 6u);
    for (size_t f = 0; f < 6; ++f) {
      EXPECT_TRUE(constructed[f].is_same_storage(original[f])) << f;
      EXPECT_EQ(constructed[f].data_ptr(), original[f].data_ptr()) << f;
    }
  }
  ASSERT_EQ(copy.size(), 6u);
  EXPECT_EQ(copy.index(), 1);
  for (size_t f = 0; f < 6; ++f) EXPECT_TRUE(copy[f].equal(field_value(schema[f], 1))) << f;
  Sample& self = copy;
  copy = self;
  EXPECT_TRUE(copy["f5"].equal(field_value(schema[5], 1)));
  // A Sample moved from, like one made empty, has no fields: its schema says so, and a field
  // asked for by name is refused (schema() dereferenced no schema).
  const Sample moved = std::move(copy);
  EXPECT_EQ(moved.schema().size(), 6u);
  EXPECT_EQ(copy.size(), 0u);
  EXPECT_EQ(copy.schema().size(), 0u);
  EXPECT_EQ(Sample().schema().size(), 0u);
  EXPECT_THROW(copy["f5"], ValueError);
  EXPECT_THROW(copy[0], IndexError);
}

// An lz4 dataset of `records` records of `schema`, `chunk_records` to a chunk.
std::string write_lz4(const std::string& path, const Schema& schema, int64_t records, int64_t chunk_records) {
  WriterOptions options;
  options.codec = CodecSpec::parse("lz4");
  options.chunk_records = chunk_records;
  return write_dataset(path, schema, records, options);
}

TEST(DatasetTest, CompressedViewsKeepTheirChunkAfterEviction) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt64, {16})});
  write_lz4(dir.file("e.mmt"), schema, 20, 2);
  ReaderOptions reader;
  reader.cache_bytes = 300;  // one chunk of 256 bytes
  Dataset ds = Dataset::open(dir.file("e.mmt"), reader);
  Tensor first = ds.get(0, "x");
  for (int64_t i = 2; i < 20; ++i) ds.get(i);  // evicts chunk 0 many times over
  EXPECT_GT(ds.cache_stats().evictions, 0);
  EXPECT_LE(ds.cache_stats().bytes_cached, 300);
  EXPECT_TRUE(first.equal(field_value(schema[0], 0)));
}

// Views are read-only whatever the codec. A decoded chunk is shared through the cache, so a
// writable view of it would let one reader change what every other read of that chunk sees.
TEST(DatasetTest, ViewsOfDecodedChunksAreReadOnlyLikeTheMapping) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt64, {16}), Field::ragged("r", kInt32, {kVariableDim})});
  for (const char* codec : {"none", "lz4", "zstd"}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    const std::string path = dir.file(std::string(codec) + ".mmt");
    write_dataset(path, schema, 6, options);
    Dataset ds = Dataset::open(path);
    const Sample sample = ds.get(3);
    for (const char* field : {"x", "r"}) {
      EXPECT_TRUE(sample[field].untyped_storage().is_read_only()) << codec << " " << field;
      EXPECT_THROW(sample[field].mutable_data_ptr(), ValueError) << codec << " " << field;
    }
    EXPECT_TRUE(ds.get(3, "x").equal(field_value(schema[0], 3))) << codec;
    EXPECT_FALSE(sample["x"].clone().untyped_storage().is_read_only()) << codec;  // a copy is the user's
  }
}

// chunk(c) reports a validated chunk from the remembered entry (the table is not read again):
// the same figures as before its first read, the checksum included.
TEST(DatasetTest, ChunkInfoIsTheSameBeforeAndAfterTheChunkIsRead) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt64, {16})});
  write_lz4(dir.file("c.mmt"), schema, 12, 4);
  Dataset ds = Dataset::open(dir.file("c.mmt"));
  const ChunkInfo before = ds.chunk(1);
  ASSERT_TRUE(ds.get(5, "x").equal(field_value(schema[0], 5)));
  const ChunkInfo after = ds.chunk(1);
  EXPECT_NE(before.checksum, 0u);
  EXPECT_EQ(after.checksum, before.checksum);
  EXPECT_EQ(std::tie(after.index, after.first_record, after.record_count, after.file_offset, after.stored_bytes,
                     after.decoded_bytes, after.codec),
            std::tie(before.index, before.first_record, before.record_count, before.file_offset, before.stored_bytes,
                     before.decoded_bytes, before.codec));
}

// A random batch over a compressed file touches a chunk per record. get_batch held every one
// of them until its copy: B chunks, whatever the cache budget (a batch of 1024 over 1 MiB
// chunks held 1 GiB against a 256 MiB budget). Past a quarter of the budget it now decodes,
// copies and lets go of the chunks in groups, so what decoding holds stays near the budget.
TEST(DatasetTest, ABatchOverManyCompressedChunksHoldsDecodedMemoryNearTheBudget) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt64, {512}), Field::fixed("y", kInt32, {})});  // 4 KiB + 4 B
  write_lz4(dir.file("many.mmt"), schema, 256, 2);  // 128 chunks of ~8 KiB
  std::vector<int64_t> indices(96);
  std::mt19937 rng(7);
  for (int64_t& i : indices) i = static_cast<int64_t>(rng() % 256);
  for (int threads : {1, 2}) {
    ReaderOptions reader;
    reader.cache_bytes = 8 * 8256;  // 8 chunks
    Dataset ds = Dataset::open(dir.file("many.mmt"), reader);
    Tensor x = empty({96, 512}, kInt64), y = empty({96}, kInt32);
    const std::vector<std::string> fields{"x", "y"};
    ds.get_batch(indices, fields, std::vector<Tensor>{x, y}, threads);
    for (size_t b = 0; b < indices.size(); ++b) {
      ASSERT_TRUE(x[static_cast<int64_t>(b)].equal(field_value(schema[0], indices[b]))) << b;
      ASSERT_TRUE(y[static_cast<int64_t>(b)].equal(field_value(schema[1], indices[b]))) << b;
    }
    const CacheStats stats = ds.cache_stats();
    EXPECT_GT(stats.misses, 40) << "the batch spans many chunks";
    EXPECT_LE(stats.decoded_bytes_peak, 2 * reader.cache_bytes) << threads << " threads";
    EXPECT_LE(stats.decoded_bytes_live, reader.cache_bytes + 8256);  // the cache, and this thread's last chunk
  }
}

TEST(DatasetTest, ConcurrentReadersOnACompressedFileWithATinyCache) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt32, {32}), Field::bytes("b")});
  WriterOptions options;
  options.codec = CodecSpec::parse("zstd");
  options.chunk_records = 8;
  write_dataset(dir.file("mt.mmt"), schema, 400, options);
  ReaderOptions reader;
  reader.cache_bytes = 2048;  // about two chunks for eight threads
  Dataset ds = Dataset::open(dir.file("mt.mmt"), reader);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int k = 0; k < 500; ++k) {
        int64_t i = static_cast<int64_t>(rng() % 400);
        Sample s = ds.get(i);
        if (!s["x"].equal(field_value(schema[0], i)) || !s["b"].equal(field_value(schema[1], i))) ++failures;
        if (k % 50 == 0) {
          std::vector<int64_t> idx{i, (i + 7) % 400, (i + 100) % 400};
          Tensor batch = ds.get_batch(idx, "x", 2);
          for (size_t b = 0; b < idx.size(); ++b)
            if (!batch[static_cast<int64_t>(b)].equal(field_value(schema[0], idx[b]))) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  CacheStats stats = ds.cache_stats();
  EXPECT_LE(stats.bytes_cached, 2048);
  EXPECT_GT(stats.evictions, 0);
}

// Batches big enough to be split between threads (tens of KB and up): the caller walks its
// pieces up from the front, helpers walk theirs down from the back, in pieces that shrink
// toward the middle; every row must still land where it belongs, in the contiguous and the
// strided (channels-last) copy, whatever the batch size and thread count.
TEST(DatasetTest, GetBatchSplitBetweenThreadsMatchesGet) {
  TempDir dir;
  Schema schema({Field::fixed("image", kUInt8, {4, 16, 16}), Field::fixed("y", kInt32, {3})});
  for (const char* codec : {"none", "lz4"}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.chunk_records = 64;
    options.overwrite = true;
    write_dataset(dir.file("split.mmt"), schema, 1500, options);
    const Dataset ds = Dataset::open(dir.file("split.mmt"));
    std::mt19937_64 random(11);
    for (int64_t batch : {int64_t{64}, int64_t{65}, int64_t{255}, int64_t{256}, int64_t{1000}, int64_t{1500}}) {
      std::vector<int64_t> indices(static_cast<size_t>(batch));
      for (int64_t& i : indices) i = static_cast<int64_t>(random() % 3000) - 1500;  // negatives too
      for (int threads : {2, 3, 4}) {
        const Tensor out = ds.get_batch(indices, "image", threads);
        Tensor channels_last = empty({batch, 4, 16, 16}, kUInt8, kCPU, MemoryFormat::ChannelsLast);
        ds.get_batch(indices, "image", channels_last, threads);
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t i = indices[static_cast<size_t>(b)] < 0 ? indices[static_cast<size_t>(b)] + 1500
                                                                : indices[static_cast<size_t>(b)];
          const Tensor want = field_value(schema[0], i);
          ASSERT_TRUE(out[b].equal(want)) << codec << " batch " << batch << " threads " << threads << " row " << b;
          ASSERT_TRUE(channels_last[b].equal(want)) << codec << " batch " << batch << " threads " << threads
                                                    << " row " << b << " (channels-last)";
        }
      }
    }
  }
  // Shards read as one take the same split, each record looked up in its part.
  std::vector<std::string> parts;
  for (int p = 0; p < 3; ++p) {
    WriterOptions options;
    options.chunk_records = 64;
    parts.push_back(dir.file("part-" + std::to_string(p) + ".mmt"));
    write_dataset(parts.back(), schema, 500, options);
  }
  const Dataset shards = Dataset::open_concat(parts);
  std::mt19937_64 random(12);
  for (int64_t batch : {int64_t{64}, int64_t{257}, int64_t{1500}}) {
    std::vector<int64_t> indices(static_cast<size_t>(batch));
    for (int64_t& i : indices) i = static_cast<int64_t>(random() % 1500);
    const Tensor out = shards.get_batch(indices, "image", 2);
    for (int64_t b = 0; b < batch; ++b)
      ASSERT_TRUE(out[b].equal(shards.get(indices[static_cast<size_t>(b)], "image")))
          << "shards, batch " << batch << " row " << b;
  }
}

TEST(DatasetTest, GetBatchMatchesGetForEveryLayout) {
  TempDir dir;
  Schema schema({Field::fixed("image", kUInt8, {3, 8, 8}), Field::fixed("y", kFloat32, {2})});
  for (const char* codec : {"none", "lz4"}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.chunk_records = 16;
    options.overwrite = true;
    write_dataset(dir.file("b.mmt"), schema, 100, options);
    Dataset ds = Dataset::open(dir.file("b.mmt"));
    std::vector<int64_t> indices{99, 0, 5, 5, -1, 42, 17, 63};
    auto expect_rows = [&](const Tensor& out, const std::string& field, size_t f) {
      for (size_t b = 0; b < indices.size(); ++b) {
        int64_t i = indices[b] < 0 ? indices[b] + 100 : indices[b];
        ASSERT_TRUE(out[static_cast<int64_t>(b)].equal(field_value(schema[f], i))) << codec << " " << field << " " << b;
      }
    };
    expect_rows(ds.get_batch(indices, "image"), "image", 0);
    expect_rows(ds.get_batch(indices, "y", 2), "y", 1);
    // A channels-last output buffer: the strided-copy path.
    Tensor cl = empty({8, 3, 8, 8}, kUInt8, kCPU, MemoryFormat::ChannelsLast);
    ds.get_batch(indices, "image", cl, 2);
    expect_rows(cl, "image", 0);
    // Every other row of a larger buffer.
    Tensor big = zeros({16, 2}, kFloat32);
    Tensor rows = big.slice(0, 0, 16, 2);
    ds.get_batch(indices, "y", rows);
    expect_rows(rows, "y", 1);
  }
}

TEST(DatasetTest, GetBatchRefusesAnOutputWhoseRowsShareMemoryAndThreadsBelowOne) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt32, {2}), Field::fixed("label", kInt64, {})});
  write_dataset(dir.file("o.mmt"), schema, 10, {});
  Dataset ds = Dataset::open(dir.file("o.mmt"));
  const std::vector<int64_t> indices{1, 2, 3};
  // Three rows written to one place: what the batch held would depend on thread timing.
  EXPECT_THROW_WITH(ds.get_batch(indices, "label", zeros({1}, kInt64).expand({3})), ValueError,
                    "may share memory");
  EXPECT_THROW_WITH(ds.get_batch(indices, "x", zeros({3, 1}, kInt32).expand({3, 2})), ValueError,
                    "may share memory");
  // Rows of a larger buffer, reversed by a negative stride or transposed, share nothing.
  Tensor big = zeros({4, 6}, kInt32);
  ds.get_batch(indices, "x", big.as_strided({3, 2}, {-6, 2}, 18));
  EXPECT_TRUE(big[3].slice(0, 0, 4, 2).equal(field_value(schema[0], 1)));
  EXPECT_TRUE(big[1].slice(0, 0, 4, 2).equal(field_value(schema[0], 3)));
  Tensor transposed = zeros({2, 3}, kInt32).t();
  ds.get_batch(indices, "x", transposed);
  EXPECT_TRUE(transposed[2].equal(field_value(schema[0], 3)));
  for (int threads : {0, -7})
    EXPECT_THROW_WITH(ds.get_batch(indices, "label", threads), ValueError, "threads must be >= 1");
}

// Gathers `batch` random records (every other one by its negative index) of a 100-record lz4
// file in 7 chunks with `threads` threads, checks every row, and returns the cache's counts.
CacheStats shuffled_batch_cache_stats(const Field& field, int batch, int threads, uint32_t seed) {
  TempDir dir;
  Schema schema({field});
  Dataset ds = write_chunked(dir.file("s.mmt"), schema, 100, "lz4", 16);  // 7 chunks
  std::vector<int64_t> indices;
  std::mt19937 rng(seed);
  for (int b = 0; b < batch; ++b) indices.push_back(static_cast<int64_t>(rng() % 100) - (b % 2 ? 100 : 0));
  Tensor out = ds.get_batch(indices, field.name, threads);
  for (size_t b = 0; b < indices.size(); ++b)
    EXPECT_TRUE(out[static_cast<int64_t>(b)].equal(field_value(schema[0], (indices[b] + 100) % 100))) << b;
  return ds.cache_stats();
}

// A shuffled batch over a compressed file asks the cache once per chunk, not once per record.
TEST(DatasetTest, ShuffledBatchLooksUpEachChunkOnce) {
  const CacheStats stats = shuffled_batch_cache_stats(Field::fixed("v", kInt32, {3}), 64, 1, 11);
  EXPECT_EQ(stats.misses, 7);
  EXPECT_LE(stats.hits + stats.misses, 7) << "more cache lookups than chunks";
}

TEST(DatasetTest, ShuffledBatchOnTwoThreadsLooksUpEachChunkOnce) {
  // 256 KB: split across two threads.
  const CacheStats stats = shuffled_batch_cache_stats(Field::fixed("v", kUInt8, {1024}), 256, 2, 5);
  // Planned once for the whole batch: each missing chunk is decoded by one thread, and the
  // copying threads never look a chunk up again (before, each slice of the batch did).
  EXPECT_EQ(stats.misses, 7);
  EXPECT_EQ(stats.hits, 0) << "cache lookups beyond one per chunk";
}

// One call for several fields gives what one call per field gives, on every kind of file:
// contiguous, compressed, and chunked by a ragged field; on one thread and split across two;
// with the chunks cached, and with a cache too small to hold any (every chunk is decoded by
// the thread that copies from it).
TEST(DatasetTest, GetBatchOfSeveralFieldsMatchesOneCallPerFieldOnOneAndTwoThreads) {
  TempDir dir;
  const std::vector<Schema> schemas{
      Schema({Field::fixed("image", kUInt8, {3, 16, 16}), Field::fixed("y", kFloat32, {2})}),
      Schema({Field::fixed("image", kUInt8, {3, 16, 16}), Field::bytes("raw"), Field::fixed("y", kFloat32, {2})})};
  const std::vector<std::string> fields{"y", "image"};
  std::vector<int64_t> indices;
  std::mt19937 rng(7);
  for (int b = 0; b < 300; ++b) indices.push_back(static_cast<int64_t>(rng() % 200) - (b % 3 == 0 ? 200 : 0));
  for (const Schema& schema : schemas) {
    for (const char* codec : {"none", "lz4", "zstd"}) {
      WriterOptions options;
      options.codec = CodecSpec::parse(codec);
      options.chunk_records = 16;
      options.overwrite = true;
      write_dataset(dir.file("m.mmt"), schema, 200, options);
      for (int64_t cache_bytes : {int64_t{64} << 20, int64_t{0}}) {
        ReaderOptions reader;
        reader.cache_bytes = cache_bytes;
        Dataset ds = Dataset::open(dir.file("m.mmt"), reader);
        for (int threads : {1, 2}) {
          const std::string where = std::string(codec) + ", " + std::to_string(schema.size()) + " fields, cache " +
                                    std::to_string(cache_bytes) + ", " + std::to_string(threads) + " thread(s)";
          std::vector<Tensor> outs{empty({300, 2}, kFloat32), empty({300, 3, 16, 16}, kUInt8)};
          ds.get_batch(indices, fields, outs, threads);
          EXPECT_TRUE(outs[0].equal(ds.get_batch(indices, "y"))) << where;
          EXPECT_TRUE(outs[1].equal(ds.get_batch(indices, "image"))) << where;
          for (size_t b = 0; b < indices.size(); ++b) {
            const int64_t i = (indices[b] + 200) % 200;
            ASSERT_TRUE(outs[1][static_cast<int64_t>(b)].equal(field_value(schema[0], i))) << where << ", row " << b;
          }
        }
      }
    }
  }
}

TEST(DatasetTest, GetBatchOfSeveralFieldsRefusesWhatOneFieldRefuses) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt32, {2}), Field::bytes("raw")});
  write_dataset(dir.file("r.mmt"), schema, 10, {});
  Dataset ds = Dataset::open(dir.file("r.mmt"));
  std::vector<int64_t> indices{1, 2};
  const std::vector<std::string> x_and_raw{"x", "raw"};
  std::vector<Tensor> outs{empty({2, 2}, kInt32), empty({2}, kUInt8)};
  try {
    ds.get_batch(indices, x_and_raw, outs);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'raw' is ragged"), std::string::npos) << e.what();
  }
  const std::vector<std::string> just_x{"x"};
  try {
    ds.get_batch(indices, just_x, outs);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("1 fields but 2 output tensors"), std::string::npos) << e.what();
  }
  const std::vector<int64_t> out_of_range{1, 10};
  EXPECT_THROW(ds.get_batch(out_of_range, just_x, std::span<const Tensor>(outs.data(), 1)), IndexError);
  ds.get_batch(indices, std::span<const std::string>(), std::span<const Tensor>());  // nothing to do
}

// Outputs of several fields must not share memory with each other (threads would write both
// fields to the same bytes in an unspecified order): what may overlap is refused, naming both
// fields, before anything is written; separate buffers and disjoint views of one pass.
TEST(DatasetTest, GetBatchOfSeveralFieldsRefusesOutputsThatMayShareMemory) {
  TempDir dir;
  Schema schema({Field::fixed("x", kInt32, {2}), Field::fixed("y", kInt32, {2}), Field::fixed("label", kInt64, {})});
  for (const char* codec : {"none", "lz4"}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.chunk_records = 4;
    options.overwrite = true;
    write_dataset(dir.file("m.mmt"), schema, 10, options);
    Dataset ds = Dataset::open(dir.file("m.mmt"));
    const std::vector<int64_t> indices{7, 1, -1};
    const std::vector<std::string> x_y{"x", "y"};
    auto expect_rows = [&](const Tensor& out, size_t f) {
      for (size_t b = 0; b < indices.size(); ++b)
        EXPECT_TRUE(out[static_cast<int64_t>(b)].equal(field_value(schema[f], (indices[b] + 10) % 10)))
            << codec << " field " << f << " row " << b;
    };

    // The same tensor for two fields.
    const Tensor same = full({3, 2}, -1, kInt32);
    EXPECT_THROW_WITH(ds.get_batch(indices, x_y, std::vector{same, same}), ValueError,
                      "the output tensors for fields 'x' (outs[0]) and 'y' (outs[1]) may share memory (bytes [0, 23] "
                      "and [0, 23] of one storage: they cannot be shown disjoint)");
    EXPECT_TRUE(same.equal(full({3, 2}, -1, kInt32))) << "written before the refusal";
    // The same field twice, into one tensor: refused too (the message tells the two apart).
    EXPECT_THROW_WITH(ds.get_batch(indices, std::vector<std::string>{"x", "x"}, std::vector{same, same}), ValueError,
                      "fields 'x' (outs[0]) and 'x' (outs[1])");
    // Two interleaved views of one buffer that share a column: refused, whichever pair.
    const Tensor three_columns = zeros({3, 3}, kInt32);
    const std::vector<std::string> label_x_y{"label", "x", "y"};
    EXPECT_THROW_WITH(ds.get_batch(indices, label_x_y,
                                   std::vector{zeros({3}, kInt64), three_columns.narrow(1, 0, 2),
                                               three_columns.narrow(1, 1, 2)}),
                      ValueError, "fields 'x' (outs[1]) and 'y' (outs[2]) may share memory (bytes [0, 31] and [4, 35]");
    // Two storages over the same memory: addresses are compared, not storages.
    const UntypedStorage alias =
        UntypedStorage::from_blob(same.mutable_data_ptr(), same.nbytes(), [](void*) {});
    EXPECT_THROW_WITH(ds.get_batch(indices, x_y, std::vector{same, Tensor(alias, kInt32, {3, 2})}), ValueError,
                      "of storages over the same memory");

    // Separate buffers.
    std::vector<Tensor> separate{empty({3, 2}, kInt32), empty({3, 2}, kInt32)};
    ds.get_batch(indices, x_y, separate, 2);
    expect_rows(separate[0], 0);
    expect_rows(separate[1], 1);
    // The two halves of one buffer.
    const Tensor halves = zeros({6, 2}, kInt32);
    ds.get_batch(indices, x_y, std::vector{halves.narrow(0, 0, 3), halves.narrow(0, 3, 3)});
    expect_rows(halves.narrow(0, 0, 3), 0);
    expect_rows(halves.narrow(0, 3, 3), 1);
    // Columns of one buffer: the rows take turns.
    const Tensor four_columns = zeros({3, 4}, kInt32);
    ds.get_batch(indices, x_y, std::vector{four_columns.narrow(1, 2, 2), four_columns.narrow(1, 0, 2)}, 2);
    expect_rows(four_columns.narrow(1, 2, 2), 0);
    expect_rows(four_columns.narrow(1, 0, 2), 1);
    // An array of 16-byte records: x at byte 0, label at byte 8, of different dtypes.
    const UntypedStorage records = UntypedStorage::allocate(3 * 16);
    const Tensor x_rows(records, kInt32, {3, 2}, {4, 1}, 0), labels(records, kInt64, {3}, {2}, 1);
    ds.get_batch(indices, std::vector<std::string>{"x", "label"}, std::vector{x_rows, labels});
    expect_rows(x_rows, 0);
    expect_rows(labels, 2);
  }
}

// A file may hold thousands of fields: their outputs are checked against each other by where
// they lie (a get_batch of 40,000 one-byte fields spent seconds comparing every pair), and
// what overlaps is still refused, naming both fields, wherever they are in the list.
TEST(DatasetTest, GetBatchOfManyFieldsChecksOutputsAndRefusesAnOverlap) {
  TempDir dir;
  constexpr int64_t kFields = 40;
  std::vector<Field> fields;
  std::vector<std::string> names;
  for (int64_t f = 0; f < kFields; ++f) {
    names.push_back("f" + std::to_string(f));
    fields.push_back(Field::fixed(names.back(), kInt32, {}));
  }
  const Schema schema(fields);
  write_dataset(dir.file("wide.mmt"), schema, 10, WriterOptions{});
  const Dataset ds = Dataset::open(dir.file("wide.mmt"));
  const std::vector<int64_t> indices{7, 1, 4};
  const auto expect_rows = [&](const std::vector<Tensor>& outs) {
    for (int64_t f = 0; f < kFields; ++f)
      for (size_t b = 0; b < indices.size(); ++b)
        ASSERT_TRUE(outs[f][static_cast<int64_t>(b)].equal(field_value(schema[f], indices[b]))) << f << " " << b;
  };
  std::vector<Tensor> separate;
  for (int64_t f = 0; f < kFields; ++f) separate.push_back(empty({3}, kInt32));
  ds.get_batch(indices, names, separate);
  expect_rows(separate);
  // Columns of one [B, 40] buffer, in reverse: every extent meets every other, and the rows
  // still take turns.
  const Tensor table = zeros({3, kFields}, kInt32);
  std::vector<Tensor> columns;
  for (int64_t f = 0; f < kFields; ++f) columns.push_back(table.select(1, kFields - 1 - f));
  ds.get_batch(indices, names, columns, 2);
  expect_rows(columns);
  // One buffer given for two fields far apart in the list, and two columns alike.
  std::vector<Tensor> twice = separate;
  twice[31] = twice[5];
  EXPECT_THROW_WITH(ds.get_batch(indices, names, twice), ValueError,
                    "the output tensors for fields 'f5' (outs[5]) and 'f31' (outs[31]) may share memory");
  columns[2] = columns[37];
  EXPECT_THROW_WITH(ds.get_batch(indices, names, columns), ValueError, "fields 'f2' (outs[2]) and 'f37' (outs[37])");
}

// Records past 65,536 need more than two passes of the batch sort by record; duplicates keep
// their positions.
TEST(DatasetTest, ShuffledBatchOverManyRecordsComesBackInBatchOrder) {
  TempDir dir;
  constexpr int64_t kRecords = 70000;
  Schema schema({Field::fixed("v", kInt32, {})});
  WriterOptions options;
  options.codec = CodecSpec::parse("lz4");
  options.chunk_records = 1000;
  DatasetWriter writer = DatasetWriter::create(dir.file("many.mmt"), schema, options);
  Tensor values = empty({kRecords}, kInt32);
  for (int64_t i = 0; i < kRecords; ++i) values.mutable_data_ptr<int32_t>()[i] = static_cast<int32_t>(i);
  writer.append_batch(std::span<const Tensor>(&values, 1));
  writer.finish();
  Dataset ds = Dataset::open(dir.file("many.mmt"));
  std::vector<int64_t> indices;
  std::mt19937_64 rng(9);
  for (int b = 0; b < 500; ++b) indices.push_back(static_cast<int64_t>(rng() % kRecords));
  indices[100] = indices[7];
  indices[300] = kRecords - 1;
  indices[301] = -kRecords;
  Tensor out = ds.get_batch(indices, "v");
  for (size_t b = 0; b < indices.size(); ++b)
    ASSERT_EQ(out.data_ptr<int32_t>()[b], (indices[b] + kRecords) % kRecords) << "row " << b;
}

// With every chunk cached, the calling thread looks each chunk up once before the copy is
// split: the copying threads never take the cache's lock.
TEST(DatasetTest, CachedBatchOnTwoThreadsLooksUpEachChunkOnce) {
  TempDir dir;
  Schema schema({Field::fixed("v", kUInt8, {1024})});
  Dataset ds = write_chunked(dir.file("c.mmt"), schema, 100, "lz4", 16);  // 7 chunks
  std::vector<int64_t> indices;
  std::mt19937 rng(5);
  for (int b = 0; b < 256; ++b) indices.push_back(static_cast<int64_t>(rng() % 100));
  (void)ds.get_batch(indices, "v", 2);  // decodes every chunk
  const CacheStats before = ds.cache_stats();
  Tensor out = ds.get_batch(indices, "v", 2);
  const CacheStats after = ds.cache_stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.hits - before.hits, 7);
  for (size_t b = 0; b < indices.size(); ++b)
    ASSERT_TRUE(out[static_cast<int64_t>(b)].equal(field_value(schema[0], indices[b]))) << b;
}

TEST(DatasetTest, GetBatchSplitsLargeBatchesAcrossThreads) {
  TempDir dir;
  Schema schema({Field::fixed("v", kUInt8, {4096})});
  WriterOptions options;
  write_dataset(dir.file("t.mmt"), schema, 300, options);
  Dataset ds = Dataset::open(dir.file("t.mmt"));
  std::vector<int64_t> indices;
  std::mt19937 rng(3);
  for (int b = 0; b < 256; ++b) indices.push_back(static_cast<int64_t>(rng() % 300));
  Tensor out = ds.get_batch(indices, "v", 4);
  for (size_t b = 0; b < indices.size(); ++b)
    ASSERT_TRUE(out[static_cast<int64_t>(b)].equal(field_value(schema[0], indices[b])));
}

TEST(DatasetTest, ErrorsNameWhatIsWrong) {
  TempDir dir;
  Schema schema({Field::fixed("image", kUInt8, {2, 2}), Field::fixed("label", kInt64, {}), Field::bytes("raw")});
  write_dataset(dir.file("err.mmt"), schema, 10, {});
  Dataset ds = Dataset::open(dir.file("err.mmt"));
  try {
    ds.get(10);
    FAIL();
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("record index 10 is out of range for a dataset of 10 records"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ds.get(-11), IndexError);
  try {
    ds.get(0, "imgae");
    FAIL();
  } catch (const ValueError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("unknown field 'imgae'"), std::string::npos) << message;
    EXPECT_NE(message.find("'image', 'label', 'raw'"), std::string::npos) << message;
  }
  EXPECT_THROW(ds.get(0)["nope"], ValueError);
  std::vector<int64_t> indices{1, 2};
  try {
    ds.get_batch(indices, "image", empty({2, 2, 2}, kFloat32));
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("uint8"), std::string::npos) << e.what();
  }
  try {
    ds.get_batch(indices, "image", empty({2, 4}, kUInt8));
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 2, 2]"), std::string::npos) << e.what();
  }
  std::vector<int64_t> bad{1, 10};
  EXPECT_THROW(ds.get_batch(bad, "label"), IndexError);
  EXPECT_THROW(ds.get_batch(indices, "raw"), ValueError);
  EXPECT_THROW(ds.column("raw"), ValueError);
  EXPECT_THROW(ds.chunk(99), IndexError);
  EXPECT_THROW(Dataset().size(), ValueError);
  EXPECT_THROW(Dataset::open(dir.file("missing.mmt")), IoError);
  EXPECT_THROW(Dataset::open(dir.path().string()), IoError);
}

TEST(DatasetTest, MetadataAndInfoRoundTrip) {
  TempDir dir;
  Schema schema({Field::fixed("x", kFloat32, {4})});
  WriterOptions options;
  options.metadata = {{"source", "unit test"}, {"license", "CC0"}};
  options.codec = CodecSpec::parse("zstd:5");
  options.chunk_records = 3;
  DatasetWriter writer = DatasetWriter::create(dir.file("m.mmt"), schema, options);
  writer.set_metadata("split", "train");
  for (int64_t i = 0; i < 10; ++i) writer.append({field_value(schema[0], i)});
  WriteStats stats = writer.finish();
  EXPECT_EQ(stats.records, 10);
  EXPECT_EQ(stats.chunks, 4);
  Dataset ds = Dataset::open(dir.file("m.mmt"));
  EXPECT_EQ(ds.metadata().at("source"), "unit test");
  EXPECT_EQ(ds.metadata().at("split"), "train");
  DatasetInfo info = ds.info();
  EXPECT_EQ(info.format_version, 1u);
  EXPECT_EQ(info.records, 10);
  EXPECT_EQ(info.chunks, 4);
  EXPECT_EQ(info.codec, CodecSpec::parse("zstd:5"));
  EXPECT_EQ(info.decoded_bytes, 10 * 16);
  EXPECT_EQ(info.file_bytes, static_cast<int64_t>(std::filesystem::file_size(dir.file("m.mmt"))));
  EXPECT_EQ(stats.bytes_out, info.file_bytes);
}

TEST(DatasetTest, PrefetchAndAdviceAreHarmlessHints) {
  TempDir dir;
  Schema schema({Field::fixed("x", kFloat32, {256})});
  write_dataset(dir.file("p.mmt"), schema, 64, {});
  Dataset ds = Dataset::open(dir.file("p.mmt"));
  std::vector<int64_t> indices{0, 1, 2, 40, 63};
  ds.prefetch(indices);
  ds.advise(AccessAdvice::Sequential);
  expect_all_records(ds, schema, 64);
  std::vector<int64_t> bad{64};
  EXPECT_THROW(ds.prefetch(bad), IndexError);
}

TEST(DatasetTest, CopiesOfAHandleShareOneCache) {
  TempDir dir;
  Schema schema({Field::fixed("x", kFloat32, {4})});
  WriterOptions options;
  options.codec = CodecSpec::parse("lz4");
  write_dataset(dir.file("h.mmt"), schema, 10, options);
  Dataset a = Dataset::open(dir.file("h.mmt"));
  Dataset b = a;
  a.get(0);
  b.get(1);
  EXPECT_EQ(a.cache_stats().misses, 1);
  EXPECT_EQ(b.cache_stats().hits, 1);
}

}  // namespace
}  // namespace mmt
