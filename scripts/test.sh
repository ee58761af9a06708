#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this):
#   1. installs missing Debian packages and builds everything (scripts/setup.sh), runs ctest;
#   2. rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer and runs the suite again;
#   3. rebuilds with ThreadSanitizer and runs the concurrency tests;
#   4. builds the libFuzzer targets (clang) and replays their committed corpora, then fuzzes
#      each briefly.
# MMT_TEST_QUICK=1 stops after step 1; MMT_TEST_STAGES="release asan tsan fuzz" (the default)
# picks stages.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export MMT_QUIET=1                       # no pinned-memory fallback notice in test logs
jobs="$(nproc)"

step() { printf '\n==== %s ====\n' "$*"; }
stages=" ${MMT_TEST_STAGES:-release asan tsan fuzz} "
want() { [[ "$stages" == *" $1 "* ]]; }

if want release; then
step "release build and tests"
"$here/scripts/setup.sh" "$here/build"
ctest --test-dir "$here/build" --output-on-failure -j "$jobs" --timeout 900
[ "${MMT_TEST_QUICK:-0}" = 1 ] && exit 0
fi

if want asan; then
step "AddressSanitizer + UndefinedBehaviorSanitizer"
CMAKE_BUILD_TYPE=Debug "$here/scripts/setup.sh" "$here/build-asan" \
  -DMMT_SANITIZE=address,undefined -DMMT_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$here/build-asan" --output-on-failure -j "$jobs" --timeout 900
fi

if want tsan; then
step "ThreadSanitizer (concurrency tests)"
# -O1 -g1, as TSan's documentation suggests: reports keep their file:line stacks, and the
# build takes 0.6 of -O2 -g's time (mmt_cli_test.cc: 58 s against 161 s on 2 cores).
CMAKE_BUILD_TYPE=RelWithDebInfo "$here/scripts/setup.sh" "$here/build-tsan" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DMMT_SANITIZE=thread -DMMT_BUILD_BENCH=OFF -DMMT_BUILD_TOOLS=OFF -DMMT_BUILD_PYTHON=OFF
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir "$here/build-tsan" --output-on-failure -j "$jobs" --timeout 900 \
  -R 'Concurren|Thread|Loader|Cache|Parallel'
fi

if want fuzz; then
step "fuzz targets: replay the corpora, then fuzz briefly"
# -O1 -g, as libFuzzer's documentation builds its targets.
CC=clang CXX=clang++ CMAKE_BUILD_TYPE=RelWithDebInfo "$here/scripts/setup.sh" "$here/build-fuzz" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" -DMMT_BUILD_FUZZ=ON -DMMT_BUILD_TESTS=OFF -DMMT_BUILD_BENCH=OFF -DMMT_BUILD_TOOLS=OFF \
  -DMMT_SANITIZE=address,undefined -DMMT_WITH_CUDA=OFF -DMMT_BUILD_PYTHON=OFF
for fuzzer in "$here"/build-fuzz/*_fuzzer; do
  [ -x "$fuzzer" ] || continue
  name="$(basename "$fuzzer" _fuzzer)"
  corpus="$here/fuzz/corpus/$name"
  [ -d "$corpus" ] || continue
  echo "-- $name: replaying $(ls "$corpus" | wc -l) inputs, then ${MMT_FUZZ_SECONDS:-20}s of fuzzing"
  scratch="$(mktemp -d)"
  "$fuzzer" -runs=0 "$corpus" 2>&1 | tail -1
  "$fuzzer" -max_total_time="${MMT_FUZZ_SECONDS:-20}" -timeout=10 -rss_limit_mb=2048 \
    "$scratch" "$corpus" 2>&1 | tail -1
  rm -rf "$scratch"
done
fi
step "all test stages passed"
