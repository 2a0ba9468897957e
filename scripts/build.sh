#!/usr/bin/env bash
# build.sh - configure and build into ${BUILD:-build} (warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFA_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
