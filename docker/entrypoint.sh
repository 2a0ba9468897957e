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
# per process, named by `forgealloc run`.  `docker stop` sends SIGTERM; the
# dump is still written.
set -eu

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
: "${FORGEALLOC_STATS_DIR:=/var/log/forgealloc}"
export FORGEALLOC_STATS FORGEALLOC_STATS_DIR

exec "$launcher" run -- "$@"
