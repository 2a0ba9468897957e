#!/usr/bin/env python3
"""Launcher tests: scripts/forgealloc, docker/entrypoint.sh and the Python
helper, run for real.

    run.py CASE --lib /abs/libforgealloc.so --builddir DIR --srcdir DIR [--python PY]

Exit 0 = pass, 1 = fail, 77 = skipped."""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SKIP, check, run_case  # noqa: E402

A = None


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("FORGEALLOC_") and k != "LD_PRELOAD"}
    e["FORGEALLOC_LIB"] = A.lib
    e.update({k: str(v) for k, v in extra.items() if v is not None})
    for k, v in extra.items():
        if v is None:
            e.pop(k, None)
    return e


def sh(cmd, e=None, cwd=None, timeout=120):
    return subprocess.run(cmd, env=e if e is not None else env(), capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def launcher():
    return os.path.join(A.srcdir, "scripts", "forgealloc")


def show_preload():
    return [A.python, "-c", "import os; print(os.environ.get('LD_PRELOAD', ''))"]


# ---- run ---------------------------------------------------------------------------

def case_compose():
    """LD_PRELOAD composition: empty, other entries, already us, another allocator."""
    libm = next(iter(glob.glob("/lib/x86_64-linux-gnu/libm.so.6") + glob.glob("/usr/lib*/libm.so.6")), None)
    check(libm, "libm.so.6 not found")
    r = sh([launcher(), "run", "--"] + show_preload())
    check(r.returncode == 0 and r.stdout.strip() == A.lib, f"empty LD_PRELOAD: {r.stdout!r} {r.stderr!r}")
    r = sh([launcher(), "run", "--"] + show_preload(), env(LD_PRELOAD=libm))
    check(r.stdout.strip() == f"{A.lib}:{libm}", f"kept entries: {r.stdout!r}")
    rel = os.path.relpath(A.lib)
    r = sh([launcher(), "run", "--"] + show_preload(), env(LD_PRELOAD=f"{A.lib} {libm}:{rel}"))
    check(r.stdout.strip() == f"{A.lib}:{libm}", f"never twice: {r.stdout!r}")
    # Another allocator is recognised by name; the file need not exist.
    other = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    r = sh([launcher(), "run", "--"] + show_preload(), env(LD_PRELOAD=f"{other}:{libm}"))
    check(r.stdout.strip() == f"{A.lib}:{libm}", f"another allocator left out: {r.stdout!r}")
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("forgealloc:")]
    check(len(lines) == 1 and "libjemalloc.so.2" in lines[0], f"one warning line naming it: {r.stderr!r}")


def case_exec_pid():
    """run execs: the command has the launcher's PID, and its exit status."""
    p = subprocess.Popen([launcher(), "run", "--", "sh", "-c", "echo $$; exit 7"], env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    check(p.returncode == 7, f"exit status {p.returncode}")
    check(out.strip() == str(p.pid), f"command pid {out.strip()} != launcher pid {p.pid}")


def case_stats_routing():
    """The command's dump goes to stderr, its children's to their own files."""
    with tempfile.TemporaryDirectory() as d:
        r = sh([launcher(), "run", "--", A.python, "-c",
                "import subprocess; subprocess.run(['/bin/true']); subprocess.run(['/bin/true'])"],
               env(FORGEALLOC_STATS_DIR=d))
        check(r.returncode == 0, r.stderr)
        check(re.search(r"^forgealloc [0-9.]+: pid \d+ \(.*python.*\), exit", r.stderr, re.M),
              f"the command's own dump on stderr: {r.stderr!r}")
        check(r.stderr.count("forgealloc 0") == 1, f"only the command's dump on stderr: {r.stderr!r}")
        files = sorted(os.listdir(d))
        check(len(files) == 2 and all(re.match(r"\d+\.txt$", f) for f in files), f"children's files: {files}")
        r = sh([launcher(), "run", "--stats", "json", "--stats-file", f"{d}/x-%p.json", "--pool", "0", "--",
                A.python, "-c", "import os; print(os.environ['FORGEALLOC_DEVICE_POOL_SIZE'])"])
        check(r.stdout.strip() == "0" and r.stderr == "", f"--pool / --stats-file: {r!r}")
        docs = glob.glob(f"{d}/x-*.json")
        check(len(docs) == 1 and json.load(open(docs[0]))["config"]["stats"] == "json", f"json dump: {docs}")


def case_child_dir():
    """A child started in another directory still loads the shim."""
    code = "import forgealloc, sys; sys.exit(0 if forgealloc.available() else 1)"
    r = sh([launcher(), "run", "--", "sh", "-c", f"cd / && {A.python} -c '{code}'"],
           env(PYTHONPATH=os.path.join(A.srcdir, "scripts", "python")))
    check(r.returncode == 0, f"child in / did not get the shim: {r.stderr!r}")
    check("cannot be preloaded" not in r.stderr, r.stderr)


def case_errors_and_help():
    for cmd in (["--help"], ["run", "--help"], ["env", "--help"], ["doctor", "--help"], ["report", "--help"]):
        r = sh([launcher()] + cmd)
        check(r.returncode == 0 and "usage" in r.stdout, f"{cmd}: {r!r}")
    for cmd, word in ((["bogus"], "unknown command"), (["run"], "no command"), (["run", "--stats", "xml", "--", "true"],
                      "--stats xml"), (["run", "--frobnicate"], "unknown option"), (["report"], "report")):
        r = sh([launcher()] + cmd)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0 and len(lines) == 1 and word in lines[0], f"{cmd}: {r.returncode} {r.stderr!r}")
    r = sh([launcher(), "run", "--", "true"], env(FORGEALLOC_LIB="/nonexistent/libforgealloc.so"))
    check(r.returncode != 0 and "FORGEALLOC_LIB" in r.stderr, f"bad FORGEALLOC_LIB: {r.stderr!r}")


# ---- env, doctor, report ---------------------------------------------------------------

def option_names():
    text = open(os.path.join(A.srcdir, "src", "core", "options.def")).read()
    return ["FORGEALLOC_" + m for m in re.findall(r"^FA_OPTION\((\w+),", text, re.M)]


def case_env():
    r = sh([launcher(), "env"], env(FORGEALLOC_RELEASE_THRESHOLD="32M"))
    check(r.returncode == 0, r.stderr)
    for name in option_names():
        check(re.search(rf"^{name}\s", r.stdout, re.M), f"forgealloc env does not list {name}")
    check(re.search(r"^FORGEALLOC_RELEASE_THRESHOLD .*now 32.0 MiB\s+\(environment\)", r.stdout, re.M),
          "env shows the current value and where it came from")
    # The README's table is the one the library prints: it cannot drift.
    r = sh([launcher(), "env", "--markdown"])
    readme = open(os.path.join(A.srcdir, "README.md")).read()
    check(r.stdout.strip() and r.stdout.strip() in readme,
          "README.md's settings table differs from `forgealloc env --markdown`; paste the new one in")


def case_doctor():
    r = sh([launcher(), "doctor"])
    check(r.returncode == 0 and "result: the shim can work here" in r.stdout, f"doctor: {r.stdout}{r.stderr}")
    check("[ok] preload" in r.stdout, r.stdout)
    r = sh([launcher(), "doctor"], env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))
    check("[warn] PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in r.stdout, r.stdout)
    with tempfile.TemporaryDirectory() as d:
        # A program that carries the CUDA runtime inside (as nvcc's static default does).
        src = os.path.join(d, "static.c")
        open(src, "w").write('const char *names[] = {"cudaMalloc", "cudaFree"};\n'
                             'int main(void) { return names[0][0] == 0; }\n')
        subprocess.run(["cc", "-o", os.path.join(d, "static"), src], check=True)
        r = sh([launcher(), "doctor", os.path.join(d, "static")])
        check("[warn]" in r.stdout and "libcudart_static" in r.stdout, f"static cudart: {r.stdout}")
    dyn = os.path.join(A.builddir, "tests", "device", "d_pool")
    if os.path.exists(dyn):
        r = sh([launcher(), "doctor", dyn])
        check("links libcudart dynamically" in r.stdout, f"dynamic cudart: {r.stdout}")
    r = sh([launcher(), "doctor"], env(FORGEALLOC_LIB="/nonexistent.so"))
    check(r.returncode != 0 and "[FAIL] library" in r.stdout, f"doctor without a library: {r.stdout}")


def case_report():
    with tempfile.TemporaryDirectory() as d:
        for name, code in (("a", "x = 1"), ("b", "x = [bytes(100) for _ in range(50000)]")):
            r = sh([launcher(), "run", "--stats", "json", "--stats-file", f"{d}/{name}.json", "--", A.python, "-c",
                    code])
            check(r.returncode == 0, r.stderr)
        r = sh([launcher(), "report", f"{d}/a.json"])
        check(r.returncode == 0 and re.search(r"^\s+malloc\s+[\d,]+$", r.stdout, re.M), f"one report: {r.stdout}")
        r = sh([launcher(), "report", f"{d}/a.json", f"{d}/b.json"])
        check(r.returncode == 0 and re.search(r"^\s+calloc\s+[\d,]+\s+[\d,]+\s+\+[\d,]+", r.stdout, re.M),
              f"side by side: {r.stdout}")
        open(f"{d}/bad.json", "w").write("{}")
        r = sh([launcher(), "report", f"{d}/bad.json"])
        check(r.returncode != 0 and "not a forgealloc stats dump" in r.stderr, f"bad file: {r.stderr!r}")


# ---- entrypoint, install, Python helper ------------------------------------------------

def case_entrypoint():
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    with tempfile.TemporaryDirectory() as d:
        r = sh([entry] + show_preload(), env(FORGEALLOC_STATS_DIR=d))
        check(r.returncode == 0 and r.stdout.strip() == A.lib, f"entrypoint composition: {r!r}")
        check("forgealloc 0" in r.stderr, "the command's dump on stderr (docker logs)")
        r = sh([entry, A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"], env(FORGEALLOC_STATS_DIR=d))
        check(len(os.listdir(d)) == 1, f"a child's stats file in FORGEALLOC_STATS_DIR: {os.listdir(d)}")
        r = sh([entry])
        check(r.returncode == 2 and "no command" in r.stderr, f"no command: {r!r}")
        # Stopped like `docker stop`: SIGTERM, the dump is still written.
        p = subprocess.Popen([entry, A.python, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             env=env(FORGEALLOC_STATS_DIR=d), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        check(p.stdout.readline() == "up\n", "entrypoint child did not start")
        p.terminate()
        _, err = p.communicate(timeout=30)
        check(p.returncode == -15 and "signal after" in err, f"SIGTERM: status {p.returncode}, stderr {err!r}")


def case_install():
    """cmake --install puts everything in place and the installed launcher finds it."""
    with tempfile.TemporaryDirectory() as prefix:
        r = subprocess.run(["cmake", "--install", A.builddir, "--prefix", prefix], capture_output=True, text=True)
        check(r.returncode == 0, r.stderr)
        for rel in ("bin/forgealloc", "include/forgealloc.h", "libexec/forgealloc/forgealloc-query",
                    "share/forgealloc/forgealloc.py", "share/forgealloc/entrypoint.sh",
                    "share/forgealloc/demo_launch.py"):
            check(os.path.exists(os.path.join(prefix, rel)), f"not installed: {rel}")
        libs = glob.glob(f"{prefix}/lib*/libforgealloc.so") + glob.glob(f"{prefix}/lib*/*/libforgealloc.so")
        pcs = glob.glob(f"{prefix}/lib*/pkgconfig/forgealloc.pc") + glob.glob(f"{prefix}/lib*/*/pkgconfig/forgealloc.pc")
        check(len(libs) == 1 and len(pcs) == 1, f"library / pkg-config file: {libs} {pcs}")
        e = env(FORGEALLOC_LIB=None)
        r = sh([f"{prefix}/bin/forgealloc", "run", "--"] + show_preload(), e)
        check(r.stdout.strip() == os.path.realpath(libs[0]), f"installed launcher found {r.stdout!r} {r.stderr!r}")
        r = sh([f"{prefix}/bin/forgealloc", "doctor"], e)
        check(r.returncode == 0 and "[ok] preload" in r.stdout, f"installed doctor: {r.stdout}")
        r = sh([f"{prefix}/share/forgealloc/entrypoint.sh"] + show_preload(), env(FORGEALLOC_LIB=None, FORGEALLOC_STATS="off"))
        check(r.stdout.strip() == os.path.realpath(libs[0]), f"installed entrypoint: {r!r}")
        # The image's CMD: the installed demo finds the installed helper.
        r = sh([f"{prefix}/share/forgealloc/entrypoint.sh", A.python, f"{prefix}/share/forgealloc/demo_launch.py",
                "--cycles", "1", "--scale", "0.05"], env(FORGEALLOC_LIB=None, FORGEALLOC_STATS_DIR=prefix), timeout=300)
        check(r.returncode == 0 and "allocator forgealloc" in r.stdout, f"installed demo: {r.stdout} {r.stderr}")
        if shutil.which("pkg-config"):
            r = subprocess.run(["pkg-config", "--variable=preload", "forgealloc"], capture_output=True, text=True,
                               env={**os.environ, "PKG_CONFIG_PATH": os.path.dirname(pcs[0])})
            check(os.path.realpath(r.stdout.strip()) == os.path.realpath(libs[0]),
                  f"pkg-config preload variable: {r.stdout!r}")


def case_python_helper():
    helper_dir = os.path.join(A.srcdir, "scripts", "python")
    code = ("import forgealloc, json\n"
            "assert forgealloc.available()\n"
            "s = forgealloc.stats()\n"
            "assert s['schema'] == 'forgealloc.stats/1' and s['host']['calls']['malloc'] > 0\n"
            "blocks = [bytearray(4 << 20) for _ in range(50)]\n"
            "del blocks\n"
            "n = forgealloc.release()\n"
            "assert isinstance(n, int) and n >= 0\n"
            "assert forgealloc.stat('host.calls.malloc') > 0\n"
            "assert any(o['name'] == 'FORGEALLOC_STATS' for o in forgealloc.options())\n"
            "try:\n    forgealloc.stat('no.such.key')\nexcept KeyError:\n    pass\nelse:\n    raise SystemExit('KeyError')\n"
            "print('ok', forgealloc.version())\n")
    e = env(PYTHONPATH=helper_dir)
    r = sh([launcher(), "run", "--stats", "off", "--", A.python, "-c", code], e)
    check(r.returncode == 0 and r.stdout.startswith("ok 0."), f"helper under the shim: {r.stdout!r} {r.stderr!r}")
    code = ("import forgealloc\n"
            "assert not forgealloc.available()\n"
            "try:\n    forgealloc.stats()\nexcept forgealloc.ForgeallocUnavailable as e:\n    print('unavailable:', e)\n")
    r = sh([A.python, "-c", code], e)
    check(r.returncode == 0 and "forgealloc run" in r.stdout, f"helper without the shim: {r.stdout!r} {r.stderr!r}")


def case_demo():
    """The quick start's demo, under the launcher: timings, RSS, and the stats at exit."""
    r = sh([launcher(), "run", "--", A.python, os.path.join(A.srcdir, "scripts", "demo_launch.py"), "--cycles", "1",
            "--scale", "0.1"], timeout=300)
    check(r.returncode == 0, f"demo failed: {r.stdout} {r.stderr}")
    check("allocator forgealloc" in r.stdout and re.search(r"after unload\s+\d+ MiB", r.stdout), r.stdout)
    check(re.search(r"^demo: idle \d+ s after the last unload \(no allocation\), RSS \d+ MiB", r.stdout, re.M), r.stdout)
    check(re.search(r"^forgealloc [0-9.]+: pid \d+ .*exit after", r.stderr, re.M), f"stats at exit: {r.stderr!r}")


def case_shellcheck():
    if not shutil.which("shellcheck"):
        print("shellcheck not installed - skipped")
        return SKIP
    files = [os.path.join(A.srcdir, p) for p in ("scripts/forgealloc", "docker/entrypoint.sh", ".ci/run")]
    files += glob.glob(os.path.join(A.srcdir, "scripts", "*.sh"))
    r = subprocess.run(["shellcheck"] + files, capture_output=True, text=True)
    check(r.returncode == 0, r.stdout)


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--lib", required=True)
    ap.add_argument("--builddir", required=True)
    ap.add_argument("--srcdir", required=True)
    ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3")
    A = ap.parse_args()
    A.lib = os.path.realpath(A.lib)
    return run_case(globals(), A.case)


if __name__ == "__main__":
    sys.exit(main())
