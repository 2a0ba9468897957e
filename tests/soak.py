#!/usr/bin/env python3
"""soak.py - a long mixed run under the shim; RSS must stay flat.

Not part of ctest (it runs for minutes).  Run it as

    forgealloc run --stats json --stats-file /tmp/soak.json -- \\
        env PYTHONMALLOC=malloc /usr/bin/python3 tests/soak.py --seconds 600

Three threads for the whole run: one churns small objects (json round
trips: with PYTHONMALLOC=malloc every object goes through the shim), one
loads and drops a "model" of 150-400 MB every two seconds (PyTorch tensors,
or bytearrays without PyTorch), one starts a child every three seconds
(fork+exec of /bin/true, and a forked Python child that allocates and
exits).  RSS is sampled after every unload; the run passes when the median
of the last third is within 10% (or 64 MB) of the median of the first third.
Prints one JSON object with the samples and the verdict; exit 1 on growth.
"""
import argparse
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time

MB = 1 << 20


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def small_objects(stop):
    rng = random.Random(1)
    doc = [{"k%d" % i: list(range(i % 40)), "s": "x" * (i % 200)} for i in range(2000)]
    while not stop.is_set():
        doc = json.loads(json.dumps(doc))
        doc[rng.randrange(len(doc))] = {"n": rng.random(), "l": [rng.random()] * rng.randrange(100)}


def models(stop, samples):
    rng = random.Random(2)
    try:
        import torch
        make = lambda mb: [torch.ones(mb * MB // 4 // 8) for _ in range(8)]  # noqa: E731
    except ImportError:
        make = lambda mb: [bytearray(b"\x01" * (mb * MB // 8)) for _ in range(8)]  # noqa: E731
    loaded = []
    while not stop.is_set():
        loaded.append(make(rng.randrange(150, 400)))
        time.sleep(0.5)
        loaded.clear()
        gc.collect()
        samples.append((time.monotonic(), rss()))
        stop.wait(1.5)


def children(stop, counts):
    while not stop.is_set():
        subprocess.run(["/bin/true"], check=True)
        pid = os.fork()
        if pid == 0:
            data = [bytes(1000) for _ in range(10000)]
            os._exit(0 if len(data) == 10000 else 1)
        _, status = os.waitpid(pid, 0)
        counts["children"] += 1
        counts["failed"] += status != 0
        stop.wait(3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600)
    args = ap.parse_args()
    stop, samples, counts = threading.Event(), [], {"children": 0, "failed": 0}
    threads = [threading.Thread(target=small_objects, args=(stop,)),
               threading.Thread(target=models, args=(stop, samples)),
               threading.Thread(target=children, args=(stop, counts))]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    values = [r for _, r in samples]
    third = max(1, len(values) // 3)
    first = sorted(values[:third])[third // 2]
    last = sorted(values[-third:])[third // 2]
    ok = last <= max(first * 1.10, first + 64 * MB) and counts["failed"] == 0
    print(json.dumps({
        "seconds": round(time.monotonic() - start),
        "unloads": len(values),
        "children": counts["children"],
        "failed_children": counts["failed"],
        "rss_after_unload_first_third_mb": round(first / MB),
        "rss_after_unload_last_third_mb": round(last / MB),
        "rss_after_unload_max_mb": round(max(values) / MB),
        "rss_after_unload_mb": [round(v / MB) for v in values],
        "flat": ok,
    }))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
