#!/bin/sh
# tp-ckpt end to end: synthesize, inspect, verify, read back independently,
# compare across layouts, corrupt, crash mid-commit, and bad input.
# tier: check
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
MODEL="--layers 4 --dim 64 --heads 4 --vocab 1000 --seq 32"

# ---------------------------------------------------------------- basics
expect_ok "synth tp2pp2" "$CK" synth -o "$WORK/a" --tp 2 --pp 2 $MODEL --optim --step 7 --seed 11
expect_ok "info" "$CK" info "$WORK/a"
check "info shows the layout" grep -q "tp=2 pp=2" "$WORK/.out"
check "info lists a fused qkv weight" grep -q "model/layers.3.attn.qkv.weight" "$WORK/.out"
expect_ok "info --json" "$CK" info "$WORK/a" --json
check "info --json gives each key once" json_keys_once "$WORK/.out"
check "info --json has tp, pp, step, model, tensors" "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["tp"] == 2 and j["pp"] == 2 and j["step"] == 7, j
assert j["model"]["layers"] == 4 and j["model"]["dim"] == 64
names = {t["name"] for t in j["tensors"]}
assert "model/tok_embed.weight" in names and "optim/exp_avg_sq/layers.0.mlp.fc.weight" in names
assert len(j["tensors"]) == 3 * (4 + 12 * 4)
' "$WORK/.out"
expect_ok "verify" "$CK" verify "$WORK/a"
check "verify reports ok" grep -q "^ok:" "$WORK/.out"
expect_ok "help" "$CK" --help
expect_ok "synth --help" "$CK" synth --help

# ------------------------------------------- independent reader (h5py)
expect_ok "h5py reads fp32 tp2pp2 with optimizer" "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/a" --synth-seed 11
expect_ok "synth bf16 GQA SwiGLU padded, zstd" "$CK" synth -o "$WORK/b" --tp 4 --pp 2 --layers 4 --dim 128 \
    --heads 8 --kv-heads 4 --swiglu --ffn 96 --vocab 1001 --vocab-pad-multiple 8 --seq 16 --optim --dtype bf16 \
    --seed 5 --compress zstd:5
expect_ok "h5py reads bf16 + zstd chunks (decoded with python zstandard)" "$PY" "$ROOT/tests/ckpt/check_h5py.py" \
    "$WORK/b" --synth-seed 5
expect_ok "synth fp16 tp1" "$CK" synth -o "$WORK/c" --tp 1 --pp 1 --layers 2 --dim 32 --heads 2 --vocab 77 --seq 8 \
    --dtype fp16 --seed 3
expect_ok "h5py reads fp16" "$PY" "$ROOT/tests/ckpt/check_h5py.py" "$WORK/c" --synth-seed 3
expect_ok "verify compressed" "$CK" verify "$WORK/b"

# ------------------------------------------------------- logical diff
expect_ok "synth the same model at tp1pp1" "$CK" synth -o "$WORK/a1" --tp 1 --pp 1 $MODEL --optim --step 7 --seed 11
expect_ok "diff across layouts is bit-exact" "$CK" diff "$WORK/a" "$WORK/a1"
check "diff says bit-exact" grep -q "bit-exact" "$WORK/.out"
expect_ok "synth another seed" "$CK" synth -o "$WORK/a2" --tp 2 --pp 1 $MODEL --optim --seed 12
expect_error "diff of different values exits 1" 1 "checkpoints differ" "$CK" diff "$WORK/a" "$WORK/a2"
check "diff lists the worst tensors" grep -q "model/" "$WORK/.out"
# A difference is never also called equal: the summary line "equal: N
# tensors ..." followed the table of differing tensors (and the damaged
# diffs' errors below) when the Megatron note joined the verdicts.
check "a diff that differs does not say equal" sh -c '! grep -q "^equal" "$1"' _ "$WORK/.out"
expect_error "diff out of --tol exits 1" 1 "checkpoints differ" "$CK" diff "$WORK/a" "$WORK/a2" --tol 1e-3
check "and does not say equal within tolerance" sh -c '! grep -q "^equal" "$1"' _ "$WORK/.out"
expect_ok "diff within a loose tolerance" "$CK" diff "$WORK/a" "$WORK/a2" --tol 10
expect_ok "synth without optimizer" "$CK" synth -o "$WORK/a3" --tp 2 --pp 2 $MODEL --seed 11
expect_error "diff notices missing tensors" 1 "in one only" "$CK" diff "$WORK/a" "$WORK/a3"
check "diff names a missing tensor" grep -q "only in A: optim/" "$WORK/.out"

# Values a tolerance must not take in: one element (777 of GPT-2's c_attn,
# [8, 9] there, [9, 8] in this model's qkv) set to 1, +inf, -inf, NaN, +0
# and -0 through a Hugging Face export changed and imported back (with
# --allow-nonfinite: import refuses NaN and infinities otherwise). An
# infinity's relative scale is infinite: --tol once called inf equal to 1.
expect_ok "synth a small fp32 GPT" "$CK" synth -o "$WORK/v" --tp 1 --pp 1 --layers 1 --dim 32 --heads 2 --vocab 64 --seq 16
expect_ok "its export" "$CK" export "$WORK/v" --format safetensors -o "$WORK/v.hf"
for value in one:1.0 inf:inf ninf:-inf nan:nan pz:0.0 nz:-0.0; do
    name=${value%%:*}
    mkdir -p "$WORK/v_$name.hf"
    cp "$WORK/v.hf/config.json" "$WORK/v_$name.hf/"
    expect_ok "element 777 set to ${value#*:}" "$PY" - "$WORK/v.hf/model.safetensors" "$WORK/v_$name.hf/model.safetensors" \
        "${value#*:}" <<'PYEOF'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
size = struct.unpack("<Q", raw[:8])[0]
info = json.loads(raw[8:8 + size])["transformer.h.0.attn.c_attn.weight"]
assert info["dtype"] == "F32" and info["shape"] == [32, 96], info
at = 8 + size + info["data_offsets"][0] + 777 * 4
raw[at:at + 4] = struct.pack("<f", float(sys.argv[3]))
open(sys.argv[2], "wb").write(raw)
PYEOF
    expect_ok "imported" "$CK" import "$WORK/v_$name.hf" --tp 1 --pp 1 -o "$WORK/v_$name" --allow-nonfinite
done
expect_error "+inf against 1 with --tol 1e-3: a difference" 1 "checkpoints differ" "$CK" diff "$WORK/v_inf" "$WORK/v_one" \
    --tol 1e-3
check_all "the table gives inf, and where and both values as stored" \
    'grep -Eq "^model/layers.0.attn.qkv.weight +1 +3072 +inf +inf$" "$WORK/.out" &&
     grep -q "^    largest at \[9, 8\]: A inf (0x7f800000) fp32, B 1 (0x3f800000) fp32$" "$WORK/.out"'
expect_error "+inf against -inf with --tol 1" 1 "checkpoints differ" "$CK" diff "$WORK/v_inf" "$WORK/v_ninf" --tol 1
expect_error "NaN against +inf with --atol 1" 1 "checkpoints differ" "$CK" diff "$WORK/v_nan" "$WORK/v_inf" --atol 1
expect_error "NaN against 1 with --tol 1" 1 "checkpoints differ" "$CK" diff "$WORK/v_nan" "$WORK/v_one" --tol 1
expect_ok "+inf against itself: equal, bit-exact" "$CK" diff "$WORK/v_inf" "$WORK/v_inf"
expect_ok "NaN against itself (the same bits) with a tolerance: equal" "$CK" diff "$WORK/v_nan" "$WORK/v_nan" --tol 1e-3
expect_error "+0 against -0: bit-exact by default, a difference" 1 "checkpoints differ" "$CK" diff "$WORK/v_pz" "$WORK/v_nz"
check "both zeros shown by their bits" grep -q "A 0 (0x00000000) fp32, B -0 (0x80000000) fp32" "$WORK/.out"
expect_ok "with a tolerance they are equal" "$CK" diff "$WORK/v_pz" "$WORK/v_nz" --atol 1e-30
check "within tolerance" grep -q "within tolerance" "$WORK/.out"
expect_ok "1 against the original value within --tol 10" "$CK" diff "$WORK/v_one" "$WORK/v" --tol 10
# Another stored dtype is said: bf16 widened to fp32 is bit-exact as values.
expect_ok "synth bf16" "$CK" synth -o "$WORK/vb" --tp 1 --pp 1 --layers 1 --dim 32 --heads 2 --vocab 64 --seq 16 --dtype bf16
expect_ok "resharded to fp32 at tp2" "$BIN/tp-reshard" "$WORK/vb" --to tp2 --dtype fp32 -o "$WORK/vb32"
expect_ok "diff: equal as values" "$CK" diff "$WORK/vb" "$WORK/vb32"
check_all "and it says the dtypes differ" \
    'grep -q "^note: 16 tensors stored in other dtypes (model/tok_embed.weight: bf16 in A, fp32 in B), compared as fp32 values$" "$WORK/.out" &&
     grep -q "^equal: 16 tensors, .*, bit-exact$" "$WORK/.out"'
expect_ok "diff of the same dtypes" "$CK" diff "$WORK/vb" "$WORK/vb"
check "says nothing of dtypes" sh -c '! grep -q "other dtypes" "$1"' sh "$WORK/.out"

# ------------------------------------------------------ one flipped byte
cp -r "$WORK/a" "$WORK/damaged"
SHARD="$WORK/damaged/shard_pp01_tp01.h5"
OFFSET=$(data_offset "$SHARD" "model/layers.3.mlp.fc.weight")
flip_byte "$SHARD" $((OFFSET + 1000))
run "$CK" verify "$WORK/damaged"
check "verify of a flipped byte exits 1" [ "$RC" -eq 1 ]
check "verify names the damaged tensor and file" \
    grep -q "shard_pp01_tp01.h5: tensor model/layers.3.mlp.fc.weight piece 1" "$WORK/.err"
check "verify reports only that piece" grep -q "1 of 231 pieces damaged" "$WORK/.err"
# Damage is an error, not a difference: two copies damaged alike were
# "checkpoints differ".
run "$CK" diff "$WORK/a" "$WORK/damaged"
check_all "diff of damaged data: exit 1, the tensor not compared and why, no difference claimed (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -q "^tp-ckpt: error: model/layers.3.mlp.fc.weight not compared: .*checksum" "$WORK/.err" &&
    grep -q "^tp-ckpt: error: 1 of [0-9]* common tensors could not be read" "$WORK/.err" &&
    ! grep -q "differ" "$WORK/.err" && ! grep -q "equal" "$WORK/.out" "$WORK/.err"'
cp -r "$WORK/damaged" "$WORK/damaged2"
run "$CK" diff "$WORK/damaged" "$WORK/damaged2"
check_all "diff of two copies damaged alike: an error, not a difference (exit $RC)" '[ "$RC" -eq 1 ] &&
    grep -q "could not be read" "$WORK/.err" && ! grep -q "differ" "$WORK/.err" && ! grep -q "equal" "$WORK/.out" "$WORK/.err"'
expect_ok "synth a wider model" "$CK" synth -o "$WORK/wide" --tp 2 --pp 2 --layers 4 --dim 128 --heads 4 --vocab 1000 \
    --seq 32 --optim --step 7 --seed 11
expect_error "diff of other shapes: a difference" 1 "checkpoints differ" "$CK" diff "$WORK/a" "$WORK/wide"
check "diff gives both shapes" grep -Eq "^model/tok_embed.weight +shape \[1000, 64\] in A, \[1000, 128\] in B" "$WORK/.out"
check "and does not say equal" sh -c '! grep -q "^equal" "$1"' _ "$WORK/.out"

# Random flips anywhere (data, HDF5 metadata, index): a clean verdict, never a crash.
i=0
while [ $i -lt 20 ]; do
    rm -rf "$WORK/fuzz" && cp -r "$WORK/a" "$WORK/fuzz"
    TARGET=$("$PY" -c 'import random, glob, sys; random.seed(int(sys.argv[2])); print(random.choice(sorted(glob.glob(sys.argv[1] + "/*"))))' "$WORK/fuzz" $i)
    SIZE=$(stat -c %s "$TARGET")
    flip_byte "$TARGET" $(( (i * 7919 + 13) * 104729 % SIZE ))
    run "$CK" verify "$WORK/fuzz"
    if [ "$RC" -gt 1 ]; then failed "verify after a random flip in $(basename "$TARGET") exited $RC"; else pass; fi
    if grep -v '^tp-ckpt: ' "$WORK/.err" | grep -q .; then failed "stray output after a random flip"; else pass; fi
    i=$((i + 1))
done

# ----------------------------------------------- crash (SIGKILL) mid-commit
RUN="$WORK/run"
mkdir -p "$RUN"
expect_ok "first checkpoint of a run" "$CK" synth -o "$RUN/step_00000010" --tp 2 --pp 1 $MODEL --optim --step 10
BEFORE=$(tree_digest "$RUN/step_00000010")
for point in before-index before-rename before-latest; do
    rm -rf "$RUN/step_00000020"
    TP_CKPT_FAULT=$point "$CK" synth -o "$RUN/step_00000020" --tp 2 --pp 1 $MODEL --optim --step 20 >/dev/null 2>&1
    RC=$?
    check "killed at $point" [ "$RC" -eq 137 ]
    check "previous checkpoint untouched after a kill at $point" [ "$(tree_digest "$RUN/step_00000010")" = "$BEFORE" ]
    run "$CK" info "$RUN" --json
    check "the run still resolves to step 10 after a kill at $point" grep -q '"step":	10' "$WORK/.out"
    expect_ok "the run verifies after a kill at $point" "$CK" verify "$RUN"
done
check "a kill after the rename leaves a complete new checkpoint" [ -f "$RUN/step_00000020/index.json" ]
expect_ok "which verifies" "$CK" verify "$RUN/step_00000020"
TP_CKPT_FAULT=before-rename "$CK" synth -o "$RUN/step_00000010" --force --tp 1 --pp 1 $MODEL --step 10 >/dev/null 2>&1
check "an interrupted --force replacement keeps the old checkpoint" \
    [ "$(tree_digest "$RUN/step_00000010")" = "$BEFORE" ]
rm -rf "$RUN/step_00000020"
expect_ok "writing again after interrupted attempts" "$CK" synth -o "$RUN/step_00000030" --tp 2 --pp 1 $MODEL --step 30
run "$CK" info "$RUN" --json
check "latest moved to the new checkpoint" grep -q '"step":	30' "$WORK/.out"
check "a successful write leaves no staging directory" [ ! -e "$RUN/.step_00000030.staging" ]

# Kills at random moments of a larger write: the run always resolves and verifies.
for delay in 0.05 0.15 0.3 0.6; do
    "$CK" synth -o "$RUN/step_00000040" --force --tp 2 --pp 2 --layers 4 --dim 512 --heads 8 --vocab 8000 --seq 64 \
        --optim --step 40 >/dev/null 2>&1 &
    PID=$!
    sleep $delay
    kill -9 $PID 2>/dev/null
    wait $PID 2>/dev/null
    expect_ok "the run verifies after a kill at ${delay}s" "$CK" verify "$RUN"
done

# ------------------------------------------------------------ bad input
cp -r "$WORK/a" "$WORK/missing" && rm "$WORK/missing/shard_pp00_tp01.h5"
run "$CK" verify "$WORK/missing"
check_all "missing shard: exit 1, the file named, its pieces counted (exit $RC)" '[ "$RC" -eq 1 ] &&
    grep -q "^tp-ckpt: damaged: .*shard_pp00_tp01.h5: shard file missing" "$WORK/.err" &&
    grep -Eq "^tp-ckpt: error: .*/missing: [0-9]+ of 231 pieces damaged" "$WORK/.err"'
expect_error "info on a missing shard" 1 "shard_pp00_tp01.h5" "$CK" info "$WORK/missing"
cp -r "$WORK/a" "$WORK/truncated" && truncate -s -100 "$WORK/truncated/shard_pp01_tp00.h5"
run "$CK" verify "$WORK/truncated"
check_all "truncated shard: exit 1, the file named (exit $RC)" '[ "$RC" -eq 1 ] &&
    grep -q "^tp-ckpt: damaged: .*shard_pp01_tp00.h5: .*truncated" "$WORK/.err"'
# Every damaged file reported, not the first alone: one missing, one cut
# short, one with a flipped data byte (verify stopped at the missing one).
cp -r "$WORK/a" "$WORK/several" && rm "$WORK/several/shard_pp00_tp01.h5" &&
    truncate -s -100 "$WORK/several/shard_pp01_tp00.h5" &&
    flip_byte "$WORK/several/shard_pp01_tp01.h5" $((OFFSET + 1000))
run "$CK" verify "$WORK/several"
check_all "verify of three damaged files reports the three, each once (exit $RC)" '[ "$RC" -eq 1 ] &&
    [ "$(grep -c "shard_pp00_tp01.h5: shard file missing" "$WORK/.err")" -eq 1 ] &&
    [ "$(grep -c "shard_pp01_tp00.h5: .*truncated" "$WORK/.err")" -eq 1 ] &&
    [ "$(grep -c "shard_pp01_tp01.h5: tensor model/layers.3.mlp.fc.weight piece 1" "$WORK/.err")" -eq 1 ] &&
    [ "$(grep -c "^tp-ckpt: damaged: " "$WORK/.err")" -eq 3 ]'
expect_error "info still fails at the first missing file" 1 "shard_pp00_tp01.h5: shard file missing" \
    "$CK" info "$WORK/several"
cp -r "$WORK/a" "$WORK/future" && sed -i 's/"format_version":\t\[1, [0-9]*\]/"format_version":\t[7, 1]/' "$WORK/future/index.json"
expect_error "future major version" 1 "version 7.1 is newer than this build reads" "$CK" info "$WORK/future"
cp -r "$WORK/a" "$WORK/minor" && sed -i 's/"format_version":\t\[1, [0-9]*\]/"format_version":\t[1, 9]/' "$WORK/minor/index.json"
"$PY" "$ROOT/tests/support/index_seal.py" "$WORK/minor/index.json"
expect_ok "a newer minor version still reads" "$CK" verify "$WORK/minor"
# The index's own checksum (format 1.3): a field changed by hand, such as
# the step a resume goes on from, is refused naming the index; an index of
# 1.2, which has none, still reads.
cp -r "$WORK/a" "$WORK/restep" && sed -i '0,/"step":\t[0-9]*/s//"step":\t12345/' "$WORK/restep/index.json"
check "the step was changed" grep -q '"step":.12345' "$WORK/restep/index.json"
expect_error "a changed step is refused by the index's checksum" 1 \
    "restep/index.json: the index's text has checksum [0-9a-f]{16}, its index_checksum says [0-9a-f]{16}" \
    "$CK" info "$WORK/restep"
cp -r "$WORK/a" "$WORK/v12" && "$PY" - "$WORK/v12/index.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
del d["index_checksum"]
d["format_version"] = [1, 2]
json.dump(d, open(sys.argv[1], "w"))
PYEOF
expect_ok "an index of format 1.2 (no checksum of its own) still reads" "$CK" verify "$WORK/v12"
cp -r "$WORK/a" "$WORK/unsealed" && "$PY" - "$WORK/unsealed/index.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
del d["index_checksum"]
json.dump(d, open(sys.argv[1], "w"))
PYEOF
expect_error "an index of 1.3 without its checksum is refused" 1 "unsealed/index.json: no index_checksum" \
    "$CK" verify "$WORK/unsealed"
cp -r "$WORK/a" "$WORK/wrong" && sed -i 's/"format_version":\t\[1, [0-9]*\]/"format_version":\t[0, 3]/' "$WORK/wrong/index.json"
expect_error "version 0 is not valid" 1 "version 0.3 is not valid" "$CK" info "$WORK/wrong"
cp -r "$WORK/a" "$WORK/garbled" && printf 'garbage' >"$WORK/garbled/index.json"
expect_error "garbled index" 1 "index.json: not a JSON object" "$CK" verify "$WORK/garbled"
mkdir -p "$WORK/empty"
expect_error "a directory that is not a checkpoint" 1 "is not a checkpoint" "$CK" info "$WORK/empty"
expect_error "a file that is not a checkpoint" 1 "not a directory" "$CK" info "$WORK/empty/../a/index.json"
expect_error "no such path" 1 "no such checkpoint" "$CK" verify "$WORK/nowhere"
BEFORE=$(tree_digest "$WORK/a")
expect_error "existing output without --force" 1 "already exists.*--force" "$CK" synth -o "$WORK/a" --tp 1 --pp 1 $MODEL
check "the existing checkpoint is untouched" [ "$(tree_digest "$WORK/a")" = "$BEFORE" ]
expect_error "heads not divisible by tp" 1 "heads 4 is not divisible by tp 8" \
    "$CK" synth -o "$WORK/bad1" --tp 8 --pp 1 $MODEL
check "no output for an impossible layout" [ ! -e "$WORK/bad1" ]
expect_error "layers not divisible by pp" 1 "layers 4 is not divisible by pp 3" \
    "$CK" synth -o "$WORK/bad2" --tp 1 --pp 3 $MODEL
expect_error "kv heads neither dividing nor divided by tp" 1 "kv_heads 4 over tp 6: neither divides the other" \
    "$CK" synth -o "$WORK/bad3" --tp 6 --pp 1 --layers 2 --dim 96 --heads 12 --kv-heads 4 --ffn 12 --vocab 10 --seq 4
expect_error "missing parent directory" 1 "parent directory .* does not exist" \
    "$CK" synth -o "$WORK/no/such/dir" --tp 1 --pp 1 $MODEL
: >"$WORK/a-file"
expect_error "a parent that is a file" 1 "a-file is a file, not a directory" \
    "$CK" synth -o "$WORK/a-file/sub" --tp 1 --pp 1 $MODEL
expect_error "unknown command" 2 "unknown command" "$CK" frobnicate
expect_error "bad number" 2 "--tp expects an integer" "$CK" synth -o "$WORK/x" --tp two $MODEL
expect_error "synth without a model shape" 2 "synth needs" "$CK" synth -o "$WORK/x"
expect_error "bad compression" 2 "--compress expects" "$CK" synth -o "$WORK/x" $MODEL --compress lz4

# A checkpoint given through a symbolic link is read where it leads (it was
# "cannot open to lock: Too many levels of symbolic links"), and held there:
# a replacement of the target waits for, or refuses, a reader that came
# through the link as any other.
expect_ok "a checkpoint to link to" "$CK" synth -o "$WORK/linked" --tp 2 --pp 1 $MODEL
ln -s "$WORK/linked" "$WORK/link"
expect_ok "info through a link" "$CK" info "$WORK/link"
expect_ok "verify through a link" "$CK" verify "$WORK/link"
expect_ok "reshard through a link" "$BIN/tp-reshard" "$WORK/link" --to tp1 -o "$WORK/from-link"
TP_CKPT_FAULT="before-rename:WAIT:$WORK/link.release" "$BIN/tp-reshard" "$WORK/link" --to tp1 -o "$WORK/from-link2" \
    >/dev/null 2>&1 &
reader=$!
wait_for "$WORK/link.release.held" 60
expect_error "the target replaced while read through the link: refused" 1 "linked is being read" \
    "$CK" synth -o "$WORK/linked" --tp 1 --pp 1 $MODEL --force
: >"$WORK/link.release"
wait $reader
check "the reader through the link finished (exit $?)" [ -d "$WORK/from-link2" ]

# An output path that is a symbolic link to nothing: refused before anything
# is written, naming the link and where it points (the output was written
# whole, then refused as "appeared while this output was written").
ln -s "$WORK/nowhere" "$WORK/dangling"
for force in "" --force; do
    expect_error "synth to a link to nothing ${force:-without --force}: refused" 1 \
        "dangling is a symbolic link \(to .*nowhere, which does not exist\); an output replaces no link" \
        "$CK" synth -o "$WORK/dangling" --tp 1 --pp 1 $MODEL $force
done
expect_error "tp-reshard to it: refused alike" 1 "dangling is a symbolic link \(to .*nowhere, which does not exist\)" \
    "$BIN/tp-reshard" "$WORK/linked" --to tp1 -o "$WORK/dangling"
expect_error "export to it: refused alike" 1 "dangling is a symbolic link \(to .*nowhere, which does not exist\)" \
    "$CK" export "$WORK/linked" --format safetensors -o "$WORK/dangling"
check_all "the link is left, nothing written, no staging left beside it" \
    '[ -L "$WORK/dangling" ] && [ ! -e "$WORK/nowhere" ] && ! ls -a "$WORK" | grep -q "dangling\."'

# What the system will not let this process read is said to be that, not
# damage nor a missing Megatron tracker: verify said "damaged ... N pieces
# damaged" of a shard it had no permission to open, and a directory it could
# not list was "cannot tell its checkpoint format: DIR/latest_checkpointed_iteration.txt".
# As another user (root reads anything): needs root and setpriv.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    expect_ok "a checkpoint to hide" "$CK" synth -o "$WORK/hidden" --tp 2 --pp 1 $MODEL
    chmod 755 "$WORK"
    chmod 000 "$WORK/hidden/shard_pp00_tp00.h5"
    run setpriv --reuid=65534 --regid=65534 --clear-groups "$CK" verify "$WORK/hidden"
    check_all "verify of a shard it may not open: unreadable, not damaged (exit $RC)" '[ "$RC" -eq 1 ] &&
        grep -q "^tp-ckpt: unreadable: .*shard_pp00_tp00.h5: cannot open: Permission denied" "$WORK/.err" &&
        grep -q "pieces could not be read (not known damaged)" "$WORK/.err" && ! grep -q "pieces damaged\|^tp-ckpt: damaged" "$WORK/.err"'
    chmod 644 "$WORK/hidden/shard_pp00_tp00.h5"
    chmod 000 "$WORK/hidden"
    expect_error "verify of a directory it may not read: said so" 1 "hidden: cannot read the directory: Permission denied" \
        setpriv --reuid=65534 --regid=65534 --clear-groups "$CK" verify "$WORK/hidden"
    chmod 755 "$WORK/hidden"
else
    echo "[SKIP] [$NAME] unreadable files: needs root and setpriv to read as another user"
fi

finish
