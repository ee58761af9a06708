#!/usr/bin/env bash
# The GPU checks of issue 5, for a lent machine with an NVIDIA GPU and no package registry
# (the device tool's H100/H200). Two steps:
#
#   bash scripts/gpu-check.sh prepare [BUILD_DIR] [PYTHON...]
#       here: builds BUILD_DIR (default build-rel; Release), and the Python module for each
#       further PYTHON given (the machine's Python may not be this one's: CPython's ABI differs
#       between minor versions), then stages what the run needs in build-gpu/ (binaries,
#       modules, the shared libraries they load beyond the C/C++ runtime): a few MB, under
#       the device tool's 64 MiB.
#   bash scripts/gpu-check.sh run OUT_DIR [STAGE...]
#       there, in a copy of the tree with build-gpu carried. Stages (default: all, in order):
#       gpu-tests bench peer python all-tests sanitizer cpu-bench. Each stage has its own time
#       limit, so a hang costs one stage; a table of results is printed last.
#
# `run` sets MMT_REQUIRE_CUDA=1, so a GPU this build cannot use (a driver older than its
# CUDA runtime, say) fails loudly instead of skipping.
set -uo pipefail
# This script's absolute path: the stages run it again after the cd below.
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$self")/.."

stage_dir=build-gpu

prepare() {
  set -e
  local build="${1:-build-rel}"
  shift || true
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$build/CMakeCache.txt"; then
    echo "gpu-check: $build is not a Release build; its timings would not be the engine's" >&2
    exit 1
  fi
  ninja -C "$build" mmtensor_tests mmtensor_bench mmt _mmtensor
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir/python/mmtensor" "$stage_dir/carried-libs"
  cp "$build/mmtensor_tests" "$build/mmtensor_bench" "$build/mmt" "$stage_dir/"
  cp python/mmtensor/*.py "$build"/python/mmtensor/_mmtensor*.so "$stage_dir/python/mmtensor/"
  for python in "$@"; do
    local version
    version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    cmake -S . -B "build-py$version" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMMT_BUILD_TESTS=OFF \
      -DMMT_BUILD_BENCH=OFF -DMMT_BUILD_TOOLS=OFF -DMMT_BUILD_PYTHON=ON -DPython_EXECUTABLE="$python" >/dev/null
    ninja -C "build-py$version" _mmtensor
    cp "build-py$version"/python/mmtensor/_mmtensor*.so "$stage_dir/python/mmtensor/"
  done
  # The tests find the mmt command at the build folder's absolute path, compiled in.
  (cd "$build" && pwd) > "$stage_dir/binary-dir"
  # Everything the binaries load except the C/C++ runtime, which any Debian 12-era system
  # (glibc 2.34+, GCC 12's libstdc++) has; copied under the name the loader asks for.
  for binary in "$stage_dir"/mmtensor_tests "$stage_dir"/mmtensor_bench "$stage_dir"/mmt \
                "$stage_dir"/python/mmtensor/_mmtensor*.so; do
    ldd "$binary" | awk '$3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r soname path; do
    case "$soname" in
      libc.so* | libm.so* | libstdc++* | libgcc_s* | ld-linux* | libpthread* | libdl* | librt*) ;;
      *) cp -L "$path" "$stage_dir/carried-libs/$soname" ;;
    esac
  done
  ls "$stage_dir" "$stage_dir/python/mmtensor" "$stage_dir/carried-libs"
  du -sh "$stage_dir"
}

# run_stage NAME SECONDS FUNCTION [ARG...]: runs FUNCTION (in a fresh shell of this script)
# under a time limit, its output in $out/NAME.txt, and records NAME's outcome for the table.
# The device tool brings back 8 files: summary.txt and 7 stages' files, no more.
results=()
run_stage() {
  local name="$1" seconds="$2"
  shift 2
  local start=$SECONDS status
  echo "=== $name (limit ${seconds}s) $(date -u +%H:%M:%S)" | tee -a "$out/summary.txt"
  timeout -k 10 "$seconds" bash "$self" stage "$@" >>"$out/$name.txt" 2>&1
  status=$?
  local verdict=passed
  [ "$status" -eq 124 ] || [ "$status" -eq 137 ] && verdict="TIMED OUT"
  [ "$status" -ne 0 ] && [ "$verdict" = passed ] && verdict="FAILED (exit $status)"
  results+=("$(printf '%-12s %-20s %4ds' "$name" "$verdict" $((SECONDS - start)))")
  echo "=== $name: $verdict in $((SECONDS - start))s" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.txt"
}

gpu_tests() {
  "$stage_dir/mmtensor_tests" \
    --gtest_filter='LoaderGpuTest.*:Storage.Cuda*:Storage.Pinned*:*Device*:ForkSafety.*:Fork*.*'
}

loader_to_device() {
  "$stage_dir/mmtensor_bench" --benchmark_filter=LoaderToDevice --benchmark_counters_tabular=true
}

peer() {
  # PyTorch's DataLoader(pin_memory=True) over np.memmap, at the worker counts of
  # BM_LoaderToDevice (processes there, threads here), and mmtensor's Python Loader on the
  # same records when the module loads in this Python (gathered, then with pin_mapping).
  local with_mmtensor=""
  python3 -c 'import mmtensor' 2>/dev/null && with_mmtensor=--with-mmtensor
  mkdir -p /tmp/mmtensor-peer
  local workers status=0
  for workers in 4 8 14; do
    python3 -W ignore bench/peer_dataloader.py --workers "$workers" --epochs 3 --dir /tmp/mmtensor-peer \
      $with_mmtensor || status=1
  done
  # mmtensor's Loader with pin_mapping: the records go from the locked file mapping to the GPU.
  if [ -n "$with_mmtensor" ]; then
    for workers in 2 14; do
      python3 -W ignore bench/peer_dataloader.py --workers "$workers" --epochs 3 --dir /tmp/mmtensor-peer \
        --with-mmtensor --pin-mapping || status=1
    done
  fi
  return "$status"
}

python_tests() {
  python3 -c 'import sys, numpy, torch; print(sys.version, "numpy", numpy.__version__, "torch", torch.__version__)'
  python3 -m unittest discover -s tests/python -v
}

sanitizer() {
  # Device-side API misuse and leaked device allocations, on the GPU loader tests.
  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
    "$stage_dir/mmtensor_tests" --gtest_filter='LoaderGpuTest.*:Storage.Cuda*'
}

all_tests() {
  # The whole suite with a device present (pinned staging, device checks in host tests), in
  # shards of the machine's cores. The Python suite ran in its own stage. A shard that runs
  # past its limit names the test it was in.
  local shards=8 shard status=0
  for ((shard = 0; shard < shards; ++shard)); do
    (GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard timeout -k 5 "$1" "$stage_dir/mmtensor_tests" \
       >"/tmp/shard-$shard.txt" 2>&1
     echo "shard $shard: exit $?" >>"/tmp/shard-$shard.txt") &
  done
  wait
  for ((shard = 0; shard < shards; ++shard)); do
    local log="/tmp/shard-$shard.txt"
    grep -E '^\[  (FAILED|PASSED|SKIPPED) |^\[ +OK .*\([0-9]{4,} ms\)|tests ran|Failure|^shard ' "$log"
    if grep -qE '^shard [0-9]+: exit (124|137)' "$log"; then
      echo "shard $shard ran past its limit in: $(grep '^\[ RUN' "$log" | tail -1)"
      tail -n 30 "$log"
    fi
    grep -qE '^shard [0-9]+: exit 0$' "$log" || status=1
  done
  return "$status"
}

cpu_bench() {
  # The host-side targets set for 2-core machines, on a machine whose cores are not shared.
  "$stage_dir/mmtensor_bench" --benchmark_counters_tabular=true \
    --benchmark_filter='BM_GetBatch/|BM_GetBatchStreamingStores|BM_LoaderVsGetBatch|BM_PackUncompressedVsDisk|BM_PackCompressedVsCodec|BM_PoolCpuBesideTwoThreadLoops'
}

run() {
  out="${1:?usage: gpu-check.sh run OUT_DIR [STAGE...]}"
  shift
  local stages=("$@")
  [ ${#stages[@]} -eq 0 ] && stages=(gpu-tests bench peer python all-tests sanitizer cpu-bench)
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$PWD/$stage_dir/carried-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$PWD/$stage_dir/python:$PWD/tests/python${PYTHONPATH:+:$PYTHONPATH}"
  export MMT_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1 PATH="$PATH:/usr/local/cuda/bin"
  # The CLI tests run `mmt` from the build folder compiled into them.
  local binary_dir
  binary_dir="$(cat "$stage_dir/binary-dir")"
  if [ ! -x "$binary_dir/mmt" ]; then
    mkdir -p "$binary_dir" && ln -sf "$PWD/$stage_dir/mmt" "$binary_dir/mmt"
  fi
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max,clocks.sm,clocks.mem --format=csv
    nproc
    grep -m1 'model name' /proc/cpuinfo
  } 2>&1 | tee -a "$out/summary.txt"
  local stage
  for stage in "${stages[@]}"; do
    case "$stage" in
      gpu-tests) run_stage gpu-tests 90 gpu_tests ;;
      bench) run_stage bench 90 loader_to_device ;;
      peer) run_stage peer 150 peer ;;
      python) run_stage python 90 python_tests ;;
      all-tests) run_stage all-tests 150 all_tests 120 ;;
      sanitizer) run_stage sanitizer 90 sanitizer ;;
      cpu-bench) run_stage cpu-bench 90 cpu_bench ;;
      *) echo "unknown stage $stage" >&2; return 2 ;;
    esac
  done
  printf '%s\n' "${results[@]}" | tee -a "$out/summary.txt"
  printf '%s\n' "${results[@]}" | grep -qv ' passed ' && return 1
  return 0
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  stage) "$2" "${@:3}" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
