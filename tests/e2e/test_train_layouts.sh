#!/bin/sh
# Resume across every pair of a set of layouts that mix the parallelism
# options (issue 27): tensor, pipeline and data parallelism, sequence
# parallelism, the interleaved schedule, ZeRO-1 and ZeRO-3. Each layout trains 5
# steps straight, saving after step 3; every layout's step-3 checkpoint is
# then resumed at every layout for steps 4 and 5. Same layout: the losses of
# its straight run (1e-6); another layout: those of the one-rank run (1e-4).
# The global batch (8 sequences) is the same everywhere, so the data each
# step sees is too.
# tier: full
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train_lib.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
MODEL="--model tiny --layers 4 --micro-batch 1 --global-batch 8 --steps 5 --quiet"

# name|ranks|options
LAYOUTS="one|1|
tp2dp2-sp-zero1|4|--tp 2 --dp 2 --sequence-parallel --zero 1
pp2v2dp2-zero3|4|--pp 2 --dp 2 --virtual-stages 2 --zero 3
tp2pp2v2-sp|4|--tp 2 --pp 2 --virtual-stages 2 --sequence-parallel
dp4-zero1|4|--dp 4 --zero 1"

layouts() { printf '%s\n' "$LAYOUTS"; }

# Straight runs, each leaving its checkpoint of step 3.
while IFS='|' read -r name ranks options; do
    # shellcheck disable=SC2086 # options are words
    expect_ok "5 straight steps at $name, a save after step 3" mpi_train "$ranks" $MODEL $options \
        --ckpt-dir "$WORK/$name" --ckpt-every 3 --log "$WORK/$name.jsonl"
    check "$name saved step 3" [ -f "$WORK/$name/step_00000003/index.json" ]
    steps_from "$WORK/$name.jsonl" 4 5 >"$WORK/$name-4-5.jsonl"
    [ "$name" = one ] || check "$name's straight run has the one-rank losses (1e-4)" \
        losses_match "$WORK/$name.jsonl" "$WORK/one.jsonl" 1e-4
done <<EOF
$(layouts)
EOF

# Every checkpoint resumed at every layout.
while IFS='|' read -r from _ _; do
    while IFS='|' read -r to ranks options; do
        dir="$WORK/$from-to-$to"
        mkdir "$dir" && cp -r "$WORK/$from/step_00000003" "$dir/"
        # shellcheck disable=SC2086
        expect_ok "$from's step 3 resumed at $to" mpi_train "$ranks" $MODEL $options --ckpt-dir "$dir" --resume \
            --ckpt-every 100 --log "$dir/log.jsonl"
        if [ "$from" = "$to" ]; then
            check "$from resumed at its own layout: its straight losses (1e-6)" \
                losses_match "$dir/log.jsonl" "$WORK/$to-4-5.jsonl" 1e-6
        else
            check "$from resumed at $to: the one-rank losses (1e-4)" \
                losses_match "$dir/log.jsonl" "$WORK/one-4-5.jsonl" 1e-4
        fi
    done <<EOF
$(layouts)
EOF
done <<EOF
$(layouts)
EOF

finish
