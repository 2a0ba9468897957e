#!/usr/bin/env bash
# demo.sh - set up, build, and run the demo (a stand-in for a WebUI's
# launch.py) under the shim; the shim's stats print when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo
scripts/build.sh -DFA_TESTS=OFF >/dev/null  # the demo needs no test packages
exec scripts/forgealloc run -- python3 scripts/demo_launch.py "$@"
