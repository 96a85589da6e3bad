#!/bin/sh
# make bench-elastic: recovery time of tp-elastic, from a fault to the first
# step completed after the relaunch, split into detection, checkpoint
# selection, reshard (at load, by the trainer), relaunch and the first step;
# for a tiny model and for one whose checkpoint (weights and Adam moments) is
# about 1 GB; under mpirun and under a Slurm cluster of 2 nodes on this
# machine (tests/support/slurm.sh; skipped, and said so, without Slurm).
# mpirun: rank 1 kills itself (SIGKILL); capacity shrinks from 4 ranks to 3
# with the kill (a new layout: the checkpoint is resharded at load), or is
# kept (the same layout: what a whole-group restart such as torchrun's
# redoes, with no reshard). Slurm (2 nodes of 2 ranks): rank 1 killed (the
# same nodes again), or node n2 set down (the run shrinks to n1).
# Beside them, copying the checkpoint once (cp -r, warm cache), the target
# the reshard part is held to, and tp-reshard of it to the new layout (the
# alternative to resharding at load). Prints a Markdown table for
# docs/BENCHMARKS.md, whose section of it holds analysis written by hand
# around the table: the section is written only to a BENCH_DOC given
# (scripts/bench-lib.sh; scratch under BENCH_SCRATCH).
#   BENCH_LARGE (default "--layers 8 --dim 768 --heads 12 --vocab 8192
#   --seq 128", about 1 GB of checkpoint): the model of the large rows, as
#   tp-train takes it
#   BENCH_TINY_STEPS (default "40 5 23"): steps, checkpoint interval and the
#   step after which the fault comes, of the tiny rows (a tiny run: "8 2 5",
#   the large rows')
#   BENCH_ROWS (default all): the rows to run, by name (a tiny run:
#   "tiny-shrink tiny-node-down", one per launcher; every row takes 8 to 13 s)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BUILD:-build}/bin
SCRATCH="$SCRATCH_ROOT/elastic"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
. tests/support/slurm.sh
# Whatever ends the run: no fault watcher left polling, no launcher left
# running (salloc or tp-elastic, which stop their ranks on SIGTERM), and the
# Slurm cluster, if one was started, stopped (a start that failed half-way
# too). The launcher runs in the background with a wait: a shell runs its
# trap only after a foreground command ends, so an interrupted bench would
# first wait for a whole recovery run, or leave it running when killed.
watcher="" launcher_pid="" slurm_started=""
cleanup() {
    set +e
    [ -z "$watcher" ] || kill "$watcher" 2>/dev/null
    if [ -n "$launcher_pid" ]; then
        pkill -TERM -P "$launcher_pid" 2>/dev/null
        kill -TERM "$launcher_pid" 2>/dev/null
        wait "$launcher_pid" 2>/dev/null
    fi
    [ -z "$slurm_started" ] || slurm_stop
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# recovery NAME LAUNCHER FAULT MODEL_ARGS STEPS EVERY FAULT_STEP: one run with
# a fault after step FAULT_STEP; prints one table row. FAULT: shrink (rank 1
# killed, capacity 4 -> 3), same (rank 1 killed, capacity kept), node-down
# (Slurm: n2 set down).
recovery() {
    name=$1 launcher=$2 fault=$3 model=$4 steps=$5 every=$6 fault_step=$7
    run="$SCRATCH/$name"
    watcher=""
    train_fault="--fault die --fault-step $fault_step --fault-rank 1 --fault-once $run.fault"
    case "$fault" in
    shrink)
        (while [ ! -e "$run.fault" ]; do sleep 0.01; done; echo 3 >"$run.world") &
        watcher=$! ;;
    node-down)
        mkdir -p "$run/elastic"
        (
            while ! grep -q "\"step\":$fault_step," "$run/elastic/train.jsonl" 2>/dev/null; do sleep 0.01; done
            slurm_node_down n2
        ) &
        watcher=$!
        train_fault="" ;;
    esac
    options="--backoff 0 --heartbeat-timeout 120"
    if [ "$launcher" = srun ]; then
        slurm_alloc 2 "$BIN/tp-elastic" run --ckpt-dir "$run" --ranks-per-node 2 $options \
            -- "$BIN/tp-train" $model --quiet --global-batch 12 --micro-batch 1 --steps "$steps" --ckpt-every "$every" \
            $train_fault >"$run.out" 2>&1 &
    else
        echo 4 >"$run.world"
        "$BIN/tp-elastic" run --ckpt-dir "$run" --world-file "$run.world" $options \
            -- "$BIN/tp-train" $model --quiet --global-batch 12 --micro-batch 1 --steps "$steps" --ckpt-every "$every" \
            $train_fault >"$run.out" 2>&1 &
    fi
    launcher_pid=$!
    wait "$launcher_pid" # its failure ends the bench (set -e), as in the foreground
    launcher_pid=""
    if [ -n "$watcher" ]; then kill "$watcher" 2>/dev/null || true; wait "$watcher" 2>/dev/null || true; watcher=""; fi
    # Slurm's helpers are written for shells without set -e (a count of 0
    # from grep -c would end them): called in a list, where it does not apply.
    if [ "$fault" = node-down ]; then slurm_node_resume n2 || exit 1; fi
    # Launches that died of the MPI stack's startup defect under Slurm
    # (tests/support/slurm.sh mpi_startup_crash): tp-elastic rightly relaunched
    # them, but they are not the fault measured here.
    startup_crashes=""
    for launch_out in "$run"/elastic/launch-*.out; do
        if [ -e "$launch_out" ] && mpi_startup_crash "$launch_out"; then
            startup_crashes="$startup_crashes $launch_out"
            echo "bench-elastic: $name: $launch_out died of the MPI stack's startup defect; tp-elastic relaunched it" >&2
        fi
    done
    first_ckpt=$(ls -d "$run"/step_* | head -1)
    copy=$(measure cp -r "$first_ckpt" "$run.copy" | measured_seconds)
    size=$(du -sb "$first_ckpt" | cut -f1)
    # The fault's event (its line in events.jsonl): the first failure, hang
    # or scale change of a launch that did not die of the startup defect; it
    # must come after the step the fault followed. Then the checkpoint the
    # relaunch loaded, and the layout it ran at, for tp-reshard (the same
    # layout: nothing to do).
    set -- $($PY - "$run" "$fault_step" $startup_crashes <<'PYEOF'
import json, sys
run, fault_step, crashed = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
events = [json.loads(l) for l in open(run + "/elastic/events.jsonl")]
found = [i for i, e in enumerate(events)
         if e["event"] in ("failure", "hang", "scale_change") and e.get("output") not in crashed]
if not found or events[found[0]]["step"] < fault_step:
    sys.exit("%s: the first failure is not the fault injected after step %d; its events:\n%s"
             % (run, fault_step, "\n".join(json.dumps(e) for e in events)))
failure = events[found[0]]
chosen = [e for e in events if e["event"] == "checkpoint_chosen" and e["time"] > failure["time"]]
first = [e for e in events if e["event"] == "launch"][0]["layout"]
after = [e for e in events if e["event"] == "launch" and e["time"] > failure["time"]][0]["layout"]
same = (first["tp"], first["pp"]) == (after["tp"], after["pp"])
print(found[0], "" if same or not chosen else "%s tp%dpp%d" % (chosen[0]["path"], after["tp"], after["pp"]))
PYEOF
)
    [ $# -ge 1 ] || exit 1
    fault_event=$1
    reshard="-"
    if [ $# -eq 3 ]; then
        reshard=$(measure "$BIN/tp-reshard" "$2" --to "$3" -o "$run.resharded" --threads 2 | measured_seconds)
    fi
    $PY - "$run" "$name" "$launcher" "$copy" "$size" "$reshard" "$fault_event" <<'PYEOF'
import json, sys
run, name, launcher, copy, size, reshard_tool = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
events = [json.loads(l) for l in open(run + "/elastic/events.jsonl")]
log = [json.loads(l) for l in open(run + "/elastic/train.jsonl")]
failure = events[int(sys.argv[7])]
# the fault: just after the step it followed was logged (the last step line
# before the failure was noticed)
steps = [l for l in log if "event" not in l]
fault_step = failure["step"]
faulted_at = max(l["time"] for l in steps if l["step"] == fault_step and l["time"] < failure["time"])
chosen = [e for e in events if e["event"] == "checkpoint_chosen" and e["time"] > failure["time"]]
if not chosen:
    sys.exit("%s: no checkpoint was chosen after the fault at step %d (none committed yet?)" % (run, failure["step"]))
chosen = chosen[0]
launch = [e for e in events if e["event"] == "launch" and e["time"] > failure["time"]][0]
start = [l for l in log if l.get("event") == "start"][-1]
first = [l for l in steps if l["time"] > launch["time"]][0]
detection = failure["time"] - faulted_at
selection = chosen["seconds"]
reshard = start.get("load_seconds", 0)
total = first["time"] - faulted_at
first_step = first["ms"] / 1e3
relaunch = total - detection - selection - reshard - first_step
l = launch["layout"]
f = [e for e in events if e["event"] == "launch"][0]["layout"]
print("| %s | %s | %.0f MB | tp%dpp%ddp%d -> tp%dpp%ddp%d | %.2f | %.2f | %.2f | %.2f | %.2f | **%.2f** | %.2f | %s |"
      % (name, launcher, size / 1e6, f["tp"], f["pp"], f["dp"], l["tp"], l["pp"], l["dp"], detection, selection,
         reshard, relaunch, first_step, total, copy, reshard_tool))
PYEOF
}

TINY="--model tiny"
set -- ${BENCH_TINY_STEPS:-40 5 23}
TINY_RUN="$1 $2 $3"
# About 1 GB of checkpoint: 63M parameters x (weights + two Adam moments) x 4 bytes.
LARGE=${BENCH_LARGE:-"--layers 8 --dim 768 --heads 12 --vocab 8192 --seq 128"}
ROWS=${BENCH_ROWS:-all}
# row RECOVERY-ARGS...: one row, printed and kept for the section, if asked for.
TABLE="$SCRATCH/table.md"
row() {
    case " $ROWS " in " all " | *" $1 "*) ;; *) return 0 ;; esac
    recovery "$@" >"$SCRATCH/row.md"
    tee -a "$TABLE" <"$SCRATCH/row.md"
}
echo "| run | launcher | checkpoint | layout after | detection s | selection s | reshard s | relaunch s | first step s | recovery s | cp -r s | tp-reshard s |" | tee "$TABLE"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|" | tee -a "$TABLE"
row tiny-shrink mpirun shrink "$TINY" $TINY_RUN
row tiny-same mpirun same "$TINY" $TINY_RUN
row large-shrink mpirun shrink "$LARGE" 7 2 5
row large-same mpirun same "$LARGE" 7 2 5
if slurm_available; then
    # The cluster's nodes are this machine: ranks on different nodes use TCP
    # over loopback (Open MPI's shared-memory transport crashed across them).
    export OMPI_MCA_btl=self,tcp
    slurm_started=1
    slurm_start "$SCRATCH/cluster" 2 2 || { echo "bench-elastic: the Slurm cluster did not start" >&2; exit 1; }
    row tiny-rank-killed srun same "$TINY" $TINY_RUN
    row tiny-node-down srun node-down "$TINY" $TINY_RUN
    row large-rank-killed srun same "$LARGE" 7 2 5
    row large-node-down srun node-down "$LARGE" 7 2 5
else
    echo "(Slurm rows skipped: Slurm is not installed; make deps installs it)" | tee -a "$TABLE"
fi
if [ -n "${BENCH_DOC:-}" ]; then
    doc_section bench-elastic "Recovery with tp-elastic (bench-elastic)" <<DOC
Command: \`BENCH_DOC=docs/BENCHMARKS.md make bench-elastic\` (scripts/bench-elastic.sh; without BENCH_DOC the table is printed only). Tiny rows: \`$TINY\`, steps, checkpoint interval and
fault step $TINY_RUN; large rows: \`$LARGE\`, 7 2 5. Global batch 12, micro-batch 1.

$(cat "$TABLE")
DOC
fi
