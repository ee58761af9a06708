// Ragged fields packed from arrays in PyTorch's jagged layout (JaggedArrays: a values array and
// its offsets, and shapes where records vary past their first dimension): the records are
// the runs the offsets say, whatever holds the values (.npy, a raw token file, a big-endian
// .npy, a deflated .npz member), batched into the same file as appending record by record,
// and every offsets or shapes file that does not fit its values is refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "mmtensor/dataset.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "importer_test_util.h"
#include "test_util.h"

namespace mmt {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Document d holds tokens 7d, 7d + 1, ... (d * 37 % 11 of them: some empty), uint16.
constexpr int64_t kDocuments = 3000;
int64_t document_length(int64_t d) { return d * 37 % 11; }

std::vector<int64_t> document_offsets() {
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d < kDocuments; ++d) offsets.push_back(offsets.back() + document_length(d));
  return offsets;
}

std::vector<uint16_t> document_tokens() {
  std::vector<uint16_t> tokens;
  for (int64_t d = 0; d < kDocuments; ++d)
    for (int64_t k = 0; k < document_length(d); ++k) tokens.push_back(static_cast<uint16_t>(7 * d + k));
  return tokens;
}

Tensor int64_tensor(const std::vector<int64_t>& values) { return tensor<int64_t>(values); }

void expect_documents(const Dataset& ds, const std::string& field) {
  ASSERT_EQ(ds.size(), kDocuments);
  EXPECT_EQ(ds.schema()[ds.schema().index_of(field)].shape, DimVector{kVariableDim});
  for (int64_t d = 0; d < kDocuments; d += 7) {
    const Tensor document = ds.get(d)[field];
    ASSERT_EQ(document.numel(), document_length(d)) << d;
    for (int64_t k = 0; k < document.numel(); ++k) ASSERT_EQ(document.at<uint16_t>({k}), 7 * d + k) << d;
  }
}

// Token documents, as tokenizers leave them (a token array and where each document starts),
// beside a label a document: each record is its document, from an .npy, a raw token file
// (nanoGPT's), a big-endian .npy (converted a batch at a time) and a deflated .npz member
// (inflated as it is read; an empty document's read of nothing once reset its running CRC-32,
// so the member's end was refused as corrupt); the offsets int64 or int32. Batches write the
// file that appending record by record writes.
TEST(PackJagged, TokenDocumentsPackAsRecordsWhateverHoldsThem) {
  TempDir dir;
  const std::vector<uint16_t> tokens = document_tokens();
  const std::vector<int64_t> offsets = document_offsets();
  save_npy(dir.file("tokens.npy"), tensor<uint16_t>(tokens));
  save_npy(dir.file("offsets.npy"), int64_tensor(offsets));
  save_npy(dir.file("offsets32.npy"), int64_tensor(offsets).to(kInt32));
  save_npy(dir.file("label.npy"), arange(kDocuments, kInt64));
  testutil::write_file(dir.file("train.bin"), testutil::element_bytes(tokens, false));
  const std::string shape = "(" + std::to_string(tokens.size()) + ",)";
  testutil::write_file(dir.file("big.npy"), testutil::npy_file(">u2", false, shape, testutil::element_bytes(tokens, true)));
  testutil::write_file(dir.file("deflated.npz"),
                       testutil::zip_archive({{"tokens.npy", testutil::npy_file("<u2", false, shape,
                                                                                testutil::element_bytes(tokens, false)),
                                               /*deflate=*/true}}));
  const std::vector<std::pair<std::string, std::string>> inputs{
      {"tokens=" + dir.file("tokens.npy"), dir.file("offsets.npy")},
      {"tokens=" + dir.file("train.bin") + ":uint16", dir.file("offsets32.npy")},
      {"tokens=" + dir.file("big.npy"), dir.file("offsets.npy")},
      {dir.file("deflated.npz"), dir.file("offsets32.npy")}};
  for (const auto& [values, offsets_path] : inputs) {
    SCOPED_TRACE(values);
    const std::vector<std::string> specs{values, "label=" + dir.file("label.npy")};
    const PackSources sources = PackSources::from_arrays(specs, {.offsets = {{"tokens", offsets_path}}});
    EXPECT_EQ(sources.records(), kDocuments);
    EXPECT_EQ(sources.total_bytes(), static_cast<int64_t>(tokens.size()) * 2 + kDocuments * 8);
    std::vector<Tensor> values_of, offsets_of;
    const int64_t given = sources.jagged_record_batch(10, 500, values_of, offsets_of);
    ASSERT_EQ(given, 500) << "documents go in batches";
    EXPECT_TRUE(offsets_of[0].defined());
    EXPECT_FALSE(offsets_of[1].defined());
    testutil::expect_batches_pack_as_records(dir.path(), sources, {64, 4096, 1 << 20});
    const Dataset ds = Dataset::open(dir.file("batched.mmt"));
    expect_documents(ds, "tokens");
    EXPECT_TRUE(ds.column("label").equal(arange(kDocuments, kInt64)));
    EXPECT_EQ(compare_with_sources(ds, sources), kDocuments);
  }
}

// A batch holds about 4 MiB of a jagged field's values, and at least one record, however
// long: a corpus of long documents is not copied 1024 documents at a time.
TEST(PackJagged, ABatchHoldsAFewMegabytesOfValues) {
  TempDir dir;
  save_npy(dir.file("tokens.npy"), zeros({int64_t{3} << 20}, kInt32));  // 12 MiB
  save_npy(dir.file("offsets.npy"), int64_tensor({0, 1, 2, (int64_t{3} << 20) - 1, int64_t{3} << 20}));
  const PackSources sources =
      PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir.file("tokens.npy")},
                               {.offsets = {{"tokens", dir.file("offsets.npy")}}});
  std::vector<Tensor> values, offsets;
  EXPECT_EQ(sources.jagged_record_batch(0, 4, values, offsets), 2) << "record 2 alone is 12 MiB";
  EXPECT_EQ(sources.jagged_record_batch(2, 2, values, offsets), 1);
  EXPECT_EQ(values[0].numel(), (int64_t{3} << 20) - 3);
  EXPECT_TRUE(offsets[0].equal(int64_tensor({0, (int64_t{3} << 20) - 3})));
  EXPECT_EQ(sources.jagged_record_batch(3, 1, values, offsets), 1);
}

// Boxes [*, 4]: rows of the values' trailing dimensions; images [*, *, 3] of several sizes:
// 1-D values, each record's shape given, a dimension fixed where every record agrees. What
// `mmt export` writes packs back into the same records.
TEST(PackJagged, RecordsOfSeveralDimensionsTakeTheirRowsOrTheirShapes) {
  TempDir dir;
  constexpr int64_t kImages = 50;
  std::vector<int64_t> box_offsets{0}, image_offsets{0}, shapes;
  std::vector<float> boxes;
  std::vector<uint8_t> pixels;
  for (int64_t i = 0; i < kImages; ++i) {
    for (int64_t k = 0; k < 4 * (i % 4); ++k) boxes.push_back(static_cast<float>(i) + static_cast<float>(k) / 8);
    box_offsets.push_back(box_offsets.back() + i % 4);
    const int64_t h = 1 + i % 5, w = 2 + i % 3;
    for (int64_t k = 0; k < h * w * 3; ++k) pixels.push_back(static_cast<uint8_t>(i + k));
    image_offsets.push_back(image_offsets.back() + h * w * 3);
    shapes.insert(shapes.end(), {h, w, 3});
  }
  save_npy(dir.file("boxes.npy"), tensor<float>(boxes).view({static_cast<int64_t>(boxes.size()) / 4, 4}));
  save_npy(dir.file("boxes.offsets.npy"), int64_tensor(box_offsets));
  save_npy(dir.file("image.npy"), tensor<uint8_t>(pixels));
  save_npy(dir.file("image.offsets.npy"), int64_tensor(image_offsets));
  save_npy(dir.file("image.shapes.npy"), int64_tensor(shapes).view({kImages, 3}));
  const std::vector<std::string> specs{"boxes=" + dir.file("boxes.npy"), "image=" + dir.file("image.npy")};
  const JaggedArrays jagged{.offsets = {{"boxes", dir.file("boxes.offsets.npy")}, {"image", dir.file("image.offsets.npy")}},
                            .shapes = {{"image", dir.file("image.shapes.npy")}}};
  const PackSources sources = PackSources::from_arrays(specs, jagged);
  EXPECT_EQ(sources.schema()[0].shape, (DimVector{kVariableDim, 4}));
  EXPECT_EQ(sources.schema()[1].shape, (DimVector{kVariableDim, kVariableDim, 3}));
  std::vector<Tensor> values, offsets;
  EXPECT_EQ(sources.jagged_record_batch(0, 10, values, offsets), -10) << "shapes go a record at a time";
  testutil::expect_batches_pack_as_records(dir.path(), sources, {64, 1 << 20});
  const Dataset ds = Dataset::open(dir.file("batched.mmt"));
  for (int64_t i = 0; i < kImages; ++i) {
    const Sample sample = ds.get(i);
    ASSERT_EQ(sample["boxes"].sizes(), IntArrayRef({i % 4, 4}));
    if (i % 4 > 0) {
      EXPECT_EQ(sample["boxes"].at<float>({0, 1}), static_cast<float>(i) + 0.125f);
    }
    ASSERT_EQ(sample["image"].sizes(), IntArrayRef({1 + i % 5, 2 + i % 3, 3}));
    EXPECT_EQ(sample["image"].at<uint8_t>({0, 0, 2}), static_cast<uint8_t>(i + 2));
  }
  EXPECT_EQ(compare_with_sources(ds, sources), kImages);
}

// Token windows over documents given so, a separator after each: the stream of the documents.
TEST(PackJagged, WindowsAreCutFromTheDocuments) {
  TempDir dir;
  save_npy(dir.file("tokens.npy"), tensor<uint16_t>(document_tokens()));
  save_npy(dir.file("offsets.npy"), int64_tensor(document_offsets()));
  PackSources documents = PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir.file("tokens.npy")},
                                                   {.offsets = {{"tokens", dir.file("offsets.npy")}}});
  const PackSources windows = PackSources::token_windows(std::move(documents), {.length = 5, .separator = 9999});
  const std::vector<Tensor> first = windows.record(0);
  // Documents 0 (no token), 1 (tokens 7 to 10), 2 (tokens 14 to 21): 9999 after each.
  EXPECT_TRUE(first[0].equal(tensor<uint16_t>({9999, 7, 8, 9, 10})));
  EXPECT_TRUE(windows.record(1)[0].equal(tensor<uint16_t>({9999, 14, 15, 16, 17})));
}

// Offsets and shapes that do not fit their values, or that name no field, are refused before
// anything is packed, naming the file and the entry.
TEST(PackJagged, OffsetsAndShapesThatDoNotFitTheirValuesAreRefusedByName) {
  TempDir dir;
  save_npy(dir.file("tokens.npy"), arange(10, kInt32));
  save_npy(dir.file("label.npy"), arange(3, kInt64));
  const auto refusal = [&](const Tensor& offsets, std::vector<std::string> specs = {}) {
    save_npy(dir.file("o.npy"), offsets);
    if (specs.empty()) specs = {"tokens=" + dir.file("tokens.npy"), "label=" + dir.file("label.npy")};
    try {
      (void)PackSources::from_arrays(specs, {.offsets = {{"tokens", dir.file("o.npy")}}});
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string what = "the offsets of field 'tokens' (" + dir.file("o.npy") + "): ";
  EXPECT_EQ(refusal(int64_tensor({0, 4, 10})),
            "record counts disagree: label=" + dir.file("label.npy") + " has 3 records (first dimension of shape [3]) but "
            "tokens=" + dir.file("tokens.npy") + " has 2");
  EXPECT_EQ(refusal(int64_tensor({1, 4, 5, 10})), what + "begins at 1; the first record starts at row 0 of the values");
  EXPECT_EQ(refusal(int64_tensor({0, 4, 3, 10})), what + "entry 2 (3) is less than entry 1 (4): record 1 would end before it starts");
  EXPECT_EQ(refusal(int64_tensor({0, 4, 5, 9})),
            what + "ends at 9, but the values hold 10 rows (the first dimension of their shape [10]); the last entry is "
                   "where the last record ends (document starts alone need that end appended)");
  EXPECT_EQ(refusal(int64_tensor({0, 4, 5, 11})).substr(0, what.size() + 11), what + "ends at 11,");
  EXPECT_EQ(refusal(Tensor(tensor<float>({0, 4, 5, 10}))),
            what + "an array of float32 of shape [4]; offsets are a 1-D array of integers, one more than the records");
  EXPECT_EQ(refusal(int64_tensor({0, 4, 5, 10}).view({2, 2})),
            what + "an array of int64 of shape [2, 2]; offsets are a 1-D array of integers, one more than the records");
  EXPECT_EQ(refusal(tensor<uint64_t>({0, 4, uint64_t{1} << 63, 10})),
            what + "entry 2 is 9223372036854775808, past any array's size");
  EXPECT_EQ(refusal(int64_tensor({})), what + "holds no value; offsets hold one more than the records ([0] for none)");
  EXPECT_EQ(refusal(int64_tensor({0, 4, 5, 10})), "(accepted)");

  // Shapes: 1-D values only, one row a record, of as many values as its offsets give.
  save_npy(dir.file("o.npy"), int64_tensor({0, 4, 10}));
  const auto shapes_refusal = [&](const Tensor& shapes, const std::string& values = "tokens.npy") {
    save_npy(dir.file("s.npy"), shapes);
    try {
      (void)PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir.file(values)},
                                     {.offsets = {{"tokens", dir.file("o.npy")}}, .shapes = {{"tokens", dir.file("s.npy")}}});
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string shapes_what = "the shapes of field 'tokens' (" + dir.file("s.npy") + "): ";
  EXPECT_EQ(shapes_refusal(int64_tensor({2, 2, 2, 3}).view({2, 2})), "(accepted)");
  EXPECT_EQ(shapes_refusal(int64_tensor({2, 2, 3, 3}).view({2, 2})),
            shapes_what + "record 1 has the shape [3, 3] (9 values), but the offsets give it 6");
  EXPECT_EQ(shapes_refusal(int64_tensor({2, 2, -2, -3}).view({2, 2})),
            shapes_what + "record 1 has the shape [-2, -3], which no array has");
  EXPECT_EQ(shapes_refusal(int64_tensor({4, 6, 1})).substr(0, shapes_what.size() + 26),
            shapes_what + "an array of int64 of shape");
  EXPECT_EQ(shapes_refusal(int64_tensor({4, 6, 1}).view({3, 1})),
            shapes_what + "of shape [3, 1], where the offsets give 2 records: shapes are [records, ndim], ndim at least 1");
  save_npy(dir.file("rows.npy"), arange(10, kInt32).view({5, 2}));
  save_npy(dir.file("o.npy"), int64_tensor({0, 2, 5}));
  EXPECT_EQ(shapes_refusal(int64_tensor({2, 2, 3, 2}).view({2, 2}), "rows.npy"),
            shapes_what + "the values are of shape [5, 2]; with shapes they are 1-D, each record's values in row-major "
                          "order, and the offsets count them");

  // Names: shapes without offsets, offsets of no field given, jagged arrays with datasets.
  EXPECT_THROW_WITH((void)PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir.file("tokens.npy")},
                                                   {.shapes = {{"tokens", dir.file("s.npy")}}}),
                    InputSpecError, "the shapes of field 'tokens' (" + dir.file("s.npy") + ") need its offsets too");
  EXPECT_THROW_WITH((void)PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir.file("tokens.npy")},
                                                   {.offsets = {{"tokns", dir.file("o.npy")}}}),
                    InputSpecError, "offsets are given for field 'tokns' (" + dir.file("o.npy") + "), but no input gives that field");
  pack_dataset(dir.file("d.mmt"), PackSources::from_arrays(std::vector<std::string>{"x=" + dir.file("label.npy")}), {});
  EXPECT_THROW_WITH((void)PackSources::from_inputs(std::vector<std::string>{dir.file("d.mmt")}, {}, {},
                                                   {.offsets = {{"x", dir.file("o.npy")}}}),
                    InputSpecError, "offsets and shapes give ragged fields of arrays");
}

}  // namespace
}  // namespace mmt
