#!/bin/bash
# Parquet packing against the disk's fsynced sequential write, in the same minute (two rounds).
# Needs the files of bench/parquet/gen.mjs in /tmp/parquet-bench and a Release build in build/.
#   bash bench/parquet/pack_bench.sh
set -euo pipefail
mmt="$(cd "$(dirname "$0")/../.." && pwd)/build/mmt"
for run in 1 2; do
  dd if=/dev/zero of=/tmp/dd.out bs=4M count=100 conv=fsync 2>&1 | tail -1 | sed 's/^/dd 400MB: /'
  rm -f /tmp/dd.out
  for f in images_snappy tokens_zstd small_rows tokens_pw_v2; do
    rm -f "/tmp/pqb-$f.mmt"
    /usr/bin/time -f "$f: mmt pack %e s, %M KB peak" "$mmt" pack "/tmp/pqb-$f.mmt" "/tmp/parquet-bench/$f.parquet" \
      > "/tmp/pqb-$f.out" 2> "/tmp/pqb-$f.time"
    tail -1 "/tmp/pqb-$f.time"
    grep -o "bytes in [0-9.]* [MG]B" "/tmp/pqb-$f.out"
  done
done
rm -f /tmp/pqb-*.mmt
