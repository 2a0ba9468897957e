#!/usr/bin/env python3
"""demo_launch.py - a stand-in for a Stable Diffusion WebUI's launch.py.

Loads, uses and drops a few synthetic "models" the way a WebUI switches
checkpoints and LoRAs: tensors through PyTorch when it is installed
(python3-torch), plain Python buffers otherwise.  Prints the time of each
step and the resident memory (RSS) after it, so the effect of the allocator
is visible:

    forgealloc run -- python3 scripts/demo_launch.py     # under the shim
    python3 scripts/demo_launch.py                      # glibc, to compare

Options: --cycles N (default 2), --scale F (model sizes x F, default 1).
"""
import argparse
import gc
import os
import sys
import tempfile
import time

MiB = 1 << 20
# name, size in MiB: a checkpoint, a larger checkpoint, a LoRA, a VAE
MODELS = [("checkpoint-a", 160), ("checkpoint-b", 240), ("lora", 24), ("vae", 80)]
# Tensor sizes cycle through these (bytes): from biases to large weights.
TENSOR_SIZES = [4 << 10, 64 << 10, 512 << 10, 2 * MiB, 9 * MiB, 24 * MiB]

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "python"), HERE]  # source tree, or installed side by side
try:
    import forgealloc
except ImportError:
    forgealloc = None


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def layout(total_mib):
    """Tensor sizes adding up to about total_mib."""
    sizes, left, i = [], total_mib * MiB, 0
    while left > 0:
        n = min(TENSOR_SIZES[i % len(TENSOR_SIZES)], left)
        sizes.append(n)
        left -= n
        i += 1
    return sizes


class TorchBackend:
    name = "PyTorch"

    def __init__(self, torch):
        self.torch = torch

    def build(self, sizes, path):
        t = self.torch
        sd = {f"layer{i}.weight": t.randn(n // 4) for i, n in enumerate(sizes)}
        t.save(sd, path)

    def load(self, path):
        return self.torch.load(path)

    def use(self, sd):
        total = 0.0
        for w in sd.values():
            if w.numel() >= 4096:
                m = w[:4096].view(64, 64)
                total += float((m @ m).abs().sum())
        return total


class BufferBackend:
    name = "plain Python buffers (python3-torch not installed)"

    def build(self, sizes, path):
        with open(path, "wb") as f:
            for n in sizes:
                f.write(n.to_bytes(8, "little"))
                f.write(os.urandom(min(n, 4096)) * (n // 4096) + os.urandom(n % 4096))

    def load(self, path):
        sd = {}
        with open(path, "rb") as f:
            i = 0
            while head := f.read(8):
                sd[f"layer{i}.weight"] = bytearray(f.read(int.from_bytes(head, "little")))
                i += 1
        return sd

    def use(self, sd):
        import hashlib
        return sum(hashlib.sha256(memoryview(w)[:65536]).digest()[0] for w in sd.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--idle", type=float, default=3.0,
                    help="seconds to sit idle after the last unload, as a WebUI waiting for the next prompt")
    args = ap.parse_args()
    if args.cycles < 1 or args.scale <= 0 or args.idle < 0:
        ap.error("--cycles must be 1 or more, --scale above 0, --idle 0 or more")
    try:
        import torch
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        backend = TorchBackend(torch)
    except ImportError:
        backend = BufferBackend()

    shim = forgealloc is not None and forgealloc.available()
    print(f"demo: allocator {'forgealloc ' + forgealloc.version() if shim else 'default (no forgealloc)'}, "
          f"models as {backend.name}")
    print(f"demo: start, RSS {rss_mib():.0f} MiB")
    with tempfile.TemporaryDirectory(prefix="forgealloc-demo-") as tmp:
        files = []
        for name, size in MODELS:
            path = os.path.join(tmp, name + ".bin")
            backend.build(layout(int(size * args.scale)), path)
            files.append((name, size, path))
        gc.collect()
        print(f"demo: {len(files)} model files written, RSS {rss_mib():.0f} MiB")
        peak = 0.0
        after_unload = []
        t_all = time.perf_counter()
        for cycle in range(1, args.cycles + 1):
            for name, size, path in files:
                t0 = time.perf_counter()
                sd = backend.load(path)
                t1 = time.perf_counter()
                backend.use(sd)
                t2 = time.perf_counter()
                loaded = rss_mib()
                peak = max(peak, loaded)
                del sd
                gc.collect()
                after = rss_mib()
                after_unload.append(after)
                print(f"demo: cycle {cycle} {name:>12} ({size * args.scale:4.0f} MiB): load {t1 - t0:5.2f} s, "
                      f"use {t2 - t1:5.2f} s, RSS loaded {loaded:5.0f} MiB, after unload {after:5.0f} MiB")
        total = time.perf_counter() - t_all
    print(f"demo: {args.cycles} cycles in {total:.2f} s; RSS peak {peak:.0f} MiB, after the last unload "
          f"{after_unload[-1]:.0f} MiB")
    if args.idle > 0:
        time.sleep(args.idle)
        print(f"demo: idle {args.idle:.0f} s after the last unload (no allocation), RSS {rss_mib():.0f} MiB")
    if shim:
        s = forgealloc.stats()
        h = s["host"]
        print(f"demo: forgealloc returned {h['released_bytes'] / MiB:.0f} MiB to the OS in {h['releases']} "
              f"returns; {sum(h['calls'].values()):,} allocator calls so far (the full report follows at exit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
