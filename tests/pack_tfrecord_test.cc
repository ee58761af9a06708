// TensorFlow TFRecord files of tf.train.Example and SequenceExample records as pack sources
// (PackSources::from_tfrecord): one record per Example, one field per feature (and feature
// list), shapes from what the records hold; every damaged file refused naming the record and its byte.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "crc32c.h"
#include "importer_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "test_util.h"
#include "tfrecord.h"
#include "tfrecord_test_util.h"

namespace mmt {
namespace {

using testing::error_of;
using testutil::Bytes;
using testutil::example_bytes;
using testutil::FeatureValue;
using testutil::TempFolder;
using testutil::text_of;
using testutil::tfrecord_file;
using testutil::write_file;
using Strings = std::vector<std::string>;
using Floats = std::vector<float>;
using Ints = std::vector<int64_t>;

std::vector<int64_t> ints_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<int64_t> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size() * 8);
  return out;
}
std::vector<float> floats_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<float> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size() * 4);
  return out;
}

TEST(TfRecord, Crc32cIsCastagnolisWhicheverWayItIsComputed) {
  // RFC 3720's check value.
  EXPECT_EQ(detail::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(detail::crc32c_portable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(detail::crc32c("", 0), 0u);
  std::mt19937 rng(7);
  std::vector<unsigned char> bytes(5000);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (size_t start : {0, 1, 3, 7, 8}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4991}) {
      const uint32_t whole = detail::crc32c_portable(bytes.data() + start, n);
      EXPECT_EQ(detail::crc32c(bytes.data() + start, n), whole) << start << " " << n;
      // Continued across two calls.
      EXPECT_EQ(detail::crc32c(bytes.data() + start + n / 3, n - n / 3, detail::crc32c(bytes.data() + start, n / 3)), whole);
    }
  }
}

// The record TensorFlow's TFRecord tutorial serializes (feature0 False, feature1 4, feature2
// b'goat', feature3 0.9876), as it prints example_observation.SerializeToString().
const std::string kTutorialExample(
    "\nR\n\x14\n\x08" "feature2\x12\x08\n\x06\n\x04goat"
    "\n\x14\n\x08" "feature3\x12\x08\x12\x06\n\x04[\xd3|?"
    "\n\x11\n\x08" "feature0\x12\x05\x1a\x03\n\x01\x00"
    "\n\x11\n\x08" "feature1\x12\x05\x1a\x03\n\x01\x04",
    84);

TEST(TfRecord, TheTensorFlowTutorialsExampleReadsAsTensorFlowWroteIt) {
  // Our test writer makes TensorFlow's bytes exactly.
  EXPECT_EQ(example_bytes({{"feature2", Strings{"goat"}}, {"feature3", Floats{0.9876f}}, {"feature0", Ints{0}},
                           {"feature1", Ints{4}}}),
            kTutorialExample);

  TempFolder dir;
  write_file(dir / "tutorial.tfrecord", tfrecord_file({kTutorialExample, kTutorialExample}));
  const PackSources sources = PackSources::from_tfrecord(std::vector<std::string>{dir / "tutorial.tfrecord"});
  ASSERT_EQ(sources.records(), 2);
  // Fields in name order, each one value a record: scalars, and bytes.
  ASSERT_EQ(sources.schema().size(), 4u);
  EXPECT_EQ(sources.schema()[0].name, "feature0");
  EXPECT_EQ(sources.schema()[0].dtype, kInt64);
  EXPECT_TRUE(sources.schema()[0].is_fixed());
  EXPECT_TRUE(sources.schema()[0].shape.empty());
  EXPECT_EQ(sources.schema()[2].name, "feature2");
  EXPECT_EQ(sources.schema()[2].dtype, kUInt8);
  EXPECT_FALSE(sources.schema()[2].is_fixed());
  EXPECT_EQ(sources.schema()[3].dtype, kFloat32);
  const std::vector<Tensor> record = sources.record(1);
  EXPECT_EQ(ints_of(record[0]), Ints{0});
  EXPECT_EQ(ints_of(record[1]), Ints{4});
  EXPECT_EQ(text_of(record[2]), "goat");
  EXPECT_EQ(floats_of(record[3]), Floats{0.9876f});
  EXPECT_EQ(sources.metadata().at("source"), "tfrecord");
}

// Three records covering every way a feature's records can hold values.
std::vector<std::string> varied_records() {
  return {
      example_bytes({{"image/encoded", Strings{"\xff\xd8jpeg-0"}},
                     {"image/class/label", Ints{3}},
                     {"bbox", Floats{0.1f, 0.2f, 0.3f, 0.4f}},
                     {"tokens", Ints{5, -6, 7}},
                     {"captions", Strings{"a cat", "", "on a mat"}}}),
      // Another order, unpacked numbers, a feature missing (tokens), an empty caption list.
      example_bytes({{"captions", Strings{}},
                     {"bbox", Floats{1.5f, 2.5f, 3.5f, 4.5f}},
                     {"image/class/label", Ints{-1}},
                     {"image/encoded", Strings{"png-1"}}},
                    /*packed=*/false),
      example_bytes({{"image/encoded", Strings{""}},
                     {"image/class/label", Ints{INT64_MIN}},
                     {"bbox", Floats{-1, -2, -3, -4}},
                     {"tokens", Ints{INT64_MAX}},
                     {"captions", Strings{"one"}}}),
  };
}

TEST(TfRecord, FeaturesBecomeFieldsShapedByWhatTheRecordsHold) {
  TempFolder dir;
  const std::string path = dir / "train.tfrecord-00000-of-00001";
  write_file(path, tfrecord_file(varied_records()));
  ASSERT_TRUE(are_tfrecord_inputs(std::vector<std::string>{path}));
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{path});
  ASSERT_EQ(sources.records(), 3);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 6u);
  // bbox: 4 floats in every record.
  EXPECT_EQ(schema[0].name, "bbox");
  EXPECT_EQ(schema[0].dtype, kFloat32);
  EXPECT_EQ(schema[0].shape, (std::vector<int64_t>{4}));
  // captions: other than one value a record: joined, and their lengths.
  EXPECT_EQ(schema[1].name, "captions");
  EXPECT_EQ(schema[2].name, "captions.lengths");
  EXPECT_EQ(schema[2].dtype, kInt64);
  // '/' made '.'; one value a record.
  EXPECT_EQ(schema[3].name, "image.class.label");
  EXPECT_TRUE(schema[3].shape.empty());
  EXPECT_EQ(schema[4].name, "image.encoded");
  EXPECT_EQ(schema[4].dtype, kUInt8);
  // tokens: missing from a record: ragged.
  EXPECT_EQ(schema[5].name, "tokens");
  EXPECT_FALSE(schema[5].is_fixed());

  std::vector<Tensor> r = sources.record(0);
  EXPECT_EQ(floats_of(r[0]), (Floats{0.1f, 0.2f, 0.3f, 0.4f}));
  EXPECT_EQ(text_of(r[1]), "a caton a mat");
  EXPECT_EQ(ints_of(r[2]), (Ints{5, 0, 8}));
  EXPECT_EQ(ints_of(r[3]), Ints{3});
  EXPECT_EQ(text_of(r[4]), "\xff\xd8jpeg-0");
  EXPECT_EQ(r[4].untyped_storage().filename(), path);  // a view of the file
  EXPECT_EQ(ints_of(r[5]), (Ints{5, -6, 7}));
  r = sources.record(1);
  EXPECT_EQ(floats_of(r[0]), (Floats{1.5f, 2.5f, 3.5f, 4.5f}));
  EXPECT_EQ(r[1].numel(), 0);
  EXPECT_EQ(r[2].numel(), 0);
  EXPECT_EQ(ints_of(r[3]), Ints{-1});
  EXPECT_EQ(text_of(r[4]), "png-1");
  EXPECT_EQ(r[5].numel(), 0);  // missing: no values
  r = sources.record(2);
  EXPECT_EQ(ints_of(r[3]), Ints{INT64_MIN});
  EXPECT_EQ(r[4].numel(), 0);
  EXPECT_EQ(ints_of(r[5]), Ints{INT64_MAX});

  EXPECT_NE(sources.metadata().at("tfrecord_features").find(R"("image.encoded":{"key":"image/encoded","kind":"bytes_list"})"),
            std::string::npos)
      << sources.metadata().at("tfrecord_features");
  EXPECT_NE(sources.record_origin(4, 2).find(path + ", record 2 (byte "), std::string::npos) << sources.record_origin(4, 2);
  EXPECT_NE(sources.record_origin(4, 2).find("feature 'image/encoded'"), std::string::npos);
  EXPECT_THROW(sources.check_output(path), ValueError);

  for (const char* codec : {"none", "zstd"}) {
    const std::string out = dir / (std::string("out-") + codec + ".mmt");
    PackOptions options;
    options.writer.codec = CodecSpec::parse(codec);
    pack_dataset(out, sources, options);
    const Dataset ds = Dataset::open(out);
    ASSERT_EQ(ds.size(), 3);
    EXPECT_EQ(text_of(ds[0]["image.encoded"]), "\xff\xd8jpeg-0");
    EXPECT_EQ(ints_of(ds[2]["image.class.label"]), Ints{INT64_MIN});
    EXPECT_EQ(compare_with_sources(ds, sources), 3);
  }
}

TEST(TfRecord, GzipFilesAndSeveralFilesReadAsOneAndFeaturesCanBeChosen) {
  TempFolder dir;
  const std::vector<std::string> records = varied_records();
  write_file(dir / "a.tfrecord.gz", testutil::gzip_bytes(tfrecord_file({records[0], records[1]})));
  write_file(dir / "b.tfrecords", tfrecord_file({records[2]}));
  write_file(dir / "empty.tfrecord", {});
  const std::vector<std::string> paths{dir / "a.tfrecord.gz", dir / "empty.tfrecord", dir / "b.tfrecords"};
  const std::vector<std::string> fields{"image/encoded", "captions", "image.class.label"};
  const PackSources sources = PackSources::from_inputs(paths, fields);
  ASSERT_EQ(sources.records(), 3);
  ASSERT_EQ(sources.schema().size(), 4u);
  EXPECT_EQ(sources.schema()[0].name, "image.encoded");
  EXPECT_EQ(sources.schema()[1].name, "captions");
  EXPECT_EQ(sources.schema()[2].name, "captions.lengths");
  EXPECT_EQ(sources.schema()[3].name, "image.class.label");
  EXPECT_EQ(text_of(sources.record(1)[0]), "png-1");
  EXPECT_EQ(text_of(sources.record(2)[1]), "one");
  EXPECT_NE(sources.record_origin(0, 1).find("a.tfrecord.gz, record 1 (byte "), std::string::npos);
  EXPECT_NE(sources.record_origin(0, 1).find("of the decompressed file"), std::string::npos);
  EXPECT_NE(sources.record_origin(0, 2).find("b.tfrecords, record 0 (byte 0)"), std::string::npos);

  // A dataset's field list (what `mmt verify --against` gives) chooses the same.
  const std::vector<std::string> listed{"image.encoded", "captions", "captions.lengths", "image.class.label"};
  EXPECT_EQ(PackSources::from_tfrecord(paths, listed).schema().size(), 4u);
  // An array beside them is named as such before a file is read (it was "cannot open").
  EXPECT_NE(error_of([&] { PackSources::from_inputs(std::vector<std::string>{paths[2], "x=" + paths[1]}); })
                .find("input 'x=" + paths[1] + "' gives a field name (NAME=PATH), as array inputs do; TFRecord files "
                      "name their fields themselves"),
            std::string::npos);
  const std::string unknown = error_of([&] { PackSources::from_tfrecord(paths, std::vector<std::string>{"label"}); });
  EXPECT_NE(unknown.find("no feature 'label' (features, as fields: bbox, captions, image.class.label"), std::string::npos)
      << unknown;
}

// pack_dataset() takes records of under 64 KiB as batches (each field's values copied into
// one buffer, jagged where they vary); the file is the one that appending record() one by
// one writes, across files, with missing features, chunks that cut the batches and a large
// record between them (which goes alone, its bytes a view of the file).
TEST(TfRecord, BatchesPackTheSameFileAsRecordByRecord) {
  TempFolder dir;
  std::vector<std::string> first, second;
  for (int64_t r = 0; r < 1500; ++r) {
    std::vector<std::pair<std::string, FeatureValue>> features{
        {"image/encoded", Strings{std::string(static_cast<size_t>(r % 97), static_cast<char>('a' + r % 26))}},
        {"label", Ints{r}},
        {"bbox", Floats{static_cast<float>(r), 1, 2, static_cast<float>(-r)}}};
    if (r % 3 != 0) features.push_back({"tokens", Ints(static_cast<size_t>(r % 7), -r)});
    if (r % 5 != 0) features.push_back({"captions", Strings(static_cast<size_t>(r % 4), std::string(static_cast<size_t>(r % 5), 'c'))});
    if (r % 2 == 0) features.push_back({"weights", Floats(static_cast<size_t>(r % 3), 0.5f)});
    if (r == 700) features[0].second = Strings{std::string(size_t{100} << 10, 'L')};  // past 64 KiB: alone
    (r < 1000 ? first : second).push_back(example_bytes(features, /*packed=*/r % 11 != 0));
  }
  write_file(dir / "a.tfrecord", tfrecord_file(first));
  write_file(dir / "b.tfrecord", tfrecord_file(second));
  const PackSources sources = PackSources::from_tfrecord(std::vector<std::string>{dir / "a.tfrecord", dir / "b.tfrecord"});
  ASSERT_EQ(sources.schema().size(), 7u);  // bbox, captions(.lengths), image.encoded, label, tokens, weights
  std::vector<Tensor> values, offsets;
  EXPECT_EQ(sources.jagged_record_batch(0, 1000, values, offsets), 700);  // up to the large record
  EXPECT_EQ(sources.jagged_record_batch(700, 800, values, offsets), -1);
  EXPECT_EQ(sources.jagged_record_batch(701, 799, values, offsets), 299);  // to the end of a.tfrecord
  testutil::expect_batches_pack_as_records(dir.path(), sources, {4096, int64_t{1} << 20});
  const Dataset packed = Dataset::open(dir / "batched.mmt");
  EXPECT_EQ(ints_of(packed[1234]["label"]), Ints{1234});
  EXPECT_EQ(packed[1234]["tokens"].numel(), 1234 % 7);
  EXPECT_EQ(packed[1233]["tokens"].numel(), 0);  // missing
  EXPECT_EQ(packed[700]["image.encoded"].numel(), 100 << 10);
  EXPECT_EQ(compare_with_sources(packed, sources), 1500);
}

std::string pack_error(const std::string& path);
std::string example_error(const std::vector<std::string>& records);

// tf.train.SequenceExample records (YouTube-8M's frame-level files, say): the context packs as
// an Example's features do, and each feature list is a field of the record's steps.
std::vector<std::string> sequence_records() {
  using testutil::sequence_example_bytes;
  return {
      sequence_example_bytes({{"id", Strings{"vid0"}}, {"labels", Ints{1, 5}}},
                             {{"rgb", {Strings{"AAAAAAAA"}, Strings{"BBBBBBBB"}, Strings{"CCCCCCCC"}}},
                              {"audio", {Floats{1, 2, 3, 4}, Floats{5, 6, 7, 8}, Floats{9, 10, 11, 12}}},
                              {"frame_index", {Ints{0}, Ints{1}, Ints{2}}},
                              {"frame_labels", {Ints{1}, Ints{2, 3}, Ints{}}},
                              {"words", {Strings{"a"}, Strings{""}, Strings{"cat!"}}}}),
      sequence_example_bytes({{"id", Strings{"vid1"}}, {"labels", Ints{7}}},
                             {{"words", {}},  // a list of no steps
                              {"frame_labels", {Ints{4}}},
                              {"rgb", {Strings{"DDDDDDDD"}}},
                              {"audio", {Floats{-1, -2, -3, -4}}},
                              {"frame_index", {Ints{0}}}}),
      // No feature lists at all: an Example, each list of no steps.
      example_bytes({{"id", Strings{"vid2"}}, {"labels", Ints{}}}),
  };
}

TEST(TfRecord, SequenceExamplesPackEachFeatureListAsTheRecordsSteps) {
  TempFolder dir;
  const std::string path = dir / "frames.tfrecord";
  write_file(path, tfrecord_file(sequence_records()));
  const PackSources sources = PackSources::from_tfrecord(std::vector<std::string>{path});
  ASSERT_EQ(sources.records(), 3);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 9u);
  // Steps of 4 floats each: [steps, 4].
  EXPECT_EQ(schema[0].name, "audio");
  EXPECT_EQ(schema[0].dtype, kFloat32);
  EXPECT_EQ(schema[0].shape, (std::vector<int64_t>{kVariableDim, 4}));
  // One number a step: [steps].
  EXPECT_EQ(schema[1].name, "frame_index");
  EXPECT_EQ(schema[1].shape, (std::vector<int64_t>{kVariableDim}));
  // Steps of other than one width: the values joined, and each step's count.
  EXPECT_EQ(schema[2].name, "frame_labels");
  EXPECT_EQ(schema[3].name, "frame_labels.lengths");
  EXPECT_EQ(schema[4].name, "id");  // the context, as an Example's features
  EXPECT_EQ(schema[5].name, "labels");
  // One byte string of 8 bytes a step: uint8 [steps, 8].
  EXPECT_EQ(schema[6].name, "rgb");
  EXPECT_EQ(schema[6].dtype, kUInt8);
  EXPECT_EQ(schema[6].shape, (std::vector<int64_t>{kVariableDim, 8}));
  // Strings of other lengths: joined, and each one's length.
  EXPECT_EQ(schema[7].name, "words");
  EXPECT_EQ(schema[8].name, "words.lengths");

  std::vector<Tensor> r = sources.record(0);
  EXPECT_EQ(r[0].sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(floats_of(r[0]), (Floats{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(ints_of(r[1]), (Ints{0, 1, 2}));
  EXPECT_EQ(ints_of(r[2]), (Ints{1, 2, 3}));
  EXPECT_EQ(ints_of(r[3]), (Ints{1, 2, 0}));
  EXPECT_EQ(text_of(r[4]), "vid0");
  EXPECT_EQ(ints_of(r[5]), (Ints{1, 5}));
  EXPECT_EQ(r[6].sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(text_of(r[6]), "AAAAAAAABBBBBBBBCCCCCCCC");
  EXPECT_EQ(text_of(r[7]), "acat!");
  EXPECT_EQ(ints_of(r[8]), (Ints{1, 0, 4}));
  r = sources.record(1);
  EXPECT_EQ(r[0].sizes(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(ints_of(r[3]), Ints{1});
  EXPECT_EQ(r[7].numel(), 0);
  EXPECT_EQ(r[8].numel(), 0);
  r = sources.record(2);  // no lists: no steps, each of its field's width
  EXPECT_EQ(r[0].sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(r[6].sizes(), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(r[2].numel(), 0);
  EXPECT_EQ(text_of(r[4]), "vid2");
  const std::string described = sources.metadata().at("tfrecord_features");
  EXPECT_NE(described.find(R"("rgb":{"key":"rgb","kind":"bytes_list","feature_list":true})"), std::string::npos)
      << described;
  EXPECT_NE(described.find(R"("id":{"key":"id","kind":"bytes_list"})"), std::string::npos) << described;
  EXPECT_NE(sources.record_origin(6, 1).find("feature list 'rgb'"), std::string::npos) << sources.record_origin(6, 1);

  for (const char* codec : {"none", "zstd"}) {
    const std::string out = dir / (std::string("out-") + codec + ".mmt");
    PackOptions options;
    options.writer.codec = CodecSpec::parse(codec);
    pack_dataset(out, sources, options);
    const Dataset ds = Dataset::open(out);
    ASSERT_EQ(ds.size(), 3);
    EXPECT_EQ(ds[0]["rgb"].sizes(), (std::vector<int64_t>{3, 8}));
    EXPECT_EQ(floats_of(ds[1]["audio"]), (Floats{-1, -2, -3, -4}));
    EXPECT_EQ(ds[2]["audio"].sizes(), (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(compare_with_sources(ds, sources), 3);
  }

  // Chosen by key, a list's lengths with it.
  const PackSources chosen =
      PackSources::from_tfrecord(std::vector<std::string>{path}, std::vector<std::string>{"rgb", "words.lengths"});
  ASSERT_EQ(chosen.schema().size(), 3u);
  EXPECT_EQ(chosen.schema()[0].name, "rgb");
  EXPECT_EQ(chosen.schema()[1].name, "words");
}

TEST(TfRecord, SequenceExampleBatchesPackTheSameFileAsRecordByRecord) {
  TempFolder dir;
  std::vector<std::string> records;
  for (int64_t r = 0; r < 1200; ++r) {
    std::vector<std::pair<std::string, std::vector<FeatureValue>>> lists;
    std::vector<FeatureValue> frames, boxes, counts, names;
    for (int64_t t = 0; t < r % 9; ++t) {
      frames.push_back(Strings{std::string(16, static_cast<char>('a' + (r + t) % 26))});
      boxes.push_back(Floats{static_cast<float>(r), static_cast<float>(t), 1, 2});
      counts.push_back(Ints(static_cast<size_t>((r + t) % 4), r * 10 + t));
      names.push_back(Strings{std::string(static_cast<size_t>((r + t) % 5), 'n')});
    }
    if (r % 4 != 1) lists.push_back({"frames", frames});
    lists.push_back({"boxes", boxes});
    lists.push_back({"counts", counts});
    if (r % 3 != 2) lists.push_back({"names", names});
    if (r == 600) lists.back().second = {Strings{std::string(size_t{100} << 10, 'L')}, Strings{"x"}};  // names,
                                                                                                      // alone: past 64 KiB
    records.push_back(testutil::sequence_example_bytes({{"label", Ints{r}}}, lists));
  }
  write_file(dir / "a.tfrecord", tfrecord_file(records));
  const PackSources sources = PackSources::from_tfrecord(std::vector<std::string>{dir / "a.tfrecord"});
  // boxes [-1, 4], counts and counts.lengths, frames [-1, 16], label, names and names.lengths.
  ASSERT_EQ(sources.schema().size(), 7u);
  testutil::expect_batches_pack_as_records(dir.path(), sources, {4096, int64_t{1} << 20});
  const Dataset packed = Dataset::open(dir / "batched.mmt");
  EXPECT_EQ(compare_with_sources(packed, sources), 1200);
  EXPECT_EQ(floats_of(packed[1001]["boxes"]), (Floats{1001, 0, 1, 2, 1001, 1, 1, 2}));  // 1001 % 9 steps
  EXPECT_EQ(packed[1001]["frames"].sizes(), (std::vector<int64_t>{0, 16}));  // r % 4 == 1: no list
  EXPECT_EQ(packed[600]["names"].numel(), (100 << 10) + 1);
  EXPECT_EQ(ints_of(packed[600]["names.lengths"]), (Ints{100 << 10, 1}));
  EXPECT_EQ(ints_of(packed[1003]["counts.lengths"]), (Ints{3, 0, 1, 2}));  // (r + t) % 4 for 1003 % 9 steps
  EXPECT_EQ(ints_of(packed[1003]["counts"]), (Ints{10030, 10030, 10030, 10032, 10033, 10033}));
}

TEST(TfRecord, SequenceExamplesThatCannotBePackedAreRefusedByName) {
  using testutil::sequence_example_bytes;
  // A bytes list whose steps hold two strings: a list of lists of strings.
  std::string e = example_error({sequence_example_bytes({}, {{"tags", {Strings{"a", "b"}}}})});
  EXPECT_NE(e.find("feature list 'tags': its steps hold 2 to 2 byte strings"), std::string::npos) << e;
  // Steps of two kinds.
  e = example_error({sequence_example_bytes({}, {{"x", {Ints{1}}}}), sequence_example_bytes({}, {{"x", {Floats{1}}}})});
  EXPECT_NE(e.find("record 1 (byte "), std::string::npos) << e;
  EXPECT_NE(e.find("feature list 'x' has a step of float_list, but "), std::string::npos) << e;
  // A list given twice.
  e = example_error({sequence_example_bytes({}, {{"x", {Ints{1}}}, {"x", {Ints{2}}}})});
  EXPECT_NE(e.find("feature list 'x' is given twice"), std::string::npos) << e;
  // A list whose steps hold no list anywhere.
  e = example_error({sequence_example_bytes({}, {{"none", {}}, {"y", {Ints{1}}}})});
  EXPECT_NE(e.find("feature list 'none' holds no list in any step of any record"), std::string::npos) << e;
  // A step that is no Feature.
  e = example_error({testutil::message_field(
      2, testutil::message_field(1, testutil::message_field(1, "z") +
                                        testutil::message_field(2, testutil::varint(1 << 3 | 0) + "\x01")))});
  EXPECT_NE(e.find("(in the FeatureList of feature 'z'): a step is not a Feature message"), std::string::npos) << e;
  // A step of no list in a bytes list.
  {
    using testutil::message_field;
    const std::string steps = message_field(1, testutil::feature_message(Strings{"a"})) + message_field(1, "");
    e = example_error({message_field(2, message_field(1, message_field(1, "frames") + message_field(2, steps)))});
    EXPECT_NE(e.find("feature list 'frames': a step holds no byte string"), std::string::npos) << e;
  }
  // A map entry of two values (protobuf would join two FeatureLists' steps).
  e = example_error({testutil::message_field(
      2, testutil::message_field(1, testutil::message_field(1, "v") + testutil::message_field(2, "") +
                                        testutil::message_field(2, "")))});
  EXPECT_NE(e.find("(in a feature list map entry): its value is given twice"), std::string::npos) << e;
  // A list of two kinds is refused only when chosen.
  TempFolder kinds;
  write_file(kinds / "k.tfrecord", tfrecord_file({sequence_example_bytes({{"y", Ints{5}}, {"c", Ints{1}}}, {{"x", {Ints{3}}}}),
                                                  sequence_example_bytes({{"y", Ints{6}}, {"c", Floats{1}}}, {{"x", {Floats{1}}}})}));
  e = pack_error(kinds / "k.tfrecord");
  EXPECT_NE(e.find("; leave it out with --field"), std::string::npos) << e;
  const PackSources only_y =
      PackSources::from_tfrecord(std::vector<std::string>{kinds / "k.tfrecord"}, std::vector<std::string>{"y"});
  EXPECT_EQ(ints_of(only_y.record(1)[0]), Ints{6});
}

// A SequenceExample's context and feature lists may share a key (TensorFlow parses them into
// two dicts); one field cannot hold both. Packing all is refused, naming the spellings that
// choose either; "feature:KEY" and "feature_list:KEY" pack it, and `mmt verify --against`
// chooses it again by the key and kind the dataset's metadata records.
TEST(TfRecord, AContextFeatureAndAFeatureListOfOneKeyAreChosenByKind) {
  using testutil::sequence_example_bytes;
  TempFolder dir;
  const std::string path = dir / "both.tfrecord";
  write_file(path, tfrecord_file({sequence_example_bytes({{"x", Ints{1}}, {"y", Ints{2}}}, {{"x", {Ints{3}, Ints{4, 5}}}}),
                                  sequence_example_bytes({{"x", Ints{6}}, {"y", Ints{7}}}, {{"x", {Ints{8}}}})}));
  std::string e = pack_error(path);
  EXPECT_NE(e.find("feature 'x' and feature list 'x' would both be field 'x' (a SequenceExample's context and "
                   "feature lists may share a key; one dataset field cannot hold both): choose one with --field "
                   "'feature:x' or --field 'feature_list:x'"),
            std::string::npos)
      << e;
  const auto pack = [&](std::vector<std::string> fields) {
    return PackSources::from_tfrecord(std::vector<std::string>{path}, fields);
  };
  // Either alone: the bare key stays ambiguous, the others are chosen as before.
  EXPECT_THROW(pack({"x"}), ValueError);
  EXPECT_EQ(ints_of(pack({"y"}).record(0)[0]), Ints{2});
  const PackSources context = pack({"feature:x", "y"});
  ASSERT_EQ(context.schema().size(), 2u);
  EXPECT_EQ(context.schema()[0].name, "x");
  EXPECT_EQ(context.schema()[0].shape, (std::vector<int64_t>{}));
  EXPECT_EQ(ints_of(context.record(1)[0]), Ints{6});
  const PackSources steps = pack({"feature_list:x"});
  ASSERT_EQ(steps.schema().size(), 2u);  // steps of 1 and 2 values: joined, and their lengths
  EXPECT_EQ(steps.schema()[1].name, "x.lengths");
  EXPECT_EQ(ints_of(steps.record(0)[0]), (Ints{3, 4, 5}));
  EXPECT_EQ(ints_of(steps.record(0)[1]), (Ints{1, 2}));
  EXPECT_EQ(pack({"feature_list:x.lengths"}).schema().size(), 2u);  // the lengths choose their values
  // Both: refused naming both, as two keys of one field name are.
  e = error_of([&] { pack({"feature:x", "feature_list:x"}); });
  EXPECT_NE(e.find("feature 'x' and feature list 'x' would both be field 'x'"), std::string::npos) << e;
  // A qualifier names a key of its kind only.
  e = error_of([&] { pack({"feature_list:y"}); });
  EXPECT_NE(e.find("have no feature or feature list 'feature_list:y'"), std::string::npos) << e;
  // The fields that choose a packed dataset's features again: by key and kind, lengths with
  // their values, and a name the metadata does not describe as it is.
  EXPECT_EQ(PackSources::tfrecord_fields_of(steps.schema(), steps.metadata(), "d.mmt"),
            (std::vector<std::string>{"feature_list:x"}));
  EXPECT_EQ(PackSources::tfrecord_fields_of(context.schema(), context.metadata(), "d.mmt"),
            (std::vector<std::string>{"feature:x", "feature:y"}));
  EXPECT_EQ(PackSources::tfrecord_fields_of(context.schema(), {}, "d.mmt"), (std::vector<std::string>{"x", "y"}));
  e = error_of([&] { PackSources::tfrecord_fields_of(context.schema(), {{"tfrecord_features", "[1]"}}, "d.mmt"); });
  EXPECT_EQ(e, "d.mmt: metadata key 'tfrecord_features' is not a JSON object");
  e = error_of([&] { PackSources::tfrecord_fields_of(context.schema(), {{"tfrecord_features", R"({"x": {"kind": 1}})"}}, "d.mmt"); });
  EXPECT_EQ(e, "d.mmt: metadata key 'tfrecord_features' describes field 'x' without its key");
  // Beside a key spelled as a qualified one, the qualified reading comes first; that key is
  // qualified in turn.
  write_file(dir / "odd.tfrecord", tfrecord_file({example_bytes({{"feature:z", Ints{1}}, {"z", Ints{2}}}),
                                                  example_bytes({{"feature:z", Ints{3}}, {"z", Ints{4}}})}));
  const auto odd = [&](std::vector<std::string> fields) {
    return PackSources::from_tfrecord(std::vector<std::string>{dir / "odd.tfrecord"}, fields);
  };
  EXPECT_EQ(ints_of(odd({"feature:z"}).record(1)[0]), Ints{4});
  EXPECT_EQ(ints_of(odd({"feature:feature:z"}).record(1)[0]), Ints{3});
  // So a dataset of both chooses each again by what its metadata records, not one of them twice.
  const PackSources all = odd({});
  ASSERT_EQ(all.schema().size(), 2u);
  const std::vector<std::string> again = PackSources::tfrecord_fields_of(all.schema(), all.metadata(), "d.mmt");
  EXPECT_EQ(again, (std::vector<std::string>{"feature:feature:z", "feature:z"}));
  const PackSources chosen = odd(again);
  ASSERT_EQ(chosen.schema().size(), 2u);
  EXPECT_EQ(ints_of(chosen.record(1)[0]), Ints{3});
  EXPECT_EQ(ints_of(chosen.record(1)[1]), Ints{4});
}

// Two keys making one field name ('a/b' and 'a.b') are refused together, but either can be
// packed chosen by its key.
TEST(TfRecord, KeysMakingOneFieldNameArePackedOneAtATimeByKey) {
  TempFolder dir;
  write_file(dir / "x.tfrecord", tfrecord_file({example_bytes({{"a/b", Ints{1}}, {"a.b", Ints{2}}, {"c", Ints{3}}})}));
  for (const auto& [key, value] : {std::pair{"a/b", 1}, std::pair{"a.b", 2}}) {
    const PackSources sources =
        PackSources::from_tfrecord(std::vector<std::string>{dir / "x.tfrecord"}, std::vector<std::string>{key});
    ASSERT_EQ(sources.schema().size(), 1u);
    EXPECT_EQ(sources.schema()[0].name, "a.b");
    EXPECT_EQ(ints_of(sources.record(0)[0]), Ints{value}) << key;
  }
  const PackSources c = PackSources::from_tfrecord(std::vector<std::string>{dir / "x.tfrecord"}, std::vector<std::string>{"c"});
  EXPECT_EQ(ints_of(c.record(0)[0]), Ints{3});
  // Both chosen: refused naming both keys.
  std::string e = error_of([&] {
    PackSources::from_tfrecord(std::vector<std::string>{dir / "x.tfrecord"}, std::vector<std::string>{"a/b", "a.b"});
  });
  EXPECT_NE(e.find("features 'a/b' and 'a.b' would both be field 'a.b'"), std::string::npos) << e;
  // A key's other spelling chooses it, and a bytes_list's lengths by its key's spelling.
  write_file(dir / "y.tfrecord", tfrecord_file({example_bytes({{"p.q", Ints{7}}, {"w/z", Strings{"a", "bc"}}})}));
  const PackSources y = PackSources::from_tfrecord(std::vector<std::string>{dir / "y.tfrecord"},
                                                   std::vector<std::string>{"p/q", "w/z.lengths"});
  ASSERT_EQ(y.schema().size(), 3u);
  EXPECT_EQ(y.schema()[0].name, "p.q");
  EXPECT_EQ(y.schema()[2].name, "w.z.lengths");
  // A feature list's lengths and a feature naming the same field, both chosen.
  write_file(dir / "z.tfrecord", tfrecord_file({testutil::sequence_example_bytes(
                                     {{"j/lengths", Ints{1}}}, {{"j", {Ints{1}, Ints{2, 3}}}})}));
  e = error_of([&] { PackSources::from_tfrecord(std::vector<std::string>{dir / "z.tfrecord"}); });
  EXPECT_NE(e.find("feature list 'j' and feature 'j/lengths' would both be field 'j.lengths'"), std::string::npos) << e;
}

// Gzipped files past the scratch budget (MMT_SCRATCH_BYTES) are dropped once scanned and
// decompressed again when their records are read: the same records, batches and views.
TEST(TfRecord, GzipFilesPastTheScratchBudgetAreDecompressedAgainWhenRead) {
  TempFolder dir;
  std::vector<std::string> paths;
  for (int f = 0; f < 3; ++f) {
    std::vector<std::string> records;
    for (int r = 0; r < 5; ++r)
      records.push_back(example_bytes({{"text", Strings{std::string(3000, static_cast<char>('a' + f))}}, {"id", Ints{f * 5 + r}}}));
    paths.push_back(dir / ("part-" + std::to_string(f) + ".tfrecord.gz"));
    write_file(paths.back(), testutil::gzip_bytes(tfrecord_file(records)));
  }
  const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "1K");  // less than one file: only the one in use
  const PackSources sources = PackSources::from_tfrecord(paths);
  ASSERT_EQ(sources.records(), 15);
  for (const int64_t r : {0, 14, 5, 6, 0}) {  // out of order too: each file made again as needed
    const std::vector<Tensor> values = sources.record(r);
    EXPECT_EQ(ints_of(values[0]), Ints{r});
    EXPECT_EQ(text_of(values[1]), std::string(3000, static_cast<char>('a' + r / 5)));
  }
  pack_dataset(dir / "out.mmt", sources, {});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "out.mmt"), sources), 15);
}

std::string pack_error(const std::string& path) {
  return error_of([&] {
    const PackSources sources = PackSources::from_tfrecord(std::vector<std::string>{path});
    for (int64_t i = 0; i < sources.records(); ++i) sources.record(i);
  });
}

// TFRecordOptions(compression_type="ZLIB") writes one zlib stream (RFC 1950) and keeps the
// file's name: such files are read by their header, decompressed as gzip ones are, within the
// scratch budget; a damaged stream is refused naming the file.
TEST(TfRecord, ZlibFilesReadAsTensorFlowWritesThem) {
  TempFolder dir;
  const std::vector<std::string> records = varied_records();
  write_file(dir / "z.tfrecord", testutil::zlib_bytes(tfrecord_file(records)));
  write_file(dir / "plain.tfrecord", tfrecord_file(records));
  const PackSources zlib = PackSources::from_inputs(std::vector<std::string>{dir / "z.tfrecord"});
  const PackSources plain = PackSources::from_inputs(std::vector<std::string>{dir / "plain.tfrecord"});
  ASSERT_EQ(zlib.records(), static_cast<int64_t>(records.size()));
  ASSERT_EQ(zlib.schema().size(), plain.schema().size());
  pack_dataset(dir / "from_zlib.mmt", zlib, {});
  pack_dataset(dir / "from_plain.mmt", plain, {});
  EXPECT_EQ(testutil::read_file(dir / "from_zlib.mmt"), testutil::read_file(dir / "from_plain.mmt"));
  EXPECT_NE(zlib.record_origin(0, 1).find("z.tfrecord, record 1 (byte "), std::string::npos);
  EXPECT_NE(zlib.record_origin(0, 1).find("of the decompressed file"), std::string::npos);

  // Past the budget: dropped once scanned, decompressed again (and checked) when read.
  std::vector<std::string> parts;
  for (int f = 0; f < 3; ++f) {
    parts.push_back(dir / ("part-" + std::to_string(f) + ".tfrecord"));
    write_file(parts.back(), testutil::zlib_bytes(tfrecord_file({example_bytes({{"id", Ints{f}}, {"pad", Strings{std::string(3000, 'p')}}})})));
  }
  {
    const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "1K");
    const PackSources sources = PackSources::from_tfrecord(parts);
    for (const int64_t r : {2, 0, 1, 2}) EXPECT_EQ(ints_of(sources.record(r)[0]), Ints{r});
  }

  // Damaged streams, each naming the file and what is wrong.
  const Bytes whole = testutil::zlib_bytes(tfrecord_file(records));
  write_file(dir / "cut.tfrecord", Bytes(whole.begin(), whole.end() - 9));
  std::string e = pack_error(dir / "cut.tfrecord");
  EXPECT_NE(e.find("cut.tfrecord: the zlib stream is truncated"), std::string::npos) << e;
  Bytes flipped = whole;
  flipped[flipped.size() - 2] ^= std::byte{0x40};  // the Adler-32
  write_file(dir / "flipped.tfrecord", flipped);
  e = pack_error(dir / "flipped.tfrecord");
  EXPECT_NE(e.find("flipped.tfrecord: corrupt zlib data (incorrect data check)"), std::string::npos) << e;
  Bytes trailing = whole;
  testutil::append(trailing, testutil::zlib_bytes(tfrecord_file(records)));
  write_file(dir / "twice.tfrecord", trailing);
  e = pack_error(dir / "twice.tfrecord");
  EXPECT_NE(e.find("twice.tfrecord: " + std::to_string(whole.size()) + " bytes after the end of the zlib stream"),
            std::string::npos) << e;
  write_file(dir / "text.tfrecord", testutil::zlib_bytes(testutil::to_bytes("some text, and no records")));
  e = pack_error(dir / "text.tfrecord");
  EXPECT_NE(e.find("text.tfrecord: neither TFRecord records (the first record's 12-byte header fails its CRC-32C) "
                   "nor a zlib-compressed TFRecord file (it decompresses to something that is not a TFRecord file"),
            std::string::npos) << e;
  EXPECT_THROW(PackSources::from_tfrecord(std::vector<std::string>{dir / "text.tfrecord"}), FormatError);
}

TEST(TfRecord, DamagedFilesAreRefusedNamingTheRecordAndItsByte) {
  TempFolder dir;
  const std::string path = dir / "x.tfrecord";
  const Bytes good = tfrecord_file(varied_records());
  const int64_t second = 12 + static_cast<int64_t>(varied_records()[0].size()) + 4;
  const int64_t third = second + 12 + static_cast<int64_t>(varied_records()[1].size()) + 4;

  Bytes bad = good;
  bad[second + 8] ^= std::byte{1};  // the second length's CRC
  write_file(path, bad);
  std::string e = pack_error(path);
  EXPECT_NE(e.find(path + ": record 1 (byte " + std::to_string(second) + "): its length's CRC-32C is"), std::string::npos) << e;

  bad = good;
  bad[second + 20] ^= std::byte{0x40};  // inside the second record's data
  write_file(path, bad);
  e = pack_error(path);
  EXPECT_NE(e.find("record 1 (byte " + std::to_string(second) + "): the masked CRC-32C of its"), std::string::npos) << e;

  // Cut anywhere: refused (or, cut at a record's end, the records before it), never a crash.
  for (size_t cut = 1; cut < good.size(); ++cut) {
    write_file(path, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)));
    e = pack_error(path);
    const bool at_a_record_end = cut == static_cast<size_t>(second) || cut == static_cast<size_t>(third);
    EXPECT_EQ(e.empty(), at_a_record_end) << cut << ": " << e;
    if (!e.empty()) {
      EXPECT_NE(e.find(path + ": record "), std::string::npos) << e;
    }
  }
  // Every bit flipped: an error or the same records, never a crash (CRCs catch nearly all).
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; bit += 3) {
      bad = good;
      bad[byte] ^= std::byte(1 << bit);
      write_file(path, bad);
      EXPECT_FALSE(pack_error(path).empty()) << byte << " " << bit;
    }
  }
}

// A file of these records, each framed with good CRCs: what the Example parser must refuse.
std::string example_error(const std::vector<std::string>& records) {
  TempFolder dir;
  write_file(dir / "x.tfrecord", tfrecord_file(records));
  return pack_error(dir / "x.tfrecord");
}

TEST(TfRecord, RecordsThatAreNoExamplesOrDisagreeAreRefusedByName) {
  using testutil::message_field;
  using testutil::varint;
  // Not protobuf at all.
  std::string e = example_error({"hello, world"});
  EXPECT_NE(e.find("x.tfrecord, record 0 (byte 0): byte "), std::string::npos) << e;
  // A key given twice.
  e = example_error({message_field(1, message_field(1, message_field(1, "k") + message_field(2, testutil::feature_message(Ints{1}))) +
                                          message_field(1, message_field(1, "k") + message_field(2, testutil::feature_message(Ints{2}))))});
  EXPECT_NE(e.find("feature 'k' is given twice"), std::string::npos) << e;
  // A Feature with two lists.
  e = example_error({message_field(1, message_field(1, message_field(1, "k") +
                                                           message_field(2, message_field(3, "") + message_field(1, ""))))});
  EXPECT_NE(e.find("it holds a bytes_list after a int64_list"), std::string::npos) << e;
  // A varint of 11 bytes, a group, a length past the end, packed floats of 5 bytes.
  e = example_error({varint(5 << 3 | 0) + std::string(10, '\xff') + '\x01'});
  EXPECT_NE(e.find("a varint longer than 64 bits"), std::string::npos) << e;
  e = example_error({varint(1 << 3 | 3)});
  EXPECT_NE(e.find("is a group (wire type 3)"), std::string::npos) << e;
  e = example_error({message_field(1, "") + "\x0a\x7f"});
  EXPECT_NE(e.find("a field of 127 bytes runs past the end of its message"), std::string::npos) << e;
  e = example_error({message_field(1, message_field(1, message_field(1, "f") +
                                                           message_field(2, message_field(2, message_field(1, "12345")))))});
  EXPECT_NE(e.find("(in the float_list of feature 'f'): a packed run of floats holds 5 bytes"), std::string::npos) << e;
  // One key, two kinds.
  e = example_error({example_bytes({{"k", Ints{1}}}), example_bytes({{"k", Floats{1}}})});
  EXPECT_NE(e.find("record 1 (byte "), std::string::npos) << e;
  EXPECT_NE(e.find("feature 'k' is a float_list, but "), std::string::npos) << e;
  EXPECT_NE(e.find("x.tfrecord, record 0 (byte 0) gave it a int64_list"), std::string::npos) << e;
  // Keys that make one field name.
  e = example_error({example_bytes({{"a/b", Ints{1}}, {"a.b", Ints{2}}})});
  EXPECT_NE(e.find("features 'a/b' and 'a.b' would both be field 'a.b'"), std::string::npos) << e;
  // A feature with no list in any record: refused, unless left out.
  const std::string none = message_field(1, message_field(1, message_field(1, "empty") + message_field(2, "")));
  e = example_error({none});
  EXPECT_NE(e.find("feature 'empty' holds no list in any record"), std::string::npos) << e;
  // Not TFRecord framing at all, and a zlib header before no zlib stream.
  TempFolder dir;
  write_file(dir / "y.tfrecord", testutil::to_bytes("this is not a TFRecord file"));
  e = pack_error(dir / "y.tfrecord");
  EXPECT_NE(e.find("is this a TFRecord file?"), std::string::npos) << e;
  write_file(dir / "z.tfrecord", testutil::to_bytes("\x78\x9c rest of a zlib stream"));
  e = pack_error(dir / "z.tfrecord");
  EXPECT_NE(e.find("z.tfrecord: neither TFRecord records (the first record's 12-byte header fails its CRC-32C) nor a "
                   "zlib-compressed TFRecord file (corrupt zlib data ("),
            std::string::npos) << e;
  // An empty file alone holds nothing to pack.
  write_file(dir / "empty.tfrecord", {});
  e = pack_error(dir / "empty.tfrecord");
  EXPECT_NE(e.find("hold no records"), std::string::npos) << e;
}

// A record's length can begin as a compressor's magic does (376 is 78 01, a zlib header;
// 35615 is 1f 8b, gzip's magic): such a file reads as records, and when its first header is
// damaged, the error names the record and what reading it as a stream found.
TEST(TfRecord, FilesWhoseFirstLengthLooksCompressedReadAsRecords) {
  TempFolder dir;
  for (const size_t length : {size_t{376}, size_t{35615}}) {
    std::string record, value;
    while (record.size() < length) {
      value += 'x';
      record = example_bytes({{"b", Strings{value}}});
    }
    ASSERT_EQ(record.size(), length);
    const Bytes file = tfrecord_file({record});
    write_file(dir / "ok.tfrecord", file);
    EXPECT_EQ(text_of(PackSources::from_tfrecord(std::vector<std::string>{dir / "ok.tfrecord"}).record(0)[0]), value);
    const std::string compressed = length == 376 ? ") nor a zlib-compressed TFRecord file (" : ") nor a gzip-compressed TFRecord file (";
    Bytes damaged = file;
    damaged[9] ^= std::byte{1};  // the length's CRC-32C
    write_file(dir / "bad.tfrecord", damaged);
    std::string e = pack_error(dir / "bad.tfrecord");
    EXPECT_NE(e.find("bad.tfrecord: neither TFRecord records (the first record's 12-byte header fails its CRC-32C"
                     + compressed), std::string::npos) << e;
    write_file(dir / "cut.tfrecord", Bytes(file.begin(), file.begin() + 10));
    e = pack_error(dir / "cut.tfrecord");
    EXPECT_NE(e.find("cut.tfrecord: neither TFRecord records (its 10 bytes are fewer than a record's 12-byte header"
                     + compressed), std::string::npos) << e;
  }
  // A gzip TFRecord file cut short is named both ways too: which was meant is not known.
  const Bytes gzipped = testutil::gzip_bytes(tfrecord_file({kTutorialExample}));
  write_file(dir / "cut.tfrecord.gz", Bytes(gzipped.begin(), gzipped.begin() + 15));
  std::string e = pack_error(dir / "cut.tfrecord.gz");
  EXPECT_NE(e.find("cut.tfrecord.gz: neither TFRecord records (the first record's 12-byte header fails its CRC-32C) "
                   "nor a gzip-compressed TFRecord file (the gzip stream is truncated"), std::string::npos) << e;
  // A zlib header that asks for a preset dictionary (FDICT) is no TFRecord writer's.
  write_file(dir / "dict.tfrecord", testutil::to_bytes("\x78\xbb and twenty more bytes"));
  e = pack_error(dir / "dict.tfrecord");
  EXPECT_NE(e.find("dict.tfrecord: record 0 (byte 0): its length's CRC-32C is "), std::string::npos) << e;
  EXPECT_NE(e.find("is this a TFRecord file? (gzip- and zlib-compressed ones are read as such)"), std::string::npos) << e;
  EXPECT_EQ(e.find("neither"), std::string::npos) << e;
}

TEST(TfRecord, ManyKeysAreCheckedInLinearLogarithmicTimeAndCappedWithoutAChoice) {
  // 40 keys, the last a repeat of the 6th: found past the pairwise check, by sorting.
  std::vector<std::pair<std::string, FeatureValue>> features;
  const auto key = [](char letter, int k) {  // appended, as GCC 12's -Wrestrict misfires on "k" + ...
    std::string name(1, letter);
    name += std::to_string(k);
    return name;
  };
  for (int k = 0; k < 40; ++k) features.push_back({key('k', k), Ints{k}});
  features.push_back({"k5", Ints{1}});
  std::string e = example_error({example_bytes(features)});
  EXPECT_NE(e.find("feature 'k5' is given twice"), std::string::npos) << e;
  // More keys than make sense as fields of every record: refused unless some are chosen.
  features.clear();
  for (int k = 0; k < 1100; ++k) features.push_back({key('f', k), Ints{k}});
  TempFolder dir;
  write_file(dir / "wide.tfrecord", tfrecord_file({example_bytes(features)}));
  e = pack_error(dir / "wide.tfrecord");
  EXPECT_NE(e.find("name 1100 feature keys (first 'f0', in "), std::string::npos) << e;
  EXPECT_NE(e.find("choose the features with --field"), std::string::npos) << e;
  const PackSources chosen =
      PackSources::from_tfrecord(std::vector<std::string>{dir / "wide.tfrecord"}, std::vector<std::string>{"f1099"});
  EXPECT_EQ(ints_of(chosen.record(0)[0]), Ints{1099});
  // Examples of no features at all.
  e = example_error({example_bytes({}), example_bytes({})});
  EXPECT_NE(e.find("hold no features"), std::string::npos) << e;
}

TEST(TfRecord, FilesAreRecognisedByNameOrByTheirFirstHeader) {
  TempFolder dir;
  // Names TensorFlow's writers give, gzipped or not, whatever the content; not a name that
  // only holds one of them.
  write_file(dir / "data_tfrecord-00000-of-00001.gz", testutil::gzip_bytes(tfrecord_file({kTutorialExample})));
  write_file(dir / "train.tfrec", tfrecord_file({kTutorialExample}));
  write_file(dir / "mnist-train.tfrecord-00003-of-00016", tfrecord_file({kTutorialExample}));
  write_file(dir / "zipped", testutil::gzip_bytes(tfrecord_file({kTutorialExample})));
  write_file(dir / "zlibbed", testutil::zlib_bytes(tfrecord_file({kTutorialExample})));
  write_file(dir / "repacked.tfrecord.mmt", testutil::to_bytes("not this"));
  for (const char* name :
       {"data_tfrecord-00000-of-00001.gz", "train.tfrec", "mnist-train.tfrecord-00003-of-00016", "zipped", "zlibbed"}) {
    EXPECT_TRUE(are_tfrecord_inputs(std::vector<std::string>{dir / name})) << name;
    EXPECT_EQ(PackSources::from_inputs(std::vector<std::string>{dir / name}).records(), 1) << name;
  }
  EXPECT_FALSE(are_tfrecord_inputs(std::vector<std::string>{dir / "repacked.tfrecord.mmt"}));
  write_file(dir / "data.bin", tfrecord_file({kTutorialExample}));
  write_file(dir / "other.bin", testutil::to_bytes("0123456789abcdef"));
  EXPECT_TRUE(are_tfrecord_inputs(std::vector<std::string>{dir / "data.bin"}));
  EXPECT_FALSE(are_tfrecord_inputs(std::vector<std::string>{dir / "other.bin"}));
  EXPECT_FALSE(are_tfrecord_inputs(std::vector<std::string>{dir / "missing.tfrecord"}));
  EXPECT_EQ(PackSources::from_inputs(std::vector<std::string>{dir / "data.bin"}).records(), 1);
}

}  // namespace
}  // namespace mmt
