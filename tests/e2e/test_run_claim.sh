#!/bin/sh
# One live trainer per run directory (ckpt_run_claim, docs/FORMAT.md "Run
# directories"). Two tp-train on one --ckpt-dir used to be both accepted and
# replace each other's step_N with checkpoints of two models.
#   Local: a second trainer (another model) refused at start naming the
#   first's pid and host (its log's stop line says in_use), the first undisturbed (finishes, every checkpoint
#   its model's); the same under mpirun at tp2 (every rank refused alike);
#   a kill -9'd trainer's directory taken at once; a FIFO or a link in the
#   lock's place refused, never waited on.
#   Object store (nginx's WebDAV): the lease object seen live and refused
#   (another cache, so that only the lease decides); a kill -9'd trainer's
#   lease taken at once (its pid gone on this machine); another machine's
#   stale lease waited out for a period, then taken; a malformed lease
#   refused by name; a lease overwritten under a live trainer stops it
#   before its next checkpoint; a finished run's lease removed; a writer of
#   a step (tp-ckpt synth) refused by a live run's lease, and a trainer by
#   a live writer's lease, a dead one's waited out and removed.
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/support/objstore.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
CK="$BIN/tp-ckpt"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
trap 'webdav_stop >/dev/null 2>&1; rm -rf "$WORK"' EXIT
HOST_PATTERN="on host $(hostname | sed 's/[^A-Za-z0-9-]/-/g')"

# A trainer that lives long enough to be met, however loaded the machine:
# its first checkpoint's commit held until the test releases it (held NAME:
# the fault point that waits for $WORK/NAME.release; release NAME).
held() { echo "before-latest:WAIT:$WORK/$1.release"; }
release() { : >"$WORK/$1.release"; }
LONG="--model tiny --micro-batch 2 --quiet --steps 2 --ckpt-every 2"

# named_in FILE TEXT SECONDS: until FILE holds TEXT (the claim's holder written).
named_in() {
    n=0
    while ! grep -qF -- "$2" "$1" 2>/dev/null && [ $n -lt $(($3 * 10)) ]; do sleep 0.1; n=$((n + 1)); done
}
# model_of CKPT: the model's layer count and width, from tp-ckpt info --json.
model_of() { "$CK" info --json "$1" | "$PY" -c 'import json,sys; m=json.load(sys.stdin)["model"]; print(m["layers"], m["dim"])'; }

# ---------------------------------------------------------------- local
for trial in 1 2 3; do
    D="$WORK/run$trial"
    TP_CKPT_FAULT=$(held trial$trial) "$TRAIN" $LONG --ckpt-dir "$D" >"$WORK/first.out" 2>&1 &
    first=$!
    wait_for "$D/.tp-run.lock" 20
    named_in "$D/.tp-run.lock" "pid $first " 20
    expect_error "trial $trial: a second trainer (another model) on a live run directory is refused" 1 \
        "$D is in use by tp-train \(pid $first $HOST_PATTERN, since .*\): one run per directory" \
        "$TRAIN" --model small --micro-batch 2 --quiet --steps 3 --ckpt-every 1 --ckpt-dir "$D" --resume \
        --log "$WORK/refused$trial.jsonl"
    # The stop line says why in a word an orchestrator acts on (tp-elastic
    # gives up rather than take the holder's checkpoints for its run's).
    check "trial $trial: the refused trainer's stop line says in_use, naming the holder" \
        grep -q "\"event\":\"stop\",\"step\":0,\"reason\":\"in_use\",\"error\":\"[^\"]*in use by tp-train (pid $first " \
        "$WORK/refused$trial.jsonl"
    release trial$trial
    wait $first
    rc=$?
    check "trial $trial: the first trainer undisturbed (exit $rc)" [ $rc -eq 0 ]
    check_all "trial $trial: every checkpoint is the first trainer's, none of the refused one's" \
        '[ "$(ls "$D" | tr "\n" " ")" = "latest step_00000002 " ] && [ "$(model_of "$D/step_00000002")" = "2 64" ]'
done

# A refused launch given the live run's own --log appends its stop line:
# it truncated the log, and the live run wrote on past its old offset (the
# start line gone, NUL bytes, no line after them JSON).
D="$WORK/shared-log"
TP_CKPT_FAULT=$(held shared) "$TRAIN" $LONG --ckpt-dir "$D" --log "$WORK/shared.jsonl" >"$WORK/first.out" 2>&1 &
first=$!
wait_for "$D/.tp-run.lock" 20
named_in "$D/.tp-run.lock" "pid $first " 20
named_in "$WORK/shared.jsonl" '"event":"start"' 20
expect_error "a second trainer with the live run's --log: refused" 1 "$D is in use by tp-train \(pid $first " \
    "$TRAIN" $LONG --ckpt-dir "$D" --resume --log "$WORK/shared.jsonl"
release shared
wait $first
check "the live trainer finished (exit $?)" [ $? -eq 0 ]
check "its log: every line JSON, its start first and its stop last, the refused launch's in_use line kept whole" \
    "$PY" - "$WORK/shared.jsonl" <<'PYEOF'
import json, sys
raw = open(sys.argv[1], "rb").read()
assert b"\0" not in raw, "NUL bytes in the log"
lines = [json.loads(l) for l in raw.decode().splitlines()]
assert lines[0]["event"] == "start", lines[0]
assert lines[-1]["event"] == "stop" and lines[-1]["reason"] == "finished", lines[-1]
stops = [l["reason"] for l in lines if l.get("event") == "stop"]
assert stops == ["in_use", "finished"], stops
PYEOF

# A checkpoint written by another program into a live run directory (an
# output named step_N, which becomes the run's `latest`): refused, naming
# the trainer. tp-reshard and synth took `latest` over (a newer step of
# another model) and the trainer's stop checkpoint stayed behind it, so the
# next --resume continued the other model.
D="$WORK/writers"
mkdir -p "$WORK/other"
"$CK" synth -o "$WORK/other/step_00099999" --step 99999 --tp 1 --pp 1 --model tiny --seed 7 >/dev/null
TP_CKPT_FAULT=$(held writers) "$TRAIN" $LONG --ckpt-dir "$D" >"$WORK/first.out" 2>&1 &
first=$!
wait_for "$D/.tp-run.lock" 20
named_in "$D/.tp-run.lock" "pid $first " 20
expect_error "tp-reshard -o a live run's step_N: refused, naming the trainer" 1 \
    "$D is in use by tp-train \(pid $first $HOST_PATTERN" "$BIN/tp-reshard" "$WORK/other/step_00099999" --to tp1 -o "$D/step_00099999"
expect_error "tp-ckpt synth -o a live run's step_N: refused, naming the trainer" 1 \
    "$D is in use by tp-train \(pid $first $HOST_PATTERN" "$CK" synth -o "$D/step_00199999" --step 199999 --tp 1 --pp 1 --model tiny
release writers
wait $first
rc=$?
check_all "the trainer undisturbed (exit $rc), latest its own, no other checkpoint" \
    '[ $rc -eq 0 ] && [ "$(cat "$D/latest")" = step_00000002 ] && [ "$(ls "$D" | tr "\n" " ")" = "latest step_00000002 " ]'
expect_ok "with the trainer gone, synth writes a step of the run" "$CK" synth -o "$D/step_00000004" --step 4 --tp 1 --pp 1 \
    --model tiny
check "and the lock named it while it wrote" grep -q "^tp-ckpt (pid [0-9]* $HOST_PATTERN" "$D/.tp-run.lock"
# And the other way: no trainer starts in a run directory such a writer is
# writing into (held at its commit); two such writers share it.
TP_CKPT_FAULT="before-rename:WAIT:$WORK/writer.release" "$CK" synth -o "$D/step_00000006" --step 6 --tp 1 --pp 1 \
    --model tiny >/dev/null 2>&1 &
writer=$!
wait_for "$WORK/writer.release.held" 60
expect_error "a trainer in a run directory a writer is writing into: refused, naming it" 1 \
    "$D is in use by tp-ckpt \(pid $writer $HOST_PATTERN" "$TRAIN" $LONG --steps 8 --ckpt-dir "$D" --resume
expect_ok "a second writer beside it" "$CK" synth -o "$D/step_00000005" --step 5 --tp 1 --pp 1 --model tiny
: >"$WORK/writer.release"
wait $writer
rc=$?
check_all "the held writer committed (exit $rc), latest its step" '[ $rc -eq 0 ] && [ "$(cat "$D/latest")" = step_00000006 ]'

# Under mpirun, the claim is rank 0's and its verdict every rank's. (The
# second trainers here pass --resume, as a job script does: without it, a
# directory where the first has committed a checkpoint is refused for that,
# before the claim is asked.)
D="$WORK/mpi"
TP_CKPT_FAULT=$(held mpi) "$TRAIN" $LONG --ckpt-dir "$D" >"$WORK/first.out" 2>&1 &
first=$!
wait_for "$D/.tp-run.lock" 20
run mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --tp 2 --steps 3 --ckpt-dir "$D" --resume </dev/null
check_all "tp2 under mpirun: refused, naming the holder (exit $RC)" \
    '[ $RC -ne 0 ] && grep -q "in use by tp-train (pid $first " "$WORK/.err"'
# kill -9: the kernel frees the lock with the process; the next run takes
# the directory at once and resumes from what the first committed.
kill -9 $first
wait $first 2>/dev/null
expect_ok "the directory of a kill -9'd trainer is taken at once" \
    "$TRAIN" --model tiny --micro-batch 2 --quiet --steps 4 --ckpt-every 2 --ckpt-dir "$D" --resume
check "the lock names the last holder" grep -q "^tp-train (pid [0-9]* $HOST_PATTERN" "$D/.tp-run.lock"

# What sits in the lock's place is refused by name, at once.
mkdir -p "$WORK/fifo" "$WORK/link"
mkfifo "$WORK/fifo/.tp-run.lock"
expect_error "a FIFO in the lock's place refused, not waited on" 1 "\.tp-run\.lock.*not a regular file" \
    timeout 20 "$TRAIN" --model tiny --steps 2 --quiet --ckpt-dir "$WORK/fifo"
ln -s "$WORK/elsewhere" "$WORK/link/.tp-run.lock"
expect_error "a symbolic link in the lock's place refused" 1 "\.tp-run\.lock" \
    timeout 20 "$TRAIN" --model tiny --steps 2 --quiet --ckpt-dir "$WORK/link"
check "nothing made through the link" [ ! -e "$WORK/elsewhere" ]

# ---------------------------------------------------------- object store
if ! webdav_start "$WORK/dav" 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] WebDAV: $(head -n 1 "$WORK/.err")"
    finish
    exit $?
fi
U="$WEBDAV_URL"
export TP_RUN_LEASE_SECONDS=3
lease_of() { curl -s -f "$U/$1/.tp-run.lease"; }

TP_CKPT_FAULT=$(held r1) "$TRAIN" $LONG --ckpt-dir "$U/r1" --ckpt-cache "$WORK/cache-a" >"$WORK/first.out" 2>&1 &
first=$!
n=0
while ! lease_of r1 >/dev/null && [ $n -lt 200 ]; do sleep 0.1; n=$((n + 1)); done
check "a trainer's lease names it" sh -c "curl -s -f '$U/r1/.tp-run.lease' | grep -q '\"pid\":$first'"
# Its holder is a live process of this machine: refused at once, where it
# was watched for renewals (up to a lease period).
expect_error "a second trainer (another cache) refused by the live lease" 1 \
    "$U/r1 is in use by tp-train \(pid $first $HOST_PATTERN.*its lease $U/r1/.tp-run.lease names process $first of this machine, which is running" \
    "$TRAIN" --model small --quiet --steps 3 --ckpt-every 1 --ckpt-dir "$U/r1" --ckpt-cache "$WORK/cache-b" --resume
check "the refused trainer uploaded nothing" [ ! -e "$WORK/dav/r1/step_00000001" ]
# On its way out, the refused trainer deleted the live run's lease (it had
# filled in the lease's URL before being refused): a third one then took the
# directory over and the live run ended, "its lease taken over".
check "and left the live run's lease in place, naming the live run" sh -c "curl -s -f '$U/r1/.tp-run.lease' | grep -q '\"pid\":$first'"
# A writer of a step into the live run: refused by its lease (it took the
# run's `latest` over, as in a local run directory).
expect_error "tp-ckpt synth -o a live run's step_N in an object store: refused by its lease, naming the trainer" 1 \
    "$U/r1 is in use by tp-train \(pid $first $HOST_PATTERN.*its lease $U/r1/.tp-run.lease names process $first of this machine, which is running" \
    "$CK" synth -o "$U/r1/step_00199999" --step 199999 --tp 1 --pp 1 --model tiny
check "and sent nothing there" sh -c "! curl -s -f '$U/r1/step_00199999/index.json' >/dev/null && ! curl -s -f '$U/r1/latest' | grep -q 199999"
kill -9 $first
wait $first 2>/dev/null
lease_of r1 | curl -s -f -T - "$U/r5/.tp-run.lease" >/dev/null
expect_ok "a kill -9'd trainer's lease (its pid gone here) does not hold a writer back" \
    "$CK" synth -o "$U/r5/step_00000007" --step 7 --tp 1 --pp 1 --model tiny
expect_ok "a kill -9'd trainer's lease (its pid gone here) taken at once" \
    "$TRAIN" --model tiny --quiet --steps 4 --ckpt-every 2 --ckpt-dir "$U/r1" --ckpt-cache "$WORK/cache-b" --resume
check "a finished run's lease is removed" sh -c "! curl -s -f '$U/r1/.tp-run.lease' >/dev/null"

# Another machine's lease that is no longer renewed: waited out, then taken.
curl -s -f -T - "$U/r2/.tp-run.lease" >/dev/null <<'EOF'
{"owner":"far-1-0","holder":"tp-train (pid 7 on host far-away, since 2026-01-01T00:00:00Z)","host":"far-away","pid":7,"renewals":4}
EOF
start=$(date +%s%N)
expect_ok "a stale lease of another machine is taken after a period without renewal" \
    "$TRAIN" --model tiny --quiet --steps 2 --ckpt-every 2 --ckpt-dir "$U/r2" --ckpt-cache "$WORK/cache-c"
waited=$((($(date +%s%N) - start) / 1000000))
check "it waited a whole period (${waited} ms >= 3000) before taking it" [ $waited -ge 3000 ]
check "and said what it waited for: the lease, its holder, the period" \
    grep -q "r2/.tp-run.lease names tp-train (pid 7 on host far-away, .*: watching it for up to 3 s to see whether it is renewed" "$WORK/.err"

# A lease is watched for the period its holder renews by (its
# period_seconds), not the watcher's own TP_RUN_LEASE_SECONDS: another
# machine's trainer at 20 s renews every 5 s, and a writer at 3 s gave up
# watching after 3 s and wrote beside the live run. Renewed 4.5 s in here.
put_far_lease() {
    curl -s -f -T - "$U/$1/.tp-run.lease" >/dev/null <<EOF
{"owner":"far-2-0","holder":"tp-train (pid 8 on host far-slow, since 2026-01-01T00:00:00Z)","host":"far-slow","pid":8,"renewals":$2,"period_seconds":20}
EOF
}
put_far_lease r6 1
"$CK" synth -o "$U/r6/step_00000003" --step 3 --tp 1 --pp 1 --model tiny >"$WORK/r6.out" 2>&1 &
writer=$!
sleep 4.5
put_far_lease r6 2
wait $writer
rc=$?
check_all "a writer watches a lease for the lease's own period (20 s), not its own (3 s): refused (exit $rc)" \
    '[ $rc -ne 0 ] && grep -q "$U/r6 is in use by tp-train (pid 8 on host far-slow.*lapses 20 s after" "$WORK/r6.out"'
check "and sent nothing there" sh -c "! curl -s -f '$U/r6/step_00000003/index.json' >/dev/null"

# And the other way, as in a local run directory: no trainer starts in an
# object store's run directory a writer is writing into (held at its
# commit); the writer's lease (one object a writer) goes when it is done.
writer_leases() { ls "$WORK/dav/$1/.tp-run.writers" 2>/dev/null; }
TP_CKPT_FAULT="before-rename:WAIT:$WORK/r7.release" "$CK" synth -o "$U/r7/step_00000006" --step 6 --tp 1 --pp 1 \
    --model tiny >"$WORK/r7.out" 2>&1 &
writer=$!
wait_for "$WORK/r7.release.held" 60
check "the writer's lease names it" sh -c "curl -s -f '$U/r7/.tp-run.writers/$(writer_leases r7 | head -n 1)' | grep -q '\"pid\":$writer'"
expect_error "a trainer in an object store's run directory a writer is writing into: refused, naming it" 1 \
    "$U/r7 is in use by tp-ckpt \(pid $writer $HOST_PATTERN.*, writing a checkpoint into it.*its lease $U/r7/\.tp-run\.writers/" \
    "$TRAIN" --model tiny --quiet --steps 8 --ckpt-every 2 --ckpt-dir "$U/r7" --ckpt-cache "$WORK/cache-f" --resume
check "the refused trainer left no lease of its own" sh -c "! curl -s -f '$U/r7/.tp-run.lease' >/dev/null"
: >"$WORK/r7.release"
wait $writer
rc=$?
check_all "the held writer committed (exit $rc), latest its step, its lease gone" \
    '[ $rc -eq 0 ] && [ "$(curl -s -f "$U/r7/latest")" = step_00000006 ] && [ -z "$(writer_leases r7)" ]'
# A writer's lease of another machine, no longer renewed: waited out for a
# period, then removed, so that no later run waits for it again.
curl -s -f -T - "$U/r7/.tp-run.writers/far-3-0" >/dev/null <<'EOF'
{"owner":"far-3-0","holder":"tp-reshard (pid 10 on host far-away, since 2026-01-01T00:00:00Z)","host":"far-away","pid":10,"renewals":2}
EOF
start=$(date +%s%N)
expect_ok "a stale writer's lease of another machine does not hold a trainer back: waited out, then taken" \
    "$TRAIN" --model tiny --quiet --steps 8 --ckpt-every 2 --ckpt-dir "$U/r7" --ckpt-cache "$WORK/cache-f" --resume
waited=$((($(date +%s%N) - start) / 1000000))
check "it waited a whole period (${waited} ms >= 3000), naming the writer's lease" \
    sh -c "[ $waited -ge 3000 ] && grep -q 'r7/.tp-run.writers/far-3-0 names tp-reshard (pid 10 on host far-away' '$WORK/.err'"
check "the dead writer's lease removed" [ -z "$(writer_leases r7)" ]

echo '{"owner": 5}' | curl -s -f -T - "$U/r3/.tp-run.lease" >/dev/null
expect_error "a malformed lease refused by name, never taken as free" 1 "$U/r3/.tp-run.lease: not a run lease" \
    "$TRAIN" --model tiny --quiet --steps 2 --ckpt-dir "$U/r3" --ckpt-cache "$WORK/cache-d"

# A lease taken over under a live trainer (its renewals held up, as by a
# network partition): it stops before writing another checkpoint.
TP_CKPT_FAULT=$(held r4) "$TRAIN" $LONG --ckpt-dir "$U/r4" --ckpt-cache "$WORK/cache-e" >"$WORK/first.out" 2>&1 &
first=$!
# Once renewed, the lease is held (before that, the trainer is still
# checking that its own lease stands, and would be refused at start).
n=0
while ! lease_of r4 | grep -q '"renewals":[1-9]' && [ $n -lt 200 ]; do sleep 0.1; n=$((n + 1)); done
curl -s -f -T - "$U/r4/.tp-run.lease" >/dev/null <<'EOF'
{"owner":"thief-1-0","holder":"tp-train (pid 9 on host thief, since 2026-01-01T00:00:00Z)","host":"thief","pid":9,"renewals":0}
EOF
# Released a lease period later: its renewals (every quarter period) read the
# lease meanwhile and found it another's, which nothing outside the trainer
# shows before it stops.
sleep "$TP_RUN_LEASE_SECONDS"
release r4
wait $first
rc=$?
check_all "a trainer whose lease was taken over stops (exit $rc), naming the new holder" \
    '[ $rc -ne 0 ] && grep -q "lease was taken over by tp-train (pid 9 on host thief" "$WORK/first.out"'
check "and leaves the new holder's lease in place" sh -c "curl -s -f '$U/r4/.tp-run.lease' | grep -q thief-1-0"

finish
