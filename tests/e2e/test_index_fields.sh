#!/bin/sh
# Every field of the index that any reader uses is checked against the shard
# files, wherever the checkpoint is, and nothing that does not verify is
# uploaded. A piece's `checksums_at` (where readers from an object store take
# its block checksums, without HDF5) moved outside its shard, to its end, or
# into its data was accepted by local `verify` and `--resume` while the same
# checkpoint read from a store was damaged, and `copy` uploaded it.
#   Local: verify refuses each move, naming the piece, the offset in the file
#   and the index's; a resume passes over such a checkpoint to the previous
#   intact one, saying why. Object store (nginx's WebDAV): `tp-ckpt copy`
#   refuses to upload it and leaves nothing there; the intact checkpoint
#   goes up and reads back verified.
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/support/objstore.sh"

use_open_mpi # tp-train initializes Open MPI even alone (its settings; under the sanitizers, its plugins' leaks)
CK="$BIN/tp-ckpt"
TRAIN="$BIN/tp-train"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
trap 'webdav_stop >/dev/null 2>&1; rm -rf "$WORK"' EXIT

# move_checksums CKPT WHERE: the first piece's checksums_at moved (big: to
# 2^31; eof: the last 8 bytes of its shard; data: onto its own data).
move_checksums() {
    "$PY" - "$1" "$2" "$ROOT/tests/support" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[3])
import index_seal
path = sys.argv[1] + "/index.json"
index = json.load(open(path))
piece = index["tensors"][0]["pieces"][0]
size = next(f["bytes"] for f in index["files"] if f["name"] == piece["file"])
piece["checksums_at"] = {"big": 2**31, "eof": size - 8, "data": piece["offset"]}[sys.argv[2]]
index_seal.dump(index, path)  # the shard check must answer, not the index's seal
EOF
}

expect_ok "synth" "$CK" synth -o "$WORK/good" --tp 2 --pp 1 --model tiny
for where in big eof data; do
    rm -rf "$WORK/moved" && cp -r "$WORK/good" "$WORK/moved" && move_checksums "$WORK/moved" $where
    run "$CK" verify "$WORK/moved"
    check_all "verify refuses checksums_at moved ($where) naming the piece and both offsets (exit $RC)" \
        '[ $RC -ne 0 ] && grep -q "tensor model/tok_embed.weight piece 0: block checksums at offset [0-9]*, the index says [0-9]*" "$WORK/.err"'
done

# A resume passes over it.
expect_ok "a run with checkpoints at steps 2 and 4" \
    "$TRAIN" --model tiny --micro-batch 2 --quiet --steps 4 --ckpt-every 2 --ckpt-dir "$WORK/run"
move_checksums "$WORK/run/step_00000004" data
expect_ok "resume" "$TRAIN" --model tiny --micro-batch 2 --steps 6 --ckpt-every 2 --ckpt-dir "$WORK/run" --resume \
    --log "$WORK/resume.jsonl"
check_all "the resume passed over step 4, saying why, and went on from step 2" \
    'grep -q "block checksums at offset" "$WORK/.out" "$WORK/.err" &&
     "$PY" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; s=[x for x in r if \"event\" not in x]; sys.exit(0 if s[0][\"step\"] == 3 else 1)" "$WORK/resume.jsonl"'

if ! webdav_start "$WORK/dav" 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] WebDAV: $(head -n 1 "$WORK/.err")"
    finish
    exit $?
fi
U="$WEBDAV_URL"
rm -rf "$WORK/moved" && cp -r "$WORK/good" "$WORK/moved" && move_checksums "$WORK/moved" eof
expect_error "copy refuses to upload a checkpoint that does not verify" 1 \
    "moved does not verify: 1 of [0-9]* pieces damaged, the first: .*checksums at offset" \
    "$CK" copy "$WORK/moved" "$U/moved"
check "nothing of it was uploaded" [ ! -e "$WORK/dav/moved" ]
expect_ok "the intact checkpoint goes up" "$CK" copy "$WORK/good" "$U/good"
expect_ok "and verifies there" "$CK" verify "$U/good"

finish
