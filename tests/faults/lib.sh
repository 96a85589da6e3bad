# lib.sh: what the fault-injection tests share (sourced after
# tests/e2e/lib.sh): the programs, a model, the trials per class, and the
# checks of what a fault leaves.
# FAULT_TRIALS (default 20; 5 under the sanitizers) sets the trials per class.

CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
TRAIN="$BIN/tp-train"
# Fewer under the sanitizers, where every run is several times slower.
TRIALS=${FAULT_TRIALS:-20}
[ "${SANITIZED:-0}" = 1 ] && TRIALS=${FAULT_TRIALS:-5}
MODEL="--layers 4 --dim 256 --heads 8 --vocab 4000 --seq 64"
# tp-train initializes Open MPI even alone (lib.sh use_open_mpi: settings,
# and full unwinding under the sanitizers, which only its runs need).
trainer() {
    (use_open_mpi; exec "$TRAIN" "$@")
}
# with_fault POINT CMD...: CMD (a program or a function) with TP_CKPT_FAULT=POINT.
with_fault() {
    (TP_CKPT_FAULT=$1 && export TP_CKPT_FAULT && shift && "$@")
}

# FAULT_SEED seeds the instants at which faults strike: drawn afresh by each
# run and printed, so that a failure can be replayed (the same seed, trials
# and spans strike at the same instants). A seed is 1..2147483646: mawk's
# srand clamps anything larger to 2^31 - 1, so a seed made of the pid, the
# trial and the nanoseconds (19 digits or more) drew the same instants in
# every run.
FAULT_SEED=${FAULT_SEED:-$(($(od -An -N4 -tu4 /dev/urandom) % 2147483646 + 1))}
case $FAULT_SEED in
'' | 0* | *[!0-9]* | ???????????*) seed_ok=0 ;; # 0N would be octal
*) seed_ok=$((FAULT_SEED >= 1 && FAULT_SEED <= 2147483646)) ;;
esac
if [ "$seed_ok" != 1 ]; then
    echo "FAIL [$NAME] FAULT_SEED=$FAULT_SEED: expected an integer from 1 to 2147483646" >&2
    exit 2
fi
echo "[$NAME] instants drawn from FAULT_SEED=$FAULT_SEED (replay: FAULT_SEED=$FAULT_SEED FAULT_TRIALS=$TRIALS)"
FAULT_AWK=${FAULT_AWK:-awk}

# instant I N SPAN [STREAM]: when trial I (0..N-1) of N strikes, in seconds:
# a random point of the I-th of N equal slices of 0..SPAN, so that the trials
# of one run spread over the whole span, each at an instant of its own. The
# draw depends only on FAULT_SEED, STREAM (a name, so that classes of trials
# run beside each other strike at instants of their own) and I.
instant() {
    stream=$(printf '%s' "${4:-}" | cksum | cut -d' ' -f1)
    "$FAULT_AWK" -v i="$1" -v n="$2" -v span="$3" -v seed=$(((FAULT_SEED + stream) % 2147483646 + 1)) \
        'BEGIN { srand(seed); for (k = 0; k <= i; k++) r = rand(); printf "%.3f\n", (i + r) / n * span }'
}

# timed CMD...: runs CMD; DURATION is its wall time in seconds.
timed() {
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    status=$?
    DURATION=$(echo "$(date +%s.%N) - $start" | bc)
    return $status
}

# no_staging DIR: no staging entry (".NAME.OWNER.staging") is left in DIR.
no_staging() {
    left=$(ls -A "$1" | grep '\.staging')
    [ -z "$left" ] || echo "    left in $1: $left" >&2
    [ -z "$left" ]
}

# same A B: the two checkpoints hold the same tensors, bit for bit.
same() {
    "$CK" diff "$1" "$2" >/dev/null 2>&1
}

# intact CKPT: it verifies.
intact() {
    "$CK" verify "$1" >/dev/null 2>&1
}

# safetensors_whole DIR: every .safetensors file holds its whole header and data.
safetensors_whole() {
    "$PY" - "$1" <<'PYEOF'
import json, os, struct, sys
d = sys.argv[1]
files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
if not files:
    sys.exit("no safetensors file in " + d)
for f in files:
    p = os.path.join(d, f)
    with open(p, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    if os.path.getsize(p) != 8 + n + end:
        sys.exit("%s: %d bytes, expected %d" % (p, os.path.getsize(p), 8 + n + end))
PYEOF
}
