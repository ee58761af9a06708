// What the standalone C/C++ peers (pread_peer, hdf5_peer) share with each other and with
// mmtensor's side (bench/peer_read_bench.cc): the same index files, the same op names and
// row rules, the same timing protocol, one JSON line per figure. Header-only, no mmtensor:
// these programs link only their peer's library.
//
// Protocol, the same for every contender (python_peers.py follows it too), so that no figure
// carries a cost the others do not:
// - open: page cache warm, one untimed open (a library's one-time start-up), then
//   kOpenRepeats timed opens, each handle closed outside the timer; the figure is the median.
// - warm ops: files read through (page cache warm), opened ONCE outside the timer, one untimed
//   pass of the op (code, buffers and the contender's own caches reach steady state), then
//   `reps` timed passes on that same open handle; the figure is the median. Open is not in it.
// - cold_* ops: per run, opened outside the timer, then the files' pages evicted
//   (page_cache.h), then the reads timed. What the open holds in process memory (a chunk
//   table, HDF5's metadata cache, an offsets array) stays, as it does in a training job; the
//   pages of the file are gone except those the open itself mapped.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "page_cache.h"

namespace mmt::peers {

constexpr int64_t kEpochBatch = 256;

// The header of an .npy file (format 1.0 or 2.0, C order): enough to find and check its data.
struct NpyArray {
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // bytes
  std::string descr;
};

inline NpyArray read_npy_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  char magic[8];
  in.read(magic, 8);
  if (!in || std::string(magic + 1, 5) != "NUMPY") throw std::runtime_error(path + ": not an .npy file");
  uint32_t header_bytes = 0;
  int prefix = magic[6] == 1 ? 10 : 12;
  unsigned char len[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(len), prefix - 8);
  header_bytes = len[0] | (len[1] << 8) | (prefix == 12 ? (len[2] << 16) | (uint32_t(len[3]) << 24) : 0);
  std::string header(header_bytes, '\0');
  in.read(header.data(), header_bytes);
  if (!in) throw std::runtime_error(path + ": truncated .npy header");
  NpyArray a;
  a.data_offset = prefix + header_bytes;
  auto field = [&](const std::string& key) {
    size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) throw std::runtime_error(path + ": .npy header lacks " + key);
    return header.substr(header.find(':', k) + 1);
  };
  std::string d = field("descr");
  a.descr = d.substr(d.find('\'') + 1, d.find('\'', d.find('\'') + 1) - d.find('\'') - 1);
  if (field("fortran_order").find("False") > 2) throw std::runtime_error(path + ": Fortran order");
  std::string s = field("shape");
  s = s.substr(s.find('(') + 1, s.find(')') - s.find('(') - 1);
  for (size_t p = 0; p < s.size();) {
    size_t q = s.find(',', p);
    std::string item = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
    if (item.find_first_of("0123456789") != std::string::npos) a.shape.push_back(std::stoll(item));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return a;
}

inline std::vector<int64_t> read_npy_int64(const std::string& path) {
  NpyArray a = read_npy_header(path);
  if (a.descr != "<i8") throw std::runtime_error(path + ": expected <i8, found " + a.descr);
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  std::vector<int64_t> values(n);
  std::ifstream in(path, std::ios::binary);
  in.seekg(a.data_offset);
  in.read(reinterpret_cast<char*>(values.data()), n * 8);
  if (!in) throw std::runtime_error(path + ": truncated .npy data");
  return values;
}

// The record indices of one op, as rows; the same rules as bench/peer_data.h.
struct Rows {
  std::vector<int64_t> indices;
  int64_t rows = 0;
  int64_t batch = 0;
  const int64_t* row(int64_t r) const { return indices.data() + r * batch; }
  int64_t total() const { return rows * batch; }
};

inline bool is_cold(const std::string& op) { return op.rfind("cold_", 0) == 0; }

inline Rows rows_for(const std::string& dir, const std::string& workload, const std::string& op,
                     int64_t records) {
  Rows r;
  if (op == "seq_epoch" || op == "cold_seq_epoch") {
    r.indices.resize(records);
    std::iota(r.indices.begin(), r.indices.end(), 0);
    r.batch = kEpochBatch;
  } else {
    std::string file = op == "cold_batch256" ? "batch256" : op;
    std::string path = dir + "/indices/" + workload + "_" + file + ".npy";
    NpyArray header = read_npy_header(path);
    r.indices = read_npy_int64(path);
    r.batch = header.shape.size() == 2 ? header.shape[1] : (op == "single" ? 1 : kEpochBatch);
  }
  r.rows = static_cast<int64_t>(r.indices.size()) / r.batch;
  return r;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Figure {
  std::string workload, contender, op, lang = "C++", config;
  double records = 0, bytes = 0;
};

// Opens timed for one open figure: enough for a stable median of a sub-millisecond event.
constexpr int kOpenRepeats = 21;

inline double median_of(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Median time of `open()` (which returns a handle that closes itself) with the page cache as
// the caller left it; the first open is untimed and each handle is closed outside the timer.
template <class Open>
double median_open_seconds(const Open& open, int repeats = kOpenRepeats) {
  open();
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto handle = open();
    seconds.push_back(seconds_since(t0));
  }
  return median_of(seconds);
}

inline void print_figure(const Figure& f, double seconds, int reps, FILE* out) {
  std::fprintf(out,
               "{\"workload\": \"%s\", \"contender\": \"%s\", \"op\": \"%s\", \"lang\": \"%s\", "
               "\"seconds\": %.9g, \"items\": %.0f, \"bytes\": %.0f, \"reps\": %d, \"config\": \"%s\"}\n",
               f.workload.c_str(), f.contender.c_str(), f.op.c_str(), f.lang.c_str(), seconds,
               f.records, f.bytes, reps, f.config.c_str());
  std::fflush(out);
  std::fprintf(stderr, "  %s/%s/%s: %.6f s\n", f.workload.c_str(), f.contender.c_str(), f.op.c_str(), seconds);
}

// The open figure of a contender: `open()` returns a handle (a std::unique_ptr of an object
// that closes its files when destroyed) holding everything its reads need.
template <class Open>
void measure_open(Figure f, const std::vector<std::string>& files, const Open& open, FILE* out) {
  for (const std::string& file : files) warm_page_cache(file);
  f.op = "open";
  f.records = 1;
  f.bytes = 0;
  print_figure(f, median_open_seconds(open), kOpenRepeats, out);
}

// One read figure by the protocol above: `read(*handle)` reads every row of the op once.
template <class Open, class Read>
void measure(const Figure& f, const std::vector<std::string>& files, int reps, const Open& open,
             const Read& read, FILE* out) {
  std::vector<double> seconds;
  if (is_cold(f.op)) {
    for (int i = 0; i < reps; ++i) {
      auto handle = open();
      for (const std::string& file : files) evict_from_page_cache(file);
      auto t0 = std::chrono::steady_clock::now();
      read(*handle);
      seconds.push_back(seconds_since(t0));
    }
  } else {
    for (const std::string& file : files) warm_page_cache(file);
    auto handle = open();
    read(*handle);  // the untimed warm-up pass
    for (int i = 0; i < reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      read(*handle);
      seconds.push_back(seconds_since(t0));
    }
  }
  print_figure(f, median_of(seconds), reps, out);
}

}  // namespace mmt::peers
