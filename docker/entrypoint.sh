#!/bin/sh
# entrypoint.sh - container ENTRYPOINT: run the command under forgealloc.
#
#   ENTRYPOINT ["/usr/local/share/forgealloc/entrypoint.sh"]
#   CMD ["python3", "launch.py", "--listen"]
#
# Composes LD_PRELOAD exactly like `forgealloc run` (it execs it), with
# container defaults unless set: a text dump, the command's own on stderr
# (docker logs) and every other process's in FORGEALLOC_STATS_DIR
# (default /var/log/forgealloc, mount a volume there to keep them), one file
# per process (%p).  `docker stop` sends SIGTERM; the dump is still written.
#
# The kernel never kills a container's PID 1 with a signal that process
# leaves at its default action, so the command must not be PID 1: the image
# starts this script under tini; started as PID 1 anyway (an ENTRYPOINT
# without tini or docker run --init), it puts tini in front when installed.
set -eu

if [ "$$" = 1 ] && command -v tini >/dev/null 2>&1; then
    exec tini -- "$0" "$@"
fi

if [ "$#" -eq 0 ]; then
    echo "forgealloc entrypoint: no command given; set CMD in the image or pass one to docker run" >&2
    exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
launcher=""
for c in "$here/forgealloc" "$here/../../bin/forgealloc" "$here/../scripts/forgealloc"; do
    if [ -x "$c" ]; then
        launcher=$c
        break
    fi
done
[ -n "$launcher" ] || launcher=$(command -v forgealloc 2>/dev/null || true)
if [ -z "$launcher" ]; then
    echo "forgealloc entrypoint: the forgealloc command is not installed next to $here or on PATH" >&2
    exit 2
fi

: "${FORGEALLOC_STATS:=text}"
export FORGEALLOC_STATS
if [ -z "${FORGEALLOC_STATS_FILE:-}" ] && [ "$FORGEALLOC_STATS" != off ]; then
    dir=${FORGEALLOC_STATS_DIR:-/var/log/forgealloc}
    if ! { mkdir -p "$dir" && [ -w "$dir" ]; } 2>/dev/null; then
        fallback=${TMPDIR:-/tmp}/forgealloc
        echo "forgealloc entrypoint: $dir is not writable; stats files go to $fallback (set FORGEALLOC_STATS_DIR)" >&2
        dir=$fallback
        mkdir -p "$dir"
    fi
    case "$FORGEALLOC_STATS" in json) ext=json ;; prometheus) ext=prom ;; *) ext=txt ;; esac
    FORGEALLOC_STATS_FILE="$dir/%p.$ext"
    FORGEALLOC_STATS_MAIN_PID=$$ # exec keeps the pid: the command reports on stderr
    export FORGEALLOC_STATS_FILE FORGEALLOC_STATS_MAIN_PID
fi

exec "$launcher" run -- "$@"
