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

# instant I N SPAN: when trial I (0..N-1) of N strikes, in seconds: a random
# point of the I-th of N equal slices of 0..SPAN, so that the trials of one
# run spread over the whole span, each at an instant of its own.
instant() {
    awk -v i="$1" -v n="$2" -v span="$3" -v seed="$$$1$(date +%N)" \
        'BEGIN { srand(seed); printf "%.3f\n", (i + rand()) / n * span }'
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
