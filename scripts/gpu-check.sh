#!/usr/bin/env bash
# gpu-check.sh - on a machine with a CUDA GPU: build, run the GPU tests (ctest -L gpu) and the GPU
# benchmarks in one go, each step within what is left of a time budget, everything written to a folder.
#
#   scripts/gpu-check.sh [OUT_DIR]          (default: the build folder's gpu-check/)
#
# Environment:
#   BUDGET_S   seconds for the whole run (default 3600); the benchmarks get what the tests leave
#   DEPS       a prefix holding gperftools and cmocka where they are not installed (the usr/ of
#              extracted Debian packages: DEPS/include, DEPS/lib/x86_64-linux-gnu)
#   BUILD      the build folder (default build-gpu)
# Writes env.txt (GPU, driver, CUDA, PyTorch), build.txt, ctest.txt (every check's values, natively and
# under the shim), offload.json and device.json (tests/bench/gpu.py's reports) and log.txt.
set -u
cd "$(dirname "$0")/.." || exit 1
budget=${BUDGET_S:-3600}
build=${BUILD:-build-gpu}
out=${1:-$build/gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
say() { echo "[$(($(date +%s) - t0))s] $*"; }
exec > >(tee "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1
py=$(command -v python3)
cmake_deps=()
if [ -n "${DEPS:-}" ]; then
    lib=$DEPS/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cmake_deps=(-DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_LIBRARY_PATH="$lib")
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nvcc --version | tail -2
    "$py" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.is_available())'
    uname -r
    nproc
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

say "build ($build)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# The tests' Python is the one on PATH: where PyTorch with CUDA lives on GPU machines.
if ! { cmake "${generator[@]}" -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFA_TEST_PYTHON="$py" \
        "${cmake_deps[@]}" >"$out/build.txt" 2>&1 &&
       cmake --build "$build" -j"$(nproc)" >>"$out/build.txt" 2>&1; }; then
    say "build failed"
    tail -40 "$out/build.txt"
    exit 1
fi

bench() { # bench JSON ARGS...: tests/bench/gpu.py within what is left
    local json=$1
    shift
    say "bench $*"
    timeout $(($(left) > 5 ? $(left) : 5)) "$py" tests/bench/gpu.py --build-dir "$build" --warmup 0 \
        --json "$out/$json" "$@"
    say "bench exit $?"
}

# The host side of the prompt change first: it needs plain tcmalloc beside forgealloc.
bench offload.json --only torch-offload torch-offload-idle --configs driver tcmalloc pool-default --reps 2 --quick
say "ctest -L gpu"
timeout $(($(left) > 155 ? $(left) - 150 : 5)) ctest --test-dir "$build" -L gpu -V --timeout 600 >"$out/ctest.txt" 2>&1
say "ctest exit $?"
grep -E "Test +#|tests passed|tests failed" "$out/ctest.txt"
bench device.json --only gpu-pairs-idle gpu-pairs-busy gpu-threads torch-train torch-train-nocache torch-webui \
    --configs driver pool-256M pool-default pool-25% --reps 2 --quick
say finished
