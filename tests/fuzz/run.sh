#!/usr/bin/env bash
# run.sh - fuzz the harnesses of tests/fuzz with libFuzzer.
#
#   tests/fuzz/run.sh [SECONDS [HARNESS...]]
#
# Configures a Clang build in build-fuzz/ (next to the source tree; set
# FA_FUZZ_BUILD to use another directory) with -DFA_FUZZ=ON, builds only
# the fuzz_<harness> binaries, then runs each harness (all of them by
# default: options fmt path render) for SECONDS (default 60) of one
# process on one core, with tests/fuzz/corpus/<harness>/ as its corpus:
# new inputs are added there.  The corpus is then minimised and its file
# count printed before and after: the hand-written seed-* files stay, and of
# the others only those that reach code the rest does not (-merge=1 with
# -use_counters=0, into a fresh directory that replaces the corpus).  Crash reproducers are written to tests/fuzz/crash-* (ignored
# by git); replay one with build-fuzz/tests/fuzz/fuzz_<harness> FILE.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${FA_FUZZ_BUILD:-$root/build-fuzz}
seconds=${1:-60}
if [[ ! $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS [HARNESS...]]  (SECONDS: a positive whole number)" >&2
    exit 2
fi
shift $(($# > 0 ? 1 : 0))
harnesses=("$@")
if [[ ${#harnesses[@]} -eq 0 ]]; then
    harnesses=(options fmt path render)
fi

targets=()
for h in "${harnesses[@]}"; do
    if [[ ! -d $here/corpus/$h ]]; then
        echo "$0: no harness '$h' (no $here/corpus/$h)" >&2
        exit 2
    fi
    targets+=("fuzz_$h")
done

command -v clang >/dev/null || { echo "$0: clang not found; install it with scripts/setup.sh --fuzz" >&2; exit 2; }
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DFA_FUZZ=ON -DFA_TESTS=ON >/dev/null
cmake --build "$build" --target "${targets[@]}"

count() { find "$1" -maxdepth 1 -type f | wc -l; }

failed=()
for h in "${harnesses[@]}"; do
    corpus=$here/corpus/$h
    bin=$build/tests/fuzz/fuzz_$h
    dict=()
    if [[ $h == options || $h == render ]]; then
        dict=("-dict=$here/settings.dict")
    fi
    before=$(count "$corpus")
    echo "== $h: $before corpus files; fuzzing for $seconds s"
    if ! "$bin" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="$here/" "$corpus"; then
        failed+=("$h")
    fi
    fresh=$(mktemp -d "$build/merge-$h.XXXXXX")
    find "$corpus" -maxdepth 1 -type f -name 'seed-*' -exec cp -t "$fresh" {} +
    if ! "$bin" -merge=1 -use_counters=0 "$fresh" "$corpus" >"$build/merge-$h.log" 2>&1; then
        echo "$0: minimising corpus/$h failed, left as it is: see $build/merge-$h.log" >&2
        rm -rf "$fresh"
        failed+=("$h")
        continue
    fi
    find "$corpus" -maxdepth 1 -type f -delete
    find "$fresh" -maxdepth 1 -type f -exec mv -t "$corpus" {} +
    rmdir "$fresh"
    echo "== $h: $before corpus files before, $(count "$corpus") after minimising"
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "$0: failures in: ${failed[*]} (reproducers: $here/crash-*)" >&2
    exit 1
fi
