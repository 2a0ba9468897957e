#!/usr/bin/env python3
"""Preload tests: real programs run under LD_PRELOAD=libforgealloc.so.

    run.py CASE --lib /abs/libforgealloc.so --bindir DIR [--python PY]

Each case is a function below; ctest runs one case per test.  Exit status
0 = pass, 1 = fail (with the reason printed), 77 = skipped (ctest's
SKIP_RETURN_CODE), e.g. PyTorch not installed."""
import difflib
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import check_stats_json  # noqa: E402
from cgroups import in_cgroup, limited_cgroup  # noqa: E402
from harness import DEFAULT_PYTHON, SKIP, Failure, check, main  # noqa: E402

ARGS = None


def base_env(**extra):
    """The environment of a test run: no inherited FORGEALLOC_* or preloads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEALLOC_") and k != "LD_PRELOAD"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, preload=True, env=None, timeout=300, cwd=None, input=None):
    env = dict(env if env is not None else base_env())
    if preload:
        env["LD_PRELOAD"] = ARGS.lib
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          input=input, errors="replace")


def prog(name):
    return os.path.join(ARGS.bindir, name)


def dumps(directory):
    """Every stats file in a directory, by pid."""
    out = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        with open(path) as f:
            doc = json.load(f)
        out[doc["pid"]] = doc
    return out


def one_dump(cmd, **env):
    """Run cmd with a JSON dump to a %p file; return (result, doc)."""
    with tempfile.TemporaryDirectory() as d:
        r = run(cmd, env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json", **env))
        docs = dumps(d)
        leftovers = [p for p in os.listdir(d) if not p.endswith(".json")]
    check(r.returncode == 0, f"{cmd} exited {r.returncode}: {r.stderr[-2000:]}")
    check(not leftovers, f"temporary files left behind: {leftovers}")
    check(len(docs) == 1, f"expected one stats file, got {len(docs)}")
    doc = next(iter(docs.values()))
    problems = check_stats_json.problems(doc)
    check(not problems, f"stats JSON breaks the contract: {problems}")
    return r, doc


def calls_diff(a, b):
    return {k: b["host"]["calls"][k] - a["host"]["calls"][k] for k in a["host"]["calls"]}


# ---- counts -----------------------------------------------------------------

def case_counts():
    """N calls of each malloc-family function show up exactly in the JSON."""
    n = 1000
    _, zero = one_dump([prog("p_calls"), "calls", "0"])
    _, some = one_dump([prog("p_calls"), "calls", str(n)])
    diff = calls_diff(zero, some)
    expected = dict(malloc=2 * n, calloc=2 * n, realloc=2 * n, reallocarray=n, free=11 * n, memalign=2 * n,
                    posix_memalign=2 * n, aligned_alloc=2 * n, valloc=n, pvalloc=n, new=0, delete=0)
    check(diff == expected, f"call counts differ: got {diff}, expected {expected}")
    per_iter = 32 + 5 + 64 + 6 + 24 + 4000 + 64 + 100 + 100 + 512 + 10 + 10  # refused alignments request nothing
    got = some["host"]["bytes_requested"] - zero["host"]["bytes_requested"]
    check(got == n * per_iter, f"bytes_requested grew by {got}, expected {n * per_iter}")


def case_threads():
    """4 threads making 250 mallocs each add exactly 1000."""
    _, zero = one_dump([prog("p_calls"), "threads", "0"])
    _, some = one_dump([prog("p_calls"), "threads", "1000"])
    diff = calls_diff(zero, some)
    check(diff["malloc"] == 1000 and diff["free"] == 1000, f"thread counts: {diff}")


def case_large_handoff():
    """A thread whose calls took the fast paths before the process made its
    first large block frees large blocks another thread allocated later, half
    of them grown by realloc into mappings of their own: each is known as
    large (a grown one freed as tcmalloc's would abort), counted once, and
    the mappings are gone at exit."""
    r, doc = one_dump([prog("p_calls"), "handoff", "20"])
    check(r.returncode == 0 and r.stderr == "", f"p_calls handoff exited {r.returncode}: {r.stderr[-500:]}")
    check(doc["host"]["grown_bytes"] == 0, f"grown blocks still mapped at exit: {doc['host']['grown_bytes']}")
    check(doc["host"]["calls"]["realloc"] == 10, f"realloc calls: {doc['host']['calls']}")


def case_fork():
    """A forked child reports its own numbers, to its own file."""
    def go(a, b):
        with tempfile.TemporaryDirectory() as d:
            r = run([prog("p_calls"), "fork", str(a), str(b)],
                    env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json"))
            check(r.returncode == 0, f"p_calls fork exited {r.returncode}: {r.stderr}")
            docs = list(dumps(d).values())
        check(len(docs) == 2, f"expected parent and child stats files, got {len(docs)}")
        parent = [x for x in docs if not x["forked"]]
        child = [x for x in docs if x["forked"]]
        check(len(parent) == 1 and len(child) == 1, "one parent and one forked child expected")
        check(child[0]["ppid"] == parent[0]["pid"], "child's ppid is not the parent")
        return parent[0], child[0]
    p0, c0 = go(0, 0)
    p1, c1 = go(300, 500)
    dp, dc = calls_diff(p0, p1), calls_diff(c0, c1)
    check(dp["malloc"] == 300 and dp["free"] == 300, f"parent counts: {dp}")
    check(dc["malloc"] == 500 and dc["free"] == 500, f"child counts: {dc}")


# ---- semantics ----------------------------------------------------------------

def case_cxx():
    r = run([prog("p_cxx")])
    check(r.returncode == 0, f"p_cxx failed ({r.returncode}): {r.stderr}")


def case_cxx_replaced():
    """A program that replaces only the basic operator new/delete (plain and
    aligned) with a pool of its own: every other form must reach them, as
    libstdc++'s do, and none is served (or counted) by forgealloc."""
    r = run([prog("p_opnew")], preload=False)
    check(r.returncode == 0 and r.stdout == "ok\n", f"p_opnew without the shim ({r.returncode}): {r.stderr}")
    r = run([prog("p_opnew")])
    check(r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "",
          f"p_opnew under the shim ({r.returncode}): {r.stderr[-500:]}")
    _, doc = one_dump([prog("p_opnew")])
    calls = doc["host"]["calls"]
    check(calls["new"] == 0 and calls["delete"] == 0, f"replaced forms served by forgealloc: {calls}")


def case_mixes():
    # The checks are glibc's own semantics: they hold without the shim too.
    r = run([prog("p_mixes"), "native"], preload=False)
    check(r.returncode == 0 and r.stderr == "", f"p_mixes without the shim failed ({r.returncode}): {r.stderr}")
    r = run([prog("p_mixes")])
    check(r.returncode == 0, f"p_mixes failed ({r.returncode}): {r.stderr}")
    check(r.stderr == "", f"p_mixes printed: {r.stderr}")
    # Overflowing calloc and reallocarray are counted as calls, with no bytes.
    _, doc = one_dump([prog("p_mixes")])
    check(doc["host"]["bytes_requested"] < 1 << 40,
          f"bytes_requested {doc['host']['bytes_requested']}: an overflowing size was added")


def exports(path):
    """The names of the dynamic symbols path defines."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def libc_malloc_family(versions=False):
    """The malloc-family names glibc exports (but its private __libc_reallocarray); with versions, as nm -D
    lists them: name@@VERSION (the default) or name@VERSION."""
    libc = subprocess.run(["sh", "-c", "ldd /bin/true | awk '/libc.so/{print $3}'"], capture_output=True,
                          text=True).stdout.strip()
    family = re.compile(r"^(__libc_)?(malloc|calloc|realloc|reallocarray|free|cfree|memalign|posix_memalign|"
                        r"aligned_alloc|valloc|pvalloc|mallinfo2?|mallopt|malloc_(trim|stats|info|usable_size)|"
                        r"free_sized|free_aligned_sized)$")
    out = subprocess.run(["nm", "-D", "--defined-only", libc], capture_output=True, text=True, check=True).stdout
    found = {line.split()[-1] for line in out.splitlines() if family.match(line.split()[-1].split("@")[0])}
    found = {s for s in found if not s.startswith("__libc_reallocarray@")}  # GLIBC_PRIVATE
    return found if versions else {s.split("@")[0] for s in found}


def case_symbols():
    """Our exports cover glibc's malloc family and libstdc++'s operators."""
    want = libc_malloc_family()
    stdcxx = subprocess.run([ARGS.python, "-c", "import ctypes.util; print(ctypes.util.find_library('stdc++'))"],
                            capture_output=True, text=True).stdout.strip()
    stdcxx_path = next(iter(glob.glob(f"/usr/lib/*/{stdcxx}") + glob.glob(f"/lib/*/{stdcxx}")), None)
    check(stdcxx_path, "libstdc++ not found")
    ops = re.compile(r"^_Z(nw|na|dl|da)[mPv].*")
    want |= {s for s in exports(stdcxx_path) if ops.match(s)}
    ours = exports(ARGS.lib)
    missing = sorted(want - ours)
    check(len([s for s in want if ops.match(s)]) == 20, "expected 20 operator new/delete variants in libstdc++")
    check(not missing, f"not exported by libforgealloc.so: {missing}")
    check("__posix_memalign" in ours, "__posix_memalign not exported")


# ---- lookups through handles -----------------------------------------------------

def case_lookup_libc():
    """Through a handle on libc (by soname, by path, or libm's, whose dependencies reach libc), each of libc's
    malloc-family names is the function the program's own call binds to, also with dlvsym; other names stay
    glibc's, also where another preloaded library wraps them; blocks cross between the two sides; errno and
    dlerror() as without the shim.  The same checks pass without the shim."""
    nolibc = os.path.join(ARGS.bindir, "libp_lookup_nolibc.so")
    cmd = [prog("p_lookup"), "libc", nolibc] + sorted(libc_malloc_family(versions=True))
    wrapper = os.path.join(ARGS.bindir, "libp_lookup_lib.so")
    for preload in (None, ARGS.lib, f"{ARGS.lib}:{wrapper}", f"{wrapper}:{ARGS.lib}"):
        r = run(cmd, preload=False, env=base_env(**({"LD_PRELOAD": preload} if preload else {})))
        check(r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "",
              f"LD_PRELOAD={preload}: status {r.returncode}: {r.stdout[-3000:]}{r.stderr[-1000:]}")


def case_lookup_next():
    """Another preloaded library that finds the next definition of the libc functions it wraps with
    dlsym(RTLD_NEXT) and dlvsym(RTLD_NEXT) finds the right one in either order of LD_PRELOAD, as does the
    program; RTLD_DEFAULT is unchanged."""
    wrapper = os.path.join(ARGS.bindir, "libp_lookup_lib.so")
    for order, preload in (("alone", wrapper), ("lib-first", f"{wrapper}:{ARGS.lib}"),
                           ("forgealloc-first", f"{ARGS.lib}:{wrapper}")):
        r = run([prog("p_lookup"), "next", order], preload=False, env=base_env(LD_PRELOAD=preload))
        check(r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "",
              f"{order}: status {r.returncode}: {r.stdout[-3000:]}{r.stderr[-1000:]}")


LOOKUP_PY = r"""
import ctypes, json, os
libc = ctypes.CDLL("libc.so.6")
me = ctypes.CDLL(None)  # the program's own bindings
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Mallinfo2
for lib in (libc, me):
    lib.malloc.restype = ctypes.c_void_p
    lib.malloc.argtypes = [ctypes.c_size_t]
    lib.free.argtypes = [ctypes.c_void_p]
    lib.malloc_trim.argtypes = [ctypes.c_size_t]
libc.strdup.restype = ctypes.c_void_p
libc.strdup.argtypes = [ctypes.c_char_p]

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

n = 256 << 20
before = libc.mallinfo2().uordblks
p = me.malloc(n)
ctypes.memset(p, 1, n)
grew = libc.mallinfo2().uordblks - before
held = rss()
libc.free(p)  # made by the program's malloc, freed through the handle
trimmed = libc.malloc_trim(0)
dropped = held - rss()
me.free(libc.malloc(1000))
libc.free(libc.malloc(1000))
libc.free(libc.strdup(b"made by libc's strdup"))
print(json.dumps(dict(grew=grew, trimmed=trimmed, dropped=dropped)))
"""


def case_lookup_python():
    """ctypes.CDLL("libc.so.6") (ComfyUI custom nodes, InvokeAI): mallinfo2 reports the shim's numbers,
    malloc_trim(0) returns the freed memory (counted as a release on request), and blocks made by one side are
    freed by the other."""
    n = 256 << 20
    r, doc = one_dump([ARGS.python, "-c", LOOKUP_PY], FORGEALLOC_RELEASE_THRESHOLD="1G")
    got = json.loads(r.stdout)
    check(got["grew"] >= n, f"mallinfo2().uordblks grew by {got['grew']} over a {n}-byte malloc")
    check(got["trimmed"] == 1, f"malloc_trim(0) returned {got['trimmed']}")
    check(got["dropped"] >= n // 2, f"RSS fell by {got['dropped']} bytes after free and malloc_trim(0)")
    request = doc["host"]["release"]["request_bytes"]
    check(request >= n // 2, f"host.release.request_bytes {request}")


def case_lookup_tail():
    """dlsym and dlvsym continue in the next definition by a jump, never by a call: glibc's reads its return
    address to know whose RTLD_NEXT and RTLD_DEFAULT it serves.  Each ends in an indirect jump, returns nowhere
    by itself, and leaves the stack as it found it."""
    if not shutil.which("objdump"):
        print("objdump not found - skipped")
        return SKIP
    for name in ("dlsym", "dlvsym"):
        out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={name}", ARGS.lib],
                             capture_output=True, text=True, check=True).stdout
        body = out.split(f"<{name}>:\n", 1)[1].split("\n\n", 1)[0] if f"<{name}>:\n" in out else ""
        code = [line.split("\t", 1)[1].split(None, 1) for line in body.splitlines() if "\t" in line]
        ops = [c[0] for c in code]
        check(ops, f"{name} is not defined in the library")
        last = " ".join(code[-1])
        check(re.fullmatch(r"(jmp\s+\*%\w+|br\s+x1[67])", last), f"{name} ends in {last!r}, not an indirect jump")
        check(not any(op.startswith("ret") for op in ops), f"{name} returns by itself: {ops}")
        if ops[0].startswith(("push", "endbr")):  # x86-64: what is pushed is popped before the jump
            check(sum(op.startswith("push") for op in ops) == sum(op.startswith("pop") for op in ops),
                  f"{name} leaves the stack moved: {ops}")


# ---- release policy and introspection -------------------------------------------

def settled(out, who=""):
    m = re.search(who + r"rss_settled_mb (\d+) after_ms (\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def ended_mb(out, who=""):
    """RSS in MB at the end of the last burst of `who`, or None."""
    m = re.findall(who + r"rss_end_mb (\d+)", out)
    return int(m[-1]) if m else None


def zero_resident_kib(pid):
    """KiB of anonymous private pages of a process that are resident and hold only zeros."""
    zero, page = 0, os.sysconf("SC_PAGE_SIZE")
    blank = bytes(page)
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb", 0) as pagemap, \
            open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            f = line.split()
            name = f[5] if len(f) > 5 else ""
            if f[1] != "rw-p" or (name and name != "[heap]"):
                continue
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            pagemap.seek(lo // page * 8)
            entries = pagemap.read((hi - lo) // page * 8)
            for i in range(len(entries) // 8):
                entry = int.from_bytes(entries[i * 8:i * 8 + 8], "little")
                if not entry >> 63 & 1:
                    continue  # not resident
                mem.seek(lo + i * page)
                if mem.read(page) == blank:
                    zero += page // 1024
    return zero


def minor_faults(pid):
    """The page faults a process has taken that needed no I/O (/proc/PID/stat field 10)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def case_start_pages():
    """The pages tcmalloc clears as it starts (about 3 MB, already zeros) are
    never faulted in: a C tool and Python take hundreds of page faults fewer
    than under tcmalloc alone and hold megabytes fewer resident zero pages,
    and still answer and exit normally."""
    tc = system_lib("libtcmalloc_minimal.so.4")
    check(tc, "libtcmalloc_minimal.so.4 not found")
    # Each program answers a line once it runs (past every constructor),
    # then waits on its stdin.
    programs = (["/bin/cat"], [ARGS.python, "-c", "import sys; print(sys.stdin.readline(), end='', flush=True); "
                                                   "sys.stdin.read()"])
    for cmd in programs:
        held, faults = {}, {}
        for preload in (tc, ARGS.lib):
            p = subprocess.Popen(cmd, env=base_env(LD_PRELOAD=preload), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            try:
                p.stdin.write("ready\n")
                p.stdin.flush()
                check(p.stdout.readline() == "ready\n", f"{cmd} under {preload} did not answer")
                faults[preload] = minor_faults(p.pid)
                held[preload] = zero_resident_kib(p.pid)
                p.stdin.close()
                check(p.wait(timeout=60) == 0, f"{cmd} under {preload} exited {p.returncode}")
            finally:
                p.kill()
                p.wait()
        print(f"{os.path.basename(cmd[0])}: resident zero pages {held[tc]} KiB under tcmalloc, "
              f"{held[ARGS.lib]} KiB under the shim; page faults {faults[tc]} and {faults[ARGS.lib]}")
        check(held[tc] >= 2048, f"{cmd}: tcmalloc alone holds only {held[tc]} KiB of zero pages: nothing to show")
        check(held[ARGS.lib] <= held[tc] - 2048, f"{cmd}: {held[ARGS.lib]} KiB of zero pages held, "
              f"{held[tc]} under tcmalloc alone: its start pages were not given back")
        check(faults[ARGS.lib] <= faults[tc] - 500, f"{cmd}: {faults[ARGS.lib]} page faults under the shim, "
              f"{faults[tc]} under tcmalloc alone: its start pages were faulted in")
    # Loaded late (dlopen), the library serves nothing and leaves memory
    # alone: tcmalloc's cleared root (1 MB of its BSS) stays resident.
    code = (f"import ctypes, sys; ctypes.CDLL({ARGS.lib!r}); print(sys.stdin.readline(), end='', flush=True); "
            "sys.stdin.read()")
    p = subprocess.Popen([ARGS.python, "-c", code], env=base_env(FORGEALLOC_LOG="error"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        p.stdin.write("ready\n")
        p.stdin.flush()
        check(p.stdout.readline() == "ready\n", "python with the library loaded by dlopen did not answer")
        late = zero_resident_kib(p.pid)
        p.stdin.close()
        check(p.wait(timeout=60) == 0, f"python with the library loaded by dlopen exited {p.returncode}")
    finally:
        p.kill()
        p.wait()
    print(f"loaded by dlopen: resident zero pages {late} KiB")
    check(late >= 1024, f"loaded by dlopen, the library still gave back zero pages ({late} KiB left)")


def case_calloc():
    """A large calloc leaves fresh memory untouched (it reads as zeros), as
    glibc's calloc does and tcmalloc's does not, and clears every byte of
    memory it hands out again: with huge pages on and off, with memory
    returned at once, from two threads.  With FORGEALLOC_SPARSE_CALLOC=0 or
    tcmalloc's hugetlbfs allocator named, every block is cleared.  A smaller
    calloc is tcmalloc's, through its own memset: the start fill has ended
    (startfill.h), so it writes every page."""
    tc = system_lib("libtcmalloc_minimal.so.4")
    check(tc, "libtcmalloc_minimal.so.4 not found")

    def fresh_kib(r, what):
        check(r.returncode == 0, f"p_calloc {what} exited {r.returncode}: {r.stderr[-2000:]}")
        m = re.search(r"small_resident_kib (\d+)\nfresh_resident_kib (\d+)", r.stdout)
        check(m, f"p_calloc {what} printed no small_resident_kib and fresh_resident_kib: {r.stdout!r}")
        check(int(m.group(1)) == 3 * 1024, f"p_calloc {what}: a 3 MiB calloc has {m.group(1)} KiB resident: "
              "tcmalloc's memset is still the start fill")
        return int(m.group(2))

    full = 64 * 1024
    plain = fresh_kib(run([prog("p_calloc")], preload=False, env=base_env(LD_PRELOAD=tc)), "under tcmalloc")
    check(plain >= full * 9 // 10, f"under tcmalloc alone a fresh 64 MiB calloc has only {plain} KiB resident: "
          "nothing to show")
    for extra in ({}, {"FORGEALLOC_HUGEPAGES": "1"}, {"FORGEALLOC_RELEASE_DELAY": "0"}):
        r = run([prog("p_calloc")], env=base_env(**extra))
        kib = fresh_kib(r, f"under the shim {extra}")
        check(kib <= 1024, f"{extra}: a fresh 64 MiB calloc has {kib} KiB resident (tcmalloc alone: {plain})")
        check(r.stderr == "", f"{extra}: printed {r.stderr!r}")
    with tempfile.TemporaryDirectory() as d:
        for extra in ({"TCMALLOC_MEMFS_MALLOC_PATH": d}, {"FORGEALLOC_SPARSE_CALLOC": "0"}):
            kib = fresh_kib(run([prog("p_calloc")], env=base_env(**extra)), f"with {extra}")
            check(kib >= full * 9 // 10, f"with {extra} a fresh calloc was left untouched ({kib} KiB)")


HUGEPAGE_PROBE = r"""
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.calloc.restype = ctypes.c_void_p
huge = 2 << 20
def advised(p):
    a = (p + huge - 1) & ~(huge - 1)  # the block's first 2 MiB-aligned address
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                lo, hi = (int(x, 16) for x in first.split("-"))
                inside = lo <= a < hi
            elif inside and line.startswith("VmFlags:"):
                return int("hg" in line.split())
    return -1
c = libc.calloc(1, 16 << 20)  # first, so it lies where nothing was advised
m = libc.malloc(16 << 20)
print(f"malloc {advised(m)} calloc {advised(c)}")
"""


def case_hugepages():
    """FORGEALLOC_HUGEPAGES=1 asks for transparent huge pages on a large
    malloc block (the 'hg' flag of its mapping) and never on a calloc block;
    by default nothing is asked.  Only where the kernel's mode is madvise:
    in the other modes the advice would change nothing, and none is given."""
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        if "[madvise]" not in f.read():
            print("transparent huge pages are not in madvise mode here - skipped")
            return SKIP
    for extra, want in (({}, "malloc 0 calloc 0"), ({"FORGEALLOC_HUGEPAGES": "1"}, "malloc 1 calloc 0")):
        r = run([ARGS.python, "-c", HUGEPAGE_PROBE], env=base_env(**extra))
        check(r.returncode == 0 and r.stderr == "", f"{extra}: exit {r.returncode}: {r.stderr[-1000:]}")
        check(r.stdout.strip() == want, f"{extra}: huge-page advice (1 = asked) {r.stdout.strip()!r}, expected {want!r}")


def case_release_burst():
    """800 MB freed in 4 MB blocks goes back to the OS within the delay while
    the process sleeps without an allocator call (tcmalloc alone keeps it)."""
    r = run([prog("p_release"), "burst", "6"])
    check(r.returncode == 0, r.stderr)
    got = settled(r.stdout)
    check(got is not None, f"RSS never came within 64 MB of its start in 6 s of sleep: {r.stdout}")
    check(got[1] <= 6000, f"settled after {got[1]} ms")
    # Control: with a threshold above the burst nothing is released, so the
    # figure above is the policy's doing.
    r = run([prog("p_release"), "burst", "3"], env=base_env(FORGEALLOC_RELEASE_THRESHOLD="2G"))
    kept = int(re.search(r"rss_end_mb (\d+)", r.stdout).group(1))
    check(kept >= 700, f"with FORGEALLOC_RELEASE_THRESHOLD=2G RSS fell to {kept} MB; the control is broken")
    # FORGEALLOC_RELEASE_DELAY=0: returned at once, on the freeing calls.
    r = run([prog("p_release"), "burst"], env=base_env(FORGEALLOC_RELEASE_DELAY="0"))
    now = int(re.search(r"rss_after_free_mb (\d+)", r.stdout).group(1))
    check(now <= 100, f"with FORGEALLOC_RELEASE_DELAY=0 RSS right after the frees is {now} MB, expected <= 100")
    # The stats say which path returned it.
    _, doc = one_dump([prog("p_release"), "burst", "4"])
    rel = doc["host"]["release"]
    check(rel["delay_bytes"] >= 700 << 20 and rel["threshold_bytes"] == 0 and rel["background"] is True,
          f"host.release: {rel}")


def case_release_small():
    """Memory freed in small blocks (below tcmalloc's 256 KiB large size, so
    no large free announces it) goes back too while the process sleeps
    without an allocator call: what tcmalloc's caches of small objects hold
    stays (tens of MB), the rest goes.  Control: plain tcmalloc keeps it."""
    shapes = [("1100", "8000"), ("65536", "204800")]
    for lo, hi in shapes:
        r = run([prog("p_release"), "small", lo, hi, "600", "3"], env=base_env(FORGEALLOC_RELEASE_DELAY="300ms"))
        check(r.returncode == 0, r.stderr)
        mb = {k: int(v) for k, v in re.findall(r"^(rss_\w+_mb) (-?\d+)$", r.stdout, re.M)}
        check(mb["rss_peak_mb"] >= mb["rss_start_mb"] + 500, f"{lo}-{hi} B: the blocks were not resident: {mb}")
        check(mb["rss_end_mb"] <= mb["rss_start_mb"] + 96, f"{lo}-{hi} B: RSS did not settle: {mb}")
    # The default delay, and the stats say the delay returned it.
    _, doc = one_dump([prog("p_release"), "small", "1100", "8000", "600", "6"])
    rel = doc["host"]["release"]
    check(rel["delay_bytes"] >= 400 << 20 and rel["background"] is True, f"host.release: {rel}")
    tc = system_lib("libtcmalloc_minimal.so.4")
    check(tc, "libtcmalloc_minimal.so.4 not found")
    r = run([prog("p_release"), "small", "1100", "8000", "600", "1"], preload=False, env=base_env(LD_PRELOAD=tc))
    mb = {k: int(v) for k, v in re.findall(r"^(rss_\w+_mb) (-?\d+)$", r.stdout, re.M)}
    check(mb["rss_end_mb"] >= mb["rss_start_mb"] + 500, f"control: plain tcmalloc returned the memory: {mb}")


def case_release_churn():
    """Large blocks that are needed again a moment later are never returned
    and refaulted: repeated 1-32 MB blocks, and a changing working set of 16
    blocks over many windows.  Control: the immediate rule (delay 0) does
    return them, so the zero is the window's doing."""
    r = run([prog("p_release"), "churn"])
    check(r.returncode == 0, r.stderr)
    releases = int(re.search(r"releases (\d+)", r.stdout).group(1))
    check(releases == 0, f"the churn loop made {releases} returns to the OS; it should reuse its memory")
    # The default delay: not one return.  A delay far shorter than the
    # churn's rhythm: a return or two, then the regret backs it off.
    for delay, most, most_mb in (("2s", 0, 0), ("300ms", 3, 100)):
        r = run([prog("p_release"), "churn16", "4000"], env=base_env(FORGEALLOC_RELEASE_DELAY=delay))
        check(r.returncode == 0, r.stderr)
        m = re.search(r"releases (\d+) released_mb (\d+)", r.stdout)
        releases, mb = int(m.group(1)), int(m.group(2))
        check(releases <= most and mb <= most_mb,
              f"FORGEALLOC_RELEASE_DELAY={delay}: the working set churn made {releases} returns of {mb} MB in all")
    r = run([prog("p_release"), "churn16", "1000"], env=base_env(FORGEALLOC_RELEASE_DELAY="0",
                                                                  FORGEALLOC_RELEASE_THRESHOLD="16M"))
    releases = int(re.search(r"releases (\d+)", r.stdout).group(1))
    check(releases > 0, "control: the immediate rule made no return either; the churn does not exercise the policy")


def check_prompt_cycles(cycles, gap_ms, delay, kept_from, timeout=300):
    """p_release prompt: `cycles` working sets freed before spells of
    `gap_ms`: the first spell returns it, the cycles from `kept_from` on
    keep it, the hold grows past the spell, and RSS settles after the
    cycles within twice the hold."""
    r = run([prog("p_release"), "prompt", str(cycles), str(gap_ms)], env=base_env(FORGEALLOC_RELEASE_DELAY=delay),
            timeout=timeout)
    check(r.returncode == 0, r.stderr)
    returned = [int(x) for x in re.search(r"returned_mb((?: \d+)+)", r.stdout).group(1).split()]
    hold = int(re.search(r"hold_ms (\d+)", r.stdout).group(1))
    settled = int(re.search(r"settled_after_ms (-?\d+)", r.stdout).group(1))
    spell = f"{gap_ms / 1000:g} s"
    check(returned[0] >= 100, f"the first {spell} spell returned only {returned[0]} MB; the cycle does not look idle")
    check(all(mb == 0 for mb in returned[kept_from:]), f"returns per cycle {returned}: later cycles should keep it")
    check(hold > gap_ms, f"host.release.hold_ms {hold}: should have grown past the {spell} spell")
    check(0 <= settled <= 2 * hold + 3000, f"after the cycles RSS settled after {settled} ms (hold {hold} ms)")


def case_release_prompt():
    """Memory freed before an idle spell and needed again after it (a text
    encoder moved to the host for each prompt) is returned once, then kept:
    the idle window stretches past the spell.  When the cycles stop it still
    goes back, after the learnt hold."""
    check_prompt_cycles(7, 1000, "300ms", 3)


def case_release_realloc():
    """A realloc of a large block that fails leaves it known to the release
    policy: its later free still counts (immediate rule, 8 MB threshold)."""
    r = run([prog("p_release"), "realloc"], env=base_env(FORGEALLOC_RELEASE_DELAY="0",
                                                          FORGEALLOC_RELEASE_THRESHOLD="12M"))
    check(r.returncode == 0, r.stderr)
    releases = int(re.search(r"releases (\d+)", r.stdout).group(1))
    check(releases >= 1, "16 MB of large frees past a 12 MB threshold made no return: a block was lost")


def case_release_grow():
    """A buffer grown by realloc to 512 MiB leaves tcmalloc for a mapping of
    its own and grows there with mremap: its bytes are kept, the peak RSS
    stays near its final size (plain tcmalloc's copies peak at about 2.5x
    it), host.grown_bytes counts it while it lives and nothing after its
    free; shrunk, grown again and resized by a forked child, it keeps its
    bytes.  The same with FORGEALLOC_HUGEPAGES=1 (where the kernel's THP mode
    is madvise), which must not split the mapping."""
    for env in ({}, {"FORGEALLOC_HUGEPAGES": "1"}):  # huge pages asked for the whole mapping, never a part
        r = run([prog("p_release"), "grow"], env=base_env(**env))
        check(r.returncode == 0, f"{env}: {r.stdout} {r.stderr}")
        m = re.search(r"peak_mb (\d+) final_mb (\d+) grown_mb (\d+)", r.stdout)
        check(m, f"{env}: {r.stdout}")
        if not m:
            continue
        peak, final, grown = (int(x) for x in m.groups())
        print(f"{env}: peak {peak} MB for a {final} MB buffer, grown_bytes {grown} MB")
        check(grown == final, f"{env}: host.grown_bytes says {grown} MB for a {final} MB grown buffer")
        check(peak <= final * 1.25 + 64, f"{env}: peak RSS {peak} MB for a {final} MB buffer: the copies stayed")
        check("grown_mb_after_free 0" in r.stdout, f"{env}: {r.stdout}")


def case_release_fork():
    """Parent and child both settle after fork: the child starts its own
    background thread when it needs one."""
    r = run([prog("p_release"), "fork", "6"])
    check(r.returncode == 0, r.stderr)
    for who in ("parent ", "child "):
        # Both start from the 800 MB the parent held at the fork.
        end = ended_mb(r.stdout, who)
        check(end is not None and end <= 100, f"{who.strip()} did not settle: {r.stdout}")
    # fork while the background thread is inside tcmalloc returning memory:
    # tcmalloc's own fork handlers take its locks; the child must not hang.
    r = run([prog("p_release"), "forkrel", "25"], env=base_env(FORGEALLOC_RELEASE_DELAY="20ms"))
    check(r.returncode == 0, f"fork during a release: {r.stderr}")


def case_release_thread():
    """The background thread exists only in processes that held large free
    memory, is named, and never in a shell or a small tool."""
    r = run([prog("p_release"), "threads"])
    check(r.returncode == 0, r.stderr)
    small = int(re.search(r"helper_threads_small (\d+)", r.stdout).group(1))
    after = int(re.search(r"helper_threads_after_burst (\d+)", r.stdout).group(1))
    check(small == 0, f"{small} forgealloc thread(s) in a process that only made small allocations")
    check(after == 1, f"{after} forgealloc threads after a burst was freed, expected 1")
    # A fork while it runs: it leaves first, so parent and child are
    # single-threaded right after the fork; the memory freed just before
    # stays (release_fork_keeps); the next burst starts the thread again.
    m = re.search(r"threads_after_fork (\d+) rss_drop_mb (-?\d+)", r.stdout)
    check(m and m.group(1) == "1", f"the parent had {m and m.group(1)} threads right after fork:\n{r.stdout}")
    check(int(m.group(2)) < 100, f"RSS dropped by {m.group(2)} MB at the fork: the 800 MB freed just before went back")
    check("child_single_threaded 1" in r.stdout, f"the child had more than one thread:\n{r.stdout}")
    check("helper_threads_after_fork_burst 1" in r.stdout, f"no thread after the next burst:\n{r.stdout}")
    r = run(["/bin/sh", "-c", "ls /proc/$$/task | wc -l"])
    check(r.stdout.strip() == "1", f"a shell under the shim has {r.stdout.strip()} threads")
    # Once the memory went back and nothing is left to judge, the thread
    # exits (a settled process is single-threaded again), and the next burst
    # starts it again.
    r = run([prog("p_release"), "retire", "10"], env=base_env(FORGEALLOC_RELEASE_DELAY="100ms"))
    check(r.returncode == 0, r.stderr)
    busy = re.findall(r"helper_threads_busy (\d+)", r.stdout)
    retired = re.findall(r"helper_threads_retired (\d+)", r.stdout)
    check(busy == ["1", "1"], f"threads while memory was held: {busy}\n{r.stdout}")
    check(retired == ["0", "0"], f"threads 10 s after the memory went back: {retired}\n{r.stdout}")


def case_release_exit():
    """Exit while the background thread is releasing: clean exit status and a
    complete exit dump, whatever the timing."""
    import random
    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as d:
        for i in range(12):
            wait = 0.25 + rng.uniform(-0.1, 0.15)
            r = run([prog("p_release"), "burst", f"{wait:.3f}"],
                    env=base_env(FORGEALLOC_RELEASE_DELAY="200ms", FORGEALLOC_STATS="json",
                                 FORGEALLOC_STATS_FILE=f"{d}/{i}.json"))
            check(r.returncode == 0, f"run {i} exited {r.returncode}: {r.stderr[-500:]}")
            with open(f"{d}/{i}.json") as f:
                doc = json.load(f)
            check(doc["reason"] == "exit", f"run {i}: {doc['reason']}")


def case_release_loader_free():
    """glibc frees a dlopen'd library's thread-local blocks from ld.so while
    it holds its stack-cache lock (in pthread_join): a free there that moves
    the release policy must not start the background thread (pthread_create
    takes that lock).  The program finishes, and the thread starts later."""
    lib = os.path.join(ARGS.bindir, "libp_bigtls_lib.so")
    r = run([prog("p_release"), "tlsjoin", lib], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE="-"),
            timeout=60)
    check(r.returncode == 0 and r.stdout.strip() == "done", f"status {r.returncode}: {r.stdout!r} {r.stderr[-300:]!r}")
    doc = json.loads(r.stderr)
    check(doc["host"]["release"]["background"] is True, "the background thread never started after the joins")


def case_release_errno():
    """A malloc served from memory tcmalloc holds leaves errno alone, also
    when the shim's own table of large blocks cannot be mapped."""
    r = run([prog("p_release"), "errno"])
    check(r.returncode == 0 and r.stdout.strip() == "ok 1 errno 0", f"status {r.returncode}: {r.stdout!r}")


def case_release_counted_once():
    """Two threads releasing at once (malloc_trim, forgealloc_release) count
    each byte tcmalloc unmapped once, in what they return and in the stats."""
    r = run([prog("p_release"), "twice", "150"])
    check(r.returncode == 0, r.stderr)
    m = dict(re.findall(r"(\w+_mb) (\d+)", r.stdout))
    check(m["unmapped_mb"] == m["returned_mb"] == m["counted_mb"] and int(m["unmapped_mb"]) > 0,
          f"counted {m}")


def case_release_fork_inherited():
    """Free memory held at a fork stays on both sides: the child holds it
    too (and alone, once the parent returns its copy), and returns it
    within the delay after it allocates 100 ms or more after the fork (no
    thread starts sooner: a child may unshare(2) or exec first), with no
    other call; the same where the thread stays through the fork
    (periodic dumps)."""
    for interval in (False, True):
        with tempfile.TemporaryDirectory() as d:
            env = base_env(FORGEALLOC_RELEASE_DELAY="500ms")
            if interval:
                env.update(FORGEALLOC_STATS="json", FORGEALLOC_STATS_INTERVAL="60s", FORGEALLOC_STATS_FILE=f"{d}/%p.json")
            r = run([prog("p_release"), "inherit", "4"], env=env)
        check(r.returncode == 0, r.stderr)
        m = re.search(r"child rss_start_mb (\d+) rss_end_mb (\d+)", r.stdout)
        check(m and int(m.group(1)) > 200, f"the child did not inherit the free memory: {r.stdout!r}")
        check(int(m.group(2)) < 64, f"the child kept what it inherited: {r.stdout!r}")


def case_release_fork_keeps():
    """A fork keeps the parent's free memory (a program that forks per task
    would fault it in again after every fork), and the process forks with
    no thread of ours: the background thread leaves before the fork and
    does not start again until an allocator call 100 ms later (Python 3.12
    counts the threads with stdio right after fork() returns).  Then the
    memory still goes back after the delay."""
    r = run([prog("p_release"), "forkkeep", "0.3"])
    check(r.returncode == 0, r.stderr)
    m = re.search(r"threads_after_fork (-?\d+) rss_start_mb (\d+) rss_after_fork_mb (\d+) settled_after_ms (-?\d+)",
                  r.stdout)
    check(m, f"unexpected output {r.stdout!r}")
    threads, start, after_fork, settled = (int(x) for x in m.groups())
    check(threads == 1, f"{threads} threads right after the fork: the helper thread was there")
    check(after_fork >= start + 200, f"RSS {start} MB at the start, {after_fork} MB after the fork: it returned "
                                     f"the free memory")
    check(0 <= settled <= 5000, f"the free memory did not go back after the fork: settled_after_ms {settled}")


def case_release_page_cache():
    """Page cache the kernel can drop is not memory pressure: a process in a
    1 GiB memory cgroup that first reads an 850 MB file churns large blocks
    with no return to the OS (Docker and the kubelet count the same)."""
    with limited_cgroup("memory", 1 << 30) as d:
        if d is None:
            return SKIP
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            data = os.path.join(tmp, "model.bin")
            env = base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{tmp}/dump.json")
            env["LD_PRELOAD"] = ARGS.lib
            script = (f'dd if=/dev/zero of={data} bs=1M count=850 status=none && cat {data} > /dev/null && '
                      f'exec {prog("p_release")} churn16 400')
            r = subprocess.run(in_cgroup(d) + ["/bin/sh", "-c", script], env=env, capture_output=True, text=True,
                               timeout=120)
            check(r.returncode == 0, f"status {r.returncode}: {r.stderr}")
            with open(f"{tmp}/dump.json") as f:
                rel = json.load(f)["host"]["release"]
            check(rel["pressure_bytes"] == 0, f"page cache taken for pressure: {rel}")


def case_release_nothread():
    """Where no thread can be made (a pids cgroup that allows the process
    alone), freed memory goes back on the program's next large allocator
    call, the dump says so, and asking for periodic dumps says in one line
    why there are none and what to do.  Control: the same run outside the
    cgroup settles before that call, from the background thread."""
    with limited_cgroup("pids", 1) as d:
        if d is None:
            return SKIP
        with tempfile.TemporaryDirectory() as tmp:
            def calls(cmd, **extra):
                env = base_env(FORGEALLOC_RELEASE_DELAY="200ms", FORGEALLOC_STATS="json",
                               FORGEALLOC_STATS_FILE=f"{tmp}/dump.json", **extra)
                r = run(cmd + [prog("p_release"), "calls", "1.5"], env=env)
                check(r.returncode == 0, f"status {r.returncode}: {r.stderr}")
                mb = {k: int(v) for k, v in re.findall(r"^(rss_\w+_mb) (-?\d+)$", r.stdout, re.M)}
                with open(f"{tmp}/dump.json") as f:
                    return r, mb, json.load(f)

            r, mb, doc = calls(in_cgroup(d))
            check(r.stderr == "", f"printed unasked: {r.stderr!r}")
            check(doc["host"]["release"]["background"] is False, "the dump says a background thread ran")
            check(mb["rss_before_call_mb"] > mb["rss_start_mb"] + 600,
                  f"memory went back with no thread and no call: {mb}")
            check(mb["rss_after_call_mb"] <= mb["rss_start_mb"] + 64, f"the call returned nothing: {mb}")
            check(doc["host"]["release"]["delay_bytes"] >= 600 << 20, f"returns by delay: {doc['host']['release']}")

            r, mb, doc = calls(in_cgroup(d), FORGEALLOC_STATS_INTERVAL="1")
            lines = r.stderr.splitlines()
            check(len(lines) == 1 and "FORGEALLOC_STATS_INTERVAL" in lines[0] and "thread limit" in lines[0],
                  f"expected one line naming the setting and the reason: {r.stderr!r}")

            r, mb, doc = calls([])
            check(doc["host"]["release"]["background"] is True, "control: no background thread outside the cgroup")
            check(mb["rss_before_call_mb"] <= mb["rss_start_mb"] + 64,
                  f"control: the thread did not settle the process before the call: {mb}")


def case_release_pressure():
    """Never cause an OOM kill: process A frees 500 MB and sleeps with a
    60 s delay; process B then needs 400 MB in the same cgroup, limited to
    700 MB.  A gives its free memory back and nobody is killed.  Control:
    with FORGEALLOC_RELEASE_PRESSURE=0 the same pair runs into the limit."""
    with limited_cgroup("memory", 700 << 20) as d:
        if d is None:
            return SKIP
        enter = in_cgroup(d)

        def pair(pressure):
            env = base_env(FORGEALLOC_RELEASE_DELAY="60s", FORGEALLOC_RELEASE_PRESSURE=pressure)
            env["LD_PRELOAD"] = ARGS.lib
            a = subprocess.Popen(enter + [prog("p_release"), "hold", "500", "8"], env=env, stdout=subprocess.PIPE,
                                 text=True)
            line = a.stdout.readline()
            time.sleep(1.0)
            b = subprocess.run(enter + [prog("p_release"), "need", "400"], env=base_env(), capture_output=True,
                               text=True, timeout=60)
            a_out = a.stdout.read()
            a.wait(timeout=60)
            return line.strip(), a.returncode, a_out, b.returncode, b.stdout

        line, a_rc, a_out, b_rc, b_out = pair("1")
        check(line == "freed", f"A did not get to its frees: {line!r} (status {a_rc})")
        check(a_rc == 0 and b_rc == 0 and b_out.strip() == "got",
              f"with the pressure path: A status {a_rc}, B status {b_rc} {b_out!r}")
        line, a_rc, _, b_rc, _ = pair("0")
        check(a_rc != 0 or b_rc != 0,
              "control: without the pressure path both fit under the limit; the test does not test anything")


def case_release_pressure_steps():
    """Under a memory cgroup's limit, a job whose transient buffers fit
    keeps them: 300 MB live and 120 MB of buffers per step under a 512 MiB
    limit hold more free memory between steps than half the room left,
    which once returned them all at every look (and faulted them in again
    at the next step).  At most the first step's buffers go back: the heap
    grew for them, which shows as no demand until they are taken again."""
    with limited_cgroup("memory", 512 << 20) as d:
        if d is None:
            return SKIP
        env = base_env()
        env["LD_PRELOAD"] = ARGS.lib
        r = subprocess.run(in_cgroup(d) + [prog("p_release"), "steps", "300", "120", "150"], env=env,
                           capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"status {r.returncode} under the limit: {r.stderr[-300:]!r}")
        m = re.search(r"pressure_mb (\d+) releases (\d+)", r.stdout)
        check(m, f"unexpected output {r.stdout!r}")
        pressure, releases = int(m.group(1)), int(m.group(2))
        check(pressure <= 130 and releases <= 3,
              f"{releases} returns, {pressure} MB for pressure over 150 steps: the step buffers went back and came "
              f"back")


def case_release_prompt_slow():
    """A person's pace: the working set comes back after a spell 40 times
    the delay (4 s at 100 ms; 80 s at the default 2 s), far past the 16
    delays a return was once judged over.  It goes back once, the next
    cycle's return is judged a regret when it comes back, and the later
    cycles keep it; when the cycles stop it still goes back."""
    check_prompt_cycles(5, 4000, "100ms", 2, timeout=120)


def case_introspection():
    r = run([prog("p_release"), "intro"], env=base_env(FORGEALLOC_RELEASE_THRESHOLD="1G"))
    check(r.returncode == 0, f"introspection checks failed: {r.stderr}")
    check(re.search(r"forgealloc [0-9.]+: pid \d+ \(.*p_release\)", r.stderr), f"malloc_stats printed: {r.stderr!r}")


def case_api_errno():
    """The stats calls leave errno as it was, also where /proc cannot be read (a chroot or a sandbox without it:
    here /proc hidden under an empty tmpfs in a mount namespace of its own)."""
    r = run([prog("p_release"), "apierrno"], env=base_env(FORGEALLOC_STATS="off"))
    check(r.returncode == 0 and r.stdout.strip() == "errno kept 4 of 4", f"errno: {r.stdout!r} {r.stderr[-300:]!r}")
    probe = run(["unshare", "--mount", "true"], preload=False)
    if probe.returncode != 0:
        print("cannot make a mount namespace here (needs root) - /proc case skipped")
        return
    r = run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
             'mount -t tmpfs none /proc && exec "$@"', "sh", prog("p_release"), "apierrno"],
            env=base_env(FORGEALLOC_STATS="off"))
    check(r.returncode == 0 and r.stdout.strip() == "errno kept 4 of 4",
          f"errno without /proc: {r.stdout!r} {r.stderr[-300:]!r}")


def case_early_malloc_stats():
    """malloc_stats from a library constructor that runs before forgealloc's: the report is printed then too."""
    r = run([prog("p_early")], env=base_env())
    check(r.returncode == 0, f"p_early failed: {r.stderr}")
    ctor, report, main = (r.stderr.find(s) for s in ("p_early: constructor", "forgealloc ", "p_early: main"))
    check(0 <= ctor < report < main, f"report between the constructor and main: {r.stderr!r}")
    check(re.search(r"forgealloc [0-9.]+: pid \d+ \(.*p_early\)", r.stderr), f"report line: {r.stderr!r}")


def case_large_report():
    r = run([prog("p_large"), "2M"], env=base_env(FORGEALLOC_LARGE_ALLOC_REPORT="1M"))
    lines = r.stderr.splitlines()
    check(r.returncode == 0 and len(lines) == 1, f"expected one report line, got: {r.stderr!r}")
    check(re.match(r"forgealloc: large allocation of 2\.00 MiB \(2097152 bytes\) by malloc from \S*p_large\+0x[0-9a-f]+",
                   lines[0]), f"report line: {lines[0]}")
    check("FORGEALLOC_LARGE_ALLOC_REPORT" in lines[0], "the report names its variable")
    _, doc = one_dump([prog("p_large"), "2M", "3M", "100K"], FORGEALLOC_LARGE_ALLOC_REPORT="1M",
                      FORGEALLOC_LOG="error")
    check(doc["host"]["large_allocs"] == 2, f"large_allocs = {doc['host']['large_allocs']}")
    r = run([prog("p_large")] + ["2M"] * 50, env=base_env(FORGEALLOC_LARGE_ALLOC_REPORT="1M"))
    lines = r.stderr.splitlines()
    check(2 <= len(lines) <= 7, f"rate limit: {len(lines)} lines for 50 reports")
    # None is lost without a word: the last line says how many were held back.
    shown = sum(1 for l in lines if l.startswith("forgealloc: large allocation of 2.00 MiB"))
    m = re.fullmatch(r"forgealloc: (\d+) more large allocations of 1\.00 MiB or more were not reported "
                     r"\(at most 5 lines a second\); host\.large_allocs in the stats dump \(FORGEALLOC_STATS\) "
                     r"counts them all", lines[-1])
    earlier = sum(int(n) for n in re.findall(r"; (\d+) earlier reports suppressed", r.stderr))
    check(m and shown + earlier + int(m.group(1)) == 50 and shown == len(lines) - 1,
          f"{shown} shown, {earlier} said suppressed on the way, then: {lines[-1]!r}")
    for env in ({}, {"FORGEALLOC_LARGE_ALLOC_REPORT": "0"}):
        r = run([prog("p_large"), "2M", "1500M"], env=base_env(**env))
        check(r.stderr == "" or env == {}, f"reports off, yet: {r.stderr}")
        if env == {}:  # default 1G: only the 1500M one
            check(len(r.stderr.splitlines()) == 1 and "1.46 GiB" in r.stderr, f"default threshold: {r.stderr!r}")


# ---- output ---------------------------------------------------------------------

def case_formats():
    r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="text"))
    check(r.returncode == 0 and re.search(r"^forgealloc [0-9.]+: pid \d+ \(/usr/bin/true\), exit", r.stderr, re.M),
          f"text dump: {r.stderr!r}")
    r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json"))
    problems = check_stats_json.problems(json.loads(r.stderr))
    check(not problems, f"JSON dump: {problems}")
    r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="prometheus"))
    samples = [line for line in r.stderr.splitlines() if not line.startswith("#")]
    check(samples and all(re.match(r'^forgealloc_\w+\{pid="\d+"(,\w+="[^"]*")*\} \d+$', s) for s in samples),
          f"prometheus dump: {r.stderr[:500]}")
    # A program under a UTF-8 path (many installs are): its name reads as
    # written in JSON and Prometheus, not as one escape per byte.
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "AI\u7ed8\u753b", "true")
        os.mkdir(os.path.dirname(exe))
        shutil.copy("/bin/true", exe)
        r = run([exe], env=base_env(FORGEALLOC_STATS="json"))
        check(json.loads(r.stderr)["exe"] == exe, f"JSON exe: {r.stderr[:300]!r}")
        r = run([exe], env=base_env(FORGEALLOC_STATS="prometheus"))
        check(f'exe="{exe}"' in r.stderr, f"prometheus exe: {r.stderr[:300]!r}")


def case_quiet():
    """Nothing is printed when nobody asked."""
    r = run([ARGS.python, "-c", "import json; print(len(json.dumps(list(range(10000)))))"])
    check(r.returncode == 0 and r.stdout == "58890\n" and r.stderr == "", f"python under the shim: {r!r}")
    r = run(["sh", "-c", "ls / | wc -l >/dev/null; git --version >/dev/null 2>&1 || true"])
    check(r.returncode == 0 and r.stderr == "", f"shell pipeline printed: {r.stderr!r}")


def case_bad_setting():
    r = run(["echo", "hi"], env=base_env(FORGEALLOC_RELEASE_RATE="abc"))
    check(r.returncode == 0 and r.stdout == "hi\n", f"program changed by a bad setting: {r!r}")
    check(len(r.stderr.splitlines()) == 1 and "FORGEALLOC_RELEASE_RATE='abc'" in r.stderr, f"message: {r.stderr!r}")
    r = run(["echo", "hi"], env=base_env(FORGEALLOC_RELEASE_RATE="abc", FORGEALLOC_STRICT="1"))
    check(r.returncode == 2 and r.stdout == "", f"strict mode should refuse to start: {r!r}")
    check("refusing to start" in r.stderr and "FORGEALLOC_RELEASE_RATE" in r.stderr, f"strict message: {r.stderr!r}")
    # A misspelt name: ignored with one line, and refused under FORGEALLOC_STRICT=1 as a bad value is.
    r = run(["echo", "hi"], env=base_env(FORGEALLOC_RELEASE_RATES="2"))
    check(r.returncode == 0 and r.stdout == "hi\n" and len(r.stderr.splitlines()) == 1
          and "FORGEALLOC_RELEASE_RATES is not a forgealloc setting and is ignored" in r.stderr, f"misspelt: {r!r}")
    r = run(["echo", "hi"], env=base_env(FORGEALLOC_RELEASE_RATES="2", FORGEALLOC_STRICT="1"))
    lines = r.stderr.splitlines()
    check(r.returncode == 2 and r.stdout == "" and len(lines) == 2 and "FORGEALLOC_RELEASE_RATES is not a forgealloc "
          "setting;" in lines[0] and "1 setting is unknown; refusing to start" in lines[1], f"strict, misspelt: {r!r}")


# A Python parent under the shim that runs children with captured stderr:
# argv[1] is JSON [[name, cmd, {VAR: value, or None to unset}], ...]; prints
# {name: [status, stderr]}.
TREE = """
import json, os, subprocess, sys
out = {}
for name, cmd, changes in json.loads(sys.argv[1]):
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace")
    out[name] = [r.returncode, r.stderr]
print(json.dumps(out))
"""


def tree(children, preload=True, **env):
    """The parent's stderr lines and each child's [status, stderr]."""
    r = run([ARGS.python, "-c", TREE, json.dumps(children)], preload=preload, env=base_env(**env))
    check(r.returncode == 0, f"tree parent exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stderr.splitlines(), json.loads(r.stdout)


def case_warn_once():
    """A start-time line that only the environment decides (a bad setting, an unknown FORGEALLOC_* name, the
    preload order) is printed by the first process of a tree: a child whose parent has the library and started
    with the same values prints nothing, not even into its captured stderr; one whose values differ prints its
    own; FORGEALLOC_STRICT refuses in every process."""
    calls = [prog("p_calls"), "calls", "10"]
    early = ("p_early: constructor\n" "p_early: main\n")
    children = [
        ["sh", ["sh", "-c", "true"], {}],
        ["c", calls, {}],
        ["early", [prog("p_early")], {"P_EARLY_QUIET": "1"}],
        # sh forks p_calls: the grandchild's parent is the child, loaded and alike.
        ["grandchild", ["sh", "-c", " ".join(calls) + "; true"], {}],
        # The child's own value differs: it says so.
        ["changed", calls, {"FORGEALLOC_RELEASE_DELAY": "7sec"}],
        ["added", calls, {"FORGEALLOC_STATS": "jsn"}],
        # A parent between them without the library: the grandchild prints its lines.
        ["unloaded", ["env", "-u", "LD_PRELOAD", "sh", "-c", f"LD_PRELOAD={ARGS.lib} {' '.join(calls)}; true"], {}],
        ["strict", calls, {"FORGEALLOC_STRICT": "1"}],
    ]
    if shutil.which("git"):
        children.append(["git", ["git", "--version"], {}])
    bad = dict(FORGEALLOC_RELEASE_DELAY="5sec", FORGEALLOC_BOGUS="1")
    lines, kids = tree(children, **bad)
    check(len(lines) == 2 and "FORGEALLOC_RELEASE_DELAY='5sec'" in lines[0]
          and "FORGEALLOC_BOGUS is not a forgealloc setting" in lines[1], f"the parent's lines: {lines}")
    want = {"sh": [0, ""], "c": [0, ""], "grandchild": [0, ""], "git": [0, ""], "early": [0, early]}
    loud = {name: kids[name] for name in want if name in kids and kids[name] != want[name]}
    check(not loud, f"children of a parent that printed the lines printed again: {loud}")
    got = kids["changed"][1].splitlines()
    check(kids["changed"][0] == 0 and len(got) == 1 and "FORGEALLOC_RELEASE_DELAY='7sec'" in got[0],
          f"a child with its own value of the setting: {kids['changed']}")
    got = kids["added"][1].splitlines()
    check(kids["added"][0] == 0 and len(got) == 1 and "FORGEALLOC_STATS='jsn'" in got[0],
          f"a child with a bad setting its parent did not start with: {kids['added']}")
    got = kids["unloaded"][1].splitlines()
    check(kids["unloaded"][0] == 0 and len(got) == 2 and "'5sec'" in got[0] and "BOGUS" in got[1],
          f"a grandchild whose parent has no forgealloc: {kids['unloaded']}")
    got = kids["strict"][1]
    check(kids["strict"][0] == 2 and "refusing to start" in got and "FORGEALLOC_RELEASE_DELAY='5sec'" in got,
          f"FORGEALLOC_STRICT=1 in a child: {kids['strict']}")

    # A parent that printed nothing (FORGEALLOC_LOG=error): a child that asks for warnings gets them.
    lines, kids = tree([["c", calls, {}], ["warn", calls, {"FORGEALLOC_LOG": "warn"}]], FORGEALLOC_LOG="error", **bad)
    check(lines == [] and kids["c"] == [0, ""], f"FORGEALLOC_LOG=error: {lines} {kids['c']}")
    got = kids["warn"][1].splitlines()
    check(kids["warn"][0] == 0 and len(got) == 2, f"a child with FORGEALLOC_LOG=warn under a quiet parent: {got}")

    # Periodic dumps asked for with the dump on stderr: the line that says they are off, once.
    needs = "FORGEALLOC_STATS_INTERVAL needs FORGEALLOC_STATS_FILE"
    lines, kids = tree([["c", calls, {}], ["other", calls, {"FORGEALLOC_STATS_INTERVAL": "2"}]],
                       FORGEALLOC_STATS="json", FORGEALLOC_STATS_INTERVAL="1")
    check(sum(needs in line for line in lines) == 1, f"the parent's lines: {lines}")
    check(kids["c"][0] == 0 and needs not in kids["c"][1], f"a child printed it again: {kids['c']}")
    check(kids["other"][0] == 0 and kids["other"][1].count(needs) == 1,
          f"a child with its own interval: {kids['other']}")


def case_warn_once_served():
    """The preload order's line (tcmalloc ahead of forgealloc) is printed once in a tree; a child started with
    another LD_PRELOAD text prints its own."""
    calls = [prog("p_calls"), "calls", "10"]
    tc = system_lib("libtcmalloc_minimal.so.4")
    check(tc, "libtcmalloc_minimal.so.4 not found")
    lines, kids = tree([["sh", ["sh", "-c", "true"], {}], ["c", calls, {}],
                        ["grandchild", ["sh", "-c", " ".join(calls) + "; true"], {}],
                        ["other", calls, {"LD_PRELOAD": f"{tc}:{ARGS.lib}"}]],
                       preload=False, LD_PRELOAD=f"{tc} {ARGS.lib}")
    check(len(lines) == 1 and lines[0].startswith("forgealloc: malloc is served by "), f"tcmalloc first: {lines}")
    loud = {name: kids[name] for name in ("sh", "c", "grandchild") if kids[name] != [0, ""]}
    check(not loud, f"tcmalloc first: children printed the line again: {loud}")
    got = kids["other"][1].splitlines()
    check(kids["other"][0] == 0 and len(got) == 1 and "malloc is served by " in got[0],
          f"tcmalloc first, a child with another LD_PRELOAD: {kids['other']}")


def case_stats_file():
    with tempfile.TemporaryDirectory() as d:
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/s-%p.json"))
        files = os.listdir(d)
        check(r.returncode == 0 and len(files) == 1 and re.match(r"s-\d+\.json$", files[0]), f"files: {files}")
        bad = f"{d}/missing/dir/s.json"
        r = run([ARGS.python, "-c", "import sys; print('out'); sys.exit(3)"],
                env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=bad))
        check(r.returncode == 3 and r.stdout == "out\n", f"an unwritable path changed the program: {r!r}")
        lines = r.stderr.splitlines()
        check(len(lines) == 1 and "cannot write stats" in lines[0] and "FORGEALLOC_STATS_FILE" in lines[0],
              f"unwritable path: {r.stderr!r}")
        # A name near the file system's limit (255 bytes) is written, though the temporary's suffix would pass it.
        for n in (230, 255):
            long = f"{d}/{'a' * n}"
            r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=long))
            check(r.returncode == 0 and r.stderr == "" and os.path.exists(long), f"a {n}-byte name: {r.stderr!r}")
            check(len(os.listdir(d)) == 2, f"a {n}-byte name left: {os.listdir(d)}")
            os.unlink(long)
        # The same path in forked workers and a shell's commands: one line for the tree, from its first process.
        tree = ("import os, subprocess, sys\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
                "        sys.exit(0)\n    os.waitpid(pid, 0)\nsubprocess.run(['/bin/sh', '-c', 'true; true'])\n")
        r = run([ARGS.python, "-c", tree], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=bad + "-%p"))
        lines = r.stderr.splitlines()
        check(r.returncode == 0 and len(lines) == 1 and "cannot write stats" in lines[0], f"a tree: {r.stderr!r}")
        # A relative path is taken from where the process started, not where it is at exit.
        os.mkdir(f"{d}/elsewhere")
        r = run([ARGS.python, "-c", "import os; os.chdir('elsewhere')"], cwd=d,
                env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE="rel-%p.json"))
        check(r.returncode == 0 and len(glob.glob(f"{d}/rel-*.json")) == 1 and not os.listdir(f"{d}/elsewhere"),
              f"relative stats file: {os.listdir(d)} {os.listdir(f'{d}/elsewhere')} {r.stderr!r}")
        # A % in the name of that directory stands for itself: 50%pct is no %p.
        pct = f"{d}/50%pct"
        os.mkdir(pct)
        r = run(["/bin/true"], cwd=pct, env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE="rel.json"))
        check(r.returncode == 0 and r.stderr == "" and os.listdir(pct) == ["rel.json"],
              f"relative stats file in {pct}: {os.listdir(d)} {os.listdir(pct)} {r.stderr!r}")


def case_stats_file_special():
    """A stats path that is a FIFO, a symbolic link or a device is written into, never replaced by a file
    (renaming over /dev/null as root would replace it for every program)."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(FORGEALLOC_STATS="json", FORGEALLOC_LOG="error")
        # A FIFO with a reader gets the dump; one without a reader does not hold the program at exit.
        fifo = f"{d}/fifo"
        os.mkfifo(fifo)
        got = []
        reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
        reader.start()
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS_FILE=fifo, **env), timeout=20)
        reader.join(10)
        check(r.returncode == 0 and got and json.loads(got[0])["reason"] == "exit", f"FIFO reader got {got!r}: {r!r}")
        start = time.monotonic()
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS_FILE=fifo, **env), timeout=20)
        check(r.returncode == 0 and time.monotonic() - start < 10, f"FIFO without a reader: {r!r}")
        check(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced")
        # A link of our own, like /dev/stderr, stays a link, and what it leads to is appended to.
        target, link = f"{d}/target.log", f"{d}/link"
        with open(target, "w") as f:
            f.write("before\n")
        os.symlink(target, link)
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS_FILE=link, **env))
        check(r.returncode == 0 and os.path.islink(link), f"the link was replaced: {r!r}")
        with open(target) as f:
            text = f.read()
        check(text.startswith("before\n") and json.loads(text[7:])["reason"] == "exit", f"target: {text[:200]!r}")
        stderr_link = f"{d}/stderr"
        os.symlink("/proc/self/fd/2", stderr_link)
        r = run([ARGS.python, "-c", "import sys; sys.stderr.write('program\\n')"],
                env=base_env(FORGEALLOC_STATS_FILE=stderr_link, **env))
        check(r.returncode == 0 and r.stderr.startswith("program\n") and '"reason":"exit"' in r.stderr,
              f"a link to stderr: {r.stderr[:200]!r}")
        # A character device (a null device of our own, so the system's is never at stake).
        if os.geteuid() == 0:
            null = f"{d}/null"
            os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS_FILE=null, **env))
            check(r.returncode == 0 and stat.S_ISCHR(os.lstat(null).st_mode), f"the device was replaced: {r!r}")
        else:
            print("not root: the device case (mknod) was not run")


def case_stats_keep_together():
    """Processes that end together (a worker pool) prune a full directory once between them: with 1000 dumps
    there and FORGEALLOC_STATS_KEEP=1000, eight processes ending at once leave at least the 900 that one prune
    keeps (each removed the whole excess: about 700 were left)."""
    with tempfile.TemporaryDirectory() as d:
        for i in range(1000):
            path = os.path.join(d, "oldhost-%013d-%d.txt" % (1600000000000 + i, 10000 + i))
            with open(path, "w") as f:
                f.write("forgealloc 0.1.0: pid %d (/bin/true), exit after 0.000 s\n" % i)
            os.utime(path, (1600000000 + i, 1600000000 + i))
        env = base_env(LD_PRELOAD=ARGS.lib, FORGEALLOC_STATS="text", FORGEALLOC_STATS_KEEP="1000",
                       FORGEALLOC_STATS_FILE=f"{d}/%h-%t-%p.txt")
        procs = [subprocess.Popen(["/bin/sleep", "0.3"], env=env) for _ in range(8)]
        check(all(p.wait(timeout=60) == 0 for p in procs), "a sleep failed")
        left = len(os.listdir(d))
        check(900 <= left <= 908, f"{left} files left (1000 and 8 new, pruned to 900 once)")


def case_stats_file_edges():
    """A FIFO whose reader stops reading or goes away costs at most a second at exit, never the exit status
    (SIGPIPE); a link of our own to a missing file creates it, as >> would; a replaced file keeps its
    permissions; a path with a newline, or a very long one, still gives a one-line message with its remedy."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(FORGEALLOC_STATS="json", FORGEALLOC_LOG="error")
        fifo = f"{d}/fifo"
        os.mkfifo(fifo)
        for reader_leaves in (False, True):
            rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            wfd = os.open(fifo, os.O_WRONLY)
            fcntl.fcntl(wfd, 1031, 4096)  # F_SETPIPE_SZ: one page, then filled: a reader that fell behind
            os.write(wfd, b"x" * 4096)
            os.close(wfd)
            start = time.monotonic()
            p = subprocess.Popen(["/bin/true"], env=base_env(LD_PRELOAD=ARGS.lib, FORGEALLOC_STATS_FILE=fifo, **env),
                                 stderr=subprocess.PIPE)
            if reader_leaves:
                time.sleep(0.3)
                os.close(rfd)
            rc = p.wait(timeout=20)
            took = time.monotonic() - start
            if not reader_leaves:
                os.close(rfd)
            what = "reader went away" if reader_leaves else "reader stopped reading"
            check(rc == 0 and took < 5, f"FIFO whose {what}: exit {rc} after {took:.1f} s, {p.stderr.read()!r}")
        # Our own link to a file that does not exist yet: the file is made, the link stays.
        link = f"{d}/dangling"
        os.symlink(f"{d}/made.json", link)
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS_FILE=link, **env))
        check(r.returncode == 0 and os.path.islink(link) and os.path.exists(f"{d}/made.json"), f"dangling link: {r!r}")
        with open(f"{d}/made.json") as f:
            check(json.load(f)["reason"] == "exit", "the made file holds no dump")
        private = f"{d}/private.json"
        with open(private, "w") as f:
            f.write("{}")
        os.chmod(private, 0o600)
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS_FILE=private, **env))
        mode = stat.S_IMODE(os.stat(private).st_mode)
        check(r.returncode == 0 and mode == 0o600, f"a 0600 stats file became {oct(mode)}: {r!r}")
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/no/such\ndir/s.json"))
        check(r.returncode == 0 and len(r.stderr.splitlines()) == 1 and "FORGEALLOC_STATS_FILE" in r.stderr,
              f"a path with a newline: {r.stderr!r}")
        # A very long path: the line still ends with the reason and the remedy.
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json",
                                            FORGEALLOC_STATS_FILE=f"{d}/no/{'a' * 1100}/s.json"))
        check(r.returncode == 0 and len(r.stderr.splitlines()) == 1 and "..." in r.stderr and
              r.stderr.rstrip().endswith("set FORGEALLOC_STATS_FILE to a writable path, or - for stderr"),
              f"a long path: {r.stderr[-300:]!r}")


def case_stderr_not_ours():
    """Lines and dumps nobody called for never kill the program (stderr a pipe nobody reads any more) and never
    land in a file or socket the program opened as fd 2 after closing stderr; a log the program sent stderr to on purpose
    (opened for appending) gets them."""
    for cmd, env in ((["/bin/true"], dict(FORGEALLOC_STATS="text")),
                     ([ARGS.python, "-c", "bytearray(2 << 20)"], dict(FORGEALLOC_LARGE_ALLOC_REPORT="1M"))):
        rfd, wfd = os.pipe()
        os.close(rfd)
        p = subprocess.run(cmd, env=base_env(LD_PRELOAD=ARGS.lib, **env), stderr=wfd, stdout=subprocess.DEVNULL,
                           timeout=60)
        os.close(wfd)
        check(p.returncode == 0, f"{cmd} with stderr a closed pipe exited {p.returncode} (-13: SIGPIPE)")
    with tempfile.TemporaryDirectory() as d:
        data, log = f"{d}/data", f"{d}/log"
        env = base_env(FORGEALLOC_LARGE_ALLOC_REPORT="1M", FORGEALLOC_STATS="text")
        reopen = ("import os\nos.close(2)\nfd = os.open({!r}, os.O_RDWR | os.O_CREAT, 0o644)\nassert fd == 2\n"
                  "os.write(fd, b'DATA\\n')\nx = bytearray(2 << 20)\nos.write(fd, b'MORE\\n')\n").format(data)
        r = run([ARGS.python, "-c", reopen], env=env)
        with open(data) as f:
            text = f.read()
        check(r.returncode == 0 and text == "DATA\nMORE\n", f"fd 2 reopened as a data file: {r.returncode} {text[:300]!r}")
        os.unlink(data)
        r = run(["/bin/sh", "-c", 'exec 2>&- "$@"', "sh", ARGS.python, "-c", reopen.replace("os.close(2)\n", "")],
                env=env)
        with open(data) as f:
            text = f.read()
        check(r.returncode == 0 and text == "DATA\nMORE\n", f"started without stderr: {r.returncode} {text[:300]!r}")
        # A daemon's client socket that got fd 2 after stderr was closed.
        path = f"{d}/sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        client = ("import os, socket\nos.close(2)\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                  "assert s.fileno() == 2\ns.connect({!r})\ns.sendall(b'DATA\\n')\nx = bytearray(2 << 20)\n"
                  "s.sendall(b'MORE\\n')\n").format(path)
        p = subprocess.Popen([ARGS.python, "-c", client], env=base_env(LD_PRELOAD=ARGS.lib, **env),
                             stdout=subprocess.PIPE)
        server.settimeout(60)
        conn, _ = server.accept()
        got = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        conn.close()
        server.close()
        p.wait(timeout=60)
        check(p.returncode == 0 and got == b"DATA\nMORE\n", f"fd 2 reopened as a socket: {p.returncode} {got[:300]!r}")
        redirect = ("import os\nfd = os.open({!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\nos.dup2(fd, 2)\n"
                    "x = bytearray(2 << 20)\n").format(log)
        r = run([ARGS.python, "-c", redirect], env=env)
        with open(log) as f:
            text = f.read()
        check(r.returncode == 0 and "forgealloc: large allocation" in text, f"stderr sent to a log on purpose: {text[:300]!r}")


def case_release_rate():
    _, doc = one_dump(["/bin/true"])
    check(doc["config"]["release_rate"] == 0.0, f"default release rate read back: {doc['config']['release_rate']}")
    _, doc = one_dump(["/bin/true"], FORGEALLOC_RELEASE_RATE="3")
    check(doc["config"]["release_rate"] == 3.0, f"release rate read back: {doc['config']['release_rate']}")


# ---- who serves malloc ------------------------------------------------------------

def system_lib(name):
    """The absolute path of a system library such as libjemalloc.so.2, or None."""
    found = glob.glob(f"/usr/lib/*/{name}") + glob.glob(f"/lib/*/{name}") + glob.glob(f"/usr/lib/{name}")
    return found[0] if found else None


def served_run(preload, **env):
    """p_large (malloc and free only: other allocators lack some of the family) under `preload`, a list:
    (stderr lines, the JSON dump)."""
    r = run([prog("p_large"), "1M"], preload=False, env=base_env(LD_PRELOAD=" ".join(preload), **env))
    check(r.returncode == 0, f"p_large under {preload} exited {r.returncode}: {r.stderr}")
    quiet = r.stderr.splitlines()
    with tempfile.TemporaryDirectory() as d:
        r = run([prog("p_large"), "1M"], preload=False,
                env=base_env(**{"LD_PRELOAD": " ".join(preload), "FORGEALLOC_STATS": "json",
                                "FORGEALLOC_STATS_FILE": f"{d}/%p.json", "FORGEALLOC_LOG": "error", **env}))
        docs = list(dumps(d).values())
    check(r.returncode == 0 and len(docs) == 1, f"dump under {preload}: {r.returncode} {len(docs)} {r.stderr}")
    problems = check_stats_json.problems(docs[0])
    check(not problems, f"stats JSON breaks the contract: {problems}")
    return quiet, docs[0]


def case_served_ours_first():
    """forgealloc first, tcmalloc after it: it serves, counts, and prints nothing at all."""
    tc = system_lib("libtcmalloc_minimal.so.4")
    for preload in ([ARGS.lib], [ARGS.lib, tc]):
        lines, doc = served_run(preload)
        check(lines == [], f"{preload}: printed {lines}")
        host = doc["host"]
        check(host["interposed"] is True and os.path.realpath(host["served_by"]) == os.path.realpath(ARGS.lib),
              f"{preload}: interposed {host['interposed']}, served by {host['served_by']}")
        check(host["calls"]["malloc"] >= 1 and host["tcmalloc"]["serves_malloc"] is True, f"{preload}: {host}")


def case_served_tcmalloc_first():
    """tcmalloc ahead of forgealloc: one line naming it and the fix; its numbers are the process's."""
    for name in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"):
        tc = system_lib(name)
        if not tc:
            check(name != "libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so.4 not found")
            print(f"{name} not installed - that order not tried")
            continue
        lines, doc = served_run([tc, ARGS.lib])
        check(len(lines) == 1, f"{name} first: expected one line, got {lines}")
        check(lines[0].startswith("forgealloc: malloc is served by ") and name in lines[0] and "LD_PRELOAD" in lines[0]
              and "libforgealloc.so first" in lines[0], f"{name} first: {lines[0]}")
        host = doc["host"]
        check(host["interposed"] is False and os.path.basename(host["served_by"]) == name,
              f"{name} first: interposed {host['interposed']}, served by {host['served_by']}")
        check(host["calls"]["malloc"] == 0, f"{name} first: forgealloc counted {host['calls']['malloc']} mallocs")
        tcm = host["tcmalloc"]
        check(tcm["serves_malloc"] is True and tcm["valid"] and tcm["heap_size"] > 0, f"{name} first: {tcm}")
        lines, _ = served_run([tc, ARGS.lib], FORGEALLOC_LOG="error")
        check(lines == [], f"FORGEALLOC_LOG=error still printed {lines}")
        # The thread only once tcmalloc's heap outgrew the threshold: a shell
        # or a process of small allocations never gets one.
        tc_first = base_env(LD_PRELOAD=f"{tc} {ARGS.lib}", FORGEALLOC_LOG="error")
        r = run([prog("p_release"), "threads"], preload=False, env=tc_first)
        check(r.returncode == 0, r.stderr)
        small = int(re.search(r"helper_threads_small (\d+)", r.stdout).group(1))
        after = int(re.search(r"helper_threads_after_burst (\d+)", r.stdout).group(1))
        check(small == 0, f"{name} first: {small} forgealloc thread(s) in a process of small allocations")
        check(after == 1, f"{name} first: {after} forgealloc threads after a burst was freed, expected 1")
        r = run(["/bin/sh", "-c", "sleep 0.2; ls /proc/$$/task | wc -l"], preload=False, env=tc_first)
        check(r.stdout.strip() == "1", f"{name} first: a shell has {r.stdout.strip()} threads")
        # The release policy holds without seeing a call: 800 MB freed, the
        # process idle, RSS back within 6 s.
        r = run([prog("p_release"), "burst", "6"], preload=False,
                env=base_env(LD_PRELOAD=f"{tc} {ARGS.lib}", FORGEALLOC_LOG="error"))
        check(r.returncode == 0, r.stderr)
        got = settled(r.stdout)
        check(got is not None and got[1] <= 6000, f"{name} first: RSS did not settle within 6 s: {r.stdout}")
        # A forked child settles too: none of its calls reach us to start
        # its thread, so the fork itself does.
        r = run([prog("p_release"), "fork", "6"], preload=False,
                env=base_env(LD_PRELOAD=f"{tc} {ARGS.lib}", FORGEALLOC_LOG="error"))
        check(r.returncode == 0, r.stderr)
        for who in ("parent ", "child "):
            end = ended_mb(r.stdout, who)
            check(end is not None and end <= 100, f"{name} first: {who.strip()} did not settle: {r.stdout}")


def case_served_jemalloc_first():
    """jemalloc ahead of forgealloc: one line; the dump has no tcmalloc numbers."""
    je = system_lib("libjemalloc.so.2")
    if not je:
        print("libjemalloc.so.2 not installed (Debian: libjemalloc2) - skipped")
        return SKIP
    lines, doc = served_run([je, ARGS.lib])
    check(len(lines) == 1 and "libjemalloc.so.2" in lines[0] and "LD_PRELOAD" in lines[0], f"jemalloc first: {lines}")
    host = doc["host"]
    check(host["interposed"] is False and os.path.basename(host["served_by"]) == "libjemalloc.so.2", f"{host}")
    tcm = host["tcmalloc"]
    check(tcm["serves_malloc"] is False and all(tcm[k] is None for k in check_stats_json.TCMALLOC),
          f"tcmalloc numbers shown for a jemalloc process: {tcm}")
    # Real tools that call reallocarray, which jemalloc does not define:
    # ours must reach jemalloc's realloc, as glibc's does.
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as nums:
        nums.write("".join(f"{i * 7919 % 20011}\n" for i in range(20000)))
        nums.flush()
        for cmd in (["ls", "-la", "/usr/lib"], ["grep", "-c", "1", nums.name], ["sort", "-n", nums.name]):
            alone = run(cmd, preload=False, env=base_env(LD_PRELOAD=je))
            both = run(cmd, preload=False, env=base_env(LD_PRELOAD=f"{je} {ARGS.lib}", FORGEALLOC_LOG="error"))
            check(both.returncode == alone.returncode == 0 and both.stdout == alone.stdout and both.stderr == "",
                  f"{cmd[0]} with jemalloc first: {both.returncode} {both.stderr[-300:]}")
    # reallocarray in a library constructor that runs before forgealloc's: jemalloc's realloc too.
    r = run([prog("p_early")], preload=False, env=base_env(LD_PRELOAD=f"{je} {ARGS.lib}", FORGEALLOC_LOG="error",
                                                         P_EARLY_QUIET="1"))
    check(r.returncode == 0 and r.stderr == "p_early: constructor\np_early: main\n",
          f"reallocarray before forgealloc's constructor, jemalloc first: {r.returncode} {r.stderr[-300:]!r}")
    # free_sized, which jemalloc does not define: jemalloc's free gets the block.
    r = run([prog("p_large"), "--sized", "100", "64K", "1M"], preload=False,
            env=base_env(LD_PRELOAD=f"{je} {ARGS.lib}", FORGEALLOC_LOG="error"))
    check(r.returncode == 0 and r.stderr == "", f"free_sized with jemalloc first: {r.returncode} {r.stderr[-300:]!r}")
    for fmt in ("text", "prometheus"):
        r = run([prog("p_large"), "1M"], preload=False,
                env=base_env(LD_PRELOAD=f"{je} {ARGS.lib}", FORGEALLOC_STATS=fmt, FORGEALLOC_LOG="error"))
        check("tcmalloc" not in r.stderr.replace("served by", ""), f"{fmt} dump shows tcmalloc: {r.stderr}")
        check("libjemalloc.so.2" in r.stderr, f"{fmt} dump does not name jemalloc: {r.stderr}")


def case_served_mimalloc_first():
    """mimalloc ahead of forgealloc defines some operator new/delete forms
    (not the nothrow deletes): the rest must reach mimalloc's, not tcmalloc."""
    mi = system_lib("libmimalloc.so.2")
    if not mi:
        print("libmimalloc.so.2 not installed (Debian: libmimalloc2) - skipped")
        return SKIP
    r = run([prog("p_cxxforms")], preload=False, env=base_env(LD_PRELOAD=mi))
    check(r.returncode == 0 and r.stdout == "ok\n", f"p_cxxforms under mimalloc alone ({r.returncode}): {r.stderr}")
    r = run([prog("p_cxxforms")], preload=False, env=base_env(LD_PRELOAD=f"{mi} {ARGS.lib}", FORGEALLOC_LOG="error"))
    check(r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "",
          f"p_cxxforms with mimalloc first ({r.returncode}): {r.stderr[-500:]}")


def case_served_python():
    """A program built without PIE that takes malloc's address (python3) is not mistaken for the allocator."""
    code = ("import ctypes; l = ctypes.CDLL(None); l.forgealloc_malloc_served_by.restype = ctypes.c_char_p\n"
            "v = ctypes.c_uint64(); assert l.forgealloc_stat(b'host.interposed', ctypes.byref(v)) == 0\n"
            "print(l.forgealloc_malloc_served_by().decode(), v.value)\n")
    r = run([ARGS.python, "-c", code])
    check(r.returncode == 0 and r.stderr == "", f"python under the shim: {r.stderr}")
    path, interposed = r.stdout.split()
    check(os.path.realpath(path) == os.path.realpath(ARGS.lib) and interposed == "1", f"served by {r.stdout!r}")


def case_served_program():
    """A program with its own malloc: nothing to fix, so nothing printed; the dump says who served."""
    r = run([prog("p_ownmalloc")])
    check(r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "", f"own malloc: {r!r}")
    _, doc = one_dump([prog("p_ownmalloc")])
    host = doc["host"]
    check(host["interposed"] is False and host["served_by"].endswith("p_ownmalloc"), f"{host}")
    check(host["tcmalloc"]["serves_malloc"] is False and host["tcmalloc"]["heap_size"] is None, f"{host['tcmalloc']}")


def case_api_bad_keys():
    """forgealloc_stat answers -1 for device indexes that overflow an int (it crashed, or returned garbage)."""
    code = ("import ctypes; l = ctypes.CDLL(None); v = ctypes.c_uint64(77)\n"
            "for k in (b'device.2147483648.device', b'device.4294967295.device', b'device.99999999999999999999.device',"
            " b'device.0.device', b'device.1', b'device.', b'host.calls.nope', b''):\n"
            "    print(k.decode(), l.forgealloc_stat(k, ctypes.byref(v)), v.value)\n")
    r = run([ARGS.python, "-c", code])
    check(r.returncode == 0, f"forgealloc_stat crashed the process ({r.returncode}): {r.stderr[-500:]}")
    rows = [line.split() for line in r.stdout.splitlines()]
    check(len(rows) == 8 and all(row[-2] == "-1" and row[-1] == "77" for row in rows), f"bad keys: {r.stdout}")


# ---- real clients -------------------------------------------------------------------

PY_WORK = ("import json\n"
           "d=[{'k%d'%i: list(range(i % 50)), 's': 'x'*(i % 300)} for i in range(20000)]\n"
           "for _ in range(3): d=json.loads(json.dumps(d))\n"
           "print(len(d))\n")


def case_python():
    _, plain = one_dump([ARGS.python, "-c", PY_WORK])
    r, raw = one_dump([ARGS.python, "-c", PY_WORK], PYTHONMALLOC="malloc")
    check(r.stdout == "20000\n", f"python output: {r.stdout!r}")
    check(plain["host"]["calls"]["malloc"] > 1000, "pymalloc run: too few mallocs counted")
    check(raw["host"]["calls"]["malloc"] > 10 * plain["host"]["calls"]["malloc"],
          f"PYTHONMALLOC=malloc should send every object to malloc: {raw['host']['calls']['malloc']} vs "
          f"{plain['host']['calls']['malloc']}")


def case_torch():
    probe = run([ARGS.python, "-c", "import torch"], preload=False)
    if probe.returncode != 0:
        print("PyTorch not installed for", ARGS.python, "- skipped")
        return SKIP
    code = ("import torch, gc\n"
            "for i in range(3):\n"
            "    sd={f'w{j}': torch.randn(256, 1024) for j in range(40)}\n"
            "    y=sum(t.sum() for t in sd.values())\n"
            "    del sd; gc.collect()\n"
            "x=torch.randn(512,512); print(float((x@x).sum()) != 0.0)\n")
    r, doc = one_dump([ARGS.python, "-c", code])
    check(r.stdout.strip() == "True", f"torch output: {r.stdout!r} {r.stderr[-1000:]}")
    check(doc["host"]["calls"]["new"] + doc["host"]["calls"]["malloc"] > 10000, "torch allocations not counted")


def case_child_dir():
    """The preload path stays valid in children started in other directories."""
    r = run(["sh", "-c", "cd / && env | grep ^LD_PRELOAD= && cd /tmp && /bin/true"])
    check(r.returncode == 0 and r.stderr == "", f"child in another directory: {r.stderr!r}")


# How a Python child waits for the signal a test sends once it printed that
# it is ready: in short sleeps.  A signal that arrives after the interpreter
# last looked for one and before the sleep's system call begins runs the C
# part of Python's handler, yet does not interrupt that sleep: a program's
# own handler would run only when a time.sleep(60) ends, after the test gave
# up.  Sent at a random point 0-100 us after "ready", SIGTERM landed there
# in 9 of 2000 tries without the shim and 3 of 2000 with it.
WAIT_FOR_SIGNAL = ("deadline = time.monotonic() + ({seconds})\n"
                   "while time.monotonic() < deadline:\n"
                   "    time.sleep(0.05)\n")


def case_signal():
    """An unhandled SIGTERM still writes the dump and still kills with SIGTERM;
    a program's own handler is left alone."""
    code = ("import signal, sys, time\n"
            "if sys.argv[1] == 'own': signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))\n"
            "print('ready', flush=True)\n"
            + WAIT_FOR_SIGNAL.format(seconds=60))
    for mode, status, reason in (("default", -signal.SIGTERM, "signal"), ("own", 5, "exit")):
        with tempfile.TemporaryDirectory() as d:
            env = base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json", LD_PRELOAD=ARGS.lib)
            p = subprocess.Popen([ARGS.python, "-c", code, mode], env=env, stdout=subprocess.PIPE, text=True)
            check(p.stdout.readline() == "ready\n", "child did not start")
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()  # nothing of the test outlives it
                p.wait()
                raise Failure(f"{mode}: still running 30 s after SIGTERM")
            docs = list(dumps(d).values())
            check(rc == status, f"{mode}: exit status {rc}, expected {status}")
            check(len(docs) == 1 and docs[0]["reason"] == reason, f"{mode}: dumps {[x.get('reason') for x in docs]}")
            check(not [f for f in os.listdir(d) if ".tmp" in f], "temporary left behind")


# ---- the program owns its signal dispositions ---------------------------------------

SIGNAL_APP = r"""
import atexit, signal, sys, time
mode = sys.argv[1]
atexit.register(lambda: print("atexit", flush=True))
if mode == "own":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))
elif mode == "dfl-again":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
print("getsignal", [getattr(h, "__name__", str(h)) for h in map(signal.getsignal, sorted(signal.valid_signals()))],
      flush=True)
try:
    print("ready", flush=True)
    deadline = time.monotonic() + (1.5 if mode == "ignored" else 60)
    while time.monotonic() < deadline:  # short sleeps, as in WAIT_FOR_SIGNAL
        time.sleep(0.05)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
finally:
    print("finally", flush=True)
"""

TEXT_HEADER = re.compile(r"^forgealloc \S+: pid (\d+) \(.*?\)(?:, forked)?, (\w+) after ", re.M)


def run_signalled(cmd, env, signals, dispositions):
    """Start cmd with the given dispositions of SIGINT and SIGTERM, send it
    `signals` once it is ready; return (status, stdout, stderr)."""
    def preexec():
        for sig, disp in dispositions.items():
            signal.signal(sig, disp)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=preexec)
    lines = [p.stdout.readline(), p.stdout.readline()]
    check(lines[1] == "ready\n", f"{cmd} did not start: {lines} {p.stderr.read() if p.poll() is not None else ''}")
    for sig in signals:
        p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise Failure(f"{cmd}: still running 30 s after {signals}")
    return p.returncode, "".join(lines) + out, err


def case_signal_owned():
    """Python under FORGEALLOC_STATS=text (a bare LD_PRELOAD and `forgealloc run`)
    behaves on SIGINT and SIGTERM exactly as without the shim, and the dump
    is still written: at exit, or by the signal that kills."""
    dfl = {signal.SIGINT: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL}
    ign = {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
    scenarios = [  # mode, signals sent, dispositions inherited, what ends the process
        ("plain", [signal.SIGINT], dfl, "exit"),  # KeyboardInterrupt, finally, atexit
        ("plain", [signal.SIGTERM], dfl, "signal"),  # killed, status -15
        ("own", [signal.SIGTERM], dfl, "exit"),  # the program's handler runs
        ("dfl-again", [signal.SIGINT], dfl, "signal"),  # SIG_DFL set again: killed, status -2
        ("ignored", [signal.SIGTERM, signal.SIGINT], ign, "exit"),  # nohup, background jobs
    ]
    launcher = os.path.join(HERE, "..", "..", "scripts", "forgealloc")
    for mode, signals, disps, ending in scenarios:
        what = f"{mode} with {[s.name for s in signals]}"
        cmd = [ARGS.python, "-c", SIGNAL_APP, mode]
        want = run_signalled(cmd, base_env(), signals, disps)
        check(want[0] == {"exit": 5 if mode == "own" else 0, "signal": -signals[0]}[ending],
              f"{what} without the shim: status {want[0]} {want[2][-500:]}")
        with tempfile.TemporaryDirectory() as d:
            env = base_env(FORGEALLOC_STATS="text", FORGEALLOC_STATS_FILE=f"{d}/%p.txt", LD_PRELOAD=ARGS.lib)
            got = run_signalled(cmd, env, signals, disps)
            files = os.listdir(d)
            text = open(os.path.join(d, files[0])).read() if len(files) == 1 else ""
        check(got[:2] == want[:2], f"{what} under LD_PRELOAD: status {got[0]}, output {got[1]!r}; "
                                   f"without the shim: status {want[0]}, output {want[1]!r}")
        check(len(files) == 1 and [m[1] for m in TEXT_HEADER.findall(text)] == [ending],
              f"{what} under LD_PRELOAD: expected one {ending} dump, got files {files} {text[:200]!r}")
        env = base_env(FORGEALLOC_LIB=ARGS.lib)
        got = run_signalled([launcher, "run", "--"] + cmd, env, signals, disps)
        check(got[:2] == want[:2], f"{what} under forgealloc run: status {got[0]}, output {got[1]!r}; "
                                   f"without the shim: status {want[0]}, output {want[1]!r}")
        check([m[1] for m in TEXT_HEADER.findall(got[2])] == [ending],
              f"{what} under forgealloc run: expected one {ending} dump on stderr, got {got[2][-600:]!r}")
        print(f"{what}: status {got[0]}, dump at {ending}")


def case_signal_queries():
    """A C program sees the same dispositions with and without the shim through
    every libc call (sigaction, signal, sysv_signal, sigset, ...), across fork
    and exec (also a fork that runs no fork handlers: _Fork, the system call), across a vfork child that
    resets them, with threads racing, and
    with one-shot handlers; the signal that finally kills it still writes the
    dump."""
    for mode, status in (("queries", 0), ("fork", 0), ("_Fork", 0), ("rawfork", 0), ("resethand", -signal.SIGTERM),
                         ("sysv", -signal.SIGTERM), ("threads", -signal.SIGTERM), ("vfork", -signal.SIGTERM),
                         ("vfork-oneshot", 0)):
        want = run([prog("p_signal"), mode], preload=False, timeout=60)
        check(want.returncode == status, f"{mode} without the shim: status {want.returncode} {want.stderr}")
        for stats in ("text", "off"):
            with tempfile.TemporaryDirectory() as d:
                got = run([prog("p_signal"), mode], timeout=60,
                          env=base_env(FORGEALLOC_STATS=stats, FORGEALLOC_STATS_FILE=f"{d}/%p.json"))
                files = os.listdir(d)
            check((got.returncode, got.stdout) == (want.returncode, want.stdout),
                  f"{mode}, FORGEALLOC_STATS={stats}: status {got.returncode}, differences:\n" +
                  "\n".join(difflib.unified_diff(want.stdout.splitlines(), got.stdout.splitlines(), lineterm="")))
            check(stats == "off" or len(files) == (2 if "ork" in mode and "vfork" not in mode else 1), f"{mode}: stats files {files}")
        print(f"{mode}: {len(want.stdout.splitlines())} lines the same")


def case_signal_exit_in_handler():
    """A C program whose signal handler calls exit() (not async-signal-safe, yet common) exits as without the
    shim, with its exit dump, wherever the signal found it: inside a large malloc or free too, holding tcmalloc's
    locks, which the dump must not wait for."""
    with tempfile.TemporaryDirectory() as d:
        for i in range(40):
            usec = 2000 + (i * 6311) % 20000
            env = base_env(LD_PRELOAD=ARGS.lib, FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/{i}.json")
            try:
                r = subprocess.run([prog("p_signal"), "exit-in-handler", str(usec)], env=env, capture_output=True,
                                   text=True, timeout=20)
            except subprocess.TimeoutExpired:
                check(False, f"run {i} ({usec} us) hung at exit")
            check(r.returncode == 3 and r.stderr == "", f"run {i}: status {r.returncode} {r.stderr[-300:]!r}")
            with open(f"{d}/{i}.json") as f:
                doc = json.load(f)
            check(doc["reason"] == "exit" and doc["host"]["calls"]["malloc"] > 0, f"run {i}: dump {doc['reason']}")


def case_signal_blocked_exit():
    """A signal kept blocked with no handler (sigwait, signalfd, Python's pthread_sigmask) at a plain exit is no
    sign of a signal handler: the dump reads tcmalloc's numbers then (not an old copy) and comes after the program's
    buffered output."""
    with tempfile.TemporaryDirectory() as d:
        r = run([prog("p_signal"), "blocked-exit"], env=base_env(FORGEALLOC_STATS="json",
                                                                  FORGEALLOC_STATS_FILE=f"{d}/s.json"))
        check(r.returncode == 0 and r.stderr == "", f"status {r.returncode} {r.stderr!r}")
        with open(f"{d}/s.json") as f:
            tc = json.load(f)["host"]["tcmalloc"]
    check(tc["age_ms"] == 0 and tc["current_allocated_bytes"] >= 200 << 20,
          f"tcmalloc's numbers at exit: age {tc['age_ms']} ms, {tc['current_allocated_bytes']} bytes in use")
    r = subprocess.run([prog("p_signal"), "blocked-exit"], env=base_env(LD_PRELOAD=ARGS.lib, FORGEALLOC_STATS="text"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    check(r.returncode == 0 and r.stdout.startswith("program output line\nforgealloc "), f"order: {r.stdout[:200]!r}")


def case_large_small_stack():
    """Large allocations need no more of the caller's stack under the shim than under plain tcmalloc, less 512
    bytes: a thread with a small stack that plain tcmalloc serves is served the same (a large calloc's pagemap
    reads once took 4 KiB more)."""
    tc = system_lib("libtcmalloc_minimal.so.4")
    if not tc:
        print("libtcmalloc_minimal.so.4 not found - skipped")
        return SKIP
    stack = 32768

    def fits(lib, used):
        r = subprocess.run([prog("p_smallstack"), str(stack), str(used)], env=base_env(LD_PRELOAD=lib),
                           capture_output=True, text=True, timeout=60)
        return r.returncode == 0 and r.stdout == "ok\n"

    used, too_much = 4096, stack  # the most stack a program may use under plain tcmalloc, in 256-byte steps
    check(fits(tc, used), "plain tcmalloc cannot serve a thread with 28 KiB of stack left")
    while too_much - used > 256:
        mid = (used + too_much) // 2 // 256 * 256
        if fits(tc, mid):
            used = mid
        else:
            too_much = mid
    check(fits(ARGS.lib, used - 512),
          f"plain tcmalloc works with {stack - used} bytes of stack left; forgealloc not with {stack - used + 512}")


def case_signal_pid1():
    """As a container's PID 1 (no init in front), SIGTERM from another process is ignored by the kernel: under the
    shim it must interrupt nothing either (no EINTR from poll), a one-shot handler resets to a disposition that
    ignores the next signal, and a forked child still dies of SIGTERM with its dump."""
    probe = run(["unshare", "--pid", "--fork", "--mount-proc", "true"], preload=False)
    if probe.returncode != 0:
        print(f"pid namespaces not permitted here ({probe.stderr.strip()}) - skipped")
        return SKIP
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", prog("p_signal"), "pid1"]
    want = run(cmd, preload=False, timeout=60)
    check(want.returncode == 0 and "poll across SIGTERM: 0" in want.stdout, f"without the shim: {want!r}")
    with tempfile.TemporaryDirectory() as d:
        got = run(cmd, timeout=60, env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%h-%p.json"))
        docs = [json.load(open(f"{d}/{f}")) for f in os.listdir(d)]
    check((got.returncode, got.stdout) == (want.returncode, want.stdout),
          f"status {got.returncode}, differences:\n" +
          "\n".join(difflib.unified_diff(want.stdout.splitlines(), got.stdout.splitlines(), lineterm="")))
    reasons = sorted(doc["reason"] for doc in docs if doc["exe"].endswith("p_signal"))
    check(reasons == ["exit", "signal"], f"PID 1's exit dump and its child's signal dump: {reasons}")


def case_signal_two_threads():
    """SIGTERM and SIGINT sent back to back land on two threads at once: the
    two signal dumps do not share buffers; one complete dump, death by one of
    the two signals, no temporary left."""
    for i in range(40):
        with tempfile.TemporaryDirectory() as d:
            p = start_hammer(d)
            os.kill(p.pid, signal.SIGTERM)
            os.kill(p.pid, signal.SIGINT)
            try:
                rc = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                raise Failure(f"run {i}: no exit 20 s after two signals")
            names = os.listdir(d)
            docs = list(dumps(d).values())
        check(rc in (-signal.SIGTERM, -signal.SIGINT), f"run {i}: status {rc}")
        check(len(docs) == 1 and docs[0]["reason"] == "signal", f"run {i}: files {names}")
        check(not check_stats_json.problems(docs[0]), f"run {i}: contract")
        check(not [n for n in names if ".tmp" in n], f"run {i}: temporaries left: {names}")


SIGSTACK_USED = re.compile(r"used (\d+) bytes(?:, (\d+) below the SIGUSR1 handler)?")


def case_signal_small_stack():
    """The signal dump fits in SIGSTKSZ (8192 bytes) with room to spare.
    SIGTERM arrives while the program runs on a small stack of its own, or
    in its SIGUSR1 handler on its own sigaltstack (the delivery nests on
    that stack: two signal frames); the dump is written, the process dies of
    SIGTERM, and the guard below the stack is untouched.  Every format, to a
    file (the first write of a process also sweeps the directory), to
    stderr, and to a path that cannot be written (the warning).  The
    kernel's signal frame alone takes 1-4 KiB (the vector registers: 3.4
    KiB with AVX-512); beyond the second frame, the dump may take at most
    512 bytes of the program's sigaltstack (its work runs on a stack of
    its own)."""
    for mode, size in (("stack", 8192), ("stack", 6144), ("altstack", 8192)):
        cmd = [prog("p_sigstack"), mode, str(size)]
        plain = run(cmd, preload=False, timeout=60)
        check(plain.returncode == 0, f"{mode} {size} without the shim: {plain.stdout} {plain.stderr}")
        print("without the shim:", plain.stdout.strip())
        m = SIGSTACK_USED.search(plain.stdout)
        frame = int(m[1]) - int(m[2]) if m and m[2] else None  # the first frame, down to the handler's local
        for fmt in ("json", "text", "prometheus"):
            for where in ("file", "stderr", "unwritable"):
                what = f"{mode} {size}, {fmt} to {where}"
                with tempfile.TemporaryDirectory() as d:
                    target = {"file": f"{d}/%p.{fmt}", "stderr": "-", "unwritable": f"{d}/missing/x"}[where]
                    r = run(cmd, env=base_env(FORGEALLOC_STATS=fmt, FORGEALLOC_STATS_FILE=target), timeout=60)
                    files = os.listdir(d)
                    text = open(os.path.join(d, files[0])).read() if where == "file" and len(files) == 1 else ""
                check(r.returncode == 0, f"{what}: {r.stdout.strip()} {r.stderr[-300:]!r}")
                m = SIGSTACK_USED.search(r.stdout)
                if frame is not None:
                    check(m and m[2] and int(m[2]) <= frame + 512,
                          f"{what}: {r.stdout.strip()}; the first signal frame took {frame} bytes, so the dump "
                          f"took more than 512 bytes of the program's stack")
                if where == "file":
                    check(len(files) == 1 and r.stderr == "", f"{what}: files {files}, stderr {r.stderr[-300:]!r}")
                elif where == "stderr":
                    check(files == [], f"{what}: files {files}")
                    text = r.stderr
                else:
                    check(files == [] and r.stderr == f"forgealloc: cannot write stats to '{d}/missing/x': no such "
                          "file or directory; set FORGEALLOC_STATS_FILE to a writable path, or - for stderr\n",
                          f"{what}: files {files}, stderr {r.stderr[-300:]!r}")
                    print(f"{what}: {r.stdout.strip()}")
                    continue
                if fmt == "json":
                    doc = json.loads(text)
                    check(doc["reason"] == "signal" and not check_stats_json.problems(doc), f"{what}: {text[:300]!r}")
                elif fmt == "text":
                    check([m[1] for m in TEXT_HEADER.findall(text)] == ["signal"], f"{what}: {text[:300]!r}")
                else:
                    check(text.startswith("# HELP forgealloc_info") and text.endswith("\n"), f"{what}: {text[:300]!r}")
                print(f"{what}: {r.stdout.strip()}")


# ---- hardening: fork, threads, signals, exits, files, settings --------------------------

def case_forkstorm():
    """Threads allocate without pause while the process forks 200 times;
    children allocate and end with exit() or _exit(); each exit() child
    writes its own file with its own numbers."""
    with tempfile.TemporaryDirectory() as d:
        r = run([prog("p_hard"), "forkstorm", "200"], timeout=170,
                env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json"))
        check(r.returncode == 0, f"fork storm failed ({r.returncode}): {r.stderr[-2000:]}")
        docs = list(dumps(d).values())
        leftovers = [f for f in os.listdir(d) if ".tmp-" in f]
    parent = [x for x in docs if not x["forked"]]
    children = [x for x in docs if x["forked"]]
    check(len(parent) == 1 and len(children) == 100, f"{len(parent)} parent and {len(children)} child files")
    check(all(x["ppid"] == parent[0]["pid"] for x in children), "children's ppid")
    counts = [x["host"]["calls"]["malloc"] for x in children]
    check(all(100 <= c < 200 for c in counts), f"children's own malloc counts: {sorted(set(counts))}")
    check(not leftovers, f"temporaries left: {leftovers}")


def case_thread_churn():
    """Thousands of short-lived threads: exact counts, records reused."""
    r = run([prog("p_hard"), "threads", "2000", "50"], timeout=170)
    check(r.returncode == 0, f"thread churn: {r.stdout} {r.stderr}")
    print(r.stdout.strip())
    r = run([prog("p_hard"), "detached", "20"], timeout=170)
    check(r.returncode == 0, f"detached threads that never allocate: {r.stdout} {r.stderr}")
    print(r.stdout.strip())


def case_crossfree():
    """Two million blocks freed by another thread than the one that made them."""
    r = run([prog("p_hard"), "crossfree", "2000000"], timeout=170)
    check(r.returncode == 0 and "corrupted bytes 0" in r.stdout, f"cross-thread frees: {r.stdout} {r.stderr}")


def start_hammer(d, **env):
    settings = {"FORGEALLOC_STATS": "json", "FORGEALLOC_STATS_FILE": f"{d}/%p.json", **env}
    p = subprocess.Popen([prog("p_hard"), "hammer"], stdout=subprocess.PIPE, text=True,
                         env=dict(base_env(**settings), LD_PRELOAD=ARGS.lib))
    check(p.stdout.readline() == "ready\n", "hammer did not start")
    return p


def case_signal_inside_malloc():
    """SIGTERM and SIGINT landing while three threads allocate without
    pause: the dump is written, the process dies of the signal, never hangs."""
    import random
    rng = random.Random(5)
    for i in range(30):
        sig = signal.SIGTERM if i % 3 else signal.SIGINT
        with tempfile.TemporaryDirectory() as d:
            p = start_hammer(d)
            time.sleep(rng.uniform(0.0, 0.05))
            p.send_signal(sig)
            try:
                rc = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                raise Failure(f"run {i}: no exit 20 s after {sig.name}: the signal path deadlocked")
            docs = list(dumps(d).values())
            check(rc == -sig, f"run {i}: status {rc}, expected death by {sig.name}")
            check(len(docs) == 1 and docs[0]["reason"] == "signal", f"run {i}: dumps {docs and docs[0]['reason']}")
            check(not check_stats_json.problems(docs[0]), f"run {i}: contract")
            check(docs[0]["host"]["tcmalloc"]["valid"], f"run {i}: no copy of tcmalloc's numbers in the dump")


def case_signal_fork_numbers():
    """A forked child's signal-time dump has tcmalloc's numbers as of the
    fork, not the parent's last refresh before it (the child's copy is
    refreshed by the fork)."""
    code = ("import os, signal, time\n"
            "time.sleep(0.6)\n"
            "if os.fork() == 0:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    os._exit(3)\n"
            "os.wait()\n")
    with tempfile.TemporaryDirectory() as d:
        r = run([ARGS.python, "-c", code], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json"))
        check(r.returncode == 0, f"python exited {r.returncode}: {r.stderr[-2000:]}")
        child = [doc for doc in dumps(d).values() if doc["forked"]]
    check(len(child) == 1 and child[0]["reason"] == "signal", f"child dumps: {[c['reason'] for c in child]}")
    tc = child[0]["host"]["tcmalloc"]
    check(tc["valid"], "no copy of tcmalloc's numbers in the child's signal-time dump")
    check(tc["age_ms"] < 300, f"the child's tcmalloc numbers are {tc['age_ms']} ms old: the parent's, from before the fork")


def case_fork_vfork_exit():
    """A vfork child that calls exit() instead of _exit() runs the exit handlers in its parent's memory: it writes
    no dump (the parent's numbers under its own pid), and the parent's background thread goes on: its periodic
    dumps, and the memory it frees later going back to the OS."""
    with tempfile.TemporaryDirectory() as d:
        r = run([prog("p_fork"), "vfork-exit", "3"], timeout=60,
                env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json",
                             FORGEALLOC_STATS_INTERVAL="200ms", FORGEALLOC_RELEASE_DELAY="300ms"))
        docs = dumps(d)
    check(r.returncode == 0, f"status {r.returncode}: {r.stderr[-1000:]}")
    shown = [(doc["reason"], doc["uptime_ms"], doc["host"]["calls"]["malloc"]) for doc in docs.values()]
    check(len(docs) == 1, f"expected the parent's stats file only, got {shown}")
    doc = next(iter(docs.values()))
    check(doc["reason"] == "interval" and doc["uptime_ms"] >= 2500,
          f"the parent's periodic dumps stopped at the vfork child's exit: {shown}")
    end = ended_mb(r.stdout)
    check(end is not None and end <= 100, f"the parent kept the memory it freed after the vfork: {r.stdout!r}")


def case_fork_no_handlers():
    """A child of a fork that runs no fork handlers (glibc's _Fork, the fork or clone system call) behaves as a
    forked one: it starts its own background thread (the parent's does not exist in it), so the memory it frees
    goes back to the OS and its periodic dumps are written, and its dumps say it was forked and count its own calls
    (the parent made 5000 mallocs before the fork, the child 200)."""
    for kind in ("_Fork", "rawfork", "clone"):
        with tempfile.TemporaryDirectory() as d:
            r = run([prog("p_fork"), "nohandlers", kind, "2", d], timeout=60,
                    env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json",
                                 FORGEALLOC_STATS_INTERVAL="300ms", FORGEALLOC_RELEASE_DELAY="300ms"))
            docs = dumps(d)
        check(r.returncode == 0, f"{kind}: status {r.returncode}: {r.stderr[-1000:]}")
        end = ended_mb(r.stdout, "child ")
        check(end is not None and end <= 100, f"{kind}: the child kept the memory it freed: {r.stdout!r}")
        check("child_file 1" in r.stdout, f"{kind}: no periodic dump from the child: {r.stdout!r}")
        forked = [doc for doc in docs.values() if doc["forked"]]
        check(len(docs) == 2 and len(forked) == 1 and forked[0]["reason"] == "exit",
              f"{kind}: dumps {[(doc['reason'], doc['forked']) for doc in docs.values()]}, expected the parent's "
              "and the forked child's")
        mallocs = forked[0]["host"]["calls"]["malloc"]
        check(200 <= mallocs < 1000, f"{kind}: the child counted {mallocs} mallocs, expected its own 200 and a few")
        print(f"{kind}: child rss_end_mb {end}, mallocs {mallocs}")


def case_fork_no_handlers_small():
    """A child of a fork that runs no fork handlers takes the state over at its first small malloc: with
    FORGEALLOC_STATS_INTERVAL its background thread starts, and its periodic dump is written, though it never
    allocates a large block."""
    for kind in ("_Fork", "rawfork"):
        with tempfile.TemporaryDirectory() as d:
            r = run([prog("p_fork"), "nohandlers-small", kind, "1.5", d], timeout=60,
                    env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json",
                                 FORGEALLOC_STATS_INTERVAL="300ms"))
        check(r.returncode == 0, f"{kind}: status {r.returncode}: {r.stderr[-1000:]}")
        check("child_file 1" in r.stdout, f"{kind}: no periodic dump from the child: {r.stdout!r}")


def case_fork_idle_interval():
    """With FORGEALLOC_STATS_INTERVAL, a forked child that makes no allocator call (a worker waiting for its first
    task) writes its periodic dumps too: its background thread starts at the fork, as a process's does at its
    start."""
    with tempfile.TemporaryDirectory() as d:
        r = run([prog("p_fork"), "idle", "1.5", d], timeout=60,
                env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json",
                             FORGEALLOC_STATS_INTERVAL="300ms"))
        docs = dumps(d)
    check(r.returncode == 0, f"status {r.returncode}: {r.stderr[-1000:]}")
    check("child_file 1" in r.stdout, f"no periodic dump from the idle child: {r.stdout!r}")
    forked = [doc for doc in docs.values() if doc["forked"]]
    check(len(forked) == 1 and forked[0]["reason"] == "interval", f"the child's dumps: {forked}")


def case_signal_off():
    """FORGEALLOC_STATS_ON_SIGNAL=0: no handler, the signal acts as usual."""
    with tempfile.TemporaryDirectory() as d:
        p = start_hammer(d, FORGEALLOC_STATS_ON_SIGNAL="0")
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=20)
        check(rc == -signal.SIGTERM and not os.listdir(d), f"status {rc}, files {os.listdir(d)}")


def case_exit_paths():
    """exit and return from main dump; _exit and abort cannot (and leave nothing half-written)."""
    for how, status, dumped in (("exit", 0, True), ("return", 0, True), ("_exit", 0, False),
                                ("abort", -signal.SIGABRT, False)):
        with tempfile.TemporaryDirectory() as d:
            r = run([prog("p_hard"), "end", how],
                    env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json"))
            files = os.listdir(d)
            check(r.returncode == status, f"{how}: status {r.returncode}")
            check(len(files) == (1 if dumped else 0), f"{how}: files {files}")
            if dumped:
                check(dumps(d) and list(dumps(d).values())[0]["reason"] == "exit", f"{how}: reason")
    # With 2>&1 into a file, the dump comes after the program's last lines,
    # which exit() would flush only after every destructor.
    def combined(mode):
        with tempfile.TemporaryFile("w+") as out:
            env = base_env(FORGEALLOC_STATS="text", LD_PRELOAD=ARGS.lib)
            r = subprocess.run([prog("p_calls"), mode, "the program's last line"], env=env, stdout=out,
                               stderr=subprocess.STDOUT, timeout=60)
            out.seek(0)
            return r.returncode, out.read().splitlines()

    status, lines = combined("print")
    check(status == 0, f"p_calls print exited {status}")
    check(len(lines) > 1 and lines[0] == "the program's last line" and lines[1].startswith("forgealloc "),
          f"2>&1 into a file: the dump did not follow the program's output: {lines[:3]}")
    # A program that closed stdout and set it to NULL at exit, or pointed it
    # at a stream it closed (its memory reused): the dump is written as
    # usual, and nothing reads the stale stream.
    for mode in ("print-null", "print-swap"):
        status, lines = combined(mode)
        check(status == 0, f"p_calls {mode} exited {status}: {lines[:3]}")
        check(lines[:1] == ["the program's last line"] and any(x.startswith("forgealloc ") for x in lines),
              f"p_calls {mode}: {lines[:3]}")
    # stdout a pipe nobody reads (alone, and with stderr on it too): the
    # program dies of SIGPIPE at exit as it does without the shim, and only
    # after its dump where that goes elsewhere.
    for shared in (False, True):
        statuses = []
        for preload in (False, True):
            read_end, write_end = os.pipe()
            os.close(read_end)
            env = base_env(FORGEALLOC_STATS="text", **({"LD_PRELOAD": ARGS.lib} if preload else {}))
            r = subprocess.run([prog("p_calls"), "print", "nobody reads this"], env=env, stdout=write_end,
                               stderr=write_end if shared else subprocess.PIPE, text=True, timeout=60)
            os.close(write_end)
            statuses.append(r.returncode)
            if preload and not shared:
                check(r.stderr.startswith("forgealloc "), f"stdout without a reader: no dump: {r.stderr[:200]!r}")
        check(statuses[0] == statuses[1] == -signal.SIGPIPE, f"stdout without a reader (stderr too: {shared}): "
              f"status {statuses[1]} under the shim, {statuses[0]} without it")


def case_interval():
    """FORGEALLOC_STATS_INTERVAL keeps a file current for processes that end with os._exit."""
    code = "import os, time; x = [bytes(1000) for _ in range(10000)]; time.sleep(1.0); os._exit(0)"
    with tempfile.TemporaryDirectory() as d:
        r = run([ARGS.python, "-c", code], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json",
                                                        FORGEALLOC_STATS_INTERVAL="200ms"))
        docs = list(dumps(d).values())
    check(r.returncode == 0 and len(docs) == 1 and docs[0]["reason"] == "interval", f"interval dump: {docs}")
    check(docs[0]["host"]["calls"]["malloc"] > 0, "interval dump has counts")
    # A forked worker that allocates a little and ends with os._exit (a
    # multiprocessing worker) keeps its own file current too.
    code = ("import os, time\npid = os.fork()\nif pid == 0:\n    x = [bytes(100) for _ in range(20)]\n"
            "    time.sleep(1.0)\n    os._exit(0)\nos.waitpid(pid, 0)\nos._exit(0)\n")
    with tempfile.TemporaryDirectory() as d:
        r = run([ARGS.python, "-c", code], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/%p.json",
                                                        FORGEALLOC_STATS_INTERVAL="200ms"))
        docs = dumps(d)
    check(r.returncode == 0 and len(docs) == 2 and all(doc["reason"] == "interval" for doc in docs.values()),
          f"forked worker's interval dump: {[(pid, doc['reason'], doc['forked']) for pid, doc in docs.items()]}")
    r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_INTERVAL="1"))
    check(r.returncode == 0 and "FORGEALLOC_STATS_INTERVAL needs FORGEALLOC_STATS_FILE" in r.stderr, r.stderr)
    # Stats left unset: the interval does nothing, and says so once per tree;
    # turned off on purpose: nothing is said.
    r = run(["/bin/sh", "-c", "/bin/true; /bin/true"], env=base_env(FORGEALLOC_STATS_INTERVAL="1"))
    check(r.returncode == 0 and r.stderr == "forgealloc: FORGEALLOC_STATS_INTERVAL needs FORGEALLOC_STATS set (json, "
          "text or prometheus) and FORGEALLOC_STATS_FILE; periodic dumps are off\n", repr(r.stderr))
    r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="off", FORGEALLOC_STATS_INTERVAL="1"))
    check(r.returncode == 0 and r.stderr == "", repr(r.stderr))


def case_stats_file_in_place():
    """A stats file that cannot be replaced is rewritten where it is: a bind-mounted file (docker -v FILE:PATH),
    and a file the user may write in a directory it may not.  A private file stays private."""
    if os.geteuid() != 0:
        print("needs root (a bind mount, another user) - skipped")
        return SKIP
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        shutil.copy(ARGS.lib, f"{d}/lib.so")
        os.chmod(f"{d}/lib.so", 0o755)
        outside, inside = f"{d}/outside.json", f"{d}/box/stats.json"
        os.mkdir(f"{d}/box")
        for path in (outside, inside):
            with open(path, "w") as f:
                f.write("old")
        os.chmod(outside, 0o600)
        shown = (f"exec env LD_PRELOAD={d}/lib.so FORGEALLOC_STATS=json FORGEALLOC_STATS_FILE={inside} /bin/true")
        r = run(["unshare", "-m", "sh", "-c", f"mount --bind {outside} {inside} && {shown}"], preload=False)
        if r.returncode != 0 and "mount" in r.stderr and "stats" not in r.stderr:
            print(f"bind mounts not permitted here ({r.stderr.strip()}) - skipped")
            return SKIP
        check(r.returncode == 0 and r.stderr == "", f"bind-mounted stats file: {r.returncode} {r.stderr!r}")
        with open(outside) as f:
            doc = json.load(f)
        check(doc["reason"] == "exit", f"the mounted file's dump: {doc['reason']}")
        check(os.stat(outside).st_mode & 0o777 == 0o600, "the private file's permissions changed")
        # A file of user 65534's in a directory of root's that it cannot write.
        os.chown(f"{d}/box", 0, 0)
        os.chmod(f"{d}/box", 0o755)
        os.unlink(inside)
        with open(inside, "w") as f:
            f.write("old")
        os.chown(inside, 65534, 65534)
        r = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/true"], preload=False,
                env=base_env(LD_PRELOAD=f"{d}/lib.so", FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=inside))
        check(r.returncode == 0 and r.stderr == "", f"a file in a directory not writable: {r.returncode} {r.stderr!r}")
        with open(inside) as f:
            check(json.load(f)["reason"] == "exit", "the file's dump")
        check(os.listdir(f"{d}/box") == ["stats.json"], f"left behind: {os.listdir(f'{d}/box')}")


def case_file_size_limit():
    """Under a file size limit (ulimit -f) that the dump exceeds, the program is not killed by SIGXFSZ: exit status
    0, no temporary left, one line saying why the file is missing; the same for a dump to a stderr file at its
    limit."""
    with tempfile.TemporaryDirectory() as d:
        pre = f"ulimit -f 1; exec env LD_PRELOAD={ARGS.lib}"
        r = run(["sh", "-c", f"{pre} FORGEALLOC_STATS=json FORGEALLOC_STATS_FILE={d}/s.json /bin/true"], preload=False)
        check(r.returncode == 0, f"killed under ulimit -f: status {r.returncode} {r.stderr!r}")
        check(os.listdir(d) == [], f"left behind: {os.listdir(d)}")
        check(len(r.stderr.splitlines()) == 1 and "file size limit" in r.stderr, f"the line: {r.stderr!r}")
        with open(f"{d}/err.log", "w") as f:
            f.write("x" * 2048)
        r = run(["sh", "-c", f"{pre} FORGEALLOC_STATS=text /bin/true 2>>{d}/err.log"], preload=False)
        check(r.returncode == 0, f"killed writing to a stderr file at the limit: status {r.returncode}")
        check(os.path.getsize(f"{d}/err.log") == 2048, "the stderr file grew past the limit")


def case_killed_mid_dump():
    """SIGKILL while dumps are being written every 5 ms: the file is complete
    or absent, never partial; temporaries of killed processes are swept by
    the next dump in the directory."""
    import random
    rng = random.Random(9)
    with tempfile.TemporaryDirectory() as d:
        for i in range(25):
            p = start_hammer(d, FORGEALLOC_STATS_FILE=f"{d}/s-{i}.json", FORGEALLOC_STATS_INTERVAL="5ms")
            time.sleep(rng.uniform(0.02, 0.12))
            p.kill()
            p.wait(timeout=20)
            path = f"{d}/s-{i}.json"
            if os.path.exists(path):
                with open(path) as f:
                    try:
                        json.load(f)
                    except ValueError as e:
                        raise Failure(f"run {i}: a partial stats file: {e}")
        r = run(["/bin/true"], env=base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/last.json"))
        check(r.returncode == 0, r.stderr)
        left = [f for f in os.listdir(d) if ".tmp-" in f]
        check(not left, f"temporaries of killed processes not swept: {left}")


HOSTILE = ["", " ", "-1", "abc", "1e99", "12X", "99999999999999999999999999", "18446744073709551616",
           "99999999999T", "0x10", "1,5G", "%", "%%%", "nan", "inf", "\u00e9t\u00e9", "1\tG", "yes please",
           "-", "9" * 5000]


def case_hostile_settings():
    """Every library setting with hostile values: the program is unchanged, one line per bad setting."""
    table = open(os.path.join(os.path.dirname(HERE), "..", "src", "core", "options.def")).read()
    names = ["FORGEALLOC_" + n for n, scope in re.findall(r"^FA_OPTION\((\w+),[^\n]*\b(LIB|LAUNCHER),", table, re.M)
             if scope == "LIB"]
    check(len(names) >= 10, f"settings found: {names}")
    for name in names:
        for value in HOSTILE + ["\udcff\udcfe"]:
            env = base_env()
            env[name] = value
            try:
                r = subprocess.run(["echo", "ok"], env=dict(env, LD_PRELOAD=ARGS.lib), capture_output=True,
                                   timeout=20)
            except UnicodeEncodeError:  # non-UTF-8 bytes: pass them as bytes
                envb = {k.encode(): v.encode("utf-8", "surrogateescape") for k, v in env.items()}
                envb[b"LD_PRELOAD"] = ARGS.lib.encode()
                r = subprocess.run(["echo", "ok"], env=envb, capture_output=True, timeout=20)
            check(r.returncode == 0 and r.stdout == b"ok\n", f"{name}={value[:20]!r}: output {r.stdout!r}")
            lines = r.stderr.decode("utf-8", "replace").splitlines()
            check(len(lines) <= 1, f"{name}={value[:20]!r}: {len(lines)} lines: {r.stderr[:300]!r}")
            check(all(len(line) < 400 and line.startswith("forgealloc: ") for line in lines), f"{name}: {lines}")
    # All at once: exactly one line per bad setting, and strict mode refuses.
    env = base_env(**{n: "abc" for n in names if n not in ("FORGEALLOC_STATS_FILE",)})
    r = subprocess.run(["echo", "ok"], env=dict(env, LD_PRELOAD=ARGS.lib), capture_output=True, text=True)
    bad = len([n for n in names if n != "FORGEALLOC_STATS_FILE"])
    check(r.stdout == "ok\n" and len(r.stderr.splitlines()) == bad, f"{bad} bad settings: {r.stderr!r}")
    r = subprocess.run(["echo", "ok"], env=dict(env, LD_PRELOAD=ARGS.lib, FORGEALLOC_STRICT="1"),
                       capture_output=True, text=True)
    check(r.returncode == 2 and r.stdout == "" and "refusing to start" in r.stderr.splitlines()[-1], r.stderr)


def case_secure():
    """A setuid program (AT_SECURE) takes no stats path from the environment: its dump goes to stderr."""
    import shutil
    import stat
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("needs root and setpriv to make a setuid program - skipped")
        return SKIP
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    d = tempfile.mkdtemp()
    try:
        os.chmod(d, 0o777)  # writable by anyone: only AT_SECURE may stop the file
        exe = os.path.join(d, "p_secure")
        shutil.copy(prog("p_secure"), exe)
        os.chmod(exe, 0o755)
        # Periodic dumps asked for: a secure process makes none (they would go to its stderr).
        env = base_env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE=f"{d}/s-%p.json", FORGEALLOC_STATS_INTERVAL="0.1")
        # Control: without the setuid bit the file is written.
        r = run(nobody + [exe], preload=False, env=env)
        check(r.returncode == 0 and len(dumps(d)) == 1, f"control run: {r.returncode} {os.listdir(d)} {r.stderr}")
        for f in os.listdir(d):
            if f.endswith(".json"):
                os.unlink(os.path.join(d, f))
        os.chmod(exe, 0o755 | stat.S_ISUID)
        r = run(nobody + [exe], preload=False, env=env)
        check(r.returncode == 0, f"setuid run failed: {r.stderr}")
        check(not [f for f in os.listdir(d) if f.endswith(".json")], f"a secure process wrote {os.listdir(d)}")
        doc = json.loads(r.stderr)  # one document: the exit dump, no periodic ones
        check(doc["pid"] > 0 and doc["host"]["calls"]["malloc"] >= 100 and doc["reason"] == "exit",
              "the dump went to stderr instead")
    finally:
        shutil.rmtree(d)


def case_tc_reads_paced():
    """The copy of tcmalloc's numbers that signal-time reports use is refreshed at most every 100 ms: each refresh
    walks all of tcmalloc's caches under their locks, five times, and threads that free small blocks fast made one
    every 65,536 frees (about 60 in a 2-thread run of 2 million pairs each, where the other thread waited for the
    locks).  Counted by a library preloaded beside the shim that sees every read, with the text dump on as the
    launchers set it."""
    lib = os.path.join(ARGS.bindir, "libp_tcprop_lib.so")
    with tempfile.TemporaryDirectory() as d:
        r = run([prog("p_pairs"), "2", "2000000"], preload=False, timeout=120,
                env=base_env(LD_PRELOAD=f"{ARGS.lib} {lib}", FORGEALLOC_STATS="text",
                             FORGEALLOC_STATS_FILE=f"{d}/%p.txt"))
    check(r.returncode == 0, f"p_pairs exited {r.returncode}: {r.stderr[-500:]}")
    ms = int(re.search(r"ms (\d+)", r.stdout).group(1))
    walks = int(re.search(r"tcprop walks (\d+)", r.stderr).group(1))
    # One at the start, one per 100 ms (a coarse tick late), the exit dump's.
    most = 2 + (ms + 4) // 100 + 1
    check(walks <= most, f"{walks} walks of tcmalloc's caches in {ms} ms of small frees (at most {most})")


def case_io_wrapper():
    """Another preloaded library wraps open and pread and allocates in them (tracers, sandboxes): nothing hangs,
    at tcmalloc's start (the start fill reads /proc while tcmalloc holds its lock) or in a large calloc; output
    and status as without the shim."""
    lib = os.path.join(ARGS.bindir, "libp_iowrap_lib.so")
    with tempfile.TemporaryDirectory() as d:
        for cmd in (["/bin/echo", "hi"], [ARGS.python, "-c", "import json; print(json.dumps([1, 2]))"],
                    [prog("p_calloc")]):
            alone = run(cmd, preload=False, env=base_env(LD_PRELOAD=lib), timeout=60)
            try:
                both = run(cmd, preload=False, timeout=30,
                           env=base_env(LD_PRELOAD=f"{ARGS.lib} {lib}", FORGEALLOC_STATS="text",
                                        FORGEALLOC_STATS_FILE=f"{d}/%p.txt"))
            except subprocess.TimeoutExpired:
                check(False, f"{cmd[0]} hung with a wrapper of open that allocates")
            same = both.stdout == alone.stdout or cmd[0] == prog("p_calloc")  # it prints resident sizes
            check(both.returncode == alone.returncode == 0 and same,
                  f"{cmd[0]} with an io wrapper: {both.returncode} {both.stdout[-300:]!r} {both.stderr[-300:]!r}")
        check(len(os.listdir(d)) == 3, f"dumps written: {os.listdir(d)}")


def case_real_tools():
    """git and gcc work under the shim, and gcc's output is byte-identical."""
    import shutil
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "x.c")
        open(src, "w").write("#include <stdio.h>\nint main(void){puts(\"hi\");return 0;}\n")
        objs = []
        for preload in (False, True):
            obj = os.path.join(d, f"x{int(preload)}.o")
            r = run(["gcc", "-O2", "-c", src, "-o", obj], preload=preload)
            check(r.returncode == 0 and r.stderr == "", f"gcc under the shim={preload}: {r.stderr}")
            objs.append(open(obj, "rb").read())
        check(objs[0] == objs[1], "gcc produced different code under the shim")
        if shutil.which("git"):
            env = base_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                           GIT_COMMITTER_EMAIL="t@t", HOME=d)
            for cmd in (["git", "init", "-q", d], ["git", "-C", d, "add", "x.c"],
                        ["git", "-C", d, "commit", "-qm", "x"], ["git", "-C", d, "log", "--oneline"]):
                r = run(cmd, env=env)
                check(r.returncode == 0, f"{cmd}: {r.stderr}")


def case_cpython_suite():
    """A subset of CPython's own tests gives the same result with and without
    the shim, the shim writing text dumps (test_signal: the dump on SIGTERM and
    SIGINT is invisible to the program)."""
    tests = ["test_json", "test_dict", "test_list", "test_set", "test_gc", "test_bytes", "test_re", "test_io",
             "test_mmap", "test_ctypes", "test_subprocess", "test_signal"]
    probe = run([ARGS.python, "-c", "import test.libregrtest, test.test_json, test.test_subprocess"], preload=False)
    if probe.returncode != 0:
        print("CPython's test suite is not installed (Debian: libpython3-testsuite) - skipped")
        return SKIP
    results = []
    with tempfile.TemporaryDirectory() as d:
        for preload in (False, True):
            # Dumps go to files: tests compare their subprocesses' stderr.
            env = base_env(FORGEALLOC_STATS="text", FORGEALLOC_STATS_FILE=f"{d}/%p.txt")
            r = run([ARGS.python, "-m", "test", "-j2", "--timeout", "300"] + tests, preload=preload, env=env,
                    timeout=900)
            summary = [line for line in r.stdout.splitlines() if re.match(r"^(Tests result|\d+ tests? (OK|failed|skipped))", line)]
            results.append((r.returncode, summary))
        ndumps = len(os.listdir(d))
    check(results[0] == results[1], f"different results: without {results[0]}, with {results[1]}")
    check(results[1][0] == 0, f"the suite failed under the shim: {results[1]}")
    check(ndumps >= len(tests), f"only {ndumps} stats files written under the shim")


def options(ap):
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--python", default=DEFAULT_PYTHON)


if __name__ == "__main__":
    sys.exit(main(globals(), "ARGS", options))
