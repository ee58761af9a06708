#!/usr/bin/env bash
# The GPU checks of issue 5, for a machine with an NVIDIA GPU that has no package registry
# (the project's lent H100). Two steps:
#
#   bash scripts/gpu-check.sh prepare       # here: Release build + the shared libraries it
#                                           # needs beyond glibc, in build-rel/carried-libs
#   bash scripts/gpu-check.sh run OUT_DIR   # there, in a copy of the tree with build-rel:
#                                           # GPU tests, BM_LoaderToDevice, the PyTorch peer
#
# `run` sets MMT_REQUIRE_CUDA=1, so a GPU this build cannot use (a driver older than its
# CUDA runtime, say) fails loudly instead of skipping; its figures go to OUT_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
  prepare)
    cmake -S . -B build-rel -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    ninja -C build-rel mmtensor_tests mmtensor_bench _mmtensor
    rm -rf build-rel/carried-libs
    mkdir -p build-rel/carried-libs
    # Everything the binaries load except the C/C++ runtime, which any Debian 12-era system
    # (glibc 2.34+, GCC 12's libstdc++) has; copied under the name the loader asks for.
    for binary in build-rel/mmtensor_tests build-rel/mmtensor_bench build-rel/python/mmtensor/_mmtensor*.so; do
      ldd "$binary" | awk '$3 ~ /^\// {print $1, $3}'
    done | sort -u | while read -r soname path; do
      case "$soname" in
        libc.so* | libm.so* | libstdc++* | libgcc_s* | ld-linux* | libpthread* | libdl* | librt*) ;;
        *) cp -L "$path" "build-rel/carried-libs/$soname" ;;
      esac
    done
    # The Python version the module is for (CMake's interpreter), for `run` to compare.
    python="$(sed -n 's/^_\{0,1\}Python_EXECUTABLE:[A-Z]*=//p' build-rel/CMakeCache.txt | head -1)"
    "$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' > build-rel/python/built-for-python
    ls build-rel/carried-libs
    du -sh build-rel
    ;;
  run)
    out="${2:?usage: gpu-check.sh run OUT_DIR}"
    mkdir -p "$out"
    export LD_LIBRARY_PATH="$PWD/build-rel/carried-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MMT_REQUIRE_CUDA=1
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv \
      | tee "$out/gpu.txt"
    status=0
    build-rel/mmtensor_tests --gtest_filter='LoaderGpuTest.*:Storage.Cuda*:Storage.Pinned*:*Device*:ForkSafety.*' \
      2>&1 | tee "$out/gpu-tests.txt" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) ' || status=1
    grep -q '^\[  FAILED  \]' "$out/gpu-tests.txt" && status=1
    build-rel/mmtensor_bench --benchmark_filter=LoaderToDevice --benchmark_out="$out/loader-to-device.json" \
      --benchmark_out_format=json 2>&1 | tee "$out/loader-to-device.txt" || status=1
    # The Python module's CUDA batches through torch.from_dlpack, where that python is the
    # version the module was built for (CPython's ABI differs between minor versions).
    wanted="$(cat build-rel/python/built-for-python)"
    if [ "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$wanted" ]; then
      PYTHONPATH="$PWD/build-rel/python:$PWD/tests/python" python3 -m unittest -v \
        test_loader.LoaderTest.test_cuda_batches_reach_torch_without_a_copy 2>&1 \
        | tee "$out/python-gpu.txt" || status=1
    else
      echo "python GPU test skipped: the module is built for Python $wanted" | tee "$out/python-gpu.txt"
    fi
    # The peer at the same worker counts as BM_LoaderToDevice (processes instead of threads).
    for workers in 4 8 14; do
      python3 bench/peer_dataloader.py --workers "$workers" | tee -a "$out/peer-dataloader.jsonl" || status=1
    done
    exit "$status"
    ;;
  *)
    sed -n '2,11p' "$0"
    exit 2
    ;;
esac
