# lib.sh: what the tests of tp-elastic share (sourced after tests/e2e/lib.sh).
# A run's record is RUN/elastic/events.jsonl (docs/ELASTIC.md).

# FAST: quick detection for the tests' runs (a tiny step takes
# milliseconds). Under the sanitizers on a loaded 2-core machine a tiny step
# took up to 4.5 s (make asan), so there the heartbeat is 20 s: a slow step
# is not a hang, and the hangs the tests inject are found all the same.
if [ "${SANITIZED:-0}" = 1 ]; then HEARTBEAT=20; else HEARTBEAT=4; fi
FAST="--backoff 0.2 --heartbeat-timeout $HEARTBEAT --start-timeout 60 --grace 2"

# slurm_runs: the settings of tp-elastic's runs on the loopback Slurm
# cluster (test_elastic_slurm.sh, test_elastic_slurm_cores.sh): the test
# skipped, said so, where Slurm is not installed; Open MPI; TCP between
# ranks. The cluster's nodes are one machine: Open MPI's shared-memory
# transport between ranks that Slurm places on different nodes crashed in
# MPI_Init (SIGSEGV in mca_btl_vader) with 6 ranks over 3 nodes; TCP over
# loopback is what ranks on different machines use anyway.
slurm_runs() {
    if ! slurm_available; then
        echo "[SKIP] [$NAME] Slurm is not installed (make deps installs slurm-wlm)"
        finish
        exit 0
    fi
    use_open_mpi
    export OMPI_MCA_btl=self,tcp
    ELASTIC="$BIN/tp-elastic"
    TRAIN="$BIN/tp-train"
}

# mpirun_runs: the settings of the runs under mpirun (test_elastic.sh,
# test_elastic_recover.sh): a tiny model, STEPS steps with a checkpoint
# every EVERY, quick detection (a tiny step takes milliseconds); and the
# losses of an uninterrupted run at 4 ranks (tp2 pp2), $WORK/ref.jsonl.
mpirun_runs() {
    use_open_mpi
    ELASTIC="$BIN/tp-elastic"
    TRAIN="$BIN/tp-train"
    STEPS=60
    EVERY=10
    TRAIN_ARGS="--model tiny --quiet --global-batch 12 --micro-batch 2 --steps $STEPS --ckpt-every $EVERY"
    expect_ok "an uninterrupted run" mpirun --oversubscribe -np 4 "$TRAIN" $TRAIN_ARGS --tp 2 --pp 2 \
        --ckpt-dir "$WORK/ref" --log "$WORK/ref.jsonl"
}

# losses_continue LOG: the last logged loss of every step of LOG equals the
# uninterrupted run's, $WORK/ref.jsonl (1e-4 relative), and every step
# 1..$STEPS is there.
losses_continue() { "$PY" "$ROOT/tests/elastic/check_losses.py" "$1" "$WORK/ref.jsonl" "$STEPS"; }

# shrink_world_at_fault WORLD_FILE FAULT_FILE FROM TO: capacity FROM in
# WORLD_FILE, dropping to TO as the fault fires (FAULT_FILE appears, the
# trainer's --fault-once); the watcher's process id in $watcher.
shrink_world_at_fault() {
    echo "$3" >"$1"
    (
        while [ ! -e "$2" ]; do sleep 0.05; done
        echo "$4" >"$1"
    ) &
    watcher=$!
}

# events RUN NAME: how many events of that name the run recorded.
events() { grep -c "\"event\":\"$2\"" "$1/elastic/events.jsonl" 2>/dev/null || true; }

# summary_field RUN FIELD: from the run's last summary event.
summary_field() {
    "$PY" -c 'import json,sys; s=[json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]; print(s[sys.argv[2]])' \
        "$1/elastic/events.jsonl" "$2"
}

# show_launches_if_failed BEFORE RUN: when a check failed since $FAILED was
# BEFORE, the end of each launch's output, where its tasks say why they
# ended. Called after a case's last check. A launch ended by SIGTERM (143)
# with no fault injected was, where its output could be read, the MPI
# stack's startup defect (mpi_startup_crash): srun --kill-on-bad-exit ends
# the other tasks of the step.
# A crash's own lines come first (the signal, the faulting address, the
# backtrace), then how srun saw each task end and the trainer's errors,
# which the tail alone cut off: without them a crash could not be told from
# the MPI stack's defect (mpi_startup_crash), nor which task ended first.
show_launches_if_failed() {
    [ "$FAILED" -gt "$1" ] || return 0
    for _f in "$2"/elastic/launch-*.out; do
        echo "    $_f:"
        grep -E "Signal: |Signal code|Failing at address|\] \[ *[0-9]+\] |AddressSanitizer|^ *#[0-9]+ " "$_f" | head -n 20 |
            sed 's/^/      crash: /'
        grep -E "^srun: error: .*task|^tp-train: (error|fatal)" "$_f" | head -n 10 | sed 's/^/      ended: /'
        tail -n 15 "$_f" | sed 's/^/      /'
    done
}

# mpi_startup_crashes RUN: how many of the run's failed launches died of the
# MPI stack's startup defect (tests/support/slurm.sh mpi_startup_crash; needs
# slurm.sh). tp-elastic rightly counts such a launch as a failure and
# relaunches; tests that count failures add these to what they expect.
mpi_startup_crashes() {
    _n=0
    for _f in $("$PY" -c 'import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") == "failure" and e.get("output"):
        print(e["output"])' "$1/elastic/events.jsonl"); do
        mpi_startup_crash "$_f" && _n=$((_n + 1))
    done
    echo $_n
}

# nothing_left RUN: no process of the run is left, stopped ones included
# (within 10 s: a launcher told to stop takes a moment to end its ranks).
nothing_left() {
    for i in $(seq 100); do
        pgrep -f -- "--ckpt-dir $1 " >/dev/null || return 0
        sleep 0.1
    done
    return 1
}
