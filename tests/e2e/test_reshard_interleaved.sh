#!/bin/sh
# Checkpoints of the interleaved pipeline schedule (format 1.5, virtual_stages):
# tp-reshard into tp2pp2v2 and out of it to tp1pp1 and tp1pp4, each verified and
# equal to the source by logical digests; an independent h5py reading of the
# v2 files finds on stage 0 exactly the layers of chunks 0 and 2 (docs/FORMAT.md
# section 2); tp-ckpt info says the layout; an index without the key (what a
# 1.4 reader sees) is refused; targets that cannot be are refused.
# tier: full
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
# 8 layers: 4 chunks of 2 at pp2 v2 (stage 0: layers 0 1 4 5; stage 1: 2 3 6 7).
MODEL="--layers 8 --dim 64 --heads 4 --ffn 128 --vocab 301 --vocab-pad-multiple 4 --seq 16 --optim --seed 7"

expect_ok "synth tp2pp1" "$CK" synth -o "$WORK/src" --tp 2 --pp 1 $MODEL
expect_ok "synth the same model at tp1pp1" "$CK" synth -o "$WORK/tp1" --tp 1 --pp 1 $MODEL

# same_digests A B: every tensor of A is in B with the same logical digest and dtype, and no other.
same_digests() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
a, b = (json.load(open(p + "/index.json")) for p in sys.argv[1:3])
da = {t["name"]: (t["digest"], t["dtype"]) for t in a["tensors"]}
db = {t["name"]: (t["digest"], t["dtype"]) for t in b["tensors"]}
assert len(da) > 100 and da == db, sorted(set(da.items()) ^ set(db.items()))[:4]
PYEOF
}

# ------------------------------------------------------------- into v2
expect_ok "tp2pp1 -> tp2pp2v2 --verify" "$RS" "$WORK/src" --to tp2pp2v2 -o "$WORK/v2" --verify
check "the summary names both layouts" grep -q "^resharded .* (tp2pp1) -> .* (tp2pp2v2)" "$WORK/.out"
check "verified" grep -q "^verified: [0-9]* tensors equal to the source" "$WORK/.out"
expect_ok "tp-ckpt verify" "$CK" verify "$WORK/v2"
check "logical digests equal the source's" same_digests "$WORK/src" "$WORK/v2"
expect_ok "diff against the tp1pp1 synthesis" "$CK" diff "$WORK/v2" "$WORK/tp1"
expect_ok "info" "$CK" info "$WORK/v2"
check "info says the chunks per stage" grep -q "^layout  *tp=2 pp=2 virtual_stages=2 dp=1 " "$WORK/.out"
check "and the stage of a layer of chunk 2" grep -q "^model/layers.4.attn.qkv.weight .* 0 " "$WORK/.out"
expect_ok "info --json" "$CK" info "$WORK/v2" --json
check "info --json: virtual_stages, format 1.5" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["virtual_stages"] == 2 and j["layout"]["virtual_stages"] == 2 and j["format_version"] == [1, 7], j["layout"]
assert j["user"]["reshard"]["from_pp"] == 1 and "from_virtual_stages" not in j["user"]["reshard"]
' "$WORK/.out"

# The outside judge: h5py on the shard files, the expectation from the
# format's rule (chunk k of pp*V on stage k mod pp), not from the toolkit.
check "h5py: stage 0 holds exactly chunks 0 and 2, stage 1 chunks 1 and 3" "$PY" - "$WORK/v2" <<'PYEOF'
import json, re, sys
import h5py
ck = sys.argv[1]
layout = json.load(open(ck + "/index.json"))["layout"]
L, pp, tp, V = layout["num_layers"], layout["pp"], layout["tp"], layout["virtual_stages"]
assert (L, pp, tp, V) == (8, 2, 2, 2), layout
per_chunk = L // (pp * V)
for stage in range(pp):
    chunks = [stage + pp * v for v in range(V)]
    want = {c * per_chunk + i for c in chunks for i in range(per_chunk)}
    assert want == ({0, 1, 4, 5} if stage == 0 else {2, 3, 6, 7}), want
    for rank in range(tp):
        name = "%s/shard_pp%02d_tp%02d.h5" % (ck, stage, rank)
        with h5py.File(name, "r") as f:
            assert int(f.attrs["layout_virtual_stages"][0]) == V, name
            assert list(f.attrs["layout_tp_pp_dp"][:2]) == [tp, pp] and list(f.attrs["shard_pp_tp"]) == [stage, rank]
            names = []
            f["tensors"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            layers = {int(m.group(1)) for n in names for m in [re.search(r"layers\.(\d+)\.", n)] if m}
            assert layers == want, (name, sorted(layers), sorted(want))
            # Parameters and the optimizer's state alike, and the ends where they belong.
            assert any(n.startswith("optim/exp_avg/layers.%d." % min(want)) for n in names), name
            assert ("model/tok_embed.weight" in names) == (stage == 0), name
            assert ("model/final_norm.weight" in names) == (rank == 0 and stage == pp - 1), name
            for n in names:
                if "layers." in n:
                    assert int(f["tensors/" + n].attrs["layer"][0]) in want, n
PYEOF
expect_ok "h5py: the v2 output merges to the source's values" "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/v2" \
    --compare "$WORK/src" --synth-seed 7

# ------------------------------------------------------------ out of v2
expect_ok "tp2pp2v2 -> tp1pp1 --verify" "$RS" "$WORK/v2" --to tp1pp1 -o "$WORK/back" --verify
check "the summary names the source's chunks" grep -q "(tp2pp2v2) -> .* (tp1pp1)" "$WORK/.out"
check "digests equal the source's" same_digests "$WORK/src" "$WORK/back"
expect_ok "equal to the tp1pp1 synthesis" "$CK" diff "$WORK/back" "$WORK/tp1"
run "$CK" info "$WORK/back" --json
check "the reshard note records the chunks it came from" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["virtual_stages"] == 1 and "virtual_stages" not in j["layout"], j["layout"]
assert j["user"]["reshard"]["from_pp"] == 2 and j["user"]["reshard"]["from_virtual_stages"] == 2, j["user"]
' "$WORK/.out"
expect_ok "tp2pp2v2 -> tp1pp4 --verify" "$RS" "$WORK/v2" --to tp1pp4 -o "$WORK/pp4" --verify
check "digests equal the source's" same_digests "$WORK/src" "$WORK/pp4"
expect_ok "tp-ckpt verify" "$CK" verify "$WORK/pp4"
run "$CK" info "$WORK/pp4"
check "pp named without v: consecutive stages" grep -q "^layout  *tp=1 pp=4 dp=1 " "$WORK/.out"
check "layers 2 and 3 on stage 1" grep -q "^model/layers.3.attn.qkv.weight .* 1 " "$WORK/.out"
check "the index's layout has no virtual_stages, its shards no attribute" "$PY" -c '
import json, sys, h5py
assert "virtual_stages" not in json.load(open(sys.argv[1] + "/index.json"))["layout"]
assert "layout_virtual_stages" not in h5py.File(sys.argv[1] + "/shard_pp01_tp00.h5", "r").attrs
' "$WORK/pp4"
expect_ok "tp1pp4 -> tp2pp4v2 -> the same tp1pp4" sh -c "'$RS' '$WORK/pp4' --to tp2pp4v2 -o '$WORK/v24' --verify >/dev/null &&
    '$RS' '$WORK/v24' --to tp1pp4 -o '$WORK/pp4b' >/dev/null && '$CK' diff '$WORK/pp4' '$WORK/pp4b' >/dev/null"
check "h5py: at pp4 v2 (8 chunks of 1 layer) stage 1 holds layers 1 and 5" "$PY" - "$WORK/v24" <<'PYEOF'
import re, sys, h5py
for rank in range(2):
    with h5py.File("%s/shard_pp01_tp%02d.h5" % (sys.argv[1], rank), "r") as f:
        layers = {int(m.group(1)) for n in f["tensors/model"] for m in [re.match(r"layers\.(\d+)\.", n)] if m}
        assert layers == {1, 5}, sorted(layers)
PYEOF

# A degree not named is kept, the chunks with the pipeline; the default
# output is named after the layout.
cp -r "$WORK/v2" "$WORK/m_tp2pp2v2"
expect_ok "--to tp1 keeps pp2 v2" "$RS" "$WORK/m_tp2pp2v2" --to tp1
check "named m_tp1pp2v2" [ -f "$WORK/m_tp1pp2v2/index.json" ]
run "$CK" info "$WORK/m_tp1pp2v2"
check "at tp1pp2v2" grep -q "^layout  *tp=1 pp=2 virtual_stages=2 " "$WORK/.out"
expect_ok "--dry-run --json" "$RS" "$WORK/src" --to tp2pp2v2 -o "$WORK/dry" --dry-run --json
check "the plan's layouts" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["from"] == {"tp": 2, "pp": 1} and j["to"] == {"tp": 2, "pp": 2, "virtual_stages": 2}, j
' "$WORK/.out"
expect_ok "--from with the chunks" "$RS" "$WORK/v2" --from tp2pp2v2 --to tp1 -o "$WORK/f1"

# Megatron-LM's virtual pipeline is this placement: its checkpoints read with
# their chunks (each layer on the stage of the rank files that hold it, by
# Megatron's own numbering: chunk v of pipeline rank p starts at layer
# v L/vpp + p L/(pp vpp)), and convert keeping them.
expect_ok "a Megatron-LM checkpoint at tp2pp2 vpp2" "$PY" "$ROOT/tests/support/megatron_fixture.py" "$WORK/meg" \
    --tp 2 --pp 2 --vpp 2 --layers 8 --hidden 64 --heads 8 --ffn 96 --vocab 90
expect_ok "info --json" "$CK" info "$WORK/meg" --json
check "each layer on the stage of its rank files" "$PY" -c '
import json, re, sys
j = json.load(open(sys.argv[1]))
L, pp, vpp = j["num_layers"], j["pp"], j["vpp"]
seen = 0
for t in j["tensors"]:
    m = re.match(r"layers\.(\d+)\.", t["name"])
    if m:
        layer = int(m.group(1))
        rank = (layer % (L // vpp)) // (L // (pp * vpp))
        assert t["stage"] == rank, (t["name"], t["stage"], rank)
        seen += 1
assert (L, pp, vpp) == (8, 2, 2) and seen >= 8, (L, pp, vpp, seen)
' "$WORK/.out"
expect_ok "--to tp1 --format tp" "$RS" "$WORK/meg" --to tp1 --format tp -o "$WORK/meg1" --verify
check "keeps pp2 v2" grep -q "(tp2pp2v2) -> .* (tp1pp2v2)" "$WORK/.out"
expect_ok "tp-ckpt verify" "$CK" verify "$WORK/meg1"

# ------------------------------------------------------------ refusals
# What a 1.4 reader does: it ignores virtual_stages, computes consecutive
# stages and refuses the index at the first layer they disagree on.
cp -r "$WORK/v2" "$WORK/old"
"$PY" - "$WORK/old/index.json" "$ROOT/tests/support" <<'PYEOF'
import json, sys
sys.path.insert(0, sys.argv[2])
import index_seal
index = json.load(open(sys.argv[1]))
del index["layout"]["virtual_stages"]
index_seal.dump(index, sys.argv[1])
PYEOF
expect_error "an index without its virtual_stages" 1 "tensor 'model/layers.2.ln1.weight': field 'stage' missing or not the stage its anchor and layer give" \
    "$CK" verify "$WORK/old"
expect_error "v needs a pipeline" 2 "--to: layout 'tp2pp1v2': 2 virtual stages .* need pp 2 or more" \
    "$RS" "$WORK/src" --to tp2pp1v2 -o "$WORK/x1"
expect_error "v1 is refused" 2 "--to: layout 'tp2pp2v1': v1 is one chunk" "$RS" "$WORK/src" --to tp2pp2v1 -o "$WORK/x1"
expect_error "v0 is not a layout" 2 "--to: layout 'tp2pp2v0' not understood" "$RS" "$WORK/src" --to tp2pp2v0 -o "$WORK/x1"
expect_error "chunks that do not divide the layers" 1 "cannot reshard to tp2pp2v3: 8 layers cannot be split evenly into pp=2 x 3" \
    "$RS" "$WORK/src" --to tp2pp2v3 -o "$WORK/x1"
expect_error "--from names other chunks" 1 "--from tp2pp2v4 does not match .* which is tp2pp2v2" \
    "$RS" "$WORK/v2" --from tp2pp2v4 --to tp1 -o "$WORK/x1"
expect_error "not written as DCP" 1 "--to tp2pp2v2: .* this toolkit's format only" \
    "$RS" "$WORK/src" --to tp2pp2v2 --format dcp -o "$WORK/x1"
expect_error "nor as Megatron's" 1 "--to tp2pp2v2: .* this toolkit's format only" \
    "$RS" "$WORK/src" --to tp2pp2v2 --format megatron --weights-only -o "$WORK/x1"
check "nothing written by a refusal" [ ! -e "$WORK/x1" ]
# A source's chunks that --to does not name, written in a format without
# them: said, not only shown by the summary's layout.
for format in dcp megatron; do
    expect_ok "the v2 source as $format, its chunks not named" "$RS" "$WORK/v2" --to tp2 --format $format --weights-only \
        -o "$WORK/v2.$format"
    check "the chunks left are said ($format)" \
        grep -q "warning: the source's 2 chunks of layers a stage (the interleaved schedule) are not kept" "$WORK/.err"
done
finish
