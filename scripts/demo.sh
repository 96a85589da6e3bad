#!/bin/sh
# make demo: the main job end to end, on a GPT-2 124M-shaped checkpoint.
#   1. synthesize it at tp4pp2 with bf16 weights and full Adam state
#   2. inspect it, verify every checksum
#   3. reshard it to tp2pp1 and back, each proven equal to its source
#   4. synthesize the same model at tp1pp1 and prove it logically equal
#   5. damage one byte of a copy and watch verify name the tensor
#   6. train a small GPT on this repository's docs at tp2pp2 (4 ranks), stop
#      half-way with a checkpoint, resume at tp1pp1dp2 (resharded on load)
#   7. evaluate it at two layouts, export it for Hugging Face and llama.cpp
#      (checked by an independent reader and PyTorch), import it back, and
#      let it write some text
#   8. the elastic story: tp-elastic trains at 4 ranks (tp2pp2), loses a rank
#      and continues at the layout the planner picks for 3, grows back to 4,
#      finishes, exports the merged weights and draws the run's report
#   9. a Megatron-LM checkpoint written by PyTorch, resharded as Megatron's
#      and checked by torch.load against PyTorch's own tensors
#  10. a Llama (RMSNorm, rotary positions, SwiGLU, one key/value head shared
#      by four query heads, untied output) trained at tp2pp2 with its key/value
#      head replicated on both tensor ranks, resumed at tp1dp2, exported for
#      Hugging Face and llama.cpp (checked), and writing
#  11. PyTorch distributed checkpoints: the Llama written as DCP that
#      PyTorch's own DCP loads whole and sharded; a Megatron-Core torch_dist
#      checkpoint read and written as a legacy Megatron one (checked)
# Output goes to demo-run/ (ignored by git), or to DEMO_OUT (tests/e2e/test_demo.sh).
set -eu
cd "$(dirname "$0")/.."
BIN=${BUILD:-build}/bin
OUT=${DEMO_OUT:-demo-run}
# The Python of the checks: Debian's, with torch, h5py and numpy; TP_PYTHON
# names another (tests/e2e/test_demo.sh's, which forks each from one that
# imported them once).
PY=${TP_PYTHON:-/usr/bin/python3}
MODEL="--layers 12 --dim 768 --heads 12 --vocab 50257 --seq 1024 --vocab-pad-multiple 128 --dtype bf16 --optim --seed 2024"
rm -rf "$OUT"
mkdir -p "$OUT/run"
say() { printf '\n== %s\n' "$*"; }

say "1. synthesize a GPT-2 124M checkpoint at tp4pp2 (bf16 weights, fp32 master + Adam moments)"
"$BIN/tp-ckpt" synth -o "$OUT/run/step_00001000" --tp 4 --pp 2 $MODEL --step 1000

say "2. inspect and verify it (the run directory resolves through its 'latest' pointer)"
"$BIN/tp-ckpt" info "$OUT/run" | head -16
echo "   ..."
"$BIN/tp-ckpt" verify "$OUT/run"

say "3. reshard to tp2pp1 and back to tp4pp2, verifying each against its source"
"$BIN/tp-reshard" "$OUT/run" --from tp4pp2 --to tp2pp1 -o "$OUT/tp2pp1" --verify
"$BIN/tp-reshard" "$OUT/tp2pp1" --to tp4pp2 -o "$OUT/back" --verify
"$BIN/tp-ckpt" diff "$OUT/run" "$OUT/back"

say "4. the same model synthesized at tp1pp1: logically identical, bit for bit"
"$BIN/tp-ckpt" synth -o "$OUT/tp1pp1" --tp 1 --pp 1 $MODEL --step 1000
"$BIN/tp-ckpt" diff "$OUT/run" "$OUT/tp1pp1"

say "5. flip one byte in a copy: verify names the damaged tensor and file"
cp -r "$OUT/run/step_00001000" "$OUT/damaged"
SHARD="$OUT/damaged/shard_pp01_tp02.h5"
OFFSET=$("$PY" -c 'import h5py, sys; print(h5py.File(sys.argv[1], "r")["tensors/model/layers.9.mlp.fc.weight"].id.get_offset())' "$SHARD")
"$PY" -c 'import sys
f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 1]))' "$SHARD" $((OFFSET + 4096))
if "$BIN/tp-ckpt" verify "$OUT/damaged"; then
    echo "demo: verify missed the damage" >&2
    exit 1
fi
say "6. train a GPT on the docs at tp2pp2 (4 ranks), stop at step 40 with a checkpoint"
cat docs/*.md README.md >"$OUT/text.txt"
"$BIN/tp-train" prepare "$OUT/text.txt" -o "$OUT/text.bin"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Plain shared memory between ranks: containers often forbid cross-process copies.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# The ranks' shared-memory segments under demo-run/ rather than /dev/shm: a
# rank killed in step 12 leaves its segment, which goes with the next demo's
# rm -rf instead of piling up in /dev/shm.
mkdir -p "$OUT/shm"
export OMPI_MCA_btl_vader_backing_directory="$(pwd)/$OUT/shm"
TRAIN="--layers 4 --dim 128 --heads 4 --vocab 256 --seq 64 --steps 80 --lr 3e-3 --data $OUT/text.bin --ckpt-dir $OUT/train --ckpt-every 20"
mpirun --oversubscribe -np 4 "$BIN/tp-train" $TRAIN --tp 2 --pp 2 --micro-batch 4 --grad-accum 2 --stop-at 40 </dev/null |
    awk 'NR <= 3 || /step +(10|20|30|40)\/|stopped|done/'
"$BIN/tp-ckpt" verify "$OUT/train"

say "7. resume at tp1pp1dp2 (2 ranks): each rank reads just its pieces of the tp2pp2 checkpoint"
mpirun --oversubscribe -np 2 "$BIN/tp-train" $TRAIN --dp 2 --micro-batch 4 --resume </dev/null |
    awk 'NR <= 3 || /step +(41|50|60|70|80)\/|done/'

say "8. evaluate the trained model at tp2pp2 and as one process, on the first 40 windows of the text"
"$BIN/tp-train" eval --ckpt "$OUT/train" --data "$OUT/text.bin" --windows 40
mpirun --oversubscribe -np 4 "$BIN/tp-train" eval --ckpt "$OUT/train" --data "$OUT/text.bin" --windows 40 --tp 2 --pp 2 </dev/null
LOSS=$("$BIN/tp-train" eval --ckpt "$OUT/train" --data "$OUT/text.bin" --windows 40 --json |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')

say "9. export for Hugging Face and llama.cpp; an independent parser and PyTorch check them"
"$BIN/tp-ckpt" export "$OUT/train" --format safetensors -o "$OUT/hf"
"$BIN/tp-ckpt" export "$OUT/train" --format gguf --dtype bf16 -o "$OUT/model.gguf"
ls -l "$OUT/hf" "$OUT/model.gguf" | sed 's/^/   /'
"$PY" tests/trainer/check_export.py safetensors "$OUT/hf" "$OUT/train" --data "$OUT/text.bin" --windows 40 \
    --seq 64 --loss "$LOSS" 2>/dev/null
"$PY" tests/trainer/check_export.py gguf "$OUT/model.gguf" "$OUT/train"
# llama.cpp itself runs the GGUF (its library through node-llama-cpp, which
# make deps installs): the same loss, but for the bf16 rounding of the weights.
judged=77
if command -v node >/dev/null 2>&1; then
    judged=0
    node tests/trainer/llama_cpp.mjs loss "$OUT/model.gguf" "$OUT/text.bin" --windows 40 --seq 64 \
        >"$OUT/llama-loss.json" 2>"$OUT/llama.err" || judged=$?
fi
case $judged in
0) "$PY" -c 'import json, sys
ours, theirs = float(sys.argv[2]), json.load(open(sys.argv[1]))["loss"]
print("   llama.cpp computes a loss of %.6f from the bf16 GGUF; tp-train eval %.6f from the checkpoint (%.1e apart)"
      % (theirs, ours, abs(theirs - ours) / ours))
sys.exit(abs(theirs - ours) > 2e-3 * ours)' "$OUT/llama-loss.json" "$LOSS" ;;
77) echo "   (llama.cpp's own run skipped: $(tail -n 1 "$OUT/llama.err" 2>/dev/null || echo "Node.js is not installed"))" ;;
*) cat "$OUT/llama.err" >&2; echo "demo: llama.cpp could not run the GGUF" >&2; exit 1 ;;
esac

say "10. import the Hugging Face directory at tp4pp2: bit-exact against the trained weights"
"$BIN/tp-ckpt" import "$OUT/hf" -o "$OUT/imported" --tp 4 --pp 2
"$BIN/tp-reshard" "$OUT/train" --to tp4pp2 --no-optim -o "$OUT/weights" >/dev/null
"$BIN/tp-ckpt" diff "$OUT/imported" "$OUT/weights"

say "11. the model writes (after 80 steps on these docs: letters and spaces in plausible proportions, little more)"
"$BIN/tp-train" generate --ckpt "$OUT/train" --prompt "The checkpoint " --tokens 160 --seed 1

say "12. tp-elastic: train at 4 ranks, lose one (kill -9 at step 30), continue at the layout the planner picks for 3,"
echo "    grow back to 4 (capacity returns at step 45), finish at 90; losses continue as if nothing had happened"
echo 4 >"$OUT/world"
ELASTIC_TRAIN="--layers 4 --dim 128 --heads 4 --vocab 256 --seq 64 --steps 90 --lr 3e-3 --data $OUT/text.bin --ckpt-every 10"
(
    # Capacity follows the story: 3 ranks once the rank is lost, 4 again at
    # step 45 (tp-elastic looks at capacity once a second: on a fast machine
    # the 45 steps left are still a second or more).
    while [ ! -e "$OUT/lost-a-rank" ]; do sleep 0.05; done
    echo 3 >"$OUT/world"
    while ! grep -q '"step":45,' "$OUT/elastic/elastic/train.jsonl" 2>/dev/null; do sleep 0.05; done
    echo 4 >"$OUT/world"
) &
WATCHER=$!
"$BIN/tp-elastic" run --ckpt-dir "$OUT/elastic" --world-file "$OUT/world" --backoff 0.5 --heartbeat-timeout 30 \
    -- "$BIN/tp-train" $ELASTIC_TRAIN --global-batch 12 --micro-batch 4 --quiet \
    --fault die --fault-step 30 --fault-rank 1 --fault-once "$OUT/lost-a-rank" |
    "$PY" -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("tp-elastic: {"):
        print("   " + line, end="")
        continue
    e = json.loads(line[len("tp-elastic: "):])
    name = e["event"]
    if name == "launch":
        l = e["layout"]
        print("   launch: %d ranks as tp%d pp%d dp%d, micro-batch %d x %d accumulation = global batch %d"
              % (l["ranks"], l["tp"], l["pp"], l["dp"], l["micro_batch"], l["grad_accum"], l["global_batch"]))
    elif name in ("failure", "hang"):
        print("   %s at step %d: %s" % (name, e["step"], e["status"]))
    elif name == "scale_change":
        print("   capacity %d -> %d ranks at step %d: checkpoint and relaunch" % (e["from_world"], e["to_world"], e["step"]))
    elif name == "checkpoint_chosen":
        print("   resume from %s (verified in %.2f s)" % (e["path"], e["seconds"]))
    elif name == "reshard":
        print("   resharded tp%dpp%d -> tp%dpp%d at load in %.2f s" % (e["from_tp"], e["from_pp"], e["to_tp"], e["to_pp"], e["seconds"]))
'
kill $WATCHER 2>/dev/null || true
"$BIN/tp-elastic" report "$OUT/elastic" -o "$OUT/elastic-report.svg"
"$BIN/tp-ckpt" export "$OUT/elastic" --format safetensors -o "$OUT/elastic-hf"
echo "   merged weights: $OUT/elastic-hf; the report's picture: $OUT/elastic-report.svg"

say "13. a Megatron-LM checkpoint (tp4pp2 with its Adam state, written by PyTorch in Megatron's structure): resharded"
echo "    to tp2 as Megatron's, proven equal, loaded back by torch.load and merged against PyTorch's unsharded state,"
echo "    and exported for llama.cpp"
if "$PY" -c 'import torch' 2>/dev/null; then
    "$PY" tests/support/megatron_fixture.py "$OUT/megatron" --tp 4 --pp 2 --layers 8 --hidden 256 --heads 8 \
        --ffn 1024 --vocab 1000 --make-vocab-size-divisible-by 64 --optimizer --full "$OUT/megatron-full.pt" >/dev/null
    "$BIN/tp-ckpt" info "$OUT/megatron" | head -7
    "$BIN/tp-reshard" "$OUT/megatron" --from tp4pp2 --to tp2pp1 -o "$OUT/megatron-tp2" --verify
    "$PY" tests/support/megatron_fixture.py --verify "$OUT/megatron-tp2" --full "$OUT/megatron-full.pt"
    echo "   exported for llama.cpp (its true 1000-token vocabulary), and the GGUF's weights computing the rank files' logits:"
    "$BIN/tp-ckpt" export "$OUT/megatron-tp2" --format gguf --true-vocab-size 1000 -o "$OUT/megatron.gguf"
    "$PY" tests/support/megatron_fixture.py --logits "$OUT/megatron" "$OUT/megatron.gguf"
else
    echo "   skipped: python3-torch is not installed (make deps installs it)"
fi

say "14. a Llama (RMSNorm, rotary positions, SwiGLU, 4 query heads sharing 1 key/value head, untied output):"
echo "    trained at tp2pp2 with its key/value head replicated on both tensor ranks, resumed at tp1dp2,"
echo "    exported for Hugging Face and llama.cpp (checked), and writing"
LLAMA="--arch llama --layers 4 --dim 128 --heads 4 --kv-heads 1 --ffn 352 --vocab 256 --seq 64 --steps 80 --lr 3e-3 \
--data $OUT/text.bin --ckpt-dir $OUT/llama --ckpt-every 20"
mpirun --oversubscribe -np 4 "$BIN/tp-train" $LLAMA --tp 2 --pp 2 --micro-batch 4 --grad-accum 2 --stop-at 40 </dev/null |
    awk 'NR <= 3 || /step +(10|20|30|40)\/|stopped|done/'
"$BIN/tp-ckpt" info "$OUT/llama" | grep "^model/layers.0.attn.qkv.weight"
mpirun --oversubscribe -np 2 "$BIN/tp-train" $LLAMA --dp 2 --micro-batch 4 --resume </dev/null |
    awk 'NR <= 3 || /step +(41|60|80)\/|done/'
LLAMA_LOSS=$("$BIN/tp-train" eval --ckpt "$OUT/llama" --data "$OUT/text.bin" --windows 40 --json |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
"$BIN/tp-ckpt" export "$OUT/llama" --format safetensors -o "$OUT/llama-hf"
"$BIN/tp-ckpt" export "$OUT/llama" --format gguf --dtype bf16 -o "$OUT/llama.gguf"
if "$PY" -c 'import torch, h5py' 2>/dev/null; then
    "$PY" tests/trainer/check_export.py safetensors "$OUT/llama-hf" "$OUT/llama" --data "$OUT/text.bin" \
        --windows 40 --seq 64 --loss "$LLAMA_LOSS"
    "$PY" tests/trainer/check_export.py gguf "$OUT/llama.gguf" "$OUT/llama"
fi
"$BIN/tp-train" generate --ckpt "$OUT/llama" --prompt "The checkpoint " --tokens 160 --seed 1

say "15. PyTorch distributed checkpoints: the Llama written as DCP at tp2pp2, which PyTorch's own"
echo "    torch.distributed.checkpoint loads whole and sharded over 2 ranks; a Megatron-Core torch_dist checkpoint read"
echo "    (its stacked layers one tensor each) and written as a legacy Megatron one, checked against the model"
if "$PY" -c 'import torch, h5py' 2>/dev/null; then
    DIALECT=$("$PY" -c 'import torch.distributed.checkpoint' 2>/dev/null && echo 2 || echo 1.13)
    "$BIN/tp-reshard" "$OUT/llama" --format dcp --dcp-torch "$DIALECT" --to tp2pp2 -o "$OUT/llama-dcp" --verify
    "$PY" tests/formats/dcp_torch.py compare-ckpt "$OUT/llama-dcp" "$OUT/llama" --ranks 2 --described 2>/dev/null
    "$PY" tests/support/megatron_dist_fixture.py "$OUT/torch-dist" --names core --tp 2 --pp 2 --layers 8 \
        --hidden 256 --heads 8 --ffn 1024 --vocab 1000 --make-vocab-size-divisible-by 64 --dtype bf16 --swiglu \
        --full "$OUT/torch-dist-full.pt" >/dev/null 2>&1
    "$BIN/tp-ckpt" info "$OUT/torch-dist" | head -4
    "$BIN/tp-reshard" "$OUT/torch-dist" --format megatron --to tp4pp1 -o "$OUT/torch-dist-legacy" --verify
    "$PY" tests/support/megatron_fixture.py --verify "$OUT/torch-dist-legacy" --full "$OUT/torch-dist-full.pt"
else
    echo "   skipped: python3-torch is not installed (make deps installs it)"
fi

say "demo done: checkpoints and exports are in $OUT/"
