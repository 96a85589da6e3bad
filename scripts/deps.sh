#!/bin/sh
# Installs the Debian packages tp-toolkit needs, when any is missing.
# Quiet when everything is present; idempotent.
set -eu
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)

# patchelf: make gpu-pack gives every library it bundles a run path of its
# own, inside the pack (scripts/gpu-pack.sh). strace: tests/faults/test_crash.sh
# reads the order of a commit's fsyncs and renames in the system calls.
PACKAGES="gcc make pkg-config libhdf5-dev hdf5-tools libzstd-dev libcjson-dev libxxhash-dev libssl-dev libcurl4-openssl-dev curl libisal-dev
libcriterion-dev libopenmpi-dev openmpi-bin libopenblas-dev libdnnl-dev procps
python3 python3-numpy python3-h5py python3-xxhash python3-zstandard python3-torch gnuplot-nox patchelf strace"

# Slurm (slurmctld, slurmd, clients) for the tests that start a cluster on
# this machine (tests/support/slurm.sh); optional: without it those tests
# say SKIP, so a failed install only warns.
SLURM_PACKAGES="slurm-wlm slurmctld slurmd slurm-client"

# The object-store servers for the tests of checkpoints over HTTP
# (tests/support/objstore.sh): nginx with WebDAV (PROPFIND from the dav-ext
# module), s3cmd (an independent S3 client), Node.js and npm for s3rver (an
# S3 server, installed with npm into .deps/npm). Optional like Slurm.
OBJSTORE_PACKAGES="nginx-light libnginx-mod-http-dav-ext s3cmd nodejs npm python3-botocore"
S3RVER_PREFIX="$REPO_ROOT/.deps/npm"

# missing_of PACKAGE...: prints those not installed (one dpkg-query for all).
missing_of() {
    installed=" $(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "$@" 2>/dev/null |
        awk '$2 ~ /^.i/ { printf "%s ", $1 }')"
    for p in "$@"; do
        case "$installed" in
            *" $p "*) ;;
            *) printf ' %s' "$p" ;;
        esac
    done
}

# The object-store packages not installed whose program is not there either:
# another nginx flavour also has /usr/sbin/nginx, and Node.js from elsewhere
# (NodeSource's, which conflicts with Debian's npm) brings its own npm.
objstore_missing() {
    # shellcheck disable=SC2086
    for p in $(missing_of $OBJSTORE_PACKAGES); do
        case "$p" in
            nginx-light) [ -x /usr/sbin/nginx ] && continue ;;
            libnginx-mod-http-dav-ext) [ -e /usr/lib/nginx/modules/ngx_http_dav_ext_module.so ] && continue ;;
            nodejs) command -v node >/dev/null 2>&1 && continue ;;
            *) command -v "$p" >/dev/null 2>&1 && continue ;;
        esac
        printf ' %s' "$p"
    done
}

s3rver_present() {
    [ -x "$S3RVER_PREFIX/node_modules/.bin/s3rver" ] || command -v s3rver >/dev/null 2>&1
}

# llama.cpp's own library as the judge of GGUF exports
# (tests/trainer/llama_cpp.mjs): node-llama-cpp with its prebuilt CPU build,
# pinned, into .deps/llama-cpp. --ignore-scripts: its install script would
# fetch or compile llama.cpp; the prebuilt package for this machine is named
# instead of node-llama-cpp's optional ones (--omit=optional), which also
# hold CUDA and Vulkan builds of hundreds of MB. Optional like s3rver.
LLAMA_CPP_PREFIX="$REPO_ROOT/.deps/llama-cpp"
LLAMA_CPP_VERSION=3.22.1
llama_cpp_build() {
    case "$(uname -m)" in
        x86_64) echo linux-x64 ;;
        aarch64) echo linux-arm64 ;;
    esac
}
llama_cpp_present() {
    [ -f "$LLAMA_CPP_PREFIX/node_modules/node-llama-cpp/dist/index.js" ] &&
        [ -d "$LLAMA_CPP_PREFIX/node_modules/@node-llama-cpp/$(llama_cpp_build)" ]
}

# install_npm WHAT PREFIX NPM_OPTIONS PACKAGES: PACKAGES with npm into PREFIX
# (no root needed); optional: a failure only warns that WHAT's tests will be
# skipped.
install_npm() {
    what=$1 prefix=$2 options=$3
    shift 3
    if ! command -v npm >/dev/null 2>&1; then
        echo "deps: warning: npm is not installed; the $what tests will be skipped" >&2
        return 0
    fi
    echo "deps: installing $* (npm, into ${prefix#"$REPO_ROOT"/})"
    mkdir -p "$prefix"
    npm_log=$(mktemp)
    # shellcheck disable=SC2086
    if npm install --no-audit --no-fund --no-update-notifier --loglevel=error $options \
        --prefix "$prefix" "$@" >"$npm_log" 2>&1; then
        echo "deps: done"
    else
        tail -n 5 "$npm_log" | sed 's/^/deps:   npm: /' >&2
        echo "deps: warning: could not install $* with npm; the $what tests will be skipped" >&2
    fi
    rm -f "$npm_log"
}

install_npm_tools() {
    s3rver_present || install_npm S3 "$S3RVER_PREFIX" "" s3rver@3
    llama_cpp_present && return 0
    if [ -z "$(llama_cpp_build)" ]; then
        echo "deps: warning: no prebuilt llama.cpp for $(uname -m); the llama.cpp judge's checks will be skipped" >&2
        return 0
    fi
    install_npm "llama.cpp judge's" "$LLAMA_CPP_PREFIX" "--ignore-scripts --omit=optional" \
        "node-llama-cpp@$LLAMA_CPP_VERSION" "@node-llama-cpp/$(llama_cpp_build)@$LLAMA_CPP_VERSION"
}

# shellcheck disable=SC2086
missing=$(missing_of $PACKAGES)
# shellcheck disable=SC2086
slurm_missing=$(missing_of $SLURM_PACKAGES)
objstore_missing=$(objstore_missing)
if [ -z "$missing" ] && [ -z "$slurm_missing" ] && [ -z "$objstore_missing" ]; then
    install_npm_tools
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        if [ -n "$missing" ]; then
            echo "deps: missing packages:$missing$slurm_missing$objstore_missing; run as root or install them" >&2
            exit 1
        fi
        [ -z "$slurm_missing" ] ||
            echo "deps: warning: Slurm is not installed (needs root:$slurm_missing); its tests will be skipped" >&2
        [ -z "$objstore_missing" ] ||
            echo "deps: warning: object-store servers not installed (needs root:$objstore_missing); their tests will be skipped" >&2
        install_npm_tools
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
updated=0
if [ -n "$missing" ]; then
    echo "deps: installing$missing"
    $SUDO apt-get update -qq
    updated=1
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    echo "deps: done"
fi

# Pids of the processes named (/proc/PID/comm) one of NAMES (a list).
daemons_named() {
    for f in /proc/[0-9]*/comm; do
        case " $1 " in
            *" $(cat "$f" 2>/dev/null) "*) p=${f#/proc/}; echo "${p%/comm}" ;;
        esac
    done
}

# install_optional WHAT PACKAGES DAEMONS: installs PACKAGES (optional: a failure
# only warns that WHAT's tests will be skipped; apt may remove nothing for
# them) while no package script may start a service: a policy-rc.d that
# denies (exit 101) while apt runs, the previous one (if any) put back after.
# Should the install have started a daemon all the same (a process named one
# of DAEMONS that was not running before), it is stopped.
POLICY=/usr/sbin/policy-rc.d
restore_policy() {
    if [ -e "$POLICY.tp-deps" ]; then $SUDO mv -f "$POLICY.tp-deps" "$POLICY"; else $SUDO rm -f "$POLICY"; fi
}
install_optional() {
    echo "deps: installing$2"
    before=" $(daemons_named "$3" | tr '\n' ' ') "
    if [ -e "$POLICY" ]; then $SUDO cp -p "$POLICY" "$POLICY.tp-deps"; fi
    trap restore_policy EXIT INT TERM
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    ok=1
    if [ $updated = 0 ]; then
        if $SUDO apt-get update -qq; then updated=1; else ok=0; fi
    fi
    # shellcheck disable=SC2086
    if [ $ok = 1 ]; then $SUDO apt-get install -y -qq --no-install-recommends --no-remove $2 >/dev/null || ok=0; fi
    restore_policy
    trap - EXIT INT TERM
    for p in $(daemons_named "$3"); do
        case "$before" in *" $p "*) continue ;; esac
        echo "deps: stopping $(cat "/proc/$p/comm" 2>/dev/null) (pid $p), started by the install"
        $SUDO kill "$p" 2>/dev/null || true
    done
    if [ $ok = 1 ]; then
        echo "deps: done"
    else
        echo "deps: warning: could not install$2; the $1 tests will be skipped" >&2
    fi
}

if [ -n "$slurm_missing" ]; then install_optional Slurm "$slurm_missing" "slurmctld slurmd slurmdbd munged"; fi
if [ -n "$objstore_missing" ]; then install_optional object-store "$objstore_missing" "nginx"; fi
install_npm_tools
