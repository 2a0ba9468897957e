#!/usr/bin/env python3
"""GPU tests: each check runs natively and under LD_PRELOAD=libforgealloc.so, and the two runs are
compared.  gpu_check (built by nvcc against the shared libcudart) and torch_check.py need a CUDA
device; without one every case is skipped.  With --fake, the checks that need no real kernel run
against the stand-in libcudart of tests/device instead (gpu_check_fake), which proves the checks and
their comparisons on any machine.

    run.py CASE --lib /abs/libforgealloc.so --bindir DIR [--python PY] [--fake --cudart-dir DIR]

Exit 0 = pass, 1 = fail, 77 = skipped (no GPU, no PyTorch with CUDA)."""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SKIP, check, main  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
# The pool never costs a program memory the driver would have given it: within one 2 MiB piece.
PIECE = 2 * MiB
A = None


class Run:
    def __init__(self, proc, values, stats):
        self.rc, self.out, self.err = proc.returncode, proc.stdout, proc.stderr
        self.v, self.stats = values, stats

    def __getitem__(self, key):
        return self.v[key]


def env_for(shim):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("FORGEALLOC_", "FAKECUDA_", "PYTORCH_", "LD_PRELOAD"))}
    if A.fake:
        e["LD_LIBRARY_PATH"] = A.cudart_dir  # the stand-in, never a real libcudart
    if shim:
        e["LD_PRELOAD"] = A.lib
    e["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return e


def execute(cmd, shim, timeout, **extra):
    e = env_for(shim)
    e.update({k: str(v) for k, v in extra.items()})
    with tempfile.TemporaryDirectory() as d:
        if shim:
            e["FORGEALLOC_STATS"] = "json"
            e["FORGEALLOC_STATS_FILE"] = f"{d}/%p.json"
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
        stats = [json.load(open(f)) for f in glob.glob(f"{d}/*.json")]
    values = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition(" ")
        values[k] = v
    return Run(p, values, stats)


def program():
    return os.path.join(A.bindir, "gpu_check_fake" if A.fake else "gpu_check")


def need_gpu():
    """SKIP unless the CUDA runtime sees a device."""
    if not os.path.exists(program()):
        print("gpu_check was not built (no nvcc when the build was configured)")
        return SKIP
    r = execute([program(), "probe"], False, 60)
    print(r.out.strip())
    if r.rc == SKIP:
        return SKIP
    check(r.rc == 0, f"gpu_check probe: {r.rc}\n{r.out}{r.err}")
    return 0


def both(args, timeout=600, expect_rc=0, **env):
    """The check natively and under the shim; both must succeed, and the shim must have seen the
    program's cudaMalloc calls (otherwise the comparison would compare the driver with itself)."""
    native = execute([program()] + args, False, timeout, **env)
    shim = execute([program()] + args, True, timeout, **env)
    for name, r in (("natively", native), ("under the shim", shim)):
        print(f"{name}: {' '.join(f'{k}={v}' for k, v in r.v.items())}")
        check(r.rc == expect_rc, f"gpu_check {' '.join(args)} {name}: exit {r.rc}\n{r.out}{r.err}")
    seen(shim)
    return native, shim


def seen(shim):
    devs = [d for doc in shim.stats for d in doc["device"]["devices"]]
    check(devs and sum(d["allocs"] for d in devs) > 0,
          f"the shim saw no cudaMalloc (is the runtime the shared libcudart?): {[doc['device'] for doc in shim.stats]}")


def near(native, shim, key, tol=PIECE):
    a, b = int(native[key]), int(shim[key])
    check(abs(a - b) <= tol, f"{key}: {b} under the shim, {a} natively (more than {tol >> 20} MiB apart)")


def not_below(native, shim, key, tol=PIECE):
    """The shim never gives less than the driver would (within one piece).  On a GPU the
    driver pages its memory, so natively the largest block is what is free; the stand-in
    hands out contiguous ranges, where a pool of mapped pieces can do better."""
    a, b = int(native[key]), int(shim[key])
    check(b + tol >= a, f"{key}: {b} under the shim, {a} natively (the pool costs the program memory)")


def same(native, shim, *keys):
    for k in keys:
        check(native[k] == shim[k], f"{k}: {shim[k]} under the shim, {native[k]} natively")


def sizes(real, fake):
    return fake if A.fake else real


# ---- gpu_check ----------------------------------------------------------------------------------------

def case_random():
    """Sizes from 1 B to hundreds of MiB, random frees: every live block keeps its contents."""
    if need_gpu():
        return SKIP
    both(["random"] + sizes(["512", "4000"], ["32", "800"]))


def case_frag():
    """Fill with 2 MiB blocks, keep one in 32, free the rest: the largest block that then fits, and
    cudaMemGetInfo, as natively (within one 2 MiB piece)."""
    if need_gpu():
        return SKIP
    native, shim = both(["frag", "2", "32"])
    same(native, shim, "total_bytes")
    near(native, shim, "free_bytes")
    not_below(native, shim, "largest_bytes")
    if A.fake:
        check(int(shim["largest_bytes"]) + PIECE >= int(shim["free_bytes"]),
              f"largest block {shim['largest_bytes']} under the shim, {shim['free_bytes']} free")
    else:
        near(native, shim, "largest_bytes")
    near(native, shim, "largest_bytes_all_freed", 64 * MiB)


def case_hazard():
    """A block freed while a kernel on a non-blocking stream still writes it is not handed out before
    that kernel ends."""
    if need_gpu():
        return SKIP
    native, shim = both(["hazard"] + sizes(["64", "300", "8"], ["16", "0", "8"]))
    same(native, shim, "reused_while_running", "bad_words")


def case_threads():
    """Threads allocating, writing and checking at once."""
    if need_gpu():
        return SKIP
    both(["threads"] + sizes(["8", "3000", "4"], ["4", "150", "2"]))


def case_oom():
    """Exhaustion: the same number of blocks, the same bytes, the same errors, and the same
    cudaGetLastError afterwards."""
    if need_gpu():
        return SKIP
    native, shim = both(["oom", "256", "2"])
    same(native, shim, "big_blocks", "error_big", "peek_after_big", "last_after_big", "last_after_big_again",
         "error_small", "last_after_small", "error_huge", "last_after_huge", "realloc_all")
    near(native, shim, "total_bytes")


def case_meminfo():
    """cudaMemGetInfo around the pool: what an allocation takes and its free gives back, as natively."""
    if need_gpu():
        return SKIP
    native, shim = both(["meminfo"] + sizes(["512"], ["128"]))
    same(native, shim, "total")
    for k in ("free_start", "drop_small", "drop_big", "back_big", "free_end"):
        near(native, shim, k)


def case_capture():
    """cudaMalloc inside a stream capture (relaxed mode, as PyTorch does), the captured work run as a
    graph, allocation after the capture."""
    if need_gpu():
        return SKIP
    native, shim = both(["capture"])
    same(native, shim, "begin", "relaxed_malloc", "captured_fill", "end", "graph_run", "graph_bad_words",
         "malloc_after")


def case_capture_global():
    """cudaMalloc where the runtime forbids it (a global-mode capture on this thread): the same error,
    the capture invalidated the same way."""
    if need_gpu():
        return SKIP
    native, shim = both(["capture"])
    same(native, shim, "begin_global", "global_malloc", "end_global", "last_error_global")


def case_capture_free():
    """cudaFree of a cudaMalloc block during a stream capture, in each combination of capture mode and
    thread mode: the same answer, last error and capture state as natively; a refused block kept."""
    if need_gpu():
        return SKIP
    native, shim = both(["capture_free"])
    for name in ("global", "thread_local", "relaxed_capture", "relaxed_thread"):
        same(native, shim, *(f"{name}_{k}" for k in ("begin", "free", "last_error", "status", "end",
                                                     "last_error_end", "kept_bad_words")))
        check(shim[f"{name}_kept_bad_words"] in ("-1", "0"), f"{name}: a refused block lost its contents")


def case_reset():
    """cudaDeviceReset with blocks live and freed: allocation works afterwards, no error left."""
    if need_gpu():
        return SKIP
    native, shim = both(["reset"])
    same(native, shim, "reset", "allocs_after_reset_ok", "bad_words", "last_error")


def case_capture_room():
    """A relaxed-mode cudaMalloc during a global capture, after 80% of the memory was allocated, freed and
    synchronised (the pool holds it idle): a block of 70% is served as natively, and what cudaMemGetInfo calls
    free during the capture can be had."""
    if need_gpu():
        return SKIP
    native, shim = both(["capture_room"])
    same(native, shim, "filled", "begin", "big_malloc", "free_during_capture_can_be_had", "status", "end")
    check(shim["big_malloc"] == "0", f"the capture's request failed under the shim: {shim['big_malloc']}")


def case_capture_race():
    """Another thread in relaxed mode allocates and frees (the pool grows, reuses, gives back) while captures
    begin and end: none is invalidated, natively or under the shim."""
    if need_gpu():
        return SKIP
    native, shim = both(["capture_race", sizes("2000", "300")])
    same(native, shim, "invalidated")
    check(shim["invalidated"] == "0", f"{shim['invalidated']} captures invalidated under the shim")


def case_capture_refuse():
    """cudaIpcGetMemHandle (the pool refuses it for its blocks) and cudaMalloc(NULL, 1) during this thread's
    global capture: the capture ends as natively (null_malloc/null_status show the runtime's own order of
    checks)."""
    if need_gpu():
        return SKIP
    native, shim = both(["capture_refuse"])
    same(native, shim, "begin", "ipc_status", "ipc_end", "begin2", "null_malloc", "null_status", "null_end")


def case_sticky():
    """After a kernel's illegal address: cudaMalloc and cudaFree return the sticky error under the shim as
    natively (a new thread's first call, within 64 calls, after the error was read), with the same last
    errors."""
    if need_gpu():
        return SKIP
    native, shim = both(["sticky"])
    same(native, shim, "launch", "sync", "new_thread_malloc", "failed_within_64", "malloc_error", "read",
         "malloc_after_read", "peek_after_malloc", "free", "last_error_after_free")


def case_driver_alloc():
    """cuMemAlloc through cudaGetDriverEntryPointByVersion of 70% of the memory, after 60% was allocated, freed
    and synchronised (the pool holds it idle): served as natively."""
    if need_gpu():
        return SKIP
    native, shim = both(["driver_alloc"])
    same(native, shim, "cu_mem_alloc", "last_error")
    check(shim["cu_mem_alloc"] == "0", f"cuMemAlloc under the shim: {shim['cu_mem_alloc']}")


# ---- PyTorch ------------------------------------------------------------------------------------------

def torch_both(name, timeout=900):
    if A.fake:
        print("PyTorch cases need a real GPU")
        return None
    cmd = [A.python, os.path.join(HERE, "torch_check.py"), name]
    native = execute(cmd, False, timeout)
    if native.rc == SKIP:
        print(native.out.strip())
        return None
    shim = execute(cmd, True, timeout)
    for label, r in (("natively", native), ("under the shim", shim)):
        print(f"{label}: {' '.join(f'{k}={v}' for k, v in r.v.items())}")
        check(r.rc == 0, f"torch_check {name} {label}: exit {r.rc}\n{r.out}{r.err[-3000:]}")
    seen(shim)
    return native, shim


def case_torch_train():
    """A deterministic training run gives the same loss at every step with and without the shim."""
    r = torch_both("train")
    if not r:
        return SKIP
    native, shim = r
    losses = sorted(k for k in native.v if k.startswith("loss_"))
    check(losses, "no losses printed")
    same(native, shim, *losses)


def case_torch_graphs():
    """CUDA graphs capture (allocating inside the capture) and replay as eager execution computes."""
    if not torch_both("graphs"):
        return SKIP


def case_torch_dataloader():
    """A DataLoader forks its workers after CUDA is initialised."""
    r = torch_both("dataloader")
    if not r:
        return SKIP
    same(*r, "batches_sum", "device_sum")


def case_torch_frag():
    """PyTorch fragments the card (1 MiB tensors, one in 64 kept, empty_cache): the largest tensor that
    then fits, and mem_get_info, as natively (within one 2 MiB piece)."""
    r = torch_both("frag", timeout=1800)
    if not r:
        return SKIP
    native, shim = r
    same(native, shim, "total_bytes")
    near(native, shim, "free_bytes")
    near(native, shim, "largest_bytes")


def options(ap):
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--cudart-dir")


def validate(ap, a):
    if a.fake and not a.cudart_dir:
        ap.error("--fake needs --cudart-dir")


if __name__ == "__main__":
    sys.exit(main(globals(), "A", options, validate))
