#!/usr/bin/env python3
"""GPU workloads of the benchmark suite: run by run.py when a CUDA device is present, skipped with one
line otherwise.  Also runnable alone:

    gpu.py [--quick] [--reps N] [--warmup N] [--only NAME...] [--configs NAME...] [--build-dir DIR] [--json FILE]
    gpu.py --cpu      the PyTorch workloads, tiny, on the CPU: tries the scripts without a GPU

Each workload runs natively ("driver": no preload) and under forgealloc with several device pool
sizes, configurations interleaved per repetition; the table shows medians and min-max.
gpu_bench.cu is built here with nvcc (-cudart shared, so the shim can intercept it) when missing or
out of date."""
import argparse
import ctypes
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from libs import find_library

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(os.path.dirname(BENCH_DIR))
MiB = 1 << 20
PAIR_SIZES = (512, 64 << 10, 1 * MiB, 2 * MiB, 20 * MiB, 60 * MiB, 256 * MiB)
ENV_PREFIXES = ("LD_PRELOAD", "FORGEALLOC_", "TCMALLOC_", "MALLOC", "PYTORCH_")

# name -> (preload: None | "forgealloc" | "tcmalloc", extra environment)
CONFIGS = {
    "driver": (None, {}),
    "tcmalloc": ("tcmalloc", {}),
    "pool-256M": ("forgealloc", {"FORGEALLOC_DEVICE_POOL_SIZE": "256M"}),
    "pool-default": ("forgealloc", {}),
    "pool-25%": ("forgealloc", {"FORGEALLOC_DEVICE_POOL_SIZE": "25%"}),
}
NO_CACHE = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def workloads(quick):
    """(name, what it models, argv builder, configs, extra env, metrics)."""
    n_idle, n_busy = (2000, 100) if quick else (20000, 500)
    steps, requests, prompts = (15, 10, 4) if quick else (40, 25, 10)
    sizes = ",".join(str(s) for s in PAIR_SIZES)
    pool = ("driver", "pool-256M", "pool-default", "pool-25%")
    torch_cfgs = ("driver", "pool-default", "pool-25%")
    pair_metrics = tuple(f"us_{s}" for s in PAIR_SIZES)
    return (
        ("gpu-pairs-idle", "cudaMalloc+cudaFree pair, idle GPU (us, median)",
         lambda b: [b, "pairs", str(n_idle), "0", sizes], pool, {}, pair_metrics),
        ("gpu-pairs-busy", "pair with a 2 ms kernel queued on another stream first (us, median)",
         lambda b: [b, "pairs", str(n_busy), "2", sizes], pool, {}, pair_metrics),
        ("gpu-threads", "8 threads x malloc/memset/check/free, up to 4 MiB",
         lambda b: [b, "threads", "8", "300" if quick else "3000", str(4 * MiB)], pool, {}, ("s",)),
        ("torch-train", "ResNet-50 training step, bf16, bs 32, caching allocator on",
         lambda b: [sys.executable, os.path.join(BENCH_DIR, "gpu_torch.py"), "train", "--steps", str(steps)],
         torch_cfgs, {}, ("ms_per_step", "loss_last", "peak_reserved_bytes")),
        ("torch-train-nocache", "the same with PYTORCH_NO_CUDA_MEMORY_CACHING=1",
         lambda b: [sys.executable, os.path.join(BENCH_DIR, "gpu_torch.py"), "train", "--steps", str(steps)],
         torch_cfgs, NO_CACHE, ("ms_per_step", "loss_last")),
        ("torch-webui", "requests at 5 resolutions, gc.collect() + empty_cache() after each",
         lambda b: [sys.executable, os.path.join(BENCH_DIR, "gpu_torch.py"), "webui", "--requests", str(requests)],
         torch_cfgs, {}, ("ms_per_request", "ms_gc_empty_cache", "peak_reserved_bytes")),
        ("torch-offload", "prompt change: 1.3 GB fp16 module to the CPU, empty_cache, back",
         lambda b: [sys.executable, os.path.join(BENCH_DIR, "gpu_torch.py"), "offload", "--prompts", str(prompts)],
         ("driver", "tcmalloc", "pool-default", "pool-25%"), {}, ("ms_per_change", "ms_empty_cache")),
        ("torch-offload-idle", "the same with the host still 2.5 s after each prompt (the generation)",
         lambda b: [sys.executable, os.path.join(BENCH_DIR, "gpu_torch.py"), "offload", "--prompts",
                    str(max(prompts // 2, 5)), "--gap", "2.5"],
         ("driver", "tcmalloc", "pool-default"), {}, ("ms_per_change", "ms_first_change", "ms_empty_cache")),
    )


NAMES = tuple(w[0] for w in workloads(True))


def find_nvcc():
    for c in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def cudart_path(nvcc):
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None
    pats = [os.path.join(root, "lib64", "libcudart.so.*")] if root else []
    pats += ["/usr/lib/x86_64-linux-gnu/libcudart.so.*"]
    for p in pats:
        found = sorted(glob.glob(p))
        if found:
            return found[0]
    return None


def probe(nvcc):
    """None when a CUDA device is usable, else why not (one line)."""
    if not nvcc:
        return "nvcc not found (set NVCC or install the CUDA toolkit)"
    lib = cudart_path(nvcc)
    if not lib:
        return "no libcudart.so found next to nvcc"
    try:
        rt = ctypes.CDLL(lib)
    except OSError as e:
        return f"cannot load {lib}: {e}"
    n = ctypes.c_int(0)
    r = rt.cudaGetDeviceCount(ctypes.byref(n))
    if r != 0 or n.value < 1:
        return f"no CUDA device (cudaGetDeviceCount = {r}, {n.value} devices)"
    return None


def build(nvcc, bin_dir):
    os.makedirs(bin_dir, exist_ok=True)
    out, src = os.path.join(bin_dir, "gpu_bench"), os.path.join(BENCH_DIR, "gpu_bench.cu")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
        root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        subprocess.run([nvcc, "-O2", "-std=c++17", "-cudart", "shared", "-Xlinker", f"-rpath,{root}/lib64",
                        "-o", out, src], check=True)
    return out


def tcmalloc_lib():
    """Plain tcmalloc, found where the loader would look first (LD_LIBRARY_PATH), or None."""
    first = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    return find_library("libtcmalloc_minimal.so.4", first) or None


def run_one(argv, config, extra, forgealloc_lib, scratch):
    preload, env_add = CONFIGS[config]
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
    env.update(env_add)
    env.update(extra)
    stats_file = os.path.join(scratch, "stats.json")
    if preload == "forgealloc":
        env["LD_PRELOAD"] = forgealloc_lib
        env["FORGEALLOC_STATS"] = "json"
        env["FORGEALLOC_STATS_FILE"] = stats_file
    elif preload == "tcmalloc":
        env["LD_PRELOAD"] = tcmalloc_lib() or ""
    if os.path.exists(stats_file):
        os.unlink(stats_file)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"ok": False, "failure": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    sample = json.loads(lines[-1])
    sample["ok"] = True
    if preload == "forgealloc" and os.path.exists(stats_file):
        devs = json.load(open(stats_file))["device"]["devices"]
        if devs:
            d = devs[0]
            sample["device_syncs"] = d["device_syncs"]
            sample["driver_calls"] = d["driver_malloc_calls"] + d["driver_free_calls"]
            sample["pool_allocs"] = d["pool_allocs"]
            sample["fallback_allocs"] = d["fallback_allocs"]
            sample["pool_type"] = d["pool_type"]
            sample["pieces_created"] = d["pieces_created"]
            sample["pool_bytes_at_exit"] = d["pool_bytes"]
    return sample


def summarize(samples, metrics):
    ok = [s for s in samples if s.get("ok")]
    out = {}
    for m in metrics + ("device_syncs", "driver_calls", "pool_allocs", "fallback_allocs"):
        vals = [s[m] for s in ok if m in s]
        if vals:
            out[m] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def fmt(v):
    if isinstance(v, float) and abs(v) < 1e-3 and v != 0:
        return f"{v:.3g}"
    if abs(v) >= 1e6:
        return f"{v / MiB:.0f}Mi"
    return f"{v:.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def run(only=None, quick=False, reps=3, build_dir=None, forgealloc_lib=None, cpu=False, configs=None, warmup=1,
        json_path=None):
    """Run the GPU workloads; returns a JSON-able report, or None when skipped (one line printed).
    configs: only these configurations (of CONFIGS); warmup: rounds run first and discarded; json_path:
    the report so far is written there after each workload, and each workload's rows are printed as
    it ends, so a run cut short keeps what it measured."""
    build_dir = os.path.abspath(build_dir or os.path.join(REPO_DIR, "build"))
    forgealloc_lib = forgealloc_lib or os.path.join(build_dir, "libforgealloc.so")
    chosen = [w for w in workloads(quick) if not only or w[0] in only]
    if cpu:
        chosen = [w for w in chosen if w[0].startswith("torch-")]
    if not chosen:
        return None
    nvcc = find_nvcc()
    why = None if cpu else probe(nvcc)
    if why:
        print(f"note: GPU workloads skipped: {why}")
        return None
    try:
        binary = None if cpu else build(nvcc, os.path.join(build_dir, "bench"))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"note: GPU workloads skipped: gpu_bench.cu did not build with {nvcc}: {e}")
        return None
    only_configs = configs
    report = {"workloads": []}
    rows = []
    with tempfile.TemporaryDirectory(prefix="forgealloc-gpu-bench-") as scratch:
        for name, models, argv_of, configs, extra, metrics in chosen:
            argv = argv_of(binary)
            if cpu:
                argv = argv + ["--device", "cpu"]
            configs = [c for c in configs if (CONFIGS[c][0] != "tcmalloc" or tcmalloc_lib())
                       and (not only_configs or c in only_configs)]
            print(f"{name}: {' '.join(argv)}", file=sys.stderr, flush=True)
            samples = {c: [] for c in configs}
            for rep in range(warmup + reps):  # the warm-up rounds are discarded
                for i in range(len(configs)):
                    c = configs[(i + rep) % len(configs)]
                    s = run_one(argv, c, extra, forgealloc_lib, scratch)
                    if rep >= warmup:
                        samples[c].append(s)
            results = {}
            for c in configs:
                results[c] = {"summary": summarize(samples[c], metrics), "samples": samples[c],
                              "failures": sorted({s["failure"] for s in samples[c] if not s.get("ok")})}
                rows.append((name, c, results[c]))
                print(row(name, c, results[c]), file=sys.stderr, flush=True)
            report["workloads"].append({"name": name, "models": models, "argv": argv, "env": extra,
                                        "results": results})
            if json_path:
                with open(json_path, "w") as f:
                    json.dump(report, f, indent=1)
    print()
    print("GPU workloads (medians, min-max in brackets)")
    for name, c, r in rows:
        print(row(name, c, r))
    return report


def row(name, config, r):
    if r["failures"]:
        return f"  {name:20} {config:13} FAILED: {r['failures'][0]}"
    parts = [f"{m} {fmt(v['median'])} [{fmt(v['min'])}-{fmt(v['max'])}]" for m, v in r["summary"].items()]
    return f"  {name:20} {config:13} " + "; ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="+", choices=NAMES)
    ap.add_argument("--build-dir")
    ap.add_argument("--json")
    ap.add_argument("--cpu", action="store_true", help="the PyTorch workloads, tiny, on the CPU")
    ap.add_argument("--configs", nargs="+", choices=tuple(CONFIGS), help="only these configurations")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and discarded (default 1)")
    a = ap.parse_args()
    run(a.only, a.quick, a.reps, a.build_dir, os.environ.get("FORGEALLOC_LIB"), a.cpu, a.configs, a.warmup, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
