#!/usr/bin/env python3
"""Device tests: d_pool and friends under LD_PRELOAD=libforgealloc.so, against
the stand-in libcudart in this directory.

    run.py CASE --lib /abs/libforgealloc.so --bindir DIR --cudart-dir DIR [--vmm 0|1]

--vmm 0 makes the stand-in's devices report no virtual-memory support, so
the chunk pool serves; the default is the pool of physical pieces.
Exit 0 = pass, 1 = fail."""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import check_stats_json  # noqa: E402
from harness import check, main  # noqa: E402

A = None


def run(args, prog="d_pool", timeout=170, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("FORGEALLOC_", "FAKECUDA_", "PYTORCH_"))}
    # The stand-in, never a real libcudart the machine may have in its cache.
    e["LD_LIBRARY_PATH"] = A.cudart_dir
    e["LD_PRELOAD"] = A.lib
    e["FAKECUDA_VMM"] = A.vmm
    e.update({k: str(v) for k, v in env.items()})
    r = subprocess.run([os.path.join(A.bindir, prog)] + args, env=e, capture_output=True, text=True, timeout=timeout)
    return r


def ok(r, what):
    check(r.returncode == 0, f"{what} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def metrics(r):
    return {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)", r.stdout)}


def vmm():
    return A.vmm == "1"


# The pieces pool grows before it waits: with nothing queued here it takes
# the whole device before each sync, and idle pieces move to where blocks
# are placed (fresh host memory in the stand-in, which costs page faults):
# a smaller device and fewer operations keep the test short.
CHURN_MEM = "768M"


def case_churn():
    """Tens of thousands of mixed sizes: contents intact, few driver calls, exact counts."""
    r = ok(run(["churn", "1", "10000" if vmm() else "30000"], FAKECUDA_MEM=CHURN_MEM if vmm() else "4G"), "churn")
    m = metrics(r)
    print(r.stdout.strip())
    check(m["vmm"] == int(vmm()), f"pool kind: {m}")
    check(m["per_1000"] <= (0 if vmm() else 1.0), f"{m['per_1000']} driver cudaMalloc/cudaFree per 1000 client calls")
    # Each cycle of the quarantine (grow to the device, sync) moves idle pieces to where blocks land:
    # about one cuMem* call per malloc/free pair here (a real program frees far less of the device per sync).
    check(m["vm_per_1000"] <= 1000, f"{m['vm_per_1000']} cuMem* calls per 1000 client calls")


def case_churn_threads():
    r = ok(run(["churn", "4", "3000" if vmm() else "8000"], FAKECUDA_MEM=CHURN_MEM if vmm() else "4G"),
           "churn with 4 threads")
    print(r.stdout.strip())


def case_live_sums():
    """Stats taken while two threads allocate and free add up: allocs = pool_allocs + fallback_allocs, and each
    peak at or above its value."""
    r = ok(run(["live_sums"], FAKECUDA_MEM="1G"), "snapshots during churn")
    print(r.stdout.strip())


def case_pool_off():
    """FORGEALLOC_DEVICE_POOL_SIZE=0: every call goes to the driver, still counted."""
    r = ok(run(["churn", "1", "3000"], FAKECUDA_MEM="4G", FORGEALLOC_DEVICE_POOL_SIZE="0"), "churn, pool off")
    m = metrics(r)
    check(m["driver_malloc"] + m["driver_free"] == m["client_calls"], f"pass-through made other calls: {m}")


def case_quarantine_cap():
    # Room for every block: only the quarantine's length makes the pool synchronise.
    ok(run(["qcap"], FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_MEM="1G"), "quarantine cap")
    ok(run(["qcap_highdev"], FORGEALLOC_DEVICE_POOL_SIZE="64M", FAKECUDA_MEM="128M", FAKECUDA_DEVICES="17"),
       "quarantine cap, freed from a device beyond the pool's")


def case_quarantine_herd():
    # Threads freeing past the bound while the device takes 2 ms to synchronise: one sync at a time for it.
    r = ok(run(["qcap_herd"], FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_MEM="1G", FAKECUDA_SYNC_DELAY_MS="2"),
           "quarantine cap, many threads, slow sync")
    print(r.stdout.strip())
    r = ok(run(["qcap_fail"], FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_MEM="1G"), "quarantine cap, failing sync")
    print(r.stdout.strip())


def case_first_calls():
    # Threads whose first cudaMalloc finds another thread reserving the pool wait for it (not the driver).
    r = ok(run(["first_race"], FAKECUDA_MEM="4G", FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_DELAY_MS="100"),
           "first calls of eight threads at once")
    print(r.stdout.strip())


def case_hazard():
    # A device no larger than the pool: when blocks are quarantined, growing is impossible and the pool syncs.
    ok(run(["hazard"], FORGEALLOC_DEVICE_POOL_SIZE="64M", FAKECUDA_MEM="64M"), "reuse hazard")


def case_oom():
    ok(run(["oom"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="512M"), "out of memory")


def case_room():
    ok(run(["room"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="512M"),
       "the runtime's own device allocations get the pool's idle memory")


def case_meminfo():
    ok(run(["meminfo"], FORGEALLOC_DEVICE_POOL_SIZE="25%"), "cudaMemGetInfo")


def case_twodev():
    ok(run(["twodev"], FAKECUDA_DEVICES="2"), "two devices")
    ok(run(["capture_twodev"], FAKECUDA_DEVICES="2", FAKECUDA_MEM="128M", FORGEALLOC_DEVICE_POOL_SIZE="64M"),
       "a capture on one device through another's reset")
    ok(run(["capture_reset"], FAKECUDA_DEVICES="2", FAKECUDA_MEM="128M", FORGEALLOC_DEVICE_POOL_SIZE="64M"),
       "captures on both devices through one's reset: no use of the streams it destroyed")


def case_twodev_quarantine():
    """Two devices whose queues drain separately: a block of device 0 still written by device 1's queued work
    (peer access; a copy on device 1's stream that freed it with cudaFreeAsync) is not handed out again before
    device 1 caught up, whatever device 0 synchronised."""
    r = ok(run(["twodev_quarantine"], FAKECUDA_DEVICES="2", FAKECUDA_MEM="256M", FORGEALLOC_DEVICE_POOL_SIZE="64M"),
           "two devices' quarantine")
    print(r.stdout.strip())


def case_reset_capture():
    """cudaDeviceReset while another thread captures on another device: the pool's pieces stay mapped until the
    queued work landed (no fault), and the capture ends valid."""
    r = ok(run(["reset_capture"], FAKECUDA_DEVICES="2", FAKECUDA_MEM="256M", FORGEALLOC_DEVICE_POOL_SIZE="64M"),
           "reset during another thread's capture")
    print(r.stdout.strip())


def case_reset():
    ok(run(["reset"]), "cudaDeviceReset")


def case_reset_race():
    """cudaDeviceReset on one thread while another's first cudaMalloc reserves the pool (slow driver calls)."""
    r = ok(run(["reset_race"], FAKECUDA_DELAY_MS="50"), "cudaDeviceReset during the pool's reservation")
    print(r.stdout.strip())


def case_errors():
    r = ok(run(["errors"]), "error codes")
    lines = r.stderr.splitlines()
    check(len(lines) == 1 and "cudaIpcGetMemHandle" in lines[0] and "FORGEALLOC_DEVICE_POOL_SIZE=0" in lines[0],
          f"one line about IPC, naming the setting: {r.stderr!r}")


def case_capture():
    ok(run(["capture"], FORGEALLOC_DEVICE_POOL_SIZE="64M", FAKECUDA_MEM="96M"), "stream capture")


def case_capture_room():
    """A relaxed-mode cudaMalloc during a stream capture that the driver alone would serve (900 blocks of 2 MiB
    freed and synchronised on a 2 GiB device, then 1500 MiB) is served, with the capture valid; what cudaMemGetInfo
    calls free during the capture can be had."""
    r = ok(run(["capture_room"], FAKECUDA_MEM="2G", FORGEALLOC_DEVICE_POOL_SIZE="1G"), "capture room")
    print(r.stdout.strip())


def case_capture_calls():
    """The pool's own driver calls (reserving, giving back, growing back) while another thread begins a global
    capture leave the capture valid."""
    r = ok(run(["capture_calls"], FAKECUDA_MEM="256M", FORGEALLOC_DEVICE_POOL_SIZE="128M"), "capture calls")
    print(r.stdout.strip())


def case_refuse_capture():
    """cudaIpcGetMemHandle of a pool block during this thread's global-mode capture: refused with
    cudaErrorInvalidValue, left as the last error, the capture still valid (one line on stderr, as in errors)."""
    ok(run(["refuse_capture"]), "refusal during a capture")


def case_sticky():
    """After a kernel's illegal address (sticky: the runtime's cudaMalloc and cudaFree return it), the pool's
    cudaMalloc and cudaFree return cudaErrorIllegalAddress too: within 64 calls of a thread that never read it, at
    once at another thread's first call and after the program read it with cudaGetLastError."""
    r = ok(run(["sticky"]), "sticky error")
    print(r.stdout.strip())
    ok(run(["sticky_read"]), "sticky error read by the program")


def case_driver_api():
    """The driver API's allocations (cuMemAlloc, cuMemCreate, cuMemAllocAsync), called by name or through
    cuGetProcAddress / cudaGetDriverEntryPoint[ByVersion], get the memory the pool holds idle: 600 MiB on a 1 GiB
    device whose 512 MiB pool is idle."""
    r = ok(run(["driver_api"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="512M"), "driver API allocations")
    print(r.stdout.strip())


def case_capture_free():
    """cudaFree of pool blocks during a stream capture: refused where the runtime refuses cudaFree (the capture
    invalidated, the block kept), quarantined where it allows it."""
    ok(run(["capture_free"], FORGEALLOC_DEVICE_POOL_SIZE="64M", FAKECUDA_MEM="96M"), "cudaFree during a capture")


def case_capture_race():
    """A capture begun by one thread while another's pool synchronises: held up on its way into the sync (the
    stand-in's hook), the pool's sync must not run into the capture, which ends valid; then 20,000 captures begun
    and ended while another thread makes cudaMalloc/cudaFree pairs that the pool serves after syncs of its own."""
    r = ok(run(["capture_race", "20000"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="64M", FAKECUDA_VM_US="40"),
           "captures racing the pool's syncs")
    m = metrics(r)
    check(m.get("syncs", 0) > 100, f"the pool hardly synchronised, nothing raced: {r.stdout}")


def case_capture_crowd():
    """Syncs so dear (50 ms) that growing is the cheaper way: the pool still syncs before its quarantine outgrows
    the driver's room, and a capture begun afterwards that frees and allocates 2 GiB in 20 MiB pairs is served."""
    r = ok(run(["capture_crowd"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="64M", FAKECUDA_VM_US="40",
               FAKECUDA_SYNC_DELAY_MS="50"), "a capture after dear syncs")
    print(r.stdout.strip())


def case_pending_error():
    """An error the program left pending is what it reads after calls the pool served with internal calls
    that failed (the pool's own errors are not left in its place)."""
    for what in ("room", "malloc", "reset"):
        ok(run(["pending_error", what], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="512M"),
           f"pending error, {what}")
    ok(run(["pending_error", "reserve"], FAKECUDA_MEM="256M", FORGEALLOC_DEVICE_POOL_SIZE="512M"),
       "pending error, reserve")


def case_passthrough():
    ok(run(["passthrough"]), "pass-through counts")


def case_free_async():
    ok(run(["free_async"]), "cudaFreeAsync of cudaMalloc's blocks")


def case_free_async_refused():
    ok(run(["free_async_refused"]), "cudaFreeAsync of pool blocks on unknown and capturing streams")


def case_ranges():
    """Pool blocks under cudaPointerGetAttributes (as cudaMalloc blocks) and the driver's cuMemGetAddressRange
    (the allocation that holds them: chunk or piece, not the block)."""
    r = ok(run(["ranges"]), "pointer attributes and address ranges of pool blocks")
    print(r.stdout.strip())


def case_blind():
    with tempfile.TemporaryDirectory() as d:
        ok(run(["blind"], PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128,expandable_segments:True",
               FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/s.json"), "blind")
        doc = json.load(open(f"{d}/s.json"))
        check(doc["device"]["blind"] and "expandable_segments" in doc["device"]["blind_reason"],
              f"device.blind: {doc['device']}")


def dumps(args, **env):
    """Run d_pool with a JSON and then a text exit dump: (json document, text)."""
    with tempfile.TemporaryDirectory() as d:
        ok(run(args, FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/s.json", **env), f"{args} {env}")
        ok(run(args, FORGEALLOC_STATS="text", FORGEALLOC_STATS_FILE=f"{d}/s.txt", **env), f"{args} {env}")
        return json.load(open(f"{d}/s.json")), open(f"{d}/s.txt").read()


def case_blind_settings():
    """Both PyTorch settings that bypass cudaMalloc, under both variable names, set at start or by the
    program itself, with or without a cudaMalloc: the JSON and text dumps say blind and why; settings
    that do not bypass it are not blind."""
    blind = [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "expandable_segments"),
             ("PYTORCH_ALLOC_CONF", "max_split_size_mb:128, expandable_segments : True", "expandable_segments"),
             ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", "cudaMallocAsync"),
             ("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync,release_lock_on_cudamalloc:True", "cudaMallocAsync")]
    modes = [(["blind"], True), (["blind_nomalloc", "info"], True), (["blind_nomalloc", "none"], False)]
    for var, value, word in blind:
        for args, seen in modes:
            for how in ("environment", "setenv"):
                if how == "environment":
                    doc, text = dumps(args, **{var: value})
                elif args[0] == "blind":
                    continue  # d_pool blind has no setenv variant
                else:
                    doc, text = dumps(args + [f"{var}={value}"])
                dev = doc["device"]
                what = f"{var}={value!r} ({how}), d_pool {' '.join(args)}"
                check(dev["blind"] is True and var in dev["blind_reason"] and word in dev["blind_reason"],
                      f"{what}: JSON device {dev}")
                check(dev["cuda_seen"] is seen, f"{what}: cuda_seen {dev['cuda_seen']}")
                lines = [ln for ln in text.splitlines() if ln.startswith("  device: pool off (")]
                check(len(lines) == 1 and var in lines[0] and word in lines[0], f"{what}: text dump\n{text}")
                check(("no CUDA calls" in text) is not seen, f"{what}: text dump\n{text}")
    not_blind = [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"),
                 ("PYTORCH_ALLOC_CONF", "max_split_size_mb:512,backend:native"),
                 ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,expandable_segments:False"),
                 ("PYTORCH_ALLOC_CONF", "not_expandable_segments:True"),
                 ("PYTORCH_HIP_ALLOC_CONF", "expandable_segments:True")]
    for var, value in not_blind:
        for args in (["blind_nomalloc", "info"], ["blind_nomalloc", "none"]):
            doc, text = dumps(args, **{var: value})
            what = f"{var}={value!r}, d_pool {' '.join(args)}"
            check(doc["device"]["blind"] is False and doc["device"]["blind_reason"] is None,
                  f"{what}: JSON device {doc['device']}")
            check("pool off" not in text, f"{what}: text dump\n{text}")


def case_rtld_local():
    ok(run([], prog="d_rtld"), "framework loaded with RTLD_LOCAL")


def case_loader_lock():
    try:
        r = run([], prog="d_loader", timeout=30)
    except subprocess.TimeoutExpired:
        check(False, "a cudaMalloc in a library constructor and a first cudaMalloc on another thread deadlocked")
        return
    ok(r, "cudaMalloc in a library constructor while another thread makes the first call")


def case_fork():
    """Forks while another thread allocates, with the runtime loaded after
    the shim (its fork handler holds the runtime's lock across fork)."""
    try:
        r = run(["200"], prog="d_fork", timeout=90)
    except subprocess.TimeoutExpired:
        check(False, "fork while another thread allocated device memory deadlocked")
        return
    ok(r, "fork while another thread allocates device memory")
    m = metrics(r)
    check(m.get("forks") == 200 and m.get("worker_iters", 0) > 0, f"nothing allocated meanwhile: {r.stdout}")


def case_missing_runtime():
    r = run([], prog="d_missing")
    check(r.returncode == 0 and r.stdout.strip() == "3 3 3", f"no runtime: {r.returncode} {r.stdout!r}")
    lines = r.stderr.splitlines()
    check(len(lines) == 1 and "no CUDA runtime" in lines[0], f"one error line: {r.stderr!r}")


def case_stats_json():
    """The JSON dump holds every device key with exact values."""
    with tempfile.TemporaryDirectory() as d:
        ok(run(["churn", "1", "2000"], FAKECUDA_MEM="4G", FORGEALLOC_STATS="json",
               FORGEALLOC_STATS_FILE=f"{d}/%p.json"), "churn with a JSON dump")
        docs = [json.load(open(os.path.join(d, f))) for f in os.listdir(d)]
    check(len(docs) == 1, f"{len(docs)} dumps")
    doc = docs[0]
    problems = check_stats_json.problems(doc)
    check(not problems, f"contract: {problems}")
    dev = doc["device"]["devices"]
    check(doc["device"]["cuda_seen"] and len(dev) == 1, f"devices: {dev}")
    check(dev[0]["vmm"] == int(vmm()) and dev[0]["pool_type"] == ("pieces" if vmm() else "chunks"), f"kind: {dev}")
    if vmm():  # pieces are created as they are needed, beyond the pool's size too
        check(dev[0]["pool_bytes"] == dev[0]["pieces_mapped"] * 2 ** 21 > 0, f"pieces: {dev}")
        check(dev[0]["pieces_created"] >= dev[0]["pieces_mapped"], f"pieces: {dev}")
    else:
        check(dev[0]["pool_bytes"] == 1 << 30, f"devices: {dev}")
    check(dev[0]["allocs"] == dev[0]["frees"] > 0 and dev[0]["in_use_bytes"] == 0, f"counts: {dev[0]}")


def case_frag():
    """Fill, keep one in 32, free the rest: the largest block is the driver's, default pool."""
    r = ok(run(["frag"], FAKECUDA_MEM="1G"), "fragmentation, default pool")
    print(r.stdout.strip())


def case_frag_quarter():
    r = ok(run(["frag"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="25%"), "fragmentation, 25% pool")
    print(r.stdout.strip())


def case_packing():
    """20 MiB blocks fill the device (three to a chunk); cudaMemGetInfo's free can be allocated."""
    r = ok(run(["packing"], FAKECUDA_MEM="1G"), "packing")
    print(r.stdout.strip())


def case_meminfo_pinned():
    """Pieces: cudaMemGetInfo counts a freed small block only with its whole granule, never one a live
    neighbour pins; what it says is free can be allocated."""
    r = ok(run(["meminfo_pinned"], FAKECUDA_MEM="256M"), "cudaMemGetInfo with pinned granules")
    print(r.stdout.strip())


def case_pressure():
    """Pieces given back under pressure: only after the work queued on them."""
    ok(run(["pressure"], FAKECUDA_MEM="256M", FORGEALLOC_DEVICE_POOL_SIZE="64M"), "pressure")


def case_pairs():
    """cudaMalloc/cudaFree pairs of 20 MiB with pieces as costly to map as on an H100 (FAKECUDA_VM_US=40 per
    cuMemCreate, cuMemMap, cuMemSetAccess).  Idle device: a sync costs microseconds, so the pool syncs and reuses
    the block it quarantined instead of mapping a new one each time (on the H100 it grew to the whole card, and
    each pair cost 360 us against the driver's 88).  Behind 2 ms of queued work a sync costs more than growing:
    the pool grows, and syncs once growing has cost what a sync does.  The same when the first piece took 30 ms (a
    driver's one-time set-up, or the thread descheduled while it was timed): the estimate that made every pair sync
    is timed again, and the pool grows as before."""
    pairs = 400
    r = ok(run(["pairs", "20", str(pairs)], FAKECUDA_MEM="8G", FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_VM_US="40"),
           "pairs, idle device")
    m = metrics(r)
    print("idle:", r.stdout.strip())
    check(m["pool_bytes"] <= 256 << 20, f"the pool grew past its size on an idle device: {m}")
    check(m["syncs"] >= pairs * 9 // 10, f"the pool mapped pieces where a sync was cheaper: {m}")
    r = ok(run(["pairs", "20", str(pairs)], FAKECUDA_MEM="8G", FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_VM_US="40",
               FAKECUDA_SYNC_DELAY_MS="2"), "pairs, busy device")
    m = metrics(r)
    print("busy:", r.stdout.strip())
    check(0 < m["syncs"] <= pairs // 10, f"syncs behind queued work: {m}")
    check(m["pool_bytes"] <= 2 << 30, f"the pool took {m['pool_bytes']} bytes for one 20 MiB block at a time")
    r = ok(run(["pairs", "20", str(pairs)], FAKECUDA_MEM="8G", FORGEALLOC_DEVICE_POOL_SIZE="256M", FAKECUDA_VM_US="40",
               FAKECUDA_SYNC_DELAY_MS="2", FAKECUDA_VM_FIRST_MS="30"), "pairs, busy device, slow first piece")
    m = metrics(r)
    print("busy, slow first piece:", r.stdout.strip())
    check(m["syncs"] <= pairs // 3 and m["pieces_created"] >= 100,
          f"one slow first piece had the pool sync behind queued work from then on: {m}")
    check(m["pool_bytes"] <= 2 << 30, f"the pool took {m['pool_bytes']} bytes for one 20 MiB block at a time")


def case_giveback():
    """What the pool grew beyond FORGEALLOC_DEVICE_POOL_SIZE goes back after
    about 10 s idle, from the background thread, with no call of the
    program's, also while a stream capture is under way (the virtual-memory
    calls leave a capture valid; d_pool checks it ends valid); 5 s after
    the frees it is still there."""
    r = ok(run(["giveback", "5"], FAKECUDA_MEM="2G", FORGEALLOC_DEVICE_POOL_SIZE="256M"), "giveback")
    early = int(re.search(r"pool_bytes (\d+)", r.stdout).group(1))
    check(early > 256 << 20, f"growth given back before the idle spell: pool {early} bytes after 5 s")
    # A stream capture runs from the frees to 12 s after them: the growth goes back during it.
    r = ok(run(["giveback", "12", "capture"], FAKECUDA_MEM="2G", FORGEALLOC_DEVICE_POOL_SIZE="256M"), "giveback")
    m = re.search(r"during_capture pool_bytes (\d+) vm_calls (\d+)", r.stdout)
    check(int(m.group(1)) <= 256 << 20 and int(m.group(2)) > 0,
          f"growth not given back during a 12 s stream capture: {m.group(0)}")


def case_idle_helper():
    """Live blocks above FORGEALLOC_DEVICE_POOL_SIZE, then 10 s without a call: the helper thread wakes at most 3
    times (it looked every second); once the blocks are freed, the growth goes back after the idle spell."""
    r = ok(run(["idle_helper"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="256M"), "idle helper")
    print(r.stdout.strip())


def case_thread_retry():
    """The helper thread cannot start when the pool grows (pthread_create fails, as at a pids limit): it starts
    on a later call, and the growth still goes back."""
    r = ok(run(["thread_retry"], FAKECUDA_MEM="1G", FORGEALLOC_DEVICE_POOL_SIZE="256M"), "thread retry")
    print(r.stdout.strip())


def case_no_space():
    """Out of address space is not out of memory: the block goes to the driver without the pool releasing idle
    pieces or synchronising."""
    r = ok(run(["no_space"], FAKECUDA_MEM="256M", FORGEALLOC_DEVICE_POOL_SIZE="128M"), "out of address space")
    print(r.stdout.strip())


def case_rdma():
    """Pool blocks can be registered for GPUDirect RDMA where the device supports it with mapped memory (pieces
    created with gpuDirectRDMACapable), as cudaMalloc blocks can; without that support the pool still serves."""
    r = ok(run(["rdma", "1"]), "GPUDirect RDMA capable pieces")
    print(r.stdout.strip())
    ok(run(["rdma", "0"], FAKECUDA_GDR="0"), "no GPUDirect RDMA support")


def case_peer():
    ok(run(["peer"], FAKECUDA_DEVICES="2"), "peer access")


def case_large():
    ok(run(["large"]), "large blocks")


def case_kind():
    """The stats say which pool serves, and info says why the chunk pool does."""
    r = ok(run(["kind", A.vmm], FORGEALLOC_LOG="info"), "pool kind")
    check(("chunk pool" in r.stderr) != vmm(), f"info lines: {r.stderr!r}")


def case_kind_noentry():
    r = ok(run(["kind", "0"], FAKECUDA_VMM="noentry", FORGEALLOC_LOG="info"), "no driver entry points")
    check("no driver entry points" in r.stderr, r.stderr)


def case_kind_off():
    r = ok(run(["kind", "0"], FORGEALLOC_DEVICE_VMM="0", FORGEALLOC_LOG="info"), "FORGEALLOC_DEVICE_VMM=0")
    check("FORGEALLOC_DEVICE_VMM=0" in r.stderr, r.stderr)


def options(ap):
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--cudart-dir", required=True)
    ap.add_argument("--vmm", choices=["0", "1"], default="1")


if __name__ == "__main__":
    sys.exit(main(globals(), "A", options))
