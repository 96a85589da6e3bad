#!/bin/sh
# Checkpoints that Megatron-Core itself wrote (tests/data/megatron-core/
# README.md): releases 0.18.2 (the common state in common.pt) and 0.20.0
# (since 0.19, the checkpoint's own common_state entry), GPT-2-like in fp32
# and a Llama-like one in bf16 with fp32 norms and masters, at tp2pp1 and
# tp2pp2. The judge is what Megatron-Core's ranks held in memory before the
# save (reference.json: digests of every tensor under Megatron-Core's key),
# compared through the independent reader check_h5py.py with every output
# of this project's format; the DCP outputs are loaded by PyTorch's own DCP
# where python3-torch is installed.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
JUDGE="$ROOT/tests/support/mcore_reference.py"

. "$ROOT/tests/support/mcore_fixtures.sh"

# judge WHICH CKPT WHAT: every tensor of CKPT bit-identical to Megatron-Core's own.
judge() {
    expect_ok "$3: every tensor bit-identical to what Megatron-Core's ranks held" "$PY" "$JUDGE" compare \
        "$DATA/reference.json" "$1" "$2"
}

for which in mcore-0.18/gpt_tp2pp1 mcore-0.18/gpt_tp2pp2 mcore-0.20/gpt_tp2pp1 mcore-0.20/llama_tp2pp1; do
    release=${which%/*} name=${which#*/}
    src="$WORK/$release/ckpt/$name"
    out="$WORK/$release-$name"
    saved=${name#*_}
    case $release in
        mcore-0.18) common="common state in common.pt: up to 0.18" ;;
        *) common="common state in its common_state entry: 0.19+" ;;
    esac
    expect_ok "$which: info" "$CK" info "$src"
    check_all "$which: info names the common state's place and the saved layout" \
        'grep -q "Megatron-Core torch_dist, checkpoint_version 3.0, core names, $common)" "$WORK/.out" &&
         grep -q "^saved at     tp=2 pp=${saved#tp2pp}" "$WORK/.out" && grep -q "^iteration    10$" "$WORK/.out"'
    expect_ok "$which: verify" "$CK" verify "$src"

    expect_ok "$which -> this format at tp1" "$RS" "$src" --format tp --to tp1 -o "$out.tp1"
    check "$which: the summary names the layout it was saved at" grep -q "($saved) -> " "$WORK/.out"
    judge "$which" "$out.tp1" "$which at tp1"
    expect_ok "$which -> this format at tp4pp2, verified" "$RS" "$src" --format tp --to tp4pp2 -o "$out.tp4pp2" --verify
    judge "$which" "$out.tp4pp2" "$which at tp4pp2"

    expect_ok "$which -> DCP at tp2pp2, verified" "$RS" "$src" --format dcp --dcp-torch $DIALECT --to tp2pp2 \
        -o "$out.dcp" --verify
    expect_ok "$which: the DCP output equals the tp1 output" "$CK" diff "$out.tp1" "$out.dcp"
    expect_ok "$which: the DCP output read back to this format" "$RS" "$out.dcp" --format tp --to tp2 -o "$out.dcp.tp"
    judge "$which" "$out.dcp.tp" "$which through DCP"
    if [ $TORCH -eq 1 ]; then
        run "$PY" "$ROOT/tests/formats/dcp_torch.py" compare-ckpt "$out.dcp" "$out.tp1"
        if [ "$RC" -eq 77 ]; then
            echo "[SKIP] [$NAME] $which: this PyTorch has no distributed checkpoint module"
        else
            check "$which: PyTorch's DCP load of the DCP output gives the same bits (exit $RC)" [ "$RC" -eq 0 ]
        fi
    fi

    expect_ok "$which -> legacy Megatron-LM at tp1pp2, weights only, verified" "$RS" "$src" --format megatron \
        --weights-only --to tp1pp2 -o "$out.legacy" --verify
    expect_ok "$which: the legacy output's weights equal the tp1 output's" "$CK" diff --weights-only "$out.tp1" \
        "$out.legacy"
done

# --true-vocab-size: the checkpoints' tables hold 256 rows, the tokens' 250
# and Megatron's padding for tp2 (make_vocab_size_divisible_by 128 x 2).
# Told the true size, the reader leaves the padding out: the tables are
# the tokens' rows of what Megatron-Core's ranks held (the judge's digests
# of them, from save.json's true_vocab), and a torch_dist output pads them
# again as Megatron pads for its tp (512 rows at tp4, which the stored 256
# do not allow).
for which in mcore-0.18/gpt_tp2pp2 mcore-0.20/llama_tp2pp1; do
    release=${which%/*} name=${which#*/}
    src="$WORK/$release/ckpt/$name"
    out="$WORK/$release-$name"
    expect_ok "$which -> this format at tp1 with --true-vocab-size 250, verified" "$RS" "$src" --format tp --to tp1 \
        --true-vocab-size 250 -o "$out.true" --verify
    expect_ok "$which: every tensor Megatron-Core's, the vocabulary's tables their 250 tokens' rows" "$PY" "$JUDGE" \
        compare "$DATA/reference.json" "$which" "$out.true" --true-vocab
    expect_error "$which -> torch_dist at tp4 without it: refused, naming the padding and the option" 1 \
        "the padded vocabulary of 256 rows is not a multiple of 128 x tp 4.*--true-vocab-size" "$RS" "$src" --to tp4pp1 \
        -o "$WORK/never"
    expect_ok "$which -> torch_dist at tp4 with --true-vocab-size 250, verified" "$RS" "$src" --to tp4pp1 \
        --true-vocab-size 250 -o "$out.td4" --verify
    expect_ok "its info" "$CK" info "$out.td4"
    check "its tables padded again for tp4: 512 rows" grep -q "vocabulary 512 (padded)" "$WORK/.out"
    "$PY" "$ROOT/tests/support/mcore_metadata.py" common "$out.td4/iter_0000010" >"$WORK/td4.common"
    check "its args say so (padded_vocab_size 512)" grep -q "'padded_vocab_size': 512" "$WORK/td4.common"
    expect_ok "$which: the tp4 output read at tp1 with --true-vocab-size 250" "$RS" "$out.td4" --format tp --to tp1 \
        --true-vocab-size 250 -o "$out.td4.true"
    expect_ok "$which: Megatron-Core's tokens' rows again" "$PY" "$JUDGE" compare "$DATA/reference.json" "$which" \
        "$out.td4.true" --true-vocab
done
run "$PY" "$JUDGE" compare "$DATA/reference.json" mcore-0.18/gpt_tp2pp2 "$WORK/mcore-0.18-gpt_tp2pp2.tp1" --true-vocab
check_all "the judge can fail: the padded tables are not the tokens' rows (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "^embedding.word_embeddings.weight: fp32 \[256, 64\], Megatron-Core.s .* holds fp32 \[250, 64\]" "$WORK/.out"'
expect_error "a true vocabulary that does not pad to the stored rows: refused, naming both" 1 \
    "gpt_tp2pp2/iter_0000010: a vocabulary of 300 tokens is padded to 512 rows for tp 2 \(a multiple of 128 x 2\); the checkpoint has 256" \
    "$RS" "$WORK/mcore-0.18/ckpt/gpt_tp2pp2" --to tp1 --true-vocab-size 300 -o "$WORK/never"
check "nothing written for the refused runs" test ! -e "$WORK/never"

# The legacy output's names by default: the source's modules, which its
# args.transformer_impl says (torch_dist keys a local model's layers under
# Transformer Engine's names too). The real checkpoints were made with
# local modules: their legacy rank files name input_layernorm and
# pre_mlp_layernorm, no Transformer Engine key (linear_qkv.layer_norm_weight,
# core_attention._extra_state), and keep transformer_impl 'local' (they
# were written under Transformer Engine's names, transformer_impl changed
# to match); --megatron-names core still writes those.
if [ $TORCH -eq 1 ]; then
    # modules CKPT IMPL: CKPT's rank file names the modules of IMPL, and its args say IMPL.
    modules() {
        "$PY" - "$ROOT/tests/support" "$1" "$2" <<'PYEOF'
import glob, os, sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
path = sorted(glob.glob(os.path.join(sys.argv[2], "iter_*", "mp_rank_*", "model_optim_rng.pt")))[0]
sd = torch.load(path, map_location="cpu", weights_only=False)
keys = list(sd["model"]) if "model" in sd else [k for m in sd if m.startswith("model") for k in sd[m]]
te = [k for k in keys if "layer_norm_weight" in k or "core_attention._extra_state" in k]
local = [k for k in keys if "input_layernorm" in k or "pre_mlp_layernorm" in k]
impl, want = sd["args"].transformer_impl, sys.argv[3]
if impl != want:
    sys.exit("%s: args.transformer_impl is %r, expected %r" % (path, impl, want))
if want == "local" and (te or not local):
    sys.exit("%s: Transformer Engine's keys %s, local ones %s" % (path, te[:2], local[:2]))
if want == "transformer_engine" and (local or not te):
    sys.exit("%s: local keys %s, Transformer Engine's %s" % (path, local[:2], te[:2]))
PYEOF
    }
    for which in mcore-0.18/gpt_tp2pp1 mcore-0.18/gpt_tp2pp2 mcore-0.20/gpt_tp2pp1 mcore-0.20/llama_tp2pp1; do
        release=${which%/*} name=${which#*/}
        impl=$("$PY" "$ROOT/tests/support/mcore_metadata.py" common "$WORK/$release/ckpt/$name/iter_0000010" |
            sed -n "s/.*'transformer_impl': '\([a-z_]*\)'.*/\1/p")
        check "$which: its args say its modules ($impl)" [ "$impl" = local ]
        expect_ok "$which -> legacy: the rank files name the local modules, args.transformer_impl local" modules \
            "$WORK/$release-$name.legacy" local
    done
    expect_ok "mcore-0.20/llama_tp2pp1 -> legacy, names not given" "$RS" "$WORK/mcore-0.20/ckpt/llama_tp2pp1" --to tp1 \
        --format megatron --no-optim -o "$WORK/llama.legacy.default"
    check "the summary says core-local names" grep -q "(Megatron-LM tp1pp1, core-local names)" "$WORK/.out"
    expect_ok "its rank file names the local modules" modules "$WORK/llama.legacy.default" local
    expect_ok "with --megatron-names core: Transformer Engine's" "$RS" "$WORK/mcore-0.20/ckpt/llama_tp2pp1" --to tp1 \
        --format megatron --no-optim --megatron-names core -o "$WORK/llama.legacy.te"
    expect_ok "its rank file names Transformer Engine's modules, args.transformer_impl transformer_engine" modules \
        "$WORK/llama.legacy.te" transformer_engine
    expect_ok "both hold the same tensors" "$CK" diff "$WORK/llama.legacy.default" "$WORK/llama.legacy.te"
fi

# A legacy output carries the torch_dist source's args (its common state's,
# 102 fields: tokenizer_type, seed, vocab_file, data_parallel_size,
# rotary_base... which Megatron's checkpoint loaders and
# check_checkpoint_args read), changed only where the output differs: its
# layout, world_size for it (the same data-parallel size), the legacy
# format (ckpt_format torch, use_dist_ckpt false), what the rank files hold
# (weights only, no RNG state: no_save_optim, no_save_rng). It wrote 36 fields
# made from the model. The work done (num_floating_point_operations_so_far)
# goes along too. Loaded by torch 1.13 with megatron_fixture's stand-ins,
# both sides; every rank file.
if [ $TORCH -eq 1 ]; then
    # args_carried SRC_ITER OUT KEY=VALUE...: OUT's args are SRC's but for the KEYs (Python literals).
    args_carried() {
        "$PY" - "$ROOT/tests/support" "$@" <<'PYEOF'
import ast, glob, io, math, os, sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_fixture, mcore_metadata
megatron_fixture.install_megatron_stubs()
src_dir, out_dir = sys.argv[2], sys.argv[3]
changed = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
common = os.path.join(src_dir, "common.pt")
data = open(common, "rb").read() if os.path.exists(common) else \
    mcore_metadata.bytes_item(src_dir, "common_state/shard_0_1")
state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
state = state if os.path.exists(common) else state[0]
src = vars(state["args"])
same = lambda a, b: a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
files = sorted(glob.glob(os.path.join(out_dir, "iter_*", "mp_rank_*", "model_optim_rng.pt")))
problems = [] if files else ["no rank files in %s" % out_dir]
for path in files:
    sd = torch.load(path, map_location="cpu", weights_only=False)
    if sd.get("num_floating_point_operations_so_far") != state["num_floating_point_operations_so_far"]:
        problems.append("%s: num_floating_point_operations_so_far %r, the source's %r" % (
            path, sd.get("num_floating_point_operations_so_far"), state["num_floating_point_operations_so_far"]))
    out = vars(sd["args"])
    for key in sorted(set(src) | set(out)):
        want = changed[key] if key in changed else src.get(key, "<absent>")
        got = out.get(key, "<absent>")
        if not same(got, want):
            problems.append("%s: args.%s is %r, expected %r (the source's: %r)" % (path, key, got, want, src.get(key)))
if problems:
    sys.exit("\n".join(problems[:8]))
print("%d rank files, each with the source's %d args but %s" % (len(files), len(src), sorted(changed)))
PYEOF
    }
    G182="$WORK/mcore-0.18/ckpt/gpt_tp2pp2"
    LEGACY_ARGS="ckpt_format='torch' use_dist_ckpt=False no_save_optim=True no_save_rng=True"
    expect_ok "0.18 GPT tp2pp2 -> legacy at its own layout, weights only" "$RS" "$G182" --to tp2pp2 --format megatron \
        --no-optim -o "$WORK/g182.legacy"
    expect_ok "every rank file carries the source's 102 args, as a legacy checkpoint" args_carried \
        "$G182/iter_0000010" "$WORK/g182.legacy" $LEGACY_ARGS
    check "it says so" grep -q "each with the source's 102 args" "$WORK/.out"
    expect_ok "and at tp1pp2 (the loop's output): its layout and world_size changed too" args_carried \
        "$G182/iter_0000010" "$WORK/mcore-0.18-gpt_tp2pp2.legacy" $LEGACY_ARGS tensor_model_parallel_size=1 world_size=2
    expect_ok "the 0.20 Llama's common_state entry alike, at tp1pp2" args_carried \
        "$WORK/mcore-0.20/ckpt/llama_tp2pp1/iter_0000010" "$WORK/mcore-0.20-llama_tp2pp1.legacy" $LEGACY_ARGS \
        tensor_model_parallel_size=1 pipeline_model_parallel_size=2 world_size=2
    run args_carried "$G182/iter_0000010" "$WORK/g182.legacy"
    check "the judge can fail: ckpt_format is not the source's" grep -q "args.ckpt_format is 'torch', expected 'torch_dist'" \
        "$WORK/.err"
fi

# --dtype, --compress and --device cuda convert, compress and run on a GPU
# in this toolkit's format only: with another output each was ignored (exit
# 0, "verified", the output still fp32), and is refused now, naming the
# option and the format (docs/TOOLS.md: an option that would be ignored is
# refused); the values that say what such a writer does pass.
GPT20="$WORK/mcore-0.20/ckpt/gpt_tp2pp1"
expect_error "torch_dist -> torch_dist --dtype bf16 --verify: a usage error, not an fp32 output" 2 \
    "^tp-reshard: --dtype bf16 applies to this toolkit's format \(--format tp\): a Megatron-Core torch_dist output \(--format torch_dist\) keeps the source's dtypes" \
    "$RS" "$GPT20" --to tp1 --format torch_dist --dtype bf16 --verify -o "$WORK/never"
expect_error "the default output (torch_dist) alike" 2 "^tp-reshard: --dtype fp16 applies to this toolkit's format" \
    "$RS" "$GPT20" --to tp1 --dtype fp16 -o "$WORK/never"
for format in torch_dist dcp megatron; do
    expect_error "--format $format --dtype bf16: refused" 2 "^tp-reshard: --dtype bf16 applies to .* \(--format $format\)" \
        "$RS" "$GPT20" --to tp1 --format $format --weights-only --dtype bf16 -o "$WORK/never"
    expect_error "--format $format --compress zstd:5: refused" 2 \
        "^tp-reshard: --compress zstd:5 applies to .* \(--format $format\) is not compressed" \
        "$RS" "$GPT20" --to tp1 --format $format --weights-only --compress zstd:5 -o "$WORK/never"
    expect_error "--format $format --device cuda: refused" 2 \
        "^tp-reshard: --device cuda applies to .* \(--format $format\) is written on the CPU" \
        "$RS" "$GPT20" --to tp1 --format $format --weights-only --device cuda -o "$WORK/never"
    expect_ok "--format $format --dtype keep --compress none --device cpu: what it does anyway" "$RS" "$GPT20" --to tp1 \
        --format $format --weights-only --dtype keep --compress none --device cpu -o "$WORK/kept.$format" --verify
done
check "nothing written for the refused runs" test ! -e "$WORK/never"
expect_ok "this toolkit's format converts: --dtype bf16 --compress zstd" "$RS" "$GPT20" --to tp1 --format tp --dtype bf16 \
    --compress zstd -o "$WORK/gpt20.bf16" --verify
expect_ok "info of it" "$CK" info "$WORK/gpt20.bf16"
check "its weights are bf16" grep -Eq "^layers.0.attention.qkv.weight +bf16 " "$WORK/.out"

# Exports straight from torch_dist (no conversion first), for Hugging Face
# and llama.cpp: each computes the logits Megatron's formula computes from
# the legacy conversion of the same checkpoint (megatron_fixture.py's
# judge: its own GPT-2 and Llama of Hugging Face's semantics, llama.cpp's
# rotary row order undone), and says the layout the checkpoint was saved
# at. The Llama's norms stay fp32 beside its bf16 weights unless --dtype.
if [ $TORCH -eq 1 ]; then
    for which in mcore-0.18/gpt_tp2pp2 mcore-0.20/gpt_tp2pp1 mcore-0.20/llama_tp2pp1; do
        release=${which%/*} name=${which#*/}
        out="$WORK/$release-$name"
        expect_ok "$which: Hugging Face export straight from torch_dist" "$CK" export "$WORK/$release/ckpt/$name" \
            --format safetensors -o "$out.hf"
        check "$which: its summary names the layout it was saved at" grep -q "(step 10, ${name#*_}) to " "$WORK/.out"
        expect_ok "$which: the export computes Megatron's logits of the same checkpoint" "$PY" \
            "$ROOT/tests/support/megatron_fixture.py" --logits "$out.legacy" "$out.hf"
        expect_ok "$which: GGUF export straight from torch_dist" "$CK" export "$WORK/$release/ckpt/$name" \
            --format gguf -o "$out.gguf"
        expect_ok "$which: the GGUF computes Megatron's logits too" "$PY" "$ROOT/tests/support/megatron_fixture.py" \
            --logits "$out.legacy" "$out.gguf"
        # At the true vocabulary: the tokens' 250 logits of the 256.
        expect_ok "$which: Hugging Face export with --true-vocab-size 250" "$CK" export "$WORK/$release/ckpt/$name" \
            --format safetensors --true-vocab-size 250 -o "$out.hf250"
        check "$which: its config says 250 tokens" "$PY" -c 'import json, sys
sys.exit(json.load(open(sys.argv[1]))["vocab_size"] != 250)' "$out.hf250/config.json"
        expect_ok "$which: it computes Megatron's logits of those tokens" "$PY" "$ROOT/tests/support/megatron_fixture.py" \
            --logits "$out.legacy" "$out.hf250"
        expect_ok "$which: GGUF export with --true-vocab-size 250" "$CK" export "$WORK/$release/ckpt/$name" \
            --format gguf --true-vocab-size 250 -o "$out.250.gguf"
        expect_ok "$which: it computes them too" "$PY" "$ROOT/tests/support/megatron_fixture.py" --logits "$out.legacy" \
            "$out.250.gguf"
    done
    run "$PY" "$ROOT/tests/support/megatron_fixture.py" --logits "$WORK/mcore-0.20-llama_tp2pp1.legacy" \
        "$WORK/mcore-0.20-gpt_tp2pp1.hf"
    check "the judge can fail: the GPT's export does not compute the Llama's logits (exit $RC)" [ "$RC" -eq 1 ]
    header() { "$PY" -c 'import json, struct, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
print(" ".join(sorted("%s=%s" % (k, v["dtype"]) for k, v in h.items() if k != "__metadata__")))' "$1"; }
    header "$WORK/mcore-0.20-llama_tp2pp1.hf/model.safetensors" >"$WORK/dtypes"
    check_all "the mixed Llama exported mixed: its norms fp32, its matrices bf16, as stored" \
        'grep -q "model.layers.0.input_layernorm.weight=F32" "$WORK/dtypes" &&
         grep -q "model.norm.weight=F32" "$WORK/dtypes" && grep -q "model.layers.3.mlp.down_proj.weight=BF16" "$WORK/dtypes" &&
         grep -q "model.embed_tokens.weight=BF16" "$WORK/dtypes" && grep -q "lm_head.weight=BF16" "$WORK/dtypes"'
    expect_ok "with --dtype fp32: every tensor fp32" "$CK" export "$WORK/mcore-0.20/ckpt/llama_tp2pp1" --format safetensors \
        --dtype fp32 -o "$WORK/llama.fp32.hf"
    header "$WORK/llama.fp32.hf/model.safetensors" >"$WORK/dtypes"
    check "and no other" sh -c '! grep -q "BF16" "$1" && grep -q "model.layers.0.mlp.up_proj.weight=F32" "$1"' sh "$WORK/dtypes"
    expect_ok "which computes the same logits" "$PY" "$ROOT/tests/support/megatron_fixture.py" --logits \
        "$WORK/mcore-0.20-llama_tp2pp1.legacy" "$WORK/llama.fp32.hf"
fi
expect_error "a plain DCP checkpoint names no model to export" 1 "a PyTorch distributed checkpoint that names no model of this toolkit" \
    "$CK" export "$ROOT/tests/data/dcp/cols2" --format safetensors -o "$WORK/never"
check "nothing written for it" test ! -e "$WORK/never"
expect_ok "synth (tiny)" "$CK" synth -o "$WORK/tiny" --tp 1 --pp 1 --model tiny
expect_ok "its DCP" "$RS" "$WORK/tiny" --format dcp --to tp2 -o "$WORK/tiny.dcp"
expect_ok "a DCP checkpoint tp-reshard wrote from this toolkit's model exports straight" "$CK" export "$WORK/tiny.dcp" \
    --format safetensors -o "$WORK/tiny.dcp.hf"
expect_ok "the export of its source" "$CK" export "$WORK/tiny" --format safetensors -o "$WORK/tiny.hf"
expect_ok "the same file" cmp "$WORK/tiny.dcp.hf/model.safetensors" "$WORK/tiny.hf/model.safetensors"

# Imported into this toolkit's model: the Llama's fp32 norms have no
# master in Megatron (a parameter kept in fp32 is its own); they are
# rounded to the model's bf16, said, and kept in fp32 as its masters.
mkdir -p "$WORK/run"
expect_ok "the real Llama imported into a run directory at tp2" "$CK" import "$WORK/mcore-0.20/ckpt/llama_tp2pp1" \
    -o "$WORK/run/step_00000010" --tp 2 --pp 1
check "the rounding said" grep -q "^note: 9 parameters stored in fp32 beside bf16 ones (the norms) are bf16" "$WORK/.out"
expect_ok "the GPT imported (the exact GELU refused for training; its export is the way)" "$CK" info \
    "$WORK/run/step_00000010"
check "its step is the iteration" grep -q "step 10\|step         10" "$WORK/.out"
# Imported at its 250 tokens: the model's vocabulary is the tokenizer's, and
# its export holds the tensors of the torch_dist checkpoint's own export at
# that size (both in bf16: the import rounds the fp32 norms).
LLAMA20="$WORK/mcore-0.20/ckpt/llama_tp2pp1"
expect_ok "the real Llama imported with --true-vocab-size 250" "$CK" import "$LLAMA20" -o "$WORK/llama250" --tp 2 --pp 1 \
    --true-vocab-size 250
expect_ok "its info" "$CK" info "$WORK/llama250"
check "its model has 250 tokens, padded as Megatron pads" grep -q '"vocab":250,.*"vocab_pad_multiple":128' "$WORK/.out"
expect_ok "its export in bf16" "$CK" export "$WORK/llama250" --format safetensors --dtype bf16 -o "$WORK/llama250.hf"
expect_ok "the torch_dist checkpoint's own export at 250 tokens in bf16" "$CK" export "$LLAMA20" --format safetensors \
    --dtype bf16 --true-vocab-size 250 -o "$WORK/llama250.direct.hf"
same_tensors() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, struct, sys
def tensors(path):
    raw = open(path + "/model.safetensors", "rb").read()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    return {k: (v["dtype"], v["shape"], raw[8 + size + v["data_offsets"][0]:8 + size + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
sys.exit("tensors that differ: %s" % differ[:8] if differ else 0)
PYEOF
}
expect_ok "the same tensors" same_tensors "$WORK/llama250.hf" "$WORK/llama250.direct.hf"
run same_tensors "$WORK/llama250.hf" "$WORK/mcore-0.20-llama_tp2pp1.hf250"
check_all "the judge can fail: not the fp32 export's (its norms fp32; exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "model.layers.0.input_layernorm.weight" "$WORK/.err"'

# The judge can fail: the GPT's tensors are not the Llama's.
run "$PY" "$JUDGE" compare "$DATA/reference.json" mcore-0.20/llama_tp2pp1 "$WORK/mcore-0.20-gpt_tp2pp1.tp1"
check_all "the judge refuses another model's tensors (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "output_layer.weight (Megatron-Core.s output_layer.weight): missing" "$WORK/.out"'
# Refusals, in one line naming what is missing.
cp -r "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" "$WORK/moved"
rm "$WORK/moved/iter_0000010/.metadata"
expect_error "a 0.19+ checkpoint without .metadata: refused, naming it" 1 "moved/iter_0000010/.metadata: cannot open: No such file or directory" \
    "$CK" info "$WORK/moved"
cp -r "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" "$WORK/nocommon"
sed 's/common_state/commoX_state/g' "$WORK/mcore-0.20/ckpt/gpt_tp2pp1/iter_0000010/.metadata" \
    >"$WORK/nocommon/iter_0000010/.metadata"
expect_error "neither common.pt nor a common_state entry: refused, naming both" 1 \
    "neither common.pt nor a bytes entry common_state/shard_0_1: the model's args are not known" "$CK" info "$WORK/nocommon"

# common.pt (0.18) with one byte of its pickle changed where the pickle
# stays valid ('openai_gelu': False read as another value): its CRC-32, as
# zipfile's testzip computes it, no longer matches. verify names the file,
# the entry and both CRC-32s; every reader refuses it rather than read the
# altered model.
cp -r "$WORK/mcore-0.18/ckpt/gpt_tp2pp1" "$WORK/badcommon"
"$PY" - "$WORK/badcommon/iter_0000010/common.pt" <<'PYEOF'
import sys, zipfile
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[data.find(b"openai_gelu") + 13] = 0x88
open(path, "wb").write(data)
assert zipfile.ZipFile(path).testzip() == "common/data.pkl", "zipfile does not see the damage"
PYEOF
BADCRC="badcommon/iter_0000010/common.pt: entry common/data.pkl: its [0-9]+ bytes have CRC-32 [0-9a-f]{8}, the archive records [0-9a-f]{8}"
expect_error "a damaged common.pt: verify names it, the entry and both CRC-32s" 1 "$BADCRC" "$CK" verify "$WORK/badcommon"
expect_error "a damaged common.pt: diff refuses it" 1 "$BADCRC" "$CK" diff "$WORK/mcore-0.18/ckpt/gpt_tp2pp1" \
    "$WORK/badcommon"
expect_error "a damaged common.pt: export refuses it" 1 "$BADCRC" "$CK" export "$WORK/badcommon" --format safetensors \
    -o "$WORK/badcommon.st"
expect_error "a damaged common.pt: import refuses it" 1 "$BADCRC" "$CK" import "$WORK/badcommon" --tp 1 --pp 1 \
    -o "$WORK/badcommon.import"
expect_error "a damaged common.pt: tp-reshard refuses it" 1 "$BADCRC" "$RS" "$WORK/badcommon" --to tp1 \
    -o "$WORK/badcommon.td"
check_all "a damaged common.pt: nothing written" '[ ! -e "$WORK/badcommon.st" ] && [ ! -e "$WORK/badcommon.import" ] &&
    [ ! -e "$WORK/badcommon.td" ]'
# A flipped bit in common.pt's one tensor, which the model does not read:
# verify checks every entry of common.pt too, and a writer that carries the
# tensor over refuses it, naming common.pt first.
cp -r "$WORK/mcore-0.18/ckpt/gpt_tp2pp1" "$WORK/badtensor"
"$PY" - "$WORK/badtensor/iter_0000010/common.pt" <<'PYEOF'
import struct, sys, zipfile
path = sys.argv[1]
info = zipfile.ZipFile(path).getinfo("common/data/0")
data = bytearray(open(path, "rb").read())
name_size, extra_size = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
data[info.header_offset + 30 + name_size + extra_size] ^= 1
open(path, "wb").write(data)
assert zipfile.ZipFile(path).testzip() == "common/data/0", "zipfile does not see the damage"
PYEOF
expect_ok "verify of the undamaged 0.18 checkpoint says common.pt was checked" "$CK" verify \
    "$WORK/mcore-0.18/ckpt/gpt_tp2pp1"
check "it says so" grep -q "match their CRC-32s, and the common state's (common.pt);" "$WORK/.out"
expect_error "a flipped bit in common.pt's tensor: verify names it" 1 \
    "^tp-ckpt: error: $WORK/badtensor/iter_0000010/common.pt: entry common/data/0: its 4 bytes have CRC-32" \
    "$CK" verify "$WORK/badtensor"
expect_error "a flipped bit in common.pt's tensor: carrying it over refuses it, common.pt first" 1 \
    "^tp-reshard: error: $WORK/badtensor/iter_0000010/common.pt: entry common/data/0: its 4 bytes have CRC-32" \
    "$RS" "$WORK/badtensor" --to tp1 -o "$WORK/badtensor.td"
check "nothing written" [ ! -e "$WORK/badtensor.td" ]

# torch_dist written as this toolkit's format keeps Megatron's names and
# its QKV's row order: no model of tp-train's. Said when written; tp-train
# and export refuse it naming the reason and the conversion that makes one
# (before: "model config: 'layers' missing").
mkdir "$WORK/mrun"
expect_ok "torch_dist -> this format in a run directory" "$RS" "$WORK/mcore-0.18/ckpt/gpt_tp2pp1" --format tp \
    --to tp1pp1 -o "$WORK/mrun/step_00000010"
check "it says the output names no model, and what converts one for tp-train" grep -q \
    "^note: .*mrun/step_00000010 names no model: .*; tp-ckpt import converts a Megatron checkpoint for tp-train" \
    "$WORK/.out"
seq 1 400 | tr '\n' ' ' >"$WORK/text.txt"
expect_ok "tokens to evaluate on" "$BIN/tp-train" prepare "$WORK/text.txt" -o "$WORK/tokens.bin"
expect_error "tp-train eval refuses it, saying it names no model" 1 \
    "mrun/step_00000010: names no model \(its model configuration is \{\}\).*tp-ckpt import converts" \
    "$BIN/tp-train" eval --ckpt "$WORK/mrun" --data "$WORK/tokens.bin" --windows 2
expect_error "tp-ckpt export too" 1 "mrun/step_00000010: names no model" "$CK" export "$WORK/mrun/step_00000010" \
    --format safetensors -o "$WORK/mrun.st"
finish
