#!/bin/sh
# make bench-revisions BENCH_BASE=REV: the programs of this tree against those
# of revision REV, side by side in one run, for a change that should cost
# nothing (a restructuring): both built the same way (CPU only, -O2), then,
# taking turns going first, a reshard of a 2 GiB checkpoint (bf16 weights,
# fp32 master and Adam state, tp4pp2 -> tp2pp1, 512M memory limit), its
# verification, a GGUF export, 12 training steps of the small GPT and 4 of a
# GPT at sequence 1024 (time and peak memory: attention's activations). The
# source is read into the page cache before each run and outputs go to a
# tmpfs where there is one (/dev/shm): what is compared is the programs'
# own work, not the disk's, whose speed on a shared machine varies by 3x from
# run to run. Writes docs/BENCHMARKS.md (section bench-revisions).
#   BENCH_BASE (default HEAD~1): the revision to compare with, built in a git
#   worktree of its own (removed at the end, whatever happens)
#   BENCH_REPS (default 4, even): repetitions
#   BENCH_BASE_BIN, BENCH_CURRENT_BIN (default: built here): directories of
#   programs already built, used instead of building the base revision or this
#   tree (the two builds take half a minute on two cores; a tiny run gives the
#   current build for both, which measures nothing and tests the script)
#   BENCH_CKPT (default "--layers 8 --dim 1024 --heads 16 --vocab 50257 --seq
#   1024", the 2 GiB): the checkpoint's model, as tp-ckpt synth takes it
#   BENCH_TRAIN (default "--model small --steps 12"), BENCH_TRAIN_LONG
#   (default "--layers 4 --dim 256 --heads 4 --vocab 256 --seq 1024
#   --micro-batch 4 --steps 4"): the two training cases, as tp-train takes them
#   BENCH_SETTLE (default 1 here): seconds of pause before each run
#   Where it writes: scripts/bench-lib.sh.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BASE=${BENCH_BASE:-HEAD~1}
REPS=${BENCH_REPS:-4}
REPS=$(( (REPS + 1) / 2 * 2 )) # even: each version goes first as often as second
PAUSE=${BENCH_SETTLE:-1}
CKPT_MODEL=${BENCH_CKPT:-"--layers 8 --dim 1024 --heads 16 --vocab 50257 --seq 1024"}
TRAIN=${BENCH_TRAIN:-"--model small --steps 12"}
TRAIN_LONG=${BENCH_TRAIN_LONG:-"--layers 4 --dim 256 --heads 4 --vocab 256 --seq 1024 --micro-batch 4 --steps 4"}
DIR="$SCRATCH_ROOT/revisions"
mkdir -p "$DIR"

# Outputs on a tmpfs where there is one, in a directory of this run's own.
# Whatever ends the run removes it, and the base's worktree: none is left
# registered (git worktree list).
OUT_DIR="" worktree=""
cleanup() {
    set +e
    [ -z "$OUT_DIR" ] || rm -rf "$OUT_DIR"
    if [ -n "$worktree" ]; then
        git worktree remove --force "$worktree" 2>/dev/null || rm -rf "$worktree"
        git worktree prune
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if [ -d "$TMPFS_ROOT" ] && [ -w "$TMPFS_ROOT" ]; then OUT_DIR=$(mktemp -d "$TMPFS_ROOT/tp-bench-revisions-XXXXXX"); fi
OUT="${OUT_DIR:-$DIR}/out"
OUT_NOTE=$( [ -n "$OUT_DIR" ] && echo "on tmpfs" || echo "on disk")

# Both builds: the base in a worktree of its own, this tree as it is.
if [ -n "${BENCH_BASE_BIN:-}" ]; then
    BASE_BIN=$BENCH_BASE_BIN
    BASE_SETTING="BENCH_BASE_BIN=$BASE_BIN"
else
    BASE_SETTING="BENCH_BASE=$(git rev-parse --short "$BASE")"
    rm -rf "$DIR/base"
    git worktree prune
    worktree="$DIR/base"
    git worktree add -f --detach "$worktree" "$BASE" >/dev/null
    make -C "$worktree" -s -j2 CUDA=0 BUILD=build programs >/dev/null
    BASE_BIN="$worktree/build/bin"
fi
if [ -n "${BENCH_CURRENT_BIN:-}" ]; then
    CURRENT_BIN=$BENCH_CURRENT_BIN
else
    make -s -j2 CUDA=0 BUILD="$DIR/current" programs >/dev/null
    CURRENT_BIN="$DIR/current/bin"
fi
BUILT="Both revisions built with CUDA=0 and -O2."
if [ -n "${BENCH_BASE_BIN:-}${BENCH_CURRENT_BIN:-}" ]; then
    BUILT="Programs: the base's in $BASE_BIN, this tree's in $CURRENT_BIN (those given not built here)."
fi

"$CURRENT_BIN/tp-ckpt" synth -o "$DIR/src" --tp 4 --pp 2 $CKPT_MODEL --optim --dtype bf16 --seed 1 --force >/dev/null
SIZE=$("$CURRENT_BIN/tp-ckpt" info "$DIR/src" --json |
    $PY -c 'import json,sys; b = sum(t["bytes"] for t in json.load(sys.stdin)["tensors"]); print("%.1f GiB" % (b / 2**30) if b >= 2**29 else "%.1f MiB" % (b / 2**20))')

RESULTS="$DIR/results.txt"
: >"$RESULTS"
run_case() { # VERSION CASE BIN
    version=$1 case=$2 bin=$3
    rm -rf "$OUT" "$OUT.gguf"
    cat "$DIR"/src/*.h5 >/dev/null
    sleep "$PAUSE"
    case $case in
    reshard) line=$(measure "$bin/tp-reshard" "$DIR/src" --to tp2pp1 -o "$OUT" --memory-limit 512M 2>/dev/null) ;;
    verify) line=$(measure "$bin/tp-ckpt" verify "$DIR/src" 2>/dev/null) ;;
    export) line=$(measure "$bin/tp-ckpt" export "$DIR/src" --format gguf -o "$OUT.gguf" 2>/dev/null) ;;
    train)
        tokens=$("$bin/tp-train" $TRAIN --micro-batch 2 --threads 2 | sed -n 's/^done.*(\([0-9]*\) tokens\/s).*/\1/p')
        [ -n "$tokens" ] || { echo "bench-revisions: $version tp-train printed no 'done ... tokens/s' line" >&2; exit 1; }
        line="{\"tokens_per_s\": $tokens, \"status\": 0}" ;;
    train1024) line=$(measure "$bin/tp-train" $TRAIN_LONG --threads 2 --quiet 2>/dev/null) ;;
    esac
    echo "$version $case $line" >>"$RESULTS"
}
for rep in $(seq 1 "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then order="base current"; else order="current base"; fi
    for case in reshard verify export train train1024; do
        for version in $order; do
            if [ $version = base ]; then run_case base $case "$BASE_BIN"; else run_case current $case "$CURRENT_BIN"; fi
        done
    done
done

# The section is made whole before it is written: a failed case writes nothing.
$PY - "$RESULTS" "$BASE_SETTING" "$REPS" "$OUT_NOTE" "$BUILT" "$CKPT_MODEL" "$SIZE" "$TRAIN" "$TRAIN_LONG" <<'PYEOF' >"$DIR/section.md"
import json, statistics, sys
path, base_setting, reps, out_note, built, ckpt_model, size, train, train_long = sys.argv[1:10]
runs = {}
for line in open(path):
    version, case, data = line.split(" ", 2)
    r = json.loads(data)
    if r["status"] != 0:
        sys.exit(f"{version} {case} failed")
    runs.setdefault((case, version), []).append(r)


def ratio(case, key):
    """Geometric mean of this tree's figure over the base's, repetition by
    repetition: the versions swap places every repetition, so what the
    position alone does cancels out."""
    pairs = zip(runs[(case, "current")], runs[(case, "base")])
    return statistics.geometric_mean(c[key] / b[key] for c, b in pairs)


print(f"Command: `make bench-revisions` ({base_setting}, BENCH_REPS={reps}).")
print(built)
print(f"Checkpoint: GPT `{ckpt_model}`, bf16 weights with fp32 master weights and Adam moments,")
print(f"tp4pp2 ({size}), in the page cache before every run; outputs {out_note}.")
print("The versions swap places every repetition (on this machine a run right after another is often")
print("up to 2.5x slower, whichever it is); figures are means, the ratio the geometric mean of the repetitions' ratios.")
print()
print("| case | base | this tree | this tree / base |")
print("| --- | --- | --- | --- |")
names = {"reshard": "reshard tp4pp2 -> tp2pp1, 512M", "verify": "tp-ckpt verify", "export": "export GGUF",
         "train1024": f"tp-train `{train_long}`, 2 threads"}
for case in ("reshard", "verify", "export", "train1024"):
    b = statistics.mean(r["seconds"] for r in runs[(case, "base")])
    c = statistics.mean(r["seconds"] for r in runs[(case, "current")])
    rb = max(r["max_rss_bytes"] for r in runs[(case, "base")]) / 2**20
    rc = max(r["max_rss_bytes"] for r in runs[(case, "current")]) / 2**20
    print(f"| {names[case]} | {b:.2f} s, {rb:.0f} MiB | {c:.2f} s, {rc:.0f} MiB | {ratio(case, 'seconds'):.2f}x time |")
b = statistics.mean(r["tokens_per_s"] for r in runs[("train", "base")])
c = statistics.mean(r["tokens_per_s"] for r in runs[("train", "current")])
print(f"| tp-train `{train}`, micro-batch 2, 2 threads | {b:.0f} tokens/s | {c:.0f} tokens/s | "
      f"{ratio('train', 'tokens_per_s'):.2f}x throughput |")
PYEOF
doc_section bench-revisions "Against an earlier revision (bench-revisions)" <"$DIR/section.md"
echo "bench-revisions: written to $DOC"
