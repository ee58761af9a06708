// The plain-pread peer: records read with pread(2) into the caller's buffer straight from the
// .npy sources (record i of an [N, ...] array sits at data_offset + i * record_bytes), and
// token documents from the flat-array-plus-offsets pair. Also measures the disk's sequential
// write and read speed (the physical limit for cold reads) on the scratch folder's disk.
//   pread_peer reads DIR REPS OUT.jsonl
//   pread_peer disk DIR BYTES REPS OUT.jsonl
// Built by scripts/bench.sh with g++ -O2; see peer_common.h for the protocol.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "peer_common.h"

namespace {

using namespace mmt::peers;

void pread_exact(int fd, void* dst, int64_t bytes, int64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, static_cast<size_t>(bytes), offset);
    if (n <= 0) throw std::runtime_error("pread failed or hit end of file at offset " + std::to_string(offset));
    p += n;
    bytes -= n;
    offset += n;
  }
}

int open_or_throw(const std::string& path, int flags = O_RDONLY) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  return fd;
}

// A read-only descriptor closed with its owner: the pread peer's "open dataset".
class Fd {
 public:
  explicit Fd(const std::string& path) : fd_(open_or_throw(path)) {}
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct FixedFiles {
  Fd images, labels;
  FixedFiles(const std::string& images_path, const std::string& labels_path)
      : images(images_path), labels(labels_path) {}
};

// The offsets are read whole at open, as index files of such datasets are.
struct TokenFiles {
  Fd tokens, offsets_fd;
  std::vector<int64_t> offsets;
  TokenFiles(const std::string& tokens_path, const std::string& offsets_path, const NpyArray& offsets_header)
      : tokens(tokens_path), offsets_fd(offsets_path), offsets(offsets_header.shape[0]) {
    pread_exact(offsets_fd.get(), offsets.data(), static_cast<int64_t>(offsets.size()) * 8,
                offsets_header.data_offset);
  }
};

void fixed_reads(const std::string& dir, const std::string& workload, int reps, FILE* out) {
  const std::string images_path = dir + "/" + workload + "/images.npy";
  const std::string labels_path = dir + "/" + workload + "/labels.npy";
  const NpyArray images = read_npy_header(images_path);
  const NpyArray labels = read_npy_header(labels_path);
  int64_t record_bytes = 1;
  for (size_t d = 1; d < images.shape.size(); ++d) record_bytes *= images.shape[d];
  const std::string config = "pread(2) per record from the .npy sources (one per batch when sequential)";
  auto open = [&] { return std::make_unique<FixedFiles>(images_path, labels_path); };
  measure_open(Figure{workload, "pread", "open", "C++", config}, {images_path, labels_path}, open, out);
  for (const char* op : {"single", "batch64", "batch256", "seq_epoch", "random_epoch", "quasi_epoch",
                         "cold_seq_epoch", "cold_batch256"}) {
    if (std::string(op) == "quasi_epoch" && workload != "fmnist") continue;
    const Rows rows = rows_for(dir, workload, op, images.shape[0]);
    std::vector<char> image_out(rows.batch * record_bytes);
    std::vector<int64_t> label_out(rows.batch);
    const bool sequential = std::string(op).find("seq_epoch") != std::string::npos;
    auto read = [&](const FixedFiles& files) {
      const int image_fd = files.images.get(), label_fd = files.labels.get();
      for (int64_t r = 0; r < rows.rows; ++r) {
        const int64_t* idx = rows.row(r);
        if (sequential) {  // contiguous records: one read per field
          pread_exact(image_fd, image_out.data(), rows.batch * record_bytes,
                      images.data_offset + idx[0] * record_bytes);
          pread_exact(label_fd, label_out.data(), rows.batch * 8, labels.data_offset + idx[0] * 8);
          continue;
        }
        for (int64_t k = 0; k < rows.batch; ++k) {
          pread_exact(image_fd, image_out.data() + k * record_bytes, record_bytes,
                      images.data_offset + idx[k] * record_bytes);
          pread_exact(label_fd, &label_out[k], 8, labels.data_offset + idx[k] * 8);
        }
      }
    };
    Figure f{workload, "pread", op, "C++", config};
    f.records = static_cast<double>(rows.total());
    f.bytes = static_cast<double>(rows.total() * (record_bytes + 8));
    measure(f, {images_path, labels_path}, reps, open, read, out);
  }
}

void token_reads(const std::string& dir, int reps, FILE* out) {
  const std::string tokens_path = dir + "/tokens/tokens.npy";
  const std::string offsets_path = dir + "/tokens/offsets.npy";
  const NpyArray tokens = read_npy_header(tokens_path);
  const NpyArray offsets_header = read_npy_header(offsets_path);
  const std::vector<int64_t> offsets_for_sizes = read_npy_int64(offsets_path);
  const int64_t docs = offsets_header.shape[0] - 1;
  const std::string config = "offsets read whole at open; pread(2) per document, one per batch when sequential";
  auto open = [&] { return std::make_unique<TokenFiles>(tokens_path, offsets_path, offsets_header); };
  measure_open(Figure{"tokens", "pread", "open", "C++", config}, {tokens_path, offsets_path}, open, out);
  for (const char* op : {"single", "batch64", "batch256", "seq_epoch", "cold_seq_epoch"}) {
    const Rows rows = rows_for(dir, "tokens", op, docs);
    std::vector<int32_t> values(rows.batch * 4096);
    std::vector<int64_t> packed_offsets(rows.batch + 1);
    const bool sequential = std::string(op).find("seq_epoch") != std::string::npos;
    auto read = [&](const TokenFiles& files) {
      const int tokens_fd = files.tokens.get();
      const std::vector<int64_t>& offsets = files.offsets;
      for (int64_t r = 0; r < rows.rows; ++r) {
        const int64_t* idx = rows.row(r);
        if (sequential) {  // consecutive documents are one run of the flat array
          const int64_t first = offsets[idx[0]], last = offsets[idx[rows.batch - 1] + 1];
          pread_exact(tokens_fd, values.data(), (last - first) * 4, tokens.data_offset + first * 4);
          continue;
        }
        int64_t filled = 0;
        for (int64_t k = 0; k < rows.batch; ++k) {
          const int64_t n = offsets[idx[k] + 1] - offsets[idx[k]];
          pread_exact(tokens_fd, values.data() + filled, n * 4, tokens.data_offset + offsets[idx[k]] * 4);
          filled += n;
          packed_offsets[k + 1] = filled;
        }
      }
    };
    Figure f{"tokens", "pread", op, "C++", config};
    f.records = static_cast<double>(rows.total());
    for (int64_t i = 0; i < rows.total(); ++i)
      f.bytes += static_cast<double>(offsets_for_sizes[rows.indices[i] + 1] - offsets_for_sizes[rows.indices[i]]) * 4;
    measure(f, {tokens_path, offsets_path}, reps, open, read, out);
  }
}

// Sequential write (1 MiB writes, then fsync) and read (1 MiB preads after eviction).
void disk_speed(const std::string& dir, int64_t bytes, int reps, FILE* out) {
  const std::string path = dir + "/disk_speed.tmp";
  constexpr int64_t kBlock = 1 << 20;
  std::vector<char> block(kBlock);
  for (int64_t i = 0; i < kBlock; ++i) block[i] = static_cast<char>(i * 131 + 7);  // not sparse-able
  bytes = bytes / kBlock * kBlock;
  std::vector<double> write_s, read_s;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    int fd = open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC);
    for (int64_t done = 0; done < bytes; done += kBlock)
      if (::write(fd, block.data(), kBlock) != kBlock) throw std::runtime_error("write failed on " + path);
    ::fsync(fd);
    ::close(fd);
    write_s.push_back(seconds_since(t0));
    evict_from_page_cache(path);
    t0 = std::chrono::steady_clock::now();
    fd = open_or_throw(path);
    for (int64_t done = 0; done < bytes; done += kBlock) pread_exact(fd, block.data(), kBlock, done);
    ::close(fd);
    read_s.push_back(seconds_since(t0));
    ::unlink(path.c_str());
  }
  for (auto* s : {&write_s, &read_s}) std::sort(s->begin(), s->end());
  for (auto [op, s] : {std::pair{"disk_write", &write_s}, std::pair{"disk_read", &read_s}}) {
    std::fprintf(out,
                 "{\"workload\": \"disk\", \"contender\": \"disk\", \"op\": \"%s\", \"lang\": \"C++\", "
                 "\"seconds\": %.9g, \"items\": 0, \"bytes\": %lld, \"reps\": %d, \"config\": "
                 "\"1 MiB sequential %s; write includes fsync, read follows posix_fadvise(DONTNEED)\"}\n",
                 op, (*s)[s->size() / 2], static_cast<long long>(bytes), reps,
                 std::string(op) == "disk_write" ? "write(2)" : "pread(2)");
    std::fprintf(stderr, "  %s: %.2f GB/s\n", op, bytes / (*s)[s->size() / 2] / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "reads" && argc == 5) {
      FILE* out = std::fopen(argv[4], "w");
      if (!out) throw std::runtime_error(std::string("cannot write ") + argv[4]);
      for (const char* workload : {"fmnist", "imagenet"}) fixed_reads(argv[2], workload, std::stoi(argv[3]), out);
      token_reads(argv[2], std::stoi(argv[3]), out);
      std::fclose(out);
      return 0;
    }
    if (mode == "disk" && argc == 6) {
      FILE* out = std::fopen(argv[5], "w");
      if (!out) throw std::runtime_error(std::string("cannot write ") + argv[5]);
      disk_speed(argv[2], std::stoll(argv[3]), std::stoi(argv[4]), out);
      std::fclose(out);
      return 0;
    }
    std::fprintf(stderr, "usage: pread_peer reads DIR REPS OUT.jsonl | pread_peer disk DIR BYTES REPS OUT.jsonl\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pread_peer: %s\n", e.what());
    return 1;
  }
}
