#!/bin/sh
# tp-elastic's capacity under a real Slurm cluster of hyperthreaded nodes
# (tests/support/slurm.sh with SLURM_TEST_THREADS_PER_CORE=2: 2 nodes of 2
# cores of 2 threads, select/cons_tres with CR_Core): Slurm's CPUs are the
# threads (4 a node), and the trainer computes with one thread a rank
# (tp-train --threads 1), so tp-elastic plans a rank a core, 4 in all, not
# one a thread (8). Then a step Slurm holds pending (another step of the job
# holds every CPU of the allocation for a few seconds): srun says so, and
# tp-elastic waits for it as for capacity (a step_pending event), not
# ending it as a hang at --start-timeout; the run finishes, the losses of an
# uninterrupted run's.
# Skipped, and said so, where Slurm is not installed.
# takes: about 60 s beside two other tests on 2 cores
# waits: mostly for Slurm and the pending step's 11 s
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
. "$ROOT/tests/support/slurm.sh"
. "$ROOT/tests/elastic/lib.sh"

slurm_runs
STEPS=20
TRAIN_ARGS="--model tiny --quiet --global-batch 12 --micro-batch 2 --steps $STEPS --ckpt-every 10"
FAST="--backoff 0.2 --heartbeat-timeout 20 --grace 2"

SLURM_TEST_THREADS_PER_CORE=2 slurm_start "$WORK/cluster" 2 4 ||
    { echo "FAIL [$NAME] the Slurm cluster did not start" >&2; exit 1; }
trap 'slurm_stop; rm -rf "$WORK"' EXIT INT TERM
check "the cluster's nodes: 4 CPUs, 2 threads a core" [ "$(sinfo -h -N -n n1 -o '%c %Z')" = "4 2" ]

expect_ok "an uninterrupted run (mpirun, 4 ranks)" mpirun --oversubscribe -np 4 "$TRAIN" $TRAIN_ARGS --tp 2 \
    --ckpt-dir "$WORK/ref" --log "$WORK/ref.jsonl"

# ------------------------------------------------- a rank a core, not a thread
# No --ranks-per-node: the ranks come from Slurm. Before, each node's 4 CPUs
# (SLURM_CPUS_ON_NODE, CPU_IDs 0-3) were 4 ranks: 8 ranks on 4 cores.
R="$WORK/cores"
expect_ok "cores: the run finishes" slurm_alloc 2 "$ELASTIC" run --ckpt-dir "$R" $FAST --start-timeout 60 \
    -- "$TRAIN" $TRAIN_ARGS
before=$FAILED
check "cores: launched with 4 ranks on the 2 nodes (a rank a core)" \
    grep -q '"world":4,"nodes":\["n1","n2"\],"command":\["srun","--mpi=pmix","--kill-on-bad-exit=1","-n","4",' \
    "$R/elastic/events.jsonl"
check "cores: the allocation's CPUs still told to srun as Slurm counts them (threads)" \
    grep -q '"SLURM_JOB_CPUS_PER_NODE=4,4"' "$R/elastic/events.jsonl"
check "cores: the losses are the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
show_launches_if_failed "$before" "$R"

# ------------------------------------------ a step held pending: no hang
# A step of the job holds all 8 CPUs for 12 s; tp-elastic's step waits
# pending for them (srun: "step creation temporarily disabled, retrying
# (Requested nodes are busy)"). --start-timeout is 8 s, from the step's creation: before,
# the pending step was a hang at 8 s, relaunched, and its wait counted as detection.
R="$WORK/pending"
expect_ok "pending: the run finishes" slurm_alloc 2 sh -c "srun -n 8 -N 2 sleep 12 & sleep 1;
    '$ELASTIC' run --ckpt-dir '$R' $FAST --start-timeout 8 -- '$TRAIN' $TRAIN_ARGS; rc=\$?; wait; exit \$rc"
before=$FAILED
check "pending: a step_pending event quoting Slurm's pending step, or srun" \
    grep -Eq '"why":"(scontrol show step: StepId=[0-9]+\.TDB .*State=PENDING|srun: Job [0-9]+ step creation temporarily disabled).*"event":"step_pending"' \
    "$R/elastic/events.jsonl"
check_all "pending: then step_created, no hang, one launch" \
    '[ "$(events "$R" step_created)" -eq 1 ] && [ "$(events "$R" hang)" -eq 0 ] && [ "$(events "$R" launch)" -eq 1 ]'
check "pending: nothing lost to detection" "$PY" -c 'import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]["lost_seconds"]
assert s["detection"] == 0, s' "$R/elastic/events.jsonl"
check "pending: the losses are the uninterrupted run's" losses_continue "$R/elastic/train.jsonl"
show_launches_if_failed "$before" "$R"

finish
