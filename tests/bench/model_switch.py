"""model_switch.py - checkpoint switching in a Stable Diffusion WebUI, host side.

A WebUI loads a checkpoint's state dict into host memory, uses it, drops it
and loads the next one; with some allocators RSS grows on every switch until
the container is OOM-killed.  This builds a few state dicts of mixed tensor
sizes (KBs to tens of MBs), saves each to a temporary directory, then cycles
through them: torch.load, use every tensor (a mat-vec or a sum), drop,
gc.collect(), and record RSS after each unload.

usage: model_switch.py --models MB[,MB...] --cycles N [--settle S]
Prints one JSON object: rss_baseline (after import, before any model),
rss_series (bytes after each unload), rss_after_unload (the last),
rss_after_unload_max, rss_loaded_max, load_s, switch_s (the switching loop
alone) and, with --settle, anon_settled: RssAnon after sleeping S seconds
past the last unload (an idle WebUI that unloaded its model).

With FA_BENCH_TRIM=1 in the environment, malloc_trim(0) runs right after
each unload: glibc's best case, the row to compare settled RSS against.
"""

import argparse
import ctypes
import gc
import json
import os
import tempfile
import time

import torch

from procstat import rss_anon_bytes

# One repeating block of a UNet/transformer-like model: (shape, what it is).
# fp32, so 4 bytes per element: 32 MiB, 4 MiB, 3.5 MiB, 1.25 MiB ... 256 B.
BLOCK = (
    (4096, 2048),  # large projection
    (2048,),  # its bias
    (1024, 1024),  # attention projection
    (1024,),  # norm weight
    (320, 320, 3, 3),  # convolution
    (320,),  # conv bias
    (1280, 256),  # time embedding
    (64, 64),  # small adapter
    (64,),  # adapter bias
)
ELEMENT_BYTES = 4
MIB = 1 << 20


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_state_dict(index, target_bytes):
    """Tensors from BLOCK, rotated by index so models differ in order and mix."""
    state, total, n = {}, 0, 0
    while total < target_bytes:
        shape = BLOCK[(n + index) % len(BLOCK)]
        tensor = torch.full(shape, float(index + 1) / (n + 1))
        state[f"block{n // len(BLOCK)}.param{n % len(BLOCK)}"] = tensor
        total += tensor.numel() * ELEMENT_BYTES
        n += 1
    return state


def use(state):
    """Touch every tensor the way inference would: a mat-vec or a reduction."""
    checksum = 0.0
    for tensor in state.values():
        if tensor.dim() >= 2:
            matrix = tensor.reshape(tensor.shape[0], -1)
            checksum += float((matrix @ torch.ones(matrix.shape[1])).sum())
        else:
            checksum += float(tensor.sum())
    return checksum


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="model sizes in MiB, comma-separated")
    parser.add_argument("--cycles", type=int, required=True, help="passes over all models")
    parser.add_argument("--settle", type=float, default=0, help="seconds to sleep after the last unload")
    args = parser.parse_args()
    trim = ctypes.CDLL("libc.so.6").malloc_trim if os.environ.get("FA_BENCH_TRIM") == "1" else None
    sizes_mib = [int(s) for s in args.models.split(",")]

    baseline = rss_bytes()
    series, loaded_max, load_s = [], 0, 0.0
    with tempfile.TemporaryDirectory(prefix="forgealloc-bench-") as tmp:
        paths = []
        for index, size in enumerate(sizes_mib):
            path = os.path.join(tmp, f"model{index}.pt")
            state = build_state_dict(index, size * MIB)
            torch.save(state, path)
            del state
            paths.append(path)
        gc.collect()

        switch_start = time.monotonic()
        for _ in range(args.cycles):
            for path in paths:
                start = time.monotonic()
                state = torch.load(path)
                load_s += time.monotonic() - start
                use(state)
                loaded_max = max(loaded_max, rss_bytes())
                del state
                gc.collect()
                if trim:
                    trim(0)
                series.append(rss_bytes())
        switch_s = time.monotonic() - switch_start
    anon_unload = rss_anon_bytes()
    anon_settled = -1
    if args.settle > 0:
        time.sleep(args.settle)
        anon_settled = rss_anon_bytes()

    print(
        json.dumps(
            {
                "ops": len(series),
                "rss_baseline": baseline,
                "rss_series": series,
                "rss_after_unload": series[-1],
                "rss_after_unload_max": max(series),
                "rss_loaded_max": loaded_max,
                "load_s": round(load_s, 3),
                "switch_s": round(switch_s, 3),
                "anon_after_unload": anon_unload,
                "anon_settled": anon_settled,
            }
        )
    )


if __name__ == "__main__":
    main()
