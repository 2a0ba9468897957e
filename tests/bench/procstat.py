"""procstat.py - what the benchmark scripts read of their own process."""


def rss_anon_bytes():
    """RssAnon from /proc/self/status, in bytes (-1 where it is missing)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return -1
