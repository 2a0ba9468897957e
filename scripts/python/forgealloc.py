"""forgealloc - talk to libforgealloc.so from Python, without a compiled extension.

Inside a process started under the shim (``forgealloc run -- python ...`` or
``LD_PRELOAD=libforgealloc.so python ...``)::

    import forgealloc
    forgealloc.available()        # True when the shim is loaded
    forgealloc.stats()            # the live statistics, as a dict (schema forgealloc.stats/1)
    forgealloc.release()          # give free memory back to the OS; returns bytes
    forgealloc.stat("host.calls.malloc")

The functions are found through ctypes.CDLL(None), i.e. in the process's
global symbol scope, where the preloaded library put them.  Without the shim,
available() is False and the others raise ForgeallocUnavailable.

Run as a script it is the Python side of ``forgealloc report``:
``forgealloc.py report FILE [OTHER]``.
"""
import ctypes
import json
import signal
import sys

__all__ = ["available", "version", "stats", "stat", "release", "options", "ForgeallocUnavailable"]


class ForgeallocUnavailable(RuntimeError):
    """libforgealloc.so is not loaded in this process."""


def _lib():
    try:
        lib = ctypes.CDLL(None)
        lib.forgealloc_version  # raises AttributeError when absent
    except (OSError, AttributeError):
        return None
    lib.forgealloc_version.restype = ctypes.c_char_p
    lib.forgealloc_stats_json.restype = ctypes.c_size_t
    lib.forgealloc_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.forgealloc_options_json.restype = ctypes.c_size_t
    lib.forgealloc_options_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.forgealloc_release.restype = ctypes.c_size_t
    lib.forgealloc_stat.restype = ctypes.c_int
    lib.forgealloc_stat.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
    return lib


def _need():
    lib = _lib()
    if lib is None:
        raise ForgeallocUnavailable("libforgealloc.so is not loaded: start the program with "
                                    "`forgealloc run -- ...` or LD_PRELOAD=/path/to/libforgealloc.so")
    return lib


def _json_call(fn):
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        need = fn(buf, size)
        if need < size:
            return json.loads(buf.value.decode("utf-8", "replace"))
        size = need + 1


def available():
    """True when libforgealloc.so is loaded in this process."""
    return _lib() is not None


def version():
    return _need().forgealloc_version().decode()


def stats():
    """The live statistics as a dict (the same document as FORGEALLOC_STATS=json)."""
    return _json_call(_need().forgealloc_stats_json)


def stat(key):
    """One number by its JSON key, e.g. "host.calls.malloc" or "device.0.pool_bytes"."""
    value = ctypes.c_uint64()
    if _need().forgealloc_stat(key.encode(), ctypes.byref(value)) != 0:
        raise KeyError(key)
    return value.value


def release():
    """Return free memory held by the allocator to the OS; returns the bytes returned."""
    return int(_need().forgealloc_release())


def options():
    """Every FORGEALLOC_* setting: name, type, default, effective value, source, doc."""
    return _json_call(_need().forgealloc_options_json)


# ---- command line: report ----------------------------------------------------------

def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _shown(v):
    """Text from a dump as a terminal may show it: control characters (an escape sequence in a program's path)
    written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(v))


def _cell(v, is_bytes):
    """One value as the table shows it: numbers grouped, bytes readable, anything else (a device's
    "pool_type": "pieces") as it is."""
    if v is None:
        return "-"
    if not isinstance(v, (int, float)):
        return _shown(v)
    if is_bytes:
        return _human(v)
    return f"{v:,.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else f"{v:,}"


def _rows(doc):
    """(section, name, value, is_bytes) for every value a report shows."""
    host = doc.get("host", {})
    out = [("process", "pid", doc.get("pid"), False), ("process", "uptime s", doc.get("uptime_ms", 0) / 1000, False)]
    for k, v in host.get("calls", {}).items():
        out.append(("host calls", k, v, False))
    for k, v in host.items():  # the host numbers of one value each, in the document's order
        if isinstance(v, int) and not isinstance(v, bool):
            out.append(("host", k, v, k.endswith("bytes")))
    for k, v in (host.get("release") or {}).items():
        if isinstance(v, int) and not isinstance(v, bool):
            out.append(("release", k, v, k.endswith("bytes")))
    for k, v in (host.get("tcmalloc") or {}).items():
        if k not in ("valid", "serves_malloc") and v is not None:
            out.append(("tcmalloc", k, v, k.endswith("bytes")))
    for d in doc.get("device", {}).get("devices", []):
        for k, v in d.items():
            if k != "device":
                out.append((f"device {d['device']}", k, v, k.endswith("bytes")))
    return out


def _well_formed(doc):
    """The parts of a dump the table reads have their types."""
    host, device = doc.get("host", {}), doc.get("device", {})
    if not isinstance(host, dict) or not isinstance(device, dict):
        return False
    if not isinstance(doc.get("uptime_ms", 0), (int, float)) or not isinstance(device.get("devices", []), list):
        return False
    parts = [host.get("calls", {}), host.get("release") or {}, host.get("tcmalloc") or {}] + device.get("devices", [])
    return all(isinstance(x, dict) for x in parts) and all("device" in d for d in device.get("devices", []))


def _report(paths):
    docs = []
    for p in paths:
        try:
            with open(p, errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(f"forgealloc: cannot read {p}: {e.strerror}", file=sys.stderr)
            return 2
        kind = "text" if text.startswith("forgealloc ") else "Prometheus" if text.startswith("# HELP forgealloc_") else ""
        if kind:
            print(f"forgealloc: {p} is a {kind} dump; report reads JSON dumps: write them with --stats json "
                  "(FORGEALLOC_STATS=json)", file=sys.stderr)
            return 2
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("schema") != "forgealloc.stats/1" or not _well_formed(doc):
            print(f"forgealloc: {p} is not a forgealloc stats dump (FORGEALLOC_STATS=json)", file=sys.stderr)
            return 2
        docs.append(doc)
    for p, d in zip(paths, docs):
        print(f"{p}: {_shown(d.get('exe'))} pid {d.get('pid')} ({_shown(d.get('reason'))}), "
              f"forgealloc {_shown(d.get('version'))}")
        if d.get("host", {}).get("interposed") is False:
            print(f"  malloc served by {_shown(d['host'].get('served_by'))}, not forgealloc: its calls are not counted")
    tables = [{(s, n): (v, b) for s, n, v, b in _rows(d)} for d in docs]
    keys = [(s, n) for s, n, _, _ in _rows(docs[0])]
    for extra in tables[1:]:
        keys += [k for k in extra if k not in keys]
    section = None
    for key in keys:
        if key[0] != section:
            section = key[0]
            print(f"\n{section}")
        cells = [_cell(*t.get(key, (None, False))) for t in tables]
        line = f"  {key[1]:<26}" + "".join(f"{c:>16}" for c in cells)
        if len(tables) == 2 and key[0] != "process":
            a, b = (t.get(key, (None, False))[0] for t in tables)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a != b:
                diff = b - a
                line += f"{'+' if diff > 0 else ''}{_human(diff) if tables[0][key][1] else f'{diff:,}'}".rjust(16)
                if a:
                    line += f"  ({b / a:.2f}x)"
        print(line)
    return 0


def main(argv):
    if len(argv) in (2, 3) and argv[0] == "report":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly, as it ends other tools
        return _report(argv[1:])
    print("usage: forgealloc.py report FILE.json [OTHER.json]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
