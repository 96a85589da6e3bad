#!/bin/sh
# tp-elastic report end to end: its picture is an output as every other
# (docs/TOOLS.md): an existing file refused without --force, and with it
# anything but an earlier report (known by its mark, checked here by an
# independent reader); never written inside a checkpoint; whole or not at
# all. And a diverged run: tp-train's log stays JSON (null for NaN, read by
# Python's json), and the report says where the loss went non-finite
# instead of drawing a point and keeping quiet, or, when no loss is finite,
# says there is nothing to plot instead of blaming gnuplot. No MPI: fast.
# tier: check
. "$(dirname "$0")/lib.sh"
ELASTIC="$BIN/tp-elastic"
TRAIN="$BIN/tp-train"

head -c 20000 "$ROOT/docs/TOOLS.md" >"$WORK/text.txt"
expect_ok "prepare a token file" "$TRAIN" prepare "$WORK/text.txt" -o "$WORK/tokens.bin"

# ------------------------------------------------------------ a diverged run
R="$WORK/run"
mkdir -p "$R/elastic"
: >"$R/elastic/events.jsonl"
expect_error "a run with --lr 1e30 diverges, and ends at the first non-finite gradient" 1 \
    "step 2: the gradient norm is not finite.*no checkpoint of it written; train again with a lower --lr$" "$TRAIN" --layers 2 --dim 64 --heads 4 --vocab 256 --seq 32 \
    --steps 6 --warmup 0 --lr 1e30 --data "$WORK/tokens.bin" --log "$R/elastic/train.jsonl" --quiet
# With a checkpoint directory but no checkpoint yet, it names none (it said
# "the newest checkpoint holds the last finite weights").
expect_error "a run that diverges before its first checkpoint: told to train again" 1 \
    "step 2: the gradient norm is not finite.*no checkpoint of it written; train again with a lower --lr$" "$TRAIN" \
    --layers 2 --dim 64 --heads 4 --vocab 256 --seq 32 --steps 6 --warmup 0 --lr 1e30 --data "$WORK/tokens.bin" \
    --ckpt-dir "$WORK/no-ckpt-yet" --ckpt-every 100 --quiet
# A finite gradient norm times a learning rate past float's range: the
# update overflows the weights (it wrote a checkpoint of them, exit 0, and
# verify said ok). Checked before a save: none written, the stop diverged.
expect_error "an update that overflows the weights: the run ends before saving them" 1 \
    "step 1: the weights are not finite after its update .*no checkpoint of them written; train again with a lower --lr$" \
    "$TRAIN" --layers 2 --dim 64 --heads 4 --vocab 256 --seq 32 --steps 3 --warmup 0 --lr 1e39 --data "$WORK/tokens.bin" \
    --ckpt-dir "$WORK/overflow" --ckpt-every 1 --log "$WORK/overflow.jsonl" --quiet
check "no checkpoint written, the stop line diverged" sh -c '[ -z "$(ls "$1" | grep step_)" ] && grep -q "\"reason\":\"diverged\"" "$2"' \
    sh "$WORK/overflow" "$WORK/overflow.jsonl"
# Strict JSON: NaN and Infinity, which Python would take, are refused too.
check "the diverged log: every line is JSON, a NaN loss null" "$PY" -c '
import json, sys
def refuse(word): raise ValueError("not JSON: " + word)
steps = [r for r in (json.loads(l, parse_constant=refuse) for l in open(sys.argv[1])) if "event" not in r]
assert len(steps) == 2, steps
assert steps[0]["loss"] > 0, steps[0]
assert any(r["loss"] is None for r in steps), steps
assert all(r["loss"] is None or r["loss"] == r["loss"] for r in steps)' "$R/elastic/train.jsonl"
check "tests/elastic/check_losses.py says a null loss is non-finite (no traceback)" sh -c \
    "! '$PY' '$ROOT/tests/elastic/check_losses.py' '$R/elastic/train.jsonl' '$R/elastic/train.jsonl' 2 2>'$WORK/losses.err' &&
     grep -q 'non-finite (null) at steps' '$WORK/losses.err'"

# gnuplot draws in $TMPDIR, as the other tools' temporary files go (it drew
# in /tmp whatever TMPDIR said): one that does not exist is named.
expect_error "report with TMPDIR missing: its temporary directory named" 1 \
    "$WORK/no-tmp/tp-elastic-report-.*: cannot make a temporary directory: No such file or directory" \
    env TMPDIR="$WORK/no-tmp" "$ELASTIC" report "$R" -o "$WORK/tmpdir.svg"
check "nothing written" test ! -e "$WORK/tmpdir.svg"
expect_ok "report of a diverged run" "$ELASTIC" report "$R" -o "$WORK/nan.svg"
check "report: says on stderr where the loss went non-finite" \
    grep -Eq "warning: the loss went non-finite at step 2 \(launch 1\): 1 of 2 steps" "$WORK/.err"
check "report: and marks it in the picture" grep -q "loss non-finite (launch 1)" "$WORK/nan.svg"

# A summary of an earlier tp-elastic, then a later one that started and was
# killed (no summary of its own): the summary is not the run's. Before, the
# report printed the earlier one as it was ("finished yes", its last step)
# for a run a killed orchestrator had taken further.
S="$WORK/stale"
mkdir -p "$S/elastic"
cp "$R/elastic/train.jsonl" "$S/elastic/"
printf '%s\n' '{"event":"orchestrator_start","steps":1,"time":1}' \
    '{"event":"summary","finished":true,"step":1,"launches":1,"restarts":0,"time":2}' \
    '{"event":"orchestrator_start","steps":6,"time":3}' '{"event":"launch","time":4}' >"$S/elastic/events.jsonl"
expect_ok "report of a run whose latest orchestrator was killed" "$ELASTIC" report "$S" -o "$WORK/stale.svg"
check_all "report: an earlier orchestrator's summary is not the run's" \
    'grep -q "^no summary yet (the run.s latest tp-elastic has not ended, or was killed)" "$WORK/.out" &&
    ! grep -q "^finished" "$WORK/.out"'

# A log written before null: its nan lines are no JSON; left out, and said so.
OLD="$WORK/old"
mkdir -p "$OLD/elastic"
: >"$OLD/elastic/events.jsonl"
sed 's/"loss":null/"loss":nan/; s/"grad_norm":null/"grad_norm":-nan/' "$R/elastic/train.jsonl" >"$OLD/elastic/train.jsonl"
expect_ok "report of a log with nan lines" "$ELASTIC" report "$OLD" -o "$WORK/old.svg"
check "report: says its lines that are not JSON were left out"     grep -Eq "warning: .*old/elastic/train.jsonl: [1-5] lines are not JSON, left out" "$WORK/.err"

A="$WORK/all-nan"
mkdir -p "$A/elastic"
: >"$A/elastic/events.jsonl"
grep -v '"loss":[0-9]' "$R/elastic/train.jsonl" >"$A/elastic/train.jsonl"
expect_error "report: no finite loss: nothing to plot, gnuplot not blamed" 1 \
    "all-nan/elastic/train.jsonl: none of its [0-9]+ steps has a finite loss .*nothing finite to plot" \
    "$ELASTIC" report "$A" -o "$WORK/all-nan.svg"
check "report: nothing written" test ! -e "$WORK/all-nan.svg"
N="$WORK/no-steps"
mkdir -p "$N/elastic"
: >"$N/elastic/events.jsonl"
grep '"event"' "$R/elastic/train.jsonl" >"$N/elastic/train.jsonl"
expect_error "report: a log without steps" 1 "no-steps/elastic/train.jsonl holds no steps" \
    "$ELASTIC" report "$N" -o "$WORK/no-steps.svg"

# ------------------------------------------------- runs that never trained
# Capacity below --min-world for the whole --capacity-wait: given up before
# any launch. The wait is time lost (startup: before the run's first step),
# and a run that trained nothing has no effective training time. Before, a
# wait before the first launch was counted nowhere: "effective training
# time 100.0%", and the report, finding no trainer's log, said nothing of
# the summary. No trainer runs: no MPI needed.
U="$WORK/untrained"
echo 1 >"$WORK/world.one"
ELASTIC_TRAIN="--model tiny --quiet --steps 4 --global-batch 4"
expect_error "capacity that never comes: given up before any launch" 1 "capacity stayed below --min-world 2 for [0-9]+ s" \
    "$ELASTIC" run --ckpt-dir "$U" --world-file "$WORK/world.one" --min-world 2 --capacity-wait 2 -- "$TRAIN" $ELASTIC_TRAIN
check "never trained: tp-elastic run says no effective training time" \
    grep -q "effective training time none (no step trained)$" "$WORK/.out"
# The judge: the events' own clock. The wait (orchestrator_start to
# give_up) is in startup, the shares add up to the wall time, no training.
check "never trained: the summary: trained false, ETTR 0, the wait lost to startup" "$PY" -c '
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
start = next(e["time"] for e in events if e["event"] == "orchestrator_start")
gave_up = next(e["time"] for e in events if e["event"] == "give_up")
s = [e for e in events if e["event"] == "summary"][-1]
assert s["trained"] is False and s["ettr"] == 0 and s["training_seconds"] == 0, s
lost = s["lost_seconds"]
assert lost["startup"] >= gave_up - start - 0.01 and gave_up - start >= 2, (lost, gave_up - start)
assert abs(sum(lost.values()) - s["wall_seconds"]) < 0.05, s' "$U/elastic/events.jsonl"
expect_error "report of a run that never launched: the missing log named" 1 "untrained/elastic/train.jsonl" \
    "$ELASTIC" report "$U" -o "$WORK/untrained.svg"
check_all "report: the summary still said: ETTR none, the wait as startup, why it gave up" \
    'grep -Eq "^effective training +none: never trained" "$WORK/.out" &&
     grep -Eq "^lost: startup +([2-9]|[1-9][0-9])\.[0-9] s$" "$WORK/.out" &&
     grep -Eq "^reason +capacity stayed below --min-world 2" "$WORK/.out" &&
     grep -Eq "waits for capacity 1$" "$WORK/.out" && ! grep -q "%" "$WORK/.out"'
check "report: nothing written" test ! -e "$WORK/untrained.svg"

# Stopped (SIGTERM) while it waits for capacity, before any step: nothing
# trained, the wait lost. Before: 100%, the wait counted nowhere.
T="$WORK/stopped-early"
"$ELASTIC" run --ckpt-dir "$T" --world-file "$WORK/world.one" --min-world 2 --capacity-wait 60 -- "$TRAIN" \
    $ELASTIC_TRAIN >"$WORK/stopped.out" 2>"$WORK/stopped.err" &
stopped_pid=$!
for i in $(seq 50); do grep -q waiting_for_capacity "$T/elastic/events.jsonl" 2>/dev/null && break; sleep 0.1; done
sleep 1
kill -TERM $stopped_pid
wait $stopped_pid
check "stopped before the first step: exit 1, no effective training time" \
    sh -c '[ $1 -eq 1 ] && grep -q "effective training time none (no step trained)$" "$2"' sh $? "$WORK/stopped.out"
check "stopped before the first step: the second waited lost to startup" "$PY" -c '
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]
assert s["trained"] is False and s["ettr"] == 0 and s["lost_seconds"]["startup"] >= 1, s
assert s["reason"] == "stopped on request", s' "$T/elastic/events.jsonl"

# A run continued by a later orchestrator into a state directory of its
# own (the log starts mid-run: no start line), whose summary is an older
# tp-elastic's: without startup, trained and ettr. Figures it lacks are
# said so; before, each printed as -1 ("-1.0 s", "-100.0%").
M="$WORK/midrun"
mkdir -p "$M/elastic"
grep -v '"event":"start"' "$R/elastic/train.jsonl" >"$M/elastic/train.jsonl"
printf '%s\n' '{"event":"orchestrator_start","steps":6,"time":1}' \
    '{"event":"summary","finished":false,"step":2,"launches":1,"restarts":0,"steps_recomputed":0,"wall_seconds":10,"lost_seconds":{"detection":0,"selection":0,"reshard":0,"relaunch":0,"lost_work":0},"time":2}' \
    >"$M/elastic/events.jsonl"
expect_ok "report of a log that starts mid-run, an older summary" "$ELASTIC" report "$M" -o "$WORK/midrun.svg"
check_all "report: what the older summary lacks is said not recorded, never -1" \
    'grep -Eq "^lost: startup +\(not recorded\)$" "$WORK/.out" && grep -Eq "^effective training +\(not recorded\)$" "$WORK/.out" &&
     grep -Eq "^lost: detection +0\.0 s$" "$WORK/.out" && grep -Eq "loss curve of 1 launch$" "$WORK/.out" && ! grep -Eq -- "-100\.0%|-1\.0 s" "$WORK/.out"'

# ---------------------------------------------------------------- the output
O="$WORK/out"
mkdir -p "$O"
echo precious >"$O/precious.svg"
cp "$O/precious.svg" "$O/precious.orig"
expect_error "report: an existing file refused without --force" 1 "precious.svg already exists; refusing to replace it without --force" \
    "$ELASTIC" report "$R" -o "$O/precious.svg"
expect_error "report: --force replaces no file but a report" 1 \
    "precious.svg is not a report of tp-elastic report .*--force replaces only a report" \
    "$ELASTIC" report "$R" -o "$O/precious.svg" --force
check "report: the file is as it was" cmp -s "$O/precious.svg" "$O/precious.orig"
mkdir "$O/dir.svg"
expect_error "report: --force never replaces a directory" 1 "dir.svg is a directory; --force replaces only" \
    "$ELASTIC" report "$R" -o "$O/dir.svg" --force
check "report: the directory is still there" test -d "$O/dir.svg"

expect_ok "report: a new SVG" "$ELASTIC" report "$R" -o "$O/r.svg"
check "report: the SVG carries the mark after the XML declaration" sh -c \
    "sed -n 2p '$O/r.svg' | grep -q '^<!-- tp-elastic report (tp-toolkit)' && grep -q '<svg' '$O/r.svg'"
expect_error "report: an earlier report refused without --force" 1 "r.svg already exists" \
    "$ELASTIC" report "$R" -o "$O/r.svg"
ls -i "$O/r.svg" >"$WORK/inode.before"
expect_ok "report: an earlier report replaced with --force" "$ELASTIC" report "$R" -o "$O/r.svg" --force
check "report: replaced by a new file (staged, renamed)" sh -c "! ls -i '$O/r.svg' | cmp -s - '$WORK/inode.before'"

expect_ok "report: a new PNG" "$ELASTIC" report "$R" -o "$O/r.png"
# An independent reader of the mark: every chunk's CRC right, the tEXt
# chunk right after IHDR. Then the same picture without it: not a report.
check "report: the PNG is valid and marked" "$PY" -c '
import struct, sys, zlib
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n"
i, chunks = 8, []
while i < len(b):
    n, = struct.unpack(">I", b[i:i + 4]); kind, data = b[i + 4:i + 8], b[i + 8:i + 8 + n]
    assert zlib.crc32(kind + data) == struct.unpack(">I", b[i + 8 + n:i + 12 + n])[0], kind
    chunks.append((kind, data)); i += 12 + n
assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND", chunks[0][0]
assert chunks[1] == (b"tEXt", b"Software\0tp-elastic report (tp-toolkit): the loss over steps of a run"), chunks[1]
cut = 8 + 25 + 12 + len(chunks[1][1])
open(sys.argv[2], "wb").write(b[:33] + b[cut:])' "$O/r.png" "$O/foreign.png"
expect_ok "report: an earlier PNG report replaced with --force" "$ELASTIC" report "$R" -o "$O/r.png" --force
cp "$O/foreign.png" "$O/foreign.orig"
expect_error "report: a PNG without the mark is not replaced" 1 "foreign.png is not a report of tp-elastic report" \
    "$ELASTIC" report "$R" -o "$O/foreign.png" --force
check "report: the PNG is as it was" cmp -s "$O/foreign.png" "$O/foreign.orig"
cp "$O/r.png" "$O/png-as.svg"
expect_error "report: a PNG report at an .svg path is not an SVG report" 1 "png-as.svg is not a report .*SVG mark" \
    "$ELASTIC" report "$R" -o "$O/png-as.svg" --force

# Never inside a checkpoint: the run's step_N (committed or being written) or any committed one.
mkdir -p "$R/step_00000004" "$WORK/ckpt"
echo '{}' >"$R/step_00000004/index.json"
echo '{}' >"$WORK/ckpt/index.json"
for out in "$R/step_00000004/r.svg" "$R/step_00000004/../step_00000004/./r.png" "$WORK/ckpt/r.svg"; do
    expect_error "report: -o $out, inside a checkpoint: refused" 2 "lies inside the checkpoint .*never written into a checkpoint" \
        "$ELASTIC" report "$R" -o "$out" --force
done
check "report: nothing written into the checkpoints" sh -c \
    "[ \$(ls -A '$R/step_00000004' | wc -l) -eq 1 ] && [ \$(ls -A '$WORK/ckpt' | wc -l) -eq 1 ]"
expect_ok "report: beside the checkpoints, in the run directory, it is written" "$ELASTIC" report "$R" -o "$R/report.svg"

# Whole or not at all: gnuplot missing, nothing appears and an earlier report stays whole.
cp "$O/r.svg" "$O/r.svg.orig"
expect_error "report: without gnuplot, one line saying so" 1 "gnuplot is not installed" \
    env PATH=/nonexistent "$ELASTIC" report "$R" -o "$O/r.svg" --force
check "report: the earlier report is as it was" cmp -s "$O/r.svg" "$O/r.svg.orig"
expect_error "report: without gnuplot, a new output" 1 "gnuplot is not installed" \
    env PATH=/nonexistent "$ELASTIC" report "$R" -o "$O/new.svg"
check "report: no output, no staging file left" sh -c "[ ! -e '$O/new.svg' ] && ! ls -A '$O' | grep -q staging"
finish
