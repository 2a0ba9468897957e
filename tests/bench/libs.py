"""Where a shared library is, as the benchmarks preload it by path."""
import os
import subprocess
import sys


def find_library(soname, first=()):
    """Path of soname: the directories `first`, then the multiarch directories, then ldconfig's cache."""
    multiarch = getattr(sys.implementation, "_multiarch", "")
    for directory in (*first, f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/usr/lib64", "/usr/lib"):
        path = os.path.join(directory, soname)
        if os.path.exists(path):
            return path
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""
    for line in cache.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.split(" (")[0] == soname and os.path.exists(path):
            return path
    return ""
