#!/bin/sh
# tp-reshard --format torch_dist: Megatron-Core torch_dist checkpoints
# written (docs/MEGATRON.md "Writing"), judged against checkpoints that
# Megatron-Core itself wrote (tests/data/megatron-core: 0.18.2 with
# common.pt, 0.20.0 with the common_state entry, a GPT-2-like model in fp32
# at tp2pp1 and tp2pp2, a Llama-like one in bf16 with fp32 norms):
# - written again at their own layout, each describes in its .metadata the
#   same entries as Megatron-Core's (keys, dtypes, global shapes, chunks,
#   the bytes entries and what they hold), the same metadata.json and the
#   same common state (tests/support/mcore_metadata.py, standard library
#   only); a 0.20 checkpoint written for 0.18 equals the real 0.18 one of
#   the same tensors, and the tp2pp1 one written at tp2pp2 the real tp2pp2
#   one but for its RNG states (args.no_save_rng);
# - at other layouts, read back bit for bit (tp-ckpt diff), to this
#   toolkit's format bit-identical to what Megatron-Core's ranks held
#   (mcore_reference.py), and loaded by PyTorch's own DCP
#   (mcore_dcp_judge.py, in the 1.13 dialect that Debian's PyTorch reads);
# - from other sources: a legacy Megatron-LM checkpoint (its optimizer's
#   groups and step made the common state), this toolkit's GPT and Llama
#   (imported back bit for bit), a DCP of them; refusals in one line.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
META="$ROOT/tests/support/mcore_metadata.py"
JUDGE="$ROOT/tests/support/mcore_reference.py"
DCP_JUDGE="$ROOT/tests/support/mcore_dcp_judge.py"
LEGACY="$ROOT/tests/support/megatron_fixture.py"
DIST="$ROOT/tests/support/megatron_dist_fixture.py"

. "$ROOT/tests/support/mcore_fixtures.sh"
REFERENCE="$DATA/reference.json"
real() { echo "$WORK/$1/ckpt/$2/iter_0000010"; }

# ------------------------------------------- the real ones, at their layout
for which in mcore-0.18/gpt_tp2pp1 mcore-0.18/gpt_tp2pp2 mcore-0.20/gpt_tp2pp1 mcore-0.20/llama_tp2pp1; do
    release=${which%/*} name=${which#*/}
    src="$WORK/$release/ckpt/$name"
    out="$WORK/$release-$name.td"
    layout=${name#*_}
    expect_ok "$which -> torch_dist at its own layout ($layout, Megatron-Core ${release#mcore-}), verified" "$RS" "$src" \
        --format torch_dist --megatron-core "${release#mcore-}" --to "$layout" -o "$out" --verify
    check "the summary names the form of the common state" grep -q "$(case $release in
        mcore-0.18) echo 'common.pt: Megatron-Core up to 0.18' ;; *) echo 'the common_state entry: Megatron-Core 0.19+' ;; esac)" \
        "$WORK/.out"
    expect_ok "$which: the same entries, chunks, bytes entries, metadata.json and common state as Megatron-Core's own" \
        "$PY" "$META" compare "$(real "$release" "$name")" "$out/iter_0000010"
    expect_ok "$which: read back bit for bit" "$CK" diff "$src" "$out"
done
check "the 0.20 form has no common.pt" [ ! -e "$WORK/mcore-0.20-gpt_tp2pp1.td/iter_0000010/common.pt" ]
check "the 0.18 form has one" [ -e "$WORK/mcore-0.18-gpt_tp2pp1.td/iter_0000010/common.pt" ]

# The same tensors, saved by both releases: each written in the other's form
# is the other's checkpoint, but for where it was saved and the RNG states
# (each run's own).
expect_ok "0.20's GPT written for 0.18" "$RS" "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --format torch_dist --megatron-core 0.18 \
    --to tp2pp1 -o "$WORK/to018"
expect_ok "equals 0.18.2's own checkpoint (common.pt, metadata.json with common_backend)" "$PY" "$META" compare \
    "$(real mcore-0.18 gpt_tp2pp1)" "$WORK/to018/iter_0000010" --ignore common.args.save --leave-out rng_state/
expect_ok "0.18's GPT written for 0.20" "$RS" "$WORK/mcore-0.18/ckpt/gpt_tp2pp1" --format torch_dist --megatron-core 0.20.0 \
    --to tp2pp1 -o "$WORK/to020"
expect_ok "equals 0.20.0's own checkpoint (the common_state entry)" "$PY" "$META" compare "$(real mcore-0.20 gpt_tp2pp1)" \
    "$WORK/to020/iter_0000010" --ignore common.args.save --leave-out rng_state/
# Another layout: the pipeline's cut and the stacked layers' chunks as
# Megatron-Core makes them; the ranks' RNG states left out (they belong to
# the layout), which args.no_save_rng tells Megatron's loader.
# Without --megatron-core, a torch_dist source's release decides (0.18's
# output had no common.pt, which 0.18's loader reads).
expect_ok "0.18's tp2pp1 GPT written at tp2pp2 (for 0.18: the source's release)" "$RS" "$WORK/mcore-0.18/ckpt/gpt_tp2pp1" \
    --to tp2pp2 -o "$WORK/topp2"
check "it keeps its common state in common.pt" [ -s "$WORK/topp2/iter_0000010/common.pt" ]
check "it says the RNG states were left out" grep -q "2 bytes entries of the source were left out (the ranks' RNG" "$WORK/.err"
expect_ok "equals Megatron-Core's own tp2pp2 checkpoint but for its RNG states" "$PY" "$META" compare \
    "$(real mcore-0.18 gpt_tp2pp2)" "$WORK/topp2/iter_0000010" --leave-out rng_state/ --ignore common.args.save \
    --ignore common.args.no_save_rng
expect_ok "its common state says so" "$PY" "$META" common "$WORK/topp2/iter_0000010"
check "args.no_save_rng True, tp 2, pp 2, world size 4" grep -q "no_save_rng.: True" "$WORK/.out"
expect_ok "and the tp2pp2 one written at tp2pp1" "$RS" "$WORK/mcore-0.18/ckpt/gpt_tp2pp2" --megatron-core 0.18 --to tp2pp1 \
    -o "$WORK/topp1"
expect_ok "equals Megatron-Core's own tp2pp1 checkpoint but for its RNG states" "$PY" "$META" compare \
    "$(real mcore-0.18 gpt_tp2pp1)" "$WORK/topp1/iter_0000010" --leave-out rng_state/ --ignore common.args.save \
    --ignore common.args.no_save_rng

# The judge can fail: another checkpoint's entries, and a chunk moved.
run "$PY" "$META" compare "$(real mcore-0.20 llama_tp2pp1)" "$WORK/mcore-0.20-gpt_tp2pp1.td/iter_0000010"
check_all "the comparer refuses another model's checkpoint (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "^output_layer.weight: in the reference only" "$WORK/.out"'
run "$PY" "$META" compare "$(real mcore-0.18 gpt_tp2pp2)" "$WORK/topp2/iter_0000010" --leave-out rng_state/
check_all "and a common state that differs, naming where (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "^common.args.no_save_rng: False and True" "$WORK/.out"'

# ------------------------------------------------------- other layouts
for case in mcore-0.20/gpt_tp2pp1:tp1pp2 mcore-0.18/gpt_tp2pp2:tp1pp1 mcore-0.20/llama_tp2pp1:tp1pp2 \
    mcore-0.20/llama_tp2pp1:tp2pp4; do
    which=${case%:*} layout=${case#*:}
    release=${which%/*} name=${which#*/}
    src="$WORK/$release/ckpt/$name"
    out="$WORK/$release-$name-$layout"
    expect_ok "$which -> torch_dist $layout, verified (in PyTorch $DIALECT's dialect)" "$RS" "$src" --format torch_dist \
        --to "$layout" --dcp-torch $DIALECT -o "$out" --verify
    check "weights and the optimizer's state" grep -q "weights and optimizer state" "$WORK/.out"
    expect_ok "$which at $layout: read back bit for bit" "$CK" diff "$src" "$out"
    expect_ok "$which at $layout: saved at $layout" "$CK" info "$out"
    tp=${layout#tp}
    check "info says so" grep -q "^saved at     tp=${tp%pp*} pp=${layout#*pp} " "$WORK/.out"
    expect_ok "$which at $layout -> this format" "$RS" "$out" --format tp --to tp2 -o "$out.tp"
    expect_ok "$which at $layout: every tensor bit-identical to what Megatron-Core's ranks held" "$PY" "$JUDGE" compare \
        "$REFERENCE" "$which" "$out.tp"
    if [ $TORCH -eq 1 ]; then
        run "$PY" "$DCP_JUDGE" "$REFERENCE" "$which" "$out/iter_0000010"
        if [ "$RC" -eq 77 ]; then
            echo "[SKIP] [$NAME] $which: this PyTorch has no distributed checkpoint module"
        else
            check "$which at $layout: PyTorch's DCP loads every tensor, bit-identical to Megatron-Core's (exit $RC)" \
                [ "$RC" -eq 0 ]
        fi
    fi
done
if [ $TORCH -eq 1 ]; then
    run "$PY" "$DCP_JUDGE" "$REFERENCE" mcore-0.20/gpt_tp2pp1 "$WORK/mcore-0.20-llama_tp2pp1-tp1pp2/iter_0000010"
    check "the DCP judge refuses another model's tensors (exit $RC)" [ "$RC" -eq 1 ]
fi
expect_ok "weights only" "$RS" "$WORK/mcore-0.20/ckpt/llama_tp2pp1" --weights-only --to tp1pp2 -o "$WORK/llama.w" \
    --verify
check "weights only, said" grep -q "weights only" "$WORK/.out"
expect_ok "its common state" "$PY" "$META" common "$WORK/llama.w/iter_0000010"
check_all "args.no_save_optim True, no optimizer or schedule in it" \
    'grep -q "no_save_optim.: True" "$WORK/.out" && ! grep -q "param_groups\|opt_param_scheduler" "$WORK/.out"'
expect_ok "its entries" "$PY" "$META" entries "$WORK/llama.w/iter_0000010"
check "none of the optimizer's" sh -c '! grep -q "^optimizer" "$1"' sh "$WORK/.out"
expect_ok "its weights equal the source's" "$CK" diff --weights-only "$WORK/mcore-0.20/ckpt/llama_tp2pp1" "$WORK/llama.w"
expect_ok "dry run" "$RS" "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --to tp1pp2 --dry-run --json -o "$WORK/never"
check_all "the plan: format, layout, files, optimizer" \
    '"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"format\"]==\"megatron-torch-dist\" and d[\"to\"]==dict(tp=1,pp=2) and d[\"files\"]==2 and d[\"optimizer\"], d" "$WORK/.out" && [ ! -e "$WORK/never" ]'

# ------------------------------------------------------------- refusals
expect_error "tp4: the vocabulary of 256 rows padded for tp2 is not Megatron's for tp4" 1 \
    "padded vocabulary of 256 rows is not a multiple of 128 x tp 4" "$RS" "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --to tp4 \
    -o "$WORK/never"
expect_error "an unknown release" 2 "a Megatron-Core release 'latest'" "$RS" "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --to tp2 \
    --megatron-core latest -o "$WORK/never"
expect_error "--megatron-core with another output" 2 "--megatron-core applies to a torch_dist output" "$RS" \
    "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --format tp --to tp2 --megatron-core 0.18 -o "$WORK/never"
expect_error "an interleaved pipeline" 1 "written in this toolkit's format only" "$RS" "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" \
    --to tp1pp2v2 -o "$WORK/never"
expect_error "a DCP checkpoint that names no model: refused, saying what is needed" 1 \
    "grid4 names no model of this toolkit's or of Megatron: Megatron's args are written from" "$RS" \
    "$ROOT/tests/data/dcp/grid4" --format torch_dist --to tp1 -o "$WORK/never"
expect_ok "an output in the way" mkdir -p "$WORK/taken/stray"
expect_error "--force does not replace what the writer does not write" 1 "holds 'stray'" "$RS" \
    "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --to tp1pp2 -o "$WORK/taken" --force
expect_ok "--force replaces a torch_dist output" "$RS" "$WORK/mcore-0.20/ckpt/gpt_tp2pp1" --to tp1pp2 --force \
    -o "$WORK/mcore-0.20-gpt_tp2pp1-tp1pp2"
check "what --force refused is still there" [ -d "$WORK/taken/stray" ]

# -------------------------------------------------------- other sources
if "$PY" -c 'import torch' 2>/dev/null; then
    SHAPE="--layers 4 --hidden 64 --heads 8 --ffn 128 --vocab 200 --make-vocab-size-divisible-by 16"
    expect_ok "a legacy Megatron-LM checkpoint (Transformer Engine names, bf16, Adam with fp32 masters, tp2pp2)" \
        "$PY" "$LEGACY" "$WORK/legacy" $SHAPE --names core --tp 2 --pp 2 --dtype bf16 --optimizer
    expect_ok "legacy -> torch_dist tp2pp1, verified" "$RS" "$WORK/legacy" --format torch_dist --to tp2pp1 \
        --dcp-torch $DIALECT -o "$WORK/legacy.td" --verify
    check "with the optimizer's state" grep -q "weights and optimizer state" "$WORK/.out"
    expect_ok "read back bit for bit, weights, moments and masters" "$CK" diff "$WORK/legacy" "$WORK/legacy.td"
    check "208 tensors" grep -q "^equal: 208 tensors" "$WORK/.out"
    expect_ok "the torch_dist fixture of the same model, tp2pp1 (PyTorch's DCP in Megatron-Core's layout)" "$PY" "$DIST" \
        "$WORK/legacy.fixture" $SHAPE --names core --tp 2 --pp 1 --dtype bf16 --optimizer
    expect_ok "its tensor entries and chunks are ours" "$PY" "$META" compare "$WORK/legacy.fixture/iter_0001000" \
        "$WORK/legacy.td/iter_0001000" --tensors-only
    expect_ok "the common state made from the legacy rank files" "$PY" "$META" common "$WORK/legacy.td/iter_0001000"
    check_all "args at tp2pp1, ckpt_format torch_dist, no RNG state; the optimizer's groups without params" \
        'grep -q "pipeline_model_parallel_size.: 1," "$WORK/.out" && grep -q "ckpt_format.: .torch_dist." "$WORK/.out" &&
         grep -q "no_save_rng.: True" "$WORK/.out" && grep -q "param_groups.: \[{.wd_mult.: 1.0" "$WORK/.out" &&
         ! grep -q "params.:" "$WORK/.out" && grep -q "opt_param_scheduler" "$WORK/.out"'
    # Local modules' names (input_layernorm, pre_mlp_layernorm) in the legacy
    # rank files: torch_dist keys the norms as Transformer Engine's fused
    # modules, as the local specification saves them (the real fixtures'
    # README); they were written under the local names, which Megatron-Core's
    # load would miss.
    expect_ok "a legacy checkpoint under Megatron-Core's local names" "$PY" "$LEGACY" "$WORK/local" $SHAPE \
        --names core-local --tp 2 --pp 1 --dtype bf16
    expect_ok "-> torch_dist" "$RS" "$WORK/local" --format torch_dist --to tp2pp1 -o "$WORK/local.td"
    expect_ok "its entries" "$PY" "$META" entries "$WORK/local.td/iter_0001000"
    check_all "the norms keyed as Megatron-Core saves them, none under the local names" \
        'grep -q "^decoder.layers.self_attention.linear_qkv.layer_norm_weight " "$WORK/.out" &&
         grep -q "^decoder.layers.mlp.linear_fc1.layer_norm_weight " "$WORK/.out" &&
         ! grep -q "input_layernorm\|pre_mlp_layernorm" "$WORK/.out"'
    expect_ok "and read back bit for bit" "$CK" diff "$WORK/local" "$WORK/local.td"
    expect_error "--megatron-names with a torch_dist output: a usage error (it was ignored)" 2 \
        "--megatron-names applies to a Megatron-LM legacy output" "$RS" "$WORK/local" --format torch_dist --to tp2pp1 \
        --megatron-names core-local -o "$WORK/never"
    # A torch_dist source whose layers are keyed one by one: its tensors
    # would be stacked beside _extra_state objects keyed by number, which no
    # model loads whole: refused (it was written so).
    expect_ok "a torch_dist fixture with layer-numbered keys" "$PY" "$DIST" "$WORK/numbered" $SHAPE --names core \
        --tp 2 --numbered
    expect_error "-> torch_dist: refused, naming a numbered key" 1 \
        "its layers are keyed one by one \\(decoder.layers.0.*: a model whose layers are not all alike\\)" \
        "$RS" "$WORK/numbered" --format torch_dist --to tp2pp1 -o "$WORK/never"
    check "nothing written" test ! -e "$WORK/never"
    # The vocabulary padded again for the target tp, as Megatron's saver pads
    # it: megatron_fixture.py's merge checks the padding rows.
    expect_ok "a legacy checkpoint padded for tp2, weights only" "$PY" "$LEGACY" "$WORK/v" --tp 2 --pp 2 --layers 2 \
        --hidden 32 --heads 4 --ffn 64 --vocab 90 --make-vocab-size-divisible-by 16 --untied --full "$WORK/v.full.pt"
    expect_error "tp4 without the true vocabulary: refused" 1 "96 rows is not a multiple of 16 x tp 4" "$RS" "$WORK/v" \
        --format torch_dist --to tp4pp1 -o "$WORK/never"
    expect_ok "tp4 with --true-vocab-size: 96 rows padded to 128" "$RS" "$WORK/v" --format torch_dist --to tp4pp1 \
        --true-vocab-size 90 -o "$WORK/v.td"
    # --verify reads the output told the same vocabulary (its reader leaves
    # the padding out; until then refused: no torch_dist reader was told one).
    expect_ok "--verify with a true vocabulary: the output read at it" "$RS" "$WORK/v" --format torch_dist --to tp4pp1 \
        --true-vocab-size 90 -o "$WORK/v.td.verified" --verify
    check "it says so" grep -q "^verified: 29 tensors equal to the source" "$WORK/.out"
    expect_ok "its entries" "$PY" "$META" entries "$WORK/v.td/iter_0001000"
    check "the tables are 128 rows" grep -q "^embedding.word_embeddings.weight torch.float16 (128, 32) " "$WORK/.out"
    expect_ok "back to legacy at tp4" "$RS" "$WORK/v.td" --format megatron --to tp4pp1 -o "$WORK/v.legacy"
    expect_ok "torch.load: the tables extended by their last row, as Megatron's saver pads" "$PY" "$LEGACY" --verify \
        "$WORK/v.legacy" --full "$WORK/v.full.pt"
fi
# This toolkit's GPT and Llama: Megatron-Core's names, each QKV regrouped
# into Megatron's per-group order (a Llama's 2 key/value heads cut between 4
# ranks, as Megatron-Core cuts them); weights only. Imported back, bit for bit.
for case in "tiny fp32 tp4pp2" "llama-tiny bf16 tp4pp2" "llama-tiny fp32 tp1pp2"; do
    set -- $case
    expect_ok "synth $1 ($2) with its optimizer" "$CK" synth -o "$WORK/$1.$2" --tp 2 --pp 1 --model "$1" --dtype "$2" \
        --vocab 256 --vocab-pad-multiple 16 --optim
    # Its Adam state has no Megatron param groups or step to go with it:
    # refused unless left out, said (it was dropped silently).
    expect_error "$1 -> torch_dist $3 with its optimizer: refused, saying why" 1 \
        "the optimizer's param groups and step are not known without a Megatron-LM source; --weights-only" \
        "$RS" "$WORK/$1.$2" --format torch_dist --to "$3" -o "$WORK/$1.$2.td"
    expect_ok "$1 -> torch_dist $3, --weights-only" "$RS" "$WORK/$1.$2" --format torch_dist --to "$3" --weights-only \
        -o "$WORK/$1.$2.td"
    check "weights only" grep -q "weights only" "$WORK/.out"
    expect_ok "$1 at $3: imported back" "$CK" import "$WORK/$1.$2.td" -o "$WORK/$1.$2.back" --tp 1 --pp 2
    expect_ok "$1 at $3: bit for bit the source's weights" "$CK" diff --weights-only "$WORK/$1.$2" "$WORK/$1.$2.back"
done
expect_error "--verify of a GPT: refused before any work, saying what to do (a usage error)" 2 "import it back" "$RS" "$WORK/tiny.fp32" --format torch_dist \
    --to tp2 -o "$WORK/never" --verify
expect_ok "a DCP of the Llama" "$RS" "$WORK/llama-tiny.bf16" --format dcp --to tp2 -o "$WORK/llama.dcp"
expect_ok "DCP -> torch_dist, weights only" "$RS" "$WORK/llama.dcp" --format torch_dist --to tp2pp2 --weights-only \
    -o "$WORK/llama.dcp.td"
expect_ok "the same checkpoint as from the Llama itself" "$CK" diff "$WORK/llama-tiny.bf16.td" "$WORK/llama.dcp.td"
finish
