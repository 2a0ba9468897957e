#!/usr/bin/env python3
"""Launcher tests: the forgealloc command (as built; scripts/forgealloc, the
source tree's stub, execs it), docker/entrypoint.sh and the Python helper,
run for real.

    run.py CASE --lib /abs/libforgealloc.so --builddir DIR --srcdir DIR [--python PY]

Exit 0 = pass, 1 = fail, 77 = skipped."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import DEFAULT_PYTHON, SKIP, check, main  # noqa: E402

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
    """The forgealloc program as built (scripts/forgealloc, the source tree's stub, execs it: case stub)."""
    return os.path.join(A.builddir, "forgealloc")


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
    # An entry is a name, never a wildcard: lib[j]emalloc.so is kept as it is, not expanded to libjemalloc.so (and
    # left out as another allocator).
    with tempfile.TemporaryDirectory() as d:
        for name in ("lib[j]emalloc.so", "libjemalloc.so"):
            shutil.copy(libm, f"{d}/{name}")
        r = sh([launcher(), "run", "--stats", "off", "--"] + show_preload(), env(LD_PRELOAD=f"{d}/lib[j]emalloc.so"))
        check(r.returncode == 0 and r.stdout.strip() == f"{A.lib}:{d}/lib[j]emalloc.so" and r.stderr == "",
              f"a name with [j]: {r.stdout!r} {r.stderr!r}")
        r = sh([launcher(), "doctor"], env(LD_PRELOAD=f"{d}/lib[j]emalloc.so"))
        check(r.returncode == 0 and "another allocator" not in r.stdout, f"doctor, a name with [j]: {r.stdout}")


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
        host = re.sub(r"[^A-Za-z0-9._-]", "_", os.uname().nodename)
        check(len(files) == 2 and all(re.match(rf"{re.escape(host)}-\d{{13}}-\d+\.txt$", f) for f in files),
              f"children's files, named HOST-START-PID.txt: {files}")
        r = sh([launcher(), "run", "--stats", "json", "--stats-file", f"{d}/x-%p.json", "--pool", "0", "--",
                A.python, "-c", "import os; print(os.environ['FORGEALLOC_DEVICE_POOL_SIZE'])"])
        check(r.stdout.strip() == "0" and r.stderr == "", f"--pool / --stats-file: {r!r}")
        docs = glob.glob(f"{d}/x-*.json")
        check(len(docs) == 1 and json.load(open(docs[0]))["config"]["stats"] == "json", f"json dump: {docs}")
        # The format in any case and with blanks around it, as the library takes it: the children's files are
        # named for it.
        for args, e in ((["--stats", "JSON"], env(FORGEALLOC_STATS_DIR=f"{d}/up")),
                        ([], env(FORGEALLOC_STATS_DIR=f"{d}/up2", FORGEALLOC_STATS="Json")),
                        ([], env(FORGEALLOC_STATS_DIR=f"{d}/up3", FORGEALLOC_STATS=" json\t"))):
            r = sh([launcher(), "run"] + args + ["--", A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"], e)
            files = os.listdir(e["FORGEALLOC_STATS_DIR"])
            check(r.returncode == 0 and json.loads(r.stderr)["config"]["stats"] == "json" and len(files) == 1
                  and files[0].endswith(".json"), f"{args or e['FORGEALLOC_STATS']}: {files} {r.stderr!r}")
        # A relative --stats-file: a child started in another directory writes beside the command.
        os.mkdir(f"{d}/repo")
        r = sh([launcher(), "run", "--stats", "json", "--stats-file", "y-%p.json", "--",
                A.python, "-c", "import subprocess; subprocess.run(['/bin/true'], cwd='repo')"], cwd=d)
        check(r.returncode == 0 and len(glob.glob(f"{d}/y-*.json")) == 2 and not os.listdir(f"{d}/repo"),
              f"relative --stats-file: {os.listdir(d)} {os.listdir(f'{d}/repo')} {r.stderr!r}")
        # The same with a relative FORGEALLOC_STATS_FILE from the environment.
        r = sh([launcher(), "run", "--", A.python, "-c", "import subprocess; subprocess.run(['/bin/true'], cwd='repo')"],
               env(FORGEALLOC_STATS="json", FORGEALLOC_STATS_FILE="z-%p.json"), cwd=d)
        check(r.returncode == 0 and len(glob.glob(f"{d}/z-*.json")) == 2 and not os.listdir(f"{d}/repo"),
              f"relative FORGEALLOC_STATS_FILE: {os.listdir(d)} {os.listdir(f'{d}/repo')} {r.stderr!r}")


def case_stats_keep():
    """Children's files do not pile up: with FORGEALLOC_STATS_KEEP=20, sixty children leave at most 20 files in the
    directory, the oldest gone first (files of other names or contents stay); the launcher sets 1000 where it chooses the
    directory, and nothing where a stats file is given."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", os.uname().nodename)
    with tempfile.TemporaryDirectory() as d:
        old = [f"{d}/{host}-1000000000000-{i}.txt" for i in range(30)]
        for i, path in enumerate(old):
            with open(path, "w") as f:
                f.write("forgealloc 0.1.0: pid 1 (/bin/true), exit after 0.000 s\n")
            os.utime(path, (1e9 + i, 1e9 + i))
        mine = f"{host}-1000000000000-99.txt"  # such a name, but not a dump: never removed
        for name in ("notes.txt", mine):
            with open(f"{d}/{name}", "w") as f:
                f.write("my notes\n")
            os.utime(f"{d}/{name}", (1e9, 1e9))
        r = sh([launcher(), "run", "--", "sh", "-c", "for i in $(seq 60); do /bin/true; done; "
                "echo \"$FORGEALLOC_STATS_KEEP\""], env(FORGEALLOC_STATS_DIR=d, FORGEALLOC_STATS_KEEP="20"))
        files = os.listdir(d)
        check(r.returncode == 0 and r.stdout == "20\n", f"run: {r.stdout!r} {r.stderr[-500:]!r}")
        check("notes.txt" in files and mine in files, f"a file that is not a dump was removed: {files}")
        ours = [f for f in files if f not in ("notes.txt", mine)]
        check(15 <= len(ours) <= 20, f"{len(ours)} stats files kept with FORGEALLOC_STATS_KEEP=20: {sorted(ours)}")
        check(not any(os.path.basename(p) in files for p in old), f"the oldest files stayed: {sorted(ours)}")
        r = sh([launcher(), "run", "--", "sh", "-c", "echo \"$FORGEALLOC_STATS_KEEP\""], env(FORGEALLOC_STATS_DIR=d))
        check(r.stdout == "1000\n", f"the launcher's default for its directory: {r.stdout!r}")
        r = sh([launcher(), "run", "--stats-file", f"{d}/x-%p.txt", "--", "sh", "-c",
                "echo \"${FORGEALLOC_STATS_KEEP-unset}\""])
        check(r.stdout == "unset\n", f"FORGEALLOC_STATS_KEEP with a stats file given: {r.stdout!r}")


def case_stats_unique():
    """Runs whose pids repeat (containers and restarts sharing a volume) keep their own files: three runs in
    separate pid namespaces, each a command with pid 1 (its dump on stderr) and a child with the same pid in
    each run, leave three files (with %p alone: one)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("needs root and unshare for pid namespaces - skipped")
        return SKIP
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:  # inside a container without CAP_SYS_ADMIN, for one
        print(f"pid namespaces not permitted here ({probe.stderr.strip()}) - skipped")
        return SKIP
    with tempfile.TemporaryDirectory() as d:
        for _ in range(3):
            r = sh(["unshare", "--pid", "--fork", "--mount-proc", launcher(), "run", "--", A.python, "-c",
                    "import os, subprocess; subprocess.run(['/bin/true']); print(os.getpid())"],
                   env(FORGEALLOC_STATS_DIR=d))
            check(r.returncode == 0 and r.stdout.strip() == "1", f"unshare run: {r.stdout!r} {r.stderr!r}")
        files = sorted(os.listdir(d))
        check(len(files) == 3, f"three runs with the same pids left {len(files)} files: {files}")


def case_stub():
    """scripts/forgealloc, the source tree's stub: execs the program built beside FORGEALLOC_LIB (or in build/), with
    the caller's arguments, PID, exit status and environment (but PWD, which a POSIX shell exports); with nothing
    built it says what to run, in one line, status 125."""
    stub = os.path.join(A.srcdir, "scripts", "forgealloc")
    p = subprocess.Popen([stub, "run", "--", "sh", "-c", "echo $$; exit 7"], env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    check(p.returncode == 7 and out.strip() == str(p.pid), f"through the stub: {p.returncode} {out!r} {err!r}")
    ours = {"LD_PRELOAD", "FORGEALLOC_STATS", "FORGEALLOC_STATS_FILE", "FORGEALLOC_STATS_KEEP", "FORGEALLOC_STATS_MAIN_PID",
            "PWD"}
    with tempfile.TemporaryDirectory() as d:
        caller = {"PATH": "/usr/local/bin:/usr/bin:/bin", "FORGEALLOC_LIB": A.lib, "SHLVL": "3", "OLDPWD": "/nonexistent"}
        r = subprocess.run([stub, "run", "--", "/usr/bin/env", "-0"], env=caller, capture_output=True, text=True, cwd=d)
        got = dict(kv.split("=", 1) for kv in r.stdout.split("\0") if kv)
        changed = sorted(k for k in set(got) | set(caller) if got.get(k) != caller.get(k) and k not in ours)
        check(r.returncode == 0 and not changed and os.path.isdir(got.get("PWD", "")) and os.path.samefile(got["PWD"], d),
              f"environment through the stub: {[(k, caller.get(k), got.get(k)) for k in changed]} {r.stderr!r}")
        os.mkdir(f"{d}/scripts")
        shutil.copy(stub, f"{d}/scripts/forgealloc")
        for e in (env(FORGEALLOC_LIB=None), env(FORGEALLOC_LIB=f"{d}/libforgealloc.so")):
            r = sh([f"{d}/scripts/forgealloc", "version"], e)
            lines = r.stderr.splitlines()
            check(r.returncode == 125 and r.stdout == "" and len(lines) == 1 and "not built" in lines[0]
                  and "scripts/build.sh" in lines[0], f"nothing built: {r.returncode} {r.stderr!r}")


def case_wait_group_reaps():
    """run --wait-group takes in the processes of the command's tree whose parent has ended (so that it can wait for
    a start script's Python) and reaps each as it ends: none stays a zombie while the command runs."""
    code = ("import os, subprocess, time\n"
            "pid = int(subprocess.run(['sh', '-c', 'sleep 0.5 >/dev/null 2>&1 & echo $!'], capture_output=True,"
            " text=True).stdout)\n"
            "time.sleep(0.1)\n"
            "ppid = open(f'/proc/{pid}/stat').read().rsplit(') ', 1)[1].split()[1]\n"
            "time.sleep(1.5)\n"
            "print(ppid, os.path.exists(f'/proc/{pid}'))\n")
    p = subprocess.Popen([launcher(), "run", "--stats", "off", "--wait-group", "--", A.python, "-c", code], env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    check(p.returncode == 0 and out == f"{p.pid} False\n" and err == "",
          f"the orphan's parent, and whether it is left (a zombie): {out!r} (launcher {p.pid}) {err!r}")


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
    # run's own errors exit 125, as env's or timeout's: never taken for the command's 1 or 2; the other commands'
    # usage errors 2.
    for cmd, word, status in ((["bogus"], "unknown command", 2), (["run"], "no command", 125),
                              (["run", "--stats", "xml", "--", "true"], "--stats xml", 125),
                              (["run", "--frobnicate"], "unknown option", 125), (["run", "--stats"], "--stats needs", 125),
                              (["report"], "report", 2), (["env", "--bogus"], "unknown option", 2)):
        r = sh([launcher()] + cmd)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == status and len(lines) == 1 and word in lines[0], f"{cmd}: {r.returncode} {r.stderr!r}")
    r = sh([launcher(), "run", "--", "true"], env(FORGEALLOC_LIB="/nonexistent/libforgealloc.so"))
    check(r.returncode == 125 and "FORGEALLOC_LIB" in r.stderr, f"bad FORGEALLOC_LIB: {r.returncode} {r.stderr!r}")
    # version asks the library, which writes no dump of its own for it, whatever FORGEALLOC_STATS says.
    r = sh([launcher(), "version"], env(FORGEALLOC_STATS="text"))
    check(r.returncode == 0 and re.match(r"^\d+\.\d+\.\d+\n$", r.stdout) and r.stderr == "",
          f"version with FORGEALLOC_STATS=text: {r.stdout!r} {r.stderr!r}")


def case_run_checks():
    """What keeps a command from starting is told in one line before it starts, with the shell's status: a
    command not found (127), a directory or a file without the execute bit (126), a script whose interpreter is
    missing (127); a library the loader cannot preload (its tcmalloc missing: nothing would start; not a library:
    every process would print the loader's error).  FORGEALLOC_STRICT=1 does not keep `env` and `version` from
    telling about the settings it refuses."""
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(f"{d}/dir")
        for name, text in (("plain.sh", "echo hi\n"), ("badinterp.sh", "#!/nonexistent/sh\necho hi\n")):
            open(f"{d}/{name}", "w").write(text)
        os.chmod(f"{d}/badinterp.sh", 0o755)
        for cmd, status, words in ((["no-such-command-x"], 127, "command not found"), ([f"{d}/missing"], 127,
                                   "does not exist"), ([f"{d}/dir"], 126, "is a directory"),
                                   ([f"{d}/plain.sh"], 126, "not executable"),
                                   ([f"{d}/badinterp.sh"], 127, "#!/nonexistent/sh, which does not exist")):
            r = sh([launcher(), "run", "--"] + cmd)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == status and len(lines) == 1 and words in lines[0] and lines[0].startswith("forgealloc"),
                  f"{cmd}: status {r.returncode}, stderr {r.stderr!r}")
        # --pool is checked as the library reads it, before the command starts.
        for pool, ok in (("2X", False), ("101%", False), ("1.5G", True), ("25%", True), ("0", True)):
            r = sh([launcher(), "run", "--stats", "off", "--pool", pool, "--", "sh", "-c", "echo ran"])
            want = (0, "ran\n", "") if ok else (125, "", f"forgealloc: --pool {pool}: use a size or a percentage")
            check(r.returncode == want[0] and r.stdout == want[1] and r.stderr.startswith(want[2])
                  and r.stderr.count("\n") == (0 if ok else 1), f"--pool {pool}: {r.returncode} {r.stdout!r} {r.stderr!r}")
        # The library with a dependency that is not installed: a copy asking for libtcmalloc_minimal.so.9.
        data = open(A.lib, "rb").read()
        check(b"libtcmalloc_minimal.so.4" in data, "the library names libtcmalloc_minimal.so.4")
        open(f"{d}/lib.so", "wb").write(data.replace(b"libtcmalloc_minimal.so.4", b"libtcmalloc_minimal.so.9"))
        open(f"{d}/notalib.so", "w").write("text\n")
        for lib, words in ((f"{d}/lib.so", "needs libtcmalloc_minimal.so.9, which is not installed"),
                           (f"{d}/notalib.so", "cannot be preloaded (file too short)"),
                           (d, "is not a file")):
            r = sh([launcher(), "run", "--", "echo", "ran"], env(FORGEALLOC_LIB=lib))
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 125 and r.stdout == "" and len(lines) == 1 and words in lines[0],
                  f"FORGEALLOC_LIB={lib}: status {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr!r}")
            r = sh([launcher(), "version"], env(FORGEALLOC_LIB=lib))
            check(r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr,
                  f"version with FORGEALLOC_LIB={lib}: {r.returncode} {r.stderr!r}")
    r = sh([launcher(), "env"], env(FORGEALLOC_STRICT="1", FORGEALLOC_STAT="json"))
    check(r.returncode == 0 and re.search(r"^FORGEALLOC_STRICT .*now 1\s+\(environment\)", r.stdout, re.M),
          f"env under FORGEALLOC_STRICT=1: {r.returncode} {r.stdout[-300:]!r} {r.stderr!r}")
    check("FORGEALLOC_STAT is not a forgealloc setting" in r.stderr, f"env names the misspelling: {r.stderr!r}")
    r = sh([launcher(), "version"], env(FORGEALLOC_STRICT="1", FORGEALLOC_STAT="json"))
    check(r.returncode == 0 and re.match(r"^\d+\.\d+\.\d+$", r.stdout.strip()), f"version under strict: {r!r}")


def case_loaded():
    """The library already in the launcher's shell (LD_PRELOAD from the caller): its subshells and helpers write
    no dumps, and the command gets the caller's settings.  Not loaded: the helpers run without it (a bad setting
    is reported once, by the command)."""
    with tempfile.TemporaryDirectory() as d:
        r = sh([launcher(), "run", "--", A.python, "-c", "import os; print(os.environ['FORGEALLOC_STATS'])"],
               env(LD_PRELOAD=A.lib, FORGEALLOC_STATS="json", FORGEALLOC_STATS_DIR=d))
        check(r.returncode == 0 and r.stdout.strip() == "json", f"caller's FORGEALLOC_STATS: {r.stdout!r} {r.stderr!r}")
        check(r.stderr.count('"version"') == 1 and os.listdir(d) == [], f"one dump, the command's: {r.stderr!r} {os.listdir(d)}")
        r = sh([launcher(), "run", "--stats", "off", "--", A.python, "-c", "pass"], env(FORGEALLOC_RELEASE_RATE="abc"))
        check(r.stderr.count("FORGEALLOC_RELEASE_RATE") == 1, f"one warning: {r.stderr!r}")
        r = sh([launcher(), "run", "--", "env"], env(LD_PRELOAD=A.lib, FORGEALLOC_LOG="info"))
        check("FORGEALLOC_LOG=info\n" in r.stdout and "_CALLER_" not in r.stdout, f"caller's env: {r.stdout!r}")
        r = sh([launcher(), "run", "--", "env"], env(LD_PRELOAD=A.lib, FORGEALLOC_STATS=None))
        check("FORGEALLOC_STATS=text\n" in r.stdout and "FORGEALLOC_LOG=" not in r.stdout, f"unset stays unset: {r.stdout!r}")
        # FORGEALLOC_STRICT=1 refuses unknown FORGEALLOC_* names: the launcher's own shell has none.
        r = sh([launcher(), "run", "--stats", "off", "--", "echo", "hi"], env(LD_PRELOAD=A.lib, FORGEALLOC_STRICT="1"))
        check(r.returncode == 0 and r.stdout == "hi\n" and r.stderr == "", f"strict, library loaded: {r!r}")
        # The launcher itself never loads it (it is linked statically): a setting FORGEALLOC_STRICT=1 refuses does
        # not keep env from listing the settings, nor --help from printing; staying as the command's parent
        # (--wait-group), it writes no dump of its own.
        strict = env(LD_PRELOAD=A.lib, FORGEALLOC_STRICT="1", FORGEALLOC_STAT="json")
        r = sh([launcher(), "env"], strict)
        check(r.returncode == 0 and re.search(r"^FORGEALLOC_STRICT .*now 1\s+\(environment\)", r.stdout, re.M)
              and r.stderr.count("\n") == 1 and "FORGEALLOC_STAT is not a forgealloc setting" in r.stderr,
              f"env, strict, library preloaded by the caller: {r.returncode} {r.stdout[-200:]!r} {r.stderr!r}")
        r = sh([launcher(), "run", "--help"], strict)
        check(r.returncode == 0 and "usage" in r.stdout and r.stderr == "", f"run --help, strict: {r!r}")
        r = sh([launcher(), "run", "--wait-group", "--", A.python, "-c", "pass"],
               env(LD_PRELOAD=A.lib, FORGEALLOC_STATS="json", FORGEALLOC_STATS_DIR=d))
        check(r.returncode == 0 and r.stderr.count('"version"') == 1 and os.listdir(d) == [],
              f"--wait-group, one dump, the command's: {r.stderr!r} {os.listdir(d)}")


def case_environment():
    """The command gets the caller's environment plus LD_PRELOAD and the launcher's FORGEALLOC_STATS* defaults,
    nothing else: not the PWD and SHLVL bash sets, an OLDPWD that is no directory kept, the caller's exported
    SHELLOPTS without the launcher's own set -euo pipefail (a start script would run under them); through run,
    run --wait-group, the entrypoint, and with the library already loaded in the caller."""
    ours = {"LD_PRELOAD", "FORGEALLOC_STATS", "FORGEALLOC_STATS_FILE", "FORGEALLOC_STATS_KEEP", "FORGEALLOC_STATS_MAIN_PID"}
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "FORGEALLOC_LIB": A.lib}
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    with tempfile.TemporaryDirectory() as d:
        for extra in ({}, {"PWD": d}, {"SHLVL": "3", "OLDPWD": "/nonexistent", "PWD": f"{d}/."}, {"SHLVL": "0"},
                      {"SHELLOPTS": "braceexpand:hashall:interactive-comments"}, {"LD_PRELOAD": A.lib},
                      {"FORGEALLOC_STATS": "json", "FORGEALLOC_STATS_FILE": f"{d}/s-%p.json"}):
            caller = dict(base, **extra)
            for how in ([launcher(), "run", "--"], [launcher(), "run", "--wait-group", "--"], [entry]):
                r = subprocess.run(how + ["/usr/bin/env", "-0"], env=caller, capture_output=True, text=True, cwd=d)
                got = dict(kv.split("=", 1) for kv in r.stdout.split("\0") if kv)
                changed = sorted(k for k in set(got) | set(caller) if got.get(k) != caller.get(k) and k not in ours)
                check(r.returncode == 0 and not changed,
                      f"{how[-2:]} with {extra}: changed {[(k, caller.get(k), got.get(k)) for k in changed]} {r.stderr[-300:]!r}")


def case_edges():
    """A command named like an option, a library path LD_PRELOAD cannot hold, a relative FORGEALLOC_STATS_DIR, a
    fallback directory that is a symbolic link, a --stats-file that is a device, a % in a directory's name."""
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(f"{d}/bin")
        with open(f"{d}/bin/-c", "w") as f:
            f.write("#!/bin/sh\necho I am -c\n")
        os.chmod(f"{d}/bin/-c", 0o755)
        r = sh([launcher(), "run", "--stats", "off", "--", "-c"], env(PATH=f"{d}/bin:{os.environ['PATH']}"))
        check(r.returncode == 0 and r.stdout == "I am -c\n", f"command named -c: {r!r}")
        os.mkdir(f"{d}/my dir")
        shutil.copy(A.lib, f"{d}/my dir/libforgealloc.so")
        r = sh([launcher(), "run", "--", "true"], env(FORGEALLOC_LIB=f"{d}/my dir/libforgealloc.so"))
        lines = r.stderr.splitlines()
        check(r.returncode == 125 and len(lines) == 1 and "space or colon" in lines[0], f"path with a space: {r!r}")
        # Relative FORGEALLOC_STATS_DIR: a child that changes directory writes there too.
        os.makedirs(f"{d}/w/sub")
        r = sh([launcher(), "run", "--", A.python, "-c", "import subprocess; subprocess.run(['/bin/true'], cwd='sub')"],
               env(FORGEALLOC_STATS_DIR="st"), cwd=f"{d}/w")
        check(r.returncode == 0 and "cannot write" not in r.stderr and len(os.listdir(f"{d}/w/st")) == 1,
              f"relative FORGEALLOC_STATS_DIR: {r.stderr!r}")
        # The fallback $TMPDIR/forgealloc-$UID a symbolic link (anyone can make one first in a shared /tmp): not
        # used, a fresh directory instead, with one note.  (Made by another user: case stats_dir_theirs, as root.)
        os.makedirs(f"{d}/tmp/elsewhere")
        os.symlink(f"{d}/tmp/elsewhere", f"{d}/tmp/forgealloc-{os.geteuid()}")
        r = sh([launcher(), "run", "--", A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"],
               env(TMPDIR=f"{d}/tmp"))
        mine = [x for x in os.listdir(f"{d}/tmp") if x.startswith(f"forgealloc-{os.geteuid()}.")]
        check(r.returncode == 0 and os.listdir(f"{d}/tmp/elsewhere") == [] and len(mine) == 1
              and len(os.listdir(f"{d}/tmp/{mine[0]}")) == 1, f"fallback a link: {os.listdir(f'{d}/tmp')} {r.stderr!r}")
        check(len([x for x in r.stderr.splitlines() if x.startswith("forgealloc:")]) == 1, f"one note: {r.stderr!r}")
        r = sh([launcher(), "run", "--stats-file", "/dev/null", "--", "true"])
        check(r.returncode == 0 and r.stderr == "", f"--stats-file /dev/null: {r.stderr!r}")
        # A % in a directory's name stands for itself (50%pct is no %p): FORGEALLOC_STATS_DIR, one relative to
        # the directory run starts in, $TMPDIR, and a relative --stats-file.
        pct = f"{d}/50%pct"
        os.mkdir(pct)
        child = [A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"]
        for e, where in ((env(FORGEALLOC_STATS_DIR=f"{pct}/dir"), f"{pct}/dir"),
                         (env(FORGEALLOC_STATS_DIR="rel"), f"{pct}/rel"),
                         (env(TMPDIR=pct), f"{pct}/forgealloc-{os.geteuid()}")):
            r = sh([launcher(), "run", "--"] + child, e, cwd=pct)
            check(r.returncode == 0 and "cannot write" not in r.stderr and os.path.isdir(where)
                  and len(os.listdir(where)) == 1, f"stats files in {where}: {os.listdir(pct)} {r.stderr!r}")
        r = sh([launcher(), "run", "--stats-file", "s-%p.txt", "--"] + child, cwd=pct)
        check(r.returncode == 0 and "cannot write" not in r.stderr
              and len([f for f in os.listdir(pct) if f.startswith("s-")]) == 2,
              f"relative --stats-file in {pct}: {os.listdir(pct)} {r.stderr!r}")


def case_deleted_cwd():
    """A current directory that was removed (cd into it, rmdir it, run): the command runs, and nothing is printed
    but the line each shell prints as it starts there (bash's "shell-init: error retrieving current directory",
    dash's "getcwd() failed"), which no line of a script can prevent; with PWD passed or not."""
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    startup = re.compile(r"^(shell-init: error retrieving current directory: |(/bin/)?sh: \d+: getcwd\(\) failed)")
    with tempfile.TemporaryDirectory() as d:
        for i, (cmd, e) in enumerate((([launcher(), "run", "--stats", "off", "--"], env()),
                                      ([launcher(), "run", "--"], env(FORGEALLOC_STATS_DIR=f"{d}/st")),
                                      (["/usr/bin/env", "-u", "PWD", launcher(), "run", "--stats", "off", "--"], env()),
                                      ([entry], env(FORGEALLOC_STATS="off")))):
            gone = f"{d}/gone{i}"
            os.mkdir(gone)
            r = sh(["/bin/sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", gone] + cmd +
                   ["/bin/echo", "ran"], e)
            noise = [ln for ln in r.stderr.splitlines() if not startup.match(ln)]
            check(r.returncode == 0 and r.stdout == "ran\n" and not noise,
                  f"{cmd}: status {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr!r}")


def case_stats_dir_theirs():
    """The fallback $TMPDIR/forgealloc-$UID made by another user (who could read or replace the files): not used, a
    fresh directory instead, with one note; the same with TMPDIR relative to where run starts.  Needs root to give
    the directory to another user."""
    if os.geteuid() != 0:
        print("needs root to make a directory of another user's - skipped")
        return SKIP
    child = [A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"]
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(f"{d}/tmp")
        theirs = f"{d}/tmp/forgealloc-{os.geteuid()}"
        os.mkdir(theirs, 0o777)
        os.chown(theirs, 65534, 65534)
        r = sh([launcher(), "run", "--"] + child, env(TMPDIR=f"{d}/tmp"))
        mine = [x for x in os.listdir(f"{d}/tmp") if x.startswith(f"forgealloc-{os.geteuid()}.")]
        check(r.returncode == 0 and os.listdir(theirs) == [] and len(mine) == 1
              and len(os.listdir(f"{d}/tmp/{mine[0]}")) == 1, f"fallback of another user's: {os.listdir(f'{d}/tmp')} {r.stderr!r}")
        check(len([x for x in r.stderr.splitlines() if x.startswith("forgealloc:")]) == 1, f"one note: {r.stderr!r}")
        r = sh([launcher(), "run", "--"] + child, env(TMPDIR="tmp"), cwd=d)
        mine = [x for x in os.listdir(f"{d}/tmp") if x.startswith(f"forgealloc-{os.geteuid()}.")]
        check(r.returncode == 0 and os.listdir(theirs) == [] and len(mine) == 2,
              f"relative TMPDIR, fallback of another user's: {os.listdir(f'{d}/tmp')} {r.stderr!r}")


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
    # The caller's FORGEALLOC_STATS shows in the table and makes no dump; a
    # python3 that is a wrapper script (pyenv) adds no dumps or warnings of
    # its shells.
    with tempfile.TemporaryDirectory() as d:
        wrapper = os.path.join(d, "python3")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec {A.python} "$@"\n')
        os.chmod(wrapper, 0o755)
        for path in (os.environ["PATH"], f"{d}:{os.environ['PATH']}"):
            r = sh([launcher(), "env"], env(FORGEALLOC_STATS="text", FORGEALLOC_RELEASE_DELAY="x", PATH=path))
            check(r.returncode == 0 and re.search(r"^FORGEALLOC_STATS .*now text\s+\(environment\)", r.stdout, re.M),
                  r.stdout[:300])
            check(r.stderr.count("\n") == 1 and "FORGEALLOC_RELEASE_DELAY='x'" in r.stderr,
                  f"PATH={path[:40]}...: {r.stderr[:400]!r}")
    # Output cut short (`| head`) ends it quietly, as it ends other tools.
    for args in (["env"], ["env", "--markdown"]):
        r = sh(["sh", "-c", '"$@" | head -c 1 >/dev/null', "sh", launcher()] + args)
        check(r.stderr == "", f"forgealloc {' '.join(args)} | head: {r.stderr!r}")
    # The settings page's table is the one the library prints: it cannot drift.
    r = sh([launcher(), "env", "--markdown"])
    page = open(os.path.join(A.srcdir, "docs", "settings.md")).read()
    check(r.stdout.strip() and r.stdout.strip() in page,
          "docs/settings.md's settings table differs from `forgealloc env --markdown`; paste the new one in "
          "between its BEGIN/END markers")


def case_doctor():
    r = sh([launcher(), "doctor"])
    check(r.returncode == 0 and "result: the shim can work here" in r.stdout, f"doctor: {r.stdout}{r.stderr}")
    check("[ok] preload" in r.stdout, r.stdout)
    check(re.search(r"^  \[info\] preload order: LD_PRELOAD=\(empty\), then /etc/ld.so.preload: ", r.stdout, re.M), r.stdout)
    check("[info] malloc in a child started with this environment: served by " in r.stdout
          and "forgealloc is not loaded" in r.stdout, r.stdout)
    # Who serves malloc in a child with the caller's own environment.
    r = sh([launcher(), "run", "--stats", "off", "--", launcher(), "doctor"])
    check(f"[ok] malloc in a child started with this environment: served by forgealloc ({A.lib})" in r.stdout, r.stdout)
    tc = next(iter(glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4") + glob.glob("/lib/*/libtcmalloc_minimal.so.4")), None)
    if tc:
        r = sh([launcher(), "doctor"], env(LD_PRELOAD=f"{tc} {A.lib}", FORGEALLOC_LOG="error"))
        check(r.returncode == 0 and f"[info] preload order: LD_PRELOAD={tc} {A.lib}, then" in r.stdout, r.stdout)
        check(f"[warn] malloc in a child started with this environment: served by {tc}, which comes before "
              "libforgealloc.so" in r.stdout, r.stdout)
    r = sh([launcher(), "doctor"], env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))
    check("[warn] PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in r.stdout, r.stdout)
    # Either variable turns cudaMalloc off, whichever PyTorch reads: as the
    # library's own device.blind says.
    r = sh([launcher(), "doctor"], env(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:512",
                                       PYTORCH_ALLOC_CONF="expandable_segments:True"))
    check("[warn] PYTORCH_ALLOC_CONF=expandable_segments:True" in r.stdout and "reach the pool" not in r.stdout,
          r.stdout)
    r = sh([launcher(), "doctor"], env(PYTORCH_ALLOC_CONF="backend:native"))
    check("[info] PYTORCH_ALLOC_CONF=backend:native, PYTORCH_CUDA_ALLOC_CONF=(unset): PyTorch's cudaMalloc calls "
          "reach the pool" in r.stdout, r.stdout)
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
            check(r.returncode == 0 and r.stderr == "", f"the docs' report example prints nothing: {r.stderr!r}")
        r = sh([launcher(), "report", f"{d}/a.json"])
        check(r.returncode == 0 and re.search(r"^\s+malloc\s+[\d,]+$", r.stdout, re.M), f"one report: {r.stdout}")
        r = sh([launcher(), "report", f"{d}/a.json", f"{d}/b.json"])
        check(r.returncode == 0 and re.search(r"^\s+calloc\s+[\d,]+\s+[\d,]+\s+\+[\d,]+", r.stdout, re.M),
              f"side by side: {r.stdout}")
        # A device entry holds a string beside its numbers (pool_type): shown as it is.
        doc = json.load(open(f"{d}/a.json"))
        doc["device"]["devices"] = [{"device": 0, "pool_type": "pieces", "pool_bytes": 1 << 30, "allocs": 1234}]
        json.dump(doc, open(f"{d}/gpu.json", "w"))
        r = sh([launcher(), "report", f"{d}/gpu.json"])
        check(r.returncode == 0 and re.search(r"^device 0\n\s+pool_type\s+pieces$", r.stdout, re.M)
              and re.search(r"^\s+pool_bytes\s+1\.0 GiB$", r.stdout, re.M), f"device entry: {r.stdout}{r.stderr}")
        r = sh([launcher(), "report", f"{d}/a.json", f"{d}/gpu.json"])
        check(r.returncode == 0 and re.search(r"^\s+pool_type\s+-\s+pieces$", r.stdout, re.M)
              and re.search(r"^\s+allocs\s+-\s+1,234$", r.stdout, re.M), f"device entry side by side: {r.stdout}{r.stderr}")
        # A program's path with control characters in it: escaped, never sent to the terminal as they are.
        doc["exe"] = "/tmp/x\x1b[2J\x1b]0;title\x07\nmore"
        json.dump(doc, open(f"{d}/esc.json", "w"))
        r = sh([launcher(), "report", f"{d}/esc.json"])
        check(r.returncode == 0 and "\x1b" not in r.stdout and "/tmp/x\\x1b[2J\\x1b]0;title\\x07\\nmore pid" in r.stdout,
              f"control characters: {r.stdout[:300]!r}")
        # Read by a reader that stops early (`| head`; here one gone before the first line): ends quietly.
        r = sh(["/bin/bash", "-c", '"$@" | true', "sh", launcher(), "report", f"{d}/a.json", f"{d}/b.json"])
        check(r.stderr == "", f"report | true: {r.stderr[-300:]!r}")
        for name, text in (("bad.json", "{}"), ("list.json", "[]"), ("null.json", '{"schema":"forgealloc.stats/1",'
                           '"uptime_ms":null}'), ("calls.json", '{"schema":"forgealloc.stats/1","host":{"calls":[1]}}'),
                           ("notjson.json", "{")):
            open(f"{d}/{name}", "w").write(text)
            r = sh([launcher(), "report", f"{d}/{name}"])
            check(r.returncode == 2 and r.stderr.count("\n") == 1 and "not a forgealloc stats dump" in r.stderr,
                  f"{name}: {r.returncode} {r.stderr!r}")
        # Dumps in the other formats (the launcher's default is text): said so, with what to do.
        r = sh([launcher(), "run", "--stats", "text", "--stats-file", f"{d}/t.txt", "--", "true"])
        r = sh([launcher(), "report", f"{d}/t.txt"])
        check(r.returncode == 2 and r.stderr.count("\n") == 1 and "is a text dump" in r.stderr and "--stats json"
              in r.stderr, f"text dump: {r.stderr!r}")


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
        check(r.returncode == 125 and "no command" in r.stderr, f"no command: {r!r}")
        # Stopped like `docker stop`: SIGTERM, the dump is still written.
        p = subprocess.Popen([entry, A.python, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             env=env(FORGEALLOC_STATS_DIR=d), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        check(p.stdout.readline() == "up\n", "entrypoint child did not start")
        p.terminate()
        _, err = p.communicate(timeout=30)
        check(p.returncode == -15 and "signal after" in err, f"SIGTERM: status {p.returncode}, stderr {err!r}")


def case_pid1():
    """As PID 1 without an init (a container started without tini or --init), SIGTERM does nothing to a command
    that leaves it at its default: run says so in one line, as does the entrypoint where no tini is installed
    (with tini it puts tini in front, silently).  Nothing where the command is an init, where PID 1 is tini, or
    under FORGEALLOC_LOG=error; nothing outside a pid namespace (every other case)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("needs root and unshare for pid namespaces - skipped")
        return SKIP
    ns = ["unshare", "--pid", "--fork", "--mount-proc"]
    if subprocess.run(ns + ["true"], capture_output=True).returncode != 0:
        print("pid namespaces not permitted here - skipped")
        return SKIP
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    run = [launcher(), "run", "--stats", "off", "--"]
    with tempfile.TemporaryDirectory() as d:
        # A PATH without tini: every program of /usr/bin but it.
        os.mkdir(f"{d}/bin")
        for name in os.listdir("/usr/bin"):
            if not name.startswith("tini"):
                os.symlink(f"/usr/bin/{name}", f"{d}/bin/{name}")
        notini = env(PATH=f"{d}/bin", FORGEALLOC_STATS="off")
        tini = shutil.which("tini")
        cases = [(ns + run + ["/bin/echo", "ran"], env(), True),
                 (ns + [entry, "/bin/echo", "ran"], notini, True),
                 (ns + run + ["/bin/echo", "ran"], env(FORGEALLOC_LOG="error"), False),
                 (ns + [entry, "/bin/echo", "ran"], dict(notini, FORGEALLOC_LOG="error"), False)]
        if tini:
            cases += [(ns + run + [tini, "-s", "--", "/bin/echo", "ran"], env(), False),
                      (ns + [tini, "--"] + run + ["/bin/echo", "ran"], env(), False),
                      (ns + [entry, "/bin/echo", "ran"], env(FORGEALLOC_STATS="off"), False)]
        for argv, e, said in cases:
            r = sh(argv, e)
            lines = r.stderr.splitlines()
            check(r.returncode == 0 and r.stdout == "ran\n", f"{argv[4:]}: {r!r}")
            if said:
                check(len(lines) == 1 and "PID 1" in lines[0] and "--init" in lines[0], f"{argv[4:]}: {r.stderr!r}")
            else:
                check(r.stderr == "", f"{argv[4:]}: printed {r.stderr!r}")


def case_readme_image():
    """The recipe in docs/docker.md for adding forgealloc to an existing image makes the directory the entrypoint
    writes its stats files to (the package does not), writable for all as the project's image makes it; where it is
    missing, the entrypoint falls back to $TMPDIR/forgealloc-$UID without a word, and no dump is lost."""
    page = open(os.path.join(A.srcdir, "docs", "docker.md")).read()
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    m = re.search(r"export FORGEALLOC_STATS_DIR=(\S+)", open(entry).read())
    check(m, "the entrypoint's stats directory not found in entrypoint.sh")
    stats_dir = m.group(1)
    recipe = re.search(r"To add the shim to an existing .*?```dockerfile\n(.*?)```", page, re.S)
    check(recipe, "the recipe for an existing image not found in docs/docker.md")
    check(re.search(rf"mkdir -p {re.escape(stats_dir)}\b", recipe.group(1))
          and re.search(rf"chmod 1777 {re.escape(stats_dir)}\b", recipe.group(1)),
          f"the recipe in docs/docker.md does not make {stats_dir} (writable for all):\n{recipe.group(1)}")
    dockerfile = open(os.path.join(A.srcdir, "docker", "Dockerfile")).read()
    check(f"mkdir -p {stats_dir} && chmod 1777 {stats_dir}" in dockerfile, f"docker/Dockerfile does not make {stats_dir}")
    if os.path.exists(stats_dir):
        print(f"{stats_dir} exists here: the fallback is not checked")
        return
    with tempfile.TemporaryDirectory() as d:
        r = sh([entry, A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"], env(TMPDIR=d))
        files = glob.glob(f"{d}/forgealloc-{os.geteuid()}/*.txt")
        check(r.returncode == 0 and len(files) == 1 and r.stderr.count("forgealloc 0") == 1
              and not [ln for ln in r.stderr.splitlines() if ln.startswith(("forgealloc:", "forgealloc entrypoint"))],
              f"without {stats_dir}: files {files}, stderr {r.stderr!r}")


def ns_pid1(unshare_pid):
    """The host pid of the first process of the pid namespace `unshare --fork` made."""
    for _ in range(200):
        try:
            kids = open(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    return None


def case_entrypoint_stop():
    """`docker stop` of a container whose command is a start script that runs Python as a child (A1111's
    webui.sh), in a pid namespace of its own, whose end kills whatever is left in it, as a container's does.  The
    image's ENTRYPOINT (tini -s -g, then the entrypoint) as PID 1, under Docker's --init (a tini without -g in
    front), and the entrypoint itself as PID 1 (it puts tini in front): SIGTERM reaches the script and Python,
    the script goes no further, and Python's own shutdown (a SIGTERM handler that takes a while) and its dump are
    done before the namespace ends, with status 143 (the script's).  Nothing from tini on stderr."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("tini"):
        print("needs root, unshare and tini - skipped")
        return SKIP
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"pid namespaces not permitted here ({probe.stderr.strip()}) - skipped")
        return SKIP
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    dockerfile = open(os.path.join(A.srcdir, "docker", "Dockerfile")).read()
    image = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
    image = [entry if a.endswith("/entrypoint.sh") else shutil.which("tini") if a.endswith("/tini") else a
             for a in image]
    ns = ["unshare", "--pid", "--fork", "--mount-proc"]
    app = ("import signal, sys, time\n"
           "def stop(sig, frame):\n"
           "    time.sleep(0.7)\n"
           "    print('cleaned up', flush=True)\n"
           "    sys.exit(0)\n"
           "signal.signal(signal.SIGTERM, stop)\n"
           "print('up', flush=True)\n"
           "time.sleep(20)\n")
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "app.py"), "w").write(app)
        script = os.path.join(d, "webui.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/bash\n{A.python} -u {d}/app.py\necho after\n")
        os.chmod(script, 0o755)
        for how, argv in (("image ENTRYPOINT", ns + image),
                          ("docker run --init", ns + [shutil.which("tini"), "--"] + image),
                          ("entrypoint as PID 1", ns + [entry])):
            stats = os.path.join(d, how.replace(" ", "_"))
            os.mkdir(stats)
            p = subprocess.Popen(argv + [script], env=env(FORGEALLOC_STATS_DIR=stats), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                check(p.stdout.readline() == "up\n", f"{how}: the script's Python did not start")
                target = ns_pid1(p.pid)
                check(target, f"{how}: no PID 1")
                time.sleep(0.3)
                os.kill(target, signal.SIGTERM)
                out, err = p.communicate(timeout=30)
                check(p.returncode == 143, f"{how}: status {p.returncode}, stderr {err!r}")
                check("after" not in out, f"{how}: the script went on after SIGTERM: {out!r}")
                check(out == "cleaned up\n", f"{how}: Python's shutdown was cut short: {out!r} (stderr {err!r})")
                check("tini" not in err, f"{how}: tini printed: {err!r}")
                text = [open(os.path.join(stats, x)).read() for x in os.listdir(stats)]
                check(any(re.match(r"forgealloc [0-9.]+: pid \d+ \(.*python.*\), exit", t) for t in text),
                      f"{how}: no dump from Python ({len(text)} files; stderr {err!r})")
            finally:  # a Python the signal missed: every process of the session
                subprocess.run(["pkill", "-KILL", "-s", str(p.pid)], capture_output=True)
        # Elsewhere the entrypoint execs the command, which is a child of nobody in between.
        r = sh(["/bin/sh", "-c", f'"{entry}" /bin/sh -c \'echo $PPID\'; echo $$'], env(FORGEALLOC_STATS="off"))
        lines = r.stdout.split()
        check(r.returncode == 0 and len(lines) == 2 and lines[0] == lines[1], f"not under tini: {r!r}")


def case_wait_group_auto():
    """run --wait-group=auto (what the entrypoint passes) stays as the command's parent only where tini (or
    docker-init) signals the process group: -g anywhere before `--`, alone or in a cluster, or
    TINI_KILL_PROCESS_GROUP with any value (tini only asks whether it is set); elsewhere it execs the command."""
    tini = shutil.which("tini")
    if not tini:
        print("needs tini - skipped")
        return SKIP
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    show = ["/bin/sh", "-c", "echo $PPID"]
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "docker-init")  # Docker's --init: tini under another name
        os.symlink(tini, init)
        for argv, extra, waits in (([tini, "-s", "-g", "--"], {}, True),
                                   ([tini, "-sg", "--"], {}, True),
                                   ([tini, "-s", "-e", "3", "--"], {}, False),
                                   ([tini, "-s", "--"], {}, False),
                                   ([tini, "-s", "--"], {"TINI_KILL_PROCESS_GROUP": "0"}, True),
                                   ([init, "-s", "--"], {"TINI_KILL_PROCESS_GROUP": ""}, True),
                                   ([init, "-s", "--"], {}, False)):
            for how in ([launcher(), "run", "--wait-group=auto", "--"], [entry]):
                p = subprocess.Popen(argv + how + show, env=env(FORGEALLOC_STATS="off", **extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                out, err = p.communicate(timeout=60)
                waited = out.strip() != str(p.pid)
                check(p.returncode == 0 and err == "" and waited == waits,
                      f"{argv} {extra} {how[0]}: the command's parent {out.strip()} (tini {p.pid}), "
                      f"expected {'the launcher' if waits else 'tini'}; stderr {err!r}")
    # Not under tini: exec, the command has the launcher's pid.
    r = sh(["/bin/sh", "-c", f'"{launcher()}" run --stats off --wait-group=auto -- /bin/sh -c \'echo $PPID\'; echo $$'])
    lines = r.stdout.split()
    check(r.returncode == 0 and len(lines) == 2 and lines[0] == lines[1], f"not under tini: {r!r}")
    # A value for --wait-group other than auto: one line, the launcher's own error.
    r = sh([launcher(), "run", "--wait-group=yes", "--", "true"])
    check(r.returncode != 0 and r.stderr.count("\n") == 1 and "--wait-group=auto" in r.stderr, f"--wait-group=yes: {r!r}")


def sig_mask(pid, field):
    """A signal mask from /proc/PID/status (SigIgn, SigCgt), 0 when the process is gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def case_wait_group_signals():
    """run --wait-group: a SIGTERM or SIGINT sent to the process group (tini -g, Ctrl+C) as the command is being
    started, after the launcher has forked it and before it has set its signals to their defaults, is not lost:
    the child never ignores it (it used to, from the fork until it reset its traps), and the command ends of it.
    The child is stopped right after the fork, the signal sent, the child continued.  bash itself can still lose a
    SIGINT that lands after its last check for one and before exec (a few microseconds; one loss in five
    tolerated).  A second signal during the wait for the rest of the group ends the wait, with nothing printed."""
    if tuple(int(x) for x in re.findall(r"\d+", subprocess.run(["bash", "-c", "echo ${BASH_VERSINFO[0]} ${BASH_VERSINFO[1]}"],
                                                              capture_output=True, text=True).stdout)) < (5, 2):
        print("bash older than 5.2 (a subshell takes a trapped signal before its reset as its own trap) - skipped")
        return SKIP
    marker = 1 << (signal.SIGRTMAX - 1)  # caught or ignored by the launcher from just before the fork on
    for sig in (signal.SIGTERM, signal.SIGINT):
        bit, lost = 1 << (sig - 1), []
        for i in range(5):
            p = subprocess.Popen([launcher(), "run", "--stats", "off", "--wait-group", "--", "sleep", "5"], env=env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                deadline = time.time() + 30
                kids = []
                while not kids and time.time() < deadline:
                    if (sig_mask(p.pid, "SigIgn") | sig_mask(p.pid, "SigCgt")) & marker:
                        try:
                            kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
                        except OSError:
                            pass
                check(kids, f"{sig.name}: no child of the launcher")
                os.killpg(p.pid, signal.SIGSTOP)
                child = "?"
                while time.time() < deadline:  # stopped for real: its state is what the signal finds
                    try:
                        if open(f"/proc/{kids[0]}/stat").read().rsplit(") ", 1)[1].split()[0] in "TtZX":
                            child = open(f"/proc/{kids[0]}/cmdline").read().replace("\0", " ")
                            break
                    except OSError:
                        break
                ignored = sig_mask(kids[0], "SigIgn") & bit
                child += " " + " ".join(f"{f}={bool(sig_mask(kids[0], f) & bit)}" for f in ("SigBlk", "SigIgn", "SigCgt"))
                os.killpg(p.pid, sig)
                os.killpg(p.pid, signal.SIGCONT)
                t = time.time()
                _, err = p.communicate(timeout=30)
                check(not ignored, f"{sig.name} right after the fork: the child ignores it ({child}), it is lost")
                check(err == "", f"{sig.name}: stderr {err!r}")
                if p.returncode != 128 + sig or time.time() - t > 3:
                    lost.append(f"run {i}: status {p.returncode} after {time.time() - t:.1f} s, the child {child}")
            finally:
                subprocess.run(["pkill", "-KILL", "-s", str(p.pid)], capture_output=True)
        check(len(lost) <= 1, f"{sig.name} right after the fork did not end the command: {lost}")
    # The command ends of SIGTERM; another process of its group ignores it: the wait for it ends at the second.
    p = subprocess.Popen([launcher(), "run", "--stats", "off", "--wait-group", "--", "/bin/sh", "-c",
                          "sh -c 'trap \"\" TERM; sleep 20' >/dev/null 2>&1 & echo up; exec sleep 20"], env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        check(p.stdout.readline() == "up\n", "the command did not start")
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGTERM)
        time.sleep(0.5)
        check(p.poll() is None, f"the launcher did not wait for the rest of the group: {p.returncode}")
        os.killpg(p.pid, signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            check(False, "a second SIGTERM did not end the wait")
        check(p.returncode == 143 and err == "", f"second SIGTERM: status {p.returncode}, stderr {err!r}")
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(p.pid)], capture_output=True)


# ---- start scripts that overwrite LD_PRELOAD, and the system preload (in a chroot) ----

CHROOT_MOUNTS = r"""
set -e
root=$1; shift
for d in usr bin sbin lib lib32 lib64 libx32; do
    if [ -L "/$d" ]; then ln -sfn "$(readlink "/$d")" "$root/$d"
    elif [ -d "/$d" ]; then mkdir -p "$root/$d"; mount --bind "/$d" "$root/$d"; mount -o remount,bind,ro "$root/$d"
    fi
done
for d in "$@"; do [ "$d" = -- ] && break; mkdir -p "$root$d"; mount --bind "$d" "$root$d"; mount -o remount,bind,ro "$root$d"; done
while [ "$1" != -- ]; do shift; done; shift
mkdir -p "$root/proc" "$root/dev"
mount --bind /proc "$root/proc"
mount --bind /dev "$root/dev"
exec chroot "$root" "$@"
"""


def make_chroot(d):
    """A root directory for chroot: the machine's /usr (read-only), a copy of its /etc with no
    ld.so.preload, an empty /tmp; or None when this machine cannot make one."""
    root = os.path.join(d, "root")
    os.makedirs(os.path.join(root, "tmp"))
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    os.makedirs(os.path.join(root, "root"))
    if subprocess.run(["cp", "-a", "/etc", os.path.join(root, "etc")]).returncode != 0:
        return None
    for junk in ("ld.so.preload",):
        if os.path.lexists(os.path.join(root, "etc", junk)):
            os.unlink(os.path.join(root, "etc", junk))
    probe = in_chroot(root, ["/bin/true"], {})
    return root if probe.returncode == 0 else None


def in_chroot(root, cmd, extra_env, timeout=120):
    """cmd inside `root` (a mount namespace of its own: the mounts end with it), with a clean environment."""
    binds = sorted({A.srcdir, A.builddir, os.path.dirname(A.lib)})
    e = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
         "FORGEALLOC_LIB": A.lib, **extra_env}
    inner = ["/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in e.items()] + cmd
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", CHROOT_MOUNTS, "chroot-setup",
                           root] + binds + ["--"] + inner, capture_output=True, text=True, timeout=timeout)


def served(out):
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def case_system_preload():
    """A start script that overwrites LD_PRELOAD (export LD_PRELOAD="$(ldconfig -p | grep -Po 'libtcmalloc.so.\d'
    | head -n 1)"), under the entrypoint: without the system preload the app runs without forgealloc; with
    FORGEALLOC_PRELOAD=system it still loads it (tcmalloc first: one line, and it says so).  In a chroot: never
    the machine's own /etc/ld.so.preload."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("chroot"):
        print("needs root, unshare and chroot to make a chroot - skipped")
        return SKIP
    query = os.path.join(os.path.dirname(A.lib), "forgealloc-query")
    entry = os.path.join(A.srcdir, "docker", "entrypoint.sh")
    host_preload = os.path.exists("/etc/ld.so.preload") and open("/etc/ld.so.preload").read()
    with tempfile.TemporaryDirectory() as d:
        root = make_chroot(d)
        if not root:
            print("cannot make a chroot here (no mount namespace or bind mounts) - skipped")
            return SKIP
        start = os.path.join(root, "tmp", "start.sh")
        with open(start, "w") as f:
            f.write("#!/bin/sh\n"
                    "export LD_PRELOAD=\"$(ldconfig -p | grep -Po 'libtcmalloc.so.\\d' | head -n 1)\"\n"
                    f"exec {query} served\n")
        os.chmod(start, 0o755)
        keep = os.path.join(root, "tmp", "keep.sh")
        with open(keep, "w") as f:
            f.write(f"#!/bin/sh\nexec {query} served\n")
        os.chmod(keep, 0o755)
        open(os.path.join(root, ".dockerenv"), "w").close()
        base = {"FORGEALLOC_STATS": "off"}
        check(subprocess.run(["sh", "-c", "ldconfig -p | grep -Po 'libtcmalloc.so.\\d' | head -n 1"],
                             capture_output=True, text=True).stdout.strip(), "libtcmalloc.so.N not in ldconfig -p")

        # Without the system preload: the script drops forgealloc, silently.
        for how in (["/tmp/start.sh"], [A.python, "-c", "import os; os.execv('/tmp/start.sh', ['start.sh'])"]):
            r = in_chroot(root, [entry] + how, base)
            got = served(r.stdout)
            check(r.returncode == 0 and got.get("forgealloc") == "absent" and "libtcmalloc.so" in got.get("served_by", ""),
                  f"no system preload: {r.stdout!r} {r.stderr!r}")
            check(r.stderr == "", f"no system preload printed {r.stderr!r}")

        # With it: /etc/ld.so.preload lists the library first; the script's tcmalloc comes before it.
        r = in_chroot(root, [entry, "/tmp/start.sh"], dict(base, FORGEALLOC_PRELOAD="system"))
        got = served(r.stdout)
        lines = r.stderr.splitlines()
        check(r.returncode == 0 and got.get("forgealloc") == "loaded" and got.get("interposed") == "no"
              and "libtcmalloc.so" in got.get("served_by", ""), f"system preload, script overwrites: {r.stdout!r} {r.stderr!r}")
        check(len(lines) == 1 and "libtcmalloc.so" in lines[0] and "LD_PRELOAD" in lines[0], f"one line: {lines}")
        registered = open(os.path.join(root, "etc", "ld.so.preload")).read().split()
        check(registered and registered[0] == A.lib, f"/etc/ld.so.preload in the chroot: {registered}")
        # A script that leaves LD_PRELOAD alone: forgealloc serves, silently, loaded once.
        r = in_chroot(root, [entry, "/tmp/keep.sh"], dict(base, FORGEALLOC_PRELOAD="system"))
        got = served(r.stdout)
        check(got.get("interposed") == "yes" and r.stderr == "", f"system preload, script keeps: {r.stdout!r} {r.stderr!r}")
        check(open(os.path.join(root, "etc", "ld.so.preload")).read().split() == registered, "registered twice")
        # A restart with the library registered: the shells of the entrypoint and the launcher carry it too, yet
        # only the command's dump reaches the console and only its child writes a file.
        r = in_chroot(root, [entry, A.python, "-c", "import subprocess; subprocess.run(['/bin/true'])"],
                      {"FORGEALLOC_PRELOAD": "system", "FORGEALLOC_STATS_DIR": "/tmp/st"})
        dumps = re.findall(r"^forgealloc [0-9.]+: pid \d+ \((.*?)\)", r.stderr, re.M)
        check(r.returncode == 0 and len(dumps) == 1 and "python" in dumps[0], f"restart, dumps on stderr: {r.stderr!r}")
        files = os.listdir(os.path.join(root, "tmp", "st"))
        check(len(files) == 1, f"restart, stats files: {files}")
        check("true" in open(os.path.join(root, "tmp", "st", files[0])).read().splitlines()[0], f"the child's: {files}")
        # forgealloc run -- start.sh (the launcher without the entrypoint) gets the same from the system preload.
        r = in_chroot(root, [launcher(), "run", "--", "/tmp/start.sh"], base)
        check(served(r.stdout).get("forgealloc") == "loaded", f"forgealloc run with the system preload: {r.stdout!r}")
        r = in_chroot(root, [launcher(), "system-preload", "--remove"], base)
        check(r.returncode == 0 and not os.path.exists(os.path.join(root, "etc", "ld.so.preload")), f"--remove: {r!r}")
        # Entries already in the file are kept as written: a name with a wildcard is not matched against files.
        for name in ("libwild-a.so", "libwild-b.so"):
            open(os.path.join(root, "tmp", name), "w").close()
        with open(os.path.join(root, "etc", "ld.so.preload"), "w") as f:
            f.write("/tmp/libwild-*.so\n")
        r = in_chroot(root, [launcher(), "system-preload"], base)
        registered = open(os.path.join(root, "etc", "ld.so.preload")).read().split()
        check(r.returncode == 0 and registered == [A.lib, "/tmp/libwild-*.so"], f"an entry with a wildcard: {registered}")
        r = in_chroot(root, [launcher(), "system-preload", "--remove"], base)
        registered = open(os.path.join(root, "etc", "ld.so.preload")).read().split()
        check(r.returncode == 0 and registered == ["/tmp/libwild-*.so"], f"--remove, wildcard entry: {registered}")
        os.unlink(os.path.join(root, "etc", "ld.so.preload"))

        # Not a container (no /.dockerenv or hints): refused with one line, nothing written.
        os.unlink(os.path.join(root, ".dockerenv"))
        r = in_chroot(root, [entry, "/tmp/keep.sh"], dict(base, FORGEALLOC_PRELOAD="system"))
        in_cgroup = re.search(r"/(docker|containerd|kubepods|libpod|lxc)", open("/proc/1/cgroup").read())
        if not in_cgroup:
            lines = r.stderr.splitlines()
            check(len(lines) == 1 and "only inside a container" in lines[0], f"host refusal: {r.stderr!r}")
            check(not os.path.exists(os.path.join(root, "etc", "ld.so.preload")), "written outside a container")
            check(served(r.stdout).get("interposed") == "yes", "the command still runs under LD_PRELOAD")
        r = in_chroot(root, [entry, "/tmp/keep.sh"], dict(base, FORGEALLOC_PRELOAD="bogus"))
        check(len(r.stderr.splitlines()) == 1 and "FORGEALLOC_PRELOAD=bogus" in r.stderr, f"bad value: {r.stderr!r}")
    now = os.path.exists("/etc/ld.so.preload") and open("/etc/ld.so.preload").read()
    check(now == host_preload, "this machine's /etc/ld.so.preload changed")


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
    files = [os.path.join(A.srcdir, p) for p in ("scripts/forgealloc", "scripts/forgealloc-doctor", "docker/entrypoint.sh",
                                                 ".ci/run")]
    files += glob.glob(os.path.join(A.srcdir, "scripts", "*.sh"))
    r = subprocess.run(["shellcheck"] + files, capture_output=True, text=True)
    check(r.returncode == 0, r.stdout)


def options(ap):
    ap.add_argument("--builddir", required=True)
    ap.add_argument("--srcdir", required=True)
    ap.add_argument("--python", default=DEFAULT_PYTHON)


if __name__ == "__main__":
    sys.exit(main(globals(), "A", options))
