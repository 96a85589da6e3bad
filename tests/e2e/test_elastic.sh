#!/bin/sh
# End-to-end tests of `tp-elastic run` with mpirun (docs/ELASTIC.md): a hang,
# a slow commit that is not one, capacity growing, capacity below --min-world, a trainer that always fails,
# one that diverges, --keep beside a damaged checkpoint, every checkpoint damaged,
# the orchestrator itself killed and restarted, a stop asked once or twice of a hung trainer, a run continued without
# model flags (its checkpoint's model and precision), a damaged newest checkpoint
# (a rank killed while capacity shrinks: test_elastic_recover.sh). In every
# case the run reaches its last step, recomputes no more than the steps since
# the last checkpoint, and logs the losses of an uninterrupted run (1e-4
# relative): the global batch and the data position are kept across layouts.
# takes: about 115 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/elastic/lib.sh"

mpirun_runs

# --------------------------------------------------------------------- hang
# Rank 1 stops making progress after step 40: no step for the heartbeat
# timeout is a hang; the step is stopped and relaunched.
R="$WORK/hang"
expect_ok "a hang: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world 4 $FAST \
    -- "$TRAIN" $TRAIN_ARGS --fault hang --fault-step 40 --fault-rank 1 --fault-once "$R.fault"
check "hang: detected as a hang" [ "$(events "$R" hang)" -eq 1 ]
check "hang: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
check "hang: no trainer left running" nothing_left "$R"

# ------------------------------------------------------ a slow commit
# Every commit held 4 s longer than the heartbeat timeout (a slow disk): at
# the next save the trainer waits for it, with no step line for longer than
# the heartbeat. It logs that it waits for a save, and tp-elastic gives it a
# save's allowance instead of taking it for hung (under load, a save can be
# that slow).
R="$WORK/slowsave"
expect_ok "a slow commit: the run finishes" env TP_CKPT_FAULT=before-index:SLEEP:$((HEARTBEAT + 4)) "$ELASTIC" run \
    --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --steps 20
check "slow commit: the trainer said it waited for a save" grep -q '"event":"save_wait","step":10,' \
    "$R/elastic/train.jsonl"
check_all "slow commit: no hang, no failure, one launch" \
    '[ "$(events "$R" hang)" -eq 0 ] && [ "$(events "$R" failure)" -eq 0 ] && [ "$(events "$R" launch)" -eq 1 ]'
check "slow commit: the last checkpoint committed" [ -d "$R/step_00000020" ]

# ------------------------------------------ steps longer than the heartbeat
# Every step takes 2 s more than it computes (--fault slow-steps), under a
# 1 s heartbeat: the steps are not hangs, since every allowance is at least
# 5 times the slowest step seen (--heartbeat-multiple). Once step 3 is
# logged, the trainer is stopped (SIGSTOP): that hang is still found, in 5
# slowest steps (not in the 1 s heartbeat), and the run finishes after one
# relaunch from the newest checkpoint. (With --heartbeat-multiple 0, each
# launch's step 2 was a hang, and tp-elastic gave up at step 1.) 8 steps:
# mpirun, told to end the launch, sends the stopped trainer SIGCONT before
# SIGTERM, and the trainer finishes the step it is in; within the two
# graces (4 s) it did steps 4 and 5, and with 5 steps it once finished the
# run there, leaving no relaunch.
R="$WORK/slowsteps"
SLOW_ARGS="--model tiny --quiet --global-batch 4 --steps 8 --ckpt-every 3 --fault slow-steps --fault-step 1"
mkdir -p "$R/elastic"
(
    while ! grep -q '"step":3,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
    pkill -STOP -f -- "^$TRAIN .*--ckpt-dir $R "
) &
watcher=$!
expect_ok "steps of 2 s under a 1 s heartbeat, one stopped: the run finishes" "$ELASTIC" run --ckpt-dir "$R" \
    --world 1 --backoff 0.2 --heartbeat-timeout 1 --start-timeout 60 --grace 2 -- "$TRAIN" $SLOW_ARGS
wait $watcher
check_all "slow steps: the stopped trainer, and nothing else, was a hang; one relaunch" \
    '[ "$(events "$R" hang)" -eq 1 ] && [ "$(events "$R" launch)" -eq 2 ] && [ "$(events "$R" failure)" -eq 0 ]'
# (A step is timed by the trainer's clock, but never longer than tp-elastic
# saw between reading its lines, and a poll: a line read late under load
# times the step after it shorter. Hence 1.5 s, not 2.)
check "slow steps: the hang was judged after 5 slowest steps (1.5 s or more), silent that long since step 3" "$PY" -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/elastic/events.jsonl")]
hang = [e for e in lines if e["event"] == "hang"][0]
step3 = [json.loads(l) for l in open(sys.argv[1] + "/elastic/train.jsonl") if l.startswith("{\"step\":3,")][0]
ok = (hang["step"] == 3 and hang["slowest_step_seconds"] >= 1.5 and
      abs(hang["allowance_seconds"] - 5 * hang["slowest_step_seconds"]) < 1e-6 and
      hang["time"] - step3["time"] >= hang["allowance_seconds"])
sys.exit(not ok and "hang: %s, step 3 logged at %s" % (hang, step3["time"]))' "$R"
check "slow steps: every step logged, each over 1 s after the last (past the heartbeat); the state keeps the slowest" \
    "$PY" -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/elastic/train.jsonl")]
steps = [r for r in lines if "event" not in r]
gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:]) if b["step"] == a["step"] + 1]
state = json.load(open(sys.argv[1] + "/elastic/state.json"))
ok = ({r["step"] for r in steps} == set(range(1, 9)) and len(gaps) >= 3 and min(gaps) > 1 and
      state["slowest_step_seconds"] >= 1.5)
sys.exit(not ok and "steps %s, gaps %s, state %s" % ([r["step"] for r in steps], gaps, state))' "$R"
check "slow steps: no trainer left running" nothing_left "$R"

# ------------------------------ a memory limit met by sequence parallelism
# 2.21 MB per rank: every layout of the tiny model needs more at micro-batch 2
# but tp2 with sequence parallelism (tp-elastic plan; test_elastic_plan.sh):
# the trainer is launched with --sequence-parallel, and the run has the
# losses of the uninterrupted one.
R="$WORK/sp"
expect_ok "a memory limit only sequence parallelism meets: the run finishes" "$ELASTIC" run --ckpt-dir "$R" \
    --world 2 --memory-per-rank 2210000 $FAST -- "$TRAIN" $TRAIN_ARGS
check_all "sp: launched at tp2 micro-batch 2 with --sequence-parallel, and the trainer says so" \
    'grep -q "\"sequence_parallel\":true" "$R/elastic/events.jsonl" &&
    grep -q "\"--sequence-parallel\"" "$R/elastic/events.jsonl" &&
    grep -q "\"tp\":2,.*\"sequence_parallel\":true" "$R/elastic/train.jsonl"'
check "sp: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"

# ------------------------- ZeRO-1 across a change of the data-parallel size
# A one-layer model of one head (tp 1 and pp 1 only) with 2.1 MB per rank:
# at dp 4 and at dp 3 it fits only with ZeRO-1 (tp-elastic plan). Rank 1
# dies after step 25 and capacity drops to 3: the run relaunches at dp 3
# with ZeRO-1, the moments that 4 shards saved handed out to 3 at load, and
# has the losses of an uninterrupted run on one rank.
R="$WORK/zero"
ZERO_ARGS="--model tiny --heads 1 --layers 1 --quiet --global-batch 12 --micro-batch 2 --steps $STEPS --ckpt-every $EVERY"
expect_ok "ZeRO-1: an uninterrupted run on one rank" "$TRAIN" $ZERO_ARGS --log "$WORK/zero-ref.jsonl"
shrink_world_at_fault "$WORK/world.zero" "$R.fault" 4 3
mkdir -p "$R"
expect_ok "ZeRO-1, a rank killed, capacity 4 to 3: the run finishes" "$ELASTIC" run --ckpt-dir "$R" \
    --world-file "$WORK/world.zero" --memory-per-rank 2100000 $FAST \
    -- "$TRAIN" $ZERO_ARGS --fault die --fault-step 25 --fault-rank 1 --fault-once "$R.fault"
kill $watcher 2>/dev/null
check "zero: the trainer started at dp 4 then dp 3, with ZeRO-1 both times" "$PY" -c '
import json, sys
starts = [(r["dp"], r["zero"]) for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "start"]
sys.exit(not (len(starts) >= 2 and starts[0] == (4, 1) and all(s == (3, 1) for s in starts[1:])) and "starts: %s" % starts)' \
    "$R/elastic/train.jsonl"
check "zero: every launch's layout chose ZeRO-1, and tp-elastic passed --zero 1" sh -c \
    "launches=\$(grep -c '\"event\":\"launch\"' '$R/elastic/events.jsonl');
    [ \$launches -ge 2 ] && [ \$(grep -c '\"zero\":1},\"world\".*\"--zero\",\"1\"' '$R/elastic/events.jsonl') -eq \$launches ]"
check "zero: the losses continue the uninterrupted run's" "$PY" "$ROOT/tests/elastic/check_losses.py" \
    "$R/elastic/train.jsonl" "$WORK/zero-ref.jsonl" "$STEPS"
check "zero: no trainer left running" nothing_left "$R"

# ---------------------------------------------------- the interleaved schedule
# An 8-layer model of one head (tp 1 only) on 2 ranks, batch 8 of single
# sequences: pp 2 with 8 micro-batches, an ideal bubble of 12.5%; the plan
# interleaves 4 virtual stages (3.1%; test_elastic_plan.sh), tp-elastic
# launches the trainer so, and the losses are one rank's.
R="$WORK/interleaved"
DEEP="--layers 8 --dim 64 --heads 1 --vocab 256 --seq 32 --quiet --global-batch 8 --micro-batch 1 --steps 6"
expect_ok "one rank, 8 layers: the reference" "$TRAIN" $DEEP --log "$WORK/deep-ref.jsonl"
expect_ok "a bubble of 12.5% at pp 2: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- \
    "$TRAIN" $DEEP
check_all "interleaved: launched at pp 2 with --virtual-stages 4, and the trainer says so" \
    'grep -q "\"--virtual-stages\",\"4\"" "$R/elastic/events.jsonl" &&
    grep -q "\"pp\":2,.*\"virtual_stages\":4" "$R/elastic/train.jsonl"'
check "interleaved: the losses of one rank (1e-5)" losses_match "$R/elastic/train.jsonl" "$WORK/deep-ref.jsonl" 1e-5

# ----------------------------------------------------------- capacity grows
# Starts at 2 ranks; the world file grows to 4 after step 10 and rank 0
# pauses 3 s after step 12 (--fault slow), so that the run is still going
# when tp-elastic next looks at capacity (once a second; a fast machine runs
# all 60 steps in under a second): the trainer is asked to checkpoint and
# stop, and the run relaunches larger. Not a failure.
R="$WORK/grow"
echo 2 >"$WORK/world.grow"
mkdir -p "$R/elastic"
(
    while ! grep -q '"step":10,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
    echo 4 >"$WORK/world.grow"
) &
watcher=$!
expect_ok "capacity grows: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world-file "$WORK/world.grow" \
    --backoff 0.2 --heartbeat-timeout 30 --start-timeout 60 --grace 2 \
    -- "$TRAIN" $TRAIN_ARGS --fault slow --fault-step 12 --fault-once "$R.slow"
kill $watcher 2>/dev/null
check_all "grow: a scale change, no failure" '[ "$(events "$R" scale_change)" -eq 1 ] && [ "$(events "$R" failure)" -eq 0 ]'
check "grow: relaunched at 4 ranks" grep -q '"ranks":4' "$R/elastic/events.jsonl"
check "grow: the scale change came during the pause (before step 20)" \
    "$PY" -c 'import json,sys; e=[json.loads(l) for l in open(sys.argv[1]) if "scale_change" in l]; sys.exit(not (e and e[0]["step"] < 20))' \
    "$R/elastic/events.jsonl"
check "grow: no restart counted" [ "$(summary_field "$R" restarts)" -eq 0 ]
check "grow: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"

# ------------------------------------------------ capacity below --min-world
# Starts at 2 ranks; rank 1 dies after step 25 and capacity drops to 1,
# below --min-world 2: tp-elastic waits (an event) instead of training on
# one rank; capacity comes back to 2 and the run continues and finishes.
R="$WORK/minworld"
echo 2 >"$WORK/world.min"
mkdir -p "$R/elastic"
(
    while [ ! -e "$R.fault" ]; do sleep 0.05; done
    echo 1 >"$WORK/world.min"
    while ! grep -q '"event":"waiting_for_capacity"' "$R/elastic/events.jsonl" 2>/dev/null; do sleep 0.05; done
    sleep 3
    echo 2 >"$WORK/world.min"
) &
watcher=$!
expect_ok "below --min-world: waits, then the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world-file "$WORK/world.min" \
    --min-world 2 --capacity-wait 60 $FAST -- "$TRAIN" $TRAIN_ARGS --fault die --fault-step 25 --fault-rank 1 --fault-once "$R.fault"
wait $watcher
check "below --min-world: one wait for capacity" [ "$(events "$R" waiting_for_capacity)" -eq 1 ]
check "below --min-world: never launched at 1 rank" sh -c "! grep -q '\"ranks\":1[,}]' '$R/elastic/events.jsonl'"
check "below --min-world: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
# The wait is time without training: lost (relaunch), not counted in the
# effective training time. Before, it was left out of every lost share.
check "below --min-world: the wait for capacity counted as lost" "$PY" -c 'import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
wait = next(e["time"] for e in events if e["event"] == "waiting_for_capacity")
relaunch = next(e["time"] for e in events if e["event"] == "launch" and e["time"] > wait)
lost = [e for e in events if e["event"] == "summary"][-1]["lost_seconds"]["relaunch"]
sys.exit(not lost >= relaunch - wait >= 3)' "$R/elastic/events.jsonl"
# As root without Open MPI's consent, mpirun refuses every launch alike:
# given up at once, naming the two variables (it was relaunched
# --repeat-limit times, then called a bug of the trainer's, quoting the last
# line of mpirun's banner). Not root: mpirun runs, nothing to see.
if [ "$(id -u)" -eq 0 ]; then
    run env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$ELASTIC" run --ckpt-dir "$WORK/asroot" --world 2 \
        $FAST -- "$TRAIN" --model tiny --quiet --steps 4 --global-batch 4
    check_all "as root without Open MPI's consent: one launch, given up at once naming the variables (exit $RC)" \
        '[ $RC -eq 1 ] && grep -q "mpirun refuses to run as root.*OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" "$WORK/.err" &&
         [ "$(events "$WORK/asroot" launch)" -eq 1 ]'
fi

# A world file that cannot be read while a launch runs (rewritten with a
# typo, "2x"): the launch goes on at its capacity, and the error is one
# event (it was waited out in silence).
R="$WORK/typo"
echo 2 >"$WORK/world.typo"
mkdir -p "$R/elastic"
(
    n=0
    while ! grep -q '"event":"launch"' "$R/elastic/events.jsonl" 2>/dev/null && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done
    echo 2x >"$WORK/world.typo"
    n=0
    while ! grep -q '"event":"capacity_unreadable"' "$R/elastic/events.jsonl" 2>/dev/null && [ $n -lt 600 ]; do
        sleep 0.05
        n=$((n + 1))
    done
    echo 2 >"$WORK/world.typo"
) &
watcher=$!
expect_ok "a world file rewritten with a typo during a launch: the run finishes" "$ELASTIC" run --ckpt-dir "$R" \
    --world-file "$WORK/world.typo" $FAST -- "$TRAIN" --model tiny --quiet --global-batch 4 --steps 4 --ckpt-every 2 \
    --fault slow-steps --fault-step 1
wait $watcher
check "the typo: one capacity_unreadable event" [ "$(events "$R" capacity_unreadable)" -eq 1 ]
check "the typo: the event names the file and what it holds" \
    grep -q "world.typo: expected the number of ranks.*got '2x.*\"event\":\"capacity_unreadable\"" "$R/elastic/events.jsonl"
check "the typo: no scale change" [ "$(events "$R" scale_change)" -eq 0 ]

echo 1 >"$WORK/world.one"
expect_error "capacity never reaches --min-world: gives up after --capacity-wait" 1 "capacity stayed below --min-world 2" \
    "$ELASTIC" run --ckpt-dir "$WORK/starved" --world-file "$WORK/world.one" --min-world 2 --capacity-wait 1 $FAST \
    -- "$TRAIN" $TRAIN_ARGS
check "capacity never reaches --min-world: nothing launched" [ "$(events "$WORK/starved" launch)" -eq 0 ]
# A stop asked while it waits for capacity is a stop, not a give-up: it says
# so at once and launches nothing (it was reported as capacity staying low).
echo 0 >"$WORK/world.none"
R="$WORK/stop_waiting"
"$ELASTIC" run --ckpt-dir "$R" --world-file "$WORK/world.none" --capacity-wait 60 $FAST -- "$TRAIN" $TRAIN_ARGS \
    >"$WORK/stop_waiting.out" 2>"$WORK/stop_waiting.err" &
orchestrator=$!
while ! grep -q '"event":"waiting_for_capacity"' "$R/elastic/events.jsonl" 2>/dev/null; do sleep 0.05; done
kill -TERM $orchestrator
wait $orchestrator
check "SIGTERM while waiting for capacity: exit 1" [ $? -eq 1 ]
check "SIGTERM while waiting for capacity: it says it stopped on request" grep -q "stopped on request" \
    "$WORK/stop_waiting.err"
check "SIGTERM while waiting for capacity: no give-up" [ "$(events "$R" give_up)" -eq 0 ]
check "SIGTERM while waiting for capacity: nothing launched" [ "$(events "$R" launch)" -eq 0 ]
# A capacity file missing or holding anything but its number at the start is
# a mistake, refused at once (it was waited on for --capacity-wait).
expect_error "a missing --world-file: refused at once" 1 "world.missing: cannot open" \
    timeout 20 "$ELASTIC" run --ckpt-dir "$WORK/nofile" --world-file "$WORK/world.missing" $FAST -- "$TRAIN" $TRAIN_ARGS
printf '4x\n' >"$WORK/world.bad"
expect_error "a malformed --world-file: refused at once, naming what it holds" 1 "world.bad: expected .* got '4x" \
    timeout 20 "$ELASTIC" run --ckpt-dir "$WORK/badfile" --world-file "$WORK/world.bad" $FAST -- "$TRAIN" $TRAIN_ARGS
check "a malformed --world-file: nothing written" [ ! -e "$WORK/badfile" ]
# Inside a Slurm allocation whose controller does not answer (squeue fails;
# a fake on PATH): said at once, naming the job and squeue's error. Before,
# squeue's failure was lost inside scontrol's arguments and read as an
# allocation of 0 nodes, waited on for --capacity-wait.
mkdir -p "$WORK/slurm-down"
printf '#!/bin/sh\necho "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2\nexit 1\n' \
    >"$WORK/slurm-down/squeue"
chmod +x "$WORK/slurm-down/squeue"
expect_error "Slurm unreachable at the start: said at once, naming the job and squeue's error" 1 \
    "cannot read the nodes of Slurm job 77 \\(does its controller answer\\?\\): 'squeue -h -j 77 -o %N' failed \\(exit status 1\\): slurm_load_jobs error: Unable to contact slurm controller" \
    env PATH="$WORK/slurm-down:$PATH" SLURM_JOB_ID=77 timeout 20 "$ELASTIC" run --ckpt-dir "$WORK/slurmdown" $FAST \
    -- "$TRAIN" $TRAIN_ARGS
check "Slurm unreachable at the start: nothing written" [ ! -e "$WORK/slurmdown" ]
# --min-world inside an allocation is compared with the allocation's nodes,
# not with the default --world of 1: it got as far as asking Slurm. Before,
# "--min-world 2 is more than --world 1, which never changes" (exit 2).
expect_error "Slurm, --min-world 2: the allocation asked, not refused against --world 1" 1 \
    "cannot read the nodes of Slurm job 77 " \
    env PATH="$WORK/slurm-down:$PATH" SLURM_JOB_ID=77 timeout 20 "$ELASTIC" run --ckpt-dir "$WORK/slurmdown" $FAST \
    --min-world 2 -- "$TRAIN" $TRAIN_ARGS
# An empty or comment-only --hostfile at the start: refused at once, naming
# it, as an empty --world-file is. Before, it read as 0 ranks and was waited
# on for --capacity-wait.
printf '# hosts come later\n' >"$WORK/hosts.empty"
expect_error "a comment-only --hostfile: refused at once, naming it" 1 "hosts.empty: expected 'HOST \\[slots=N\\]' lines, got no host" \
    timeout 20 "$ELASTIC" run --ckpt-dir "$WORK/nohosts" --hostfile "$WORK/hosts.empty" $FAST -- "$TRAIN" $TRAIN_ARGS
check "a comment-only --hostfile: nothing written" [ ! -e "$WORK/nohosts" ]

# ------------------------------------------------------------- --hostfile
# Capacity from an Open MPI host file (this machine, 3 slots): mpirun is
# given a host file of the nodes used; a rank killed is relaunched the same.
R="$WORK/hosts"
printf '# this machine\nlocalhost slots=3\n' >"$WORK/hostfile"
expect_ok "--hostfile: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --hostfile "$WORK/hostfile" $FAST \
    -- "$TRAIN" $TRAIN_ARGS --fault die --fault-step 15 --fault-rank 2 --fault-once "$R.fault"
check "--hostfile: mpirun given a host file, on localhost, 3 ranks" \
    grep -q '"ranks":3.*"nodes":\["localhost"\],"command":\["mpirun","-np","3","--oversubscribe","--hostfile"' \
    "$R/elastic/events.jsonl"
check "--hostfile: the launch's host file names the slots used" grep -qx "localhost slots=3" "$R/elastic/hostfile.launch"
check_all "--hostfile: one failure, relaunched" '[ "$(events "$R" failure)" -eq 1 ] && [ "$(events "$R" launch)" -eq 2 ]'
check "--hostfile: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"

# ------------------------------------------------ a trainer that always fails
R="$WORK/bug"
expect_error "a trainer that always fails: a diagnosis, exit 1" 1 "failed 3 times in a row at step 0 without progress" \
    "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --fault fail-at-start
check_all "always fails: gave up after 3 launches" '[ "$(events "$R" launch)" -eq 3 ] && [ "$(events "$R" give_up)" -eq 1 ]'

# ------------------------------------------------ a trainer that diverges
# Its stop line says "diverged": a relaunch from the same checkpoint would
# diverge at the same step again, so the run gives up after the first launch
# (it relaunched until --repeat-limit), quoting the trainer's error.
R="$WORK/diverged"
expect_error "a diverged trainer: given up at once, the step and the trainer's error quoted, exit 1" 1 \
    "diverged at step [0-9]+ .*would repeat; the trainer.s error .*the gradient norm is not finite" \
    "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --warmup 0 --lr 1e30
check_all "diverged: one launch, one give-up" '[ "$(events "$R" launch)" -eq 1 ] && [ "$(events "$R" give_up)" -eq 1 ]'

# ------------------------------------------------ the orchestrator restarted
# tp-elastic killed with SIGKILL mid-run takes its trainer with it; started
# again, it continues from the newest checkpoint and its recorded state. The
# trainer, told to stop by its launcher, goes on for the steps until the
# signal reaches it (75-80 tiny steps past step 60 here; 150 steps left it
# finishing the run before it stopped, and the restart had nothing to launch).
R="$WORK/requeue"
mkdir -p "$R/elastic"
"$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --steps 400 >/dev/null 2>&1 &
orchestrator=$!
while ! grep -q '"step":60,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
kill -9 $orchestrator
wait $orchestrator 2>/dev/null
check "killed orchestrator: its trainer went with it" nothing_left "$R"
expect_ok "restarted orchestrator: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST \
    -- "$TRAIN" $TRAIN_ARGS --steps 400
check "restarted orchestrator: it counted the earlier launch" [ "$(summary_field "$R" launches)" -ge 2 ]
check "restarted orchestrator: step 400 reached" [ "$(summary_field "$R" step)" -eq 400 ]

# ------------------------------ --max-restarts and --repeat-limit per invocation
# A run whose earlier orchestrators used up the restarts (restarts 10) or
# the repeats at a step (2 failures at step 1) in state.json: this
# invocation counts its own, so one failure at step 1 is relaunched and the
# run finishes; the record keeps the run's restarts. Before, the first
# failure gave up ("10 restarts used up", "failed 3 times in a row").
for case in 'restarts:{"launches":12,"restarts":10,"tp":1,"pp":1}:11' \
    'repeats:{"launches":2,"restarts":2,"repeats":2,"last_failure_step":1,"tp":1,"pp":1}:3'; do
    name=${case%%:*} rest=${case#*:}
    state=${rest%:*} restarts=${rest##*:}
    R="$WORK/counted-$name"
    mkdir -p "$R/elastic"
    echo "$state" >"$R/elastic/state.json"
    expect_ok "$name used up by earlier orchestrators: one failure is relaunched, the run finishes" "$ELASTIC" run \
        --ckpt-dir "$R" --world 1 --max-restarts 2 $FAST -- "$TRAIN" $TRAIN_ARGS --steps 10 \
        --fault fail --fault-step 1 --fault-once "$R.fault"
    check_all "$name: one failure here, the run's restarts recorded ($restarts)" \
        '[ "$(events "$R" failure)" -eq 1 ] && [ "$(summary_field "$R" restarts)" -eq $restarts ]'
done

# -------------------------------------------------- a stop asked by SIGTERM
# SIGTERM to tp-elastic: the trainer finishes its step, checkpoints and exits;
# tp-elastic says so and exits 1; nothing is left running.
R="$WORK/stop"
mkdir -p "$R/elastic"
"$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --steps 400 >"$WORK/stop.out" 2>"$WORK/stop.err" &
orchestrator=$!
while ! grep -q '"step":50,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
kill -TERM $orchestrator
wait $orchestrator
check "SIGTERM: exit 1" [ $? -eq 1 ]
check "SIGTERM: it says it stopped on request" grep -q "stopped on request" "$WORK/stop.err"
check "SIGTERM: the trainer stopped with a checkpoint" grep -q '"event":"stop".*"reason":"stopped"' "$R/elastic/train.jsonl"
check "SIGTERM: no trainer left running" nothing_left "$R"

# ------------------------------------------- a stop asked while the trainer hangs
# The trainer hangs after step 10; tp-elastic is told to stop. The stop
# request does not stretch the hang's allowance to --save-timeout (600 s):
# the trainer never logs the step it was asked to finish, so the heartbeat
# still applies; the hang is found and the run stops. A second request ends
# the launch at once, within the grace, even under a long heartbeat. Before,
# both waited out --save-timeout (the second signal was ignored).
# stop_hung NAME HEARTBEAT SIGNALS...: starts a run that hangs after step
# 10, sends each signal a second apart once step 10 is logged, and sets
# GONE to the seconds it took to exit after the first (at most 40: then
# it is killed) and RC to its exit status.
stop_hung() {
    R="$WORK/$1"
    mkdir -p "$R/elastic"
    # (a background job of sh starts with SIGINT ignored, which tp-elastic keeps)
    env --default-signal=INT "$ELASTIC" run --ckpt-dir "$R" --world 1 --backoff 0.2 --heartbeat-timeout "$2" --start-timeout 60 --grace 2 \
        -- "$TRAIN" $TRAIN_ARGS --steps 200 --fault hang --fault-step 10 >"$WORK/$1.out" 2>"$WORK/$1.err" &
    orchestrator=$!
    shift 2
    while ! grep -q '"step":10,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
    start=$(date +%s)
    for sig in "$@"; do
        kill -"$sig" $orchestrator
        sleep 1
    done
    while kill -0 $orchestrator 2>/dev/null && [ $(($(date +%s) - start)) -lt 40 ]; do sleep 0.2; done
    GONE=$(($(date +%s) - start))
    kill -9 $orchestrator 2>/dev/null
    wait $orchestrator
    RC=$?
}
stop_hung stophung $HEARTBEAT TERM
check_all "SIGTERM to a hung trainer: the hang is found at the heartbeat, and the run stops (exit $RC after $GONE s)" \
    '[ $RC -eq 1 ] && [ $GONE -lt 30 ] && grep -q "stopped on request" "$WORK/stophung.err" && [ "$(events "$R" hang)" -eq 1 ]'
check "SIGTERM to a hung trainer: no trainer left running" nothing_left "$R"
stop_hung stoptwice 60 TERM INT
check_all "SIGTERM then SIGINT to a hung trainer under a 60 s heartbeat: ended at once (exit $RC after $GONE s)" \
    '[ $RC -eq 1 ] && [ $GONE -lt 15 ] && grep -q "stopped on request" "$WORK/stoptwice.err"'
check "SIGTERM then SIGINT: no trainer left running" nothing_left "$R"

# ------------------------------------------- a damaged newest checkpoint
# A run stopped at step 30 (checkpoints every 10); a data byte of step 30 is
# flipped: the orchestrator rejects it, resumes from step 20, and finishes.
R="$WORK/damaged"
expect_ok "a run to step 30" mpirun --oversubscribe -np 2 "$TRAIN" $TRAIN_ARGS --stop-at 30 --ckpt-dir "$R"
shard=$(ls "$R"/step_00000030/shard_pp*_tp*.h5 | head -1)
flip_byte "$shard" "$(data_offset "$shard" model/tok_embed.weight)"
expect_ok "a damaged newest checkpoint: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST \
    -- "$TRAIN" $TRAIN_ARGS
check "damaged: step 30 rejected" grep -q '"event":"checkpoint_rejected".*step_00000030\|step_00000030.*"event":"checkpoint_rejected"' \
    "$R/elastic/events.jsonl"
check "damaged: resumed from step 20" grep -q '"path":"[^"]*step_00000020","step":20' "$R/elastic/events.jsonl"

# ------------------------------------------------------------------ --keep
R="$WORK/keep"
expect_ok "--keep 2: the run finishes" "$ELASTIC" run --ckpt-dir "$R" --world 2 --keep 2 $FAST -- "$TRAIN" $TRAIN_ARGS
check_all "--keep 2: the two newest checkpoints are left" '[ "$(ls -d "$R"/step_* | wc -l)" -eq 2 ] && [ -d "$R/$(printf step_%08d "$STEPS")" ]'
check "--keep 2: each removal is an event ($((STEPS / EVERY - 2)) of $((STEPS / EVERY)) checkpoints)" \
    [ "$(events "$R" checkpoint_removed)" -eq $((STEPS / EVERY - 2)) ]

# --------------------------------------- --keep beside a damaged checkpoint
# A finished run of 20 steps whose newest checkpoint (20) is damaged, run on
# to step 30 with --keep 1, the trainer dying once at step 18: step 20 is
# rejected and the run resumes from 15, which must stay until the trainer
# has committed a newer one. Before, the damaged 20 counted as "the newest":
# 15 was removed at the first step, and after the failure only the damaged
# one was left; three launches failed and tp-elastic gave up.
R="$WORK/keepdamaged"
KEEP_ARGS="--layers 2 --dim 64 --heads 4 --vocab 256 --seq 32 --global-batch 4 --ckpt-every 5 --quiet"
expect_ok "--keep beside damage: a run of 20 steps" "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST \
    -- "$TRAIN" $KEEP_ARGS --steps 20
shard=$(ls "$R"/step_00000020/shard_pp*_tp*.h5 | head -1)
flip_byte "$shard" "$(data_offset "$shard" model/tok_embed.weight)"
expect_ok "--keep 1 beside a damaged newest checkpoint, a rank dying at step 18: the run finishes" "$ELASTIC" run \
    --ckpt-dir "$R" --world 1 --keep 1 $FAST -- "$TRAIN" $KEEP_ARGS --steps 30 --fault die --fault-step 18 \
    --fault-once "$R.fault"
check_all "--keep beside damage: one failure, relaunched from step 15 twice, step 30 the only checkpoint left" \
    '[ "$(events "$R" failure)" -eq 1 ] && [ "$(grep -c "step_00000015\",\"step\":15,.*checkpoint_chosen" "$R/elastic/events.jsonl")" -eq 2 ] &&
     [ "$(ls "$R" | grep step_ | tr "\n" " ")" = "step_00000030 " ]'
check "--keep beside damage: step 15 removed only after the trainer committed a newer one" "$PY" -c '
import json, sys
events = [json.loads(l) for l in open(sys.argv[1] + "/elastic/events.jsonl")]
saves = [json.loads(l) for l in open(sys.argv[1] + "/elastic/train.jsonl") if "\"save\"" in l]
removed = [e for e in events if e["event"] == "checkpoint_removed" and e["path"].endswith("step_00000015")]
sys.exit(not (len(removed) == 1 and any(s["step"] > 15 and s["time"] <= removed[0]["time"] for s in saves)) and
         "removed %s, saves %s" % (removed, saves))' "$R"
# Every checkpoint damaged: nothing to resume from, said at once (exit 1),
# nothing launched. Before, the trainer was launched three times and
# called "a bug".
R="$WORK/alldamaged"
expect_ok "all damaged: a run of 5 steps" "$TRAIN" $KEEP_ARGS --steps 5 --ckpt-dir "$R"
shard=$(ls "$R"/step_00000005/shard_pp*_tp*.h5 | head -1)
flip_byte "$shard" "$(data_offset "$shard" model/tok_embed.weight)"
expect_error "every checkpoint damaged: given up at once, saying none verifies" 1 \
    "no checkpoint to resume from: $R: none of its 1 checkpoints verifies" \
    "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST -- "$TRAIN" $KEEP_ARGS --steps 10
check "all damaged: nothing launched" [ "$(events "$R" launch)" -eq 0 ]

# ------------------------------------------------------------------- plan
expect_ok "plan: 8 ranks, JSON" "$ELASTIC" plan --world 8 --model small --global-batch 16 --ranks-per-node 4 --json
check "plan: the chosen layout follows the rules and uses all 8 ranks" "$PY" - "$WORK/.out" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
c = p["layouts"][p["chosen"]]
assert c["valid"] and c["ranks"] == 8, c
assert c["micro_batch"] * c["grad_accum"] * c["dp"] == 16
assert c["tp"] <= 4 and 6 % c["tp"] == 0 and 6 % c["pp"] == 0, c
for l in p["layouts"]:
    assert l["valid"] or l["reason"], l
PYEOF
expect_error "plan: nothing fits in 1 KiB" 1 "no layout is valid for 4 ranks" \
    "$ELASTIC" plan --world 4 --model tiny --global-batch 8 --memory-per-rank 1K
expect_error "plan: no --world" 2 "world" "$ELASTIC" plan --model tiny --global-batch 8
expect_error "plan: a model and --ckpt" 2 "not both" "$ELASTIC" plan --world 2 --model tiny --ckpt "$WORK/grow" --global-batch 8

# ------------------------------------------------------------------ report
expect_ok "report: a PNG" "$ELASTIC" report "$WORK/grow" -o "$WORK/grow.png"
check "report: a PNG file" sh -c "head -c 4 '$WORK/grow.png' | od -c | grep -q 'P   N   G'"
expect_error "report: no such run" 1 "train.jsonl" "$ELASTIC" report "$WORK/none" -o "$WORK/none.svg"
expect_error "report: an unknown picture type" 2 "svg or .png" "$ELASTIC" report "$WORK/grow" -o "$WORK/grow.pdf"

# ------------------------------------------------------------------ usage
expect_error "no --ckpt-dir" 2 "ckpt-dir" "$ELASTIC" run --world 2 -- "$TRAIN" $TRAIN_ARGS
expect_error "a layout option for the trainer" 2 "--tp is tp-elastic's" "$ELASTIC" run --ckpt-dir "$WORK/u" --world 2 \
    -- "$TRAIN" $TRAIN_ARGS --tp 2
# A fixed world below --min-world never grows: before, the run waited
# --capacity-wait (600 s) before giving up.
expect_error "--min-world above a fixed --world" 2 "--min-world 4 is more than --world 2, which never changes" \
    "$ELASTIC" run --ckpt-dir "$WORK/u" --world 2 --min-world 4 -- "$TRAIN" $TRAIN_ARGS
expect_error "no global batch" 2 "global-batch" "$ELASTIC" run --ckpt-dir "$WORK/u" --world 2 -- "$TRAIN" --model tiny
# An option tp-train does not have is refused before any launch, last or
# not (the last was told "needs a value"); --name=value forms are read.
expect_error "an unknown trainer option, last" 2 "tp-train has no option --bogus" "$ELASTIC" run \
    --ckpt-dir "$WORK/u" --world 2 -- "$TRAIN" $TRAIN_ARGS --bogus
expect_error "an unknown trainer option with a value" 2 "tp-train has no option --bogus" "$ELASTIC" run \
    --ckpt-dir "$WORK/u" --world 2 -- "$TRAIN" --bogus 3 $TRAIN_ARGS
expect_error "a trainer flag given a value" 2 "--quiet takes no value" "$ELASTIC" run \
    --ckpt-dir "$WORK/u" --world 2 -- "$TRAIN" $TRAIN_ARGS --quiet=1
expect_error "a layout option as --name=value" 2 "--zero is tp-elastic's" "$ELASTIC" run \
    --ckpt-dir "$WORK/u" --world 2 -- "$TRAIN" $TRAIN_ARGS --zero=1
# --stop-at: the trainer's clean stop before --steps was taken for a
# failure, relaunched 3 times and called a bug (exit 1). A stray word among
# the trainer's options was launched, refused by tp-train, 3 times.
expect_error "--stop-at for the trainer: refused before any launch" 2 \
    "--stop-at would end each launch before --steps" "$ELASTIC" run --ckpt-dir "$WORK/u" --world 2 $FAST \
    -- "$TRAIN" $TRAIN_ARGS --stop-at 20
expect_error "a stray word among the trainer's options: refused before any launch" 2 \
    "tp-train takes no argument 'stray'" "$ELASTIC" run --ckpt-dir "$WORK/u" --world 2 $FAST \
    -- "$TRAIN" $TRAIN_ARGS stray
# A value tp-train refuses (its usage error, exit status 2) on the first
# launch: not relaunched; exit 2, quoting the trainer's own line. Before, it
# was launched 3 times and called "a bug", quoting mpirun's banner
# ("Exit code:    2").
R="$WORK/badlr"
expect_error "a value the trainer refuses: one launch, exit 2, the trainer's line quoted" 2 \
    "the trainer refused its arguments .*: tp-train: --lr expects a non-negative decimal number .*got 'abc'" \
    "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST -- "$TRAIN" $TRAIN_ARGS --lr abc
check "a value the trainer refuses: one launch" [ "$(events "$R" launch)" -eq 1 ]
# A trainer the launcher cannot find (tp-train given by name, build/bin not
# on PATH): one launch, given up at once saying what to give; it was
# relaunched 3 times and called a bug, quoting mpirun's banner.
R="$WORK/notfound"
expect_error "a trainer program that is not found: given up at once, saying so" 1 \
    "the launcher could not start the trainer's program tp-train-not-here .*: give its path" \
    "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST -- tp-train-not-here $TRAIN_ARGS
check "a trainer program that is not found: one launch" [ "$(events "$R" launch)" -eq 1 ]
R="$WORK/notfound-path"
expect_error "a trainer path that does not exist: given up at once, saying so" 1 \
    "the launcher could not start the trainer's program $WORK/no/tp-train .*: give its path" \
    "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST -- "$WORK/no/tp-train" $TRAIN_ARGS
check "a trainer path that does not exist: one launch" [ "$(events "$R" launch)" -eq 1 ]
# A state directory or events file inside a checkpoint: refused (exit 2),
# as report -o is. Before, --keep removed the live state with the
# checkpoint (events, train.jsonl, state.json gone) and tp-elastic died on
# "state.json.tmp: cannot open".
R="$WORK/stateinside"
expect_ok "state inside a checkpoint: a run of 10 steps" "$TRAIN" $TRAIN_ARGS --steps 10 --ckpt-dir "$R"
expect_error "--state-dir inside a checkpoint: refused, naming it" 2 \
    "--state-dir $R/step_00000010/state lies inside the checkpoint $R/step_00000010" "$ELASTIC" run --ckpt-dir "$R" \
    --world 1 --keep 1 --state-dir "$R/step_00000010/state" $FAST -- "$TRAIN" $TRAIN_ARGS --steps 30
expect_error "--events inside a checkpoint: refused, naming it" 2 \
    "--events $R/step_00000010/events.jsonl lies inside the checkpoint $R/step_00000010" "$ELASTIC" run \
    --ckpt-dir "$R" --world 1 --events "$R/step_00000010/events.jsonl" $FAST -- "$TRAIN" $TRAIN_ARGS --steps 30
check_all "inside a checkpoint: nothing written there" \
    '[ "$(ls "$R" | tr "\n" " ")" = "latest step_00000010 " ] && [ "$(ls "$R/step_00000010" | grep -vc "^shard_\|^index.json$")" -eq 0 ]'
# Model flags other than the checkpoint's: refused before any launch (exit
# 2), naming both models, in the trainer's words. Before, the trainer was
# launched 3 times and called a bug (exit 1).
R="$WORK/othermodel"
expect_ok "another model: a run of 10 steps" "$TRAIN" $TRAIN_ARGS --steps 10 --ckpt-dir "$R"
expect_error "another model than the checkpoint's: refused before any launch, naming both" 2 \
    "step_00000010 holds another model: .*dim 64 .*this run has .*dim 128 .*: resume with the model flags it was trained with" \
    "$ELASTIC" run --ckpt-dir "$R" --world 1 $FAST -- "$TRAIN" $TRAIN_ARGS --dim 128 --steps 30
check "another model: nothing launched" [ "$(events "$R" launch)" -eq 0 ]
# No model flags, as tp-train --resume takes them: the model and precision
# of the run's newest checkpoint (a bf16 run here), named on the start line;
# the trainer is launched without model flags and takes them itself, in
# bf16 (the dtype is not among the settings it says changed). Before, exit 2
# ("the trainer's model: give --model or ..."), nothing launched. A new run
# without them is refused (exit 2), naming what is missing, writing nothing.
R="$WORK/nomodel"
NO_MODEL_ARGS=$(echo "$TRAIN_ARGS" | sed 's/--model tiny //')
expect_ok "no model flags: a bf16 run of 10 steps" "$TRAIN" $TRAIN_ARGS --dtype bf16 --steps 10 --ckpt-dir "$R"
expect_ok "no model flags: the run continues" "$ELASTIC" run --ckpt-dir "$R" --world 2 $FAST \
    -- "$TRAIN" $NO_MODEL_ARGS --steps 15
check "no model flags: the start line names the checkpoint the model came from" \
    grep -q "\"model_from\":\"$R/step_00000010\",\"event\":\"orchestrator_start\"" "$WORK/.out"
check_all "no model flags: step 15 reached, the trainer launched without model flags" \
    '[ -d "$R/step_00000015" ] && [ "$(events "$R" launch)" -eq 1 ] &&
     ! grep "\"launch\"" "$R/elastic/events.jsonl" | grep -q -- "--model\|--dtype\|--dim"'
check "no model flags: the trainer resumed in the run's bf16" sh -c \
    'grep -qs "other settings.*--steps 15 (was 10)" "$1" && ! grep -q -- "--dtype" "$1"' - "$R/elastic/launch-1.out"
expect_error "no model flags, no checkpoint: refused naming what is missing" 2 \
    "the trainer's arguments give no model, and $WORK/nomodel-new has no checkpoint to take it from \(a new run\): \
give the trainer --model, or all of --layers --dim --heads --vocab --seq" \
    "$ELASTIC" run --ckpt-dir "$WORK/nomodel-new" --world 2 $FAST -- "$TRAIN" $NO_MODEL_ARGS
check "no model flags, no checkpoint: nothing written" [ ! -e "$WORK/nomodel-new" ]
check "usage errors: nothing written" [ ! -e "$WORK/u" ]
expect_error "no trainer" 2 "after '--'" "$ELASTIC" run --ckpt-dir "$WORK/u" --world 2
finish
