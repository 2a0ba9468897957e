"""realloc_grow.py - buffers grown step by step, as CPython grows them.

A bytearray extended in CHUNK_KIB steps (CPython over-allocates it by an
eighth and grows it with realloc) up to MIB MiB, ROUNDS times, each round
a new buffer.  glibc resizes a large block in place or with mremap; plain
tcmalloc allocates a larger block, copies, and keeps the old one's pages.
The harness's peak RSS shows what the copies left behind.

usage: realloc_grow.py MIB [ROUNDS] [CHUNK_KIB]
Prints one JSON object: s_per_round (median), mib, rounds.
"""

import json
import statistics
import sys
import time


def main():
    mib = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    chunk = bytes(range(256)) * (4 * (int(sys.argv[3]) if len(sys.argv) > 3 else 1024))
    target = mib << 20
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        buf = bytearray()
        while len(buf) < target:
            buf += chunk
        times.append(time.perf_counter() - start)
        del buf
    print(json.dumps({"s_per_round": statistics.median(times), "mib": mib, "rounds": rounds}))


if __name__ == "__main__":
    main()
