#!/bin/sh
# make bench-parallel: what tp-train's parallelism options buy on this
# machine (issue 27), side by side in one run:
# - sequence parallelism at tp 2 and 4, with and without it: the
#   activations a rank keeps for the backward (the start line's
#   activation_bytes) against the expected figure (the norm and residual
#   rows divided by tp, plus two [B*T, D] buffers to gather into), the peak
#   RSS of the largest rank, and milliseconds per step;
# - the interleaved schedule at pp 2 with 1, 2 and 4 virtual stages and 2
#   and 8 micro-batches a step: the pipeline's bubble as the trainer
#   measures it (the ranks' mean idle time in the pipeline over the rest of
#   the longest rank's pipeline time) against (pp - 1) / (V m),
#   milliseconds per step, the activations kept.
# - ZeRO-1 and ZeRO-3 at dp 1, 2 and 4, and without them: the Adam moments
#   a rank keeps (the start line's optimizer_bytes) against a dp-th of
#   them, the parameters and gradients (parameter_bytes), the peak RSS of
#   the first rank and of the others (the stop line's peak_rss_bytes) and
#   what they save against the expected figure, milliseconds per step, and
#   the bytes each rank writes to a checkpoint.
# Writes docs/BENCHMARKS.md (sections bench-parallel, bench-zero and bench-pipeline).
#   BENCH_STEPS (default 10): steps per run; the first 2 are warm-up, not counted
#   BENCH_REPS (default 3): repetitions, alternating which goes first; medians
#   BENCH_SHAPE (default "--layers 6 --dim 512 --heads 8 --vocab 256 --seq 256":
#   tp-train --model small's depth and sequence, with heads that split over 4):
#   the model (GPT-2's architecture)
#   BENCH_TPS (default "2 4"): the tensor-parallel degrees, one process each
#   BENCH_PIPELINE_SHAPE (default "--layers 8 --dim 512 --heads 8 --vocab 256 --seq 256"): the
#   interleaved schedule's model; its layers must split into 2 x 4 chunks
#   BENCH_PIPELINE_M (default "2 8"): micro-batches of one sequence a step
#   BENCH_PIPELINE_V (default "1 2 4"): virtual stages
#   BENCH_DPS (default "1 2 4"): the data-parallel degrees of the ZeRO runs (BENCH_SHAPE, tp 1)
#   BENCH_ZEROS (default "1 3"): the ZeRO stages run beside ZeRO 0
#   Where it writes: scripts/bench-lib.sh.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
STEPS=${BENCH_STEPS:-10}
REPS=${BENCH_REPS:-3}
TPS=${BENCH_TPS:-2 4}
SHAPE=${BENCH_SHAPE:---layers 6 --dim 512 --heads 8 --vocab 256 --seq 256}
PIPELINE_SHAPE=${BENCH_PIPELINE_SHAPE:---layers 8 --dim 512 --heads 8 --vocab 256 --seq 256}
PIPELINE_M=${BENCH_PIPELINE_M:-2 8}
PIPELINE_V=${BENCH_PIPELINE_V:-1 2 4}
DPS=${BENCH_DPS:-1 2 4}
ZEROS=${BENCH_ZEROS:-1 3}
BATCH=4
DIR="$SCRATCH_ROOT/parallel"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$DIR"
RESULTS="$DIR/results.jsonl"
: >"$RESULTS"

# run TP SP(0|1) REP: one run, one JSON line into RESULTS.
run() {
    flag=""
    [ "$2" = 1 ] && flag=--sequence-parallel
    rm -f "$DIR/log.jsonl"
    m=$(measure mpirun --oversubscribe -np "$1" "$BUILD/bin/tp-train" $SHAPE --tp "$1" --micro-batch $BATCH \
        --steps "$STEPS" --threads 1 --quiet $flag --log "$DIR/log.jsonl" </dev/null)
    $PY - "$DIR/log.jsonl" "$1" "$2" "$3" "$m" >>"$RESULTS" <<'PY'
import json, statistics, sys
log, tp, sp, rep, measured = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
if measured["status"] != 0:
    sys.exit(f"tp-train at tp{tp} exited {measured['status']}")
rows = [json.loads(line) for line in open(log)]
start = [r for r in rows if r.get("event") == "start"][0]
steps = [r["ms"] for r in rows if "event" not in r and "ms" in r]
print(json.dumps({"tp": tp, "sp": sp, "rep": rep, "activation_bytes": start["activation_bytes"],
                  "sequence_parallel": start["sequence_parallel"], "ms": statistics.median(steps[2:] or steps),
                  "max_rss_bytes": measured["max_rss_bytes"]}))
PY
    tail -n 1 "$RESULTS"
}

for rep in $(seq 1 "$REPS"); do
    for tp in $TPS; do
        if [ $((rep % 2)) = 1 ]; then order="0 1"; else order="1 0"; fi
        for sp in $order; do run "$tp" "$sp" "$rep"; done
    done
done

value() { echo " $SHAPE " | sed -n "s/.* $1 \([^ ]*\) .*/\1/p"; }
TABLE=$($PY - "$RESULTS" "$BATCH" "$(value --seq)" "$(value --layers)" "$(value --dim)" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
batch, seq, layers, dim = (int(x) for x in sys.argv[2:6])
N = batch * seq
# What sequence parallelism divides by tp (trainer/model.c slot_floats): per
# layer the two norms' outputs and the two residuals [N, D] and the norms'
# mean and rstd [N] x 2 each; the stage's input [N, D]; the final norm's
# output [N, D] and its mean and rstd. One slot (pp 1, one micro-batch).
split_floats = layers * N * (4 * dim + 4) + N * dim + N * (dim + 2)
out = ["| tp | sequence parallel | activations kept, MB (measured) | expected, MB | of which norms and residuals, MB | ms/step (median) | peak RSS, largest process, MB |",
       "| --- | --- | --- | --- | --- | --- | --- |"]
for tp in sorted({r["tp"] for r in rows}):
    base = [r for r in rows if r["tp"] == tp and not r["sp"]]
    plain = base[0]["activation_bytes"]
    for sp in (0, 1):
        runs = [r for r in rows if r["tp"] == tp and r["sp"] == sp]
        kept = runs[0]["activation_bytes"]
        if any(r["activation_bytes"] != kept for r in runs) or runs[0]["sequence_parallel"] != bool(sp):
            sys.exit(f"tp{tp}: the runs disagree on what they are")
        split = 4 * split_floats / (tp if sp else 1)
        expected = plain - 4 * split_floats + split + (4 * 2 * N * dim if sp else 0)
        if kept != expected:
            sys.exit(f"tp{tp} sp{sp}: {kept} bytes kept, {expected} expected")
        out.append("| %d | %s | %.2f | %.2f | %.2f | %.0f | %.0f |" % (
            tp, "on" if sp else "off", kept / 1e6, expected / 1e6, split / 1e6,
            statistics.median(r["ms"] for r in runs), statistics.median(r["max_rss_bytes"] for r in runs) / 1e6))
print("\n".join(out))
PY
)
echo "$TABLE"
doc_section bench-parallel "Parallelism options: sequence parallelism (bench-parallel)" <<DOC
Command: \`make bench-parallel\` (BENCH_STEPS=$STEPS, BENCH_REPS=$REPS, BENCH_TPS="$TPS"),
$(openblas_kernel). tp-train $SHAPE, micro-batch $BATCH, one thread per rank, the
ranks sharing this machine's $(nproc) cores (oversubscribed past them: the times say what the collectives and the
smaller norms cost here, not what a cluster would see; with sequence parallelism the backward gathers the norms'
outputs again, a quarter more traffic over TP). "Activations kept" is the start line's activation_bytes, what a rank keeps for the backward
of its micro-batches in flight; "expected" is the same without sequence parallelism with the norm and residual
rows divided by tp and two [B*T, D] buffers added to gather into (the script fails when they differ by a byte).

$TABLE
DOC

# --- ZeRO-1 and ZeRO-3 at tp 1: one process per data-parallel rank, one
# thread each; each run ends with a checkpoint, whose files say what each
# rank wrote (the shard's file rank 0, data-parallel file D rank D: formats
# 1.6 and 1.7).
ZERO_RESULTS="$DIR/zero.jsonl"
: >"$ZERO_RESULTS"
# run_zero DP ZERO REP: one run, one JSON line into ZERO_RESULTS.
run_zero() {
    rm -rf "$DIR/log.jsonl" "$DIR/zero-ckpt"
    m=$(measure mpirun --oversubscribe -np "$1" "$BUILD/bin/tp-train" $SHAPE --micro-batch $BATCH --zero "$2" \
        --steps "$STEPS" --threads 1 --quiet --ckpt-dir "$DIR/zero-ckpt" --log "$DIR/log.jsonl" </dev/null)
    $PY - "$DIR/log.jsonl" "$1" "$2" "$3" "$m" "$DIR/zero-ckpt" >>"$ZERO_RESULTS" <<'PY'
import glob, json, os, statistics, sys
log, dp, zero, rep, measured, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
if measured["status"] != 0:
    sys.exit(f"tp-train at dp{dp} zero {zero} exited {measured['status']}")
rows = [json.loads(line) for line in open(log)]
start = [r for r in rows if r.get("event") == "start"][0]
steps = [r for r in rows if "event" not in r and "ms" in r]
rss = [r for r in rows if r.get("event") == "stop"][-1]["peak_rss_bytes"]  # each rank's, in rank order
step = sorted(glob.glob(os.path.join(ckpt, "step_*")))[-1]
index = json.load(open(os.path.join(step, "index.json")))
# Per data-parallel rank: the bytes of the file it wrote, the moments' and the parameters' values in it.
written = [0] * dp
moments = [0] * dp
params = [0] * dp
for f in index["files"]:
    written[f.get("dp", 0)] += os.path.getsize(os.path.join(step, f["name"]))
file_dp = {f["name"]: f.get("dp", 0) for f in index["files"]}
for t in index["tensors"]:
    if t["role"] in ("exp_avg", "param"):
        for p in t["pieces"]:
            (moments if t["role"] == "exp_avg" else params)[file_dp[p["file"]]] += p["bytes"] // 4
print(json.dumps({"dp": dp, "zero": zero, "rep": rep, "started_zero": start["zero"],
                  "optimizer_bytes": start["optimizer_bytes"], "parameter_bytes": start["parameter_bytes"],
                  "param_values": params, "ms": statistics.median(r["ms"] for r in steps[2:] or steps),
                  "max_rss_bytes": measured["max_rss_bytes"], "rss_bytes": rss, "written_bytes": written,
                  "moment_values": moments, "losses": [r["loss"] for r in steps]}))
PY
    tail -n 1 "$ZERO_RESULTS"
}
for rep in $(seq 1 "$REPS"); do
    for dp in $DPS; do
        if [ $((rep % 2)) = 1 ]; then order="0 $ZEROS"; else order="$(echo $ZEROS | tr " " "\n" | sort -r | tr "\n" " ")0"; fi
        for zero in $order; do run_zero "$dp" "$zero" "$rep"; done
    done
done
ZERO_TABLE=$($PY - "$ZERO_RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
out = ["| dp | ZeRO | moments kept, MB (measured) | expected, MB | parameters and gradients kept, MB | ms/step (median) | vs ZeRO 0 | peak RSS, rank 0, MB | its saving against ZeRO 0, MB | expected, MB | peak RSS, other ranks (largest), MB | its saving, MB | expected, MB | checkpoint written per rank, MB |",
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
MB = 1e6
for dp in sorted({r["dp"] for r in rows}):
    plain = [r for r in rows if r["dp"] == dp and r["zero"] == 0]
    for zero in sorted({r["zero"] for r in rows}):
        runs = [r for r in rows if r["dp"] == dp and r["zero"] == zero]
        kept = runs[0]["optimizer_bytes"]
        if any(r["optimizer_bytes"] != kept or r["started_zero"] != zero for r in runs):
            sys.exit(f"dp{dp} zero {zero}: the runs disagree on what they are")
        # ZeRO changes where the state lives, not the training: the losses of ZeRO 0 (1e-6).
        ref = plain[0]["losses"]
        if any(len(r["losses"]) != len(ref) or any(abs(a - b) > 1e-6 * abs(b) for a, b in zip(r["losses"], ref)) for r in runs):
            sys.exit(f"dp{dp} zero {zero}: the losses differ from ZeRO 0's")
        elements = plain[0]["optimizer_bytes"] // 8
        expected = 8 * (-(-elements // dp) if zero and dp > 1 else elements)
        # ZeRO-3 rounds each unit (a layer, another tensor) up to dp pieces: a value per unit at most.
        if not (kept == expected or (zero == 3 and dp > 1 and expected < kept <= expected + 8 * 64)):
            sys.exit(f"dp{dp} zero {zero}: {kept} bytes of moments kept, {expected} expected")
        # Every moment (and parameter) written once, by one rank; without ZeRO-3 the parameters by rank 0,
        # and without a sharded optimizer the moments too.
        values, param_values = runs[0]["moment_values"], runs[0]["param_values"]
        if sum(values) != sum(plain[0]["moment_values"]) or (not zero and any(values[1:])):
            sys.exit(f"dp{dp} zero {zero}: moments written per rank {values}")
        if sum(param_values) != sum(plain[0]["param_values"]) or (zero != 3 and any(param_values[1:])):
            sys.exit(f"dp{dp} zero {zero}: parameters written per rank {param_values}")
        ms = statistics.median(r["ms"] for r in runs)
        base = statistics.median(r["ms"] for r in plain)
        rss = lambda rs, d: statistics.median(r["rss_bytes"][d] for r in rs)
        # What a rank keeps less with a sharded optimizer (T values; it writes
        # the moments of M_d of them and with ZeRO-3 the parameters of P_d):
        # the moments it no longer keeps (optimizer_bytes); with ZeRO-3 the
        # parameters and gradients too (parameter_bytes: a shard of each and
        # the work area of one use instead of both whole); its snapshot (rank
        # 0's held the T parameters and 2 T moments before; now P_d and
        # 2 M_d), less the gather buffers of a save (dp chunks of at most 1M
        # values per region: the two moments, and with ZeRO-3 the parameters).
        chunk = min(-(-elements // dp), 1 << 20)
        def expected_saving(d):
            if not zero or dp == 1:
                return 0
            snapshot_before = 3 * elements if d == 0 else 0
            snapshot = (param_values[d] if zero == 3 else elements if d == 0 else 0) + 2 * values[d]
            regions = 3 if zero == 3 else 2
            return (plain[0]["optimizer_bytes"] - kept + plain[0]["parameter_bytes"] - runs[0]["parameter_bytes"] +
                    4 * (snapshot_before - snapshot - regions * dp * chunk))
        rank0 = (rss(runs, 0), rss(plain, 0) - rss(runs, 0), expected_saving(0))
        others = ("-", "-", "-")
        if dp > 1:
            largest = max(range(1, dp), key=lambda d: rss(runs, d))
            before = max(rss(plain, d) for d in range(1, dp))
            others = ("%.0f" % (rss(runs, largest) / MB), "%.0f" % ((before - rss(runs, largest)) / MB),
                      "%.0f" % (min(expected_saving(d) for d in range(1, dp)) / MB))
        out.append("| %d | %d | %.2f | %.2f | %.2f | %.0f | %.2fx | %.0f | %.0f | %.0f | %s | %s | %s | %s |" % (
            dp, zero, kept / MB, expected / MB, runs[0]["parameter_bytes"] / MB, ms, base / ms, rank0[0] / MB,
            rank0[1] / MB, rank0[2] / MB, *others,
            " / ".join("%.1f" % (b / MB) for b in runs[0]["written_bytes"])))
print("\n".join(out))
PY
)
echo "$ZERO_TABLE"
doc_section bench-zero "Parallelism options: the sharded optimizer, ZeRO-1 and ZeRO-3 (bench-parallel)" <<DOC
Command: \`make bench-parallel\` (BENCH_STEPS=$STEPS, BENCH_REPS=$REPS, BENCH_DPS="$DPS", BENCH_ZEROS="$ZEROS"),
$(openblas_kernel). tp-train $SHAPE at tp 1, micro-batch $BATCH per rank (so the global
batch grows with dp: compare the ZeRO stages at the same dp), one process per data-parallel rank with one thread,
on this machine's $(nproc) cores, each run ending with a checkpoint. "Moments kept" is the start line's
optimizer_bytes (both fp32 Adam moments of what the rank updates); expected: all of them at ZeRO 0, a dp-th
(rounded up) with ZeRO 1 and 3 (ZeRO-3 rounds each unit up: at most a value per unit more); the script fails when
they differ or when the losses differ from ZeRO 0's (1e-6). "Parameters and gradients kept" is the start line's
parameter_bytes: both whole at ZeRO 0 and 1; with ZeRO-3 a dp-th of each and the work area where one use (a layer,
or the embedding's or the head's tensors) is gathered whole. Peak RSS is each rank's, from the stop line
(\`peak_rss_bytes\`); "other ranks" the largest of them, against the largest at ZeRO 0. The last column is what
each rank wrote (rank 0 the shard's file, rank D its data-parallel file, formats 1.6 and 1.7): the moments
(ZeRO-3: and the parameters) of the tensors given to it (each to the rank with the fewest values to write so
far), the parts in other shards reaching it through all-gathers of 1M-value chunks (trainer/zero.h). "Expected" saving: the state the rank no
longer keeps (moments; with ZeRO-3 the parameters and gradients, from the start lines), and the snapshot it no
longer takes (rank 0's held all the parameters and moments before), less the dp x 1M-value gather buffers of a
save per region.

$ZERO_TABLE
DOC

# --- The interleaved schedule at pp 2: one process per stage, one thread each.
PIPELINE_RESULTS="$DIR/pipeline.jsonl"
: >"$PIPELINE_RESULTS"
# run_pipeline V M REP: one run, one JSON line into PIPELINE_RESULTS.
run_pipeline() {
    rm -f "$DIR/log.jsonl"
    m=$(measure mpirun --oversubscribe -np 2 "$BUILD/bin/tp-train" $PIPELINE_SHAPE --pp 2 --virtual-stages "$1" \
        --micro-batch 1 --grad-accum "$2" --steps "$STEPS" --threads 1 --quiet --log "$DIR/log.jsonl" </dev/null)
    $PY - "$DIR/log.jsonl" "$1" "$2" "$3" "$m" >>"$PIPELINE_RESULTS" <<'PY'
import json, statistics, sys
log, v, micro, rep, measured = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
if measured["status"] != 0:
    sys.exit(f"tp-train at pp2 V{v} m{micro} exited {measured['status']}")
rows = [json.loads(line) for line in open(log)]
start = [r for r in rows if r.get("event") == "start"][0]
steps = [r for r in rows if "event" not in r and "ms" in r]
counted = steps[2:] or steps
print(json.dumps({"v": v, "m": micro, "rep": rep, "virtual_stages": start["virtual_stages"],
                  "activation_bytes": start["activation_bytes"], "ms": statistics.median(r["ms"] for r in counted),
                  "wait_ms": statistics.median(r["pipeline_wait_ms"] for r in counted),
                  "pipeline_ms": statistics.median(r["pipeline_ms"] for r in counted),
                  "losses": [r["loss"] for r in steps]}))
PY
    tail -n 1 "$PIPELINE_RESULTS"
}

for rep in $(seq 1 "$REPS"); do
    for micro in $PIPELINE_M; do
        order=$PIPELINE_V
        [ $((rep % 2)) = 0 ] && order=$(echo "$PIPELINE_V" | tr ' ' '\n' | sort -rn | tr '\n' ' ')
        for v in $order; do run_pipeline "$v" "$micro" "$rep"; done
    done
done
PIPELINE_TABLE=$($PY - "$PIPELINE_RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
out = ["| micro-batches m | virtual stages V | bubble, measured | (pp-1)/(V m) | idle in the pipeline, ms/step | pipeline, ms/step | ms/step (median) | vs V = 1 | activations kept, MB |",
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for m in sorted({r["m"] for r in rows}):
    base = statistics.median(r["ms"] for r in rows if r["m"] == m and r["v"] == 1) if any(
        r["m"] == m and r["v"] == 1 for r in rows) else None
    for v in sorted({r["v"] for r in rows if r["m"] == m}):
        runs = [r for r in rows if r["m"] == m and r["v"] == v]
        if any(r["virtual_stages"] != v for r in runs):
            sys.exit(f"m{m} V{v}: a run says another number of virtual stages")
        # The same training whatever the schedule: every run's losses are those of V = 1 (1e-5).
        ref = [r for r in rows if r["m"] == m and r["v"] == min(x["v"] for x in rows if x["m"] == m)][0]["losses"]
        for r in runs:
            if len(r["losses"]) != len(ref) or any(abs(a - b) > 1e-5 * abs(b) for a, b in zip(r["losses"], ref)):
                sys.exit(f"m{m} V{v}: the losses differ from the other schedules'")
        ms = statistics.median(r["ms"] for r in runs)
        wait = statistics.median(r["wait_ms"] for r in runs)
        span = statistics.median(r["pipeline_ms"] for r in runs)
        out.append("| %d | %d | %.3f | %.3f | %.1f | %.0f | %.0f | %s | %.1f |" % (
            m, v, wait / (span - wait), 1 / (v * m), wait, span, ms, "%.2fx" % (base / ms) if base else "-",
            runs[0]["activation_bytes"] / 1e6))
print("\n".join(out))
PY
)
echo "$PIPELINE_TABLE"
doc_section bench-pipeline "Parallelism options: the interleaved pipeline schedule (bench-parallel)" <<DOC
Command: \`make bench-parallel\` (BENCH_STEPS=$STEPS, BENCH_REPS=$REPS, BENCH_PIPELINE_M="$PIPELINE_M",
BENCH_PIPELINE_V="$PIPELINE_V"), $(openblas_kernel). tp-train $PIPELINE_SHAPE at pp 2,
micro-batches of one sequence, one process per stage with one thread on this machine's $(nproc) cores. The bubble
measured is the ranks' mean idle time in the pipeline (each step line's pipeline_wait_ms: waiting for messages, and
after a rank's last operation until the slowest rank's end) over the rest of the longest rank's pipeline time
(pipeline_ms); the formula's is the same ratio for stages of equal work and free messages. Here the last stage
also computes the head and the first the embedding, and the messages take time. With V virtual stages each
micro-batch crosses between the stages V times each way instead of once; "ms/step" is the whole step (the
gradients' reductions and the optimizer too); "activations kept" is the start line's activation_bytes, rank 0's
(the first stage keeps the most micro-batches in flight). The losses of every schedule are checked equal
(1e-5) before the table is written.

$PIPELINE_TABLE
DOC
