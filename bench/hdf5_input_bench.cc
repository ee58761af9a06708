// HDF5 inputs compressed with gzip (issue 4): what `mmt pack` pays to read a chunked, gzip +
// shuffle dataset (h5py's compression="gzip", shuffle=True) into its scratch file, against
// libhdf5 reading the same dataset into memory with one H5Dread, timed alternately in one
// run. The engine decodes the chunks itself on every CPU the process may use (hdf5_chunks.h);
// the library decodes on the calling thread. Counters: vs_h5dread (the library's time over
// the engine's: above 1 is faster), engine_MBps, library_MBps (decoded bytes per second).
// The data: Fashion-MNIST's training images four times over (188 MB) when installed, else
// smooth synthetic images of the same size, at gzip level 4, in chunks of 1,000 records (240
// chunks of 784 KB) and of 10 (24,000 chunks of 7.8 KB: the engine finds each chunk through
// the library's index, once).
#include <benchmark/benchmark.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "mmtensor/idx_io.h"
#include "mmtensor/packer.h"
#include "ratio.h"

namespace {

using namespace mmt;
namespace fs = std::filesystem;

constexpr hsize_t kRecordBytes = 784;

struct GzipHdf5File {
  std::string dir;
  std::string path;
  hsize_t records = 0;

  explicit GzipHdf5File(hsize_t chunk_records) {
    const char* env = std::getenv("MMT_BENCH_DIR");
    dir = (env && *env ? fs::path(env) : fs::temp_directory_path()) / ("mmt-hdf5-bench-" + std::to_string(::getpid()) + "-" + std::to_string(chunk_records));
    fs::create_directories(dir);
    path = dir + "/images.h5";
    const std::string fm = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
    std::vector<uint8_t> values;
    if (fs::exists(fm)) {
      const Tensor images = load_idx(fm).contiguous();
      const auto* bytes = static_cast<const uint8_t*>(images.data_ptr());
      for (int copy = 0; copy < 4; ++copy) values.insert(values.end(), bytes, bytes + images.nbytes());
    } else {
      values.resize(240000 * kRecordBytes);
      std::mt19937 rng(7);
      for (size_t i = 0; i < values.size(); ++i) {
        const int x = static_cast<int>(i % 28), y = static_cast<int>(i / 28 % 28);
        values[i] = (x - 14) * (x - 14) + (y - 14) * (y - 14) < 100 ? static_cast<uint8_t>(180 + rng() % 40) : 0;
      }
    }
    records = values.size() / kRecordBytes;
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t chunk[2] = {chunk_records, kRecordBytes}, dims[2] = {records, kRecordBytes};
    H5Pset_chunk(create, 2, chunk);
    H5Pset_shuffle(create);
    H5Pset_deflate(create, 4);
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t dataset = H5Dcreate2(file, "images", H5T_STD_U8LE, space, H5P_DEFAULT, create, H5P_DEFAULT);
    H5Dwrite(dataset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(dataset);
    H5Sclose(space);
    H5Pclose(create);
    H5Fclose(file);
  }
  ~GzipHdf5File() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

void BM_Hdf5GzipInputVsLibrary(benchmark::State& state) {
  const GzipHdf5File input(static_cast<hsize_t>(state.range(0)));
  const size_t bytes = input.records * kRecordBytes;
  std::vector<uint8_t> into(bytes);
  const std::vector<std::string> specs = {"images=" + input.path + ":images"};
  const auto engine = [&] {
    const PackSources sources = PackSources::from_arrays(specs);
    benchmark::DoNotOptimize(sources.records());
  };
  const auto library = [&] {
    const hid_t file = H5Fopen(input.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t dataset = H5Dopen2(file, "images", H5P_DEFAULT);
    H5Dread(dataset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, into.data());
    H5Dclose(dataset);
    H5Fclose(file);
    benchmark::ClobberMemory();
  };
  for (auto _ : state) {
    const double engine_seconds = mmt::bench::seconds_of(engine), library_seconds = mmt::bench::seconds_of(library);
    state.counters["engine_MBps"] = static_cast<double>(bytes) / engine_seconds / 1e6;
    state.counters["library_MBps"] = static_cast<double>(bytes) / library_seconds / 1e6;
    state.counters["vs_h5dread"] = mmt::bench::median_speed_ratio(engine, library, 5);
  }
}

}  // namespace

BENCHMARK(BM_Hdf5GzipInputVsLibrary)->Arg(1000)->Arg(10)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
