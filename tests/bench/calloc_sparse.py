"""calloc_sparse.py - large zeroed arrays of which a program writes little.

numpy.zeros takes its memory from calloc.  glibc's calloc leaves fresh mmap
memory as the kernel hands it out (zero pages that are faulted in only when
written); plain tcmalloc clears every block with memset, so all of it
becomes resident.  A program that sets one value every few pages of a large
zeroed array (a sparse buffer, an index, a mask) pays for the whole array.

Two cases, each in a fresh Python process (so neither reuses memory the
other freed), each with ARRAYS numpy.zeros arrays of MIB MiB held at once:
  sparse: one float64 set per 32 KiB of each array
  whole:  every element written (ndarray.fill)
Each reports the time from before the first numpy.zeros to after the last
write, and how much RssAnon grew over it.

usage: calloc_sparse.py [--arrays N] [--mib MIB] [--case sparse|whole]
Prints one JSON object: sparse_ms, sparse_anon, whole_ms, whole_anon (bytes),
arrays, mib; with --case, that case's ms and anon alone.
"""

import argparse
import json
import subprocess
import sys
import time

import numpy

from procstat import rss_anon_bytes

STRIDE_BYTES = 32 << 10  # one value set per 32 KiB in the sparse case
MIB = 1 << 20


def one_case(case, arrays, mib):
    """Allocate, write, measure; the arrays stay alive until after the reading."""
    elements = mib * MIB // 8
    stride = STRIDE_BYTES // 8
    held = []
    anon_before = rss_anon_bytes()
    start = time.monotonic()
    for _ in range(arrays):
        a = numpy.zeros(elements, dtype=numpy.float64)
        if case == "sparse":
            a[::stride] = 1.0
        else:
            a.fill(1.0)
        held.append(a)
    secs = time.monotonic() - start
    anon_after = rss_anon_bytes()
    checksum = sum(float(a[0]) + float(a[-stride]) for a in held)
    return {"ms": round(secs * 1e3, 2), "anon": anon_after - anon_before, "checksum": checksum}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrays", type=int, default=8)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--case", choices=("sparse", "whole"), help="run this case here and print it alone")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.arrays, args.mib)))
        return
    result = {"arrays": args.arrays, "mib": args.mib}
    for case in ("sparse", "whole"):
        cmd = [sys.executable, __file__, "--arrays", str(args.arrays), "--mib", str(args.mib), "--case", case]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        child = json.loads(out.strip().splitlines()[-1])
        result[f"{case}_ms"] = child["ms"]
        result[f"{case}_anon"] = child["anon"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
