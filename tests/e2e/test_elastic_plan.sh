#!/bin/sh
# tp-elastic plan end to end: the real binary at several worlds, its JSON
# checked against the planner's rules by an independent reader (Python's
# json), --ckpt on a synthesized checkpoint and on a run directory, and the
# exit status of impossible requests and usage errors. No MPI: fast.
# tier: check
. "$(dirname "$0")/lib.sh"
ELASTIC="$BIN/tp-elastic"
CK="$BIN/tp-ckpt"

# check_json FILE WORLD BATCH [RANKS_PER_NODE [MEMORY [ALLOW]]]: the rules of
# elastic/plan.h from their definition, for every layout of a plan.
check_json() {
    "$PY" - "$@" <<'PYEOF'
import json, sys
path, world, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per_node = int(sys.argv[4]) if len(sys.argv) > 4 else 0
memory = int(sys.argv[5]) if len(sys.argv) > 5 else 0
allow = len(sys.argv) > 6 and sys.argv[6] == "allow"
p = json.load(open(path))
m = p["request"]["model"]
assert p["request"]["world"] == world and p["request"]["global_batch"] == batch, p["request"]

def divides(tp, pp):  # key/value heads split over tp, or replicated when fewer and dividing it
    kv = m["kv_heads"] % tp == 0 or tp % m["kv_heads"] == 0
    return (m["heads"] % tp == 0 and kv and m["ffn"] % tp == 0 and m["layers"] % pp == 0
            and (not per_node or (tp <= per_node and per_node % tp == 0)))

def ranks(tp, pp):  # what the rules let (tp, pp) use, and its batch
    if not divides(tp, pp):
        return 0, batch
    most = world // (tp * pp)
    dp = max(d for d in range(1, most + 1) if batch % d == 0)
    if allow and dp < most and batch >= most:
        return tp * pp * most, batch // most * most
    return tp * pp * dp, batch

seen = set()
for l in p["layouts"]:
    tp, pp = l["tp"], l["pp"]
    seen.add((tp, pp))
    if not l["valid"]:
        assert l["reason"], l
        if not memory:
            assert ranks(tp, pp)[0] == 0, ("rejected but valid", l)
        continue
    assert divides(tp, pp), l
    assert l["ranks"] == tp * pp * l["dp"] <= world, l
    assert l["idle"] == world - l["ranks"], l
    assert l["micro_batch"] * l["grad_accum"] * l["dp"] == l["global_batch"], l
    assert l["global_batch"] == batch or (allow and l["global_batch"] < batch), l
    assert 1 <= l["micro_batch"] <= p["request"]["micro_batch_limit"], l
    mem = l["memory_per_rank"]
    assert mem["total"] == sum(mem[k] for k in ("weights", "gradients", "optimizer", "snapshot", "activations")), l
    if memory:
        assert mem["total"] <= memory, l
    else:
        assert (l["ranks"], l["global_batch"]) == ranks(tp, pp), ("not the largest dp", l)
# every (tp, pp) within the world up to the heads and layers is listed
for tp in range(1, min(world, m["heads"]) + 1):
    for pp in range(1, min(world // tp, m["layers"]) + 1):
        assert (tp, pp) in seen, (tp, pp)
best = max([ranks(tp, pp)[0] for tp, pp in seen] + [0])
if p["chosen"] < 0:
    assert best == 0 or memory, p["why"]
else:
    c = p["layouts"][p["chosen"]]
    assert c["valid"], c
    if not memory:
        assert c["ranks"] == best, ("a layout uses more ranks", best, c)
    assert p["batch_changed"] == (c["global_batch"] != batch)
    assert ("uses all %d ranks" % world in p["why"]) == (c["ranks"] == world), p["why"]
PYEOF
}

# ---------------------------------------------------------------- worlds
for world in 1 2 3 4 5 6 7 8 12 16; do
    expect_ok "tiny at $world ranks, JSON" "$ELASTIC" plan --world $world --model tiny --global-batch 8 --json
    check "tiny at $world ranks: the rules hold" check_json "$WORK/.out" $world 8
done
for world in 1 3 8 24 64; do
    expect_ok "gpt2-124m at $world ranks, 8 per node" "$ELASTIC" plan --world $world --model gpt2-124m \
        --global-batch 48 --ranks-per-node 8 --json
    check "gpt2-124m at $world ranks: the rules hold" check_json "$WORK/.out" $world 48 8
done
expect_ok "GQA, odd layers at 12 ranks" "$ELASTIC" plan --world 12 --layers 3 --dim 96 --heads 6 --kv-heads 2 \
    --vocab 300 --seq 32 --global-batch 12 --json
check "GQA: the rules hold, tp 6 with each of the 2 KV heads on 3 ranks" check_json "$WORK/.out" 12 12
check "GQA: tp 3 divides the heads but not the KV heads" \
    "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); l=[l for l in p["layouts"] if l["tp"]==3][0]; assert not l["valid"] and "kv" in l["reason"].lower(), l' "$WORK/.out"

# ---------------------------------------------------------- text output
expect_ok "tiny at 8 ranks, text" "$ELASTIC" plan --world 8 --model tiny --global-batch 8 --current tp2pp2
check "text: a table row per layout" [ "$(grep -Ec '^ +[0-9]+ +[0-9]+ ' "$WORK/.out")" -eq 8 ]
check "text: an invalid row says why" grep -q "3   1   not valid: heads 4 is not divisible by tp 3" "$WORK/.out"
check "text: the chosen line keeps the current layout" \
    grep -Eq "^chosen: tp2 pp2 dp2 micro 4 accum 1 \(uses all 8 ranks; .*keeps the current tp2 pp2" "$WORK/.out"
check "text: memory by kind" grep -q "^memory per rank: weights .* activations" "$WORK/.out"
expect_ok "7 ranks, 4 heads, batch 8: ranks idle" "$ELASTIC" plan --world 7 --model tiny --global-batch 8
check "idle: 3 of 7 ranks idle" grep -q "uses 4 of 7 ranks, 3 idle" "$WORK/.out"
expect_ok "--allow-batch-change at 7 ranks" "$ELASTIC" plan --world 7 --model tiny --global-batch 8 \
    --allow-batch-change --json
check "--allow-batch-change: all 7 ranks, batch 7" check_json "$WORK/.out" 7 8 0 0 allow
check "--allow-batch-change: recorded" "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); c=p["layouts"][p["chosen"]]; assert p["batch_changed"] and c["global_batch"]==7 and c["ranks"]==7, c' "$WORK/.out"
expect_ok "--micro-batch 2 --memory-per-rank" "$ELASTIC" plan --world 4 --model small --global-batch 16 \
    --micro-batch 2 --memory-per-rank 190M --json
check "memory limit: the rules hold" check_json "$WORK/.out" 4 16 0 199229440
check "memory limit: tp2 pp1 fits at micro-batch 2 only with ZeRO-1; tp1 pp1 only with ZeRO-3; no ZeRO at dp 1" "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); l={(l["tp"],l["pp"]):l for l in p["layouts"]}; t=l[2,1]; assert t["valid"] and t["micro_batch"]==2 and t["zero"]==1 and not t["sequence_parallel"] and t["memory_per_rank"]["total"] <= 199229440 < t["memory_without_savings"], t; o=l[1,1]; assert o["valid"] and o["dp"]==4 and o["zero"]==3 and not o["sequence_parallel"] and o["memory_per_rank"]["total"] <= 199229440 < o["memory_without_savings"], o; assert not any(x.get("zero") for x in p["layouts"] if x["valid"] and x["dp"] == 1), p' "$WORK/.out"
expect_ok "--memory-per-rank 100M" "$ELASTIC" plan --world 4 --model small --global-batch 16 --micro-batch 2 \
    --memory-per-rank 100M --json
check "under what ZeRO-3 needs at tp1 pp1: not valid, saying what ZeRO-3 would need" "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); o=[l for l in p["layouts"] if (l["tp"],l["pp"])==(1,1)][0]; assert not o["valid"] and "with ZeRO-3" in o["reason"] and "100.0 MiB given" in o["reason"], o' "$WORK/.out"
expect_ok "the same, text" "$ELASTIC" plan --world 4 --model small --global-batch 16 --micro-batch 2 \
    --memory-per-rank 190M --current tp2pp1
check "text: tp2 pp1 chosen with ZeRO-1, and why" \
    grep -Eq "^chosen: tp2 pp1 dp2 micro 2 accum 4 zero 1 \(.*with ZeRO-1 \(199.9 MiB without, over the limit\)\)" "$WORK/.out"
check "text: its row says sp off, zero 1, one chunk per stage" grep -Eq "^ +2 +1 +2 +2 +4 +4 .* - +1 +1 +0.0% +<- chosen" "$WORK/.out"
expect_ok "a limit only sequence parallelism meets (dp 1: nothing for ZeRO-1 to split)" "$ELASTIC" plan --world 2 \
    --model tiny --global-batch 12 --micro-batch 2 --memory-per-rank 2210000
check "text: tp2 pp1 dp1 chosen with sequence parallelism, and why" \
    grep -Eq "^chosen: tp2 pp1 dp1 micro 2 accum 6 sequence-parallel \(.*with sequence parallelism \(2.1 MiB without, over the limit\)\)" "$WORK/.out"
# The interleaved schedule: 8 layers of one head on 2 ranks, batch 8 of
# single sequences: pp 2's 8 micro-batches leave a bubble of 1/8; V 2 leaves
# 1/16, over 5%; 8 layers allow no V 3; V 4 leaves 1/32.
expect_ok "a bubble over 5%: interleaved" "$ELASTIC" plan --world 2 --layers 8 --dim 64 --heads 1 --vocab 256 \
    --seq 32 --global-batch 8 --micro-batch 1
check "text: tp1 pp2 chosen with 4 virtual stages, and why" grep -Eq "^chosen: tp1 pp2 dp1 micro 1 accum 8 \
virtual-stages 4 \(.*interleaved over 4 virtual stages: an ideal bubble of 3.1% of the compute time instead of 12.5%\)" \
    "$WORK/.out"
check "text: its row says v 4, bubble 3.1%" grep -Eq "^ +1 +2 +1 +1 +8 +2 .* - +4 +3.1% +<- chosen" "$WORK/.out"
expect_ok "the same, JSON" "$ELASTIC" plan --world 2 --layers 8 --dim 64 --heads 1 --vocab 256 --seq 32 \
    --global-batch 8 --micro-batch 1 --json
check "JSON: virtual_stages 4, bubble 1/32; pp 1 has none" "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); c=p["layouts"][p["chosen"]]; assert c["virtual_stages"]==4 and abs(c["bubble"]-1/32)<1e-12, c; o=[l for l in p["layouts"] if l["pp"]==1][0]; assert o["virtual_stages"]==1 and o["bubble"]==0, o' "$WORK/.out"
# A bubble over 5% outweighs memory that fits: one sequence a step through
# tp2 pp2 idles each stage half the step; tp4 pp1 needs 72 KiB more per rank.
expect_ok "llama-tiny, 4 ranks, batch 1" "$ELASTIC" plan --world 4 --model llama-tiny --global-batch 1
check "text: tp4 pp1 chosen over the 100% bubble of tp2 pp2, and why" grep -Eq "^chosen: tp4 pp1 dp1 micro 1 accum 1 \
\(.*per rank \(tp2 pp2 needs 913 KiB but idles in a pipeline bubble of 100.0% of its compute time\)\)" "$WORK/.out"
expect_ok "--help" "$ELASTIC" plan --help
check "--help: usage" grep -q "usage: tp-elastic plan --world N" "$WORK/.out"
check "--help: a run's tp-train arguments may be pasted" grep -q "tp-train arguments may be pasted as they are" "$WORK/.out"

# ------------------------------------------------ a run's arguments pasted
# tp-train's own options are taken (they were refused as unknown): --tp and
# --pp as the current layout, the others ignored; the plan is the one
# --current gives, byte for byte, and nothing is made at the paths named.
expect_ok "the plan of --current tp2pp2" "$ELASTIC" plan --world 8 --model tiny --global-batch 8 --micro-batch 2 \
    --current tp2pp2 --json
mv "$WORK/.out" "$WORK/current.json"
expect_ok "a run's tp-train arguments pasted" "$ELASTIC" plan --model tiny --tp 2 --pp 2 --dp 2 --micro-batch 2 \
    --grad-accum 2 --resume --world 8 --global-batch 8 --steps 100 --lr 3e-4 --min-lr 3e-5 --warmup 10 --seed 7 \
    --ckpt-every 5 --ckpt-dir "$WORK/never-run" --sync-save --quiet --log "$WORK/never.jsonl" --data "$WORK/none.bin" \
    --zero 1 --sequence-parallel --virtual-stages 2 --weight-decay 0.1 --clip 1 --threads 2 --device cpu \
    --stop-at 50 --ckpt-cache "$WORK/never-cache" --json
check "pasted: the same plan as --current tp2pp2" cmp -s "$WORK/.out" "$WORK/current.json"
check "pasted: nothing made at the paths they name" \
    sh -c '! ls -d "$1"/never* 2>/dev/null | grep -q .' - "$WORK"
# --current's degrees follow the one rule for numbers (tp-reshard's --to
# reads the layout): sscanf took blanks, a '+' and a wrapped overflow
# ("tp99999999999pp1" was tp 1215752191), exit 0.
for bad in "tp 2pp1" "tp+2pp1" "tp2pp 1" "tp99999999999pp1" "tp2pp1 "; do
    expect_error "--current '$bad': refused" 2 "--current takes tpTppP \(tp2pp1\): layout '.+' not understood" \
        "$ELASTIC" plan --world 4 --model tiny --global-batch 8 --current "$bad"
done
expect_ok "--current tp2: pp 1" "$ELASTIC" plan --world 4 --model tiny --global-batch 8 --current tp2
check "--current tp2: tp2 pp1 kept" grep -Eq "^chosen: tp2 pp1 .*keeps the current tp2 pp1" "$WORK/.out"
expect_ok "--pp alone: tp 1, as tp-train's default" "$ELASTIC" plan --world 4 --model tiny --global-batch 8 --pp 2 \
    --seed 1
check "--pp alone: tp1 pp2 kept" grep -Eq "^chosen: tp1 pp2 dp2 .*keeps the current tp1 pp2" "$WORK/.out"
expect_error "--tp and --current naming two layouts" 2 "--tp 4 --pp 1 and --current tp2pp2 name two current layouts" \
    "$ELASTIC" plan --world 8 --model tiny --global-batch 8 --tp 4 --current tp2pp2
expect_error "a trainer option missing its value" 2 "missing value: '--seed'" \
    "$ELASTIC" plan --world 8 --model tiny --global-batch 8 --seed

# ----------------------------------------------------------------- --ckpt
MODEL="--layers 4 --dim 64 --heads 4 --vocab 300 --seq 32"
expect_ok "synth tp2pp2" "$CK" synth -o "$WORK/ck" --tp 2 --pp 2 $MODEL --step 5
expect_ok "--ckpt: 8 ranks" "$ELASTIC" plan --world 8 --ckpt "$WORK/ck" --global-batch 16 --json
check "--ckpt: the model and current layout of the checkpoint" "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); r=p["request"]; assert r["model"]["layers"]==4 and r["model"]["vocab"]==300 and (r["current_tp"],r["current_pp"])==(2,2), r; c=p["layouts"][p["chosen"]]; assert (c["tp"],c["pp"],c["dp"])==(2,2,2), c' "$WORK/.out"
check "--ckpt: the rules hold" check_json "$WORK/.out" 8 16
mkdir -p "$WORK/run"
expect_ok "synth into a run directory" "$CK" synth -o "$WORK/run/step_00000003" --tp 1 --pp 2 $MODEL --step 3
expect_ok "synth a newer step" "$CK" synth -o "$WORK/run/step_00000009" --tp 2 --pp 1 $MODEL --step 9
expect_ok "--ckpt of a run directory" "$ELASTIC" plan --world 6 --ckpt "$WORK/run" --global-batch 12
check "--ckpt of a run: its newest checkpoint's tp2 pp1 kept" \
    grep -Eq "^chosen: tp2 pp1 dp3 .*keeps the current tp2 pp1" "$WORK/.out"
expect_ok "--current overrides the checkpoint's" "$ELASTIC" plan --world 4 --ckpt "$WORK/run" --global-batch 12 \
    --current tp1pp2
check "--current: tp1 pp2 kept" grep -Eq "^chosen: tp1 pp2 dp2 .*keeps the current tp1 pp2" "$WORK/.out"
# Another tool's checkpoint (it was "not a checkpoint: no index.json"): a
# Megatron GPT's model read as this toolkit's, the layout it was saved at
# the current one; a DCP that names no model of this toolkit's refused.
expect_ok "the tp2pp2 checkpoint as Megatron-LM's" "$BIN/tp-reshard" "$WORK/ck" --to tp2pp2 --format megatron \
    -o "$WORK/meg"
expect_ok "and as Megatron-Core's torch_dist at tp2pp1" "$BIN/tp-reshard" "$WORK/ck" --to tp2pp1 --format torch_dist \
    -o "$WORK/dist"
for c in meg:2:2 dist:2:1; do
    name=${c%%:*} layout=${c#*:}
    expect_ok "--ckpt of the $name checkpoint" "$ELASTIC" plan --world 8 --ckpt "$WORK/$name" --global-batch 16 --json
    check "--ckpt of the $name checkpoint: its model and saved layout" "$PY" -c 'import json,sys
p = json.load(open(sys.argv[1])); r = p["request"]; m = r["model"]
assert (m["layers"], m["dim"], m["heads"], m["seq"]) == (4, 64, 4, 32), m
assert (r["current_tp"], r["current_pp"]) == tuple(int(x) for x in sys.argv[2].split(":")), r' "$WORK/.out" "$layout"
done
expect_error "--ckpt of a DCP without this toolkit's model: refused, naming the remedy" 1 \
    "cols2: its model: a PyTorch distributed checkpoint that records no model of this toolkit's: give the model flags" \
    "$ELASTIC" plan --world 2 --ckpt "$ROOT/tests/data/dcp/cols2" --global-batch 8
# A bf16 run's checkpoint holds fp32 weights: the plan takes the precision
# the run trained in from its record, as tp-train --resume does (it planned
# fp32: no bf16 weight copies, fp32 activations), and --dtype beside --ckpt
# says how the run will train.
expect_ok "a bf16 run of 2 steps" "$BIN/tp-train" --model tiny --dtype bf16 --micro-batch 2 --steps 2 --quiet \
    --ckpt-dir "$WORK/bf16run"
for how in ckpt:"--ckpt $WORK/bf16run" flags:"--model tiny --dtype bf16" fp32:"--ckpt $WORK/bf16run --dtype fp32"; do
    expect_ok "plan of the bf16 run (${how%%:*})" "$ELASTIC" plan --world 4 ${how#*:} --global-batch 8 --current tp1pp1 --json
    cp "$WORK/.out" "$WORK/plan_${how%%:*}.json"
done
# same_memory A B EQUAL: whether the two plans' layouts (all rows) have the same memory per rank (EQUAL 1) or not (0).
same_memory() {
    "$PY" -c 'import json, sys
rows = [[(l["tp"], l["pp"], l.get("memory_per_rank")) for l in json.load(open(f))["layouts"]] for f in sys.argv[1:3]]
assert any(m for _, _, m in rows[0]), rows[0]
sys.exit((rows[0] == rows[1]) != (sys.argv[3] == "1"))' "$@"
}
check "--ckpt of a bf16 run: the memory of the model flags with --dtype bf16" \
    same_memory "$WORK/plan_ckpt.json" "$WORK/plan_flags.json" 1
check "--ckpt of a bf16 run with --dtype fp32: planned otherwise" same_memory "$WORK/plan_ckpt.json" "$WORK/plan_fp32.json" 0
check "--ckpt of a bf16 run: the model's dtype bf16 in the request" "$PY" -c 'import json, sys
assert json.load(open(sys.argv[1]))["request"]["model"]["dtype"] == "bf16"' "$WORK/plan_ckpt.json"
expect_ok "plan of the bf16 run, text" "$ELASTIC" plan --world 4 --ckpt "$WORK/bf16run" --global-batch 8
check "the text says bf16 on its first line" grep -q "^4 ranks, global batch 8, micro-batch up to 8, bf16" "$WORK/.out"
# A checkpoint of bf16 weights without a run's record (tp-ckpt synth's,
# an import's) resumes in fp32, as tp-train --resume takes it: planned so
# (it was planned as bf16).
mkdir "$WORK/synthrun"
expect_ok "a bf16 checkpoint without a run record" "$BIN/tp-ckpt" synth -o "$WORK/synthrun/step_00000000" --tp 1 --pp 1 \
    --model tiny --dtype bf16
expect_ok "its plan" "$ELASTIC" plan --world 4 --ckpt "$WORK/synthrun" --global-batch 8
check "planned in fp32, as it resumes: no precision on the first line" \
    grep -q "^4 ranks, global batch 8, micro-batch up to 8, current tp1 pp1" "$WORK/.out"

# --------------------------------------------------- impossible requests
expect_error "nothing fits in 1 MiB" 1 "no layout is valid for 4 ranks: tp1 pp1: needs .* 1.0 MiB given" \
    "$ELASTIC" plan --world 4 --model small --global-batch 8 --memory-per-rank 1M
check "nothing fits: the table still lists every layout" [ "$(grep -c 'not valid' "$WORK/.out")" -ge 4 ]
expect_error "nothing fits, JSON" 1 "no layout is valid" \
    "$ELASTIC" plan --world 2 --model tiny --global-batch 8 --memory-per-rank 1K --json
check "nothing fits, JSON: chosen -1" \
    "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); assert p["chosen"]==-1 and p["why"], p["why"]' "$WORK/.out"
expect_error "no such checkpoint" 1 "error: .*none" "$ELASTIC" plan --world 2 --ckpt "$WORK/none" --global-batch 8

# ------------------------------------------------------------ usage errors
expect_error "no --world" 2 "--world N is required" "$ELASTIC" plan --model tiny --global-batch 8
expect_error "no --global-batch" 2 "--global-batch B is required" "$ELASTIC" plan --world 2 --model tiny
expect_error "no model" 2 "--ckpt DIR" "$ELASTIC" plan --world 2 --global-batch 8
expect_error "a model and --ckpt" 2 "not both" "$ELASTIC" plan --world 2 --model tiny --ckpt "$WORK/ck" \
    --global-batch 8
expect_error "--world 0" 2 "world" "$ELASTIC" plan --world 0 --model tiny --global-batch 8
expect_error "--current badly written" 2 "tpTppP" "$ELASTIC" plan --world 2 --model tiny --global-batch 8 --current 2x2
expect_error "--memory-per-rank not a size" 2 "memory-per-rank" "$ELASTIC" plan --world 2 --model tiny \
    --global-batch 8 --memory-per-rank lots
expect_error "an unknown option" 2 "--bogus" "$ELASTIC" plan --world 2 --model tiny --global-batch 8 --bogus
expect_error "an unknown preset" 2 "tiny, small, gpt2-124m, llama-tiny" "$ELASTIC" plan --world 2 --model huge --global-batch 8
expect_error "a stray argument" 2 "unexpected argument 'extra'" "$ELASTIC" plan --world 2 --model tiny \
    --global-batch 8 extra
finish
