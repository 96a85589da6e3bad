#!/bin/sh
# The cost of each multipart part's MD5 (store/s3.c put_part: its bytes read
# and hashed before they are sent, for Content-MD5 and the upload's ETag)
# against the upload path's throughput: `tp-ckpt copy` of a checkpoint to
# s3rver on loopback (64 MiB parts, 8 threads; without the tests' signing
# proxy), by this build and by a build of a revision without the MD5s
# (BENCH_BASE_BIN, its bin/ directory), alternating, BENCH_REPS rounds, the
# faster of each kept; and OpenSSL's MD5 (`openssl dgst -md5`, one core)
# over the same files. Prints a Markdown table, and with BENCH_DOC writes it
# as the section bench-s3-md5 of that file (docs/BENCHMARKS.md; test_bench
# runs it at the tiny size with this build as both).
#   BENCH_MODEL (default "--model gpt2-124m --optim --tp 4"), BENCH_REPS (3)
set -eu
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
. tests/support/objstore.sh
BIN=${BUILD:-build}/bin
BASE=${BENCH_BASE_BIN:?"BENCH_BASE_BIN: the bin/ directory of a build without the parts' MD5s"}
MODEL=${BENCH_MODEL:-"--model gpt2-124m --optim --tp 4"}
REPS=${BENCH_REPS:-3}
SCRATCH="$SCRATCH_ROOT/s3-md5"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
STORE=$(mktemp -d "$TMPFS_ROOT/tp-bench-s3-md5-XXXXXX")
trap 's3_stop 2>/dev/null || true; rm -rf "$STORE"' EXIT
trap 'exit 1' INT TERM
"$BIN/tp-ckpt" synth -o "$SCRATCH/local" $MODEL --pp 1 --step 1 >&2
BYTES=$(du -sb "$SCRATCH/local" | cut -f1)
if ! OBJSTORE_S3_PROXY=0 s3_start "$STORE/s3" bench >&2; then
    echo "bench-s3-md5: skipped: s3rver cannot be started (scripts/deps.sh installs it)" >&2
    if [ -n "${BENCH_DOC:-}" ]; then
        doc_section bench-s3-md5 "The multipart parts' MD5 (bench-s3-md5)" <<DOC
Skipped on this machine: s3rver could not start (scripts/deps.sh installs it).
DOC
    fi
    exit 0
fi
export AWS_ENDPOINT_URL="$S3_ENDPOINT"
least() { $PY -c 'import sys; print("%.2f" % min(map(float, sys.argv[1:])))' "$@"; }
mbs() { $PY -c 'import sys; print("%.0f" % (float(sys.argv[1]) / float(sys.argv[2]) / 1e6))' "$BYTES" "$1"; }
ours=999 base=999 md5=999
for round in $(seq 1 "$REPS"); do
    sync
    t=$(measure "$BASE/tp-ckpt" copy --force "$SCRATCH/local" "s3://bench/base/step_00000001" | measured_seconds)
    base=$(least "$base" "$t")
    sync
    t=$(measure "$BIN/tp-ckpt" copy --force "$SCRATCH/local" "s3://bench/ours/step_00000001" | measured_seconds)
    ours=$(least "$ours" "$t")
    t=$(measure sh -c "openssl dgst -md5 '$SCRATCH'/local/*.h5 >/dev/null" | measured_seconds)
    md5=$(least "$md5" "$t")
done
TABLE="$SCRATCH/table.md"
{
echo "checkpoint: $BYTES bytes ($MODEL); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; s3rver on loopback"
echo
echo "| what | seconds | MB/s | / upload without MD5 |"
echo "| --- | --- | --- | --- |"
for row in "upload, parts without MD5 (BENCH_BASE_BIN)|$base" "upload, each part's MD5 read first and sent (Content-MD5)|$ours" \
    "OpenSSL MD5 of the same bytes, one core|$md5"; do
    what=${row%|*} s=${row#*|}
    echo "| $what | $s | $(mbs "$s") | $($PY -c 'import sys; print("%.2f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$s" "$base") |"
done
} | tee "$TABLE"
if [ -n "${BENCH_DOC:-}" ]; then
    doc_section bench-s3-md5 "The multipart parts' MD5 (bench-s3-md5)" <<DOC
Command: \`BENCH_DOC=docs/BENCHMARKS.md BENCH_BASE_BIN=DIR scripts/bench-s3-md5.sh\` (DIR: the bin/ of a build
without the parts' MD5s). \`tp-ckpt copy\` of a checkpoint to s3rver on loopback, the two builds alternating,
the faster of $REPS rounds kept each.
$(cat "$TABLE")
DOC
fi
