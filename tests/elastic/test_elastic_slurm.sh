#!/bin/sh
# tp-elastic under a real Slurm cluster of 3 nodes on this machine
# (tests/support/slurm.sh): inside one allocation taken with --no-kill, the
# trainer runs as srun steps; a node set down mid-run shrinks the
# allocation and the run continues on the nodes left, at the layout the
# planner picks; a rank killed is relaunched on the same nodes; a rank
# stopped with SIGSTOP is a hang, ended and relaunched; a node added to the
# running job (Slurm's job expansion) grows the run; a batch job requeued
# mid-run (scontrol requeue) starts tp-elastic again, which continues the
# run; checkpoints in an S3 store (s3rver) with a cache per node and no
# shared file system, a rank killed and a node set down. In every case the
# last step is reached and the losses equal an uninterrupted run's (1e-4).
# Skipped, and said so, where Slurm is not installed.
# takes: about 130 s beside two other tests on 2 cores (scripts/run-tests.py orders by it)
# waits: mostly for Slurm: node-down detection, requeues, heartbeats (about a third of a core over its run)
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
. "$ROOT/tests/support/slurm.sh"
. "$ROOT/tests/elastic/lib.sh"
. "$ROOT/tests/support/objstore.sh"

slurm_runs
STEPS=60
TRAIN_ARGS="--model tiny --quiet --global-batch 12 --micro-batch 2 --steps $STEPS --ckpt-every 10"
FAST="--backoff 0.2 --heartbeat-timeout 20 --start-timeout 60 --grace 2 --ranks-per-node 1"

slurm_start "$WORK/cluster" 3 2 || { echo "FAIL [$NAME] the Slurm cluster did not start" >&2; exit 1; }
trap 'slurm_stop; s3_stop 2>/dev/null; rm -rf "$WORK"' EXIT INT TERM

expect_ok "an uninterrupted run (mpirun, 4 ranks)" mpirun --oversubscribe -np 4 "$TRAIN" $TRAIN_ARGS --tp 2 \
    --ckpt-dir "$WORK/ref" --log "$WORK/ref.jsonl"

# the_rank R PROCID: the pid of the trainer rank PROCID of run R.
the_rank() {
    for p in $(pgrep -f -- "--ckpt-dir $1 "); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" && [ "$(cat "/proc/$p/comm")" = tp-train ] &&
            echo "$p" && return 0
    done
    return 1
}

# ------------------------------------------------------------- a node down
R="$WORK/node"
mkdir -p "$R/elastic"
(
    while ! grep -q '"step":20,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
    slurm_node_down n3
) &
watcher=$!
expect_ok "a node down: the run finishes" slurm_alloc 3 "$ELASTIC" run --ckpt-dir "$R" $FAST -- "$TRAIN" $TRAIN_ARGS
kill $watcher 2>/dev/null
check "node down: launched with srun on 3 nodes first" grep -q '"command":\["srun".*"--nodelist","n1,n2,n3"' \
    "$R/elastic/events.jsonl"
before=$FAILED
check "node down: one failure" [ "$(events "$R" failure)" -eq $((1 + $(mpi_startup_crashes "$R"))) ]
check "node down: relaunched on the 2 nodes left" grep -q '"nodes":\["n1","n2"\]' "$R/elastic/events.jsonl"
check "node down: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
show_launches_if_failed "$before" "$R"
slurm_node_resume n3

# ----------------------------------------------------------- a rank killed
R="$WORK/rank"
expect_ok "a rank killed: the run finishes" slurm_alloc 3 "$ELASTIC" run --ckpt-dir "$R" $FAST \
    -- "$TRAIN" $TRAIN_ARGS --fault die --fault-step 15 --fault-rank 2 --fault-once "$R.fault"
before=$FAILED
check "rank killed: one failure" [ "$(events "$R" failure)" -eq $((1 + $(mpi_startup_crashes "$R"))) ]
check "rank killed: relaunched on the same 3 nodes" \
    [ "$(grep -c '"--nodelist","n1,n2,n3"' "$R/elastic/events.jsonl")" -eq $((2 + $(mpi_startup_crashes "$R"))) ]
check "rank killed: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
show_launches_if_failed "$before" "$R"

# ------------------------------------------------- a rank stopped: a hang
# SIGSTOP to rank 1 (on n2) after step 20: no launcher notices; no step for
# the heartbeat timeout is a hang. tp-elastic ends the step (srun, told
# SIGTERM, has Slurm end every task of it, stopped ones included) and
# relaunches on the same nodes.
R="$WORK/hang"
mkdir -p "$R/elastic"
(
    while ! grep -q '"step":20,' "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
    kill -STOP "$(the_rank "$R" 1)"
) &
watcher=$!
expect_ok "a rank stopped (SIGSTOP): the run finishes" slurm_alloc 3 "$ELASTIC" run --ckpt-dir "$R" $FAST \
    --heartbeat-timeout 5 -- "$TRAIN" $TRAIN_ARGS
wait $watcher
before=$FAILED
check_all "SIGSTOP: detected as a hang, no other failure" '[ "$(events "$R" hang)" -eq 1 ] && [ "$(events "$R" failure)" -eq "$(mpi_startup_crashes "$R")" ]'
check "SIGSTOP: relaunched on the same 3 nodes" \
    [ "$(grep -c '"--nodelist","n1,n2,n3"' "$R/elastic/events.jsonl")" -eq $((2 + $(mpi_startup_crashes "$R"))) ]
check "SIGSTOP: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
check "SIGSTOP: no rank left, stopped or not" nothing_left "$R"
show_launches_if_failed "$before" "$R"

# ------------------------------------------------ a node added: the run grows
# The job starts on 2 nodes; when rank 0 pauses after step 20 (--fault
# slow: the run must still be going when tp-elastic next asks Slurm, once a
# second), n3 is added to the running job (Slurm's job expansion).
# tp-elastic sees the allocation's new node list through squeue, asks the
# trainer to checkpoint and stop, and relaunches on 3 nodes. Not a failure.
R="$WORK/grow"
mkdir -p "$R/elastic"
(
    while [ ! -e "$R.slow" ]; do sleep 0.05; done
    slurm_job_grow "$(squeue -h -o %i -t R -n tp-elastic-grow | head -n 1)" 1
) &
watcher=$!
SLURM_ALLOC_OPTS="-J tp-elastic-grow" expect_ok "a node added: the run finishes" slurm_alloc 2 "$ELASTIC" run \
    --ckpt-dir "$R" $FAST -- "$TRAIN" $TRAIN_ARGS --fault slow --fault-step 20 --fault-once "$R.slow"
wait $watcher
check "node added: growing the job worked" [ $? -eq 0 ]
check "node added: launched on n1,n2 first" grep -q '"--nodelist","n1,n2"\]*' "$R/elastic/events.jsonl"
check_all "node added: a scale change from 2 to 3, no failure" \
    'grep -q "\"from_world\":2,\"to_world\":3" "$R/elastic/events.jsonl" &&
    [ "$(events "$R" failure)" -eq "$(mpi_startup_crashes "$R")" ]'
check "node added: relaunched on n1,n2,n3" grep -q '"--nodelist","n1,n2,n3"' "$R/elastic/events.jsonl"
check "node added: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"

# ------------------------------------ the batch job requeued: tp-elastic again
# tp-elastic as the batch script of a job submitted with --requeue; after
# step 20 the job is requeued (scontrol requeue: Slurm ends the script and
# its step, as when a node of the batch host fails, and runs the script
# again). The second tp-elastic finds the run's state and checkpoints in the
# run directory and continues.
R="$WORK/requeue"
mkdir -p "$R/elastic"
job=$(sbatch --parsable --requeue --no-kill --exclusive -N 3 -J tp-elastic-requeue -o "$WORK/requeue.%j.out" \
    --wrap "exec '$ELASTIC' run --ckpt-dir '$R' $FAST -- '$TRAIN' $TRAIN_ARGS")
check "requeue: the batch job was submitted" [ -n "$job" ]
i=0
while ! grep -q '"step":20,' "$R/elastic/train.jsonl" 2>/dev/null && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
check "requeue: the job reached step 20 within 2 minutes" grep -q '"step":20,' "$R/elastic/train.jsonl"
check "requeue: scontrol requeue" scontrol requeue "$job"
i=0
while [ -n "$(squeue -h -j "$job" 2>/dev/null)" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
check "requeue: the job ended within 2 minutes" [ -z "$(squeue -h -j "$job" 2>/dev/null)" ]
check "requeue: tp-elastic started twice" [ "$(events "$R" orchestrator_start)" -eq 2 ]
check "requeue: the run finished" grep -q '"event":"finished"' "$R/elastic/events.jsonl"
check "requeue: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
check "requeue: no rank left" nothing_left "$R"
# ------------------------- an object store, a cache per node, no shared disk
# Checkpoints to s3://bkt/el; each node's trainers write into a TMPDIR of
# that node's own (the launcher wrapper below), so no file system is shared
# by the ranks: each uploads its own shard, rank 0 the index. Rank 1 dies
# at step 25, then n3 is set down once step 40 is up. The run finishes with
# the uninterrupted losses; no checkpoint is uploaded twice (each index
# once, no shard of a step after its index: a step whose save was cut off
# before its index is saved again, by design); the caches of the nodes
# still up hold nothing afterwards; --keep 2 leaves the two newest.
if s3_start "$WORK/s3" bkt 2>"$WORK/.err"; then
    export AWS_ENDPOINT_URL="$S3_ENDPOINT"
    R="$WORK/s3run"
    U=s3://bkt/el
    mkdir -p "$R/elastic" "$WORK/nodes"
    printf '#!/bin/sh\nexport TMPDIR="%s/nodes/${SLURMD_NODENAME:?not under Slurm}"\nmkdir -p "$TMPDIR"\nexec "%s" "$@"\n' \
        "$WORK" "$TRAIN" >"$WORK/on-node.sh"
    chmod +x "$WORK/on-node.sh"
    wait_log() { while ! grep -q "$1" "$R/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done; }
    (
        wait_log '"event":"upload","step":40,'
        slurm_node_down n3
    ) &
    watcher=$!
    expect_ok "s3, a cache per node: a rank killed, a node down, the run finishes" slurm_alloc 3 "$ELASTIC" run \
        --ckpt-dir "$U" --state-dir "$R/elastic" --keep 2 $FAST -- "$WORK/on-node.sh" $TRAIN_ARGS \
        --fault die --fault-step 25 --fault-rank 1 --fault-once "$R.fault"
    kill $watcher 2>/dev/null
    before=$FAILED
    check "s3: two failures (the rank killed, the node down)" \
        [ "$(events "$R" failure)" -eq $((2 + $(mpi_startup_crashes "$R"))) ]
    check "s3: relaunched on the 2 nodes left" grep -q '"nodes":\["n1","n2"\]' "$R/elastic/events.jsonl"
    check "s3: the losses continue the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
    check "s3: the bucket's latest names step 60" [ "$(cat "$WORK/s3/bkt/el/latest._S3rver_object")" = step_00000060 ]
    check "s3: each node had a cache of its own" [ "$(ls -d "$WORK"/nodes/n*/tp-train-cache-* | wc -l)" -eq 3 ]
    # n3 went down mid-run: a save it was writing then may have left its
    # staging entry there, which the next trainer on n3 removes at start.
    check "s3: the caches of n1 and n2 hold no shard, staging entry or checkpoint" \
        sh -c "! find '$WORK/nodes/n1' '$WORK/nodes/n2' -name '*.h5' -o -name '*staging*' -o -name 'step_*' | grep -q ."
    check "s3: n3's cache holds no checkpoint" sh -c "! find '$WORK/nodes/n3' -name 'step_*' | grep -q ."
    if [ -n "$S3_REQUEST_LOG" ]; then
        check "s3: each step's index PUT once, after all of its shards, none after it" "$PY" -c '
import re, sys
indexed, ok = {}, True
for line in open(sys.argv[1]):
    method, path, status = line.split()
    m = re.fullmatch(r"/bkt/el/(step_\d{8})/([^?]+)", path)
    if method != "PUT" or status != "200" or not m:
        continue
    step, name = m.groups()
    if step in indexed:
        ok = False  # an index twice, or a shard after its index
    if name == "index.json":
        indexed[step] = True
want = ["step_%08d" % s for s in range(10, 61, 10)]
sys.exit(not (ok and sorted(indexed) == want))' "$S3_REQUEST_LOG"
    else
        echo "[SKIP] [$NAME] s3: uploads counted (needs the signature proxy, python3-botocore)"
    fi
    run "$BIN/tp-ckpt" info "$U/step_00000040"
    check "s3: --keep 2: step 40 is gone from the bucket" [ "$RC" -ne 0 ]
    expect_ok "s3: the last checkpoint verifies" "$BIN/tp-ckpt" verify "$U"
    show_launches_if_failed "$before" "$R"
    s3_stop
    slurm_node_resume n3
else
    echo "[SKIP] [$NAME] s3: $(head -n 1 "$WORK/.err")"
fi
finish
