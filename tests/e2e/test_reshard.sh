#!/bin/sh
# tp-reshard end to end: round trips, merging to tp1, an independent h5py
# merge of the output against the source, options, memory bound, bad input.
# tier: check
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
# 8 heads, 4 KV heads (GQA), SwiGLU, vocabulary padded: every partition kind.
MODEL="--layers 4 --dim 128 --heads 8 --kv-heads 8 --swiglu --ffn 256 --vocab 1001 --vocab-pad-multiple 4 --seq 16"
GQA="--layers 4 --dim 128 --heads 8 --kv-heads 4 --ffn 256 --vocab 777 --seq 16"

expect_ok "synth tp8pp2 with optimizer state" "$CK" synth -o "$WORK/src" --tp 8 --pp 2 $MODEL --optim --dtype bf16 --seed 9
expect_ok "synth the same model at tp1pp1" "$CK" synth -o "$WORK/tp1" --tp 1 --pp 1 $MODEL --optim --dtype bf16 --seed 9

# ----------------------------------------------------------- round trips
expect_ok "tp8pp2 -> tp4pp1 with --verify" "$RS" "$WORK/src" --from tp8pp2 --to tp4pp1 -o "$WORK/tp4" --verify
check "verify reported" grep -q "^verified: 208 tensors" "$WORK/.out"
check "summary line" grep -q "^resharded .* (tp8pp2) -> .* (tp4pp1)" "$WORK/.out"
check "the summary says the CPU was used for want of a GPU" grep -q "cpu: no CUDA device found, using the CPU" "$WORK/.out"
check "nothing on stderr" [ ! -s "$WORK/.err" ]
expect_ok "tp4pp1 -> tp8pp2" "$RS" "$WORK/tp4" --to tp8pp2 -o "$WORK/back"
expect_ok "the round trip is bit-exact" "$CK" diff "$WORK/src" "$WORK/back"
check "files identical in content to the source's" "$PY" -c '
import h5py, json, sys, numpy as np
a, b = sys.argv[1], sys.argv[2]
ia, ib = json.load(open(a + "/index.json")), json.load(open(b + "/index.json"))
for ta, tb in zip(ia["tensors"], ib["tensors"]):
    assert ta["name"] == tb["name"] and ta["digest"] == tb["digest"], ta["name"]
    for pa, pb in zip(ta["pieces"], tb["pieces"]):
        assert pa["checksum"] == pb["checksum"], (ta["name"], pa["file"])
' "$WORK/src" "$WORK/back"
expect_ok "tp8pp2 -> tp1pp1" "$RS" "$WORK/src" --to tp1pp1 -o "$WORK/merged"
expect_ok "merged equals the tp1pp1 synthesis" "$CK" diff "$WORK/merged" "$WORK/tp1"
expect_ok "independent h5py merge of the output equals the source's" \
    "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/tp4" --compare "$WORK/src" --synth-seed 9
expect_ok "GQA model tp4 -> tp2pp2 -> tp4" sh -c "'$CK' synth -o '$WORK/g' --tp 4 --pp 1 $GQA --optim --seed 3 >/dev/null &&
    '$RS' '$WORK/g' --to tp2pp2 -o '$WORK/g2' 2>/dev/null >/dev/null && '$RS' '$WORK/g2' --to tp4pp1 -o '$WORK/g4' 2>/dev/null >/dev/null &&
    '$CK' diff '$WORK/g' '$WORK/g4' >/dev/null"
expect_ok "h5py: GQA output equals its source" "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/g2" --compare "$WORK/g" --synth-seed 3
# Fewer key/value heads than ranks (a Llama with 1 KV head at tp4, 2 at tp8):
# each KV head replicated over the ranks sharing it, in and out of layouts
# where it is not; the digests prove every step, and the independent reader
# merges each layout to the tp1 synthesis and names a replica that differs.
LLAMA="--arch llama --layers 2 --dim 128 --heads 8 --ffn 96 --vocab 300 --seq 16 --optim --seed 5"
expect_ok "a Llama with 1 KV head at tp1" "$CK" synth -o "$WORK/kv1" --tp 1 --pp 1 $LLAMA --kv-heads 1
expect_ok "and at tp4: the KV head on every rank" "$CK" synth -o "$WORK/kv4" --tp 4 --pp 1 $LLAMA --kv-heads 1
expect_ok "tp-ckpt verify" "$CK" verify "$WORK/kv4"
expect_ok "tp-ckpt info" "$CK" info "$WORK/kv4"
check "each QKV piece holds 2 of 8 query heads and the shared KV head: [64, 128] x 4" \
    grep -q "attn.qkv.weight .*\[160, 128\] *\[256, 128\] .*(small segments replicated)" "$WORK/.out"
expect_ok "tp4 -> tp2pp2 -> tp8 -> tp1, each verified" sh -c "'$RS' '$WORK/kv4' --to tp2pp2 -o '$WORK/kv22' --verify &&
    '$RS' '$WORK/kv22' --to tp8pp1 -o '$WORK/kv8' --verify && '$RS' '$WORK/kv8' --to tp1pp1 -o '$WORK/kv1b' --verify"
expect_ok "the round trip equals the tp1 synthesis" "$CK" diff "$WORK/kv1b" "$WORK/kv1"
for d in kv4 kv8; do
    expect_ok "h5py: $d merges to the tp1 synthesis" "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/$d" --compare "$WORK/kv1"
done
expect_ok "a 2-KV-head Llama at tp8 and back" sh -c "'$CK' synth -o '$WORK/h2' --tp 1 --pp 1 $LLAMA --kv-heads 2 >/dev/null &&
    '$RS' '$WORK/h2' --to tp8 -o '$WORK/h2x8' --verify >/dev/null && '$RS' '$WORK/h2x8' --to tp2 -o '$WORK/h2x2' --verify >/dev/null &&
    '$CK' diff '$WORK/h2' '$WORK/h2x2' >/dev/null"
# A replica that differs from its primary copy: besides the checksums, the
# independent reader names the replica.
cp -r "$WORK/kv4" "$WORK/kv4bad"
"$PY" - "$WORK/kv4bad" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1] + "/shard_pp00_tp02.h5", "r+") as f:
    d = f["tensors/model/layers.1.attn.qkv.weight"]
    d[40, 3] = d[40, 3] + 1.0  # rows 32..47 of rank 2's piece [2 q heads | k | v]: its replica of the key head
PYEOF
run "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/kv4bad"
check "h5py: a changed replica is named" grep -q "layers.1.attn.qkv.weight: segment 1 granule 0: the replica on rank 2 differs" \
    "$WORK/.out"

# --------------------------------------------------------------- options
expect_ok "--dtype fp32 --no-optim --compress zstd --json" "$RS" "$WORK/src" --to tp2 -o "$WORK/export" --dtype fp32 \
    --no-optim --compress zstd:5 --json --verify
check "json summary" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["from"] == {"tp": 8, "pp": 2} and j["to"] == {"tp": 2, "pp": 2}, j
assert j["tensors"] == 52 and j["verified"] and j["bytes_written"] > 0 and j["peak_rss_bytes"] > 0, j
' "$WORK/.out"
run "$CK" info "$WORK/export" --json
check "parameters only, fp32, compressed" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert all(t["role"] == "param" and t["dtype"] == "fp32" for t in j["tensors"])
assert all(p["compressed"] for t in j["tensors"] for p in t["pieces"] if p["bytes"] > 4096)
assert j["model"]["dtype"] == "fp32" and j["user"]["reshard"]["from_tp"] == 8
' "$WORK/.out"
expect_ok "synth the parameters alone at tp1" "$CK" synth -o "$WORK/tp1-params" --tp 1 --pp 1 $MODEL --dtype bf16 --seed 9
expect_ok "bf16 -> fp32 is exact: diff against the source" "$CK" diff "$WORK/export" "$WORK/tp1-params"
expect_ok "synth fp32" "$CK" synth -o "$WORK/f32" --tp 2 --pp 1 $MODEL --optim --seed 4
expect_ok "--dtype bf16 with --verify (digests of the converted source)" "$RS" "$WORK/f32" --to tp4 -o "$WORK/b16" \
    --dtype bf16 --verify
expect_ok "h5py: the bf16 output holds the rounded synth values" "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/b16" \
    --synth-seed 4
expect_ok "--dry-run" "$RS" "$WORK/src" --to tp4pp1 -o "$WORK/dry" --dry-run
check "dry run writes nothing" [ ! -e "$WORK/dry" ]
check "dry run shows the plan" grep -q "read .* from the source" "$WORK/.out"
expect_ok "--dry-run --json" "$RS" "$WORK/src" --to tp4pp1 -o "$WORK/dry" --dry-run --json
check "plan as json" "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["files"] == 4 and j["bytes_read"] > 0' "$WORK/.out"
# A plan for an output the run would refuse is refused as the run (it
# printed the plan, exit 0).
mkdir "$WORK/occupied" && touch "$WORK/occupied/notes.txt"
expect_error "--dry-run onto an existing output: refused as without it" 1 "occupied exists already \(--force" \
    "$RS" "$WORK/src" --to tp4pp1 -o "$WORK/occupied" --dry-run
expect_error "--dry-run --force onto a directory that is no checkpoint: refused" 1 \
    "occupied holds 'notes.txt', which is not part of a checkpoint" \
    "$RS" "$WORK/src" --to tp4pp1 -o "$WORK/occupied" --dry-run --force
check "and nothing was touched" [ "$(ls "$WORK/occupied")" = notes.txt ]
expect_ok "--dry-run --force onto a checkpoint: its plan" "$RS" "$WORK/src" --to tp4pp1 -o "$WORK/b16" --dry-run --force
expect_ok "default output name" "$RS" "$WORK/src" --to tp2pp1
check "output beside the input, named after the layout" [ -f "$WORK/src_tp2pp1/index.json" ]
expect_ok "--progress draws a bar" "$RS" "$WORK/src" --to tp2pp2 -o "$WORK/p" --progress
check "progress bar on stderr" grep -q "reshard \[" "$WORK/.err"

# A run directory keeps its latest pointer. A reshard keeps its source's
# step (0 here): named for another step, it is refused before it is written.
mkdir -p "$WORK/run"
expect_error "reshard named for a step it does not record" 2 \
    "step_00000100 is named for step 100, but the checkpoint records step 0: .*name it .*run/step_00000000" \
    "$RS" "$WORK/src" --to tp4 -o "$WORK/run/step_00000100"
check "nothing written for it" [ ! -e "$WORK/run/step_00000100" ]
expect_ok "reshard into a run directory" "$RS" "$WORK/src" --to tp4 -o "$WORK/run/step_00000000"
check "latest points at it" [ "$(cat "$WORK/run/latest")" = "step_00000000" ]
# Another tool's checkpoint named step_N among the run's is not one of them:
# tp-train, reaching step N, stopped there ('holds __0_0.distcp, which is
# not part of a checkpoint'); written before (exit 0).
expect_error "a DCP named step_N in a run directory: refused, saying why" 2 \
    "/run is a run directory, where step_00000007 names one of the run's checkpoints, which a PyTorch distributed checkpoint is not" \
    "$RS" "$WORK/src" --to tp1 --format dcp -o "$WORK/run/step_00000007"
check "nothing written there" [ ! -e "$WORK/run/step_00000007" ]
# A run directory's default output is named after it, beside it: named
# after the step read (run/step_00000000_tp2pp2) it lay inside the input,
# where -o is refused.
expect_ok "a run directory resharded without -o" "$RS" "$WORK/run" --to tp2
check_all "its output beside the run directory, nothing added inside it" \
    '[ -f "$WORK/run_tp2pp2/index.json" ] && [ "$(ls "$WORK/run")" = "$(printf "latest\nstep_00000000")" ]'
# Named "run/." it is the same directory (the default was "run/._tp2pp2",
# refused as "the input itself").
rm -rf "$WORK/run_tp2pp2"
expect_ok "the run directory given as run/., without -o" "$RS" "$WORK/run/." --to tp2
check_all "its output beside the run directory again" \
    '[ -f "$WORK/run_tp2pp2/index.json" ] && [ "$(ls "$WORK/run")" = "$(printf "latest\nstep_00000000")" ]'

# ------------------------------------------------------- memory bound
expect_ok "a bigger checkpoint" "$CK" synth -o "$WORK/big" --tp 4 --pp 1 --layers 2 --dim 1024 --heads 8 --vocab 8000 \
    --seq 64 --optim --seed 1
if [ "${SANITIZED:-0}" = 1 ]; then
    # AddressSanitizer's shadow memory and quarantine are not ours to bound.
    echo "SKIP [$NAME] peak RSS within --memory-limit: not measurable under AddressSanitizer"
    expect_ok "reshard it with a memory limit" "$RS" "$WORK/big" --to tp2 -o "$WORK/big2" --memory-limit 512M
else
    expect_ok "reshard it within 64 MiB" "$RS" "$WORK/big" --to tp2 -o "$WORK/big2" --memory-limit 64M --json
    check "peak RSS within the limit" "$PY" -c '
import json, os, sys
j = json.load(open(sys.argv[1]))
size = sum(os.path.getsize(os.path.join(sys.argv[2], f)) for f in os.listdir(sys.argv[2]))
assert size > 2 * 64 * 2**20, size           # the checkpoint is far larger than the limit
assert j["peak_rss_bytes"] <= 64 * 2**20, j["peak_rss_bytes"]
' "$WORK/.out" "$WORK/big"
    # --verify reads the output back after the write: on more threads than
    # the limit leaves room for, it took 111 MB (this format) and 185 MB (DCP).
    for format in tp dcp; do
        rm -rf "$WORK/big3"
        expect_ok "reshard it as $format with --verify on 8 threads within 64 MiB" "$RS" "$WORK/big" --to tp2 \
            --format $format -o "$WORK/big3" --memory-limit 64M --threads 8 --verify --json
        check "peak RSS of the $format output's --verify within the limit" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["verified"], j
assert j["peak_rss_bytes"] <= 64 * 2**20, j["peak_rss_bytes"]
' "$WORK/.out"
    done
    rm -rf "$WORK/big3"
    # The allowance beside the buffers is the measured one (8 MiB and 4 a
    # thread, docs/BENCHMARKS.md): limits refused while it was 32 and 12
    # now write, and the peak stays within them (21, 31 and 36 MiB measured).
    for case in "tp2 32M" "tp2 48M" "tp8 48M"; do
        set -- $case
        rm -rf "$WORK/big3"
        expect_ok "reshard it to $1 on 8 threads within $2 (refused before)" "$RS" "$WORK/big" --to $1 -o "$WORK/big3" \
            --memory-limit $2 --threads 8 --json
        check "its peak RSS within $2" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["peak_rss_bytes"] <= int(sys.argv[2]) * 2**20, (j["peak_rss_bytes"], j["threads"])
' "$WORK/.out" "${2%M}"
    done
    # Another tool's checkpoint is read through a bounce buffer where a
    # slab's rows do not land whole (a column range of a DCP chunk, as a cut
    # along dimension 1 asks for): up to 8 MiB a thread that the plan did not
    # count. This DCP at tp1 to tp2 was admitted at 32M and peaked at 32.8
    # MiB; counted, it is refused there and fits in 40M.
    rm -rf "$WORK/bounce"*
    expect_ok "a checkpoint whose embedding is 16 MiB" "$CK" synth -o "$WORK/bounce" --tp 1 --pp 1 --layers 2 --dim 1024 \
        --heads 8 --vocab 4096 --seq 64
    expect_ok "written as a DCP" "$RS" "$WORK/bounce" --to tp1 --format dcp -o "$WORK/bounce.dcp"
    for limit in 32 40; do
        rm -rf "$WORK/bounce2"
        run "$RS" "$WORK/bounce.dcp" --to tp2 --format tp -o "$WORK/bounce2" --memory-limit ${limit}M --threads 8 --json
        if [ "$RC" -eq 2 ]; then
            check "the DCP to tp2 within ${limit}M refused: nothing written" [ ! -e "$WORK/bounce2" ]
        else
            check "the DCP to tp2 within ${limit}M: exit 0 or 2" [ "$RC" -eq 0 ]
            check "its peak RSS within ${limit}M, the bounce buffer included" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["peak_rss_bytes"] <= int(sys.argv[2]) * 2**20, (j["peak_rss_bytes"], j["threads"])
' "$WORK/.out" "$limit"
        fi
    done
    check "the DCP to tp2 admitted within 40M" [ "$RC" -eq 0 ]
    # A converted tensor's --verify reads its source again, slab by slab,
    # through the bounce buffer of the source's boxes (a DCP at tp2: its
    # column-split chunks), which the read-back's need left out: admitted
    # at 100M on 8 threads, it peaked at 104.5 MiB; counted, 64 MiB.
    expect_ok "written as a DCP at tp2" "$RS" "$WORK/bounce" --to tp2 --format dcp -o "$WORK/bounce.dcp2"
    rm -rf "$WORK/bounce2"
    expect_ok "the DCP at tp2 -> tp1 --dtype bf16 --verify on 8 threads within 100M" "$RS" "$WORK/bounce.dcp2" \
        --format tp --to tp1 --dtype bf16 --verify --threads 8 --memory-limit 100M -o "$WORK/bounce2" --json
    check "its peak RSS, the source's bounce buffer in the verify included, within 100M" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["verified"] and j["peak_rss_bytes"] <= 100 * 2**20, j["peak_rss_bytes"]' "$WORK/.out"
    rm -rf "$WORK/bounce"*
    rm -rf "$WORK/big3"
    expect_ok "--verify on 8 threads within 48M (refused before; 35 MiB measured)" "$RS" "$WORK/big" --to tp2 \
        -o "$WORK/big3" --memory-limit 48M --threads 8 --verify --json
    check "its peak RSS, the verify's included, within 48M" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["verified"] and j["peak_rss_bytes"] <= 48 * 2**20, j["peak_rss_bytes"]' "$WORK/.out"
    rm -rf "$WORK/big3"
    # The write fits in 40M, reading it back does not: refused before
    # anything is written (it went on to 35 MiB within the limit of 32M).
    expect_error "--verify within 40M: refused for the read-back (a usage error)" 2 \
        "memory limit of 40.00 MiB is too small: one thread needs at least [0-9.]+ MiB: --verify, reading the output back in slabs: 16.00 MiB of buffers" \
        "$RS" "$WORK/big" --to tp2 -o "$WORK/big3" --memory-limit 40M --verify
    check "nothing written" [ ! -e "$WORK/big3" ]
    # A DCP output at tp1 is read back whole tensor by tensor, each chunk a
    # box of whole rows: no bounce buffer. Counted with 8 MiB of bounce all
    # the same (24 MiB a thread), it was refused at 48M (31 MiB measured);
    # at tp2 the column-split tensors' chunks are narrower than their rows
    # and still take it.
    expect_ok "a DCP output at tp1 with --verify on 8 threads within 48M (refused before)" "$RS" "$WORK/big" \
        --to tp1 --format dcp -o "$WORK/big3" --memory-limit 48M --threads 8 --verify --json
    check "its peak RSS, the verify's included, within 48M" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["verified"] and j["peak_rss_bytes"] <= 48 * 2**20, j["peak_rss_bytes"]' "$WORK/.out"
    expect_ok "tp-ckpt verify of it on 8 threads within 48M (refused before)" "$CK" verify "$WORK/big3" --threads 8 \
        --memory-limit 48M
    check "its peak memory within 48M" "$PY" "$ROOT/tests/support/peak_within.py" "$WORK/.out" 48
    rm -rf "$WORK/big3"
    expect_error "a DCP output at tp2 with --verify within 48M: refused, its narrow chunks bounced" 2 \
        "memory limit of 48.00 MiB is too small: one thread needs at least [0-9.]+ MiB: --verify, reading the output back in slabs: 24.00 MiB of buffers" \
        "$RS" "$WORK/big" --to tp2 --format dcp -o "$WORK/big3" --memory-limit 48M --verify
    check "nothing written" [ ! -e "$WORK/big3" ]
    # tp-ckpt verify within --memory-limit: 72 MiB on 8 threads unbounded.
    # (Its own peak, said under --memory-limit: a Python parent's rusage of
    # its children counts the Python it was spawned from.)
    expect_ok "tp-ckpt verify on 8 threads within 48M" "$CK" verify "$WORK/big" --threads 8 --memory-limit 48M
    check "its peak memory within 48M" "$PY" "$ROOT/tests/support/peak_within.py" "$WORK/.out" 48
    # A thread reads its largest piece whole up to 16 MiB: big's are 8 MiB
    # (the embedding at tp4), so that is what a thread is given.
    expect_error "tp-ckpt verify within 24M: refused (a usage error)" 2 \
        "^tp-ckpt: error: memory limit of 24.00 MiB is too small: one thread needs at least [0-9.]+ MiB: verify, reading in slabs: 8.00 MiB of buffers, beside the [0-9.]+ MiB this process holds now and 12.00 MiB set aside" \
        "$CK" verify "$WORK/big" --memory-limit 24M
    # A small checkpoint's threads are given what its pieces need, not 16
    # MiB each (a 1.7 MB checkpoint was refused below 42M): ours, as a DCP
    # and as Megatron-LM's, each verified on 8 threads within 28M.
    expect_ok "a small checkpoint" "$CK" synth -o "$WORK/small" --tp 2 --pp 1 --model tiny --optim --seed 3
    expect_ok "written as a DCP" "$RS" "$WORK/small" --to tp2 --format dcp -o "$WORK/small_dcp"
    expect_ok "written as Megatron-LM's" "$RS" "$WORK/small" --to tp2 --format megatron --no-optim -o "$WORK/small_meg"
    for small in small small_dcp small_meg; do
        expect_ok "tp-ckpt verify $small on 8 threads within 28M (refused before)" "$CK" verify "$WORK/$small" \
            --threads 8 --memory-limit 28M
        check "its peak memory within 28M" "$PY" "$ROOT/tests/support/peak_within.py" "$WORK/.out" 28
    done
    # So does tp-reshard --verify, from the output's pieces as planned: a
    # small output was refused below 42M (16 MiB a thread); 16 MiB measured
    # (this format's), 14 (a DCP's).
    for format in tp dcp; do
        rm -rf "$WORK/small1"
        expect_ok "tp-reshard --verify of a small $format output on 8 threads within 28M (refused before)" "$RS" \
            "$WORK/small" --to tp1 --format $format -o "$WORK/small1" --threads 8 --memory-limit 28M --verify --json
        check "its peak RSS, the verify's included, within 28M" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["verified"] and j["peak_rss_bytes"] <= 28 * 2**20, j["peak_rss_bytes"]' "$WORK/.out"
    done
    # A converted output's verify digests the source's slab converted beside
    # the piece it reads (16 + 24 MiB a thread here): counted as 16, it was
    # admitted at 64M and peaked at 72 MiB; now refused there, within 80M.
    rm -rf "$WORK/big3"
    expect_error "--dtype bf16 --verify within 64M: refused for the read-back" 2 \
        "memory limit of 64.00 MiB is too small: one thread needs at least [0-9.]+ MiB: --verify, reading the output back in slabs: 40.00 MiB of buffers" \
        "$RS" "$WORK/big" --to tp2 --dtype bf16 -o "$WORK/big3" --memory-limit 64M --threads 8 --verify
    check "nothing written" [ ! -e "$WORK/big3" ]
    expect_ok "--dtype bf16 --verify on 8 threads within 80M" "$RS" "$WORK/big" --to tp2 --dtype bf16 -o "$WORK/big3" \
        --memory-limit 80M --threads 8 --verify --json
    check "its peak RSS, the verify's included, within 80M" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["verified"] and j["peak_rss_bytes"] <= 80 * 2**20, j["peak_rss_bytes"]' "$WORK/.out"
    rm -rf "$WORK/big3" "$WORK/small1"
    rm -rf "$WORK/small" "$WORK/small_dcp" "$WORK/small_meg"
fi
expect_ok "and it is right" "$CK" diff "$WORK/big" "$WORK/big2"
if [ "${SANITIZED:-0}" = 1 ]; then
    echo "SKIP [$NAME] peak RSS of diff on 8 threads: not measurable under AddressSanitizer"
else
    # diff compares in slabs of 1 MiB a side: of 16 MiB, this one (545 MB,
    # 208 tensors, 8 threads) peaked at about 500 MB resident; now about 90.
    expect_ok "a checkpoint of 545 MB" "$CK" synth -o "$WORK/rss" --tp 4 --pp 1 --layers 4 --dim 768 --heads 8 \
        --vocab 16000 --dtype bf16 --seq 64 --optim --seed 1
    check "diff on 8 threads within 200 MiB resident" "$PY" -c '
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
assert peak <= 200 * 2**20, peak
' "$CK" diff "$WORK/rss" "$WORK/rss" --threads 8
    rm -rf "$WORK/rss"
fi

# ------------------------------------------------------------ bad input
expect_error "--from mismatch" 1 "--from tp4 does not match .* which is tp8pp2" "$RS" "$WORK/src" --from tp4 --to tp2 -o "$WORK/x1"
check "nothing written on a --from mismatch" [ ! -e "$WORK/x1" ]
expect_ok "synth 12 heads" "$CK" synth -o "$WORK/h12" --tp 2 --pp 1 --layers 6 --dim 96 --heads 12 --vocab 50 --seq 8
expect_error "heads not divisible by the target tp" 1 "model/layers.0.attn.qkv.weight: segment 0 .* not divisible by tp=8" \
    "$RS" "$WORK/h12" --to tp8 -o "$WORK/x2"
check "no output directory for an impossible target" [ ! -e "$WORK/x2" ]
expect_error "layers not divisible by the target pp" 1 "6 layers cannot be split evenly over pp=4" \
    "$RS" "$WORK/h12" --to pp4 -o "$WORK/x3"
BEFORE=$(tree_digest "$WORK/tp4")
expect_error "existing output without --force" 1 "already exists.*--force" "$RS" "$WORK/src" --to tp4 -o "$WORK/tp4"
check "the existing output is untouched" [ "$(tree_digest "$WORK/tp4")" = "$BEFORE" ]
expect_ok "--force replaces it" "$RS" "$WORK/src" --to tp4 -o "$WORK/tp4" --force
# An output never lies inside its input, nor holds it (--force would replace
# the input): refused at once, exit 2, naming both, nothing written.
BEFORE=$(tree_digest "$WORK/tp4")
expect_error "an output inside its input" 2 "the output .*/tp4/sub lies inside the input .*/tp4: an output is never written" \
    "$RS" "$WORK/tp4" --to tp2 -o "$WORK/tp4/sub"
expect_error "an output inside its input, with --force and a path through .." 2 "lies inside the input" \
    "$RS" "$WORK/tp4" --to tp2 -o "$WORK/tp4/../tp4/sub" --force
ln -s "$WORK/tp4" "$WORK/tp4.link"
expect_error "an output inside its input, through a symbolic link" 2 "the output .*/tp4.link/sub lies inside the input .*/tp4" \
    "$RS" "$WORK/tp4" --to tp2 -o "$WORK/tp4.link/sub"
rm "$WORK/tp4.link"
expect_error "the output is the input" 2 "the output .*/tp4 is the input .*/tp4 itself" \
    "$RS" "$WORK/tp4" --to tp2 -o "$WORK/tp4" --force
check_all "the source is left as it was, with no stray entry" \
    '[ "$(tree_digest "$WORK/tp4")" = "$BEFORE" ] && [ -z "$(ls -A "$WORK/tp4" | grep -v "^index.json$\|^shard_")" ]'
# A source named after its layout, resharded to that layout without -o: the
# default output is the input (it suggested --force, which then failed).
cp -r "$WORK/tp4" "$WORK/m_tp4pp2"
expect_error "the default output is the input: a usage error asking for -o" 2 \
    "the default output, .*/m_tp4pp2, is the input itself \\(named after tp4pp2 already\\): give -o OUT" \
    "$RS" "$WORK/m_tp4pp2" --to tp4 --force
expect_ok "--force over the earlier output still works after these" "$RS" "$WORK/src" --to tp4 -o "$WORK/tp4" --force
mkdir "$WORK/holder"
expect_ok "an output in a directory" "$RS" "$WORK/src" --to tp2 -o "$WORK/holder/tp2"
expect_error "an input inside the output --force would replace" 2 \
    "the input .*/holder/tp2 lies inside the output .*/holder, which --force would replace" \
    "$RS" "$WORK/holder/tp2" --to tp4 -o "$WORK/holder" --force
check "the input is left" test -s "$WORK/holder/tp2/index.json"
# A live writer holds a lock on its staging directory; a dead one's is free.
mkdir -p "$WORK/.busy.hostA-1-00000001.staging" "$WORK/.gone.hostA-2-00000002.staging"
flock "$WORK/.busy.hostA-1-00000001.staging" sleep 60 &
LOCKER=$!
sleep 0.3
expect_error "an input being written" 1 "still being written" "$RS" "$WORK/.busy.hostA-1-00000001.staging" --to tp2 -o "$WORK/x4"
expect_error "an input whose write is in progress" 1 "still being written" "$RS" "$WORK/busy" --to tp2 -o "$WORK/x4"
expect_error "a dead writer's leftover is no checkpoint in progress" 1 "no such checkpoint" "$RS" "$WORK/gone" --to tp2 -o "$WORK/x4"
kill "$LOCKER" 2>/dev/null
wait "$LOCKER" 2>/dev/null
cp -r "$WORK/src" "$WORK/bad"
SHARD="$WORK/bad/shard_pp01_tp05.h5"
flip_byte "$SHARD" $(( $(data_offset "$SHARD" "optim/exp_avg/layers.3.mlp.fc.weight") + 64 ))
expect_error "a corrupted input shard" 1 "shard_pp01_tp05.h5: tensor optim/exp_avg/layers.3.mlp.fc.weight piece 5" \
    "$RS" "$WORK/bad" --to tp4 -o "$WORK/x5"
check "no output from a corrupted input" [ ! -e "$WORK/x5" ]
check "no staging left from a failed reshard" [ ! -e "$WORK/.x5.staging" ]
expect_error "not a checkpoint" 1 "is not a checkpoint" "$RS" "$WORK/run/.." --to tp2 -o "$WORK/x6"
cp -r "$WORK/src" "$WORK/missing" && rm "$WORK/missing/shard_pp00_tp03.h5"
expect_error "a missing input shard" 1 "shard_pp00_tp03.h5: shard file missing" "$RS" "$WORK/missing" --to tp4 -o "$WORK/x9"
cp -r "$WORK/src" "$WORK/short" && truncate -s -1000 "$WORK/short/shard_pp01_tp02.h5"
expect_error "a truncated input shard" 1 "shard_pp01_tp02.h5: .*truncated" "$RS" "$WORK/short" --to tp4 -o "$WORK/x9"
cp -r "$WORK/src" "$WORK/newer" && sed -i 's/"format_version":\t\[1, [0-9]*\]/"format_version":\t[2, 0]/' "$WORK/newer/index.json"
expect_error "an input of a future format" 1 "version 2.0 is newer than this build reads" "$RS" "$WORK/newer" --to tp4 -o "$WORK/x9"
check "no output from bad inputs" [ ! -e "$WORK/x9" ]

# Killed mid-run (SIGKILL, at the last moment before the output would appear): nothing visible.
TP_CKPT_FAULT=before-rename "$RS" "$WORK/src" --to tp4 -o "$WORK/killed" >/dev/null 2>&1
check "a reshard killed before its commit exits by SIGKILL" [ $? -eq 137 ]
check "and leaves no output" [ ! -e "$WORK/killed" ]
expect_ok "running it again succeeds" "$RS" "$WORK/src" --to tp4 -o "$WORK/killed"
expect_error "--device cuda without a GPU" 1 "--device cuda: (no CUDA device is available|this build has no CUDA support)" \
    "$RS" "$WORK/src" --to tp4 -o "$WORK/x7" --device cuda
expect_error "bad --to" 2 "layout 'tp0' not understood" "$RS" "$WORK/src" --to tp0
expect_error "missing --to" 2 "--to is required" "$RS" "$WORK/src"
expect_error "bad memory limit" 2 "--memory-limit expects" "$RS" "$WORK/src" --to tp2 --memory-limit lots
expect_error "memory limit too small: a usage error, as tp-ckpt's" 2 "memory limit of 1.00 MiB is too small: one thread needs at least [0-9.]+ MiB: tensor (model|optim)/[^ ?]+ \(one checksum block per slab\): [0-9.]+ [KM]iB of buffers, beside the [0-9.]+ MiB this process holds now and (12|40).00 MiB set aside for the checkpoint library( writing zstd)? \(.*an allowance, not a measure\); raise --memory-limit" "$RS" "$WORK/src" --to tp2 -o "$WORK/x8" --memory-limit 1M
expect_error "tp-ckpt export: a memory limit too small, a usage error too" 2 \
    "^tp-ckpt: error: memory limit of 1.00 MiB is too small: one thread needs at least [0-9.]+ MiB: a row of tensor [^ ]+ and a page of slack: .*raise --memory-limit" \
    "$CK" export "$WORK/src" --format hdf5 -o "$WORK/x8.h5" --memory-limit 1M
check "nothing exported" [ ! -e "$WORK/x8.h5" ]
expect_ok "--help" "$RS" --help

# A file system that refuses the first byte (a full disk; here a file-size
# limit of 0, its signal ignored): HDF5's own reason is reported, for a
# shard file and for a whole-model HDF5 (it was "no detail from HDF5": the
# error stack was read after another HDF5 call had cleared it).
expect_ok "a checkpoint to write out" "$CK" synth -o "$WORK/full-src" --tp 1 --pp 1 --model tiny
# The limit is the command's alone: its stderr goes through a pipe to the test's file.
NO_FILE_BYTES='trap "" XFSZ; (ulimit -f 0; exec "$@") 2>&1 | cat >&2; exit "${PIPESTATUS[0]}"'
expect_error "a shard file that cannot be written: HDF5's reason" 1 "shard_pp00_tp00.h5: cannot create shard file: file write failed: File too large" \
    bash -c "$NO_FILE_BYTES" bash "$RS" "$WORK/full-src" --to tp1 -o "$WORK/full-out"
expect_error "an HDF5 export that cannot be written: HDF5's reason" 1 "cannot create: file write failed: File too large" \
    bash -c "$NO_FILE_BYTES" bash "$CK" export "$WORK/full-src" --format hdf5 -o "$WORK/full.h5"
# The foreign writers name the file once (it was "F: tensor T: F: cannot write").
for format in megatron dcp torch_dist; do
    run bash -c "$NO_FILE_BYTES" bash "$RS" "$WORK/full-src" --to tp1 --format $format -o "$WORK/full-out"
    check_all "--format $format to a file that cannot be written: exit 1, its file named once" '[ "$RC" -eq 1 ] &&
        grep -Eq "^tp-reshard: error: [^ ]*(model_optim_rng.pt|__0_0.distcp): (tensor [^ ]*: )?cannot write: File too large$" "$WORK/.err"'
done
check "nothing left of either" [ -z "$(ls -A "$WORK" | grep full-out)$(ls -A "$WORK" | grep full.h5)" ]

finish
