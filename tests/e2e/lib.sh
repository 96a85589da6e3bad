# lib.sh: helpers for end-to-end tests of the real programs on real files.
# Each test script sources this, runs checks, and ends with `finish`.
set -u
# Tests send SIGHUP, SIGINT and SIGTERM to the programs they start, and a
# program started with one of them ignored keeps it ignored (programs/cli.h
# cli_catch_signal), as a test started in the background of a script or
# under nohup would be: such a test starts again with the three at their
# defaults (SigIgn bits 1, 2 and 15).
if [ -z "${TP_TEST_SIGNALS_DEFAULT:-}" ] &&
    [ $((0x$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status) & 0x4003)) -ne 0 ]; then
    TP_TEST_SIGNALS_DEFAULT=1 exec env --default-signal=HUP,INT,TERM sh "$0" "$@"
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN="$ROOT/${BUILD:-build}/bin"
# The Python of the cross-checks: Debian's, with torch, h5py and numpy;
# TP_PYTHON names another (a GPU machine's, scripts/gpu-check.sh).
PY=${TP_PYFORK_PYTHON:-${TP_PYTHON:-/usr/bin/python3}}
PY_INTERPRETER=$PY # the interpreter itself, for what needs a program on PATH
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tp-e2e-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Stopped by a signal (a time limit: scripts/gpu-check.sh's timeout, the
# runner's), a test exits through its EXIT trap too: dying of the signal,
# sh skipped it and left WORK in TMPDIR (test_gpu_pack's gpu-check run of
# test_export left one in /tmp at every make test). A test that sets its
# own EXIT trap keeps this one.
trap 'exit 130' INT TERM
# Each python3 command of the script (and of the scripts it runs, through
# TP_PYTHON) is forked from one server that imported PyTorch, numpy and h5py
# once (tests/support/py_server.py, tests/tools/pyfork.c): a check costs a
# fork, not PyTorch's import. Under scripts/run-tests.py every test shares
# the run's server (TP_PYFORK_DIR already set); a script run by itself
# starts its own, which goes when WORK does. TP_PYFORK=0: a fresh
# interpreter for every command.
if [ "${TP_PYFORK:-1}" != 0 ] && [ -x "$ROOT/${BUILD:-build}/tests/tools/pyfork" ]; then
    if [ -z "${TP_PYFORK_DIR:-}" ]; then
        mkdir -p "$WORK/.py"
        export TP_PYFORK_DIR="$WORK/.py" TP_PYFORK_OWNER=$$
    fi
    export TP_PYFORK_PYTHON="$PY" TP_PYFORK_SERVER="$ROOT/tests/support/py_server.py"
    PY="$ROOT/${BUILD:-build}/tests/tools/pyfork"
    export TP_PYTHON="$PY"
fi
PASSED=0
FAILED=0
NAME=$(basename "$0" .sh)

pass() { PASSED=$((PASSED + 1)); }
failed() {
    FAILED=$((FAILED + 1))
    echo "FAIL [$NAME] $1" >&2
    [ -s "$WORK/.out" ] && sed 's/^/    out: /' "$WORK/.out" | head -20 >&2
    # The first lines and the last (where a traceback names its exception),
    # and between them, up to 80, Criterion's failure reports (its "[----]"
    # assertion lines and "[FAIL]" lines), which a parallel run scatters.
    [ -s "$WORK/.err" ] && awk -v n="$(wc -l <"$WORK/.err")" '
        NR <= 6 || NR > n - 16 { print "    err: " $0; next }
        /^\[----\]|\[FAIL\]/ && kept++ < 80 { print "    err: " $0; next }
        !cut++ { print "    err: ..." }' "$WORK/.err" >&2
    return 0
}

# run CMD...: runs with stdout/stderr captured in $WORK/.out and $WORK/.err; sets RC.
run() {
    "$@" >"$WORK/.out" 2>"$WORK/.err"
    RC=$?
}

# expect_ok "what" CMD...: must exit 0.
expect_ok() {
    what=$1
    shift
    run "$@"
    if [ "$RC" -eq 0 ]; then pass; else failed "$what (exit $RC)"; fi
}

# expect_error "what" CODE PATTERN CMD...: must exit with CODE (never a crash),
# and stderr must be one line matching the extended regex PATTERN.
expect_error() {
    what=$1 code=$2 pattern=$3
    shift 3
    run "$@"
    error_verdict "$WORK/.err" ""
}

# error_verdict ERR BESIDES: expect_error's verdict on RC and the stderr
# lines in ERR (what, code and pattern as its caller set them).
error_verdict() {
    lines=$(wc -l <"$1")
    if [ "$RC" -ne "$code" ]; then failed "$what: exit $RC, expected $code"
    elif [ "$lines" -ne 1 ]; then failed "$what: $lines lines on stderr$2, expected one"
    elif ! grep -Eq -- "$pattern" "$1"; then failed "$what: stderr does not match /$pattern/"
    else pass; fi
}

# expect_error_retried "what" CODE PATTERN CMD...: expect_error where the
# command's requests may be retried, each retry said on a warning line of
# its own ("warning: GET URL: HTTP 500; retry 1 of 6 in 0.1 s"): those lines
# are set aside, the rest must be the one error line. For a command racing
# another's writes in s3rver, which rewrites an object in place (a GET in
# the middle is answered 500), where S3 replaces it whole.
expect_error_retried() {
    what=$1 code=$2 pattern=$3
    shift 3
    run "$@"
    grep -Ev '^[a-z-]+: warning: [A-Z]+ [^ ]+: .*; retry [0-9]+ of [0-9]+ in ' "$WORK/.err" >"$WORK/.err-unretried"
    error_verdict "$WORK/.err-unretried" " besides retries"
}

# check "what" CONDITION...: a shell test.
check() {
    what=$1
    shift
    if "$@"; then pass; else failed "$what"; fi
}

# check_all "what" 'CONDITION': a condition of several commands joined by &&
# or ||, evaluated whole (`check "what" A && B` would count only A).
check_all() {
    what=$1
    if eval "$2"; then pass; else failed "$what"; fi
}

# losses_match A.jsonl B.jsonl TOL: two tp-train logs (--log) have the same
# step lines, their losses equal to TOL relative (0: bit-exact, as printed
# with 9 significant digits).
losses_match() {
    "$PY" - "$@" <<'PYEOF'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "event" not in r] for p in sys.argv[1:3])
tol = float(sys.argv[3])
steps_a, steps_b = [r["step"] for r in a], [r["step"] for r in b]
if steps_a != steps_b:
    sys.exit("steps differ: %s vs %s" % (steps_a, steps_b))
worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
if worst > tol:
    sys.exit("losses differ by %.3e relative (tolerance %g)" % (worst, tol))
PYEOF
}

# use_open_mpi: for tests that run programs under mpirun. As root, with more
# ranks than cores; containers often forbid the cross-process memory copies
# Open MPI uses for large messages between ranks on one machine, and plain
# shared memory always works. Under AddressSanitizer, Open MPI's allocations
# are suppressed by tests/lsan.supp (its components kept loaded to name them:
# tests/sanitizer/keep_libraries.c).
use_open_mpi() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    # The messaging layer Open MPI selects on one machine anyway (ob1):
    # named, the others are not opened and probed, 0.2 s of every launch.
    export OMPI_MCA_pml=ob1
    # Shared-memory segments in the test's own directory: a rank killed by a
    # test leaves its segment, which goes with WORK instead of piling up in
    # /dev/shm.
    export OMPI_MCA_btl_vader_backing_directory="$WORK"
    # No PCI discovery in hwloc, which Open MPI asks for the machine's
    # topology in mpirun and in every rank: it reads each PCI device's
    # configuration space through sysfs, which a virtual machine traps (one
    # 2-core VM: 12% of a 4-rank tiny tp-train launch's processor time, 0.59 s
    # a launch against 0.67). On one machine nothing here needs a device's
    # place: shared memory carries every message.
    export HWLOC_COMPONENTS=-pci,-linuxio
}

# wait_for PATH SECONDS: until PATH exists (a pattern: until one path
# matches it); false when it did not in time.
wait_for() {
    n=0
    while ! ls -d $1 >/dev/null 2>&1 && [ $n -lt $(($2 * 10)) ]; do sleep 0.1; n=$((n + 1)); done
    ls -d $1 >/dev/null 2>&1
}

# File offset of a tensor's data in a shard, found with h5py.
data_offset() {
    "$PY" -c 'import h5py, sys; print(h5py.File(sys.argv[1], "r")["tensors/" + sys.argv[2]].id.get_offset())' "$1" "$2"
}

# flip_byte FILE OFFSET: inverts one bit of the byte at OFFSET.
flip_byte() {
    "$PY" - "$1" "$2" <<'PYEOF'
import sys
path, offset = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(offset)
    b = f.read(1)[0]
    f.seek(offset)
    f.write(bytes([b ^ 0x10]))
PYEOF
}

tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum) | md5sum; }

# tokens FILE COUNT: a token file (docs/DATA.md) of COUNT tokens below 90,
# the same for every test (numpy: after skip_without_python).
tokens() {
    "$PY" - "$1" "$2" <<'PYEOF'
import sys, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
header = np.zeros(256, dtype=np.int32)
header[:3] = (20240520, 1, n)
with open(path, "wb") as f:
    f.write(header.tobytes())
    f.write(((np.arange(n) * 7 + np.random.default_rng(5).integers(0, 3, n)) % 90).astype(np.uint16).tobytes())
PYEOF
}

# same_loss A.json B.json TOL: the two files' {"loss"} agree to TOL
# relative (both printed, ours first where one is ours).
same_loss() {
    "$PY" -c 'import json, sys
a, b = (json.load(open(p))["loss"] for p in sys.argv[1:3])
print("    %.9f and %.9f" % (a, b))
sys.exit(not abs(a - b) <= float(sys.argv[3]) * abs(b))' "$1" "$2" "$3"
}

# llama_cpp COMMAND MODEL.gguf ARGS...: llama.cpp's own library judges a
# GGUF file (tests/trainer/llama_cpp.mjs: loss, generate, tokenize), its
# output in $WORK/.out, its status in RC: 77 when node-llama-cpp (or Node.js)
# is not installed.
llama_cpp() {
    if command -v node >/dev/null 2>&1; then run node "$ROOT/tests/trainer/llama_cpp.mjs" "$@"
    else
        echo "llama_cpp: Node.js is not installed" >"$WORK/.err"
        RC=77
    fi
}

# judged_by_llama_cpp WHAT: after llama_cpp, true when llama.cpp ran; when it
# is not installed, says WHAT is skipped (never passed) and is false.
judged_by_llama_cpp() {
    [ "$RC" -ne 77 ] && return 0
    echo "[SKIP] [$NAME] llama.cpp's judge: $1: $(cat "$WORK/.err")"
    return 1
}

# json_keys_once FILE: FILE is JSON whose every object holds each key once
# (Python's json keeps the last of two; cJSON and others the first).
json_keys_once() {
    "$PY" -c 'import json, sys
def once(pairs):
    keys = [k for k, _ in pairs]
    twice = sorted(set(k for k in keys if keys.count(k) > 1))
    if twice:
        sys.exit("%s: keys given twice: %s" % (sys.argv[1], twice))
    return dict(pairs)
json.load(open(sys.argv[1]), object_pairs_hook=once)' "$1"
}

# skip_without_python MODULES WHY: unless Debian's python imports MODULES
# ("torch, numpy"), the test says it is skipped (WHY) and ends there, exit
# 0: skipped, never passed, and never run on without them.
skip_without_python() {
    "$PY" -c "import $1" 2>/dev/null && return 0
    echo "[SKIP] [$NAME] $2"
    finish
    exit 0
}

# finish: the summary line; the exit status says whether every check passed.
# With TEST_KEEP_WORK=DIR, a failed test's WORK is copied into DIR first,
# for the logs of what failed (hunting a failure that comes and goes).
# FINISH_HOOKS: commands finish runs first, in order: checks that a
# helper library gathers during the script and judges at once at the end
# (train_lib.sh's PyTorch checks).
FINISH_HOOKS=""

finish() {
    for hook in $FINISH_HOOKS; do "$hook"; done
    FINISH_HOOKS=""
    echo "[$NAME] $PASSED passed, $FAILED failed"
    if [ "$FAILED" -ne 0 ] && [ -n "${TEST_KEEP_WORK:-}" ]; then
        mkdir -p "$TEST_KEEP_WORK" && cp -a "$WORK" "$TEST_KEEP_WORK/" 2>/dev/null &&
            echo "[$NAME] its WORK kept in $TEST_KEEP_WORK/$(basename "$WORK")"
    fi
    [ "$FAILED" -eq 0 ]
}
