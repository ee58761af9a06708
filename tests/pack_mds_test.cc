// MosaicML Streaming (MDS) datasets as pack sources (PackSources::from_mds): one record per
// sample, a field per column, values viewing the mapped shards; compressed shards; every
// damaged shard or index refused with the shard, the sample and the column.
#include <gtest/gtest.h>

#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "checksum.h"
#include "importer_test_util.h"
#include "mds_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::error_of;
using testutil::Bytes;
using testutil::MdsBuilder;
using testutil::TempFolder;
using testutil::text_of;
using testutil::to_bytes;
using testutil::write_file;

// An NDArray of int32 with its dtype and 1-D shape in the sample, as "ndarray" writes it.
Bytes dynamic_int32_array(const std::vector<int32_t>& values) {
  Bytes out{std::byte{33}, std::byte{(1 << 2) | 0}, static_cast<std::byte>(values.size())};  // int32, 1-D, uint8 shape
  const Bytes data = MdsBuilder::bytes_of(values);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Columns as MDSWriter sorts them: image (fixed array), label (int), text (str), tokens
// (ndarray of int32, shape in the sample).
MdsBuilder four_columns() {
  return MdsBuilder({{"image", "ndarray:uint8:2,3", 6}, {"label", "int", 8}, {"text", "str"}, {"tokens", "ndarray"}});
}

void add_samples(MdsBuilder& builder, int first, int count) {
  for (int i = first; i < first + count; ++i) {
    std::vector<uint8_t> image(6);
    for (int k = 0; k < 6; ++k) image[static_cast<size_t>(k)] = static_cast<uint8_t>(i * 10 + k);
    std::vector<int32_t> tokens(static_cast<size_t>(i % 4 + 1), i * 1000);
    builder.sample({MdsBuilder::bytes_of(image), MdsBuilder::bytes_of(std::vector<int64_t>{i - 5}),
                    to_bytes("caption " + std::to_string(i)), dynamic_int32_array(tokens)});
  }
}

TEST(PackMds, SamplesBecomeRecordsAndColumnsFields) {
  TempFolder dir;
  MdsBuilder builder = four_columns();
  add_samples(builder, 0, 3);
  builder.flush(dir.path(), "shard.00000.mds");
  add_samples(builder, 3, 2);
  builder.flush(dir.path(), "shard.00001.mds");
  builder.write_index(dir.path());

  EXPECT_TRUE(are_mds_inputs(std::vector<std::string>{dir.path()}));
  EXPECT_TRUE(are_mds_inputs(std::vector<std::string>{dir / "index.json"}));
  // The same dataset twice (its folder, then its index) is refused, as a TFRecord file or
  // tar archive given twice is.
  EXPECT_NE(error_of([&] { PackSources::from_mds(std::vector<std::string>{dir.path(), dir / "index.json"}); })
                .find("input '" + (dir / "index.json") + "' is the dataset of " + (dir / "index.json") +
                      " again; each MDS dataset is packed once"),
            std::string::npos);
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{dir.path()});
  ASSERT_EQ(sources.records(), 5);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 4u);
  EXPECT_EQ(schema[0].dtype, kUInt8);
  EXPECT_EQ(schema[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(schema[1].dtype, kInt64);
  EXPECT_TRUE(schema[1].shape.empty());
  EXPECT_FALSE(schema[2].is_fixed());
  EXPECT_EQ(schema[3].dtype, kInt32);  // from the first sample's array
  EXPECT_FALSE(schema[3].is_fixed());
  EXPECT_EQ(sources.metadata().at("source"), "mds");
  EXPECT_NE(sources.metadata().at("mds_encodings").find("\"text\":\"str\""), std::string::npos);
  for (int i = 0; i < 5; ++i) {
    const std::vector<Tensor> values = sources.record(i);
    EXPECT_EQ(values[0].select(0, 1).select(0, 2).item<uint8_t>(), i * 10 + 5) << i;
    EXPECT_EQ(values[1].item<int64_t>(), i - 5) << i;
    EXPECT_EQ(text_of(values[2]), "caption " + std::to_string(i));
    ASSERT_EQ(values[3].numel(), i % 4 + 1);
    EXPECT_EQ(values[3].flatten()[0].item<int32_t>(), i * 1000);
  }
  // Bytes are views of the mapped shard; where a record comes from names it.
  EXPECT_EQ(sources.record(4)[2].untyped_storage().filename(), dir / "shard.00001.mds");
  EXPECT_EQ(sources.record_origin(2, 4), "sample 1 of " + dir / "shard.00001.mds" + " (column 'text')");

  const std::string out = dir / "out.mmt";
  pack_dataset(out, sources, {});
  const Dataset ds = Dataset::open(out);
  EXPECT_EQ(compare_with_sources(ds, sources), 5);
  EXPECT_EQ(text_of(ds[3]["text"]), "caption 3");
}

Bytes zstd_of(const Bytes& in) {
  Bytes out(ZSTD_compressBound(in.size()));
  out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3));
  return out;
}

TEST(PackMds, CompressedShardsAreDecompressedWhenTheRawOneIsAbsent) {
  TempFolder dir;
  MdsBuilder builder = four_columns();
  add_samples(builder, 0, 2);
  const Bytes first = builder.shard_bytes();
  builder.flush(dir.path(), "shard.00000.mds", "shard.00000.mds.zstd", "zstd:7");
  write_file(dir / "shard.00000.mds.zstd", zstd_of(first));
  add_samples(builder, 2, 2);
  const Bytes second = builder.shard_bytes();
  builder.flush(dir.path(), "shard.00001.mds", "shard.00001.mds.gz", "gz");
  write_file(dir / "shard.00001.mds.gz", testutil::gzip_bytes(second));
  builder.write_index(dir.path());
  const PackSources sources = PackSources::from_mds(std::vector<std::string>{dir.path()});
  ASSERT_EQ(sources.records(), 4);
  EXPECT_EQ(text_of(sources.record(3)[2]), "caption 3");
  EXPECT_NE(sources.record_origin(2, 0).find(dir / "shard.00000.mds.zstd"), std::string::npos);
  {
    // Past the scratch budget, a shard is decompressed again when its samples are packed.
    const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "16");
    const PackSources again = PackSources::from_mds(std::vector<std::string>{dir.path()});
    for (int64_t r : {3, 0, 2, 1})
      EXPECT_EQ(text_of(again.record(r)[2]), "caption " + std::to_string(r));
    pack_dataset(dir / "again.mmt", again, {});
    EXPECT_EQ(compare_with_sources(Dataset::open(dir / "again.mmt"), again), 4);
  }

  // Other compressions are named; a missing shard too.
  MdsBuilder other = four_columns();
  add_samples(other, 0, 1);
  TempFolder brotli;
  other.flush(brotli.path(), "shard.00000.mds", "shard.00000.mds.br", "br");
  other.write_index(brotli.path());
  EXPECT_THROW_WITH(PackSources::from_mds(std::vector<std::string>{brotli.path()}), ValueError, "compressed with 'br'");
}

// Samples whose columns are all of fixed size are packed a run of a shard at a time, each
// column a strided view of the shard (uint8 images) or a copy (an int64 at an odd offset): the
// same file as sample by sample, across shard ends, a compressed shard and chunk sizes.
TEST(PackMds, SamplesOfFixedColumnsPackInBatchesAsSampleBySample) {
  TempFolder dir;
  MdsBuilder builder({{"image", "ndarray:uint8:3,5", 15}, {"label", "int", 8}, {"score", "float32", 4}});
  int next = 0;
  const auto add = [&](int count) {
    for (int end = next + count; next < end; ++next) {
      std::vector<uint8_t> image(15);
      for (size_t k = 0; k < image.size(); ++k) image[k] = static_cast<uint8_t>(next * 7 + static_cast<int>(k));
      builder.sample({MdsBuilder::bytes_of(image), MdsBuilder::bytes_of(std::vector<int64_t>{next - 100}),
                      MdsBuilder::bytes_of(std::vector<float>{next * 0.5f})});
    }
  };
  add(700);
  builder.flush(dir.path(), "shard.00000.mds");
  add(1);
  builder.flush(dir.path(), "shard.00001.mds");
  add(1300);
  const Bytes last = builder.shard_bytes();
  builder.flush(dir.path(), "shard.00002.mds", "shard.00002.mds.zstd", "zstd:3");
  write_file(dir / "shard.00002.mds.zstd", zstd_of(last));
  builder.write_index(dir.path());
  const PackSources sources = PackSources::from_mds(std::vector<std::string>{dir.path()});
  ASSERT_EQ(sources.records(), 2001);
  std::vector<Tensor> values, offsets;
  ASSERT_EQ(sources.jagged_record_batch(10, 1000, values, offsets), 690);  // to the shard's end
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0].sizes(), (std::vector<int64_t>{690, 3, 5}));
  EXPECT_EQ(values[0].strides(), (std::vector<int64_t>{27, 5, 1}));  // a view, a sample a row
  EXPECT_EQ(values[0].untyped_storage().filename(), dir / "shard.00000.mds");
  EXPECT_EQ(values[0].select(0, 3).select(0, 0).select(0, 1).item<uint8_t>(), static_cast<uint8_t>(13 * 7 + 1));
  EXPECT_EQ(values[1].select(0, 689).item<int64_t>(), 699 - 100);
  EXPECT_EQ(values[2].select(0, 1).item<float>(), 5.5f);
  EXPECT_FALSE(offsets[0].defined());
  EXPECT_EQ(sources.jagged_record_batch(700, 5, values, offsets), 1);
  EXPECT_EQ(sources.jagged_record_batch(1990, 11, values, offsets), 11);  // out of the decompressed shard
  EXPECT_EQ(values[1].select(0, 10).item<int64_t>(), 2000 - 100);
  testutil::expect_batches_pack_as_records(dir.path(), sources, {1 << 12, 1 << 20});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "batched.mmt"), sources), 2001);
  // A column of arrays of 2 dimensions, each varying: a sample at a time.
  TempFolder mixed;
  MdsBuilder planes(std::vector<MdsBuilder::Column>{{"label", "int", 8}, {"x", "ndarray:uint8"}});
  for (int i = 0; i < 3; ++i) {
    Bytes plane{std::byte{(2 << 2) | 0}, std::byte{1}, static_cast<std::byte>(i + 1)};  // shape (1, i + 1)
    plane.resize(plane.size() + static_cast<size_t>(i + 1), std::byte{5});
    planes.sample({MdsBuilder::bytes_of(std::vector<int64_t>{i}), plane});
  }
  planes.flush(mixed.path(), "shard.00000.mds");
  planes.write_index(mixed.path());
  EXPECT_EQ(PackSources::from_mds(std::vector<std::string>{mixed.path()}).jagged_record_batch(0, 3, values, offsets), 0);
}

// Samples with bytes columns (JPEG bytes, texts), 1-D arrays (tokens) and fixed ones are packed
// a run of a shard at a time, copied into one buffer a column (texts and tokens back to back
// with offsets); a sample of
// 64 KiB or more goes alone, as a view of the shard; a run stops at about 4 MiB. The same file
// as sample by sample, across shard ends, a compressed shard and chunk sizes.
TEST(PackMds, SamplesWithBytesColumnsPackInBatchesAsSampleBySample) {
  TempFolder dir;
  MdsBuilder builder({{"id", "int", 8}, {"jpg", "jpeg"}, {"score", "float32", 4}, {"text", "str"}, {"tokens", "ndarray"}});
  int next = 0;
  const auto add = [&](int count, size_t jpg_bytes) {
    for (int end = next + count; next < end; ++next) {
      Bytes jpg(jpg_bytes == 0 ? static_cast<size_t>(next % 50) : jpg_bytes);
      for (size_t k = 0; k < jpg.size(); ++k) jpg[k] = static_cast<std::byte>(next + static_cast<int>(k));
      builder.sample({MdsBuilder::bytes_of(std::vector<int64_t>{next - 100}), jpg,
                      MdsBuilder::bytes_of(std::vector<float>{next * 0.5f}),
                      to_bytes(next % 7 == 0 ? std::string() : "caption " + std::to_string(next)),
                      dynamic_int32_array(std::vector<int32_t>(static_cast<size_t>(next % 5), next))});
    }
  };
  add(300, 0);
  add(1, 70 << 10);  // sample 300: alone
  add(99, 0);
  builder.flush(dir.path(), "shard.00000.mds");
  add(80, 60 << 10);  // 4.8 MB of samples under 64 KiB each: two runs
  add(20, 0);
  const Bytes last = builder.shard_bytes();
  builder.flush(dir.path(), "shard.00001.mds", "shard.00001.mds.zstd", "zstd:3");
  write_file(dir / "shard.00001.mds.zstd", zstd_of(last));
  builder.write_index(dir.path());
  const PackSources sources = PackSources::from_mds(std::vector<std::string>{dir.path()});
  ASSERT_EQ(sources.records(), 500);
  std::vector<Tensor> values, offsets;
  ASSERT_EQ(sources.jagged_record_batch(10, 490, values, offsets), 290);  // to the large sample
  ASSERT_EQ(values.size(), 5u);
  EXPECT_EQ(values[0].sizes(), (std::vector<int64_t>{290}));
  EXPECT_FALSE(offsets[0].defined());
  EXPECT_EQ(values[0].select(0, 289).item<int64_t>(), 299 - 100);
  EXPECT_EQ(values[2].select(0, 1).item<float>(), 5.5f);
  ASSERT_EQ(offsets[3].sizes(), (std::vector<int64_t>{291}));
  const auto text_at = [&](int64_t k) {
    const int64_t begin = offsets[3].select(0, k).item<int64_t>(), end = offsets[3].select(0, k + 1).item<int64_t>();
    return text_of(values[3].slice(0, begin, end));
  };
  EXPECT_EQ(text_at(0), "caption 10");
  EXPECT_EQ(text_at(4), "");  // sample 14
  EXPECT_EQ(offsets[1].select(0, 1).item<int64_t>() - offsets[1].select(0, 0).item<int64_t>(), 10 % 50);
  // 1-D arrays (tokens of int32, their dtype in each sample): values of their dtype, offsets
  // counting them.
  EXPECT_EQ(values[4].dtype(), kInt32);
  EXPECT_EQ(offsets[4].select(0, 3).item<int64_t>(), 3);  // samples 10 to 12: 0, 1 and 2 tokens
  EXPECT_EQ(values[4].select(0, 0).item<int32_t>(), 11);
  EXPECT_EQ(sources.jagged_record_batch(300, 5, values, offsets), -1);  // 70 KiB: a view, through record()
  EXPECT_EQ(sources.jagged_record_batch(301, 199, values, offsets), 99);  // to the shard's end
  const int64_t first_run = sources.jagged_record_batch(400, 100, values, offsets);
  EXPECT_GT(first_run, 60);
  EXPECT_LT(first_run, 80);  // a run holds 4 MiB at most
  EXPECT_EQ(sources.jagged_record_batch(400 + first_run, 100 - first_run, values, offsets), 100 - first_run);
  testutil::expect_batches_pack_as_records(dir.path(), sources, {1 << 12, 1 << 20});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "batched.mmt"), sources), 500);

  // A shard changed after it was read: named, not packed from.
  {
    std::fstream shard(dir / "shard.00000.mds", std::ios::in | std::ios::out | std::ios::binary);
    const Bytes first = testutil::read_file(dir / "shard.00000.mds");
    uint32_t sample0 = 0;  // its offset: the first after the count
    std::memcpy(&sample0, first.data() + 4, 4);
    shard.seekp(sample0 + 4);  // sample 0's text size, after its jpg's
    shard.write("\xff\xff\xff\x00", 4);
  }
  EXPECT_THROW_WITH(sources.jagged_record_batch(0, 10, values, offsets), IoError,
                    "sample 0 (bytes ");
  EXPECT_THROW_WITH(sources.jagged_record_batch(0, 10, values, offsets), IoError,
                    "the shard changed while it was being packed");
}

// An NDArray of float32 of shape (rows, width), its dtype in the encoding ("ndarray:float32").
Bytes float32_rows(int64_t rows, int64_t width, float first) {
  Bytes out{std::byte{(2 << 2) | 0}, static_cast<std::byte>(rows), static_cast<std::byte>(width)};  // 2-D, uint8 shape
  std::vector<float> values(static_cast<size_t>(rows * width));
  for (size_t k = 0; k < values.size(); ++k) values[k] = first + static_cast<float>(k);
  const Bytes data = MdsBuilder::bytes_of(values);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Arrays whose dimensions after the first are alike in every sample (detection boxes of shape
// (n, 4), n = 0 included) make a [-1, 4] field and pack a run at a time in the jagged layout,
// as sample by sample; arrays whose rows differ keep every dimension variable.
TEST(PackMds, ArraysOfAlikeRowsMakeJaggedFieldsPackedInRuns) {
  TempFolder dir;
  MdsBuilder builder({{"boxes", "ndarray:float32"}, {"label", "int", 8}});
  for (int i = 0; i < 600; ++i) {
    if (i == 400) builder.flush(dir.path(), "shard.00000.mds");
    builder.sample({float32_rows(i % 5, 4, static_cast<float>(i)), MdsBuilder::bytes_of(std::vector<int64_t>{i})});
  }
  builder.flush(dir.path(), "shard.00001.mds");
  builder.write_index(dir.path());
  const PackSources sources = PackSources::from_mds(std::vector<std::string>{dir.path()});
  EXPECT_EQ(sources.schema()[0].shape, (DimVector{kVariableDim, 4}));
  std::vector<Tensor> values, offsets;
  ASSERT_EQ(sources.jagged_record_batch(10, 590, values, offsets), 390);  // to the shard's end
  EXPECT_EQ(values[0].sizes(), (std::vector<int64_t>{390 / 5 * (0 + 1 + 2 + 3 + 4), 4}));  // rows, back to back
  ASSERT_EQ(offsets[0].sizes(), (std::vector<int64_t>{391}));
  EXPECT_EQ(offsets[0].select(0, 1).item<int64_t>(), 0);  // sample 10: no box
  EXPECT_EQ(offsets[0].select(0, 2).item<int64_t>(), 1);  // sample 11: one
  EXPECT_EQ(values[0].select(0, 1).select(0, 3).item<float>(), 12.0f + 3);  // sample 12's first box
  testutil::expect_batches_pack_as_records(dir.path(), sources, {1 << 10, 1 << 20});
  const Dataset packed = Dataset::open(dir / "batched.mmt");
  EXPECT_EQ(compare_with_sources(packed, sources), 600);
  EXPECT_EQ(packed[403]["boxes"].sizes(), (std::vector<int64_t>{3, 4}));
  // A file packed before rows were learned ([-1, -1]) holds the same records: it verifies.
  {
    DatasetWriter older = DatasetWriter::create(
        dir / "older.mmt", Schema({Field::ragged("boxes", kFloat32, {kVariableDim, kVariableDim}), Field::fixed("label", kInt64, {})}));
    for (int64_t i = 0; i < 600; ++i) {
      const Sample sample = packed[i];
      older.append({sample["boxes"], sample["label"]});
    }
    older.finish();
    EXPECT_EQ(compare_with_sources(Dataset::open(dir / "older.mmt"), sources), 600);
  }

  // A shard rewritten after it was read, sample 2's (2, 4) boxes now (4, 2): its rows are no
  // longer the field's, and the pack says the shard changed.
  {
    const Bytes first = testutil::read_file(dir / "shard.00000.mds");
    uint32_t sample2 = 0;
    std::memcpy(&sample2, first.data() + 12, 4);
    std::fstream shard(dir / "shard.00000.mds", std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(sample2 + 4 + 1);  // after its boxes' size and the array's rank byte
    shard.write("\x04\x02", 2);
  }
  EXPECT_THROW_WITH(sources.jagged_record_batch(0, 10, values, offsets), IoError,
                    "sample 2, column 'boxes': its dtype or shape changed while the shard was being packed");

  // One sample of other rows: every dimension variable, and records given one by one.
  TempFolder unlike;
  MdsBuilder mixed({{"boxes", "ndarray:float32"}, {"label", "int", 8}});
  for (int i = 0; i < 20; ++i)
    mixed.sample({float32_rows(i % 3, i == 17 ? 5 : 4, 1.0f), MdsBuilder::bytes_of(std::vector<int64_t>{i})});
  mixed.flush(unlike.path(), "shard.00000.mds");
  mixed.write_index(unlike.path());
  const PackSources unlike_rows = PackSources::from_mds(std::vector<std::string>{unlike.path()});
  EXPECT_EQ(unlike_rows.schema()[0].shape, (DimVector{kVariableDim, kVariableDim}));
  EXPECT_EQ(unlike_rows.jagged_record_batch(0, 20, values, offsets), 0);
  testutil::expect_batches_pack_as_records(unlike.path(), unlike_rows, {1 << 10});
  EXPECT_EQ(Dataset::open(unlike / "batched.mmt")[17]["boxes"].sizes(), (std::vector<int64_t>{2, 5}));

  // Rows of no values in every sample, (n, 0): no [-1, 0] field (a fixed dimension is at least
  // 1), so both dimensions vary. And "ndarray" with the dtype in each sample, rows alike.
  TempFolder empty_rows;
  MdsBuilder hollow({{"boxes", "ndarray:float32"}, {"tokens", "ndarray"}});
  for (int i = 0; i < 12; ++i) {
    Bytes rows_of_two = float32_rows(i % 3, 2, 1.0f);
    rows_of_two.insert(rows_of_two.begin(), std::byte{34});  // NDArray's code for float32
    hollow.sample({float32_rows(i % 4, 0, 0.0f), rows_of_two});
  }
  hollow.flush(empty_rows.path(), "shard.00000.mds");
  hollow.write_index(empty_rows.path());
  const PackSources hollow_rows = PackSources::from_mds(std::vector<std::string>{empty_rows.path()});
  EXPECT_EQ(hollow_rows.schema()[0].shape, (DimVector{kVariableDim, kVariableDim}));
  EXPECT_EQ(hollow_rows.schema()[1].shape, (DimVector{kVariableDim, 2}));
  testutil::expect_batches_pack_as_records(empty_rows.path(), hollow_rows, {1 << 10});
  const Dataset hollow_packed = Dataset::open(empty_rows / "batched.mmt");
  EXPECT_EQ(hollow_packed[3]["boxes"].sizes(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(hollow_packed[5]["tokens"].sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(compare_with_sources(hollow_packed, hollow_rows), 12);
}

TEST(PackMds, EncodingsAreMappedOrRefusedByName) {
  TempFolder dir;
  MdsBuilder scalars({{"f", "float32", 4}, {"j", "json"}, {"u", "uint16", 2}, {"x", "ndarray:int16:2", 4}});
  scalars.sample({MdsBuilder::bytes_of(std::vector<float>{1.5f}), to_bytes("{\"a\": 1}"),
                  MdsBuilder::bytes_of(std::vector<uint16_t>{7}), MdsBuilder::bytes_of(std::vector<int16_t>{-1, 2})});
  scalars.flush(dir.path(), "shard.00000.mds");
  scalars.write_index(dir.path());
  const PackSources sources = PackSources::from_mds(std::vector<std::string>{dir.path()});
  EXPECT_EQ(sources.schema()[0].dtype, kFloat32);
  EXPECT_EQ(sources.record(0)[0].item<float>(), 1.5f);  // unaligned in the shard: copied
  EXPECT_EQ(text_of(sources.record(0)[1]), "{\"a\": 1}");
  EXPECT_EQ(sources.record(0)[3].select(0, 0).item<int16_t>(), -1);

  const auto refusal = [&](MdsBuilder builder, const std::vector<Bytes>& sample) {
    TempFolder d;
    builder.sample(sample);
    builder.flush(d.path(), "shard.00000.mds");
    builder.write_index(d.path());
    return error_of([&] { PackSources::from_mds(std::vector<std::string>{d.path()}); });
  };
  EXPECT_NE(refusal(MdsBuilder(std::vector<MdsBuilder::Column>{{"x", "complex"}}), {to_bytes("x")}).find("not an MDS encoding"), std::string::npos);
  // N-d arrays of no fixed shape: every dimension variable, one rank a column.
  const Bytes two_by_one{std::byte{(2 << 2) | 0}, std::byte{2}, std::byte{1}, std::byte{5}, std::byte{6}};
  {
    TempFolder d;
    MdsBuilder nd(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}});
    nd.sample({Bytes{std::byte{(2 << 2) | 0}, std::byte{1}, std::byte{3}, std::byte{7}, std::byte{8}, std::byte{9}}});
    nd.sample({two_by_one});
    nd.flush(d.path(), "shard.00000.mds");
    nd.write_index(d.path());
    const PackSources arrays = PackSources::from_mds(std::vector<std::string>{d.path()});
    EXPECT_EQ(arrays.schema()[0].shape, (DimVector{kVariableDim, kVariableDim}));
    const Tensor second = arrays.record(1)[0];
    EXPECT_EQ(std::vector<int64_t>(second.sizes().begin(), second.sizes().end()), (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(second.select(0, 1).select(0, 0).item<uint8_t>(), 6);
    EXPECT_EQ(arrays.record(0)[0].select(0, 0).select(0, 2).item<uint8_t>(), 9);
  }
  {
    TempFolder d;
    MdsBuilder mixed(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}});
    mixed.sample({two_by_one});
    mixed.sample({Bytes{std::byte{(1 << 2) | 0}, std::byte{1}, std::byte{4}}});
    mixed.flush(d.path(), "shard.00000.mds");
    mixed.write_index(d.path());
    EXPECT_NE(error_of([&] { PackSources::from_mds(std::vector<std::string>{d.path()}); })
                  .find("sample 1, column 'x': an array of 1 dimensions, where the first sample's has 2"),
              std::string::npos);
  }
  Bytes nine_d{std::byte{(9 << 2) | 0}};
  nine_d.resize(10, std::byte{1});
  EXPECT_NE(refusal(MdsBuilder(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}}), {nine_d})
                .find("an array of 9 dimensions; arrays of 1 to 8 are packed"),
            std::string::npos);
  Bytes short_array{std::byte{(1 << 2) | 0}, std::byte{5}, std::byte{1}};
  EXPECT_NE(refusal(MdsBuilder(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}}), {short_array})
                .find("its array of shape [5] (uint8) does not fill its 1 bytes"),
            std::string::npos);
  // Dimensions of 8 bytes whose product passes 2^63 (one of them 0 or not) are refused.
  Bytes huge{std::byte{(3 << 2) | 3}};
  for (const uint64_t n : {uint64_t{0}, uint64_t{1} << 40, uint64_t{1} << 40})
    for (int k = 0; k < 8; ++k) huge.push_back(static_cast<std::byte>(n >> (8 * k)));
  EXPECT_NE(refusal(MdsBuilder(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}}), {huge})
                .find("dimension 2 of its array is 1099511627776, and its shape's bytes overflow a 64-bit size"),
            std::string::npos);
  {
    // Arrays with no values may have other dimensions of any size: boxes (0, 4) of an image
    // with no object, a (5, 0) or (0, 300) array, as numpy and Streaming write them.
    TempFolder d;
    MdsBuilder boxes(std::vector<MdsBuilder::Column>{{"boxes", "ndarray:float32"}});
    const Bytes two_boxes = [] {
      Bytes out{std::byte{(2 << 2) | 0}, std::byte{2}, std::byte{4}};
      const Bytes values = MdsBuilder::bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
      out.insert(out.end(), values.begin(), values.end());
      return out;
    }();
    boxes.sample({two_boxes});
    boxes.sample({Bytes{std::byte{(2 << 2) | 0}, std::byte{0}, std::byte{4}}});
    boxes.sample({Bytes{std::byte{(2 << 2) | 1}, std::byte{5}, std::byte{0}, std::byte{0}, std::byte{0}}});
    boxes.sample({Bytes{std::byte{(2 << 2) | 1}, std::byte{0}, std::byte{0}, std::byte{44}, std::byte{1}}});
    boxes.flush(d.path(), "shard.00000.mds");
    boxes.write_index(d.path());
    const PackSources sources = PackSources::from_mds(std::vector<std::string>{d.path()});
    const std::vector<std::vector<int64_t>> shapes{{2, 4}, {0, 4}, {5, 0}, {0, 300}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor value = sources.record(static_cast<int64_t>(i))[0];
      EXPECT_EQ(std::vector<int64_t>(value.sizes().begin(), value.sizes().end()), shapes[i]) << i;
    }
    pack_dataset(d.path() + "/boxes.mmt", sources, {});
    const Dataset ds = Dataset::open(d.path() + "/boxes.mmt");
    EXPECT_EQ(ds.get(1)["boxes"].sizes(), IntArrayRef({0, 4}));
    EXPECT_EQ(ds.get(3)["boxes"].sizes(), IntArrayRef({0, 300}));
    EXPECT_EQ(ds.get(0)["boxes"].at<float>({1, 3}), 8.0f);
    EXPECT_EQ(compare_with_sources(ds, sources), 4);
  }
  Bytes unfilled{std::byte{(2 << 2) | 0}, std::byte{1}, std::byte{2}, std::byte{9}};
  EXPECT_NE(refusal(MdsBuilder(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}}), {unfilled})
                .find("its array of shape [1, 2] (uint8) does not fill its 1 bytes"),
            std::string::npos);
  {
    // No sample at all: an array column is 1-D, as it was.
    TempFolder d;
    MdsBuilder none(std::vector<MdsBuilder::Column>{{"x", "ndarray:uint8"}});
    none.flush(d.path(), "shard.00000.mds");
    none.write_index(d.path());
    const PackSources empty_sources = PackSources::from_mds(std::vector<std::string>{d.path()});
    EXPECT_EQ(empty_sources.records(), 0);
    EXPECT_EQ(empty_sources.schema()[0].shape, (DimVector{kVariableDim}));
  }
}

TEST(PackMds, DamagedShardsAndIndexesAreRefusedNamingTheSample) {
  TempFolder dir;
  MdsBuilder builder = four_columns();
  add_samples(builder, 0, 4);
  const Bytes good = builder.shard_bytes();
  builder.flush(dir.path(), "shard.00000.mds");
  builder.write_index(dir.path());
  const std::string shard = dir / "shard.00000.mds";
  const auto refusal = [&](const Bytes& bytes) {
    write_file(shard, bytes);
    return error_of([&] { PackSources::from_mds(std::vector<std::string>{dir.path()}); });
  };
  Bytes count = good;
  count[0] = std::byte{9};
  EXPECT_NE(refusal(count).find("begins with a count of 9 samples, but the index says 4"), std::string::npos);
  Bytes offset = good;
  offset[8] = std::byte{0xFF};
  offset[9] = std::byte{0xFF};  // sample 0's end, far past the file
  EXPECT_NE(refusal(offset).find("sample 0 spans bytes"), std::string::npos);
  Bytes size = good;
  // Sample 0's text size (its first uint32, where offset 0 points) made larger than the sample:
  // a FormatError, by type too.
  const uint32_t first = static_cast<uint32_t>(good[4]) | static_cast<uint32_t>(good[5]) << 8 |
                         static_cast<uint32_t>(good[6]) << 16 | static_cast<uint32_t>(good[7]) << 24;
  size[first] = std::byte{0x7F};
  write_file(shard, size);
  EXPECT_THROW_WITH(PackSources::from_mds(std::vector<std::string>{dir.path()}), FormatError,
                    "sample 0 (bytes " + std::to_string(first));
  // Cut at every byte, and every bit flipped: refused, or read without fault.
  for (size_t cut = 0; cut < good.size(); ++cut)
    EXPECT_NE(refusal(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut))), "") << "cut at " << cut;
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    Bytes flipped = good;
    flipped[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    write_file(shard, flipped);
    try {
      const PackSources sources = PackSources::from_mds(std::vector<std::string>{dir.path()});
      for (int64_t r = 0; r < sources.records(); ++r) (void)sources.record(r);
    } catch (const Error&) {
    }
  }
  write_file(shard, good);
  // The index: another version, another format, a missing shard, hostile JSON.
  const auto index_refusal = [&](const std::string& text) {
    write_file(dir / "index.json", to_bytes(text));
    return error_of([&] { PackSources::from_mds(std::vector<std::string>{dir.path()}); });
  };
  EXPECT_NE(index_refusal("{\"version\": 3, \"shards\": []}").find("not an MDS index of version 2"), std::string::npos);
  EXPECT_NE(index_refusal("[1, 2").find("not a JSON object"), std::string::npos);
  EXPECT_NE(index_refusal("{\"version\": 2, \"shards\": [{\"format\": \"jsonl\"}]}").find("format 'jsonl'"),
            std::string::npos);
  EXPECT_NE(index_refusal("{\"version\": 2, \"shards\": []}").find("no shards"), std::string::npos);
  // The index's column sizes, shard version, size and place of the shard must agree with it.
  const auto with_shard = [&](const std::function<void(nlohmann::json&)>& change) {
    builder.write_index(dir.path());
    nlohmann::json index = nlohmann::json::parse(testing::file_bytes(dir / "index.json"));
    change(index["shards"][0]);
    return index_refusal(index.dump());
  };
  EXPECT_NE(with_shard([](nlohmann::json& s) { s["column_sizes"][2] = 4; })
                .find("column 'text' has column_size 4, but its encoding 'str' makes no fixed size"),
            std::string::npos);
  EXPECT_NE(with_shard([](nlohmann::json& s) { s["version"] = 3; }).find("not a shard of MDS version 2"), std::string::npos);
  EXPECT_NE(with_shard([](nlohmann::json& s) { s["raw_data"]["bytes"] = 5; }).find("but the index says 5"),
            std::string::npos);
  EXPECT_NE(with_shard([](nlohmann::json& s) { s["raw_data"]["basename"] = "../shard.00000.mds"; })
                .find("is not a path inside the index's folder"),
            std::string::npos);
  builder.write_index(dir.path());
  std::filesystem::remove(shard);
  builder.write_index(dir.path());
  EXPECT_THROW_WITH(PackSources::from_mds(std::vector<std::string>{dir.path()}), IoError, "is missing");
}

// MDSWriter(hashes=["xxh64", "sha1"]) puts each shard's digests in raw_data.hashes: one is
// checked, the fastest given, so a shard damaged where its structure still reads is refused,
// not packed.
TEST(PackMds, ShardsAreCheckedAgainstTheDigestsOfTheirIndex) {
  // What python-xxhash's and hashlib's hexdigest() give for b"mmtensor" (xxHash's: the
  // digests' integers in hex, so big-endian).
  const std::string text = "mmtensor";
  const std::pair<const char*, const char*> known[] = {
      {"xxh32", "c305e3b2"},
      {"xxh64", "c8ab1e846ff9c674"},
      {"md5", "20801e4fc7890fe1b2364b2418752aa3"},
      {"sha1", "d7261219894a74f2b2fc9b0d650700b7060fa5c4"},
      {"sha224", "1eb242b5eef2429557c544f62b330a8dbdf5e50be46a83783999af34"},
      {"sha256", "c999b16ea0e312d4b0a1371d0ed31f26a392a7de7f18831d880c0476e1b449bc"},
      {"sha384", "ce891790bbab843f5a96fc66cc0bd40a2e92160432ec774520851e77ac0843e11beeb05a52cd3a2b6b100b208c39774f"},
      {"sha512", "ef481e9f4610984b117677119c1aa84840dc198bdd60977e9aba0f445903b55a9b73dd1986de0f0200534b035654bedc4c"
                 "774ba6f2b311b318bf57bd4fd9cb8b"},
      {"sha3_224", "34ee6051be62a3fd3337d561b85190e57668e4f756b99a827e3b52ee"},
      {"sha3_256", "3a34092c07ac5c858de818558f8331553c4276b60ce588ed70c2af4e93d983a7"},
      {"sha3_384", "2185801e84aeb84e2426bc88e8d28a2c197d8f99ea050bf92896a6bd68c49a220a02b9e99229298c4d25162ce21d2e9c"},
      {"sha3_512", "de99e7dbaabb049e5962aeb7e107d81ed3fa41b957dbda524b0642f2645e61c4deed4db5985e5949d2945614372a6a10397109"
                   "0683b015f20f60b80bf81e8a32"},
      {"blake2b", "c19c8cddd8a465ec7d8b50f0837305c129e1ceca1de291deb9282e62b515376fdfabf4b0043032031bca2da0970a4d97134b0b"
                  "cfd3b3b157a27d3f5e3514585c"},
      {"blake2s", "1c9e14a04661e1b56c9af993d46b5dfd94cd9986a7f7852ae8900e70e522c4bd"}};
  for (const auto& [algorithm, digest] : known)
    EXPECT_EQ(detail::hexdigest(algorithm, text.data(), text.size()), digest) << algorithm;
  EXPECT_EQ(detail::hexdigest("xxh3_64", "", 0), "2d06800538d394c2");
  EXPECT_EQ(detail::hexdigest("xxh128", "", 0), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(detail::hexdigest("xxh3_128", "", 0), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(detail::hexdigest("shake_128", "", 0), std::nullopt);

  TempFolder dir;
  MdsBuilder builder = four_columns();
  add_samples(builder, 0, 4);
  const Bytes good = builder.shard_bytes();
  builder.flush(dir.path(), "shard.00000.mds");
  builder.write_index(dir.path());
  nlohmann::json index = nlohmann::json::parse(testing::file_bytes(dir / "index.json"));
  Bytes damaged = good;
  damaged.back() ^= std::byte{1};  // sample 3's last token: the shard still reads, but is not the one hashed
  const auto digest_of = [](const char* algorithm, const Bytes& bytes) {
    return *detail::hexdigest(algorithm, bytes.data(), bytes.size());
  };
  const auto pack_records = [&] { return PackSources::from_mds(std::vector<std::string>{dir.path()}).records(); };
  for (const auto& [algorithm, digest] : known) {
    SCOPED_TRACE(algorithm);
    index["shards"][0]["raw_data"]["hashes"] = {{algorithm, digest_of(algorithm, good)}};
    write_file(dir / "index.json", to_bytes(index.dump()));
    write_file(dir / "shard.00000.mds", good);
    EXPECT_EQ(pack_records(), 4);
    write_file(dir / "shard.00000.mds", damaged);
    EXPECT_THROW_WITH(pack_records(), FormatError,
                      std::string("shard.00000.mds: its bytes' ") + algorithm + " digest is " +
                          digest_of(algorithm, damaged) + ", but " + (dir / "index.json") + ": shard 0 says ");
  }

  // Of several, the fastest is checked: a wrong SHA-256 beside a right xxHash passes (the
  // index disagrees with itself; the shard is the one xxHash describes), and a wrong SHA-1
  // beside a right MD5 is refused.
  write_file(dir / "shard.00000.mds", good);
  index["shards"][0]["raw_data"]["hashes"] = {{"sha256", "00"}, {"xxh64", digest_of("xxh64", good)}};
  write_file(dir / "index.json", to_bytes(index.dump()));
  EXPECT_EQ(pack_records(), 4);
  index["shards"][0]["raw_data"]["hashes"] = {{"md5", digest_of("md5", good)}, {"sha1", "00"}};
  write_file(dir / "index.json", to_bytes(index.dump()));
  EXPECT_THROW_WITH(pack_records(), FormatError, "sha1 digest is " + digest_of("sha1", good));
  // Upper-case hex is the same digest; names neither library knows leave nothing to check.
  std::string upper = digest_of("sha256", good);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  index["shards"][0]["raw_data"]["hashes"] = {{"sha256", upper}, {"crc32", "00"}};
  write_file(dir / "index.json", to_bytes(index.dump()));
  EXPECT_EQ(pack_records(), 4);
  index["shards"][0]["raw_data"]["hashes"] = {{"crc32", "00"}, {"shake_128", "00"}};
  write_file(dir / "index.json", to_bytes(index.dump()));
  EXPECT_EQ(pack_records(), 4);
}

// Shards are hashed on threads while the next ones are read: of several, the damaged one is
// named, and a compressed shard's decompressed bytes are hashed even once the scratch budget
// has dropped them.
TEST(PackMds, OfManyShardsTheOneDamagedIsNamed) {
  TempFolder dir;
  MdsBuilder builder = four_columns();
  std::vector<Bytes> shards;
  for (int s = 0; s < 6; ++s) {
    add_samples(builder, 2 * s, 2);
    shards.push_back(builder.shard_bytes());
    const std::string name = "shard.0000" + std::to_string(s) + ".mds";
    if (s % 2) {
      builder.flush(dir.path(), name, name + ".zstd", "zstd:3");
      write_file(dir / (name + ".zstd"), zstd_of(shards.back()));
    } else {
      builder.flush(dir.path(), name);
    }
  }
  builder.write_index(dir.path());
  nlohmann::json index = nlohmann::json::parse(testing::file_bytes(dir / "index.json"));
  for (size_t s = 0; s < shards.size(); ++s)
    index["shards"][s]["raw_data"]["hashes"] = {{"sha256", *detail::hexdigest("sha256", shards[s].data(), shards[s].size())}};
  write_file(dir / "index.json", to_bytes(index.dump()));
  const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "16");
  EXPECT_EQ(PackSources::from_mds(std::vector<std::string>{dir.path()}).records(), 12);
  for (const size_t damaged : {size_t{2}, size_t{3}}) {
    SCOPED_TRACE(damaged);
    const std::string name = "shard.0000" + std::to_string(damaged) + ".mds";
    index["shards"][damaged]["raw_data"]["hashes"]["sha256"] = std::string(64, '0');
    write_file(dir / "index.json", to_bytes(index.dump()));
    EXPECT_THROW_WITH(PackSources::from_mds(std::vector<std::string>{dir.path()}), FormatError,
                      name + (damaged % 2 ? ".zstd: its decompressed bytes' sha256 digest is " : ": its bytes' sha256 digest is ") +
                          *detail::hexdigest("sha256", shards[damaged].data(), shards[damaged].size()));
    index["shards"][damaged]["raw_data"]["hashes"]["sha256"] =
        *detail::hexdigest("sha256", shards[damaged].data(), shards[damaged].size());
  }
  // A shard damaged where its structure is read too (its count of samples) is named by its
  // digest, the surer word, not by what its structure then says.
  write_file(dir / "index.json", to_bytes(index.dump()));
  Bytes miscounted = shards[2];
  miscounted[0] = std::byte{7};
  write_file(dir / "shard.00002.mds", miscounted);
  EXPECT_THROW_WITH(PackSources::from_mds(std::vector<std::string>{dir.path()}), FormatError,
                    "shard.00002.mds: its bytes' sha256 digest is " +
                        *detail::hexdigest("sha256", miscounted.data(), miscounted.size()));
}

}  // namespace
}  // namespace mmt
