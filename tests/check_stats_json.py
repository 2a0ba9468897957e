#!/usr/bin/env python3
"""Validate a forgealloc stats JSON document against the documented key set (docs/stats.md).

Reads the document from the file named on the command line (or stdin) and
exits non-zero with one line per problem.  Used by the unit tests (hand-made
snapshots) and the preload tests (real dumps).  The numbers of the "host"
object it expects are read from the renderers' own table, FA_HOST_FIELDS in
src/stats/snapshot.h."""
import json
import re
import sys
from pathlib import Path

HOST_CALLS = ["malloc", "calloc", "realloc", "reallocarray", "free", "memalign", "posix_memalign",
              "aligned_alloc", "valloc", "pvalloc", "new", "delete"]
TCMALLOC = ["current_allocated_bytes", "heap_size", "pageheap_free_bytes", "pageheap_unmapped_bytes"]
SNAPSHOT_H = Path(__file__).resolve().parent.parent / "src" / "stats" / "snapshot.h"


def _macro_body(text, name):
    """The replacement text of `#define name(...)`, continuation lines joined."""
    m = re.search(r"^#define " + name + r"\([^)]*\)((?:.*\\\n)*.*)$", text, re.M)
    if not m:
        raise RuntimeError(f"{SNAPSHOT_H}: no #define {name}")
    return m.group(1).replace("\\\n", " ")


def _host_fields():
    """(key, kind, always) of every row of FA_HOST_FIELDS, the table the
    renderers make the numbers of the "host" object from: key relative to
    host, kind FA_COUNTER, FA_GAUGE or FA_FLAG, always False for a row shown
    only under a condition."""
    text = SNAPSHOT_H.read_text()
    reasons = re.findall(r"X\((\w+),", _macro_body(text, "FA_RELEASE_REASONS"))
    rows = []
    for m in re.finditer(r"FA_RELEASE_REASONS\(FA_HOST_RELEASE_ROW, X\)|"
                         r"X\(\s*\"([\w.]+)\",\s*(FA_\w+),\s*FA_\w+,\s*([^,]+?),",
                         _macro_body(text, "FA_HOST_FIELDS")):
        if m.group(1) is None:  # FA_HOST_RELEASE_ROW: host.release.<reason>_bytes, a counter
            rows += [(f"release.{r}_bytes", "FA_COUNTER", True) for r in reasons]
        else:
            rows.append((m.group(1), m.group(2), m.group(3).strip() == "1"))
    if len(rows) < 10 or not reasons:
        raise RuntimeError(f"{SNAPSHOT_H}: FA_HOST_FIELDS not understood ({len(rows)} rows)")
    return rows


HOST_FIELDS = _host_fields()
DEVICE = ["device", "pool_bytes", "in_use_bytes", "peak_in_use_bytes", "allocs", "frees", "pool_allocs",
          "fallback_allocs", "driver_malloc_calls", "driver_free_calls", "device_syncs", "waste_bytes"]


def problems(doc):
    out = []

    def need(obj, key, where, kind=None):
        if not isinstance(obj, dict) or key not in obj:
            out.append(f"missing {where}{key}")
            return None
        if kind is not None and not isinstance(obj[key], kind):
            out.append(f"{where}{key} is {type(obj[key]).__name__}, expected {kind}")
        return obj[key]

    if doc.get("schema") != "forgealloc.stats/1":
        out.append(f"schema is {doc.get('schema')!r}")
    need(doc, "pid", "", int)
    need(doc, "exe", "", str)
    config = need(doc, "config", "", dict) or {}
    for key in ["stats", "stats_file", "release_rate", "large_alloc_report", "device_pool_size", "log"]:
        need(config, key, "config.")
    host = need(doc, "host", "", dict) or {}
    calls = need(host, "calls", "host.", dict) or {}
    for key in HOST_CALLS:
        need(calls, key, "host.calls.", int)
    for key, kind, always in HOST_FIELDS:
        *path, name = key.split(".")
        obj, where = host, "host."
        for part in path:
            obj = need(obj, part, where, dict) if isinstance(obj, dict) else None
            where += part + "."
        if not isinstance(obj, dict) or (not always and name not in obj):
            continue
        value = need(obj, name, where, bool if kind == "FA_FLAG" else int)
        if kind != "FA_FLAG" and isinstance(value, bool):
            out.append(f"{where}{name} is bool, expected int")
    need(host, "interposed", "host.", bool)
    if "served_by" not in host or not (host["served_by"] is None or isinstance(host["served_by"], str)):
        out.append("host.served_by is missing or neither a string nor null")
    tc = need(host, "tcmalloc", "host.", dict) or {}
    for key in TCMALLOC:
        need(tc, key, "host.tcmalloc.")
    # Another allocator serves malloc: tcmalloc's numbers are not the process's.
    if tc.get("serves_malloc") is False and any(tc.get(key) is not None for key in TCMALLOC):
        out.append("host.tcmalloc has numbers although another allocator serves malloc")
    device = need(doc, "device", "", dict) or {}
    devices = need(device, "devices", "device.", list) or []
    for i, dev in enumerate(devices):
        for key in DEVICE:
            need(dev, key, f"device.devices[{i}].", int)
        if all(k in dev for k in ("allocs", "pool_allocs", "fallback_allocs")) and \
                dev["allocs"] != dev["pool_allocs"] + dev["fallback_allocs"]:
            out.append(f"device.devices[{i}]: allocs != pool_allocs + fallback_allocs")
    return list(dict.fromkeys(out))  # a missing object is told once, not once per number in it


def main():
    text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
    try:
        doc = json.loads(text)
    except ValueError as e:
        print(f"not JSON: {e}")
        return 1
    found = problems(doc)
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
