#!/bin/sh
# Installs the Debian packages tp-toolkit needs, when any is missing.
# Quiet when everything is present; idempotent.
set -eu

PACKAGES="gcc make pkg-config libhdf5-dev hdf5-tools libzstd-dev libcjson-dev libxxhash-dev libssl-dev
libcriterion-dev libopenmpi-dev openmpi-bin libopenblas-dev procps
python3 python3-numpy python3-h5py python3-xxhash python3-zstandard python3-torch gnuplot-nox"

# Slurm (slurmctld, slurmd, clients) for the tests that start a cluster on
# this machine (tests/support/slurm.sh); optional: without it those tests
# say SKIP, so a failed install only warns.
SLURM_PACKAGES="slurm-wlm slurmctld slurmd slurm-client"

missing_of() {
    for p in "$@"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        case "$status" in
            *"ok installed"*) ;;
            *) printf ' %s' "$p" ;;
        esac
    done
}
# shellcheck disable=SC2086
missing=$(missing_of $PACKAGES)
# shellcheck disable=SC2086
slurm_missing=$(missing_of $SLURM_PACKAGES)
[ -z "$missing" ] && [ -z "$slurm_missing" ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        if [ -n "$missing" ]; then
            echo "deps: missing packages:$missing$slurm_missing; run as root or install them" >&2
            exit 1
        fi
        echo "deps: warning: Slurm is not installed (needs root:$slurm_missing); its tests will be skipped" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if [ -n "$missing" ]; then
    echo "deps: installing$missing"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    echo "deps: done"
fi
[ -z "$slurm_missing" ] && exit 0

# Pids of the daemons Slurm's packages would start (slurmctld, slurmd,
# slurmdbd, munged).
slurm_daemons() {
    for f in /proc/[0-9]*/comm; do
        case "$(cat "$f" 2>/dev/null)" in
            slurmctld | slurmd | slurmdbd | munged) p=${f#/proc/}; echo "${p%/comm}" ;;
        esac
    done
}

# The packages' scripts may start no service: a policy-rc.d that denies
# (exit 101) while apt runs, the previous one (if any) put back after.
POLICY=/usr/sbin/policy-rc.d
restore_policy() {
    if [ -e "$POLICY.tp-deps" ]; then $SUDO mv -f "$POLICY.tp-deps" "$POLICY"; else $SUDO rm -f "$POLICY"; fi
}
echo "deps: installing$slurm_missing"
before=" $(slurm_daemons | tr '\n' ' ') "
if [ -e "$POLICY" ]; then $SUDO cp -p "$POLICY" "$POLICY.tp-deps"; fi
trap restore_policy EXIT INT TERM
printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
$SUDO chmod 755 "$POLICY"
ok=1
[ -n "$missing" ] || $SUDO apt-get update -qq || ok=0
# shellcheck disable=SC2086
if [ $ok = 1 ]; then $SUDO apt-get install -y -qq --no-install-recommends $slurm_missing >/dev/null || ok=0; fi
restore_policy
trap - EXIT INT TERM
# Should the install have started a daemon all the same, stop it (only those
# that were not running before).
for p in $(slurm_daemons); do
    case "$before" in *" $p "*) continue ;; esac
    echo "deps: stopping $(cat "/proc/$p/comm" 2>/dev/null) (pid $p), started by the install"
    $SUDO kill "$p" 2>/dev/null || true
done
if [ $ok = 1 ]; then
    echo "deps: done"
else
    echo "deps: warning: could not install$slurm_missing; the Slurm tests will be skipped" >&2
fi
