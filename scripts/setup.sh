#!/usr/bin/env bash
# setup.sh - install what building (and optionally testing, benchmarking)
# forgealloc needs, from Debian/Ubuntu packages.  Installs only what is
# missing; uses sudo when not root.
#
#   scripts/setup.sh            build: compiler, cmake, gperftools
#   scripts/setup.sh --test     + cmocka, python3, PyTorch (CPU), shellcheck, tini
#   scripts/setup.sh --bench    + jemalloc, mimalloc, PyTorch, gnuplot
#   scripts/setup.sh --demo     + python3, PyTorch (CPU)
#   scripts/setup.sh --docker   + Docker's daemon and debootstrap (the image test)
#   scripts/setup.sh --fuzz     + Clang and its libFuzzer (tests/fuzz/run.sh)
set -euo pipefail

pkgs=(build-essential cmake pkg-config libgoogle-perftools-dev file) # file: cpack -G DEB
for arg in "$@"; do
    case "$arg" in
    --test) pkgs+=(libcmocka-dev python3 python3-torch shellcheck binutils git tini) ;;
    --bench) pkgs+=(libjemalloc-dev libmimalloc-dev python3 python3-torch gnuplot-nox) ;;
    --demo) pkgs+=(python3 python3-torch) ;;
    --docker) pkgs+=(docker.io debootstrap) ;;
    --fuzz) pkgs+=(clang) ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done

# CPython's own test suite (a subset runs under the shim) is packaged per
# Python version: libpython3.11-testsuite on Debian 12.
if [[ " $* " == *" --test "* ]]; then
    version=$( (/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') 2>/dev/null || echo 3.11)
    pkgs+=("libpython$version-testsuite")
fi

installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]; }

install() {
    local missing=() p
    for p in "$@"; do
        installed "$p" || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    command -v apt-get >/dev/null || { echo "setup.sh: needs apt-get (Debian/Ubuntu); install by hand: ${missing[*]}" >&2; exit 1; }
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "setup.sh: run as root or install sudo; missing: ${missing[*]}" >&2; exit 1; }
        sudo=(sudo)
    fi
    echo "setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install "${pkgs[@]}"

# libFuzzer comes with Clang's runtime: its own package where the
# distribution splits it out (libclang-rt-14-dev on Debian 12), part of
# what clang depends on elsewhere (Ubuntu 22.04).
if [[ " $* " == *" --fuzz "* ]]; then
    rt=libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev
    if apt-cache show "$rt" >/dev/null 2>&1; then
        install "$rt"
    fi
fi
