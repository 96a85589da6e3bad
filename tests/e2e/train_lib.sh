# train_lib.sh: what the end-to-end tests of tp-train share (sourced after
# lib.sh, with TRAIN set to the trainer).

# mpi_train RANKS ARGS...: tp-train under mpirun.
mpi_train() {
    ranks=$1
    shift
    mpirun --oversubscribe -np "$ranks" "$TRAIN" "$@" </dev/null
}

# A log (--log) holds step lines {"step":N,"loss":X,...} and event lines
# {"event":"start"|"save"|"stop",...}; these helpers read its step lines.

# steps_from LOG FIRST [LAST]: the log's step lines of steps FIRST..LAST.
steps_from() {
    "$PY" -c 'import json,sys; [print(l, end="") for l in open(sys.argv[1]) if "event" not in json.loads(l) and int(sys.argv[2]) <= json.loads(l)["step"] <= int(sys.argv[3])]' \
        "$1" "$2" "${3:-999999999}"
}

# last_step LOG: the step of its last step line.
last_step() { "$PY" -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "event" not in r][-1]["step"])' "$1"; }

# wait_for_step LOG N SECONDS: until a tp-train log (--log) holds step N's
# line; false when it did not in time.
wait_for_step() {
    n=0
    while ! grep -q "^{\"step\":$2," "$1" 2>/dev/null && [ $n -lt $(($3 * 10)) ]; do sleep 0.1; n=$((n + 1)); done
    grep -q "^{\"step\":$2," "$1" 2>/dev/null
}

# events LOG KIND FIELD: FIELD of each KIND event line, one per line.
events() { "$PY" -c 'import json,sys; [print(json.dumps(r[sys.argv[3]]).strip(chr(34))) for r in map(json.loads, open(sys.argv[1])) if r.get("event") == sys.argv[2]]' "$1" "$2" "$3" | tr '\n' ' '; }


# torch_check LAYOUT RANKS ARGS...: tp-train --dump at a layout against the
# independent PyTorch model (tests/trainer/check_torch.py picks GPT-2 or
# Llama from the checkpoint's "arch"): logits, loss, every gradient, 10
# AdamW steps. The model is TORCH_MODEL (default tiny) with a vocabulary of
# 250, padded at tp4; grad-accum 2 exercises accumulation and the 1F1B
# schedule; the initial weights against the rule of docs/DATA.md. BF16=1:
# tp-train --dtype bf16 against the same bf16 products in PyTorch, both
# sides against fp64 sums too (check_torch.py --bf16). tp-train runs now;
# the judging waits for the end of the script (torch_judge, a finish hook),
# where one Python process judges every layout: PyTorch loads once.
TORCH_OPTS="--micro-batch 2 --grad-accum 2 --steps 10 --lr 1e-3 --warmup 2"
TORCH_JOBS="$WORK/torch-checks"
FINISH_HOOKS="$FINISH_HOOKS torch_judge"
torch_check() {
    layout=$1 ranks=$2
    shift 2
    dir="$WORK/torch-$layout"
    dtype="" bf16=""
    [ "${BF16:-0}" = 1 ] && dtype="--dtype bf16" bf16="--bf16"
    # shellcheck disable=SC2086
    expect_ok "tp-train ${TORCH_MODEL:-tiny} $layout $dtype with --dump" mpi_train "$ranks" --model "${TORCH_MODEL:-tiny}" \
        --vocab 250 "$@" $TORCH_OPTS $dtype --dump "$dir" --log "$dir.jsonl" --quiet
    echo "$layout $dir $dir.jsonl $TORCH_OPTS $bf16" >>"$TORCH_JOBS"
    checks=5
    [ -n "$bf16" ] && checks=7
    echo "$layout $checks ${TORCH_MODEL:-tiny} $dtype" >>"$TORCH_JOBS.expect"
}

# torch_check_fails_bf16 LABEL LAYOUT: the dump of an fp32 run (torch_check
# LAYOUT) judged as bf16 must fail, on its gradients: the bf16 tolerances
# tell a trainer that rounds from one that does not.
torch_check_fails_bf16() {
    dir="$WORK/torch-$2"
    echo "$1 $dir $dir.jsonl $TORCH_OPTS --bf16" >>"$TORCH_JOBS"
    echo "$1 fails ${TORCH_MODEL:-tiny} (fp32's dump as bf16)" >>"$TORCH_JOBS.expect"
}

# torch_judge: judges the checks torch_check gathered, one pass or failure
# each. A check passes with every line ok: 5 (7 with --bf16: both sides
# against fp64 too), one fewer where this Python lacks xxhash (the initial
# values' check is then said to be skipped).
torch_judge() {
    [ -s "$TORCH_JOBS" ] || return 0
    run "$PY" "$ROOT/tests/trainer/check_torch.py" --each "$TORCH_JOBS"
    judged="$WORK/torch-judged"
    cp "$WORK/.out" "$judged"
    sed 's/^/    /' "$judged"
    while read -r label checks model what; do
        grep -F "check_torch: [$label] " "$judged" >"$WORK/.lines"
        if [ "$checks" = fails ]; then
            if grep -q '\] gradients (worst: .* FAIL$' "$WORK/.lines"; then pass
            else failed "$label: $model $what passed the bf16 gradients check"; fi
            continue
        fi
        oks=$(grep -c ' ok$' "$WORK/.lines") fails=$(grep -c ' FAIL$' "$WORK/.lines")
        grep -q "initial values: skipped" "$WORK/.lines" && checks=$((checks - 1))
        if [ "$fails" -eq 0 ] && [ "$oks" -eq "$checks" ]; then pass
        else failed "tp-train $model $label $what against PyTorch ($oks of $checks checks ok)"; fi
    done <"$TORCH_JOBS.expect"
    rm -f "$TORCH_JOBS" "$TORCH_JOBS.expect"
}
