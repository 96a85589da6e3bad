#!/bin/sh
# tp-elastic guarding the run and everything around it (docs/ELASTIC.md, "One
# orchestrator per run"): a second `tp-elastic run` on a live run is refused
# at start, naming the live one's host and pid, and the live one goes on
# undisturbed; one whose orchestrator was killed with SIGKILL is taken over.
# A state.json naming a process that is not provably the run's launch (a
# stranger whose command line holds the run directory's name, a pid reused
# since, pid 1) gets no signal, and tp-elastic says why; pid -5 is refused.
# A FIFO at any file tp-elastic opens is refused by name at once (the FIFO's
# other end is never opened: before, the open blocked for good). Numbers out
# of range in state.json are refused by name, expected against found. A
# trainer's clock set forward does not stretch the hang allowance. A
# checkpoint another process reads is kept by --keep until it is done. A
# run directory a live tp-train holds is refused before any launch, and a
# launch refused for it later ends the run (the holder's checkpoints are not
# this run's). A state write that fails (state.json's place taken, a full
# disk) leaves no temporary file. A trainer that fails on a full disk is not
# called a bug.
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
. "$ROOT/tests/elastic/lib.sh"

use_open_mpi
ELASTIC="$BIN/tp-elastic"
TRAIN="$BIN/tp-train"
ARGS="--model tiny --quiet --global-batch 12 --micro-batch 2 --ckpt-every 10"
# Runs that must outlive what the test does meanwhile (a second
# orchestrator refused, one killed at step 20): LONG steps, a few seconds.
LONG=150
# The bound on a run that must finish (it must never hang the suite): a
# 400-step run took over 120 s under the sanitizers on 2 cores.
RUN_LIMIT=120
[ "${SANITIZED:-0}" = 1 ] && RUN_LIMIT=900
cd "$WORK" || exit 1

# --------------------------------------------- a second orchestrator, live
# The first runs LONG steps (seconds); the second, started while it trains,
# is refused at once naming the first's host and pid; the first is not
# disturbed: one launch, no failure, all LONG steps.
R="$WORK/live"
mkdir -p "$R/elastic"
"$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $ARGS --steps $LONG >"$WORK/live.out" 2>&1 &
first=$!
while ! grep -q '"step":20,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
expect_error "a second tp-elastic on a live run: refused, naming the live one's host and pid" 1 \
    "another tp-elastic runs this run: host $(hostname) pid $first," \
    timeout -k 5 20 "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $ARGS --steps $LONG
wait $first
check "live: the first one finishes (exit 0)" [ $? -eq 0 ]
check_all "live: the first's launch was not ended: one launch, no failure, step $LONG" \
    '[ "$(events "$R" launch)" -eq 1 ] && [ "$(events "$R" failure)" -eq 0 ] && [ "$(summary_field "$R" step)" -eq $LONG ]'
check "live: the second wrote nothing in the run's record" [ "$(events "$R" orchestrator_start)" -eq 1 ]

# ------------------------------------- the orchestrator killed: taken over
# Its lock went with it (the kernel releases an flock of a dead process).
R="$WORK/takeover"
mkdir -p "$R/elastic"
"$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $ARGS --steps $LONG >/dev/null 2>&1 &
first=$!
while ! grep -q '"step":20,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
kill -9 $first
wait $first 2>/dev/null
expect_ok "an orchestrator killed with SIGKILL: the next takes the run over" timeout -k 5 $RUN_LIMIT "$ELASTIC" run \
    --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $ARGS --steps $LONG
check_all "takeover: step $LONG, two orchestrators" \
    '[ "$(summary_field "$R" step)" -eq $LONG ] && [ "$(events "$R" orchestrator_start)" -eq 2 ]'

# ------------------------------------------- strangers named by state.json
# state_with_pid RUN PID [START]: a state.json of an earlier orchestrator
# whose launch was PID (started at START clock ticks after boot).
state_with_pid() {
    mkdir -p "$1/elastic"
    printf '{"launches":1,"restarts":0,"tp":1,"pp":1,"launch_pid":%s%s}\n' "$2" "${3:+,\"launch_start\":$3}" \
        >"$1/elastic/state.json"
}
# start_ticks PID: the process's start time, /proc/PID/stat's 22nd field
# (read after the command's name, which may hold spaces).
start_ticks() { sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f20; }
# alive PID: the process runs (a zombie, killed and not yet reaped by this
# shell, its parent, does not).
alive() { [ -e "/proc/$1" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }
# group_leader PID: whether PID leads its process group (setsid makes it so).
group_leader() { [ "$(ps -o pgid= -p "$1" | tr -d ' ')" = "$1" ]; }

# A process group whose command line holds the run directory's name ("base"
# in "database"), not a launch: before, SIGTERM then SIGKILL on the group.
setsid sh -c 'sleep 60; exit 0' database &
decoy=$!
for i in $(seq 50); do group_leader $decoy && break; sleep 0.1; done
check "decoy: a process group of its own" group_leader $decoy
state_with_pid base $decoy
expect_ok "a stranger as launch_pid (its command line holds 'base'): the run finishes" timeout -k 5 $RUN_LIMIT "$ELASTIC" run \
    --ckpt-dir base --world 2 $FAST -- "$TRAIN" $ARGS --steps 20
check "stranger: never signalled (still alive)" alive $decoy
check "stranger: tp-elastic says why it left it alone" \
    grep -q "launch_pid $decoy not signalled: [^\"]*does not carry TP_ELASTIC_LAUNCH=$decoy[^\"]*\",\"event\":\"earlier_launch_skipped\"" \
    "$WORK/.out"
# dash takes no "--" before a negative pid (its kill then fails, and the wait
# below outlasted the decoy's 60 s).
kill -9 -$decoy 2>/dev/null
wait $decoy 2>/dev/null

# A process that carries a launch's marker (as the launch it replaced would)
# but started at another time than recorded: the pid was reused.
setsid sh -c 'export TP_ELASTIC_LAUNCH=$$; exec sleep 60' &
marked=$!
for i in $(seq 50); do group_leader $marked && [ "$(cat /proc/$marked/comm)" = sleep ] && break; sleep 0.1; done
state_with_pid "$WORK/reused" $marked $(($(start_ticks $marked) + 1))
expect_ok "a reused pid (start time not the launch's): the run finishes" timeout -k 5 $RUN_LIMIT "$ELASTIC" run \
    --ckpt-dir "$WORK/reused" --world 2 $FAST -- "$TRAIN" $ARGS --steps 20
check "reused pid: never signalled (still alive)" alive $marked
check "reused pid: tp-elastic says the pid was reused" grep -q 'the pid was reused","event":"earlier_launch_skipped"' "$WORK/.out"
# The same process with its start time right is the launch: ended.
state_with_pid "$WORK/owned" $marked "$(start_ticks $marked)"
expect_ok "the launch itself (marker and start time): the run finishes" timeout -k 5 $RUN_LIMIT "$ELASTIC" run \
    --ckpt-dir "$WORK/owned" --world 2 $FAST -- "$TRAIN" $ARGS --steps 20
check_all "the launch itself: ended" '! alive $marked'
check "the launch itself: an event says so" grep -q '"event":"earlier_launch_ended"' "$WORK/.out"
kill -9 $marked 2>/dev/null
wait $marked 2>/dev/null

# pid 1 (kill(-1) is every process we may signal) and 0 are never signalled;
# a negative pid is out of range.
state_with_pid "$WORK/one" 1
expect_ok "launch_pid 1: the run finishes" timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$WORK/one" --world 2 $FAST \
    -- "$TRAIN" $ARGS --steps 20
check "launch_pid 1: not signalled, and said so" grep -q '"pid":1,"why":"[^"]*launch_pid 1 not signalled: pid 1 is never signalled[^"]*","event":"earlier_launch_skipped"' "$WORK/.out"
state_with_pid "$WORK/zero" 0
expect_ok "launch_pid 0 (no launch): the run finishes" timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$WORK/zero" --world 2 \
    $FAST -- "$TRAIN" $ARGS --steps 20
check "launch_pid 0: nothing signalled, nothing ended" sh -c "! grep -q 'earlier_launch_' '$WORK/.out'"
state_with_pid "$WORK/negative" -5
expect_error "launch_pid -5: refused by name" 1 'state.json: "launch_pid": expected an integer from 0 to 4194304, got -5' \
    timeout -k 5 20 "$ELASTIC" run --ckpt-dir "$WORK/negative" --world 2 $FAST -- "$TRAIN" $ARGS --steps 20

# ---------------------------------------------------------------- FIFOs
# fifo_refused NAME FILE [OPTIONS]: a FIFO at FILE (a path under a fresh run
# directory RUN, or another) and tp-elastic run on RUN exits 1 at once,
# naming it; the FIFO's other end is never opened.
fifo_refused() {
    name=$1 file=$2
    shift 2
    mkdir -p "$RUN/elastic"
    mkfifo "$file"
    expect_error "a FIFO at $name: refused by name" 1 "$file is a FIFO, not a regular file" \
        timeout -k 5 20 "$ELASTIC" run --ckpt-dir "$RUN" $FAST "$@" -- "$TRAIN" $ARGS --steps 20
}
for name in train.jsonl events.jsonl state.json state.json.tmp launch-1.out orchestrator.lock; do
    RUN="$WORK/fifo-$name"
    fifo_refused "$name" "$RUN/elastic/$name" --world 2
done
RUN="$WORK/fifo-hostfile.launch"
echo "localhost slots=2" >"$WORK/hosts"
fifo_refused hostfile.launch "$RUN/elastic/hostfile.launch" --hostfile "$WORK/hosts"
RUN="$WORK/fifo-world"
fifo_refused "the --world-file" "$WORK/world.fifo" --world-file "$WORK/world.fifo"
RUN="$WORK/fifo-hosts"
fifo_refused "the --hostfile" "$WORK/hosts.fifo" --hostfile "$WORK/hosts.fifo"
RUN="$WORK/fifo-events"
fifo_refused "the --events file" "$WORK/events.fifo" --world 2 --events "$WORK/events.fifo"

# ------------------------------------------ state.json numbers out of range
# bad_state FIELD VALUE EXPECTED: refused by name, expected against found.
BAD=0
bad_state() {
    BAD=$((BAD + 1))
    R="$WORK/bad-$BAD"
    mkdir -p "$R/elastic"
    # FIELD's value in place of the default's, never beside it: a key given
    # twice is refused before any value is read.
    "$PY" -c 'import json, sys
state = {"launches": 1, "tp": 1, "pp": 1}
state[sys.argv[1]] = json.loads(sys.argv[2])
print(json.dumps(state, separators=(",", ":")))' "$1" "$2" >"$R/elastic/state.json"
    expect_error "state.json $1 $2: refused by name" 1 "state.json: \"$1\": expected $3, got $4" \
        timeout -k 5 20 "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $ARGS --steps 20
}
bad_state launches 1e308 "an integer from 0 to 2147483647" "1e\\+308"
bad_state repeats -7 "an integer from 0 to 2147483647" -7
bad_state tp -3 "an integer from 0 to 1048576" -3
bad_state restarts 2.5 "an integer from 0 to 2147483647" 2.5
bad_state last_step '"ten"' "an integer from 0 to 9007199254740992" '"ten"'
bad_state wall_seconds -1 "a number from 0 to 1000000000000" -1
bad_state slowest_step_seconds 1e300 "a number from 0 to 1000000000" "1e\\+300"
# ------------------------------------------------ a clock set forward
# A trainer whose clock jumps 10^5 s between its first two steps, then goes
# silent: the step is timed no longer than tp-elastic saw it take (the
# trainer's times are the wall clock's), so the hang is found at the
# heartbeat, not in 5 x 10^5 s; with --max-restarts 0 the run gives up.
cat >"$WORK/clock-jump.sh" <<'EOF'
while [ $# -gt 0 ]; do [ "$1" = --log ] && log=$2; shift; done
now=$(date +%s)
echo "{\"event\":\"start\",\"step\":0,\"load_seconds\":0,\"time\":$now}" >>"$log"
echo "{\"step\":1,\"loss\":5,\"time\":$((now + 1))}" >>"$log"
echo "{\"step\":2,\"loss\":5,\"time\":$((now + 100001))}" >>"$log"
exec sleep 600
EOF
R="$WORK/clock"
mkdir -p "$R/elastic"
run timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST --max-restarts 0 -- sh "$WORK/clock-jump.sh" \
    $ARGS --steps 20
check "a trainer's clock set forward: the run gives up on its hang (exit $RC, not 124)" [ "$RC" -eq 1 ]
check "a trainer's clock set forward: the hang's allowance is the heartbeat, its slowest step what was seen" "$PY" -c '
import json, sys
hangs = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "hang"]
sys.exit(not (len(hangs) == 1 and hangs[0]["allowance_seconds"] == float(sys.argv[2]) and
              hangs[0]["slowest_step_seconds"] < 30) and hangs)' "$R/elastic/events.jsonl" "$HEARTBEAT"

# ------------------------------------------------- --keep beside a reader
# A checkpoint --keep would remove while another process reads it (a
# tp-reshard held at its output's commit, the source's read lock still
# held): kept, one event saying it is being read, and removed by a later
# pass once the reader is done. Before, it was removed under the reader,
# which then failed calling the vanished shards damaged ("metadata damaged
# (size -1 bytes, ...)").
R="$WORK/keepread"
expect_ok "--keep beside a reader: a run with checkpoints at steps 10 and 20" timeout -k 5 $RUN_LIMIT "$TRAIN" $ARGS \
    --steps 20 --ckpt-dir "$R"
TP_CKPT_FAULT="before-index:WAIT:$WORK/keepread.release" "$BIN/tp-reshard" "$R/step_00000010" --to tp1 \
    -o "$WORK/keepread.out" >"$WORK/reader.out" 2>&1 &
reader=$!
check "--keep beside a reader: the reader holds step 10 (at its output's commit)" wait_for "$WORK/keepread.release.held" 60
expect_ok "--keep 1 beside a reader: the run finishes" timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$R" --world 1 \
    --keep 1 $FAST -- "$TRAIN" $ARGS --steps 40
check_all "--keep 1 beside a reader: step 10 kept for its reader, steps 20 and 30 removed" \
    '[ "$(ls "$R" | grep step_ | tr "\n" " ")" = "step_00000010 step_00000040 " ]'
check_all "--keep 1 beside a reader: said once, as an event, that step 10 is being read" \
    '[ "$(events "$R" checkpoint_kept)" -eq 1 ] && grep -q "step_00000010 is being read.*\"event\":\"checkpoint_kept\"" "$WORK/.out"'
: >"$WORK/keepread.release"
wait $reader
rc=$?
check "--keep beside a reader: the reader finished undisturbed (exit $rc)" [ $rc -eq 0 ]
expect_ok "--keep beside a reader: what it wrote equals its source" "$BIN/tp-ckpt" diff "$WORK/keepread.out" \
    "$R/step_00000010"
expect_ok "--keep beside a reader: the finished run again" timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$R" \
    --world 1 --keep 1 $FAST -- "$TRAIN" $ARGS --steps 40
check_all "--keep beside a reader: its reader done, step 10 is removed by the next pass" \
    '[ "$(ls "$R" | grep step_ | tr "\n" " ")" = "step_00000040 " ] &&
     grep -q "step_00000010\",\"keep\":1,\"event\":\"checkpoint_removed\"" "$WORK/.out"'

# ------------------------------------- a run directory a tp-train holds
# A tp-train started by hand holds the directory (its claim, .tp-run.lock;
# held at its first commit): tp-elastic refuses at once, naming it, and
# launches nothing. Before, it launched, the launch was refused, and the
# holder's last checkpoint was then taken for this run's: "finished at step
# 200", exit 0, with nothing trained.
R="$WORK/claimed"
TP_CKPT_FAULT="before-latest:WAIT:$WORK/claimed.release" "$TRAIN" $ARGS --steps 20 --ckpt-dir "$R" \
    >"$WORK/holder.out" 2>&1 &
holder=$!
check "claimed: the holder is at its first commit" wait_for "$WORK/claimed.release.held" 60
expect_error "tp-elastic on a directory a live tp-train holds: refused before any launch, naming the holder" 1 \
    "refusing to launch the trainer: $R is in use by tp-train \\(pid $holder on host [^)]*\\): one run per directory" \
    timeout -k 5 60 "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST -- "$TRAIN" $ARGS --steps 20
check "claimed: nothing launched" [ "$(events "$R" launch)" -eq 0 ]
: >"$WORK/claimed.release"
wait $holder
rc=$?
check_all "claimed: the holder finished undisturbed (exit $rc), its checkpoints its own" \
    '[ $rc -eq 0 ] && [ "$(ls "$R" | grep step_ | tr "\n" " ")" = "step_00000010 step_00000020 " ]'

# A launch refused because another run took the directory after that check
# (its stop line says "in_use", as a refused tp-train's does; the script
# plays both: the other run's checkpoint of the last step appears, then the
# refusal): given up at once, the other's checkpoint not taken for this
# run's. Before, it was relaunched, chose that checkpoint and reported the
# run finished (exit 0).
cat >"$WORK/refused.sh" <<'EOF'
while [ $# -gt 0 ]; do
    case $1 in --log) log=$2 ;; --ckpt-dir) dir=$2 ;; esac
    shift
done
cp -r "$OTHER/step_00000020" "$dir/"
said="$dir is in use by tp-train (pid 7 on host far, since 2026-01-01T00:00:00Z): one run per directory"
echo "{\"event\":\"stop\",\"step\":0,\"reason\":\"in_use\",\"error\":\"$said\",\"time\":$(date +%s)}" >>"$log"
echo "tp-train: error: $said" >&2
exit 1
EOF
R="$WORK/taken"
expect_error "a launch refused as another run took the directory: given up at once" 1 \
    "the trainer was refused the run directory, which another live run holds; .*in use by tp-train \\(pid 7 on host far" \
    env OTHER="$WORK/claimed" timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST \
    -- sh "$WORK/refused.sh" $ARGS --steps 20
check_all "taken: one launch, not finished" \
    '[ "$(events "$R" launch)" -eq 1 ] && [ "$(summary_field "$R" finished)" = False ]'

# ------------------------------------------------ a state write that fails
# state.json's place taken by a directory while the trainer runs (held at
# its last commit): the orchestrator's state cannot be written; it stops,
# naming the file and why, and leaves no state.json.tmp behind (before, it
# did after every failed write).
R="$WORK/stateless"
TP_CKPT_FAULT="before-latest:WAIT:$WORK/stateless.release" timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$R" \
    --world 1 $FAST -- "$TRAIN" $ARGS --steps 10 >"$WORK/stateless.out" 2>"$WORK/stateless.err" &
orchestrator=$!
check "stateless: the trainer is at its commit" wait_for "$WORK/stateless.release.held" 60
rm -f "$R/elastic/state.json"
mkdir -p "$R/elastic/state.json/in-the-way"
: >"$WORK/stateless.release"
wait $orchestrator
rc=$?
check_all "stateless: exit 1, naming the file and why (exit $rc)" \
    '[ $rc -eq 1 ] && grep -q "state.json: cannot write: Is a directory" "$WORK/stateless.err"'
check "stateless: no state.json.tmp left" [ ! -e "$R/elastic/state.json.tmp" ]
# A full disk, where a small tmpfs can be mounted (root): the state
# directory (--state-dir) on one with a page left, which the orchestrator's
# lock takes; the first state write fails, and its temporary file goes.
FULL="$WORK/full-state"
mkdir -p "$FULL"
if mount -t tmpfs -o size=64k tmpfs "$FULL" 2>/dev/null; then
    trap 'umount "$FULL" 2>/dev/null; rm -rf "$WORK"' EXIT
    dd if=/dev/zero of="$FULL/fill" bs=4k 2>/dev/null
    truncate -s -4096 "$FULL/fill"
    expect_error "a state write on a full disk: exit 1, naming the file and why" 1 \
        "$FULL/state.json: cannot write: No space left on device" \
        timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$WORK/full-run" --state-dir "$FULL" \
        --events "$WORK/full-events.jsonl" --world 1 $FAST -- "$TRAIN" $ARGS --steps 10
    check "a state write on a full disk: no state.json.tmp left" [ ! -e "$FULL/state.json.tmp" ]
    umount "$FULL"
    trap 'rm -rf "$WORK"' EXIT
else
    echo "[$NAME] SKIP: cannot mount a tmpfs here (not root?): the full-disk state write is not tried"
fi

# ------------------------------------------------------------ a full disk
# A trainer that fails at once, every time, saying the disk is full (as a
# checkpoint write does): the give-up says so, naming the run directory's
# device, not "a bug".
R="$WORK/full"
expect_error "a trainer failing on a full disk: the give-up says no space is left, naming the path" 1 \
    "failed 3 times in a row at step 0 without progress \\([^)]*\\): no space left on the device of $R; free space" \
    timeout -k 5 $RUN_LIMIT "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST \
    -- sh -c 'echo "tp-train: $0/step_00000010: cannot write: No space left on device" >&2; exit 1' "$R" $ARGS --steps 20
finish
