#!/bin/sh
# Fault injection (docs/RELIABILITY.md): --force over what is not an output
# of the same kind; kill -9 at random instants of synth, reshard, export and
# training saves; a full disk (a small tmpfs where one can be mounted, and a
# file-size limit everywhere); two writers at one output and two committers
# in one run directory; and --resume where no checkpoint is yet or the
# newest one's metadata is damaged. After each: an earlier output still
# verifies, no partial output is accepted, nothing half-written stays, and
# the next run succeeds. Signals: test_signals.sh.
# takes: about 80 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"

. "$(dirname "$0")/lib.sh"

FULL="$WORK/full"
MOUNTED=0
trap '[ "$MOUNTED" = 1 ] && umount "$FULL"; rm -rf "$WORK"' EXIT

# ------------------------------------------------------------- the instants
# Every awk here draws other instants from another seed, the same ones from
# the same seed, each within its slice (mawk clamped the 19-digit seeds of
# pid, trial and nanoseconds to one: every run struck at the same instants).
draws() {
    (FAULT_AWK=$1 FAULT_SEED=$2 && for i in 0 1 2 3; do instant $i 4 8 draws; done | tr '\n' ' ')
}
awks=$(for name in "${FAULT_AWK:-awk}" mawk gawk original-awk; do command -v "$name"; done |
    xargs -r readlink -f | sort -u)
for awk in $awks; do
    first=$(draws "$awk" 1) second=$(draws "$awk" 2) again=$(draws "$awk" 1)
    check "$awk: seeds 1 and 2 draw other instants ($first/ $second)" [ "$first" != "$second" ]
    check "$awk: seed 1 draws the same instants again ($first/ $again)" [ "$first" = "$again" ]
    check "$awk: each instant within its slice of 8 s ($second)" \
        sh -c 'echo "$1" | awk "{ for (i = 1; i <= NF; i++) if (\$i < 2 * (i - 1) || \$i >= 2 * i) exit 1 }"' - "$second"
done

expect_ok "source checkpoint" "$CK" synth -o "$WORK/src" --tp 2 --pp 1 $MODEL --optim --seed 1
expect_ok "second source" "$CK" synth -o "$WORK/src2" --tp 2 --pp 1 $MODEL --optim --seed 2
expect_ok "an export to import from" "$CK" export "$WORK/src" --format safetensors -o "$WORK/st-src"

# ------------------------------------------------------------------ --force
# --force replaces an earlier output of the same kind, never anything else.
mkdir -p "$WORK/p/notes" "$WORK/p/run"
echo "my notes" >"$WORK/p/notes/todo.txt"
expect_ok "a run directory" "$CK" synth -o "$WORK/p/run/step_00000010" --step 10 --tp 1 --pp 1 --model tiny
for tool in synth reshard import export-st export-gguf; do
    for target in notes run; do
        case $tool in
        synth) cmd="$CK synth --tp 1 --pp 1 --model tiny" ;;
        reshard) cmd="$RS $WORK/src --to tp1" ;;
        import) cmd="$CK import $WORK/st-src --tp 1 --pp 1" ;;
        export-st) cmd="$CK export $WORK/src --format safetensors" ;;
        export-gguf) cmd="$CK export $WORK/src --format gguf" ;;
        esac
        expect_error "$tool --force over a directory of $target" 1 "p/$target .*(not part of a checkpoint|run directory|not a .* export)" \
            $cmd -o "$WORK/p/$target" --force
    done
done
check "--force: the notes are untouched" [ "$(cat "$WORK/p/notes/todo.txt")" = "my notes" ]
check "--force: the run directory is untouched" intact "$WORK/p/run/step_00000010"
check "--force: no staging left beside them" no_staging "$WORK/p"
echo "not a model" >"$WORK/p/file.gguf"
expect_error "export --force over a file that is not GGUF" 1 "not a GGUF export" \
    "$CK" export "$WORK/src" --format gguf -o "$WORK/p/file.gguf" --force
check "the file is untouched" [ "$(cat "$WORK/p/file.gguf")" = "not a model" ]
expect_ok "a checkpoint to replace" "$RS" "$WORK/src" --to tp1 -o "$WORK/p/ck"
expect_ok "--force replaces a checkpoint" "$RS" "$WORK/src" --to tp4 -o "$WORK/p/ck" --force
check "with the new one" sh -c "'$CK' info '$WORK/p/ck' | grep -q 'tp=4'"

# ------------------------------------------------- kill -9 at random instants
# kill_trials WHAT OUT CHECK CMD...: runs CMD (which writes OUT with --force,
# OUT existing from a first complete run) TRIALS times, each killed with
# SIGKILL after a random delay; OUT must then always be there and pass CHECK.
# The delays span the duration of an uninterrupted run. The three writers'
# trials run at once, each in a directory of its own: kill_trials leaves its
# figures in $WORK/results/WHAT, kills_checked WHAT CMD... makes the checks.
mkdir -p "$WORK/results"
kill_trials() {
    label=$1 out=$2 check_out=$3
    shift 3
    bad=0 killed=0 instants=""
    mkdir -p "$(dirname "$out")"
    timed "$@" || bad=$((bad + 1))
    span=$(echo "$DURATION * 1.2" | bc)
    i=0
    while [ $i -lt "$TRIALS" ]; do
        "$@" >/dev/null 2>&1 &
        pid=$!
        at=$(instant $i "$TRIALS" "$span" "$label")
        instants="$instants $at"
        sleep "$at"
        kill -9 $pid 2>/dev/null
        wait $pid 2>/dev/null
        [ $? -eq 137 ] && killed=$((killed + 1))
        [ -e "$out" ] && $check_out "$out" || bad=$((bad + 1))
        i=$((i + 1))
    done
    echo "$bad $killed $span$instants" >"$WORK/results/$label"
}

# kills_checked WHAT OUT CMD...: the checks of kill_trials WHAT, and a run of
# CMD after the kills that leaves no staging beside OUT.
kills_checked() {
    label=$1 out=$2
    shift 2
    read -r bad killed span instants <"$WORK/results/$label" || bad="no result"
    check "$label: the output was whole after each of $TRIALS kills" [ "$bad" = 0 ]
    expect_ok "$label: a run after the kills" "$@"
    check "$label: no staging left once a writer ran after the kills" no_staging "$(dirname "$out")"
    echo "[$NAME] kill -9: $label: $TRIALS trials over ${span}s, $killed killed while running, $bad bad outputs"
    echo "[$NAME] kill -9: $label: killed after (s): $instants"
}

mkdir -p "$WORK/k"
# Other tools' formats too: a Megatron-LM output, and DCP and torch_dist
# outputs read from a Megatron-LM source (a foreign read and a foreign write).
expect_ok "a Megatron-LM checkpoint to read from" "$RS" "$WORK/src" --format megatron --to tp2 -o "$WORK/meg-src"
SYNTH="$CK synth -o $WORK/k-synth/synth --tp 2 --pp 1 $MODEL --optim --force"
RESHARD="$RS $WORK/src --to tp4 -o $WORK/k-rs/rs --force"
EXPORT="$CK export $WORK/src --format safetensors -o $WORK/k-st/st --force"
MEGATRON="$RS $WORK/src --format megatron --to tp4 -o $WORK/k-meg/meg --force"
DCP="$RS $WORK/meg-src --format dcp --to tp1 -o $WORK/k-dcp/dcp --force"
TORCH_DIST="$RS $WORK/meg-src --format torch_dist --to tp1 -o $WORK/k-td/td --force"
kill_trials "synth" "$WORK/k-synth/synth" intact $SYNTH &
p1=$!
kill_trials "reshard" "$WORK/k-rs/rs" intact $RESHARD &
p2=$!
kill_trials "export" "$WORK/k-st/st" safetensors_whole $EXPORT &
p3=$!
kill_trials "reshard to Megatron-LM" "$WORK/k-meg/meg" intact $MEGATRON &
p4=$!
kill_trials "reshard Megatron-LM to DCP" "$WORK/k-dcp/dcp" intact $DCP &
p5=$!
kill_trials "reshard Megatron-LM to torch_dist" "$WORK/k-td/td" intact $TORCH_DIST &
p6=$!
wait $p1 $p2 $p3 $p4 $p5 $p6
kills_checked "synth" "$WORK/k-synth/synth" $SYNTH
kills_checked "reshard" "$WORK/k-rs/rs" $RESHARD
kills_checked "export" "$WORK/k-st/st" $EXPORT
kills_checked "reshard to Megatron-LM" "$WORK/k-meg/meg" $MEGATRON
kills_checked "reshard Megatron-LM to DCP" "$WORK/k-dcp/dcp" $DCP
kills_checked "reshard Megatron-LM to torch_dist" "$WORK/k-td/td" $TORCH_DIST

# Training saves: a checkpoint at every step, killed at random instants; every
# committed checkpoint verifies, `latest` names one, and a resumed run cleans
# up what the killed saves left.
TRAIN_ARGS="--model tiny --micro-batch 2 --quiet --steps 100000 --ckpt-every 1 --ckpt-dir $WORK/k/run"
bad=0 i=0 instants=""
while [ $i -lt "$TRIALS" ]; do
    (use_open_mpi; exec "$TRAIN" $TRAIN_ARGS --resume) >"$WORK/k/launch.out" 2>&1 & # one process: $! is the trainer
    pid=$!
    # The first trial waits for a first save; then the kill lands anywhere
    # in start-up, steps and saves.
    waited=0
    while [ ! -e "$WORK/k/run/latest" ] && [ $waited -lt 600 ]; do sleep 0.1; waited=$((waited + 1)); done
    at=$(instant $i "$TRIALS" 1.0 training)
    instants="$instants $at"
    sleep "$at"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    # Ended by the kill, not by itself (a launch that failed was no trial).
    rc=$?
    if [ $rc -ne 137 ]; then
        bad=$((bad + 1))
        echo "    launch $i ended with exit $rc before its kill: $(head -3 "$WORK/k/launch.out")" >&2
    fi
    # Each checkpoint verified once, known by its index's inode (a step saved
    # again is a new one), recorded outside the run directory: a file inside
    # a step's directory (a `.verified` mark, as it was) makes it not a
    # checkpoint's, and the next launch, resuming from an older `latest`,
    # failed to save that step again.
    for d in "$WORK"/k/run/step_*; do
        [ -e "$d/index.json" ] || continue
        seen="$(basename "$d"):$(stat -c %i "$d/index.json")"
        grep -qxF "$seen" "$WORK/k/verified" 2>/dev/null && continue
        if intact "$d"; then echo "$seen" >>"$WORK/k/verified"; else bad=$((bad + 1)); echo "    damaged after a kill: $d" >&2; fi
    done
    latest=$(cat "$WORK/k/run/latest" 2>/dev/null)
    [ -z "$latest" ] || [ -e "$WORK/k/run/$latest/index.json" ] || bad=$((bad + 1))
    # Checkpoints already verified go, so that the run directory stays small.
    for d in "$WORK"/k/run/step_*; do
        [ "$(basename "$d")" != "$latest" ] && [ -e "$d/index.json" ] &&
            grep -qxF "$(basename "$d"):$(stat -c %i "$d/index.json")" "$WORK/k/verified" && rm -rf "$d"
    done
    i=$((i + 1))
done
check "training saves: every committed checkpoint verified after each of $TRIALS kills" [ "$bad" -eq 0 ]
STEP=$(sed 's/^step_0*//' "$WORK/k/run/latest")
check "training saves: the killed runs saved checkpoints" [ -n "$STEP" ]
expect_ok "training resumes after the kills" trainer --model tiny --micro-batch 2 --quiet --ckpt-dir "$WORK/k/run" \
    --resume --ckpt-every 1 --steps $((STEP + 1))
check "the resumed run removed the killed saves' staging" no_staging "$WORK/k/run"
echo "[$NAME] kill -9: training saves: $TRIALS trials, $bad bad checkpoints, resumed at step $STEP"
echo "[$NAME] kill -9: training saves: killed after (s):$instants"

# --------------------------------------------------------- concurrent writers
# Two writers at one output: without --force one wins and the other fails,
# naming the output; with --force both may finish, and the output is one of
# them, whole.
mkdir -p "$WORK/c"
bad=0 i=0
while [ $i -lt 10 ]; do
    rm -rf "$WORK/c/out"
    force=""
    [ $i -ge 5 ] && force=--force
    "$RS" "$WORK/src" --to tp4 -o "$WORK/c/out" $force >"$WORK/c/a.out" 2>"$WORK/c/a.err" &
    a=$!
    "$RS" "$WORK/src2" --to tp4 -o "$WORK/c/out" $force >"$WORK/c/b.out" 2>"$WORK/c/b.err" &
    b=$!
    wait $a
    ra=$?
    wait $b
    rb=$?
    same_as_a=1 same_as_b=1
    "$CK" diff "$WORK/c/out" "$WORK/src" >/dev/null 2>&1 || same_as_a=0
    "$CK" diff "$WORK/c/out" "$WORK/src2" >/dev/null 2>&1 || same_as_b=0
    if [ -z "$force" ]; then
        # Exactly one succeeded, the output is the winner's, the loser says why.
        if [ $ra -eq 0 ] && [ $rb -eq 1 ]; then [ $same_as_a = 1 ] && grep -q "c/out" "$WORK/c/b.err" || bad=$((bad + 1))
        elif [ $rb -eq 0 ] && [ $ra -eq 1 ]; then [ $same_as_b = 1 ] && grep -q "c/out" "$WORK/c/a.err" || bad=$((bad + 1))
        else bad=$((bad + 1)); echo "    two writers without --force: exits $ra and $rb" >&2; fi
    else
        { [ $ra -eq 0 ] || [ $rb -eq 0 ]; } && [ $((same_as_a + same_as_b)) -eq 1 ] || bad=$((bad + 1))
    fi
    intact "$WORK/c/out" && no_staging "$WORK/c" || bad=$((bad + 1))
    i=$((i + 1))
done
check "two writers at one output, 10 rounds: one whole result, never a mixture" [ "$bad" -eq 0 ]

# A checkpoint being read is not replaced under its reader: the replacement
# is refused (or waits for no one), and the reader's result is the original.
cp -r "$WORK/src" "$WORK/c/read"
"$RS" "$WORK/c/read" --to tp4 -o "$WORK/c/read4" --threads 1 >/dev/null 2>"$WORK/c/r.err" &
reader=$!
sleep 0.05
run "$RS" "$WORK/src2" --to tp2 -o "$WORK/c/read" --force
replaced=$RC
wait $reader
check "a reader's result is the checkpoint it opened" same "$WORK/c/read4" "$WORK/src"
if [ "$replaced" -ne 0 ]; then
    check "the replacement was refused because it was being read" grep -q "being read" "$WORK/.err"
    check "and the checkpoint is as it was" same "$WORK/c/read" "$WORK/src"
fi

# Two committers in one run directory: `latest` ends at the newest step.
mkdir -p "$WORK/c/run"
i=1
while [ $i -le 10 ]; do
    "$CK" synth -o "$WORK/c/run/step_$((2 * i))" --step $((2 * i)) --tp 1 --pp 1 --model tiny >/dev/null 2>&1 &
    a=$!
    "$CK" synth -o "$WORK/c/run/step_$((2 * i + 1))" --step $((2 * i + 1)) --tp 1 --pp 1 --model tiny >/dev/null 2>&1 &
    b=$!
    wait $a $b
    i=$((i + 1))
done
check "concurrent commits: latest names the newest step" [ "$(cat "$WORK/c/run/latest")" = "step_21" ]
check "concurrent commits: no temporary file of latest left" sh -c "! ls -A '$WORK/c/run' | grep -q 'latest.tmp'"

# ---------------------------------------------------------------- full disk
# A small tmpfs (when this test may mount one) gives ENOSPC; a file-size limit
# (RLIMIT_FSIZE, with SIGXFSZ ignored) gives EFBIG anywhere. An uncompressed
# output that cannot fit is refused before it is written (test_room); a
# compressed one, whose size is not known, meets the disk's end (ENOSPC).
mkdir -p "$FULL"
if mount -t tmpfs -o size=3m tmpfs "$FULL" 2>/dev/null; then
    MOUNTED=1
    echo keep >"$FULL/keep.txt"
    expect_error "synth on a full disk (compressed)" 1 "No space left" "$CK" synth -o "$FULL/c" --tp 2 --pp 1 $MODEL \
        --compress zstd:1
    expect_error "reshard on a full disk (compressed)" 1 "No space left" "$RS" "$WORK/src" --to tp4 -o "$FULL/c" \
        --compress zstd:1
    expect_error "import on a full disk (compressed)" 1 "No space left" "$CK" import "$WORK/st-src" -o "$FULL/c" --tp 2 \
        --pp 1 --compress zstd:1
    expect_error "synth uncompressed: refused before writing" 1 "c: needs .* MiB .* free: nothing was written" "$CK" synth \
        -o "$FULL/c" --tp 2 --pp 1 $MODEL
    expect_error "export (HDF5): refused before writing" 1 "c.h5: needs .* free: nothing was written" "$CK" export \
        "$WORK/src" --format hdf5 -o "$FULL/c.h5"
    expect_error "export (GGUF): refused before writing" 1 "c.gguf: needs .* free: nothing was written" "$CK" export \
        "$WORK/src" --format gguf -o "$FULL/c.gguf"
    check "full disk: nothing left behind, what was there kept" \
        sh -c "[ \"\$(ls -A '$FULL')\" = keep.txt ] && [ \"\$(cat '$FULL/keep.txt')\" = keep ]"
    # Training: the first save fits, the second does not. The run stops with
    # an error naming the checkpoint, keeps the first and removes the second.
    rm -f "$FULL/keep.txt"
    expect_error "training stops on a full disk" 1 "checkpoint .*step_00000010.*No space left" \
        trainer --model tiny --micro-batch 2 --quiet --steps 20 --ckpt-every 5 --sync-save --ckpt-dir "$FULL/run"
    check "full disk: the earlier checkpoint verifies" intact "$FULL/run/step_00000005"
    check "full disk: the failed save is gone" sh -c "[ ! -e '$FULL/run/step_00000010' ] && ! ls -A '$FULL/run' | grep -q staging"
    check "full disk: latest names the earlier checkpoint" [ "$(cat "$FULL/run/latest")" = step_00000005 ]
else
    echo "[$NAME] SKIP: cannot mount a tmpfs here (not root?): ENOSPC tests skipped, EFBIG tests run"
fi

# limited KB CMD...: CMD with files limited to KB kilobytes.
limited() {
    kb=$1
    shift
    (trap '' XFSZ; ulimit -f $((kb * 2)); exec "$@")
}
mkdir -p "$WORK/f"
expect_error "synth past the file-size limit" 1 "File too large" limited 512 "$CK" synth -o "$WORK/f/c" --tp 2 --pp 1 $MODEL
expect_error "reshard past the file-size limit" 1 "File too large" limited 512 "$RS" "$WORK/src" --to tp4 -o "$WORK/f/c"
expect_error "export past the file-size limit" 1 "File too large" limited 512 "$CK" export "$WORK/src" --format hdf5 -o "$WORK/f/c.h5"
check "file-size limit: nothing half-written left" sh -c "[ -z \"\$(ls -A '$WORK/f')\" ]"

# -------------------------------------------------------------------- resume
expect_ok "--resume with no checkpoint yet starts afresh" trainer --model tiny --micro-batch 2 --quiet --steps 2 \
    --ckpt-dir "$WORK/fresh" --resume
check "and says so" grep -q "no checkpoint in .* yet; starting afresh" "$WORK/.err"
check "and saves" intact "$WORK/fresh/step_00000002"

# Damaged shard metadata (the superblock, object headers, attributes) of the
# newest checkpoint of a tp2 run under mpirun: every rank learns it, the
# damage is named and the older checkpoint resumes.
use_open_mpi
expect_ok "a tp2 run with two checkpoints" mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --micro-batch 2 --quiet \
    --tp 2 --steps 4 --ckpt-every 2 --ckpt-dir "$WORK/m/run"
for offset in 0 200 2000; do
    rm -rf "$WORK/m/r"
    cp -r "$WORK/m/run" "$WORK/m/r"
    "$PY" - "$WORK/m/r/step_00000004/shard_pp00_tp01.h5" $offset <<'PYEOF'
import sys
path, offset = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(offset)
    b = bytearray(f.read(300))
    f.seek(offset)
    f.write(bytes(x ^ 0xA5 for x in b))
PYEOF
    run timeout 120 mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --micro-batch 2 --quiet --tp 2 --steps 5 \
        --ckpt-dir "$WORK/m/r" --resume </dev/null
    check "metadata damaged at byte $offset: the run goes on from the older checkpoint" [ "$RC" -eq 0 ]
    check "metadata damaged at byte $offset: named, with the fallback" \
        grep -Eq "step_00000004 is unusable \(.*shard_pp00_tp01.h5.*\); falling back to .*step_00000002" "$WORK/.err"
done

finish
