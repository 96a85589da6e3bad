#!/bin/sh
# Signals during uploads to object stores (docs/RELIABILITY.md promise 2,
# docs/STORES.md "Writing"): a writer whose output is a URL (tp-ckpt copy
# DIR URL, tp-reshard -o URL, tp-ckpt export -o URL), stopped by SIGTERM,
# SIGINT or SIGHUP, removes what it sent (with --force, what was there too)
# and dies of the signal (143, 130, 129), so that the URL holds nothing and
# a plain retry is accepted. It left the shards it had sent (with --force,
# the old checkpoint's shards without an index: "not a checkpoint"), and a
# plain retry was refused, "exists already (--force replaces it)". The
# local copy a reshard or an export is written into before its upload goes
# too (it stayed under TMPDIR).
# The signal strikes where the test hook says (TP_CKPT_FAULT, docs/FORMAT.md
# "Test hook"): `upload-sending` with a shard's body partly sent (the
# transfer is cut off), `upload-before-index` with every shard up and the
# index not, `before-latest` with the index up and the run directory's
# `latest` not. The same on nginx's WebDAV and on s3rver (S3); each part
# says SKIP where its server cannot start.
# takes: about 20 s beside two other tests on 2 cores
# waits: mostly for the object stores' servers to start
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/support/objstore.sh"

CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
# The tools' local copies (uploads of reshards and exports) go under WORK,
# where the checks look for what a stopped writer left.
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
objstore_stop_at_exit

# Shards of 2.8 MB: more than one buffer of libcurl's (512 KiB), so that a
# signal strikes with a body partly sent. The export's file: 1.7 MB.
MODEL="--model tiny --dim 128"
expect_ok "a local checkpoint to upload" "$CK" synth -o "$WORK/base" $MODEL --tp 2 --pp 1 --optim

# stopped SIG POINT CMD...: CMD run with SIG raised at POINT; RC its status.
stopped() {
    sig=$1 point=$2
    shift 2
    rm -rf "$TMPDIR"/tp-upload.* # what an earlier case left, so that each is judged alone
    run env TP_CKPT_FAULT="$point:$sig" "$@"
}

# no_local_copy: no tool's local copy of an output (tp-upload.*) is left
# under TMPDIR.
no_local_copy() { [ -z "$(ls -A "$TMPDIR" | grep tp-upload)" ]; }

# code_of SIG: the exit status of a process that died of SIG.
code_of() {
    case $1 in TERM) echo 143 ;; INT) echo 130 ;; HUP) echo 129 ;; esac
}

# signal_parts STORE PREFIX EMPTY READ: the cases against one store; PREFIX
# is its URL prefix, `EMPTY KEY` is true when nothing is stored under KEY,
# `READ KEY` prints the object's bytes (both read on the server's own disk).
signal_parts() {
    store=$1 P=$2 empty=$3 read_object=$4

    # --force over a checkpoint, cut off mid-shard: the old one's index went
    # first, so it is gone either way; the URL must hold nothing.
    expect_ok "$store: a checkpoint to replace" "$CK" copy "$WORK/base" "$P/f"
    stopped TERM upload-sending "$CK" copy "$WORK/base" "$P/f" --force
    check "$store: copy --force, SIGTERM mid-shard: died of it (exit $RC, expected 143)" [ "$RC" -eq 143 ]
    check "$store: copy --force, SIGTERM mid-shard: nothing left at the URL" "$empty" f
    check "$store: copy --force, SIGTERM mid-shard: no error line on the way out" \
        sh -c "! grep -q 'error' '$WORK/.err'"
    expect_ok "$store: copy --force stopped: a plain retry is accepted" "$CK" copy "$WORK/base" "$P/f"
    expect_ok "$store: the retried copy verifies" "$CK" verify "$P/f"
    # Every new shard up over the old ones, the new index not yet (the
    # reviewer's case: the old checkpoint's shards, replaced, without an
    # index, "not a checkpoint").
    stopped TERM upload-before-index "$CK" copy "$WORK/base" "$P/f" --force
    check_all "$store: copy --force, SIGTERM before the index: died of it (exit $RC), nothing left at the URL" \
        '[ "$RC" -eq 143 ] && $empty f'
    expect_ok "$store: copy --force stopped before the index: a plain retry is accepted" "$CK" copy "$WORK/base" "$P/f"

    for sig in INT HUP; do
        code=$(code_of $sig)
        # Without --force, to a fresh URL.
        stopped $sig upload-sending "$CK" copy "$WORK/base" "$P/g$sig"
        check_all "$store: copy, SIG$sig mid-shard: died of it (exit $RC), nothing left at the URL" \
            '[ "$RC" -eq $code ] && $empty g$sig'
        expect_ok "$store: copy, SIG$sig mid-shard: a plain retry is accepted" "$CK" copy "$WORK/base" "$P/g$sig"
        # Every shard up, the index not yet.
        stopped $sig upload-before-index "$CK" copy "$WORK/base" "$P/h$sig"
        check_all "$store: copy, SIG$sig before the index: died of it (exit $RC), its shards removed" \
            '[ "$RC" -eq $code ] && $empty h$sig'
        expect_ok "$store: copy, SIG$sig before the index: a plain retry is accepted" "$CK" copy "$WORK/base" \
            "$P/h$sig"
    done

    # Into a run directory: the index up, `latest` not yet. The checkpoint
    # goes too (a retry was refused, "holds a checkpoint already"). Named for
    # the step it records, 0 (copy refuses another name).
    stopped TERM before-latest "$CK" copy "$WORK/base" "$P/run/step_00000000"
    check_all "$store: copy into a run, SIGTERM before latest: died of it (exit $RC), the step and latest removed" \
        '[ "$RC" -eq 143 ] && $empty run/step_00000000 && $empty run/latest'
    expect_ok "$store: copy into a run stopped: a plain retry is accepted" "$CK" copy "$WORK/base" \
        "$P/run/step_00000000"
    expect_ok "$store: the retry's latest names the step" "$CK" verify "$P/run"

    # tp-reshard -o URL and export -o URL: written into a local copy under
    # TMPDIR, then uploaded; the local copy goes too (it stayed, a whole
    # checkpoint nobody would send, or an empty directory when the signal
    # came while it was written).
    stopped HUP upload-sending "$RS" "$WORK/base" --to tp1pp1 -o "$P/r"
    check_all "$store: reshard -o URL, SIGHUP mid-shard: died of it (exit $RC), nothing left at the URL" \
        '[ "$RC" -eq 129 ] && $empty r'
    check "$store: reshard -o URL, SIGHUP mid-shard: its local copy removed" no_local_copy
    stopped INT staging-claimed "$RS" "$WORK/base" --to tp1pp1 -o "$P/r"
    check_all "$store: reshard -o URL, SIGINT while writing locally: died of it (exit $RC), no local copy, nothing at the URL" \
        '[ "$RC" -eq 130 ] && no_local_copy && $empty r'
    expect_ok "$store: reshard -o URL stopped: a plain retry is accepted" "$RS" "$WORK/base" --to tp1pp1 -o "$P/r"
    stopped TERM upload-sending "$CK" export "$WORK/base" --format safetensors -o "$P/e"
    check_all "$store: export -o URL, SIGTERM mid-file: died of it (exit $RC), nothing left at the URL" \
        '[ "$RC" -eq 143 ] && $empty e'
    check "$store: export -o URL, SIGTERM mid-file: its local copy removed" no_local_copy
    expect_ok "$store: export -o URL stopped: a plain retry is accepted" "$CK" export "$WORK/base" \
        --format safetensors -o "$P/e"

    # --force, stopped before the upload began (the local write): the old
    # checkpoint stays, whole.
    stopped TERM staging-claimed "$RS" "$WORK/base" --to tp2pp1 -o "$P/r" --force
    check "$store: reshard -o URL --force, SIGTERM while writing locally: died of it (exit $RC, expected 143)" \
        [ "$RC" -eq 143 ]
    expect_ok "$store: the checkpoint it was to replace is still there, whole" "$CK" verify "$P/r"
    expect_ok "$store: info of it" "$CK" info --json "$P/r"
    check "$store: ... and it is the old one (tp1pp1), not the new (tp2pp1)" "$PY" -c '
import json, sys
sys.exit(json.load(open(sys.argv[1]))["layout"]["tp"] != 1)' "$WORK/.out"
    # --force over one file (GGUF): its one PUT cut off, the old file stays
    # (a store makes no object of a body that ended early; s3rver alone, with
    # no proxy in front, stores what came: tests/support/sigv4_proxy.py).
    if [ "$store" = S3 ] && [ "${S3_SIGNATURES:-}" != checked ]; then
        echo "[SKIP] [$NAME] S3: a PUT cut off (s3rver stores a body that ended early; no proxy in front)"
        return 0
    fi
    expect_ok "$store: a GGUF export to replace" "$CK" export "$WORK/base" --format gguf -o "$P/x.gguf"
    before=$($read_object x.gguf | md5sum)
    stopped TERM upload-sending "$CK" export "$WORK/base" --format gguf -o "$P/x.gguf" --force
    check_all "$store: export --format gguf --force, SIGTERM mid-file: died of it (exit $RC), the old file unchanged" \
        '[ "$RC" -eq 143 ] && [ "$($read_object x.gguf | md5sum)" = "$before" ]'
}

# ================================================================== WebDAV
if ! webdav_start "$WORK/dav" 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] WebDAV: $(head -n 1 "$WORK/.err")"
else
    dav_empty() { [ ! -e "$WORK/dav/$1" ]; }
    dav_read() { cat "$WORK/dav/$1"; }
    signal_parts WebDAV "$WEBDAV_URL" dav_empty dav_read
    webdav_stop
fi

# ====================================================================== S3
if ! s3_start "$WORK/s3" bkt 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] S3: $(head -n 1 "$WORK/.err")"
else
    export AWS_ENDPOINT_URL="$S3_ENDPOINT"
    # s3rver keeps KEY as KEY._S3rver_object (and its metadata) on its disk.
    s3_empty() { [ -z "$(find "$WORK/s3/bkt/$1" "$WORK/s3/bkt/$1._S3rver_object" -type f 2>/dev/null)" ]; }
    s3_read() { cat "$WORK/s3/bkt/$1._S3rver_object"; }
    signal_parts S3 s3://bkt s3_empty s3_read
    s3_stop
fi

finish
