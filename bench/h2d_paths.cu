// A probe, not part of the build: the ways to move randomly indexed records of a memory-mapped
// file to a GPU, each against pinned cudaMemcpyAsync of one batch's bytes in the same run. It
// chose LoaderOptions::pin_mapping's design (bench/RESULTS.md, "pin_mapping"):
//   - a host gather into pinned memory, then one DMA (the loader's way without pin_mapping);
//   - cudaMemcpyBatchAsync from the plain (pageable) mapping;
//   - cudaHostRegister of the whole mapping (read-only), then cudaMemcpyAsync a record,
//     cudaMemcpyBatchAsync, or a kernel reading the mapping over PCIe;
//   - registering each record of a batch on its own (what a file larger than memory would need).
// Build here, run on the GPU machine (the file is written there, 1.2 GB by default):
//   nvcc -O2 -std=c++17 -arch=sm_90 -o h2d_paths bench/h2d_paths.cu
//   ./h2d_paths /tmp/h2d.bin [records=8192] [record_bytes=150528]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); return false; } } while (0)

using clk = std::chrono::steady_clock;
static double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

static size_t N = 8192, R = 150528, B = 256, BATCHES = 48;
static const unsigned char* map_ = nullptr;
static unsigned char* dev = nullptr;
static unsigned char* pinned = nullptr;
static cudaStream_t stream;
static std::vector<std::vector<size_t>> idx;
static double ref_gbs = 0;

static bool check_batch(const std::vector<size_t>& ix, const char* what) {
  std::vector<unsigned char> back(B * R);
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(back.data(), dev, B * R, cudaMemcpyDeviceToHost));
  for (size_t j = 0; j < B; ++j)
    if (std::memcmp(back.data() + j * R, map_ + ix[j] * R, R) != 0) { std::printf("%s: MISMATCH at batch row %zu\n", what, j); return false; }
  return true;
}

static void report(const char* what, double seconds) {
  double gbs = BATCHES * B * R / seconds / 1e9;
  std::printf("%-58s %7.2f GB/s  %.2f of pinned memcpy\n", what, gbs, ref_gbs > 0 ? gbs / ref_gbs : 0.0);
  std::fflush(stdout);
}

static bool reference() {
  CK(cudaMallocHost(&pinned, B * R));
  std::memset(pinned, 1, B * R);
  for (int round = 0; round < 3; ++round) {
    CK(cudaStreamSynchronize(stream));
    auto t0 = clk::now();
    for (size_t b = 0; b < BATCHES; ++b) CK(cudaMemcpyAsync(dev, pinned, B * R, cudaMemcpyHostToDevice, stream));
    CK(cudaStreamSynchronize(stream));
    double s = secs(t0, clk::now());
    if (round == 2) { ref_gbs = BATCHES * B * R / s / 1e9; report("pinned cudaMemcpyAsync, one batch's bytes", s); }
  }
  return true;
}

static bool per_record(const char* what) {
  for (int round = 0; round < 2; ++round) {
    CK(cudaStreamSynchronize(stream));
    auto t0 = clk::now();
    for (size_t b = 0; b < BATCHES; ++b)
      for (size_t j = 0; j < B; ++j) CK(cudaMemcpyAsync(dev + j * R, map_ + idx[b][j] * R, R, cudaMemcpyHostToDevice, stream));
    CK(cudaStreamSynchronize(stream));
    if (round == 1) report(what, secs(t0, clk::now()));
  }
  return check_batch(idx[BATCHES - 1], what);
}

static bool batch_async(const char* what, cudaMemcpySrcAccessOrder order, unsigned flags) {
  std::vector<void*> dsts(B);
  std::vector<const void*> srcs(B);
  std::vector<size_t> sizes(B, R);
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = order;
  attr.flags = flags;
  size_t attr_idx = 0;
  for (int round = 0; round < 2; ++round) {
    CK(cudaStreamSynchronize(stream));
    auto t0 = clk::now();
    for (size_t b = 0; b < BATCHES; ++b) {
      for (size_t j = 0; j < B; ++j) { dsts[j] = dev + j * R; srcs[j] = map_ + idx[b][j] * R; }
      CK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), B, &attr, &attr_idx, 1, stream));
    }
    CK(cudaStreamSynchronize(stream));
    if (round == 1) report(what, secs(t0, clk::now()));
  }
  return check_batch(idx[BATCHES - 1], what);
}

__global__ void gather_kernel(const uint4* __restrict__ src, const size_t* __restrict__ rows, uint4* __restrict__ dst, size_t row_vec, int blocks_per_row) {
  size_t row = blockIdx.x / blocks_per_row;
  size_t part = blockIdx.x % blocks_per_row;
  const uint4* s = src + rows[row] * row_vec;
  uint4* d = dst + row * row_vec;
  size_t per = (row_vec + blocks_per_row - 1) / blocks_per_row;
  size_t begin = part * per, end = begin + per < row_vec ? begin + per : row_vec;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) d[i] = s[i];
}

static bool kernel_gather(const char* what, const unsigned char* device_view, int blocks_per_row, int threads) {
  size_t* rows_dev;
  CK(cudaMalloc(&rows_dev, BATCHES * B * sizeof(size_t)));
  std::vector<size_t> all;
  for (auto& v : idx) all.insert(all.end(), v.begin(), v.end());
  CK(cudaMemcpy(rows_dev, all.data(), all.size() * sizeof(size_t), cudaMemcpyHostToDevice));
  for (int round = 0; round < 2; ++round) {
    CK(cudaStreamSynchronize(stream));
    auto t0 = clk::now();
    for (size_t b = 0; b < BATCHES; ++b)
      gather_kernel<<<B * blocks_per_row, threads, 0, stream>>>((const uint4*)device_view, rows_dev + b * B, (uint4*)dev, R / 16, blocks_per_row);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(stream));
    if (round == 1) report(what, secs(t0, clk::now()));
  }
  bool ok = check_batch(idx[BATCHES - 1], what);
  cudaFree(rows_dev);
  return ok;
}

static bool host_gather_then_copy(const char* what, int threads) {
  // The engine's way in miniature: threads gather into pinned memory, then one DMA.
  for (int round = 0; round < 2; ++round) {
    CK(cudaStreamSynchronize(stream));
    auto t0 = clk::now();
    for (size_t b = 0; b < BATCHES; ++b) {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { for (size_t j = t; j < B; j += threads) std::memcpy(pinned + j * R, map_ + idx[b][j] * R, R); });
      for (auto& th : pool) th.join();
      CK(cudaMemcpyAsync(dev, pinned, B * R, cudaMemcpyHostToDevice, stream));
      CK(cudaStreamSynchronize(stream));
    }
    if (round == 1) report(what, secs(t0, clk::now()));
  }
  return true;
}

int main(int argc, char** argv) {
  if (argc < 2) { std::printf("usage: h2d_paths FILE [records] [record_bytes]\n"); return 2; }
  if (argc > 2) N = std::strtoull(argv[2], nullptr, 10);
  if (argc > 3) R = std::strtoull(argv[3], nullptr, 10);
  size_t bytes = N * R;
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) { perror("open"); return 1; }
  {
    std::vector<unsigned char> block(R);
    std::mt19937_64 rng(1);
    for (size_t i = 0; i < N; ++i) {
      for (size_t k = 0; k < R; k += 8) { uint64_t v = rng(); std::memcpy(block.data() + k, &v, std::min<size_t>(8, R - k)); }
      if (write(fd, block.data(), R) != (ssize_t)R) { perror("write"); return 1; }
    }
  }
  close(fd);
  fd = open(argv[1], O_RDONLY);
  void* m = mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 1; }
  map_ = (const unsigned char*)m;
  volatile unsigned long sum = 0;
  for (size_t i = 0; i < bytes; i += 4096) sum += map_[i];
  std::mt19937_64 rng(7);
  idx.assign(BATCHES, std::vector<size_t>(B));
  for (auto& v : idx) for (auto& x : v) x = rng() % N;
  int ro = 0, hostptr = 0, pageable = 0;
  cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0);
  cudaDeviceGetAttribute(&hostptr, cudaDevAttrCanUseHostPointerForRegisteredMem, 0);
  cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0);
  std::printf("records %zu x %zu B (%.2f GB file), batch %zu, %zu batches; HostRegisterReadOnly %d, host pointer for registered %d, pageable access %d\n",
              N, R, bytes / 1e9, B, BATCHES, ro, hostptr, pageable);
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess || cudaMalloc(&dev, B * R) != cudaSuccess) { std::printf("no device\n"); return 1; }
  if (!reference()) return 1;
  int threads_max = std::thread::hardware_concurrency();
  for (int t : {4, 8, 14}) { if (t > threads_max) break; char what[80]; std::snprintf(what, sizeof what, "host gather (%d threads) into pinned, then DMA (serial)", t); host_gather_then_copy(what, t); }
  batch_async("pageable mapping: cudaMemcpyBatchAsync, order Any", cudaMemcpySrcAccessOrderAny, 0);
  batch_async("pageable mapping: cudaMemcpyBatchAsync, order Stream", cudaMemcpySrcAccessOrderStream, 0);
  auto t0 = clk::now();
  cudaError_t reg = cudaHostRegister((void*)map_, bytes, cudaHostRegisterReadOnly | cudaHostRegisterMapped);
  double reg_s = secs(t0, clk::now());
  std::printf("cudaHostRegister(ReadOnly|Mapped) of the file mapping: %s in %.3f s (%.2f GB/s)\n", cudaGetErrorString(reg), reg_s, bytes / reg_s / 1e9);
  if (reg != cudaSuccess) {
    cudaGetLastError();
    reg = cudaHostRegister((void*)map_, bytes, cudaHostRegisterReadOnly);
    std::printf("cudaHostRegister(ReadOnly): %s\n", cudaGetErrorString(reg));
    cudaGetLastError();
  }
  if (reg == cudaSuccess) {
    per_record("registered mapping: cudaMemcpyAsync per record");
    batch_async("registered mapping: cudaMemcpyBatchAsync, order Stream", cudaMemcpySrcAccessOrderStream, 0);
    batch_async("registered mapping: cudaMemcpyBatchAsync, order Any", cudaMemcpySrcAccessOrderAny, 0);
    void* device_view = nullptr;
    if (cudaHostGetDevicePointer(&device_view, (void*)map_, 0) == cudaSuccess) {
      for (int bpr : {1, 4, 16}) for (int th : {256, 1024}) {
        char what[80]; std::snprintf(what, sizeof what, "registered mapping: GPU kernel gather, %d blocks/row x %d", bpr, th);
        kernel_gather(what, (const unsigned char*)device_view, bpr, th);
      }
    } else { std::printf("cudaHostGetDevicePointer failed\n"); cudaGetLastError(); }
    t0 = clk::now();
    cudaHostUnregister((void*)map_);
    std::printf("cudaHostUnregister: %.3f s\n", secs(t0, clk::now()));
    // Registering one batch's records at a time, as a loader over a file larger than memory would.
    t0 = clk::now();
    size_t ok = 0;
    for (size_t j = 0; j < B; ++j) {
      const unsigned char* p = map_ + idx[0][j] * R;
      uintptr_t a = (uintptr_t)p & ~uintptr_t(4095), e = ((uintptr_t)p + R + 4095) & ~uintptr_t(4095);
      if (cudaHostRegister((void*)a, e - a, cudaHostRegisterReadOnly) == cudaSuccess) { ++ok; cudaHostUnregister((void*)a); } else cudaGetLastError();
    }
    std::printf("register+unregister each of a batch's %zu records: %zu ok, %.3f ms a batch\n", B, ok, secs(t0, clk::now()) * 1e3);
  }
  munmap(m, bytes);
  unlink(argv[1]);
  return 0;
}
