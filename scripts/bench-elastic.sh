#!/bin/sh
# make bench-elastic: recovery time of tp-elastic with mpirun, from a rank
# killed (SIGKILL) to the first step completed after the relaunch, split into
# detection, checkpoint selection, reshard (at load, by the trainer), relaunch
# and the first step; for a tiny model and for one whose checkpoint (weights
# and Adam moments) is about 1 GB. Each model twice: capacity shrinking from 4
# ranks to 3 with the kill (a new layout: the checkpoint is resharded at
# load), and capacity kept (the same layout: what a whole-group restart such
# as torchrun's redoes, with no reshard). Beside them, copying the checkpoint
# once (cp -r, warm cache), the target the reshard part is held to.
# Prints a Markdown table for docs/BENCHMARKS.md. Scratch in bench/scratch/.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BUILD:-build}/bin
SCRATCH=bench/scratch/elastic
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"

# recovery NAME SHRINK MODEL_ARGS STEPS EVERY FAULT_STEP: one run with a kill
# of rank 1 after FAULT_STEP; prints one table row.
recovery() {
    name=$1 shrink=$2 model=$3 steps=$4 every=$5 fault=$6
    run="$SCRATCH/$name"
    echo 4 >"$run.world"
    if [ "$shrink" = yes ]; then
        (while [ ! -e "$run.fault" ]; do sleep 0.01; done; echo 3 >"$run.world") &
        watcher=$!
    else
        watcher=""
    fi
    "$BIN/tp-elastic" run --ckpt-dir "$run" --world-file "$run.world" --backoff 0 --heartbeat-timeout 120 \
        -- "$BIN/tp-train" $model --quiet --global-batch 12 --micro-batch 1 --steps "$steps" --ckpt-every "$every" \
        --fault die --fault-step "$fault" --fault-rank 1 --fault-once "$run.fault" >"$run.out" 2>&1
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null || true
    copy=$(measure cp -r "$(ls -d "$run"/step_* | head -1)" "$run.copy" | $PY -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
    size=$(du -sb "$(ls -d "$run"/step_* | head -1)" | cut -f1)
    $PY - "$run" "$name" "$copy" "$size" <<'PYEOF'
import json, sys
run, name, copy, size = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
events = [json.loads(l) for l in open(run + "/elastic/events.jsonl")]
log = [json.loads(l) for l in open(run + "/elastic/train.jsonl")]
failure = next(e for e in events if e["event"] == "failure")
# the kill: just after the step the fault followed was logged (the last step
# line before the failure)
steps = [l for l in log if "event" not in l]
fault_step = failure["step"]
killed_at = max(l["time"] for l in steps if l["step"] == fault_step and l["time"] < failure["time"])
chosen = [e for e in events if e["event"] == "checkpoint_chosen" and e["time"] > failure["time"]][0]
launch = [e for e in events if e["event"] == "launch" and e["time"] > failure["time"]][0]
starts = [l for l in log if l.get("event") == "start"]
start = starts[-1]
first = [l for l in steps if l["time"] > launch["time"]][0]
detection = failure["time"] - killed_at
selection = chosen["seconds"]
reshard = start.get("load_seconds", 0)
total = first["time"] - killed_at
first_step = first["ms"] / 1e3
relaunch = total - detection - selection - reshard - first_step
l = launch["layout"]
f = [e for e in events if e["event"] == "launch"][0]["layout"]
print("| %s | %.0f MB | tp%dpp%ddp%d -> tp%dpp%ddp%d | %.2f | %.2f | %.2f | %.2f | %.2f | **%.2f** | %.2f |"
      % (name, size / 1e6, f["tp"], f["pp"], f["dp"], l["tp"], l["pp"], l["dp"], detection, selection, reshard, relaunch, first_step, total, copy))
PYEOF
}

TINY="--model tiny"
# About 1 GB of checkpoint: 63M parameters x (weights + two Adam moments) x 4 bytes.
LARGE="--layers 8 --dim 768 --heads 12 --vocab 8192 --seq 128"
echo "| model | checkpoint | layout after | detection s | selection s | reshard s | relaunch s | first step s | recovery s | cp -r s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
recovery tiny-shrink yes "$TINY" 40 5 23
recovery tiny-same no "$TINY" 40 5 23
recovery large-shrink yes "$LARGE" 6 2 3
recovery large-same no "$LARGE" 6 2 3
