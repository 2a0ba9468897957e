#!/bin/sh
# entrypoint.sh - container ENTRYPOINT: run the command under forgealloc.
#
#   ENTRYPOINT ["/usr/share/forgealloc/entrypoint.sh"]
#   CMD ["python3", "launch.py", "--listen"]
#
# Composes LD_PRELOAD exactly like `forgealloc run` (it execs it), with
# container defaults unless set: a text dump, the command's own on stderr
# (docker logs) and every other process's in FORGEALLOC_STATS_DIR
# (default /var/log/forgealloc, mount a volume there to keep them), one file
# per process, named by `forgealloc run`.  `docker stop` sends SIGTERM; the
# dump is still written.  tini -g sends it to the command's process group:
# a start script that runs Python as a child (not with exec) dies of it and
# the container ends with it; Python gets it too, and its dump is written if
# it finishes first.
#
# The kernel never kills a container's PID 1 with a signal that process
# leaves at its default action, so the command must not be PID 1: the image
# starts this script under tini; started as PID 1 anyway (an ENTRYPOINT
# without tini or docker run --init), it puts tini in front when installed,
# and where it is not, `forgealloc run` says so in one line.
set -euf

# The shell exports PWD, which Docker does not pass, or rewrites it: the
# command gets the caller's environment (the launcher passes it on as it
# comes), with PWD as the caller passed it, or none.
if [ -r "/proc/$$/environ" ]; then
    if caller_pwd=$(tr '\0' '\n' <"/proc/$$/environ" | grep -m 1 '^PWD='); then
        export PWD="${caller_pwd#PWD=}"
    else
        unset PWD
    fi
fi

if [ "$$" = 1 ] && command -v tini >/dev/null 2>&1; then
    exec tini -s -g -- /bin/sh "$0" "$@"
fi

if [ "$#" -eq 0 ]; then
    echo "forgealloc entrypoint: no command given; set CMD in the image or pass one to docker run" >&2
    exit 125 # its own error, as forgealloc run's: never taken for the command's status
fi

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
launcher=""
# Installed (share/forgealloc beside bin/), else the program built from
# this source tree, as scripts/forgealloc finds it (that script itself is
# a shell, which would export PWD again).
for c in "$here/forgealloc" "$here/../../bin/forgealloc" ${FORGEALLOC_LIB:+"${FORGEALLOC_LIB%/*}/forgealloc"} \
    "$here/../build/forgealloc"; do
    if [ -x "$c" ]; then
        launcher=$c
        break
    fi
done
[ -n "$launcher" ] || launcher=$(command -v forgealloc 2>/dev/null || true)
if [ -z "$launcher" ]; then
    echo "forgealloc entrypoint: the forgealloc command is not installed next to $here or on PATH" >&2
    exit 125
fi

: "${FORGEALLOC_STATS:=text}"
export FORGEALLOC_STATS
# The image's directory, where this user may write there; else the
# launcher's own default ($TMPDIR/forgealloc-$UID), without a warning:
# nobody asked for this one.
if [ -z "${FORGEALLOC_STATS_DIR:-}" ] && [ -d /var/log/forgealloc ] && [ -w /var/log/forgealloc ]; then
    export FORGEALLOC_STATS_DIR=/var/log/forgealloc
fi

# ---- FORGEALLOC_PRELOAD=system (opt-in) ----
# Also list the library in /etc/ld.so.preload (root, inside a container
# only), so a start script that overwrites LD_PRELOAD still loads it.
case "${FORGEALLOC_PRELOAD:-env}" in
env) ;;
system) "$launcher" system-preload || true ;; # on refusal it says why, in one line
*) echo "forgealloc entrypoint: FORGEALLOC_PRELOAD=$FORGEALLOC_PRELOAD is not env or system; using env (LD_PRELOAD only)" >&2 ;;
esac

# ---- docker stop and a start script ----
# Under tini -g, `run --wait-group=auto` keeps the launcher between tini and
# the command, so that a start script that runs Python as a child (webui.sh)
# and dies of `docker stop`'s SIGTERM at once does not end the container
# while Python still handles the signal; elsewhere it execs the command (see
# forgealloc run --help: the launcher decides which).
exec "$launcher" run --wait-group=auto -- "$@"
