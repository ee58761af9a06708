// Token windows (PackSources::token_windows): a field's values as one stream, cut into
// fixed-length records, as language-model pretraining reads them.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "importer_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/error.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testutil::TempFolder;

std::vector<int64_t> values_of(const Tensor& t) {
  const Tensor wide = t.to(kInt64).contiguous();
  return std::vector<int64_t>(wide.data_ptr<int64_t>(), wide.data_ptr<int64_t>() + wide.numel());
}

// Documents of i % 5 tokens each (100 * i + k), in an int32 ragged field "tokens" beside "id".
std::string write_documents(const TempFolder& dir, int64_t count, CodecSpec codec = {}) {
  const std::string path = dir / "docs.mmt";
  WriterOptions options;
  options.codec = codec;
  options.chunk_records = 7;
  DatasetWriter writer = DatasetWriter::create(
      path, Schema({Field::ragged("tokens", kInt32, {kVariableDim}), Field::fixed("id", kInt64, {})}), options);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int32_t> tokens;
    for (int64_t k = 0; k < i % 5; ++k) tokens.push_back(static_cast<int32_t>(100 * i + k));
    writer.append({tokens.empty() ? empty({0}, kInt32) : tensor(tokens), full({}, static_cast<double>(i), kInt64)});
  }
  writer.finish();
  return path;
}

// The stream the documents make, with `separator` after each.
std::vector<int64_t> document_stream(int64_t count, std::optional<int64_t> separator) {
  std::vector<int64_t> stream;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t k = 0; k < i % 5; ++k) stream.push_back(100 * i + k);
    if (separator) stream.push_back(*separator);
  }
  return stream;
}

TEST(PackWindows, AnArrayIsCutIntoOverlappingWindowsViewedWhereItLies) {
  TempFolder dir;
  save_npy(dir / "tokens.npy", arange(1000, kUInt16));
  // nanoGPT's x and y in one record: 9 tokens every 8.
  const PackSources sources = PackSources::token_windows(
      PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir / "tokens.npy"}), {.length = 9, .stride = 8});
  ASSERT_EQ(sources.records(), (1000 - 9) / 8 + 1);
  EXPECT_EQ(sources.schema()[0].shape, (DimVector{9}));
  EXPECT_EQ(sources.schema()[0].dtype, kUInt16);
  EXPECT_EQ(sources.metadata().at(std::string(kTokenWindowsMetadataKey)),
            R"({"dropped":7,"field":"tokens","length":9,"stride":8,"tokens":1000})");
  std::vector<Tensor> batch;
  ASSERT_TRUE(sources.record_batch(3, 2, batch));
  EXPECT_EQ(batch[0].untyped_storage().filename(), dir / "tokens.npy");  // a strided view, no copy
  EXPECT_EQ(values_of(batch[0].select(0, 1)), (std::vector<int64_t>{32, 33, 34, 35, 36, 37, 38, 39, 40}));
  pack_dataset(dir / "w.mmt", sources, {});
  const Dataset ds = Dataset::open(dir / "w.mmt");
  for (int64_t w : {int64_t{0}, int64_t{61}, ds.size() - 1}) {
    std::vector<int64_t> want(9);
    std::iota(want.begin(), want.end(), w * 8);
    EXPECT_EQ(values_of(ds.get(w, "tokens")), want) << w;
  }
  EXPECT_EQ(compare_with_sources(ds, sources), ds.size());
  // Read back from the metadata, as `mmt verify --against` does.
  const std::optional<PackSources::RecordedWindows> recorded = PackSources::windows_of(ds.metadata(), ds.path());
  ASSERT_TRUE(recorded.has_value());
  EXPECT_EQ(recorded->options.length, 9);
  EXPECT_EQ(recorded->options.stride, 8);
  EXPECT_FALSE(recorded->options.separator.has_value());
  EXPECT_EQ(recorded->stream_tokens, 1000);
  EXPECT_THROW_WITH(PackSources::windows_of({{std::string(kTokenWindowsMetadataKey), R"({"length":9,"stride":8})"}}, "x.mmt"),
                    FormatError, "x.mmt: metadata key 'token_windows' lacks the stream's tokens");
}

TEST(PackWindows, ARawTokenFileAsNanoGPTWritesItIsAnArrayInput) {
  TempFolder dir;
  std::vector<uint16_t> tokens(5000);
  std::iota(tokens.begin(), tokens.end(), uint16_t{0});
  testutil::write_file(dir / "train.bin", testutil::Bytes(reinterpret_cast<const std::byte*>(tokens.data()),
                                                          reinterpret_cast<const std::byte*>(tokens.data() + tokens.size())));
  const PackSources raw = PackSources::from_arrays(std::vector<std::string>{"tokens=" + dir / "train.bin:uint16"});
  ASSERT_EQ(raw.records(), 5000);
  EXPECT_EQ(raw.schema()[0].dtype, kUInt16);
  EXPECT_EQ(raw.input_paths(), (std::vector<std::string>{dir / "train.bin"}));
  const PackSources windows = PackSources::token_windows(raw, {.length = 65, .stride = 64});
  EXPECT_EQ(windows.records(), (5000 - 65) / 64 + 1);
  EXPECT_EQ(values_of(windows.record(3)[0]).front(), 192);
  // Records of a shape: "PATH:DTYPE:D1xD2".
  const PackSources grid = PackSources::from_arrays(std::vector<std::string>{"g=" + dir / "train.bin:uint16:10x25"});
  EXPECT_EQ(grid.records(), 20);
  EXPECT_EQ(grid.schema()[0].shape, (DimVector{10, 25}));
  EXPECT_THROW_WITH(PackSources::from_arrays(std::vector<std::string>{"t=" + dir / "train.bin:int64:3"}), ValueError,
                    "10000 bytes are not a whole number of 24-byte records of int64[3] (16 bytes left over)");
  EXPECT_THROW_WITH(PackSources::from_arrays(std::vector<std::string>{dir / "train.bin:uint16"}), InputSpecError,
                    "needs a field name");
  // A dtype without its size reads other values than the file holds: refused, as is a bad shape.
  EXPECT_THROW_WITH(PackSources::from_arrays(std::vector<std::string>{"t=" + dir / "train.bin:float"}), InputSpecError,
                    "write 'float32', not 'float'");
  EXPECT_THROW_WITH(PackSources::from_arrays(std::vector<std::string>{"t=" + dir / "train.bin:uint16:0"}),
                    InputSpecError, "train.bin is a file, but ':uint16:0' is not :DTYPE[:D1xD2...]");
  EXPECT_THROW_WITH(PackSources::from_arrays(std::vector<std::string>{"t=" + dir / "train.bin:uint17"}), InputSpecError,
                    "'uint17' is not a dtype");
  // Bools other than 0 and 1 are named with the file, as an .npy's are (the writer's own
  // check named only the record).
  testutil::write_file(dir / "mask.bin", testutil::to_bytes(std::string("\x00\x01\x00\x05", 4)));
  EXPECT_THROW_WITH(PackSources::from_arrays(std::vector<std::string>{"m=" + dir / "mask.bin:bool"}), FormatError,
                    "mask.bin: bool element 3 holds the byte 5; a bool value may hold only 0 and 1");
  // Chosen fields are for datasets; a raw input is an array, and says so.
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{"t=" + dir / "train.bin:uint16"},
                                             std::vector<std::string>{"t"}),
                    InputSpecError, "choosing fields is for dataset inputs");
  // No file before the ':': the path is taken as it is, and named as missing.
  EXPECT_THROW(PackSources::from_arrays(std::vector<std::string>{"t=" + dir / "none.bin:uint16"}), IoError);
}

TEST(PackWindows, ADeflatedArrayIsCutAndComparedWindowByWindow) {
  // An .npz member deflated, read front to back: the windows keep the last run and document
  // read, so that overlapping windows do not inflate it again from its start (what that saves
  // is a time, measured in bench/RESULTS.md; here, that the values are right through those
  // paths). A 1-D array, and documents of a 2-D one, packed and compared window by window as
  // verify does.
  TempFolder dir;
  const Tensor flat = arange(20000, kInt32);
  testutil::Bytes flat_bytes(reinterpret_cast<const std::byte*>(flat.data_ptr()),
                             reinterpret_cast<const std::byte*>(flat.data_ptr()) + flat.nbytes());
  const testutil::Bytes npy = testutil::npy_with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (20000,), }",
                                                      flat_bytes);
  const testutil::Bytes grid = testutil::npy_with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (200, 100), }",
                                                       flat_bytes);
  // A one-member archive of each ("NAME=" cannot pick a member from an .npz).
  for (const char* member : {"tokens", "docs"}) {
    const testutil::Bytes& content = std::string(member) == "tokens" ? npy : grid;
    testutil::write_file(dir / (std::string(member) + ".npz"),
               testutil::zip_archive({{.name = std::string(member) + ".npy", .content = content, .deflate = true}}));
    const PackSources windows = PackSources::token_windows(
        PackSources::from_arrays(std::vector<std::string>{dir / (std::string(member) + ".npz")}),
        {.length = 1025, .stride = 1000});
    ASSERT_EQ(windows.records(), (20000 - 1025) / 1000 + 1);
    pack_dataset(dir / "w.mmt", windows, {.writer = {.overwrite = true}});
    const Dataset ds = Dataset::open(dir / "w.mmt");
    for (int64_t w = 0; w < ds.size(); ++w)
      ASSERT_TRUE(ds.get(w, member).equal(arange(w * 1000, w * 1000 + 1025, 1, kInt32))) << member << " " << w;
    EXPECT_EQ(compare_with_sources(ds, windows), ds.size());  // window by window, as verify does
  }
}

TEST(PackWindows, DocumentsWithASeparatorMakeOneStreamAcrossRecordsAndChunks) {
  TempFolder dir;
  const std::string docs = write_documents(dir, 60, CodecSpec::parse("zstd"));
  const std::vector<std::string> field{"tokens"};
  for (const std::optional<int64_t> separator : {std::optional<int64_t>(), std::optional<int64_t>(-1)}) {
    for (const int64_t stride : {int64_t{5}, int64_t{3}, int64_t{11}}) {
      const PackSources sources = PackSources::token_windows(PackSources::from_datasets({docs}, field),
                                                             {.length = 5, .stride = stride, .separator = separator});
      const std::vector<int64_t> stream = document_stream(60, separator);
      const int64_t windows = (static_cast<int64_t>(stream.size()) - 5) / stride + 1;
      ASSERT_EQ(sources.records(), windows);
      std::vector<Tensor> batch;
      ASSERT_TRUE(sources.record_batch(0, windows, batch));
      for (int64_t w = 0; w < windows; ++w) {
        const std::vector<int64_t> want(stream.begin() + w * stride, stream.begin() + w * stride + 5);
        ASSERT_EQ(values_of(batch[0].select(0, w)), want) << "window " << w << " stride " << stride;
        ASSERT_EQ(values_of(sources.record(w)[0]), want);
      }
    }
  }
  // Where a window comes from: its document and that document's record.
  const PackSources sources = PackSources::token_windows(PackSources::from_datasets({docs}, field), {.length = 5});
  EXPECT_NE(sources.record_origin(0, 3).find("window 3: tokens 15 to 19 of the stream, from token 2 of document 8 (record 8 of "),
            std::string::npos)
      << sources.record_origin(0, 3);
}

// A separator is any token its field's dtype holds exactly, large ones too (a 64-bit
// vocabulary's, or a hash): written as the integer given, never through a double.
TEST(PackWindows, ASeparatorIsAnyValueItsDtypeHoldsExactly) {
  TempFolder dir;
  const auto documents_of = [&](ScalarType dtype) {
    const std::string path = dir / ("docs_" + std::string(to_string(dtype)) + ".mmt");
    if (std::filesystem::exists(path)) return PackSources::from_datasets({path});
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::ragged("tokens", dtype, {kVariableDim})}));
    for (int64_t i = 0; i < 4; ++i) writer.append({arange(i, i + 2, 1, dtype)});
    writer.finish();
    return PackSources::from_datasets({path});
  };
  const int64_t large = (int64_t{1} << 62) + 1;  // no double holds it
  for (const int64_t separator : {large, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    const PackSources windows = PackSources::token_windows(documents_of(kInt64), {.length = 3, .separator = separator});
    ASSERT_EQ(windows.records(), 4);  // the stream: 0 1 S 1 2 S 2 3 S 3 4 S
    EXPECT_EQ(values_of(windows.record(0)[0]), (std::vector<int64_t>{0, 1, separator}));
    EXPECT_EQ(values_of(windows.record(3)[0]), (std::vector<int64_t>{3, 4, separator}));
  }
  // 2^62 is a float32; 2^53 + 1 is rounded there, and 2^40 is past float16's range.
  const PackSources floats = PackSources::token_windows(documents_of(kFloat32), {.length = 3, .separator = int64_t{1} << 62});
  EXPECT_EQ(floats.record(0)[0].select(0, 2).item<double>(), 0x1p62);
  EXPECT_THROW_WITH(PackSources::token_windows(documents_of(kFloat32), {.length = 3, .separator = (int64_t{1} << 53) + 1}),
                    ValueError, "the separator 9007199254740993 is not a float32 value (past its range, or rounded in it)");
  EXPECT_THROW_WITH(PackSources::token_windows(documents_of(kFloat16), {.length = 3, .separator = int64_t{1} << 40}),
                    ValueError, "the separator 1099511627776 is not a float16 value (past its range, or rounded in it)");
  EXPECT_THROW_WITH(PackSources::token_windows(documents_of(kUInt8), {.length = 3, .separator = 256}), ValueError,
                    "the separator 256 is not a uint8 value (past its range)");
  // A negative separator is no unsigned token (PyTorch would wrap -1 into uint8's 255).
  for (const ScalarType unsigned_dtype : {kUInt8, kUInt64})
    EXPECT_THROW_WITH(PackSources::token_windows(documents_of(unsigned_dtype), {.length = 3, .separator = -1}),
                      ValueError, "the separator -1 is not a");
  const PackSources wide = PackSources::token_windows(documents_of(kUInt64), {.length = 3, .separator = large});
  EXPECT_EQ(wide.record(0)[0].select(0, 2).item<uint64_t>(), static_cast<uint64_t>(large));
}

TEST(PackWindows, BadSourcesAndOptionsAreRefused) {
  TempFolder dir;
  const std::string docs = write_documents(dir, 10);
  const auto refuse = [](auto make, const std::string& text) { EXPECT_THROW_WITH(make(), ValueError, text); };
  refuse([&] { return PackSources::token_windows(PackSources::from_datasets({docs}), {.length = 4}); },
         "cut from one field; the sources have 2");
  refuse([&] { return PackSources::token_windows(PackSources::from_datasets({docs}, std::vector<std::string>{"id"}),
                                                 {.length = 4, .separator = 1}); },
         "a separator goes between documents");
  refuse([&] { return PackSources::token_windows(PackSources::from_datasets({docs}, std::vector<std::string>{"tokens"}),
                                                 {.length = 0}); },
         "the length must be >= 1");
  refuse([&] { return PackSources::token_windows(PackSources::from_datasets({docs}, std::vector<std::string>{"tokens"}),
                                                 {.length = 4, .separator = int64_t{1} << 40}); },
         "the separator 1099511627776 is not a int32 value (past its range)");
  save_npy(dir / "cube.npy", arange(16, kInt32).view({4, 2, 2}));
  refuse([&] { return PackSources::token_windows(
                   PackSources::from_arrays(std::vector<std::string>{"c=" + dir / "cube.npy"}), {.length = 2}); },
         "holds values of shape [2, 2]");
  // A stream shorter than one window: no records, all of it dropped.
  const PackSources none = PackSources::token_windows(
      PackSources::from_datasets({docs}, std::vector<std::string>{"tokens"}), {.length = 1000});
  EXPECT_EQ(none.records(), 0);
  EXPECT_NE(none.metadata().at(std::string(kTokenWindowsMetadataKey)).find("\"dropped\":20"), std::string::npos);
}

}  // namespace
}  // namespace mmt
