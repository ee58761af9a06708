// The HDF5 C API peer: reads the files h5py wrote in prepare.py (datasets "images" and
// "labels", chunked as stated there) with hyperslab selections, one H5Dread per record for
// scattered indices and one per batch for a sequential epoch, into the caller's buffer. The
// chunk cache is raised to mmtensor's decoded-chunk budget (256 MiB, w0 = 1), as HDF5's
// documentation advises when chunks are re-read; the default (1 MiB) would decode a chunk
// per record.
//   hdf5_peer DIR REPS OUT.jsonl
// Built by scripts/bench.sh with h5c++ (libhdf5-dev); see peer_common.h for the protocol.
#include <hdf5.h>

#include <memory>
#include <string>
#include <vector>

#include "peer_common.h"

namespace {

using namespace mmt::peers;

constexpr size_t kChunkCacheBytes = size_t{256} << 20;
constexpr size_t kChunkCacheSlots = 100003;  // a prime well above the chunks in the cache

struct H5File {
  hid_t file = -1, access = -1, images = -1, labels = -1;
  explicit H5File(const std::string& path) {
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) throw std::runtime_error("H5Fopen failed: " + path);
    access = H5Pcreate(H5P_DATASET_ACCESS);
    H5Pset_chunk_cache(access, kChunkCacheSlots, kChunkCacheBytes, 1.0);
    images = H5Dopen2(file, "images", access);
    labels = H5Dopen2(file, "labels", access);
    if (images < 0 || labels < 0) throw std::runtime_error(path + ": datasets images/labels missing");
  }
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File() {
    H5Dclose(images);
    H5Dclose(labels);
    H5Pclose(access);
    H5Fclose(file);
  }
};

// Reads records [first, first + count) of `dataset` into `dst`.
void read_records(hid_t dataset, hid_t type, int64_t first, int64_t count, void* dst) {
  hid_t file_space = H5Dget_space(dataset);
  int rank = H5Sget_simple_extent_ndims(file_space);
  std::vector<hsize_t> dims(rank), start(rank, 0);
  H5Sget_simple_extent_dims(file_space, dims.data(), nullptr);
  start[0] = static_cast<hsize_t>(first);
  dims[0] = static_cast<hsize_t>(count);
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, dims.data(), nullptr);
  hid_t mem_space = H5Screate_simple(rank, dims.data(), nullptr);
  herr_t rc = H5Dread(dataset, type, mem_space, file_space, H5P_DEFAULT, dst);
  H5Sclose(mem_space);
  H5Sclose(file_space);
  if (rc < 0) throw std::runtime_error("H5Dread failed at record " + std::to_string(first));
}

void run_file(const std::string& dir, const std::string& workload, const std::string& file,
              const std::string& contender, const std::string& config, int reps, FILE* out) {
  const std::string path = dir + "/" + workload + "/" + file;
  int64_t records = 0, record_bytes = 1;
  {
    H5File h5(path);
    hid_t space = H5Dget_space(h5.images);
    std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    H5Sclose(space);
    records = static_cast<int64_t>(dims[0]);
    for (size_t d = 1; d < dims.size(); ++d) record_bytes *= static_cast<int64_t>(dims[d]);
  }
  // The open figure and every read share this open: file, dataset access list, both datasets.
  auto open = [&] { return std::make_unique<H5File>(path); };
  measure_open(Figure{workload, contender, "open", "C++", config}, {path}, open, out);
  for (const char* op : {"single", "batch64", "batch256", "seq_epoch", "random_epoch", "quasi_epoch",
                         "cold_seq_epoch", "cold_batch256"}) {
    if (std::string(op) == "quasi_epoch" && workload != "fmnist") continue;
    const Rows rows = rows_for(dir, workload, op, records);
    std::vector<unsigned char> image_out(rows.batch * record_bytes);
    std::vector<int64_t> label_out(rows.batch);
    const bool sequential = std::string(op).find("seq_epoch") != std::string::npos;
    auto read = [&](const H5File& h5) {
      for (int64_t r = 0; r < rows.rows; ++r) {
        const int64_t* idx = rows.row(r);
        if (sequential) {
          read_records(h5.images, H5T_NATIVE_UINT8, idx[0], rows.batch, image_out.data());
          read_records(h5.labels, H5T_NATIVE_INT64, idx[0], rows.batch, label_out.data());
          continue;
        }
        for (int64_t k = 0; k < rows.batch; ++k) {
          read_records(h5.images, H5T_NATIVE_UINT8, idx[k], 1, image_out.data() + k * record_bytes);
          read_records(h5.labels, H5T_NATIVE_INT64, idx[k], 1, &label_out[k]);
        }
      }
    };
    Figure f{workload, contender, op, "C++", config};
    f.records = static_cast<double>(rows.total());
    f.bytes = static_cast<double>(rows.total() * (record_bytes + 8));
    measure(f, {path}, reps, open, read, out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hdf5_peer DIR REPS OUT.jsonl\n");
    return 2;
  }
  try {
    const std::string dir = argv[1];
    const int reps = std::stoi(argv[2]);
    FILE* out = std::fopen(argv[3], "w");
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[3]);
    const std::string cache = ", chunk cache 256 MiB";
    run_file(dir, "fmnist", "data.h5", "HDF5 C", "h5py-written, chunks of 1024 records, uncompressed" + cache, reps, out);
    run_file(dir, "fmnist", "data_gzip.h5", "HDF5 C gzip", "h5py-written, chunks of 1024 records, gzip 4" + cache, reps, out);
    run_file(dir, "imagenet", "data.h5", "HDF5 C", "h5py-written, one record per chunk, uncompressed" + cache, reps, out);
    std::fclose(out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hdf5_peer: %s\n", e.what());
    return 1;
  }
}
