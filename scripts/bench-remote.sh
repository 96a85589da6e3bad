#!/bin/sh
# make bench-remote: checkpoints in object stores on the loopback interface
# (issue 14). A GPT-2 124M checkpoint with its Adam moments (about 1.5 GB,
# tp4: 4 shard files) is uploaded and downloaded by tp-ckpt copy and, in the
# same run, by plain curl (one process per file, all in parallel: the
# baseline the target is held to, at least 0.8x its speed); then tp-reshard
# reads it from the store into a local tp2 checkpoint, beside the same
# reshard from the local copy (target: within 1.5x). Stores: Debian's nginx
# with WebDAV, and s3rver (S3; curl signs with --aws-sigv4), started here by
# tests/support/objstore.sh and stopped by process id; a store that cannot
# start is said skipped. Warm page cache throughout. Prints a Markdown table
# for docs/BENCHMARKS.md, whose section of it is written by hand: the section
# is written only to a BENCH_DOC given (scripts/bench-lib.sh; scratch under
# BENCH_SCRATCH).
#   BENCH_MODEL (default "--model gpt2-124m"): the checkpoint's model, as
#   tp-ckpt synth takes it (a tiny run: "--model tiny")
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
REPO_ROOT=$(pwd)
. tests/support/objstore.sh
BIN=${BUILD:-build}/bin
MODEL=${BENCH_MODEL:-"--model gpt2-124m"}
SCRATCH="$SCRATCH_ROOT/remote"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)
# The servers keep their objects in memory ($TMPFS_ROOT when it has room):
# the disk's writeback of 1.5 GB per upload otherwise decides who is faster
# from one run to the next. The tools' local side stays on the disk.
STORE_ROOT="$SCRATCH"
if [ -d "$TMPFS_ROOT" ] && [ "$(df -Pk "$TMPFS_ROOT" | awk 'NR==2 {print $4}')" -gt 8000000 ]; then
    STORE_ROOT=$(mktemp -d "$TMPFS_ROOT/tp-bench-remote-XXXXXX")
fi
cleanup() {
    webdav_stop 2>/dev/null || true
    s3_stop 2>/dev/null || true
    [ "$STORE_ROOT" = "$SCRATCH" ] || rm -rf "$STORE_ROOT"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

echo "writing the checkpoint ($MODEL, --optim, tp4)..." >&2
"$BIN/tp-ckpt" synth -o "$SCRATCH/local" $MODEL --tp 4 --pp 1 --optim --step 1 >&2 # uploaded as a run's step_00000001
BYTES=$(du -sb "$SCRATCH/local" | cut -f1)
FILES=$(cd "$SCRATCH/local" && ls)

# (A tiny checkpoint can take 0.00 s as printed: no ratio or rate then.)
ratio() { $PY -c 'import sys; a, b = map(float, sys.argv[1:3]); print("%.2f" % (a / b) if b else "-")' "$1" "$2"; }
rate() { $PY -c 'import sys; a, b = map(float, sys.argv[1:3]); print("%.0f" % (a / b / 1e6) if b else "-")' "$BYTES" "$1"; }

# curl_all UP|DOWN BASE DIR [curl options]: every file of the checkpoint at
# once, one curl each (index.json included).
curl_all() {
    direction=$1 curl_url=$2 curl_dir=$3
    shift 3
    pids=""
    for f in $FILES; do
        if [ "$direction" = UP ]; then curl -sSf "$@" -T "$SCRATCH/local/$f" "$curl_url/$f" -o /dev/null &
        else curl -sSf "$@" "$curl_url/$f" -o "$curl_dir/$f" &
        fi
        pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    return $rc
}

row() { # store operation ours theirs what-theirs-is
    printf '| %s | %s | %s s (%s MB/s) | %s s (%s MB/s) | %s |\n' "$1" "$2" "$3" "$(rate "$3")" "$4" "$(rate "$4")" \
        "$(ratio "$4" "$3")"
}

least() { $PY -c 'import sys; print("%.2f" % min(map(float, sys.argv[1:])))' "$@"; }
elapsed() { $PY -c 'import sys,time; print("%.2f" % (time.monotonic() - float(sys.argv[1])))' "$1"; }

bench_store() { # name our-base-url curl-base-url [curl options]
    name=$1 base=$2 curl_base=$3
    shift 3
    # Two rounds, tp-toolkit and curl alternating, after a sync each; the
    # faster of each kept (the disk's writeback of one run slows the next).
    mkdir -p "$SCRATCH/curl-down"
    up=999 up_whole=999 curl_up=999 down=999 curl_down=999 curl_down_sync=999
    for round in 1 2; do
        sync
        t=$(measure "$BIN/tp-ckpt" copy --force "$SCRATCH/local" "$base/ours/step_00000001" | measured_seconds)
        up=$(least "$up" "$t")
        sync
        # One PUT per file, as curl does (S3: no multipart below 5 GB).
        t=$(TP_REMOTE_PART_MB=5120 measure "$BIN/tp-ckpt" copy --force "$SCRATCH/local" \
            "$base/whole/step_00000001" | measured_seconds)
        up_whole=$(least "$up_whole" "$t")
        sync
        start=$($PY -c 'import time; print(time.monotonic())')
        curl_all UP "$curl_base/curl/step_00000001" "" "$@"
        curl_up=$(least "$curl_up" "$(elapsed "$start")")
        sync
        rm -rf "$SCRATCH/down-$name"
        t=$(measure "$BIN/tp-ckpt" copy "$base/ours/step_00000001" "$SCRATCH/down-$name" | measured_seconds)
        down=$(least "$down" "$t")
        sync
        start=$($PY -c 'import time; print(time.monotonic())')
        curl_all DOWN "$curl_base/curl/step_00000001" "$SCRATCH/curl-down" "$@"
        curl_down=$(least "$curl_down" "$(elapsed "$start")")
        sync # ours is a committed checkpoint, its files synced: curl's as durable
        curl_down_sync=$(least "$curl_down_sync" "$(elapsed "$start")")
    done
    cmp -s "$SCRATCH/local/index.json" "$SCRATCH/down-$name/index.json" || { echo "download differs" >&2; exit 1; }
    remote=$(measure "$BIN/tp-reshard" "$base/ours/step_00000001" --to tp2pp1 -o "$SCRATCH/reshard-$name" | measured_seconds)
    local_=$(measure "$BIN/tp-reshard" "$SCRATCH/local" --to tp2pp1 -o "$SCRATCH/reshard-local-$name" | measured_seconds)
    "$BIN/tp-ckpt" diff "$SCRATCH/reshard-$name" "$SCRATCH/reshard-local-$name" >&2
    row "$name" "upload (curl: parallel PUTs)" "$up" "$curl_up"
    row "$name" "upload, one PUT per file (TP_REMOTE_PART_MB=5120)" "$up_whole" "$curl_up"
    row "$name" "download (curl: parallel GETs, not synced)" "$down" "$curl_down"
    row "$name" "download (curl: parallel GETs, then sync)" "$down" "$curl_down_sync"
    printf '| %s | reshard tp4 -> tp2 from the store (beside: from local) | %s s | %s s | %s |\n' "$name" "$remote" \
        "$local_" "$(ratio "$local_" "$remote")"
    rm -rf "$SCRATCH/down-$name" "$SCRATCH/curl-down" "$SCRATCH/reshard-$name" "$SCRATCH/reshard-local-$name"
}

# Saves of tp-train to the store with every writing rank uploading its own
# shard from a cache of its own (a TMPDIR per rank: no shared file system),
# at 1, 2, 4 and 8 ranks, beside one process uploading the same checkpoint
# (tp-ckpt copy, 8 threads: what rank 0 did alone before, after a local
# commit). Per row: the save's seconds from its start to its index being up
# (the trainer's upload event), the training loop's stall for it, its phases
# (the slowest rank's writing and uploading, the index), and the
# one-process upload of its bytes.
#   BENCH_RANKS (default "1 2 4 8"), BENCH_TRAIN_MODEL (default $MODEL)
RANKS=${BENCH_RANKS:-"1 2 4 8"}
TRAIN_MODEL=${BENCH_TRAIN_MODEL:-$MODEL}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
layout_of() { case $1 in 1) echo "--tp 1" ;; 2) echo "--tp 2" ;; 4) echo "--tp 4" ;; *) echo "--tp 4 --pp $(($1 / 4))" ;; esac; }
bench_ranks() { # base-url
    base_url=$1
    for n in $RANKS; do
        log="$SCRATCH/ranks$n.jsonl"
        rm -f "$log"
        set --
        for r in $(seq 1 "$n"); do
            mkdir -p "$SCRATCH/node$n-$r"
            [ "$r" -gt 1 ] && set -- "$@" :
            set -- "$@" -np 1 env TMPDIR="$SCRATCH/node$n-$r" "$BIN/tp-train" $TRAIN_MODEL $(layout_of "$n") \
                --micro-batch 1 --steps 4 --ckpt-every 2 --ckpt-dir "$base_url/ranks$n" --log "$log" --quiet
        done
        mpirun --oversubscribe "$@" </dev/null >&2
        set -- $($PY -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
up = [r for r in rows if r.get("event") == "upload" and r["step"] == 2][0]
stall = [r for r in rows if r.get("step") == 2 and "loss" in r][0]["ckpt_stall_ms"] / 1e3
print("%.2f %.3f %d %.2f %.2f %.2f" % (up["seconds"], stall, up["bytes"], up["write_seconds"], up["upload_seconds"],
                                        up["index_seconds"]))' "$log")
        rm -rf "$SCRATCH/copy$n"
        "$BIN/tp-ckpt" copy "$base_url/ranks$n/step_00000002" "$SCRATCH/copy$n" >&2
        sync
        one=$(measure "$BIN/tp-ckpt" copy --force "$SCRATCH/copy$n" "$base_url/one$n/step_00000002" | measured_seconds)
        printf '| %s | %s | %s MB | %s s | %s s | %s s | %s s | %s s | %s s | %s |\n' "$n" "$(layout_of "$n")" \
            "$($PY -c "print('%.1f' % ($3 / 1e6))")" "$1" "$2" "$4" "$5" "$6" "$one" "$(ratio "$one" "$5")"
        rm -rf "$SCRATCH/copy$n" "$SCRATCH"/node$n-*
    done
}
RANKS_TABLE="$SCRATCH/ranks.md"

# The table, printed as it grows and kept for the section.
TABLE="$SCRATCH/table.md"
{
    echo
    echo "checkpoint: $($PY -c "print('%.1f' % ($BYTES / 1e6))") MB in $(echo "$FILES" | wc -w) files \
(\`tp-ckpt synth $MODEL --tp 4 --optim\`); $(nproc) cores; loopback"
    echo
    echo "servers store objects in: $(df -P "$STORE_ROOT" | awk 'NR==2 {print $1}') ($STORE_ROOT)"
    echo
    echo "| store | operation | tp-toolkit | baseline | baseline / tp-toolkit time |"
    echo "| --- | --- | --- | --- | --- |"
} | tee "$TABLE"
# nginx receives bodies in its private directory (under TMPDIR), then
# renames them into its root: both on the same file system.
saved_tmpdir=${TMPDIR:-/tmp}
export TMPDIR="$STORE_ROOT"
# (An if, not $? after it: under set -e a store that cannot start ended the
# benchmark, where it is to be said skipped and S3 tried.)
if webdav_start "$STORE_ROOT/webdav" >&2; then started=0; else started=1; fi
export TMPDIR="$saved_tmpdir"
if [ $started = 0 ]; then
    bench_store "nginx WebDAV" "$WEBDAV_URL" "$WEBDAV_URL" >"$SCRATCH/rows.md"
    tee -a "$TABLE" <"$SCRATCH/rows.md"
    {
        echo
        echo "tp-train $TRAIN_MODEL, a save at step 2 of 4 to nginx WebDAV, a TMPDIR per rank; $(nproc) cores"
        echo
        echo "| ranks | layout | checkpoint | save: start to index up | training stall | writing (slowest rank) | uploading (slowest rank) | index and latest | one process uploads it (tp-ckpt copy) | one process / per-rank upload |"
        echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    } | tee "$RANKS_TABLE"
    bench_ranks "$WEBDAV_URL" | tee -a "$RANKS_TABLE"
    webdav_stop
else
    echo "| nginx WebDAV | skipped: nginx could not start | | | |" | tee -a "$TABLE"
fi
rm -rf "$STORE_ROOT/webdav"
if OBJSTORE_S3_PROXY=0 s3_start "$STORE_ROOT/s3" bench >&2; then
    export AWS_ENDPOINT_URL="$S3_ENDPOINT"
    bench_store "S3 (s3rver)" "s3://bench" "$S3_ENDPOINT/bench" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" >"$SCRATCH/rows.md"
    tee -a "$TABLE" <"$SCRATCH/rows.md"
    s3_stop
else
    echo "| S3 (s3rver) | skipped: s3rver could not start | | | |" | tee -a "$TABLE"
fi
if [ -n "${BENCH_DOC:-}" ]; then
    doc_section bench-remote "Checkpoints in object stores (bench-remote)" <<DOC
Command: \`BENCH_DOC=docs/BENCHMARKS.md make bench-remote\` (scripts/bench-remote.sh; without BENCH_DOC the tables are printed only). Upload and download: two rounds, alternating, the faster
of each kept; tp-toolkit is \`tp-ckpt copy\` and \`tp-reshard\`, the baseline curl (one process per file, all at
once) and, for the reshard, the same reshard from the local copy.
$(cat "$TABLE")
DOC
    [ -s "$RANKS_TABLE" ] && doc_section bench-remote-ranks "Saves to an object store by every rank (bench-remote)" <<DOC
Command: \`BENCH_DOC=docs/BENCHMARKS.md make bench-remote\` (scripts/bench-remote.sh). tp-train saves with each writing rank uploading its own
shard from a cache of its own (a TMPDIR per rank), against one process uploading the same checkpoint
(\`tp-ckpt copy\`, 8 threads), as rank 0 did alone before. The save's time runs from its start (the snapshot) to
its index being up, writing included; the one-process upload starts from the written checkpoint.
$(cat "$RANKS_TABLE")
DOC
fi
