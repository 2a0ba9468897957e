#!/usr/bin/env bash
# demo.sh - set up, build, and run the demo (a stand-in for a WebUI's
# launch.py) under the shim; the shim's stats print when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo
scripts/build.sh >/dev/null
exec scripts/forgealloc run -- python3 scripts/demo_launch.py "$@"
