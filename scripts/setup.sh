#!/usr/bin/env bash
# Installs what mmtensor needs from Debian 12's packages, then configures and builds.
# Idempotent: packages already present are not touched, and an existing build folder is reused.
#   scripts/setup.sh [BUILD_DIR] [extra cmake args...]
# MMT_BUILD_TARGETS="mmt ..." builds only those targets (the main job needs only mmt).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$here/build}"; shift || true

packages=(build-essential cmake ninja-build pkg-config
          libboost-dev liblz4-dev libzstd-dev libxxhash-dev zlib1g-dev
          libsnappy-dev libbrotli-dev   # Parquet inputs: snappy (pyarrow's default) and brotli pages
          libssl-dev                    # MDS shards' SHA, MD5 and BLAKE2 digests (libcrypto)
          libhdf5-dev                   # HDF5 inputs
          nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
          clang libclang-rt-14-dev dataset-fashion-mnist
          python3-numpy   # the .npy/.npz interop tests check against numpy itself
          python3-numba   # the Python transform test compiles a numba @cfunc, as users do
          python3-dev pybind11-dev libdlpack-dev)  # the Python module
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# nvcc is often installed outside PATH (/usr/local/cuda); CMake finds it through CUDACXX.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

jobs="$(nproc)"
cmake -S "$here" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" "$@" >/dev/null
targets=()
for t in ${MMT_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
