#!/usr/bin/env bash
# test.sh - set up, build and run the whole test suite (what CI runs).
#   scripts/test.sh            everything
#   scripts/test.sh -R REGEX   only matching ctest tests (after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh
ctest --test-dir "${BUILD:-build}" --output-on-failure -j"$(nproc)" "$@"
