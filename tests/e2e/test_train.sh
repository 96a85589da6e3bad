#!/bin/sh
# End-to-end tests of tp-train: the PyTorch cross-check at three layouts,
# bf16, layout invariance, the global batch kept across layouts, preemption
# by signals (SIGTERM, SIGUSR1, SIGHUP, a first SIGINT; a second SIGINT), refusal of and fallback from a corrupted checkpoint, token
# files, and errors on bad input (exact resume and resume at a new layout:
# test_train_resume.sh). Tiny models, so that it stays fast on two cores.
# takes: about 110 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# tier: full
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train_lib.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
TINY="--model tiny --micro-batch 2 --quiet"

# mpi_error WHAT PATTERN RANKS ARGS...: tp-train under mpirun fails with one line from tp-train.
mpi_error() {
    what=$1 pattern=$2
    shift 2
    run mpi_train "$@"
    if [ "$RC" -eq 0 ]; then failed "$what: exit 0"
    elif [ "$(grep -c '^tp-train: ' "$WORK/.err")" -ne 1 ]; then failed "$what: not one line from tp-train"
    elif ! grep -Eq -- "$pattern" "$WORK/.err"; then failed "$what: stderr does not match /$pattern/"
    else pass; fi
}

# --- The cross-check against the PyTorch GPT-2 (tests/trainer/gpt2_ref.py,
# torch_check in train_lib.sh): logits, loss, every gradient, 10 AdamW steps.
torch_check tp1 1 --tp 1
torch_check tp2pp2 4 --tp 2 --pp 2
torch_check tp4 4 --tp 4
BF16=1 torch_check tp1-bf16 1 --tp 1
BF16=1 torch_check tp2pp2-bf16 4 --tp 2 --pp 2
torch_check tp2-sp 2 --tp 2 --sequence-parallel
BF16=1 torch_check tp2pp2-sp-bf16 4 --tp 2 --pp 2 --sequence-parallel
torch_check tp2pp2-v2 4 --tp 2 --pp 2 --virtual-stages 2 --layers 4
torch_check tp2dp2-zero1 4 --tp 2 --zero 1
torch_check_fails_bf16 tp1-fp32-as-bf16 tp1

# --- bf16 mixed precision: the products' operands rounded, so the losses
# differ from fp32's (a little: bf16's precision), and not with the layout.
expect_ok "20 steps in bf16 at tp1" "$TRAIN" $TINY --steps 20 --dtype bf16 --log "$WORK/bf16-tp1.jsonl"
expect_ok "20 steps in bf16 at tp2pp2" mpi_train 4 $TINY --tp 2 --pp 2 --steps 20 --dtype bf16 --log "$WORK/bf16-tp2pp2.jsonl"
expect_ok "20 steps in fp32 at tp1" "$TRAIN" $TINY --steps 20 --log "$WORK/fp32-tp1.jsonl"
check "bf16: the start line says so" [ "$(events "$WORK/bf16-tp1.jsonl" start dtype)" = "bf16 " ]
check "bf16: the start line names the attention's code, on bf16-rounded operands" \
    sh -c 'grep "\"event\":\"start\"" "$1" | grep -q "\"attention\":\"CPU fp32 .*on bf16-rounded q, k, v" &&
        grep "\"event\":\"start\"" "$2" | grep "\"attention\":\"CPU fp32" | grep -vq "bf16-rounded"' \
    sh "$WORK/bf16-tp1.jsonl" "$WORK/fp32-tp1.jsonl"
check "bf16: tp2pp2 has the losses of tp1 (1e-4)" losses_match "$WORK/bf16-tp2pp2.jsonl" "$WORK/bf16-tp1.jsonl" 1e-4
expect_ok "20 steps in bf16 at tp2dp2 with ZeRO-1" mpi_train 4 $TINY --tp 2 --dp 2 --micro-batch 1 --steps 20 \
    --dtype bf16 --zero 1 --log "$WORK/bf16-tp2dp2-zero1.jsonl"
check "bf16 with ZeRO-1: tp2dp2 has the losses of tp1 (1e-4)" \
    losses_match "$WORK/bf16-tp2dp2-zero1.jsonl" "$WORK/bf16-tp1.jsonl" 1e-4
expect_ok "20 steps in bf16 at tp2dp2 with ZeRO-3" mpi_train 4 $TINY --tp 2 --dp 2 --micro-batch 1 --steps 20 \
    --dtype bf16 --zero 3 --log "$WORK/bf16-tp2dp2-zero3.jsonl"
check "bf16 with ZeRO-3: tp2dp2 has the losses of tp1 (1e-4)" \
    losses_match "$WORK/bf16-tp2dp2-zero3.jsonl" "$WORK/bf16-tp1.jsonl" 1e-4
check "bf16: within 1e-2 of fp32's losses" losses_match "$WORK/bf16-tp1.jsonl" "$WORK/fp32-tp1.jsonl" 1e-2
check_all "bf16: not fp32's losses (the rounding is there)" \
    '! losses_match "$WORK/bf16-tp1.jsonl" "$WORK/fp32-tp1.jsonl" 1e-7 2>/dev/null'

# --- --kernel-times: where a step's time goes, operation by operation (the
# steps after the first): the tiny model's calls per step as its shape says
# (2 layers: 4 products each and the head's in the forward, qkv's and the
# head's logits written as bf16 activations, the cross-entropy reading the
# logits' bits, fc's with its GELU in one operation writing both; in
# the backward the layers' 8, the attention's output projection writing its
# input's gradient in bf16, the MLP's with GELU's backward in one operation,
# and the head's in classifier_backward_bf16, the classifier's gradient and
# its products in one operation; the 5 norms writing bf16 activations, each
# layer's second norm in one operation with the residual add before it, the
# other residual add, one a layer, alone; no GELU of its own either way;
# the bf16 copy of the weights written by the AdamW step, one call, with no
# rounding pass of its own), the bf16 products and attention under
# bf16, the times adding up to the step's, the losses those of a plain run
# (the wrapper computes what the backend computes).
expect_ok "--kernel-times, bf16" "$BIN/tp-train" --model tiny --micro-batch 2 --steps 4 --dtype bf16 --kernel-times \
    --log "$WORK/kt.jsonl"
check "the table: the bf16 products, 9 calls a step forward (3 into bf16, 2 with GELU), 8 (2 into bf16, 2 with GELU), the classifier's; the weights' copy by the update" sh -c \
    'grep -Eq "^  matmul_forward_bf16 +4\.0 " "$1" && grep -Eq "^  matmul_forward_bf16_bits +3\.0 " "$1" &&
     grep -Eq "^  crossentropy_row_stats_bf16 +1\.0 " "$1" && grep -Eq "^  crossentropy_target_logit_bf16 +1\.0 " "$1" &&
     ! grep -Eq "^  crossentropy_(row_stats|target_logit) " "$1" &&
     grep -Eq "^  matmul_forward_gelu_bf16 +2\.0 " "$1" &&
     grep -Eq "^  layernorm_forward_bf16 +3\.0 " "$1" && grep -Eq "^  residual_layernorm_forward_bf16 +2\.0 " "$1" &&
     ! grep -Eq "^  gelu_(forward|backward)" "$1" && ! grep -Eq "^  (residual_layernorm|layernorm)_forward " "$1" &&
     grep -Eq "^  bias_residual_forward +2\.0 " "$1" && grep -Eq "^  matmul_backward_bf16 +4\.0 " "$1" &&
     grep -Eq "^  matmul_backward_bf16_bits +2\.0 " "$1" && grep -Eq "^  matmul_backward_gelu_bf16 +2\.0 " "$1" &&
     ! grep -Eq "^  matmul_backward " "$1" && ! grep -Eq "^  round_to_bf16 " "$1" &&
     grep -Eq "^  adamw_update_tensors +1\.0 " "$1" &&
     grep -Eq "^  classifier_backward_bf16 +1\.0 " "$1" && ! grep -Eq "^  crossentropy_backward " "$1" &&
     grep -q "^kernel times on cpu, per step (steps after the first: 3" "$1" && grep -q "^  (the trainer, outside)" "$1" &&
     ! grep -Eq "^  matmul_forward " "$1"' sh "$WORK/.out"
check "the log's kernel_times line: its parts add up to the mean of steps 2-4's time" "$PY" - "$WORK/kt.jsonl" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
kt = [l for l in lines if l.get("event") == "kernel_times"]
assert len(kt) == 1 and lines[-1]["event"] == "stop" and lines[-2] is kt[0], "one kernel_times line, just before the stop line"
kt = kt[0]
assert all("step" in l for l in lines), "a line without a step: %s" % [l for l in lines if "step" not in l][:1]
assert kt["step"] == 4, "kernel_times at step %r, the run ended at 4" % kt["step"]
steps = [l for l in lines if "step" in l and "event" not in l]
mean = sum(l["ms"] for l in steps[1:]) / len(steps[1:])
assert kt["steps"] == 3, kt["steps"]
assert abs(kt["step_ms"] - mean) <= 0.01 * mean, (kt["step_ms"], mean)
parts = sum(o["issue_ms"] + o["wait_ms"] for o in kt["ops"]) + kt["outside_ms"]
assert abs(parts - kt["step_ms"]) <= 1e-3 * kt["step_ms"] + 0.01, (parts, kt["step_ms"])
ops = {o["op"]: o for o in kt["ops"]}
assert ops["attention_forward_bf16"]["calls"] == 2 and ops["sum_of_squares"]["calls"] == 1, ops
PYEOF
expect_ok "the same run without it" "$TRAIN" $TINY --steps 4 --dtype bf16 --log "$WORK/kt-plain.jsonl"
check "its losses are the plain run's, bit for bit" losses_match "$WORK/kt.jsonl" "$WORK/kt-plain.jsonl" 0

# --- Layout invariance: the same 20 losses at five layouts of 4-sequence batches.
# Fields: ranks tp pp dp micro-batch grad-accum (global batch 4 sequences).
for layout in "1 1 1 1 4 1" "4 2 2 1 2 2" "4 4 1 1 4 1" "4 1 1 4 1 1" "4 2 1 2 2 1"; do
    set -- $layout
    name="tp$2pp$3dp$4"
    expect_ok "20 steps at $name" mpi_train "$1" $TINY --tp "$2" --pp "$3" --dp "$4" --micro-batch "$5" \
        --grad-accum "$6" --steps 20 --log "$WORK/$name.jsonl"
done
for name in tp2pp2dp1 tp4pp1dp1 tp1pp1dp4 tp2pp1dp2; do
    check "$name has the losses of tp1pp1dp1 (1e-4)" losses_match "$WORK/$name.jsonl" "$WORK/tp1pp1dp1.jsonl" 1e-4
done
# --- Sequence parallelism: where the norms' rows live, not what is computed:
# the losses of the same layout without it (1e-5), a rank's rows only in its
# activations, refused where it cannot split the rows.
for layout in "4 2 2 1 2 2" "4 4 1 1 4 1" "4 2 1 2 2 1"; do
    set -- $layout
    name="tp$2pp$3dp$4"
    expect_ok "20 steps at $name with sequence parallelism" mpi_train "$1" $TINY --tp "$2" --pp "$3" --dp "$4" \
        --micro-batch "$5" --grad-accum "$6" --steps 20 --sequence-parallel --log "$WORK/$name-sp.jsonl"
    check "$name with sequence parallelism has its losses without it (1e-5)" \
        losses_match "$WORK/$name-sp.jsonl" "$WORK/$name.jsonl" 1e-5
done
check "sequence parallelism: the start line says so" \
    [ "$(events "$WORK/tp4pp1dp1-sp.jsonl" start sequence_parallel)" = "true " ]
# The tiny model's norm and residual rows are 59% of its activations at tp4
# (docs/BENCHMARKS.md has a real model's figures); a quarter of them is kept,
# and two [B*T, D] buffers to gather into: 67% of the bytes.
check "sequence parallelism at tp4: a rank keeps fewer activations than without it" "$PY" -c '
import json, sys
a, b = ([r["activation_bytes"] for r in map(json.loads, open(f)) if r.get("event") == "start"][0] for f in sys.argv[1:])
sys.exit(not 0 < a < 0.8 * b)' "$WORK/tp4pp1dp1-sp.jsonl" "$WORK/tp4pp1dp1.jsonl"
expect_error "--sequence-parallel at tp 1" 2 "sequence-parallel .* needs --tp 2 or more" "$TRAIN" $TINY --sequence-parallel
expect_error "--sequence-parallel with rows that do not divide over tp" 2 \
    "micro-batch 1 x sequence 31 = 31 rows do not divide over tp 2" "$TRAIN" $TINY --seq 31 --micro-batch 1 --tp 2 \
    --sequence-parallel
# --- The interleaved schedule (--virtual-stages): the order of the
# micro-batches' work, not what is computed. 8 layers, 8 micro-batches of 2
# sequences: the losses of one rank (1e-5) at (pp 4, V 2), (pp 2, V 4), and
# tp 2 (pp 2, V 2) with sequence parallelism. The pipeline messages (16 KiB)
# are past Open MPI's eager limit: a buffer written again before its send
# completed would change the losses (a wrong count of the sends waited for
# did, in 5 runs of 8).
IL="$TINY --layers 8 --grad-accum 8 --steps 10"
expect_ok "10 steps of 8 layers on one rank" "$TRAIN" $IL --log "$WORK/il-one.jsonl"
for layout in "4 1 4 2" "2 1 2 4" "4 2 2 2"; do
    set -- $layout
    name="il-tp$2pp$3v$4"
    sp=""
    [ "$2" -gt 1 ] && sp="--sequence-parallel"
    expect_ok "10 steps at tp$2 pp$3 with $4 virtual stages $sp" mpi_train "$1" $IL --tp "$2" --pp "$3" \
        --virtual-stages "$4" $sp --log "$WORK/$name.jsonl"
    check "tp$2 pp$3 V$4 has the losses of one rank (1e-5)" losses_match "$WORK/$name.jsonl" "$WORK/il-one.jsonl" 1e-5
done
check "interleaved: the start line says V" [ "$(events "$WORK/il-tp1pp4v2.jsonl" start virtual_stages)" = "2 " ]
# With ZeRO-1 over 2 data-parallel ranks: the same 16 sequences a step, as 4
# micro-batches of 2 on each replica; the gradients summed in another order.
expect_ok "10 steps at pp2 V2 dp2 with ZeRO-1" mpi_train 4 $TINY --layers 8 --grad-accum 4 --steps 10 \
    --pp 2 --dp 2 --virtual-stages 2 --zero 1 --log "$WORK/il-pp2v2dp2-zero1.jsonl"
check "pp2 V2 dp2 with ZeRO-1 has the losses of one rank (1e-4)" \
    losses_match "$WORK/il-pp2v2dp2-zero1.jsonl" "$WORK/il-one.jsonl" 1e-4
# pipeline_ms is the longest rank's span and ms rank 0's step: ranks start a
# step as each leaves the last one's collective, skewed under load, so the
# pipeline may outlast rank 0's step; the mean idle time is below the
# longest span on every step.
check "interleaved: each step line has the pipeline's time and the ranks' idle time in it" "$PY" -c '
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "event" not in r]
sys.exit(not (len(steps) == 10 and all(0 < r["pipeline_wait_ms"] < r["pipeline_ms"] and r["ms"] > 0 for r in steps)))' \
    "$WORK/il-tp1pp4v2.jsonl"
expect_error "--virtual-stages at pp 1" 2 "virtual-stages interleaves .* needs --pp 2 or more" "$TRAIN" $TINY \
    --virtual-stages 2
expect_error "--virtual-stages with layers that do not split into chunks" 2 \
    "virtual-stages 2: 2 layers do not split into pp 2 x 2 = 4 chunks" "$TRAIN" $TINY --pp 2 --virtual-stages 2
mpi_error "--virtual-stages with micro-batches not a multiple of pp" \
    "3 micro-batches a step \(--grad-accum, or --global-batch / \(micro-batch x dp\)\) is not a multiple of 2" 2 $TINY --layers 4 --pp 2 --virtual-stages 2 \
    --grad-accum 3
check "the loss falls on synthetic data" "$PY" -c 'import json,sys; r=[x["loss"] for x in map(json.loads, open(sys.argv[1])) if "event" not in x]; sys.exit(not r[-1] < r[0] - 0.05)' "$WORK/tp1pp1dp1.jsonl"

# --- --global-batch: the accumulation is global batch / (micro-batch x dp), and
# the losses do not depend on how the batch is split (fields: ranks, tp, pp,
# dp, micro-batch, the accumulation that follows).
for layout in "1 1 1 1 4 2" "4 2 1 2 2 2" "4 1 2 2 1 4"; do
    set -- $layout
    name="gb8-tp$2pp$3dp$4mb$5"
    expect_ok "6 steps of global batch 8 at $name" mpi_train "$1" $TINY --tp "$2" --pp "$3" --dp "$4" \
        --micro-batch "$5" --global-batch 8 --steps 6 --log "$WORK/$name.jsonl"
    check "$name: start line says accumulation $6, global batch 8" \
        [ "$(events "$WORK/$name.jsonl" start grad_accum)/$(events "$WORK/$name.jsonl" start global_batch)" = "$6 /8 " ]
done
for name in gb8-tp2pp1dp2mb2 gb8-tp1pp2dp2mb1; do
    check "$name has the losses of one rank, micro-batch 4 x 2 (1e-5)" \
        losses_match "$WORK/$name.jsonl" "$WORK/gb8-tp1pp1dp1mb4.jsonl" 1e-5
done
# The comparison can fail: another global batch trains on other samples.
expect_ok "6 steps of global batch 4" "$TRAIN" $TINY --micro-batch 4 --global-batch 4 --steps 6 --log "$WORK/gb4.jsonl"
losses_differ() { ! losses_match "$@" 2>/dev/null; }
check "global batch 4 does not have the losses of global batch 8 (1e-5)" \
    losses_differ "$WORK/gb4.jsonl" "$WORK/gb8-tp1pp1dp1mb4.jsonl" 1e-5
expect_error "--global-batch not a multiple of micro-batch x dp" 2 "global-batch 8 is not a multiple of micro-batch 3 x dp 1" \
    "$TRAIN" $TINY --micro-batch 3 --global-batch 8
expect_error "--grad-accum disagreeing with --global-batch" 2 "grad-accum 3 gives a global batch of 6, not --global-batch 8" \
    "$TRAIN" $TINY --micro-batch 2 --grad-accum 3 --global-batch 8
run mpi_train 2 $TINY --dp 2 --micro-batch 4 --global-batch 12
check_all "under mpirun: dp 2 named, exit 2, one line" '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: " "$WORK/.err")" -eq 1 ] &&
    grep -q "global-batch 12 is not a multiple of micro-batch 4 x dp 2" "$WORK/.err"'

# --- Resume at other layouts, the global batch kept: 12 steps at tp2 (micro 2
# x accumulation 4), against the same run stopped at step 4, resumed at pp2dp2
# (micro 1 x 4) and stopped at 8, resumed on one rank (micro 8 x 1) to 12,
# all in one log.
GB="--model tiny --quiet --global-batch 8 --steps 12"
expect_ok "12 straight steps at tp2, global batch 8" mpi_train 2 $GB --tp 2 --micro-batch 2 --log "$WORK/gb-straight.jsonl"
expect_ok "tp2 to step 4" mpi_train 2 $GB --tp 2 --micro-batch 2 --stop-at 4 --ckpt-every 2 --ckpt-dir "$WORK/gbrun" \
    --resume --log "$WORK/gb-split.jsonl"
expect_ok "pp2dp2 micro-batch 1 from step 4 to 8" mpi_train 4 $GB --pp 2 --dp 2 --micro-batch 1 --stop-at 8 \
    --ckpt-every 2 --ckpt-dir "$WORK/gbrun" --resume --log "$WORK/gb-split.jsonl"
expect_ok "one rank micro-batch 8 from step 8 to 12" "$TRAIN" $GB --micro-batch 8 --ckpt-every 2 --ckpt-dir "$WORK/gbrun" \
    --resume --log "$WORK/gb-split.jsonl"
check "three layouts, one log: steps 1..12 have the straight run's losses (1e-4)" \
    losses_match "$WORK/gb-split.jsonl" "$WORK/gb-straight.jsonl" 1e-4
check "start lines: steps 0 4 8, dp 1 2 1, accumulation 4 4 1, resumed from null, step 4, step 8" \
    [ "$(events "$WORK/gb-split.jsonl" start step)|$(events "$WORK/gb-split.jsonl" start dp)|$(events "$WORK/gb-split.jsonl" start grad_accum)|$(events "$WORK/gb-split.jsonl" start resumed_from)" = \
    "0 4 8 |1 2 1 |4 4 1 |null step_00000004 step_00000008 " ]
check_all "stop lines: stopped at 4, at 8, finished at 12; saves 2..12" \
    '[ "$(events "$WORK/gb-split.jsonl" stop reason)$(events "$WORK/gb-split.jsonl" stop step)" = "stopped stopped finished 4 8 12 " ] &&
    [ "$(events "$WORK/gb-split.jsonl" save step)" = "2 4 6 8 10 12 " ]'

# --- The sharded optimizer. ZeRO-1 (--zero 1) splits the moments over the
# data-parallel ranks; ZeRO-3 (--zero 3) the parameters and gradients as
# well, each layer (and each other tensor) gathered when a forward or
# backward uses it. The arithmetic of each element is unchanged: the losses
# of the same layout without it (1e-6), with a dp-th of the moments kept,
# rounded up once with ZeRO-1 and per unit (a layer, or another tensor)
# with ZeRO-3. Then checkpoints that resume with and without it at other
# layouts (the global batch kept).
for zero in 1 3; do
    for layout in "4 2 1 2 2 1" "4 1 1 4 1 1" "8 2 2 2 1 2"; do
        set -- $layout
        name="tp$2pp$3dp$4"
        [ -f "$WORK/$name.jsonl" ] || expect_ok "20 steps at $name" mpi_train "$1" $TINY --tp "$2" --pp "$3" \
            --dp "$4" --micro-batch "$5" --grad-accum "$6" --steps 20 --log "$WORK/$name.jsonl"
        expect_ok "20 steps at $name with ZeRO-$zero" mpi_train "$1" $TINY --tp "$2" --pp "$3" --dp "$4" \
            --micro-batch "$5" --grad-accum "$6" --steps 20 --zero "$zero" --log "$WORK/$name-zero$zero.jsonl"
        check "$name with ZeRO-$zero has its losses without it (1e-6)" \
            losses_match "$WORK/$name-zero$zero.jsonl" "$WORK/$name.jsonl" 1e-6
        check "$name with ZeRO-$zero: each rank keeps a dp-th of the moments (rounded up)" "$PY" -c '
import json, sys
z, plain = ([r for r in map(json.loads, open(f)) if r.get("event") == "start"][0] for f in sys.argv[1:3])
zero, dp = int(sys.argv[3]), int(sys.argv[4])
elements = plain["optimizer_bytes"] // 8  # two fp32 moments an element
share = -(-elements // dp)
per_unit_rounding = 0 if zero == 1 else 32
sys.exit(not (z["zero"] == zero and plain["zero"] == 0
              and share <= z["optimizer_bytes"] // 8 <= share + per_unit_rounding))' \
            "$WORK/$name-zero$zero.jsonl" "$WORK/$name.jsonl" "$zero" "$4"
    done
    expect_ok "20 steps at tp2pp1dp2 with ZeRO-$zero and sequence parallelism" mpi_train 4 $TINY --tp 2 --dp 2 \
        --micro-batch 2 --steps 20 --sequence-parallel --zero "$zero" --log "$WORK/tp2pp1dp2-sp-zero$zero.jsonl"
    check "ZeRO-$zero with sequence parallelism: the losses of sequence parallelism alone (1e-6)" \
        losses_match "$WORK/tp2pp1dp2-sp-zero$zero.jsonl" "$WORK/tp2pp1dp2-sp.jsonl" 1e-6
done
ZB="--model tiny --quiet --global-batch 8 --steps 12"
expect_ok "ZeRO-1: 12 straight steps at tp2dp2" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 1 \
    --log "$WORK/zero-straight.jsonl"
expect_ok "ZeRO-1: tp2dp2 to step 4" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 1 --stop-at 4 \
    --ckpt-dir "$WORK/zerorun" --log "$WORK/zero-split.jsonl"
expect_ok "ZeRO-1's checkpoint verifies" "$BIN/tp-ckpt" verify "$WORK/zerorun/step_00000004"
# Format 1.6: the second replicas wrote the moments they keep, each in its
# shard's data-parallel file; the first replicas the parameters and theirs.
check "ZeRO-1: files of both replicas, the parameters in the first's (index)" "$PY" -c '
import json, sys
index = json.load(open(sys.argv[1] + "/index.json"))
files = sorted((f["name"], f.get("dp", 0)) for f in index["files"])
where = {(t["role"], p["file"]) for t in index["tensors"] for p in t["pieces"]}
dp_files = {p for r, p in where if "_dp01" in p}
sys.exit(not (files == [("shard_pp00_tp00.h5", 0), ("shard_pp00_tp00_dp01.h5", 1), ("shard_pp00_tp01.h5", 0),
                        ("shard_pp00_tp01_dp01.h5", 1)] and index["format_version"] == [1, 7]
              and not any(r == "param" and "_dp" in p for r, p in where) and len(dp_files) == 2
              and {r for r, p in where if "_dp01" in p} == {"exp_avg", "exp_avg_sq"}))' "$WORK/zerorun/step_00000004"
expect_ok "ZeRO-1's checkpoint, read by the independent h5py reader" "$PY" "$ROOT/tests/ckpt/check_h5py.py" \
    "$WORK/zerorun/step_00000004"
expect_ok "ZeRO-1's checkpoint resharded to tp1" "$BIN/tp-reshard" "$WORK/zerorun/step_00000004" --to tp1pp1 \
    -o "$WORK/zero-tp1"
expect_ok "resharded from the data-parallel files: the same tensors, bit for bit" "$BIN/tp-ckpt" diff \
    "$WORK/zerorun/step_00000004" "$WORK/zero-tp1"
expect_ok "ZeRO-1: the same layout from step 4 to 6" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 1 --stop-at 6 \
    --ckpt-dir "$WORK/zerorun" --resume --log "$WORK/zero-split.jsonl"
expect_ok "without ZeRO at tp1dp2 from step 6 to 8" mpi_train 2 $ZB --micro-batch 4 --stop-at 8 \
    --ckpt-dir "$WORK/zerorun" --resume --log "$WORK/zero-split.jsonl"
expect_ok "ZeRO-1 at tp2pp2dp2 from step 8 to 12" mpi_train 8 $ZB --tp 2 --pp 2 --micro-batch 1 --zero 1 \
    --ckpt-dir "$WORK/zerorun" --resume --log "$WORK/zero-split.jsonl"
check "ZeRO-1 across layouts, one log: the straight run's losses (1e-4)" \
    losses_match "$WORK/zero-split.jsonl" "$WORK/zero-straight.jsonl" 1e-4
steps_from "$WORK/zero-split.jsonl" 1 6 >"$WORK/zero-split-6.jsonl"
steps_from "$WORK/zero-straight.jsonl" 1 6 >"$WORK/zero-straight-6.jsonl"
check "ZeRO-1 at the same layout: the straight run's losses to step 6 (1e-6)" \
    losses_match "$WORK/zero-split-6.jsonl" "$WORK/zero-straight-6.jsonl" 1e-6
check "ZeRO-1: start lines zero 1 1 0 1, dp 2 2 2 2" \
    [ "$(events "$WORK/zero-split.jsonl" start zero)|$(events "$WORK/zero-split.jsonl" start dp)" = "1 1 0 1 |2 2 2 2 " ]
expect_error "--zero 2" 2 "--zero" "$TRAIN" $TINY --zero 2

# --- ZeRO-3 further: a shared key/value head, the PyTorch reference, checkpoints.
# Llama with one key/value head shared by both TP ranks: its gradients summed
# over them per use.
LZ="--model llama-tiny --kv-heads 1 --micro-batch 2 --steps 12 --quiet --tp 2 --dp 2 --sequence-parallel"
expect_ok "Llama, a shared key/value head, sequence parallelism: tp2dp2" mpi_train 4 $LZ --log "$WORK/llama-kv1.jsonl"
expect_ok "the same with ZeRO-3" mpi_train 4 $LZ --zero 3 --log "$WORK/llama-kv1-zero3.jsonl"
check "Llama with ZeRO-3: the losses without it (1e-6)" \
    losses_match "$WORK/llama-kv1-zero3.jsonl" "$WORK/llama-kv1.jsonl" 1e-6
# ZeRO-3 sums the gradients per micro-batch and use, in another order than a
# run without it (docs/TOOLS.md): at dp 2 with one micro-batch a step and an
# untied output its parameters are the same bit for bit; a GPT's tied table
# (two uses) or a second micro-batch differ in their last bits.
LB="--model llama-tiny --micro-batch 4 --global-batch 8 --steps 3 --quiet --dp 2"
expect_ok "Llama at dp2, one micro-batch a step" mpi_train 2 $LB --ckpt-dir "$WORK/llama-dp2"
expect_ok "the same with ZeRO-3" mpi_train 2 $LB --zero 3 --ckpt-dir "$WORK/llama-dp2-zero3"
expect_ok "ZeRO-3 at dp2, one micro-batch, untied: the parameters and moments without it, bit for bit" \
    "$BIN/tp-ckpt" diff "$WORK/llama-dp2/step_00000003" "$WORK/llama-dp2-zero3/step_00000003"
# The PyTorch reference at dp2 with ZeRO-3: the test hook's gradients are
# those each rank's shard summed, gathered to their writers.
torch_check dp2-zero3 2 --zero 3
torch_check pp2dp2-zero3 4 --pp 2 --zero 3
# Checkpoints: each rank writes the parameters and moments of the tensors
# given to it (format 1.7), and they resume at any
# layout, with or without a sharded optimizer.
expect_ok "ZeRO-3: tp2dp2 to step 4" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 3 --stop-at 4 \
    --ckpt-dir "$WORK/zero3run" --log "$WORK/zero3-split.jsonl"
expect_ok "ZeRO-3's checkpoint verifies" "$BIN/tp-ckpt" verify "$WORK/zero3run/step_00000004"
check "ZeRO-3: parameters and moments in both replicas' files (format 1.7)" "$PY" -c '
import json, sys
index = json.load(open(sys.argv[1] + "/index.json"))
where = {(t["role"], p["file"]) for t in index["tensors"] for p in t["pieces"]}
roles = lambda part: {r for r, p in where if part(p)}
sys.exit(not (index["format_version"] == [1, 7] and roles(lambda p: "_dp01" in p) == {"param", "exp_avg", "exp_avg_sq"}
              and roles(lambda p: "_dp" not in p) == {"param", "exp_avg", "exp_avg_sq"}))' "$WORK/zero3run/step_00000004"
expect_ok "ZeRO-3's checkpoint, read by the independent h5py reader" "$PY" "$ROOT/tests/ckpt/check_h5py.py" \
    "$WORK/zero3run/step_00000004"
expect_ok "ZeRO-3's checkpoint resharded to tp1" "$BIN/tp-reshard" "$WORK/zero3run/step_00000004" --to tp1pp1 \
    -o "$WORK/zero3-tp1"
expect_ok "resharded: the same tensors, bit for bit" "$BIN/tp-ckpt" diff "$WORK/zero3run/step_00000004" \
    "$WORK/zero3-tp1"
expect_ok "ZeRO-3: the same layout from step 4 to 6" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 3 --stop-at 6 \
    --ckpt-dir "$WORK/zero3run" --resume --log "$WORK/zero3-split.jsonl"
expect_ok "ZeRO-3 at tp2pp2dp2 from step 6 to 8 (the token table's copies on two stages)" mpi_train 8 $ZB --tp 2 \
    --pp 2 --micro-batch 1 --zero 3 --stop-at 8 --ckpt-dir "$WORK/zero3run" --resume --log "$WORK/zero3-split.jsonl"
expect_ok "without ZeRO at tp1 from step 8 to 10" mpi_train 1 $ZB --micro-batch 8 --stop-at 10 \
    --ckpt-dir "$WORK/zero3run" --resume --log "$WORK/zero3-split.jsonl"
expect_ok "ZeRO-1 at dp4 from step 10 to 12" mpi_train 4 $ZB --micro-batch 2 --zero 1 \
    --ckpt-dir "$WORK/zero3run" --resume --log "$WORK/zero3-split.jsonl"
check "ZeRO-3 across layouts and stages, one log: the straight run's losses (1e-4)" \
    losses_match "$WORK/zero3-split.jsonl" "$WORK/zero-straight.jsonl" 1e-4
steps_from "$WORK/zero3-split.jsonl" 1 6 >"$WORK/zero3-split-6.jsonl"
check "ZeRO-3 at the same layout: the straight run's losses to step 6 (1e-6)" \
    losses_match "$WORK/zero3-split-6.jsonl" "$WORK/zero-straight-6.jsonl" 1e-6
check "ZeRO-3: start lines zero 3 3 3 0 1" [ "$(events "$WORK/zero3-split.jsonl" start zero)" = "3 3 3 0 1 " ]
# ZeRO-3 hands a checkpoint out unit by unit as the first replica reads it: a
# damaged piece in a later unit (the second layer's) ends that load after the
# units before it went out, and the fallback to the previous checkpoint
# replaces them all (its losses those of the straight run).
expect_ok "ZeRO-3: tp2dp2 to step 8, saving every 4" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 3 --stop-at 8 \
    --ckpt-every 4 --ckpt-dir "$WORK/zero3fall" --log "$WORK/zero3fall.jsonl"
shard=$("$PY" -c '
import json, sys
index = json.load(open(sys.argv[1] + "/index.json"))
print(sys.argv[1] + "/" + [p["file"] for t in index["tensors"] if t["name"] == "model/layers.1.mlp.fc.weight"
                           for p in t["pieces"]][0])' "$WORK/zero3fall/step_00000008")
flip_byte "$shard" $(($(data_offset "$shard" model/layers.1.mlp.fc.weight) + 100))
expect_ok "ZeRO-3: resumed past the damaged step 8 to step 12" mpi_train 4 $ZB --tp 2 --micro-batch 2 --zero 3 \
    --ckpt-dir "$WORK/zero3fall" --resume --log "$WORK/zero3fall-resumed.jsonl"
check "ZeRO-3: step 8 named unusable, the fallback to step 4" \
    grep -Eq "step_00000008 is unusable.*checksum.*falling back to .*step_00000004" "$WORK/.err"
steps_from "$WORK/zero-straight.jsonl" 5 >"$WORK/zero-straight-from-5.jsonl"
check_all "ZeRO-3 after the fallback: steps 5..12, the straight run's losses (1e-5)" \
    '[ "$(events "$WORK/zero3fall-resumed.jsonl" start resumed_from)" = "step_00000004 " ] &&
    losses_match "$WORK/zero3fall-resumed.jsonl" "$WORK/zero-straight-from-5.jsonl" 1e-5'
# The issue's own example: saved at tp2 pp2 dp4 with ZeRO-1 (16 ranks), resumed
# at tp4 pp1 dp2 with ZeRO-3, then at tp1 without ZeRO.
XB="--model tiny --quiet --steps 9 --global-batch 16 --micro-batch 1"
expect_ok "9 straight steps at tp1" "$TRAIN" $XB --log "$WORK/x-straight.jsonl"
expect_ok "tp2pp2dp4 with ZeRO-1 to step 3" mpi_train 16 $XB --tp 2 --pp 2 --dp 4 --zero 1 --stop-at 3 \
    --ckpt-dir "$WORK/xrun" --log "$WORK/x-split.jsonl"
expect_ok "tp4pp1dp2 with ZeRO-3 from step 3 to 6" mpi_train 8 $XB --tp 4 --dp 2 --zero 3 --stop-at 6 \
    --ckpt-dir "$WORK/xrun" --resume --log "$WORK/x-split.jsonl"
expect_ok "tp1 without ZeRO from step 6 to 9" "$TRAIN" $XB --ckpt-dir "$WORK/xrun" --resume \
    --log "$WORK/x-split.jsonl"
check "ZeRO-1 at 16 ranks to ZeRO-3 at 8 to one rank: the straight run's losses (1e-4)" \
    losses_match "$WORK/x-split.jsonl" "$WORK/x-straight.jsonl" 1e-4
check "the three launches: zero 1 3 0, tp 2 4 1" \
    [ "$(events "$WORK/x-split.jsonl" start zero)|$(events "$WORK/x-split.jsonl" start tp)" = "1 3 0 |2 4 1 " ]

# --- Preemption: SIGTERM (to the process, or to each rank under mpirun),
# SIGUSR1 (to mpirun, which forwards it) or a first SIGINT (Ctrl-C) ends the
# step, commits a checkpoint, exits 0; the resumed run continues exactly.
# (SIGINT ended the trainer at once, exit 130, losing the steps since the
# last save.) A background job starts with SIGINT ignored, which the trainer
# keeps: env puts it back to its default.
LONG="--model tiny --micro-batch 16 --quiet --steps 100000"
# preempt NAME SIGNAL TARGET RANKS ARGS...: TARGET is self, ranks or mpirun.
preempt() {
    name=$1 signal=$2 target=$3 ranks=$4
    shift 4
    dir="$WORK/pre-$name"
    if [ "$target" = self ]; then
        env --default-signal=INT "$TRAIN" $LONG "$@" --ckpt-dir "$dir" --log "$dir.jsonl" >"$WORK/.out" 2>"$WORK/.err" &
    else
        mpirun --oversubscribe -np "$ranks" "$TRAIN" $LONG "$@" --ckpt-dir "$dir" --log "$dir.jsonl" \
            </dev/null >"$WORK/.out" 2>"$WORK/.err" &
    fi
    pid=$!
    waited=0
    while [ "$(cat "$dir.jsonl" 2>/dev/null | wc -l)" -lt 3 ] && [ $waited -lt 300 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    case $target in
    ranks) pkill "-$signal" -P "$pid" ;;
    *) kill "-$signal" "$pid" ;;
    esac
    wait "$pid"
    RC=$?
    if [ "$RC" -ne 0 ]; then failed "$name: exit $RC after SIG$signal"; return; fi
    stopped=$(last_step "$dir.jsonl")
    if [ "$stopped" -ge 100000 ] || [ "$(cat "$dir/latest")" != "$(printf 'step_%08d' "$stopped")" ]; then
        failed "$name: no checkpoint of step $stopped"
        return
    fi
    pass
    last_two=$(tail -n 2 "$dir.jsonl" | "$PY" -c 'import json,sys; print(" ".join("%s:%s" % (r["event"], r["step"]) for r in map(json.loads, sys.stdin)))')
    check_all "$name: the log ends with the save of step $stopped and a stop line (stopped)" \
        '[ "$last_two" = "save:$stopped stop:$stopped" ] && [ "$(events "$dir.jsonl" stop reason)" = "stopped " ]'
    # Three more steps resumed at tp1, against an uninterrupted tp1 run (same
    # schedule: --steps stays, --stop-at ends both).
    expect_ok "$name: resume for 3 steps" "$TRAIN" $LONG --stop-at $((stopped + 3)) --ckpt-dir "$dir" --resume \
        --log "$dir-resumed.jsonl"
    expect_ok "$name: straight run" "$TRAIN" $LONG --stop-at $((stopped + 3)) --log "$dir-straight.jsonl"
    steps_from "$dir-straight.jsonl" $((stopped + 1)) >"$dir-tail.jsonl"
    check "$name: the resumed steps match a straight run (1e-4)" losses_match "$dir-resumed.jsonl" "$dir-tail.jsonl" 1e-4
}
preempt sigterm TERM self 1
preempt sigint INT self 1
# SIGHUP (a terminal or session gone) killed the run with no checkpoint of its last steps.
preempt sighup HUP self 1
preempt ranks-sigterm TERM ranks 2 --tp 2
preempt mpirun-sigusr1 USR1 mpirun 2 --tp 2
# A second SIGINT ends the trainer at once (SIGINT's default action): no
# checkpoint of the step under way, which --fault slow holds 3 s after its
# line, long enough for both signals.
dir="$WORK/pre-sigint-twice"
env --default-signal=INT "$TRAIN" $LONG --fault slow --fault-step 3 --ckpt-dir "$dir" --log "$dir.jsonl" \
    >"$WORK/.out" 2>"$WORK/.err" &
pid=$!
wait_for_step "$dir.jsonl" 3 30
kill -INT "$pid"
sleep 0.5
kill -INT "$pid"
wait "$pid"
RC=$?
check_all "a second SIGINT: the trainer dies of it (exit $RC), no checkpoint, no stop line" \
    '[ "$RC" -eq 130 ] && [ ! -e "$dir/latest" ] && [ "$(last_step "$dir.jsonl")" = 3 ] &&
    [ -z "$(events "$dir.jsonl" stop reason)" ]'

# --- A corrupted checkpoint is refused by name; --resume falls back to the
# newest intact one and says so. A tp2 run with checkpoints at steps 4, 8, 10
# (stopped there) and 20.
expect_ok "a tp2 run to step 10" mpi_train 2 $TINY --tp 2 --steps 20 --stop-at 10 --ckpt-every 4 --ckpt-dir "$WORK/run"
expect_ok "and on to step 20" mpi_train 2 $TINY --tp 2 --steps 20 --ckpt-dir "$WORK/run" --resume
cp -r "$WORK/run" "$WORK/damaged"
shard=$(ls "$WORK/damaged/step_00000020"/*.h5 | head -n 1)
flip_byte "$shard" $(($(data_offset "$shard" model/layers.0.mlp.fc.weight) + 100))
expect_ok "resume past damage" mpi_train 2 $TINY --tp 2 --steps 22 --ckpt-dir "$WORK/damaged" --resume \
    --log "$WORK/damaged.jsonl"
check "the damaged checkpoint is named, and the fallback" \
    grep -Eq "step_00000020 is unusable.*checksum.*falling back to .*step_00000010" "$WORK/.err"
check_all "resumed from step 10: steps 11..22 logged" '[ "$(grep -v "\"event\"" "$WORK/damaged.jsonl" | head -n 1 | cut -c1-11)" = "{\"step\":11," ] &&
    [ "$(last_step "$WORK/damaged.jsonl")" = 22 ] && [ "$(events "$WORK/damaged.jsonl" start resumed_from)" = "step_00000010 " ]'
for s in 4 8 10; do
    f=$(ls "$WORK/damaged/$(printf 'step_%08d' $s)"/*.h5 | head -n 1)
    flip_byte "$f" $(($(data_offset "$f" model/layers.0.mlp.fc.weight) + 100))
done
rm -rf "$WORK/damaged/step_00000022"
run "$TRAIN" $TINY --steps 22 --ckpt-dir "$WORK/damaged" --resume
check_all "no intact checkpoint left: refused (exit 1), every one named" '[ "$RC" -eq 1 ] &&
    [ "$(grep -c "step_000000.* is unusable" "$WORK/.err")" -eq 4 ] && grep -q "^tp-train: error: " "$WORK/.err"'

# --- Token files: prepare, then train on one file and on a glob of two.
cat "$ROOT"/docs/*.md "$ROOT/README.md" >"$WORK/text.txt"
expect_ok "prepare a token file" "$TRAIN" prepare "$WORK/text.txt" -o "$WORK/tokens_0.bin"
check "token file: llm.c header, 2 bytes per token" "$PY" -c '
import numpy as np, os, sys
h = np.fromfile(sys.argv[1], dtype=np.int32, count=256)
n = os.path.getsize(sys.argv[2])
sys.exit(not (h[0] == 20240520 and h[1] == 1 and 1024 + 2 * h[2] == os.path.getsize(sys.argv[1]) and h[2] == n))' \
    "$WORK/tokens_0.bin" "$WORK/text.txt"
head -c 20000 "$WORK/text.txt" >"$WORK/text1.txt"
expect_ok "prepare a second token file" "$TRAIN" prepare "$WORK/text1.txt" -o "$WORK/tokens_1.bin"
expect_ok "train 40 steps on text" mpi_train 2 $TINY --tp 2 --steps 40 --lr 3e-3 --data "$WORK/tokens_*.bin" \
    --log "$WORK/text.jsonl"
# A step's loss is that of 4 windows of 32 bytes: one step can be an
# outlier (a window of rare bytes), so the last ten steps are averaged.
check "the loss falls on text" "$PY" -c 'import json,sys; r=[x["loss"] for x in map(json.loads, open(sys.argv[1])) if "event" not in x]; sys.exit(not sum(r[-10:]) / 10 < r[0] - 1.0)' "$WORK/text.jsonl"
# The data position on token files does not depend on the layout either: stopped at step 4 on one rank
# (micro-batch 4), resumed at dp2 (micro-batch 1 x 2), the straight run's losses.
TEXT="--model tiny --quiet --global-batch 4 --steps 8"
expect_ok "8 straight steps on text, one rank" "$TRAIN" $TEXT --data "$WORK/tokens_*.bin" --micro-batch 4 --log "$WORK/text-straight.jsonl"
expect_ok "4 steps on text, one rank" "$TRAIN" $TEXT --data "$WORK/tokens_*.bin" --micro-batch 4 --stop-at 4 --ckpt-dir "$WORK/textrun" \
    --log "$WORK/text-split.jsonl"
expect_ok "resumed on text at dp2, micro-batch 1" mpi_train 2 $TEXT --data "$WORK/tokens_*.bin" --dp 2 --micro-batch 1 --ckpt-dir "$WORK/textrun" \
    --resume --log "$WORK/text-split.jsonl"
check "text: one rank -> dp2 has the straight losses (1e-4)" \
    losses_match "$WORK/text-split.jsonl" "$WORK/text-straight.jsonl" 1e-4
printf 'not a token file, but long enough to have a header of 1024 bytes %01024d' 0 >"$WORK/bad.bin"
expect_error "a file that is not a token file" 1 "bad.bin.*(magic|header)" "$TRAIN" $TINY --data "$WORK/bad.bin"
# A token file holding no token, and one holding one: said so (it was "the
# file holds 0 (truncated?)").
for n in 0 1; do
    "$PY" -c 'import struct, sys
n = int(sys.argv[2]); header = [20240520, 1, n] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *header) + b"\x41\x00" * n)' "$WORK/short$n.bin" $n
done
expect_error "a token file of no token" 1 "short0.bin: holds 0 tokens; a token file needs at least 2" \
    "$TRAIN" $TINY --data "$WORK/short0.bin"
expect_error "a token file of one token" 1 "short1.bin: holds 1 token; a token file needs at least 2" \
    "$TRAIN" $TINY --data "$WORK/short1.bin"
# A count below 0 in the header: said so (it was "header says -5 tokens, the
# file holds 200 (truncated?)").
"$PY" -c 'import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, -5, *[0] * 253) + b"\x41\x00" * 200)' "$WORK/negative.bin"
expect_error "a token file whose header counts -5 tokens" 1 "negative.bin: header says -5 tokens: a count below 0 \\(a damaged header\\)" \
    "$TRAIN" $TINY --data "$WORK/negative.bin"
expect_error "--min-lr above --lr: a usage error (the rate grew all run long)" 2 "--min-lr 1 is above --lr 0.001" \
    "$TRAIN" $TINY --lr 0.001 --min-lr 1
expect_error "no file matches --data" 1 "nothing.*bin" "$TRAIN" $TINY --data "$WORK/nothing*.bin"
# Three files of 20 tokens, 60 in all, seq 32: no file holds a window, and
# every sample was 33 zeros (exit 0).
for n in 1 2 3; do printf 'abcdefghijklmnopqrs%d' $n >"$WORK/few$n.txt"; "$TRAIN" prepare "$WORK/few$n.txt" -o "$WORK/few$n.bin"; done
expect_error "files each shorter than a sequence: refused" 1 "few\*.bin: 20 tokens in its longest file, fewer than a window of 33 \\(--seq 32 \\+ 1; a sample is a window inside one file\\)" \
    "$TRAIN" $TINY --data "$WORK/few*.bin"
# A file whose name reads as a pattern is that file (it was globbed: "no such
# token file", or another file matching the pattern).
cp "$WORK/tokens_0.bin" "$WORK/shard[1].bin"
cp "$WORK/bad.bin" "$WORK/shard1.bin" # what the pattern matches: not a token file
expect_ok "--data names a file with brackets in its name: that file, not what it matches" "$TRAIN" $TINY --steps 2 \
    --data "$WORK/shard[1].bin"
# More bytes than the header counts: uint32 ids (every other token read as 0), or a damaged header.
"$PY" -c 'import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, 100, *[0] * 253) + struct.pack("<100I", *range(100)))' "$WORK/wide.bin"
expect_error "a token file of uint32 ids: refused" 1 "wide.bin: header says 100 tokens \(200 bytes of uint16\), the file holds 400 bytes" \
    "$TRAIN" $TINY --data "$WORK/wide.bin"
expect_error "token ids beyond the vocabulary" 1 "tokens_0.bin.*vocab" "$TRAIN" $TINY --vocab 64 --data "$WORK/tokens_0.bin"
# --- llm.c's Llama-3 token files (docs/DATA.md): magic 20240801, version 7, uint32 tokens, written as llm.c's
# dev/data/data_common.py write_datafile writes them. They were refused ("not a token file (magic 20240801,
# expected 20240520)"), so a vocabulary over 65536 trained on synthetic data only.
"$PY" - "$WORK" <<'PYEOF'
import sys, numpy as np
work = sys.argv[1]
def write_datafile(filename, toks, model_desc):
    info = {"gpt-2": (20240520, 1, np.uint16), "llama-3": (20240801, 7, np.uint32)}[model_desc]
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = info[0], info[1], len(toks)
    with open(filename, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(toks, dtype=info[2]).tobytes())
rng = np.random.default_rng(3)
# A vocabulary of 70000: half the ids above uint16's range.
big = np.where(rng.random(4000) < 0.5, rng.integers(65536, 70000, 4000), rng.integers(0, 65536, 4000))
write_datafile(work + "/llama3_big.bin", big, "llama-3")
# The same ids below 65536 in both formats, and split in two files of either width.
ids = (np.arange(4000) * 7919 + rng.integers(0, 50, 4000)) % 65536
write_datafile(work + "/same_u16.bin", ids, "gpt-2")
write_datafile(work + "/same_u32.bin", ids, "llama-3")
write_datafile(work + "/mixed_0.bin", ids[:1500], "gpt-2")
write_datafile(work + "/mixed_1.bin", ids[1500:], "llama-3")
PYEOF
L3="--model tiny --vocab 70000 --micro-batch 2 --quiet --steps 3"
expect_ok "train on an llm.c Llama-3 file (uint32 ids above 65535, vocabulary 70000)" "$TRAIN" $L3 \
    --data "$WORK/llama3_big.bin" --ckpt-dir "$WORK/l3run"
expect_ok "eval on an llm.c Llama-3 file" "$TRAIN" eval --ckpt "$WORK/l3run" --data "$WORK/llama3_big.bin" --json
check "eval on an llm.c Llama-3 file: a finite loss over its windows" "$PY" -c 'import json, math, sys
r = json.load(open(sys.argv[1])); sys.exit(not (math.isfinite(r["loss"]) and r["windows"] == 3999 // 32))' "$WORK/.out"
# The same ids as uint16 and as uint32: the same batches, gradients and losses, bit for bit.
for w in u16 u32; do
    expect_ok "train on the same ids as $w" "$TRAIN" $L3 --data "$WORK/same_$w.bin" --log "$WORK/same_$w.jsonl" \
        --dump "$WORK/dump_$w"
    expect_ok "eval on the same ids as $w" "$TRAIN" eval --ckpt "$WORK/l3run" --data "$WORK/same_$w.bin" --json
    cp "$WORK/.out" "$WORK/eval_$w.json"
done
check "uint16 and uint32 files of the same ids: the same training losses" \
    losses_match "$WORK/same_u32.jsonl" "$WORK/same_u16.jsonl" 0
check "uint16 and uint32 files of the same ids: the same batches (--dump)" \
    cmp "$WORK/dump_u32/batches.bin" "$WORK/dump_u16/batches.bin"
for part in logits grads; do
    expect_ok "uint16 and uint32 files of the same ids: step 1's $part bit for bit" "$BIN/tp-ckpt" diff \
        "$WORK/dump_u32/$part" "$WORK/dump_u16/$part"
done
# same_eval A.json B.json: two evaluations (--json) of the same windows with the same loss, as printed (%.9g).
same_eval() {
    "$PY" -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print("    %r and %r" % (a, b))
sys.exit(not (a == b and a["windows"] > 0))' "$1" "$2"
}
check "uint16 and uint32 files of the same ids: the same eval loss" same_eval "$WORK/eval_u32.json" "$WORK/eval_u16.json"
# One glob of both widths is one stream: eval's loss is the single file's.
expect_ok "eval on a glob of a uint16 and a uint32 file" "$TRAIN" eval --ckpt "$WORK/l3run" --data "$WORK/mixed_*.bin" --json
check "a glob of both widths: the eval loss of the same ids in one file" same_eval "$WORK/.out" "$WORK/eval_u16.json"
# The pair of magic and version is checked whole: GPT-2's magic with Llama-3's version is neither format.
"$PY" -c 'import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 7, 100, *[0] * 253) + struct.pack("<100I", *range(100)))' \
    "$WORK/pair.bin"
expect_error "magic 20240520 with version 7: refused, naming both known pairs" 1 \
    "pair.bin: not a token file of a known format \(magic 20240520, version 7; known: magic 20240520 version 1, uint16 tokens .*magic 20240801 version 7, uint32 tokens" \
    "$TRAIN" $TINY --data "$WORK/pair.bin"
# Files shorter than a window (seq + 1 = 33) are never sampled in training, while eval's stream reads them: said
# once, on rank 0, the first three named with their tokens, then how many more; the run goes on.
mkdir "$WORK/shortglob"
"$PY" - "$WORK/shortglob" <<'PYEOF'
import sys, numpy as np
for name, n in [("a", 40), ("b", 20), ("c", 100), ("d", 10), ("e", 32), ("f", 5), ("g", 1000)]:
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    with open("%s/%s.bin" % (sys.argv[1], name), "wb") as f:
        f.write(header.tobytes())
        f.write((np.arange(n) % 90).astype(np.uint16).tobytes())
PYEOF
expect_ok "train on a glob with files shorter than a window (2 ranks)" mpi_train 2 $TINY --steps 2 --dp 2 --micro-batch 1 \
    --data "$WORK/shortglob/*.bin"
check_all "files shorter than a window: one warning naming them and the window" '[ "$(grep -c "warning" "$WORK/.err")" -eq 1 ] &&
    grep -q "^tp-train: warning: --data .*/shortglob/\*.bin: .*/shortglob/b.bin (20 tokens), .*/shortglob/d.bin (10 tokens), .*/shortglob/e.bin (32 tokens) and 1 more: hold fewer tokens than a window of 33 (--seq 32 + 1), never sampled in training" "$WORK/.err"'
expect_ok "train on a glob of files that all hold a window" "$TRAIN" $TINY --steps 2 --data "$WORK/shortglob/[acg].bin"
check_all "no file shorter than a window: no warning" '! grep -q "warning" "$WORK/.err"'
# Every file of --data stays open for the run: 1,100 shards under a soft
# limit of 1024 descriptors ended the run at start ("Too many open files");
# tp-train raises its soft limit to the hard one, and where the hard one is
# too low the error says why.
mkdir "$WORK/many"
"$PY" - "$WORK/many" <<'PYEOF'
import struct, sys
for i in range(1100):
    open("%s/s%05d.bin" % (sys.argv[1], i), "wb").write(struct.pack("<256i", 20240520, 1, 40, *[0] * 253) +
                                                        struct.pack("<40H", *[(i + j) % 90 for j in range(40)]))
PYEOF
if [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -gt 1200 ]; then
    expect_ok "1,100 token files under a soft limit of 1024 descriptors" \
        sh -c 'ulimit -S -n 1024 && exec "$@"' sh "$TRAIN" $TINY --steps 1 --data "$WORK/many/*.bin"
else
    echo "[SKIP] [$NAME] 1,100 files under a soft limit of 1024: the hard limit is $(ulimit -Hn)"
fi
expect_error "1,100 token files under a hard limit of 1024: said why" 1 \
    "many/\*.bin matches 1100 files, each held open for the run; the process may open fewer \(ulimit -n" \
    sh -c 'ulimit -n 1024 && exec "$@"' sh "$TRAIN" $TINY --steps 1 --data "$WORK/many/*.bin"
# A token file changed under a running trainer: cut short, it killed the
# trainer with SIGBUS (exit 135, no message: the file was mapped); rewritten
# in place with ids past the vocabulary, it fed them to the embedding. Each
# window is now read, and checked: one error naming the file, exit 1.
# change_under_training NAME CHANGE...: a long run on a copy of tokens_0.bin
# (one rank), CHANGE run on the copy once step 2 is logged.
change_under_training() {
    name=$1
    shift
    cp "$WORK/tokens_0.bin" "$WORK/$name.bin"
    rm -f "$WORK/$name.jsonl"
    "$TRAIN" --model tiny --quiet --micro-batch 4 --steps 100000 --data "$WORK/$name.bin" --log "$WORK/$name.jsonl" \
        </dev/null >"$WORK/.out" 2>"$WORK/.err" &
    changing=$!
    wait_for_step "$WORK/$name.jsonl" 2 60
    "$@" "$WORK/$name.bin"
    wait "$changing"
    RC=$?
}
change_under_training cut truncate -s 1100
check_all "a token file cut short under training: exit 1, one line naming it" '[ "$RC" -eq 1 ] &&
    [ "$(wc -l <"$WORK/.err")" -eq 1 ] && grep -Eq "cut.bin: ends before token [0-9]+, though it held [0-9]+ tokens when opened" "$WORK/.err"'
# Every id 0xffff (a vocabulary of 256), the size unchanged.
overwrite_tokens() {
    "$PY" -c 'import os, sys; n = os.path.getsize(sys.argv[1]) - 1024
f = open(sys.argv[1], "r+b"); f.seek(1024); f.write(b"\xff" * n)' "$1"
}
change_under_training rewritten overwrite_tokens
check_all "a token file rewritten under training with ids past the vocabulary: exit 1, one line naming it" '[ "$RC" -eq 1 ] &&
    [ "$(wc -l <"$WORK/.err")" -eq 1 ] && grep -Eq "rewritten.bin: token 65535 at position [0-9]+ is outside the vocabulary of 256" "$WORK/.err"'

# --- prepare's output (docs/DATA.md "Writing a token file"): an existing one replaced only with --force and only
# when it is a token file; the input never, by any path; written under a staging name of its own, nothing left
# behind on a refusal or a signal (the fixed FILE.tmp it used was destroyed, shared and left by ^C).
P="$WORK/prep"
mkdir -p "$P"
printf 'my precious corpus\n' >"$P/corpus.txt"
cp "$P/corpus.txt" "$P/corpus.orig"
ln -s corpus.txt "$P/link.txt"
ln "$P/corpus.txt" "$P/hard.txt"
printf 'not the token file\n' >"$P/tokens.bin.tmp" # at the name the old temporary took
for out in corpus.txt link.txt hard.txt ../prep/./corpus.txt; do
    for force in "" --force; do
        expect_error "prepare: the input as -o $out $force: refused" 1 "$out is the input .*corpus.txt.*even with --force" \
            "$TRAIN" prepare "$P/corpus.txt" -o "$P/$out" $force
    done
done
expect_error "prepare: the input through a link, -o the file itself --force: refused" 1 "corpus.txt is the input .*link.txt" \
    "$TRAIN" prepare "$P/link.txt" -o "$P/corpus.txt" --force
check "prepare: the input is as it was" cmp -s "$P/corpus.txt" "$P/corpus.orig"
# A text of more bytes than a token file counts (int32): refused before a
# byte is written (it wrote all of it, 2 bytes a byte, then failed).
truncate -s 3G "$P/huge.txt"
expect_error "prepare: a text over 2^31 - 1 bytes: refused at once" 1 "huge.txt: 3221225472 bytes: a token file holds 2 to 2147483647 tokens" \
    "$TRAIN" prepare "$P/huge.txt" -o "$P/huge.bin"
check "prepare: nothing left of it" [ -z "$(ls -A "$P" | grep huge.bin)" ]
rm -f "$P/huge.txt"
expect_ok "prepare: a new output" "$TRAIN" prepare "$P/corpus.txt" -o "$P/tokens.bin"
cp "$P/tokens.bin" "$P/tokens.first"
head -c 3000 "$WORK/text.txt" >"$P/other.txt"
expect_error "prepare: an existing output without --force: refused" 1 "tokens.bin already exists.*--force" \
    "$TRAIN" prepare "$P/other.txt" -o "$P/tokens.bin"
check "prepare: the refused output is as it was" cmp -s "$P/tokens.bin" "$P/tokens.first"
expect_ok "prepare --force: an earlier output replaced" "$TRAIN" prepare "$P/other.txt" -o "$P/tokens.bin" --force
expect_ok "prepare: the same text to a new output" "$TRAIN" prepare "$P/other.txt" -o "$P/other.bin"
check "prepare --force: the replaced output holds the new text's tokens" cmp -s "$P/tokens.bin" "$P/other.bin"
expect_error "prepare --force over a text file: refused, saying what it is" 1 \
    "other.txt: not a token file.*--force replaces only a token file" "$TRAIN" prepare "$P/corpus.txt" -o "$P/other.txt" --force
mkdir "$P/dir"
expect_error "prepare --force over a directory: refused, saying what it is" 1 "dir is a directory, not a token file" \
    "$TRAIN" prepare "$P/corpus.txt" -o "$P/dir" --force
head -c 2000 "$P/other.bin" >"$P/cut.bin"
expect_error "prepare --force over a truncated token file: refused" 1 "cut.bin: header says 3000 tokens.*truncated" \
    "$TRAIN" prepare "$P/corpus.txt" -o "$P/cut.bin" --force
check_all "prepare: the file at the old temporary name is as it was, and no temporary or staging is left" \
    '[ "$(cat "$P/tokens.bin.tmp")" = "not the token file" ] &&
    [ "$(ls -A "$P" | tr "\n" " ")" = "corpus.orig corpus.txt cut.bin dir hard.txt link.txt other.bin other.txt tokens.bin tokens.bin.tmp tokens.first " ]'
# A signal part-way: the corpus comes through a FIFO, 4 MiB at once and the rest never, so that prepare is
# certainly writing it (its staging file holding those tokens) when the signal comes, however fast the machine.
# A script's background job starts with SIGINT ignored, which the program keeps (programs/cli.h
# cli_catch_signal); `set -m` would undo that, but dash turns job control down without a terminal: env does it.
mkfifo "$P/corpus.fifo"
for sig in INT TERM HUP; do
    case $sig in INT) code=130 ;; TERM) code=143 ;; HUP) code=129 ;; esac
    { head -c 4194304 /dev/zero | tr '\0' a; exec sleep 300; } >"$P/corpus.fifo" &
    writer=$!
    env --default-signal=INT,TERM,HUP "$TRAIN" prepare "$P/corpus.fifo" -o "$P/big.bin" 2>"$WORK/.err" &
    pid=$!
    part_way=0 i=0
    while [ $i -lt 600 ]; do # 60 s at most
        staged=$(ls -A "$P" | grep '^\.big\.bin\..*\.staging$')
        if [ -n "$staged" ] && [ "$(stat -c %s "$P/$staged" 2>/dev/null || echo 0)" -ge $((1024 + 2 * 4194304)) ]; then
            part_way=1
            break
        fi
        sleep 0.1
        i=$((i + 1))
    done
    kill -$sig $pid
    wait $pid 2>/dev/null
    rc=$?
    kill $writer 2>/dev/null
    wait $writer 2>/dev/null
    check_all "prepare: SIG$sig part-way (4 MiB written: $part_way): died of it (exit $rc), no output, no staging left" \
        '[ $part_way = 1 ] && [ $rc -eq $code ] && [ ! -e "$P/big.bin" ] && [ -z "$(ls -A "$P" | grep -e staging -e big)" ]'
done

# --- Fault injection (a testing aid for tp-elastic): after step 3 on rank R,
# die (SIGKILL), fail (exit 1) or hang; --fault-once fires only while its file
# does not exist; fail-at-start fails every launch.
FAULT="--model tiny --micro-batch 2 --quiet --tp 2 --steps 6"
run mpi_train 2 $FAULT --fault die --fault-step 3 --fault-rank 1 --log "$WORK/die.jsonl"
check_all "die on rank 1 after step 3: mpirun exits non-zero, the log ends at step 3 without a stop line" \
    '[ "$RC" -ne 0 ] && [ "$(last_step "$WORK/die.jsonl")" = 3 ] && [ -z "$(events "$WORK/die.jsonl" stop reason)" ]'
run mpi_train 2 $FAULT --fault fail --fault-step 3 --fault-rank 1 --log "$WORK/fail1.jsonl"
check_all "fail on rank 1: exit 1, its error line" '[ "$RC" -eq 1 ] && [ "$(last_step "$WORK/fail1.jsonl")" = 3 ] &&
    grep -q "^tp-train: error (rank 1): injected failure after step 3 (--fault fail)" "$WORK/.err"'
run mpi_train 2 $FAULT --fault fail --fault-step 3 --log "$WORK/fail0.jsonl"
check_all "fail on rank 0: exit 1, a stop line (failed) with the error" '[ "$RC" -eq 1 ] &&
    [ "$(events "$WORK/fail0.jsonl" stop reason)$(events "$WORK/fail0.jsonl" stop step)" = "failed 3 " ] &&
    grep -q "\"error\":\"injected failure after step 3" "$WORK/fail0.jsonl"'
# hang: mpirun in a session of its own; still running 4 s after step 3, no
# step past 3. Rank 0, waiting for the hung rank at a collective, sleeps
# (trainer/comm_mpi.c wait_politely): the two ranks take under a fifth of a
# core over 3 s of the hang (a rank polling in MPI's blocking call takes a
# whole one).
setsid mpirun --oversubscribe -np 2 "$TRAIN" $FAULT --steps 100000 --fault hang --fault-step 3 --fault-rank 1 \
    --log "$WORK/hang.jsonl" </dev/null >"$WORK/.out" 2>"$WORK/.err" &
hung=$!
wait_for_step "$WORK/hang.jsonl" 3 30 || true # the check below says what came of it
sleep 1
# ranks_ticks: the processor time of the run's ranks so far, in clock ticks.
ranks_ticks() {
    for pid in $(pgrep -s "$hung" -x tp-train); do cut -d' ' -f14,15 "/proc/$pid/stat" 2>/dev/null; done |
        awk '{t += $1 + $2} END {print t + 0}'
}
before=$(ranks_ticks)
sleep 3
spent=$(($(ranks_ticks) - before))
ticks=$(getconf CLK_TCK)
if kill -0 "$hung" 2>/dev/null && [ "$(last_step "$WORK/hang.jsonl")" = 3 ]; then pass
else failed "hang on rank 1 after step 3: not running 4 s after it, or not stuck at step 3"; fi
check "hang: the waiting rank sleeps (the ranks took $spent ticks of $ticks a second over 3 s)" \
    [ "$spent" -lt $((3 * ticks / 5)) ]
kill -KILL "-$hung" # dash: no "--"
wait "$hung"
RC=$?
# Open MPI puts each rank in a process group of its own; with mpirun gone they end by themselves.
waited=0
while [ -n "$(pgrep -s "$hung")" ] && [ $waited -lt 150 ]; do sleep 0.1; waited=$((waited + 1)); done
left=$(pgrep -s "$hung" | tr '\n' ' ')
[ -n "$left" ] && kill -KILL $left
check_all "hang: SIGKILL of mpirun's process group ends it (137), the ranks follow within 15 s (left: $left)" \
    '[ "$RC" -eq 137 ] && [ -z "$left" ]'
# once: the first launch dies after step 3 and leaves the marker; the relaunch passes step 3.
# (--sync-save: step 2's checkpoint is committed before step 3 ends.)
ONCE="$FAULT --fault die --fault-step 3 --fault-once $WORK/fired --ckpt-dir $WORK/once --ckpt-every 2 --sync-save --resume
    --log $WORK/once.jsonl"
run mpi_train 2 $ONCE
check_all "fault-once: the first launch dies after step 3, the marker is made" '[ "$RC" -ne 0 ] && [ -e "$WORK/fired" ] &&
    [ "$(last_step "$WORK/once.jsonl")" = 3 ]'
expect_ok "fault-once: the relaunch passes step 3" mpi_train 2 $ONCE
check_all "fault-once: resumed from step 2, finished at 6" '[ "$(events "$WORK/once.jsonl" start resumed_from)" = "null step_00000002 " ] &&
    [ "$(events "$WORK/once.jsonl" stop reason)" = "finished " ] && [ "$(last_step "$WORK/once.jsonl")" = 6 ]'
# A trainer killed once the checkpoint of its stop is committed (a grace
# period that ends, as Slurm's after a requeue under load) has logged that
# step: the line comes before the synchronous save of a stop.
run env TP_CKPT_FAULT=before-latest "$TRAIN" $TINY --steps 10 --ckpt-every 100 --stop-at 4 --ckpt-dir "$WORK/stopkill" \
    --log "$WORK/stopkill.jsonl"
check_all "killed after the stop checkpoint's commit: step 4 committed, and in the log" \
    '[ "$RC" -eq 137 ] && [ -d "$WORK/stopkill/step_00000004" ] && [ "$(last_step "$WORK/stopkill.jsonl")" = 4 ]'
expect_ok "--fault slow: the run goes on" "$TRAIN" $TINY --steps 4 --fault slow --fault-step 2 --log "$WORK/slow.jsonl"
check "--fault slow: a 3 s pause after step 2, none elsewhere" "$PY" -c '
import json, sys
t = {l["step"]: l["time"] for l in map(json.loads, open(sys.argv[1])) if "event" not in l}
sys.exit(not (t[3] - t[2] >= 2.9 and t[2] - t[1] < 2 and t[4] - t[3] < 2))' "$WORK/slow.jsonl"
mpi_error "fail-at-start: exit 1 before training" "^tp-train: error: injected failure at start" 2 $FAULT --fault fail-at-start
check "fail-at-start: exit 1" [ "$RC" -eq 1 ]
expect_error "--fault of an unknown kind" 2 "fault takes die, hang, fail, slow, slow-steps or fail-at-start, not 'bogus'" "$TRAIN" $TINY --fault bogus
expect_error "--fault die without --fault-step" 2 "fault die needs --fault-step" "$TRAIN" $TINY --fault die
expect_error "--fault-rank beyond the ranks" 2 "fault-rank 1, but there are 1 ranks" "$TRAIN" $TINY --fault die --fault-step 1 --fault-rank 1
# A detail of a fault without the fault did nothing and was accepted.
expect_error "--fault-step without --fault" 2 "^tp-train: --fault-step details a fault injection: it needs --fault" \
    "$TRAIN" $TINY --steps 2 --fault-step 1
expect_error "--fault-once without --fault" 2 "^tp-train: --fault-once details a fault injection: it needs --fault" \
    "$TRAIN" $TINY --steps 2 --fault-once "$WORK/never"
expect_error "--fault-rank without --fault" 2 "--fault-rank details a fault injection" "$TRAIN" $TINY --fault-rank 0
expect_error "--fault-once beside slow-steps" 2 "--fault-once does not apply to --fault slow-steps" "$TRAIN" $TINY \
    --fault slow-steps --fault-step 1 --fault-once "$WORK/never"
expect_error "--fault-step beside fail-at-start" 2 "fail-at-start .*--fault-step does not apply" "$TRAIN" $TINY \
    --fault fail-at-start --fault-step 1
check "and no marker was made" [ ! -e "$WORK/never" ]

# --- Bad input: one clear line before any work.
expect_ok "--help" "$TRAIN" --help
# tp-mpirun (a GPU pack's launcher, also built here) says what it is, outside
# a pack too (it said only that the pack's mpirun was not found, exit 127).
expect_ok "tp-mpirun --help outside a pack" "$BIN/tp-mpirun" --help
check "tp-mpirun --help: its usage" grep -q "^usage: tp-mpirun" "$WORK/.out"
expect_error "unknown option" 2 "unknown option.*--bogus" "$TRAIN" --bogus

# --- The device (--device cpu|cuda|auto). A machine without a GPU trains on
# the CPU under auto and refuses cuda, saying why; every start line names
# the device.
expect_ok "--device cpu" "$TRAIN" $TINY --steps 2 --device cpu --log "$WORK/cpu.jsonl"
check "--device cpu: the start line says cpu" [ "$(events "$WORK/cpu.jsonl" start device)" = "cpu " ]
if nvidia-smi -L >/dev/null 2>&1; then
    echo "[$NAME] SKIP --device auto and cuda without a GPU: this machine has one (make test-gpu runs the GPU tests)"
else
    expect_ok "--device auto without a GPU" "$TRAIN" $TINY --steps 2 --log "$WORK/auto.jsonl"
    check "--device auto without a GPU: the CPU" [ "$(events "$WORK/auto.jsonl" start device)" = "cpu " ]
    expect_error "--device cuda without a GPU: refused, saying why" 1 \
        "^tp-train: error: --device cuda: (this build has no CUDA support|no CUDA device)" "$TRAIN" $TINY --device cuda
    expect_error "--device cuda --share-gpus without a GPU: refused the same" 1 \
        "^tp-train: error: --device cuda: (this build has no CUDA support|no CUDA device)" "$TRAIN" $TINY --device cuda \
        --share-gpus
    run mpi_train 2 $TINY --tp 2 --device cuda
    check_all "--device cuda under mpirun: exit 1, rank 0 says why, once" \
        '[ "$RC" -ne 0 ] && [ "$(grep -c "^tp-train: error" "$WORK/.err")" -eq 1 ]'
fi
expect_error "--device gpu: not a device" 2 "--device takes cpu, cuda or auto, not 'gpu'" "$TRAIN" $TINY --device gpu
expect_error "--share-gpus without --device cuda" 2 "--share-gpus applies to --device cuda" "$TRAIN" $TINY --share-gpus
expect_error "--share-gpus with --device auto" 2 "--share-gpus applies to --device cuda" "$TRAIN" $TINY --share-gpus \
    --device auto
expect_error "--resume without --ckpt-dir" 2 "resume.*ckpt-dir" "$TRAIN" $TINY --resume
# A --log rank 0 cannot write is refused before training (it warned "not
# logging", trained, exit 0: a run whose metrics a script reads, without them).
expect_error "--log in a missing directory: refused" 1 "^tp-train: error: --log $WORK/none/x.jsonl: cannot write it: No such file or directory$" \
    "$TRAIN" $TINY --steps 2 --log "$WORK/none/x.jsonl"
expect_error "--log naming a directory: refused" 1 "^tp-train: error: --log $WORK: cannot write it: Is a directory$" \
    "$TRAIN" $TINY --steps 2 --log "$WORK"
check "nothing trained (no step printed)" sh -c '! grep -q "^step " "$1"' sh "$WORK/.out"
# The checkpoints' options without --ckpt-dir saved nothing without a word.
# (Said, not refused: a reference run shares an orchestrated run's options.)
for option in "--ckpt-every 2" --sync-save "--ckpt-cache $WORK/cache"; do
    expect_ok "${option%% *} without --ckpt-dir: trains" "$TRAIN" $TINY --steps 3 $option
    check "and says no checkpoint is written" \
        grep -q "^tp-train: warning: ${option%% *} without --ckpt-dir: no checkpoint is written$" "$WORK/.err"
done
run "$TRAIN" $TINY --dim 128 --steps 22 --ckpt-dir "$WORK/run" --resume
check_all "resume with another model shape: refused at the newest checkpoint (a usage error), both shapes named, no fallback" \
    '[ "$RC" -eq 2 ] && [ "$(wc -l <"$WORK/.err")" -eq 1 ] &&
    grep -q "^tp-train: error: .*holds another model: .*dim 64 .*this run has .*dim 128 .*: resume with the model flags" \
    "$WORK/.err" && ! grep -q "unusable\|falling back\|no intact" "$WORK/.err"'
# A layout the command line asks for that the model or the ranks do not
# make is a usage error (exit 2), as the other layout checks (--virtual-stages,
# --sequence-parallel): it was 1, which a retrying job script takes for a
# failure worth retrying.
mpi_error "ranks != tp x pp x dp" "tp 2 x --pp 2 x --dp 1 = 4 ranks, but 3 .*\(see tp-train --help\)$" 3 $TINY --tp 2 \
    --pp 2 --dp 1
check "exit 2 ($RC)" [ "$RC" -eq 2 ]
mpi_error "heads not divisible by tp" "heads 4 is not divisible by tp 3 \(see tp-train --help\)$" 3 $TINY --tp 3
check "exit 2 ($RC)" [ "$RC" -eq 2 ]
mpi_error "layers not divisible by pp" "layers 3 is not divisible by pp 2" 2 $TINY --layers 3 --pp 2
check "exit 2 ($RC)" [ "$RC" -eq 2 ]
# A usage error met before MPI starts is said by the first rank alone, in
# one piece (each rank wrote its own in three: "tp-train: tp-train: ...").
mpi_error "a usage error under mpirun: one line" "^tp-train: --sequence-parallel: micro-batch 1 x sequence 33 = 33 rows do not divide over tp 2 \(see tp-train --help\)$" \
    2 $TINY --tp 2 --micro-batch 1 --seq 33 --sequence-parallel
check "exit 2 ($RC)" [ "$RC" -eq 2 ]

finish
