"""import_torch.py - what a PyTorch process holds before it does anything.

Imports torch, then sleeps SLEEP seconds without an allocator call of its
own, and reads RssAnon: the floor under every PyTorch workload, where the
allocator's own start-up, its size-class rounding, metadata and caches show.
The file is opened and the buffer allocated before the sleep, and read with
os.readv into that buffer after it, so nothing reaches malloc in between.

usage: import_torch.py [SLEEP]   (default 8 seconds)
Prints one JSON object: import_s (the import alone), anon_imported (RssAnon
right after the import), anon_settled (after the sleep), both in bytes.
"""

import json
import os
import sys
import time


def rss_anon_bytes(text):
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return -1


def read_status():
    with open("/proc/self/status") as f:
        return f.read()


def main():
    sleep_s = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    start = time.monotonic()
    import torch  # noqa: F401  (the import is what is measured)

    import_s = time.monotonic() - start
    anon_imported = rss_anon_bytes(read_status())
    fd = os.open("/proc/self/status", os.O_RDONLY)
    buf = bytearray(1 << 16)
    time.sleep(sleep_s)
    n = os.readv(fd, [buf])
    os.close(fd)
    anon_settled = rss_anon_bytes(buf[:n].decode())
    print(json.dumps({"import_s": round(import_s, 3), "anon_imported": anon_imported, "anon_settled": anon_settled}))


if __name__ == "__main__":
    main()
