#!/bin/sh
# tp-elastic's recovery, the quick tier's scenario of it (docs/ELASTIC.md):
# under mpirun, a rank of a tp2pp2 run dies (SIGKILL) while capacity drops
# from 4 ranks to 3; the run relaunches at the layout the planner picks for 3,
# resharding its checkpoint at load, and finishes with the losses of an
# uninterrupted run (1e-4 relative), having recomputed at most the steps
# since the last checkpoint and left nothing running. Then a copy whose
# newest checkpoint the store cannot read: tp-elastic gives up at once,
# naming it, rather than calling it rejected and launching on an older one.
# And the steps an orchestrator killed with SIGKILL did not record are
# counted as recomputed by the next; a relaunch that fails before its first
# step does not count them again. And an srun step held pending (a fake
# srun that says so) is a wait for capacity, not a hang, bounded by
# --capacity-wait.
# The other faults are test_elastic.sh's.
# tier: check
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/elastic/lib.sh"

mpirun_runs

# ------------------------------------------- a rank killed, capacity shrinks
# Rank 1 dies (SIGKILL) after step 25; the world file drops to 3 as it dies.
# The run relaunches at the layout the planner picks for 3 ranks, resharding
# at load, and finishes.
R="$WORK/kill"
shrink_world_at_fault "$WORK/world.kill" "$R.fault" 4 3
mkdir -p "$R"
expect_ok "kill -9 of a rank: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world-file "$WORK/world.kill" $FAST \
    -- "$TRAIN" $TRAIN_ARGS --fault die --fault-step 25 --fault-rank 1 --fault-once "$R.fault"
kill $watcher 2>/dev/null
check "kill -9: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
check "kill -9: one failure recorded" [ "$(events "$R" failure)" -eq 1 ]
check "kill -9: relaunched at 3 ranks" grep -q '"ranks":3' "$R/elastic/events.jsonl"
check "kill -9: resharded at load (tp2pp2 to a 3-rank layout)" [ "$(events "$R" reshard)" -ge 1 ]
# Saves are asynchronous: step 20's may still be on its way when the rank
# dies at step 25 (seen under load), and then step 10's is the newest. What
# may be recomputed is what follows the newest save the first launch logged.
saved=$("$PY" -c 'import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
starts = [i for i, r in enumerate(lines) if r.get("event") == "start"]
print(max([r["step"] for r in lines[:starts[1]] if r.get("event") == "save"] + [0]))' "$R/elastic/train.jsonl")
check "kill -9: at most the steps since the newest committed checkpoint (step $saved) recomputed" \
    [ "$(summary_field "$R" steps_recomputed)" -le $((25 - saved)) ]
check "kill -9: no trainer left running" nothing_left "$R"
# The time shares, judged by the events' clock: the first launch's time to
# its first step is startup (the run trained nothing before it), the shares
# and the training add up to the wall time, and the ETTR is their ratio.
check "kill -9: the wall time is training plus the lost shares, startup the first launch's load" "$PY" -c '
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
s = [e for e in events if e["event"] == "summary"][-1]
lost = s["lost_seconds"]
first_launch = next(e["time"] for e in events if e["event"] == "launch")
start = next(e["time"] for e in events if e["event"] == "orchestrator_start")
assert s["trained"] is True and 0 < s["ettr"] < 1, s
assert lost["startup"] >= first_launch - start - 0.01 and lost["startup"] > 0, s
assert abs(s["training_seconds"] + sum(lost.values()) - s["wall_seconds"]) < 0.05, s
assert abs(s["ettr"] - s["training_seconds"] / s["wall_seconds"]) < 1e-9, s' "$R/elastic/events.jsonl"


# ------------------------------- a checkpoint the store cannot read is no rejection
# The killed run's copy, its newest checkpoint's shard unreadable (a symlink
# loop: ELOOP, a system error as EIO or EACCES are; root meets no EACCES).
# That says nothing of the checkpoint: tp-elastic gives up at once, naming
# it, as the trainer's resume refuses to take an older one in its place.
# Before, it was "checkpoint_rejected", step 50 was "chosen", and three
# launches failed on it before a give-up that called it the trainer's bug.
R="$WORK/unread"
cp -r "$WORK/kill" "$R" && rm -rf "$R/elastic"
newest=$(ls -d "$R"/step_* | tail -n 1)
shard=$(ls "$newest"/shard_*.h5 | head -n 1)
rm "$shard" && ln -s "$(basename "$shard")" "$shard"
run "$ELASTIC" run --ckpt-dir "$R" --world 4 $FAST -- "$TRAIN" $TRAIN_ARGS
check "unreadable: exit 1" [ "$RC" -eq 1 ]
check "unreadable: the error names the checkpoint and the store's error" \
    grep -q "error: cannot choose the checkpoint to resume from: .*Too many levels of symbolic links; .*$(basename "$newest") could not be read, and no older checkpoint is taken" "$WORK/.err"
check_all "unreadable: nothing launched, nothing called rejected or chosen" \
    '[ "$(events "$R" launch)" -eq 0 ] && [ "$(events "$R" checkpoint_rejected)" -eq 0 ] && [ "$(events "$R" checkpoint_chosen)" -eq 0 ]'
check "unreadable: one give_up" [ "$(events "$R" give_up)" -eq 1 ]


# ---------------- steps an orchestrator killed with SIGKILL lost are counted
# What such a death leaves (srun's tasks, ended by Slurm, save nothing): a
# state.json written at the last launch (last_step 20), the trainer's log
# at step 25, the newest checkpoint step 20. The next orchestrator resumes
# from step 20: 5 steps recomputed. Before, state.json's 20 was all it knew:
# "0 steps recomputed".
R="$WORK/lost"
expect_ok "lost: a run to step 25" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --steps 25
rm -rf "$R/step_00000025" && echo step_00000020 >"$R/latest"
"$PY" -c 'import json, sys
s = json.load(open(sys.argv[1])); s["last_step"] = 20; json.dump(s, open(sys.argv[1], "w"))' "$R/elastic/state.json"
expect_ok "lost: the next orchestrator finishes the run" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST \
    -- "$TRAIN" $TRAIN_ARGS --steps 30
check "lost: the 5 steps past the checkpoint counted as recomputed" [ "$(summary_field "$R" steps_recomputed)" -eq 5 ]


# ------------- a relaunch that fails before its first step counts nothing
# Rank 1 dies after step 25; the next launch fails at once (a wrapper exits
# 1: a launcher that could not start); the third finishes. Steps past the
# newest checkpoint were computed twice: once before the death, once by the
# third launch. Before, each relaunch counted them (the furthest step less
# the one resumed from): twice as many as were.
R="$WORK/twice"
# Launches told apart by their marker (TP_ELASTIC_LAUNCH), which every rank
# of one carries: a count in a file raced between the ranks.
printf '#!/bin/sh\nmkdir -p "%s.launches/$TP_ELASTIC_LAUNCH"\n[ "$(ls "%s.launches" | wc -l)" -eq 2 ] && exit 1\nexec "%s" "$@"\n' \
    "$R" "$R" "$TRAIN" >"$WORK/twice.sh"
expect_ok "a relaunch failing before its first step: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST \
    -- sh "$WORK/twice.sh" $TRAIN_ARGS --steps 40 --fault die --fault-step 25 --fault-rank 1 --fault-once "$R.fault"
check "twice: two failures" [ "$(events "$R" failure)" -eq 2 ]
redone=$("$PY" -c 'import json, sys
seen, n = 0, 0
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r:
        n += r["step"] <= seen
        seen = max(seen, r["step"])
print(n)' "$R/elastic/train.jsonl")
check "twice: the steps recomputed counted once ($redone in the log, $(summary_field "$R" steps_recomputed) said)" \
    [ "$(summary_field "$R" steps_recomputed)" -eq "$redone" ]

# ------------------- srun's step held pending: not called the trainer's bug
# A fake srun as Slurm's when the allocation's CPUs are taken by another
# step: it waits (pending) and, told SIGTERM at --start-timeout, says what
# the real one says. Before, the give-up called it "a bug, not a fault",
# quoting "Job/step already completing or completed".
mkdir -p "$WORK/pending"
printf '#!/bin/sh\ntrap '"'"'echo "srun: Cancelled pending job step with signal 15" >&2; echo "srun: error: Unable to create step for job 77: Job/step already completing or completed" >&2; exit 1'"'"' TERM\nwhile :; do sleep 0.1; done\n' \
    >"$WORK/pending/srun"
chmod +x "$WORK/pending/srun"
expect_error "srun's step pending: the give-up says so" 1 \
    "srun's job step never started, 2 times in a row .*held it pending .*by another step of the job" \
    env PATH="$WORK/pending:$PATH" "$ELASTIC" run --ckpt-dir "$WORK/pendingrun" --launcher srun --world 2 \
    --backoff 0.1 --start-timeout 1 --grace 2 --repeat-limit 2 -- "$TRAIN" $TRAIN_ARGS

# ----------- srun's step held pending: a wait for capacity, not a hang
# A fake srun as Slurm's when the allocation's CPUs are still held by
# another step of the job (the step before it ending): for the listed
# launches (PEND_LAUNCH: the Nth, or every one) it says what the real one says ("step creation temporarily
# disabled, retrying (Requested nodes are busy)"), waits PEND seconds (or
# for good), says "Step created", then runs the step with mpirun. Before,
# the wait was a hang at --start-timeout: a hang event, its time lost to
# detection, and a relaunch. A launch's start gets $HEARTBEAT s (4; 20
# under the sanitizers) and the step is pending 3 s longer: with 1 s, a
# launch of 2 ranks under load (the suite runs 3 tests on 2 cores) was a
# hang before its first step in 2 runs of 3.
mkdir -p "$WORK/pendsrun"
cat >"$WORK/pendsrun/srun" <<'EOF_SRUN'
#!/bin/sh
n=1
while [ $# -gt 0 ]; do
    case "$1" in
    -n) n=$2; shift 2 ;;
    -N | --nodelist) shift 2 ;;
    --*) shift ;;
    *) break ;;
    esac
done
echo >>"$PEND_CALLS"
if [ "$PEND_LAUNCH" = every ] || [ "$(wc -l <"$PEND_CALLS")" -eq "$PEND_LAUNCH" ]; then
    echo "srun: Job 77 step creation temporarily disabled, retrying (Requested nodes are busy)" >&2
    if [ "$PEND" = forever ]; then while :; do sleep 0.1; done; fi
    sleep "$PEND"
    echo "srun: Step created for job 77" >&2
fi
exec mpirun -np "$n" "$@"
EOF_SRUN
chmod +x "$WORK/pendsrun/srun"
# A rank dies after step 25; the relaunch's step is held pending
# $HEARTBEAT + 3 s, past --start-timeout.
R="$WORK/pendrelaunch"
expect_ok "pending relaunch: the run finishes" env PATH="$WORK/pendsrun:$PATH" PEND_CALLS="$R.calls" PEND_LAUNCH=2 \
    PEND=$((HEARTBEAT + 3)) "$ELASTIC" run --ckpt-dir "$R" --launcher srun --world 2 --backoff 0.1 \
    --heartbeat-timeout "$HEARTBEAT" --start-timeout "$HEARTBEAT" --grace 2 -- "$TRAIN" $TRAIN_ARGS --steps 30 \
    --fault die --fault-step 25 --fault-rank 1 --fault-once "$R.fault"
check_all "pending relaunch: no hang, one failure (the rank), 2 launches" \
    '[ "$(events "$R" hang)" -eq 0 ] && [ "$(events "$R" failure)" -eq 1 ] && [ "$(events "$R" launch)" -eq 2 ]'
check "pending relaunch: step_pending names srun's line" \
    grep -q '"why":"srun: Job 77 step creation temporarily disabled, retrying (Requested nodes are busy)".*"event":"step_pending"' \
    "$R/elastic/events.jsonl"
pending=$(grep '"event":"step_created"' "$R/elastic/events.jsonl" | sed 's/.*"pending_seconds":\([0-9.]*\).*/\1/')
check "pending relaunch: step_created after about $((HEARTBEAT + 3)) s pending (${pending:-none})" \
    "$PY" -c 'import sys; assert float(sys.argv[2]) - 0.5 <= float(sys.argv[1]) <= float(sys.argv[2]) + 20' \
    "${pending:-0}" $((HEARTBEAT + 3))
check "pending relaunch: nothing lost to detection, the wait lost to relaunch" "$PY" -c 'import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]["lost_seconds"]
assert s["detection"] == 0 and s["relaunch"] >= float(sys.argv[2]), s' "$R/elastic/events.jsonl" "${pending:-$((HEARTBEAT + 3))}"
# A step pending for good: waited --capacity-wait (2 s), then given up as
# capacity that never came, the trainer never launched; not hangs at
# --start-timeout, relaunched until called "never started, N times".
R="$WORK/pendforever"
expect_error "pending for good: given up after --capacity-wait" 1 \
    "srun's job step stayed pending for the 2 s of --capacity-wait: Slurm had no free CPUs in the allocation for its 2 ranks \\(srun: Job 77 step creation temporarily disabled" \
    env PATH="$WORK/pendsrun:$PATH" PEND_CALLS="$R.calls" PEND_LAUNCH=every PEND=forever "$ELASTIC" run --ckpt-dir "$R" \
    --launcher srun --world 2 --backoff 0.1 --start-timeout 1 --capacity-wait 2 --grace 2 -- "$TRAIN" $TRAIN_ARGS
check_all "pending for good: one launch, no hang, no failure" \
    '[ "$(events "$R" launch)" -eq 1 ] && [ "$(events "$R" hang)" -eq 0 ] && [ "$(events "$R" failure)" -eq 0 ]'
check "pending for good: nothing left running" nothing_left "$R"
# The first launch's step pending until given up: nothing trained, its wait
# lost (startup). Before, a wait of the first launch was counted nowhere:
# an effective training time of 100%.
check "pending for good: never trained, the pending wait lost to startup, no ETTR" "$PY" -c '
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
s = [e for e in events if e["event"] == "summary"][-1]
pending = next(e["time"] for e in events if e["event"] == "step_pending")
gave_up = next(e["time"] for e in events if e["event"] == "give_up")
assert s["trained"] is False and s["ettr"] == 0 and s["training_seconds"] == 0, s
assert s["lost_seconds"]["startup"] >= gave_up - pending >= 2, (s, gave_up - pending)' "$R/elastic/events.jsonl"
check "pending for good: tp-elastic run says no effective training time" \
    grep -q "effective training time none (no step trained)$" "$WORK/.out"

# What the planner and the report make of the run.
expect_ok "plan --ckpt: the model and layout of a run" "$ELASTIC" plan --world 3 --ckpt "$WORK/kill" --global-batch 12
check "plan --ckpt: 3 ranks, the current layout kept" grep -q "chosen: tp1 pp1 dp3.*keeps the current" "$WORK/.out"
expect_ok "report: an SVG of the killed run" "$ELASTIC" report "$WORK/kill" -o "$WORK/kill.svg"
check "report: an SVG with the loss of both launches" sh -c "grep -q '<svg' '$WORK/kill.svg' && grep -q 'launch 2' '$WORK/kill.svg'"
check "report: the summary says one restart" grep -Eq "^restarts +1$" "$WORK/.out"
finish
