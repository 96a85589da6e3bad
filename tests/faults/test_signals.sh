#!/bin/sh
# Signals (docs/RELIABILITY.md): SIGTERM and SIGINT at random instants of
# every writer (synth, reshard, import, exports in each format, Megatron-LM,
# DCP and torch_dist outputs, a Megatron-LM source read), spread over
# the whole of an uninterrupted run; and a signal inside the window where a
# staging entry is born, struck on purpose (TP_CKPT_FAULT=POINT:SIG), for
# every writer (tp-train prepare too) and for training saves. After each:
# the writer died of the signal (or finished first, with a whole output), no
# partial output, no staging entry and no claim left.
# takes: about 65 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
. "$(dirname "$0")/lib.sh"

expect_ok "source checkpoint" "$CK" synth -o "$WORK/src" --tp 2 --pp 1 $MODEL --optim --seed 1
expect_ok "an export to import from" "$CK" export "$WORK/src" --format safetensors -o "$WORK/st-src"
expect_ok "a Megatron-LM checkpoint to read from" "$RS" "$WORK/src" --format megatron --to tp2 -o "$WORK/meg-src"

# ------------------------------------------------------------ signals
# SIGTERM or SIGINT at a random instant: the partial output goes, the exit
# status is the signal's (or 0 when the write was done first). The eight
# writers' trials run at once, each writer in a directory of its own (a
# class's trials stay one after the other); signal_trials leaves its figures
# in $WORK/results/LABEL, and signals_checked makes the checks of them.
mkdir -p "$WORK/results"
signal_trials() {
    label=$1 out=$2 check_out=$3
    shift 3
    bad=0 hit=0 i=0 instants=""
    mkdir -p "$(dirname "$out")"
    rm -rf "$out"
    timed "$@"
    span=$(echo "$DURATION * 1.2" | bc)
    while [ $i -lt "$TRIALS" ]; do
        rm -rf "$out"
        sig=TERM code=143
        [ $((i % 2)) -eq 1 ] && sig=INT code=130
        # A background job of a shell without job control starts with SIGINT
        # ignored (POSIX), and the writers keep an ignored signal ignored:
        # each SIGINT trial ran to the end. env gives it its default back.
        env --default-signal=INT "$@" >/dev/null 2>&1 &
        pid=$!
        at=$(instant $i "$TRIALS" "$span" "$label")
        instants="$instants $at"
        sleep "$at"
        kill -$sig $pid 2>/dev/null
        wait $pid 2>/dev/null
        rc=$?
        if [ $rc -eq $code ]; then
            hit=$((hit + 1))
            [ -e "$out" ] && ! $check_out "$out" && bad=$((bad + 1))
        elif [ $rc -eq 0 ]; then
            $check_out "$out" || bad=$((bad + 1))
        else
            bad=$((bad + 1))
            echo "    $label: exit $rc after SIG$sig" >&2
        fi
        no_staging "$(dirname "$out")" || bad=$((bad + 1))
        i=$((i + 1))
    done
    echo "$bad $hit $span$instants" >"$WORK/results/$label"
}

# signals_checked LABEL: the check of what signal_trials LABEL found.
signals_checked() {
    read -r bad hit span instants <"$WORK/results/$1" || bad="no result"
    check "$1: $TRIALS signals: the signal's status, no partial output, no staging" [ "$bad" = 0 ]
    echo "[$NAME] signals: $1: $TRIALS trials over ${span}s, $hit interrupted, $bad bad"
    echo "[$NAME] signals: $1: signalled after (s): $instants"
}

# gguf_whole FILE, hdf5_whole FILE: the export of $WORK/src reads back whole
# and equal to it (the independent reader of tests/trainer/check_export.py).
gguf_whole() { "$PY" "$ROOT/tests/trainer/check_export.py" gguf "$1" "$WORK/src" >/dev/null 2>&1; }
hdf5_whole() { "$PY" "$ROOT/tests/trainer/check_export.py" hdf5 "$1" "$WORK/src" >/dev/null 2>&1; }

# The window between the clean-up and the death held open for 2 s
# (signal-cleaned:SLEEP:2): the writer, its staged output removed under it,
# fails meanwhile; the process must still end by the signal, not by that
# error's status (it ended with 1: test_signals' export trials in a fresh
# clone, once).
mkdir -p "$WORK/held"
for sig in TERM INT; do
    code=143
    [ $sig = INT ] && code=130
    # The signal raised in the middle of the export (its staging entry made),
    # the writer held half a second there, then going on into a removed entry.
    env TP_CKPT_FAULT=staging-renamed:$sig,signal-cleaned:SLEEP:2 "$CK" export "$WORK/src" --format safetensors \
        -o "$WORK/held/st" >/dev/null 2>&1
    rc=$?
    check "SIG$sig, the clean-up held open: the writer's failure does not win (exit $rc, expected $code)" [ "$rc" -eq $code ]
    check_all "SIG$sig, the clean-up held open: no staging, no partial output" \
        'no_staging "$WORK/held" && { [ ! -e "$WORK/held/st" ] || safetensors_whole "$WORK/held/st"; }'
    rm -rf "$WORK/held/st"
done

signal_trials "synth" "$WORK/s-sy/sy" intact "$CK" synth -o "$WORK/s-sy/sy" --tp 2 --pp 1 $MODEL --optim &
p1=$!
signal_trials "reshard" "$WORK/s-rs/rs" intact "$RS" "$WORK/src" --to tp4 -o "$WORK/s-rs/rs" &
p2=$!
signal_trials "import" "$WORK/s-im/im" intact "$CK" import "$WORK/st-src" -o "$WORK/s-im/im" --tp 2 --pp 1 &
p3=$!
signal_trials "export" "$WORK/s-st/st" safetensors_whole "$CK" export "$WORK/src" --format safetensors -o "$WORK/s-st/st" &
p4=$!
signal_trials "export gguf" "$WORK/s-gguf/x.gguf" gguf_whole "$CK" export "$WORK/src" --format gguf -o "$WORK/s-gguf/x.gguf" &
p5=$!
signal_trials "export hdf5" "$WORK/s-h5/x.h5" hdf5_whole "$CK" export "$WORK/src" --format hdf5 -o "$WORK/s-h5/x.h5" &
p6=$!
signal_trials "reshard to Megatron-LM" "$WORK/s-meg/meg" intact "$RS" "$WORK/src" --format megatron --to tp4 \
    -o "$WORK/s-meg/meg" &
p7=$!
signal_trials "reshard Megatron-LM to DCP" "$WORK/s-dcp/dcp" intact "$RS" "$WORK/meg-src" --format dcp --to tp1 \
    -o "$WORK/s-dcp/dcp" &
p8=$!
signal_trials "reshard Megatron-LM to torch_dist" "$WORK/s-td/td" intact "$RS" "$WORK/meg-src" --format torch_dist \
    --to tp1 -o "$WORK/s-td/td" &
p9=$!
wait $p1 $p2 $p3 $p4 $p5 $p6 $p7 $p8 $p9
for label in synth reshard import export "export gguf" "export hdf5" "reshard to Megatron-LM" "reshard Megatron-LM to DCP" \
    "reshard Megatron-LM to torch_dist"; do
    signals_checked "$label"
done

# ------------------------------------------- a signal as a staging entry is born
# The window that random instants seldom hit: the staging entry's claim made
# but not yet locked, or renamed to its staging name but not yet registered
# for the clean-up. TP_CKPT_FAULT=POINT:SIG raises the signal there and holds
# the writer inside the window (docs/FORMAT.md "Test hook"), so that the
# clean-up runs while it is open. The writer dies of the signal and leaves
# neither a claim nor a staging entry, for every writer.
mkdir -p "$WORK/w"
head -c 100000 /dev/urandom >"$WORK/corpus.txt" # tp-train prepare's text
bad=0 n=0
for point in staging-claimed staging-renamed; do
    for writer in synth reshard import export-st export-gguf export-hdf5 megatron dcp torch_dist prepare; do
        case $n in 0) sig=TERM code=143 ;; 1) sig=INT code=130 ;; *) sig=HUP code=129 ;; esac
        n=$(((n + 1) % 3))
        case $writer in
        synth) set -- "$CK" synth -o "$WORK/w/out" --tp 2 --pp 1 --model tiny ;;
        reshard) set -- "$RS" "$WORK/src" --to tp4 -o "$WORK/w/out" ;;
        import) set -- "$CK" import "$WORK/st-src" -o "$WORK/w/out" --tp 2 --pp 1 ;;
        export-st) set -- "$CK" export "$WORK/src" --format safetensors -o "$WORK/w/out" ;;
        export-gguf) set -- "$CK" export "$WORK/src" --format gguf -o "$WORK/w/out" ;;
        export-hdf5) set -- "$CK" export "$WORK/src" --format hdf5 -o "$WORK/w/out" ;;
        megatron) set -- "$RS" "$WORK/src" --format megatron --to tp4 -o "$WORK/w/out" ;;
        dcp) set -- "$RS" "$WORK/meg-src" --format dcp --to tp1 -o "$WORK/w/out" ;;
        torch_dist) set -- "$RS" "$WORK/meg-src" --format torch_dist --to tp1 -o "$WORK/w/out" ;;
        prepare) set -- "$TRAIN" prepare "$WORK/corpus.txt" -o "$WORK/w/out" ;;
        esac
        run with_fault $point:$sig "$@"
        left=$(ls -A "$WORK/w")
        if [ "$RC" -ne $code ] || [ -n "$left" ]; then
            bad=$((bad + 1))
            echo "    $writer, SIG$sig at $point: exit $RC (expected $code), left: ${left:-nothing}" >&2
        fi
        rm -rf "$WORK/w"/* "$WORK/w"/.[!.]*
    done
done
check "a signal as the staging entry is born: 20 writers died of it, nothing left" [ "$bad" -eq 0 ]

# A signal ignored when the program starts (nohup; a background job of a
# script) stays ignored: the writer is not stopped by it and publishes a whole
# output. The hook raises the signal in the window, so it certainly comes.
run with_fault staging-claimed:HUP env --ignore-signal=HUP "$CK" synth -o "$WORK/w/nohup" --tp 2 --pp 1 --model tiny
check "synth started with SIGHUP ignored (nohup) goes on through a hangup (exit $RC)" \
    sh -c "[ $RC -eq 0 ] && '$CK' verify '$WORK/w/nohup' >/dev/null && [ \"\$(ls -A '$WORK/w')\" = nohup ]"
run with_fault staging-claimed:INT env --ignore-signal=INT "$RS" "$WORK/src" --to tp4 -o "$WORK/w/bg"
check "tp-reshard started with SIGINT ignored (a script's background job) goes on through SIGINT (exit $RC)" \
    sh -c "[ $RC -eq 0 ] && '$CK' verify '$WORK/w/bg' >/dev/null"
rm -rf "$WORK/w"/*
trainer_ignoring_term() { (use_open_mpi; exec env --ignore-signal=TERM "$TRAIN" "$@"); }
run with_fault staging-claimed:TERM trainer_ignoring_term --model tiny --micro-batch 2 --quiet --steps 6 \
    --ckpt-every 2 --ckpt-dir "$WORK/w/ign"
check "training started with SIGTERM ignored goes on through SIGTERM to its last step (exit $RC)" \
    sh -c "[ $RC -eq 0 ] && [ \"\$(cat '$WORK/w/ign/latest')\" = step_00000006 ]"

# Training: SIGTERM is a preemption (finish the step, save, stop with 0), as
# SIGHUP and a first SIGINT are; SIGKILL (or a second SIGINT) ends it at
# once, and what the save had begun goes with the next run, silently.
for sig in TERM HUP; do
    expect_ok "training: SIG$sig as a save's staging entry is born" with_fault staging-claimed:$sig \
        trainer --model tiny --micro-batch 2 --quiet --steps 50 --ckpt-every 2 --ckpt-dir "$WORK/w/run-$sig"
    check_all "training: SIG$sig: stopped with a whole checkpoint and no staging" \
        'intact "$WORK/w/run-$sig/$(cat "$WORK/w/run-$sig/latest")" && no_staging "$WORK/w/run-$sig"'
done
run with_fault staging-renamed trainer --model tiny --micro-batch 2 --quiet --steps 50 --ckpt-every 2 \
    --ckpt-dir "$WORK/w/run2"
check "training: SIGKILL as a save's staging entry is born ends it (exit $RC)" [ "$RC" -eq 137 ]
expect_ok "training: the next run" trainer --model tiny --micro-batch 2 --quiet --steps 2 --ckpt-every 2 \
    --ckpt-dir "$WORK/w/run2" --resume
check_all "training: the next run removed what the interrupted save left, saying nothing of it" \
    'no_staging "$WORK/w/run2" && ! grep -q staging "$WORK/.err"'

finish
