#!/usr/bin/env bash
# instructions.sh - instructions per malloc+free pair under plain tcmalloc
# and under forgealloc, counted by valgrind --tool=callgrind.
#
# pairs.c runs its loop in one function, which callgrind alone counts
# (--toggle-collect=run_pairs: no start-up, no other thread); each count is
# taken at two loop lengths and divided by the difference, so what a first
# call costs (a thread cache set up, the heap grown) cancels.  The same loop
# without the malloc and free (pairs ... noalloc) gives the loop's own
# instructions, subtracted from both, so the figures are the allocator's.
#
# The forward column is libforward.so (forward.c): malloc and free enter a
# library that only jumps on into tcmalloc, what interposing alone adds.
#
#   small:  16-256 B, the shape of churn's blocks
#   medium: 257 KiB-2 MiB (tcmalloc's page heap), first byte written only
#
# usage: tests/bench/instructions.sh [PAIRS_SMALL PAIRS_MEDIUM]
#   (the shorter loop runs half as many pairs; defaults 1000000 and 100000)
# BUILD (default: build) holds libforgealloc.so; FORGEALLOC_LIB overrides it.
# pairs is compiled into $BUILD/bench.  Exits 0 with one line when valgrind
# is not installed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
small_pairs=${1:-1000000}
medium_pairs=${2:-100000}

if ! command -v valgrind >/dev/null; then
    echo "instructions.sh: valgrind not installed, skipped (apt-get install valgrind)"
    exit 0
fi
forgealloc=${FORGEALLOC_LIB:-$build/libforgealloc.so}
[[ -e $forgealloc ]] || { echo "instructions.sh: $forgealloc not found (build it, or set FORGEALLOC_LIB)" >&2; exit 1; }
tcmalloc=""
for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
    [[ -e $dir/libtcmalloc_minimal.so.4 ]] && { tcmalloc=$dir/libtcmalloc_minimal.so.4; break; }
done
[[ -n $tcmalloc ]] || { echo "instructions.sh: libtcmalloc_minimal.so.4 not found" >&2; exit 1; }

mkdir -p "$build/bench"
pairs=$build/bench/pairs
if [[ ! -x $pairs || $root/tests/bench/pairs.c -nt $pairs || $root/tests/bench/bench.h -nt $pairs ]]; then
    "${CC:-gcc}" -O2 -g -std=gnu11 -Wall -Wextra -o "$pairs" "$root/tests/bench/pairs.c"
fi
forward=$build/bench/libforward.so
if [[ ! -e $forward || $root/tests/bench/forward.c -nt $forward ]]; then
    "${CC:-gcc}" -O2 -g -Wall -Wextra -fPIC -shared -fno-plt -o "$forward" "$root/tests/bench/forward.c" "$tcmalloc"
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Every run sees the allocators' defaults: their variables are not passed on.
unset=(-u LD_PRELOAD)
while IFS='=' read -r name _; do
    [[ $name == FORGEALLOC_* || $name == TCMALLOC_* ]] && unset+=(-u "$name")
done < <(env)

# count PRELOAD N LO HI [noalloc]: "TOTAL MALLOC FREE", the instructions
# callgrind counted in run_pairs and, of those, in malloc and free with all
# they call (the outermost malloc and free: forgealloc's, which call tcmalloc's).
count() {
    local preload=$1 out=$scratch/callgrind.out
    shift
    env "${unset[@]}" ${preload:+LD_PRELOAD=$preload} \
        valgrind --tool=callgrind --toggle-collect=run_pairs --callgrind-out-file="$out" "$pairs" "$@" \
        >/dev/null 2>"$scratch/valgrind.err" || { cat "$scratch/valgrind.err" >&2; exit 1; }
    callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk -v total="$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out")" '
        function num(s) { gsub(",", "", s); return s + 0 }
        $2 ~ /^\(/ && $3 ~ /:malloc$/ && num($1) > m { m = num($1) }
        $2 ~ /^\(/ && $3 ~ /:free$/ && num($1) > f { f = num($1) }
        END { print total, m + 0, f + 0 }'
}

# per_pair PRELOAD N LO HI [noalloc]: "TOTAL MALLOC FREE" per pair, from the
# counts at N and N/2: (count(N) - count(N/2)) / (N - N/2).
per_pair() {
    local preload=$1 n=$2 half=$(($2 / 2))
    shift 2
    local long short
    long=$(count "$preload" "$n" "$@")
    short=$(count "$preload" "$half" "$@")
    awk -v a="$long" -v b="$short" -v n=$((n - half)) 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        printf "%.1f %.1f %.1f\n", (x[1] - y[1]) / n, (x[2] - y[2]) / n, (x[3] - y[3]) / n }'
}

printf '%-7s %-14s %6s  %-22s %-18s %-22s %-22s\n' shape sizes loop "tcmalloc pair (m+f)" "forward added" \
    "forgealloc pair (m+f)" "added pair (m+f)"
for shape in small medium; do
    if [[ $shape == small ]]; then
        n=$small_pairs lo=16 hi=256 sizes="16-256 B"
    else
        n=$medium_pairs lo=$((257 << 10)) hi=$((2 << 20)) sizes="257K-2M"
    fi
    read -r loop _ _ < <(per_pair "" "$n" "$lo" "$hi" noalloc)
    read -r tc tcm tcf < <(per_pair "$tcmalloc" "$n" "$lo" "$hi")
    read -r fw fwm fwf < <(per_pair "$forward" "$n" "$lo" "$hi")
    read -r fa fam faf < <(per_pair "$forgealloc" "$n" "$lo" "$hi")
    awk -v s="$shape" -v z="$sizes" -v l="$loop" -v t="$tc" -v tm="$tcm" -v tf="$tcf" \
        -v w="$fw" -v wm="$fwm" -v wf="$fwf" -v f="$fa" -v fm="$fam" -v ff="$faf" 'BEGIN {
        printf "%-7s %-14s %6.1f  %-22s %-18s %-22s %-22s\n", s, z, l,
            sprintf("%.1f (%.1f+%.1f)", t - l, tm, tf), sprintf("%.1f (%.1f+%.1f)", w - t, wm - tm, wf - tf),
            sprintf("%.1f (%.1f+%.1f)", f - l, fm, ff), sprintf("%.1f (%.1f+%.1f)", f - t, fm - tm, ff - tf) }'
done
echo "instructions per malloc+free pair: callgrind's count in the loop less the loop's own (loop column);"
echo "m+f: inclusive counts of malloc and of free alone (without the call's set-up in the caller);"
echo "forward added: what a library that only jumps on into tcmalloc adds (forward.c); added: what forgealloc adds"
