#!/usr/bin/env python3
"""Validate a forgealloc stats JSON document against DESIGN.md's contract.

Reads the document from the file named on the command line (or stdin) and
exits non-zero with one line per problem.  Used by the unit tests (hand-made
snapshots) and the preload tests (real dumps)."""
import json
import sys

HOST_CALLS = ["malloc", "calloc", "realloc", "reallocarray", "free", "memalign", "posix_memalign",
              "aligned_alloc", "valloc", "pvalloc", "new", "delete"]
TCMALLOC = ["current_allocated_bytes", "heap_size", "pageheap_free_bytes", "pageheap_unmapped_bytes"]
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
    for key in ["bytes_requested", "large_allocs", "rss_bytes", "peak_rss_bytes"]:
        need(host, key, "host.", int)
    need(host, "interposed", "host.", bool)
    if "served_by" not in host or not (host["served_by"] is None or isinstance(host["served_by"], str)):
        out.append("host.served_by is missing or neither a string nor null")
    release = need(host, "release", "host.", dict) or {}
    for key in ["delay_bytes", "threshold_bytes", "pressure_bytes", "request_bytes"]:
        need(release, key, "host.release.", int)
    need(release, "background", "host.release.", bool)
    need(release, "hold_ms", "host.release.", int)
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
    return out


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
