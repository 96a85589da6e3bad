#!/bin/sh
# Installs the Debian packages tp-toolkit needs, when any is missing.
# Quiet when everything is present; idempotent.
set -eu

PACKAGES="gcc make pkg-config libhdf5-dev hdf5-tools libzstd-dev libcjson-dev libxxhash-dev
libcriterion-dev libopenmpi-dev openmpi-bin libopenblas-dev procps
python3 python3-numpy python3-h5py python3-xxhash python3-zstandard python3-torch gnuplot-nox"

missing=""
for p in $PACKAGES; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
        *"ok installed"*) ;;
        *) missing="$missing $p" ;;
    esac
done
[ -z "$missing" ] && exit 0

echo "deps: installing$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "deps: missing packages:$missing; run as root or install them" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done"
