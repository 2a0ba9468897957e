#!/usr/bin/env bash
# test.sh - set up, build and run the whole test suite (what CI runs).
#
#   scripts/test.sh            everything: the suite (with the Docker image,
#                              where a daemon runs or can be started), the core
#                              under ASan+UBSan and TSan, a build without the
#                              CUDA toolkit's headers, and a benchmark smoke run
#   scripts/test.sh -R REGEX   only matching tests of the main build
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# A test without a time limit of its own (the unit tests) fails after this
# many seconds instead of holding the run.
timeout=300
step() { printf '\n== %s\n' "$*"; }

step "setup"
scripts/setup.sh --test --bench --docker
step "build"
scripts/build.sh -DFA_TESTS=ON
step "tests"
ctest --test-dir "${BUILD:-build}" --output-on-failure --timeout "$timeout" -j"$jobs" "$@"
[[ $# -eq 0 ]] || exit 0

# The core object library and its unit tests under the sanitizers, each in
# a build directory of its own (the preloaded library is not built there).
for san in address thread; do
    step "core and unit tests under -fsanitize=$san"
    BUILD=build-$san scripts/build.sh -DFA_SANITIZE=$san -DCMAKE_BUILD_TYPE=Debug
    ctest --test-dir "build-$san" --output-on-failure --timeout "$timeout" -j"$jobs" -L 'unit|fuzz'
done

# A user's machine has no CUDA toolkit: the library must build without it.
step "library without the CUDA toolkit's headers"
BUILD=build-nocuda scripts/build.sh -DFA_CUDA_INCLUDE=FA_CUDA_INCLUDE-NOTFOUND -DFA_TESTS=OFF

# Benchmarks are not tests: this only proves the suite runs (every
# workload, under plain tcmalloc and forgealloc).
step "benchmark smoke run (numbers not judged)"
scripts/bench.sh --quick --reps 1 --no-warmup --allocators tcmalloc forgealloc --json "${BUILD:-build}/bench-smoke.json"
