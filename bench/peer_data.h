// What mmtensor's side of the peer benchmarks (bench/peers/README in RESULTS.md) shares: where
// the prepared data lives and the index files every contender reads. The benchmarks register
// themselves only when MMT_PEER_DIR names a folder made by bench/peers/prepare.py, so a plain
// `mmtensor_bench` run is not slowed by them; MMT_PEER_PHASE=pack registers the packing
// benchmarks (which write mmtensor's files), anything else the reading ones.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

#include "mmtensor/numpy_io.h"
#include "mmtensor/tensor.h"

namespace mmt::bench::peers {

inline std::string peer_dir() {
  const char* dir = std::getenv("MMT_PEER_DIR");
  return dir ? dir : "";
}

inline bool pack_phase() {
  const char* phase = std::getenv("MMT_PEER_PHASE");
  return phase && std::string(phase) == "pack";
}

inline bool peer_file_exists(const std::string& relative) {
  return std::filesystem::exists(peer_dir() + "/" + relative);
}

// Rows of record indices: [rows, batch] for batch files, [1, n] for flat ones.
struct IndexRows {
  Tensor indices;  // int64, contiguous (mapped from the .npy)
  int64_t rows = 0;
  int64_t batch = 0;

  std::span<const int64_t> row(int64_t r) const {
    return {indices.data_ptr<int64_t>() + r * batch, static_cast<size_t>(batch)};
  }
  int64_t total() const { return rows * batch; }
};

// indices/<workload>_<op>.npy; a 1-d file is cut into rows of `batch` (the last may be short,
// so total() rounds down: every contender reads exactly those rows).
inline IndexRows load_index_rows(const std::string& workload, const std::string& op,
                                 int64_t batch = 0) {
  IndexRows r;
  r.indices = load_npy(peer_dir() + "/indices/" + workload + "_" + op + ".npy").contiguous();
  if (r.indices.dim() == 2) {
    r.rows = r.indices.size(0);
    r.batch = r.indices.size(1);
  } else {
    r.batch = batch > 0 ? batch : 1;
    r.rows = r.indices.size(0) / r.batch;
  }
  return r;
}

}  // namespace mmt::bench::peers
