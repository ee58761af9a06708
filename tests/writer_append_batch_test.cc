// DatasetWriter::append_batch: B records in one call write exactly the file that B calls of
// append() would (every chunking, codec, storage order and source layout), and a bad batch is
// refused whole, naming the field, with the writer left usable. So do ragged fields given in
// PyTorch's jagged layout (values back to back and offsets).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
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

TEST(WriterAppendBatch, RaggedFieldsGivenBFirstWriteTheSameFile) {
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

// A batch in PyTorch's jagged layout (values back to back, offsets): text bytes with int32
// offsets that start past 0 (a slice of a larger column, as Arrow's are), tokens with int64
// offsets and empty records, boxes [-1, 4], boxes [-1, 3] stored column by column, a fixed
// label, and a [2, -1] field given [B, 2, 5] as append_batch(values) takes it.
struct JaggedSources {
  Schema schema{{Field::bytes("text"), Field::ragged("tokens", kInt32, {kVariableDim}),
                 Field::ragged("boxes", kFloat32, {kVariableDim, 4}),
                 Field::ragged("points", kFloat32, {kVariableDim, 3}).with_storage_order({1, 0}),
                 Field::fixed("label", kInt64, {}), Field::ragged("pair", kUInt8, {2, kVariableDim})}};
  int64_t n = 0;
  Tensor text, text_offsets, tokens, token_offsets, boxes, box_offsets, points, point_offsets, labels, pairs;

  explicit JaggedSources(int64_t records) : n(records) {
    std::vector<int32_t> text_at{5};
    std::vector<int64_t> token_at{0}, box_at{0}, point_at{0};
    for (int64_t i = 0; i < n; ++i) {
      text_at.push_back(text_at.back() + static_cast<int32_t>((i * 37) % 300));
      token_at.push_back(token_at.back() + (i % 5 == 0 ? 0 : (i * 13) % 700));
      box_at.push_back(box_at.back() + i % 4);
      point_at.push_back(point_at.back() + (i * 7) % 3);
    }
    text = counting_bytes({text_at.back() + 11});
    text_offsets = from_vector(text_at);
    tokens = arange(token_at.back(), kInt32);
    token_offsets = from_vector(token_at);
    boxes = arange(box_at.back() * 4, kFloat32).reshape({box_at.back(), 4});
    box_offsets = from_vector(box_at);
    points = arange(point_at.back() * 3, kFloat32).reshape({point_at.back(), 3});
    point_offsets = from_vector(point_at);
    labels = arange(n, kInt64);
    pairs = counting_bytes({n, 2, 5});
  }
  template <class T>
  static Tensor from_vector(const std::vector<T>& v) {
    Tensor t = empty({static_cast<int64_t>(v.size())}, std::is_same_v<T, int32_t> ? kInt32 : kInt64);
    std::memcpy(t.mutable_data_ptr(), v.data(), v.size() * sizeof(T));
    return t;
  }
  static Tensor rows(const Tensor& values, const Tensor& offsets, int64_t i) {
    const int64_t from = offsets.select(0, i).item<int64_t>(), to = offsets.select(0, i + 1).item<int64_t>();
    return values.narrow(0, from, to - from);
  }
  std::vector<Tensor> record(int64_t i) const {
    return {rows(text, text_offsets, i), rows(tokens, token_offsets, i), rows(boxes, box_offsets, i),
            rows(points, point_offsets, i), labels.select(0, i), pairs.select(0, i)};
  }
};

TEST(WriterAppendBatch, JaggedFieldsWriteTheSameFileAsAppendingRecordByRecord) {
  TempDir dir;
  const JaggedSources sources(600);
  struct Case {
    const char* codec;
    int64_t chunk_bytes;
    int64_t chunk_records;
  };
  for (const Case& c : {Case{"none", 1 << 20, 0}, Case{"none", 3000, 0}, Case{"none", 1 << 20, 7},
                        Case{"lz4", 5000, 0}, Case{"zstd:3", 1 << 20, 64}}) {
    WriterOptions options;
    options.codec = CodecSpec::parse(c.codec);
    options.chunk_bytes = c.chunk_bytes;
    options.chunk_records = c.chunk_records;
    options.alignment = 64;
    options.overwrite = true;
    {
      DatasetWriter writer = DatasetWriter::create(dir.file("one.mmt"), sources.schema, options);
      for (int64_t i = 0; i < sources.n; ++i) writer.append(sources.record(i));
      writer.finish();
    }
    const std::string expected = file_bytes(dir.file("one.mmt"));
    for (const std::vector<int64_t>& sizes :
         std::vector<std::vector<int64_t>>{{600}, {1}, {3, 0, 250, 1, 64}, {7}, {599, 1}}) {
      DatasetWriter writer = DatasetWriter::create(dir.file("batch.mmt"), sources.schema, options);
      int64_t start = 0;
      for (size_t k = 0; start < sources.n; ++k) {
        const int64_t count = std::min(sizes[k % sizes.size()], sources.n - start);
        const Tensor undefined;
        writer.append_batch(
            std::vector<Tensor>{sources.text, sources.tokens, sources.boxes, sources.points,
                                sources.labels.narrow(0, start, count), sources.pairs.narrow(0, start, count)},
            std::vector<Tensor>{sources.text_offsets.narrow(0, start, count + 1),
                                sources.token_offsets.narrow(0, start, count + 1),
                                sources.box_offsets.narrow(0, start, count + 1),
                                sources.point_offsets.narrow(0, start, count + 1), undefined, undefined});
        start += count;
      }
      writer.finish();
      ASSERT_EQ(file_bytes(dir.file("batch.mmt")), expected)
          << c.codec << " chunk_bytes " << c.chunk_bytes << " chunk_records " << c.chunk_records << " first batch "
          << sizes[0];
    }
  }
  Dataset ds = Dataset::open(dir.file("batch.mmt"));
  ASSERT_EQ(ds.size(), sources.n);
  for (int64_t i : {0, 1, 5, 299, 599}) {
    const Sample s = ds.get(i);
    const std::vector<Tensor> want = sources.record(i);
    for (size_t f = 0; f < want.size(); ++f)
      EXPECT_TRUE(s[sources.schema[f].name].equal(want[f])) << "record " << i << ", " << sources.schema[f].name;
  }
}

TEST(WriterAppendBatch, BadOffsetsAreRefusedWholeNamingTheRecord) {
  TempDir dir;
  Schema schema({Field::bytes("text"), Field::fixed("label", kInt64, {}), Field::ragged("ok", kBool, {kVariableDim}),
                 Field::ragged("pair", kUInt8, {2, kVariableDim})});
  DatasetWriter writer = DatasetWriter::create(dir.file("b.mmt"), schema);
  const Tensor undefined;
  const Tensor bools = zeros({6}, kBool);
  const auto offsets = [](std::vector<int64_t> v) { return JaggedSources::from_vector(v); };
  writer.append_batch(std::vector<Tensor>{counting_bytes({10}), zeros({2}, kInt64), bools, zeros({2, 2, 3}, kUInt8)},
                      std::vector<Tensor>{offsets({0, 4, 10}), undefined, offsets({0, 1, 6}), undefined});
  auto message_of = [&](std::vector<Tensor> values, std::vector<Tensor> offsets) {
    try {
      writer.append_batch(values, offsets);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor text = counting_bytes({10}), labels = zeros({2}, kInt64), pairs = zeros({2, 2, 3}, kUInt8);
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({0, 6, 5}), undefined, offsets({0, 1, 6}), undefined}),
            "append_batch at record 3, field 'text': offsets decrease (6 then 5)");
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({0, 6, 11}), undefined, offsets({0, 1, 6}), undefined}),
            "append_batch at record 3, field 'text': offsets reach 11, past the 10 values given");
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({-1, 6, 8}), undefined, offsets({0, 1, 6}), undefined}),
            "append_batch at record 2, field 'text': its first offset is -1");
  EXPECT_EQ(message_of({text, labels, bools, pairs},
                       {offsets({0, 6, 8}).to(kFloat32), undefined, offsets({0, 1, 6}), undefined}),
            "append_batch at record 2, field 'text': offsets must be [B + 1] int64 or int32, got float32[3]");
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({0, 6}), undefined, offsets({0, 1, 6}), undefined}),
            "append_batch at record 2, field 'label': holds 2 records but field 'text' holds 1");
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({0, 6, 8}), offsets({0, 1, 2}), offsets({0, 1, 6}), undefined}),
            "append_batch at record 2, field 'label' (shape []) takes no offsets: only a field whose one variable "
            "dimension is its first does");
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({0, 6, 8}), undefined, offsets({0, 1, 6}), offsets({0, 1, 2})}),
            "append_batch at record 2, field 'pair' (shape [2, -1]) takes no offsets: only a field whose one "
            "variable dimension is its first does");
  EXPECT_EQ(message_of({counting_bytes({10, 1}), labels, bools, pairs}, {offsets({0, 6, 8}), undefined, offsets({0, 1, 6}), undefined}),
            "append_batch at record 2, field 'text': expected its values back to back, [-1] with the records along "
            "dimension 0 (1 dimensions), got [10, 1]");
  EXPECT_EQ(message_of({text, labels, bools, pairs}, {offsets({0, 6, 8}), undefined, offsets({0, 1, 6})}),
            "append_batch at record 2: expected 4 offsets tensors (one per field, undefined where a field has none), got 3");
  // A bool byte other than 0 or 1 is named by its record and its element there.
  Tensor bad_bools = zeros({6}, kBool);
  reinterpret_cast<uint8_t*>(bad_bools.mutable_data_ptr())[4] = 2;
  EXPECT_EQ(message_of({text, labels, bad_bools, pairs}, {offsets({0, 6, 8}), undefined, offsets({0, 1, 6}), undefined}),
            "record 3, field 'ok': bool element 3 holds the byte 2; a bool value may hold only 0 and 1");
  // Nothing of the refused batches went in.
  EXPECT_EQ(writer.size(), 2);
  writer.append_batch(std::vector<Tensor>{text, labels, bools, pairs},
                      std::vector<Tensor>{offsets({2, 2, 9}), undefined, offsets({6, 6, 6}), undefined});
  writer.finish();
  Dataset ds = Dataset::open(dir.file("b.mmt"));
  ASSERT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.get(1)["text"].size(0), 6);
  EXPECT_EQ(ds.get(2)["text"].size(0), 0);
  EXPECT_TRUE(ds.get(3)["text"].equal(text.narrow(0, 2, 7)));
  EXPECT_EQ(ds.get(3)["ok"].size(0), 0);
}

}  // namespace
}  // namespace mmt
