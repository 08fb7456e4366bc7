#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyPI sdist) with gloo, CPU only, against the installed torch, with the
# project's patches/horovod/*.patch applied; cache the wheel; install it into the given Python.
#
#   patches/horovod/build.sh [PYTHON]          # default: python3 on PATH
#
# The wheel is cached in $DPRO_CACHE/wheels/horovod-0.28.1-torch<ver>-py<ver>-<patch hash>/
# (DPRO_CACHE defaults to ~/.cache/dpro-kit), keyed by the torch and Python versions and by the
# hash of the patches and of this script, so a second run (or a fresh venv) installs it in seconds.
#
# Environment:
#   DPRO_HOROVOD_BUILD=0   never build: install the cached wheel if there is one, else say so and
#                          exit 0 (the Horovod tests then skip with that reason)
#   DPRO_HOROVOD_JOBS=N    parallel compile jobs (default 2); the compiler runs under `nice -n 19`
#
# Needs cmake (>= 3.13) and a C++17 compiler (g++ >= 9); as root on Debian/Ubuntu they are
# installed with apt-get when missing.  Horovod's source is downloaded into a temporary folder
# and removed afterwards; nothing of it is kept but the wheel.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${1:-python3}"
# a relative path (make passes .venv/bin/python) must survive the cd into the source below;
# not realpath: a venv's python is a symlink whose own path selects the venv
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
VERSION=0.28.1
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
CACHE="${DPRO_CACHE:-$HOME/.cache/dpro-kit}/wheels"

log() { echo "[horovod build] $*" >&2; }

TORCH_VER="$("$PY" -c 'import torch; print(torch.__version__)')"
PY_VER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
PATCH_HASH="$(cat "$HERE"/*.patch "$HERE"/build.sh | sha256sum | cut -c1-12)"
KEY="horovod-$VERSION-torch$TORCH_VER-py$PY_VER-$PATCH_HASH"
WHEEL_DIR="$CACHE/$KEY"
STAMP="$("$PY" -c 'import sys; print(sys.prefix)')/.dpro-horovod"   # which build this Python has

if [ "$(cat "$STAMP" 2>/dev/null)" = "$KEY" ] && "$PY" -c "import horovod.torch" 2>/dev/null; then
    log "$KEY already installed in $PY"
    exit 0
fi

install_wheel() {
    local whl
    whl="$(ls "$WHEEL_DIR"/horovod-*.whl)"
    log "installing $whl"
    # deps (cloudpickle, psutil, pyyaml, packaging, cffi) from the index; torch is already there
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$whl"
    "$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging "cffi>=1.4.0"
    "$PY" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'gloo not built'"
    echo "$KEY" > "$STAMP"
}

if ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    install_wheel
    exit 0
fi

if [ "${DPRO_HOROVOD_BUILD:-1}" = 0 ]; then
    log "no cached wheel $WHEEL_DIR and DPRO_HOROVOD_BUILD=0: not building (Horovod tests will skip)"
    exit 0
fi

if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing cmake and g++ with apt-get"
        apt-get update -qq && apt-get install -y -qq cmake g++ make >/dev/null
    else
        log "cmake and g++ are needed to build Horovod; install them (e.g. apt-get install cmake g++)"
        exit 1
    fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/dpro-horovod-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$(date +%s)
log "downloading the horovod==$VERSION sdist"
"$PY" -m pip download --quiet "horovod==$VERSION" --no-binary :all: --no-deps -d "$WORK"
SDIST="$WORK/horovod-$VERSION.tar.gz"
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || { log "sdist checksum mismatch: $SDIST"; exit 1; }
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/horovod-$VERSION"
for p in "$HERE"/*.patch; do
    log "applying $(basename "$p")"
    patch -p1 --quiet --directory "$SRC" < "$p"
done

log "building with ${DPRO_HOROVOD_JOBS:-2} jobs under nice -n 19 (a few minutes)"
(
    cd "$SRC"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
           HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
           MAKEFLAGS="-j${DPRO_HOROVOD_JOBS:-2}"
    nice -n 19 "$PY" -m pip wheel . --no-deps --no-build-isolation -w "$WORK/wheel" > "$WORK/build.log" 2>&1 \
        || { tail -40 "$WORK/build.log" >&2; log "build failed (log above)"; exit 1; }
)
mkdir -p "$CACHE"
TMP_DIR="$(mktemp -d "$CACHE/.tmp.XXXXXX")"
cp "$WORK"/wheel/horovod-*.whl "$TMP_DIR"/
mv -T "$TMP_DIR" "$WHEEL_DIR" 2>/dev/null || rm -rf "$TMP_DIR"   # atomic; a concurrent build won
log "built in $(( $(date +%s) - START )) s -> $WHEEL_DIR"
install_wheel
