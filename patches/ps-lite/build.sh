#!/usr/bin/env bash
# Build ps-lite (BytePS's fork, from the byteps==0.2.5.post15 sdist on PyPI) with the project's
# patches/ps-lite/*.patch applied, against Debian's libzmq3-dev; cache its test programs.
#
#   patches/ps-lite/build.sh [PYTHON]     # PYTHON runs `pip download` (default: python3 on PATH)
#
# Prints the folder holding the built programs (tests/test_benchmark, ...) as its last line of
# stdout: $DPRO_CACHE/ps-lite/<hash of the patches, this script and the version>/ (DPRO_CACHE
# defaults to ~/.cache/dpro-kit).  A second run finds the folder and prints it at once.
#
# Environment:
#   DPRO_PSLITE_BUILD=0   never build: print the cached folder if there is one, else say so on
#                         stderr and exit 3 (the ps-lite tests then skip with that reason)
#
# Needs g++, make and libzmq3-dev; as root on Debian/Ubuntu they are installed with apt-get when
# missing.  The sdist is downloaded into a temporary folder (checksum pinned) and removed
# afterwards; nothing of ps-lite's source is kept, only the built programs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${1:-python3}"
VERSION=0.2.5.post15
SDIST_SHA256=9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f
PROGRAMS="test_benchmark"

log() { echo "[ps-lite build] $*" >&2; }

KEY="byteps-$VERSION-$(cat "$HERE"/*.patch "$HERE"/build.sh | sha256sum | cut -c1-12)"
OUT="${DPRO_CACHE:-$HOME/.cache/dpro-kit}/ps-lite/$KEY"

if [ -x "$OUT/tests/test_benchmark" ] && ldd "$OUT/tests/test_benchmark" | grep -q 'libzmq.so.*=> /'; then
    echo "$OUT"
    exit 0
fi
if [ "${DPRO_PSLITE_BUILD:-1}" = 0 ]; then
    log "no cached build in $OUT and DPRO_PSLITE_BUILD=0: not building (ps-lite tests will skip)"
    exit 3
fi

if ! command -v g++ >/dev/null || ! command -v make >/dev/null || [ ! -e /usr/include/zmq.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing g++, make and libzmq3-dev with apt-get"
        { apt-get install -y -qq g++ make libzmq3-dev || { apt-get update -qq && apt-get install -y -qq g++ make libzmq3-dev; }; } >/dev/null
    else
        log "g++, make and libzmq3-dev are needed to build ps-lite; install them (apt-get install g++ make libzmq3-dev)"
        exit 1
    fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/dpro-pslite-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$(date +%s)
log "downloading the byteps==$VERSION sdist (its 3rdparty/ps-lite)"
"$PY" -m pip download --quiet "byteps==$VERSION" --no-binary :all: --no-deps -d "$WORK" >&2
SDIST="$WORK/byteps-$VERSION.tar.gz"
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || { log "sdist checksum mismatch: $SDIST"; exit 1; }
tar -xzf "$SDIST" -C "$WORK" "byteps-$VERSION/3rdparty/ps-lite"
SRC="$WORK/byteps-$VERSION/3rdparty/ps-lite"
for p in "$HERE"/*.patch; do
    log "applying $(basename "$p")"
    patch -p1 --quiet --directory "$SRC" < "$p"
done

log "building $PROGRAMS against the system's libzmq (nice -n 19, 2 jobs)"
# DEPS_PATH=/usr: ps-lite's make/deps.mk then finds /usr/include/zmq.h and downloads nothing
nice -n 19 make -C "$SRC" -j2 DEPS_PATH=/usr $(for p in $PROGRAMS; do echo "tests/$p"; done) > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; log "build failed (log above)"; exit 1; }
mkdir -p "$(dirname "$OUT")"
TMP_DIR="$(mktemp -d "$(dirname "$OUT")/.tmp.XXXXXX")"
mkdir -p "$TMP_DIR/tests"
for p in $PROGRAMS; do cp "$SRC/tests/$p" "$TMP_DIR/tests/"; done
mv -T "$TMP_DIR" "$OUT" 2>/dev/null || rm -rf "$TMP_DIR"   # atomic; a concurrent build won
log "built in $(( $(date +%s) - START )) s -> $OUT"
echo "$OUT"
