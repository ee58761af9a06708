// .npy: every dtype, both byte orders and layouts, 0-d and empty arrays, zero-copy mapping,
// numpy's own files (when numpy is installed), and refusals of corrupt or truncated input.
#include <gtest/gtest.h>

#include <complex>
#include <filesystem>

#include "importer_test_util.h"
#include "mmtensor/numpy_io.h"

namespace mmt {
namespace {

using testutil::Bytes;
using testutil::element_bytes;
using testutil::npy_file;
using testutil::TempFolder;

const ScalarType kNpyTypes[] = {kBool,   kUInt8,  kInt8,   kInt16,   kUInt16,  kInt32,     kUInt32,
                                kInt64,  kUInt64, kFloat16, kFloat32, kFloat64, kComplex64, kComplex128};

// 0, 1, 2, ... (0/1 alternating for bool; k - kj for complex) in `dtype`, shaped `sizes`.
Tensor counting(ScalarType dtype, IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  Tensor source = dtype == kBool ? full({n}, 1.0, kFloat64) : arange(n, kFloat64);
  if (dtype == kBool)
    for (int64_t i = 0; i < n; i += 2) source.set<double>({i}, 0.0);
  Tensor out = empty(sizes, dtype);
  out.copy_(source.view(sizes));
  if (is_complex(dtype)) out.imag().copy_(arange(0, -n, -1, kFloat64).view(sizes));
  return out;
}

// The values of a complex tensor, widened to complex128, in row-major order.
std::vector<std::complex<double>> complex_values(const Tensor& t) {
  Tensor wide = empty(t.sizes(), kComplex128);
  wide.copy_(t);
  return wide.to_vector<std::complex<double>>();
}

using testutil::expect_format_error;

TEST(Npy, SaveThenLoadKeepsEveryDtypeAndValue) {
  TempFolder dir;
  for (ScalarType dtype : kNpyTypes) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    Tensor original = counting(dtype, {3, 4});
    std::string path = dir / (std::string(to_string(dtype)) + ".npy");
    save_npy(path, original);
    for (bool mmap : {true, false}) {
      Tensor loaded = load_npy(path, mmap);
      EXPECT_EQ(loaded.dtype(), dtype);
      EXPECT_EQ(loaded.sizes(), IntArrayRef({3, 4}));
      EXPECT_TRUE(loaded.is_contiguous());
      EXPECT_TRUE(loaded.equal(original));
    }
    NpyHeader header = read_npy_header(path);
    EXPECT_EQ(header.descr, npy_descr(dtype));
    EXPECT_EQ(header.data_offset % 64, 0) << "numpy aligns the data to 64 bytes";
  }
}

TEST(Npy, MappedLoadIsAZeroCopyViewOfTheFile) {
  TempFolder dir;
  std::string path = dir / "x.npy";
  save_npy(path, counting(kFloat32, {100, 7}));
  Tensor mapped = load_npy(path, /*mmap=*/true);
  EXPECT_EQ(mapped.untyped_storage().filename(), path);
  EXPECT_TRUE(mapped.untyped_storage().is_read_only());
  EXPECT_EQ(mapped.untyped_storage().nbytes(), 100 * 7 * 4);
  Tensor copied = load_npy(path, /*mmap=*/false);
  EXPECT_TRUE(copied.untyped_storage().filename().empty());
  EXPECT_FALSE(copied.untyped_storage().is_read_only());
  EXPECT_TRUE(mapped.equal(copied));
}

TEST(Npy, BigEndianDataIsConvertedToNativeOrder) {
  auto check = [](const std::string& descr, auto values, ScalarType dtype) {
    SCOPED_TRACE(descr);
    Bytes file = npy_file(descr, false, "(3,)", element_bytes(values, /*big_endian=*/true));
    Tensor t = parse_npy(file, "be.npy");
    EXPECT_EQ(t.dtype(), dtype);
    std::vector<double> expected(values.begin(), values.end());
    EXPECT_EQ(t.to_double_vector(), expected);
  };
  check(">i2", std::vector<int16_t>{1, -2, 300}, kInt16);
  check(">u2", std::vector<uint16_t>{1, 2, 65000}, kUInt16);
  check(">i4", std::vector<int32_t>{1, -2, 70000}, kInt32);
  check(">u4", std::vector<uint32_t>{1, 2, 4000000000u}, kUInt32);
  check(">i8", std::vector<int64_t>{1, -2, int64_t{1} << 40}, kInt64);
  check(">u8", std::vector<uint64_t>{1, 2, uint64_t{1} << 50}, kUInt64);
  check(">f4", std::vector<float>{1.5f, -2.25f, 1e10f}, kFloat32);
  check(">f8", std::vector<double>{1.5, -2.25, 1e300}, kFloat64);
  // A complex value is two floats, each in the file's byte order: swapping the element's 8 or
  // 16 bytes whole would also exchange the real and imaginary parts.
  for (const char* descr : {">c8", ">c16"}) {
    SCOPED_TRACE(descr);
    const bool wide = descr[2] == '1';
    Bytes parts = wide ? element_bytes(std::vector<double>{1.5, -2, 3e300, 0.25}, true)
                       : element_bytes(std::vector<float>{1.5f, -2, 3e30f, 0.25f}, true);
    Tensor z = parse_npy(npy_file(descr, false, "(2,)", parts), "be.npy");
    EXPECT_EQ(z.dtype(), wide ? kComplex128 : kComplex64);
    EXPECT_EQ(complex_values(z), (std::vector<std::complex<double>>{{1.5, -2}, {wide ? 3e300 : double(3e30f), 0.25}}));
  }
  // float16 bits of 1, -2 and 0.5.
  Bytes halves = element_bytes(std::vector<uint16_t>{0x3C00, 0xC000, 0x3800}, /*big_endian=*/true);
  Tensor h = parse_npy(npy_file(">f2", false, "(3,)", halves), "be.npy");
  EXPECT_EQ(h.dtype(), kFloat16);
  EXPECT_EQ(h.to_double_vector(), (std::vector<double>{1, -2, 0.5}));
}

TEST(Npy, BigEndianFileLoadsFromDiskIntoHostMemory) {
  TempFolder dir;
  std::string path = dir / "be.npy";
  testutil::write_file(path, npy_file(">f8", false, "(2, 2)",
                                      element_bytes(std::vector<double>{1, 2, 3, 4}, true)));
  Tensor t = load_npy(path, /*mmap=*/true);
  EXPECT_TRUE(t.untyped_storage().filename().empty()) << "converted, so not a view of the file";
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{1, 2, 3, 4}));
}

TEST(Npy, FortranOrderGivesAColumnMajorView) {
  // Logical [[0, 1, 2], [3, 4, 5]] stored column by column.
  Bytes file = npy_file("<i4", true, "(2, 3)", element_bytes(std::vector<int32_t>{0, 3, 1, 4, 2, 5}, false));
  Tensor t = parse_npy(file, "f.npy");
  EXPECT_EQ(t.sizes(), IntArrayRef({2, 3}));
  EXPECT_EQ(t.strides(), IntArrayRef({1, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.contiguous().to_double_vector(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  // Big-endian and Fortran at once: converted, layout kept.
  Bytes be = npy_file(">i2", true, "(2, 3)", element_bytes(std::vector<int16_t>{0, 3, 1, 4, 2, 5}, true));
  EXPECT_EQ(parse_npy(be, "fb.npy").contiguous().to_double_vector(),
            (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

TEST(Npy, ZeroDimensionalAndEmptyArrays) {
  Tensor scalar = parse_npy(npy_file("<f8", false, "()", element_bytes(std::vector<double>{2.5}, false)), "s.npy");
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item<double>(), 2.5);
  Tensor empty_rows = parse_npy(npy_file("<f4", false, "(0, 5)", {}), "e.npy");
  EXPECT_EQ(empty_rows.sizes(), IntArrayRef({0, 5}));
  EXPECT_EQ(empty_rows.numel(), 0);

  TempFolder dir;
  save_npy(dir / "empty.npy", empty({0, 3}, kInt64));
  Tensor back = load_npy(dir / "empty.npy");
  EXPECT_EQ(back.sizes(), IntArrayRef({0, 3}));
  save_npy(dir / "scalar.npy", full({}, 7, kInt16));
  EXPECT_EQ(load_npy(dir / "scalar.npy").item<int>(), 7);
}

TEST(Npy, SavesNonContiguousTensorsInCOrder) {
  TempFolder dir;
  Tensor t = counting(kInt32, {3, 4}).t();  // [4, 3], strides [1, 4]
  save_npy(dir / "t.npy", t);
  Tensor back = load_npy(dir / "t.npy");
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_TRUE(back.equal(t.contiguous()));
}

TEST(Npy, WriterHeaderIsNumpysByteForByte) {
  Bytes bytes = npy_bytes(counting(kFloat32, {2, 3}));
  std::string header(reinterpret_cast<const char*>(bytes.data()), 128);
  std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expected += std::string(127 - expected.size(), ' ') + "\n";
  EXPECT_EQ(header.substr(0, 128), expected);
  EXPECT_EQ(bytes.size(), 128u + 24u);
  Bytes one_d_bytes = npy_bytes(arange(4));
  std::string one_d(reinterpret_cast<const char*>(one_d_bytes.data()), 128);
  EXPECT_NE(one_d.find("'shape': (4,), }"), std::string::npos);
}

TEST(Npy, BFloat16IsRefusedWithAHint) {
  TempFolder dir;
  try {
    save_npy(dir / "b.npy", empty({2}, kBFloat16));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "no temporary left behind";
}

TEST(Npy, SaveIntoAMissingFolderIsAnIoError) {
  TempFolder dir;
  EXPECT_THROW(save_npy(dir / "no/such/x.npy", arange(3)), IoError);
  EXPECT_THROW(load_npy(dir / "missing.npy"), IoError);
  EXPECT_THROW(load_npy(dir.path()), IoError);
}

TEST(Npy, TruncatedDataNamesTheShapeAndTheBytes) {
  Bytes file = npy_file("<f4", false, "(60000, 28, 28)", Bytes(1000));
  std::string message = expect_format_error([&] { parse_npy(file, "x.npy"); });
  EXPECT_EQ(message,
            "x.npy: header declares shape (60000, 28, 28) of <f4 = 188160000 bytes but the buffer "
            "holds 1000 bytes after the header");
  TempFolder dir;
  testutil::write_file(dir / "x.npy", file);
  EXPECT_NE(expect_format_error([&] { load_npy(dir / "x.npy"); }).find("bytes but the file holds 1000 bytes"),
            std::string::npos);
}

// np.load reads the declared bytes and ignores what follows; mmtensor refuses a file with
// bytes after its array (a shape out of date would be packed short without a word), and
// says how many there are, whether they make whole rows, and how to cut them off.
TEST(Npy, BytesAfterTheArrayAreRefusedAndCounted) {
  const Bytes rows = npy_file("<i4", false, "(2, 3)", Bytes(24 + 36));
  EXPECT_EQ(expect_format_error([&] { parse_npy(rows, "long.npy"); }),
            "long.npy: header declares shape (2, 3) of <i4 = 24 bytes but the buffer holds 60 bytes after the header: 36 "
            "bytes follow the array, as many as 3 more rows along the first dimension. np.load ignores such bytes; "
            "mmtensor refuses them, as they usually mean a shape out of date (rows appended without rewriting the "
            "header), which packing would silently cut short. If they are data, write the whole shape into the "
            "header; if not, pass only the first 152 bytes");
  TempFolder dir;
  testutil::write_file(dir / "long.npy", rows);
  const std::string from_file = expect_format_error([&] { load_npy(dir / "long.npy"); });
  EXPECT_NE(from_file.find(": 36 bytes follow the array, as many as 3"), std::string::npos) << from_file;
  EXPECT_NE(from_file.find("cut them off: truncate -s 152 FILE"), std::string::npos) << from_file;
  // Cut as the message says, the file loads.
  std::filesystem::resize_file(dir / "long.npy", 152);
  EXPECT_EQ(load_npy(dir / "long.npy").sizes(), IntArrayRef({2, 3}));
  // Bytes that are not whole rows are not called rows.
  const std::string odd = expect_format_error([&] { parse_npy(npy_file("<u1", false, "(2, 2)", Bytes(5)), "odd.npy"); });
  EXPECT_NE(odd.find(": 1 byte follows the array. np.load ignores"), std::string::npos) << odd;
  const std::string row = expect_format_error([&] { parse_npy(npy_file("<u1", false, "(2, 2)", Bytes(6)), "row.npy"); });
  EXPECT_NE(row.find(": 2 bytes follow the array, as many as 1 more row along the first dimension."), std::string::npos)
      << row;
}

TEST(Npy, CorruptHeadersAreRefusedWithTheRule) {
  Bytes data = element_bytes(std::vector<float>{1, 2}, false);
  auto refused = [&](const Bytes& file, const std::string& fragment) {
    std::string message = expect_format_error([&] { parse_npy(file, "bad.npy"); });
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_EQ(message.rfind("bad.npy", 0), 0u) << "names the file: " << message;
  };
  using testutil::npy_with_dict;
  refused(testutil::to_bytes("NUMPY not really"), "magic");
  refused(testutil::to_bytes("\x93NUMPY"), "too short");
  Bytes wrong_version = npy_file("<f4", false, "(2,)", data);
  wrong_version[6] = std::byte{9};
  refused(wrong_version, "version 9");
  Bytes long_header = npy_file("<f4", false, "(2,)", data);
  long_header[8] = std::byte{0xFF};
  long_header[9] = std::byte{0xFF};
  refused(long_header, "truncated .npy header");
  Bytes huge_header = npy_file("<f4", false, "(2,)", data, 2);
  huge_header[10] = std::byte{0x10};  // 1 MiB and more
  refused(huge_header, "exceeds the limit");
  refused(npy_with_dict("{'descr': '<f4', 'shape': (2,), }", data), "no 'fortran_order'");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, }", data), "no 'shape'");
  refused(npy_with_dict("{'fortran_order': False, 'shape': (2,), }", data), "no 'descr'");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data),
          "unexpected key 'x'");
  refused(npy_with_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", data),
          "appears twice");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,)}", data),
          "True or False");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", data),
          "trailing comma");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", data),
          "non-negative integer");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", data),
          "after the header dict");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", data),
          "expected a non-negative integer");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", data),
          "expected '}'");
  refused(npy_with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", data),
          "unsupported dtype: a structured array");  // not "corrupt": numpy writes such files
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, "
                        "'shape': (4294967296, 4294967296, 4294967296)}", data),
          "overflows");
  // Empty, yet its strides would not fit: refused as well (found by the fuzzer).
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, "
                        "'shape': (0, 4294967296, 4294967296)}", data),
          "overflows");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, "
                        "'shape': (99999999999999999999,)}", data),
          "64-bit");
  refused(npy_file("|O", false, "(2,)", data), "pickled");
  refused(npy_file("<c32", false, "(1,)", data), "unsupported dtype '<c32': only complex64 (c8) and complex128 (c16)");
  refused(npy_file("complex256", false, "(1,)", data), "only complex64 (c8) and complex128 (c16)");
  refused(npy_file("D", false, "(1,)", data), "only spellings that carry the size");
  refused(npy_file("<U1", false, "(2,)", data), "string");
  refused(npy_file("<f16", false, "(1,)", data), "unsupported dtype '<f16'");
  refused(npy_with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (03, 2)}", data),
          "bad.npy: corrupt .npy header at character 51: dimension '03' has a leading zero, which Python's integer "
          "syntax (and so np.load) refuses; write 3");
  refused(npy_file("<int32", false, "(2,)", data), "unsupported dtype '<int32': not a numeric type mmtensor supports; "
          "mmtensor reads a type string of b1, u1, i1, i2, u2, i4, u4, i8, u8, f2, f4, f8, c8 or c16, after a byte "
          "order '<', '>', '=' or '|' or alone (native order), or one of the names bool, int8, uint8, int16, uint16, "
          "int32, uint32, int64, uint64, float16, float32, float64, complex64 and complex128");
  // With a byte order too, as numpy takes the one-letter codes (they fell to "not a numeric type").
  for (const char* unsized : {"int", "float", "l", "f", "double", "bool_", "<d", ">H", "|?", "<f", "=i"})
    refused(npy_file(unsized, false, "(2,)", data),
            "unsupported dtype '" + std::string(unsized) + "': numpy reads this name too, but mmtensor takes only spellings that carry the size");
  refused(npy_file("|b1", false, "(2,)", Bytes{std::byte{1}, std::byte{2}}), "only 0 and 1");
}

// What np.load reads beside numpy's own spelling of the header: a type string without a byte
// order (native, as numpy reads it; '|' on a multi-byte type too), the dtype's name as numpy
// prints it, whitespace and line breaks between the dict's tokens, and zero written as "00".
TEST(Npy, ReadsTheHeaderSpellingsNumpyReads) {
  const Bytes ints = element_bytes(std::vector<int32_t>{1, -2}, false);
  const Tensor expected = parse_npy(npy_file("<i4", false, "(2,)", ints), "ref.npy");
  for (const char* descr : {"i4", "=i4", "|i4", "int32"}) {
    SCOPED_TRACE(descr);
    const Tensor t = parse_npy(npy_file(descr, false, "(2,)", ints), "x.npy");
    EXPECT_EQ(t.dtype(), kInt32);
    EXPECT_TRUE(t.equal(expected));
  }
  const struct {
    const char* name;
    ScalarType dtype;
  } names[] = {{"bool", kBool},      {"int8", kInt8},      {"uint8", kUInt8},     {"int16", kInt16},
               {"uint16", kUInt16},  {"int32", kInt32},    {"uint32", kUInt32},   {"int64", kInt64},
               {"uint64", kUInt64},  {"float16", kFloat16}, {"float32", kFloat32}, {"float64", kFloat64},
               {"complex64", kComplex64}, {"complex128", kComplex128}};
  for (const auto& n : names) {
    SCOPED_TRACE(n.name);
    const Tensor t = parse_npy(npy_file(n.name, false, "(3,)", Bytes(3 * element_size(n.dtype))), "x.npy");
    EXPECT_EQ(t.dtype(), n.dtype);
    EXPECT_EQ(t.sizes(), IntArrayRef({3}));
  }
  const Bytes floats = element_bytes(std::vector<float>{1.5f, 2.5f}, false);
  EXPECT_EQ(parse_npy(npy_file("f4", false, "(2,)", floats), "x.npy").to_double_vector(), (std::vector<double>{1.5, 2.5}));
  using testutil::npy_with_dict;
  for (const char* dict : {"{'descr': '<i4',\n 'fortran_order': False,\n 'shape': (2,)\n}",
                           "\n{\"descr\":\t\"<i4\",\r\n\"fortran_order\" : False ,\f'shape' : ( 2 , ) , }",
                           "{'descr': 'int32', 'fortran_order': False, 'shape': (\n  2,\n)}"}) {
    SCOPED_TRACE(dict);
    EXPECT_TRUE(parse_npy(npy_with_dict(dict, ints), "x.npy").equal(expected));
  }
  EXPECT_EQ(parse_npy(npy_with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (00, 7)}", {}), "x.npy").sizes(),
            IntArrayRef({0, 7}));
}

// The same headers given to numpy itself: each one mmtensor reads, np.load reads to the same
// values, and each one mmtensor refuses as numpy does, np.load refuses. (Bytes after the data
// and type names without a size are refused on purpose where numpy reads them: tests above.)
TEST(Npy, AgreesWithNumpyOnTheHeadersItReadsAndRefuses) {
  std::string python = testutil::python_with_numpy();
  if (python.empty()) GTEST_SKIP() << "python3 with numpy not available";
  TempFolder dir;
  const Bytes ints = element_bytes(std::vector<int32_t>{1, -2}, false);
  const std::vector<std::pair<std::string, bool>> dicts{
      {"{'descr': 'i4', 'fortran_order': False, 'shape': (2,)}", true},
      {"{'descr': '|i4', 'fortran_order': False, 'shape': (2,)}", true},
      {"{'descr': 'int32', 'fortran_order': False, 'shape': (2,)}", true},
      {"{'descr': '<i4',\n 'fortran_order': False,\r\n\f'shape': (2,)\n}", true},
      {"\n{'descr': '<i4', 'fortran_order': False, 'shape': (00002,)}", false},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (02,)}", false},
      {"{'descr': '<int32', 'fortran_order': False, 'shape': (2,)}", false},
  };
  for (size_t i = 0; i < dicts.size(); ++i) {
    testutil::write_file(dir / ("h" + std::to_string(i) + ".npy"), testutil::npy_with_dict(dicts[i].first, ints));
    SCOPED_TRACE(dicts[i].first);
    if (dicts[i].second) {
      EXPECT_TRUE(load_npy(dir / ("h" + std::to_string(i) + ".npy")).equal(parse_npy(npy_file("<i4", false, "(2,)", ints), "r")));
    } else {
      EXPECT_THROW(load_npy(dir / ("h" + std::to_string(i) + ".npy")), FormatError);
    }
  }
  std::string expected = "[";
  for (const auto& d : dicts) expected += d.second ? "True, " : "False, ";
  expected += "]";
  ASSERT_EQ(testutil::run_python(python, dir.path(), R"(
import sys
verdicts = []
for i in range()" + std::to_string(dicts.size()) + R"():
    try:
        verdicts.append(np.load('h%d.npy' % i).tolist() == [1, -2])
    except ValueError:
        verdicts.append(False)
sys.exit(0 if verdicts == )" + expected + R"( else 'numpy read them as %s' % verdicts)
)"), 0);
}

// A NUL in a header string ended the message there (what() is a C string): "unsupported
// dtype '<i4" and nothing after it. Text from the header is escaped, so the whole reason shows.
TEST(Npy, ControlBytesFromTheHeaderAreEscapedInTheMessage) {
  Bytes data = element_bytes(std::vector<float>{1, 2}, false);
  using testutil::npy_with_dict;
  const auto message = [&](const std::string& dict) {
    std::string text = expect_format_error([&] { parse_npy(npy_with_dict(dict, data), "bad.npy"); });
    EXPECT_EQ(text.find('\0'), std::string::npos) << "a NUL in the message";
    EXPECT_EQ(std::string(text.c_str()), text) << "what() is cut short";
    return text;
  };
  using namespace std::string_literals;
  EXPECT_NE(message("{'descr': '<i4\0', 'fortran_order': False, 'shape': (2,)}"s)
                .find("unsupported dtype '<i4\\x00': not a numeric type"), std::string::npos);
  EXPECT_NE(message("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'a\0\x1b[2J': 1}"s)
                .find("unexpected key 'a\\x00\\x1b[2J' (an .npy header has exactly"), std::string::npos);
  EXPECT_NE(message("{'descr': '<f4'\0 'fortran_order': False, 'shape': (2,)}"s).find("but found '\\x00'"),
            std::string::npos);
}

TEST(Npy, EveryTruncationOfAValidFileIsRefusedCleanly) {
  Bytes file = npy_bytes(counting(kFloat64, {3, 5}));
  for (size_t n = 0; n < file.size(); ++n) {
    Bytes prefix(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_npy(prefix, "cut.npy"), FormatError) << n << " bytes";
  }
}

TEST(Npy, ReadsWhatNumpyWritesAndNumpyReadsWhatWeWrite) {
  std::string python = testutil::python_with_numpy();
  if (python.empty()) GTEST_SKIP() << "python3 with numpy not available";
  TempFolder dir;
  ASSERT_EQ(testutil::run_python(python, dir.path(), R"(
types = ['?', 'u1', 'i1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8', '<f2', '<f4', '<f8',
         '>i2', '>u2', '>i4', '>u4', '>i8', '>u8', '>f2', '>f4', '>f8']
for i, t in enumerate(types):
    a = (np.arange(24) % (2 if t == '?' else 100)).astype(t).reshape(2, 3, 4)
    np.save('c%d.npy' % i, a)
    np.save('f%d.npy' % i, np.asfortranarray(a))
np.save('scalar.npy', np.float32(3.5))
np.save('empty.npy', np.zeros((0, 4), np.int16))
np.save('ours_ref.npy', np.arange(12, dtype='<i8').reshape(3, 4))
for i, t in enumerate(['<c8', '<c16', '>c8', '>c16']):
    z = (np.arange(24) - 1j * np.arange(24)).astype(t).reshape(2, 3, 4)
    np.save('zc%d.npy' % i, z)
    np.save('zf%d.npy' % i, np.asfortranarray(z))
)"), 0);
  std::vector<std::complex<double>> complex_expected;
  for (int k = 0; k < 24; ++k) complex_expected.emplace_back(k, -k);
  for (int i = 0; i < 4; ++i) {
    for (const char* order : {"zc", "zf"}) {
      const std::string path = dir / (order + std::to_string(i) + ".npy");
      SCOPED_TRACE(path);
      const Tensor z = load_npy(path);
      EXPECT_EQ(z.dtype(), i % 2 ? kComplex128 : kComplex64);
      EXPECT_EQ(z.sizes(), IntArrayRef({2, 3, 4}));
      EXPECT_EQ(complex_values(z), complex_expected);
    }
  }
  Tensor expected = arange(24, kFloat64).view({2, 3, 4});
  for (int i = 0; i < 21; ++i) {
    for (const char* order : {"c", "f"}) {
      std::string path = dir / (order + std::to_string(i) + ".npy");
      SCOPED_TRACE(path);
      Tensor t = load_npy(path);
      EXPECT_EQ(t.sizes(), IntArrayRef({2, 3, 4}));
      EXPECT_EQ(t.is_contiguous(), order[0] == 'c');
      std::vector<double> values = t.contiguous().to_double_vector();
      for (size_t k = 0; k < values.size(); ++k)
        EXPECT_EQ(values[k], i == 0 ? double(k % 2) : double(k)) << k;
    }
  }
  EXPECT_EQ(load_npy(dir / "scalar.npy").item<float>(), 3.5f);
  EXPECT_EQ(load_npy(dir / "empty.npy").sizes(), IntArrayRef({0, 4}));
  // Our writer produces numpy's bytes exactly.
  save_npy(dir / "ours.npy", arange(12).view({3, 4}));
  EXPECT_EQ(testutil::read_file(dir / "ours.npy"), testutil::read_file(dir / "ours_ref.npy"));
  for (ScalarType dtype : kNpyTypes) save_npy(dir / ("w_" + std::string(to_string(dtype)) + ".npy"), counting(dtype, {3, 4}));
  ASSERT_EQ(testutil::run_python(python, dir.path(), R"(
import glob, sys
for p in glob.glob('w_*.npy'):
    a = np.load(p)
    want = (np.arange(12) % (2 if a.dtype == np.bool_ else 1 << 20)).reshape(3, 4)
    if a.dtype.kind == 'c':
        if not np.array_equal(a, want - 1j * want): sys.exit('mismatch in ' + p)
    elif not np.array_equal(a.astype(np.int64), want): sys.exit('mismatch in ' + p)
)"), 0);
}

}  // namespace
}  // namespace mmt
