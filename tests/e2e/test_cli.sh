#!/bin/sh
# The command-line rules the programs share (docs/TOOLS.md "Numbers and
# sizes", programs/cli.c, common/parse.h), through the real programs:
#   - numbers are decimal: no blanks, no '+', no hexadecimal, inf or nan; a
#     subnormal number is taken, one out of a double's range is said to be;
#   - a SIZE is whole bytes, or of binary units K, M, G, T (then i, B): no
#     exponent, hexadecimal, sign, blanks or bits (1Gb);
#   - tp-ckpt export refuses an option of another format than --format's,
#     import, export and tp-reshard --true-vocab-size for a source not
#     Megatron's (legacy or torch_dist; exit 2, naming the option and what
#     it applies to);
#   - an empty -o (and copy's SRC or DST) is a usage error in every program;
#   - every long option of every command is in its --help and its synopsis
#     in docs/TOOLS.md, and every option a synopsis names is taken
#     (tests/support/documented_options.py), and the facts it checks beside:
#     tp-ckpt --help names every option of each subcommand, the TP_*
#     environment variables read are documented and those documented
#     exist, docs/FORMAT.md states the version written, README.md lists
#     the check tier.
# tier: check
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
TRAIN="$BIN/tp-train"

expect_ok "a tiny checkpoint" "$CK" synth -o "$WORK/ck" --tp 1 --pp 1 --model tiny
expect_ok "its Hugging Face export" "$CK" export "$WORK/ck" --format safetensors -o "$WORK/hf0"

# ------------------------------------------------------------ numbers
# Each was taken before: strtoll and strtod skip blanks and take '+' (and
# strtod hexadecimal, inf and nan).
expect_error "an integer with a leading blank" 2 "^tp-train: --steps expects an integer in 1\.\.[0-9]+, got ' 7'" \
    "$TRAIN" --model tiny --steps " 7"
expect_error "an integer with a trailing blank" 2 "--steps expects an integer .*, got '7 '" \
    "$TRAIN" --model tiny --steps "7 "
expect_error "an integer with a '+'" 2 "^tp-train generate: --tokens expects an integer in 0\.\.[0-9]+, got '\+5'" \
    "$TRAIN" generate --ckpt "$WORK/ck" --prompt ab --tokens +5
expect_error "an integer with a '+' (synth)" 2 "^tp-ckpt: --tp expects an integer in 1\.\.4096, got '\+1'" \
    "$CK" synth -o "$WORK/x" --tp +1 --pp 1 --model tiny
expect_error "a model size with a blank" 2 "--layers expects an integer in 1\.\.100000, got ' 2'" \
    "$CK" synth -o "$WORK/x" --tp 1 --pp 1 --model tiny --layers " 2"
# A value as a regular expression that matches it alone.
literal() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g'; }
for v in "+0.1" " 0.1" "0x1p-3" "inf" "nan"; do
    expect_error "--lr '$v'" 2 "^tp-train: --lr expects a non-negative decimal number such as 0\.5 or 3e-4, got '$(literal "$v")'" \
        "$TRAIN" --model tiny --lr "$v"
done
check "no output was written by a refused command" [ ! -e "$WORK/x" ]
# A subnormal number is a number (strtod's ERANGE refused it as "expects a
# non-negative number"); one beyond a double's range is said to be.
expect_ok "--lr 1e-320 (subnormal) trains" "$TRAIN" --model tiny --steps 1 --lr 1e-320 --quiet
expect_ok "--temperature 1e-320 (subnormal) samples" "$TRAIN" generate --ckpt "$WORK/ck" --prompt ab --tokens 3 \
    --temperature 1e-320
expect_ok "--tol 1e-320 (subnormal) compares" "$CK" diff "$WORK/ck" "$WORK/ck" --tol 1e-320
expect_error "--lr 1e-400: it would be 0" 2 "^tp-train: --lr 1e-400 is below the smallest number a double holds .*would be 0" \
    "$TRAIN" --model tiny --lr 1e-400
expect_error "--temperature 1e999: beyond a double" 2 "^tp-train generate: --temperature 1e999 is beyond the largest number a double holds" \
    "$TRAIN" generate --ckpt "$WORK/ck" --prompt ab --temperature 1e999
expect_error "--norm-eps in hexadecimal" 2 "--norm-eps expects a number in \(0, 1\), got '0x1p-17'" \
    "$CK" synth -o "$WORK/x" --tp 1 --pp 1 --model llama-tiny --norm-eps 0x1p-17

# -------------------------------------------------------------- sizes
# What a size reads as: tp-reshard --dry-run --json says its memory limit.
for pair in 1.5G:1610612736 2GiB:2147483648 4GB:4294967296 1g:1073741824 1536M:1610612736 \
    1073741824:1073741824 1073741824B:1073741824 0.5G:536870912; do
    text=${pair%%:*} bytes=${pair#*:}
    expect_ok "--memory-limit $text" "$RS" "$WORK/ck" --to tp1 -o "$WORK/never" --dry-run --json --memory-limit "$text"
    check "--memory-limit $text is $bytes bytes" grep -q "\"memory_limit\":[[:space:]]*$bytes," "$WORK/.out"
done
# Taken before: 1e3 as 1000 bytes, 0x10 as 16, 0x1p30 as 2^30, 1Gb as 1 GiB,
# "1 G" as 1 GiB, 1.5 as 1 byte, 0.1K as 102 bytes.
for v in 1e3 1e9 0x10 0x1p30 "1 G" " 1G" +1G; do
    expect_error "--memory-limit '$v'" 2 \
        "^tp-reshard: --memory-limit expects a size such as 4096, 512M, 1\.5G or 4GiB .*got '$(literal "$v")'" \
        "$RS" "$WORK/ck" --to tp1 -o "$WORK/x" --memory-limit "$v"
done
expect_error "--memory-limit 1Gb: bits" 2 "^tp-reshard: --memory-limit 1Gb: b is bits" \
    "$RS" "$WORK/ck" --to tp1 -o "$WORK/x" --memory-limit 1Gb
expect_error "--max-shard-size 1.5: a fraction of a byte" 2 "^tp-ckpt: --max-shard-size 1\.5 is not a whole number of bytes" \
    "$CK" export "$WORK/ck" --format safetensors -o "$WORK/x" --max-shard-size 1.5
expect_error "--max-shard-size 0.1K: 102.4 bytes" 2 "^tp-ckpt: --max-shard-size 0\.1K is not a whole number of bytes" \
    "$CK" export "$WORK/ck" --format safetensors -o "$WORK/x" --max-shard-size 0.1K
expect_error "--memory-per-rank past 2^63 bytes" 2 "--memory-per-rank 9000000T is more than the largest size" \
    "$BIN/tp-elastic" plan --world 2 --model tiny --global-batch 8 --memory-per-rank 9000000T
expect_error "a negative size (kept)" 2 "--memory-limit expects a size .*got '-1M'" \
    "$RS" "$WORK/ck" --to tp1 -o "$WORK/x" --memory-limit -1M
expect_error "a size of 0 bytes" 2 "--max-shard-size expects a size of at least 1 byte, got '0'" \
    "$CK" export "$WORK/ck" --format safetensors -o "$WORK/x" --max-shard-size 0
expect_ok "--max-shard-size 0.75K: 768 bytes" "$CK" export "$WORK/ck" --format safetensors -o "$WORK/hf" \
    --max-shard-size 0.75K
check "a shard of 768 bytes holds three 1-D tensors of 64 fp32 values (attn.c_proj.bias, ln_2.bias, ln_2.weight)" \
    "$PY" -c '
import json, sys
index = json.load(open(sys.argv[1] + "/model.safetensors.index.json"))
files = {}
for name, f in index["weight_map"].items():
    files.setdefault(f, []).append(name)
assert max(len(v) for v in files.values()) == 3, files
' "$WORK/hf"
check "no output was written by a refused command" [ ! -e "$WORK/x" ]

# ---------------------------------------- options that would be ignored
# Each was ignored with exit 0 (but --tokenizer).
for format in safetensors gguf hdf5; do
    [ $format = gguf ] || for option in "--name my-model" "--tokenizer $WORK/hf"; do
        expect_error "export --format $format ${option%% *}" 2 \
            "^tp-ckpt: ${option%% *} \(.*\) applies to --format gguf only, not $format \(see tp-ckpt export --help\)$" \
            "$CK" export "$WORK/ck" --format $format -o "$WORK/x" $option
    done
    [ $format = safetensors ] || expect_error "export --format $format --max-shard-size" 2 \
        "^tp-ckpt: --max-shard-size \(.*\) applies to --format safetensors only, not $format \(see tp-ckpt export --help\)$" \
        "$CK" export "$WORK/ck" --format $format -o "$WORK/x" --max-shard-size 1G
    expect_error "export --format $format --true-vocab-size of this toolkit's checkpoint" 2 \
        "^tp-ckpt: --true-vocab-size applies to a Megatron checkpoint \(legacy or torch_dist\), not to .*ck \(tp-toolkit\)" \
        "$CK" export "$WORK/ck" --format $format -o "$WORK/x" --true-vocab-size 200
done
check "no output was written by a refused export" [ ! -e "$WORK/x" ]
expect_ok "export --format gguf --name" "$CK" export "$WORK/ck" --format gguf -o "$WORK/m.gguf" --name my-model
check "the name is in the file" grep -q "my-model" "$WORK/m.gguf"
expect_error "import --true-vocab-size of a Hugging Face directory" 2 \
    "^tp-ckpt: --true-vocab-size applies to a Megatron checkpoint \(legacy or torch_dist\), not to .*hf \(a Hugging Face directory\)" \
    "$CK" import "$WORK/hf" -o "$WORK/x" --tp 1 --pp 1 --true-vocab-size 200
expect_error "tp-reshard --true-vocab-size of a PyTorch distributed checkpoint" 2 \
    "^tp-reshard: --true-vocab-size applies to a Megatron checkpoint \(legacy or torch_dist\), not to .*dcp/cols2 \(PyTorch distributed checkpoint\)" \
    "$BIN/tp-reshard" "$ROOT/tests/data/dcp/cols2" --to tp1 -o "$WORK/x" --true-vocab-size 200
check "nothing written for it" [ ! -e "$WORK/x" ]
for program in "$CK export" "$BIN/tp-reshard"; do
    case $program in *export) args="--format gguf" ;; *) args="--to tp1" ;; esac
    expect_error "${program##*/} --true-vocab-size of a mistyped path: no such checkpoint, not 'applies to'" 1 \
        "nothere: no such checkpoint" $program "$WORK/nothere" $args -o "$WORK/x" --true-vocab-size 200
done

# ------------------------------------------------------- rejected options
# A usage error of a tp-ckpt command points to that command's --help (its
# options are there, not in the program's), and names the option rejected:
# an unknown letter inside a cluster was '?'.
for command in info verify diff synth export import copy; do
    expect_error "tp-ckpt $command --bogus: the command's own --help" 2 \
        "^tp-ckpt: $command: unknown option or missing value: '--bogus' \(see tp-ckpt $command --help\)$" \
        "$CK" $command --bogus
    expect_ok "tp-ckpt $command --help works" "$CK" $command --help
done
expect_error "an unknown letter inside a cluster is named" 2 "^tp-ckpt: info: unknown option or missing value: '-x' " \
    "$CK" info -xj "$WORK/ck"
expect_error "a missing value is named" 2 "^tp-ckpt: diff: unknown option or missing value: '--tol' " "$CK" diff --tol
expect_error "an unknown command points to the program's --help" 2 "^tp-ckpt: unknown command 'frob' \(see tp-ckpt --help\)$" \
    "$CK" frob

# ---------------------------------------------------------- empty paths
# Each exited 1 ("path '' is empty or too long", or a missing file).
expect_error "synth -o ''" 2 "^tp-ckpt: -o is empty: give a path" "$CK" synth -o '' --tp 1 --pp 1 --model tiny
expect_error "export -o ''" 2 "^tp-ckpt: -o is empty: give a path" "$CK" export "$WORK/ck" --format gguf -o ''
expect_error "export --output=" 2 "^tp-ckpt: -o is empty: give a path" "$CK" export "$WORK/ck" --format gguf --output=
expect_error "import -o ''" 2 "^tp-ckpt: -o is empty: give a path" "$CK" import "$WORK/hf" -o '' --tp 1 --pp 1
expect_error "copy to ''" 2 "^tp-ckpt: copy's DST is empty: give a path" "$CK" copy "$WORK/ck" ''
expect_error "copy from ''" 2 "^tp-ckpt: copy's SRC is empty: give a path" "$CK" copy '' s3://bucket/ck
expect_error "tp-reshard -o ''" 2 "^tp-reshard: -o is empty: give a path" "$RS" "$WORK/ck" --to tp1 -o ''
printf 'some text\n' >"$WORK/text"
expect_error "tp-train prepare -o ''" 2 "^tp-train prepare: -o is empty: give a path \\(see tp-train prepare --help\\)$" "$TRAIN" prepare "$WORK/text" -o ''
# Inputs and the trainer's paths too (each exited 1 naming '': "no such
# checkpoint", "cannot create", "cannot list"; --log '' warned and ran on).
for cmd in info verify; do
    expect_error "tp-ckpt $cmd ''" 2 "^tp-ckpt: the checkpoint's path is empty: give a path" "$CK" $cmd ''
done
expect_error "tp-ckpt diff '' CK" 2 "^tp-ckpt: the checkpoint's path is empty" "$CK" diff '' "$WORK/ck"
expect_error "tp-ckpt export ''" 2 "^tp-ckpt: the checkpoint's path is empty" "$CK" export '' --format gguf -o "$WORK/e.gguf"
expect_error "tp-ckpt import ''" 2 "^tp-ckpt: the checkpoint's path is empty" "$CK" import '' -o "$WORK/i" --tp 1 --pp 1
expect_error "tp-reshard ''" 2 "^tp-reshard: the source's path is empty" "$RS" '' --to tp1 -o "$WORK/r"
for option in --ckpt-dir --data --log --ckpt-cache --dump; do
    expect_error "tp-train $option ''" 2 "^tp-train: $option is empty: give a path" "$TRAIN" --model tiny --steps 1 $option ''
done
expect_error "tp-train eval --ckpt ''" 2 "^tp-train eval: --ckpt is empty" "$TRAIN" eval --ckpt '' --data "$WORK/text"
# A layout the ranks launched do not make is a usage error for eval as for
# training (eval exited 1).
expect_error "tp-train eval --tp 2 launched alone: a usage error" 2 \
    "^tp-train: --tp 2 x --pp 1 x --dp 1 = 2 ranks, but 1 was launched .*\(see tp-train eval --help\)" \
    "$TRAIN" eval --ckpt "$WORK/text" --data "$WORK/text" --tp 2
expect_error "tp-train generate --ckpt ''" 2 "^tp-train generate: --ckpt is empty" "$TRAIN" generate --ckpt '' --prompt hi
expect_error "tp-elastic plan --ckpt ''" 2 "^tp-elastic plan: --ckpt is empty" "$BIN/tp-elastic" plan --world 2 --ckpt '' \
    --global-batch 4

# ------------------------------------------------ credentials in URLs
# s3://KEY:SECRET@bucket (Hadoop's s3a form) was taken as a bucket of that
# name: the secret went to the server, and into the error. Refused, never
# repeated, wherever a path is given.
for run_it in "$CK verify" "$CK info" "$RS"; do
    case $run_it in "$RS") more="--to tp1 -o $WORK/never" ;; *) more= ;; esac
    run $run_it 's3://AKIA:TopSecret123@bucket/ck' $more
    check_all "$run_it s3://KEY:SECRET@bucket: refused (exit $RC), the secret not repeated" '[ "$RC" -eq 2 ] &&
        grep -q "credentials in URLs are refused" "$WORK/.err" && ! grep -q TopSecret123 "$WORK/.err" "$WORK/.out"'
done
run "$CK" copy "$WORK/ck" 'http://user:TopSecret123@127.0.0.1:9/ck'
check_all "copy to http://user:pass@host: refused (exit $RC), the secret not repeated" '[ "$RC" -eq 2 ] &&
    grep -q "credentials in URLs are refused" "$WORK/.err" && ! grep -q TopSecret123 "$WORK/.err"'
run "$TRAIN" --model tiny --steps 1 --ckpt-dir 's3://AKIA:TopSecret123@bucket/run'
check_all "tp-train --ckpt-dir s3://KEY:SECRET@bucket: refused (exit $RC), the secret not repeated" '[ "$RC" -eq 2 ] &&
    grep -q "credentials in URLs are refused" "$WORK/.err" && ! grep -q TopSecret123 "$WORK/.err"'

# ------------------------------------------------ the stores' settings
# A TP_REMOTE_* setting that is not a whole number in its range was replaced
# by the default without a word (TP_REMOTE_TIMEOUT=0, abc or -5: 30 s).
for value in 0 abc -5 "1 0"; do
    expect_error "TP_REMOTE_TIMEOUT='$value': refused, named" 1 "TP_REMOTE_TIMEOUT=$value: expected a whole number in 1..86400" \
        env TP_REMOTE_TIMEOUT="$value" "$CK" info http://127.0.0.1:9/ck
done
expect_error "TP_REMOTE_RETRIES=many: refused, named" 1 "TP_REMOTE_RETRIES=many: expected a whole number in 0..100" \
    env TP_REMOTE_RETRIES=many "$CK" info http://127.0.0.1:9/ck

# ------------------------------------------- a run directory not made
# An output named RUN/step_N in a RUN that does not exist (docs/EXPORT.md's
# import to runs/finetune/step_00000000, before the mkdir) said
# 'RUN/.tp-run.lock: cannot open: No such file or directory', where any
# other output names its missing parent directory.
expect_error "synth to a step_N of no run directory: the parent named" 1 \
    "^tp-ckpt: error: $WORK/norun/step_00000000: parent directory $WORK/norun does not exist" \
    "$CK" synth -o "$WORK/norun/step_00000000" --tp 1 --pp 1 --model tiny
expect_error "import to a step_N of no run directory: the parent named" 1 \
    "^tp-ckpt: error: $WORK/norun/step_00000000: parent directory $WORK/norun does not exist" \
    "$CK" import "$WORK/hf0" -o "$WORK/norun/step_00000000" --tp 1 --pp 1
expect_error "tp-reshard to a step_N of no run directory: the parent named" 1 \
    "^tp-reshard: error: $WORK/norun/step_00000000: parent directory $WORK/norun does not exist" \
    "$RS" "$WORK/ck" --to tp1 -o "$WORK/norun/step_00000000"
check "nothing made for them" [ ! -e "$WORK/norun" ]

# ------------------------------------------------- documented options
expect_ok "every option in --help and docs/TOOLS.md, and no other" \
    "$PY_INTERPRETER" "$ROOT/tests/support/documented_options.py" "$ROOT" "$BIN"

finish
