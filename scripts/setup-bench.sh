#!/usr/bin/env bash
# Installs what the peer benchmarks need beyond scripts/setup.sh, from Debian's packages:
# the Python peers (numpy, h5py, zarr, numcodecs, torch, matplotlib for the plot), the HDF5 C
# library for the C++ HDF5 peer, and Fashion-MNIST. Idempotent: present packages are skipped.
set -euo pipefail
packages=(python3 python3-numpy python3-h5py python3-zarr python3-numcodecs python3-torch
          python3-matplotlib libhdf5-dev dataset-fashion-mnist build-essential cmake ninja-build
          libbenchmark-dev liblz4-dev libzstd-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup-bench: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's modules live with Debian's interpreter; a python3 earlier on PATH (pyenv, venv)
# would not see them, so the benchmarks name /usr/bin/python3.
/usr/bin/python3 -c "import numpy, h5py, zarr, numcodecs, torch, matplotlib" \
  || { echo "setup-bench: Debian's python3 cannot import the peers" >&2; exit 1; }
