// IDX (MNIST's format): every type code, plain and gzip, zero-copy mapping of byte data,
// refusals of wrong magics and truncated files, and the real Fashion-MNIST when installed.
#include <gtest/gtest.h>

#include <filesystem>

#include "importer_test_util.h"
#include "mmtensor/idx_io.h"

namespace mmt {
namespace {

using testutil::Bytes;
using testutil::TempFolder;

Bytes idx_header(uint8_t type_code, std::vector<uint32_t> dims) {
  Bytes out{std::byte{0}, std::byte{0}, std::byte{type_code}, std::byte(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(std::byte((d >> shift) & 0xFF));
  return out;
}

template <typename T>
Bytes idx_file(uint8_t type_code, std::vector<uint32_t> dims, const std::vector<T>& values) {
  Bytes out = idx_header(type_code, std::move(dims));
  testutil::append(out, testutil::element_bytes(values, /*big_endian=*/true));
  return out;
}

using testutil::expect_format_error;

std::vector<uint8_t> pixels(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

TEST(Idx, EveryTypeCodeDecodesBigEndianToNative) {
  auto check = [](uint8_t code, auto values, ScalarType dtype) {
    SCOPED_TRACE(code);
    Tensor t = parse_idx(idx_file(code, {2, 2}, values), "t.idx");
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.sizes(), IntArrayRef({2, 2}));
    std::vector<double> expected(values.begin(), values.end());
    EXPECT_EQ(t.to_double_vector(), expected);
    Tensor gz = parse_idx(testutil::gzip_bytes(idx_file(code, {2, 2}, values)), "t.idx.gz");
    EXPECT_TRUE(gz.equal(t));
  };
  check(0x08, std::vector<uint8_t>{0, 1, 200, 255}, kUInt8);
  check(0x09, std::vector<int8_t>{0, -1, 100, -128}, kInt8);
  check(0x0B, std::vector<int16_t>{0, -1, 300, -30000}, kInt16);
  check(0x0C, std::vector<int32_t>{0, -1, 70000, -2000000000}, kInt32);
  check(0x0D, std::vector<float>{0, -1.5f, 3e7f, 1e-7f}, kFloat32);
  check(0x0E, std::vector<double>{0, -1.5, 3e300, 1e-300}, kFloat64);
}

TEST(Idx, PlainByteFileIsAZeroCopyView) {
  TempFolder dir;
  std::string path = dir / "images-idx3-ubyte";
  testutil::write_file(path, idx_file(0x08, {3, 4, 5}, pixels(60)));
  Tensor t = load_idx(path);
  EXPECT_EQ(t.sizes(), IntArrayRef({3, 4, 5}));
  EXPECT_EQ(t.untyped_storage().filename(), path);
  EXPECT_EQ(t.at<uint8_t>({2, 3, 4}), static_cast<uint8_t>(59 * 7));
  EXPECT_EQ(t.storage_offset(), 4 + 3 * 4);
}

TEST(Idx, GzippedFileMatchesThePlainOne) {
  TempFolder dir;
  Bytes plain = idx_file(0x08, {10, 28, 28}, pixels(7840));
  testutil::write_file(dir / "a", plain);
  testutil::write_file(dir / "a.gz", testutil::gzip_bytes(plain));
  EXPECT_TRUE(load_idx(dir / "a.gz").equal(load_idx(dir / "a")));
  // Concatenated gzip members form one stream, as gzip itself reads them.
  Bytes first(plain.begin(), plain.begin() + 1000), second(plain.begin() + 1000, plain.end());
  Bytes joined = testutil::gzip_bytes(first);
  testutil::append(joined, testutil::gzip_bytes(second));
  EXPECT_TRUE(parse_idx(joined, "joined.gz").equal(load_idx(dir / "a")));
}

TEST(Idx, WrongMagicIsRefused) {
  Bytes npy_like = testutil::to_bytes("\x93NUMPY\x01\x00");
  std::string message = expect_format_error([&] { parse_idx(npy_like, "labels"); });
  EXPECT_NE(message.find("labels: magic 0x934e554d is not an IDX magic"), std::string::npos) << message;
  Bytes unknown_type = idx_file(0x0A, {1}, std::vector<uint8_t>{0});
  message = expect_format_error([&] { parse_idx(unknown_type, "labels"); });
  EXPECT_NE(message.find("unknown IDX type code 0xa"), std::string::npos) << message;
  EXPECT_THROW(parse_idx(testutil::gzip_bytes(unknown_type), "labels.gz"), FormatError);
  EXPECT_THROW(parse_idx(testutil::to_bytes("ab"), "short"), FormatError);
}

TEST(Idx, TruncatedFilesAreRefusedWithSizes) {
  Bytes full = idx_file(0x08, {100}, pixels(100));
  Bytes cut(full.begin(), full.end() - 10);
  std::string message = expect_format_error([&] { parse_idx(cut, "labels-idx1-ubyte"); });
  EXPECT_NE(message.find("100 bytes but the file holds 90 bytes after the header"),
            std::string::npos) << message;
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_idx(prefix, "cut"), FormatError) << n;
  }
  Bytes gz = testutil::gzip_bytes(idx_file(0x0C, {50}, std::vector<int32_t>(50, 7)));
  for (size_t n = 2; n < gz.size(); ++n) {
    Bytes prefix(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_idx(prefix, "cut.gz"), FormatError) << n;
  }
  // Data beyond what the header declares is refused too, plain or compressed.
  Bytes longer = full;
  longer.push_back(std::byte{0});
  EXPECT_THROW(parse_idx(longer, "long"), FormatError);
  EXPECT_THROW(parse_idx(testutil::gzip_bytes(longer), "long.gz"), FormatError);
  Bytes trailing = testutil::gzip_bytes(full);
  testutil::append(trailing, "junk");
  EXPECT_THROW(parse_idx(trailing, "junk.gz"), FormatError);
  // Zero padding after the last member is not data: gzip and Python's gzip ignore it.
  Bytes padded = testutil::gzip_bytes(full);
  padded.resize(padded.size() + 512, std::byte{0});
  EXPECT_TRUE(parse_idx(padded, "padded.gz").equal(parse_idx(full, "plain")));
}

TEST(Idx, CorruptGzipAndOverflowingShapesAreRefused) {
  Bytes gz = testutil::gzip_bytes(idx_file(0x08, {1000}, pixels(1000)));
  for (size_t i = 12; i < 20 && i < gz.size(); ++i) gz[i] ^= std::byte{0x5A};
  EXPECT_THROW(parse_idx(gz, "bad.gz"), FormatError);
  Bytes huge = idx_header(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF});
  std::string message = expect_format_error([&] { parse_idx(huge, "huge"); });
  EXPECT_NE(message.find("overflows"), std::string::npos) << message;
  // No elements, but extents whose strides overflow (a fuzzer find).
  Bytes empty_huge = idx_header(0x0D, {2, 0x1040, 0x3f800200, 0, 0x40400000, 0x40800000});
  message = expect_format_error([&] { parse_idx(empty_huge, "empty-huge"); });
  EXPECT_NE(message.find("overflows"), std::string::npos) << message;
  // A gzip'd header declaring gigabytes must fail on the missing data, not allocate it first.
  message = expect_format_error(
      [&] { parse_idx(testutil::gzip_bytes(idx_header(0x08, {1 << 30, 1 << 30})), "big.gz"); });
  EXPECT_NE(message.find("more than a gzip stream"), std::string::npos) << message;
}

// A CRC-32 mismatch read "corrupt gzip data (incorrect data check-3)": zlib's return code was
// appended to its reason.
TEST(Idx, CorruptGzipIsExplainedWithoutZlibCodes) {
  Bytes gz = testutil::gzip_bytes(idx_file(0x08, {1000}, pixels(1000)));
  gz[gz.size() - 8] ^= std::byte{0x01};  // the trailer's CRC-32
  const std::string message = expect_format_error([&] { parse_idx(gz, "bad.gz"); });
  EXPECT_NE(message.find("bad.gz: corrupt gzip data (incorrect data check)"), std::string::npos) << message;
  EXPECT_EQ(message.find("-3"), std::string::npos) << message;
}

TEST(Idx, MissingFileIsAnIoError) {
  TempFolder dir;
  EXPECT_THROW(load_idx(dir / "missing"), IoError);
  testutil::write_file(dir / "empty", {});
  EXPECT_THROW(load_idx(dir / "empty"), FormatError);
}

TEST(Idx, RealFashionMnistWhenInstalled) {
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  if (!std::filesystem::exists(root + "train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Tensor labels = load_idx(root + "train-labels-idx1-ubyte.gz");
  EXPECT_EQ(labels.sizes(), IntArrayRef({60000}));
  EXPECT_EQ(labels.dtype(), kUInt8);
  std::vector<uint8_t> values = labels.to_vector<uint8_t>();
  std::vector<int> per_class(10);
  for (uint8_t v : values) {
    ASSERT_LT(v, 10);
    ++per_class[v];
  }
  for (int c : per_class) EXPECT_EQ(c, 6000);  // Fashion-MNIST's training set is balanced
  Tensor images = load_idx(root + "train-images-idx3-ubyte.gz");
  EXPECT_EQ(images.sizes(), IntArrayRef({60000, 28, 28}));
}

}  // namespace
}  // namespace mmt
