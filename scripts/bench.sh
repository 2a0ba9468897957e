#!/usr/bin/env bash
# bench.sh - run the allocator benchmark suite (tests/bench/run.py): every
# workload under glibc, tcmalloc, jemalloc, mimalloc and forgealloc,
# interleaved, with medians and ratios.
#
# usage: scripts/bench.sh [--quick] [--json FILE] [--plot FILE.png]
#                         [--only NAME...] [--allocators NAME...] [--reps N] [--no-warmup]
#                         [--variant NAME:FORGEALLOC_X=Y[,FORGEALLOC_Z=W]]
# BUILD (default: build, relative to the repository) is the CMake build
# directory holding libforgealloc.so; the workloads are built in $BUILD/bench.
# FORGEALLOC_LIB overrides the library path.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build

exec "${PYTHON:-/usr/bin/python3}" "$root/tests/bench/run.py" --build-dir "$build" "$@"
