#!/usr/bin/env bash
# THE one command for the side-by-side benchmarks (issue 6): installs the peers, builds
# Release, prepares the data, runs mmtensor and its peers on the same records, and rewrites
# bench/RESULTS.md's Peers section and bench/peers.png.
#
#   scripts/bench.sh                    # full run (~2 GB ImageNet-shaped set)
#   MMT_BENCH_QUICK=1 scripts/bench.sh  # short development run
# Environment: MMT_BENCH_DIR (scratch folder, default /tmp/mmtensor-bench),
#   MMT_BENCH_IMAGENET_BYTES (default 2e9), MMT_BENCH_TOKEN_DOCS (default 100000),
#   MMT_BENCH_REPS (runs per figure; default 3; quick: 2 for C++, 1 for Python),
#   MMT_BENCH_BUILD (build folder, default build-peers), MMT_BENCH_KEEP=1 keeps the data.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MMT_BENCH_DIR:-/tmp/mmtensor-bench}"
build="${MMT_BENCH_BUILD:-$here/build-peers}"
py=/usr/bin/python3
if [ -n "${MMT_BENCH_QUICK:-}" ]; then
  imagenet_bytes="${MMT_BENCH_IMAGENET_BYTES:-2e8}"; docs="${MMT_BENCH_TOKEN_DOCS:-10000}"
  cpp_reps="${MMT_BENCH_REPS:-2}"; py_reps="${MMT_BENCH_REPS:-1}"; quick=(--quick)
else
  imagenet_bytes="${MMT_BENCH_IMAGENET_BYTES:-2e9}"; docs="${MMT_BENCH_TOKEN_DOCS:-100000}"
  cpp_reps="${MMT_BENCH_REPS:-3}"; py_reps="${MMT_BENCH_REPS:-3}"; quick=()
fi
step() { echo "== bench: $* ($(date +%T))"; }

step "setup"
"$here/scripts/setup-bench.sh"

step "build (Release) in $build"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target mmtensor_bench -j "$(nproc)"
mkdir -p "$build/peers"
g++ -O2 -std=c++20 -Wall -o "$build/peers/pread_peer" "$here/bench/peers/pread_peer.cc"
# h5c++ leaves its object file in the current folder: run it in the build folder.
(cd "$build/peers" && h5c++ -O2 -std=c++20 -o hdf5_peer "$here/bench/peers/hdf5_peer.cc")

step "prepare data in $dir"
rm -rf "$dir"
mkdir -p "$dir/results"
$py "$here/bench/peers/prepare.py" --dir "$dir" --imagenet-bytes "$imagenet_bytes" --token-docs "$docs" "${quick[@]}"
results="$dir/results"

step "mmtensor packing"
MMT_PEER_DIR="$dir" MMT_PEER_PHASE=pack "$build/mmtensor_bench" --benchmark_filter='^Peer/' \
  --benchmark_out="$results/mmtensor_pack.json" --benchmark_out_format=json

step "disk sequential speed"
disk_mib=2048; [ -z "${MMT_BENCH_QUICK:-}" ] || disk_mib=256
"$build/peers/pread_peer" disk "$dir" "$((disk_mib << 20))" 3 "$results/disk.jsonl"

step "mmtensor reads and the memcpy / raw codec references"
MMT_PEER_DIR="$dir" "$build/mmtensor_bench" --benchmark_filter='^Peer/' \
  --benchmark_repetitions="$cpp_reps" --benchmark_report_aggregates_only=true \
  --benchmark_out="$results/mmtensor_read.json" --benchmark_out_format=json

step "C/C++ peers: pread, HDF5 C API"
"$build/peers/pread_peer" reads "$dir" "$cpp_reps" "$results/pread.jsonl"
"$build/peers/hdf5_peer" "$dir" "$cpp_reps" "$results/hdf5.jsonl"

step "Python peers: numpy memmap, torch.from_file, h5py, zarr"
$py "$here/bench/peers/python_peers.py" --dir "$dir" --reps "$py_reps" --out "$results/python.jsonl"

step "GPU"
rm -f "$results/gpu.json"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  $py "$here/bench/peers/gpu_peers.py" "$build" "$dir" "$results/gpu.json" || echo "bench: GPU part failed; see above"
else
  echo "no GPU on this machine: the GPU table says so"
fi

step "report"
$py "$here/bench/peers/report.py" --dir "$dir" --results-md "$here/bench/RESULTS.md" --png "$here/bench/peers.png"
[ -n "${MMT_BENCH_KEEP:-}" ] || rm -rf "$dir"
