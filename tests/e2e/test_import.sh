#!/bin/sh
# tp-ckpt import of Hugging Face directories that another reader would read
# differently, and of outputs that would not be what their names say
# (docs/EXPORT.md "Import"): each refused in one line before anything is
# written, naming what to change.
#   - model.safetensors beside model.safetensors.index.json (transformers
#     loads the single file, import took the index's shards);
#   - a config.json key given twice (Python's json keeps the last value,
#     cJSON the first: rope_theta 10000 imported for 500000);
#   - a llama3 rope_scaling factor 0 (stored as "no scaling"), refused as
#     -2 is; a number given as a string said to be a string;
#   - transformers 5's rope_parameters read as version 4's rope_theta and
#     rope_scaling (it was ignored), a type not computed refused;
#   - an output under a regular file said to be under a file;
#   - an import into a run directory holding another run's checkpoints
#     (`latest` stayed on them, and --resume continued that run), and an
#     output named step_N recording another step (import, synth --step).
# Inputs are synthesized and exported here: no training.
# tier: check
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
GPT="--layers 2 --dim 64 --heads 4 --vocab 250 --seq 32"
LLAMA="--arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --vocab 256 --seq 32"

expect_ok "synth a GPT-2" "$CK" synth -o "$WORK/gpt" --tp 1 --pp 1 $GPT
expect_ok "export it" "$CK" export "$WORK/gpt" --format safetensors -o "$WORK/hf"
expect_ok "export it sharded" "$CK" export "$WORK/gpt" --format safetensors --max-shard-size 64K -o "$WORK/hf-sharded"
expect_ok "the sharded export imports" "$CK" import "$WORK/hf-sharded" -o "$WORK/ok-sharded" --tp 2 --pp 1
expect_ok "synth a Llama" "$CK" synth -o "$WORK/llama" --tp 1 --pp 1 $LLAMA
expect_ok "export it" "$CK" export "$WORK/llama" --format safetensors -o "$WORK/hf-llama"

# A copy of a Hugging Face directory with config.json's text edited: sed
# keeps what Python's json would not (a key twice).
edited() { # NAME SOURCE SED-EXPRESSION
    cp -r "$2" "$WORK/$1"
    sed -i "$3" "$WORK/$1/config.json"
}

# --- Directories another reader reads differently.
cp -r "$WORK/hf-sharded" "$WORK/both"
cp "$WORK/hf/model.safetensors" "$WORK/both/"
expect_error "model.safetensors beside an index" 1 \
    "both holds both model.safetensors and model.safetensors.index.json .*transformers loads model.safetensors" \
    "$CK" import "$WORK/both" -o "$WORK/bad-both" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/bad-both" ]

"$PY" - "$WORK/hf-llama/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
assert "rope_theta" in c, sorted(c)
PYEOF
edited twice "$WORK/hf-llama" 's/"rope_theta":[^,}]*/"rope_theta": 10000, "rope_theta": 500000/'
check "the edited config.json holds rope_theta twice, Python reads 500000" "$PY" -c '
import json, sys
text = open(sys.argv[1]).read()
sys.exit(not (text.count("\"rope_theta\"") == 2 and json.loads(text)["rope_theta"] == 500000))' "$WORK/twice/config.json"
expect_error "a config.json key twice" 1 "twice/config.json: key rope_theta appears twice" \
    "$CK" import "$WORK/twice" -o "$WORK/bad-twice" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/bad-twice" ]

for factor in 0 -2; do
    "$PY" - "$WORK/hf-llama" "$WORK/factor$factor" "$factor" <<'PYEOF'
import json, shutil, sys
src, dst, factor = sys.argv[1], sys.argv[2], float(sys.argv[3])
shutil.copytree(src, dst)
c = json.load(open(dst + "/config.json"))
c["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}
json.dump(c, open(dst + "/config.json", "w"))
PYEOF
    expect_error "rope_scaling factor $factor" 1 "config.json: rope_scaling factor $factor: expected factor >= 1" \
        "$CK" import "$WORK/factor$factor" -o "$WORK/bad-factor$factor" --tp 1 --pp 1
done

# transformers 5 writes RoPE as rope_parameters (rope_theta inside it, no
# rope_scaling): the same model as version 4's spelling (rope_parameters was
# ignored: theta 10000, unscaled, imported without a word).
expect_ok "synth a Llama 3 of theta 500000 scaled by 32" "$CK" synth -o "$WORK/llama3" --tp 1 --pp 1 $LLAMA \
    --rope-theta 500000 --rope-scaling 32
expect_ok "export it (transformers 4's rope_theta and rope_scaling)" "$CK" export "$WORK/llama3" --format safetensors \
    -o "$WORK/hf-llama3"
"$PY" - "$WORK/hf-llama3" "$WORK/hf-llama3-v5" <<'PYEOF'
import json, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
c = json.load(open(sys.argv[2] + "/config.json"))
c["rope_parameters"] = dict(c.pop("rope_scaling"), rope_theta=c.pop("rope_theta"))
json.dump(c, open(sys.argv[2] + "/config.json", "w"))
PYEOF
for v in llama3 llama3-v5; do
    expect_ok "import the $v spelling" "$CK" import "$WORK/hf-$v" -o "$WORK/imp-$v" --tp 1 --pp 1
    expect_ok "its model" "$CK" info "$WORK/imp-$v" --json
    cp "$WORK/.out" "$WORK/imp-$v.json"
done
check "both spellings import the same model: theta 500000, scaled by 32" "$PY" -c '
import json, sys
a, b = (json.load(open(p))["model"] for p in sys.argv[1:3])
sys.exit(not (a == b and a["rope_theta"] == 500000 and a["rope_scaling"]["factor"] == 32))' \
    "$WORK/imp-llama3.json" "$WORK/imp-llama3-v5.json"
edited yarn "$WORK/hf-llama3-v5" 's/"rope_type": "llama3"/"rope_type": "yarn"/'
expect_error "a RoPE this Llama does not compute" 1 "config.json: rope_parameters: rope_type yarn" \
    "$CK" import "$WORK/yarn" -o "$WORK/bad-yarn" --tp 1 --pp 1

edited eps-string "$WORK/hf" 's/"layer_norm_epsilon":[^,}]*/"layer_norm_epsilon": "1e-5"/'
expect_error "layer_norm_epsilon as a string" 1 "config.json: layer_norm_epsilon is a string, not a number" \
    "$CK" import "$WORK/eps-string" -o "$WORK/bad-eps" --tp 1 --pp 1

: >"$WORK/plain-file"
expect_error "an output under a regular file" 1 "plain-file is a file, not a directory" \
    "$CK" import "$WORK/hf" -o "$WORK/plain-file/sub" --tp 1 --pp 1

# --- Outputs in run directories.
mkdir "$WORK/run"
expect_ok "another model's checkpoint at step 4" "$CK" synth -o "$WORK/run/step_00000004" --tp 1 --pp 1 $LLAMA --step 4
expect_error "import into a run directory holding another run's checkpoints" 2 \
    "run holds the checkpoints of a run \\(.*step_00000004\\): .*tp-train --resume would continue that run" \
    "$CK" import "$WORK/hf" -o "$WORK/run/step_00000000" --tp 1 --pp 1
check_all "nothing written, latest unchanged" \
    '[ ! -e "$WORK/run/step_00000000" ] && [ "$(cat "$WORK/run/latest")" = step_00000004 ]'
expect_error "import named step_N inside a checkpoint" 2 "gpt is a checkpoint, not a run directory" \
    "$CK" import "$WORK/hf" -o "$WORK/gpt/step_00000000" --tp 1 --pp 1
check "nothing written into it" [ ! -e "$WORK/gpt/step_00000000" ]
mkdir "$WORK/fresh"
expect_error "import named for a step it does not record" 2 \
    "step_00000007 is named for step 7, but the checkpoint records step 0: .*name it .*fresh/step_00000000" \
    "$CK" import "$WORK/hf" -o "$WORK/fresh/step_00000007" --tp 1 --pp 1
check "nothing written for it" [ ! -e "$WORK/fresh/step_00000007" ]
expect_ok "import into an empty run directory" "$CK" import "$WORK/hf" -o "$WORK/fresh/step_00000000" --tp 1 --pp 1
check "it is latest" [ "$(cat "$WORK/fresh/latest")" = step_00000000 ]
expect_ok "--force replaces the import, the run's only checkpoint" \
    "$CK" import "$WORK/hf" -o "$WORK/fresh/step_00000000" --tp 2 --pp 1 --force
expect_error "synth named for a step it does not record" 2 "step_00000005 is named for step 5, but the checkpoint records step 3" \
    "$CK" synth -o "$WORK/fresh/step_00000005" --tp 1 --pp 1 $GPT --step 3
check "nothing written for it" [ ! -e "$WORK/fresh/step_00000005" ]

finish
