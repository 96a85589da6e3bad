#!/bin/sh
# Hostile and odd inputs to the real programs: crafted index.json files
# (shapes and padding units whose arithmetic overflows int64, a checksum block
# above the rows, a NUL in a name, a file past its size limit, 30 MB of
# numbers), FIFOs named index.json, a shard, latest, config.json and
# model.safetensors, crafted safetensors (a NUL in a name, a header past the
# limit) and an index of 60,000 files. tp-ckpt info and verify, tp-reshard and
# tp-ckpt import must each exit 1 with one error line naming the file or the
# tensor: never a signal, a hang (timeout 20) or gigabytes of memory.
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"

CKPT="$BIN/tp-ckpt"
RESHARD="$BIN/tp-reshard"
T="timeout 20"
# The most memory refusing 30 MB of JSON may take (AddressSanitizer keeps freed
# memory in quarantine).
MAX_MB=300
[ "${SANITIZED:-0}" = 1 ] && MAX_MB=600
# peak_mb CMD...: the peak resident memory of CMD in MB (its exit status ignored).
peak_mb() {
    "$PY" -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' "$@"
}

"$CKPT" synth -o "$WORK/ck" --tp 2 --pp 1 --layers 1 --dim 8 --heads 2 --vocab 16 --seq 8 >/dev/null ||
    { echo "synth failed" >&2; exit 1; }
"$CKPT" synth -o "$WORK/ck16" --tp 16 --pp 1 --layers 1 --dim 16 --heads 16 --vocab 16 --seq 8 >/dev/null ||
    { echo "synth --tp 16 failed" >&2; exit 1; }
"$CKPT" export "$WORK/ck" --format safetensors -o "$WORK/hf" >/dev/null || { echo "export failed" >&2; exit 1; }

# craft NAME PYTHON [SOURCE]: a copy of the checkpoint (ck, the tp2 one, by
# default) whose index.json (d, a dict) the Python statements change.
craft() {
    rm -rf "$WORK/$1"
    cp -r "$WORK/${3:-ck}" "$WORK/$1"
    "$PY" - "$WORK/$1/index.json" "$2" "$ROOT/tests/support" <<'PYEOF'
import json, sys
sys.path.insert(0, sys.argv[3])
import index_seal
path, code = sys.argv[1], sys.argv[2]
d = json.load(open(path))
t = {x["name"]: x for x in d["tensors"]}
exec(code)
index_seal.dump(d, path)  # the deeper check must answer, not the index's seal
PYEOF
}

# refused NAME PATTERN: info, verify and reshard of $WORK/NAME each exit 1
# with one line matching PATTERN.
refused() {
    expect_error "$1: info" 1 "$2" $T "$CKPT" info "$WORK/$1"
    # verify reports every damaged file, then the count: two lines or more.
    run $T "$CKPT" verify "$WORK/$1"
    refused_pattern=$2
    check_all "$1: verify (exit $RC)" '[ "$RC" -eq 1 ] && grep -Eq -- "$refused_pattern" "$WORK/.err"'
    expect_error "$1: reshard" 1 "$2" $T "$RESHARD" "$WORK/$1" --to tp1 -o "$WORK/$1.out" --threads 1
    check "$1: reshard leaves no output" test ! -e "$WORK/$1.out"
}

expect_ok "the intact checkpoint verifies" $T "$CKPT" verify "$WORK/ck"

# --- sizes whose arithmetic overflows (SIGFPE in every reader before)
craft shape 't["model/tok_embed.weight"]["shape"] = [2**40, 2**40]; t["model/tok_embed.weight"]["partition"]["segments"] = [2**40]'
refused shape 'index\.json.*model/tok_embed\.weight'
craft dims 't["model/final_norm.weight"]["shape"] = [2**40, 8, 8, 8, 8, 8, 8, 8]'
refused dims 'index\.json.*model/final_norm\.weight'
craft padding 'e = t["model/tok_embed.weight"]; e["shape"] = [2**40, 8]; e["partition"].update(segments=[2**40], granule=2**40, pad_multiple=2**20)'
refused padding 'index\.json.*model/tok_embed\.weight'
# tp 16 x pad multiple 2^20 x granule 2^40 = 2^64 wraps to 0: SIGFPE before the fix
craft padding16 'e = t["model/tok_embed.weight"]; e["shape"] = [2**40, 16]; e["partition"].update(segments=[2**40], granule=2**40, pad_multiple=2**20)' ck16
refused padding16 'index\.json.*model/tok_embed\.weight.*padding unit'
craft bigsegs 'e = t["model/tok_embed.weight"]; e["partition"]["segments"] = [2**52, 2**52]'
refused bigsegs 'index\.json.*model/tok_embed\.weight'

# --- a checksum block above the rows (verify tried a 128 TiB allocation)
craft blockrows 't["model/tok_embed.weight"]["checksum_block_rows"] = 2**40'
refused blockrows 'model/tok_embed\.weight.*checksum_block_rows'

# --- a NUL in a name (read as its prefix)
craft nul 't["model/final_norm.bias"]["name"] = "model/final_norm\0bias"'
refused nul 'index\.json.*NUL'

# --- index.json past its size limit (sparse), and 30 MB of small numbers
rm -rf "$WORK/huge" && cp -r "$WORK/ck" "$WORK/huge" && truncate -s 300M "$WORK/huge/index.json"
refused huge 'index\.json.*too large'
rm -rf "$WORK/numbers" && cp -r "$WORK/ck" "$WORK/numbers"
"$PY" -c 'import sys; open(sys.argv[1], "w").write("[" + "1," * (15 << 20) + "1]")' "$WORK/numbers/index.json"
refused numbers 'index\.json.*memory'
mb=$(peak_mb "$CKPT" info "$WORK/numbers")
check "30 MB of numbers as index.json: refused in $mb MB (cJSON alone took 1.2 GB)" test "$mb" -lt "$MAX_MB"

# --- FIFOs where files are read (every tool blocked forever)
rm -rf "$WORK/fifo_index" && cp -r "$WORK/ck" "$WORK/fifo_index" && rm "$WORK/fifo_index/index.json" &&
    mkfifo "$WORK/fifo_index/index.json"
refused fifo_index 'index\.json.*FIFO'
rm -rf "$WORK/fifo_shard" && cp -r "$WORK/ck" "$WORK/fifo_shard" && rm "$WORK/fifo_shard/shard_pp00_tp01.h5" &&
    mkfifo "$WORK/fifo_shard/shard_pp00_tp01.h5"
refused fifo_shard 'shard_pp00_tp01\.h5'
# latest as a FIFO: passed over for the newest step, or refused by name; never a hang.
mkdir -p "$WORK/run" && cp -r "$WORK/ck" "$WORK/run/step_00000001" && mkfifo "$WORK/run/latest"
run $T "$CKPT" info "$WORK/run"
if [ "$RC" -eq 0 ] || { [ "$RC" -eq 1 ] && grep -q latest "$WORK/.err"; }; then pass
else failed "a FIFO named latest: exit $RC"; fi

# --- safetensors import
import_refused() {
    expect_error "$1: import" 1 "$2" $T "$CKPT" import "$WORK/$1" -o "$WORK/$1.ckpt" --tp 1 --pp 1 --threads 1
    check "$1: import leaves no output" test ! -e "$WORK/$1.ckpt"
}
expect_ok "the export imports" $T "$CKPT" import "$WORK/hf" -o "$WORK/hf.ckpt" --tp 1 --pp 1 --threads 1

# header: a name escaping a NUL
rm -rf "$WORK/st_nul" && cp -r "$WORK/hf" "$WORK/st_nul"
"$PY" - "$WORK/st_nul/model.safetensors" <<'PYEOF'
import json, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = int.from_bytes(b[:8], "little")
h = json.loads(b[8:8 + n])
h["transformer.wpe\0weight"] = h.pop("transformer.wpe.weight")  # written as \u0000
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(len(t).to_bytes(8, "little") + t + b[8 + n:])
PYEOF
import_refused st_nul 'model\.safetensors.*NUL'

# header length past the limit (100 MB, what the reference allows; sparse)
rm -rf "$WORK/st_big" && cp -r "$WORK/hf" "$WORK/st_big"
"$PY" -c 'import sys; f = open(sys.argv[1], "wb"); f.write((100000000).to_bytes(8, "little")); f.truncate(8 + 100000000)' \
    "$WORK/st_big/model.safetensors"
import_refused st_big 'model\.safetensors.*100000000'

# a header of 30 MB of small numbers
rm -rf "$WORK/st_numbers" && cp -r "$WORK/hf" "$WORK/st_numbers"
"$PY" -c 'import sys; h = ("[" + "1," * (15 << 20) + "1]").encode(); open(sys.argv[1], "wb").write(len(h).to_bytes(8, "little") + h)' \
    "$WORK/st_numbers/model.safetensors"
import_refused st_numbers 'model\.safetensors.*memory'
mb=$(peak_mb "$CKPT" import "$WORK/st_numbers" -o "$WORK/st_numbers.ckpt" --tp 1 --pp 1 --threads 1)
check "a header of 30 MB of numbers: refused in $mb MB (cJSON alone took 1.2 GB)" test "$mb" -lt "$MAX_MB"

# FIFOs: model.safetensors, config.json
rm -rf "$WORK/st_fifo" && cp -r "$WORK/hf" "$WORK/st_fifo" && rm "$WORK/st_fifo/model.safetensors" &&
    mkfifo "$WORK/st_fifo/model.safetensors"
import_refused st_fifo 'model\.safetensors.*FIFO'
rm -rf "$WORK/cfg_fifo" && cp -r "$WORK/hf" "$WORK/cfg_fifo" && rm "$WORK/cfg_fifo/config.json" &&
    mkfifo "$WORK/cfg_fifo/config.json"
import_refused cfg_fifo 'config\.json.*FIFO'

# config.json naming 100,000 layers of dimension 65536 over 16 tensors (2 GB
# of catalogue before the mismatch was found)
rm -rf "$WORK/cfg_layers" && cp -r "$WORK/hf" "$WORK/cfg_layers"
"$PY" - "$WORK/cfg_layers/config.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
d.update(n_layer=100000, n_embd=65536, n_head=1, vocab_size=262144)
json.dump(d, open(sys.argv[1], "w"))
PYEOF
import_refused cfg_layers 'config\.json.*100000 layers'
mb=$(peak_mb "$CKPT" import "$WORK/cfg_layers" -o "$WORK/cfg_layers.ckpt" --tp 1 --pp 1 --threads 1)
check "config.json of 100,000 layers: refused in $mb MB" test "$mb" -lt "$MAX_MB"

# an index of 60,000 files (48 s before): refused at once, naming the first missing one
rm -rf "$WORK/st_many" && cp -r "$WORK/hf" "$WORK/st_many" && rm "$WORK/st_many/model.safetensors"
"$PY" -c '
import json, sys
m = {"h.%d.w" % i: "model-%05d-of-60000.safetensors" % i for i in range(60000)}
json.dump({"metadata": {}, "weight_map": m}, open(sys.argv[1], "w"))' "$WORK/st_many/model.safetensors.index.json"
start=$(date +%s)
import_refused st_many 'model-00000-of-60000\.safetensors'
check "an index of 60,000 files is refused within 10 s" test $(($(date +%s) - start)) -le 10

finish
