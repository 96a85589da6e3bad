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

# events LOG KIND FIELD: FIELD of each KIND event line, one per line.
events() { "$PY" -c 'import json,sys; [print(json.dumps(r[sys.argv[3]]).strip(chr(34))) for r in map(json.loads, open(sys.argv[1])) if r.get("event") == sys.argv[2]]' "$1" "$2" "$3" | tr '\n' ' '; }


# torch_check LAYOUT RANKS ARGS...: tp-train --dump at a layout against the
# independent PyTorch model (tests/trainer/check_torch.py picks GPT-2 or
# Llama from the checkpoint's "arch"): logits, loss, every gradient, 10
# AdamW steps. The model is TORCH_MODEL (default tiny) with a vocabulary of
# 250, padded at tp4; grad-accum 2 exercises accumulation and the 1F1B
# schedule; the initial weights against the rule of docs/DATA.md. BF16=1: tp-train --dtype bf16 against PyTorch's bf16 autocast,
# to bf16's tolerances (check_torch.py --bf16).
torch_check() {
    layout=$1 ranks=$2
    shift 2
    dir="$WORK/torch-$layout"
    opts="--micro-batch 2 --grad-accum 2 --steps 10 --lr 1e-3 --warmup 2"
    dtype="" bf16=""
    [ "${BF16:-0}" = 1 ] && dtype="--dtype bf16" bf16="--bf16"
    # shellcheck disable=SC2086
    expect_ok "tp-train ${TORCH_MODEL:-tiny} $layout $dtype with --dump" mpi_train "$ranks" --model "${TORCH_MODEL:-tiny}" \
        --vocab 250 "$@" $opts $dtype --dump "$dir" --log "$dir.jsonl" --quiet
    # shellcheck disable=SC2086
    run "$PY" "$ROOT/tests/trainer/check_torch.py" "$dir" "$dir.jsonl" $opts $bf16
    sed 's/^/    /' "$WORK/.out"
    if [ "$RC" -eq 0 ] && [ "$(grep -c ' ok$' "$WORK/.out")" -eq 5 ]; then pass
    else failed "tp-train ${TORCH_MODEL:-tiny} $layout $dtype against PyTorch (exit $RC)"; fi
}
