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
# docs/BENCHMARKS.md. Scratch in bench/scratch/.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BUILD:-build}/bin
SCRATCH=bench/scratch/elastic
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"

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
            $train_fault >"$run.out" 2>&1
    else
        echo 4 >"$run.world"
        "$BIN/tp-elastic" run --ckpt-dir "$run" --world-file "$run.world" $options \
            -- "$BIN/tp-train" $model --quiet --global-batch 12 --micro-batch 1 --steps "$steps" --ckpt-every "$every" \
            $train_fault >"$run.out" 2>&1
    fi
    if [ -n "$watcher" ]; then kill "$watcher" 2>/dev/null || true; wait "$watcher" 2>/dev/null || true; fi
    [ "$fault" = node-down ] && slurm_node_resume n2
    first_ckpt=$(ls -d "$run"/step_* | head -1)
    copy=$(measure cp -r "$first_ckpt" "$run.copy" | $PY -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
    size=$(du -sb "$first_ckpt" | cut -f1)
    # tp-reshard of the checkpoint the relaunch loaded, to the layout it ran at
    # (the same layout: nothing to do)
    target=$($PY - "$run" <<'PYEOF'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1] + "/elastic/events.jsonl")]
failure = next(e for e in events if e["event"] in ("failure", "hang", "scale_change"))
chosen = [e for e in events if e["event"] == "checkpoint_chosen" and e["time"] > failure["time"]]
first = [e for e in events if e["event"] == "launch"][0]["layout"]
after = [e for e in events if e["event"] == "launch" and e["time"] > failure["time"]][0]["layout"]
same = (first["tp"], first["pp"]) == (after["tp"], after["pp"])
print("" if same or not chosen else "%s tp%dpp%d" % (chosen[0]["path"], after["tp"], after["pp"]))
PYEOF
)
    reshard="-"
    if [ -n "$target" ]; then
        set -- $target
        reshard=$(measure "$BIN/tp-reshard" "$1" --to "$2" -o "$run.resharded" --threads 2 2>/dev/null |
            $PY -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["seconds"])')
    fi
    $PY - "$run" "$name" "$launcher" "$copy" "$size" "$reshard" <<'PYEOF'
import json, sys
run, name, launcher, copy, size, reshard_tool = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
events = [json.loads(l) for l in open(run + "/elastic/events.jsonl")]
log = [json.loads(l) for l in open(run + "/elastic/train.jsonl")]
failure = next(e for e in events if e["event"] in ("failure", "hang", "scale_change"))
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
# About 1 GB of checkpoint: 63M parameters x (weights + two Adam moments) x 4 bytes.
LARGE="--layers 8 --dim 768 --heads 12 --vocab 8192 --seq 128"
echo "| run | launcher | checkpoint | layout after | detection s | selection s | reshard s | relaunch s | first step s | recovery s | cp -r s | tp-reshard s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
recovery tiny-shrink mpirun shrink "$TINY" 40 5 23
recovery tiny-same mpirun same "$TINY" 40 5 23
recovery large-shrink mpirun shrink "$LARGE" 7 2 5
recovery large-same mpirun same "$LARGE" 7 2 5
. tests/support/slurm.sh
if slurm_available; then
    # The cluster's nodes are this machine: ranks on different nodes use TCP
    # over loopback (Open MPI's shared-memory transport crashed across them).
    export OMPI_MCA_btl=self,tcp
    slurm_start "$SCRATCH/cluster" 2 2
    trap 'slurm_stop' EXIT INT TERM
    recovery tiny-rank-killed srun same "$TINY" 40 5 23
    recovery tiny-node-down srun node-down "$TINY" 40 5 23
    recovery large-rank-killed srun same "$LARGE" 7 2 5
    recovery large-node-down srun node-down "$LARGE" 7 2 5
else
    echo "(Slurm rows skipped: Slurm is not installed; make deps installs it)"
fi
