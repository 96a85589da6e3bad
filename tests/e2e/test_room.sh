#!/bin/sh
# An output that cannot fit on its file system is refused before its data
# is written, naming what it needs and what is free (store_check_room), in
# every writer: this toolkit's checkpoints (synth, tp-reshard, import),
# DCP, Megatron-LM legacy and torch_dist outputs, and the exports. Until
# then a mistyped size wrote for days (a vocabulary of 2^31 at 65,536 wide:
# 512 TiB at 90 MB/s), and a conversion to a disk too small wrote until the
# disk was full. The small disk is a 2 MiB tmpfs mounted in a mount
# namespace of each command's own (root; skipped otherwise), so that no
# mount outlives the test; an output that fits is still written there.
# tier: check
. "$(dirname "$0")/lib.sh"
CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"

# Any machine: a model that no disk holds.
HUGE="--tp 1 --pp 1 --layers 2 --dim 65536 --heads 2 --vocab 2147483648 --seq 16"
expect_error "synth of 512 TiB: refused before writing, naming the sizes" 1 \
    "^tp-ckpt: error: .*huge: needs 512.38 TiB \(563362281816064 bytes\), and the file system of .* has .* free: nothing was written$" \
    "$CK" synth -o "$WORK/huge" $HUGE
check "nothing left: no output, no staging" sh -c '! ls -A "$1" | grep -q huge' sh "$WORK"

# A small disk: root, and a kernel that lets it make a mount namespace.
if [ "$(id -u)" != 0 ] || ! unshare --mount --propagation private true 2>/dev/null; then
    echo "[SKIP] [$NAME] a 2 MiB file system: needs root and mount namespaces (unshare --mount)"
    finish
fi
SMALL="$WORK/small"
mkdir "$SMALL"
# on_small COMMAND...: COMMAND with a fresh 2 MiB tmpfs at $SMALL, then what
# is left there listed (after "left:"); its exit status is COMMAND's.
on_small() {
    unshare --mount --propagation private sh -c 'dir=$1; shift; mount -t tmpfs -o size=2m tmpfs "$dir" || exit 125
"$@"; rc=$?; echo left: $(ls -A "$dir"); exit $rc' sh "$SMALL" "$@"
}
expect_ok "a source of 4 MB of weights (12 MB with its Adam state)" "$CK" synth -o "$WORK/src" --tp 2 --pp 1 --layers 2 \
    --dim 192 --heads 4 --vocab 512 --seq 64 --optim
expect_ok "a small one that fits" "$CK" synth -o "$WORK/tiny" --tp 1 --pp 1 --model tiny
SMALL_NEEDS="needs [0-9.]+ MiB \([0-9]+ bytes\), and the file system of $SMALL has [0-9.]+ [KM]iB free: nothing was written"
for format in tp dcp megatron torch_dist; do
    # (Megatron's optimizer state needs a Megatron source: the weights alone.)
    weights=$(case $format in megatron | torch_dist) echo --weights-only ;; esac)
    run on_small "$RS" "$WORK/src" --to tp1 --format $format $weights -o "$SMALL/out"
    check_all "tp-reshard --format $format to 2 MiB: refused before writing (exit $RC)" \
        '[ "$RC" -eq 1 ] && grep -Eq "^tp-reshard: error: .*small/out.*: $SMALL_NEEDS" "$WORK/.err" &&
         grep -q "^left:$" "$WORK/.out"'
done
for format in safetensors gguf hdf5; do
    out="$SMALL/out.$format"
    run on_small "$CK" export "$WORK/src" --format $format -o "$out"
    check_all "export --format $format to 2 MiB: refused before writing (exit $RC)" \
        '[ "$RC" -eq 1 ] && grep -Eq "^tp-ckpt: error: .*small/out.$format: $SMALL_NEEDS" "$WORK/.err" &&
         grep -q "^left:$" "$WORK/.out"'
done
run on_small "$CK" synth -o "$SMALL/s" --tp 2 --pp 1 --layers 2 --dim 192 --heads 4 --vocab 512 --seq 64 --optim
check_all "synth to 2 MiB: refused (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -Eq "^tp-ckpt: error: .*small/s: $SMALL_NEEDS" "$WORK/.err" && grep -q "^left:$" "$WORK/.out"'
expect_ok "the source's export, to import" "$CK" export "$WORK/src" --format safetensors -o "$WORK/src.hf"
run on_small "$CK" import "$WORK/src.hf" --tp 1 --pp 1 -o "$SMALL/i"
check_all "import to 2 MiB: refused (exit $RC)" \
    '[ "$RC" -eq 1 ] && grep -Eq "^tp-ckpt: error: .*small/i: $SMALL_NEEDS" "$WORK/.err" && grep -q "^left:$" "$WORK/.out"'
# What fits is written there, and checked.
run on_small sh -c '"$1" "$2" --to tp2 -o "$3/fits" && "$4" verify "$3/fits"' sh "$RS" "$WORK/tiny" "$SMALL" "$CK"
check_all "a checkpoint that fits in 2 MiB is written and verifies (exit $RC)" \
    '[ "$RC" -eq 0 ] && grep -q "^ok: .*fits" "$WORK/.out" && grep -q "^left: fits$" "$WORK/.out"'
run on_small "$CK" export "$WORK/tiny" --format gguf -o "$SMALL/fits.gguf"
check_all "an export that fits is written (exit $RC)" '[ "$RC" -eq 0 ] && grep -q "^left: fits.gguf$" "$WORK/.out"'
finish
