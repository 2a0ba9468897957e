"""harness.py - what the Python test drivers (preload/, device/, launcher/run.py) share.

A driver defines functions named case_<name>; ctest runs `run.py <name> ...`.
A case passes by returning, fails by raising Failure (through check), and is
skipped by returning SKIP (ctest's SKIP_RETURN_CODE)."""
SKIP = 77


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def run_case(namespace, name):
    """Run case_<name> from a driver's globals; returns the exit status."""
    fn = namespace.get("case_" + name)
    if not fn:
        print("unknown case", name)
        return 2
    try:
        return fn() or 0
    except Failure as e:
        print("FAIL:", e)
        return 1
