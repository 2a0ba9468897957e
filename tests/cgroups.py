"""cgroups.py - a fresh cgroup of the tests' or benchmarks' own, with a limit set.

Used by tests/preload/run.py and tests/bench/run.py.  Needs root and a
memory (or pids) controller: cgroup v1, or v2 with the controller enabled
where our cgroup lives.  Where none can be made, the reason is printed
and None is given instead."""
import contextlib
import os
import time


def new_cgroup(controller, v1_limit, v2_limit):
    """A fresh cgroup under ours with `controller`: (directory, limit file),
    or None with the reason printed."""
    if os.geteuid() != 0:
        print(f"skipped: creating a {controller} cgroup needs root")
        return None
    with open("/proc/self/cgroup") as f:
        lines = [ln.strip().split(":", 2) for ln in f if ln.strip()]
    candidates = []
    for _, ctrl, path in lines:
        if controller in ctrl.split(","):
            candidates.append((f"/sys/fs/cgroup/{controller}{path}", v1_limit))
    for _, ctrl, path in lines:
        if ctrl == "":
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                if os.path.exists(f"{root}/cgroup.controllers"):
                    candidates.append((f"{root}{path}", v2_limit))
    for base, limit in candidates:
        d = os.path.join(base, f"forgealloc-test-{os.getpid()}")
        try:
            os.mkdir(d)
        except OSError:
            continue
        if os.path.exists(os.path.join(d, limit)):
            return d, limit
        os.rmdir(d)
    print(f"skipped: no {controller} cgroup can be created here (cgroup v1 {controller} controller or v2 with "
          f"{controller} enabled)")
    return None


CGROUP_LIMITS = {"memory": ("memory.limit_in_bytes", "memory.max"), "pids": ("pids.max", "pids.max")}


@contextlib.contextmanager
def limited_cgroup(controller, limit):
    """A fresh cgroup of `controller` with its limit set, removed afterwards;
    None (the reason printed) where none can be made here."""
    cg = new_cgroup(controller, *CGROUP_LIMITS[controller])
    if cg is None:
        yield None
        return
    d, limit_file = cg
    try:
        with open(os.path.join(d, limit_file), "w") as f:
            f.write(str(limit))
        yield d
    finally:
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.1)


def in_cgroup(d):
    """A command prefix that moves into cgroup d, then runs the rest."""
    return ["/bin/sh", "-c", f'echo $$ > {d}/cgroup.procs && exec "$@"', "sh"]
