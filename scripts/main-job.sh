#!/usr/bin/env bash
# The main job (README): on a fresh Debian 12 machine, install what is missing, build, pack
# Fashion-MNIST's 60,000 training images and labels with each codec, show what was built,
# check random samples against the source files, and measure reading it back; then the same
# from Python.
#   scripts/main-job.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$here/build}"

# Packages (dataset-fashion-mnist included) and the build of the mmt command and the Python
# module alone.
MMT_BUILD_TARGETS="mmt _mmtensor" "$here/scripts/setup.sh" "$build_dir"
mmt="$build_dir/mmt"
src=/usr/share/datasets/fashion-mnist
images="$src/train-images-idx3-ubyte.gz"
labels="$src/train-labels-idx1-ubyte.gz"
inputs=(images="$images" labels="$labels")
out_dir="$build_dir/main-job"
mkdir -p "$out_dir"

echo "== sources"
ls -l "$images" "$labels"

for codec in none lz4 zstd; do
  file="$out_dir/fashion-mnist-train-$codec.mmt"
  echo
  echo "== pack with $codec"
  "$mmt" pack "$file" "${inputs[@]}" --codec "$codec" --force
  "$mmt" info "$file"
  echo "== check 1000 random records of $file against the source files"
  "$mmt" verify "$file" --against "${inputs[@]}" --samples 1000 --seed "$RANDOM"
done

echo
echo "== sizes"
printf '%-40s %12s\n' "file" "bytes"
for f in "$images" "$labels" "$out_dir"/fashion-mnist-train-*.mmt; do
  printf '%-40s %12d\n' "$(basename "$f")" "$(stat -c %s "$f")"
done

echo
echo "== one sample, as PyTorch prints it"
"$mmt" get "$out_dir/fashion-mnist-train-lz4.mmt" 0 --field labels

# The loader: whole epochs through mmt::Loader (random order, cpu batches of 256), beside
# random access, batch gather and the memcpy reference measured in the same run.
echo
for codec in none lz4 zstd; do
  echo "== read back: $codec"
  "$mmt" bench "$out_dir/fashion-mnist-train-$codec.mmt" --batch 256 --threads "$(nproc)" --seconds 1
done

# The same from Python: pack with mmtensor.DatasetWriter, check samples against the source
# files, run loader epochs checking every batch (python/examples/fashion_mnist.py).
echo
echo "== from Python"
# The interpreter the module was built for (CMake's choice; Debian's python3 by default).
python="$(sed -n 's/^_\{0,1\}Python_EXECUTABLE:[A-Z]*=//p' "$build_dir/CMakeCache.txt" | head -1)"
PYTHONPATH="$build_dir/python" MMT_QUIET=1 "${python:-python3}" "$here/python/examples/fashion_mnist.py" --out "$out_dir"
