"""run.py - forgealloc benchmark runner (Python 3 standard library only).

Builds the C workloads in this directory, runs every workload under every
allocator interleaved (each repetition runs all allocators once, starting
one further along each time, so drift on a shared machine hits all alike),
and prints medians, min-max, ratios against glibc and plain tcmalloc, CPU
time, peak RSS and, where a workload reports it, RSS after unload.

Each workload prints one JSON object on its last stdout line with its own
metrics; wall time, CPU time (user+sys) and peak RSS (ru_maxrss) of the child
come from wait4 in measure.c, which starts every run.  Benchmarks are not
tests: a workload that fails under an allocator is reported as FAILED; the
exit status is non-zero only when the suite cannot run at all (forgealloc
library missing, workloads do not build).

Usually run through scripts/bench.sh; see --help.
"""

import argparse
import contextlib
import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import gpu  # the GPU workloads (gpu.py): run when a CUDA device is present
from libs import find_library

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cgroups import in_cgroup, limited_cgroup  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(os.path.dirname(BENCH_DIR))

CC = os.environ.get("CC", "gcc")
CFLAGS = ("-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-pthread")
C_PROGRAMS = ("measure", "churn", "prodcons", "large_repeat", "large_churn", "release_burst", "proc_start", "fork_loop",
              "steps", "fault_cost")  # fault_cost: a probe of the kernel's fault costs, run by hand
C_HEADERS = ("bench.h",)
# Built against the stand-in CUDA runtime of tests/device, when the CMake
# build has it (BUILD/tests/device/libcudart.so.13).
DEVICE_PROGRAM = "device_pool"
DEVICE_DIR = os.path.join(REPO_DIR, "tests", "device")
FORWARD_LIB = "libforward.so"  # tcmalloc+forward's library (forward.c), linked to tcmalloc

REPS = {"quick": 3, "full": 5}
RUN_TIMEOUT_S = 600
MB = 1 << 20

# Variables that change how an allocator behaves: removed from the inherited
# environment so every run sees defaults unless its allocator sets them.
ALLOCATOR_ENV_PREFIXES = (
    "LD_PRELOAD",
    "FORGEALLOC_",
    "TCMALLOC_",
    "MALLOC",  # glibc MALLOC_*_, jemalloc MALLOC_CONF, tcmalloc MALLOCSTATS
    "GLIBC_TUNABLES",
    "MIMALLOC_",
    "PYTHONMALLOC",
    "FA_BENCH_",
)

TCMALLOC_SONAME = "libtcmalloc_minimal.so.4"
JEMALLOC_SONAME = "libjemalloc.so.2"
MIMALLOC_SONAME = "libmimalloc.so.2"
GLIBC_MMAP_THRESHOLD = 1 << 20


@dataclass(frozen=True)
class Allocator:
    name: str
    preload: str = ""  # absolute path of the library to preload; "" = glibc
    env: dict = field(default_factory=dict)


# Counts and sizes per workload, as (quick, full).
CHURN_OPS = (4_000_000, 20_000_000)  # operations per thread
CHURN_HOT_OPS = (10_000_000, 50_000_000)  # the same with 1024 live blocks a thread, which stay in the caches
PRODCONS_BLOCKS = (500_000, 3_000_000)
LARGE_ITERATIONS = (60, 300)
LARGE_CHURN_STEPS = (600, 1500)
SETTLE_S = 6  # an idle process: RSS is read this long after the last free
MODEL_SIZES_MIB = ("100,160", "150,250,300,400")
MODEL_CYCLES = (2, 3)
PROMPT_ENCODER_MIB = ("100", "1300")  # SDXL's text encoders in fp16: about 1.3 GB
PROMPT_LOADED_MIB = ("300", "3900")  # the model built on the host before the first prompt, then freed
PROMPT_CHANGES = ("3", "6")
PROMPT_GAP_S = ("2.5", "5")  # the GPU generating, the host still
PROMPT_BUSY_CHANGES = ("6", "10")  # back to back: the next prompt follows at once
PROMPT_GAPS_S = ("1", "10", "45", "120")  # a person's pace: the gap between prompts, swept
PROMPT_GAP_CHANGES = "5"  # the time reported is the median of prompts 3 to 5
FORK_LOOP = ((10, 100), (64, 256))  # iterations, MiB of working set per iteration
STEPS = ((400, 300), (64, 120), (20, 300), "20")  # MiB live, MiB per step, steps, ms between steps: fits 512 MiB
PYTHON_ROUNDS = (15, 60)
PROC_STARTS = (100, 500)
REALLOC_GROW_MIB = ("100", "500")  # a buffer grown to this size, three times
CALLOC_ARRAYS = ("--arrays", "8", "--mib", "32")  # docs/performance.md's figure: 8 numpy.zeros arrays of 32 MiB
IMPORT_SLEEP_S = "8"
DEVICE_PAIRS = (200_000, 1_000_000)  # cudaMalloc+cudaFree pairs per thread
DEVICE_METRICS = (
    ("ns_per_pair", "ns/pair", 1),
    ("ns_per_pair_synced", "ns/pair, sync per 64", 1),
    ("driver_calls_per_1000", "driver calls/1000", 1),
    ("syncs_per_1000", "syncs/1000", 1),
    ("waste_pct", "% waste", 1),
)


@dataclass(frozen=True)
class Workload:
    name: str
    models: str  # what it stands for
    program: str  # a C program built here, or a .py script run with this Python
    args: tuple = ()  # a (quick, full) pair picks by mode; anything else is literal
    env: dict = field(default_factory=dict)
    allocators: tuple = ()  # names to run under; () = the standard set
    metrics: tuple = ()  # (JSON key, unit, scale) shown in the table
    needs_module: str = ""  # Python module without which the workload is skipped
    needs_program: str = ""  # program (on PATH, or a path) without which the workload is skipped
    quick: bool = True  # False: left out of --quick unless named with --only
    cgroup_mib: int = 0  # each run in a fresh memory cgroup limited to this (skipped where none can be made)
    timeout_s: int = RUN_TIMEOUT_S  # a run that takes longer is killed and reported FAILED


STANDARD_ALLOCATORS = ("glibc", "glibc-mmap1M", "tcmalloc", "jemalloc", "mimalloc", "forgealloc")
# forgealloc+stats: stats-overhead only; forgealloc+text (the text dump the launchers set, to a file per
# process): the real-program rows; glibc+trim (malloc_trim(0) after each unload): model-switch only.
# tcmalloc+forward (forward.c: malloc and free enter a library that only jumps on into tcmalloc): the
# small-object rows, where it shows what interposing at all costs, apart from what forgealloc adds.
ALL_ALLOCATORS = (*STANDARD_ALLOCATORS, "tcmalloc+forward", "forgealloc+stats", "forgealloc+text", "glibc+trim")
SMALL_ALLOCATORS = (*STANDARD_ALLOCATORS, "tcmalloc+forward")
# Programs nobody here wrote (real_program.py): against plain tcmalloc, with the stats dump on and off.
REAL_ALLOCATORS = ("glibc", "tcmalloc", "forgealloc", "forgealloc+text")
REAL_METRICS = (
    ("program_s", "s program", 1),
    ("program_cpu_s", "s program cpu", 1),
    ("stats_file_bytes", "KB stats files", 1 / 1024),
)
OPS = ("ops_per_s", "Mops/s", 1e-6)

WORKLOADS = (
    Workload("churn-1t", "small-object churn, 1 thread", "churn", ("1", CHURN_OPS), metrics=(OPS,),
             allocators=SMALL_ALLOCATORS),
    Workload("churn-2t", "small-object churn, 2 threads", "churn", ("2", CHURN_OPS), metrics=(OPS,),
             allocators=SMALL_ALLOCATORS),
    Workload("churn-hot-1t", "small-object churn in the caches, 1 thread", "churn", ("1", CHURN_HOT_OPS, "1024"),
             metrics=(OPS,), allocators=SMALL_ALLOCATORS),
    Workload("churn-hot-2t", "small-object churn in the caches, 2 threads", "churn", ("2", CHURN_HOT_OPS, "1024"),
             metrics=(OPS,), allocators=SMALL_ALLOCATORS),
    Workload("prodcons", "cross-thread frees through a ring", "prodcons", (PRODCONS_BLOCKS,), metrics=(OPS,),
             allocators=SMALL_ALLOCATORS),
    Workload(
        "large-repeat",
        "1-64 MiB buffers allocated, touched, freed",
        "large_repeat",
        (LARGE_ITERATIONS,),
        metrics=(("ms_per_iter", "ms/iter", 1),),
    ),
    Workload(
        "large-churn",
        "16 live blocks of 1-32 MiB, one replaced per step, touched",
        "large_churn",
        (LARGE_CHURN_STEPS, "16", "32"),
        metrics=(("ms_per_step", "ms/step", 1),),
    ),
    Workload(
        "large-churn-8x64",
        "8 live blocks of 1-64 MiB, one replaced per step, touched",
        "large_churn",
        (LARGE_CHURN_STEPS, "8", "64"),
        # glibc spends 45-60 s on each run of this one (its blocks above the
        # mmap threshold are mapped and unmapped every step): left out.
        allocators=("tcmalloc", "jemalloc", "mimalloc", "forgealloc"),
        metrics=(("ms_per_step", "ms/step", 1),),
    ),
    Workload(
        "large-churn-4t",
        "16 live blocks of 1-32 MiB shared by 4 threads, one replaced per step, touched",
        "large_churn",
        (LARGE_CHURN_STEPS, "16", "32", "4"),
        allocators=("glibc", "tcmalloc", "jemalloc", "mimalloc", "forgealloc"),
        metrics=(("ms_per_step", "ms/step", 1),),
    ),
    Workload(
        "release-burst",
        "200 x 4 MiB touched then all freed",
        "release_burst",
        metrics=(("rss_after_churn", "MB after churn", 1 / MB),),
    ),
    Workload(
        "release-idle",
        f"release-burst, then {SETTLE_S} s asleep without an allocator call",
        "release_burst",
        (str(SETTLE_S),),
        metrics=(("burst_s", "s burst", 1), ("settled_above_before", "MB above start when settled", 1 / MB)),
    ),
    Workload(
        "release-idle-small",
        f"release-idle with the 800 MiB in blocks of 1-8 KiB (no large block), {SETTLE_S} s asleep",
        "release_burst",
        (str(SETTLE_S), "small"),
        metrics=(("burst_s", "s burst", 1), ("settled_above_before", "MB above start when settled", 1 / MB)),
    ),
    Workload(
        "model-switch",
        "PyTorch CPU state dicts saved, loaded, used, dropped",
        "model_switch.py",
        ("--models", MODEL_SIZES_MIB, "--cycles", MODEL_CYCLES, "--settle", str(SETTLE_S)),
        allocators=(*STANDARD_ALLOCATORS, "glibc+trim"),
        metrics=(
            ("switch_s", "s switching", 1),
            ("rss_after_unload_max", "MB max after unload", 1 / MB),
            ("anon_settled", "MB anon settled", 1 / MB),
        ),
        needs_module="torch",
    ),
    Workload(
        "prompt-change",
        "text encoder moved to the host per prompt, freed, host still while the GPU generates",
        "prompt_change.py",
        ("--encoder", PROMPT_ENCODER_MIB, "--prompts", PROMPT_CHANGES, "--gap", PROMPT_GAP_S),
        allocators=("glibc", "tcmalloc", "jemalloc", "forgealloc"),
        metrics=(
            ("offload_ms", "ms/offload", 1),
            ("anon_gap_median", "MB anon between prompts", 1 / MB),
        ),
        needs_module="torch",
    ),
    Workload(
        "prompt-change-loaded",
        "the same after a model three times the encoder's size was built on the host and moved to the GPU",
        "prompt_change.py",
        ("--encoder", PROMPT_ENCODER_MIB, "--prompts", PROMPT_CHANGES, "--gap", PROMPT_GAP_S,
         "--loaded", PROMPT_LOADED_MIB),
        allocators=("glibc", "tcmalloc", "jemalloc", "forgealloc"),
        metrics=(
            ("offload_ms", "ms/offload", 1),
            ("offload_ms_mean", "ms/offload mean", 1),
            ("offload_faults_later", "faults/offload from the 3rd", 1),
            ("anon_gap_median", "MB anon between prompts", 1 / MB),
        ),
        needs_module="torch",
    ),
    Workload(
        "prompt-change-busy",
        "the same, prompt after prompt: the encoder freed and offloaded again 0.1 s later",
        "prompt_change.py",
        ("--encoder", PROMPT_ENCODER_MIB, "--prompts", PROMPT_BUSY_CHANGES, "--gap", "0.1", "--hold", "0.1"),
        allocators=("glibc", "tcmalloc", "jemalloc", "forgealloc"),
        metrics=(
            ("offload_ms", "ms/offload", 1),
            ("anon_gap_median", "MB anon between prompts", 1 / MB),
        ),
        needs_module="torch",
    ),
    Workload(
        "realloc-grow",
        "a bytearray grown in 1 MiB steps to 100/500 MiB, three times (realloc growth)",
        "realloc_grow.py",
        (REALLOC_GROW_MIB,),
        metrics=(("s_per_round", "s/round", 1),),
    ),
    Workload(
        "calloc-sparse",
        "8 numpy.zeros arrays of 32 MiB, one value set per 32 KiB, then (a fresh process) written whole",
        "calloc_sparse.py",
        CALLOC_ARRAYS,
        metrics=(
            ("sparse_ms", "ms sparse", 1),
            ("sparse_anon", "MB anon sparse", 1 / MB),
            ("whole_ms", "ms whole", 1),
            ("whole_anon", "MB anon whole", 1 / MB),
        ),
        needs_module="numpy",
    ),
    Workload(
        "import-torch",
        f"import torch, then {IMPORT_SLEEP_S} s asleep without an allocator call: RssAnon",
        "import_torch.py",
        (IMPORT_SLEEP_S,),
        metrics=(("import_s", "s import", 1), ("anon_settled", "MB anon settled", 1 / MB)),
        needs_module="torch",
        quick=False,  # 8 s asleep per run: about 2 minutes for the standard set even at --reps 1
    ),
    *(
        Workload(
            f"prompt-gap-{gap}s",
            f"prompt-change with {gap} s between prompts (a person's pace), prompts 3-{PROMPT_GAP_CHANGES}",
            "prompt_change.py",
            ("--encoder", PROMPT_ENCODER_MIB, "--prompts", PROMPT_GAP_CHANGES, "--gap", gap),
            allocators=("tcmalloc", "forgealloc"),
            metrics=(
                ("offload_ms_later", "ms/offload from the 3rd", 1),
                ("offload_faults_later", "faults/offload from the 3rd", 1),
                ("anon_gap_median", "MB anon between prompts", 1 / MB),
            ),
            needs_module="torch",
            quick=False,  # up to 10 minutes a run
            timeout_s=int(PROMPT_GAP_CHANGES) * int(gap) + RUN_TIMEOUT_S,
        )
        for gap in PROMPT_GAPS_S
    ),
    Workload(
        "fork-loop",
        "64/256 MiB in 4 MiB blocks touched and freed, then a fork and wait, per iteration",
        "fork_loop",
        (FORK_LOOP[0], FORK_LOOP[1]),
        metrics=(("ms_per_iter", "ms/iter", 1),),
    ),
    Workload(
        "cgroup-steps",
        "400/300 MiB live, 64/120 MiB of buffers per step, under a 512 MiB memory cgroup",
        "steps",
        STEPS,
        allocators=("glibc", "tcmalloc", "forgealloc"),
        metrics=(("step_ms_median", "ms/step", 1),),
        cgroup_mib=512,
    ),
    Workload(
        "cgroup-unload",
        "a 300 MiB model freed, then a child needs 300 MiB, under a 512 MiB memory cgroup",
        "steps",
        ("100", "4", "1", "1", "300", "300"),
        allocators=("glibc", "tcmalloc", "forgealloc"),
        metrics=(("child_ok", "child got its memory", 1),),
        cgroup_mib=512,
    ),
    Workload(
        "real-gxx",
        "g++ -O1 compiling a file that includes 34 standard headers (cc1plus: 2.6M malloc+calloc, 2.7M free)",
        "real_program.py",
        ("gxx",),
        allocators=REAL_ALLOCATORS,
        metrics=REAL_METRICS,
        needs_program="g++",
    ),
    Workload(
        "real-python-parse",
        "/usr/bin/python3 ast-parsing and walking 400 stdlib modules, PYTHONMALLOC=malloc (7.3M malloc, 8.9M free)",
        "real_program.py",
        ("python-parse",),
        env={"PYTHONMALLOC": "malloc"},
        allocators=REAL_ALLOCATORS,
        metrics=REAL_METRICS,
        needs_program="/usr/bin/python3",
    ),
    Workload(
        "real-sqlite",
        "sqlite3 on an in-memory database: 200k rows inserted, indexed, grouped, joined, updated (2.4M calls)",
        "real_program.py",
        ("sqlite",),
        allocators=REAL_ALLOCATORS,
        metrics=REAL_METRICS,
        needs_program="sqlite3",
    ),
    Workload("python", "CPython json/str/dict churn, pymalloc", "python_alloc.py", (PYTHON_ROUNDS,)),
    Workload(
        "python-malloc",
        "CPython json/str/dict churn, PYTHONMALLOC=malloc",
        "python_alloc.py",
        (PYTHON_ROUNDS,),
        env={"PYTHONMALLOC": "malloc"},
    ),
    Workload(
        "proc-start",
        "fork+exec /bin/true, allocator inherited",
        "proc_start",
        (PROC_STARTS,),
        metrics=(("per_start_us_median", "ms/start", 1e-3),),
    ),
    Workload(
        "stats-overhead",
        "churn-1t with FORGEALLOC_STATS=json vs off vs tcmalloc",
        "churn",
        ("1", CHURN_OPS),
        allocators=("tcmalloc", "forgealloc", "forgealloc+stats"),
        metrics=(OPS, ("stats_file_bytes", "KB stats file", 1 / 1024)),
    ),
    # Device pool on the stand-in runtime; "glibc" = no shim: straight to the stand-in.
    Workload(
        "device-pool-1t",
        "cudaMalloc+cudaFree pairs, PyTorch segment sizes, 1 thread",
        DEVICE_PROGRAM,
        ("1", DEVICE_PAIRS),
        env={"FAKECUDA_MEM": "8G"},
        allocators=("glibc", "forgealloc"),
        metrics=DEVICE_METRICS,
    ),
    # The pool's size as a dimension (the device as large as the pool): the
    # per-pair cost should not follow it.
    *(
        Workload(
            f"pool-1t-{size}",
            f"cudaMalloc+cudaFree pairs, PyTorch segment sizes, 1 thread, {size} pool on a {size} device",
            DEVICE_PROGRAM,
            ("1", DEVICE_PAIRS),
            env={"FAKECUDA_MEM": size, "FORGEALLOC_DEVICE_POOL_SIZE": size},
            allocators=("forgealloc",),
            metrics=DEVICE_METRICS,
        )
        for size in ("1G", "16G", "64G")
    ),
    Workload(
        "device-pool-2t-2dev",
        "cudaMalloc+cudaFree pairs, PyTorch segment sizes, 2 threads, one per device",
        DEVICE_PROGRAM,
        ("2", DEVICE_PAIRS),
        env={"FAKECUDA_MEM": "8G", "FAKECUDA_DEVICES": "2", "FA_BENCH_DEVICES": "2"},
        allocators=("glibc", "forgealloc"),
        metrics=DEVICE_METRICS,
    ),
    Workload(
        "device-pool-2t",
        "cudaMalloc+cudaFree pairs, PyTorch segment sizes, 2 threads",
        DEVICE_PROGRAM,
        ("2", DEVICE_PAIRS),
        env={"FAKECUDA_MEM": "8G"},
        allocators=("glibc", "forgealloc"),
        metrics=DEVICE_METRICS,
    ),
)


def discover_allocators(forgealloc_lib, stats_file):
    """All allocators that can run here, and one note per one that cannot.
    stats_file: where forgealloc+stats writes its dump; forgealloc+text
    writes one per process beside it."""
    allocators, notes = [], []
    allocators.append(Allocator("glibc"))
    allocators.append(Allocator("glibc-mmap1M", env={"MALLOC_MMAP_THRESHOLD_": str(GLIBC_MMAP_THRESHOLD)}))
    allocators.append(Allocator("glibc+trim", env={"FA_BENCH_TRIM": "1"}))
    for name, soname in (("tcmalloc", TCMALLOC_SONAME), ("jemalloc", JEMALLOC_SONAME), ("mimalloc", MIMALLOC_SONAME)):
        path = find_library(soname)
        if path:
            allocators.append(Allocator(name, path))
        else:
            notes.append(f"{name}: {soname} not found, skipped")
    if os.path.exists(forgealloc_lib):
        allocators.append(Allocator("forgealloc", forgealloc_lib))
        stats_env = {"FORGEALLOC_STATS": "json", "FORGEALLOC_STATS_FILE": stats_file}
        allocators.append(Allocator("forgealloc+stats", forgealloc_lib, stats_env))
        text_file = os.path.join(os.path.dirname(stats_file), "stats-%p.txt")
        text_env = {"FORGEALLOC_STATS": "text", "FORGEALLOC_STATS_FILE": text_file}
        allocators.append(Allocator("forgealloc+text", forgealloc_lib, text_env))
    else:
        notes.append(f"forgealloc: {forgealloc_lib} not found, skipped")
    return {a.name: a for a in allocators}, notes


def build_programs(out_dir, cudart_dir, tcmalloc):
    """Compile each C workload whose binary is missing or older than its sources,
    and libforward.so against tcmalloc (its path; "" = none found).
    Returns a note if the device workload cannot be built (no stand-in runtime)."""
    os.makedirs(out_dir, exist_ok=True)
    headers = [os.path.join(BENCH_DIR, h) for h in C_HEADERS]
    programs = [(p, os.path.join(BENCH_DIR, p + ".c"), headers, []) for p in C_PROGRAMS]
    note = ""
    if os.path.exists(os.path.join(cudart_dir, "libcudart.so.13")):
        flags = ["-I", DEVICE_DIR, "-L", cudart_dir, "-l:libcudart.so.13", f"-Wl,-rpath,{cudart_dir}"]
        programs.append((DEVICE_PROGRAM, os.path.join(BENCH_DIR, DEVICE_PROGRAM + ".c"),
                         [os.path.join(DEVICE_DIR, "fakecuda.h")], flags))
    else:
        note = f"device-pool: {cudart_dir}/libcudart.so.13 (the stand-in runtime) not built, skipped"
    if tcmalloc:
        programs.append((FORWARD_LIB, os.path.join(BENCH_DIR, "forward.c"), [tcmalloc],
                         ["-fPIC", "-shared", "-fno-plt", tcmalloc]))
    for program, source, deps, flags in programs:
        binary = os.path.join(out_dir, program)
        newest = max(os.path.getmtime(p) for p in [source, *deps])
        if os.path.exists(binary) and os.path.getmtime(binary) >= newest:
            continue
        cmd = [CC, *CFLAGS, "-o", binary, source, *flags]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    return note


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(ALLOCATOR_ENV_PREFIXES)}


def run_once(argv, env, preload, bin_dir, scratch, cgroup_mib=0, timeout_s=RUN_TIMEOUT_S):
    """Run argv through measure (in a fresh memory cgroup of cgroup_mib when
    that is set, killed after timeout_s); return one sample (times, peak RSS,
    metrics or failure)."""
    result_file = os.path.join(scratch, "measure.json")
    measure = [os.path.join(bin_dir, "measure"), result_file, str(timeout_s), preload]
    with limited_cgroup("memory", cgroup_mib << 20) if cgroup_mib else contextlib.nullcontext("") as d:
        if d is None:
            return {"ok": False, "failure": "no memory cgroup can be made here"}
        proc = subprocess.run(
            [*(in_cgroup(d) if d else []), *measure, *argv], env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, errors="replace"
        )
    if proc.returncode != 0:
        return {"ok": False, "failure": f"measure failed: {proc.stderr.strip()[-200:]}"}
    with open(result_file) as f:
        m = json.load(f)
    os.unlink(result_file)

    sample = {
        "wall_s": round(m["wall_s"], 4),
        "cpu_s": round(m["user_s"] + m["sys_s"], 4),
        "user_s": round(m["user_s"], 4),
        "sys_s": round(m["sys_s"], 4),
        "peak_rss_bytes": m["maxrss_kb"] * 1024,
    }
    lines = proc.stdout.strip().splitlines()
    try:
        metrics = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        metrics = None
    status = m["status"]
    if m["timed_out"]:
        failure = f"timed out after {timeout_s} s"
    elif os.WIFSIGNALED(status):
        failure = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    elif os.waitstatus_to_exitcode(status) != 0:
        failure = f"exit status {os.waitstatus_to_exitcode(status)}"
    elif not isinstance(metrics, dict):
        failure = "no JSON object on the last stdout line"
    else:
        sample["ok"] = True
        sample["metrics"] = metrics
        return sample
    last_err = proc.stderr.strip().splitlines()[-1:] or [""]
    sample["ok"] = False
    sample["failure"] = f"{failure}: {last_err[0][:200]}".rstrip(": ")
    return sample


def workload_argv(workload, mode, bin_dir):
    pick = 1 if mode == "full" else 0
    args = [str(a[pick]) if isinstance(a, tuple) else str(a) for a in workload.args]
    if workload.program.endswith(".py"):
        return [sys.executable, os.path.join(BENCH_DIR, workload.program), *args]
    return [os.path.join(bin_dir, workload.program), *args]


def round_order(n, rep):
    """The order of n allocators in repetition rep: a balanced Latin square
    (0, 1, n-1, 2, n-2, ... shifted by rep), so each allocator runs in each
    place and, over n repetitions (2n when n is odd, every other round
    reversed), after each other one.  In a VM, memory a run faults in is
    cheaper right after a run that freed much of it: a plain rotation would
    give every allocator the same predecessor in every round."""
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    order = [(k + rep) % n for k in base]
    return order[::-1] if (rep // n) % 2 else order


def run_workload(workload, allocators, reps, argv, base_env, bin_dir, scratch, warmup=True):
    """Warm-up run (discarded; none where warmup is false), then reps rounds
    over all allocators, each in the order of round_order."""
    samples = {a.name: [] for a in allocators}
    first = allocators[0]
    if warmup:
        run_once(argv, dict(base_env, **workload.env, **first.env), first.preload, bin_dir, scratch,
                 workload.cgroup_mib, workload.timeout_s)
    for rep in range(reps):
        line = []
        for allocator in (allocators[i] for i in round_order(len(allocators), rep)):
            env = dict(base_env, **workload.env, **allocator.env)
            sample = run_once(argv, env, allocator.preload, bin_dir, scratch, workload.cgroup_mib, workload.timeout_s)
            # Record the size of the stats dumps (0 = none written; one per
            # process where the path has %p) and remove them.
            stats_file = env.get("FORGEALLOC_STATS_FILE")
            if stats_file:
                written = glob.glob(stats_file.replace("%p", "*"))
                if sample["ok"]:
                    sample["metrics"]["stats_file_bytes"] = sum(os.path.getsize(f) for f in written)
                for f in written:
                    os.unlink(f)
            samples[allocator.name].append(sample)
            line.append(f"{allocator.name} {sample['wall_s']:.2f}s" if sample["ok"] else f"{allocator.name} FAILED")
        print(f"  {workload.name} rep {rep + 1}/{reps}: " + ", ".join(line), file=sys.stderr, flush=True)
    return samples


def summarize(samples):
    ok = [s for s in samples if s["ok"]]
    summary = {"runs": len(samples), "failed": len(samples) - len(ok)}
    if not ok:
        return summary
    walls = [s["wall_s"] for s in ok]
    summary.update(
        wall_s=statistics.median(walls),
        wall_min_s=min(walls),
        wall_max_s=max(walls),
        cpu_s=statistics.median(s["cpu_s"] for s in ok),
        peak_rss_bytes=statistics.median(s["peak_rss_bytes"] for s in ok),
    )
    for key in ok[0]["metrics"]:
        values = [s["metrics"].get(key) for s in ok]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            summary[key] = statistics.median(values)
        elif all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
            summary[key] = [statistics.median(column) for column in zip(*values)]
    return summary


def machine_info():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "kernel": platform.release(),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def fmt(value, spec, scale=1.0):
    return "-" if value is None else format(value * scale, spec)


def fmt_metric(value):
    """About three significant digits, without exponents."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"


def print_table(results):
    w = max([15] + [len(workload.name) + 1 for workload, _ in results])  # the workload column
    header = (
        f"{'workload':<{w}}{'allocator':<17}{'wall s':>8}  {'min-max':<15}{'x glibc':>8}{'x tcmalloc':>11}"
        f"{'cpu s':>8}{'peak MB':>9}{'after MB':>10}  metrics"
    )
    print(header)
    print("-" * len(header))
    notes = []
    for workload, rows in results:
        base = {name: rows[name].get("wall_s") for name in ("glibc", "tcmalloc") if name in rows}
        for name, s in rows.items():
            if "wall_s" not in s:
                print(f"{workload.name:<{w}}{name:<17}{'FAILED':>8}  (all {s['runs']} runs)")
                continue
            ratios = [s["wall_s"] / base[b] if base.get(b) else None for b in ("glibc", "tcmalloc")]
            extra = ", ".join(
                f"{fmt_metric(s[key] * scale)} {unit}" for key, unit, scale in workload.metrics if key in s
            )
            if s["failed"]:
                extra += f" [{s['failed']} of {s['runs']} runs FAILED]"
            print(
                f"{workload.name:<{w}}{name:<17}{s['wall_s']:>8.3f}  "
                f"{s['wall_min_s']:.3f}-{s['wall_max_s']:<9.3f}"
                f"{fmt(ratios[0], '.2f'):>8}{fmt(ratios[1], '.2f'):>11}{s['cpu_s']:>8.3f}"
                f"{s['peak_rss_bytes'] / MB:>9.1f}{fmt(s.get('rss_after_unload'), '.1f', 1 / MB):>10}  {extra}"
            )
        notes += [f"{workload.name}/{name}: {reason}" for name, s in rows.items() for reason in s["failures"]]
    for note in notes:
        print(f"FAILED {note}")


def write_plot(path, results, scratch):
    """PNG of model-switch RSS after each unload, one line per allocator."""
    series = {
        name: s["rss_series"]
        for workload, rows in results
        if workload.name == "model-switch"
        for name, s in rows.items()
        if "rss_series" in s
    }
    if not series:
        print(f"note: no model-switch data, {path} not written", file=sys.stderr)
        return
    names = list(series)
    data = os.path.join(scratch, "model-switch.dat")
    with open(data, "w") as f:
        f.write("unload " + " ".join(f'"{n}"' for n in names) + "\n")
        for i in range(max(len(v) for v in series.values())):
            row = [f"{series[n][i] / MB:.1f}" if i < len(series[n]) else "NaN" for n in names]
            f.write(f"{i + 1} " + " ".join(row) + "\n")
    script = "\n".join(
        (
            "set terminal pngcairo size 1000,600",
            f"set output '{path}'",
            "set title 'model-switch: RSS after each unload (median of runs)'",
            "set xlabel 'unload #'",
            "set xtics 1",
            "set ylabel 'RSS MB'",
            "set key outside right",
            "set grid",
            f"plot for [i=2:{len(names) + 1}] '{data}' using 1:i with linespoints title columnheader(i)",
        )
    )
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"plot written to {path}", file=sys.stderr)


def parse_args():
    names = [w.name for w in WORKLOADS]
    parser = argparse.ArgumentParser(description="Run the forgealloc allocator benchmarks.")
    parser.add_argument("--quick", action="store_true", help="small counts, about two minutes")
    parser.add_argument("--json", metavar="FILE", help="write all samples and medians as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot model-switch RSS after each unload (gnuplot)")
    names += gpu.NAMES
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=names, help="workloads: " + " ".join(names))
    parser.add_argument(
        "--allocators", nargs="+", metavar="NAME", choices=ALL_ALLOCATORS, help="only: " + " ".join(ALL_ALLOCATORS)
    )
    parser.add_argument("--reps", type=int, help="repetitions per allocator (default: 3 quick, 5 full)")
    parser.add_argument(
        "--no-warmup", action="store_true", help="no discarded first run per workload (a smoke run, numbers not judged)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE[,VAR=VALUE]",
        help="also run forgealloc with these settings as allocator NAME (e.g. forgealloc-hp1:FORGEALLOC_HUGEPAGES=1; "
        "FORGEALLOC_LIB=PATH preloads that build of the library instead, e.g. one of another commit)",
    )
    parser.add_argument("--build-dir", default=os.path.join(REPO_DIR, "build"), help="the CMake build directory")
    args = parser.parse_args()
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.plot and not shutil.which("gnuplot"):
        parser.error("--plot needs gnuplot")
    return args


def main():
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # keep stdout in order with progress on stderr
    mode = "quick" if args.quick else "full"
    reps = args.reps or REPS[mode]
    build_dir = os.path.abspath(args.build_dir)
    bin_dir = os.path.join(build_dir, "bench")
    forgealloc_lib = os.path.abspath(os.environ.get("FORGEALLOC_LIB") or os.path.join(build_dir, "libforgealloc.so"))
    workloads = [w for w in WORKLOADS if not args.only or w.name in args.only]

    machine = machine_info()
    print(f"forgealloc benchmarks, {mode} mode, {reps} reps, {machine['date']}")
    print(
        f"machine: {machine['nproc']} CPUs, {machine['cpu']}, kernel {machine['kernel']}, "
        f"load {' '.join(f'{x:.2f}' for x in machine['loadavg'])}, python {machine['python']}"
    )

    with tempfile.TemporaryDirectory(prefix="forgealloc-bench-") as scratch:
        allocators, notes = discover_allocators(forgealloc_lib, os.path.join(scratch, "stats.json"))
        wanted = args.allocators or ALL_ALLOCATORS
        if "forgealloc" in wanted and "forgealloc" not in allocators:
            print(f"error: {forgealloc_lib} not found (build it, or set FORGEALLOC_LIB)", file=sys.stderr)
            return 1
        variants = []
        for spec in args.variant:
            name, _, settings = spec.partition(":")
            env = dict(kv.split("=", 1) for kv in settings.split(",") if "=" in kv)
            lib = env.pop("FORGEALLOC_LIB", "")  # another build of the library (another commit)
            if lib and not os.path.exists(lib):
                print(f"error: variant {name}: {lib} not found", file=sys.stderr)
                return 1
            if "forgealloc" in allocators and name:
                allocators[name] = Allocator(name, os.path.abspath(lib) if lib else allocators["forgealloc"].preload, env)
                variants.append(name)
        for note in notes:
            print(f"note: {note}")
        try:
            tcmalloc = allocators["tcmalloc"].preload if "tcmalloc" in allocators else ""
            note = build_programs(bin_dir, os.path.join(build_dir, "tests", "device"), tcmalloc)
            if note:
                print(f"note: {note}")
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"error: cannot build the workloads: {e}", file=sys.stderr)
            return 1
        forward = os.path.join(bin_dir, FORWARD_LIB)
        if os.path.exists(forward):
            allocators["tcmalloc+forward"] = Allocator("tcmalloc+forward", forward)

        base_env = clean_env()
        results = []
        for workload in workloads:
            names = [n for n in (workload.allocators or STANDARD_ALLOCATORS) if n in allocators and n in wanted]
            if "forgealloc" in names:
                names += variants
            if workload.needs_module and not importlib.util.find_spec(workload.needs_module):
                print(f"note: {workload.name}: Python module {workload.needs_module} missing, skipped")
                continue
            if workload.needs_program and not shutil.which(workload.needs_program):
                print(f"note: {workload.name}: {workload.needs_program} not installed, skipped")
                continue
            if not names:
                print(f"note: {workload.name}: none of its allocators selected, skipped")
                continue
            if args.quick and not workload.quick and not args.only:
                print(f"note: {workload.name}: left out of --quick (name it with --only to run it)")
                continue
            if not workload.program.endswith(".py") and not os.path.exists(os.path.join(bin_dir, workload.program)):
                continue  # its build was skipped, with a note above
            if workload.cgroup_mib:
                with limited_cgroup("memory", workload.cgroup_mib << 20) as d:
                    if d is None:
                        print(f"note: {workload.name}: needs a memory cgroup of its own (the line above says why), "
                              "skipped")
                        continue
            argv = workload_argv(workload, mode, bin_dir)
            print(f"{workload.name}: {' '.join(argv)}", file=sys.stderr, flush=True)
            chosen = [allocators[n] for n in names]
            samples = run_workload(workload, chosen, reps, argv, base_env, bin_dir, scratch, not args.no_warmup)
            rows = {}
            for name in names:
                rows[name] = summarize(samples[name])
                rows[name]["failures"] = sorted({s["failure"] for s in samples[name] if not s["ok"]})
            results.append((workload, rows, samples))

        print()
        print_table([(w, rows) for w, rows, _ in results])
        if args.plot:
            write_plot(os.path.abspath(args.plot), [(w, rows) for w, rows, _ in results], scratch)

    gpu_report = gpu.run(args.only, args.quick, reps, build_dir, forgealloc_lib)

    if args.json:
        report = {
            "gpu": gpu_report,
            "machine": machine,
            "mode": mode,
            "reps": reps,
            "allocators": {n: {"preload": a.preload, "env": a.env} for n, a in allocators.items()},
            "notes": notes,
            "workloads": [
                {
                    "name": w.name,
                    "models": w.models,
                    "argv": workload_argv(w, mode, bin_dir),
                    "env": w.env,
                    "results": {n: {"summary": rows[n], "samples": samples[n]} for n in rows},
                }
                for w, rows, samples in results
            ],
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"JSON written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
