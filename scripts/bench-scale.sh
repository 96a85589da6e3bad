#!/bin/sh
# make bench-scale: what index.json costs at cluster scale (docs/SCALE.md).
# bench/index_scale builds the index of a checkpoint in memory with the
# checkpoint library's own structures and serializer, for a 70B Llama with
# fp32 Adam state at tp8 pp16 (128 shard files) at two data-parallel
# degrees, and for a model 25 times deeper at 128 and 16,000 shard files;
# it measures serializing and parsing (time, peak heap) and computes the
# bytes and S3 requests of a save and a resume. Writes the tables into
# docs/BENCHMARKS.md (section bench-scale); docs/SCALE.md explains them.
#   BENCH_REPS (default 3): best of this many serializations and parses.
#   BENCH_SCALE_MODEL (default: none, the 70B Llama): model options of the
#     first cases; BENCH_SCALE_PP (default 16): their pipeline degree;
#     BENCH_SCALE_DPS (default "8 128"): their data-parallel degrees.
#   BENCH_SCALE_DEEP (default 2000): layers of the deep model, at pp 16 and at
#     pp = layers (one layer per stage, tp8: 8 x layers shard files).
#   A tiny run (tests/e2e/test_bench.sh): BENCH_SCALE_MODEL="--layers 4 --dim 64
#     --ffn 128 --heads 8 --kv-heads 8 --vocab 256" BENCH_SCALE_PP=2
#     BENCH_SCALE_DPS="2 4" BENCH_SCALE_DEEP=16.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BUILD=${BUILD:-build}
REPS=${BENCH_REPS:-3}
MODEL=${BENCH_SCALE_MODEL:-}
PP=${BENCH_SCALE_PP:-16}
DPS=${BENCH_SCALE_DPS:-8 128}
DEEP=${BENCH_SCALE_DEEP:-2000}
BENCH="$BUILD/bench/index_scale"
DIR="$SCRATCH_ROOT/scale"
mkdir -p "$DIR"
RESULTS="$DIR/results.jsonl"
: >"$RESULTS"

# run LABEL OPTIONS...: one case, its JSON line (with the label) appended.
run() {
    label=$1
    shift
    echo "== $label: index_scale $*"
    # shellcheck disable=SC2086
    out=$("$BENCH" --repeat "$REPS" "$@")
    echo "$out" | grep -v '^{'
    echo "$out" | grep '^{"op":"index_scale"' | $PY -c 'import json, sys
d = json.loads(sys.stdin.read()); d["case"] = sys.argv[1]; print(json.dumps(d))' "$label" >>"$RESULTS"
}

for dp in $DPS; do
    # shellcheck disable=SC2086
    run "tp8 pp$PP dp$dp" --tp 8 --pp "$PP" --dp "$dp" $MODEL
done
last_dp=${DPS##* }
# shellcheck disable=SC2086
run "tp8 pp$PP dp$last_dp, zstd" --tp 8 --pp "$PP" --dp "$last_dp" --compressed $MODEL
# The deep model: the same tensors at 128 files and at 8 x DEEP files, so
# that only the number of files differs (dp 1: one rank per shard).
# shellcheck disable=SC2086
run "deep, tp8 pp$PP dp1" --tp 8 --pp "$PP" --dp 1 $MODEL --layers "$DEEP"
# shellcheck disable=SC2086
run "deep, tp8 pp$DEEP dp1" --tp 8 --pp "$DEEP" --dp 1 $MODEL --layers "$DEEP"

TABLES=$($PY - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
MB, GB = 1e6, 1e9
out = ["Measured (best of %d):" % rows[0]["repeat"], "",
       "| case | model | ranks | files | tensors | pieces | index.json | serialize | its peak heap | parse | its peak heap | parsed index kept |",
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    out.append("| %s | %.1fB, %d layers | %d | %d | %d | %d | %.2f MB | %.3f s | %.1f MB | %.3f s | %.1f MB | %.1f MB |" % (
        r["case"], r["parameters"] / 1e9, r["layers"], r["ranks"], r["files"], r["tensors"], r["pieces"],
        r["index_bytes"] / MB, r["serialize_s"], r["serialize_heap_bytes"] / MB, r["parse_s"],
        r["parse_heap_bytes"] / MB, r["parsed_kept_bytes"] / MB))
out += ["", "Computed from the same indexes (the request rules of ckpt/, docs/SCALE.md; %d checkpoints kept):" % rows[0]["keep"], "",
        "| case | checkpoint | per writer | parts per file | save: PUT + POST | save: HEAD, LIST | resume, per reader: HEAD, GET, LIST before pieces | piece GETs, busiest reader | resume, all ranks: HEAD, GET, LIST |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    out.append("| %s | %.1f GB | %.2f-%.2f GB | %d | %d | %d, %d | %d, %d, %d | %d | %d, %d, %d |" % (
        r["case"], r["ckpt_bytes"] / GB, r["file_bytes_min"] / GB, r["file_bytes_max"] / GB, r["parts_max"],
        r["save_put"] + r["save_post"], r["save_head"], r["save_list"], r["open_head_per_rank"],
        r["open_get_per_rank"], r["open_list_per_rank"], r["piece_gets_per_rank_max"],
        r["resume_head"], r["resume_get"], r["resume_list"]))
print("\n".join(out))
PY
)
echo "$TABLES"
doc_section bench-scale "Checkpoints at cluster scale: the index and the requests (bench-scale)" <<DOC
Command: \`make bench-scale\` (BENCH_REPS=$REPS${MODEL:+, BENCH_SCALE_MODEL="$MODEL"}, BENCH_SCALE_PP=$PP,
BENCH_SCALE_DPS="$DPS", BENCH_SCALE_DEEP=$DEEP). bench/index_scale builds each index in memory with ckpt/index.h's
structures from the model's catalogue (the trainer's tensor names, shapes and partitions; Adam's exp_avg and
exp_avg_sq in fp32; one rng entry per rank as the trainer writes them; made-up checksums and offsets of real width),
then times ckpt_index_to_json and ckpt_index_parse; heap figures count every allocation (the text excluded). "deep"
is the same shape with $DEEP layers, so that its two rows differ only in the number of shard files. "zstd": every
piece compressed, one [offset, length, mask] per 1 MiB block. What the figures mean: docs/SCALE.md.

$TABLES
DOC
