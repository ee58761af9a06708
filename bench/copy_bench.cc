// The strided-copy routine against memcpy of the same bytes (issue: the foundation).
//   - contiguous -> contiguous must run within 10% of memcpy (ratio >= 0.9);
//   - NCHW -> channels_last of [32, 3, 224, 224] uint8 and float32;
//   - a transposed float32 matrix -> contiguous.
// Each benchmark reports `vs_memcpy`: memcpy time / copy time, measured alternately.
#include <benchmark/benchmark.h>

#include "mmtensor/tensor.h"
#include "ratio.h"

namespace {

using namespace mmt;

void run_copy(benchmark::State& state, const Tensor& dst, const Tensor& src) {
  for (auto _ : state) {
    dst.copy_(src);
    benchmark::ClobberMemory();
  }
  const int64_t bytes = src.nbytes();
  state.SetBytesProcessed(state.iterations() * bytes);
  bench::MemcpyReference memcpy_ref(static_cast<size_t>(bytes));
  state.counters["vs_memcpy"] = bench::median_speed_ratio([&] { dst.copy_(src); }, memcpy_ref);
}

void BM_CopyContiguous(benchmark::State& state) {
  Tensor src = full({32, 3, 224, 224}, 1.0, kFloat32);
  Tensor dst = empty({32, 3, 224, 224}, kFloat32);
  run_copy(state, dst, src);
}

void BM_CopyNchwToChannelsLast(benchmark::State& state) {
  const ScalarType dtype = state.range(0) == 1 ? kUInt8 : kFloat32;
  Tensor src = full({32, 3, 224, 224}, 1.0, dtype);
  Tensor dst = empty({32, 3, 224, 224}, dtype, kCPU, MemoryFormat::ChannelsLast);
  state.SetLabel(std::string(to_string(dtype)));
  run_copy(state, dst, src);
}

void BM_CopyTransposedMatrix(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor src = full({n, n}, 1.0, kFloat32).t();
  Tensor dst = empty({n, n}, kFloat32);
  run_copy(state, dst, src);
}

}  // namespace

BENCHMARK(BM_CopyContiguous)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CopyNchwToChannelsLast)->Arg(1)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CopyTransposedMatrix)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
