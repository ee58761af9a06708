// DatasetWriter::append_batch: B records in one call write exactly the file that B calls of
// append() would (every chunking, codec, storage order and source layout), and a bad batch is
// refused whole, naming the field, with the writer left usable.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::file_bytes;
using testing::TempDir;

// image uint8 [1, 28, 28], label int64, and a float32 [3, 4, 5] stored channels-last: a
// record with padding between its values and a field whose storage order is not its shape.
Schema mixed_schema() {
  return Schema({Field::fixed("image", kUInt8, {1, 28, 28}), Field::fixed("label", kInt64, {}),
                 Field::fixed("feature", kFloat32, {3, 4, 5}).with_storage_order({1, 2, 0})});
}

// A contiguous uint8 tensor holding 0, 1, 2, ... (mod 251).
Tensor counting_bytes(IntArrayRef sizes) {
  Tensor t = empty(sizes, kUInt8);
  uint8_t* p = t.mutable_data_ptr<uint8_t>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = static_cast<uint8_t>(k % 251);
  return t;
}

// Sources of `n` records, none of them contiguous: each is a view with the record dimension
// somewhere other than first in memory.
std::vector<Tensor> mixed_sources(int64_t n) {
  Tensor images = counting_bytes({28, 28, 1, n}).permute({3, 2, 0, 1});
  Tensor labels = arange(2 * n, kInt64).slice(0, 0, 2 * n, 2);  // every other value: stride 2
  Tensor features = arange(n * 60, kFloat32).reshape({3, 4, 5, n}).permute({3, 0, 1, 2});
  return {images, labels, features};
}

std::string write_record_by_record(const std::string& path, const std::vector<Tensor>& sources,
                                   const WriterOptions& options) {
  DatasetWriter writer = DatasetWriter::create(path, mixed_schema(), options);
  const int64_t n = sources[0].size(0);
  for (int64_t i = 0; i < n; ++i)
    writer.append({sources[0].select(0, i), sources[1].select(0, i), sources[2].select(0, i)});
  writer.finish();
  return file_bytes(path);
}

std::string write_in_batches(const std::string& path, const std::vector<Tensor>& sources,
                             const WriterOptions& options, const std::vector<int64_t>& batch_sizes) {
  DatasetWriter writer = DatasetWriter::create(path, mixed_schema(), options);
  const int64_t n = sources[0].size(0);
  int64_t start = 0;
  for (size_t k = 0; start < n; ++k) {
    const int64_t count = std::min(batch_sizes[k % batch_sizes.size()], n - start);
    std::vector<Tensor> batch;
    for (const Tensor& source : sources) batch.push_back(source.narrow(0, start, count));
    writer.append_batch(batch);
    start += count;
  }
  writer.finish();
  return file_bytes(path);
}

TEST(WriterAppendBatch, WritesTheSameFileAsAppendingRecordByRecord) {
  TempDir dir;
  const std::vector<Tensor> sources = mixed_sources(1000);
  struct Case {
    const char* codec;
    int64_t chunk_bytes;
    int64_t chunk_records;
  };
  for (const Case& c : {Case{"none", 1 << 20, 0}, Case{"none", 10000, 0}, Case{"none", 1 << 20, 7},
                        Case{"lz4", 20000, 0}, Case{"zstd:3", 1 << 20, 64}}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(c.codec);
    options.chunk_bytes = c.chunk_bytes;
    options.chunk_records = c.chunk_records;
    options.overwrite = true;
    const std::string expected = write_record_by_record(dir.file("one.mmt"), sources, options);
    for (const std::vector<int64_t>& sizes :
         std::vector<std::vector<int64_t>>{{1000}, {1}, {3, 0, 250, 1, 64}, {7}, {999, 1}}) {
      const std::string actual = write_in_batches(dir.file("batch.mmt"), sources, options, sizes);
      ASSERT_EQ(actual, expected) << c.codec << " chunk_bytes " << c.chunk_bytes << " chunk_records "
                                  << c.chunk_records << " first batch " << sizes[0];
    }
  }
  // And the records read back as the sources hold them.
  Dataset ds = Dataset::open(dir.file("batch.mmt"));
  ASSERT_EQ(ds.size(), 1000);
  for (int64_t i : {0, 1, 499, 999}) {
    Sample s = ds.get(i);
    EXPECT_TRUE(s["image"].equal(sources[0].select(0, i))) << i;
    EXPECT_TRUE(s["label"].equal(sources[1].select(0, i))) << i;
    EXPECT_TRUE(s["feature"].equal(sources[2].select(0, i))) << i;
  }
}

TEST(WriterAppendBatch, RaggedFieldsGoRecordByRecordToTheSameFile) {
  TempDir dir;
  Schema schema({Field::bytes("data"), Field::fixed("label", kInt64, {})});
  Tensor data = counting_bytes({50, 9});
  Tensor labels = arange(50, kInt64);
  WriterOptions options;
  options.chunk_records = 8;
  {
    DatasetWriter writer = DatasetWriter::create(dir.file("one.mmt"), schema, options);
    for (int64_t i = 0; i < 50; ++i) writer.append({data.select(0, i), labels.select(0, i)});
    writer.finish();
  }
  {
    DatasetWriter writer = DatasetWriter::create(dir.file("batch.mmt"), schema, options);
    writer.append_batch(std::vector<Tensor>{data.narrow(0, 0, 13), labels.narrow(0, 0, 13)});
    writer.append_batch(std::vector<Tensor>{data.narrow(0, 13, 37), labels.narrow(0, 13, 37)});
    writer.finish();
  }
  EXPECT_EQ(file_bytes(dir.file("batch.mmt")), file_bytes(dir.file("one.mmt")));
}

TEST(WriterAppendBatch, ABadBatchIsRefusedWholeAndTheWriterStaysUsable) {
  TempDir dir;
  Schema schema({Field::fixed("image", kUInt8, {28, 28}), Field::fixed("label", kInt64, {})});
  DatasetWriter writer = DatasetWriter::create(dir.file("b.mmt"), schema);
  writer.append_batch(std::vector<Tensor>{zeros({5, 28, 28}, kUInt8), zeros({5}, kInt64)});
  auto message_of = [&](std::vector<Tensor> batch) {
    try {
      writer.append_batch(batch);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message_of({zeros({4, 28, 28}, kUInt8), zeros({3}, kInt64)}),
            "append_batch at record 5, field 'label': holds 3 records but field 'image' holds 4");
  EXPECT_EQ(message_of({zeros({4, 28, 28}, kUInt8), zeros({4}, kInt32)}),
            "append_batch at record 5, field 'label': expected dtype int64, got int32");
  EXPECT_EQ(message_of({zeros({4, 28, 27}, kUInt8), zeros({4}, kInt64)}),
            "append_batch at record 5, field 'image': expected records of shape [28, 28], got [4, 28, 27] (B first)");
  EXPECT_EQ(message_of({zeros({28, 28}, kUInt8), zeros({4}, kInt64)}),
            "append_batch at record 5, field 'image': expected [B, 28, 28] (3 dimensions), got [28, 28]");
  EXPECT_EQ(message_of({zeros({4, 28, 28}, kUInt8)}),
            "append_batch at record 5: expected 2 tensors (one per field), got 1");
  // An empty batch is checked as any other (it used to be let through whatever it held).
  EXPECT_EQ(message_of({zeros({0, 28, 28}, kUInt8), zeros({0}, kInt32)}),
            "append_batch at record 5, field 'label': expected dtype int64, got int32");
  EXPECT_EQ(message_of({zeros({0, 28, 27}, kUInt8), zeros({0}, kInt64)}),
            "append_batch at record 5, field 'image': expected records of shape [28, 28], got [0, 28, 27] (B first)");
  // Nothing of the refused batches went in; a sound empty batch is a no-op.
  writer.append_batch({zeros({0, 28, 28}, kUInt8), zeros({0}, kInt64)});
  EXPECT_EQ(writer.size(), 5);
  // The README's spelling: a braced list of the batch's tensors.
  writer.append_batch({full({2, 28, 28}, 9, kUInt8), full({2}, 7, kInt64)});
  writer.finish();
  Dataset ds = Dataset::open(dir.file("b.mmt"));
  ASSERT_EQ(ds.size(), 7);
  EXPECT_EQ(ds.get(6)["label"].item<int64_t>(), 7);
  EXPECT_EQ(ds.get(6)["image"].data_ptr<uint8_t>()[0], 9);
}

}  // namespace
}  // namespace mmt
