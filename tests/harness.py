"""harness.py - what the Python test drivers (preload/, device/, launcher/, gpu/run.py) share.

A driver defines functions named case_<name>; ctest runs
`run.py <name> --lib LIB [driver options]`, and the driver's main is
harness.main. A case passes by returning, fails by raising Failure (through
check), and is skipped by returning SKIP (ctest's SKIP_RETURN_CODE)."""
import argparse
import os

SKIP = 77
# The Python that real-client cases run: Debian's, which has the packages a user's has.
DEFAULT_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


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


def main(namespace, name, add_options, validate=None):
    """A driver's main: parse `<case> --lib LIB` and the options add_options(parser)
    adds, resolve --lib to a real absolute path, let validate(parser, args)
    reject combinations (through parser.error), store the arguments in the
    driver's global namespace[name], and run the case; returns the exit status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--lib", required=True)
    add_options(ap)
    args = ap.parse_args()
    args.lib = os.path.realpath(args.lib)
    if validate:
        validate(ap, args)
    namespace[name] = args
    return run_case(namespace, args.case)
