// Giving up a load of pack inputs (load_cancel.h): with a LoadCancelScope that says stop, the
// loaders that take long (gzip IDX, deflated .npz members, HDF5 datasets through the engine's
// decoder or the library's, anything written to a scratch file, TFRecord scans) throw PackCancelled at their
// first step; with one that says go on, they load as without it. Python's pack() relies on it
// for a Ctrl-C while it reads its inputs.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

#include "importer_test_util.h"
#include "load_cancel.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "test_util.h"
#include "tfrecord_test_util.h"

namespace mmt {
namespace {

using testutil::Bytes;
using testutil::TempFolder;

// A chunked, gzip-compressed int32 dataset [rows, 4]; stored big-endian (so read by the
// library, converted) or little-endian (so decoded by the engine).
void write_hdf5(const std::string& path, hsize_t rows, hid_t file_type) {
  std::vector<int32_t> values(rows * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t create = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk[2] = {64, 4}, dims[2] = {rows, 4};
  H5Pset_chunk(create, 2, chunk);
  H5Pset_deflate(create, 1);
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t dataset = H5Dcreate2(file, "v", file_type, space, H5P_DEFAULT, create, H5P_DEFAULT);
  EXPECT_GE(H5Dwrite(dataset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Dclose(dataset);
  H5Sclose(space);
  H5Pclose(create);
  H5Fclose(file);
}

TEST(LoadCancel, LongLoadsGiveUpAtTheirFirstStepWhenTheScopeSaysStop) {
  TempFolder dir;
  // An IDX file of uint8 [4096, 64, 64] (16 MiB of values), gzip-compressed.
  const uint8_t header[] = {0, 0, 0x08, 3, 0, 0, 0x10, 0, 0, 0, 0, 64, 0, 0, 0, 64};
  Bytes idx(reinterpret_cast<const std::byte*>(header), reinterpret_cast<const std::byte*>(header) + sizeof header);
  idx.resize(idx.size() + (size_t{16} << 20), std::byte{3});
  testutil::write_file(dir / "images-idx3-ubyte.gz", testutil::gzip_bytes(idx));
  // An .npz of one deflated member of 16 MiB.
  const Bytes npy = testutil::npy_file("<i4", false, "(4194304,)", Bytes(size_t{16} << 20, std::byte{1}));
  testutil::write_file(dir / "arrays.npz", testutil::zip_archive({{"a.npy", npy, /*deflate=*/true}}));
  write_hdf5(dir / "engine.h5", 100000, H5T_STD_I32LE);
  write_hdf5(dir / "library.h5", 100000, H5T_STD_I32BE);
  std::vector<std::string> examples;
  for (int64_t i = 0; i < 10000; ++i) examples.push_back(testutil::example_bytes({{"label", std::vector<int64_t>{i}}}));
  testutil::write_file(dir / "train.tfrecord", testutil::tfrecord_file(examples));

  const std::vector<std::vector<std::string>> inputs = {{"x=" + (dir / "images-idx3-ubyte.gz")},
                                                        {dir / "arrays.npz"},
                                                        {"v=" + (dir / "engine.h5") + ":v"},
                                                        {"v=" + (dir / "library.h5") + ":v"},
                                                        {dir / "train.tfrecord"}};
  const auto sources_of = [](const std::vector<std::string>& specs) {
    return specs.front().ends_with(".tfrecord") ? PackSources::from_tfrecord(specs, {}) : PackSources::from_arrays(specs);
  };
  for (const std::vector<std::string>& specs : inputs) {
    SCOPED_TRACE(specs.front());
    int asked = 0;
    {
      const detail::LoadCancelScope stop([&] { return ++asked > 0; });
      EXPECT_THROW_WITH(
          {
            const PackSources sources = sources_of(specs);
            // An .npz member is inflated as its records are read.
            for (int64_t r = 0; r < sources.records(); r += 4096) (void)sources.record(r);
          },
          PackCancelled, "reading the inputs was interrupted");
    }
    EXPECT_EQ(asked, 1);
    const detail::LoadCancelScope go_on([] { return false; });
    const PackSources sources = sources_of(specs);
    EXPECT_GT(sources.records(), 0);
    for (int64_t r = 0; r < sources.records(); r += 4096) (void)sources.record(r);
  }
}

}  // namespace
}  // namespace mmt
