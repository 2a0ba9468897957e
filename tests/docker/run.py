#!/usr/bin/env python3
"""Docker test: build docker/Dockerfile and use the image as a user would.

    run.py image --srcdir DIR [--tag forgealloc-test]

Needs a Docker daemon: the one running, or one this test starts when run as
root with dockerd installed (and stops again).  With no registry reachable,
the base image debian:12-slim is made with debootstrap and kept for the next
run.  Skipped (exit 77, one line saying why) when there is no way to a daemon
or to a base image."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from harness import SKIP, Failure, check, run_case  # noqa: E402

ARGS = None
BASE = "debian:12-slim"
TEXT_HEADER = re.compile(r"^forgealloc \S+: pid (\d+) \(.*?\)(?:, forked)?, (\w+) after ", re.M)


class Skip(Exception):
    pass


def docker(*args, timeout=120, check_rc=True, **kw):
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, errors="replace", **kw)
    if check_rc and r.returncode != 0:
        failed = [line for line in r.stdout.splitlines() if re.search(r"\*\*\*|FAIL", line)]
        raise Failure(f"docker {' '.join(args[:3])}... failed ({r.returncode}): {r.stderr.strip()[-1500:]}\n"
                      + "\n".join(failed[-40:] or r.stdout.splitlines()[-40:]))
    return r


def daemon_up():
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_daemon():
    """Returns the dockerd we started, or None if one was already up."""
    if not shutil.which("docker"):
        raise Skip("no docker command (Debian: apt-get install docker.io)")
    if daemon_up():
        return None
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        raise Skip("no Docker daemon running, and starting one needs root and dockerd (docker.io)")
    # No iptables and no bridge: this test's containers need no network of
    # their own (the build uses the host's), and a CI machine may not allow either.
    log = open(os.path.join(tempfile.gettempdir(), "forgealloc-test-dockerd.log"), "w")
    p = subprocess.Popen(["dockerd", "--iptables=false", "--bridge=none"], stdout=log, stderr=log,
                         start_new_session=True)
    for _ in range(60):
        if daemon_up():
            return p
        if p.poll() is not None:
            break
        time.sleep(0.5)
    p.terminate()
    raise Skip(f"dockerd did not start (see {log.name})")


def ensure_base():
    """debian:12-slim: the one already there, pulled, or made with debootstrap."""
    if docker("image", "inspect", BASE, check_rc=False).returncode == 0:
        return "present"
    try:
        if docker("pull", BASE, check_rc=False, timeout=120).returncode == 0:
            return "pulled"
    except subprocess.TimeoutExpired:
        pass
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise Skip(f"no {BASE} image, no registry, and making one needs root and debootstrap")
    t = time.time()
    with tempfile.TemporaryDirectory(prefix="forgealloc-rootfs-") as d:
        r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", d, "http://deb.debian.org/debian"],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise Skip(f"no {BASE} image, no registry, and debootstrap failed: {r.stdout.strip()[-300:]}")
        tar = subprocess.Popen(["tar", "-C", d, "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "-", BASE], stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        check(imp.returncode == 0, f"docker import: {imp.stderr}")
    return f"made with debootstrap in {time.time() - t:.0f} s"


def wait_for_log(name, text, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        r = docker("logs", name, check_rc=False)
        if text in r.stdout:
            return
        time.sleep(0.2)
    raise Failure(f"{name} never printed {text!r}: {docker('logs', name, check_rc=False).stderr[-800:]}")


def ctrl_c_in_terminal():
    """`docker run -it` in a pseudo-terminal, Ctrl+C typed once the command is
    ready; returns (exit status, everything the terminal showed)."""
    import pty
    import select
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp("docker", ["docker", "run", "--rm", "-it", "--network", "none", ARGS.tag, "python3", "-c", APP,
                             "sleep"])
    out, typed, end = b"", False, time.time() + 90
    while time.time() < end:
        if not typed and b"ready" in out:
            os.write(fd, b"\x03")
            typed = True
        if not select.select([fd], [], [], 1.0)[0]:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not data:
            break
        out += data
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace").replace("\r\n", "\n")


APP = ("import signal, subprocess, sys, time\n"
       "mode = sys.argv[1]\n"
       "if mode == 'child': subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
       "try:\n"
       "    print('ready', flush=True)\n"
       "    time.sleep(0 if mode == 'child' else 60)\n"
       "except KeyboardInterrupt:\n"
       "    print('KeyboardInterrupt', flush=True)\n")


def case_image():
    """The image builds (its tests pass, the .deb installs in a bare Debian 12), runs
    the demo with a dump, stops at once on `docker stop` with the dump written,
    turns SIGINT into KeyboardInterrupt, and leaves per-process files in a volume."""
    dockerd = None
    try:
        dockerd = start_daemon()
        t0 = time.time()
        print(f"{BASE}: {ensure_base()}")
        t = time.time()
        before = docker("image", "inspect", "-f", "{{.Id}}", ARGS.tag, check_rc=False).stdout.strip()
        # The build stage gets a tag too: the next run reuses its layers (the
        # packages it installs), and what earlier runs left can go.
        dockerfile = os.path.join(ARGS.srcdir, "docker", "Dockerfile")
        for target in (["--target", "build", "-t", ARGS.tag + "-build"], ["-t", ARGS.tag]):
            docker("build", "--network", "host", "-f", dockerfile, *target, ARGS.srcdir, timeout=1500)
        print(f"image built in {time.time() - t:.0f} s")
        if before and before != docker("image", "inspect", "-f", "{{.Id}}", ARGS.tag).stdout.strip():
            docker("rmi", before, check_rc=False)
        docker("image", "prune", "-f", "--filter", "label=forgealloc.stage=build", check_rc=False)

        run = ["run", "--rm", "--network", "none"]
        r = docker(*run, ARGS.tag, timeout=300, check_rc=False)
        check(r.returncode == 0, f"the demo failed ({r.returncode}): {r.stderr[-1500:]}")
        check([m[1] for m in TEXT_HEADER.findall(r.stderr)] == ["exit"], f"the demo's dump: {r.stderr[-1500:]}")
        r = docker(*run, "--entrypoint", "dpkg-query", ARGS.tag, "-W", "-f", "${Status} ${Version}", "forgealloc")
        check(r.stdout.startswith("install ok installed"), f"forgealloc package in the image: {r.stdout}")

        # docker stop: SIGTERM reaches the command (not PID 1: tini is), which
        # dies of it (exit code 143, not 137 from Docker's SIGKILL) with its
        # dump.  Also with the entrypoint alone as ENTRYPOINT (an image that
        # copied it without tini): it puts tini in front itself.
        name = f"forgealloc-test-{os.getpid()}"
        for entry in ([], ["--entrypoint", "/usr/share/forgealloc/entrypoint.sh"]):
            docker("run", "-d", "--network", "none", "--name", name, *entry, ARGS.tag, "python3", "-c", APP, "sleep")
            try:
                wait_for_log(name, "ready")
                t = time.time()
                docker("stop", "-t", "20", name, timeout=60)
                took = time.time() - t
                code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
                logs = docker("logs", name).stderr
            finally:
                docker("rm", "-f", name, check_rc=False)
            what = "docker stop" + (" (entrypoint alone)" if entry else "")
            check(code == "143", f"{what}: exit code {code} (137: SIGTERM was ignored and Docker killed it)")
            check([m[1] for m in TEXT_HEADER.findall(logs)] == ["signal"], f"{what}: the dump: {logs[-800:]}")
            print(f"{what} took {took:.2f} s, exit code {code}, dump written")

        # Ctrl+C in `docker run -it`: KeyboardInterrupt, as on the host.
        status, out = ctrl_c_in_terminal()
        check(status == 0 and "KeyboardInterrupt" in out, f"Ctrl+C: status {status}, output {out[-800:]!r}")
        check([m[1] for m in TEXT_HEADER.findall(out)] == ["exit"], f"Ctrl+C: the dump: {out[-800:]!r}")
        print("Ctrl+C in docker run -it: KeyboardInterrupt, dump at exit")

        # A child process's stats land in the volume, one file per process;
        # the command's own go to docker logs.
        vol = f"forgealloc-test-{os.getpid()}"
        try:
            r = docker(*run, "-v", f"{vol}:/var/log/forgealloc", ARGS.tag, "python3", "-c", APP, "child")
            seen = docker(*run, "-v", f"{vol}:/v", "--entrypoint", "sh", ARGS.tag, "-c",
                          "cd /v && for f in *; do echo \"file $f\"; cat \"$f\"; done").stdout
        finally:
            docker("volume", "rm", "-f", vol, check_rc=False)
        files = re.findall(r"^file (.*)$", seen, re.M)
        check(len(files) == 1 and re.fullmatch(r"[0-9a-z.-]+-\d+-\d+\.txt", files[0]), f"stats files in the volume: {files}")
        check([m[1] for m in TEXT_HEADER.findall(seen)] == ["exit"], f"the file in the volume: {seen[-800:]}")
        check([m[1] for m in TEXT_HEADER.findall(r.stderr)] == ["exit"], f"the command's own dump: {r.stderr[-800:]}")
        # The same as a user other than root (images that run as one): the volume takes its file, and
        # nothing is said about the directory.
        try:
            r = docker(*run, "--user", "65534:65534", "-v", f"{vol}:/var/log/forgealloc", ARGS.tag, "python3", "-c",
                       APP, "child")
            seen = docker(*run, "-v", f"{vol}:/v", "--entrypoint", "ls", ARGS.tag, "/v").stdout.split()
        finally:
            docker("volume", "rm", "-f", vol, check_rc=False)
        check(r.returncode == 0 and len(seen) == 1, f"as user 65534: files {seen}, stderr {r.stderr[-800:]}")
        check(not re.search(r"^forgealloc: ", r.stderr, re.M), f"as user 65534, a line nobody asked for: {r.stderr[-800:]}")
        print(f"a child's stats file in the volume: {files[0]} (as root and as user 65534); {time.time() - t0:.0f} s in all")
    except Skip as e:
        print(f"skipped: {e}")
        return SKIP
    finally:
        if dockerd:
            dockerd.terminate()
            dockerd.wait(timeout=60)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--srcdir", required=True)
    ap.add_argument("--tag", default="forgealloc-test")
    ARGS = ap.parse_args()
    return run_case(globals(), ARGS.case)


if __name__ == "__main__":
    sys.exit(main())
