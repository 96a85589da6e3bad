#!/bin/sh
# Soak test of `tp-elastic run` with mpirun: SOAK_FAULTS faults at random
# moments of one run, drawn from SOAK_SEED (printed, so that a failure can be
# replayed). A fault is one of: a rank killed (SIGKILL); a rank stopped
# (SIGSTOP: a hang that only the heartbeat sees); the launcher killed, its
# ranks left orphaned; capacity growing back (the world file raised while
# training runs). A kill may come with capacity shrinking (the world file
# lowered as the rank dies), so the run relaunches at other layouts and
# reshards at load. Each fault comes a random number of steps after the
# previous one and a random fraction of a second later, so some land during
# asynchronous saves. After the last, tp-elastic is stopped (SIGTERM: the
# trainer checkpoints) and a second tp-elastic finishes the run 30 steps
# later. The losses must be those of an uninterrupted run of that length
# (1e-4 relative), every fault recorded as what it was, at most the steps
# since the last committed checkpoint recomputed per failure, and nothing
# left running.
#
#   SOAK_SEED=N SOAK_FAULTS=K sh tests/elastic/test_soak.sh
#   make soak   (more faults, a new seed each time)
# takes: about 75 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
. "$(dirname "$0")/lib.sh"

use_open_mpi
ELASTIC="$BIN/tp-elastic"
TRAIN="$BIN/tp-train"
SEED=${SOAK_SEED:-7}
FAULTS=${SOAK_FAULTS:-6}
EVERY=10
GAP=25 # at least this many steps between two faults
# A constant learning rate: a step's loss does not depend on --steps, so the
# run can be open-ended while faults strike (how far it gets by the last one
# depends on the machine: a hang lets the ranks train on while the launcher
# is stopped), then be stopped and finished as a shorter run whose
# uninterrupted twin is the reference.
TRAIN_ARGS="--model tiny --quiet --global-batch 12 --micro-batch 2 --ckpt-every $EVERY --lr 3e-4 --min-lr 3e-4 --warmup 0"
OPEN_ENDED=1000000
R="$WORK/soak"
echo "[$NAME] seed $SEED, $FAULTS faults (replay: SOAK_SEED=$SEED SOAK_FAULTS=$FAULTS)"

# The plan, one fault a line: KIND AFTER_STEPS DELAY_MS WORLD, WORLD being
# the capacity the fault leaves (the world file's value; 2 to 4 ranks).
awk -v seed="$SEED" -v n="$FAULTS" -v gap="$GAP" 'BEGIN {
    srand(seed)
    world = 4
    for (i = 0; i < n; i++) {
        r = rand()
        if (world < 4 && r < 0.25) { kind = "grow"; world = 4 }
        else {
            kind = r < 0.5 ? "kill" : r < 0.75 ? "stop" : "launcher"
            if (kind != "stop" && world > 2 && rand() < 0.5) world--
        }
        printf "%s %d %d %d\n", kind, gap + int(rand() * gap), int(rand() * 300), world
    }
}' >"$WORK/plan"
sed 's/^/    planned: /' "$WORK/plan"

# last_step: the newest step the trainer has logged (0 before any).
last_step() {
    tail -n 50 "$R/elastic/train.jsonl" 2>/dev/null |
        sed -n 's/^{"step":\([0-9]*\),.*/\1/p' | tail -n 1 | grep . || echo 0
}

# ranks: the process ids of this run's trainer ranks (not the launcher,
# whose command line begins with mpirun).
ranks() { pgrep -f -- "^$TRAIN .*--ckpt-dir $R " || true; }
launcher() { pgrep -f -- "^mpirun .*--ckpt-dir $R " | head -n 1; }


# inject: reads the plan and strikes each fault once the run has gone AFTER
# steps further (never at or before the previous fault's step: failures
# repeated at one step are the bug the orchestrator rightly gives up on),
# then waits until the orchestrator has relaunched and the new launch has
# trained a step (a fault struck while it still stops the last launch would
# fall into that launch's ending). Records each fault struck in $WORK/struck.
# Returns early when the orchestrator has ended.
inject() {
    target=0 floor=0
    while read -r kind after delay world; do
        # Targets add up the plan's steps, not the steps struck at (which
        # drift with the machine's speed).
        target=$((target + after))
        [ "$target" -lt "$floor" ] && target=$floor
        while [ "$(last_step)" -lt "$target" ]; do
            alive || return
            sleep 0.05
        done
        sleep "$(awk -v ms="$delay" 'BEGIN { printf "%.3f", ms / 1000 }')"
        victim=
        while [ "$kind" != grow ]; do
            alive || return
            case $kind in
            launcher) victim=$(launcher) ;;
            *) victim=$(ranks | awk -v pick="$delay" '{ pid[NR] = $1 } END { if (NR) print pid[1 + pick % NR] }') ;;
            esac
            [ -n "$victim" ] && break
            sleep 0.05 # between launches: wait for the next one
        done
        # launches that have trained a first step after resuming, so far
        launches=$(events "$R" resumed)
        echo "$world" >"$WORK/world"
        case $kind in
        grow) ;;
        stop) kill -STOP "$victim" ;;
        *) kill -KILL "$victim" ;;
        esac
        step=$(last_step)
        echo "$kind $step" >>"$WORK/struck"
        echo "    struck: $kind ${victim:+(pid $victim) }after step $step, capacity $world"
        floor=$((step + 5))
        while [ "$(events "$R" resumed)" -le "$launches" ]; do
            alive || return
            sleep 0.05
        done
    done <"$WORK/plan"
    # Some steps at the last layout, then a stop asked for.
    while [ "$(last_step)" -lt "$floor" ]; do
        alive || return
        sleep 0.05
    done
}
alive() { kill -0 "$orchestrator" 2>/dev/null; }

# --- The faults, in a run stopped (SIGTERM to tp-elastic) after the last.
echo 4 >"$WORK/world"
mkdir -p "$R/elastic"
: >"$WORK/struck"
start=$(date +%s)
"$ELASTIC" run --ckpt-dir "$R" --world-file "$WORK/world" --min-world 2 --max-restarts $((FAULTS + 2)) $FAST \
    -- "$TRAIN" $TRAIN_ARGS --steps $OPEN_ENDED >"$WORK/soak.out" 2>"$WORK/soak.err" &
orchestrator=$!
inject
kill -TERM "$orchestrator" 2>/dev/null
wait "$orchestrator"
rc=$?
check_all "after the faults: stopped on request (exit 1)" \
    '[ $rc -eq 1 ] && grep -q "stopped on request" "$WORK/soak.err"'
[ "$rc" -eq 1 ] || sed 's/^/    err: /' "$WORK/soak.err" | tail -n 20
stopped=$(last_step)
echo "[$NAME] the faults took $(($(date +%s) - start)) s; stopped at step $stopped"

# --- Finished by a second tp-elastic: 30 steps more, the run's end.
STEPS=$((stopped + 30))
expect_ok "a second tp-elastic finishes the run at step $STEPS" "$ELASTIC" run --ckpt-dir "$R" --world-file "$WORK/world" \
    --min-world 2 $FAST -- "$TRAIN" $TRAIN_ARGS --steps $STEPS
expect_ok "an uninterrupted run of $STEPS steps" mpirun --oversubscribe -np 4 "$TRAIN" $TRAIN_ARGS --steps $STEPS \
    --tp 2 --pp 2 --ckpt-dir "$WORK/ref" --log "$WORK/ref.jsonl"

struck=$(wc -l <"$WORK/struck")
count() { grep -c "^$1 " "$WORK/struck" || true; }
kills=$(($(count kill) + $(count launcher)))
check "every fault of the plan struck ($struck of $FAULTS)" [ "$struck" -eq "$FAULTS" ]
failures=$(events "$R" failure) hangs=$(events "$R" hang) changes=$(events "$R" scale_change)
check "every fault recorded: $kills failures ($failures), $(count stop) hangs ($hangs), $(count grow) growths ($changes scale changes)" \
    sh -c "[ $failures -eq $kills ] && [ $hangs -eq $(count stop) ] && [ $changes -ge $(count grow) ]"
check "the run finished at step $STEPS" [ "$(summary_field "$R" step)" -eq "$STEPS" ]
check "the losses continue the uninterrupted run's" \
    "$PY" "$ROOT/tests/elastic/check_losses.py" "$R/elastic/train.jsonl" "$WORK/ref.jsonl" "$STEPS"
# A fault during an asynchronous save loses that save too: at most two
# checkpoint intervals per failure.
check "at most the steps since the last committed checkpoint recomputed" \
    [ "$(summary_field "$R" steps_recomputed)" -le $(((kills + $(count stop)) * 2 * EVERY)) ]
check "never launched below --min-world" sh -c "! grep -q '\"ranks\":1[,}]' '$R/elastic/events.jsonl'"
check "no trainer or launcher left running" nothing_left "$R"
if [ "$FAILED" -gt 0 ]; then
    echo "[$NAME] the run's events:"
    "$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    print("    %-20s %s" % (e.pop("event"), {k: v for k, v in e.items() if k in ("step", "kind", "status", "ranks", "from_world", "to_world", "reason")}))
' "$R/elastic/events.jsonl"
fi
finish
