// HDF5 files as pack inputs (PackSources::from_arrays with "PATH" or "NAME=PATH:DATASET"):
// datasets stored plainly are views of the file, others are read through libhdf5, and what
// cannot be packed is refused naming the dataset and why. The files are written here through
// the HDF5 C API the way h5py writes them (its bool enum, its complex compound).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "decode_limit.h"
#include "hdf5_chunks.h"
#include "scratch_file.h"
#include "importer_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/error.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testutil::TempFolder;

// An HDF5 file being written; closed (and so complete) when destroyed.
class H5Writer {
 public:
  explicit H5Writer(const std::string& path) : file_(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)) {
    EXPECT_GE(file_, 0) << path;
  }
  ~H5Writer() { H5Fclose(file_); }
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  // Writes `data` (in `memory_type`) as dataset `name` of `file_type`, creating its groups.
  // `create` is a dataset creation property list (chunks, filters), or H5P_DEFAULT.
  H5Writer& write(const std::string& name, hid_t file_type, hid_t memory_type, std::vector<hsize_t> dims,
                  const void* data, hid_t create = H5P_DEFAULT) {
    const hid_t space = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t links = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(links, 1);
    const hid_t dataset = H5Dcreate2(file_, name.c_str(), file_type, space, links, create, H5P_DEFAULT);
    EXPECT_GE(dataset, 0) << name;
    if (data) {
      EXPECT_GE(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0) << name;
    }
    H5Dclose(dataset);
    H5Pclose(links);
    H5Sclose(space);
    return *this;
  }

 private:
  hid_t file_;
};

// Closes an HDF5 type or property list at the end of a test.
struct Owned {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Owned() { close(id); }
  operator hid_t() const { return id; }
};

Owned chunked(std::vector<hsize_t> chunk, bool gzip_and_shuffle) {
  Owned create{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  H5Pset_chunk(create, static_cast<int>(chunk.size()), chunk.data());
  if (gzip_and_shuffle) {
    H5Pset_shuffle(create);
    H5Pset_deflate(create, 4);
  }
  return create;
}

// h5py's bool: an enum of int8 with FALSE = 0 and TRUE = 1.
Owned bool_enum() {
  Owned type{H5Tenum_create(H5T_NATIVE_INT8), H5Tclose};
  int8_t value = 0;
  H5Tenum_insert(type, "FALSE", &value);
  value = 1;
  H5Tenum_insert(type, "TRUE", &value);
  return type;
}

// h5py's complex64: a compound of float32 "r" and "i".
Owned complex64(hid_t part) {
  Owned type{H5Tcreate(H5T_COMPOUND, 8), H5Tclose};
  H5Tinsert(type, "r", 0, part);
  H5Tinsert(type, "i", 4, part);
  return type;
}

// numpy's float16 (h5py writes it as an IEEE half of this layout).
Owned float16(H5T_order_t order) {
  Owned type{H5Tcopy(H5T_IEEE_F32LE), H5Tclose};
  H5Tset_fields(type, 15, 10, 5, 0, 10);
  H5Tset_precision(type, 16);
  H5Tset_size(type, 2);
  H5Tset_ebias(type, 15);
  H5Tset_order(type, order);
  return type;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  return t.to_vector<T>();
}

PackSources sources_of(const std::vector<std::string>& specs) { return PackSources::from_arrays(specs); }

TEST(PackHdf5, ContiguousDatasetsAreViewsOfTheFileAndPackAsFields) {
  TempFolder dir;
  const std::string path = dir / "mnist.h5";
  std::vector<uint8_t> images(5 * 4 * 3);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i * 7);
  const std::vector<int64_t> labels = {3, 1, 4, 1, 5};
  H5Writer(path)
      .write("images", H5T_STD_U8LE, H5T_NATIVE_UINT8, {5, 4, 3}, images.data())
      .write("labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {5}, labels.data());

  const PackSources sources = sources_of({path});
  ASSERT_EQ(sources.records(), 5);
  ASSERT_EQ(sources.schema().size(), 2u);
  EXPECT_EQ(sources.schema()[0].name, "images");
  EXPECT_EQ(sources.schema()[0].dtype, kUInt8);
  EXPECT_EQ(sources.schema()[1].name, "labels");
  const std::vector<Tensor> third = sources.record(2);
  EXPECT_EQ(third[0].sizes(), IntArrayRef({4, 3}));
  EXPECT_EQ(values_of<uint8_t>(third[0]), std::vector<uint8_t>(images.begin() + 24, images.begin() + 36));
  EXPECT_EQ(third[1].item<int64_t>(), 4);
  // No copy: the record views the HDF5 file's mapping, as an .npy input's does.
  EXPECT_EQ(third[0].untyped_storage().filename(), path);
  EXPECT_EQ(sources.record_origin(0, 2).find(path + ":/images"), 0u) << sources.record_origin(0, 2);

  const std::string out = dir / "mnist.mmt";
  pack_dataset(out, sources, PackOptions{});
  const Dataset ds = Dataset::open(out);
  EXPECT_EQ(values_of<uint8_t>(ds.column("images")), images);
  EXPECT_EQ(values_of<int64_t>(ds.column("labels")), labels);
}

TEST(PackHdf5, ChunkedCompressedAndForeignOrderDatasetsAreReadThroughTheLibrary) {
  TempFolder dir;
  const std::string path = dir / "mixed.h5";
  constexpr hsize_t n = 7;
  std::vector<float> floats(n * 3);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<float>(i) * 0.5f - 3.0f;
  std::vector<int16_t> shorts(n);
  for (size_t i = 0; i < n; ++i) shorts[i] = static_cast<int16_t>(-1000 + 300 * static_cast<int>(i));
  const std::vector<uint16_t> halves = {0x0000, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555};  // bits
  const std::vector<int8_t> flags = {0, 1, 1, 0, 1, 0, 1};
  std::vector<float> complex_parts(2 * n);
  for (size_t i = 0; i < complex_parts.size(); ++i) complex_parts[i] = static_cast<float>(i) + 0.25f;
  const Owned chunks = chunked({2, 3}, /*gzip_and_shuffle=*/true);
  const Owned flags_type = bool_enum();
  const Owned half_le = float16(H5T_ORDER_LE), half_be = float16(H5T_ORDER_BE);
  const Owned complex_be = complex64(H5T_IEEE_F32BE), complex_native = complex64(H5T_NATIVE_FLOAT);
  H5Writer(path)
      .write("a_gzip", H5T_IEEE_F32BE, H5T_NATIVE_FLOAT, {n, 3}, floats.data(), chunks)
      .write("b_big_endian", H5T_STD_I16BE, H5T_NATIVE_INT16, {n}, shorts.data())
      .write("c_half", half_be, half_le, {n}, halves.data())
      .write("d_flags", flags_type, flags_type, {n}, flags.data())
      .write("e_complex", complex_be, complex_native, {n}, complex_parts.data());

  const PackSources sources = sources_of({path});
  ASSERT_EQ(sources.records(), static_cast<int64_t>(n));
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 5u);
  EXPECT_EQ(schema[0].dtype, kFloat32);
  EXPECT_EQ(schema[1].dtype, kInt16);
  EXPECT_EQ(schema[2].dtype, kFloat16);
  EXPECT_EQ(schema[3].dtype, kBool);
  EXPECT_EQ(schema[4].dtype, kComplex64);

  const std::string out = dir / "mixed.mmt";
  pack_dataset(out, sources, PackOptions{});
  const Dataset ds = Dataset::open(out);
  EXPECT_EQ(values_of<float>(ds.column("a_gzip")), floats);
  EXPECT_EQ(values_of<int16_t>(ds.column("b_big_endian")), shorts);
  const Tensor half = ds.column("c_half").contiguous();
  EXPECT_EQ(std::memcmp(half.data_ptr(), halves.data(), 2 * n), 0);
  const std::vector<bool> expected_flags = {false, true, true, false, true, false, true};
  EXPECT_EQ(values_of<bool>(ds.column("d_flags")), expected_flags);
  const Tensor complex = ds.column("e_complex").contiguous();
  EXPECT_EQ(std::memcmp(complex.data_ptr(), complex_parts.data(), 8 * n), 0);
  // Read through the library into a scratch file, not views of the HDF5 file.
  EXPECT_NE(sources.record(0)[0].untyped_storage().filename(), path);
}

TEST(PackHdf5, DatasetsAreNamedByPathAndGroupsNeedNames) {
  TempFolder dir;
  const std::string path = dir / "splits.h5";
  const std::vector<int32_t> train_x = {1, 2, 3, 4, 5, 6}, train_y = {7, 8, 9}, test_x = {10, 11, 12, 13};
  H5Writer(path)
      .write("train/x", H5T_STD_I32LE, H5T_NATIVE_INT32, {3, 2}, train_x.data())
      .write("train/y", H5T_STD_I32LE, H5T_NATIVE_INT32, {3}, train_y.data())
      .write("/test/x", H5T_STD_I32LE, H5T_NATIVE_INT32, {2, 2}, test_x.data());

  EXPECT_THROW_WITH(sources_of({path}), ValueError,
                    path + ": holds datasets in groups (test/x, train/x, train/y), whose paths are no field names; "
                           "give each dataset to pack as NAME=" + path + ":GROUP/DATASET");
  const PackSources train = sources_of({"x=" + path + ":train/x", "y=" + path + ":/train/y"});
  ASSERT_EQ(train.records(), 3);
  EXPECT_EQ(values_of<int32_t>(train.record(1)[0]), std::vector<int32_t>({3, 4}));
  EXPECT_EQ(train.record(2)[1].item<int32_t>(), 9);
  EXPECT_THROW_WITH(sources_of({path + ":train/x"}), InputSpecError, "needs a field name: write NAME=" + path);
  EXPECT_THROW_WITH(sources_of({"x=" + path}), InputSpecError, "is an HDF5 file, which names its own fields");
  EXPECT_THROW_WITH(sources_of({"x=" + path + ":train/z"}), ValueError,
                    path + ": no dataset 'train/z' in the file; its datasets: test/x, train/x, train/y");
  EXPECT_THROW_WITH(sources_of({"x=" + path + ":train/x", "t=" + path + ":test/x"}), ValueError,
                    "record counts disagree");

  // A dataset at the root given alone is the field of its name.
  const std::string flat = dir / "flat.h5";
  H5Writer(flat).write("tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {3}, train_y.data());
  EXPECT_EQ(sources_of({flat + ":tokens"}).schema()[0].name, "tokens");
}

TEST(PackHdf5, WhatCannotBePackedIsRefusedNamingTheDataset) {
  TempFolder dir;
  const std::string path = dir / "odd.h5";
  const char names[2][5] = {{'c', 'a', 't', 0, 0}, {'d', 'o', 'g', 0, 0}};
  const int32_t one = 1;
  const std::vector<int8_t> bad_flags = {0, 2};
  const Owned text{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(text, 5);
  const Owned flags_type = bool_enum();
  H5Writer(path)
      .write("names", text, text, {2}, names)
      .write("scalar", H5T_STD_I32LE, H5T_NATIVE_INT32, {}, &one)
      .write("z_flags", flags_type, flags_type, {2}, bad_flags.data());
  EXPECT_THROW_WITH(sources_of({"n=" + path + ":names"}), ValueError, path + ":/names: holds strings; mmtensor packs");
  EXPECT_THROW_WITH(sources_of({"s=" + path + ":scalar"}), ValueError, path + ":/scalar: a scalar (a scalar dataspace)");
  EXPECT_THROW_WITH(sources_of({"f=" + path + ":z_flags"}), FormatError,
                    path + ":/z_flags: bool element 1 holds the byte 2; a bool value may hold only 0 and 1");
  // Of a whole file, the one that cannot be packed says how to leave it out.
  EXPECT_THROW_WITH(sources_of({path}), ValueError, "(to pack the file's other datasets, give each as NAME=" + path);

  const std::string empty = dir / "empty.h5";
  { H5Writer writer(empty); }
  EXPECT_THROW_WITH(sources_of({empty}), ValueError, empty + ": the HDF5 file holds no datasets");

  // A file cut short is the library's error, named, wherever it is cut.
  const std::string good = dir / "good.h5";
  std::vector<int64_t> values(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i);
  const Owned chunks = chunked({256}, /*gzip_and_shuffle=*/true);
  H5Writer(good)
      .write("plain", H5T_STD_I64LE, H5T_NATIVE_INT64, {4096}, values.data())
      .write("packed", H5T_STD_I64LE, H5T_NATIVE_INT64, {4096}, values.data(), chunks);
  const auto bytes = testing::file_bytes(good);
  for (const size_t cut : {size_t{0}, size_t{8}, size_t{100}, size_t{1000}, bytes.size() / 3, bytes.size() / 2,
                           bytes.size() - 2000, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    const std::string cut_path = dir / "cut.h5";
    testutil::write_file(cut_path, testutil::to_bytes(std::string_view(bytes).substr(0, cut)));
    try {
      const PackSources sources = sources_of({"p=" + cut_path + ":plain", "q=" + cut_path + ":packed"});
      ADD_FAILURE() << "a file cut at " << cut << " of " << bytes.size() << " bytes was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.h5"), std::string::npos) << e.what();
    }
  }
}

TEST(PackHdf5, UnavailableFiltersAndUnboundedExpansionAreRefused) {
  TempFolder dir;
  const std::string path = dir / "filters.h5";
  std::vector<uint8_t> values(4096, 7);
  // h5py's lzf (filter 32000), which libhdf5 lacks: optional, so the writer stores the chunks
  // unfiltered, but the dataset still names it.
  const Owned lzf = chunked({1024}, false);
  const bool lzf_set = H5Pset_filter(lzf, 32000, H5Z_FLAG_OPTIONAL, 0, nullptr) >= 0;
  const Owned never_written = chunked({64, 1024}, true);
  {
    H5Writer writer(path);
    if (lzf_set) writer.write("lzf", H5T_STD_U8LE, H5T_NATIVE_UINT8, {4096}, values.data(), lzf);
    writer.write("zeros", H5T_STD_U8LE, H5T_NATIVE_UINT8, {4096, 1024}, nullptr, never_written);
  }
  if (lzf_set)
    EXPECT_THROW_WITH(sources_of({"x=" + path + ":lzf"}), ValueError,
                      path + ":/lzf: compressed with HDF5 filter 32000");
  // 4 MiB declared, none stored: past the decode limit (its floor lowered for the test).
  detail::set_decode_floor(int64_t{1} << 20);
  EXPECT_THROW_WITH(sources_of({"z=" + path + ":zeros"}), ValueError,
                    path + ":/zeros: declares 4194304 bytes of values but stores 0");
  // 40 bytes of values in a chunk of 16 MiB (a dimension that may grow, chunked past its
  // extent; a hostile file stores such a chunk in a few bytes): the library would decode the
  // whole chunk.
  {
    const std::string tall = dir / "tall_chunk.h5";
    const Owned create{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    const hsize_t chunk[1] = {hsize_t{1} << 22};
    H5Pset_chunk(create, 1, chunk);
    const hid_t file = H5Fcreate(tall.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[1] = {10}, max_dims[1] = {H5S_UNLIMITED};
    const hid_t space = H5Screate_simple(1, dims, max_dims);
    const hid_t dataset = H5Dcreate2(file, "v", H5T_STD_I32LE, space, H5P_DEFAULT, create, H5P_DEFAULT);
    H5Dclose(dataset);
    H5Sclose(space);
    H5Fclose(file);
    EXPECT_THROW_WITH(sources_of({"v=" + tall + ":v"}), ValueError,
                      tall + ":/v: its chunks ([4194304]) decode to more than 1048576 bytes for 40 bytes of values");
  }
  detail::set_decode_floor(0);
  EXPECT_EQ(sources_of({"z=" + path + ":zeros"}).records(), 4096);
}

// A dataset whose values would come from another file (external storage, an external link)
// is refused: an input could otherwise name any file on the machine and pack it.
TEST(PackHdf5, ValuesFromOtherFilesAreRefused) {
  TempFolder dir;
  const std::string secret = dir / "secret.txt", path = dir / "links.h5", other = dir / "other.h5";
  testutil::write_file(secret, testutil::to_bytes("TOP SECRET PASSWORD 1234"));
  const std::vector<int32_t> values = {1, 2, 3, 4};
  H5Writer(other).write("x", H5T_STD_I32LE, H5T_NATIVE_INT32, {4}, values.data());
  const Owned external{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  ASSERT_GE(H5Pset_external(external, secret.c_str(), 0, 24), 0);
  {
    H5Writer writer(path);
    writer.write("stolen", H5T_STD_U8LE, H5T_NATIVE_UINT8, {24}, nullptr, external);
    writer.write("own", H5T_STD_I32LE, H5T_NATIVE_INT32, {4}, values.data());
  }
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Lcreate_external(other.c_str(), "/x", file, "linked", H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(file);
  }
  EXPECT_THROW_WITH(sources_of({"s=" + path + ":stolen"}), ValueError,
                    path + ":/stolen: its values are stored in external files (H5Pset_external)");
  EXPECT_THROW_WITH(sources_of({"l=" + path + ":linked"}), ValueError,
                    path + ":/linked: lies in another file (" + other + "), reached through an external link");
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Lcreate_external((dir / "gone.h5").c_str(), "/x", file, "dangling", H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(file);
  }
  EXPECT_THROW_WITH(sources_of({"d=" + path + ":dangling"}), ValueError,
                    path + ":/dangling: an external link to another file, which cannot be opened");
  // The whole file: external links are passed over, external storage refused.
  EXPECT_THROW_WITH(sources_of({path}), ValueError, "its values are stored in external files");
  EXPECT_EQ(sources_of({"o=" + path + ":own"}).records(), 4);
}

// A dataset whose object header is damaged is named as such, in the whole file or by name,
// not left out or called missing.
TEST(PackHdf5, ADamagedDatasetIsNamedNotLeftOut) {
  TempFolder dir;
  const std::string path = dir / "two.h5";
  const std::vector<int32_t> values = {1, 2, 3, 4};
  H5Writer(path)
      .write("a", H5T_STD_I32LE, H5T_NATIVE_INT32, {4}, values.data())
      .write("b", H5T_STD_I32LE, H5T_NATIVE_INT32, {4}, values.data());
  haddr_t header = HADDR_UNDEF;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    H5O_info_t info{};
    ASSERT_GE(H5Oget_info_by_name2(file, "b", &info, H5O_INFO_BASIC, H5P_DEFAULT), 0);
    header = info.addr;
    H5Fclose(file);
  }
  testutil::Bytes bytes = testutil::to_bytes(testing::file_bytes(path));
  ASSERT_LT(header, bytes.size());
  bytes[header] = std::byte{0x77};  // the object header's version
  testutil::write_file(path, bytes);
  EXPECT_THROW_WITH(sources_of({path}), FormatError, path + ": the object 'b' cannot be read (damaged?)");
  EXPECT_THROW_WITH(sources_of({"b=" + path + ":b"}), FormatError, path + ": the object 'b' cannot be read (damaged?)");
  EXPECT_EQ(sources_of({"a=" + path + ":a"}).records(), 4);

  // An object neither dataset nor group (what a damaged dataset header can read as) is not
  // passed over in a pack of the whole file.
  const std::string typed = dir / "typed.h5";
  H5Writer(typed).write("a", H5T_STD_I32LE, H5T_NATIVE_INT32, {4}, values.data());
  {
    const hid_t file = H5Fopen(typed.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t type = H5Tcopy(H5T_STD_I32LE);
    ASSERT_GE(H5Tcommit2(file, "t", type, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Tclose(type);
    H5Fclose(file);
  }
  EXPECT_THROW_WITH(sources_of({typed}), FormatError,
                    typed + ": holds objects that are neither datasets nor groups (t: committed datatypes");
  EXPECT_THROW_WITH(sources_of({"t=" + typed + ":t"}), FormatError, typed + ":/t: is no dataset but a committed datatype");
  EXPECT_EQ(sources_of({"a=" + typed + ":a"}).records(), 4);
}

// A file another process holds open for writing (h5py's File(path, "w") not yet closed) is
// locked by libhdf5: an IoError that says so and how to read it anyway, not "damaged".
TEST(PackHdf5, AFileAWriterHoldsOpenIsNamedAsSuch) {
  const char* locking = std::getenv("HDF5_USE_FILE_LOCKING");
  if (locking != nullptr && std::string_view(locking) == "FALSE") GTEST_SKIP() << "HDF5_USE_FILE_LOCKING=FALSE";
  TempFolder dir;
  const std::string path = dir / "open.h5";
  const std::vector<int32_t> values{1, 2, 3};
  H5Writer(path).write("x", H5T_STD_I32LE, H5T_NATIVE_INT32, {3}, values.data());
  // The writer's lock, as libhdf5 takes it (flock, exclusive), on a descriptor of its own: a
  // lock on another open file description conflicts within one process too.
  const int writer = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(writer, 0);
  ASSERT_EQ(flock(writer, LOCK_EX | LOCK_NB), 0);
  std::string message = "no error";
  bool io_error = false;
  try {
    PackSources::from_arrays(std::vector<std::string>{"x=" + path + ":x"});
  } catch (const IoError& e) {
    io_error = true;
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  }
  flock(writer, LOCK_UN);
  ::close(writer);
  EXPECT_TRUE(io_error) << message;
  EXPECT_NE(message.find("another process has it open for writing"), std::string::npos) << message;
  EXPECT_NE(message.find("HDF5_USE_FILE_LOCKING=FALSE"), std::string::npos) << message;
  EXPECT_EQ(PackSources::from_arrays(std::vector<std::string>{"x=" + path + ":x"}).records(), 3);  // unlocked: it opens
}

// A user block (h5py's userblock_size, zeros by default) is no tar archive's end marker.
TEST(PackHdf5, AFileWithAUserBlockIsAnHdf5File) {
  TempFolder dir;
  const std::string path = dir / "user_block.h5";
  const std::vector<int16_t> values = {5, 6, 7};
  {
    const Owned create{H5Pcreate(H5P_FILE_CREATE), H5Pclose};
    H5Pset_userblock(create, 512);
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, create, H5P_DEFAULT);
    const hsize_t dims[1] = {3};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dataset = H5Dcreate2(file, "v", H5T_STD_I16LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(dataset, H5T_NATIVE_INT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(dataset);
    H5Sclose(space);
    H5Fclose(file);
  }
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{path});
  ASSERT_EQ(sources.records(), 3);
  EXPECT_EQ(sources.record(2)[0].item<int16_t>(), 7);
  EXPECT_EQ(sources.record(2)[0].untyped_storage().filename(), path) << "viewed in place, past the user block";
}

// Floats of another layout than IEEE's (another exponent bias, no implied bit, VAX order) are
// converted by the library, not packed as IEEE bits; an .npy holding an HDF5 file's bytes
// after a block of its own is an .npy.
TEST(PackHdf5, FloatsOfOtherLayoutsAreConvertedAndOtherKindsKeepTheirOwn) {
  TempFolder dir;
  const std::string path = dir / "floats.h5";
  const std::vector<float> values = {1.0f, 2.5f, -0.75f};
  const Owned biased{H5Tcopy(H5T_IEEE_F32LE), H5Tclose}, unnormalized{H5Tcopy(H5T_IEEE_F32LE), H5Tclose};
  H5Tset_ebias(biased, 100);
  H5Tset_norm(unnormalized, H5T_NORM_NONE);
  H5Writer(path)
      .write("biased", biased, H5T_NATIVE_FLOAT, {3}, values.data())
      .write("unnormalized", unnormalized, H5T_NATIVE_FLOAT, {3}, values.data())
      .write("vax", H5T_VAX_F32, H5T_NATIVE_FLOAT, {3}, values.data());
  const PackSources sources = sources_of({path});
  ASSERT_EQ(sources.schema().size(), 3u);
  for (size_t f = 0; f < 3; ++f) {
    SCOPED_TRACE(sources.schema()[f].name);
    EXPECT_EQ(sources.schema()[f].dtype, kFloat32);
    for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(sources.record(r)[f].item<float>(), values[static_cast<size_t>(r)]);
  }

  const std::string npy = dir / "holds_hdf5.npy";
  const std::string bytes = testing::file_bytes(path);
  {
    const Tensor raw = empty({static_cast<int64_t>(384 + bytes.size())}, kUInt8);
    std::memset(raw.mutable_data_ptr(), 0, 384);
    std::memcpy(static_cast<char*>(raw.mutable_data_ptr()) + 384, bytes.data(), bytes.size());
    save_npy(npy, raw);  // a 128-byte header: the HDF5 signature lands at byte 512
  }
  EXPECT_EQ(testing::file_bytes(npy).substr(512, 4), "\x89HDF");
  EXPECT_EQ(sources_of({"x=" + npy}).records(), static_cast<int64_t>(384 + bytes.size()));
}

TEST(PackHdf5, AnH5FileWithoutTheSignatureIsNamedAsSuch) {
  TempFolder dir;
  const std::string path = dir / "not.h5";
  testutil::write_file(path, testutil::Bytes(64, std::byte{1}));
  EXPECT_THROW_WITH(sources_of({"x=" + path}), FormatError, path + ": no HDF5 signature");
}

// Writes `rows` rows of dataset `name` from row `first_row`, in `memory_type`: the chunks of
// the others stay never written.
void write_rows(const std::string& path, const std::string& name, hid_t memory_type, hsize_t first_row, hsize_t rows,
                const void* data) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  std::vector<hsize_t> start(static_cast<size_t>(H5Sget_simple_extent_ndims(space)), 0), count(start.size());
  H5Sget_simple_extent_dims(space, count.data(), nullptr);
  start[0] = first_row;
  count[0] = rows;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  const hid_t memory = H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr);
  EXPECT_GE(H5Dwrite(dataset, memory_type, memory, space, H5P_DEFAULT, data), 0) << name;
  H5Sclose(memory);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
}

// The dataset's values as libhdf5 reads them, and as a pack of it holds them (bytes, C order).
std::string library_read(const std::string& path, const std::string& name, hid_t memory_type) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  const auto count = static_cast<size_t>(H5Sget_simple_extent_npoints(space));
  std::string bytes(count * H5Tget_size(memory_type), '\0');
  EXPECT_GE(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0) << name;
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  return bytes;
}
std::string packed_bytes(const std::string& spec, const std::string& out) {
  pack_dataset(out, sources_of({"x=" + spec}), PackOptions{.writer = {.overwrite = true}});
  const Tensor column = Dataset::open(out).column("x").contiguous();
  return std::string(static_cast<const char*>(column.data_ptr()), static_cast<size_t>(column.nbytes()));
}

// Chunks compressed with gzip and shuffled (h5py's compression="gzip", shuffle=True) are
// decoded by the engine on every CPU; what it reads equals what libhdf5 reads, for chunks cut
// at the dataset's edges in several dimensions, either filter alone, chunks never written
// (zeros), a chunk the writer left unfiltered (its filter mask), and datasets that keep to the
// library (fletcher32, a fill value other than zeros).
TEST(PackHdf5, GzipAndShuffleChunksAreDecodedInParallelAsTheLibraryDecodesThem) {
  TempFolder dir;
  const std::string path = dir / "chunks.h5";
  std::vector<float> floats(1000 * 37 * 5);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<float>(i % 977) * 0.25f;
  std::vector<int64_t> longs(777);
  for (size_t i = 0; i < longs.size(); ++i) longs[i] = static_cast<int64_t>(i * i) - 5000;
  std::vector<uint16_t> shorts(500 * 33);
  for (size_t i = 0; i < shorts.size(); ++i) shorts[i] = static_cast<uint16_t>(i * 31);
  std::vector<uint8_t> bytes(300 * 40);  // chunks of 1 KiB and more: smaller ones are the library's
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i % 251);
  const Owned both = chunked({64, 8, 4}, true);
  const Owned deflate_only = chunked({128}, false);
  H5Pset_deflate(deflate_only, 9);
  const Owned shuffle_only = chunked({70, 10}, false);
  H5Pset_shuffle(shuffle_only);
  const Owned bytes_both = chunked({32, 40}, true);
  const Owned checksummed = chunked({64}, true);
  H5Pset_fletcher32(checksummed);
  const Owned sevens = chunked({32, 10}, true);
  const int32_t seven = 7;
  H5Pset_fill_value(sevens, H5T_NATIVE_INT32, &seven);
  const Owned zeros = chunked({32, 10}, true);
  // Deflate twice, on bytes that do not compress: the first stream undone is longer than the
  // values.
  std::vector<uint8_t> noise(4096 * 16);
  uint64_t state = 5;
  for (uint8_t& b : noise) b = static_cast<uint8_t>((state = state * 6364136223846793005u + 1442695040888963407u) >> 56);
  const Owned twice = chunked({256, 16}, false);
  H5Pset_deflate(twice, 6);
  H5Pset_deflate(twice, 6);
  {
    H5Writer writer(path);
    writer.write("floats", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1000, 37, 5}, floats.data(), both)
        .write("longs", H5T_STD_I64LE, H5T_NATIVE_INT64, {777}, longs.data(), deflate_only)
        .write("shorts", H5T_STD_U16LE, H5T_NATIVE_UINT16, {500, 33}, shorts.data(), shuffle_only)
        .write("bytes", H5T_STD_U8LE, H5T_NATIVE_UINT8, {300, 40}, bytes.data(), bytes_both)
        .write("checksummed", H5T_STD_I64LE, H5T_NATIVE_INT64, {777}, longs.data(), checksummed)
        .write("sevens", H5T_STD_I32LE, H5T_NATIVE_INT32, {200, 10}, nullptr, sevens)
        .write("zeros", H5T_STD_I32LE, H5T_NATIVE_INT32, {200, 10}, nullptr, zeros)
        .write("twice", H5T_STD_U8LE, H5T_NATIVE_UINT8, {4096, 16}, noise.data(), twice);
  }
  // Rows 50-69 written, the other chunks never; and one chunk stored shuffled but not
  // deflated (filter mask bit 1: the pipeline's second filter, deflate, skipped).
  {
    std::vector<int32_t> rows(20 * 10);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i) + 1;
    for (const char* name : {"sevens", "zeros"}) write_rows(path, name, H5T_NATIVE_INT32, 50, 20, rows.data());
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t dataset = H5Dopen2(file, "zeros", H5P_DEFAULT);
    std::vector<int32_t> chunk(320), shuffled(320);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<int32_t>(1000 + i);
    const auto* plain = reinterpret_cast<const uint8_t*>(chunk.data());
    auto* planes = reinterpret_cast<uint8_t*>(shuffled.data());
    for (size_t i = 0; i < 320; ++i)
      for (size_t k = 0; k < 4; ++k) planes[k * 320 + i] = plain[i * 4 + k];
    const hsize_t offset[2] = {160, 0};
    EXPECT_GE(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0b10, offset, 1280, shuffled.data()), 0);
    H5Dclose(dataset);
    H5Fclose(file);
  }
  const std::vector<std::pair<std::string, hid_t>> datasets = {
      {"floats", H5T_NATIVE_FLOAT}, {"longs", H5T_NATIVE_INT64},       {"shorts", H5T_NATIVE_UINT16},
      {"bytes", H5T_NATIVE_UINT8},  {"checksummed", H5T_NATIVE_INT64}, {"sevens", H5T_NATIVE_INT32},
      {"zeros", H5T_NATIVE_INT32},  {"twice", H5T_NATIVE_UINT8}};
  for (const auto& [name, memory_type] : datasets) {
    SCOPED_TRACE(name);
    const std::string expected = library_read(path, name, memory_type);
    EXPECT_EQ(packed_bytes(path + ":" + name, dir / "out.mmt"), expected);
  }
  // The written values are there, and the chunk stored shuffled only reads as written.
  const std::string zeros_read = library_read(path, "zeros", H5T_NATIVE_INT32);
  int32_t value = 0;
  std::memcpy(&value, zeros_read.data() + (50 * 10 + 3) * 4, 4);
  EXPECT_EQ(value, 4);
  std::memcpy(&value, zeros_read.data() + (160 * 10 + 5) * 4, 4);
  EXPECT_EQ(value, 1005);
  std::memcpy(&value, library_read(path, "sevens", H5T_NATIVE_INT32).data(), 4);
  EXPECT_EQ(value, 7);
}

// read_chunks_here in slabs of a few chunks (the packer's are 32 MiB): chunks narrower than a
// row (copied into the slab), of whole rows (written in place), wider than a growable
// dimension, some never written; each equal to libhdf5's read. And which datasets it takes.
TEST(PackHdf5, ChunksReadInParallelInSmallSlabsEqualTheLibrarysRead) {
  TempFolder dir;
  const std::string path = dir / "slabs.h5";
  std::vector<float> narrow(203 * 37 * 5);
  for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = static_cast<float>(i) * 1.5f;
  std::vector<int32_t> whole(1003 * 6), wide(50 * 3);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<int32_t>(i * 7919);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<int32_t>(i) - 60;
  const Owned narrow_chunks = chunked({8, 8, 4}, true), whole_chunks = chunked({50, 6}, false);
  H5Pset_deflate(whole_chunks, 1);
  const Owned wide_chunks = chunked({16, 16}, true), plain = chunked({50, 6}, false);
  const Owned checksummed = chunked({50, 6}, true);
  H5Pset_fletcher32(checksummed);
  {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const auto create = [&](const char* name, hid_t type, std::vector<hsize_t> dims, hid_t plist, bool growable = false) {
      std::vector<hsize_t> max_dims(dims.size(), H5S_UNLIMITED);
      const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), growable ? max_dims.data() : nullptr);
      H5Dclose(H5Dcreate2(file, name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT));
      H5Sclose(space);
    };
    create("narrow", H5T_IEEE_F32LE, {203, 37, 5}, narrow_chunks);
    create("whole", H5T_STD_I32LE, {1003, 6}, whole_chunks);
    create("wide", H5T_STD_I32LE, {50, 3}, wide_chunks, /*growable=*/true);
    create("plain", H5T_STD_I32LE, {1003, 6}, plain);
    create("checksummed", H5T_STD_I32LE, {1003, 6}, checksummed);
    create("big_endian", H5T_STD_I32BE, {1003, 6}, whole_chunks);
    H5Fclose(file);
  }
  // Only some rows written: the chunks of the others never are.
  write_rows(path, "narrow", H5T_NATIVE_FLOAT, 0, 100, narrow.data());  // rows 0-99 of 203
  write_rows(path, "whole", H5T_NATIVE_INT32, 0, 501, whole.data());
  write_rows(path, "wide", H5T_NATIVE_INT32, 0, 50, wide.data());
  for (const char* name : {"plain", "checksummed", "big_endian"})
    write_rows(path, name, H5T_NATIVE_INT32, 0, 1003, whole.data());
  // The packer reads with the library's printing off (chunks never written are errors to it).
  H5E_auto2_t print = nullptr;
  void* print_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &print, &print_data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  for (const auto& [name, memory_type, here] :
       std::vector<std::tuple<std::string, hid_t, bool>>{{"narrow", H5T_NATIVE_FLOAT, true},
                                                         {"whole", H5T_NATIVE_INT32, true},
                                                         {"wide", H5T_NATIVE_INT32, true},
                                                         {"plain", H5T_NATIVE_INT32, false},
                                                         {"checksummed", H5T_NATIVE_INT32, false},
                                                         {"big_endian", H5T_NATIVE_INT32, false}}) {
    SCOPED_TRACE(name);
    const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    const hid_t space = H5Dget_space(dataset), create = H5Dget_create_plist(dataset), type = H5Dget_type(dataset);
    detail::ChunkedDataset chunked{.dataset = dataset, .create_plist = create, .file_type = type,
                                   .memory_type = memory_type, .element_bytes = 4, .file_bytes = file_bytes};
    chunked.dims.resize(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
    H5Sget_simple_extent_dims(space, chunked.dims.data(), nullptr);
    chunked.chunk.resize(chunked.dims.size());
    H5Pget_chunk(create, static_cast<int>(chunked.chunk.size()), chunked.chunk.data());
    EXPECT_EQ(detail::chunks_read_here(chunked), here);
    if (here) {
      detail::ScratchFile scratch(name, "for the test");
      detail::read_chunks_here(chunked, /*slab_bytes=*/4096, scratch, name);
      const UntypedStorage values = scratch.map(name);
      const std::string expected = library_read(path, name, memory_type);
      ASSERT_EQ(values.nbytes(), static_cast<int64_t>(expected.size()));
      EXPECT_EQ(std::memcmp(values.data(), expected.data(), expected.size()), 0);
    }
    H5Tclose(type);
    H5Pclose(create);
    H5Sclose(space);
    H5Dclose(dataset);
  }
  H5Fclose(file);
  H5Eset_auto2(H5E_DEFAULT, print, print_data);
}

// Under fill time NEVER (h5py's fill_time='never', netCDF-4's NC_NOFILL) or without a fill
// value, H5Dread leaves the values of chunks never written as its buffer held them: records
// past the first 32 MiB slab came back as copies of the slab before (the HDF5 adversary).
// They read as zeros, as decoded chunks and contiguous datasets give them.
TEST(PackHdf5, ValuesNeverWrittenReadAsZerosWhateverTheFillTime) {
  TempFolder dir;
  const std::string path = dir / "holes.h5";
  const hsize_t rows = 40000, width = 256;  // 40 MB: two slabs
  {
    H5Writer file(path);
    for (const bool never : {true, false}) {
      const Owned create = chunked({100, width}, /*gzip_and_shuffle=*/false);
      if (never) H5Pset_fill_time(create, H5D_FILL_TIME_NEVER);
      else H5Pset_fill_value(create, H5T_NATIVE_INT32, nullptr);  // no fill value
      file.write(never ? "never" : "undefined", H5T_STD_I32LE, H5T_NATIVE_INT32, {rows, width}, nullptr, create);
    }
  }
  std::vector<int32_t> written(static_cast<size_t>(33000 * width));
  for (size_t k = 0; k < written.size(); ++k) written[k] = static_cast<int32_t>(k / width + 1);
  for (const char* name : {"never", "undefined"}) write_rows(path, name, H5T_NATIVE_INT32, 0, 33000, written.data());
  const size_t row_bytes = width * sizeof(int32_t);
  for (const char* name : {"never", "undefined"}) {
    const std::string bytes = packed_bytes(path + ":" + name, dir / "holes.mmt");
    ASSERT_EQ(bytes.size(), rows * row_bytes) << name;
    EXPECT_EQ(bytes.compare(0, 33000 * row_bytes, reinterpret_cast<const char*>(written.data()), 33000 * row_bytes), 0)
        << name;
    EXPECT_TRUE(std::all_of(bytes.begin() + 33000 * row_bytes, bytes.end(), [](char c) { return c == 0; })) << name;
  }
}

// A chunk its index lost (a damaged key moves it outside the extent) would read as zeros, as
// libhdf5 reads it; the sizes of the chunks found no longer add up to what the index counts.
TEST(PackHdf5, ChunksTheIndexLostAreRefusedNotReadAsZeros) {
  TempFolder dir;
  const std::string path = dir / "lost.h5";
  std::vector<float> values(1000 * 37);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1013) + 0.5f;
  const Owned create = chunked({64, 8}, true);
  H5Writer(path).write("x", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1000, 37}, values.data(), create);
  hsize_t size = 0;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t dataset = H5Dopen2(file, "x", H5P_DEFAULT);
    const hsize_t offset[2] = {512, 0};
    ASSERT_GE(H5Dget_chunk_storage_size(dataset, offset, &size), 0);
    H5Dclose(dataset);
    H5Fclose(file);
  }
  // The chunk's key in the version 1 B-tree: its size (4 bytes), filter mask (4), then its
  // offsets (8 each, and a last 0 for the element).
  testutil::Bytes bytes = testutil::to_bytes(testing::file_bytes(path));
  testutil::Bytes key(28, std::byte{0});
  std::memcpy(key.data(), &size, 4);  // little-endian, as the file
  const uint64_t row = 512;
  std::memcpy(key.data() + 8, &row, 8);
  const auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(at, bytes.end());
  at[8 + 8 + 3] = std::byte{4};  // its column: 0 becomes 67108864
  testutil::write_file(path, bytes);
  EXPECT_THROW_WITH(sources_of({"x=" + path + ":x"}), FormatError,
                    path + ":/x: its chunks are stored in ");
  EXPECT_THROW_WITH(sources_of({"x=" + path + ":x"}), FormatError, "(a damaged index: chunks it lost would read as zeros)");
}

// A damaged deflate stream is named with its chunk (the engine's decoding, not the library's).
TEST(PackHdf5, ADamagedChunkIsNamedByItsPosition) {
  TempFolder dir;
  const std::string path = dir / "damaged.h5";
  std::vector<int32_t> values(400 * 10);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i * 2654435761u);
  const Owned create = chunked({100, 10}, true);
  H5Writer(path).write("v", H5T_STD_I32LE, H5T_NATIVE_INT32, {400, 10}, values.data(), create);
  haddr_t address = HADDR_UNDEF;
  hsize_t size = 0;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t dataset = H5Dopen2(file, "v", H5P_DEFAULT);
    const hsize_t offset[2] = {200, 0};
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(dataset, offset, &mask, &address, &size), 0);
    H5Dclose(dataset);
    H5Fclose(file);
  }
  testutil::Bytes bytes = testutil::to_bytes(testing::file_bytes(path));
  ASSERT_LT(address + size, bytes.size());
  for (hsize_t i = size / 2; i < size; ++i) bytes[address + i] ^= std::byte{0x5a};
  testutil::write_file(path, bytes);
  EXPECT_THROW_WITH(sources_of({"v=" + path + ":v"}), FormatError, path + ":/v: the chunk at [200, 0]");
}

}  // namespace
}  // namespace mmt
